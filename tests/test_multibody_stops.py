"""Stops of mechanisms (`jaxdae/multibody/_stop.py`): joint limits, plane contacts and
distance stops against closed forms, URDF limits, and the errors of bad stops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae.examples import PendulumWithStop

G = 9.81
TIGHT = {"rtol": 1e-11, "atol": 1e-13}


def rod_with_limit(restitution, upper=-np.pi / 2):
    """A uniform rod (length 1, mass 1) on a revolute joint at its top. Its angle `θ` (the
    joint coordinate) is `−π/2` hanging straight down, and limited to `θ ≤ upper`."""
    return mb.Mechanism(
        bodies=[
            mb.PlanarBody(
                "rod",
                mass=1.0,
                inertia=1 / 12,
                markers={"top": (-0.5, 0.0)},
                position=(0.0, -0.5),
                angle=-np.pi / 2,
            )
        ],
        joints=[mb.Revolute("ground", "rod.top", name="pivot")],
        forces=[mb.Gravity((0.0, -G))],
        stops=[mb.JointLimit("pivot", upper=upper, restitution=restitution, name="stop")],
    )


@pytest.mark.slow  # the default run covers the event solve in test_events.py
def test_joint_limit_matches_the_pendulum_against_a_stop():
    """A rod swinging into its joint limit: the impact times of the equivalent simple
    pendulum (length `I_pivot / (m d)` = 2/3) against the wall, to 1e-10."""
    e = 0.5
    model = rod_with_limit(e)
    assert model.gap_names == ("stop.upper",)
    q0, v0 = model.initial_state(joint_coordinates={"pivot": -np.pi / 2 - 0.8})
    sol = jaxdae.simulate(model, jaxdae.Baumgarte(20.0, 100.0), 0.0, 2.0, q0, v0, **TIGHT)
    count = int(sol.events.count)
    assert count >= 2 and sol.succeeded
    reference = PendulumWithStop(length=2 / 3, e=e).impact_times(0.8, count)
    np.testing.assert_allclose(sol.events.t[:count], reference, rtol=0, atol=1e-10)
    angles = jax.vmap(lambda q: model.joint_coordinate("pivot", q))(sol.q)
    assert float(jnp.max(angles)) < -np.pi / 2 + 1e-9


@pytest.mark.slow
def test_plane_contact_of_a_disc_and_a_distance_stop():
    """A disc of radius 0.1 dropped on the ground line bounces like `BouncingBall`; a
    distance stop `d ≤ 1` makes a taut rope of a free mass."""
    disc = mb.Mechanism(
        bodies=[mb.PlanarBody("disc", mass=2.0, inertia=0.01, position=(0.0, 1.1))],
        forces=[mb.Gravity((0.0, -G))],
        stops=[mb.PlaneContact("disc", radius=0.1, restitution=0.8)],
    )
    q0, v0 = disc.initial_state()
    sol = jaxdae.simulate(disc, jaxdae.Unstabilized(), 0.0, 1.5, q0, v0, **TIGHT)
    reference = jaxdae.examples.BouncingBall(e=0.8).impact_times(1.0, 2)
    np.testing.assert_allclose(sol.events.t[:2], reference, rtol=0, atol=1e-10)

    rope = mb.Mechanism(
        bodies=[mb.PlanarBody("mass", mass=1.0, inertia=0.01, position=(0.6, 0.0))],
        forces=[mb.Gravity((0.0, -G))],
        stops=[mb.DistanceStop("ground", "mass", upper=1.0, name="rope")],
    )
    q0, v0 = rope.initial_state()
    sol = jaxdae.simulate(rope, jaxdae.Unstabilized(), 0.0, 1.0, q0, v0, **TIGHT)
    # free fall until |p| = 1: y = −0.8 at t = √(1.6/g); the rope then holds it (plastic)
    np.testing.assert_allclose(sol.events.t[0], np.sqrt(1.6 / G), atol=1e-10)
    assert int(sol.events.kind[0]) == jaxdae.Events.CONTACT
    np.testing.assert_allclose(jnp.linalg.norm(sol.q_final[:2]), 1.0, atol=1e-8)


@pytest.mark.slow
def test_newtons_cradle_passes_the_momentum_on():
    """Three equal balls on a line, the last two 1 mm apart: elastic impacts one after the
    other hand the first ball's velocity to the last."""
    balls = [
        mb.PlanarBody(f"b{k}", mass=1.0, inertia=0.01, position=(0.101 * k, 0.0)) for k in range(3)
    ]
    model = mb.Mechanism(
        bodies=balls,
        joints=[mb.Prismatic("ground", f"b{k}", name=f"slide{k}") for k in range(3)],
        stops=[mb.DistanceStop(f"b{k}", f"b{k + 1}", lower=0.1, restitution=1.0) for k in range(2)],
    )
    q0, v0 = model.initial_state(joint_coordinates={"slide0": (-0.5, 1.0)})
    sol = jaxdae.simulate(model, jaxdae.Baumgarte(20.0, 100.0), 0.0, 1.0, q0, v0, **TIGHT)
    assert int(sol.events.count) == 2
    rates = model.joint_rates(sol.q_final, sol.v_final)
    np.testing.assert_allclose([rates[f"slide{k}"] for k in range(3)], [0.0, 0.0, 1.0], atol=1e-10)


def test_urdf_limits_are_enforced_by_default():
    pytest.importorskip("yourdfpy", reason="URDF import needs yourdfpy")
    robot = mb.load_urdf("tests/data/three_link_arm.urdf")
    limited = robot.mechanism(forces=[mb.Gravity()])
    assert limited.gap_names == (
        "shoulder.limit.lower",
        "shoulder.limit.upper",
        "elbow.limit.lower",
        "elbow.limit.upper",
        "wrist.limit.lower",
        "wrist.limit.upper",
    )
    # at zero joint coordinates, the limits' distances: ±1.5, ±2.5 and [0, 0.1]
    gaps = jax.jit(lambda q: limited.gaps(0.0, q))(limited.reference_coordinates())
    np.testing.assert_allclose(gaps, [1.5, 1.5, 2.5, 2.5, 0.0, 0.1], atol=1e-12)
    np.testing.assert_allclose(limited.restitution(), np.zeros(6))
    assert robot.mechanism(limits=False).gap_names == ()


def test_bad_stops_are_refused():
    body = mb.PlanarBody("b", mass=1.0, inertia=0.1)
    with pytest.raises(ValueError, match="exceeds its `upper`"):
        mb.JointLimit("j", lower=1.0, upper=0.0)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        mb.PlaneContact("b", restitution=-0.1)
    with pytest.raises(ValueError, match="needs a `lower` or an `upper`"):
        mb.DistanceStop("ground", "b")
    with pytest.raises(ValueError, match="non-negative"):
        mb.PlaneContact("b", radius=-1.0)
    for point, surface in (("b.tip", "b"), ("ground", "ground.floor")):
        with pytest.raises(ValueError, match="on one body, so its gap never changes"):
            mb.PlaneContact(point, surface)
    with pytest.raises(ValueError, match="has no joint coordinate"):
        mb.Mechanism(
            [body],
            [mb.Distance("ground", "b", 1.0, name="d")],
            stops=[mb.JointLimit("d", upper=0.0)],
        )
    with pytest.raises(ValueError, match="unknown|not in the mechanism|no joint"):
        mb.Mechanism([body], stops=[mb.JointLimit("missing", upper=0.0)])
    with pytest.raises(ValueError, match="`normal`"):
        mb.Mechanism([body], stops=[mb.PlaneContact("b", normal=(0.0, 0.0, 1.0))])


def test_plane_contact_in_space_slips_along_two_tangents():
    """In space a contact's slip velocity is the contact point's velocity on the sphere less
    the surface's, along two orthonormal tangents of the plane: rolling without slipping
    gives zero, a spin about the normal none either."""
    radius = 0.1
    ball = mb.RigidBody("ball", mass=1.0, inertia=np.eye(3), position=[0.0, 0.0, radius])
    tilted = mb.PlaneContact("ball", normal=[0.0, 1.0, 1.0], radius=radius, friction=0.3)
    for stop in (mb.PlaneContact("ball", radius=radius, friction=0.3), tilted):
        mech = mb.Mechanism(bodies=[ball], stops=[stop])
        q = mech.reference_coordinates()
        normal = np.array([0.0, 0.0, 1.0]) if stop.normal is None else np.asarray(stop.normal)
        normal = normal / np.linalg.norm(normal)

        def slip(velocity, spin, mech=mech, q=q):
            # At the reference orientation `ė = (0, ω/2)`.
            v = jnp.concatenate([jnp.asarray(velocity), jnp.zeros(1), 0.5 * jnp.asarray(spin)])
            np.testing.assert_allclose(mech.angular_velocity(q, v, "ball"), spin, atol=1e-14)
            return np.asarray(mech.slip_velocities(0.0, q, v))

        along = np.cross(normal, [1.0, 0.0, 0.0])
        along = along / np.linalg.norm(along)
        assert slip(along, np.zeros(3)).shape == (1, 2)
        np.testing.assert_allclose(np.linalg.norm(slip(along, np.zeros(3))), 1.0, rtol=1e-12)
        rolling = np.cross(normal, along) / radius
        np.testing.assert_allclose(slip(along, rolling), 0.0, atol=1e-12)
        np.testing.assert_allclose(slip(np.zeros(3), 5.0 * normal), 0.0, atol=1e-12)


def test_a_known_frictionless_contact_compiles_no_friction_inside_jit():
    """A contact made with a known `μ = 0` keeps no coefficient, so the mechanism's
    coefficients are known at trace time even where it is built inside `jax.jit` (its
    tangential rows are then not compiled); a traced `μ`, zero or not, stays traced."""

    def coefficients(radius, friction):
        disc = mb.Mechanism(
            bodies=[mb.PlanarBody("disc", mass=1.0, inertia=0.01, position=(0.0, 0.5))],
            stops=[
                mb.PlaneContact("disc", radius=radius, friction=friction),
                mb.DistanceStop("ground", "disc", upper=2.0),
            ],
        )
        return disc.friction()

    known = []
    jax.jit(lambda r: known.append(coefficients(r, 0.0)) or r)(0.1)
    assert isinstance(known[0], np.ndarray) and known[0].tolist() == [0.0, 0.0]
    traced = []
    jax.jit(lambda mu: traced.append(coefficients(0.1, mu)) or mu)(0.0)
    assert isinstance(traced[0], jax.core.Tracer)
    assert mb.PlaneContact("disc").friction is None
    assert float(mb.PlaneContact("disc", friction=0.5).friction) == 0.5
