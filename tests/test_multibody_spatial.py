"""Spatial multibody models: Euler-parameter kinematics, the free rigid body against Euler's
equations, a hinged pendulum and joint spring-damper against closed forms, a planar motion
built from spatial bodies against the planar layer, the mobility of every spatial joint,
Bricard's redundant linkage, gradients, linearization, ensembles, and the errors of bad
models."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae.examples._bricard import bricard
from jaxdae.multibody._kinematics import (
    body_map,
    euler_rotation,
    global_map,
    quaternion_from_matrix,
)

from ._jaxprs import assert_rates_loop_is_one_kernel, not_in_a_loop

G = 9.81


@eqx.filter_jit
def accelerations(system, q, v, t=0.0):
    """Exact `(q̈, λ)` of the index-3 DAE at a consistent state (`Φ̈ = 0`)."""
    return jaxdae.Unstabilized().accelerations(system.terms(jnp.asarray(t, q.dtype), q, v))


def unit(x):
    x = jnp.asarray(x, float)
    return x / jnp.linalg.norm(x)


# -- kinematics ------------------------------------------------------------------------------


def test_euler_parameter_maps():
    """`R(p)` is a rotation; `ω = 2 E ṗ` and `ω' = 2 G ṗ` are the angular velocity in the
    global and body frames (`Ṙ Rᵀ = ω̃`, `ω' = Rᵀ ω`); Shepperd's method inverts `R(p)`."""
    p = unit([0.3, -0.5, 0.7, 0.2])
    pdot = jnp.array([0.1, 0.4, -0.2, 0.3])
    pdot = pdot - (pdot @ p) * p
    rot, rot_dot = jax.jvp(euler_rotation, (p,), (pdot,))
    np.testing.assert_allclose(rot.T @ rot, np.eye(3), atol=1e-14)
    assert np.linalg.det(rot) == pytest.approx(1.0)
    w = rot_dot @ rot.T
    np.testing.assert_allclose(w, -w.T, atol=1e-14)
    omega = jnp.array([w[2, 1], w[0, 2], w[1, 0]])
    np.testing.assert_allclose(2 * global_map(p) @ pdot, omega, atol=1e-14)
    np.testing.assert_allclose(2 * body_map(p) @ pdot, rot.T @ omega, atol=1e-14)
    np.testing.assert_allclose(quaternion_from_matrix(rot), p, atol=1e-14)
    for axis, angle in (((1, 0, 0), 3.0), ((0, 1, 0), -2.9), ((0, 0, 1), np.pi), ((1, 1, 1), 2.0)):
        r = mb.rotation_matrix(axis, angle)
        np.testing.assert_allclose(euler_rotation(quaternion_from_matrix(r)), r, atol=1e-13)
    # URDF's roll-pitch-yaw: fixed axes x, then y, then z.
    r = mb.rpy_matrix(0.3, -0.2, 0.5)
    expected = (
        mb.rotation_matrix((0, 0, 1), 0.5)
        @ mb.rotation_matrix((0, 1, 0), -0.2)
        @ mb.rotation_matrix((1, 0, 0), 0.3)
    )
    np.testing.assert_allclose(r, expected, atol=1e-15)
    np.testing.assert_allclose(
        mb.rotation_matrix((0, 0, 1), np.pi / 2) @ jnp.array([1.0, 0, 0]),
        [0.0, 1.0, 0.0],
        atol=1e-15,
    )


@pytest.mark.slow
def test_free_body_follows_euler_equations():
    """A free spinning body: the centre does not accelerate and `J ω̇' = −ω' × J ω'`; the
    mass matrix is positive definite (the norm term) and the energy is `½ ω'ᵀ J ω'`."""
    inertia = jnp.array([[0.3, 0.02, -0.01], [0.02, 0.5, 0.03], [-0.01, 0.03, 0.6]])
    mech = mb.Mechanism(
        [mb.RigidBody("top", 2.0, inertia, orientation=mb.rotation_matrix((1, 2, 3), 0.7))]
    )
    assert mech.mobility() == mb.Mobility(7, 1, 6, 1, 6, 0)
    q = mech.reference_coordinates()
    p = q[3:]
    omega_body = jnp.array([1.5, -0.7, 2.2])
    pdot = 0.5 * body_map(p).T @ omega_body  # G Gᵀ = I, G p = 0
    v = jnp.concatenate([jnp.array([0.1, 0.2, -0.3]), pdot])
    assert np.all(np.linalg.eigvalsh(mech.mass_matrix(0.0, q)) > 0)
    acc, _ = accelerations(mech, q, v)
    np.testing.assert_allclose(acc[:3], 0.0, atol=1e-13)
    # ω' = 2 G ṗ  ⇒  ω̇' = 2 G p̈ (Ġ ṗ = 0)
    omega_dot = 2 * body_map(p) @ acc[3:]
    expected = -jnp.linalg.solve(inertia, jnp.cross(omega_body, inertia @ omega_body))
    np.testing.assert_allclose(omega_dot, expected, rtol=1e-11, atol=1e-12)
    energy = 0.5 * 2.0 * (v[:3] @ v[:3]) + 0.5 * omega_body @ inertia @ omega_body
    assert float(mech.energy(0.0, q, v)) == pytest.approx(float(energy), rel=1e-13)
    np.testing.assert_allclose(
        mech.angular_velocity(q, v, "top"), euler_rotation(p) @ omega_body, atol=1e-14
    )


def test_applied_loads_and_spring_in_space():
    """A free body at rest: a force `f` at marker `s` (global), a torque `n` about a local
    axis and a spring-damper to a ground point give `m r̈ = f + f_spring` and
    `J ω̇' = Rᵀ n + s' × Rᵀ(f + f_spring)` (`s'` the marker in body axes)."""
    inertia = jnp.diag(jnp.array([0.2, 0.3, 0.4]))
    rot = mb.rotation_matrix((1.0, -1.0, 0.5), 0.8)
    s_body = jnp.array([0.1, -0.2, 0.3])
    f = jnp.array([0.5, -1.0, 2.0])
    k, rest, anchor = 7.0, 0.2, jnp.array([1.0, 0.5, -0.4])
    mech = mb.Mechanism(
        [
            mb.Ground(markers={"anchor": anchor}),
            mb.RigidBody("b", 1.5, inertia, markers={"m": s_body}, orientation=rot),
        ],
        forces=[
            mb.Force("b.m", f),
            mb.Torque("b", 0.7, axis=(0.0, 0.0, 1.0), local=True),
            mb.SpringDamper("ground.anchor", "b.m", k, 3.0, rest),
        ],
    )
    q, v = mech.reference_coordinates(), jnp.zeros(7)
    acc, _ = accelerations(mech, q, v)
    point = rot @ s_body
    d = point - anchor
    spring = -k * (jnp.linalg.norm(d) - rest) * d / jnp.linalg.norm(d)
    total = f + spring
    np.testing.assert_allclose(acc[:3], total / 1.5, rtol=1e-12, atol=1e-13)
    torque_body = rot.T @ (0.7 * rot @ jnp.array([0.0, 0.0, 1.0])) + jnp.cross(
        s_body, rot.T @ total
    )
    omega_dot = 2 * body_map(q[3:]) @ acc[3:]
    np.testing.assert_allclose(
        omega_dot, jnp.linalg.solve(inertia, torque_body), rtol=1e-11, atol=1e-12
    )


def hinged(axis=(1.0, 0.0, 0.0), m=1.3, length=0.4, forces=()):
    """A body hanging from a hinge along `axis` (horizontal) at distance `length` above
    its centre of mass; principal moments (0.02, 0.03, 0.04) about its body axes."""
    inertia = jnp.diag(jnp.array([0.02, 0.03, 0.04]))
    body = mb.RigidBody(
        "bob", m, inertia, markers={"pivot": (0.0, 0.0, length)}, position=(0.0, 0.0, -length)
    )
    return mb.Mechanism(
        [body], [mb.Revolute("ground", "bob.pivot", axis=axis, name="pin")], [mb.Gravity(), *forces]
    )


@pytest.mark.slow
def test_hinged_body_closed_form_reaction_and_spring():
    """`(I_x + m l²) θ̈ = −m g l sin θ − k (θ − θ₀) − c θ̇ + u`; the hinge's reaction on the
    body is `m c̈ − m g` with no moment along the hinge."""
    m, length, ix = 1.3, 0.4, 0.02
    k, c, rest, u = 3.0, 0.4, 0.1, 0.25
    mech = hinged(forces=[mb.JointSpringDamper("pin", k, c, rest, actuator=0)])
    mech = jaxdae.with_controller(mech, jaxdae.ConstantControl(jnp.array([u])))
    theta, omega = 0.6, -1.1
    q0, v0 = mech.initial_state(joint_coordinates={"pin": (theta, omega)})
    assert mech.mobility(q0) == mb.Mobility(7, 6, 1, 6, 1, 0)
    assert mech.joint_coordinates(q0)["pin"] == pytest.approx(theta, abs=1e-12)
    assert mech.joint_rates(q0, v0)["pin"] == pytest.approx(omega, abs=1e-12)
    acc, lam = accelerations(mech, q0, v0)
    alpha = (-m * G * length * np.sin(theta) - k * (theta - rest) - c * omega + u) / (
        ix + m * length**2
    )
    _, theta_dd = jax.jvp(lambda q, v: mech.joint_rates(q, v)["pin"], (q0, v0), (v0, acc))
    assert float(theta_dd) == pytest.approx(alpha, rel=1e-11)
    reaction = mech.reactions(q0, lam)["pin"]
    np.testing.assert_allclose(reaction.force, m * acc[:3] - m * np.array([0, 0, -G]), atol=1e-11)
    assert abs(float(reaction.torque[0])) < 1e-11  # free about the hinge


@pytest.mark.slow
def test_spatial_bodies_reproduce_the_planar_layer():
    """A double pendulum with hinges along z built from `RigidBody`s moves like the same
    pendulum built from `PlanarBody`s: the same centre accelerations, angular
    accelerations and hinge forces."""
    l1, l2, m1, m2 = 1.0, 0.7, 1.2, 0.8
    planar = mb.Mechanism(
        [
            mb.PlanarBody(
                "upper",
                m1,
                m1 * l1**2 / 12,
                markers={"top": (-l1 / 2, 0.0), "bottom": (l1 / 2, 0.0)},
            ),
            mb.PlanarBody("lower", m2, m2 * l2**2 / 12, markers={"top": (-l2 / 2, 0.0)}),
        ],
        [
            mb.Revolute("ground", "upper.top", name="a"),
            mb.Revolute("upper.bottom", "lower.top", name="b"),
        ],
        [mb.Gravity((0.0, -G))],
    )
    spatial = mb.Mechanism(
        [
            mb.RigidBody(
                "upper",
                m1,
                (0.01, m1 * l1**2 / 12, m1 * l1**2 / 12),
                markers={"top": (-l1 / 2, 0.0, 0.0), "bottom": (l1 / 2, 0.0, 0.0)},
            ),
            mb.RigidBody(
                "lower",
                m2,
                (0.01, m2 * l2**2 / 12, m2 * l2**2 / 12),
                markers={"top": (-l2 / 2, 0.0, 0.0)},
            ),
        ],
        [
            mb.Revolute("ground", "upper.top", name="a"),
            mb.Revolute("upper.bottom", "lower.top", name="b"),
        ],
        [mb.Gravity((0.0, -G, 0.0))],
    )
    angles, rates = jnp.array([-0.9, -0.2]), jnp.array([1.0, -0.5])
    # planar state from the angles
    tip = jnp.array([jnp.cos(angles[0]), jnp.sin(angles[0])])
    c1 = 0.5 * l1 * tip
    c2 = l1 * tip + 0.5 * l2 * jnp.array([jnp.cos(angles[1]), jnp.sin(angles[1])])
    qp = jnp.concatenate([c1, angles[:1], c2, angles[1:]])
    qp, vp = planar.initial_state(
        q=qp,
        joint_coordinates={
            "a": (angles[0], rates[0]),
            "b": (angles[1] - angles[0], rates[1] - rates[0]),
        },
    )

    def lift(q):
        parts = []
        for i in range(2):
            x, y, th = q[3 * i], q[3 * i + 1], q[3 * i + 2]
            parts.append(
                jnp.stack([x, y, 0.0 * x, jnp.cos(th / 2), 0.0 * x, 0.0 * x, jnp.sin(th / 2)])
            )
        return jnp.concatenate(parts)

    qs, vs = jax.jvp(lift, (qp,), (vp,))
    assert float(jnp.max(jnp.abs(spatial.constraints(0.0, qs)))) < 1e-12
    acc_p, lam_p = accelerations(planar, qp, vp)
    acc_s, lam_s = accelerations(spatial, qs, vs)
    _, lifted_acc = jax.jvp(lambda q, v: jax.jvp(lift, (q,), (v,))[1], (qp, vp), (vp, acc_p))
    np.testing.assert_allclose(acc_s, lifted_acc, atol=1e-11)
    for name in ("a", "b"):
        rp, rs = planar.reactions(qp, lam_p)[name], spatial.reactions(qs, lam_s)[name]
        np.testing.assert_allclose(rs.force[:2], rp.force, atol=1e-11)
        np.testing.assert_allclose(rs.force[2], 0.0, atol=1e-11)
        np.testing.assert_allclose(rs.torque[2], rp.torque, atol=1e-11)
    np.testing.assert_allclose(
        spatial.marker_velocity(qs, vs, "lower.top")[:2],
        planar.marker_velocity(qp, vp, "lower.top"),
        atol=1e-13,
    )


# -- joints and mobility ---------------------------------------------------------------------


def one_body(joint, orientation=None):
    body = mb.RigidBody(
        "b",
        1.0,
        (0.1, 0.2, 0.25),
        markers={"m": (0.0, 0.0, 0.5)},
        position=(0.0, 0.0, -0.5),
        orientation=orientation,
    )
    return mb.Mechanism([body], [joint])


@pytest.mark.parametrize(
    "joint, dof",
    [
        (mb.Revolute("ground", "b.m", axis=(0.0, 1.0, 1.0)), 1),
        (mb.Prismatic("ground", "b.m", axis=(1.0, 1.0, 0.0)), 1),
        (mb.Cylindrical("ground", "b.m"), 2),
        (mb.Universal("ground", "b.m"), 2),
        (mb.Spherical("ground", "b.m"), 3),
        (mb.Fixed("ground", "b.m"), 0),
        (mb.PointOnLine("ground", "b.m", axis=(0.0, 0.0, 1.0)), 4),
        (mb.Distance("ground", "b.m", 0.3), 5),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, mb.AbstractJoint) else str(x),
)
def test_spatial_joint_mobility(joint, dof):
    mech = one_body(joint)
    q = mech.reference_coordinates()
    if isinstance(joint, mb.Distance):
        q = q.at[2].add(-0.3)
    assert float(jnp.max(jnp.abs(mech.constraints(0.0, q)))) < 1e-14
    mobility = mech.mobility(q)
    assert (mobility.dof, mobility.redundant, mobility.grubler) == (dof, 0, dof)


def test_spatial_joint_coordinates_follow_the_motion():
    """Turning the body about the hinge axis by 0.7 rad keeps the revolute joint closed and
    reads 0.7; sliding along the prismatic axis by 0.3 keeps it closed and reads 0.3."""
    axis = unit([0.0, 1.0, 1.0])
    turned = mb.rotation_matrix(axis, 0.7)
    hinge = one_body(mb.Revolute("ground", "b.m", axis=axis, name="j"), orientation=turned)
    q = hinge.reference_coordinates().at[:3].set(turned @ jnp.array([0.0, 0.0, -0.5]))
    assert float(jnp.max(jnp.abs(hinge.constraints(0.0, q)))) < 1e-14
    assert hinge.joint_coordinates(q)["j"] == pytest.approx(0.7, abs=1e-13)
    np.testing.assert_allclose(hinge.marker_rotation(q, "b.m"), turned, atol=1e-14)
    slide = one_body(mb.Prismatic("ground", "b.m", axis=(1.0, 1.0, 0.0), name="s"))
    q = slide.reference_coordinates().at[:3].add(0.3 * unit([1.0, 1.0, 0.0]))
    assert float(jnp.max(jnp.abs(slide.constraints(0.0, q)))) < 1e-14
    assert slide.joint_coordinates(q)["s"] == pytest.approx(0.3, abs=1e-14)
    cyl = one_body(
        mb.Cylindrical("ground", "b.m", name="c"), orientation=mb.rotation_matrix((0, 0, 1), 1.0)
    )
    q = cyl.reference_coordinates().at[2].add(0.2)
    assert float(jnp.max(jnp.abs(cyl.constraints(0.0, q)))) < 1e-14
    assert cyl.joint_coordinates(q)["c"] == pytest.approx(0.2, abs=1e-14)


@pytest.mark.slow
def test_bricard_is_redundant_with_one_degree_of_freedom():
    """IFToMM A04: Grübler's count is 0 (5 bodies × 6 − 6 hinges × 5), the Jacobian has
    rank 34 of 35: one degree of freedom, one redundant equation."""
    model = bricard()
    q0 = model.reference_coordinates()  # the benchmark's start: the joints close exactly
    assert float(jnp.max(jnp.abs(model.constraints(0.0, q0)))) < 1e-15
    assert model.mobility(q0) == mb.Mobility(35, 35, 0, 34, 1, 1)
    np.testing.assert_allclose(model.marker_position(q0, "bar3.b"), [1.0, -1.0, 1.0], atol=1e-15)


@pytest.mark.slow
def test_bricard_conserves_energy_with_pseudo_inverse():
    """One second of the benchmark with `PseudoInverse`: the energy stays within 1e-8 J,
    the constraints within 1e-9, and P3 moves (released from rest under gravity)."""
    model = bricard()
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 1.0, 11)
    sol = jaxdae.simulate(
        model, jaxdae.PseudoInverse(20.0, 100.0), 0.0, 1.0, q0, v0, ts=ts, rtol=1e-10, atol=1e-10
    )
    energy = jax.vmap(model.energy)(sol.ts, sol.q, sol.v)
    assert float(jnp.max(jnp.abs(energy - energy[0]))) < 1e-8
    assert float(jnp.max(jnp.abs(sol.phi))) < 1e-9
    p3 = model.marker_position(sol.q, "bar3.b")
    assert float(jnp.linalg.norm(p3[-1] - p3[0])) > 0.1


# -- transformations -------------------------------------------------------------------------


BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)


@eqx.filter_jit
def final_angle(mech, q0, v0):
    sol = jaxdae.simulate(mech, BAUMGARTE, 0.0, 0.3, q0, v0, rtol=1e-10, atol=1e-12)
    return mech.joint_coordinate("pin", sol.q[-1])


@pytest.mark.slow  # ~50 s of compile on a 2-core CPU; the planar layer's gradients run by default
def test_design_gradients_against_central_differences():
    mech = hinged()
    q0, v0 = mech.initial_state(joint_coordinates={"pin": (0.5, 0.0)})
    grads = eqx.filter_grad(final_angle)(mech, q0, v0)
    for where, h in (
        (lambda m: m.bodies[0].mass, 1e-5),
        (lambda m: m.bodies[0].markers["pivot"], jnp.array([0.0, 0.0, 1e-5])),
    ):
        value, h = where(mech), jnp.asarray(h)
        diff = (
            final_angle(eqx.tree_at(where, mech, value + h), q0, v0)
            - final_angle(eqx.tree_at(where, mech, value - h), q0, v0)
        ) / (2 * jnp.linalg.norm(h))
        gradient = where(grads) if h.ndim == 0 else where(grads) @ h / jnp.linalg.norm(h)
        assert abs(float(diff)) > 1e-4
        np.testing.assert_allclose(gradient, diff, rtol=1e-5)


@pytest.mark.slow
def test_linearize_swings_at_the_pendulum_frequency():
    """The hinged body's linearization about hanging: `±i sqrt(m g l / (I + m l²))`."""
    lin = jaxdae.linearize(hinged(), BAUMGARTE, hinged().reference_coordinates())
    omega = np.sqrt(1.3 * G * 0.4 / (0.02 + 1.3 * 0.4**2))
    assert np.min(np.abs(np.asarray(lin.eigenvalues) - 1j * omega)) < 1e-8


@pytest.mark.slow
def test_ensemble_equals_single_solves():
    mech = hinged()
    starts = [mech.initial_state(joint_coordinates={"pin": (a, 0.0)}) for a in (0.3, 0.5)]
    q0s, v0s = jnp.stack([s[0] for s in starts]), jnp.stack([s[1] for s in starts])
    ensemble = jaxdae.simulate_ensemble(mech, BAUMGARTE, 0.0, 0.3, q0s, v0s, rtol=1e-10, atol=1e-12)
    final = mech.joint_coordinates(ensemble.q[:, -1])["pin"]
    for k in range(2):
        assert float(final[k]) == pytest.approx(float(final_angle(mech, *starts[k])), abs=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "formulation",
    [
        jaxdae.Baumgarte(20.0, 100.0),
        jaxdae.PseudoInverse(20.0, 100.0),
        jaxdae.ModifiedLagrange(1e4, 20.0, 100.0),
    ],
    ids=["baumgarte", "pseudo_inverse", "ml"],
)
def test_hinged_body_formulations(formulation):
    mech = hinged(axis=(1.0, 1.0, 0.0))
    q0, v0 = mech.initial_state(joint_coordinates={"pin": (1.0, 0.0)})
    sol = jaxdae.simulate(mech, formulation, 0.0, 1.0, q0, v0, ts=jnp.linspace(0, 1, 11))
    energy = jax.vmap(mech.energy)(sol.ts, sol.q, sol.v)
    assert float(jnp.max(jnp.abs(sol.phi))) < 1e-4
    assert float(jnp.max(jnp.abs(energy - energy[0]))) < 5e-3 * abs(float(energy[0]))


# -- errors ------------------------------------------------------------------------------------


def test_bad_spatial_models_are_refused():
    body = mb.RigidBody("a", 1.0, (0.1, 0.1, 0.1), markers={"p": (0.1, 0.0, 0.0)})
    with pytest.raises(ValueError, match="not positive definite"):
        mb.RigidBody("z", 1.0, (0.1, 0.0, 0.1))
    with pytest.raises(ValueError, match="triangle inequality"):
        mb.RigidBody("z", 1.0, (0.1, 0.1, 0.5))
    with pytest.raises(ValueError, match="not a finite symmetric"):
        mb.RigidBody("z", 1.0, [[0.1, 0.05, 0], [0, 0.1, 0], [0, 0, 0.1]])
    with pytest.raises(ValueError, match="mass 0.0"):
        mb.RigidBody("z", 0.0, (0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="not a rotation matrix"):
        mb.RigidBody(
            "z", 1.0, (0.1, 0.1, 0.1), markers={"p": (0, 0, 0)}, orientations={"p": 2 * np.eye(3)}
        )
    with pytest.raises(ValueError, match="not in its `markers`"):
        mb.RigidBody("z", 1.0, (0.1, 0.1, 0.1), orientations={"p": np.eye(3)})
    with pytest.raises(ValueError, match="vector of 3 numbers"):
        mb.RigidBody("z", 1.0, (0.1, 0.1, 0.1), markers={"p": (0.0, 0.0)})
    with pytest.raises(ValueError, match="body 'b', which is not in the mechanism"):
        mb.Mechanism([body], [mb.Spherical("ground", "b")])
    with pytest.raises(ValueError, match="mixes PlanarBody and RigidBody"):
        mb.Mechanism([body, mb.PlanarBody("c", 1.0, 0.1)])
    with pytest.raises(ValueError, match="Gear, which is planar only"):
        mb.Mechanism([body], [mb.Gear("ground", "a", 2.0)])
    with pytest.raises(ValueError, match="Spherical, which is spatial only"):
        mb.Mechanism([mb.PlanarBody("c", 1.0, 0.1)], [mb.Spherical("ground", "c")])
    with pytest.raises(ValueError, match="takes no `axis`"):
        mb.Mechanism([mb.PlanarBody("c", 1.0, 0.1)], [mb.Revolute("ground", "c", axis=(0, 0, 1))])
    with pytest.raises(ValueError, match="`angle` of the joint 'prismatic_0' is for planar"):
        mb.Mechanism([body], [mb.Prismatic("ground", "a", angle=0.3)])
    with pytest.raises(ValueError, match="in this 3-D mechanism it needs"):
        mb.Mechanism([body], forces=[mb.Gravity((0.0, -9.81))])
    with pytest.raises(ValueError, match="refers to joint 'hinge', which is not in"):
        mb.Mechanism(
            [body], [mb.Revolute("ground", "a", name="pin")], [mb.JointSpringDamper("hinge", 1.0)]
        )
    with pytest.raises(ValueError, match="which has no joint coordinate"):
        mb.Mechanism(
            [body], [mb.Spherical("ground", "a", name="ball")], [mb.JointSpringDamper("ball", 1.0)]
        )
    with pytest.raises(ValueError, match="Ground marker 'o' has 2 coordinates"):
        mb.Mechanism([mb.Ground(markers={"o": (0.0, 0.0)}), body])
    with pytest.raises(ValueError, match="give it an `axis`"):
        mb.Mechanism([body], forces=[mb.Torque("a", actuator=0)])


# -- what a solve's loop holds -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.perf(
    reason="pins which primitives a spatial model's right-hand side traces and "
    "how XLA compiles its loop"
)
def test_governor_right_hand_side_runs_in_one_kernel():
    """The flyball governor (4 rigid bodies: Euler-parameter mass blocks, grouped springs,
    joints reading non-consecutive bodies) traces no scatter, sort or LAPACK call, and XLA
    compiles a loop of its right-hand side into one kernel: the while loop is hoisted into a
    call (`xla_cpu_small_call`), and holds no library fusion (`_xla_flags.py`). With the
    scatters, the 4 × 4 blocks factorized by LAPACK and the library's matrix products, an
    evaluation took 3× the time."""
    from jaxdae._integration._vector_fields import jitted_rates
    from jaxdae.examples import _flyball_governor as flyball_governor

    model = flyball_governor.governor()
    q0, v0 = flyball_governor.initial_state(model)
    formulation = jaxdae.Baumgarte(20.0, 100.0)
    jaxpr = jax.make_jaxpr(lambda q, v: jitted_rates(model, formulation, 0.0, q, v))(q0, v0).jaxpr
    assert not not_in_a_loop(jaxpr), not_in_a_loop(jaxpr)
    assert_rates_loop_is_one_kernel(model, formulation, q0, v0)


@pytest.mark.slow
@pytest.mark.perf(reason="pins how XLA compiles a loop of a 35-coordinate right-hand side")
def test_bricard_modified_lagrange_runs_in_one_kernel():
    """Bricard's mechanism (35 coordinates, 35 constraints): `ModifiedLagrange` factorizes
    its 35 × 35 `M + Jᵀ𝔄J` by loops of vector operations (`LOOPED_MAX`), not LAPACK, so XLA
    compiles a loop of the right-hand side into one kernel (with LAPACK a solve took 2.4×
    the time)."""
    model = bricard()
    q0, v0 = model.initial_state()
    assert_rates_loop_is_one_kernel(model, jaxdae.ModifiedLagrange(1e3, 20.0, 100.0), q0, v0)


def test_free_bodies_leave_out_the_test_for_a_singular_constraint_matrix(monkeypatch):
    """A mechanism of free bodies alone: its norm constraints are regular, so the
    exact-multiplier formulations' test for a singular `G M⁻¹ Gᵀ` is left out of the solve
    (a hinge brings it back), and the motion is the same as with the test."""
    from jaxdae._integration._problem import pose_problem
    from jaxdae._integration._simulate import SimulateKeywords
    from jaxdae._integration._trajectories import SingleTrajectory

    inertia = jnp.diag(jnp.array([0.3, 0.5, 0.6]))
    free = mb.Mechanism(
        [mb.RigidBody("top", 2.0, inertia, orientation=mb.rotation_matrix((1, 2, 3), 0.7))],
        forces=[mb.Gravity([0.0, 0.0, -G])],
    )
    q0 = free.reference_coordinates()
    pdot = 0.5 * body_map(q0[3:]).T @ jnp.array([1.5, -0.7, 2.2])
    v0 = jnp.concatenate([jnp.array([0.1, 0.2, 0.3]), pdot])
    call = ("simulate", {}, SimulateKeywords)
    assert free.constraints_are_regular and not hinged().constraints_are_regular
    for formulation in (jaxdae.Baumgarte(5.0, 5.0), jaxdae.Unstabilized()):
        problem, _ = pose_problem(free, formulation, 0.0, 1.0, q0, v0, call, SingleTrajectory())
        assert problem.failure is None
    hinge = hinged()
    hinge_q0, hinge_v0 = hinge.initial_state(joint_coordinates={"pin": (0.6, -1.1)})
    problem, _ = pose_problem(
        hinge, jaxdae.Baumgarte(5.0, 5.0), 0.0, 1.0, hinge_q0, hinge_v0, call, SingleTrajectory()
    )
    assert problem.failure is not None

    def final(system):
        return jaxdae.simulate(system, jaxdae.Baumgarte(5.0, 5.0), 0.0, 1.0, q0, v0).q_final

    without_test = final(free)
    monkeypatch.setattr(mb.Mechanism, "constraints_are_regular", False)
    np.testing.assert_allclose(without_test, final(free), rtol=0, atol=1e-13)
