"""Coulomb friction in space: the isotropic cone `|λ_T| ≤ μ λ_N` of contacts with two slip
velocities, in event-driven solves (`jaxdae/_compilation/_lcp.py`,
`jaxdae/_formulations/_impacts.py`, `jaxdae/_integration/_events.py`), against closed
forms and an independent integration of the sliding point mass."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import jaxdae
import jaxdae.multibody as mb
from jaxdae._compilation._lcp import ContactModes, frictional_solve, solve_frictional_lcp

from ._jaxprs import equations

TIGHT = {"rtol": 1e-10, "atol": 1e-12}
G = 9.81


class Body(jaxdae.LagrangianSystem):
    """A uniform sphere of `radius` (unit mass, moment of inertia `inertia`) on a plane
    inclined by `slope` (its centre `q[:3]`: `x` downhill, `y` across, `z` off the plane;
    its angular velocity `v[3:]`: for a sphere the kinetic energy and the slip velocity need
    no orientation), with Newton's `e` and Coulomb's `mu`, pushed along the plane at
    `(cos β, sin β)` (`angle` β) by a force growing as `push · t`. The blocks and the balls
    below are its members (a block: a point mass, `radius = 0`, its spin apart), so that
    their solves are one compiled program."""

    radius: jax.Array
    inertia: jax.Array
    mu: jax.Array
    e: jax.Array
    slope: jax.Array
    push: jax.Array
    angle: jax.Array

    def kinetic_energy(self, t, q, v):
        return 0.5 * v[:3] @ v[:3] + 0.5 * self.inertia * v[3:] @ v[3:]

    def potential_energy(self, t, q):
        return G * (q[2] * jnp.cos(self.slope) - q[0] * jnp.sin(self.slope))

    def generalized_forces(self, t, q, v):
        along = jnp.stack([jnp.cos(self.angle), jnp.sin(self.angle)])
        return jnp.concatenate([self.push * t * along, jnp.zeros(4, along.dtype)])

    def gaps(self, t, q):
        return q[2:3] - self.radius

    def restitution(self):
        return self.e

    def friction(self):
        return self.mu

    def slip_velocities(self, t, q, v):
        # The contact point's velocity `ṗ + ω × (−r e_z)` along `e_x`, `e_y`.
        r = self.radius
        return jnp.stack([v[0] - r * v[4], v[1] + r * v[3]])[None]


def _ball(radius, mu, e):
    """A uniform sphere (`I = 2/5 r²`) over the level ground `z = 0`, not pushed."""
    zero = jnp.zeros_like(mu)
    return Body(radius, 0.4 * radius**2, mu, e, zero, zero, zero)


# The blocks' batch: (slope, μ, push, angle, v₀).
DIAGONAL, AT_REST, SLIDING, SIDEWAYS, PUSHED = range(5)
BLOCKS = {
    DIAGONAL: (0.0, 0.5, 0.0, 0.0, (1.2, -1.6)),  # on a level plane, stops on its line
    AT_REST: (0.2, 0.5, 0.0, 0.0, (0.0, 0.0)),  # below the angle of friction: stays
    SLIDING: (0.4, 0.3, 0.0, 0.0, (0.0, 0.0)),  # above it: slides
    SIDEWAYS: (0.2, 0.5, 0.0, 0.0, (0.0, 2.0)),  # launched across: its slip turns downhill
    PUSHED: (0.0, 0.4, 10.0, 0.7, (0.0, 0.0)),  # sticks until the push leaves the cone
}
T1 = 1.5


@pytest.fixture(scope="module")
def blocks():
    """The blocks' solves (members `DIAGONAL` … `PUSHED` of `_solves`)."""
    return _solves()


def _member(sols, k):
    """Member `k` of a batch of solutions (NumPy arrays: indexing them compiles nothing)."""
    return jax.tree.map(lambda x: x[k], sols)


def test_block_pushed_diagonally_stops_on_its_line(blocks):
    """`v₀ = (a, b)` on a level plane: it decelerates at `μ g` along `v₀`, sticks at
    `|v₀| / (μ g)` a distance `|v₀|² / (2 μ g)` along its line."""
    sol = _member(blocks, DIAGONAL)
    mu, v0 = BLOCKS[DIAGONAL][1], np.array(BLOCKS[DIAGONAL][4])
    speed = np.linalg.norm(v0)
    table = sol.events.table()
    assert [row[2] for row in table] == ["stick"]
    np.testing.assert_allclose(table[0][0], speed / (mu * G), rtol=0, atol=1e-10)
    position = np.asarray(sol.q_final[:2])
    lateral = (v0[0] * position[1] - v0[1] * position[0]) / speed
    assert abs(lateral) < 1e-9
    np.testing.assert_allclose(position @ v0 / speed, speed**2 / (2 * mu * G), rtol=1e-9)
    np.testing.assert_allclose(sol.v_final, 0.0, atol=1e-9)


def test_block_on_an_incline_sticks_below_the_angle_of_friction_and_slides_above(blocks):
    at_rest, sliding = _member(blocks, AT_REST), _member(blocks, SLIDING)
    assert at_rest.events.table() == []
    np.testing.assert_allclose(at_rest.q_final, 0.0, atol=1e-12)
    slope, mu = BLOCKS[SLIDING][:2]
    assert np.tan(slope) > mu and sliding.events.table() == []
    a = G * (np.sin(slope) - mu * np.cos(slope))
    # (its spin, `q[3:]` and `v[3:]`, stays at rest)
    np.testing.assert_allclose(sliding.q_final, np.r_[0.5 * a * T1**2, np.zeros(5)], atol=1e-9)
    np.testing.assert_allclose(sliding.v_final, np.r_[a * T1, np.zeros(5)], atol=1e-9)


def _sliding_reference(slope, mu, v0):
    """The sliding point mass `ẍ = g_T − μ g_N ẋ/|ẋ|` on the incline by
    `scipy.integrate.solve_ivp` to its stop: the time and the place. Once its slip points
    downhill (`ẋ > 0`), the direction is `sgn(ẋ) ẋ/|ẋ|`, smooth through the stop, which is
    where `ẋ` crosses zero."""
    g_t, g_n = np.array([G * np.sin(slope), 0.0]), G * np.cos(slope)

    def rates(t, y, signed):
        v = y[2:]
        s = v / np.linalg.norm(v) * (np.sign(v[0]) if signed else 1.0)
        return np.concatenate([v, g_t - mu * g_n * s])

    def downhill(t, y, signed):
        return y[2] - abs(y[3])

    def stopped(t, y, signed):
        return y[2]

    downhill.terminal = stopped.terminal = True
    stopped.direction = -1
    y0 = np.concatenate([np.zeros(2), v0])
    first = solve_ivp(rates, (0, 5), y0, args=(False,), rtol=1e-12, atol=1e-14, events=downhill)
    second = solve_ivp(
        rates, (first.t[-1], 5), first.y[:, -1], args=(True,), rtol=1e-12, atol=1e-14,
        events=stopped,
    )  # fmt: skip
    return second.t[-1], second.y[:2, -1]


def test_block_launched_across_an_incline_turns_and_stops_as_the_reference(blocks):
    """Its friction force turns with its slip (`λ_T = −μ λ_N v_T/|v_T|` at each state):
    the solve meets the stop of an independent integration, taking its reference direction
    anew where the slip has turned 60° from it (a `slip` event)."""
    sol = _member(blocks, SIDEWAYS)
    slope, mu = BLOCKS[SIDEWAYS][:2]
    time, place = _sliding_reference(slope, mu, np.array(BLOCKS[SIDEWAYS][4]))
    table = sol.events.table()
    assert [row[2] for row in table] == ["slip", "stick"]
    np.testing.assert_allclose(table[-1][0], time, rtol=0, atol=1e-7)
    np.testing.assert_allclose(sol.q_final[:2], place, rtol=0, atol=1e-7)
    np.testing.assert_allclose(sol.v_final, 0.0, atol=1e-9)


def test_block_slips_where_a_growing_push_leaves_the_cone(blocks):
    """A push `k t` along `(cos β, sin β)` on a level plane: stuck until `k t = μ g`, then it
    slips along the push (opposite the sticking force that left the cone), `x = k (t −
    t*)³ / 6`."""
    sol = _member(blocks, PUSHED)
    _, mu, push, angle, _ = BLOCKS[PUSHED]
    start = mu * G / push
    table = sol.events.table()
    assert [row[2] for row in table] == ["slip"]
    np.testing.assert_allclose(table[0][0], start, rtol=0, atol=1e-10)
    along = np.r_[np.cos(angle), np.sin(angle), np.zeros(4)]
    np.testing.assert_allclose(sol.q_final, push * (T1 - start) ** 3 / 6 * along, atol=1e-9)
    np.testing.assert_allclose(sol.v_final, push * (T1 - start) ** 2 / 2 * along, atol=1e-9)


# The balls' batch: rolling from a slide at three μ, then an oblique impact with spin
# that sticks (large μ) and one that slides (small μ).
RADIUS, BOUNCE = 0.1, 0.5
ROLL_SPEED = np.array([1.2, -1.6])
ROLL_MUS = (0.2, 0.3, 0.5)
FALL = (np.array([0.0, 0.0, 0.3]), np.array([1.0, -0.5, -1.0]), np.array([3.0, 4.0, 5.0]))
IMPACT_MUS = (1.0, 0.02)


def _impact_closed_form(mu):
    """The impact time and the velocities after it (`ṗ`, `ω`) of the falling ball
    (`FALL`): `P_N = (1 + e) |ż⁻|`; the sticking impulse `P_T = −v_c⁻ / (1 + r²/I)` where
    it fits in the cone, else `P_T = −μ P_N v_c⁻/|v_c⁻|`."""
    p, v, w = FALL
    drop = p[2] - RADIUS
    vz = -np.sqrt(v[2] ** 2 + 2 * G * drop)
    time = (v[2] - vz) / G
    normal = (1 + BOUNCE) * -vz
    contact = np.array([v[0] - RADIUS * w[1], v[1] + RADIUS * w[0]])
    sticking = -contact / (1 + RADIUS**2 / (0.4 * RADIUS**2))
    if np.linalg.norm(sticking) <= mu * normal:
        tangential = sticking
    else:
        tangential = -mu * normal * contact / np.linalg.norm(contact)
    v_after = np.array([v[0] + tangential[0], v[1] + tangential[1], -BOUNCE * vz])
    spin = np.array([RADIUS * tangential[1], -RADIUS * tangential[0], 0.0]) / (0.4 * RADIUS**2)
    return time, v_after, w + spin, np.linalg.norm(sticking) <= mu * normal


@functools.cache
def _solves():
    """The blocks' and the balls' solves, one `jax.vmap` of one compiled program (each
    member meets its own events), as NumPy arrays: the blocks (`BLOCKS`, to `T1`), then the
    balls rolling (`ROLL_MUS`, to 0.5 s) and the impacts (`IMPACT_MUS`, to halfway through
    the bounce)."""
    rows = [  # (radius, inertia, μ, e, slope, push, angle), q₀, v₀, t₁
        ((0.0, 1.0, mu, 0.0, slope, push, angle), np.zeros(6), np.r_[v0, np.zeros(4)], T1)
        for slope, mu, push, angle, v0 in BLOCKS.values()
    ]
    ball = (RADIUS, 0.4 * RADIUS**2)
    for mu in ROLL_MUS:
        q0 = np.array([0.0, 0.0, RADIUS, 0.0, 0.0, 0.0])
        rows.append(((*ball, mu, BOUNCE, 0.0, 0.0, 0.0), q0, np.r_[ROLL_SPEED, np.zeros(4)], 0.5))
    for mu in IMPACT_MUS:
        time, v_after, _, _ = _impact_closed_form(mu)
        state = (np.concatenate([FALL[0], np.zeros(3)]), np.concatenate(FALL[1:]))
        rows.append(((*ball, mu, BOUNCE, 0.0, 0.0, 0.0), *state, time + v_after[2] / G))
    parameters, q0, v0, t1 = zip(*rows, strict=True)
    bodies = Body(*(jnp.asarray(c, float) for c in zip(*parameters, strict=True)))

    @jax.jit
    def run(bodies, q0, v0, t1):
        def one(body, q0, v0, t1):
            return jaxdae.simulate(body, jaxdae.Unstabilized(), 0.0, t1, q0, v0, **TIGHT)

        return jax.vmap(one)(bodies, q0, v0, t1)

    sols = run(bodies, *(jnp.asarray(np.stack(x), float) for x in (q0, v0, t1)))
    return jax.tree.map(np.asarray, sols)


@pytest.fixture(scope="module")
def balls():
    """The balls' solves (from member `len(BLOCKS)` of `_solves`)."""
    return jax.tree.map(lambda x: x[len(BLOCKS) :], _solves())


def test_sphere_slides_then_rolls_at_the_closed_form(balls):
    """A sphere set sliding without spin rolls from `t = 2 v₀ / (7 μ g)` at `5 v₀ / 7`, for
    each of a batch of μ (`jax.vmap`)."""
    speed = np.linalg.norm(ROLL_SPEED)
    for k, mu in enumerate(ROLL_MUS):
        sol = _member(balls, k)
        table = sol.events.table()
        assert [row[2] for row in table] == ["stick"]
        np.testing.assert_allclose(table[0][0], 2 * speed / (7 * mu * G), rtol=0, atol=1e-8)
        rolling = 5 * ROLL_SPEED / 7
        np.testing.assert_allclose(sol.v_final[:2], rolling, atol=1e-8)
        np.testing.assert_allclose(
            sol.v_final[3:5], [-rolling[1] / RADIUS, rolling[0] / RADIUS], atol=1e-7
        )
        np.testing.assert_allclose(np.asarray(sol.v_final)[[2, 5]], 0.0, atol=1e-9)


def test_sphere_in_float32_rolls_at_the_closed_form():
    """In float32 the slip's stop is located to float32's width in time, and the slip
    left there counts as at rest: one `stick` event, not a slip that restarts at every
    event until `max_events`."""
    mu, speed = 0.3, 2.0
    ball = _ball(jnp.asarray(RADIUS, jnp.float32), jnp.asarray(mu, jnp.float32), jnp.asarray(0.0))
    sol = jaxdae.simulate(
        ball,
        jaxdae.Unstabilized(),
        0.0,
        0.3,
        jnp.array([0.0, 0.0, RADIUS, 0.0, 0.0, 0.0], jnp.float32),
        jnp.array([speed, 0.0, 0.0, 0.0, 0.0, 0.0], jnp.float32),
        rtol=1e-5,
        atol=1e-6,
    )
    assert sol.q.dtype == jnp.float32
    table = sol.events.table()
    assert [row[2] for row in table] == ["stick"]
    np.testing.assert_allclose(table[0][0], 2 * speed / (7 * mu * G), atol=1e-5)
    np.testing.assert_allclose(sol.v_final[0], 5 * speed / 7, rtol=1e-4)


def test_oblique_impact_with_spin_sticks_or_slides_as_the_closed_form(balls):
    kinds = []
    for k, mu in enumerate(IMPACT_MUS):
        sol = _member(balls, len(ROLL_MUS) + k)
        time, v_after, w_after, sticks = _impact_closed_form(mu)
        kinds.append(sticks)
        table = sol.events.table()
        assert [row[2] for row in table] == ["impact"]
        np.testing.assert_allclose(table[0][0], time, rtol=0, atol=1e-10)
        # Halfway through the bounce: the vertical rate has gone, the rest is the impact's.
        np.testing.assert_allclose(sol.v_final[:3], v_after * [1, 1, 0], atol=1e-8)
        np.testing.assert_allclose(sol.v_final[3:], w_after, atol=1e-8)
    assert kinds == [True, False]


def test_contact_forces_with_friction_keep_a_step_loop_one_kernel():
    """The forces of resting contacts with friction in space (`frictional_solve`, which the
    rates of every step evaluate behind a branch while a contact rests) are array
    operations without a scatter or a library call: XLA:CPU then runs a solve's step loop
    as one kernel."""

    def in_a_loop(matrix, vector, friction, modes):
        def body(i, x):
            def resting():
                return frictional_solve(matrix, vector + x, friction, modes)

            return x + jax.lax.cond(modes.active.any(), resting, lambda: jnp.zeros_like(x))

        return jax.lax.fori_loop(0, 3, body, jnp.zeros_like(vector))

    # A sphere on the ground, slipping.
    modes = ContactModes(jnp.array([True]), jnp.array([False]), jnp.array([[0.6, 0.8]]))
    a = np.random.default_rng(4).standard_normal((3, 3))
    arguments = (jnp.asarray(a @ a.T + np.eye(3)), jnp.ones(3), jnp.full(1, 0.4), modes)
    # (The program as JAX emits it: XLA's passes, whose options the test run changes, may
    # rewrite a scatter.)
    program = jax.jit(in_a_loop).lower(*arguments).as_text()
    assert "stablehlo.scatter" not in program and "stablehlo.custom_call" not in program


def test_cone_solver_meets_coulomb_and_complementarity():
    """On random spatial contact problems (two tangents per contact, `A = D Dᵀ`), the modes
    it ends on satisfy every condition: no pulling or penetrating normal, complementarity,
    stick within the cone, slip on its edge against its direction with `d·w_T ≥ 0`."""
    rng = np.random.default_rng(2)
    solve = jax.jit(solve_frictional_lcp)
    solved = 0
    for _ in range(30):
        size = int(rng.integers(1, 3))
        directions = rng.standard_normal((3 * size, 4 * size))
        matrix = directions @ directions.T
        vector = rng.standard_normal(3 * size)
        friction = rng.uniform(0.1, 1.0, size)
        # NumPy in and out: eager `jnp` calls and indexing compile a program each per size.
        start = np.tile([1.0, 0.0], (size, 1))
        out = solve(matrix, vector, friction, np.ones(size, bool), np.ones(size, bool), start)
        out = jax.tree.map(np.asarray, out)
        if not bool(out.solved):
            continue
        solved += 1
        x, w = np.asarray(out.x), np.asarray(out.w)
        normal, tangential = x[:size], x[size:].reshape(size, 2)
        tol = 1e-9 * (1 + np.abs(vector).max())
        assert np.all(normal >= -tol) and np.all(w[:size] >= -tol)
        np.testing.assert_allclose(normal * w[:size], 0.0, atol=tol)
        for k in range(size):
            if normal[k] <= tol:
                assert np.linalg.norm(tangential[k]) <= tol
            elif bool(out.modes.stick[k]):
                np.testing.assert_allclose(w[size + 2 * k : size + 2 * k + 2], 0.0, atol=tol)
                assert np.linalg.norm(tangential[k]) <= friction[k] * normal[k] + tol
            else:
                d = np.asarray(out.modes.sign[k])
                np.testing.assert_allclose(np.linalg.norm(d), 1.0, rtol=1e-12)
                np.testing.assert_allclose(tangential[k], -friction[k] * normal[k] * d, atol=tol)
                assert d @ w[size + 2 * k : size + 2 * k + 2] >= -tol
    assert solved >= 25


@pytest.mark.parametrize("tangents", [1, 2], ids=["plane", "space"])
def test_cone_solver_solves_once_and_differentiates_its_final_modes(tangents):
    """A program that does not differentiate the frictional LCP holds one
    `frictional_solve` (the one in its pivoting and substitution loop); its derivative,
    in forward and reverse mode alike, is that of the final modes' solve with the slip
    direction of a free contact turning with `b_T` (exact for a sphere's isotropic,
    uncoupled contact), as central differences give it, and under `vmap` each member's."""
    matrix = jnp.diag(jnp.array([1.0, 3.5, 3.5])[: 1 + tangents])
    friction = jnp.array([0.3])
    yes = jnp.array([True])
    start = jnp.ones(1) if tangents == 1 else jnp.array([[1.0, 0.0]])

    def x(vector):
        return solve_frictional_lcp(matrix, vector, friction, yes, yes, start).x

    # Pressed and pushed along the surface harder than friction holds: it slips.
    vector = jnp.array([-9.81, 20.0, -10.0])[: 1 + tangents]
    modes = solve_frictional_lcp(matrix, vector, friction, yes, yes, start).modes
    assert bool(modes.active[0]) and not bool(modes.stick[0])
    program = jax.make_jaxpr(x)(vector).jaxpr
    assert sum(eqn.params.get("name") == "frictional_solve" for eqn in equations(program)) == 1
    forward = jax.jit(jax.jacfwd(x))(vector)
    reverse = jax.jit(jax.jacrev(x))(vector)
    np.testing.assert_allclose(forward, reverse, rtol=1e-13, atol=1e-15)
    h = 1e-6
    central = np.stack(
        [(x(vector + h * e) - x(vector - h * e)) / (2 * h) for e in jnp.eye(1 + tangents)], 1
    )
    np.testing.assert_allclose(forward, central, rtol=1e-7, atol=1e-8)
    # One slips, one sticks (pushed less than `μ` times its normal force), one lifts off.
    vectors = jnp.stack([vector, vector.at[1:].multiply(0.1), vector.at[0].set(1.0)])
    sticks = solve_frictional_lcp(matrix, vectors[1], friction, yes, yes, start).modes.stick
    assert bool(sticks[0])
    loss = jax.grad(lambda v: jnp.sum(x(v) ** 2))
    batched = jax.jit(jax.vmap(loss))(vectors)
    np.testing.assert_allclose(
        batched, np.stack([loss(v) for v in vectors]), rtol=1e-13, atol=1e-13
    )


@pytest.mark.parametrize("mu", [0.3, 1e4, 1e8])
def test_a_slipping_contacts_force_holds_for_large_friction(mu):
    """A sphere's contact problem (its normal row uncoupled from its tangents) slipping
    along `d` with a large `μ`: the normal force still holds `g̈ = 0` and the friction
    is `−μ λ_N d` (the normal row is not lost beside the slip rows)."""
    from jaxdae._compilation._lcp import ContactModes, frictional_solve

    matrix = jnp.array([[1.0, 0.0, 0.0], [0.0, 3.5, 0.0], [0.0, 0.0, 3.5]])
    vector = jnp.array([-9.81, 0.0, 0.0])
    d = jnp.array([[0.6, 0.8]])
    modes = ContactModes(jnp.array([True]), jnp.array([False]), d)
    x = np.asarray(jax.jit(frictional_solve)(matrix, vector, jnp.array([mu]), modes))
    np.testing.assert_allclose(x[0], 9.81, rtol=1e-12)
    np.testing.assert_allclose(x[1:], -mu * 9.81 * np.asarray(d[0]), rtol=1e-12)


def test_slip_direction_follows_the_slip_rate_where_the_response_is_anisotropic():
    """A contact pressed (`b_N < 0`) and pushed along `b_T = (1, 1)` slides, with its
    tangential response `diag(1, k)`: the direction it slides in is that of its slip rate
    `w_T = b_T − μ x_N K d` (Coulomb's law), exactly where `K` is isotropic, closely (by
    damped substitutions from the pivoting's `b_T/|b_T|`) where it is not."""
    solve = jax.jit(solve_frictional_lcp)
    for k, tol in ((1.0, 1e-12), (1.5, 1e-6), (3.0, 2e-3), (10.0, 1e-6)):
        out = solve(
            np.diag([1.0, 1.0, k]),
            np.array([-1.0, 1.0, 1.0]),
            np.array([0.3]),
            np.ones(1, bool),
            np.ones(1, bool),
            np.array([[1.0, 0.0]]),
        )
        out = jax.tree.map(np.asarray, out)
        assert bool(out.solved) and not bool(out.modes.stick[0])
        d, rate = np.asarray(out.modes.sign[0]), np.asarray(out.w[1:])
        np.testing.assert_allclose(np.asarray(out.x[1:]), -0.3 * out.x[0] * d, atol=1e-14)
        assert abs(d[0] * rate[1] - d[1] * rate[0]) / np.linalg.norm(rate) < tol
        assert d @ rate > 0


def _roll_time(mu, max_steps=100_000):
    ball = _ball(jnp.asarray(RADIUS), mu, jnp.asarray(BOUNCE))
    sol = jaxdae.simulate(
        ball,
        jaxdae.Unstabilized(),
        0.0,
        0.5,
        jnp.array([0.0, 0.0, RADIUS, 0.0, 0.0, 0.0]),
        jnp.concatenate([jnp.asarray(ROLL_SPEED), jnp.zeros(4)]),
        max_steps=max_steps,
        **TIGHT,
    )
    return sol.events.t[0]


@pytest.mark.slow
@pytest.mark.parametrize("max_steps", [100_000, 4096], ids=["checkpointed", "replayed"])
def test_gradient_of_the_roll_time_by_the_coefficient_of_friction(max_steps):
    """`jax.vmap(jax.grad)` of `2 v₀ / (7 μ g)` at a few μ against the closed form and
    central differences, with the default adjoint: diffrax's checkpointed loop with 100,000
    steps allowed, each stretch between events replayed with 4,096."""
    mus, speed, step = np.array([0.3, 0.45]), np.linalg.norm(ROLL_SPEED), 1e-5
    roll_time = functools.partial(_roll_time, max_steps=max_steps)
    grads = np.asarray(jax.jit(jax.vmap(jax.grad(roll_time)))(jnp.asarray(mus)))
    np.testing.assert_allclose(grads, -2 * speed / (7 * mus**2 * G), rtol=1e-7)
    times = np.asarray(
        jax.jit(jax.vmap(_roll_time))(jnp.asarray(np.concatenate([mus + step, mus - step])))
    )
    np.testing.assert_allclose(grads, (times[:2] - times[2:]) / (2 * step), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", [mb.Mechanism, mb.TreeMechanism])
def test_sphere_on_the_ground_of_a_mechanism_rolls_at_the_closed_form(kind):
    """The rolling sphere as a `PlaneContact` with friction of a spatial mechanism (Euler
    parameters in a `Mechanism`, a floating base in a `TreeMechanism`)."""
    mu = 0.3
    ball = kind(
        bodies=[
            mb.RigidBody(
                "ball", mass=1.0, inertia=0.4 * RADIUS**2 * np.eye(3), position=[0, 0, RADIUS]
            )
        ],
        forces=[mb.Gravity([0.0, 0.0, -G])],
        stops=[mb.PlaneContact("ball", radius=RADIUS, friction=mu)],
    )
    q, v = ball.initial_state()
    v = v.at[:2].set(ROLL_SPEED)
    sol = jaxdae.simulate(ball, jaxdae.Unstabilized(), 0.0, 0.5, q, v, **TIGHT)
    speed = np.linalg.norm(ROLL_SPEED)
    table = sol.events.table()
    assert [row[2] for row in table] == ["stick"]
    np.testing.assert_allclose(table[0][0], 2 * speed / (7 * mu * G), rtol=0, atol=1e-8)
    np.testing.assert_allclose(sol.v_final[:2], 5 * ROLL_SPEED / 7, atol=1e-8)
    spin = ball.angular_velocity(sol.q_final, sol.v_final, "ball")
    np.testing.assert_allclose(
        spin[:2], np.array([-ROLL_SPEED[1], ROLL_SPEED[0]]) * 5 / (7 * RADIUS), atol=1e-7
    )
