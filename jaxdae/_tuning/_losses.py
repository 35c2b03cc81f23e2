"""Built-in losses on a [`jaxdae.Solution`][] for [`jaxdae.tune`][].

Every loss integrates over the saved times `Solution.ts` with the trapezoidal rule, so pass
`ts=` with enough points to resolve the transient. Losses combine linearly:
`ConstraintViolation() + 0.1 * ControlEffort()`.

**A failed solve** (`simulate(..., throw=False)` whose `Solution.succeeded` is false) has
the loss `inf` and a zero gradient (no `nan`), whatever the loss: the rule of
[`jaxdae.tune`][], where a failed scenario counts as a constant (`failure_penalty`) with
no gradient, with `inf` in place of the penalty, which a loss on its own does not know. So
a failure is never mistaken for a good result (the saved rows after the failure are `inf`,
and the part of the run before it would otherwise give a small loss), a mean over
scenarios with a failure is `inf`, and `jnp.where(jnp.isfinite(loss), loss, penalty)`
gives `tune`'s penalized loss.
"""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_positive
from .._custom_types import Array, Float
from .._solution import Solution
from ._outcome import output_failed


def _valid_rows(sol: Solution):
    return jnp.isfinite(sol.ts)


def integrate(sol: Solution, values: Float[Array, " N"]) -> Float[Array, ""]:
    """Trapezoidal `∫ values dt` over the saved times, skipping rows after a failure."""
    valid = _valid_rows(sol)
    values = jnp.where(valid, values, 0.0)
    ts = jnp.where(valid, sol.ts, 0.0)
    both = valid[1:] & valid[:-1]
    dt = jnp.where(both, ts[1:] - ts[:-1], 0.0)
    return jnp.sum(0.5 * dt * (values[1:] + values[:-1]))


def _failed(solution) -> Array:
    return output_failed(solution)


def _or_inf(solution, value):
    """`value`, or `inf` (with a zero gradient) where `solution` failed."""
    return jnp.where(_failed(solution), jnp.inf, value)


def _safe(x, valid):
    return jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0.0)


class AbstractLoss(eqx.Module):
    """A scalar loss of one simulated scenario, `loss(solution) -> scalar`.

    Losses add and scale: `ConstraintViolation() + 0.1 * ControlEffort()`. Any callable
    `solution -> scalar` works as a loss in [`jaxdae.tune`][] too.
    """

    @abc.abstractmethod
    def __call__(self, solution: Solution) -> Float[Array, ""]:
        """The loss of one solution: `inf`, with a zero gradient, if it failed."""

    def __add__(self, other):
        return _Sum((self, other))

    def __radd__(self, other):
        return _Sum((other, self))

    def __mul__(self, weight):
        return _Scaled(self, jnp.asarray(weight, dtype=float))

    __rmul__ = __mul__


class _Sum(AbstractLoss):
    terms: tuple

    def __call__(self, solution):
        return _or_inf(solution, sum(term(solution) for term in self.terms))


class _Scaled(AbstractLoss):
    loss: Callable
    weight: Array

    def __call__(self, solution):
        return _or_inf(solution, self.weight * self.loss(solution))


class ConstraintViolation(AbstractLoss):
    """`∫ (|Φ|² + w_d |Φ̇|² + w_v |Ψ|²) dt` over the saved times: integrated constraint drift.

    **Arguments:**

    - `rate_weight`: `w_d`, weight of the velocity-level residual `Φ̇` (default 1).
    - `nonholonomic_weight`: `w_v`, weight of `Ψ` (default 1).
    """

    rate_weight: float = 1.0
    nonholonomic_weight: float = 1.0

    def __check_init__(self):
        check_positive("rate_weight", self.rate_weight, "weight", allow_zero=True)
        check_positive("nonholonomic_weight", self.nonholonomic_weight, "weight", allow_zero=True)

    def __call__(self, solution):
        valid = _valid_rows(solution)
        phi = _safe(solution.phi, valid)
        dphi = _safe(solution.dphi, valid)
        psi = _safe(solution.psi, valid)
        density = (
            jnp.sum(phi**2, axis=-1)
            + self.rate_weight * jnp.sum(dphi**2, axis=-1)
            + self.nonholonomic_weight * jnp.sum(psi**2, axis=-1)
        )
        return _or_inf(solution, integrate(solution, density))


class TrackingError(AbstractLoss):
    """`∫ |y(t, q) − r(t)|² dt`: tracking error of an output against a reference.

    **Arguments:**

    - `reference`: a function `t -> r(t)` (shape `(p,)`), or an array `(N, p)` of reference
        values at the saved times.
    - `output`: a function `(t, q) -> y` (shape `(p,)`); default `y = q`.
    """

    reference: Callable | Array
    output: Callable | None = None

    def __call__(self, solution):
        valid = _valid_rows(solution)
        ts = jnp.where(valid, solution.ts, 0.0)
        q = _safe(solution.q, valid)
        y = q if self.output is None else jax.vmap(self.output)(ts, q)
        r = jax.vmap(self.reference)(ts) if callable(self.reference) else self.reference
        return _or_inf(solution, integrate(solution, jnp.sum((y - r) ** 2, axis=-1)))


class ControlEffort(AbstractLoss):
    """`∫ |u|² dt`: control effort.

    **Arguments:**

    - `control`: a function `(t, q, v) -> u` giving the control at a state; default: the
        multipliers `Solution.multipliers`, i.e. the constraint reactions that realize the
        (program) constraints — the control of Mukharlyamov's (2019) inverse problem.
    """

    control: Callable | None = None

    def __call__(self, solution):
        valid = _valid_rows(solution)
        if self.control is None:
            u = _safe(solution.multipliers, valid)
        else:
            ts = jnp.where(valid, solution.ts, 0.0)
            u = jax.vmap(self.control)(ts, _safe(solution.q, valid), _safe(solution.v, valid))
        return _or_inf(solution, integrate(solution, jnp.sum(u**2, axis=-1)))


class SettlingTime(AbstractLoss):
    """A smooth surrogate of the settling time: the time spent outside the band `e <= tol`.

    `∫ σ((log e(t) − log tol) / width) dt` with `σ` the logistic function, so the indicator
    of `e > tol` is smoothed over a factor `exp(width)` around `tol`. For an error that
    settles monotonically this is the settling time.

    **Arguments:**

    - `tolerance`: the band `tol > 0`.
    - `width`: smoothing width in log units (default 0.5).
    - `signal`: a function `solution -> (N,)` non-negative error magnitudes; default the
        constraint perturbation `|(Φ, Φ̇, Ψ)|`.
    """

    tolerance: float
    width: float = 0.5
    signal: Callable | None = None

    def __check_init__(self):
        check_positive("tolerance", self.tolerance, "band")
        check_positive("width", self.width, "width")

    def __call__(self, solution):
        valid = _valid_rows(solution)
        if self.signal is None:
            squared = (
                jnp.sum(_safe(solution.phi, valid) ** 2, axis=-1)
                + jnp.sum(_safe(solution.dphi, valid) ** 2, axis=-1)
                + jnp.sum(_safe(solution.psi, valid) ** 2, axis=-1)
            )
        else:
            squared = _safe(self.signal(solution), valid) ** 2
        tiny = jnp.finfo(squared.dtype).tiny
        log_error = 0.5 * jnp.log(squared + tiny)
        indicator = jax.nn.sigmoid((log_error - jnp.log(self.tolerance)) / self.width)
        return _or_inf(solution, integrate(solution, indicator))
