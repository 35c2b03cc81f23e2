"""`GeneralizedAlpha`'s step equations from products (`M q̈` as a derivative of the momenta,
`Gᵀμ` by reverse mode) equal those from the terms' matrices."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae import _thresholds
from jaxdae._integration import _generalized_alpha as ga


class _Rope(jaxdae.LagrangianSystem):
    """Point masses in the plane on springs, with a position-dependent inertia term, a
    velocity-dependent applied force, a rod holding the first mass and a rolling-like
    nonholonomic constraint on the last: every part of the equations is exercised."""

    num: int = eqx.field(static=True)

    def kinetic_energy(self, t, q, v):
        p = q.reshape(self.num, 2)
        w = v.reshape(self.num, 2)
        return 0.5 * jnp.sum((1.0 + 0.1 * jnp.sin(p[:, :1])) * w**2) + 0.01 * t * v[0]

    def potential_energy(self, t, q):
        p = q.reshape(self.num, 2)
        stretch = jnp.sqrt(jnp.sum((p[1:] - p[:-1]) ** 2, axis=1)) - 1.0
        return 9.81 * jnp.sum(p[:, 1]) + 50.0 * jnp.sum(stretch**2)

    def generalized_forces(self, t, q, v):
        return -0.3 * v * (1.0 + q**2)

    def constraints(self, t, q):
        return jnp.array([q[:2] @ q[:2] - 1.0])

    def velocity_constraints(self, t, q, v):
        return jnp.array([jnp.cos(q[-2]) * v[-1] - jnp.sin(q[-1]) * v[-2]])


def _from_terms(x, args):
    system, t, step = args
    q, mu = ga._split(x, step)
    v, qdd, _ = step.unpack(q)
    terms = system.terms(t, q, v)
    dynamics = step.c * (terms.mass_matrix @ qdd - terms.forces) + terms.jacobian.T @ mu
    return jnp.concatenate([dynamics, terms.phi, step.h * terms.psi])


def test_product_residual_equals_the_terms_residual():
    num = _thresholds.STRUCTURED_MIN // 2 + 1  # more than STRUCTURED_MIN coordinates
    system = _Rope(num)
    key = jax.random.PRNGKey(0)
    kq, kv, ka, kx = jax.random.split(key, 4)
    q0 = jnp.stack([jnp.arange(num) * 0.9, -jnp.ones(num)], 1).reshape(-1)
    q0 = q0 + 0.05 * jax.random.normal(kq, q0.shape)
    v0 = jax.random.normal(kv, q0.shape)
    a0 = jax.random.normal(ka, q0.shape)
    solver = jaxdae.GeneralizedAlpha()
    step = solver.prepare(jnp.asarray(0.2), jnp.asarray(0.21), q0, v0, a0, 1.1 * a0)
    x = jnp.concatenate([step.q_tilde + step.c * a0, jnp.array([1e-4, -2e-4])])
    x = x + 1e-3 * jax.random.normal(kx, x.shape)
    args = (system, jnp.asarray(0.21), step)
    direction = jax.random.normal(key, x.shape)

    @jax.jit
    def both(x, direction):
        # the residuals, their derivatives along `direction` (the Newton matrix's forward
        # mode) and their transposed derivatives applied to it (the step's adjoint)
        out = []
        for residual in (lambda y: ga._residual(y, args)[0], lambda y: _from_terms(y, args)):
            value, tangent = jax.jvp(residual, (x,), (direction,))
            out.append((value, tangent, jax.vjp(residual, x)[1](direction)[0]))
        return out

    assert jax.eval_shape(lambda y: ga._residual(y, args), x)[1] == ()
    products, expected = both(x, direction)
    for got, want in zip(products, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * float(jnp.max(jnp.abs(want))))


class _Pinned(jaxdae.LagrangianSystem):
    """Twelve coordinates held by more constraints than the unrolled LU takes: the error
    estimate's projection then factorizes `G M⁻¹ Gᵀ` in the step's loop."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * jnp.sum((1.0 + 0.1 * jnp.sin(q)) * v**2)

    def potential_energy(self, t, q):
        return jnp.sum(q**2)

    def constraints(self, t, q):
        size = _thresholds.LU_UNROLL_MAX + 2
        return jnp.sin(q[:size]) + 0.1 * q[1 : size + 1] - 0.2


def test_error_projection_with_many_constraints_is_the_oblique_projection():
    """`_tangential` with more constraints than `LU_UNROLL_MAX` (a looped Cholesky of
    `G M⁻¹ Gᵀ`) removes from the error its part along `M⁻¹ Gᵀ`, as the dense formula."""
    n = _thresholds.LU_UNROLL_MAX + 6
    q = jnp.linspace(0.1, 0.9, n)
    error = jnp.cos(jnp.arange(n) * 1.3)

    @jax.jit
    def projected(q):
        terms = _Pinned().terms(0.0, q, jnp.zeros(n))
        return ga._tangential(terms, error, False), terms.jacobian, terms.mass_matrix

    tangential, g, mass = projected(q)
    across = np.linalg.solve(mass, g.T)
    expected = error - across @ np.linalg.solve(g @ across, g @ error)
    np.testing.assert_allclose(tangential, expected, rtol=0, atol=1e-13)
