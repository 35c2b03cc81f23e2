"""The numeric parameters of the example systems."""

import equinox as eqx
import jax.numpy as jnp


def _as_floats(value):
    return jnp.asarray(value, dtype=float)


def parameter(default):
    """A field holding a numeric parameter as a floating array (a leaf that `jax.grad` and
    `jax.vmap` can reach), `default` unless given."""
    return eqx.field(default=default, converter=_as_floats)
