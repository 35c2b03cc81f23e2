"""Banded factorizations of symmetric positive definite sparse matrices: a band Cholesky
row by row, the scalar LDLᵀ of a tridiagonal matrix, a block-tridiagonal LDLᵀ, and cyclic
reduction on accelerators, with the derivative of their solves."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._custom_types import Array, Float
from ._gather import take
from ._sparse import Pattern, SparseMatrix, cholesky_factor, cholesky_solve


class BandedPlan:
    """Static data of a block-tridiagonal factorization: the symmetric permutation, block
    size, and where each block entry sits in the matrix's values."""

    def __init__(self, pattern: Pattern, order: np.ndarray, width: int):
        size = pattern.shape[0]
        self.pattern, self.size, self.order, self.width = pattern, size, order, width
        self.blocks = -(-size // width)
        padded = self.blocks * width
        inverse = np.empty(size, np.int64)
        inverse[order] = np.arange(size)
        # Each entry's block and place in it, from the entries alone (a table of the whole
        # matrix would take `size²` memory): within the band, an entry lies in a diagonal
        # block or in the block beside it.
        block_row, row = np.divmod(inverse[pattern.rows], width)
        block_col, col = np.divmod(inverse[pattern.cols], width)
        entries = np.arange(pattern.nnz)
        diagonal = np.full((self.blocks, width, width), pattern.nnz, np.int64)
        lower = np.full((self.blocks, width, width), pattern.nnz, np.int64)
        on = block_row == block_col
        diagonal[block_row[on], row[on], col[on]] = entries[on]
        below = block_row == block_col + 1
        lower[block_row[below], row[below], col[below]] = entries[below]
        self.diagonal = diagonal  # (blocks, b, b)
        self.lower = lower  # A[i, i − 1] blocks
        self.padding = np.arange(padded) >= size  # padded rows (an identity there)
        self.inverse_order = inverse
        self.band_window, self.band_incoming = _band_indices(self)

    def block_values(self, values: Array) -> tuple[Array, Array]:
        """`(diagonal, lower)` blocks of the permuted matrix, each `(blocks, b, b)` (an
        identity on the padded rows)."""
        padding = jnp.asarray(self.padding.reshape(self.blocks, self.width), values.dtype)
        return (take(values, self.diagonal) + jax.vmap(jnp.diag)(padding), take(values, self.lower))

    def band_values(self, values: Array) -> tuple[Array, Array]:
        """`(window, incoming)` of [`BandCholeskyFactor`][]: the permuted matrix's leading
        `(b + 1) × (b + 1)` block, and for each row `j` the column that enters the window
        after it, `A[j + 1 : j + b + 2, j + b + 1]` (an identity beyond the matrix and on
        the padded rows)."""
        (window, window_ones), (incoming, incoming_ones) = self.band_window, self.band_incoming
        return (
            take(values, window) + jnp.asarray(window_ones, values.dtype),
            take(values, incoming) + jnp.asarray(incoming_ones, values.dtype),
        )

    def to_blocks(self, rhs: Array) -> Array:
        """`rhs`, `(size,)` or `(size, m)`, permuted and cut into `(blocks, width, m)`
        (padded rows zero)."""
        columns = rhs[:, None] if rhs.ndim == 1 else rhs
        padding_rows = jnp.zeros(
            (self.blocks * self.width - self.size, columns.shape[1]), columns.dtype
        )
        permuted = jnp.concatenate([take(columns, self.order), padding_rows])
        return permuted.reshape(self.blocks, self.width, -1)

    def from_blocks(self, blocks: Array, like: Array) -> Array:
        """The inverse of `to_blocks`, shaped as `like`."""
        out = take(blocks.reshape(-1, blocks.shape[-1]), self.inverse_order)
        return out[:, 0] if like.ndim == 1 else out

    def pivots(self, low: Array) -> Array:
        """The squared diagonals of the blocks' Cholesky factors `low`, `(blocks, b, b)`,
        without the padded rows."""
        squares = jnp.diagonal(low, axis1=1, axis2=2).reshape(-1) ** 2
        return take(squares, np.flatnonzero(~self.padding))

    def factor(
        self, matrix: SparseMatrix
    ) -> "BandedFactor | TridiagonalFactor | BandCholeskyFactor | CyclicReductionFactor":
        """[`banded_factor`][] on this plan."""
        return banded_factor(matrix, self)

    def solve(self, matrix: SparseMatrix, rhs: Array) -> tuple[Array, Array]:
        """[`banded_solve`][] on this plan: `(A⁻¹ rhs, pivots)`."""
        return banded_solve(matrix, rhs, self)


def _band_indices(plan: BandedPlan) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Where [`BandedPlan.band_values`][] reads its entries in the matrix's values (the
    index `nnz` reads a zero), and the identity added to them: for the window and for the
    incoming columns."""
    b, padded, nnz = plan.width, plan.blocks * plan.width, plan.pattern.nnz
    # `lower[i, k] = A[i, i − k]` of the permuted matrix, from its blocks, then `b + 1`
    # rows of an identity beyond it.
    rows, offsets = np.arange(padded)[:, None], np.arange(b + 1)[None, :]
    cols = rows - offsets
    block, row = np.divmod(rows, b)
    col_block, col = np.divmod(np.maximum(cols, 0), b)
    lower = np.where(
        col_block == block, plan.diagonal[block, row, col], plan.lower[block, row, col]
    )
    lower = np.concatenate([np.where(cols >= 0, lower, nnz), np.full((b + 1, b + 1), nnz)])
    ones = np.zeros(lower.shape)
    ones[:, 0] = np.concatenate([plan.padding, np.ones(b + 1, bool)])
    # The window: `A[i, j] = lower[max(i, j), |i − j|]`; the column entering after row `j`:
    # `A[j + 1 + i, j + b + 1] = lower[j + b + 1, b − i]`.
    i, j = np.indices((b + 1, b + 1))
    window = (np.maximum(i, j), np.abs(i - j))
    return (
        (lower[window], ones[window]),
        (lower[b + 1 :, ::-1].copy(), ones[b + 1 :, ::-1].copy()),
    )


@functools.lru_cache(maxsize=256)
def banded_plan(pattern: Pattern) -> BandedPlan | None:
    """A [`BandedPlan`][] for a symmetric pattern, or `None` where the dense Cholesky is
    the better choice (small, or not narrow enough)."""
    size = pattern.shape[0]
    if size < _thresholds.BANDED_MIN:
        return None

    def bandwidth(order):
        inverse = np.empty(size, np.int64)
        inverse[order] = np.arange(size)
        return int(np.max(np.abs(inverse[pattern.rows] - inverse[pattern.cols]), initial=0))

    natural = np.arange(size)
    best, width = natural, bandwidth(natural)
    try:
        import scipy.sparse
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        graph = scipy.sparse.csr_matrix(
            (np.ones(pattern.nnz), (pattern.rows, pattern.cols)), shape=(size, size)
        )
        rcm = np.asarray(reverse_cuthill_mckee(graph, symmetric_mode=True), np.int64)
        if bandwidth(rcm) < width:
            best, width = rcm, bandwidth(rcm)
    except ImportError:  # pragma: no cover - scipy comes with jax
        pass
    width = max(width, 1)
    if width > _thresholds.BANDED_MAX_RATIO * size:
        return None
    return BandedPlan(pattern, best, width)


class BandedFactor(eqx.Module):
    """The block LDLᵀ factorization of a symmetric positive definite block-tridiagonal
    matrix `A` (diagonal blocks `A_i`, sub-diagonal blocks `B_i = A[i, i − 1]`): the pivot
    blocks `S_0 = A_0`, `S_i = A_i − B_i S_{i−1}⁻¹ B_iᵀ`, held as their Cholesky factors, and
    the couplings `W_i = S_{i−1}⁻¹ B_iᵀ` (`W_0 = 0`), so that
    `A = L diag(S) Lᵀ` with `L` unit lower block-bidiagonal, `L[i, i − 1] = W_iᵀ`.

    **Fields:**

    - `low`: Cholesky factors of the `S_i`, `(blocks, b, b)`.
    - `coupling`: the `W_i`, `(blocks, b, b)`.
    - `plan`: the [`BandedPlan`][] (static).
    """

    low: Float[Array, "k b b"]
    coupling: Float[Array, "k b b"]
    plan: BandedPlan = eqx.field(static=True)

    @property
    def pivots(self) -> Float[Array, " size"]:
        """The pivots `D` of `P A Pᵀ = L D Lᵀ` (`L` unit lower triangular, `P` the plan's
        permutation): non-finite or not positive where `A` is not positive definite."""
        return self.plan.pivots(self.low)

    def solve(self, rhs: Array, tangent: bool = False) -> Array:
        """`A⁻¹ rhs` for `rhs` of shape `(size,)` or `(size, m)`: forward substitution,
        the pivot blocks, back substitution (two scans over the blocks). `tangent`: `rhs`
        is a tangent inside a JVP rule (see [`cholesky_solve`][])."""
        blocks = self.plan.to_blocks(rhs)

        def forward(previous, block):  # L u = rhs, then v = S⁻¹ u
            low, coupling, rhs_i = block
            u = rhs_i - coupling.T @ previous
            return u, cholesky_solve(low, u, tangent=tangent)

        _, v = jax.lax.scan(forward, jnp.zeros_like(blocks[0]), (self.low, self.coupling, blocks))
        following = jnp.concatenate([self.coupling[1:], jnp.zeros_like(self.coupling[:1])])

        def backward(next_x, block):  # Lᵀ x = v
            v_i, coupling_next = block
            x = v_i - coupling_next @ next_x
            return x, x

        _, x = jax.lax.scan(backward, jnp.zeros_like(blocks[0]), (v, following), reverse=True)
        return self.plan.from_blocks(x, rhs)


class TridiagonalFactor(eqx.Module):
    """The LDLᵀ factorization of a symmetric positive definite tridiagonal matrix `A` (after
    the plan's permutation; diagonal `a_i`, sub-diagonal `b_i = A[i, i − 1]`): the pivots
    `d_0 = a_0`, `d_i = a_i − b_i² / d_{i−1}` and the multipliers `l_i = b_i / d_{i−1}`
    (`l_0 = 0`), so that `A = L diag(d) Lᵀ` with `L` unit lower bidiagonal, `L[i, i − 1] = l_i`
    (the Thomas algorithm). A [`BandedFactor`][] with 1 × 1 blocks computes the same
    numbers with a square root and two divisions per row, and its scans carry 1 × 1
    matrices; this one carries scalars. A pivot that is not positive is replaced by nan,
    so that a matrix that is not positive definite gives a non-finite solution, as the
    Cholesky factorizations do.

    **Fields:**

    - `diagonal`: the pivots `d_i`, `(size,)`.
    - `multipliers`: the `l_i`, `(size,)`.
    - `plan`: the [`BandedPlan`][] (static), of half-bandwidth 1.
    """

    diagonal: Float[Array, " size"]
    multipliers: Float[Array, " size"]
    plan: BandedPlan = eqx.field(static=True)

    @property
    def pivots(self) -> Float[Array, " size"]:
        """The pivots `d` of `P A Pᵀ = L D Lᵀ`: nan where `A` is not positive definite."""
        return self.diagonal

    def solve(self, rhs: Array, tangent: bool = False) -> Array:
        """`A⁻¹ rhs` for `rhs` of shape `(size,)` or `(size, m)`: `L y = rhs`, `z = D⁻¹ y`,
        `Lᵀ x = z` (two scans over the rows, linear in `rhs`: JAX transposes them, so
        `tangent` changes nothing)."""
        del tangent
        rows = self.plan.to_blocks(rhs)[:, 0, :]

        def forward(previous, row):
            multiplier, rhs_i = row
            y = rhs_i - multiplier * previous
            return y, y

        _, y = jax.lax.scan(forward, jnp.zeros_like(rows[0]), (self.multipliers, rows))
        z = y / self.diagonal[:, None]
        following = jnp.concatenate([self.multipliers[1:], jnp.zeros_like(self.multipliers[:1])])

        def backward(next_x, row):
            z_i, multiplier_next = row
            x = z_i - multiplier_next * next_x
            return x, x

        _, x = jax.lax.scan(backward, jnp.zeros_like(rows[0]), (z, following), reverse=True)
        return self.plan.from_blocks(x[:, None, :], rhs)


def _tridiagonal_ldl(matrix: SparseMatrix, plan: BandedPlan) -> TridiagonalFactor:
    diag, lower = plan.block_values(matrix.values)

    def step(previous_pivot, row):
        a_i, b_i = row
        multiplier = b_i / previous_pivot
        pivot = a_i - multiplier * b_i
        pivot = jnp.where(pivot > 0, pivot, jnp.nan)
        return pivot, (pivot, multiplier)

    one = jnp.ones((), diag.dtype)
    _, (pivots, multipliers) = jax.lax.scan(step, one, (diag[:, 0, 0], lower[:, 0, 0]))
    return TridiagonalFactor(pivots, multipliers, plan)


class BandCholeskyFactor(eqx.Module):
    """The Cholesky factorization `P A Pᵀ = L Lᵀ` of a symmetric positive definite banded
    matrix (half-bandwidth `b` after the plan's permutation `P`), `L` held in band storage
    by columns as LAPACK's `?pbtrf` holds it: `columns[j, k] = L[j + k, j]`.

    Right-looking, row by row in a `lax.scan`: row `j` takes the `(b + 1) × (b + 1)`
    window of the trailing matrix that starts at row `j`, takes `L[j:j + b + 1, j]` from
    its first column (`L[j, j] = √S₀₀`), updates the rest by that column's outer product
    and appends the column that enters the band. An iteration of the scan takes one row,
    or on wide bands a few rows unrolled ([`band_rows_per_step`][]). A substitution is one
    scan over the rows carrying `b` entries. Every row is a few vector operations on
    `b + 1` entries, with no loop inside, so the solve compiles to a program of the same
    size whatever `b` is; block rows of `b` rows would hold `b × b` Cholesky factorizations
    and substitutions, unrolled (a program growing as `b²`) or as nested loops.

    **Fields:**

    - `columns`: `L` by columns, `(padded size, b + 1)`.
    - `plan`: the [`BandedPlan`][] (static).
    """

    columns: Float[Array, "n b1"]
    plan: BandedPlan = eqx.field(static=True)

    @property
    def pivots(self) -> Float[Array, " size"]:
        """The pivots `D` of `P A Pᵀ = L D Lᵀ` (`L` unit lower triangular), `L[j, j]²`:
        non-finite or not positive where `A` is not positive definite."""
        return take(self.columns[:, 0] ** 2, np.flatnonzero(~self.plan.padding))

    def solve(self, rhs: Array, tangent: bool = False) -> Array:
        """`A⁻¹ rhs` for `rhs` of shape `(size,)` or `(size, m)`: `L y = P rhs` by a scan
        down the rows, `Lᵀ x = y` by a scan up. The scans are linear in `rhs`, so JAX
        transposes them whether or not `rhs` is a tangent (`tangent` is accepted for the
        interface of [`BandedFactor.solve`][])."""
        del tangent
        blocks = self.plan.to_blocks(rhs)
        rows = blocks.reshape(-1, blocks.shape[-1])
        pending = jnp.zeros((self.plan.width,) + rows.shape[1:], rows.dtype)

        def forward(pending, row):  # `pending`: what rows j … j + b − 1 still subtract
            column, rhs_j = row
            y = (rhs_j - pending[0]) / column[0]
            pending = jnp.concatenate([pending[1:], jnp.zeros_like(pending[:1])])
            return pending + column[1:, None] * y[None, :], y

        _, y = jax.lax.scan(forward, pending, (self.columns, rows))

        def backward(following, row):  # `following`: x[j + 1 … j + b]
            column, y_j = row
            x = (y_j - column[1:] @ following) / column[0]
            return jnp.concatenate([x[None, :], following[:-1]]), x

        _, x = jax.lax.scan(backward, pending, (self.columns, y), reverse=True)
        return self.plan.from_blocks(x.reshape(blocks.shape), rhs)


def band_rows_per_step(width: int) -> int:
    """Rows of [`BandCholeskyFactor`][]'s factorization per iteration of its scan for a
    half-bandwidth `width`: `BAND_CHOLESKY_ROWS_PER_STEP` from `BAND_CHOLESKY_UNROLL_WIDTH`
    on, else 1."""
    if width >= _thresholds.BAND_CHOLESKY_UNROLL_WIDTH:
        return _thresholds.BAND_CHOLESKY_ROWS_PER_STEP
    return 1


def _band_cholesky(matrix: SparseMatrix, plan: BandedPlan) -> BandCholeskyFactor:
    window, incoming = plan.band_values(matrix.values)
    b = plan.width
    size = incoming.shape[0]
    # Several rows per iteration, unrolled: XLA fuses their window updates, which a wide
    # band's factorization spends its time on (the same operations in the same order).
    # Rows past the matrix enter as rows of the identity, and their columns are dropped.
    # (`jax.lax.scan`'s own `unroll`, which gives the same factor, ran the solves' steps
    # slower: docs/design_measurements.md#band-cholesky.)
    per_step = band_rows_per_step(b)
    steps = -(-size // per_step)
    beyond = jnp.zeros((steps * per_step - size, b + 1), incoming.dtype).at[:, b].set(1.0)
    entering_rows = jnp.concatenate([incoming, beyond]).reshape(steps, per_step, b + 1)

    def rows(window, entering):
        columns = []
        for entering_row in entering:
            column = window[:, 0] / jnp.sqrt(window[0, 0])
            trailing = window[1:, 1:] - column[1:, None] * column[None, 1:]
            window = jnp.concatenate(
                [
                    jnp.concatenate([trailing, entering_row[:b, None]], axis=1),
                    entering_row[None, :],
                ]
            )
            columns.append(column)
        return window, jnp.stack(columns)

    _, columns = jax.lax.scan(rows, window, entering_rows)
    return BandCholeskyFactor(columns.reshape(-1, b + 1)[:size], plan)


def _shifted(blocks: Array, shift: Array, fill: Array) -> Array:
    """`out[i] = blocks[i + shift]` (`shift` may be negative and traced), `fill` where
    `i + shift` falls outside."""
    index = jnp.arange(blocks.shape[0]) + shift
    inside = (index >= 0) & (index < blocks.shape[0])
    rolled = jnp.roll(blocks, -shift, axis=0)
    return jnp.where(inside.reshape((-1,) + (1,) * (blocks.ndim - 1)), rolled, fill)


def _block_solve_right(low: Array, blocks: Array) -> Array:
    """`blocks[i] S_i⁻¹` for Cholesky factors `low[i]` of symmetric `S_i`, batched."""
    return jnp.swapaxes(jax.vmap(cholesky_solve)(low, jnp.swapaxes(blocks, 1, 2)), 1, 2)


class CyclicReductionFactor(eqx.Module):
    """Parallel cyclic reduction of a symmetric positive definite block-tridiagonal matrix
    `A` (diagonal blocks `A_i`, sub-diagonal blocks `B_i = A[i, i − 1]`), the form of
    [`BandedFactor`][] for accelerators: `⌈log₂ k⌉` levels of batched block operations
    instead of `k` sequential block rows, `O(k log k · b³)` work.

    At the level of stride `s` every block row `i` eliminates its neighbours `i ± s`:
    with `α_i = B_i S_{i−s}⁻¹`, `γ_i = B_{i+s}ᵀ S_{i+s}⁻¹`,
    `S_i ← S_i − α_i B_iᵀ − γ_i B_{i+s}`, `B_i ← −α_i B_{i−s}` (now coupling `i` to
    `i − 2s`) and a right-hand side `r_i ← r_i − α_i r_{i−s} − γ_i r_{i+s}`. Each level's
    rows with the same index modulo `2s` form a Schur complement of the last level's (an
    odd–even reduction), so the blocks stay positive definite; after the last level the
    rows are uncoupled, `x_i = S_i⁻¹ r_i`. On a GPU the sequential factorization's loop
    costs a kernel launch per block row and per stage; this one a few per level.

    Below float64 a solve takes one step of iterative refinement: in float32 the reduction's
    rounding made the ODE solver's error estimate reject steps; refined, it takes as many
    steps as the sequential factorization (docs/design_measurements.md#cyclic-reduction).

    **Fields:**

    - `alphas`, `gammas`: the `α_i`, `γ_i` of every level, `(levels, k, b, b)`.
    - `low`: Cholesky factors of the final, uncoupled `S_i`, `(k, b, b)`.
    - `matrix`: `A` (for the refinement's residual).
    - `plan`: the [`BandedPlan`][] (static).
    """

    alphas: Float[Array, "l k b b"]
    gammas: Float[Array, "l k b b"]
    low: Float[Array, "k b b"]
    matrix: SparseMatrix
    plan: BandedPlan = eqx.field(static=True)

    @property
    def pivots(self) -> Float[Array, " size"]:
        """Pivots of symmetric eliminations of `A` (for each block, the order that
        eliminates it last; each lies between `A`'s extreme eigenvalues): non-finite or not
        positive where `A` is not positive definite."""
        return self.plan.pivots(self.low)

    def solve(self, rhs: Array, tangent: bool = False) -> Array:
        """`A⁻¹ rhs` for `rhs` of shape `(size,)` or `(size, m)`: one batched update per
        level, then the uncoupled block solves (twice below float64, see above). The block
        solves are batched, so JAX transposes them whether or not `rhs` is a tangent."""
        del tangent
        x = self._reduced_solve(rhs)
        if jnp.finfo(x.dtype).bits >= 64:
            return x
        product = self.matrix.matvec if rhs.ndim == 1 else jax.vmap(self.matrix.matvec, 1, 1)
        return x + self._reduced_solve(rhs - product(x))

    def _reduced_solve(self, rhs: Array) -> Array:
        blocks = self.plan.to_blocks(rhs)
        zero = jnp.zeros((), blocks.dtype)

        def level(r, xs):
            alpha, gamma, stride = xs
            return (
                r - alpha @ _shifted(r, -stride, zero) - gamma @ _shifted(r, stride, zero)
            ), None

        blocks, _ = jax.lax.scan(
            level, blocks, (self.alphas, self.gammas, _strides(self.plan.blocks))
        )
        return self.plan.from_blocks(jax.vmap(cholesky_solve)(self.low, blocks), rhs)


def _strides(blocks: int) -> Array:
    """The strides `1, 2, 4, …` of cyclic reduction's `⌈log₂ blocks⌉` levels."""
    return jnp.asarray(2 ** np.arange(max(int(blocks - 1).bit_length(), 0)), jnp.int32)


def _cyclic_reduction(matrix: SparseMatrix, plan: BandedPlan) -> CyclicReductionFactor:
    diag, lower = plan.block_values(matrix.values)
    eye = jnp.eye(plan.width, dtype=diag.dtype)
    zero = jnp.zeros((), diag.dtype)

    def level(carry, stride):
        pivot, coupling = carry  # S_i, and B_i coupling row i to row i − stride
        low = jax.vmap(cholesky_factor)(pivot)
        alpha = _block_solve_right(_shifted(low, -stride, eye), coupling)
        above = jnp.swapaxes(_shifted(coupling, stride, zero), 1, 2)  # B_{i+s}ᵀ
        gamma = _block_solve_right(_shifted(low, stride, eye), above)
        pivot = pivot - alpha @ jnp.swapaxes(coupling, 1, 2) - gamma @ jnp.swapaxes(above, 1, 2)
        coupling = -alpha @ _shifted(coupling, -stride, zero)
        return (0.5 * (pivot + jnp.swapaxes(pivot, 1, 2)), coupling), (alpha, gamma)

    (pivot, _), (alphas, gammas) = jax.lax.scan(level, (diag, lower), _strides(plan.blocks))
    return CyclicReductionFactor(alphas, gammas, jax.vmap(cholesky_factor)(pivot), matrix, plan)


def cyclic_reduction_default() -> bool:
    """Whether banded matrices are factorized by cyclic reduction
    ([`CyclicReductionFactor`][]) rather than block row by block row
    ([`BandedFactor`][]): where JAX's default backend is an accelerator, whose kernel
    launches make the sequential loop's cost the number of block rows. Read while tracing."""
    return jax.default_backend() != "cpu"


def banded_factor(
    matrix: SparseMatrix, plan: BandedPlan, cyclic: bool | None = None
) -> BandedFactor | TridiagonalFactor | BandCholeskyFactor | CyclicReductionFactor:
    """The factorization of a symmetric positive definite sparse `A` on `plan`: with
    `cyclic` (default: [`cyclic_reduction_default`][]) a [`CyclicReductionFactor`][];
    otherwise a [`BandCholeskyFactor`][] (one scan over the rows) from a half-bandwidth of
    `BAND_CHOLESKY_MIN_WIDTH`, below it a [`TridiagonalFactor`][] for a half-bandwidth of 1
    and a [`BandedFactor`][] (one scan over the block rows) for wider bands."""
    if cyclic_reduction_default() if cyclic is None else cyclic:
        return _cyclic_reduction(matrix, plan)
    if plan.width >= _thresholds.BAND_CHOLESKY_MIN_WIDTH:
        return _band_cholesky(matrix, plan)
    if plan.width == 1:
        return _tridiagonal_ldl(matrix, plan)
    return _block_ldl(matrix, plan)


def _block_ldl(matrix: SparseMatrix, plan: BandedPlan) -> BandedFactor:
    diag, lower = plan.block_values(matrix.values)

    def step(previous_low, block):
        diag_i, lower_i = block
        coupling = cholesky_solve(previous_low, lower_i.T)
        low = cholesky_factor(diag_i - lower_i @ coupling)
        return low, (low, coupling)

    eye = jnp.eye(plan.width, dtype=diag.dtype)
    _, (low, coupling) = jax.lax.scan(step, eye, (diag, lower))
    return BandedFactor(low, coupling, plan)


def banded_solve(
    matrix: SparseMatrix, rhs: Array, plan: BandedPlan, cyclic: bool | None = None
) -> tuple[Array, Array]:
    """`(A⁻¹ rhs, pivots)` of a symmetric positive definite sparse `A` on `plan`; `rhs` of
    shape `(size,)` or `(size, m)`; factorized as [`banded_factor`][] says (`cyclic`).
    The pivots are those of symmetric eliminations of `A` (non-finite where `A` is not
    positive definite; see [`BandedFactor`][]); they are a diagnostic, not differentiated
    (zero tangents).

    Differentiated implicitly, `d(A⁻¹ r) = A⁻¹ (dr − dA A⁻¹ r)`, with the factorization of
    the solve: a derivative costs a solve with the same factor, not the derivative of the
    factorization."""
    cyclic = cyclic_reduction_default() if cyclic is None else bool(cyclic)
    return _banded_solve(plan, cyclic, matrix.values, rhs)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _banded_solve(plan, cyclic, values, rhs):
    factor = banded_factor(SparseMatrix(values, plan.pattern), plan, cyclic)
    return factor.solve(rhs), factor.pivots


@_banded_solve.defjvp
def _banded_solve_jvp(plan, cyclic, primals, tangents):
    values, rhs = primals
    d_values, d_rhs = tangents
    factor = banded_factor(SparseMatrix(values, plan.pattern), plan, cyclic)
    x = factor.solve(rhs)
    d_matrix = SparseMatrix(d_values, plan.pattern)
    d_matrix_x = d_matrix.matvec(x) if x.ndim == 1 else jax.vmap(d_matrix.matvec, 1, 1)(x)
    return (x, factor.pivots), (
        factor.solve(d_rhs - d_matrix_x, tangent=True),
        jnp.zeros_like(factor.pivots),
    )
