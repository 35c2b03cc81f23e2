"""Sparse matrices with a pattern fixed at trace time, and the products the formulations
need from them.

A [`SparseMatrix`][] is its non-zero values (a JAX array of shape `(nnz,)`) plus a static
[`Pattern`][] (row and column of each value, as numpy arrays). Every operation on it is a
gather with index arrays computed once from the patterns while tracing ([`take`][]), an
elementwise product and a sum over a padded axis, so its cost is proportional to the number
of non-zeros (times the padding of the longest row) and its graph does not grow with the
size of the matrix. Products of two sparse matrices find their pattern and the pairs of
entries that meet (`sparse_matmul`) symbolically, once per pair of patterns. Banded
factorizations of such matrices are in `_banded.py`, the gathers in `_gather.py`.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._custom_types import Array, Bool, Float
from ._gather import group_by, row_sum, take
from ._linalg import (
    looped_cholesky,
    looped_substitution,
    looped_triangular_solve,
    unrolled_cholesky_factor,
    unrolled_substitution,
)


class Pattern:
    """A static sparsity pattern: the `(row, col)` of each stored entry, in row-major order.

    Hashable and compared by value, so that it can be a static field of an `eqx.Module`
    and a key of the trace-time caches.
    """

    __slots__ = ("_hash", "cols", "rows", "shape")

    def __init__(self, shape: tuple[int, int], rows, cols):
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        order = np.lexsort((cols, rows))
        self.shape = (int(shape[0]), int(shape[1]))
        self.rows, self.cols = rows[order], cols[order]
        self.rows.setflags(write=False)
        self.cols.setflags(write=False)
        self._hash = hash((self.shape, self.rows.tobytes(), self.cols.tobytes()))

    @classmethod
    def from_mask(cls, mask) -> "Pattern":
        mask = np.asarray(mask, bool)
        rows, cols = np.nonzero(mask)
        return cls(mask.shape, rows, cols)

    @classmethod
    def full(cls, shape) -> "Pattern":
        return cls.from_mask(np.ones(shape, bool))

    def mask(self) -> np.ndarray:
        out = np.zeros(self.shape, bool)
        out[self.rows, self.cols] = True
        return out

    def positions(self, rows, cols) -> np.ndarray:
        """Where the entries `(rows, cols)` (integer arrays, broadcast together) sit in a
        matrix's values on this pattern, `nnz` for those off it: by binary search in the
        row-major entries, in memory of the query's size (a table of the whole matrix would
        take `rows × cols` of it)."""
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        query = rows * self.shape[1] + cols
        if not self.nnz:
            return np.zeros(query.shape, np.int64)
        keys = self.rows * self.shape[1] + self.cols
        at = np.minimum(np.searchsorted(keys, query), self.nnz - 1)
        return np.where(keys[at] == query, at, self.nnz)

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    @property
    def density(self) -> float:
        size = self.shape[0] * self.shape[1]
        return self.nnz / size if size else 1.0

    @property
    def is_diagonal(self) -> bool:
        return self.shape[0] == self.shape[1] and bool(np.all(self.rows == self.cols))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (
            isinstance(other, Pattern)
            and self.shape == other.shape
            and np.array_equal(self.rows, other.rows)
            and np.array_equal(self.cols, other.cols)
        )

    def __repr__(self):
        return f"Pattern(shape={self.shape}, nnz={self.nnz})"


@functools.lru_cache(maxsize=256)
def _transpose(pattern: Pattern) -> tuple[Pattern, np.ndarray]:
    """The transposed pattern and the permutation taking values to its order."""
    order = np.lexsort((pattern.rows, pattern.cols))
    return Pattern(pattern.shape[::-1], pattern.cols[order], pattern.rows[order]), order


class SparseMatrix(eqx.Module):
    """A matrix stored as its values on a static [`Pattern`][] (entries off the pattern are
    zero)."""

    values: Float[Array, " nnz"]
    pattern: Pattern = eqx.field(static=True)

    @property
    def shape(self) -> tuple[int, int]:
        return self.pattern.shape

    @classmethod
    def from_dense(cls, matrix: Array, pattern: Pattern | None = None) -> "SparseMatrix":
        """The entries of `matrix` on `pattern` (default: every entry)."""
        pattern = Pattern.full(matrix.shape) if pattern is None else pattern
        return cls(take(matrix.reshape(-1), pattern.rows * matrix.shape[1] + pattern.cols), pattern)

    def dense(self) -> Array:
        # Up to `GATHER_DENSE_MAX` entries a gather of every entry (padding read as zero):
        # XLA:CPU runs a solve's while loop as one kernel only where its body has no scatter
        # (`_xla_flags.py`). Beyond, a scatter of the nnz values: where the values are
        # constant XLA folds the matrix at compile time, and its evaluator is slow on large
        # gathers (docs/design_measurements.md#dense-gather).
        p = self.pattern
        if p.shape[0] * p.shape[1] <= _thresholds.GATHER_DENSE_MAX:
            return take(self.values, p.positions(*np.indices(p.shape)))
        return (
            jnp.zeros(p.shape, self.values.dtype)
            .at[p.rows, p.cols]
            .set(self.values, indices_are_sorted=True, unique_indices=True)
        )

    @property
    def T(self) -> "SparseMatrix":
        pattern, order = _transpose(self.pattern)
        return SparseMatrix(take(self.values, order), pattern)

    def symmetrized(self) -> "SparseMatrix":
        """`(A + Aᵀ) / 2` of a square matrix whose pattern is symmetric."""
        pattern, order = _transpose(self.pattern)
        if pattern != self.pattern:
            raise ValueError("symmetrized() needs a symmetric pattern.")
        return SparseMatrix(0.5 * (self.values + take(self.values, order)), self.pattern)

    def matvec(self, x: Float[Array, " cols"]) -> Float[Array, " rows"]:
        """`A x` for `x` of shape `(cols,)`."""
        positions, cols = _rows(self.pattern)
        return row_sum(take(self.values, positions) * take(x, cols))

    def rmatvec(self, x: Float[Array, " rows"]) -> Float[Array, " cols"]:
        """`Aᵀ x` for `x` of shape `(rows,)`."""
        return self.T.matvec(x)


@functools.lru_cache(maxsize=256)
def _rows(pattern: Pattern) -> tuple[np.ndarray, np.ndarray]:
    """Per row: positions of its values (padded with `nnz`) and their columns (padded 0)."""
    positions = group_by(pattern.rows, pattern.shape[0], np.arange(pattern.nnz), pattern.nnz)
    cols = np.where(positions < pattern.nnz, _padded_np(pattern.cols)[positions], 0)
    return positions, cols


def _padded_np(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, np.zeros(1, x.dtype)])


@functools.lru_cache(maxsize=256)
def _product(a: Pattern, b: Pattern) -> tuple[Pattern, np.ndarray, np.ndarray, np.ndarray]:
    """Pattern of `A B` and, for each pair of entries `A[i, k] B[k, j]`, the positions of the
    two factors in `A`'s and `B`'s values and of the result in `A B`'s."""
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes {a.shape} and {b.shape} do not multiply")
    # entries of B grouped by row k
    b_start = np.searchsorted(b.rows, np.arange(b.shape[0] + 1))
    counts = b_start[a.cols + 1] - b_start[a.cols]  # partners of each entry of A
    a_pos = np.repeat(np.arange(a.nnz), counts)
    offsets = np.arange(a_pos.size) - np.repeat(np.cumsum(counts) - counts, counts)
    b_pos = np.repeat(b_start[a.cols], counts) + offsets
    rows, cols = a.rows[a_pos], b.cols[b_pos]
    keys = rows * b.shape[1] + cols
    unique, c_pos = np.unique(keys, return_inverse=True)
    pattern = Pattern((a.shape[0], b.shape[1]), unique // b.shape[1], unique % b.shape[1])
    # pairs grouped by the entry of the product they add to (padding: index nnz, a zero)
    pairs = group_by(c_pos.reshape(-1), pattern.nnz, np.arange(a_pos.size), a_pos.size)
    return pattern, _padded_np(a_pos)[pairs], _padded_np(b_pos)[pairs], pairs < a_pos.size


def sparse_matmul(a: SparseMatrix, b: SparseMatrix) -> SparseMatrix:
    """`A B` on the symbolic product of the patterns (cost: the number of pairs
    `A[i, k] B[k, j]`, padded to the most for one entry)."""
    pattern, a_pos, b_pos, valid = _product(a.pattern, b.pattern)
    a_values = take(a.values, np.where(valid, a_pos, a.pattern.nnz))
    values = row_sum(a_values * take(b.values, np.where(valid, b_pos, b.pattern.nnz)))
    return SparseMatrix(values, pattern)


def product_pattern(a: Pattern, b: Pattern) -> Pattern:
    """The pattern of `A B` (that of [`sparse_matmul`][]'s result)."""
    return _product(a, b)[0]


def transposed_pattern(pattern: Pattern) -> Pattern:
    """The pattern of `Aᵀ`."""
    return _transpose(pattern)[0]


def sparse_add(a: SparseMatrix, b: SparseMatrix) -> SparseMatrix:
    """`A + B` on the union of the patterns."""
    if a.shape != b.shape:
        raise ValueError(f"shapes {a.shape} and {b.shape} do not add")
    width = a.shape[1]
    keys = np.union1d(
        a.pattern.rows * width + a.pattern.cols, b.pattern.rows * width + b.pattern.cols
    )
    pattern = Pattern(a.shape, keys // width, keys % width)
    a_index = a.pattern.positions(pattern.rows, pattern.cols)
    b_index = b.pattern.positions(pattern.rows, pattern.cols)
    return SparseMatrix(take(a.values, a_index) + take(b.values, b_index), pattern)


def sparse_blocks(blocks) -> SparseMatrix:
    """The block matrix of a nested list of [`SparseMatrix`][] blocks (`None` for a zero
    block; every block row and block column holds at least one matrix)."""
    heights = [next(b.shape[0] for b in row if b is not None) for row in blocks]
    widths = [
        next(row[j].shape[1] for row in blocks if row[j] is not None) for j in range(len(blocks[0]))
    ]
    row_starts, col_starts = np.cumsum([0, *heights]), np.cumsum([0, *widths])
    rows, cols, values = [], [], []
    for i, row in enumerate(blocks):
        for j, block in enumerate(row):
            if block is not None:
                rows.append(block.pattern.rows + row_starts[i])
                cols.append(block.pattern.cols + col_starts[j])
                values.append(block.values)
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    # `Pattern` sorts its entries: reorder the values the same way.
    order = np.lexsort((cols, rows))
    pattern = Pattern((int(row_starts[-1]), int(col_starts[-1])), rows, cols)
    return SparseMatrix(take(jnp.concatenate(values), order), pattern)


@functools.lru_cache(maxsize=256)
def diagonal_blocks(pattern: Pattern) -> np.ndarray | None:
    """The coordinates of each diagonal block of a symmetric pattern (its connected
    components), as `(blocks, size)` indices padded with `-1`, or `None` if a block has more
    than `BLOCK_MAX` coordinates."""
    n = pattern.shape[0]
    parent = np.arange(n)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in zip(pattern.rows, pattern.cols, strict=False):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    roots = np.array([find(i) for i in range(n)])
    _, labels = np.unique(roots, return_inverse=True)
    sizes = np.bincount(labels)
    if sizes.max(initial=0) > _thresholds.BLOCK_MAX:
        return None
    blocks = np.full((sizes.size, sizes.max(initial=1)), -1, np.int64)
    fill = np.zeros(sizes.size, np.int64)
    for i, label in enumerate(labels):
        blocks[label, fill[label]] = i
        fill[label] += 1
    return blocks


def block_inverse(mass: SparseMatrix) -> SparseMatrix | None:
    """`M⁻¹` of a symmetric positive definite matrix made of small diagonal blocks (a
    diagonal matrix: the reciprocals), as a `SparseMatrix` on the blocks; `None` when a block
    is larger than `BLOCK_MAX` (the caller keeps a dense factorization). A block that is not
    positive definite gives non-finite values, as a failed Cholesky factorization does."""
    pattern = mass.pattern
    if pattern.is_diagonal and pattern.nnz == pattern.shape[0]:
        return SparseMatrix(1.0 / mass.values, pattern)
    blocks = diagonal_blocks(pattern)
    if blocks is None:
        return None
    size = blocks.shape[1]
    valid = blocks >= 0
    safe = np.where(valid, blocks, 0)
    entry = pattern.positions(safe[:, :, None], safe[:, None, :])  # (blocks, size, size)
    present = valid[:, :, None] & valid[:, None, :]
    values = take(mass.values, np.where(present, entry, pattern.nnz))
    padding = np.eye(size, dtype=bool)[None] & ~valid[:, :, None]
    values = jnp.where(padding, 1.0, values)
    values = 0.5 * (values + jnp.swapaxes(values, 1, 2))
    # Unrolled over the entries of a block, elementwise over the blocks: LAPACK's batched
    # `potrf` and `trsm` are custom calls, which keep a solve's loop from one kernel.
    low = jax.vmap(unrolled_cholesky_factor)(values)
    eye = jnp.eye(size, dtype=values.dtype)
    inverse_low = jax.vmap(lambda low_: unrolled_substitution(low_, eye, False))(low)
    inverse = jnp.sum(inverse_low[:, :, :, None] * inverse_low[:, :, None, :], axis=1)
    rows = np.repeat(safe, size, axis=1).reshape(-1)
    cols = np.tile(safe, (1, size)).reshape(-1)
    keep = (valid[:, :, None] & valid[:, None, :]).reshape(-1)
    out = Pattern((pattern.shape[0],) * 2, rows[keep], cols[keep])
    # `Pattern` sorts its entries: reorder the values the same way.
    order = np.lexsort((cols[keep], rows[keep]))
    return SparseMatrix(take(inverse.reshape(-1), np.flatnonzero(keep)[order]), out)


def blocks_positive_definite(mass: SparseMatrix) -> Bool[Array, ""] | None:
    """Whether a symmetric matrix made of small diagonal blocks is positive definite, block by
    block (each block's Cholesky factorization, [`block_inverse`][]; a diagonal's entries are
    positive); `None` where a block is larger than `BLOCK_MAX`."""
    pattern = mass.pattern
    if pattern.is_diagonal and pattern.nnz == pattern.shape[0]:
        return jnp.all(jnp.isfinite(mass.values) & (mass.values > 0))
    inverse = block_inverse(mass)
    if inverse is None:
        return None
    return jnp.all(jnp.isfinite(mass.values)) & jnp.all(jnp.isfinite(inverse.values))


def cholesky_factor(
    block: Float[Array, "b b"], unroll_max: int | None = None
) -> Float[Array, "b b"]:
    """The lower Cholesky factor of a small matrix (a block of the banded factorization,
    `StructuredCholesky`'s dense matrices): unrolled into elementwise operations
    up to `unroll_max` rows (default `UNROLL_MAX`), a loop of vector operations up to
    `LOOPED_MAX` (both fused with the rest of a solve's loop), LAPACK beyond. A block that is
    not positive definite gives non-finite entries."""
    b = block.shape[0]
    unroll_max = _thresholds.UNROLL_MAX if unroll_max is None else unroll_max
    if b > _thresholds.LOOPED_MAX:
        return jnp.linalg.cholesky(block)
    if b > unroll_max:
        return looped_cholesky(block)
    return unrolled_cholesky_factor(block)


def cholesky_solve(
    low: Float[Array, "b b"],
    rhs: Float[Array, "b m"],
    unroll_max: int | None = None,
    *,
    tangent: bool = False,
) -> Float[Array, "b m"]:
    """`(L Lᵀ)⁻¹ rhs` for a Cholesky factor `low` (from `cholesky_factor`), `rhs` of
    shape `(b, m)`: substitutions unrolled up to `unroll_max` rows (default `UNROLL_MAX`), loops up
    to `LOOPED_MAX`, LAPACK beyond. With `tangent` (`rhs` a tangent inside a JVP rule, which
    reverse mode transposes) the loops are [`looped_substitution`][], which JAX can
    transpose."""
    b = low.shape[0]
    unroll_max = _thresholds.UNROLL_MAX if unroll_max is None else unroll_max
    if b > _thresholds.LOOPED_MAX:
        y = jax.lax.linalg.triangular_solve(low, rhs, left_side=True, lower=True)
        return jax.lax.linalg.triangular_solve(low, y, left_side=True, lower=True, transpose_a=True)
    if b > unroll_max:
        substitution = looped_substitution if tangent else looped_triangular_solve
        return substitution(low, substitution(low, rhs, False), True)
    return unrolled_substitution(low, unrolled_substitution(low, rhs, False), True)
