"""A planar mechanism assembled from bodies, joints and force elements: a jaxdae system."""

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._analysis._consistent import consistent_initial_state
from .._analysis._control import AbstractController, ConstantControl
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from .._systems._system import LagrangianSystem
from ._body import GROUND, Ground, PlanarBody
from ._force import AbstractForce
from ._joint import AbstractJoint
from ._kinematics import Kinematics, split


class Reaction(NamedTuple):
    """The load a joint exerts on its second body (marker `b`), from the multipliers.

    - `force`: the force in the global frame, `(..., 2)`.
    - `torque`: the moment about marker `b`, `(...)` (zero for a revolute joint).

    The joint exerts `−force` on the body of marker `a`.
    """

    force: Float[Array, "*batch 2"]
    torque: Float[Array, "*batch"]


class Mobility(NamedTuple):
    """Degrees of freedom of a mechanism at a configuration.

    - `coordinates`: `n = 3 ×` bodies.
    - `equations`: `m`, the number of constraint equations of the joints.
    - `grubler`: the Grübler (Chebychev–Grübler–Kutzbach) count `n − m`.
    - `rank`: the rank `r` of the constraint Jacobian `Φ_q` there.
    - `dof`: the degrees of freedom `n − r`.
    - `redundant`: the redundant constraint equations `m − r` (`dof − grubler`).
    """

    coordinates: int
    equations: int
    grubler: int
    rank: int
    dof: int
    redundant: int


def _cross(a, b):
    return a[0] * b[1] - a[1] * b[0]


def _over_leading(fn, *arrays):
    """`fn` on the last axis of `arrays`, mapped over their (shared) leading axes."""
    batch = arrays[0].shape[:-1]
    if not batch:
        return fn(*arrays)
    flat = [x.reshape((-1, x.shape[-1])) for x in arrays]
    out = jax.vmap(fn)(*flat)
    return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


def _kind_check(name, items, kind, expected):
    items = tuple(items)
    for item in items:
        if not isinstance(item, kind):
            what = (f"the class {item.__name__} itself (pass an instance)"
                    if isinstance(item, type) else repr(type(item).__name__))
            raise ValueError(f"`{name}` must hold {expected}; got {what}.")
    return items


def _names(kind, elements):
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


class Mechanism(LagrangianSystem):
    """A planar mechanism of rigid bodies, joints and force elements, as a jaxdae system.

    **Coordinates.** Each body has the absolute coordinates `(x, y, θ)` of its centre of
    mass and its orientation; `q = (x₁, y₁, θ₁, x₂, y₂, θ₂, …)` in the order of `bodies`
    (see `coordinate_names`). The mass matrix is then constant and diagonal,
    `diag(m₁, m₁, I₁, m₂, …)`, there are no velocity-dependent inertial forces, and each
    joint's constraints involve only its two bodies' coordinates (a sparse Jacobian).
    These are the absolute (reference-point) coordinates of Nikravesh's and Haug's planar
    multibody texts, also those of Exudyn's `RigidBody2D`. They cost more coordinates than
    joint (relative) coordinates, but every joint is a local, closed-form constraint and
    closed loops need nothing special; redundant joints (a parallelogram's extra bar) show
    as a rank-deficient `Φ_q` (see `mobility`).

    **The system.** `Mechanism` is a [`jaxdae.LagrangianSystem`][]: `Φ` stacks the joints'
    equations in the order of `joints`, `V` sums gravity and the springs, the generalized
    forces sum the dampers' and actuators' loads. Every formulation,
    [`jaxdae.simulate`][], [`jaxdae.consistent_initial_state`][], [`jaxdae.linearize`][]
    and the gradients work on it; every number (masses, inertias, marker positions, joint
    axes and lengths, spring constants) is an array leaf that `eqx.filter_grad` reaches.
    A redundant mechanism (see [`jaxdae.multibody.Mechanism.mobility`][]) runs with
    [`jaxdae.PseudoInverse`][].

    **Inputs.** Force elements whose `actuator` is an integer `i` read
    `u = controller(t, q, v)[i]`, so `jaxdae.with_controller(mechanism, controller)`
    closes a loop and [`jaxdae.linearize`][] finds the input matrix.

    !!! Example "A slider-crank"

        ```python
        import jaxdae.multibody as mb

        mechanism = mb.Mechanism(
            bodies=[
                mb.PlanarBody("crank", mass=1.0, inertia=1e-3, markers={"pin": (0.1, 0.0)}),
                mb.PlanarBody("rod", mass=0.5, inertia=4e-3,
                              markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)}, position=(0.25, 0.0)),
                mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0)),
            ],
            joints=[mb.Revolute("ground", "crank", name="crank"), mb.Revolute("crank.pin", "rod.a"),
                    mb.Revolute("rod.b", "slider"), mb.Prismatic("ground", "slider")],
            forces=[mb.Gravity()],
        )
        q0, v0 = mechanism.initial_state(joint_coordinates={"crank": (0.5, 10.0)})
        ```

    **Arguments:**

    - `bodies`: the [`jaxdae.multibody.PlanarBody`][]s, optionally with a
        [`jaxdae.multibody.Ground`][] that carries markers on the fixed frame.
    - `joints`: [`jaxdae.multibody.AbstractJoint`][]s (revolute, prismatic, ...).
    - `forces`: force elements ([`jaxdae.multibody.Gravity`][], spring-dampers, applied
        forces and torques).
    - `controller`: the [`jaxdae.AbstractController`][] whose output the actuators with an
        input channel read. Default: a constant zero input of the size they need.

    **Raises:**

    `ValueError` before any solve for: an element that is not a body, joint or force
    element; duplicate body, joint or force names; a joint or force on a body that is not
    in the mechanism or on a marker its body does not have; a joint between a body and
    itself; a body with non-positive mass or inertia (from [`jaxdae.multibody.PlanarBody`][]).
    """

    bodies: tuple[PlanarBody, ...]
    ground: Ground
    joints: tuple[AbstractJoint, ...]
    forces: tuple[AbstractForce, ...]
    controller: AbstractController
    joint_names: tuple[str, ...] = eqx.field(static=True)
    force_names: tuple[str, ...] = eqx.field(static=True)

    def __init__(
        self,
        bodies: Sequence[PlanarBody | Ground],
        joints: Sequence[AbstractJoint] = (),
        forces: Sequence[AbstractForce] = (),
        *,
        controller: AbstractController | None = None,
    ):
        items = _kind_check("bodies", bodies, (PlanarBody, Ground),
                           "jaxdae.multibody.PlanarBody (or one Ground) instances")
        grounds = [b for b in items if isinstance(b, Ground)]
        if len(grounds) > 1:
            raise ValueError("`bodies` holds more than one Ground; merge their markers into one.")
        self.ground = grounds[0] if grounds else Ground()
        self.bodies = tuple(b for b in items if isinstance(b, PlanarBody))
        if not self.bodies:
            raise ValueError("A Mechanism needs at least one PlanarBody.")
        _names("body", self.bodies)
        self.joints = _kind_check("joints", joints, AbstractJoint,
                                  "joints (jaxdae.multibody.Revolute, Prismatic, ...)")
        self.forces = _kind_check("forces", forces, AbstractForce,
                                  "force elements (jaxdae.multibody.Gravity, SpringDamper, ...)")
        self.joint_names = _names("joint", self.joints)
        self.force_names = _names("force element", self.forces)
        for kind, names, elements in (("joint", self.joint_names, self.joints),
                                      ("force element", self.force_names, self.forces)):
            for name, element in zip(names, elements):
                refs = (element.a, element.b) if kind == "joint" else element.markers
                for ref in refs:
                    self._check_ref(f"{kind} {name!r}", ref)
                if kind == "joint" and split(element.a)[0] == split(element.b)[0]:
                    raise ValueError(
                        f"Joint {name!r} joins body {split(element.a)[0]!r} to itself "
                        f"({element.a!r} and {element.b!r}): a joint connects two bodies."
                    )
        channels = [c for force in self.forces for c in force.channels]
        if controller is None:
            controller = ConstantControl(jnp.zeros((max(channels, default=-1) + 1,)))
        if not isinstance(controller, AbstractController):
            raise ValueError(
                "`controller` must be a jaxdae.AbstractController; got "
                f"{type(controller).__name__}."
            )
        self.controller = controller

    # -- structure ---------------------------------------------------------------------

    @property
    def body_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.bodies)

    @property
    def coordinate_names(self) -> tuple[str, ...]:
        """`("crank.x", "crank.y", "crank.theta", ...)`, the order of `q`."""
        return tuple(f"{b}.{c}" for b in self.body_names for c in ("x", "y", "theta"))

    @property
    def num_equations(self) -> int:
        """`m`, the number of constraint equations."""
        return sum(j.num_equations for j in self.joints)

    def slot(self, name: str) -> int:
        """The index of body `name` in `bodies` (its coordinates are `q[3i : 3i + 3]`);
        −1 for the ground."""
        return -1 if name == GROUND else self.body_names.index(name)

    def body(self, name: str) -> PlanarBody | Ground:
        return self.ground if name == GROUND else self.bodies[self.slot(name)]

    def joint_rows(self, name: str) -> slice:
        """The rows of joint `name` in `Φ` (and in the holonomic multipliers)."""
        index = self._joint_index(name)
        start = sum(j.num_equations for j in self.joints[:index])
        return slice(start, start + self.joints[index].num_equations)

    def _joint_index(self, name):
        if name not in self.joint_names:
            raise ValueError(f"No joint named {name!r}; the joints are {list(self.joint_names)}.")
        return self.joint_names.index(name)

    def _check_ref(self, owner, ref):
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

    @property
    def masses(self) -> Float[Array, " bodies"]:
        return jnp.stack([b.mass for b in self.bodies])

    @property
    def inertias(self) -> Float[Array, " bodies"]:
        return jnp.stack([b.inertia for b in self.bodies])

    def _diagonal(self):
        m = self.masses
        return jnp.stack([m, m, self.inertias], axis=-1).reshape(-1)

    # -- the LagrangianSystem ----------------------------------------------------------

    def mass_matrix(self, t, q):
        return jnp.diag(self._diagonal().astype(q.dtype))

    def kinetic_energy(self, t, q, v):
        return 0.5 * jnp.sum(self._diagonal() * v**2)

    def potential_energy(self, t, q):
        kin = Kinematics(self, t, q)
        return sum((f.potential_energy(kin) for f in self.forces), jnp.zeros((), q.dtype))

    def generalized_forces(self, t, q, v):
        needs_input = any(f.channels for f in self.forces)
        kin = Kinematics(self, t, q, v, self.controller(t, q, v) if needs_input else None)
        forces = jnp.zeros_like(q)
        for element in self.forces:
            for load in element.loads(kin):
                slot = self.slot(split(load.at)[0])
                if slot < 0:
                    continue  # the ground takes it
                frame = kin.frame(load.at)
                moment = _cross(frame.point - frame.origin, load.force) + load.torque
                forces = forces.at[3 * slot : 3 * slot + 3].add(
                    jnp.concatenate([load.force, moment[None]]).astype(q.dtype))
        return forces

    def constraints(self, t, q):
        if not self.joints:
            return jnp.zeros((0,), q.dtype)
        kin = Kinematics(self, t, q)
        return jnp.concatenate([
            jnp.asarray(j.residual(t, kin.frame(j.a), kin.frame(j.b)), q.dtype)
            for j in self.joints
        ])

    # -- outputs -----------------------------------------------------------------------

    def body_coordinates(self, q: Float[Array, "*batch n"], name: str) -> Float[Array, "*batch 3"]:
        """`(x, y, θ)` of body `name`; `q` may carry leading (time, batch) axes."""
        self._check_ref("request", name)
        slot = self.slot(name)
        return q[..., 3 * slot : 3 * slot + 3]

    def marker_position(self, q: Float[Array, "*batch n"], marker: str) -> Float[Array, "*batch 2"]:
        """The position of `marker` (`"body.marker"` or `"body"`) in the plane; `q` may carry
        leading (time, batch) axes, e.g. `sol.q`."""
        self._check_ref("request", marker)
        return _over_leading(lambda q_: Kinematics(self, 0.0, q_).frame(marker).point, q)

    def marker_velocity(self, q: Float[Array, "*batch n"], v: Float[Array, "*batch n"],
                        marker: str) -> Float[Array, "*batch 2"]:
        """The velocity of `marker` in the plane, `ṙ + θ̇ R(θ + π/2) s`."""
        self._check_ref("request", marker)
        return _over_leading(lambda q_, v_: Kinematics(self, 0.0, q_, v_).velocity(marker)[0],
                             q, v)

    def _coordinate_joints(self):
        return [(name, j) for name, j in zip(self.joint_names, self.joints)
                if type(j).coordinate is not AbstractJoint.coordinate]

    def joint_coordinates(self, q: Float[Array, "*batch n"]) -> dict[str, Float[Array, "*batch"]]:
        """The joint coordinates by joint name: a revolute joint's relative angle
        `θ_b − θ_a`, a prismatic or point-on-line joint's displacement along its axis."""
        def coords(q_):
            kin = Kinematics(self, 0.0, q_)
            return {n: j.coordinate(kin.frame(j.a), kin.frame(j.b))
                    for n, j in self._coordinate_joints()}
        return _over_leading(coords, q)

    def joint_rates(self, q: Float[Array, "*batch n"], v: Float[Array, "*batch n"]
                    ) -> dict[str, Float[Array, "*batch"]]:
        """The rates of the joint coordinates, `d/dt joint_coordinates(q)`."""
        return _over_leading(lambda q_, v_: jax.jvp(self.joint_coordinates, (q_,), (v_,))[1],
                             q, v)

    def reactions(self, q: Float[Array, "*batch n"], multipliers: Float[Array, "*batch c"],
                  t: Float[ArrayLike, "*batch"] = 0.0) -> dict[str, Reaction]:
        """The joints' reaction loads from the multipliers of a solve, by joint name.

        The constraint forces are `−Φ_qᵀ λ` (`M q̈ = Q − Φ_qᵀ λ`); each joint's rows give
        the force and torque it exerts on its bodies, reported as a
        [`jaxdae.multibody.Reaction`][] on the body of marker `b` (about that marker).

        **Arguments:**

        - `q`, `multipliers`: e.g. `sol.q` and `sol.multipliers` of a
            [`jaxdae.Solution`][] (leading axes are mapped over; the first `m` multipliers
            are the holonomic ones).
        - `t`: the times (e.g. `sol.ts`), for joints whose Jacobian depends on time.
        """
        m = self.num_equations

        def one(q_, lam, t_):
            t_ = t_[0]
            kin = Kinematics(self, t_, q_)
            out = {}
            for name, joint in zip(self.joint_names, self.joints):
                rows = self.joint_rows(name)

                def residual(q__, joint=joint):
                    k = Kinematics(self, t_, q__)
                    return joint.residual(t_, k.frame(joint.a), k.frame(joint.b))

                _, vjp = jax.vjp(residual, q_)
                (load,) = vjp(-lam[rows])
                point = kin.frame(joint.b).point
                slot_b = self.slot(split(joint.b)[0])
                if slot_b >= 0:
                    force = load[3 * slot_b : 3 * slot_b + 2]
                    origin = kin.frame(joint.b).origin
                    torque = load[3 * slot_b + 2] - _cross(point - origin, force)
                else:  # the ground: action and reaction on the body of marker a
                    slot_a = self.slot(split(joint.a)[0])
                    force_a = load[3 * slot_a : 3 * slot_a + 2]
                    origin = kin.frame(joint.a).origin
                    force = -force_a
                    torque = -(load[3 * slot_a + 2] - _cross(point - origin, force_a))
                out[name] = Reaction(force, torque)
            return out

        t = jnp.broadcast_to(jnp.asarray(t, q.dtype), q.shape[:-1])[..., None]
        return _over_leading(lambda q_, lam, t_: one(q_, lam[..., :m], t_), q, multipliers, t)

    # -- analysis ----------------------------------------------------------------------

    def mobility(self, q: Float[ArrayLike, " n"] | None = None, t: ScalarLike = 0.0, *,
                 rtol: float = 1e-9) -> Mobility:
        """The Grübler count against the rank of the constraint Jacobian at `q`.

        **Arguments:**

        - `q`: the configuration (default: the bodies' `position` and `angle`). Redundancy
            shows at a consistent configuration: take one from `initial_state`.
        - `t`: the time.
        - `rtol`: singular values of `Φ_q` below `rtol · σ_max` count as zero.

        **Returns:**

        A [`jaxdae.multibody.Mobility`][] (Python integers; not for use under `jit`).
        """
        q = self.reference_coordinates() if q is None else jnp.asarray(q, dtype=float)
        n, m = q.shape[0], self.num_equations
        if m:
            jac = np.asarray(jax.jacfwd(self.constraints, argnums=1)(jnp.asarray(t, q.dtype), q))
            sigma = np.linalg.svd(jac, compute_uv=False)
            rank = int(np.sum(sigma > rtol * max(sigma[0], np.finfo(jac.dtype).tiny)))
        else:
            rank = 0
        return Mobility(coordinates=n, equations=m, grubler=n - m, rank=rank, dof=n - rank,
                        redundant=m - rank)

    def reference_coordinates(self) -> Float[Array, " n"]:
        """`q` from the bodies' `position` and `angle` (a guess; need not satisfy `Φ`)."""
        return jnp.concatenate([jnp.concatenate([b.position, b.angle[None]]) for b in self.bodies])

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
        [`jaxdae.consistent_initial_state`][].

        **Arguments:**

        - `t0`: the time.
        - `q`, `v`: the guess; default the bodies' `position` and `angle`, and rest.
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
        system = self
        if joint_coordinates:
            with_coordinate = dict(self._coordinate_joints())
            names, values, rates = [], [], []
            for name, value in joint_coordinates.items():
                self._joint_index(name)
                if name not in with_coordinate:
                    raise ValueError(
                        f"Joint {name!r} has no joint coordinate to prescribe; joints with one: "
                        f"{sorted(with_coordinate)}."
                    )
                value, rate = value if isinstance(value, tuple) else (value, 0.0)
                names.append(name)
                values.append(jnp.asarray(value, q.dtype))
                rates.append(jnp.asarray(rate, q.dtype))
            system = _Driven(self, tuple(names), jnp.stack(values), jnp.stack(rates),
                             jnp.asarray(t0, q.dtype))
        return consistent_initial_state(system, t0, q, v, tol=tol, max_steps=max_steps)


class _Driven(LagrangianSystem):
    """`mechanism` with its named joint coordinates driven along `value + rate (t − t0)`."""

    mechanism: Mechanism
    names: tuple[str, ...] = eqx.field(static=True)
    values: Float[Array, " d"]
    rates: Float[Array, " d"]
    t0: Float[Array, ""]

    def mass_matrix(self, t, q):
        return self.mechanism.mass_matrix(t, q)

    def constraints(self, t, q):
        coords = self.mechanism.joint_coordinates(q)
        driven = jnp.stack([coords[n] for n in self.names])
        return jnp.concatenate([self.mechanism.constraints(t, q),
                                driven - self.values - self.rates * (t - self.t0)])
