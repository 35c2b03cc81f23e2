"""`jaxdae.lqr`: Riccati residual, SciPy agreement, implicit gradients, jit/vmap, errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import jaxdae


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(3)
    n, p = 4, 2
    a = rng.normal(size=(n, n))
    b = rng.normal(size=(n, p))
    q = np.eye(n) + 0.1 * np.ones((n, n))
    r = np.array([[2.0, 0.3], [0.3, 1.0]])
    return a, b, q, r


def test_agrees_with_scipy_and_residual_vanishes(problem):
    a, b, q, r = problem
    sol = jaxdae.lqr(a, b, q, r)
    p_ref = scipy.linalg.solve_continuous_are(a, b, q, r)
    np.testing.assert_allclose(sol.riccati, p_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(sol.gain, np.linalg.solve(r, b.T @ p_ref), rtol=1e-10, atol=1e-10)
    p = np.asarray(sol.P)
    residual = a.T @ p + p @ a - p @ b @ np.linalg.solve(r, b.T) @ p + q
    assert np.abs(residual).max() < 1e-11
    assert float(sol.residual) < 1e-11
    assert np.all(np.real(sol.closed_loop_eigenvalues) < 0)
    np.testing.assert_allclose(sol.K, sol.gain)


def test_unstable_open_loop_double_integrator():
    # Classic: A = [[0,1],[0,0]], B = [0,1]^T, Q = I, R = 1 → K = [1, √3].
    sol = jaxdae.lqr(jnp.array([[0.0, 1.0], [0.0, 0.0]]), jnp.array([0.0, 1.0]), jnp.eye(2), 1.0)
    np.testing.assert_allclose(sol.gain, [[1.0, np.sqrt(3.0)]], rtol=1e-12)


def _functional(a, b, q, r):
    sol = jaxdae.lqr(a, b, q, r)
    weights = jnp.arange(1.0, 1.0 + sol.P.size).reshape(sol.P.shape)
    return jnp.sum(weights * sol.P) + jnp.sum(jnp.sin(sol.K))


def test_gradient_matches_central_differences(problem):
    a, b, q, r = problem
    grads = jax.grad(_functional, argnums=(0, 1, 2, 3))(a, b, q, r)
    rng = np.random.default_rng(7)
    h = 1e-6
    for i, x in enumerate((a, b, q, r)):
        direction = rng.normal(size=x.shape)
        if i >= 2:  # weights are symmetrized: perturb symmetrically
            direction = direction + direction.T
        args_plus = [a, b, q, r]
        args_minus = [a, b, q, r]
        args_plus[i] = x + h * direction
        args_minus[i] = x - h * direction
        fd = (_functional(*args_plus) - _functional(*args_minus)) / (2 * h)
        ad = np.sum(np.asarray(grads[i]) * direction)
        np.testing.assert_allclose(ad, fd, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_jit_and_vmap(problem):
    a, b, q, r = problem
    ref = jaxdae.lqr(a, b, q, r).gain
    jitted = eqx.filter_jit(lambda a_: jaxdae.lqr(a_, b, q, r).gain)(a)
    np.testing.assert_allclose(jitted, ref, rtol=1e-10)
    scales = jnp.array([1.0, 2.0, 5.0])
    gains = jax.vmap(lambda s: jaxdae.lqr(a, b, s * q, r).gain)(scales)
    for s, k in zip(scales, gains, strict=False):
        np.testing.assert_allclose(
            k,
            np.linalg.solve(r, b.T @ scipy.linalg.solve_continuous_are(a, b, float(s) * q, r)),
            rtol=1e-9,
            atol=1e-9,
        )


def test_not_stabilizable_raises():
    a = np.diag([1.0, 2.0])  # the mode λ = 2 is unstable and not actuated
    b = np.array([[1.0], [0.0]])
    with pytest.raises(ValueError, match="not stabilizable"):
        jaxdae.lqr(a, b, np.eye(2), np.eye(1))


def test_not_stabilizable_traced_is_an_error():
    b = np.array([[1.0], [0.0]])
    with pytest.raises(Exception, match="stabiliz"):
        eqx.filter_jit(lambda a_: jaxdae.lqr(a_, b, jnp.eye(2), jnp.eye(1)).gain)(
            jnp.diag(jnp.array([1.0, 2.0]))
        ).block_until_ready()


def test_bad_input(unchecked):
    with pytest.raises(ValueError, match="square"):
        jaxdae.lqr(np.ones((2, 3)), np.ones((2, 1)), np.eye(2), np.eye(1))
    with pytest.raises(ValueError, match="`B` must have shape"):
        jaxdae.lqr(np.eye(2), np.ones((3, 1)), np.eye(2), np.eye(1))
    with pytest.raises(ValueError, match="`R` must be symmetric positive definite"):
        jaxdae.lqr(np.eye(2), np.ones((2, 1)), np.eye(2), -np.eye(1))
    with pytest.raises(ValueError, match="`Q` must have shape"):
        jaxdae.lqr(np.eye(2), np.ones((2, 1)), np.eye(3), np.eye(1))
    with pytest.raises(ValueError, match="`Q` contains non-finite values"):
        jaxdae.lqr(np.eye(2), np.ones((2, 1)), np.full((2, 2), np.nan), np.eye(1))


@pytest.mark.slow
def test_float32_stays_float32(problem):
    a, b, q, r = (np.asarray(x, dtype=np.float32) for x in problem)
    sol = jaxdae.lqr(a, b, q, r)
    assert sol.P.dtype == jnp.float32 and sol.K.dtype == jnp.float32
    p_ref = scipy.linalg.solve_continuous_are(*(x.astype(float) for x in (a, b, q, r)))
    np.testing.assert_allclose(sol.P, p_ref, rtol=1e-4, atol=1e-4)
