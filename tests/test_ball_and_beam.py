"""Krasinskaya and Krasinskiy (2013) §6: LQR on the simplified Ball & Beam stabilizes the exact
redundant model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import BallAndBeam

R0 = 0.25
NUM_SAVED = 9


@pytest.fixture(scope="module")
def design():
    exact, simple = BallAndBeam(exact=True), BallAndBeam(exact=False)
    # The simplified model at its closed-form equilibrium (eq. [35]; `jaxdae.equilibrium`
    # finds it in the slow test_equilibrium_matches_paper), the exact one at the equilibrium
    # that `jaxdae.equilibrium` solves for, with its cyclic coordinate and its input.
    q_s, v_s, u_s = simple.equilibrium_state(R0)
    eq_e = jaxdae.equilibrium(
        exact, exact.equilibrium_state(R0)[0], fixed=(0,), cyclic=exact.cyclic, u_guess=[0.0]
    )
    lin_s = jaxdae.linearize(
        simple, jaxdae.Baumgarte(1.0, 1.0), q_s, v_s, u_s, cyclic=simple.cyclic
    )
    lqr = jaxdae.lqr(lin_s.A, lin_s.B, jnp.eye(5), jnp.eye(1))
    pos, vel = exact.feedback_indices
    closed = jaxdae.with_controller(
        exact, jaxdae.LinearFeedback(lqr.gain, eq_e.q, eq_e.v, eq_e.u, pos, vel)
    )
    return dict(
        exact=exact,
        simple=simple,
        eq_e=eq_e,
        lin_s=lin_s,
        lqr=lqr,
        closed=closed,
        shulgin=jaxdae.RedundantCoordinates(dependent=exact.dependent),
    )


def _run(design, formulation, t1, q0, v0):
    ts = jnp.linspace(0.0, t1, NUM_SAVED)
    return jaxdae.simulate(design["closed"], formulation, 0.0, t1, q0, v0, ts=ts)


@pytest.mark.slow
def test_equilibrium_matches_paper(design):
    exact = design["exact"]
    q35, v35, u35 = exact.equilibrium_state(R0)
    eq = design["eq_e"]
    np.testing.assert_allclose(eq.q, q35, atol=1e-10)
    np.testing.assert_allclose(eq.v, v35, rtol=1e-9, atol=1e-12)  # i₀ = (d/L) m g r₀ / K₂
    np.testing.assert_allclose(eq.u, u35, rtol=1e-9)  # e₀ = R_a i₀ / K₁
    simple = design["simple"]
    eq_s = jaxdae.equilibrium(
        simple, simple.equilibrium_state(R0)[0], fixed=(0,), cyclic=simple.cyclic, u_guess=[0.0]
    )
    for got, expected in zip((eq_s.q, eq_s.v, eq_s.u), simple.equilibrium_state(R0), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_four_bar_geometry(design):
    exact = design["exact"]

    @jax.jit  # one program for the four angles (eagerly, each operation compiles alone)
    def residuals(theta):
        q, v = exact.state(0.3, theta, dtheta=0.7)
        _, dphi, _, _ = jaxdae._systems._system.holonomic_terms(exact.constraints, 0.0, q, v)
        return exact.constraints(0.0, q)[0], dphi[0]

    for theta in (-0.8, 0.0, 0.5, 1.3):
        phi, dphi = residuals(theta)
        assert abs(float(phi)) < 1e-14
        assert abs(float(dphi)) < 1e-14
    q, v = exact.state(0.3, 0.0, dtheta=1.0)
    np.testing.assert_allclose(v[2], exact.lever_radius / exact.beam_length, rtol=1e-12)


@pytest.mark.slow
def test_roots_exact_equal_simplified_plus_one_zero(design):
    lqr = design["lqr"]
    lin = jaxdae.linearize(
        design["closed"],
        design["shulgin"],
        design["eq_e"].q,
        design["eq_e"].v,
        cyclic=design["exact"].cyclic,
    )
    assert lin.A.shape == (6, 6)
    assert int(lin.num_zero_roots) == 1 == lin.num_constraints
    assert bool(lin.asymptotically_stable)
    nonzero = np.asarray(lin.eigenvalues)[np.abs(lin.eigenvalues) > lin.tol]
    np.testing.assert_allclose(
        np.sort_complex(nonzero),
        np.sort_complex(np.asarray(lqr.closed_loop_eigenvalues)),
        rtol=1e-7,
        atol=1e-9,
    )
    # Open loop: one zero root and an unstable root (the ball rolls off).
    open_loop = jaxdae.linearize(
        design["exact"],
        design["shulgin"],
        design["eq_e"].q,
        design["eq_e"].v,
        design["eq_e"].u,
        cyclic=design["exact"].cyclic,
    )
    assert int(open_loop.num_zero_roots) == 1
    assert not bool(open_loop.asymptotically_stable)
    assert open_loop.B.shape == (6, 1)


@pytest.mark.slow
def test_shulgin_agrees_with_baumgarte_in_closed_loop(design):
    q0, v0 = design["exact"].state(R0 + 0.1, 0.2, current=design["eq_e"].v[3])
    shulgin = _run(design, design["shulgin"], 4.0, q0, v0)
    baum = _run(design, jaxdae.Baumgarte(20.0, 100.0), 4.0, q0, v0)
    np.testing.assert_allclose(shulgin.q, baum.q, atol=1e-7)
    np.testing.assert_allclose(shulgin.v, baum.v, atol=1e-7)


def test_closed_loop_converges_on_exact_model(design):
    eq = design["eq_e"]
    for dr, theta in ((0.05, 0.0), (-0.05, 0.3)):
        q0, v0 = design["exact"].state(R0 + dr, theta, current=eq.v[3])
        sol = _run(design, design["shulgin"], 60.0, q0, v0)
        assert abs(float(sol.q[-1, 0]) - R0) < 1e-3
        assert abs(float(sol.q[-1, 1])) < 1e-3
        assert abs(float(sol.v[-1, 3] - eq.v[3])) < 1e-3
        assert np.abs(sol.phi).max() < 1e-8


def test_alpha_branch_is_differentiable(design):
    exact = design["exact"]
    slope = jax.grad(exact.alpha_of_theta)(0.0)
    np.testing.assert_allclose(slope, exact.lever_radius / exact.beam_length, rtol=1e-10)


@pytest.mark.slow
def test_equilibrium_jit_vmap_grad(design):
    simple = design["simple"]

    def voltage(r0):
        eq = jaxdae.equilibrium(
            simple, jnp.zeros(3).at[0].set(r0), fixed=(0,), cyclic=simple.cyclic, u_guess=[0.0]
        )
        return eq.u[0]

    # Eq. [35]: e0 = R_a (d/L) m g r0 / (K1 K2), linear in r0.
    slope = (
        simple.resistance
        * simple.lever_radius
        / simple.beam_length
        * simple.mass
        * simple.gravity
        / (simple.amplifier_gain * simple.torque_constant)
    )
    grads = jax.jit(jax.vmap(jax.grad(voltage)))(jnp.array([0.2, 0.6]))
    np.testing.assert_allclose(grads, [slope, slope], rtol=1e-8)


def test_controller_errors(unchecked, design):
    eq = design["eq_e"]
    with pytest.raises(ValueError, match="no `controller` field"):
        jaxdae.with_controller(jaxdae.examples.CartesianPendulum(), jaxdae.ConstantControl(0.0))
    with pytest.raises(ValueError, match="must be a `jaxdae.AbstractController`"):
        jaxdae.with_controller(design["exact"], lambda t, q, v: q[:1])
    with pytest.raises(ValueError, match="`gain` must have shape"):
        jaxdae.LinearFeedback(jnp.ones((1, 4)), eq.q, eq.v, eq.u, (0, 1), (0, 1, 3))


@pytest.mark.slow
def test_linearize_rejects_non_cyclic(design):
    eq = design["eq_e"]
    with pytest.raises(ValueError, match="not cyclic"):
        jaxdae.linearize(design["closed"], design["shulgin"], eq.q, eq.v, cyclic=(0,))
