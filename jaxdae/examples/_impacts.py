"""Systems with one-sided constraints whose impacts and frictional contacts have closed
forms."""

import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array
from .._systems._system import LagrangianSystem
from ._parameters import parameter
from ._pendulum import CartesianPendulum
from ._point_mass import AbstractPointMass


class BouncingBall(AbstractPointMass):
    """A point mass at `q = (x, y)` above the floor `y = 0`: `T = ½ m |v|²`, `V = m g y`,
    one gap `g = y ≥ 0` with Newton's coefficient of restitution `e`.

    Dropped from rest at the height `h`, it meets the floor at the speed
    `v₁ = √(2 g h)` at `t₁ = √(2h/g)`, leaves the `k`-th impact at `eᵏ v₁`, rises to
    `e²ᵏ h` and meets the floor again `2 eᵏ v₁ / g` later; the impacts accumulate at
    `t₁ (1 + e)/(1 − e)` ([`impact_times`][jaxdae.examples.BouncingBall.impact_times]).
    """

    mass: Array = parameter(1.0)
    gravity: Array = parameter(9.81)
    e: Array = parameter(0.8)

    def gaps(self, t, q):
        return q[1:2]

    def restitution(self):
        return self.e

    def impact_times(self, height: float, count: int) -> np.ndarray:
        """The times of the first `count` impacts after a drop from rest at `height`."""
        g, e = float(self.gravity), float(self.e)
        first = np.sqrt(2 * height / g)
        flights = 2 * first * e ** np.arange(1, count)
        return first + np.concatenate([[0.0], np.cumsum(flights)])

    def impact_speeds(self, height: float, count: int) -> np.ndarray:
        """The speeds at which the first `count` impacts meet the floor."""
        g, e = float(self.gravity), float(self.e)
        return np.sqrt(2 * g * height) * e ** np.arange(count)


def _complete_elliptic_k(modulus):
    """`K(k)`, the complete elliptic integral of the first kind, by the arithmetic–geometric
    mean: `K = π / (2 AGM(1, √(1 − k²)))`."""
    a, b = 1.0, np.sqrt(1.0 - modulus**2)
    for _ in range(64):
        a, b = 0.5 * (a + b), np.sqrt(a * b)
    return np.pi / (2 * a)


class PendulumWithStop(AbstractPointMass):
    """A point mass on a rod of length `l` from the origin, in Cartesian coordinates
    `q = (x, y)` (`Φ = x² + y² − l²`), against a wall along the vertical `x = 0` on its
    right: the gap `g = −x ≥ 0`, coefficient of restitution `e`.

    Released from rest at the angle `θ₀` from the downward vertical (on the left), it
    meets the wall hanging straight down after a quarter period `K(sin(θ₀/2)) √(l/g)`;
    each impact scales its angular speed by `e`, so the amplitudes follow
    `1 − cos θ_k = e²ᵏ (1 − cos θ₀)` and the next impact comes a half period
    `2 K(sin(θ_k/2)) √(l/g)` later
    ([`impact_times`][jaxdae.examples.PendulumWithStop.impact_times]). The rod constraint stays
    bilateral through the impacts.
    """

    mass: Array = parameter(1.0)
    length: Array = parameter(1.0)
    gravity: Array = parameter(9.81)
    e: Array = parameter(0.5)

    @property
    def free(self) -> CartesianPendulum:
        """The same pendulum without the wall."""
        return CartesianPendulum(self.mass, self.length, self.gravity)

    def constraints(self, t, q):
        return self.free.constraints(t, q)

    def gaps(self, t, q):
        return -q[:1]

    def restitution(self):
        return self.e

    def initial_state(self, angle: float = 0.5):
        """`(q, v)` at rest at `angle` from the downward vertical, on the left."""
        return self.free.state_from_angle(-angle, 0.0)

    def amplitudes(self, angle: float, count: int) -> np.ndarray:
        """The amplitudes `θ₀, …, θ_{count−1}` of the swings between impacts."""
        e = float(self.e)
        height = (1 - np.cos(angle)) * e ** (2 * np.arange(count))
        return np.arccos(1 - height)

    def impact_times(self, angle: float, count: int) -> np.ndarray:
        """The times of the first `count` impacts after a release from rest at `angle`."""
        scale = np.sqrt(float(self.length) / float(self.gravity))
        quarters = np.array(
            [_complete_elliptic_k(np.sin(a / 2)) * scale for a in self.amplitudes(angle, count)]
        )
        return quarters[0] + np.concatenate([[0.0], np.cumsum(2 * quarters[1:])])


class SlidingBlock(AbstractPointMass):
    """A point mass on a plane inclined at `slope` (rad), in coordinates along it:
    `q = (x, y)`, `x` down the slope, `y` off the plane (the gap `g = y ≥ 0`), with
    Coulomb's coefficient `friction` along `x` (the slip velocity `ẋ`).

    Launched down the slope at `v₀` on a plane it can stick to (`tan(slope) < μ`), it
    slides at the deceleration `a = g (μ cos(slope) − sin(slope))`, sticks at `v₀ / a`
    after `v₀² / (2a)` ([`stopping`][jaxdae.examples.SlidingBlock.stopping]) and stays; on a
    steeper plane it slides on at `g (sin(slope) − μ cos(slope))`.
    """

    mass: Array = parameter(1.0)
    gravity: Array = parameter(9.81)
    slope: Array = parameter(0.2)
    friction_coefficient: Array = parameter(0.5)

    def potential_energy(self, t, q):
        return self.mass * self.gravity * (q[1] * jnp.cos(self.slope) - q[0] * jnp.sin(self.slope))

    def gaps(self, t, q):
        return q[1:2]

    def friction(self):
        return self.friction_coefficient

    def slip_velocities(self, t, q, v):
        return v[:1]

    def acceleration(self) -> float:
        """Down the slope while sliding down: `g (sin(slope) − μ cos(slope))`."""
        slope, mu = float(self.slope), float(self.friction_coefficient)
        return float(self.gravity) * (np.sin(slope) - mu * np.cos(slope))

    def stopping(self, speed: float) -> tuple[float, float]:
        """`(time, distance)` to sticking from sliding down at `speed` (where it sticks)."""
        deceleration = -self.acceleration()
        return speed / deceleration, speed**2 / (2 * deceleration)


class RockingBlock(LagrangianSystem):
    """Housner's rocking block: a rectangle of half-width `b` and half-height `h` on the
    ground, `q = (x, y, θ)` its centre and angle, two gaps (the heights of its lower
    corners, right then left), plastic impacts and Coulomb friction `friction_coefficient`
    (enough that the corners do not slip).

    Rocking on one corner it meets the ground with the other; if that impact is plastic
    and sticks, the block rocks on about the new corner with its angular velocity scaled
    by `1 − (3/2) sin² α`, `α = atan(b/h)` (Housner (1963); for the rectangle's
    `I_O = (4/3) m R²` about a corner, `R² = b² + h²`), so each impact keeps the
    fraction [`energy_ratio`][jaxdae.examples.RockingBlock.energy_ratio] of the rocking
    energy (above the energy at rest).
    """

    mass: Array = parameter(1.0)
    gravity: Array = parameter(9.81)
    b: Array = parameter(0.1)
    h: Array = parameter(0.4)
    friction_coefficient: Array = parameter(1.0)

    def kinetic_energy(self, t, q, v):
        inertia = self.mass * (self.b**2 + self.h**2) / 3
        return 0.5 * self.mass * (v[0] ** 2 + v[1] ** 2) + 0.5 * inertia * v[2] ** 2

    def potential_energy(self, t, q):
        return self.mass * self.gravity * q[1]

    def corners(self, q):
        """The lower corners, right then left, `(2, 2)`."""
        cos, sin = jnp.cos(q[2]), jnp.sin(q[2])
        local = jnp.stack([jnp.stack([self.b, -self.h]), jnp.stack([-self.b, -self.h])])
        return q[:2] + local @ jnp.stack([jnp.stack([cos, sin]), jnp.stack([-sin, cos])])

    def gaps(self, t, q):
        return self.corners(q)[:, 1]

    def friction(self):
        return self.friction_coefficient

    def slip_velocities(self, t, q, v):
        return jax.jvp(lambda q_: self.corners(q_)[:, 0], (q,), (v,))[1]

    def energy_ratio(self) -> float:
        """Housner's `(1 − (3/2) sin² α)²`: the rocking energy kept through an impact."""
        alpha = np.arctan2(float(self.b), float(self.h))
        return (1 - 1.5 * np.sin(alpha) ** 2) ** 2

    def rest_energy(self) -> float:
        """`m g h`, its energy at rest on the ground."""
        return float(self.mass) * float(self.gravity) * float(self.h)

    def initial_state(self, tilt: float):
        """`(q, v)` at rest, tilted by `tilt` (rad, positive) onto its right corner."""
        b, h = float(self.b), float(self.h)
        cos, sin = np.cos(tilt), np.sin(tilt)
        centre = np.array([b, 0.0]) + np.array([[cos, sin], [-sin, cos]]) @ np.array([-b, h])
        return jnp.array([centre[0], centre[1], -tilt]), jnp.zeros(3)
