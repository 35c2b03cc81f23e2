"""The 3-D viewer (`jaxdae.viz.view`): Bricard's mechanism and the URDF arm as viser scenes,
the saved page offline and of sane size, the recorded frames and poses against the
mechanism's kinematics, and (slow) the page rendered by headless Chromium."""

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

from jaxdae.viz._viewer import view  # noqa: E402

ARM = Path(__file__).parent / "data" / "three_link_arm.urdf"


@pytest.fixture(scope="module")
def bricard_run():
    model = bricard()
    q0, v0 = model.initial_state()
    sol = jaxdae.simulate(model, jaxdae.PseudoInverse(20.0, 100.0), 0.0, 1.0, q0, v0,
                          ts=jnp.linspace(0.0, 1.0, 21), rtol=1e-8, atol=1e-10)
    return model, sol


@pytest.fixture(scope="module")
def arm_run():
    """The arm at a few joint angles (a kinematic motion: what is drawn, not the physics)."""
    pytest.importorskip("yourdfpy", reason="URDF import needs yourdfpy: pip install 'jaxdae[urdf]'")
    model = mb.load_urdf(ARM).mechanism(forces=[mb.Gravity()], limits=False)
    qs = [model.initial_state(joint_coordinates={"yaw": (a, 0.0), "shoulder": (0.5 * a, 0.0),
                                                 "elbow": (-a, 0.0)})[0]
          for a in np.linspace(0.0, 1.0, 5)]
    return model, SimpleNamespace(ts=jnp.linspace(0.0, 2.0, 5), q=jnp.stack(qs))


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
    return [m for _, m in rec["messages"]
            if m["type"] == "SetPositionMessage" and m["name"] == name]


def test_bricard_scene_frames_and_poses(bricard_run, tmp_path):
    model, sol = bricard_run
    viewer = view(model, sol, frames=12)
    assert viewer.nodes == tuple(f"/bodies/bar{i}" for i in range(1, 6)) + tuple(
        f"/joints/j{i}" for i in range(6))
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
    q = np.stack([np.interp(times, np.asarray(sol.ts), np.asarray(sol.q)[:, k])
                  for k in range(sol.q.shape[1])], axis=1)
    for name in model.body_names:
        sent = node_positions(rec, f"/bodies/{name}")
        assert len(sent) == 12
        expected = np.asarray(model.marker_position(jnp.asarray(q), name))
        np.testing.assert_allclose([m["position"] for m in sent], expected, atol=1e-9)
    frame = 7
    np.testing.assert_allclose(viewer.positions[frame, 2],
                               model.marker_position(jnp.asarray(q[frame]), "bar3"), atol=1e-9)
    j3 = viewer.nodes.index("/joints/j3")
    np.testing.assert_allclose(viewer.positions[frame, j3],
                               model.marker_position(jnp.asarray(q[frame]), "bar3.b"), atol=1e-9)
    # The frames follow fps over the simulated span by default; the notebook view is the page.
    assert view(model, sol, fps=10).num_frames == 11
    assert viewer._repr_html_().startswith("<iframe srcdoc=")


def test_urdf_arm_scene(arm_run, tmp_path):
    model, sol = arm_run
    viewer = view(model, sol, fps=5)
    assert viewer.num_frames == 11
    assert viewer.nodes == (tuple(f"/bodies/{b}" for b in model.body_names)
                            + tuple(f"/joints/{j}" for j in model.joint_names))
    rec = recording(viewer.to_html())
    tool = np.asarray(model.marker_position(sol.q[-1], "slider.tool"))
    slider = np.asarray(model.marker_position(sol.q[-1], "slider"))
    np.testing.assert_allclose(viewer.positions[-1, model.body_names.index("slider")], slider,
                               atol=1e-9)
    assert np.linalg.norm(tool - slider) > 0  # the tool frame is a marker, drawn as a rod
    assert len(node_positions(rec, "/bodies/upper_arm")) == 11


def test_errors(bricard_run):
    model, sol = bricard_run
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
        [mb.Revolute("ground", "rod.pin", name="pin")], [mb.Gravity()])
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
    subprocess.run([chromium, "--headless", "--no-sandbox", "--use-angle=swiftshader",
                    "--enable-unsafe-swiftshader", "--window-size=1000,700",
                    "--virtual-time-budget=1500", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=240)
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    assert len(colours) > 100
    assert (np.abs(pixels - background).sum(axis=1) > 60).mean() > 0.03

