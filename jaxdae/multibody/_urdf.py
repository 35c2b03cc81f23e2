"""URDF import: serial and tree robots as the bodies and joints of a spatial mechanism."""

import functools
import math
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ._body import GROUND, Ground, RigidBody
from ._coupling import JointCoupling
from ._force import AbstractForce
from ._joint import AbstractJoint, Fixed, Prismatic, Revolute
from ._model import Mechanism
from ._stop import AbstractStop, JointLimit, PlaneContact
from ._tree import TreeMechanism
from ._urdf_geometry import (
    UrdfCollision,
    UrdfVisual,
    link_collisions,
    link_visuals,
    transform,
)


class UrdfLimit(NamedTuple):
    """A URDF joint's `<limit>` as the file gives it.
    [`UrdfRobot.mechanism`][jaxdae.multibody.UrdfRobot.mechanism] enforces its range by a
    [`jaxdae.multibody.JointLimit`][] (unless told otherwise).

    - `lower`, `upper`: the range of the joint coordinate (rad or m); `None` for a
        continuous joint, and for a side the file leaves open (`-inf`, `inf`).
    - `effort`: the largest torque (force); `velocity`: the largest rate. `None` where the
        file gives none.
    """

    lower: float | None
    upper: float | None
    effort: float | None
    velocity: float | None


class UrdfRobot(NamedTuple):
    """A robot read from a URDF file: the parts of a spatial
    [`jaxdae.multibody.Mechanism`][], ready to be completed in Python.

    - `name`: the robot's name.
    - `bodies`: a [`jaxdae.multibody.Ground`][] and one [`jaxdae.multibody.RigidBody`][] per
        link with mass (body frame: the link's inertial frame; marker `frame`: the link
        frame; marker `<joint>` on a parent: the joint frame; massless links on fixed joints
        become markers `<link>` of the body they are welded to).
    - `joints`: one joint per moving URDF joint (named as in the file) and a `Fixed` weld
        for a fixed joint between two bodies with mass.
    - `limits`: the joints' [`jaxdae.multibody.UrdfLimit`][]s by joint name.
    - `root`: the root link (the ground where the base is fixed).
    - `joint_names`: the moving joints in the file's order (the robot's joint vector).
    - `visuals`: the links' `<visual>` geometry as [`jaxdae.multibody.UrdfVisual`][]s, by
        the body that carries them (`"ground"` for the fixed root's); bodies without
        visuals are not keys. Draw them with `jaxdae.viz.view(robot, sol)` or
        `jaxdae.viz.view(model, sol, visuals=robot.visuals)`.
    - `couplings`: a [`jaxdae.multibody.JointCoupling`][] per joint with a `<mimic>`,
        named `<joint>.mimic`: `θ_joint = multiplier · θ_leader + offset`.
    - `sources`: where each joint is written, by name (`"arm.urdf, line 12"`), for error
        messages.
    - `collisions`: the links' `<collision>` geometry as
        [`jaxdae.multibody.UrdfCollision`][]s, by link name; `contacts` makes stops of them.
    """

    name: str
    bodies: tuple
    joints: tuple[AbstractJoint, ...]
    limits: dict[str, UrdfLimit]
    root: str
    joint_names: tuple[str, ...]
    visuals: dict[str, tuple[UrdfVisual, ...]]
    couplings: tuple[JointCoupling, ...] = ()
    sources: dict[str, str] = {}
    collisions: dict[str, tuple[UrdfCollision, ...]] = {}

    def contacts(
        self,
        links: Sequence[str],
        *,
        friction: float = 0.0,
        restitution: float = 0.0,
        surface: str = "ground",
        normal=None,
    ) -> tuple[PlaneContact, ...]:
        """Point contacts of the `<collision>` geometry of `links` against a plane: a
        [`jaxdae.multibody.PlaneContact`][] per sphere (at its centre, with its radius) and
        per corner of a box (radius 0), named `<marker>` and `<marker>_corner<k>`. Enough
        for feet, fingertips and box corners; pass them as `stops` to `mechanism`.

        **Arguments:**

        - `links`: the URDF links whose collision geometry touches the plane, e.g. a
            quadruped's four feet.
        - `friction`, `restitution`: the contacts' Coulomb and Newton coefficients.
        - `surface`, `normal`: the plane, as for `PlaneContact` (default: the ground,
            `+z` up).

        **Raises:**

        `ValueError`, naming the file and line, for a link that is not in the file or has no
        `<collision>`, for a collision cylinder or mesh, which do not map to point
        contacts (give the link a sphere or a box, or place `PlaneContact`s on markers), and
        for a sphere or box whose radius or sides are not positive.
        """
        if isinstance(links, str):
            raise ValueError(
                f"`links` must be a sequence of link names; got the string {links!r} "
                f"(write [{links!r}])."
            )
        known = {link for link in self.collisions}
        stops = []
        for link in links:
            found = self.collisions.get(link)
            if not found:
                where = self.sources.get(link, self.name)
                have = ", ".join(sorted(known)) or "none"
                raise ValueError(
                    f"{where}: link {link!r} has no <collision> geometry (links with "
                    f"collision geometry: {have})."
                )
            for shape in found:
                if shape.kind in ("sphere", "box") and not all(x > 0 for x in shape.size):
                    raise ValueError(
                        f"{shape.source}: the <collision> {shape.kind} of link {link!r} has "
                        f"size {shape.size}; its point contacts need "
                        f"{'a positive radius' if shape.kind == 'sphere' else 'positive sides'}"
                        " (fix the file, or place `mb.PlaneContact`s on markers of its body)."
                    )
                if shape.kind == "sphere":
                    points = [(shape.marker, shape.size[0])]
                elif shape.kind == "box":
                    points = [(corner, 0.0) for corner in shape.corners]
                else:
                    raise ValueError(
                        f"{shape.source}: the <collision> {shape.kind} of link {link!r} does "
                        "not map to point contacts; give the link a sphere or a box "
                        "collision, or place `mb.PlaneContact`s on markers of its body."
                    )
                stops += [
                    PlaneContact(
                        marker,
                        surface,
                        normal,
                        radius=radius,
                        restitution=restitution,
                        friction=friction,
                        name=marker.partition(".")[2],
                    )
                    for marker, radius in points
                ]
        return tuple(stops)

    def mechanism(
        self,
        joints: Sequence[AbstractJoint] = (),
        forces: Sequence[AbstractForce] = (),
        *,
        stops: Sequence[AbstractStop] = (),
        limits: bool = True,
        limit_restitution: float = 0.0,
        ground_markers: dict | None = None,
        controller=None,
        coordinates: str = "joint",
    ) -> TreeMechanism | Mechanism:
        """The robot as a mechanism, with extra joints (to close loops), force elements
        (gravity, joint motors) and stops, and its joints' limits.

        By default a [`jaxdae.multibody.TreeMechanism`][]: the joint coordinates of the
        file's moving joints in the order of `joint_names` (a free base's pose first), the
        dynamics by the recursive algorithms, the extra joints as loop-closing constraints
        and the `<mimic>`s (`couplings`) as constraints between joint coordinates. With
        `coordinates="absolute"`, the [`jaxdae.multibody.Mechanism`][] of the same bodies
        and joints in absolute coordinates (every joint a constraint). The two describe the
        same motion. Absolute coordinates measure a revolute joint's angle in `(−π, π]`,
        so they refuse what needs it to turn further: an enforced `<limit>` beyond `±π`
        and a `<mimic>` of revolute or continuous joints.

        **Arguments:**

        - `joints`: joints added to the robot's, e.g. a `Spherical` that closes a loop.
        - `forces`: force elements, e.g. `[mb.Gravity()]` and
            [`jaxdae.multibody.JointSpringDamper`][]s as motors.
        - `stops`: stops added to the limits, e.g. a [`jaxdae.multibody.PlaneContact`][].
        - `limits`: enforce the `<limit>` ranges of the revolute and prismatic joints, one
            [`jaxdae.multibody.JointLimit`][] each, named `<joint>.limit` (default). `False`
            leaves them as data in `limits`.
        - `limit_restitution`: the limits' coefficient of restitution. Default `0`: a joint
            stops dead at its limit.
        - `ground_markers`: more markers on the ground (global coordinates).
        - `controller`: as for [`jaxdae.multibody.Mechanism`][].
        - `coordinates`: `"joint"` (default) or `"absolute"`, see above.

        **Raises:**

        `ValueError` naming the file and line of a revolute joint whose `<limit>` lies beyond
        `±π` (with `limits=True`) or that a `<mimic>` couples, in absolute coordinates; and
        as the mechanism's class does.
        """
        if coordinates not in ("joint", "absolute"):
            raise ValueError(f"`coordinates` must be 'joint' or 'absolute'; got {coordinates!r}.")
        if coordinates == "absolute":
            self._check_absolute(limits)
        bodies = list(self.bodies)
        if ground_markers:
            ground = bodies[0]
            bodies[0] = Ground(
                {**ground.markers, **ground_markers}, orientations=dict(ground.orientations)
            )
        enforced = [
            JointLimit(
                name, limit.lower, limit.upper, restitution=limit_restitution, name=f"{name}.limit"
            )
            for name, limit in self.limits.items()
            if limits and (limit.lower is not None or limit.upper is not None)
        ]
        if (
            coordinates == "joint"
            and not self.joint_names
            and all(body.name != self.root for body in bodies)
        ):
            raise ValueError(
                f"The robot {self.name!r} has no moving joints: its fixed joints weld every "
                "link to the fixed base, so it has no joint coordinates. Load it with "
                "`fixed_base=False` for a free-floating robot, or give it a revolute, "
                "continuous or prismatic joint."
            )
        kind = TreeMechanism if coordinates == "joint" else Mechanism
        return kind(
            bodies,
            tuple(self.joints) + tuple(joints),
            forces,
            stops=tuple(enforced) + tuple(stops),
            couplings=self.couplings,
            controller=controller,
        )

    def _check_absolute(self, limits: bool):
        """Raise `ValueError`, naming the file and line, for what absolute coordinates
        cannot describe: a revolute joint's enforced limit beyond `±π`, or its `<mimic>`
        (its angle is measured in `(−π, π]` there)."""
        wrapped = {joint.name for joint in self.joints if joint.coordinate_wraps(3)}
        fix = (
            'build it in joint coordinates, `robot.mechanism(coordinates="joint")` (the '
            "default), where the angle is a coordinate that turns without wrapping"
        )
        for name, limit in self.limits.items():
            bounds = [b for b in (limit.lower, limit.upper) if b is not None]
            if limits and name in wrapped and any(abs(b) > math.pi for b in bounds):
                raise ValueError(
                    f"{self.sources.get(name, self.name)}: joint {name!r} has the <limit> "
                    f"[{_bound(limit.lower)}, {_bound(limit.upper)}] rad, beyond ±π; absolute "
                    'coordinates (`coordinates="absolute"`) measure a revolute joint\'s angle '
                    "in (−π, π], so the angle would wrap at ±π and never meet the limit. "
                    f"To enforce the limit, {fix}; or pass `limits=False` to keep the limits "
                    "as data."
                )
        for coupling in self.couplings:
            turning = [j for j in coupling.joints if j in wrapped]
            if turning:
                raise ValueError(
                    f"{self.sources.get(coupling.joint, self.name)}: joint {coupling.joint!r} "
                    f"has a <mimic> of joint {coupling.leader!r}; absolute coordinates "
                    '(`coordinates="absolute"`) measure the angle of revolute joint '
                    f"{turning[0]!r} in (−π, π], so the coupling would break where the angle "
                    f"wraps at ±π. To keep the <mimic>, {fix}."
                )


def _bound(value):
    return "none" if value is None else f"{value:g}"


def _where(path, lines, kind, name):
    line = lines.get((kind, name))
    return f"{path}, line {line}" if line is not None else str(path)


def _source_lines(path):
    """Parse with lxml (yourdfpy's XML parser) for the line of each link and joint; a file
    that is not well-formed XML is refused with its line."""
    from lxml import etree

    try:
        tree = etree.parse(os.fspath(path))
    except OSError as error:
        raise ValueError(f"Cannot read the URDF file {path}: {error}.") from error
    except etree.XMLSyntaxError as error:
        line = error.lineno if error.lineno is not None else "?"
        raise ValueError(
            f"{path}, line {line}: not a well-formed URDF (XML) file: {error.msg}."
        ) from error
    root = tree.getroot()
    if root.tag != "robot":
        raise ValueError(
            f"{path}, line {root.sourceline}: the root element is <{root.tag}>; a "
            "URDF file has one <robot> element."
        )
    lines = {}
    for element in root:
        if element.tag in ("link", "joint"):
            name = element.get("name")
            if name is None:
                raise ValueError(
                    f"{path}, line {element.sourceline}: a <{element.tag}> without "
                    "a `name` attribute."
                )
            if (element.tag, name) in lines:
                raise ValueError(
                    f"{path}, lines {lines[(element.tag, name)]} and {element.sourceline}: two "
                    f"<{element.tag}>s named {name!r}; every {element.tag} needs its own name: "
                    "rename or remove one."
                )
            lines[(element.tag, name)] = element.sourceline
            _check_numbers(path, element)
    if not any(tag == "link" for tag, _ in lines):
        raise ValueError(
            f"{path}: the robot {root.get('name')!r} has no <link>; a URDF robot "
            "needs at least one link (its root)."
        )
    return lines


#: The URDF attributes that hold numbers, by element.
_NUMERIC = {
    "mass": ("value",),
    "inertia": ("ixx", "ixy", "ixz", "iyy", "iyz", "izz"),
    "origin": ("xyz", "rpy"),
    "axis": ("xyz",),
    "limit": ("lower", "upper", "effort", "velocity"),
    "mimic": ("multiplier", "offset"),
    "dynamics": ("damping", "friction"),
    "box": ("size",),
    "cylinder": ("radius", "length"),
    "sphere": ("radius",),
    "mesh": ("scale",),
    "color": ("rgba",),
}


def _check_numbers(path, element):
    """Raise `ValueError` with the line of an attribute of `element` (a link or joint) that
    should hold numbers and does not (yourdfpy's own error names no place)."""
    for child in element.iter(*_NUMERIC):
        for attribute in _NUMERIC[str(child.tag)]:
            text = child.get(attribute)
            if text is None:
                continue
            try:
                [float(x) for x in text.split()]
            except ValueError:
                raise ValueError(
                    f'{path}, line {child.sourceline}: <{child.tag} {attribute}="{text}"> in '
                    f"{element.tag} {element.get('name')!r} is not a number (or a list of "
                    "numbers); write it as decimal numbers, e.g. 1.5."
                ) from None


def load_urdf(path: str | os.PathLike, *, fixed_base: bool = True) -> UrdfRobot:
    """Read a serial or tree robot from a URDF file.

    The file is parsed by `yourdfpy` (install it with `pip install 'jaxdae[urdf]'`); links'
    `<inertial>` give the bodies (mass, inertia tensor about the centre of mass in the
    inertial frame), `revolute` and `continuous` joints become
    [`jaxdae.multibody.Revolute`][] joints about their `<axis>`, `prismatic` joints
    [`jaxdae.multibody.Prismatic`][] joints along it, `fixed` joints welds (a massless link
    on a fixed joint becomes a marker of the body it is welded to, as tool frames usually
    are); `<limit>`s are kept in `limits` (an infinite bound, `-inf` or `inf`, leaves that
    side open), and `robot.mechanism()` enforces their ranges; a `<mimic>` becomes a
    [`jaxdae.multibody.JointCoupling`][] of the two joints' coordinates,
    `θ_joint = multiplier · θ_leader + offset` (URDF's defaults: multiplier 1, offset 0),
    kept in `couplings`. Every body
    starts at its pose for zero joint coordinates. Links' `<visual>` geometry is kept in `visuals`
    for the 3-D viewer (mesh files are located but not read); `<collision>` geometry is kept
    in `collisions`, with a marker at each shape's centre (and a box's corners), from which
    `robot.contacts(links)` makes point contacts.

    Close kinematic loops by adding joints in Python:
    `robot.mechanism(joints=[mb.Spherical("link3.tip", "ground.anchor")], forces=[mb.Gravity()])`.

    **Arguments:**

    - `path`: the URDF file.
    - `fixed_base`: the root link is the ground (default); otherwise it is a free body
        (it needs an `<inertial>`).

    **Returns:**

    A [`jaxdae.multibody.UrdfRobot`][].

    **Raises:**

    `ValueError` naming the file and line for: a file that is not well-formed XML or has no
    `<robot>` element or no `<link>`; two links (or joints) of the same name; an attribute
    that should be a number and is not; a joint whose parent or child link is not in the
    file; a link with two parents or a loop of URDF joints; a `floating` or `planar` joint; a link
    without mass (or with a non-positive-definite inertia) that a moving joint would move; a
    revolute or prismatic joint whose `<axis>` is zero (or not finite); a link or joint
    name that jaxdae cannot use (containing `.`, or `ground`); a `<limit>` bound that is nan;
    a `<mimic>` on a fixed joint, or of a joint that is not a moving joint of the file (or of
    itself). `ImportError` when `yourdfpy` is not installed.
    """
    try:
        import yourdfpy
    except ImportError as error:
        raise ImportError(
            "URDF import needs yourdfpy: pip install 'jaxdae[urdf]' (or pip install yourdfpy)."
        ) from error
    lines = _source_lines(path)
    try:
        urdf = yourdfpy.URDF.load(
            os.fspath(path),
            build_scene_graph=False,
            load_meshes=False,
            build_collision_scene_graph=False,
            load_collision_meshes=False,
        )
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: yourdfpy cannot read it: {error}") from error
    robot = urdf.robot
    where = functools.partial(_where, path, lines)
    links = {link.name: link for link in robot.links}
    parent_joint, root = _tree(path, where, robot, links)
    world, order = _world_poses(robot, root)
    carrier = _carriers(where, links, parent_joint, order, root, fixed_base)
    # Body frames: the inertial frame of each massive link (world pose), the ground's the
    # global frame.
    frames = {GROUND: (np.eye(3), np.zeros(3))}
    for name in order:
        if carrier[name] == name:
            r, p = transform(links[name].inertial.origin)
            rot, pos = world[name]
            frames[name] = (rot @ r, pos + rot @ p)
    markers = _Markers(frames)
    for name in order:
        markers.add(carrier[name], "frame" if carrier[name] == name else name, *world[name])
    collisions = link_collisions(where, links, order, world, carrier, markers)
    joints = _joints(where, robot, links, world, carrier, markers)
    bodies = [Ground(markers.points[GROUND], orientations=markers.orientations[GROUND])]
    for name in order:
        if carrier[name] != name:
            continue
        inertial = links[name].inertial
        rot, pos = frames[name]
        try:
            bodies.append(
                RigidBody(
                    name,
                    inertial.mass,
                    np.asarray(inertial.inertia, float),
                    markers.points[name],
                    orientations=markers.orientations[name],
                    position=pos,
                    orientation=rot,
                )
            )
        except ValueError as error:
            raise ValueError(f"{where('link', name)}: {error}") from error
    moving = tuple(j.name for j in robot.joints if j.type != "fixed")
    visuals = link_visuals(path, robot, order, carrier)
    sources = {j.name: where("joint", j.name) for j in robot.joints}
    return UrdfRobot(
        robot.name,
        tuple(bodies),
        tuple(joints),
        _limits(where, robot),
        root,
        moving,
        visuals,
        _mimics(where, robot, moving),
        {**sources, **{name: where("link", name) for name in links}},
        collisions,
    )


def _massive(link) -> bool:
    inertial = link.inertial
    return inertial is not None and inertial.mass is not None and inertial.mass > 0


def _tree(path, where, robot, links):
    """`(parent joint of each link, root link)`, after checking the names, the joints'
    links and types, and that the joints form one tree."""
    for kind, items in (("link", robot.links), ("joint", robot.joints)):
        for item in items:
            if "." in item.name or item.name == GROUND:
                raise ValueError(
                    f"{where(kind, item.name)}: {kind} name {item.name!r} cannot "
                    f"name a jaxdae body or joint (no '.', not {GROUND!r}); rename it."
                )
    parent_joint = {}
    for joint in robot.joints:
        at = where("joint", joint.name)
        for role in ("parent", "child"):
            if getattr(joint, role) not in links:
                raise ValueError(
                    f"{at}: joint {joint.name!r} names {role} link "
                    f"{getattr(joint, role)!r}, which is not in the file."
                )
        if joint.child in parent_joint:
            raise ValueError(
                f"{at}: link {joint.child!r} is the child of two joints "
                f"({parent_joint[joint.child].name!r} and {joint.name!r}); URDF "
                "describes trees: close loops with joints added in Python."
            )
        if joint.type not in ("revolute", "continuous", "prismatic", "fixed"):
            raise ValueError(
                f"{at}: joint {joint.name!r} is of type {joint.type!r}; jaxdae "
                "imports revolute, continuous, prismatic and fixed joints."
            )
        parent_joint[joint.child] = joint
    roots = [name for name in links if name not in parent_joint]
    if len(roots) > 1:
        raise ValueError(
            f"{path}: the links form several trees (roots: {roots}); a URDF "
            "robot has one root link: join the others to it with joints."
        )
    reached = set(roots)
    for name in links:  # each link's chain of parents must end at the root
        chain = [name]
        while chain[-1] not in reached and chain[-1] in parent_joint:
            parent = parent_joint[chain[-1]].parent
            if parent in chain:
                _loop(path, where, parent_joint, chain[chain.index(parent) :])
            chain.append(parent)
        reached.update(chain)
    return parent_joint, roots[0]


def _loop(path, where, parent_joint, links):
    """Raise `ValueError` naming the loop of URDF joints through `links` (each link the
    parent of the one before it)."""
    joints = [parent_joint[name] for name in links]
    described = ", ".join(
        f"{j.name!r} ({j.parent!r} → {j.child!r}, "
        f"{where('joint', j.name).removeprefix(f'{path}, ')})"
        for j in reversed(joints)
    )
    raise ValueError(
        f"{path}: the joints {described} form a loop; URDF describes trees: "
        "remove one of them and close the loop with a joint added in Python, "
        "`robot.mechanism(joints=[...])`."
    )


def _world_poses(robot, root):
    """The world pose `(rotation, position)` of every link frame at zero joint coordinates,
    and the links in order from the root."""
    children: dict[str, list] = {}
    for joint in robot.joints:
        children.setdefault(joint.parent, []).append(joint)
    world = {root: (np.eye(3), np.zeros(3))}
    order = [root]
    for name in order:
        for joint in children.get(name, []):
            rot, pos = world[name]
            r, p = transform(joint.origin)
            world[joint.child] = (rot @ r, pos + rot @ p)
            order.append(joint.child)
    return world, order


def _carriers(where, links, parent_joint, order, root, fixed_base):
    """Which body carries each link: itself, the ground (the fixed root) or the body a
    massless link is welded to."""
    carrier = {}
    for name in order:
        if name == root:
            carrier[name] = GROUND if fixed_base else name
            if not fixed_base and not _massive(links[name]):
                raise ValueError(
                    f"{where('link', name)}: the root link {name!r} has no mass; "
                    "a free (fixed_base=False) base needs an <inertial>."
                )
            continue
        joint = parent_joint[name]
        if _massive(links[name]):
            carrier[name] = name
        elif joint.type == "fixed":
            carrier[name] = carrier[joint.parent]
        else:
            raise ValueError(
                f"{where('link', name)}: link {name!r} has no mass (no <inertial> with a "
                f"positive <mass>) but the {joint.type} joint {joint.name!r} moves it; give "
                "it an <inertial> or make the joint fixed."
            )
    return carrier


class _Markers:
    """The markers of each body, placed from world poses into the body frames."""

    def __init__(self, frames):
        self.frames = frames
        self.points: dict[str, dict] = {body: {} for body in frames}
        self.orientations: dict[str, dict] = {body: {} for body in frames}

    def add(self, body, key, rot, pos):
        """A marker at the world pose `(rot, pos)` on `body`, in its body frame."""
        body_rot, body_pos = self.frames[body]
        self.points[body][key] = body_rot.T @ (pos - body_pos)
        self.orientations[body][key] = body_rot.T @ rot


def _joints(where, robot, links, world, carrier, markers):
    """The mechanism's joints, each at a marker of its parent's carrier; a fixed joint to a
    massless link is a marker of its carrier instead."""
    joints = []
    for joint in robot.joints:
        if joint.type == "fixed" and not _massive(links[joint.child]):
            continue  # a marker of its carrier
        rot, pos = world[joint.child]  # the joint frame at zero coordinates
        markers.add(carrier[joint.parent], joint.name, rot, pos)
        a = f"{carrier[joint.parent]}.{joint.name}"
        b = f"{joint.child}.frame"
        axis = None if joint.axis is None else np.asarray(joint.axis, dtype=float)
        if (
            axis is not None
            and joint.type in ("revolute", "continuous", "prismatic")
            and not (np.all(np.isfinite(axis)) and np.linalg.norm(axis) > 0)
        ):
            raise ValueError(
                f"{where('joint', joint.name)}: joint '{joint.name}' has the <axis> "
                f'xyz="{" ".join(f"{x:g}" for x in axis)}": a {joint.type} joint needs a '
                'finite nonzero axis to turn about or slide along, e.g. <axis xyz="0 0 1"/>.'
            )
        if joint.type in ("revolute", "continuous"):
            joints.append(
                Revolute(a, b, axis=(0.0, 0.0, 1.0) if axis is None else axis, name=joint.name)
            )
        elif joint.type == "prismatic":
            joints.append(
                Prismatic(a, b, axis=(1.0, 0.0, 0.0) if axis is None else axis, name=joint.name)
            )
        else:
            joints.append(Fixed(a, b, name=joint.name))
    return joints


def _limits(where, robot) -> dict:
    """The `<limit>`s of the moving joints (a continuous joint has no position limits; an
    infinite bound leaves its side open)."""
    limits = {}
    for joint in robot.joints:
        if joint.type == "fixed":
            continue
        limit = joint.limit
        value = lambda x: None if x is None else float(x)  # noqa: E731
        bounds = []
        for side in ("lower", "upper"):
            bound = (
                None if joint.type == "continuous" or limit is None else value(getattr(limit, side))
            )
            if bound is not None and math.isnan(bound):
                raise ValueError(
                    f"{where('joint', joint.name)}: joint {joint.name!r} has <limit "
                    f'{side}="nan">; give the bound as a number, or -inf / inf (or leave '
                    "the attribute out) for no bound on that side."
                )
            bounds.append(None if bound is None or math.isinf(bound) else bound)
        limits[joint.name] = UrdfLimit(
            *bounds,
            None if limit is None else value(limit.effort),
            None if limit is None else value(limit.velocity),
        )
    return limits


def _mimics(where, robot, moving) -> tuple[JointCoupling, ...]:
    """A [`jaxdae.multibody.JointCoupling`][] per `<mimic>`, named `<joint>.mimic`."""
    couplings = []
    for joint in robot.joints:
        mimic = joint.mimic
        if mimic is None:
            continue
        at = where("joint", joint.name)
        if joint.type == "fixed":
            raise ValueError(
                f"{at}: the fixed joint {joint.name!r} has a <mimic>; only a "
                "moving joint can follow another: remove the <mimic>."
            )
        if mimic.joint not in moving or mimic.joint == joint.name:
            raise ValueError(
                f'{at}: joint {joint.name!r} has <mimic joint="{mimic.joint}">, which is '
                f"not another moving joint of the file (moving joints: {list(moving)}); name "
                "the revolute, continuous or prismatic joint it follows."
            )
        multiplier = 1.0 if mimic.multiplier is None else float(mimic.multiplier)
        offset = 0.0 if mimic.offset is None else float(mimic.offset)
        try:
            couplings.append(
                JointCoupling(
                    joint.name, mimic.joint, multiplier, offset=offset, name=f"{joint.name}.mimic"
                )
            )
        except ValueError as error:
            raise ValueError(f"{at}: the <mimic> of joint {joint.name!r}: {error}") from error
    return tuple(couplings)
