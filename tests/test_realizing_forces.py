"""Realizing nonholonomic constraints by forces on the free system (Matyukhin (1999))."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import CartesianPendulum, ChaplyginSleigh

T1 = 2.0
TS = jnp.linspace(0.0, T1, 41)


@eqx.filter_jit
def run(system, formulation, q0, v0, ts):
    return jaxdae.simulate(system, formulation, ts[0], ts[-1], q0, v0, ts=ts, max_steps=200_000)


@pytest.fixture(scope="module")
def sleigh():
    return ChaplyginSleigh(mass=1.0, inertia=0.1, distance=0.5)


@pytest.fixture(scope="module")
def constrained(sleigh):
    q0, v0 = sleigh.initial_state(0.5, 2.0)
    return q0, v0, run(sleigh, jaxdae.Baumgarte(20.0, 100.0, kv=10.0), q0, v0, TS)


def free_run(sleigh, force, q0, v0):
    free = jaxdae.RealizedConstraints(sleigh, force)
    sol = run(free, jaxdae.Unstabilized(), q0, v0, TS)
    return sol, free.residuals(sol)[:, 0]


@pytest.mark.slow
def test_viscous_converges_as_k_grows(sleigh, constrained):
    """Theorem 1: for a turning motion (non-zero reaction) ψ settles at O(r / k), not 0; the
    free motions converge to the constrained one as k → ∞. Near the straight motion (zero
    reaction) ψ decays at finite k: a lateral kick ψ₀ = 0.1 dies out (as the reaction of the
    nearby turning motion does)."""
    q0, v0, ref = constrained
    q_straight, v_straight = sleigh.initial_state(0.5, 0.0)
    v_straight = v_straight + jnp.array([0.0, 0.1, 0.0])  # ψ₀ = 0.1
    ks = jnp.array([10.0, 100.0, 1000.0, 100.0])
    q0s = jnp.stack([q0, q0, q0, q_straight])
    v0s = jnp.stack([v0, v0, v0, v_straight])

    def one(k, q, v):
        sol, psi = free_run(sleigh, jaxdae.ViscousForce(k), q, v)
        return sol.q, psi

    q, psi = jax.vmap(one)(ks, q0s, v0s)
    max_psi = jnp.max(jnp.abs(psi[:3]), axis=1)
    distance = jnp.max(jnp.linalg.norm(q[:3] - ref.q, axis=-1), axis=1)
    assert bool(jnp.all(jnp.diff(max_psi) < 0)) and bool(jnp.all(jnp.diff(distance) < 0))
    ratio = float(max_psi[1] / max_psi[2])
    assert 5.0 < ratio < 20.0, ratio  # ψ = O(1/k)
    assert float(max_psi[2]) > 1e-5  # finite k: not zero on a motion with a reaction
    assert float(jnp.abs(psi[3, -1])) < 1e-3 * 0.1  # ψ(T) < 1e-3 ψ₀


@pytest.mark.slow
def test_bounded_force_reaches_constraint_in_finite_time(sleigh, constrained):
    """Theorem 2: R̄ = r̄ + η drives ψ to 0 in finite time and keeps it there; R̄ < r̄ fails."""
    q0, v0, ref = constrained
    r_bar = jaxdae.reaction_bound(ref)
    assert r_bar.shape == (1,) and float(r_bar[0]) > 0.3
    v_off = v0 + jnp.array([0.0, 0.2, 0.0])  # ψ₀ = 0.2
    sol, psi = free_run(sleigh, jaxdae.BoundedForce(r_bar + 1.0), q0, v_off)
    # |ψ̇| ≥ b η with b = A M⁻¹ Aᵀ = 1/m + a²/J = 3.5: reached before 0.2 / 3.5 ≈ 0.06 s
    assert abs(float(psi[0])) == pytest.approx(0.2)
    assert float(jnp.max(jnp.abs(psi[TS >= 0.1]))) < 1e-7
    # too weak a bound: the needed reaction exceeds R̄, the motion leaves/never reaches ψ = 0
    _, weak = free_run(sleigh, jaxdae.BoundedForce(0.5 * r_bar), q0, v_off)
    assert float(jnp.max(jnp.abs(weak[TS >= 0.1]))) > 1e-2


@pytest.mark.slow
def test_smooth_bounded_force_gradient(sleigh, constrained):
    q0, v0, _ = constrained
    v_off = v0 + jnp.array([0.0, 0.2, 0.0])
    ts = jnp.linspace(0.0, 0.02, TS.shape[0])  # still approaching ψ = 0: ψ̇ ≈ −b R̄, b = 3.5

    def final_x(bound):
        free = jaxdae.RealizedConstraints(sleigh, jaxdae.BoundedForce(bound, smoothing=1e-2))
        return free.residuals(run(free, jaxdae.Unstabilized(), q0, v_off, ts))[-1, 0]

    # One compiled program for the central differences and the gradient.
    h = 1e-5
    values, grads = jax.jit(jax.vmap(jax.value_and_grad(final_x)))(
        jnp.array([2.0 + h, 2.0 - h, 2.0])
    )
    np.testing.assert_allclose(grads[2], (values[0] - values[1]) / (2 * h), rtol=1e-4)
    assert -0.1 < float(grads[2]) < -0.03


@pytest.mark.slow
def test_custom_force_equals_viscous(sleigh, constrained):
    q0, v0, _ = constrained
    a, _ = free_run(sleigh, jaxdae.ViscousForce(50.0), q0, v0)
    b, _ = free_run(sleigh, jaxdae.CustomForce(lambda psi: -50.0 * psi), q0, v0)
    np.testing.assert_allclose(a.q, b.q, atol=1e-9)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jaxdae.ViscousForce(-1.0), "`k` must be positive"),
        (lambda: jaxdae.ViscousForce(0.0), "`k` must be positive"),
        (lambda: jaxdae.ViscousForce(jnp.ones((2, 2))), "one value per nonholonomic"),
        (lambda: jaxdae.BoundedForce(0.0), "`bound` must be positive"),
        (lambda: jaxdae.BoundedForce(1.0, smoothing=-1e-3), "`smoothing` must be positive"),
        (lambda: jaxdae.BoundedForce(1.0, rate=0.0), "`rate` must be positive"),
        (lambda: jaxdae.RealizedConstraints(CartesianPendulum(), "viscous"), "realizing-force law"),
    ],
)
def test_bad_parameters(unchecked, make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_systems(sleigh):
    q0, v0 = sleigh.initial_state(0.5, 2.0)
    pendulum = jaxdae.RealizedConstraints(CartesianPendulum(), jaxdae.ViscousForce(1.0))
    with pytest.raises(ValueError, match="needs a system with nonholonomic"):
        jaxdae.simulate(
            pendulum, jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, jnp.array([0.0, -1.0]), jnp.zeros(2)
        )
    free = jaxdae.RealizedConstraints(sleigh, jaxdae.ViscousForce(jnp.ones(2)))
    with pytest.raises(ValueError, match="1 nonholonomic"):
        jaxdae.simulate(free, jaxdae.Unstabilized(), 0.0, 1.0, q0, v0)
    custom = jaxdae.RealizedConstraints(sleigh, jaxdae.CustomForce(lambda psi: jnp.zeros(2)))
    with pytest.raises(ValueError, match="must return shape"):
        jaxdae.simulate(custom, jaxdae.Unstabilized(), 0.0, 1.0, q0, v0)
