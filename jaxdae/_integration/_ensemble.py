"""Ensembles: a batch of trajectories integrated as one ODE on shared steps, each
member stopped alone where it fails."""


import diffrax
import jax
import jax.numpy as jnp

from .._custom_types import Array
from ._solvers import AbstractSteppingWrapper
from ._vector_fields import SolveArgs, detached, jitted_failure, jitted_rates, jitted_row_vjp


def ensemble_vector_field(t, y, args: SolveArgs):
    q, v = y
    rates = jax.vmap(jitted_rates, in_axes=(None, None, None, 0, 0, None))(
        args.system, args.formulation, t, q, v, args.mass_factor)
    if args.stopped is not None:  # `StopFailedTrajectories`: stopped rows stand still
        rates = where_rows(args.stopped, jax.tree.map(jnp.zeros_like, rates), rates)
    return rates


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


class StopFailedTrajectories(AbstractSteppingWrapper):
    """The solver of an ensemble whose formulation can fail: a trajectory that fails stops
    alone, and the others go on.

    After every step the formulation's `failure` is evaluated for each trajectory at the
    step's end, as `simulate`'s `diffrax.Event` does for one trajectory. A trajectory that
    fails keeps that state: from then on its rates are zero (so its stages stay at its
    state and it no longer constrains the step size) and the time of the failure is kept
    in the solver state, `(inner_state, t_failed, failure_values)` (`inf` for the
    trajectories that have not failed). A rejected step's failures go with it (diffrax
    keeps the previous solver state).
    """

    solver: diffrax.AbstractSolver

    def init(self, terms, t0, t1, y0, args):
        t_failed = jnp.full(y0[0].shape[:1], jnp.inf, jnp.result_type(t0))
        return self.solver.init(terms, t0, t1, y0, args), t_failed, failure_rows(t0, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner, t_failed, last = solver_state
        stopped = jnp.isfinite(t_failed)
        y1, y_error, dense_info, inner, result = self.solver.step(
            terms, t0, t1, y0, args._replace(stopped=stopped), inner, made_jump)
        # A first-same-as-last stage stored before the stop still holds the old rate.
        y1 = where_rows(stopped, y0, y1)
        y_error = where_rows(stopped, jax.tree.map(jnp.zeros_like, y_error), y_error)
        value = failure_rows(t1, y1, args)
        # As `diffrax.Event`: a flag, or a real value that changed sign.
        failing = value if value.dtype == bool else jnp.sign(value) != jnp.sign(last)
        failing = failing & ~stopped
        t_failed = jnp.where(failing, jnp.asarray(t1, t_failed.dtype), t_failed)
        return y1, y_error, dense_info, (inner, t_failed, value), result

    @staticmethod
    def step_args(args, solver_state, t):
        """The vector field's arguments in the step from `t`, given the solver state at the
        end of the solve: the rows that failed at or before `t` are stopped (for
        [`jaxdae.ReverseSweepAdjoint`][], which recomputes the steps)."""
        return args._replace(stopped=solver_state[1] <= t)


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
