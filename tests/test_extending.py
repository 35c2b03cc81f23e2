"""The examples of docs/guides/extending.md: a new formulation, joint, force element, stop,
controller and solver written with public names only. The guide's code blocks run here, in
order, as the page gives them; each part is checked against what jaxdae already has."""

import re
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.extend
import jaxdae.multibody as mb
from jaxdae.examples import CartesianPendulum

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "extending.md"


def _guide_namespace() -> dict:
    """The names the guide's ```python blocks define, run in order in one namespace."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.S | re.M)
    namespace: dict = {"__name__": "extending_guide"}
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), namespace)  # noqa: S102
    return namespace


_GUIDE = _guide_namespace()
CriticallyDamped = _GUIDE["CriticallyDamped"]
SameHeight = _GUIDE["SameHeight"]
HingeZ = _GUIDE["HingeZ"]
LinearSpring = _GUIDE["LinearSpring"]
AboveHeight = _GUIDE["AboveHeight"]
JointPD = _GUIDE["JointPD"]
MyHeun = _GUIDE["MyHeun"]


def test_the_guide_uses_public_names_only():
    text = GUIDE.read_text(encoding="utf-8")
    assert not re.search(r"jaxdae\._|from \._|import _", text)


# -- a formulation -----------------------------------------------------------------------


def test_a_new_formulation_is_baumgarte_with_tied_gains():
    pendulum = CartesianPendulum()
    q0, v0 = pendulum.state_from_angle(1.0, 0.5)
    q0 = q0 * 1.01  # off the manifold: the feedback pulls it back
    ts = jnp.linspace(0.0, 2.0, 5)
    mine = jaxdae.simulate(pendulum, CriticallyDamped(5.0), 0.0, 2.0, q0, v0, ts=ts)
    theirs = jaxdae.simulate(pendulum, jaxdae.Baumgarte(10.0, 25.0), 0.0, 2.0, q0, v0, ts=ts)
    assert mine.succeeded
    np.testing.assert_allclose(mine.q, theirs.q, atol=1e-9)
    # Critically damped at rate 5: the violation falls like (1 + 5t) e^(−5t), 5e-4 at t = 2.
    assert float(jnp.abs(mine.phi[-1, 0])) < 1e-3 * float(jnp.abs(mine.phi[0, 0]))
    # What the bases provide: the perturbation matrix, the gain checks, the failure test.
    h = jaxdae.perturbation_matrix(CriticallyDamped(5.0), 1)
    np.testing.assert_allclose(np.linalg.eigvals(np.asarray(h)), [-5.0, -5.0], atol=1e-6)
    with pytest.raises(ValueError, match="the rate k must be positive"):
        CriticallyDamped(-1.0)
    assert CriticallyDamped(5.0).can_fail


# -- a joint -------------------------------------------------------------------------------


@eqx.filter_jit
def _terms(model, q, v):
    """One compiled program per model (run eagerly, each of its operations compiles alone)."""
    return model.terms(0.0, q, v)


def _slider(slide):
    slider = mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0))
    spring = mb.SpringDamper("ground", "slider", stiffness=50.0, rest_length=0.2)
    return mb.Mechanism([slider], slide, [mb.Gravity(), spring])


@eqx.filter_jit
def _constraints_and_accelerations(model, formulation, q, v):
    """One compiled program per model (run eagerly, each of its operations compiles alone)."""
    return model.constraints(0.0, q), formulation.accelerations(model.terms(0.0, q, v))[0]


def test_a_new_joint_agrees_with_the_prismatic_joint():
    # A slider held at height 0 and at the angle 0 is the prismatic joint along x.
    mine = _slider([SameHeight("ground", "slider"), mb.Gear("ground", "slider", ratio=0.0)])
    theirs = _slider([mb.Prismatic("ground", "slider")])
    q, v = jnp.array([0.4, 0.0, 0.0]), jnp.array([1.5, 0.0, 0.0])
    formulation = jaxdae.Baumgarte(20.0, 100.0)
    phi_mine, acc_mine = _constraints_and_accelerations(mine, formulation, q, v)
    _, acc_theirs = _constraints_and_accelerations(theirs, formulation, q, v)
    np.testing.assert_allclose(phi_mine, 0.0, atol=1e-14)
    # The spring pulls towards the rest length along x only: ẍ = −k (x − ℓ₀) / m.
    np.testing.assert_allclose(acc_theirs, [-50.0 * 0.2 / 0.3, 0.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(acc_mine, acc_theirs, atol=1e-9)


# -- a force element -----------------------------------------------------------------------


def _hanging(spring):
    body = mb.PlanarBody(
        "bob", mass=1.0, inertia=0.01, markers={"top": (0.0, 0.1)}, position=(0.3, -0.5)
    )
    return mb.Mechanism([body], [], [mb.Gravity(), spring])


def test_a_new_force_element_agrees_with_the_spring_damper():
    mine = _hanging(LinearSpring("ground", "bob.top", jnp.asarray(40.0)))
    theirs = _hanging(mb.SpringDamper("ground", "bob.top", stiffness=40.0))
    q, v = jnp.array([0.3, -0.5, 0.2]), jnp.array([0.1, 0.0, -0.4])
    ours, reference = _terms(mine, q, v), _terms(theirs, q, v)
    np.testing.assert_allclose(ours.forces, reference.forces, atol=1e-12)
    np.testing.assert_allclose(ours.mass_matrix, reference.mass_matrix, atol=1e-12)

    # Its parameter is an array leaf: gradients reach it.
    def energy(k):
        return eqx.tree_at(lambda m: m.forces[1].stiffness, mine, k).energy(0.0, q, v)

    d = np.asarray([0.3, -0.5]) + 0.1 * np.asarray([-np.sin(0.2), np.cos(0.2)])
    gradient = jax.jit(jax.grad(energy))(jnp.asarray(40.0))  # one program, not one per operation
    np.testing.assert_allclose(gradient, 0.5 * d @ d, rtol=1e-12)


# -- a stop ---------------------------------------------------------------------------------


def test_a_new_stop_agrees_with_the_plane_contact():
    def model(stop):
        body = mb.PlanarBody("ball", mass=1.0, inertia=0.01, position=(0.2, 0.5))
        return mb.Mechanism([body], forces=[mb.Gravity((0.0, -9.81))], stops=[stop])

    mine = model(AboveHeight("ball", jnp.asarray(0.0), jnp.asarray(0.5)))
    theirs = model(mb.PlaneContact("ball", restitution=0.5))
    q = jnp.array([0.2, 0.5, 0.3])
    np.testing.assert_allclose(mine.gaps(0.0, q), theirs.gaps(0.0, q), atol=1e-15)
    np.testing.assert_allclose(mine.restitution(), theirs.restitution())
    assert mine.gap_names == ("aboveheight_0",)


# -- a controller --------------------------------------------------------------------------


def test_a_new_controller_holds_an_arm_at_its_reference():
    arm = mb.PlanarBody(
        "arm", mass=1.0, inertia=0.02, markers={"pin": (-0.25, 0.0)}, position=(0.25, 0.0)
    )
    model = mb.Mechanism(
        [arm],
        [mb.Revolute("ground", "arm.pin", name="shoulder")],
        [mb.Gravity(), mb.Torque("arm", 0)],
        controller=jaxdae.ConstantControl(jnp.zeros(1)),
    )
    controlled = jaxdae.with_controller(
        model, JointPD(jnp.asarray(60.0), jnp.asarray(12.0), jnp.asarray(0.3), index=2)
    )
    q0, v0 = model.initial_state()
    sol = jaxdae.simulate(controlled, jaxdae.Baumgarte(20.0, 100.0), 0.0, 4.0, q0, v0)
    angle = model.joint_coordinates(sol.q)["shoulder"][-1]
    # PD control leaves the static offset of gravity: θ − θ_ref = −m g l cos θ / k_p.
    offset = -1.0 * 9.81 * 0.25 * jnp.cos(angle) / 60.0
    np.testing.assert_allclose(angle, 0.3 + offset, atol=1e-4)


# -- registered parts ----------------------------------------------------------------------


def _pendulum(joint):
    link = mb.RigidBody("link", 0.5, 0.01 * np.eye(3), {"top": (0.0, 0.3, 0.0)})
    return mb.TreeMechanism([link], [joint], [mb.Gravity((0.0, -9.81, 0.0))])


def test_a_registered_tree_joint_carries_a_body_as_the_revolute_joint():
    mine, theirs = (
        _pendulum(HingeZ("ground", "link.top")),
        _pendulum(mb.Revolute("ground", "link.top")),
    )
    assert len(mine.coordinate_names) == len(theirs.coordinate_names) == 1
    q, v = jnp.array([0.4]), jnp.array([-0.7])
    ours, reference = _terms(mine, q, v), _terms(theirs, q, v)
    np.testing.assert_allclose(ours.mass_matrix, reference.mass_matrix, atol=1e-12)
    np.testing.assert_allclose(ours.forces, reference.forces, atol=1e-12)
    assert isinstance(
        jaxdae.extend.tree_motion(HingeZ("ground", "link.top")), jaxdae.extend.ScrewMotion
    )
    assert jaxdae.extend.tree_motion(mb.Distance("ground", "link.top", 0.3)) is None


def test_a_registered_solver_gets_its_default_adjoint():
    from jaxdae._integration._adjoint import default_adjoint

    assert isinstance(default_adjoint(MyHeun(), 100), jaxdae.ReplayAdjoint)
    assert isinstance(default_adjoint(MyHeun(), None), diffrax.RecursiveCheckpointAdjoint)
    pendulum = CartesianPendulum()
    q0, v0 = pendulum.state_from_angle(1.0, 0.0)

    def loss(kd):
        sol = jaxdae.simulate(
            pendulum, jaxdae.Baumgarte(kd, 100.0), 0.0, 0.2, q0, v0, solver=MyHeun()
        )
        return jnp.sum(sol.q[-1])

    def reference(kd):
        sol = jaxdae.simulate(
            pendulum, jaxdae.Baumgarte(kd, 100.0), 0.0, 0.2, q0, v0, solver=diffrax.Heun()
        )
        return jnp.sum(sol.q[-1])

    np.testing.assert_allclose(jax.grad(loss)(20.0), jax.grad(reference)(20.0), rtol=1e-8)


class _Independent(jaxdae.extend.AbstractIndependentVelocities):
    """A formulation declaring that its state holds the velocities of coordinates 0."""

    def independent(self, n):
        return (0,)

    def accelerations(self, terms):
        return jnp.zeros_like(terms.forces), jnp.zeros_like(terms.bias)

    def validate(self, num_holonomic, num_nonholonomic):
        return self


def test_a_declared_independent_velocities_formulation_is_read_as_such():
    from jaxdae._analysis._linearize import _state_map
    from jaxdae._integration._projection import _derives_velocities

    assert _derives_velocities(_Independent())
    assert _state_map(_Independent(), 2, ()) == ((0, 1), (0,))
    assert not _derives_velocities(jaxdae.Baumgarte(1.0, 1.0))
