"""The base of the examples that are a point mass in the plane under gravity."""

import equinox as eqx

from .._custom_types import Array
from .._systems._system import LagrangianSystem


class AbstractPointMass(LagrangianSystem):
    """A point mass `m` at `q = (x, y)` under gravity `g` along `−y`: `T = ½ m |v|²`,
    `V = m g y`. A subclass holds `mass` and `gravity` and adds its constraints or gaps."""

    mass: eqx.AbstractVar[Array]
    gravity: eqx.AbstractVar[Array]

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * v @ v

    def potential_energy(self, t, q):
        return self.mass * self.gravity * q[1]
