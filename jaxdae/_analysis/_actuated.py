"""Consistent initial states of actuated systems: the state nearest a guess on which the
program constraints and their derivatives hold."""

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import check_finite, check_positive
from .._compilation._linalg import (
    full_precision,
)
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._formulations._constraint_enforcing import ConstraintEnforcingControl
from .._gains import (
    is_concrete,
)
from .._integration._actuated import check_actuated_system, initial_actuated_state
from .._systems._actuated import ActuatedSystem, lie_derivatives
from .._systems._system import cast_floating


def _program_residual(system, control, t, x):
    """`y = (f, …, f⁽ᵖ⁻¹⁾)` of every group, flattened."""
    orders = tuple(len(group) for group in control.groups)
    values = lie_derivatives(system, max(orders), t, x)[0]
    return jnp.concatenate([values[k][i] for i, order in enumerate(orders) for k in range(order)])


def _kkt_residual(y, args):
    """KKT conditions of `min ½ (x − x0)ᵀ W (x − x0)` s.t. `y(x) = 0`, `W = diag(metric)`
    (in the flattened state)."""
    x, lam = y
    system, control, t0, x0, metric, unravel = args
    residual, vjp = jax.vjp(lambda x_: _program_residual(system, control, t0, unravel(x_)), x)
    return metric * (x - x0) + vjp(lam)[0], residual


@eqx.filter_jit
def _programmed_state(system, control, t0, guess, weights, tol, max_steps):
    """Newton's method on `_kkt_residual` from the `guess = (q0, v0, w0)`: the state, its
    residual `y` and optimistix's result."""
    # Flattened inside the trace: an `unravel` made outside would be a new static argument,
    # and a recompilation, at every call.
    x0, unravel = jax.flatten_util.ravel_pytree(guess)
    metric, _ = jax.flatten_util.ravel_pytree(weights)
    lam0 = jnp.zeros_like(_program_residual(system, control, t0, unravel(x0)))
    solver = optx.Newton(
        rtol=0.1 * tol, atol=0.1 * tol, linear_solver=lx.AutoLinearSolver(well_posed=False)
    )
    sol = optx.root_find(
        _kkt_residual,
        solver,
        (x0, lam0),
        args=(system, control, t0, x0, metric, unravel),
        max_steps=max_steps,
        throw=False,
    )
    x = sol.value[0]
    return unravel(x), _program_residual(system, control, t0, unravel(x)), sol.result


def _metric_weights(weights, state):
    """`weights` (default ones) broadcast to the shapes of `state = (q, v, w)`; concrete
    weights must be positive and finite."""
    if weights is None:
        return tuple(jnp.ones_like(x) for x in state)
    if not (isinstance(weights, (tuple, list)) and len(weights) == 3):
        raise ValueError(
            "`weights` must be a tuple `(w_q, w_v, w_w)` of the metric's weights "
            f"for q, v and w; got {weights!r}."
        )
    out = []
    for name, weight, x in zip(("w_q", "w_v", "w_w"), weights, state, strict=False):
        weight = jnp.asarray(weight, x.dtype)
        try:
            weight = jnp.broadcast_to(weight, x.shape)
        except ValueError:
            raise ValueError(
                f"`weights`: {name} must be a scalar or have shape {x.shape}; "
                f"got shape {weight.shape}."
            ) from None
        values = np.asarray(weight) if is_concrete(weight) else None
        if values is not None and not (np.all(values > 0) and np.all(np.isfinite(values))):
            raise ValueError(f"`weights`: {name} must be positive and finite; got {weight}.")
        out.append(weight)
    return tuple(out)


_NOT_PROGRAMMED = (
    "No state on the programmed motion found near the guess: {detail}. The program "
    "constraints may have no solution near it (e.g. a configuration the mechanism cannot "
    "reach): choose a closer guess."
)


@full_precision
def consistent_actuated_state(
    system: ActuatedSystem,
    control: ConstraintEnforcingControl,
    t0: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    w0: Float[ArrayLike, " k"],
    *,
    weights: tuple[ArrayLike, ArrayLike, ArrayLike] | None = None,
    tol: ScalarLike | None = None,
    max_steps: int = 64,
) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, " k"]]:
    """The state nearest to `(q0, v0, w0)` (in the metric `weights`) on the programmed motion:
    `f = ḟ = … = f⁽ᵖ⁻¹⁾ = 0` for every group (Mukharlyamov (2019), eq. [2.5]), the start for which
    even the unstabilized law of eq. [2.9] keeps the constraints.

    Newton's method (optimistix) on the KKT conditions of `min ½ (x − x0)ᵀ W (x − x0)`
    subject to those equations, with least-squares linear solves. When the equations fix the
    whole state (as in the adaptive-optics element: four equations, four states) the result
    is the unique programmed state, whatever the metric. When they leave some of it free,
    the metric says what to keep: positions, velocities and actuator states have different
    units, and a large weight keeps that part of the guess.

    **Arguments:**

    - `system`, `control`: as for [`jaxdae.simulate_actuated`][] (the control's relative
        degrees say how many derivatives vanish).
    - `t0`, `q0`, `v0`, `w0`: the time and the guess.
    - `weights`: `(w_q, w_v, w_w)`, the positive diagonal of `W` for `q`, `v` and `w`
        (scalars or arrays of their shapes); default all ones (the Euclidean norm).
    - `tol`: accepted `max |f⁽ᵏ⁾|`; default `1e3 · eps`, scaled by the size of the guess.
    - `max_steps`: Newton iterations.

    **Returns:**

    `(q, v, w)`.

    **Raises:**

    `ValueError` if no such state is found near the guess; under `jax.jit`, `jax.vmap` or
    `jax.grad` (which it supports, as [`jaxdae.consistent_initial_state`][] does) a runtime
    error with the same message.
    """
    q0, v0, w0 = initial_actuated_state(q0, v0, w0)
    dtype = q0.dtype
    t0 = jnp.asarray(t0, dtype)
    system, control = cast_floating((system, control), dtype)
    check_finite("t0", t0)
    check_positive("tol", tol, "residual")
    weights = _metric_weights(weights, (q0, v0, w0))
    check_actuated_system(system, control, t0, q0, v0, w0)
    if tol is None:
        size = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in (q0, v0, w0)]))
        tol = 1e3 * float(jnp.finfo(dtype).eps) * (1.0 + size)
    tol = jax.lax.stop_gradient(jnp.asarray(tol, dtype))
    state, residual, result = _programmed_state(
        system, control, t0, (q0, v0, w0), weights, tol, max_steps
    )
    worst = jnp.max(jnp.abs(residual), initial=0.0)
    failed = ~(worst <= tol)  # also NaN
    if not is_concrete(failed):
        return eqx.error_if(
            state,
            failed,
            _NOT_PROGRAMMED.format(detail="max|f⁽ᵏ⁾| > tol after the Newton projection"),
        )
    if failed:
        raise ValueError(
            _NOT_PROGRAMMED.format(
                detail=f"after Newton projection max|f⁽ᵏ⁾| = {float(worst):.3g} > tol = "
                f"{float(tol):.3g} ({optx.RESULTS[result]!s})"
            )
        )
    return state
