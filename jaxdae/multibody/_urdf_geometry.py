"""The geometry of a URDF robot's links: their `<visual>`s, which the 3-D viewer draws, and
their `<collision>`s, which give point contacts, each with its markers on the bodies."""

import os
from typing import NamedTuple

import numpy as np


class UrdfVisual(NamedTuple):
    """One `<visual>` of a URDF link: what [`jaxdae.viz.view`][] draws in place of the
    body's inertia box.

    - `link`: the URDF link it belongs to.
    - `marker`: the marker at the link frame, `"body.marker"` (`"upper_arm.frame"`; a link
        welded to another body, `"slider.tool"`; the fixed root, `"ground.base_link"`):
        `mechanism.marker_position(q, visual.marker)` and `marker_rotation` place it.
    - `kind`: `"box"`, `"cylinder"`, `"sphere"` or `"mesh"`.
    - `size`: a box's sides `(x, y, z)`; a cylinder's `(radius, length)` (along its z
        axis); a sphere's `(radius,)`; `()` for a mesh.
    - `mesh`: a mesh's file, resolved against the URDF file's directory (`package://` by
        the directories above it); `None` for the others. The file is not opened here.
    - `scale`: a mesh's scale along its axes (`(1, 1, 1)` for the others).
    - `xyz`, `rpy`: the `<origin>` of the geometry in the link frame (m; rad, URDF's
        roll-pitch-yaw).
    - `color`: the material's `(r, g, b, a)` in [0, 1], given in the `<visual>` or by name
        in a top-level `<material>`; `None` where the file gives none.
    """

    link: str
    marker: str
    kind: str
    size: tuple[float, ...]
    mesh: str | None
    scale: tuple[float, float, float]
    xyz: tuple[float, float, float]
    rpy: tuple[float, float, float]
    color: tuple[float, float, float, float] | None


class UrdfCollision(NamedTuple):
    """One `<collision>` of a URDF link: the geometry
    [`UrdfRobot.contacts`][jaxdae.multibody.UrdfRobot.contacts] turns into point contacts.

    - `link`: the URDF link it belongs to.
    - `marker`: the marker at the geometry's centre, oriented as the geometry,
        `"body.marker"` (`"FR_lower.FR_toe_collision"`; named `<link>_collision`, numbered
        `<link>_collision1`, ... where a link has several).
    - `kind`: `"box"`, `"cylinder"`, `"sphere"` or `"mesh"`.
    - `size`: a box's sides `(x, y, z)`; a cylinder's `(radius, length)`; a sphere's
        `(radius,)`; `()` for a mesh.
    - `corners`: a box's eight corner markers (`"<marker>_corner0"`, ...); `()` for the
        others.
    - `source`: where the link is written (`"a1.urdf, line 187"`), for error messages.
    """

    link: str
    marker: str
    kind: str
    size: tuple[float, ...]
    corners: tuple[str, ...]
    source: str


def transform(matrix):
    matrix = np.eye(4) if matrix is None else np.asarray(matrix, dtype=float)
    return matrix[:3, :3], matrix[:3, 3]


def link_collisions(where, links, order, world, carrier, markers) -> dict:
    """The links' `<collision>` shapes by link, each with a marker at its centre (and a
    box's corners) on the body that carries the link."""
    collisions: dict[str, tuple[UrdfCollision, ...]] = {}
    for name in order:
        shapes = [c for c in links[name].collisions if c.geometry is not None]
        entries = []
        for k, collision in enumerate(shapes):
            geometry = collision.geometry
            if geometry.box is not None:
                kind, size = "box", tuple(float(x) for x in geometry.box.size)
            elif geometry.cylinder is not None:
                kind = "cylinder"
                size = (float(geometry.cylinder.radius), float(geometry.cylinder.length))
            elif geometry.sphere is not None:
                kind, size = "sphere", (float(geometry.sphere.radius),)
            elif geometry.mesh is not None:
                kind, size = "mesh", ()
            else:
                continue
            key = f"{name}_collision" + (str(k) if len(shapes) > 1 else "")
            link_rot, link_pos = world[name]
            r, p = transform(collision.origin)
            rot, pos = link_rot @ r, link_pos + link_rot @ p
            markers.add(carrier[name], key, rot, pos)
            corners = ()
            if kind == "box":
                half = 0.5 * np.asarray(size)
                signs = np.array(
                    [[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)]
                )
                for j, sign in enumerate(signs):
                    markers.add(carrier[name], f"{key}_corner{j}", rot, pos + rot @ (sign * half))
                corners = tuple(f"{carrier[name]}.{key}_corner{j}" for j in range(len(signs)))
            entries.append(
                UrdfCollision(
                    name, f"{carrier[name]}.{key}", kind, size, corners, where("link", name)
                )
            )
        if entries:
            collisions[name] = tuple(entries)
    return collisions


def link_visuals(path, robot, order, carrier) -> dict:
    """The links' `<visual>`s by the body that carries them, in the links' order."""
    colors = {m.name: m.color for m in robot.materials if m.name is not None}
    links = {link.name: link for link in robot.links}
    visuals: dict[str, list] = {}
    for name in order:
        body = carrier[name]
        marker = f"{body}.{'frame' if body == name else name}"
        for visual in links[name].visuals:
            entry = _visual(path, name, marker, visual, colors)
            if entry is not None:
                visuals.setdefault(body, []).append(entry)
    return {body: tuple(entries) for body, entries in visuals.items()}


def _visual(path, link, marker, visual, colors):
    geometry = visual.geometry
    if geometry is None:
        return None
    mesh, scale = None, (1.0, 1.0, 1.0)
    if geometry.box is not None:
        kind, size = "box", tuple(float(x) for x in geometry.box.size)
    elif geometry.cylinder is not None:
        kind, size = "cylinder", (float(geometry.cylinder.radius), float(geometry.cylinder.length))
    elif geometry.sphere is not None:
        kind, size = "sphere", (float(geometry.sphere.radius),)
    elif geometry.mesh is not None:
        kind, size = "mesh", ()
        mesh = _mesh_file(path, geometry.mesh.filename)
        if geometry.mesh.scale is not None:
            scale = tuple(float(x) for x in np.broadcast_to(geometry.mesh.scale, (3,)))
    else:
        return None
    rot, pos = transform(visual.origin)
    color = None
    if visual.material is not None:
        found = visual.material.color or colors.get(visual.material.name)
        if found is not None:
            color = tuple(float(x) for x in found.rgba)
    return UrdfVisual(
        link, marker, kind, size, mesh, scale, tuple(float(x) for x in pos), _rpy(rot), color
    )


def _rpy(rot):
    """URDF's roll, pitch, yaw of a rotation `R_z(yaw) R_y(pitch) R_x(roll)`."""
    pitch = float(np.arcsin(np.clip(-rot[2, 0], -1.0, 1.0))) + 0.0  # no -0.0
    if abs(rot[2, 0]) < 1.0 - 1e-12:
        return (
            float(np.arctan2(rot[2, 1], rot[2, 2])),
            pitch,
            float(np.arctan2(rot[1, 0], rot[0, 0])),
        )
    # Pitch ±π/2: only roll ∓ yaw is defined; put it all in the roll.
    return (float(np.arctan2(-rot[1, 2], rot[1, 1])), pitch, 0.0)


def _mesh_file(path, filename):
    """A mesh's file: `file://` and plain names against the URDF file's directory;
    `package://name/rest` as `rest` or `name/rest` under the first directory up from the
    URDF file that has it (ROS packages keep `urdf/` and `meshes/` side by side). A file
    found nowhere is named under the URDF file's directory."""
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    if filename.startswith("file://"):
        filename = filename[len("file://") :]
    if not filename.startswith("package://"):
        return os.path.normpath(os.path.join(directory, filename))
    package, _, rest = filename[len("package://") :].partition("/")
    up = directory
    while True:
        for candidate in (os.path.join(up, rest), os.path.join(up, package, rest)):
            if os.path.isfile(candidate):
                return os.path.normpath(candidate)
        if os.path.dirname(up) == up:
            return os.path.normpath(os.path.join(directory, rest))
        up = os.path.dirname(up)
