"""Time stepping of contacts with friction ([`jaxdae.TimeStepping`][]): the cone QP solver
and its implicit derivative against independent references, closed forms of sliding,
rolling, sticking and bouncing with first-order convergence, derivatives under `vmap`,
`grad` and `jacfwd`, float32, and the refused inputs (`jaxdae/_compilation/_cones.py`,
`jaxdae/_integration/_time_stepping.py`)."""

import functools
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

import jaxdae
import jaxdae.multibody as mb
from jaxdae._compilation._cones import (
    FIXED_POINT_ITERATIONS,
    _apgd,
    _fixed_point,
    cone_solve,
    lipschitz_bound,
    natural_residual,
    solve_cone_qp,
)
from jaxdae._compilation._operators import MassFactor
from jaxdae._formulations._impacts import constrained_inverse_mass, friction_coefficients, gap_terms
from jaxdae._integration._problem import pose_problem
from jaxdae._integration._simulate import SimulateKeywords
from jaxdae._integration._time_stepping import _dense_factor, contact_step
from jaxdae._integration._trajectories import SingleTrajectory
from jaxdae._integration._validation import mass_positive_definite
from jaxdae.examples import BouncingBall
from jaxdae.multibody._articulated import ArticulatedFactor

G = 9.81
STEPS = (4e-3, 2e-3, 1e-3)
# The contact problems' tolerance of the closed forms and the differences (the default,
# 1e-6 in float64, is far below the scheme's error, not below a difference quotient's).
TIGHT = 1e-11


class PointOnIncline(jaxdae.LagrangianSystem):
    """A point mass on a plane inclined at `slope` about the `y` axis, in coordinates
    along it (`x` down the slope, `z` off it): one contact (`g = z`) with an isotropic
    Coulomb cone (two slip velocities, `ẋ` and `ẏ`)."""

    slope: jax.Array
    mu: jax.Array

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return G * (q[2] * jnp.cos(self.slope) - q[0] * jnp.sin(self.slope))

    def gaps(self, t, q):
        return q[2:3]

    def friction(self):
        return self.mu

    def slip_velocities(self, t, q, v):
        return v[None, :2]


def _point_solve(slope, mu, v0, dt, t1=0.6, dtype=jnp.float64, **options):
    system = PointOnIncline(jnp.asarray(slope, dtype), jnp.asarray(mu, dtype))
    return jaxdae.simulate(
        system,
        jaxdae.Unstabilized(),
        0.0,
        t1,
        jnp.zeros(3, dtype),
        jnp.asarray(v0, dtype),
        # float32: the default tolerance.
        events=jaxdae.TimeStepping(dt=dt, tolerance=TIGHT if dtype == jnp.float64 else None),
        max_steps=1000,
        **options,
    )


@pytest.fixture(scope="module")
def point_solve():
    """`PointOnIncline`'s solve, compiled once per dtype: `(slope, mu, v0, dt, t1) ->
    Solution` (the numbers as arrays, so that a new value, `t1` included, does not compile
    anew)."""
    solve = eqx.filter_jit(_point_solve)

    def call(slope, mu, v0, dt, dtype=jnp.float64, t1=0.6):
        numbers = (jnp.asarray(x, dtype) for x in (slope, mu, v0, dt, t1))
        return solve(*numbers, dtype=dtype)

    return call


def _first_order(errors):
    """The error ratios of halved steps: about 2 for a first-order method."""
    errors = np.abs(np.asarray(errors))
    ratios = errors[:-1] / errors[1:]
    np.testing.assert_allclose(ratios, 2.0, rtol=0.15)


# The cone QP solver.


def _random_problem(rng, count, tangents):
    size = count * (1 + tangents)
    directions = rng.standard_normal((size, size + 2))
    matrix = directions @ directions.T + 0.05 * np.eye(size)
    vector = rng.standard_normal(size)
    friction = rng.uniform(0.1, 1.0, count) if tangents else np.zeros(0)
    return matrix, vector, friction


def _slsqp(matrix, vector, friction, count, tangents):
    constraints = [{"type": "ineq", "fun": lambda x, i=i: x[i]} for i in range(count)]
    for i in range(count if tangents else 0):
        rows = slice(count + tangents * i, count + tangents * (i + 1))
        constraints.append(
            {
                "type": "ineq",
                "fun": lambda x, i=i, rows=rows: friction[i] ** 2 * x[i] ** 2 - x[rows] @ x[rows],
            }
        )
    return minimize(
        lambda x: 0.5 * x @ matrix @ x + vector @ x,
        np.zeros(vector.shape[0]),
        jac=lambda x: matrix @ x + vector,
        constraints=constraints,
        method="SLSQP",
        options={"ftol": 1e-13, "maxiter": 500},
    ).x


def test_frictionless_cones_project_onto_the_non_negative_ray():
    """A coefficient `μ = 0` (a joint limit beside frictional contacts) is the ray
    `x_T = 0, x_n ≥ 0`: a negative normal impulse projects to zero."""
    from jaxdae._compilation._cones import project_cones

    x = jnp.array([-1.0, 2.0, 0.0, 0.0, 3.0, 4.0])
    # one program (eagerly, each operation compiles alone)
    projected = jax.jit(project_cones)(x, jnp.zeros(2))
    np.testing.assert_array_equal(projected, [0.0, 2.0, 0.0, 0.0, 0.0, 0.0])


def test_joint_limits_of_a_robot_arm_take_fixed_steps():
    """A URDF arm in space whose joint limits are frictionless gaps with two zero slip
    velocities each: its first steps converge (open limits push nothing)."""
    arm = mb.load_urdf(Path(__file__).parent / "data" / "three_link_arm.urdf").mechanism(
        forces=[mb.Gravity([0.0, 0.0, -G])]
    )
    # Under `jit`: the initial state's checks in the solve's program, not a program apart.
    sol = eqx.filter_jit(jaxdae.simulate)(
        arm,
        jaxdae.Unstabilized(),
        0.0,
        0.005,
        *arm.initial_state(),
        events=jaxdae.TimeStepping(dt=1e-3),
    )
    assert sol.result == jaxdae.RESULTS.successful


@pytest.mark.parametrize("tangents", [0, 1, 2])
def test_cone_qp_meets_its_optimality_conditions_and_slsqp(tangents):
    """On random problems (frictionless, plane, space): the impulses lie in the cones,
    the velocities `y = D P + b` in the dual cones, `P · y = 0`, and they agree with
    scipy's SLSQP on the same QP."""
    rng = np.random.default_rng(tangents)
    solve = jax.jit(cone_solve, static_argnums=(5, 6))
    for _ in range(4):
        count = 3
        matrix, vector, friction = _random_problem(rng, count, tangents)
        out = solve(
            *map(jnp.asarray, (matrix, vector, friction)),
            jnp.zeros(len(vector)),
            1e-11,
            5000,
            False,
        )
        x = np.asarray(out.impulses)
        y = matrix @ x + vector
        assert float(out.residual) <= 1e-11
        normal, slip = x[:count], x[count:].reshape(count, tangents)
        y_normal, y_slip = y[:count], y[count:].reshape(count, tangents)
        tol = 1e-8
        if tangents:
            assert np.all(np.linalg.norm(slip, axis=1) <= friction * normal + tol)
            assert np.all(friction * np.linalg.norm(y_slip, axis=1) <= y_normal + tol)
        else:
            assert np.all(normal >= -tol) and np.all(y_normal >= -tol)
        assert abs(x @ y) <= tol
        np.testing.assert_allclose(x, _slsqp(matrix, vector, friction, count, tangents), atol=1e-5)


def test_a_cone_solve_reports_the_residual_its_loop_stopped_at():
    """The residual by which a step accepts its cone QP is the one the solver's loop stopped
    at (APGD's best iterate's; the fixed point's exact one), not the map computed again
    apart, whose sums in another order can differ by rounding and reject a solve that
    stopped at its tolerance."""
    rng = np.random.default_rng(7)
    matrix, vector, friction = (jnp.asarray(a) for a in _random_problem(rng, 3, 2))
    start = jnp.zeros(len(vector))

    @jax.jit
    def residuals(tolerance):
        reported = tuple(
            cone_solve(matrix, vector, friction, start, tolerance, 5000, exact).residual
            for exact in (False, True)
        )
        stopped = (
            _apgd(matrix, vector, friction, start, tolerance, 5000)[1],
            _fixed_point(matrix, vector, friction, start, tolerance, 5000)[1],
        )
        return reported, stopped

    reported, stopped = residuals(1e-9)
    assert [float(r) for r in reported] == [float(r) for r in stopped]
    assert all(float(r) <= 1e-9 for r in reported)


@pytest.mark.parametrize("tangents", [1, 2])
def test_exact_cone_problem_meets_coulombs_law(tangents):
    """The exact problem (De Saxcé's fixed point): no contact penetrates or lifts off
    (`y_n ≥ 0`, `P_n y_n = 0`), the impulses lie in the cones, and a sliding contact's
    friction is on the cone's edge against its slip."""
    rng = np.random.default_rng(10 + tangents)
    solve = jax.jit(cone_solve, static_argnums=(5, 6))
    for _ in range(4):
        count = 3
        matrix, vector, friction = _random_problem(rng, count, tangents)
        out = solve(
            *map(jnp.asarray, (matrix, vector, friction)), jnp.zeros(len(vector)), 1e-11, 5000, True
        )
        assert float(out.residual) <= 1e-11
        x = np.asarray(out.impulses)
        y = matrix @ x + vector
        normal, slip = x[:count], x[count:].reshape(count, tangents)
        y_normal, y_slip = y[:count], y[count:].reshape(count, tangents)
        tol = 1e-8
        assert np.all(y_normal >= -tol) and np.all(np.abs(normal * y_normal) <= tol)
        assert np.all(np.linalg.norm(slip, axis=1) <= friction * normal + tol)
        for i in range(count):
            speed = np.linalg.norm(y_slip[i])
            if speed > 1e-6:
                np.testing.assert_allclose(
                    slip[i], -friction[i] * normal[i] * y_slip[i] / speed, atol=1e-7
                )


@pytest.mark.parametrize("exact", [False, True])
def test_cone_qp_derivative_is_the_implicit_functions(exact):
    """`jax.jacfwd` and `jax.jacrev` of the impulses with respect to `b`, `D` and `μ`
    agree with each other and with central differences."""
    rng = np.random.default_rng(3)
    matrix, vector, friction = _random_problem(rng, 3, 2)
    arrays = tuple(map(jnp.asarray, (matrix, vector, friction)))
    start = jnp.zeros(len(vector))

    @jax.jit
    def impulses(matrix, vector, friction):
        return solve_cone_qp(matrix, vector, friction, start, 1e-13, 20000, exact)

    # One program per mode for the three arguments' derivatives together.
    forwards = jax.jit(jax.jacfwd(impulses, argnums=(0, 1, 2)))(*arrays)
    reverses = jax.jit(jax.jacrev(impulses, argnums=(0, 1, 2)))(*arrays)
    for argnum, forward, reverse in zip(range(3), forwards, reverses, strict=True):
        np.testing.assert_allclose(forward, reverse, atol=1e-12)
        eps = 1e-6
        columns = []
        # The first six entries of the argument moved by `±eps`, in NumPy (eagerly, each
        # `jnp` operation would compile alone).
        for i in range(min(6, np.size(arrays[argnum]))):
            moved = [[matrix, vector, friction], [matrix, vector, friction]]
            for sign, arguments in zip((1, -1), moved, strict=True):
                arguments[argnum] = arguments[argnum].copy()
                arguments[argnum].flat[i] += sign * eps
            ends = [np.asarray(impulses(*arguments)) for arguments in moved]
            columns.append((ends[0] - ends[1]) / (2 * eps))
        numeric = np.stack(columns, -1)
        np.testing.assert_allclose(
            np.asarray(forward).reshape(len(vector), -1)[:, :6], numeric, atol=1e-6
        )


# Closed forms.


def test_block_on_an_incline_below_the_friction_angle_stays_put(point_solve):
    """Released at rest on a slope of 0.2 rad with `μ = 0.5 > tan 0.2`: it does not move."""
    sol = point_solve(0.2, 0.5, np.zeros(3), 2e-3)
    assert sol.result == jaxdae.RESULTS.successful
    np.testing.assert_allclose(sol.q[-1], 0.0, atol=1e-12)
    np.testing.assert_allclose(sol.v[-1], 0.0, atol=1e-9)


def test_block_launched_diagonally_stops_on_a_straight_line(point_solve):
    """Launched at `(2, 1)` m/s on a horizontal plane with `μ = 0.6`: the isotropic cone
    decelerates it along its velocity (a pyramid would bend its path), and it stops after
    `|v₀|² / (2 μ g)`, converging at first order."""
    v0, mu = np.array([2.0, 1.0, 0.0]), 0.6
    distance = (v0 @ v0) / (2 * mu * G)
    errors = []
    for dt in STEPS:
        sol = point_solve(0.0, mu, v0, dt)
        q = np.asarray(sol.q[-1])
        np.testing.assert_allclose(q[1] / q[0], 0.5, rtol=1e-12)
        np.testing.assert_allclose(sol.v[-1], 0.0, atol=1e-9)
        assert abs(q[2]) < 1e-12
        errors.append(np.hypot(q[0], q[1]) - distance)
    assert abs(errors[-1]) < 3e-3
    _first_order(errors)


def test_block_slides_down_a_steep_incline(point_solve):
    """On a slope steeper than the friction angle it slides at `g (sin α − μ cos α)`:
    `x(t) = ½ a t²` at first order."""
    slope, mu, t1 = 0.6, 0.3, 0.6
    a = G * (np.sin(slope) - mu * np.cos(slope))
    errors = [
        float(point_solve(slope, mu, np.zeros(3), dt).q[-1, 0]) - 0.5 * a * t1**2 for dt in STEPS
    ]
    _first_order(errors)


@pytest.fixture(scope="module")
def rolling_sphere():
    """A uniform sphere (`I = ⅖ m r²`) in a spatial `Mechanism`, launched sliding at `v₀`
    without spin on the ground with `μ`; its solve compiled once: `dt -> Solution`."""
    radius, mu, speed = 0.1, 0.3, 2.0
    ball = mb.Mechanism(
        bodies=[
            mb.RigidBody(
                "ball", mass=1.0, inertia=0.4 * radius**2 * np.eye(3), position=[0.0, 0.0, radius]
            )
        ],
        forces=[mb.Gravity([0.0, 0.0, -G])],
        stops=[mb.PlaneContact("ball", radius=radius, friction=mu)],
    )
    q0, v0 = ball.initial_state()
    v0 = v0.at[0].set(speed)
    ts = jnp.linspace(0.0, 0.5, 251)
    solve = eqx.filter_jit(
        lambda dt: jaxdae.simulate(
            ball,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            0.5,
            q0,
            v0,
            ts=ts,
            events=jaxdae.TimeStepping(dt=dt, tolerance=TIGHT),
            max_steps=1000,
        )
    )
    return solve, (radius, mu, speed)


def test_sphere_slides_then_rolls(rolling_sphere):
    """It slides until `t* = 2 v₀ / (7 μ g)`, then rolls at `5 v₀ / 7` without lifting
    off; its position converges at first order."""
    solve, (radius, mu, speed) = rolling_sphere
    onset = 2 * speed / (7 * mu * G)

    def exact_x(t):
        sliding = min(t, onset)
        return speed * sliding - 0.5 * mu * G * sliding**2 + 5 * speed / 7 * (t - sliding)

    errors = []
    for dt in STEPS:
        sol = solve(jnp.asarray(dt))
        assert sol.result == jaxdae.RESULTS.successful
        ts, q, v = (np.asarray(x) for x in (sol.ts, sol.q, sol.v))
        assert np.all(np.abs(q[:, 2] - radius) < 1e-10)  # exact Coulomb: no lift-off
        # The contact point's slip `v_x − r ω_y` (`ω_y` from the quaternion's rate).
        rolling = ts[np.argmax(np.abs(v[:, 0] - 5 * speed / 7) < 1e-2 * speed)]
        assert abs(rolling - onset) < 0.02
        np.testing.assert_allclose(v[-1, 0], 5 * speed / 7, rtol=2e-2 * dt / STEPS[0] + 1e-3)
        errors.append(q[-1, 0] - exact_x(0.5))
    _first_order(errors)


def test_planar_disc_slides_then_rolls():
    """A disc (`I = ½ m r²`) of a planar `Mechanism` launched sliding at `v₀` rolls at
    `2 v₀ / 3` from `t* = v₀ / (3 μ g)`."""
    radius, mu, speed = 0.2, 0.4, 3.0
    wheel = mb.Mechanism(
        bodies=[mb.PlanarBody("disc", mass=1.0, inertia=0.5 * radius**2, position=(0.0, radius))],
        forces=[mb.Gravity((0.0, -G))],
        stops=[mb.PlaneContact("disc", radius=radius, friction=mu)],
    )
    # Under `jit`: the initial state's checks in the solve's program, not a program apart.
    sol = eqx.filter_jit(jaxdae.simulate)(
        wheel,
        jaxdae.Unstabilized(),
        0.0,
        0.5,
        np.array([0.0, radius, 0.0]),
        np.array([speed, 0.0, 0.0]),
        ts=np.linspace(0.0, 0.5, 501),
        events=jaxdae.TimeStepping(dt=1e-3),
    )
    assert sol.result == jaxdae.RESULTS.successful and sol.events is None
    v = np.asarray(sol.v)
    # The default tolerance: the contact problems to 1e-6 of the contact velocities.
    np.testing.assert_allclose(v[-1], [2 * speed / 3, 0.0, -2 * speed / (3 * radius)], atol=1e-5)
    onset = speed / (3 * mu * G)
    rolling = float(sol.ts[np.argmax(np.abs(v[:, 0] + radius * v[:, 2]) < 1e-5)])
    assert abs(rolling - onset) <= 2e-3
    np.testing.assert_allclose(np.asarray(sol.q)[:, 1], radius, atol=1e-7)


def test_tree_mechanism_link_comes_to_rest_on_the_floor():
    """A link of a `TreeMechanism` (joint coordinates) hinged 0.2 m above the floor and
    released horizontal swings down until its tip (0.3 m from the hinge) lands plastically
    on the floor with friction, where it rests at `−asin(2/3)` (one freedom: the contact's
    normal and tangential rows are dependent, which the cone problem takes as they are)."""
    link = mb.RigidBody(
        "link",
        0.5,
        0.01 * np.eye(3),
        {"top": (-0.15, 0.0, 0.0), "tip": (0.15, 0.0, 0.0)},
        position=(0.15, 0.0, 0.0),
    )
    tree = mb.TreeMechanism(
        [mb.Ground({"floor": (0.0, -0.2, 0.0)}), link],
        [mb.Revolute("ground", "link.top", axis=(0.0, 0.0, 1.0), name="pin")],
        [mb.Gravity((0.0, -G, 0.0))],
        stops=[mb.PlaneContact("link.tip", "ground.floor", normal=(0.0, 1.0, 0.0), friction=0.5)],
    )
    sol = eqx.filter_jit(jaxdae.simulate)(
        tree,
        jaxdae.Unstabilized(),
        0.0,
        1.0,
        *tree.initial_state(),
        events=jaxdae.TimeStepping(dt=1e-3),
    )
    np.testing.assert_allclose(sol.q_final, [-np.arcsin(2 / 3)], atol=1e-6)
    np.testing.assert_allclose(sol.v_final, 0.0, atol=1e-5)


def test_ball_bounces_to_e_squared_its_height():
    """A ball dropped from 1 m (`e = 0.8`) lands at `√(2/g)` and bounces to `e²` m, at
    first order: it bounces at the step that would pass the floor, from a height `y_b` in
    `[0, h v₁)`, and then rises to `e² + (1 − e²) y_b` (energy), an error in
    `[0, (1 − e²) v₁ h)` that depends on where the impact falls within a step."""
    ts = jnp.linspace(0.0, 1.2, 12001)
    solve = eqx.filter_jit(
        lambda dt: jaxdae.simulate(
            BouncingBall(e=0.8),
            jaxdae.Unstabilized(),
            0.0,
            1.2,
            jnp.array([0.0, 1.0]),
            jnp.zeros(2),
            ts=ts,
            events=jaxdae.TimeStepping(dt=dt),
            max_steps=2000,
        )
    )
    for dt in STEPS:
        sol = solve(jnp.asarray(dt))
        height, rate = np.asarray(sol.q[:, 1]), np.asarray(sol.v[:, 1])
        assert height.min() > -1e-12
        # It bounces where it would pass the floor within the step: up to a step early.
        landed = np.asarray(ts)[np.argmax(rate > 0)]
        assert abs(landed - np.sqrt(2 / G)) < 2 * dt
        error = height[np.asarray(ts) > 0.6].max() - 0.64
        assert 0 <= error < (1 - 0.64) * np.sqrt(2 * G) * dt


# Derivatives and batches.


def _slide(mu, adjoint=None):
    """Where the point launched at `(2, 1)` m/s with `μ` is at 0.5 s (steps of 10 ms)."""
    options = {} if adjoint is None else {"adjoint": adjoint}
    return _point_solve(0.0, mu, jnp.array([2.0, 1.0, 0.0]), 1e-2, t1=0.5, **options).q[-1, 0]


# Coefficients whose points stop at different steps, or not at all before 0.5 s.
FRICTION_BATCH = jnp.array([0.3, 0.55, 0.8])


@pytest.fixture(scope="module")
def batched_gradient():
    """`jax.vmap(jax.grad(_slide))` of `FRICTION_BATCH`, compiled once."""
    return eqx.filter_jit(jax.vmap(jax.grad(_slide)))(FRICTION_BATCH)


def test_batched_gradient_equals_each_members_and_differences(batched_gradient, point_solve):
    """`vmap(grad)` of a batch whose members stop at different steps equals each member's
    `grad` and central differences."""
    friction_batch, batched = FRICTION_BATCH, batched_gradient
    single = eqx.filter_jit(jax.grad(_slide))

    def slide(mu):
        # `_slide`'s solve in the closed forms' compiled program (`t1` traced there).
        return point_solve(0.0, mu, np.array([2.0, 1.0, 0.0]), 1e-2, t1=0.5).q[-1, 0]

    eps = 1e-6
    for mu, gradient in zip(friction_batch, batched, strict=True):
        np.testing.assert_allclose(gradient, single(mu), atol=1e-10)
        numeric = (slide(mu + eps) - slide(mu - eps)) / (2 * eps)
        np.testing.assert_allclose(gradient, numeric, rtol=1e-5)
    assert np.all(np.asarray(batched) < 0)  # more friction, shorter slide


@pytest.mark.slow
def test_gradient_of_a_batch_and_forward_mode(batched_gradient):
    """`jax.grad` of a batch's sum, and `jax.jacfwd` (with `diffrax.ForwardMode()`),
    equal the members' gradients."""
    friction_batch, members = FRICTION_BATCH, batched_gradient
    of_sum = jax.grad(lambda mu: jnp.sum(jax.vmap(_slide)(mu)))(friction_batch)
    np.testing.assert_allclose(of_sum, members, atol=1e-10)
    forward = jax.jacfwd(jax.vmap(lambda mu: _slide(mu, diffrax.ForwardMode())))(friction_batch)
    np.testing.assert_allclose(forward, np.diag(np.asarray(members)), atol=1e-10)
    # The default adjoint replays the steps; diffrax's checkpointed loop gives the same.
    checkpointed = jax.vmap(
        jax.grad(lambda mu: _slide(mu, diffrax.RecursiveCheckpointAdjoint(checkpoints=8)))
    )(friction_batch)
    np.testing.assert_allclose(checkpointed, members, atol=1e-10)


def test_float32(point_solve):
    """A float32 state gives a float32 solve that stops on the same line."""
    sol = point_solve(0.0, 0.6, np.array([2.0, 1.0, 0.0]), 2e-3, dtype=jnp.float32)
    assert sol.q.dtype == jnp.float32 and sol.result == jaxdae.RESULTS.successful
    q = np.asarray(sol.q[-1])
    np.testing.assert_allclose(q[1] / q[0], 0.5, rtol=1e-5)
    reference = np.asarray(point_solve(0.0, 0.6, np.array([2.0, 1.0, 0.0]), 2e-3).q[-1])
    np.testing.assert_allclose(q, reference, rtol=1e-4, atol=1e-6)


def test_a_step_that_does_not_converge_is_named():
    """A cone QP capped at one iteration with a tolerance below rounding, which it cannot
    meet, ends the solve with `RESULTS.contact_not_converged`."""
    sol = jaxdae.simulate(
        PointOnIncline(jnp.asarray(0.0), jnp.asarray(0.6)),
        jaxdae.Unstabilized(),
        0.0,
        0.1,
        jnp.zeros(3),
        jnp.array([2.0, 1.0, -1.0]),
        events=jaxdae.TimeStepping(dt=1e-2, max_iterations=1, tolerance=1e-30),
        throw=False,
    )
    assert sol.result == jaxdae.RESULTS.contact_not_converged


# Refused inputs.


@pytest.mark.usefixtures("unchecked")
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"dt": 0.0}, "positive finite step"),
        ({"dt": -1e-3}, "positive finite step"),
        ({"dt": float("nan")}, "positive finite step"),
        ({"dt": float("inf")}, "positive finite step"),
        ({"dt": 1e-3, "tolerance": 0.0}, "tolerance"),
        ({"dt": 1e-3, "max_iterations": 0}, "max_iterations"),
        ({"dt": 1e-3, "min_bounce_speed": -1.0}, "min_bounce_speed"),
        ({"dt": 1e-3, "relaxed": 1}, "relaxed"),
    ],
)
def test_bad_settings_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        jaxdae.TimeStepping(**options)
    # A NumPy bool is a flag too.
    assert jaxdae.TimeStepping(dt=1e-3, relaxed=np.True_).relaxed is True


def test_bad_inputs_are_refused_before_the_solve():
    start = (jnp.zeros(3), jnp.zeros(3))
    stepping = jaxdae.TimeStepping(dt=1e-3)
    for mu in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="friction must be non-negative and finite"):
            jaxdae.simulate(
                PointOnIncline(jnp.asarray(0.0), jnp.asarray(mu)),
                jaxdae.Unstabilized(),
                0.0,
                1.0,
                *start,
                events=stepping,
            )
    system = PointOnIncline(jnp.asarray(0.0), jnp.asarray(0.5))
    for name, value in (
        ("solver", diffrax.Tsit5()),
        ("stepsize_controller", diffrax.PIDController(rtol=1e-6, atol=1e-8)),
        ("dt0", 1e-3),
    ):
        with pytest.raises(ValueError, match=f"`{name}` would be ignored"):
            jaxdae.simulate(
                system, jaxdae.Unstabilized(), 0.0, 1.0, *start, events=stepping, **{name: value}
            )
    with pytest.raises(ValueError, match="ReverseSweepAdjoint` does not differentiate time"):
        jaxdae.simulate(
            system,
            jaxdae.Unstabilized(),
            0.0,
            1.0,
            *start,
            events=stepping,
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )
    with pytest.raises(TypeError, match="events"):
        jaxdae.simulate_ensemble(
            system,
            jaxdae.Unstabilized(),
            0.0,
            1.0,
            jnp.zeros((2, 3)),
            jnp.zeros((2, 3)),
            events=stepping,
        )
    with pytest.raises(ValueError, match="violates gap 0"):
        jaxdae.simulate(
            system, jaxdae.Unstabilized(), 0.0, 1.0, -jnp.ones(3), jnp.zeros(3), events=stepping
        )
    with pytest.raises(ValueError, match="has none"):
        jaxdae.simulate(
            jaxdae.examples.CartesianPendulum(),
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            1.0,
            jnp.array([1.0, 0.0]),
            jnp.zeros(2),
            events=stepping,
        )


@functools.cache
def _contact_chain():
    """A chain of 12 links (hinges about alternating axes, enough bodies for the tree's
    articulated factor) whose last link's end has a frictional contact with the floor."""
    links = [
        mb.RigidBody(f"l{i}", 0.1, 1e-4 * np.eye(3), {"end": (0.0, 0.0, -0.1)}) for i in range(12)
    ]
    hinges = [
        mb.Revolute("ground" if i == 0 else f"l{i - 1}.end", f"l{i}", axis=(0, 1, i % 2))
        for i in range(12)
    ]
    floor = mb.Ground({"floor": (0.0, 0.0, -1.25)})
    contact = mb.PlaneContact("l11.end", "ground.floor", normal=(0.0, 0.0, 1.0), friction=0.5)
    return mb.TreeMechanism([floor, *links], hinges, [mb.Gravity()], stops=[contact])


@eqx.filter_jit
def _rows_and_gap_terms(system, q, v):
    """`_contact_rows` and `gap_terms` at `t = 0.1`, one program per system (eagerly, each
    operation compiles alone)."""
    friction = friction_coefficients(system, 1, q.dtype)
    return system._contact_rows(0.1, q, v, friction), gap_terms(system, 0.1, q, v, friction)


def test_contact_rows_are_those_of_the_gap_terms():
    """A step's contact rows (first derivatives only) equal `gap_terms`' gaps, contact
    velocities and rows, for a tree's contact in space and a point on an incline."""
    chain = _contact_chain()
    rng = np.random.default_rng(0)
    cases = [
        (chain, jnp.asarray(0.2 * rng.standard_normal(12)), jnp.asarray(rng.standard_normal(12))),
        (PointOnIncline(jnp.asarray(0.3), jnp.asarray(0.4)), jnp.zeros(3), jnp.ones(3)),
    ]
    for system, q, v in cases:
        (gap, velocity, directions), gaps = _rows_and_gap_terms(system, q, v)
        np.testing.assert_allclose(gap, gaps.gap, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(velocity, gaps.velocity, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(directions, gaps.directions, rtol=1e-12, atol=1e-14)


def _every_stop_tree():
    """A tree with each kind of joint and of stop: a free base, a spherical arm on it, a
    slider on the arm and a wheel on the slider; a sphere on the ground, a point on a plane
    fixed on the arm (a moving surface), a disc's rim on the ground, the slider's limits
    and a distance stop between two bodies; friction on the contacts."""
    inertia = np.diag([0.02, 0.03, 0.04])
    bodies = [
        mb.RigidBody("base", 2.0, inertia, {"foot": (0.1, 0.0, -0.2)}, position=(0, 0, 0.5)),
        mb.RigidBody("arm", 1.0, inertia, {"top": (0, 0, 0.1), "table": (0.2, 0, 0)}),
        mb.RigidBody("slider", 0.5, inertia, {"tip": (0.0, 0.1, 0.0), "hub": (0, 0, -0.1)}),
        mb.RigidBody("wheel", 0.3, inertia),
    ]
    joints = [
        mb.Spherical("base", "arm.top", name="shoulder"),
        mb.Prismatic("arm", "slider", axis=(1.0, 0.0, 0.0), name="slide"),
        mb.Revolute("slider.hub", "wheel", axis=(0.0, 1.0, 0.0), name="axle"),
    ]
    stops = [
        mb.PlaneContact("base.foot", radius=0.05, friction=0.5),
        mb.PlaneContact("slider.tip", "arm.table", normal=(0.3, 0.0, 1.0), friction=0.4),
        mb.PlaneContact("wheel", radius=0.1, axis=(0.0, 1.0, 0.0), friction=0.3),
        mb.JointLimit("slide", lower=-0.2, upper=0.3),
        mb.DistanceStop("base.foot", "slider.tip", lower=0.05, upper=1.0),
    ]
    return mb.TreeMechanism(bodies, joints, [mb.Gravity()], stops=stops)


def test_a_trees_contact_rows_are_those_of_forward_mode():
    """A tree's contact rows (from the bodies' frames and Jacobians) equal the default's
    forward mode through the whole forward kinematics, for every kind of joint and stop;
    their derivative by reverse mode for a batch of states (`vmap(grad)`, as a time step's
    gradient takes it) equals their central differences."""
    tree = _every_stop_tree()
    q0, _ = tree.initial_state()
    rng = np.random.default_rng(2)
    q = jnp.asarray(q0 + 0.1 * rng.standard_normal((2, q0.size)))
    v = jnp.asarray(rng.standard_normal((2, q0.size)))
    direction = jnp.asarray(rng.standard_normal((2, q0.size)))
    friction = friction_coefficients(tree, 7, q.dtype)
    weights = jnp.asarray(rng.standard_normal((7 + 2 * 7, q0.size)))
    step = 1e-6

    def weighted(q_, v_):
        return jnp.sum(weights * tree._contact_rows(0.0, q_, v_, friction)[2])

    @jax.jit
    @jax.vmap
    def both(q, v, direction):
        rows = tree._contact_rows(0.0, q, v, friction)
        reference = jaxdae.AbstractSystem._contact_rows(tree, 0.0, q, v, friction)
        along = jax.grad(weighted)(q, v) @ direction
        ahead, behind = (weighted(q + s * step * direction, v) for s in (1.0, -1.0))
        return rows, reference, along, (ahead - behind) / (2 * step)

    rows, reference, derivative, difference = both(q, v, direction)
    assert rows[2].shape == (2, 7 + 2 * 7, q0.size)
    for got, expected in zip(rows, reference, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(derivative, difference, rtol=1e-7)


def test_a_deep_trees_step_solves_with_the_dense_factor():
    """Where a tree carries its articulated factor, a step solves with the dense Cholesky
    factor of `M` instead: the same accelerations and contact response to rounding."""
    chain = _contact_chain()
    rng = np.random.default_rng(1)
    q, v = 0.2 * rng.standard_normal(12), rng.standard_normal(12)

    # One program (eagerly, each operation compiles alone): both factors and, with each, the
    # contact response and the accelerations.
    @eqx.filter_jit
    def solves(q, v):
        terms = chain.terms(0.0, q, v)
        dense = _dense_factor(terms)
        directions = chain._contact_rows(0.0, q, v, friction_coefficients(chain, 1, q.dtype))[2]
        outputs = [
            (solve(terms), solve(dense))
            for solve in (
                lambda t: constrained_inverse_mass(t, directions.T),
                lambda t: jaxdae.Unstabilized().accelerations(t)[0],
            )
        ]
        return terms, dense, outputs

    terms, dense, outputs = solves(q, v)
    assert isinstance(terms.mass_operator.factor, ArticulatedFactor)
    assert isinstance(dense.mass_operator.factor, MassFactor)
    for expected, got in outputs:
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())


def test_a_deep_tree_is_time_stepped_on_its_dense_path():
    """A time step factors the dense `M` itself: a tree that would take the recursive path
    (the articulated factor, loops over its levels) is posed on its dense path."""
    chain = _contact_chain()
    call = ("simulate", {"events": jaxdae.TimeStepping(dt=1e-3)}, SimulateKeywords)
    zero = jnp.zeros(12)
    problem, _ = pose_problem(
        chain, jaxdae.Unstabilized(), 0.0, 0.01, zero, zero, call, SingleTrajectory()
    )
    assert problem.system._levels() is None and chain._levels() is not None


def test_a_time_stepped_solve_replays_its_steps_within_its_step_limit():
    """Given no adjoint and no `max_steps`, a time-stepped solve is differentiated by
    `ReplayAdjoint` and limited to the steps its span takes (and a percent more for
    rounding); a `max_steps` that the call passes, or a traced span, keeps its limit."""
    chain = _contact_chain()
    zero = jnp.zeros(12)

    def posed(t1, **options):
        call = ("simulate", {"events": jaxdae.TimeStepping(dt=1e-3), **options}, SimulateKeywords)
        problem, _ = pose_problem(
            chain, jaxdae.Unstabilized(), 0.0, t1, zero, zero, call, SingleTrajectory()
        )
        return problem.options

    options = posed(0.25)
    assert isinstance(options.adjoint, jaxdae.ReplayAdjoint)
    assert 250 <= options.max_steps <= 253
    assert posed(0.25, max_steps=1000).max_steps == 1000
    assert posed(200.0).max_steps == 100_000  # the default caps it
    limits = []
    jax.jit(lambda t1: limits.append(posed(t1).max_steps))(0.25)
    assert limits == [100_000]
    # A span that is not real numbers is left to the times' own checks to name.
    with pytest.raises(ValueError, match="`t1` must be real"):
        posed(1.0 + 2.0j)


def test_a_free_trees_float32_step_stays_float32():
    """A step of a free-floating tree body (Euler parameters) sliding on the floor, from
    float32 states with 64-bit types on: every output float32, and equal to the float64
    step to the cone QP's tolerance."""
    radius = 0.1
    ball = mb.TreeMechanism(
        [mb.RigidBody("ball", 1.0, 0.4 * radius**2 * np.eye(3), position=[0.0, 0.0, radius])],
        forces=[mb.Gravity()],
        stops=[mb.PlaneContact("ball", radius=radius, friction=0.5)],
    )
    q0, v0 = ball.initial_state()
    v0 = v0.at[0].set(1.0)

    @eqx.filter_jit
    def step(q, v):
        settings = jaxdae.TimeStepping(dt=1e-3, tolerance=1e-5).solver(q.dtype)
        start = jnp.zeros(3, q.dtype)
        return contact_step(settings, ball, jaxdae.Unstabilized(), None, 0.0, 1e-3, q, v, start)

    single = step(q0.astype(jnp.float32), v0.astype(jnp.float32))
    double = step(q0, v0)
    for got, expected in zip(single, double, strict=True):
        assert got.dtype == (jnp.bool_ if expected.dtype == jnp.bool_ else jnp.float32)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_float32_mass_matrix_is_symmetric_to_its_rounding():
    """The initial state's test of `M` takes a float32 `M` that is symmetric to its
    rounding as symmetric (a tree's dense `M` on a GPU), and still refuses an asymmetry
    beyond it, in float64 from `10⁻⁸` of its largest entry."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal((5, 5))
    mass = base @ base.T + 5 * np.eye(5)
    skew = np.triu(np.ones((5, 5)), 1) - np.tril(np.ones((5, 5)), -1)
    state = (0.0, jnp.zeros(5), jnp.zeros(5))
    system = jaxdae.examples.CartesianPendulum()
    top = np.abs(mass).max()
    for dtype, asymmetry, symmetric in [
        (jnp.float32, 20 * np.finfo(np.float32).eps, True),
        (jnp.float32, 1e-3, False),
        (jnp.float64, 1e-9, True),
        (jnp.float64, 1e-7, False),
    ]:
        matrix = jnp.asarray(mass + 0.5 * asymmetry * top * skew, dtype)
        assert bool(mass_positive_definite(system, state, matrix, None)) == symmetric


def test_the_exact_fixed_point_does_not_stall_at_its_tolerance():
    """The cone problem of a step of the standing quadruped in float32 (saved from a
    float32 drop of `bench_quadruped_batch.py`), solved exactly from 20,000 starts around
    its solution: every solve converges within a few QPs. (A start whose exact residual
    lies within rounding above the tolerance, while the QP's own residual, the same map
    summed in another order, lies below it, stalled there when the QPs were solved to the
    full tolerance.)"""
    data = np.load(Path(__file__).parent / "data" / "quadruped_cone_qp.npz")
    matrix, vector, friction, tolerance = (
        jnp.asarray(data[k]) for k in ("matrix", "vector", "friction", "tolerance")
    )
    solution = _fixed_point(matrix, vector, friction, jnp.zeros_like(vector), tolerance, 1000)[0]
    rng = np.random.default_rng(0)
    scatter = rng.normal(0.0, 1.0, (20_000, 12)), rng.normal(0.0, 0.01, (20_000, 12))
    starts = jnp.asarray(np.asarray(solution) * (1 + scatter[0]) + scatter[1], jnp.float32)
    lipschitz = lipschitz_bound(matrix)

    def solve(start):
        x, _, qps, _ = _fixed_point(matrix, vector, friction, start, tolerance, 1000)
        residual = natural_residual(x, matrix, vector, friction, lipschitz, True)
        return qps, jnp.max(jnp.abs(residual))

    qps, residual = jax.jit(jax.vmap(solve))(starts)
    assert int(jnp.max(qps)) < FIXED_POINT_ITERATIONS // 10
    assert bool(jnp.all(residual <= tolerance))
