"""The third stage of a solve of a system with its formulation: the outcome. Inside the
compiled solve it builds the [`jaxdae.Solution`][] (the saved states and their
diagnostics, `assemble_solution`) and attaches the checks of a traced call as one error
(`check_traced`; with `throw=False`, as its result); after it, on a concrete solution, it
names what an eager call can name and no compiled solve does (the non-finite term of a
stalled solve, a solver's own stall) and raises [`jaxdae.SimulationError`][] for a
failure (`raise_failure`)."""

import sys
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._constants import detached
from .._compilation._private_apis import (
    result_codes,
    result_messages,
    unvmap_any,
    with_result_codes,
)
from .._custom_types import Array
from .._gains import attach_checks, is_concrete
from .._solution import (
    RESULTS,
    SimulationError,
    Solution,
    failure_message,
    failure_text,
    residuals,
)
from ._diagnostics import (
    FIXED_STEP_RESIDUAL,
    NON_FINITE_RESULTS,
    RESIDUAL_TOLERANCE_FACTOR,
    non_finite_term,
)
from ._problem import Problem, SolveOptions
from ._solvers import AbstractFailureNamingSolver, AbstractSolverWrapper
from ._validation import (
    INITIAL_STATE_MESSAGES,
    initial_state_problems,
    solvable_inputs,
    traced_input_checks,
)


def assemble_outcome(problem: Problem, solved: Problem, out, result) -> Solution:
    """The `Solution` of the solve `out` of `solved` (`problem` with the stand-ins of a
    traced call, `solvable`), whose jaxdae result is `result` (named by the solver,
    `name_result`): with the events of
    an event-driven solve, and with the checks of the traced inputs of `problem`
    (`check_traced`)."""
    trajectories = problem.trajectories
    times, options = solved.times, solved.options
    result = name_result(options.solver, result)
    limit = jax.lax.stop_gradient(residual_limit(options, solved.q0, solved.v0))
    sol, initial = trajectories.solution(
        solved.system,
        solved.formulation,
        (times.t0, solved.q0, solved.v0),
        times.ts,
        out,
        result,
        limit,
        problem.reverse_only,
    )
    if problem.events is not None:
        sol = eqx.tree_at(lambda x: x.events, sol, out.events, is_leaf=lambda x: x is None)
    if problem.checks.traced:
        sol = check_traced(
            sol,
            problem.system,
            problem.formulation,
            problem.times,
            (problem.q0, problem.v0, *initial),
            problem.checks,
            trajectories,
            (problem.options.dt0, problem.options.stepsize_controller),
        )
    return sol


def solver_layers(solver: diffrax.AbstractSolver) -> list[diffrax.AbstractSolver]:
    """`solver` and the solvers inside its jaxdae wrappers ([`AbstractSolverWrapper`][]),
    from the outside in."""
    layers = [solver]
    while isinstance(layers[-1], AbstractSolverWrapper):
        layers.append(layers[-1].solver)
    return layers


def name_result(solver, result: RESULTS) -> RESULTS:
    """`result` of a solve with `solver`, named by each of its layers (`solver_layers`)
    that names its failures (`AbstractFailureNamingSolver.name_result`)."""
    for layer in solver_layers(solver):
        if isinstance(layer, AbstractFailureNamingSolver):
            result = layer.name_result(result)
    return result


def name_stall(solver, sol: Solution, system) -> Solution:
    """`sol` (concrete) relabelled by each layer of `solver` that explains a stall
    (`AbstractFailureNamingSolver.name_stall`)."""
    for layer in solver_layers(solver):
        if isinstance(layer, AbstractFailureNamingSolver):
            sol = layer.name_stall(sol, system)
    return sol


def report(problem: Problem, sol: Solution, throw: bool) -> Solution:
    """After the compiled solve: a concrete solution's failure named by what only an eager
    call can evaluate (`name_non_finite_term`, the solver's `name_stall`), then raised as
    [`jaxdae.SimulationError`][] where the call asks (`throw`). A traced solve had its
    checks attached inside (`assemble_outcome`)."""
    if problem.checks.traced:
        return sol
    sol = name_non_finite_term(sol, problem.system, problem.formulation, problem.times.t0)
    sol = name_stall(problem.options.solver, sol, problem.system)
    if throw:
        sol = raise_failure(sol)
    return sol


def name_non_finite_term(sol, system, formulation, t0):
    """`sol` (concrete) with each stalled solve (`dt_min_reached`) whose model is non-finite
    at or just after its end relabelled by the term (`NON_FINITE_RESULTS`, found by
    `non_finite_term`). Done here, after the solve and only for a stalled one, rather than
    inside every compiled solve, where the probe would be a second copy of the equations of
    motion to compile (docs/design_measurements.md#non-finite-probe); traced solves keep
    `dt_min_reached`."""
    codes = np.array(result_codes(sol.result))
    stalled = np.asarray(sol.result == RESULTS.dt_min_reached)
    if not np.any(stalled) or formulation.derives_velocities:
        return sol  # (a formulation that maps the state to velocities: state not at hand)
    state = sol.v_final if system.state_is_velocity else sol.p_final
    for index in np.argwhere(stalled) if codes.ndim else [()]:
        index = tuple(index)
        code = int(
            non_finite_term(
                system, formulation, t0, sol.t_final[index], sol.q_final[index], state[index]
            )
        )
        if code:
            codes[index] = result_codes(NON_FINITE_RESULTS[code - 1])
    result = with_result_codes(sol.result, jnp.asarray(codes, codes.dtype))
    return eqx.tree_at(lambda s: s.result, sol, result)


def residual_limit(options: SolveOptions, q0, v0) -> tuple[Array, Array]:
    """The constraint residual a completed solve from `(q0, v0)` with `options` may end
    with (one per trajectory of an ensemble), and whether the formulation's
    `residual_allowance` adds to it: `constraint_tol` alone, by default
    `RESIDUAL_TOLERANCE_FACTOR · (atol + rtol · scale)` with an adaptive controller or
    `FIXED_STEP_RESIDUAL · scale` with fixed steps, `scale = max(1, |q0|, |v0|)`, plus
    the allowance."""
    scale = jnp.max(jnp.abs(jnp.concatenate([q0, v0], -1)), axis=-1, initial=1.0)
    if options.tolerances is None:
        default = FIXED_STEP_RESIDUAL * scale
    else:
        rtol, atol = options.tolerances
        default = RESIDUAL_TOLERANCE_FACTOR * (atol + rtol * scale)
    # (`nan`: none given; one program for calls with and without it.)
    tol = jnp.asarray(
        jnp.nan if options.constraint_tol is None else options.constraint_tol, q0.dtype
    )
    given = ~jnp.isnan(tol)
    limit = jnp.where(given, tol, default)
    return limit.astype(q0.dtype), jnp.broadcast_to(~given, limit.shape)


def raise_failure(sol):
    """`throw=True`: raises [`jaxdae.SimulationError`][] naming the failure of a concrete
    solution, or attaches the check (`eqx.error_if`) to a traced one (that of its first
    failed trajectory where it holds several, `reported_result`)."""
    if is_concrete(sol.result):
        message = failure_message(sol)
        if message is not None:
            raise SimulationError(message)
        return sol
    result = reported_result(sol.result)
    failed = result != RESULTS.successful
    return attach_check(
        sol, lambda x: raise_reported(x, sol, failed, lambda y: result.error_if(y, failed))
    )


def reported_result(result: RESULTS) -> RESULTS:
    """The one result that a raised error names: `result` itself, or where it holds one
    per trajectory (an ensemble) that of its first failed trajectory (the first if none
    failed)."""
    failed = result != RESULTS.successful
    if failed.ndim == 0:
        return result
    first = jnp.argmax(failed)
    return jax.tree.map(lambda x: x[first], result)


def raise_reported(x: Array, sol, wrong, error: Callable[[Array], Array]) -> Array:
    """`error(x)` (an `equinox.error_if` on `x`) where anything is `wrong` (`throw=True`
    inside the caller's `jit`, `vmap` or `grad`), after a host callback that, where the
    traced solve `sol` failed, writes [`failure_text`][] to standard error: what happened,
    the batch element, `t` and `q`; `x` itself where nothing is wrong.

    The error's message is fixed when the program is compiled, and under the caller's own
    `jax.jit` JAX puts its own lines before it; the line written first keeps the time and
    state. Both sit in one `lax.cond` on whether any element of the batch is wrong, so
    that a successful solve runs one conditional and no callback: each conditional with a
    host callback costs the gradient's program measurably
    (docs/design_measurements.md#traced-checks). An ensemble's first failed row is picked by
    reductions, so that a sharded ensemble is not gathered onto the callback's device."""
    codes = result_codes(sol.result)
    failed = sol.result != RESULTS.successful
    arrays = (codes, sol.t_final, sol.q_final, *residuals(sol))
    element = ()
    if codes.ndim:  # an ensemble: the values of its first failed row
        first = jnp.argmax(failed.reshape(-1))
        pick = (jnp.arange(codes.size) == first).reshape(codes.shape)

        def row(x):
            mask = pick.reshape(pick.shape + (1,) * (x.ndim - pick.ndim))
            return jnp.sum(jnp.where(mask, x, jnp.zeros((), x.dtype)), axis=tuple(range(pick.ndim)))

        arrays = tuple(row(x) for x in arrays)
        element = (jnp.stack(jnp.unravel_index(first, codes.shape)),)
    arrays = jax.lax.stop_gradient(arrays)
    dtype = x.dtype

    def report(*values):
        *values, row = values if element else (*values, None)
        message = failure_text(*values, element=row)
        if message is not None:
            print(f"jaxdae.SimulationError: {message}", file=sys.stderr, flush=True)
        return np.zeros(np.shape(values[1]), dtype)

    def raises():
        written = jax.pure_callback(
            report, jax.ShapeDtypeStruct((), dtype), *arrays, *element, vmap_method="broadcast_all"
        )
        return error(x + written)

    return jax.lax.cond(unvmap_any(jnp.any(wrong)), raises, lambda: x)


# Where a traced solve failed, its time and state are not in the message (it is fixed when
# the program is compiled); this says where to find them (`raise_reported`).
TRACED_HINT = (
    " (Traced: where the solve stopped is written to standard error just before "
    "this error; with `throw=False`, read `sol.result`, `sol.t_final` and "
    "`sol.q_final`.)"
)


# What a traced solve cannot name and an eager one does: the causes of a stalled step.
TRACED_CAUSES = {
    int(result_codes(RESULTS.dt_min_reached)): (
        " Its likely cause: a term of the model that turned non-finite (nan or inf) at the "
        "start or during the solve, or a mass matrix that is not positive definite there (a "
        "tree's negative mass or inertia). Called eagerly (outside `jit`, `vmap` and `grad`), "
        "the same solve names which."
    )
}


def invalid_as_result(sol, invalid):
    """`throw=False` with traced input: where `invalid` (a flag, or one per row of an
    ensemble), the solution's result is `RESULTS.invalid_input` and its floating fields
    are nan, instead of an error that would end a whole batch for one member."""
    invalid = jnp.asarray(invalid)
    result = sol.result
    codes = result_codes(result)
    result = with_result_codes(
        result, jnp.where(invalid, result_codes(RESULTS.invalid_input), codes).astype(codes.dtype)
    )

    def blank(x):
        if not eqx.is_inexact_array(x):
            return x
        return jnp.where(
            invalid.reshape(invalid.shape + (1,) * (x.ndim - invalid.ndim)), jnp.nan, x
        )

    sol = eqx.tree_at(lambda s: s.result, sol, result)
    return eqx.tree_at(
        lambda s: [getattr(s, f) for f in FLOAT_FIELDS],
        sol,
        [blank(getattr(sol, f)) for f in FLOAT_FIELDS],
    )


FLOAT_FIELDS = (
    "ts",
    "q",
    "v",
    "phi",
    "dphi",
    "psi",
    "multipliers",
    "energy",
    "t_final",
    "q_final",
    "v_final",
    "p",
    "p_final",
)


def attach_check(sol, check):
    """`sol` with `check(x)` (an `error_if` returning `x`) applied to a zero that every
    floating field then depends on (adding it). Through the whole solution, the check's
    `lax.cond` (whose callback runs on one device) made XLA gather a sharded ensemble's
    solution onto one device and partition it again."""
    checked = check(jnp.zeros((), sol.t_final.dtype))
    # `x · (1 + 0 · checked)`, not `x + checked`: the factor is a residual of reverse mode,
    # so that `jax.grad` (whose primal outputs go unused) keeps the check rather than
    # eliminating it as dead code.
    factor = 1 + 0 * checked
    return jax.tree.map(lambda x: x * factor.astype(x.dtype) if eqx.is_inexact_array(x) else x, sol)


def check_traced(
    sol, system, formulation, times, initial, checks, trajectories, steps=(None, None)
):
    """`sol` with the checks of a traced call (`checks`, the problem's `TracedChecks`)
    attached as one branched error: the gains' (`checks.gain_flags`), those of
    `check_initial_state` (`checks.check_state`) on
    `initial = (q0, v0, mass matrix, definite, forces)` (`initial_state_problems`), of the
    times and of `steps = (dt0, step-size controller)` (`traced_input_checks`), then
    (`checks.throw`) the failure of the solve, a stalled one with its likely causes
    (`TRACED_CAUSES`). `trajectories`: the solve's `AbstractTrajectories`.

    Where the system's factor shows whether `M` is positive definite (`definite` not
    None: the pivots of a tree's articulated or Cholesky factor), `M` and the forces at
    `q0` are not checked: the system's accelerations are nan where `M` is not positive
    definite (`factored_positive_definite`), so such a start stalls the solve at `t0`
    (`dt_min_reached`), as does an `M` that turns indefinite later. The solve's program
    then evaluates the equations at `q0` only for the diagnostics the caller reads.

    One `error_if` for all, each being a `lax.cond` with host callbacks. The initial
    state's checks run after the solve, on the mass matrix (or what its factor shows) and
    the forces that `assemble_solution` evaluated at the initial state: evaluated before it,
    on their own, they would be a second copy of the equations of motion in the compiled
    program, which XLA neither shares nor prunes (`experiments/benchmarks/bench_compile.py`
    counts the program's instructions). A solve from a bad state thus runs before the
    input's error is raised."""
    # The checks carry no gradient: their inputs are detached, so they are not linearized.
    system, formulation, times, initial, checks, steps = detached(
        (system, formulation, times, initial, checks, steps)
    )
    t0 = times.t0
    throw = checks.throw
    flags, messages = list(checks.gain_flags), checks.gain_messages
    rows_invalid = False
    if checks.check_state:
        if initial[3] is not None:
            # The system's factor shows whether `M` is positive definite, and its
            # accelerations are nan where it does not (`factored_positive_definite`): a bad
            # `M` or forces at `q0` stall the solve. Read here, they would keep the
            # evaluation of the equations at the initial state in the program (a third of
            # the humanoid's compile time, docs/benchmarks.md; on a small tree, the
            # diagnostics' loop: docs/design_measurements.md#tree-mass-check).
            initial = initial[:2]

        def problems(q0, v0, *terms, rows):
            return initial_state_problems(
                system, formulation, (t0, q0, v0), terms or None, sol.psi.shape[-1], rows
            )

        state_flags, rows_invalid = trajectories.traced_state_flags(problems, initial, throw)
        if state_flags is not None:
            flags += list(state_flags)
            messages += INITIAL_STATE_MESSAGES + tuple(m for m, _ in formulation.state_messages)
    inputs = traced_input_checks(times, *steps)
    flags += [flag for flag, _ in inputs]
    messages += tuple(message for _, message in inputs)
    flags = jnp.stack(flags)
    wrong, index = jnp.any(flags), jnp.argmax(flags)
    if not throw:
        return invalid_as_result(sol, wrong | rows_invalid)
    result = reported_result(sol.result)
    # Bad input is the error; the failure of the solve it ran (on stand-ins for bad times
    # or steps, `solvable_inputs`) is not reported.
    reported = eqx.tree_at(
        lambda s: s.result, sol, RESULTS.where(wrong, RESULTS.successful, sol.result)
    )
    index = jnp.where(wrong, index, len(messages) + result_codes(result))
    wrong = wrong | (result != RESULTS.successful)
    messages = messages + tuple(
        m + TRACED_CAUSES.get(code, "") + TRACED_HINT
        for code, m in enumerate(result_messages(RESULTS))
    )
    # Under `vmap` equinox reports the largest index of the batch: 0 where nothing is wrong.
    index = jnp.where(wrong, index, 0)
    return attach_check(
        sol,
        lambda x: raise_reported(
            x, reported, wrong, lambda y: eqx.branched_error_if(y, wrong, index, messages)
        ),
    )


def solve_traced_inputs(solve, times, options, throw: bool):
    """`solve(times, options)` (a solve without `check_traced`: `simulate_actuated`'s)
    with bad traced times, first step and tolerances (`traced_input_checks`) replaced by
    stand-ins that diffrax accepts (`solvable_inputs`), and reported: with `throw`, an
    error with jaxdae's message; without, `RESULTS.invalid_input`."""
    checked = (times, options.dt0, options.stepsize_controller)
    if is_concrete(*checked):
        return solve(times, options)
    times, dt0, controller = solvable_inputs(*checked)
    sol = solve(
        times,
        eqx.tree_at(
            lambda o: (o.dt0, o.stepsize_controller),
            options,
            (dt0, controller),
            is_leaf=lambda x: x is None,
        ),
    )
    checks = traced_input_checks(*checked)
    if throw:
        return attach_checks(sol, checks)
    invalid = jnp.any(jnp.stack([jnp.asarray(flag) for flag, _ in checks]))
    return eqx.tree_at(
        lambda s: s.result, sol, RESULTS.where(invalid, RESULTS.invalid_input, sol.result)
    )
