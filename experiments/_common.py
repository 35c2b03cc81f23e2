"""Shared plumbing for the experiment scripts: command line, output folder, JSON, progress.

Each script puts `experiments/` on `sys.path` and imports this module, which puts the
scripts' folders there too: a script imports another by its module name (`import
bench_core`, `import flyball_governor`) whichever folder either lies in.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("MPLBACKEND", "Agg")

FOLDERS = ("examples", "benchmarks", "studies", "diagnostics")
_ROOT = Path(__file__).resolve().parent
sys.path[1:1] = [str(_ROOT / f) for f in FOLDERS if str(_ROOT / f) not in sys.path]


def parse_args(name: str, description: str, only: bool = False) -> argparse.Namespace:
    """`--out` and `--quick`, and with `only` an `--only` filter (comma-separated parts of
    what the study names its rows by)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("output"),
        help=f"output root; results go to OUT/{name}/ (default: output)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller grids, fewer steps, shorter horizons: a smoke test with coarser figures",
    )
    if only:
        parser.add_argument(
            "--only", default=None, help="comma-separated parts of the names of the rows to run"
        )
    return parser.parse_args()


class Run(NamedTuple):
    """A benchmark run's start: its command line, output folder, clock and load average."""

    args: argparse.Namespace
    out: Path
    began: float  # time.perf_counter()
    load: float  # the 1-minute load average


def start_run(name: str, description: str, only: bool = False) -> Run:
    """`parse_args`, the output folder `OUT/name/`, the clock and the load average."""
    args = parse_args(name, description, only)
    return Run(args, output_dir(args.out, name), time.perf_counter(), os.getloadavg()[0])


def selected(items: dict, only: str | None) -> dict:
    """The entries of `items` whose name contains one of the comma-separated parts of
    `only` (an `--only` option); all of them without it."""
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    if not wanted:
        return items
    return {k: v for k, v in items.items() if any(w in k for w in wanted)}


def output_dir(root: Path, name: str) -> Path:
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, data) -> None:
    def default(x):
        try:
            return x.tolist()
        except AttributeError:
            return str(x)

    Path(path).write_text(json.dumps(data, indent=2, default=default))


def interactive() -> bool:
    """Whether progress bars are shown: stderr is a terminal (not a log file or CI) and
    `NO_PROGRESS` is not set."""
    return (
        sys.stderr.isatty()
        and not os.environ.get("NO_PROGRESS")
        and (os.environ.get("TERM") != "dumb")
    )


def progress(iterable, description: str, total: int | None = None, unit: str = "it"):
    """Iterates over `iterable` showing progress.

    On a terminal a tqdm bar, nested under `run_all.py`'s bar over the experiments and
    removed when done. Elsewhere (a log file, CI) no bar: one line when the loop ends,
    `  description: N unit in T s`, so that logs stay readable.
    """
    if total is None:
        total = len(iterable) if hasattr(iterable, "__len__") else None
    if interactive():
        from tqdm.auto import tqdm

        yield from tqdm(
            iterable, desc=description, total=total, unit=unit, leave=False, dynamic_ncols=True
        )
        return
    start, count = time.perf_counter(), 0
    for item in iterable:
        yield item
        count += 1
    loop_done(description, count, unit, time.perf_counter() - start)


def loop_done(description: str, count: int, unit: str, seconds: float) -> None:
    """The line `progress` prints at the end of a loop in a log (nothing on a terminal, where
    the loop had a bar); for loops that show their own bar, e.g. `jaxdae.tune(...,
    reporting=jaxdae.Reporting(progress=interactive()))`."""
    if not interactive():
        units = unit if count == 1 else unit + "s"
        print(f"  {description}: {count} {units} in {seconds:.1f} s", flush=True)


def figure(path: Path, caption: str) -> dict:
    """A figure an experiment wrote, with the one-line caption `run_all.py` puts beside
    its link in SUMMARY.md."""
    return {"path": Path(path), "caption": caption}


def log_values(values, floor: float):
    """`|values|` for a log axis whose lower limit is `floor`: smaller values (exact zeros,
    round-off noise below the floor) are left out (NaN) instead of drawn below the frame."""
    import numpy as np

    values = np.abs(np.asarray(values, dtype=float))
    return np.where(values >= floor, values, np.nan)


def legend_below(ax, ncol: int = 2, **kwargs):
    """A legend under the axes (below its x label), so that it never covers data; use
    with `plt.subplots(..., layout="constrained")`, which makes room for it."""
    return ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=ncol,
        fontsize=8,
        frameon=False,
        **kwargs,
    )


def exudyn_solve(
    exu,
    mbs,
    sensor,
    t1: float,
    steps: int,
    *,
    singular_jacobian: bool = False,
    options: dict | None = None,
):
    """Solve an assembled Exudyn system `mbs` with its generalized-α integrator in `steps`
    fixed steps over `[0, t1]` (Newton to a relative 1e-10, dense linear algebra; with
    `singular_jacobian`, redundant constraints accepted), and return the `sensor`'s stored
    data (column 0 the time; a list of them for a list of sensors) and the solve's wall
    time in seconds.

    `options` sets further simulation settings by their dotted paths, e.g.
    `{"timeIntegration.generalizedAlpha.spectralRadius": 0.6}`, after the ones above (so
    it may also replace them). Exudyn raises its own error when the solve fails."""
    mbs.Assemble()
    settings = exu.SimulationSettings()
    settings.timeIntegration.numberOfSteps = steps
    settings.timeIntegration.endTime = t1
    settings.timeIntegration.verboseMode = 0
    settings.solution.file.write = False
    settings.solution.sensors.writePeriod = t1 / steps
    settings.timeIntegration.newton.relativeTolerance = 1e-10
    settings.linearSolver.solverType = exu.LinearSolverType.EigenDense
    settings.linearSolver.ignoreSingularJacobian = singular_jacobian
    for path, value in (options or {}).items():
        *parents, leaf = path.split(".")
        group = settings
        for parent in parents:
            group = getattr(group, parent)
        setattr(group, leaf, value)
    start = time.perf_counter()
    mbs.SolveDynamic(settings)
    elapsed = time.perf_counter() - start
    if isinstance(sensor, (list, tuple)):
        return [mbs.GetSensorStoredData(s) for s in sensor], elapsed
    return mbs.GetSensorStoredData(sensor), elapsed


def exudyn_governor_system(exu, model, q0, v0):
    """The flyball governor in Exudyn, from jaxdae's `model` at the state `(q0, v0)`: every
    body a rigid body (Euler parameters, its mass, inertia and pose), the joints as Exudyn's
    revolute and prismatic joints at the same points and axes, the spring–dampers between
    the same markers. Returns the system container (which owns the system: keep it), the
    system and the Exudyn numbers of the bodies by name."""
    import numpy as np
    from exudyn.utilities import ObjectGround, RigidBodyInertia

    import jaxdae.multibody as mb
    from jaxdae.examples._flyball_governor import REST, C, K

    container = exu.SystemContainer()
    mbs = container.AddSystem()
    numbers = {"ground": mbs.AddObject(ObjectGround())}
    for body in model.bodies:
        inertia = np.asarray(body.inertia)
        numbers[body.name] = mbs.CreateRigidBody(
            inertia=RigidBodyInertia(
                mass=float(body.mass),
                inertiaTensor=np.diag(inertia) if inertia.ndim == 1 else inertia,
            ),
            referencePosition=list(np.asarray(model.marker_position(q0, body.name))),
            referenceRotationMatrix=np.asarray(model.marker_rotation(q0, body.name)),
            initialVelocity=list(np.asarray(model.marker_velocity(q0, v0, body.name))),
            initialAngularVelocity=list(np.asarray(model.angular_velocity(q0, v0, body.name))),
            gravity=[0.0, 0.0, -9.81],
        )
    for joint in model.joints:
        items = [numbers[joint.a.split(".")[0]], numbers[joint.b.split(".")[0]]]
        position = list(np.asarray(model.marker_position(q0, joint.a)))
        axis = list(np.asarray(model.marker_rotation(q0, joint.a) @ joint.axis))
        create = (
            mbs.CreateRevoluteJoint if isinstance(joint, mb.Revolute) else mbs.CreatePrismaticJoint
        )
        create(itemNumbers=items, position=position, axis=axis)
    for force in model.forces[1:]:
        (body_a, marker_a), (body_b, marker_b) = (ref.split(".") for ref in force.markers)
        mbs.CreateSpringDamper(
            itemNumbers=[numbers[body_a], numbers[body_b]],
            localPosition0=list(np.asarray(model.body(body_a).markers[marker_a])),
            localPosition1=list(np.asarray(model.body(body_b).markers[marker_b])),
            referenceLength=REST,
            stiffness=K,
            damping=C,
        )
    return container, mbs, numbers
