"""The private JAX, diffrax and equinox names of `jaxdae/_compilation/_private_apis.py` exist
and behave as jaxdae relies on. A failure names the installed versions: a release that
moved a name fails here, not inside a solve."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from jaxdae._compilation import _private_apis as private

VERSIONS = f"jax {jax.__version__}, diffrax {diffrax.__version__}, equinox {eqx.__version__}"


def test_every_private_name_was_found():
    assert not private.MISSING, (
        f"private names missing from {VERSIONS}: {sorted(private.MISSING)}; update "
        "jaxdae/_compilation/_private_apis.py for this version or bound it in pyproject.toml"
    )


def test_backends_are_initialized_after_a_computation():
    jnp.zeros(1).block_until_ready()
    assert private.backends_are_initialized() is True, (
        f"jax._src.xla_bridge.backends_are_initialized does not report a started backend "
        f"in {VERSIONS}"
    )


def test_traced_for_jit_tells_jit_from_eager_transformations():
    seen = {}

    def record(name):
        def fn(x):
            seen[name] = private.traced_for_jit((x, {"other": 1.0}))
            return jnp.sin(x)

        return fn

    x = jnp.asarray(0.5)
    record("eager")(x)
    jax.jit(record("jit"))(x)
    jax.grad(record("grad"))(x)
    jax.vmap(record("vmap"))(jnp.ones(2))
    jax.jit(jax.grad(record("grad under jit")))(x)
    jax.jit(jax.vmap(record("vmap under jit")))(jnp.ones(2))
    jax.grad(jax.jit(record("jit under grad")))(x)
    jax.make_jaxpr(record("make_jaxpr"))(x)
    assert seen == {
        "eager": False,
        "jit": True,
        "grad": False,
        "vmap": False,
        "grad under jit": True,
        "vmap under jit": True,
        "jit under grad": True,
        "make_jaxpr": True,
    }, f"JAX's trace internals (Tracer._trace, Trace.parent_trace) changed in {VERSIONS}"


def test_unvmap_any_ignores_the_batch_dimension():
    flags = jnp.array([[False, False], [False, True]])
    per_row = jax.vmap(private.unvmap_any)(flags)
    assert per_row.shape == (2,) and bool(per_row.all()), (
        f"equinox.internal.unvmap_any is not one flag for the whole batch in {VERSIONS}"
    )
    assert not bool(jax.vmap(private.unvmap_any)(jnp.zeros((3, 2), bool)).any())
    assert bool(private.unvmap_any(jnp.array([False, True])))


def test_unvmap_max_is_the_largest_entry_of_the_batch():
    counts = jnp.array([3, 9, 4])
    per_member = jax.vmap(private.unvmap_max)(counts)
    assert per_member.shape == (3,) and (per_member == 9).all(), (
        f"equinox.internal.unvmap_max is not one value for the whole batch in {VERSIONS}"
    )
    assert int(private.unvmap_max(jnp.asarray(5))) == 5


def test_use_stepsize_tol_marks_a_root_finder_without_tolerances():
    finder = diffrax.with_stepsize_controller_tols(diffrax.VeryChord)()
    assert finder.rtol is finder.atol is finder.norm is private.use_stepsize_tol, (
        f"diffrax._root_finder.use_stepsize_tol is not the marker of "
        f"diffrax.with_stepsize_controller_tols in {VERSIONS}"
    )
    assert diffrax.Kvaerno5().root_finder.rtol is private.use_stepsize_tol


def test_diffeqsolve_unjitted_is_diffeqsolve_without_its_jit():
    assert private.diffeqsolve_unjitted is not diffrax.diffeqsolve, (
        f"diffrax.diffeqsolve.__wrapped__ (the function under equinox's filter_jit) is "
        f"missing in {VERSIONS}: solves fall back to the jitted diffeqsolve"
    )
    term = diffrax.ODETerm(lambda t, y, args: -y)
    sol = jax.jit(
        lambda y0: private.diffeqsolve_unjitted(term, diffrax.Tsit5(), 0.0, 1.0, 0.1, y0).ys
    )(jnp.asarray(1.0))
    assert jnp.allclose(sol, jnp.exp(-1.0), rtol=1e-4)


def test_stage_diagonal_reads_the_implicit_stages_coefficient():
    """diffrax's ESDIRK step hands each implicit stage's root finder its diagonal
    coefficient `γ` (Kvaerno3: 0.4358665215) among positional arguments."""
    seen = []

    class Recording(optx.Chord):
        def init(self, fn, y, args, options, f_struct, aux_struct, tags):
            diagonal = private.stage_diagonal(args)
            assert diagonal is not None, (
                f"diffrax's root-find arguments of an implicit stage changed in {VERSIONS}: "
                "FusedChord can no longer read the stage's diagonal coefficient"
            )
            jax.debug.callback(lambda d: seen.append(float(d)), diagonal)
            return super().init(fn, y, args, options, f_struct, aux_struct, tags)

    term = diffrax.ODETerm(lambda t, y, args: -y)
    solver = diffrax.Kvaerno3(root_finder=Recording(rtol=1e-8, atol=1e-8))
    diffrax.diffeqsolve(term, solver, 0.0, 0.1, 0.1, jnp.ones(2))
    np.testing.assert_allclose(max(seen), 0.4358665215, rtol=1e-9)
    assert private.stage_diagonal((1.0, 2.0)) is None


def test_result_codes_read_and_write_the_codes_of_an_enumeration():
    results = diffrax.RESULTS
    item = results.where(jnp.asarray(True), results.max_steps_reached, results.successful)
    code = private.result_codes(item)
    assert jnp.shape(code) == () and jnp.issubdtype(jnp.result_type(code), jnp.integer), (
        f"the code of an equinox enumeration item (`_value`) changed in {VERSIONS}"
    )
    assert private.result_messages(results)[int(code)] == results[item], (
        f"equinox's messages by code (`_index_to_message`) changed in {VERSIONS}"
    )
    batch = jax.vmap(
        lambda flag: results.where(flag, results.successful, results.max_steps_reached)
    )(jnp.array([True, False]))
    swapped = private.with_result_codes(batch, private.result_codes(batch)[::-1])
    assert (swapped == results.max_steps_reached).tolist() == [True, False]


def test_scan_operand_groups_split_a_scans_operands():
    """A scan with two constants, one carry and three scanned inputs: its equation's
    operands split into those groups, in order."""

    def f(a, b, c, xs, ys, zs):
        def step(carry, x):
            return carry * a + b, carry * x[0] + x[1] * x[2]

        return jax.lax.scan(step, c, (xs, ys, zs))

    args = (1.0, 2.0, 3.0, jnp.ones(4), jnp.ones(4), jnp.ones(4))
    (scan,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive.name == "scan"]
    consts, carry, xs = private.scan_operand_groups(scan.params, scan.invars)
    assert (len(consts), len(carry), len(xs)) == (2, 1, 3), VERSIONS
    assert consts + carry + xs == list(scan.invars)
    assert [v.aval.shape for v in xs] == [(4,)] * 3
