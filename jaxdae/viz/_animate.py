"""Animations of planar mechanisms, and of any system drawn by a function: MP4, GIF and
inline HTML.

matplotlib (and imageio-ffmpeg for MP4) are imported when an animation is made, never by
`import jaxdae`: they are the optional `viz` extra.
"""

import base64
import io
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike, Float
from ..multibody import (
    Distance,
    DistanceStop,
    Driver,
    Fixed,
    Gear,
    JointLimit,
    Kinematics,
    Mechanism,
    PlaneContact,
    PointOnLine,
    Prismatic,
    Revolute,
    Rolling,
)
from ._frames import frame_states

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_INSTALL = "pip install jaxdae[viz]"
GROUND = "ground"
# Sizes of the symbols, as fractions of the scene's extent (the larger side of the box
# the bodies sweep).
_BLOCK = (0.12, 0.07)  # a prismatic joint's slider block: length along the line, height
_SUPPORT = (0.035, 0.05, 0.025)  # a ground pin's triangle: half-width, height; hatch band
_TICK = 0.06  # a prismatic joint limit's tick
_CIRCLE = 48  # points on a drawn circle


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            f"jaxdae.viz.animate needs matplotlib: {_INSTALL}.") from error
    return matplotlib, Figure, FigureCanvasAgg


def _ffmpeg():
    """imageio-ffmpeg and its ffmpeg executable."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as error:
        raise ImportError(
            f"Writing MP4 needs imageio-ffmpeg (it ships an ffmpeg binary): {_INSTALL}; "
            "or save a .gif.") from error
    return imageio_ffmpeg


# -- the solution: one member, finite rows, resampled ------------------------------------


# -- geometry ------------------------------------------------------------------------------


def _split(ref: str) -> tuple[str, str | None]:
    body, _, marker = ref.partition(".")
    return body, marker or None


def _check_marker(model: Mechanism, ref) -> str:
    if not isinstance(ref, str):
        raise ValueError(f"`trace` names markers as 'body.marker' or 'body'; got {ref!r}.")
    body, marker = _split(ref)
    names = (GROUND, *model.body_names)
    if body not in names:
        raise ValueError(f"`trace` names {ref!r}, but the mechanism has no body {body!r} "
                         f"(bodies: {', '.join(names)}).")
    markers = model.body(body).markers
    if marker is not None and marker not in markers:
        raise ValueError(f"`trace` names {ref!r}, but body {body!r} has no marker {marker!r} "
                         f"(its markers: {sorted(markers) or 'none'}).")
    return ref


def _unit(u):
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def _perpendicular(u):
    return np.stack([-u[..., 1], u[..., 0]], axis=-1)


def _direction(angle, axis):
    """The unit vector `R(angle) axis / |axis|`, for angles of any shape."""
    axis = _unit(np.asarray(axis, dtype=float))
    c, s = np.cos(angle)[..., None], np.sin(angle)[..., None]
    return c * axis + s * _perpendicular(axis)


def _circle(centre, radius):
    """Closed polylines of circles about `centre (..., 2)`: `(..., _CIRCLE + 1, 2)`."""
    phi = np.linspace(0.0, 2 * np.pi, _CIRCLE + 1)
    ring = np.stack([np.cos(phi), np.sin(phi)], axis=-1)
    return centre[..., None, :] + radius * ring


def _outline(points, scale):
    """Indices of `points` (a body's centre and markers, body coordinates) to draw it by:
    one point, the two ends of a bar (collinear points), or the convex hull in order."""
    tol = 1e-9 * max(scale, 1e-12)
    keep: list[int] = []
    for i, p in enumerate(points):
        if all(np.linalg.norm(p - points[j]) > tol for j in keep):
            keep.append(i)
    if len(keep) == 1:
        return keep
    order = sorted(keep, key=lambda i: (points[i][0], points[i][1]))

    def cross(o, a, b):
        oa, ob = points[a] - points[o], points[b] - points[o]
        return oa[0] * ob[1] - oa[1] * ob[0]

    def chain(indices):
        out: list[int] = []
        for i in indices:
            while len(out) >= 2 and cross(out[-2], out[-1], i) <= tol * scale:
                out.pop()
            out.append(i)
        return out

    hull = chain(order)[:-1] + chain(order[::-1])[:-1]
    if len(hull) < 3:  # collinear: a bar between the two points farthest apart
        pairs = [(np.linalg.norm(points[a] - points[b]), a, b) for a in keep for b in keep]
        _, a, b = max(pairs)
        return [a, b]
    return hull


class _Shape:
    """One thing to draw: its points and how they change.

    `xy` is a fixed `(p, 2)` array (`static`: drawn once, into the background), an
    `(F, p, 2)` array or a list of `F` arrays `(p_k, 2)` (frame `k` shows `xy[k]`), or for
    a trace (`kind="trace"`) `(F, 2)`, of which frame `k` shows the first `k + 1` rows.
    `kind` is `"line"` (a `Line2D`), `"polygon"` (a `Polygon` patch) or `"trace"`;
    `bounded=False` leaves it out of the default view (an infinite contact line)."""

    def __init__(self, name: str, xy, kind: str, bounded: bool, style: dict):
        self.name, self.xy, self.kind, self.bounded, self.style = name, xy, kind, bounded, style
        self.static = kind != "trace" and not isinstance(xy, list) and np.ndim(xy) == 2
        self.artist: Artist | None = None

    def first(self) -> np.ndarray:
        return np.asarray(self.xy if self.static else self.xy[:1] if self.kind == "trace"
                          else self.xy[0])

    def points(self) -> np.ndarray:
        if isinstance(self.xy, list):
            return np.concatenate([np.reshape(a, (-1, 2)) for a in self.xy])
        return np.reshape(self.xy, (-1, 2))

    def create(self, axes: "Axes") -> None:
        from matplotlib.patches import Polygon

        first = self.first()
        if self.kind == "polygon":
            self.artist = axes.add_patch(Polygon(first, closed=True, **self.style))
        else:
            (self.artist,) = axes.plot(first[:, 0], first[:, 1], **self.style)

    def show(self, k: int) -> None:
        if self.static:
            return
        xy = self.xy[: k + 1] if self.kind == "trace" else self.xy[k]
        if self.kind == "polygon":
            self.artist.set_xy(xy)
        else:
            self.artist.set_data(xy[:, 0], xy[:, 1])


class _Scene:
    """The shapes of an animation before they are drawn, and extra points the default
    view must hold."""

    def __init__(self):
        self.shapes: list[_Shape] = []
        self.extra: list[np.ndarray] = []

    def add(self, name, xy, kind="line", *, bounded=True, **style):
        self.shapes.append(_Shape(name, xy, kind, bounded, style))

    def extent(self) -> np.ndarray:
        points = [s.points() for s in self.shapes if s.bounded] + self.extra
        points = np.concatenate(points) if points else np.zeros((1, 2))
        points = points[np.all(np.isfinite(points), axis=1)]
        return points if points.size else np.zeros((1, 2))


def _mechanism_scene(model: Mechanism, q: np.ndarray, trace: Sequence[str]) -> _Scene:
    """Bodies, joints, the ground, stops and traces of a planar mechanism at the
    configurations `q (F, n)`."""
    bodies = model.bodies
    local: dict[str, np.ndarray] = {GROUND: np.zeros(2)}  # marker -> its point on its body
    for name, point in model.ground.markers.items():
        local[f"{GROUND}.{name}"] = np.asarray(point, dtype=float)
    outlines = []
    for body in bodies:
        refs = [body.name] + [f"{body.name}.{m}" for m in body.markers]
        local[body.name] = np.zeros(2)
        for m, point in body.markers.items():
            local[f"{body.name}.{m}"] = np.asarray(point, dtype=float)
        outlines.append(refs)
    refs = list(dict.fromkeys(
        [r for body_refs in outlines for r in body_refs]
        + [r for j in model.joints for r in (j.a, j.b)]
        + [r for s in model.stops for r in s.markers]
        + list(trace) + [GROUND]))
    where = {r: i for i, r in enumerate(refs)}

    @jax.jit
    def marker_frames(q_):
        frame = jax.vmap(lambda row: Kinematics(model, 0.0, row).frames(refs))(q_)
        return frame.point, frame.angle

    points, angles = (np.asarray(a) for a in marker_frames(jnp.asarray(q)))

    def P(ref):
        return points[:, where[ref]]

    def TH(ref):
        return angles[:, where[ref]]

    def moving(ref):
        return _split(ref)[0] != GROUND

    body_points = points[:, [where[r] for refs_ in outlines for r in refs_]].reshape(-1, 2)
    span = np.ptp(body_points, axis=0) if body_points.size else np.zeros(2)
    scale = float(max(span.max(), 1e-3 * np.abs(body_points).max(initial=0.0))) or 1.0
    scene = _Scene()
    colour = {b.name: f"C{i % 10}" for i, b in enumerate(bodies)}

    # Bodies: a polygon through the centre and the markers, a bar, or a point.
    hulls = {}
    for body, refs_ in zip(bodies, outlines, strict=True):
        indices = _outline(np.stack([local[r] for r in refs_]), scale)
        hull = [refs_[i] for i in indices]
        hulls[body.name] = hull
        xy = np.stack([P(r) for r in hull], axis=1)
        c = colour[body.name]
        if len(hull) >= 3:
            scene.add(f"body:{body.name}", xy, "polygon", facecolor=c, edgecolor=c, alpha=0.45,
                      linewidth=2, zorder=2)
        elif len(hull) == 2:
            scene.add(f"body:{body.name}", xy, color=c, linewidth=6, alpha=0.85,
                      solid_capstyle="round", zorder=2)
        else:
            scene.add(f"body:{body.name}", xy, color=c, marker="s", markersize=9, zorder=2)

    def support(name, at):
        """A hatched triangle under a pin to the ground at the fixed point `at`."""
        w, h, band = (f * scale for f in _SUPPORT)
        x, y = at
        scene.add(f"ground:{name}", np.array([[x, y], [x - w, y - h], [x + w, y - h]]),
                  "polygon", facecolor="0.85", edgecolor="0.2", linewidth=1, zorder=1)
        scene.add(f"ground:{name}.hatch", np.array(
            [[x - 1.5 * w, y - h], [x + 1.5 * w, y - h], [x + 1.5 * w, y - h - band],
             [x - 1.5 * w, y - h - band]]), "polygon", fill=False, hatch="////",
            edgecolor="0.4", linewidth=0, zorder=1)

    def band_below(name, start, end, normal):
        """A hatched band on the `-normal` side of the fixed segment `start`–`end`."""
        depth = _SUPPORT[2] * scale
        scene.add(name, np.array([start, end, end - depth * normal, start - depth * normal]),
                  "polygon", fill=False, hatch="////", edgecolor="0.4", linewidth=0, zorder=1)

    pin = dict(marker="o", markersize=7, markerfacecolor="white", markeredgecolor="black",
               markeredgewidth=1.5, linestyle="none", zorder=4)
    lines = {}  # the line joints' directions and marker a's points, each (F, 2)

    for name, joint in zip(model.joint_names, model.joints, strict=True):
        a, b = joint.a, joint.b
        grounded = not moving(a) or not moving(b)
        if isinstance(joint, Revolute):
            fixed = a if not moving(a) else b
            if grounded:
                support(name, P(fixed)[0])
                scene.add(f"joint:{name}", P(fixed)[:1], **pin)
            else:
                scene.add(f"joint:{name}", P(b)[:, None], **pin)
        elif isinstance(joint, Prismatic | PointOnLine | Rolling):
            axis = np.array([1.0, 0.0]) if joint.axis is None else np.asarray(joint.axis)
            u = _direction(TH(a), axis)
            n = _perpendicular(u)
            s = np.sum(u * (P(b) - P(a)), axis=-1)
            half = (0.5 * _BLOCK[0] * scale if isinstance(joint, Prismatic) else
                    float(joint.radius) if isinstance(joint, Rolling) else 0.02 * scale)
            lo, hi = s.min() - half - 0.05 * scale, s.max() + half + 0.05 * scale
            guide = np.stack([P(a) + lo * u, P(a) + hi * u], axis=1)
            lines[name] = (u, P(a))
            if moving(a):
                scene.add(f"joint:{name}.line", guide, color="0.3", linewidth=1.5, zorder=1)
            else:
                scene.add(f"joint:{name}.line", guide[0], color="0.3", linewidth=1.5, zorder=1)
                band_below(f"ground:{name}", guide[0, 0], guide[0, 1], n[0])
            if isinstance(joint, Prismatic):
                w, h = 0.5 * _BLOCK[0] * scale, 0.5 * _BLOCK[1] * scale
                centre = P(b)[:, None]
                corners = (centre + np.array([-w, w, w, -w])[:, None] * u[:, None]
                           + np.array([-h, -h, h, h])[:, None] * n[:, None])
                scene.add(f"joint:{name}", corners, "polygon",
                          facecolor=colour.get(_split(b)[0], "0.7"), alpha=0.6,
                          edgecolor="black", linewidth=1.5, zorder=3)
            elif isinstance(joint, Rolling):
                spoke = P(b) + float(joint.radius) * _direction(TH(b), (1.0, 0.0))
                xy = np.concatenate([_circle(P(b), float(joint.radius)),
                                     P(b)[:, None], spoke[:, None]], axis=1)
                scene.add(f"joint:{name}", xy, color="black", linewidth=1.5, zorder=3)
            else:
                scene.add(f"joint:{name}", P(b)[:, None], **{**pin, "markersize": 5})
        elif isinstance(joint, Distance):
            scene.add(f"joint:{name}", np.stack([P(a), P(b)], axis=1), color="0.25",
                      linewidth=1.5, zorder=1)
        elif isinstance(joint, Fixed):
            scene.add(f"joint:{name}", P(b)[:, None], marker="s", markersize=5, color="black",
                      linestyle="none", zorder=4)
        elif not isinstance(joint, Gear | Driver):  # other joints: a dot at b
            scene.add(f"joint:{name}", P(b)[:, None], marker="o", markersize=4,
                      color="black", linestyle="none", zorder=4)

    stop_style = dict(color="tab:red", linewidth=1.2, linestyle="--", zorder=1)
    for name, stop in zip(model.stop_names, model.stops, strict=True):
        if isinstance(stop, JointLimit):
            joint = model.joint(stop.joint)
            bounds = [float(x) for x in (stop.lower, stop.upper) if x is not None]
            if stop.joint in lines:  # a tick across the line where marker b stops
                u, start = lines[stop.joint]
                n = _perpendicular(u)
                half = 0.5 * _TICK * scale
                marks = [np.stack([start + x * u - half * n, start + x * u + half * n], axis=1)
                         for x in bounds]
                fixed = not moving(joint.a)
            elif isinstance(joint, Revolute):  # rays where the moving side's arm stops
                # The coordinate is `θ_b − θ_a`: body b stops at `θ_a + bound`, or body a at
                # `θ_b − bound` where b is the ground.
                side, other, sign = ((joint.b, joint.a, 1.0) if moving(joint.b)
                                     else (joint.a, joint.b, -1.0))
                arms = [local[r] - local[side] for r in hulls[_split(side)[0]]]
                arm = max(arms, key=lambda x: float(np.linalg.norm(x)))
                length = float(np.linalg.norm(arm)) or 0.1 * scale
                phi = float(np.arctan2(arm[1], arm[0]))
                fixed = not (moving(joint.a) and moving(joint.b))
                centre = P(joint.a if not moving(joint.a) else joint.b)
                marks = [np.stack([centre, centre + length * _direction(
                    TH(other) + sign * x + phi, (1.0, 0.0))], axis=1) for x in bounds]
            else:
                continue
            gap = np.full((len(q), 1, 2), np.nan)
            xy = np.concatenate([part for mark in marks for part in (mark, gap)], axis=1)
            scene.add(f"stop:{name}", xy[0] if fixed else xy, **stop_style)
        elif isinstance(stop, PlaneContact):
            normal = (0.0, 1.0) if stop.normal is None else np.asarray(stop.normal)
            n = _direction(TH(stop.surface), normal)
            t = _perpendicular(n)
            at = P(stop.surface)
            # The line is infinite: the view holds where the point would touch it.
            foot = at + np.sum((P(stop.point) - at) * t, axis=-1, keepdims=True) * t
            scene.extra.append(foot)
            reach = 50.0 * scale
            line = np.stack([at - reach * t, at + reach * t], axis=1)
            style = dict(color="0.2", linewidth=1.5, zorder=1)
            if moving(stop.surface):
                scene.add(f"stop:{name}", line, bounded=False, **style)
            else:
                scene.add(f"stop:{name}", line[0], bounded=False, **style)
                depth = _SUPPORT[2] * scale * n[0]
                scene.add(f"ground:{name}", np.array([line[0, 0], line[0, 1],
                                                      line[0, 1] - depth, line[0, 0] - depth]),
                          "polygon", bounded=False, fill=False, hatch="////", edgecolor="0.4",
                          linewidth=0, zorder=1)
            radius = float(stop.radius)
            if radius > 0:
                scene.add(f"stop:{name}.disc", _circle(P(stop.point), radius),
                          color=colour.get(_split(stop.point)[0], "0.3"), linewidth=1.5,
                          zorder=2)
        elif isinstance(stop, DistanceStop):
            gap = np.full((len(q), 1, 2), np.nan)
            parts = []
            if stop.lower is not None:  # two spheres that touch at d = lower
                r = 0.5 * float(stop.lower)
                parts += [_circle(P(stop.a), r), gap, _circle(P(stop.b), r), gap]
            if stop.upper is not None:  # a rope that goes taut at d = upper
                parts.append(np.stack([P(stop.a), P(stop.b)], axis=1))
            scene.add(f"stop:{name}", np.concatenate(parts, axis=1),
                      **{**stop_style, "linestyle": ":"})

    for ref in trace:  # in the colour of the marker's body
        scene.add(f"trace:{ref}", P(ref), "trace", color=colour.get(_split(ref)[0], "0.3"),
                  linewidth=1.2, alpha=0.7, zorder=1.5)
    return scene


def _drawn(draw, q: np.ndarray):
    """`draw(q_k)` at every frame: `{name: [(p, 2) per frame]}`."""
    out: dict[str, list[np.ndarray]] = {}
    names = None
    for k, row in enumerate(q):
        lines = draw(row)
        if not isinstance(lines, Mapping):
            raise ValueError(
                "`draw(q)` must return a dict from names to polylines, `(k, 2)` arrays of "
                f"points; got {type(lines).__name__}.")
        if names is None:
            names = tuple(lines)
        elif tuple(lines) != names:
            raise ValueError(
                f"`draw(q)` returned the polylines {list(lines)} at frame {k} but {list(names)} "
                "at frame 0: return the same names at every configuration.")
        for name, xy in lines.items():
            xy = np.asarray(xy, dtype=float)
            if xy.ndim not in (1, 2) or xy.shape[-1] != 2:
                raise ValueError(
                    f"`draw(q)` polyline {name!r} must be a (k, 2) array of points (or one "
                    f"point (2,)); got shape {xy.shape}.")
            out.setdefault(str(name), []).append(xy.reshape(-1, 2))
    return out


# -- the animation --------------------------------------------------------------------------


class Animation:
    """An animation made by [`jaxdae.viz.animate`][]: save it, show it in a notebook, or
    draw one frame.

    In Jupyter, an `Animation` as the value of a cell plays inline (an HTML5 video with
    the MP4 embedded, or matplotlib's JavaScript player where ffmpeg is missing).

    **Attributes:**

    - `figure`: the matplotlib `Figure` it draws on (not managed by `pyplot`).
    - `axes`: its `Axes`.
    - `times`: the time of each frame, `(frames,)`; `len(animation)` is their number.
    - `fps`: frames per second of the video.
    - `artists`: the matplotlib artists by name, to restyle them: `"body:<body>"`,
        `"joint:<joint>"` (and `"joint:<joint>.line"` for the line of a prismatic,
        point-on-line or rolling joint),
        `"ground:<...>"`, `"stop:<stop>"`, `"trace:<marker>"`, `"draw:<name>"` for the
        polylines of `draw`, and `"time"`.
    """

    def __init__(self, figure: "Figure", axes: "Axes", times: np.ndarray,
                 shapes: list[_Shape], time_text, fps: float):
        self.figure, self.axes, self.times, self.fps = figure, axes, times, float(fps)
        self._shapes = shapes
        self._time = time_text
        self._moving = sorted([s.artist for s in shapes if not s.static] + [time_text],
                              key=lambda a: a.get_zorder())
        self.artists: dict[str, Artist] = {s.name: s.artist for s in shapes}
        self.artists["time"] = time_text

    def __len__(self) -> int:
        return len(self.times)

    def _show(self, k: int) -> None:
        for shape in self._shapes:
            shape.show(k)
        self._time.set_text(f"t = {self.times[k]:.3f} s")

    def frame(self, k: int) -> "Figure":
        """Draw frame `k` (negative counts from the end) and return the figure, e.g. to
        save a still with `anim.frame(-1).savefig("end.png")`."""
        if not -len(self) <= k < len(self):
            raise IndexError(f"Frame {k} is out of range: the animation has {len(self)}.")
        self._show(k % len(self))
        self.figure.canvas.draw()
        return self.figure

    def _rgba(self):
        """Every frame as an `(h, w, 4)` uint8 array (the same buffer, redrawn): the
        background (axes, ticks, the ground) is drawn once, then only the moving artists
        over it (blitting), which is what keeps long animations quick."""
        canvas = self.figure.canvas
        for artist in self._moving:
            artist.set_animated(True)
        try:
            canvas.draw()
            background = canvas.copy_from_bbox(self.figure.bbox)
            for k in range(len(self)):
                self._show(k)
                canvas.restore_region(background)
                for artist in self._moving:
                    self.axes.draw_artist(artist)
                yield np.asarray(canvas.buffer_rgba())
        finally:
            for artist in self._moving:
                artist.set_animated(False)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the animation to `path`: an MP4 (H.264, by the ffmpeg that imageio-ffmpeg
        ships), a GIF (pillow) or an HTML page (matplotlib's JavaScript player), by the
        suffix.

        **Returns:**

        The path.

        **Raises:**

        `ValueError` for another suffix; `ImportError` for MP4 without imageio-ffmpeg.
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".mp4":
            self._write_mp4(path)
        elif suffix == ".gif":
            self._write_gif(path)
        elif suffix in (".html", ".htm"):
            path.write_text(self._jshtml())
        else:
            raise ValueError(f"Cannot save an animation as {path.name!r}: use a .mp4, .gif or "
                             ".html file.")
        return path

    def _write_mp4(self, path: Path) -> None:
        imageio_ffmpeg = _ffmpeg()
        writer = None
        try:
            for rgba in self._rgba():
                # H.264 in yuv420p needs even sides: drop a last odd row or column.
                h, w = rgba.shape[0] // 2 * 2, rgba.shape[1] // 2 * 2
                if writer is None:
                    writer = imageio_ffmpeg.write_frames(
                        str(path), (w, h), pix_fmt_in="rgba", fps=self.fps, codec="libx264",
                        quality=6, macro_block_size=1, ffmpeg_log_level="error",
                        output_params=["-preset", "fast"])
                    with warnings.catch_warnings():
                        # JAX warns of any fork; this child runs ffmpeg at once (exec).
                        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                        writer.send(None)
                writer.send(np.ascontiguousarray(rgba[:h, :w]))
        finally:
            if writer is not None:
                writer.close()

    def _write_gif(self, path: Path) -> None:
        from PIL import Image

        images, palette = [], None
        for rgba in self._rgba():
            image = Image.fromarray(rgba[..., :3])
            if palette is None:  # one palette for all frames, from the first
                palette = image.quantize(colors=255, method=Image.Quantize.MEDIANCUT)
            images.append(image.quantize(palette=palette, dither=Image.Dither.NONE))
        images[0].save(path, save_all=True, append_images=images[1:], loop=0,
                       duration=1000.0 / self.fps, optimize=False)

    def _jshtml(self) -> str:
        from matplotlib.animation import HTMLWriter

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "animation.html"
            writer = HTMLWriter(fps=self.fps, embed_frames=True, default_mode="loop")
            with writer.saving(self.figure, str(path), dpi=self.figure.dpi):
                for k in range(len(self)):
                    self._show(k)
                    writer.grab_frame()
            return path.read_text()

    def to_html(self) -> str:
        """The animation as HTML: an HTML5 `<video>` with the MP4 embedded (base64), or
        matplotlib's JavaScript player where ffmpeg is not installed."""
        try:
            _ffmpeg()
        except ImportError:
            return self._jshtml()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "animation.mp4"
            self._write_mp4(path)
            data = base64.b64encode(path.read_bytes()).decode("ascii")
        width = int(self.figure.get_figwidth() * self.figure.dpi)
        return (f'<video width="{width}" controls autoplay loop muted playsinline>'
                f'<source type="video/mp4" src="data:video/mp4;base64,{data}"></video>')

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.frame(0).savefig(buffer, format="png")
        return buffer.getvalue()


def animate(
    model,
    solution,
    *,
    trace: str | Sequence[str] | None = None,
    fps: float = 30.0,
    frames: int | Float[ArrayLike, " frames"] | None = None,
    draw: Callable[[np.ndarray], Mapping[str, Float[ArrayLike, "k 2"]]] | None = None,
    member: int | tuple[int, ...] | None = None,
    limits: tuple[tuple[float, float], tuple[float, float]] | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: float = 100.0,
    title: str | None = None,
) -> Animation:
    """An animation of a planar mechanism, or of any system drawn by `draw`, along a
    solution.

    A [`jaxdae.multibody.Mechanism`][] is drawn from its parts: each body as a polygon
    through its centre of mass and its markers (a bar where they lie on a line, a square
    where it has none), revolute joints as pins (on a hatched support where they hold a
    body to the ground), prismatic joints as a slider block on their line (hatched when it
    is the ground's), rolling joints as a disc with a spoke, distance joints as a thin
    link; the stops as a line for a [`jaxdae.multibody.PlaneContact`][] (and its disc),
    rays or ticks where a [`jaxdae.multibody.JointLimit`][] stops the joint, and the
    spheres (`lower`) or the rope (`upper`) of a [`jaxdae.multibody.DistanceStop`][]. The
    time is written in a corner. `Gear` and `Driver` joints are not drawn.

    Any other system (one written by hand, e.g. [`jaxdae.examples.CartesianPendulum`][])
    is drawn by `draw`:

    ```python
    def draw(q):  # q: one configuration, a NumPy array (n,)
        return {"rod": [(0.0, 0.0), (q[0], q[1])]}  # name -> (k, 2) points, a polyline

    jaxdae.viz.animate(pendulum, sol, draw=draw, trace="rod").save("pendulum.mp4")
    ```

    **Arguments:**

    - `model`: a planar [`jaxdae.multibody.Mechanism`][], or any system with `draw`.
    - `solution`: a [`jaxdae.Solution`][] (or anything with `ts (N,)` and `q (N, n)`).
        Rows after a failed solve (`inf`) are left out.
    - `trace`: markers whose paths are drawn as they go (`"body.marker"`, `"body"` for a
        centre of mass, or a list); with `draw`, names of its polylines, whose last point
        is traced.
    - `fps`: frames per second of the video.
    - `frames`: the number of frames, at equally spaced times from the first saved time
        to the last; or the frames' times, e.g. `sol.ts` for the saved states as they are
        (`q` is interpolated linearly between saved states). Default: `fps` frames per
        simulated second, so that the motion plays in real time. The video lasts
        `frames / fps` seconds.
    - `draw`: `draw(q) -> {name: points}`, called with each frame's configuration (a
        NumPy array `(n,)`), returning the same names every time, each with a polyline
        of `(k, 2)` points (`k` may vary; one point `(2,)` is drawn as a dot). With a
        mechanism, its polylines are drawn over the mechanism.
    - `member`: for a batch of solutions (`ts` and `q` with leading batch axes, as from
        `jax.vmap` or [`jaxdae.simulate_ensemble`][]), the index of the member to animate: an
        integer, or a tuple with one index per batch axis. Required for a batch.
    - `limits`: `((xmin, xmax), (ymin, ymax))` of the view; default the box that
        everything drawn covers at all frames, with a margin.
    - `figsize`, `dpi`: the figure's size in inches (default from the view's aspect ratio)
        and resolution; the video's size in pixels is their product.
    - `title`: a title over the axes.

    **Returns:**

    An [`jaxdae.viz.Animation`][]: `save("motion.mp4")` (or `.gif`), `frame(k)`, and inline
    playback in Jupyter.

    **Raises:**

    `ImportError` naming `pip install jaxdae[viz]` without matplotlib. `ValueError` for a
    spatial mechanism (use the 3-D viewer, [`jaxdae.viz.view`][]), a model that is not a
    mechanism without `draw`, a batch without `member`, an unknown trace marker, or a
    `draw` that does not return a dict of `(k, 2)` polylines.
    """
    if isinstance(model, Mechanism):
        if model.dimension != 2:
            raise ValueError(
                "jaxdae.viz.animate draws planar mechanisms; this one is spatial. Show it "
                "with the 3-D viewer, `jaxdae.viz.view(model, solution)`.")
    elif draw is None:
        raise ValueError(
            f"jaxdae.viz.animate draws a jaxdae.multibody.Mechanism by itself; for a "
            f"{type(model).__name__}, pass `draw=`, a function of one configuration `q` "
            "returning polylines by name, e.g. `draw=lambda q: {'rod': [(0, 0), (q[0], "
            "q[1])]}`.")
    if not fps > 0:
        raise ValueError(f"`fps` must be positive; got {fps!r}.")
    traces = [] if trace is None else [trace] if isinstance(trace, str) else list(trace)
    _, Figure, FigureCanvasAgg = _matplotlib()

    times, q = frame_states(solution, member, frames, fps)
    drawn = {} if draw is None else _drawn(draw, q)
    if isinstance(model, Mechanism):
        scene = _mechanism_scene(model, q, [_check_marker(model, r) for r in traces])
    else:
        scene = _Scene()
        for ref in traces:
            if ref not in drawn:
                raise ValueError(f"`trace` names {ref!r}, which is not a polyline of `draw` "
                                 f"(it returns {sorted(drawn)}).")
            scene.add(f"trace:{ref}", np.stack([xy[-1] for xy in drawn[ref]]), "trace",
                      color="0.5", linewidth=1.2, alpha=0.8, zorder=1.5)
    for k, (name, xy) in enumerate(drawn.items()):
        stacked = np.stack(xy) if len({a.shape for a in xy}) == 1 else xy
        single = all(a.shape[0] == 1 for a in xy)
        scene.add(f"draw:{name}", stacked, color=f"C{k % 10}", zorder=3,
                  **(dict(marker="o", linestyle="none") if single else
                     dict(marker="o", markersize=4, linewidth=2)))

    if limits is None:
        points = scene.extent()
        low, high = points.min(axis=0), points.max(axis=0)
        size = max(float(np.max(high - low)), 1e-6 * float(np.abs(points).max()), 1e-9)
        low, high = low - 0.08 * size, high + 0.08 * size
        limits = ((low[0], high[0]), (low[1], high[1]))
    (x0, x1), (y0, y1) = ((float(a), float(b)) for a, b in limits)
    if not (x1 > x0 and y1 > y0):
        raise ValueError(f"`limits` must be ((xmin, xmax), (ymin, ymax)); got {limits!r}.")
    # Fixed margins (inches) rather than a layout engine: the axes' box is known, and the
    # limits are widened to its aspect ratio so that x and y share one scale.
    left, right, bottom, top = 0.75, 0.2, 0.55, 0.2 + (0.3 if title is not None else 0.0)
    if figsize is None:
        width = 6.4 - left - right
        height = float(np.clip(width * (y1 - y0) / (x1 - x0), 1.8, 6.6))
        figsize = (6.4, height + bottom + top)
    box_w, box_h = figsize[0] - left - right, figsize[1] - bottom - top
    if not (box_w > 0 and box_h > 0):
        raise ValueError(f"`figsize={figsize!r}` leaves no room for the axes.")
    scale = max((x1 - x0) / box_w, (y1 - y0) / box_h)  # data units per inch
    cx, cy, hw, hh = (x0 + x1) / 2, (y0 + y1) / 2, scale * box_w / 2, scale * box_h / 2
    figure = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((left / figsize[0], bottom / figsize[1], box_w / figsize[0],
                            box_h / figsize[1]))
    axes.set_xlim(cx - hw, cx + hw)
    axes.set_ylim(cy - hh, cy + hh)
    axes.set_aspect("equal", adjustable="box")
    if title is not None:
        axes.set_title(title)
    if isinstance(model, Mechanism):
        axes.set(xlabel="x [m]", ylabel="y [m]")
    for shape in scene.shapes:
        shape.create(axes)
    time_text = axes.text(0.02, 0.96, "", transform=axes.transAxes, va="top",
                          family="monospace", zorder=5)
    animation = Animation(figure, axes, times, scene.shapes, time_text, fps)
    animation._show(0)
    return animation
