"""Small linear complementarity problems, solved exactly and differentiably.

The impacts and contacts of one-sided constraints ask for `x` with

    x ≥ 0,   w = A x + b ≥ 0,   xᵀ w = 0,

`A` symmetric positive (semi)definite of the size of the number of contacts (a handful):
Newton's impact law for simultaneous impacts (the impulses `x`, the post-impact gap rates
`w`) and the contact forces of contacts at rest. For positive definite `A` the solution
is unique, and it minimizes `½ xᵀA x + bᵀx` over `x ≥ 0`.

[`solve_lcp`][] finds the set of positive `x` by Murty's least-index principal pivoting
(Murty (1988), §4.2; docs/methods.md#one-sided-constraints), which
ends in finitely many pivots for positive definite `A`. The solution is the last pivot's
solve, for the final set, exact to rounding; its derivative is that of the linear solve
for that set (the set itself is piecewise constant), by a custom JVP, so that a program
that does not differentiate holds the pivoting's solve only
(docs/design_measurements.md#lcp-last-solve).
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

    x, solved = _positive_set(matrix, vector, candidates, tolerance, max_pivots=max_pivots)
    return LCPSolution(x, matrix @ x + vector, solved & jnp.all(jnp.isfinite(x)))


def _materialized(inputs: tuple, tangents: tuple) -> tuple:
    """The tangents of `inputs` (the first of `tangents`) for `jax.jvp`: zeros where
    `eqx.filter_custom_jvp` passes `None` (a symbolic zero)."""
    return tuple(
        jnp.zeros_like(x) if t is None else t
        for x, t in zip(inputs, tangents[: len(inputs)], strict=True)
    )


# The set is found by pivoting on detached values (it is piecewise constant), each pivot
# one `masked_solve` for the set it tries; the solution is the last one. Its derivative is
# that of the linear solve for the final set: a custom JVP, so that a program that does not
# differentiate holds one solve (the loop's), not a second one on the differentiable inputs
# (compile time).
@eqx.filter_custom_jvp
def _positive_set(matrix, vector, candidates, tolerance, *, max_pivots):
    """`(x, solved)` of [`solve_lcp`][] for its regularized `matrix`."""
    return _pivoted_set(matrix, vector, candidates, tolerance, max_pivots)[:2]


def _pivoted_set(matrix, vector, candidates, tolerance, max_pivots):
    a, b = jax.lax.stop_gradient((matrix, vector))

    def iteration(state):
        pivots, basis, _, _, _ = state
        x = masked_solve(a, -b, basis)
        w = a @ x + b
        bad = candidates & ((basis & (x < -tolerance)) | (~basis & (w < -tolerance)))
        # Least index first; the set of the last solve is kept where the pivots ran out.
        flip = bad.any() & (pivots < max_pivots)
        first = jnp.argmax(bad)
        flipped = basis.at[first].set(jnp.where(flip, ~basis[first], basis[first]))
        return pivots + flip, flipped, x, ~bad.any(), ~flip

    start = candidates & (b < 0)
    init = (jnp.asarray(0), start, jnp.zeros_like(b), jnp.asarray(False), jnp.asarray(False))
    _, basis, x, solved, _ = jax.lax.while_loop(lambda state: ~state[4], iteration, init)
    return x, solved, basis


@_positive_set.def_jvp
def _positive_set_jvp(primals, tangents, *, max_pivots):
    matrix, vector, candidates, tolerance = primals
    _, solved, basis = _pivoted_set(matrix, vector, candidates, tolerance, max_pivots)
    inputs = (matrix, vector)
    x, x_dot = jax.jvp(
        lambda m, v: masked_solve(m, -v, basis), inputs, _materialized(inputs, tangents)
    )
    return (x, solved), (x_dot, None)


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
    if max_pivots is None:
        max_pivots = 8 * candidates.shape[0] + 8
    if turning is None:
        turning = free
    x, active, stick, sign_, solved = _frictional_modes(
        matrix, vector, friction, sign, candidates, free, turning, max_pivots=max_pivots
    )
    modes = ContactModes(active, stick, sign_)
    return FrictionalLCPSolution(x, matrix @ x + vector, modes, solved & jnp.all(jnp.isfinite(x)))


class _PivotingState(eqx.Module):
    """The state of [`solve_frictional_lcp`][]'s iterations."""

    pivots: Array  # pivots made
    substitutions: Array  # substitutions tried
    pivoting: Array  # still finding the modes (else: turning the directions)
    finished: Array
    active: Array
    stick: Array
    sign: Array  # the directions of the modes found (kept by the substitutions)
    x: Array  # their solution
    clean: Array  # they violate no condition
    off: Array  # the substitutions' misalignment at `sign`
    target: Array  # the slip rates' directions there
    step: Array  # the next substitution's step


# The modes are found by pivoting and substitution on detached values, each iteration one
# `frictional_solve` at the modes it tries, and the solution of the modes found is the last
# one kept. Its derivative is that of the linear solve for those modes: a custom JVP, so
# that a program that does not differentiate holds one solve (the loop's), not a second one
# on the differentiable inputs (compile time).
@eqx.filter_custom_jvp
def _frictional_modes(matrix, vector, friction, sign, candidates, free, turning, *, max_pivots):
    """`(x, active, stick, sign, solved)` of [`solve_frictional_lcp`][]."""
    size = candidates.shape[0]
    tangents = tangent_count(sign)
    dtype = vector.dtype
    eps = jnp.finfo(dtype).eps
    a, b = jax.lax.stop_gradient((matrix, vector))
    friction_, given = jax.lax.stop_gradient((friction, sign))
    scale = jnp.max(jnp.abs(jnp.diagonal(a)), initial=0.0)
    tolerance = 64 * eps * (jnp.max(jnp.abs(b), initial=0.0) + scale)
    rubbing_free = free & (friction_ > 0)
    # The slipping contacts whose direction is found by substitution (in space).
    substituting = tangents > 1

    def violations_of(x, active, stick, sign_):
        """The modes' violated conditions at their solution `x`, and `w = A x + b`."""
        w = a @ x + b
        normal = candidates & (
            (active & (x[:size] < -tolerance)) | (~active & (w[:size] < -tolerance))
        )
        rubbing = active & rubbing_free
        tangential = x[size:].reshape(size, tangents)
        slips = rubbing & stick & (magnitudes(tangential) > friction_ * x[:size] + tolerance)
        sticks = rubbing & ~stick & (along(sign_, w[size:].reshape(size, tangents)) < -tolerance)
        return normal, slips | sticks, w

    def misalignment(active, stick, sign_, w, violated):
        """How far the sliding contacts' directions `sign_` are from their slip rates'
        (`inf` where the modes are violated), and those rates' directions."""
        sliding = active & turning & (friction_ > 0) & ~stick
        rate = w[size:].reshape(size, tangents)
        target = jnp.where(sliding[:, None], units(rate, sign_), sign_)
        off = jnp.sum(jnp.where(sliding, 1.0 - along(sign_, target), 0.0))
        return jnp.where(violated, jnp.inf, off), target

    def iteration(state: _PivotingState) -> _PivotingState:
        # A pivoting iteration solves the modes as they stand; a substitution tries the
        # directions `d ← (1 − s) d + s w_T/|w_T|`, kept only where they align `d` better
        # and meet every other condition; longer steps while they do, shorter where one
        # overshoots.
        trial = state.sign
        if substituting:
            trial = jnp.where(
                state.pivoting,
                state.sign,
                units((1 - state.step) * state.sign + state.step * state.target, state.sign),
            )
        x = frictional_solve(a, b, friction_, ContactModes(state.active, state.stick, trial))
        normal, tangent, w = violations_of(x, state.active, state.stick, trial)
        violated = (normal | tangent).any()
        # Pivoting: least index first, a contact's normal before its tangent; the modes
        # of the last solve are kept where the pivots ran out.
        flags = jnp.stack([normal, tangent], axis=1).reshape(-1)
        first = jnp.argmax(flags)
        # (`lax` integer division: `//` and `%` correct for negative operands, which an
        # index is not.)
        contact, is_tangent = jax.lax.div(first, 2), jax.lax.rem(first, 2) == 1
        flip = state.pivoting & violated & (state.pivots < max_pivots)
        flip_normal = flip & ~is_tangent
        flip_tangent = flip & is_tangent
        active = state.active.at[contact].set(
            jnp.where(flip_normal, ~state.active[contact], state.active[contact])
        )
        force = x[size:].reshape(size, tangents)[contact]
        if tangents == 1:
            new_sign = jnp.where(force[0] > 0, -1.0, 1.0).astype(dtype)
        else:
            new_sign = -units(force[None], -state.sign[contact][None])[0]
        sign_ = state.sign.at[contact].set(
            jnp.where(flip_tangent & state.stick[contact], new_sign, state.sign[contact])
        )
        stick = state.stick.at[contact].set(
            jnp.where(flip_tangent, ~state.stick[contact], state.stick[contact])
        )
        pivoted = state.pivoting & ~flip  # the modes are found (or the pivots ran out)
        off, target = state.off, state.target
        step = state.step
        keep = pivoted
        if substituting:
            trial_off, trial_target = misalignment(state.active, state.stick, trial, w, violated)
            better = ~state.pivoting & (trial_off < state.off)
            keep = pivoted | better
            # The pivoting's own directions are measured by its last solve.
            off = jnp.where(keep, trial_off, off)
            target = jnp.where(keep, trial_target, target)
            step = jnp.where(
                pivoted,
                0.5,
                jnp.where(better, jnp.minimum(2 * step, 1.0), 0.5 * step),
            )
            sign_ = jnp.where(keep, trial, sign_)
        x_kept = jnp.where(keep, x, state.x)
        clean = jnp.where(keep, ~violated, state.clean)
        substitutions = state.substitutions + ~state.pivoting
        finished = pivoted
        if substituting:
            # Substitutions follow modes that violate no condition, up to their number or
            # until the directions are aligned (no trial can do better).
            finished = (
                (pivoted & violated) | (substitutions >= DIRECTION_SUBSTITUTIONS) | (off == 0)
            )
        return _PivotingState(
            pivots=state.pivots + flip,
            substitutions=substitutions,
            pivoting=state.pivoting & flip,
            finished=state.finished | finished,
            active=active,
            stick=stick,
            sign=sign_,
            x=x_kept,
            clean=clean,
            off=off,
            target=target,
            step=step,
        )

    # Start: the closed gaps that approach; sticking where the tangential rate is nil,
    # else slipping its way.
    tangential = b[size:].reshape(size, tangents)
    if tangents == 1:
        start_sign = jnp.where(
            free, jnp.where(tangential[:, 0] < 0, -1.0, 1.0).astype(dtype), given
        )
    else:
        start_sign = jnp.where(free[:, None], units(tangential, given), given)
    start = _PivotingState(
        pivots=jnp.asarray(0),
        substitutions=jnp.asarray(0),
        pivoting=jnp.asarray(True),
        finished=jnp.asarray(False),
        active=candidates & (b[:size] < 0),
        stick=free & (magnitudes(tangential) <= tolerance),
        sign=start_sign,
        x=jnp.zeros_like(b),
        clean=jnp.asarray(False),
        off=jnp.asarray(jnp.inf, dtype),
        target=start_sign,
        step=jnp.asarray(0.0, dtype),
    )
    end = jax.lax.while_loop(lambda state: ~state.finished, iteration, start)
    return end.x, end.active, end.stick, end.sign, end.clean


@_frictional_modes.def_jvp
def _frictional_modes_jvp(primals, tangents, *, max_pivots):
    matrix, vector, friction, sign, candidates, free, turning = primals
    _, active, stick, found, solved = _frictional_modes(*primals, max_pivots=max_pivots)
    size, tangent_count_ = candidates.shape[0], tangent_count(sign)

    def solution(matrix, vector, friction, sign):
        directions = found
        if tangent_count_ > 1:
            # The directions as functions of the inputs: a contact not free takes the
            # given one's; a free one that slides that of `b_T/|b_T|`, its direction where
            # the tangential response is isotropic and uncoupled.
            given = jax.lax.stop_gradient(sign)
            moving = units(vector[size:].reshape(size, tangent_count_), given)
            directions = jnp.where(
                free[:, None],
                jnp.where(
                    (free & ~stick)[:, None],
                    found + moving - jax.lax.stop_gradient(moving),
                    found,
                ),
                found + sign - given,
            )
        x = frictional_solve(matrix, vector, friction, ContactModes(active, stick, directions))
        return x, directions

    inputs = (matrix, vector, friction, sign)
    (x, directions), (x_dot, directions_dot) = jax.jvp(
        solution, inputs, _materialized(inputs, tangents)
    )
    return (x, active, stick, directions, solved), (x_dot, None, None, directions_dot, None)
