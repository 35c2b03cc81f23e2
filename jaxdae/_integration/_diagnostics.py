"""What a solve reports besides the trajectory: residuals, multipliers, energy and momenta
at the saved times, and the assembly of the [`jaxdae.Solution`][]."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._constants import jit_with_constants
from .._compilation._linalg import full_precision, gram_eigenvalues
from .._custom_types import Array, Bool, Float
from .._solution import RESULTS, Solution
from ._failures import all_finite, checked_result, tests_target_range
from ._sweep_forward import is_none, nones, typed_literal_as_array
from ._validation import factored_positive_definite
from ._vector_fields import constraint_residuals, formulation_velocities, terms_outside_steps


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
