"""What the tuning losses and [`jaxdae.tune`][] read from a simulation's output: whether it
succeeded."""

from typing import Protocol, runtime_checkable

import jax.numpy as jnp

from .._custom_types import Array


@runtime_checkable
class ReportsSuccess(Protocol):
    """An output that says whether its solve succeeded, as [`jaxdae.Solution`][] does: a
    boolean array `succeeded` (one per trajectory for a batch). An output without it (e.g.
    a plain array) counts as succeeded."""

    @property
    def succeeded(self) -> Array: ...


def output_failed(output) -> Array:
    """`True` where `output` reports a solve that did not succeed."""
    if isinstance(output, ReportsSuccess):
        return ~jnp.asarray(output.succeeded)
    return jnp.array(False)
