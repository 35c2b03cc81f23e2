"""A 3-D viewer for mechanisms: a simulated motion played back in the browser, as a
standalone HTML file, inline in a notebook, or live from a local server.

The viewer is built on viser (`pip install 'jaxdae[viz]'`), chosen
over meshcat and the Jupyter widget libraries (pythreejs, k3d) because it is the one that
writes a truly offline file with playback: `viser`'s scene serializer records the scene and
timed pose updates, and its bundled client (one compressed `index.html` of about 0.8 MB,
JavaScript, styles and decoder inline) replays them with a play button, a time slider and a
speed selector, with nothing fetched from a network. The same HTML in an iframe's `srcdoc`
is the notebook view, and a `viser.ViserServer` is the live one. meshcat 0.3.2 (2021) needs
its ZMQ server process to write static HTML; pythreejs and k3d need a running Jupyter kernel
(widgets) or load three.js from a CDN.

What is drawn: each body as the uniform box with its mass and principal moments of inertia
(a bar shows as the bar) on its principal axes, a ball at its centre of mass and a rod to
each of its markers; each joint as a pin along its axis (revolute, cylindrical) or a ball at
its marker `a`; the ground's joint markers as small cubes; a grid across the up direction
(against gravity). A URDF robot's bodies are drawn instead from the `<visual>` geometry of
their links (boxes, cylinders, spheres and meshes read by trimesh, each in its material's
colour), where the file has it. Poses come from the mechanism's own kinematics
(`Mechanism.marker_position` and `marker_rotation`); planar mechanisms are shown in the
plane z = 0.
"""

import html
import io
import os
from collections.abc import Mapping, Sequence
from contextlib import redirect_stdout

import numpy as np

from ..multibody import Mechanism, TreeMechanism, UrdfRobot
from ..multibody._urdf_geometry import UrdfVisual
from ._frames import check_fps, frame_states
from ._viewer_scene import Scene, build_scene, populate, show_frame

_VIZ_HINT = "The 3-D viewer needs viser: pip install 'jaxdae[viz]' (or pip install viser)."


def _viser():
    try:
        import viser
    except ImportError as error:
        raise ImportError(_VIZ_HINT) from error
    return viser


def _quiet_server(viser, host="127.0.0.1", port=8080):
    """A viser server without its banner (it prints one even when not verbose)."""
    with redirect_stdout(io.StringIO()):
        return viser.ViserServer(host=host, port=port, verbose=False)


def _stop(server):
    with redirect_stdout(io.StringIO()):
        server.stop()


class Viewer:
    """A mechanism's motion ready to be shown in 3-D; made by [`jaxdae.viz.view`][].

    - `times`: the simulation time of each frame, `(F,)`.
    - `nodes`: the scene's moving nodes: `/bodies/<body>` (at the body's centre of mass,
        in its body axes) and `/joints/<joint>` (at the joint's marker `a`). A body's
        URDF visuals are its shapes `/bodies/<body>/visual_<link>_<k>` (the fixed root's
        on `/ground`), the `k`-th visual of its link `link`.
    - `positions`, `orientations`: the nodes' poses at every frame, `(F, K, 3)` and Euler
        parameters `(w, x, y, z)`, `(F, K, 4)`, in the order of `nodes`.

    In a notebook the viewer shows itself (`_repr_html_`); `save_html` writes the same
    page to a file that opens offline in any browser; `show` serves it live.
    """

    def __init__(self, scene: Scene, times: np.ndarray, fps: float, height: int, dark_mode: bool):
        self._scene, self.times, self.fps = scene, times, fps
        self.height, self.dark_mode = height, dark_mode
        self._html: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node.path for node in self._scene.moving)

    @property
    def positions(self) -> np.ndarray:
        return self._scene.positions

    @property
    def orientations(self) -> np.ndarray:
        return self._scene.wxyz

    @property
    def num_frames(self) -> int:
        return int(self.times.shape[0])

    def to_html(self) -> str:
        """The standalone HTML page: viser's client with the recording inline, the frames
        `1/fps` apart, looping after the last one (no network access needed)."""
        if self._html is None:
            viser = _viser()
            server = _quiet_server(viser, port=_PRIVATE_PORT)
            try:
                handles = populate(server, self._scene)
                serializer = server.get_scene_serializer()
                for frame in range(1, self.num_frames):
                    serializer.insert_sleep(1.0 / self.fps)
                    show_frame(handles, self._scene, frame)
                if self.num_frames > 1:  # the last frame lasts as long as the others
                    serializer.insert_sleep(1.0 / self.fps)
                self._html = serializer.as_html(dark_mode=self.dark_mode)
            finally:
                _stop(server)
        return self._html

    def save_html(self, path: str | os.PathLike) -> None:
        """Write the standalone HTML page to `path` (it opens offline in a browser: play,
        pause, a time slider and the playback speed at the bottom; drag to orbit)."""
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.to_html())

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" width="100%" '
            f'height="{self.height}" style="border:none"></iframe>'
        )

    def show(self, *, host: str = "127.0.0.1", port: int = 8080):
        """Serve the scene live on `http://host:port` (the next free port from `port`), with
        a frame slider and a play checkbox in the side panel.

        **Returns:**

        The `viser.ViserServer`; stop it with its `stop()` method.
        """
        viser = _viser()
        import threading
        import time

        server = viser.ViserServer(host=host, port=port)
        handles = populate(server, self._scene)
        last = self.num_frames - 1
        slider = server.gui.add_slider(
            "frame", min=0, max=max(last, 1), step=1, initial_value=0, disabled=last == 0
        )
        play = server.gui.add_checkbox("play", initial_value=False, disabled=last == 0)
        clock = server.gui.add_number("t [s]", initial_value=float(self.times[0]), disabled=True)

        @slider.on_update
        def _(_event) -> None:
            frame = min(int(slider.value), last)
            show_frame(handles, self._scene, frame)
            clock.value = float(self.times[frame])

        def loop():
            # Daemon thread: ends with the interpreter; idles while paused.
            while True:
                if play.value:
                    slider.value = (int(slider.value) + 1) % (last + 1)
                time.sleep(1.0 / self.fps)

        threading.Thread(target=loop, daemon=True).start()
        return server


# The recording server only lives while a page is written; start its search for a free
# port away from viser's default, which a live view may hold.
_PRIVATE_PORT = 8765


def view(
    model: Mechanism | TreeMechanism | UrdfRobot,
    solution=None,
    *,
    visuals: Mapping[str, Sequence[UrdfVisual]] | None = None,
    fps: float = 30.0,
    frames=None,
    member: int | None = None,
    size: float | None = None,
    height: int = 480,
    dark_mode: bool = False,
) -> Viewer:
    """Show a mechanism's motion in 3-D: in a notebook, as a standalone HTML file, or live.

    !!! Example

        ```python
        sol = jaxdae.simulate(model, jaxdae.PseudoInverse(20.0, 100.0), 0.0, 10.0, q0, v0,
                              ts=jnp.linspace(0.0, 10.0, 1001))
        viewer = jaxdae.viz.view(model, sol)
        viewer                          # in a notebook: the player inline
        viewer.save_html("motion.html") # opens offline in any browser
        ```

        A URDF robot is drawn from its links' visual geometry:

        ```python
        robot = jaxdae.multibody.load_urdf("arm.urdf")
        model = robot.mechanism(forces=[jaxdae.multibody.Gravity()])
        sol = jaxdae.simulate(model, ...)
        jaxdae.viz.view(model, sol, visuals=robot.visuals)
        jaxdae.viz.view(robot, sol)     # the same for robot.mechanism()'s coordinates
        ```

    **Arguments:**

    - `model`: a spatial [`jaxdae.multibody.Mechanism`][] (a URDF robot's
        `robot.mechanism(...)` too); a planar one is shown in the plane z = 0. A
        [`jaxdae.multibody.UrdfRobot`][] stands for `robot.mechanism()` with
        `visuals=robot.visuals` (joints added in Python are then not drawn: pass the
        mechanism and the visuals to see them).
    - `solution`: a [`jaxdae.Solution`][] of `model` (anything with `ts` `(N,)` and `q`
        `(N, n)`, or a batch of them); `None` shows the bodies' reference poses.
    - `visuals`: the [`jaxdae.multibody.UrdfVisual`][]s to draw, by body name
        (`robot.visuals`): a body that has some is drawn by them in place of its inertia box,
        centre and marker rods; the others as usual, the joints as always. Mesh files are
        read when the viewer is made (their triangles are written into the page); one that
        is missing or unreadable is left out with a warning naming it.
    - `fps`: frames per second of playback; the motion plays in real time.
    - `frames`: the number of frames, equally spaced over the solution's time span, or
        the frames' times (e.g. `sol.ts`); default: `fps` per simulated second. The saved
        states are interpolated linearly.
    - `member`: which trajectory of a batched solution to show.
    - `size`: the length the glyphs (rods, balls, pins) are scaled by; default the extent
        of the motion.
    - `height`: the height in pixels of the notebook view.
    - `dark_mode`: the viewer's dark colour scheme.

    **Returns:**

    A [`jaxdae.viz.Viewer`][]: `save_html(path)`, `show()` (live), and the notebook view.

    **Raises:**

    `ImportError` when viser is not installed; `ValueError` for a model that is not a
    `Mechanism` (or `UrdfRobot`), visuals of a body the model does not have or of a planar
    model, a batched solution without `member`, or no finite states.
    """
    _viser()
    if isinstance(model, UrdfRobot):
        model, visuals = model.mechanism(), model.visuals if visuals is None else visuals
    if not isinstance(model, Mechanism | TreeMechanism):
        raise ValueError(
            f"`model` must be a jaxdae.multibody.Mechanism or TreeMechanism; got "
            f"{type(model).__name__}. For "
            "other systems, plot the coordinates or draw them with jaxdae.viz.animate."
        )
    if visuals:
        names = {model.ground.name, *model.body_names}
        unknown = sorted(set(visuals) - names)
        if unknown:
            raise ValueError(
                f"`visuals` names bodies {unknown} that the mechanism does not "
                f"have (its bodies: {sorted(names)})."
            )
        if model.dimension != 3:
            raise ValueError("`visuals` are URDF geometry, drawn on spatial mechanisms only.")
    fps = check_fps(fps)
    if solution is None:
        times = np.zeros(1)
        q = np.asarray(model.reference_coordinates(), float)[None]
    else:
        times, q = frame_states(solution, member, frames, fps)
    if q.shape[-1] != len(model.coordinate_names):
        raise ValueError(
            f"`solution.q` has {q.shape[-1]} coordinates; the mechanism has "
            f"{len(model.coordinate_names)}."
        )
    return Viewer(build_scene(model, q, size, visuals), times, float(fps), height, dark_mode)
