"""Gradients through contact for batches: `jax.vmap(jax.grad(f))` and `jax.grad` of a
vmapped loss through impacts and a contact that comes to rest, against per-member
gradients and central differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import BouncingBall


def _landing_state(restitution, height):
    """Where a ball dropped from `height` is at 0.9 s: after its impacts (0.2 s apart at
    first), and at rest for the plastic member."""
    sol = jaxdae.simulate(
        BouncingBall(e=restitution),
        jaxdae.Unstabilized(),
        0.0,
        0.9,
        jnp.stack([0.0 * height, height]),
        jnp.zeros(2),
        rtol=1e-10,
        atol=1e-12,
    )
    return sol.q_final[1] + 0.1 * sol.events.t[0]


# Three gradient programs through the event loop (batched, per member, of the batch's
# sum) take minutes to compile on two cores.
@pytest.mark.slow
def test_batched_gradients_through_impacts_and_rest():
    restitution = jnp.array([0.5, 0.0])  # the second comes to rest at its first impact
    height = jnp.array([0.3, 0.2])
    grad = jax.grad(_landing_state, argnums=(0, 1))
    batched = jax.vmap(grad)(restitution, height)
    members = [grad(e, h) for e, h in zip(restitution, height, strict=True)]
    for i, member in enumerate(members):
        for b, m in zip(batched, member, strict=True):
            np.testing.assert_allclose(b[i], m, rtol=1e-9, atol=1e-12)
    # Central differences (away from any grazing contact; one-sided at e = 0).
    step = 1e-6
    for i in range(2):
        for arg in range(2):
            values = [restitution[i], height[i]]
            plus, minus = list(values), list(values)
            plus[arg] = plus[arg] + step
            if arg == 0 and float(values[0]) == 0.0:
                difference = (_landing_state(*plus) - _landing_state(*values)) / step
            else:
                minus[arg] = minus[arg] - step
                difference = (_landing_state(*plus) - _landing_state(*minus)) / (2 * step)
            np.testing.assert_allclose(batched[arg][i], difference, rtol=1e-4, atol=1e-6)
    # The gradient of the batch's sum: the same rows.
    total = jax.grad(lambda e, h: jnp.sum(jax.vmap(_landing_state)(e, h)), argnums=(0, 1))
    for whole, rows in zip(total(restitution, height), batched, strict=True):
        np.testing.assert_allclose(whole, rows, rtol=1e-9, atol=1e-12)
