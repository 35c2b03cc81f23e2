"""The flyball governor (IFToMM multibody benchmark) built with `jaxdae.multibody`: a
spinning shaft, a slider on it and two rods with point masses, joined by springs
(`experiments/examples/flyball_governor.py` simulates it against Exudyn)."""

import jax.numpy as jnp
import numpy as np

import jaxdae.multibody as mb

DENSITY, POINT_MASS, K, C, REST = 3000.0, 5.0, 8e5, 4e4, 0.5
SPIN, ANGLE = 2 * np.pi, np.deg2rad(30.0)


def _bar():
    """Mass and principal moments of a 1 m × 0.01 m × 0.01 m bar (long axis z)."""
    m = DENSITY * 1.0 * 0.01 * 0.01
    across = m * (0.01**2 + 1.0**2) / 12
    return m, np.array([across, across, m * 2 * 0.01**2 / 12])


def _rod_with_mass():
    """A bar with the point mass at its end (body z along the bar, from hinge to mass):
    mass, principal moments about the common centre, and that centre's offset from the
    bar's midpoint."""
    m, inertia = _bar()
    total = m + POINT_MASS
    offset = POINT_MASS * 0.5 / total
    across = inertia[0] + m * offset**2 + POINT_MASS * (0.5 - offset) ** 2
    return total, np.array([across, across, inertia[2]]), offset


def governor() -> mb.Mechanism:
    """Bodies `shaft`, `slider`, `rod1`, `rod2`; joints `spin` (revolute about z), `slide`
    (prismatic along the shaft; its coordinate is s), `hinge1`, `hinge2` (revolute)."""
    m_bar, i_bar = _bar()
    m_rod, i_rod, offset = _rod_with_mass()
    direction = {
        1: np.array([np.cos(ANGLE), 0.0, -np.sin(ANGLE)]),
        2: np.array([-np.cos(ANGLE), 0.0, -np.sin(ANGLE)]),
    }
    side = {1: 0.05, 2: -0.05}
    bodies = [
        mb.RigidBody(
            "shaft",
            m_bar,
            i_bar,
            position=(0.0, 0.0, 0.5),
            markers={
                "bottom": (0.0, 0.0, -0.5),
                "top1": (0.05, 0.0, 0.5),
                "top2": (-0.05, 0.0, 0.5),
            },
        ),
        mb.RigidBody(
            "slider",
            DENSITY * 0.1**3,
            DENSITY * 0.1**3 * 0.1**2 / 6 * np.ones(3),
            position=(0.0, 0.0, 0.5),
            markers={"s1": (0.05, 0.0, 0.0), "s2": (-0.05, 0.0, 0.0)},
        ),
    ]
    for k in (1, 2):
        # body z along the rod, from the hinge to the point mass; y along the hinge axis
        z = direction[k]
        y = np.array([0.0, 1.0, 0.0])
        rotation = np.stack([np.cross(y, z), y, z], axis=1)
        hinge = np.array([side[k], 0.0, 1.0])
        bodies.append(
            mb.RigidBody(
                f"rod{k}",
                m_rod,
                i_rod,
                position=hinge + (0.5 + offset) * z,
                orientation=rotation,
                markers={"hinge": (0.0, 0.0, -0.5 - offset), "middle": (0.0, 0.0, -offset)},
                orientations={"hinge": rotation.T},
            )
        )
    joints = [
        mb.Revolute("ground", "shaft.bottom", axis=(0.0, 0.0, 1.0), name="spin"),
        mb.Prismatic("shaft.bottom", "slider", axis=(0.0, 0.0, 1.0), name="slide"),
        mb.Revolute("shaft.top1", "rod1.hinge", axis=(0.0, 1.0, 0.0), name="hinge1"),
        mb.Revolute("shaft.top2", "rod2.hinge", axis=(0.0, 1.0, 0.0), name="hinge2"),
    ]
    forces = [
        mb.Gravity(),
        mb.SpringDamper("slider.s1", "rod1.middle", K, C, REST, name="spring1"),
        mb.SpringDamper("slider.s2", "rod2.middle", K, C, REST, name="spring2"),
    ]
    return mb.Mechanism(bodies, joints, forces)


def initial_state(model):
    """The benchmark's start: every body turning with the shaft at 2π rad/s about z
    (`ṙ = ω × r`, `ṗ = ½ E(p)ᵀ ω` for `ω = 2 E(p) ṗ`), the joints at rest."""
    q0 = model.reference_coordinates()
    omega = jnp.array([0.0, 0.0, SPIN])
    parts = []
    for body in model.bodies:
        qb = model.body_coordinates(q0, body.name)
        e0, e = qb[3], qb[4:]
        skew_plus = jnp.array([[e0, -e[2], e[1]], [e[2], e0, -e[0]], [-e[1], e[0], e0]])
        global_map = jnp.concatenate([-e[:, None], skew_plus], axis=1)  # E = [−e, ẽ + e₀I]
        parts.append(jnp.concatenate([jnp.cross(omega, qb[:3]), 0.5 * global_map.T @ omega]))
    return q0, jnp.concatenate(parts)
