"""The entry points of the solve of a system with its formulation: [`jaxdae.simulate`][]
for one trajectory and [`jaxdae.simulate_ensemble`][] for an ensemble of them, and the
solve behind both, in three stages, each entered once:

1. **problem** (`_problem.py`): the call's keyword arguments, every input checked, the
   options resolved, as an immutable `Problem`;
2. **integrate** (`integrate_problem`): the term of the system and its formulation
   (`_term.py`), and the one diffrax solve of it (`_solve.py`), or the event loop around it
   (`_events.py`);
3. **outcome** (`_outcome.py`): the [`jaxdae.Solution`][], its failures named and
   reported.

Stages 2 and 3 (but the names of an eager call's failure) are one compiled program. Where
one trajectory and an ensemble differ, the stages ask the problem's
`AbstractTrajectories`."""

import contextlib
from collections.abc import Sequence
from typing import Unpack

import equinox as eqx
import jax.numpy as jnp

from .._compilation._constants import jit_unless_staged
from .._compilation._linalg import full_precision
from .._compilation._sharding import in_current_mesh
from .._custom_types import ArrayLike, Float, ScalarLike
from .._formulations import AbstractFormulation
from .._solution import Solution
from .._systems._system import AbstractSystem
from ._contact_schemes import EventDriven
from ._events import event_dynamics, integrate_with_events
from ._outcome import assemble_outcome, report
from ._problem import Problem, SolveKeywords, Times, pose_problem
from ._solve import integrate
from ._time_stepping import TimeStepping
from ._trajectories import AbstractTrajectories, EnsembleTrajectories, SingleTrajectory
from ._validation import solvable_inputs


class SimulateKeywords(SolveKeywords, total=False):
    """[`jaxdae.simulate`][]'s keyword arguments: the solve's and `events`."""

    events: EventDriven | TimeStepping | None


# The layouts of the trajectories (strategies without fields: one instance each).
SINGLE_TRAJECTORY, ENSEMBLE_TRAJECTORIES = SingleTrajectory(), EnsembleTrajectories()


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
            "reverse mode only (`jax.grad`, `jax.vjp`)."
        ) from error


@full_precision
def simulate(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, " n"] | Sequence[float],
    v0: Float[ArrayLike, " n"] | Sequence[float],
    **options: Unpack[SimulateKeywords],
) -> Solution:
    """Simulates a constrained system, turned into an ODE by `formulation`, with diffrax.

    Works under `jax.jit`, `jax.vmap` (over initial states, gains, system parameters) and
    `jax.grad` (w.r.t. gains, parameters, initial state and times; see `adjoint`).

    **Arguments:**

    - `system`: a [`jaxdae.LagrangianSystem`][] (or another `AbstractSystem`).
    - `formulation`: how the constraints are enforced, e.g. [`jaxdae.Baumgarte`][],
        [`jaxdae.PseudoInverse`][], [`jaxdae.ModifiedLagrange`][], [`jaxdae.Unstabilized`][].
    - `t0`, `t1`: start and end time, `t1 > t0`. Python numbers are compiled into the
        solve, as `diffrax.diffeqsolve` compiles its own: each value compiles a new
        program. Pass arrays (`jnp.asarray(t1)`) where they change between calls: one
        program then serves all their values.
    - `q0`, `v0`: initial coordinates and velocities, shape `(n,)` — for a system whose
        state holds momenta ([`jaxdae.HamiltonianSystem`][]) `v0` is the initial momenta
        `p0` (Shemelova (2016), eqs. [3]–[6]). They need not satisfy
        the constraints (the stabilized formulations pull them back); see
        [`jaxdae.consistent_initial_state`][] for a consistent start.

    Keyword arguments (any other is refused with a `TypeError` that lists these):

    - `ts`: times at which to save the solution. Default: `[t0, t1]`.
    - `solver`: any diffrax ODE solver. Default `diffrax.Tsit5()` (adaptive, explicit).
    - `stepsize_controller`: default `diffrax.PIDController(rtol, atol)`; pass
        `diffrax.ConstantStepSize()` (with `dt0`) for a fixed-step method.
    - `dt0`: initial step; default chosen automatically by the controller.
    - `rtol`, `atol`: tolerances of the default step-size controller, default `1e-8` and
        `1e-10`: finite and non-negative, not both zero, `rtol` at most 1 (SUNDIALS' rule:
        either may be zero alone; see [Failures and guarantees](../failures.md#the-rules)).
    - `max_steps`: maximum number of steps. Default `100_000`.
    - `adjoint`: how gradients are computed; both defaults are discretize-then-optimize
        (the exact gradient of the computed solution). Default for explicit Runge–Kutta
        solvers (with an integer `max_steps`): [`jaxdae.ReverseSweepAdjoint`][]`()`, the
        discrete adjoint swept over the stored steps, at most 1024 at once (segments
        beyond are re-solved from checkpoints); for other solvers
        `diffrax.RecursiveCheckpointAdjoint(checkpoints=32)`. Both work in reverse mode
        (`jax.grad`); forward mode (`jax.jvp`, `jax.jacfwd`) needs
        `adjoint=diffrax.ForwardMode()` (a `ValueError` says so). Other diffrax adjoints
        may be passed, except `diffrax.ImplicitAdjoint` (steady states only) and, where the
        solve stops at events (a formulation's singularity test, gaps, fixed steps),
        `diffrax.BacksolveAdjoint`: both are refused with a `ValueError`.
    - `throw`: raise [`jaxdae.SimulationError`][] when the solve fails (the message says what
        happened, at which `t` and `q`; the default); with `False` inspect
        `Solution.result` instead.
    - `constraint_tol`: the largest constraint residual `max(|Φ|, |Ψ|)` at `t1` that a
        completed solve may end with; beyond it (and beyond the residual at `t0`) the solve
        ends with `RESULTS.constraint_tol_exceeded`. Default:
        `1000 · (atol + rtol · scale)` with an adaptive controller's tolerances,
        `10⁻³ · scale` with fixed steps, `scale = max(1, |q0|, |v0|)`, plus ten times the
        violation that a penalty formulation leaves by design
        (`AbstractFormulation.residual_allowance`), and never below the
        violation at `t0` (`|Φ|`, `|Φ̇|`, `|Ψ|`); no limit for [`jaxdae.Unstabilized`][].
        Pass `jnp.inf` to accept any residual.
    - `events`: how the system's one-sided constraints
        ([`jaxdae.AbstractSystem.gaps`][]) are treated: [`jaxdae.EventDriven`][]
        (the default where the system has gaps) stops at every impact and applies the
        impact law; [`jaxdae.TimeStepping`][] takes fixed steps with all contacts and
        their friction in one convex problem per step (no `solver`,
        `stepsize_controller` or `dt0` then: the step is its `dt`, and `max_steps`
        defaults to the steps of the span). Unless `adjoint` says otherwise, event-driven
        solves are differentiated by `diffrax.RecursiveCheckpointAdjoint` and
        time-stepped ones by [`jaxdae.ReplayAdjoint`][].

    **Returns:**

    A [`jaxdae.Solution`][] (with its `events` where the system has gaps and the solve is
    event-driven).

    **Raises:**

    `ValueError` for bad input (shapes, non-finite values, a mass matrix that is not
    symmetric positive definite at `q0`, gains that are not positive definite, a
    `velocity_constraints` that is not affine in the velocities, non-finite times,
    `t1 <= t0`, unsorted `ts`, tolerances that break the rule above, complex or float16
    values); [`jaxdae.SimulationError`][] for a failed solve with `throw=True`; `TypeError`
    for a keyword argument not listed above, or text where a number belongs (`t1="2"`).
    Traced, the same checks are attached to the solve, except that a tree
    ([`jaxdae.multibody.TreeMechanism`][]) is not checked for a mass matrix that is not
    positive definite at `q0` (or non-finite forces there): its accelerations are nan
    where its factor's pivots show `M` not positive definite, so the solve stalls
    (`dt_min_reached`; docs/failures.md).
    """
    return solve_system(
        system,
        formulation,
        t0,
        t1,
        q0,
        v0,
        ("simulate", options, SimulateKeywords),
        SINGLE_TRAJECTORY,
    )


@full_precision
def simulate_ensemble(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, "B n"],
    v0: Float[ArrayLike, "B n"],
    **options: Unpack[SolveKeywords],
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
    smaller near every trajectory's failure. A trajectory whose model turns non-finite (a
    force that becomes nan) stops alone in the same way, once the shared step has shrunk to
    the rounding level of `t` on its account, with the result `simulate` gives it
    (`dt_min_reached`, named by the non-finite term when called eagerly;
    `non_finite_state` with fixed steps).

    **Arguments:**

    As for [`jaxdae.simulate`][], except:

    - `q0`, `v0`: initial coordinates and velocities (or momenta), shape `(B, n)`.
    - `constraint_tol`: as for `simulate`, each trajectory's default from its own
        initial state.
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
    return solve_system(
        system,
        formulation,
        t0,
        t1,
        q0,
        v0,
        ("simulate_ensemble", options, SolveKeywords),
        ENSEMBLE_TRAJECTORIES,
    )


@in_current_mesh
def solve_system(
    system,
    formulation,
    t0,
    t1,
    q0,
    v0,
    call: tuple[str, dict, type],
    trajectories: AbstractTrajectories,
) -> Solution:
    """The solve of a call of `simulate` or `simulate_ensemble` (as `trajectories`), whose
    keyword arguments are `call = (entry point, keyword arguments, the accepted ones)`."""
    problem, throw = pose_problem(system, formulation, t0, t1, q0, v0, call, trajectories)
    with forward_mode_hint():
        sol = solve_problem(problem)
    return report(problem, sol, throw)


@jit_unless_staged
def solve_problem(problem: Problem) -> Solution:
    """The compiled solve of `problem`: its integration and its outcome."""
    solved = solvable(problem)
    out, result = integrate_problem(solved)
    return assemble_outcome(problem, solved, out, result)


def compiled_times(times: Times) -> Times:
    """`times` inside the compiled solve: `t0` and `t1` the constants `times.given` where
    the call gave them as Python numbers, as `diffrax.diffeqsolve` compiles its own. XLA
    then folds what depends on them, diffrax's threshold for the last step among it (100
    `prevbefore`s of `t1`; docs/design_measurements.md#times-compiled-in). Each value
    compiles its own program; times given as arrays stay inputs of one program for all
    their values."""
    if times.given is None:
        return times
    dtype = times.t0.dtype
    constants = tuple(jnp.asarray(t, dtype) for t in times.given)
    return eqx.tree_at(lambda t: (t.t0, t.t1), times, constants)


def solvable(problem: Problem) -> Problem:
    """The problem that a traced solve integrates: its times compiled in where given as
    Python numbers (`compiled_times`), bad traced times and steps replaced by stand-ins
    that diffrax accepts (jaxdae's checks name them, not diffrax's), and with
    `throw=False` the invalid initial states too (reported by their result)."""
    problem = eqx.tree_at(lambda p: p.times, problem, compiled_times(problem.times))
    if not problem.checks.traced:
        return problem
    q0, v0 = problem.q0, problem.v0
    if not problem.checks.throw:
        q0, v0 = problem.trajectories.solvable_start(q0, v0)
    times, dt0, controller = solvable_inputs(
        problem.times, problem.options.dt0, problem.options.stepsize_controller
    )
    options = eqx.tree_at(
        lambda o: (o.dt0, o.stepsize_controller),
        problem.options,
        (dt0, controller),
        is_leaf=lambda x: x is None,
    )
    return eqx.tree_at(
        lambda p: (p.q0, p.v0, p.times, p.options), problem, (q0, v0, times, options)
    )


def integrate_problem(problem: Problem):
    """The second stage: the term of the problem's system and formulation, and its one
    diffrax solve, or the event loop around it for a system with gaps. Returns diffrax's
    solution (the event loop's `EventSolve`) and jaxdae's result."""
    q0, v0 = problem.q0, problem.v0
    dynamics, solver = problem.trajectories.dynamics(
        problem.system,
        problem.formulation,
        problem.times.t0,
        q0,
        v0,
        problem.options.solver,
        problem.failure,
    )
    options = eqx.tree_at(lambda o: o.solver, problem.options, solver)
    if problem.events is None:
        return integrate(dynamics, (q0, v0), problem.times, options)
    return integrate_with_events(
        event_dynamics(dynamics), (q0, v0), problem.times, options, problem.events
    )
