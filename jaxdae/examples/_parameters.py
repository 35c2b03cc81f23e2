"""The numeric parameters of the example systems."""

import equinox as eqx
import jax.numpy as jnp


def _as_floats(value):
    # A floating array keeps its dtype (a float32 simulation builds models of float32
    # parameters); integers and Python numbers become the default float.
    array = jnp.asarray(value)
    return array if jnp.issubdtype(array.dtype, jnp.inexact) else array.astype(float)


def parameter(default):
    """A field holding a numeric parameter as a floating array (a leaf that `jax.grad` and
    `jax.vmap` can reach), `default` unless given."""
    return eqx.field(default=default, converter=_as_floats)
