"""Gradients of a [`jaxdae.GeneralizedAlpha`][] solve by the discrete adjoint of its steps,
swept over the accepted steps from the last to the first.

The forward solve is diffrax's loop, which also records the end time of every accepted
step. The backward pass replays those steps at the recorded times (the same step function,
no step-size control), keeping their states, and applies each step's adjoint in reverse:
the step's equations `r(x, p) = 0` for its new positions and scaled multipliers `x` give
`x̄ᵀ dx = −wᵀ ∂r/∂p dp` with `(∂r/∂x)ᵀ w = x̄` (implicit function theorem, with the
exact `∂r/∂x` of the linearization of `r` at the step's solution), and the `a`, `q̈`, `v`
of the step's end are affine in `x` and the start (Arnold & Brüls 2007, the step of
[`jaxdae.GeneralizedAlpha`][]). `(∂r/∂x)ᵀ w = x̄` is solved to rounding by iterative
refinement with the factorization of a later step's exact `(∂r/∂x)ᵀ` (its inverse, or
for a large saddle point its sparse LU factors), kept from step to step as the forward
solve keeps its Newton matrix, and rebuilt (one vector–Jacobian product per unknown, or
one tangent per colour group of its columns on its sparsity) only where the refinement
does not converge quickly (`_adjoint_solve`).

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
from jax.flatten_util import ravel_pytree

from .. import _thresholds
from .._compilation._linalg import full_precision, inverse
from .._compilation._private_apis import unvmap_max
from .._compilation._supernodal_lu import saddle_point_plan, supernodal_lu
from ._generalized_alpha import GeneralizedAlpha
from ._generalized_alpha_newton import AbstractNewtonFactor, DenseInverse, SparseLU
from ._jacobian import sparse_jacobian
from ._sweep_backward import _rows_bar, saves_bar
from ._sweep_forward import (
    SAVE_Y,
    AbstractStoredStepsAdjoint,
    LoopVJP,
    SweepProblem,
    final_state,
    is_none,
    loop_solve,
    nones,
    saves_by_step,
    solve_saving_steps,
    subsaves,
    typed_literal_as_array,
    unwrapped,
    warn_checkpointed,
    where_taken,
)
from ._term import system_term

# Iterative refinement of a step's adjoint equations with the inverse kept from a later
# step: at most this many corrections, each at least this factor smaller than the last,
# before the step's own matrix is built (`_adjoint_solve`; 0: every step's own matrix,
# the comparison of `stiff_integration.py --study gradient_segments`).
_REFINE_ITERATIONS = 10
_REFINE_RATE = 0.1

# Corrections below this many units of rounding of the largest entry end the refinement.
_ROUNDING_UNITS = 4
# Corrections that stop shrinking below this many units of rounding have reached what
# refinement in working precision attains (about the rounding unit times the matrix's
# condition number: a few dozen units on the meshes of bars), which a new matrix's solve
# and its corrections reach too; they end the refinement as well.
_ATTAINABLE_UNITS = 1024


class GeneralizedAlphaAdjoint(AbstractStoredStepsAdjoint):
    """Differentiates a [`jaxdae.GeneralizedAlpha`][] solve by the discrete adjoint of its
    accepted steps: the backward pass replays each step at the time the forward solve
    recorded and applies its adjoint, from the implicit function theorem at the step's
    solution (Arnold & Brüls 2007), from the last step to the first; replayed rather than
    recomputed under step-size control, the steps are the forward solve's own, so the
    gradient does not depend on how the solve is segmented. The default adjoint of
    `simulate` for that solver with an integer `max_steps`.

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
    - **Solves**: saves at `t0`, `ts` (interpolated inside the steps), `t1` and every
      step's end (`SubSaveAt(steps=True)`), events without a root finder. Other solves (a
      dense output, states saved every few steps, a saved controller state,
      `SubSaveAt(fn=...)`, an event's root finder, `max_steps=None`, a solver or
      controller state passed to `diffeqsolve`), and gradients with respect to `t0`,
      `t1`, `dt0` or the save times, differentiate diffrax's loop instead (`CHECKPOINTS`
      checkpoints). With adaptive steps that gradient can differ from the solve's own
      by up to about the tolerance (the recomputed steps need not be the forward
      solve's), and a `UserWarning` says so when the solve is traced, naming the fix:
      a replayable solve, fixed steps, or
      `adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=max_steps)`. Reverse
      mode only.

    **Arguments:**

    - `stored_steps`: the most steps whose states the backward pass keeps at once.
    """

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
        method = _method(solver)
        unreplayed = _not_replayed(
            saveat, event, max_steps, passed_solver_state, passed_controller_state
        )
        if unreplayed is not None:
            # What the sweep does not replay is differentiated through diffrax's loop.
            warn_checkpointed(stepsize_controller, *unreplayed)
            return diffrax.RecursiveCheckpointAdjoint(checkpoints=_thresholds.CHECKPOINTS).loop(
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
        static = _Static(
            solver=solver,
            stepsize_controller=stepsize_controller,
            event=event,
            progress_meter=progress_meter,
            max_steps=max_steps,
            stored_steps=min(self.stored_steps, max_steps),
            method=method,
        )
        problem = SweepProblem(
            terms=terms, args=args, init_state=init_state, t0=t0, t1=t1, dt0=dt0, saveat=saveat
        )
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
        raise ValueError(
            "`GeneralizedAlphaAdjoint` differentiates `jaxdae.GeneralizedAlpha` "
            f"solves; got {type(solver).__name__}. Use the default adjoint "
            "(`adjoint=None`) for this solver."
        )
    return solver


def _not_replayed(
    saveat, event, max_steps, passed_solver_state, passed_controller_state
) -> tuple[str, str] | None:
    """`(what, fix)` for a solve that the sweep cannot replay, None for one it can: it
    replays saves of the state itself at `t0`, `ts`, `t1` and every step's end (no dense
    output, no controller state or `made_jump`), without an event located by a root
    finder, with a step limit, from the solver's and controller's states that
    `diffeqsolve` made. (The rows of a `SubSaveAt` that saves every few steps, or at
    steps and at `ts`, follow the order in which the solve reached them, which the sweep
    does not record.)"""
    if max_steps is None:
        return "`max_steps=None`", "pass an integer `max_steps`"
    for sub in subsaves(saveat):
        if sub.steps and (sub.steps != 1 or sub.ts is not None):
            return (
                "states saved every few steps, or at steps and at `ts` in one `SubSaveAt`",
                "save every step (`SubSaveAt(steps=True)`) and the times "
                "in `SubSaveAt`s of their own",
            )
    if saveat.dense:
        return "a dense output (`SaveAt(dense=True)`)", "save at `SaveAt(ts=...)` instead"
    if saveat.controller_state or saveat.made_jump:
        return (
            "the controller's state or `made_jump` (`SaveAt(controller_state=True)`, "
            "`SaveAt(made_jump=True)`)",
            "leave them unsaved",
        )
    for sub in subsaves(saveat):
        if sub.fn is not SAVE_Y:
            return (
                "a function of the saved states (`SaveAt(fn=fn)`)",
                "apply `fn` to the saved states instead",
            )
    if event is not None and event.root_finder is not None:
        return (
            "an event located by a root finder",
            "pass `diffrax.Event(cond_fn)` without a `root_finder` (the solve stops at "
            "the end of the step where it triggers)",
        )
    if passed_solver_state or passed_controller_state:
        return (
            "a solver or controller state passed to `diffeqsolve`",
            "start the solve from the state that `diffeqsolve` makes",
        )
    return None


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
        warn_checkpointed(
            static.stepsize_controller,
            "a gradient with respect to `t0`, `t1`, `dt0` or the save times",
            "hold them constant (`jax.lax.stop_gradient`)",
        )
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
    ys_bar, saveat, steps_y0_bar, steps_bar = _saved_steps_bar(
        out_bar.ys, problem.saveat, (q0, v0), static.max_steps
    )
    y0_bar, final_bar, save_ts, save_bar = saves_bar(ys_bar, saveat, (q0, v0))
    if steps_y0_bar is not None:
        y0_bar = steps_y0_bar if y0_bar is None else y0_bar + steps_y0_bar
    final_bar = jnp.zeros(2 * n, q0.dtype) if final_bar is None else final_bar
    # The method reads the system from the term: the gradient is the term's.
    diff_terms, static_terms = eqx.partition(problem.terms, perturbed.terms)
    times = jnp.concatenate([jnp.reshape(t0, (1,)), step_ts])  # step k: times[k] → times[k+1]
    saves_from = None if save_ts is None else saves_by_step(step_ts, save_ts)
    # Under `vmap` the members' step counts differ: the loops run to the batch's largest
    # count with unbatched counters, and a step past a member's own count leaves its carry
    # as it was (docs/design_measurements.md#adjoints-under-vmap).
    most = unvmap_max(count)

    def advance(k, state):
        y, solver_state = state
        y1, _, _, solver_state1, _ = method.step(
            problem.terms, times[k], times[k + 1], y, problem.args, solver_state, False
        )
        return y1, solver_state1

    # Pass 1: the checkpoints at the segments' starts (none to replay for one segment).
    segments = -(-most // length)
    start = (problem.init_state.y, problem.init_state.solver_state)
    checkpoints = jax.tree.map(
        lambda x: jnp.zeros((-(-static.max_steps // length),) + jnp.shape(x), x.dtype), start
    )

    def checkpoint(j, carry):
        state, checkpoints = carry
        checkpoints = jax.tree.map(lambda c, x: c.at[j].set(x), checkpoints, state)
        state = jax.lax.fori_loop(
            j * length,
            (j + 1) * length,
            lambda k, s: where_taken(k < count, advance(k, s), s),
            state,
        )
        return state, checkpoints

    last, checkpoints = jax.lax.fori_loop(0, segments - 1, checkpoint, (start, checkpoints))
    checkpoints = jax.tree.map(lambda c, x: c.at[segments - 1].set(x), checkpoints, last)

    def record(state):
        (q, v), (a, qdd, lam, _) = state
        return _Records(q, v, a, qdd, lam)

    empty = jax.tree.map(lambda x: jnp.zeros((length + 1,) + x.shape, x.dtype), record(start))
    zero_n = jnp.zeros_like(q0)
    end_bar = (final_bar[:n], final_bar[n:], zero_n, zero_n)
    terms_bar = jax.tree.map(jnp.zeros_like, diff_terms)

    def through_step(ta, tb):
        """The step's equations and its end's `(q, v, a, q̈)` from its start and `x`."""

        def through(inputs, diff_terms, x):
            step = method.prepare(ta, tb, *inputs)
            terms = eqx.combine(diff_terms, static_terms)
            residual = method.residual(x, system_term(terms).system, tb, step)
            q1 = x[:n]
            v1, qdd1, a1 = step.unpack(q1)
            return residual, (q1, v1, a1, qdd1)

        return through

    def step_back(k, records, i, carry):
        """The cotangents at the start of step `k` (row `i` of `records`) from those at
        its end, and the factorized matrix to keep."""
        bars, kept = carry
        (q_bar, v_bar, a_bar, qdd_bar), terms_bar = bars
        if steps_bar is not None:  # the state saved at the step's end
            q_bar, v_bar = q_bar + steps_bar[k, :n], v_bar + steps_bar[k, n:]
        ta, tb = times[k], times[k + 1]
        begin, end = records.row(i), records.row(i + 1)
        inputs = (begin.q, begin.v, begin.a, begin.qdd)
        prepared = method.prepare(ta, tb, *inputs)
        x = jnp.concatenate([end.q, prepared.c * end.lam])
        if save_ts is not None:  # states saved inside this step, by the dense output
            (q_bar, v_bar, qdd_bar), start_saves = _saves_back(
                ta,
                tb,
                begin,
                end,
                (saves_from[k], saves_from[k + 1]),
                save_ts,
                save_bar,
                (q_bar, v_bar, qdd_bar),
            )
        else:
            start_saves = None

        through = through_step(ta, tb)

        # The end's `q`, `v`, `a`, `q̈` are affine in its positions (`_Step.unpack`):
        # `∂v/∂q = γ/(hβ)`, `∂a/∂q = 1/(h²β)`, `∂q̈/∂q = 1/c`; the multipliers do not enter.
        x_bar = jnp.concatenate(
            [
                q_bar
                + (prepared.gamma / (prepared.h * prepared.beta)) * v_bar
                + a_bar / prepared.hb
                + qdd_bar / prepared.c,
                jnp.zeros_like(end.lam),
            ]
        )
        (residual, ends), pull = jax.vjp(through, inputs, diff_terms, x)
        no_ends = jax.tree.map(jnp.zeros_like, ends)
        transposed = lambda w: pull((w, no_ends))[2]  # noqa: E731
        w, kept = _adjoint_solve(
            transposed,
            x_bar,
            kept,
            lambda: _transposed_factor(
                lambda y: through(inputs, diff_terms, y)[0], transposed, x, n
            ),
        )
        inputs_bar, step_terms_bar, _ = pull((-w, (q_bar, v_bar, a_bar, qdd_bar)))
        if start_saves is not None:
            inputs_bar = (
                inputs_bar[0] + start_saves[0],
                inputs_bar[1] + start_saves[1],
                inputs_bar[2],
                inputs_bar[3] + start_saves[2],
            )
        return (inputs_bar, jax.tree.map(jnp.add, terms_bar, step_terms_bar)), kept

    def segment_back(jj, carry):
        j = segments - 1 - jj
        first = j * length
        steps = jnp.minimum(length, most - first)  # of the member with the most
        state = jax.tree.map(lambda c: c[j], checkpoints)

        def replay(i, carry):
            state, records = carry
            records = jax.tree.map(lambda r, x: r.at[i].set(x), records, record(state))
            return where_taken(first + i < count, advance(first + i, state), state), records

        state, records = jax.lax.fori_loop(0, steps, replay, (state, empty))
        records = jax.tree.map(lambda r, x: r.at[steps].set(x), records, record(state))
        # The kept matrix goes on from segment to segment, so that the steps' solves do
        # not depend on how the steps are segmented.
        return jax.lax.fori_loop(
            0,
            steps,
            lambda ii, carry: where_taken(
                first + steps - 1 - ii < count,
                step_back(first + steps - 1 - ii, records, steps - 1 - ii, carry),
                carry,
            ),
            carry,
        )

    begin = record(start)
    size = n + begin.lam.shape[0]
    if size <= _thresholds.LOOPED_INVERSE_MAX:
        factor = DenseInverse(jnp.zeros((size, size), q0.dtype))
    else:  # the structure of the factorization the steps will build
        inputs = (begin.q, begin.v, begin.a, begin.qdd)
        x = jnp.concatenate([begin.q, begin.lam])
        through = through_step(times[0], times[1])

        def residual(y):
            return through(inputs, diff_terms, y)[0]

        def transposed(w):
            return jax.vjp(residual, x)[1](w)[0]

        factor = jax.eval_shape(lambda: _transposed_factor(residual, transposed, x, n))
    ((q_bar, v_bar, a_bar, qdd_bar), terms_bar), _ = jax.lax.fori_loop(
        0, segments, segment_back, ((end_bar, terms_bar), _Kept.empty(factor))
    )

    def start(y0, diff_terms):  # the consistent accelerations at `t0`: `a₀ = q̈₀`
        a, qdd, _, _ = method.init(
            eqx.combine(diff_terms, static_terms), t0, problem.t1, y0, problem.args
        )
        return a, qdd

    _, pull_start = jax.vjp(start, (q0, v0), diff_terms)
    (q0_bar, v0_bar), init_terms_bar = pull_start((a_bar, qdd_bar))
    terms_bar = jax.tree.map(jnp.add, terms_bar, init_terms_bar)
    start_bar = jnp.concatenate([q_bar + q0_bar, v_bar + v0_bar])
    if y0_bar is not None:
        start_bar = start_bar + y0_bar
    init_state_bar = eqx.tree_at(
        lambda s: s.y, nones(problem.init_state), (start_bar[:n], start_bar[n:]), is_leaf=is_none
    )
    return dataclasses.replace(nones(problem), terms=terms_bar, init_state=init_state_bar)


class _Kept(eqx.Module):
    """A factorization of `(∂r/∂x)ᵀ` at a later step, kept to solve the adjoint equations
    of the steps before it by iterative refinement; `valid` is false before the first is
    built."""

    factor: AbstractNewtonFactor
    valid: jax.Array

    @classmethod
    def empty(cls, factor) -> "_Kept":
        """Before the first build: a factorization of `factor`'s structure (or its
        `jax.eval_shape`), zeroed."""
        zeros = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), factor)
        return cls(zeros, jnp.zeros((), jnp.bool_))


def _transposed_factor(residual, transposed, x, coordinates: int) -> AbstractNewtonFactor:
    """A factorization of `(∂r/∂x)ᵀ` at `x` (`residual(x) = r`, `transposed(w) = (∂r/∂x)ᵀ
    w`): of more than `LOOPED_INVERSE_MAX` unknowns, where the saddle point's sparse LU
    factorization is cheaper than the dense one (`saddle_point_plan`), `∂r/∂x` on its
    sparsity (one tangent per colour group of its columns) and its LU factors, applied
    transposed; else its inverse from one vector–Jacobian product per unknown."""
    if x.shape[0] > _thresholds.LOOPED_INVERSE_MAX:
        jacobian = sparse_jacobian(residual, x)
        plan = saddle_point_plan(jacobian.pattern, coordinates)
        if plan is not None:
            return SparseLU(supernodal_lu(jacobian, plan), transpose=True)
    # The products `(∂r/∂x)ᵀ eᵢ` are the rows of `∂r/∂x`.
    rows = jax.vmap(transposed)(jnp.eye(x.shape[0], dtype=x.dtype))
    return DenseInverse(inverse(rows.T))


def _adjoint_solve(transposed, x_bar, kept: _Kept, factorize):
    """`w` with `(∂r/∂x)ᵀ w = x̄` (`transposed(w) = (∂r/∂x)ᵀ w`, a vector–Jacobian product),
    to rounding, and the factorization to keep (`factorize()`: that of this step's
    `(∂r/∂x)ᵀ`, [`_transposed_factor`][]).

    Iterative refinement with the kept factorization `K ≈ (∂r/∂x)⁻ᵀ` of a later step's
    matrix (`w ← w + K (x̄ − (∂r/∂x)ᵀ w)`; Golub & Van Loan 2013, §3.5.3): adjacent steps'
    matrices differ by the change of the state and of `h` over a step, and a correction
    costs one product and one application of `K`, where a new matrix costs one product
    per unknown (per colour group, on its sparsity) and a factorization. The corrections
    end at the rounding level of `w`, or where they stop shrinking within
    `_ATTAINABLE_UNITS` of it (the level that refinement in working precision attains for
    an ill-conditioned matrix, and a direct solve too). Where they do not shrink by
    `_REFINE_RATE` per iteration above that level, or have not ended after
    `_REFINE_ITERATIONS`, the exact `(∂r/∂x)ᵀ` of this step is built, factorized,
    solved with and kept: the strategy of the forward solve's
    modified Newton iteration, applied to the linear adjoint equations. The solution is
    that of a direct solve, to the level refinement attains, whichever matrix is kept.
    """
    eps = jnp.finfo(x_bar.dtype).eps
    inf = jnp.asarray(jnp.inf, x_bar.dtype)

    def rebuild(_):
        kept = factorize()
        w = kept.apply(x_bar)
        # Two corrections: neither a product with the inverse nor the solve with the LU
        # factors reaches the refinement's rounding level (on the arm of the stiff
        # integration guide, a plain LU solve at every step moved the gradient by 10⁻⁸).
        w = w + kept.apply(x_bar - transposed(w))
        return w + kept.apply(x_bar - transposed(w)), _Kept(kept, jnp.ones((), jnp.bool_))

    if _REFINE_ITERATIONS == 0:
        return rebuild(None)

    def refine(state):
        w, previous, iteration, _ = state
        delta = kept.factor.apply(x_bar - transposed(w))
        size = jnp.max(jnp.abs(delta))
        w = w + delta
        rate = size / previous
        # Converged where the correction is at the rounding level of `w`, or stalls just
        # above it. (Not where the error left at this rate is: estimated from two
        # corrections, it stops early enough to move the arm's fixed-step gradient by ten
        # times as much as a direct solve.)
        scale = eps * jnp.max(jnp.abs(w))
        stalled = (rate > _REFINE_RATE) & (size <= _ATTAINABLE_UNITS * scale)
        done = (size <= _ROUNDING_UNITS * scale) | stalled
        slow = ~done & (
            (rate > _REFINE_RATE) | ~jnp.isfinite(size) | (iteration + 1 >= _REFINE_ITERATIONS)
        )
        return w, size, iteration + 1, jnp.where(done, 1, jnp.where(slow, 2, 0))

    def going_on(state):
        return state[3] == 0

    start = (kept.factor.apply(x_bar), inf, jnp.zeros((), jnp.int32), jnp.where(kept.valid, 0, 2))
    w, _, _, outcome = jax.lax.while_loop(going_on, refine, start)
    return jax.lax.cond(outcome == 2, rebuild, lambda _: (w, kept), None)


def _saved_steps_bar(ys_bar, saveat, y0, max_steps):
    """The cotangents of the states saved at every step's end (`SubSaveAt(steps=True)`,
    rows `[y0 if t0] + one per accepted step`) split from those of the other saves:
    `(ys_bar, saveat)` of the others, for `saves_bar`, the cotangent of `y0` from the
    steps' saves and that of each step's end, `(max_steps, size)` (None where no step is
    saved)."""
    subs = subsaves(saveat)
    ys_bar = [None] * len(subs) if ys_bar is None else list(ys_bar)
    if not any(sub.steps for sub in subs):
        return ys_bar, saveat, None, None
    size = ravel_pytree(y0)[0].size
    dtype = jnp.result_type(*jax.tree.leaves(y0))
    y0_bar, steps_bar = jnp.zeros(size, dtype), jnp.zeros((max_steps, size), dtype)
    others = [(sub, bar) for sub, bar in zip(subs, ys_bar, strict=True) if not sub.steps]
    for sub, bar in zip(subs, ys_bar, strict=True):
        if sub.steps:
            rows = _rows_bar(bar, y0, int(sub.t0) + max_steps)
            y0_bar = y0_bar + rows[0] if sub.t0 else y0_bar
            steps_bar = steps_bar + rows[int(sub.t0) :]
    return (
        [bar for _, bar in others],
        diffrax.SaveAt(subs=[sub for sub, _ in others]),
        y0_bar,
        steps_bar,
    )


def _saves_back(ta, tb, begin, end, saves, save_ts, save_bar, end_bars):
    """The cotangents of the states saved inside the step (`saves`: the first save's
    index and one past the last's; cubic Hermite interpolation, as the solver's dense
    output), added to those of its end `(q̄, v̄, q̈̄)`, and those of its start `(q̄, v̄, q̈̄)`."""
    n = begin.q.shape[0]
    h = tb - ta

    def interpolate(q0, v0, qdd0, q1, v1, qdd1, t):
        dense = diffrax.ThirdOrderHermitePolynomialInterpolation(
            t0=ta,
            t1=tb,
            y0=jnp.concatenate([q0, v0]),
            y1=jnp.concatenate([q1, v1]),
            k0=h * jnp.concatenate([v0, qdd0]),
            k1=h * jnp.concatenate([v1, qdd1]),
        )
        return dense.evaluate(t)

    def save_back(j, bars):
        start, finish = bars
        _, pull = jax.vjp(
            lambda *x: interpolate(*x, save_ts[j]),
            begin.q,
            begin.v,
            begin.qdd,
            end.q,
            end.v,
            end.qdd,
        )
        cot = pull(save_bar[j])
        return (
            tuple(s + c for s, c in zip(start, cot[:3], strict=True)),
            tuple(f + c for f, c in zip(finish, cot[3:], strict=True)),
        )

    zeros = tuple(jnp.zeros((n,), begin.q.dtype) for _ in range(3))
    start, finish = jax.lax.fori_loop(*saves, save_back, (zeros, zeros))
    return tuple(e + f for e, f in zip(end_bars, finish, strict=True)), start


_swept.def_fwd(_forward)
_swept.def_bwd(_backward)
