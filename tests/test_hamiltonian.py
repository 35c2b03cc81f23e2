"""Hamiltonian-form DAEs (Shemelova (2016), eqs. [3]–[6]) against the Lagrangian form (eqs.
[1]–[2])."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import jaxdae
from jaxdae.examples import CartesianArm, CartesianArmLagrangian, ChaplyginSleigh

TS = jnp.linspace(0.0, 2.0, 11)
MASSES = (1.0, 2.5)
FORCES = (0.3, -0.5, 0.2, 0.4)
C = (-64.0, -16.0, -25.0, -6.0)  # ÿ1 = c1 y1 + c2 ẏ1 (double root −8), ÿ2 = c3 y2 + c4 ẏ2


@eqx.filter_jit
def run(system, formulation, q0, s0, ts):
    return jaxdae.simulate(system, formulation, ts[0], ts[-1], q0, s0, ts=ts)


@pytest.fixture(scope="module")
def arm_runs():
    arm = CartesianArm(masses=MASSES, forces=FORCES)
    lag = CartesianArmLagrangian(masses=MASSES, forces=FORCES)
    q0, p0 = arm.initial_state()
    v0 = lag.velocities(0.0, q0, p0 / jnp.repeat(arm.masses, 2))
    f = CartesianArm.paper_formulation(*C)
    return dict(arm=arm, lag=lag, q0=q0, p0=p0, v0=v0, f=f)


@pytest.mark.slow
def test_hamiltonian_matches_lagrangian(arm_runs):
    arm, lag, f = arm_runs["arm"], arm_runs["lag"], arm_runs["f"]
    q0, p0, v0 = arm_runs["q0"], arm_runs["p0"], arm_runs["v0"]
    h = run(arm, f, q0, p0, TS)
    lg = run(lag, f, q0, v0, TS)
    lt = run(jaxdae.HamiltonianForm(lag), f, q0, lag.momenta(0.0, q0, v0), TS)
    assert float(jnp.max(jnp.abs(h.q[-1] - h.q[0]))) > 0.1  # it moves
    for other in (lg, lt):
        np.testing.assert_allclose(h.q, other.q, atol=1e-8)
        np.testing.assert_allclose(h.v, other.v, atol=1e-8)
        np.testing.assert_allclose(h.p, other.p, atol=1e-8)
        np.testing.assert_allclose(h.multipliers, other.multipliers, atol=1e-6)
        np.testing.assert_allclose(h.energy, other.energy, atol=1e-8)
    # p = M v for the arm
    np.testing.assert_allclose(h.p, h.v * jnp.repeat(jnp.asarray(MASSES), 2), atol=1e-12)
    assert float(jnp.max(jnp.abs(h.phi))) < 1e-8


@pytest.mark.slow
def test_energy_conserved_without_forces(arm_runs):
    arm = CartesianArm(masses=MASSES)  # same structure: same compiled program
    sol = run(arm, arm_runs["f"], arm_runs["q0"], arm_runs["p0"], TS)
    assert float(jnp.ptp(sol.energy)) < 1e-8
    np.testing.assert_allclose(sol.energy, arm.hamiltonian(0.0, sol.q[0], sol.p[0]), rtol=1e-8)


def test_perturbations_follow_paper_equations(arm_runs):
    """Off the manifold, y_i(t) obey ÿ1 = c1 y1 + c2 ẏ1, ÿ2 = c3 y2 + c4 ẏ2 exactly."""
    arm = arm_runs["arm"]
    q0 = arm_runs["q0"] * jnp.array([1.02, 1.02, 1.0, 0.97])
    p0 = arm_runs["p0"] + jnp.array([0.05, 0.0, 0.0, -0.05])
    sol = run(arm, arm_runs["f"], q0, p0, TS)
    for i, (c_y, c_dy) in enumerate([(C[0], C[1]), (C[2], C[3])]):
        h = np.array([[0.0, 1.0], [c_y, c_dy]])
        y0 = np.array([sol.phi[0, i], sol.dphi[0, i]])
        assert abs(y0[0]) > 1e-3
        expected = np.stack([scipy.linalg.expm(h * float(t)) @ y0 for t in TS])
        np.testing.assert_allclose(sol.phi[:, i], expected[:, 0], atol=1e-8)
        np.testing.assert_allclose(sol.dphi[:, i], expected[:, 1], atol=1e-7)


@pytest.mark.slow
def test_nonholonomic_in_hamiltonian_form():
    sleigh = ChaplyginSleigh(mass=1.0, inertia=0.1, distance=0.5)
    q0, v0 = sleigh.initial_state(0.5, 2.0)
    system = jaxdae.HamiltonianForm(sleigh)
    sol = run(system, jaxdae.Baumgarte(20.0, 100.0, kv=10.0), q0, sleigh.momenta(0.0, q0, v0), TS)
    th = sol.q[:, 2]
    u = sol.v[:, 0] * jnp.cos(th) + sol.v[:, 1] * jnp.sin(th)
    u_ref, w_ref, th_ref = sleigh.reduced_solution(TS, 0.5, 2.0)
    np.testing.assert_allclose(u, u_ref, atol=1e-7)
    np.testing.assert_allclose(sol.v[:, 2], w_ref, atol=1e-7)
    np.testing.assert_allclose(th, th_ref, atol=1e-7)
    assert float(jnp.max(jnp.abs(sol.psi))) < 1e-8
    assert float(jnp.ptp(sol.energy)) < 1e-8


@pytest.mark.slow
def test_hamiltonian_grad_and_vmap(arm_runs):
    """d q(t1) / d m2 against central differences; vmap over initial momenta."""
    q0, p0, f = arm_runs["q0"], arm_runs["p0"], arm_runs["f"]
    ts = jnp.linspace(0.0, 0.5, TS.shape[0])  # same shapes as TS: no new compilation

    def final_x(m2, p):
        arm = CartesianArm(masses=jnp.stack([jnp.array(MASSES[0]), m2]), forces=FORCES)
        return run(arm, f, q0, p, ts).q[-1, 2]

    # One compiled program: the gradient w.r.t. m2 of a vmapped batch of initial momenta.
    m2 = jnp.array(MASSES[1])
    batch, grads = jax.vmap(jax.value_and_grad(final_x), in_axes=(None, 0))(
        m2, jnp.stack([p0, 0.5 * p0])
    )
    h = 1e-5
    fd = (final_x(m2 + h, p0) - final_x(m2 - h, p0)) / (2 * h)
    np.testing.assert_allclose(grads[0], fd, rtol=1e-5)
    assert abs(float(grads[0])) > 1e-3

    np.testing.assert_allclose(batch[0], final_x(m2, p0), atol=1e-9)
    assert abs(float(batch[0] - batch[1])) > 1e-3


class VectorHamiltonian(jaxdae.HamiltonianSystem):
    def hamiltonian(self, t, q, p):
        return 0.5 * p * p


def test_bad_input(unchecked):
    with pytest.raises(ValueError, match="LagrangianSystem"):
        jaxdae.HamiltonianForm(CartesianArm())
    with pytest.raises(ValueError, match="scalar"):
        jaxdae.simulate(
            VectorHamiltonian(), jaxdae.Unstabilized(), 0.0, 1.0, jnp.zeros(2), jnp.ones(2)
        )
    arm = CartesianArm()
    q0, p0 = arm.initial_state()
    with pytest.raises(ValueError, match="same shape"):
        jaxdae.simulate(arm, jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, q0, p0[:3])
    with pytest.raises(TypeError):  # abstract: `hamiltonian` is required
        jaxdae.HamiltonianSystem()  # pyright: ignore[reportAbstractUsage]
