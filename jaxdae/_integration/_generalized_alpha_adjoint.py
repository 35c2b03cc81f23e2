"""Gradients of a [`jaxdae.GeneralizedAlpha`][] solve by the discrete adjoint of its steps,
swept over the accepted steps from the last to the first.

The forward solve is diffrax's loop, which also records the end time of every accepted
step. The backward pass replays those steps at the recorded times (the same step function,
no step-size control), keeping their states, and applies each step's adjoint in reverse:
the step's equations `r(x, p) = 0` for its new positions and scaled multipliers `x` give
`x̄ᵀ dx = −wᵀ ∂r/∂p dp` with `(∂r/∂x)ᵀ w = x̄` (implicit function theorem; `∂r/∂x`
exact, from the linearization of `r` at the step's solution, and one LU factorization),
and the `a`, `q̈`, `v` of the step's end are affine in `x` and the start (Arnold & Brüls
2007, the step of [`jaxdae.GeneralizedAlpha`][]).

Differentiating diffrax's loop instead (`diffrax.RecursiveCheckpointAdjoint`) recomputes
the steps between its checkpoints in the backward pass, in another compiled program:
rounding there can change an adaptive decision (a step accepted or rejected, its next
size), so that the recomputed steps are not those of the forward solve and the gradient
depends on the number of checkpoints. Replayed at the recorded times, every step is the
forward solve's own to rounding.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._linalg import full_precision, lu_factor, lu_solve
from ._generalized_alpha import GeneralizedAlpha
from ._sweep_backward import saves_bar
from ._sweep_forward import (
    SAVE_Y,
    AbstractStoredStepsAdjoint,
    LoopVJP,
    SweepProblem,
    final_state,
    is_none,
    loop_solve,
    nones,
    solve_saving_steps,
    subsaves,
    typed_literal_as_array,
    unwrapped,
)


class GeneralizedAlphaAdjoint(AbstractStoredStepsAdjoint):
    """Differentiates a [`jaxdae.GeneralizedAlpha`][] solve by the discrete adjoint of its
    accepted steps: the backward pass replays each step at the time the forward solve
    recorded and applies its adjoint, from the implicit function theorem at the step's
    solution (Arnold & Brüls 2007), from the last step to the first; replayed rather than
    recomputed under step-size control, the steps are the forward solve's own, so the
    gradient does not depend on how the solve is segmented. The default adjoint of `simulate` for that solver
    with an integer `max_steps`.

    - **Memory**: the forward solve keeps one time per step of `max_steps`. The backward
      pass replays the steps in segments of at most `stored_steps`, each from a
      checkpoint of the solver's state (one per `stored_steps` steps of `max_steps`),
      and keeps one segment's states at a time (`stored_steps × (4n + m)` floats for `n`
      coordinates and `m` constraints; docs/design_measurements.md#generalized-alpha-adjoint).
    - **The gradient** is that of the computed solution with the accepted step sizes held
      constant (as diffrax's step-size controllers hold them), through the consistent
      accelerations at `t0` that start the method: the gradient of
      `diffrax.RecursiveCheckpointAdjoint` with one checkpoint per step, whatever
      `stored_steps`.
    - **Solves**: saves at `t0`, `ts` and `t1` (interpolated inside the steps), events
      without a root finder. Other solves (a dense output, saved steps or controller
      state, an event's root finder, `max_steps=None`, a solver or controller state
      passed to `diffeqsolve`), and gradients with respect to `t0`, `t1` or the save
      times, differentiate diffrax's loop instead (`CHECKPOINTS` checkpoints). Reverse
      mode only.

    **Arguments:**

    - `stored_steps`: the most steps whose states the backward pass keeps at once.
    """

    def loop(self, *, args, terms, solver, stepsize_controller, event, saveat, t0, t1, dt0,
             max_steps, throw, init_state, passed_solver_state, passed_controller_state,
             progress_meter):
        method = _method(solver)
        if not _sweepable(saveat, event, max_steps, passed_solver_state,
                          passed_controller_state):
            # What the sweep does not replay is differentiated through diffrax's loop.
            return diffrax.RecursiveCheckpointAdjoint(checkpoints=_thresholds.CHECKPOINTS).loop(
                args=args, terms=terms, solver=solver, stepsize_controller=stepsize_controller,
                event=event, saveat=saveat, t0=t0, t1=t1, dt0=dt0, max_steps=max_steps,
                throw=throw, init_state=init_state, passed_solver_state=passed_solver_state,
                passed_controller_state=passed_controller_state, progress_meter=progress_meter)
        static = _Static(solver=solver, stepsize_controller=stepsize_controller, event=event,
                         progress_meter=progress_meter, max_steps=max_steps,
                         stored_steps=min(self.stored_steps, max_steps), method=method)
        problem = SweepProblem(terms=terms, args=args, init_state=init_state, t0=t0, t1=t1,
                               dt0=dt0, saveat=saveat)
        return final_state(init_state, _swept(problem, static), saveat), {}


class _Static(eqx.Module):
    """The non-differentiated configuration of the swept solve (as `SweepOptions`)."""

    solver: diffrax.AbstractSolver
    stepsize_controller: diffrax.AbstractStepSizeController
    event: diffrax.Event | None
    progress_meter: diffrax.AbstractProgressMeter
    max_steps: int = eqx.field(static=True)
    stored_steps: int = eqx.field(static=True)
    method: GeneralizedAlpha


def _method(solver) -> GeneralizedAlpha:
    solver = unwrapped(solver)
    if not isinstance(solver, GeneralizedAlpha):
        raise ValueError("`GeneralizedAlphaAdjoint` differentiates `jaxdae.GeneralizedAlpha` "
                         f"solves; got {type(solver).__name__}. Use the default adjoint "
                         "(`adjoint=None`) for this solver.")
    return solver


def _sweepable(saveat, event, max_steps, passed_solver_state, passed_controller_state) -> bool:
    """Whether the sweep can differentiate the solve: saves of the state itself at `t0`,
    `ts` and `t1` (no dense output, no saved steps, controller state or `made_jump`), no
    event located by a root finder, a step limit, the solver's and controller's states
    made by `diffeqsolve`."""
    return (max_steps is not None and not (
        saveat.dense or saveat.controller_state or saveat.made_jump or passed_solver_state
        or passed_controller_state) and all(
            not sub.steps and sub.fn is SAVE_Y for sub in subsaves(saveat))
        and (event is None or event.root_finder is None))


@eqx.filter_custom_vjp
def _swept(problem, static):
    # Without reverse mode nothing is recorded: the solve is diffrax's.
    return loop_solve(problem, static)


def _time(t, y, args):
    del y, args
    return t


def _forward(perturbed, problem, static):
    if any(jax.tree.leaves((perturbed.t0, perturbed.t1, perturbed.dt0, perturbed.saveat))):
        # The steps' times are constants of the sweep.
        return LoopVJP.of(problem, static)
    output, (step_ts, _, steps, _) = solve_saving_steps(problem, static, _time, False)
    return output, (step_ts, jnp.asarray(steps, jnp.int32))


class _Records(eqx.Module):
    """The states at the starts of a segment's steps and at its end: positions,
    velocities, `a`, `q̈` and the multipliers (rows `0 … stored_steps`)."""

    q: jax.Array
    v: jax.Array
    a: jax.Array
    qdd: jax.Array
    lam: jax.Array

    def row(self, i):
        return jax.tree.map(lambda x: x[i], self)


@full_precision
def _backward(stored, out_bar, perturbed, problem, static):
    if isinstance(stored, LoopVJP):
        return stored(out_bar)
    problem = jax.tree.map(typed_literal_as_array, problem)
    step_ts, count = stored
    method, length = static.method, static.stored_steps
    t0, (q0, v0) = problem.t0, problem.init_state.y
    n = q0.shape[0]
    y0_bar, final_bar, save_ts, save_bar = saves_bar(out_bar.ys, problem.saveat, (q0, v0))
    diff_args, static_args = eqx.partition(problem.args, perturbed.args)
    times = jnp.concatenate([jnp.reshape(t0, (1,)), step_ts])  # step k: times[k] → times[k+1]
    save_step = None if save_ts is None else jnp.searchsorted(step_ts, save_ts, side="left")

    def advance(k, state):
        y, solver_state = state
        y1, _, _, solver_state1, _ = method.step(problem.terms, times[k], times[k + 1], y,
                                                 problem.args, solver_state, False)
        return y1, solver_state1

    # Pass 1: the checkpoints at the segments' starts (none to replay for one segment).
    segments = -(-count // length)
    start = (problem.init_state.y, problem.init_state.solver_state)
    checkpoints = jax.tree.map(
        lambda x: jnp.zeros((-(-static.max_steps // length),) + jnp.shape(x), x.dtype), start)

    def checkpoint(j, carry):
        state, checkpoints = carry
        checkpoints = jax.tree.map(lambda c, x: c.at[j].set(x), checkpoints, state)
        state = jax.lax.fori_loop(j * length, (j + 1) * length, advance, state)
        return state, checkpoints

    last, checkpoints = jax.lax.fori_loop(0, segments - 1, checkpoint, (start, checkpoints))
    checkpoints = jax.tree.map(lambda c, x: c.at[segments - 1].set(x), checkpoints, last)

    def record(state):
        (q, v), (a, qdd, lam, _) = state
        return _Records(q, v, a, qdd, lam)

    empty = jax.tree.map(lambda x: jnp.zeros((length + 1,) + x.shape, x.dtype),
                         record(start))
    zero_n = jnp.zeros_like(q0)
    end_bar = (final_bar[:n], final_bar[n:], zero_n, zero_n)
    args_bar = jax.tree.map(jnp.zeros_like, diff_args)

    def step_back(k, records, i, bars):
        """The cotangents at the start of step `k` (row `i` of `records`) from those at
        its end."""
        (q_bar, v_bar, a_bar, qdd_bar), args_bar = bars
        ta, tb = times[k], times[k + 1]
        begin, end = records.row(i), records.row(i + 1)
        inputs = (begin.q, begin.v, begin.a, begin.qdd)
        prepared = method.prepare(ta, tb, *inputs)
        x = jnp.concatenate([end.q, prepared.c * end.lam])
        if save_ts is not None:  # states saved inside this step, by the dense output
            (q_bar, v_bar, qdd_bar), start_saves = _saves_back(
                ta, tb, begin, end, k, save_ts, save_step, save_bar, (q_bar, v_bar, qdd_bar))
        else:
            start_saves = None

        def through(inputs, diff_args, x):
            step = method.prepare(ta, tb, *inputs)
            args = eqx.combine(diff_args, static_args)
            residual = method.residual(x, args[0], tb, step)
            q1 = x[:n]
            v1, qdd1, a1 = step.unpack(q1)
            return residual, (q1, v1, a1, qdd1)

        # The end's `q`, `v`, `a`, `q̈` are affine in its positions (`_Step.unpack`):
        # `∂v/∂q = γ/(hβ)`, `∂a/∂q = 1/(h²β)`, `∂q̈/∂q = 1/c`; the multipliers do not enter.
        x_bar = jnp.concatenate([
            q_bar + (prepared.gamma / (prepared.h * prepared.beta)) * v_bar
            + a_bar / prepared.hb + qdd_bar / prepared.c, jnp.zeros_like(end.lam)])
        (residual, ends), pull = jax.vjp(through, inputs, diff_args, x)
        # The rows of `∂r/∂x` from the same linearization, one product per row.
        no_ends = jax.tree.map(jnp.zeros_like, ends)
        jacobian = jax.vmap(lambda e: pull((e, no_ends))[2])(
            jnp.eye(residual.shape[0], dtype=residual.dtype))
        w = lu_solve(lu_factor(jacobian.T), x_bar)
        inputs_bar, step_args_bar, _ = pull((-w, (q_bar, v_bar, a_bar, qdd_bar)))
        if start_saves is not None:
            inputs_bar = (inputs_bar[0] + start_saves[0], inputs_bar[1] + start_saves[1],
                          inputs_bar[2], inputs_bar[3] + start_saves[2])
        return inputs_bar, jax.tree.map(jnp.add, args_bar, step_args_bar)

    def segment_back(jj, bars):
        j = segments - 1 - jj
        first = j * length
        steps = jnp.minimum(length, count - first)
        state = jax.tree.map(lambda c: c[j], checkpoints)

        def replay(i, carry):
            state, records = carry
            records = jax.tree.map(lambda r, x: r.at[i].set(x), records, record(state))
            return advance(first + i, state), records

        state, records = jax.lax.fori_loop(0, steps, replay, (state, empty))
        records = jax.tree.map(lambda r, x: r.at[steps].set(x), records, record(state))
        return jax.lax.fori_loop(
            0, steps, lambda ii, bars: step_back(first + steps - 1 - ii, records,
                                                 steps - 1 - ii, bars), bars)

    (q_bar, v_bar, a_bar, qdd_bar), args_bar = jax.lax.fori_loop(
        0, segments, segment_back, (end_bar, args_bar))

    def start(y0, diff_args):  # the consistent accelerations at `t0`: `a₀ = q̈₀`
        a, qdd, _, _ = method.init(problem.terms, t0, problem.t1, y0,
                                   eqx.combine(diff_args, static_args))
        return a, qdd

    _, pull_start = jax.vjp(start, (q0, v0), diff_args)
    (q0_bar, v0_bar), init_args_bar = pull_start((a_bar, qdd_bar))
    args_bar = jax.tree.map(jnp.add, args_bar, init_args_bar)
    start_bar = jnp.concatenate([q_bar + q0_bar, v_bar + v0_bar])
    if y0_bar is not None:
        start_bar = start_bar + y0_bar
    init_state_bar = eqx.tree_at(lambda s: s.y, nones(problem.init_state),
                                 (start_bar[:n], start_bar[n:]), is_leaf=is_none)
    return dataclasses.replace(nones(problem), args=args_bar, init_state=init_state_bar)


def _saves_back(ta, tb, begin, end, k, save_ts, save_step, save_bar, end_bars):
    """The cotangents of the states saved inside step `k` (cubic Hermite interpolation,
    as the solver's dense output), added to those of its end `(q̄, v̄, q̈̄)`, and those of
    its start `(q̄, v̄, q̈̄)`."""
    n = begin.q.shape[0]
    h = tb - ta

    def interpolate(q0, v0, qdd0, q1, v1, qdd1, t):
        dense = diffrax.ThirdOrderHermitePolynomialInterpolation(
            t0=ta, t1=tb, y0=jnp.concatenate([q0, v0]), y1=jnp.concatenate([q1, v1]),
            k0=h * jnp.concatenate([v0, qdd0]), k1=h * jnp.concatenate([v1, qdd1]))
        return dense.evaluate(t)

    def save_back(j, bars):
        start, finish = bars
        _, pull = jax.vjp(lambda *x: interpolate(*x, save_ts[j]), begin.q, begin.v,
                          begin.qdd, end.q, end.v, end.qdd)
        cot = pull(save_bar[j])
        return (tuple(s + c for s, c in zip(start, cot[:3], strict=True)),
                tuple(f + c for f, c in zip(finish, cot[3:], strict=True)))

    first, last = (jnp.searchsorted(save_step, k, side=side) for side in ("left", "right"))
    zeros = tuple(jnp.zeros((n,), begin.q.dtype) for _ in range(3))
    start, finish = jax.lax.fori_loop(first, last, save_back, (zeros, zeros))
    return tuple(e + f for e, f in zip(end_bars, finish, strict=True)), start


_swept.def_fwd(_forward)
_swept.def_bwd(_backward)
