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
import numpy as np

from .._custom_types import Array, Bool, Float
from ._linalg import looped_inverse, pivoted_pseudo_factor, pivoted_pseudo_solve


class LCPSolution(eqx.Module):
    """The solution of [`solve_lcp`][]: `x`, `w = A x + b`, and whether the pivoting ended
    on a solution within its pivot budget (`solved`)."""

    x: Float[Array, " u"]
    w: Float[Array, " u"]
    solved: Bool[Array, ""]


# Jitted: a solve calls it at many places (the contact forces, the pivots of both
# complementarity problems at an event), and JAX traces a jitted function once per
# signature, then reuses its program (compile time). So is `frictional_solve`.
@jax.jit
def masked_solve(
    matrix: Float[Array, "u u"], rhs: Float[Array, " u"], rows: Bool[Array, " u"]
) -> Float[Array, " u"]:
    """`x` with `A[rows, rows] x[rows] = rhs[rows]` and `x = 0` off `rows`, at a static
    shape: the other rows and columns are replaced by those of the identity. By Gauss–Jordan
    elimination in a loop over the columns ([`looped_inverse`][]): no LAPACK call, so that a
    solve's step loop that computes contact forces stays one kernel on the CPU, and a
    program whose size does not grow with the number of contacts (an unrolled elimination
    is a few dozen operations per column, at every use: each pivot test of [`solve_lcp`][],
    an impact, the contact forces in a right-hand side)."""
    both = rows[:, None] & rows[None, :]
    eye = jnp.eye(matrix.shape[0], dtype=matrix.dtype)
    reduced = jnp.where(both, matrix, eye)
    return jnp.where(rows, looped_inverse(reduced) @ jnp.where(rows, rhs, 0.0), 0.0)


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

    # The set is found on detached values: the pivoting is piecewise constant.
    a, b = jax.lax.stop_gradient((matrix, vector))

    def infeasible_at(basis, x):
        """The violated conditions of the set `basis` at its solution `x`."""
        x = jax.lax.stop_gradient(x)
        w = a @ x + b
        return candidates & ((basis & (x < -tolerance)) | (~basis & (w < -tolerance)))

    def step(carry):
        pivots, basis, _ = carry
        bad = infeasible_at(basis, masked_solve(a, -b, basis))
        first = jnp.argmax(bad)
        flipped = basis.at[first].set(~basis[first])
        return pivots + 1, jnp.where(bad.any(), flipped, basis), ~bad.any()

    def keep_going(carry):
        pivots, _, done = carry
        return (pivots < max_pivots) & ~done

    start = candidates & (b < 0)
    _, basis, done = jax.lax.while_loop(keep_going, step, (0, start, jnp.asarray(False)))
    # (The final set's conditions read from the solution returned: one solve, not two.)
    x = masked_solve(matrix, -vector, basis)
    solved = done | ~infeasible_at(basis, x).any()
    return LCPSolution(x, matrix @ x + vector, solved & jnp.all(jnp.isfinite(x)))


class ContactModes(eqx.Module):
    """The state of each contact: `active`, a resting contact that carries a normal force
    (in [`solve_frictional_lcp`][], one whose normal force is free to be positive);
    `stick`, an active contact with friction that sticks; `sign`, the direction `d` in
    which it slips where it does not stick: `±1` per contact in the plane, shape `(u,)`, a
    unit 2-vector in its tangent plane in space, shape `(u, 2)`."""

    active: Bool[Array, " u"]
    stick: Bool[Array, " u"]
    sign: Float[Array, " u"] | Float[Array, "u k"]


def tangent_count(sign: Float[Array, " u"] | Float[Array, "u k"]) -> int:
    """The slip velocities per contact that a direction array `sign` stands for: 1 for
    `(u,)` (the plane), `k` for `(u, k)`."""
    return 1 if sign.ndim == 1 else sign.shape[1]


def magnitudes(x: Float[Array, "u k"]) -> Float[Array, " u"]:
    """`|x_i|` of each row, with a zero derivative at zero (where a plain norm's is NaN):
    the tangential forces of a contact at rest are often exactly zero."""
    if x.shape[1] == 1:
        return jnp.abs(x[:, 0])
    squared = jnp.sum(x * x, axis=1)
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def units(x: Float[Array, "u k"], fallback: Float[Array, "u k"]) -> Float[Array, "u k"]:
    """`x_i / |x_i|` of each row, `fallback_i` where `x_i` is zero."""
    size = magnitudes(x)[:, None]
    return jnp.where(size > 0, x / jnp.where(size > 0, size, 1.0), fallback)


def along(
    sign: Float[Array, " u"] | Float[Array, "u k"], x: Float[Array, "u k"]
) -> Float[Array, " u"]:
    """`d_i · x_i` of each contact's direction `d_i` (`sign`) and tangential vector `x_i`."""
    if sign.ndim == 1:
        return sign * x[:, 0]
    return jnp.sum(sign * x, axis=1)


# Substitutions `d ← w_T(d)/|w_T(d)|` of a free contact's slip direction in space
# ([`solve_frictional_lcp`][]).
DIRECTION_SUBSTITUTIONS = 16


# `u_plus_ku`: the size `u + k u` of the normal then the tangential components, a name of its
# own, since a plane's directions (shape `(u,)`) bind no `k` for jaxtyping to add.
class FrictionalLCPSolution(eqx.Module):
    """The solution of [`solve_frictional_lcp`][]: `x` (the normal then the tangential
    forces or impulses), `w = A x + b`, the contact `modes` it ended on and whether the
    pivoting ended on a solution (`solved`)."""

    x: Float[Array, " u_plus_ku"]
    w: Float[Array, " u_plus_ku"]
    modes: ContactModes
    solved: Bool[Array, ""]


# Jitted for the reason `masked_solve` is.
@jax.jit
def frictional_solve(
    matrix: Float[Array, "u_plus_ku u_plus_ku"],
    vector: Float[Array, " u_plus_ku"],
    friction: Float[Array, " u"],
    modes: ContactModes,
) -> Float[Array, " u_plus_ku"]:
    """`x` of the contact `modes` (`k` tangential components per contact, contact `i`'s at
    `u + k i + j`): an `active` contact's normal row of `A x + b` vanishes, the others'
    normal `x` does; a sticking active contact with friction holds its tangential rows at
    zero, a slipping one has `x_T = −μ x_N d` (its direction `d`, `modes.sign`); the rest
    `x_T = 0`.

    Solved in the least-squares sense (the least `x` where the rows are dependent: a body
    stuck at more contacts than it has freedoms, whose forces are indeterminate), as
    `x = Rᵀ (R Rᵀ)⁺ rhs` for the rows `R`, by a pivoted Cholesky factorization of `R Rᵀ`
    ([`pivoted_pseudo_solve`][]): array operations, no LAPACK call, so that a solve's step
    loop that computes contact forces stays one kernel on the CPU.

    A slipping contact's force is one unknown along its unit direction
    `(1, −μ d)/√(1 + μ²|d|²)` (`x = B z`), so that its normal row keeps its scale for any
    `μ`: the rows `x_T + μ d x_N = 0` beside it would make the normal row nearly dependent
    on them for large `μ` (its pivot in `R Rᵀ` of order `μ⁻⁴`), and the factorization drop
    it. The least `z` is the least `x` (`B`'s columns are unit vectors)."""
    active, stick, sign = modes.active, modes.stick, modes.sign
    size = active.shape[0]
    tangents = tangent_count(sign)
    dtype = vector.dtype
    scale = jnp.max(jnp.abs(jnp.diagonal(matrix)), initial=0.0) + jnp.finfo(dtype).tiny
    eye = scale * jnp.eye((1 + tangents) * size, dtype=dtype)
    rubbing = active & (friction > 0)
    holding = rubbing & stick
    slipping = rubbing & ~stick
    # Each tangential row's contact (static).
    owner = np.repeat(np.arange(size), tangents)
    # `B`: a slipping contact's normal column `(e_N − μ d e_T)/n`, `n` its length.
    rub = jnp.where(slipping[owner], -friction[owner] * sign.reshape(-1), 0.0)
    # (Summed per contact by a reshape: a scatter would make the step loop around a
    # solve run kernel by kernel on the CPU.)
    length = jnp.sqrt(1.0 + jnp.sum((rub**2).reshape(size, tangents), axis=1))
    unit = jnp.eye(size, dtype=dtype)
    basis = jnp.concatenate(
        [
            jnp.concatenate([unit / length, jnp.zeros((size, tangents * size), dtype)], 1),
            jnp.concatenate(
                [rub[:, None] * unit[owner] / length, jnp.eye(tangents * size, dtype=dtype)], 1
            ),
        ]
    )
    reduced = matrix @ basis
    # (A slipping contact's tangential rows hold `z_T = 0`; its normal row is scaled back
    # by `n`, its equation unchanged.)
    rows = jnp.concatenate(
        [
            jnp.where(active[:, None], length[:, None] * reduced[:size], eye[:size]),
            jnp.where(holding[owner][:, None], reduced[size:], eye[size:]),
        ]
    )
    rhs = jnp.concatenate(
        [
            jnp.where(active, -length * vector[:size], 0.0),
            jnp.where(holding[owner], -vector[size:], 0.0),
        ]
    )
    factor = pivoted_pseudo_factor(rows @ rows.T, float(1e3 * jnp.finfo(dtype).eps))
    return basis @ (rows.T @ pivoted_pseudo_solve(factor, rhs))


def solve_frictional_lcp(
    matrix: Float[Array, "u_plus_ku u_plus_ku"],
    vector: Float[Array, " u_plus_ku"],
    friction: Float[Array, " u"],
    candidates: Bool[Array, " u"],
    free: Bool[Array, " u"],
    sign: Float[Array, " u"] | Float[Array, "u k"],
    max_pivots: int | None = None,
    turning: Bool[Array, " u"] | None = None,
) -> FrictionalLCPSolution:
    """Contacts with Coulomb friction: for each of `u` contacts a normal `x_N` and a
    tangential `x_T` (force or impulse) with `k` components (`k = 1` in the plane, `sign` of
    shape `(u,)`; `k = 2` in space, `sign` of shape `(u, 2)`), with `w = A x + b` their
    normal and tangential rates (accelerations or velocities after an impact), such that

    - `x_N ≥ 0, w_N ≥ 0, x_N w_N = 0` (`x_N = 0` off `candidates`);
    - stick: `w_T = 0` and `|x_T| ≤ μ x_N`; or slip in the direction `d` (`±1` in the
        plane, a unit vector in space): `d·w_T ≥ 0` and `x_T = −μ x_N d` (Pfeiffer and
        Glocker (1996), ch. 7; Glocker (2001) for the spatial cone).

    Contacts not `free` slide in their given direction `sign` (a contact already sliding).
    The modes are found by least-index pivoting as [`solve_lcp`][]'s (a normal that pulls
    or a closed gap that penetrates flips its normal mode; a stick that needs more than
    `μ x_N` slips against its force, `d = −x_T/|x_T|`; a slip that would reverse sticks);
    then solved once more for them, so that the derivative is that of the linear solve for
    the final modes. A free contact starts slipping along `b_T` (its tangential rate
    without forces; at an impact the slip velocity before it). In space a free contact
    that slips then takes the direction of its slip rate, `d = w_T/|w_T|` (Coulomb's law
    on the rates: at an impact the impulse opposes the slip after it), by
    `DIRECTION_SUBSTITUTIONS` damped substitutions, as do the `turning` contacts (default
    the free ones; also a contact whose stick just failed, which slides from rest in a
    given direction): exact at once where the contact's tangential block of `A` is
    isotropic and uncoupled from its normal (a sphere or a point mass on a plane), close
    elsewhere, the remainder taken up by the events of a solve as the motion goes on.
    Friction makes the problem non-symmetric, and pivoting need not end on every one:
    `solved` is False where it ran out of its `max_pivots` (default `8 u + 8`).
    """
    size = candidates.shape[0]
    tangents = tangent_count(sign)
    if max_pivots is None:
        max_pivots = 8 * size + 8
    dtype = vector.dtype
    eps = jnp.finfo(dtype).eps
    scale = jnp.max(jnp.abs(jnp.diagonal(matrix)), initial=0.0)
    tolerance = 64 * eps * (jnp.max(jnp.abs(vector), initial=0.0) + scale)
    a, b = jax.lax.stop_gradient((matrix, vector))
    friction_ = jax.lax.stop_gradient(friction)
    given = jax.lax.stop_gradient(sign)
    rubbing_free = free & (friction_ > 0)
    if turning is None:
        turning = free

    def violations_of(x, active, stick, sign_):
        """The modes' violated conditions at their solution `x`."""
        x = jax.lax.stop_gradient(x)
        w = a @ x + b
        normal = candidates & (
            (active & (x[:size] < -tolerance)) | (~active & (w[:size] < -tolerance))
        )
        rubbing = active & rubbing_free
        tangential = x[size:].reshape(size, tangents)
        slips = rubbing & stick & (magnitudes(tangential) > friction_ * x[:size] + tolerance)
        sticks = rubbing & ~stick & (along(sign_, w[size:].reshape(size, tangents)) < -tolerance)
        return normal, slips | sticks

    def violations(active, stick, sign_):
        x = frictional_solve(a, b, friction_, ContactModes(active, stick, sign_))
        return *violations_of(x, active, stick, sign_), x

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
        force = x[size:].reshape(size, tangents)[contact]
        if tangents == 1:
            new_sign = jnp.where(force[0] > 0, -1.0, 1.0).astype(dtype)
        else:
            new_sign = -units(force[None], -sign_[contact][None])[0]
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
    tangential = b[size:].reshape(size, tangents)
    start_active = candidates & (b[:size] < 0)
    start_stick = free & (magnitudes(tangential) <= tolerance)
    if tangents == 1:
        start_sign = jnp.where(
            free, jnp.where(tangential[:, 0] < 0, -1.0, 1.0).astype(dtype), given
        )
    else:
        start_sign = jnp.where(free[:, None], units(tangential, given), given)
    _, active, stick, sign_, done = jax.lax.while_loop(
        keep_going, step, (0, start_active, start_stick, start_sign, jnp.asarray(False))
    )
    if tangents > 1:
        # A free contact that slips slides against its slip rate `w_T` (after an impact
        # its slip velocity): the direction is the fixed point `d = w_T(d)/|w_T(d)|`,
        # approached by damped substitutions `d ← (1 − s) d + s w_T/|w_T|` from the
        # pivoting's (reached at once where the contact's tangential response is
        # isotropic and uncoupled from its normal), each kept only where it aligns `d`
        # better and meets every other condition.
        sliding = active & turning & (friction_ > 0) & ~stick

        def misalignment(sign_):
            normal, tangent, x = violations(active, stick, sign_)
            rate = (a @ x + b)[size:].reshape(size, tangents)
            target = jnp.where(sliding[:, None], units(rate, sign_), sign_)
            off = jnp.sum(jnp.where(sliding, 1.0 - along(sign_, target), 0.0))
            return jnp.where((normal | tangent).any(), jnp.inf, off), target

        def substitute(_, carry):
            sign_, off, target, step = carry
            trial = units((1 - step) * sign_ + step * target, sign_)
            trial_off, trial_target = misalignment(trial)
            better = trial_off < off
            keep = lambda new, old: jnp.where(better, new, old)  # noqa: E731
            # Longer steps while they align it better, shorter where one overshoots; the
            # first, of length zero, measures the pivoting's direction (one trace of the
            # solve, not two: compile time).
            step = jnp.where(
                better, jnp.where(step == 0, 0.5, jnp.minimum(2 * step, 1.0)), 0.5 * step
            )
            return keep(trial, sign_), keep(trial_off, off), keep(trial_target, target), step

        sign_, *_ = jax.lax.fori_loop(
            0,
            DIRECTION_SUBSTITUTIONS + 1,
            substitute,
            (sign_, jnp.asarray(jnp.inf, dtype), sign_, jnp.asarray(0.0, dtype)),
        )
    # The final solve's conditions, read from the solution returned (its value is that of
    # the detached problem's: one solve in the program, not two).
    checked_sign = sign_
    if tangents > 1:
        # The directions as functions of the inputs, for the derivatives: a contact not free
        # takes the given one's; a free one that slides that of `b_T/|b_T|`, its direction
        # where the tangential response is isotropic and uncoupled.
        moving = units(vector[size:].reshape(size, tangents), given)
        sign_ = jnp.where(
            free[:, None],
            jnp.where(
                (free & ~stick)[:, None], sign_ + moving - jax.lax.stop_gradient(moving), sign_
            ),
            sign_ + sign - given,
        )
    modes = ContactModes(active, stick, sign_)
    x = frictional_solve(matrix, vector, friction, modes)
    normal, tangent = violations_of(x, active, stick, checked_sign)
    solved = done | ~(normal | tangent).any()
    return FrictionalLCPSolution(x, matrix @ x + vector, modes, solved & jnp.all(jnp.isfinite(x)))
