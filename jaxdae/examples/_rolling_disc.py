"""A thin uniform disc (a coin) rolling on the ground in space, and the classic reduced
equations it is checked against."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, ArrayLikeOrSequence, Float
from ..multibody import Gravity, Mechanism, PlaneContact, RigidBody, rotation_matrix
from ..multibody._kinematics import quaternion_from_matrix


class RollingDisc(eqx.Module):
    """A thin uniform disc of `radius` and `mass` (moments `J = ¼ m r²` about a diameter,
    `I = 2J` about its axis) on the ground `z = 0` under gravity `g`, touching it at the
    lowest point of its rim ([`jaxdae.multibody.PlaneContact`][] with an `axis`) with
    Coulomb's `friction`: a spatial [`jaxdae.multibody.Mechanism`][] of one free body
    whose axis is its body `y`.

    Its orientation is MotionGenesis' "Rolling disk" (Kane's method): heading `q_H` about
    `z`, lean `q_L` (the disc's plane from the vertical, a turn by `−q_L` about the heading
    frame's `x`, the rolling direction) and spin `q_S` about the disc's axis, and the
    angular velocity `ω = w_x c_x + w_y c_y + w_z c_z` in the lean frame `C` (`c_y` the
    axis, `c_z` from the contact point to the centre). Rolling without slipping, the
    reduced equations are [`reduced_rates`][jaxdae.examples.RollingDisc.reduced_rates]
    (Newton–Euler about the centre with the contact force eliminated; O'Reilly, "The
    dynamics of rolling disks and sliding disks", Nonlinear Dynamics 10 (1996) 287–305,
    and MotionGenesis' example, `r = 0.343 m`, `m = 2 kg`, `g = 9.8 m/s²`, the
    defaults here).

    **Arguments:**

    - `radius`, `mass`, `gravity`: `r`, `m`, `g`.
    - `friction`: Coulomb's coefficient `μ` at the contact (default 1: it rolls).
    """

    radius: Float[Array, ""]
    mass: Float[Array, ""]
    gravity: Float[Array, ""]
    friction: Float[Array, ""]

    def __init__(
        self,
        radius: ArrayLike = 0.343,
        mass: ArrayLike = 2.0,
        gravity: ArrayLike = 9.8,
        friction: ArrayLike = 1.0,
    ):
        self.radius, self.mass, self.gravity, self.friction = (
            jnp.asarray(x, float) for x in (radius, mass, gravity, friction)
        )

    def mechanism(self) -> Mechanism:
        """The coin as a free rigid body with the rim contact."""
        moment = 0.25 * self.mass * self.radius**2
        return Mechanism(
            bodies=[
                RigidBody(
                    "coin",
                    mass=self.mass,
                    inertia=jnp.stack([moment, 2 * moment, moment]),
                    position=(0.0, 0.0, 0.343),
                )
            ],
            forces=[Gravity(jnp.stack([0.0, 0.0, -self.gravity]))],
            stops=[
                PlaneContact(
                    "coin", radius=self.radius, axis=(0.0, 1.0, 0.0), friction=self.friction
                )
            ],
        )

    def state(
        self,
        angles: ArrayLikeOrSequence,
        spin: ArrayLikeOrSequence,
        contact: ArrayLikeOrSequence = (0.0, 0.0),
    ) -> tuple[Float[Array, "7"], Float[Array, "7"]]:
        """The mechanism's `(q, v)` of the coin touching the ground at `contact` `(x, y)`
        with `angles` `(q_H, q_L, q_S)` and angular velocity `spin` `(w_x, w_y, w_z)` in
        the lean frame, rolling (its contact point at rest)."""
        heading, lean, turn = (jnp.asarray(a, float) for a in angles)
        lean_frame = rotation_matrix((0.0, 0.0, 1.0), heading) @ rotation_matrix(
            (1.0, 0.0, 0.0), -lean
        )
        rotation = lean_frame @ rotation_matrix((0.0, 1.0, 0.0), turn)
        centre = jnp.concatenate([jnp.asarray(contact, float), jnp.zeros(1)])
        centre = centre + self.radius * lean_frame[:, 2]
        omega = lean_frame @ jnp.asarray(spin, float)
        velocity = jnp.cross(omega, self.radius * lean_frame[:, 2])
        p = quaternion_from_matrix(rotation)
        rate = 0.5 * jnp.concatenate(
            [-(p[1:] @ omega)[None], p[0] * omega + jnp.cross(omega, p[1:])]
        )
        return jnp.concatenate([centre, p]), jnp.concatenate([velocity, rate])

    def reduced_state(
        self, mechanism: Mechanism, q: Float[Array, "*b 7"], v: Float[Array, "*b 7"]
    ) -> Float[Array, "*b 8"]:
        """The mechanism's states `(q, v)` as `y = (q_H, q_L, q_S, w_x, w_y, w_z, x, y)` of
        [`reduced_rates`][jaxdae.examples.RollingDisc.reduced_rates] (the angles `q_H`,
        `q_S` in `(−π, π]`, `(x, y)` the contact point)."""
        rotation = mechanism.marker_rotation(q, "coin")
        omega = mechanism.angular_velocity(q, v, "coin")
        axis = rotation[..., :, 1]
        lean = -jnp.arcsin(axis[..., 2])
        across = jnp.stack([axis[..., 1], -axis[..., 0]], axis=-1)  # c_x cos q_L = a × e_z
        heading = jnp.arctan2(across[..., 1], across[..., 0])
        c_x = jnp.concatenate([across / jnp.cos(lean)[..., None], 0 * lean[..., None]], -1)
        c_z = jnp.cross(c_x, axis)
        turn = jnp.arctan2(
            -(rotation[..., :, 0] * c_z).sum(-1), (rotation[..., :, 0] * c_x).sum(-1)
        )
        contact = q[..., :3] - self.radius * c_z
        return jnp.stack(
            [heading, lean, turn, *((omega * c).sum(-1) for c in (c_x, axis, c_z))]
            + [contact[..., 0], contact[..., 1]],
            axis=-1,
        )

    @staticmethod
    def angle_rates(y):
        """`(q̇_H, q̇_S)`, the heading and spin rates of reduced states `y` (`(..., 8)`):
        `q̇_H = w_z / cos q_L`, `q̇_S = w_y + tan q_L w_z`."""
        lean, w_y, w_z = y[..., 1], y[..., 4], y[..., 5]
        return w_z / np.cos(lean), w_y + np.tan(lean) * w_z

    def reduced_rates(self, y: Float[np.ndarray, "8"]) -> Float[np.ndarray, "8"]:
        """The rates of `y = (q_H, q_L, q_S, w_x, w_y, w_z, x, y)` of the coin rolling
        without slipping (NumPy, for `scipy.integrate.solve_ivp`): `q̇_L = −w_x`,
        `q̇_H = w_z / cos q_L`, `q̇_S = w_y + tan q_L w_z`, the contact point moving at
        `r q̇_S` along the heading, and `ẇ` from Euler's equations about the centre,
        `J_c ẇ + Ω × J_c ω = −r c_z × F`, `F = m (a − g)` the contact force,
        `Ω = (w_x, −tan q_L w_z, w_z)` the lean frame's angular velocity and `a` the
        centre's acceleration (its velocity `ω × r c_z`)."""
        return self._rolling(y)[0]

    def contact_force(self, y: Float[np.ndarray, "8"]) -> tuple[float, float]:
        """`(λ_N, |λ_T|)`: the normal and tangential contact force that rolling needs at
        `y` (as `reduced_rates`); it rolls without slipping while `|λ_T| ≤ μ λ_N`."""
        force, vertical = self._rolling(y)[1:]
        normal = force @ vertical
        return float(normal), float(np.linalg.norm(force - normal * vertical))

    def _rolling(self, y):
        r, m, g = (float(x) for x in (self.radius, self.mass, self.gravity))
        heading, lean, _, w_x, w_y, w_z = y[:6]
        inertia = 0.25 * m * r**2 * np.array([1.0, 2.0, 1.0])
        omega = np.array([w_x, w_y, w_z])
        frame = np.array([w_x, -np.tan(lean) * w_z, w_z])
        centre = np.array([0.0, 0.0, r])
        vertical = np.array([0.0, -np.sin(lean), np.cos(lean)])  # e_z in the lean frame

        def residual(rate):
            velocity = np.cross(omega, centre)
            acceleration = np.cross(rate, centre) + np.cross(frame, velocity)
            force = m * (acceleration + g * vertical)
            return (
                inertia * rate + np.cross(frame, inertia * omega) + np.cross(centre, force),
                force,
            )

        offset = residual(np.zeros(3))[0]
        matrix = np.stack([residual(e)[0] - offset for e in np.eye(3)], axis=1)
        rate = np.linalg.solve(matrix, -offset)
        spin = w_y + np.tan(lean) * w_z
        rates = np.concatenate(
            [
                [w_z / np.cos(lean), -w_x, spin],
                rate,
                [r * spin * np.cos(heading), r * spin * np.sin(heading)],
            ]
        )
        return rates, residual(rate)[1], vertical

    def steady_spin(self, lean, precession):
        """`w_y` of steady rolling at constant `lean` and heading rate `precession`, the
        reduced equations' equilibrium (`w_x = 0`, `ẇ = 0`):
        `g sin q_L / r = ¼ tan q_L w_z² + (3/2) w_y w_z`, `w_z = q̇_H cos q_L`
        (O'Reilly 1996)."""
        r, g = self.radius, self.gravity
        w_z = precession * jnp.cos(lean)
        return (g * jnp.sin(lean) / r - 0.25 * jnp.tan(lean) * w_z**2) / (1.5 * w_z)

    def critical_speed(self):
        """The speed above which straight upright rolling is stable, `v² = g r / 3` for a
        thin uniform disc (O'Reilly 1996): below it the linearized reduced equations
        have an eigenvalue with positive real part and the coin falls over."""
        return jnp.sqrt(self.gravity * self.radius / 3)
