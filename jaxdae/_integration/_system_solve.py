"""The solve of a system with its formulation, behind [`jaxdae.simulate`][] and
[`jaxdae.simulate_ensemble`][], in three stages, each entered once:

1. **problem** (`_problem.py`): every input checked, the options resolved, as an immutable
   `Problem`;
2. **integrate** (`integrate_problem`): the term of the system and its formulation
   (`_term.py`), and the one diffrax solve of it, or the event loop around it
   (`_events.py`);
3. **outcome** (`_outcome.py`): the [`jaxdae.Solution`][], its failures named and
   reported.

Stages 2 and 3 (but the names of an eager call's failure) are one compiled program. Where
one trajectory and an ensemble differ, the stages ask the problem's
`AbstractTrajectories`."""

import equinox as eqx

from .._solution import Solution
from .._systems._mass import constant_mass_factor
from ._adjoint import forward_mode_hint, jit_unless_staged
from ._events import event_dynamics, integrate_with_events
from ._outcome import assemble_outcome, report
from ._problem import Problem, pose_problem
from ._solve import SolveCall, in_current_mesh, integrate
from ._trajectories import AbstractTrajectories
from ._vector_fields import detached, system_terms


@in_current_mesh
def solve_system(
    system, formulation, t0, t1, q0, v0, call: SolveCall, trajectories: AbstractTrajectories
) -> Solution:
    """The solve of a call of `simulate` or `simulate_ensemble` (as `trajectories`)."""
    problem = pose_problem(system, formulation, t0, t1, q0, v0, call, trajectories)
    with forward_mode_hint():
        sol = solve_problem(problem)
    return report(problem, sol, call.throw)


@jit_unless_staged
def solve_problem(problem: Problem) -> Solution:
    """The compiled solve of `problem`: its integration and its outcome."""
    solved = problem.solvable()
    out, result = integrate_problem(solved)
    return assemble_outcome(problem, solved, out, result)


def integrate_problem(problem: Problem):
    """The second stage: the term of the problem's system and formulation, and its one
    diffrax solve, or the event loop around it for a system with gaps. Returns diffrax's
    solution (the event loop's `EventSolve`) and jaxdae's result."""
    system, formulation, trajectories = problem.system, problem.formulation, problem.trajectories
    t0, q0, v0 = problem.times.t0, problem.q0, problem.v0
    reference = None
    if problem.fails:
        # Detached before the call: stopped after it, the call would still be linearized.
        reference = trajectories.failure_reference(*detached((system, formulation, t0, q0, v0)))
    # A constant mass matrix is factored once, here, not at every stage (an ensemble's
    # trajectories share the system, so they share it too).
    mass_factor = constant_mass_factor(system, t0, *trajectories.first_state(q0, v0), system_terms)
    dynamics, solver = trajectories.dynamics(
        system, formulation, reference, mass_factor, problem.options.solver, problem.fails
    )
    options = eqx.tree_at(lambda o: o.solver, problem.options, solver)
    if problem.events is None:
        return integrate(dynamics, (q0, v0), problem.times, options)
    return integrate_with_events(
        event_dynamics(dynamics), (q0, v0), problem.times, options, problem.events
    )
