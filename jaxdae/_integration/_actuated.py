"""Constraint-enforcing control through actuator dynamics (Mukharlyamov (2019), §§2–5).

A mechanism `q̇ = v`, `v̇ = a(t, q, v, w)` is driven by actuators with their own state `w`,
`ẇ = b(t, q, v, w) + B(t, q, v, w) u` (Mukharlyamov (2019), eq. [2.1]). The goal of the control `u`
is a set of *program constraints* `f(t, q, v) = 0` (eqs. [2.3]–[2.4]). `u` reaches `f` only through
the actuators, so it first appears in the derivative of order `ρ` (the relative degree) of
`f` along the motion: `f⁽ᵖ⁾ = L_X^ρ f + g u` with the decoupling matrix
`g = ∂(f⁽ᵖ⁻¹⁾)/∂w · B` (eqs. [2.8]–[2.9]; for the adaptive-optics element of §5, `ρ = 4` and
`g = 2 c s(t) sin φ k_a/(L m l²)`, eq. [5.6]).

[`jaxdae.ConstraintEnforcingControl`][] chooses `u` so that the perturbations
`y = (f, ḟ, …, f⁽ᵖ⁻¹⁾)` obey the linear equation `f⁽ᵖ⁾ + K_{ρ−1} f⁽ᵖ⁻¹⁾ + … + K_0 f = 0`
(eqs. [3.4]–[3.5], [3.12], [5.8]), i.e. `ẏ = H y` with `H` in companion form: the
minimum-norm solution `u = gᵀ(g gᵀ)⁻¹(−Σ K_j f⁽ʲ⁾ − L_X^ρ f)` of eq. [2.11] (`g⁻¹` when `g`
is square). All derivatives are Lie derivatives computed by automatic differentiation
(nested `jax.jvp` along the drift): the user writes `f`, the mechanism's energies and the
actuator equations, never `f⁽ᵏ⁾` or `g` by hand. With all gains zero this is the
unstabilized law of eq. [2.9], for which the constraints are only first integrals.
"""

from typing import Unpack

import diffrax
import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

from .._checks import check_finite, check_instance
from .._compilation._constants import jit_unless_staged
from .._compilation._linalg import (
    extreme_eigenvalues,
    full_precision,
    reciprocal_condition,
)
from .._compilation._scalarize import scalarize
from .._compilation._sharding import in_current_mesh
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._formulations._constraint_enforcing import ConstraintEnforcingControl
from .._formulations._multipliers import default_rcond
from .._gains import (
    is_concrete,
)
from .._solution import RESULTS, AbstractSolution
from .._systems._actuated import ActuatedSystem, constraint_groups, lie_derivatives
from .._systems._system import cast_floating
from ._diagnostics import all_finite, at_valid, masked, saved_rows
from ._outcome import name_result, raise_failure, residual_limit, solve_traced_inputs
from ._problem import SolveCall, SolveKeywords
from ._simulate import compiled_times, forward_mode_hint
from ._solve import integrate
from ._term import AbstractTimeTerm, Dynamics
from ._trajectories import SingleTrajectory


def initial_actuated_state(q0, v0, w0):
    """`(q0, v0, w0)` as 1-D floating arrays of one dtype, `q0` and `v0` of one shape;
    concrete values must be finite."""
    q0, v0, w0 = (
        SingleTrajectory().state_array(name, value)
        for name, value in (("q0", q0), ("v0", v0), ("w0", w0))
    )
    if q0.shape != v0.shape:
        raise ValueError(
            f"`q0` and `v0` must have the same shape (n,); got {q0.shape} and {v0.shape}."
        )
    for name, value in (("q0", q0), ("v0", v0), ("w0", w0)):
        check_finite(name, value)
    dtype = jnp.result_type(q0, v0, w0)
    return q0.astype(dtype), v0.astype(dtype), w0.astype(dtype)


class ActuatedSolution(AbstractSolution):
    """The result of [`jaxdae.simulate_actuated`][]. Rows after a failure are `inf`.

    **Fields:**

    - `ts`: saved times, shape `(N,)`.
    - `q`, `v`, `w`: coordinates, velocities and actuator states, shapes `(N, n)`, `(N, n)`,
        `(N, k)`.
    - `u`: the input, shape `(N, s)`.
    - `residuals`: the perturbations `(f, ḟ, …, f⁽ᵖ⁻¹⁾)` of the program constraints,
        shape `(N, ρ, r)`; a tuple of those, one per group, for grouped constraints.
    - `t_final`, `q_final`, `v_final`, `w_final`: where the solve ended.
    - `result`: a [`jaxdae.RESULTS`][] item; `stats`: diffrax's step statistics.
    """

    w: Float[Array, "N k"]
    u: Float[Array, "N s"]
    # (A group's order and size are its own: `_` leaves them unbound across the tuple.)
    residuals: Float[Array, "N order r"] | tuple[Float[Array, "N _ _"], ...]
    w_final: Float[Array, " k"]


def _closed_loop(system, control, t, q, v, w):
    u, _ = control.outputs(system, t, q, v, w)
    _, acceleration, drift = system.drift(t, (q, v, w))
    return v, acceleration, drift + system.input_matrix(t, q, v, w) @ u


# As for `simulate`: traced once, re-traced as scalar graphs for small systems.
_rates = eqx.filter_jit(scalarize(_closed_loop))
_outputs = eqx.filter_jit(
    scalarize(lambda system, control, t, q, v, w: control.outputs(system, t, q, v, w))
)


class ActuatedTerm(AbstractTimeTerm):
    """The ODE of an actuated system under its control, as a diffrax term: the rates of
    the state `(q, v, w)`, and the largest eigenvalue of `g gᵀ` at the initial state, the
    scale of the test for a singular decoupling matrix (`_singular`)."""

    system: ActuatedSystem
    control: ConstraintEnforcingControl
    initial_largest: Array

    def vf(self, t, y, args):
        del args
        return _rates(self.system, self.control, t, *y)


def _decoupling_eigenvalues(system, control, t, q, v, w):
    """The smallest and largest eigenvalue of `g gᵀ`."""
    orders = tuple(len(group) for group in control.groups)
    input_gains = lie_derivatives(system, max(orders), t, (q, v, w))[2]
    g = jnp.concatenate([input_gains[order - 1][i] for i, order in enumerate(orders)])
    return extreme_eigenvalues(g @ g.T)


_eigenvalues = eqx.filter_jit(scalarize(_decoupling_eigenvalues))


def _singular(t, x, args, *, terms, **kwargs):
    """`g gᵀ` lost rank: its smallest eigenvalue fell below `rcond` times its largest at
    the initial state (a relative test also for one constraint, where `g gᵀ` is 1 × 1)."""
    del args, kwargs
    term = _actuated_term(terms)
    smallest, _ = _eigenvalues(term.system, term.control, t, *x)
    return smallest < default_rcond(term.control.rcond, smallest.dtype) * term.initial_largest


def _actuated_term(terms) -> ActuatedTerm:
    """The `ActuatedTerm` inside the `terms` of a solve (as diffrax wrapped them)."""
    is_actuated = lambda x: isinstance(x, ActuatedTerm)  # noqa: E731
    [term] = [x for x in jax.tree.leaves(terms, is_leaf=is_actuated) if is_actuated(x)]
    return term


@eqx.filter_jit
def _input_reach(system, control, t, q, v, w):
    """For `k < ρ`: the largest entry of `∂f⁽ᵏ⁾/∂w · B` (zero below the relative degree) and
    of `f⁽ᵏ⁺¹⁾` (for scale); the reciprocal condition of `g gᵀ`."""
    orders = tuple(len(group) for group in control.groups)
    _, rates, input_gains = lie_derivatives(system, max(orders), t, (q, v, w))
    # (derivative, group) tables
    reach = jnp.stack([jnp.stack([jnp.max(jnp.abs(g)) for g in row]) for row in input_gains])
    scale = jnp.stack([jnp.stack([jnp.max(jnp.abs(f)) for f in row]) for row in rates])
    g = jnp.concatenate([input_gains[order - 1][i] for i, order in enumerate(orders)])
    return reach, scale, reciprocal_condition(g @ g.T)


def check_actuated_system(system, control, t0, q0, v0, w0):
    """Structure and, for concrete values, the relative degree at the initial state; returns
    the control with its traced gains checked (`ConstraintEnforcingControl.validate`)."""
    check_instance("system", system, ActuatedSystem, "a `jaxdae.ActuatedSystem`")
    check_instance(
        "control", control, ConstraintEnforcingControl, "a `jaxdae.ConstraintEnforcingControl`"
    )
    terms = jax.eval_shape(system.mechanism.terms, t0, q0, v0)
    if terms.phi.shape[0] or terms.psi.shape[0]:
        raise ValueError(
            "The `mechanism` of an `ActuatedSystem` must have no constraints of its own (its "
            "`constraints`/`velocity_constraints` give shapes "
            f"{terms.phi.shape}/{terms.psi.shape}); state the goals of the control as "
            "`program_constraints`."
        )
    gaps = jax.eval_shape(system.mechanism.gaps, t0, q0).shape
    if gaps != (0,):
        raise ValueError(
            f"The `mechanism` of an `ActuatedSystem` has one-sided constraints (`gaps` of "
            f"shape {gaps}), which `simulate_actuated` does not treat: simulate the "
            "mechanism with a controller through `jaxdae.simulate`, which handles them by "
            "events, or leave them out."
        )
    forces = jax.eval_shape(system.actuator_forces, t0, q0, v0, w0).shape
    if forces != q0.shape:
        raise ValueError(
            f"`actuator_forces` must return shape {q0.shape}, one force per "
            f"coordinate; got {forces}."
        )
    drift = jax.eval_shape(system.actuator_drift, t0, q0, v0, w0).shape
    if drift != w0.shape:
        raise ValueError(
            f"`w0` has shape {w0.shape} but `actuator_drift` returns shape {drift}: `w0` "
            "must hold one value per actuator state."
        )
    inputs = jax.eval_shape(system.input_matrix, t0, q0, v0, w0).shape
    if len(inputs) != 2 or inputs[0] != w0.shape[0]:
        raise ValueError(
            f"`input_matrix` must return shape (k, s) = ({w0.shape[0]}, s); got {inputs}."
        )
    shapes = [g.shape for g in jax.eval_shape(constraint_groups, system, t0, (q0, v0, w0))]
    if any(len(shape) != 1 or shape[0] == 0 for shape in shapes):
        raise ValueError(
            "`program_constraints` must return an array of shape (r,), r ≥ 1, or "
            f"a tuple of such groups; got shapes {shapes}."
        )
    if len(shapes) != len(control.groups) or (len(shapes) > 1 and not control.grouped):
        raise ValueError(
            f"`program_constraints` returns {len(shapes)} group(s) but the control has "
            f"{len(control.groups)} gain sequence(s): pass one sequence `(K_0, …, K_{{ρ−1}})` "
            "per group (groups may differ in relative degree, e.g. holonomic and velocity "
            "goals, Mukharlyamov (2019) eqs. [2.3]–[2.4])."
        )
    sizes = [shape[0] for shape in shapes]
    if sum(sizes) > inputs[1]:
        raise ValueError(
            f"{sum(sizes)} program constraints need at least as many inputs; `input_matrix` "
            f"has {inputs[1]} columns (Mukharlyamov (2019) requires the rows of g = ψ_w B to be "
            "linearly independent, eq. [2.9])."
        )
    control = control.validate(sizes if control.grouped else sizes[0])
    if not is_concrete(system, control, t0, q0, v0, w0):
        return control
    reach, scale, rcond = (np.asarray(a) for a in _input_reach(system, control, t0, q0, v0, w0))
    for i, group in enumerate(control.groups):
        which = f" (group {i})" if control.grouped else ""
        for k in range(len(group) - 1):
            if reach[k, i] > 1e-8 * (1.0 + scale[k, i]):
                raise ValueError(
                    f"The input first appears in derivative {k + 1} of "
                    f"`program_constraints`{which}, so their relative degree is {k + 1}, but "
                    f"the gains have {len(group)} entries: pass {k + 1} gains (e.g. "
                    f"`ConstraintEnforcingControl.with_poles(rate, order={k + 1})`)."
                )
    if not float(rcond) >= default_rcond(control.rcond, q0.dtype):
        raise ValueError(
            f"The decoupling matrix g = ∂f⁽ᵖ⁻¹⁾/∂w · B is singular at the initial state "
            f"(reciprocal condition of g gᵀ: {float(rcond):.3g}), so the input cannot "
            f"enforce the program constraints there: either a relative degree is larger "
            f"than {control.order} (the input does not appear in that derivative), or the "
            "initial state is a singular configuration (Mukharlyamov (2019) §5: s(t) = 0 or "
            "sin φ = 0)."
        )
    return control


@full_precision
@in_current_mesh
def simulate_actuated(
    system: ActuatedSystem,
    control: ConstraintEnforcingControl,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    w0: Float[ArrayLike, " k"],
    **options: Unpack[SolveKeywords],
) -> ActuatedSolution:
    """Simulates an actuated system under constraint-enforcing control (Mukharlyamov (2019), eq.
    [2.12] with the stabilized input of [3.4]–[3.5]), with diffrax.

    Works under `jax.jit`, `jax.vmap` and `jax.grad` (w.r.t. the gains, the system's
    parameters and the initial state).

    **Arguments:**

    - `system`: a [`jaxdae.ActuatedSystem`][].
    - `control`: a [`jaxdae.ConstraintEnforcingControl`][]; its number of gains must be the
        relative degree of `system.program_constraints`.
    - `t0`, `t1`: start and end time, `t1 > t0`. Python numbers are compiled into the
        solve, as `diffrax.diffeqsolve` compiles its own: each value compiles a new
        program. Pass arrays (`jnp.asarray(t1)`) where they change between calls: one
        program then serves all their values.
    - `q0`, `v0`, `w0`: initial coordinates, velocities and actuator state. They need not
        satisfy the program constraints: the control pulls the motion back.
    - `ts`, `solver`, `stepsize_controller`, `dt0`, `rtol`, `atol`, `max_steps`, `adjoint`,
        `throw`, `constraint_tol`: as for [`jaxdae.simulate`][] (the residual is that of
        the program constraints `f`). For a fixed-step method pass e.g.
        `solver=diffrax.Euler(), stepsize_controller=diffrax.ConstantStepSize(), dt0=τ`.
        The default adjoint for explicit Runge–Kutta solvers, [`jaxdae.ReverseSweepAdjoint`][],
        gives `diffrax.RecursiveCheckpointAdjoint`'s gradient to rounding, faster and with a
        shorter compile ([benchmarks](../benchmarks.md)).

    **Returns:**

    An [`jaxdae.ActuatedSolution`][].

    **Raises:**

    `ValueError` for bad input (shapes, non-finite values, a mechanism with constraints of
    its own, a number of gains that is not the relative degree, a singular decoupling
    matrix at the initial state, non-finite times, `t1 <= t0`, unsorted `ts`, negative or
    zero tolerances); [`jaxdae.SimulationError`][] with `throw=True` when the solve fails
    (e.g. `g gᵀ` becomes singular on the way); `TypeError` for a keyword argument not
    listed above.
    """
    call = SolveCall.of("simulate_actuated", options)
    q0, v0, w0 = initial_actuated_state(q0, v0, w0)
    dtype = q0.dtype
    times = call.times(t0, t1, dtype)
    call.check_options()
    # The state's dtype sets the precision: float32 states give a float32 simulation.
    system, control = cast_floating((system, control), dtype)
    control = check_actuated_system(system, control, times.t0, q0, v0, w0)
    solve_options = call.options(dtype, times)
    with forward_mode_hint():
        sol = solve_traced_inputs(
            lambda times_, options_: _simulate_actuated(
                system, control, times_, (q0, v0, w0), options_
            ),
            times,
            solve_options,
            call.throw,
        )
    return raise_failure(sol) if call.throw else sol


@jit_unless_staged
def _simulate_actuated(system, control, times, y0, options) -> ActuatedSolution:
    """The solve (`integrate`) and its `ActuatedSolution`."""
    times = compiled_times(times)
    t0 = times.t0
    # The scale of `_singular`'s test: a constant of the gradient, as the event is.
    initial_largest = jax.lax.stop_gradient(_eigenvalues(system, control, t0, *y0)[1])
    dynamics = Dynamics(
        ActuatedTerm(system, control, initial_largest),
        (_singular,),
        (RESULTS.singular_decoupling_matrix,),
    )
    out, result = integrate(dynamics, y0, times, options)
    result = name_result(options.solver, result)
    ts_out, ys, (t_final, y_final) = saved_rows(
        times.ts, (out.ts, out.ys), out.result == diffrax.RESULTS.successful
    )
    # Rows the solve did not reach are inf: evaluate at the initial state, then mask. The
    # initial and final states come first and last, for the residual check.
    valid = jnp.isfinite(ts_out)
    final_finite = all_finite(t_final, *y_final)
    final = tuple(
        jnp.where(final_finite, x, x0) for x, x0 in zip((t_final, *y_final), (t0, *y0), strict=True)
    )
    rows = tuple(
        jnp.concatenate([x0[None], row, x[None]])
        for x0, row, x in zip(
            (t0, *y0), at_valid(valid, (ts_out, *ys), (t0, *y0)), final, strict=True
        )
    )
    u, residuals = jax.vmap(_outputs, in_axes=(None, None, 0, 0, 0, 0))(system, control, *rows)
    result = _checked_result(residuals, final_finite, result, residual_limit(options, *y0[:2]))
    (q, v, w), (q_final, v_final, w_final) = ys, y_final
    return ActuatedSolution(
        ts=ts_out,
        q=q,
        v=v,
        w=w,
        u=masked(valid, u[1:-1]),
        residuals=jax.tree.map(lambda x: masked(valid, x[1:-1]), residuals),
        t_final=t_final,
        q_final=q_final,
        v_final=v_final,
        w_final=w_final,
        result=result,
        stats=out.stats,
    )


def _checked_result(residuals, final_finite, result, limit) -> RESULTS:
    """`result`, or `RESULTS.constraint_tol_exceeded` where a solve that reached `t1` ends
    with its program constraints `f` beyond the residual its tolerances allow (`limit`, as
    `simulate`'s check) and beyond `f` and `ḟ` at the start.
    `residuals`: the perturbations at the initial state, the saved ones and the final
    state."""
    residuals = jax.lax.stop_gradient(jax.tree.leaves(residuals))
    initial = jnp.max(jnp.concatenate([jnp.abs(r[0, :2]).ravel() for r in residuals]), initial=0.0)
    final = jnp.max(jnp.concatenate([jnp.abs(r[-1, 0]).ravel() for r in residuals]), initial=0.0)
    final = jnp.where(final_finite, final, jnp.inf)
    exceeded = (result == RESULTS.successful) & (final > jnp.maximum(limit[0], initial))
    return RESULTS.where(exceeded, RESULTS.constraint_tol_exceeded, result)
