"""One-sided constraints: the complementarity solver, the event-driven solve against closed
forms, its gradients, batches and errors (`jaxdae/_integration/_events.py`)."""

import functools
import re

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._compilation._lcp import solve_lcp
from jaxdae.examples import BouncingBall, PendulumWithStop

from ._jaxprs import equations
from ._systems import solver_named

TIGHT = {"rtol": 1e-11, "atol": 1e-13}


# One program a call (eagerly, each operation compiles alone), made once for the file so
# that problems of the same size in different tests share their compiled program.
_solve_lcp = jax.jit(solve_lcp)


def test_lcp_matches_scipy_nnls():
    """For positive definite `A` the LCP is `min ½ xᵀAx + bᵀx, x ≥ 0`, which with
    `A = L Lᵀ` is the non-negative least-squares problem `min |Lᵀx + L⁻¹b|`."""
    scipy_optimize = pytest.importorskip("scipy.optimize", reason="scipy checks the LCP")
    import scipy.linalg

    rng = np.random.default_rng(0)
    solve = _solve_lcp
    for _ in range(60):
        size = int(rng.integers(1, 8))
        a = rng.standard_normal((size, size))
        matrix = a @ a.T + 0.05 * np.eye(size)
        vector = rng.standard_normal(size)
        low = np.linalg.cholesky(matrix)
        expected, _ = scipy_optimize.nnls(
            low.T, -scipy.linalg.solve_triangular(low, vector, lower=True)
        )
        solution = solve(jnp.asarray(matrix), jnp.asarray(vector))
        assert bool(solution.solved)
        np.testing.assert_allclose(solution.x, expected, rtol=1e-10, atol=1e-11)
        assert np.all(np.asarray(solution.w) > -1e-12)


def test_lcp_candidates_and_derivative():
    matrix = jnp.array([[2.0, 1.0], [1.0, 2.0]])
    vector = jnp.array([-1.0, -1.0])
    solve = _solve_lcp
    both = solve(matrix, vector)
    np.testing.assert_allclose(both.x, [1 / 3, 1 / 3], rtol=1e-14)
    first = solve(matrix, vector, jnp.array([True, False]))
    np.testing.assert_allclose(first.x, [0.5, 0.0], rtol=1e-14)
    # on the set {0}: x₀ = −b₀ / 2; the other component stays at zero
    jac = jax.jit(jax.jacfwd(lambda b: solve_lcp(matrix, b, jnp.array([True, False])).x))(vector)
    np.testing.assert_allclose(jac, [[-0.5, 0.0], [0.0, 0.0]], atol=1e-14)


def test_lcp_solves_once_and_differentiates_as_its_final_set():
    """A program that does not differentiate the LCP holds one solve (the pivoting's),
    and the derivative is that of the linear solve for the final set, in forward and
    reverse mode alike and as central differences give it, under `vmap` too."""
    matrix = jnp.array([[2.0, 1.0, 0.2], [1.0, 3.0, 0.5], [0.2, 0.5, 1.5]])
    vector = jnp.array([-1.0, 0.4, -0.8])  # the set {0, 2}

    def x(matrix, vector):
        return solve_lcp(matrix, vector).x

    program = jax.make_jaxpr(x)(matrix, vector).jaxpr
    assert sum(eqn.params.get("name") == "masked_solve" for eqn in equations(program)) == 1
    solution = _solve_lcp(matrix, vector)
    np.testing.assert_array_equal(np.asarray(solution.x) > 0, [True, False, True])
    forward = jax.jit(jax.jacfwd(x, argnums=(0, 1)))(matrix, vector)
    reverse = jax.jit(jax.jacrev(x, argnums=(0, 1)))(matrix, vector)
    for f, r in zip(forward, reverse, strict=True):
        np.testing.assert_allclose(f, r, rtol=1e-13, atol=1e-15)
    # The set {0, 2}: x = −A[S, S]⁻¹ b[S] there, zero elsewhere.
    kept = np.ix_([0, 2], [0, 2])
    expected = np.zeros((3, 3))
    expected[kept] = -np.linalg.inv(np.asarray(matrix)[kept])
    np.testing.assert_allclose(forward[1], expected, rtol=1e-13, atol=1e-15)
    h = 1e-6
    central = np.stack(
        [(x(matrix, vector + h * e) - x(matrix, vector - h * e)) / (2 * h) for e in jnp.eye(3)], 1
    )
    np.testing.assert_allclose(forward[1], central, rtol=1e-7, atol=1e-9)
    # Members on different sets: the batch's derivatives are each member's.
    vectors = jnp.stack([vector, jnp.array([-1.0, -1.0, -1.0]), jnp.array([0.5, 0.5, -1.0])])
    batched = jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(x(matrix, v) ** 2))))(vectors)
    one_by_one = [jax.grad(lambda v: jnp.sum(x(matrix, v) ** 2))(v) for v in vectors]
    np.testing.assert_allclose(batched, np.stack(one_by_one), rtol=1e-13, atol=1e-15)


@pytest.mark.perf(reason="pins the size of the complementarity solve's program (compile time)")
def test_lcp_program_does_not_grow_with_the_number_of_contacts():
    """The pivoting's solves are one loop over the columns, not an elimination unrolled
    per column: the program of 12 contacts is that of 2."""

    def operations(size):
        lowered = _solve_lcp.lower(jnp.eye(size), jnp.ones(size))
        return sum("stablehlo." in line for line in lowered.as_text().splitlines())

    assert operations(12) == operations(2)


def test_down_crossing_matches_optimistix_newton():
    """The events' bisection finds the root `optimistix.Newton` finds, to its tolerance,
    with the crossing's upper end (the condition at or below zero) as the root."""
    import optimistix as optx

    from jaxdae._integration._crossing import DownCrossing

    def condition(t, args):
        return jnp.cos(t) - 0.5

    options = {"lower": jnp.asarray(0.0), "upper": jnp.asarray(2.0)}
    ours = optx.root_find(condition, DownCrossing(1e-14, 1e-14), jnp.asarray(2.0), options=options)
    newton = optx.root_find(condition, optx.Newton(1e-14, 1e-14), jnp.asarray(1.0))
    np.testing.assert_allclose(ours.value, newton.value, rtol=0, atol=1e-13)
    assert float(condition(ours.value, None)) <= 0.0
    # the derivative of the root, by the implicit function theorem, as Newton's
    shift = jax.grad(
        lambda c: (
            optx.root_find(
                lambda t, a: jnp.cos(t) - c,
                DownCrossing(1e-14, 1e-14),
                jnp.asarray(2.0),
                options=options,
            ).value
        )
    )(0.5)
    np.testing.assert_allclose(shift, -1 / jnp.sin(jnp.pi / 3), rtol=1e-10)


# At most this many events per drop: the three drops below meet up to 13, the budget test's
# more. One static configuration for all, so that they share one compiled solve.
_BALL_EVENTS = jaxdae.EventDriven(max_events=16)


def _drop(e, height, t1, v0=0.0, throw=True):
    """A `BouncingBall` with the coefficient `e` dropped from `height`, saved at 51 times."""
    return jaxdae.simulate(
        BouncingBall(e=e),
        jaxdae.Unstabilized(),
        0.0,
        t1,
        jnp.array([0.0, height]),
        jnp.array([v0, 0.0]),
        ts=jnp.linspace(0.0, t1, 51),
        events=_BALL_EVENTS,
        throw=throw,
        **TIGHT,
    )


_RESTITUTION = (0.5, 0.8, 0.9)
_TS = np.linspace(0.0, 2.5, 51)


@pytest.fixture(scope="module")
def ball_runs():
    """The drops for each coefficient, stacked as a batch (`jax.vmap` of event-driven solves
    is tested on the sliding blocks, tests/test_friction.py). Without `throw`, as the budget
    test's drop: `throw` is part of the compiled solve, so all drops share one program; the
    closed-form test checks that each succeeded."""
    return jax.tree.map(
        lambda *rows: jnp.stack(rows),
        *(_drop(e, 1.0, 2.5, v0=0.3, throw=False) for e in _RESTITUTION),
    )


def test_bouncing_ball_matches_closed_form(ball_runs):
    """Impact times to 1e-10, impulses and saved heights to 1e-8, against the closed form,
    for drops that meet different numbers of impacts."""
    restitution, ts, sols = jnp.array(_RESTITUTION), _TS, ball_runs
    assert np.all(np.asarray(sols.result._value) == jaxdae.RESULTS.successful._value)
    counts = np.asarray(sols.events.count)
    assert len(set(counts.tolist())) == 3  # each member its own events
    for row, e in enumerate(np.asarray(restitution)):
        ball = BouncingBall(e=e)
        count = int(counts[row])
        times = np.asarray(sols.events.t[row, :count])
        kinds = np.asarray(sols.events.kind[row, :count])
        bounces = int(np.sum(kinds == jaxdae.Events.IMPACT))
        np.testing.assert_allclose(
            times[:bounces], ball.impact_times(1.0, bounces), rtol=0, atol=1e-10
        )
        np.testing.assert_allclose(
            sols.events.impulse[row, :bounces],
            (1 + e) * ball.impact_speeds(1.0, bounces),
            rtol=1e-8,
        )
        # the height between impacts: a parabola from each impact
        g = 9.81
        starts = np.concatenate([[0.0], times[:bounces]])
        speeds = np.concatenate([[0.0], e * ball.impact_speeds(1.0, bounces)])
        heights = np.concatenate([[1.0], np.zeros(bounces)])
        t = np.asarray(ts)
        k = np.searchsorted(starts, t, side="right") - 1
        flight = t - starts[k]
        expected = heights[k] + speeds[k] * flight - 0.5 * g * flight**2
        settled = t > times[-1] if kinds[-1] == jaxdae.Events.CONTACT else np.zeros_like(t, bool)
        expected = np.where(settled, 0.0, expected)
        np.testing.assert_allclose(sols.q[row, :, 1], expected, rtol=0, atol=1e-8)
        np.testing.assert_allclose(sols.q[row, :, 0], 0.3 * t, rtol=1e-12)


def test_ball_comes_to_rest_on_the_floor(ball_runs):
    """The impacts accumulate at `t₁ (1 + e)/(1 − e)`; the slow ones end in resting contact
    (`min_bounce_speed`), and the ball then stays on the floor."""
    sols = ball_runs  # row 0: e = 0.5
    count = int(sols.events.count[0])
    assert int(sols.events.kind[0, count - 1]) == jaxdae.Events.CONTACT
    accumulation = np.sqrt(2 / 9.81) * 1.5 / 0.5
    last = float(sols.events.t[0, count - 1])
    assert last < accumulation and accumulation - last < 1e-3
    assert abs(float(sols.q_final[0, 1])) < 1e-8 and abs(float(sols.v_final[0, 1])) < 1e-8


def test_the_gaps_condition_after_each_step_comes_with_the_last_stage():
    """With a first-same-as-last solver whose loop diffrax differentiates (the default with
    100,000 steps allowed), the gaps' condition after each step comes with the rates of the
    step's last stage (`StopAtCrossing`), and the crossing is located on that step's
    interpolation; with at most 4,096 steps each stretch is replayed
    (`jaxdae.ReplayAdjoint`) and the condition is a `diffrax.Event`'s, evaluated after each
    step. Both meet the same impacts and the same resting contact, at the same times and
    states to rounding."""

    def drop(max_steps):
        return jaxdae.simulate(
            BouncingBall(e=0.5),
            jaxdae.Unstabilized(),
            0.0,
            2.5,
            jnp.array([0.0, 1.0]),
            jnp.array([0.3, 0.0]),
            ts=jnp.linspace(0.0, 2.5, 51),
            events=_BALL_EVENTS,
            max_steps=max_steps,
            **TIGHT,
        )

    # (The premise: the condition is evaluated on its own one place less.)
    def evaluations(max_steps):
        jaxpr = jax.make_jaxpr(lambda: drop(max_steps).q_final)().jaxpr
        return sum(
            1
            for eqn in equations(jaxpr)
            if eqn.primitive.name in ("jit", "pjit") and eqn.params["name"] == "condition_values"
        )

    assert evaluations(100_000) == evaluations(4096) - 1
    read, evaluated = drop(100_000), drop(4096)
    count = int(read.events.count)
    assert count > 3 and count == int(evaluated.events.count)
    assert int(read.events.kind[count - 1]) == jaxdae.Events.CONTACT
    np.testing.assert_array_equal(read.events.kind, evaluated.events.kind)
    np.testing.assert_allclose(read.events.t[:count], evaluated.events.t[:count], atol=1e-12)
    np.testing.assert_allclose(read.q, evaluated.q, rtol=0, atol=1e-11)
    np.testing.assert_allclose(read.v, evaluated.v, rtol=0, atol=1e-10)


@eqx.filter_jit
def _pendulum_runs(restitution, formulation):
    def run(e):
        pendulum = PendulumWithStop(e=e)
        return jaxdae.simulate(
            pendulum,
            formulation,
            0.0,
            2.5,
            *pendulum.initial_state(0.8),
            ts=jnp.linspace(0.0, 2.5, 11),
            **TIGHT,
        )

    return jax.vmap(run)(restitution)


@pytest.mark.slow  # the default run has the same closed form on a joint limit
def test_pendulum_against_a_stop():
    """Impact times against the elliptic-integral closed form (to 1e-10) for several
    coefficients of restitution; the rod constraint holds through the impacts."""
    restitution = jnp.array([0.25, 0.5, 1.0])
    sols = _pendulum_runs(restitution, jaxdae.Baumgarte(20.0, 100.0))
    for row, e in enumerate(np.asarray(restitution)):
        pendulum = PendulumWithStop(e=e)
        count = int(sols.events.count[row])
        assert count >= 2
        np.testing.assert_allclose(
            sols.events.t[row, :count], pendulum.impact_times(0.8, count), rtol=0, atol=1e-10
        )
        # the speed at the bottom before each impact: from the amplitudes
        amplitudes = pendulum.amplitudes(0.8, count)
        speeds = np.sqrt(2 * 9.81 * (1 - np.cos(amplitudes)))
        np.testing.assert_allclose(sols.events.impulse[row, :count], (1 + e) * speeds, rtol=1e-8)
        assert float(jnp.max(jnp.abs(sols.phi[row]))) < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("name", ["projected", "kvaerno5", "generalized_alpha"])
def test_other_solvers_between_events(name):
    """`Projected`, an implicit Runge–Kutta method and generalized-α between the events."""
    solver = {
        "projected": jaxdae.Projected(diffrax.Tsit5()),
        "kvaerno5": diffrax.Kvaerno5(),
        "generalized_alpha": jaxdae.GeneralizedAlpha(),
    }[name]
    pendulum = PendulumWithStop(e=0.5)
    sol = jaxdae.simulate(
        pendulum,
        jaxdae.Baumgarte(20.0, 100.0),
        0.0,
        1.6,
        *pendulum.initial_state(0.8),
        solver=solver,
        rtol=1e-9,
        atol=1e-11,
    )
    count = int(sol.events.count)
    assert count == 2 and sol.succeeded
    # (generalized-α is of second order: at this tolerance its steps, and the crossing
    # found on their interpolation, are good to a few microseconds)
    atol = 1e-5 if name == "generalized_alpha" else 1e-6
    np.testing.assert_allclose(
        sol.events.t[:count], pendulum.impact_times(0.8, count), rtol=0, atol=atol
    )


@pytest.mark.slow
def test_float32_events():
    """A float32 solve (as on a GPU) locates its impacts to float32 accuracy."""
    ball = BouncingBall(e=0.8)
    sol = jaxdae.simulate(
        ball,
        jaxdae.Unstabilized(),
        0.0,
        2.0,
        jnp.array([0.0, 1.0], jnp.float32),
        jnp.zeros(2, jnp.float32),
        rtol=1e-5,
        atol=1e-6,
    )
    assert sol.q.dtype == jnp.float32 and sol.events.t.dtype == jnp.float32
    np.testing.assert_allclose(sol.events.t[:3], ball.impact_times(1.0, 3), rtol=1e-4)


@pytest.mark.slow
def test_release_of_a_resting_contact():
    """A ball resting on the floor under an upward force `2 m g t` lifts off at
    `t = 0.5` (its contact force `m g (1 − 2t)` reaches zero) and then flies."""

    class Lifted(BouncingBall):
        def generalized_forces(self, t, q, v):
            return jnp.stack([0.0 * t, 2 * self.mass * self.gravity * t])

    ball = Lifted(e=0.0)
    sol = jaxdae.simulate(
        ball, jaxdae.Unstabilized(), 0.0, 1.0, jnp.zeros(2), jnp.zeros(2), **TIGHT
    )
    assert int(sol.events.count) == 1
    assert int(sol.events.kind[0]) == jaxdae.Events.RELEASE
    np.testing.assert_allclose(sol.events.t[0], 0.5, atol=1e-10)
    # then ÿ = g (2t − 1) from rest: y = g (t − ½)³ / 3, y(1) = g / 24
    np.testing.assert_allclose(sol.q_final[1], 9.81 / 24, rtol=1e-9)


def _impact_loss(e, height, adjoint=None, steps=TIGHT):
    """The third impact time plus the final height of a dropped `BouncingBall`."""
    ball = BouncingBall(e=e)
    sol = jaxdae.simulate(
        ball,
        jaxdae.Unstabilized(),
        0.0,
        2.0,
        jnp.array([0.0, height]),
        jnp.zeros(2),
        adjoint=adjoint,
        **steps,
    )
    return sol.events.t[2] + sol.q_final[1]


def _central_differences(step=1e-6, steps=TIGHT):
    loss = functools.partial(_impact_loss, steps=steps)
    return [
        (loss(0.8 + step, 1.0) - loss(0.8 - step, 1.0)) / (2 * step),
        (loss(0.8, 1.0 + step) - loss(0.8, 1.0 - step)) / (2 * step),
    ]


_FIXED_STEPS = {"dt0": 1e-3, "stepsize_controller": diffrax.ConstantStepSize()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_derivatives_through_events_with_fixed_steps(mode):
    """With fixed steps each stretch starts at its event's time itself (no restart), and
    the gaps' condition still comes with the last stage: forward mode (the stages in the
    plain loop that `diffrax.ForwardMode` differentiates, inside the stepping wrapper) and
    reverse mode match central differences."""
    params = jnp.array([0.8, 1.0])
    if mode == "forward":
        adjoint = diffrax.ForwardMode()
        derivative = jax.jacfwd(lambda p: _impact_loss(p[0], p[1], adjoint, _FIXED_STEPS))
    else:
        derivative = jax.grad(lambda p: _impact_loss(p[0], p[1], steps=_FIXED_STEPS))
    np.testing.assert_allclose(
        jax.jit(derivative)(params), _central_differences(steps=_FIXED_STEPS), rtol=1e-5
    )


@pytest.mark.slow
def test_forward_mode_derivatives_through_events():
    """The derivatives of an impact time and of the final height with respect to the
    coefficient of restitution and the drop height, in forward mode, against central
    differences."""
    jac = jax.jit(jax.jacfwd(lambda p: _impact_loss(p[0], p[1], diffrax.ForwardMode())))(
        jnp.array([0.8, 1.0])
    )
    np.testing.assert_allclose(jac, _central_differences(), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "adjoint",
    [None, jaxdae.ReplayAdjoint(stored_steps=16)],
    ids=["checkpointed", "replayed"],
)
def test_gradients_through_events_match_central_differences(adjoint):
    """The same in reverse mode (`jax.grad`): through diffrax's checkpointed loop (the
    default with 100,000 steps allowed) and with each stretch between events replayed
    (several segments of steps)."""
    loss = functools.partial(_impact_loss, adjoint=adjoint)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))(0.8, 1.0)
    np.testing.assert_allclose(grad, _central_differences(), rtol=1e-5)


def test_event_budget_ends_with_a_named_result():
    ball = BouncingBall(e=0.9)
    sol = _drop(0.9, 1.0, 10.0, throw=False)  # the 17th impact comes at t = 7.07
    assert sol.result == jaxdae.RESULTS.event_budget_exceeded
    assert int(sol.events.count) == _BALL_EVENTS.max_events
    np.testing.assert_allclose(sol.t_final, ball.impact_times(1.0, 17)[-1], atol=1e-8)
    assert "max_events" in str(sol.result)  # the message names the remedy


def test_bad_input_is_refused_before_the_solve():
    start = (jnp.array([0.0, 1.0]), jnp.zeros(2))
    with pytest.raises(ValueError, match=r"restitution must lie in \[0, 1\]"):
        jaxdae.simulate(BouncingBall(e=1.5), jaxdae.Unstabilized(), 0.0, 1.0, *start)
    with pytest.raises(ValueError, match="violates gap 0"):
        jaxdae.simulate(
            BouncingBall(), jaxdae.Unstabilized(), 0.0, 1.0, jnp.array([0.0, -0.1]), jnp.zeros(2)
        )
    with pytest.raises(ValueError, match="jax.vmap"):
        jaxdae.simulate_ensemble(
            BouncingBall(), jaxdae.Unstabilized(), 0.0, 1.0, start[0][None], start[1][None]
        )
    with pytest.raises(ValueError, match="ReverseSweepAdjoint"):
        jaxdae.simulate(
            BouncingBall(),
            jaxdae.Unstabilized(),
            0.0,
            1.0,
            *start,
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )
    with pytest.raises(ValueError, match="max_events"):
        jaxdae.EventDriven(max_events=0)
    with pytest.raises(ValueError, match="contact_gains"):
        jaxdae.EventDriven(contact_gains=(1.0, -1.0))
    for speed in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="`min_bounce_speed` must be a finite non-negative"):
            jaxdae.EventDriven(min_bounce_speed=speed)
    with pytest.raises(ValueError, match="`events` must be"):
        jaxdae.simulate(BouncingBall(), jaxdae.Unstabilized(), 0.0, 1.0, *start, events=3)


class _FallingPoint(jaxdae.LagrangianSystem):
    """The bouncing ball without its floor."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * q[1]


def _copies_of_the_equations_of_motion(system, names) -> int:
    """How many times the program of a traced `simulate` of `system` holds its equations of
    motion as the jitted functions `names` (each call inlined by XLA)."""
    from ._jaxprs import equations

    def final(q0):
        return jaxdae.simulate(system, jaxdae.Unstabilized(), 0.0, 1.0, q0, jnp.zeros(2)).q_final

    jaxpr = jax.make_jaxpr(final)(jnp.array([0.0, 1.0])).jaxpr
    return sum(
        1
        for eqn in equations(jaxpr)
        if eqn.primitive.name in ("jit", "pjit") and eqn.params["name"] in names
    )


_IN_THE_STEPS = ("system_terms", "state_rates", "_rates_and_terms")


@pytest.mark.perf(
    reason="pins how often an event-driven solve's program holds the equations "
    "of motion (compile time)"
)
def test_event_program_holds_the_equations_of_motion_a_bounded_number_of_times():
    """In the steps' stages once: the rates (with resting contacts, the plain rates' terms;
    their last stage gives the gaps' condition after each step). Outside them, as a scalar
    graph only for small terms: the diagnostics; with gaps also the gaps' condition with
    resting contacts in the root finder, and the transition before and after its impact.
    XLA compiles each copy."""
    for system, outside in ((_FallingPoint(), 1), (BouncingBall(), 4)):
        assert _copies_of_the_equations_of_motion(system, _IN_THE_STEPS) == 1
        assert _copies_of_the_equations_of_motion(system, ("terms_outside_steps",)) == outside


class _LineAboveFloor(jaxdae.LagrangianSystem):
    """A point held on the line `x = 1`, written as `x² − 1 = 0` (whose gradient vanishes at
    `x = 0`), above a floor it does not reach: an event-driven solve of a constrained
    system."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * q[1]

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 - 1.0])

    def gaps(self, t, q):
        return q[1:] + 10.0


def _line_above_floor(q0, **kwargs):
    # Baumgarte's underdamped gains make `Φ` overshoot from `x0 = 2` to `x = 0`, where
    # `J M⁻¹ Jᵀ = 4x²` vanishes.
    return jaxdae.simulate(
        _LineAboveFloor(), jaxdae.Baumgarte(1.0, 25.0), 0.0, 2.0, q0, jnp.zeros_like(q0), **kwargs
    )


@pytest.mark.parametrize("dtype", [jnp.float64, pytest.param(jnp.float32, marks=pytest.mark.slow)])
def test_an_event_driven_solve_stops_where_its_formulation_fails(dtype):
    """The formulation's failure test stops an event-driven solve as it stops a plain one,
    and names it: at the end of the step where it turns true (in float32 under float64
    mode, where it is a located condition, at its crossing)."""
    q0 = jnp.array([2.0, 1.0], dtype)
    tolerances = {} if dtype == jnp.float64 else {"rtol": 1e-5, "atol": 1e-6}
    sol = _line_above_floor(q0, throw=False, **tolerances)
    assert sol.q_final.dtype == dtype
    assert sol.result == jaxdae.RESULTS.singular_constraint_matrix
    assert int(sol.stats["num_steps"]) < 1000 and int(sol.events.count) == 0
    assert abs(float(sol.q_final[0])) < (1e-3 if dtype == jnp.float64 else 0.1)
    with pytest.raises(jaxdae.SimulationError, match=r"singular[\s\S]*t = 0\.42"):
        _line_above_floor(q0, **tolerances)


@pytest.mark.perf(reason="pins what the compiled root finder of an event-driven solve holds")
def test_the_root_finder_does_not_evaluate_the_failure_test():
    """diffrax locates the gaps' crossings by a root finder on each step that ends past
    one; the failure test (the model's terms again, and `J M⁻¹ Jᵀ`'s pivots) stops the
    solve at a step's end and has no place in that root finder's compiled program."""
    compiled = (
        jax.jit(lambda q0: _line_above_floor(q0, throw=False).q_final)
        .lower(jnp.array([2.0, 1.0]))
        .compile()
    )
    names = re.findall(r'op_name="([^"]*)"', compiled.as_text())
    assert any("jit(root_find)" in name for name in names)
    assert any("jit(failure_indicator)" in name for name in names)
    assert not any("jit(root_find)" in name and "jit(failure_indicator)" in name for name in names)


# The default run keeps an explicit solver and generalized-α; the others in the slow tier.
@pytest.mark.parametrize(
    "name",
    [
        "tsit5",
        "generalized_alpha",
        *(
            pytest.param(name, marks=pytest.mark.slow)
            for name in ("projected", "kvaerno5", "rodas5p")
        ),
    ],
)
def test_every_solver_keeps_a_ball_at_rest_or_says_it_cannot(name):
    """A plastic ball dropped on the floor comes to rest: each solver whose rates carry the
    contact force keeps it on the floor; generalized-α, which integrates the bilateral
    constraints alone, ends the solve where the contact closed, with its result."""
    solver = solver_named(name)
    # A solve that must succeed throws, as the solve of an impact at the start does: `throw`
    # is part of the compiled solve, so with Tsit5 the two tests share one program.
    sol = jaxdae.simulate(
        jaxdae.examples.BouncingBall(e=0.0),
        jaxdae.Unstabilized(),
        0.0,
        0.6,
        jnp.array([0.0, 0.2]),
        jnp.zeros(2),
        solver=solver,
        rtol=1e-8,
        atol=1e-10,
        throw=name != "generalized_alpha",
    )
    landing = float(np.sqrt(2 * 0.2 / 9.81))
    if name != "generalized_alpha":
        assert sol.succeeded
        assert float(sol.q_final[1]) > -1e-6
    else:
        assert sol.result == jaxdae.RESULTS.resting_contact_unsupported
        np.testing.assert_allclose(float(sol.t_final), landing, atol=1e-6)
        with pytest.raises(jaxdae.SimulationError, match="came to rest"):
            jaxdae.simulate(
                jaxdae.examples.BouncingBall(e=0.0),
                jaxdae.Unstabilized(),
                0.0,
                0.6,
                jnp.array([0.0, 0.2]),
                jnp.zeros(2),
                solver=solver,
                rtol=1e-8,
                atol=1e-10,
            )


def test_an_impact_at_the_start_is_an_event():
    """A ball on the floor moving into it at `t0`: its impact there is the first event,
    with the impulse `(1 + e) |v⁻|`."""
    sol = jaxdae.simulate(
        BouncingBall(e=0.5), jaxdae.Unstabilized(), 0.0, 0.05, jnp.zeros(2), jnp.array([0.0, -1.0])
    )
    t, gap, kind, impulse = sol.events.table()[0]
    assert (t, gap, kind) == (0.0, 0, "impact")
    np.testing.assert_allclose(impulse, 1.5, rtol=1e-12)
