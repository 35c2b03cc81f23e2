"""Mukharlyamov (2019), §5: an element of an adaptive optical system driven by a DC motor."""

import jax
import jax.numpy as jnp

from .._custom_types import Array
from .._systems._actuated import ActuatedSystem
from .._systems._system import LagrangianSystem


class Crank(LagrangianSystem):
    """A weightless crank `OA` of length `l` turning about `O` with a mirror of mass `m` at
    `A = l (cos φ, sin φ)`, gravity along `−η`: `T = ½ m l² φ̇²`, `V = m g l sin φ`, so
    `φ̈ = −(g/l) cos φ + M/(m l²)` for a motor torque `M` (Mukharlyamov (2019), eq. [5.2])."""

    length: Array
    mass: Array
    gravity: Array

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * self.length**2 * v[0] ** 2

    def potential_energy(self, t, q):
        return self.mass * self.gravity * self.length * jnp.sin(q[0])


class AdaptiveOpticsElement(ActuatedSystem):
    """Mukharlyamov (2019), §5 (docs/methods.md): a mirror on a crank turned by a DC
    motor must reflect a ray from a moving source `P = (s(t), 0)` onto the fixed point
    `C = (c, 0)`.

    - Mechanism: [`jaxdae.examples.Crank`][], `q = (φ,)`, `v = (ω,)`.
    - Actuator: `w = (M, ν)`, the motor torque and its rate, `Ṁ = ν`,
      `ν̇ = −(R/L) ν − (k_a k_b/(n L)) ω + (k_a/L) u` with the armature voltage `u`
      (eq. [5.2]; armature inductance `L`, resistance `R`, gear ratio `n`, torque and
      back-emf constants `k_a`, `k_b`).
    - Program constraint (eq. [5.1], the reflection law `α = β` without its special cases
      `sin φ = 0`, `s = c`): `f = l (s(t) + c) − 2 c s(t) cos φ = 0`. The voltage first
      appears in `f⁽⁴⁾` (relative degree 4) with `g = 2 c s(t) sin φ k_M k_a/L`,
      `k_M = 1/(m l²)` (eq. [5.6]; the denominator of the paper's eq. [5.7] omits `k_M`).

    The paper gives no numbers. The defaults: `l = 0.1 m`, `c = 0.5 m`, `m = 0.05 kg`,
    `g = 9.81 m/s²`, `L = 0.02 H`, `R = 2 Ω`, `k_a = k_b = 0.05`, `n = 20`, and the source
    moving as `s(t) = s0 + a sin(Ω t)`, `s0 = 0.3 m`, `a = 0.1 m`, `Ω = 2 rad/s`, so that
    `cos φ = l (s + c)/(2 c s) ∈ [0.225, 0.35]` stays inside `(0, 1)` and the programmed
    motion keeps away from `sin φ = 0`.
    """

    mechanism: Crank
    distance: Array  # c
    inductance: Array
    resistance: Array
    torque_constant: Array
    back_emf_constant: Array
    gear_ratio: Array
    source_mean: Array
    source_amplitude: Array
    source_frequency: Array

    def __init__(
        self,
        length=0.1,
        mass=0.05,
        gravity=9.81,
        distance=0.5,
        inductance=0.02,
        resistance=2.0,
        torque_constant=0.05,
        back_emf_constant=0.05,
        gear_ratio=20.0,
        source_mean=0.3,
        source_amplitude=0.1,
        source_frequency=2.0,
    ):
        as_array = lambda x: jnp.asarray(x, dtype=float)  # noqa: E731
        self.mechanism = Crank(as_array(length), as_array(mass), as_array(gravity))
        self.distance = as_array(distance)
        self.inductance = as_array(inductance)
        self.resistance = as_array(resistance)
        self.torque_constant = as_array(torque_constant)
        self.back_emf_constant = as_array(back_emf_constant)
        self.gear_ratio = as_array(gear_ratio)
        self.source_mean = as_array(source_mean)
        self.source_amplitude = as_array(source_amplitude)
        self.source_frequency = as_array(source_frequency)

    def source(self, t):
        """`s(t)`, the source's position on the `ξ` axis."""
        return self.source_mean + self.source_amplitude * jnp.sin(self.source_frequency * t)

    def actuator_forces(self, t, q, v, w):
        return w[:1]  # the motor torque M turns the crank

    def actuator_drift(self, t, q, v, w):
        torque_rate = w[1]
        k_v = self.resistance / self.inductance
        k_w = self.torque_constant * self.back_emf_constant / (self.gear_ratio * self.inductance)
        return jnp.stack([torque_rate, -k_v * torque_rate - k_w * v[0]])

    def input_matrix(self, t, q, v, w):
        zero = jnp.zeros((), dtype=w.dtype)
        return jnp.stack([zero, self.torque_constant / self.inductance])[:, None]

    def program_constraints(self, t, q, v):
        s, c, length = self.source(t), self.distance, self.mechanism.length
        return jnp.stack([length * (s + c) - 2 * c * s * jnp.cos(q[0])])

    def programmed_angle(self, t):
        """`φ(t)` on the programmed motion: `cos φ = l (s + c)/(2 c s)`, `φ ∈ (0, π)`."""
        s, c, length = self.source(t), self.distance, self.mechanism.length
        return jnp.arccos(length * (s + c) / (2 * c * s))

    def programmed_state(self, t):
        """`(q, v, w)` exactly on the programmed motion at `t` (`f = ḟ = f̈ = f⃛ = 0`): the
        angle and its rate from `programmed_angle`, the torque `M` that produces its
        acceleration (inverse dynamics with the crank's autodiff-derived terms) and `Ṁ`."""
        t = jnp.asarray(t, dtype=float)

        def angle_rate(t_):
            return jax.jvp(self.programmed_angle, (t_,), (jnp.ones_like(t_),))

        def torque(t_):
            (phi, omega), (_, acceleration) = jax.jvp(angle_rate, (t_,), (jnp.ones_like(t_),))
            terms = self.mechanism.terms(t_, phi[None], omega[None])
            return (terms.mass_matrix @ acceleration[None] - terms.forces)[0]

        phi, omega = angle_rate(t)
        moment, moment_rate = jax.jvp(torque, (t,), (jnp.ones_like(t),))
        return phi[None], omega[None], jnp.stack([moment, moment_rate])

    def initial_state(self, t0=0.0, angle_error=0.0):
        """`(q0, v0, w0)` at rest on the crank angle `φ(t0) + angle_error`, with the motor
        torque balancing gravity (`M = m g l cos φ`)."""
        phi = self.programmed_angle(jnp.asarray(t0, dtype=float)) + angle_error
        crank = self.mechanism
        torque = crank.mass * crank.gravity * crank.length * jnp.cos(phi)
        return jnp.stack([phi]), jnp.zeros(1), jnp.stack([torque, jnp.zeros(())])
