"""What `succeeded` promises: a completed solve whose constraint residual ends beyond what its
formulation and tolerances allow is a named failure (`constraint_tol_exceeded`), and a solve
that passes near a singular configuration says where (`jacobian_conditioning`,
`singular_passages`). docs/failures.md states both rules. The default tier keeps one case of
each rule; the slow tier the other kinds of solve (fixed steps, ensembles, actuated)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import TWO_LINK_Q0, TWO_LINK_V0, CartesianPendulum, TwoLinkManipulator

from ._systems import TwicePendulum

PENDULUM = CartesianPendulum()
Q0, V0 = PENDULUM.state_from_angle(0.5, 0.0)
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)
EXCEEDED = jaxdae.RESULTS.constraint_tol_exceeded


def _residual(sol):
    return float(np.max(np.abs(sol.phi[-1])))


class RecedingSupport(jaxdae.LagrangianSystem):
    """A unit mass on a unit circle, its abscissa prescribed as `x = (1 + t) / 2`: from
    `t = 1` on the prescribed point lies outside the circle, and no configuration meets
    both constraints."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return jnp.array([q @ q - 1.0, q[0] - 0.5 * (1.0 + t)])


RECEDING_Q0 = jnp.array([0.5, -np.sqrt(0.75)])
RECEDING_V0 = jnp.array([0.5, 0.5 * 0.5 / np.sqrt(0.75)])


def test_a_target_that_leaves_the_workspace_is_not_a_success():
    pseudo = jaxdae.PseudoInverse(10.0, 25.0)
    sol = jaxdae.simulate(
        RecedingSupport(), pseudo, 0.0, 1.5, RECEDING_Q0, RECEDING_V0, throw=False
    )
    assert sol.result == EXCEEDED and _residual(sol) > 1e-2
    with pytest.raises(jaxdae.SimulationError, match="constraint_tol"):
        jaxdae.simulate(RecedingSupport(), pseudo, 0.0, 1.5, RECEDING_Q0, RECEDING_V0)
    # Before it leaves, the same solve succeeds.
    assert jaxdae.simulate(RecedingSupport(), pseudo, 0.0, 0.9, RECEDING_Q0, RECEDING_V0).succeeded


@pytest.mark.slow
def test_coarse_fixed_steps_are_not_a_success():
    coarse = jaxdae.simulate(
        PENDULUM,
        BAUMGARTE,
        0.0,
        2.0,
        Q0,
        V0,
        solver=diffrax.Euler(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=0.02,
        throw=False,
    )
    assert coarse.result == EXCEEDED and _residual(coarse) > 1e-3
    accepted = jaxdae.simulate(
        PENDULUM,
        BAUMGARTE,
        0.0,
        2.0,
        Q0,
        V0,
        solver=diffrax.Euler(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=0.02,
        constraint_tol=jnp.inf,
    )
    assert accepted.succeeded
    fine = jaxdae.simulate(
        PENDULUM,
        BAUMGARTE,
        0.0,
        2.0,
        Q0,
        V0,
        solver=diffrax.Heun(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=0.01,
    )
    assert fine.succeeded


@pytest.mark.slow
def test_a_forced_minimum_step_that_misses_the_tolerance_is_not_a_success():
    controller = diffrax.PIDController(rtol=1e-10, atol=1e-12, dtmin=0.05, force_dtmin=True)
    sol = jaxdae.simulate(
        PENDULUM,
        BAUMGARTE,
        0.0,
        2.0,
        Q0,
        V0,
        solver=diffrax.Heun(),
        stepsize_controller=controller,
        dt0=0.05,
        throw=False,
    )
    assert sol.result == EXCEEDED


def test_the_threshold_is_the_users_traced_too():
    tight = jaxdae.simulate(
        PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, constraint_tol=1e-15, throw=False
    )
    assert tight.result == EXCEEDED
    assert jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0).succeeded

    @jax.jit
    def result(tol):
        return jaxdae.simulate(
            PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, constraint_tol=tol, throw=False
        ).result._value

    assert result(1e-15) == EXCEEDED._value
    assert result(1e-3) == jaxdae.RESULTS.successful._value
    for bad in (-1.0, 0.0, jnp.nan):
        with pytest.raises(ValueError, match="constraint_tol"):
            jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, constraint_tol=bad)
        # Traced, a bad threshold is invalid input, not a threshold never met.
        assert result(bad) == jaxdae.RESULTS.invalid_input._value
    # One threshold per member of a batch.
    batch = jax.vmap(
        lambda tol: (
            jaxdae.simulate(
                PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, constraint_tol=tol, throw=False
            ).result._value
        )
    )(jnp.array([1e-15, 1e-3, -1.0]))
    assert batch.tolist() == [
        EXCEEDED._value,
        jaxdae.RESULTS.successful._value,
        jaxdae.RESULTS.invalid_input._value,
    ]
    with pytest.raises(Exception, match="constraint_tol"):
        jax.block_until_ready(
            jax.jit(
                lambda tol: (
                    jaxdae.simulate(
                        PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, constraint_tol=tol
                    ).q_final
                )
            )(-1.0)
        )
    # A threshold below the state's precision is named as such.
    with pytest.raises(ValueError, match="zero in float32"):
        jaxdae.simulate(
            PENDULUM,
            BAUMGARTE,
            0.0,
            1.0,
            Q0.astype(jnp.float32),
            V0.astype(jnp.float32),
            constraint_tol=1e-50,
        )


def test_a_penalty_is_allowed_its_equilibrium_violation():
    # `Φ ≈ |Q| / (α K_P)` at the penalty's equilibrium: about 4e-3 here, far above the
    # tolerances, and what the formulation promises.
    penalty = jaxdae.ModifiedLagrange(100.0, 10.0, 25.0)
    sol = jaxdae.simulate(PENDULUM, penalty, 0.0, 1.0, Q0, V0)
    assert sol.succeeded and _residual(sol) > 1e-4
    strict = jaxdae.simulate(PENDULUM, penalty, 0.0, 1.0, Q0, V0, constraint_tol=1e-6, throw=False)
    assert strict.result == EXCEEDED


def test_a_penalty_is_not_allowed_an_unreachable_target():
    # The arm's target leaves the workspace at 2.85 s: the penalty ends stretched towards it,
    # 0.355 off, at a conditioning of 0.007, which no small correction removes.
    sol = jaxdae.simulate(
        TwoLinkManipulator(),
        jaxdae.ModifiedLagrange(100.0, 10.0, 25.0),
        0.0,
        3.5,
        TWO_LINK_Q0,
        TWO_LINK_V0,
        throw=False,
    )
    assert sol.result == EXCEEDED
    assert _residual(sol) > 0.3 and float(sol.jacobian_conditioning[-1]) < 0.1


@pytest.mark.slow
def test_unstabilized_drift_and_an_inconsistent_start_are_no_failure():
    # Nothing pulls an unstabilized solve back: its drift is no failure, however large.
    drift = jaxdae.simulate(
        PENDULUM,
        jaxdae.Unstabilized(),
        0.0,
        3.0,
        Q0,
        V0,
        solver=diffrax.Euler(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=0.02,
    )
    assert drift.succeeded and _residual(drift) > 1e-2
    # Started 0.1 off its constraint, a short solve has not yet pulled it back.
    start = jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.05, Q0 * 1.05, V0)
    assert start.succeeded and _residual(start) > 1e-3


@pytest.mark.slow
def test_each_trajectory_of_an_ensemble_has_its_own_result():
    q0 = jnp.stack([Q0, Q0])
    v0 = jnp.stack([V0, V0])
    sols = jaxdae.simulate_ensemble(
        PENDULUM, BAUMGARTE, 0.0, 1.0, q0, v0, constraint_tol=jnp.array(1e-15), throw=False
    )
    assert np.all(np.asarray(sols.result._value) == EXCEEDED._value)


@pytest.mark.slow
def test_a_passage_through_a_singular_configuration_is_reported():
    # The arm folds at t ≈ 0.493 s (`J M⁻¹ Jᵀ` singular); the pseudo-inverse runs through.
    ts = jnp.linspace(0.0, 0.8, 81)
    sol = jaxdae.simulate(
        TwoLinkManipulator(),
        jaxdae.PseudoInverse(10.0, 25.0),
        0.0,
        0.8,
        TWO_LINK_Q0,
        TWO_LINK_V0,
        ts=ts,
    )
    assert sol.jacobian_conditioning.shape == ts.shape
    np.testing.assert_allclose(sol.singular_passages(), [0.49])
    assert sol.singular_passages(threshold=1e-4).size == 0


def test_redundant_constraints_are_not_a_singular_passage():
    ts = jnp.linspace(0.0, 1.0, 5)
    twice = TwicePendulum()
    sol = jaxdae.simulate(twice, jaxdae.PseudoInverse(10.0, 25.0), 0.0, 1.0, Q0, V0, ts=ts)
    np.testing.assert_allclose(sol.jacobian_conditioning, 1.0)
    assert sol.singular_passages().size == 0
    plain = jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0)
    np.testing.assert_allclose(plain.jacobian_conditioning, 1.0)


class Falling(jaxdae.LagrangianSystem):
    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * q[1]


def test_a_system_without_constraints_is_never_singular():
    sol = jaxdae.simulate(Falling(), BAUMGARTE, 0.0, 1.0, Q0, V0, ts=jnp.linspace(0, 1, 3))
    np.testing.assert_allclose(sol.jacobian_conditioning, 1.0)
    assert sol.succeeded and sol.singular_passages().size == 0


class VanishingGradient(jaxdae.LagrangianSystem):
    """`q₀² = (1 − t)²`: the constraint's gradient `2 q₀` vanishes at `t = 1`, where the
    branches `q₀ = ±(1 − t)` cross."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 - (1.0 - t) ** 2])


@pytest.mark.usefixtures("unchecked")
def test_a_gradient_that_vanishes_between_steps_is_reported():
    # Baumgarte's in-loop test sees the pivots at the ends of the steps only, which pass on
    # either side of t = 1; the saved times report the passage.
    sol = jaxdae.simulate(
        VanishingGradient(),
        BAUMGARTE,
        0.0,
        2.0,
        jnp.array([1.0, 0.0]),
        jnp.array([-1.0, 0.0]),
        ts=jnp.linspace(0.0, 2.0, 21),
    )
    np.testing.assert_allclose(sol.singular_passages(), [1.0])
    assert float(sol.jacobian_conditioning[0]) == 1.0
    for bad in (float("nan"), 0.0, -1.0, 2.0, "0.1"):
        with pytest.raises(ValueError, match="threshold"):
            sol.singular_passages(threshold=bad)


@pytest.mark.slow
def test_an_actuated_solve_checks_its_program_constraints():
    from jaxdae.examples import AdaptiveOpticsElement

    optics = AdaptiveOpticsElement()
    control = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)
    q0, v0, w0 = optics.programmed_state(0.0)  # on the programmed motion
    sol = jaxdae.simulate_actuated(
        optics, control, 0.0, 1.0, q0, v0, w0, constraint_tol=1e-15, throw=False
    )
    assert sol.result == EXCEEDED
    assert jaxdae.simulate_actuated(optics, control, 0.0, 1.0, q0, v0, w0).succeeded


def test_a_spectrum_not_computed_is_no_passage():
    from jaxdae._integration._diagnostics import conditioning

    # Beyond `CONDITIONING_MAX` constraints the spectrum is `nan`: so is the conditioning.
    assert np.all(np.isnan(conditioning(jnp.full((3, 50), jnp.nan))))
    np.testing.assert_allclose(conditioning(jnp.array([[1.0, 4.0], [0.0, 4.0]])), [0.5, 0.0])


def test_adjoints_that_cannot_differentiate_the_solve_are_named():
    with pytest.raises(ValueError, match="ImplicitAdjoint.*steady states"):
        jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.5, Q0, V0, adjoint=diffrax.ImplicitAdjoint())
    with pytest.raises(ValueError, match="BacksolveAdjoint.*Baumgarte's test"):
        jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.5, Q0, V0, adjoint=diffrax.BacksolveAdjoint())


@pytest.mark.slow
def test_a_projected_implicit_solver_stops_its_iterations_on_the_tolerances():
    # The wrapped implicit solver's root finder takes the controller's tolerances too.
    sol = jaxdae.simulate(
        PENDULUM, BAUMGARTE, 0.0, 0.5, Q0, V0, solver=jaxdae.Projected(diffrax.Kvaerno5())
    )
    reference = jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.5, Q0, V0)
    np.testing.assert_allclose(sol.q_final, reference.q_final, atol=1e-7)


class _ManyFixedCoordinates(jaxdae.LagrangianSystem):
    """49 coordinates held at zero and one free: more constraints than the conditioning is
    computed for."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return q[:49]


def test_singular_passages_says_what_it_cannot_read():
    many = jaxdae.simulate(
        _ManyFixedCoordinates(),
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        0.1,
        jnp.zeros(50),
        jnp.zeros(50).at[49].set(1.0),
    )
    with pytest.raises(ValueError, match="more than 48 rows"):
        many.singular_passages()
    ts = jnp.linspace(0.0, 1.0, 5)

    def solve(angle):
        q0, v0 = PENDULUM.state_from_angle(angle, 0.0)
        return jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, q0, v0, ts=ts)

    # A nested batch: one list per level.
    nested = jax.vmap(jax.vmap(solve))(jnp.full((2, 3), 0.5))
    passages = nested.singular_passages()
    assert len(passages) == 2 and all(len(row) == 3 for row in passages)
    # A traced solution (here a computed one passed in: no solve traced anew).
    with pytest.raises(ValueError, match="concrete solution"):
        jax.jit(lambda sol: sol.singular_passages())(nested)
