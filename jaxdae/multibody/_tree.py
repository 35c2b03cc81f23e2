"""A spatial mechanism in joint coordinates: a tree of bodies whose dynamics come from the
recursive algorithms of robotics, with loops closed by constraints."""

import copy
import functools
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .. import _thresholds
from .._compilation._gather import take
from .._compilation._linalg import small_matmul
from .._compilation._operators import FactoredOperator, MassFactor
from .._compilation._sparse import cholesky_factor
from .._custom_types import Array, Float
from .._systems._control import AbstractController
from .._systems._system import (
    AbstractSystem,
    ConstrainedTerms,
    cast_floating,
    holonomic_terms,
)
from ._articulated import (
    Levels,
    articulated_factor,
    inertia_matrices,
    level_motion_sums,
    level_path_sums,
    tree_levels,
)
from ._body import Ground, RigidBody
from ._coupling import JointCoupling
from ._force import AbstractForce, Gravity
from ._joint import AbstractJoint, ScrewMotion, tree_motion
from ._kinematics import quaternion_from_matrix
from ._mechanism import AbstractMechanism, Driven, kind_check
from ._spatial import (
    apply_inertia,
    axis_rotation,
    force_cross,
    inertia_parts,
    mat_mul,
    mat_vec,
    motion_cross,
    rate_map,
    unit_rotation,
)
from ._stop import AbstractStop
from ._topology import FLOATING, SCREW, SPHERICAL, Topology, find_topology
from ._tree_kinematics import TreeKinematics, given_frame, marker_on_body, tree_contact_rows


def _gather(x, index):
    """`x[index]` along axis 0 for a static `index`: a slice and a reshape where `index`
    reads the leading rows in order (a tree whose bodies each have one coordinate, in the
    order of `q`), else a gather."""
    if np.array_equal(index.reshape(-1), np.arange(index.size)):
        return x[: index.size].reshape(index.shape + x.shape[1:])
    return take(x, index)


class TreeMechanism(AbstractMechanism, AbstractSystem):
    """A spatial mechanism in joint coordinates: its bodies form a tree from the ground, its
    dynamics come from the recursive algorithms of robotics, and extra joints close loops as
    constraints.

    **Coordinates.** The bodies and joints are those of a [`jaxdae.multibody.Mechanism`][];
    the coordinates are the joints'. Starting from the ground, a
    [`jaxdae.multibody.Revolute`][] (its angle), [`jaxdae.multibody.Prismatic`][] (its
    displacement), [`jaxdae.multibody.Fixed`][] (none) or [`jaxdae.multibody.Spherical`][]
    joint (the Euler parameters `(e₀, e₁, e₂, e₃)` of marker `b`'s frame relative to marker
    `a`'s) whose marker `a` is on a body already reached carries its body `b`; a body that no
    such joint reaches is free, with the position of its centre of mass and its Euler
    parameters (a floating base). At zero joint coordinates each joint's two marker frames
    coincide: `A_b = A_a R(u, θ)` for a revolute joint about the axis `u` of marker `a`,
    `p_b = p_a + θ A_a u` for a prismatic one, as the joints'
    `coordinate`s measure them. `q` lists the
    free bodies' coordinates, then the tree joints' in the order of `joints`
    (`coordinate_names`). The Euler parameters need not have unit norm: the rotation is that
    of `p/|p|`, and their norm is an inert coordinate with the kinetic energy
    `½ k (d|p|/dt)²` (`k` four thirds of the trace of the inertia it turns), so that `M`
    is positive definite and the norm keeps its value.

    **Dynamics.** The spatial quantities are kept in the global frame (Featherstone, *Rigid
    Body Dynamics Algorithms* (2008), ch. 2): the bodies' poses are found level by level from
    the ground, each level's bodies as one batch; the velocity-dependent and gravity forces
    come from the recursive Newton–Euler algorithm (Featherstone's Table 5.1), the mass
    matrix from the composite-rigid-body algorithm (Table 6.2). The terms carry `M` with its
    factor: for a tree of fewer than `ARTICULATED_MIN_BODIES` bodies the sums along its paths
    are products with its ancestor matrix and `M` is factored by Cholesky; a larger tree sums
    along its paths one level of bodies at a time and factors `M` by the articulated-body
    algorithm (Table 7.1, in `_articulated.py`), `O(n)` per right-hand side. Joints that do not
    belong to the tree (those that close loops, and those of kinds that cannot carry a
    body: universal, cylindrical, distance, ...) contribute their residuals as holonomic
    constraints, and each [`jaxdae.multibody.JointCoupling`][] its equation between two
    joints' coordinates, so that only the loop-closure and coupling equations are
    constraints.

    It is an ordinary jaxdae system: every formulation, [`jaxdae.simulate`][],
    [`jaxdae.linearize`][], [`jaxdae.tune`][] and the gradients work on it, with respect to
    every number of its bodies, joints and force elements.

    **Arguments:** as for [`jaxdae.multibody.Mechanism`][], with
    [`jaxdae.multibody.RigidBody`][]s (a spatial mechanism).

    **Raises:**

    `ValueError` as [`jaxdae.multibody.Mechanism`][] does (a joint limit beyond `±π` or a
    coupling only on a revolute joint that closes a loop, whose angle is measured in
    `(−π, π]`), and for a planar body or a tree joint written with its marker `a` on the
    body farther from the ground.
    """

    bodies: tuple[RigidBody, ...]
    topology: Topology = eqx.field(static=True)
    dimension: int = eqx.field(static=True)
    # The dense path whatever the tree's size (`_dense_mass_variant`).
    _dense_path: bool = eqx.field(static=True, default=False)

    def __init__(
        self,
        bodies: Sequence[RigidBody | Ground],
        joints: Sequence[AbstractJoint] = (),
        forces: Sequence[AbstractForce] = (),
        *,
        stops: Sequence[AbstractStop] = (),
        couplings: Sequence[JointCoupling] = (),
        controller: AbstractController | None = None,
    ):
        items = tuple(bodies)
        for item in items:
            if not isinstance(item, RigidBody | Ground) and hasattr(item, "dimension"):
                raise ValueError(
                    f"A TreeMechanism is spatial: body {getattr(item, 'name', item)!r} is a "
                    f"{type(item).__name__}. Use RigidBody, or jaxdae.multibody.Mechanism "
                    "for a planar mechanism."
                )
        items = kind_check(
            "bodies",
            items,
            (RigidBody, Ground),
            "jaxdae.multibody.RigidBody instances (and one Ground)",
        )
        self._set_bodies(items, "RigidBody")
        self.dimension = 3
        self._set_elements(joints, forces, stops, controller, couplings)
        self.topology = find_topology(self.bodies, self.joints, self.joint_names)
        self._check_wrapped()

    # -- structure ---------------------------------------------------------------------

    @property
    def coordinate_names(self) -> tuple[str, ...]:
        """The order of `q`: `"<body>.x"`, ..., `"<body>.e3"` of each free body, then
        `"<joint>"` of each revolute and prismatic tree joint and `"<joint>.e0"`, ...,
        `"<joint>.e3"` of each spherical one, in the order of `joints`."""
        return self.topology.coordinate_names

    @property
    def closure_joints(self) -> tuple[str, ...]:
        """The joints that close loops (their residuals are the constraints `Φ`)."""
        return tuple(self.joint_names[i] for i in self.topology.closures)

    @property
    def num_equations(self) -> int:
        """`m`: the closing joints' constraint equations, then one per coupling."""
        return sum(self.joints[i].equations(3) for i in self.topology.closures) + len(
            self.couplings
        )

    def joint_slice(self, name: str) -> slice:
        """The coordinates of tree joint `name` in `q` (and `v`)."""
        for joint, start, size in self.topology.joint_offsets:
            if joint == name:
                return slice(start, start + size)
        self.joint(name)
        raise ValueError(f"Joint {name!r} closes a loop: it has no coordinates of its own.")

    def reference_coordinates(self) -> Float[Array, " n"]:
        """`q` of the bodies' given poses (their `position` and `orientation`): each tree
        joint's coordinate as it measures them (the relative Euler parameters of a spherical
        joint), a free body's pose. Where the given poses break a tree joint (its markers
        apart), the bodies beyond it follow the joint instead."""
        parts = []
        for name, _, size in self.topology.joint_offsets:
            if size == 0:
                continue
            joint = self.joint(name)
            frame_a, frame_b = given_frame(self, joint.a), given_frame(self, joint.b)
            if size == 4:
                parts.append(quaternion_from_matrix(frame_a.rotation.T @ frame_b.rotation))
            else:
                parts.append(jnp.atleast_1d(joint.coordinate(frame_a, frame_b)))
        floating = [
            self.bodies[b].reference_coordinates()
            for b in range(len(self.bodies))
            if self.topology.kinds[self.topology.order.index(b)] == FLOATING
        ]
        return jnp.concatenate(floating + parts) if floating + parts else jnp.zeros((0,))

    # -- kinematics --------------------------------------------------------------------

    def _joint_parameters(self, start, stop, dtype) -> dict:
        """The stacked parameters of the tree joints of positions `start:stop`: their markers
        `s_a`, `A_a` (on the parent) and `s_b`, `A_b` (on the body), and for screw joints
        (`tree_motion`) the unit axes `u` and the turn and slide per unit of their
        coordinates (`turn`, `slide`)."""
        joints = [self.joints[self.topology.joint[k]] for k in range(start, stop)]
        markers = [
            marker_on_body(self, ref, dtype) for joint in joints for ref in (joint.a, joint.b)
        ]
        out = {
            key: jnp.stack([m[k] for m in markers[offset::2]])
            for key, k, offset in (("s_a", 1, 0), ("o_a", 2, 0), ("s_b", 1, 1), ("o_b", 2, 1))
        }
        motions = [tree_motion(j) for j in joints]
        if all(isinstance(m, ScrewMotion) for m in motions):
            axes = jnp.stack([m.axis.astype(dtype) for m in motions])
            out["u"] = axes / jnp.sqrt(jnp.sum(axes * axes, axis=1, keepdims=True))
            out["turn"] = jnp.asarray([m.turn for m in motions], dtype)
            out["slide"] = jnp.asarray([m.slide for m in motions], dtype)
        return out

    def poses(self, q: Float[Array, " n"]):
        """The bodies' rotations `(b, 3, 3)`, centres of mass `(b, 3)` and motion subspaces
        `S` `(b, 6, w)` in the global frame (spatial motion vectors `(ω, v_O)` per unit rate
        of each of a body's joint coordinates, padded with zeros to the widest joint), in
        the order of `topology.order`.

        Each body's pose relative to its parent comes from its joint, all bodies of a kind
        of joint in one batch; the poses in the global frame follow by pointer jumping
        (Hillis and Steele, 1986): each round composes every body's transform with that of
        the body it points to and doubles the reach of the pointers, so that a tree of depth
        `d` takes `⌈log₂ d⌉` rounds of batched products."""
        top, dtype = self.topology, q.dtype
        width = len(top.dofs[0])
        coords = self._rates(q)
        local_rot, local_pos = [], []
        parameters = {
            start: self._joint_parameters(start, stop, dtype)
            for kind, start, stop in top.groups
            if kind != FLOATING
        }
        for kind, start, stop in top.groups:
            if kind == FLOATING:
                local_rot.append(unit_rotation(coords[start:stop, 3:7]))
                local_pos.append(coords[start:stop, :3])
                continue
            s_a, o_a, s_b, o_b = (parameters[start][k] for k in ("s_a", "o_a", "s_b", "o_b"))
            if kind == SCREW:
                u, turn, slide = (parameters[start][k] for k in ("u", "turn", "slide"))
                theta = coords[start:stop, 0]
                joint_rot = axis_rotation(u, turn * theta)
                offset = s_a + mat_vec(o_a, (slide * theta)[:, None] * u)
            else:
                joint_rot = unit_rotation(coords[start:stop, :4])
                offset = s_a
            rot = mat_mul(mat_mul(o_a, joint_rot), jnp.swapaxes(o_b, 1, 2))
            local_rot.append(rot)
            local_pos.append(offset - mat_vec(rot, s_b))
        rotations, centres = jnp.concatenate(local_rot), jnp.concatenate(local_pos)
        eye, zero = jnp.asarray(np.eye(3)[None], dtype), jnp.zeros((1, 3), dtype)
        for jump in top.jumps:
            first_rot = take(jnp.concatenate([rotations, eye]), np.asarray(jump))
            first_pos = take(jnp.concatenate([centres, zero]), np.asarray(jump))
            centres = first_pos + mat_vec(first_rot, centres)
            rotations = mat_mul(first_rot, rotations)
        parent = np.asarray([len(top.order) if i < 0 else i for i in top.parent])
        parent_rot = parent_pos = None  # read by spherical joints only
        if SPHERICAL in top.kinds:
            parent_rot = take(jnp.concatenate([rotations, eye]), parent)
            parent_pos = take(jnp.concatenate([centres, zero]), parent)
        subspaces = []
        for kind, start, stop in top.groups:
            if kind == FLOATING:
                p = coords[start:stop, 3:7]
                w = rate_map(p)
                count = stop - start
                unit = jnp.asarray(np.broadcast_to(np.eye(3), (count, 3, 3)), dtype)
                cross = jnp.cross(centres[start:stop, :, None], w, axis=1)
                subspace = jnp.concatenate(
                    [
                        jnp.concatenate([jnp.zeros((count, 3, 3), dtype), w], axis=2),
                        jnp.concatenate([unit, cross], axis=2),
                    ],
                    axis=1,
                )
            elif kind == SCREW:
                # The axis and the joint's point from the body's own pose (the markers
                # coincide on the axis): no gather of the parents' poses.
                u, turn, slide = (parameters[start][k] for k in ("u", "turn", "slide"))
                s_b, o_b = parameters[start]["s_b"], parameters[start]["o_b"]
                rotation = rotations[start:stop]
                axis = mat_vec(rotation, mat_vec(o_b, u))
                point = centres[start:stop] + mat_vec(rotation, s_b)
                subspace = jnp.concatenate(
                    [
                        turn[:, None] * axis,
                        turn[:, None] * jnp.cross(point, axis) + slide[:, None] * axis,
                    ],
                    axis=1,
                )[:, :, None]
            else:
                s_a, o_a = parameters[start]["s_a"], parameters[start]["o_a"]
                frame_a = mat_mul(parent_rot[start:stop], o_a)
                point_a = parent_pos[start:stop] + mat_vec(parent_rot[start:stop], s_a)
                p = coords[start:stop, :4]
                w = mat_mul(frame_a, rate_map(p))
                subspace = jnp.concatenate([w, jnp.cross(point_a[:, :, None], w, axis=1)], axis=1)
            subspaces.append(jnp.pad(subspace, ((0, 0), (0, 0), (0, width - subspace.shape[2]))))
        return rotations, centres, jnp.concatenate(subspaces)

    def _rates(self, v):
        """`v` (or `q`) per body position, `(b, w)` (zero padding)."""
        padded = jnp.concatenate([v, jnp.zeros((1,), v.dtype)])
        return _gather(padded, np.asarray(self.topology.dofs))

    def _to_coordinates(self, per_body):
        """`(b, w)` per body position back to the `(n,)` coordinates."""
        return _gather(per_body.reshape(-1), self._flat_index())

    def _flat_index(self):
        """For each coordinate, its entry in the flattened `(b, w)` per-position layout."""
        top = self.topology
        dofs = np.asarray(top.dofs)
        index = np.zeros(top.num_coordinates, np.int64)
        for position, row in enumerate(dofs):
            for k, j in enumerate(row):
                if j < top.num_coordinates:
                    index[j] = position * dofs.shape[1] + k
        return index

    def _ancestors(self, dtype):
        return jnp.asarray(np.asarray(self.topology.ancestors), dtype)

    def _levels(self) -> Levels | None:
        """The tree's levels where it takes the recursive path (`tree_levels`); `None`
        where it takes the dense one."""
        return None if self._dense_path else tree_levels(self.topology)

    def _dense_mass_variant(self) -> "TreeMechanism":
        """This tree on its dense path (products with the ancestor matrix, `M` by the
        composite-rigid-body algorithm and its Cholesky factor), for a solve that factors
        the dense `M` itself, where the tree would take the recursive path and `M` has at
        most `LOOPED_MAX` rows: a time step needs `M` and its factor, so the articulated
        inertias and the loops over the levels would be extra work
        (docs/design_measurements.md#time-stepping-dense-factor)."""
        if self._levels() is None or self.topology.num_coordinates > _thresholds.LOOPED_MAX:
            return self
        dense = copy.copy(self)
        object.__setattr__(dense, "_dense_path", True)  # a static field: not a leaf to replace
        return dense

    def _path_sums(self, x: Float[Array, "b 6"]) -> Float[Array, "b 6"]:
        """Each body's sum of `x` over its path from the ground (itself included): a
        product with the ancestor matrix, or for a large tree (`tree_levels`) one level of
        bodies per step of a loop from the ground (`level_path_sums`)."""
        levels = self._levels()
        if levels is None:
            return self._ancestors(x.dtype).T @ x
        return level_path_sums(levels, x)

    def _inertias(self, rotations, centres):
        """The bodies' `(m, h, I_O)` (see `_spatial.py`) in the order of positions."""
        order = self.topology.order
        dtype = centres.dtype
        masses = jnp.stack([self.bodies[b].mass for b in order]).astype(dtype)
        inertia = jnp.stack([self.bodies[b].inertia for b in order]).astype(dtype)
        rotational = mat_mul(mat_mul(rotations, inertia), jnp.swapaxes(rotations, 1, 2))
        return inertia_parts(masses, centres, rotational)

    def _radial(self, dtype):
        """`(positions, k)` of the bodies whose joint has Euler parameters, with the weight
        `k` of their norm's kinetic energy: four thirds of the trace of the inertia of the
        bodies they turn."""
        top = self.topology
        positions = [i for i, kind in enumerate(top.kinds) if kind != SCREW]
        if not positions:
            return [], None
        traces = jnp.stack([jnp.trace(self.bodies[b].inertia) for b in top.order]).astype(dtype)
        weights = self._ancestors(dtype) @ traces * (4.0 / 3.0)
        return positions, weights

    def mass_matrix(self, t, q) -> Float[Array, "n n"]:
        """`M(q)` by the composite-rigid-body algorithm (Featherstone (2008), Table 6.2):
        `M_ij = S_iᵀ I^c_k S_j` with `I^c_k` the composite inertia of the subtree of the
        deeper of the two bodies, where one is on the other's path to the ground."""
        del t
        rotations, centres, subspaces = self.poses(q)
        return self._crba(q, subspaces, self._inertias(rotations, centres))

    def _crba(self, q, subspaces, parts):
        dtype = q.dtype
        ancestors = self._ancestors(dtype)
        mass, first, rotational = parts
        composite = (
            ancestors @ mass,
            ancestors @ first,
            jnp.einsum("ik,kab->iab", ancestors, rotational),
        )
        # One column `S_j` per coordinate (no padding to the widest joint) and its momentum
        # `F_j = I^c S_j` under the composite inertia of its body's subtree; `M_ij = S_iᵀ F_j`
        # where the body of `i` lies on the path of that of `j`, its transpose where the
        # other way round, zero where neither does.
        columns, body = self._columns(subspaces)
        forces = apply_inertia(tuple(_gather(x, body) for x in composite), columns)
        products = small_matmul(columns, forces.T)
        above, same = self._coordinate_masks(dtype)
        mass_matrix = above * products + above.T * products.T - same * products
        positions, weights = self._radial(dtype)
        for position in positions:
            select = self._selection(position, dtype)
            p = select @ q
            mass_matrix = (
                mass_matrix + weights[position] * select.T @ (jnp.outer(p, p) / (p @ p)) @ select
            )
        return mass_matrix

    def _coordinate_bodies(self) -> np.ndarray:
        """The position of each coordinate's body."""
        return self._flat_index() // len(self.topology.dofs[0])

    def _columns(self, subspaces) -> tuple[Float[Array, "n 6"], np.ndarray]:
        """The motion subspace `S_j` of each coordinate (the rows of `subspaces` without
        their padding) and the position of its body."""
        rows = jnp.swapaxes(subspaces, 1, 2).reshape(-1, 6)
        return _gather(rows, self._flat_index()), self._coordinate_bodies()

    def _coordinate_masks(self, dtype):
        """`(above, same)`, `(n, n)`: whether the body of coordinate `i` lies on the path
        from the ground of that of coordinate `j` (itself included), and whether the two
        are the same body."""
        body = self._coordinate_bodies()
        ancestors = np.asarray(self.topology.ancestors)
        above = ancestors[body][:, body]
        same = body[:, None] == body[None, :]
        return jnp.asarray(above, dtype), jnp.asarray(same, dtype)

    def _contact_rows(self, t, q, v, friction):
        """The gaps, the contact velocities and their rows (see
        [`jaxdae.AbstractSystem`][]'s default) from the bodies' frames and Jacobians
        (`tree_contact_rows`)."""
        if not self.stops:
            return super()._contact_rows(t, q, v, friction)
        return tree_contact_rows(self, t, q, v, friction)

    def _mass_factor(self, mass) -> MassFactor:
        """The Cholesky factor of `M`, block by block where several subtrees hang from the
        ground (`M` is block diagonal over them: a body moves no other subtree's joints),
        each block a loop over its own columns."""
        blocks = _subtree_blocks(self.topology)
        if blocks is None:
            return MassFactor.factor(mass)
        n = mass.shape[0]
        rows = []
        for start, stop in blocks:
            block = mass[start:stop, start:stop]
            # Looped at every size: a small block unrolled alone is many tiny kernels.
            low = cholesky_factor(0.5 * (block + block.T), unroll_max=0)
            rows.append(jnp.pad(low, ((0, 0), (start, n - stop))))
        return MassFactor(None, jnp.concatenate(rows))

    def _selection(self, position, dtype):
        """The `(4, n)` matrix that picks the Euler parameters of the body at `position`."""
        dofs = self.topology.dofs[position]
        dofs = dofs[3:7] if self.topology.kinds[position] == FLOATING else dofs[:4]
        select = np.zeros((4, self.topology.num_coordinates))
        select[np.arange(4), np.asarray(dofs)] = 1.0
        return jnp.asarray(select, dtype)

    # -- dynamics ----------------------------------------------------------------------

    def _motion(self, q, v):
        """Poses, motion subspaces, the bodies' spatial velocities `V` `(b, 6)` and the sums
        of `Ṡ q̇` along their paths (their accelerations at `q̈ = 0`, gravity aside).

        A joint's subspace moves with the parent body, `Ṡ q̇ = V_parent × S q̇`
        (Featherstone (2008), eq. 2.45, in the global frame), plus, for Euler parameters, the
        change of the map `2 E(p)/|p|²` itself: `−2 (p·ṗ)/|p|² ω` (`E(ṗ) ṗ = 0`), and for a
        free body the motion of its reference point, `ṙ × ω`."""
        rotations, centres, subspaces = self.poses(q)
        rates = self._rates(v)
        coords = self._rates(q)
        relative = jnp.einsum("bjk,bk->bj", subspaces, rates)
        top = self.topology
        local = None
        if any(kind != SCREW for kind in top.kinds):
            parts = []
            for kind, start, stop in top.groups:
                if kind == SCREW:
                    parts.append(jnp.zeros((stop - start, 6), q.dtype))
                    continue
                first = 3 if kind == FLOATING else 0
                p, pdot = (
                    coords[start:stop, first : first + 4],
                    rates[start:stop, first : first + 4],
                )
                shrink = (-2 * jnp.sum(p * pdot, axis=1) / jnp.sum(p * p, axis=1))[:, None]
                omega = relative[start:stop, :3]
                if kind == FLOATING:
                    centre = centres[start:stop]
                    parts.append(
                        jnp.concatenate(
                            [
                                shrink * omega,
                                jnp.cross(rates[start:stop, :3], omega)
                                + shrink * jnp.cross(centre, omega),
                            ],
                            axis=1,
                        )
                    )
                else:
                    parts.append(shrink * relative[start:stop])
            local = jnp.concatenate(parts)
        levels = self._levels()
        if levels is not None:
            # Both sums along the paths in one loop over the levels.
            velocities, bias = level_motion_sums(levels, relative, local)
            return rotations, centres, subspaces, velocities, bias
        velocities = self._path_sums(relative)
        bias = motion_cross(velocities - relative, relative)
        bias = bias if local is None else bias + local
        return rotations, centres, subspaces, velocities, self._path_sums(bias)

    def _gravity(self, dtype):
        """The sum of the [`jaxdae.multibody.Gravity`][] elements' accelerations: the
        recursive algorithm takes gravity as an acceleration of the ground."""
        total = jnp.zeros((3,), dtype)
        for element in self.forces:
            if isinstance(element, Gravity):
                g = element.acceleration
                total = total + (
                    jnp.asarray([0.0, 0.0, -9.81], dtype) if g is None else g.astype(dtype)
                )
        return total

    def _body_forces(self, q, motion, parts, external, acceleration=None):
        """The bodies' spatial forces `I a + V ×* I V − f_ext` `(b, 6)` at the accelerations
        `q̈` (`None`: zero) with gravity as an acceleration of the ground."""
        dtype = q.dtype
        _, _, subspaces, velocities, bias = motion
        ground = jnp.concatenate([jnp.zeros((3,), dtype), -self._gravity(dtype)])
        accelerations = bias + ground
        if acceleration is not None:
            accelerations = accelerations + self._path_sums(
                jnp.einsum("bjk,bk->bj", subspaces, self._rates(acceleration))
            )
        forces = apply_inertia(parts, accelerations) + force_cross(
            velocities, apply_inertia(parts, velocities)
        )
        return forces if external is None else forces - external

    def _newton_euler(self, q, motion, parts, external, acceleration=None):
        """The generalized forces `τ = M q̈ + c(q, v) − Jᵀ f_ext` that give the accelerations
        `q̈` (`None`: zero), by the recursive Newton–Euler algorithm (Featherstone (2008),
        Table 5.1): the bodies' forces (`_body_forces`), summed over subtrees and projected
        on the joints' motion subspaces."""
        forces = self._body_forces(q, motion, parts, external, acceleration)
        totals = self._ancestors(q.dtype) @ forces
        return self._to_coordinates(jnp.einsum("bjk,bj->bk", motion[2], totals))

    def _joint_inertias(self, q):
        """`K` `(b, w, w)`: what each joint adds to `M`'s diagonal block of its own
        coordinates, the Euler parameters' norm's `k p pᵀ/|p|²` (`_norm_terms`), with ones
        on the padded columns (a unit pivot where a joint has no coordinate)."""
        top, dtype = self.topology, q.dtype
        width = len(top.dofs[0])
        _, weights = self._radial(dtype)
        coords = self._rates(q)
        blocks = []
        for kind, start, stop in top.groups:
            block = jnp.zeros((stop - start, width, width), dtype)
            if kind != SCREW:
                first = 3 if kind == FLOATING else 0
                p = coords[start:stop, first : first + 4]
                outer = (
                    weights[start:stop, None, None]
                    * p[:, :, None]
                    * p[:, None, :]
                    / jnp.sum(p * p, axis=1)[:, None, None]
                )
                block = block.at[:, first : first + 4, first : first + 4].set(outer)
            blocks.append(block)
        padded = np.asarray(top.dofs) == top.num_coordinates
        return jnp.concatenate(blocks) + jnp.asarray(padded[:, :, None] * np.eye(width), dtype)

    def _norm_terms(self, q, v, acceleration=None):
        """The Euler parameters' norms' share of `τ` and of the kinetic energy: with
        `r = |p|` and `T_r = ½ k ṙ²`, Lagrange's equations give `k p̂ r̈` with
        `r̈ = p̂·p̈ + (|ṗ|² − (p̂·ṗ)²)/r`."""
        positions, weights = self._radial(q.dtype)
        tau, energy = jnp.zeros_like(q), jnp.zeros((), q.dtype)
        for position in positions:
            select = self._selection(position, q.dtype)
            p, pdot = select @ q, select @ v
            norm2 = p @ p
            radial_rate = (p @ pdot) / jnp.sqrt(norm2)
            curvature = (pdot @ pdot - radial_rate**2) / jnp.sqrt(norm2)
            accel = (
                curvature
                if acceleration is None
                else (curvature + p @ (select @ acceleration) / jnp.sqrt(norm2))
            )
            tau = tau + weights[position] * accel * (select.T @ p) / jnp.sqrt(norm2)
            energy = energy + 0.5 * weights[position] * radial_rate**2
        return tau, energy

    def inverse_dynamics(
        self, t, q: Float[Array, " n"], v: Float[Array, " n"], acceleration: Float[Array, " n"]
    ) -> Float[Array, " n"]:
        """The generalized forces the joints must apply for the accelerations `q̈`:
        `M(q) q̈ + c(q, v) − Q(t, q, v)` with `c` the velocity-dependent and gravity
        forces and `Q` the other force elements' (the loop-closing constraints left out),
        by the recursive Newton–Euler algorithm."""
        applied, external = self._applied_forces(t, q, v, None)
        motion = self._motion(q, v)
        parts = self._inertias(*motion[:2])
        tau = self._newton_euler(q, motion, parts, external, acceleration)
        return tau + self._norm_terms(q, v, acceleration)[0] - applied

    def _applied_forces(self, t, q, v, motion):
        """`(Q, f_ext)`: the generalized forces of the force elements other than gravity
        (their potentials' gradients and their direct forces) and the spatial forces
        `(b, 6)` of their loads (or `None`)."""
        inputs = self._inputs(t, q, v)
        kin = TreeKinematics(self, t, q, v, inputs, motion)
        others = [f for f in self.forces if not isinstance(f, Gravity)]
        applied = jnp.zeros_like(q)
        if others:

            def potential(q_):
                inner = TreeKinematics(self, t, q_, None, inputs)
                return sum((f.potential_energy(inner) for f in others), jnp.zeros((), q.dtype))

            applied = applied - jax.grad(potential)(q)
        wrenches: dict[int, list] = {}
        for element in others:
            for load in element.loads(kin):
                position, _, _ = marker_on_body(self, load.at, q.dtype)
                if position < 0:
                    continue  # the ground takes it
                point = kin.frame(load.at).point
                wrenches.setdefault(position, []).append(
                    jnp.concatenate(
                        [load.torque + jnp.cross(point, load.force), load.force]
                    ).astype(q.dtype)
                )
            direct = element.generalized_forces(kin)
            if direct is not None:
                applied = applied + direct.astype(q.dtype)
        if not wrenches:
            return applied, None
        zero = jnp.zeros((6,), q.dtype)
        external = jnp.stack(
            [sum(wrenches[i], zero) if i in wrenches else zero for i in range(len(self.bodies))]
        )
        return applied, external

    def terms(self, t, q, v) -> ConstrainedTerms:
        motion = self._motion(q, v)
        rotations, centres, subspaces, velocities, _ = motion
        applied, external = self._applied_forces(t, q, v, motion)
        norm_tau, norm_energy = self._norm_terms(q, v)
        parts = self._inertias(rotations, centres)
        mass = self._crba(q, subspaces, parts)
        levels = self._levels()
        if levels is None:
            bias = self._newton_euler(q, motion, parts, external)
            # `M` factored here, where it is computed: the formulations' solves use the
            # factor (written out for small `M`, a loop fused with the rest of the
            # right-hand side up to `LOOPED_MAX`), not a library call of their own.
            factor = self._mass_factor(mass)
            # Where the pivots show `M` not positive definite, the factor and its solves
            # are not finite; `M` is made nan too, for solvers that factor it themselves
            # (generalized-α). Not the forces: the solves would wait for every pivot.
            mass = jnp.where(factor.positive_definite(), mass, jnp.nan)
        else:
            # A deep tree: the subtrees' sums of the bodies' forces and the articulated
            # inertias in one pass from the tips, `O(n)`; the dense `M` is left to the
            # callers that read it.
            factor, bias = articulated_factor(
                levels,
                self.topology.dofs,
                subspaces,
                inertia_matrices(parts),
                self._joint_inertias(q),
                self._body_forces(q, motion, parts, external),
            )
            # There the forces are nan instead: `D⁻¹` of a negative pivot is finite.
            bias = jnp.where(factor.positive_definite(), self._to_coordinates(bias), jnp.nan)
        # So a solve from or into an indefinite `M` stalls (`dt_min_reached`), and a traced
        # solve need not check `M` at `q0` (`factored_positive_definite`).
        forces = applied - bias - norm_tau
        kinetic = 0.5 * jnp.sum(velocities * apply_inertia(parts, velocities)) + norm_energy
        energy = kinetic + self.potential_energy(t, q, motion)
        if self.num_equations:
            phi, dphi, jacobian, gamma = holonomic_terms(self.constraints, t, q, v)
        else:
            phi = dphi = gamma = jnp.zeros((0,), q.dtype)
            jacobian = jnp.zeros((0, q.shape[0]), q.dtype)
        operator = FactoredOperator(
            lx.MatrixLinearOperator(mass, lx.positive_semidefinite_tag), factor
        )
        return cast_floating(
            ConstrainedTerms(
                mass,
                forces,
                phi,
                dphi,
                jnp.zeros((0,), q.dtype),
                jacobian,
                gamma,
                # The momenta `M v` come along (one product with the `M` computed here), so
                # that a solve's diagnostics do not trace the terms a second time for them.
                energy=energy,
                momenta=mass @ v,
                mass_operator=operator,
            ),
            q.dtype,
        )

    def potential_energy(self, t, q, motion=None) -> Float[Array, ""]:
        """The force elements' potential energy (gravity's included)."""
        kin = TreeKinematics(self, t, q, None, None, motion)
        return sum((f.potential_energy(kin) for f in self.forces), jnp.zeros((), q.dtype))

    def energy(self, t, q, v):
        return self.terms(t, q, v).energy

    def constraints(self, t, q):
        """The residuals of the loop-closing joints, in the order of `joints`, then the
        couplings', in the order of `couplings`."""
        if not self.num_equations:
            return jnp.zeros((0,), q.dtype)
        kin = TreeKinematics(self, t, q)
        parts = []
        for index in self.topology.closures:
            joint = self.joints[index]
            parts.append(
                jnp.asarray(
                    joint.residual(t, kin.frame(joint.a), kin.frame(joint.b)), q.dtype
                ).reshape(-1)
            )
        if self.couplings:
            parts.append(self._coupling_residuals(kin, q.dtype))
        return jnp.concatenate(parts)

    # -- the shared interface ----------------------------------------------------------

    def _kinematics(self, t, q, v=None, inputs=None) -> TreeKinematics:
        return TreeKinematics(self, t, q, v, inputs)

    def _unheld_coordinates(self) -> int:
        return sum(1 for kind in self.topology.kinds if kind != SCREW)

    def _wrapped_joints(self) -> tuple[str, ...]:
        return tuple(
            self.joint_names[i]
            for i in self.topology.closures
            if self.joints[i].coordinate_wraps(3)
        )

    def _driven(self, t0, q, v, held):
        """The tree joints named in `held` take their values and rates; where loops are
        closed or couplings tie joints, their equations are to hold with those
        coordinates."""
        for name, value, rate in zip(held.names, held.values, held.rates, strict=True):
            if name not in self.closure_joints:
                index = self.joint_slice(name).start
                q, v = q.at[index].set(value), v.at[index].set(rate)
        return q, v, Driven(self, held, t0) if self.num_equations else None


@functools.lru_cache(maxsize=64)
def _subtree_blocks(top: Topology) -> tuple[tuple[int, int], ...] | None:
    """The diagonal blocks of `M`, `(start, stop)` in `q`, of the subtrees hanging from the
    ground where there are several and each one's coordinates are contiguous in `q`, up to
    `LOOPED_MAX` coordinates in all; else `None`."""
    n = top.num_coordinates
    if n > _thresholds.LOOPED_MAX:
        return None
    root = list(range(len(top.parent)))
    for k in range(len(top.parent)):
        while top.parent[root[k]] >= 0:
            root[k] = top.parent[root[k]]
    subtree = np.full(n, -1)
    for k, dofs in enumerate(top.dofs):
        for j in dofs:
            if j < n:
                subtree[j] = root[k]
    cuts = [0] + [j for j in range(1, n) if subtree[j] != subtree[j - 1]] + [n]
    blocks = tuple(zip(cuts[:-1], cuts[1:], strict=True))
    if len(blocks) < 2 or len({subtree[start] for start, _ in blocks}) < len(blocks):
        return None
    return blocks
