"""Shemelova's (2016) example: a two-link arm of point masses in Cartesian coordinates."""

import jax.numpy as jnp

from .._custom_types import Array
from .._formulations import CoupledPerturbation
from .._systems._hamiltonian import HamiltonianSystem
from .._systems._system import LagrangianSystem
from ._parameters import parameter


def _lengths(q, l1, l2):
    return jnp.array(
        [q[0] ** 2 + q[1] ** 2 - l1**2, (q[2] - q[0]) ** 2 + (q[3] - q[1]) ** 2 - l2**2]
    )


class CartesianArm(HamiltonianSystem):
    """Two-link robot arm, Hamiltonian form (Shemelova (2016), Fig. 1 and eqs. [3]–[6]).

    Point masses `m1` at `(q1, q2)` and `m2` at `(q3, q4)`, momenta `p1..p4`,
    `H = T = (p1² + p2²)/(2 m1) + (p3² + p4²)/(2 m2)`, `V = 0`, no dissipation, applied
    generalized forces `Q = P` (a constant vector, `forces`). The two link lengths are the
    holonomic constraints `y1 = q1² + q2² − l1²`, `y2 = (q3 − q1)² + (q4 − q2)² − l2²`.
    The paper's perturbation equations `ÿ1 = c1 y1 + c2 ẏ1`, `ÿ2 = c3 y2 + c4 ẏ2` are
    [`jaxdae.CoupledPerturbation`][]`(k10=diag(c1, c3), k11=diag(c2, c4))`, i.e.
    [`jaxdae.Baumgarte`][]`(kd=(−c2, −c4), kp=(−c1, −c3))`; see
    [`jaxdae.examples.CartesianArm.paper_formulation`][].
    """

    masses: Array = parameter((1.0, 1.0))
    lengths: Array = parameter((1.0, 0.8))
    forces: Array = parameter((0.0, 0.0, 0.0, 0.0))

    def hamiltonian(self, t, q, p):
        m1, m2 = self.masses
        return (p[0] ** 2 + p[1] ** 2) / (2 * m1) + (p[2] ** 2 + p[3] ** 2) / (2 * m2)

    def generalized_forces(self, t, q, p):
        return self.forces.astype(q.dtype)

    def constraints(self, t, q):
        return _lengths(q, *self.lengths)

    @staticmethod
    def paper_formulation(c1, c2, c3, c4):
        """The formulation enforcing `ÿ1 = c1 y1 + c2 ẏ1`, `ÿ2 = c3 y2 + c4 ẏ2` (stable for
        `c1, c2, c3, c4 < 0`): `CoupledPerturbation(k10=diag(c1, c3), k11=diag(c2, c4))`."""
        return CoupledPerturbation(k10=jnp.array([c1, c3]), k11=jnp.array([c2, c4]))

    def initial_state(self, angles=(0.3, 1.1), rates=(1.0, -0.5)):
        """A consistent state from the two absolute link angles and their rates: `(q, p)`."""
        q, (v1, v2) = _consistent_state(self.lengths, angles, rates)
        m1, m2 = self.masses
        return q, jnp.concatenate([m1 * v1, m2 * v2])


class CartesianArmLagrangian(LagrangianSystem):
    """The same arm as [`jaxdae.examples.CartesianArm`][] in Lagrangian form (Shemelova (2016), eq.
    [1]): `T = ½ m1 (q̇1² + q̇2²) + ½ m2 (q̇3² + q̇4²)`, same constraints and forces."""

    masses: Array = parameter((1.0, 1.0))
    lengths: Array = parameter((1.0, 0.8))
    forces: Array = parameter((0.0, 0.0, 0.0, 0.0))

    def kinetic_energy(self, t, q, v):
        m1, m2 = self.masses
        return 0.5 * m1 * (v[0] ** 2 + v[1] ** 2) + 0.5 * m2 * (v[2] ** 2 + v[3] ** 2)

    def generalized_forces(self, t, q, v):
        return self.forces.astype(q.dtype)

    def constraints(self, t, q):
        return _lengths(q, *self.lengths)

    def initial_state(self, angles=(0.3, 1.1), rates=(1.0, -0.5)):
        """A consistent state from the two absolute link angles and their rates: `(q, v)`."""
        q, (v1, v2) = _consistent_state(self.lengths, angles, rates)
        return q, jnp.concatenate([v1, v2])


def _consistent_state(lengths, angles, rates):
    """The joints' positions `q` and the two joints' velocities `(v1, v2)` of the arm at
    the absolute link `angles` turning at `rates`."""
    a = jnp.asarray(angles, dtype=float)
    w = jnp.asarray(rates, dtype=float)
    l1, l2 = lengths
    e1, e2 = jnp.array([jnp.cos(a[0]), jnp.sin(a[0])]), jnp.array([jnp.cos(a[1]), jnp.sin(a[1])])
    n1, n2 = jnp.array([-jnp.sin(a[0]), jnp.cos(a[0])]), jnp.array([-jnp.sin(a[1]), jnp.cos(a[1])])
    v1 = l1 * w[0] * n1
    return jnp.concatenate([l1 * e1, l1 * e1 + l2 * e2]), (v1, v1 + l2 * w[1] * n2)
