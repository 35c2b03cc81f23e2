"""Ensembles: a batch of trajectories integrated as one ODE on shared steps, each
member stopped alone where it fails (its formulation fails, or its model turns
non-finite)."""

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._compilation._constants import detached
from .._compilation._operators import MassFactor
from .._compilation._private_apis import unvmap_any
from .._compilation._scalarize import scalarize
from .._custom_types import Array
from .._formulations import AbstractFormulation
from .._gains import is_concrete
from .._solution import RESULTS
from .._systems._system import AbstractSystem
from ._solvers import AbstractSteppingWrapper
from ._term import AbstractSystemTerm, AbstractTermWithVJP, replace_system_term, system_term
from ._vector_fields import jitted_failure, jitted_rates, jitted_row_vjp, state_rates


class EnsembleTerm(AbstractSystemTerm, AbstractTermWithVJP):
    """The term of [`jaxdae.simulate_ensemble`][]: the rates of every trajectory (row) of
    the state, each from the shared system and formulation, with the rows that
    `StopFailedTrajectories` has stopped standing still.

    `folded`: the rates with the system and the formulation as constants of the compiled
    program (`ensemble_term`), or None; read from there rather than from the term's fields,
    which diffrax carries through its loop as traced values, their scalar graph is traced
    with their values, whose zeros and ones it folds away."""

    system: AbstractSystem
    formulation: AbstractFormulation
    reference: Any = None
    mass_factor: MassFactor | None = None
    # The rows stopped by `StopFailedTrajectories` in the step at hand, or None.
    stopped: Array | None = None
    folded: Callable | None = eqx.field(static=True, default=None)

    reads_solver_state: ClassVar[bool] = True

    def vf(self, t, y, args):
        del args
        q, v = y
        if self.folded is None:
            rates = jax.vmap(jitted_rates, in_axes=(None, None, None, 0, 0, None))(
                self.system, self.formulation, t, q, v, self.mass_factor
            )
        else:
            rates = jax.vmap(self.folded, in_axes=(None, 0, 0, None))(t, q, v, self.mass_factor)
        if self.stopped is not None:  # stopped rows stand still
            rates = where_rows(self.stopped, jax.tree.map(jnp.zeros_like, rates), rates)
        return rates

    def stopped_rows(self):
        return self.stopped

    def failure_rows(self, t, y):
        """The formulation's failure test of every row (detached, as `failure`)."""
        return jax.vmap(jitted_failure, in_axes=(None, None, None, 0, 0, 0, None))(
            *detached((self.system, self.formulation, t, *y, self.reference, self.mass_factor))
        )

    def stage_vjp(self, t, y, args, solver_state, t_start, cotangent):
        """Each trajectory's own vector–Jacobian product (a scalar graph under `vmap`, as
        the rates are), summed over the rows for the shared system, formulation and mass
        factor. Rows stopped at or before `t_start` have zero rates, and so zero products:
        their model may be non-finite where they stand, and a zero cotangent times a
        non-finite derivative is nan."""
        del args
        shared_bar, *y_bar = jax.vmap(jitted_row_vjp, in_axes=(None, None, None, None, 0, 0, 0))(
            self.system, self.formulation, self.mass_factor, t, *y, cotangent
        )
        if solver_state is not None:
            stopped = StopFailedTrajectories.stopped_at(solver_state, t_start)
            shared_bar, y_bar = where_rows(
                stopped, jax.tree.map(jnp.zeros_like, (shared_bar, y_bar)), (shared_bar, y_bar)
            )
        shared_bar = jax.tree.map(lambda x: jnp.sum(x, axis=0), shared_bar)
        term_bar = eqx.tree_at(
            lambda term: (term.system, term.formulation, term.mass_factor),
            jax.tree.map(jnp.zeros_like, self),
            shared_bar,
            is_leaf=lambda x: x is None,
        )
        return tuple(y_bar), term_bar, None


# Not jitted: a jitted function traces its arrays as arguments, and their values would
# not be folded.
_folded_rates = scalarize(state_rates)


def ensemble_term(system, formulation, reference, mass_factor) -> EnsembleTerm:
    """The `EnsembleTerm` of a solve, with its rates `folded` where no leaf of the system
    and the formulation is a tracer. A trajectory's rates then cost about half as much
    where they are a scalar graph (the arm of `experiments/benchmarks/bench_robots.py`); a
    traced model (differentiated, vmapped or an argument of the caller's `jax.jit`) keeps
    the jitted rates."""
    folded = None
    if is_concrete((system, formulation)):
        folded = functools.partial(_folded_rates, system, formulation)
    return EnsembleTerm(system, formulation, reference, mass_factor, folded=folded)


def where_rows(rows, a, b):
    """`a` in the rows (leading axis) where `rows` is true, else `b`."""
    return jax.tree.map(
        lambda x, y: jnp.where(rows.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), a, b
    )


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

    term_structure: ClassVar = EnsembleTerm

    def init(self, terms, t0, t1, y0, args):
        rows = y0[0].shape[:1]
        t_failed = jnp.full(rows, jnp.inf, jnp.result_type(t0))
        values = _ensemble_term(terms).failure_rows(t0, y0) if self.fails else None
        # (`t1` is the first step's end: diffrax does not pass the solve's end.)
        first_step = jnp.abs(jnp.asarray(t1 - t0, t_failed.dtype))
        return (
            self.solver.init(terms, t0, t1, y0, args),
            t_failed,
            values,
            jnp.full(rows, _RUNNING, jnp.int32),
            first_step,
        )

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner, t_failed, last, why, first_step = solver_state
        stopped = jnp.isfinite(t_failed)
        broken = _non_finite_rows(terms, t0, t1, y0, args, stopped, first_step)
        stopped = stopped | broken
        y1, y_error, dense_info, inner, result = self.solver.step(
            _with_stopped(terms, stopped), t0, t1, y0, args, inner, made_jump
        )
        # A first-same-as-last stage stored before the stop still holds the old rate.
        y1 = where_rows(stopped, y0, y1)
        y_error = where_rows(stopped, jax.tree.map(jnp.zeros_like, y_error), y_error)
        # A row still not finite stops at the step's start, with an `inf` error (a nan
        # norm would not say by how much to shrink the step): an adaptive controller
        # rejects the step, and the stop goes with it; fixed steps keep both.
        lost = ~(_finite_rows(y1) & _finite_rows(y_error))
        y1 = where_rows(lost, y0, y1)
        y_error = where_rows(
            lost, jax.tree.map(lambda e: jnp.full_like(e, jnp.inf), y_error), y_error
        )
        t_failed = jnp.where(broken | lost, jnp.asarray(t0, t_failed.dtype), t_failed)
        why = jnp.where(broken, _STALLED, jnp.where(lost, _NON_FINITE_STATE, why))
        values = None
        if self.fails:
            values = _ensemble_term(terms).failure_rows(t1, y1)
            # As `diffrax.Event`: a flag, or a real value that changed sign.
            failing = values if values.dtype == bool else jnp.sign(values) != jnp.sign(last)
            failing = failing & ~stopped & ~lost
            t_failed = jnp.where(failing, jnp.asarray(t1, t_failed.dtype), t_failed)
            why = jnp.where(failing, _FORMULATION_FAILED, why)
        return y1, y_error, dense_info, (inner, t_failed, values, why, first_step), result

    @staticmethod
    def stopped_at(solver_state, t) -> Array:
        """The rows stopped at or before `t`, given the solver state at the end of the
        solve (for [`jaxdae.ReverseSweepAdjoint`][], which recomputes the steps)."""
        return solver_state[1] <= t


def _ensemble_term(terms) -> EnsembleTerm:
    term = system_term(terms)
    if not isinstance(term, EnsembleTerm):
        raise ValueError(
            "`StopFailedTrajectories` solves the term of an ensemble "
            f"(`EnsembleTerm`); got {type(term).__name__}."
        )
    return term


def _with_stopped(terms, stopped):
    """`terms` with the rows `stopped` standing still."""
    return replace_system_term(
        terms,
        lambda term: eqx.tree_at(lambda x: x.stopped, term, stopped, is_leaf=lambda x: x is None),
    )


def stopped_results(solver_state, formulation) -> tuple[Array, RESULTS]:
    """For each trajectory of an ensemble solved by `StopFailedTrajectories` (its final
    `solver_state`): the time it stopped (`inf`: it did not) and the result that names why
    (as `simulate` names it alone: `dt_min_reached` for rates that turned non-finite, where
    adaptive steps stalled; `non_finite_state` for a state that did, with fixed steps; else
    the formulation's failure)."""
    _, t_failed, _, why, _ = solver_state

    def result(why):
        return RESULTS.where(
            why == _STALLED,
            RESULTS.dt_min_reached,
            RESULTS.where(
                why == _NON_FINITE_STATE, RESULTS.non_finite_state, formulation.failure_result
            ),
        )

    return t_failed, jax.vmap(result)(why)


def _finite_rows(tree) -> Array:
    """Whether each row (leading axis) of every leaf of `tree` is finite."""
    return functools.reduce(
        jnp.logical_and,
        [jnp.all(jnp.isfinite(x).reshape(x.shape[0], -1), axis=1) for x in jax.tree.leaves(tree)],
    )


def _non_finite_rows(terms, t0, t1, y0, args, stopped, first_step) -> Array:
    """The rows not yet `stopped` whose rates are not finite at `t0` or at `t1` (after an
    Euler step), where the step `t1 − t0` has shrunk to `NON_FINITE_ULPS` rounding units
    of `t` (`ε max(|t0|, first_step)`); evaluated in a branch taken only then."""
    dtype = jnp.result_type(t0)
    unit = jnp.finfo(dtype).eps * jnp.maximum(jnp.abs(t0), first_step)
    short = jnp.asarray(t1 - t0, dtype) <= NON_FINITE_ULPS * unit

    def probe():
        running = _with_stopped(terms, stopped)

        # The rates at `t0`, then at the Euler step's end: one evaluation in a loop of two,
        # so that the compiled program holds the vector field once more, not twice.
        def evaluate(i, carry):
            y, finite = carry
            first = i == 0
            rates = running.vf(jnp.where(first, t0, t1), y, args)
            end = jax.tree.map(lambda y, r: y + (t1 - t0) * r, y, rates)
            finite = finite & _finite_rows(rates) & (_finite_rows(end) | ~first)
            return jax.tree.map(lambda e, y: jnp.where(first, e, y), end, y), finite

        _, finite = jax.lax.fori_loop(0, 2, evaluate, (y0, _finite_rows(y0)))
        return ~finite & short

    # (The branch not taken gives `stopped`, masked out below: a constant False broadcast
    # over the rows would be folded row by row by XLA's GPU compiler.)
    return jax.lax.cond(unvmap_any(short), probe, lambda: stopped) & ~stopped


def worst_trajectory_rms(y) -> Array:
    """The step-size controller's norm for an ensemble: the largest over trajectories of
    each trajectory's RMS norm, so that a step is accepted only if every trajectory meets
    the tolerances."""
    leaves = jax.tree_util.tree_leaves(y)
    size = sum(leaf.shape[-1] for leaf in leaves)
    squares = sum(jnp.sum(jnp.abs(leaf) ** 2, axis=-1) for leaf in leaves) / size
    return jnp.sqrt(jnp.max(squares))
