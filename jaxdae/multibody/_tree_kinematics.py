"""What the joints, force elements and stops of a [`jaxdae.multibody.TreeMechanism`][] read
of it at one state: its markers' frames and velocities and its joint coordinates; and the
rows of its contacts that a time step reads, from those frames and velocities."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._gather import take
from .._custom_types import Array, Float
from ._body import GROUND
from ._kinematics import Frame, euler_rotation, split
from ._spatial import mat_mul, skew_matrices

# The `mechanism` arguments below are `TreeMechanism`s, typed `Any`: `_tree.py` imports
# this module, which must not import it back.


def marker_on_body(mechanism: Any, ref: str, dtype):
    """`(body position or −1, point, orientation)` of a marker on its body.

    A function rather than a method: each lookup of a method on an equinox module builds a
    bound method, which flattens the whole mechanism, and the traced equations look up two
    markers per joint."""
    name, marker = split(ref)
    eye = jnp.asarray(np.eye(3), dtype)
    if name == GROUND:
        owner, position = mechanism.ground, -1
    else:
        index = mechanism.body_names.index(name)
        owner, position = mechanism.bodies[index], mechanism.topology.order.index(index)
    if marker is None:
        return position, jnp.zeros((3,), dtype), eye
    rotation = owner.orientations.get(marker)
    return (
        position,
        owner.markers[marker].astype(dtype),
        eye if rotation is None else rotation.astype(dtype),
    )


class TreeKinematics:
    """The markers of a [`jaxdae.multibody.TreeMechanism`][] at `(t, q, v)`, as joints,
    force elements and stops read them (the interface of
    [`jaxdae.multibody.Kinematics`][]): `frame`, `velocity`, `frames`, `velocities`,
    `centres` and `coordinate`."""

    def __init__(self, mechanism: Any, t, q, v=None, inputs=None, motion=None):
        self.mechanism, self.t, self.q, self.v, self.inputs = mechanism, t, q, v, inputs
        self.dimension = 3
        self._motion = motion

    def _state(self):
        if self._motion is None:
            if self.v is None:
                rotations, centres, subspaces = self.mechanism.poses(self.q)
                self._motion = (rotations, centres, subspaces, None, None)
            else:
                self._motion = self.mechanism._motion(self.q, self.v)
        return self._motion

    def frame(self, ref: str) -> Frame:
        position, point, orientation = marker_on_body(self.mechanism, ref, self.q.dtype)
        if position < 0:
            return Frame(jnp.zeros((3,), self.q.dtype), None, orientation, point)
        rotations, centres = self._state()[:2]
        rotation, centre = rotations[position], centres[position]
        return Frame(centre, None, rotation @ orientation, centre + rotation @ point)

    def velocity(self, ref: str) -> tuple[Float[Array, " 3"], Float[Array, " 3"]]:
        """`(ṗ, ω)`: the marker's velocity and its body's angular velocity."""
        position, _, _ = marker_on_body(self.mechanism, ref, self.q.dtype)
        if position < 0:
            zero = jnp.zeros((3,), self.q.dtype)
            return zero, zero
        if self.v is None:
            raise ValueError("Marker velocities need the velocities `v`.")
        velocities = self._state()[3]
        omega, origin = velocities[position, :3], velocities[position, 3:]
        return origin + jnp.cross(omega, self.frame(ref).point), omega

    def frames(self, refs) -> Frame:
        frames = [self.frame(ref) for ref in refs]
        return Frame(*(None if f[0] is None else jnp.stack(f) for f in zip(*frames, strict=True)))

    def velocities(self, refs):
        pairs = [self.velocity(ref) for ref in refs]
        return jnp.stack([p[0] for p in pairs]), jnp.stack([p[1] for p in pairs])

    def centres(self) -> Float[Array, "bodies 3"]:
        """The bodies' centres of mass in the order of `bodies`."""
        order = np.asarray(self.mechanism.topology.order)
        return take(self._state()[1], np.argsort(order))

    def coordinate(self, name: str) -> Float[Array, ""]:
        """Joint `name`'s coordinate."""
        mechanism = self.mechanism
        joint = mechanism.joint(name)
        if not joint.has_coordinate:
            raise ValueError(f"Joint {name!r} has no joint coordinate.")
        if name in mechanism.closure_joints:
            return joint.coordinate(self.frame(joint.a), self.frame(joint.b))
        return self.q[mechanism.joint_slice(name).start]


def given_frame(mechanism: Any, ref: str) -> Frame:
    """The frame of marker `ref` with its body at its given `position` and `orientation`."""
    position, point, orientation = marker_on_body(mechanism, ref, jnp.result_type(float))
    if position < 0:
        return Frame(jnp.zeros_like(point), None, orientation, point)
    body = mechanism.bodies[mechanism.topology.order[position]]
    rotation = euler_rotation(body.orientation.astype(point.dtype))
    centre = body.position.astype(point.dtype)
    return Frame(centre, None, rotation @ orientation, centre + rotation @ point)


def body_jacobians(mechanism: Any, subspaces) -> Float[Array, "b 6 n"]:
    """Each body's spatial velocity `(ω, v_O)` per unit rate of each coordinate: the subspace
    `S_j` of each coordinate whose body lies on its path from the ground, zero for the
    others."""
    columns, body = mechanism._columns(subspaces)
    on_path = np.asarray(mechanism.topology.ancestors)[body].T
    return jnp.asarray(on_path, columns.dtype)[:, None, :] * columns.T[None]


def tree_contact_rows(mechanism: Any, t, q, v, friction):
    """The gaps, the contact velocities `[ġ; v_T]` and their rows `[W; W_T]` of a tree's
    stops (at least one) at `(t, q, v)`, as `AbstractSystem._contact_rows` returns them.

    The stops read the frames of markers and joint coordinates, so a gap's row is its
    derivative with respect to a small twist of each body (reverse mode through the stops
    alone) times the bodies' Jacobians, plus its derivative with respect to the
    coordinates read directly; a slip's is its derivative with respect to the bodies'
    spatial velocities times the same Jacobians. The default's forward mode carries
    `n + 1` tangents through the whole forward kinematics instead. A tree's stops read no
    time: `ġ = W v`."""
    dtype = q.dtype
    rotations, centres, subspaces = mechanism.poses(q)
    jacobians = body_jacobians(mechanism, subspaces)

    def gaps(twists, shift):
        turn, move = twists[:, :3], twists[:, 3:]
        moved = (
            rotations + mat_mul(skew_matrices(turn), rotations),
            centres + move + jnp.cross(turn, centres),
            subspaces,
            None,
            None,
        )
        return mechanism._stop_gaps(TreeKinematics(mechanism, t, q + shift, motion=moved))

    gap, pull = jax.vjp(gaps, jnp.zeros((rotations.shape[0], 6), dtype), jnp.zeros_like(q))
    by_twist, by_coordinate = jax.vmap(pull)(jnp.eye(gap.shape[0], dtype=dtype))
    jacobian = jnp.einsum("ubk,bkn->un", by_twist, jacobians) + by_coordinate
    rate = jacobian @ v
    if friction.shape[0] == 0:
        return gap, rate, jacobian

    def slips(velocities):
        motion = (rotations, centres, subspaces, velocities, None)
        kin = TreeKinematics(mechanism, t, q, v, motion=motion)
        return mechanism._stop_slips(kin, dtype).reshape(-1)

    slip, pull = jax.vjp(slips, jnp.einsum("bkn,n->bk", jacobians, v))
    (by_velocity,) = jax.vmap(pull)(jnp.eye(slip.shape[0], dtype=dtype))
    slip_jacobian = jnp.einsum("fbk,bkn->fn", by_velocity, jacobians)
    return gap, jnp.concatenate([rate, slip]), jnp.concatenate([jacobian, slip_jacobian])
