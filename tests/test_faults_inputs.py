"""Fault injection at the inputs: tolerances that make no sense, complex and float16 values,
bad traced times and steps, gains that overflow, solvers jaxdae cannot use, bad input of
the analysis and control functions, deep projections and URDF files with a zero axis.
Each is refused with a message that names the input and the fix, or, traced with
`throw=False`, reported as a named result (docs/failures.md)."""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._checks import check_tolerances
from jaxdae._integration._projection import project_state
from jaxdae.examples import AdaptiveOpticsElement, CartesianPendulum

PENDULUM = CartesianPendulum()
Q0, V0 = PENDULUM.state_from_angle(0.5, 0.0)
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)
INVALID = int(jaxdae.RESULTS.invalid_input._value)
SUCCESS = int(jaxdae.RESULTS.successful._value)


# Tolerances -------------------------------------------------------------------------


BAD_TOLERANCES = [
    (-1e-8, 1e-10, r"`rtol` must be in \[0, 1\]"),
    (2.0, 1e-10, r"above 1 accepts any step"),
    (np.nan, 1e-10, r"`rtol` must be in \[0, 1\]"),
    (1e-8, -1.0, r"`atol` must be a finite non-negative number"),
    (1e-8, np.inf, r"`atol` must be a finite non-negative number"),
    (0.0, 0.0, r"not both be zero"),
]


def _optics_call(**options):
    optics = AdaptiveOpticsElement()
    control = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)
    return jaxdae.simulate_actuated(
        optics, control, 0.0, 0.1, *optics.initial_state(angle_error=0.05), **options
    )


@pytest.mark.parametrize("rtol, atol, match", BAD_TOLERANCES)
@pytest.mark.parametrize(
    "entry", ["simulate", "simulate_ensemble", "simulate_actuated", "controller"]
)
def test_bad_tolerances_are_refused_eagerly(entry, rtol, atol, match):
    """Checked before anything is compiled, in every entry point and in a
    `diffrax.PIDController` passed to `simulate`."""
    calls = {
        "simulate": lambda: jaxdae.simulate(
            PENDULUM, BAUMGARTE, 0.0, 0.2, Q0, V0, rtol=rtol, atol=atol
        ),
        "simulate_ensemble": lambda: jaxdae.simulate_ensemble(
            PENDULUM, BAUMGARTE, 0.0, 0.2, Q0[None], V0[None], rtol=rtol, atol=atol
        ),
        "simulate_actuated": lambda: _optics_call(rtol=rtol, atol=atol),
        "controller": lambda: jaxdae.simulate(
            PENDULUM,
            BAUMGARTE,
            0.0,
            0.2,
            Q0,
            V0,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        ),
    }
    with pytest.raises(ValueError, match=match):
        calls[entry]()


@pytest.mark.parametrize("rtol, atol", [(0.0, 1e-10), (1e-8, 0.0), (1.0, 1e-10), (1e-8, 10.0)])
def test_one_zero_tolerance_is_pure_relative_or_absolute_control(rtol, atol):
    """As in SUNDIALS, either tolerance may be zero alone; `atol` has no upper bound (it
    carries the state's units)."""
    check_tolerances(rtol, atol)


# Complex, float16 and integer values --------------------------------------------------


class ComplexConstraint(CartesianPendulum):
    def constraints(self, t, q):
        return super().constraints(t, q) + 0j


class ComplexEnergy(CartesianPendulum):
    def potential_energy(self, t, q):
        return super().potential_energy(t, q) + 0j


class IntegerConstraint(CartesianPendulum):
    def constraints(self, t, q):
        return jnp.array([1])


@pytest.mark.usefixtures("unchecked")
@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2, Q0 + 0j, V0),
            r"`q0` must be real: it is complex",
        ),
        (
            lambda: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2, Q0, V0 + 1j),
            r"`v0` must be real: it is complex",
        ),
        (lambda: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2 + 0j, Q0, V0), r"`t1` must be real"),
        (
            lambda: jaxdae.simulate(
                PENDULUM, BAUMGARTE, 0.0, 0.2, Q0, V0, ts=jnp.array([0.0, 0.1 + 1j])
            ),
            r"`ts` must be real",
        ),
        (
            lambda: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2, Q0, V0, rtol=1e-8 + 0j),
            r"`rtol` must be real",
        ),
        (lambda: jaxdae.Baumgarte(10.0 + 1j, 25.0), r"The gain `kd` of Baumgarte must be real"),
        (
            lambda: jaxdae.ModifiedLagrange(alpha=100.0, kd=10.0, kp=jnp.asarray(25.0 + 0j)),
            r"The gain `kp` of ModifiedLagrange must be real",
        ),
        (
            lambda: jaxdae.simulate(
                CartesianPendulum(length=1.0 + 0j), BAUMGARTE, 0.0, 0.2, Q0, V0
            ),
            r"The system parameter `length` of CartesianPendulum must be real",
        ),
        (
            lambda: jaxdae.simulate(ComplexConstraint(), BAUMGARTE, 0.0, 0.2, Q0, V0),
            r"The output of `constraints` of ComplexConstraint must be real",
        ),
        (
            lambda: jaxdae.simulate(ComplexEnergy(), BAUMGARTE, 0.0, 0.2, Q0, V0),
            r"The output of `potential_energy` of ComplexEnergy must be real",
        ),
        (
            lambda: jaxdae.simulate(IntegerConstraint(), BAUMGARTE, 0.0, 0.2, Q0, V0),
            r"The output of `constraints` of IntegerConstraint must be floating: it is int",
        ),
        (
            lambda: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2, Q0.astype(jnp.float16), V0),
            r"`q0` must be float32 or float64: jaxdae does not support float16",
        ),
        (
            lambda: jaxdae.Baumgarte(jnp.float16(10.0), 25.0),
            r"The gain `kd` of Baumgarte must be float32 or float64",
        ),
        (
            lambda: jaxdae.simulate(
                CartesianPendulum(length=jnp.bfloat16(1.0)), BAUMGARTE, 0.0, 0.2, Q0, V0
            ),
            r"`length` .* must be float32 or float64",
        ),
    ],
    ids=[
        "q0",
        "v0",
        "t1",
        "ts",
        "rtol",
        "kd",
        "kp",
        "parameter",
        "constraints",
        "energy",
        "integer-constraints",
        "float16-q0",
        "float16-gain",
        "bfloat16-parameter",
    ],
)
def test_complex_float16_and_integer_values_are_named(call, match):
    """Their imaginary parts would be dropped with only a NumPy warning, or the error
    would come from deep inside autodiff without naming the input."""
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "times, options, name",
    [
        (("0", 0.2), {}, "t0"),
        ((0.0, "0.2"), {}, "t1"),
        ((0.0, 0.2), {"ts": ["0.1", 0.2]}, "ts"),
        ((0.0, 0.2), {"ts": np.array(["0.1", "0.2"])}, "ts"),
        ((0.0, 0.2), {"rtol": "1e-6"}, "rtol"),
        ((0.0, 0.2), {"dt0": b"0.01"}, "dt0"),
    ],
)
@pytest.mark.usefixtures("unchecked")
def test_text_for_a_number_is_refused_by_name(times, options, name):
    """NumPy converts `"0"` to a number (a typo in a configuration file would pass
    silently) and refuses `"a"` without naming the input."""
    with pytest.raises(TypeError, match=rf"`{name}` must be a real number .* got text"):
        jaxdae.simulate(PENDULUM, BAUMGARTE, *times, Q0, V0, **options)


# Traced times, steps and tolerances -----------------------------------------------------


@functools.cache
def _traced(throw: bool):
    """One compiled solve with the times, first step, tolerances and the gain `kp` traced
    (the bad inputs below and the overflowing gain share it)."""

    def solve(ts, dt0, rtol, atol, kp):
        sol = jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(10.0, kp),
            0.0,
            0.2,
            Q0,
            V0,
            ts=ts,
            dt0=dt0,
            rtol=rtol,
            atol=atol,
            throw=throw,
        )
        return sol.result._value, sol.q_final

    return jax.jit(solve)


GOOD = dict(ts=jnp.array([0.0, 0.1, 0.2]), dt0=0.01, rtol=1e-8, atol=1e-10, kp=25.0)
TRACED_CASES = [
    (dict(ts=jnp.array([0.0, 0.15, 0.1])), r"`ts` must be finite, sorted and lie in"),
    (dict(ts=jnp.array([0.0, 0.1, 0.5])), r"`ts` must be finite, sorted and lie in"),
    (dict(ts=jnp.array([-0.1, 0.1, 0.2])), r"`ts` must be finite, sorted and lie in"),
    (dict(ts=jnp.array([0.0, jnp.nan, 0.2])), r"`ts` must be finite, sorted and lie in"),
    (dict(dt0=-0.01), r"`dt0` must be a positive finite step"),
    (dict(dt0=0.0), r"`dt0` must be a positive finite step"),
    (dict(dt0=jnp.inf), r"`dt0` must be a positive finite step"),
    (dict(rtol=-1e-8), r"`rtol` and `atol` must be finite and non-negative"),
    (dict(rtol=2.0), r"`rtol` and `atol` must be finite and non-negative"),
    (dict(rtol=0.0, atol=0.0), r"`rtol` and `atol` must be finite and non-negative"),
]
TRACED_IDS = [
    "ts-unsorted",
    "ts-beyond-t1",
    "ts-before-t0",
    "ts-nan",
    "dt0-negative",
    "dt0-zero",
    "dt0-inf",
    "rtol-negative",
    "rtol-above-1",
    "both-zero",
]


def test_good_traced_input_succeeds():
    code, q_final = _traced(False)(**GOOD)
    assert int(code) == SUCCESS and np.all(np.isfinite(q_final))


@pytest.mark.parametrize("bad, match", TRACED_CASES, ids=TRACED_IDS)
def test_bad_traced_input_is_invalid_input_without_throw(bad, match):
    """diffrax's own checks of its times and step would raise from a callback; jaxdae's
    run first, and with `throw=False` name the input as `RESULTS.invalid_input`."""
    code, q_final = _traced(False)(**{**GOOD, **bad})
    assert int(code) == INVALID
    assert np.all(np.isnan(q_final))


@pytest.mark.parametrize("bad, match", TRACED_CASES, ids=TRACED_IDS)
def test_bad_traced_input_raises_jaxdaes_message_with_throw(bad, match, capsys):
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(_traced(True)(**{**GOOD, **bad}))
    # The solve that ran on stand-ins for the bad input is not reported as a failure.
    assert "jaxdae.SimulationError" not in capsys.readouterr().err


# Gains that overflow ------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: jaxdae.Baumgarte(1e300, 25.0), "kd"),
        (lambda: jaxdae.Baumgarte(10.0, 1e300), "kp"),
        (lambda: jaxdae.Baumgarte(np.inf, 25.0), "kd"),
        (lambda: jaxdae.PseudoInverse(10.0, 1e160), "kp"),
        (lambda: jaxdae.ModifiedLagrange(alpha=1e200, kd=10.0, kp=25.0), "alpha"),
        (lambda: jaxdae.ModifiedLagrange(alpha=np.inf, kd=10.0, kp=25.0), "alpha"),
    ],
)
def test_a_gain_that_overflows_is_blamed_on_the_gain(make, name):
    """Before, the solve failed with non-finite rates or a stalled step, which named the
    model."""
    with pytest.raises(ValueError, match=rf"`{name}` must have entries of at most 1.34e\+154"):
        make()


def test_a_traced_gain_that_overflows_is_named():
    with pytest.raises(
        Exception,
        match=r"`kp` must be symmetric positive definite .*, "
        r"with entries of at most 1.34e\+154 in magnitude",
    ):
        jax.block_until_ready(_traced(True)(**{**GOOD, "kp": 1e300}))


# Solvers jaxdae cannot use ------------------------------------------------------------


@pytest.mark.parametrize(
    "solver",
    [
        diffrax.EulerHeun(),
        diffrax.SPaRK(),
        diffrax.ShARK(),
        diffrax.ItoMilstein(),
        jaxdae.Projected(diffrax.SRA1()),
    ],
    ids=lambda s: type(s).__name__,
)
def test_an_sde_solver_is_named(solver):
    with pytest.raises(
        ValueError,
        match=r"a solver of stochastic differential equations.*"
        r"such as `diffrax.Tsit5\(\)`",
    ):
        jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2, Q0, V0, solver=solver, dt0=0.01)


@pytest.mark.parametrize(
    "solver", [diffrax.KenCarp3(), diffrax.SemiImplicitEuler()], ids=lambda s: type(s).__name__
)
def test_a_solver_of_several_terms_is_named(solver):
    with pytest.raises(ValueError, match=r"which integrates several terms"):
        jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.2, Q0, V0, solver=solver, dt0=0.01)


# A deep projection ----------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=1)
def _projected(q, iterations):
    q_start = PENDULUM.state_from_angle(0.5, 0.3)[1] + 0.01
    return project_state(PENDULUM, BAUMGARTE, jnp.zeros(()), q, q_start, None, iterations, 1e-13)


def test_a_deep_projection_iterates_in_a_loop():
    """5000 iterations as nested `lax.cond`s overflowed Python's recursion; beyond a few
    they run in a `lax.scan` with the same result and a gradient."""
    q = 1.001 * PENDULUM.state_from_angle(0.5, 0.3)[0]
    (q_deep, s_deep), *ok = _projected(q, 5000)
    assert all(bool(x) for x in ok)
    np.testing.assert_allclose(q_deep @ q_deep, 1.0, rtol=0, atol=1e-14)  # |q| = length
    np.testing.assert_allclose(q_deep @ s_deep, 0.0, rtol=0, atol=1e-14)  # Φ̇ = 2 q·v
    grad = jax.jit(jax.grad(lambda q: jnp.sum(_projected(q, 5000)[0][0])))(q)
    assert np.all(np.isfinite(grad))


@pytest.mark.slow
def test_a_solve_with_a_deep_projection():
    sol = jaxdae.simulate(
        PENDULUM,
        BAUMGARTE,
        0.0,
        0.05,
        Q0,
        V0,
        solver=jaxdae.Projected(diffrax.Tsit5(), iterations=5000),
    )
    assert sol.succeeded and float(jnp.max(jnp.abs(sol.phi[-1]))) < 1e-12


# URDF -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, xyz", [("revolute", "0 0 0"), ("prismatic", "0 0 0"), ("continuous", "nan 0 1")]
)
def test_a_zero_urdf_joint_axis_names_file_and_line(tmp_path, kind, xyz):
    pytest.importorskip("yourdfpy")
    path = tmp_path / "zero_axis.urdf"
    path.write_text(
        '<robot name="r">\n<link name="a"/>\n<link name="b"><inertial><mass value="1"/>'
        '<inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial></link>\n'
        f'<joint name="j" type="{kind}">\n<parent link="a"/><child link="b"/>\n'
        f'<axis xyz="{xyz}"/>\n<limit lower="-1" upper="1" effort="1" velocity="1"/>\n'
        "</joint>\n</robot>\n"
    )
    with pytest.raises(
        ValueError,
        match=rf"zero_axis.urdf, line 4: joint 'j' has the <axis> "
        rf"xyz=\"{xyz}\": a {kind} joint needs a finite nonzero",
    ):
        jaxdae.multibody.load_urdf(path)


# Analysis: linearize, equilibrium ----------------------------------------------------------

BOTTOM = jnp.array([0.0, -1.0])  # the pendulum's equilibrium


@pytest.mark.usefixtures("unchecked")
@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, jnp.array([jnp.nan, -1.0])),
            r"`q` contains non-finite values",
        ),
        (
            lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, BOTTOM, jnp.array([jnp.inf, 0.0])),
            r"`v` contains non-finite values",
        ),
        (
            lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, BOTTOM, tol=-1.0),
            r"`tol` must be a positive finite root tolerance",
        ),
        (
            lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, BOTTOM, tol=0.0),
            r"`tol` must be a positive finite root tolerance",
        ),
        (lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, BOTTOM + 0j), r"`q` must be real"),
        (
            lambda: jaxdae.equilibrium(PENDULUM, jnp.array([jnp.nan, -1.0])),
            r"`q_guess` contains non-finite values",
        ),
        (
            lambda: jaxdae.equilibrium(PENDULUM, BOTTOM, v_guess=jnp.array([jnp.nan, 0.0])),
            r"`v_guess` contains non-finite values",
        ),
        (
            lambda: jaxdae.equilibrium(PENDULUM, BOTTOM, tol=-1.0),
            r"`tol` must be a positive finite residual tolerance",
        ),
        (
            lambda: jaxdae.equilibrium(PENDULUM, BOTTOM, tol=np.nan),
            r"`tol` must be a positive finite residual tolerance",
        ),
        (lambda: jaxdae.equilibrium(PENDULUM, BOTTOM + 0j), r"`q_guess` must be real"),
    ],
    ids=[
        "lin-q-nan",
        "lin-v-inf",
        "lin-tol-negative",
        "lin-tol-zero",
        "lin-complex",
        "eq-q-nan",
        "eq-v-nan",
        "eq-tol-negative",
        "eq-tol-nan",
        "eq-complex",
    ],
)
def test_analysis_refuses_bad_input_eagerly(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.slow
def test_analysis_refuses_bad_traced_input():
    """The same checks under `jit`, where a nan state used to pass (`linearize` returned a
    nan `A`) and a traced `tol` broke the message's formatting (`equilibrium`)."""
    linearize = jax.jit(lambda q, tol: jaxdae.linearize(PENDULUM, BAUMGARTE, q, tol=tol).A)
    equilibrium = jax.jit(lambda q, tol: jaxdae.equilibrium(PENDULUM, q, tol=tol).q)
    assert np.all(np.isfinite(linearize(BOTTOM, 1e-6)))
    with pytest.raises(Exception, match=r"`q` contains non-finite values"):
        jax.block_until_ready(linearize(jnp.array([jnp.nan, -1.0]), 1e-6))
    with pytest.raises(Exception, match=r"`tol` must be a positive finite root tolerance"):
        jax.block_until_ready(linearize(BOTTOM, -1.0))
    np.testing.assert_allclose(equilibrium(jnp.array([0.1, -1.0]), 1e-8), BOTTOM, atol=1e-8)
    with pytest.raises(Exception, match=r"`q_guess` contains non-finite values"):
        jax.block_until_ready(equilibrium(jnp.array([jnp.nan, -1.0]), 1e-8))
    with pytest.raises(Exception, match=r"`tol` must be a positive finite residual tolerance"):
        jax.block_until_ready(equilibrium(BOTTOM, -1.0))
    # x held at 2: no point of the unit circle; the message without the traced `tol`.
    held = jax.jit(lambda q, tol: jaxdae.equilibrium(PENDULUM, q, fixed=(0,), tol=tol).q)
    with pytest.raises(Exception, match=r"No equilibrium found near `q_guess`: .* above tol\."):
        jax.block_until_ready(held(jnp.array([2.0, 0.0]), 1e-8))


def test_linearize_names_a_singular_dependent_jacobian():
    """At the pendulum's bottom `∂Φ/∂x = 2x = 0`: with `x` dependent, `A` was nan without
    a word; it is refused as `simulate` refuses such a `q0`."""
    with pytest.raises(
        ValueError,
        match=r"∂F/∂q_dep is singular .* dependent coordinates "
        r"\(0,\) cannot be solved for .*σ_min/σ_max: 0",
    ):
        jaxdae.linearize(PENDULUM, jaxdae.RedundantCoordinates((0,)), BOTTOM)


# Control: lqr -------------------------------------------------------------------------------

DOUBLE_INTEGRATOR = (jnp.array([[0.0, 1.0], [0.0, 0.0]]), jnp.array([[0.0], [1.0]]))
UNSTABLE = jnp.array([[1.0, 0.0], [0.0, -1.0]])  # its unstable mode is actuated through b[0]


def _lqr_of(b0, **options):
    return jaxdae.lqr(UNSTABLE, jnp.array([[b0], [1.0]]), jnp.eye(2), jnp.eye(1), **options)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(rtol=-1.0), r"`rtol` must be a relative tolerance in \(0, 1\]"),
        (dict(rtol=0.0), r"`rtol` must be a relative tolerance in \(0, 1\]"),
        (dict(rtol=2.0), r"`rtol` must be a relative tolerance in \(0, 1\]"),
        (dict(max_steps=0), r"`max_steps` must be a positive integer"),
    ],
)
def test_lqr_refuses_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        jaxdae.lqr(*DOUBLE_INTEGRATOR, jnp.eye(2), jnp.eye(1), **options)


@pytest.mark.usefixtures("unchecked")
def test_lqr_refuses_complex_input():
    with pytest.raises(ValueError, match=r"`A` must be real"):
        jaxdae.lqr(DOUBLE_INTEGRATOR[0] + 0j, DOUBLE_INTEGRATOR[1], jnp.eye(2), jnp.eye(1))


def test_lqr_without_throw_reports_per_member():
    """`throw=False` under `vmap`: an uncontrollable pair and a nan input give
    `stabilizing=False` and a nan gain in their own members only."""
    sols = jax.vmap(lambda b0: _lqr_of(b0, throw=False))(jnp.array([1.0, 0.0, jnp.nan]))
    assert np.asarray(sols.succeeded).tolist() == [True, False, False]
    # K = R⁻¹BᵀP solves the Riccati equation of the controllable member.
    p, gain = np.asarray(sols.riccati[0]), np.asarray(sols.gain[0])
    a, b = np.asarray(UNSTABLE), np.array([[1.0], [1.0]])
    np.testing.assert_allclose(a.T @ p + p @ a - p @ b @ b.T @ p + np.eye(2), 0, atol=1e-10)
    np.testing.assert_allclose(gain, b.T @ p, rtol=1e-12)
    assert np.all(np.isnan(sols.gain[1:])) and np.all(np.isnan(sols.riccati[1:]))
    # The nan member's closed-loop eigenvalues are nan; the others' are its own.
    closed = np.asarray(sols.closed_loop_eigenvalues)
    assert np.all(np.isnan(closed[2])) and np.all(closed[0].real < 0)
    np.testing.assert_allclose(
        np.sort_complex(closed[0]), np.sort_complex(np.linalg.eigvals(a - b @ gain)), rtol=1e-10
    )


@pytest.mark.slow
def test_lqr_without_throw_eagerly():
    sol = _lqr_of(0.0, throw=False)
    assert not bool(sol.succeeded) and np.all(np.isnan(sol.gain))


@pytest.mark.slow
def test_lqr_gradient_near_an_uncontrollable_pair():
    """Under `jax.grad` the checks of concrete input are skipped (the input is traced), so
    the check of the solution must not read a traced residual: the gradient near the
    uncontrollable pair matches central differences, and at the pair itself the failure
    is named."""

    def cost(b0):
        return jnp.trace(_lqr_of(b0).riccati)

    b0, h = 0.1, 1e-5
    grad = jax.grad(cost)(b0)
    np.testing.assert_allclose(grad, (cost(b0 + h) - cost(b0 - h)) / (2 * h), rtol=1e-5)
    with pytest.raises(Exception, match=r"No stabilizing solution of the Riccati equation"):
        jax.grad(cost)(0.0)
    with pytest.raises(Exception, match=r"No stabilizing solution of the Riccati equation"):
        jax.grad(cost)(1e-9)  # numerically uncontrollable
    grad = jax.grad(lambda b0: jnp.nansum(_lqr_of(b0, throw=False).riccati))(0.0)
    assert np.isfinite(grad)


@pytest.mark.slow
def test_lqr_traced_input_checks():
    solve = jax.jit(
        lambda a, rtol: jaxdae.lqr(a, DOUBLE_INTEGRATOR[1], jnp.eye(2), jnp.eye(1), rtol=rtol).gain
    )
    np.testing.assert_allclose(
        solve(DOUBLE_INTEGRATOR[0], 1e-12), [[1.0, np.sqrt(3.0)]], rtol=1e-10
    )
    with pytest.raises(Exception, match=r"`A`, `B`, `Q` and `R` must be finite"):
        jax.block_until_ready(solve(DOUBLE_INTEGRATOR[0].at[0, 0].set(jnp.nan), 1e-12))
    with pytest.raises(Exception, match=r"`rtol` must be a relative tolerance in \(0, 1\]"):
        jax.block_until_ready(solve(DOUBLE_INTEGRATOR[0], -1.0))


@functools.cache
def _traced_actuated(throw: bool):
    optics = AdaptiveOpticsElement()
    control = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)
    state = optics.initial_state(angle_error=0.05)
    return jax.jit(
        lambda ts, dt0: (
            jaxdae.simulate_actuated(
                optics, control, 0.0, 0.1, *state, ts=ts, dt0=dt0, throw=throw
            ).result._value
        )
    )


@pytest.mark.slow
def test_bad_traced_input_of_simulate_actuated():
    """`simulate_actuated` reports bad traced times and steps as `simulate` does."""
    solve = _traced_actuated(False)
    good = jnp.array([0.0, 0.05, 0.1])
    assert int(solve(good, 0.01)) == SUCCESS
    assert int(solve(jnp.array([0.0, 0.5, 0.1]), 0.01)) == INVALID
    assert int(solve(good, -0.01)) == INVALID


@pytest.mark.slow
def test_bad_traced_input_of_simulate_actuated_raises_with_throw():
    with pytest.raises(Exception, match=r"`ts` must be finite, sorted and lie in"):
        jax.block_until_ready(_traced_actuated(True)(jnp.array([0.0, 0.5, 0.1]), 0.01))


# --- stop data: eager, under jit and under vmap --------------------------------------------


class _Ball(jaxdae.examples.BouncingBall):
    """The bouncing ball whose gap turns nan after the time `nan_after` (an array leaf:
    balls with and without a nan gap, at the start or later, share their programs)."""

    nan_after: jax.Array = eqx.field(default=np.inf, converter=jnp.asarray)

    def gaps(self, t, q):
        return jnp.where(t > self.nan_after, jnp.nan, q[1:2])


def _ball_solution(restitution, height=1.0, t1=0.5, nan_after=np.inf, throw=False):
    return jaxdae.simulate(
        _Ball(e=restitution, nan_after=nan_after),
        jaxdae.Unstabilized(),
        0.0,
        t1,
        jnp.stack([0.0, height]),
        jnp.zeros(2),
        throw=throw,
    )


def _ball_result(restitution, height=1.0, nan_after=np.inf, throw=False):
    sol = _ball_solution(restitution, height, nan_after=nan_after, throw=throw)
    return sol.q_final if throw else sol.result._value


def _ball_traced_result(restitution, height, nan_after):
    sol = _ball_solution(restitution, height, nan_after=nan_after)
    return sol.result._value, sol.q_final


# The ball's programs, shared by the tests and their cases: eager calls (their end times
# are arrays, so one program for all), the restitution, height and nan time traced under
# `jit` (`throw=False`), a batch over all three (its end time unbatched) and the gradient
# with respect to the restitution (`throw=True`: it also raises the rules of bad data).
_ball_traced = jax.jit(_ball_traced_result)
_ball_batch = jax.vmap(_ball_solution, in_axes=(0, 0, None, 0))
_ball_gradient = jax.jit(jax.grad(lambda e: jnp.sum(_ball_result(e, throw=True))))
_NEVER = jnp.array([np.inf, np.inf])  # no nan gap in either member of a batch


def test_a_gradient_of_good_traced_stop_data_is_the_differences():
    step = 1e-6
    difference = (_ball_result(0.5 + step, throw=True) - _ball_result(0.5 - step, throw=True)) / (
        2 * step
    )
    np.testing.assert_allclose(_ball_gradient(0.5), jnp.sum(difference), rtol=1e-5)


def _block_result(friction):
    block = jaxdae.examples.SlidingBlock(friction_coefficient=friction)
    return jaxdae.simulate(
        block, jaxdae.Unstabilized(), 0.0, 0.5, jnp.zeros(2), jnp.array([1.0, 0.0]), throw=False
    ).result._value


# One program for the good and the bad frictions: a batch over the friction. (An unbatched
# traced check reports `invalid_input` as the ball's do, `_ball_traced`.)
_block_batch = jax.vmap(_block_result)


def _disc_result(radius=0.1, lower=0.0, upper=2.0, throw=False):
    """A disc above the ground line whose contact radius and a distance stop's bounds may
    be traced."""
    import jaxdae.multibody as mb

    disc = mb.Mechanism(
        bodies=[mb.PlanarBody("disc", mass=1.0, inertia=0.01, position=(0.0, 0.5))],
        forces=[mb.Gravity((0.0, -9.81))],
        stops=[
            mb.PlaneContact("disc", radius=radius, name="floor"),
            mb.DistanceStop("ground", "disc", lower=lower, upper=upper, name="rope"),
        ],
    )
    q0, v0 = disc.initial_state()
    sol = jaxdae.simulate(disc, jaxdae.Unstabilized(), 0.0, 0.1, q0, v0, throw=throw)
    # (With `throw`, the error is attached to the solution's arrays.)
    return sol.q_final if throw else sol.result._value


_GOOD_STOPS = {"radius": 0.1, "lower": 0.0, "upper": 2.0}
# One program each, shared by the cases: every stop value traced, in a batch under `jit`
# (`invalid_input` per member) and with `throw=True` (the rule as the error). Their known
# zero friction: stop data known in a call that the caller's `jit` traces, checked as such.
_disc_batch = jax.jit(jax.vmap(_disc_result))
_disc_thrown = jax.jit(functools.partial(_disc_result, throw=True))


def test_good_stop_data_passes_in_a_traced_call():
    code, q_final = _ball_traced(0.5, 1.0, np.inf)
    assert int(code) == SUCCESS and np.all(np.isfinite(q_final))
    assert np.all(np.isfinite(_disc_thrown(**_GOOD_STOPS)))
    assert _block_batch(jnp.array([0.5, 0.3])).tolist() == [SUCCESS, SUCCESS]


@pytest.mark.parametrize("restitution", [1.5, -0.2, np.nan])
def test_bad_restitution_is_refused_eager_traced_and_batched(restitution):
    with pytest.raises(ValueError, match="restitution must lie in"):
        _ball_result(restitution)
    assert int(_ball_traced(restitution, 1.0, np.inf)[0]) == INVALID
    batch = _ball_batch(jnp.array([0.5, restitution]), jnp.array([1.0, 1.0]), 0.5, _NEVER)
    assert batch.result._value.tolist() == [SUCCESS, INVALID]
    # With `throw=True`, under `jax.grad`, whose solution's values go unused: the check
    # still runs.
    with pytest.raises(Exception, match="restitution must lie in"):
        jax.block_until_ready(_ball_gradient(restitution))


@pytest.mark.parametrize("friction", [-0.5, np.nan, np.inf])
def test_bad_friction_is_refused_eager_traced_and_batched(friction):
    with pytest.raises(ValueError, match="friction must be"):
        _block_result(friction)
    assert _block_batch(jnp.array([0.5, friction])).tolist() == [SUCCESS, INVALID]


def _stepped_ball_result(height):
    return jaxdae.simulate(
        jaxdae.examples.BouncingBall(e=0.5),
        jaxdae.Unstabilized(),
        0.0,
        0.1,
        jnp.stack([0.0, height]),
        jnp.zeros(2),
        events=jaxdae.TimeStepping(dt=1e-2),
        throw=False,
    ).result._value


@pytest.mark.parametrize("result", [_ball_result, _stepped_ball_result], ids=["events", "stepping"])
def test_a_traced_start_below_a_gap_is_invalid_input(result):
    """A start that violates a gap is refused when concrete and `invalid_input` when
    traced, per member under `vmap` (not launched out of the floor)."""
    with pytest.raises(ValueError, match="violates gap 0"):
        result(0.5, height=-0.1) if result is _ball_result else result(-0.1)
    heights = jnp.array([1.0, -0.1])
    if result is _ball_result:
        batch = _ball_batch(jnp.array([0.5, 0.5]), heights, 0.5, _NEVER).result._value
    else:
        batch = jax.vmap(result)(heights)
    assert batch.tolist() == [SUCCESS, INVALID]


def test_a_gap_that_is_nan_at_the_start_is_refused():
    with pytest.raises(ValueError, match="gaps .* must be finite"):
        _ball_result(0.5, nan_after=-1.0)
    assert int(_ball_traced(0.5, 1.0, -1.0)[0]) == INVALID


class _IntegerGapBall(jaxdae.examples.BouncingBall):
    def gaps(self, t, q):
        return jnp.array([1])


@pytest.mark.usefixtures("unchecked")
def test_integer_gaps_are_refused():
    with pytest.raises(ValueError, match="`gaps` must return floating values"):
        jaxdae.simulate(
            _IntegerGapBall(), jaxdae.Unstabilized(), 0.0, 0.5, jnp.array([0.0, 1.0]), jnp.zeros(2)
        )


def test_the_events_of_a_batch_tabulate_per_member():
    tables = _ball_batch(jnp.array([0.5, 0.5]), jnp.array([1.0, 0.5]), 1.0, _NEVER).events.table()
    assert len(tables) == 2
    assert tables[0] == _ball_solution(0.5, 1.0, 1.0, throw=True).events.table()
    assert tables[1][0][2] == "impact"


def test_event_settings_are_checked():
    assert jaxdae.EventDriven(max_events=np.int64(5)).max_events == 5
    for bad in (True, 2.5, 0):
        with pytest.raises(ValueError, match="max_events"):
            jaxdae.EventDriven(max_events=bad)
    with pytest.raises(ValueError, match="contact_gains"):
        jaxdae.EventDriven(contact_gains=(np.inf, np.inf))
    # Not a contact scheme: refused before any solve, with gaps or without.
    for system in (jaxdae.examples.BouncingBall(), CartesianPendulum()):
        with pytest.raises(ValueError, match="`events` must be `jaxdae.EventDriven"):
            jaxdae.simulate(
                system,
                jaxdae.Unstabilized(),
                0.0,
                0.1,
                jnp.array([1.0, 0.0]),
                jnp.zeros(2),
                events=jaxdae.Unstabilized(),
            )


def test_a_gap_that_turns_nan_is_a_named_failure():
    """A gap that turns nan at t = 0.2, before the ball reaches the floor."""
    named = jaxdae.RESULTS.non_finite_gaps._value
    assert int(_ball_solution(0.5, 1.0, 1.0, nan_after=0.2).result._value) == named
    batch = _ball_batch(jnp.array([0.5, 0.5]), jnp.array([1.0, 0.5]), 1.0, jnp.array([0.2, 0.2]))
    assert batch.result._value.tolist() == [named, named]
    with pytest.raises(jaxdae.SimulationError, match="gaps .* became non-finite"):
        _ball_solution(0.5, 1.0, 1.0, nan_after=0.2, throw=True)


def test_a_start_below_a_named_stop_names_it():
    with pytest.raises(ValueError, match=r"violates gap 0 \('floor'\)"):
        _disc_result(radius=0.6)  # the disc's centre 0.5 above the ground


@pytest.mark.parametrize(
    "bad, eager, match",
    [
        ({"radius": -0.2}, r"`radius` of .* non-negative", r"'floor': its `radius` must be"),
        ({"lower": 0.8, "upper": 0.6}, r"exceeds its `upper`", r"'rope': its `lower` bound must"),
        ({"lower": -0.5}, r"is a distance", r"'rope': its `lower` bound is a distance"),
    ],
)
def test_bad_traced_stop_values_are_invalid_input(bad, eager, match):
    """Stop data that is refused when concrete is reported when traced: `invalid_input`
    per member of a batch under `jit`, the rule as the error under `throw=True`."""
    with pytest.raises(ValueError, match=eager):
        _disc_result(**bad)
    values = {**_GOOD_STOPS, **bad}
    batch = _disc_batch(**{k: jnp.array([_GOOD_STOPS[k], v]) for k, v in values.items()})
    assert batch.tolist() == [SUCCESS, INVALID]
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(_disc_thrown(**values))
