"""Stops: the one-sided constraints of a mechanism (joint limits, contacts, distance stops).

Each stop gives gaps `g ≥ 0` of the mechanism's [`jaxdae.AbstractSystem.gaps`][] and their
coefficient of restitution: [`jaxdae.simulate`][] stops where one closes, applies Newton's
impact law and holds a gap at rest closed while it pushes ([`jaxdae.EventDriven`][]).
"""

import abc
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, ArrayLikeOrSequence, Float
from .._gains import is_concrete
from ._body import _check_element_dimension, _scalar, _vector
from ._kinematics import Frame, perpendicular


def _restitution(owner: str, value) -> Array:
    array = _scalar(f"`restitution` of {owner}", value)
    if is_concrete(array) and not 0.0 <= float(array) <= 1.0:
        raise ValueError(
            f"The `restitution` of {owner} must lie in [0, 1] (0: plastic, 1: "
            f"elastic impacts); got {float(array)}."
        )
    return array


def _bounds(owner: str, lower, upper, *, positive: bool = False):
    lower = None if lower is None else _scalar(f"`lower` of {owner}", lower)
    upper = None if upper is None else _scalar(f"`upper` of {owner}", upper)
    if lower is None and upper is None:
        raise ValueError(f"{owner} needs a `lower` or an `upper` bound (or both).")
    if (
        lower is not None
        and upper is not None
        and is_concrete(lower, upper)
        and float(lower) > float(upper)
    ):
        raise ValueError(
            f"The `lower` bound of {owner} exceeds its `upper` bound: "
            f"{float(lower)} > {float(upper)}; give the smaller as `lower`."
        )
    if positive and lower is not None and is_concrete(lower) and float(lower) < 0:
        raise ValueError(
            f"The `lower` bound of {owner} is a distance: it must be "
            f"non-negative; got {float(lower)}."
        )
    return lower, upper


class StopKinematics(eqx.Module):
    """What a stop reads of the mechanism at one configuration: `frame(marker)` (a
    [`jaxdae.multibody.Frame`][]), `coordinate(joint)`, a joint's coordinate,
    `velocity(marker)`: `(ṗ, ω)`, the marker's velocity and its body's angular velocity
    (for the slip velocities; the gaps are read without velocities), and the mechanism's
    `dimension` (2 or 3)."""

    frame: Callable[[str], Frame] = eqx.field(static=True)
    coordinate: Callable[[str], Array] = eqx.field(static=True)
    velocity: Callable[[str], tuple[Array, Array]] = eqx.field(static=True)
    dimension: int = eqx.field(static=True)


class AbstractStop(eqx.Module):
    """A one-sided constraint of a [`jaxdae.multibody.Mechanism`][]: `num_gaps` gaps
    `g ≥ 0` with one coefficient of restitution.

    Subclasses give `gaps(kin)` from the frames of their `markers` and the coordinates of
    their `joints`, and declare their vector fields as joints do (`vector_fields`).
    """

    name: eqx.AbstractVar[str | None]
    restitution: eqx.AbstractVar[Float[Array, ""]]
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)
    vector_fields: ClassVar[tuple[str, ...]] = ()

    @property
    def markers(self) -> tuple[str, ...]:
        """The markers whose frames it reads."""
        return ()

    @property
    def joints(self) -> tuple[str, ...]:
        """The joints (by name) whose coordinates it reads."""
        return ()

    @property
    @abc.abstractmethod
    def num_gaps(self) -> int:
        """How many gaps it has."""

    @property
    def gap_labels(self) -> tuple[str, ...]:
        """A label per gap, appended to its name in `Mechanism.gap_names` (none for one
        gap)."""
        return ("",) if self.num_gaps == 1 else tuple(str(k) for k in range(self.num_gaps))

    @abc.abstractmethod
    def gaps(self, kin: StopKinematics) -> Float[Array, " g"]:
        """Its gaps at one configuration, shape `(num_gaps,)`."""

    def friction_coefficients(self) -> Float[ArrayLike, " g"]:
        """Coulomb's coefficient of each gap's contact (default: frictionless). A NumPy
        array where they are known when the stop is made, so that a frictionless contact
        compiles no tangential rows even where the mechanism is built inside `jax.jit`."""
        return np.zeros((self.num_gaps,))

    def slip_velocities(self, kin: StopKinematics) -> Float[Array, "g k"]:
        """The sliding velocity of each gap's contact in its tangent line (the plane,
        `d − 1 = 1`) or plane (space, two orthonormal tangents), along which its friction
        acts, shape `(num_gaps, d − 1)` (default: zero, no sliding direction)."""
        return jnp.zeros((self.num_gaps, kin.dimension - 1))

    def check_dimension(self, dimension: int, owner: str) -> None:
        """Raise `ValueError` if it does not exist in a mechanism of `dimension`."""
        _check_element_dimension(
            self, dimension, owner, dict.fromkeys(self.vector_fields, (dimension,))
        )

    def value_checks(self) -> tuple[tuple[Array, str], ...]:
        """Its values' checks that hold where they are traced (concrete values are checked
        when it is made): pairs `(problem, rule)` as
        [`jaxdae.AbstractSystem.stop_checks`][], the rule naming the value. Default: none
        (its restitution and friction are checked as the mechanism's)."""
        return ()


class AbstractRangeStop(AbstractStop):
    """A stop that keeps a measured value `x` (a joint coordinate, a distance) within
    `lower ≤ x ≤ upper`: a gap per bound given, `x − lower` and `upper − x`, labelled
    `lower` and `upper`."""

    lower: eqx.AbstractVar[Float[Array, ""] | None]
    upper: eqx.AbstractVar[Float[Array, ""] | None]

    @abc.abstractmethod
    def measured(self, kin: StopKinematics) -> Float[Array, ""]:
        """The value the bounds limit."""

    def value_checks(self):
        if self.lower is None or self.upper is None:
            return ()
        return ((self.lower > self.upper, "its `lower` bound must not exceed its `upper` bound"),)

    @property
    def num_gaps(self):
        return len(self.gap_labels)

    @property
    def gap_labels(self):
        return tuple(
            side
            for side, bound in (("lower", self.lower), ("upper", self.upper))
            if bound is not None
        )

    def gaps(self, kin):
        value = self.measured(kin)
        return jnp.stack(
            ([] if self.lower is None else [value - self.lower])
            + ([] if self.upper is None else [self.upper - value])
        )


class JointLimit(AbstractRangeStop):
    """The range `lower ≤ θ ≤ upper` of a joint's coordinate (a revolute joint's angle, a
    prismatic joint's displacement; see [`jaxdae.multibody.Mechanism.joint_coordinates`][]):
    a gap per bound given, `θ − lower` and `upper − θ`.

    Where the mechanism measures the joint's angle in `(−π, π]` (a spatial revolute joint in
    a [`jaxdae.multibody.Mechanism`][], or one that closes a loop of a
    [`jaxdae.multibody.TreeMechanism`][]), the bounds must lie within `[−π, π]`: the
    mechanism refuses others, which the wrapping angle would never reach.

    **Arguments:**

    - `joint`: the joint's name; it must have a coordinate.
    - `lower`, `upper`: the bounds (rad or m); one may be `None`.
    - `restitution`: Newton's coefficient at the bounds, in `[0, 1]`. Default `0`: the
        joint stops dead at its limit and rests there while pushed against it.
    - `name`: the stop's name in outputs.
    """

    joint: str = eqx.field(static=True)
    lower: Float[Array, ""] | None
    upper: Float[Array, ""] | None
    restitution: Float[Array, ""]
    name: str | None = eqx.field(static=True)

    def __init__(
        self,
        joint: str,
        lower: ArrayLike | None = None,
        upper: ArrayLike | None = None,
        *,
        restitution: ArrayLike = 0.0,
        name: str | None = None,
    ):
        owner = f"the JointLimit of joint {joint!r}"
        self.joint, self.name = joint, name
        self.lower, self.upper = _bounds(owner, lower, upper)
        self.restitution = _restitution(owner, restitution)

    @property
    def joints(self):
        return (self.joint,)

    def measured(self, kin):
        return kin.coordinate(self.joint)


# A disc whose axis is within this angle (rad) of the plane's normal lies flat: the lowest
# point of its rim is undefined there (and its direction jumps near it).
_FLAT_SINE = 1e-6


class PlaneContact(AbstractStop):
    """A point (a sphere or a disc of `radius` about it) on one side of a plane (in space)
    or a line (in the plane) fixed on another body or the ground: the gap
    `n·(c − p₀)` of the contact point `c`, `n` the unit normal `normal` in the frame of
    marker `surface` (through its point `p₀`), pointing to the side where the point may be.

    The contact point is `c = p − radius u`: for a point or sphere (and a disc in the
    plane) `u = n`, so the gap is `n·(p − p₀) − radius`. A disc in space (a coin, a
    wheel: `axis` given) touches the plane at the lowest point of its rim, which moves
    around the rim as it rolls, leans and turns: `u = w/|w|`, `w = n − (n·a) a` the part of
    the normal perpendicular to the disc's unit axis `a`, and the gap is
    `n·(p − p₀) − radius |w|`. A disc that lies flat (`a ∥ n`, `|w| < 1e-6`) has no lowest
    point: the solve stops there with an error naming it (a coin that may land flat needs
    contacts on its faces, which this stop does not model).

    The contact may have Coulomb friction. At the contact point `c` the
    sphere's (disc's) material point slides on the surface at `v_T = T (v_c − v_s)`, `v_s`
    the velocity of the surface's material point at `c`: in the plane `T` is the normal
    turned by +90° (one slip velocity), in space the two orthonormal tangents `T = [t₁;
    t₂]` fixed on the surface (an isotropic cone: the friction force `λ_T` stays within
    `|λ_T| ≤ μ λ_N` and opposes the slip, `λ_T = −μ λ_N v_T/|v_T|` while it slides; see
    [`jaxdae.EventDriven`][]). Spin and rolling resistance (torques about the normal and
    against rolling, MuJoCo's `condim` 4 and 6) are not modelled: the sphere's spin about
    the normal and its rolling meet no resistance.

    **Arguments:**

    - `point`: the marker of the point (the sphere's centre).
    - `surface`: the marker on the plane or line. Default `"ground"`: the ground's origin.
    - `normal`: the surface's normal in `surface`'s frame, `(d,)`. Default: `+y` in the
        plane, `+z` in space.
    - `radius`: of the sphere or disc about `point`, non-negative. Default `0`.
    - `axis`: in space, the axis of a disc of `radius` about `point` (a thin disc, its
        rim's lowest point the contact), in `point`'s frame, `(3,)`, not zero. Default
        `None`: a sphere. In the plane a disc needs no axis (give none).
    - `restitution`: Newton's coefficient, in `[0, 1]`. Default `0`.
    - `friction`: Coulomb's coefficient `μ ≥ 0`. Default `0`. A known `0` makes the
        contact frictionless: it keeps no coefficient (`friction` is `None`) and compiles
        no tangential rows. To differentiate with respect to `μ` at `0`, give `μ` traced
        (an argument of the function that `jax.grad` differentiates).
    - `name`: the stop's name in outputs.
    """

    point: str = eqx.field(static=True)
    surface: str = eqx.field(static=True)
    normal: Float[Array, " d"] | None
    radius: Float[Array, ""]
    axis: Float[Array, "3"] | None
    restitution: Float[Array, ""]
    friction: Float[Array, ""] | None
    name: str | None = eqx.field(static=True)
    vector_fields: ClassVar[tuple[str, ...]] = ("normal",)

    def __init__(
        self,
        point: str,
        surface: str = "ground",
        normal: ArrayLikeOrSequence | None = None,
        *,
        radius: ArrayLike = 0.0,
        axis: ArrayLikeOrSequence | None = None,
        restitution: ArrayLike = 0.0,
        friction: ArrayLike = 0.0,
        name: str | None = None,
    ):
        owner = f"the PlaneContact of {point!r}"
        if point.partition(".")[0] == surface.partition(".")[0]:
            raise ValueError(
                f"The point {point!r} and the surface {surface!r} of {owner} are on one body, "
                "so its gap never changes; put the surface on another body or the ground."
            )
        self.point, self.surface, self.name = point, surface, name
        self.normal = (
            None if normal is None else _vector(f"`normal` of {owner}", normal, np.size(normal))
        )
        if (
            self.normal is not None
            and is_concrete(self.normal)
            and not np.any(np.asarray(self.normal))
        ):
            raise ValueError(
                f"The `normal` of {owner} is zero; give the direction the point stays on."
            )
        self.radius = _scalar(f"`radius` of {owner}", radius)
        if is_concrete(self.radius) and float(self.radius) < 0:
            raise ValueError(
                f"The `radius` of {owner} must be non-negative; got {float(self.radius)}."
            )
        self.axis = None if axis is None else _vector(f"`axis` of {owner}", axis, 3)
        if self.axis is not None and is_concrete(self.axis) and not np.any(np.asarray(self.axis)):
            raise ValueError(f"The `axis` of {owner} is zero; give the disc's axis.")
        self.restitution = _restitution(owner, restitution)
        coefficient = _scalar(f"`friction` of {owner}", friction)
        if is_concrete(friction) and float(friction) < 0:
            raise ValueError(
                f"The `friction` of {owner} must be non-negative (0: "
                f"frictionless); got {float(friction)}."
            )
        # A known zero is no coefficient at all (`None`): a frictionless contact then
        # compiles no tangential rows, also where the mechanism is built inside `jax.jit`
        # (where an array made from the zero would be traced).
        frictionless = is_concrete(friction) and float(friction) == 0
        self.friction = None if frictionless else coefficient

    @property
    def markers(self):
        return (self.point, self.surface)

    @property
    def num_gaps(self):
        return 1

    def value_checks(self):
        checks = ((self.radius < 0, "its `radius` must be non-negative"),)
        if self.axis is not None:
            checks += ((jnp.all(self.axis == 0), "its `axis` must not be zero"),)
        return checks

    def _normal(self, point: Frame, surface: Frame):
        dimension = point.point.shape[0]
        normal = (
            jnp.eye(dimension, dtype=point.point.dtype)[-1]
            if self.normal is None
            else self.normal.astype(point.point.dtype)
        )
        return surface.rotation @ (normal / jnp.linalg.norm(normal))

    def check_dimension(self, dimension, owner):
        if self.axis is not None and dimension != 3:
            raise ValueError(
                f"The {owner} has an `axis`, which only a disc in space has; in the plane "
                "a disc is its `radius` alone: leave `axis` out."
            )
        super().check_dimension(dimension, owner)

    def _contact(self, point: Frame, normal) -> Float[Array, " d"]:
        """The contact point `c = p − radius u` (`u = n`, or the unit part of `n`
        perpendicular to a disc's axis: its rim's lowest point)."""
        if self.axis is None:
            return point.point - self.radius * normal
        axis = point.rotation @ (self.axis / jnp.linalg.norm(self.axis)).astype(normal.dtype)
        down = normal - (normal @ axis) * axis
        size = down @ down
        flat = size < _FLAT_SINE**2
        down = down / jnp.sqrt(jnp.where(flat, 1.0, size))
        down = eqx.error_if(
            down,
            flat,
            f"The disc of the PlaneContact of {self.point!r} lies flat on its plane (its "
            "axis along the normal): the lowest point of its rim is undefined. Model a "
            "disc that may land flat with contacts on its faces.",
        )
        return point.point - self.radius * down

    def gaps(self, kin):
        point, surface = kin.frame(self.point), kin.frame(self.surface)
        normal = self._normal(point, surface)
        return (normal @ (self._contact(point, normal) - surface.point))[None]

    def friction_coefficients(self):
        return np.zeros((1,)) if self.friction is None else self.friction[None]

    def slip_velocities(self, kin):
        point, surface = kin.frame(self.point), kin.frame(self.surface)
        normal = self._normal(point, surface)
        # The material point of the sphere or disc at `c` (not the rate of `c(q)`, which
        # moves around a rolling disc's rim).
        contact = self._contact(point, normal)
        (point_velocity, point_spin), (surface_velocity, surface_spin) = (
            kin.velocity(self.point),
            kin.velocity(self.surface),
        )
        if kin.dimension == 2:
            on_point = point_velocity + point_spin * perpendicular(contact - point.point)
            on_surface = surface_velocity + surface_spin * perpendicular(contact - surface.point)
            return (perpendicular(normal) @ (on_point - on_surface))[None, None]
        on_point = point_velocity + jnp.cross(point_spin, contact - point.point)
        on_surface = surface_velocity + jnp.cross(surface_spin, contact - surface.point)
        return (self._tangents(surface) @ (on_point - on_surface))[None]

    def _tangents(self, surface: Frame) -> Float[Array, "2 3"]:
        """Two orthonormal tangents of the plane in space, fixed on the surface's frame
        (completed from the normal along the coordinate axis least aligned with it)."""
        dtype = surface.point.dtype
        normal = jnp.eye(3, dtype=dtype)[-1] if self.normal is None else self.normal.astype(dtype)
        normal = normal / jnp.linalg.norm(normal)
        axis = jnp.eye(3, dtype=dtype)[jnp.argmin(jnp.abs(normal))]
        first = jnp.cross(normal, axis)
        first = first / jnp.linalg.norm(first)
        return jnp.stack([first, jnp.cross(normal, first)]) @ surface.rotation.T


class DistanceStop(AbstractRangeStop):
    """Bounds on the distance `d = |p_b − p_a|` of two markers: `d ≥ lower` (two spheres
    that touch at `d = r_a + r_b`, the balls of Newton's cradle) and/or `d ≤ upper` (a
    rope or chain that goes taut), a gap per bound given.

    **Arguments:**

    - `a`, `b`: the markers.
    - `lower`, `upper`: the bounds, non-negative; one may be `None`.
    - `restitution`: Newton's coefficient, in `[0, 1]`. Default `0`.
    - `name`: the stop's name in outputs.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    lower: Float[Array, ""] | None
    upper: Float[Array, ""] | None
    restitution: Float[Array, ""]
    name: str | None = eqx.field(static=True)

    def __init__(
        self,
        a: str,
        b: str,
        lower: ArrayLike | None = None,
        upper: ArrayLike | None = None,
        *,
        restitution: ArrayLike = 0.0,
        name: str | None = None,
    ):
        owner = f"the DistanceStop of {a!r} and {b!r}"
        self.a, self.b, self.name = a, b, name
        self.lower, self.upper = _bounds(owner, lower, upper, positive=True)
        self.restitution = _restitution(owner, restitution)

    @property
    def markers(self):
        return (self.a, self.b)

    def value_checks(self):
        checks = super().value_checks()
        if self.lower is not None:
            checks += (
                (self.lower < 0, "its `lower` bound is a distance: it must be non-negative"),
            )
        return checks

    def measured(self, kin):
        offset = kin.frame(self.b).point - kin.frame(self.a).point
        return jnp.sqrt(offset @ offset)
