"""The Newton iteration of [`jaxdae.GeneralizedAlpha`][]'s steps: a modified Newton method
whose factorized iteration matrix is carried from step to step, written as one loop of
array operations that XLA compiles into the step's kernel, and differentiated implicitly.

The iteration solves `r(x) = 0` with `xₖ₊₁ = xₖ − A⁻¹ r(xₖ)`, `A` an approximation of
`∂r/∂x` that the caller builds (`matrix`). `A⁻¹` (the inverse from a pivoted LU
factorization, or the pseudo-inverse where the caller asks for a least-squares solve) is
kept while the iteration contracts well and refreshed only when it does not, or when the
step's coefficient has changed much since it was built: the strategy of the implicit
multibody and DAE codes (Hairer & Wanner, *Solving ODEs II*, §IV.8 and §VI.5 for the
simplified Newton iteration and its convergence test; the Jacobian reuse of DASSL/IDA,
Brenan, Campbell & Petzold 1996, §5.2.2).

The loop is a `lax.while_loop` whose body evaluates the residual, applies `A⁻¹` (one
matrix–vector product) and tests the increment; a refresh is a `lax.cond` branch of the
same body. Its derivative is not taken through the loop: the solution `x*` of `r(x, p) = 0`
has `dx*/dp = −(∂r/∂x)⁻¹ ∂r/∂p` (implicit function theorem), with the exact `∂r/∂x` at
`x*` (forward mode, dense), so `jax.grad` through a solve with fixed steps equals the
derivative of the exact step map.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._linalg import blocked_inverse, inverse, lu_factor, lu_solve
from .._custom_types import Array, Bool, Float, Int

# The contraction rate above which a kept matrix is refreshed (and a fresh one is deemed to
# diverge when the rate reaches 1): below it an iteration costs one residual and gains at
# least a factor 2, cheaper than a new matrix (a forward-mode derivative per coordinate and
# a factorization); above it a new matrix, whose rate is that of Newton's method, pays.
REFRESH_RATE = 0.5

# A kept matrix is rebuilt at the start of a step whose coefficient `c` (∝ h²) differs
# from the one it was built for by more than this factor either way: DASSL's and IDA's
# rule for their iteration matrix `∂F/∂y + c_j ∂F/∂y'` (they refresh outside [0.6, 1/0.6]
# of the step's `c_j`).
COEFFICIENT_RATIO = 1 / 0.6


# Increments below this many units of rounding of the largest unknown end the iteration.
_ROUNDING_UNITS = 16


class IterationMatrix(eqx.Module):
    """The inverse of the Newton iteration matrix kept between steps.

    **Fields:**

    - `inverse`: `A⁻¹` (or `A⁺` for a least-squares solve), `(N, N)`.
    - `coefficient`: the step coefficient `c` it was built for; `0` before the first.
    - `builds`: how many matrices were built so far (for statistics).
    """

    inverse: Float[Array, "N N"]
    coefficient: Float[Array, ""]
    builds: Int[Array, ""]

    @classmethod
    def empty(cls, size: int, dtype) -> "IterationMatrix":
        return cls(jnp.zeros((size, size), dtype), jnp.zeros((), dtype), jnp.zeros((), jnp.int32))


def invert(
    matrix: Float[Array, "N N"], least_squares: bool, rcond: float | None
) -> Float[Array, "N N"]:
    """`A⁻¹` in array operations, so that it fuses into the step and the solve's loop stays
    one kernel: by `_linalg.inverse` up to `LU_UNROLL_MAX` rows (unrolled LU), by block
    Gauss–Jordan elimination (`_linalg.blocked_inverse`, blocks of `NEWTON_INVERSE_BLOCK`
    rows) up to `LOOPED_INVERSE_MAX`, LAPACK beyond; or `A⁺` by an SVD where `least_squares`
    (singular values below `rcond σ_max` dropped; default `N ε`, as `lineax.SVD`).

    The block elimination does not pivot across blocks: the Newton matrix's unknowns are the
    positions, then the multipliers, and with `M − c K` positive definite and independent
    constraints every pivot block is nonsingular. Where it is not (an indefinite `M − c K`
    at a large step), the inverse is inaccurate or not finite: the iteration applies it to
    the step's true residual, so that its fixed point does not move, and it contracts
    slower or not at all; a fresh matrix that does not contract fails the step, which is
    retried with a smaller one, whose `M − c K` is closer to `M`."""
    size = matrix.shape[0]
    if least_squares:
        rcond = size * float(jnp.finfo(matrix.dtype).eps) if rcond is None else rcond
        return jnp.linalg.pinv(matrix, rtol=rcond)
    if _thresholds.LU_UNROLL_MAX < size <= _thresholds.LOOPED_INVERSE_MAX:
        return blocked_inverse(matrix, _thresholds.NEWTON_INVERSE_BLOCK)
    return inverse(matrix)


class NewtonOptions(eqx.Module):
    """The static configuration of the iteration.

    - `residual(x, args)`: `(r, aux)`: the equations, flat `(N,)`, and what the caller
        wants to keep from their last evaluation (`aux`, not differentiated).
    - `matrix(x, args)`: the iteration matrix `A ≈ ∂r/∂x` at `x`, `(N, N)`.
    - `coefficient(args)`: the step's coefficient, which `A` depends on.
    - `measure(x, delta, args)`: `(d, y)`, the increment `delta` at `x` in the units in
        which it is tested, and the quantity `y` whose tolerance `atol + rtol |y|` it is
        tested against.
    - `norm`: the norm of the increments `d` scaled by `atol + rtol |y|`.
    - `kappa`: the iteration stops once its remaining error is below `kappa` (scaled norm).
    - `max_steps`: the most iterations.
    - `least_squares`, `rcond`: a pseudo-inverse instead of an inverse.
    """

    residual: Callable = eqx.field(static=True)
    matrix: Callable = eqx.field(static=True)
    coefficient: Callable = eqx.field(static=True)
    measure: Callable = eqx.field(static=True)
    norm: Callable = eqx.field(static=True)
    kappa: float = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    least_squares: bool = eqx.field(static=True)
    rcond: float | None = eqx.field(static=True)


class _Loop(eqx.Module):
    """The state of the iteration: the iterate, the matrix in use, and the test's data."""

    x: Float[Array, " N"]
    aux: Any  # the residual's `aux` at the last evaluation
    inverse: Float[Array, "N N"]
    coefficient: Float[Array, ""]  # the `c` the matrix was built for
    builds: Int[Array, ""]
    refresh: Bool[Array, ""]  # build a matrix before the next iteration
    fresh: Bool[Array, ""]  # the matrix in use was built at this step
    previous: Float[Array, ""]  # the last increment's size (inf after a new matrix)
    iterations: Int[Array, ""]
    converged: Bool[Array, ""]
    failed: Bool[Array, ""]


def _iterate(
    x0: Array, args: Any, kept: IterationMatrix, rtol, atol, options: NewtonOptions
) -> tuple[Array, IterationMatrix, Array, Array, Any]:
    """`(x, matrix, converged, iterations, aux)`: the modified Newton iteration from
    `x0`."""
    coefficient = options.coefficient(args)
    ratio = coefficient / jnp.where(kept.coefficient == 0, 1.0, kept.coefficient)
    stale = (kept.coefficient == 0) | (ratio > COEFFICIENT_RATIO) | (ratio < 1 / COEFFICIENT_RATIO)
    inf = jnp.asarray(jnp.inf, x0.dtype)
    aux = jax.tree.map(jnp.zeros_like, jax.eval_shape(options.residual, x0, args)[1])
    state = _Loop(
        x0,
        aux,
        kept.inverse,
        kept.coefficient,
        kept.builds,
        stale,
        jnp.asarray(False),
        inf,
        jnp.zeros((), jnp.int32),
        jnp.asarray(False),
        jnp.asarray(False),
    )

    def build(s: _Loop):
        inverse = invert(options.matrix(s.x, args), options.least_squares, options.rcond)
        return inverse, coefficient, s.builds + 1

    def body(s: _Loop) -> _Loop:
        inverse, coeff, builds = jax.lax.cond(
            s.refresh, build, lambda s: (s.inverse, s.coefficient, s.builds), s
        )
        fresh = s.fresh | s.refresh
        previous = jnp.where(s.refresh, inf, s.previous)
        residual, aux = options.residual(s.x, args)
        delta = -(inverse @ residual)
        measured, reference = options.measure(s.x, delta, args)
        size = options.norm(measured / (atol + rtol * jnp.abs(reference)))
        finite = jnp.isfinite(size)
        # An increment at the rounding level of `x` cannot shrink further.
        rounding = jnp.max(jnp.abs(delta)) <= (
            _ROUNDING_UNITS * jnp.finfo(s.x.dtype).eps * jnp.max(jnp.abs(s.x))
        )
        # No rate before a second increment with the same matrix: `nan`, which fails
        # every comparison below.
        rate = jnp.where(jnp.isfinite(previous), size / previous, jnp.nan)
        remaining = options.max_steps - 1 - s.iterations
        # Increments within the tolerance that stop shrinking are rounding noise: the
        # iterate is as good as the arithmetic allows.
        stagnated = (rate >= 1) & (size <= 1)
        converged = finite & (
            (size <= options.kappa)
            | rounding
            | stagnated
            | ((rate < 1) & (rate / (1 - rate) * size <= options.kappa))
        )
        # Too slow: the rate is poor, or at this rate the budget will not reach `kappa`.
        slow = ~converged & (
            ~finite
            | (rate > REFRESH_RATE)
            | ((rate < 1) & (rate**remaining / (1 - rate) * size > options.kappa))
        )
        refresh = slow & ~fresh
        failed = ~converged & ((fresh & (~finite | (rate >= 1))) | (remaining <= 0))
        # A step that grows the error (or is not finite) is not taken.
        keep = finite & ~(rate >= 1)
        x = jnp.where(keep, s.x + delta, s.x)
        return _Loop(
            x,
            aux,
            inverse,
            coeff,
            builds,
            refresh,
            fresh,
            jnp.where(refresh, inf, size),
            s.iterations + 1,
            converged,
            failed,
        )

    def cond(s: _Loop):
        return ~(s.converged | s.failed)

    out = jax.lax.while_loop(cond, body, state)
    matrix = IterationMatrix(out.inverse, out.coefficient, out.builds)
    return out.x, matrix, out.converged, out.iterations, out.aux


@eqx.filter_custom_jvp
def newton_solve(
    x0: Array, args: Any, kept: IterationMatrix, rtol, atol, *, options: NewtonOptions
):
    """Solves `options.residual(x, args) = 0` from `x0` by the modified Newton iteration,
    with the kept matrix `kept` where it still serves.

    **Returns:** `(x, matrix, converged, iterations, aux)`: the solution, the matrix to
    keep for the next solve, whether the iteration converged, how many iterations it took
    and the residual's `aux` at the last iterate but one.

    Differentiated implicitly with respect to `args` (`x0`, `kept` and the tolerances do
    not change the solution)."""
    return _iterate(x0, args, kept, rtol, atol, options)


@newton_solve.def_jvp
def _newton_solve_jvp(primals, tangents, *, options: NewtonOptions):
    x0, args, kept, rtol, atol = primals
    _, t_args, _, _, _ = tangents
    out = _iterate(x0, args, kept, rtol, atol, options)
    x = out[0]

    def residual_of_args(a):
        return options.residual(x, a)[0]

    _, r_dot = eqx.filter_jvp(residual_of_args, (args,), (t_args,))
    jacobian = jax.jacfwd(lambda y: options.residual(y, args)[0])(x)
    if options.least_squares:
        x_dot = -(invert(jacobian, True, options.rcond) @ r_dot)
    else:
        x_dot = -lu_solve(lu_factor(jacobian), r_dot)
    no_tangent = jax.tree.map(lambda _: None, out[1:])
    return out, (x_dot, *no_tangent)
