"""Benchmark: robots in joint coordinates against MuJoCo and MJX.

Three robots read from URDF, simulated for 1 s under gravity `(0, 0, -9.81)` with no
damping, no joint limits and no contacts, from zero joint coordinates with joint rates
0.5 rad/s (m/s for a prismatic joint) on joints 0, 2, 4, ... of the URDF's joint order:

- `arm`: tests/data/three_link_arm.urdf, 4 joints (yaw, shoulder, elbow, a prismatic
  wrist; the massless tool on a fixed joint);
- `humanoid`: tests/data/humanoid.urdf, 28 revolute joints, the pelvis welded to the world;
- `chain64`: `chain_urdf(64)`, 64 links of 0.1 m and 0.1 kg on revolute joints about y
  and x in turn, hanging from the world.

MuJoCo (its own URDF compiler, the model checked against jaxdae's reading of the file):

- **Reference**: RK4 at h = 1e-5 and 5e-6 (the latter kept: times, joint coordinates and
  rates at 101 points, in the URDF's joint order); their agreement at t = 1 s and the energy
  drift of the run are reported.
- **Time to a joint error of 1e-6 after 1 s**: for RK4, Euler and implicitfast the
  largest step h = 1/N on a ladder `N = ceil(10 * 1.25**k)` whose `max |q(1) - q_ref(1)|`
  is at most 1e-6, then `mj_step` over 1 s at that h (median wall time of 5). A trial that
  would take more than a few seconds is not run: the step count is then extrapolated from
  the last two trials' order of convergence and the time from the measured step cost
  (marked "est.").
- **One right-hand side**: `mj_forward` in a Python loop (and the same loop around an
  empty Python function), and the cost of a step inside `mujoco.rollout` (Euler: one
  `mj_forward` and an update; RK4 / 4), which has no Python in its loop.
- **Batch of 1,024 on the CPU**: rates perturbed by N(0, 0.1^2) (member 0 unperturbed),
  1 s at the cheapest integrator's h, `mujoco.rollout` with 2 threads; trajectories per
  second.
- **MJX on the CPU**: `jax.vmap(mjx.step)` in `jax.lax.scan`, jit-compiled, batch 1,024
  split over the two CPU devices (one per core, as the rollout's 2 threads), float64
  (`jax_enable_x64`, as jaxdae), in a child process with a compile-time limit; the
  compile time apart. Where the whole second would take too long, a fraction of its steps
  is timed and the time scaled (the tables say which fraction).

jaxdae (`jaxdae_rows`): `load_urdf(...).mechanism()`, the joint-coordinate
`TreeMechanism`, from the same start, against the MuJoCo reference (a `MujocoReference`,
also written to OUT/bench_robots/reference_<robot>.npz): the time to the same joint error
at its cheapest setting (Tsit5 or Dopri8, the loosest tolerance that reaches it), one
right-hand side in a compiled loop, and the batch of 1,024 as one `simulate_ensemble` (one
device) and as `jaxdae.batch_map(..., ensemble=True, mesh=...)` of `simulate_ensemble` over
the two CPU devices, in chunks of `batch_chunk(model)` trajectories. Then the same at fixed
steps (`fixed_steps_to_tolerance`: Tsit5 or Dopri8, the fewest steps on MuJoCo's ladder
whose member 0 reaches the joint error, as MuJoCo's step is chosen), each of
`batch_layouts(model)` measured: ensembles, and one `jaxdae.simulate` per row under
`batch_map` without `ensemble`; the batch's spread of errors at that step (`batch_error`).
`--only` without a chain leaves out the chain's scaling. The script starts JAX with
`--xla_force_host_platform_device_count=2` (two CPU devices, one per core).

    python experiments/benchmarks/bench_robots.py [--out output] [--quick] [--only humanoid]
    # prints Markdown tables, writes OUT/bench_robots/bench_robots.json and the page's
    # tables (bench_robots.time-to-error, .rhs, .chain, .batch) to tables.json
"""

import contextlib
import functools
import io
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

# The batches run on both cores as two CPU devices (XLA reads this once, when JAX starts
# its backend): MJX and jaxdae split the batch over them, as MuJoCo's rollout runs 2 threads.
THREADS = 2
_DEVICES = f"--xla_force_host_platform_device_count={THREADS}"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICES).strip()

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from _common import selected, start_run, write_json  # noqa: E402
from _tables import render, run_stamp, table, write  # noqa: E402

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402
from jaxdae._compilation._scalarize import scalarize  # noqa: E402
from jaxdae._integration._vector_fields import state_rates  # noqa: E402

jax.config.update("jax_enable_x64", True)

NAME = "bench_robots"
DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
T1 = 1.0
TOLERANCE = 1e-6
GRAVITY = (0.0, 0.0, -9.81)
RATE = 0.5  # rad/s (m/s) on joints 0, 2, 4, ...
SPREAD = 0.1  # the batch's rates: RATE pattern + N(0, SPREAD^2)
BATCH = 1024
POINTS = 101  # reference samples over [0, T1]
INTEGRATORS = {
    "RK4": mujoco.mjtIntegrator.mjINT_RK4,
    "Euler": mujoco.mjtIntegrator.mjINT_EULER,
    "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
}
DASH = "—"


class Settings(NamedTuple):
    """What a full run and a `--quick` smoke run do differently."""

    reference_steps: tuple[int, int]  # RK4 steps over T1: the check, the reference
    trial_seconds: float  # no ladder trial predicted to take longer
    reps: int  # timing repetitions (median)
    forward_calls: int  # mj_forward calls per repetition
    batch: int
    batch_seconds: float  # rollout: time at most this much of the batch, then scale
    mjx_compile_limit: float  # s; a longer MJX compile is stopped
    mjx_seconds: float  # MJX: time at most this much of the batch, then scale


FULL = Settings((100_000, 200_000), 3.0, 5, 2000, BATCH, 40.0, 240.0, 40.0)
QUICK = Settings((2_000, 4_000), 0.2, 2, 200, 8, 2.0, 60.0, 2.0)


# -- robots ------------------------------------------------------------------------------


def chain_urdf(n: int) -> str:
    """A URDF of `n` identical links hanging from the world on revolute joints whose axes
    are y and x in turn (a spatial chain): links of 0.1 m and 0.1 kg (uniform rods of
    radius 0.01 m), each joint at the end of the link before it, straight down at zero
    joint coordinates."""
    length, mass, radius = 0.1, 0.1, 0.01
    across = mass * (length**2 + 3 * radius**2) / 12
    along = mass * radius**2 / 2
    lines = ['<?xml version="1.0"?>', f'<robot name="chain{n}">', '  <link name="base"/>']
    for i in range(n):
        parent = "base" if i == 0 else f"link{i - 1}"
        drop = 0.0 if i == 0 else -length
        axis = "0 1 0" if i % 2 == 0 else "1 0 0"
        lines += [
            f'  <link name="link{i}">',
            "    <inertial>",
            f'      <origin xyz="0 0 {-length / 2}" rpy="0 0 0"/>',
            f'      <mass value="{mass}"/>',
            f'      <inertia ixx="{across!r}" ixy="0" ixz="0" iyy="{across!r}" iyz="0" '
            f'izz="{along!r}"/>',
            "    </inertial>",
            "    <visual>",
            f'      <origin xyz="0 0 {-length / 2}" rpy="0 0 0"/>',
            f'      <geometry><cylinder radius="{radius}" length="{length}"/></geometry>',
            "    </visual>",
            "  </link>",
            f'  <joint name="joint{i}" type="revolute">',
            f'    <parent link="{parent}"/>',
            f'    <child link="link{i}"/>',
            f'    <origin xyz="0 0 {drop}" rpy="0 0 0"/>',
            f'    <axis xyz="{axis}"/>',
            '    <limit lower="-3.1" upper="3.1" effort="1" velocity="10"/>',
            "  </joint>",
        ]
    lines.append("</robot>")
    return "\n".join(lines) + "\n"


def robot_files(folder: Path, quick: bool) -> dict[str, Path]:
    """The robots' URDF files by name; the chain is written to `folder` (64 links; 8 with
    `quick`)."""
    links = 8 if quick else 64
    chain = Path(folder) / f"chain{links}.urdf"
    chain.write_text(chain_urdf(links))
    return {
        "arm": DATA / "three_link_arm.urdf",
        "humanoid": DATA / "humanoid.urdf",
        f"chain{links}": chain,
    }


def initial_rates(n: int) -> np.ndarray:
    """The joint rates at t = 0 in the URDF's joint order: `RATE` on joints 0, 2, 4, ..."""
    return np.where(np.arange(n) % 2 == 0, RATE, 0.0)


def batch_rates(v0: np.ndarray, size: int) -> np.ndarray:
    """`(size, n)` rates for the batch: `v0` plus N(0, SPREAD^2) noise (seed 0); member 0 is
    `v0` itself."""
    noise = SPREAD * np.random.default_rng(0).standard_normal((size, v0.shape[0]))
    noise[0] = 0.0
    return v0[None] + noise


# -- MuJoCo's model ----------------------------------------------------------------------


def mujoco_model(
    path: Path, integrator: str = "RK4", steps: int = 1000, energy: bool = False
) -> mujoco.MjModel:
    """MuJoCo's model of a URDF file with the dynamics the file describes.

    URDF compiler settings (MuJoCo's defaults for URDF, set explicitly): `fusestatic` (bodies
    on fixed joints merged into their parent, the fixed root into the world: fewer bodies,
    same dynamics), `discardvisual` (the `<visual>`s dropped; these files have no
    `<collision>`, so the model has no geoms); `inertiafromgeom` off (only `<inertial>`
    counts: MuJoCo's default `auto` would give a link without one the inertia of its
    geoms), no `balanceinertia`, `boundmass` or `boundinertia`. The full URDF inertia
    tensor is diagonalized by MuJoCo (`body_inertia`, `body_iquat`).

    Then: no joint limits (`jnt_limited = 0` and `mjDSBL_LIMIT`: URDF `<limit>` ranges are
    imported as limits), no contacts (`mjDSBL_CONTACT`), zero damping, armature, friction
    loss and stiffness, no actuator force ranges (URDF `effort` becomes `actfrcrange`, inert
    without actuators), no automatic reset (`mjDSBL_AUTORESET`: a diverging run gives NaN
    instead of silently restarting from `qpos0`), gravity `GRAVITY`, the `integrator` at
    step `T1 / steps`; `energy` turns on `mjENBL_ENERGY` (`data.energy`).
    """
    spec = mujoco.MjSpec.from_file(str(path))
    spec.compiler.fusestatic = True
    spec.compiler.discardvisual = True
    spec.compiler.inertiafromgeom = mujoco.mjtInertiaFromGeom.mjINERTIAFROMGEOM_FALSE
    spec.compiler.balanceinertia = False
    spec.compiler.boundmass = 0.0
    spec.compiler.boundinertia = 0.0
    model = spec.compile()
    model.jnt_limited[:] = 0
    model.jnt_actfrclimited[:] = 0
    model.jnt_stiffness[:] = 0.0
    model.dof_damping[:] = 0.0
    model.dof_armature[:] = 0.0
    model.dof_frictionloss[:] = 0.0
    model.opt.gravity[:] = GRAVITY
    model.opt.disableflags |= (
        mujoco.mjtDisableBit.mjDSBL_CONTACT
        | mujoco.mjtDisableBit.mjDSBL_LIMIT
        | mujoco.mjtDisableBit.mjDSBL_AUTORESET
    )
    if energy:
        model.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_ENERGY
    model.opt.integrator = INTEGRATORS[integrator]
    model.opt.timestep = T1 / steps
    return model


class JointMap(NamedTuple):
    """Where the URDF's joints (in `robot.joint_names` order) are in MuJoCo's vectors:
    `qpos[qpos]` and `qvel[dofs]` are the joint coordinates and rates in URDF order
    (MuJoCo numbers joints depth-first through its body tree, URDF lists them as written).
    """

    names: tuple[str, ...]
    qpos: np.ndarray
    dofs: np.ndarray
    kinds: tuple[str, ...]  # "hinge" or "slide"
    identity: bool  # MuJoCo's order is the URDF's


def joint_map(model: mujoco.MjModel, joint_names) -> JointMap:
    """The `JointMap` of `model` for the URDF's `joint_names`, matched by name
    (`mj_name2id`), after checking that MuJoCo has exactly these joints, all hinges or
    slides."""
    found = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(model.njnt)]
    if sorted(found) != sorted(joint_names):
        raise ValueError(f"MuJoCo's joints {found} are not the URDF's {list(joint_names)}")
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in joint_names]
    kinds = {int(mujoco.mjtJoint.mjJNT_HINGE): "hinge", int(mujoco.mjtJoint.mjJNT_SLIDE): "slide"}
    for n, j in zip(joint_names, ids, strict=True):
        if int(model.jnt_type[j]) not in kinds:
            raise ValueError(f"joint {n!r} is neither a hinge nor a slide in MuJoCo")
    qpos = np.array([model.jnt_qposadr[j] for j in ids])
    return JointMap(
        tuple(joint_names),
        qpos,
        np.array([model.jnt_dofadr[j] for j in ids]),
        tuple(kinds[int(model.jnt_type[j])] for j in ids),
        bool(np.array_equal(ids, np.arange(len(ids)))),
    )


def _rotation(p) -> np.ndarray:
    """The rotation matrix of Euler parameters `p = (e0, e)` (jaxdae's body orientation)."""
    e0, e = float(p[0]), np.asarray(p[1:], float)
    skew = np.array([[0.0, -e[2], e[1]], [e[2], 0.0, -e[0]], [-e[1], e[0], 0.0]])
    return (2 * e0**2 - 1) * np.eye(3) + 2 * (np.outer(e, e) + e0 * skew)


def import_check(model: mujoco.MjModel, robot: mb.UrdfRobot) -> dict:
    """MuJoCo's reading of the URDF against jaxdae's (`mb.load_urdf`, through yourdfpy) at
    zero joint coordinates: per moving body the mass, the centre of mass and the inertia
    tensor in world axes; per joint the anchor and the world axis. Returns the largest
    differences (with the same bodies and joints in both, these fix the dynamics)."""
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    frames = {"ground": (np.eye(3), np.zeros(3))}
    out = {"mass": 0.0, "com": 0.0, "inertia": 0.0, "anchor": 0.0, "axis": 0.0}
    bodies = {b.name: b for b in robot.bodies[1:]}
    for name, body in bodies.items():
        rot, pos = _rotation(np.asarray(body.orientation)), np.asarray(body.position, float)
        frames[name] = (rot, pos)
        b = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
        if b < 0:
            raise ValueError(f"body {name!r} is not in MuJoCo's model")
        tensor = rot @ np.asarray(body.inertia, float) @ rot.T
        ximat = data.ximat[b].reshape(3, 3)
        mj_tensor = ximat @ np.diag(model.body_inertia[b]) @ ximat.T
        out["mass"] = max(out["mass"], abs(float(body.mass) - model.body_mass[b]))
        out["com"] = max(out["com"], float(np.abs(pos - data.xipos[b]).max()))
        out["inertia"] = max(out["inertia"], float(np.abs(tensor - mj_tensor).max()))
    moving = sum(float(b.mass) for b in bodies.values())
    if abs(moving - model.body_mass[1:].sum()) > 1e-9 * moving:
        raise ValueError("MuJoCo's moving mass differs from the URDF's")
    for joint in robot.joints:
        if joint.name not in robot.joint_names:
            continue  # a weld
        carrier, marker = joint.a.split(".", 1)
        owner = robot.bodies[0] if carrier == "ground" else bodies[carrier]
        rot, pos = frames[carrier]
        anchor = pos + rot @ np.asarray(owner.markers[marker], float)
        axis = np.asarray(joint.axis, float)
        axis = rot @ np.asarray(owner.orientations[marker], float) @ (axis / np.linalg.norm(axis))
        j = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint.name)
        out["anchor"] = max(out["anchor"], float(np.abs(anchor - data.xanchor[j]).max()))
        out["axis"] = max(out["axis"], float(np.abs(axis - data.xaxis[j]).max()))
    out["moving_mass"] = moving
    return out


def start(model: mujoco.MjModel, data: mujoco.MjData, joints: JointMap, v0) -> None:
    """Reset `data` to zero joint coordinates and the rates `v0` (URDF order)."""
    mujoco.mj_resetData(model, data)
    data.qvel[joints.dofs] = v0


def end_state(model: mujoco.MjModel, joints: JointMap, v0, steps: int) -> np.ndarray:
    """Joint coordinates (URDF order) after `steps` steps of `model` from `v0`; NaN where
    the run diverged. The time is `steps * h`, not `data.time`, which accumulates rounding
    (1e5 steps of 1e-5 s end at 0.99999999999808)."""
    data = mujoco.MjData(model)
    start(model, data, joints, v0)
    warnings: list[str] = []  # "Nan, Inf or huge value ...": the NaN tells
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(warnings.append)
    try:
        mujoco.mj_step(model, data, nstep=steps)
    finally:
        mujoco.set_mju_user_warning(previous)
    return data.qpos[joints.qpos].copy()


def joint_error(q, q_ref) -> float:
    """`max |q - q_ref|` over the joints, `inf` for a diverged run."""
    error = float(np.abs(np.asarray(q) - q_ref).max())
    return error if np.isfinite(error) else float("inf")


# -- the reference -----------------------------------------------------------------------


class MujocoReference(NamedTuple):
    """MuJoCo's reference solution of one robot, for the jaxdae side to compare against.

    - `robot`: the robot's name; `urdf_path`: its URDF file (for the chain, a file that
        lives while the script runs).
    - `joint_names`: the joints in the URDF's order (`mb.load_urdf(urdf_path).joint_names`):
        the order of every joint vector below; `joint_kinds`: "hinge" (rad) or "slide" (m).
    - `t1`, `tolerance`, `gravity`: 1 s, 1e-6 (the joint error to reach at `t1`), (0, 0,
        -9.81).
    - `q0`, `v0`: `(n,)` joint coordinates (zero) and rates at t = 0.
    - `batch_v0`: `(B, n)` the batch's initial rates (row 0 is `v0`); its coordinates are 0.
    - `times`: `(101,)` 0 to 1 s; `q`, `v`: `(101, n)` joint coordinates and rates there.
    - `step`: the reference's RK4 step (s); `agreement`: `max |q(1)|` difference from the run
        at twice that step; `energy_drift`: its largest energy change over its largest
        kinetic energy.
    - `mujoco`: MuJoCo's results that a ratio needs: `{"integrator", "steps", "ms"}` of its
        cheapest setting to `tolerance`, `"forward_us"` (one right-hand side, rollout),
        `"batch_per_s"` (rollout, 2 threads).
    """

    robot: str
    urdf_path: Path
    joint_names: tuple[str, ...]
    joint_kinds: tuple[str, ...]
    t1: float
    tolerance: float
    gravity: tuple[float, float, float]
    q0: np.ndarray
    v0: np.ndarray
    batch_v0: np.ndarray
    times: np.ndarray
    q: np.ndarray
    v: np.ndarray
    step: float
    agreement: float
    energy_drift: float
    mujoco: dict

    def save(self, path: Path) -> None:
        """Write it as an `.npz` (strings as arrays of str, `mujoco` as JSON); read it back
        with `MujocoReference.load(path)`."""
        fields = self._asdict()
        fields["urdf_path"] = str(self.urdf_path)
        fields["mujoco"] = json.dumps(self.mujoco)
        np.savez(path, **{k: np.asarray(v) for k, v in fields.items()})

    @classmethod
    def load(cls, path: Path) -> "MujocoReference":
        """The reference that `save` wrote to `path`."""
        with np.load(path) as z:
            f = {k: z[k] for k in z.files}
        return cls(
            str(f["robot"]),
            Path(str(f["urdf_path"])),
            tuple(str(n) for n in f["joint_names"]),
            tuple(str(k) for k in f["joint_kinds"]),
            float(f["t1"]),
            float(f["tolerance"]),
            tuple(float(g) for g in f["gravity"]),
            f["q0"],
            f["v0"],
            f["batch_v0"],
            f["times"],
            f["q"],
            f["v"],
            float(f["step"]),
            float(f["agreement"]),
            float(f["energy_drift"]),
            json.loads(str(f["mujoco"])),
        )


def reference_run(path: Path, joints: JointMap, v0, steps: int):
    """MuJoCo RK4 with `steps` steps over `T1`, energy on: `(times, q, v, energy drift)` at
    `POINTS` points (URDF order). The drift is `max |E - E(0)|` over the largest kinetic
    energy, `E` = kinetic + potential (`data.energy`, evaluated by `mj_forward` at each
    point)."""
    model = mujoco_model(path, "RK4", steps, energy=True)
    data = mujoco.MjData(model)
    start(model, data, joints, v0)
    per = steps // (POINTS - 1)
    if per * (POINTS - 1) != steps:
        raise ValueError(f"{steps} steps do not split into {POINTS - 1} intervals")
    q, v, energy = [], [], []
    for k in range(POINTS):
        if k:
            mujoco.mj_step(model, data, nstep=per)
        mujoco.mj_forward(model, data)
        q.append(data.qpos[joints.qpos].copy())
        v.append(data.qvel[joints.dofs].copy())
        energy.append(data.energy.copy())
    energy = np.array(energy)
    drift = np.abs(energy.sum(1) - energy[0].sum()).max() / np.abs(energy[:, 1]).max()
    return np.linspace(0.0, T1, POINTS), np.array(q), np.array(v), float(drift)


# -- time to a joint error -----------------------------------------------------------------


def ladder(k: int) -> int:
    """Step counts over 1 s: a geometric ladder of ratio 1.25 from 10."""
    return int(np.ceil(10 * 1.25**k - 1e-9))


def steps_to_tolerance(
    path: Path, joints: JointMap, v0, q_ref, integrator: str, trial_seconds: float
) -> dict:
    """The fewest steps over 1 s on the `ladder` whose joint error at `T1` is at most
    `TOLERANCE` (the largest step h = 1/N), for MuJoCo's `integrator`.

    Climbs the ladder four rungs (x2.44) at a time until the error is met, then bisects the
    rungs in between (the error taken as decreasing with N). A trial predicted (from the
    step cost measured so far) to take more than `trial_seconds` is not run; the step count
    is then extrapolated from the last two finite errors, `N (e / TOLERANCE)^(1/p)` with the
    order `p` they show, and marked `estimated`.

    Returns `{"steps", "h", "error", "estimated", "step_us", "trials"}`.
    """
    trials: dict[int, float] = {}
    step_cost = 0.0  # s, from the longest trial so far

    def trial(k):
        nonlocal step_cost
        n = ladder(k)
        model = mujoco_model(path, integrator, n)
        began = time.perf_counter()
        trials[n] = joint_error(end_state(model, joints, v0, n), q_ref)
        if n >= max(trials):
            step_cost = (time.perf_counter() - began) / n
        return trials[n]

    k, passed = 0, None
    while passed is None:
        if step_cost and ladder(k) * step_cost > trial_seconds:
            break
        if trial(k) <= TOLERANCE:
            passed = k
        else:
            k += 4
    if passed is None:
        finite = [(n, e) for n, e in sorted(trials.items()) if np.isfinite(e) and e > 0]
        if len(finite) < 2:
            raise RuntimeError(f"{integrator}: too few finite errors to extrapolate: {trials}")
        (n1, e1), (n2, e2) = finite[-2:]
        order = np.log(e1 / e2) / np.log(n2 / n1)
        steps = int(np.ceil(n2 * (e2 / TOLERANCE) ** (1 / order)))
        return {
            "steps": steps,
            "h": T1 / steps,
            "error": None,
            "estimated": True,
            "order": float(order),
            "step_us": 1e6 * step_cost,
            "trials": trials,
        }
    low, high = passed - 4, passed  # rung `low` failed (below rung 0: none tried)
    while high - low > 1 and high > 0:
        middle = max((low + high) // 2, 0)
        if trial(middle) > TOLERANCE:
            low = middle
        else:
            high = middle
    steps = ladder(high)
    return {
        "steps": steps,
        "h": T1 / steps,
        "error": trials[steps],
        "estimated": False,
        "step_us": 1e6 * step_cost,
        "trials": trials,
    }


def timed_second(
    path: Path, joints: JointMap, v0, integrator: str, steps: int, reps: int
) -> tuple[float, float]:
    """Median wall time and median CPU time of this process (s) of
    `mj_step(model, data, nstep=steps)` (1 s of motion at `T1 / steps`; the loop over steps
    in C, one thread) over `reps` runs after a warm-up. The CPU time is the steadier figure
    on a busy machine."""
    model = mujoco_model(path, integrator, steps)
    data = mujoco.MjData(model)
    wall, cpu = [], []
    for rep in range(reps + 1):
        start(model, data, joints, v0)
        began, began_cpu = time.perf_counter(), time.process_time()
        mujoco.mj_step(model, data, nstep=steps)
        if rep:
            wall.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
    return float(np.median(wall)), float(np.median(cpu))


# -- one right-hand side -------------------------------------------------------------------


def _empty(model, data):
    """Does nothing: the Python loop and call that surround `mj_forward` when timed."""


def forward_cost(path: Path, joints: JointMap, v0, settings: Settings) -> dict:
    """The cost of one right-hand side (µs): the median over `settings.reps` of
    `settings.forward_calls` calls of `mj_forward` in a Python loop (`forward_us`), the same
    loop around an empty Python function (`empty_loop_us`), and per step inside
    `mujoco.rollout` on one thread, no Python in the loop (`rollout_euler_us`: one
    `mj_forward` and an Euler update; `rollout_rk4_quarter_us`: an RK4 step over 4), from
    the state of `v0` over 1 s (at least 1,000 steps: no divergence)."""
    nstep = max(settings.forward_calls, 1000)
    model = mujoco_model(path, "Euler", nstep)
    data = mujoco.MjData(model)
    start(model, data, joints, v0)
    mujoco.mj_forward(model, data)
    out = {}
    for key, call in (("forward_us", mujoco.mj_forward), ("empty_loop_us", _empty)):
        times = []
        for _ in range(settings.reps):
            began = time.perf_counter()
            for _ in range(settings.forward_calls):
                call(model, data)
            times.append((time.perf_counter() - began) / settings.forward_calls)
        out[key] = 1e6 * float(np.median(times))
    from mujoco import rollout

    for key, integrator, per_step in (
        ("rollout_euler_us", "Euler", 1),
        ("rollout_rk4_quarter_us", "RK4", 4),
    ):
        model = mujoco_model(path, integrator, nstep)
        data = mujoco.MjData(model)
        start(model, data, joints, v0)
        state = np.empty(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
        mujoco.mj_getState(model, data, state, mujoco.mjtState.mjSTATE_FULLPHYSICS)
        output = np.empty((1, nstep, state.shape[0]))
        times = []
        with rollout.Rollout(nthread=0) as pool:
            for rep in range(settings.reps + 1):
                began = time.perf_counter()
                pool.rollout(model, data, state[None], nstep=nstep, state=output)
                if rep:
                    times.append((time.perf_counter() - began) / nstep / per_step)
        out[key] = 1e6 * float(np.median(times))
    return out


# -- batches -------------------------------------------------------------------------------


def batch_rollout(
    path: Path, joints: JointMap, rates, integrator: str, steps: int, seconds: float, q_ref
) -> dict:
    """A batch (one trajectory per row of `rates`) over 1 s with `mujoco.rollout` on
    `THREADS` threads (a `Rollout` pool, one `MjData` per thread), in segments whose
    states fit in about 64 MB (each segment starts from the last one's end). Stops after
    the segment that passes `seconds` of wall time and scales the time to all `steps`.

    Returns `{"seconds"` (for the whole second, scaled), `"fraction"` (of the steps
    timed), `"per_s"` (trajectories per second), `"error0"` (member 0's joint error at 1
    s, when all steps ran)`}`."""
    from mujoco import rollout

    model = mujoco_model(path, integrator, steps)
    datas = [mujoco.MjData(model) for _ in range(THREADS)]
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(model, spec)
    states = np.empty((rates.shape[0], size))
    for row, v in zip(states, rates, strict=True):
        start(model, datas[0], joints, v)
        mujoco.mj_getState(model, datas[0], row, spec)
    segment = int(max(1, min(steps, 64e6 / (8 * size * rates.shape[0]))))
    output = np.empty((rates.shape[0], segment, size))
    done, elapsed = 0, 0.0
    with rollout.Rollout(nthread=THREADS) as pool:
        while done < steps and elapsed < seconds:
            n = min(segment, steps - done)
            # (A shorter last segment gets a buffer of its own: the slice `output[:, :n]`
            # is not contiguous, and the rollout's states would not land in it.)
            buffer = output if n == segment else np.empty((rates.shape[0], n, size))
            began = time.perf_counter()
            pool.rollout(model, datas, states, nstep=n, state=buffer)
            elapsed += time.perf_counter() - began
            states = np.ascontiguousarray(buffer[:, n - 1])
            done += n
    scaled = elapsed * steps / done
    qpos = 1 + joints.qpos  # the state starts with the time
    error = joint_error(states[0, qpos], q_ref) if done == steps else None
    return {
        "seconds": scaled,
        "fraction": done / steps,
        "per_s": rates.shape[0] / scaled,
        "error0": error,
    }


def _mjx_child(queue, path, joint_names, rates, integrator, steps, seconds):
    """In a child process: compile `jax.vmap(mjx.step)` in a `lax.scan` of a chunk of the
    steps (the batch split over the CPU devices, one per core), report the compile time, then run
    chunks until all `steps` ran or `seconds` passed. Puts `("compiled", s)` and then
    `("done", dict)` (or `("error", text)`) on `queue`."""
    try:
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        with contextlib.redirect_stdout(io.StringIO()):  # "Failed to import warp": not used
            from mujoco import mjx

        model = mujoco_model(path, integrator, steps)
        joints = joint_map(model, joint_names)
        device_model = mjx.put_model(model)
        blank = mjx.make_data(device_model)
        qvel = np.zeros((rates.shape[0], model.nv))
        qvel[:, joints.dofs] = rates
        batch = jax.vmap(lambda v: blank.replace(qvel=v))(jnp.asarray(qvel))
        devices = jax.device_count()
        split = None
        if rates.shape[0] % devices == 0:  # the batch split over the CPU devices (cores)
            mesh = jax.make_mesh((devices,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
            split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
            batch = jax.device_put(batch, split)
        chunk = max(d for d in range(1, 21) if steps % d == 0)

        # (The output keeps the input's sharding, also for its empty arrays, so that it
        # can be passed back in.)
        @functools.partial(jax.jit, in_shardings=split, out_shardings=split)
        def run(data):
            def step(data, _):
                return jax.vmap(mjx.step, in_axes=(None, 0))(device_model, data), None

            return jax.lax.scan(step, data, None, length=chunk)[0]

        began = time.perf_counter()
        compiled = run.lower(batch).compile()
        queue.put(("compiled", time.perf_counter() - began))
        done, elapsed, cpu = 0, 0.0, time.process_time()
        while done < steps and elapsed < seconds:
            began = time.perf_counter()
            batch = jax.block_until_ready(compiled(batch))
            elapsed += time.perf_counter() - began
            if not done:
                queue.put(("ran", elapsed))
            done += chunk
        cpu = time.process_time() - cpu
        queue.put(
            (
                "done",
                {
                    "seconds": elapsed * steps / done,
                    "fraction": done / steps,
                    "cpu_seconds": cpu * steps / done,
                    "chunk": chunk,
                    "dtype": str(batch.qpos.dtype),
                    "devices": len(batch.qpos.sharding.device_set),
                    "q0_end": np.asarray(batch.qpos[0])[joints.qpos] if done == steps else None,
                },
            )
        )
    except Exception as error:  # reported in the table, the benchmark goes on
        queue.put(("error", f"{type(error).__name__}: {error}"))


# Two CPU devices, then one: MJX's batch of the humanoid over two host devices compiled and
# then sat at no CPU for ten minutes, where one device ran.
MJX_DEVICES = (THREADS, 1)
MJX_STALL_S = 180.0  # no chunk of steps done this long after the compile: stalled


def batch_mjx(
    path: Path, joint_names, rates, integrator: str, steps: int, settings: Settings, q_ref
) -> dict:
    """`_batch_mjx` on `THREADS` CPU devices, and where that stalls (no chunk of steps done
    `MJX_STALL_S` after its compile) on one device; the note says so."""
    out = {}
    for devices in MJX_DEVICES:
        out = _batch_mjx(
            path,
            joint_names,
            rates,
            integrator,
            steps,
            settings,
            q_ref,
            devices,
            note=out.get("note", ""),
        )
        if out["seconds"] is not None or "stalled" not in out["note"]:
            break
    return out


def _batch_mjx(
    path: Path,
    joint_names,
    rates,
    integrator: str,
    steps: int,
    settings: Settings,
    q_ref,
    devices: int,
    note: str = "",
) -> dict:
    """MJX on the CPU for the batch: `_mjx_child` in a fresh process (its memory returned
    when it ends) with `devices` host devices, stopped if its compile passes
    `settings.mjx_compile_limit` or it stalls.

    Returns `{"compile_s", "seconds"` (for the whole second, scaled), `"fraction"`,
    `"per_s"`, `"dtype"`, `"error0"`, `"note"}` (`None` where it did not get there)."""
    out = {
        "compile_s": None,
        "seconds": None,
        "fraction": None,
        "per_s": None,
        "dtype": None,
        "error0": None,
        "devices": None,
        "cpu_seconds": None,
        "note": note,
    }
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(
        target=_mjx_child,
        args=(queue, path, tuple(joint_names), rates, integrator, steps, settings.mjx_seconds),
    )
    began = time.perf_counter()
    flags = os.environ["XLA_FLAGS"]
    # (The child reads the device count from the environment it is spawned with.)
    os.environ["XLA_FLAGS"] = flags.replace(
        _DEVICES, f"--xla_force_host_platform_device_count={devices}"
    )
    try:
        child.start()
    finally:
        os.environ["XLA_FLAGS"] = flags
    try:
        limit = settings.mjx_compile_limit + 60.0  # import, model transfer, tracing
        kind, value = queue.get(timeout=limit)
        if kind == "error":
            out["note"] = value
            return out
        out["compile_s"] = value
        try:
            kind, value = queue.get(timeout=MJX_STALL_S)
        except Exception:  # queue.Empty
            out["note"] += (
                f"on {devices} devices: stalled, no chunk of steps done "
                f"{MJX_STALL_S:.0f} s after its {out['compile_s']:.0f} s compile; "
            )
            return out
        if kind == "ran":
            kind, value = queue.get(timeout=8 * settings.mjx_seconds + 300.0)
        if kind == "error":
            out["note"] = value
            return out
        out.update(
            seconds=value["seconds"],
            fraction=value["fraction"],
            per_s=rates.shape[0] / value["seconds"],
            dtype=value["dtype"],
            devices=value["devices"],
            cpu_seconds=value["cpu_seconds"],
        )
        if value["q0_end"] is not None:
            out["error0"] = joint_error(value["q0_end"], q_ref)
    except Exception:  # queue.Empty: too slow
        out["note"] = (
            f"stopped after {time.perf_counter() - began:.0f} s "
            f"({'compiling' if out['compile_s'] is None else 'running'})"
        )
    finally:
        if child.is_alive():
            child.terminate()
        child.join()
    return out


MJX_NOT_RUN = {
    "compile_s": None,
    "seconds": None,
    "fraction": None,
    "per_s": None,
    "dtype": None,
    "error0": None,
    "devices": None,
    "cpu_seconds": None,
}


def mjx_skipped(name: str, settings: Settings) -> str | None:
    """Why MJX is not run for robot `name`, or `None`.

    Not in `--quick` (its compile alone takes tens of seconds). Not for the chain: with
    mujoco-mjx 3.17 on jax 0.10 (XLA CPU) the cost of MJX's forward kinematics of one
    unbatched state grows exponentially along a chain of single bodies (measured here:
    7 ms at 5 links, 32 ms at 6, 67 ms at 7, 1.3 s at 8; a 16-link chain's `mjx.step`
    took 96 s to compile and 12 s per step of a batch of 16; at 64 links a batch of 16 did
    not get through compiling and two steps in 10 min), the kind of slowdown
    jax-ml/jax#33761 reports for chains on jax >= 0.7. The humanoid (28 joints, 8 deep but
    branched) is not affected."""
    if settings is QUICK:
        return "skipped in --quick (its compile takes tens of seconds)"
    if name.startswith("chain"):
        return (
            "not run: MJX's XLA-CPU kinematics cost grows exponentially along a chain "
            "(1.3 s per forward at 8 links; see `mjx_skipped`)"
        )
    return None


# -- jaxdae ------------------------------------------------------------------------------


# jaxdae's settings tried for the time to the tolerance: (label, diffrax solver, rtol = atol)
JAXDAE_SOLVERS = ("Tsit5", "Dopri8")
JAXDAE_TOLERANCES = tuple(10.0 ** -(k / 2) for k in range(10, 25))  # 1e-5 ... 1e-12


def _median_times(fn, reps):
    """Median wall and process-CPU seconds of `fn()` (blocked until ready)."""
    walls, cpus = [], []
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), float(np.median(cpus))


def jaxdae_rhs_us(model, q, v, reps: int, loop: int = 2000) -> float:
    """µs of one right-hand side of `model` under `Unstabilized` (`state_rates` as
    `simulate` evaluates it: the scalar graph where it applies) inside one compiled
    `lax.fori_loop`, from the state `(q, v)`."""
    rates, formulation, n = scalarize(state_rates), jaxdae.Unstabilized(), q.shape[0]

    def rhs(y):
        return jnp.concatenate(rates(model, formulation, 0.3, y[:n], y[n:]))

    run = jax.jit(lambda y: jax.lax.fori_loop(0, loop, lambda i, y: y + 1e-9 * rhs(y), y))
    y = jnp.concatenate([jnp.asarray(q), jnp.asarray(v)])
    jax.block_until_ready(run(y))
    return 1e6 * _median_times(lambda: run(y), reps)[0] / loop


def jaxdae_rows(
    robot_name: str,
    urdf_path: Path,
    mujoco_reference: MujocoReference,
    reps: int = 5,
    batch: int | None = None,
):
    """jaxdae's side for one robot: `load_urdf(urdf_path).mechanism()` (the joint-coordinate
    `TreeMechanism`, gravity, no limits), float64, CPU, from MuJoCo's start.

    - `"time_to_tolerance"`: for Tsit5 and Dopri8 (diffrax), the loosest `rtol = atol` on the
      ladder 1e-5, 3.2e-6, ... whose `max |q(1) − q_MuJoCo(1)|` is at most the tolerance;
      the cheaper of the two by the median wall time of the solve compiled once
      (`eqx.filter_jit` around `jaxdae.simulate`, the tolerances traced), compile excluded;
      and the same solve called eagerly (`jaxdae.simulate` with its input checks and
      `Solution` assembly in Python, `eager_ms`).
    - `"rhs_us"`: one right-hand side (`state_rates` as `simulate` evaluates it: the
      scalar graph where it applies) inside one compiled `lax.fori_loop`.
    - `"batch"`: `jaxdae.simulate_ensemble` of the batch's rates at that setting, compiled
      apart; trajectories per second and member 0's error.
    """
    del robot_name
    ref = mujoco_reference
    model = mb.load_urdf(urdf_path).mechanism(forces=[mb.Gravity(GRAVITY)], limits=False)
    formulation = jaxdae.Unstabilized()
    q0, v0 = jnp.asarray(ref.q0), jnp.asarray(ref.v0)
    q_ref = np.asarray(ref.q[-1])
    solvers = {"Tsit5": diffrax.Tsit5(), "Dopri8": diffrax.Dopri8()}

    @eqx.filter_jit
    def solve(model, solver, tolerance, q0, v0):
        controller = diffrax.PIDController(rtol=tolerance, atol=tolerance)
        sol = jaxdae.simulate(
            model, formulation, 0.0, T1, q0, v0, solver=solver, stepsize_controller=controller
        )
        return sol.q_final, sol.stats["num_steps"]

    found, compile_s = {}, {}
    for label in JAXDAE_SOLVERS:
        for tolerance in JAXDAE_TOLERANCES:
            traced = jnp.asarray(tolerance)
            began = time.perf_counter()
            q1, steps = jax.block_until_ready(solve(model, solvers[label], traced, q0, v0))
            compile_s.setdefault(label, time.perf_counter() - began)  # the first call
            error = joint_error(np.asarray(q1), q_ref)
            if error <= ref.tolerance:
                wall, cpu = _median_times(
                    lambda s=solvers[label], tol=traced: solve(model, s, tol, q0, v0)[0], reps
                )
                found[label] = {
                    "setting": f"{label}, rtol = atol = {tolerance:.1e}",
                    "steps": int(steps),
                    "error": error,
                    "ms": 1e3 * wall,
                    "cpu_ms": 1e3 * cpu,
                    "solver": label,
                    "tolerance": tolerance,
                    "compile_s": compile_s[label],
                }
                break
    best = min(found.values(), key=lambda r: r["ms"]) if found else None
    if best is not None:
        tolerance = best["tolerance"]

        def eager():
            return jaxdae.simulate(
                model,
                formulation,
                0.0,
                T1,
                q0,
                v0,
                solver=solvers[best["solver"]],
                rtol=tolerance,
                atol=tolerance,
            ).q_final

        eager()
        best["eager_ms"] = 1e3 * _median_times(eager, reps)[0]
    middle = len(ref.times) // 2
    rhs_us = jaxdae_rhs_us(model, ref.q[middle], ref.v[middle], reps)
    rows = {
        "time_to_tolerance": best,
        "rhs_us": rhs_us,
        "fixed_steps": fixed_steps_to_tolerance(
            model, formulation, solvers, q0, v0, q_ref, ref.tolerance, reps
        ),
    }
    if best is None:
        return rows
    if batch is None and q0.shape[0] > 32:
        batch = 128  # a long chain: the rate of a smaller batch (shared steps, as the full)
    rates0 = jnp.asarray(ref.batch_v0 if batch is None else ref.batch_v0[:batch])
    positions = jnp.zeros_like(rates0)

    @eqx.filter_jit
    def ensemble(model, positions, rates0):
        return jaxdae.simulate_ensemble(
            model,
            formulation,
            0.0,
            T1,
            positions,
            rates0,
            solver=solvers[best["solver"]],
            rtol=best["tolerance"],
            atol=best["tolerance"],
        ).q_final

    began = time.perf_counter()
    q1 = jax.block_until_ready(ensemble(model, positions, rates0))
    compile_s = time.perf_counter() - began
    wall = _median_times(lambda: ensemble(model, positions, rates0), max(1, reps // 2))[0]
    rows["batch"] = {
        "compile_s": compile_s,
        "per_s": rates0.shape[0] / wall,
        "error0": joint_error(np.asarray(q1[0]), q_ref),
        "size": rates0.shape[0],
    }
    adaptive = {
        "solver": solvers[best["solver"]],
        "rtol": best["tolerance"],
        "atol": best["tolerance"],
    }
    rows["batch_devices"] = jaxdae_devices_batch(
        model, formulation, adaptive, rates0, q_ref, reps, "ensemble", batch_chunk(model)
    )
    fixed = rows["fixed_steps"]
    if fixed is not None:
        settings = {
            "solver": solvers[fixed["solver"]],
            "stepsize_controller": diffrax.ConstantStepSize(),
            "dt0": T1 / fixed["steps"],
        }
        rows["batch_fixed"] = [
            dict(
                jaxdae_devices_batch(model, formulation, settings, rates0, q_ref, reps, *layout),
                setting=f"{fixed['solver']}, {fixed['steps']} fixed steps",
            )
            for layout in batch_layouts(model)
        ]
        rows["batch_fixed_error"] = batch_error(model, formulation, settings, rates0)
    return rows


def fixed_steps_to_tolerance(
    model, formulation, solvers, q0, v0, q_ref, tolerance, reps
) -> dict | None:
    """The cheapest fixed-step setting of jaxdae to `tolerance`: for each solver, the fewest
    steps over 1 s on `ladder` whose joint error at `T1` against MuJoCo's reference is at
    most `tolerance` (the criterion of MuJoCo's own step), timed as `jaxdae_rows` times the
    adaptive setting (compiled once, the step traced, median of `reps`); the solver's
    `{"solver", "steps", "error", "ms", "cpu_ms"}` that takes the less CPU time (steadier
    than the wall time on a shared machine; None: no rung up to 2,000 steps)."""

    @eqx.filter_jit
    def solve(model, solver, dt, q0, v0):
        return jaxdae.simulate(
            model,
            formulation,
            0.0,
            T1,
            q0,
            v0,
            solver=solver,
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=dt,
            throw=False,
        ).q_final

    found = []
    for label, solver in solvers.items():
        for k in range(40):
            steps = ladder(k)
            if steps > 2000:
                break
            dt = jnp.asarray(T1 / steps)
            error = joint_error(np.asarray(solve(model, solver, dt, q0, v0)), q_ref)
            if error <= tolerance:
                wall, cpu = _median_times(lambda s=solver, dt=dt: solve(model, s, dt, q0, v0), reps)
                found.append(
                    {
                        "solver": label,
                        "steps": steps,
                        "error": error,
                        "ms": 1e3 * wall,
                        "cpu_ms": 1e3 * cpu,
                    }
                )
                break
    return min(found, key=lambda r: r["cpu_ms"]) if found else None


def batch_error(model, formulation, settings: dict, rates0, members: int = 8) -> float:
    """The largest joint error at `T1` over the batch's first `members` trajectories at the
    batch's `settings`, against jaxdae's Dopri8 at `rtol = atol = 1e-12` (member 0 of which
    is checked against MuJoCo's reference by `jaxdae_rows`): the perturbed members' error at
    the step chosen on member 0."""

    def end(positions, rates, **options):
        return jax.vmap(
            lambda q, v: (
                jaxdae.simulate(model, formulation, 0.0, T1, q, v, throw=False, **options).q_final
            )
        )(positions, rates)

    rates = rates0[:members]
    positions = jnp.zeros_like(rates)
    reference = jax.jit(functools.partial(end, solver=diffrax.Dopri8(), rtol=1e-12, atol=1e-12))(
        positions, rates
    )
    return float(
        jnp.max(jnp.abs(jax.jit(functools.partial(end, **settings))(positions, rates) - reference))
    )


def batch_chunk(model) -> int | None:
    """Trajectories per ensemble on each device for `jaxdae_devices_batch`: the device's
    whole share where the right-hand side is one scalar graph (its batch is elementwise
    over the trajectories, and a larger ensemble spreads the step's own work further), else
    `ARRAY_FORM_CHUNK`."""
    return None if len(model.coordinate_names) <= ARRAY_FORM_CHUNK_MAX else ARRAY_FORM_CHUNK


# An array-form right-hand side's batch works on arrays whose size grows with the batch
# (about 10 kB per trajectory for the humanoid): ensembles of 8 keep them in the cache, and
# each takes only the steps its own 8 trajectories need.
ARRAY_FORM_CHUNK = 8
ARRAY_FORM_CHUNK_MAX = 8  # coordinates; the arm's (4) right-hand side is a scalar graph


def batch_layouts(model) -> list[tuple[str, int | None]]:
    """The ways `jaxdae_devices_batch` splits a fixed-step batch, each measured: ensembles
    of `batch_chunk(model)` trajectories, and one trajectory at a time (`jaxdae.simulate`
    under `jax.lax.map`: no batch axis, so an array-form right-hand side keeps one
    trajectory's arrays, and a trajectory costs what it costs alone)."""
    return [("ensemble", batch_chunk(model)), ("map", 1)]


def jaxdae_devices_batch(
    model,
    formulation,
    options: dict,
    rates0,
    q_ref,
    reps,
    layout: str = "ensemble",
    chunk: int | None = None,
) -> dict:
    """The batch as a user splits it over the CPU devices (one per core), with the solve's
    keyword arguments `options`: `layout="ensemble"`:
    `jaxdae.batch_map(run, q0, v0, ensemble=True, mesh=mesh, chunk_size=chunk)`, `run` a
    `jaxdae.simulate_ensemble` of the chunk; `layout="map"`: `jaxdae.batch_map(run, q0, v0,
    mesh=mesh, chunk_size=chunk)`, `run` a `jaxdae.simulate` of one row. Trajectories per
    second (compile apart), wall and process CPU time (medians) and member 0's joint
    error."""
    devices = jax.device_count()
    mesh = jax.make_mesh((devices,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    simulate = jaxdae.simulate_ensemble if layout == "ensemble" else jaxdae.simulate

    def run(positions, rates0):
        return simulate(
            model, formulation, 0.0, T1, positions, rates0, throw=False, **options
        ).q_final

    def batch():
        return jaxdae.batch_map(
            run,
            jnp.zeros_like(rates0),
            rates0,
            chunk_size=chunk,
            mesh=mesh,
            ensemble=layout == "ensemble",
        )

    began = time.perf_counter()
    q1 = jax.block_until_ready(batch())
    compile_s = time.perf_counter() - began
    wall, cpu = _median_times(batch, max(1, (reps + 1) // 2))
    return {
        "compile_s": compile_s,
        "per_s": rates0.shape[0] / wall,
        "cpu_s": cpu,
        "wall_s": wall,
        "error0": joint_error(np.asarray(q1[0]), q_ref),
        "devices": devices,
        "chunk": chunk,
        "layout": layout,
        "size": rates0.shape[0],
    }


# -- the cost against the length of a chain -------------------------------------------------

CHAIN_LENGTHS = (8, 16, 32, 64)


def chain_scaling(folder: Path, lengths, reps: int) -> list[dict]:
    """One right-hand side against the number of links of `chain_urdf(n)`: MuJoCo's
    `mj_forward` inside `mujoco.rollout` (Euler steps, one thread) and jaxdae's
    (`state_rates` of the `TreeMechanism` in a compiled loop), µs."""
    rows = []
    settings = FULL._replace(reps=reps, forward_calls=1000)
    for n in lengths:
        path = folder / f"chain{n}.urdf"
        path.write_text(chain_urdf(n))
        robot = mb.load_urdf(path)
        model = mujoco_model(path)
        joints = joint_map(model, robot.joint_names)
        v0 = initial_rates(n)
        mujoco_us = forward_cost(path, joints, v0, settings)["rollout_euler_us"]
        tree = robot.mechanism(forces=[mb.Gravity(GRAVITY)], limits=False)
        jaxdae_us = jaxdae_rhs_us(tree, np.full(n, 0.1), v0, reps, loop=1000)
        rows.append({"links": n, "mujoco_us": mujoco_us, "jaxdae_us": jaxdae_us})
        print(f"  chain of {n}: done", flush=True)
    return rows


# -- tables --------------------------------------------------------------------------------


def _f(value, spec: str) -> str:
    return DASH if value is None else format(value, spec)


def _part(rows, key):
    return rows.get(key) if isinstance(rows, dict) else None


def run_robot(name: str, path: Path, settings: Settings, out: Path) -> dict:
    """Every MuJoCo measurement of one robot, then jaxdae's (`jaxdae_rows`)."""
    robot = mb.load_urdf(path)
    model = mujoco_model(path)
    joints = joint_map(model, robot.joint_names)
    check = import_check(model, robot)
    n = len(robot.joint_names)
    v0 = initial_rates(n)
    fine, finer = settings.reference_steps
    _, q_check, _, _ = reference_run(path, joints, v0, fine)
    times, q, v, drift = reference_run(path, joints, v0, finer)
    agreement = joint_error(q_check[-1], q[-1])
    print(f"  {name}: reference done", flush=True)
    ladders = {}
    for integrator in INTEGRATORS:
        found = steps_to_tolerance(path, joints, v0, q[-1], integrator, settings.trial_seconds)
        if found["estimated"]:
            found["ms"] = found["steps"] * found["step_us"] / 1e3
            found["cpu_ms"] = None
        else:
            wall, cpu = timed_second(path, joints, v0, integrator, found["steps"], settings.reps)
            found["ms"], found["cpu_ms"] = 1e3 * wall, 1e3 * cpu
        ladders[integrator] = found
    cheapest = min(
        (k for k in ladders if not ladders[k]["estimated"]), key=lambda k: ladders[k]["ms"]
    )
    steps = ladders[cheapest]["steps"]
    print(f"  {name}: ladders done", flush=True)
    rhs = forward_cost(path, joints, v0, settings)
    rates = batch_rates(v0, settings.batch)
    rolled = batch_rollout(path, joints, rates, cheapest, steps, settings.batch_seconds, q[-1])
    print(f"  {name}: rollout done", flush=True)
    skip = mjx_skipped(name, settings)
    device = (
        batch_mjx(path, robot.joint_names, rates, cheapest, steps, settings, q[-1])
        if skip is None
        else dict(MJX_NOT_RUN, note=skip)
    )
    print(f"  {name}: MJX done", flush=True)
    reference = MujocoReference(
        name,
        path,
        tuple(robot.joint_names),
        joints.kinds,
        T1,
        TOLERANCE,
        GRAVITY,
        np.zeros(n),
        v0,
        rates,
        times,
        q,
        v,
        T1 / finer,
        agreement,
        drift,
        {
            "integrator": cheapest,
            "steps": steps,
            "ms": ladders[cheapest]["ms"],
            "forward_us": rhs["rollout_euler_us"],
            "batch_per_s": rolled["per_s"],
        },
    )
    reference.save(out / f"reference_{name}.npz")
    return {
        "robot": name,
        "urdf": str(path),
        "joints": n,
        "bodies": int(model.nbody - 1),
        "joint_order_identity": joints.identity,
        "import_check": check,
        "reference": {"steps": [fine, finer], "agreement": agreement, "energy_drift": drift},
        "ladders": ladders,
        "cheapest": cheapest,
        "steps": steps,
        "rhs": rhs,
        "rollout": rolled,
        "mjx": device,
        "jaxdae": jaxdae_rows(name, path, reference, settings.reps),
    }


def print_tables(results: list[dict], settings: Settings) -> None:
    """The Markdown tables of all robots."""
    print("\n### Robots and MuJoCo's import\n")
    print(
        "| robot | joints | MuJoCo bodies | moving mass [kg] | joint order = URDF's | "
        "max Δ mass / COM / inertia / anchor / axis vs jaxdae's URDF | "
        "reference h, 2h agree to | energy drift |"
    )
    print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for r in results:
        c, ref = r["import_check"], r["reference"]
        print(
            f"| {r['robot']} | {r['joints']} | {r['bodies']} | {c['moving_mass']:.2f} | "
            f"{'yes' if r['joint_order_identity'] else 'no (mapped)'} | "
            f"{c['mass']:.0e} / {c['com']:.0e} / {c['inertia']:.0e} / {c['anchor']:.0e} / "
            f"{c['axis']:.0e} | {ref['agreement']:.1e} | {ref['energy_drift']:.1e} |"
        )
    print(
        f"\nreference: RK4, h = {T1 / settings.reference_steps[1]:.2g} s, checked against "
        f"h = {T1 / settings.reference_steps[0]:.2g} s at t = 1 s (max |Δq|); drift: max "
        "|E − E(0)| / max kinetic energy over the reference run."
    )
    print(f"\n### Time to a joint error of {TOLERANCE:.0e} after {T1:.0f} s (wall clock)\n")
    print("| robot | solver | h [s] | steps | max abs Δq(1) | ms per simulated s | CPU ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        for integrator, found in r["ladders"].items():
            mark = " (cheapest)" if integrator == r["cheapest"] else ""
            est = " est." if found["estimated"] else ""
            error = (
                f"≤ {TOLERANCE:.0e} (p = {found['order']:.2f})"
                if found["estimated"]
                else f"{found['error']:.2e}"
            )
            print(
                f"| {r['robot']} | MuJoCo {integrator}{mark} | {found['h']:.3g}{est} | "
                f"{found['steps']:,}{est} | {error} | {found['ms']:.3g}{est} | "
                f"{_f(found['cpu_ms'], '.3g')} |"
            )
        tt = _part(r["jaxdae"], "time_to_tolerance") or {}
        h = T1 / tt["steps"] if tt.get("steps") else None
        solver = f"jaxdae {tt.get('setting', '')}".strip()
        print(
            f"| {r['robot']} | {solver} | {_f(h, '.3g')} | "
            f"{_f(tt.get('steps'), ',')} | {_f(tt.get('error'), '.2e')} | "
            f"{_f(tt.get('ms'), '.3g')} | {_f(tt.get('cpu_ms'), '.3g')} |"
        )
        fixed = _part(r["jaxdae"], "fixed_steps")
        if fixed:
            print(
                f"| {r['robot']} | jaxdae {fixed['solver']}, fixed steps | "
                f"{T1 / fixed['steps']:.3g} | {fixed['steps']:,} | {fixed['error']:.2e} | "
                f"{fixed['ms']:.3g} | {fixed['cpu_ms']:.3g} |"
            )
        if tt.get("eager_ms") is not None:
            print(
                f"| {r['robot']} | jaxdae, the same called eagerly | | | | {tt['eager_ms']:.3g} | |"
            )
            print(
                f"| {r['robot']} | jaxdae, compile and first call of the solve | | | | "
                f"{1e3 * tt['compile_s']:.4g} | |"
            )
    print(
        "\njaxdae: `jaxdae.simulate` of the `TreeMechanism` compiled once with "
        '`eqx.filter_jit` (the tolerances traced), compile excluded; "called eagerly": '
        "`jaxdae.simulate` from Python, with its input checks and `Solution` assembly."
    )
    print(
        "\nMuJoCo: `mj_step(model, data, nstep=N)`, median wall (and CPU) time of "
        f"{settings.reps}; est.: beyond the trial budget, N extrapolated from the last two "
        "trials' order p and the time from the measured step cost. Euler and implicitfast "
        "coincide here (no damping, no actuators: implicitfast has nothing to treat "
        "implicitly)."
    )
    print("\n### One right-hand side [µs]\n")
    print(
        "| robot | mj_forward, Python loop | empty Python loop | mj_forward − loop | "
        "rollout Euler step | rollout RK4 step / 4 | jaxdae |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        h = r["rhs"]
        print(
            f"| {r['robot']} | {h['forward_us']:.2f} | {h['empty_loop_us']:.2f} | "
            f"{h['forward_us'] - h['empty_loop_us']:.2f} | {h['rollout_euler_us']:.2f} | "
            f"{h['rollout_rk4_quarter_us']:.2f} | {_f(_part(r['jaxdae'], 'rhs_us'), '.2f')} |"
        )
    print(
        f"\n### Batch of {settings.batch:,} over {T1:.0f} s on the CPU ({os.cpu_count()} cores)\n"
    )
    print(
        "| robot | integrator, steps | MuJoCo rollout, 2 threads [traj/s] | MJX compile [s] | "
        "MJX [traj/s] | MJX member 0 Δq(1) | jaxdae compile [s] | jaxdae [traj/s] | "
        "jaxdae over the devices: chunk, compile [s] | [traj/s] | member 0 Δq(1) | "
        "/ MJX |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    notes = []
    for r in results:
        ro, mx = r["rollout"], r["mjx"]
        jb = _part(r["jaxdae"], "batch") or {}
        jd = _part(r["jaxdae"], "batch_devices") or {}
        ro_text = f"{ro['per_s']:.3g}" + (
            f" ({ro['fraction']:.0%} timed)" if ro["fraction"] < 1 else ""
        )
        mx_text = _f(mx["per_s"], ".3g") + (
            f" ({mx['fraction']:.0%} timed)" if mx["fraction"] and mx["fraction"] < 1 else ""
        )
        print(
            f"| {r['robot']} | {r['cheapest']}, {r['steps']:,} | {ro_text} | "
            f"{_f(mx['compile_s'], '.1f')} | {mx_text} | {_f(mx['error0'], '.1e')} | "
            f"{_f(jb.get('compile_s'), '.1f')} | {_f(jb.get('per_s'), '.3g')}"
            + (
                f" (batch of {jb['size']})"
                if jb.get("size", settings.batch) < settings.batch
                else ""
            )
            + f" | {_f(jd.get('chunk'), 'd') if jd else DASH}, "
            f"{_f(jd.get('compile_s'), '.1f')} | {_f(jd.get('per_s'), '.3g')} | "
            f"{_f(jd.get('error0'), '.1e')} | "
            f"{_f(jd['per_s'] / mx['per_s'] if jd and mx['per_s'] else None, '.1f')} |"
        )
        if jd:
            notes.append(
                f"{r['robot']}: jaxdae over {jd['devices']} devices, chunks of "
                f"{jd['chunk'] or 'the whole share'}: {jd['cpu_s']:.3g} s of CPU for "
                f"{jd['wall_s']:.3g} s of wall time"
            )
        if mx.get("devices"):
            notes.append(
                f"{r['robot']}: MJX's batch split over {mx['devices']} CPU devices, "
                f"{_f(mx.get('cpu_seconds'), '.3g')} s of CPU (the child process's, "
                "scaled as its time)"
            )
        if mx["note"]:
            notes.append(f"{r['robot']}: MJX {mx['note']}")
        if mx["dtype"]:
            notes.append(f"{r['robot']}: MJX ran in {mx['dtype']} (jax_enable_x64 on)")
    print(
        "\nRates perturbed by N(0, 0.1²), member 0 unperturbed; where a fraction is "
        "given, the time of that fraction of the steps was scaled to all of them."
    )
    for note in notes:
        print(f"- {note}")
    print(f"\n### jaxdae's batch of {settings.batch:,} at fixed steps, over the devices\n")
    print(
        "| robot | setting | layout, chunk | compile [s] | [traj/s] | wall [s] | CPU [s] | "
        "member 0 Δq(1) | max Δq(1), members 0–7 | / MJX | / MuJoCo rollout |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        mx, ro = r["mjx"], r["rollout"]
        spread = _part(r["jaxdae"], "batch_fixed_error")
        for b in _part(r["jaxdae"], "batch_fixed") or []:
            print(
                f"| {r['robot']} | {b['setting']} | {b['layout']}, "
                f"{b['chunk'] or 'whole share'} | {b['compile_s']:.1f} | {b['per_s']:.4g} | "
                f"{b['wall_s']:.3g} | {b['cpu_s']:.3g} | {b['error0']:.1e} | "
                f"{_f(spread, '.1e')} | "
                f"{_f(b['per_s'] / mx['per_s'] if mx['per_s'] else None, '.1f')} | "
                f"{b['per_s'] / ro['per_s']:.1f} |"
            )
    print(
        "\nFixed steps: the fewest on the ladder whose member 0 reaches the joint error "
        '(MuJoCo\'s criterion for its step); "map": `jaxdae.simulate` of one row at a '
        'time (`batch_map` without `ensemble`); "ensemble": `simulate_ensemble` of each '
        "chunk. Members 0–7 against jaxdae's Dopri8 at rtol = atol = 1e-12."
    )


# -- the page's tables -------------------------------------------------------------------


def _tol(tolerance: float) -> str:
    """`1e-5` for 1e-05."""
    mantissa, exponent = format(tolerance, ".0e").split("e")
    return f"{mantissa}e{int(exponent)}"


def _rate(per_s: float) -> str:
    return f"{per_s:,.0f}" if per_s >= 1000 else f"{per_s:.4g}"


TIME_COLUMNS = [
    ("robot", "left"),
    ("MuJoCo", "left"),
    ("ms", "right"),
    ("jaxdae", "left"),
    ("ms", "right"),
    ("ratio", "right"),
    ("`simulate` called eagerly [ms]", "right"),
    ("compile and first call [s]", "right"),
]
RHS_COLUMNS = [("robot", "left"), ("MuJoCo", "right"), ("jaxdae", "right"), ("ratio", "right")]
CHAIN_COLUMNS = [
    ("links", "right"),
    ("MuJoCo", "right"),
    ("per link", "right"),
    ("jaxdae", "right"),
    ("per link", "right"),
]
BATCH_COLUMNS = [
    ("robot", "left"),
    ("MuJoCo: steps", "left"),
    ("rollout, 2 threads", "right"),
    ("MJX", "right"),
    ("jaxdae: setting, layout", "left"),
    ("traj/s", "right"),
    ("CPU [s]", "right"),
    ("/ MJX", "right"),
    ("/ rollout", "right"),
    ("compile [s]", "right"),
]


def time_rows(results: list[dict]) -> list[list[str]]:
    """Time to the joint error: MuJoCo's cheapest fixed step against jaxdae's cheapest
    setting, compiled; jaxdae called eagerly; its compile and first call."""
    rows = []
    for r in results:
        found = r["ladders"][r["cheapest"]]
        tt = _part(r["jaxdae"], "time_to_tolerance") or {}
        mujoco_ms = found["ms"]
        rows.append(
            [
                r["robot"],
                f"{r['cheapest']}, h = {1e3 * found['h']:.3g} ms, {found['steps']:,} steps",
                f"{mujoco_ms:.3g}",
                f"{tt['solver']}, {_tol(tt['tolerance'])}, {tt['steps']} steps" if tt else DASH,
                _f(tt.get("ms"), ".3g"),
                _f(tt["ms"] / mujoco_ms if tt else None, ".2f"),
                _f(tt.get("eager_ms"), ".3g"),
                _f(tt.get("compile_s"), ".1f"),
            ]
        )
    return rows


def rhs_rows(results: list[dict]) -> list[list[str]]:
    """One right-hand side: MuJoCo's `mj_forward` inside the rollout's Euler step, jaxdae's
    in a compiled loop [µs]."""
    rows = []
    for r in results:
        theirs, ours = r["rhs"]["rollout_euler_us"], _part(r["jaxdae"], "rhs_us")
        ratio = None if ours is None else ours / theirs
        rows.append([r["robot"], f"{theirs:.3g}", _f(ours, ".3g"), _f(ratio, ".2f")])
    return rows


def chain_rows(chains: list[dict]) -> list[list[str]]:
    return [
        [
            f"{c['links']}",
            f"{c['mujoco_us']:.3g}",
            f"{c['mujoco_us'] / c['links']:.2f}",
            f"{c['jaxdae_us']:.3g}",
            f"{c['jaxdae_us'] / c['links']:.2f}",
        ]
        for c in chains
    ]


def _layout(b: dict) -> str:
    if b["layout"] == "map":
        return "one trajectory at a time"
    return f"ensembles of {b['chunk']}" if b["chunk"] else "one ensemble per device"


def batch_rows(results: list[dict]) -> list[list[str]]:
    """The batch: MuJoCo's rollout and MJX at RK4's step; jaxdae at fixed steps in each
    layout over the devices (the fastest in bold), at its adaptive setting over the
    devices, and as one ensemble on one device."""
    rows = []
    for r in results:
        ro, mx = r["rollout"], r["mjx"]
        devices = mx.get("devices") or 1
        mjx_text = (
            f"{mx['per_s']:.3g} ({'one device' if devices == 1 else f'{devices} devices'})"
            if mx["per_s"]
            else "not run"
        )
        tt = _part(r["jaxdae"], "time_to_tolerance") or {}
        adaptive = f"{tt.get('solver', '')}, rtol = atol = {_tol(tt.get('tolerance', 0.0))}"
        fixed = _part(r["jaxdae"], "batch_fixed") or []
        runs = [
            (f"{b['setting'] if i == 0 else 'the same'}, {_layout(b)}", b)
            for i, b in enumerate(fixed)
        ]
        jd = _part(r["jaxdae"], "batch_devices")
        if jd:
            runs.append((f"{adaptive} (adaptive), {_layout(jd)}", jd))
        jb = _part(r["jaxdae"], "batch")
        if jb:
            runs.append(
                ("the same, one ensemble on one device, the model an argument of `jax.jit`", jb)
            )
        fastest = max((b["per_s"] for _, b in runs), default=None)
        for i, (label, b) in enumerate(runs):
            over_mjx = b["per_s"] / mx["per_s"] if mx["per_s"] else None
            bold = "**" if b["per_s"] == fastest else ""
            rows.append(
                [
                    r["robot"],
                    f"{r['cheapest']} {r['steps']:,}" if i == 0 else "",
                    f"{ro['per_s']:.3g}" if i == 0 else "",
                    mjx_text if i == 0 else "",
                    label,
                    f"{bold}{_rate(b['per_s'])}{bold}",
                    _f(b.get("cpu_s"), ".2g"),
                    f"{bold}{_f(over_mjx, '.3g')}{bold}" if over_mjx else DASH,
                    f"{b['per_s'] / ro['per_s']:.2g}",
                    f"{b['compile_s']:.1f}",
                ]
            )
    return rows


def page_tables(results: list[dict], chains: list[dict], stamp: dict) -> list[dict]:
    tables = []
    if results:
        tables += [
            table(f"{NAME}.time-to-error", TIME_COLUMNS, time_rows(results), stamp),
            table(f"{NAME}.rhs", RHS_COLUMNS, rhs_rows(results), stamp),
            table(f"{NAME}.batch", BATCH_COLUMNS, batch_rows(results), stamp),
        ]
    if chains:
        tables.append(table(f"{NAME}.chain", CHAIN_COLUMNS, chain_rows(chains), stamp))
    return tables


def main():
    args, out, began, load = start_run(NAME, __doc__.splitlines()[0], only=True)
    stamp = run_stamp()
    settings = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory() as folder:
        files = selected(robot_files(Path(folder), args.quick), args.only)
        results = [run_robot(name, path, settings, out) for name, path in files.items()]
        # (`--only` without the chain leaves out the chain's scaling too.)
        chains = (
            chain_scaling(
                Path(folder), CHAIN_LENGTHS[:2] if args.quick else CHAIN_LENGTHS, settings.reps
            )
            if any(k.startswith("chain") for k in files)
            else []
        )
    print_tables(results, settings)
    print("\n### One right-hand side against the length of a chain [µs]\n")
    print("| links | MuJoCo (rollout Euler step) | per link | jaxdae | per link |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for row in chains:
        n = row["links"]
        print(
            f"| {n} | {row['mujoco_us']:.2f} | {row['mujoco_us'] / n:.3f} | "
            f"{row['jaxdae_us']:.2f} | {row['jaxdae_us'] / n:.3f} |"
        )
    total = time.perf_counter() - began
    print(
        f"\ntotal {total:.0f} s; load average at the start {load:.1f} "
        f"(a shared machine: wall times include others' work)"
    )
    write_json(
        out / f"{NAME}.json",
        {
            "results": results,
            "chains": chains,
            "quick": args.quick,
            "settings": settings._asdict(),
            "seconds": total,
            "load_average": load,
            "mujoco": mujoco.__version__,
            "jax": jax.__version__,
        },
    )
    print(f"wrote {out / (NAME + '.json')} and the reference_<robot>.npz files")
    tables = page_tables(results, chains, stamp)
    for data in tables:
        print("\n" + render(data))
    print("wrote", write(args.out, NAME, tables))


if __name__ == "__main__":
    main()
