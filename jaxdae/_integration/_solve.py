"""The one diffrax solve of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
[`jaxdae.simulate_actuated`][]: what it integrates (`Dynamics`), its resolved times and
options (`Times`, `SolveOptions`, which the problem stage builds), and `integrate`."""

from collections.abc import Callable

import diffrax
import equinox as eqx
import jax.numpy as jnp

from .._compilation._private_apis import diffeqsolve_unjitted
from .._custom_types import Array
from .._solution import RESULTS
from ._adjoint import ReverseSweepAdjoint
from ._controllers import save_at, stop_stalled_steps
from ._failures import (
    FIXED_STEP_RESIDUAL,
    RESIDUAL_TOLERANCE_FACTOR,
    event_result,
    solve_event,
)
from ._solvers import name_result


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
