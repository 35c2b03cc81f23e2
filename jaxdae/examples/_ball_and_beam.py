"""Krasinskaya and Krasinskiy (2013), §6: the GBB1005-like Ball & Beam with a four-bar lever and a
DC motor."""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array
from .._systems._control import AbstractControlledSystem, AbstractController, ConstantControl
from .._systems._system import LagrangianSystem


class BallAndBeam(LagrangianSystem, AbstractControlledSystem):
    """A ball rolling on a beam tilted by a lever from a motor-driven wheel
    (Krasinskaya and Krasinskiy (2013), §6).

    A beam of length `L` turns about its end `O` (angle `α`); a lever `AB` of length `l`
    joins the beam's other end `A` to a point `B` at radius `d` on a wheel turned by a DC
    motor (wheel angle `θ`); the ball (mass `m`, radius `R`, inertia `J`) rolls on the beam
    at distance `r` from `O`. As in the paper, the beam and lever are massless and

        T = ½ m ṙ² + ½ m (r α̇)² + ½ J (ṙ/R − α̇)² + ½ J₀ θ̇² + ½ L_a i²,   Π = m g r sin α.

    **The motor** (armature inductance kept): `L_a di/dt + R_a i + K₃ θ̇ = K₁ e`, torque
    `K₂ i` on the wheel, viscous friction `b₀ θ̇`, input the voltage `e`. The current is a
    state of the system through the electric charge `s` of the armature circuit (`i = ṡ`):
    the Lagrange–Maxwell equations of `T` above with the generalized forces
    `Q_θ = K₂ ṡ − b₀ θ̇`, `Q_s = K₁ e − R_a ṡ − K₃ θ̇` are exactly the motor equations. So the
    motor needs no extension of the core (its states `(i)` are a velocity); the charge `s`
    is a *cyclic* coordinate — pass `cyclic=model.cyclic` to [`jaxdae.linearize`][] and
    [`jaxdae.equilibrium`][] so that it is left out of the state.

    **Two models** (the `exact` flag, static):

    - `exact=True`: coordinates `q = (r, θ, α, s)`, with the exact four-bar constraint
      `F = (L(cos α − 1) + d(1 − cos θ))² + (L sin α + l − d sin θ)² − l² = 0` (lever
      vertical at `α = θ = 0`) and `α` the redundant (dependent) coordinate: simulate with
      `jaxdae.RedundantCoordinates(dependent=model.dependent)` (Shulgin, eq. [38]) or with a
      multiplier formulation. `α̇ = B(α, θ) θ̇`, `B(0, 0) = d/L`.
    - `exact=False`: the simplified model of everyone else, `α = (d/L) θ` substituted,
      `q = (r, θ, s)`, no constraint; its linearization is the paper's 5-state system [37]
      with `x = (r, θ, ṙ, θ̇, i)` (jaxdae orders positions first).

    **Parameters** (SI). Ball and beam: the Michigan CTMS ball-and-beam numbers
    `m = 0.11 kg`, `R = 0.015 m`, `J = 9.99e-6 kg m²`, `d = 0.03 m`, `L = 1.0 m`,
    `g = 9.8 m/s²`; lever length `l = 0.1 m` (our choice; the paper gives no GBB1005
    numbers). Motor: the CTMS "DC motor speed" set reduced to the wheel,
    `J₀ = 0.01 kg m²`, `b₀ = 0.1 N m s`, `K₂ = K₃ = 0.01 N m/A = V s`, `R_a = 1 Ω`,
    `L_a = 0.5 H`, amplifier gain `K₁ = 1`.

    **Equilibrium** [35]: any `r₀` with `θ₀ = α₀ = 0`, `i₀ = (d/L) m g r₀ / K₂`,
    `e₀ = R_a i₀ / K₁` (see `equilibrium_state`).

    **Control:** the voltage is `e = controller(t, q, v)[0]`; the default controller is
    the constant `e = 0`. Close the loop with
    `jaxdae.with_controller(model, jaxdae.LinearFeedback(...))`.
    """

    exact: bool = eqx.field(static=True)
    mass: Array
    radius: Array
    ball_inertia: Array
    lever_radius: Array
    beam_length: Array
    lever_length: Array
    gravity: Array
    motor_inertia: Array
    friction: Array
    amplifier_gain: Array
    torque_constant: Array
    emf_constant: Array
    resistance: Array
    inductance: Array
    controller: AbstractController

    def __init__(
        self,
        exact: bool = True,
        *,
        mass=0.11,
        radius=0.015,
        ball_inertia=9.99e-6,
        lever_radius=0.03,
        beam_length=1.0,
        lever_length=0.1,
        gravity=9.8,
        motor_inertia=0.01,
        friction=0.1,
        amplifier_gain=1.0,
        torque_constant=0.01,
        emf_constant=0.01,
        resistance=1.0,
        inductance=0.5,
        controller: AbstractController | None = None,
    ):
        self.exact = bool(exact)
        f = lambda x: jnp.asarray(x, dtype=float)  # noqa: E731
        self.mass, self.radius, self.ball_inertia = f(mass), f(radius), f(ball_inertia)
        self.lever_radius, self.beam_length = f(lever_radius), f(beam_length)
        self.lever_length, self.gravity = f(lever_length), f(gravity)
        self.motor_inertia, self.friction = f(motor_inertia), f(friction)
        self.amplifier_gain, self.torque_constant = f(amplifier_gain), f(torque_constant)
        self.emf_constant, self.resistance = f(emf_constant), f(resistance)
        self.inductance = f(inductance)
        self.controller = ConstantControl(jnp.zeros(1)) if controller is None else controller

    # -- coordinates ----------------------------------------------------------------------

    @property
    def coordinate_names(self) -> tuple[str, ...]:
        return ("r", "theta", "alpha", "s") if self.exact else ("r", "theta", "s")

    @property
    def dependent(self) -> tuple[int, ...]:
        """The redundant coordinate `α` (exact model) for `jaxdae.RedundantCoordinates`."""
        return (2,) if self.exact else ()

    @property
    def cyclic(self) -> tuple[int, ...]:
        """The charge `s`, a cyclic coordinate."""
        return (3,) if self.exact else (2,)

    @property
    def feedback_indices(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """`(positions, velocities)` of the paper's state `x = (r, θ, ṙ, θ̇, i)`."""
        return ((0, 1), (0, 1, 3)) if self.exact else ((0, 1), (0, 1, 2))

    def _unpack(self, q, v):
        if self.exact:
            r, theta, alpha, _ = q
            dr, dtheta, dalpha, ds = v
        else:
            r, theta, _ = q
            dr, dtheta, ds = v
            ratio = self.lever_radius / self.beam_length
            alpha, dalpha = ratio * theta, ratio * dtheta
        return r, theta, alpha, dr, dtheta, dalpha, ds

    # -- LagrangianSystem -------------------------------------------------------------------

    def kinetic_energy(self, t, q, v):
        r, _, _, dr, dtheta, dalpha, ds = self._unpack(q, v)
        m, rad, jb = self.mass, self.radius, self.ball_inertia
        return 0.5 * (
            m * dr**2
            + m * (r * dalpha) ** 2
            + jb * (dr / rad - dalpha) ** 2
            + self.motor_inertia * dtheta**2
            + self.inductance * ds**2
        )

    def potential_energy(self, t, q):
        r, _, alpha, *_ = self._unpack(q, jnp.zeros_like(q))
        return self.mass * self.gravity * r * jnp.sin(alpha)

    def generalized_forces(self, t, q, v):
        _, _, _, _, dtheta, _, ds = self._unpack(q, v)
        voltage = self.controller(t, q, v)[0]
        torque = self.torque_constant * ds - self.friction * dtheta
        emf = self.amplifier_gain * voltage - self.resistance * ds - self.emf_constant * dtheta
        forces = jnp.zeros_like(q).at[1].set(torque)
        return forces.at[-1].set(emf)

    def constraints(self, t, q):
        if not self.exact:
            return jnp.zeros((0,), q.dtype)
        _, theta, alpha, _ = q
        big, d, lever = self.beam_length, self.lever_radius, self.lever_length
        dx = big * (jnp.cos(alpha) - 1) + d * (1 - jnp.cos(theta))
        dy = big * jnp.sin(alpha) + lever - d * jnp.sin(theta)
        return jnp.array([dx**2 + dy**2 - lever**2])

    # -- helpers ----------------------------------------------------------------------------

    def equilibrium_state(self, r0):
        """Krasinskaya and Krasinskiy (2013) eq. [35]: `(q, v, e)` with the ball at `r0`,
        `θ = α = 0`, `i = i₀`."""
        r0 = jnp.asarray(r0, dtype=float)
        current = self.lever_radius / self.beam_length * self.mass * self.gravity * r0
        current = current / self.torque_constant
        voltage = self.resistance * current / self.amplifier_gain
        n = 4 if self.exact else 3
        q = jnp.zeros(n).at[0].set(r0)
        v = jnp.zeros(n).at[-1].set(current)
        return q, v, jnp.atleast_1d(voltage)

    def alpha_of_theta(self, theta):
        """The beam angle `α(θ)` on the exact four-bar branch through `α = θ = 0`.

        Closed form: `A = (L cos α, L sin α)` lies on the circle of radius `l` about
        `B(θ) = (L − d + d cos θ, −l + d sin θ)` and on the circle of radius `L` about `O`.
        """
        theta = jnp.asarray(theta, dtype=float)
        big, d, lever = self.beam_length, self.lever_radius, self.lever_length
        bx = big - d + d * jnp.cos(theta)
        by = -lever + d * jnp.sin(theta)
        # |A|² = L², |A − B|² = l²  ⇒  A·B = (L² + |B|² − l²)/2 = L |B| cos(α − β).
        norm_b = jnp.sqrt(bx**2 + by**2)
        beta = jnp.arctan2(by, bx)
        cos_gap = (big**2 + norm_b**2 - lever**2) / (2 * big * norm_b)
        return beta + jnp.arccos(jnp.clip(cos_gap, -1.0, 1.0))

    def state(self, r, theta, dr=0.0, dtheta=0.0, current=0.0):
        """A consistent `(q, v)` for the given ball position, wheel angle, rates and current.

        For the exact model `α = α(θ)` and `α̇ = B(α, θ) θ̇` (Krasinskaya and Krasinskiy (2013), §6).
        """
        r, theta = jnp.asarray(r, dtype=float), jnp.asarray(theta, dtype=float)
        dr, dtheta = jnp.asarray(dr, dtype=float), jnp.asarray(dtheta, dtype=float)
        current = jnp.asarray(current, dtype=float)
        if not self.exact:
            return jnp.stack([r, theta, 0.0 * r]), jnp.stack([dr, dtheta, current])
        alpha = self.alpha_of_theta(theta)
        q = jnp.stack([r, theta, alpha, 0.0 * r])
        jac = jnp.squeeze(jax.jacfwd(lambda q_: self.constraints(0.0, q_))(q), 0)
        dalpha = -jac[1] * dtheta / jac[2]
        return q, jnp.stack([dr, dtheta, dalpha, current])
