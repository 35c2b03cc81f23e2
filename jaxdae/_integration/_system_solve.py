"""The solve of a system with its formulation, behind [`jaxdae.simulate`][] and
[`jaxdae.simulate_ensemble`][]: the input checks, the one diffrax solve (`integrate`), the
[`jaxdae.Solution`][] and its failures named and reported. Where one trajectory and an
ensemble differ, it asks its `AbstractTrajectories`."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._compilation._sharding import explicit_to_auto, is_explicitly_sharded
from .._gains import is_concrete
from .._solution import Solution
from .._systems._mass import constant_mass_factor
from .._systems._system import cast_floating
from ._adjoint import check_adjoint, forward_mode_hint, jit_unless_staged, reverse_only
from ._events import EventDriven, event_dynamics, event_settings, integrate_with_events
from ._failures import name_non_finite_term
from ._reporting import TracedChecks, check_traced, raise_failure
from ._solve import DEFAULT_SOLVER, SolveCall, SolveOptions, Times, in_current_mesh, integrate
from ._solvers import name_stall
from ._trajectories import AbstractTrajectories
from ._validation import (
    INITIAL_STATE_MESSAGES,
    check_structure,
    check_types,
    initial_state_message,
    solvable_inputs,
    warn_unstable_step,
)
from ._vector_fields import SolveArgs, detached, system_terms


@in_current_mesh
def solve_system(system, formulation, t0, t1, q0, v0, call: SolveCall,
                 trajectories: AbstractTrajectories) -> Solution:
    """Checks the input of `simulate` or `simulate_ensemble` (as `trajectories`), solves
    and reports failures."""
    q0 = trajectories.state_array("q0", explicit_to_auto(q0))
    v0 = trajectories.state_array("v0", explicit_to_auto(v0))
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
        raise ValueError(f"`q0` and `v0` must have the same shape {trajectories.state_shape}; "
                         f"got {q0.shape} and {v0.shape}.")
    check_types(system, formulation)
    call.check_options()
    times = call.times(t0, t1, dtype)
    t0 = times.t0
    # The state's dtype sets the precision: float32 states give a float32 simulation.
    system, formulation = cast_floating((system, formulation), dtype)
    formulation, counts = check_structure(system, formulation, t0,
                                          *trajectories.one_state(q0, v0))
    # Traced gains' checks join the solve's one branched error (`check_traced`).
    gain_checks = formulation.traced_checks(*counts)
    if is_concrete(formulation):
        formulation.check_values()
    eager = is_concrete(system, t0, q0, v0)
    if eager:
        _check_initial_state(system, formulation, t0, q0, v0, trajectories)

    options = call.options(dtype, trajectories.error_norm)
    settings = event_settings(system, call, trajectories, t0, q0, v0, eager)
    # (Known from the constraint counts: a test that cannot fail is not traced.)
    fails = formulation.fails_with(*counts)
    stops = [reason for stops, reason in (
        (fails, f"{type(formulation).__name__}'s test for singular configurations"),
        (settings is not None, "the system's gaps"),
        (isinstance(options.stepsize_controller, diffrax.ConstantStepSize),
         "fixed steps' test for a non-finite state")) if stops]
    check_adjoint(call.adjoint, bool(stops), ", ".join(stops))
    if settings is not None and call.adjoint is None:
        options = eqx.tree_at(lambda o: o.adjoint, options,
                              diffrax.RecursiveCheckpointAdjoint(_thresholds.CHECKPOINTS))
    if isinstance(options.stepsize_controller, diffrax.ConstantStepSize):
        warn_unstable_step(formulation, counts,
                           DEFAULT_SOLVER if call.solver is None else call.solver, options.dt0)
    traced = not is_concrete(system, formulation, times, q0, v0, options.dt0,
                             options.stepsize_controller)
    # Untraced, `throw` acts after the solve: calls with and without it share one program.
    checks = TracedChecks(
        gain_flags=tuple(flag for flag, _ in gain_checks),
        gain_messages=tuple(message for _, message in gain_checks), traced=traced,
        check_state=not eager, throw=call.throw and traced)
    with forward_mode_hint():
        sol = solve_and_assemble(system, formulation, times, q0, v0, options, checks,
                                 trajectories, settings, fails)
    if not traced:
        sol = name_non_finite_term(sol, system, formulation, t0)
        sol = name_stall(options.solver, sol, system)
    if call.throw and not traced:  # else `solve_and_assemble` attached the check
        sol = raise_failure(sol, trajectories.reported_result(sol.result))
    return sol


def _check_initial_state(system, formulation, t0, q0, v0, trajectories) -> None:
    """A `ValueError` naming the first problem of concrete initial states
    (`check_initial_state`), with the value it quotes."""
    mass, flags, values, where = trajectories.initial_state_check(system, formulation, t0,
                                                                  q0, v0)
    if not flags.any():
        return
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


@jit_unless_staged
def solve_and_assemble(system, formulation, times: Times, q0, v0, options: SolveOptions,
                       checks: TracedChecks, trajectories: AbstractTrajectories,
                       settings: EventDriven | None = None, fails: bool = True):
    """The solve and its `Solution`; if anything is `checks.traced`, with its checks
    attached (`check_traced`); event-driven with `settings` (a system with gaps); stopped
    by the formulation's failure test where it `fails` (`fails_with` the system's
    constraint counts)."""
    checked_q0, checked_v0, checked = q0, v0, (times, options.dt0, options.stepsize_controller)
    if checks.traced and not checks.throw:
        q0, v0 = trajectories.solvable_start(q0, v0)  # the others: `invalid_input`
    if checks.traced:  # bad traced times and steps: jaxdae's checks name them, not diffrax's
        times, dt0, controller = solvable_inputs(*checked)
        options = eqx.tree_at(lambda o: (o.dt0, o.stepsize_controller), options,
                              (dt0, controller), is_leaf=lambda x: x is None)
    t0, ts = times.t0, times.ts
    reference = None
    if fails:
        # Detached before the call: stopped after it, the call would still be linearized.
        reference = trajectories.failure_reference(*detached((system, formulation, t0, q0, v0)))
    # A constant mass matrix is factored once, here, not at every stage (an ensemble's
    # trajectories share the system, so they share it too).
    args = SolveArgs(system, formulation, reference,
                     constant_mass_factor(system, t0, *trajectories.first_state(q0, v0),
                                          system_terms))
    dynamics, solver = trajectories.dynamics(args, options.solver, fails)
    options = eqx.tree_at(lambda o: o.solver, options, solver)
    if settings is None:
        out, result = integrate(dynamics, args, (q0, v0), times, options)
    else:
        out, result = integrate_with_events(event_dynamics(dynamics), args, (q0, v0), times,
                                            options, settings)
    sol, initial = trajectories.solution(system, formulation, (t0, q0, v0), ts, out, result,
                                         jax.lax.stop_gradient(options.residual_limit(q0, v0)),
                                         reverse_only(options.adjoint))
    if settings is not None:
        sol = eqx.tree_at(lambda x: x.events, sol, out.events, is_leaf=lambda x: x is None)
    if checks.traced:
        sol = check_traced(sol, system, formulation, checked[0],
                           (checked_q0, checked_v0, *initial), checks, trajectories, checked[1:])
    return sol
