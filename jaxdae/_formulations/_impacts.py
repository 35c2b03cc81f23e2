"""Impacts and resting contacts of one-sided constraints (a system's `gaps`).

With the gaps `g(t, q) ≥ 0` of a system, `W = g_q` and `g̈ = W q̈ − γ_g`:

- **Impacts** (the impulse problem in the mass metric of Pfeiffer and Glocker (1996),
  ch. 7; docs/methods.md#one-sided-constraints): the impulses `P`
  of the closed gaps change the velocities by `Δv = N P`, `N = (M⁻¹ − M⁻¹Gᵀ (G M⁻¹ Gᵀ)⁺
  G M⁻¹) Wᵀ`, which keeps the rates of the bilateral constraints `G`. Newton's law
  `ġ⁺ ≥ −e ġ⁻` for every closed gap with no pulling impulse is the linear complementarity
  problem `ġ⁺ + e min(ġ⁻, 0) = D P + (ġ⁻ + e min(ġ⁻, 0)) ≥ 0 ⊥ P ≥ 0`, `D = W N`.
- **Resting contacts**: a closed gap at rest carries a force `λ ≥ 0` (the generalized
  force `Wᵀλ`) that holds `g̈ + k_d ġ + k_p g = 0` while it pushes. The accelerations
  are the formulation's under that force, linear in `λ`: `q̈ = a₀ + R λ`, so
  `g̈ + k_d ġ + k_p g = K λ + b` with `K = W R`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._compilation._lcp import masked_solve, solve_lcp
from .._compilation._linalg import psd_pseudo_inverse, spd_solve
from .._compilation._operators import factor_of
from .._custom_types import Array, Bool, Float
from .._systems._system import ConstrainedTerms, holonomic_terms
from ._base import AbstractFormulation
from ._multipliers import eliminate


class GapTerms(eqx.Module):
    """The gaps at one state: `gap` `g` `(u,)`, `rate` `ġ` `(u,)`, `jacobian` `W = g_q`
    `(u, n)` and `bias` `γ_g` `(u,)`, with `g̈ = W q̈ − γ_g`."""

    gap: Float[Array, " u"]
    rate: Float[Array, " u"]
    jacobian: Float[Array, "u n"]
    bias: Float[Array, " u"]


def gap_terms(system, t, q, v) -> GapTerms:
    """The [`GapTerms`][] of `system.gaps` at `(t, q)` moving with the velocities `v`."""
    return GapTerms(*holonomic_terms(system.gaps, t, q, v))


def constrained_inverse_mass(terms: ConstrainedTerms,
                             forces: Float[Array, "n k"]) -> Float[Array, "n k"]:
    """`(M⁻¹ − M⁻¹Gᵀ (G M⁻¹ Gᵀ)⁺ G M⁻¹) F`: the velocity changes of the impulses `F` (one
    per column) that leave the rates of the bilateral constraints as they are."""
    factor = factor_of(terms.mass_operator)
    minv_f = spd_solve(terms.mass_matrix, forces) if factor is None else factor.solve(forces)
    if terms.jacobian.shape[0] == 0:
        return minv_f
    elimination = eliminate(terms)
    dtype = forces.dtype
    inverse = psd_pseudo_inverse(elimination.matrix, float(1e3 * jnp.finfo(dtype).eps))
    multipliers = inverse @ (terms.jacobian @ minv_f)
    return minv_f - jax.vmap(elimination.apply_minv_gt, in_axes=1, out_axes=1)(multipliers)


class Impact(eqx.Module):
    """The outcome of an impact: the velocity change `(n,)`, the impulses `(u,)` and whether
    the impact problem was solved."""

    velocity_change: Float[Array, " n"]
    impulses: Float[Array, " u"]
    solved: Bool[Array, ""]


def impact(terms: ConstrainedTerms, gaps: GapTerms, closed: Bool[Array, " u"],
           restitution: Float[Array, " u"], min_bounce_speed) -> Impact:
    """Newton's impact law for the `closed` gaps (module docstring). A gap that would
    bounce off slower than `min_bounce_speed` (`e |ġ⁻|` below it) closes plastically
    (`e = 0`)."""
    response = constrained_inverse_mass(terms, gaps.jacobian.T)
    delassus = gaps.jacobian @ response
    delassus = 0.5 * (delassus + delassus.T)
    rate = gaps.rate
    bouncing = jnp.where(-restitution * rate < min_bounce_speed, 0.0, restitution)
    solution = solve_lcp(delassus, rate + bouncing * jnp.minimum(rate, 0.0), closed)
    return Impact(response @ solution.x, solution.x, solution.solved)


class ContactProblem(eqx.Module):
    """The accelerations under contact forces `λ` at one state (module docstring):
    `q̈ = acceleration + response λ`, and `K λ + b = g̈ + k_d ġ + k_p g` (`matrix`,
    `vector`)."""

    acceleration: Float[Array, " n"]
    response: Float[Array, "n u"]
    matrix: Float[Array, "u u"]
    vector: Float[Array, " u"]

    def forces(self, active: Bool[Array, " u"]) -> Float[Array, " u"]:
        """The forces `λ` of the `active` contacts that hold `g̈ + k_d ġ + k_p g = 0`
        (zero for the others)."""
        return masked_solve(self.matrix, -self.vector, active)


def contact_problem(formulation: AbstractFormulation, terms: ConstrainedTerms,
                    gaps: GapTerms, gains) -> ContactProblem:
    """The [`ContactProblem`][] of the formulation's accelerations at `terms`; `gains` are
    `(k_d, k_p)` of the resting contacts' stabilization."""
    jacobian = gaps.jacobian

    def accelerations(forces):
        pushed = eqx.tree_at(lambda x: x.forces, terms, terms.forces + jacobian.T @ forces)
        return formulation.accelerations(pushed)[0]

    # Forward mode, column by column (`vmap` of `jvp`, whose primal is computed once):
    # the formulations' own derivative rules are written for it.
    none = jnp.zeros_like(gaps.gap)
    acceleration, response = accelerations(none), jax.jacfwd(accelerations)(none)
    matrix = jacobian @ response
    kd, kp = gains
    vector = jacobian @ acceleration - gaps.bias + kd * gaps.rate + kp * gaps.gap
    return ContactProblem(acceleration, response, 0.5 * (matrix + matrix.T), vector)


def resting_contacts(problem: ContactProblem, candidates: Bool[Array, " u"]
                     ) -> Bool[Array, " u"]:
    """Which `candidates` (closed gaps at rest) carry a pushing force: the contact
    forces' complementarity problem `K λ + b ≥ 0 ⊥ λ ≥ 0`, positive `λ`."""
    solution = solve_lcp(problem.matrix, problem.vector, candidates)
    return candidates & (solution.x > 0)
