"""What the two kinds of mechanism share: their construction from bodies, joints, force
elements and stops, their outputs at markers and joints, their stops as one-sided
constraints, and a consistent start with prescribed joint coordinates."""

import abc
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._gains import is_concrete
from .._systems._consistent import consistent_initial_state
from .._systems._control import AbstractControlledSystem, AbstractController, ConstantControl
from .._systems._system import LagrangianSystem
from ._body import GROUND, Ground, PlanarBody, RigidBody
from ._coupling import JointCoupling
from ._force import AbstractForce
from ._joint import AbstractJoint
from ._kinematics import split
from ._results import Mobility
from ._stop import AbstractStop, JointLimit, StopKinematics


def over_leading(fn, *arrays):
    """`fn` on the last axis of `arrays`, mapped over their (shared) leading axes."""
    batch = arrays[0].shape[:-1]
    if not batch:
        return fn(*arrays)
    flat = [x.reshape((-1, x.shape[-1])) for x in arrays]
    out = jax.vmap(fn)(*flat)
    return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


def kind_check(name, items, kind, expected):
    """`items` as a tuple, each an instance of `kind` (else `ValueError` naming `expected`)."""
    items = tuple(items)
    for item in items:
        if not isinstance(item, kind):
            what = (
                f"the class {item.__name__} itself (pass an instance)"
                if isinstance(item, type)
                else repr(type(item).__name__)
            )
            raise ValueError(f"`{name}` must hold {expected}; got {what}.")
    return items


def element_names(kind, elements):
    """The elements' names; unnamed ones get `<class>_<k>` (k counting per class)."""
    counts: dict[str, int] = {}
    names = []
    for element in elements:
        default = type(element).__name__.lower()
        index = counts.get(default, 0)
        counts[default] = index + 1
        names.append(element.name if element.name is not None else f"{default}_{index}")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {kind} name must be a non-empty string; got {name!r}.")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"Duplicate {kind} names {duplicates}: give every {kind} its own `name=` "
            f"(unnamed {kind}s are called <class>_<k>)."
        )
    return tuple(names)


class AbstractMechanism(AbstractControlledSystem):
    """What a [`jaxdae.multibody.Mechanism`][] (absolute coordinates) and a
    [`jaxdae.multibody.TreeMechanism`][] (joint coordinates) share: their checked bodies,
    joints, force elements, stops, joint couplings and controller (a mechanism is a controlled
    system); the outputs at markers and joints, read through the mechanism's kinematics
    (`_kinematics`); the stops as the system's `gaps` (with their coefficients of restitution
    and friction and their slip velocities); `mobility`; and `initial_state`. Listed before the
    system class among a mechanism's bases, so that these override the system's defaults (no
    gaps).

    It declares the fields that its construction methods (`_set_bodies`,
    `_set_elements`) set, first among a mechanism's fields; a mechanism declares its own
    after them and sets them all in its `__init__`."""

    bodies: tuple[PlanarBody | RigidBody, ...]
    ground: Ground
    joints: tuple[AbstractJoint, ...]
    forces: tuple[AbstractForce, ...]
    stops: tuple[AbstractStop, ...]
    couplings: tuple[JointCoupling, ...]
    controller: AbstractController
    joint_names: tuple[str, ...] = eqx.field(static=True)
    force_names: tuple[str, ...] = eqx.field(static=True)
    stop_names: tuple[str, ...] = eqx.field(static=True)
    coupling_names: tuple[str, ...] = eqx.field(static=True)
    dimension: eqx.AbstractVar[int]

    @abc.abstractmethod
    def _kinematics(self, t, q, v=None, inputs=None):
        """The markers at `(t, q, v)` (a [`jaxdae.multibody.Kinematics`][] or
        [`jaxdae.multibody.TreeKinematics`][]), with the controller's output `inputs`."""

    @property
    @abc.abstractmethod
    def coordinate_names(self) -> tuple[str, ...]:
        """The name of each coordinate of `q`."""

    def __check_init__(self):
        if not self.coordinate_names:
            raise ValueError(
                f"This {type(self).__name__} has no coordinates: its joints ("
                f"{list(self.joint_names)}) fix every body to the ground, so nothing can "
                "move. Give it a moving joint (Revolute, Prismatic, ...) or a body that "
                "no joint holds (a free body)."
            )

    @property
    @abc.abstractmethod
    def num_equations(self) -> int:
        """`m`: the number of constraint equations."""

    @abc.abstractmethod
    def reference_coordinates(self) -> Float[Array, " n"]:
        """`q` of the bodies' given poses: a guess; need not satisfy `Φ`."""

    @abc.abstractmethod
    def _wrapped_joints(self) -> tuple[str, ...]:
        """The joints whose coordinate this mechanism measures as an angle in `(−π, π]`
        (see [`jaxdae.multibody.AbstractJoint.coordinate_wraps`][])."""

    @abc.abstractmethod
    def _unheld_coordinates(self) -> int:
        """The number of coordinates that neither the constraints hold nor the motion
        changes (the norms of Euler parameters that need not be unit)."""

    @abc.abstractmethod
    def _driven(self, t0, q, v, held: "Prescribed"):
        """`(q, v, system)`: the guess with the joint coordinates of `held` set where they
        are coordinates of `q`, and the system whose consistent state near it
        `initial_state` finds (`None` where the guess is consistent already)."""

    # -- construction ------------------------------------------------------------------

    def _set_bodies(self, items, kinds: str):
        """`ground` and `bodies` from `items` (bodies and at most one Ground; at least one
        body, of `kinds`), with distinct names."""
        grounds = [b for b in items if isinstance(b, Ground)]
        if len(grounds) > 1:
            raise ValueError("`bodies` holds more than one Ground; merge their markers into one.")
        self.ground = grounds[0] if grounds else Ground()
        self.bodies = tuple(b for b in items if not isinstance(b, Ground))
        if not self.bodies:
            raise ValueError(f"A {type(self).__name__} needs at least one {kinds}.")
        element_names("body", self.bodies)

    def _set_elements(self, joints, forces, stops, controller, couplings=()):
        """`joints`, `forces`, `stops`, `couplings` (with their names) and `controller`,
        checked against the bodies: each element of the mechanism's dimension, on markers
        and joints it has; each joint between two bodies; each coupling between joints
        with coordinates; a controller (default: a constant zero input of the size the
        actuators need)."""
        self.joints = kind_check(
            "joints", joints, AbstractJoint, "joints (jaxdae.multibody.Revolute, Prismatic, ...)"
        )
        self.forces = kind_check(
            "forces",
            forces,
            AbstractForce,
            "force elements (jaxdae.multibody.Gravity, SpringDamper, ...)",
        )
        self.stops = kind_check(
            "stops", stops, AbstractStop, "stops (jaxdae.multibody.JointLimit, PlaneContact, ...)"
        )
        self.couplings = kind_check(
            "couplings", couplings, JointCoupling, "jaxdae.multibody.JointCoupling instances"
        )
        self.joint_names = element_names("joint", self.joints)
        self.force_names = element_names("force element", self.forces)
        self.stop_names = element_names("stop", self.stops)
        self.coupling_names = element_names("coupling", self.couplings)
        for kind, names, elements in (
            ("joint", self.joint_names, self.joints),
            ("force element", self.force_names, self.forces),
            ("stop", self.stop_names, self.stops),
            ("coupling", self.coupling_names, self.couplings),
        ):
            for name, element in zip(names, elements, strict=True):
                self._check_element(kind, name, element)
        channels = [c for force in self.forces for c in force.channels]
        if controller is None:
            controller = ConstantControl(jnp.zeros((max(channels, default=-1) + 1,)))
        if not isinstance(controller, AbstractController):
            raise ValueError(
                "`controller` must be a jaxdae.AbstractController; got "
                f"{type(controller).__name__}."
            )
        self.controller = controller

    def _check_element(self, kind, name, element):
        """Raise `ValueError` where the element (a joint, force element or stop) does not
        fit the mechanism."""
        if kind != "coupling":
            element.check_dimension(self.dimension, f"{kind} {name!r}")
        refs = (element.a, element.b) if kind == "joint" else getattr(element, "markers", ())
        for ref in refs:
            self._check_ref(f"{kind} {name!r}", ref)
        for joint in () if kind == "joint" else element.joints:  # stops', couplings' joints
            if not self.joints[self._joint_index(joint, f"The {kind} {name!r}")].has_coordinate:
                raise ValueError(
                    f"The {kind} {name!r} acts on joint {joint!r}, which has no joint "
                    "coordinate (a revolute, prismatic, cylindrical or point-on-line "
                    "joint has one)."
                )
        if kind == "joint" and split(element.a)[0] == split(element.b)[0]:
            raise ValueError(
                f"Joint {name!r} joins body {split(element.a)[0]!r} to itself "
                f"({element.a!r} and {element.b!r}): a joint connects two bodies."
            )

    def _check_wrapped(self):
        """Raise `ValueError` for a joint limit beyond `±π` or a coupling on a joint whose
        angle this mechanism measures in `(−π, π]` (`_wrapped_joints`): the gap of such a
        bound never closes and the coupling's residual jumps by `2π` where the angle wraps."""
        wrapped = set(self._wrapped_joints())
        fix = (
            "Describe the mechanism in joint coordinates (a "
            'jaxdae.multibody.TreeMechanism, or `coordinates="joint"` for a URDF robot), '
            "where a revolute joint's angle is a coordinate that turns without wrapping"
        )
        kind = type(self).__name__
        for name, stop in zip(self.stop_names, self.stops, strict=True):
            if not (isinstance(stop, JointLimit) and stop.joint in wrapped):
                continue
            beyond = [
                (side, float(bound))
                for side, bound in (("lower", stop.lower), ("upper", stop.upper))
                if bound is not None and is_concrete(bound) and abs(float(bound)) > np.pi
            ]
            if beyond:
                listed = ", ".join(f"`{side}` {value:g}" for side, value in beyond)
                raise ValueError(
                    f"The JointLimit {name!r} bounds joint {stop.joint!r} beyond ±π ({listed}), "
                    f"but this {kind} measures the joint's angle in (−π, π]: the angle wraps at "
                    f"±π and never reaches the bound. {fix}, or give bounds within [−π, π]."
                )
        for name, coupling in zip(self.coupling_names, self.couplings, strict=True):
            turning = [j for j in coupling.joints if j in wrapped]
            if turning:
                raise ValueError(
                    f"The JointCoupling {name!r} couples joint {turning[0]!r}, whose angle this "
                    f"{kind} measures in (−π, π]: the coupling would break where the angle "
                    f"wraps at ±π. {fix}."
                )

    def _check_ref(self, owner, ref):
        """Raise `ValueError` where `ref` names a body or marker the mechanism lacks."""
        body, marker = split(ref)
        names = (GROUND,) + self.body_names
        if body not in names:
            raise ValueError(
                f"The {owner} refers to body {body!r}, which is not in the mechanism (bodies: "
                f"{', '.join(names)}). Add the body to `bodies` or fix the name."
            )
        if marker is not None and marker not in self.body(body).markers:
            known = sorted(self.body(body).markers)
            raise ValueError(
                f"The {owner} refers to marker {ref!r}, but body {body!r} has no marker "
                f"{marker!r} (its markers: {known or 'none'}). Add it to the body's "
                "`markers` or refer to the body alone for its centre of mass."
            )

    # -- structure ---------------------------------------------------------------------

    @property
    def body_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.bodies)

    @property
    def masses(self) -> Float[Array, " bodies"]:
        return jnp.stack([b.mass for b in self.bodies])

    def body(self, name: str) -> PlanarBody | RigidBody | Ground:
        """The body called `name` (the ground for `"ground"`)."""
        return self.ground if name == GROUND else self.bodies[self.body_names.index(name)]

    def joint(self, name: str) -> AbstractJoint:
        """The joint called `name`."""
        return self.joints[self._joint_index(name)]

    def _joint_index(self, name, owner=None):
        if name not in self.joint_names:
            where = (
                f"{owner} refers to joint {name!r}, which is not in the mechanism"
                if owner
                else f"No joint named {name!r}"
            )
            raise ValueError(f"{where}; the joints are {list(self.joint_names)}.")
        return self.joint_names.index(name)

    def _inputs(self, t, q, v):
        """The controller's output at `(t, q, v)`, or `None` where no force element reads it."""
        return self.controller(t, q, v) if any(f.channels for f in self.forces) else None

    def _coupling_residuals(self, kin, dtype):
        """The couplings' residuals `(couplings,)`, their joints' coordinates read from
        `kin`."""
        return jnp.concatenate(
            [coupling.residual(kin.coordinate).astype(dtype) for coupling in self.couplings]
        )

    # -- outputs -----------------------------------------------------------------------

    def marker_position(self, q: Float[Array, "*batch n"], marker: str) -> Float[Array, "*batch d"]:
        """The position of `marker` (`"body.marker"` or `"body"`) in the global frame; `q`
        may carry leading (time, batch) axes, e.g. `sol.q`."""
        self._check_ref("request", marker)
        return over_leading(lambda q_: self._kinematics(0.0, q_).frame(marker).point, q)

    def marker_velocity(
        self, q: Float[Array, "*batch n"], v: Float[Array, "*batch n"], marker: str
    ) -> Float[Array, "*batch d"]:
        """The velocity of `marker` in the global frame, `ṙ + ω × R s` (`ω` the body's
        angular velocity; `θ̇` about z in the plane)."""
        self._check_ref("request", marker)
        return over_leading(lambda q_, v_: self._kinematics(0.0, q_, v_).velocity(marker)[0], q, v)

    def marker_rotation(
        self, q: Float[Array, "*batch n"], marker: str
    ) -> Float[Array, "*batch d d"]:
        """The orientation of `marker`'s frame in the global frame (its body's rotation times
        the marker's orientation on the body)."""
        self._check_ref("request", marker)
        return over_leading(lambda q_: self._kinematics(0.0, q_).frame(marker).rotation, q)

    def angular_velocity(
        self, q: Float[Array, "*batch n"], v: Float[Array, "*batch n"], name: str
    ) -> Float[Array, "*batch"] | Float[Array, "*batch 3"]:
        """Body `name`'s angular velocity: `θ̇` in the plane, the vector `ω` in the global
        frame in space."""
        self._check_ref("request", name)
        return over_leading(lambda q_, v_: self._kinematics(0.0, q_, v_).velocity(name)[1], q, v)

    def joint_coordinate(
        self, name: str, q: Float[Array, " n"], t: ScalarLike = 0.0
    ) -> Float[Array, ""]:
        """The coordinate of joint `name` at one configuration `q` (see
        `joint_coordinates`)."""
        return self._kinematics(t, q).coordinate(name)

    def joint_coordinates(self, q: Float[Array, "*batch n"]) -> dict[str, Float[Array, "*batch"]]:
        """The joint coordinates by joint name: a revolute joint's relative angle
        (`θ_b − θ_a` in the plane; in `(−π, π]` about its axis in space), a prismatic,
        cylindrical or point-on-line joint's displacement along its axis. A
        [`jaxdae.multibody.TreeMechanism`][]'s tree joints read theirs from `q`."""
        names = [n for n, j in zip(self.joint_names, self.joints, strict=True) if j.has_coordinate]

        def coords(q_):
            kin = self._kinematics(0.0, q_)
            return {n: kin.coordinate(n) for n in names}

        return over_leading(coords, q)

    def joint_rates(
        self, q: Float[Array, "*batch n"], v: Float[Array, "*batch n"]
    ) -> dict[str, Float[Array, "*batch"]]:
        """The rates of the joint coordinates, `d/dt joint_coordinates(q)`."""
        return over_leading(lambda q_, v_: jax.jvp(self.joint_coordinates, (q_,), (v_,))[1], q, v)

    # -- one-sided constraints ---------------------------------------------------------

    def gaps(self, t, q):
        """The stops' gaps in the order of `stops` (see `gap_names`)."""
        if not self.stops:
            return jnp.zeros((0,), q.dtype)
        return self._stop_gaps(self._kinematics(t, q))

    def _stop_gaps(self, kin) -> Float[Array, " u"]:
        """The stops' gaps read from the kinematics `kin` (at least one stop)."""
        stop_kin = StopKinematics(kin.frame, kin.coordinate, kin.velocity, self.dimension)
        return jnp.concatenate([stop.gaps(stop_kin) for stop in self.stops])

    def restitution(self):
        """The stops' coefficients of restitution, one per gap."""
        return (
            jnp.concatenate(
                [jnp.broadcast_to(stop.restitution, (stop.num_gaps,)) for stop in self.stops]
            )
            if self.stops
            else 0.0
        )

    def friction(self):
        """The stops' coefficients of friction, one per gap (`0` without friction): a NumPy
        array where every stop's is known, so that frictionless contacts stay frictionless
        at trace time where the mechanism is built inside `jax.jit`."""
        if not self.stops:
            return 0.0
        coefficients = [stop.friction_coefficients() for stop in self.stops]
        return (np.concatenate if is_concrete(coefficients) else jnp.concatenate)(coefficients)

    @property
    def constraints_are_regular(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        """True without joints and couplings (see
        [`jaxdae.AbstractSystem.constraints_are_regular`][]): the only constraints are then
        the spatial bodies' unit-norm constraints, `G`'s rows `[0, pᵀ]` of distinct bodies'
        Euler parameters `p`, independent wherever no `p` vanishes (a tree in joint
        coordinates has none)."""
        return not self.joints and not self.couplings

    def stop_checks(self):
        """The stops' checks of their values where they are traced (see
        [`jaxdae.AbstractSystem.stop_checks`][]), each rule naming its stop."""
        return tuple(
            (problem, f"Stop {name!r}: {rule}")
            for name, stop in zip(self.stop_names, self.stops, strict=True)
            for problem, rule in stop.value_checks()
        )

    def slip_velocities(self, t, q, v):
        """The sliding velocities of the stops' contacts, one row per gap (zero for gaps
        without a sliding direction): `(u,)` in the plane, `(u, 2)` in space (two
        orthonormal tangents)."""
        tangents = (self.dimension - 1,) if self.dimension == 3 else ()
        if not self.stops:
            return jnp.zeros((0, *tangents), q.dtype)
        slip = self._stop_slips(self._kinematics(t, q, v), q.dtype)
        return slip.reshape(slip.shape[0], *tangents)

    def _stop_slips(self, kin, dtype) -> Array:
        """The stops' sliding velocities read from the kinematics `kin` (at least one
        stop), one row per gap."""
        stop_kin = StopKinematics(kin.frame, kin.coordinate, kin.velocity, self.dimension)
        return jnp.concatenate(
            [stop.slip_velocities(stop_kin).astype(dtype) for stop in self.stops]
        )

    def gap_label(self, index: int) -> str:
        """Gap `index` with its name in `gap_names`."""
        return f"gap {index} ({self.gap_names[index]!r})"

    @property
    def gap_names(self) -> tuple[str, ...]:
        """The gaps' names: each stop's name, with its label per gap (`.lower`, `.upper`)."""
        return tuple(
            f"{name}.{label}" if label else name
            for name, stop in zip(self.stop_names, self.stops, strict=True)
            for label in stop.gap_labels
        )

    # -- analysis ----------------------------------------------------------------------

    def mobility(
        self, q: Float[ArrayLike, " n"] | None = None, t: ScalarLike = 0.0, *, rtol: float = 1e-9
    ) -> Mobility:
        """The Grübler count against the rank of the constraint Jacobian at `q`. The Euler
        parameters' norms of a [`jaxdae.multibody.TreeMechanism`][] count as coordinates
        held by nothing.

        **Arguments:**

        - `q`: the configuration (default: the bodies' `position` and `angle` or
            `orientation`). Redundancy shows at a consistent configuration: take one from
            `initial_state`.
        - `t`: the time.
        - `rtol`: singular values of `Φ_q` below `rtol · σ_max` count as zero.

        **Returns:**

        A [`jaxdae.multibody.Mobility`][] (Python integers; not for use under `jit`).
        """
        q = self.reference_coordinates() if q is None else jnp.asarray(q, dtype=float)
        n, m = q.shape[0], self.num_equations
        rank = constraint_rank(self, q, t, rtol)
        free = n - self._unheld_coordinates()
        return Mobility(
            coordinates=n,
            equations=m,
            grubler=free - m,
            rank=rank,
            dof=free - rank,
            redundant=m - rank,
        )

    def initial_state(
        self,
        t0: ScalarLike = 0.0,
        q: Float[ArrayLike, " n"] | None = None,
        v: Float[ArrayLike, " n"] | None = None,
        *,
        joint_coordinates: Mapping[str, ArrayLike | tuple[ArrayLike, ArrayLike]] | None = None,
        tol: float | None = None,
        max_steps: int = 64,
    ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """A consistent state `(q, v)` (`Φ = 0`, `Φ̇ = 0`) near a guess, with prescribed
        joint coordinates.

        The joints named in `joint_coordinates` are driven to the given values (and rates)
        while the state nearest the guess in the mass metric is found by
        [`jaxdae.consistent_initial_state`][]. A [`jaxdae.multibody.TreeMechanism`][]'s
        tree joints take their values and rates as coordinates; it solves only where joints
        close loops.

        **Arguments:**

        - `t0`: the time.
        - `q`, `v`: the guess; default the bodies' given poses (`reference_coordinates`),
            and rest.
        - `joint_coordinates`: by joint name, a value or `(value, rate)` of its joint
            coordinate (see `joint_coordinates`): e.g. `{"crank": (0.5, 10.0)}`.
        - `tol`, `max_steps`: as for [`jaxdae.consistent_initial_state`][].

        **Returns:**

        `(q, v)`.

        **Raises:**

        `ValueError` for a joint that is not in the mechanism or has no joint coordinate,
        and from [`jaxdae.consistent_initial_state`][] when no consistent state is found.
        """
        q = self.reference_coordinates() if q is None else jnp.asarray(q, dtype=float)
        v = jnp.zeros_like(q) if v is None else jnp.asarray(v, dtype=q.dtype)
        held = prescribed(self, joint_coordinates, q.dtype)
        q, v, system = self._driven(jnp.asarray(t0, q.dtype), q, v, held)
        if system is None:
            return q, v
        return consistent_initial_state(system, t0, q, v, tol=tol, max_steps=max_steps)


def constraint_rank(mechanism, q, t, rtol: float) -> int:
    """The rank of the constraint Jacobian `Φ_q` of `mechanism` at `(t, q)`: its singular
    values above `rtol · σ_max` (0 without constraints)."""
    if not mechanism.num_equations:
        return 0
    jac = np.asarray(jax.jacfwd(mechanism.constraints, argnums=1)(jnp.asarray(t, q.dtype), q))
    sigma = np.linalg.svd(jac, compute_uv=False)
    return int(np.sum(sigma > rtol * max(sigma[0], np.finfo(jac.dtype).tiny)))


def prescribed(mechanism, joint_coordinates, dtype) -> "Prescribed":
    """The joints and `(value, rate)`s of `joint_coordinates` (by joint name, a value or a
    pair), checked: each joint must be in `mechanism` and have a coordinate."""
    names, values, rates = [], [], []
    for name, value in (joint_coordinates or {}).items():
        joint = mechanism.joint(name)
        if not joint.has_coordinate:
            with_one = sorted(
                n
                for n, j in zip(mechanism.joint_names, mechanism.joints, strict=True)
                if j.has_coordinate
            )
            raise ValueError(
                f"Joint {name!r} has no joint coordinate to prescribe; joints with one: {with_one}."
            )
        value, rate = value if isinstance(value, tuple) else (value, 0.0)
        names.append(name)
        values.append(jnp.asarray(value, dtype))
        rates.append(jnp.asarray(rate, dtype))
    empty = jnp.zeros((0,), dtype)
    return Prescribed(
        tuple(names), jnp.stack(values) if names else empty, jnp.stack(rates) if names else empty
    )


class Prescribed(eqx.Module):
    """Joint coordinates prescribed along `value + rate (t − t0)`, by joint name."""

    names: tuple[str, ...] = eqx.field(static=True)
    values: Float[Array, " d"]
    rates: Float[Array, " d"]


class Driven(LagrangianSystem):
    """`mechanism` with the joint coordinates of `prescribed` driven along
    `value + rate (t − t0)`: what `initial_state` finds a consistent state of."""

    mechanism: LagrangianSystem | eqx.Module
    prescribed: Prescribed
    t0: Float[Array, ""]

    def mass_matrix(self, t, q):
        return self.mechanism.mass_matrix(t, q)

    def constraints(self, t, q):
        parts = [self.mechanism.constraints(t, q)]
        if self.prescribed.names:
            coords = self.mechanism.joint_coordinates(q)
            driven = jnp.stack([coords[n] for n in self.prescribed.names])
            parts.append(driven - self.prescribed.values - self.prescribed.rates * (t - self.t0))
        return jnp.concatenate(parts)
