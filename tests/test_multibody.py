"""The planar multibody layer: mechanisms built from bodies, joints and force elements
against hand-written models and closed-form dynamics, the formulations on a slider-crank and
a redundant four-bar, mobility, gradients, jit and vmap, and the errors of bad models."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb

G = 9.81


def accelerations(system, q, v, t=0.0):
    """Exact `(q̈, λ)` of the index-3 DAE at a consistent state (`Φ̈ = 0`)."""
    return jaxdae.Unstabilized().accelerations(system.terms(jnp.asarray(t), q, v))


# -- models ------------------------------------------------------------------------------


def slider_crank(damping=0.0):
    """Crank 0.1 m about its centre of mass, rod 0.3 m, slider on the x axis."""
    forces = [mb.Gravity()]
    if damping:
        forces.append(mb.SpringDamper("ground", "slider", damping=damping))
    return mb.Mechanism(
        bodies=[
            mb.PlanarBody("crank", mass=1.0, inertia=2e-3, markers={"pin": (0.1, 0.0)}),
            mb.PlanarBody(
                "rod",
                mass=0.5,
                inertia=4e-3,
                markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)},
                position=(0.25, 0.0),
            ),
            mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0)),
        ],
        joints=[
            mb.Revolute("ground", "crank", name="crank"),
            mb.Revolute("crank.pin", "rod.a"),
            mb.Revolute("rod.b", "slider"),
            mb.Prismatic("ground", "slider", name="slide"),
        ],
        forces=forces,
    )


def double_pendulum(l1=1.0, l2=0.7, m1=1.2, m2=0.8):
    """Two uniform rods hanging from the origin (body x axis along the rod)."""
    return mb.Mechanism(
        bodies=[
            mb.PlanarBody(
                "upper",
                mass=m1,
                inertia=m1 * l1**2 / 12,
                markers={"top": (-l1 / 2, 0.0), "bottom": (l1 / 2, 0.0)},
            ),
            mb.PlanarBody(
                "lower", mass=m2, inertia=m2 * l2**2 / 12, markers={"top": (-l2 / 2, 0.0)}
            ),
        ],
        joints=[mb.Revolute("ground", "upper.top"), mb.Revolute("upper.bottom", "lower.top")],
        forces=[mb.Gravity((0.0, -G))],
    )


class HandDoublePendulum(jaxdae.LagrangianSystem):
    """The same double pendulum written by hand in absolute coordinates."""

    l1: jax.Array
    l2: jax.Array
    m1: jax.Array
    m2: jax.Array

    def __init__(self, l1=1.0, l2=0.7, m1=1.2, m2=0.8):
        self.l1, self.l2, self.m1, self.m2 = (jnp.asarray(x) for x in (l1, l2, m1, m2))

    def kinetic_energy(self, t, q, v):
        i1, i2 = self.m1 * self.l1**2 / 12, self.m2 * self.l2**2 / 12
        return 0.5 * (
            self.m1 * (v[0] ** 2 + v[1] ** 2)
            + i1 * v[2] ** 2
            + self.m2 * (v[3] ** 2 + v[4] ** 2)
            + i2 * v[5] ** 2
        )

    def potential_energy(self, t, q):
        return G * (self.m1 * q[1] + self.m2 * q[4])

    def constraints(self, t, q):
        x1, y1, a1, x2, y2, a2 = q
        h1, h2 = self.l1 / 2, self.l2 / 2
        return jnp.array(
            [
                x1 - h1 * jnp.cos(a1),
                y1 - h1 * jnp.sin(a1),
                x2 - h2 * jnp.cos(a2) - x1 - h1 * jnp.cos(a1),
                y2 - h2 * jnp.sin(a2) - y1 - h1 * jnp.sin(a1),
            ]
        )


def parallelogram():
    """Three parallel cranks (0.5 m) on the ground at x = 0, 0.5, 1 joined by a coupler:
    a parallelogram four-bar with a redundant fifth bar (12 coordinates, 12 equations)."""
    crank = {
        "mass": 0.4,
        "inertia": 0.4 * 0.5**2 / 12,
        "markers": {"base": (-0.25, 0.0), "tip": (0.25, 0.0)},
    }
    return mb.Mechanism(
        bodies=[
            mb.Ground(markers={"A": (0.0, 0.0), "B": (0.5, 0.0), "C": (1.0, 0.0)}),
            mb.PlanarBody("left", **crank, position=(0.0, -0.25), angle=-np.pi / 2),
            mb.PlanarBody("middle", **crank, position=(0.5, -0.25), angle=-np.pi / 2),
            mb.PlanarBody("right", **crank, position=(1.0, -0.25), angle=-np.pi / 2),
            mb.PlanarBody(
                "coupler",
                mass=1.0,
                inertia=1.0 / 12,
                markers={"l": (-0.5, 0.0), "r": (0.5, 0.0)},
                position=(0.5, -0.5),
            ),
        ],
        joints=[
            mb.Revolute("ground.A", "left.base", name="left"),
            mb.Revolute("ground.B", "middle.base"),
            mb.Revolute("ground.C", "right.base"),
            mb.Revolute("left.tip", "coupler.l"),
            mb.Revolute("middle.tip", "coupler"),
            mb.Revolute("right.tip", "coupler.r"),
        ],
        forces=[mb.Gravity()],
    )


# -- hand-written references ---------------------------------------------------------------


@pytest.mark.slow
def test_physical_pendulum_closed_form():
    """A body on a revolute joint: `(I + m l²) θ̈ = −m g l sin θ`, and the reaction on the
    body is `m c̈ − m g` (Newton's law for its centre of mass)."""
    m, inertia, length = 0.7, 0.05, 0.4
    mech = mb.Mechanism(
        [mb.PlanarBody("bob", m, inertia, markers={"pivot": (0.0, length)})],
        [mb.Revolute("ground", "bob.pivot", name="pin")],
        [mb.Gravity((0.0, -G))],
    )
    theta, omega = 0.8, -1.3
    q0, v0 = mech.initial_state(
        q=jnp.array([0.0, -length, 0.0]), joint_coordinates={"pin": (theta, omega)}
    )
    assert abs(float(q0[2]) - theta) < 1e-12 and abs(float(v0[2]) - omega) < 1e-12
    acc, lam = accelerations(mech, q0, v0)
    alpha = -m * G * length * np.sin(theta) / (inertia + m * length**2)
    np.testing.assert_allclose(acc[2], alpha, rtol=1e-12)
    centre_acc = length * alpha * np.array(
        [np.cos(theta), np.sin(theta)]
    ) + length * omega**2 * np.array([-np.sin(theta), np.cos(theta)])
    np.testing.assert_allclose(acc[:2], centre_acc, rtol=1e-12, atol=1e-12)
    reaction = mech.reactions(q0, lam)["pin"]
    np.testing.assert_allclose(reaction.force, m * centre_acc - m * np.array([0.0, -G]), atol=1e-12)
    assert abs(float(reaction.torque)) < 1e-12
    assert mech.joint_coordinates(q0)["pin"] == pytest.approx(theta)
    # The same joint written the other way round: the load on the ground, about its marker.
    flipped = mb.Mechanism(
        [mb.PlanarBody("bob", m, inertia, markers={"pivot": (0.0, length)})],
        [mb.Revolute("bob.pivot", "ground", name="pin")],
        [mb.Gravity((0.0, -G))],
    )
    acc_f, lam_f = accelerations(flipped, q0, v0)
    np.testing.assert_allclose(acc_f, acc, rtol=1e-12, atol=1e-12)
    on_ground = flipped.reactions(q0, lam_f)["pin"]
    np.testing.assert_allclose(on_ground.force, -reaction.force, atol=1e-12)
    assert abs(float(on_ground.torque)) < 1e-12


def test_linearize_reads_the_input_channel():
    """A torque input on a hanging physical pendulum: `B` has `1 / (I + m l²)` in the row
    of `θ̈`, and the swinging roots are `±i sqrt(m g l / (I + m l²))`."""
    m, inertia, length = 0.7, 0.05, 0.4
    mech = mb.Mechanism(
        [mb.PlanarBody("bob", m, inertia, markers={"pivot": (0.0, length)})],
        [mb.Revolute("ground", "bob.pivot")],
        [mb.Gravity((0.0, -G)), mb.Torque("bob", actuator=0)],
    )
    assert mech.controller(0.0, jnp.zeros(3), jnp.zeros(3)).shape == (1,)
    lin = jaxdae.linearize(
        mech, jaxdae.Baumgarte(10.0, 25.0), jnp.array([0.0, -length, 0.0]), u=jnp.zeros(1)
    )
    np.testing.assert_allclose(lin.B[5, 0], 1.0 / (inertia + m * length**2), rtol=1e-10)
    omega = np.sqrt(m * G * length / (inertia + m * length**2))
    roots = np.asarray(lin.eigenvalues)
    assert np.min(np.abs(roots - 1j * omega)) < 1e-8


@pytest.mark.slow
def test_distance_joint_is_the_cartesian_pendulum():
    """A body on a massless link from the origin to its centre of mass moves like
    `examples.CartesianPendulum` and does not turn."""
    mech = mb.Mechanism(
        [mb.PlanarBody("bob", 1.3, 0.02)],
        [mb.Distance("ground", "bob", 0.9)],
        [mb.Gravity((0.0, -G))],
    )
    reference = jaxdae.examples.CartesianPendulum(mass=1.3, length=0.9, gravity=G)
    qp, vp = reference.state_from_angle(0.6, 1.7)
    q = jnp.concatenate([qp, jnp.array([0.3])])
    v = jnp.concatenate([vp, jnp.array([0.4])])
    acc, _ = accelerations(mech, q, v)
    acc_ref, _ = accelerations(reference, qp, vp)
    np.testing.assert_allclose(acc[:2], acc_ref, rtol=1e-12, atol=1e-13)
    assert abs(float(acc[2])) < 1e-13


def test_double_pendulum_matches_hand_written_terms():
    mech, hand = double_pendulum(), HandDoublePendulum()
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    qs, vs = jax.random.normal(keys[0], (5, 6)), jax.random.normal(keys[1], (5, 6))
    terms = jax.jit(jax.vmap(lambda s, q, v: s.terms(0.0, q, v), (None, 0, 0)))
    for name in ("mass_matrix", "forces", "phi", "dphi", "jacobian", "bias"):
        np.testing.assert_allclose(
            getattr(terms(mech, qs, vs), name),
            getattr(terms(hand, qs, vs), name),
            rtol=1e-12,
            atol=1e-12,
            err_msg=name,
        )
    for q, v in zip(qs, vs, strict=False):
        assert float(mech.energy(0.0, q, v)) == pytest.approx(
            float(hand.energy(0.0, q, v)), rel=1e-13
        )


@pytest.mark.slow
def test_double_pendulum_trajectory_matches_hand_written():
    mech, hand = double_pendulum(), HandDoublePendulum()
    angles = jnp.array([-0.9, -0.2])  # from the x axis; hanging is −π/2
    tip = np.array([np.cos(-0.9), np.sin(-0.9)])
    guess = jnp.array(
        [*(0.5 * tip), -0.9, *(tip + 0.35 * np.array([np.cos(-0.2), np.sin(-0.2)])), -0.2]
    )
    q0, v0 = mech.initial_state(q=guess, v=jnp.zeros(6).at[2].set(1.0))
    assert jnp.allclose(q0[jnp.array([2, 5])], angles, atol=1e-12)
    formulation, ts = jaxdae.Baumgarte(10.0, 25.0), jnp.linspace(0.0, 1.0, 6)
    kwargs = {"ts": ts, "rtol": 1e-12, "atol": 1e-12}
    sol = jaxdae.simulate(mech, formulation, 0.0, 1.0, q0, v0, **kwargs)
    ref = jaxdae.simulate(hand, formulation, 0.0, 1.0, q0, v0, **kwargs)
    np.testing.assert_allclose(sol.q, ref.q, atol=1e-10)
    np.testing.assert_allclose(sol.v, ref.v, atol=1e-10)
    np.testing.assert_allclose(sol.multipliers, ref.multipliers, atol=1e-9)


class LineTarget(eqx.Module):
    """The point `(x0 − speed t, height)` moving along a horizontal line."""

    x0: jax.Array
    speed: jax.Array
    height: jax.Array

    def __call__(self, t):
        return jnp.stack([self.x0 - self.speed * t, self.height + 0.0 * t])


def two_link_arm(arm):
    """Mukharlyamov and Deressa's (2015) two-link arm (`examples.TwoLinkManipulator`) built from
    bodies: the tip driven along the moving target by a `Driver` joint."""
    (l1, l2), (m1, m2) = arm.lengths, arm.masses
    return mb.Mechanism(
        [
            mb.PlanarBody(
                "link1", m1, m1 * l1**2 / 12, markers={"base": (-l1 / 2, 0.0), "end": (l1 / 2, 0.0)}
            ),
            mb.PlanarBody(
                "link2", m2, m2 * l2**2 / 12, markers={"base": (-l2 / 2, 0.0), "tip": (l2 / 2, 0.0)}
            ),
        ],
        [
            mb.Revolute("ground", "link1.base"),
            mb.Revolute("link1.end", "link2.base"),
            mb.Driver(
                "ground", "link2.tip", LineTarget(arm.x0, arm.speed, 0.5 * arm.length), name="tip"
            ),
        ],
        [mb.Gravity(jnp.stack([0.0, -arm.gravity]))],
    )


@pytest.mark.slow
def test_two_link_arm_matches_the_hand_written_example():
    """Up to the fold at t ≈ 0.49 s: the same angles (θ₁ and θ₂ − θ₁ of the bodies against
    the example's relative angles) and the same tip force (the driver's multipliers are the
    example's, in the order (x, y))."""
    arm = jaxdae.examples.TwoLinkManipulator()
    mech = two_link_arm(arm)

    def absolute(q):
        c1, c2 = arm._centres(q)
        return jnp.concatenate([c1, q[:1], c2, (q[0] + q[1])[None]])

    q_rel, v_rel = jaxdae.consistent_initial_state(arm, 0.0, *arm.initial_state())
    q0, v0 = jax.jvp(absolute, (q_rel,), (v_rel,))
    assert float(jnp.max(jnp.abs(mech.constraints(0.0, q0)))) < 1e-12
    assert mech.mobility(q0) == mb.Mobility(6, 6, 0, 6, 0, 0)
    formulation, ts = jaxdae.Baumgarte(20.0, 100.0), jnp.linspace(0.0, 0.4, 9)
    kwargs = dict(ts=ts, rtol=1e-12, atol=1e-12)
    sol = jaxdae.simulate(mech, formulation, 0.0, 0.4, q0, v0, **kwargs)
    ref = jaxdae.simulate(arm, formulation, 0.0, 0.4, q_rel, v_rel, **kwargs)
    angles = jnp.stack([sol.q[:, 2], sol.q[:, 5] - sol.q[:, 2]], axis=1)
    np.testing.assert_allclose(angles, ref.q, atol=1e-10)
    np.testing.assert_allclose(
        sol.multipliers[:, mech.joint_rows("tip")], ref.multipliers[:, ::-1], rtol=1e-8, atol=1e-8
    )
    tip = mech.reactions(sol.q, sol.multipliers, sol.ts)["tip"]
    np.testing.assert_allclose(tip.force, -ref.multipliers[:, ::-1], rtol=1e-8, atol=1e-8)


def ball_and_beam(bb: jaxdae.examples.BallAndBeam, voltage: float) -> mb.Mechanism:
    """Krasinskaya and Krasinskiy's (2013) Ball & Beam (`jaxdae.examples.BallAndBeam(exact=True)`)
    from bodies: a massless beam pinned at O, a massless lever (a `Distance` joint) to a pin on the
    motor's wheel, the ball rolling on the beam (`Rolling`, its centre on the beam's axis as
    in the example), and the armature circuit as a rotor whose angle is the charge `s`
    (inertia `L_a`; resistance and friction as rotational dampers, the motor's torque and
    back-emf as applied torques). Bodies: ball, beam, wheel, armature."""
    big, d, lever = bb.beam_length, bb.lever_radius, bb.lever_length
    wheel, armature = 6, 9  # offsets of the bodies' (x, y, θ): ball 0, beam 3
    return mb.Mechanism(
        [
            mb.Ground(markers={"hub": (big - d, -lever), "motor": (0.0, -1.0)}),
            mb.PlanarBody("ball", bb.mass, bb.ball_inertia),
            mb.PlanarBody("beam", 0.0, 0.0, markers={"end": (big, 0.0)}),
            mb.PlanarBody(
                "wheel",
                1.0,
                bb.motor_inertia,
                markers={"pin": (d, 0.0)},
                position=(big - d, -lever),
            ),
            mb.PlanarBody("armature", 1.0, bb.inductance, position=(0.0, -1.0)),
        ],
        [
            mb.Revolute("ground", "beam", name="pivot"),
            mb.Revolute("ground.hub", "wheel", name="wheel"),
            mb.Revolute("ground.motor", "armature", name="charge"),
            mb.Distance("beam.end", "wheel.pin", lever, name="lever"),
            mb.Rolling("beam", "ball", bb.radius, name="roll"),
        ],
        [
            mb.Gravity((0.0, -bb.gravity)),
            mb.RotationalSpringDamper("ground", "wheel", damping=bb.friction),
            mb.RotationalSpringDamper("ground", "armature", damping=bb.resistance),
            mb.Torque("wheel", actuator=lambda t, q, v: bb.torque_constant * v[armature + 2]),
            mb.Torque(
                "armature",
                actuator=lambda t, q, v: (
                    bb.amplifier_gain * voltage - bb.emf_constant * v[wheel + 2]
                ),
            ),
        ],
    )


def _ball_and_beam_pair(voltage=2.0):
    bb = jaxdae.examples.BallAndBeam(
        exact=True, controller=jaxdae.ConstantControl(jnp.array([voltage]))
    )
    mech = ball_and_beam(bb, voltage)

    def absolute(q):
        r, theta, alpha, charge = q
        zero = jnp.zeros(())
        return jnp.stack(
            [
                r * jnp.cos(alpha),
                r * jnp.sin(alpha),
                alpha - r / bb.radius,
                zero,
                zero,
                alpha,
                bb.beam_length - bb.lever_radius,
                -bb.lever_length,
                theta,
                zero,
                -1.0 + zero,
                charge,
            ]
        )

    def relative(q):  # (r, θ, α, s) of the built model's coordinates
        return jnp.stack([q[0] * jnp.cos(q[5]) + q[1] * jnp.sin(q[5]), q[8], q[5], q[11]])

    return bb, mech, absolute, relative


@pytest.mark.slow
def test_ball_and_beam_matches_the_hand_written_terms():
    """Krasinskaya and Krasinskiy's (2013) Ball & Beam built from bodies (a massless beam and lever,
    the ball rolling on the beam, the motor's circuit as a rotor): at consistent states, the
    accelerations r̈, θ̈, α̈, s̈ and the energy of the hand-written model."""
    bb, mech, absolute, relative = _ball_and_beam_pair()

    @eqx.filter_jit
    def compare(mech, bb, q_hand, v_hand):
        q0, v0 = jax.jvp(absolute, (q_hand,), (v_hand,))
        acc, _ = accelerations(mech, q0, v0)
        rates, acc_rel = jax.jvp(lambda q, v: jax.jvp(relative, (q,), (v,))[1], (q0, v0), (v0, acc))
        kinetic = mech.kinetic_energy(0.0, q0, v0), bb.kinetic_energy(0.0, q_hand, v_hand)
        return (
            jnp.max(jnp.abs(mech.constraints(0.0, q0))),
            rates,
            acc_rel,
            accelerations(bb, q_hand, v_hand)[0],
            kinetic,
        )

    for r, theta, dr, dtheta, current in [(0.3, 0.2, 0.1, 0.5, 0.05), (-0.4, -0.5, -0.3, 1.2, 0.4)]:
        q_hand, v_hand = bb.state(r, theta, dr=dr, dtheta=dtheta, current=current)
        phi, rates, acc, expected, (kinetic, kinetic_hand) = compare(mech, bb, q_hand, v_hand)
        assert float(phi) < 1e-12
        np.testing.assert_allclose(rates, v_hand, rtol=0, atol=1e-13)
        np.testing.assert_allclose(acc, expected, rtol=1e-10, atol=1e-12)
        # the armature rotor's kinetic energy is the circuit's magnetic energy ½ L_a i²
        assert float(kinetic) == pytest.approx(float(kinetic_hand), rel=1e-13)
    q0 = absolute(q_hand)
    assert mech.mobility(q0) == mb.Mobility(12, 9, 3, 9, 3, 0)


@pytest.mark.slow
def test_ball_and_beam_matches_the_hand_written_example():
    """The builder's Ball & Beam against Krasinskaya and Krasinskiy's (2013) hand-written model: the
    same r, θ, α and charge s over 0.5 s with the motor driven at 2 V (the beam is massless, as in
    the example)."""
    bb, mech, absolute, relative = _ball_and_beam_pair()
    q_hand, v_hand = bb.state(0.3, 0.2, dr=0.1, dtheta=0.5, current=0.05)
    q0, v0 = jax.jvp(absolute, (q_hand,), (v_hand,))
    formulation, ts = jaxdae.Baumgarte(20.0, 100.0), jnp.linspace(0.0, 0.5, 6)
    kwargs = {"ts": ts, "rtol": 1e-12, "atol": 1e-12}
    sol = jaxdae.simulate(mech, formulation, 0.0, 0.5, q0, v0, **kwargs)
    ref = jaxdae.simulate(bb, formulation, 0.0, 0.5, q_hand, v_hand, **kwargs)
    np.testing.assert_allclose(jax.vmap(relative)(sol.q), ref.q, rtol=0, atol=1e-10)
    np.testing.assert_allclose(mech.joint_coordinates(sol.q)["roll"], ref.q[:, 0], atol=1e-10)
    np.testing.assert_allclose(sol.v[:, 11], ref.v[:, 3], rtol=0, atol=1e-10)  # current
    assert float(jnp.ptp(ref.q[:, 0])) > 1e-3  # the ball moves


def test_a_massless_body_must_be_held_by_joints():
    with pytest.raises(ValueError, match="'beam' has no mass or no moment of inertia"):
        mb.Mechanism([mb.PlanarBody("beam", 0.0, 0.0)], [mb.Revolute("ground", "beam")])
    with pytest.raises(ValueError, match="positive finite `radius`"):
        mb.Rolling("a", "b", 0.0)


# -- joints and force elements against closed forms ---------------------------------------


@pytest.mark.slow
def test_gear_torque_input_and_rotational_spring():
    """Two wheels pivoted at their centres, geared `θ_b = −2 θ_a`; a torque input `u` on
    `a`, a rotational spring-damper `τ_b = −k (θ_b − θ₀) − c θ̇_b` on `b`:
    `(I_a + 4 I_b) θ̈_a = u − 2 τ_b`."""
    ia, ib, k, c, rest = 0.3, 0.05, 4.0, 0.7, 0.2
    mech = mb.Mechanism(
        [
            mb.Ground(markers={"axle": (1.0, 0.0)}),
            mb.PlanarBody("a", 1.0, ia),
            mb.PlanarBody("b", 0.5, ib, position=(1.0, 0.0)),
        ],
        [mb.Revolute("ground", "a"), mb.Revolute("ground.axle", "b"), mb.Gear("a", "b", -2.0)],
        [mb.Torque("a", actuator=0), mb.RotationalSpringDamper("ground", "b", k, c, rest)],
    )
    assert mech.mobility() == mb.Mobility(6, 5, 1, 5, 1, 0)
    mech = jaxdae.with_controller(mech, jaxdae.ConstantControl(jnp.array([1.5])))
    theta, omega = 0.4, -0.9
    q0, v0 = mech.initial_state(
        q=jnp.array([0.0, 0.0, theta, 1.0, 0.0, -2 * theta]),
        v=jnp.array([0.0, 0.0, omega, 0.0, 0.0, -2 * omega]),
    )
    acc, _ = accelerations(mech, q0, v0)
    torque_b = -k * (-2 * theta - rest) - c * (-2 * omega)
    expected = (1.5 - 2 * torque_b) / (ia + 4 * ib)
    np.testing.assert_allclose(acc[2], expected, rtol=1e-12)
    np.testing.assert_allclose(acc[5], -2 * expected, rtol=1e-12)


@pytest.mark.slow
def test_slider_with_spring_force_and_point_on_line():
    """A block on an inclined line (point-on-line, turning free) pulled by a spring-damper
    and a local force: `m s̈ = −k (s − ℓ₀) − c ṡ + F + m g·u` along the line."""
    slope = 0.3
    u = np.array([np.cos(slope), np.sin(slope)])
    m, k, c, rest, push = 0.8, 30.0, 1.5, 0.2, 2.0
    mech = mb.Mechanism(
        [mb.PlanarBody("block", m, 0.01)],
        [mb.PointOnLine("ground", "block", axis=tuple(u), name="line")],
        [
            mb.Gravity((0.0, -G)),
            mb.SpringDamper("ground", "block", k, c, rest),
            mb.Force("block", push, direction=(1.0, 0.0), local=True),
        ],
    )
    s, sdot, angle = 0.5, -0.4, slope  # the block's x axis along the line: the push is along u
    q0, v0 = mech.initial_state(q=jnp.array([*(s * u), angle]), v=jnp.array([*(sdot * u), 0.0]))
    acc, _ = accelerations(mech, q0, v0)
    expected = (-k * (s - rest) - c * sdot + push + m * np.array([0.0, -G]) @ u) / m
    np.testing.assert_allclose(acc[:2], expected * u, rtol=1e-12, atol=1e-12)
    assert abs(float(acc[2])) < 1e-12
    assert mech.joint_coordinates(q0)["line"] == pytest.approx(s)
    assert mech.joint_rates(q0, v0)["line"] == pytest.approx(sdot)


def test_fixed_and_prismatic_mobility():
    body = {"mass": 1.0, "inertia": 0.1}
    welded = mb.Mechanism(
        [mb.PlanarBody("a", **body), mb.PlanarBody("b", **body, markers={"p": (1.0, 0.0)})],
        [mb.Fixed("ground", "a"), mb.Prismatic("a", "b.p", axis=(0.0, 1.0))],
    )
    assert welded.mobility() == mb.Mobility(6, 5, 1, 5, 1, 0)
    q = jnp.array([0.0, 0.0, 0.0, -1.0, 0.3, 0.0])
    assert jnp.allclose(welded.constraints(0.0, q), 0.0)
    assert welded.joint_coordinates(q)["prismatic_0"] == pytest.approx(0.3)


def test_marker_velocity_is_the_derivative_of_its_position():
    mech = double_pendulum()
    q, v = jnp.arange(6.0) / 7, jnp.cos(jnp.arange(6.0))
    _, expected = jax.jvp(lambda q_: mech.marker_position(q_, "lower.top"), (q,), (v,))
    np.testing.assert_allclose(mech.marker_velocity(q, v, "lower.top"), expected, rtol=1e-13)
    batch = mech.marker_position(jnp.stack([q, 2 * q]), "upper.bottom")
    assert batch.shape == (2, 2)
    np.testing.assert_allclose(batch[1], mech.marker_position(2 * q, "upper.bottom"))


# -- formulations, mobility, redundancy ----------------------------------------------------


@pytest.fixture(scope="module")
def crank_start():
    mech = slider_crank()
    return mech, mech.initial_state(joint_coordinates={"crank": (0.5, 10.0)})


@pytest.mark.slow
def test_slider_crank_initial_state_and_mobility(crank_start):
    mech, (q0, v0) = crank_start
    assert mech.mobility(q0) == mb.Mobility(9, 8, 1, 8, 1, 0)
    assert float(jnp.max(jnp.abs(mech.constraints(0.0, q0)))) < 1e-12
    assert mech.joint_coordinates(q0)["crank"] == pytest.approx(0.5)
    assert mech.joint_rates(q0, v0)["crank"] == pytest.approx(10.0)
    # The slider is where the crank and rod put it: x = r cos φ + sqrt(l² − r² sin² φ).
    x = 0.1 * np.cos(0.5) + np.sqrt(0.3**2 - (0.1 * np.sin(0.5)) ** 2)
    assert mech.joint_coordinates(q0)["slide"] == pytest.approx(x, rel=1e-12)


@pytest.mark.parametrize(
    "formulation, tol, energy_tol",
    [
        (jaxdae.Baumgarte(20.0, 100.0), 1e-6, 1e-6),
        pytest.param(jaxdae.PseudoInverse(20.0, 100.0), 1e-6, 1e-6, marks=pytest.mark.slow),
        # The modified Lagrange equation leaves a violation of order 1/alpha (measured here:
        # |Φ| ≤ 1.3e-5, relative energy drift 1.3e-3 at alpha = 1e4; 1.3e-4, 1.3e-2 at 1e3).
        pytest.param(jaxdae.ModifiedLagrange(1e4, 20.0, 100.0), 1e-4, 5e-3, marks=pytest.mark.slow),
    ],
    ids=["baumgarte", "pseudo_inverse", "modified_lagrange"],
)
@pytest.mark.slow
def test_slider_crank_formulations(crank_start, formulation, tol, energy_tol):
    mech, (q0, v0) = crank_start
    sol = jaxdae.simulate(mech, formulation, 0.0, 1.0, q0, v0, ts=jnp.linspace(0.0, 1.0, 21))
    assert float(jnp.max(jnp.abs(sol.phi))) < tol
    energy = jax.vmap(mech.energy)(sol.ts, sol.q, sol.v)
    assert float(jnp.max(jnp.abs(energy - energy[0]))) < energy_tol * float(jnp.abs(energy[0]))
    # The crank turns through several revolutions.
    assert float(mech.joint_coordinates(sol.q)["crank"][-1]) > 0.5 + 2 * np.pi


@pytest.mark.slow  # the default run keeps redundant constraints (test_core.py)
def test_redundant_parallelogram_with_pseudo_inverse():
    mech = parallelogram()
    assert mech.mobility().grubler == 0
    q0, v0 = mech.initial_state(joint_coordinates={"left": (-1.2, 2.0)})
    assert mech.mobility(q0) == mb.Mobility(12, 12, 0, 11, 1, 1)
    sol = jaxdae.simulate(
        mech, jaxdae.PseudoInverse(20.0, 100.0), 0.0, 1.0, q0, v0, ts=jnp.linspace(0.0, 1.0, 11)
    )
    assert float(jnp.max(jnp.abs(sol.phi))) < 1e-7
    energy = jax.vmap(mech.energy)(sol.ts, sol.q, sol.v)
    assert float(jnp.max(jnp.abs(energy - energy[0]))) < 1e-6 * float(jnp.abs(energy[0]))
    # The coupler stays horizontal and the three cranks parallel.
    angles = sol.q[:, jnp.array([2, 5, 8])]
    assert float(jnp.max(jnp.abs(sol.q[:, 11]))) < 1e-6
    assert float(jnp.max(jnp.abs(angles - angles[:, :1]))) < 1e-6
    reactions = mech.reactions(sol.q, sol.multipliers)
    assert reactions["left"].force.shape == (11, 2)


# -- gradients, jit and vmap ----------------------------------------------------------------


def sprung_pendulum(mass, stiffness):
    return mb.Mechanism(
        [
            mb.Ground(markers={"anchor": (0.5, 0.0)}),
            mb.PlanarBody("bob", mass, 0.02, markers={"pivot": (0.0, 0.5)}, position=(0.0, -0.5)),
        ],
        [mb.Revolute("ground", "bob.pivot")],
        [mb.Gravity(), mb.SpringDamper("ground.anchor", "bob", stiffness, 0.3, 0.6)],
    )


BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)


@eqx.filter_jit
def final_angle(mech):
    q0 = jnp.array([0.5 * jnp.sin(0.4), -0.5 * jnp.cos(0.4), 0.4])
    sol = jaxdae.simulate(mech, BAUMGARTE, 0.0, 0.5, q0, jnp.zeros(3), rtol=1e-10, atol=1e-12)
    return sol.q[-1, 2]


@pytest.mark.slow
def test_gradients_against_central_differences():
    mech = sprung_pendulum(0.7, 5.0)
    grads = eqx.filter_grad(final_angle)(mech)
    for where, h in (
        (lambda m: m.bodies[0].mass, 1e-5),
        (lambda m: m.forces[1].stiffness, 1e-4),
        (lambda m: m.ground.markers["anchor"], jnp.array([1e-5, 0.0])),
    ):
        value = where(mech)
        h = jnp.asarray(h)
        diff = (
            final_angle(eqx.tree_at(where, mech, value + h))
            - final_angle(eqx.tree_at(where, mech, value - h))
        ) / (2 * jnp.linalg.norm(h))
        gradient = where(grads) if h.ndim == 0 else where(grads) @ h / jnp.linalg.norm(h)
        assert abs(float(diff)) > 1e-3
        np.testing.assert_allclose(gradient, diff, rtol=1e-5)


@pytest.mark.slow
def test_vmap_over_a_parameter_under_jit():
    stiffnesses = jnp.array([2.0, 5.0, 9.0])
    batched = jax.jit(jax.vmap(lambda k: final_angle(sprung_pendulum(0.7, k))))(stiffnesses)
    single = jnp.stack([final_angle(sprung_pendulum(0.7, k)) for k in stiffnesses])
    np.testing.assert_allclose(batched, single, rtol=1e-10)
    assert float(jnp.ptp(batched)) > 1e-3


# -- errors ----------------------------------------------------------------------------------


def test_bad_models_are_refused(unchecked):
    body = mb.PlanarBody("a", 1.0, 0.1, markers={"p": (0.1, 0.0)})
    with pytest.raises(ValueError, match="body 'b', which is not in the mechanism"):
        mb.Mechanism([body], [mb.Revolute("ground", "b")])
    with pytest.raises(ValueError, match="has no marker 'q'"):
        mb.Mechanism([body], [mb.Revolute("ground", "a.q")])
    with pytest.raises(
        ValueError, match="force element 'springdamper_0' refers to body 'c', which is not"
    ):
        mb.Mechanism([body], forces=[mb.SpringDamper("ground", "c.p", 1.0)])
    with pytest.raises(ValueError, match="mass -1.0"):
        mb.PlanarBody("z", -1.0, 0.1)
    with pytest.raises(ValueError, match="inertia -1.0"):
        mb.PlanarBody("z", 1.0, -1.0)
    with pytest.raises(ValueError, match="Duplicate body names"):
        mb.Mechanism([body, mb.PlanarBody("a", 2.0, 0.2)])
    with pytest.raises(ValueError, match="Duplicate joint names"):
        mb.Mechanism(
            [body], [mb.Revolute("ground", "a", name="j"), mb.Fixed("ground", "a", name="j")]
        )
    with pytest.raises(ValueError, match="joins body 'a' to itself"):
        mb.Mechanism([body], [mb.Revolute("a", "a.p")])
    with pytest.raises(ValueError, match="pass an instance"):
        mb.Mechanism([body], [mb.Revolute])
    with pytest.raises(ValueError, match="without '.'"):
        mb.PlanarBody("a.b", 1.0, 0.1)
    with pytest.raises(ValueError, match="'ground' names the fixed frame"):
        mb.PlanarBody("ground", 1.0, 0.1)
    with pytest.raises(ValueError, match="positive finite `length`"):
        mb.Distance("ground", "a", 0.0)
    with pytest.raises(ValueError, match="vector of 2 numbers"):
        mb.PlanarBody("a", 1.0, 0.1, markers={"p": (0.1, 0.0, 0.0)})
    with pytest.raises(ValueError, match="has no joint coordinate"):
        mb.Mechanism([body], [mb.Fixed("ground", "a", name="w")]).initial_state(
            joint_coordinates={"w": 0.1}
        )
