"""The examples of docs/guides/extending.md: a new formulation, joint, force element and
controller written with public names only, each checked against what jaxdae already has."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae.examples import CartesianPendulum

# -- a formulation -----------------------------------------------------------------------


class CriticallyDamped(jaxdae.AbstractExactMultipliers, jaxdae.AbstractBaumgarteFormulation):
    """Baumgarte stabilization with one rate `k`: `K_D = 2k`, `K_P = k²`, `K_V = k`."""

    kd: jax.Array
    kp: jax.Array
    kv: jax.Array
    rcond: float | None = None
    gain_names: ClassVar[tuple[str, ...]] = ("kd", "kp", "kv")
    gain_condition: ClassVar[str] = "the rate k must be positive"

    def __init__(self, rate):
        rate = jnp.asarray(rate, float)
        self.kd, self.kp, self.kv = 2 * rate, rate**2, rate

    def accelerations(self, terms):
        return jaxdae.multiplier_solve(terms, self.target(terms))


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


class SameHeight(mb.AbstractJoint):
    """Marker `b` stays at the height of marker `a`: `y_b − y_a = 0` (one equation)."""

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    name: str | None = eqx.field(default=None, static=True)
    num_equations: ClassVar[int] = 1

    def residual(self, t, a, b):
        return (b.point - a.point)[1:2]


def _slider_crank(slide):
    crank = mb.PlanarBody("crank", mass=1.0, inertia=2e-3, markers={"pin": (0.1, 0.0)})
    rod = mb.PlanarBody("rod", mass=0.5, inertia=4e-3,
                        markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)}, position=(0.25, 0.0))
    slider = mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0))
    joints = [mb.Revolute("ground", "crank", name="crank"), mb.Revolute("crank.pin", "rod.a"),
              mb.Revolute("rod.b", "slider"), *slide]
    return mb.Mechanism([crank, rod, slider], joints, [mb.Gravity()])


def test_a_new_joint_agrees_with_the_prismatic_joint():
    # A slider held at height 0 and at the angle 0 is the prismatic joint along x.
    mine = _slider_crank([SameHeight("ground", "slider"),
                          mb.Gear("ground", "slider", ratio=0.0)])
    theirs = _slider_crank([mb.Prismatic("ground", "slider")])
    ts = jnp.linspace(0.0, 0.5, 6)
    formulation = jaxdae.Baumgarte(20.0, 100.0)
    solutions = []
    for model in (mine, theirs):
        q0, v0 = model.initial_state(joint_coordinates={"crank": (0.5, 10.0)})
        solutions.append(jaxdae.simulate(model, formulation, 0.0, 0.5, q0, v0, ts=ts))
    assert solutions[0].succeeded
    np.testing.assert_allclose(solutions[0].q, solutions[1].q, atol=1e-7)


# -- a force element -----------------------------------------------------------------------


class LinearSpring(mb.AbstractForce):
    """A spring of zero rest length between markers `a` and `b`: `V = ½ k |p_b − p_a|²`."""

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    stiffness: jax.Array
    name: str | None = eqx.field(default=None, static=True)

    @property
    def markers(self):
        return (self.a, self.b)

    def potential_energy(self, kin):
        d = kin.frame(self.b).point - kin.frame(self.a).point
        return 0.5 * self.stiffness * d @ d


def _hanging(spring):
    body = mb.PlanarBody("bob", mass=1.0, inertia=0.01, markers={"top": (0.0, 0.1)},
                         position=(0.3, -0.5))
    return mb.Mechanism([body], [], [mb.Gravity(), spring])


def test_a_new_force_element_agrees_with_the_spring_damper():
    mine = _hanging(LinearSpring("ground", "bob.top", jnp.asarray(40.0)))
    theirs = _hanging(mb.SpringDamper("ground", "bob.top", stiffness=40.0))
    q0, v0 = mine.initial_state()
    ts = jnp.linspace(0.0, 1.0, 6)
    a, b = (jaxdae.simulate(model, jaxdae.Unstabilized(), 0.0, 1.0, q0, v0, ts=ts)
            for model in (mine, theirs))
    np.testing.assert_allclose(a.q, b.q, atol=1e-9)
    np.testing.assert_allclose(a.energy, a.energy[0], atol=1e-7)  # conservative
    # Its parameter is an array leaf: gradients reach it.
    def final_height(k):
        model = eqx.tree_at(lambda m: m.forces[1].stiffness, mine, k)
        return jaxdae.simulate(model, jaxdae.Unstabilized(), 0.0, 1.0, q0, v0).q[-1, 1]

    assert np.isfinite(float(jax.grad(final_height)(jnp.asarray(40.0))))


# -- a controller --------------------------------------------------------------------------


class JointPD(jaxdae.AbstractController):
    """A motor torque `u = −k_p (θ − θ_ref) − k_d θ̇` on the angle of coordinate `index`."""

    kp: jax.Array
    kd: jax.Array
    reference: jax.Array
    index: int = eqx.field(static=True)

    def __call__(self, t, q, v):
        return jnp.stack([-self.kp * (q[self.index] - self.reference) - self.kd * v[self.index]])


def test_a_new_controller_holds_an_arm_at_its_reference():
    arm = mb.PlanarBody("arm", mass=1.0, inertia=0.02, markers={"pin": (-0.25, 0.0)},
                        position=(0.25, 0.0))
    model = mb.Mechanism([arm], [mb.Revolute("ground", "arm.pin", name="shoulder")],
                         [mb.Gravity(), mb.Torque("arm", 0)],
                         controller=jaxdae.ConstantControl(jnp.zeros(1)))
    controlled = jaxdae.with_controller(
        model, JointPD(jnp.asarray(60.0), jnp.asarray(12.0), jnp.asarray(0.3), index=2))
    q0, v0 = model.initial_state()
    sol = jaxdae.simulate(controlled, jaxdae.Baumgarte(20.0, 100.0), 0.0, 4.0, q0, v0)
    angle = model.joint_coordinates(sol.q)["shoulder"][-1]
    # PD control leaves the static offset of gravity: θ − θ_ref = −m g l cos θ / k_p.
    offset = -1.0 * 9.81 * 0.25 * jnp.cos(angle) / 60.0
    np.testing.assert_allclose(angle, 0.3 + offset, atol=1e-4)
