"""The 3-D viewer (`jaxdae.viz.view`): Bricard's mechanism and the URDF arm as viser scenes,
the saved page offline and of sane size, the recorded frames and poses against the
mechanism's kinematics, a URDF arm drawn from its visual geometry (poses against the chain
of URDF transforms), and (slow) the pages rendered by headless Chromium."""

import base64
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae.examples._bricard import bricard

pytest.importorskip("viser", reason="the 3-D viewer needs viser: pip install 'jaxdae[viz]'")

from jaxdae.viz import view  # noqa: E402

ARM = Path(__file__).parent / "data" / "three_link_arm.urdf"
VISUAL_ARM = Path(__file__).parent / "data" / "arm_with_visuals.urdf"


@pytest.fixture(scope="module")
def bricard_run():
    model = bricard()
    q0, v0 = model.initial_state()
    sol = jaxdae.simulate(
        model,
        jaxdae.PseudoInverse(20.0, 100.0),
        0.0,
        1.0,
        q0,
        v0,
        ts=jnp.linspace(0.0, 1.0, 21),
        rtol=1e-8,
        atol=1e-10,
    )
    return model, sol


# The arm's joint angles at each saved state of `arm_run`.
ANGLES = [
    {"yaw": a, "shoulder": 0.5 * a, "elbow": -a, "wrist": 0.08 * a}
    for a in np.linspace(0.0, 1.0, 3)
]


@pytest.fixture(scope="module")
def arm_run():
    """The arm at a few joint angles (a kinematic motion: what is drawn, not the physics)."""
    pytest.importorskip("yourdfpy", reason="URDF import needs yourdfpy: pip install 'jaxdae[urdf]'")
    model = mb.load_urdf(ARM).mechanism(forces=[mb.Gravity()], limits=False)
    qs = [model.initial_state(joint_coordinates=angles)[0] for angles in ANGLES]
    return model, SimpleNamespace(ts=jnp.linspace(0.0, 2.0, 3), q=jnp.stack(qs))


def recording(page: str) -> dict:
    """The viser recording inlined in a saved page (base64 of a zstd frame holding the
    msgpack messages, the layout of viser's `StateSerializer.serialize`)."""
    import msgspec
    import zstandard

    data = base64.b64decode(re.search(r'__VISER_EMBED_DATA__="([^"]*)"', page).group(1))
    size = int.from_bytes(data[:8], "little")
    inner = zstandard.ZstdDecompressor().decompress(data[8:], max_output_size=size)
    length = int.from_bytes(inner[:8], "little")
    return msgspec.msgpack.decode(inner[8 : 8 + length])


def node_positions(rec: dict, name: str) -> list:
    return [
        m for _, m in rec["messages"] if m["type"] == "SetPositionMessage" and m["name"] == name
    ]


@pytest.mark.slow  # a solve of Bricard's mechanism; the arm's scene is checked by default
def test_bricard_scene_frames_and_poses(bricard_run, tmp_path):
    model, sol = bricard_run
    viewer = view(model, sol, frames=12)
    assert viewer.nodes == tuple(f"/bodies/bar{i}" for i in range(1, 6)) + tuple(
        f"/joints/j{i}" for i in range(6)
    )
    assert viewer.num_frames == 12 and viewer.positions.shape == (12, 11, 3)
    path = tmp_path / "bricard.html"
    viewer.save_html(path)
    page = path.read_text()
    # Offline: the scripts are inline; the only URL is the SVG namespace of the icon.
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert set(re.findall(r"https?://[^\"' )]+", page)) <= {"http://www.w3.org/2000/svg"}
    assert 0.5e6 < path.stat().st_size < 3e6
    rec = recording(page)
    assert rec["durationSeconds"] == pytest.approx(12 / 30)
    created = {m["name"] for _, m in rec["messages"] if m["type"] == "FrameMessage"}
    assert set(viewer.nodes) | {"/ground"} <= created
    # One pose per frame for every body, at the kinematics of the interpolated state.
    times = np.linspace(0.0, 1.0, 12)
    q = np.stack(
        [
            np.interp(times, np.asarray(sol.ts), np.asarray(sol.q)[:, k])
            for k in range(sol.q.shape[1])
        ],
        axis=1,
    )
    for name in model.body_names:
        sent = node_positions(rec, f"/bodies/{name}")
        assert len(sent) == 12
        expected = np.asarray(model.marker_position(jnp.asarray(q), name))
        np.testing.assert_allclose([m["position"] for m in sent], expected, atol=1e-9)
    frame = 7
    np.testing.assert_allclose(
        viewer.positions[frame, 2], model.marker_position(jnp.asarray(q[frame]), "bar3"), atol=1e-9
    )
    j3 = viewer.nodes.index("/joints/j3")
    np.testing.assert_allclose(
        viewer.positions[frame, j3],
        model.marker_position(jnp.asarray(q[frame]), "bar3.b"),
        atol=1e-9,
    )
    # The frames follow fps over the simulated span by default; the notebook view is the page.
    assert view(model, sol, fps=10).num_frames == 11
    assert viewer._repr_html_().startswith("<iframe srcdoc=")


@pytest.mark.slow
def test_urdf_arm_scene(arm_run, tmp_path):
    model, sol = arm_run
    viewer = view(model, sol, fps=5)
    assert viewer.num_frames == 11
    assert viewer.nodes == (
        tuple(f"/bodies/{b}" for b in model.body_names)
        + tuple(f"/joints/{j}" for j in model.joint_names)
    )
    rec = recording(viewer.to_html())
    tool = np.asarray(model.marker_position(sol.q[-1], "slider.tool"))
    slider = np.asarray(model.marker_position(sol.q[-1], "slider"))
    np.testing.assert_allclose(
        viewer.positions[-1, model.body_names.index("slider")], slider, atol=1e-9
    )
    assert np.linalg.norm(tool - slider) > 0  # the tool frame is a marker, drawn as a rod
    assert len(node_positions(rec, "/bodies/upper_arm")) == 11


def rot_x(a):
    return np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])


def rot_y(a):
    return np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])


def rot_z(a):
    return np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])


def link_poses(yaw, shoulder, elbow, wrist):
    """The world poses `(R, p)` of the arm's link frames by the chain of URDF transforms."""

    def then(pose, xyz, rot=None):
        rot = np.eye(3) if rot is None else rot
        return pose[0] @ rot, pose[1] + pose[0] @ np.asarray(xyz, float)

    poses = {"base_link": (np.eye(3), np.zeros(3))}
    poses["turret"] = then(poses["base_link"], (0, 0, 0.1), rot_z(yaw))
    poses["upper_arm"] = then(poses["turret"], (0, 0, 0.1), rot_y(shoulder))
    poses["forearm"] = then(poses["upper_arm"], (0, 0, 0.5), rot_y(elbow))
    poses["slider"] = then(poses["forearm"], (0.4 + wrist, 0, 0))
    poses["tool"] = then(poses["slider"], (0.05, 0, 0))
    return poses


def matrix(wxyz):
    w, x, y, z = wxyz
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def recorded_pose(rec: dict, name: str, time: float):
    """The pose `(R, p)` of node `name` relative to its parent as last set at `time`."""
    position, wxyz = np.zeros(3), (1.0, 0.0, 0.0, 0.0)
    for at, m in rec["messages"]:
        if at <= time + 1e-9 and m.get("name") == name:
            position = np.asarray(m.get("position", position), float)
            wxyz = m.get("wxyz", wxyz)
    return matrix(wxyz), position


@pytest.mark.slow
def test_urdf_visuals_drawn_at_their_link_frames(arm_run, tmp_path):
    """arm_with_visuals.urdf has three_link_arm.urdf's bodies: its visuals draw that motion."""
    model, sol = arm_run
    robot = mb.load_urdf(VISUAL_ARM)
    viewer = view(model, sol, visuals=robot.visuals, frames=sol.ts, fps=10)
    assert viewer.nodes == (
        tuple(f"/bodies/{b}" for b in model.body_names)
        + tuple(f"/joints/{j}" for j in model.joint_names)
    )
    path = tmp_path / "arm.html"
    viewer.save_html(path)
    page = path.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert set(re.findall(r"https?://[^\"' )]+", page)) <= {"http://www.w3.org/2000/svg"}
    rec = recording(page)
    created = {m["name"]: m["type"] for _, m in rec["messages"] if "props" in m}
    # One scene node per visual, of its kind, in place of the bodies' default shapes.
    shapes = {
        "/ground/visual_base_link_0": "BoxMessage",
        "/bodies/turret/visual_turret_0": "CylinderMessage",
        "/bodies/upper_arm/visual_upper_arm_0": "CylinderMessage",
        "/bodies/forearm/visual_forearm_0": "MeshMessage",
        "/bodies/slider/visual_slider_0": "IcosphereMessage",
        "/bodies/slider/visual_tool_0": "BoxMessage",
    }
    assert {name: created.get(name) for name in shapes} == shapes
    assert not any(
        name.startswith("/bodies/") and name.endswith(("/inertia", "/centre")) for name in created
    )
    assert all(f"/joints/{j}/glyph" in created for j in model.joint_names)
    mesh = viewer._scene.moving[2].shapes[0].mesh
    assert mesh is not None and mesh[1].shape == (24, 3)
    np.testing.assert_allclose(
        np.ptp(mesh[0], axis=0), [0.07, 0.7 * 0.0866025, 0.4], atol=1e-6
    )  # scaled by 0.7 across
    # World pose of each visual at each frame = link pose (URDF chain) ∘ visual origin.
    for frame, angles in enumerate(ANGLES):
        links = link_poses(*angles.values())
        for body, visuals in robot.visuals.items():
            node = "/ground" if body == "ground" else f"/bodies/{body}"
            node_rot, node_pos = recorded_pose(rec, node, frame / 10)
            for visual in visuals:
                index = [v for v in visuals if v.link == visual.link].index(visual)
                rot, pos = recorded_pose(rec, f"{node}/visual_{visual.link}_{index}", frame / 10)
                link_rot, link_pos = links[visual.link]
                expected_rot = (
                    link_rot @ rot_z(visual.rpy[2]) @ rot_y(visual.rpy[1]) @ rot_x(visual.rpy[0])
                )
                expected_pos = link_pos + link_rot @ np.asarray(visual.xyz)
                np.testing.assert_allclose(node_pos + node_rot @ pos, expected_pos, atol=1e-7)
                np.testing.assert_allclose(node_rot @ rot, expected_rot, atol=1e-7)
    # The robot itself reads as its mechanism with its visuals; the grid under the base.
    assert view(robot).nodes == viewer.nodes
    assert viewer._scene.floor == pytest.approx(0.0, abs=1e-12)


def test_missing_mesh_warns_and_the_body_is_drawn_as_before(tmp_path):
    pytest.importorskip("yourdfpy", reason="URDF import needs yourdfpy: pip install 'jaxdae[urdf]'")
    path = tmp_path / "arm.urdf"
    path.write_text(VISUAL_ARM.read_text().replace("meshes/forearm.stl", "meshes/nowhere.stl"))
    robot = mb.load_urdf(path)
    with pytest.warns(UserWarning, match=r"mesh file .*meshes/nowhere\.stl of link 'forearm'"):
        viewer = view(robot)
    forearm = viewer._scene.moving[2]
    assert forearm.path == "/bodies/forearm"
    assert {s.name for s in forearm.shapes} >= {"centre", "inertia"}
    with pytest.raises(ValueError, match=r"bodies \['wheel'\]"):
        view(robot.mechanism(), visuals={"wheel": robot.visuals["turret"]})


def test_errors(unchecked):
    model = mb.Mechanism(
        [mb.PlanarBody("rod", 1.0, 0.1, markers={"pin": (-0.5, 0.0)}, position=(0.5, 0.0))],
        [mb.Revolute("ground", "rod.pin", name="pin")],
        [mb.Gravity()],
    )
    angles = np.linspace(0.0, 0.5, 4)
    q = np.stack([[0.5 * np.cos(a), 0.5 * np.sin(a), a] for a in angles])
    sol = SimpleNamespace(ts=jnp.linspace(0.0, 1.0, 4), q=jnp.asarray(q))
    batch = SimpleNamespace(ts=sol.ts, q=jnp.stack([sol.q, sol.q]))
    with pytest.raises(ValueError, match="member="):
        view(model, batch)
    assert view(model, batch, member=1, frames=3).num_frames == 3
    with pytest.raises(ValueError, match="Mechanism"):
        view(object(), sol)
    assert view(model).num_frames == 1  # the reference poses


def test_planar_mechanism_in_the_plane():
    model = mb.Mechanism(
        [mb.PlanarBody("rod", 1.0, 0.1, markers={"pin": (-0.5, 0.0)}, position=(0.5, 0.0))],
        [mb.Revolute("ground", "rod.pin", name="pin")],
        [mb.Gravity()],
    )
    q = model.reference_coordinates()
    viewer = view(model, SimpleNamespace(ts=jnp.array([0.0, 1.0]), q=jnp.stack([q, q])))
    np.testing.assert_allclose(viewer.positions[0, 0], [0.5, 0.0, 0.0])


@pytest.mark.slow
def test_headless_chromium_renders_the_mechanism(bricard_run, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no `chromium` on PATH (Debian: apt-get install chromium)")
    from PIL import Image

    model, sol = bricard_run
    page, shot = tmp_path / "bricard.html", tmp_path / "bricard.png"
    view(model, sol).save_html(page)
    # Software WebGL; the virtual time budget lets the page load and play before the shot.
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--use-angle=swiftshader",
            "--enable-unsafe-swiftshader",
            "--window-size=1000,700",
            "--virtual-time-budget=1500",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    assert len(colours) > 100
    assert (np.abs(pixels - background).sum(axis=1) > 60).mean() > 0.03
