"""The one entry point: [`jaxdae.simulate`][]."""


import functools
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._compilation._linalg import full_precision
from .._compilation._sharding import explicit_to_auto, is_explicitly_sharded
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._formulations import AbstractFormulation
from .._gains import is_concrete
from .._solution import (
    RESULTS,
    Solution,
)
from .._systems._structure import (
    constant_mass_factor,
)
from .._systems._system import AbstractSystem, cast_floating
from ._adjoint import (
    ReverseSweepAdjoint,
    default_adjoint,
    forward_mode_hint,
    jit_unless_staged,
    reverse_only,
)
from ._controllers import save_at, step_options, stop_stalled_steps
from ._diagnostics import assemble_solution, cut_at
from ._ensemble import (
    StopFailedTrajectories,
    ensemble_stage_vjp,
    ensemble_vector_field,
    failure_event,
    worst_trajectory_rms,
)
from ._failures import (
    TRACED_HINT,
    attach_check,
    event_result,
    first_failure,
    invalid_as_result,
    name_non_finite_term,
    raise_failure,
    reported_failure,
    solve_event,
)
from ._generalized_alpha import name_singular_newton_matrix
from ._implicit import configure_for_controller
from ._projection import named_result
from ._sweep_forward import ODETermWithVJP
from ._validation import (
    INITIAL_STATE_MESSAGES,
    check_initial_state_jit,
    check_solve_options,
    check_structure,
    check_times,
    check_types,
    float_array,
    initial_state_message,
    initial_state_problems,
    warn_unstable_step,
)
from ._vector_fields import SolveArgs, detached, failure_reference, system_terms, vector_field


@full_precision
def simulate(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    *,
    ts: Float[ArrayLike, " N"] | None = None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: ScalarLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
) -> Solution:
    """Simulates a constrained system, turned into an ODE by `formulation`, with diffrax.

    Works under `jax.jit`, `jax.vmap` (over initial states, gains, system parameters) and
    `jax.grad` (w.r.t. gains, parameters, initial state and times; see `adjoint`).

    **Arguments:**

    - `system`: a [`jaxdae.LagrangianSystem`][] (or another `AbstractSystem`).
    - `formulation`: how the constraints are enforced, e.g. [`jaxdae.Baumgarte`][],
        [`jaxdae.PseudoInverse`][], [`jaxdae.ModifiedLagrange`][], [`jaxdae.Unstabilized`][].
    - `t0`, `t1`: start and end time, `t1 > t0`.
    - `q0`, `v0`: initial coordinates and velocities, shape `(n,)` — for a system whose
        state holds momenta ([`jaxdae.HamiltonianSystem`][]) `v0` is the initial momenta
        `p0` (Shemelova (2016), eqs. [3]–[6]). They need not satisfy
        the constraints (the stabilized formulations pull them back); see
        [`jaxdae.consistent_initial_state`][] for a consistent start.
    - `ts`: times at which to save the solution. Default: `[t0, t1]`.
    - `solver`: any diffrax ODE solver. Default `diffrax.Tsit5()` (adaptive, explicit).
    - `stepsize_controller`: default `diffrax.PIDController(rtol, atol)`; pass
        `diffrax.ConstantStepSize()` (with `dt0`) for a fixed-step method.
    - `dt0`: initial step; default chosen automatically by the controller.
    - `rtol`, `atol`: tolerances of the default step-size controller.
    - `max_steps`: maximum number of steps.
    - `adjoint`: how gradients are computed; both defaults are discretize-then-optimize
        (the exact gradient of the computed solution). Default for explicit Runge–Kutta
        solvers (with an integer `max_steps`): [`jaxdae.ReverseSweepAdjoint`][]`()`, the
        discrete adjoint swept over the stored steps, at most 1024 at once (segments
        beyond are re-solved from checkpoints); for other solvers
        `diffrax.RecursiveCheckpointAdjoint(checkpoints=32)`. Both work in reverse mode
        (`jax.grad`); forward mode (`jax.jvp`, `jax.jacfwd`) needs
        `adjoint=diffrax.ForwardMode()` (a `ValueError` says so). Any diffrax adjoint may be
        passed.
    - `throw`: raise [`jaxdae.SimulationError`][] when the solve fails (the message says what
        happened, at which `t` and `q`); with `False` inspect `Solution.result` instead.

    **Returns:**

    A [`jaxdae.Solution`][].

    **Raises:**

    `ValueError` for bad input (shapes, non-finite values, a mass matrix that is not
    symmetric positive definite at `q0`, gains that are not positive definite, a
    `velocity_constraints` that is not affine in the velocities, non-finite times,
    `t1 <= t0`, unsorted `ts`, negative or zero tolerances); [`jaxdae.SimulationError`][]
    for a failed solve with `throw=True`.
    """
    return _run(system, formulation, t0, t1, q0, v0, SolveCall(
        ts=ts, ensemble=False, solver=solver, stepsize_controller=stepsize_controller, dt0=dt0,
        rtol=rtol, atol=atol, max_steps=max_steps, adjoint=adjoint, throw=throw))


@full_precision
def simulate_ensemble(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, "B n"],
    v0: Float[ArrayLike, "B n"],
    *,
    ts: Float[ArrayLike, " N"] | None = None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: ScalarLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
) -> Solution:
    """Simulates `B` trajectories of one system from `B` initial states as one ODE whose
    trajectories share their time steps.

    The result is that of `jax.vmap(simulate)` over the rows of `q0` and `v0` (every field
    of the [`jaxdae.Solution`][] has a leading axis `B`), computed differently: one
    diffrax solve integrates all trajectories at once, with the step size set by the
    trajectory that needs the smallest (the controller's error norm is the largest of the
    trajectories' RMS norms, [`jaxdae.worst_trajectory_rms`][], so every trajectory meets
    `rtol`/`atol`). `jax.vmap(simulate)` instead steps every trajectory on its own, and
    its batched loop then pays for bookkeeping per trajectory at every step. For batches
    of similar trajectories (perturbed initial states, Monte Carlo) the ensemble is
    faster ([benchmarks](../benchmarks.md)). For trajectories of very different difficulty,
    `jax.vmap(simulate)` (or [`jaxdae.batch_map`][]) takes fewer steps in all.

    Gains and system parameters are shared by the ensemble (batch them with
    `jax.vmap(simulate)`); `stats` are shared too (repeated per trajectory). Works under
    `jax.jit` and `jax.grad`; shard `q0` and `v0` over devices
    (`jax.device_put(q0, jaxdae.batch_sharding(mesh))`) to split the ensemble.

    A formulation that stops at singular configurations ([`jaxdae.Baumgarte`][],
    [`jaxdae.Unstabilized`][], [`jaxdae.CoupledPerturbation`][],
    [`jaxdae.RedundantCoordinates`][]) stops each trajectory alone: its failure is checked
    at the end of every step, as `simulate` does, and a trajectory that fails keeps its
    state from then on while the others go on. Its row of the `Solution` is what
    `simulate` returns for it (its `result` names the failure, `t_final` and `q_final`
    are where it stopped, later saved times are `inf`); the steps are shared, so they are
    smaller near every trajectory's failure.

    **Arguments:**

    As for [`jaxdae.simulate`][], except:

    - `q0`, `v0`: initial coordinates and velocities (or momenta), shape `(B, n)`.
    - `stepsize_controller`: default `diffrax.PIDController(rtol, atol,
        norm=worst_trajectory_rms)`. A controller passed here should use a norm that
        looks at every trajectory in the same way.
    - `adjoint`: as for `simulate`. With [`jaxdae.ReverseSweepAdjoint`][] (the default for
        explicit Runge–Kutta solvers) the stored steps hold every trajectory:
        `stored_steps × B × (state size + 1)` floats.

    **Returns:**

    A [`jaxdae.Solution`][] whose fields have a leading axis `B`.

    **Raises:**

    As [`jaxdae.simulate`][]: a bad initial state is reported with its row, and with
    `throw=True` the first trajectory that failed is named.
    """
    return _run(system, formulation, t0, t1, q0, v0, SolveCall(
        ts=ts, ensemble=True, solver=solver, stepsize_controller=stepsize_controller, dt0=dt0,
        rtol=rtol, atol=atol, max_steps=max_steps, adjoint=adjoint, throw=throw))


class SolveCall(eqx.Module):
    """The keyword arguments of a call of [`jaxdae.simulate`][] (`ensemble=False`),
    [`jaxdae.simulate_ensemble`][] or [`jaxdae.simulate_actuated`][], as given, and what the
    solve makes of them (`times`, `options`)."""

    ts: Float[ArrayLike, " N"] | None
    ensemble: bool = eqx.field(static=True)
    solver: diffrax.AbstractSolver | None
    stepsize_controller: diffrax.AbstractStepSizeController | None
    dt0: ScalarLike | None
    rtol: ScalarLike
    atol: ScalarLike
    max_steps: int | None
    adjoint: diffrax.AbstractAdjoint | ReverseSweepAdjoint | None
    throw: bool

    def check_options(self) -> None:
        """`check_solve_options` of the solver, controller, adjoint and step limit."""
        check_solve_options(self.solver, self.stepsize_controller, self.adjoint,
                            self.max_steps)

    def times(self, t0, t1, dtype) -> "_Times":
        """`t0`, `t1` and `ts` as arrays of `dtype`, checked (`check_times`)."""
        t0, t1 = jnp.asarray(t0, dtype=dtype), jnp.asarray(t1, dtype=dtype)
        ts = None if self.ts is None else jnp.asarray(self.ts, dtype=dtype)
        check_times(t0, t1, ts)
        return _Times(t0, t1, ts)

    def options(self, dtype, norm=optx.rms_norm) -> "_SolveOptions":
        """The solve's options with the defaults filled in: `step_options` (the default
        controller measures errors with `norm`), an implicit solver's root finder set to
        stop at the step's tolerance (`configure_for_controller`), `default_adjoint`."""
        stepsize_controller, dt0 = step_options(self.stepsize_controller, self.dt0, self.rtol,
                                                self.atol, dtype, norm)
        solver = (Tsit5 if self.solver is None
                  else configure_for_controller(self.solver, stepsize_controller))
        adjoint = (default_adjoint(solver, self.max_steps) if self.adjoint is None
                   else self.adjoint)
        return _SolveOptions(solver=solver, stepsize_controller=stepsize_controller, dt0=dt0,
                             max_steps=self.max_steps, adjoint=adjoint, ensemble=self.ensemble)


class _Times(eqx.Module):
    """The times of a checked solve: start, end and the save times (None: `[t0, t1]`)."""

    t0: Array
    t1: Array
    ts: Array | None


class _SolveOptions(eqx.Module):
    """How `_simulate` solves: diffrax's solver, step-size controller, first step, step
    limit and adjoint (defaults filled in), and whether the states are an ensemble's rows."""

    solver: diffrax.AbstractSolver
    stepsize_controller: diffrax.AbstractStepSizeController
    dt0: Array | None
    max_steps: int | None = eqx.field(static=True)
    adjoint: diffrax.AbstractAdjoint | ReverseSweepAdjoint
    ensemble: bool = eqx.field(static=True)


class _TracedChecks(eqx.Module):
    """What `_simulate` checks when anything is `traced` (`_check_traced`): the checks
    of traced gains (`gain_flags`, one message each: the formulation's `traced_checks`),
    the initial state
    (`check_state`: a traced state) and the times, and the solve's failure (`throw`)."""

    gain_flags: tuple
    gain_messages: tuple[str, ...] = eqx.field(static=True)
    traced: bool = eqx.field(static=True)
    check_state: bool = eqx.field(static=True)
    throw: bool = eqx.field(static=True)


def in_current_mesh(fn):
    """`fn` run with JAX's current abstract mesh set explicitly (the empty mesh outside
    any mesh).

    When reverse mode differentiates a jitted function (`_simulate` called eagerly), JAX
    replays its equations with the context each was recorded in, which names the empty
    mesh where the caller's context named none. What is traced lazily there
    (`ReverseSweepAdjoint`'s forward solve) then missed every trace cache that the
    structure checks had filled, and traced the equations of motion and the solve a second
    time. Setting the current mesh explicitly keeps those caches valid
    (`experiments/bench_compile.py` shows the gradient's trace time)."""

    @functools.wraps(fn)
    def in_mesh(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(jax.sharding.get_abstract_mesh()):
            return fn(*args, **kwargs)

    return in_mesh


@in_current_mesh
def _run(system, formulation, t0, t1, q0, v0, call: SolveCall) -> Solution:
    """Checks the input of `simulate` (`call.ensemble` false) or `simulate_ensemble`, solves
    and reports failures."""
    ensemble = call.ensemble
    q0 = float_array("q0", explicit_to_auto(q0), ensemble)
    v0 = float_array("v0", explicit_to_auto(v0), ensemble)
    if is_explicitly_sharded(q0) or is_explicitly_sharded(v0):
        raise ValueError(
            "`q0` and `v0` are traced with an Explicit sharding in their type (a mesh from "
            "`jax.make_mesh` with its default axis types); jaxdae's solves do not support "
            "those. Build the mesh with `axis_types=(jax.sharding.AxisType.Auto,)` or pass "
            "the placed arrays from outside `jax.jit`."
        )
    dtype = jnp.result_type(q0, v0)
    q0, v0 = q0.astype(dtype), v0.astype(dtype)
    if q0.shape != v0.shape:
        shape = "(B, n)" if ensemble else "(n,)"
        raise ValueError(
            f"`q0` and `v0` must have the same shape {shape}; got {q0.shape} and {v0.shape}."
        )
    check_types(system, formulation)
    call.check_options()
    times = call.times(t0, t1, dtype)
    t0 = times.t0
    # The state's dtype sets the precision: float32 states give a float32 simulation.
    system, formulation = cast_floating((system, formulation), dtype)
    if ensemble:  # shapes of one trajectory (no slicing: q0 may be sharded)
        lane = jax.ShapeDtypeStruct(q0.shape[1:], dtype)
        formulation, counts = check_structure(system, formulation, t0, lane, lane)
    else:
        formulation, counts = check_structure(system, formulation, t0, q0, v0)
    # Traced gains' checks join the solve's one branched error (`_check_traced`).
    gain_checks = formulation.traced_checks(*counts)
    if is_concrete(formulation):
        formulation.check_values()

    eager = is_concrete(system, t0, q0, v0)
    if eager:
        if ensemble:
            mass, flags, values = jax.vmap(
                check_initial_state_jit, in_axes=(None, None, None, 0, 0))(
                system, formulation, t0, q0, v0)
            flags = np.asarray(flags)
            row = int(np.argmax(flags.any(axis=1)))
            mass, flags, values = mass[row], flags[row], values[row]
            where = f"Trajectory {row} (row of q0, v0): "
        else:
            mass, flags, values = check_initial_state_jit(system, formulation, t0, q0, v0)
            flags, where = np.asarray(flags), ""
        if flags.any():
            problem = int(np.argmax(flags))
            message = where + initial_state_message(formulation, problem)
            if problem == 2:
                mass = np.asarray(mass)
                lowest = np.linalg.eigvalsh(0.5 * (mass + mass.T))[0] if np.all(
                    np.isfinite(mass)) else np.nan
                message += f" (lowest eigenvalue of its symmetric part: {lowest:.3g})"
            elif problem >= len(INITIAL_STATE_MESSAGES):  # the formulation's
                own = problem - len(INITIAL_STATE_MESSAGES)
                message += f" ({formulation.state_messages[own][1]}: {float(values[own]):.3g})"
            raise ValueError(message)

    options = call.options(dtype, worst_trajectory_rms if ensemble else optx.rms_norm)
    if isinstance(options.stepsize_controller, diffrax.ConstantStepSize):
        warn_unstable_step(formulation, counts,
                           Tsit5 if call.solver is None else call.solver, options.dt0)
    traced = not is_concrete(system, formulation, times, q0, v0)
    checks = _TracedChecks(
        gain_flags=tuple(flag for flag, _ in gain_checks),
        gain_messages=tuple(message for _, message in gain_checks), traced=traced,
        check_state=not eager, throw=call.throw)
    with forward_mode_hint():
        sol = _simulate(system, formulation, times, q0, v0, options, checks)
    if not traced:
        sol = name_non_finite_term(sol, system, formulation, t0)
        sol = name_singular_newton_matrix(sol, options.solver, system)
    if call.throw and not traced:  # else `_simulate` attached the check
        sol = raise_failure(sol, first_failure(sol.result) if ensemble else None)
    return sol


Tsit5 = diffrax.Tsit5()


class Dynamics(eqx.Module):
    """What the solve path integrates for a model `(system, strategy)` (a system and its
    formulation, or an actuated system and its control): the vector field
    `vector_field(t, y, args)` with the solve's `args` (`SolveArgs` for a system and its
    formulation), and the conditions (diffrax event conditions on the same arguments) that
    stop the solve, each with the [`jaxdae.RESULTS`][] item it reports.

    `stage_vjp`, if given, is the vector–Jacobian product that
    [`jaxdae.ReverseSweepAdjoint`][] applies at each stage (`ODETermWithVJP`; an ensemble
    applies each trajectory's own, row by row); other adjoints ignore it.
    `saves_solver_state`: the solve keeps its final solver state (an ensemble whose
    trajectories stop one by one reads the stopped rows from it)."""

    vector_field: Callable = eqx.field(static=True)
    conditions: tuple[Callable, ...] = eqx.field(static=True, default=())
    failures: tuple[RESULTS, ...] = ()
    stage_vjp: Callable | None = eqx.field(static=True, default=None)
    saves_solver_state: bool = eqx.field(static=True, default=False)


def integrate(dynamics: Dynamics, args, y0, times: "_Times", options: "_SolveOptions"
              ) -> tuple[diffrax.Solution, RESULTS]:
    """The one diffrax solve of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][]: from `y0` over `times` with `options`, saving as
    `save_at` says, stopped by `dynamics.conditions` (and a non-finite state under fixed
    steps, `solve_event`) and by a stalled step (`stop_stalled_steps`). Returns diffrax's
    solution and jaxdae's result (the failure that stopped it named, `event_result`)."""
    solver, controller = options.solver, options.stepsize_controller
    t0, t1, ts = times.t0, times.t1, times.ts
    saveat = save_at(t0, t1, ts, controller)
    if dynamics.saves_solver_state:
        saveat = eqx.tree_at(lambda s: s.solver_state, saveat, True)
    event = solve_event(list(dynamics.conditions), controller)
    controller = stop_stalled_steps(controller)
    term = (diffrax.ODETerm(dynamics.vector_field) if dynamics.stage_vjp is None
            else ODETermWithVJP(dynamics.vector_field, dynamics.stage_vjp))
    out = _diffeqsolve(term, solver, t0, t1, options.dt0, y0, args=args, saveat=saveat,
                       stepsize_controller=controller, adjoint=options.adjoint, event=event,
                       max_steps=options.max_steps, throw=False)
    return out, named_result(solver, event_result(out, list(dynamics.failures)))


# `diffrax.diffeqsolve` without its own `eqx.filter_jit`: `integrate` is always traced inside
# a jit (the solve's own, `jit_unless_staged`, or the caller's). Reverse mode stages a jitted
# call before it differentiates it, and staging the adjoint's custom VJP traces the primal
# solve, which the gradient then does not use (docs/design_measurements.md#unjitted-solve).
# (The plain function if equinox no longer exposes it.)
_diffeqsolve = getattr(diffrax.diffeqsolve, "__wrapped__", diffrax.diffeqsolve)


@jit_unless_staged
def _simulate(system, formulation, times: _Times, q0, v0, options: _SolveOptions,
              checks: _TracedChecks):
    """The solve and its `Solution`; if anything is `checks.traced`, with its checks
    attached (`_check_traced`)."""
    t0, t1, ts, ensemble = times.t0, times.t1, times.ts, options.ensemble
    traced, throw = checks.traced, checks.throw
    # An ensemble's trajectories stop one by one; one trajectory's solve stops at an event.
    stops_rows = ensemble and formulation.can_fail
    stops = formulation.can_fail and not ensemble
    checked_q0, checked_v0 = q0, v0
    if ensemble and traced and not throw:
        # A row with a non-finite start would stall the shared steps of every row: it is
        # solved as a copy of a finite row, and reported as `invalid_input` (`_check_traced`).
        finite = jnp.all(jnp.isfinite(q0), axis=1) & jnp.all(jnp.isfinite(v0), axis=1)
        donor = jnp.argmax(finite)
        q0, v0 = (jnp.where(finite[:, None], x, x[donor]) for x in (q0, v0))
    reference = None
    if formulation.can_fail:
        initial = failure_reference
        if ensemble:
            initial = jax.vmap(initial, in_axes=(None, None, None, 0, 0))
        # Detached before the call: stopped after it, the call would still be linearized.
        reference = initial(*detached((system, formulation, t0, q0, v0)))
    if stops:
        dynamics = Dynamics(vector_field, (failure_event,), (formulation.failure_result,))
    elif stops_rows:
        dynamics = Dynamics(ensemble_vector_field, stage_vjp=ensemble_stage_vjp,
                            saves_solver_state=True)
        options = eqx.tree_at(lambda o: o.solver, options,
                              StopFailedTrajectories(options.solver))
    else:
        dynamics = Dynamics(ensemble_vector_field if ensemble else vector_field,
                            stage_vjp=ensemble_stage_vjp if ensemble else None)
    # A constant mass matrix is factored once, here, not at every stage (an ensemble's
    # trajectories share the system, so they share it too).
    first = (lambda x: x[0]) if ensemble else (lambda x: x)
    args = SolveArgs(system, formulation, reference,
                     constant_mass_factor(system, t0, first(q0), first(v0), system_terms))
    out, result = integrate(dynamics, args, (q0, v0), times, options)
    reached = out.result == diffrax.RESULTS.successful
    reverse = reverse_only(options.adjoint)

    if not ensemble:
        sol, initial = assemble_solution(system, formulation, (t0, q0, v0), ts, (out.ts, out.ys),
                                 (reached, result, out.stats), reverse)
    else:
        def trajectory(q0, v0, ys, t_failed):
            failed = jnp.isfinite(t_failed)
            ts_saved, ys = cut_at(ts, out.ts, ys, t_failed)
            return assemble_solution(system, formulation, (t0, q0, v0), ts, (ts_saved, ys),
                             (reached & ~failed,
                              RESULTS.where(failed, formulation.failure_result, result),
                              out.stats), reverse)

        # Saved states are (time, trajectory, coordinate) in an ensemble: one trajectory each.
        t_failed = (out.solver_state[1] if stops_rows
                    else jnp.full(q0.shape[:1], jnp.inf, t1.dtype))
        sol, initial = jax.vmap(trajectory, in_axes=(0, 0, 1, 0))(q0, v0, out.ys, t_failed)
    if traced:
        sol = _check_traced(sol, system, formulation, times,
                            (checked_q0, checked_v0, *initial), checks, ensemble)
    return sol


def _check_traced(sol, system, formulation, times: _Times, initial,
                  checks: _TracedChecks, ensemble: bool):
    """`sol` with the checks of a traced call attached as one branched error: the
    gains' (`checks.gain_flags`), those of `check_initial_state`
    (`checks.check_state`) on `initial = (q0, v0, mass matrix, forces)` and of the times,
    then (`checks.throw`) the failure of the solve.

    One `error_if` for all, each being a `lax.cond` with host callbacks. The initial
    state's checks run after the solve, on the mass matrix and forces that `assemble_solution`
    evaluated at the initial state: evaluated before it, on their own, they would be a
    second copy of the equations of motion in the compiled program, which XLA neither shares
    nor prunes (`experiments/bench_compile.py` counts the program's instructions). A solve
    from a bad state thus runs before the input's error is raised."""
    # The checks carry no gradient: their inputs are detached, so they are not linearized.
    system, formulation, times, initial, checks = detached(
        (system, formulation, times, initial, checks))
    t0, t1, ts = times.t0, times.t1, times.ts
    q0, v0, mass, forces = initial
    check_state, throw = checks.check_state, checks.throw
    flags, messages = list(checks.gain_flags), checks.gain_messages
    rows_invalid = False
    if check_state:
        def problems(q0, v0, mass, forces):
            return initial_state_problems(system, formulation, (t0, q0, v0), (mass, forces),
                                          sol.psi.shape[-1], "rows" if ensemble and throw
                                          else None)

        if ensemble and throw:
            problems = jax.vmap(problems, axis_name="rows", out_axes=(None, 0))
        elif ensemble:  # each row's own flags, for its own result
            problems = jax.vmap(problems, out_axes=(0, 0))
        state_flags, _ = problems(q0, v0, mass, forces)
        if ensemble and not throw:
            rows_invalid = jnp.any(state_flags, axis=1)
        else:
            flags += list(state_flags)
            messages += INITIAL_STATE_MESSAGES + tuple(m for m, _ in formulation.state_messages)
    flags += [~(t1 > t0) | ~jnp.isfinite(t1 - t0),
              False if ts is None else (jnp.any(jnp.diff(ts) < 0) | (ts[0] < t0)
                                        | (ts[-1] > t1) | ~jnp.all(jnp.isfinite(ts)))]
    messages += ("`t0` and `t1` must be finite, with `t1` greater than `t0`.",
                 "`ts` must be finite, sorted and lie in [t0, t1].")
    flags = jnp.stack(flags)
    wrong, index = jnp.any(flags), jnp.argmax(flags)
    if not throw:
        return invalid_as_result(sol, wrong | rows_invalid)
    result = first_failure(sol.result) if ensemble else sol.result
    index = jnp.where(wrong, index, len(messages) + result._value)
    wrong = wrong | (result != RESULTS.successful)
    messages = messages + tuple(m + TRACED_HINT for m in RESULTS._index_to_message)
    # Under `vmap` equinox reports the largest index of the batch: 0 where nothing is wrong.
    index = jnp.where(wrong, index, 0)
    return attach_check(sol, lambda x: eqx.branched_error_if(x + reported_failure(sol), wrong,
                                                             index, messages))


