"""The linear solvers of the constraint and penalty solves, as lineax solvers.

The formulations solve with symmetric positive (semi)definite matrices: `G M⁻¹ Gᵀ` for the
multipliers (Mukharlyamov and Deressa (2015), eq. [21]; its pseudo-inverse for redundant
constraints, eq. [6]) and `M + Gᵀ𝔄G` for the modified Lagrange equation (eq. [30]). They pass the
matrix as a lineax operator — [`SparseOperator`][] where the terms carry a sparsity pattern,
`lineax.MatrixLinearOperator` otherwise — to [`symmetric_solve`][] with one of the solvers
here or any lineax solver a user passes (which goes through `lineax.linear_solve`).

- [`StructuredCholesky`][]: a Cholesky factorization that follows the size and the structure:
  unrolled elementwise operations for tiny matrices and a loop of vector operations for
  small ones (which XLA fuses with the solve's loop), a banded Cholesky factorization where
  the operator's pattern is banded, a multifrontal sparse one where its pattern is a mesh
  or otherwise sparse but not narrow, LAPACK for large dense ones. Its state carries the
  pivots that the failure checks read.
- [`PositiveSemidefinitePseudoInverse`][]: the Moore–Penrose inverse of a symmetric positive
  semidefinite matrix of numerical rank set by `rcond` (what `lineax.SVD(rcond)` computes
  for such a matrix), in closed form for sizes 1 and 2, by a rank-revealing (pivoted)
  Cholesky factorization beyond.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .. import _thresholds
from .._custom_types import Array, Float
from ._banded import BandedPlan
from ._linalg import (
    PivotedPseudoFactor,
    pivoted_pseudo_factor,
    pivoted_pseudo_solve,
    psd_pseudo_inverse,
    small_matmul,
)
from ._operators import SparseOperator, sparse_matrix
from ._sparse import SparseMatrix, cholesky_factor, cholesky_solve
from ._supernodal import SupernodalPlan, cholesky_plan


def symmetric_operator(
    matrix: Float[Array, "c c"], sparse: SparseMatrix | None = None
) -> lx.AbstractLinearOperator:
    """A symmetric positive semidefinite matrix as a lineax operator: on its pattern where
    `sparse` (the same matrix as a `SparseMatrix`) is given, else dense."""
    if sparse is not None:
        return SparseOperator(sparse, (lx.symmetric_tag, lx.positive_semidefinite_tag))
    return lx.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)


class CholeskyFactor(eqx.Module):
    """The state of [`StructuredCholesky`][]: a factorization and its pivots.

    - `factor`: the lower Cholesky factor (unrolled, looped and LAPACK methods), or the matrix's
        values on its pattern (banded and sparse methods: the plan's `solve` factorizes and
        solves in one pass).
    - `pivots`: the pivots `D` of `P A Pᵀ = L D Lᵀ` (`L` unit lower triangular; `P = I`
        unless there is a plan): non-finite or not positive where `A` is not positive
        definite.
    - `plan`: the banded plan (`_banded.py`), the multifrontal one (`_supernodal.py`), or
        `None` (dense).
    - `unroll_max`: the largest size factorized and solved unrolled (`cholesky_factor`;
        `None`: `UNROLL_MAX`).
    """

    factor: Array | SparseMatrix
    pivots: Float[Array, " c"]
    plan: BandedPlan | SupernodalPlan | None = eqx.field(static=True)
    unroll_max: int | None = eqx.field(static=True, default=None)


class AbstractDirectSolver(lx.AbstractLinearSolver):
    """A lineax solver whose `init` and `compute` are ordinary differentiable JAX code
    (elementwise operations, LAPACK calls with JAX's own derivative rules).

    [`symmetric_solve`][] applies such a solver directly where `direct` says so: JAX then
    differentiates the factorization itself, as it would a hand-written solve, and the scalar
    graphs of small systems (`_scalarize.py`) fuse it with the rest of the right-hand side,
    which they cannot do across `lineax.linear_solve`'s primitive (they apply it as an
    opaque array operation and differentiate it with respect to all its operands, the
    solver's state included, which lineax's derivative rule does not accept). Everywhere
    else it is an ordinary lineax solver.
    """

    def direct(self, operator: lx.AbstractLinearOperator) -> bool:
        """Whether `init` and `compute` may be differentiated directly for `operator`
        (otherwise through `lineax.linear_solve`'s rules). Default: always."""
        return True


def symmetric_solve(
    operator: lx.AbstractLinearOperator, vector: Array, solver: lx.AbstractLinearSolver
) -> Array:
    """`operator⁻¹ vector` with `solver`, a failed solve giving non-finite values rather
    than an error (which make the ODE solver reject the step and the failure checks report
    it): directly for an [`AbstractDirectSolver`][] that allows it, else
    `lineax.linear_solve(..., throw=False)`. An empty system gives `vector`."""
    if vector.shape[0] == 0:
        return vector
    if isinstance(solver, AbstractDirectSolver) and solver.direct(operator):
        solution, _, _ = solver.compute(solver.init(operator, {}), vector, {})
        return solution
    return lx.linear_solve(operator, vector, solver, throw=False).value


class StructuredCholesky(AbstractDirectSolver):
    """Cholesky solver for symmetric positive definite operators, following their size and
    structure.

    - Up to `UNROLL_MAX` rows (`ARRAY_FORM_UNROLL_MAX` for a [`SparseOperator`][]):
      a Cholesky factorization unrolled into elementwise JAX operations; up to `LOOPED_MAX`
      rows, loops of vector operations. LAPACK's factorization and triangular solves are
      custom calls that XLA cannot fuse (on the CPU a kernel each with its own dispatch,
      keeping a whole solve's loop from running as one kernel, and under `vmap` a loop over
      the batch of tiny matrices).
    - A [`SparseOperator`][] whose pattern (in its own order or after reverse
      Cuthill–McKee) is banded: a banded factorization (`banded_factor`), `O(size · b²)` work
      for a half-bandwidth `b` (`banded_plan` decides where it applies).
    - A [`SparseOperator`][] of any other sparsity (a mesh, a truss with many loops) where
      it costs less: a multifrontal sparse Cholesky factorization on a nested-dissection
      order (`_supernodal.py`; `O(size^1.5)` work on a planar mesh, where the band's is
      `O(size²)`). `cholesky_plan` chooses between the two from their estimated work.
    - Otherwise LAPACK's Cholesky factorization beyond `LOOPED_MAX` rows.

    Like `lineax.Cholesky` with `lineax.linear_solve(..., throw=False)`, a matrix that is not
    positive definite gives non-finite values rather than an error. The state
    ([`CholeskyFactor`][]) holds the factorization's pivots: each lies between the smallest
    and the largest eigenvalue, and one vanishes where the matrix turns singular, so they
    serve as the per-step test of `jaxdae.Baumgarte` and the other exact-multiplier
    formulations.
    """

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]) -> CholeskyFactor:
        del options
        if operator.in_size() != operator.out_size():
            raise ValueError("`StructuredCholesky` needs a square operator.")
        if not (lx.is_symmetric(operator) or lx.is_positive_semidefinite(operator)):
            raise ValueError(
                "`StructuredCholesky` solves with symmetric positive definite operators: tag "
                "the operator with `lineax.positive_semidefinite_tag`."
            )
        sparse = sparse_matrix(operator)
        plan = None if sparse is None else cholesky_plan(sparse.pattern)
        if plan is not None:
            # The pivots are a diagnostic (the failure checks read them); `compute` solves
            # with the plan's `solve`, whose derivative reuses its own factorization. Where
            # only the solve is used, XLA drops this factorization as dead code.
            pivots = jax.lax.stop_gradient(plan.factor(sparse).pivots)
            return CholeskyFactor(sparse, pivots, plan)
        # Structured terms keep their array form (`_systems/_structure.py`): there an
        # unrolled factorization is thousands of scalar operations, whose gradient compiles
        # slowly (docs/design_measurements.md#array-form-unroll).
        unroll_max = _thresholds.UNROLL_MAX if sparse is None else _thresholds.ARRAY_FORM_UNROLL_MAX
        matrix = operator.as_matrix()
        factor = cholesky_factor(matrix, unroll_max) if matrix.shape[0] else matrix
        return CholeskyFactor(factor, jnp.diagonal(factor) ** 2, None, unroll_max)

    def solve_with_pivots(
        self, operator: lx.AbstractLinearOperator, vector: Array
    ) -> tuple[Array, Array]:
        """`(operator⁻¹ vector, pivots)` from one factorization (`init`'s `pivots`, which on
        a sparse plan come from a factorization of their own that `compute` does not
        share): what a failure test reads beside the solve."""
        sparse = sparse_matrix(operator)
        plan = None if sparse is None else cholesky_plan(sparse.pattern)
        if plan is not None:
            solution, pivots = plan.solve(sparse, vector)
            return solution, jax.lax.stop_gradient(pivots)
        state = self.init(operator, {})
        solution, _, _ = self.compute(state, vector, {})
        return solution, state.pivots

    def compute(self, state: CholeskyFactor, vector: Array, options: dict[str, Any]):
        """The solution for `vector`, `(size,)`, or (called directly, not through lineax)
        for the columns of `vector`, `(size, k)`, in one pass of substitutions."""
        del options
        if state.plan is not None:
            solution, _ = state.plan.solve(state.factor, vector)
        elif vector.ndim == 2:  # columns, solved together (not a lineax call)
            solution = cholesky_solve(state.factor, vector, state.unroll_max)
        else:
            solution = cholesky_solve(state.factor, vector[:, None], state.unroll_max)[:, 0]
        return solution, lx.RESULTS.successful, {}

    def transpose(self, state: CholeskyFactor, options: dict[str, Any]):
        return state, options  # symmetric

    def conj(self, state: CholeskyFactor, options: dict[str, Any]):
        return state, options  # real

    def assume_full_rank(self):
        return True


class PositiveSemidefinitePseudoInverse(AbstractDirectSolver):
    """Moore–Penrose solver for symmetric positive semidefinite operators.

    For sizes 1 and 2 (a constraint written twice, a closure equation with its redundant
    twin) in closed form, eigenvalues below `rcond · λ_max` counting as zero: for such a
    matrix its singular values are its eigenvalues, so this is `lineax.SVD(rcond)`'s
    solution; an SVD's LAPACK call at every stage slows a whole simulation several times
    (docs/design_measurements.md#closed-form-pseudo-inverse). Beyond, the matrix is first
    factorized as [`StructuredCholesky`][] does (a banded or multifrontal sparse
    factorization where its pattern allows, LAPACK's Cholesky otherwise): where the pivots
    show full rank (each above `rcond` times the largest, the test of `jaxdae.Baumgarte`),
    `A⁺ = A⁻¹` is applied through that factorization; where they do not (a `lax.cond`; under
    `vmap` both branches run), up to `LOOPED_MAX` rows a Cholesky factorization with
    symmetric pivoting stopped at the numerical rank (pivots below `rcond` times the largest
    diagonal entry count as zero) gives the Moore–Penrose inverse (`pivoted_pseudo_solve`),
    beyond a symmetric eigendecomposition (eigenvalues below `rcond · λ_max` count as zero).
    Up to `LOOPED_MAX` both branches are array operations without LAPACK calls, so a solve's
    loop still compiles into one kernel, and a step costs what `Baumgarte`'s does
    (docs/design_measurements.md#pseudo-inverse-by-cholesky). Gradients follow lineax's rule
    for pseudo-inverse solves.

    **Arguments:**

    - `rcond`: the relative cut-off. Default `sqrt(eps)` of the operator's dtype.
    """

    rcond: float | None = None

    def direct(self, operator):
        """For sizes 1 and 2 (closed forms with safe branches); beyond, lineax's rule for
        pseudo-inverse solves (a rank-revealing factorization's own derivative is not
        defined where the rank changes)."""
        return operator.in_size() <= 2

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        if not (lx.is_symmetric(operator) or lx.is_positive_semidefinite(operator)):
            raise ValueError(
                "`PositiveSemidefinitePseudoInverse` solves with symmetric positive "
                "semidefinite operators: tag the operator with "
                "`lineax.positive_semidefinite_tag`, or use `lineax.SVD`."
            )
        dtype = operator.out_structure().dtype
        rcond = float(np.sqrt(np.finfo(dtype).eps)) if self.rcond is None else self.rcond
        if operator.in_size() <= 2:
            return _PseudoInverseState(psd_pseudo_inverse(operator.as_matrix(), rcond), None)
        factor = StructuredCholesky().init(operator, {})
        pivots = factor.pivots
        full_rank = jnp.all(pivots > rcond * jnp.max(pivots))
        if operator.in_size() > _thresholds.LOOPED_MAX:
            return _PseudoInverseState(operator, full_rank, factor, None, rcond)
        matrix = operator.as_matrix()
        pivoted = jax.lax.cond(  # its structure without its cost where of full rank
            full_rank,
            lambda: jax.tree.map(
                jnp.zeros_like, jax.eval_shape(pivoted_pseudo_factor, matrix, rcond)
            ),
            lambda: pivoted_pseudo_factor(matrix, rcond),
        )
        return _PseudoInverseState(operator, full_rank, factor, pivoted, rcond)

    def compute(self, state, vector: Array, options: dict[str, Any]):
        del options
        if state.full_rank is None:
            return small_matmul(state.matrix, vector), lx.RESULTS.successful, {}

        def by_factorization():
            return StructuredCholesky().compute(state.factor, vector, {})[0]

        def rank_deficient():
            if state.pivoted is None:  # beyond `LOOPED_MAX`
                return psd_pseudo_inverse(state.matrix.as_matrix(), state.rcond) @ vector
            return pivoted_pseudo_solve(state.pivoted, vector)

        solution = jax.lax.cond(state.full_rank, by_factorization, rank_deficient)
        return solution, lx.RESULTS.successful, {}

    def transpose(self, state, options: dict[str, Any]):
        return state, options  # symmetric

    def conj(self, state, options: dict[str, Any]):
        return state, options  # real

    def assume_full_rank(self):
        return False


class _PseudoInverseState(eqx.Module):
    """`matrix`: the pseudo-inverse for sizes 1 and 2 (`full_rank` `None`), else the operator,
    with its Cholesky `factor`, whether the factor's pivots show full rank, and up to
    `LOOPED_MAX` rows where they do not its `pivoted` factorization (zeros where they do)."""

    matrix: Array | lx.AbstractLinearOperator
    full_rank: Array | None
    factor: CholeskyFactor | None = None
    pivoted: PivotedPseudoFactor | None = None
    rcond: float = eqx.field(default=0.0, static=True)
