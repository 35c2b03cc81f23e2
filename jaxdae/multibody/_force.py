"""Force elements: gravity, spring-damper-actuators and applied forces and torques."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, Float
from .._gains import is_concrete
from ._body import _array, _scalar, _vector
from ._kinematics import Kinematics

#: An actuator: `None` (none), a constant, the index of an input channel of the
#: mechanism's controller (`u[i]`), or a function `(t, q, v) -> value`.
Actuator = None | int | ArrayLike | Callable


class Load(eqx.Module):
    """A force `(2,)` in the global frame and a torque acting at the marker `at`."""

    at: str = eqx.field(static=True)
    force: Float[Array, "2"]
    torque: Float[Array, ""]


class AbstractForce(eqx.Module):
    """A force element of a [`jaxdae.multibody.Mechanism`][].

    Its conservative part is a potential energy (so that `jaxdae` derives its forces and the
    mechanism's energy includes it); the rest are [`jaxdae.multibody.Load`][]s at markers:
    forces in the global frame plus torques, turned into generalized forces by the
    mechanism.
    """

    name: eqx.AbstractVar[str | None]

    @property
    @abc.abstractmethod
    def markers(self) -> tuple[str, ...]:
        """The markers (or bodies) it attaches to."""

    def potential_energy(self, kin: Kinematics) -> Float[Array, ""]:
        """Its potential energy. Default: 0."""
        return jnp.zeros((), kin.q.dtype)

    def loads(self, kin: Kinematics) -> tuple[Load, ...]:
        """Its non-conservative loads (needs `kin.v`). Default: none."""
        return ()

    @property
    def channels(self) -> tuple[int, ...]:
        """The controller's input channels it reads."""
        channel = getattr(self, "channel", None)
        return () if channel is None else (channel,)


def _actuator(value):
    """`(channel, actuator)`: a static input channel, or a constant array / function."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"An input channel must be a non-negative integer; got {value}.")
        return int(value), None
    if value is None or callable(value):
        return None, value
    return None, _array("An actuator", value)


def actuation(element, kin: Kinematics, shape=()):
    """The value of `element`'s actuator at the state of `kin`."""
    if element.channel is not None:
        return kin.inputs[element.channel]
    actuator = element.actuator
    if actuator is None:
        return jnp.zeros(shape, kin.q.dtype)
    if callable(actuator) and not eqx.is_array(actuator):
        return jnp.asarray(actuator(kin.t, kin.q, kin.v), kin.q.dtype).reshape(shape)
    return actuator.reshape(shape)


def _norm(d):
    """`|d|` with a zero (not NaN) derivative at `d = 0`."""
    dd = d @ d
    positive = dd > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, dd, 1.0)), 0.0)


def _non_negative(owner, **values):
    for key, value in values.items():
        if is_concrete(value) and not (np.isfinite(value) and value >= 0):
            raise ValueError(
                f"`{key}` of {owner} must be a non-negative number; got {float(value)}.")


class Gravity(AbstractForce):
    """Uniform gravity: the potential `V = −Σ m_i g·r_i` over the bodies.

    **Arguments:**

    - `acceleration`: `g` in the global frame. Default `(0, −9.81)` (y up).
    """

    acceleration: Float[Array, "2"]
    name: str | None = eqx.field(static=True)

    def __init__(self, acceleration: ArrayLike = (0.0, -9.81), *, name: str | None = None):
        self.acceleration = _vector("`acceleration` of Gravity", acceleration, 2)
        self.name = name

    @property
    def markers(self):
        return ()

    def potential_energy(self, kin):
        mech = kin.mechanism
        positions = jnp.reshape(kin.q, (-1, 3))[:, :2]
        return -jnp.sum(mech.masses * (positions @ self.acceleration))


class SpringDamper(AbstractForce):
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

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    rest_length: Float[Array, ""]
    actuator: Actuator
    channel: int | None = eqx.field(static=True)
    name: str | None = eqx.field(static=True)

    def __init__(self, a: str, b: str, stiffness: ArrayLike = 0.0, damping: ArrayLike = 0.0,
                 rest_length: ArrayLike = 0.0, *, actuator: Actuator = None,
                 name: str | None = None):
        self.a, self.b, self.name = a, b, name
        self.stiffness = _scalar("`stiffness` of a SpringDamper", stiffness)
        self.damping = _scalar("`damping` of a SpringDamper", damping)
        self.rest_length = _scalar("`rest_length` of a SpringDamper", rest_length)
        self.channel, self.actuator = _actuator(actuator)

    def __check_init__(self):
        _non_negative(f"SpringDamper {self.a!r}–{self.b!r}", stiffness=self.stiffness,
                      damping=self.damping, rest_length=self.rest_length)

    @property
    def markers(self):
        return (self.a, self.b)

    def potential_energy(self, kin):
        length = _norm(kin.frame(self.b).point - kin.frame(self.a).point)
        return 0.5 * self.stiffness * (length - self.rest_length) ** 2

    def loads(self, kin):
        d = kin.frame(self.b).point - kin.frame(self.a).point
        length = _norm(d)
        e = d / jnp.where(length > 0, length, 1.0)
        rate = e @ (kin.velocity(self.b)[0] - kin.velocity(self.a)[0])
        f = actuation(self, kin) - self.damping * rate
        zero = jnp.zeros((), d.dtype)
        return Load(self.a, -f * e, zero), Load(self.b, f * e, zero)


class RotationalSpringDamper(AbstractForce):
    """A rotational spring-damper-actuator between the bodies of markers `a` and `b`.

    With the relative angle `Δθ = θ_b − θ_a`, the torque on `b` is `τ` and on `a` is `−τ`,
    `τ = −k (Δθ − Δθ₀) − c Δθ̇ + u`; the spring is the potential `½ k (Δθ − Δθ₀)²`.

    **Arguments:**

    - `a`, `b`: bodies (or markers on them).
    - `stiffness` `k`, `damping` `c`: non-negative; `rest_angle` `Δθ₀`.
    - `actuator`: the torque `u` (see [`jaxdae.multibody.SpringDamper`][]).
    - `name`: its name.
    """

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    rest_angle: Float[Array, ""]
    actuator: Actuator
    channel: int | None = eqx.field(static=True)
    name: str | None = eqx.field(static=True)

    def __init__(self, a: str, b: str, stiffness: ArrayLike = 0.0, damping: ArrayLike = 0.0,
                 rest_angle: ArrayLike = 0.0, *, actuator: Actuator = None,
                 name: str | None = None):
        self.a, self.b, self.name = a, b, name
        self.stiffness = _scalar("`stiffness` of a RotationalSpringDamper", stiffness)
        self.damping = _scalar("`damping` of a RotationalSpringDamper", damping)
        self.rest_angle = _scalar("`rest_angle` of a RotationalSpringDamper", rest_angle)
        self.channel, self.actuator = _actuator(actuator)

    def __check_init__(self):
        _non_negative(f"RotationalSpringDamper {self.a!r}–{self.b!r}",
                      stiffness=self.stiffness, damping=self.damping)

    @property
    def markers(self):
        return (self.a, self.b)

    def potential_energy(self, kin):
        angle = kin.frame(self.b).angle - kin.frame(self.a).angle
        return 0.5 * self.stiffness * (angle - self.rest_angle) ** 2

    def loads(self, kin):
        rate = kin.velocity(self.b)[1] - kin.velocity(self.a)[1]
        tau = actuation(self, kin) - self.damping * rate
        zero = jnp.zeros((2,), kin.q.dtype)
        return Load(self.a, zero, -tau), Load(self.b, zero, tau)


class Force(AbstractForce):
    """An applied force at a marker, in the global frame (or the body's, `local=True`).

    The force is `u · direction`, or `u` itself (a vector) without a `direction`.

    **Arguments:**

    - `at`: the marker.
    - `actuator`: `u`: a constant, an input channel `i` of the mechanism's controller or a
        function `(t, q, v) -> scalar` (with a `direction`) or `-> (2,)` (without).
    - `direction`: `(2,)`, or `None`.
    - `local`: the force (direction) is in the body's frame and turns with it.
    - `name`: its name.
    """

    at: str = eqx.field(static=True)
    actuator: Actuator
    channel: int | None = eqx.field(static=True)
    direction: Float[Array, "2"] | None
    local: bool = eqx.field(static=True)
    name: str | None = eqx.field(static=True)

    def __init__(self, at: str, actuator: Actuator, direction: ArrayLike | None = None, *,
                 local: bool = False, name: str | None = None):
        self.at, self.local, self.name = at, bool(local), name
        self.channel, self.actuator = _actuator(actuator)
        self.direction = None if direction is None else _vector("`direction` of a Force",
                                                                  direction, 2)
        if self.direction is None and self.channel is not None:
            raise ValueError(
                "A Force driven by an input channel needs a `direction` (the channel is a "
                "scalar): e.g. Force('slider', actuator=0, direction=(1.0, 0.0))."
            )

    @property
    def markers(self):
        return (self.at,)

    def loads(self, kin):
        if self.direction is None:
            force = actuation(self, kin, (2,))
        else:
            force = actuation(self, kin) * self.direction
        if self.local:
            force = kin.frame(self.at).rotation @ force
        return (Load(self.at, force, jnp.zeros((), kin.q.dtype)),)


class Torque(AbstractForce):
    """An applied torque `u` on the body of marker `at`.

    **Arguments:**

    - `at`: the body.
    - `actuator`: `u`: a constant, an input channel of the mechanism's controller or a
        function `(t, q, v) -> scalar`.
    - `name`: its name.
    """

    at: str = eqx.field(static=True)
    actuator: Actuator
    channel: int | None = eqx.field(static=True)
    name: str | None = eqx.field(static=True)

    def __init__(self, at: str, actuator: Actuator, *, name: str | None = None):
        self.at, self.name = at, name
        self.channel, self.actuator = _actuator(actuator)

    @property
    def markers(self):
        return (self.at,)

    def loads(self, kin):
        return (Load(self.at, jnp.zeros((2,), kin.q.dtype), actuation(self, kin)),)
