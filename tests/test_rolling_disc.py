"""A disc in space touching a plane at its rim's lowest point (`PlaneContact` with an
`axis`): its geometry, and a coin (`jaxdae.examples.RollingDisc`) rolling event-driven
and by time stepping against the classic reduced rolling-disc equations integrated by
`scipy.integrate.solve_ivp` (O'Reilly 1996; MotionGenesis' "Rolling disk" parameters)."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import jaxdae
import jaxdae.multibody as mb
from jaxdae.examples import RollingDisc

TIGHT = {"rtol": 1e-11, "atol": 1e-13}
DISC = RollingDisc()
MECHANISM = DISC.mechanism()
R, G = float(DISC.radius), float(DISC.gravity)
# (heading, lean, spin angle), (w_x, w_y, w_z): states of the coin rolling on the ground.
ANGLES = np.array([[0.3, 0.2, 0.1], [-1.0, -0.6, 2.0], [2.5, 0.05, -0.4]])
SPINS = np.array([[0.4, -5.0, 1.2], [0.0, 3.0, -2.0], [-1.0, 0.5, 0.3]])


def _reference(y0, ts):
    sol = solve_ivp(
        lambda t, y: DISC.reduced_rates(y),
        (ts[0], ts[-1]),
        y0,
        t_eval=ts,
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
    )
    return sol.y.T


# The coin's states, gaps and reduced states, compiled once per shape (eagerly, each
# operation compiles alone).
_state = jax.jit(lambda angles, spin: DISC.state(angles, spin))
_states = jax.jit(jax.vmap(DISC.state))
_gaps = jax.jit(jax.vmap(lambda q: MECHANISM.gaps(0.0, q)))
_reduced = jax.jit(lambda q, v: DISC.reduced_state(MECHANISM, q, v))


@jax.jit
def _gap_rates(q, v):
    """The gaps' rates at a general velocity (`v` plus a random one, the Euler parameters'
    rate tangent to their unit sphere), and the normal velocities of the disc's material
    points at the contacts."""
    moving = v + jax.random.normal(jax.random.key(0), v.shape)
    p = q[:, 3:]
    moving = moving.at[:, 3:].add(-(p * moving[:, 3:]).sum(-1, keepdims=True) * p)

    def material(q, v):
        contact = jnp.concatenate([DISC.reduced_state(MECHANISM, q, v)[6:], jnp.zeros(1)])
        omega = MECHANISM.angular_velocity(q, v, "coin")
        return v[:3] + jnp.cross(omega, contact - q[:3])

    rates = jax.vmap(lambda q, v: jax.jvp(lambda q: MECHANISM.gaps(0.0, q), (q,), (v,))[1])(
        q, moving
    )
    return rates[:, 0], jax.vmap(material)(q, moving)[:, 2]


def test_disc_touches_at_its_rims_lowest_point():
    """A rolling state put on the ground has gap 0 and a material contact point at rest;
    lifted by `h`, the gap is `h`; the gap's rate is the normal velocity of the disc's
    material point at the contact (not of the contact point's path)."""
    q, v = (np.asarray(x) for x in _states(ANGLES, SPINS))
    slips = jax.jit(jax.vmap(lambda q, v: MECHANISM.slip_velocities(0.0, q, v)))
    np.testing.assert_allclose(_gaps(q), 0.0, atol=1e-15)
    np.testing.assert_allclose(slips(q, v), 0.0, atol=1e-14)
    lifted = q.copy()
    lifted[:, 2] += 0.07
    np.testing.assert_allclose(_gaps(lifted), 0.07, atol=1e-15)
    rates, material = _gap_rates(q, v)
    np.testing.assert_allclose(rates, material, atol=1e-13)


def test_disc_gap_gradient_against_central_differences():
    """`jit(vmap(grad))` of the gap through the rim geometry, against central differences."""
    q = np.asarray(_states(ANGLES, SPINS)[0])
    direction = np.random.default_rng(1).standard_normal(q.shape)

    def gap(q):
        return MECHANISM.gaps(0.0, q)[0]

    grads = jax.jit(jax.vmap(jax.grad(gap)))(q)
    step = 1e-6
    central = (_gaps(q + step * direction) - _gaps(q - step * direction))[:, 0] / (2 * step)
    np.testing.assert_allclose((grads * direction).sum(-1), central, rtol=1e-8, atol=1e-10)


def test_flat_disc_is_named_not_nan():
    """A disc lying flat (its axis along the normal) has no lowest rim point: an error
    names it."""
    q, _ = _state(np.array([0.0, np.pi / 2, 0.0]), np.zeros(3))
    with pytest.raises(Exception, match="lies flat"):
        jax.block_until_ready(jax.jit(lambda q: MECHANISM.gaps(0.0, q))(q))


def test_disc_axis_refused_where_meaningless():
    with pytest.raises(ValueError, match="`axis` of the PlaneContact .* is zero"):
        mb.PlaneContact("coin", radius=0.1, axis=(0.0, 0.0, 0.0))
    disc = mb.PlanarBody("disc", mass=1.0, inertia=0.1, position=(0.0, 0.1))
    with pytest.raises(ValueError, match="leave `axis` out"):
        mb.Mechanism([disc], stops=[mb.PlaneContact("disc", radius=0.1, axis=(0, 1, 0))])


# Five coins in one `jax.vmap` (μ = 1 unless given): leaning, steady circular rolling,
# upright above and below `v² = g r / 3`, and upright sliding without spin (μ = 0.2).
LEAN0, PRECESSION, SLIDE_SPEED, SLIDE_MU, T1 = 0.4, 3.0, 3.0, 0.2, 3.0


@functools.cache
def _five_coins():
    fast, slow = np.sqrt(2 * G / (3 * R)), np.sqrt(G / (6 * R))
    steady = float(DISC.steady_spin(LEAN0, PRECESSION))
    angles = [(0.0, 0.3, 0.0), (0.0, LEAN0, 0.0), (0.0, 0.01, 0.0), (0.0, 0.01, 0.0), (0,) * 3]
    spins = [
        (0.0, -12.0, 2.0),
        (0.0, steady, PRECESSION * np.cos(LEAN0)),
        (0.0, -fast, 0.0),
        (0.0, -slow, 0.0),
        (0.0, 0.0, 0.0),
    ]
    q0, v0 = _states(np.array(angles, float), np.array(spins, float))
    v0 = v0.at[4, 0].set(SLIDE_SPEED)
    mu = jnp.array([1.0, 1.0, 1.0, 1.0, SLIDE_MU])
    ts = jnp.linspace(0.0, T1, 151)

    @jax.jit
    def solve(q0, v0, mu):
        def one(q0, v0, mu):
            return jaxdae.simulate(
                RollingDisc(friction=mu).mechanism(),
                jaxdae.Baumgarte(20.0, 100.0),
                0.0,
                T1,
                q0,
                v0,
                ts=ts,
                max_steps=20_000,
                **TIGHT,
            )

        return jax.vmap(one)(q0, v0, mu)

    sols = solve(q0, v0, mu)
    y = np.asarray(_reduced(sols.q, sols.v))
    return sols, y, np.asarray(ts)


@pytest.mark.slow
def test_coins_follow_the_reduced_equations():
    """Lean, heading and spin rates and the contact path within 1e-7 of the reduced
    equations over 3 s, rolling throughout (no event; the friction rolling needs stays
    within the cone)."""
    sols, y, ts = _five_coins()
    for k in range(4):
        assert jax.tree.map(lambda x, k=k: x[k], sols).events.table() == []
        ref = _reference(y[k, 0], ts)
        np.testing.assert_allclose(y[k, :, 1], ref[:, 1], atol=1e-7)
        for ours, theirs in zip(DISC.angle_rates(y[k]), DISC.angle_rates(ref), strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-7)
        np.testing.assert_allclose(y[k, :, 6:], ref[:, 6:], atol=1e-7)
        ratio = max(DISC.contact_force(row)[1] / DISC.contact_force(row)[0] for row in ref)
        assert ratio < 0.6


@pytest.mark.slow
def test_steady_rolling_and_the_upright_stability_threshold():
    """Steady circular rolling keeps its lean (the reduced equations' equilibrium
    `g sin θ / r = ¼ tan θ w_z² + (3/2) w_y w_z`); upright rolling nudged to 0.01 rad stays
    within 0.05 rad above `v² = g r / 3` and falls past 0.3 rad below."""
    _, y, _ = _five_coins()
    np.testing.assert_allclose(y[1, :, 1], LEAN0, atol=1e-10)
    heading_rate = DISC.angle_rates(y[1])[0]
    np.testing.assert_allclose(heading_rate, PRECESSION, atol=1e-9)
    assert np.max(np.abs(y[2, :, 1])) < 0.05
    assert np.max(np.abs(y[3, :, 1])) > 0.3


@pytest.mark.slow
def test_sliding_coin_sticks_at_the_closed_form_and_then_rolls():
    """Upright and sliding without spin, it slips until `t* = v₀/(3 μ g)` (one `stick`
    event), its energy falling only then; it then rolls at `2 v₀/3` without loss."""
    sols, y, ts = _five_coins()
    sol = jax.tree.map(lambda x: x[4], sols)
    table = sol.events.table()
    assert [row[2] for row in table] == ["stick"]
    onset = SLIDE_SPEED / (3 * SLIDE_MU * G)
    np.testing.assert_allclose(table[0][0], onset, atol=1e-9)
    m = float(DISC.mass)
    omega = MECHANISM.angular_velocity(sol.q, sol.v, "coin")
    energy = np.asarray(
        0.5 * m * (sol.v[:, :3] ** 2).sum(-1)
        + 0.25 * m * R**2 * (omega**2).sum(-1)  # about the axis only (upright)
        + m * G * sol.q[:, 2]
    )
    slipping = ts < onset
    assert np.all(np.diff(energy[slipping]) < 0)
    np.testing.assert_allclose(energy[~slipping], energy[-1], rtol=1e-10)
    np.testing.assert_allclose(sol.v[-1, 0], 2 * SLIDE_SPEED / 3, rtol=1e-9)


@pytest.mark.slow
def test_gradient_of_the_lean_by_the_initial_spin():
    """`jax.vmap(jax.grad)` of the lean at 0.5 s by the initial spin `w_y`, through the
    event-driven solve, against central differences."""

    def lean(w_y):
        q0, v0 = DISC.state(jnp.array([0.0, 0.3, 0.0]), jnp.stack([0.0, w_y, 2.0]))
        sol = jaxdae.simulate(MECHANISM, jaxdae.Baumgarte(20.0, 100.0), 0.0, 0.5, q0, v0, **TIGHT)
        return DISC.reduced_state(MECHANISM, sol.q_final, sol.v_final)[1]

    # They differ by 4e-6 (relative) for steps 1e-4 and 1e-3 alike: the adaptive solve's
    # derivative, not the difference quotient's error.
    w_y, step = jnp.array([-12.0, -9.0]), 1e-3
    grads = np.asarray(jax.jit(jax.vmap(jax.grad(lean)))(w_y))
    leans = np.asarray(jax.jit(jax.vmap(lean))(jnp.concatenate([w_y + step, w_y - step])))
    np.testing.assert_allclose(grads, (leans[:2] - leans[2:]) / (2 * step), rtol=1e-5)
    assert np.all(np.abs(grads) > 1e-3)


def test_time_stepping_coin_rolls_at_first_order():
    """By `TimeStepping` the leaning coin follows the reduced equations, its lean error
    falling in proportion to `dt` (5.7e-3 and 2.9e-3 rad over 0.5 s at `dt` = 2e-3 and
    1e-3)."""
    q0, v0 = _state(np.array([0.0, 0.3, 0.0]), np.array([0.0, -12.0, 2.0]))
    ts = jnp.linspace(0.0, 0.5, 26)
    solve = eqx.filter_jit(
        lambda dt: jaxdae.simulate(
            MECHANISM,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            0.5,
            q0,
            v0,
            ts=ts,
            events=jaxdae.TimeStepping(dt=dt, tolerance=1e-12),
            max_steps=2000,
        )
    )
    ref = _reference(np.asarray(_reduced(q0, v0)), np.asarray(ts))
    errors = []
    for dt in (2e-3, 1e-3):
        sol = solve(jnp.asarray(dt))
        assert sol.result == jaxdae.RESULTS.successful
        y = np.asarray(_reduced(sol.q, sol.v))
        errors.append(np.max(np.abs(y[:, 1] - ref[:, 1])))
    assert errors[1] < 0.02
    assert 1.5 < errors[0] / errors[1] < 2.7
