"""Gradients of a solve by a reverse sweep over its stored steps.

Reverse mode through diffrax's loop (`RecursiveCheckpointAdjoint`) differentiates
everything the loop does: the stage loop's buffers, the step-size controller, the saving,
the checkpoints. For the two-link benchmark that costs ≈ 6× the forward solve, while the
right-hand side's own vector–Jacobian product costs 3.3× the right-hand side
(`experiments/bench_rhs.py`). [`jaxdae.ReverseSweepAdjoint`][] pays only the latter: the
forward solve stores every accepted step, and the backward pass is the discrete adjoint of
the explicit Runge–Kutta step, applied step by step in reverse.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ._scalarize import scalarize
from ._solvers import AbstractWrappedSolver


class ReverseSweepAdjoint(eqx.Module):
    """Differentiates `simulate` by a reverse sweep over the stored steps: the discrete
    adjoint of an explicit Runge–Kutta method.

    The forward solve keeps every accepted step's end time and state. The backward pass
    walks the steps from the last to the first; for each it recomputes the stages from the
    stored state and applies the right-hand side's vector–Jacobian product at each stage
    (`ȳₙ = ȳₙ₊₁ + Σᵢ μᵢ`, `μᵢ = f_yᵀ(Yᵢ) λᵢ`, `λᵢ = h bᵢ ȳₙ₊₁ + h Σ_{j>i} a_ji μⱼ`), and
    the cotangents of the states saved inside the step through the solver's dense output.
    The step sizes are constants of the gradient, as diffrax's step-size controllers make
    them, so the gradient equals that of the default `RecursiveCheckpointAdjoint` to
    rounding; it is cheaper because diffrax's loop is not differentiated
    (`experiments/bench_core.py`).

    Pass it as `simulate(..., adjoint=jaxdae.ReverseSweepAdjoint())` (or to
    [`jaxdae.simulate_ensemble`][] and [`jaxdae.simulate_actuated`][]).

    - **Memory**: the stored steps take `max_steps × (state size + 1)` floats per
      trajectory (with `max_steps = 100_000`, 4 MB for a two-coordinate system). Set
      `max_steps` near the number of steps the solve needs, above all under `jax.vmap` and
      in ensembles.
    - **Solvers**: explicit Runge–Kutta methods with a Butcher tableau
      (`diffrax.AbstractERK`: `Tsit5`, `Dopri5`, `Bosh3`, `Heun`, … and
      [`jaxdae.UnrolledERK`][] of them); adaptive or constant steps; solves that stop at a
      failure. Others raise `ValueError`.
    - **Gradients** with respect to the system, the formulation (or control), the initial
      state, of `simulate`, of `simulate_actuated` and of [`jaxdae.simulate_ensemble`][]
      (whose trajectories share the steps: the sweep runs once over the shared steps,
      every trajectory at once). Not with respect to `t0`, `t1` or `ts` (a `ValueError`
      says so).
    """


def explicit_tableau(solver) -> diffrax.ButcherTableau:
    """The Butcher tableau of an explicit Runge–Kutta `solver`, or a `ValueError`."""
    base = solver
    while isinstance(base, AbstractWrappedSolver):
        base = base.solver
    if not isinstance(base, diffrax.AbstractERK):
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` differentiates explicit Runge–Kutta solvers "
            f"(`diffrax.Tsit5`, `Dopri5`, `Bosh3`, `Heun`, …); got {type(base).__name__}. "
            "Use the default adjoint (`diffrax.RecursiveCheckpointAdjoint`) for this solver.")
    return base.tableau


def swept_diffeqsolve(vector_field, solver, t0, t1, dt0, y0, *, args, saveat, ts,
                      stepsize_controller, event, max_steps, step_args=None, stage_vjp=None):
    """`diffrax.diffeqsolve(ODETerm(vector_field), ...)` whose reverse mode is the sweep of
    [`jaxdae.ReverseSweepAdjoint`][]. `saveat` is `SaveAt(t0=True, t1=True)` (`ts` None) or
    `SaveAt(subs=[SubSaveAt(ts=ts'), SubSaveAt(t1=True)])`, as `simulate` builds it.

    A solver that passes the vector field more than `args` (an ensemble's
    `_StopFailedTrajectories` passes the rows stopped so far) gives
    `step_args(args, solver_state, t)`: the arguments of the step that starts at `t`, from
    the solver state at the end of the solve (`saveat.solver_state` must be set).

    `stage_vjp(t, y, args, solver_state, t_start, y_bar) -> (y_bar, args_bar)`, if given,
    replaces the vector–Jacobian product of `vector_field` (at the stage `(t, y)` of the
    step from `t_start`; `solver_state` as for `step_args`, else None); `args_bar` has the
    structure of `args`. An ensemble passes one that applies each trajectory's own product
    row by row."""
    saves = saveat.subs if ts is None else saveat.subs[0]
    if not (saves.t0 and saves.t1) if ts is None else saves.ts is None:
        raise ValueError("`swept_diffeqsolve` saves (t0, t1), or `ts` then t1.")
    if step_args is not None and not saveat.solver_state:
        raise ValueError("`step_args` reads the final solver state: save it "
                         "(`SaveAt(solver_state=True)`).")
    static = sweep_options(vector_field, solver, saveat, stepsize_controller, event, max_steps,
                           step_args, stage_vjp)
    return _swept((args, y0, t0, t1, ts, dt0), static)


def sweep_options(vector_field, solver, saveat, stepsize_controller, event, max_steps,
                  step_args=None, stage_vjp=None) -> dict:
    """The non-differentiated arguments of the swept solve (`_solve`, `_backward`)."""
    return dict(vector_field=vector_field, solver=solver, saveat=saveat, event=event,
                stepsize_controller=stepsize_controller, max_steps=max_steps,
                tableau=explicit_tableau(solver), step_args=step_args, stage_vjp=stage_vjp)


def _solve(vjp_arg, static):
    """The solve, and every accepted step's end time and state."""
    args, y0, t0, t1, _, dt0 = vjp_arg
    saveat = static["saveat"]
    subs = saveat.subs if isinstance(saveat.subs, list) else [saveat.subs]
    last = diffrax.SubSaveAt(steps=True)
    out = diffrax.diffeqsolve(
        diffrax.ODETerm(static["vector_field"]), static["solver"], t0, t1, dt0, y0, args=args,
        saveat=diffrax.SaveAt(subs=subs + [last], solver_state=saveat.solver_state),
        stepsize_controller=static["stepsize_controller"], event=static["event"],
        max_steps=static["max_steps"], adjoint=diffrax.RecursiveCheckpointAdjoint(),
        throw=False)
    *ts_saved, step_ts = out.ts
    *ys_saved, step_ys = out.ys
    if not isinstance(saveat.subs, list):
        ts_saved, ys_saved = ts_saved[0], ys_saved[0]
    steps = out.stats["num_accepted_steps"]
    stored = step_ts, step_ys, steps, out.solver_state if static["step_args"] else None
    return eqx.tree_at(lambda o: (o.ts, o.ys), out, (ts_saved, ys_saved)), stored


@eqx.filter_custom_vjp
def _swept(vjp_arg, static):
    # Stores the steps as `_forward` does (XLA drops them, unused): under reverse mode JAX
    # traces this primal too, and with the same arguments `_forward` then reuses its trace
    # of `diffrax.diffeqsolve`.
    return _solve(vjp_arg, static)[0]


def _forward(perturbed, vjp_arg, static):
    _, _, *times = perturbed
    if any(jax.tree.leaves(times)):
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` gives gradients with respect to the system, the "
            "formulation, `q0` and `v0`, not with respect to `t0`, `t1`, `ts` or `dt0`; use "
            "the default adjoint (`diffrax.RecursiveCheckpointAdjoint`) for those.")
    return _solve(vjp_arg, static)


def _backward(stored, out_bar, perturbed, vjp_arg, static):
    args, y0, t0, _, ts, _ = vjp_arg
    step_ts, step_ys, steps, solver_state = stored
    tableau, solver = static["tableau"], static["solver"]
    flat_y0, unravel = ravel_pytree(y0)
    flat = lambda y: ravel_pytree(y)[0]  # noqa: E731
    stored_state = lambda i: flat(jax.tree.map(lambda x: x[i], step_ys))  # noqa: E731
    zero = jnp.zeros_like(flat_y0)

    # Cotangents of the saved states: (ȳ₀ direct, ȳ at the last step's end, at `ts`).
    ys_bar = out_bar.ys
    if ts is None:  # SaveAt(t0=True, t1=True): rows are y0 and the final state
        rows = _rows_bar(ys_bar, y0, 2)
        y0_bar, final_bar, save_bar = rows[0], rows[1], None
        save_ts = None
    else:
        at_ts, at_end = ys_bar if ys_bar is not None else (None, None)
        save_bar = _rows_bar(at_ts, y0, ts.shape[0])
        final_bar = _rows_bar(at_end, y0, 1)[0]
        y0_bar = zero
        save_ts = static["saveat"].subs[0].ts  # as diffrax saw them (see `save_at`)

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
    # Only the perturbed leaves: a cotangent for every parameter of the system costs more.
    diff_args, static_args = eqx.partition(args, perturbed[0])

    def rates(t, y, diff_args, static_args, solver_state, t_start):
        step_args = eqx.combine(diff_args, static_args)
        if static["step_args"] is not None:
            step_args = static["step_args"](step_args, solver_state, t_start)
        return flat(static["vector_field"](t, unravel(y), step_args))

    if static["stage_vjp"] is not None:  # the solve's own (an ensemble's: row by row)
        def stage_vjp(t, y, diff_args, static_args, solver_state, t_start, cotangent):
            y_bar, args_bar = static["stage_vjp"](
                t, unravel(y), eqx.combine(diff_args, static_args), solver_state, t_start,
                unravel(cotangent))
            return flat(y_bar), eqx.partition(args_bar, perturbed[0])[0]
    else:
        # The stage's vector–Jacobian product re-traced as one scalar graph (constants
        # folded, the transposed structural operations gone), which XLA runs faster under
        # `vmap` (`experiments/bench_batch.py`, docs/benchmarks.md, session 10). Everything
        # it reads is an argument: `scalarize` traces it on its own.
        @scalarize
        def stage_vjp(t, y, diff_args, static_args, solver_state, t_start, cotangent):
            _, pull = jax.vjp(
                lambda y, p: rates(t, y, p, static_args, solver_state, t_start), y, diff_args)
            return pull(cotangent)

    if save_ts is not None:  # the step that saved each `ts[j]`: the first ending at or after
        # it (diffrax fills the times of steps not taken with inf)
        save_step = jnp.searchsorted(step_ts, save_ts, side="left")

    def step_back(k, carry):
        end_bar, args_bar = carry
        n = steps - 1 - k
        first = n == 0
        t_start = jnp.where(first, t0, step_ts[jnp.maximum(n - 1, 0)])
        y_start = jnp.where(first, flat_y0, stored_state(jnp.maximum(n - 1, 0)))
        t_end, y_end = step_ts[n], stored_state(n)
        h = t_end - t_start
        end_bar = end_bar + jnp.where(n == steps - 1, final_bar, zero)

        def stage(i, k_stages):
            y_stage = y_start + h * (a[i] @ k_stages)
            return k_stages.at[i].set(rates(t_start + c[i] * h, y_stage, diff_args, static_args,
                                            solver_state, t_start))

        k_stages = jax.lax.fori_loop(0, stages, stage,
                                     jnp.zeros((stages, flat_y0.size), zero.dtype))
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
            # y_end = y_start + h Σ bᵢ kᵢ: its cotangent from the dense output flows back too.
            start_bar = start_bar + end_extra
            stages_bar = stages_bar + h * b[:, None] * end_extra[None, :]

        def stage_back(ii, bars):
            stages_bar, start_bar, args_bar = bars
            i = stages - 1 - ii
            y_stage = y_start + h * (a[i] @ k_stages)
            mu, p_bar = stage_vjp(t_start + c[i] * h, y_stage, diff_args, static_args,
                                  solver_state, t_start, stages_bar[i])
            stages_bar = stages_bar + h * a[i][:, None] * mu[None, :]
            return stages_bar, start_bar + mu, jax.tree.map(jnp.add, args_bar, p_bar)

        _, start_bar, args_bar = jax.lax.fori_loop(
            0, stages, stage_back, (stages_bar, start_bar, args_bar))
        return start_bar, args_bar

    args_zero = jax.tree.map(jnp.zeros_like, diff_args)
    start_bar, args_bar = jax.lax.fori_loop(0, steps, step_back, (zero, args_zero))
    y0_bar = unravel(y0_bar + start_bar)
    return (args_bar, y0_bar, None, None, None, None)


def _rows_bar(rows, like, count):
    """Cotangents of `count` saved rows of the state `like` as a `(count, size)` array
    (zeros where symbolic)."""
    flat_like = ravel_pytree(like)[0]
    dtype = flat_like.dtype
    if rows is None:
        return jnp.zeros((count, flat_like.size), dtype)
    leaves = [jnp.zeros((count,) + jnp.shape(x), dtype) if r is None else r
              for r, x in zip(jax.tree.leaves(rows, is_leaf=lambda r: r is None),
                              jax.tree.leaves(like))]
    return jnp.concatenate([leaf.reshape(count, -1) for leaf in leaves], axis=1)


_swept.def_fwd(_forward)
_swept.def_bwd(_backward)
