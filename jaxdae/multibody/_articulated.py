"""The articulated-body algorithm of a deep tree: its mass matrix factored by articulated
inertias, and solves with it in two passes over the tree's levels."""

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._compilation._gather import take
from .._compilation._linalg import unrolled_cholesky_factor, unrolled_substitution
from .._compilation._operators import AbstractMassFactor
from .._compilation._sparse import SparseMatrix
from .._custom_types import Array, Bool, Float
from ._spatial import motion_cross, skew_matrices
from ._topology import Topology


class Levels(NamedTuple):
    """A tree's bodies by their depth (static): `positions[l][s]` is the position (in
    `topology.order`) of slot `s` of level `l` (padded with the number of bodies, an empty
    slot); `parents[l][s][r]` is 1 where slot `r` of level `l − 1` is the parent of slot
    `s` of level `l` (level 0 hangs from the ground: zeros); `index` gives, for each
    coordinate, its entry in the flattened `(levels, slots, width)` layout."""

    positions: tuple[tuple[int, ...], ...]
    parents: tuple[tuple[tuple[int, ...], ...], ...]
    index: tuple[int, ...]


@functools.lru_cache(maxsize=64)
def tree_levels(top: Topology) -> Levels | None:
    """The levels of the tree where it has at least `ARTICULATED_MIN_BODIES` bodies, for the
    recursive algorithms; `None` for a smaller tree, whose sums along paths and dense
    factorization of `M` cost less (docs/design_measurements.md#articulated-bodies)."""
    count = len(top.parent)
    if count < _thresholds.ARTICULATED_MIN_BODIES:
        return None
    depth = [0] * count
    for k in range(count):  # a parent's position may follow its child's (sorted by kind)
        i, d = top.parent[k], 0
        while i >= 0:
            i, d = top.parent[i], d + 1
        depth[k] = d
    members = [[k for k in range(count) if depth[k] == d] for d in range(max(depth) + 1)]
    slots = max(len(m) for m in members)
    positions = tuple(tuple(m + [count] * (slots - len(m))) for m in members)
    parents = []
    for d, level in enumerate(members):
        rows = np.zeros((slots, slots), np.int64)
        for s, k in enumerate(level):
            if d:
                rows[s, members[d - 1].index(top.parent[k])] = 1
        parents.append(tuple(map(tuple, rows.tolist())))
    width = len(top.dofs[0])
    index = np.zeros(top.num_coordinates, np.int64)
    for d, level in enumerate(members):
        for s, k in enumerate(level):
            for c, j in enumerate(top.dofs[k]):
                if j < top.num_coordinates:
                    index[j] = (d * slots + s) * width + c
    return Levels(positions, tuple(parents), tuple(index.tolist()))


def by_level(levels: Levels, per_body: Array) -> Array:
    """`(b, ...)` per body position to `(levels, slots, ...)` (zeros in empty slots)."""
    return take(per_body, np.asarray(levels.positions))


def from_levels(levels: Levels, per_slot: Array, count: int) -> Array:
    """`(levels, slots, ...)` back to `(count, ...)` per body position."""
    where = np.zeros(count, np.int64)
    for flat, position in enumerate(np.asarray(levels.positions).reshape(-1)):
        if position < count:
            where[position] = flat
    return take(per_slot.reshape((-1,) + per_slot.shape[2:]), where)


def level_path_sums(levels: Levels, x: Array) -> Array:
    """Each body's sum of `x` `(b, ...)` over its path from the ground (itself included),
    one level of bodies per step of a `lax.scan` from the ground: `O(b)` work, where
    pointer jumping takes `O(b log d)` in `⌈log₂ d⌉` rounds and products with the ancestor
    matrix `O(b²)`."""
    parents = jnp.asarray(np.asarray(levels.parents), x.dtype)

    def outward(carry, step):
        x_l, parent_l = step
        total = jnp.einsum("sr,r...->s...", parent_l, carry) + x_l
        return total, total

    per_level = by_level(levels, x)
    _, sums = jax.lax.scan(outward, jnp.zeros_like(per_level[0]), (per_level, parents))
    return from_levels(levels, sums, x.shape[0])


def level_motion_sums(
    levels: Levels, relative: Float[Array, "b 6"], local: Float[Array, "b 6"] | None
) -> tuple[Array, Array]:
    """The bodies' spatial velocities `V` (the sums of their joints' `relative` velocities
    `S q̇` along their paths) and the sums along their paths of `V_parent × S q̇ + local`
    (the accelerations at `q̈ = 0` of `TreeMechanism._motion`), in one `lax.scan` from the
    ground, one level of bodies per step: each level reads its parents' `V` from the step
    before (`level_path_sums` would take two loops, the second after the first)."""
    parents = jnp.asarray(np.asarray(levels.parents), relative.dtype)
    local = jnp.zeros_like(relative) if local is None else local

    def outward(carry, step):
        velocity_c, bias_c = carry
        relative_l, local_l, parent_l = step
        parent_velocity = jnp.einsum("sr,rj->sj", parent_l, velocity_c)
        velocity = parent_velocity + relative_l
        bias = (
            jnp.einsum("sr,rj->sj", parent_l, bias_c)
            + motion_cross(parent_velocity, relative_l)
            + local_l
        )
        return (velocity, bias), (velocity, bias)

    per_level = [by_level(levels, x) for x in (relative, local)]
    zero = jnp.zeros_like(per_level[0][0])
    _, sums = jax.lax.scan(outward, (zero, zero), (*per_level, parents))
    count = relative.shape[0]
    return from_levels(levels, sums[0], count), from_levels(levels, sums[1], count)


def inertia_matrices(parts) -> Float[Array, "b 6 6"]:
    """The `6 × 6` spatial inertias of the parts `(m, h, I_O)` (see `_spatial.py`):
    `[[I_O, h̃], [h̃ᵀ, m 1]]`."""
    mass, first, rotational = parts
    cross = skew_matrices(first)
    eye = jnp.eye(3, dtype=first.dtype)
    return jnp.concatenate(
        [
            jnp.concatenate([rotational, cross], axis=2),
            jnp.concatenate([jnp.swapaxes(cross, 1, 2), mass[:, None, None] * eye], axis=2),
        ],
        axis=1,
    )


def _inverse(matrix: Float[Array, "s w w"]) -> Float[Array, "s w w"]:
    """The inverses of a batch of small symmetric positive definite matrices, by unrolled
    Cholesky factorizations (elementwise operations fused with the loop around them)."""
    width = matrix.shape[-1]
    if width == 1:
        return 1 / matrix

    def inverse(a):
        low = unrolled_cholesky_factor(a)
        eye = jnp.eye(width, dtype=a.dtype)
        return unrolled_substitution(low, unrolled_substitution(low, eye, False), True)

    return jax.vmap(inverse)(matrix)


class ArticulatedFactor(AbstractMassFactor):
    """`M⁻¹` of a tree in joint coordinates, by the articulated-body algorithm
    (Featherstone, *Rigid Body Dynamics Algorithms* (2008), Table 7.1, with the velocity
    terms left out): the articulated inertias `I^A`, `U = I^A S` and `D⁻¹ = (Sᵀ U + K)⁻¹`
    of each body, found once per state from the tips to the ground ([`articulated_factor`][]);
    a solve `M⁻¹ τ` is then two passes over the levels, `O(n)` for any number of
    right-hand sides. `K` is what a joint adds to `M`'s diagonal block of its own
    coordinates (the Euler parameters' norms' inertia; ones on the padding).

    **Fields:** per level and slot, the motion subspaces `S` `(l, s, 6, w)`, `U` and
    `D⁻¹` `(l, s, w, w)`; `levels` ([`Levels`][]).
    """

    subspaces: Float[Array, "l s 6 w"]
    projected: Float[Array, "l s 6 w"]
    pivots: Float[Array, "l s w w"]
    levels: Levels = eqx.field(static=True)
    dofs: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    @property
    def inverse(self) -> SparseMatrix | None:
        return None

    def positive_definite(self) -> Bool[Array, ""]:
        """Whether `M` is positive definite, from the pivots alone: the articulated-body
        algorithm factors `M = Lᵀ D L` block by block in the tree's order (Featherstone
        (2008), §6.5), so `M` is positive definite exactly where every pivot `D` is
        (Sylvester's criterion by blocks), and `M` is symmetric by construction. `D⁻¹` is
        finite with a positive diagonal exactly then: a `1 × 1` pivot's inverse keeps its
        sign, and a wider one's Cholesky factorization turns a pivot that is not positive
        definite into `nan`. (Empty slots have unit pivots.)"""
        diagonal = jnp.diagonal(self.pivots, axis1=-2, axis2=-1)
        return jnp.all(jnp.isfinite(self.pivots)) & jnp.all(diagonal > 0)

    def solve(self, rhs: Float[Array, "n k"]) -> Float[Array, "n k"]:
        """`M⁻¹ rhs`: from the tips, each body's articulated force `p^A` (its children's
        `p^A + U D⁻¹ u`, `u = τ − Sᵀ p^A`); from the ground, its acceleration
        `a = a_parent + S q̈` with `q̈ = D⁻¹ (u − Uᵀ a_parent)` (Featherstone (2008),
        Table 7.1, passes 2 and 3)."""
        n, k = rhs.shape
        padded = jnp.concatenate([rhs, jnp.zeros((1, k), rhs.dtype)])
        tau = by_level(self.levels, take(padded, np.asarray(self.dofs)))  # (l, s, w, k)
        parents = jnp.asarray(np.asarray(self.levels.parents), rhs.dtype)
        s, u_mat, d_inv = self.subspaces, self.projected, self.pivots
        slots = s.shape[1]

        def inward(carry, x):
            s_l, u_l, d_l, tau_l, parent_l = x
            u = tau_l - jnp.einsum("sjw,sjk->swk", s_l, carry)
            y = jnp.einsum("svw,swk->svk", d_l, u)
            force = carry + jnp.einsum("sjw,swk->sjk", u_l, y)
            return jnp.einsum("sr,sjk->rjk", parent_l, force), y

        zero = jnp.zeros((slots, 6, k), rhs.dtype)
        _, y = jax.lax.scan(inward, zero, (s, u_mat, d_inv, tau, parents), reverse=True)

        def outward(carry, x):
            s_l, u_l, d_l, y_l, parent_l = x
            accel = jnp.einsum("sr,rjk->sjk", parent_l, carry)
            qdd = y_l - jnp.einsum("svw,sjw,sjk->svk", d_l, u_l, accel)
            return accel + jnp.einsum("sjw,swk->sjk", s_l, qdd), qdd

        _, qdd = jax.lax.scan(outward, zero, (s, u_mat, d_inv, y, parents))
        return take(qdd.reshape(-1, k), np.asarray(self.levels.index))


def articulated_factor(
    levels: Levels,
    dofs,
    subspaces: Float[Array, "b 6 w"],
    inertias: Float[Array, "b 6 6"],
    joint_inertias: Float[Array, "b w w"],
    body_forces: Float[Array, "b 6"],
) -> tuple[ArticulatedFactor, Float[Array, "b w"]]:
    """The articulated inertias of the tree from its tips (Featherstone (2008), Table 7.1,
    pass 2: `I^A = I + Σ_children (I^A − U D⁻¹ Uᵀ)`, `U = I^A S`, `D = Sᵀ U + K`), one level
    of bodies per step, and, in the same pass, the subtrees' sums of `body_forces`
    projected on each joint's subspace: `Sᵀ Σ f`, the recursive Newton–Euler algorithm's
    joint forces (Table 5.1).

    **Arguments:** `levels` ([`tree_levels`][]), `dofs` (`topology.dofs`), per body
    position: the motion subspaces `S`, the `6 × 6` inertias, `K` (the joint's own share of
    `M`, ones on padded columns) and the bodies' spatial forces.

    **Returns:** `(factor, τ)`: the [`ArticulatedFactor`][], and the joint forces per
    position `(b, w)`.
    """
    s, inertia, joint, force = (
        by_level(levels, x) for x in (subspaces, inertias, joint_inertias, body_forces)
    )
    # Empty slots: no subspace, a unit pivot.
    width = subspaces.shape[2]
    empty = np.asarray(levels.positions) == subspaces.shape[0]
    joint = joint + jnp.asarray(empty[:, :, None, None] * np.eye(width), joint.dtype)
    parents = jnp.asarray(np.asarray(levels.parents), subspaces.dtype)

    def inward(carry, x):
        inertia_c, force_c = carry
        s_l, inertia_l, joint_l, force_l, parent_l = x
        articulated = inertia_l + inertia_c
        total = force_l + force_c
        projected = articulated @ s_l
        pivots = _inverse(jnp.swapaxes(s_l, 1, 2) @ projected + joint_l)
        passed = articulated - projected @ pivots @ jnp.swapaxes(projected, 1, 2)
        carry = (
            jnp.einsum("sr,sij->rij", parent_l, passed),
            jnp.einsum("sr,si->ri", parent_l, total),
        )
        return carry, (projected, pivots, jnp.einsum("sjw,sj->sw", s_l, total))

    slots = s.shape[1]
    zero = (jnp.zeros((slots, 6, 6), s.dtype), jnp.zeros((slots, 6), s.dtype))
    _, (projected, pivots, tau) = jax.lax.scan(
        inward, zero, (s, inertia, joint, force, parents), reverse=True
    )
    tau = from_levels(levels, tau, subspaces.shape[0])
    return ArticulatedFactor(s, projected, pivots, levels, tuple(map(tuple, dofs))), tau
