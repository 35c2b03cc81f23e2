"""jaxdae.simulate_ensemble: the trajectories of `jax.vmap(simulate)` on one shared step
sequence; jit, grad (against central differences), sharding, float32 and its errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Literal

import jaxdae

from ._jaxprs import equations
from ._systems import Bead

SYSTEM = jaxdae.examples.CartesianPendulum()
TS = jnp.linspace(0.0, 1.0, 5)
TOL = dict(rtol=1e-9, atol=1e-11)


def states(size, scale=1.05):
    """Initial states off the constraint manifold (|q| = 1.05), from different angles."""
    angles = jnp.linspace(0.2, 1.4, size)
    q0, v0 = jax.vmap(lambda a: SYSTEM.state_from_angle(a, 0.5))(angles)
    return q0 * scale, v0


@eqx.filter_jit
def ensemble(formulation, q0, v0):
    return jaxdae.simulate_ensemble(SYSTEM, formulation, 0.0, 1.0, q0, v0, ts=TS, **TOL)


@eqx.filter_jit
def independent(formulation, q0, v0):
    return jax.vmap(
        lambda q, v: jaxdae.simulate(SYSTEM, formulation, 0.0, 1.0, q, v, ts=TS, **TOL)
    )(q0, v0)


FORMULATION = jaxdae.ModifiedLagrange(5.0, 10.0, 25.0)


@pytest.mark.perf(reason="pins a broadcast pattern (GPU compile time per batch row)")
def test_traced_checks_keep_constant_flags_off_the_batch():
    """Traced, the ensemble's initial-state checks reduce each flag over the rows inside
    their `vmap`, so a flag that is a constant (here the nonholonomic one: the pendulum has
    no nonholonomic constraints) is not broadcast over the batch. Broadcast and reduced,
    it would be constant-folded row by row by XLA's GPU compiler, a compile time that grows
    with the batch (2 s at 10⁶ rows on an H100)."""
    rows = 7
    q0, v0 = states(rows)
    program = jax.make_jaxpr(
        lambda q, v: jaxdae.simulate_ensemble(SYSTEM, FORMULATION, 0.0, 1.0, q, v).q_final
    )(q0, v0)
    broadcasts = [
        eqn
        for eqn in equations(program.jaxpr)
        if eqn.primitive.name == "broadcast_in_dim"
        and isinstance(eqn.invars[0], Literal)
        and eqn.outvars[0].aval.dtype == jnp.bool_
        and rows in eqn.outvars[0].aval.shape
    ]
    assert not broadcasts


@pytest.mark.slow
def test_same_trajectories_as_vmap_of_simulate():
    q0, v0 = states(6)
    shared = ensemble(FORMULATION, q0, v0)
    alone = independent(FORMULATION, q0, v0)
    for field in (
        "ts",
        "q",
        "v",
        "phi",
        "dphi",
        "multipliers",
        "energy",
        "t_final",
        "q_final",
        "v_final",
        "p",
    ):
        a, b = getattr(shared, field), getattr(alone, field)
        assert a.shape == b.shape, field
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7, err_msg=field)
    assert bool(jnp.all(shared.result == jaxdae.RESULTS.successful))
    # One step sequence, set by the trajectory that needs the smallest steps.
    steps = np.asarray(shared.stats["num_accepted_steps"])
    assert np.all(steps == steps[0])
    assert steps[0] >= np.max(alone.stats["num_accepted_steps"]) - 2
    # Every trajectory meets the tolerances: errors against a much tighter solve are of
    # the size of the independent solves' errors.
    tight = jax.vmap(
        lambda q, v: (
            jaxdae.simulate(SYSTEM, FORMULATION, 0.0, 1.0, q, v, ts=TS, rtol=1e-12, atol=1e-14).q
        )
    )(q0, v0)
    error_shared = np.max(np.abs(shared.q - tight), axis=(1, 2))
    error_alone = np.max(np.abs(alone.q - tight), axis=(1, 2))
    assert np.all(error_shared <= 2 * np.max(error_alone) + 1e-12), (error_shared, error_alone)


@pytest.mark.slow
def test_gradient_matches_central_differences():
    q0, v0 = states(3)

    def loss(alpha, kp):
        sol = ensemble(jaxdae.ModifiedLagrange(alpha, 10.0, kp), q0, v0)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi**2)

    alpha, kp = jnp.asarray(5.0), jnp.asarray(25.0)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(alpha, kp)
    for i, h in ((0, 1e-4), (1, 1e-3)):
        plus = [alpha, kp]
        minus = [alpha, kp]
        plus[i], minus[i] = plus[i] + h, minus[i] - h
        central = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(grads[i], central, rtol=1e-5)


@pytest.mark.slow  # the default run keeps sharding (test_batch.py)
def test_sharded_ensemble_equals_unsharded(capfd):
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices: tests/conftest.py gives 4 host CPU devices on CPU")
    q0, v0 = states(8)
    plain = ensemble(FORMULATION, q0, v0)
    # On an Auto mesh under jit, and placed on jax.make_mesh's default (Explicit) mesh.
    auto = jax.make_mesh((4,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    capfd.readouterr()
    sharded = ensemble(FORMULATION, *jax.device_put((q0, v0), jaxdae.batch_sharding(auto)))
    # The traced input checks do not make XLA gather the sharded states onto one device
    # (it says so on stderr while compiling; a compilation-cache hit compiles nothing).
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    np.testing.assert_allclose(sharded.q, plain.q, rtol=1e-12, atol=1e-14)
    assert len(sharded.q.sharding.device_set) == 4
    # In `batch_map`'s sharded chunks the failure check (`throw=True`) is traced too: nor
    # does it gather the solution.
    capfd.readouterr()
    chunked = jaxdae.batch_map(
        lambda q, v: ensemble(FORMULATION, q, v).q, q0, v0, chunk_size=2, mesh=auto, ensemble=True
    )
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    np.testing.assert_allclose(chunked, plain.q, rtol=1e-12, atol=1e-14)
    explicit = jax.device_put((q0, v0), jaxdae.batch_sharding(jax.make_mesh((4,), ("batch",))))
    eager = jaxdae.simulate_ensemble(SYSTEM, FORMULATION, 0.0, 1.0, *explicit, ts=TS, **TOL)
    np.testing.assert_allclose(eager.q, plain.q, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="Explicit sharding"):
        ensemble(FORMULATION, *explicit)


@pytest.mark.slow
def test_chunks_of_a_batch_as_ensembles(tmp_path):
    """`batch_map(..., ensemble=True)`: every chunk is one ensemble, the last one padded
    with copies of the batch's last row."""
    q0, v0 = states(6)

    def run(q0, v0):
        return ensemble(FORMULATION, q0, v0)

    chunked = jaxdae.batch_map(run, q0, v0, chunk_size=4, ensemble=True)  # rows 4 + 2 (+ 2)
    assert chunked.q.shape == (6, 5, 2)
    last = [jnp.concatenate([x[4:], x[5:], x[5:]]) for x in (q0, v0)]
    expected = jnp.concatenate([run(q0[:4], v0[:4]).q, run(*last).q[:2]])
    np.testing.assert_allclose(chunked.q, expected, rtol=1e-12, atol=1e-14)
    alone = independent(FORMULATION, q0, v0)
    np.testing.assert_allclose(chunked.q, alone.q, rtol=0, atol=1e-7)
    if jax.device_count() >= 4:  # 4 devices x 1 row: 2 steps of 4 rows, saved as they finish
        mesh = jax.make_mesh((4,), ("batch",))
        sweep = jaxdae.batch_map(
            run, q0, v0, chunk_size=1, mesh=mesh, ensemble=True, checkpoint=tmp_path, progress=False
        )
        assert len(list(tmp_path.glob("chunk_*.npz"))) == 2
        np.testing.assert_allclose(sweep.q, alone.q, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="`fn` receives 6 rows at once.*got shapes"):
        jaxdae.batch_map(lambda q, v: run(q, v).q[0], q0, v0, ensemble=True)


@pytest.mark.slow
def test_float32_ensemble():
    q0, v0 = states(4)
    formulation = jaxdae.PseudoInverse(10.0, 25.0)
    sol = jaxdae.simulate_ensemble(
        SYSTEM,
        formulation,
        0.0,
        1.0,
        q0.astype(jnp.float32),
        v0.astype(jnp.float32),
        rtol=1e-5,
        atol=1e-7,
    )
    assert sol.q.dtype == jnp.float32 and sol.q.shape == (4, 2, 2)
    assert bool(jnp.all(sol.result == jaxdae.RESULTS.successful))
    reference = jaxdae.simulate_ensemble(SYSTEM, formulation, 0.0, 1.0, q0, v0)
    np.testing.assert_allclose(sol.q_final, reference.q_final, atol=1e-4)


@pytest.mark.slow
def test_failed_trajectories_stop_alone():
    """A formulation that can fail (Baumgarte) stops each trajectory where `simulate`
    stops it; the others run to the end, and gradients stay finite."""
    bead, ts = Bead(), jnp.linspace(0.0, 2.0, 21)
    q0 = jnp.stack([jnp.array([1.1, 1.3, 1.8, 2.0]), jnp.zeros(4)], axis=1)
    v0 = jnp.zeros_like(q0)

    def run(kp, **kwargs):
        return jaxdae.simulate_ensemble(
            bead, jaxdae.Baumgarte(1.0, kp), 0.0, 2.0, q0, v0, ts=ts, **kwargs
        )

    shared = run(25.0, throw=False)
    alone = jax.jit(
        jax.vmap(
            lambda q, v: jaxdae.simulate(
                bead, jaxdae.Baumgarte(1.0, 25.0), 0.0, 2.0, q, v, ts=ts, throw=False
            )
        )
    )(q0, v0)
    failed = jaxdae.RESULTS.singular_constraint_matrix._value
    assert alone.result._value.tolist() == [0, 0, failed, failed]
    assert shared.result._value.tolist() == alone.result._value.tolist()
    np.testing.assert_allclose(shared.t_final, alone.t_final, rtol=1e-6)
    for field in ("ts", "q", "v"):
        a, b = getattr(shared, field), getattr(alone, field)
        assert np.array_equal(np.isinf(a), np.isinf(b)), field
        np.testing.assert_allclose(a[np.isfinite(b)], b[np.isfinite(b)], atol=1e-6, err_msg=field)
    # The stopped beads keep their states; the others' loss has a finite gradient.
    np.testing.assert_allclose(shared.q_final[2:, 0], 0.0, atol=1e-3)
    grad = jax.grad(lambda kp: jnp.sum(run(kp, throw=False).q_final[:2] ** 2))(25.0)
    assert np.isfinite(grad) and grad != 0
    with pytest.raises(jaxdae.SimulationError, match=r"(?s)singular.*batch element \(2,\)"):
        run(25.0)


@pytest.mark.slow
def test_ensemble_errors(unchecked):
    q0, v0 = states(4)
    with pytest.raises(ValueError, match=r"shape \(B, n\)"):
        jaxdae.simulate_ensemble(SYSTEM, FORMULATION, 0.0, 1.0, q0[0], v0[0])
    with pytest.raises(ValueError, match=r"same shape \(B, n\)"):
        jaxdae.simulate_ensemble(SYSTEM, FORMULATION, 0.0, 1.0, q0, v0[:3])
    with pytest.raises(ValueError, match="Trajectory 2 .*`v0` contains non-finite"):
        jaxdae.simulate_ensemble(SYSTEM, FORMULATION, 0.0, 1.0, q0, v0.at[2, 0].set(jnp.inf))
    with pytest.raises(jaxdae.SimulationError, match="maximum number of solver steps"):
        jaxdae.simulate_ensemble(SYSTEM, FORMULATION, 0.0, 1.0, q0, v0, max_steps=3)
    # Traced states (the program of the tests above): the check runs after the solve, on
    # each trajectory's diagnostics at its initial state.
    q6, v6 = states(6)
    with pytest.raises(Exception, match="`v0` contains non-finite"):
        jax.block_until_ready(ensemble(FORMULATION, q6, v6.at[2, 0].set(jnp.nan)))


def test_model_closed_over_by_jit_is_folded():
    """A system and formulation that the caller's `jax.jit` closes over are constants of
    the program: the ensemble's rates are traced with their values (folded) and equal
    those of the same model passed in as traced arguments, which keep the jitted rates."""
    from jaxdae._integration._ensemble import ensemble_term

    formulation = jaxdae.Baumgarte(10.0, 25.0)
    folded = ensemble_term(SYSTEM, formulation, None, None).folded
    assert folded is not None and folded.args == (SYSTEM, formulation)
    terms = []
    jax.make_jaxpr(
        lambda kd: terms.append(ensemble_term(SYSTEM, jaxdae.Baumgarte(kd, 25.0), None, None))
    )(10.0)
    assert terms[0].folded is None
    q0, v0 = states(3)
    closed = jax.jit(
        lambda q, v: (
            jaxdae.simulate_ensemble(
                SYSTEM, formulation, 0.0, 1.0, q, v, rtol=1e-8, atol=1e-10
            ).q_final
        )
    )(q0, v0)
    passed = eqx.filter_jit(
        lambda f, q, v: (
            jaxdae.simulate_ensemble(SYSTEM, f, 0.0, 1.0, q, v, rtol=1e-8, atol=1e-10).q_final
        )
    )(formulation, q0, v0)
    np.testing.assert_allclose(closed, passed, rtol=0, atol=1e-12)
