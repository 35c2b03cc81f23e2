"""A quadruped (pybullet_data's Unitree A1) dropped onto the ground in its stand pose and
standing under joint PD control, simulated by jaxdae's time stepping, MuJoCo and pybullet.

The robot is read with `jaxdae.multibody.load_urdf(..., fixed_base=False)`: a free trunk
and twelve revolute joints, each held by a `JointSpringDamper` (60 N m/rad, 3 N m s/rad)
at the stand pose (hip 0, upper 0.8, lower −1.6 rad), with gravity and frictional point
contacts (μ = 0.8) at the four foot spheres (radius 0.02 m). It starts at rest with its
URDF base frame 0.45 m above the ground and is simulated for 2 s by
`jaxdae.TimeStepping(dt=1e-3)` (a Moreau–Jean / Anitescu step with a Coulomb cone per
contact), by MuJoCo on the model `_mjcf.mjcf` writes from the same jaxdae model (elliptic
cones, semi-implicit Euler, the same step, MuJoCo's default soft contacts; its masses,
centre of mass and mass matrix are checked against jaxdae's first) and by pybullet on the
URDF file (the same step, the same PD law as explicit torques). jaxdae's total vertical
foot force is that of the whole robot's momentum, `Σ F_z = (p_z⁺ − p_z)/h + m g` per
step; MuJoCo's and pybullet's are their contact forces. `--quick` runs 0.6 s.
A peer that is not installed is skipped with a message.

    python experiments/examples/quadruped_drop.py [--out output] [--quick]
    # writes OUT/quadruped_drop/quadruped_drop.png, quadruped_drop.json and
    # quadruped_drop.html (the landing in the 3-D viewer)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
import jaxdae.multibody as mb
import jaxdae.viz

jax.config.update("jax_enable_x64", True)

STAND = {"hip": 0.0, "upper": 0.8, "lower": -1.6}
FEET = ("FR_toe", "FL_toe", "RR_toe", "RL_toe")
HEIGHT = 0.45  # m: the URDF base frame's height at the start
STIFFNESS, DAMPING, FRICTION = 60.0, 3.0, 0.8
DT = 1e-3
GRAVITY = 9.81
LANDED = 0.1  # landing: the total foot force first exceeds this fraction of the weight


def urdf_path() -> Path | None:
    """pybullet_data's `a1/a1.urdf` (`None` where pybullet is not installed)."""
    try:
        import pybullet_data
    except ImportError:
        return None
    return Path(pybullet_data.getDataPath()) / "a1" / "a1.urdf"


def quadruped(path: Path) -> tuple[mb.TreeMechanism, mb.UrdfRobot]:
    """The A1 as a jaxdae `TreeMechanism`: PD joints at the stand pose, gravity, feet."""
    robot = mb.load_urdf(path, fixed_base=False)
    pd = [
        mb.JointSpringDamper(
            name, stiffness=STIFFNESS, damping=DAMPING, rest=STAND[name.split("_")[1]]
        )
        for name in robot.joint_names
    ]
    feet = robot.contacts(list(FEET), friction=FRICTION)
    return robot.mechanism(forces=[mb.Gravity()] + pd, stops=feet, limits=False), robot


def initial_state(model: mb.TreeMechanism, height: float = HEIGHT):
    """At rest in the stand pose, the URDF base frame `height` above the ground."""
    q = np.array(model.reference_coordinates())
    q[2] += height  # the trunk's coordinates are its centre of mass, the frame's at 0
    for name in model.joint_names:
        if isinstance(model.joint(name), mb.Revolute):
            q[model.joint_slice(name)] = STAND[name.split("_")[1]]
    return jnp.asarray(q), jnp.zeros(q.shape)


def centre_of_mass(model: mb.TreeMechanism):
    """The whole robot's centre of mass as a function of `q`, and its total mass."""
    masses = model.masses
    names = [body.name for body in model.bodies]

    def com(q):
        return masses @ jnp.stack([model.marker_position(q, n) for n in names]) / masses.sum()

    return com, float(masses.sum())


def jaxdae_drop(model, q0, v0, t1):
    """jaxdae's `TimeStepping(dt=DT)`: times, base height, total foot force, seconds (the
    first call, with its compile, and a second)."""
    ts = jnp.linspace(0.0, t1, int(round(t1 / DT)) + 1)

    def run():
        return jaxdae.simulate(
            model,
            jaxdae.Baumgarte(kd=20.0, kp=100.0),
            0.0,
            t1,
            q0,
            v0,
            events=jaxdae.TimeStepping(dt=DT),
            ts=ts,
        )

    start = time.perf_counter()
    sol = jax.block_until_ready(run())
    first = time.perf_counter() - start
    start = time.perf_counter()
    sol = jax.block_until_ready(run())
    second = time.perf_counter() - start
    com, mass = centre_of_mass(model)
    # the whole robot's vertical momentum; its change per step is the contacts' impulse
    momentum = jax.jit(jax.vmap(lambda q, v: mass * jax.jvp(com, (q,), (v,))[1][2]))
    p = np.asarray(momentum(sol.q, sol.v))
    force = np.concatenate([[0.0], np.diff(p) / DT + mass * GRAVITY])
    return {
        "ts": np.asarray(sol.ts),
        "z": np.asarray(sol.q[:, 2]),
        "force": force,
        "seconds_with_compile": first,
        "seconds": second,
        "result": str(sol.result),
        "solution": sol,
    }


def mujoco_drop(model, q0, t1):
    """MuJoCo on `_mjcf.mjcf(model)` (`None` where mujoco is not installed): times, base
    height, total vertical foot force, seconds, and the model checks against jaxdae."""
    try:
        import mujoco
    except ImportError:
        print("mujoco is not installed: MuJoCo skipped")
        return None
    import _mjcf

    mj = mujoco.MjModel.from_xml_string(_mjcf.mjcf(model, timestep=DT))
    q = np.array(q0)
    rng = np.random.default_rng(0)
    e = rng.standard_normal(4)
    q[3:7] = e / np.linalg.norm(e)
    q[7:] += rng.uniform(-0.5, 0.5, q.size - 7)
    checks = _mjcf.check(model, mj, q)  # at a turned and bent configuration
    data = mujoco.MjData(mj)
    data.qpos[:], data.qvel[:] = _mjcf.to_mujoco(model, mj, q0)
    steps = int(round(t1 / DT))
    z, force = np.zeros(steps + 1), np.zeros(steps + 1)
    z[0] = data.qpos[2]  # the trunk body's origin is its centre of mass
    wrench = np.zeros(6)
    start = time.perf_counter()
    for s in range(steps):
        mujoco.mj_step(mj, data)
        z[s + 1] = data.qpos[2]
        for i in range(data.ncon):  # the contacts that made this step
            mujoco.mj_contactForce(mj, data, i, wrench)
            frame = data.contact[i].frame.reshape(3, 3)
            force[s + 1] += (frame.T @ wrench[:3])[2]
    return {
        "ts": np.arange(steps + 1) * DT,
        "z": z,
        "force": force,
        "seconds": time.perf_counter() - start,
        "checks": checks,
    }


def bullet_drop(path, t1, height=HEIGHT):
    """pybullet on the URDF file (`None` where pybullet is not installed): times, base
    height (its centre of mass), total vertical foot force, seconds."""
    try:
        import pybullet as p
    except ImportError:
        print("pybullet is not installed: pybullet skipped")
        return None
    client = p.connect(p.DIRECT)
    p.setAdditionalSearchPath(str(Path(path).parents[1]), physicsClientId=client)
    p.setGravity(0, 0, -GRAVITY, physicsClientId=client)
    p.setTimeStep(DT, physicsClientId=client)
    plane = p.loadURDF("plane.urdf", physicsClientId=client)
    robot = p.loadURDF(
        str(path), [0, 0, height], flags=p.URDF_USE_INERTIA_FROM_FILE, physicsClientId=client
    )
    joints, feet = {}, []
    for j in range(p.getNumJoints(robot, physicsClientId=client)):
        info = p.getJointInfo(robot, j, physicsClientId=client)
        name, kind, link = info[1].decode(), info[2], info[12].decode()
        if kind == p.JOINT_REVOLUTE:
            joints[name] = j
        if link in FEET:
            feet.append(j)
    for name, j in joints.items():
        p.resetJointState(robot, j, STAND[name.split("_")[1]], physicsClientId=client)
        # no motor, no damping: the PD law is the only joint torque
        p.setJointMotorControl2(robot, j, p.VELOCITY_CONTROL, force=0, physicsClientId=client)
        p.changeDynamics(
            robot, j, linearDamping=0, angularDamping=0, jointDamping=0, physicsClientId=client
        )
    p.changeDynamics(robot, -1, linearDamping=0, angularDamping=0, physicsClientId=client)
    for j in feet:  # Bullet multiplies the two friction coefficients: μ = 0.8
        p.changeDynamics(
            robot, j, lateralFriction=FRICTION, restitution=0.0, physicsClientId=client
        )
    p.changeDynamics(plane, -1, lateralFriction=1.0, restitution=0.0, physicsClientId=client)
    steps = int(round(t1 / DT))
    z, force = np.zeros(steps + 1), np.zeros(steps + 1)
    z[0] = p.getBasePositionAndOrientation(robot, physicsClientId=client)[0][2]
    start = time.perf_counter()
    for s in range(steps):
        for name, j in joints.items():
            angle, rate = p.getJointState(robot, j, physicsClientId=client)[:2]
            torque = -STIFFNESS * (angle - STAND[name.split("_")[1]]) - DAMPING * rate
            p.setJointMotorControl2(
                robot, j, p.TORQUE_CONTROL, force=torque, physicsClientId=client
            )
        p.stepSimulation(physicsClientId=client)
        z[s + 1] = p.getBasePositionAndOrientation(robot, physicsClientId=client)[0][2]
        force[s + 1] = sum(
            c[9]  # the normal force; the plane's normal is +z
            for j in feet
            for c in p.getContactPoints(robot, plane, j, -1, physicsClientId=client)
        )
    elapsed = time.perf_counter() - start
    p.disconnect(client)
    return {"ts": np.arange(steps + 1) * DT, "z": z, "force": force, "seconds": elapsed}


def summary(run, weight, settle):
    """Standing height (mean base height over the last `settle` s), landing time (the
    total foot force first above `LANDED` of the weight), peak force."""
    ts, z, force = run["ts"], run["z"], run["force"]
    landed = np.nonzero(force > LANDED * weight)[0]
    return {
        "standing_height": float(z[ts >= ts[-1] - settle].mean()),
        "landing_time": float(ts[landed[0]]) if landed.size else None,
        "peak_force": float(force.max()),
        "standing_force": float(force[ts >= ts[-1] - settle].mean()),
    }


def main(out: Path, quick: bool = False) -> dict:
    import matplotlib.pyplot as plt
    from _common import figure, output_dir, write_json

    folder = output_dir(out, "quadruped_drop")
    t1, settle = (0.6, 0.2) if quick else (2.0, 0.5)
    path = urdf_path()
    if path is None or not path.exists():
        headline = "pybullet_data (pip install pybullet) holds the A1's URDF: nothing to run"
        print(headline)
        return {"headline": headline}
    model, robot = quadruped(path)
    q0, v0 = initial_state(model)
    weight = float(model.masses.sum()) * GRAVITY
    runs = {}
    if hasattr(jaxdae, "TimeStepping"):
        runs["jaxdae"] = jaxdae_drop(model, q0, v0, t1)
    else:
        print("jaxdae.TimeStepping is not available in this jaxdae: jaxdae skipped")
    for name, run in (("MuJoCo", mujoco_drop(model, q0, t1)), ("pybullet", bullet_drop(path, t1))):
        if run is not None:
            runs[name] = run

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    styles = {"jaxdae": "-", "MuJoCo": "--", "pybullet": ":"}
    for name, run in runs.items():
        ax1.plot(run["ts"], run["z"], styles[name], label=name)
        ax2.plot(run["ts"], run["force"], styles[name], label=name, lw=1.0)
    ax1.set(xlabel="t [s]", ylabel="trunk centre of mass height [m]", title="base height")
    ax2.axhline(weight, color="k", lw=0.5)
    ax2.set(xlabel="t [s]", ylabel="Σ F_z [N]", title="total vertical foot force (weight: line)")
    ax2.set_ylim(-0.5 * weight, 6 * weight)
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    fig.savefig(folder / "quadruped_drop.png", dpi=120)
    plt.close(fig)

    result = {"t1": t1, "dt": DT, "height": HEIGHT, "mass": weight / GRAVITY}
    for name, run in runs.items():
        result[name] = summary(run, weight, settle) | {
            k: run[k] for k in ("seconds", "seconds_with_compile", "result", "checks") if k in run
        }
    if "jaxdae" in runs:
        ours = runs["jaxdae"]
        for name in runs.keys() - {"jaxdae"}:
            peer = runs[name]
            landing = [result[n]["landing_time"] for n in ("jaxdae", name)]
            result[f"jaxdae_vs_{name}"] = {
                "standing_height": result["jaxdae"]["standing_height"]
                - result[name]["standing_height"],
                "landing_time": None if None in landing else landing[0] - landing[1],
                "max_abs_height": float(np.abs(ours["z"] - peer["z"]).max()),
            }
    write_json(folder / "quadruped_drop.json", result)
    for key, value in result.items():
        print(f"{key}: {value}")
    print(f"wrote {folder / 'quadruped_drop.png'}")
    if "jaxdae" in runs:
        # The landing in 3-D, drawn from the URDF's visuals: an HTML file that plays offline.
        sol = runs["jaxdae"]["solution"]
        jaxdae.viz.view(model, sol, visuals=robot.visuals, fps=50.0).save_html(
            folder / "quadruped_drop.html"
        )
        print(f"wrote {folder / 'quadruped_drop.html'}")
    table = [
        "| simulator | standing height [m] | landing [s] | peak Σ F_z [N] |",
        "|---|---|---|---|",
    ]
    table += [
        f"| {name} | {result[name]['standing_height']:.5f} | {result[name]['landing_time']} | "
        f"{result[name]['peak_force']:.0f} |"
        for name in runs
    ]
    headline = "The A1 lands and stands under PD control: " + ", ".join(
        f"{name} at {result[name]['standing_height']:.4f} m" for name in runs
    )
    return {
        "headline": headline,
        "table": table,
        "figures": [
            figure(
                folder / "quadruped_drop.png",
                "The A1's base height and total vertical foot force through its landing: jaxdae "
                "TimeStepping, MuJoCo and pybullet at the same 1 ms step",
            )
        ],
    }


if __name__ == "__main__":
    from _common import parse_args

    args = parse_args("quadruped_drop", __doc__.splitlines()[0])
    main(args.out, args.quick)
