"""Bricard's mechanism (IFToMM multibody benchmark A04) with `jaxdae.multibody`.

Five uniform bars (length 1 m, mass 1 kg, square section 0.1 m) joined in a closed loop by
six revolute joints, one bar end pinned to the ground at each end of the chain; gravity
9.81 m/s² along −y; released from rest in the benchmark's initial position and simulated for
10 s. Grübler's count gives 30 − 30 = 0 degrees of freedom, but the axes' particular
orientation leaves one: one of the 30 constraint equations is redundant, so the model runs
with `jaxdae.PseudoInverse`.

The joint points at the start, numbered along the chain from the ground:
P0 = (0, 0, 0), P1 = (1, 0, 0), P2 = (1, −1, 0), P3 = (1, −1, 1), P4 = (0, −1, 1),
P5 = (0, 0, 1) (P0 and P5 on the ground), with the axes y, z, x, y, z, x (the set-up of
Exudyn's `bricardMechanism` test model). Bar i runs from P(i−1) to P(i); the output is the
trajectory of point P3 and the drift of the total energy, the two quantities the benchmark
reports. With `exudyn` installed (`pip install exudyn`), the same mechanism is solved by
Exudyn's index-2 generalized-alpha integrator and both P3 trajectories are plotted together.

    python experiments/examples/bricard.py [--out output] [--quick]
    # writes OUT/bricard/bricard.png, bricard.json and bricard.html
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
import jaxdae.viz
from jaxdae.examples._bricard import AXES, GRAVITY, LENGTH, MASS, POINTS, SIDE, bricard


def simulate(model, t1, num, rtol=1e-10, atol=1e-10, formulation=None):
    q0, v0 = model.initial_state()
    formulation = jaxdae.PseudoInverse(20.0, 100.0) if formulation is None else formulation
    ts = jnp.linspace(0.0, t1, num)
    return jaxdae.simulate(
        model, formulation, 0.0, t1, q0, v0, ts=ts, rtol=rtol, atol=atol, max_steps=200_000
    )


def exudyn_p3(t1, steps):
    """P3's trajectory from Exudyn (`None` where exudyn is not installed)."""
    try:
        import exudyn as exu
        from exudyn.utilities import (
            InertiaCuboid,
            ObjectGround,
            RotationMatrixY,
            RotationMatrixZ,
            SensorBody,
        )
    except ImportError:
        return None
    sc = exu.SystemContainer()
    mbs = sc.AddSystem()
    inertia = InertiaCuboid(density=MASS / (LENGTH * SIDE**2), sideLengths=[LENGTH, SIDE, SIDE])
    inertia = inertia.Translated([0.5 * LENGTH, 0, 0])
    rotations = [
        np.eye(3),
        RotationMatrixZ(-0.5 * np.pi),
        RotationMatrixY(-0.5 * np.pi),
        RotationMatrixZ(np.pi),
        RotationMatrixZ(0.5 * np.pi),
    ]
    ground = mbs.AddObject(ObjectGround())
    bodies = [ground]
    for i in range(6):
        body = ground
        if i < 5:
            body = mbs.CreateRigidBody(
                inertia=inertia,
                referencePosition=list(POINTS[i]),
                referenceRotationMatrix=rotations[i],
                gravity=[0, -GRAVITY, 0],
            )
            mbs.CreateRevoluteJoint(
                itemNumbers=[bodies[-1], body], position=list(POINTS[i]), axis=list(AXES[i])
            )
        else:  # the loop closure: a joint free about x, as Exudyn's own model closes it
            mbs.CreateGenericJoint(
                itemNumbers=[bodies[-1], body],
                position=list(POINTS[i]),
                constrainedAxes=[1, 1, 1, 0, 1, 1],
            )
        bodies.append(body)
    sensor = mbs.AddSensor(
        SensorBody(
            bodyNumber=bodies[3],
            localPosition=[LENGTH, 0, 0],
            storeInternal=True,
            outputVariableType=exu.OutputVariableType.Position,
        )
    )
    from _common import exudyn_solve

    data, elapsed = exudyn_solve(exu, mbs, sensor, t1, steps, singular_jacobian=True)
    return data[:, 0], data[:, 1:4], elapsed


def main():
    import matplotlib.pyplot as plt
    from _common import output_dir, parse_args, write_json

    args = parse_args("bricard", __doc__.splitlines()[0])
    out = output_dir(args.out, "bricard")
    t1, num = (2.0, 201) if args.quick else (10.0, 1001)
    model = bricard()
    q0, _ = model.initial_state()
    mobility = model.mobility(q0)
    start = time.perf_counter()
    sol = simulate(model, t1, num)
    jax.block_until_ready(sol.q)
    elapsed = time.perf_counter() - start
    energy = np.asarray(jax.vmap(model.energy)(sol.ts, sol.q, sol.v))
    p3 = np.asarray(model.marker_position(sol.q, "bar3.b"))
    reference = exudyn_p3(t1, 10 * (num - 1))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for k, label in enumerate("xyz"):
        ax1.plot(sol.ts, p3[:, k], label=f"P3 {label} (jaxdae)")
        if reference is not None:
            ax1.plot(
                reference[0], reference[1][:, k], "k--", lw=0.8, label="Exudyn" if k == 0 else None
            )
    ax1.set(xlabel="t [s]", ylabel="P3 [m]", title="Bricard's mechanism: point P3")
    ax1.legend(fontsize=8)
    ax2.plot(sol.ts, energy - energy[0])
    ax2.set(xlabel="t [s]", ylabel="E − E(0) [J]", title="energy drift")
    fig.savefig(out / "bricard.png", dpi=120)
    plt.close(fig)
    jaxdae.viz.view(model, sol).save_html(out / "bricard.html")  # the 3-D viewer, offline
    result = {
        "mobility": mobility._asdict(),
        "t1": t1,
        "max_abs_phi": float(np.abs(sol.phi).max()),
        "max_energy_drift": float(np.abs(energy - energy[0]).max()),
        "p3_final": p3[-1],
        "steps": int(sol.stats["num_steps"]),
        "seconds_with_compile": elapsed,
    }
    if reference is not None:
        ts_ref, p3_ref, elapsed_ref = reference
        p3_interp = np.stack(
            [np.interp(np.asarray(sol.ts), ts_ref, p3_ref[:, k]) for k in range(3)], axis=1
        )
        result["exudyn_max_p3_difference"] = float(np.abs(p3_interp - p3).max())
        result["exudyn_seconds"] = elapsed_ref
    write_json(out / "bricard.json", result)
    for key, value in result.items():
        print(f"{key}: {value}")
    print(f"wrote {out / 'bricard.png'} and {out / 'bricard.html'}")


if __name__ == "__main__":
    main()
