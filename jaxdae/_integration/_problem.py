"""The first stage of a solve of a system with its formulation ([`jaxdae.simulate`][],
[`jaxdae.simulate_ensemble`][]): the problem. It takes the call's keyword arguments
(`SolveCall`), checks every input once, resolves the options (solver, step-size
controller, adjoint, event settings) once, and returns them as an immutable `Problem`,
which the integration and the outcome only read."""

import difflib
from typing import Any, TypedDict

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._checks import check_instance, check_positive, check_tolerances
from .._compilation._sharding import explicit_to_auto, is_explicitly_sharded
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._formulations import AbstractFormulation
from .._gains import is_concrete
from .._solution import RESULTS
from .._systems._system import AbstractSystem
from ._adjoint import ReverseSweepAdjoint, default_adjoint, resolve_adjoint
from ._contact_schemes import AbstractContactScheme, EventDriven, event_settings
from ._implicit import configure_for_controller
from ._time_stepping import check_time_stepping
from ._trajectories import AbstractTrajectories
from ._validation import (
    INITIAL_STATE_MESSAGES,
    check_initial_state_jit,
    check_inputs,
    check_solve_options,
    checked_times,
    initial_state_message,
    warn_unstable_step,
)


def as_step_count(max_steps):
    """A NumPy integer `max_steps` as a Python `int`, the only kind diffrax and equinox
    take; anything else as given (`check_solve_options` judges it)."""
    if isinstance(max_steps, np.integer):
        return int(max_steps)
    return max_steps


# The solver of a call that names none.
DEFAULT_SOLVER = diffrax.Tsit5()

# What `constraint_tol` must be.
CONSTRAINT_TOL_RULE = (
    "`constraint_tol` must be a positive scalar (the largest constraint "
    "residual accepted at `t1`; `jnp.inf` accepts any)"
)


def traced_constraint_tol_check(
    call: "SolveCall", options: "SolveOptions"
) -> tuple[tuple[Array, str], ...]:
    """The run-time check of a traced `constraint_tol` (a flag and its message, as the
    traced gains' checks): positive, not nan. None given, or concrete (checked when the
    options are resolved): none."""
    if call.constraint_tol is None or is_concrete(options.constraint_tol):
        return ()
    tol = options.constraint_tol
    flag = ~(tol > 0) if tol.ndim == 0 else jnp.asarray(True)
    return ((flag, f"{CONSTRAINT_TOL_RULE}; got a value that is not."),)


class Times(eqx.Module):
    """The times of a checked solve: start, end and the save times (None: `[t0, t1]`), and
    `given`: `t0` and `t1` as Python floats where the call gave both as Python numbers
    (`given_numbers`)."""

    t0: Array
    t1: Array
    ts: Array | None
    # Static: equinox's `filter_jit` (and so `diffrax.diffeqsolve`) takes Python numbers as
    # static, and the compiled solve takes these as constants (`_simulate.compiled_times`),
    # one program per value.
    given: tuple[float, float] | None = eqx.field(static=True, default=None)


def given_numbers(t0, t1, times: tuple[Array, Array]) -> tuple[float, float] | None:
    """The checked `times = (t0, t1)` as Python floats where the call gave `t0` and `t1` as
    Python numbers and they are concrete, else None (`Times.given`)."""
    numbers = all(isinstance(t, int | float) and not isinstance(t, bool) for t in (t0, t1))
    if not numbers or not is_concrete(*times):
        return None
    return float(times[0]), float(times[1])


class SolveOptions(eqx.Module):
    """How a solve runs: diffrax's solver, step-size controller, first step, step limit and
    adjoint, with the defaults filled in."""

    solver: diffrax.AbstractSolver
    stepsize_controller: diffrax.AbstractStepSizeController
    dt0: Array | None
    max_steps: int | None = eqx.field(static=True)
    adjoint: diffrax.AbstractAdjoint | ReverseSweepAdjoint
    # The constraint residual a completed solve may end with (`nan` or None: the default
    # from `tolerances`).
    constraint_tol: Array | None = None
    # `(rtol, atol)` of an adaptive controller (None: fixed steps).
    tolerances: tuple[Array, Array] | None = None


class SolveKeywords(TypedDict, total=False):
    """The keyword arguments that [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][] share (`**options: Unpack[SolveKeywords]`), with their
    types: what each means is documented with `simulate`, the defaults are `SolveCall`'s."""

    ts: Float[ArrayLike, " N"] | None
    solver: diffrax.AbstractSolver | None
    stepsize_controller: diffrax.AbstractStepSizeController | None
    dt0: ScalarLike | None
    rtol: float
    atol: float
    max_steps: int | None
    adjoint: diffrax.AbstractAdjoint | None
    throw: bool
    constraint_tol: ScalarLike | None


class SolveCall(eqx.Module):
    """The keyword arguments of a call of [`jaxdae.simulate`][],
    [`jaxdae.simulate_ensemble`][] or [`jaxdae.simulate_actuated`][], with the defaults of
    those not given, and what the solve makes of them (`times`, `options`)."""

    ts: Float[ArrayLike, " N"] | None = None
    solver: diffrax.AbstractSolver | None = None
    stepsize_controller: diffrax.AbstractStepSizeController | None = None
    dt0: ScalarLike | None = None
    rtol: ScalarLike = 1e-8
    atol: ScalarLike = 1e-10
    max_steps: int | None = eqx.field(converter=as_step_count, default=100_000)
    adjoint: diffrax.AbstractAdjoint | ReverseSweepAdjoint | None = None
    throw: bool = True
    # How a system's one-sided constraints are treated (`_events.EventDriven`), or None.
    events: Any = None
    constraint_tol: ScalarLike | None = None
    # The keyword arguments the call passed (the others take their defaults).
    given: frozenset[str] = eqx.field(static=True, default=frozenset())

    @classmethod
    def of(cls, function: str, options: dict, accepted: type = SolveKeywords) -> "SolveCall":
        """The call of the entry point `function` with its keyword arguments `options`,
        which must be keys of the `TypedDict` `accepted`: a `TypeError` names any other, and
        the valid ones."""
        valid = list(accepted.__annotations__)
        for name in options:
            if name not in valid:
                close = difflib.get_close_matches(name, valid, n=1)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise TypeError(
                    f"{function}() got an unexpected keyword argument {name!r}.{hint} Its "
                    f"keyword arguments are: {', '.join(valid)}."
                )
        return cls(**options, given=frozenset(options))

    def check_options(self) -> None:
        """`check_solve_options` of the solver, controller, adjoint and step limit."""
        check_solve_options(self.solver, self.stepsize_controller, self.adjoint, self.max_steps)

    def times(self, t0, t1, dtype) -> Times:
        """`t0`, `t1` and `ts` as arrays of `dtype`, checked (`checked_times`)."""
        span = checked_times(self, t0, t1, dtype)
        return Times(*span, given=given_numbers(t0, t1, span[:2]))

    def options(
        self,
        dtype,
        times: Times,
        norm=optx.rms_norm,
        adjoint: diffrax.AbstractAdjoint | None = None,
    ) -> SolveOptions:
        """The solve's options with the defaults filled in: `step_options` (the default
        controller measures errors with `norm`; `dt0` checked against `times`), an implicit
        solver's root finder set to stop at the step's tolerance
        (`configure_for_controller`), and `adjoint` (as `resolve_adjoint` chose it; None:
        the call's, else `default_adjoint`)."""
        stepsize_controller, dt0 = step_options(
            self.stepsize_controller,
            self.dt0,
            self.rtol,
            self.atol,
            dtype,
            (times.t0, times.t1),
            norm,
        )
        solver = (
            DEFAULT_SOLVER
            if self.solver is None
            else configure_for_controller(self.solver, stepsize_controller)
        )
        if adjoint is None:
            adjoint = (
                default_adjoint(solver, self.max_steps) if self.adjoint is None else self.adjoint
            )
        tolerances = None
        if isinstance(stepsize_controller, diffrax.AbstractAdaptiveStepSizeController):
            tolerances = tuple(
                jnp.asarray(x, dtype) for x in (stepsize_controller.rtol, stepsize_controller.atol)
            )
        constraint_tol = jnp.asarray(
            jnp.nan if self.constraint_tol is None else self.constraint_tol, dtype
        )
        if self.constraint_tol is not None and is_concrete(constraint_tol):
            given = np.asarray(self.constraint_tol)
            if not (given.ndim == 0 and np.isreal(given) and given > 0):
                raise ValueError(f"{CONSTRAINT_TOL_RULE}; got {self.constraint_tol}.")
            if not constraint_tol > 0:
                raise ValueError(
                    f"`constraint_tol={self.constraint_tol}` is zero in {np.dtype(dtype).name}"
                    f", the precision of `q0` and `v0`: pass at least "
                    f"{float(jnp.finfo(dtype).smallest_normal):.3g}."
                )
        return SolveOptions(
            solver=solver,
            stepsize_controller=stepsize_controller,
            dt0=dt0,
            max_steps=self.max_steps,
            adjoint=adjoint,
            constraint_tol=constraint_tol,
            tolerances=tolerances,
        )


def step_options(stepsize_controller, dt0, rtol, atol, dtype, span, norm=optx.rms_norm):
    """The step-size controller (default: `diffrax.PIDController(rtol, atol, norm)`) and
    `dt0`, with the numbers as arrays of `dtype`, `dt0` checked against the solve's
    `span = (t0, t1)` ([`check_first_step`][]). Python floats would be static arguments of
    the compiled solve: a sweep over `τ = dt0` or over tolerances would compile at every
    value."""
    given = stepsize_controller
    if stepsize_controller is None:
        check_tolerances(rtol, atol)
        stepsize_controller = diffrax.PIDController(
            rtol=jnp.asarray(rtol, dtype), atol=jnp.asarray(atol, dtype), norm=norm
        )
    if dt0 is None:
        return stepsize_controller, None
    dt0 = jnp.asarray(dt0, dtype)
    check_positive("dt0", dt0, "step")
    check_first_step(dt0, *span, given)
    return stepsize_controller, dt0


def stall_floor(t, t0, t1, xnp=jnp):
    """The shortest step `StopStalledSteps` lets an adaptive solve of `[t0, t1]` propose at
    `t`: `4 ε max(|t|, 10⁻³ |t1 − t0|)`, `ε` the machine epsilon of `t`'s dtype."""
    eps = xnp.finfo(xnp.result_type(t)).eps
    return 4 * eps * xnp.maximum(xnp.abs(t), 1e-3 * xnp.abs(t1 - t0))


def check_first_step(dt0, t0, t1, stepsize_controller) -> None:
    """`ValueError` where a concrete first step `dt0` of an adaptive solve (the default
    controller or an adaptive one) is not above `stall_floor` at `t0`: `StopStalledSteps`
    would stop the solve at once with `dt_min_reached`, blaming the model. Traced values,
    and `dt0` that are not positive finite scalars (`step_options` names those), pass."""
    adaptive = stepsize_controller is None or isinstance(
        stepsize_controller, diffrax.AbstractAdaptiveStepSizeController
    )
    if dt0 is None or not adaptive or not is_concrete(dt0, t0, t1) or np.ndim(dt0) != 0:
        return
    step = float(dt0)
    floor = float(stall_floor(np.asarray(t0), np.asarray(t0), np.asarray(t1), np))
    if np.isfinite(step) and 0 < step <= floor:
        raise ValueError(
            f"`dt0` = {step:.3g} is not above the shortest step an adaptive solve may propose, "
            f"4 ε max(|t0|, 10⁻³ |t1 − t0|) = {floor:.3g} (ε the machine epsilon of the "
            "times' dtype): the solve would stop at its first step as stalled "
            "(`dt_min_reached`). Pass a larger `dt0`, e.g. 1e-3 of the span, or leave it "
            "None (the controller then picks the first step)."
        )


class TracedChecks(eqx.Module):
    """What a solve checks when anything is `traced` (`check_traced`): the checks of
    traced gains (`gain_flags`, one message each: the formulation's `traced_checks`), the
    initial state (`check_state`: a traced state) and the times, and the solve's failure
    (`throw`)."""

    gain_flags: tuple
    gain_messages: tuple[str, ...] = eqx.field(static=True)
    traced: bool = eqx.field(static=True)
    check_state: bool = eqx.field(static=True)
    throw: bool = eqx.field(static=True)


class Problem(eqx.Module):
    """A checked solve: the system and its formulation (in the state's precision), the
    times, the initial states, the resolved options, the event settings (None: the system
    has no gaps), the result that the formulation's failure test reports where it can stop
    the solve (`failure`; None where it cannot), whether the adjoint differentiates in
    reverse mode only (`reverse_only`), what is checked when anything is traced (`checks`)
    and the layout of the trajectories. Whether a failure raises is the call's `throw`, read
    after the compiled solve (by `report`), so that calls with and without it share one
    program."""

    system: AbstractSystem
    formulation: AbstractFormulation
    times: Times
    q0: Array
    v0: Array
    options: SolveOptions
    events: EventDriven | None
    failure: RESULTS | None
    reverse_only: bool = eqx.field(static=True)
    checks: TracedChecks
    trajectories: AbstractTrajectories


def pose_problem(
    system,
    formulation,
    t0,
    t1,
    q0,
    v0,
    call: tuple[str, dict, type],
    trajectories: AbstractTrajectories,
) -> tuple[Problem, bool]:
    """The `Problem` of a call of `simulate` or `simulate_ensemble` (as `trajectories`),
    whose keyword arguments are `call = (entry point, keyword arguments, the accepted
    ones)` (`SolveCall.of`): its inputs checked (eagerly where they are concrete; the
    checks of traced ones are collected in `checks`) and its options resolved. Returned
    with the call's `throw`, which `report` reads after the compiled solve."""
    call = SolveCall.of(*call)
    q0, v0, one = trajectories.initial_states(explicit_to_auto(q0), explicit_to_auto(v0))
    if is_explicitly_sharded(q0) or is_explicitly_sharded(v0):
        raise ValueError(
            "`q0` and `v0` are traced with an Explicit sharding in their type (a mesh from "
            "`jax.make_mesh` with its default axis types); jaxdae's solves do not support "
            "those. Build the mesh with `axis_types=(jax.sharding.AxisType.Auto,)` or pass "
            "the placed arrays from outside `jax.jit`."
        )
    dtype = q0.dtype
    # The contact scheme, consulted here once: time stepping is a solver with a fixed step
    # and no event loop (`events` None); exact events (the default) where the system has
    # gaps.
    check_instance(
        "events",
        call.events,
        AbstractContactScheme,
        "`jaxdae.EventDriven(...)` or `jaxdae.TimeStepping(...)`",
        optional=True,
    )
    call, stepping = (call, None) if call.events is None else call.events.configure(call, t0, t1)
    # The state's dtype sets the precision: float32 states give a float32 simulation. (A
    # time step factors the dense `M` itself.)
    system, formulation, span, counts, gap_shape, gain_checks, failure = check_inputs(
        system, formulation, call, t0, t1, one, dtype, dense_mass=stepping is not None
    )
    times = Times(*span, given=given_numbers(t0, t1, span[:2]))
    t0 = times.t0
    # Traced gains' checks join the solve's one branched error (`check_traced`).
    gain_checks = list(gain_checks)
    eager = is_concrete(system, t0, q0, v0)
    if eager:
        _check_initial_state(system, formulation, t0, q0, v0)

    events = None
    if stepping is not None:
        check_time_stepping(system, formulation, trajectories, t0, q0, one[0], eager)
        call = eqx.tree_at(lambda c: c.solver, call, stepping.solver(dtype), is_leaf=_none)
    elif gap_shape != (0,):
        events = event_settings(system, call, trajectories, t0, q0, one[0], gap_shape, eager)
    if events is not None or stepping is not None:
        gap_tolerance = (
            events.tolerance(q0.dtype)
            if events is not None
            else float(0.01 * np.sqrt(np.finfo(q0.dtype).eps))
        )
        gain_checks += stop_value_checks(system, t0, q0, gap_tolerance)
    fixed_steps = isinstance(call.stepsize_controller, diffrax.ConstantStepSize)
    # (Known from the constraint counts: a test that cannot fail is not traced.)
    stops = tuple(
        reason
        for stops, reason in (
            (
                failure is not None,
                f"{type(formulation).__name__}'s test for singular configurations",
            ),
            (events is not None or stepping is not None, "the system's gaps"),
            (fixed_steps, "fixed steps' test for a non-finite state"),
        )
        if stops
    )
    contacts = None
    if events is not None:
        contacts = "the events of a system with `gaps`"
    elif stepping is not None:
        contacts = "time stepping"
    solver = DEFAULT_SOLVER if call.solver is None else call.solver
    adjoint, reverse_only = resolve_adjoint(
        call.adjoint,
        solver,
        call.max_steps,
        events is not None,
        stops,
        contacts,
        call.stepsize_controller,
    )
    options = call.options(dtype, times, trajectories.error_norm, adjoint)
    if fixed_steps:
        warn_unstable_step(formulation, counts, solver, options.dt0)
    # Anything traced (a gain, a state, a time, an option such as `constraint_tol`) makes
    # the solution traced: its failures are reported from inside the program.
    traced = not is_concrete(system, formulation, times, q0, v0, options)
    gain_checks += traced_constraint_tol_check(call, options)
    # Untraced, `throw` acts after the solve: calls with and without it share one program.
    checks = TracedChecks(
        gain_flags=tuple(flag for flag, _ in gain_checks),
        gain_messages=tuple(message for _, message in gain_checks),
        traced=traced,
        check_state=not eager,
        throw=call.throw and traced,
    )
    problem = Problem(
        system=system,
        formulation=formulation,
        times=times,
        q0=q0,
        v0=v0,
        options=options,
        events=events,
        failure=failure,
        reverse_only=reverse_only,
        checks=checks,
        trajectories=trajectories,
    )
    return problem, call.throw


def _none(x) -> bool:
    return x is None


def stop_value_checks(system, t0, q0, gap_tolerance: float) -> list[tuple[Array, str]]:
    """The checks of a system's stop data (a flag and its message each): coefficients of
    restitution in `[0, 1]`, finite non-negative coefficients of friction, finite gaps at
    the start that none violates by more than `gap_tolerance`, and the system's own
    `stop_checks`. Where the values are concrete a
    `ValueError` names the first problem; where they are traced (a system or state under
    `jit`, `vmap` or `grad`) the flags join the traced checks (`check_traced`:
    `invalid_input` with `throw=False`)."""
    restitution = jnp.asarray(system.restitution())
    friction = jnp.asarray(system.friction())
    # Each test takes the array module: NumPy for concrete values (a call traced by the
    # caller's `jit` stages every `jnp` operation, even on constants), `jnp` for traced ones.
    checks = [
        (
            restitution,
            lambda xnp, e: ~xnp.all((e >= 0) & (e <= 1)),
            "The coefficients of restitution must lie in [0, 1] (0: plastic, 1: elastic impacts)",
        ),
        (
            friction,
            lambda xnp, mu: ~xnp.all(xnp.isfinite(mu) & (mu >= 0)),
            "Coulomb's coefficients of friction must be non-negative and finite (0: frictionless)",
        ),
    ]
    # (One trajectory: an ensemble's solve has no events.)
    gaps = jnp.asarray(system.gaps(t0, q0))
    if not jnp.issubdtype(gaps.dtype, jnp.floating):
        raise ValueError(
            f"`gaps` must return floating values; it returns {gaps.dtype.name}, and integers "
            "have no derivatives (the impacts need the gaps' rates). Return floats (write "
            "constants as `1.0`, or `jnp.asarray(x, float)`)."
        )
    checks.append(
        (
            gaps,
            lambda xnp, g: ~xnp.all(xnp.isfinite(g)),
            "The gaps (`gaps`) of the initial state must be finite",
        )
    )
    for flag, rule in system.stop_checks():
        checks.append((jnp.asarray(flag), lambda xnp, f: xnp.any(f), rule))
    # (After the stops' own checks: bad bounds or radii make the start's gaps wrong too.)
    checks.append(
        (
            gaps,
            lambda xnp, g: xnp.any(g < -gap_tolerance),
            "The initial state violates a gap (a one-sided constraint `gaps(t, q) ≥ 0`): "
            "start where every gap is open or closed (≥ 0)",
        )
    )
    traced = []
    for values, problem, rule in checks:
        if is_concrete(values):
            if bool(problem(np, np.asarray(values))):
                raise ValueError(f"{rule}; got {np.asarray(values)}.")
        else:
            traced.append((problem(jnp, values), f"{rule}; got a value that is not (traced)."))
    return traced


def _check_initial_state(system, formulation, t0, q0, v0) -> None:
    """A `ValueError` naming the first problem of concrete initial states
    (`check_initial_state`), with the value it quotes: of one trajectory, `(n,)`, or of the
    first row with a problem of an ensemble's, `(B, n)`."""
    where, check = "", check_initial_state_jit
    if q0.ndim == 2:
        check = jax.vmap(check, in_axes=(None, None, None, 0, 0))
    mass, flags, values = check(system, formulation, t0, q0, v0)
    flags = np.asarray(flags)
    if q0.ndim == 2:
        row = int(np.argmax(flags.any(axis=1)))
        mass, flags, values = mass[row], flags[row], values[row]
        where = f"Trajectory {row} (row of q0, v0): "
    if not flags.any():
        return
    problem = int(np.argmax(flags))
    message = where + initial_state_message(formulation, problem)
    if problem == 2:
        mass = np.asarray(mass)
        lowest = (
            np.linalg.eigvalsh(0.5 * (mass + mass.T))[0] if np.all(np.isfinite(mass)) else np.nan
        )
        message += f" (lowest eigenvalue of its symmetric part: {lowest:.3g})"
    elif problem >= len(INITIAL_STATE_MESSAGES):  # the formulation's
        own = problem - len(INITIAL_STATE_MESSAGES)
        message += f" ({formulation.state_messages[own][1]}: {float(values[own]):.3g})"
    raise ValueError(message)
