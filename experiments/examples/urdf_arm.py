"""A spatial robot arm read from a URDF file with `jaxdae.multibody.load_urdf`, swinging
under gravity in joint coordinates and in absolute coordinates, cross-checked against Exudyn.

The arm is tests/data/three_link_arm.urdf: a turret on a continuous yaw joint, a shoulder
and an elbow (revolute), a prismatic wrist and a tool frame on a fixed joint. It starts at
zero joint coordinates with the yaw joint turning at 2 rad/s and the shoulder at 1 rad/s,
and swings for 2 s under gravity (−z) with no damping, simulated as the default
`robot.mechanism()` (a `TreeMechanism` in the four joint coordinates, no constraints) and as
the same bodies and joints in absolute coordinates (`coordinates="absolute"`, 28 coordinates
and 24 constraints, Baumgarte stabilization); a spring (200 N/m, rest length 0.45 m) from the elbow
to the wrist's slider keeps the prismatic wrist near its range; the URDF limits are left out
(`limits=False`), as in the Exudyn model. With `exudyn` installed, the same bodies (masses, inertia
tensors and poses taken from the imported model) and joints are built with Exudyn's
`CreateRigidBody`, `CreateRevoluteJoint`, `CreatePrismaticJoint` and solved by its generalized-α
integrator; the tool's trajectories are compared.

    python experiments/examples/urdf_arm.py [--out output] [--quick]
    # writes OUT/urdf_arm/urdf_arm.png, urdf_arm.json and urdf_arm.html
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

URDF = Path(__file__).resolve().parents[2] / "tests" / "data" / "three_link_arm.urdf"
RATES = {"yaw": (0.0, 2.0), "shoulder": (0.0, 1.0)}


def exudyn_tool(robot, model, q0, v0, t1, steps):
    """The tool's trajectory from Exudyn (`None` where exudyn is not installed)."""
    try:
        import exudyn as exu
        from exudyn.utilities import ObjectGround, RigidBodyInertia, SensorBody
    except ImportError:
        return None
    sc = exu.SystemContainer()
    mbs = sc.AddSystem()
    numbers = {"ground": mbs.AddObject(ObjectGround())}
    for body in robot.bodies[1:]:
        position = np.asarray(model.marker_position(q0, body.name))
        rotation = np.asarray(model.marker_rotation(q0, body.name))
        velocity = np.asarray(model.marker_velocity(q0, v0, body.name))
        omega = np.asarray(model.angular_velocity(q0, v0, body.name))
        inertia = RigidBodyInertia(mass=float(body.mass), inertiaTensor=np.asarray(body.inertia))
        numbers[body.name] = mbs.CreateRigidBody(
            inertia=inertia,
            referencePosition=list(position),
            referenceRotationMatrix=rotation,
            initialVelocity=list(velocity),
            initialAngularVelocity=list(omega),
            gravity=[0.0, 0.0, -9.81],
        )
    for joint in robot.joints:
        bodies = [numbers[joint.a.split(".")[0]], numbers[joint.b.split(".")[0]]]
        position = list(np.asarray(model.marker_position(q0, joint.a)))
        axis = list(np.asarray(model.marker_rotation(q0, joint.a) @ joint.axis))
        if isinstance(joint, mb.Revolute):
            mbs.CreateRevoluteJoint(itemNumbers=bodies, position=position, axis=axis)
        elif isinstance(joint, mb.Prismatic):
            mbs.CreatePrismaticJoint(itemNumbers=bodies, position=position, axis=axis)
        else:
            mbs.CreateGenericJoint(
                itemNumbers=bodies, position=position, constrainedAxes=[1, 1, 1, 1, 1, 1]
            )
    for force in model.forces:
        if isinstance(force, mb.SpringDamper):
            (body_a, marker_a), (body_b, marker_b) = (ref.split(".") for ref in force.markers)
            mbs.CreateSpringDamper(
                itemNumbers=[numbers[body_a], numbers[body_b]],
                localPosition0=list(np.asarray(model.body(body_a).markers[marker_a])),
                localPosition1=list(np.asarray(model.body(body_b).markers[marker_b])),
                referenceLength=float(force.rest_length),
                stiffness=float(force.stiffness),
                damping=float(force.damping),
            )
    slider = robot.bodies[-1]
    sensor = mbs.AddSensor(
        SensorBody(
            bodyNumber=numbers[slider.name],
            localPosition=list(np.asarray(slider.markers["tool"])),
            storeInternal=True,
            outputVariableType=exu.OutputVariableType.Position,
        )
    )
    from _common import exudyn_solve

    data, elapsed = exudyn_solve(exu, mbs, sensor, t1, steps)
    return data[:, 0], data[:, 1:4], elapsed


def main():
    import matplotlib.pyplot as plt
    from _common import output_dir, parse_args, write_json

    args = parse_args("urdf_arm", __doc__.splitlines()[0])
    out = output_dir(args.out, "urdf_arm")
    t1, num = (0.5, 51) if args.quick else (2.0, 201)
    robot = mb.load_urdf(URDF)
    forces = [mb.Gravity(), mb.SpringDamper("forearm.frame", "slider.frame", 200.0, 0.0, 0.45)]
    model = robot.mechanism(forces=forces, limits=False, coordinates="absolute")
    q0, v0 = model.initial_state(joint_coordinates=RATES, tol=1e-10)
    ts = jnp.linspace(0.0, t1, num)
    start = time.perf_counter()
    sol = jaxdae.simulate(
        model, jaxdae.Baumgarte(20.0, 100.0), 0.0, t1, q0, v0, ts=ts, rtol=1e-10, atol=1e-10
    )
    jax.block_until_ready(sol.q)
    elapsed = time.perf_counter() - start
    # The same start in joint coordinates: the absolute model's joint coordinates and rates
    tree = robot.mechanism(forces=forces, limits=False)
    coordinates, rates = model.joint_coordinates(q0), model.joint_rates(q0, v0)
    tq0, tv0 = tree.initial_state(
        joint_coordinates={name: (coordinates[name], rates[name]) for name in robot.joint_names}
    )
    start = time.perf_counter()
    tree_sol = jaxdae.simulate(
        tree, jaxdae.Unstabilized(), 0.0, t1, tq0, tv0, ts=ts, rtol=1e-10, atol=1e-10
    )
    jax.block_until_ready(tree_sol.q)
    tree_elapsed = time.perf_counter() - start
    energy = np.asarray(jax.vmap(model.energy)(sol.ts, sol.q, sol.v))
    tree_energy = np.asarray(jax.vmap(tree.energy)(tree_sol.ts, tree_sol.q, tree_sol.v))
    tool = np.asarray(model.marker_position(sol.q, "slider.tool"))
    tree_tool = np.asarray(tree.marker_position(tree_sol.q, "slider.tool"))
    reference = exudyn_tool(robot, model, q0, v0, t1, 80 * (num - 1))
    coordinates = model.joint_coordinates(sol.q)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    for k, label in enumerate("xyz"):
        ax1.plot(sol.ts, tool[:, k], label=f"tool {label} (jaxdae)")
        if reference is not None:
            ax1.plot(
                reference[0], reference[1][:, k], "k--", lw=0.8, label="Exudyn" if k == 0 else None
            )
    ax1.set(xlabel="t [s]", ylabel="tool [m]", title="tool position")
    ax1.legend(fontsize=8)
    for name in robot.joint_names:
        ax2.plot(sol.ts, coordinates[name], label=name)
    ax2.set(xlabel="t [s]", ylabel="joint coordinate [rad, m]", title="joints")
    ax2.legend(fontsize=8)
    ax3.plot(sol.ts, energy - energy[0], label="absolute coordinates")
    ax3.plot(tree_sol.ts, tree_energy - tree_energy[0], label="joint coordinates")
    ax3.set(xlabel="t [s]", ylabel="E − E(0) [J]", title="energy drift")
    ax3.legend(fontsize=8)
    fig.savefig(out / "urdf_arm.png", dpi=120)
    plt.close(fig)
    jaxdae.viz.view(tree, tree_sol).save_html(out / "urdf_arm.html")  # the 3-D viewer, offline
    result = {
        "mobility": model.mobility(q0)._asdict(),
        "t1": t1,
        "max_abs_phi": float(np.abs(sol.phi).max()),
        "max_energy_drift": float(np.abs(energy - energy[0]).max()),
        "steps": int(sol.stats["num_steps"]),
        "seconds_with_compile": elapsed,
        "joint_coordinates_max_energy_drift": float(np.abs(tree_energy - tree_energy[0]).max()),
        "joint_coordinates_steps": int(tree_sol.stats["num_steps"]),
        "joint_coordinates_seconds_with_compile": tree_elapsed,
        "max_tool_difference_joint_vs_absolute": float(np.abs(tree_tool - tool).max()),
    }
    if reference is not None:
        ts_ref, tool_ref, elapsed_ref = reference
        tool_interp = np.stack(
            [np.interp(np.asarray(sol.ts), ts_ref, tool_ref[:, k]) for k in range(3)], axis=1
        )
        result["exudyn_max_tool_difference"] = float(np.abs(tool_interp - tool).max())
        result["exudyn_seconds"] = elapsed_ref
    write_json(out / "urdf_arm.json", result)
    for key, value in result.items():
        print(f"{key}: {value}")
    print(f"wrote {out / 'urdf_arm.png'} and {out / 'urdf_arm.html'}")


if __name__ == "__main__":
    main()
