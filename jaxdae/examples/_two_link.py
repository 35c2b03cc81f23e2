"""Mukharlyamov and Deressa (2015), Example 1: a two-link manipulator whose tip tracks a moving
point on a line."""

import jax
import jax.numpy as jnp

from .._custom_types import Array
from .._systems._system import LagrangianSystem

#: Initial state of Mukharlyamov and Deressa's (2015) Example 1 (`Φ = 0`, `Φ̇ = 0` for
#: `speed = 0.6`).
TWO_LINK_Q0 = (1.396263, 3.563268)
TWO_LINK_V0 = (0.358620, -0.867745)


class TwoLinkManipulator(LagrangianSystem):
    """Two uniform rods in a vertical plane, tip constrained to `y = l/2`, `x = x0 − v t`.

    Mukharlyamov and Deressa (2015), Example 1 (docs/methods.md): `l1 = l`, `l2 = l/2`, `m1 = 2m`,
    `m2 = m`, `I_i = m_i l_i² / 12`, `l = 1 m`, `m = 1 kg`, gravity `g` along −y. Coordinates `q1`
    (link 1 from the x axis) and `q2` (link 2 relative to link 1). The tip
    `P = (l1 cos q1 + l2 cos(q1+q2), l1 sin q1 + l2 sin(q1+q2))` obeys the rheonomic
    constraints `Φ1 = P_y − l/2`, `Φ2 = P_x + v t − x0`. The kinetic and potential energies
    are written from the links' centre-of-mass motion; everything else is autodiff.

    The arm folds (`q1 = π/2`, `q2 = π`, singular `J M⁻¹ Jᵀ`) at `t = x0 / v ≈ 0.493 s`,
    and the target leaves the workspace at `t ≈ 2.85 s`.
    """

    length: Array
    mass: Array
    speed: Array
    x0: Array
    gravity: Array

    def __init__(self, length=1.0, mass=1.0, speed=0.6, x0=None, gravity=9.81):
        self.length = jnp.asarray(length, dtype=float)
        self.mass = jnp.asarray(mass, dtype=float)
        self.speed = jnp.asarray(speed, dtype=float)
        self.gravity = jnp.asarray(gravity, dtype=float)
        if x0 is None:
            x0 = self.tip(jnp.asarray(TWO_LINK_Q0, dtype=float))[0]
        self.x0 = jnp.asarray(x0, dtype=float)

    @property
    def lengths(self):
        return self.length, 0.5 * self.length

    @property
    def masses(self):
        return 2.0 * self.mass, self.mass

    def tip(self, q):
        l1, l2 = self.lengths
        return jnp.array(
            [
                l1 * jnp.cos(q[0]) + l2 * jnp.cos(q[0] + q[1]),
                l1 * jnp.sin(q[0]) + l2 * jnp.sin(q[0] + q[1]),
            ]
        )

    def _centres(self, q):
        l1, l2 = self.lengths
        c1 = 0.5 * l1 * jnp.array([jnp.cos(q[0]), jnp.sin(q[0])])
        c2 = 2 * c1 + 0.5 * l2 * jnp.array([jnp.cos(q[0] + q[1]), jnp.sin(q[0] + q[1])])
        return c1, c2

    def kinetic_energy(self, t, q, v):
        (m1, m2), (l1, l2) = self.masses, self.lengths
        _, (vc1, vc2) = jax.jvp(self._centres, (q,), (v,))
        inertia1, inertia2 = m1 * l1**2 / 12, m2 * l2**2 / 12
        omega1, omega2 = v[0], v[0] + v[1]
        return 0.5 * (m1 * vc1 @ vc1 + m2 * vc2 @ vc2 + inertia1 * omega1**2 + inertia2 * omega2**2)

    def potential_energy(self, t, q):
        (m1, m2) = self.masses
        c1, c2 = self._centres(q)
        return self.gravity * (m1 * c1[1] + m2 * c2[1])

    def constraints(self, t, q):
        p = self.tip(q)
        return jnp.array([p[1] - 0.5 * self.length, p[0] + self.speed * t - self.x0])

    def initial_state(self):
        """Mukharlyamov and Deressa's (2015) initial state `(q0, v0)`."""
        return jnp.asarray(TWO_LINK_Q0, dtype=float), jnp.asarray(TWO_LINK_V0, dtype=float)
