"""Small linear complementarity problems, solved exactly and differentiably.

The impacts and contacts of one-sided constraints ask for `x` with

    x ≥ 0,   w = A x + b ≥ 0,   xᵀ w = 0,

`A` symmetric positive (semi)definite of the size of the number of contacts (a handful):
Newton's impact law for simultaneous impacts (the impulses `x`, the post-impact gap rates
`w`) and the contact forces of contacts at rest. For positive definite `A` the solution
is unique, and it minimizes `½ xᵀA x + bᵀx` over `x ≥ 0`.

[`solve_lcp`][] finds the set of positive `x` by Murty's least-index principal pivoting
(Murty (1988), §4.2; docs/methods.md#one-sided-constraints), which
ends in finitely many pivots for positive definite `A`, and then solves once more for
that set: the solution is exact to rounding, and its derivative is that of the linear
solve for the final set (the set itself is piecewise constant).
"""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, Bool, Float


class LCPSolution(eqx.Module):
    """The solution of [`solve_lcp`][]: `x`, `w = A x + b`, and whether the pivoting ended
    on a solution within its pivot budget (`solved`)."""

    x: Float[Array, " u"]
    w: Float[Array, " u"]
    solved: Bool[Array, ""]


def masked_solve(matrix: Float[Array, "u u"], rhs: Float[Array, " u"],
                 rows: Bool[Array, " u"]) -> Float[Array, " u"]:
    """`x` with `A[rows, rows] x[rows] = rhs[rows]` and `x = 0` off `rows`, at a static
    shape: the other rows and columns are replaced by those of the identity."""
    both = rows[:, None] & rows[None, :]
    eye = jnp.eye(matrix.shape[0], dtype=matrix.dtype)
    reduced = jnp.where(both, matrix, eye)
    return jnp.where(rows, jnp.linalg.solve(reduced, jnp.where(rows, rhs, 0.0)), 0.0)


def solve_lcp(matrix: Float[Array, "u u"], vector: Float[Array, " u"],
              candidates: Bool[Array, " u"] | None = None,
              max_pivots: int | None = None) -> LCPSolution:
    """The solution of the LCP `x ≥ 0, w = A x + b ≥ 0, xᵀw = 0` restricted to `candidates`
    (elsewhere `x = 0` and `w = b` unconstrained), for symmetric positive definite `A`
    (semidefinite: the pivoting uses `A + ε I`, `ε` a few ulps of its diagonal).

    `max_pivots` bounds the pivots (default `4 u + 8`); `solved` is False where they ran
    out or the matrix is not positive definite on the candidates.
    """
    size = vector.shape[0]
    if candidates is None:
        candidates = jnp.ones((size,), bool)
    if max_pivots is None:
        max_pivots = 4 * size + 8
    dtype = vector.dtype
    eps = jnp.finfo(dtype).eps
    scale = jnp.max(jnp.abs(jnp.diagonal(matrix)), initial=0.0)
    matrix = matrix + (16 * eps * scale + jnp.finfo(dtype).tiny) * jnp.eye(size, dtype=dtype)
    tolerance = 64 * eps * (jnp.max(jnp.abs(vector), initial=0.0) + scale)

    def infeasible(basis, a, b):
        x = masked_solve(a, -b, basis)
        w = a @ x + b
        return candidates & ((basis & (x < -tolerance)) | (~basis & (w < -tolerance)))

    # The set is found on detached values: the pivoting is piecewise constant.
    a, b = jax.lax.stop_gradient((matrix, vector))

    def step(carry):
        pivots, basis, _ = carry
        bad = infeasible(basis, a, b)
        first = jnp.argmax(bad)
        flipped = basis.at[first].set(~basis[first])
        return pivots + 1, jnp.where(bad.any(), flipped, basis), ~bad.any()

    def keep_going(carry):
        pivots, _, done = carry
        return (pivots < max_pivots) & ~done

    start = candidates & (b < 0)
    _, basis, done = jax.lax.while_loop(keep_going, step, (0, start, jnp.asarray(False)))
    solved = done | ~infeasible(basis, a, b).any()
    x = masked_solve(matrix, -vector, basis)
    return LCPSolution(x, matrix @ x + vector, solved & jnp.all(jnp.isfinite(x)))
