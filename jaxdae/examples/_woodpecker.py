"""Glocker's woodpecker toy: impacts and Coulomb friction in a self-sustained cycle."""

import jax.numpy as jnp

from .._custom_types import Array
from .._systems._system import LagrangianSystem
from ._parameters import parameter


class WoodpeckerToy(LagrangianSystem):
    """The woodpecker toy of Glocker (1995) and Leine, Glocker and van Campen (2003), a
    classic benchmark of nonsmooth mechanics: a sleeve (mass `m_M`, inertia `J_M`) with a
    little clearance on a vertical pole, and a bird (mass `m_S`, inertia `J_S`) on a
    spiral spring `c_φ` from the sleeve. Coordinates `q = (y, φ_M, φ_S)`: the sleeve's
    height and the angles of the sleeve and of the bird (the model is linearized in the
    small angles, as published).

    Three contacts, each with Coulomb friction `μ` against the pole:

    - the beak hits the pole, `g₁ = l_M + l_G − l_S − r_0 − h_S φ_S ≥ 0`, with Newton's
        coefficient `e₁ = 0.5`; it slides at `ẏ + l_M φ̇_M + (l_G − l_S) φ̇_S`;
    - the sleeve jams against the pole at its lower or upper edge, `g₂,₃ = r_M − r_0 ±
        h_M φ_M ≥ 0`, plastic; they slide at `ẏ + r_M φ̇_M`.

    Set swinging, the toy settles into a periodic motion in which the sleeve jams and
    slips down the pole in steps while the beak pecks. The published cycle passes through
    [`published_state`][jaxdae.examples.WoodpeckerToy.published_state].
    """

    sleeve_mass: Array = parameter(0.0003)
    sleeve_inertia: Array = parameter(5.0e-9)
    bird_mass: Array = parameter(0.0045)
    bird_inertia: Array = parameter(7.0e-7)
    spring: Array = parameter(0.0056)
    gravity: Array = parameter(9.81)
    pole_radius: Array = parameter(0.0025)
    sleeve_radius: Array = parameter(0.0031)
    sleeve_height: Array = parameter(0.0058)
    hinge_offset: Array = parameter(0.010)
    bird_centre: Array = parameter(0.015)
    beak_height: Array = parameter(0.020)
    beak_reach: Array = parameter(0.0201)
    friction_coefficient: Array = parameter(0.3)
    beak_restitution: Array = parameter(0.5)

    def mass_matrix(self, t, q):
        m_s, l_m, l_g = self.bird_mass, self.hinge_offset, self.bird_centre
        total = self.sleeve_mass + m_s
        return jnp.stack(
            [
                jnp.stack([total, m_s * l_m, m_s * l_g]),
                jnp.stack([m_s * l_m, self.sleeve_inertia + m_s * l_m**2, m_s * l_m * l_g]),
                jnp.stack([m_s * l_g, m_s * l_m * l_g, self.bird_inertia + m_s * l_g**2]),
            ]
        )

    def potential_energy(self, t, q):
        y, sleeve, bird = q
        m_s = self.bird_mass
        return (
            (self.sleeve_mass + m_s) * self.gravity * y
            + m_s * self.gravity * (self.hinge_offset * sleeve + self.bird_centre * bird)
            + 0.5 * self.spring * (sleeve - bird) ** 2
        )

    def gaps(self, t, q):
        _, sleeve, bird = q
        clearance = self.sleeve_radius - self.pole_radius
        beak = (
            self.hinge_offset
            + self.bird_centre
            - self.beak_reach
            - self.pole_radius
            - self.beak_height * bird
        )
        return jnp.stack(
            [beak, clearance + self.sleeve_height * sleeve, clearance - self.sleeve_height * sleeve]
        )

    def restitution(self):
        zero = jnp.zeros_like(self.beak_restitution)
        return jnp.stack([self.beak_restitution, zero, zero])

    def friction(self):
        return self.friction_coefficient

    def slip_velocities(self, t, q, v):
        y_rate, sleeve_rate, bird_rate = v
        beak = (
            y_rate
            + self.hinge_offset * sleeve_rate
            + (self.bird_centre - self.beak_reach) * bird_rate
        )
        sleeve = y_rate + self.sleeve_radius * sleeve_rate
        return jnp.stack([beak, sleeve, sleeve])

    def published_state(self):
        """`(q, v)` on the published periodic motion: the sleeve jammed at its lower edge
        (`φ_M` at the contact, `−0.1036` rounded in the source) and sliding down at
        `ẏ = −0.3411` m/s, the bird at `φ_S = −0.2788` rad swinging at `−7.4583` rad/s."""
        jammed = -(self.sleeve_radius - self.pole_radius) / self.sleeve_height
        return (
            jnp.stack([jnp.zeros_like(jammed), jammed, jnp.asarray(-0.2788, jammed.dtype)]),
            jnp.array([-0.3411, 0.0, -7.4583], jammed.dtype),
        )
