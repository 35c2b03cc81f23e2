"""jaxdae.batch_map: chunked == unchunked == sharded over 4 host CPU devices (conftest)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae

SYSTEM = jaxdae.examples.CartesianPendulum()
TS = jnp.linspace(0.0, 0.5, 6)


def run(kd, q0, v0):
    """One simulation per (gain, initial state): gains and states are both batched."""
    sol = jaxdae.simulate(
        SYSTEM,
        jaxdae.Baumgarte(kd, kd**2 / 4),
        0.0,
        0.5,
        q0,
        v0,
        ts=TS,
        throw=False,
        rtol=1e-7,
        atol=1e-9,
    )
    return sol.q, sol.phi, sol.result


def inputs(size):
    angles = jnp.linspace(0.1, 1.5, size)
    q0, v0 = jax.vmap(lambda a: SYSTEM.state_from_angle(a, 1.0))(angles)
    return jnp.linspace(1.0, 8.0, size), q0 * 1.05, v0


@pytest.fixture(scope="module")
def mesh():
    if jax.default_backend() != "cpu" and jax.device_count() < 4:
        pytest.skip("needs 4 devices: tests/conftest.py gives 4 host CPU devices on CPU")
    assert jax.device_count() >= 4, "tests/conftest.py sets jax_num_cpu_devices = 4"
    return jax.make_mesh((4,), ("batch",))


@pytest.fixture(scope="module")
def unchunked():
    return jaxdae.batch_map(run, *inputs(10))


def test_batch_matches_single_simulations(unchunked):
    kd, q0, v0 = inputs(10)
    q, phi, result = unchunked
    assert q.shape == (10, 6, 2) and phi.shape == (10, 6, 1)
    assert bool(jnp.all(result == jaxdae.RESULTS.successful))
    for i in (0, 9):
        qi, phii, _ = run(kd[i], q0[i], v0[i])
        np.testing.assert_allclose(q[i], qi, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_chunked_equals_unchunked(unchunked):
    chunked = jaxdae.batch_map(run, *inputs(10), chunk_size=4)  # 4 + 4 + remainder 2
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(unchunked), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_sharded_equals_unsharded(mesh, unchunked):
    # 10 is not a multiple of 4 devices x chunk 2: the batch is padded and cut back.
    sharded = jaxdae.batch_map(run, *inputs(10), mesh=mesh, chunk_size=2)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(unchunked), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # A multiple of the device count stays sharded over the mesh, one slice per device.
    q, _, _ = jaxdae.batch_map(run, *inputs(8), mesh=mesh)
    assert len(q.sharding.device_set) == 4
    assert q.sharding.shard_shape(q.shape) == (2, 6, 2)
    np.testing.assert_allclose(q, jaxdae.batch_map(run, *inputs(8))[0], rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_checkpointed_sweep_resumes_where_it_stopped(tmp_path, unchunked):
    directory = tmp_path / "sweep"
    sweep = dict(chunk_size=4, checkpoint=directory, progress=False)  # chunks 4 + 4 + 2
    full = jaxdae.batch_map(run, *inputs(10), **sweep)
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(unchunked), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # An interruption while the second chunk was being written: only the first chunk is
    # on disk, next to a partial file.
    first = directory / "chunk_000000.npz"
    stamp = first.stat().st_mtime_ns
    for k in (1, 2):
        (directory / f"chunk_{k:06d}.npz").unlink()
    (directory / "chunk_000001.tmp.npz").write_bytes(b"partial")
    resumed = jaxdae.batch_map(run, *inputs(10), **sweep)
    assert first.stat().st_mtime_ns == stamp  # not computed again
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(full), strict=False):
        np.testing.assert_array_equal(a, b)
    kd, q0, v0 = inputs(10)
    with pytest.raises(ValueError, match="holds the chunks of another sweep"):
        jaxdae.batch_map(run, 2 * kd, q0, v0, **sweep)
    with pytest.raises(ValueError, match="holds the chunks of another sweep"):
        jaxdae.batch_map(run, kd, q0, v0, **(sweep | dict(chunk_size=5)))

    def other(kd, q0, v0):
        return run(kd, q0, v0)

    with pytest.raises(ValueError, match="holds the chunks of another sweep.*another function"):
        jaxdae.batch_map(other, kd, q0, v0, **sweep)


@pytest.mark.slow
def test_checkpointed_sweep_on_a_mesh(tmp_path, mesh):
    sweep = jaxdae.batch_map(
        run, *inputs(8), mesh=mesh, chunk_size=1, checkpoint=tmp_path / "sweep", progress=False
    )  # 2 chunks of 4
    assert len(list((tmp_path / "sweep").glob("chunk_*.npz"))) == 2
    assert len(sweep[0].sharding.device_set) == 4
    np.testing.assert_allclose(
        sweep[0], jaxdae.batch_map(run, *inputs(8))[0], rtol=1e-10, atol=1e-12
    )


def test_chunk_layout_pads_only_to_the_next_full_step():
    from jaxdae._tuning._batch import chunk_layout

    # (rows per step, padded size) for a batch of 10.
    assert chunk_layout(10, None, 1) == (10, 10)
    assert chunk_layout(10, 4, 1) == (4, 12)
    assert chunk_layout(10, None, 4) == (12, 12)  # 3 rows per device, not 10
    assert chunk_layout(10, 2, 4) == (8, 16)
    assert chunk_layout(10, 100, 4) == (12, 12)  # a chunk larger than a device's share
    assert chunk_layout(8, None, 4) == (8, 8)


def _violation(kd, q0, v0):
    _, phi, _ = run(kd, q0, v0)
    return jnp.sum(phi**2)


def _cubic(k, x):
    return jnp.sum(jnp.sin(k * x) ** 3)


def test_jit_vmap_grad_of_sharded_batch_map(mesh):
    k, x = jnp.linspace(0.5, 2.0, 6), jnp.linspace(-1.0, 1.0, 12).reshape(6, 2)

    @eqx.filter_jit
    def total(k, mesh, chunk_size):
        return jnp.sum(jaxdae.batch_map(_cubic, k, x, mesh=mesh, chunk_size=chunk_size))

    expected = jax.grad(lambda k: jnp.sum(jax.vmap(_cubic)(k, x)))(k)
    for mesh_, chunk in ((None, None), (None, 4), (mesh, None), (mesh, 1)):
        np.testing.assert_allclose(jax.grad(total)(k, mesh_, chunk), expected, rtol=1e-12)
    # Inputs already sharded on the mesh (Explicit axes, jax.make_mesh's default) work, and
    # the chunked sharded output stays sharded: device d keeps its contiguous rows.
    k8, x8 = jnp.linspace(0.5, 2.0, 8), jnp.linspace(-1.0, 1.0, 16).reshape(8, 2)
    placed = jax.device_put((k8, x8), jaxdae.batch_sharding(mesh))
    for mesh_, chunk in ((None, None), (None, 1), (mesh, None), (mesh, 1)):
        out = jaxdae.batch_map(_cubic, *placed, mesh=mesh_, chunk_size=chunk)
        np.testing.assert_allclose(out, jax.vmap(_cubic)(k8, x8), rtol=1e-12)
    assert out.sharding.shard_shape(out.shape) == (2,)
    # Nested in vmap (a batch of batches).
    nested = jax.vmap(lambda k: jaxdae.batch_map(_cubic, k, x, chunk_size=4))(jnp.stack([k, k]))
    np.testing.assert_allclose(nested[1], jax.vmap(_cubic)(k, x), rtol=1e-12)


@pytest.mark.slow
def test_grad_through_sharded_simulations(mesh):
    kd, q0, v0 = inputs(4)

    @eqx.filter_jit
    def loss(kd, mesh):
        return jnp.mean(jaxdae.batch_map(_violation, kd, q0, v0, mesh=mesh))

    plain = jax.grad(loss)(kd, None)
    sharded = jax.grad(loss)(kd, mesh)
    assert np.all(np.isfinite(plain)) and np.any(plain != 0)
    np.testing.assert_allclose(sharded, plain, rtol=1e-9, atol=1e-14)


def test_batch_map_errors(unchecked, mesh):
    kd, q0, v0 = inputs(4)
    with pytest.raises(ValueError, match="same leading"):
        jaxdae.batch_map(run, kd[:3], q0, v0)
    with pytest.raises(ValueError, match="chunk_size"):
        jaxdae.batch_map(run, kd, q0, v0, chunk_size=0)
    with pytest.raises(ValueError, match="Mesh"):
        jaxdae.batch_map(run, kd, q0, v0, mesh="gpu")
    with pytest.raises(ValueError, match="at least one array"):
        jaxdae.batch_map(run)
    sharding = jaxdae.batch_sharding(mesh)
    placed = jax.device_put(q0, sharding)
    assert placed.sharding.shard_shape(placed.shape) == (1, 2)
