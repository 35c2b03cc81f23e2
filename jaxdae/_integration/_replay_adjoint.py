"""Gradients of a solve by the reverse-mode derivative of its solver's step, applied to the
accepted steps from the last to the first, each replayed at the time the forward solve
recorded ([`jaxdae.ReplayAdjoint`][]).

Differentiating diffrax's loop (`diffrax.RecursiveCheckpointAdjoint`) recomputes the steps
between its checkpoints in the backward pass under step-size control, in another compiled
program: rounding there can change an adaptive decision (a step accepted or rejected, its
next size), the recomputed steps are then not the forward solve's, and the gradient depends
on the number of checkpoints. Replayed at the recorded times, with no step-size control,
every step is the forward solve's own to rounding.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .. import _thresholds
from .._compilation._batching import batched_like
from .._compilation._linalg import full_precision
from .._compilation._private_apis import unvmap_any, unvmap_max
from .._custom_types import Array
from ._controllers import jump_times
from ._solvers import AbstractSteppingWrapper
from ._step_adjoints import reuses_outputs, step_vjp
from ._sweep_backward import saves_bar
from ._sweep_forward import (
    SAVE_Y,
    AbstractStoredStepsAdjoint,
    LoopVJP,
    SweepOptions,
    SweepProblem,
    final_state,
    loop_solve,
    nones,
    record_step_times,
    saves_by_step,
    subsaves,
    times_perturbed,
    typed_literal_as_array,
    warn_checkpointed,
    where_taken,
)


class ReplayAdjoint(AbstractStoredStepsAdjoint):
    """Differentiates a solve by the reverse-mode derivative of its solver's own step
    function, applied to the accepted steps from the last to the first: the gradient of
    the discrete map that the forward solve computed, with its step sizes held constant.
    A `diffrax.AbstractAdjoint`: pass it to `simulate` or to `diffrax.diffeqsolve` as
    `adjoint=`.

    The forward solve is diffrax's loop, which also records the end time of every accepted
    step. The backward pass replays the steps at those times (`solver.step(terms, tₖ,
    tₖ₊₁, yₖ, args, …)`, no step-size control) and pulls the cotangents of each step's end
    state and solver state, and of the states saved inside it through its dense output,
    back to its start and to the parameters (`jax.vjp` of the step, or a derivative
    written for the solver's class: [`jaxdae.Rodas5P`][]'s discrete adjoint of its stages
    from `ROSENBROCK_ADJOINT_MIN` states, the written-out adjoint of diffrax's ESDIRK
    steps; a root found inside the step, as in diffrax's implicit Runge–Kutta methods, is
    differentiated by optimistix's implicit-function rule, not through its iterations).
    The step sizes are constants of the gradient, as diffrax's step-size controllers
    make them, so the gradient is that of `diffrax.RecursiveCheckpointAdjoint` with one
    checkpoint per step, whatever `stored_steps`; with fewer checkpoints diffrax's loop
    recomputes the steps under step-size control, where rounding can change an accepted
    step, and its gradient depends on how many it keeps
    (docs/design_measurements.md#checkpoints).

    It is the default adjoint of `simulate` for [`jaxdae.Rodas5P`][], for diffrax's
    implicit solvers (`diffrax.Kvaerno3`, `Kvaerno4`, `Kvaerno5`, `ImplicitEuler`, as
    [`jaxdae.configure_implicit`][] configures them) with an integer `max_steps`, for
    [`jaxdae.TimeStepping`][], and for each stretch between two events of an event-driven
    solve allowed at most `EVENT_REPLAY_MAX_STEPS` (4,096) steps; it differentiates any
    diffrax solver whose step is a function of its arguments.

    - **Memory**: the forward solve keeps one time per step of `max_steps`, written at
      every solve: a batch of short solves (a stretch between two events) with a large
      `max_steps` spends more on that record than on its steps
      (docs/design_measurements.md#replayed-stretches). The backward
      pass replays the steps in segments of at most `stored_steps`, each from a checkpoint
      of the state and solver state (one per segment of `max_steps`), and keeps one
      segment's states at a time; for diffrax's ESDIRKs also each step's dense output
      (`y0`, `y1` and the stages: for `Kvaerno5`, nine vectors of the state's size per
      step), from which their step derivatives take the stages instead of computing the
      step a third time. Every segment but the last is replayed twice, so a
      solve within one segment is the cheapest to differentiate
      (docs/design_measurements.md#replayed-steps), and the cheapest to compile: where
      `max_steps ≤ stored_steps` its program holds no pass to the checkpoints.
    - **Solves**: saves of the state at `t0`, `ts` and `t1` (inside the steps through the
      solver's dense output), events (without a root finder the solve stops at the end of
      the step where one triggers; with one, at the time it locates inside that step,
      whose derivative is the implicit function theorem's on the replayed step's
      interpolation, as diffrax's root finders are differentiated), any step-size
      controller that makes no jumps. Other solves (a dense output, saved steps, a saved
      solver or controller state, a controller with `jump_ts`, `max_steps=None`, a solver
      or controller state passed to `diffeqsolve`), and gradients with respect to `t0`,
      `t1`, `dt0` or the save times, differentiate diffrax's loop instead (`CHECKPOINTS`
      checkpoints).
      With adaptive steps, tracing such a solve's gradient warns (a `UserWarning` naming
      the fix), since its gradient can then change with the number of checkpoints.
      Reverse mode only.

    **Arguments:**

    - `stored_steps`: the most steps whose states the backward pass keeps at once
        (default `REPLAYED_STEPS`, 4,096).
    """

    stored_steps: int = eqx.field(default=_thresholds.REPLAYED_STEPS, static=True)

    def loop(
        self,
        *,
        args,
        terms,
        solver,
        stepsize_controller,
        event,
        saveat,
        t0,
        t1,
        dt0,
        max_steps,
        throw,
        init_state,
        passed_solver_state,
        passed_controller_state,
        progress_meter,
    ):
        options = dict(
            args=args,
            terms=terms,
            solver=solver,
            stepsize_controller=stepsize_controller,
            event=event,
            saveat=saveat,
            t0=t0,
            t1=t1,
            dt0=dt0,
            max_steps=max_steps,
            throw=throw,
            init_state=init_state,
            passed_solver_state=passed_solver_state,
            passed_controller_state=passed_controller_state,
            progress_meter=progress_meter,
        )
        if not replayable(
            saveat,
            stepsize_controller,
            max_steps,
            passed_solver_state or passed_controller_state,
        ):
            warn_checkpointed(
                stepsize_controller,
                "these saves (dense output, every step, a function of the state, solver or "
                "controller states), controller jump times, states passed in or no "
                "`max_steps`",
                "save the state only at `t0`, `ts` and `t1`, with an integer `max_steps`",
                adjoint="ReplayAdjoint",
            )
            return diffrax.RecursiveCheckpointAdjoint(checkpoints=_thresholds.CHECKPOINTS).loop(
                **options
            )
        count = -(-max_steps // self.stored_steps)  # segments of equal length
        static = SweepOptions(
            solver=solver,
            stepsize_controller=stepsize_controller,
            event=event,
            progress_meter=progress_meter,
            max_steps=max_steps,
            segments=(count, -(-max_steps // count)),
            tableau=None,
        )
        problem = SweepProblem(
            terms=terms, args=args, init_state=init_state, t0=t0, t1=t1, dt0=dt0, saveat=saveat
        )
        return final_state(init_state, _replayed(problem, static), saveat), {}


def replayable(saveat, stepsize_controller, max_steps, passed_state) -> bool:
    """Whether the steps of a solve can be replayed at their recorded end times: a step
    limit, the state itself saved at `t0`, `ts` and `t1` only (not the final solver state,
    whose cotangent the replay does not carry back), no jumps of the controller (a jump
    changes the next step's solver state), and the solver's and controller's states made by
    `diffeqsolve` (`passed_state` false)."""
    saves_replayable = not (
        saveat.dense or saveat.solver_state or saveat.controller_state or saveat.made_jump
    ) and all(sub.fn is SAVE_Y and not sub.steps for sub in subsaves(saveat))
    jumps = jump_times(stepsize_controller) is not None
    return max_steps is not None and saves_replayable and not jumps and not passed_state


def _located(event) -> bool:
    """Whether the solve's events are located by a root finder (else it stops at the end
    of the step where one triggers)."""
    return event is not None and event.root_finder is not None


class _RecordsStepEnd(AbstractSteppingWrapper):
    """`solver`, whose state also holds the end time of the last step it took. diffrax
    keeps the solver state of accepted steps only, so after a solve stopped by an event it
    is the end of the step that holds the event, which the saved steps do not say (diffrax
    saves the event's time in that step's place)."""

    solver: diffrax.AbstractSolver

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args), jnp.asarray(t0)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner, t_end = solver_state
        y1, y_error, dense, inner, result = self.solver.step(
            terms, t0, t1, y0, args, inner, made_jump
        )
        return y1, y_error, dense, (inner, jnp.asarray(t1, t_end.dtype)), result


class _Location(eqx.Module):
    """What the backward pass needs of an event located by a root finder: its time `t`,
    diffrax's event mask (which condition triggered), and whether it `happened` (else the
    solve ended at `t1` or stopped before its first step)."""

    t: Array
    mask: object
    happened: Array


@eqx.filter_custom_vjp
def _replayed(problem, static):
    # Without reverse mode nothing is recorded: the solve is diffrax's.
    return loop_solve(problem, static)


def _forward(perturbed, problem, static):
    if times_perturbed(perturbed):  # the steps' times are constants of the replay
        return LoopVJP.of(problem, static)
    if not _located(static.event):
        output, (step_ts, count, _) = record_step_times(problem, static)
        return output, (step_ts, count, None)
    recording = dataclasses.replace(static, solver=_RecordsStepEnd(static.solver))
    output, (step_ts, count, solver_state) = record_step_times(problem, recording, True)
    last = jnp.maximum(count - 1, 0)
    # diffrax saves the last step at the event's time; the replay needs the step's end.
    t_event = step_ts[last]
    step_ts = step_ts.at[last].set(solver_state[1])
    mask = output.event_mask
    happened = (count > 0) & jnp.any(jnp.stack([jnp.asarray(m) for m in jax.tree.leaves(mask)]))
    return output, (step_ts, count, _Location(t_event, mask, happened))


def _event_rows(bar, sub: diffrax.SubSaveAt, t_event):
    """The cotangent `bar` of the rows that `sub` saved in a solve stopped by a located
    event, in the order of a solve that was not (`t0`, `ts`, `t1`): diffrax drops the saves
    after the event and saves `t1`'s row, the event's, right after the last one kept."""
    if bar is None or sub.ts is None or not sub.t1:
        return bar
    offset, count = int(sub.t0), sub.ts.shape[0]
    kept = jnp.concatenate([jnp.ones(offset, bool), sub.ts <= t_event])
    event_row = offset + jnp.sum(sub.ts <= t_event)

    def rows(bar):
        inside = jnp.where(kept.reshape((-1,) + (1,) * (bar.ndim - 1)), bar[: offset + count], 0)
        return bar.at[: offset + count].set(inside).at[-1].set(bar[event_row])

    return jax.tree.map(rows, bar)


def _event_time_bar(ts_bar, saveat):
    """The cotangent of the event's time: of the times saved at `t1` (the last row of each
    `SubSaveAt(t1=True)`; zero where symbolic)."""
    total = 0.0
    for sub, bar in zip(subsaves(saveat), ts_bar or [None] * len(subsaves(saveat)), strict=True):
        if sub.t1 and bar is not None:
            total = total + bar[-1]
    return total


def _location_bar(static, problem, interpolation, t_end, dense, diff_p, static_p, location, bars):
    """The cotangents of a step's dense output and of the parameters from those of the
    event located inside it, `bars = (ȳ, t̄)` of the state and time there (the implicit
    function theorem: the time `τ` solves `g(τ, dense, p) = 0`, the sum of the triggered
    conditions as diffrax's root finder sees them, so `τ̄` reaches `(dense, p)` as
    `−(t̄ + ȳ·ẏ(τ)) / g_τ · ∂g/∂(dense, p)`; ȳ reaches them through the interpolation).
    A grazing event (`g_τ = 0`) has no derivative: it gives inf or nan."""
    y_bar, t_bar = bars

    def located(tau, dense, p):
        terms, args = eqx.combine(p, static_p)
        y = interpolation(dense).evaluate(tau)

        def value(fn, triggered):
            v = fn(
                t=tau,
                y=y,
                args=args,
                terms=terms,
                solver=static.solver,
                t0=problem.t0,
                t1=problem.t1,
                dt0=problem.dt0,
                saveat=problem.saveat,
                stepsize_controller=static.stepsize_controller,
                max_steps=static.max_steps,
            )
            # A flag is located at the step's end, as diffrax's root finder places it.
            v = t_end - tau if jnp.issubdtype(jnp.result_type(v), jnp.bool_) else v
            return jnp.where(triggered, v, 0.0)

        values = jax.tree.map(value, static.event.cond_fn, location.mask, is_leaf=callable)
        return ravel_pytree(y)[0], sum(jax.tree.leaves(values))

    (y, g), pull = eqx.filter_vjp(located, location.t, dense, diff_p)
    # The pullbacks of `ȳ` and of `g`'s unit, in one batch: `ȳ·ẏ(τ)` and `g_τ` are their
    # time components.
    cotangents = (jnp.stack([y_bar, jnp.zeros_like(y)]), jnp.stack([jnp.zeros_like(g), 1.0]))
    (tau_bars, dense_bars, p_bars) = jax.vmap(pull)(cotangents)
    g_bar = -(t_bar + tau_bars[0]) / tau_bars[1]
    return jax.tree.map(lambda b: b[0] + g_bar * b[1], (dense_bars, p_bars))


def _zeros_where_inexact(tree):
    """Zero cotangents for the floating-point leaves of `tree`, None for the others."""
    return jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_inexact_array(x) else None, tree)


@full_precision
def _backward(stored, out_bar, perturbed, problem, static):
    if isinstance(stored, LoopVJP):
        return stored(out_bar)
    (step_ts, count, location), (segments, length) = stored, static.segments
    problem = jax.tree.map(typed_literal_as_array, problem)
    solver, init = static.solver, problem.init_state
    ys_bar, ts_bar, location_bars = out_bar.ys, out_bar.ts, None
    if location is not None:
        ys_bar, ts_bar = (
            None
            if bars is None
            else [
                _event_rows(bar, sub, location.t)
                for bar, sub in zip(bars, subsaves(problem.saveat), strict=True)
            ]
            for bars in (ys_bar, ts_bar)
        )
    y0_bar, final_bar, save_ts, save_bar = saves_bar(ys_bar, problem.saveat, init.y)
    if location is not None:
        # The state saved at `t1` is the event's, inside the last step; the states saved
        # after the event were dropped.
        location_bars = (
            jnp.zeros_like(ravel_pytree(init.y)[0]) if final_bar is None else final_bar,
            _event_time_bar(ts_bar, problem.saveat),
        )
        if final_bar is not None:
            final_bar = jnp.where(location.happened, 0.0, final_bar)
        if save_ts is not None:
            save_bar = jnp.where((save_ts > location.t)[:, None], 0.0, save_bar)
    unravel = ravel_pytree(init.y)[1]
    diff_p, static_p = eqx.partition(
        (problem.terms, problem.args), (perturbed.terms, perturbed.args)
    )
    times = jnp.concatenate([jnp.reshape(problem.t0, (1,)), step_ts])  # step k: k → k + 1
    saves_from = None if save_ts is None else saves_by_step(step_ts, save_ts)

    def step(k, state, p):
        """Step `k` from `state = (y, solver state)`: its end state and dense output."""
        terms, args = eqx.combine(p, static_p)
        y1, _, dense, solver_state1, _ = solver.step(
            terms, times[k], times[k + 1], state[0], args, state[1], False
        )
        return (y1, solver_state1), dense

    def advance(k, state):
        return step(k, state, diff_p)[0]

    # Under `vmap` the members' step counts differ. Every loop below is bounded by the
    # batch's largest count (`last`, one unbatched value) and a step past a member's own
    # count leaves its carry as it was: the loop counters then stay unbatched, so that the
    # reads and writes of the stored states at them are slices, not gathers and scatters.
    last = unvmap_max(count)

    # The checkpoints at the segments' starts: segment `j` holds steps `j·length …`.
    start = (init.y, init.solver_state)

    def checkpoint(state, j):
        # (The last segment's end is not a checkpoint: it is not replayed to.)
        end = jnp.where((j + 1) * length < last, (j + 1) * length, j * length)
        return jax.lax.fori_loop(
            j * length, end, lambda k, s: where_taken(k < count, advance(k, s), s), state
        ), state

    if segments == 1:  # the start is the only checkpoint: no step is replayed to it
        checkpoints = jax.tree.map(lambda x: jnp.asarray(x)[None], start)
    else:
        _, checkpoints = jax.lax.scan(checkpoint, start, jnp.arange(segments))

    def dense_bar_of(k, dense):
        """The cotangent of step `k`'s dense output from the states saved inside it."""

        def save_back(j, bar):
            _, pull = eqx.filter_vjp(
                lambda d: ravel_pytree(
                    solver.interpolation_cls(t0=times[k], t1=times[k + 1], **d).evaluate(save_ts[j])
                )[0],
                dense,
            )
            (dense_bar,) = pull(save_bar[j])
            return jax.tree.map(jnp.add, bar, dense_bar)

        assert saves_from is not None
        return jax.lax.fori_loop(
            saves_from[k],
            saves_from[k + 1],
            save_back,
            batched_like(_zeros_where_inexact(dense), dense),
        )

    # Whether the step's derivative takes the step's outputs that the replay computed
    # rather than running the step a third time: then the replay keeps them.
    keep = reuses_outputs(solver)

    def step_back(k, state, bars, outputs):
        """The cotangents at the start of step `k` (from `state`, and its `outputs` if
        kept) from those at its end."""
        end_bar, p_bar = bars
        kept = {} if outputs is None else {"outputs": outputs}
        (_, dense), pull = step_vjp(solver, times[k], times[k + 1], state, diff_p, static_p, **kept)
        dense_bar = _zeros_where_inexact(dense) if save_ts is None else dense_bar_of(k, dense)
        if location is not None:
            dense_bar, p_bar = _add_location_bar(k, dense, dense_bar, p_bar)
        state_bar, step_p_bar = pull((end_bar, dense_bar))
        return state_bar, jax.tree.map(jnp.add, p_bar, step_p_bar)

    def _add_location_bar(k, dense, dense_bar, p_bar):
        """`dense_bar` and `p_bar` with the located event's cotangents added, in the step
        that holds the event (the last)."""
        holds = location.happened & (k == count - 1)

        def pulled():
            t0, t1 = times[k], times[k + 1]
            return _location_bar(
                static,
                problem,
                lambda d: solver.interpolation_cls(t0=t0, t1=t1, **d),
                t1,
                dense,
                diff_p,
                static_p,
                location,
                location_bars,
            )

        zeros = lambda: (_zeros_where_inexact(dense), jax.tree.map(jnp.zeros_like, diff_p))  # noqa: E731
        event_dense_bar, event_p_bar = jax.lax.cond(unvmap_any(holds), pulled, zeros)
        add = lambda a, b: a + jnp.where(holds, b, jnp.zeros_like(b))  # noqa: E731
        return jax.tree.map(add, dense_bar, event_dense_bar), jax.tree.map(add, p_bar, event_p_bar)

    def segment_back(jj, bars):
        j = (last - 1) // length - jj
        first = j * length
        steps = jnp.minimum(length, last - first)  # of the member with the most
        active = lambda i: first + i < count  # noqa: E731
        begin = jax.tree.map(lambda c: c[j], checkpoints)

        def zeros(tree, rows):
            return jax.tree.map(lambda x: jnp.zeros((rows,) + jnp.shape(x), x.dtype), tree)

        def put(rows, i, tree):
            return jax.tree.map(lambda r, x: r.at[i].set(x), rows, tree)

        def row(rows, i):
            return jax.tree.map(lambda r: r[i], rows)

        def back_from(i, bars, outputs_of):
            """The step back through step `first + i`, for the members that took it."""
            new = step_back(first + i, row(starts, i), bars, outputs_of(i))
            return where_taken(active(i), new, bars)

        if not keep:

            def replay(i, carry):
                state, starts = carry
                after = where_taken(active(i), advance(first + i, state), state)
                return after, put(starts, i, state)

            _, starts = jax.lax.fori_loop(
                0, steps, replay, batched_like((begin, zeros(begin, length)), (times, begin))
            )
            return jax.lax.fori_loop(
                0, steps, lambda ii, bars: back_from(steps - 1 - ii, bars, lambda i: None), bars
            )

        # Every step's start state, the last step's end state after them (step `i` ends
        # where step `i + 1` starts; a member's rows past its last step hold its end
        # state), and every step's dense output.
        def replay_keeping(i, carry):
            state, states, denses = carry
            end, dense = step(first + i, state, diff_p)
            return where_taken(active(i), end, state), put(states, i, state), put(denses, i, dense)

        denses = zeros(jax.eval_shape(lambda: step(first, begin, diff_p)[1]), length)
        end, starts, denses = jax.lax.fori_loop(
            0,
            steps,
            replay_keeping,
            batched_like((begin, zeros(begin, length + 1), denses), (times, begin)),
        )
        starts = put(starts, steps, end)
        return jax.lax.fori_loop(
            0,
            steps,
            lambda ii, bars: back_from(
                steps - 1 - ii, bars, lambda i: (row(starts, i + 1), row(denses, i))
            ),
            bars,
        )

    end_bar = (
        unravel(final_bar) if final_bar is not None else jax.tree.map(jnp.zeros_like, init.y),
        _zeros_where_inexact(init.solver_state),
    )
    p_bar = jax.tree.map(jnp.zeros_like, diff_p)
    # The loops' cotangents and rows start batched under `vmap` (`_compilation/_batching.py`):
    # the batched steps fill them.
    (y_bar, solver_state_bar), p_bar = jax.lax.fori_loop(
        0, -(-last // length), segment_back, batched_like((end_bar, p_bar), (times, init.y))
    )
    if y0_bar is not None:
        y_bar = jax.tree.map(jnp.add, y_bar, unravel(y0_bar))
    init_bar = dataclasses.replace(
        nones(init),
        y=y_bar,
        solver_state=eqx.filter(solver_state_bar, perturbed.init_state.solver_state),
    )
    terms_bar, args_bar = p_bar
    return dataclasses.replace(nones(problem), terms=terms_bar, args=args_bar, init_state=init_bar)


_replayed.def_fwd(_forward)
_replayed.def_bwd(_backward)
