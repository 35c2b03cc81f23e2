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

import numpy as np

from .._custom_types import ArrayLike, Float
from ..multibody import Mechanism
from ._frames import check_fps, frame_states
from ._planar_scene import Scene, Shape, check_marker, mechanism_scene

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_INSTALL = "pip install jaxdae[viz]"


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(f"jaxdae.viz.animate needs matplotlib: {_INSTALL}.") from error
    return matplotlib, Figure, FigureCanvasAgg


def _ffmpeg():
    """imageio-ffmpeg and its ffmpeg executable."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as error:
        raise ImportError(
            f"Writing MP4 needs imageio-ffmpeg (it ships an ffmpeg binary): {_INSTALL}; "
            "or save a .gif."
        ) from error
    return imageio_ffmpeg


def _drawn(draw, q: np.ndarray):
    """`draw(q_k)` at every frame: `{name: [(p, 2) per frame]}`."""
    out: dict[str, list[np.ndarray]] = {}
    names = None
    for k, row in enumerate(q):
        lines = draw(row)
        if not isinstance(lines, Mapping):
            raise ValueError(
                "`draw(q)` must return a dict from names to polylines, `(k, 2)` arrays of "
                f"points; got {type(lines).__name__}."
            )
        if names is None:
            names = tuple(lines)
        elif tuple(lines) != names:
            raise ValueError(
                f"`draw(q)` returned the polylines {list(lines)} at frame {k} but {list(names)} "
                "at frame 0: return the same names at every configuration."
            )
        for name, xy in lines.items():
            xy = np.asarray(xy, dtype=float)
            if xy.ndim not in (1, 2) or xy.shape[-1] != 2:
                raise ValueError(
                    f"`draw(q)` polyline {name!r} must be a (k, 2) array of points (or one "
                    f"point (2,)); got shape {xy.shape}."
                )
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

    def __init__(
        self,
        figure: "Figure",
        axes: "Axes",
        times: np.ndarray,
        shapes: list[Shape],
        time_text,
        fps: float,
    ):
        self.figure, self.axes, self.times, self.fps = figure, axes, times, float(fps)
        self._shapes = shapes
        self._time = time_text
        self._moving = sorted(
            [s.artist for s in shapes if not s.static] + [time_text], key=lambda a: a.get_zorder()
        )
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

        `ValueError` for another suffix; `ImportError` for MP4 without imageio-ffmpeg;
        `FileNotFoundError` for an MP4 in a folder that does not exist, and `OSError` naming
        the path where ffmpeg cannot write it.
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
            raise ValueError(
                f"Cannot save an animation as {path.name!r}: use a .mp4, .gif or .html file."
            )
        return path

    def _write_mp4(self, path: Path) -> None:
        imageio_ffmpeg = _ffmpeg()
        folder = path.parent
        if not folder.is_dir():
            raise FileNotFoundError(
                f"Cannot save the animation to {str(path)!r}: its folder {str(folder)!r} does "
                "not exist. Create it first, or pass a `path` in an existing folder."
            )
        writer = None
        try:
            for rgba in self._rgba():
                # H.264 in yuv420p needs even sides: drop a last odd row or column.
                h, w = rgba.shape[0] // 2 * 2, rgba.shape[1] // 2 * 2
                if writer is None:
                    writer = imageio_ffmpeg.write_frames(
                        str(path),
                        (w, h),
                        pix_fmt_in="rgba",
                        fps=self.fps,
                        codec="libx264",
                        quality=6,
                        macro_block_size=1,
                        ffmpeg_log_level="error",
                        output_params=["-preset", "fast"],
                    )
                    with warnings.catch_warnings():
                        # Starting ffmpeg forks (imageio-ffmpeg passes a `preexec_fn` that
                        # puts it in its own process group, out of reach of a Ctrl-C meant
                        # for Python), and JAX warns of every fork of its threaded process;
                        # the child only sets its group and execs ffmpeg.
                        warnings.filterwarnings(
                            "ignore",
                            r"os\.fork\(\) was called\. os\.fork\(\) is incompatible "
                            r"with multithreaded code, and JAX is multithreaded",
                            RuntimeWarning,
                        )
                        writer.send(None)
                writer.send(np.ascontiguousarray(rgba[:h, :w]))
        except OSError as error:
            # ffmpeg exits where it cannot open its output, and the frames sent to it then
            # meet a closed pipe ("Broken pipe").
            raise OSError(
                f"ffmpeg could not write the animation to {str(path)!r} (it stopped taking "
                f"frames: {str(error).splitlines()[0]}): pass a `path` that can be written, "
                "in a folder you may write to."
            ) from error
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
        images[0].save(
            path,
            save_all=True,
            append_images=images[1:],
            loop=0,
            duration=1000.0 / self.fps,
            optimize=False,
        )

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
        return (
            f'<video width="{width}" controls autoplay loop muted playsinline>'
            f'<source type="video/mp4" src="data:video/mp4;base64,{data}"></video>'
        )

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
    mechanism without `draw`, a batch without `member` or a `member` that is not an index
    of it, an `fps` that is not finite and positive, a solution of another mechanism (its
    number of coordinates), a solution traced by `jax.jit`, an unknown trace marker, or a
    `draw` that does not return a dict of `(k, 2)` polylines.
    """
    _check_model(model, draw, fps)
    traces = [] if trace is None else [trace] if isinstance(trace, str) else list(trace)
    _matplotlib()  # before the frames are computed
    times, q = frame_states(solution, member, frames, fps)
    if isinstance(model, Mechanism) and q.shape[-1] != len(model.coordinate_names):
        raise ValueError(
            f"`solution.q` has {q.shape[-1]} coordinates and the mechanism "
            f"{len(model.coordinate_names)}: animate a solution of this mechanism "
            "(`jaxdae.simulate(model, ...)` with the same `model`)."
        )
    drawn = {} if draw is None else _drawn(draw, q)
    scene = _scene(model, q, traces, drawn)
    figure, axes = _figure(_view(scene) if limits is None else limits, figsize, dpi, title)
    if isinstance(model, Mechanism):
        axes.set(xlabel="x [m]", ylabel="y [m]")
    for shape in scene.shapes:
        shape.create(axes)
    time_text = axes.text(
        0.02, 0.96, "", transform=axes.transAxes, va="top", family="monospace", zorder=5
    )
    animation = Animation(figure, axes, times, scene.shapes, time_text, fps)
    animation._show(0)
    return animation


def _check_model(model, draw, fps) -> None:
    """Raise `ValueError` for what `animate` cannot draw: a spatial mechanism, a model that
    is not a mechanism without `draw`; and for an `fps` that is not positive."""
    if isinstance(model, Mechanism):
        if model.dimension != 2:
            raise ValueError(
                "jaxdae.viz.animate draws planar mechanisms; this one is spatial. Show it "
                "with the 3-D viewer, `jaxdae.viz.view(model, solution)`."
            )
    elif draw is None:
        raise ValueError(
            f"jaxdae.viz.animate draws a jaxdae.multibody.Mechanism by itself; for a "
            f"{type(model).__name__}, pass `draw=`, a function of one configuration `q` "
            "returning polylines by name, e.g. `draw=lambda q: {'rod': [(0, 0), (q[0], "
            "q[1])]}`."
        )
    check_fps(fps)


def _scene(model, q: np.ndarray, traces: list, drawn: dict) -> Scene:
    """The mechanism drawn from its parts (or the traces of `draw`'s polylines), with the
    polylines of `draw` over it."""
    if isinstance(model, Mechanism):
        scene = mechanism_scene(model, q, [check_marker(model, r) for r in traces])
    else:
        scene = Scene()
        for ref in traces:
            if ref not in drawn:
                raise ValueError(
                    f"`trace` names {ref!r}, which is not a polyline of `draw` "
                    f"(it returns {sorted(drawn)})."
                )
            scene.add(
                f"trace:{ref}",
                np.stack([xy[-1] for xy in drawn[ref]]),
                "trace",
                color="0.5",
                linewidth=1.2,
                alpha=0.8,
                zorder=1.5,
            )
    for k, (name, xy) in enumerate(drawn.items()):
        stacked = np.stack(xy) if len({a.shape for a in xy}) == 1 else xy
        single = all(a.shape[0] == 1 for a in xy)
        scene.add(
            f"draw:{name}",
            stacked,
            color=f"C{k % 10}",
            zorder=3,
            **(
                dict(marker="o", linestyle="none")
                if single
                else dict(marker="o", markersize=4, linewidth=2)
            ),
        )
    return scene


def _view(scene: Scene):
    """The default limits: the box that the scene covers at all frames, with a margin."""
    points = scene.extent()
    low, high = points.min(axis=0), points.max(axis=0)
    size = max(float(np.max(high - low)), 1e-6 * float(np.abs(points).max()), 1e-9)
    low, high = low - 0.08 * size, high + 0.08 * size
    return ((low[0], high[0]), (low[1], high[1]))


def _figure(limits, figsize, dpi, title) -> tuple["Figure", "Axes"]:
    """A figure (not managed by `pyplot`) whose axes show `limits` at one scale in x and
    y."""
    _, Figure, FigureCanvasAgg = _matplotlib()
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
    axes = figure.add_axes(
        (left / figsize[0], bottom / figsize[1], box_w / figsize[0], box_h / figsize[1])
    )
    axes.set_xlim(cx - hw, cx + hw)
    axes.set_ylim(cy - hh, cy + hh)
    axes.set_aspect("equal", adjustable="box")
    if title is not None:
        axes.set_title(title)
    return figure, axes
