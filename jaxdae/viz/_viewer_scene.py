"""What the 3-D viewer draws: a mechanism's bodies, joints and ground as simple shapes (or a
URDF robot's visual geometry), and the poses of their nodes along a trajectory, computed by
the mechanism's own kinematics."""

import os
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..multibody import Cylindrical, Gravity, Mechanism, Revolute, RigidBody, TreeMechanism
from ..multibody._kinematics import euler_rotation, quaternion_from_matrix, rpy_matrix, split

# matplotlib's tab10 colours, one per body in turn.
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)
JOINT_COLOR = (70, 70, 70)
GROUND_COLOR = (110, 110, 110)


class Shape(NamedTuple):
    """A shape fixed on a node: `kind` `"box"` (`size` the three sides), `"sphere"`
    (`(radius,)`), `"cylinder"` (`(radius, height)`, along its local z) or `"mesh"`
    (`mesh` its vertices `(V, 3)` and triangles `(T, 3)`), placed by `position` and `wxyz`
    in the node's frame; `opacity` `None` for opaque."""

    name: str
    kind: str
    size: tuple[float, ...]
    color: tuple[int, int, int]
    position: np.ndarray
    wxyz: np.ndarray
    mesh: tuple[np.ndarray, np.ndarray] | None = None
    opacity: float | None = None


class Node(NamedTuple):
    """A scene node (`path` such as `/bodies/bar1`) and the shapes it carries."""

    path: str
    shapes: tuple[Shape, ...]


class Scene(NamedTuple):
    """The nodes and their poses: `moving` (the bodies at their centres of mass, then the
    joints at their markers `a`) posed at every frame by `positions` `(F, K, 3)` and
    `wxyz` `(F, K, 4)`; `ground` fixed; `up` the scene's up direction (against gravity);
    `centre` and `extent` the box that holds the motion; `floor` the height along `up` of
    the grid, below everything drawn."""

    moving: tuple[Node, ...]
    ground: Node
    positions: np.ndarray
    wxyz: np.ndarray
    up: np.ndarray
    centre: np.ndarray
    extent: float
    floor: float


def _marker_poses(model, q, refs):
    """Positions `(F, K, d)`, Euler parameters `(F, K, 4)` and rotation matrices
    `(F, K, 3, 3)` of the markers `refs`."""
    points = jnp.stack([model.marker_position(q, ref) for ref in refs], axis=1)
    rotations = jnp.stack([model.marker_rotation(q, ref) for ref in refs], axis=1)
    if model.dimension == 2:  # embed the plane as z = 0, the rotations about z
        points = jnp.concatenate([points, jnp.zeros(points.shape[:-1] + (1,), q.dtype)], -1)
        block = jnp.zeros(rotations.shape[:-2] + (3, 3), q.dtype)
        rotations = block.at[..., :2, :2].set(rotations).at[..., 2, 2].set(1.0)
    quaternions = jax.vmap(jax.vmap(quaternion_from_matrix))(rotations)
    return points, quaternions, rotations


_poses = eqx.filter_jit(_marker_poses)


def _z_to(u):
    """The Euler parameters `(w, x, y, z)` of a rotation that turns z into the unit `u`."""
    z = np.array([0.0, 0.0, 1.0])
    half = z + u
    if np.linalg.norm(half) < 1e-9:  # u = −z: half a turn about x
        return np.array([0.0, 1.0, 0.0, 0.0])
    half /= np.linalg.norm(half)
    return np.concatenate([[z @ half], np.cross(z, half)])


def _rod(name, start, end, radius, color):
    """A cylinder from `start` to `end` (`None` where they coincide)."""
    length = float(np.linalg.norm(end - start))
    if length < 1e-9:
        return None
    return Shape(
        name,
        "cylinder",
        (radius, length),
        color,
        0.5 * (start + end),
        _z_to((end - start) / length),
    )


def _inertia_box(body, minimum):
    """The uniform box with the body's mass and principal moments of inertia, along its
    principal axes: side² = 6 (J_j + J_k − J_i) / m (a bar shows as the bar)."""
    moments, axes = np.linalg.eigh(np.asarray(body.inertia, float))
    if np.linalg.det(axes) < 0:
        axes[:, 0] = -axes[:, 0]
    sides = 6.0 * (moments.sum() - 2.0 * moments) / float(body.mass)
    sides = np.maximum(np.sqrt(np.maximum(sides, 0.0)), minimum)
    return Shape(
        "inertia",
        "box",
        tuple(float(s) for s in sides),
        (0, 0, 0),
        np.zeros(3),
        np.asarray(quaternion_from_matrix(jnp.asarray(axes))),
    )


def _point3(point):
    point = np.asarray(point, float)
    return np.concatenate([point, np.zeros(3 - point.size)])


def _up(model):
    """Against the mechanism's gravity; +y in the plane and +z in space without one."""
    for force in model.forces:
        if isinstance(force, Gravity):
            g = _point3(
                force.acceleration
                if force.acceleration is not None
                else -np.eye(model.dimension)[-1]
            )  # Gravity's default
            if np.linalg.norm(g) > 0:
                return -g / np.linalg.norm(g)
    return np.array([0.0, 1.0, 0.0]) if model.dimension == 2 else np.array([0.0, 0.0, 1.0])


def _joint_axis(joint, dimension):
    """The unit axis, in the marker frame, of a joint that turns about one (`None` for the
    others, drawn as a ball)."""
    if not isinstance(joint, Revolute | Cylindrical):
        return None
    if dimension == 2 or joint.axis is None:
        return np.array([0.0, 0.0, 1.0])
    axis = np.asarray(joint.axis, float)
    return axis / np.linalg.norm(axis)


def _load_mesh(filename, link, cache):
    """The vertices and triangles of a mesh file (read by trimesh), or `None` with a
    warning naming the file where it is missing or unreadable."""
    if filename not in cache:
        cache[filename] = None
        if not os.path.isfile(filename):
            warnings.warn(
                f"The mesh file {filename} of link {link!r} does not exist; the "
                "body is drawn without it.",
                stacklevel=5,
            )
            return None
        import trimesh  # a dependency of yourdfpy; only meshes need it

        try:
            mesh = trimesh.load(filename, force="mesh")
            if len(mesh.faces) == 0:
                raise ValueError("no triangles")
            cache[filename] = (np.asarray(mesh.vertices, float), np.asarray(mesh.faces, np.int64))
        except Exception as error:  # trimesh raises many kinds for files it cannot read
            warnings.warn(
                f"The mesh file {filename} of link {link!r} cannot be read "
                f"({error}); the body is drawn without it.",
                stacklevel=5,
            )
    return cache[filename]


def _visual_shapes(body, visuals, color, cache) -> list[Shape]:
    """The shapes of a body's URDF visuals in its body frame: each visual's origin
    composed with its link frame (the body's marker)."""
    shapes, count = [], {}
    for visual in visuals:
        k = count[visual.link] = count.get(visual.link, -1) + 1  # k-th visual of its link
        key = split(visual.marker)[1]
        marker_rot = np.asarray(body.orientations.get(key, np.eye(3)), float)
        marker_pos = np.asarray(body.markers[key], float)
        rot = marker_rot @ np.asarray(rpy_matrix(*visual.rpy), float)
        position = marker_pos + marker_rot @ np.asarray(visual.xyz, float)
        mesh = None
        if visual.kind == "mesh":
            mesh = _load_mesh(visual.mesh, visual.link, cache)
            if mesh is None:
                continue
            mesh = (mesh[0] * np.asarray(visual.scale), mesh[1])
        rgba = visual.color
        shape_color = color if rgba is None else tuple(int(round(255 * c)) for c in rgba[:3])
        opacity = None if rgba is None or rgba[3] >= 1.0 else float(rgba[3])
        shapes.append(
            Shape(
                f"visual_{visual.link}_{k}",
                visual.kind,
                tuple(visual.size),
                shape_color,
                position,
                np.asarray(quaternion_from_matrix(jnp.asarray(rot)), float),
                mesh,
                opacity,
            )
        )
    return shapes


def _reach(shape, u):
    """How far a shape reaches along the unit directions `u` `(..., 3)` (its frame) from
    its origin: its support function."""
    if shape.kind == "box":
        return 0.5 * np.abs(u) @ np.asarray(shape.size)
    if shape.kind == "sphere":
        return np.full(u.shape[:-1], shape.size[0])
    if shape.kind == "cylinder":
        radius, height = shape.size
        return radius * np.sqrt(np.clip(1.0 - u[..., 2] ** 2, 0.0, 1.0)) + 0.5 * height * np.abs(
            u[..., 2]
        )
    assert shape.mesh is not None
    return (u @ shape.mesh[0].T).max(axis=-1)


def _placed(shapes, positions, rotations, up):
    """The centres `(F·S, 3)` of shapes on a node at the poses `positions` `(F, 3)`,
    `rotations` `(F, 3, 3)`, and their lowest height along `up`."""
    centres, lowest = [], np.inf
    for shape in shapes:
        rot = rotations @ np.asarray(euler_rotation(jnp.asarray(shape.wxyz, float)))  # (F, 3, 3)
        centre = positions + rotations @ shape.position
        down = np.einsum("fji,j->fi", rot, -up)
        lowest = min(lowest, float((centre @ up - _reach(shape, down)).min()))
        centres.append(centre)
    return centres, lowest


def build_scene(
    model: Mechanism | TreeMechanism, q: np.ndarray, size: float | None = None, visuals=None
) -> Scene:
    """The scene of `model` along the coordinates `q` `(F, n)`; `size` the length the
    shapes are scaled by (default: the extent of the motion); `visuals` URDF visuals by
    body name, drawn in place of those bodies' default shapes."""
    bodies, joints = model.bodies, model.joints
    refs = tuple(b.name for b in bodies) + tuple(j.a for j in joints)
    positions, wxyz, rotations = (np.array(x, float) for x in _poses(model, jnp.asarray(q), refs))
    wxyz /= np.linalg.norm(wxyz, axis=-1, keepdims=True)
    up = _up(model)
    cache: dict = {}
    drawn = {}  # the visual shapes of the bodies that have some to draw
    for k, body in enumerate((model.ground, *bodies)):
        color = GROUND_COLOR if k == 0 else PALETTE[(k - 1) % len(PALETTE)]
        shapes = _visual_shapes(body, (visuals or {}).get(body.name, ()), color, cache)
        if shapes:
            drawn[body.name] = shapes
    visual_centres, floor = [], np.inf
    for k, body in enumerate((model.ground, *bodies)):
        if body.name in drawn:
            at = (
                (np.zeros((1, 3)), np.eye(3)[None])
                if k == 0
                else (positions[:, k - 1], rotations[:, k - 1])
            )
            centres, lowest = _placed(drawn[body.name], *at, up)
            visual_centres += centres
            floor = min(floor, lowest)
    ground_points = [_point3(p) for p in model.ground.markers.values()]
    cloud = np.concatenate(
        [positions.reshape(-1, 3)] + [p[None] for p in ground_points] + visual_centres
    )
    low, high = cloud.min(axis=0), cloud.max(axis=0)
    extent = float(np.max(high - low))
    if size is None:
        size = extent if extent > 1e-9 else 1.0
    rod, ball, pin = 0.012 * size, 0.03 * size, 0.035 * size

    moving = []
    for k, body in enumerate(bodies):
        color = PALETTE[k % len(PALETTE)]
        if body.name in drawn:
            moving.append(Node(f"/bodies/{body.name}", tuple(drawn[body.name])))
            continue
        shapes = [Shape("centre", "sphere", (ball,), color, np.zeros(3), np.array([1.0, 0, 0, 0]))]
        if isinstance(body, RigidBody):
            shapes.append(_inertia_box(body, 2 * rod)._replace(color=color))
        for marker, point in body.markers.items():
            shape = _rod(f"rod_{marker}", np.zeros(3), _point3(point), rod, color)
            if shape is not None:
                shapes.append(shape)
        moving.append(Node(f"/bodies/{body.name}", tuple(shapes)))
    for name, joint in zip(model.joint_names, joints, strict=True):
        axis = _joint_axis(joint, model.dimension)
        if axis is None:
            shape = Shape(
                "glyph", "sphere", (pin,), JOINT_COLOR, np.zeros(3), np.array([1.0, 0, 0, 0])
            )
        else:
            shape = Shape(
                "glyph", "cylinder", (pin, 4 * pin), JOINT_COLOR, np.zeros(3), _z_to(axis)
            )
        moving.append(Node(f"/joints/{name}", (shape,)))
    used = {
        split(ref)[1] for j in joints for ref in (j.a, j.b) if split(ref)[0] == model.ground.name
    }
    ground = Node(
        "/ground",
        tuple(
            Shape(
                f"marker_{key}",
                "box",
                (2 * pin,) * 3,
                GROUND_COLOR,
                _point3(point),
                np.array([1.0, 0, 0, 0]),
            )
            for key, point in model.ground.markers.items()
            if key in used
        )
        + tuple(drawn.get(model.ground.name, ())),
    )
    # The grid a little below the glyphs' centres, and under the visual geometry.
    floor = min(floor, float((positions.reshape(-1, 3) @ up).min()) - 0.05 * max(extent, size))
    return Scene(
        tuple(moving), ground, positions, wxyz, up, 0.5 * (low + high), max(extent, size), floor
    )


def add_node(scene_api, node: Node, position=(0.0, 0.0, 0.0), wxyz=(1.0, 0.0, 0.0, 0.0)):
    """Add `node` and its shapes to a viser scene; returns the node's handle."""
    handle = scene_api.add_frame(node.path, show_axes=False, position=position, wxyz=wxyz)
    for shape in node.shapes:
        path = f"{node.path}/{shape.name}"
        place = {"position": shape.position, "wxyz": shape.wxyz, "opacity": shape.opacity}
        if shape.kind == "box":
            scene_api.add_box(path, color=shape.color, dimensions=shape.size, **place)
        elif shape.kind == "sphere":
            scene_api.add_icosphere(
                path, radius=shape.size[0], color=shape.color, subdivisions=2, **place
            )
        elif shape.kind == "cylinder":
            scene_api.add_cylinder(
                path,
                radius=shape.size[0],
                height=shape.size[1],
                color=shape.color,
                radial_segments=16,
                **place,
            )
        else:
            assert shape.mesh is not None
            scene_api.add_mesh_simple(
                path,
                shape.mesh[0].astype(np.float32),
                shape.mesh[1].astype(np.uint32),
                color=shape.color,
                flat_shading=True,
                **place,
            )
    return handle


def populate(server, scene: Scene, frame: int = 0) -> list:
    """Draw `scene` at `frame` in a viser server: up direction, camera, grid, ground and
    the moving nodes, whose handles are returned (in the order of `scene.moving`)."""
    up, centre, extent = scene.up, scene.centre, scene.extent
    server.scene.set_up_direction(tuple(float(u) for u in up))
    # A view from above one corner: two directions across `up` and one along it.
    across = np.cross(up, [1.0, 0.0, 0.0] if abs(up[0]) < 0.9 else [0.0, 1.0, 0.0])
    across /= np.linalg.norm(across)
    other = np.cross(up, across)
    direction = 0.9 * across + 0.8 * other + 0.55 * up
    direction /= np.linalg.norm(direction)
    server.initial_camera.position = tuple(float(x) for x in centre + 1.9 * extent * direction)
    server.initial_camera.look_at = tuple(float(x) for x in centre)
    server.initial_camera.up = tuple(float(x) for x in up)
    server.scene.add_grid(
        "/grid",
        width=3 * extent,
        height=3 * extent,
        cell_size=extent / 10,
        section_size=extent / 2,
        position=tuple(float(x) for x in centre + (scene.floor - centre @ up) * up),
        wxyz=tuple(float(x) for x in _z_to(up)),
    )
    add_node(server.scene, scene.ground)
    return [
        add_node(server.scene, node, scene.positions[frame, k], scene.wxyz[frame, k])
        for k, node in enumerate(scene.moving)
    ]


def show_frame(handles, scene: Scene, frame: int) -> None:
    """Move the moving nodes to their poses at `frame`."""
    for k, handle in enumerate(handles):
        handle.position = scene.positions[frame, k]
        handle.wxyz = scene.wxyz[frame, k]
