"""Rigid bodies (planar and spatial) and the ground, with their markers.

Each body class also says how its coordinates describe it (`pose`, velocities, kinetic
energy, its own constraints) and how a force at a point enters its generalized forces, so
that [`jaxdae.multibody.Mechanism`][] is written once for both.
"""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, ArrayLikeOrSequence, Float
from .._gains import is_concrete
from ._kinematics import (
    body_map,
    euler_rotation,
    global_map,
    perpendicular,
    quaternion_from_matrix,
    rotation,
)

GROUND = "ground"


def _array(name: str, value) -> Array:
    """`value` as a floating-point array; `ValueError` naming `name` where it is not numbers
    or (concretely) not finite."""
    try:
        array = jnp.asarray(value)
    except TypeError as error:
        raise ValueError(
            f"{name} must be a number or an array of numbers; got {value!r}."
        ) from error
    array = array if jnp.issubdtype(array.dtype, jnp.inexact) else array.astype(float)
    if is_concrete(array) and not np.all(np.isfinite(np.asarray(array))):
        raise ValueError(
            f"{name} must be finite; got {np.asarray(array).tolist()}. Give "
            "finite numbers (leave an optional value out rather than nan or inf)."
        )
    return array


def _vector(name: str, value, size: int) -> Array:
    array = _array(name, value)
    if array.shape != (size,):
        raise ValueError(f"{name} must be a vector of {size} numbers; got shape {array.shape}.")
    return array


def _optional_vector(name: str, value, sizes=(2, 3)) -> Array | None:
    """`value` as a vector of one of `sizes` numbers, or `None`."""
    if value is None:
        return None
    array = _array(name, value)
    if array.ndim != 1 or array.shape[0] not in sizes:
        raise ValueError(
            f"{name} must be a vector of {' or '.join(map(str, sizes))} numbers; "
            f"got shape {array.shape}."
        )
    return array


def _scalar(name: str, value) -> Array:
    array = _array(name, value)
    if array.shape != ():
        raise ValueError(f"{name} must be a scalar; got shape {array.shape}.")
    return array


def _check_element_dimension(
    element, dimension: int, owner: str, vectors: dict[str, tuple[int, ...]]
) -> None:
    """Raise `ValueError` if `element` (a joint or a force element) does not exist in a
    mechanism of `dimension` (its `dimensions`), or if one of its `vectors` (field name ->
    the shape it needs there; `None` values are not given) has another shape."""
    if dimension not in element.dimensions:
        kind = {2: "planar", 3: "spatial"}
        raise ValueError(
            f"The {owner} is a {type(element).__name__}, which is "
            f"{' and '.join(kind[d] for d in element.dimensions)} only; this mechanism is "
            f"{kind[dimension]}."
        )
    for field, shape in vectors.items():
        value = getattr(element, field)
        if value is not None and eqx.is_array(value) and value.shape != shape:
            raise ValueError(
                f"`{field}` of the {owner} has shape {value.shape}; in this "
                f"{dimension}-D mechanism it needs {shape}."
            )


def _moving_body_name(name) -> str:
    """`name`, checked as the name of a body that moves (not the ground's)."""
    name = _check_name("body", name)
    if name == GROUND:
        raise ValueError(
            f"{GROUND!r} names the fixed frame; give the moving body another name (use "
            "`jaxdae.multibody.Ground(markers=...)` to put markers on the ground)."
        )
    return name


def _check_name(kind: str, name) -> str:
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(
            f"A {kind} name must be a non-empty string without '.' (markers are named "
            f"'body.marker'); got {name!r}."
        )
    return name


def _markers(owner: str, markers, sizes=(2,)) -> dict[str, Array]:
    if markers is None:
        return {}
    if not isinstance(markers, dict):
        example = "(0.5, 0.0)" if sizes == (2,) else "(0.5, 0.0, 0.0)"
        raise ValueError(
            f"`markers` of {owner!r} must be a dict from marker names to points in body "
            f"coordinates, e.g. {{'tip': {example}}}; got {type(markers).__name__}."
        )
    out = {}
    for key, value in markers.items():
        array = _array(f"Marker {owner}.{key}", value)
        if array.ndim != 1 or array.shape[0] not in sizes:
            size = " or ".join(str(n) for n in sizes)
            raise ValueError(
                f"Marker {owner}.{key} must be a vector of {size} numbers; got shape {array.shape}."
            )
        out[_check_name("marker", key)] = array
    return out


def _orientations(owner: str, orientations, markers) -> dict[str, Array]:
    """Marker orientations: 3×3 rotation matrices (marker frame → body frame)."""
    if orientations is None:
        return {}
    if not isinstance(orientations, dict):
        raise ValueError(
            f"`orientations` of {owner!r} must be a dict from marker names to 3×3 rotation "
            f"matrices; got {type(orientations).__name__}."
        )
    out = {}
    for key, value in orientations.items():
        if key not in markers:
            raise ValueError(
                f"`orientations` of {owner!r} names marker {key!r}, which is not in its "
                f"`markers` ({sorted(markers) or 'none'}); add the marker's position there."
            )
        what = f"The orientation of marker {owner}.{key}"
        array = _array(what, value)
        if array.shape != (3, 3):
            raise ValueError(f"{what} must be a 3×3 rotation matrix; got shape {array.shape}.")
        _check_rotation(what, array)
        out[key] = array
    return out


def _check_rotation(what: str, array, atol: float = 1e-6) -> None:
    """Raise `ValueError` where the concrete 3×3 `array` is not a rotation matrix to `atol`."""
    if not is_concrete(array):
        return
    a = np.asarray(array, dtype=float)
    error = np.abs(a.T @ a - np.eye(3)).max()
    if not (error <= atol and np.linalg.det(a) > 0):
        raise ValueError(
            f"{what} is not a rotation matrix (orthonormal, determinant +1): |AᵀA − I| = "
            f"{error:.3g}, det A = {np.linalg.det(a):.6g}. Build one with "
            "`jaxdae.multibody.rotation_matrix(axis, angle)` or `rpy_matrix`."
        )


def _body_orientation(name: str, orientation) -> Array:
    """A body's `orientation` as unit Euler parameters: from a rotation matrix (checked to
    1e-6), or from Euler parameters (4,) of any nonzero norm (normalized)."""
    what = f"`orientation` of body {name!r}"
    if orientation is None:
        return jnp.array([1.0, 0.0, 0.0, 0.0])
    value = _array(what, orientation)
    if value.shape == (3, 3):
        _check_rotation(f"The {what}", value)
        return quaternion_from_matrix(value)
    if value.shape == (4,):
        if is_concrete(value) and not np.any(np.asarray(value)):
            raise ValueError(
                f"The {what} is the zero quaternion, which is no rotation; give "
                "Euler parameters (e0, e1, e2, e3) of a rotation, e.g. "
                "(1, 0, 0, 0) for the global axes."
            )
        return value / jnp.sqrt(value @ value)
    raise ValueError(
        f"The {what} must be a 3×3 rotation matrix or Euler parameters (4,); "
        f"got shape {value.shape}."
    )


class PlanarBody(eqx.Module):
    """A planar rigid body, described by the absolute coordinates `(x, y, θ)` of its centre
    of mass and its orientation.

    A point fixed on the body at `s` (body coordinates, from the centre of mass) is at
    `r + R(θ) s` in the plane, `R(θ)` the rotation by `θ`. Joints and force elements attach
    to *markers*: named points on a body, referred to as `"body.marker"`; the body's name
    alone refers to its centre of mass.

    **Arguments:**

    - `name`: a unique name (no `.`).
    - `mass`: `m ≥ 0`.
    - `inertia`: moment of inertia about the centre of mass, `I ≥ 0`. Zero mass or inertia
        (a massless beam or lever) is allowed where the joints hold the body in the
        directions it lacks them: [`jaxdae.multibody.Mechanism`][] checks this and keeps
        its mass matrix positive definite (see `Mechanism.kinetic_energy`).
    - `markers`: dict from marker names to points `(sx, sy)` in body coordinates.
    - `position`, `angle`: the pose `(x, y)`, `θ` used as the initial guess of
        [`jaxdae.multibody.Mechanism.initial_state`][] (it need not satisfy the joints).

    Every number is a JAX array, so `eqx.filter_grad` reaches `mass`, `inertia`, the marker
    positions and the pose.

    **Raises:**

    `ValueError` for a name with a `.`, a mass or inertia that is negative or not finite,
    or a marker that is not a point of the plane.
    """

    name: str = eqx.field(static=True)
    mass: Float[Array, ""]
    inertia: Float[Array, ""]
    markers: dict[str, Float[Array, "2"]]
    position: Float[Array, "2"]
    angle: Float[Array, ""]

    def __init__(
        self,
        name: str,
        mass: ArrayLike,
        inertia: ArrayLike,
        markers=None,
        *,
        position: ArrayLikeOrSequence = (0.0, 0.0),
        angle: ArrayLike = 0.0,
    ):
        self.name = _moving_body_name(name)
        self.mass = _scalar(f"`mass` of body {name!r}", mass)
        self.inertia = _scalar(f"`inertia` of body {name!r}", inertia)
        self.markers = _markers(name, markers)
        self.position = _vector(f"`position` of body {name!r}", position, 2)
        self.angle = _scalar(f"`angle` of body {name!r}", angle)

    def __check_init__(self):
        for field, what in (("mass", "mass"), ("inertia", "moment of inertia")):
            value = getattr(self, field)
            if is_concrete(value) and not (np.isfinite(value) and value >= 0):
                raise ValueError(
                    f"Body {self.name!r} has {field} {float(value)}: a planar rigid body needs "
                    f"a finite, non-negative {what} (positive where it can move freely)."
                )

    @property
    def massless(self) -> bool:
        """Whether the body has (concretely) zero mass or zero moment of inertia: allowed
        only where its joints hold it (see [`jaxdae.multibody.Mechanism`][])."""
        return any(is_concrete(x) and float(x) == 0.0 for x in (self.mass, self.inertia))

    # -- what the mechanism needs (body coordinates qb = (x, y, θ)) ----------------------

    dimension: ClassVar[int] = 2
    num_coordinates: ClassVar[int] = 3
    num_own_constraints: ClassVar[int] = 0
    coordinate_labels: ClassVar[tuple[str, ...]] = ("x", "y", "theta")

    def reference_coordinates(self):
        return jnp.concatenate([self.position, self.angle[None]])

    def pose(self, qb):
        return qb[:2], rotation(qb[2])

    def angular_velocity(self, qb, vb):
        return vb[2]

    def point_velocity(self, qb, vb, arm):
        return vb[:2] + vb[2] * perpendicular(arm)

    def mass_diagonal(self):
        return jnp.stack([self.mass, self.mass, self.inertia])

    def mass_matrix(self, qb):
        return jnp.diag(self.mass_diagonal().astype(qb.dtype))

    def kinetic_energy(self, qb, vb):
        return 0.5 * jnp.sum(self.mass_diagonal() * vb**2)

    def constraints(self, qb):
        return jnp.zeros((0,), qb.dtype)

    def generalized_load(self, qb, arm, force, torque):
        """The generalized force of `force` at `r + arm` and a `torque`."""
        return jnp.concatenate([force, (arm[0] * force[1] - arm[1] * force[0] + torque)[None]])

    def wrench(self, qb, load):
        """`(force, moment about the centre of mass)` of a generalized force."""
        return load[:2], load[2]


def _inertia_tensor(name, value) -> Array:
    array = _array(f"`inertia` of body {name!r}", value)
    if array.shape == ():
        array = array * jnp.ones((3,), array.dtype)
    if array.shape == (3,):
        array = jnp.diag(array)
    if array.shape != (3, 3):
        raise ValueError(
            f"`inertia` of body {name!r} must be the 3×3 inertia tensor about the centre of "
            f"mass, its principal moments (3,), or one number; got shape {array.shape}."
        )
    return array


class RigidBody(eqx.Module):
    """A spatial rigid body: the position `r` of its centre of mass and the Euler
    parameters `p = (e₀, e₁, e₂, e₃)` (a unit quaternion) of its orientation, seven
    coordinates with one holonomic constraint of its own, `(pᵀp − 1)/2 = 0`.

    A point fixed on the body at `s` (body coordinates, from the centre of mass) is at
    `r + R(p) s`, `R(p) = (2e₀² − 1) I + 2(e eᵀ + e₀ ẽ)`. Markers are frames: a position and,
    optionally, an orientation `A` (marker axes in body coordinates); spatial joints are
    written on the marker frames (a revolute joint turns about the markers' common `axis`).

    The kinetic energy is `½ m |ṙ|² + 2 ṗᵀ Gᵀ J G ṗ` (`ω' = 2 G(p) ṗ`, `J` the inertia
    tensor in body axes) plus `½ k (pᵀṗ)²` with `k = 4 tr(J)/3`: the last term vanishes
    wherever the norm constraint holds, so the motion is unchanged, but it makes the mass
    matrix positive definite (the rotational block alone is singular along `p`), so every
    formulation that solves with `M` works (Nikravesh's modified mass matrix).

    **Arguments:**

    - `name`: a unique name (no `.`).
    - `mass`: `m > 0`.
    - `inertia`: the inertia tensor about the centre of mass in body axes, `(3, 3)`, or its
        principal moments `(3,)`: symmetric, positive definite, and its principal moments
        obey the triangle inequality `J₁ + J₂ ≥ J₃` (any rigid mass distribution does).
    - `markers`: dict from marker names to points `(sx, sy, sz)` in body coordinates.
    - `orientations`: dict from marker names to `(3, 3)` rotation matrices (marker axes in
        body coordinates); markers not named have the body's axes.
    - `position`, `orientation`: the pose used as the initial guess of
        [`jaxdae.multibody.Mechanism.initial_state`][]: a point `(3,)` and a rotation
        matrix `(3, 3)` (orthonormal with determinant +1, to `1e-6`) or Euler parameters
        `(4,)` (normalized; not zero). Default: the origin, the global axes.

    **Raises:**

    `ValueError` for a number that is not finite, a mass that is not positive, an inertia
    tensor that is not symmetric positive definite or breaks the triangle inequality, a
    marker that is not a point in space, or an orientation (the body's or a marker's) that
    is not a rotation.
    """

    name: str = eqx.field(static=True)
    mass: Float[Array, ""]
    inertia: Float[Array, "3 3"]
    markers: dict[str, Float[Array, "3"]]
    orientations: dict[str, Float[Array, "3 3"]]
    position: Float[Array, "3"]
    orientation: Float[Array, "4"]

    dimension: ClassVar[int] = 3
    num_coordinates: ClassVar[int] = 7
    num_own_constraints: ClassVar[int] = 1
    coordinate_labels: ClassVar[tuple[str, ...]] = ("x", "y", "z", "e0", "e1", "e2", "e3")

    def __init__(
        self,
        name: str,
        mass: ArrayLike,
        inertia: ArrayLikeOrSequence,
        markers=None,
        *,
        orientations=None,
        position: ArrayLikeOrSequence = (0.0, 0.0, 0.0),
        orientation: ArrayLikeOrSequence | None = None,
    ):
        self.name = _moving_body_name(name)
        self.mass = _scalar(f"`mass` of body {name!r}", mass)
        self.inertia = _inertia_tensor(name, inertia)
        self.markers = _markers(name, markers, (3,))
        self.orientations = _orientations(name, orientations, self.markers)
        self.position = _vector(f"`position` of body {name!r}", position, 3)
        self.orientation = _body_orientation(name, orientation)

    def __check_init__(self):
        if is_concrete(self.mass) and not (np.isfinite(self.mass) and self.mass > 0):
            raise ValueError(
                f"Body {self.name!r} has mass {float(self.mass)}: a rigid body needs a positive "
                "finite mass (it can move in every direction). Fix the body to the ground with "
                "`Fixed` instead of giving it no mass."
            )
        if is_concrete(self.inertia):
            j = np.asarray(self.inertia, dtype=float)
            if not np.all(np.isfinite(j)) or not np.allclose(
                j, j.T, rtol=1e-12, atol=1e-14 * np.abs(j).max()
            ):
                raise ValueError(
                    f"The inertia tensor of body {self.name!r} is not a finite symmetric "
                    f"matrix: {j.tolist()}."
                )
            moments = np.linalg.eigvalsh(j)
            if not moments[0] > 0:
                raise ValueError(
                    f"The inertia tensor of body {self.name!r} is not positive definite "
                    f"(principal moments {moments.tolist()}): a body that can turn about "
                    "every axis needs a positive moment of inertia about each; fix a body "
                    "that must not turn with a joint instead."
                )
            if moments[0] + moments[1] < moments[2] * (1 - 1e-9):
                raise ValueError(
                    f"The inertia tensor of body {self.name!r} breaks the triangle inequality "
                    f"(principal moments {moments.tolist()}: {moments[0]:.6g} + "
                    f"{moments[1]:.6g} < {moments[2]:.6g}); no distribution of mass has it. "
                    "Check the units and the axes of the tensor."
                )

    # -- what the mechanism needs (body coordinates qb = (r, p)) -------------------------

    def reference_coordinates(self):
        return jnp.concatenate([self.position, self.orientation])

    def pose(self, qb):
        return qb[:3], euler_rotation(qb[3:])

    def angular_velocity(self, qb, vb):
        """`ω = 2 E(p) ṗ` in the global frame."""
        return 2 * global_map(qb[3:]) @ vb[3:]

    def point_velocity(self, qb, vb, arm):
        return vb[:3] + jnp.cross(self.angular_velocity(qb, vb), arm)

    def mass_matrix(self, qb):
        return rigid_mass_matrix(self.mass, self.inertia, qb)

    def kinetic_energy(self, qb, vb):
        return rigid_kinetic_energy(self.mass, self.inertia, qb, vb)

    def constraints(self, qb):
        p = qb[3:]
        return (0.5 * (p @ p - 1))[None]

    def generalized_load(self, qb, arm, force, torque):
        """`(f, 2 Eᵀ (arm × f + n))`: the power `f·ṙ + (arm × f + n)·ω` with `ω = 2 E ṗ`."""
        moment = jnp.cross(arm, force) + torque
        return jnp.concatenate([force, 2 * global_map(qb[3:]).T @ moment])

    def wrench(self, qb, load):
        """The inverse of `generalized_load` (`E Eᵀ = |p|² I`; the part of the load
        along `p` is the norm constraint's)."""
        p = qb[3:]
        return load[:3], global_map(p) @ load[3:] / (2 * (p @ p))


def rotational_mass(inertia, p):
    """`4 Gᵀ J G + k p pᵀ`, `k = 4 tr(J)/3`: the Euler parameters' block of a
    [`jaxdae.multibody.RigidBody`][]'s mass matrix (functions of the parameters, so that a
    mechanism maps them over its bodies)."""
    g = body_map(p)
    j = inertia.astype(p.dtype)
    k = 4 * jnp.trace(j) / 3
    return 4 * g.T @ j @ g + k * jnp.outer(p, p)


def rigid_mass_matrix(mass, inertia, qb):
    """The `7 × 7` mass matrix of a rigid body at `qb = (r, p)`."""
    eye = mass.astype(qb.dtype) * jnp.eye(3, dtype=qb.dtype)
    rot = rotational_mass(inertia, qb[3:])
    zeros = jnp.zeros((3, 4), qb.dtype)
    return jnp.block([[eye, zeros], [zeros.T, rot]])


def rigid_kinetic_energy(mass, inertia, qb, vb):
    """`½ m |ṙ|² + ½ ṗᵀ (4 Gᵀ J G + k p pᵀ) ṗ` of a rigid body."""
    pdot = vb[3:]
    return 0.5 * mass * (vb[:3] @ vb[:3]) + 0.5 * pdot @ (rotational_mass(inertia, qb[3:]) @ pdot)


class Ground(eqx.Module):
    """The fixed frame (named `"ground"`), with optional markers in global coordinates.

    The ground has no coordinates; joints and force elements attach to it like to a body,
    as `"ground"` (the origin) or `"ground.marker"`.

    **Arguments:**

    - `markers`: dict from marker names to points in the global frame: `(x, y)` in a
        planar mechanism, `(x, y, z)` in a spatial one.
    - `orientations`: (spatial) dict from marker names to `(3, 3)` rotation matrices, the
        marker axes in the global frame.
    """

    name: str = eqx.field(static=True)
    markers: dict[str, Float[Array, " d"]]
    orientations: dict[str, Float[Array, "3 3"]]

    def __init__(self, markers=None, *, orientations=None):
        self.name = GROUND
        self.markers = _markers(GROUND, markers, (2, 3))
        self.orientations = _orientations(GROUND, orientations, self.markers)
