"""What a solve reports besides the trajectory: residuals, multipliers, energy and momenta
at the saved times, and the assembly of the [`jaxdae.Solution`][]; the end-of-solve
checks of the residual and of the target's range (`checked_result`); and the probe of the
model's terms after a stalled solve (`non_finite_term`, which the outcome's report calls).
(The conditions that stop a solve and the results they name are the solve's, `_solve.py`;
solvers name their own failures: `AbstractFailureNamingSolver`.)"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._constants import jit_with_constants
from .._compilation._linalg import full_precision, gram_eigenvalues, psd_pseudo_solve
from .._compilation._private_apis import unvmap_any
from .._custom_types import Array, Bool, Float
from .._formulations import AbstractStabilizedFormulation
from .._solution import RESULTS, Solution
from ._sweep_forward import is_none, nones, typed_literal_as_array
from ._validation import factored_positive_definite, mass_positive_definite
from ._vector_fields import (
    constraint_residuals,
    formulation_velocities,
    jitted_rates,
    system_terms,
    terms_outside_steps,
)

# The terms that `non_finite_term` tests, in its order: a mass matrix that is not
# positive definite makes a tree's forces nan (`factored_positive_definite`), so it comes
# before them.
NON_FINITE_RESULTS = (
    RESULTS.non_finite_mass_matrix,
    RESULTS.indefinite_mass_matrix,
    RESULTS.non_finite_forces,
    RESULTS.non_finite_constraints,
    RESULTS.non_finite_rates,
)


def all_finite(*arrays) -> Array:
    """Whether every entry of `arrays` is finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in arrays]))


@jit_with_constants
def non_finite_term(system, formulation, t0, t, q, s):
    """Which term of the model is non-finite, or a mass matrix not positive definite, at or
    just after the state `(t, q, s)` where a solve stalled: `1 + i` for
    `NON_FINITE_RESULTS[i]` (mass matrix non-finite, then not positive definite, forces,
    constraints, rates), 0 if none is. Probed at the state and at four points along its
    rates, 4, 64, 1024 and 16384 rounding units of `t` ahead (the steps the controller
    rejected ended there)."""
    rates = jitted_rates(system, formulation, t, q, s)
    rates = jax.tree.map(lambda r: jnp.where(jnp.isfinite(r), r, 0), rates)
    unit = jnp.finfo(jnp.result_type(t)).eps * jnp.maximum(
        jnp.maximum(jnp.abs(t), jnp.abs(t0)), 1e-300
    )

    def code(offset):
        tp, qp, sp = t + offset, q + offset * rates[0], s + offset * rates[1]
        velocities = formulation.velocities(system, tp, qp, sp)
        terms = system_terms(system, tp, qp, velocities)
        definite = factored_positive_definite(terms)
        non_finite_mass = ~all_finite(terms.mass_matrix)
        if definite is not None:
            # A tree makes `M` nan where its factor shows it not positive definite
            # (`TreeMechanism.terms`): named as not positive definite.
            non_finite_mass = non_finite_mass & definite
        flags = jnp.stack(
            [
                non_finite_mass,
                ~mass_positive_definite(system, (tp, qp, velocities), terms.mass_matrix, definite),
                ~all_finite(terms.forces),
                ~all_finite(terms.phi, terms.dphi, terms.psi, terms.jacobian, terms.bias),
                ~all_finite(*jitted_rates(system, formulation, tp, qp, sp)),
            ]
        )
        return jnp.where(jnp.any(flags), jnp.argmax(flags) + 1, 0).astype(jnp.int32)

    codes = jax.lax.map(code, unit * jnp.array([0.0, 4.0, 64.0, 1024.0, 16384.0]))
    return codes[jnp.argmax(codes != 0)]


# How far beyond the step's error tolerance a stabilized solve's constraint residual may end:
# the residual is a sum of local errors that the stabilization damps, so it sits at a few
# tolerances (docs/design_measurements.md#residual-tolerance).
RESIDUAL_TOLERANCE_FACTOR = 1000.0
# Fixed steps have no tolerance: the residual, relative to the state's size, that a solve
# on them may end with (a thousandth: the step is too coarse for the motion beyond it).
FIXED_STEP_RESIDUAL = 1e-3


def tests_target_range(system, formulation, terms) -> bool:
    """Whether `checked_result` tests the range of the formulation's target `s`: a
    stabilized formulation that asks for the test, on a system with constraints that its
    terms take from `constraints` and `velocity_constraints` (`terms_from_constraints`),
    the functions that `constraints_not_met` tells the user to fix."""
    return (
        isinstance(formulation, AbstractStabilizedFormulation)
        and formulation.tests_target_range
        and system.terms_from_constraints
        and terms.jacobian.shape[0] > 0
    )


def checked_result(
    initial_residual, residual, range_inputs, result: RESULTS, limit=None
) -> RESULTS:
    """`result` after the checks at the end of a solve (docs/failures.md), from the
    constraint residual `max(|Φ|, |Ψ|)` at the start (`initial_residual`) and at the end
    (`residual`, `inf` where the final state is not finite):

    - a solve that reached `t1` `diverged` if its constraint residual at the end exceeds
        `10⁶ max(r₀, 1)` (`r₀` the residual at `t0`) or is not finite;
    - else it exceeded its constraint tolerance (`constraint_tol_exceeded`) if the residual
        at the end exceeds `limit` (`assemble_solution`: what the tolerances and the
        formulation allow, or the violation at the start if larger; None: no such test);
    - else its constraints are not met (`constraints_not_met`) where more than a tenth of
        the stabilization's target lies outside the range of the constraint Jacobian
        (`max |s − G G⁺ s| > 0.1 max |s|`: no acceleration meets it, the constraints
        contradict each other) while the residual is above
        `max(10⁻⁶, 10⁴ ε) max(r₀, 1)`: `10⁻⁶` in float64, `1.2 · 10⁻³` in float32, where
        rounding alone leaves a chain of 64 links at `|Φ| ≈ 2 · 10⁻⁵`.

    `range_inputs`: `(G, s)` at the final state where `tests_target_range` asks for the test
    (`diagnostics` returns them with the final row), else None. For
    consistent constraints `s` lies in the range of `G` (independent rows: always;
    redundant ones: their targets agree), so the part outside it is zero up to rounding.
    `G⁺` drops singular values below `√ε σ_max`; the pseudo-inverse is computed in a
    `lax.cond` only where the residual exceeds its floor (in a `vmap` batch: in any of its
    trajectories): the common, met case skips it.

    All on values that carry no gradient. (Which term of a stalled solve was non-finite is
    found after the solve, eagerly: `name_non_finite_term`.)"""
    initial_residual, residual, range_inputs = jax.lax.stop_gradient(
        (initial_residual, residual, range_inputs)
    )
    scale = jnp.maximum(initial_residual, 1.0)
    floor = max(1e-6, 1e4 * float(jnp.finfo(residual.dtype).eps)) * scale
    ok = result == RESULTS.successful
    diverged = ok & ((residual > 1e6 * scale) | ~jnp.isfinite(residual))
    result = RESULTS.where(diverged, RESULTS.diverged, result)
    if limit is not None:
        exceeded = ok & ~diverged & (residual > limit)
        result = RESULTS.where(exceeded, RESULTS.constraint_tol_exceeded, result)
    if range_inputs is None:
        return result
    g, target = range_inputs
    zero = jnp.zeros((), residual.dtype)

    def gap(g, target):
        # G G⁺ s = A A⁺ s with A = G Gᵀ, whose eigenvalues are G's squared singular
        # values: `psd_pseudo_solve` drops those below `ε λ_max`, in closed form for up to
        # two constraints (an SVD is a LAPACK call, paid even in the branch not taken:
        # docs/design_measurements.md#range-test).
        gram = g @ g.T
        reachable = gram @ psd_pseudo_solve(gram, target, jnp.finfo(g.dtype).eps)
        return jnp.max(jnp.abs(target - reachable)), jnp.max(jnp.abs(target))

    # Taken for the whole batch where any trajectory needs it (the rows that do not are
    # masked below): under `vmap` a cond on each row's residual would run the SVD on every
    # row of every batch, whose batched SVD loops over the batch on a GPU
    # (docs/design_measurements.md#range-test).
    gap, size = jax.lax.cond(
        unvmap_any(residual > floor), gap, lambda g, target: (zero, zero), g, target
    )
    not_met = ok & ~diverged & (gap > 0.1 * size) & (residual > floor)
    # (Contradicting constraints are the more precise name where both apply.)
    return RESULTS.where(not_met, RESULTS.constraints_not_met, result)


@jit_with_constants
def state_diagnostics(system, formulation, t, q, s):
    """Constraint residuals, multipliers, energy, velocities and momenta at one saved state,
    the mass matrix there with whether its factor shows it positive definite
    (`factored_positive_definite`) and the forces, the formulation's `residual_allowance` and
    the inputs of `checked_result`'s range test (`(G, s)`, or None: `tests_target_range`).
    Differentiated by JAX, in forward and reverse mode, where the solve's adjoint works in
    both; by its vector–Jacobian product where the adjoint works in reverse mode only
    (`reverse_diagnostics`)."""
    s = formulation_velocities(system, formulation, t, q, s)
    terms = terms_outside_steps(system, t, q, s)
    _, multipliers = formulation.accelerations(terms)
    range_inputs = None
    if tests_target_range(system, formulation, terms):
        range_inputs = terms.jacobian, formulation.target(terms)
    return (
        terms.phi,
        terms.dphi,
        terms.psi,
        multipliers,
        system.energy(t, q, s) if terms.energy is None else terms.energy,
        system.velocities(t, q, s),
        saved_momenta(system, t, q, s, terms),
        terms.mass_matrix,
        factored_positive_definite(terms),
        terms.forces,
        jax.lax.stop_gradient(formulation.residual_allowance(terms)),
        jacobian_spectrum(terms.jacobian),
        range_inputs,
    )


def jacobian_spectrum(jacobian: Float[Array, "c n"]) -> Float[Array, " c"]:
    """The squared singular values of the constraint Jacobian `G`, ascending (no gradient);
    `nan` beyond `CONDITIONING_MAX` constraints."""
    jacobian = jax.lax.stop_gradient(jacobian)
    if jacobian.shape[0] > _thresholds.CONDITIONING_MAX:
        return jnp.full(jacobian.shape[:1], jnp.nan, jacobian.dtype)
    return gram_eigenvalues(jacobian)


def conditioning(spectra: Float[Array, "N c"]) -> Float[Array, " N"]:
    """`σ_r / max(σ_1, σ_1(t0))` of the constraint Jacobian at each row from its squared
    singular values `spectra` (rows as `jacobian_spectrum`), `r` its rank in the first row
    (singular values above `√ε σ_1`): 1 without constraints. Relative to the largest
    singular value at the start too, so that a single constraint whose gradient vanishes
    counts."""
    count = spectra.shape[1]
    if count == 0:
        return jnp.ones(spectra.shape[:1], spectra.dtype)
    first = spectra[0]
    rank = jnp.sum(first > jnp.finfo(spectra.dtype).eps * first[-1])
    largest = jnp.maximum(spectra[:, -1], first[-1])
    kept = spectra[:, count - jnp.maximum(rank, 1)]
    ratio = jnp.sqrt(jnp.maximum(kept, 0) / jnp.where(largest > 0, largest, 1.0))
    # (A spectrum that is not computed, `nan`, stays `nan`.)
    return jnp.where(largest > 0, ratio, jnp.where(jnp.isnan(largest), jnp.nan, 0.0))


@eqx.filter_custom_vjp
def reverse_diagnostics(state):
    """`state_diagnostics(*state)`, `state = (system, formulation, t, q, s)`, for solves whose
    adjoint works in reverse mode only (`reverse_only`): differentiated by its vector–Jacobian
    product, evaluated in the backward pass only where an output has a cotangent.

    JAX differentiates a function in reverse mode by linearizing it whole, so every output
    used or not: most losses read none of the diagnostics (a loss on `q_final`), and their
    linearization, which XLA removes again, lengthens the gradient's trace
    (docs/design_measurements.md#reverse-diagnostics). A loss on some of them pays instead
    for a second evaluation in the backward pass, linearized in the outputs it reads.
    (Not for forward mode, which a custom VJP refuses: `simulate` keeps `state_diagnostics` for
    adjoints such as `diffrax.ForwardMode()`.)"""
    return state_diagnostics(*state)


@reverse_diagnostics.def_fwd
def _reverse_diagnostics_fwd(perturbed, state):
    del perturbed
    return state_diagnostics(*state), None


def read_from_functions(system, reads: list[bool]) -> bool:
    """Whether the outputs of [`state_diagnostics`][] that a loss reads (`reads`, one flag
    per output) are what the system's own functions give without its terms: the residuals
    `phi`, `dphi`, `psi` of a system whose terms take them from its constraints
    (`terms_from_constraints`), the energy, the velocities and the momenta (`momenta`,
    `∂T/∂v` for a `LagrangianSystem`). The backward pass then
    linearizes only those functions, not the terms, whose linearization is most of such a
    gradient's trace (docs/design_measurements.md#reverse-diagnostics)."""
    # The positions of `phi`, `dphi`, `psi`, the energy, the velocities and the momenta
    # among `state_diagnostics`'s outputs (`outputs_read` below builds them in that order).
    alone = (0, 1, 2, 4, 5, 6) if system.terms_from_constraints else (4, 5, 6)
    return all(i in alone for i, r in enumerate(reads) if r)


@reverse_diagnostics.def_bwd
@full_precision
def _reverse_diagnostics_bwd(residuals, out_bar, perturbed, state):
    del residuals
    if all(bar is None for bar in jax.tree.leaves(out_bar, is_leaf=is_none)):
        return nones(eqx.filter(state, eqx.is_inexact_array))
    state = jax.tree.map(typed_literal_as_array, state)
    diff, static = eqx.partition(state, perturbed)
    # Only the outputs with a cotangent are linearized: a loss on `phi` does not trace the
    # derivatives of the multipliers, the energy or the mass matrix.
    read = jax.tree.map(lambda bar: bar is not None, out_bar, is_leaf=is_none)
    reads = [any(jax.tree.leaves(r)) for r in read]
    from_functions = read_from_functions(state[0], reads)

    def outputs_read(diff):
        system, formulation, t, q, s = eqx.combine(diff, static)
        if from_functions:
            s = formulation_velocities(system, formulation, t, q, s)
            v = system.velocities(t, q, s)
            residuals = constraint_residuals(system, t, q, v) if any(reads[:3]) else (None,) * 3
            energy = system.energy(t, q, s) if reads[4] else None
            momenta = system.momenta(t, q, s) if reads[6] else None
            out = (*residuals, out_bar[3], energy, v, momenta, *out_bar[7:])
        else:
            out = state_diagnostics(system, formulation, t, q, s)
        out = eqx.filter(out, eqx.is_inexact_array)
        return jax.tree.map(lambda x, r: x if r else None, out, read, is_leaf=is_none)

    _, pull = jax.vjp(outputs_read, diff)
    (diff_bar,) = pull(out_bar)
    return diff_bar


def saved_momenta(system, t, q, s, terms):
    """The system's momenta at the state `(q, s)`: from its `terms` there where they hold
    them."""
    return system.momenta(t, q, s) if terms.momenta is None else terms.momenta


def cut_at(ts, ts_saved, ys, t_failed):
    """One ensemble trajectory's saved times and states as a solve stopped at `t_failed`
    (`inf`: not stopped) would have saved them: `inf` after it, the end time `t_failed`."""
    if ts is None:  # [t0, t_end]; the state saved at the end is the stopped state
        return ts_saved.at[1].min(t_failed), ys
    (ts_requested, ts_end), ((q, v), final) = ts_saved, ys
    late = ts_requested > t_failed
    q, v = (jnp.where(late[:, None], jnp.inf, x) for x in (q, v))
    return (jnp.where(late, jnp.inf, ts_requested), jnp.minimum(ts_end, t_failed)), ((q, v), final)


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
        ts_out, ys = jax.tree.map(
            lambda x: x.at[1].set(jnp.where(reached, x[1], jnp.inf)), (ts_saved, ys)
        )
        return ts_out, ys, final
    (ts_out, ts_final), (ys, y_final) = ts_saved, ys
    return saved_times(ts, ts_out), ys, (ts_final[0], jax.tree.map(lambda x: x[0], y_final))


def at_valid(valid, rows, start):
    """`rows` (leading axis: the saved times) where `valid`, else the start state: the
    diagnostics are evaluated at a safe state where nothing was saved (`inf`), then
    `masked` (no nan gradients)."""
    return jax.tree.map(
        lambda x, x0: jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, x0), rows, start
    )


def masked(valid, x):
    """`x` (leading axis: the saved times) where `valid`, else `inf`."""
    return jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.inf)


def assemble_solution(
    system, formulation, start, ts, saved, outcome, limit, reverse: bool = False
) -> tuple[Solution, tuple[Float[Array, "n n"], Bool[Array, ""] | None, Float[Array, " n"]]]:
    """One trajectory's [`jaxdae.Solution`][] from its `start = (t0, q0, v0)`, the times
    and states diffrax `saved` and the solve's `outcome = (reached, result, stats)`, and the
    mass matrix, whether its factor shows it positive definite (None: it does not) and the
    forces at the initial state (for `check_traced`). `limit`: the
    constraint residual that its tolerances allow at the end, and whether the
    formulation's `residual_allowance` adds to it (`checked_result`). `reverse`:
    the solve is differentiable in reverse mode only, and so are the diagnostics
    (`reverse_diagnostics`).

    The diagnostics are evaluated once per row: the initial state, the saved states and
    the final state (without `ts` the second row is the final state), and the final row
    also gives `v_final`, `p_final` and the inputs of `checked_result`, so that the
    compiled program holds the equations of motion once for all of them."""
    (t0, q0, v0), (reached, result, stats) = start, outcome
    ts_out, (q, v), (t_final, (q_final, v_final)) = saved_rows(ts, saved, reached)
    diagnostics = (lambda *state: reverse_diagnostics(state)) if reverse else state_diagnostics

    # Rows after a failure are inf, and a final state may be: evaluate at a safe state (the
    # initial one), then mask (no nan gradients).
    valid = jnp.isfinite(ts_out)
    final_finite = all_finite(t_final, q_final, v_final)
    final = tuple(
        jnp.where(final_finite, x, x0)
        for x, x0 in zip((t_final, q_final, v_final), (t0, q0, v0), strict=False)
    )
    # The initial state first, the saved states, the final state last. One row after the
    # other in a loop: the program holds the equations once, traced once, where `vmap`
    # would batch their scalar graph equation by equation at trace time and separate calls
    # would each be compiled (docs/design_measurements.md#diagnostics-loop).
    rows = (
        (t0[None], q0[None], v0[None])
        if ts is None
        else at_valid(valid, (ts_out, q, v), (t0, q0, v0))
    )
    rows = tuple(
        jnp.concatenate([x0[None], row, x[None]])
        if ts is not None
        else jnp.concatenate([row, x[None]])
        for x0, row, x in zip((t0, q0, v0), rows, final, strict=False)
    )
    *diagnostics, mass, definite, forces, allowance, spectra, range_inputs = jax.lax.map(
        lambda row: diagnostics(system, formulation, *row), rows
    )
    # The constraint Jacobian's conditioning at the final state (row 0: the initial one).
    final_conditioning = conditioning(spectra[jnp.array([0, -1])])[-1]
    if ts is None:
        outputs = diagnostics
    else:
        outputs = [x[1:-1] for x in diagnostics]
        spectra = spectra[:-1]  # the initial state, then the saved ones
    phi, dphi, psi, multipliers, energy, v, p = outputs
    # Row 0 is the initial state and the last row the final one, with or without `ts`.
    initial_residual, final_residual = (
        jnp.max(jnp.abs(jnp.concatenate([diagnostics[0][i], diagnostics[2][i]])), initial=0.0)
        for i in (0, -1)
    )
    # The limit at the end: what the tolerances and the formulation allow there, or the
    # violation at the start (positions or velocities) where it is larger.
    initial_violation = jnp.max(
        jnp.abs(jnp.concatenate([diagnostics[i][0] for i in (0, 1, 2)])), initial=0.0
    )
    # A penalty's violation is granted only where a configuration that meets the
    # constraints lies near, to first order: the Jacobian there is well conditioned. Near
    # a singular configuration (a target outside the workspace: the arm stretched towards
    # it) no small correction removes the residual, and it is not the penalty's
    # (docs/failures.md, the rules).
    limit, allowed = limit
    allowed = allowed & ~(final_conditioning < _thresholds.PENALTY_CONDITIONING)
    limit = jnp.maximum(jnp.where(allowed, limit + 10 * allowance[-1], limit), initial_violation)
    result = checked_result(
        initial_residual,
        jnp.where(final_finite, final_residual, jnp.inf),
        jax.tree.map(lambda x: x[-1], range_inputs),
        result,
        limit,
    )
    # Steps that shrank to a stall where the constraints degenerate stalled because of
    # them: name that, since more steps would not help (docs/failures.md).
    stalled = (result == RESULTS.max_steps_reached) | (result == RESULTS.dt_min_reached)
    result = RESULTS.where(
        stalled & (final_conditioning < _thresholds.STALL_CONDITIONING),
        RESULTS.stalled_near_singular_constraints,
        result,
    )
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
        jacobian_conditioning=mask(conditioning(spectra)[-valid.shape[0] :]),
    )
    return sol, jax.tree.map(lambda x: x[0], (mass, definite, forces))
