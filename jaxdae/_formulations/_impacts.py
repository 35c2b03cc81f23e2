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
- **Coulomb friction** (slip velocities `v_T = W_T v + w_T`, one per gap in the plane, two
  in space): the tangential forces and impulses join the normal ones, `[W; W_T]ᵀ [λ;
  λ_T]`, and a contact sticks (`v̇_T + k_d v_T = 0`, or `v_T⁺ = 0` at an impact) while
  `|λ_T| ≤ μ λ` (in space the isotropic cone, Glocker (2001)), else slips with `λ_T = −μ λ
  v_T/|v_T|` ([`solve_frictional_lcp`][], [`slip_directions`][]).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._constants import jit_with_constants
from .._compilation._lcp import (
    ContactModes,
    along,
    frictional_solve,
    masked_solve,
    solve_frictional_lcp,
    solve_lcp,
    tangent_count,
    units,
)
from .._compilation._linalg import psd_pseudo_inverse, spd_solve
from .._compilation._operators import factor_of
from .._custom_types import Array, Bool, Float
from .._gains import is_concrete
from .._systems._system import ConstrainedTerms, holonomic_terms, nonholonomic_terms
from ._base import AbstractFormulation
from ._multipliers import eliminate


# `u_plus_tf`: the size `u + tangents·f` of the normal then the tangential rows, a name of
# its own, since no field binds `tangents·f` before jaxtyping would add it to `u`.
class GapTerms(eqx.Module):
    """The gaps at one state, as rows of constraints in the convention of
    `ConstrainedTerms`: `gap` `g` `(u,)`; where the contacts have friction also their
    coefficients `friction` `μ` `(f,)` and slip velocities `v_T`, `tangents` per contact
    (1 in the plane, 2 in space; `f = u`, or `f = 0` for frictionless contacts); the
    normal then the tangential rows `directions` `[W; W_T]` `(u + tangents·f, n)` (`W =
    g_q`; contact `i`'s tangents are the rows `u + tangents·i + j`), their `velocity`
    `[ġ; v_T]` and `bias` `[γ_g; −w]`, so that `[g̈; v̇_T] = [W; W_T] q̈ − bias`
    (`v̇_T = W_T q̈ + w`)."""

    gap: Float[Array, " u"]
    velocity: Float[Array, " u_plus_tf"]
    directions: Float[Array, "u_plus_tf n"]
    bias: Float[Array, " u_plus_tf"]
    friction: Float[Array, " f"]
    tangents: int = eqx.field(static=True, default=1)

    @property
    def rate(self) -> Float[Array, " u"]:
        """The gaps' rates `ġ`."""
        return self.velocity[: self.gap.shape[0]]

    @property
    def slip(self) -> Float[Array, " tf"]:
        """The slip velocities `v_T`, contact by contact."""
        return self.velocity[self.gap.shape[0] :]


def friction_coefficients(system, size: int, dtype) -> Float[Array, " f"]:
    """`system.friction()` per gap, `(u,)`; `(0,)` where every coefficient is a concrete
    zero (frictionless contacts skip the tangential rows)."""
    friction = system.friction()
    if is_concrete(friction) and not np.any(np.asarray(friction)):
        return jnp.zeros((0,), dtype)
    return jnp.broadcast_to(jnp.asarray(friction, dtype), (size,))


def slip_tangents(system, t, q) -> int:
    """How many slip velocities each contact of `system` has: 1 (`slip_velocities` of
    shape `(u,)`, friction in the plane) or 2 (`(u, 2)`, friction in space)."""
    shape = jax.eval_shape(system.slip_velocities, t, q, q).shape
    return 1 if len(shape) == 1 else shape[1]


# Jitted, as `contact_problem` is: a solve calls both at every place it evaluates the
# contacts (the steps' rates, the event conditions, the transition), and JAX traces a
# jitted function once per signature, then reuses its program (compile time).
@jit_with_constants
def gap_terms(system, t, q, v, friction: Float[Array, " f"] | None = None) -> GapTerms:
    """The [`GapTerms`][] of `system.gaps` (and `system.slip_velocities` where the contacts
    have friction) at `(t, q)` moving with the velocities `v`; `friction`, the
    coefficients to use (default: [`friction_coefficients`][])."""
    gap, rate, jacobian, bias = holonomic_terms(system.gaps, t, q, v)
    if friction is None:
        friction = friction_coefficients(system, gap.shape[0], q.dtype)
    if friction.shape[0] == 0:
        return GapTerms(gap, rate, jacobian, bias, friction)
    tangents = slip_tangents(system, t, q)

    def slip_velocities(t_, q_, v_):
        return system.slip_velocities(t_, q_, v_).reshape(-1)

    slip, slip_jacobian, slip_rate = nonholonomic_terms(slip_velocities, t, q, v)
    return GapTerms(
        gap,
        jnp.concatenate([rate, slip]),
        jnp.concatenate([jacobian, slip_jacobian]),
        jnp.concatenate([bias, -slip_rate]),
        friction,
        tangents,
    )


def constrained_inverse_mass(
    terms: ConstrainedTerms, forces: Float[Array, "n k"]
) -> Float[Array, "n k"]:
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


def impact(
    terms: ConstrainedTerms,
    gaps: GapTerms,
    closed: Bool[Array, " u"],
    restitution: Float[Array, " u"],
    min_bounce_speed,
) -> Impact:
    """Newton's impact law for the `closed` gaps (module docstring), with Coulomb's on the
    impulses where the contacts have friction: a contact's tangential impulse sticks it
    (`v_T⁺ = 0`) where that impulse fits in the cone `|P_T| ≤ μ P_N`, else it slides with
    `P_T = −μ P_N d` against its slip after the impact, `d = v_T⁺/|v_T⁺|` (in space found by
    substitution from the slip before the impact; exact where the contact's tangential
    block of the Delassus matrix is isotropic and uncoupled from the normal, a sphere or a
    point mass on a plane; [`solve_frictional_lcp`][]). A gap that would bounce off slower than
    `min_bounce_speed` (`e |ġ⁻|` below it) closes plastically (`e = 0`)."""
    directions = gaps.directions
    response = constrained_inverse_mass(terms, directions.T)
    delassus = directions @ response
    delassus = 0.5 * (delassus + delassus.T)
    rate = gaps.rate
    bouncing = jnp.where(-restitution * rate < min_bounce_speed, 0.0, restitution)
    normal = rate + bouncing * jnp.minimum(rate, 0.0)
    if gaps.friction.shape[0] == 0:
        solution = solve_lcp(delassus, normal, closed)
        return Impact(response @ solution.x, solution.x, solution.solved)
    free = jnp.ones_like(closed)
    frictional = solve_frictional_lcp(
        delassus,
        jnp.concatenate([normal, gaps.slip]),
        gaps.friction,
        closed,
        free,
        unit_directions(rate.shape[0], gaps.tangents, rate.dtype),
    )
    return Impact(response @ frictional.x, frictional.x, frictional.solved)


def unit_directions(size: int, tangents: int, dtype) -> Float[Array, " u"] | Float[Array, "u k"]:
    """Slip directions of `size` contacts with no motion to take one from: `+1` in the
    plane (`tangents = 1`, shape `(u,)`), the first tangent in space (shape `(u, k)`)."""
    if tangents == 1:
        return jnp.ones((size,), dtype)
    return jnp.broadcast_to(jnp.eye(tangents, dtype=dtype)[0], (size, tangents))


def slip_directions(
    sign: Float[Array, " u"] | Float[Array, "u k"],
    slip: Float[Array, " ku"],
    regularization,
) -> Float[Array, " u"] | Float[Array, "u k"]:
    """The directions `s` along which slipping contacts rub (`λ_T = −μ λ s`), at the
    state whose slip velocities are `slip`, for their modes' reference directions `d`
    (`sign`).

    In the plane `s = d` (`±1`, constant in a mode: the slip→stick event is where `v_T`
    reaches zero). In space `s = v_T/|v_T|` turns with the motion: `s = u/|u|`,
    `u = sgn(d·v_T) v_T + ε d`, `ε` the `regularization` (a velocity far below any
    resolved one). The sign makes `s` continuous where `v_T` passes through zero along a
    line (a stop, located by the condition `d·v_T`: the step that crosses it sees the
    same force on both sides, as in the plane), and `ε d` gives a slip that starts from
    rest (`v_T` zero to rounding) its direction `d` until its motion takes over;
    `|u| ≥ ε`, so `s` and its derivatives are finite everywhere."""
    if sign.ndim == 1:
        return sign
    velocity = slip.reshape(sign.shape)
    oriented = jnp.where(along(sign, velocity) < 0, -1.0, 1.0)[:, None] * velocity
    return units(oriented + regularization * sign, sign)


class ContactProblem(eqx.Module):
    """The accelerations under contact forces `λ` (normal, then tangential where the contacts
    have friction) at one state (module docstring): `q̈ = acceleration + response λ`, and
    `K λ + b = [g̈ + k_d ġ + k_p g; v̇_T + k_d v_T]` (`matrix`, `vector`); the contacts'
    `friction` and slip velocities `slip` there."""

    acceleration: Float[Array, " n"]
    response: Float[Array, "n u_plus_tf"]
    matrix: Float[Array, "u_plus_tf u_plus_tf"]
    vector: Float[Array, " u_plus_tf"]
    friction: Float[Array, " f"]
    slip: Float[Array, " tf"]

    def forces(self, modes: ContactModes, regularization=0.0) -> Float[Array, " u_plus_tf"]:
        """The forces `λ` of the contacts in their `modes`: the `active` ones hold
        `g̈ + k_d ġ + k_p g = 0`, the sticking ones also `v̇_T + k_d v_T = 0`, the slipping
        ones rub with `λ_T = −μ λ s` (zero for the others), `s` of [`slip_directions`][]
        at this state (its `regularization`)."""
        if self.friction.shape[0] == 0:
            return masked_solve(self.matrix, -self.vector, modes.active)
        turned = eqx.tree_at(
            lambda m: m.sign, modes, slip_directions(modes.sign, self.slip, regularization)
        )
        return frictional_solve(self.matrix, self.vector, self.friction, turned)


@jit_with_constants
def contact_problem(
    formulation: AbstractFormulation, terms: ConstrainedTerms, gaps: GapTerms, gains
) -> ContactProblem:
    """The [`ContactProblem`][] of the formulation's accelerations at `terms`; `gains` are
    `(k_d, k_p)` of the resting contacts' stabilization."""
    directions = gaps.directions

    def accelerations(forces):
        pushed = eqx.tree_at(lambda x: x.forces, terms, terms.forces + directions.T @ forces)
        acceleration = formulation.accelerations(pushed)[0]
        return acceleration, acceleration

    # Forward mode, column by column (`vmap` of `jvp`, whose primal is computed once and is
    # the acceleration without contact forces): the formulations' own derivative rules are
    # written for it.
    none = jnp.zeros((directions.shape[0],), directions.dtype)
    response, acceleration = jax.jacfwd(accelerations, has_aux=True)(none)
    matrix = directions @ response
    kd, kp = gains
    rates = directions @ acceleration
    # `[g̈; v̇_T] + k_d [ġ; v_T] + k_p [g; 0]`
    vector = (
        rates
        - gaps.bias
        + kd * gaps.velocity
        + kp * jnp.concatenate([gaps.gap, jnp.zeros_like(gaps.slip)])
    )
    return ContactProblem(
        acceleration, response, 0.5 * (matrix + matrix.T), vector, gaps.friction, gaps.slip
    )


def resting_contacts(
    problem: ContactProblem,
    candidates: Bool[Array, " u"],
    free: Bool[Array, " u"],
    sign: Float[Array, " u"] | Float[Array, "u k"],
    turning: Bool[Array, " u"] | None = None,
) -> tuple[ContactModes, Float[Array, " u_plus_ku"], Bool[Array, ""]]:
    """The modes of the `candidates` (closed gaps at rest): which carry a pushing force
    (the contact forces' complementarity problem `K λ + b ≥ 0 ⊥ λ ≥ 0`), and, with
    friction, which of those stick (the `free` ones may; the others slide in the direction
    `sign`, `±1` in the plane, a unit 2-vector in space; in space the `turning` ones, by
    default the free ones, take their slip's direction, [`solve_frictional_lcp`][]); the
    forces of that solution, zero where no contact rests (normal, then tangential, as
    [`ContactProblem.forces`][]); and whether that problem was solved."""
    size = candidates.shape[0]
    if problem.friction.shape[0] == 0:
        solution = solve_lcp(problem.matrix, problem.vector, candidates)
        active = candidates & (solution.x > 0)
        modes = ContactModes(active, jnp.zeros_like(active), jnp.zeros(size, problem.vector.dtype))
        return modes, jnp.where(active, solution.x, 0.0), solution.solved
    solution = solve_frictional_lcp(
        problem.matrix, problem.vector, problem.friction, candidates, free, sign, turning=turning
    )
    active = candidates & solution.modes.active & (solution.x[:size] > 0)
    resting = jnp.concatenate([active, jnp.repeat(active, tangent_count(sign))])
    modes = ContactModes(active, active & solution.modes.stick, solution.modes.sign)
    return modes, jnp.where(resting, solution.x, 0.0), solution.solved
