"""A diffrax solve that starts at a traced time `t_start`, run from a constant `t0` before it.

diffrax multiplies a solve's times by `direction = where(t0 < t1, 1, -1)`. A traced `t0`
makes the direction traced, and XLA then cannot fold diffrax's end threshold (100
`prevbefore` of `t1 · direction`): each such solve compiles it, in the forward program and
again in its derivatives (docs/design_measurements.md#restarted-stretches). The solves
that start at a time known only at run time therefore run from a constant `t0 < t_start`:

- the solve between two events of an event-driven solve starts afresh at its event
  (`started_at`): its first step runs from `t_start` while diffrax takes it to run from
  `t0`; the step's interpolation is the start state before `t_start`, and the controller
  and the root finder of its events work from `t_start`;
- a segment of [`jaxdae.ReverseSweepAdjoint`][]'s forward solve resumes from its
  checkpoint, with the solver and controller states stored there (`Restart`): its first
  step ends at `t_start` and takes no time.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._compilation._private_apis import use_stepsize_tol
from .._custom_types import Array
from ._controllers import AbstractControllerWrapper
from ._solvers import AbstractSteppingWrapper


class Restart(AbstractSteppingWrapper):
    """`solver`, restarting a solve at `t_start` with the solver state given to
    `diffeqsolve`: a step that ends at or before `t_start` (the first, from the solve's
    `t0`; see `_sweep_forward._RecordProposal`) takes no time and keeps the solver state."""

    solver: diffrax.AbstractSolver
    t_start: Array

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        return _restarted_step(self, terms, t0, t1, y0, args, solver_state, made_jump)


@eqx.filter_jit
def _restarted_step(restart: Restart, terms, t0, t1, y0, args, solver_state, made_jump):
    """`restart.step`, jitted: diffrax traces a solve's step function three times, and
    the backward pass of a solve in segments re-solves them with the same step; traced
    once, the gradient traces faster (docs/design_measurements.md#restarted-step)."""
    restarting = t1 <= restart.t_start
    # A step of length zero from the start: the start state, no error, the solver state
    # given, whatever the rates there. (Its dense output, with increments of zero, is the
    # start state over the whole no-op step.)
    y1, y_error, dense_info, state, result = restart.solver.step(
        terms, jnp.where(restarting, t1, t0), t1, y0, args, solver_state, made_jump
    )
    pick = lambda new, old: jnp.where(restarting, old, new)  # noqa: E731
    return (
        jax.tree.map(pick, y1, y0),
        jax.tree.map(lambda e: jnp.where(restarting, 0, e), y_error),
        dense_info,
        jax.tree.map(pick, state, solver_state),
        diffrax.RESULTS.where(restarting, diffrax.RESULTS.successful, result),
    )


# The adjoints for which `diffeqsolve` sets the loop over a Runge–Kutta solver's stages (one
# it sees, not one inside a wrapper): a plain loop, which forward mode differentiates, and a
# bounded one.
STAGE_LOOP_KINDS = ((diffrax.ForwardMode, "lax"), (diffrax.DirectAdjoint, "bounded"))


def started_at(solver: diffrax.AbstractSolver, controller, adjoint, t_start):
    """`solver` and the adaptive `controller` of a solve that starts afresh at `t_start`
    (module docstring): `StartAt` and `StartAtSteps`. The solver is first prepared as
    `diffeqsolve` prepares the solvers it sees (`StartAt` is neither implicit nor
    Runge–Kutta, and `diffeqsolve` does not look inside it): an implicit solver's root
    finder takes the tolerances it leaves to the controller
    (`diffrax.with_stepsize_controller_tols`); a Runge–Kutta solver's stages run in the
    loop that `adjoint` differentiates (`diffrax.ForwardMode`: a plain loop,
    `diffrax.DirectAdjoint`: a bounded one)."""
    if isinstance(solver, diffrax.AbstractImplicitSolver):
        names = [
            name
            for name in ("rtol", "atol", "norm")
            if getattr(solver.root_finder, name) is use_stepsize_tol
        ]
        solver = eqx.tree_at(
            lambda s: tuple(getattr(s.root_finder, name) for name in names),
            solver,
            tuple(getattr(controller, name) for name in names),
        )
    return StartAt(with_stage_loop(solver, adjoint), t_start), StartAtSteps(controller, t_start)


def with_stage_loop(solver: diffrax.AbstractSolver, adjoint) -> diffrax.AbstractSolver:
    """`solver`, a Runge–Kutta solver about to be wrapped, with its stages in the loop that
    `adjoint` differentiates, as `diffeqsolve` sets it for the solvers it sees
    (`STAGE_LOOP_KINDS`); any other solver as it is."""
    runge_kutta = isinstance(solver, diffrax.AbstractRungeKutta | diffrax.AbstractSRK)
    for adjoints, kind in STAGE_LOOP_KINDS:
        if runge_kutta and isinstance(adjoint, adjoints) and solver.scan_kind is None:
            solver = eqx.tree_at(lambda s: s.scan_kind, solver, kind, is_leaf=lambda x: x is None)
    return solver


class StartAt(AbstractSteppingWrapper):
    """`solver`, in a solve that starts at `t_start` though `diffeqsolve`'s `t0` is
    earlier: a step from before `t_start` (the first) runs from `t_start`, and its
    interpolation is the start state before `t_start`."""

    solver: diffrax.AbstractSolver
    t_start: Array

    @property
    def interpolation_cls(self):  # pyright: ignore
        return _started_interpolation(self.solver.interpolation_cls)

    def init(self, terms, t0, t1, y0, args):
        del t0
        return self.solver.init(terms, self.t_start, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        start = jnp.maximum(t0, self.t_start)
        y1, y_error, dense_info, state, result = self.solver.step(
            terms, start, t1, y0, args, solver_state, made_jump
        )
        return y1, y_error, {"inner": dense_info, "start": start}, state, result


class _StartedInterpolation(diffrax.AbstractLocalInterpolation):
    """The interpolation `inner` of a step from `start`, over the step from `t0` that
    diffrax sees: the start state before `start`."""

    t0: Array
    t1: Array
    inner: diffrax.AbstractLocalInterpolation
    start: Array

    def evaluate(self, t0, t1=None, left=True):
        if t1 is not None:
            return jax.tree.map(
                lambda a, b: a - b, self.evaluate(t1, left=left), self.evaluate(t0, left=left)
            )
        return self.inner.evaluate(jnp.maximum(t0, self.start), left=left)


def _started_interpolation(inner_cls):
    def build(*, t0, t1, inner, start):
        return _StartedInterpolation(t0, t1, inner_cls(t0=start, t1=t1, **inner), start)

    return build


class StartAtSteps(AbstractControllerWrapper):
    """An adaptive `controller` in a solve that starts at `t_start` though `diffeqsolve`'s
    `t0` is earlier (`StartAt`): it proposes the first step of a solve from `t_start`, and
    sizes a step from before `t_start` (the first) as one from `t_start`."""

    controller: diffrax.AbstractAdaptiveStepSizeController
    t_start: Array

    def wrap(self, direction):
        return StartAtSteps(self.controller.wrap(direction), self.t_start)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        del t0
        return self.controller.init(terms, self.t_start, t1, y0, dt0, args, func, error_order)

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        start = jnp.maximum(t0, self.t_start)
        return self.controller.adapt_step_size(
            start, t1, y0, y1_candidate, args, y_error, error_order, controller_state
        )


def after_start(cond_fn, t_start, t, y, args, **kwargs):
    """An event's condition (a flag or a real value) in a solve restarted at `t_start`
    (`Restart`): `flag_after_start` or `value_after_start`, which it is. At diffrax's first
    evaluation, recognized by its time being the solve's `t0` itself, a flag is not
    evaluated: that evaluation is a copy of the condition in the program, which XLA keeps
    (about 300 HLO instructions of the ladder of 128 four-bars' gradient, the failure test,
    `experiments/benchmarks/bench_compile.py`)."""
    if t is kwargs.get("t0"):
        # (`jnp.result_type`: a condition may be a Python bool, e.g. the failure test of a
        # system without constraints.)
        shape = eqx.filter_eval_shape(cond_fn, jnp.maximum(t, t_start), y, args, **kwargs)
        if jnp.result_type(shape) == jnp.bool_:
            return jnp.zeros((), jnp.bool_)
        return value_after_start(cond_fn, t_start, t, y, args, **kwargs)
    value = cond_fn(jnp.maximum(t, t_start), y, args, **kwargs)
    return value & (t > t_start) if jnp.result_type(value) == jnp.bool_ else value


def flag_after_start(cond_fn, t_start, t, y, args, **kwargs):
    """A flag in a solve that starts at `t_start` (`StartAt`, `Restart`): false at the
    start and at earlier times (the solve before it checked it there)."""
    if t is kwargs.get("t0"):
        return jnp.zeros((), jnp.bool_)
    return cond_fn(jnp.maximum(t, t_start), y, args, **kwargs) & (t > t_start)


def value_after_start(cond_fn, t_start, t, y, args, **kwargs):
    """A real-valued condition in a solve that starts at `t_start` (`StartAt`, `Restart`).
    Earlier times count as the start, so that its value does not change sign there. At
    diffrax's first evaluation, recognized by its time being the solve's `t0` itself, it is
    evaluated as at the start of a solve from `t_start` (with `t_start` as its `t0`)."""
    if t is kwargs.get("t0"):
        start = jnp.asarray(t_start, jnp.result_type(t))
        return cond_fn(start, y, args, **{**kwargs, "t0": start})
    return cond_fn(jnp.maximum(t, t_start), y, args, **kwargs)
