"""The abstract formulation and the linear algebra shared by its implementations."""

import abc
import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._custom_types import Array, Bool, Float
from .._gains import apply_gain
from .._solution import RESULTS
from .._compilation._linalg import extreme_eigenvalues, small_matmul, spd_solve
from .._compilation._linear_solvers import (
    PositiveDefinite,
    symmetric_operator,
    symmetric_solve,
)
from .._compilation._sparse import (
    BandedPlan,
    Pattern,
    SparseMatrix,
    banded_factor,
    banded_plan,
    block_inverse,
    product_pattern,
    sparse_add,
    sparse_matmul,
    transposed_pattern,
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

        Shapes raise `ValueError`, and so do concrete values; traced values are checked by
        `traced_checks`. Returns the formulation.
        """

    def traced_checks(self, num_holonomic: int, num_nonholonomic: int
                      ) -> tuple[tuple[Bool[Array, ""], str], ...]:
        """The checks of traced gain values (under `jit`, `vmap`, `grad`) as `(flag,
        message)` pairs, the flag true where the message applies: `simulate` attaches them
        with its own checks as one `eqx.branched_error_if`, other callers with
        `attach_checks`. Default: none."""
        return ()

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

    def for_projection(self) -> "AbstractFormulation":
        """The formulation whose equations [`jaxdae.Projected`][] integrates between its
        projections. Default: this one ([`jaxdae.ModifiedLagrange`][] adds augmented
        Lagrangian iterations, which bring its flow closer to the manifold's)."""
        return self

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
    with `RESULTS.singular_constraint_matrix` when its smallest *pivot* falls below `rcond`
    (default `sqrt(eps)` of the state's dtype) times the larger of its largest pivot now and
    at the initial state. The second makes the test relative also where the whole matrix
    vanishes, e.g. a single constraint whose gradient vanishes (`G M⁻¹ Gᵀ` is 1 × 1, so its
    own condition number is always 1).

    The pivots are the eigenvalues for one or two constraints (closed forms) and, for more,
    the diagonal of `D` in the factorization `G M⁻¹ Gᵀ = L D Lᵀ` (the squared diagonal of its
    Cholesky factor), the factorization the multipliers are solved with anyway: each lies
    between the smallest and the largest eigenvalue, and one of them vanishes where the
    matrix turns singular (a non-positive or non-finite pivot also counts as failed). This
    costs a Cholesky factorization per step instead of an eigenvalue decomposition.
    """

    rcond: eqx.AbstractVar[float | None]

    def failure_reference(self, terms):
        """The largest pivot of `G M⁻¹ Gᵀ` at the initial state."""
        elimination = eliminate(terms)
        return _extreme_pivots(elimination)[1] if elimination.matrix.shape[0] else None

    def failure(self, terms, initial_largest):
        elimination = eliminate(terms)
        matrix = elimination.matrix
        if matrix.shape[0] == 0:
            return jnp.array(False)
        smallest, largest = _extreme_pivots(elimination)
        tol = default_rcond(self.rcond, matrix.dtype)
        if matrix.shape[0] <= 2:
            return smallest <= tol * jnp.maximum(largest, initial_largest)
        # A pivot that is not positive (nan from the factorization) counts as failed; a
        # matrix that is not finite is the non-finite check's to report.
        values = matrix if elimination.sparse_matrix is None else elimination.sparse_matrix.values
        finite = jnp.all(jnp.isfinite(values))
        return finite & ~(smallest > tol * jnp.maximum(largest, initial_largest))

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


def _extreme_pivots(elimination):
    """`(smallest, largest)` pivot of `G M⁻¹ Gᵀ` (see `AbstractExactMultipliers`): closed-form
    eigenvalues for one or two constraints, else the pivots of [`PositiveDefinite`][]'s
    factorization (the one the multipliers are solved with)."""
    if elimination.matrix.shape[0] <= 2:
        return extreme_eigenvalues(elimination.matrix)
    pivots = PositiveDefinite().init(elimination.operator, {}).pivots
    return jnp.min(pivots), jnp.max(pivots)


# A constraint Jacobian denser than this is multiplied as a dense matrix.
SPARSE_MAX_DENSITY = 0.3


class Elimination(NamedTuple):
    """What eliminating `q̈` from `M q̈ + Gᵀλ = Q` gives (paper 004, eqs. [6], [21]).

    - `minv_q`: `M⁻¹ Q`, `(n,)`.
    - `minv_gt`: `M⁻¹ Gᵀ`, `(n, c)`: a dense array or a [`SparseMatrix`][].
    - `matrix`: `A = G M⁻¹ Gᵀ`, dense `(c, c)`, symmetrized.
    - `g_minv_q`: `G M⁻¹ Q`, `(c,)`.
    - `sparse_matrix`: `A` on its pattern where it came from sparse products, else `None`.
    """

    minv_q: Array
    minv_gt: Array | SparseMatrix
    matrix: Array
    g_minv_q: Array
    sparse_matrix: SparseMatrix | None = None

    @property
    def operator(self) -> lx.AbstractLinearOperator:
        """`A` as a lineax operator tagged positive semidefinite, on its pattern where it
        has one."""
        return symmetric_operator(self.matrix, self.sparse_matrix)

    def apply_minv_gt(self, lam):
        """`M⁻¹ Gᵀ λ`."""
        if isinstance(self.minv_gt, SparseMatrix):
            return self.minv_gt.matvec(lam)
        return small_matmul(self.minv_gt, lam)


def eliminate(terms: ConstrainedTerms) -> Elimination:
    """`M⁻¹ Q`, `M⁻¹ Gᵀ`, `G M⁻¹ Gᵀ` and `G M⁻¹ Q`, following the structure the terms carry.

    Where the terms carry sparse `M` and `G` (`ConstrainedTerms.sparse_mass`) and `M` is made
    of small diagonal blocks, `M⁻¹` is inverted block by block and the products are sparse
    (their cost grows with the non-zeros of `G`, not with `c · n · c`); otherwise `M` is
    factorized once by Cholesky and the products are dense. Where the terms carry the factor
    of a constant `M` (`ConstrainedTerms.mass_factor`, factored once per solve), it is used
    instead of factorizing `M` here.
    """
    sparse_factors = _sparse_factors(terms)
    if sparse_factors is not None:
        minv, g = sparse_factors
        minv_q = minv.matvec(terms.forces)
        minv_gt = sparse_matmul(minv, g.T)
        sparse = sparse_matmul(g, minv_gt).symmetrized()
        return Elimination(minv_q, minv_gt, sparse.dense(), g.matvec(minv_q), sparse)
    minv_q, minv_gt = _mass_solve(terms)
    g = terms.jacobian
    matrix = small_matmul(g, minv_gt)
    matrix = 0.5 * (matrix + matrix.T)
    return Elimination(minv_q, minv_gt, matrix, small_matmul(g, minv_q))


def _sparse_factors(terms: ConstrainedTerms) -> tuple[SparseMatrix, SparseMatrix] | None:
    """`(M⁻¹, G)` as sparse matrices where the terms carry sparse `M` and `G` (`G` sparse
    enough) and `M⁻¹` is inverted block by block (or the terms carry it); else `None`."""
    if terms.sparse_mass is None or terms.sparse_jacobian is None or (
        terms.sparse_jacobian.pattern.density > SPARSE_MAX_DENSITY
    ):
        return None
    factor = terms.mass_factor
    minv = block_inverse(terms.sparse_mass) if factor is None else factor.inverse
    return None if minv is None else (minv, terms.sparse_jacobian)


def penalized_mass(terms: ConstrainedTerms, apply_masses):
    """`M + Gᵀ 𝔄 G` of the modified Lagrange equation (paper 004, eq. [30]) as a lineax
    operator tagged positive semidefinite (symmetrized; on its pattern where the terms carry
    sparse `M` and `G`), and `𝔄 G` (with `rmatvec`); `apply_masses(G)` gives `𝔄 G` for `G` a
    `SparseMatrix` or a dense array."""
    if terms.sparse_mass is not None and terms.sparse_jacobian is not None and (
        terms.sparse_jacobian.pattern.density <= SPARSE_MAX_DENSITY
    ):
        masses_g = apply_masses(terms.sparse_jacobian)
        product = sparse_matmul(terms.sparse_jacobian.T, masses_g)
        lhs = sparse_add(terms.sparse_mass, product).symmetrized()
        return symmetric_operator(lhs.dense(), lhs), masses_g
    g = terms.jacobian
    masses_g = apply_masses(g)
    lhs = terms.mass_matrix + small_matmul(g.T, masses_g)
    return symmetric_operator(0.5 * (lhs + lhs.T)), _Dense(masses_g)


def jacobian_matvec(terms: ConstrainedTerms, x: Array) -> Array:
    """`G x`, sparse where the terms carry `G`'s pattern."""
    if terms.sparse_jacobian is not None:
        return terms.sparse_jacobian.matvec(x)
    return small_matmul(terms.jacobian, x)


class _Dense(NamedTuple):
    """A dense matrix with `SparseMatrix`'s `rmatvec`."""

    matrix: Array

    def rmatvec(self, x):
        return small_matmul(self.matrix.T, x)


def _mass_solve(terms: ConstrainedTerms):
    """`M⁻¹ Q` and `M⁻¹ Gᵀ` (dense) from one Cholesky factorization of `M` (or the factor
    the terms carry)."""
    rhs = jnp.concatenate([terms.forces[:, None], terms.jacobian.T], axis=1)
    if terms.mass_factor is not None:
        sol = terms.mass_factor.solve(rhs)
    else:
        sol = spd_solve(terms.mass_matrix, rhs)
    return sol[:, 0], sol[:, 1:]


def constraint_matrix(terms: ConstrainedTerms) -> Float[Array, "c c"]:
    """`G M⁻¹ Gᵀ` (paper 004's `A = J M⁻¹ Jᵀ`, extended to nonholonomic rows), symmetrized."""
    return eliminate(terms).matrix


def multiplier_solve(
    terms: ConstrainedTerms, target: Float[Array, " c"], solver: lx.AbstractLinearSolver
):
    """Solves `M q̈ + Gᵀλ = Q`, `G q̈ = target` by eliminating `q̈` (paper 004 eqs. [6], [21]).

    `λ = A⁻¹ (G M⁻¹ Q − target)` with `A = G M⁻¹ Gᵀ` as a positive semidefinite lineax
    operator (on its pattern where the terms carry one), solved with `solver`
    ([`symmetric_solve`][]): [`PositiveDefinite`][] for independent constraints,
    [`PositiveSemidefinitePseudoInverse`][] (`A⁺`) for redundant ones, or any lineax solver
    (through `lineax.linear_solve`).
    """
    sparse_factors = _sparse_factors(terms)
    if sparse_factors is not None and isinstance(solver, PositiveDefinite):
        minv, g = sparse_factors
        matrix_pattern = product_pattern(
            g.pattern, product_pattern(minv.pattern, transposed_pattern(g.pattern)))
        plan = banded_plan(matrix_pattern)
        if plan is not None:
            return _banded_multipliers((minv.pattern, g.pattern, plan), minv.values,
                                       g.values, terms.forces, target)
    elimination = eliminate(terms)
    rhs = elimination.g_minv_q - target
    lam = symmetric_solve(elimination.operator, rhs, solver)
    return elimination.minv_q - elimination.apply_minv_gt(lam), lam


def _banded_parts(patterns: tuple[Pattern, Pattern, BandedPlan], minv_values, g_values,
                  forces, target):
    """`(q̈, λ)` of `M q̈ + Gᵀλ = Q`, `G q̈ = target` by eliminating `q̈` with sparse `M⁻¹`
    and `G`, `A = G M⁻¹ Gᵀ` factorized on the banded plan; with the factor, `M⁻¹`, `G`
    and `M⁻¹ Gᵀ` (sparse)."""
    minv_pattern, g_pattern, plan = patterns
    minv, g = SparseMatrix(minv_values, minv_pattern), SparseMatrix(g_values, g_pattern)
    minv_q = minv.matvec(forces)
    minv_gt = sparse_matmul(minv, g.T)
    factor = banded_factor(sparse_matmul(g, minv_gt).symmetrized(), plan)
    lam = factor.solve(g.matvec(minv_q) - target)
    return minv_q - minv_gt.matvec(lam), lam, factor, minv, g, minv_gt


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _banded_multipliers(patterns, minv_values, g_values, forces, target):
    """[`multiplier_solve`][] where `M⁻¹` and `G` are sparse (values on the static
    `patterns = (M⁻¹'s, G's, A's banded plan)`) and `A = G M⁻¹ Gᵀ` is banded: `(q̈, λ)`.

    Differentiated as the saddle-point system `[[M, Gᵀ], [G, 0]] (q̈, λ) = (Q, target)`
    that it solves, not through the elimination's products: with `f = Q − Gᵀλ` (so that
    `q̈ = M⁻¹ f`) and `p = M⁻¹ (dQ − dGᵀ λ) + d(M⁻¹) f`,
    `dλ = A⁻¹ (G p + dG q̈ − d target)` and `dq̈ = p − M⁻¹ Gᵀ dλ`, a solve with the
    factor of `A` already computed. The products of `G M⁻¹ Gᵀ` (pairs of entries gathered
    and summed) are not differentiated: the reverse pass forms `G`'s cotangent on `G`'s
    pattern, from the outer products of `λ` and of `q̈` with the cotangents of `p` and of
    `dλ`'s right-hand side. On the chain of 64 links (`experiments/bench_scaling.py
    --families chain --sizes 64`, Tsit5, 2-core CPU) that made the gradient 3.4 instead of
    3.9 times the solve."""
    return _banded_parts(patterns, minv_values, g_values, forces, target)[:2]


def _banded_multipliers_jvp(patterns, primals, tangents):
    acc, lam, factor, minv, g, minv_gt = _banded_parts(patterns, *primals)
    d_minv, d_g, d_forces, d_target = (
        None if isinstance(t, jax.custom_derivatives.SymbolicZero) else t for t in tangents)
    d_g = None if d_g is None else SparseMatrix(d_g, g.pattern)
    r = jnp.zeros_like(acc) if d_forces is None else d_forces
    if d_g is not None:
        r = r - d_g.rmatvec(lam)
    p = minv.matvec(r)
    if d_minv is not None:
        p = p + SparseMatrix(d_minv, minv.pattern).matvec(primals[2] - g.rmatvec(lam))
    r = g.matvec(p)
    if d_g is not None:
        r = r + d_g.matvec(acc)
    if d_target is not None:
        r = r - d_target
    d_lam = factor.solve(r, tangent=True)
    return (acc, lam), (p - minv_gt.matvec(d_lam), d_lam)


# Symbolic zeros: a constant mass matrix (or one not differentiated) adds no work.
_banded_multipliers.defjvp(_banded_multipliers_jvp, symbolic_zeros=True)


def default_rcond(rcond: float | None, dtype) -> float:
    """`sqrt(machine epsilon)` of `dtype` unless given."""
    return float(np.sqrt(np.finfo(dtype).eps)) if rcond is None else rcond
