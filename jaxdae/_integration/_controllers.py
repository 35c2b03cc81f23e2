"""Step-size control and saving: the wrapper that stops stalled steps, the clip times a
controller must step to, and the solve's step options and saved times."""

import functools

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._checks import check_positive, check_tolerances
from .._custom_types import Array
from .._gains import is_concrete
from ._forwarding import Forwarded


class AbstractControllerWrapper(diffrax.AbstractAdaptiveStepSizeController):
    """An adaptive controller that wraps another: the tolerances and the error norm are
    the wrapped controller's."""

    controller: eqx.AbstractVar[diffrax.AbstractAdaptiveStepSizeController]
    rtol = Forwarded("controller")
    atol = Forwarded("controller")
    norm = Forwarded("controller")


@functools.singledispatch
def jump_times(controller: diffrax.AbstractStepSizeController) -> Array | None:
    """The times at which `controller` steps across a discontinuity (after which the solver
    re-evaluates a step's first stage): `diffrax.ClipStepSizeController`'s `jump_ts`, those
    of the controller inside a wrapper, or None. Dispatched on the controller's class, so
    that a controller of one's own with jumps registers them."""
    del controller
    return None


jump_times.register(diffrax.ClipStepSizeController, lambda controller: controller.jump_ts)
jump_times.register(AbstractControllerWrapper, lambda controller: jump_times(controller.controller))


def inner_controller(
    controller: diffrax.AbstractStepSizeController,
) -> diffrax.AbstractStepSizeController:
    """The controller inside `controller`'s wrappers (`diffrax.ClipStepSizeController`,
    jaxdae's `AbstractControllerWrapper`)."""
    while isinstance(controller, diffrax.ClipStepSizeController | AbstractControllerWrapper):
        controller = controller.controller
    return controller


class StopStalledSteps(AbstractControllerWrapper):
    """An adaptive controller that ends the solve with `diffrax.RESULTS.dt_min_reached`
    when the step it proposes has shrunk to the rounding level of `t`.

    Where the model yields nan or inf (a potential that leaves its domain at some `t` or
    `q`), every step across that point is rejected and the step shrinks until `t + dt`
    rounds to `t`: the solve then takes steps of length zero until `max_steps`, or forever
    with `max_steps=None`. Here it stops at the first proposal shorter than
    `4 ε max(|t|, 10⁻³ |t1 − t0|)` (`ε` the machine epsilon of `t`), which no solve that
    can still reach `t1` proposes; called eagerly, `simulate` then names what was
    non-finite (`name_non_finite_term`). One comparison per step, on scalars.

    A step that the controller proposes to end just short of a time it steps to (a
    `diffrax.ClipStepSizeController`'s `step_ts`, or the last time before one of its
    `jump_ts`) is extended to that time (`snap_to_clip_times`): else the next step, clipped
    to it, would be a rounding error long and stop the solve here. (Equal steps between
    evenly spaced save times accumulate that rounding error, e.g. `t + 0.025` landing
    two ulps before the save time 2.9.)"""

    controller: diffrax.AbstractAdaptiveStepSizeController

    def wrap(self, direction):
        return StopStalledSteps(self.controller.wrap(direction))

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        tnext, state = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        dtype = jnp.result_type(t0)
        floor = 1e-3 * jnp.abs(jnp.asarray(t1, dtype) - t0)
        tnext = snap_to_clip_times(self.controller, t0, tnext, floor)
        return tnext, (state, floor)

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        state, floor = controller_state
        keep, tprev, tnext, jump, state, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, state
        )
        tnext = snap_to_clip_times(self.controller, tprev, tnext, floor)
        eps = jnp.finfo(jnp.result_type(tprev)).eps
        stalled = tnext - tprev <= 4 * eps * jnp.maximum(jnp.abs(tprev), floor)
        result = diffrax.RESULTS.where(
            stalled & (result == diffrax.RESULTS.successful), diffrax.RESULTS.dt_min_reached, result
        )
        return keep, tprev, tnext, jump, (state, floor), result


def clip_times(controller) -> list[Array]:
    """The sorted times that `controller` (a `diffrax.ClipStepSizeController`, possibly
    wrapping another) ends steps on: its `step_ts`, and the last time before each of its
    `jump_ts` (after which it restarts just past the jump)."""
    times = []
    while isinstance(controller, diffrax.ClipStepSizeController):
        if controller.step_ts is not None and controller.step_ts.size:
            times.append(controller.step_ts)
        if controller.jump_ts is not None and controller.jump_ts.size:
            times.append(jnp.nextafter(controller.jump_ts, -jnp.inf))
        controller = controller.controller
    return times


def snap_to_clip_times(controller, tprev, tnext, floor, ulps: int = 128) -> Array:
    """`tnext`, the end of the step from `tprev` that `controller` proposes, moved up to the
    next of its `clip_times` where that lies at most `ulps` rounding units
    (`ε max(|t|, floor)`, as `StopStalledSteps` measures a stall) and at most half the step
    beyond it. (Never more than half the step: a step that the error test keeps rejecting
    still shrinks below the gap, and is then stopped as stalled.)"""
    for times in clip_times(controller):
        times = times.astype(jnp.result_type(tnext))
        index = jnp.searchsorted(times, tnext, side="left", method="scan_unrolled")
        target = times[jnp.minimum(index, times.shape[0] - 1)]
        gap = target - tnext
        unit = jnp.finfo(gap.dtype).eps * jnp.maximum(jnp.abs(target), floor)
        snap = (
            (index < times.shape[0])
            & (gap > 0)
            & (gap <= ulps * unit)
            & (gap <= 0.5 * (tnext - tprev))
        )
        tnext = jnp.where(snap, target, tnext)
    return tnext


def stop_stalled_steps(stepsize_controller):
    """`stepsize_controller` wrapped in `StopStalledSteps` if it is adaptive."""
    if isinstance(stepsize_controller, diffrax.AbstractAdaptiveStepSizeController):
        return StopStalledSteps(stepsize_controller)
    return stepsize_controller


def step_options(stepsize_controller, dt0, rtol, atol, dtype, span, norm=optx.rms_norm):
    """The step-size controller (default: `diffrax.PIDController(rtol, atol, norm)`) and
    `dt0`, with the numbers as arrays of `dtype`, `dt0` checked against the solve's
    `span = (t0, t1)` ([`check_first_step`][]). Python floats would be static arguments of
    the compiled solve: a sweep over `τ = dt0` or over tolerances would compile at every
    value."""
    given = stepsize_controller
    if stepsize_controller is None:
        check_tolerances(rtol, atol)
        stepsize_controller = diffrax.PIDController(
            rtol=jnp.asarray(rtol, dtype), atol=jnp.asarray(atol, dtype), norm=norm
        )
    if dt0 is None:
        return stepsize_controller, None
    dt0 = jnp.asarray(dt0, dtype)
    check_positive("dt0", dt0, "step")
    check_first_step(dt0, *span, given)
    return stepsize_controller, dt0


def stall_floor(t, t0, t1, xnp=jnp):
    """The shortest step `StopStalledSteps` lets an adaptive solve of `[t0, t1]` propose at
    `t`: `4 ε max(|t|, 10⁻³ |t1 − t0|)`, `ε` the machine epsilon of `t`'s dtype."""
    eps = xnp.finfo(xnp.result_type(t)).eps
    return 4 * eps * xnp.maximum(xnp.abs(t), 1e-3 * xnp.abs(t1 - t0))


def check_first_step(dt0, t0, t1, stepsize_controller) -> None:
    """`ValueError` where a concrete first step `dt0` of an adaptive solve (the default
    controller or an adaptive one) is not above `stall_floor` at `t0`: `StopStalledSteps`
    would stop the solve at once with `dt_min_reached`, blaming the model. Traced values,
    and `dt0` that are not positive finite scalars (`step_options` names those), pass."""
    adaptive = stepsize_controller is None or isinstance(
        stepsize_controller, diffrax.AbstractAdaptiveStepSizeController
    )
    if dt0 is None or not adaptive or not is_concrete(dt0, t0, t1) or np.ndim(dt0) != 0:
        return
    step = float(dt0)
    floor = float(stall_floor(np.asarray(t0), np.asarray(t0), np.asarray(t1), np))
    if np.isfinite(step) and 0 < step <= floor:
        raise ValueError(
            f"`dt0` = {step:.3g} is not above the shortest step an adaptive solve may propose, "
            f"4 ε max(|t0|, 10⁻³ |t1 − t0|) = {floor:.3g} (ε the machine epsilon of the "
            "times' dtype): the solve would stop at its first step as stalled "
            "(`dt_min_reached`). Pass a larger `dt0`, e.g. 1e-3 of the span, or leave it "
            "None (the controller then picks the first step)."
        )
