"""The root finder that locates a solve's events: where a condition crosses zero downwards.

diffrax locates an event by a root finder on the last step's interpolation, between the
step's ends `lower` (the condition positive) and `upper` (at or below zero), with every
condition but the triggered ones zeroed. [`DownCrossing`][] bisects that interval, on the
sum of the conditions, until it is `rtol · |t| + atol` wide. It needs no derivative of the
condition: a condition may hold a resting contact's force, whose solve's derivative rules
serve forward and reverse mode but not the linearization `optimistix.Newton` takes. Its
interval never loses the crossing, so no tolerance on the condition's value (whose units
are the model's) decides when it stops. (The event time's derivative, by the implicit
function theorem, is forward mode.)
"""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

from .._custom_types import Array, Float


class _Interval(eqx.Module):
    lower: Float[Array, ""]
    upper: Float[Array, ""]


def _summed(fn):
    def scalar(y, args):
        out, aux = fn(y, args)
        return sum(jax.tree.leaves(out)), aux

    return scalar


class DownCrossing(optx.AbstractRootFinder):
    """Bisection for a condition positive at `options["lower"]` and at or below zero at
    `options["upper"]` (module docstring)."""

    rtol: float
    atol: float
    # The earliest time of a crossing (a solve that starts there; None: the step's start).
    floor: Array | None = None
    norm: ClassVar = staticmethod(jnp.abs)

    def init(self, fn, y, args, options: dict[str, Any], f_struct, aux_struct, tags) -> _Interval:
        dtype = jnp.result_type(y)
        lower = jnp.asarray(options["lower"], dtype)
        if self.floor is not None:
            lower = jnp.maximum(lower, jnp.asarray(self.floor, dtype))
        return _Interval(lower, jnp.asarray(options["upper"], dtype))

    def step(self, fn, y, args, options, state: _Interval, tags):
        value, aux = _summed(fn)(y, args)
        above = value > 0
        lower = jnp.where(above, y, state.lower)
        upper = jnp.where(above, state.upper, y)
        return lower + 0.5 * (upper - lower), _Interval(lower, upper), aux

    def terminate(self, fn, y, args, options, state: _Interval, tags):
        width = jnp.abs(state.upper - state.lower)
        return width <= self.atol + self.rtol * jnp.abs(y), optx.RESULTS.successful

    def postprocess(self, fn, y, aux, args, options, state: _Interval, tags, result):
        # The crossing's upper end: the condition there is at or below zero, as the event
        # says (the midpoint may sit a rounding above it).
        return state.upper, aux, {}
