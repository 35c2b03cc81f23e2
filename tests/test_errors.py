"""Bad input gets a ValueError that names the argument and the fix."""

import inspect

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import AdaptiveOpticsElement, CartesianPendulum

from ._systems import DegenerateMass, Unreachable

PENDULUM = CartesianPendulum()
Q0, V0 = PENDULUM.state_from_angle(0.5, 0.0)
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)


class VectorPotential(CartesianPendulum):
    def potential_energy(self, t, q):
        return jnp.atleast_1d(9.81 * q[1])


def _simulate(**overrides):
    args = dict(system=PENDULUM, formulation=BAUMGARTE, t0=0.0, t1=1.0, q0=Q0, v0=V0)
    kwargs = {k: overrides.pop(k) for k in list(overrides) if k not in args}
    args.update(overrides)
    return jaxdae.simulate(*args.values(), **kwargs)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(q0=jnp.ones((2, 2))), r"`q0` must be a 1-D array"),
        (dict(v0=jnp.ones(3)), r"`q0` and `v0` must have the same shape"),
        (dict(q0=jnp.array([jnp.nan, 1.0])), r"`q0` contains non-finite"),
        (dict(v0=jnp.array([0.0, jnp.inf])), r"`v0` contains non-finite"),
        (dict(t1=0.0), r"`t1` must be greater than `t0`"),
        (dict(t0=2.0, t1=1.0), r"`t1` must be greater than `t0`"),
        (dict(ts=jnp.array([0.0, 0.5, 0.2])), r"`ts` must be sorted"),
        (dict(ts=jnp.array([0.0, 2.0])), r"`ts` must lie in \[t0, t1\]"),
        (dict(ts=jnp.array([0.1, jnp.nan])), r"`ts` must hold finite times"),
        (dict(t1=float("inf")), r"`t0` and `t1` must be finite"),
        (dict(t1=float("nan")), r"`t0` and `t1` must be finite"),
        (dict(rtol=-1e-6), r"`rtol` and `atol` must be finite and non-negative"),
        (dict(rtol=0.0, atol=0.0), r"`rtol` and `atol` .* not both zero"),
        (
            dict(formulation=jaxdae.Baumgarte(jnp.ones(3), 1.0)),
            r"`kd` has shape \(3,\).*1 holonomic",
        ),
        (dict(formulation=jaxdae.ModifiedLagrange(jnp.ones(2), 1.0, 1.0)), r"`alpha` has shape"),
        (
            dict(system=DegenerateMass(), q0=jnp.zeros(2), v0=jnp.zeros(2)),
            r"mass matrix at `q0` is not symmetric positive definite",
        ),
        (dict(system="pendulum"), r"`system` must be a jaxdae system"),
        (dict(formulation=None), r"`formulation` must be a jaxdae formulation"),
        (dict(formulation=jaxdae.Baumgarte), r"got the class Baumgarte itself; pass an instance"),
        (dict(solver=diffrax.Tsit5), r"`solver` must be a diffrax solver.*class Tsit5 itself"),
        (dict(stepsize_controller=1e-8), r"`stepsize_controller` must be a diffrax step-size"),
        (dict(adjoint="backsolve"), r"`adjoint` must be a diffrax adjoint"),
        (dict(max_steps=0), r"`max_steps` must be a positive integer or None"),
        (dict(t0=jnp.zeros(1)), r"`t0` and `t1` must be scalars"),
        (dict(q0=Q0.astype(complex)), r"`q0` must be real"),
        (dict(system=VectorPotential()), r"`potential_energy` must return a scalar"),
    ],
    ids=[
        "q0-2d",
        "v0-shape",
        "q0-nan",
        "v0-inf",
        "t1-equals-t0",
        "t1-before-t0",
        "ts-unsorted",
        "ts-outside",
        "ts-nan",
        "t1-inf",
        "t1-nan",
        "rtol-negative",
        "tolerances-zero",
        "kd-size",
        "alpha-size",
        "mass-not-spd",
        "not-a-system",
        "not-a-formulation",
        "formulation-class",
        "solver-class",
        "controller-not",
        "adjoint-not",
        "max-steps-zero",
        "t0-vector",
        "q0-complex",
        "potential-vector",
    ],
)
def test_bad_simulate_input(unchecked, overrides, match):
    with pytest.raises(ValueError, match=match):
        _simulate(**overrides)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: jaxdae.Baumgarte(-1.0, 1.0),
            r"`kd` must be symmetric positive definite.*Lyapunov",
        ),
        (
            lambda: jaxdae.Baumgarte(1.0, jnp.array([1.0, 0.0])),
            r"`kp` must be symmetric positive definite",
        ),
        (lambda: jaxdae.Baumgarte(jnp.array([[2.0, 1.0], [0.0, 2.0]]), 1.0), r"`kd`.*asymmetry"),
        (lambda: jaxdae.Baumgarte(jnp.array([[1.0, 2.0], [2.0, 1.0]]), 1.0), r"`kd`.*eigenvalues"),
        (lambda: jaxdae.Baumgarte(jnp.ones((2, 3)), 1.0), r"`kd` must be a scalar, a vector"),
        (lambda: jaxdae.PseudoInverse(1.0, 1.0, rcond=2.0), r"`rcond` must be in \[0, 1\)"),
        (
            lambda: jaxdae.ModifiedLagrange(0.0, 1.0, 1.0),
            r"`alpha` must be symmetric positive definite",
        ),
        (lambda: jaxdae.Baumgarte(jnp.nan, 1.0), r"`kd` must be symmetric positive definite"),
    ],
    ids=[
        "kd-negative",
        "kp-zero",
        "kd-asymmetric",
        "kd-indefinite",
        "kd-not-square",
        "rcond",
        "alpha-zero",
        "kd-nan",
    ],
)
def test_bad_gains_are_refused_at_construction(unchecked, make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: jaxdae.simulate_actuated(
                AdaptiveOpticsElement(),
                jaxdae.ConstraintEnforcingControl,
                0.0,
                1.0,
                *AdaptiveOpticsElement().initial_state(),
            ),
            r"`control` must be a `jaxdae.ConstraintEnforcingControl`; got the class",
        ),
        (
            lambda: jaxdae.HamiltonianForm(PENDULUM.terms),
            r"`lagrangian` must be a `jaxdae.LagrangianSystem`",
        ),
        (
            lambda: jaxdae.RealizedConstraints(PENDULUM, jaxdae.ViscousForce),
            r"`force` must be a realizing-force law.*got the class ViscousForce",
        ),
        (
            lambda: jaxdae.linearize(PENDULUM, "unstabilized", Q0),
            r"`formulation` must be a jaxdae formulation",
        ),
        (
            lambda: jaxdae.equilibrium(PENDULUM, jnp.array([jnp.nan, 1.0])),
            r"`q_guess` contains non-finite values",
        ),
        (lambda: jaxdae.UnrolledERK(diffrax.Tsit5), r"got the class Tsit5 itself"),
        (lambda: jaxdae.with_controller(PENDULUM, None), r"CartesianPendulum has no `controller`"),
    ],
    ids=[
        "actuated-control-class",
        "hamiltonian-form",
        "realizing-force-class",
        "linearize-formulation",
        "equilibrium-nan",
        "unrolled-class",
        "no-controller-field",
    ],
)
def test_arguments_of_the_wrong_kind_are_named(unchecked, call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: _simulate(rtoll=1e-6),
            r"simulate\(\) got an unexpected keyword argument 'rtoll'\. Did you mean `rtol`\? "
            r"Its keyword arguments are: ts, solver, .*, throw, constraint_tol, events\.",
        ),
        (
            lambda: jaxdae.simulate_ensemble(
                PENDULUM, BAUMGARTE, 0.0, 1.0, Q0[None], V0[None], events=None
            ),
            r"simulate_ensemble\(\) got an unexpected keyword argument 'events'\. Its "
            r"keyword arguments are: .*, constraint_tol\.$",
        ),
        (
            lambda: jaxdae.simulate_actuated(
                AdaptiveOpticsElement(),
                jaxdae.ConstraintEnforcingControl.with_poles(1.0, order=4),
                0.0,
                1.0,
                *AdaptiveOpticsElement().initial_state(),
                max_step=10,
            ),
            r"simulate_actuated\(\) got an unexpected keyword argument 'max_step'\. Did you "
            r"mean `max_steps`\?",
        ),
    ],
    ids=["simulate", "ensemble-events", "actuated"],
)
def test_unknown_solve_keywords_are_refused_naming_the_valid_ones(call, match):
    """The entry points share their keyword arguments (`SolveKeywords`): any other is a
    `TypeError`, before any work, that lists the valid ones."""
    with pytest.raises(TypeError, match=match):
        call()


def test_gains_changed_after_construction_are_checked_by_simulate():
    """E.g. an optimizer step that makes a gain negative (tree updates bypass __init__)."""
    bad = eqx.tree_at(lambda f: f.kp, BAUMGARTE, jnp.array(-3.0))
    with pytest.raises(ValueError, match=r"`kp` must be symmetric positive definite"):
        _simulate(formulation=bad)


# Traced input: one compiled simulation for the checks that run inside it.
_traced = jax.jit(
    lambda kd, q0, t1, ts: _simulate(formulation=jaxdae.Baumgarte(kd, 25.0), q0=q0, t1=t1, ts=ts).q
)
_TS = jnp.array([0.0, 0.5])


@pytest.mark.slow
def test_traced_bad_gains_raise_under_jit():
    assert np.all(np.isfinite(_traced(10.0, Q0, 1.0, _TS)))
    with pytest.raises(Exception, match="`kd` must be symmetric positive definite"):
        _traced(-1.0, Q0, 1.0, _TS).block_until_ready()


def test_traced_bad_gain_in_a_batch_names_the_gain():
    """The checks and the failure are one branched error; under `vmap` it reports the
    largest message index of the batch, so a good row must not add the index of
    `RESULTS.successful` (the empty message)."""
    batched = jax.vmap(lambda kd: _simulate(formulation=jaxdae.Baumgarte(kd, 25.0)).q)
    with pytest.raises(Exception, match="`kd` must be symmetric positive definite"):
        jax.block_until_ready(batched(jnp.array([10.0, -1.0])))


def test_traced_checks_outside_simulate_after_one_ran():
    """A traced check made outside `simulate` after one ran (`simulate_actuated`'s control
    gains, a realizing-force law re-traced in the right-hand side) attaches its own error
    (the demo's adaptive-optics study runs after the two-link one)."""
    from jaxdae._gains import attach_checks

    _simulate(formulation=jaxdae.Baumgarte(10.0, 25.0))
    check = jax.jit(lambda x: attach_checks(x, [(x < 0, "`x` must be non-negative")]))
    assert float(check(1.0)) == 1.0
    with pytest.raises(Exception, match="`x` must be non-negative"):
        check(-1.0).block_until_ready()


def test_traced_bad_initial_state_and_times_raise_under_jit():
    with pytest.raises(Exception, match="`q0` contains non-finite"):
        _traced(10.0, jnp.array([jnp.nan, 0.0]), 1.0, _TS).block_until_ready()
    with pytest.raises(Exception, match="`t0` and `t1` must be finite"):
        _traced(10.0, Q0, jnp.inf, _TS).block_until_ready()
    with pytest.raises(Exception, match="`ts` must be finite, sorted"):
        _traced(10.0, Q0, 1.0, jnp.array([0.0, jnp.nan])).block_until_ready()


def test_traced_dense_mass_not_positive_definite_is_named_at_q0():
    """A system without a factor that shows definiteness keeps the traced check of its
    mass matrix at `q0` (a tree's stalls instead: `test_multibody_tree.py`)."""
    solve = jax.jit(
        lambda q0: (
            jaxdae.simulate(
                DegenerateMass(), jaxdae.Unstabilized(), 0.0, 0.1, q0, jnp.ones(2)
            ).q_final
        )
    )
    with pytest.raises(Exception, match="mass matrix at `q0` is not symmetric positive"):
        jax.block_until_ready(solve(jnp.zeros(2)))


def test_constraints_must_return_a_vector():
    class ScalarConstraint(CartesianPendulum):
        def constraints(self, t, q):
            return q @ q - 1.0

    with pytest.raises(
        ValueError, match=r"`constraints` must return a 1-D array.*jnp.array\(\[expr\]\)"
    ):
        _simulate(system=ScalarConstraint())


def test_no_consistent_state():
    with pytest.raises(ValueError, match="No consistent initial state found"):
        jaxdae.consistent_initial_state(Unreachable(), 0.0, jnp.array([0.5, 0.0]), jnp.zeros(2))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(tol=-1.0), "`tol` must be a positive finite residual"),
        (dict(tol=0.0), "`tol` must be a positive finite residual"),
        (dict(q0=jnp.array([jnp.nan, 0.0])), "`q0` contains non-finite values"),
        (dict(t0=jnp.inf), "`t0` contains non-finite values"),
    ],
    ids=["tol-negative", "tol-zero", "q0-nan", "t0-inf"],
)
def test_bad_consistent_state_input(overrides, match):
    args = dict(t0=0.0, q0=Q0, v0=V0) | overrides
    with pytest.raises(ValueError, match=match):
        jaxdae.consistent_initial_state(PENDULUM, **args)


def test_no_consistent_state_under_jit():
    project = jax.jit(
        lambda q0: jaxdae.consistent_initial_state(Unreachable(), 0.0, q0, jnp.zeros(2))[0]
    )
    with pytest.raises(Exception, match="No consistent initial state found near `q0`"):
        jax.block_until_ready(project(jnp.array([0.5, 0.0])))


def test_failed_solve_reports_max_steps():
    with pytest.raises(jaxdae.SimulationError, match=r"maximum number of solver steps[\s\S]*t = "):
        _simulate(max_steps=5)
    sol = _simulate(max_steps=5, throw=False)
    assert sol.result == jaxdae.RESULTS.max_steps_reached
    assert not bool(sol.succeeded)


@pytest.mark.parametrize("dt0", [-0.01, 0.0, float("nan")])
def test_bad_step_is_refused(dt0):
    with pytest.raises(ValueError, match="`dt0` must be a positive finite step"):
        _simulate(dt0=dt0)


def test_fixed_step_blow_up_is_reported_not_returned_as_nan():
    """A fixed step too large for the gains (explicit Euler, ρ(I + τH) > 1) overflows: the
    solve stops with `non_finite_state` instead of returning inf/nan as a success."""
    gains = jaxdae.Baumgarte(200.0, 10_000.0)
    h = jaxdae.perturbation_matrix(gains, 1)
    assert jaxdae.spectral_radius(jaxdae.transition_matrix(h, diffrax.Euler(), 0.05)) > 1
    fixed = dict(
        formulation=gains,
        t1=30.0,
        solver=diffrax.Euler(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=0.05,
    )

    def unstable():
        return pytest.warns(
            UserWarning, match="makes the constraint perturbations of Baumgarte unstable"
        )

    with unstable():
        sol = _simulate(**fixed, throw=False)
    assert sol.result == jaxdae.RESULTS.non_finite_state
    assert float(sol.t_final) < 30.0
    with unstable(), pytest.raises(jaxdae.SimulationError, match="became non-finite"):
        _simulate(**fixed)


@pytest.mark.parametrize(
    "make, match",
    [
        # Two gains for three: read as alpha, kd; the message also says the other reading.
        (
            lambda: jaxdae.ModifiedLagrange(10.0, 25.0),
            r"`ModifiedLagrange\(alpha, kd, kp, kv=None\)` needs the gains `alpha`, `kd` and "
            r"`kp`; `kp` is missing\. The 2 positional arguments were read in order as "
            r"alpha=10\.0, kd=25\.0\. If you meant kd=10\.0, kp=25\.0, `alpha` is missing\.",
        ),
        (lambda: jaxdae.ModifiedLagrange(kd=10.0, kp=25.0), r"; `alpha` is missing\. Pass"),
        (
            lambda: jaxdae.Baumgarte(10.0),
            r"`Baumgarte\(kd, kp, kv=None, rcond=None\)` needs "
            r"the gains `kd` and `kp`; `kp` is missing\. The positional argument was read as "
            r"kd=10\.0\.",
        ),
        (lambda: jaxdae.PseudoInverse(), r"`kd` and `kp` are missing"),
        (
            lambda: jaxdae.Baumgarte(kd=10.0, k_p=25.0),
            r"has no argument `k_p`; its arguments "
            r"are `kd`, `kp`, `kv` and `rcond`",
        ),
        (lambda: jaxdae.Baumgarte(10.0, kd=25.0), r"got `kd` both by position and by name"),
        (lambda: jaxdae.PseudoInverse(1.0, 2.0, 3.0, 4.0, 5.0), r"takes at most 4 arguments"),
        (lambda: jaxdae.CoupledPerturbation(k_10=-25.0), r"has no argument `k_10`"),
    ],
)
def test_formulation_arguments_are_named_as_in_the_signature(make, match):
    """A missing, misspelt or doubled gain raises a `TypeError` that quotes the
    constructor's signature and shows a call that works; the class is unchanged."""
    with pytest.raises(TypeError, match=match) as info:
        make()
    assert "Pass the gains by name, e.g. `" in str(info.value)
    assert inspect.signature(jaxdae.ModifiedLagrange).parameters.keys() == {
        "alpha",
        "kd",
        "kp",
        "kv",
    }
    formulation = jaxdae.ModifiedLagrange(alpha=100.0, kd=10.0, kp=25.0)
    assert float(formulation.alpha) == 100.0 and float(formulation.kp) == 25.0


def test_coupled_perturbation_names_the_missing_blocks():
    """The blocks a system needs are checked against its constraints when it is simulated."""
    with pytest.raises(
        ValueError,
        match=r"1 holonomic constraint: pass `k10` and `k11` to "
        r"`CoupledPerturbation`.*e\.g\. `CoupledPerturbation\(k10=-25\.0",
    ):
        _simulate(formulation=jaxdae.CoupledPerturbation())
