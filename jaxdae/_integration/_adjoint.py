"""Gradients of a solve by a reverse sweep over its stored steps.

Reverse mode through diffrax's loop (`RecursiveCheckpointAdjoint`) differentiates
everything the loop does: the stage loop's buffers, the step-size controller, the saving,
the checkpoints, and that costs several times the right-hand side's own vector–Jacobian
products (`experiments/diagnostics/bench_rhs.py` times one step and its VJP).
[`jaxdae.ReverseSweepAdjoint`][] pays only for the latter: the forward solve stores the accepted
steps (a long solve in segments, re-solved from checkpoints), and the backward pass is the discrete
adjoint of the explicit Runge–Kutta step, applied step by step in reverse.
"""

import functools

import diffrax

from .. import _thresholds
from ._controllers import jump_times
from ._generalized_alpha import GeneralizedAlpha
from ._generalized_alpha_adjoint import GeneralizedAlphaAdjoint
from ._replay_adjoint import ReplayAdjoint
from ._rosenbrock import Rodas5P
from ._solvers import AbstractSteppingWrapper
from ._sweep_backward import swept_solve
from ._sweep_forward import (
    SAVE_Y,
    AbstractStoredStepsAdjoint,
    SweepOptions,
    SweepProblem,
    final_state,
    reads_solver_state,
    segment_plan,
    subsaves,
    unwrapped,
)
from ._term import terms_within


class ReverseSweepAdjoint(AbstractStoredStepsAdjoint):
    """Differentiates a solve by a reverse sweep over its stored steps: the discrete
    adjoint of an explicit Runge–Kutta method. A `diffrax.AbstractAdjoint`: pass it to
    `simulate` or to `diffrax.diffeqsolve` as `adjoint=`.

    The forward solve keeps the accepted steps' end times and states (see *Memory*). The
    backward pass walks the steps from the last to the first; for each it recomputes the
    stages from the stored state and applies the right-hand side's vector–Jacobian product
    at each stage
    (`ȳₙ = ȳₙ₊₁ + Σᵢ μᵢ`, `μᵢ = f_yᵀ(Yᵢ) λᵢ`, `λᵢ = h bᵢ ȳₙ₊₁ + h Σ_{j>i} a_ji μⱼ`), and
    the cotangents of the states saved inside the step through the solver's dense output.
    The step sizes are constants of the gradient, as diffrax's step-size controllers make
    them, so the gradient equals that of diffrax's `RecursiveCheckpointAdjoint` to
    rounding; it is cheaper because diffrax's loop is not differentiated
    (`experiments/benchmarks/bench_core.py`). Without reverse mode (a plain call, `jax.vmap`) the
    solve is diffrax's own loop, as with `RecursiveCheckpointAdjoint`.

    It is the default adjoint of `simulate`, [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][] for explicit Runge–Kutta solvers with an integer
    `max_steps`; pass `adjoint=jaxdae.ReverseSweepAdjoint(stored_steps=...)` to set its
    memory. In a solve of your own:

    ```python
    import diffrax
    import jax
    import jax.numpy as jnp
    import jaxdae

    def loss(k):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, k: -k * y + jnp.sin(t)), diffrax.Tsit5(),
            0.0, 2.0, 0.1, jnp.array([1.0, 2.0]), args=k,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
            max_steps=4096, adjoint=jaxdae.ReverseSweepAdjoint())
        return jnp.sum(sol.ys**2)

    jax.grad(loss)(0.7)  # equals the gradient with diffrax.RecursiveCheckpointAdjoint()
    ```

    - **Memory**: at most `stored_steps` steps are stored at once, `stored_steps × (state
      size + 1)` floats per trajectory (the default 1024: 40 kB for a two-coordinate
      system). A solve allowed more steps (`max_steps > stored_steps`) runs in segments of
      at most `stored_steps` steps: the forward solve keeps each segment's start (its state
      and the solver's and step-size controller's) and the last segment's steps, and the
      backward pass re-solves every earlier segment from its start before sweeping it. A
      solve that ends within its first segment, the usual case, is solved once, as with
      `stored_steps ≥ max_steps`. (With segments the step limit is `max_steps` rounded up
      to a multiple of the segments' length: at most `max_steps / stored_steps` more.)
      A re-solve must end where the forward solve's segment ended (to `√ε` times the
      largest of `|t0|`, `|t1|` and `t1 − t0`): one that does not, because rounding changed
      which steps were accepted (a chaotic or badly scaled solve), raises at run time
      rather than differentiate steps the solve did not take.
    - **Solves**: an ODE given as one `diffrax.ODETerm`; explicit Runge–Kutta methods with
      a Butcher tableau (`diffrax.AbstractERK`: `Tsit5`, `Dopri5`, `Bosh3`, `Heun`, … and
      [`jaxdae.UnrolledERK`][] of them); adaptive or constant steps (`PIDController`,
      `ConstantStepSize`, `StepTo`, `ClipStepSizeController`); an integer `max_steps`;
      saves at `t0`, `ts` and `t1` (any `SubSaveAt`s of those, and the final
      `solver_state`); events without a root finder (the solve stops at the end of the
      step where one triggers). Anything else raises `ValueError` when the solve is
      traced, naming the fix: an implicit solver, `max_steps=None`, `SaveAt(dense=True)`,
      `SaveAt(steps=True)`, `SubSaveAt(fn=...)`, a saved `controller_state` or
      `made_jump`, an event's `root_finder`, a `solver_state` passed to `diffeqsolve`.
    - **Gradients** with respect to `y0`, `args` and arrays held by the vector field
      (the term), of `simulate`, of `simulate_actuated` and of
      [`jaxdae.simulate_ensemble`][] (whose trajectories share the steps: the sweep runs
      once over the shared steps, every trajectory at once). Gradients with respect to
      `t0`, `t1`, the save times or `dt0` differentiate diffrax's loop instead
      (`diffrax.RecursiveCheckpointAdjoint`), inside the same call. Reverse mode only:
      forward mode (`jax.jvp`) needs `diffrax.ForwardMode()`.
    - **Terms**: a `diffrax.ODETerm`, or the term jaxdae builds for a system and its
      formulation. The term of [`jaxdae.simulate_ensemble`][] brings its own
      vector–Jacobian product (each trajectory's, row by row), which the sweep applies at
      each stage instead of differentiating the term.

    **Arguments:**

    - `stored_steps`: the most steps stored at once (see *Memory*).
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
        """diffrax's solve loop, whose reverse mode is the sweep (see the class)."""
        del throw, passed_controller_state  # `diffeqsolve` throws; the steps are constants
        _check_sweepable(terms, solver, saveat, event, max_steps, passed_solver_state)
        static = SweepOptions(
            solver=solver,
            stepsize_controller=stepsize_controller,
            event=event,
            progress_meter=progress_meter,
            max_steps=max_steps,
            segments=segment_plan(max_steps, self.stored_steps, stepsize_controller),
            tableau=explicit_tableau(solver),
            keeps_solver_state=reads_solver_state(terms),
        )
        problem = SweepProblem(
            terms=terms, args=args, init_state=init_state, t0=t0, t1=t1, dt0=dt0, saveat=saveat
        )
        return final_state(init_state, swept_solve(problem, static), saveat), {}


def _check_sweepable(terms, solver, saveat, event, max_steps, passed_solver_state) -> None:
    """A `ValueError` naming the fix for a solve that `ReverseSweepAdjoint` cannot sweep."""
    fix = "or differentiate through diffrax's loop, `adjoint=diffrax.RecursiveCheckpointAdjoint()`."
    explicit_tableau(solver)
    odes = terms_within(terms)
    if len(odes) != 1 or isinstance(odes[0], diffrax.MultiTerm):
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` differentiates an ODE given as one "
            f"`diffrax.ODETerm`; got {[type(x).__name__ for x in odes]}. Pass "
            f"`diffrax.ODETerm(vector_field)`, {fix}"
        )
    if max_steps is None:
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` stores the steps: pass an integer "
            "`max_steps` (it sizes the checkpoints of a long solve)."
        )
    if saveat.dense:
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` does not save a dense solution "
            f"(`SaveAt(dense=True)`): save at `SaveAt(ts=...)` instead, {fix}"
        )
    if saveat.controller_state or saveat.made_jump:
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` does not return the step-size "
            "controller's state or `made_jump` (`SaveAt(controller_state=True)`, "
            f"`SaveAt(made_jump=True)`): leave them unsaved, {fix}"
        )
    for sub in subsaves(saveat):
        if sub.steps:
            raise ValueError(
                "`jaxdae.ReverseSweepAdjoint` does not save every step "
                f"(`SaveAt(steps=True)`): save at `SaveAt(ts=...)` instead, {fix}"
            )
        if sub.fn is not SAVE_Y:
            raise ValueError(
                "`jaxdae.ReverseSweepAdjoint` saves the state itself: apply "
                f"`fn` to the saved states instead of `SaveAt(fn=fn)`, {fix}"
            )
    if event is not None and event.root_finder is not None:
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` stops a solve at the end of the step "
            "where an event triggers: pass `diffrax.Event(cond_fn)` without a "
            f"`root_finder`, {fix}"
        )
    if passed_solver_state:
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` recomputes the first step's stages "
            "from `y0`: do not pass `solver_state` to `diffeqsolve`, " + fix
        )


def explicit_tableau(solver) -> diffrax.ButcherTableau:
    """The Butcher tableau of an explicit Runge–Kutta `solver`, or a `ValueError`."""
    base = unwrapped(solver)
    if not isinstance(base, diffrax.AbstractERK):
        raise ValueError(
            "`jaxdae.ReverseSweepAdjoint` differentiates explicit Runge–Kutta solvers "
            f"(`diffrax.Tsit5`, `Dopri5`, `Bosh3`, `Heun`, …); got {type(base).__name__}. "
            "Use the default adjoint (`diffrax.RecursiveCheckpointAdjoint`) for this solver."
        )
    return base.tableau


def check_adjoint(adjoint, stops_at_events: bool, reason: str, contacts: str | None = None) -> None:
    """`ValueError` for a diffrax adjoint that cannot differentiate this solve:
    `diffrax.ImplicitAdjoint` (steady states only) always, `diffrax.BacksolveAdjoint` where
    the solve stops at events (`stops_at_events`, because of `reason`), and an adjoint that
    does not differentiate a solve of a system with gaps (`differentiates_contacts`) where
    the solve has `contacts` (what the contact scheme does: its events, its fixed steps)."""
    use = (
        "use the default (`adjoint=None`), `diffrax.RecursiveCheckpointAdjoint()` or "
        "`diffrax.ForwardMode()`"
    )
    if isinstance(adjoint, diffrax.ImplicitAdjoint):
        raise ValueError(
            "`adjoint=diffrax.ImplicitAdjoint()` differentiates steady states (a solve saved "
            f"at `t1` only, stopped by a steady-state event); a trajectory is not one: {use}."
        )
    if contacts is not None and not differentiates_contacts(adjoint):
        raise ValueError(
            f"`{type(adjoint).__name__}` does not differentiate {contacts}; leave `adjoint` "
            "unset (the default differentiates them) or pass `diffrax.ForwardMode()`."
        )
    if isinstance(adjoint, diffrax.BacksolveAdjoint) and stops_at_events:
        raise ValueError(
            "`adjoint=diffrax.BacksolveAdjoint()` cannot differentiate a solve that stops at "
            f"events, and this one does ({reason}): {use}; or a formulation without a "
            "stopping test, such as `jaxdae.ModifiedLagrange` or `jaxdae.PseudoInverse`."
        )


def resolve_adjoint(
    given: diffrax.AbstractAdjoint | None,
    solver: diffrax.AbstractSolver,
    max_steps: int | None,
    event_driven: bool,
    stops: tuple[str, ...],
    contacts: str | None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
) -> tuple[diffrax.AbstractAdjoint, bool]:
    """The adjoint of a solve, chosen once, and whether it differentiates in reverse mode
    only ([`reverse_only`][]): the `given` one, checked against the solve
    ([`check_adjoint`][]: `stops` names what stops it at events, `contacts` what its
    contact scheme does); else for an `event_driven` solve [`jaxdae.ReplayAdjoint`][] for
    each solve between two events where `max_steps` is at most `EVENT_REPLAY_MAX_STEPS`
    and `stepsize_controller` makes no jumps, diffrax's `RecursiveCheckpointAdjoint`
    otherwise, and for other solves [`default_adjoint`][] of `solver`."""
    check_adjoint(given, bool(stops), ", ".join(stops), contacts)
    if given is not None:
        adjoint = given
    elif event_driven:
        replays = (
            max_steps is not None
            and max_steps <= _thresholds.EVENT_REPLAY_MAX_STEPS
            and (stepsize_controller is None or jump_times(stepsize_controller) is None)
        )
        adjoint = _EVENT_REPLAY if replays else _CHECKPOINTED
    else:
        adjoint = default_adjoint(solver, max_steps)
    return adjoint, reverse_only(adjoint)


def default_adjoint(solver, max_steps) -> diffrax.AbstractAdjoint | ReverseSweepAdjoint:
    """The adjoint of a solve given none: [`adjoint_for`][] of `solver` where the solve has
    a step limit (the stored-steps adjoints store `max_steps` steps), else
    `diffrax.RecursiveCheckpointAdjoint` with `CHECKPOINTS` checkpoints."""
    adjoint = None if max_steps is None else adjoint_for(solver)
    return _CHECKPOINTED if adjoint is None else adjoint


@functools.singledispatch
def adjoint_for(solver: diffrax.AbstractSolver) -> diffrax.AbstractAdjoint | None:
    """The adjoint that differentiates solves with `solver` when the user gives none and
    the solve has a step limit, or None for diffrax's `RecursiveCheckpointAdjoint` (the
    default).

    Dispatched on the type of `solver` (`functools.singledispatch`, as lineax's operator
    rules are), so that a solver of one's own, or a diffrax solver jaxdae does not know,
    declares its adjoint by registering it:

    ```python
    jaxdae.extend.adjoint_for.register(MySolver, lambda solver: jaxdae.ReplayAdjoint())
    ```

    Registered here: [`jaxdae.ReverseSweepAdjoint`][] for explicit Runge–Kutta solvers
    (`diffrax.AbstractERK`), `GeneralizedAlphaAdjoint` for [`jaxdae.GeneralizedAlpha`][],
    [`jaxdae.ReplayAdjoint`][] for [`jaxdae.Rodas5P`][] and diffrax's implicit solvers (and,
    in `_time_stepping.py`, for the step of [`jaxdae.TimeStepping`][]); jaxdae's stepping
    wrappers (`AbstractSteppingWrapper`, such as `jaxdae.UnrolledERK`) take the adjoint of
    the solver they wrap. Dispatch follows the class, not `isinstance`, so another solver
    wrapper (which `diffrax.AbstractWrappedSolver` makes pass diffrax's `isinstance` tests
    of what it wraps) takes the default unless it is registered itself.

    **Arguments:**

    - `solver`: the solver (a stepping wrapper such as `jaxdae.UnrolledERK` takes the
        adjoint of the solver it wraps).

    **Returns:**

    A `diffrax.AbstractAdjoint`, or None.
    """
    del solver
    return None


# (One instance of each: adjoints are immutable, and a solve then builds none.)
_REVERSE_SWEEP, _GENERALIZED_ALPHA, _REPLAY = (
    ReverseSweepAdjoint(),
    GeneralizedAlphaAdjoint(),
    ReplayAdjoint(),
)
_CHECKPOINTED = diffrax.RecursiveCheckpointAdjoint(checkpoints=_thresholds.CHECKPOINTS)
_EVENT_REPLAY = ReplayAdjoint(stored_steps=_thresholds.EVENT_REPLAYED_STEPS)
adjoint_for.register(diffrax.AbstractERK, lambda solver: _REVERSE_SWEEP)
adjoint_for.register(GeneralizedAlpha, lambda solver: _GENERALIZED_ALPHA)
adjoint_for.register(Rodas5P, lambda solver: _REPLAY)
adjoint_for.register(diffrax.AbstractImplicitSolver, lambda solver: _REPLAY)
# A stepping wrapper takes the adjoint of the solver whose steps it computes.
adjoint_for.register(AbstractSteppingWrapper, lambda solver: adjoint_for(solver.solver))


@functools.singledispatch
def reverse_only(adjoint: diffrax.AbstractAdjoint) -> bool:
    """Whether `adjoint` differentiates a solve in reverse mode only (its forward mode
    raises): a custom VJP. Then the diagnostics at the saved states are differentiated by
    their own vector–Jacobian product, evaluated only where a loss reads them.

    Dispatched on the adjoint's class: registered true for diffrax's
    `RecursiveCheckpointAdjoint` and jaxdae's [`jaxdae.ReverseSweepAdjoint`][],
    `GeneralizedAlphaAdjoint` and [`jaxdae.ReplayAdjoint`][]; an adjoint of one's own that
    is a custom VJP registers itself."""
    del adjoint
    return False


for _adjoint_class in (
    ReverseSweepAdjoint,
    GeneralizedAlphaAdjoint,
    ReplayAdjoint,
    diffrax.RecursiveCheckpointAdjoint,
):
    reverse_only.register(_adjoint_class, lambda adjoint: True)


@functools.singledispatch
def differentiates_contacts(adjoint: diffrax.AbstractAdjoint | None) -> bool:
    """Whether `adjoint` differentiates a solve of a system with gaps, by events or by time
    stepping (`None`: the default adjoint, which does). Dispatched on the adjoint's class:
    registered false for [`jaxdae.ReverseSweepAdjoint`][], whose sweep re-solves the steps
    of one diffrax solve; an adjoint of one's own that cannot registers itself."""
    del adjoint
    return True


differentiates_contacts.register(ReverseSweepAdjoint, lambda adjoint: False)
