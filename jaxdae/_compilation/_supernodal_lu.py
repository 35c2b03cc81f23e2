"""Sparse LU factorization of square matrices whose pattern is structurally symmetric but
whose values need not be, and whose diagonal may be zero: the Newton matrices of the
index-3 equations, `[[M − c K, Gᵀ], [G, 0]]` (a saddle point, `K` not symmetric where the
forces are not conservative).

It runs on the same symbolic analysis and the same static schedule as the sparse Cholesky
factorization (`_supernodal.py`'s [`SupernodalPlan`][]): supernodes of the symmetrized
pattern, grouped by level and block-size class, fronts assembled from the matrix and their
children's update matrices in one flat buffer. Each supernode's front `[[F₁₁, F₁₂], [F₂₁,
F₂₂]]` is factorized as `P F₁₁ = L₁₁ U₁₁` (LAPACK's batched LU, partial pivoting inside the
pivot block), `U₁₂ = L₁₁⁻¹ P F₁₂`, `L₂₁ = F₂₁ U₁₁⁻¹`, and its update matrix `F₂₂ − L₂₁ U₁₂`
is added into its parent's front: the unsymmetric multifrontal method on a symmetric pattern
(Duff and Reid, "The multifrontal solution of unsymmetric sets of linear equations", SIAM J.
Sci. Stat. Comput. 5, 1984; Amestoy and Puglisi, SIAM J. Matrix Anal. Appl. 24, 2002). Rows
are exchanged only inside a pivot block, so the schedule stays static (the static pivoting of
SuperLU_DIST, Li and Demmel, ACM TOMS 29, 2003).

Pivots from inside the block suffice where the order eliminates every multiplier after the
coordinates its constraint involves ([`saddle_point_order`][]): its pivot is then the
Schur complement `−g (M − c K)⁻¹ gᵀ` restricted to what was eliminated, non-zero for
independent constraints (Vanderbei, "Symmetric quasidefinite matrices", SIAM J. Optim. 5,
1995, for the symmetric case). A singular matrix gives non-finite values, or a pivot of
rounding size and a solution far from solving the system (as LAPACK's dense LU), never an
error.

A solve is `jax.lax.custom_linear_solve` with the substitutions and their transposes, so
the loops are never differentiated: `d(A⁻¹ r) = A⁻¹ (dr − dA A⁻¹ r)`, and reverse mode
solves with `Aᵀ` by the same factors.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._custom_types import Array, Float
from ._gather import take
from ._ordering import fill_reducing_order
from ._sparse import Pattern, SparseMatrix
from ._supernodal import SupernodalPlan, _columns, _fronts, _run_tasks, extend_add


def saddle_point_order(pattern: Pattern, coordinates: int) -> np.ndarray:
    """An elimination order of a square pattern whose first `coordinates` rows are
    coordinates and the others multipliers (the rows of the constraints): the coordinates
    in a fill-reducing order of their graph, in which two coordinates are adjacent where an
    entry couples them or a constraint involves both; each multiplier right after the last
    coordinate its constraint involves (a multiplier that involves none, last)."""
    n, size = coordinates, pattern.shape[0]
    rows, cols = pattern.rows, pattern.cols
    direct = (rows < n) & (cols < n)
    coupling = (rows < n) != (cols < n)
    multiplier = np.where(rows >= n, rows, cols)[coupling]
    coordinate = np.where(rows >= n, cols, rows)[coupling]
    # pairs of coordinates that share a constraint
    order = np.argsort(multiplier, kind="stable")
    multiplier, coordinate = multiplier[order], coordinate[order]
    starts = np.searchsorted(multiplier, np.arange(n, size + 1))
    first, second = [rows[direct]], [cols[direct]]
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        group = np.unique(coordinate[a:b])
        first.append(np.repeat(group, group.size))
        second.append(np.tile(group, group.size))
    keys = np.unique(np.concatenate(first) * n + np.concatenate(second))
    graph = Pattern((n, n), keys // n, keys % n)
    coordinate_order = fill_reducing_order(graph)
    rank = np.empty(n, np.int64)
    rank[coordinate_order] = np.arange(n)
    last = np.full(size - n, -1, np.int64)
    np.maximum.at(last, multiplier - n, 2 * rank[coordinate] + 1)
    last[last < 0] = 2 * n + 1  # constraints that involve no coordinate
    keys = np.concatenate([2 * rank, last])
    return np.lexsort((np.arange(size), keys))


class LUPlan:
    """The static data of a sparse LU factorization: the [`SupernodalPlan`][] of the
    pattern's symmetrized graph on a given order, and where each stored entry goes in its
    supernode's front (row by row: the factorization reads `A`, not `(A + Aᵀ)/2`)."""

    def __init__(self, pattern: Pattern, order: np.ndarray):
        self.pattern = pattern
        self.supernodal = plan = SupernodalPlan(pattern, order)
        nnz = pattern.nnz
        below, above = plan.entry_positions[:nnz], plan.entry_positions[nnz:]
        rows, cols = plan.inverse_order[pattern.rows], plan.inverse_order[pattern.cols]
        self.entry_positions = np.where(rows >= cols, below, above)


@functools.lru_cache(maxsize=64)
def saddle_point_plan(pattern: Pattern, coordinates: int) -> LUPlan | None:
    """An [`LUPlan`][] on [`saddle_point_order`][] where its estimated work, times
    `SUPERNODAL_WORK_RATIO`, is below the dense factorization's (`size³ / 3` times
    `DENSE_WORK_FACTOR`, as `cholesky_plan` weighs them) and the pattern has at least
    `SUPERNODAL_MIN` rows; else `None` (factorize densely)."""
    size = pattern.shape[0]
    if size < _thresholds.SUPERNODAL_MIN:
        return None
    plan = LUPlan(pattern, saddle_point_order(pattern, coordinates))
    # An LU factorization does twice a Cholesky factorization's work, dense or sparse.
    if plan.supernodal.flops * _thresholds.SUPERNODAL_WORK_RATIO < (
        _thresholds.DENSE_WORK_FACTOR * size**3 / 3
    ):
        return plan
    return None


class SupernodalLU(eqx.Module):
    """The factorization `P Π A Πᵀ = L U` of a sparse matrix on an [`LUPlan`][] (`Π` its
    order, `P` the exchanges of rows inside each supernode's pivot block).

    **Fields:**

    - `lower`: the flat buffer of each supernode's `L₁₁ \\ U₁₁` (the pivot block's factors)
        over `L₂₁`, padded to its class's `(k + u) × k`, as the Cholesky factor's.
    - `upper`: per class, each task's supernodes' `U₁₂`, `(tasks, batch, k, u)`.
    - `permutations`: per class, the rows of each pivot block in their order of
        elimination, `(tasks, batch, k)`.
    - `matrix`: `A` (its products define the solve's derivative and transpose).
    - `plan`: the [`LUPlan`][] (static).
    """

    lower: Float[Array, " buffer"]
    upper: tuple[Array, ...]  # per class: (tasks, batch, k, u)
    permutations: tuple[Array, ...]  # per class: (tasks, batch, k), integers
    matrix: SparseMatrix
    plan: LUPlan = eqx.field(static=True)

    def solve(self, rhs: Array) -> Array:
        """`A⁻¹ rhs` for `rhs` of shape `(size,)` or `(size, m)`, differentiable and
        transposable (`jax.lax.custom_linear_solve`)."""
        matrix = self.matrix

        def product(x):
            return matrix.matvec(x)

        matvec = product if rhs.ndim == 1 else jax.vmap(product, 1, 1)
        return jax.lax.custom_linear_solve(
            matvec,
            rhs,
            lambda _, r: self.substitutions(r),
            lambda _, r: self.substitutions(r, transpose=True),
        )

    def substitutions(self, rhs: Array, transpose: bool = False) -> Array:
        """`A⁻¹ rhs` (`A⁻ᵀ rhs` where `transpose`) by substitutions level by level up the
        tree and down it (not differentiable: loops with bounds that are data)."""
        supernodal = self.plan.supernodal
        columns = rhs[:, None] if rhs.ndim == 1 else rhs
        # rows `n` (read by padding: zero) and `n + 1` (written by padding)
        work = jnp.concatenate(
            [take(columns, supernodal.order), jnp.zeros((2, columns.shape[1]), columns.dtype)]
        )
        count = len(supernodal.classes)
        if transpose:
            work = _run_tasks(supernodal, [self._upper_transposed(c) for c in range(count)], work)
            out = _run_tasks(
                supernodal,
                [self._lower_transposed(c) for c in range(count)],
                work,
                reverse=True,
            )
        else:
            work = _run_tasks(supernodal, [self._lower_step(c) for c in range(count)], work)
            out = _run_tasks(
                supernodal,
                [self._upper_step(c, work) for c in range(count)],
                jnp.zeros_like(work),
                reverse=True,
            )
        out = take(out, supernodal.inverse_order)
        return out[:, 0] if rhs.ndim == 1 else out

    def _task(self, c: int):
        k, u, batch = self.plan.supernodal.classes[c]
        table = {name: jnp.asarray(v) for name, v in self.plan.supernodal.tables[c].items()}

        def blocks(j):
            columns = _columns(self.lower, table["factor_offset"][j], batch, k + u, k)
            return columns[:, :k], columns[:, k:], self.upper[c][j], self.permutations[c][j]

        return k, u, table, blocks

    def _lower_step(self, c: int):
        """`y = L₁₁⁻¹ P x` at the pivots, `x ← x − L₂₁ y` at the update rows."""
        k, u, table, blocks = self._task(c)
        n = self.plan.supernodal.size

        def step(j, work):
            pivot, below, _, permutation = blocks(j)
            pivots = table["pivots"][j]
            x = work[pivots]
            y = _unit_lower(pivot, jnp.take_along_axis(x, permutation[:, :, None], axis=1))
            work = work.at[_written(pivots, n)].add(y - x)
            if u:
                work = work.at[_written(table["rows"][j], n)].add(-(below @ y))
            return work

        return step

    def _upper_step(self, c: int, work: Array):
        """`x = U₁₁⁻¹ (y − U₁₂ x_rows)` at the pivots, from the root down."""
        k, u, table, blocks = self._task(c)
        n = self.plan.supernodal.size

        def step(j, out):
            pivot, _, upper, _ = blocks(j)
            pivots = table["pivots"][j]
            z = work[pivots]
            if u:
                z = z - upper @ out[table["rows"][j]]
            return out.at[_written(pivots, n)].add(_upper(pivot, z, False))

        return step

    def _upper_transposed(self, c: int):
        """`w = U₁₁⁻ᵀ g` at the pivots, `g ← g − U₁₂ᵀ w` at the update rows (`Uᵀ`, lower
        triangular, from the leaves up)."""
        k, u, table, blocks = self._task(c)
        n = self.plan.supernodal.size

        def step(j, work):
            pivot, _, upper, _ = blocks(j)
            pivots = table["pivots"][j]
            x = work[pivots]
            w = _upper(pivot, x, True)
            work = work.at[_written(pivots, n)].add(w - x)
            if u:
                rows = _written(table["rows"][j], n)
                work = work.at[rows].add(-(jnp.swapaxes(upper, 1, 2) @ w))
            return work

        return step

    def _lower_transposed(self, c: int):
        """`Pᵀ L₁₁⁻ᵀ (g − L₂₁ᵀ g_rows)` at the pivots, from the root down (the transpose of
        [`_lower_step`][SupernodalLU._lower_step] with the steps in reverse)."""
        k, u, table, blocks = self._task(c)
        n = self.plan.supernodal.size

        def step(j, work):
            pivot, below, _, permutation = blocks(j)
            pivots = table["pivots"][j]
            x = work[pivots]
            z = x
            if u:
                z = z - jnp.swapaxes(below, 1, 2) @ work[table["rows"][j]]
            z = _unit_lower(pivot, z, transpose=True)
            unpermuted = jax.vmap(lambda p, v: jnp.zeros_like(v).at[p].set(v))(permutation, z)
            return work.at[_written(pivots, n)].add(unpermuted - x)

        return step


def _written(index: Array, n: int) -> Array:
    return jnp.where(index == n, n + 1, index)


def _unit_lower(factors: Array, rhs: Array, transpose: bool = False) -> Array:
    return jax.lax.linalg.triangular_solve(
        factors, rhs, left_side=True, lower=True, transpose_a=transpose, unit_diagonal=True
    )


def _upper(factors: Array, rhs: Array, transpose: bool) -> Array:
    return jax.lax.linalg.triangular_solve(
        factors, rhs, left_side=True, lower=False, transpose_a=transpose
    )


def supernodal_lu(matrix: SparseMatrix, plan: LUPlan) -> SupernodalLU:
    """The multifrontal LU factorization of `matrix` (on `plan.pattern`) on `plan`. Not
    reverse-differentiable (loops with bounds that are data): [`SupernodalLU.solve`][]
    differentiates the solve implicitly."""
    if matrix.pattern != plan.pattern:
        raise ValueError("The matrix's pattern is not the plan's.")
    supernodal = plan.supernodal
    values = matrix.values
    trash = supernodal.buffer_size
    buffer = jnp.zeros(supernodal.buffer_size + 1, values.dtype)
    buffer = buffer.at[plan.entry_positions].add(values)
    buffer = buffer.at[supernodal.one_positions].add(1.0)

    def step_for(c):
        k, u, batch = supernodal.classes[c]
        f = k + u
        table = {name: jnp.asarray(v) for name, v in supernodal.tables[c].items()}

        def step(j, buffers):
            # As in the Cholesky factorization: no step reads what it writes.
            assembled, factored, uppers, permutations = buffers
            fronts = _fronts(assembled, table["offset"][j], batch, f)
            factors, _, permutation = jax.lax.linalg.lu(fronts[:, :k, :k])
            permutations = _set(permutations, c, j, permutation.astype(jnp.int32))
            if u:
                right = jnp.take_along_axis(fronts[:, :k, k:], permutation[:, :, None], axis=1)
                upper = _unit_lower(factors, right)
                below = jax.lax.linalg.triangular_solve(
                    factors, fronts[:, k:, :k], left_side=False, lower=False
                )
                update = fronts[:, k:, k:] - below @ upper
                columns = jnp.concatenate([factors, below], axis=1)
                uppers = _set(uppers, c, j, upper)
                assembled = extend_add(assembled, table, j, update, trash)
            else:
                columns = factors
            factored = jax.lax.dynamic_update_slice_in_dim(
                factored, columns.reshape(-1), table["factor_offset"][j], 0
            )
            return assembled, factored, uppers, permutations

        return step

    counts = [t["offset"].shape[0] for t in supernodal.tables]
    uppers = tuple(
        jnp.zeros((count, batch, k, u), values.dtype)
        for count, (k, u, batch) in zip(counts, supernodal.classes, strict=True)
    )
    permutations = tuple(
        jnp.zeros((count, batch, k), jnp.int32)
        for count, (k, _, batch) in zip(counts, supernodal.classes, strict=True)
    )
    _, lower, uppers, permutations = _run_tasks(
        supernodal,
        [step_for(c) for c in range(len(supernodal.classes))],
        (buffer, jnp.zeros(supernodal.factor_size, values.dtype), uppers, permutations),
    )
    return SupernodalLU(lower, uppers, permutations, matrix, plan)


def _set(arrays: tuple[Array, ...], c: int, j: Array, value: Array) -> tuple[Array, ...]:
    """`arrays` with `arrays[c][j] = value` (in place)."""
    updated = jax.lax.dynamic_update_index_in_dim(arrays[c], value, j, 0)
    return arrays[:c] + (updated,) + arrays[c + 1 :]
