"""Naming failures after a solve: the non-finite term that stopped it, and the end-of-solve
checks of the residual and of the target's range. (The conditions that stop a solve and
the results they name are the solve's, `_solve.py`; solvers name their own failures:
`AbstractFailureNamingSolver`.)"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._constants import jit_with_constants
from .._compilation._linalg import psd_pseudo_solve
from .._compilation._private_apis import result_codes, unvmap_any, with_result_codes
from .._custom_types import Array
from .._formulations import AbstractStabilizedFormulation
from .._solution import RESULTS
from ._validation import factored_positive_definite, mass_positive_definite
from ._vector_fields import jitted_rates, system_terms

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
        flags = jnp.stack(
            [
                ~all_finite(terms.mass_matrix),
                ~mass_positive_definite(
                    system,
                    (tp, qp, velocities),
                    terms.mass_matrix,
                    factored_positive_definite(terms),
                ),
                ~all_finite(terms.forces),
                ~all_finite(terms.phi, terms.dphi, terms.psi, terms.jacobian, terms.bias),
                ~all_finite(*jitted_rates(system, formulation, tp, qp, sp)),
            ]
        )
        return jnp.where(jnp.any(flags), jnp.argmax(flags) + 1, 0).astype(jnp.int32)

    codes = jax.lax.map(code, unit * jnp.array([0.0, 4.0, 64.0, 1024.0, 16384.0]))
    return codes[jnp.argmax(codes != 0)]


def name_non_finite_term(sol, system, formulation, t0):
    """`sol` (concrete) with each stalled solve (`dt_min_reached`) whose model is non-finite
    at or just after its end relabelled by the term (`NON_FINITE_RESULTS`, found by
    `non_finite_term`). Done here, after the solve and only for a stalled one, rather than
    inside every compiled solve, where the probe would be a second copy of the equations of
    motion to compile (docs/design_measurements.md#non-finite-probe); traced solves keep
    `dt_min_reached`."""
    codes = np.array(result_codes(sol.result))
    stalled = np.asarray(sol.result == RESULTS.dt_min_reached)
    if not np.any(stalled) or formulation.derives_velocities:
        return sol  # (a formulation that maps the state to velocities: state not at hand)
    state = sol.v_final if system.state_is_velocity else sol.p_final
    for index in np.argwhere(stalled) if codes.ndim else [()]:
        index = tuple(index)
        code = int(
            non_finite_term(
                system, formulation, t0, sol.t_final[index], sol.q_final[index], state[index]
            )
        )
        if code:
            codes[index] = result_codes(NON_FINITE_RESULTS[code - 1])
    result = with_result_codes(sol.result, jnp.asarray(codes, codes.dtype))
    return eqx.tree_at(lambda s: s.result, sol, result)


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


def first_failure(result: RESULTS) -> RESULTS:
    """An ensemble's result of its first failed trajectory (the first if none failed)."""
    first = jnp.argmax(result != RESULTS.successful)
    return jax.tree.map(lambda x: x[first], result)
