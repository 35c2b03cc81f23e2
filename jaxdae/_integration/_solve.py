"""The one diffrax solve of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
[`jaxdae.simulate_actuated`][] (with the times and options that the problem stage
resolves, `Times` and `SolveOptions`): `integrate` of a `Dynamics` (`_term.py`), and the
conditions that stop it with the results they name (`solve_event`, `event_result`, a
stalled step: `StopStalledSteps`; the formulation's failure test read from the rates of
each step's last stage: `StopAtFailure`; an event-driven stretch's gaps' condition read
there too, its crossing located after the solve: `StopAtCrossing`, `located_crossing`)."""

import functools
from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

from .._compilation._private_apis import diffeqsolve_unjitted, unvmap_any
from .._custom_types import Array
from .._solution import RESULTS
from ._controllers import AbstractControllerWrapper
from ._crossing import DownCrossing
from ._problem import SolveOptions, Times
from ._restart import (
    STAGE_LOOP_KINDS,
    flag_after_start,
    started_at,
    value_after_start,
    with_stage_loop,
)
from ._solvers import AbstractSteppingWrapper, UnrolledERK
from ._term import (
    AbstractSystemTerm,
    AbstractTimeTerm,
    Dynamics,
    failure_condition,
    replace_system_term,
    system_term,
)


def save_at(t0, t1, ts, stepsize_controller) -> diffrax.SaveAt:
    """What `simulate` and `simulate_actuated` ask diffrax to save: `t0` and `t1` without
    `ts`; else `ts` (read back with `saved_times`) and `t1`.

    Without `ts` the states at t0 and t1 are saved directly: an interpolated
    `SubSaveAt(ts=[t0, t1])` would cost a search of the save times at every step for the
    same values (docs/design_measurements.md#saving-the-ends).

    With `ts` and fixed steps, each save time is moved 8 ulps (of max(|t0|, |ts[i]|))
    earlier. diffrax saves `ts[i]` in the step whose end reaches it, and
    `RecursiveCheckpointAdjoint` recomputes the steps in its reverse pass. When `ts[i]` lies
    within rounding of a step's end (fixed steps on the save grid, e.g.
    `ts = linspace(0, 1.5, 31)` with `dt0 = 0.01`), the recomputation can round that end the
    other way (`t0 + (t1 − t0)·k/N` compiled with and without a fused multiply-add: at most
    2 ulps apart) and save `ts[i]` in the neighbouring step; that row's cotangent is then
    counted twice or lost, a gradient off by percents with no error. Moved earlier, every
    save time lies inside one step. Adaptive steps end on a save time only by chance, so
    their save times are not moved.
    """
    if ts is None:
        return diffrax.SaveAt(t0=True, t1=True)
    if isinstance(stepsize_controller, diffrax.ConstantStepSize):
        ulps = 8 * jnp.finfo(ts.dtype).eps * jnp.maximum(jnp.abs(ts), jnp.abs(t0))
        ts = jnp.maximum(ts - ulps, t0)
    return diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)])


def integrate(
    dynamics: Dynamics,
    y0,
    times: Times,
    options: SolveOptions,
    saveat: diffrax.SaveAt | None = None,
    start: Array | None = None,
) -> tuple[diffrax.Solution, RESULTS]:
    """The one diffrax solve of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][]: of `dynamics.term` from `y0` over `times` with
    `options`, saving as `save_at` says, stopped by `dynamics.conditions` (and a non-finite
    state under fixed steps, `solve_event`), at the located crossing of `dynamics.located`
    (read from the steps' last stages where `locates_in_steps`, else a `diffrax.Event`'s
    root finder's) and by a stalled step (`stop_stalled_steps`).
    Returns diffrax's solution and jaxdae's result: the failure that stopped it named by its
    condition (`event_result`; the solver's own failures are named by the outcome,
    `_outcome.name_result`).

    Given `start` (a time in `(t0, t1]`, with an adaptive controller), the solve starts
    there and takes the steps of a solve from `start`, run from the constant `t0` before it
    (`_restart.py`: `times.t0` a constant keeps diffrax's arithmetic on the times constant)."""
    solver, controller = options.solver, options.stepsize_controller
    t0, t1, ts = times.t0, times.t1, times.ts
    conditions, located = list(dynamics.conditions), list(dynamics.located)
    failures = list(dynamics.failures)
    # (Not for an adjoint that sets the stages' loop of the solver it sees, which would then
    # be the wrapper: forward mode could not differentiate the wrapped solver's loop.)
    tested_in_steps = (
        start is None
        and not isinstance(options.adjoint, tuple(adjoint for adjoint, _ in STAGE_LOOP_KINDS))
        and tests_failure_in_steps(dynamics, solver)
    )
    if tested_in_steps:
        solver, conditions = StopAtFailure(solver), [failure_at_start]
    last_stage = locates_in_steps(dynamics, solver, options.adjoint)
    if saveat is None:
        saveat = save_at(t0, t1, ts, controller)
    if dynamics.saves_solver_state or last_stage is not None:
        saveat = eqx.tree_at(lambda s: s.solver_state, saveat, True)
    if start is not None:
        solver, controller = started_at(solver, controller, options.adjoint, start)
        conditions = [eqx.Partial(flag_after_start, fn, start) for fn in conditions]
        located = [eqx.Partial(value_after_start, fn, start) for fn in located]
    if last_stage is not None:
        if start is None:
            solver = with_stage_loop(solver, options.adjoint)
        solver = StopAtCrossing(solver, last_stage, located[0])
    event = solve_event(
        conditions,
        controller,
        [] if last_stage is not None else located,
        jnp.result_type(t0),
        start,
    )
    controller = stop_stalled_steps(controller)
    # Unjitted: `integrate` is always traced inside a jit (`diffeqsolve_unjitted`).
    out = diffeqsolve_unjitted(
        dynamics.term,
        solver,
        t0,
        t1,
        options.dt0,
        y0,
        args=None,
        saveat=saveat,
        stepsize_controller=controller,
        adjoint=options.adjoint,
        event=event,
        max_steps=options.max_steps,
        throw=False,
    )
    if last_stage is not None:
        out = located_crossing(out, solver, located[0], dynamics.term, saveat, start)
    result = event_result(out, failures, len(located))
    if tested_in_steps:
        result = RESULTS.where(out.result == STEP_FAILURE, failures[0], result)
    return out, result


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


def non_finite_event(t, y, args, **kwargs):
    """Stops a fixed-step solve whose state overflowed (adaptive controllers reject such
    steps instead)."""
    return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(y)]))


def solve_event(
    conditions: list, stepsize_controller, located: list | None = None, dtype=float, start=None
) -> diffrax.Event | None:
    """The failure conditions of a solve (flags that stop it at the end of the step where one
    turns true), plus `non_finite_event` for fixed steps, after the `located` ones:
    real-valued conditions whose downcrossings of zero stop the solve at the crossing,
    located by a root finder to a few ulps (of `dtype`, the time's) of the time, not before
    `start` (a solve that starts there, `_restart.py`)."""
    if isinstance(stepsize_controller, diffrax.ConstantStepSize):
        conditions = conditions + [non_finite_event]
    located = located or []
    if not located:
        return diffrax.Event(conditions) if conditions else None
    # With a root finder too, diffrax stops at the end of the step where a flag turned
    # true: its root finder puts the distance to the step's end in the flag's place, so
    # the compiled root finder does not evaluate the flag (the failure tests recompute the
    # model's terms). That distance has the time's dtype and sits beside a Python `0.0` in
    # a `lax.cond`: a float32 solve under float64 mode fails to trace. There a flag
    # becomes `±1` in the default float dtype, a condition like the others (located where
    # it turns true, and evaluated at every iteration of the root finder).
    if jnp.dtype(dtype) != jnp.result_type(float):
        conditions = [_signed(condition) for condition in conditions]
    tolerance = float(64 * jnp.finfo(dtype).eps)
    return diffrax.Event(
        located + conditions,
        DownCrossing(tolerance, tolerance, start),
        direction=[False] * len(located) + [None] * len(conditions),
    )


def _signed(flag):
    def condition(t, y, args, **kwargs):
        return jnp.where(flag(t, y, args, **kwargs), -1.0, 1.0).astype(jnp.result_type(float))

    return condition


def event_result(out: diffrax.Solution, failures: list, located: int = 0) -> RESULTS:
    """jaxdae's result of a solve with `solve_event`: the failure named by the condition
    that stopped it (`failures[i]` for the i-th condition after the `located` ones),
    `non_finite_state` for the appended non-finite condition; a located condition leaves
    diffrax's `event_occurred`."""
    result = RESULTS.promote(out.result)
    if out.event_mask is None:
        return result
    names = failures + [RESULTS.non_finite_state]
    for stopped, name in zip(out.event_mask[located:], names, strict=False):
        result = RESULTS.where(
            (out.result == diffrax.RESULTS.event_occurred) & stopped, name, result
        )
    return result


# -- the failure test read from the rates of each step's last stage ------------------------
#
# A formulation that solves for exact multipliers cannot continue where `G M⁻¹ Gᵀ` turns
# singular, and its test reads the pivots of the factorization that its rates solve with.
# As a `diffrax.Event` condition it is evaluated after every accepted step: the terms and
# the factorization once more per step, beside the rates of the step's stages. A
# first-same-as-last explicit Runge–Kutta solver (`diffrax.Tsit5`, `Dopri5`, `Bosh3`)
# already evaluates the rates at the step's end, as its last stage, and keeps them in its
# solver state for the next step: `StopAtFailure` hands it a term whose vector field is the
# rates and the test together (`AbstractSystemTerm.rates_and_failure`, one evaluation of the
# terms and the factorization) and reads the test from the kept stage
# (docs/design_measurements.md#failure-in-steps).

# The diffrax result with which `StopAtFailure` ends a solve at a failed test (keeping the
# step, as the event does), named by `integrate`: an explicit Runge–Kutta step reports no
# singular linear solve of its own.
STEP_FAILURE = diffrax.RESULTS.singular


@functools.singledispatch
def last_stage_in_state(solver: diffrax.AbstractSolver) -> Callable[[Any], Any] | None:
    """How `solver` keeps the vector field of its last stage (at the step's end: first same
    as last) in its solver state: a function from the solver state to it, or None where it
    does not keep it.

    A solve with such a solver reads an exact-multiplier formulation's failure test from
    that stage: its term's vector field then returns the rates and the test's flag, and a
    flag true at a step's last stage ends the solve there. Dispatched on the solver's class
    (`functools.singledispatch`); registered for diffrax's explicit Runge–Kutta solvers and
    [`jaxdae.UnrolledERK`][] with a first-same-as-last tableau. A solver of one's own that
    keeps its last stage registers where:

    ```python
    jaxdae.extend.last_stage_in_state.register(MySolver, lambda solver: lambda state: state[1])
    ```
    """
    del solver
    return None


@last_stage_in_state.register
def _(solver: diffrax.AbstractERK):
    tableau = solver.tableau
    if isinstance(tableau, diffrax.ButcherTableau) and tableau.fsal:
        return lambda state: state[1]  # diffrax's `(first_step, f0)`
    return None


@last_stage_in_state.register
def _(solver: UnrolledERK):
    return (lambda state: state) if solver.solver.tableau.fsal else None


def tests_failure_in_steps(dynamics: Dynamics, solver: diffrax.AbstractSolver) -> bool:
    """Whether the one condition of `dynamics` is its term's failure test
    (`failure_condition`), which the term computes with its rates
    (`computes_failure_with_rates`, for a formulation that `shares_failure_with_accelerations`)
    and `solver` keeps its last stage (`last_stage_in_state`): then `StopAtFailure` tests it,
    and `failure_at_start` at the start."""
    term = dynamics.term
    return (
        dynamics.conditions == (failure_condition,)
        and not dynamics.located
        and isinstance(term, AbstractSystemTerm)
        and term.computes_failure_with_rates
        and term.formulation.shares_failure_with_accelerations
        and last_stage_in_state(solver) is not None
    )


class LastStageTerm(AbstractTimeTerm):
    """The system's term whose vector field also returns a value that the solve reads from
    the last stage of each step: `with_rates(term, t, y, args)` is `(rates, value)`
    (`rates_with_failure`, `rates_with_located`); its product with the control is the
    rates'."""

    term: AbstractSystemTerm
    with_rates: Callable = eqx.field(static=True)

    def vf(self, t, y, args):
        return self.with_rates(self.term, t, y, args)

    def prod(self, vf, control):
        return self.term.prod(vf[0], control)


def rates_with_failure(term: AbstractSystemTerm, t, y, args):
    return term.rates_and_failure(t, y, args)


def rates_with_located(term: AbstractSystemTerm, t, y, args):
    return term.rates_and_located(t, y, args)


class StopAtFailure(AbstractSteppingWrapper):
    """Ends the solve of the wrapped first-same-as-last explicit Runge–Kutta `solver` with
    `STEP_FAILURE` at the end of the first kept step where the formulation's failure test
    (a flag) is true, as a `diffrax.Event` condition after each step would: the flag comes
    with the rates of the step's last stage (`rates_with_failure`). A flag already true at
    the start is `failure_at_start`'s to report (an event before any step)."""

    solver: diffrax.AbstractSolver

    def _terms(self, terms):
        return replace_system_term(terms, lambda x: LastStageTerm(x, rates_with_failure))

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(self._terms(terms), t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            self._terms(terms), t0, t1, y0, args, solver_state, made_jump
        )
        last_stage = last_stage_in_state(self.solver)
        assert last_stage is not None
        _, failed = last_stage(solver_state)
        result = diffrax.RESULTS.where(
            (failed > 0) & (result == diffrax.RESULTS.successful), STEP_FAILURE, result
        )
        return y1, y_error, dense_info, solver_state, result


def failure_at_start(t, y, args, *, terms, t0=None, **kwargs):
    """The failure test as a `diffrax.Event` condition at the solve's start only (diffrax
    evaluates its conditions there with `t` its `t0`, the same array); after each step
    `StopAtFailure` tests it."""
    del args, kwargs
    if t is not t0:
        return jnp.array(False)
    return system_term(terms).failure(t, y)


# -- the located condition read from the rates of each step's last stage -------------------
#
# An event-driven solve stops where its located condition (the least of its gaps'
# conditions, with the resting contacts' forces) crosses zero downwards. As a
# `diffrax.Event` condition it is evaluated after every accepted step: the terms and the
# contact problem once more per step, and compiled once more beside the stages' rates. A
# first-same-as-last explicit Runge–Kutta solver already evaluates the rates at the step's
# end: there the term computes the condition with them (`rates_with_located`),
# `StopAtCrossing` ends the solve at the step where it crosses, and `located_crossing`
# locates the crossing on that step's interpolation, as diffrax's event does
# (docs/design_measurements.md#crossings-in-steps).

# The adjoints that differentiate diffrax's own loop, and with it the crossing's location;
# jaxdae's stored-steps adjoints differentiate the location of a `diffrax.Event`'s.
_LOOP_ADJOINTS = (diffrax.RecursiveCheckpointAdjoint, diffrax.DirectAdjoint, diffrax.ForwardMode)


def locates_in_steps(dynamics: Dynamics, solver, adjoint) -> Callable[[Any], Any] | None:
    """How `solver` keeps its last stage (`last_stage_in_state`) where the solve of
    `dynamics` reads its one located condition from there (`StopAtCrossing`): the term
    `computes_located_with_rates`, `solver` keeps its last stage and `adjoint`
    differentiates diffrax's loop; else None."""
    term = dynamics.term
    if not (
        len(dynamics.located) == 1
        and isinstance(term, AbstractSystemTerm)
        and term.computes_located_with_rates
        and isinstance(adjoint, _LOOP_ADJOINTS)
    ):
        return None
    return last_stage_in_state(solver)


# The diffrax result with which `StopAtCrossing` ends a solve at a crossing, until
# `located_crossing` turns it into `event_occurred`: an explicit Runge–Kutta step reports no
# stagnation of its own, and a result that is not an event's keeps the stepsize
# controller from overriding it (a step limited to a gap's approach stalls past it).
STEP_CROSSING = diffrax.RESULTS.stagnation


class _CrossingState(eqx.Module):
    # The wrapped solver's state; the located condition at the last kept step's end (at the
    # start: `condition`'s); that step's ends and dense output; whether the condition crossed
    # zero downwards in it.
    inner: Any
    value: Array
    t0: Array
    t1: Array
    dense: Any
    crossed: Array


class StopAtCrossing(AbstractSteppingWrapper):
    """Ends the solve of the wrapped first-same-as-last explicit Runge–Kutta `solver` with
    `STEP_CROSSING` at the end of the first kept step where the located
    condition crosses zero downwards (positive at the step's start, at or below zero at its
    end), as a `diffrax.Event` with a root finder would stop it: the condition comes with the
    rates of the step's last stage (`rates_with_located`; `last_stage` reads that stage from
    the solver state). Its state keeps the step and its dense output for
    `located_crossing`."""

    solver: diffrax.AbstractSolver
    last_stage: Callable[[Any], Any] = eqx.field(static=True)
    # The located condition as a `diffrax.Event` condition, evaluated at the start (as
    # diffrax evaluates its conditions there: with `t` its `t0`).
    condition: Callable

    def _terms(self, terms):
        return replace_system_term(terms, lambda x: LastStageTerm(x, rates_with_located))

    def init(self, terms, t0, t1, y0, args):
        value = self.condition(t0, y0, args, terms=terms, t0=t0)
        terms = self._terms(terms)
        inner = self.solver.init(terms, t0, t1, y0, args)
        dense = eqx.filter_eval_shape(self.solver.step, terms, t0, t1, y0, args, inner, False)[2]
        t0 = jnp.asarray(t0)
        _, stage_value = eqx.filter_eval_shape(self.last_stage, inner)
        return _CrossingState(
            inner,
            jnp.asarray(value, stage_value.dtype),
            t0,
            t0,
            jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), dense),
            jnp.asarray(False),
        )

    def step(self, terms, t0, t1, y0, args, solver_state: _CrossingState, made_jump):
        y1, y_error, dense, inner, result = self.solver.step(
            self._terms(terms), t0, t1, y0, args, solver_state.inner, made_jump
        )
        _, value = self.last_stage(inner)
        crossed = (solver_state.value > 0) & (value <= 0) & (result == diffrax.RESULTS.successful)
        result = diffrax.RESULTS.where(crossed, STEP_CROSSING, result)
        dtype = solver_state.t0.dtype
        state = _CrossingState(
            inner, value, jnp.asarray(t0, dtype), jnp.asarray(t1, dtype), dense, crossed
        )
        return y1, y_error, dense, state, result


def located_crossing(
    out: diffrax.Solution, solver: StopAtCrossing, condition, terms, saveat, start=None
) -> diffrax.Solution:
    """`out`, of a solve that `StopAtCrossing` stopped, as diffrax's event with a root finder
    leaves it: the crossing of `condition` located on the last step's interpolation by
    `DownCrossing` (to a few ulps of the time, not before `start`), its time and state in
    place of the end that `saveat` saves last (`t1`), and the event mask with the located
    condition first (the flags of diffrax's own event after it, false where it crossed)."""
    state: _CrossingState = out.solver_state
    # (A crossing ends the solve: the last kept step is the one that crossed.)
    crossed = state.crossed
    subs = saveat.subs
    many = isinstance(subs, list | tuple)
    last = subs[-1] if many else subs
    assert last.t1 and last.ts is None and not last.t0 and not last.steps
    end = (lambda o: o[-1]) if many else (lambda o: o)  # noqa: E731
    t_end = end(out.ts)[0]
    y_end = jax.tree.map(lambda x: x[0], end(out.ys))
    dtype = jnp.result_type(t_end)

    def locate():
        interpolation = solver.interpolation_cls(t0=state.t0, t1=state.t1, **state.dense)

        def value(t, _):
            # (Where it did not cross, in a batch: a root at the step's end.)
            located = condition(t, interpolation.evaluate(t), None, terms=terms)
            return jnp.where(crossed, located, state.t1 - t)

        tolerance = float(64 * jnp.finfo(dtype).eps)
        root = optx.root_find(
            value,
            DownCrossing(tolerance, tolerance, start),
            y0=state.t1,
            options={"lower": state.t0, "upper": state.t1},
            throw=False,
        )
        return root.value, interpolation.evaluate(root.value), root.result

    t, y, found = jax.lax.cond(
        unvmap_any(crossed), locate, lambda: (state.t1, y_end, optx.RESULTS.successful)
    )
    t = jnp.where(crossed, t, t_end)
    y = jax.tree.map(lambda a, b: jnp.where(crossed, a, b), y, y_end)
    flags = [] if out.event_mask is None else [m & ~crossed for m in out.event_mask]
    result = diffrax.RESULTS.where(
        crossed,
        diffrax.RESULTS.where(
            found == optx.RESULTS.successful,
            diffrax.RESULTS.event_occurred,
            diffrax.RESULTS.promote(found),
        ),
        out.result,
    )
    return eqx.tree_at(
        lambda o: (end(o.ts), end(o.ys), o.event_mask, o.result),
        out,
        (t[None], jax.tree.map(lambda x: x[None], y), [crossed, *flags], result),
        is_leaf=lambda x: x is None,
    )
