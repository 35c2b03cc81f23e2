"""The third stage of a solve of a system with its formulation: the outcome. Inside the
compiled solve it builds the [`jaxdae.Solution`][] (the saved states and their
diagnostics, `assemble_solution`) and attaches the checks of a traced call; after it, on a
concrete solution, it names what an eager call can name and no compiled solve does (the
non-finite term of a stalled solve, a solver's own stall) and reports a failure."""

import equinox as eqx
import jax

from .._solution import Solution
from ._adjoint import reverse_only
from ._failures import name_non_finite_term
from ._problem import Problem
from ._reporting import check_traced, raise_failure
from ._solvers import name_stall


def assemble_outcome(problem: Problem, solved: Problem, out, result) -> Solution:
    """The `Solution` of the solve `out` of `solved` (`problem` with the stand-ins of a
    traced call, `Problem.solvable`), whose jaxdae result is `result`: with the events of
    an event-driven solve, and with the checks of the traced inputs of `problem`
    (`check_traced`)."""
    trajectories = problem.trajectories
    times, options = solved.times, solved.options
    limit = jax.lax.stop_gradient(options.residual_limit(solved.q0, solved.v0))
    sol, initial = trajectories.solution(
        solved.system,
        solved.formulation,
        (times.t0, solved.q0, solved.v0),
        times.ts,
        out,
        result,
        limit,
        reverse_only(options.adjoint),
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
        sol = raise_failure(sol, problem.trajectories.reported_result(sol.result))
    return sol
