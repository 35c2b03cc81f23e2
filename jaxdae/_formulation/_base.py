"""The abstract formulation and the linear algebra shared by its implementations."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._custom_types import Array, Bool, Float
from .._gains import apply_gain
from .._solution import RESULTS
from .._system import ConstrainedTerms


class AbstractFormulation(eqx.Module):
    """Turns the constrained equations of motion into an ODE `q̈ = a(t, q, v)`.

    A formulation decides how the multipliers are computed (exact Lagrange multipliers,
    a pseudo-inverse, a penalty) and how constraint violations are fed back
    (Baumgarte-type gains). Gains are array fields, so `eqx.filter_grad` reaches them.
    """

    @abc.abstractmethod
    def accelerations(
        self, terms: ConstrainedTerms
    ) -> tuple[Float[Array, " n"], Float[Array, " c"]]:
        """Returns `(q̈, multipliers)` with `M q̈ = Q − Gᵀ multipliers`."""

    @abc.abstractmethod
    def validate(self, num_holonomic: int, num_nonholonomic: int) -> "AbstractFormulation":
        """Checks the gains against the system's constraint counts and values.

        Shapes raise `ValueError`; values raise `ValueError` when concrete and are wrapped
        in `eqx.error_if` when traced. Returns the (possibly wrapped) formulation.
        """

    def check_values(self) -> None:
        """Eager checks of concrete gain values (`ValueError`); called by `simulate`."""

    def failure(self, terms: ConstrainedTerms) -> Bool[Array, ""] | Float[Array, ""]:
        """True where the formulation cannot continue (checked at the end of every step).

        May instead return a real value: the solve then stops where it changes sign
        between two steps (a diffrax `Event` condition), which also catches a singular
        configuration stepped over between step ends.
        """
        return jnp.array(False)

    @property
    def can_fail(self) -> bool:
        """Whether `failure` needs checking during the solve."""
        return False

    @property
    def failure_result(self) -> RESULTS:
        """The [`jaxdae.RESULTS`][] item reported when `failure` stops the solve."""
        return RESULTS.singular_constraint_matrix

    def velocities(self, system, t, q: Float[Array, " n"], v: Float[Array, " n"]):
        """The velocities `q̇` the formulation implies at the state `(q, v)`.

        Default: `v` itself. A formulation that integrates fewer velocities (e.g.
        [`jaxdae.RedundantCoordinates`][], whose dependent velocities follow from the
        independent ones) overrides it; `simulate` integrates `q̇` = this and reports it.
        """
        return v

    def check_state(self, system, t0, q0: Float[Array, " n"], v0: Float[Array, " n"]):
        """Checks the initial state for this formulation; returns `q0`.

        Raises `ValueError` when the values are concrete, wraps `q0` in `eqx.error_if`
        when traced. Default: no check.
        """
        return q0


def baumgarte_target(
    terms: ConstrainedTerms, kd, kp, kv
) -> Float[Array, " c"]:
    """Right-hand side `s` of `G q̈ = s` that enforces paper 004 eq. [16] and paper 002 eq. [0.7].

    `Φ̈ + K_D Φ̇ + K_P Φ = 0` and `Ψ̇ + K_V Ψ = 0` with `Φ̈ = J q̈ − γ`, `Ψ̇ = A q̈ − bias_Ψ`, so
    `s = bias + [−K_D Φ̇ − K_P Φ; −K_V Ψ]` (paper 004 eq. [20]).
    """
    feedback = jnp.concatenate(
        [
            -apply_gain(kd, terms.dphi) - apply_gain(kp, terms.phi),
            -apply_gain(kv, terms.psi),
        ]
    )
    return terms.bias + feedback


def _spd(matrix) -> lx.MatrixLinearOperator:
    return lx.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)


def _mass_solve(terms: ConstrainedTerms):
    """`M⁻¹ Q` and `M⁻¹ Gᵀ` from one Cholesky factorization of `M`."""
    rhs = jnp.concatenate([terms.forces[:, None], terms.jacobian.T], axis=1)
    solver = lx.Cholesky()
    state = solver.init(_spd(terms.mass_matrix), options={})
    solve = lambda b: lx.linear_solve(  # noqa: E731
        _spd(terms.mass_matrix), b, solver, state=state, throw=False
    ).value
    sol = jax.vmap(solve, in_axes=1, out_axes=1)(rhs)
    return sol[:, 0], sol[:, 1:]


def constraint_matrix(terms: ConstrainedTerms) -> Float[Array, "c c"]:
    """`G M⁻¹ Gᵀ` (paper 004's `A = J M⁻¹ Jᵀ`, extended to nonholonomic rows)."""
    _, minv_gt = _mass_solve(terms)
    return terms.jacobian @ minv_gt


def multiplier_solve(
    terms: ConstrainedTerms, target: Float[Array, " c"], solver: lx.AbstractLinearSolver
):
    """Solves `M q̈ + Gᵀλ = Q`, `G q̈ = target` by eliminating `q̈` (paper 004 eqs. [6], [21]).

    `λ = A⁻¹ (G M⁻¹ Q − target)` with `A = G M⁻¹ Gᵀ`; `solver` decides what `A⁻¹` means
    (Cholesky for independent constraints, an SVD pseudo-inverse for redundant ones).
    """
    minv_q, minv_gt = _mass_solve(terms)
    g = terms.jacobian
    a_matrix = g @ minv_gt
    a_matrix = 0.5 * (a_matrix + a_matrix.T)
    lam = lx.linear_solve(_spd(a_matrix), g @ minv_q - target, solver, throw=False).value
    return minv_q - minv_gt @ lam, lam


def reciprocal_condition(matrix: Float[Array, "c c"]) -> Float[Array, ""]:
    """`λ_min / λ_max` of a symmetric positive semidefinite matrix (1 for an empty one)."""
    if matrix.shape[0] == 0:
        return jnp.ones((), matrix.dtype)
    eig = jnp.linalg.eigvalsh(matrix)
    return eig[0] / jnp.maximum(eig[-1], jnp.finfo(matrix.dtype).tiny)


def default_rcond(rcond: float | None, dtype) -> float:
    """`sqrt(machine epsilon)` of `dtype` unless given."""
    return float(np.sqrt(np.finfo(dtype).eps)) if rcond is None else rcond
