"""Animations of planar mechanisms and of systems drawn by a function
(`jaxdae/viz/_animate.py`): what a frame draws, the view, traces, MP4/GIF/HTML output,
batches, and the errors that name the fix."""

import subprocess
import sys
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib", reason="the viz extra: pip install jaxdae[viz]")
matplotlib.use("Agg")

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402
from jaxdae.examples import CartesianPendulum  # noqa: E402
from jaxdae.examples._slider_crank import slider_crank as slider_crank_model  # noqa: E402
from jaxdae.viz import _animate, animate  # noqa: E402


def body_artists(anim):
    return [name for name in anim.artists if name.startswith("body:")]


def covers(anim, points):
    """The view holds every point of `points (..., 2)`."""
    (x0, x1), (y0, y1) = anim.axes.get_xlim(), anim.axes.get_ylim()
    points = np.asarray(points).reshape(-1, 2)
    return (
        x0 <= points[:, 0].min()
        and points[:, 0].max() <= x1
        and y0 <= points[:, 1].min()
        and points[:, 1].max() <= y1
    )


def markers(model):
    return [b.name for b in model.bodies] + [
        f"{b.name}.{m}" for b in model.bodies for m in b.markers
    ]


@pytest.fixture(scope="module")
def slider_crank():
    """The slider-crank of experiments/examples/slider_crank.py, simulated for 0.3 s."""
    model = slider_crank_model()
    # A consistent start written out (crank angle 0.5 rad at 10 rad/s), so that the module
    # compiles one solve and no consistent-initialization solve.
    c, s = np.cos(0.5), np.sin(0.5)
    pin = 0.1 * np.array([c, s])
    slider_x = pin[0] + np.sqrt(0.3**2 - pin[1] ** 2)
    rod_angle = np.arctan2(-pin[1], slider_x - pin[0])
    q0 = jnp.array([0.0, 0.0, 0.5, *(pin + [slider_x, 0.0]) / 2, rod_angle, slider_x, 0.0, 0.0])
    pin_v = 10 * 0.1 * np.array([-s, c])
    rod_rate = -pin_v[1] / (0.3 * np.cos(rod_angle))
    slider_v = pin_v[0] - 0.3 * np.sin(rod_angle) * rod_rate
    v0 = jnp.array([0.0, 0.0, 10.0, *(pin_v + [slider_v, 0.0]) / 2, rod_rate, slider_v, 0.0, 0.0])
    sol = jaxdae.simulate(
        model, jaxdae.Baumgarte(20.0, 100.0), 0.0, 0.3, q0, v0, ts=jnp.linspace(0.0, 0.3, 31)
    )
    assert bool(sol.succeeded) and float(jnp.abs(sol.phi).max()) < 1e-6
    return model, sol


def double_pendulum():
    """Two bars (0.5 m, 0.4 m) hanging from the ground, with a joint limit, a floor the tip's
    disc stays above, and a rope from the elbow to a hook."""
    return mb.Mechanism(
        [
            mb.Ground(markers={"floor": (0.0, -1.2), "hook": (0.6, 0.0)}),
            mb.PlanarBody("upper", 1.0, 0.02, markers={"top": (0.0, 0.25), "bottom": (0.0, -0.25)}),
            mb.PlanarBody(
                "lower",
                1.0,
                0.02,
                markers={"top": (0.0, 0.2), "tip": (0.0, -0.2), "side": (0.05, 0.0)},
            ),
        ],
        [
            mb.Revolute("ground", "upper.top", name="shoulder"),
            mb.Revolute("upper.bottom", "lower.top", name="elbow"),
        ],
        [mb.Gravity()],
        stops=[
            mb.JointLimit("shoulder", -1.0, 1.0, name="limit"),
            mb.PlaneContact("lower.tip", "ground.floor", radius=0.05, name="floor"),
            mb.DistanceStop("upper.bottom", "ground.hook", upper=1.0, name="rope"),
        ],
    )


def double_pendulum_motion(count=12):
    """Its configurations for shoulder and elbow angles swinging in time (absolute
    coordinates written out): a solution without a solve."""
    ts = np.linspace(0.0, 1.0, count)
    a1, a2 = 0.8 * np.sin(3 * ts), 1.2 * np.cos(2 * ts)

    def hang(angle, half):  # the offset of a bar's centre from its top
        return np.stack([half * np.sin(angle), -half * np.cos(angle)], axis=-1)

    c1 = hang(a1, 0.25)
    c2 = 2 * c1 + hang(a2, 0.2)
    q = np.concatenate([c1, a1[:, None], c2, a2[:, None]], axis=1)
    return SimpleNamespace(ts=ts, q=q)


def parallelogram(count=9):
    """A parallelogram four-bar with a redundant fifth bar (tests/test_multibody.py) and its
    motion: every crank at one angle, the coupler translating."""
    crank = {"mass": 0.4, "inertia": 0.02, "markers": {"base": (-0.25, 0.0), "tip": (0.25, 0.0)}}
    model = mb.Mechanism(
        [
            mb.Ground(markers={"A": (0.0, 0.0), "B": (0.5, 0.0), "C": (1.0, 0.0)}),
            mb.PlanarBody("left", **crank),
            mb.PlanarBody("middle", **crank),
            mb.PlanarBody("right", **crank),
            mb.PlanarBody("coupler", 1.0, 0.1, markers={"l": (-0.5, 0.0), "r": (0.5, 0.0)}),
        ],
        [
            mb.Revolute("ground.A", "left.base"),
            mb.Revolute("ground.B", "middle.base"),
            mb.Revolute("ground.C", "right.base"),
            mb.Revolute("left.tip", "coupler.l"),
            mb.Revolute("middle.tip", "coupler"),
            mb.Revolute("right.tip", "coupler.r"),
        ],
    )
    ts = np.linspace(0.0, 1.0, count)
    a = -np.pi / 2 + 0.7 * np.sin(2 * np.pi * ts)
    arm = np.stack([np.cos(a), np.sin(a)], axis=-1)
    cranks = [np.concatenate([(x, 0.0) + 0.25 * arm, a[:, None]], axis=1) for x in (0, 0.5, 1)]
    coupler = np.concatenate([(0.5, 0.0) + 0.5 * arm, np.zeros((count, 1))], axis=1)
    return model, SimpleNamespace(ts=ts, q=np.concatenate([*cranks, coupler], axis=1))


def test_slider_crank_frame(slider_crank):
    """One artist per body, the pins and the slider block; the view holds every marker at
    every frame; a frame shows the positions at its time."""
    model, sol = slider_crank
    anim = animate(model, sol, frames=sol.ts)
    assert len(anim) == 31 and np.allclose(anim.times, sol.ts)
    anim.frame(10)
    assert sorted(body_artists(anim)) == ["body:crank", "body:rod", "body:slider"]
    assert {"joint:crank", "joint:slide", "joint:slide.line", "ground:crank"} <= set(anim.artists)
    assert all(anim.artists[name].axes is anim.axes for name in anim.artists)
    points = np.stack([model.marker_position(sol.q, m) for m in markers(model)])
    assert covers(anim, points)
    pin = np.asarray(model.marker_position(sol.q[10], "rod.b"))
    np.testing.assert_allclose(
        anim.artists["joint:revolute_2"].get_xydata()[0], pin, atol=1e-9
    )  # drawn at the slider's centre, its marker b
    assert anim.artists["time"].get_text() == "t = 0.100 s"


def test_double_pendulum_with_stops():
    model = double_pendulum()
    motion = double_pendulum_motion()
    anim = animate(model, motion, trace="lower.tip")
    figure = anim.frame(-1)
    assert figure is anim.figure
    assert sorted(body_artists(anim)) == ["body:lower", "body:upper"]
    assert {
        "stop:limit",
        "stop:floor",
        "stop:floor.disc",
        "ground:floor",
        "stop:rope",
        "ground:shoulder",
        "joint:shoulder",
        "joint:elbow",
    } <= set(anim.artists)
    # The lower bar's three markers and centre make a polygon; the upper's a bar.
    assert len(anim.artists["body:lower"].get_xy()) >= 3
    assert len(anim.artists["body:upper"].get_xydata()) == 2
    points = np.stack([model.marker_position(jnp.asarray(motion.q), m) for m in markers(model)])
    assert covers(anim, points)
    assert covers(anim, [(0.6, 0.0), (0.0, -1.2)])  # the hook, the floor under the tip
    # The default frames: real time at 30 frames per second.
    assert len(anim) == 31


def test_four_bar_frame():
    model, motion = parallelogram()
    anim = animate(model, motion, frames=5)
    anim.frame(2)
    assert len(body_artists(anim)) == 4
    assert (
        sum(name.startswith("ground:") and not name.endswith(".hatch") for name in anim.artists)
        == 3
    )
    points = np.stack([model.marker_position(jnp.asarray(motion.q), m) for m in markers(model)])
    assert covers(anim, points)


def test_trace_grows_with_frames(slider_crank):
    model, sol = slider_crank
    anim = animate(model, sol, trace=["crank.pin", "rod"], frames=12)
    for k in (0, 5, 11):
        anim.frame(k)
        path = anim.artists["trace:crank.pin"].get_xydata()
        assert len(path) == k + 1 and len(anim.artists["trace:rod"].get_xydata()) == k + 1
        q = [np.interp(anim.times[k], sol.ts, column) for column in np.asarray(sol.q).T]
        np.testing.assert_allclose(
            path[-1], model.marker_position(jnp.asarray(q), "crank.pin"), atol=1e-12
        )


@pytest.fixture(scope="module")
def short(slider_crank):
    model, sol = slider_crank
    return animate(model, sol, frames=10, fps=20, dpi=60)


def _needs_ffmpeg():
    pytest.importorskip("imageio_ffmpeg", reason="MP4 needs imageio-ffmpeg: the viz extra")


def test_save_mp4(short, tmp_path):
    _needs_ffmpeg()
    data = short.save(tmp_path / "crank.mp4").read_bytes()
    assert len(data) > 1000 and data[4:8] == b"ftyp"


def test_save_gif_and_html(short, tmp_path):
    gif = short.save(tmp_path / "crank.gif")
    from PIL import Image

    with Image.open(gif) as image:
        assert image.format == "GIF" and image.n_frames == 10
        assert image.size == short.figure.canvas.get_width_height()
    html = short.save(tmp_path / "crank.html").read_text()
    assert "<script" in html
    with pytest.raises(ValueError, match=r"\.mp4, \.gif or \.html"):
        short.save(tmp_path / "crank.avi")


def test_repr_html_embeds_a_video(short):
    _needs_ffmpeg()
    html = short._repr_html_()
    assert html.startswith("<video") and "data:video/mp4;base64," in html


def test_repr_html_without_ffmpeg_is_the_javascript_player(short, monkeypatch):
    def missing():
        raise ImportError("no ffmpeg")

    monkeypatch.setattr(_animate, "_ffmpeg", missing)
    assert "<script" in short._repr_html_()
    short.frame(3)  # still draws the frame asked for afterwards
    assert short.artists["time"].get_text() == f"t = {short.times[3]:.3f} s"


def test_handwritten_system_through_draw():
    pendulum = CartesianPendulum()
    ts = np.linspace(0.0, 1.0, 8)
    q = np.stack([np.asarray(pendulum.state_from_angle(0.6 * np.cos(3 * t), 0.0)[0]) for t in ts])

    def draw(q):
        return {"rod": [(0.0, 0.0), (q[0], q[1])], "bob": q}

    anim = animate(pendulum, SimpleNamespace(ts=ts, q=q), draw=draw, trace="bob", frames=ts)
    anim.frame(4)
    np.testing.assert_allclose(anim.artists["draw:rod"].get_xydata(), [(0, 0), q[4]])
    assert len(anim.artists["trace:bob"].get_xydata()) == 5
    assert covers(anim, q) and not body_artists(anim)
    with pytest.raises(ValueError, match="not a polyline of `draw`"):
        animate(pendulum, SimpleNamespace(ts=ts, q=q), draw=draw, trace="tip")
    with pytest.raises(ValueError, match=r"\(k, 2\)"):
        animate(pendulum, SimpleNamespace(ts=ts, q=q), draw=lambda q: {"rod": np.zeros(3)})


def test_batch_member():
    one = double_pendulum_motion()
    other = SimpleNamespace(ts=one.ts, q=one.q + np.array([0.0, 0.1, 0.0] * 2))
    batch = SimpleNamespace(ts=np.stack([one.ts, other.ts]), q=np.stack([one.q, other.q]))
    model = double_pendulum()
    with pytest.raises(ValueError, match="member="):
        animate(model, batch)
    anim = animate(model, batch, member=1, frames=one.ts)
    anim.frame(3)
    np.testing.assert_allclose(
        anim.artists["body:upper"].get_xydata().mean(0), other.q[3, :2], atol=1e-12
    )


def test_failed_rows_are_left_out():
    motion = double_pendulum_motion()
    q = motion.q.copy()
    q[-3:] = np.inf
    anim = animate(double_pendulum(), SimpleNamespace(ts=motion.ts, q=q), frames=motion.ts[:-3])
    assert len(anim) == len(motion.ts) - 3


def test_errors_name_the_fix(slider_crank):
    model, sol = slider_crank
    spatial = mb.Mechanism([mb.RigidBody("box", 1.0, (0.1, 0.1, 0.1))])
    with pytest.raises(ValueError, match=r"jaxdae\.viz\.view"):
        animate(spatial, SimpleNamespace(ts=np.zeros(1), q=np.zeros((1, 7))))
    with pytest.raises(ValueError, match="draw="):
        animate(CartesianPendulum(), sol)
    with pytest.raises(ValueError, match="no marker 'tip'"):
        animate(model, sol, trace="crank.tip")
    with pytest.raises(ValueError, match="not a batch|not one"):
        animate(model, sol, member=0)


def test_without_matplotlib(slider_crank, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install jaxdae\[viz\]"):
        animate(*slider_crank)


def test_import_does_not_load_matplotlib():
    code = (
        "import sys, jaxdae, jaxdae.viz._animate; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_planar_joint_and_stop_draws():
    """Rolling, point-on-line, distance, fixed and prismatic joints (gears are not drawn),
    limits on a line joint and on a pin, and a distance stop's spheres."""
    model = mb.Mechanism(
        [
            mb.PlanarBody("beam", 1.0, 0.1, markers={"r": (0.5, 0.0), "track": (-0.5, 0.1)}),
            mb.PlanarBody("ball", 0.1, 1e-3, position=(0.0, 0.1)),
            mb.PlanarBody("bead", 0.1, 1e-3, position=(0.2, 0.0)),
            mb.PlanarBody("tag", 0.1, 1e-3, markers={"p": (0.05, 0.0)}, position=(0.5, -0.3)),
            mb.PlanarBody("weld", 0.1, 1e-3, markers={"p": (0.0, 0.05)}, position=(-0.5, -0.1)),
        ],
        [
            mb.Revolute("ground", "beam", name="pivot"),
            mb.Rolling("beam.track", "ball", radius=0.1, name="roll"),
            mb.PointOnLine("beam", "bead", name="bead"),
            mb.Distance("beam.r", "tag.p", 0.3),
            mb.Fixed("beam", "weld.p", name="weld"),
            mb.Gear("beam", "ball", 2.0, name="gear"),
            mb.Prismatic("beam", "tag", axis=(0.0, 1.0), name="slot"),
        ],
        stops=[
            mb.JointLimit("roll", -0.2, 0.8),
            mb.JointLimit("pivot", -0.3, 0.3),
            mb.DistanceStop("ball", "tag", lower=0.1),
        ],
    )
    q = np.asarray(model.reference_coordinates())
    anim = animate(
        model, SimpleNamespace(ts=np.array([0.0, 1.0]), q=np.stack([q, q + 0.05])), frames=3
    )
    anim.frame(1)
    assert len(body_artists(anim)) == 5
    assert {f"joint:{name}" for name in ("pivot", "roll", "bead", "distance_0", "weld", "slot")} | {
        "joint:roll.line",
        "joint:slot.line",
    } <= set(anim.artists)
    assert "joint:gear" not in anim.artists
    assert {"stop:jointlimit_0", "stop:jointlimit_1", "stop:distancestop_0"} <= set(anim.artists)


def test_save_mp4_warns_of_no_fork(short, tmp_path):
    """Starting ffmpeg forks this process, whose JAX threads are running (the fixture's
    solve started them): JAX's warning that a fork "will likely lead to a deadlock" does not
    reach the user, as the child only execs ffmpeg."""
    _needs_ffmpeg()
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short.save(tmp_path / "crank.mp4")
    forks = [str(w.message) for w in caught if "fork" in str(w.message)]
    assert not forks, forks
