"""Joints: holonomic constraints between two markers, in the plane and in space.

The spatial joints are the standard constraints of Haug's *Computer Aided Kinematics and
Dynamics of Mechanical Systems* (ch. 9) written on marker frames: a point coincidence
(spherical), "dot-1" conditions that keep an axis of one frame perpendicular to axes of the
other (revolute, cylindrical, universal), "dot-2" conditions that keep the vector between the
markers perpendicular to an axis (prismatic, cylindrical, point-on-line), and a locked
relative orientation (fixed, prismatic).
"""

import abc
import functools
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, ArrayLikeOrSequence, Float
from .._gains import is_concrete
from ._body import _check_element_dimension, _optional_vector, _scalar, _vector
from ._kinematics import Frame, perpendicular


def _unit(u):
    return u / jnp.sqrt(u @ u)


def _owner(kind: str, a, b, name) -> str:
    """How errors name a joint: its class, its `name` if given, and its markers."""
    label = f" {name!r}" if name is not None else ""
    return f"the {kind} joint{label} between {a!r} and {b!r}"


def _nonzero(owner: str, field: str, axis: Array, example: str) -> Array:
    """`axis`, a joint's direction `field`; `ValueError` where it is (concretely) zero."""
    if is_concrete(axis) and not np.any(np.asarray(axis)):
        raise ValueError(
            f"The `{field}` of {owner} is zero: it needs a direction to turn "
            f"about or move along, e.g. {field}={example}."
        )
    return axis


def _joint_axis(owner: str, field: str, value, sizes=(2, 3), example="(0, 0, 1)") -> Array | None:
    """A joint's optional direction `field` (`None` where not given): finite, nonzero."""
    axis = _optional_vector(f"`{field}` of {owner}", value, sizes)
    return None if axis is None else _nonzero(owner, field, axis, example)


class AbstractJoint(eqx.Module):
    """A joint between the marker `a` of one body and the marker `b` of another.

    `a` and `b` name markers as `"body.marker"`, or a body alone (its centre of mass, the
    origin for `"ground"`). A joint contributes `num_equations` holonomic constraints to
    the [`jaxdae.multibody.Mechanism`][] and, if it has one, a joint coordinate (the
    relative angle of a revolute joint, the displacement of a prismatic one).

    The base holds the marker names `a` and `b` (static fields, first among a joint's
    fields) and checks them. Subclasses declare `name`, their parameters and
    `num_equations`, and define `residual(t, a, b)` (and, with
    `has_coordinate`, `coordinate(a, b)`) on the two markers'
    [`jaxdae.multibody.Frame`][]s. A joint that exists in the plane and in space (revolute,
    prismatic, fixed, distance, point-on-line, driver) lists both in `dimensions` and says
    how many equations it has in each with `equations(dimension)`.

    A mechanism evaluates the joints of one class with equal static fields (other than the
    marker names `a`, `b` and `name`) and array parameters of equal shapes together, under
    `jax.vmap` over their stacked parameters: `residual` reads the time, the two frames and
    the joint's parameters, not the marker names. A joint with a parameter that is not an
    array (a Python function) is evaluated alone.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    name: eqx.AbstractVar[str | None]
    num_equations: eqx.AbstractClassVar[int]
    dimensions: ClassVar[tuple[int, ...]] = (2,)
    has_coordinate: ClassVar[bool] = False
    """Whether `coordinate` gives the joint's coordinate (else it returns `None`)."""

    def equations(self, dimension: int) -> int:
        """The number of constraint equations in a planar (2) or spatial (3) mechanism."""
        return self.num_equations

    vector_fields: ClassVar[tuple[str, ...]] = ()
    """The fields that hold a vector of the mechanism's dimension (or `None`)."""
    planar_fields: ClassVar[tuple[str, ...]] = ()
    """The scalar fields for planar mechanisms only (zero in space)."""

    def __check_init__(self):
        for which in ("a", "b"):
            if not isinstance(getattr(self, which), str):
                raise ValueError(
                    f"Joint marker `{which}` must be a string, 'body' or "
                    f"'body.marker'; got {getattr(self, which)!r}."
                )

    def check_dimension(self, dimension: int, owner: str) -> None:
        """Raise `ValueError` if the joint does not exist in a mechanism of `dimension`."""
        _check_element_dimension(
            self, dimension, owner, dict.fromkeys(self.vector_fields, (dimension,))
        )
        for field in self.planar_fields:
            value = getattr(self, field)
            if dimension == 3 and is_concrete(value) and float(value) != 0.0:
                raise ValueError(
                    f"`{field}` of the {owner} is for planar mechanisms; in space give the "
                    "markers orientations (`orientations=` of the bodies) instead."
                )

    @abc.abstractmethod
    def residual(self, t: Float[Array, ""], a: Frame, b: Frame) -> Float[Array, " m"]:
        """The constraint residual at time `t`, shape `(num_equations,)`."""

    def coordinate(self, a: Frame, b: Frame) -> Float[Array, ""] | None:
        """The joint coordinate, or `None` for a joint without one (a joint with one sets
        `has_coordinate`)."""
        return None

    def coordinate_wraps(self, dimension: int) -> bool:
        """Whether `coordinate` in a mechanism of `dimension` is an angle measured in
        `(−π, π]` from the markers' frames, which jumps by `2π` where the joint turns past
        `±π` (a spatial revolute joint's). Default `False`."""
        return False


def axis_basis(u):
    """`(û, w₁, w₂)`: the unit axis and two unit vectors completing a right-handed frame."""
    u = _unit(u)
    helper = jnp.eye(3, dtype=u.dtype)[jnp.argmin(jnp.abs(u))]
    w1 = _unit(helper - (helper @ u) * u)
    return u, w1, jnp.cross(u, w1)


def locked_orientation(a, b, angle):
    """Zero when the marker frames keep their relative orientation: `θ_b − θ_a − angle` in
    the plane (1 equation); in space, where they are parallel, the skew part of `A_aᵀ A_b`
    (3 equations)."""
    if a.point.shape[0] == 2:
        return (b.angle - a.angle - angle)[None]
    c = a.rotation.T @ b.rotation
    return 0.5 * jnp.stack([c[2, 1] - c[1, 2], c[0, 2] - c[2, 0], c[1, 0] - c[0, 1]])


def on_axis(a, b, axis):
    """Zero when marker `b` is on the line through `a` along `axis` (in `a`'s frame): `n·d`,
    `n ⟂ R(θ_a) axis`, in the plane (1 equation); `d` perpendicular to `A_a w₁`, `A_a w₂`
    in space (2 equations); `d = p_b − p_a`."""
    d = b.point - a.point
    if d.shape[0] == 2:
        return (perpendicular(_unit(a.rotation @ axis)) @ d)[None]
    _, w1, w2 = axis_basis(axis)
    return jnp.stack([(a.rotation @ w1) @ d, (a.rotation @ w2) @ d])


def along_axis(a, b, axis):
    """The position `u·(p_b − p_a)` of marker `b` along the unit `axis` `u` (in `a`'s frame)."""
    return _unit(a.rotation @ axis) @ (b.point - a.point)


def _x_unless_given(axis, a):
    """`axis`, or the unit x vector in the dimension of the frame `a` where it is `None`."""
    return jnp.eye(a.point.shape[0], dtype=a.point.dtype)[0] if axis is None else axis


def aligned_axes(a, b, axis):
    """Zero when both frames' `axis` coincide in direction (2 dot-1 equations)."""
    u, w1, w2 = axis_basis(axis)
    ua = a.rotation @ u
    return jnp.stack([ua @ (b.rotation @ w1), ua @ (b.rotation @ w2)])


class AbstractAxisJoint(AbstractJoint):
    """A joint about or along an optional `axis` fixed in its marker frames, with a joint
    coordinate ([`jaxdae.multibody.Revolute`][], [`jaxdae.multibody.PointOnLine`][]): it
    holds the axis and the name and checks the axis at construction (finite, nonzero, of
    one of the sizes `axis_sizes`; the error shows `axis_example`). `None`: the class's
    default axis, in the dimension of the mechanism."""

    axis: Float[Array, " d"] | None
    name: str | None = eqx.field(static=True)
    has_coordinate: ClassVar[bool] = True
    vector_fields: ClassVar[tuple[str, ...]] = ("axis",)
    axis_sizes: eqx.AbstractClassVar[tuple[int, ...]]
    axis_example: eqx.AbstractClassVar[str]

    def __init__(
        self, a: str, b: str, axis: ArrayLikeOrSequence | None = None, *, name: str | None = None
    ):
        self.a, self.b, self.name = a, b, name
        self.axis = _joint_axis(
            _owner(type(self).__name__, a, b, name),
            "axis",
            axis,
            self.axis_sizes,
            self.axis_example,
        )


class Revolute(AbstractAxisJoint):
    """A pin (hinge) joint: markers `a` and `b` coincide and the bodies turn about one axis.

    In the plane (2 equations): `Φ = p_b − p_a`; joint coordinate: the relative angle
    `θ_b − θ_a`. In space (5 equations): the points coincide and the hinge axis `u`, the
    same vector in both marker frames, stays common: `Φ = (p_b − p_a, (A_a u)·(A_b w₁),
    (A_a u)·(A_b w₂))`, `w₁, w₂ ⟂ u` (Haug's dot-1 conditions); joint coordinate: the angle
    in `(−π, π]` that turns `A_a w₁` into `A_b w₁` about `A_a u`.

    **Arguments:**

    - `a`, `b`: the markers.
    - `axis`: (spatial) the hinge axis in the marker frames, `(3,)`. Default z.
    - `name`: the joint's name in outputs.
    """

    num_equations: ClassVar[int] = 2
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)
    axis_sizes: ClassVar[tuple[int, ...]] = (3,)
    axis_example: ClassVar[str] = "(0, 0, 1)"

    def equations(self, dimension):
        return 2 if dimension == 2 else 5

    def check_dimension(self, dimension, owner):
        if dimension == 2 and self.axis is not None:
            raise ValueError(f"The {owner} is planar: it turns about z and takes no `axis`.")
        super().check_dimension(dimension, owner)

    def _axis(self, dtype):
        return jnp.array([0.0, 0.0, 1.0], dtype) if self.axis is None else self.axis

    def residual(self, t, a, b):
        if a.point.shape[0] == 2:
            return b.point - a.point
        return jnp.concatenate([b.point - a.point, aligned_axes(a, b, self._axis(a.point.dtype))])

    def coordinate_wraps(self, dimension):
        return dimension == 3

    def coordinate(self, a, b):
        if a.angle is not None:
            return b.angle - a.angle
        u, w1, _ = axis_basis(self._axis(a.point.dtype))
        ua, xa, xb = a.rotation @ u, a.rotation @ w1, b.rotation @ w1
        return jnp.arctan2(jnp.cross(xa, xb) @ ua, xa @ xb)


class Prismatic(AbstractJoint):
    """A translational joint: marker `b` slides along the line through marker `a` in the
    direction `axis` (fixed on `a`'s frame), and the bodies keep their relative orientation.

    In the plane (2 equations): `Φ = (n·(p_b − p_a), θ_b − θ_a − angle)`, `n ⟂ R(θ_a) axis`.
    In space (5 equations): `p_b − p_a` stays perpendicular to `A_a w₁` and `A_a w₂`
    (`w₁, w₂ ⟂ axis`) and the marker frames stay parallel. Joint coordinate: the
    displacement `u·(p_b − p_a)` along the unit axis `u`.

    **Arguments:**

    - `a`, `b`: the markers.
    - `axis`: direction of the sliding in marker `a`'s frame (normalized), `(2,)` or `(3,)`.
        Default x.
    - `angle`: (planar) the relative angle `θ_b − θ_a` the joint keeps. Default 0.
    - `name`: the joint's name in outputs.
    """

    axis: Float[Array, " d"] | None
    angle: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 2
    has_coordinate: ClassVar[bool] = True
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)
    vector_fields: ClassVar[tuple[str, ...]] = ("axis",)
    planar_fields: ClassVar[tuple[str, ...]] = ("angle",)

    def __init__(
        self,
        a: str,
        b: str,
        axis: ArrayLikeOrSequence | None = None,
        *,
        angle: ArrayLike = 0.0,
        name: str | None = None,
    ):
        self.a, self.b, self.name = a, b, name
        owner = _owner("Prismatic", a, b, name)
        self.axis = _joint_axis(owner, "axis", axis, example="(1, 0, 0)")
        self.angle = _scalar(f"`angle` of {owner}", angle)

    def equations(self, dimension):
        return 2 if dimension == 2 else 5

    def residual(self, t, a, b):
        line = on_axis(a, b, _x_unless_given(self.axis, a))
        return jnp.concatenate([line, locked_orientation(a, b, self.angle)])

    def coordinate(self, a, b):
        return along_axis(a, b, _x_unless_given(self.axis, a))


class Fixed(AbstractJoint):
    """A weld: markers `a` and `b` coincide and their frames keep their relative orientation.

    In the plane (3 equations): `Φ = (p_b − p_a, θ_b − θ_a − angle)`. In space
    (6 equations): `p_b − p_a` and the skew part of `A_aᵀ A_b` (the marker frames are
    parallel; give the markers `orientations` for a weld at an angle).

    **Arguments:**

    - `a`, `b`: the markers.
    - `angle`: (planar) the relative angle `θ_b − θ_a` it keeps. Default 0.
    - `name`: the joint's name in outputs.
    """

    angle: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 3
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)
    planar_fields: ClassVar[tuple[str, ...]] = ("angle",)

    def __init__(self, a: str, b: str, *, angle: ArrayLike = 0.0, name: str | None = None):
        self.a, self.b, self.name = a, b, name
        self.angle = _scalar(f"`angle` of {_owner('Fixed', a, b, name)}", angle)

    def equations(self, dimension):
        return 3 if dimension == 2 else 6

    def residual(self, t, a, b):
        return jnp.concatenate([b.point - a.point, locked_orientation(a, b, self.angle)])


class Distance(AbstractJoint):
    """A massless link of length `L` between markers `a` and `b` (1 equation).

    `Φ = (|p_b − p_a|² − L²) / (2L)`: smooth everywhere, in units of length, and equal to
    `|p_b − p_a| − L` to first order on the constraint. The same in the plane and in space.
    """

    length: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 1
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)

    def __init__(self, a: str, b: str, length: ArrayLike, *, name: str | None = None):
        self.a, self.b, self.name = a, b, name
        owner = _owner("Distance", a, b, name)
        self.length = _scalar(f"`length` of {owner}", length)
        if is_concrete(self.length) and not self.length > 0:
            raise ValueError(
                f"{owner[0].upper()}{owner[1:]} needs a positive finite "
                f"`length`; got {float(self.length)}."
            )

    def residual(self, t, a, b):
        d = b.point - a.point
        return ((d @ d - self.length**2) / (2 * self.length))[None]


class PointOnLine(AbstractAxisJoint):
    """Marker `b` stays on the line through marker `a` along `axis` (fixed on `a`'s frame);
    the bodies turn freely (1 equation in the plane, 2 in space).

    Plane: `Φ = n·(p_b − p_a)`, `n ⟂ R(θ_a) axis`; space: `p_b − p_a` perpendicular to
    `A_a w₁`, `A_a w₂` (`w₁, w₂ ⟂ axis`). Joint coordinate: the position `u·(p_b − p_a)`
    along the unit axis `u`.

    **Arguments:**

    - `a`, `b`: the markers.
    - `axis`: the line's direction in marker `a`'s frame, `(2,)` or `(3,)`. Default x.
    - `name`: the joint's name in outputs.
    """

    num_equations: ClassVar[int] = 1
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)
    axis_sizes: ClassVar[tuple[int, ...]] = (2, 3)
    axis_example: ClassVar[str] = "(1, 0, 0)"

    def equations(self, dimension):
        return dimension - 1

    def residual(self, t, a, b):
        return on_axis(a, b, _x_unless_given(self.axis, a))

    def coordinate(self, a, b):
        return along_axis(a, b, _x_unless_given(self.axis, a))


class Gear(AbstractJoint):
    """A gear pair (or belt): `θ_b = ratio · θ_a + offset` (1 equation).

    The angles are the bodies' absolute angles (0 for the ground); markers only name the
    bodies. A negative `ratio` is an external gear pair (`ratio = −r_a / r_b`), a positive
    one an internal gear or a belt. The bodies' pivots are separate joints.
    """

    ratio: Float[Array, ""]
    offset: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 1

    def __init__(
        self, a: str, b: str, ratio: ArrayLike, *, offset: ArrayLike = 0.0, name: str | None = None
    ):
        self.a, self.b, self.name = a, b, name
        owner = _owner("Gear", a, b, name)
        self.ratio = _scalar(f"`ratio` of {owner}", ratio)
        self.offset = _scalar(f"`offset` of {owner}", offset)

    def residual(self, t, a, b):
        return (b.angle - self.ratio * a.angle - self.offset)[None]


class Rolling(AbstractJoint):
    """A disc rolling without slipping along a line on another body (rack and pinion; a
    ball on a beam): 2 equations, planar.

    The disc's centre, marker `b`, stays on the line through marker `a` along `axis`
    (fixed on `a`'s body), and the disc turns by the distance it travels over its radius:

        n·(p_b − p_a) = 0,    radius (θ_b − θ_a) + u·(p_b − p_a) = offset,

    `u = R(θ_a) axis / |axis|`, `n` = `u` turned by +90°. The disc rolls on the side of
    `+n` (on top of a line along x): moving forward along `u` turns it clockwise relative
    to body `a`. Place marker `a` on the line the centre follows (a rolling surface's
    offset by the radius). Joint coordinate: the position `u·(p_b − p_a)` along the line.

    **Arguments:**

    - `a`: the marker whose line the disc follows.
    - `b`: the disc's centre (its body's angle is the disc's angle).
    - `radius`: the rolling radius, positive.
    - `axis`: the line's direction in `a`'s body frame, `(2,)`. Default x.
    - `offset`: the constant of the rolling equation, usually `radius (θ_b − θ_a) +
        u·(p_b − p_a)` at the start (default 0).
    - `name`: the joint's name in outputs.

    **Raises:**

    `ValueError` for a radius that is not positive and finite.
    """

    radius: Float[Array, ""]
    axis: Float[Array, " d"] | None
    offset: Float[Array, ""]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 2
    has_coordinate: ClassVar[bool] = True
    vector_fields: ClassVar[tuple[str, ...]] = ("axis",)

    def __init__(
        self,
        a: str,
        b: str,
        radius: ArrayLike,
        axis: ArrayLikeOrSequence | None = None,
        *,
        offset: ArrayLike = 0.0,
        name: str | None = None,
    ):
        self.a, self.b, self.name = a, b, name
        owner = _owner("Rolling", a, b, name)
        self.radius = _scalar(f"`radius` of {owner}", radius)
        self.axis = _joint_axis(owner, "axis", axis, (2,), example="(1, 0)")
        self.offset = _scalar(f"`offset` of {owner}", offset)
        if is_concrete(self.radius) and not self.radius > 0:
            raise ValueError(
                f"{owner[0].upper()}{owner[1:]} needs a positive finite "
                f"`radius`; got {float(self.radius)}."
            )

    def _direction(self, a):
        return _unit(a.rotation @ _x_unless_given(self.axis, a))

    def residual(self, t, a, b):
        u = self._direction(a)
        d = b.point - a.point
        return jnp.stack(
            [perpendicular(u) @ d, self.radius * (b.angle - a.angle) + u @ d - self.offset]
        )

    def coordinate(self, a, b):
        return self._direction(a) @ (b.point - a.point)


class Driver(AbstractJoint):
    """Prescribed motion: marker `b` follows marker `a` along a given path,
    `p_b − p_a = motion(t)` in the global frame (2 rheonomic equations; 3 in space).

    A trajectory to track (Mukharlyamov and Deressa's (2015) two-link arm, whose tip follows a point
    moving along a line), or a kinematic input. The bodies turn freely.

    **Arguments:**

    - `a`, `b`: the markers.
    - `motion`: a function `t -> (d,)`; an `eqx.Module` with array fields makes its
        parameters differentiable leaves of the mechanism.
    - `name`: the joint's name in outputs.
    """

    motion: Callable
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 2
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)

    def equations(self, dimension):
        return dimension

    def __init__(self, a: str, b: str, motion: Callable, *, name: str | None = None):
        self.a, self.b, self.name = a, b, name
        if not callable(motion):
            raise ValueError(
                f"`motion` of a Driver must be a function t -> (d,); got {type(motion).__name__}."
            )
        self.motion = motion

    def _check_motion(self, shape, dimension, owner):
        if tuple(shape) not in ((dimension,), (1, dimension), (dimension, 1)):
            raise ValueError(
                f"`motion` of the {owner} returns shape {tuple(shape)}: a Driver's motion is "
                f"the offset p_b − p_a, a vector of {dimension} numbers in this "
                f"{'planar' if dimension == 2 else 'spatial'} mechanism."
            )

    def check_dimension(self, dimension, owner):
        super().check_dimension(dimension, owner)
        try:
            shape = jax.eval_shape(lambda t: jnp.asarray(self.motion(t)), jnp.zeros(())).shape
        except Exception:  # noqa: BLE001 (a motion not traceable alone is checked in `residual`)
            return
        self._check_motion(shape, dimension, owner)

    def residual(self, t, a, b):
        d = b.point.shape[0]
        motion = jnp.asarray(self.motion(t), b.point.dtype)
        name = "Driver" if self.name is None else f"Driver {self.name!r}"
        self._check_motion(motion.shape, d, f"{name} between {self.a!r} and {self.b!r}")
        return b.point - a.point - motion.reshape(d)


class Spherical(AbstractJoint):
    """A ball joint: markers `a` and `b` coincide, the bodies turn freely (3 equations,
    spatial). `Φ = p_b − p_a`."""

    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 3
    dimensions: ClassVar[tuple[int, ...]] = (3,)

    def __init__(self, a: str, b: str, *, name: str | None = None):
        self.a, self.b, self.name = a, b, name

    def residual(self, t, a, b):
        return b.point - a.point


class Universal(AbstractJoint):
    """A Hooke (cardan) joint: markers `a` and `b` coincide and the cross's two axes, `axis_a`
    on marker `a`'s frame and `axis_b` on marker `b`'s, stay perpendicular (4 equations,
    spatial). `Φ = (p_b − p_a, (A_a axis_a)·(A_b axis_b))`.

    **Arguments:**

    - `a`, `b`: the markers.
    - `axis_a`, `axis_b`: the cross's axes in the two marker frames, `(3,)`. Default x and y.
    - `name`: the joint's name in outputs.
    """

    axis_a: Float[Array, "3"]
    axis_b: Float[Array, "3"]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 4
    dimensions: ClassVar[tuple[int, ...]] = (3,)
    vector_fields: ClassVar[tuple[str, ...]] = ("axis_a", "axis_b")

    def __init__(
        self,
        a: str,
        b: str,
        axis_a: ArrayLikeOrSequence = (1.0, 0.0, 0.0),
        axis_b: ArrayLikeOrSequence = (0.0, 1.0, 0.0),
        *,
        name: str | None = None,
    ):
        self.a, self.b, self.name = a, b, name
        owner = _owner("Universal", a, b, name)
        self.axis_a = _nonzero(
            owner, "axis_a", _vector(f"`axis_a` of {owner}", axis_a, 3), "(1, 0, 0)"
        )
        self.axis_b = _nonzero(
            owner, "axis_b", _vector(f"`axis_b` of {owner}", axis_b, 3), "(0, 1, 0)"
        )

    def residual(self, t, a, b):
        cross = (a.rotation @ _unit(self.axis_a)) @ (b.rotation @ _unit(self.axis_b))
        return jnp.concatenate([b.point - a.point, cross[None]])


class Cylindrical(AbstractJoint):
    """Marker `b` slides along and turns about the axis of marker `a` (4 equations, spatial):
    `p_b − p_a` is perpendicular to `A_a w₁`, `A_a w₂` and the frames' `axis` stay common
    (`w₁, w₂ ⟂ axis`). Joint coordinate: the displacement `u·(p_b − p_a)` along the axis.

    **Arguments:**

    - `a`, `b`: the markers.
    - `axis`: the axis in the marker frames, `(3,)`. Default z.
    - `name`: the joint's name in outputs.
    """

    axis: Float[Array, "3"]
    name: str | None = eqx.field(static=True)
    num_equations: ClassVar[int] = 4
    has_coordinate: ClassVar[bool] = True
    dimensions: ClassVar[tuple[int, ...]] = (3,)
    vector_fields: ClassVar[tuple[str, ...]] = ("axis",)

    def __init__(
        self,
        a: str,
        b: str,
        axis: ArrayLikeOrSequence = (0.0, 0.0, 1.0),
        *,
        name: str | None = None,
    ):
        self.a, self.b, self.name = a, b, name
        owner = _owner("Cylindrical", a, b, name)
        self.axis = _nonzero(owner, "axis", _vector(f"`axis` of {owner}", axis, 3), "(0, 0, 1)")

    def residual(self, t, a, b):
        return jnp.concatenate([on_axis(a, b, self.axis), aligned_axes(a, b, self.axis)])

    def coordinate(self, a, b):
        return along_axis(a, b, self.axis)


# -- the joints that carry a body in a tree ----------------------------------------------


class ScrewMotion(eqx.Module):
    """How a tree joint with at most one coordinate `θ` moves its body relative to its
    parent: a turn by `turn · θ` about `axis` and a slide by `slide · θ` along it, `axis`
    a unit vector in the marker frames (which coincide at `θ = 0`). A revolute joint turns
    (`turn = 1`, `slide = 0`), a prismatic one slides, a fixed one does neither and has no
    coordinate.

    **Fields:**

    - `axis`: `(3,)`, the direction (normalized where it is used).
    - `turn`, `slide`: Python floats, radians and length per unit of the coordinate.
    """

    axis: Float[Array, "3"]
    turn: float = eqx.field(static=True)
    slide: float = eqx.field(static=True)

    @property
    def num_coordinates(self) -> int:
        """1, or 0 for a joint that neither turns nor slides."""
        return int(self.turn != 0.0 or self.slide != 0.0)


class SphericalMotion(eqx.Module):
    """How a ball joint moves its body relative to its parent: a free rotation about the
    coinciding markers, as relative Euler parameters (4 coordinates)."""


@functools.singledispatch
def tree_motion(joint: AbstractJoint) -> ScrewMotion | SphericalMotion | None:
    """How `joint` carries a body in a [`jaxdae.multibody.TreeMechanism`][]: a
    [`ScrewMotion`][jaxdae.extend.ScrewMotion] or a
    [`SphericalMotion`][jaxdae.extend.SphericalMotion], or None for a joint that only
    closes loops (its residuals become constraints, as in a
    [`jaxdae.multibody.Mechanism`][]).

    Dispatched on the type of `joint` (`functools.singledispatch`), so that a joint of one's
    own that moves as a screw or a ball registers itself:

    ```python
    @jaxdae.extend.tree_motion.register
    def _(joint: MyHinge):
        return jaxdae.extend.ScrewMotion(joint.axis, turn=1.0, slide=0.0)
    ```

    Registered: [`jaxdae.multibody.Revolute`][], [`jaxdae.multibody.Prismatic`][],
    [`jaxdae.multibody.Fixed`][] (screws) and [`jaxdae.multibody.Spherical`][].
    """
    del joint
    return None


@tree_motion.register
def _revolute(joint: Revolute) -> ScrewMotion:
    axis = jnp.array([0.0, 0.0, 1.0]) if joint.axis is None else joint.axis
    return ScrewMotion(axis, turn=1.0, slide=0.0)


@tree_motion.register
def _prismatic(joint: Prismatic) -> ScrewMotion:
    axis = jnp.array([1.0, 0.0, 0.0]) if joint.axis is None else joint.axis
    return ScrewMotion(axis, turn=0.0, slide=1.0)


@tree_motion.register
def _fixed(joint: Fixed) -> ScrewMotion:
    return ScrewMotion(jnp.array([1.0, 0.0, 0.0]), turn=0.0, slide=0.0)


@tree_motion.register
def _spherical(joint: Spherical) -> SphericalMotion:
    del joint
    return SphericalMotion()
