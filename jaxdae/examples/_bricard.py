"""Bricard's mechanism (IFToMM multibody benchmark A04) built with `jaxdae.multibody`: five
uniform bars joined in a closed loop by six revolute joints, one of whose 30 constraint
equations is redundant (`experiments/examples/bricard.py` simulates it against the benchmark)."""

import jax.numpy as jnp
import numpy as np

import jaxdae.multibody as mb

LENGTH, MASS, SIDE, GRAVITY = 1.0, 1.0, 0.1, 9.81
POINTS = np.array([[0, 0, 0], [1, 0, 0], [1, -1, 0], [1, -1, 1], [0, -1, 1], [0, 0, 1]], float)
AXES = np.eye(3)[[1, 2, 0, 1, 2, 0]]


def bricard(length=LENGTH, mass=MASS, side=SIDE, gravity=GRAVITY) -> mb.Mechanism:
    """The A04 mechanism: bars `bar1` … `bar5`, joints `j0` … `j5` (joint `j_i` at `P_i`).

    Each bar's body x axis runs along the bar; its markers `a` (start) and `b` (end) carry
    the global axes at the start, so that every joint's `axis` is the global axis of the
    table above.
    """
    inertia = mass / 12 * jnp.array([2 * side**2, length**2 + side**2, length**2 + side**2])
    bodies, joints = [mb.Ground(markers={"P0": POINTS[0], "P5": POINTS[5]})], []
    for i in range(1, 6):
        start, end = POINTS[i - 1], POINTS[i % 6] if i < 5 else POINTS[5]
        x = (end - start) / np.linalg.norm(end - start)
        helper = np.array([0.0, 0.0, 1.0]) if abs(x[2]) < 0.9 else np.array([1.0, 0.0, 0.0])
        z = np.cross(x, helper)
        z /= np.linalg.norm(z)
        rotation = np.stack([x, np.cross(z, x), z], axis=1)  # body axes in the global frame
        half = 0.5 * length
        bodies.append(
            mb.RigidBody(
                f"bar{i}",
                mass,
                inertia,
                markers={"a": (-half, 0.0, 0.0), "b": (half, 0.0, 0.0)},
                orientations={"a": rotation.T, "b": rotation.T},
                position=0.5 * (start + end),
                orientation=rotation,
            )
        )
    for i in range(6):
        a = "ground.P0" if i == 0 else f"bar{i}.b"
        b = "ground.P5" if i == 5 else f"bar{i + 1}.a"
        joints.append(mb.Revolute(a, b, axis=AXES[i], name=f"j{i}"))
    return mb.Mechanism(bodies, joints, [mb.Gravity((0.0, -gravity, 0.0))])
