"""Gradients through contact for batches: `jax.vmap(jax.grad(f))` and `jax.grad` of a
vmapped loss through impacts and a contact that comes to rest, against per-member
gradients and central differences."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import BouncingBall


def _solve(restitution, height, max_steps=100_000):
    return jaxdae.simulate(
        BouncingBall(e=restitution),
        jaxdae.Unstabilized(),
        0.0,
        0.9,
        jnp.stack([0.0 * height, height]),
        jnp.zeros(2),
        rtol=1e-10,
        atol=1e-12,
        max_steps=max_steps,
    )


def _landing_state(restitution, height, max_steps=100_000):
    """Where a ball dropped from `height` is at 0.9 s, and when it first lands."""
    sol = _solve(restitution, height, max_steps)
    return sol.q_final[1] + 0.1 * sol.events.t[0]


def _event_count(restitution, height):
    return _solve(restitution, height).events.count


# A batch of 64 drops: restitutions from plastic to 0.8 and heights from 0.1 to 0.6 m give
# from one to a dozen impacts before 0.9 s, members that come to rest at their first
# impact, after several or not at all.
_RESTITUTION = jnp.tile(jnp.linspace(0.0, 0.8, 8), 8)
_HEIGHT = jnp.repeat(jnp.linspace(0.1, 0.6, 8), 8) + 0.013 * jnp.arange(64) % 0.05


# Three gradient programs through the event loop (batched, per member, of the batch's sum),
# with the default adjoint: diffrax's checkpointed loop with 100,000 steps allowed, each
# stretch between events replayed with 4,096.
@pytest.mark.slow
@pytest.mark.parametrize("max_steps", [100_000, 4096], ids=["checkpointed", "replayed"])
def test_batched_gradients_through_impacts_and_rest(max_steps):
    counts = jax.jit(jax.vmap(_event_count))(_RESTITUTION, _HEIGHT)
    assert len(set(np.asarray(counts).tolist())) >= 5, counts
    loss = functools.partial(_landing_state, max_steps=max_steps)
    grad = jax.grad(loss, argnums=(0, 1))
    batched = jax.jit(jax.vmap(grad))(_RESTITUTION, _HEIGHT)
    member = jax.jit(grad)
    forward = jax.jit(loss)
    step = 1e-6
    for i in range(_RESTITUTION.shape[0]):
        values = [_RESTITUTION[i], _HEIGHT[i]]
        for b, m in zip(batched, member(*values), strict=True):
            np.testing.assert_allclose(b[i], m, rtol=1e-10, atol=1e-13)
        # Central differences (one-sided at e = 0, where the ball rests at once).
        for arg in range(2):
            plus, minus = list(values), list(values)
            plus[arg] = plus[arg] + step
            if arg == 0 and float(values[0]) == 0.0:
                difference = (forward(*plus) - forward(*values)) / step
            else:
                minus[arg] = minus[arg] - step
                difference = (forward(*plus) - forward(*minus)) / (2 * step)
            np.testing.assert_allclose(batched[arg][i], difference, rtol=1e-5, atol=1e-7)
    # The gradient of the batch's sum: the same rows.
    total = jax.jit(jax.grad(lambda e, h: jnp.sum(jax.vmap(loss)(e, h)), argnums=(0, 1)))
    for whole, rows in zip(total(_RESTITUTION, _HEIGHT), batched, strict=True):
        np.testing.assert_allclose(whole, rows, rtol=1e-10, atol=1e-13)
