"""The Newton iteration of [`jaxdae.GeneralizedAlpha`][]'s steps: a modified Newton method
whose factorized iteration matrix is carried from step to step, written as one loop of array
operations that XLA compiles into the step's kernel, and differentiated implicitly.

The iteration solves `r(x) = 0` with `xₖ₊₁ = xₖ − A⁻¹ r(xₖ)`, `A` an approximation of
`∂r/∂x` that the caller builds (`matrix`). `A`'s factorization (the inverse from a pivoted
LU factorization, the pseudo-inverse where the caller asks for a least-squares solve, or,
for a large saddle-point matrix on its sparsity, its sparse LU factors) is kept while the
iteration contracts well and refreshed only when it does not, or when the step's coefficient
has changed much since it was built: the strategy of the implicit multibody and DAE codes
(Hairer & Wanner, *Solving ODEs II*, §IV.8 and §VI.5 for the simplified Newton iteration and
its convergence test; the Jacobian reuse of DASSL/IDA, Brenan, Campbell & Petzold 1996,
§5.2.2).

The loop is a `lax.while_loop` whose body evaluates the residual, applies `A⁻¹` (one
matrix–vector product, or the sparse factors' substitutions) and tests the increment; a
refresh is a `lax.cond` branch of the same body. Its derivative is not taken through the
loop: the solution `x*` of `r(x, p) = 0` has `dx*/dp = −(∂r/∂x)⁻¹ ∂r/∂p` (implicit function
theorem), with the exact `∂r/∂x` at `x*` (forward mode, one tangent per unknown or per
colour group of a sparse `∂r/∂x`), so `jax.grad` through a solve with fixed steps equals the
derivative of the exact step map."""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._linalg import blocked_inverse, inverse, lu_factor, lu_solve
from .._compilation._sparse import SparseMatrix
from .._compilation._supernodal_lu import SupernodalLU, saddle_point_plan, supernodal_lu
from .._custom_types import Array, Bool, Float, Int
from ._jacobian import sparse_jacobian

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


class AbstractNewtonFactor(eqx.Module):
    """A factorization of the iteration matrix `A`, applied as `A⁻¹ r` at every
    iteration."""

    @abc.abstractmethod
    def apply(self, residual: Float[Array, " N"]) -> Float[Array, " N"]:
        """`A⁻¹ residual` (`A⁺ residual` for a least-squares solve)."""


class DenseInverse(AbstractNewtonFactor):
    """`A⁻¹` (or `A⁺`) as a dense matrix: one matrix–vector product per iteration."""

    inverse: Float[Array, "N N"]

    def apply(self, residual):
        return self.inverse @ residual


class SparseLU(AbstractNewtonFactor):
    """The sparse LU factors of `A` (of `Aᵀ` where `transpose`: the same factors
    applied transposed; `_compilation/_supernodal_lu.py`): two passes of substitutions per
    iteration, `O(entries of the factors)`."""

    factors: SupernodalLU
    transpose: bool = eqx.field(static=True, default=False)

    def apply(self, residual):
        return self.factors.substitutions(residual, self.transpose)


class AbstractNewtonMatrix(eqx.Module):
    """An iteration matrix `A` in the form its caller built it."""

    @abc.abstractmethod
    def factor(self, least_squares: bool, rcond: float | None) -> AbstractNewtonFactor:
        """The factorization that the iteration applies."""


class DenseNewtonMatrix(AbstractNewtonMatrix):
    """`A` as a dense matrix, inverted by [`invert`][]."""

    matrix: Float[Array, "N N"]

    def factor(self, least_squares, rcond):
        return DenseInverse(invert(self.matrix, least_squares, rcond))


class SaddlePointMatrix(AbstractNewtonMatrix):
    """`A` on its sparsity pattern, its first `coordinates` unknowns coordinates and the
    others the multipliers of constraints (the index-3 equations' `[[M − c K, Gᵀ], [G,
    0]]`). Factorized by the sparse LU factorization on a saddle-point order where the
    plan estimates it cheaper than the dense inverse (`saddle_point_plan`), else (and for a
    least-squares solve) inverted densely."""

    matrix: SparseMatrix
    coordinates: int = eqx.field(static=True)

    def factor(self, least_squares, rcond):
        plan = None if least_squares else saddle_point_plan(self.matrix.pattern, self.coordinates)
        if plan is None:
            return DenseInverse(invert(self.matrix.dense(), least_squares, rcond))
        return SparseLU(supernodal_lu(self.matrix, plan))


class IterationMatrix(eqx.Module):
    """The factorization of the Newton iteration matrix kept between steps.

    **Fields:**

    - `factor`: `A`'s factorization ([`AbstractNewtonFactor`][]).
    - `coefficient`: the step coefficient `c` it was built for; `0` before the first.
    - `builds`: how many matrices were built so far (for statistics).
    """

    factor: AbstractNewtonFactor
    coefficient: Float[Array, ""]
    builds: Int[Array, ""]

    @classmethod
    def empty(cls, factor: Any, dtype) -> "IterationMatrix":
        """Before the first build: a factorization of `factor`'s structure (an
        [`AbstractNewtonFactor`][] or its `jax.eval_shape`), zeroed; `dtype` the
        coefficient's."""
        zeros = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), factor)
        return cls(zeros, jnp.zeros((), dtype), jnp.zeros((), jnp.int32))


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
    - `matrix(x, args)`: the iteration matrix `A ≈ ∂r/∂x` at `x`, an
        [`AbstractNewtonMatrix`][].
    - `coefficient(args)`: the step's coefficient, which `A` depends on.
    - `measure(x, delta, args)`: `(d, y)`, the increment `delta` at `x` in the units in
        which it is tested, and the quantity `y` whose tolerance `atol + rtol |y|` it is
        tested against.
    - `norm`: the norm of the increments `d` scaled by `atol + rtol |y|`.
    - `kappa`: the iteration stops once its remaining error is below `kappa` (scaled norm).
    - `max_steps`: the most iterations.
    - `least_squares`, `rcond`: a pseudo-inverse instead of an inverse.
    - `coordinates`: where the first `coordinates` unknowns are coordinates and the others
        multipliers (a saddle point), the implicit function theorem's solve with the exact
        `∂r/∂x` of more than `LOOPED_INVERSE_MAX` unknowns runs on its sparsity (the sparse LU
        factorization, where its plan is cheaper than the dense one); `None`: dense.
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
    coordinates: int | None = eqx.field(static=True, default=None)


class _Loop(eqx.Module):
    """The state of the iteration: the iterate, the matrix in use, and the test's data."""

    x: Float[Array, " N"]
    aux: Any  # the residual's `aux` at the last evaluation
    factor: AbstractNewtonFactor
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
        kept.factor,
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
        factor = options.matrix(s.x, args).factor(options.least_squares, options.rcond)
        return factor, coefficient, s.builds + 1

    def body(s: _Loop) -> _Loop:
        factor, coeff, builds = jax.lax.cond(
            s.refresh, build, lambda s: (s.factor, s.coefficient, s.builds), s
        )
        fresh = s.fresh | s.refresh
        previous = jnp.where(s.refresh, inf, s.previous)
        residual, aux = options.residual(s.x, args)
        delta = -factor.apply(residual)
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
            factor,
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
    matrix = IterationMatrix(out.factor, out.coefficient, out.builds)
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
    x_dot = -_exact_solve(lambda y: options.residual(y, args)[0], x, r_dot, options)
    no_tangent = jax.tree.map(lambda _: None, out[1:])
    return out, (x_dot, *no_tangent)


def _exact_solve(residual, x, rhs, options: NewtonOptions) -> Array:
    """`(∂r/∂x)⁻¹ rhs` at `x` with the exact `∂r/∂x` (`residual(x) = r`): on its sparsity
    where `options.coordinates` says the unknowns form a saddle point of more than
    `LOOPED_INVERSE_MAX` and its plan is cheaper than the dense factorization (one tangent
    per colour group of its columns, the sparse LU factorization); else the dense Jacobian
    (one tangent per unknown) and LU (the pseudo-inverse for a least-squares solve)."""
    if (
        options.coordinates is not None
        and not options.least_squares
        and x.shape[0] > _thresholds.LOOPED_INVERSE_MAX
    ):
        jacobian = sparse_jacobian(residual, x)
        plan = saddle_point_plan(jacobian.pattern, options.coordinates)
        if plan is not None:
            return supernodal_lu(jacobian, plan).solve(rhs)
    jacobian = jax.jacfwd(residual)(x)
    if options.least_squares:
        return invert(jacobian, True, options.rcond) @ rhs
    return lu_solve(lu_factor(jacobian), rhs)
