"""Small dense linear algebra, unrolled for the tiny matrices of mechanical systems.

The systems here have a handful of coordinates and constraints. LAPACK routines (Cholesky,
LU, SVD, eigenvalues) lower to custom calls that XLA cannot fuse: on the CPU each is a kernel
with its own dispatch, and under `vmap` a loop over the batch of 2 × 2 matrices. These
helpers use elementwise JAX operations (or closed forms) up to a small size, and LAPACK
through lineax or `jnp.linalg` beyond it.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
import lineax as lx

from .. import _thresholds
from .._custom_types import Array, ArrayLike, Bool, Float, Int, ScalarLike
from ._jaxlib import LAPACK_BATCHES_CAN_DEADLOCK

# The signature of a function that a decorator here returns unchanged in its types.
_P = ParamSpec("_P")
_R = TypeVar("_R")


def full_precision(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn` with JAX's matrix products at full precision, unless the user set
    `jax_default_matmul_precision`.

    On GPUs JAX multiplies float32 matrices in TF32 by default (a 10-bit mantissa): float32
    solves then lose accuracy, and the rounding noise makes the step-size controller take
    many more steps (docs/design_measurements.md#full-precision). Each product records its
    precision when traced, and the products of a gradient are transposes of those, so
    gradients keep it too; a custom VJP's backward pass, traced when JAX transposes (after
    `fn` returned), takes this decorator itself, or it also misses the jit caches.
    """

    @functools.wraps(fn)
    def with_full_precision(*args, **kwargs):
        if jax.config.jax_default_matmul_precision is not None:
            return fn(*args, **kwargs)
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return with_full_precision


def spd_operator(matrix) -> lx.MatrixLinearOperator:
    """`matrix` as a lineax operator tagged positive semidefinite."""
    return lx.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)


def _looped_cholesky(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    n = matrix.shape[0]
    index = jnp.arange(n)

    def column(j, low):
        row = jax.lax.dynamic_index_in_dim(low, j, 0, keepdims=False)  # L[j, :j], zeros after
        entries = jax.lax.dynamic_index_in_dim(matrix, j, 1, keepdims=False) - low @ row
        pivot = jnp.sqrt(jax.lax.dynamic_index_in_dim(entries, j, 0, keepdims=False))
        values = jnp.where(index > j, entries / pivot, jnp.where(index == j, pivot, 0.0))
        return jax.lax.dynamic_update_slice_in_dim(low, values[:, None], j, 1)

    return jax.lax.fori_loop(0, n, column, jnp.zeros_like(matrix))


def looped_substitution(
    low: Float[Array, "n n"], rhs: Float[Array, "n m"], transpose: bool
) -> Float[Array, "n m"]:
    """`L⁻¹ rhs` (or `L⁻ᵀ rhs` where `transpose`) for a lower triangular `L` by a
    `lax.fori_loop` over the rows, differentiated and transposed by JAX through the loop and
    batched as a loop. [`looped_triangular_solve`][] is the same loop with a faster batched
    form, which JAX cannot transpose: a substitution of a tangent inside a JVP rule, which
    JAX's reverse mode transposes, takes this one."""
    n = low.shape[0]
    rows = low.T if transpose else low

    def row_step(k, x):
        i = n - 1 - k if transpose else k
        row = jax.lax.dynamic_index_in_dim(rows, i, 0, keepdims=False)
        entry = jax.lax.dynamic_index_in_dim(rhs, i, 0, keepdims=False) - row @ x
        value = entry / jax.lax.dynamic_index_in_dim(row, i, 0, keepdims=False)
        return jax.lax.dynamic_update_slice_in_dim(x, value[None, :], i, 0)

    return jax.lax.fori_loop(0, n, row_step, jnp.zeros_like(rhs))


def unrolled_cholesky_factor(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """[`unrolled_cholesky`][] as a lower triangular matrix."""
    n = matrix.shape[0]
    low = unrolled_cholesky(matrix)
    zero = jnp.zeros((), matrix.dtype)
    return jnp.stack(
        [jnp.stack([low[i][j] if j <= i else zero for j in range(n)]) for i in range(n)]
    )


def unrolled_substitution(
    low: Float[Array, "n n"], rhs: Float[Array, "n m"], transpose: bool
) -> Float[Array, "n m"]:
    """`L⁻¹ rhs` (or `L⁻ᵀ rhs` where `transpose`) for a lower triangular `L`, unrolled into
    elementwise operations."""
    n = low.shape[0]
    x = [None] * n
    for i in reversed(range(n)) if transpose else range(n):
        entry = rhs[i]
        for k in range(i + 1, n) if transpose else range(i):
            entry = entry - (low[k, i] if transpose else low[i, k]) * x[k]
        x[i] = entry / low[i, i]
    return jnp.stack(x)


def _batched_otherwise(looped: Callable, small: Callable, lapack: Callable) -> Callable:
    """`looped` (a function of arrays), whose `vmap` is `small` batched by `jax.vmap` for
    matrices of up to `UNROLL_MAX` rows and `lapack` applied to the batch beyond (every
    argument batched along axis 0): batched elementwise operations and LAPACK's batched
    routines are faster than a batched loop. On the CPU with a jaxlib whose batched LAPACK
    calls can deadlock (`_jaxlib.lapack_batches_can_deadlock`), the batched loop instead."""
    function = jax.custom_batching.custom_vmap(looped)

    @function.def_vmap
    def _(axis_size, in_batched, *args):
        args = [
            x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
            for x, batched in zip(args, in_batched, strict=True)
        ]
        if args[0].shape[-1] <= _thresholds.UNROLL_MAX:
            return jax.vmap(small)(*args), True
        if LAPACK_BATCHES_CAN_DEADLOCK:
            return jax.lax.platform_dependent(*args, cpu=jax.vmap(looped), default=lapack), True
        return lapack(*args), True

    return function


_cholesky = _batched_otherwise(
    _looped_cholesky,
    unrolled_cholesky_factor,
    lambda a: jax.lax.linalg.cholesky(a, symmetrize_input=False),
)
_substitutions = {
    transpose: _batched_otherwise(
        functools.partial(looped_substitution, transpose=transpose),
        functools.partial(unrolled_substitution, transpose=transpose),
        functools.partial(
            jax.lax.linalg.triangular_solve, left_side=True, lower=True, transpose_a=transpose
        ),
    )
    for transpose in (False, True)
}


@jax.custom_jvp
def looped_cholesky(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """The lower Cholesky factor of a symmetric positive definite matrix (its lower triangle
    is read), by a `lax.fori_loop` over the columns, each a few whole-vector operations that
    XLA fuses with a surrounding loop (no LAPACK call; see `LOOPED_MAX`). A matrix that is
    not positive definite gives non-finite entries. Under `jax.vmap`, unrolled up to
    `UNROLL_MAX` rows, LAPACK's batched factorization beyond (`_batched_otherwise`).

    Differentiated by the factorization's own rule, `dL = L Φ(L⁻¹ dA L⁻ᵀ)` (`Φ`: the lower
    triangle with the diagonal halved), with the same loops, not through the loop."""
    return _cholesky(matrix)


@looped_cholesky.defjvp
def _looped_cholesky_jvp(primals, tangents):
    (matrix,), (d_matrix,) = primals, tangents
    low = _cholesky(matrix)
    # Masks, not `jnp.diagonal` (a gather, whose transpose is a scatter: see `LOOPED_MAX`).
    rows, cols = jnp.indices(matrix.shape)
    d_matrix = jnp.where(rows >= cols, d_matrix, d_matrix.T)  # what the factorization reads
    inner = looped_substitution(low, looped_substitution(low, d_matrix, False).T, False)
    phi = jnp.where(rows > cols, inner, jnp.where(rows == cols, 0.5 * inner, 0.0))
    return low, low @ phi


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def looped_triangular_solve(
    low: Float[Array, "n n"], rhs: Float[Array, "n m"], transpose: bool = False
) -> Float[Array, "n m"]:
    """`L⁻¹ rhs` (or `L⁻ᵀ rhs` where `transpose`) for a lower triangular `L`, by forward (back)
    substitution in a `lax.fori_loop` over the rows (under `jax.vmap`, unrolled up to
    `UNROLL_MAX` rows, LAPACK's batched triangular solve beyond: `_batched_otherwise`).
    Differentiated implicitly, `dx = L⁻¹ (d rhs − dL x)`."""
    return _substitutions[transpose](low, rhs)


@looped_triangular_solve.defjvp
def _looped_triangular_solve_jvp(transpose, primals, tangents):
    (low, rhs), (d_low, d_rhs) = primals, tangents
    x = _substitutions[transpose](low, rhs)
    residual = d_rhs - (d_low.T if transpose else d_low) @ x
    return x, looped_substitution(low, residual, transpose)


def small_matmul(a: Array, b: Array) -> Array:
    """`a @ b` (`b` a matrix or a vector) as a broadcast product and a sum, which XLA fuses
    with its neighbours, for small operands; `a @ b` otherwise."""
    if max(a.shape + b.shape, default=0) > _thresholds.UNROLL_MAX:
        return a @ b
    if b.ndim == 1:
        return jnp.sum(a * b, axis=-1)
    return jnp.sum(a[:, :, None] * b[None, :, :], axis=1)


def spd_solve(matrix: Float[Array, "n n"], rhs: Array) -> Array:
    """Solves `matrix @ x = rhs` for a symmetric positive definite `matrix`, `rhs` of shape
    `(n,)` or `(n, k)`: an unrolled Cholesky for `n <= UNROLL_MAX`, else `lineax.Cholesky`.

    Like `lineax.linear_solve(..., throw=False)`, a matrix that is not positive definite
    gives non-finite values (which make the ODE solver reject the step), not an error.
    """
    n = matrix.shape[0]
    if n == 0:
        return rhs
    if n > _thresholds.UNROLL_MAX:
        solver = lx.Cholesky()
        solve = lambda b: lx.linear_solve(spd_operator(matrix), b, solver, throw=False).value  # noqa: E731
        return solve(rhs) if rhs.ndim == 1 else jax.vmap(solve, in_axes=1, out_axes=1)(rhs)
    low = unrolled_cholesky(matrix)
    y = []
    for i in range(n):
        entry = rhs[i]
        for k in range(i):
            entry = entry - low[i][k] * y[k]
        y.append(entry / low[i][i])
    x = [None] * n
    for i in reversed(range(n)):
        entry = y[i]
        for k in range(i + 1, n):
            entry = entry - low[k][i] * x[k]
        x[i] = entry / low[i][i]
    return jnp.stack(x)


def unrolled_cholesky(matrix) -> list[list]:
    """The lower Cholesky factor of a small matrix as nested lists of scalars; a matrix that
    is not positive definite gives a non-positive pivot, whose square root is nan or 0.

    The entries are read behind an optimization barrier. Each is a slice reshaped to a
    scalar, and XLA's reshape mover sinks reshapes through elementwise operations one
    operation per round of its simplification pipeline: the factorization's chain of
    operations on reshaped entries would keep that pipeline running to its round limit
    over the whole program (docs/design_measurements.md#reshape-chains)."""
    n = matrix.shape[0]
    entries = jax.lax.optimization_barrier([matrix[i, j] for i in range(n) for j in range(n)])
    a = [entries[i * n : (i + 1) * n] for i in range(n)]
    low = [[None] * n for _ in range(n)]
    for j in range(n):
        diag = a[j][j]
        for k in range(j):
            diag = diag - low[j][k] * low[j][k]
        low[j][j] = jnp.sqrt(diag)
        for i in range(j + 1, n):
            entry = a[i][j]
            for k in range(j):
                entry = entry - low[i][k] * low[j][k]
            low[i][j] = entry / low[j][j]
    return low


def is_positive_definite(matrix: Float[Array, "n n"]) -> Bool[Array, ""]:
    """Whether a symmetric matrix is positive definite (False for non-finite entries).

    By a Cholesky factorization (positive pivots): unrolled for small matrices, LAPACK's for
    larger ones, which fails (non-finite entries) where the matrix is not positive definite.
    (Far cheaper than its lowest eigenvalue: docs/design_measurements.md#positive-definite.)
    """
    n = matrix.shape[0]
    finite = jnp.all(jnp.isfinite(matrix))
    if n == 0:
        return finite
    if n > _thresholds.UNROLL_MAX:
        low = jnp.linalg.cholesky(jnp.where(finite, matrix, 0.0))
        diagonal = jnp.diagonal(low)
        return finite & jnp.all(jnp.isfinite(low)) & jnp.all(diagonal > 0)
    low = unrolled_cholesky(matrix)
    pivots = jnp.stack([low[i][i] for i in range(n)])
    return finite & jnp.all(pivots > 0)


def cholesky_pivots(matrix: Float[Array, "n n"]) -> Float[Array, " n"]:
    """The pivots `D` of `matrix = L D Lᵀ` (`L` unit lower triangular): the squared diagonal of
    the Cholesky factor (unrolled up to `UNROLL_MAX`, LAPACK beyond). Non-finite where the
    matrix is not positive definite."""
    n = matrix.shape[0]
    if n <= _thresholds.UNROLL_MAX:
        low = unrolled_cholesky(matrix)
        return jnp.stack([low[i][i] ** 2 for i in range(n)])
    return jnp.diagonal(jnp.linalg.cholesky(matrix)) ** 2


def gram_eigenvalues(matrix: Float[Array, "c n"]) -> Float[Array, " c"]:
    """The eigenvalues of `A Aᵀ`, ascending: the squared singular values of `A`. In closed
    form for one or two rows ([`extreme_eigenvalues`][])."""
    gram = matrix @ matrix.T
    if matrix.shape[0] == 0:
        return jnp.zeros(0, matrix.dtype)
    if matrix.shape[0] <= 2:
        return jnp.stack(extreme_eigenvalues(gram)[: matrix.shape[0]])
    return jnp.linalg.eigvalsh(gram)


def extreme_eigenvalues(matrix: Float[Array, "c c"]) -> tuple[Array, Array]:
    """`(λ_min, λ_max)` of a symmetric matrix; in closed form for sizes 1 and 2, which
    the failure checks evaluate at every step (`eigvalsh` is a LAPACK call that XLA cannot
    fuse)."""
    if matrix.shape[0] == 1:
        return matrix[0, 0], matrix[0, 0]
    if matrix.shape[0] == 2:
        a, d, b = matrix[0, 0], matrix[1, 1], 0.5 * (matrix[0, 1] + matrix[1, 0])
        largest = 0.5 * (a + d) + jnp.sqrt((0.5 * (a - d)) ** 2 + b**2)
        smallest = (a * d - b**2) / jnp.where(largest == 0, 1.0, largest)
        return smallest, largest
    eig = jnp.linalg.eigvalsh(matrix)
    return eig[0], eig[-1]


def reciprocal_condition(matrix: Float[Array, "c c"]) -> Float[Array, ""]:
    """`λ_min / λ_max` of a symmetric positive semidefinite matrix (1 for an empty one)."""
    if matrix.shape[0] == 0:
        return jnp.ones((), matrix.dtype)
    smallest, largest = extreme_eigenvalues(matrix)
    return smallest / jnp.maximum(largest, jnp.finfo(matrix.dtype).tiny)


def psd_pseudo_solve(
    matrix: Float[Array, "c c"], rhs: Float[Array, " c"], rcond: ScalarLike
) -> Float[Array, " c"]:
    """`A⁺ rhs` for a symmetric positive semidefinite `A`: the Moore–Penrose inverse with
    eigenvalues below `rcond · λ_max` treated as zero, as `lineax.SVD(rcond)` does.

    In closed form for sizes 1 and 2 ([`psd_pseudo_inverse`][]), `lineax.SVD` beyond.
    """
    size = matrix.shape[0]
    if size == 0:
        return rhs
    if size > 2:
        solver = lx.SVD(rcond=rcond)
        return lx.linear_solve(spd_operator(matrix), rhs, solver, throw=False).value
    return small_matmul(psd_pseudo_inverse(matrix, rcond), rhs)


def psd_pseudo_inverse(matrix: Float[Array, "c c"], rcond: ScalarLike) -> Float[Array, "c c"]:
    """`A⁺` of a symmetric positive semidefinite `A`, eigenvalues below `rcond · λ_max`
    treated as zero.

    In closed form for sizes 1 and 2 (a constraint written twice, a closure equation with
    its redundant twin), where the SVD's LAPACK call at every stage slows a whole
    simulation several times (docs/design_measurements.md#closed-form-pseudo-inverse). For size 2
    with `λ_min ≤ rcond · λ_max`, `A − λ_min I = (λ_max − λ_min) v vᵀ` gives the rank-1 inverse
    `v vᵀ / λ_max`. Each branch is evaluated with safe denominators, so the one not taken cannot put
    a nan into the gradient.

    Beyond, by a symmetric eigendecomposition (LAPACK): the solves of an ODE's right-hand
    side use [`pivoted_pseudo_solve`][] up to `LOOPED_MAX` rows instead.
    """
    size = matrix.shape[0]
    if size == 0:
        return matrix
    tiny = jnp.finfo(matrix.dtype).tiny
    if size > 2:
        eigenvalues, vectors = jnp.linalg.eigh(0.5 * (matrix + matrix.T))
        keep = eigenvalues > rcond * jnp.maximum(eigenvalues[-1], tiny)
        inverse = jnp.where(keep, 1.0 / jnp.where(keep, eigenvalues, 1.0), 0.0)
        return (vectors * inverse) @ vectors.T
    if size == 1:
        a = matrix[0, 0]
        nonzero = a > tiny
        return jnp.where(nonzero, 1.0 / jnp.where(nonzero, a, 1.0), 0.0).reshape(1, 1)
    a, d, b = matrix[0, 0], matrix[1, 1], 0.5 * (matrix[0, 1] + matrix[1, 0])
    smallest, largest = extreme_eigenvalues(matrix)
    full_rank = smallest > rcond * largest
    rank_one = ~full_rank & (largest > tiny)
    det = jnp.where(full_rank, a * d - b * b, 1.0)
    inverse = jnp.stack([jnp.stack([d, -b]), jnp.stack([-b, a])]) / det
    gap = jnp.where(rank_one, (largest - smallest) * largest, 1.0)
    eye = jnp.eye(2, dtype=matrix.dtype)
    truncated = (jnp.stack([jnp.stack([a, b]), jnp.stack([b, d])]) - smallest * eye) / gap
    return jnp.where(full_rank, inverse, jnp.where(rank_one, truncated, 0.0))


def pivoted_cholesky(
    matrix: Float[Array, "n n"], rcond: ScalarLike
) -> tuple[Float[Array, "n n"], Float[Array, " n"], Int[Array, " n"]]:
    """The Cholesky factorization with symmetric (diagonal) pivoting of a symmetric positive
    semidefinite matrix, stopped at its numerical rank: `(low, pivots, order)` with
    `matrix = low diag(pivots) lowᵀ`; column `k` of `low` is the one eliminated at step `k`,
    of row `order[k]`, so `low[order]` is unit lower trapezoidal (its rows are left in the
    matrix's order: nothing is swapped).

    At step `k` the row with the largest diagonal entry of the Schur complement among those
    not yet eliminated is eliminated; once that entry is at most `rcond` times the largest
    diagonal entry of `matrix`, it and every later pivot are set to zero, with their
    columns of `low` (the criterion of LAPACK's `?pstrf`, Higham, *Accuracy and Stability of
    Numerical Algorithms*, §10.3). The entries of `low` are at most 1 in magnitude. A
    `lax.fori_loop` over the columns, each a few whole-vector operations and one rank-1
    update (no LAPACK call).
    """
    n = matrix.shape[0]
    rows = jnp.arange(n)
    # A mask, not `jnp.diagonal` (a gather, whose transpose is a scatter: see `LOOPED_MAX`).
    diagonal = jnp.sum(jnp.where(rows[:, None] == rows[None, :], matrix, 0.0), axis=1)
    cut = rcond * jnp.max(diagonal)

    def column(k, state):
        a, low, pivots, order, diagonal, remaining = state
        p = jnp.argmax(jnp.where(remaining, diagonal, -jnp.inf))
        pivot = jax.lax.dynamic_index_in_dim(diagonal, p, 0, keepdims=False)
        keep = pivot > cut
        remaining = remaining & (rows != p)
        entries = jax.lax.dynamic_index_in_dim(a, p, 1, keepdims=False)
        values = jnp.where(remaining & keep, entries / jnp.where(keep, pivot, 1.0), 0.0)
        low = jax.lax.dynamic_update_slice_in_dim(
            low, (values + jnp.where((rows == p) & keep, 1.0, 0.0))[:, None], k, 1
        )
        kept_pivot = jnp.where(keep, pivot, 0.0)
        pivots = jnp.where(rows == k, kept_pivot, pivots)
        order = jnp.where(rows == k, p, order)
        a = a - kept_pivot * values[:, None] * values[None, :]
        diagonal = diagonal - kept_pivot * values**2
        return a, low, pivots, order, diagonal, remaining

    zeros = jnp.zeros_like(matrix)
    _, low, pivots, order, _, _ = jax.lax.fori_loop(
        0, n, column, (matrix, zeros, jnp.zeros(n, matrix.dtype), rows, diagonal, jnp.ones(n, bool))
    )
    return low, pivots, order


class PivotedPseudoFactor(NamedTuple):
    """[`pivoted_cholesky`][]'s `low` and `pivots`, and the inverse of `LᵀL` (the cut columns
    of `L` replaced by unit vectors), for [`pivoted_pseudo_solve`][]."""

    low: Array
    pivots: Array
    gram_inverse: Array


def pivoted_pseudo_factor(matrix: Float[Array, "n n"], rcond: ScalarLike) -> PivotedPseudoFactor:
    """The factorization of a symmetric positive semidefinite `matrix` from which
    [`pivoted_pseudo_solve`][] applies its Moore–Penrose inverse (of numerical rank set by
    `rcond`, as [`pivoted_cholesky`][] decides it). The inverse of `LᵀL` by
    [`looped_inverse`][]: one loop where its Cholesky factor and the four substitutions of
    a solve would take five, each inlined at every use (compile time:
    docs/design_measurements.md#lcp-last-solve)."""
    low, pivots, _ = pivoted_cholesky(0.5 * (matrix + matrix.T), rcond)
    gram = low.T @ low + jnp.diag(jnp.where(pivots > 0, 0.0, 1.0))
    return PivotedPseudoFactor(low, pivots, looped_inverse(gram))


def pivoted_pseudo_solve(factor: PivotedPseudoFactor, rhs: Array) -> Array:
    """`A⁺ rhs` from `pivoted_pseudo_factor(A)`, `rhs` of shape `(n,)` or `(n, k)`.

    With `A = L D Lᵀ`, `L` the `r` columns kept, `A⁺ = L (LᵀL)⁻¹ D⁻¹ (LᵀL)⁻¹ Lᵀ`: the
    Moore–Penrose inverse of `F Fᵀ` with `F = L D^½` of full column rank is `F (FᵀF)⁻² Fᵀ`.
    Array operations only (no LAPACK call, no sort), so it can sit in an ODE solve's loop
    that XLA:CPU compiles into one kernel. With [`pivoted_pseudo_factor`][] it stays loops
    under `vmap` too (not LAPACK's batched routines, as `looped_cholesky` and
    `looped_triangular_solve` become there where jaxlib's are safe): beside it the full-rank
    branch of `PositiveSemidefinitePseudoInverse` is a batched LAPACK call, and two such calls
    running at once on XLA:CPU's thread pool each wait for pool threads the other holds
    (`_jaxlib.lapack_batches_can_deadlock`): on 2 cores the vmapped diagnostics of Bricard's
    `PseudoInverse` solve (1,001 saved states, `experiments/examples/bricard.py`) would hang
    with both branches' factorizations in LAPACK.
    """
    vector = rhs.ndim == 1
    b = rhs[:, None] if vector else rhs
    kept = factor.pivots > 0
    inverse = jnp.where(kept, 1.0 / jnp.where(kept, factor.pivots, 1.0), 0.0)

    y = factor.gram_inverse @ (factor.low.T @ b)
    x = factor.low @ (factor.gram_inverse @ (inverse[:, None] * y))
    return x[:, 0] if vector else x


def lu_factor(matrix: Float[Array, "n n"]) -> tuple[Array, Array]:
    """The LU factorization with partial pivoting `matrix[perm] = L U` (`L` unit lower
    triangular, stored below the diagonal of `lu`, `U` on and above it), as
    `(lu, perm)`: `perm` is the row permutation (not LAPACK's pivot swaps), for
    [`lu_solve`][].

    Up to `LU_UNROLL_MAX` rows the elimination is unrolled over the columns, each column
    a handful of whole-matrix operations: the pivot is the largest entry on or below the
    diagonal (an `argmax`), the row swap two `where` selects, the elimination a rank-one
    update. XLA fuses them with the rest of a loop body, where LAPACK's `getrf` is a
    separate custom call (with two `trsm` per solve) at every use. Pivoting is kept: a
    Rosenbrock matrix `I − hγJ` is close to the identity for small steps, but for a
    mechanical system's Jacobian `[[0, I], [A, B]]` and a large `hγ` its leading
    entries are small next to the others, and elimination without row exchanges would
    grow the entries by `1/pivot`. Beyond `LU_UNROLL_MAX` rows: `jax.lax.linalg.lu`
    (LAPACK).

    A singular matrix gives a zero pivot, and the solves non-finite values (which make
    an ODE solver reject the step), not an error. Differentiable (the pivot choice is
    piecewise constant).
    """
    n = matrix.shape[0]
    if n > _thresholds.LU_UNROLL_MAX:
        lu, _, perm = jax.lax.linalg.lu(matrix)
        return lu, perm
    rows = jnp.arange(n)
    a, perm = matrix, rows
    for k in range(n - 1):
        column = jnp.where(rows >= k, jnp.abs(a[:, k]), -1.0)
        pivot = jnp.argmax(column)
        at_pivot, at_k = rows == pivot, rows == k
        pivot_row = jnp.sum(jnp.where(at_pivot[:, None], a, 0.0), axis=0)
        a = jnp.where(
            at_k[:, None], pivot_row[None, :], jnp.where(at_pivot[:, None], a[k][None, :], a)
        )
        pivot_index = jnp.sum(jnp.where(at_pivot, perm, 0))
        perm = jnp.where(at_k, pivot_index, jnp.where(at_pivot, perm[k], perm))
        below = rows > k
        factors = jnp.where(below, a[:, k] / a[k, k], 0.0)
        update = jnp.where(rows > k, a[k], 0.0)
        a = a - factors[:, None] * update[None, :]
        a = jnp.where(below[:, None] & at_k[None, :], factors[:, None], a)
    return a, perm


def lu_solve(factors: tuple[Array, Array], rhs: ArrayLike) -> Array:
    """Solves `matrix @ x = rhs` from `lu_factor(matrix)`, `rhs` of shape `(n,)` or
    `(n, k)`: forward and back substitution unrolled over the rows up to `LU_UNROLL_MAX`,
    `jax.scipy.linalg.solve_triangular` (LAPACK) beyond."""
    lu, perm = factors
    n = lu.shape[0]
    b = jnp.asarray(rhs)[perm]
    if n > _thresholds.LU_UNROLL_MAX:
        y = jax.scipy.linalg.solve_triangular(lu, b, lower=True, unit_diagonal=True)
        return jax.scipy.linalg.solve_triangular(lu, y, lower=False)
    rows = jnp.arange(n)
    shape = (n,) + (1,) * (rhs.ndim - 1)
    for k in range(n - 1):
        b = b - jnp.where(rows > k, lu[:, k], 0.0).reshape(shape) * b[k]
    for k in reversed(range(n)):
        x_k = b[k] / lu[k, k]
        b = jnp.where(
            (rows == k).reshape(shape),
            x_k,
            b - jnp.where(rows < k, lu[:, k], 0.0).reshape(shape) * x_k,
        )
    return b


def _looped_inverse(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    n = matrix.shape[0]
    rows = jnp.arange(n)

    def column(k, state):
        a, perm = state
        entries = jax.lax.dynamic_index_in_dim(a, k, 1, keepdims=False)
        pivot = jnp.argmax(jnp.where(rows >= k, jnp.abs(entries), -1.0))
        at_k, at_pivot = rows == k, rows == pivot
        row_k = jax.lax.dynamic_index_in_dim(a, k, 0, keepdims=False)
        row = jax.lax.dynamic_index_in_dim(a, pivot, 0, keepdims=False)
        perm = jnp.where(at_k, perm[pivot], jnp.where(at_pivot, perm[k], perm))
        # Rows `k` and `pivot` exchanged; column `k` is then overwritten by the column of
        # the inverse it becomes (`e_k` before the elimination).
        entries = jnp.where(at_k, 0.0, jnp.where(at_pivot, entries[k], entries))
        a = jnp.where(at_pivot[:, None], row_k[None, :], a)
        row = jnp.where(at_k, 1.0, row) / row[k]
        a = jnp.where(at_k[None, :], 0.0, a) - entries[:, None] * row[None, :]
        return jnp.where(at_k[:, None], row[None, :], a), perm

    inverse, perm = jax.lax.fori_loop(0, n, column, (matrix, rows))
    # `inverse` is that of `matrix[perm]`: its columns in the order of `perm` are those of
    # `matrix⁻¹`. The permutation as a product with a 0/1 matrix, not a scatter (which
    # would keep a surrounding loop from running as one kernel: `LOOPED_MAX`).
    return inverse @ (perm[:, None] == rows[None, :]).astype(matrix.dtype)


@jax.custom_jvp
def looped_inverse(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """`matrix⁻¹` by Gauss–Jordan elimination with partial pivoting, in place (Golub &
    Van Loan 2013, §3.2.12 and §3.4; Higham 2002, §14.4 on its stability, comparable to an
    inverse from the LU factors): a `lax.fori_loop` over the columns, each a pivot search
    and a rank-one update of the whole matrix. No LAPACK call, so that XLA fuses it into a
    surrounding loop (an ODE solve's steps) and that loop runs as one kernel
    (`LOOPED_INVERSE_MAX`); one loop of `n` iterations where an LU factorization and the
    solves with the identity would take three.

    A singular matrix gives a zero pivot and non-finite entries (which make an ODE solver
    reject the step), not an error. Differentiated by `d(A⁻¹) = −A⁻¹ dA A⁻¹`, not through
    the loop."""
    return _looped_inverse(matrix)


@looped_inverse.defjvp
def _looped_inverse_jvp(primals, tangents):
    (matrix,), (d_matrix,) = primals, tangents
    inverse = _looped_inverse(matrix)
    return inverse, -(inverse @ d_matrix @ inverse)


def _blocked_inverse(matrix: Float[Array, "n n"], block: int) -> Float[Array, "n n"]:
    n = matrix.shape[0]
    padded = -(-n // block) * block
    # An identity on the padded rows: their pivots are ones, and they couple to nothing.
    a = jnp.eye(padded, dtype=matrix.dtype).at[:n, :n].set(matrix)

    def step(j, a):
        start = j * block
        rows = jax.lax.dynamic_slice(a, (start, 0), (block, padded))
        pivot = inverse(jax.lax.dynamic_slice(rows, (0, start), (block, block)))
        column = jax.lax.dynamic_slice(a, (0, start), (padded, block))
        row = pivot @ rows  # the pivot rows, scaled
        a = a - column @ row
        a = jax.lax.dynamic_update_slice(a, -(column @ pivot), (0, start))
        a = jax.lax.dynamic_update_slice(a, row, (start, 0))
        return jax.lax.dynamic_update_slice(a, pivot, (start, start))

    return jax.lax.fori_loop(0, padded // block, step, a)[:n, :n]


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def blocked_inverse(matrix: Float[Array, "n n"], block: int) -> Float[Array, "n n"]:
    """`matrix⁻¹` by block Gauss–Jordan elimination in place (Golub & Van Loan 2013,
    §3.2.12 and §3.4 for Gauss–Jordan; §3.2.11 for its block form), a `lax.fori_loop` over
    blocks of `block` rows: each iteration inverts its diagonal pivot block ([`inverse`][],
    partial pivoting within the block) and updates the whole matrix by products of
    `n × block` and `block × n` matrices. A loop iteration per block, where
    [`looped_inverse`][] runs one per column (unrolling the blocks is no faster and
    compiles several times longer).

    There is no pivoting across blocks, so the pivot blocks must be nonsingular: the leading
    principal submatrices that end at a block boundary must be. That holds for a matrix
    `[[A, Bᵀ], [C, D]]` whose leading `A` has a positive definite symmetric part and whose
    trailing rows are constraints in the order of the unknowns (each pivot block is then a
    Schur complement of a nonsingular leading submatrix), such as the Newton matrix of
    [`jaxdae.GeneralizedAlpha`][], `[[M − c K, Gᵀ], [G, 0]]` with `M − c K` positive definite
    and `G` of full rank. Without pivoting across blocks the entries can grow by the ratio of
    the largest to the smallest pivot block, so the result is less accurate than a pivoted
    inverse (a relative 1e-8 rather than 1e-15 on the flyball governor's Newton matrix): for
    the matrix of an iteration that applies it to the true residual (an inaccurate inverse
    slows the contraction, it does not move the fixed point), not for a solve whose result
    is used as it is.

    A singular pivot block gives non-finite entries (which make an ODE solver reject the
    step), not an error. Differentiated by `d(A⁻¹) = −A⁻¹ dA A⁻¹`, not through the
    elimination."""
    return _blocked_inverse(matrix, block)


@blocked_inverse.defjvp
def _blocked_inverse_jvp(block, primals, tangents):
    (matrix,), (d_matrix,) = primals, tangents
    result = _blocked_inverse(matrix, block)
    return result, -(result @ d_matrix @ result)


def inverse_is_accurate(
    matrix: Float[Array, "n n"], result: Float[Array, "n n"]
) -> Bool[Array, ""]:
    """Whether `result` solves with `matrix` as accurately as a pivoted inverse would: for a
    fixed probe `p` (entries between 0.5 and 1.5), `x = result p` has a residual
    `‖matrix x − p‖∞ ≤ INVERSE_PROBE_TOLERANCE · n · eps · ‖matrix‖∞ ‖x‖∞`, a backward
    error of a few units of roundoff (Higham 2002, §14.1 on residuals of computed inverses;
    a pivoted inverse's stays below `n · eps`). False for non-finite entries."""
    n = matrix.shape[0]
    probe = 1.0 + 0.5 * jnp.sin(jnp.arange(n, dtype=matrix.dtype))
    x = result @ probe
    residual = jnp.max(jnp.abs(matrix @ x - probe))
    scale = jnp.max(jnp.sum(jnp.abs(matrix), axis=1)) * jnp.max(jnp.abs(x))
    bound = _thresholds.INVERSE_PROBE_TOLERANCE * n * jnp.finfo(matrix.dtype).eps * scale
    return jnp.all(jnp.isfinite(x)) & (residual <= bound)


@jax.custom_batching.custom_vmap
def checked_blocked_inverse(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """`matrix⁻¹` by [`blocked_inverse`][] (pivoting within blocks of
    `NEWTON_INVERSE_BLOCK` rows), kept where [`inverse_is_accurate`][] says it is as
    accurate as a pivoted inverse, and by [`looped_inverse`][] (partial pivoting across the
    whole matrix) otherwise: the speed of the block elimination's few matrix products per
    block, with the accuracy of partial pivoting. The check is two matrix–vector products,
    the choice a `lax.cond`; under `jax.vmap` one choice for the whole batch (the looped
    inverse for all where one matrix fails the check).

    A singular matrix gives non-finite entries (which make an ODE solver reject the step),
    not an error. Differentiated through the elimination; [`inverse`][], which takes it
    from 17 to `LOOPED_INVERSE_MAX` rows, is differentiated by `d(A⁻¹) = −A⁻¹ dA A⁻¹`
    instead."""
    fast = _blocked_inverse(matrix, _thresholds.NEWTON_INVERSE_BLOCK)
    return jax.lax.cond(
        inverse_is_accurate(matrix, fast), lambda: fast, lambda: _looped_inverse(matrix)
    )


@checked_blocked_inverse.def_vmap
def _(axis_size, in_batched, matrix):
    # One branch for the whole batch: a batched `cond` would compute both for every matrix.
    if not in_batched[0]:
        return checked_blocked_inverse(matrix), False
    fast = jax.vmap(lambda m: _blocked_inverse(m, _thresholds.NEWTON_INVERSE_BLOCK))(matrix)
    accurate = jnp.all(jax.vmap(inverse_is_accurate)(matrix, fast))
    return jax.lax.cond(accurate, lambda: fast, lambda: jax.vmap(_looped_inverse)(matrix)), True


@jax.custom_jvp
def inverse(matrix: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """`matrix⁻¹` for a square matrix that is solved with many times, as array operations
    that XLA fuses into a surrounding loop: from `lu_factor`'s unrolled factors up to
    `LU_UNROLL_MAX` rows, by [`checked_blocked_inverse`][] up to `LOOPED_INVERSE_MAX`, from
    LAPACK's factors beyond.

    Differentiated by `d(A⁻¹) = −A⁻¹ dA A⁻¹`, not through the elimination: reverse mode
    through the unrolled factorization is thousands of small operations (a
    [`jaxdae.Rodas5P`][] step's vector–Jacobian product, `jaxdae.ReplayAdjoint`)."""
    n = matrix.shape[0]
    if _thresholds.LU_UNROLL_MAX < n <= _thresholds.LOOPED_INVERSE_MAX:
        return checked_blocked_inverse(matrix)
    return lu_solve(lu_factor(matrix), jnp.eye(n, dtype=matrix.dtype))


@inverse.defjvp
def _inverse_jvp(primals, tangents):
    (matrix,), (d_matrix,) = primals, tangents
    result = inverse(matrix)
    return result, -(result @ d_matrix @ result)


def factor_for_solves(matrix: Float[Array, "n n"], tangents: int | None = None):
    """What [`solve_factored`][] needs to solve with `matrix` many times: its [`inverse`][]
    (so that each solve is one matrix–vector product, fused with its neighbours) up to
    `INVERSE_MAX` rows, and up to `LOOPED_INVERSE_MAX` rows where `matrix` is a Jacobian
    computed from at most `TANGENT_LOOP_MAX` tangents (`tangents`); the LU factors beyond
    (LAPACK's beyond `LU_UNROLL_MAX`).

    Array operations let XLA run a solve's whole loop as one kernel, which compiles longer
    the more the loop body holds: with few tangents (a banded or block-sparse Jacobian) the
    step stays small, while a structurally dense Jacobian of many states repeats the
    right-hand side once per state and its one-kernel loop compiles for minutes
    (docs/design_measurements.md#checked-blocked-inverse)."""
    n = matrix.shape[0]
    few_tangents = tangents is not None and tangents <= _thresholds.TANGENT_LOOP_MAX
    if n <= _thresholds.INVERSE_MAX or (few_tangents and n <= _thresholds.LOOPED_INVERSE_MAX):
        return inverse(matrix)
    return lu_factor(matrix)


def solve_factored(factored, rhs: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
    """`matrix⁻¹ rhs` from `factor_for_solves(matrix)`."""
    if isinstance(factored, tuple):
        return lu_solve(factored, rhs)
    return jnp.sum(factored * rhs[None, :], axis=1)
