"""Constrained systems in Hamiltonian form (Shemelova (2016), eqs. [3]–[6])."""

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp

from .._checks import check_instance
from .._compilation._linalg import spd_solve
from .._custom_types import (
    Array,
    Coordinates,
    Float,
    MassMatrix,
    Momenta,
    Scalar,
    ScalarLike,
)
from ._system import (
    AbstractOneSidedWrapper,
    AbstractSystem,
    ConstrainedTerms,
    LagrangianSystem,
    cast_floating,
    derived_terms,
    holonomic_terms,
    nonholonomic_terms,
)


def _spd_inverse(matrix: MassMatrix) -> MassMatrix:
    """Inverse of a symmetric positive definite matrix (one Cholesky factorization, unrolled
    for small matrices: it runs at every stage, and a LAPACK call cannot be fused)."""
    return spd_solve(0.5 * (matrix + matrix.T), jnp.eye(matrix.shape[0], dtype=matrix.dtype))


class HamiltonianSystem(AbstractSystem):
    """A constrained system in Hamiltonian form, state `(q, p)` (Shemelova (2016), eqs. [3]–[6]):

    `q̇ = ∇_p H`,  `ṗ = −∇_q H + Q − Φ_qᵀ κ − Ψ_vᵀ μ`,  `Φ(t, q) = 0`,  `Ψ(t, q, q̇) = 0`.

    Subclass it, declare the physical parameters as fields and override:

    - `hamiltonian(t, q, p)` (required), e.g. `½ pᵀ M⁻¹ p + V`;
    - `generalized_forces(t, q, p)`: non-conservative applied forces `Q` (default 0);
    - `constraints(t, q)`: holonomic `Φ`, shape `(m,)` (default: none);
    - `velocity_constraints(t, q, v)`: nonholonomic `Ψ = A(t, q) v + a(t, q)` in the
        velocities `v = ∇_p H`, shape `(k,)` (default: none).

    Pass the initial *momenta* to [`jaxdae.simulate`][] (`simulate(system, formulation, t0,
    t1, q0, p0)`); the [`jaxdae.Solution`][] holds `p` and the velocities `v = ∇_p H`.

    Every formulation applies unchanged: with `M = (∂²H/∂p²)⁻¹` and
    `w = ∂(∇_p H)/∂t + ∂(∇_p H)/∂q · q̇` (the part of `q̈` that does not come from `ṗ`),
    `q̈ = M⁻¹ ṗ + w`, so the equations are `M q̈ = (Q − ∇_q H + M w) − Gᵀλ` with
    `G = [Φ_q; Ψ_v]` — the form [`jaxdae.ConstrainedTerms`][] describes. The formulation's
    stabilization (`Φ̈ + K_D Φ̇ + K_P Φ = 0`, `Ψ̇ + K_V Ψ = 0`, or a
    [`jaxdae.CoupledPerturbation`][]) is the paper's constraint-perturbation equation, and
    `ṗ = M (q̈ − w) = Q − ∇_q H − Gᵀλ`.

    `∂²H/∂p²` must be positive definite (as for every mechanical Hamiltonian).
    """

    state_is_velocity: ClassVar[bool] = False
    terms_from_constraints: ClassVar[bool] = True

    @abc.abstractmethod
    def hamiltonian(self, t: ScalarLike, q: Coordinates, p: Momenta) -> Scalar:
        """`H(t, q, p)`."""

    def generalized_forces(self, t: ScalarLike, q: Coordinates, p: Momenta) -> Float[Array, " n"]:
        """Non-conservative applied generalized forces `Q(t, q, p)`. Default: 0."""
        return jnp.zeros_like(q)

    # -- derived by autodiff -----------------------------------------------------------

    def _dh_dp(self, t, q, p):
        return jax.grad(self.hamiltonian, argnums=2)(t, q, p)

    def _drift(self, t, q, p, v):
        """`w = d/ds ∇_p H(t + s, q + s v, p)|₀`: `q̈ = H_pp ṗ + w`."""
        _, w = jax.jvp(lambda t_, q_: self._dh_dp(t_, q_, p), (t, q), (jnp.ones_like(t), v))
        return w

    def velocities(self, t, q, p):
        """`q̇ = ∇_p H(t, q, p)`."""
        return self._dh_dp(t, q, p)

    def momenta(self, t, q, p):
        return p

    def energy(self, t, q, p):
        """The Hamiltonian `H` (the energy `T + V` for a natural system)."""
        return self.hamiltonian(t, q, p)

    def terms(self, t, q, p) -> ConstrainedTerms:
        hamiltonian = self.hamiltonian(t, q, p)
        if jnp.shape(hamiltonian) != ():
            raise ValueError("`hamiltonian` must return a scalar (shape ()).")
        v = cast_floating(self._dh_dp(t, q, p), q.dtype)
        mass = _spd_inverse(jax.jacfwd(self._dh_dp, argnums=2)(t, q, p))
        forces = (
            self.generalized_forces(t, q, p)
            - jax.grad(self.hamiltonian, argnums=1)(t, q, p)
            + mass @ self._drift(t, q, p, v)
        )
        phi, dphi, jac_phi, gamma = holonomic_terms(self.constraints, t, q, v)
        psi, jac_psi, psi_rate = nonholonomic_terms(self.velocity_constraints, t, q, v)
        jacobian = jnp.concatenate([jac_phi, jac_psi], axis=0)
        bias = jnp.concatenate([gamma, -psi_rate])
        return derived_terms(
            self,
            (mass, forces, phi, dphi, psi, jacobian, bias),
            hamiltonian,
            p,
            q.dtype,
            HamiltonianSystem,
        )

    def state_rate(self, t, q, p, terms, acceleration):
        """`ṗ = M (q̈ − w)`, which equals `Q − ∇_q H − Gᵀλ` (Shemelova (2016), eq. [5])."""
        v = self._dh_dp(t, q, p)
        return terms.mass_matrix @ (acceleration - self._drift(t, q, p, v))


class HamiltonianForm(HamiltonianSystem, AbstractOneSidedWrapper):
    """The Hamiltonian form of a [`jaxdae.LagrangianSystem`][], by a Legendre transform.

    `p = ∂T/∂v`, `H(t, q, p) = pᵀv − L(t, q, v)` at `v = M⁻¹ (p − ∂T/∂v|_{v=0})`, exact for
    kinetic energies quadratic in `v` (every `LagrangianSystem`: its mass matrix does not
    depend on `v`). Forces and constraints are the Lagrangian system's, evaluated at that `v`.
    Both forms give the same trajectory (Shemelova (2016): eqs. [1]–[2] vs [3]–[6]); start this one
    from `p0 = system.momenta(t0, q0, v0)`.

    **Arguments:**

    - `lagrangian`: the [`jaxdae.LagrangianSystem`][] to transform.

    !!! Example

        ```python
        hamiltonian = jaxdae.HamiltonianForm(pendulum)
        p0 = pendulum.momenta(0.0, q0, v0)
        sol = jaxdae.simulate(hamiltonian, jaxdae.Baumgarte(20.0, 100.0), 0.0, 1.0, q0, p0)
        ```
    """

    lagrangian: LagrangianSystem

    def __check_init__(self):
        check_instance(
            "lagrangian",
            self.lagrangian,
            LagrangianSystem,
            "a `jaxdae.LagrangianSystem` (`HamiltonianForm` transforms one)",
        )

    def velocity_from_momenta(self, t, q, p):
        """`v` with `∂T/∂v (t, q, v) = p`."""
        lag = self.lagrangian
        offset = jax.grad(lag.kinetic_energy, argnums=2)(t, q, jnp.zeros_like(p))
        mass = lag.mass_matrix(t, q)
        return _spd_inverse(mass) @ (p - offset)

    def hamiltonian(self, t, q, p):
        lag = self.lagrangian
        v = self.velocity_from_momenta(t, q, p)
        return p @ v - lag.kinetic_energy(t, q, v) + lag.potential_energy(t, q)

    def generalized_forces(self, t, q, p):
        return self.lagrangian.generalized_forces(t, q, self.velocity_from_momenta(t, q, p))

    def constraints(self, t, q):
        return self.lagrangian.constraints(t, q)

    def velocity_constraints(self, t, q, v):
        return self.lagrangian.velocity_constraints(t, q, v)

    @property
    def wrapped_system(self):
        return self.lagrangian
