"""MuJoCo's model (MJCF) of a jaxdae `TreeMechanism` read from a URDF file, for
cross-checks and MJX benchmarks: the same bodies, joints, joint spring-dampers, contacts
and gravity, and the maps between jaxdae's coordinates and MuJoCo's.

Each MuJoCo body's frame is the jaxdae body's (its centre of mass, the axes its inertia
tensor is written in), placed where the model's reference configuration puts it: a free
body gets a `freejoint`, a revolute tree joint a `hinge`, a weld (`Fixed`) nests its body
without a joint. A `JointSpringDamper` becomes an actuator whose affine bias is its law,
`−k (θ − θ₀) − d θ̇`, so no control input is needed. A `PlaneContact` on the ground
becomes a sphere geom at its marker that collides with the ground plane only (`condim=3`,
its friction coefficient), the ground plane being `z = 0`.

    import _mjcf
    xml = _mjcf.mjcf(model, timestep=1e-3)
    mj = mujoco.MjModel.from_xml_string(xml)
    qpos, qvel = _mjcf.to_mujoco(model, mj, q, v)
    print(_mjcf.check(model, mj, q))
"""

import jax.numpy as jnp
import numpy as np

import jaxdae.multibody as mb


def _number(x) -> str:
    return repr(float(x))


def _numbers(xs) -> str:
    return " ".join(_number(x) for x in np.ravel(xs))


def _quaternion(rotation: np.ndarray) -> np.ndarray:
    """The unit quaternion `(w, x, y, z)` of a rotation matrix (Shepperd's method)."""
    r = np.asarray(rotation, dtype=float)
    trace = np.trace(r)
    if trace > 0:
        s = 2.0 * np.sqrt(1.0 + trace)
        q = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(r)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * np.sqrt(1.0 + r[i, i] - r[j, j] - r[k, k])
        q = np.zeros(4)
        q[0] = (r[k, j] - r[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (r[j, i] + r[i, j]) / s
        q[1 + k] = (r[k, i] + r[i, k]) / s
    q = np.asarray(q)
    return q / np.linalg.norm(q) * (1.0 if q[0] >= 0 else -1.0)


def _body_of(marker: str) -> str:
    return marker.split(".")[0]


def _tree(model: mb.TreeMechanism):
    """Each body's parent (`"ground"` for a free body or one on a joint from the ground)
    and the joint that carries it (`None` for a free body)."""
    closures = set(model.closure_joints)
    if closures or model.couplings:
        raise ValueError(
            "Only trees without loop-closing joints or couplings have an MJCF here; "
            f"closures {sorted(closures)}, couplings {len(model.couplings)}."
        )
    carrier = {}
    for joint in model.joints:
        if not isinstance(joint, mb.Revolute | mb.Fixed):
            raise ValueError(
                f"Joint {joint.name!r} is a {type(joint).__name__}: only revolute joints and "
                "welds are written to MJCF here."
            )
        carrier[_body_of(joint.b)] = joint
    parents = {
        body.name: (_body_of(carrier[body.name].a) if body.name in carrier else "ground")
        for body in model.bodies
    }
    return parents, carrier


def _laws(model: mb.TreeMechanism) -> tuple[dict, np.ndarray]:
    """The joint spring-dampers by joint, `(k, d, θ₀)`, and the gravity vector."""
    laws, gravity = {}, np.zeros(3)
    for force in model.forces:
        if isinstance(force, mb.JointSpringDamper):
            if force.actuator is not None:
                raise ValueError(f"{force.label} has an actuator input; not written to MJCF.")
            laws[force.joint] = (float(force.stiffness), float(force.damping), float(force.rest))
        elif isinstance(force, mb.Gravity):
            g = force.acceleration
            gravity += np.array([0.0, 0.0, -9.81]) if g is None else np.asarray(g)
        else:
            raise ValueError(f"Force element {force.label} is not written to MJCF here.")
    return laws, gravity


def _contacts(model: mb.TreeMechanism) -> dict[str, list]:
    """The ground contacts by body: `(marker position on the body, radius, μ, name)`."""
    spheres: dict[str, list] = {}
    for stop in model.stops:
        if not isinstance(stop, mb.PlaneContact):
            raise ValueError(f"Stop {stop!r} is not written to MJCF here (only PlaneContact).")
        normal = np.array([0.0, 0.0, 1.0]) if stop.normal is None else np.asarray(stop.normal)
        if stop.surface != "ground" or not np.allclose(normal / np.linalg.norm(normal), [0, 0, 1]):
            raise ValueError(
                f"PlaneContact of {stop.point!r}: only the ground plane z = 0 with normal +z "
                "is written to MJCF here."
            )
        body, marker = stop.point.split(".")
        position = np.asarray(model.body(body).markers[marker])
        name = stop.name or marker
        spheres.setdefault(body, []).append(
            (position, float(stop.radius), float(stop.friction), name)
        )
    return spheres


def mjcf(
    model: mb.TreeMechanism,
    *,
    timestep: float = 1e-3,
    integrator: str = "Euler",
    cone: str = "elliptic",
    contact: str = "",
    name: str = "jaxdae",
) -> str:
    """The MJCF text of `model` (a `TreeMechanism` of revolute joints and welds, joint
    spring-dampers, gravity and ground contacts).

    **Arguments:**

    - `model`: the mechanism.
    - `timestep`, `integrator`, `cone`: MuJoCo's `<option>`s.
    - `contact`: extra attributes of the contact geoms (e.g. `'solref="0.005 1"'`).
    - `name`: the model's name.

    **Returns:** the XML text; its hinge joints are named as the jaxdae joints.
    """
    parents, carrier = _tree(model)
    laws, gravity = _laws(model)
    spheres = _contacts(model)
    q = model.reference_coordinates()
    pose = {
        body.name: (
            np.asarray(model.marker_position(q, body.name)),
            np.asarray(model.marker_rotation(q, body.name)),
        )
        for body in model.bodies
    }
    pose["ground"] = (np.zeros(3), np.eye(3))
    children: dict[str, list[str]] = {}
    for body in model.bodies:
        children.setdefault(parents[body.name], []).append(body.name)

    def write(body_name: str, depth: int) -> list[str]:
        pad = "  " * depth
        body = model.body(body_name)
        p_parent, a_parent = pose[parents[body_name]]
        p, a = pose[body_name]
        position = a_parent.T @ (p - p_parent)
        quaternion = _quaternion(a_parent.T @ a)
        lines = [
            f'{pad}<body name="{body_name}" pos="{_numbers(position)}" '
            f'quat="{_numbers(quaternion)}">'
        ]
        i = np.asarray(body.inertia)
        lines.append(
            f'{pad}  <inertial pos="0 0 0" mass="{_number(body.mass)}" fullinertia="'
            f'{_numbers([i[0, 0], i[1, 1], i[2, 2], i[0, 1], i[0, 2], i[1, 2]])}"/>'
        )
        joint = carrier.get(body_name)
        if joint is None:
            lines.append(f'{pad}  <freejoint name="{body_name}"/>')
        elif isinstance(joint, mb.Revolute):
            marker = joint.b.split(".")[1]
            at = np.asarray(body.markers[marker])
            axis = np.asarray(body.orientations[marker]) @ np.asarray(joint.axis)
            lines.append(
                f'{pad}  <joint name="{joint.name}" type="hinge" pos="{_numbers(at)}" '
                f'axis="{_numbers(axis / np.linalg.norm(axis))}" limited="false"/>'
            )
        for at, radius, friction, geom in spheres.get(body_name, []):
            lines.append(
                f'{pad}  <geom name="{geom}" type="sphere" size="{_number(radius)}" '
                f'pos="{_numbers(at)}" contype="1" conaffinity="0" condim="3" '
                f'friction="{_number(friction)} 0 0" {contact}/>'
            )
        for child in children.get(body_name, []):
            lines += write(child, depth + 1)
        lines.append(f"{pad}</body>")
        return lines

    frictions = [f for group in spheres.values() for _, _, f, _ in group]
    floor = max(frictions, default=1.0)  # MuJoCo takes the larger of two geoms' friction
    lines = [
        f'<mujoco model="{name}">',
        '  <compiler angle="radian" inertiafromgeom="false" autolimits="true"/>',
        f'  <option timestep="{_number(timestep)}" gravity="{_numbers(gravity)}" '
        f'cone="{cone}" integrator="{integrator}"/>',
        "  <worldbody>",
        f'    <geom name="ground" type="plane" size="0 0 1" contype="0" conaffinity="1" '
        f'condim="3" friction="{_number(floor)} 0 0"/>',
    ]
    for body_name in children.get("ground", []):
        lines += write(body_name, 2)
    lines.append("  </worldbody>")
    if laws:
        lines.append("  <actuator>")
        for joint_name, (k, d, rest) in laws.items():
            lines.append(
                f'    <general name="{joint_name}" joint="{joint_name}" gainprm="0" '
                f'biastype="affine" biasprm="{_numbers([k * rest, -k, -d])}"/>'
            )
        lines.append("  </actuator>")
    lines.append("</mujoco>")
    return "\n".join(lines) + "\n"


def _free_bodies(model: mb.TreeMechanism) -> list[str]:
    return [n for n in model.coordinate_names if n.endswith(".e0")]


def to_mujoco(model: mb.TreeMechanism, mj, q, v=None):
    """MuJoCo's `(qpos, qvel)` of jaxdae's `(q, v)` (`v` may be `None`: zero rates). A
    free joint's `qvel` is the body's linear velocity (its origin is the centre of mass)
    and its angular velocity in its own frame, `ω = 2 (ē ė)` of the unit parameters."""
    import mujoco

    names = list(model.coordinate_names)
    q = np.asarray(q, dtype=float)
    v = np.zeros_like(q) if v is None else np.asarray(v, dtype=float)
    qpos, qvel = np.zeros(mj.nq), np.zeros(mj.nv)
    for body in _free_bodies(model):
        body = body[:-3]
        i = names.index(f"{body}.x")
        joint = mj.joint(mujoco.mj_name2id(mj, mujoco.mjtObj.mjOBJ_JOINT, body))
        e, de = q[i + 3 : i + 7], v[i + 3 : i + 7]
        norm = np.linalg.norm(e)
        qpos[joint.qposadr[0] : joint.qposadr[0] + 7] = np.concatenate([q[i : i + 3], e / norm])
        # ω_body = 2 Im(ē ⊗ ė) for unit e; the norm's rate drops out
        u = e / norm
        du = de / norm - u * (u @ de) / norm
        w0, w = u[0], u[1:]
        omega = 2.0 * (w0 * du[1:] - du[0] * w - np.cross(w, du[1:]))
        qvel[joint.dofadr[0] : joint.dofadr[0] + 6] = np.concatenate([v[i : i + 3], omega])
    for joint in model.joints:
        if isinstance(joint, mb.Revolute):
            k = names.index(joint.name)
            mjoint = mj.joint(joint.name)
            qpos[mjoint.qposadr[0]], qvel[mjoint.dofadr[0]] = q[k], v[k]
    return qpos, qvel


def _velocity_map(model: mb.TreeMechanism, mj, q) -> np.ndarray:
    """`T` with `v = T qvel` (jaxdae's rates of MuJoCo's) at `q`, for unit Euler parameters."""
    names = list(model.coordinate_names)
    t = np.zeros((len(names), mj.nv))
    for body in _free_bodies(model):
        body = body[:-3]
        i = names.index(f"{body}.x")
        adr = mj.joint(body).dofadr[0]
        e = np.asarray(q[i + 3 : i + 7]) / np.linalg.norm(q[i + 3 : i + 7])
        w0, (w1, w2, w3) = e[0], e[1:]
        # ė = ½ e ⊗ (0, ω_body)
        half = 0.5 * np.array([[-w1, -w2, -w3], [w0, -w3, w2], [w3, w0, -w1], [-w2, w1, w0]])
        t[i : i + 3, adr : adr + 3] = np.eye(3)
        t[i + 3 : i + 7, adr + 3 : adr + 6] = half
    for joint in model.joints:
        if isinstance(joint, mb.Revolute):
            t[names.index(joint.name), mj.joint(joint.name).dofadr[0]] = 1.0
    return t


def check(model: mb.TreeMechanism, mj, q) -> dict[str, float]:
    """The differences between `model` and MuJoCo's `mj` at `q` (unit Euler parameters):
    total mass, whole centre of mass, the joint-joint block of the mass matrix, the whole
    mass matrix in MuJoCo's velocities (`Tᵀ M T`), and the contact spheres' centres."""
    import mujoco

    data = mujoco.MjData(mj)
    qpos, _ = to_mujoco(model, mj, q)
    data.qpos[:] = qpos
    mujoco.mj_forward(mj, data)
    full = np.zeros((mj.nv, mj.nv))
    if hasattr(data, "qM"):  # MuJoCo 3: the sparse inertia in `qM`
        mujoco.mj_fullM(mj, full, data.qM)
    else:
        mujoco.mj_fullM(mj, data, full)
    mass = np.asarray(model.mass_matrix(0.0, jnp.asarray(q)))
    t = _velocity_map(model, mj, q)
    masses = np.asarray(model.masses)
    centres = np.stack([np.asarray(model.marker_position(q, b.name)) for b in model.bodies])
    com = masses @ centres / masses.sum()
    names = list(model.coordinate_names)
    joints = [j.name for j in model.joints if isinstance(j, mb.Revolute)]
    ours = [names.index(n) for n in joints]
    theirs = [mj.joint(n).dofadr[0] for n in joints]
    spheres = 0.0
    for stop in model.stops:
        geom = stop.name or stop.point.split(".")[1]
        centre = np.asarray(model.marker_position(q, stop.point))
        spheres = max(spheres, float(np.abs(data.geom(geom).xpos - centre).max()))
    return {
        "total_mass_jaxdae": float(masses.sum()),
        "total_mass_mujoco": float(mj.body_subtreemass[0]),
        "com_difference": float(np.abs(com - data.subtree_com[0]).max()),
        "joint_mass_matrix_max_abs": float(np.abs(mass[np.ix_(ours, ours)]).max()),
        "joint_mass_matrix_difference": float(
            np.abs(mass[np.ix_(ours, ours)] - full[np.ix_(theirs, theirs)]).max()
        ),
        "mass_matrix_difference": float(np.abs(t.T @ mass @ t - full).max()),
        "contact_sphere_difference": spheres,
    }
