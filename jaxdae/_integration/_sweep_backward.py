"""The backward pass of [`jaxdae.ReverseSweepAdjoint`][]: the discrete adjoint of the
explicit Runge–Kutta step, applied to the stored steps from the last to the first."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import _thresholds
from .._compilation._kernels import kernel_boundary
from .._compilation._linalg import full_precision
from .._compilation._private_apis import unvmap_max
from .._compilation._scalarize import scalarize
from ._sweep_forward import (
    LoopVJP,
    accepted_steps,
    is_none,
    loop_solve,
    nones,
    saves_by_step,
    solve_segment,
    solve_storing_steps,
    subsaves,
    typed_literal_as_array,
    where_taken,
)
from ._term import AbstractTermWithVJP, terms_within


@eqx.filter_custom_vjp
def swept_solve(problem, static):
    # Without reverse mode nothing is stored: the solve is diffrax's.
    return loop_solve(problem, static)


def _forward(perturbed, problem, static):
    if any(jax.tree.leaves((perturbed.t0, perturbed.t1, perturbed.dt0, perturbed.saveat))):
        # The sweep holds the step times constant.
        return LoopVJP.of(problem, static)
    return solve_storing_steps(problem, static)


@full_precision
def _backward(stored, out_bar, perturbed, problem, static):
    if isinstance(stored, LoopVJP):
        return stored(out_bar)
    problem = jax.tree.map(typed_literal_as_array, problem)
    t0, y0 = problem.t0, problem.init_state.y
    # Cotangents of the saved states: ȳ₀ direct, ȳ at the last step's end, at the save
    # times inside the steps (`save_ts`, as diffrax saw them).
    y0_bar, final_bar, save_ts, save_bar = saves_bar(out_bar.ys, problem.saveat, y0)
    sweep = _Sweep(problem, perturbed, static, save_ts)
    final_bar = sweep.zero if final_bar is None else final_bar
    p_bar = jax.tree.map(jnp.zeros_like, sweep.diff_p)
    if static.segments is None:
        *steps, solver_state = stored
        start_bar, p_bar = sweep(
            steps, solver_state, (t0, sweep.flat(y0)), final_bar, save_bar, p_bar
        )
    else:
        start_bar, p_bar = _sweep_segments(
            sweep, stored, problem, static, final_bar, save_bar, p_bar
        )
    y0_bar = sweep.unravel(start_bar if y0_bar is None else y0_bar + start_bar)
    terms_bar, args_bar = p_bar
    init_state_bar = eqx.tree_at(lambda s: s.y, nones(problem.init_state), y0_bar, is_leaf=is_none)
    return dataclasses.replace(
        nones(problem), terms=terms_bar, args=args_bar, init_state=init_state_bar
    )


def _sweep_segments(sweep, stored, problem, static, final_bar, save_bar, p_bar):
    """The sweep of a solve stored in segments: the last segment from its stored steps,
    the others re-solved from their checkpoints, from the last to the first."""
    t0, t1, save_ts = problem.t0, problem.t1, sweep.save_ts
    *steps, starts, count, unravel_start = stored

    def sweep_segment(i, steps_i, end_bar, p_bar):
        """Sweeps the segment `i`, whose steps are `steps_i`."""
        start = unravel_start(starts[i])
        save_bar_i = (
            None
            if save_ts is None
            else jnp.where(((save_ts > start[0]) | (i == 0))[:, None], save_bar, 0)
        )
        solver_state = unravel_start(starts[i + 1])[2] if static.keeps_solver_state else None
        return sweep(
            steps_i, solver_state, (start[0], sweep.flat(start[1])), end_bar, save_bar_i, p_bar
        )

    if static.segments[0] == 1:
        return sweep_segment(0, steps, final_bar, p_bar)
    # Under `vmap` the members' segment counts differ: the loop runs to the batch's
    # largest with an unbatched segment index, and a member with fewer segments leaves its
    # cotangents as they were in the segments it did not solve.
    most = unvmap_max(count)
    at_end = starts[count]

    def segment_back(k, bars):
        """Sweeps the segment `most − 1 − k`: a member's last one from its stored steps,
        its others re-solved from their checkpoints."""
        i = most - 1 - k
        last, active = i == count - 1, i < count
        # A member's last segment is re-solved from the solve's end, where it takes no
        # step, so that one copy of the sweep serves stored and re-solved steps, and no
        # `lax.cond` on the segment's index picks between them (under `vmap` that cond
        # becomes a select whose branches take every value they read as batched, `t1`
        # included, and XLA's algebraic simplifier then sinks that broadcast through
        # diffrax's 100 `prevbefore`s of `t1` one operation per pass, and gives up with
        # "stuck in a circular simplification loop" messages). So is a segment past the
        # member's last.
        start = jnp.where(last | ~active, at_end, starts[i])
        out = solve_segment(unravel_start(start), problem, static)
        resolved = _resolved_steps(out, unravel_start(starts[i + 1])[0], t0, t1, active & ~last)
        steps_i = jax.tree.map(lambda s, r: jnp.where(last, s, r), tuple(steps), tuple(resolved))
        swept = sweep_segment(i, steps_i, *bars)
        return where_taken(active, swept, bars)

    return jax.lax.fori_loop(0, most, segment_back, (final_bar, p_bar))


def _stage_coefficients(tableau, saves_inside: bool, dtype):
    """`(a, b, c, stages)` of the Butcher tableau, cut to the stages that count: without
    saves inside steps only those that reach the solution (Tsit5's first-same-as-last
    stage does not: one evaluation and one VJP fewer per step)."""
    a = np.zeros((tableau.num_stages, tableau.num_stages))
    for i, row in enumerate(tableau.a_lower):
        a[i + 1, : i + 1] = row
    b = np.asarray(tableau.b_sol)
    c = np.concatenate([[tableau.c1], np.asarray(tableau.c)])
    stages = (
        tableau.num_stages
        if saves_inside
        else 1
        + max(i for i in range(tableau.num_stages) if b[i] != 0 or np.any(a[i + 1 :, i] != 0))
    )
    a, b, c = a[:stages, :stages], b[:stages], c[:stages]
    return (*(jnp.asarray(x, dtype) for x in (a, b, c)), stages)


class _Sweep:
    """The reverse sweep over the stored steps of one solve: for each step from the last,
    the stages recomputed from the stored state and the right-hand side's vector–Jacobian
    product applied at each (`ReverseSweepAdjoint`'s docstring states the recursion)."""

    def __init__(self, problem, perturbed, static, save_ts):
        terms, t0 = problem.terms, problem.t0
        self.terms, self.static, self.perturbed, self.save_ts = terms, static, perturbed, save_ts
        flat_y0, self.unravel = ravel_pytree(problem.init_state.y)
        self.zero = jnp.zeros_like(flat_y0)
        self.a, self.b, self.c, self.stages = _stage_coefficients(
            static.tableau, save_ts is not None, flat_y0.dtype
        )
        # Only the perturbed leaves of the terms and `args`: a cotangent for every
        # parameter of the system costs more.
        self.diff_p, self.static_p = eqx.partition(
            (terms, problem.args), (perturbed.terms, perturbed.args)
        )
        self.own_vjp = isinstance(terms_within(terms)[0], AbstractTermWithVJP)
        # Larger states: each stage's linearization is kept from the stages' recomputation
        # (`jax.vjp`'s residuals, stacked over the stages) and only transposed on the way
        # back, instead of evaluating the right-hand side again inside each stage's product.
        self.linearized = not self.own_vjp and flat_y0.size >= _thresholds.LINEARIZED_MIN_SIZE
        # `diffeqsolve` solves in the time `direction × t`: the control of its wrapper of
        # the ODE term over a unit step is `direction`.
        self.direction = terms.contr(jnp.zeros_like(t0), jnp.ones_like(t0))
        # The stage's vector–Jacobian product re-traced as one scalar graph (constants
        # folded, the transposed structural operations gone), which XLA runs faster under
        # `vmap` (the batch-loss gradient of `experiments/benchmarks/bench_batch.py`). Everything
        # it reads is an argument: `scalarize` traces it on its own.
        self.scalar_stage_vjp = scalarize(self._rates_vjp)

    def flat(self, y):
        return ravel_pytree(y)[0]

    def rates(self, t, y, diff_p, static_p, solver_state, t_start):
        del solver_state, t_start  # (read by a term's own stage VJP only)
        terms, args = eqx.combine(diff_p, static_p)
        return self.flat(terms.vf(t, self.unravel(y), args))

    def _rates_vjp(self, t, y, diff_p, static_p, solver_state, t_start, cotangent):
        _, pull = jax.vjp(
            lambda y, p: self.rates(t, y, p, static_p, solver_state, t_start), y, diff_p
        )
        return pull(cotangent)

    def stage_vjp(self, t, y, solver_state, t_start, cotangent):
        """`(μ, p̄)`: the cotangents of a stage's state and parameters."""
        if not self.own_vjp:
            return self.scalar_stage_vjp(
                t, y, self.diff_p, self.static_p, solver_state, t_start, cotangent
            )
        terms, args = eqx.combine(self.diff_p, self.static_p)
        own = terms_within(terms)[0]
        y_bar, own_bar, args_bar = own.stage_vjp(
            self.direction * t,
            self.unravel(y),
            args,
            solver_state,
            t_start,
            self.unravel(cotangent),
        )
        # The cotangent of the terms: the own term's, zeros for what wraps it.
        terms_bar = jax.tree.map(
            lambda x: own_bar if x is own else jax.tree.map(jnp.zeros_like, x),
            terms,
            is_leaf=lambda x: x is own,
        )
        args_bar = (
            jax.tree.map(jnp.zeros_like, self.diff_p[1])
            if args_bar is None
            else eqx.partition(args_bar, self.perturbed.args)[0]
        )
        return self.flat(y_bar), (eqx.partition(terms_bar, self.perturbed.terms)[0], args_bar)

    def linearize(self, t, y, t_start, solver_state):
        """The rate and its pullback's residuals (and their tree)."""
        rate, pull = jax.vjp(
            lambda y_, p_: self.rates(t, y_, p_, self.static_p, solver_state, t_start),
            y,
            self.diff_p,
        )
        leaves, tree = jax.tree_util.tree_flatten(pull)
        return rate, leaves, tree

    def __call__(self, steps, solver_state, start, end_bar, save_bar, p_bar):
        """The cotangents of the start state `start = (t, y)` of the stored `steps` (end
        times, states, count) and of the terms and `args` (added to `p_bar`), from the
        cotangent `end_bar` of the last step's end and `save_bar` of the states saved at
        `save_ts` inside the steps."""
        step_ts, step_ys, count = steps
        t0, flat_y0 = start
        saves_from = None if self.save_ts is None else saves_by_step(step_ts, self.save_ts)
        context = (step_ts, step_ys, t0, flat_y0, solver_state, saves_from, save_bar)
        # One stack of the stages' values per residual, not one flat array of all of them
        # (docs/design_measurements.md#linearized-stages). Each step writes every stage's
        # row, so the stacks are carried from step to step rather than zeroed in each.
        kept = (
            []
            if not self.linearized
            else [
                jnp.zeros((self.stages,) + x.shape, x.dtype)
                for x in jax.eval_shape(lambda: self.linearize(t0, flat_y0, t0, solver_state)[1])
            ]
        )
        # Under `vmap` the members' step counts differ: the loop runs to the batch's
        # largest count with an unbatched step index, and a step past a member's own count
        # leaves its cotangents as they were (docs/design_measurements.md#adjoints-under-vmap).
        last = unvmap_max(count)

        def step_back(k, carry):
            n = last - 1 - k
            end_bar, p_bar, kept = self._step_back(context, n, carry)
            return *where_taken(n < count, (end_bar, p_bar), carry[:2]), kept

        start_bar, p_bar, _ = jax.lax.fori_loop(0, last, step_back, (end_bar, p_bar, kept))
        return start_bar, p_bar

    def _step_back(self, context, n, carry):
        """The cotangents at the start of the stored step `n` from those at its end."""
        step_ts, step_ys, t0, flat_y0, solver_state, saves_from, save_bar = context
        end_bar, p_bar, kept = carry
        if self.linearized:  # its two stage loops compile as separate kernels
            end_bar = kernel_boundary(end_bar)
        first = n == 0
        stored_state = lambda i: self.flat(jax.tree.map(lambda x: x[i], step_ys))  # noqa: E731
        t_start = jnp.where(first, t0, step_ts[jnp.maximum(n - 1, 0)])
        y_start = jnp.where(first, flat_y0, stored_state(jnp.maximum(n - 1, 0)))
        t_end, y_end = step_ts[n], stored_state(n)
        step = (t_start, t_end, y_start, self.terms.contr(t_start, t_end), solver_state)
        k_stages, kept, pullbacks = self._stages(step, kept)
        h = step[3]  # `dt` times the solve's direction
        start_bar, stages_bar = end_bar, h * self.b[:, None] * end_bar[None, :]
        if self.save_ts is not None:  # states saved inside this step, through the dense output
            start_bar, stages_bar = self._saves_back(
                step,
                y_end,
                k_stages,
                (saves_from[n], saves_from[n + 1]),
                save_bar,
                start_bar,
                stages_bar,
            )

        def stage_back(ii, bars):
            stages_bar, start_bar, p_bar = bars
            i = self.stages - 1 - ii
            if self.linearized:
                pull = jax.tree_util.tree_unflatten(pullbacks["tree"], [stack[i] for stack in kept])
                mu, stage_p_bar = pull(stages_bar[i])
            else:
                y_stage = y_start + h * (self.a[i] @ k_stages)
                mu, stage_p_bar = self.stage_vjp(
                    t_start + self.c[i] * (t_end - t_start),
                    y_stage,
                    solver_state,
                    t_start,
                    stages_bar[i],
                )
            stages_bar = stages_bar + h * self.a[i][:, None] * mu[None, :]
            return stages_bar, start_bar + mu, jax.tree.map(jnp.add, p_bar, stage_p_bar)

        _, start_bar, p_bar = jax.lax.fori_loop(
            0,
            self.stages,
            stage_back,
            (stages_bar, start_bar, p_bar),
            unroll=_thresholds.LINEARIZED_UNROLL if self.linearized else 1,
        )
        return start_bar, p_bar, kept

    def _stages(self, step, kept):
        """The step's stages `kᵢ` recomputed from its start, and where linearized, each
        stage's pullback residuals written into `kept`."""
        t_start, t_end, y_start, h, solver_state = step
        dt = t_end - t_start
        a, c = self.a, self.c
        k_init = jnp.zeros((self.stages, y_start.size), self.zero.dtype)
        pullbacks = {}
        if not self.linearized:

            def stage(i, k_stages):
                y_stage = y_start + h * (a[i] @ k_stages)
                return k_stages.at[i].set(
                    self.rates(
                        t_start + c[i] * dt,
                        y_stage,
                        self.diff_p,
                        self.static_p,
                        solver_state,
                        t_start,
                    )
                )

            return jax.lax.fori_loop(0, self.stages, stage, k_init), kept, pullbacks

        def stage_linearized(i, carry):
            k_stages, kept = carry
            y_stage = y_start + h * (a[i] @ k_stages)
            rate, leaves, pullbacks["tree"] = self.linearize(
                t_start + c[i] * dt, y_stage, t_start, solver_state
            )
            return k_stages.at[i].set(rate), [
                stack.at[i].set(leaf) for stack, leaf in zip(kept, leaves, strict=True)
            ]

        k_stages, kept = jax.lax.fori_loop(0, self.stages, stage_linearized, (k_init, kept))
        return k_stages, kept, pullbacks

    def _saves_back(self, step, y_end, k_stages, saves, save_bar, start_bar, stages_bar):
        """Adds the cotangents of the states saved inside the step (`saves`: the first
        save's index and one past the last's), through the solver's dense output, to those
        of its start and stages."""
        t_start, t_end, y_start, h, _ = step
        save_ts, b = self.save_ts, self.b

        def interpolate(y_start, y_end, k_stages, t):
            dense = self.static.solver.interpolation_cls(
                t0=t_start,
                t1=t_end,
                y0=self.unravel(y_start),
                y1=self.unravel(y_end),
                k=jax.vmap(self.unravel)(h * k_stages),
            )
            return self.flat(dense.evaluate(t))

        def save_back(j, bars):
            start_bar, end_inner, stages_bar = bars
            _, pull = jax.vjp(lambda *x: interpolate(*x, save_ts[j]), y_start, y_end, k_stages)
            s_bar, e_bar, k_bar = pull(save_bar[j])
            return start_bar + s_bar, end_inner + e_bar, stages_bar + k_bar

        start_bar, end_extra, stages_bar = jax.lax.fori_loop(
            *saves, save_back, (start_bar, self.zero, stages_bar)
        )
        # y_end = y_start + h Σ bᵢ kᵢ: its cotangent from the dense output flows back too.
        start_bar = start_bar + end_extra
        stages_bar = stages_bar + h * b[:, None] * end_extra[None, :]
        return start_bar, stages_bar


def saves_bar(ys_bar, saveat, y0):
    """The cotangents of the saved states `ys_bar` (one per `SubSaveAt`, None where
    symbolic) as `(ȳ₀, ȳ at the end, save times, ȳ at the save times)` (flat; each None
    where none is saved), the save times of all `SubSaveAt`s in order."""
    subs = subsaves(saveat)
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
            bars.append(rows[int(sub.t0) : int(sub.t0) + at_ts])
        if sub.t1:
            final_bar = rows[-1] if final_bar is None else final_bar + rows[-1]
    if len(times) <= 1:
        return y0_bar, final_bar, *(times + bars or [None, None])
    times, bars = jnp.concatenate(times), jnp.concatenate(bars)
    order = jnp.argsort(times, stable=True)
    return y0_bar, final_bar, times[order], bars[order]


def _resolved_steps(out, t_next, t0, t1, check=True):
    """`accepted_steps` of a segment re-solved from its checkpoint, checked (where `check`) to end
    where the forward solve's segment ended (`t_next`, the next segment's start).

    The two solves are the same computation compiled in two programs, which XLA may round
    differently. Rounding moves the end by a few ulps; a step accepted in one and rejected
    in the other (a chaotic or badly scaled solve) moves it by a step. The sweep would then
    differentiate steps that the forward solve did not take, so that raises instead. (The
    check also keeps XLA from compiling the backward loop into one CPU kernel holding both
    the re-solve and the sweep, which runs the two-link gradient slower:
    docs/design_measurements.md#checked-resolve.)"""
    steps = accepted_steps(out)
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
    "through diffrax's loop, `adjoint=diffrax.RecursiveCheckpointAdjoint()`."
)


def _rows_bar(rows, like, count):
    """Cotangents of `count` saved rows of the state `like` as a `(count, size)` array
    (zeros where symbolic)."""
    flat_like = ravel_pytree(like)[0]
    dtype = flat_like.dtype
    if rows is None:
        return jnp.zeros((count, flat_like.size), dtype)
    leaves = [
        jnp.zeros((count,) + jnp.shape(x), dtype) if r is None else r
        for r, x in zip(
            jax.tree.leaves(rows, is_leaf=lambda r: r is None), jax.tree.leaves(like), strict=False
        )
    ]
    return jnp.concatenate([leaf.reshape(count, -1) for leaf in leaves], axis=1)


swept_solve.def_fwd(_forward)
swept_solve.def_bwd(_backward)
