"""A solve that starts at a traced time, run from a constant `t0` before it (`_restart.py`):
the solve of each stretch between events of an event-driven solve."""

import functools

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._integration._problem import SolveOptions, Times
from jaxdae._integration._solve import integrate
from jaxdae._integration._term import Dynamics
from jaxdae.examples import BouncingBall

T1 = 2.0
CHECKPOINTED = diffrax.RecursiveCheckpointAdjoint()


def _forced(t, y, args):
    del args
    q, v = y
    return v, -4.0 * q + jnp.sin(3.0 * t)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _solve(solver, start, y0, restart: bool, adjoint=CHECKPOINTED):
    """The forced oscillator from `start` to `T1`, saved at 7 times from `start`: solved
    from `start`, or (`restart`) from the constant `-T1 / 2`, starting at `start`. The
    saved states and the step counts."""
    options = SolveOptions(
        solver,
        diffrax.PIDController(rtol=1e-8, atol=1e-10),
        None,
        4096,
        adjoint,
    )
    ts = start + (T1 - start) * jnp.linspace(0.0, 1.0, 7)
    saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)])
    t1 = jnp.asarray(T1)
    times = Times(-t1 / 2, t1, None) if restart else Times(start, t1, None)
    out, _ = integrate(
        Dynamics(diffrax.ODETerm(_forced)),
        y0,
        times,
        options,
        saveat,
        start=start if restart else None,
    )
    counts = [out.stats[key] for key in ("num_steps", "num_accepted_steps", "num_rejected_steps")]
    return out.ys, counts


def test_a_solve_started_late_takes_the_steps_of_the_solve_from_its_start():
    """Run from an earlier constant `t0` and started at `start`, a solve takes the steps
    that the solve from `start` takes, counts them alike, and saves the same states (the
    one at `start` too). An implicit solver takes the controller's tolerances for its root
    finder, as in `diffeqsolve`."""
    y0 = (jnp.asarray(0.3), jnp.asarray(-0.2))
    for solver in (diffrax.Tsit5(), diffrax.Kvaerno5()):
        direct, restarted = (_solve(solver, jnp.asarray(0.5), y0, r) for r in (False, True))
        for a, b in zip(jax.tree.leaves(direct), jax.tree.leaves(restarted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
        assert direct[1][0] > 10


def test_a_solve_started_late_differentiates_in_forward_mode():
    """With `diffrax.ForwardMode`, the Runge–Kutta stages of the solve started late run in
    the loop that forward mode differentiates (`diffeqsolve` sets it on the solvers it
    sees), and the tangents are those of the solve from its start."""

    def final(start, q0, restart):
        y0 = (q0, jnp.asarray(0.0))
        (_, end), _ = _solve(diffrax.Tsit5(), start, y0, restart, diffrax.ForwardMode())
        return end[0][0]

    primals, tangents = (jnp.asarray(0.4), jnp.asarray(0.3)), (jnp.asarray(1.0), jnp.asarray(0.5))
    direct, restarted = (
        jax.jvp(functools.partial(final, restart=restart), primals, tangents)
        for restart in (False, True)
    )
    np.testing.assert_allclose(direct, restarted, rtol=1e-9, atol=1e-11)


# Two gradient programs through diffrax's checkpointed loop.
@pytest.mark.slow
def test_a_solve_started_late_has_the_gradient_of_the_solve_from_its_start():
    """The derivatives by the start time and state, under `jit`, `vmap` and `grad`, equal
    those of the solve from the start."""

    def final(start, q0, restart):
        (saved, end), _ = _solve(diffrax.Tsit5(), start, (q0, jnp.asarray(0.0)), restart)
        return end[0][0] + jnp.sum(saved[0])

    starts = jnp.asarray([0.2, 0.5, 0.9])
    q0s = jnp.asarray([0.3, -0.1, 0.25])
    grads = [
        jax.vmap(jax.grad(final, argnums=(0, 1)), in_axes=(0, 0, None))(starts, q0s, restart)
        for restart in (False, True)
    ]
    for a, b in zip(*grads, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def test_an_event_driven_solve_compiles_without_the_end_threshold_of_each_stretch():
    """Each stretch between events is solved from a constant time before `t0` and starts
    at its event, so that XLA folds diffrax's threshold for the last step (100
    `prevbefore`s of `t1`) as in a solve without events; the bounces are the exact ones."""
    system = BouncingBall(e=0.8)
    q0, v0 = jnp.array([0.0, 1.0]), jnp.zeros(2)

    def solve(v0):
        sol = jaxdae.simulate(system, jaxdae.Unstabilized(), 0.0, T1, q0, v0, rtol=1e-9, atol=1e-11)
        return sol.events.t[:3], sol.stats["num_accepted_steps"]

    compiled = jax.jit(solve).lower(v0).compile()
    assert compiled.as_text().count("nextafter") < 100
    times, accepted = compiled(v0)
    # Free fall from rest at height 1, then flights of 2 e^k v₁ / g, v₁ = √(2g).
    g = 9.81
    first = np.sqrt(2 / g)
    expected = first + np.cumsum([0.0, 2 * 0.8 * np.sqrt(2 * g) / g, 2 * 0.64 * np.sqrt(2 * g) / g])
    np.testing.assert_allclose(times, expected, rtol=1e-7)
    assert accepted > 0
