"""`jaxdae.Projected`: projection onto the constraint manifold after every step."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import jaxdae
from jaxdae._integration._adjoint import default_adjoint
from jaxdae._integration._projection import project_state
from jaxdae._integration._term import SystemTerm
from jaxdae.examples import CartesianArm, CartesianPendulum, TwoLinkManipulator

from ._jaxprs import not_in_a_loop
from ._systems import TwicePendulum, Unreachable

PENDULUM = CartesianPendulum(mass=1.3, length=0.8)
Q0, V0 = PENDULUM.state_from_angle(1.0, 0.5)
T1 = 5.0
# As many save times as `DENSE_TS` below: the projected solves over both share one program.
TS = jnp.linspace(0.0, T1, 101)
PROJECTED = jaxdae.Projected(diffrax.Tsit5())


def _on_save_times(ts, rtol=1e-8, atol=1e-10):
    """Adaptive steps that end at every save time, so that the saved states are the
    projected step ends. The tolerances are arrays (Python floats would be static): solves
    at other tolerances share one compiled program."""
    return diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=jnp.asarray(rtol), atol=jnp.asarray(atol)), step_ts=ts
    )


def _residual(sol):
    return (
        float(np.max(np.abs(sol.phi))),
        float(np.max(np.abs(sol.dphi))),
        float(np.max(np.abs(sol.psi), initial=0.0)),
    )


def _pendulum(formulation, solver, **kwargs):
    return jaxdae.simulate(
        PENDULUM,
        formulation,
        0.0,
        T1,
        Q0,
        V0,
        ts=TS,
        solver=solver,
        stepsize_controller=_on_save_times(TS),
        **kwargs,
    )


@pytest.mark.parametrize(
    "formulation",
    [pytest.param(jaxdae.Unstabilized(), marks=pytest.mark.slow), jaxdae.Baumgarte(10.0, 25.0)],
    ids=["Unstabilized", "Baumgarte"],
)
def test_stays_on_the_manifold(formulation):
    """|Φ| and |Φ̇| ≤ 1e-12 at every saved step end; without projection the same
    Unstabilized solve drifts."""
    projected = _residual(_pendulum(formulation, PROJECTED))
    assert max(projected) <= 1e-12, projected
    if isinstance(formulation, jaxdae.Unstabilized):
        plain = _residual(_pendulum(formulation, diffrax.Tsit5()))
        assert plain[0] > 1e-9, plain


@pytest.mark.slow
def test_rheonomic_two_link_arm_on_the_manifold():
    """Mukharlyamov and Deressa's (2015) arm: a constraint that moves with time (the tip follows a
    line at 0.6 m/s), before its singular configuration."""
    arm = TwoLinkManipulator()
    q0, v0, *_ = jaxdae.consistent_initial_state(arm, 0.0, *arm.initial_state())
    ts = jnp.linspace(0.0, 0.4, 9)
    sol = jaxdae.simulate(
        arm,
        jaxdae.Unstabilized(),
        0.0,
        0.4,
        q0,
        v0,
        ts=ts,
        solver=PROJECTED,
        stepsize_controller=_on_save_times(ts),
    )
    assert max(_residual(sol)) <= 1e-12


@pytest.mark.slow
def test_hamiltonian_momenta_projected():
    """A state that holds momenta: the velocity correction is applied as an impulse."""
    arm = CartesianArm()
    q0, p0 = arm.initial_state()
    ts = jnp.linspace(0.0, 2.0, 11)
    sol = jaxdae.simulate(
        arm,
        jaxdae.Unstabilized(),
        0.0,
        2.0,
        q0,
        p0,
        ts=ts,
        solver=PROJECTED,
        stepsize_controller=_on_save_times(ts),
    )
    assert max(_residual(sol)) <= 1e-12
    np.testing.assert_allclose(sol.energy, sol.energy[0], rtol=1e-7)


@pytest.mark.slow
def test_redundant_coordinates_positions_projected():
    """Shulgin's equations: positions are projected, the dependent velocities follow."""
    formulation = jaxdae.RedundantCoordinates(dependent=(1,))
    plain = _residual(_pendulum(formulation, diffrax.Tsit5()))
    projected = _residual(_pendulum(formulation, PROJECTED))
    assert max(projected) <= 1e-12 < plain[0]


def test_agrees_with_a_reference():
    """The projected solution at rtol 1e-8 is as close to a tight unprojected reference as
    the unprojected one (the projection moves the state by less than the local error)."""
    formulation = jaxdae.Baumgarte(10.0, 25.0)
    # (steps clipped to the save times as `plain`'s: one compiled solve for both)
    reference = jaxdae.simulate(
        PENDULUM,
        formulation,
        0.0,
        T1,
        Q0,
        V0,
        ts=TS,
        solver=diffrax.Tsit5(),
        stepsize_controller=_on_save_times(TS, 1e-13, 1e-13),
    )
    sol = _pendulum(formulation, PROJECTED)
    plain = _pendulum(formulation, diffrax.Tsit5())
    error = float(np.max(np.abs(sol.q - reference.q)))
    assert error < 1e-6
    assert error < 10 * float(np.max(np.abs(plain.q - reference.q))) + 1e-9


def test_dense_output_ends_on_the_projected_state():
    """Between step ends the saved states interpolate; at a step end they are projected."""
    term = SystemTerm(PENDULUM, jaxdae.Unstabilized())
    args = None
    y0 = (Q0, V0)
    # one program each (eagerly, each operation compiles alone)
    state = eqx.filter_jit(PROJECTED.init)(term, 0.0, 0.1, y0, args)
    y1, _, dense, _, result = eqx.filter_jit(PROJECTED.step)(term, 0.0, 0.1, y0, args, state, False)
    assert result == diffrax.RESULTS.successful
    ends = jax.jit(
        lambda dense: [
            PROJECTED.interpolation_cls(t0=0.0, t1=0.1, **dense).evaluate(t) for t in (0.1, 0.0)
        ]
    )(dense)
    for end, y in zip(ends, (y1, y0), strict=True):
        for a, b in zip(end, y, strict=False):
            np.testing.assert_allclose(a, b, atol=1e-14)


def test_default_adjoint_and_the_sweep_refused():
    """The wrapper is not an explicit Runge–Kutta solver to `default_adjoint` (whose sweep
    would recompute the unprojected steps): it gets `RecursiveCheckpointAdjoint`, and an
    explicit `ReverseSweepAdjoint` is refused."""
    assert isinstance(default_adjoint(PROJECTED, 4096), diffrax.RecursiveCheckpointAdjoint)
    with pytest.raises(ValueError, match="ReverseSweepAdjoint.*Projected"):
        jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            1.0,
            Q0,
            V0,
            solver=PROJECTED,
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )


def _final_angle_loss(length, solver, adjoint=None):
    system = eqx.tree_at(lambda s: s.length, PENDULUM, length)
    q0, v0 = system.state_from_angle(1.0, 0.5)
    sol = jaxdae.simulate(
        system,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        q0,
        v0,
        solver=solver,
        dt0=0.01,
        stepsize_controller=diffrax.ConstantStepSize(),
        adjoint=adjoint,
    )
    return jnp.arctan2(sol.q_final[0], -sol.q_final[1])


@pytest.mark.slow
def test_gradient_matches_central_differences():
    """Reverse mode through the iterations (fixed steps: a smooth function of the
    parameter) against central differences, float64."""
    length = jnp.asarray(0.8)
    grad = jax.grad(_final_angle_loss)(length, PROJECTED)
    h = 1e-6
    fd = (_final_angle_loss(length + h, PROJECTED) - _final_angle_loss(length - h, PROJECTED)) / (
        2 * h
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


@pytest.mark.slow
def test_forward_mode():
    """`adjoint=diffrax.ForwardMode()` with the stages in a plain loop: `jax.jvp` through
    the projected solve agrees with reverse mode."""
    length = jnp.asarray(0.8)
    grad = jax.grad(_final_angle_loss)(length, PROJECTED)
    solver = jaxdae.Projected(diffrax.Tsit5(scan_kind="lax"))
    _, tangent = jax.jvp(
        lambda x: _final_angle_loss(x, solver, diffrax.ForwardMode()), (length,), (jnp.ones(()),)
    )
    np.testing.assert_allclose(tangent, grad, rtol=1e-9)


def test_vmap_and_jit():
    """`jax.vmap` of a jitted solve: each member projected, equal to its own solve (the
    configuration of `test_stays_on_the_manifold`, whose compiled program it reuses)."""
    angles = jnp.array([0.3, 1.0, 2.0])
    formulation = jaxdae.Baumgarte(10.0, 25.0)

    def simulate(angle):
        q0, v0 = PENDULUM.state_from_angle(angle, 0.5)
        return jaxdae.simulate(
            PENDULUM,
            formulation,
            0.0,
            T1,
            q0,
            v0,
            ts=TS,
            solver=PROJECTED,
            stepsize_controller=_on_save_times(TS),
        )

    sols = jax.jit(jax.vmap(simulate))(angles)
    assert max(_residual(sols)) <= 1e-12
    np.testing.assert_allclose(sols.q[2], simulate(angles[2]).q, atol=1e-12)


@pytest.mark.slow
def test_ensemble():
    """`simulate_ensemble`: every trajectory projected (one projection per row)."""
    q0, v0 = jax.vmap(PENDULUM.state_from_angle)(
        jnp.array([0.3, 1.0, 2.0]), jnp.array([0.5, 0.0, -1.0])
    )
    sol = jaxdae.simulate_ensemble(
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        T1,
        q0,
        v0,
        ts=TS,
        solver=PROJECTED,
        stepsize_controller=_on_save_times(TS),
    )
    assert bool(jnp.all(sol.succeeded))
    assert max(_residual(sol)) <= 1e-12


# Many save times: a step that ends a rounding error short of one is extended to it.
# Save times 0.01 apart (not exactly representable) at rtol 1e-9: between them the
# controller repeats equal steps, and their ends drift a few rounding units below the save
# times (to 0.5 − 1 ulp after 50 steps); clipped to the save time, the next step would be
# a rounding error long and stop the solve as stalled.
DENSE_TS = jnp.linspace(0.0, 1.0, 101)


# Tsit5 alone is slow: the controller under test is the same with `Projected`, and the
# ensemble below clips Tsit5's steps.
@pytest.mark.parametrize(
    "solver",
    [pytest.param(diffrax.Tsit5(), marks=pytest.mark.slow), PROJECTED],
    ids=["Tsit5", "Projected"],
)
def test_steps_clipped_to_many_save_times_reach_t1(solver):
    sol = jaxdae.simulate(
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        Q0,
        V0,
        ts=DENSE_TS,
        solver=solver,
        stepsize_controller=_on_save_times(DENSE_TS, 1e-9, 1e-11),
    )
    assert sol.result == jaxdae.RESULTS.successful, jaxdae.RESULTS[sol.result]
    assert float(sol.t_final) == 1.0
    np.testing.assert_array_equal(sol.ts, DENSE_TS)
    assert int(sol.stats["num_accepted_steps"]) >= len(DENSE_TS) - 1  # one per interval
    if solver is PROJECTED:  # every saved state a projected step end
        assert max(_residual(sol)) <= 1e-12


@pytest.mark.slow
def test_ensemble_steps_clipped_to_many_save_times_reach_t1():
    """Two copies of the same trajectory take that trajectory's steps."""
    sol = jaxdae.simulate_ensemble(
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        jnp.stack([Q0, Q0]),
        jnp.stack([V0, V0]),
        ts=DENSE_TS,
        stepsize_controller=_on_save_times(DENSE_TS, 1e-9, 1e-11),
        throw=False,
    )
    assert bool(jnp.all(sol.succeeded))
    np.testing.assert_array_equal(sol.t_final, [1.0, 1.0])


def test_a_step_ending_just_short_of_a_clip_time_is_extended_to_it():
    """`snap_to_clip_times`: a proposed step end a few ulps short of a save time, or of the
    last time before a jump, moves to it; a gap of more than 128 rounding units, or of more
    than half the step, stays."""
    from jaxdae._integration._solve import snap_to_clip_times

    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-8, atol=1e-10), step_ts=DENSE_TS, jump_ts=[0.705]
    )
    floor = jnp.asarray(1e-3)

    def below(t, ulps):  # NumPy (eagerly, each JAX operation compiles alone)
        t = np.float64(t)
        for _ in range(ulps):
            t = np.nextafter(t, -np.inf)
        return t

    snapped = jax.jit(lambda tprev, tnext: snap_to_clip_times(controller, tprev, tnext, floor))

    def snap(tprev, tnext):
        return float(snapped(np.float64(tprev), np.float64(tnext)))

    save = np.asarray(DENSE_TS)[50]
    assert snap(0.49, below(save, 3)) == float(save)
    before_jump = below(0.705, 1)
    assert snap(0.7, below(before_jump, 5)) == float(before_jump)
    assert snap(0.49, below(save, 1000)) == float(below(save, 1000))
    assert snap(0.4999, 0.4999) == 0.4999
    short = below(save, 3)
    assert snap(below(save, 4), short) == float(short)  # the gap exceeds half the step


def test_failure_is_named():
    """Constraints that no configuration meets: the projection cannot converge, and the
    solve says so by name."""
    system = Unreachable()
    q0, v0 = jnp.array([0.5, 0.0]), jnp.array([0.0, 1.0])
    sol = jaxdae.simulate(
        system, jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, q0, v0, solver=PROJECTED, throw=False
    )
    assert sol.result == jaxdae.RESULTS.projection_failed
    with pytest.raises(jaxdae.SimulationError, match="projection"):
        jaxdae.simulate(system, jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, q0, v0, solver=PROJECTED)


@pytest.mark.parametrize(
    "linear_solver", [None, pytest.param(lx.SVD(), marks=pytest.mark.slow)], ids=["default", "SVD"]
)
def test_redundant_constraints_projected(linear_solver):
    """A constraint written twice (J M⁻¹ Jᵀ singular): the default shifted Cholesky solve
    projects it, as an SVD does."""
    system = TwicePendulum(mass=1.3, length=0.8)
    solver = jaxdae.Projected(diffrax.Tsit5(), linear_solver=linear_solver)
    ts = jnp.linspace(0.0, 1.0, 6)
    sol = jaxdae.simulate(
        system,
        jaxdae.PseudoInverse(10.0, 25.0),
        0.0,
        1.0,
        Q0,
        V0,
        ts=ts,
        solver=solver,
        stepsize_controller=_on_save_times(ts, 1e-5, 1e-7),
    )
    assert max(_residual(sol)) <= 1e-12


def test_projects_a_large_drift():
    """From a state off the manifold by 1e-3 in position and velocity, one call reaches
    rounding (the frozen iterations converge at a rate of about the drift); the position
    change is the M-metric normal to the constraint at the start (along q̃ for the
    pendulum)."""
    q = np.asarray(Q0) * (1.0 + 1e-3)  # NumPy (eagerly, each JAX operation compiles alone)
    v = np.asarray(V0) + 1e-3 * np.asarray(Q0)
    tol = 1e-13

    # One program per count of iterations (eagerly, each operation and each of the
    # iterations' conditionals compiles alone), with the constraints at its end.
    @eqx.filter_jit
    def project(system, formulation, t, q, v, linear_solver, iterations, tol):
        out = project_state(system, formulation, t, q, v, linear_solver, iterations, tol)
        return *out, system.constraints(t, out[0][0])

    for iterations in (5, 8):
        (q_new, v_new), position_ok, velocity_ok, phi = project(
            PENDULUM, jaxdae.Baumgarte(1.0, 1.0), 0.0, q, v, None, iterations, tol
        )
        q_new, v_new = np.asarray(q_new), np.asarray(v_new)
        assert bool(position_ok) and bool(velocity_ok)
        assert abs(float(phi[0])) <= 1e-14
        assert abs(float(2 * q_new @ v_new)) <= 1e-13
        assert float(np.abs(q_new[0] * q[1] - q_new[1] * q[0])) <= 1e-15
    # one iteration of each is not enough for a drift this large
    _, position_ok, velocity_ok, _ = project(
        PENDULUM, jaxdae.Baumgarte(1.0, 1.0), 0.0, q, v, None, 1, tol
    )
    assert not (bool(position_ok) and bool(velocity_ok))


@pytest.mark.slow
def test_derivatives_with_a_lineax_solver():
    """With `lineax.SVD()` (its state initialized once per step end, each residual solved by
    `lineax.linear_solve` and differentiated by lineax's rule) the projection's forward and
    reverse derivatives equal those with the default Cholesky solve."""
    q, v = Q0 * (1.0 + 1e-4), V0 + 1e-4 * Q0

    def projected(linear_solver):
        return lambda q_, v_: jnp.concatenate(
            project_state(
                PENDULUM, jaxdae.Baumgarte(1.0, 1.0), 0.0, q_, v_, linear_solver, 5, 1e-13
            )[0]
        )

    default = jax.jit(jax.jacrev(projected(None), argnums=(0, 1)))(q, v)
    for jacobian in (jax.jacrev, jax.jacfwd):
        svd = jax.jit(jacobian(projected(lx.SVD()), argnums=(0, 1)))(q, v)
        for a, b in zip(svd, default, strict=True):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_modified_lagrange_integrated_with_augmented_multipliers():
    """Between projections a `ModifiedLagrange` solve integrates its equation with
    augmented Lagrangian iterations (`for_projection`): each keeps `M q̈ + Gᵀλ = Q` and
    shrinks `G q̈ − s` by about `1/(α J M⁻¹ Jᵀ)`, and the projected solve of a weak
    penalty (`α = 20`) follows the projected `Baumgarte` one (8.9e-3 apart without the
    iterations, 2.2e-4 with one)."""
    from jaxdae._formulations._base import baumgarte_target
    from jaxdae._formulations._modified_lagrange import _accelerations

    penalty = jaxdae.ModifiedLagrange(20.0, 10.0, 25.0)
    terms = PENDULUM.terms(0.0, Q0 * 1.01, V0 + 0.01 * Q0)
    target = baumgarte_target(terms, penalty.kd, penalty.kp, penalty.kv)
    residuals = []
    for iterations in (0, 1, 2):
        acc, multipliers = _accelerations(penalty, terms, iterations)
        balance = terms.mass_matrix @ acc + terms.jacobian.T @ multipliers - terms.forces
        assert float(jnp.max(jnp.abs(balance))) <= 1e-12
        residuals.append(float(jnp.max(jnp.abs(terms.jacobian @ acc - target))))
    rate = 1.0 / (
        1.0
        + 20.0
        * float((terms.jacobian @ jnp.linalg.solve(terms.mass_matrix, terms.jacobian.T))[0, 0])
    )
    assert residuals[1] <= 1.01 * rate * residuals[0]
    assert residuals[2] <= 1.01 * rate * residuals[1]
    assert penalty.for_projection().accelerations(terms)[0] == pytest.approx(
        _accelerations(penalty, terms, 2)[0], abs=0.0
    )

    def projected(formulation):
        return jaxdae.simulate(PENDULUM, formulation, 0.0, T1, Q0, V0, ts=TS, solver=PROJECTED).q

    difference = projected(penalty) - projected(jaxdae.Baumgarte(10.0, 25.0))
    assert float(jnp.max(jnp.abs(difference))) <= 2e-5


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_augmented_iterations_batched_as_in_turn(iterations):
    """The augmented Lagrangian iterations give the same `(q̈, λ)` with the solves for
    `(M + Jᵀ𝔄J)⁻¹ Gᵀ𝔄` batched beside `q̈` (one constraint here, two on the arm) as with
    one solve per iteration in turn."""
    from jaxdae._formulations._modified_lagrange import _accelerations

    arm = TwoLinkManipulator()
    q, v = arm.initial_state()

    # Both systems' terms and accelerations in one program (eagerly, each operation
    # compiles alone).
    @eqx.filter_jit
    def accelerations(q, v):
        out = []
        for terms in (
            PENDULUM.terms(0.0, Q0 * 1.01, V0 + 0.01 * Q0),
            arm.terms(0.1, q + 0.01, v),
        ):
            penalty = jaxdae.ModifiedLagrange(jnp.full(terms.phi.shape, 50.0), 10.0, 25.0)
            out.append(
                (
                    _accelerations(penalty, terms, iterations, batched=True),
                    _accelerations(penalty, terms, iterations, batched=False),
                    _accelerations(penalty, terms, 0),
                )
            )
        return out

    for batched, in_turn, plain in accelerations(q, v):
        for a, b in zip(batched, in_turn, strict=False):
            assert float(jnp.max(jnp.abs(a - b))) <= 1e-12 * (1.0 + float(jnp.max(jnp.abs(b))))
        assert float(jnp.max(jnp.abs(batched[0] - plain[0]))) > 1e-6


class _StructuredPendulum(CartesianPendulum):
    structured_terms = True  # terms from sparsity patterns, in array form


def test_projection_residuals_take_the_form_of_the_terms():
    """`Φ` and `[Φ̇; Ψ]` of the projection keep their array form where the terms are
    structured (a scalar graph in a loop that runs kernel by kernel is many small kernels),
    are scalar graphs where the terms are, and project to the same state."""
    from jaxdae._compilation._scalarize import _in_array_form_scope
    from jaxdae._integration._projection import _constraint_values, _velocity_residual

    structured = _StructuredPendulum(mass=1.3, length=0.8)
    formulation = jaxdae.Baumgarte(1.0, 1.0)
    q, v = Q0 * 1.001, V0 + 1e-4 * Q0
    projected = []
    for system, array_form in ((PENDULUM, False), (structured, True)):
        for piece in (_constraint_values, _velocity_residual):
            jaxpr = jax.make_jaxpr(lambda q_, v_: piece(system, formulation, 0.0, q_, v_))(q, v)  # noqa: B023
            assert _in_array_form_scope(jaxpr.jaxpr) == array_form
        # one program (eagerly, each operation and each conditional compiles alone)
        (q_new, v_new), position_ok, velocity_ok = eqx.filter_jit(project_state)(
            system, formulation, 0.0, q, v, None, 5, 2.2e-13
        )
        assert bool(position_ok) and bool(velocity_ok)
        projected.append(jnp.concatenate([q_new, v_new]))
    assert float(jnp.max(jnp.abs(projected[0] - projected[1]))) <= 1e-14


def test_bad_arguments(unchecked):
    with pytest.raises(ValueError, match="iterations"):
        jaxdae.Projected(diffrax.Tsit5(), iterations=0)
    with pytest.raises(ValueError, match="tol"):
        jaxdae.Projected(diffrax.Tsit5(), tol=-1.0)
    with pytest.raises(ValueError, match="solver"):
        jaxdae.Projected("Tsit5")
    with pytest.raises(ValueError, match="simulate"):
        diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, args: -y), PROJECTED, 0.0, 1.0, 0.1, jnp.ones(2)
        )


@pytest.mark.perf(reason="pins which primitives the projection and its derivative trace")
@pytest.mark.parametrize("system", [PENDULUM, CartesianArm()], ids=["lagrangian", "hamiltonian"])
def test_projection_and_its_vjp_run_in_one_kernel(system):
    """The projection of a step's end and its vector–Jacobian product (what a gradient's
    reverse loop evaluates at every step) hold no scatter, sort or custom call, each of
    which would make XLA:CPU run the whole loop kernel by kernel (a `jnp.diagonal` in the
    shifted Cholesky solve made the Hamiltonian arm's gradient 10× slower)."""
    q, s = (
        system.initial_state()
        if isinstance(system, CartesianArm)
        else (jnp.array([0.6, -0.5]), jnp.array([0.1, 0.2]))
    )

    def projected_and_vjp(q, s):
        out, pull = jax.vjp(
            lambda q, s: project_state(
                system, jaxdae.Baumgarte(10.0, 25.0), 0.0, q, s, None, 5, 1e-13
            )[0],
            q,
            s,
        )
        return out, pull(out)

    assert not not_in_a_loop(jax.make_jaxpr(projected_and_vjp)(q, s).jaxpr)
