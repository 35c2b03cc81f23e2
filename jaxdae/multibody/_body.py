"""Rigid bodies and the ground, with their markers."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, Float
from .._gains import is_concrete

GROUND = "ground"


def _array(name: str, value) -> Array:
    try:
        array = jnp.asarray(value)
    except TypeError as error:
        raise ValueError(
            f"{name} must be a number or an array of numbers; got {value!r}.") from error
    return array if jnp.issubdtype(array.dtype, jnp.inexact) else array.astype(float)


def _vector(name: str, value, size: int) -> Array:
    array = _array(name, value)
    if array.shape != (size,):
        raise ValueError(f"{name} must be a vector of {size} numbers; got shape {array.shape}.")
    return array


def _scalar(name: str, value) -> Array:
    array = _array(name, value)
    if array.shape != ():
        raise ValueError(f"{name} must be a scalar; got shape {array.shape}.")
    return array


def _check_name(kind: str, name) -> str:
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(
            f"A {kind} name must be a non-empty string without '.' (markers are named "
            f"'body.marker'); got {name!r}."
        )
    return name


def _markers(owner: str, markers) -> dict[str, Array]:
    if markers is None:
        return {}
    if not isinstance(markers, dict):
        raise ValueError(
            f"`markers` of {owner!r} must be a dict from marker names to points in body "
            f"coordinates, e.g. {{'tip': (0.5, 0.0)}}; got {type(markers).__name__}."
        )
    return {
        _check_name("marker", key): _vector(f"Marker {owner}.{key}", value, 2)
        for key, value in markers.items()
    }


class PlanarBody(eqx.Module):
    """A planar rigid body, described by the absolute coordinates `(x, y, θ)` of its centre
    of mass and its orientation.

    A point fixed on the body at `s` (body coordinates, from the centre of mass) is at
    `r + R(θ) s` in the plane, `R(θ)` the rotation by `θ`. Joints and force elements attach
    to *markers*: named points on a body, referred to as `"body.marker"`; the body's name
    alone refers to its centre of mass.

    **Arguments:**

    - `name`: a unique name (no `.`).
    - `mass`: `m > 0`.
    - `inertia`: moment of inertia about the centre of mass, `I > 0`.
    - `markers`: dict from marker names to points `(sx, sy)` in body coordinates.
    - `position`, `angle`: the pose `(x, y)`, `θ` used as the initial guess of
        [`jaxdae.multibody.Mechanism.initial_state`][] (it need not satisfy the joints).

    Every number is a JAX array, so `eqx.filter_grad` reaches `mass`, `inertia`, the marker
    positions and the pose.

    **Raises:**

    `ValueError` for a name with a `.`, a mass or inertia that is not a positive number,
    or a marker that is not a point of the plane.
    """

    name: str = eqx.field(static=True)
    mass: Float[Array, ""]
    inertia: Float[Array, ""]
    markers: dict[str, Float[Array, "2"]]
    position: Float[Array, "2"]
    angle: Float[Array, ""]

    def __init__(self, name: str, mass: ArrayLike, inertia: ArrayLike, markers=None, *,
                 position: ArrayLike = (0.0, 0.0), angle: ArrayLike = 0.0):
        self.name = _check_name("body", name)
        if name == GROUND:
            raise ValueError(
                f"{GROUND!r} names the fixed frame; give the moving body another name (use "
                "`jaxdae.multibody.Ground(markers=...)` to put markers on the ground)."
            )
        self.mass = _scalar(f"`mass` of body {name!r}", mass)
        self.inertia = _scalar(f"`inertia` of body {name!r}", inertia)
        self.markers = _markers(name, markers)
        self.position = _vector(f"`position` of body {name!r}", position, 2)
        self.angle = _scalar(f"`angle` of body {name!r}", angle)

    def __check_init__(self):
        for field, what in (("mass", "mass"), ("inertia", "moment of inertia")):
            value = getattr(self, field)
            if is_concrete(value) and not (np.isfinite(value) and value > 0):
                raise ValueError(
                    f"Body {self.name!r} has {field} {float(value)}: a planar rigid body needs "
                    f"a positive finite {what} (it can move and turn in the plane). Fix the "
                    "body to the ground with `Fixed` instead of giving it no mass."
                )


class Ground(eqx.Module):
    """The fixed frame (named `"ground"`), with optional markers in global coordinates.

    The ground has no coordinates; joints and force elements attach to it like to a body,
    as `"ground"` (the origin) or `"ground.marker"`.

    **Arguments:**

    - `markers`: dict from marker names to points `(x, y)` in the global frame.
    """

    name: str = eqx.field(static=True)
    markers: dict[str, Float[Array, "2"]]

    def __init__(self, markers=None):
        self.name = GROUND
        self.markers = _markers(GROUND, markers)
