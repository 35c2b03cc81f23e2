"""Force elements: gravity, spring-damper-actuators and applied forces and torques."""

import abc
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, ArrayLikeOrSequence, Float
from .._gains import is_concrete
from ._body import _array, _check_element_dimension, _optional_vector, _scalar
from ._kinematics import ElementKinematics, Kinematics
from ._tree_kinematics import TreeKinematics


def _no_torque(kin):
    return jnp.zeros(() if kin.dimension == 2 else (3,), kin.q.dtype)


#: An actuator: `None` (none), a constant, the index of an input channel of the
#: mechanism's controller (`u[i]`), or a function `(t, q, v) -> value`.
Actuator = None | int | ArrayLike | Callable


class Load(eqx.Module):
    """A force `(d,)` in the global frame and a torque acting at the marker `at` (a scalar
    in the plane, a vector `(3,)` in the global frame in space)."""

    at: str = eqx.field(static=True)
    force: Float[Array, " d"]
    torque: Float[Array, "..."]


class AbstractForce(eqx.Module):
    """A force element of a [`jaxdae.multibody.Mechanism`][].

    Its conservative part is a potential energy (so that `jaxdae` derives its forces and the
    mechanism's energy includes it); the rest are [`jaxdae.multibody.Load`][]s at markers:
    forces in the global frame plus torques, turned into generalized forces by the
    mechanism, or generalized forces directly (`generalized_forces`).
    """

    name: eqx.AbstractVar[str | None]
    dimensions: ClassVar[tuple[int, ...]] = (2, 3)
    #: Whether its energy and loads read only `kin.frame`, `kin.velocity` of its own
    #: `markers`, `kin.t`, `kin.inputs` and its array fields: then the mechanism evaluates
    #: the elements of the class with the same static fields together, under `jax.vmap`.
    grouped: ClassVar[bool] = False

    @property
    def joints(self) -> tuple[str, ...]:
        """The joints (by name) it acts on."""
        return ()

    vector_fields: ClassVar[tuple[str, ...]] = ()
    """The fields that hold a vector of the mechanism's dimension (or `None`)."""
    spatial_vector_fields: ClassVar[tuple[str, ...]] = ()
    """The fields that hold a vector in space, `(3,)` (or `None`)."""

    def check_dimension(self, dimension: int, owner: str) -> None:
        """Raise `ValueError` if it does not exist in a mechanism of `dimension`."""
        _check_element_dimension(
            self,
            dimension,
            owner,
            {
                **dict.fromkeys(self.vector_fields, (dimension,)),
                **dict.fromkeys(self.spatial_vector_fields, (3,)),
            },
        )

    def generalized_forces(
        self, kin: Kinematics | TreeKinematics | ElementKinematics
    ) -> Float[Array, " n"] | None:
        """Generalized forces it applies directly (needs `kin.v`). Default: none."""
        return None

    @property
    @abc.abstractmethod
    def markers(self) -> tuple[str, ...]:
        """The markers (or bodies) it attaches to."""

    def potential_energy(
        self, kin: Kinematics | TreeKinematics | ElementKinematics
    ) -> Float[Array, ""]:
        """Its potential energy. Default: 0."""
        return jnp.zeros((), kin.q.dtype)

    def loads(self, kin: Kinematics | TreeKinematics | ElementKinematics) -> tuple[Load, ...]:
        """Its non-conservative loads (needs `kin.v`). Default: none."""
        return ()

    @property
    def channels(self) -> tuple[int, ...]:
        """The controller's input channels it reads. Default: none."""
        return ()


class AbstractActuatedForce(AbstractForce):
    """A force element with an actuator: a constant, a function `u(t, q, v)` or an input
    channel of the mechanism's controller (`channel`, static; `None` where the actuator
    is not a channel)."""

    channel: eqx.AbstractVar[int | None]

    @property
    def channels(self) -> tuple[int, ...]:
        """The controller's input channel it reads, if its actuator is one."""
        return () if self.channel is None else (self.channel,)


def _actuator(value):
    """`(channel, actuator)`: a static input channel, or a constant array / function."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"An input channel must be a non-negative integer; got {value}.")
        return int(value), None
    if value is None or callable(value):
        return None, value
    return None, _array("An actuator", value)


def actuation(element, kin: Kinematics | TreeKinematics | ElementKinematics, shape=()):
    """The value of `element`'s actuator at the state of `kin` (in a group of elements,
    the state that each element of the group sees)."""
    if element.channel is not None:
        return kin.inputs[element.channel]
    actuator = element.actuator
    if actuator is None:
        return jnp.zeros(shape, kin.q.dtype)
    if callable(actuator) and not eqx.is_array(actuator):
        return jnp.asarray(actuator(kin.t, kin.q, kin.v), kin.q.dtype).reshape(shape)
    return jnp.reshape(actuator, shape)


def _applied(element, kin: Kinematics | TreeKinematics | ElementKinematics, direction, size):
    """The vector an applied force or torque `element` acts with: `u · direction`, or its
    actuator `u` itself, shape `(size,)`, without a `direction`; in the global frame, turned
    from the frame of its marker `at` if it is `local`."""
    if direction is None:
        vector = actuation(element, kin, (size,))
    else:
        vector = actuation(element, kin) * direction
    return kin.frame(element.at).rotation @ vector if element.local else vector


def safe_norm(d):
    """`|d|` with a zero (not NaN) derivative at `d = 0`."""
    dd = d @ d
    positive = dd > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, dd, 1.0)), 0.0)


def _non_negative(owner, **values):
    for key, value in values.items():
        if is_concrete(value) and not (np.isfinite(value) and value >= 0):
            raise ValueError(
                f"`{key}` of {owner} must be a non-negative number; got {float(value)}."
            )


class Gravity(AbstractForce):
    """Uniform gravity: the potential `V = −Σ m_i g·r_i` over the bodies.

    **Arguments:**

    - `acceleration`: `g` in the global frame. Default `(0, −9.81)` in the plane (y up),
        `(0, 0, −9.81)` in space (z up).
    """

    acceleration: Float[Array, " d"] | None
    name: str | None = eqx.field(static=True)
    vector_fields: ClassVar[tuple[str, ...]] = ("acceleration",)

    def __init__(self, acceleration: ArrayLikeOrSequence | None = None, *, name: str | None = None):
        self.acceleration = _optional_vector("`acceleration` of Gravity", acceleration)
        self.name = name

    @property
    def markers(self):
        return ()

    def potential_energy(self, kin):
        g = self.acceleration
        if g is None:
            g = jnp.asarray(-9.81 * np.eye(kin.dimension)[-1], kin.q.dtype)
        return -jnp.sum(kin.mechanism.masses * (kin.centres() @ g))


class AbstractSpringDamper(AbstractActuatedForce):
    """A spring-damper-actuator on one scalar measure `x` of the mechanism (the distance of
    two markers, the relative angle of two bodies, a joint's coordinate): the spring is the
    potential `½ k (x − x₀)²`, the damper and the actuator `u` apply `u − c ẋ` along `x`.

    It holds the stiffness `k` and the damping `c` (non-negative), the actuator and the
    name, set in a spring-damper's `__init__` by `_set_law` together with the rest value
    `x₀`, which a spring-damper declares as its field `rest_name` (non-negative as `k` and
    `c` where `non_negative_rest`); `label` names it in errors."""

    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    actuator: Actuator
    channel: int | None = eqx.field(static=True)
    name: str | None = eqx.field(static=True)
    rest_name: eqx.AbstractClassVar[str]
    non_negative_rest: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """How errors name it, e.g. `SpringDamper 'a'–'b'`."""

    def _set_law(self, stiffness, damping, rest, actuator, name) -> Array:
        """Sets `stiffness`, `damping`, the actuator and `name`; returns the rest value
        `rest`, each converted and checked in the order of the constructor's arguments."""
        self.name = name
        owner = f"the {self.label}"
        self.stiffness = _scalar(f"`stiffness` of {owner}", stiffness)
        self.damping = _scalar(f"`damping` of {owner}", damping)
        rest = _scalar(f"`{self.rest_name}` of {owner}", rest)
        self.channel, self.actuator = _actuator(actuator)
        return rest

    def __check_init__(self):
        rest = {self.rest_name: getattr(self, self.rest_name)} if self.non_negative_rest else {}
        _non_negative(self.label, stiffness=self.stiffness, damping=self.damping, **rest)

    def _spring_energy(self, x, rest):
        """`½ k (x − x₀)²`."""
        return 0.5 * self.stiffness * (x - rest) ** 2

    def _damped_actuation(self, kin, rate):
        """`u − c ẋ` at the state of `kin`, `rate` = `ẋ`."""
        return actuation(self, kin) - self.damping * rate


class AbstractMarkerSpringDamper(AbstractSpringDamper):
    """A spring-damper between the markers (or bodies) `a` and `b`."""

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    grouped: ClassVar[bool] = True

    @property
    def markers(self):
        return (self.a, self.b)

    @property
    def label(self):
        return f"{type(self).__name__} {self.a!r}–{self.b!r}"

    def _set_markers(self, a, b, stiffness, damping, rest, actuator, name) -> Array:
        """Sets the markers `a` and `b`, then as `_set_law`."""
        self.a, self.b = a, b
        return self._set_law(stiffness, damping, rest, actuator, name)


class SpringDamper(AbstractMarkerSpringDamper):
    """A translational spring-damper-actuator between markers `a` and `b`.

    With the length `ℓ = |p_b − p_a|` and the unit vector `e` from `a` to `b`, the force on
    `b` is `f e` and on `a` is `−f e`, where `f = −k (ℓ − ℓ₀) − c ℓ̇ + u` (positive `f`
    pushes the markers apart). The spring is the potential `½ k (ℓ − ℓ₀)²`; the damper and
    the actuator force `u` are applied loads.

    **Arguments:**

    - `a`, `b`: markers.
    - `stiffness` `k`, `damping` `c`, `rest_length` `ℓ₀`: non-negative.
    - `actuator`: `u`: a constant, an input channel `i` (`u = controller(t, q, v)[i]`
        of the mechanism's controller) or a function `(t, q, v) -> scalar`.
    - `name`: its name.
    """

    rest_length: Float[Array, ""]
    rest_name: ClassVar[str] = "rest_length"
    non_negative_rest: ClassVar[bool] = True

    def __init__(
        self,
        a: str,
        b: str,
        stiffness: ArrayLike = 0.0,
        damping: ArrayLike = 0.0,
        rest_length: ArrayLike = 0.0,
        *,
        actuator: Actuator = None,
        name: str | None = None,
    ):
        self.rest_length = self._set_markers(a, b, stiffness, damping, rest_length, actuator, name)

    def potential_energy(self, kin):
        length = safe_norm(kin.frame(self.b).point - kin.frame(self.a).point)
        return self._spring_energy(length, self.rest_length)

    def loads(self, kin):
        d = kin.frame(self.b).point - kin.frame(self.a).point
        length = safe_norm(d)
        e = d / jnp.where(length > 0, length, 1.0)
        rate = e @ (kin.velocity(self.b)[0] - kin.velocity(self.a)[0])
        f = self._damped_actuation(kin, rate)
        zero = _no_torque(kin)
        return Load(self.a, -f * e, zero), Load(self.b, f * e, zero)


class RotationalSpringDamper(AbstractMarkerSpringDamper):
    """A rotational spring-damper-actuator between the bodies of markers `a` and `b`.

    With the relative angle `Δθ = θ_b − θ_a`, the torque on `b` is `τ` and on `a` is `−τ`,
    `τ = −k (Δθ − Δθ₀) − c Δθ̇ + u`; the spring is the potential `½ k (Δθ − Δθ₀)²`.
    Planar; in space put a [`jaxdae.multibody.JointSpringDamper`][] on a revolute joint.

    **Arguments:**

    - `a`, `b`: bodies (or markers on them).
    - `stiffness` `k`, `damping` `c`: non-negative; `rest_angle` `Δθ₀`.
    - `actuator`: the torque `u` (see [`jaxdae.multibody.SpringDamper`][]).
    - `name`: its name.
    """

    rest_angle: Float[Array, ""]
    rest_name: ClassVar[str] = "rest_angle"
    dimensions: ClassVar[tuple[int, ...]] = (2,)

    def __init__(
        self,
        a: str,
        b: str,
        stiffness: ArrayLike = 0.0,
        damping: ArrayLike = 0.0,
        rest_angle: ArrayLike = 0.0,
        *,
        actuator: Actuator = None,
        name: str | None = None,
    ):
        self.rest_angle = self._set_markers(a, b, stiffness, damping, rest_angle, actuator, name)

    def potential_energy(self, kin):
        angle = kin.frame(self.b).angle - kin.frame(self.a).angle
        return self._spring_energy(angle, self.rest_angle)

    def loads(self, kin):
        rate = kin.velocity(self.b)[1] - kin.velocity(self.a)[1]
        tau = self._damped_actuation(kin, rate)
        zero = jnp.zeros((2,), kin.q.dtype)
        return Load(self.a, zero, -tau), Load(self.b, zero, tau)


class AbstractAppliedLoad(AbstractActuatedForce):
    """A force or torque applied at the marker `at`: `u · vector` (its direction or axis),
    or `u` itself without one, in the global frame or, `local`, in the marker's. It holds
    the marker, the actuator, `local` and the name, set in its `__init__` by `_set_applied`
    with its vector, which it declares under its own name in `vector_fields` (a vector of
    the mechanism's dimension) or in `spatial_vector_fields` (always `(3,)`)."""

    at: str = eqx.field(static=True)
    actuator: Actuator
    channel: int | None = eqx.field(static=True)
    local: bool = eqx.field(static=True)
    name: str | None = eqx.field(static=True)
    grouped: ClassVar[bool] = True

    def _set_applied(self, at, actuator, local, name, label: str, vector) -> Array | None:
        """Sets `at`, `local`, `name` and the actuator; returns `vector` (named `label` in
        errors) as a vector of 2 or 3 numbers, of 3 where it is spatial, or `None`."""
        self.at, self.local, self.name = at, bool(local), name
        self.channel, self.actuator = _actuator(actuator)
        return _optional_vector(label, vector, (3,) if self.spatial_vector_fields else (2, 3))

    @property
    def markers(self):
        return (self.at,)


class Force(AbstractAppliedLoad):
    """An applied force at a marker, in the global frame (or the marker's, `local=True`).

    The force is `u · direction`, or `u` itself (a vector) without a `direction`.

    **Arguments:**

    - `at`: the marker.
    - `actuator`: `u`: a constant, an input channel `i` of the mechanism's controller or a
        function `(t, q, v) -> scalar` (with a `direction`) or `-> (d,)` (without).
    - `direction`: `(d,)` (`d` = 2 in the plane, 3 in space), or `None`.
    - `local`: the force (direction) is in the marker's frame and turns with its body.
    - `name`: its name.
    """

    direction: Float[Array, " d"] | None
    vector_fields: ClassVar[tuple[str, ...]] = ("direction",)

    def __init__(
        self,
        at: str,
        actuator: Actuator,
        direction: ArrayLikeOrSequence | None = None,
        *,
        local: bool = False,
        name: str | None = None,
    ):
        self.direction = self._set_applied(
            at, actuator, local, name, f"`direction` of the Force at {at!r}", direction
        )
        if self.direction is None and self.channel is not None:
            raise ValueError(
                "A Force driven by an input channel needs a `direction` (the channel is a "
                "scalar): e.g. Force('slider', actuator=0, direction=(1.0, 0.0))."
            )

    def loads(self, kin):
        return (Load(self.at, _applied(self, kin, self.direction, kin.dimension), _no_torque(kin)),)


class Torque(AbstractAppliedLoad):
    """An applied torque `u` on the body of marker `at`.

    In the plane `u` is a scalar. In space the torque is `u · axis` (a scalar `u`), or `u`
    itself, a vector `(3,)`, without an `axis`; in the global frame, or in the marker's
    frame with `local=True`.

    **Arguments:**

    - `at`: the body (or a marker on it).
    - `actuator`: `u`: a constant, an input channel of the mechanism's controller or a
        function `(t, q, v) -> value`.
    - `axis`: (spatial) `(3,)`, or `None`.
    - `local`: (spatial) the torque (axis) is in the marker's frame and turns with its body.
    - `name`: its name.
    """

    axis: Float[Array, "3"] | None
    spatial_vector_fields: ClassVar[tuple[str, ...]] = ("axis",)

    def __init__(
        self,
        at: str,
        actuator: Actuator,
        axis: ArrayLikeOrSequence | None = None,
        *,
        local: bool = False,
        name: str | None = None,
    ):
        self.axis = self._set_applied(
            at, actuator, local, name, f"`axis` of the Torque on {at!r}", axis
        )

    def check_dimension(self, dimension, owner):
        super().check_dimension(dimension, owner)
        if dimension == 2 and (self.axis is not None or self.local):
            raise ValueError(
                f"The {owner} is planar: its torque is about z; drop `axis` and `local`."
            )
        if dimension == 3 and self.axis is None and self.channel is not None:
            raise ValueError(
                f"The {owner} reads a scalar input channel: give it an `axis`, e.g. "
                "Torque('body', actuator=0, axis=(0.0, 0.0, 1.0))."
            )

    def loads(self, kin):
        zero = jnp.zeros((kin.dimension,), kin.q.dtype)
        if kin.dimension == 2:
            return (Load(self.at, zero, actuation(self, kin)),)
        return (Load(self.at, zero, _applied(self, kin, self.axis, 3)),)


class JointSpringDamper(AbstractSpringDamper):
    """A spring-damper-actuator on a joint's coordinate: a rotational one on a revolute
    joint (a torque about its axis), a translational one on a prismatic or cylindrical
    joint (a force along it); in the plane and in space.

    With the joint coordinate `c` (see [`jaxdae.multibody.Mechanism.joint_coordinates`][])
    the load is the generalized force `(−k (c − c₀) − d ċ + u) ∂c/∂q`: the spring is the
    potential `½ k (c − c₀)²`, the damper and the actuator `u` (a joint motor) apply
    `(u − d ċ) ∂c/∂q`, the same virtual work as a torque (force) pair on the two bodies.

    **Arguments:**

    - `joint`: the joint's name in the mechanism (a joint with a coordinate).
    - `stiffness` `k`, `damping` `d`: non-negative; `rest` `c₀`.
    - `actuator`: `u` (see [`jaxdae.multibody.SpringDamper`][]).
    - `name`: its name.
    """

    joint: str = eqx.field(static=True)
    rest: Float[Array, ""]
    rest_name: ClassVar[str] = "rest"

    def __init__(
        self,
        joint: str,
        stiffness: ArrayLike = 0.0,
        damping: ArrayLike = 0.0,
        rest: ArrayLike = 0.0,
        *,
        actuator: Actuator = None,
        name: str | None = None,
    ):
        if not isinstance(joint, str):
            raise ValueError(f"`joint` of a JointSpringDamper is a joint's name; got {joint!r}.")
        self.joint = joint
        self.rest = self._set_law(stiffness, damping, rest, actuator, name)

    @property
    def label(self):
        return f"JointSpringDamper on {self.joint!r}"

    @property
    def markers(self):
        return ()

    @property
    def joints(self):
        return (self.joint,)

    def _coordinate(self, kin, q):
        return kin.mechanism.joint_coordinate(self.joint, q, kin.t)

    def potential_energy(self, kin):
        return self._spring_energy(self._coordinate(kin, kin.q), self.rest)

    def generalized_forces(self, kin):
        value, vjp = jax.vjp(lambda q: self._coordinate(kin, q), kin.q)
        rate = jax.jvp(lambda q: self._coordinate(kin, q), (kin.q,), (kin.v,))[1]
        (gradient,) = vjp(jnp.ones_like(value))
        return self._damped_actuation(kin, rate) * gradient
