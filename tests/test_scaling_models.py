"""The model families of `experiments/benchmarks/bench_scaling.py` (`jaxdae/examples/_scaling.py`)
on small sizes: consistent initial states, the known small cases, the same mechanism in two
coordinate sets, energy conservation, and the benchmark's peers (hand-written right-hand
side, CasADi) against jaxdae's equations."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import CartesianPendulum
from jaxdae.examples._scaling import (
    FAMILIES,
    BarNet,
    CartesianChain,
    FourBarLadder,
    NLinkPendulum,
    casadi_baumgarte_ode,
)

GAINS = (20.0, 100.0)


@eqx.filter_jit
def terms(model, q, v):
    return model.terms(0.0, q, v)


@eqx.filter_jit
def accelerations(model, formulation, q, v):
    return formulation.accelerations(model.terms(0.0, q, v))[0]


@functools.cache
def jaxdae_rate(family):
    """`(model, q, v, q̈)`: jaxdae's Baumgarte accelerations of a 2-link (2-cell) `family` at
    its initial configuration with non-zero velocities (not tangent to the manifold)."""
    model = FAMILIES[family](2)
    q, _ = model.initial_state()
    v = 0.3 * jnp.cos(jnp.arange(q.size, dtype=float))
    return model, q, v, accelerations(model, jaxdae.Baumgarte(*GAINS), q, v)


@pytest.mark.parametrize("size", [1, 3, 7])
def test_initial_states_are_consistent(size):
    for model, num in (
        (CartesianChain(size), size),
        (FourBarLadder(size), 3 * size),
        (BarNet(size), 9 * size),
    ):
        q0, v0 = model.initial_state()
        phi = model.constraints(0.0, q0)
        assert phi.shape == (num,)
        np.testing.assert_allclose(phi, 0.0, atol=1e-13)
        np.testing.assert_array_equal(v0, 0.0)
    q0, v0 = NLinkPendulum(size).initial_state()
    assert q0.shape == v0.shape == (size,)


def test_ladder_cells_are_parallelograms():
    q0, _ = FourBarLadder(4, width=0.7).initial_state()
    nodes = q0.reshape(-1, 2, 2)
    np.testing.assert_allclose(nodes[:, 1] - nodes[:, 0], [[0.7, 0.0]] * 4, atol=1e-15)


def test_single_link_chain_is_the_cartesian_pendulum():
    chain, pendulum = CartesianChain(1), CartesianPendulum()
    q, v = jnp.array([0.6, -0.8]), jnp.array([0.4, 0.3])
    a, b = terms(chain, q, v), terms(pendulum, q, v)
    for name in ("mass_matrix", "forces", "phi", "dphi", "jacobian", "bias"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-14, atol=1e-14)


def test_two_link_pendulum_has_the_double_pendulum_mass_matrix():
    q, v = jnp.array([0.3, -1.1]), jnp.array([0.7, 0.2])
    pendulum_terms = terms(NLinkPendulum(2), q, v)
    c = np.cos(-1.1)
    # unit masses at the ends of unit links, relative angles
    np.testing.assert_allclose(
        pendulum_terms.mass_matrix, [[3 + 2 * c, 1 + c], [1 + c, 1]], rtol=1e-14
    )
    assert pendulum_terms.jacobian.shape == (0, 2)


def test_chain_and_pendulum_are_the_same_mechanism():
    """`N = 3` in Cartesian and in relative joint angles at the same state: the chain's
    accelerations are the second time derivative of the pendulum's link ends."""
    chain, pendulum = CartesianChain(3), NLinkPendulum(3)
    q, v = jnp.array([0.4, -0.3, 0.9]), jnp.array([0.5, -0.2, 0.8])
    qdd = accelerations(pendulum, jaxdae.Unstabilized(), q, v)

    def ends(s):  # link ends along the pendulum's motion, s = time
        return pendulum.positions(q + s * v + 0.5 * s**2 * qdd).ravel()

    def velocity(s):
        return jax.jvp(ends, (s,), (1.0,))[1]

    p, pdot, pddot = jax.jit(lambda s: (ends(s), velocity(s), jax.jvp(velocity, (s,), (1.0,))[1]))(
        0.0
    )
    np.testing.assert_allclose(chain.constraints(0.0, p), 0.0, atol=1e-14)
    acc = accelerations(chain, jaxdae.Unstabilized(), p, pdot)
    np.testing.assert_allclose(acc, pddot, rtol=1e-12, atol=1e-12)


def test_pendulum_conserves_energy():
    pendulum = NLinkPendulum(2)
    q0, _ = pendulum.initial_state()
    v0 = jnp.array([1.0, -0.5])
    sol = jaxdae.simulate(pendulum, jaxdae.Unstabilized(), 0.0, 0.5, q0, v0)
    assert float(jnp.max(jnp.abs(sol.q_final - q0))) > 0.1  # it moved
    energy = [pendulum.energy(0.0, q, v) for q, v in ((q0, v0), (sol.q_final, sol.v_final))]
    np.testing.assert_allclose(energy[1], energy[0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_handwritten_rhs_matches_jaxdae(family):
    model, q, v, acc = jaxdae_rate(family)
    rate = jax.jit(model.handwritten_rhs())(0.0, jnp.concatenate([q, v]), GAINS)
    np.testing.assert_allclose(rate[: q.size], v, rtol=0, atol=0)
    np.testing.assert_allclose(rate[q.size :], acc, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_casadi_ode_matches_jaxdae(family):
    ca = pytest.importorskip("casadi")
    model, q, v, acc = jaxdae_rate(family)
    dae = casadi_baumgarte_ode(ca, model)
    rate = ca.Function("f", [dae["x"], dae["p"]], [dae["ode"]])(
        np.concatenate([q, v]), np.array(GAINS)
    )
    np.testing.assert_allclose(np.asarray(rate).ravel()[q.size :], acc, rtol=1e-12, atol=1e-12)


def test_sizes_are_checked():
    for cls in FAMILIES.values():
        with pytest.raises(ValueError, match="at least 1"):
            cls(0)
