"""The abstract formulation and the linear algebra shared by its implementations."""

import abc

import equinox as eqx
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._custom_types import Array, Bool, Float
from .._gains import apply_gain
from .._solution import RESULTS
from .._compilation._linalg import (
    extreme_eigenvalues,
    psd_pseudo_solve,
    spd_operator,
    small_matmul,
    spd_solve,
)
from .._systems._system import ConstrainedTerms


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

    def failure(
        self, terms: ConstrainedTerms, reference
    ) -> Bool[Array, ""] | Float[Array, ""]:
        """True where the formulation cannot continue (checked at the end of every step).

        `reference` is `failure_reference` at the initial state. May instead return a real
        value: the solve then stops where it changes sign between two steps (a diffrax
        `Event` condition), which also catches a singular configuration stepped over
        between step ends.
        """
        return jnp.array(False)

    def failure_reference(self, terms: ConstrainedTerms):
        """What `failure` compares with, evaluated once at the initial state (a scale that
        makes its test relative). Default: `None`."""
        return None

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

    @property
    def state_messages(self) -> tuple[tuple[str, str], ...]:
        """`(message, name of the value it quotes)` for each flag of `state_problems`."""
        return ()

    def state_problems(
        self, system, t0, q0: Float[Array, " n"], v0: Float[Array, " n"]
    ) -> tuple[Bool[Array, " k"], Float[Array, " k"]]:
        """What is wrong with the initial state for this formulation: `(flags, values)`,
        with `flags[i]` true where `state_messages[i]` applies and `values[i]` the value it
        quotes. Array code only: `simulate` evaluates it eagerly (a `ValueError`), traced
        (with its other input checks) and row by row for ensembles. Default: nothing.
        """
        return jnp.zeros(0, bool), jnp.zeros(0, jnp.result_type(q0))


class AbstractExactMultipliers(AbstractFormulation):
    """Formulations whose multipliers solve `(G M⁻¹ Gᵀ) λ = G M⁻¹ Q − s` exactly
    (paper 004, eq. [21]): they cannot continue where `G M⁻¹ Gᵀ` is singular, so the solve stops
    with `RESULTS.singular_constraint_matrix` when its smallest eigenvalue falls below `rcond`
    (default `sqrt(eps)` of the state's dtype) times the larger of its largest eigenvalue now
    and at the initial state. The second makes the test relative also where the whole
    matrix vanishes, e.g. a single constraint whose gradient vanishes (`G M⁻¹ Gᵀ` is
    1 × 1, so its own condition number is always 1).
    """

    rcond: eqx.AbstractVar[float | None]

    def failure_reference(self, terms):
        """The largest eigenvalue of `G M⁻¹ Gᵀ` at the initial state."""
        matrix = constraint_matrix(terms)
        return extreme_eigenvalues(matrix)[1] if matrix.shape[0] else None

    def failure(self, terms, initial_largest):
        matrix = constraint_matrix(terms)
        if matrix.shape[0] == 0:
            return jnp.array(False)
        smallest, largest = extreme_eigenvalues(matrix)
        tol = default_rcond(self.rcond, matrix.dtype)
        return smallest <= tol * jnp.maximum(largest, initial_largest)

    @property
    def can_fail(self):
        return True


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


def second_order_matrix(
    stiffness: Float[Array, "m m"], damping: Float[Array, "m m"]
) -> Float[Array, "2m 2m"]:
    """`H = [[0, I], [−K_P, −K_D]]` of `d/dt (Φ, Φ̇) = H (Φ, Φ̇)` (paper 002, eq. [0.11])."""
    m = stiffness.shape[0]
    eye = jnp.eye(m, dtype=stiffness.dtype)
    return jnp.block([[jnp.zeros_like(eye), eye], [-stiffness, -damping]])


def _mass_solve(terms: ConstrainedTerms):
    """`M⁻¹ Q` and `M⁻¹ Gᵀ` from one Cholesky factorization of `M`."""
    rhs = jnp.concatenate([terms.forces[:, None], terms.jacobian.T], axis=1)
    sol = spd_solve(terms.mass_matrix, rhs)
    return sol[:, 0], sol[:, 1:]


def constraint_matrix(terms: ConstrainedTerms) -> Float[Array, "c c"]:
    """`G M⁻¹ Gᵀ` (paper 004's `A = J M⁻¹ Jᵀ`, extended to nonholonomic rows)."""
    _, minv_gt = _mass_solve(terms)
    return small_matmul(terms.jacobian, minv_gt)


def multiplier_solve(
    terms: ConstrainedTerms, target: Float[Array, " c"], solver: lx.AbstractLinearSolver
):
    """Solves `M q̈ + Gᵀλ = Q`, `G q̈ = target` by eliminating `q̈` (paper 004 eqs. [6], [21]).

    `λ = A⁻¹ (G M⁻¹ Q − target)` with `A = G M⁻¹ Gᵀ`; `solver` decides what `A⁻¹` means
    (Cholesky for independent constraints, an SVD pseudo-inverse for redundant ones).
    """
    minv_q, minv_gt = _mass_solve(terms)
    g = terms.jacobian
    a_matrix = small_matmul(g, minv_gt)
    a_matrix = 0.5 * (a_matrix + a_matrix.T)
    rhs = small_matmul(g, minv_q) - target
    if isinstance(solver, lx.Cholesky):
        lam = spd_solve(a_matrix, rhs)
    elif isinstance(solver, lx.SVD):
        lam = psd_pseudo_solve(a_matrix, rhs, default_rcond(solver.rcond, a_matrix.dtype))
    else:
        lam = lx.linear_solve(spd_operator(a_matrix), rhs, solver, throw=False).value
    return minv_q - small_matmul(minv_gt, lam), lam


def default_rcond(rcond: float | None, dtype) -> float:
    """`sqrt(machine epsilon)` of `dtype` unless given."""
    return float(np.sqrt(np.finfo(dtype).eps)) if rcond is None else rcond
