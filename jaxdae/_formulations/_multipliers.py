"""The linear algebra of the formulations: eliminating `q̈` from `M q̈ + Gᵀλ = Q` and solving
for the multipliers, dense or following the sparse and banded structure the terms carry."""

import contextlib
import functools
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .. import _thresholds
from .._compilation._banded import BandedPlan
from .._compilation._linalg import extreme_eigenvalues, small_matmul, spd_solve
from .._compilation._linear_solvers import (
    StructuredCholesky,
    symmetric_operator,
    symmetric_solve,
)
from .._compilation._operators import factor_of, sparse_matrix
from .._compilation._sparse import (
    Pattern,
    SparseMatrix,
    block_inverse,
    product_pattern,
    sparse_add,
    sparse_matmul,
    transposed_pattern,
)
from .._compilation._supernodal import SupernodalPlan, cholesky_plan
from .._custom_types import Array, Float
from .._systems._system import ConstrainedTerms


class PivotRange(NamedTuple):
    """What the failure test of `AbstractExactMultipliers` reads of `A = G M⁻¹ Gᵀ`: its
    `smallest` and `largest` pivot (see `extreme_pivots`) and whether its entries are
    `finite`."""

    smallest: Array
    largest: Array
    finite: Array


def extreme_pivots(elimination, pivots=None):
    """`(smallest, largest)` pivot of `G M⁻¹ Gᵀ` (see `AbstractExactMultipliers`): closed-form
    eigenvalues for one or two constraints, else the pivots of [`StructuredCholesky`][]'s
    factorization (the one the multipliers are solved with; given as `pivots`, or computed
    here)."""
    if elimination.matrix.shape[0] <= 2:
        return extreme_eigenvalues(elimination.matrix)
    if pivots is None:
        pivots = StructuredCholesky().init(elimination.operator, {}).pivots
    return jnp.min(pivots), jnp.max(pivots)


def pivot_range(elimination, pivots=None) -> PivotRange:
    """The `PivotRange` of the `elimination`'s `A` (`pivots` as for `extreme_pivots`)."""
    smallest, largest = extreme_pivots(elimination, pivots)
    values = elimination.matrix
    if elimination.sparse_matrix is not None:
        values = elimination.sparse_matrix.values
    return PivotRange(smallest, largest, jnp.all(jnp.isfinite(values)))


class _PivotRecord(threading.local):
    """The open records of `recording_pivots`, per thread (JAX traces on the caller's)."""

    def __init__(self):
        self.stack: list[list] = []


_recorded = _PivotRecord()


@contextlib.contextmanager
def recording_pivots():
    """Within it, each [`multiplier_solve`][] with [`StructuredCholesky`][] appends `(terms,
    PivotRange)` of the factorization it solved with to the list it yields: a failure test
    that reads the pivots then takes them from the solve instead of factorizing `A` once
    more (`AbstractExactMultipliers.accelerations_and_failure`). Traced values: read them
    in the same trace."""
    record: list = []
    _recorded.stack.append(record)
    try:
        yield record
    finally:
        _recorded.stack.pop()


class Elimination(NamedTuple):
    """What eliminating `q̈` from `M q̈ + Gᵀλ = Q` gives (Mukharlyamov and Deressa (2015), eqs. [6],
    [21]).

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

    Where the terms carry `M` and `G` as sparse operators (`ConstrainedTerms.mass_operator`)
    and `M` is made of small diagonal blocks, `M⁻¹` is inverted block by block and the
    products are sparse (their cost grows with the non-zeros of `G`, not with `c · n · c`);
    otherwise `M` is factorized once by Cholesky and the products are dense. Where `M`'s
    operator carries its factor (a `FactoredOperator`: a state-independent `M`, factored once
    per solve), it is used instead of factorizing `M` here.
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
    mass, jacobian = _sparse_terms(terms)
    if mass is None or jacobian is None:
        return None
    factor = factor_of(terms.mass_operator)
    minv = block_inverse(mass) if factor is None else factor.inverse
    return None if minv is None else (minv, jacobian)


def _sparse_terms(terms: ConstrainedTerms) -> tuple[SparseMatrix | None, SparseMatrix | None]:
    """`M` and `G` as sparse matrices where the terms carry them so and `G` is sparse enough
    for sparse products to pay (`SPARSE_MAX_DENSITY`); `None` for each that is not."""
    jacobian = sparse_matrix(terms.jacobian_operator)
    if jacobian is not None and jacobian.pattern.density > _thresholds.SPARSE_MAX_DENSITY:
        jacobian = None
    return sparse_matrix(terms.mass_operator), jacobian


def penalized_mass(terms: ConstrainedTerms, apply_masses):
    """`M + Gᵀ 𝔄 G` of the modified Lagrange equation (Mukharlyamov and Deressa (2015), eq. [30]) as
    a lineax operator tagged positive semidefinite (symmetrized; on its pattern where the terms
    carry sparse `M` and `G`), and `𝔄 G` (with `rmatvec`); `apply_masses(G)` gives `𝔄 G` for `G` a
    `SparseMatrix` or a dense array."""
    mass, jacobian = _sparse_terms(terms)
    if mass is not None and jacobian is not None:
        masses_g = apply_masses(jacobian)
        lhs = sparse_add(mass, sparse_matmul(jacobian.T, masses_g)).symmetrized()
        return symmetric_operator(lhs.dense(), lhs), masses_g
    g = terms.jacobian
    masses_g = apply_masses(g)
    lhs = terms.mass_matrix + small_matmul(g.T, masses_g)
    return symmetric_operator(0.5 * (lhs + lhs.T)), _Dense(masses_g)


def jacobian_matvec(terms: ConstrainedTerms, x: Array) -> Array:
    """`G x`, sparse where the terms carry `G`'s pattern."""
    jacobian = sparse_matrix(terms.jacobian_operator)
    if jacobian is not None:
        return jacobian.matvec(x)
    return small_matmul(terms.jacobian, x)


class _Dense(NamedTuple):
    """A dense matrix with `SparseMatrix`'s `rmatvec`."""

    matrix: Array

    def rmatvec(self, x):
        return small_matmul(self.matrix.T, x)


def _mass_solve(terms: ConstrainedTerms):
    """`M⁻¹ Q` and `M⁻¹ Gᵀ` (dense) from one Cholesky factorization of `M` (or the factor
    the terms carry)."""
    factor = factor_of(terms.mass_operator)
    if terms.jacobian.shape[0] == 0 and factor is None:  # one right-hand side: no batch
        return spd_solve(terms.mass_matrix, terms.forces), terms.jacobian.T
    rhs = jnp.concatenate([terms.forces[:, None], terms.jacobian.T], axis=1)
    if factor is not None:
        sol = factor.solve(rhs)
    else:
        sol = spd_solve(terms.mass_matrix, rhs)
    return sol[:, 0], sol[:, 1:]


def constraint_matrix(terms: ConstrainedTerms) -> Float[Array, "c c"]:
    """`G M⁻¹ Gᵀ` (Mukharlyamov and Deressa's (2015) `A = J M⁻¹ Jᵀ`, extended to nonholonomic rows),
    symmetrized."""
    return eliminate(terms).matrix


def multiplier_solve(
    terms: ConstrainedTerms,
    target: Float[Array, " c"],
    solver: lx.AbstractLinearSolver | None = None,
) -> tuple[Float[Array, " n"], Float[Array, " c"]]:
    """Solves `M q̈ + Gᵀλ = Q`, `G q̈ = target` by eliminating `q̈` (Mukharlyamov and Deressa (2015)
    eqs. [6], [21]).

    `λ = A⁻¹ (G M⁻¹ Q − target)` with `A = G M⁻¹ Gᵀ` as a positive semidefinite lineax
    operator, following the structure the terms carry (block-diagonal `M`, sparse `G`, a
    banded or sparse `A`).

    **Arguments:**

    - `terms`: the [`jaxdae.ConstrainedTerms`][] at the state.
    - `target`: `s` of `G q̈ = s`, shape `(m + k,)` (e.g. [`jaxdae.baumgarte_target`][]).
    - `solver`: the lineax solver for `A`. Default: a Cholesky factorization that follows
        the structure (for independent constraints; `A` must be positive definite). Any
        lineax solver works, e.g. `lineax.SVD(rcond)` for redundant constraints.

    **Returns:**

    `(q̈, λ)`, shapes `(n,)` and `(m + k,)`: what a formulation's `accelerations`
    returns.
    """
    if solver is None:
        solver = StructuredCholesky()
    sparse_factors = _sparse_factors(terms)
    if sparse_factors is not None and isinstance(solver, StructuredCholesky):
        minv, g = sparse_factors
        matrix_pattern = product_pattern(
            g.pattern, product_pattern(minv.pattern, transposed_pattern(g.pattern))
        )
        plan = cholesky_plan(matrix_pattern)
        if plan is not None:
            acc, lam, summary = _banded_multipliers(
                (minv.pattern, g.pattern, plan), minv.values, g.values, terms.forces, target
            )
            if _recorded.stack:
                smallest, largest, finite = summary
                _recorded.stack[-1].append((terms, PivotRange(smallest, largest, finite > 0)))
            return acc, lam
    elimination = eliminate(terms)
    if target.shape[0] == 0:  # no constraints: `q̈ = M⁻¹ Q`
        return elimination.minv_q, target
    rhs = elimination.g_minv_q - target
    operator = elimination.operator
    if _recorded.stack and isinstance(solver, StructuredCholesky) and solver.direct(operator):
        lam, pivots = solver.solve_with_pivots(operator, rhs)
        _recorded.stack[-1].append((terms, pivot_range(elimination, pivots)))
    else:
        lam = symmetric_solve(operator, rhs, solver)
    return elimination.minv_q - elimination.apply_minv_gt(lam), lam


def _banded_parts(
    patterns: tuple[Pattern, Pattern, BandedPlan | SupernodalPlan],
    minv_values,
    g_values,
    forces,
    target,
):
    """`(q̈, λ)` of `M q̈ + Gᵀλ = Q`, `G q̈ = target` by eliminating `q̈` with sparse `M⁻¹`
    and `G`, `A = G M⁻¹ Gᵀ` factorized on its plan (banded or multifrontal,
    `cholesky_plan`); with the factor, `M⁻¹`, `G`
    and `M⁻¹ Gᵀ` (sparse)."""
    minv_pattern, g_pattern, plan = patterns
    minv, g = SparseMatrix(minv_values, minv_pattern), SparseMatrix(g_values, g_pattern)
    minv_q = minv.matvec(forces)
    minv_gt = sparse_matmul(minv, g.T)
    factor = plan.factor(sparse_matmul(g, minv_gt).symmetrized())
    lam = factor.solve(g.matvec(minv_q) - target)
    return minv_q - minv_gt.matvec(lam), lam, factor, minv, g, minv_gt


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _banded_multipliers(patterns, minv_values, g_values, forces, target):
    """[`multiplier_solve`][] where `M⁻¹` and `G` are sparse (values on the static
    `patterns = (M⁻¹'s, G's, A's plan)`) and `A = G M⁻¹ Gᵀ` is banded or sparse enough
    for a plan of `cholesky_plan`: `(q̈, λ)` and `(smallest pivot, largest pivot, finite)` of
    its factorization as one array (no derivative: what the failure test reads,
    `recording_pivots`).

    Differentiated as the saddle-point system `[[M, Gᵀ], [G, 0]] (q̈, λ) = (Q, target)`
    that it solves, not through the elimination's products: with `f = Q − Gᵀλ` (so that
    `q̈ = M⁻¹ f`) and `p = M⁻¹ (dQ − dGᵀ λ) + d(M⁻¹) f`,
    `dλ = A⁻¹ (G p + dG q̈ − d target)` and `dq̈ = p − M⁻¹ Gᵀ dλ`, a solve with the
    factor of `A` already computed. The products of `G M⁻¹ Gᵀ` (pairs of entries gathered
    and summed) are not differentiated: the reverse pass forms `G`'s cotangent on `G`'s
    pattern, from the outer products of `λ` and of `q̈` with the cotangents of `p` and of
    `dλ`'s right-hand side. On the chain of 64 links (`experiments/benchmarks/bench_scaling.py
    --families chain --sizes 64`, Tsit5, 2-core CPU) that made the gradient 3.4 instead of
    3.9 times the solve."""
    acc, lam, factor, *_ = _banded_parts(patterns, minv_values, g_values, forces, target)
    return acc, lam, _pivot_summary(factor, minv_values, g_values)


def _pivot_summary(factor, minv_values, g_values):
    """The `PivotRange` of `A = G M⁻¹ Gᵀ` from its `factor`, as one array (an output without
    derivative). `A` is finite where `M⁻¹` and `G` are: testing their entries, not `A`'s
    (which the factorization reads), keeps XLA from computing `A` a second time."""
    pivots = factor.pivots
    finite = (jnp.all(jnp.isfinite(minv_values)) & jnp.all(jnp.isfinite(g_values))).astype(
        pivots.dtype
    )
    return jax.lax.stop_gradient(jnp.stack([jnp.min(pivots), jnp.max(pivots), finite]))


def _banded_multipliers_jvp(patterns, primals, tangents):
    acc, lam, factor, minv, g, minv_gt = _banded_parts(patterns, *primals)
    summary = _pivot_summary(factor, primals[0], primals[1])
    d_minv, d_g, d_forces, d_target = (
        None if isinstance(t, jax.custom_derivatives.SymbolicZero) else t for t in tangents
    )
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
    return (acc, lam, summary), (p - minv_gt.matvec(d_lam), d_lam, jnp.zeros_like(summary))


# Symbolic zeros: a constant mass matrix (or one not differentiated) adds no work.
_banded_multipliers.defjvp(_banded_multipliers_jvp, symbolic_zeros=True)


def default_rcond(rcond: float | None, dtype) -> float:
    """`sqrt(machine epsilon)` of `dtype` unless given."""
    return float(np.sqrt(np.finfo(dtype).eps)) if rcond is None else rcond
