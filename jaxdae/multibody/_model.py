"""A mechanism assembled from bodies, joints and force elements: a jaxdae system."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._gather import add_at, take
from .._custom_types import Array, ArrayLike, Float
from .._systems._control import AbstractController
from .._systems._system import LagrangianSystem
from ._body import GROUND, Ground, PlanarBody, RigidBody, rigid_kinetic_energy, rigid_mass_matrix
from ._coupling import JointCoupling
from ._force import AbstractForce
from ._groups import group_key, groups, reorder, vmapped
from ._joint import AbstractJoint
from ._kinematics import ElementKinematics, Kinematics, split
from ._mechanism import AbstractMechanism, Driven, kind_check, over_leading
from ._results import Reaction
from ._stop import AbstractStop


def _moment(arm, force):
    if arm.shape[0] == 2:
        return arm[0] * force[1] - arm[1] * force[0]
    return jnp.cross(arm, force)


class Mechanism(AbstractMechanism, LagrangianSystem):
    """A planar or spatial mechanism of rigid bodies, joints and force elements, as a
    jaxdae system.

    **Coordinates.** Each body has absolute coordinates: a planar body
    ([`jaxdae.multibody.PlanarBody`][]) the position `(x, y)` of its centre of mass and its
    angle `θ`, a spatial one ([`jaxdae.multibody.RigidBody`][]) the position `(x, y, z)` and
    the Euler parameters `(e₀, e₁, e₂, e₃)` of its orientation; `q` lists them body by body
    in the order of `bodies` (see `coordinate_names`). In the plane the mass matrix is
    constant and diagonal, `diag(m₁, m₁, I₁, m₂, …)`; in space it is block diagonal, one
    `7 × 7` block per body. Each joint's constraints involve only its two bodies'
    coordinates (a sparse Jacobian). These are the absolute (reference-point) coordinates of
    Nikravesh's and Haug's multibody texts, also those of Exudyn's `RigidBody2D` and
    `RigidBodyEP`. They cost more coordinates than joint (relative) coordinates, but every
    joint is a local, closed-form constraint and closed loops need nothing special;
    redundant joints (a parallelogram's extra bar, Bricard's linkage) show as a
    rank-deficient `Φ_q` (see `mobility`).

    **The system.** `Mechanism` is a [`jaxdae.LagrangianSystem`][]: `Φ` stacks the joints'
    equations in the order of `joints`, then the couplings' in the order of `couplings`,
    then each spatial body's Euler-parameter norm `(pᵀp − 1)/2`; `V` sums gravity and the
    springs, the generalized forces sum the dampers' and actuators' loads. Every formulation,
    [`jaxdae.simulate`][], [`jaxdae.consistent_initial_state`][], [`jaxdae.linearize`][]
    and the gradients work on it; every number (masses, inertias, marker positions, joint
    axes and lengths, spring constants) is an array leaf that `eqx.filter_grad` reaches.
    A redundant mechanism (see [`jaxdae.multibody.Mechanism.mobility`][]) runs with
    [`jaxdae.PseudoInverse`][].

    **Evaluation.** The joints of one class with the same settings, the bodies, and the
    spring-dampers, forces and torques of one class are each evaluated as one group: their
    parameters stacked while tracing and their formula run once under `jax.vmap`, the
    joints' rows then put back in the order of `joints`. The traced program grows with the
    number of kinds of element rather than of elements (a chain of 64 revolute joints traces
    as many equations as one of 16), and the core finds the same sparse structure in it as
    in a model written by hand. Elements with Python functions as parameters (a `Driver`'s
    `motion`, a function actuator) and [`jaxdae.multibody.JointSpringDamper`][]s are
    evaluated one by one.

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

    - `bodies`: the [`jaxdae.multibody.PlanarBody`][]s (a planar mechanism) or the
        [`jaxdae.multibody.RigidBody`][]s (a spatial one), optionally with a
        [`jaxdae.multibody.Ground`][] that carries markers on the fixed frame.
    - `joints`: [`jaxdae.multibody.AbstractJoint`][]s (revolute, prismatic, ...).
    - `forces`: force elements ([`jaxdae.multibody.Gravity`][], spring-dampers, applied
        forces and torques).
    - `stops`: one-sided constraints ([`jaxdae.multibody.JointLimit`][],
        [`jaxdae.multibody.PlaneContact`][], [`jaxdae.multibody.DistanceStop`][]): the
        mechanism's `gaps`, which [`jaxdae.simulate`][] keeps open by impacts and resting
        contact.
    - `couplings`: [`jaxdae.multibody.JointCoupling`][]s, equations between two joints'
        coordinates (planar joints' or prismatic joints'; see there).
    - `controller`: the [`jaxdae.AbstractController`][] whose output the actuators with an
        input channel read. Default: a constant zero input of the size they need.

    **Raises:**

    `ValueError` before any solve for: an element that is not a body, joint or force element;
    duplicate body, joint or force names; a joint or force on a body that is not in the
    mechanism or on a marker its body does not have; a joint between a body and itself; a stop
    or coupling on a joint without a coordinate; a [`jaxdae.multibody.JointLimit`][] beyond `±π`
    or a coupling on a spatial revolute joint, whose angle is measured in `(−π, π]`; planar and
    spatial bodies mixed, or a joint or force element of the other dimension; a body with
    negative mass or inertia (from the body classes), or with zero mass or inertia in a
    direction its joints let it move (a massless body must be held by joints; see
    `kinetic_energy`).
    """

    joint_sizes: tuple[int, ...] = eqx.field(static=True)
    offsets: tuple[int, ...] = eqx.field(static=True)
    dimension: int = eqx.field(static=True)
    holding: tuple[int, ...] = eqx.field(static=True)

    def __init__(
        self,
        bodies: Sequence[PlanarBody | RigidBody | Ground],
        joints: Sequence[AbstractJoint] = (),
        forces: Sequence[AbstractForce] = (),
        *,
        stops: Sequence[AbstractStop] = (),
        couplings: Sequence[JointCoupling] = (),
        controller: AbstractController | None = None,
    ):
        items = kind_check(
            "bodies",
            bodies,
            (PlanarBody, RigidBody, Ground),
            "jaxdae.multibody.PlanarBody or RigidBody (and one Ground) instances",
        )
        self._set_bodies(items, "PlanarBody or RigidBody")
        dimensions = {b.dimension for b in self.bodies}
        if len(dimensions) > 1:
            raise ValueError(
                "`bodies` mixes PlanarBody and RigidBody: a mechanism is planar or spatial. "
                "Model a planar part in space with RigidBody and planar joints' spatial "
                "counterparts."
            )
        self.dimension = dimensions.pop()
        for key, point in self.ground.markers.items():
            if point.shape != (self.dimension,):
                raise ValueError(
                    f"Ground marker {key!r} has {point.shape[0]} coordinates; this mechanism "
                    f"is {self.dimension}-D."
                )
        if self.dimension == 2 and self.ground.orientations:
            raise ValueError("Ground `orientations` are for spatial mechanisms.")
        self.offsets = tuple(
            int(o) for o in np.cumsum([0] + [b.num_coordinates for b in self.bodies[:-1]])
        )
        self._set_elements(joints, forces, stops, controller, couplings)
        self.joint_sizes = tuple(j.equations(self.dimension) for j in self.joints)
        self.holding = ()
        self._check_wrapped()
        self._check_massless()

    def _check_massless(self):
        """A body with zero mass or inertia must be held by its joints in those directions:
        `Φ_q` restricted to the coordinates without mass has full column rank at the
        bodies' given poses. The joints on such bodies are recorded in `holding` (see
        `kinetic_energy`)."""
        bodies = [
            (slot, b)
            for slot, b in enumerate(self.bodies)
            if isinstance(b, PlanarBody) and b.massless
        ]
        if not bodies:
            return
        names = {b.name for _, b in bodies}
        self.holding = tuple(
            i for i, j in enumerate(self.joints) if {split(j.a)[0], split(j.b)[0]} & names
        )
        columns = [
            self.offsets[slot] + k
            for slot, b in bodies
            for k, value in enumerate(np.asarray(b.mass_diagonal()))
            if value == 0.0
        ]
        q = self.reference_coordinates()
        jacobian = np.asarray(jax.jacfwd(lambda q_: self.constraints(0.0, q_))(q))[:, columns]
        rank = np.linalg.matrix_rank(jacobian) if jacobian.size else 0
        if rank < len(columns):
            listed = ", ".join(repr(b.name) for _, b in bodies)
            raise ValueError(
                f"Body {listed} has no mass or no moment of inertia in a direction its joints "
                f"let it move (the joints hold {rank} of its {len(columns)} massless "
                "coordinates at the bodies' given poses). Give it mass and inertia, or hold "
                "it by joints (a massless beam pinned at one end and linked at the other)."
            )

    def _holding_rates(self, t, q, v):
        """`Φ̇` of the joints on massless bodies and the weight `k` of `½ k |Φ̇|²`: the
        bodies' mean mass."""
        t = jnp.asarray(t, q.dtype)

        def residuals(t_, q_):
            return self._joint_residuals(Kinematics(self, t_, q_), t_, self.holding)

        rates = jax.jvp(residuals, (t, q), (jnp.ones_like(t), v))[1]
        weight = jnp.mean(self.masses).astype(q.dtype)
        return rates, weight

    # -- structure ---------------------------------------------------------------------

    @property
    def coordinate_names(self) -> tuple[str, ...]:
        """`("crank.x", "crank.y", "crank.theta", ...)` (planar) or `("link.x", ...,
        "link.e0", ..., "link.e3", ...)` (spatial): the order of `q`."""
        return tuple(f"{b.name}.{c}" for b in self.bodies for c in b.coordinate_labels)

    @property
    def num_equations(self) -> int:
        """`m`, the number of constraint equations: the joints', one per coupling, then (in
        space) one norm constraint per body."""
        return (
            sum(self.joint_sizes)
            + len(self.couplings)
            + sum(b.num_own_constraints for b in self.bodies)
        )

    def slot(self, name: str) -> int:
        """The index of body `name` in `bodies` (its coordinates are
        `q[offsets[i] : offsets[i] + bodies[i].num_coordinates]`); −1 for the ground."""
        return -1 if name == GROUND else self.body_names.index(name)

    def joint_rows(self, name: str) -> slice:
        """The rows of joint `name` in `Φ` (and in the holonomic multipliers)."""
        index = self._joint_index(name)
        start = sum(self.joint_sizes[:index])
        return slice(start, start + self.joint_sizes[index])

    @property
    def inertias(self) -> Float[Array, "bodies ..."]:
        """The moments of inertia (planar, `(bodies,)`) or inertia tensors (spatial,
        `(bodies, 3, 3)`)."""
        return jnp.stack([b.inertia for b in self.bodies])

    # -- the LagrangianSystem ----------------------------------------------------------

    def _mass_diagonal(self, dtype):
        """`(m₁, m₁, I₁, m₂, …)`: the diagonal of a planar mechanism's mass matrix."""
        masses = self.masses.astype(dtype)
        return jnp.stack([masses, masses, self.inertias.astype(dtype)], axis=1).reshape(-1)

    def _mass_blocks(self, q):
        """The spatial bodies' `7 × 7` mass matrices, `(bodies, 7, 7)`, evaluated together."""
        rows = q.reshape(len(self.bodies), 7)
        return jax.vmap(rigid_mass_matrix)(self.masses, self.inertias, rows)

    def mass_matrix(self, t, q):
        if self.dimension == 2:
            mass = jnp.diag(self._mass_diagonal(q.dtype))
        else:
            blocks = self._mass_blocks(q)
            count = blocks.shape[0]
            eye = jnp.eye(count, dtype=q.dtype)
            mass = (eye[:, None, :, None] * blocks[:, :, None, :]).reshape(q.shape[0], q.shape[0])
        if self.holding:
            jacobian = jax.jacfwd(lambda v_: self._holding_rates(t, q, v_)[0])(jnp.zeros_like(q))
            mass = mass + self._holding_rates(t, q, jnp.zeros_like(q))[1] * (jacobian.T @ jacobian)
        return mass

    def kinetic_energy(self, t, q, v):
        """`T = Σ ½ vᵢᵀ Mᵢ vᵢ` over the bodies. With massless bodies (zero mass or
        inertia, held by joints), plus `½ k |Φ̇_h|²` over the equations `Φ_h` of the joints
        on them (`k` the bodies' mean mass): zero wherever those joints' velocity
        constraints hold, so the motion does not change, and it makes `M` positive definite
        in the directions without mass (as the Euler parameters' `½ k (pᵀṗ)²` of
        [`jaxdae.multibody.RigidBody`][]), so that every formulation runs."""
        if self.dimension == 2:
            energy = 0.5 * jnp.sum(self._mass_diagonal(q.dtype) * v**2)
        else:
            shape = (len(self.bodies), 7)
            energy = jnp.sum(
                jax.vmap(rigid_kinetic_energy)(
                    self.masses, self.inertias, q.reshape(shape), v.reshape(shape)
                )
            )
        if self.holding:
            rates, weight = self._holding_rates(t, q, v)
            energy = energy + 0.5 * weight * (rates @ rates)
        return energy

    def _force_groups(self):
        """The force elements by group (see `_groups.py`): elements of a class that reads
        only its own markers (`grouped`) evaluate together; others alone."""
        keys = [group_key(f, f.markers) if type(f).grouped else None for f in self.forces]
        return [[self.forces[i] for i in members] for members in groups(keys)]

    def potential_energy(self, t, q):
        kin = Kinematics(self, t, q)
        energy = jnp.zeros((), q.dtype)
        for elements in self._force_groups():
            if len(elements) == 1:
                energy = energy + elements[0].potential_energy(kin)
                continue
            roles = elements[0].markers
            frames = [kin.frames([f.markers[k] for f in elements]) for k in range(len(roles))]

            def one(element, *frames_, roles=roles):
                return element.potential_energy(ElementKinematics(kin, roles, frames_))

            energy = energy + jnp.sum(vmapped(elements, one, *frames))
        return energy

    def _add_loads(self, forces, kin, loads, refs, frames):
        """`forces` plus the generalized forces of a group's loads: `loads[i]` stacked over
        the group (`force` `(K, d)`), at the markers `refs[i]` whose stacked frames are
        `frames[i]`."""
        for load, refs_, frame in zip(loads, refs, frames, strict=True):
            slots = np.asarray([kin._bodies[split(ref)[0]][0] for ref in refs_])
            keep = np.flatnonzero(slots >= 0)  # the ground takes the rest
            if keep.size == 0:
                continue
            rows = take(kin._poses_all()[0], slots[keep] + 1)
            arm = (frame.point - frame.origin)[keep]
            generalized = jax.vmap(self.bodies[0].generalized_load)(
                rows, arm, load.force[keep], load.torque[keep]
            )
            c = self.bodies[0].num_coordinates
            index = np.asarray(self.offsets)[slots[keep]][:, None] + np.arange(c)
            forces = add_at(forces, index, generalized)
        return forces

    def generalized_forces(self, t, q, v):
        kin = Kinematics(self, t, q, v, self._inputs(t, q, v))
        forces = jnp.zeros_like(q)
        for elements in self._force_groups():
            if len(elements) == 1:
                element = elements[0]
                for load in element.loads(kin):
                    slot = self.slot(split(load.at)[0])
                    if slot < 0:
                        continue  # the ground takes it
                    frame, body = kin.frame(load.at), self.bodies[slot]
                    start = self.offsets[slot]
                    generalized = body.generalized_load(
                        kin.body_coordinates(slot),
                        frame.point - frame.origin,
                        load.force,
                        load.torque,
                    )
                    # a pad, not `.at[...].add` (a scatter: see `_gather.add_at`)
                    forces = forces + jnp.pad(
                        generalized.astype(q.dtype),
                        (start, q.shape[0] - start - body.num_coordinates),
                    )
                direct = element.generalized_forces(kin)
                if direct is not None:
                    forces = forces + direct.astype(q.dtype)
                continue
            roles = elements[0].markers
            refs = [[f.markers[k] for f in elements] for k in range(len(roles))]
            frames = [kin.frames(r) for r in refs]
            velocities = [kin.velocities(r) for r in refs]

            def one(element, frames_, velocities_, roles=roles):
                return element.loads(ElementKinematics(kin, roles, frames_, velocities_))

            loads = vmapped(elements, one, frames, velocities)
            where = [roles.index(load.at) for load in loads]
            forces = self._add_loads(
                forces, kin, loads, [refs[k] for k in where], [frames[k] for k in where]
            )
        return forces

    def _joint_residuals(self, kin, t, indices):
        """The residuals of the joints `indices`, in that order, stacked: the joints of one
        group (see `_groups.py`) evaluated together, then put in order."""
        joints = [self.joints[i] for i in indices]
        sizes = [self.joint_sizes[i] for i in indices]
        starts = np.cumsum([0] + sizes[:-1])
        keys = [group_key(j, (j.a, j.b)) for j in joints]
        parts, positions = [], []
        for members in groups(keys):
            group = [joints[k] for k in members]
            if len(group) == 1:
                j = group[0]
                residual = j.residual(t, kin.frame(j.a), kin.frame(j.b))
            else:
                residual = vmapped(
                    group,
                    lambda j, a, b: j.residual(t, a, b),
                    kin.frames([j.a for j in group]),
                    kin.frames([j.b for j in group]),
                )
            residual = jnp.asarray(residual, kin.q.dtype).reshape(-1)
            expected = sum(sizes[k] for k in members)
            if residual.shape[0] != expected:
                raise ValueError(
                    f"A {type(group[0]).__name__} joint's `residual` gave "
                    f"{residual.shape[0] // len(group)} equations where its `equations` says "
                    f"{expected // len(group)}: make them agree."
                )
            parts.append(residual)
            positions += [starts[k] + r for k in members for r in range(sizes[k])]
        return reorder(parts, positions)

    def _kinematics(self, t, q, v=None, inputs=None) -> Kinematics:
        return Kinematics(self, t, q, v, inputs)

    def constraints(self, t, q):
        kin = Kinematics(self, t, q)
        parts = []
        if self.joints:
            parts.append(self._joint_residuals(kin, t, range(len(self.joints))))
        if self.couplings:
            parts.append(self._coupling_residuals(kin, q.dtype))
        if self.dimension == 3:
            p = q.reshape(len(self.bodies), 7)[:, 3:]
            parts.append(0.5 * (jnp.sum(p * p, axis=1) - 1))
        return (
            jnp.concatenate(parts)
            if len(parts) > 1
            else (parts[0] if parts else jnp.zeros((0,), q.dtype))
        )

    # -- outputs -----------------------------------------------------------------------

    def body_coordinates(self, q: Float[Array, "*batch n"], name: str) -> Float[Array, "*batch c"]:
        """`(x, y, θ)` (planar) or `(x, y, z, e₀, e₁, e₂, e₃)` (spatial) of body `name`; `q`
        may carry leading (time, batch) axes."""
        self._check_ref("request", name)
        slot = self.slot(name)
        if slot < 0:
            raise ValueError("The ground has no coordinates.")
        start = self.offsets[slot]
        return q[..., start : start + self.bodies[slot].num_coordinates]

    def reactions(
        self,
        q: Float[Array, "*batch n"],
        multipliers: Float[Array, "*batch c"],
        t: Float[ArrayLike, "*batch"] = 0.0,
    ) -> dict[str, Reaction]:
        """The joints' reaction loads from the multipliers of a solve, by joint name.

        The constraint forces are `−Φ_qᵀ λ` (`M q̈ = Q − Φ_qᵀ λ`); each joint's rows give
        the force and torque it exerts on its bodies, reported as a
        [`jaxdae.multibody.Reaction`][] on the body of marker `b` (about that marker). In
        space the rows' generalized force on the Euler parameters is turned into a moment
        by `n = E(p) Q_p / (2|p|²)` (its part along `p` is the norm constraint's).

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
            for name, joint in zip(self.joint_names, self.joints, strict=False):
                rows = self.joint_rows(name)

                def residual(q__, joint=joint):
                    k = Kinematics(self, t_, q__)
                    return joint.residual(t_, k.frame(joint.a), k.frame(joint.b))

                _, vjp = jax.vjp(residual, q_)
                (load,) = vjp(-lam[rows])
                point = kin.frame(joint.b).point

                def wrench(ref, load=load):
                    slot = self.slot(split(ref)[0])
                    body, start = self.bodies[slot], self.offsets[slot]
                    return body.wrench(
                        kin.body_coordinates(slot), load[start : start + body.num_coordinates]
                    )

                if self.slot(split(joint.b)[0]) >= 0:
                    force, moment = wrench(joint.b)
                    origin = kin.frame(joint.b).origin
                    torque = moment - _moment(point - origin, force)
                else:  # the ground: action and reaction on the body of marker a
                    force_a, moment_a = wrench(joint.a)
                    origin = kin.frame(joint.a).origin
                    force = -force_a
                    torque = -(moment_a - _moment(point - origin, force_a))
                out[name] = Reaction(force, torque)
            return out

        t = jnp.broadcast_to(jnp.asarray(t, q.dtype), q.shape[:-1])[..., None]
        return over_leading(lambda q_, lam, t_: one(q_, lam[..., :m], t_), q, multipliers, t)

    # -- analysis ----------------------------------------------------------------------

    def _unheld_coordinates(self) -> int:
        return 0

    def _wrapped_joints(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, joint in zip(self.joint_names, self.joints, strict=True)
            if joint.coordinate_wraps(self.dimension)
        )

    def reference_coordinates(self) -> Float[Array, " n"]:
        """`q` from the bodies' `position` and `angle` (planar) or `orientation` (spatial):
        a guess; need not satisfy `Φ`."""
        return jnp.concatenate([b.reference_coordinates() for b in self.bodies])

    def _driven(self, t0, q, v, held):
        return q, v, Driven(self, held, t0) if held.names else self
