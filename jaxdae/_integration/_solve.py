"""The solve core of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
[`jaxdae.simulate_actuated`][]: the keyword arguments of a call and what they become (times,
solver options), the dynamics a model integrates, and the one diffrax solve."""

import difflib
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypedDict, TypeVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .. import _thresholds
from .._compilation._private_apis import diffeqsolve_unjitted
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._gains import is_concrete
from .._solution import RESULTS
from ._adjoint import ReverseSweepAdjoint, default_adjoint
from ._controllers import check_first_step, save_at, step_options, stop_stalled_steps
from ._failures import (
    FIXED_STEP_RESIDUAL,
    RESIDUAL_TOLERANCE_FACTOR,
    event_result,
    solve_event,
)
from ._implicit import configure_for_controller
from ._solvers import name_result
from ._validation import as_step_count, check_real, check_solve_options, check_times

# The signature that `in_current_mesh` keeps.
_P = ParamSpec("_P")
_R = TypeVar("_R")

# The solver of a call that names none.
DEFAULT_SOLVER = diffrax.Tsit5()


class Times(eqx.Module):
    """The times of a checked solve: start, end and the save times (None: `[t0, t1]`)."""

    t0: Array
    t1: Array
    ts: Array | None


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

    def residual_limit(self, q0, v0) -> tuple[Array, Array]:
        """The constraint residual a completed solve from `(q0, v0)` may end with (one per
        trajectory of an ensemble), and whether the formulation's `residual_allowance` adds
        to it: `constraint_tol` alone, by default
        `RESIDUAL_TOLERANCE_FACTOR · (atol + rtol · scale)` with an adaptive controller or
        `FIXED_STEP_RESIDUAL · scale` with fixed steps, `scale = max(1, |q0|, |v0|)`, plus
        the allowance."""
        scale = jnp.max(jnp.abs(jnp.concatenate([q0, v0], -1)), axis=-1, initial=1.0)
        if self.tolerances is None:
            default = FIXED_STEP_RESIDUAL * scale
        else:
            rtol, atol = self.tolerances
            default = RESIDUAL_TOLERANCE_FACTOR * (atol + rtol * scale)
        # (`nan`: none given; one program for calls with and without it.)
        tol = jnp.asarray(jnp.nan if self.constraint_tol is None else self.constraint_tol, q0.dtype)
        given = ~jnp.isnan(tol)
        limit = jnp.where(given, tol, default)
        return limit.astype(q0.dtype), jnp.broadcast_to(~given, limit.shape)


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
        """`t0`, `t1` and `ts` as arrays of `dtype`, checked (`check_times`)."""
        check_real(t0=t0, t1=t1, ts=self.ts, dt0=self.dt0, rtol=self.rtol, atol=self.atol)
        t0, t1 = jnp.asarray(t0, dtype=dtype), jnp.asarray(t1, dtype=dtype)
        ts = None if self.ts is None else jnp.asarray(self.ts, dtype=dtype)
        check_times(t0, t1, ts)
        check_first_step(self.dt0, t0, t1, self.stepsize_controller)
        return Times(t0, t1, ts)

    def options(self, dtype, norm=optx.rms_norm, event_driven: bool = False) -> SolveOptions:
        """The solve's options with the defaults filled in: `step_options` (the default
        controller measures errors with `norm`), an implicit solver's root finder set to
        stop at the step's tolerance (`configure_for_controller`), `default_adjoint`, or
        for an `event_driven` solve diffrax's `RecursiveCheckpointAdjoint` (the event loop
        is differentiated through its checkpointed loop)."""
        stepsize_controller, dt0 = step_options(
            self.stepsize_controller, self.dt0, self.rtol, self.atol, dtype, norm
        )
        solver = (
            DEFAULT_SOLVER
            if self.solver is None
            else configure_for_controller(self.solver, stepsize_controller)
        )
        if self.adjoint is not None:
            adjoint = self.adjoint
        elif event_driven:
            adjoint = diffrax.RecursiveCheckpointAdjoint(_thresholds.CHECKPOINTS)
        else:
            adjoint = default_adjoint(solver, self.max_steps)
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


def in_current_mesh(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn` run with JAX's current abstract mesh set explicitly (the empty mesh outside
    any mesh).

    When reverse mode differentiates a jitted function (a solve called eagerly), JAX
    replays its equations with the context each was recorded in, which names the empty
    mesh where the caller's context named none. What is traced lazily there
    (`ReverseSweepAdjoint`'s forward solve) then missed every trace cache that the
    structure checks had filled, and traced the equations of motion and the solve a second
    time. Setting the current mesh explicitly keeps those caches valid
    (`experiments/benchmarks/bench_compile.py` shows the gradient's trace time)."""

    @functools.wraps(fn)
    def in_mesh(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(jax.sharding.get_abstract_mesh()):
            return fn(*args, **kwargs)

    return in_mesh


class Dynamics(eqx.Module):
    """What the solve path integrates for a model `(system, strategy)` (a system and its
    formulation, or an actuated system and its control): the term (`_term.py`), and the
    conditions (diffrax event conditions, which read the problem from the `terms` diffrax
    passes them) that stop the solve, each with the [`jaxdae.RESULTS`][] item it reports.

    `saves_solver_state`: the solve keeps its final solver state (an ensemble whose
    trajectories stop one by one reads the stopped rows from it)."""

    term: diffrax.AbstractTerm
    conditions: tuple[Callable, ...] = eqx.field(static=True, default=())
    failures: tuple[RESULTS, ...] = ()
    located: tuple[Callable, ...] = eqx.field(static=True, default=())
    saves_solver_state: bool = eqx.field(static=True, default=False)


def integrate(
    dynamics: Dynamics,
    y0,
    times: Times,
    options: SolveOptions,
    saveat: diffrax.SaveAt | None = None,
) -> tuple[diffrax.Solution, RESULTS]:
    """The one diffrax solve of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][]: of `dynamics.term` from `y0` over `times` with
    `options`, saving as `save_at` says, stopped by `dynamics.conditions` (and a non-finite
    state under fixed steps, `solve_event`) and by a stalled step (`stop_stalled_steps`).
    Returns diffrax's solution and jaxdae's result: the failure that stopped it named by its
    condition (`event_result`) or by the solver (`name_result`)."""
    solver, controller = options.solver, options.stepsize_controller
    t0, t1, ts = times.t0, times.t1, times.ts
    if saveat is None:
        saveat = save_at(t0, t1, ts, controller)
    if dynamics.saves_solver_state:
        saveat = eqx.tree_at(lambda s: s.solver_state, saveat, True)
    event = solve_event(
        list(dynamics.conditions), controller, list(dynamics.located), jnp.result_type(t0)
    )
    controller = stop_stalled_steps(controller)
    # Unjitted: `integrate` is always traced inside a jit (`diffeqsolve_unjitted`).
    out = diffeqsolve_unjitted(
        dynamics.term,
        solver,
        t0,
        t1,
        options.dt0,
        y0,
        args=None,
        saveat=saveat,
        stepsize_controller=controller,
        adjoint=options.adjoint,
        event=event,
        max_steps=options.max_steps,
        throw=False,
    )
    return out, name_result(
        solver, event_result(out, list(dynamics.failures), len(dynamics.located))
    )
