"""The one entry point: [`jaxdae.simulate`][]."""


import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._analysis._discrete import fixed_step_radius
from .._checks import check_instance, check_positive
from .._compilation._linalg import full_precision, psd_pseudo_solve
from .._compilation._private_apis import unvmap_any
from .._compilation._scalarize import scalarize
from .._compilation._sharding import explicit_to_auto, is_explicitly_sharded
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._formulations import AbstractFormulation, AbstractStabilizedFormulation
from .._gains import is_concrete
from .._solution import (
    RESULTS,
    SimulationError,
    Solution,
    failure_message,
    failure_text,
    residuals,
)
from .._systems._nonholonomic import is_not_affine
from .._systems._structure import (
    MassFactor,
    constant_mass_factor,
    is_mass_positive_definite,
    with_mass_factor,
)
from .._systems._system import AbstractSystem, LagrangianSystem, cast_floating
from ._adjoint import (
    ODETermWithVJP,
    ReverseSweepAdjoint,
    default_adjoint,
    forward_mode_hint,
    is_none,
    jit_unless_staged,
    nones,
    reverse_only,
    typed_literal_as_array,
)
from ._generalized_alpha import name_singular_newton_matrix
from ._implicit import configure_for_controller
from ._projection import named_result
from ._solvers import AbstractWrappedSolver


def _detached(tree):
    """`tree` with `stop_gradient` on its arrays (a computation on it is not linearized)."""
    return jax.tree.map(lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x, tree)


def _float_array(name: str, value, ensemble: bool = False) -> Array:
    array = jnp.asarray(value)
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        raise ValueError(f"`{name}` must be real; got dtype {array.dtype}.")
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.result_type(float))
    if ensemble and (array.ndim != 2 or array.shape[0] == 0):
        raise ValueError(
            f"`{name}` must be a 2-D array of shape (B, n), one row per trajectory (B ≥ 1); "
            f"got shape {array.shape}."
        )
    if not ensemble and array.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of shape (n,); got shape {array.shape}.")
    return array


# The per-state functions are jitted so that JAX traces them (and their derivatives) once,
# however often diffrax and autodiff call them: tracing, not XLA, dominated compile time.
# For small systems the terms, the right-hand side and the failure check (evaluated at
# every stage of every step) are re-traced as scalar graphs, which XLA fuses
# (`_scalarize.py`).
@eqx.filter_jit
@scalarize
def _terms(system, t, q, v):
    return system.terms(t, q, v)


def state_rates(system, formulation, t, q, s, mass_factor=None):
    """`(q̇, ṡ)` of the state `(q, s)`: the system says what `s` holds (velocities or
    momenta); a formulation may fill in dependent velocities (redundant coordinates).
    `mass_factor`: the factor of a constant `M`, computed once per solve (or `None`)."""
    s = formulation.velocities(system, t, q, s)
    terms = with_mass_factor(_terms(system, t, q, s), mass_factor)
    acc, _ = formulation.accelerations(terms)
    return system.velocities(t, q, s), system.state_rate(t, q, s, terms, acc)


def failure_indicator(system, formulation, t, q, v, reference, mass_factor=None):
    """The formulation's `failure` at the state `(q, v)` (`mass_factor` as for
    `state_rates`)."""
    return formulation.failure(with_mass_factor(_terms(system, t, q, v), mass_factor),
                               reference)


@eqx.filter_jit
def _failure_reference(system, formulation, t, q, v):
    """The formulation's `failure_reference` at the initial state `(q, v)` (evaluated once
    per solve, so not re-traced as a scalar graph)."""
    return formulation.failure_reference(_terms(system, t, q, v))


_rates = eqx.filter_jit(scalarize(state_rates))
_failure = eqx.filter_jit(scalarize(failure_indicator))


@eqx.filter_jit
def _velocities(system, formulation, t, q, v):
    return formulation.velocities(system, t, q, v)


class SolveArgs(NamedTuple):
    """The `args` of the diffrax solve of [`jaxdae.simulate`][] and
    [`jaxdae.simulate_ensemble`][]."""

    system: AbstractSystem
    formulation: AbstractFormulation
    # What the formulation's failure test compares with, evaluated at the start (or None).
    reference: Any
    # The factor of a constant `M` (`constant_mass_factor`), computed once per solve and
    # shared by every stage (and every trajectory of an ensemble), or None.
    mass_factor: MassFactor | None = None
    # An ensemble's rows stopped by their formulation's failure, added to the arguments of
    # each step by `_StopFailedTrajectories`, or None.
    stopped: Array | None = None


def _vector_field(t, y, args: SolveArgs):
    q, v = y
    return _rates(args.system, args.formulation, t, q, v, args.mass_factor)


def _ensemble_vector_field(t, y, args: SolveArgs):
    q, v = y
    rates = jax.vmap(_rates, in_axes=(None, None, None, 0, 0, None))(
        args.system, args.formulation, t, q, v, args.mass_factor)
    if args.stopped is not None:  # `_StopFailedTrajectories`: stopped rows stand still
        rates = _where_rows(args.stopped, jax.tree.map(jnp.zeros_like, rates), rates)
    return rates


def _rates_vjp(system, formulation, mass_factor, t, q, s, cotangent):
    """The vector–Jacobian product of `_rates` with respect to the system, the formulation,
    the constant mass matrix's factor (or None) and the state."""
    _, pull = eqx.filter_vjp(lambda sfm, q, s: _rates(*sfm[:2], t, q, s, sfm[2]),
                             (system, formulation, mass_factor), q, s)
    return pull(cotangent)


_row_vjp = eqx.filter_jit(scalarize(_rates_vjp))


def _ensemble_stage_vjp(t, y, args, solver_state, t_start, cotangent):
    """`ReverseSweepAdjoint`'s vector–Jacobian product of `_ensemble_vector_field`: each
    trajectory's own (a scalar graph under `vmap`, as the rates are), summed over the rows
    for the shared system, formulation and mass factor. Rows stopped at or before `t_start`
    have zero rates."""
    if solver_state is not None:
        stopped = _StopFailedTrajectories.step_args(args, solver_state, t_start).stopped
        cotangent = _where_rows(stopped, jax.tree.map(jnp.zeros_like, cotangent), cotangent)
    shared_bar, *y_bar = jax.vmap(_row_vjp, in_axes=(None, None, None, None, 0, 0, 0))(
        args.system, args.formulation, args.mass_factor, t, *y, cotangent)
    system_bar, formulation_bar, mass_factor_bar = jax.tree.map(
        lambda x: jnp.sum(x, axis=0), shared_bar)
    return tuple(y_bar), args._replace(
        system=system_bar, formulation=formulation_bar, mass_factor=mass_factor_bar,
        reference=jax.tree.map(jnp.zeros_like, args.reference))


def _where_rows(rows, a, b):
    """`a` in the rows (leading axis) where `rows` is true, else `b`."""
    return jax.tree.map(
        lambda x, y: jnp.where(rows.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), a, b)


class _StopFailedTrajectories(AbstractWrappedSolver):
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
        return self.solver.init(terms, t0, t1, y0, args), t_failed, _failure_rows(t0, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner, t_failed, last = solver_state
        stopped = jnp.isfinite(t_failed)
        y1, y_error, dense_info, inner, result = self.solver.step(
            terms, t0, t1, y0, args._replace(stopped=stopped), inner, made_jump)
        # A first-same-as-last stage stored before the stop still holds the old rate.
        y1 = _where_rows(stopped, y0, y1)
        y_error = _where_rows(stopped, jax.tree.map(jnp.zeros_like, y_error), y_error)
        value = _failure_rows(t1, y1, args)
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


def _failure_rows(t, y, args: SolveArgs):
    return jax.vmap(_failure, in_axes=(None, None, None, 0, 0, 0, None))(*_detached(
        (args.system, args.formulation, t, *y, args.reference, args.mass_factor)))


def worst_trajectory_rms(y) -> Array:
    """The step-size controller's norm for an ensemble: the largest over trajectories of
    each trajectory's RMS norm, so that a step is accepted only if every trajectory meets
    the tolerances."""
    leaves = jax.tree_util.tree_leaves(y)
    size = sum(leaf.shape[-1] for leaf in leaves)
    squares = sum(jnp.sum(jnp.abs(leaf) ** 2, axis=-1) for leaf in leaves) / size
    return jnp.sqrt(jnp.max(squares))


def _failure_event(t, y, args: SolveArgs, **kwargs):
    # A flag has no derivative: detached, a differentiated solve does not linearize the
    # test (diffrax evaluates it at `t0` outside its loop).
    q, v = y
    return _failure(*_detached((args.system, args.formulation, t, q, v, args.reference,
                                args.mass_factor)))


def non_finite_event(t, y, args, **kwargs):
    """Stops a fixed-step solve whose state overflowed (adaptive controllers reject such
    steps instead)."""
    return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(y)]))


class _StopStalledSteps(diffrax.AbstractAdaptiveStepSizeController):
    """An adaptive controller that ends the solve with `diffrax.RESULTS.dt_min_reached`
    when the step it proposes has shrunk to the rounding level of `t`.

    Where the model yields nan or inf (a potential that leaves its domain at some `t` or
    `q`), every step across that point is rejected and the step shrinks until `t + dt`
    rounds to `t`: the solve then takes steps of length zero until `max_steps`, or forever
    with `max_steps=None`. Here it stops at the first proposal shorter than
    `4 ε max(|t|, 10⁻³ |t1 − t0|)` (`ε` the machine epsilon of `t`), which no solve that
    can still reach `t1` proposes; called eagerly, `simulate` then names what was
    non-finite (`name_non_finite_term`). One comparison per step, on scalars.

    A step that the controller proposes to end just short of a time it steps to (a
    `diffrax.ClipStepSizeController`'s `step_ts`, or the last time before one of its
    `jump_ts`) is extended to that time (`snap_to_clip_times`): else the next step, clipped
    to it, would be a rounding error long and stop the solve here. (Equal steps between
    evenly spaced save times accumulate that rounding error, e.g. `t + 0.025` landing
    two ulps before the save time 2.9.)"""

    controller: diffrax.AbstractAdaptiveStepSizeController

    @property
    def rtol(self):
        return self.controller.rtol

    @property
    def atol(self):
        return self.controller.atol

    @property
    def norm(self):  # pyright: ignore[reportIncompatibleMethodOverride]
        return self.controller.norm

    @property
    def jump_ts(self):  # read by the swept solve (`_adjoint._jumps`)
        return getattr(self.controller, "jump_ts", None)

    def wrap(self, direction):
        return _StopStalledSteps(self.controller.wrap(direction))

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        tnext, state = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        dtype = jnp.result_type(t0)
        floor = 1e-3 * jnp.abs(jnp.asarray(t1, dtype) - t0)
        tnext = snap_to_clip_times(self.controller, t0, tnext, floor)
        return tnext, (state, floor)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order,
                        controller_state):
        state, floor = controller_state
        keep, tprev, tnext, jump, state, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, state)
        tnext = snap_to_clip_times(self.controller, tprev, tnext, floor)
        eps = jnp.finfo(jnp.result_type(tprev)).eps
        stalled = tnext - tprev <= 4 * eps * jnp.maximum(jnp.abs(tprev), floor)
        result = diffrax.RESULTS.where(
            stalled & (result == diffrax.RESULTS.successful), diffrax.RESULTS.dt_min_reached,
            result)
        return keep, tprev, tnext, jump, (state, floor), result


def _clip_times(controller) -> list[Array]:
    """The sorted times that `controller` (a `diffrax.ClipStepSizeController`, possibly
    wrapping another) ends steps on: its `step_ts`, and the last time before each of its
    `jump_ts` (after which it restarts just past the jump)."""
    times = []
    while isinstance(controller, diffrax.ClipStepSizeController):
        if controller.step_ts is not None and controller.step_ts.size:
            times.append(controller.step_ts)
        if controller.jump_ts is not None and controller.jump_ts.size:
            times.append(jnp.nextafter(controller.jump_ts, -jnp.inf))
        controller = controller.controller
    return times


def snap_to_clip_times(controller, tprev, tnext, floor, ulps: int = 128) -> Array:
    """`tnext`, the end of the step from `tprev` that `controller` proposes, moved up to the
    next of its `_clip_times` where that lies at most `ulps` rounding units
    (`ε max(|t|, floor)`, as `_StopStalledSteps` measures a stall) and at most half the step
    beyond it. (Never more than half the step: a step that the error test keeps rejecting
    still shrinks below the gap, and is then stopped as stalled.)"""
    for times in _clip_times(controller):
        times = times.astype(jnp.result_type(tnext))
        index = jnp.searchsorted(times, tnext, side="left", method="scan_unrolled")
        target = times[jnp.minimum(index, times.shape[0] - 1)]
        gap = target - tnext
        unit = jnp.finfo(gap.dtype).eps * jnp.maximum(jnp.abs(target), floor)
        snap = (index < times.shape[0]) & (gap > 0) & (gap <= ulps * unit) & (
            gap <= 0.5 * (tnext - tprev))
        tnext = jnp.where(snap, target, tnext)
    return tnext


def stop_stalled_steps(stepsize_controller):
    """`stepsize_controller` wrapped in `_StopStalledSteps` if it is adaptive."""
    if isinstance(stepsize_controller, diffrax.AbstractAdaptiveStepSizeController):
        return _StopStalledSteps(stepsize_controller)
    return stepsize_controller


_NON_FINITE = (RESULTS.non_finite_mass_matrix, RESULTS.non_finite_forces,
               RESULTS.non_finite_constraints, RESULTS.non_finite_rates)


def _all_finite(*arrays) -> Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in arrays]))


@eqx.filter_jit
def _non_finite_term(system, formulation, t0, t, q, s):
    """Which term of the model is non-finite at or just after the state `(t, q, s)` where a
    solve stalled: `1 + i` for `_NON_FINITE[i]` (mass matrix, forces, constraints, rates),
    0 if none is. Probed at the state and at four points along its rates, 4, 64, 1024 and
    16384 rounding units of `t` ahead (the steps the controller rejected ended there)."""
    rates = _rates(system, formulation, t, q, s)
    rates = jax.tree.map(lambda r: jnp.where(jnp.isfinite(r), r, 0), rates)
    unit = jnp.finfo(jnp.result_type(t)).eps * jnp.maximum(jnp.maximum(jnp.abs(t),
                                                                       jnp.abs(t0)), 1e-300)

    def code(offset):
        tp, qp, sp = t + offset, q + offset * rates[0], s + offset * rates[1]
        velocities = formulation.velocities(system, tp, qp, sp)
        terms = _terms(system, tp, qp, velocities)
        flags = jnp.stack([
            ~_all_finite(terms.mass_matrix),
            ~_all_finite(terms.forces),
            ~_all_finite(terms.phi, terms.dphi, terms.psi, terms.jacobian, terms.bias),
            ~_all_finite(*_rates(system, formulation, tp, qp, sp)),
        ])
        return jnp.where(jnp.any(flags), jnp.argmax(flags) + 1, 0).astype(jnp.int32)

    codes = jax.lax.map(code, unit * jnp.array([0.0, 4.0, 64.0, 1024.0, 16384.0]))
    return codes[jnp.argmax(codes != 0)]


def name_non_finite_term(sol, system, formulation, t0):
    """`sol` (concrete) with each stalled solve (`dt_min_reached`) whose model is non-finite
    at or just after its end relabelled by the term (`_NON_FINITE`, found by
    `_non_finite_term`). Done here, after the solve and only for a stalled one, rather than
    inside every compiled solve, where the probe (a second copy of the equations of motion)
    doubled XLA's compile time of `simulate`; traced solves keep `dt_min_reached`."""
    codes = np.array(sol.result._value)
    stalled = codes == RESULTS.dt_min_reached._value
    if not np.any(stalled) or formulation.derives_velocities:
        return sol  # (a formulation that maps the state to velocities: state not at hand)
    state = sol.v_final if system.state_is_velocity else sol.p_final
    for index in (np.argwhere(stalled) if codes.ndim else [()]):
        index = tuple(index)
        code = int(_non_finite_term(system, formulation, t0, sol.t_final[index],
                                    sol.q_final[index], state[index]))
        if code:
            codes[index] = _NON_FINITE[code - 1]._value
    result = eqx.tree_at(lambda r: r._value, sol.result,
                         jnp.asarray(codes, sol.result._value.dtype))
    return eqx.tree_at(lambda s: s.result, sol, result)


def _targets(system, formulation, terms) -> bool:
    """Whether `checked_result` tests the range of the formulation's target `s` (a
    stabilized formulation that asks for the test, on a `LagrangianSystem` with
    constraints)."""
    return (isinstance(formulation, AbstractStabilizedFormulation)
            and formulation.tests_target_range and isinstance(system, LagrangianSystem)
            and terms.jacobian.shape[0] > 0)


def checked_result(initial_residual, residual, range_inputs, result: RESULTS) -> RESULTS:
    """`result` after the checks at the end of a solve (docs/failures.md), from the
    constraint residual `max(|Φ|, |Ψ|)` at the start (`initial_residual`) and at the end
    (`residual`, `inf` where the final state is not finite):

    - a solve that reached `t1` `diverged` if its constraint residual at the end exceeds
        `10⁶ max(r₀, 1)` (`r₀` the residual at `t0`) or is not finite;
    - else its constraints are not met (`constraints_not_met`) where more than a tenth of
        the stabilization's target lies outside the range of the constraint Jacobian
        (`max |s − G G⁺ s| > 0.1 max |s|`: no acceleration meets it, the constraints
        contradict each other) while the residual is above
        `max(10⁻⁶, 10⁴ ε) max(r₀, 1)`: `10⁻⁶` in float64, `1.2 · 10⁻³` in float32, where
        rounding alone leaves a chain of 64 links at `|Φ| ≈ 2 · 10⁻⁵`.

    `range_inputs`: `(G, s)` at the final state where `_targets` asks for the test
    (`_diagnostics` returns them with the final row), else None. For
    consistent constraints `s` lies in the range of `G` (independent rows: always;
    redundant ones: their targets agree), so the part outside it is zero up to rounding.
    `G⁺` drops singular values below `√ε σ_max`; the pseudo-inverse is computed in a
    `lax.cond` only where the residual exceeds its floor (in a `vmap` batch: in any of its
    trajectories): the common, met case skips it.

    All on values that carry no gradient. (Which term of a stalled solve was non-finite is
    found after the solve, eagerly: `name_non_finite_term`.)"""
    initial_residual, residual, range_inputs = jax.lax.stop_gradient(
        (initial_residual, residual, range_inputs))
    scale = jnp.maximum(initial_residual, 1.0)
    floor = max(1e-6, 1e4 * float(jnp.finfo(residual.dtype).eps)) * scale
    ok = result == RESULTS.successful
    diverged = ok & ((residual > 1e6 * scale) | ~jnp.isfinite(residual))
    result = RESULTS.where(diverged, RESULTS.diverged, result)
    if range_inputs is None:
        return result
    g, target = range_inputs
    zero = jnp.zeros((), residual.dtype)

    def gap(g, target):
        # G G⁺ s = A A⁺ s with A = G Gᵀ, whose eigenvalues are G's squared singular
        # values: `psd_pseudo_solve` drops those below `ε λ_max`, in closed form for up to
        # two constraints (an SVD, a LAPACK call, cost a tenth of a two-link trajectory
        # even in the branch not taken).
        gram = g @ g.T
        reachable = gram @ psd_pseudo_solve(gram, target, jnp.finfo(g.dtype).eps)
        return jnp.max(jnp.abs(target - reachable)), jnp.max(jnp.abs(target))

    # Taken for the whole batch where any trajectory needs it (the rows that do not are
    # masked below): under `vmap` a cond on each row's residual would run the SVD on every
    # row of every batch, about 4.6 s a call for 4,096 chains of 64 links on a GPU (whose
    # batched SVD loops over the batch).
    gap, size = jax.lax.cond(unvmap_any(residual > floor), gap,
                             lambda g, target: (zero, zero), g, target)
    not_met = ok & ~diverged & (gap > 0.1 * size) & (residual > floor)
    return RESULTS.where(not_met, RESULTS.constraints_not_met, result)


def solve_event(conditions: list, stepsize_controller) -> diffrax.Event | None:
    """The failure conditions of a solve, plus `non_finite_event` for fixed steps."""
    if isinstance(stepsize_controller, diffrax.ConstantStepSize):
        conditions = conditions + [non_finite_event]
    return diffrax.Event(conditions) if conditions else None


def event_result(out: diffrax.Solution, failures: list) -> RESULTS:
    """jaxdae's result of a solve with `solve_event`: the failure named by the condition
    that stopped it (`failures[i]` for the i-th condition), `non_finite_state` for the
    appended non-finite condition."""
    result = RESULTS.promote(out.result)
    if out.event_mask is None:
        return result
    names = failures + [RESULTS.non_finite_state]
    for stopped, name in zip(out.event_mask, names, strict=False):
        result = RESULTS.where((out.result == diffrax.RESULTS.event_occurred) & stopped,
                               name, result)
    return result


@eqx.filter_jit
def _diagnostics(system, formulation, t, q, s):
    """Constraint residuals, multipliers, energy, velocities and momenta at one saved state,
    the mass matrix and forces there, and the inputs of `checked_result`'s range test
    (`(G, s)`, or None: `_targets`). Differentiated by JAX, in forward and reverse mode,
    where the solve's adjoint works in both; by its vector–Jacobian product where the
    adjoint works in reverse mode only (`_reverse_diagnostics`)."""
    s = _velocities(system, formulation, t, q, s)
    terms = _terms(system, t, q, s)
    _, multipliers = formulation.accelerations(terms)
    range_inputs = None
    if _targets(system, formulation, terms):
        range_inputs = terms.jacobian, formulation.target(terms)
    return (terms.phi, terms.dphi, terms.psi, multipliers,
            system.energy(t, q, s) if terms.energy is None else terms.energy,
            system.velocities(t, q, s), _momenta(system, t, q, s, terms), terms.mass_matrix,
            terms.forces, range_inputs)


@eqx.filter_custom_vjp
def _reverse_diagnostics(state):
    """`_diagnostics(*state)`, `state = (system, formulation, t, q, s)`, for solves whose
    adjoint works in reverse mode only (`reverse_only`): differentiated by its vector–Jacobian
    product, evaluated in the backward pass only where an output has a cotangent.

    JAX differentiates a function in reverse mode by linearizing it whole, so every output
    used or not: most losses read none of the diagnostics (a loss on `q_final`), and their
    linearization, which XLA removes again, was a fifth of the gradient's trace on the
    ladder of 128 four-bars (`experiments/bench_compile.py --model ladder:128 --only
    gradient`). A loss on them pays instead for a second evaluation in the backward pass.
    (Not for forward mode, which a custom VJP refuses: `simulate` keeps `_diagnostics` for
    adjoints such as `diffrax.ForwardMode()`.)"""
    return _diagnostics(*state)


@_reverse_diagnostics.def_fwd
def _reverse_diagnostics_fwd(perturbed, state):
    del perturbed
    return _diagnostics(*state), None


@_reverse_diagnostics.def_bwd
def _reverse_diagnostics_bwd(residuals, out_bar, perturbed, state):
    del residuals
    if all(bar is None for bar in jax.tree.leaves(out_bar, is_leaf=is_none)):
        return nones(eqx.filter(state, eqx.is_inexact_array))
    state = jax.tree.map(typed_literal_as_array, state)
    diff, static = eqx.partition(state, perturbed)
    out, pull = jax.vjp(lambda diff: eqx.filter(_diagnostics(*eqx.combine(diff, static)),
                                                eqx.is_inexact_array), diff)
    (diff_bar,) = pull(jax.tree.map(
        lambda x, bar: None if x is None else jnp.zeros_like(x) if bar is None else bar,
        out, out_bar, is_leaf=is_none))
    return diff_bar


def _momenta(system, t, q, s, terms):
    """The system's momenta at the state `(q, s)`: from its `terms` there where they hold
    them."""
    return system.momenta(t, q, s) if terms.momenta is None else terms.momenta


def check_initial_state(system: AbstractSystem, formulation, t0, q0, v0
                        ) -> tuple[Array, Array, Array]:
    """The mass matrix at the initial state, one flag per problem in
    `_INITIAL_STATE_MESSAGES` followed by the formulation's `state_problems` flags, and the
    values those quote (the eager checks)."""
    terms = _terms(system, t0, q0, v0)
    flags, values = initial_state_problems(system, formulation, (t0, q0, v0),
                                           (terms.mass_matrix, terms.forces),
                                           terms.num_nonholonomic)
    return terms.mass_matrix, flags, values


def initial_state_problems(system, formulation, state, terms, num_nonholonomic: int,
                           rows: str | None = None) -> tuple[Array, Array]:
    """The flags and values of `check_initial_state` at the initial `state = (t0, q0, v0)`,
    given `terms = (mass matrix, forces)` there.

    With `rows`, the name of a `vmap` axis over trajectories, each flag says whether it holds
    in any row. A flag that is the same in every row (a constant) then stays one value: as a
    column broadcast over the rows and reduced, XLA's GPU compiler constant-folded it row by
    row (2 s at 10⁶ rows on an H100)."""
    (t0, q0, v0), (mass, forces) = state, terms
    asym = jnp.max(jnp.abs(mass - mass.T)) > 1e-8 * (1 + jnp.max(jnp.abs(mass)))
    if jnp.shape(q0) == jnp.shape(v0):  # one reduction: one operation fewer in the program
        q0_finite, v0_finite = jnp.all(jnp.isfinite(jnp.stack([q0, v0])).reshape(2, -1), axis=1)
    else:
        q0_finite, v0_finite = jnp.all(jnp.isfinite(q0)), jnp.all(jnp.isfinite(v0))
    flags = [
        ~q0_finite,
        ~v0_finite,
        asym | ~is_mass_positive_definite(system, t0, q0, v0, 0.5 * (mass + mass.T)),
        ~jnp.all(jnp.isfinite(forces)),
        # Only nonholonomic constraints can fail to be affine (a Hessian costs trace time).
        is_not_affine(*system.velocity_constraint_curvature(t0, q0, v0))
        if num_nonholonomic else False,
    ]
    problems, values = formulation.state_problems(system, t0, q0, v0)
    if rows is not None:
        def anywhere(flag):
            return jax.lax.psum(jnp.asarray(flag, jnp.int32), rows) > 0

        flags, problems = [anywhere(f) for f in flags], anywhere(problems)
    return jnp.concatenate([jnp.stack(flags), problems]), values


def _initial_state_message(formulation, problem: int) -> str:
    """The message of flag `problem` of `check_initial_state`."""
    if problem < len(_INITIAL_STATE_MESSAGES):
        return _INITIAL_STATE_MESSAGES[problem]
    return formulation.state_messages[problem - len(_INITIAL_STATE_MESSAGES)][0]


_INITIAL_STATE_MESSAGES = (
    "`q0` contains non-finite values (nan or inf); pass finite initial coordinates.",
    "`v0` contains non-finite values (nan or inf); pass finite initial velocities.",
    "The mass matrix at `q0` is not symmetric positive definite; check `kinetic_energy` / "
    "`mass_matrix` (every coordinate needs inertia) or move `q0` away from a degenerate "
    "configuration.",
    "The generalized forces at (t0, q0, v0) are not finite; check `potential_energy`, "
    "`generalized_forces` and `kinetic_energy` at the initial state.",
    "`velocity_constraints` is not affine in the velocities (∂²Ψ/∂v² ≠ 0 near the initial "
    "state): every formulation needs Ψ = A(t, q) v + a(t, q) (Shemelova (2016) eq. [1]). Rewrite it "
    "linearly in v (e.g. a rolling condition `v_x sin θ − v_y cos θ`, not its square).",
)

_check_initial_state_jit = eqx.filter_jit(check_initial_state)


def _check_types(system, formulation):
    check_instance("system", system, AbstractSystem,
                   "a jaxdae system (e.g. a `jaxdae.LagrangianSystem` subclass)")
    check_instance("formulation", formulation, AbstractFormulation,
                   "a jaxdae formulation such as `jaxdae.Baumgarte(kd, kp)` or "
                   "`jaxdae.ModifiedLagrange(alpha, kd, kp)`")


def check_solve_options(solver, stepsize_controller, adjoint, max_steps) -> None:
    """The diffrax options of a solve are instances of the right kind; `max_steps` is a
    positive integer or `None`. (What [`jaxdae.ReverseSweepAdjoint`][] cannot sweep — an
    implicit solver, `max_steps=None` — it refuses itself when the solve is traced.)"""
    check_instance("solver", solver, diffrax.AbstractSolver,
                   "a diffrax solver instance such as `diffrax.Tsit5()`", optional=True)
    check_instance("stepsize_controller", stepsize_controller,
                   diffrax.AbstractStepSizeController,
                   "a diffrax step-size controller such as `diffrax.PIDController(rtol, atol)` "
                   "or `diffrax.ConstantStepSize()`", optional=True)
    check_instance("adjoint", adjoint, diffrax.AbstractAdjoint,
                   "a diffrax adjoint such as `diffrax.RecursiveCheckpointAdjoint()` or "
                   "`jaxdae.ReverseSweepAdjoint()`", optional=True)
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(
            max_steps, (int, np.integer)) or max_steps < 1):
        raise ValueError(f"`max_steps` must be a positive integer or None; got {max_steps!r}.")
    check_controller_values(stepsize_controller)
    if isinstance(adjoint, diffrax.RecursiveCheckpointAdjoint) and not (
            adjoint.checkpoints is None or (isinstance(adjoint.checkpoints, (int, np.integer))
                                            and adjoint.checkpoints >= 1)):
        raise ValueError("`diffrax.RecursiveCheckpointAdjoint(checkpoints=...)` must be a "
                         f"positive integer or None; got {adjoint.checkpoints!r}.")


def _controller_value(name, value, rule, fix):
    """`ValueError` naming `name` unless a concrete `value` satisfies `rule` (None and
    traced values pass)."""
    if value is None or not is_concrete(value):
        return
    array = np.asarray(value, dtype=float)
    if not (array.ndim == 0 and np.isfinite(array) and rule(float(array))):
        raise ValueError(f"The step-size controller's `{name}` must be {fix}; got {value!r}.")


def check_controller_values(controller) -> None:
    """The numbers of a diffrax step-size controller that the user passed, checked as
    `simulate` checks its own `rtol` and `atol` (concrete values only): a
    `diffrax.PIDController`'s tolerances, coefficients, step bounds and factors, the
    controller inside a `diffrax.ClipStepSizeController` and its times, a `diffrax.StepTo`'s
    times. A negative `rtol`, say, would make every step pass its error test."""
    if isinstance(controller, diffrax.ClipStepSizeController):
        for name in ("step_ts", "jump_ts"):
            times = getattr(controller, name)
            if times is not None and is_concrete(times) and not np.all(
                    np.isfinite(np.asarray(times))):
                raise ValueError(f"`diffrax.ClipStepSizeController({name}=...)` must hold "
                                 f"finite times; got {times}.")
        controller = controller.controller
    if isinstance(controller, diffrax.StepTo):
        times = controller.ts
        if is_concrete(times):
            times = np.asarray(times)
            if not (np.all(np.isfinite(times)) and np.all(np.diff(times) > 0)):
                raise ValueError("`diffrax.StepTo(ts=...)` must hold finite, strictly "
                                 f"increasing times; got {times}.")
    if not isinstance(controller, diffrax.PIDController):
        return
    rtol, atol = controller.rtol, controller.atol
    for name, value in (("rtol", rtol), ("atol", atol)):
        _controller_value(name, value, lambda x: x >= 0, "a finite non-negative number")
    if is_concrete(rtol, atol) and np.ndim(rtol) == 0 and np.ndim(atol) == 0 and (
            float(rtol) + float(atol) <= 0):
        raise ValueError("The step-size controller's `rtol` and `atol` must not both be "
                         "zero: every step would fail its error test.")
    for name in ("pcoeff", "icoeff", "dcoeff"):
        _controller_value(name, getattr(controller, name), lambda x: True, "finite")
    _controller_value("icoeff", controller.icoeff, lambda x: x > 0,
                      "positive (it sets how the step follows the error)")
    for name in ("dtmin", "dtmax"):
        _controller_value(name, getattr(controller, name), lambda x: x > 0,
                          "a positive finite step or None")
    dtmin, dtmax = controller.dtmin, controller.dtmax
    if dtmin is not None and dtmax is not None and is_concrete(dtmin, dtmax) and (
            float(dtmin) > float(dtmax)):
        raise ValueError(f"The step-size controller's `dtmin` ({dtmin}) must not exceed its "
                         f"`dtmax` ({dtmax}).")
    _controller_value("factormin", controller.factormin, lambda x: 0 < x <= 1,
                      "in (0, 1]")
    _controller_value("factormax", controller.factormax, lambda x: x >= 1,
                      "at least 1")
    _controller_value("safety", controller.safety, lambda x: 0 < x <= 1, "in (0, 1]")


def _signature(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(
        (jnp.shape(x), jnp.result_type(x)) if eqx.is_array_like(x) else x for x in leaves
    )


def _check_structure(system, formulation, t0, q0, v0):
    """Shapes and constraint counts; returns the formulation with its gains' shapes checked
    (`validate`) and the constraint counts."""
    if q0.shape != v0.shape:
        raise ValueError(
            f"`q0` and `v0` must have the same shape (n,); got {q0.shape} and {v0.shape}."
        )
    key = (_signature(system), _signature((t0, q0, v0)))
    counts = _COUNTS.get(key)
    if counts is None:
        terms = eqx.filter_eval_shape(_terms, system, t0, q0, v0)
        n = q0.shape[0]
        if terms.mass_matrix.shape != (n, n):
            raise ValueError(
                f"The mass matrix has shape {terms.mass_matrix.shape} but `q0` has {n} "
                f"coordinates; `q0` and `v0` must have one entry per generalized coordinate."
            )
        if terms.forces.shape != (n,):
            raise ValueError(
                f"`generalized_forces` must return shape ({n},); got {terms.forces.shape}."
            )
        counts = _COUNTS[key] = (terms.phi.shape[0], terms.psi.shape[0])
    return formulation.validate(*counts), counts


_COUNTS: dict = {}  # constraint counts per (system, state) signature


def warn_unstable_step(formulation, counts: tuple[int, int], solver, dt0) -> None:
    """A `UserWarning` before a fixed-step solve whose step makes the constraint
    perturbations grow: `ρ(R(τH)) > 1` (Mukharlyamov (2019) §4; [`fixed_step_radius`][], known for
    formulations with exact perturbations and concrete gains and step). A warning, not an
    error: a short solve, or a study of the instability, may mean it; a solve whose
    residual then explodes ends with `RESULTS.diverged`."""
    radius = fixed_step_radius(formulation, counts[0], solver, dt0, counts[1])
    if radius is not None and radius > 1 + 1e-12:
        warnings.warn(
            f"The fixed step dt0 = {float(dt0):.4g} of {type(solver).__name__} makes the "
            f"constraint perturbations of {type(formulation).__name__} unstable: the "
            f"spectral radius of the step's transition R(τH) is {radius:.4g} > 1 "
            "(Mukharlyamov (2019) §4), so the residual grows by that factor per step. Reduce `dt0` "
            "(or the gains) until `jaxdae.spectral_radius(jaxdae.transition_matrix("
            "jaxdae.perturbation_matrix(formulation, m), solver, dt0))` < 1.",
            UserWarning, stacklevel=6)


def _check_times(t0, t1, ts):
    if t0.ndim != 0 or t1.ndim != 0:
        raise ValueError(f"`t0` and `t1` must be scalars; got shapes {t0.shape} and {t1.shape}.")
    if ts is not None and (ts.ndim != 1 or ts.shape[0] == 0):
        raise ValueError(f"`ts` must be a non-empty 1-D array of times; got shape {ts.shape}.")
    if is_concrete(t0, t1):
        if not (np.isfinite(float(t0)) and np.isfinite(float(t1))):
            raise ValueError(
                f"`t0` and `t1` must be finite times; got t0 = {t0}, t1 = {t1}. (An infinite "
                "`t1` would step until `max_steps`.)"
            )
        if not float(t1) > float(t0):
            raise ValueError(f"`t1` must be greater than `t0`; got t0 = {t0}, t1 = {t1}.")
    if ts is not None and is_concrete(ts, t0, t1):
        ts_np = np.asarray(ts)
        if not np.all(np.isfinite(ts_np)):
            raise ValueError(f"`ts` must hold finite times; got {ts_np}.")
        if np.any(np.diff(ts_np) < 0):
            raise ValueError(
                "`ts` must be sorted in increasing order; sort it (e.g. `jnp.sort(ts)`)."
            )
        if ts_np[0] < float(t0) or ts_np[-1] > float(t1):
            raise ValueError(
                f"`ts` must lie in [t0, t1] = [{float(t0)}, {float(t1)}]; got "
                f"[{ts_np[0]}, {ts_np[-1]}]."
            )


@full_precision
def simulate(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    *,
    ts: Float[ArrayLike, " N"] | None = None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: ScalarLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
) -> Solution:
    """Simulates a constrained system, turned into an ODE by `formulation`, with diffrax.

    Works under `jax.jit`, `jax.vmap` (over initial states, gains, system parameters) and
    `jax.grad` (w.r.t. gains, parameters, initial state and times; see `adjoint`).

    **Arguments:**

    - `system`: a [`jaxdae.LagrangianSystem`][] (or another `AbstractSystem`).
    - `formulation`: how the constraints are enforced, e.g. [`jaxdae.Baumgarte`][],
        [`jaxdae.PseudoInverse`][], [`jaxdae.ModifiedLagrange`][], [`jaxdae.Unstabilized`][].
    - `t0`, `t1`: start and end time, `t1 > t0`.
    - `q0`, `v0`: initial coordinates and velocities, shape `(n,)` — for a system whose
        state holds momenta ([`jaxdae.HamiltonianSystem`][]) `v0` is the initial momenta
        `p0` (Shemelova (2016), eqs. [3]–[6]). They need not satisfy
        the constraints (the stabilized formulations pull them back); see
        [`jaxdae.consistent_initial_state`][] for a consistent start.
    - `ts`: times at which to save the solution. Default: `[t0, t1]`.
    - `solver`: any diffrax ODE solver. Default `diffrax.Tsit5()` (adaptive, explicit).
    - `stepsize_controller`: default `diffrax.PIDController(rtol, atol)`; pass
        `diffrax.ConstantStepSize()` (with `dt0`) for a fixed-step method.
    - `dt0`: initial step; default chosen automatically by the controller.
    - `rtol`, `atol`: tolerances of the default step-size controller.
    - `max_steps`: maximum number of steps.
    - `adjoint`: how gradients are computed; both defaults are discretize-then-optimize
        (the exact gradient of the computed solution). Default for explicit Runge–Kutta
        solvers (with an integer `max_steps`): [`jaxdae.ReverseSweepAdjoint`][]`()`, the
        discrete adjoint swept over the stored steps, at most 1024 at once (segments
        beyond are re-solved from checkpoints); for other solvers
        `diffrax.RecursiveCheckpointAdjoint(checkpoints=32)`. Both work in reverse mode
        (`jax.grad`); forward mode (`jax.jvp`, `jax.jacfwd`) needs
        `adjoint=diffrax.ForwardMode()` (a `ValueError` says so). Any diffrax adjoint may be
        passed.
    - `throw`: raise [`jaxdae.SimulationError`][] when the solve fails (the message says what
        happened, at which `t` and `q`); with `False` inspect `Solution.result` instead.

    **Returns:**

    A [`jaxdae.Solution`][].

    **Raises:**

    `ValueError` for bad input (shapes, non-finite values, a mass matrix that is not
    symmetric positive definite at `q0`, gains that are not positive definite, a
    `velocity_constraints` that is not affine in the velocities, non-finite times,
    `t1 <= t0`, unsorted `ts`, negative or zero tolerances); [`jaxdae.SimulationError`][]
    for a failed solve with `throw=True`.
    """
    return _run(system, formulation, t0, t1, q0, v0, SolveCall(
        ts=ts, ensemble=False, solver=solver, stepsize_controller=stepsize_controller, dt0=dt0,
        rtol=rtol, atol=atol, max_steps=max_steps, adjoint=adjoint, throw=throw))


@full_precision
def simulate_ensemble(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, "B n"],
    v0: Float[ArrayLike, "B n"],
    *,
    ts: Float[ArrayLike, " N"] | None = None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: ScalarLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
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
    faster: the two-link batch of 1024 ran 1.5–1.6× faster on a 2-core CPU
    (`experiments/bench_batch.py`). For trajectories of very different difficulty,
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
    smaller near every trajectory's failure.

    **Arguments:**

    As for [`jaxdae.simulate`][], except:

    - `q0`, `v0`: initial coordinates and velocities (or momenta), shape `(B, n)`.
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
    return _run(system, formulation, t0, t1, q0, v0, SolveCall(
        ts=ts, ensemble=True, solver=solver, stepsize_controller=stepsize_controller, dt0=dt0,
        rtol=rtol, atol=atol, max_steps=max_steps, adjoint=adjoint, throw=throw))


class SolveCall(eqx.Module):
    """The keyword arguments of a call of [`jaxdae.simulate`][] (`ensemble=False`),
    [`jaxdae.simulate_ensemble`][] or [`jaxdae.simulate_actuated`][], as given, and what the
    solve makes of them (`times`, `options`)."""

    ts: Float[ArrayLike, " N"] | None
    ensemble: bool = eqx.field(static=True)
    solver: diffrax.AbstractSolver | None
    stepsize_controller: diffrax.AbstractStepSizeController | None
    dt0: ScalarLike | None
    rtol: ScalarLike
    atol: ScalarLike
    max_steps: int | None
    adjoint: diffrax.AbstractAdjoint | ReverseSweepAdjoint | None
    throw: bool

    def check_options(self) -> None:
        """`check_solve_options` of the solver, controller, adjoint and step limit."""
        check_solve_options(self.solver, self.stepsize_controller, self.adjoint,
                            self.max_steps)

    def times(self, t0, t1, dtype) -> "_Times":
        """`t0`, `t1` and `ts` as arrays of `dtype`, checked (`_check_times`)."""
        t0, t1 = jnp.asarray(t0, dtype=dtype), jnp.asarray(t1, dtype=dtype)
        ts = None if self.ts is None else jnp.asarray(self.ts, dtype=dtype)
        _check_times(t0, t1, ts)
        return _Times(t0, t1, ts)

    def options(self, dtype, norm=optx.rms_norm) -> "_SolveOptions":
        """The solve's options with the defaults filled in: `step_options` (the default
        controller measures errors with `norm`), an implicit solver's root finder set to
        stop at the step's tolerance (`configure_for_controller`), `default_adjoint`."""
        stepsize_controller, dt0 = step_options(self.stepsize_controller, self.dt0, self.rtol,
                                                self.atol, dtype, norm)
        solver = (Tsit5 if self.solver is None
                  else configure_for_controller(self.solver, stepsize_controller))
        adjoint = (default_adjoint(solver, self.max_steps) if self.adjoint is None
                   else self.adjoint)
        return _SolveOptions(solver=solver, stepsize_controller=stepsize_controller, dt0=dt0,
                             max_steps=self.max_steps, adjoint=adjoint, ensemble=self.ensemble)


class _Times(eqx.Module):
    """The times of a checked solve: start, end and the save times (None: `[t0, t1]`)."""

    t0: Array
    t1: Array
    ts: Array | None


class _SolveOptions(eqx.Module):
    """How `_simulate` solves: diffrax's solver, step-size controller, first step, step
    limit and adjoint (defaults filled in), and whether the states are an ensemble's rows."""

    solver: diffrax.AbstractSolver
    stepsize_controller: diffrax.AbstractStepSizeController
    dt0: Array | None
    max_steps: int | None = eqx.field(static=True)
    adjoint: diffrax.AbstractAdjoint | ReverseSweepAdjoint
    ensemble: bool = eqx.field(static=True)


class _TracedChecks(eqx.Module):
    """What `_simulate` checks when anything is `traced` (`_check_traced`): the checks
    of traced gains (`gain_flags`, one message each: the formulation's `traced_checks`),
    the initial state
    (`check_state`: a traced state) and the times, and the solve's failure (`throw`)."""

    gain_flags: tuple
    gain_messages: tuple[str, ...] = eqx.field(static=True)
    traced: bool = eqx.field(static=True)
    check_state: bool = eqx.field(static=True)
    throw: bool = eqx.field(static=True)


def in_current_mesh(fn):
    """`fn` run with JAX's current abstract mesh set explicitly (the empty mesh outside
    any mesh).

    When reverse mode differentiates a jitted function (`_simulate` called eagerly), JAX
    replays its equations with the context each was recorded in, which names the empty
    mesh where the caller's context named none. What is traced lazily there
    (`ReverseSweepAdjoint`'s forward solve) then missed every trace cache that the
    structure checks had filled, and traced the equations of motion and the solve a second
    time. Setting the current mesh explicitly keeps those caches valid
    (`experiments/bench_compile.py` shows the gradient's trace time)."""

    @functools.wraps(fn)
    def in_mesh(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(jax.sharding.get_abstract_mesh()):
            return fn(*args, **kwargs)

    return in_mesh


@in_current_mesh
def _run(system, formulation, t0, t1, q0, v0, call: SolveCall) -> Solution:
    """Checks the input of `simulate` (`call.ensemble` false) or `simulate_ensemble`, solves
    and reports failures."""
    ensemble = call.ensemble
    q0 = _float_array("q0", explicit_to_auto(q0), ensemble)
    v0 = _float_array("v0", explicit_to_auto(v0), ensemble)
    if is_explicitly_sharded(q0) or is_explicitly_sharded(v0):
        raise ValueError(
            "`q0` and `v0` are traced with an Explicit sharding in their type (a mesh from "
            "`jax.make_mesh` with its default axis types); jaxdae's solves do not support "
            "those. Build the mesh with `axis_types=(jax.sharding.AxisType.Auto,)` or pass "
            "the placed arrays from outside `jax.jit`."
        )
    dtype = jnp.result_type(q0, v0)
    q0, v0 = q0.astype(dtype), v0.astype(dtype)
    if q0.shape != v0.shape:
        shape = "(B, n)" if ensemble else "(n,)"
        raise ValueError(
            f"`q0` and `v0` must have the same shape {shape}; got {q0.shape} and {v0.shape}."
        )
    _check_types(system, formulation)
    call.check_options()
    times = call.times(t0, t1, dtype)
    t0 = times.t0
    # The state's dtype sets the precision: float32 states give a float32 simulation.
    system, formulation = cast_floating((system, formulation), dtype)
    if ensemble:  # shapes of one trajectory (no slicing: q0 may be sharded)
        lane = jax.ShapeDtypeStruct(q0.shape[1:], dtype)
        formulation, counts = _check_structure(system, formulation, t0, lane, lane)
    else:
        formulation, counts = _check_structure(system, formulation, t0, q0, v0)
    # Traced gains' checks join the solve's one branched error (`_check_traced`).
    gain_checks = formulation.traced_checks(*counts)
    if is_concrete(formulation):
        formulation.check_values()

    eager = is_concrete(system, t0, q0, v0)
    if eager:
        if ensemble:
            mass, flags, values = jax.vmap(
                _check_initial_state_jit, in_axes=(None, None, None, 0, 0))(
                system, formulation, t0, q0, v0)
            flags = np.asarray(flags)
            row = int(np.argmax(flags.any(axis=1)))
            mass, flags, values = mass[row], flags[row], values[row]
            where = f"Trajectory {row} (row of q0, v0): "
        else:
            mass, flags, values = _check_initial_state_jit(system, formulation, t0, q0, v0)
            flags, where = np.asarray(flags), ""
        if flags.any():
            problem = int(np.argmax(flags))
            message = where + _initial_state_message(formulation, problem)
            if problem == 2:
                mass = np.asarray(mass)
                lowest = np.linalg.eigvalsh(0.5 * (mass + mass.T))[0] if np.all(
                    np.isfinite(mass)) else np.nan
                message += f" (lowest eigenvalue of its symmetric part: {lowest:.3g})"
            elif problem >= len(_INITIAL_STATE_MESSAGES):  # the formulation's
                own = problem - len(_INITIAL_STATE_MESSAGES)
                message += f" ({formulation.state_messages[own][1]}: {float(values[own]):.3g})"
            raise ValueError(message)

    options = call.options(dtype, worst_trajectory_rms if ensemble else optx.rms_norm)
    if isinstance(options.stepsize_controller, diffrax.ConstantStepSize):
        warn_unstable_step(formulation, counts,
                           Tsit5 if call.solver is None else call.solver, options.dt0)
    traced = not is_concrete(system, formulation, times, q0, v0)
    checks = _TracedChecks(
        gain_flags=tuple(flag for flag, _ in gain_checks),
        gain_messages=tuple(message for _, message in gain_checks), traced=traced,
        check_state=not eager, throw=call.throw)
    with forward_mode_hint():
        sol = _simulate(system, formulation, times, q0, v0, options, checks)
    if not traced:
        sol = name_non_finite_term(sol, system, formulation, t0)
        sol = name_singular_newton_matrix(sol, options.solver, system)
    if call.throw and not traced:  # else `_simulate` attached the check
        sol = raise_failure(sol, _first_failure(sol.result) if ensemble else None)
    return sol


def _first_failure(result: RESULTS) -> RESULTS:
    """An ensemble's result of its first failed trajectory (the first if none failed)."""
    first = jnp.argmax(result != RESULTS.successful)
    return jax.tree.map(lambda x: x[first], result)


def raise_failure(sol, result: RESULTS | None = None):
    """`throw=True`: raises [`jaxdae.SimulationError`][] naming the failure of a concrete
    solution, or attaches the check (`eqx.error_if`) to a traced one. `result` defaults to
    `sol.result`."""
    if is_concrete(sol.result):
        message = failure_message(sol)
        if message is not None:
            raise SimulationError(message)
        return sol
    result = sol.result if result is None else result
    return attach_check(sol, lambda x: result.error_if(x + reported_failure(sol),
                                                       result != RESULTS.successful))


def reported_failure(sol) -> Array:
    """A zero that, where a traced solve failed (`throw=True` inside the caller's `jit`,
    `vmap` or `grad`), is computed by a host callback that first writes
    [`failure_text`][] to standard error: what happened, the batch element, `t` and `q`.

    The error raised next (`equinox.error_if`) has a message fixed when the program was
    compiled, and under the caller's own `jax.jit` JAX puts its own lines before it; this
    line comes first and keeps the time and state. Nothing runs where every solve
    succeeded: the callback sits in a `lax.cond` on whether any element of the batch failed.
    An ensemble's first failed row is picked by reductions, so that a sharded ensemble is
    not gathered onto the callback's device."""
    codes = sol.result._value
    failed = codes != RESULTS.successful._value
    arrays = (codes, sol.t_final, sol.q_final, *residuals(sol))
    element = ()
    if codes.ndim:  # an ensemble: the values of its first failed row
        first = jnp.argmax(failed.reshape(-1))
        pick = (jnp.arange(codes.size) == first).reshape(codes.shape)

        def row(x):
            mask = pick.reshape(pick.shape + (1,) * (x.ndim - pick.ndim))
            return jnp.sum(jnp.where(mask, x, jnp.zeros((), x.dtype)), axis=tuple(
                range(pick.ndim)))

        arrays = tuple(row(x) for x in arrays)
        element = (jnp.stack(jnp.unravel_index(first, codes.shape)),)
    arrays = jax.lax.stop_gradient(arrays)
    dtype = sol.t_final.dtype

    def report(*values):
        *values, row = values if element else (*values, None)
        message = failure_text(*values, element=row)
        if message is not None:
            print(f"jaxdae.SimulationError: {message}", file=sys.stderr, flush=True)
        return np.zeros(np.shape(values[1]), dtype)

    def callback():
        return jax.pure_callback(report, jax.ShapeDtypeStruct((), dtype), *arrays, *element,
                                 vmap_method="broadcast_all")

    return jax.lax.cond(unvmap_any(jnp.any(failed)), callback,
                        lambda: jnp.zeros((), dtype))


Tsit5 = diffrax.Tsit5()


class Dynamics(eqx.Module):
    """What the solve path integrates for a model `(system, strategy)` (a system and its
    formulation, or an actuated system and its control): the vector field
    `vector_field(t, y, args)` with the solve's `args` (`SolveArgs` for a system and its
    formulation), and the conditions (diffrax event conditions on the same arguments) that
    stop the solve, each with the [`jaxdae.RESULTS`][] item it reports.

    `stage_vjp`, if given, is the vector–Jacobian product that
    [`jaxdae.ReverseSweepAdjoint`][] applies at each stage (`ODETermWithVJP`; an ensemble
    applies each trajectory's own, row by row); other adjoints ignore it.
    `saves_solver_state`: the solve keeps its final solver state (an ensemble whose
    trajectories stop one by one reads the stopped rows from it)."""

    vector_field: Callable = eqx.field(static=True)
    conditions: tuple[Callable, ...] = eqx.field(static=True, default=())
    failures: tuple[RESULTS, ...] = ()
    stage_vjp: Callable | None = eqx.field(static=True, default=None)
    saves_solver_state: bool = eqx.field(static=True, default=False)


def integrate(dynamics: Dynamics, args, y0, times: "_Times", options: "_SolveOptions"
              ) -> tuple[diffrax.Solution, RESULTS]:
    """The one diffrax solve of [`jaxdae.simulate`][], [`jaxdae.simulate_ensemble`][] and
    [`jaxdae.simulate_actuated`][]: from `y0` over `times` with `options`, saving as
    `save_at` says, stopped by `dynamics.conditions` (and a non-finite state under fixed
    steps, `solve_event`) and by a stalled step (`stop_stalled_steps`). Returns diffrax's
    solution and jaxdae's result (the failure that stopped it named, `event_result`)."""
    solver, controller = options.solver, options.stepsize_controller
    t0, t1, ts = times.t0, times.t1, times.ts
    saveat = save_at(t0, t1, ts, controller)
    if dynamics.saves_solver_state:
        saveat = eqx.tree_at(lambda s: s.solver_state, saveat, True)
    event = solve_event(list(dynamics.conditions), controller)
    controller = stop_stalled_steps(controller)
    term = (diffrax.ODETerm(dynamics.vector_field) if dynamics.stage_vjp is None
            else ODETermWithVJP(dynamics.vector_field, dynamics.stage_vjp))
    out = _diffeqsolve(term, solver, t0, t1, options.dt0, y0, args=args, saveat=saveat,
                       stepsize_controller=controller, adjoint=options.adjoint, event=event,
                       max_steps=options.max_steps, throw=False)
    return out, named_result(solver, event_result(out, list(dynamics.failures)))


# `diffrax.diffeqsolve` without its own `eqx.filter_jit`: `integrate` is always traced inside
# a jit (the solve's own, `jit_unless_staged`, or the caller's). Reverse mode stages a jitted
# call before it differentiates it, and staging the adjoint's custom VJP traces the primal
# solve, which the gradient then does not use: the two-link gradient traced the right-hand
# side 12 times instead of 9, and its trace took 2.65 s instead of 2.09 s (CPU time, median
# of 3 interleaved cold traces). (The plain function if equinox no longer exposes it.)
_diffeqsolve = getattr(diffrax.diffeqsolve, "__wrapped__", diffrax.diffeqsolve)


@jit_unless_staged
def _simulate(system, formulation, times: _Times, q0, v0, options: _SolveOptions,
              checks: _TracedChecks):
    """The solve and its `Solution`; if anything is `checks.traced`, with its checks
    attached (`_check_traced`)."""
    t0, t1, ts, ensemble = times.t0, times.t1, times.ts, options.ensemble
    traced, throw = checks.traced, checks.throw
    # An ensemble's trajectories stop one by one; one trajectory's solve stops at an event.
    stops_rows = ensemble and formulation.can_fail
    stops = formulation.can_fail and not ensemble
    checked_q0, checked_v0 = q0, v0
    if ensemble and traced and not throw:
        # A row with a non-finite start would stall the shared steps of every row: it is
        # solved as a copy of a finite row, and reported as `invalid_input` (`_check_traced`).
        finite = jnp.all(jnp.isfinite(q0), axis=1) & jnp.all(jnp.isfinite(v0), axis=1)
        donor = jnp.argmax(finite)
        q0, v0 = (jnp.where(finite[:, None], x, x[donor]) for x in (q0, v0))
    reference = None
    if formulation.can_fail:
        initial = _failure_reference
        if ensemble:
            initial = jax.vmap(initial, in_axes=(None, None, None, 0, 0))
        # Detached before the call: stopped after it, the call would still be linearized.
        reference = initial(*_detached((system, formulation, t0, q0, v0)))
    if stops:
        dynamics = Dynamics(_vector_field, (_failure_event,), (formulation.failure_result,))
    elif stops_rows:
        dynamics = Dynamics(_ensemble_vector_field, stage_vjp=_ensemble_stage_vjp,
                            saves_solver_state=True)
        options = eqx.tree_at(lambda o: o.solver, options,
                              _StopFailedTrajectories(options.solver))
    else:
        dynamics = Dynamics(_ensemble_vector_field if ensemble else _vector_field,
                            stage_vjp=_ensemble_stage_vjp if ensemble else None)
    # A constant mass matrix is factored once, here, not at every stage (an ensemble's
    # trajectories share the system, so they share it too).
    first = (lambda x: x[0]) if ensemble else (lambda x: x)
    args = SolveArgs(system, formulation, reference,
                     constant_mass_factor(system, t0, first(q0), first(v0), _terms))
    out, result = integrate(dynamics, args, (q0, v0), times, options)
    reached = out.result == diffrax.RESULTS.successful
    reverse = reverse_only(options.adjoint)

    if not ensemble:
        sol, initial = _solution(system, formulation, (t0, q0, v0), ts, (out.ts, out.ys),
                                 (reached, result, out.stats), reverse)
    else:
        def trajectory(q0, v0, ys, t_failed):
            failed = jnp.isfinite(t_failed)
            ts_saved, ys = _cut_at(ts, out.ts, ys, t_failed)
            return _solution(system, formulation, (t0, q0, v0), ts, (ts_saved, ys),
                             (reached & ~failed,
                              RESULTS.where(failed, formulation.failure_result, result),
                              out.stats), reverse)

        # Saved states are (time, trajectory, coordinate) in an ensemble: one trajectory each.
        t_failed = (out.solver_state[1] if stops_rows
                    else jnp.full(q0.shape[:1], jnp.inf, t1.dtype))
        sol, initial = jax.vmap(trajectory, in_axes=(0, 0, 1, 0))(q0, v0, out.ys, t_failed)
    if traced:
        sol = _check_traced(sol, system, formulation, times,
                            (checked_q0, checked_v0, *initial), checks, ensemble)
    return sol


def _check_traced(sol, system, formulation, times: _Times, initial,
                  checks: _TracedChecks, ensemble: bool):
    """`sol` with the checks of a traced call attached as one branched error: the
    gains' (`checks.gain_flags`), those of `check_initial_state`
    (`checks.check_state`) on `initial = (q0, v0, mass matrix, forces)` and of the times,
    then (`checks.throw`) the failure of the solve.

    One `error_if` for all, each being a `lax.cond` with host callbacks. The initial
    state's checks run after the solve, on the mass matrix and forces that `_solution`
    evaluated at the initial state: evaluated before it, on their own, they would be a
    second copy of the equations of motion in the compiled program, which XLA neither shares
    nor prunes (`experiments/bench_compile.py` counts the program's instructions). A solve
    from a bad state thus runs before the input's error is raised."""
    # The checks carry no gradient: their inputs are detached, so they are not linearized.
    system, formulation, times, initial, checks = _detached(
        (system, formulation, times, initial, checks))
    t0, t1, ts = times.t0, times.t1, times.ts
    q0, v0, mass, forces = initial
    check_state, throw = checks.check_state, checks.throw
    flags, messages = list(checks.gain_flags), checks.gain_messages
    rows_invalid = False
    if check_state:
        def problems(q0, v0, mass, forces):
            return initial_state_problems(system, formulation, (t0, q0, v0), (mass, forces),
                                          sol.psi.shape[-1], "rows" if ensemble and throw
                                          else None)

        if ensemble and throw:
            problems = jax.vmap(problems, axis_name="rows", out_axes=(None, 0))
        elif ensemble:  # each row's own flags, for its own result
            problems = jax.vmap(problems, out_axes=(0, 0))
        state_flags, _ = problems(q0, v0, mass, forces)
        if ensemble and not throw:
            rows_invalid = jnp.any(state_flags, axis=1)
        else:
            flags += list(state_flags)
            messages += _INITIAL_STATE_MESSAGES + tuple(m for m, _ in formulation.state_messages)
    flags += [~(t1 > t0) | ~jnp.isfinite(t1 - t0),
              False if ts is None else (jnp.any(jnp.diff(ts) < 0) | (ts[0] < t0)
                                        | (ts[-1] > t1) | ~jnp.all(jnp.isfinite(ts)))]
    messages += ("`t0` and `t1` must be finite, with `t1` greater than `t0`.",
                 "`ts` must be finite, sorted and lie in [t0, t1].")
    flags = jnp.stack(flags)
    wrong, index = jnp.any(flags), jnp.argmax(flags)
    if not throw:
        return invalid_as_result(sol, wrong | rows_invalid)
    result = _first_failure(sol.result) if ensemble else sol.result
    index = jnp.where(wrong, index, len(messages) + result._value)
    wrong = wrong | (result != RESULTS.successful)
    messages = messages + tuple(m + _TRACED_HINT for m in RESULTS._index_to_message)
    # Under `vmap` equinox reports the largest index of the batch: 0 where nothing is wrong.
    index = jnp.where(wrong, index, 0)
    return attach_check(sol, lambda x: eqx.branched_error_if(x + reported_failure(sol), wrong,
                                                             index, messages))


# Where a traced solve failed, its time and state are not in the message (it is fixed when
# the program is compiled); this says where to find them (`reported_failure`).
_TRACED_HINT = (" (Traced: where the solve stopped is written to standard error just before "
                "this error; with `throw=False`, read `sol.result`, `sol.t_final` and "
                "`sol.q_final`.)")


def invalid_as_result(sol, invalid):
    """`throw=False` with traced input: where `invalid` (a flag, or one per row of an
    ensemble), the solution's result is `RESULTS.invalid_input` and its floating fields
    are nan, instead of an error that would end a whole batch for one member."""
    invalid = jnp.asarray(invalid)
    result = sol.result
    result = eqx.tree_at(lambda r: r._value, result, jnp.where(
        invalid, RESULTS.invalid_input._value, result._value).astype(result._value.dtype))

    def blank(x):
        if not eqx.is_inexact_array(x):
            return x
        return jnp.where(invalid.reshape(invalid.shape + (1,) * (x.ndim - invalid.ndim)),
                         jnp.nan, x)

    sol = eqx.tree_at(lambda s: s.result, sol, result)
    return eqx.tree_at(lambda s: [getattr(s, f) for f in _FLOAT_FIELDS], sol,
                       [blank(getattr(sol, f)) for f in _FLOAT_FIELDS])


_FLOAT_FIELDS = ("ts", "q", "v", "phi", "dphi", "psi", "multipliers", "energy", "t_final",
                 "q_final", "v_final", "p", "p_final")


def attach_check(sol, check):
    """`sol` with `check(x)` (an `error_if` returning `x`) applied to a zero that every
    floating field then depends on (adding it). Through the whole solution, the check's
    `lax.cond` (whose callback runs on one device) made XLA gather a sharded ensemble's
    solution onto one device and partition it again."""
    checked = check(jnp.zeros((), sol.t_final.dtype))
    return jax.tree.map(lambda x: x + checked.astype(x.dtype) if eqx.is_inexact_array(x) else x,
                        sol)


def _cut_at(ts, ts_saved, ys, t_failed):
    """One ensemble trajectory's saved times and states as a solve stopped at `t_failed`
    (`inf`: not stopped) would have saved them: `inf` after it, the end time `t_failed`."""
    if ts is None:  # [t0, t_end]; the state saved at the end is the stopped state
        return ts_saved.at[1].min(t_failed), ys
    (ts_requested, ts_end), ((q, v), final) = ts_saved, ys
    late = ts_requested > t_failed
    q, v = (jnp.where(late[:, None], jnp.inf, x) for x in (q, v))
    return (jnp.where(late, jnp.inf, ts_requested), jnp.minimum(ts_end, t_failed)), (
        (q, v), final)


def step_options(stepsize_controller, dt0, rtol, atol, dtype, norm=optx.rms_norm):
    """The step-size controller (default: `diffrax.PIDController(rtol, atol, norm)`) and
    `dt0`, with the numbers as arrays of `dtype`. Python floats would be static arguments of
    the compiled solve: a sweep over `τ = dt0` or over tolerances would compile at every
    value (≈ 2.5 s each for the pendulum)."""
    if stepsize_controller is None:
        if is_concrete(rtol, atol) and not (
            np.all(np.isfinite([rtol, atol])) and min(rtol, atol) >= 0 and rtol + atol > 0
        ):
            raise ValueError(
                f"`rtol` and `atol` must be finite and non-negative, not both zero; got "
                f"rtol = {rtol}, atol = {atol}."
            )
        stepsize_controller = diffrax.PIDController(
            rtol=jnp.asarray(rtol, dtype), atol=jnp.asarray(atol, dtype), norm=norm)
    if dt0 is None:
        return stepsize_controller, None
    dt0 = jnp.asarray(dt0, dtype)
    check_positive("dt0", dt0, "step")
    return stepsize_controller, dt0


def save_at(t0, t1, ts, stepsize_controller) -> diffrax.SaveAt:
    """What `simulate` and `simulate_actuated` ask diffrax to save: `t0` and `t1` without
    `ts`; else `ts` (read back with `saved_times`) and `t1`.

    Without `ts` the states at t0 and t1 are saved directly: an interpolated
    `SubSaveAt(ts=[t0, t1])` would cost a search of the save times at every step (≈2 µs/step
    on the CPU, ~10% of a two-link trajectory) for the same values.

    With `ts` and fixed steps, each save time is moved 8 ulps (of max(|t0|, |ts[i]|))
    earlier. diffrax saves `ts[i]` in the step whose end reaches it, and
    `RecursiveCheckpointAdjoint` recomputes the steps in its reverse pass. When `ts[i]` lies
    within rounding of a step's end (fixed steps on the save grid, e.g.
    `ts = linspace(0, 1.5, 31)` with `dt0 = 0.01`), the recomputation can round that end the
    other way (`t0 + (t1 − t0)·k/N` compiled with and without a fused multiply-add: at most
    2 ulps apart) and save `ts[i]` in the neighbouring step; that row's cotangent is then
    counted twice or lost, a gradient off by percents with no error. Moved earlier, every
    save time lies inside one step. Adaptive steps end on a save time only by chance, so
    their save times are not moved.
    """
    if ts is None:
        return diffrax.SaveAt(t0=True, t1=True)
    if isinstance(stepsize_controller, diffrax.ConstantStepSize):
        ulps = 8 * jnp.finfo(ts.dtype).eps * jnp.maximum(jnp.abs(ts), jnp.abs(t0))
        ts = jnp.maximum(ts - ulps, t0)
    return diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)])


def saved_times(ts, saved):
    """The requested `ts` where diffrax saved (it saved slightly earlier, see `save_at`),
    `inf` where the solve did not reach."""
    return jnp.where(jnp.isfinite(saved), ts, jnp.inf)


def saved_rows(ts, saved, reached):
    """What a solve with `save_at(t0, t1, ts, ...)` saved, as a solution reports it:
    `(ts_out, ys, (t_final, y_final))`, the save times (`inf` where the solve did not
    reach: without `ts`, the second row where it did not reach `t1`), the states saved
    there (those rows `inf` too) and where the solve ended. `saved = (ts, ys)` as diffrax
    returns them; `reached`: the solve reached `t1`."""
    ts_saved, ys = saved
    if ts is None:
        final = (ts_saved[1], jax.tree.map(lambda x: x[1], ys))
        # As for `SubSaveAt(ts=...)`: a save time the solve did not reach is inf.
        ts_out, ys = jax.tree.map(lambda x: x.at[1].set(jnp.where(reached, x[1], jnp.inf)),
                                  (ts_saved, ys))
        return ts_out, ys, final
    (ts_out, ts_final), (ys, y_final) = ts_saved, ys
    return saved_times(ts, ts_out), ys, (ts_final[0], jax.tree.map(lambda x: x[0], y_final))


def at_valid(valid, rows, start):
    """`rows` (leading axis: the saved times) where `valid`, else the start state: the
    diagnostics are evaluated at a safe state where nothing was saved (`inf`), then
    `masked` (no nan gradients)."""
    return jax.tree.map(lambda x, x0: jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)),
                                                x, x0), rows, start)


def masked(valid, x):
    """`x` (leading axis: the saved times) where `valid`, else `inf`."""
    return jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.inf)


def _solution(system, formulation, start, ts, saved, outcome, reverse: bool = False
              ) -> tuple[Solution, tuple[Array, Array]]:
    """One trajectory's [`jaxdae.Solution`][] from its `start = (t0, q0, v0)`, the times
    and states diffrax `saved` and the solve's `outcome = (reached, result, stats)`, and the
    mass matrix and forces at the initial state (for `_check_traced`). `reverse`: the solve
    is differentiable in reverse mode only, and so are the diagnostics
    (`_reverse_diagnostics`).

    The diagnostics are evaluated once per row: the initial state, the saved states and
    the final state (without `ts` the second row is the final state), and the final row
    also gives `v_final`, `p_final` and the inputs of `checked_result`, so that the
    compiled program holds the equations of motion once for all of them."""
    (t0, q0, v0), (reached, result, stats) = start, outcome
    ts_out, (q, v), (t_final, (q_final, v_final)) = saved_rows(ts, saved, reached)
    diagnostics = (lambda *state: _reverse_diagnostics(state)) if reverse else _diagnostics

    # Rows after a failure are inf, and a final state may be: evaluate at a safe state (the
    # initial one), then mask (no nan gradients).
    valid = jnp.isfinite(ts_out)
    final_finite = _all_finite(t_final, q_final, v_final)
    final = tuple(jnp.where(final_finite, x, x0) for x, x0 in zip((t_final, q_final, v_final),
                                                                  (t0, q0, v0), strict=False))
    if ts is None:
        # Two rows, one call each: the second reuses the first's trace, where `vmap` would
        # batch the equations' scalar graph, equation by equation, at trace time (a third
        # less trace time for the two-link diagnostics, `bench_compile.py --stages`).
        per_row = [diagnostics(system, formulation, *row) for row in ((t0, q0, v0), final)]
        *diagnostics, mass, forces, range_inputs = jax.tree.map(
            lambda *x: jnp.stack(x), *per_row)
        outputs = diagnostics
    else:  # the initial state first, the final state last
        rows = at_valid(valid, (ts_out, q, v), (t0, q0, v0))
        rows = tuple(jnp.concatenate([x0[None], row, x[None]])
                     for x0, row, x in zip((t0, q0, v0), rows, final, strict=False))
        *diagnostics, mass, forces, range_inputs = jax.vmap(
            diagnostics, in_axes=(None, None, 0, 0, 0))(system, formulation, *rows)
        outputs = [x[1:-1] for x in diagnostics]
    phi, dphi, psi, multipliers, energy, v, p = outputs
    # Row 0 is the initial state and the last row the final one, with or without `ts`.
    initial_residual, final_residual = (
        jnp.max(jnp.abs(jnp.concatenate([diagnostics[0][i], diagnostics[2][i]])), initial=0.0)
        for i in (0, -1))
    result = checked_result(initial_residual,
                            jnp.where(final_finite, final_residual, jnp.inf),
                            jax.tree.map(lambda x: x[-1], range_inputs), result)
    mask = functools.partial(masked, valid)
    sol = Solution(
        ts=ts_out,
        q=q,
        v=mask(v),
        phi=mask(phi),
        dphi=mask(dphi),
        psi=mask(psi),
        multipliers=mask(multipliers),
        energy=mask(energy),
        t_final=t_final,
        q_final=q_final,
        v_final=jnp.where(final_finite, diagnostics[5][-1], v_final),
        result=result,
        stats=stats,
        p=mask(p),
        p_final=jnp.where(final_finite, diagnostics[6][-1], jnp.nan),
    )
    return sol, (mass[0], forces[0])
