"""Planar joints: holonomic constraints between two markers."""

import abc
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, Float
from .._gains import is_concrete
from ._body import _scalar, _vector
from ._kinematics import Frame, perpendicular


def _unit(u):
    return u / jnp.sqrt(u @ u)


class AbstractJoint(eqx.Module):
    """A joint between the marker `a` of one body and the marker `b` of another.

    `a` and `b` name markers as `"body.marker"`, or a body alone (its centre of mass, the
    origin for `"ground"`). A joint contributes `num_equations` holonomic constraints to
    the [`jaxdae.multibody.Mechanism`][] and, if it has one, a joint coordinate (the
    relative angle of a revolute joint, the displacement of a prismatic one).

    Subclasses define `residual(t, a, b)` (and `coordinate(a, b)`) on the two markers'
    [`jaxdae.multibody.Frame`][]s.
    """

    a: eqx.AbstractVar[str]
    b: eqx.AbstractVar[str]
    name: eqx.AbstractVar[str | None]
    num_equations: ClassVar[int]

    @abc.abstractmethod
    def residual(self, t: Float[Array, ""], a: Frame, b: Frame) -> Float[Array, " m"]:
        """The constraint residual at time `t`, shape `(num_equations,)`."""

    def coordinate(self, a: Frame, b: Frame) -> Float[Array, ""] | None:
        """The joint coordinate, or `None` for a joint without one."""
        return None


def _check_length(length):
    if is_concrete(length) and not (np.isfinite(length) and length > 0):
        raise ValueError(f"A Distance joint needs a positive finite `length`; got {float(length)}.")


def _ref(value, which: str) -> str:
    if not isinstance(value, str):
        raise ValueError(
            f"Joint marker `{which}` must be a string, 'body' or 'body.marker'; got {value!r}."
        )
    return value


class Revolute(AbstractJoint):
    """A pin joint: markers `a` and `b` coincide, the bodies turn freely (2 equations).

    `Φ = p_b − p_a`. Joint coordinate: the relative angle `θ_b − θ_a`.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 2

    def __init__(self, a: str, b: str, *, name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name

    def residual(self, t, a, b):
        return b.point - a.point

    def coordinate(self, a, b):
        return b.angle - a.angle


class Prismatic(AbstractJoint):
    """A translational joint: marker `b` slides along the line through marker `a` in the
    direction `axis` (fixed on `a`'s body), and the bodies keep their relative angle
    (2 equations).

    `Φ = (n·(p_b − p_a), θ_b − θ_a − angle)`, `n ⟂ R(θ_a) axis`. Joint coordinate: the
    displacement `u·(p_b − p_a)` along the unit axis `u`.

    **Arguments:**

    - `a`, `b`: the markers.
    - `axis`: direction of the sliding in body `a`'s coordinates (normalized). Default x.
    - `angle`: the relative angle `θ_b − θ_a` the joint keeps. Default 0.
    - `name`: the joint's name in outputs.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    axis: Float[Array, "2"]
    angle: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 2

    def __init__(self, a: str, b: str, axis: ArrayLike = (1.0, 0.0), *, angle: ArrayLike = 0.0,
                 name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name
        self.axis = _vector("`axis` of a Prismatic joint", axis, 2)
        self.angle = _scalar("`angle` of a Prismatic joint", angle)

    def residual(self, t, a, b):
        u = _unit(a.rotation @ self.axis)
        return jnp.stack([perpendicular(u) @ (b.point - a.point), b.angle - a.angle - self.angle])

    def coordinate(self, a, b):
        return _unit(a.rotation @ self.axis) @ (b.point - a.point)


class Fixed(AbstractJoint):
    """A weld: markers `a` and `b` coincide and the relative angle is fixed (3 equations).

    `Φ = (p_b − p_a, θ_b − θ_a − angle)`.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    angle: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 3

    def __init__(self, a: str, b: str, *, angle: ArrayLike = 0.0, name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name
        self.angle = _scalar("`angle` of a Fixed joint", angle)

    def residual(self, t, a, b):
        return jnp.concatenate([b.point - a.point, (b.angle - a.angle - self.angle)[None]])


class Distance(AbstractJoint):
    """A massless link of length `L` between markers `a` and `b` (1 equation).

    `Φ = (|p_b − p_a|² − L²) / (2L)`: smooth everywhere, in units of length, and equal to
    `|p_b − p_a| − L` to first order on the constraint.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    length: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 1

    def __init__(self, a: str, b: str, length: ArrayLike, *, name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name
        self.length = _scalar("`length` of a Distance joint", length)

    def __check_init__(self):
        _check_length(self.length)

    def residual(self, t, a, b):
        d = b.point - a.point
        return ((d @ d - self.length**2) / (2 * self.length))[None]


class PointOnLine(AbstractJoint):
    """Marker `b` stays on the line through marker `a` along `axis` (fixed on `a`'s body);
    the bodies turn freely (1 equation).

    `Φ = n·(p_b − p_a)`, `n ⟂ R(θ_a) axis`. Joint coordinate: the position `u·(p_b − p_a)`
    along the unit axis `u`.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    axis: Float[Array, "2"]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 1

    def __init__(self, a: str, b: str, axis: ArrayLike = (1.0, 0.0), *, name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name
        self.axis = _vector("`axis` of a PointOnLine joint", axis, 2)

    def residual(self, t, a, b):
        u = _unit(a.rotation @ self.axis)
        return (perpendicular(u) @ (b.point - a.point))[None]

    def coordinate(self, a, b):
        return _unit(a.rotation @ self.axis) @ (b.point - a.point)


class Gear(AbstractJoint):
    """A gear pair (or belt): `θ_b = ratio · θ_a + offset` (1 equation).

    The angles are the bodies' absolute angles (0 for the ground); markers only name the
    bodies. A negative `ratio` is an external gear pair (`ratio = −r_a / r_b`), a positive
    one an internal gear or a belt. The bodies' pivots are separate joints.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    ratio: Float[Array, ""]
    offset: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 1

    def __init__(self, a: str, b: str, ratio: ArrayLike, *, offset: ArrayLike = 0.0,
                 name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name
        self.ratio = _scalar("`ratio` of a Gear", ratio)
        self.offset = _scalar("`offset` of a Gear", offset)

    def residual(self, t, a, b):
        return (b.angle - self.ratio * a.angle - self.offset)[None]


class Driver(AbstractJoint):
    """Prescribed motion: marker `b` follows marker `a` along a given path,
    `p_b − p_a = motion(t)` in the global frame (2 rheonomic equations).

    A trajectory to track (paper 004's two-link arm, whose tip follows a point moving along
    a line), or a kinematic input. The bodies turn freely.

    **Arguments:**

    - `a`, `b`: the markers.
    - `motion`: a function `t -> (2,)`; an `eqx.Module` with array fields makes its
        parameters differentiable leaves of the mechanism.
    - `name`: the joint's name in outputs.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    motion: Callable
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 2

    def __init__(self, a: str, b: str, motion: Callable, *, name: str | None = None):
        self.a, self.b, self.name = _ref(a, "a"), _ref(b, "b"), name
        if not callable(motion):
            raise ValueError(
                f"`motion` of a Driver must be a function t -> (2,); got {type(motion).__name__}."
            )
        self.motion = motion

    def residual(self, t, a, b):
        return b.point - a.point - jnp.asarray(self.motion(t), b.point.dtype).reshape(2)
