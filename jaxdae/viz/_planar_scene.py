"""The shapes of an animation before they are drawn, and a planar mechanism drawn from its
parts: bodies, joints, the ground, stops and the paths of markers."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

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

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes

GROUND = "ground"
# Sizes of the symbols, as fractions of the scene's extent (the larger side of the box
# the bodies sweep).
_BLOCK = (0.12, 0.07)  # a prismatic joint's slider block: length along the line, height
_SUPPORT = (0.035, 0.05, 0.025)  # a ground pin's triangle: half-width, height; hatch band
_TICK = 0.06  # a prismatic joint limit's tick
_CIRCLE = 48  # points on a drawn circle
_PIN = dict(
    marker="o",
    markersize=7,
    markerfacecolor="white",
    markeredgecolor="black",
    markeredgewidth=1.5,
    linestyle="none",
    zorder=4,
)
_STOP = dict(color="tab:red", linewidth=1.2, linestyle="--", zorder=1)
_HATCH = dict(fill=False, hatch="////", edgecolor="0.4", linewidth=0, zorder=1)


def _split(ref: str) -> tuple[str, str | None]:
    body, _, marker = ref.partition(".")
    return body, marker or None


def check_marker(model: Mechanism, ref) -> str:
    if not isinstance(ref, str):
        raise ValueError(f"`trace` names markers as 'body.marker' or 'body'; got {ref!r}.")
    body, marker = _split(ref)
    names = (GROUND, *model.body_names)
    if body not in names:
        raise ValueError(
            f"`trace` names {ref!r}, but the mechanism has no body {body!r} "
            f"(bodies: {', '.join(names)})."
        )
    markers = model.body(body).markers
    if marker is not None and marker not in markers:
        raise ValueError(
            f"`trace` names {ref!r}, but body {body!r} has no marker {marker!r} "
            f"(its markers: {sorted(markers) or 'none'})."
        )
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


class Shape:
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
        return np.asarray(
            self.xy if self.static else self.xy[:1] if self.kind == "trace" else self.xy[0]
        )

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


class Scene:
    """The shapes of an animation before they are drawn, and extra points the default
    view must hold."""

    def __init__(self):
        self.shapes: list[Shape] = []
        self.extra: list[np.ndarray] = []

    def add(self, name, xy, kind="line", *, bounded=True, **style):
        self.shapes.append(Shape(name, xy, kind, bounded, style))

    def extent(self) -> np.ndarray:
        points = [s.points() for s in self.shapes if s.bounded] + self.extra
        points = np.concatenate(points) if points else np.zeros((1, 2))
        points = points[np.all(np.isfinite(points), axis=1)]
        return points if points.size else np.zeros((1, 2))


def _moving(ref: str) -> bool:
    return _split(ref)[0] != GROUND


class _MechanismDrawing:
    """A planar mechanism's markers at the configurations `q (F, n)`, and the shapes drawn
    from them into `scene`: the bodies, then the joints (and the ground's supports), the
    stops and the traces."""

    def __init__(self, model: Mechanism, q: np.ndarray, trace: Sequence[str]):
        self.model, self.frames = model, len(q)
        self.local: dict[str, np.ndarray] = {GROUND: np.zeros(2)}  # a marker's body point
        for name, point in model.ground.markers.items():
            self.local[f"{GROUND}.{name}"] = np.asarray(point, dtype=float)
        self.outlines = []
        for body in model.bodies:
            self.outlines.append([body.name] + [f"{body.name}.{m}" for m in body.markers])
            self.local[body.name] = np.zeros(2)
            for m, point in body.markers.items():
                self.local[f"{body.name}.{m}"] = np.asarray(point, dtype=float)
        refs = list(
            dict.fromkeys(
                [r for body_refs in self.outlines for r in body_refs]
                + [r for j in model.joints for r in (j.a, j.b)]
                + [r for s in model.stops for r in s.markers]
                + list(trace)
                + [GROUND]
            )
        )
        self.where = {r: i for i, r in enumerate(refs)}

        @jax.jit
        def marker_frames(q_):
            frame = jax.vmap(lambda row: Kinematics(model, 0.0, row).frames(refs))(q_)
            return frame.point, frame.angle

        self.points, self.angles = (np.asarray(a) for a in marker_frames(jnp.asarray(q)))
        body_points = self.points[
            :, [self.where[r] for refs_ in self.outlines for r in refs_]
        ].reshape(-1, 2)
        span = np.ptp(body_points, axis=0) if body_points.size else np.zeros(2)
        self.scale = float(max(span.max(), 1e-3 * np.abs(body_points).max(initial=0.0))) or 1.0
        self.scene = Scene()
        self.colour = {b.name: f"C{i % 10}" for i, b in enumerate(model.bodies)}
        self.hulls: dict[str, list[str]] = {}  # a body's outline, by marker
        self.lines: dict[str, tuple] = {}  # a line joint's direction and marker a, (F, 2)

    def point(self, ref: str) -> np.ndarray:
        """The marker's point at every frame, `(F, 2)`."""
        return self.points[:, self.where[ref]]

    def angle(self, ref: str) -> np.ndarray:
        """The angle of the marker's body at every frame, `(F,)`."""
        return self.angles[:, self.where[ref]]

    def add_bodies(self) -> None:
        """Each body: a polygon through the centre and the markers, a bar, or a point."""
        for body, refs in zip(self.model.bodies, self.outlines, strict=True):
            indices = _outline(np.stack([self.local[r] for r in refs]), self.scale)
            hull = [refs[i] for i in indices]
            self.hulls[body.name] = hull
            xy = np.stack([self.point(r) for r in hull], axis=1)
            c = self.colour[body.name]
            if len(hull) >= 3:
                self.scene.add(
                    f"body:{body.name}",
                    xy,
                    "polygon",
                    facecolor=c,
                    edgecolor=c,
                    alpha=0.45,
                    linewidth=2,
                    zorder=2,
                )
            elif len(hull) == 2:
                self.scene.add(
                    f"body:{body.name}",
                    xy,
                    color=c,
                    linewidth=6,
                    alpha=0.85,
                    solid_capstyle="round",
                    zorder=2,
                )
            else:
                self.scene.add(f"body:{body.name}", xy, color=c, marker="s", markersize=9, zorder=2)

    def support(self, name: str, at) -> None:
        """A hatched triangle under a pin to the ground at the fixed point `at`."""
        w, h, band = (f * self.scale for f in _SUPPORT)
        x, y = at
        self.scene.add(
            f"ground:{name}",
            np.array([[x, y], [x - w, y - h], [x + w, y - h]]),
            "polygon",
            facecolor="0.85",
            edgecolor="0.2",
            linewidth=1,
            zorder=1,
        )
        self.scene.add(
            f"ground:{name}.hatch",
            np.array(
                [
                    [x - 1.5 * w, y - h],
                    [x + 1.5 * w, y - h],
                    [x + 1.5 * w, y - h - band],
                    [x - 1.5 * w, y - h - band],
                ]
            ),
            "polygon",
            **_HATCH,
        )

    def band_below(self, name: str, start, end, normal, **options) -> None:
        """A hatched band on the `-normal` side of the fixed segment `start`–`end`."""
        depth = _SUPPORT[2] * self.scale * normal
        self.scene.add(
            name, np.array([start, end, end - depth, start - depth]), "polygon", **options, **_HATCH
        )

    def add_joints(self) -> None:
        """Revolute joints as pins (on a support where they hold a body to the ground),
        line joints as their lines and what moves on them, distance joints as links,
        welds as squares; other joints as a dot at `b`, `Gear` and `Driver` not at all."""
        for name, joint in zip(self.model.joint_names, self.model.joints, strict=True):
            a, b = joint.a, joint.b
            if isinstance(joint, Revolute):
                if not _moving(a) or not _moving(b):
                    fixed = a if not _moving(a) else b
                    self.support(name, self.point(fixed)[0])
                    self.scene.add(f"joint:{name}", self.point(fixed)[:1], **_PIN)
                else:
                    self.scene.add(f"joint:{name}", self.point(b)[:, None], **_PIN)
            elif isinstance(joint, Prismatic | PointOnLine | Rolling):
                self._line_joint(name, joint)
            elif isinstance(joint, Distance):
                self.scene.add(
                    f"joint:{name}",
                    np.stack([self.point(a), self.point(b)], axis=1),
                    color="0.25",
                    linewidth=1.5,
                    zorder=1,
                )
            elif isinstance(joint, Fixed):
                self.scene.add(
                    f"joint:{name}",
                    self.point(b)[:, None],
                    marker="s",
                    markersize=5,
                    color="black",
                    linestyle="none",
                    zorder=4,
                )
            elif not isinstance(joint, Gear | Driver):
                self.scene.add(
                    f"joint:{name}",
                    self.point(b)[:, None],
                    marker="o",
                    markersize=4,
                    color="black",
                    linestyle="none",
                    zorder=4,
                )

    def _line_joint(self, name: str, joint: Prismatic | PointOnLine | Rolling) -> None:
        """The line of a prismatic, point-on-line or rolling joint (hatched where it is the
        ground's), and a slider block, a dot or a disc with a spoke on it."""
        a, b = joint.a, joint.b
        axis = np.array([1.0, 0.0]) if joint.axis is None else np.asarray(joint.axis)
        u = _direction(self.angle(a), axis)
        n = _perpendicular(u)
        s = np.sum(u * (self.point(b) - self.point(a)), axis=-1)
        scale = self.scale
        half = (
            0.5 * _BLOCK[0] * scale
            if isinstance(joint, Prismatic)
            else float(joint.radius)
            if isinstance(joint, Rolling)
            else 0.02 * scale
        )
        lo, hi = s.min() - half - 0.05 * scale, s.max() + half + 0.05 * scale
        guide = np.stack([self.point(a) + lo * u, self.point(a) + hi * u], axis=1)
        self.lines[name] = (u, self.point(a))
        if _moving(a):
            self.scene.add(f"joint:{name}.line", guide, color="0.3", linewidth=1.5, zorder=1)
        else:
            self.scene.add(f"joint:{name}.line", guide[0], color="0.3", linewidth=1.5, zorder=1)
            self.band_below(f"ground:{name}", guide[0, 0], guide[0, 1], n[0])
        centre = self.point(b)
        if isinstance(joint, Prismatic):
            w, h = 0.5 * _BLOCK[0] * scale, 0.5 * _BLOCK[1] * scale
            corners = (
                centre[:, None]
                + np.array([-w, w, w, -w])[:, None] * u[:, None]
                + np.array([-h, -h, h, h])[:, None] * n[:, None]
            )
            self.scene.add(
                f"joint:{name}",
                corners,
                "polygon",
                facecolor=self.colour.get(_split(b)[0], "0.7"),
                alpha=0.6,
                edgecolor="black",
                linewidth=1.5,
                zorder=3,
            )
        elif isinstance(joint, Rolling):
            spoke = centre + float(joint.radius) * _direction(self.angle(b), (1.0, 0.0))
            xy = np.concatenate(
                [_circle(centre, float(joint.radius)), centre[:, None], spoke[:, None]], axis=1
            )
            self.scene.add(f"joint:{name}", xy, color="black", linewidth=1.5, zorder=3)
        else:
            self.scene.add(f"joint:{name}", centre[:, None], **{**_PIN, "markersize": 5})

    def add_stops(self) -> None:
        """Ticks or rays where a joint limit stops its joint, a plane contact's line (and
        its disc), a distance stop's spheres or rope."""
        for name, stop in zip(self.model.stop_names, self.model.stops, strict=True):
            if isinstance(stop, JointLimit):
                self._joint_limit(name, stop)
            elif isinstance(stop, PlaneContact):
                self._plane_contact(name, stop)
            elif isinstance(stop, DistanceStop):
                gap = np.full((self.frames, 1, 2), np.nan)
                parts = []
                if stop.lower is not None:  # two spheres that touch at d = lower
                    r = 0.5 * float(stop.lower)
                    parts += [
                        _circle(self.point(stop.a), r),
                        gap,
                        _circle(self.point(stop.b), r),
                        gap,
                    ]
                if stop.upper is not None:  # a rope that goes taut at d = upper
                    parts.append(np.stack([self.point(stop.a), self.point(stop.b)], axis=1))
                self.scene.add(
                    f"stop:{name}", np.concatenate(parts, axis=1), **{**_STOP, "linestyle": ":"}
                )

    def _joint_limit(self, name: str, stop: JointLimit) -> None:
        """A tick across a line joint's line where marker `b` stops, or rays where the
        moving side's arm of a revolute joint stops; nothing for other joints."""
        joint = self.model.joint(stop.joint)
        bounds = [float(x) for x in (stop.lower, stop.upper) if x is not None]
        if stop.joint in self.lines:
            u, start = self.lines[stop.joint]
            n = _perpendicular(u)
            half = 0.5 * _TICK * self.scale
            marks = [
                np.stack([start + x * u - half * n, start + x * u + half * n], axis=1)
                for x in bounds
            ]
            fixed = not _moving(joint.a)
        elif isinstance(joint, Revolute):
            # The coordinate is `θ_b − θ_a`: body b stops at `θ_a + bound`, or body a at
            # `θ_b − bound` where b is the ground.
            side, other, sign = (
                (joint.b, joint.a, 1.0) if _moving(joint.b) else (joint.a, joint.b, -1.0)
            )
            arms = [self.local[r] - self.local[side] for r in self.hulls[_split(side)[0]]]
            arm = max(arms, key=lambda x: float(np.linalg.norm(x)))
            length = float(np.linalg.norm(arm)) or 0.1 * self.scale
            phi = float(np.arctan2(arm[1], arm[0]))
            fixed = not (_moving(joint.a) and _moving(joint.b))
            centre = self.point(joint.a if not _moving(joint.a) else joint.b)
            marks = [
                np.stack(
                    [
                        centre,
                        centre
                        + length * _direction(self.angle(other) + sign * x + phi, (1.0, 0.0)),
                    ],
                    axis=1,
                )
                for x in bounds
            ]
        else:
            return
        gap = np.full((self.frames, 1, 2), np.nan)
        xy = np.concatenate([part for mark in marks for part in (mark, gap)], axis=1)
        self.scene.add(f"stop:{name}", xy[0] if fixed else xy, **_STOP)

    def _plane_contact(self, name: str, stop: PlaneContact) -> None:
        """The contact's line (hatched where it is the ground's) and the point's disc."""
        normal = (0.0, 1.0) if stop.normal is None else np.asarray(stop.normal)
        n = _direction(self.angle(stop.surface), normal)
        t = _perpendicular(n)
        at = self.point(stop.surface)
        # The line is infinite: the view holds where the point would touch it.
        foot = at + np.sum((self.point(stop.point) - at) * t, axis=-1, keepdims=True) * t
        self.scene.extra.append(foot)
        reach = 50.0 * self.scale
        line = np.stack([at - reach * t, at + reach * t], axis=1)
        style = dict(color="0.2", linewidth=1.5, zorder=1)
        if _moving(stop.surface):
            self.scene.add(f"stop:{name}", line, bounded=False, **style)
        else:
            self.scene.add(f"stop:{name}", line[0], bounded=False, **style)
            self.band_below(f"ground:{name}", line[0, 0], line[0, 1], n[0], bounded=False)
        radius = float(stop.radius)
        if radius > 0:
            self.scene.add(
                f"stop:{name}.disc",
                _circle(self.point(stop.point), radius),
                color=self.colour.get(_split(stop.point)[0], "0.3"),
                linewidth=1.5,
                zorder=2,
            )

    def add_traces(self, trace: Sequence[str]) -> None:
        """The markers' paths, in the colour of each marker's body."""
        for ref in trace:
            self.scene.add(
                f"trace:{ref}",
                self.point(ref),
                "trace",
                color=self.colour.get(_split(ref)[0], "0.3"),
                linewidth=1.2,
                alpha=0.7,
                zorder=1.5,
            )


def mechanism_scene(model: Mechanism, q: np.ndarray, trace: Sequence[str]) -> Scene:
    """Bodies, joints, the ground, stops and traces of a planar mechanism at the
    configurations `q (F, n)`."""
    drawing = _MechanismDrawing(model, q, trace)
    drawing.add_bodies()
    drawing.add_joints()
    drawing.add_stops()
    drawing.add_traces(trace)
    return drawing.scene
