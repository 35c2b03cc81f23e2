"""Markers in the plane at a configuration: what joints and force elements are written on."""

from typing import NamedTuple

import jax.numpy as jnp

from .._custom_types import Array, Float


class Frame(NamedTuple):
    """A marker at a configuration, as joints and force elements see it.

    - `origin`: the body's centre of mass `r` (the origin for the ground), `(2,)`.
    - `angle`: the body's angle `θ` (0 for the ground).
    - `rotation`: `R(θ)`, `(2, 2)`.
    - `point`: the marker in the plane, `r + R(θ) s`, `(2,)`.
    """

    origin: Float[Array, "2"]
    angle: Float[Array, ""]
    rotation: Float[Array, "2 2"]
    point: Float[Array, "2"]


def perpendicular(u):
    """`u` turned by +90°."""
    return jnp.stack([-u[1], u[0]])


def rotation(angle):
    c, s = jnp.cos(angle), jnp.sin(angle)
    return jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])


def split(ref: str) -> tuple[str, str | None]:
    """`"body.marker"` → `("body", "marker")`, `"body"` → `("body", None)`."""
    body, _, marker = ref.partition(".")
    return body, (marker or None)


class Kinematics:
    """The bodies' poses (and velocities) at `(t, q, v)`, looked up by marker name.

    Built by [`jaxdae.multibody.Mechanism`][] inside its methods; `inputs` is the
    controller's output `u` there (empty where no element reads it).
    """

    def __init__(self, mechanism, t, q, v=None, inputs=None):
        self.mechanism, self.t, self.q, self.v, self.inputs = mechanism, t, q, v, inputs
        self._rotations: dict[int, Array] = {}  # one rotation matrix per body in the trace

    def _rotation(self, slot):
        if slot not in self._rotations:
            self._rotations[slot] = rotation(self.q[3 * slot + 2])
        return self._rotations[slot]

    def _local(self, ref):
        name, marker = split(ref)
        body = self.mechanism.body(name)
        s = jnp.zeros((2,), self.q.dtype) if marker is None else body.markers[marker]
        return self.mechanism.slot(name), s

    def frame(self, ref: str) -> Frame:
        slot, s = self._local(ref)
        if slot < 0:
            zero = jnp.zeros((2,), self.q.dtype)
            return Frame(zero, jnp.zeros((), self.q.dtype), jnp.eye(2, dtype=self.q.dtype),
                         s.astype(self.q.dtype))
        r, angle = self.q[3 * slot : 3 * slot + 2], self.q[3 * slot + 2]
        rot = self._rotation(slot)
        return Frame(r, angle, rot, r + rot @ s)

    def velocity(self, ref: str) -> tuple[Float[Array, "2"], Float[Array, ""]]:
        """`(ṗ, θ̇)`: the marker's velocity in the plane and its body's angular velocity."""
        slot, s = self._local(ref)
        if slot < 0:
            return jnp.zeros((2,), self.q.dtype), jnp.zeros((), self.q.dtype)
        rdot, omega = self.v[3 * slot : 3 * slot + 2], self.v[3 * slot + 2]
        return rdot + omega * perpendicular(self._rotation(slot) @ s), omega

