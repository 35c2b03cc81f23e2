"""Gradients of a solve by a reverse sweep over its stored steps.

Reverse mode through diffrax's loop (`RecursiveCheckpointAdjoint`) differentiates
everything the loop does: the stage loop's buffers, the step-size controller, the saving,
the checkpoints, and that costs several times the right-hand side's own vector–Jacobian
products (`experiments/diagnostics/bench_rhs.py` times one step and its VJP).
[`jaxdae.ReverseSweepAdjoint`][] pays only for the latter: the forward solve stores the accepted steps (a long solve in segments, re-solved from
checkpoints), and the backward pass is the discrete adjoint of the explicit Runge–Kutta
step, applied step by step in reverse.
"""

import contextlib
import dataclasses
import functools
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._compilation._kernels import kernel_boundary
from .._compilation._linalg import full_precision
from .._compilation._private_apis import traced_for_jit
from .._compilation._scalarize import scalarize
from .._custom_types import Array
from ._solvers import AbstractWrappedSolver


class ReverseSweepAdjoint(diffrax.AbstractAdjoint):
    """Differentiates a solve by a reverse sweep over its stored steps: the discrete
    adjoint of an explicit Runge–Kutta method. A `diffrax.AbstractAdjoint`: pass it to
    `simulate` or to `diffrax.diffeqsolve` as `adjoint=`.

    The forward solve keeps the accepted steps' end times and states (see *Memory*). The
    backward pass walks the steps from the last to the first; for each it recomputes the
    stages from the stored state and applies the right-hand side's vector–Jacobian product
    at each stage
    (`ȳₙ = ȳₙ₊₁ + Σᵢ μᵢ`, `μᵢ = f_yᵀ(Yᵢ) λᵢ`, `λᵢ = h bᵢ ȳₙ₊₁ + h Σ_{j>i} a_ji μⱼ`), and
    the cotangents of the states saved inside the step through the solver's dense output.
    The step sizes are constants of the gradient, as diffrax's step-size controllers make
    them, so the gradient equals that of diffrax's `RecursiveCheckpointAdjoint` to
    rounding; it is cheaper because diffrax's loop is not differentiated
    (`experiments/bench_core.py`). Without reverse mode (a plain call, `jax.vmap`) the
    solve is diffrax's own loop, as with `RecursiveCheckpointAdjoint`.

    It is the default adjoint of `simulate`, [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][] for explicit Runge–Kutta solvers with an integer
    `max_steps`; pass `adjoint=jaxdae.ReverseSweepAdjoint(stored_steps=...)` to set its
    memory. In a solve of your own:

    ```python
    import diffrax
    import jax
    import jax.numpy as jnp
    import jaxdae

    def loss(k):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, k: -k * y + jnp.sin(t)), diffrax.Tsit5(),
            0.0, 2.0, 0.1, jnp.array([1.0, 2.0]), args=k,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
            max_steps=4096, adjoint=jaxdae.ReverseSweepAdjoint())
        return jnp.sum(sol.ys**2)

    jax.grad(loss)(0.7)  # equals the gradient with diffrax.RecursiveCheckpointAdjoint()
    ```

    - **Memory**: at most `stored_steps` steps are stored at once, `stored_steps × (state
      size + 1)` floats per trajectory (the default 1024: 40 kB for a two-coordinate
      system). A solve allowed more steps (`max_steps > stored_steps`) runs in segments of
      at most `stored_steps` steps: the forward solve keeps each segment's start (its state
      and the solver's and step-size controller's) and the last segment's steps, and the
      backward pass re-solves every earlier segment from its start before sweeping it. A
      solve that ends within its first segment, the usual case, is solved once, as with
      `stored_steps ≥ max_steps`. (With segments the step limit is `max_steps` rounded up
      to a multiple of the segments' length: at most `max_steps / stored_steps` more.)
      A re-solve must end where the forward solve's segment ended (to `√ε` times the
      largest of `|t0|`, `|t1|` and `t1 − t0`): one that does not, because rounding changed
      which steps were accepted (a chaotic or badly scaled solve), raises at run time
      rather than differentiate steps the solve did not take.
    - **Solves**: an ODE given as one `diffrax.ODETerm`; explicit Runge–Kutta methods with
      a Butcher tableau (`diffrax.AbstractERK`: `Tsit5`, `Dopri5`, `Bosh3`, `Heun`, … and
      [`jaxdae.UnrolledERK`][] of them); adaptive or constant steps (`PIDController`,
      `ConstantStepSize`, `StepTo`, `ClipStepSizeController`); an integer `max_steps`;
      saves at `t0`, `ts` and `t1` (any `SubSaveAt`s of those, and the final
      `solver_state`); events without a root finder (the solve stops at the end of the
      step where one triggers). Anything else raises `ValueError` when the solve is
      traced, naming the fix: an implicit solver, `max_steps=None`, `SaveAt(dense=True)`,
      `SaveAt(steps=True)`, `SubSaveAt(fn=...)`, a saved `controller_state` or
      `made_jump`, an event's `root_finder`, a `solver_state` passed to `diffeqsolve`.
    - **Gradients** with respect to `y0`, `args` and arrays held by the vector field
      (the term), of `simulate`, of `simulate_actuated` and of
      [`jaxdae.simulate_ensemble`][] (whose trajectories share the steps: the sweep runs
      once over the shared steps, every trajectory at once). Gradients with respect to
      `t0`, `t1`, the save times or `dt0` differentiate diffrax's loop instead
      (`diffrax.RecursiveCheckpointAdjoint`), inside the same call. Reverse mode only:
      forward mode (`jax.jvp`) needs `diffrax.ForwardMode()`.
    - **Extensions** (used by [`jaxdae.simulate_ensemble`][]): a solver that passes its
      vector field more than `args` defines `step_args(args, solver_state, t)`, the
      vector field's arguments in the step that starts at `t` given the solver state at
      the end of the solve; an `ODETerm` subclass with a `stage_vjp` method brings its own
      vector–Jacobian product (jaxdae's `ODETermWithVJP`).

    **Arguments:**

    - `stored_steps`: the most steps stored at once (see *Memory*).
    """

    stored_steps: int = eqx.field(default=1024, static=True)

    def __check_init__(self):
        if isinstance(self.stored_steps, bool) or not isinstance(
                self.stored_steps, (int, np.integer)) or self.stored_steps < 1:
            raise ValueError("`ReverseSweepAdjoint(stored_steps=...)` must be a positive "
                             f"integer; got {self.stored_steps!r}.")

    def loop(self, *, args, terms, solver, stepsize_controller, event, saveat, t0, t1, dt0,
             max_steps, throw, init_state, passed_solver_state, passed_controller_state,
             progress_meter):
        """diffrax's solve loop, whose reverse mode is the sweep (see the class)."""
        del throw, passed_controller_state  # `diffeqsolve` throws; the steps are constants
        _check_sweepable(terms, solver, saveat, event, max_steps, passed_solver_state)
        static = SweepOptions(
            solver=solver, stepsize_controller=stepsize_controller, event=event,
            progress_meter=progress_meter, max_steps=max_steps,
            segments=_segments(max_steps, self.stored_steps, stepsize_controller),
            tableau=explicit_tableau(solver), step_args=getattr(solver, "step_args", None))
        problem = _Problem(terms=terms, args=args, init_state=init_state, t0=t0, t1=t1,
                           dt0=dt0, saveat=saveat)
        out = _swept(problem, static)
        # No tangents for the result and counts (JAX gives a custom VJP's integer outputs
        # symbolic ones, which `diffeqsolve`'s `throw` check cannot take).
        out = jax.tree.map(lambda x: x if eqx.is_inexact_array(x) else jax.lax.stop_gradient(x),
                           out)
        return _final_state(init_state, out, saveat), {}


class ODETermWithVJP(diffrax.ODETerm):
    """`diffrax.ODETerm(vector_field)` with its own vector–Jacobian product, which
    [`jaxdae.ReverseSweepAdjoint`][] applies at each stage instead of differentiating
    `vector_field` (an ensemble applies each trajectory's own product row by row).

    **Arguments:**

    - `vector_field`: `vector_field(t, y, args)`, as for `diffrax.ODETerm`.
    - `vjp`: `vjp(t, y, args, solver_state, t_start, cotangent) -> (y_bar, args_bar)`, the
      vector–Jacobian product of `vector_field` at `(t, y)` in the step from `t_start`
      (the solver's time, see `step_args` in [`jaxdae.ReverseSweepAdjoint`][]), with
      respect to `y` and `args`; `solver_state` is the solver state at the end of the
      solve (or of the segment that holds the step) if the solver defines `step_args`,
      else None. `args_bar` has the structure of `args` (None for no cotangent).
    """

    vjp: Callable

    def stage_vjp(self, t, y, args, solver_state, t_start, cotangent):
        """`(y_bar, args_bar)`: the vector–Jacobian product of `vector_field` (see `vjp`)."""
        return self.vjp(t, y, args, solver_state, t_start, cotangent)


_SAVE_Y = diffrax.SubSaveAt(t1=True).fn  # a `SubSaveAt`'s default `fn`: the state itself


def _subsaves(saveat: diffrax.SaveAt) -> list:
    """The `SubSaveAt`s of `saveat`, in the order of its pytree."""
    return jax.tree.leaves(saveat.subs, is_leaf=lambda s: isinstance(s, diffrax.SubSaveAt))


def _check_sweepable(terms, solver, saveat, event, max_steps, passed_solver_state) -> None:
    """A `ValueError` naming the fix for a solve that `ReverseSweepAdjoint` cannot sweep."""
    fix = ("or differentiate through diffrax's loop, "
           "`adjoint=diffrax.RecursiveCheckpointAdjoint()`.")
    explicit_tableau(solver)
    odes = _terms_within(terms)
    if len(odes) != 1 or not isinstance(odes[0], diffrax.ODETerm):
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` differentiates an ODE given as one "
            f"`diffrax.ODETerm`; got {[type(x).__name__ for x in odes]}. Pass "
            f"`diffrax.ODETerm(vector_field)`, {fix}")
    if max_steps is None:
        raise ValueError("`jaxdae.ReverseSweepAdjoint` stores the steps: pass an integer "
                         "`max_steps` (it sizes the checkpoints of a long solve).")
    if saveat.dense:
        raise ValueError("`jaxdae.ReverseSweepAdjoint` does not save a dense solution "
                         f"(`SaveAt(dense=True)`): save at `SaveAt(ts=...)` instead, {fix}")
    if saveat.controller_state or saveat.made_jump:
        raise ValueError("`jaxdae.ReverseSweepAdjoint` does not return the step-size "
                         "controller's state or `made_jump` (`SaveAt(controller_state=True)`, "
                         f"`SaveAt(made_jump=True)`): leave them unsaved, {fix}")
    for sub in _subsaves(saveat):
        if sub.steps:
            raise ValueError("`jaxdae.ReverseSweepAdjoint` does not save every step "
                             f"(`SaveAt(steps=True)`): save at `SaveAt(ts=...)` instead, {fix}")
        if sub.fn is not _SAVE_Y:
            raise ValueError("`jaxdae.ReverseSweepAdjoint` saves the state itself: apply "
                             f"`fn` to the saved states instead of `SaveAt(fn=fn)`, {fix}")
    if event is not None and event.root_finder is not None:
        raise ValueError("`jaxdae.ReverseSweepAdjoint` stops a solve at the end of the step "
                         "where an event triggers: pass `diffrax.Event(cond_fn)` without a "
                         f"`root_finder`, {fix}")
    if passed_solver_state:
        raise ValueError("`jaxdae.ReverseSweepAdjoint` recomputes the first step's stages "
                         "from `y0`: do not pass `solver_state` to `diffeqsolve`, " + fix)


def _terms_within(terms) -> list:
    """The ODE terms and multi-terms inside `terms` (as `diffeqsolve` wrapped them)."""
    is_term = lambda x: isinstance(x, (diffrax.ODETerm, diffrax.MultiTerm))  # noqa: E731
    return [x for x in jax.tree.leaves(terms, is_leaf=is_term) if is_term(x)]


def explicit_tableau(solver) -> diffrax.ButcherTableau:
    """The Butcher tableau of an explicit Runge–Kutta `solver`, or a `ValueError`."""
    base = _unwrapped(solver)
    if not isinstance(base, diffrax.AbstractERK):
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` differentiates explicit Runge–Kutta solvers "
            f"(`diffrax.Tsit5`, `Dopri5`, `Bosh3`, `Heun`, …); got {type(base).__name__}. "
            "Use the default adjoint (`diffrax.RecursiveCheckpointAdjoint`) for this solver.")
    return base.tableau


def _unwrapped(solver):
    while isinstance(solver, AbstractWrappedSolver):
        solver = solver.solver
    return solver


def default_adjoint(solver, max_steps) -> diffrax.AbstractAdjoint | ReverseSweepAdjoint:
    """The adjoint of a solve given none: [`jaxdae.ReverseSweepAdjoint`][] for an explicit
    Runge–Kutta `solver` with a step limit, else `diffrax.RecursiveCheckpointAdjoint` with
    `CHECKPOINTS` checkpoints."""
    if isinstance(_unwrapped(solver), diffrax.AbstractERK) and max_steps is not None:
        return ReverseSweepAdjoint()
    return diffrax.RecursiveCheckpointAdjoint(checkpoints=CHECKPOINTS)


def reverse_only(adjoint) -> bool:
    """Whether `adjoint` differentiates a solve in reverse mode only (its forward mode raises):
    [`jaxdae.ReverseSweepAdjoint`][] and `diffrax.RecursiveCheckpointAdjoint`, both custom
    VJPs."""
    return isinstance(adjoint, (ReverseSweepAdjoint, diffrax.RecursiveCheckpointAdjoint))


# Checkpoints of `RecursiveCheckpointAdjoint` where it is the default. diffrax's default for
# `max_steps = 100_000` is ≈450; on the two-link gradient (`experiments/bench_adjoint.py`,
# 2-core CPU) 32 was 1.15–1.2× faster at 130 steps and 1.05–1.3× faster at ≈2000 steps (the
# extra recomputation costs less than the larger checkpoint buffers), with 14× less memory
# per trajectory, which matters under `vmap`.
CHECKPOINTS = 32

# States of at least this many entries keep each stage's linearization in the reverse sweep
# (`_backward`). Smaller ones evaluate each stage's vector–Jacobian product as one scalar
# graph (`scalarize`), which needs the right-hand side inside it.
LINEARIZED_MIN_SIZE = 64

# Stages per iteration of the loop that applies the kept linearizations in reverse (the loop
# body holds this many copies of the right-hand side's transposed linearization). On the
# chain of 64 links (`experiments/bench_scaling.py --families chain --sizes 64`, 2-core
# CPU, load 5-7) a stage's linearization and product took about 14 µs with 2 stages per
# iteration and 17 µs with 1, with Tsit5 (6 stages) and Dopri8 (12); the whole loop
# unrolled was no faster than 2 and compiled the gradient in 8.7 and 13.4 s instead of
# 6.5 and 6.3 s (2 stages: 6.9 and 7.8 s).
LINEARIZED_UNROLL = 2


@contextlib.contextmanager
def forward_mode_hint():
    """JAX's error for forward-mode differentiation of a solve whose adjoint is a custom VJP
    (the sweep, diffrax's checkpointed loop), as one that names the fix."""
    try:
        yield
    except TypeError as error:
        if "forward-mode autodiff" not in str(error):
            raise
        raise ValueError(
            "Forward-mode differentiation (`jax.jvp`, `jax.jacfwd`, `jax.hessian`) of a "
            "solve needs `adjoint=diffrax.ForwardMode()`: the default adjoints "
            "(`jaxdae.ReverseSweepAdjoint`, `diffrax.RecursiveCheckpointAdjoint`) work in "
            "reverse mode only (`jax.grad`, `jax.vjp`).") from error


def jit_unless_staged(fn: Callable) -> Callable:
    """`eqx.filter_jit(fn)`, but `fn` itself when its input is traced for an enclosing
    `jax.jit` (under `grad` or `vmap` too), which compiles it whole anyway.

    JAX stages a jitted function before it differentiates it, and staging a custom VJP
    (the swept solve, diffrax's checkpointed loop) traces its primal solve, which reverse
    mode then does not use: it traces the forward solve. Called inline, only the forward
    solve is traced, which shortens the gradient's trace by a fifth or so on the two-link
    benchmark (`experiments/bench_compile.py --only gradient`). The price: a loss that calls `fn` several times traces each call's solves (the
    jitted `fn`'s are cached); at three calls the two trace equally long. Eager calls,
    eager `jax.grad` and `jax.vmap` included, keep the jitted `fn`: they run its compiled
    program rather than one operation at a time."""
    jitted = eqx.filter_jit(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return (fn if traced_for_jit((args, kwargs)) else jitted)(*args, **kwargs)

    call.jitted = jitted
    return call


class SweepOptions(eqx.Module):
    """The non-differentiated arguments of the swept solve (`_solve`, `_backward`): the
    solve's solver, step-size controller, event and progress meter as `diffeqsolve` gave
    them to the adjoint, its step limit, the segments' `(count, length)` (`_segments`), the
    solver's Butcher tableau and its `step_args` (or None). The solver, controller and
    event may hold arrays (a controller's tolerances): ordinary fields; the rest is
    static."""

    solver: diffrax.AbstractSolver
    stepsize_controller: diffrax.AbstractStepSizeController
    event: diffrax.Event | None
    progress_meter: diffrax.AbstractProgressMeter
    max_steps: int = eqx.field(static=True)
    segments: tuple[int, int] | None = eqx.field(static=True)
    tableau: diffrax.ButcherTableau
    step_args: Callable | None = eqx.field(static=True)


class _Problem(eqx.Module):
    """The differentiated arguments of the swept solve, as `diffeqsolve` gave them to the
    adjoint (times multiplied by the solve's direction, terms wrapped to match): the terms
    and `args`, the state it starts from (`init_state.y` is `y0`; the solver's and
    controller's states are constants of the gradient), the times and what to save."""

    terms: diffrax.AbstractTerm
    args: object
    init_state: eqx.Module
    t0: Array
    t1: Array
    dt0: Array | None
    saveat: diffrax.SaveAt


class _Output(eqx.Module):
    """What `diffrax.diffeqsolve` reads from the final state of a solve (`_final_state`):
    each `SubSaveAt`'s saved times and states (in the order of `_subsaves`), the result,
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
        return cls(ts=[s.ts for s in saves], ys=[s.ys for s in saves], result=state.result,
                   counts=_counts(state.num_steps, state.num_accepted_steps,
                                  state.num_rejected_steps),
                   event_mask=state.event_mask,
                   solver_state=state.solver_state if saveat.solver_state else None)


def _counts(*counts) -> tuple:
    """Step counts in diffrax's integer type."""
    return tuple(jnp.asarray(c, jnp.asarray(0).dtype) for c in counts)


def _subsaves_def(saveat: diffrax.SaveAt):
    """The pytree structure of `saveat.subs` down to its `SubSaveAt`s."""
    return jax.tree.structure(saveat.subs,
                              is_leaf=lambda s: isinstance(s, diffrax.SubSaveAt))


def _final_state(init_state, out: _Output, saveat: diffrax.SaveAt):
    """`init_state` with the fields that `diffeqsolve` reads after the solve loop set to
    `out`'s."""
    subs_def = _subsaves_def(saveat)
    save_state = subs_def.unflatten([
        dataclasses.replace(s, ts=ts, ys=ys) for s, ts, ys in zip(
            subs_def.flatten_up_to(init_state.save_state), out.ts, out.ys, strict=True)])
    num_steps, num_accepted_steps, num_rejected_steps = out.counts
    return dataclasses.replace(
        init_state, save_state=save_state, result=out.result, num_steps=num_steps,
        num_accepted_steps=num_accepted_steps, num_rejected_steps=num_rejected_steps,
        event_mask=out.event_mask,
        solver_state=out.solver_state if saveat.solver_state else init_state.solver_state)


def _segments(max_steps, stored_steps, stepsize_controller) -> tuple[int, int] | None:
    """`(count, length)` of the segments of a solve: one of `max_steps` if it may store them
    all. None for `StepTo`, which counts its steps in diffrax's loop: solved by diffrax's
    `SaveAt(steps=True)` instead.

    One segment is solved as several are, not by diffrax's `SaveAt(steps=True)`: that loop's
    state begins the gradient's program with many independent operations, and XLA's CPU
    runtime hands a program to its thread pool when more than 8 are ready at once, where its
    speed depends on what else runs. The segments' state keeps the program on the calling
    thread (`_solve_in_segments`; experiments/diagnostics/README.md, "Design measurements")."""
    if isinstance(stepsize_controller, diffrax.StepTo):
        return None
    count = -(-max_steps // stored_steps)
    return count, -(-max_steps // count)


def _solve(problem, static):
    """The solve's output, and what the sweep reads: every accepted step's end time and
    state of the last segment, and each segment's start (`StepTo`: of the whole solve, by
    diffrax's `SaveAt(steps=True)`)."""
    if static.segments is not None:
        return _solve_in_segments(problem, static)
    saveat = problem.saveat
    out = diffrax.diffeqsolve(
        problem.terms, static.solver, problem.t0, problem.t1, problem.dt0,
        problem.init_state.y, args=problem.args,
        saveat=diffrax.SaveAt(subs=[saveat.subs, diffrax.SubSaveAt(steps=True)],
                              solver_state=saveat.solver_state or bool(static.step_args)),
        stepsize_controller=static.stepsize_controller, event=static.event,
        max_steps=static.max_steps, adjoint=diffrax.RecursiveCheckpointAdjoint(),
        throw=False)
    (ts_saved, step_ts), (ys_saved, step_ys) = out.ts, out.ys
    subs_def = _subsaves_def(saveat)
    output = _Output(ts=subs_def.flatten_up_to(ts_saved), ys=subs_def.flatten_up_to(ys_saved),
                     result=out.result, counts=_counts(*(out.stats[k] for k in _COUNTS)),
                     event_mask=out.event_mask,
                     solver_state=out.solver_state if saveat.solver_state else None)
    steps = out.stats["num_accepted_steps"]
    return output, (step_ts, step_ys, steps, out.solver_state if static.step_args else None)


class _RecordProposal(diffrax.AbstractStepSizeController):
    """`controller`, whose state also holds the end of the next step it proposes: a
    segment ends with it, and the next one starts from it (diffrax's `Solution` does not
    say it).

    Given `restart = (t_start, tnext, made_jump)`, a segment's start (`made_jump` None
    when the controller makes no jumps), the solve's first step ends at `t_start` and is
    kept (`_Restart` makes it take no time). From there the solve goes on as from the
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

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order,
                        controller_state):
        keep, tprev, tnext, jump, state, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state[0])
        state = (state, jnp.asarray(tnext, jnp.result_type(t1)))
        if self.restart is None:
            return keep, tprev, tnext, jump, state, result
        t_start, t_proposed, made_jump = self.restart
        restarting = t1 <= t_start
        pick = lambda new, old: jnp.where(restarting, old, new)  # noqa: E731
        return (keep | restarting, pick(tprev, t_start), pick(tnext, t_proposed),
                jump if made_jump is None else pick(jump, made_jump),
                jax.tree.map(pick, state, controller_state),
                diffrax.RESULTS.where(restarting, diffrax.RESULTS.successful, result))


class _Restart(AbstractWrappedSolver):
    """`solver`, restarting a solve at `t_start` with the solver state given to
    `diffeqsolve`: a step that ends at or before `t_start` (the first, from the solve's
    `t0`; see `_RecordProposal`) takes no time and keeps the solver state.

    A segment is solved from the solve's own `t0` this way, not from its start: diffrax
    multiplies times by `direction = where(t0 < t1, 1, -1)`, and a traced start makes it
    traced. Then XLA cannot fold diffrax's end threshold, 100 `prevbefore` of
    `t1 · direction`, and compiles it as about 1,700 instructions per solve."""

    solver: diffrax.AbstractSolver
    t_start: Array

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        return _restarted_step(self, terms, t0, t1, y0, args, solver_state, made_jump)


@eqx.filter_jit
def _restarted_step(restart: _Restart, terms, t0, t1, y0, args, solver_state, made_jump):
    """`restart.step`, jitted: diffrax traces a solve's step function three times, and
    the backward pass of a solve in segments re-solves them with the same step. Traced
    once, the gradient of the ladder of 128 four-bars traced 0.3 s (a sixth) faster
    (`experiments/bench_compile.py --model ladder:128 --only gradient`)."""
    restarting = t1 <= restart.t_start
    # A step of length zero from the start: the start state, no error, the solver state
    # given, whatever the rates there.
    y1, y_error, dense_info, state, result = restart.solver.step(
        terms, jnp.where(restarting, t1, t0), t1, y0, args, solver_state, made_jump)
    pick = lambda new, old: jnp.where(restarting, old, new)  # noqa: E731
    return (jax.tree.map(pick, y1, y0),
            jax.tree.map(lambda e: jnp.where(restarting, 0, e), y_error),
            dense_info, jax.tree.map(pick, state, solver_state),
            diffrax.RESULTS.where(restarting, diffrax.RESULTS.successful, result))


def _after_start(cond_fn, t_start, t, y, args, **kwargs):
    """An event's condition in a solve restarted at `t_start` (`_Restart`). Earlier times
    (the solve's `t0`, where diffrax first evaluates it) count as the start, so that a
    real value does not change sign across the restart. A flag is false at the start (the
    segment before checked it there; for the first segment, `diffeqsolve` at `t0`, and
    `_solve_in_segments` stops there if it was raised): at diffrax's first evaluation,
    recognized by its time being the solve's `t0` itself, a flag is not evaluated: that
    evaluation is a copy of the condition in the program, which XLA keeps (about 300 HLO
    instructions of the ladder of 128 four-bars' gradient, the failure test,
    `experiments/bench_compile.py`)."""
    def evaluate():
        return cond_fn(jnp.maximum(t, t_start), y, args, **kwargs)

    # (`jnp.result_type`: a condition may be a Python bool, e.g. the failure test of a
    # system without constraints.)
    if t is kwargs.get("t0") and jnp.result_type(eqx.filter_eval_shape(evaluate)) == jnp.bool_:
        return jnp.zeros((), jnp.bool_)
    value = evaluate()
    return value & (t > t_start) if jnp.result_type(value) == jnp.bool_ else value


def _segment(start, problem, static, save_ts=(), event=None):
    """At most one segment's length of steps from `start`, saving each step, the end (and
    the solver's and controller's states there) and each of `save_ts` (those before the
    start at the start). The solve runs from `t0`, the whole solve's start, restarting at
    `start` (`_Restart`); its first saved step is that start, and its counts include it."""
    t, y, solver_state, controller_state, made_jump = start
    subs = [diffrax.SubSaveAt(ts=ts) for ts in save_ts]
    subs = subs + [diffrax.SubSaveAt(t1=True), diffrax.SubSaveAt(steps=True)]
    if event is not None:
        event = eqx.tree_at(lambda e: e.cond_fn, event, jax.tree.map(
            lambda fn: eqx.Partial(_after_start, fn, t), event.cond_fn, is_leaf=callable))
    restart = t, controller_state[1], made_jump if _jumps(static) else None
    return diffrax.diffeqsolve(
        problem.terms, _Restart(static.solver, t), problem.t0, problem.t1, None, y,
        args=problem.args, saveat=diffrax.SaveAt(subs=subs, solver_state=True,
                                                 controller_state=True, made_jump=True),
        stepsize_controller=_RecordProposal(static.stepsize_controller, restart),
        event=event, max_steps=static.segments[1] + 1, solver_state=solver_state,
        controller_state=controller_state, adjoint=diffrax.RecursiveCheckpointAdjoint(),
        throw=False)


def _jumps(static) -> bool:
    """Whether the controller steps across discontinuities (the solver then re-evaluates a
    step's first stage); if not, diffrax resolves `made_jump` when tracing."""
    return getattr(static.stepsize_controller, "jump_ts", None) is not None


def _solve_in_segments(problem, static):
    """`_solve` in segments: one `diffrax.diffeqsolve` per segment, each from where the last
    stopped (after a segment's length of steps), until the solve ends or `max_steps`. Keeps
    every segment's start and the last segment's steps."""
    count, length = static.segments
    event, init, t0 = static.event, problem.init_state, problem.t0
    y0 = init.y
    dtype = jnp.result_type(t0)
    # The start as `diffeqsolve` made it, `(t, y, solver state, controller state, made
    # jump)`; the controller's state holds its proposed step end too (`_RecordProposal`).
    start = (t0, y0, init.solver_state, (init.controller_state, jnp.asarray(init.tnext, dtype)),
             jnp.asarray(init.made_jump))
    save_ts = [sub.ts for sub in _subsaves(problem.saveat) if sub.ts is not None]
    # The starts as rows of one array (leaves in their common dtype: flags and small counters
    # convert exactly), not one array per leaf. Each leaf's initial value and copy would be an
    # independent operation at the top of the gradient's program; with more than 8 ready at
    # once XLA's CPU runtime runs the program on its thread pool, where it waits for threads
    # that other work keeps busy. One flat array keeps it on the calling thread
    # (experiments/diagnostics/README.md, "Design measurements").
    start, unravel_start = ravel_pytree(start)
    starts = jnp.zeros((count + 1,) + start.shape, start.dtype).at[0].set(start)
    inf = lambda rows, y: jnp.full(rows + jnp.shape(y), jnp.inf, jnp.result_type(y))  # noqa: E731
    # What the loop carries besides the starts and the current one (the solve's end, after
    # the loop): the last segment's steps, saves at `ts`, result and event mask, and the
    # step counts of all segments. The result and mask start as `diffeqsolve` left them
    # at `t0`: a flag already raised there ends the solve before its first step, as in
    # diffrax's own loop (a segment does not evaluate a flag at its start: `_after_start`).
    last = dict(
        step_ts=jnp.full(length, jnp.inf, dtype),
        step_ys=jax.tree.map(lambda y: inf((length,), y), y0),
        result=init.result,
        event_mask=None if event is None else jax.tree.map(
            lambda mask: jnp.asarray(mask, bool), init.event_mask),
        steps=jnp.zeros((), jnp.int32))
    saved = [(jnp.full(ts.shape, jnp.inf, dtype), jax.tree.map(
        functools.partial(inf, ts.shape), y0)) for ts in save_ts]
    counts = jnp.zeros(3, int)  # steps, accepted, rejected (diffrax's integer type)

    def going_on(carry):
        index, _, _, last, _, _ = carry
        return (index < count) & (
            ((index == 0) & (last["result"] == diffrax.RESULTS.successful))
            | (last["result"] == diffrax.RESULTS.max_steps_reached))

    def segment(carry):
        index, starts, flat_start, _, saved, counts = carry
        start = unravel_start(flat_start)
        out = _segment(start, problem, static, save_ts, event)
        *at_ts, t_end, _ = out.ts
        *ys_at_ts, y_end, _ = out.ys  # the end (`SubSaveAt(t1=True)`), saved as (1, ...)
        step_ts, step_ys, steps = _steps(out)
        end = (t_end[0], jax.tree.map(lambda y: y[0], y_end), out.solver_state,
               out.controller_state, out.made_jump)
        end = ravel_pytree(end)[0]
        starts = starts.at[index + 1].set(end)
        # A save time at or before the start was an earlier segment's.
        saved = [_new_saves(old, (ts_k, ys_k), ts, (ts > start[0]) | (index == 0))
                 for old, ts_k, ys_k, ts in zip(saved, at_ts, ys_at_ts, save_ts, strict=True)]
        # Less the restart, a step taken and accepted.
        counts = counts + jnp.stack([out.stats[k] for k in _COUNTS]).astype(
            counts.dtype) - jnp.array([1, 1, 0], counts.dtype)
        last = dict(step_ts=step_ts, step_ys=step_ys, result=out.result,
                    event_mask=out.event_mask, steps=steps)
        return index + 1, starts, end, last, saved, counts

    index, starts, end, last, saved, counts = jax.lax.while_loop(
        going_on, segment, (jnp.zeros((), jnp.int32), starts, start, last, saved, counts))
    t_end, y_end, solver_state = unravel_start(end)[:3]
    end = t_end[None], jax.tree.map(lambda y: y[None], y_end)
    start = jnp.reshape(t0, (1,)).astype(dtype), jax.tree.map(lambda y: y[None], y0)
    saved = iter(saved)
    ts_out, ys_out = [], []
    for sub in _subsaves(problem.saveat):  # rows as diffrax orders them: t0, ts, t1
        rows = ([start] if sub.t0 else []) + ([next(saved)] if sub.ts is not None else []) + (
            [end] if sub.t1 else [])
        ts_out.append(rows[0][0] if len(rows) == 1 else jnp.concatenate([r[0] for r in rows]))
        ys_out.append(rows[0][1] if len(rows) == 1 else jax.tree.map(
            lambda *ys: jnp.concatenate(ys), *[r[1] for r in rows]))
    out = _Output(ts=ts_out, ys=ys_out, result=last["result"], counts=_counts(*counts),
                  event_mask=last["event_mask"],
                  solver_state=solver_state if problem.saveat.solver_state else None)
    return out, (last["step_ts"], last["step_ys"], last["steps"], starts, index,
                 unravel_start)


def _new_saves(saved, new, ts, after_start):
    """The saves `(times, states)` at `ts` so far, updated with a segment's `new` ones
    (those `after_start` and reached)."""
    take = jnp.isfinite(new[0]) & after_start
    return (jnp.where(take, new[0], saved[0]), jax.tree.map(
        lambda old, y: jnp.where(take.reshape((-1,) + (1,) * (y.ndim - 1)), y, old),
        saved[1], new[1]))


_COUNTS = ("num_steps", "num_accepted_steps", "num_rejected_steps")


@eqx.filter_custom_vjp
def _swept(problem, static):
    # Without reverse mode nothing is stored: the solve is diffrax's.
    return _loop_solve(problem, static)


def _forward(perturbed, problem, static):
    if any(jax.tree.leaves((perturbed.t0, perturbed.t1, perturbed.dt0, perturbed.saveat))):
        # The sweep holds the step times constant.
        out, pull = eqx.filter_vjp(lambda problem: _loop_solve(problem, static), problem)
        return out, _LoopVJP(pull, out)
    return _solve(problem, static)


class _LoopVJP(eqx.Module):
    """The vector–Jacobian product of the solve through diffrax's loop, and the solve's
    output (for gradients with respect to the times)."""

    pull: Callable
    out: _Output


def _loop_solve(problem, static) -> _Output:
    """The solve by diffrax's loop (differentiated through, if at all)."""
    final_state, _ = diffrax.RecursiveCheckpointAdjoint(checkpoints=CHECKPOINTS).loop(
        args=problem.args, terms=problem.terms, solver=static.solver,
        stepsize_controller=static.stepsize_controller, event=static.event,
        saveat=problem.saveat, t0=problem.t0, t1=problem.t1, dt0=problem.dt0,
        max_steps=static.max_steps, throw=False, init_state=problem.init_state,
        passed_solver_state=False, passed_controller_state=False,
        progress_meter=static.progress_meter)
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


@full_precision
def _backward(stored, out_bar, perturbed, problem, static):
    if isinstance(stored, _LoopVJP):
        # Zeros where the output's cotangent is symbolic.
        bar = jax.tree.map(lambda b, x: (jnp.zeros_like(x) if b is None else b)
                           if eqx.is_inexact_array(x) else None, out_bar, stored.out,
                           is_leaf=is_none)
        (problem_bar,) = stored.pull(bar)
        return problem_bar
    problem = jax.tree.map(typed_literal_as_array, problem)
    terms, t0, t1, y0 = problem.terms, problem.t0, problem.t1, problem.init_state.y
    tableau, solver = static.tableau, static.solver
    flat_y0, unravel = ravel_pytree(y0)
    flat = lambda y: ravel_pytree(y)[0]  # noqa: E731
    zero = jnp.zeros_like(flat_y0)
    # Cotangents of the saved states: ȳ₀ direct, ȳ at the last step's end, at the save
    # times inside the steps (`save_ts`, as diffrax saw them).
    y0_bar, final_bar, save_ts, save_bar = _saves_bar(out_bar.ys, problem.saveat, y0)
    final_bar = zero if final_bar is None else final_bar

    a = np.zeros((tableau.num_stages, tableau.num_stages))
    for i, row in enumerate(tableau.a_lower):
        a[i + 1, : i + 1] = row
    b = np.asarray(tableau.b_sol)
    c = np.concatenate([[tableau.c1], np.asarray(tableau.c)])
    # Without saves inside steps only the stages that reach the solution count (Tsit5's
    # first-same-as-last stage does not: one evaluation and one VJP fewer per step).
    stages = tableau.num_stages if save_ts is not None else 1 + max(
        i for i in range(tableau.num_stages) if b[i] != 0 or np.any(a[i + 1:, i] != 0))
    a, b, c = a[:stages, :stages], b[:stages], c[:stages]
    a, b, c = (jnp.asarray(x, flat_y0.dtype) for x in (a, b, c))
    # Only the perturbed leaves of the terms and `args`: a cotangent for every parameter of
    # the system costs more.
    diff_p, static_p = eqx.partition((terms, problem.args), (perturbed.terms, perturbed.args))

    def rates(t, y, diff_p, static_p, solver_state, t_start):
        terms, args = eqx.combine(diff_p, static_p)
        if static.step_args is not None:
            args = static.step_args(args, solver_state, t_start)
        return flat(terms.vf(t, unravel(y), args))

    own_vjp = isinstance(_terms_within(terms)[0], ODETermWithVJP)
    # Larger states: each stage's linearization is kept from the stages' recomputation
    # (`jax.vjp`'s residuals, stacked over the stages) and only transposed on the way back,
    # instead of evaluating the right-hand side again inside each stage's product.
    linearized = not own_vjp and flat_y0.size >= LINEARIZED_MIN_SIZE
    if own_vjp:  # the term's own product
        # `diffeqsolve` solves in the time `direction × t`: the control of its wrapper of
        # the ODE term over a unit step is `direction`.
        direction = terms.contr(jnp.zeros_like(t0), jnp.ones_like(t0))

        def stage_vjp(t, y, diff_p, static_p, solver_state, t_start, cotangent):
            terms, args = eqx.combine(diff_p, static_p)
            y_bar, args_bar = _terms_within(terms)[0].stage_vjp(
                direction * t, unravel(y), args, solver_state, t_start, unravel(cotangent))
            return flat(y_bar), (jax.tree.map(jnp.zeros_like, diff_p[0]),
                                 eqx.partition(args_bar, perturbed.args)[0])
    else:
        # The stage's vector–Jacobian product re-traced as one scalar graph (constants
        # folded, the transposed structural operations gone), which XLA runs faster under
        # `vmap` (the batch-loss gradient of `experiments/bench_batch.py`). Everything
        # it reads is an argument: `scalarize` traces it on its own.
        @scalarize
        def scalar_stage_vjp(t, y, diff_p, static_p, solver_state, t_start, cotangent):
            _, pull = jax.vjp(
                lambda y, p: rates(t, y, p, static_p, solver_state, t_start), y, diff_p)
            return pull(cotangent)

        stage_vjp = scalar_stage_vjp

    def sweep(steps, solver_state, start, end_bar, save_bar, p_bar):
        """The cotangents of the start state `start = (t, y)` of the stored `steps` (end
        times, states, count) and of the terms and `args` (added to `p_bar`), from the
        cotangent `end_bar` of the last step's end and `save_bar` of the states saved at
        `save_ts` inside the steps."""
        step_ts, step_ys, count = steps
        t0, flat_y0 = start
        stored_state = lambda i: flat(jax.tree.map(lambda x: x[i], step_ys))  # noqa: E731
        if save_ts is not None:  # the step that saved each `ts[j]`: the first ending at or
            # after it (diffrax fills the times of steps not taken with inf)
            save_step = jnp.searchsorted(step_ts, save_ts, side="left")

        def linearize(t, y, t_start):
            """The rate and its pullback's residuals (and their tree)."""
            rate, pull = jax.vjp(lambda y_, p_: rates(t, y_, p_, static_p, solver_state,
                                                      t_start), y, diff_p)
            leaves, tree = jax.tree_util.tree_flatten(pull)
            return rate, leaves, tree

        def step_back(k, carry):
            end_bar, p_bar, kept = carry
            if linearized:  # its two stage loops compile as separate kernels
                end_bar = kernel_boundary(end_bar)
            n = count - 1 - k
            first = n == 0
            t_start = jnp.where(first, t0, step_ts[jnp.maximum(n - 1, 0)])
            y_start = jnp.where(first, flat_y0, stored_state(jnp.maximum(n - 1, 0)))
            t_end, y_end = step_ts[n], stored_state(n)
            dt = t_end - t_start
            h = terms.contr(t_start, t_end)  # `dt` times the solve's direction

            def stage(i, k_stages):
                y_stage = y_start + h * (a[i] @ k_stages)
                return k_stages.at[i].set(rates(t_start + c[i] * dt, y_stage, diff_p,
                                                static_p, solver_state, t_start))

            k_init = jnp.zeros((stages, flat_y0.size), zero.dtype)
            if linearized:
                pullbacks = {}

                def stage_linearized(i, carry):
                    k_stages, kept = carry
                    y_stage = y_start + h * (a[i] @ k_stages)
                    rate, leaves, pullbacks["tree"] = linearize(t_start + c[i] * dt, y_stage,
                                                                t_start)
                    return k_stages.at[i].set(rate), [
                        stack.at[i].set(leaf) for stack, leaf in zip(kept, leaves, strict=True)]

                k_stages, kept = jax.lax.fori_loop(0, stages, stage_linearized, (k_init, kept))
            else:
                k_stages = jax.lax.fori_loop(0, stages, stage, k_init)
            start_bar, stages_bar = end_bar, h * b[:, None] * end_bar[None, :]
            if save_ts is not None:  # states saved inside this step, through the dense output
                def interpolate(y_start, y_end, k_stages, t):
                    dense = solver.interpolation_cls(
                        t0=t_start, t1=t_end, y0=unravel(y_start), y1=unravel(y_end),
                        k=jax.vmap(unravel)(h * k_stages))
                    return flat(dense.evaluate(t))

                def save_back(j, bars):
                    start_bar, end_inner, stages_bar = bars
                    _, pull = jax.vjp(lambda *x: interpolate(*x, save_ts[j]), y_start, y_end,
                                      k_stages)
                    s_bar, e_bar, k_bar = pull(save_bar[j])
                    return start_bar + s_bar, end_inner + e_bar, stages_bar + k_bar

                first_save, end_save = (jnp.searchsorted(save_step, n, side=side)
                                        for side in ("left", "right"))
                start_bar, end_extra, stages_bar = jax.lax.fori_loop(
                    first_save, end_save, save_back, (start_bar, zero, stages_bar))
                # y_end = y_start + h Σ bᵢ kᵢ: its cotangent from the dense output flows
                # back too.
                start_bar = start_bar + end_extra
                stages_bar = stages_bar + h * b[:, None] * end_extra[None, :]

            def stage_back(ii, bars):
                stages_bar, start_bar, p_bar = bars
                i = stages - 1 - ii
                if linearized:
                    pull = jax.tree_util.tree_unflatten(pullbacks["tree"],
                                                        [stack[i] for stack in kept])
                    mu, stage_p_bar = pull(stages_bar[i])
                else:
                    y_stage = y_start + h * (a[i] @ k_stages)
                    mu, stage_p_bar = stage_vjp(t_start + c[i] * dt, y_stage, diff_p,
                                                static_p, solver_state, t_start, stages_bar[i])
                stages_bar = stages_bar + h * a[i][:, None] * mu[None, :]
                return stages_bar, start_bar + mu, jax.tree.map(jnp.add, p_bar, stage_p_bar)

            _, start_bar, p_bar = jax.lax.fori_loop(
                0, stages, stage_back, (stages_bar, start_bar, p_bar),
                unroll=LINEARIZED_UNROLL if linearized else 1)
            return start_bar, p_bar, kept

        # One stack of the stages' values per residual, not one flat array of all of them:
        # concatenating the residuals and slicing them apart again made a stage's
        # linearization and product cost 22 instead of 19 µs on the chain of 64 links
        # (`experiments/bench_scaling.py --cpu-per-step`). Each step writes every stage's
        # row, so the stacks are carried from step to step rather than zeroed in each.
        kept = [] if not linearized else [
            jnp.zeros((stages,) + x.shape, x.dtype)
            for x in jax.eval_shape(lambda: linearize(t0, flat_y0, t0)[1])]
        start_bar, p_bar, _ = jax.lax.fori_loop(0, count, step_back, (end_bar, p_bar, kept))
        return start_bar, p_bar

    p_bar = jax.tree.map(jnp.zeros_like, diff_p)
    if static.segments is None:
        *steps, solver_state = stored
        start_bar, p_bar = sweep(steps, solver_state, (t0, flat_y0), final_bar, save_bar, p_bar)
    else:
        *steps, starts, count, unravel_start = stored

        def sweep_segment(i, steps_i, end_bar, p_bar):
            """Sweeps the segment `i`, whose steps are `steps_i`."""
            start = unravel_start(starts[i])
            save_bar_i = None if save_ts is None else jnp.where(
                ((save_ts > start[0]) | (i == 0))[:, None], save_bar, 0)
            solver_state = unravel_start(starts[i + 1])[2] if static.step_args else None
            return sweep(steps_i, solver_state, (start[0], flat(start[1])), end_bar,
                         save_bar_i, p_bar)

        def segment_back(k, bars):
            """Sweeps the segment `count − 1 − k`: the last one (`k = 0`) from its stored
            steps, the others re-solved from their checkpoints."""
            last = k == 0
            # Under `vmap` the loop runs as long as the longest member's: a member done
            # re-solves its first segment, a real one, whose result is not used.
            i = jnp.maximum(count - 1 - k, 0)
            # The last segment's re-solve starts at the solve's end and takes no step: one
            # copy of the sweep serves stored and re-solved steps, and no `lax.cond` on the
            # segment's index picks between them (under `vmap` that cond becomes a select
            # whose branches take every value they read as batched, `t1` included, and
            # XLA's algebraic simplifier then sinks that broadcast through diffrax's 100
            # `prevbefore`s of `t1` one operation per pass, and gives up with "stuck in a
            # circular simplification loop" messages).
            out = _segment(unravel_start(starts[jnp.where(last, count, i)]), problem, static)
            resolved = _resolved_steps(out, unravel_start(starts[i + 1])[0], t0, t1, ~last)
            steps_i = jax.tree.map(lambda s, r: jnp.where(last, s, r), tuple(steps),
                                   tuple(resolved))
            return sweep_segment(i, steps_i, *bars)

        if static.segments[0] == 1:
            start_bar, p_bar = sweep_segment(0, steps, final_bar, p_bar)
        else:
            start_bar, p_bar = jax.lax.fori_loop(0, count, segment_back, (final_bar, p_bar))
    y0_bar = unravel(start_bar if y0_bar is None else y0_bar + start_bar)
    terms_bar, args_bar = p_bar
    init_state_bar = eqx.tree_at(lambda s: s.y, nones(problem.init_state), y0_bar,
                                 is_leaf=is_none)
    return dataclasses.replace(nones(problem), terms=terms_bar, args=args_bar,
                               init_state=init_state_bar)


def _saves_bar(ys_bar, saveat, y0):
    """The cotangents of the saved states `ys_bar` (one per `SubSaveAt`, None where
    symbolic) as `(ȳ₀, ȳ at the end, save times, ȳ at the save times)` (flat; each None
    where none is saved), the save times of all `SubSaveAt`s in order."""
    subs = _subsaves(saveat)
    ys_bar = [None] * len(subs) if ys_bar is None else ys_bar
    y0_bar = final_bar = None
    times, bars = [], []
    for sub, bar in zip(subs, ys_bar, strict=True):
        at_ts = 0 if sub.ts is None else sub.ts.shape[0]
        rows = _rows_bar(bar, y0, sub.t0 + at_ts + sub.t1)
        if sub.t0:
            y0_bar = rows[0] if y0_bar is None else y0_bar + rows[0]
        if sub.ts is not None:
            times.append(sub.ts)
            bars.append(rows[int(sub.t0): int(sub.t0) + at_ts])
        if sub.t1:
            final_bar = rows[-1] if final_bar is None else final_bar + rows[-1]
    if len(times) <= 1:
        return y0_bar, final_bar, *(times + bars or [None, None])
    times, bars = jnp.concatenate(times), jnp.concatenate(bars)
    order = jnp.argsort(times, stable=True)
    return y0_bar, final_bar, times[order], bars[order]


def _resolved_steps(out, t_next, t0, t1, check=True):
    """`_steps` of a segment re-solved from its checkpoint, checked (where `check`) to end
    where the forward solve's segment ended (`t_next`, the next segment's start).

    The two solves are the same computation compiled in two programs, which XLA may round
    differently. Rounding moves the end by a few ulps; a step accepted in one and rejected
    in the other (a chaotic or badly scaled solve) moves it by a step. The sweep would then
    differentiate steps that the forward solve did not take, so that raises instead. (The
    check also keeps XLA from compiling the backward loop into one CPU kernel holding both
    the re-solve and the sweep, which runs the two-link gradient slower:
    experiments/diagnostics/README.md, "Design measurements".)"""
    steps = _steps(out)
    t_end, dtype = out.ts[-2][0], jnp.result_type(t_next)
    scale = jnp.max(jnp.abs(jnp.stack([t0, t1, t1 - t0])))
    elsewhere = ~(jnp.abs(t_end - t_next) <= np.sqrt(jnp.finfo(dtype).eps) * scale)
    return eqx.error_if(steps, elsewhere & check, _RESOLVED_ELSEWHERE)


_RESOLVED_ELSEWHERE = (
    "The gradient's backward pass re-solved a segment of the solve from its checkpoint "
    "(`jaxdae.ReverseSweepAdjoint` stores `stored_steps` steps at a time) and the re-solve "
    "ended at another time than the forward solve: the two took different steps, so the "
    "gradient would be of steps the solve did not take. This happens when rounding changes "
    "whether a step is accepted (a chaotic or badly scaled solve). Store every step, "
    "`adjoint=jaxdae.ReverseSweepAdjoint(stored_steps=max_steps)`, or differentiate "
    "through diffrax's loop, `adjoint=diffrax.RecursiveCheckpointAdjoint()`.")


def _steps(out):
    """The accepted steps' end times and states, and their number, of a `_segment` (its
    restart, saved first, left out)."""
    return (out.ts[-1][1:], jax.tree.map(lambda y: y[1:], out.ys[-1]),
            jnp.asarray(out.stats["num_accepted_steps"], jnp.int32) - 1)


def _rows_bar(rows, like, count):
    """Cotangents of `count` saved rows of the state `like` as a `(count, size)` array
    (zeros where symbolic)."""
    flat_like = ravel_pytree(like)[0]
    dtype = flat_like.dtype
    if rows is None:
        return jnp.zeros((count, flat_like.size), dtype)
    leaves = [jnp.zeros((count,) + jnp.shape(x), dtype) if r is None else r
              for r, x in zip(jax.tree.leaves(rows, is_leaf=lambda r: r is None),
                              jax.tree.leaves(like), strict=False)]
    return jnp.concatenate([leaf.reshape(count, -1) for leaf in leaves], axis=1)


_swept.def_fwd(_forward)
_swept.def_bwd(_backward)
