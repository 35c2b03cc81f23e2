"""Nonholonomic examples for Matyukhin (1999): the Chaplygin sleigh and the knife edge (skate)."""

import jax.numpy as jnp

from .._custom_types import Array
from .._systems._system import LagrangianSystem
from ._parameters import parameter


class ChaplyginSleigh(LagrangianSystem):
    """A rigid body on a horizontal plane on a knife edge that cannot slide sideways.

    Coordinates `q = (x, y, θ)`: the centre of mass `C` and the heading `e = (cos θ, sin θ)`.
    The blade touches the plane at `P = C − a e`, and the velocity of `P` normal to the blade
    vanishes (one nonholonomic constraint, affine in `v`):
    `Ψ = −ẋ sin θ + ẏ cos θ − a θ̇ = 0`.
    `T = ½ m (ẋ² + ẏ²) + ½ J θ̇²` (`J` about `C`), `V = 0`.

    With the forward speed `u = ẋ cos θ + ẏ sin θ` and `ω = θ̇` the motion reduces to
    `u̇ = a ω²`, `ω̇ = −(m a / I) u ω`, `I = J + m a²` (the inertia about `P`); the closed form
    is in [`jaxdae.examples.ChaplyginSleigh.reduced_solution`][]. The constraint reaction
    (lateral force at `P`) is `m (u ω + a ω̇)`, non-zero whenever the sleigh turns.
    """

    mass: Array = parameter(1.0)
    inertia: Array = parameter(0.1)
    distance: Array = parameter(0.5)

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * (v[0] ** 2 + v[1] ** 2) + 0.5 * self.inertia * v[2] ** 2

    def velocity_constraints(self, t, q, v):
        theta = q[2]
        return jnp.array([-v[0] * jnp.sin(theta) + v[1] * jnp.cos(theta) - self.distance * v[2]])

    def initial_state(self, speed, angular_velocity, theta=0.0):
        """A consistent state at the origin: forward speed `u`, turn rate `ω`, heading `θ`."""
        theta = jnp.asarray(theta, dtype=float)
        e = jnp.array([jnp.cos(theta), jnp.sin(theta)])
        n = jnp.array([-jnp.sin(theta), jnp.cos(theta)])
        lateral = self.distance * angular_velocity
        v_c = speed * e + lateral * n
        q = jnp.array([0.0, 0.0, theta])
        return q, jnp.array([v_c[0], v_c[1], angular_velocity])

    def reduced_solution(self, t, speed, angular_velocity, theta=0.0):
        """Closed form of the reduced equations: `(u(t), ω(t), θ(t))`.

        The energy `E = ½ m u² + ½ I ω²` is conserved, so with `U² = 2E/m`, `c = m a / I`,
        `u̇ = c (U² − u²)` gives `u = U tanh(c U t + φ)`, `φ = artanh(u₀ / U)`; then
        `ω = ω₀ cosh φ / cosh(c U t + φ)` and
        `θ = θ₀ + ω₀ cosh φ (gd(c U t + φ) − gd φ) / (c U)`, `gd x = arctan(sinh x)`.
        Requires `ω₀ ≠ 0` (otherwise `u`, `ω` stay constant).
        """
        m, a = self.mass, self.distance
        big_i = self.inertia + m * a**2
        c = m * a / big_i
        top = jnp.sqrt(speed**2 + big_i * angular_velocity**2 / m)
        phi = jnp.arctanh(speed / top)
        x = c * top * t + phi
        u = top * jnp.tanh(x)
        omega = angular_velocity * jnp.cosh(phi) / jnp.cosh(x)
        gd = lambda z: jnp.arctan(jnp.sinh(z))  # noqa: E731
        heading = theta + angular_velocity * jnp.cosh(phi) * (gd(x) - gd(phi)) / (c * top)
        return u, omega, heading


class KnifeEdge(LagrangianSystem):
    """A knife edge (skate) on a plane inclined at angle `α` (Bloch, *Nonholonomic Mechanics*).

    Coordinates `q = (x, y, φ)`: the contact point (`x` down the slope, `y` across) and the
    blade's heading from the `x` axis. The blade cannot slide sideways:
    `Ψ = ẋ sin φ − ẏ cos φ = 0`. `T = ½ m (ẋ² + ẏ²) + ½ J φ̇²`, `V = −m g sin α · x`.

    `φ̇ = ω` is constant; from rest with `φ(0) = 0` the skate moves along
    `ẋ = (g sin α / 2ω) sin 2ωt`, `ẏ = (g sin α / ω) sin² ωt` — a cycloid-like drift across the
    slope, never down it on average. The reaction `m ω · (speed along the blade)` is non-zero
    whenever it turns.
    """

    mass: Array = parameter(1.0)
    inertia: Array = parameter(0.1)
    gravity: Array = parameter(9.81)
    incline: Array = parameter(0.3)

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * (v[0] ** 2 + v[1] ** 2) + 0.5 * self.inertia * v[2] ** 2

    def potential_energy(self, t, q):
        return -self.mass * self.gravity * jnp.sin(self.incline) * q[0]

    def velocity_constraints(self, t, q, v):
        phi = q[2]
        return jnp.array([v[0] * jnp.sin(phi) - v[1] * jnp.cos(phi)])

    def closed_form(self, t, angular_velocity):
        """`(q(t), v(t))` from rest at the origin with `φ(0) = 0`, `φ̇ = ω ≠ 0`."""
        g = self.gravity * jnp.sin(self.incline)
        w = angular_velocity
        s = jnp.sin(w * t)
        x = g / (2 * w) * (1 - jnp.cos(2 * w * t)) / (2 * w)
        y = g / w * (t / 2 - jnp.sin(2 * w * t) / (4 * w))
        q = jnp.stack([x, y, w * t], axis=-1)
        v = jnp.stack(
            [g / (2 * w) * jnp.sin(2 * w * t), g / w * s**2, jnp.full_like(t, w)], axis=-1
        )
        return q, v
