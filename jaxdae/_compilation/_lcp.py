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
from ._linalg import inverse, pivoted_pseudo_factor, pivoted_pseudo_solve


class LCPSolution(eqx.Module):
    """The solution of [`solve_lcp`][]: `x`, `w = A x + b`, and whether the pivoting ended
    on a solution within its pivot budget (`solved`)."""

    x: Float[Array, " u"]
    w: Float[Array, " u"]
    solved: Bool[Array, ""]


def masked_solve(
    matrix: Float[Array, "u u"], rhs: Float[Array, " u"], rows: Bool[Array, " u"]
) -> Float[Array, " u"]:
    """`x` with `A[rows, rows] x[rows] = rhs[rows]` and `x = 0` off `rows`, at a static
    shape: the other rows and columns are replaced by those of the identity. By array
    operations (no LAPACK call), so that a solve's step loop that computes contact forces
    stays one kernel on the CPU."""
    both = rows[:, None] & rows[None, :]
    eye = jnp.eye(matrix.shape[0], dtype=matrix.dtype)
    reduced = jnp.where(both, matrix, eye)
    return jnp.where(rows, inverse(reduced) @ jnp.where(rows, rhs, 0.0), 0.0)


def solve_lcp(
    matrix: Float[Array, "u u"],
    vector: Float[Array, " u"],
    candidates: Bool[Array, " u"] | None = None,
    max_pivots: int | None = None,
) -> LCPSolution:
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


class ContactModes(eqx.Module):
    """The state of each contact: `active`, a resting contact that carries a normal force
    (in [`solve_frictional_lcp`][], one whose normal force is free to be positive);
    `stick`, an active contact with friction that sticks; `sign`, the direction `±1` in
    which it slips where it does not stick."""

    active: Bool[Array, " u"]
    stick: Bool[Array, " u"]
    sign: Float[Array, " u"]


class FrictionalLCPSolution(eqx.Module):
    """The solution of [`solve_frictional_lcp`][]: `x` (the normal then the tangential
    forces or impulses), `w = A x + b`, the contact `modes` it ended on and whether the
    pivoting ended on a solution (`solved`)."""

    x: Float[Array, " 2u"]
    w: Float[Array, " 2u"]
    modes: ContactModes
    solved: Bool[Array, ""]


def frictional_solve(
    matrix: Float[Array, "2u 2u"],
    vector: Float[Array, " 2u"],
    friction: Float[Array, " u"],
    modes: ContactModes,
) -> Float[Array, " 2u"]:
    """`x` of the contact `modes`: an `active` contact's normal row of `A x + b` vanishes,
    the others' normal `x` does; a sticking active contact with friction holds its
    tangential row at zero, a slipping one has `x_T = −μ s x_N`; the rest `x_T = 0`.

    Solved in the least-squares sense (the least `x` where the rows are dependent: a body
    stuck at more contacts than it has freedoms, whose forces are indeterminate), as
    `x = Rᵀ (R Rᵀ)⁺ rhs` for the rows `R`, by a pivoted Cholesky factorization of `R Rᵀ`
    ([`pivoted_pseudo_solve`][]): array operations, no LAPACK call, so that a solve's step
    loop that computes contact forces stays one kernel on the CPU."""
    active, stick, sign = modes.active, modes.stick, modes.sign
    size = active.shape[0]
    dtype = vector.dtype
    scale = jnp.max(jnp.abs(jnp.diagonal(matrix)), initial=0.0) + jnp.finfo(dtype).tiny
    eye = scale * jnp.eye(2 * size, dtype=dtype)
    rubbing = active & (friction > 0)
    holding = rubbing & stick
    slip_rows = eye[size:] + (friction * sign)[:, None] * eye[:size]
    rows = jnp.concatenate(
        [
            jnp.where(active[:, None], matrix[:size], eye[:size]),
            jnp.where(
                holding[:, None], matrix[size:], jnp.where(rubbing[:, None], slip_rows, eye[size:])
            ),
        ]
    )
    rhs = jnp.concatenate(
        [jnp.where(active, -vector[:size], 0.0), jnp.where(holding, -vector[size:], 0.0)]
    )
    factor = pivoted_pseudo_factor(rows @ rows.T, float(1e3 * jnp.finfo(dtype).eps))
    return rows.T @ pivoted_pseudo_solve(factor, rhs)


def solve_frictional_lcp(
    matrix: Float[Array, "2u 2u"],
    vector: Float[Array, " 2u"],
    friction: Float[Array, " u"],
    candidates: Bool[Array, " u"],
    free: Bool[Array, " u"],
    sign: Float[Array, " u"],
    max_pivots: int | None = None,
) -> FrictionalLCPSolution:
    """Contacts with Coulomb friction in the plane: for each of `u` contacts a normal
    `x_N` and a tangential `x_T` (force or impulse), with `w = A x + b` their normal and
    tangential rates (accelerations or velocities after an impact), such that

    - `x_N ≥ 0, w_N ≥ 0, x_N w_N = 0` (`x_N = 0` off `candidates`);
    - stick: `w_T = 0` and `|x_T| ≤ μ x_N`; or slip in the direction `s = ±1`: `s w_T ≥ 0`
        and `x_T = −μ s x_N` (Pfeiffer and Glocker (1996), ch. 7, in the plane).

    Contacts not `free` slide in their given direction `sign` (a contact already sliding).
    The modes are found by least-index pivoting as [`solve_lcp`][]'s (a normal that pulls
    or a closed gap that penetrates flips its normal mode; a stick that needs more than
    `μ x_N` slips against its force; a slip that would reverse sticks); then solved once
    more for them, so that the derivative is that of the linear solve for the final modes.
    Friction makes the problem non-symmetric, and pivoting need not end on every one: `solved`
    is False where it ran out of its `max_pivots` (default `8 u + 8`).
    """
    size = candidates.shape[0]
    if max_pivots is None:
        max_pivots = 8 * size + 8
    dtype = vector.dtype
    eps = jnp.finfo(dtype).eps
    scale = jnp.max(jnp.abs(jnp.diagonal(matrix)), initial=0.0)
    tolerance = 64 * eps * (jnp.max(jnp.abs(vector), initial=0.0) + scale)
    a, b = jax.lax.stop_gradient((matrix, vector))
    friction_ = jax.lax.stop_gradient(friction)
    rubbing_free = free & (friction_ > 0)

    def violations(active, stick, sign_):
        x = frictional_solve(a, b, friction_, ContactModes(active, stick, sign_))
        w = a @ x + b
        normal = candidates & (
            (active & (x[:size] < -tolerance)) | (~active & (w[:size] < -tolerance))
        )
        rubbing = active & rubbing_free
        slips = rubbing & stick & (jnp.abs(x[size:]) > friction_ * x[:size] + tolerance)
        sticks = rubbing & ~stick & (sign_ * w[size:] < -tolerance)
        return normal, slips | sticks, x

    def step(carry):
        pivots, active, stick, sign_, _ = carry
        normal, tangent, x = violations(active, stick, sign_)
        # Least index first, a contact's normal before its tangent.
        flags = jnp.stack([normal, tangent], axis=1).reshape(-1)
        first = jnp.argmax(flags)
        contact, is_tangent = first // 2, first % 2 == 1
        any_ = flags.any()
        flip_normal = any_ & ~is_tangent
        flip_tangent = any_ & is_tangent
        active = active.at[contact].set(jnp.where(flip_normal, ~active[contact], active[contact]))
        new_sign = jnp.where(x[size + contact] > 0, -1.0, 1.0).astype(dtype)
        sign_ = sign_.at[contact].set(
            jnp.where(flip_tangent & stick[contact], new_sign, sign_[contact])
        )
        stick = stick.at[contact].set(jnp.where(flip_tangent, ~stick[contact], stick[contact]))
        return pivots + 1, active, stick, sign_, ~any_

    def keep_going(carry):
        pivots, *_, done = carry
        return (pivots < max_pivots) & ~done

    # Start: the closed gaps that approach; sticking where the tangential rate is nil,
    # else slipping its way.
    tangential = b[size:]
    start_active = candidates & (b[:size] < 0)
    start_stick = free & (jnp.abs(tangential) <= tolerance)
    start_sign = jnp.where(free, jnp.where(tangential < 0, -1.0, 1.0).astype(dtype), sign)
    _, active, stick, sign_, done = jax.lax.while_loop(
        keep_going, step, (0, start_active, start_stick, start_sign, jnp.asarray(False))
    )
    normal, tangent, _ = violations(active, stick, sign_)
    solved = done | ~(normal | tangent).any()
    modes = ContactModes(active, stick, sign_)
    x = frictional_solve(matrix, vector, friction, modes)
    return FrictionalLCPSolution(x, matrix @ x + vector, modes, solved & jnp.all(jnp.isfinite(x)))
