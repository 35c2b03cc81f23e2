"""A point-mass pendulum in Cartesian coordinates."""

import jax.numpy as jnp

from .._custom_types import Array
from ._parameters import parameter
from ._point_mass import AbstractPointMass


class CartesianPendulum(AbstractPointMass):
    """A point mass `m` at `q = (x, y)` on a massless rod of length `l` from the origin.

    `T = ½ m |v|²`, `V = m g y`, `Φ = x² + y² − l²` (one holonomic constraint, index 3).
    Conservative and scleronomic, so `T + V` is conserved on the constraint manifold.
    """

    mass: Array = parameter(1.0)
    length: Array = parameter(1.0)
    gravity: Array = parameter(9.81)

    def constraints(self, t, q):
        return jnp.array([q @ q - self.length**2])

    def state_from_angle(self, angle, angular_velocity):
        """`(q, v)` on the manifold for the angle from the downward vertical."""
        angle = jnp.asarray(angle, dtype=float)
        q = self.length * jnp.array([jnp.sin(angle), -jnp.cos(angle)])
        v = self.length * angular_velocity * jnp.array([jnp.cos(angle), jnp.sin(angle)])
        return q, v
