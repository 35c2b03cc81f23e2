"""The forward solve of [`jaxdae.ReverseSweepAdjoint`][]: diffrax's loop that also stores the
accepted steps, in one piece or, for long solves, in segments re-solved from checkpoints."""

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import _thresholds
from .._custom_types import Array
from ._controllers import jump_times
from ._restart import Restart, after_start
from ._solvers import AbstractSteppingWrapper
from ._term import AbstractTermWithVJP, terms_within


class TermsChecked(AbstractSteppingWrapper):
    """`solver`, given the terms that `diffeqsolve` has already checked against its
    `term_structure` and wrapped (`diffrax.WrapTerm`, for the direction of time): the
    adjoints' own solves (the forward pass that records the steps, a segment re-solved
    from its checkpoint) are `diffeqsolve`s of those terms, which check them again, and a
    solver that declares a term class (`jaxdae.Rodas5P`: `diffrax.ODETerm`;
    `jaxdae.GeneralizedAlpha`: the term of a system) would refuse the wrapper."""

    solver: diffrax.AbstractSolver
    term_structure: ClassVar = diffrax.AbstractTerm

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        return self.solver.step(terms, t0, t1, y0, args, solver_state, made_jump)


def unwrapped(solver):
    """The solver inside `solver`'s stepping wrappers."""
    while isinstance(solver, AbstractSteppingWrapper):
        solver = solver.solver
    return solver


def reads_solver_state(terms) -> bool:
    """Whether the stage VJP of the ODE term inside `terms` reads the final solver
    state (`AbstractTermWithVJP.reads_solver_state`)."""
    term = terms_within(terms)[0]
    return isinstance(term, AbstractTermWithVJP) and term.reads_solver_state


def warn_checkpointed(
    stepsize_controller, what: str, fix: str, adjoint: str = "GeneralizedAlphaAdjoint"
) -> None:
    """A `UserWarning` (when the solve is traced) that a solve with adaptive steps is
    differentiated through diffrax's loop with `CHECKPOINTS` checkpoints, whose gradient
    can differ from the solve's own (see [`jaxdae.GeneralizedAlphaAdjoint`][]); `adjoint`
    names the replaying adjoint that fell back. Fixed steps take no adaptive decision, and
    their gradient is the same through any number of checkpoints."""
    if isinstance(stepsize_controller, diffrax.ConstantStepSize | diffrax.StepTo):
        return
    warnings.warn(
        f"`jaxdae.{adjoint}` does not replay a solve with {what}: its gradient "
        f"is taken through diffrax's loop with {_thresholds.CHECKPOINTS} checkpoints, which "
        "recomputes the steps between checkpoints under step-size control in another "
        "compiled program. Rounding there can accept or size a step differently from the "
        "forward solve, and the gradient then differs from the solve's own by up to about "
        "the tolerance and changes with the number of checkpoints. For the solve's own "
        f"gradient, {fix}; or use fixed steps (`diffrax.ConstantStepSize()`); or pass "
        "`adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=max_steps)` (one "
        "checkpoint per step, memory in proportion to `max_steps`).",
        UserWarning,
        stacklevel=2,
    )


class SweepOptions(eqx.Module):
    """The non-differentiated arguments of the swept solve (`solve_storing_steps`, `_backward`): the
    solve's solver, step-size controller, event and progress meter as `diffeqsolve` gave
    them to the adjoint, its step limit, the segments' `(count, length)` (`segment_plan`), the
    solver's Butcher tableau (None for a solve replayed by its step function,
    `jaxdae.ReplayAdjoint`) and whether the final solver state is kept for the term's stage
    VJP (`reads_solver_state`). The solver, controller and
    event may hold arrays (a controller's tolerances): ordinary fields; the rest is
    static."""

    solver: diffrax.AbstractSolver
    stepsize_controller: diffrax.AbstractStepSizeController
    event: diffrax.Event | None
    progress_meter: diffrax.AbstractProgressMeter
    max_steps: int = eqx.field(static=True)
    segments: tuple[int, int] | None = eqx.field(static=True)
    tableau: diffrax.ButcherTableau | None
    keeps_solver_state: bool = eqx.field(static=True, default=False)


class SweepProblem(eqx.Module):
    """The differentiated arguments of the swept solve, as `diffeqsolve` gave them to the
    adjoint (times multiplied by the solve's direction, terms wrapped to match): the terms
    and `args`, the state it starts from (`init_state.y` is `y0`; the solver's and
    controller's states are constants of the gradient), the times and what to save. Also
    the cotangent of such a problem, where the times are None (no cotangent)."""

    terms: diffrax.AbstractTerm
    args: object
    init_state: eqx.Module
    t0: Array | None
    t1: Array | None
    dt0: Array | None
    saveat: diffrax.SaveAt


class _Output(eqx.Module):
    """What `diffrax.diffeqsolve` reads from the final state of a solve (`final_state`):
    each `SubSaveAt`'s saved times and states (in the order of `subsaves`), the result,
    the step counts (all, accepted, rejected), the event mask and, if saved, the solver
    state."""

    ts: list
    ys: list
    result: diffrax.RESULTS
    counts: tuple
    event_mask: object
    solver_state: object

    @classmethod
    def of(cls, state, saveat: diffrax.SaveAt) -> "_Output":
        """The output of diffrax's final `state`."""
        saves = _subsaves_def(saveat).flatten_up_to(state.save_state)
        return cls(
            ts=[s.ts for s in saves],
            ys=[s.ys for s in saves],
            result=state.result,
            counts=_counts(state.num_steps, state.num_accepted_steps, state.num_rejected_steps),
            event_mask=state.event_mask,
            solver_state=state.solver_state if saveat.solver_state else None,
        )


def _counts(*counts) -> tuple:
    """Step counts in diffrax's integer type."""
    return tuple(jnp.asarray(c, jnp.asarray(0).dtype) for c in counts)


def _subsaves_def(saveat: diffrax.SaveAt):
    """The pytree structure of `saveat.subs` down to its `SubSaveAt`s."""
    return jax.tree.structure(saveat.subs, is_leaf=lambda s: isinstance(s, diffrax.SubSaveAt))


def final_state(init_state, out: _Output, saveat: diffrax.SaveAt):
    """`init_state` with the fields that `diffeqsolve` reads after the solve loop set to
    `out`'s (a custom VJP's output: the result and counts without tangents, since JAX
    gives a custom VJP's integer outputs symbolic ones, which `diffeqsolve`'s `throw`
    check cannot take)."""
    out = jax.tree.map(lambda x: x if eqx.is_inexact_array(x) else jax.lax.stop_gradient(x), out)
    subs_def = _subsaves_def(saveat)
    save_state = subs_def.unflatten(
        [
            dataclasses.replace(s, ts=ts, ys=ys)
            for s, ts, ys in zip(
                subs_def.flatten_up_to(init_state.save_state), out.ts, out.ys, strict=True
            )
        ]
    )
    num_steps, num_accepted_steps, num_rejected_steps = out.counts
    return dataclasses.replace(
        init_state,
        save_state=save_state,
        result=out.result,
        num_steps=num_steps,
        num_accepted_steps=num_accepted_steps,
        num_rejected_steps=num_rejected_steps,
        event_mask=out.event_mask,
        solver_state=out.solver_state if saveat.solver_state else init_state.solver_state,
    )


class AbstractStoredStepsAdjoint(diffrax.AbstractAdjoint):
    """An adjoint whose backward pass keeps the states of at most `stored_steps` steps at
    once (a positive integer, refused with a named error otherwise)."""

    stored_steps: int = eqx.field(default=1024, static=True)

    def __check_init__(self):
        steps = self.stored_steps
        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
            raise ValueError(
                f"`{type(self).__name__}(stored_steps=...)` must be a positive "
                f"integer; got {steps!r}."
            )


def segment_plan(max_steps, stored_steps, stepsize_controller) -> tuple[int, int] | None:
    """`(count, length)` of the segments of a solve: one of `max_steps` if it may store them
    all. None for `StepTo`, which counts its steps in diffrax's loop: solved by diffrax's
    `SaveAt(steps=True)` instead.

    One segment is solved as several are, not by diffrax's `SaveAt(steps=True)`: that loop's
    state begins the gradient's program with many independent operations, and XLA's CPU
    runtime hands a program to its thread pool when more than 8 are ready at once, where its
    speed depends on what else runs. The segments' state keeps the program on the calling
    thread (`_solve_in_segments`; docs/design_measurements.md#calling-thread)."""
    if isinstance(stepsize_controller, diffrax.StepTo):
        return None
    count = -(-max_steps // stored_steps)
    return count, -(-max_steps // count)


def solve_storing_steps(problem, static):
    """The solve's output, and what the sweep reads: every accepted step's end time and
    state of the last segment, and each segment's start (`StepTo`: of the whole solve, by
    diffrax's `SaveAt(steps=True)`)."""
    if static.segments is not None:
        return _solve_in_segments(problem, static)
    output, (step_ts, step_ys, steps, solver_state) = solve_saving_steps(
        problem, static, SAVE_Y, static.keeps_solver_state
    )
    return output, (step_ts, step_ys, steps, solver_state if static.keeps_solver_state else None)


def solve_saving_steps(problem, static, fn, solver_state: bool):
    """diffrax's solve of `problem` (with `static`'s solver, controller, event and step
    limit) that also saves `fn(t, y, args)` at the end of every accepted step: the solve's
    output, and the steps' end times, saved values, number and (where `solver_state`) the
    final solver state."""
    saveat = problem.saveat
    out = diffrax.diffeqsolve(
        problem.terms,
        TermsChecked(static.solver),
        problem.t0,
        problem.t1,
        problem.dt0,
        problem.init_state.y,
        args=problem.args,
        saveat=diffrax.SaveAt(
            subs=[saveat.subs, diffrax.SubSaveAt(steps=True, fn=fn)],
            solver_state=saveat.solver_state or solver_state,
        ),
        stepsize_controller=static.stepsize_controller,
        event=static.event,
        max_steps=static.max_steps,
        adjoint=diffrax.RecursiveCheckpointAdjoint(),
        throw=False,
    )
    (ts_saved, step_ts), (ys_saved, step_ys) = out.ts, out.ys
    subs_def = _subsaves_def(saveat)
    output = _Output(
        ts=subs_def.flatten_up_to(ts_saved),
        ys=subs_def.flatten_up_to(ys_saved),
        result=out.result,
        counts=_counts(*(out.stats[k] for k in _COUNTS)),
        event_mask=out.event_mask,
        solver_state=out.solver_state if saveat.solver_state else None,
    )
    steps = out.stats["num_accepted_steps"]
    return output, (step_ts, step_ys, steps, out.solver_state if solver_state else None)


def times_perturbed(perturbed) -> bool:
    """Whether a swept solve's gradient is taken with respect to its times (`t0`, `t1`,
    `dt0`, the save times), which a replay of its steps holds constant."""
    return any(jax.tree.leaves((perturbed.t0, perturbed.t1, perturbed.dt0, perturbed.saveat)))


def _step_time(t, y, args):
    del y, args
    return t


def record_step_times(problem, static, solver_state: bool = False):
    """diffrax's solve of `problem` that also records the end time of every accepted step:
    its output, and the times (`max_steps` of them, inf after the last step), their number
    and (where `solver_state`) the final solver state."""
    output, (step_ts, _, steps, state) = solve_saving_steps(
        problem, static, _step_time, solver_state
    )
    return output, (step_ts, jnp.asarray(steps, jnp.int32), state)


class _RecordProposal(diffrax.AbstractStepSizeController):
    """`controller`, whose state also holds the end of the next step it proposes: a
    segment ends with it, and the next one starts from it (diffrax's `Solution` does not
    say it).

    Given `restart = (t_start, tnext, made_jump)`, a segment's start (`made_jump` None
    when the controller makes no jumps), the solve's first step ends at `t_start` and is
    kept (`Restart` makes it take no time). From there the solve goes on as from the
    step that ended at `t_start`: with the controller state given to `diffeqsolve`, its
    next step ending at `tnext`, and `made_jump`. (Not through `dt0`: diffrax would check
    its sign at run time, a branch and two host callbacks per solve.)"""

    controller: diffrax.AbstractStepSizeController
    restart: tuple | None = None

    def wrap(self, direction):
        return _RecordProposal(self.controller.wrap(direction), self.restart)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        if self.restart is not None:  # diffrax keeps the controller state it is given
            return self.restart[0], None
        tnext, state = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return tnext, (state, jnp.asarray(tnext, jnp.result_type(t0)))

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        keep, tprev, tnext, jump, state, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state[0]
        )
        state = (state, jnp.asarray(tnext, jnp.result_type(t1)))
        if self.restart is None:
            return keep, tprev, tnext, jump, state, result
        t_start, t_proposed, made_jump = self.restart
        restarting = t1 <= t_start
        pick = lambda new, old: jnp.where(restarting, old, new)  # noqa: E731
        return (
            keep | restarting,
            pick(tprev, t_start),
            pick(tnext, t_proposed),
            jump if made_jump is None else pick(jump, made_jump),
            jax.tree.map(pick, state, controller_state),
            diffrax.RESULTS.where(restarting, diffrax.RESULTS.successful, result),
        )


def solve_segment(start, problem, static, save_ts=(), event=None):
    """At most one segment's length of steps from `start`, saving each step, the end (and
    the solver's and controller's states there) and each of `save_ts` (those before the
    start at the start). The solve runs from `t0`, the whole solve's start, restarting at
    `start` (`Restart`); its first saved step is that start, and its counts include it."""
    t, y, solver_state, controller_state, made_jump = start
    subs = [diffrax.SubSaveAt(ts=ts) for ts in save_ts]
    subs = subs + [diffrax.SubSaveAt(t1=True), diffrax.SubSaveAt(steps=True)]
    if event is not None:
        event = eqx.tree_at(
            lambda e: e.cond_fn,
            event,
            jax.tree.map(
                lambda fn: eqx.Partial(after_start, fn, t), event.cond_fn, is_leaf=callable
            ),
        )
    restart = t, controller_state[1], made_jump if _jumps(static) else None
    return diffrax.diffeqsolve(
        problem.terms,
        Restart(TermsChecked(static.solver), t),
        problem.t0,
        problem.t1,
        None,
        y,
        args=problem.args,
        saveat=diffrax.SaveAt(subs=subs, solver_state=True, controller_state=True, made_jump=True),
        stepsize_controller=_RecordProposal(static.stepsize_controller, restart),
        event=event,
        max_steps=static.segments[1] + 1,
        solver_state=solver_state,
        controller_state=controller_state,
        adjoint=diffrax.RecursiveCheckpointAdjoint(),
        throw=False,
    )


def _jumps(static) -> bool:
    """Whether the controller steps across discontinuities (the solver then re-evaluates a
    step's first stage); if not, diffrax resolves `made_jump` when tracing."""
    return jump_times(static.stepsize_controller) is not None


def _solve_in_segments(problem, static):
    """`solve_storing_steps` in segments: one `diffrax.diffeqsolve` per segment, each from where the
    last stopped (after a segment's length of steps), until the solve ends or `max_steps`. Keeps
    every segment's start and the last segment's steps."""
    count, length = static.segments
    event, init, t0 = static.event, problem.init_state, problem.t0
    y0 = init.y
    dtype = jnp.result_type(t0)
    # The start as `diffeqsolve` made it, `(t, y, solver state, controller state, made
    # jump)`; the controller's state holds its proposed step end too (`_RecordProposal`).
    start = (
        t0,
        y0,
        init.solver_state,
        (init.controller_state, jnp.asarray(init.tnext, dtype)),
        jnp.asarray(init.made_jump),
    )
    save_ts = [sub.ts for sub in subsaves(problem.saveat) if sub.ts is not None]
    # The starts as rows of one array (leaves in their common dtype: flags and small counters
    # convert exactly), not one array per leaf. Each leaf's initial value and copy would be an
    # independent operation at the top of the gradient's program; with more than 8 ready at
    # once XLA's CPU runtime runs the program on its thread pool, where it waits for threads
    # that other work keeps busy. One flat array keeps it on the calling thread
    # (docs/design_measurements.md#calling-thread).
    start, unravel_start = ravel_pytree(start)
    starts = jnp.zeros((count + 1,) + start.shape, start.dtype).at[0].set(start)
    inf = lambda rows, y: jnp.full(rows + jnp.shape(y), jnp.inf, jnp.result_type(y))  # noqa: E731
    # What the loop carries besides the starts and the current one (the solve's end, after
    # the loop): the last segment's steps, saves at `ts`, result and event mask, and the
    # step counts of all segments. The result and mask start as `diffeqsolve` left them
    # at `t0`: a flag already raised there ends the solve before its first step, as in
    # diffrax's own loop (a segment does not evaluate a flag at its start: `after_start`).
    last = dict(
        step_ts=jnp.full(length, jnp.inf, dtype),
        step_ys=jax.tree.map(lambda y: inf((length,), y), y0),
        result=init.result,
        event_mask=None
        if event is None
        else jax.tree.map(lambda mask: jnp.asarray(mask, bool), init.event_mask),
        steps=jnp.zeros((), jnp.int32),
    )
    saved = [
        (jnp.full(ts.shape, jnp.inf, dtype), jax.tree.map(functools.partial(inf, ts.shape), y0))
        for ts in save_ts
    ]
    counts = jnp.zeros(3, int)  # steps, accepted, rejected (diffrax's integer type)

    def going_on(carry):
        index, _, _, last, _, _ = carry
        return (index < count) & (
            ((index == 0) & (last["result"] == diffrax.RESULTS.successful))
            | (last["result"] == diffrax.RESULTS.max_steps_reached)
        )

    def segment(carry):
        index, starts, flat_start, _, saved, counts = carry
        start = unravel_start(flat_start)
        out = solve_segment(start, problem, static, save_ts, event)
        *at_ts, t_end, _ = out.ts
        *ys_at_ts, y_end, _ = out.ys  # the end (`SubSaveAt(t1=True)`), saved as (1, ...)
        step_ts, step_ys, steps = accepted_steps(out)
        end = (
            t_end[0],
            jax.tree.map(lambda y: y[0], y_end),
            out.solver_state,
            out.controller_state,
            out.made_jump,
        )
        end = ravel_pytree(end)[0]
        starts = starts.at[index + 1].set(end)
        # A save time at or before the start was an earlier segment's.
        saved = [
            _new_saves(old, (ts_k, ys_k), ts, (ts > start[0]) | (index == 0))
            for old, ts_k, ys_k, ts in zip(saved, at_ts, ys_at_ts, save_ts, strict=True)
        ]
        # Less the restart, a step taken and accepted.
        counts = (
            counts
            + jnp.stack([out.stats[k] for k in _COUNTS]).astype(counts.dtype)
            - jnp.array([1, 1, 0], counts.dtype)
        )
        last = dict(
            step_ts=step_ts,
            step_ys=step_ys,
            result=out.result,
            event_mask=out.event_mask,
            steps=steps,
        )
        return index + 1, starts, end, last, saved, counts

    index, starts, end, last, saved, counts = jax.lax.while_loop(
        going_on, segment, (jnp.zeros((), jnp.int32), starts, start, last, saved, counts)
    )
    t_end, y_end, solver_state = unravel_start(end)[:3]
    end = t_end[None], jax.tree.map(lambda y: y[None], y_end)
    start = jnp.reshape(t0, (1,)).astype(dtype), jax.tree.map(lambda y: y[None], y0)
    saved = iter(saved)
    ts_out, ys_out = [], []
    for sub in subsaves(problem.saveat):  # rows as diffrax orders them: t0, ts, t1
        rows = (
            ([start] if sub.t0 else [])
            + ([next(saved)] if sub.ts is not None else [])
            + ([end] if sub.t1 else [])
        )
        ts_out.append(rows[0][0] if len(rows) == 1 else jnp.concatenate([r[0] for r in rows]))
        ys_out.append(
            rows[0][1]
            if len(rows) == 1
            else jax.tree.map(lambda *ys: jnp.concatenate(ys), *[r[1] for r in rows])
        )
    out = _Output(
        ts=ts_out,
        ys=ys_out,
        result=last["result"],
        counts=_counts(*counts),
        event_mask=last["event_mask"],
        solver_state=solver_state if problem.saveat.solver_state else None,
    )
    return out, (last["step_ts"], last["step_ys"], last["steps"], starts, index, unravel_start)


def _new_saves(saved, new, ts, after_start):
    """The saves `(times, states)` at `ts` so far, updated with a segment's `new` ones
    (those `after_start` and reached)."""
    take = jnp.isfinite(new[0]) & after_start
    return (
        jnp.where(take, new[0], saved[0]),
        jax.tree.map(
            lambda old, y: jnp.where(take.reshape((-1,) + (1,) * (y.ndim - 1)), y, old),
            saved[1],
            new[1],
        ),
    )


_COUNTS = ("num_steps", "num_accepted_steps", "num_rejected_steps")


class LoopVJP(eqx.Module):
    """The vector–Jacobian product of the solve through diffrax's loop, and the solve's
    output (for gradients with respect to the times)."""

    pull: Callable
    out: _Output

    @classmethod
    def of(cls, problem, static) -> tuple[_Output, "LoopVJP"]:
        """The output of `loop_solve` and its vector–Jacobian product."""
        out, pull = eqx.filter_vjp(lambda problem: loop_solve(problem, static), problem)
        return out, cls(pull, out)

    def __call__(self, out_bar):
        """The cotangent of the problem from that of the output `out_bar` (zeros where
        it is symbolic)."""
        bar = jax.tree.map(
            lambda b, x: (
                (jnp.zeros_like(x) if b is None else b) if eqx.is_inexact_array(x) else None
            ),
            out_bar,
            self.out,
            is_leaf=is_none,
        )
        (problem_bar,) = self.pull(bar)
        return problem_bar


def loop_solve(problem, static) -> _Output:
    """The solve by diffrax's loop (differentiated through, if at all)."""
    final_state, _ = diffrax.RecursiveCheckpointAdjoint(checkpoints=_thresholds.CHECKPOINTS).loop(
        args=problem.args,
        terms=problem.terms,
        solver=static.solver,
        stepsize_controller=static.stepsize_controller,
        event=static.event,
        saveat=problem.saveat,
        t0=problem.t0,
        t1=problem.t1,
        dt0=problem.dt0,
        max_steps=static.max_steps,
        throw=False,
        init_state=problem.init_state,
        passed_solver_state=False,
        passed_controller_state=False,
        progress_meter=static.progress_meter,
    )
    return _Output.of(final_state, problem.saveat)


def typed_literal_as_array(x):
    """A constant that JAX hands to a backward pass as a typed Python scalar (a gain built
    from a Python float inside the caller's `jit`) as the array it was in the forward pass:
    a backward pass that calls the model and formulation with it (the re-solve, the
    diagnostics' product) needs their array methods."""
    if isinstance(x, (int, float, complex)) and not isinstance(x, bool) and hasattr(x, "aval"):
        return jnp.asarray(x, x.dtype)
    return x


def is_none(x) -> bool:
    return x is None


def nones(tree):
    """`tree` with None for every leaf: no cotangent."""
    return jax.tree.map(lambda _: None, tree)


def saves_by_step(step_ts, save_ts):
    """Where the saves at `save_ts` (sorted) fall among the steps ending at `step_ts`:
    the saves inside step `k` (the first step ending at or after each save time; diffrax
    fills the times of steps not taken with inf) are `first[k] … first[k + 1] − 1`.
    Found once, so that a backward pass's step reads its range rather than searching."""
    save_step = jnp.searchsorted(step_ts, save_ts, side="left")
    return jnp.searchsorted(save_step, jnp.arange(step_ts.shape[0] + 1), side="left")


def where_taken(taken, new, old):
    """`new` where the step was `taken`, else `old`: the carry of a backward loop that runs
    to the largest step count of a batch, for the members whose own count is smaller
    (docs/design_measurements.md#adjoints-under-vmap)."""
    return jax.tree.map(lambda a, b: jnp.where(taken, a, b), new, old)


SAVE_Y = diffrax.SubSaveAt(t1=True).fn  # a `SubSaveAt`'s default `fn`: the state itself


def subsaves(saveat: diffrax.SaveAt) -> list:
    """The `SubSaveAt`s of `saveat`, in the order of its pytree."""
    return jax.tree.leaves(saveat.subs, is_leaf=lambda s: isinstance(s, diffrax.SubSaveAt))


def accepted_steps(out):
    """The accepted steps' end times and states, and their number, of a `solve_segment` (its
    restart, saved first, left out)."""
    return (
        out.ts[-1][1:],
        jax.tree.map(lambda y: y[1:], out.ys[-1]),
        jnp.asarray(out.stats["num_accepted_steps"], jnp.int32) - 1,
    )
