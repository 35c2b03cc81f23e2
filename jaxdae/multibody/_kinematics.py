"""Markers at a configuration (what joints and force elements are written on), and the
rotations of planar and spatial bodies."""

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._gather import take
from .._custom_types import Array, ArrayLike, Float, ScalarLike


class Frame(NamedTuple):
    """A marker at a configuration, as joints and force elements see it.

    - `origin`: the body's centre of mass `r` (the origin for the ground), `(d,)`.
    - `angle`: a planar body's angle `θ` (0 for the ground); `None` in space.
    - `rotation`: the marker frame's orientation in the global frame, `(d, d)`: `R(θ)` in
        the plane; in space `R(p) A`, the body's rotation times the marker's orientation
        `A` on the body.
    - `point`: the marker in the global frame, `r + R s`, `(d,)`.
    """

    origin: Float[Array, " d"]
    angle: Float[Array, ""] | None
    rotation: Float[Array, "d d"]
    point: Float[Array, " d"]


def perpendicular(u):
    """`u` turned by +90°."""
    return jnp.stack([-u[1], u[0]])


def rotation(angle):
    c, s = jnp.cos(angle), jnp.sin(angle)
    return jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])


def turned(cos, sin, vectors):
    """`R(θ) s = cos θ s + sin θ s⊥` (`s⊥` the vector turned by +90°), for one vector (`cos`,
    `sin` scalars, `vectors` `(2,)`) or many (`(k, 1)`, `(k, 2)`).

    `Kinematics` computes the planar markers' points and arms so, not as products with
    the matrix `R(θ)` (elementwise and summed, or a batched matrix product), which XLA
    compiled into slower right-hand sides: with the matrix products the built slider-crank
    of `experiments/benchmarks/bench_multibody.py` solved as fast as the hand-written model written
    out (docs/benchmarks.md)."""
    normal = jnp.stack([-vectors[..., 1], vectors[..., 0]], axis=-1)
    return cos * vectors + sin * normal


def skew(w):
    """The matrix `w̃` with `w̃ x = w × x`."""
    zero = jnp.zeros((), w.dtype)
    return jnp.stack(
        [
            jnp.stack([zero, -w[2], w[1]]),
            jnp.stack([w[2], zero, -w[0]]),
            jnp.stack([-w[1], w[0], zero]),
        ]
    )


def euler_rotation(p):
    """The rotation matrix of the Euler parameters `p = (e₀, e)`:
    `R = (2e₀² − 1) I + 2 (e eᵀ + e₀ ẽ)` (Haug, *Computer Aided Kinematics and Dynamics of
    Mechanical Systems*, eq. 6.3.11)."""
    e0, e = p[0], p[1:]
    return (2 * e0**2 - 1) * jnp.eye(3, dtype=p.dtype) + 2 * (jnp.outer(e, e) + e0 * skew(e))


def global_map(p):
    """`E(p) = [−e, ẽ + e₀ I]`: the angular velocity in the global frame is `ω = 2 E ṗ`."""
    e0, e = p[0], p[1:]
    return jnp.concatenate([-e[:, None], skew(e) + e0 * jnp.eye(3, dtype=p.dtype)], axis=1)


def body_map(p):
    """`G(p) = [−e, −ẽ + e₀ I]`: the angular velocity in the body frame is `ω' = 2 G ṗ`."""
    e0, e = p[0], p[1:]
    return jnp.concatenate([-e[:, None], -skew(e) + e0 * jnp.eye(3, dtype=p.dtype)], axis=1)


def quaternion_from_matrix(matrix):
    """The Euler parameters (`e₀ ≥ 0`) of a rotation matrix, by Shepperd's method."""
    r = matrix
    trace = r[0, 0] + r[1, 1] + r[2, 2]
    candidates = jnp.stack(
        [
            jnp.stack([1 + trace, r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]]),
            jnp.stack(
                [
                    r[2, 1] - r[1, 2],
                    1 + r[0, 0] - r[1, 1] - r[2, 2],
                    r[0, 1] + r[1, 0],
                    r[0, 2] + r[2, 0],
                ]
            ),
            jnp.stack(
                [
                    r[0, 2] - r[2, 0],
                    r[0, 1] + r[1, 0],
                    1 - r[0, 0] + r[1, 1] - r[2, 2],
                    r[1, 2] + r[2, 1],
                ]
            ),
            jnp.stack(
                [
                    r[1, 0] - r[0, 1],
                    r[0, 2] + r[2, 0],
                    r[1, 2] + r[2, 1],
                    1 - r[0, 0] - r[1, 1] + r[2, 2],
                ]
            ),
        ]
    )
    k = jnp.argmax(jnp.diagonal(candidates))
    c = candidates[k]
    p = c / (2 * jnp.sqrt(c[k]))
    return jnp.where(p[0] < 0, -p, p)


def rotation_matrix(
    axis: Float[ArrayLike, "3"] | Sequence[ScalarLike], angle: ScalarLike
) -> Float[Array, "3 3"]:
    """The rotation by `angle` (radians, right-handed) about `axis` (normalized), by
    Rodrigues' formula: for marker orientations and a body's initial `orientation`.

    **Arguments:**

    - `axis`: `(3,)`, not zero.
    - `angle`: the angle in radians.

    **Returns:**

    The `(3, 3)` rotation matrix.
    """
    axis = jnp.asarray(axis, dtype=float)
    axis = axis / jnp.sqrt(axis @ axis)
    angle = jnp.asarray(angle, dtype=axis.dtype)
    k = skew(axis)
    return jnp.eye(3, dtype=axis.dtype) + jnp.sin(angle) * k + (1 - jnp.cos(angle)) * (k @ k)


def rpy_matrix(roll: ScalarLike, pitch: ScalarLike, yaw: ScalarLike) -> Float[Array, "3 3"]:
    """The rotation of roll, pitch and yaw angles as URDF defines them:
    `R_z(yaw) R_y(pitch) R_x(roll)` (fixed axes x, y, z in that order).

    **Returns:**

    The `(3, 3)` rotation matrix.
    """
    return (
        rotation_matrix((0.0, 0.0, 1.0), yaw)
        @ rotation_matrix((0.0, 1.0, 0.0), pitch)
        @ rotation_matrix((1.0, 0.0, 0.0), roll)
    )


def split(ref: str) -> tuple[str, str | None]:
    """`"body.marker"` → `("body", "marker")`, `"body"` → `("body", None)`."""
    body, _, marker = ref.partition(".")
    return body, (marker or None)


class Kinematics:
    """The bodies' poses (and velocities) at `(t, q, v)`, looked up by marker name.

    Built by [`jaxdae.multibody.Mechanism`][] inside its methods; `inputs` is the
    controller's output `u` there (empty where no element reads it). `frame` and `velocity`
    give one marker; `frames` and `velocities` give many at once, stacked along a leading
    axis, from the poses of all bodies computed together (what the groups of elements of
    one kind read); `coordinate` gives a joint's coordinate. In the plane a marker's point
    and arm are written out from `cos θ` and `sin θ` (`turned`), not as products with the
    matrix `R(θ)`.
    """

    def __init__(self, mechanism, t, q, v=None, inputs=None):
        self.mechanism, self.t, self.q, self.v, self.inputs = mechanism, t, q, v, inputs
        self.dimension = mechanism.dimension
        self._poses: dict[int, tuple[Array, Array]] = {}  # one pose per body in the trace
        self._all: tuple[Array, Array, Array] | None = None
        self._velocity_rows: Array | None = None
        # body name -> (slot, body); the ground's slot is -1. (A dict rather than calls of
        # the mechanism's methods, each of which flattens the mechanism while tracing.)
        self._bodies = {b.name: (i, b) for i, b in enumerate(mechanism.bodies)}
        self._bodies[mechanism.ground.name] = (-1, mechanism.ground)

    def body_coordinates(self, slot, x=None):
        start = self.mechanism.offsets[slot]
        x = self.q if x is None else x
        return x[start : start + self.mechanism.bodies[slot].num_coordinates]

    def pose(self, slot):
        """`(r, R)` of body `slot`: its centre of mass and rotation."""
        if slot not in self._poses:
            self._poses[slot] = self.mechanism.bodies[slot].pose(self.body_coordinates(slot))
        return self._poses[slot]

    def _local(self, ref):
        name, marker = split(ref)
        slot, body = self._bodies[name]
        d = self.dimension
        if marker is None:
            return slot, jnp.zeros((d,), self.q.dtype), None
        return slot, body.markers[marker], getattr(body, "orientations", {}).get(marker)

    def frame(self, ref: str) -> Frame:
        slot, s, orientation = self._local(ref)
        d, dtype = self.dimension, self.q.dtype
        if slot < 0:
            rot = jnp.eye(d, dtype=dtype) if orientation is None else orientation.astype(dtype)
            return Frame(
                jnp.zeros((d,), dtype),
                jnp.zeros((), dtype) if d == 2 else None,
                rot,
                s.astype(dtype),
            )
        if d == 2:
            qb = self.body_coordinates(slot)
            cos, sin = jnp.cos(qb[2]), jnp.sin(qb[2])
            rot = jnp.stack([jnp.stack([cos, -sin]), jnp.stack([sin, cos])])
            return Frame(qb[:2], qb[2], rot, qb[:2] + turned(cos, sin, s.astype(dtype)))
        r, rot = self.pose(slot)
        marker_rot = rot if orientation is None else rot @ orientation
        return Frame(r, None, marker_rot, r + rot @ s)

    def velocity(self, ref: str) -> tuple[Float[Array, " d"], Float[Array, "..."]]:
        """`(ṗ, ω)`: the marker's velocity and its body's angular velocity (a scalar `θ̇` in
        the plane, a vector in the global frame in space)."""
        slot, s, _ = self._local(ref)
        d, dtype = self.dimension, self.q.dtype
        if slot < 0:
            return jnp.zeros((d,), dtype), jnp.zeros(() if d == 2 else (3,), dtype)
        body = self.mechanism.bodies[slot]
        qb, vb = self.body_coordinates(slot), self.body_coordinates(slot, self.v)
        if d == 2:
            arm = turned(jnp.cos(qb[2]), jnp.sin(qb[2]), s.astype(dtype))
        else:
            arm = self.pose(slot)[1] @ s
        return body.point_velocity(qb, vb, arm), body.angular_velocity(qb, vb)

    def coordinate(self, name: str) -> Float[Array, ""] | None:
        """Joint `name`'s coordinate, as the joint measures it from its markers' frames."""
        joint = self.mechanism.joint(name)
        return joint.coordinate(self.frame(joint.a), self.frame(joint.b))

    # -- many markers at once --------------------------------------------------------------

    def _rows(self, x, ground):
        """`x` as one row per body after a first row `ground` (the ground's), `(bodies + 1,
        c)`: body `slot` is row `slot + 1`, the ground (slot −1) row 0."""
        bodies = self.mechanism.bodies
        rows = x.reshape(len(bodies), bodies[0].num_coordinates)
        return jnp.concatenate([jnp.asarray(ground, x.dtype)[None], rows])

    def _poses_all(self):
        """`(Q, r, R)`: every body's coordinates, centre of mass and rotation (rows as in
        `_rows`: the ground, at rest at the origin and unrotated, first). In the plane `R`
        is the pair `(cos θ, sin θ)`, `(bodies + 1, 1)` each (see `_rotations`)."""
        if self._all is None:
            body = self.mechanism.bodies[0]
            ground = np.zeros(body.num_coordinates)
            if self.dimension == 3:
                ground[3] = 1.0  # the Euler parameters of no rotation
                rows = self._rows(self.q, ground)
                r, rot = jax.vmap(body.pose)(rows)
            else:
                rows = self._rows(self.q, ground)
                r, rot = rows[:, :2], (jnp.cos(rows[:, 2:]), jnp.sin(rows[:, 2:]))
            self._all = (rows, r, rot)
        return self._all

    def _rotations(self, take, vectors):
        """The rotation matrices of the rows `take`, `(k, d, d)`, and the markers' arms
        `R s` for the body vectors `vectors`, `(k, d)`: in the plane written out from
        `cos θ` and `sin θ` (`turned`), in space a product with the matrices
        (`_apply`)."""
        rot = self._poses_all()[2]
        if self.dimension == 3:
            rot = take(rot)
            return rot, _apply(rot, vectors)
        c, s = take(rot[0]), take(rot[1])
        matrices = jnp.stack([jnp.concatenate([c, -s], -1), jnp.concatenate([s, c], -1)], -2)
        return matrices, turned(c, s, vectors)

    def centres(self) -> Float[Array, "bodies d"]:
        """The bodies' centres of mass, `(bodies, d)`."""
        return self._poses_all()[1][1:]

    def _locals(self, refs):
        """The rows of the markers' bodies (see `_rows`), the stacked marker points in body
        coordinates and the marker orientations (`None` where no marker has one)."""
        d = self.dimension
        index, points, orientations = [], [], []
        for ref in refs:
            name, marker = split(ref)
            slot, body = self._bodies[name]
            index.append(slot + 1)
            if marker is None:
                points.append(np.zeros(d))
                orientations.append(None)
            else:
                points.append(body.markers[marker])
                orientations.append(getattr(body, "orientations", {}).get(marker))
        if all(o is None for o in orientations):
            rotations = None
        else:
            rotations = jnp.stack([np.eye(d) if o is None else o for o in orientations])
        return _Rows(np.asarray(index, dtype=np.int64)), jnp.stack(points), rotations

    def frames(self, refs) -> Frame:
        """The [`jaxdae.multibody.Frame`][]s of the markers `refs`, stacked: each field
        with a leading axis of `len(refs)`."""
        take, s, orientations = self._locals(refs)
        rows, r, _ = self._poses_all()
        rot, arms = self._rotations(take, s.astype(rows.dtype))
        origin = take(r)
        point = origin + arms
        angle = take(rows[:, 2]) if self.dimension == 2 else None
        if orientations is not None:
            rot = jnp.sum(rot[:, :, :, None] * orientations.astype(rows.dtype)[:, None], axis=2)
        return Frame(origin, angle, rot, point)

    def velocities(self, refs) -> tuple[Float[Array, "k d"], Float[Array, "k ..."]]:
        """`(ṗ, ω)` of the markers `refs` (see `velocity`), stacked along a leading axis."""
        take, s, _ = self._locals(refs)
        rows = self._poses_all()[0]
        if self._velocity_rows is None:
            self._velocity_rows = self._rows(self.v, np.zeros(rows.shape[1]))
        body = self.mechanism.bodies[0]
        qb, vb = take(rows), take(self._velocity_rows)
        arm = self._rotations(take, s.astype(rows.dtype))[1]
        omega = jax.vmap(body.angular_velocity)(qb, vb)
        return jax.vmap(body.point_velocity)(qb, vb, arm), omega


def _apply(rotations, vectors):
    """`R_k s_k` for stacked spatial `(k, 3, 3)` rotations and `(k, 3)` vectors. Many
    markers take one batched matrix product, which makes XLA evaluate each rotation once
    (fused into an elementwise loop, the rotation's entries would be evaluated again for
    every entry that reads them); a few take elementwise products and a sum (a matrix
    product is a library call with a fixed cost on the CPU)."""
    if rotations.shape[0] > _BATCHED_PRODUCT_MIN:
        return jnp.einsum("kij,kj->ki", rotations, vectors)
    return jnp.sum(rotations * vectors[:, None, :], axis=-1)


_BATCHED_PRODUCT_MIN = 8


class _Rows:
    """Static row indices: `take(x)` is `x[index]`, a slice where they are consecutive (a
    chain's joints read consecutive bodies) and a gather otherwise (`_gather.take`, whose
    transpose is a gather too, not a scatter)."""

    def __init__(self, index: np.ndarray):
        self.index = index
        start = int(index[0]) if index.size else 0
        self.consecutive = bool(np.array_equal(index, start + np.arange(index.size)))
        self.start = start

    def __call__(self, x):
        if self.consecutive:
            return x[self.start : self.start + self.index.size]
        return take(x, self.index)


class ElementKinematics:
    """What one element of a group of force elements sees under `jax.vmap`: the frames
    (and velocities) of its own markers, looked up by the names of the group's first
    element (`roles`), and the mechanism's state."""

    def __init__(self, kin, roles, frames, velocities=None):
        self.mechanism, self.t, self.q, self.v = kin.mechanism, kin.t, kin.q, kin.v
        self.inputs, self.dimension = kin.inputs, kin.dimension
        self._frames = dict(zip(roles, frames, strict=True))
        self._velocities = None if velocities is None else dict(zip(roles, velocities, strict=True))

    def frame(self, ref):
        return self._frames[ref]

    def velocity(self, ref):
        return self._velocities[ref]
