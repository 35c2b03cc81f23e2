"""Ensembles: a batch of trajectories integrated as one ODE on shared steps, each
member stopped alone where it fails (its formulation fails, or its model turns
non-finite)."""


import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._compilation._private_apis import unvmap_any
from .._compilation._scalarize import scalarize
from .._custom_types import Array
from .._gains import is_concrete
from .._solution import RESULTS
from ._solvers import AbstractSteppingWrapper
from ._vector_fields import (
    SolveArgs,
    detached,
    jitted_failure,
    jitted_rates,
    jitted_row_vjp,
    state_rates,
)


def ensemble_vector_field(t, y, args: SolveArgs, constants=None):
    """The rates of every row. `constants`: the system and the formulation where they are
    constants of the compiled program (no tracer: a model the caller's `jax.jit` closes
    over; `constant_model_field`), read from here rather than from `args`, which diffrax
    carries through its loop as traced values: their scalar graph is then traced with
    their values, whose zeros and ones it folds away."""
    q, v = y
    if constants is None:
        rates = jax.vmap(jitted_rates, in_axes=(None, None, None, 0, 0, None))(
            args.system, args.formulation, t, q, v, args.mass_factor)
    else:
        rates = jax.vmap(_folded_rates, in_axes=(None, None, None, 0, 0, None))(
            *constants, t, q, v, args.mass_factor)
    if args.stopped is not None:  # `StopFailedTrajectories`: stopped rows stand still
        rates = where_rows(args.stopped, jax.tree.map(jnp.zeros_like, rates), rates)
    return rates


# Not jitted: a jitted function traces its arrays as arguments, and their values would
# not be folded.
_folded_rates = scalarize(state_rates)


def constant_model_field(args: SolveArgs):
    """`ensemble_vector_field` for a solve with `args`: with the system and the formulation
    as `constants` where no leaf of them is a tracer. A trajectory's rates then cost about
    half as much where they are a scalar graph (the arm of
    `experiments/benchmarks/bench_robots.py`); a traced model (differentiated, vmapped or
    an argument of the caller's `jax.jit`) keeps the jitted rates."""
    shared = (args.system, args.formulation)
    if not is_concrete(shared):
        return ensemble_vector_field
    return functools.partial(ensemble_vector_field, constants=shared)


def ensemble_stage_vjp(t, y, args, solver_state, t_start, cotangent):
    """`ReverseSweepAdjoint`'s vector–Jacobian product of `ensemble_vector_field`: each
    trajectory's own (a scalar graph under `vmap`, as the rates are), summed over the rows
    for the shared system, formulation and mass factor. Rows stopped at or before `t_start`
    have zero rates."""
    if solver_state is not None:
        stopped = StopFailedTrajectories.step_args(args, solver_state, t_start).stopped
        cotangent = where_rows(stopped, jax.tree.map(jnp.zeros_like, cotangent), cotangent)
    shared_bar, *y_bar = jax.vmap(jitted_row_vjp, in_axes=(None, None, None, None, 0, 0, 0))(
        args.system, args.formulation, args.mass_factor, t, *y, cotangent)
    system_bar, formulation_bar, mass_factor_bar = jax.tree.map(
        lambda x: jnp.sum(x, axis=0), shared_bar)
    return tuple(y_bar), args._replace(
        system=system_bar, formulation=formulation_bar, mass_factor=mass_factor_bar,
        reference=jax.tree.map(jnp.zeros_like, args.reference))


def where_rows(rows, a, b):
    """`a` in the rows (leading axis) where `rows` is true, else `b`."""
    return jax.tree.map(
        lambda x, y: jnp.where(rows.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), a, b)


# A trajectory whose rates turn non-finite stops once the shared step has shrunk to this
# many rounding units of `t` (see `StopFailedTrajectories`).
NON_FINITE_ULPS = 1024

# Why a trajectory of an ensemble stopped (`StopFailedTrajectories`' solver state): its
# formulation failed, its rates are not finite over a stalled step, its state is not finite
# after a step that was kept (fixed steps).
_RUNNING, _FORMULATION_FAILED, _STALLED, _NON_FINITE_STATE = 0, 1, 2, 3


class StopFailedTrajectories(AbstractSteppingWrapper):
    """The solver of an ensemble: a trajectory that fails stops alone, and the others go on.

    A trajectory stops where `simulate` would stop it on its own:

    - **its formulation fails** (where it `fails`: a formulation whose test can turn true
        for the system's constraint counts, `fails_with`): after every step the
        formulation's `failure` is evaluated for each trajectory at the step's end, as
        `simulate`'s `diffrax.Event` does for one trajectory; a trajectory that fails keeps
        the step's end.
    - **its model turns non-finite** (nan or inf rates, e.g. a force that leaves its
        domain): `simulate` alone rejects every step across that point until its step
        stalls (`StopStalledSteps`, `dt_min_reached`). Here such a trajectory's error is
        `inf`, so the shared step is rejected and shrinks by the controller's least factor;
        at a step no longer than `NON_FINITE_ULPS` rounding units of `t` (`ε max(|t|, h₀)`,
        `h₀` the first step), a trajectory whose rates are not finite at the step's start
        or at its end (an Euler step ahead) stops at the step's start, before the step is
        taken, and the other trajectories go on. Its result is `dt_min_reached`, which an
        eager call names by the non-finite term (`name_non_finite_term`), as for
        `simulate`. (The stall guard, which ends the whole solve at steps of
        `4 ε max(|t|, 10⁻³ |t1 − t0|)`, comes first only for a controller that shrinks a
        rejected step by more than 256 at once (a diffrax `PIDController`'s `factormin`
        is 0.2 by default), or where `|t|` and `h₀` are both below `4·10⁻⁶ |t1 − t0|`.)
        With fixed steps, which keep every step, a trajectory whose state is not finite
        after a step stops at the step's start instead, with `non_finite_state`, the
        result of a fixed-step `simulate` that overflows.

    A stopped trajectory keeps its state: from then on its rates are zero (so its stages
    stay at its state, even in a solve that couples the trajectories, such as an implicit
    step's) and its error is zero (it no longer constrains the step size). The solver state
    is `(inner_state, t_failed, failure_values, why, h₀)`: the time each trajectory stopped
    (`inf` for those that have not) and why (`stopped_results`). A rejected step's stops go
    with it (diffrax keeps the previous solver state).
    """

    solver: diffrax.AbstractSolver
    fails: bool = eqx.field(static=True, default=True)

    def init(self, terms, t0, t1, y0, args):
        rows = y0[0].shape[:1]
        t_failed = jnp.full(rows, jnp.inf, jnp.result_type(t0))
        values = failure_rows(t0, y0, args) if self.fails else None
        # (`t1` is the first step's end: diffrax does not pass the solve's end.)
        first_step = jnp.abs(jnp.asarray(t1 - t0, t_failed.dtype))
        return (self.solver.init(terms, t0, t1, y0, args), t_failed, values,
                jnp.full(rows, _RUNNING, jnp.int32), first_step)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner, t_failed, last, why, first_step = solver_state
        stopped = jnp.isfinite(t_failed)
        broken = _non_finite_rows(terms, t0, t1, y0, args, stopped, first_step)
        stopped = stopped | broken
        y1, y_error, dense_info, inner, result = self.solver.step(
            terms, t0, t1, y0, args._replace(stopped=stopped), inner, made_jump)
        # A first-same-as-last stage stored before the stop still holds the old rate.
        y1 = where_rows(stopped, y0, y1)
        y_error = where_rows(stopped, jax.tree.map(jnp.zeros_like, y_error), y_error)
        # A row still not finite stops at the step's start, with an `inf` error (a nan
        # norm would not say by how much to shrink the step): an adaptive controller
        # rejects the step, and the stop goes with it; fixed steps keep both.
        lost = ~(_finite_rows(y1) & _finite_rows(y_error))
        y1 = where_rows(lost, y0, y1)
        y_error = where_rows(lost, jax.tree.map(lambda e: jnp.full_like(e, jnp.inf), y_error),
                             y_error)
        t_failed = jnp.where(broken | lost, jnp.asarray(t0, t_failed.dtype), t_failed)
        why = jnp.where(broken, _STALLED, jnp.where(lost, _NON_FINITE_STATE, why))
        values = None
        if self.fails:
            values = failure_rows(t1, y1, args)
            # As `diffrax.Event`: a flag, or a real value that changed sign.
            failing = values if values.dtype == bool else jnp.sign(values) != jnp.sign(last)
            failing = failing & ~stopped & ~lost
            t_failed = jnp.where(failing, jnp.asarray(t1, t_failed.dtype), t_failed)
            why = jnp.where(failing, _FORMULATION_FAILED, why)
        return y1, y_error, dense_info, (inner, t_failed, values, why, first_step), result

    @staticmethod
    def step_args(args, solver_state, t):
        """The vector field's arguments in the step from `t`, given the solver state at the
        end of the solve: the rows stopped at or before `t` are stopped (for
        [`jaxdae.ReverseSweepAdjoint`][], which recomputes the steps)."""
        return args._replace(stopped=solver_state[1] <= t)


def stopped_results(solver_state, formulation) -> tuple[Array, RESULTS]:
    """For each trajectory of an ensemble solved by `StopFailedTrajectories` (its final
    `solver_state`): the time it stopped (`inf`: it did not) and the result that names why
    (as `simulate` names it alone: `dt_min_reached` for rates that turned non-finite, where
    adaptive steps stalled; `non_finite_state` for a state that did, with fixed steps; else
    the formulation's failure)."""
    _, t_failed, _, why, _ = solver_state

    def result(why):
        return RESULTS.where(why == _STALLED, RESULTS.dt_min_reached, RESULTS.where(
            why == _NON_FINITE_STATE, RESULTS.non_finite_state, formulation.failure_result))

    return t_failed, jax.vmap(result)(why)


def _finite_rows(tree) -> Array:
    """Whether each row (leading axis) of every leaf of `tree` is finite."""
    return functools.reduce(jnp.logical_and, [
        jnp.all(jnp.isfinite(x).reshape(x.shape[0], -1), axis=1) for x in jax.tree.leaves(tree)])


def _non_finite_rows(terms, t0, t1, y0, args, stopped, first_step) -> Array:
    """The rows not yet `stopped` whose rates are not finite at `t0` or at `t1` (after an
    Euler step), where the step `t1 − t0` has shrunk to `NON_FINITE_ULPS` rounding units
    of `t` (`ε max(|t0|, first_step)`); evaluated in a branch taken only then."""
    dtype = jnp.result_type(t0)
    unit = jnp.finfo(dtype).eps * jnp.maximum(jnp.abs(t0), first_step)
    short = jnp.asarray(t1 - t0, dtype) <= NON_FINITE_ULPS * unit

    def probe():
        running = args._replace(stopped=stopped)

        # The rates at `t0`, then at the Euler step's end: one evaluation in a loop of two,
        # so that the compiled program holds the vector field once more, not twice.
        def evaluate(i, carry):
            y, finite = carry
            first = i == 0
            rates = terms.vf(jnp.where(first, t0, t1), y, running)
            end = jax.tree.map(lambda y, r: y + (t1 - t0) * r, y, rates)
            finite = finite & _finite_rows(rates) & (_finite_rows(end) | ~first)
            return jax.tree.map(lambda e, y: jnp.where(first, e, y), end, y), finite

        _, finite = jax.lax.fori_loop(0, 2, evaluate, (y0, _finite_rows(y0)))
        return ~finite & short

    # (The branch not taken gives `stopped`, masked out below: a constant False broadcast
    # over the rows would be folded row by row by XLA's GPU compiler.)
    return jax.lax.cond(unvmap_any(short), probe, lambda: stopped) & ~stopped


def failure_rows(t, y, args: SolveArgs):
    return jax.vmap(jitted_failure, in_axes=(None, None, None, 0, 0, 0, None))(*detached(
        (args.system, args.formulation, t, *y, args.reference, args.mass_factor)))


def worst_trajectory_rms(y) -> Array:
    """The step-size controller's norm for an ensemble: the largest over trajectories of
    each trajectory's RMS norm, so that a step is accepted only if every trajectory meets
    the tolerances."""
    leaves = jax.tree_util.tree_leaves(y)
    size = sum(leaf.shape[-1] for leaf in leaves)
    squares = sum(jnp.sum(jnp.abs(leaf) ** 2, axis=-1) for leaf in leaves) / size
    return jnp.sqrt(jnp.max(squares))


def failure_event(t, y, args: SolveArgs, **kwargs):
    # A flag has no derivative: detached, a differentiated solve does not linearize the
    # test (diffrax evaluates it at `t0` outside its loop).
    q, v = y
    return jitted_failure(*detached((args.system, args.formulation, t, q, v, args.reference,
                                args.mass_factor)))
