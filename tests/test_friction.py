"""Coulomb friction at one-sided constraints: the frictional complementarity solver, stick
and slip against closed forms, Housner's rocking block, derivatives, batches and errors
(`jaxdae/_compilation/_lcp.py`, `jaxdae/_integration/_events.py`)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae._compilation._lcp import solve_frictional_lcp
from jaxdae.examples import RockingBlock, SlidingBlock, WoodpeckerToy

TIGHT = {"rtol": 1e-11, "atol": 1e-13}


def test_frictional_lcp_meets_coulomb_and_complementarity():
    """On random contact problems (`A = D M⁻¹ Dᵀ` of random directions `D`), the modes it
    ends on satisfy every condition: no pulling or penetrating normal, complementarity,
    stick within the cone, slip against the sliding direction on the cone's edge."""
    rng = np.random.default_rng(1)
    solve = jax.jit(solve_frictional_lcp)
    solved = 0
    for _ in range(40):
        size = int(rng.integers(1, 3))
        directions = rng.standard_normal((2 * size, 3 * size))
        matrix = directions @ directions.T
        vector = rng.standard_normal(2 * size)
        friction = rng.uniform(0.1, 1.0, size)
        # NumPy in and out: eager `jnp` calls and indexing compile a program each per size.
        out = solve(
            matrix, vector, friction, np.ones(size, bool), np.ones(size, bool), np.ones(size)
        )
        out = jax.tree.map(np.asarray, out)
        if not bool(out.solved):
            continue
        solved += 1
        x, w = np.asarray(out.x), np.asarray(out.w)
        normal, tangential = x[:size], x[size:]
        tol = 1e-9 * (1 + np.abs(vector).max())
        assert np.all(normal >= -tol) and np.all(w[:size] >= -tol)
        np.testing.assert_allclose(normal * w[:size], 0.0, atol=tol)
        for k in range(size):
            if normal[k] <= tol:
                assert abs(tangential[k]) <= tol
            elif bool(out.modes.stick[k]):
                assert abs(w[size + k]) <= tol
                assert abs(tangential[k]) <= friction[k] * normal[k] + tol
            else:
                sign = float(out.modes.sign[k])
                np.testing.assert_allclose(tangential[k], -friction[k] * sign * normal[k], atol=tol)
                assert sign * w[size + k] >= -tol
    assert solved >= 36  # pivoting may cycle on a rare non-monotone problem


@pytest.fixture(scope="module")
def slides():
    """`SlidingBlock`s launched at 2 m/s down slopes they stick to and one they do not, and
    one at rest on a slope it sticks to, batched by `jax.vmap`: each member meets its own
    events (as NumPy arrays: indexing them compiles nothing)."""
    slopes, speeds = jnp.array([0.1, 0.3, 0.6, 0.3]), jnp.array([2.0, 2.0, 2.0, 0.0])

    @jax.jit
    def run(slopes, speeds):
        def one(slope, speed):
            block = SlidingBlock(slope=slope)
            return jaxdae.simulate(
                block,
                jaxdae.Unstabilized(),
                0.0,
                1.5,
                jnp.zeros(2),
                jnp.stack([speed, 0.0]),
                **TIGHT,
            )

        return jax.vmap(one)(slopes, speeds)

    return np.asarray(slopes), np.asarray(speeds), jax.tree.map(np.asarray, run(slopes, speeds))


def test_sliding_block_sticks_where_the_closed_form_says(slides):
    slopes, speeds, sols = slides
    for k, (slope, speed) in enumerate(zip(slopes, speeds, strict=True)):
        block = SlidingBlock(slope=float(slope))
        table = jax.tree.map(lambda x, k=k: x[k], sols.events).table()
        if speed == 0.0:  # at rest where it sticks: it stays, with no event
            assert table == []
            np.testing.assert_allclose(sols.q_final[k], 0.0, atol=1e-12)
        elif np.tan(slope) < 0.5:
            time, distance = block.stopping(float(speed))
            assert [row[2] for row in table] == ["stick"]
            np.testing.assert_allclose(table[0][0], time, rtol=0, atol=1e-10)
            np.testing.assert_allclose(sols.q_final[k, 0], distance, rtol=1e-9)
            np.testing.assert_allclose(sols.v_final[k], 0.0, atol=1e-9)
        else:
            assert table == []
            a = block.acceleration()
            np.testing.assert_allclose(
                sols.q_final[k, 0], speed * 1.5 + 0.5 * a * 1.5**2, rtol=1e-9
            )
        np.testing.assert_allclose(sols.q_final[k, 1], 0.0, atol=1e-9)


def _stop_time(parameters):
    friction, speed = parameters[0], parameters[1]
    block = SlidingBlock(slope=0.2, friction_coefficient=friction)
    sol = jaxdae.simulate(
        block,
        jaxdae.Unstabilized(),
        0.0,
        1.5,
        jnp.zeros(2),
        jnp.stack([speed, 0.0]),
        adjoint=diffrax.ForwardMode(),
        **TIGHT,
    )
    return jnp.stack([sol.events.t[0], sol.q_final[0]])


@pytest.mark.slow
def test_derivatives_through_stick_events():
    """The stick time `v₀/a` and distance `v₀²/(2a)`, `a = g (μ cos s − sin s)`,
    differentiated by the coefficient of friction and the launch speed, against the
    closed form and central differences."""
    point = jnp.array([0.5, 2.0])
    jac = np.asarray(jax.jit(jax.jacfwd(_stop_time))(point))
    g, slope, mu, v0 = 9.81, 0.2, 0.5, 2.0
    a = g * (mu * np.cos(slope) - np.sin(slope))
    da = g * np.cos(slope)
    expected = np.array([[-v0 * da / a**2, 1 / a], [-(v0**2) * da / (2 * a**2), v0 / a]])
    np.testing.assert_allclose(jac, expected, rtol=1e-7)
    step, stop_time = 1e-6, jax.jit(_stop_time)
    central = np.stack(
        [
            (np.asarray(stop_time(point + step * e)) - np.asarray(stop_time(point - step * e)))
            / (2 * step)
            for e in np.eye(2)
        ],
        axis=1,
    )
    np.testing.assert_allclose(jac, central, rtol=1e-5)


@pytest.mark.slow
def test_rocking_block_loses_housners_fraction_per_impact():
    """Each plastic, sticking impact of the rocking block keeps `(1 − 1.5 sin² α)²` of
    the rocking energy (Housner (1963)); the old corner lifts off, the new one sticks."""
    block = RockingBlock()
    q0, v0 = block.initial_state(0.1)
    ts = jnp.linspace(0.0, 1.3, 261)
    sol = jaxdae.simulate(
        block, jaxdae.Unstabilized(), 0.0, 1.3, q0, v0, ts=ts, rtol=1e-12, atol=1e-14
    )
    table = sol.events.table()
    assert [row[1] for row in table] == [1, 0, 1] and {row[2] for row in table} == {"contact"}
    times = [0.0] + [row[0] for row in table] + [1.3]
    rocking = np.asarray(sol.energy) - block.rest_energy()
    between = [
        np.median(rocking[(np.asarray(ts) > a) & (np.asarray(ts) < b)])
        for a, b in zip(times[:-1], times[1:], strict=True)
    ]
    np.testing.assert_allclose(
        np.array(between[1:]) / np.array(between[:-1]), block.energy_ratio(), rtol=1e-8
    )
    assert np.all(np.asarray(sol.events.impulse[:3]) > 0)


@pytest.mark.slow
def test_disc_spun_on_the_ground_slips_then_rolls():
    """A disc (`I = ½ m r²`) set spinning at `ω₀` on the ground slips until it rolls, at
    `v = −r ω₀ / 3` from `t = r ω₀ / (3 μ g)` (a `PlaneContact` with friction)."""
    radius, mu, spin = 0.2, 0.3, 10.0
    wheel = mb.Mechanism(
        bodies=[mb.PlanarBody("disc", mass=1.0, inertia=0.5 * radius**2, position=(0.0, radius))],
        forces=[mb.Gravity((0.0, -9.81))],
        stops=[mb.PlaneContact("disc", radius=radius, friction=mu)],
    )
    sol = jaxdae.simulate(
        wheel,
        jaxdae.Unstabilized(),
        0.0,
        0.5,
        jnp.array([0.0, radius, 0.0]),
        jnp.array([0.0, 0.0, spin]),
        **TIGHT,
    )
    assert [row[2] for row in sol.events.table()] == ["stick"]
    np.testing.assert_allclose(sol.events.t[0], radius * spin / (3 * mu * 9.81), atol=1e-10)
    np.testing.assert_allclose(sol.v_final, [-radius * spin / 3, 0.0, spin / 3], atol=1e-9)


def test_bad_friction_is_refused_before_the_solve():
    start = (jnp.zeros(2), jnp.zeros(2))
    with pytest.raises(ValueError, match="friction must be non-negative"):
        jaxdae.simulate(
            SlidingBlock(friction_coefficient=-0.1), jaxdae.Unstabilized(), 0.0, 1.0, *start
        )

    class Wrong(SlidingBlock):
        def slip_velocities(self, t, q, v):
            return v

    with pytest.raises(ValueError, match="one sliding velocity per gap"):
        jaxdae.simulate(Wrong(), jaxdae.Unstabilized(), 0.0, 1.0, *start)
    with pytest.raises(ValueError, match="`friction` of the PlaneContact"):
        mb.PlaneContact("a", friction=-1.0)


@pytest.mark.slow
def test_hamiltonian_form_sticks_where_the_lagrangian_does():
    """The Hamiltonian form of the sliding block (state: momenta) meets the same stick
    event: the wrapper passes the friction and slip velocities on."""
    block = SlidingBlock(slope=0.2)
    q0, v0 = jnp.zeros(2), jnp.array([2.0, 0.0])
    sol = jaxdae.simulate(
        jaxdae.HamiltonianForm(block),
        jaxdae.Unstabilized(),
        0.0,
        1.5,
        q0,
        block.momenta(0.0, q0, v0),
        **TIGHT,
    )
    assert [row[2] for row in sol.events.table()] == ["stick"]
    np.testing.assert_allclose(sol.events.t[0], block.stopping(2.0)[0], atol=1e-10)


@pytest.mark.slow
def test_woodpecker_toy_runs_through_its_published_state():
    """Glocker's woodpecker toy, started on the published state of its periodic motion,
    comes back to it a period later: the bird swings down through the same angle with the
    sleeve jammed, at the published rates to a percent (the published state is given to
    four digits, and the motion converges to its cycle)."""
    toy = WoodpeckerToy()
    q0, v0 = toy.published_state()
    sol = jaxdae.simulate(toy, jaxdae.Unstabilized(), 0.0, 0.1459, q0, v0, rtol=1e-10, atol=1e-12)
    kinds = [row[2] for row in sol.events.table()]
    assert {"stick", "slip", "release", "impact", "contact"} <= set(kinds)
    assert 0 in [row[1] for row in sol.events.table() if row[2] == "impact"]  # the beak
    np.testing.assert_allclose(sol.q_final[1:], q0[1:], atol=2e-3)
    np.testing.assert_allclose(sol.v_final, v0, rtol=2e-2, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("max_steps", [100_000, 4096], ids=["checkpointed", "replayed"])
def test_reverse_mode_gradient_through_stick_events(max_steps):
    """`jax.grad` of the stick time against the closed form, with the default adjoint:
    diffrax's checkpointed loop with 100,000 steps allowed, each stretch between events
    replayed with 4,096."""

    def stop_time(friction):
        block = SlidingBlock(slope=0.2, friction_coefficient=friction)
        sol = jaxdae.simulate(
            block,
            jaxdae.Unstabilized(),
            0.0,
            1.5,
            jnp.zeros(2),
            jnp.array([2.0, 0.0]),
            max_steps=max_steps,
            **TIGHT,
        )
        return sol.events.t[0]

    g, slope, mu, v0 = 9.81, 0.2, 0.5, 2.0
    a = g * (mu * np.cos(slope) - np.sin(slope))
    grad = jax.jit(jax.grad(stop_time))(mu)
    np.testing.assert_allclose(grad, -v0 * g * np.cos(slope) / a**2, rtol=1e-7)


def _painleve_rod(mu, speed):
    """A uniform rod of length 1 standing on its end at `tan θ = 2` to the ground, its
    centre of mass moving at `speed` along the ground."""
    angle, half = np.arctan(2.0), 0.5
    centre = half * np.array([np.cos(angle), np.sin(angle)])
    rod = mb.PlanarBody(
        "rod", mass=1.0, inertia=1 / 12, position=centre, angle=angle, markers={"tip": [-half, 0.0]}
    )
    model = mb.Mechanism(
        [rod], forces=[mb.Gravity([0.0, -9.81])], stops=[mb.PlaneContact("rod.tip", friction=mu)]
    )
    q0, v0 = jnp.array([*centre, angle]), jnp.array([speed, 0.0, 0.0])
    return jaxdae.simulate(
        model, jaxdae.Baumgarte(kd=10.0, kp=25.0), 0.0, 0.3, q0, v0, throw=False, **TIGHT
    )


@pytest.mark.slow
def test_painleves_rod_is_reported_by_name():
    """Painlevé's paradox: the rod's end slides away from under it with `μ = 1.5 > 4/3`, and
    no Coulomb force keeps the contact (the normal force would have to pull). The solve
    ends there with `RESULTS.contact_forces_not_solved`; below `4/3` it slides on."""
    run = jax.jit(_painleve_rod)
    inconsistent = run(1.5, -1.0)
    assert inconsistent.result == jaxdae.RESULTS.contact_forces_not_solved
    # It ends at the start, where the rod stands: nothing after it is saved.
    assert np.isinf(inconsistent.ts[-1]) and int(inconsistent.events.count) == 0
    consistent = run(1.0, -1.0)
    assert consistent.result == jaxdae.RESULTS.successful
