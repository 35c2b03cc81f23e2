"""Shulgin's equations (`jaxdae.RedundantCoordinates`), equilibria and linearization (Krasinskaya
and Krasinskiy (2013))."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import CartesianPendulum


class RodPendulum(jaxdae.LagrangianSystem):
    """A rod (inertia `I` about the pivot) carrying a point mass, written with the redundant
    coordinates `q = (θ, x, y)` and two geometric constraints `x = l sin θ`, `y = −l cos θ`."""

    inertia: jax.Array
    mass: jax.Array
    length: jax.Array
    damping: jax.Array

    def __init__(self, inertia=0.2, mass=1.0, length=1.0, damping=0.0):
        self.inertia = jnp.asarray(inertia, dtype=float)
        self.mass = jnp.asarray(mass, dtype=float)
        self.length = jnp.asarray(length, dtype=float)
        self.damping = jnp.asarray(damping, dtype=float)

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.inertia * v[0] ** 2 + 0.5 * self.mass * (v[1] ** 2 + v[2] ** 2)

    def potential_energy(self, t, q):
        return self.mass * 9.81 * q[2]

    def generalized_forces(self, t, q, v):
        return jnp.array([-self.damping * v[0], 0.0, 0.0])

    def constraints(self, t, q):
        return jnp.array([q[1] - self.length * jnp.sin(q[0]), q[2] + self.length * jnp.cos(q[0])])

    def state(self, angle, rate):
        q = jnp.array([angle, jnp.sin(angle), -jnp.cos(angle)]) * jnp.array([1.0, 1.0, 1.0])
        q = q.at[1:].multiply(self.length)
        v = rate * jnp.array([1.0, self.length * jnp.cos(angle), self.length * jnp.sin(angle)])
        return q, v


class DampedPendulum(jaxdae.LagrangianSystem):
    """`CartesianPendulum` with viscous damping `−c v` (one geometric constraint)."""

    damping: jax.Array

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * q[1]

    def generalized_forces(self, t, q, v):
        return -self.damping * v

    def constraints(self, t, q):
        return jnp.array([q @ q - 1.0])


TS = jnp.linspace(0.0, 1.5, 7)
SHULGIN = jaxdae.RedundantCoordinates(dependent=(1, 2))


def _simulate(system, formulation, q0, v0, **kwargs):
    return jaxdae.simulate(system, formulation, 0.0, 1.5, q0, v0, ts=TS, **kwargs)


@pytest.fixture(scope="module")
def rod_shulgin():
    """The rod pendulum, its initial state and its solve by Shulgin's equations."""
    system = RodPendulum()
    q0, v0 = system.state(1.0, 0.5)
    return system, (q0, v0), _simulate(system, SHULGIN, q0, v0)


@pytest.mark.slow
def test_shulgin_agrees_with_multiplier_formulations(rod_shulgin):
    system, start, ref = rod_shulgin
    sol = _simulate(system, jaxdae.Baumgarte(20.0, 100.0), *start)
    np.testing.assert_allclose(sol.q, ref.q, atol=1e-6)
    np.testing.assert_allclose(sol.v, ref.v, atol=1e-6)
    np.testing.assert_allclose(sol.multipliers, ref.multipliers, atol=1e-4)
    # The compound pendulum: θ̈ = −m g l sin θ / (I + m l²); energy is conserved.
    assert np.ptp(np.asarray(ref.energy)) < 1e-7


def test_shulgin_keeps_constraints(rod_shulgin):
    sol = rod_shulgin[2]
    assert np.abs(sol.dphi).max() < 1e-13  # Φ̇ = 0 by construction (eq. [5])
    assert np.abs(sol.phi).max() < 1e-7  # Φ drifts only by the integration error


@pytest.mark.slow  # one more compiled Baumgarte program; the rod and Ball & Beam cover it
def test_cartesian_pendulum_one_constraint():
    pend = CartesianPendulum()
    q0, v0 = pend.state_from_angle(0.7, -0.4)
    shulgin = _simulate(pend, jaxdae.RedundantCoordinates(dependent=(1,)), q0, v0)
    baum = _simulate(pend, jaxdae.Baumgarte(20.0, 100.0), q0, v0)
    np.testing.assert_allclose(shulgin.q, baum.q, atol=1e-7)
    np.testing.assert_allclose(shulgin.multipliers, baum.multipliers, atol=1e-5)


def test_singular_initial_state_raises():
    pend = CartesianPendulum()
    q0, v0 = pend.state_from_angle(np.pi / 2, 0.0)  # y = 0: ∂F/∂y = 2y = 0
    formulation = jaxdae.RedundantCoordinates(dependent=(1,))
    with pytest.raises(ValueError, match=r"condition \[4\].*\(σ_min/σ_max: [0-9.e-]+\)"):
        _simulate(pend, formulation, q0, v0)
    # In an ensemble the row is named; traced, the same check runs with `simulate`'s own.
    good = pend.state_from_angle(0.3, 0.0)
    rows = [jnp.stack(pair) for pair in zip(good, (q0, v0), strict=False)]
    with pytest.raises(ValueError, match=r"Trajectory 1 \(row of q0, v0\): ∂F/∂q_dep"):
        jaxdae.simulate_ensemble(pend, formulation, 0.0, 1.0, *rows)
    with pytest.raises(Exception, match=r"condition \[4\]"):  # raised when the result is
        jax.block_until_ready(
            jax.jit(  # ready: on a GPU, not at the call
                lambda q, v: jaxdae.simulate_ensemble(pend, formulation, 0.0, 1.0, q, v).q
            )(*rows)
        )


@pytest.mark.slow
def test_singular_configuration_during_motion_is_named():
    pend = CartesianPendulum()
    q0, v0 = pend.state_from_angle(1.2, 3.0)  # swings through the horizontal
    formulation = jaxdae.RedundantCoordinates(dependent=(1,))
    with pytest.raises(jaxdae.SimulationError, match="∂F/∂q_dep"):
        _simulate(pend, formulation, q0, v0)
    sol = _simulate(pend, formulation, q0, v0, throw=False)
    assert sol.result == jaxdae.RESULTS.singular_dependent_jacobian
    assert 0.0 < float(sol.t_final) < 1.5
    # In an ensemble it stops alone (the real-valued failure changes sign, as for the
    # event of one solve); a small swing next to it runs to the end.
    small = pend.state_from_angle(0.3, 0.0)
    both = jaxdae.simulate_ensemble(
        pend,
        formulation,
        0.0,
        1.5,
        jnp.stack([q0, small[0]]),
        jnp.stack([v0, small[1]]),
        ts=TS,
        throw=False,
    )
    assert both.result._value.tolist() == [sol.result._value, 0]
    np.testing.assert_allclose(both.t_final, [sol.t_final, 1.5], rtol=1e-6)
    assert np.array_equal(np.isinf(both.q[0]), np.isinf(sol.q))
    np.testing.assert_allclose(both.q[0][np.isfinite(sol.q)], sol.q[np.isfinite(sol.q)], atol=1e-7)
    assert abs(float(sol.q_final[1])) < 0.05


def test_structure_errors(unchecked):
    pend = CartesianPendulum()
    q0, v0 = pend.state_from_angle(0.3, 0.0)
    with pytest.raises(ValueError, match="one coordinate per geometric constraint"):
        _simulate(pend, jaxdae.RedundantCoordinates(dependent=(0, 1)), q0, v0)
    with pytest.raises(ValueError, match="tuple of coordinate indices"):
        jaxdae.RedundantCoordinates(dependent=[1])
    with pytest.raises(ValueError, match="out of range"):
        _simulate(pend, jaxdae.RedundantCoordinates(dependent=(5,)), q0, v0)
    with pytest.raises(ValueError, match="violates the geometric constraints"):
        _simulate(pend, jaxdae.RedundantCoordinates(dependent=(1,)), 1.1 * q0, v0)


@pytest.mark.slow
def test_jit_vmap_grad_of_simulate():
    pend = CartesianPendulum()
    formulation = jaxdae.RedundantCoordinates(dependent=(1,))

    def final_x(angle):
        q0, v0 = pend.state_from_angle(angle, 0.0)
        return _simulate(pend, formulation, q0, v0).q[-1, 0]

    h = 1e-5
    # One compiled program: values (a batch and central differences) and gradients, vmapped.
    values, grads = eqx.filter_jit(jax.vmap(jax.value_and_grad(final_x)))(
        jnp.array([0.4 + h, 0.4 - h, 0.3, 0.4])
    )
    reference = _simulate(pend, formulation, *pend.state_from_angle(0.3, 0.0)).q[-1, 0]
    np.testing.assert_allclose(values[2], reference, rtol=1e-9)
    np.testing.assert_allclose(grads[3], (values[0] - values[1]) / (2 * h), rtol=1e-5)


# -- equilibria and linearization ------------------------------------------------------


def test_equilibrium_is_not_a_stationary_point_of_the_potential():
    system = RodPendulum(damping=0.3)
    eq = jaxdae.equilibrium(system, jnp.array([0.2, 0.1, -0.9]))
    np.testing.assert_allclose(eq.q, [0.0, 0.0, -1.0], atol=1e-9)
    # Eq. [11]: ∂Π/∂y = m g ≠ 0 at the equilibrium; the reactions balance it.
    grad_pi = jax.grad(system.potential_energy, argnums=1)(0.0, eq.q)
    assert abs(float(grad_pi[2])) > 9.0
    assert float(eq.residual) < 1e-8


def test_equilibrium_not_found_raises():
    pend = DampedPendulum(damping=jnp.asarray(0.5))
    # x held at 0.5: gravity has a component along the circle there, no equilibrium.
    with pytest.raises(ValueError, match="No equilibrium found"):
        jaxdae.equilibrium(pend, jnp.array([0.5, -0.8]), fixed=(0,))


@pytest.mark.parametrize(
    "system, q, dependent",
    [
        (DampedPendulum(damping=jnp.asarray(0.5)), jnp.array([0.0, -1.0]), (1,)),
        pytest.param(
            RodPendulum(damping=0.3), jnp.array([0.0, 0.0, -1.0]), (1, 2), marks=pytest.mark.slow
        ),
    ],
    ids=["one-constraint", "two-constraints"],
)
def test_zero_roots_equal_number_of_constraints(system, q, dependent):
    lin = jaxdae.linearize(system, jaxdae.RedundantCoordinates(dependent=dependent), q)
    m = len(dependent)
    n = q.shape[0]
    assert lin.A.shape == (2 * n - m, 2 * n - m)
    assert int(lin.num_zero_roots) == m == lin.num_constraints == lin.expected_zero_roots
    assert bool(lin.asymptotically_stable)
    # The non-zero roots are the physical ones, the same in the multiplier form.
    lm = jaxdae.linearize(system, jaxdae.Baumgarte(2.0, 1.0), q)
    assert int(lm.num_zero_roots) == 0 and bool(lm.asymptotically_stable)
    physical = np.sort_complex(np.asarray(lin.eigenvalues)[np.abs(lin.eigenvalues) > lin.tol])
    lm_roots = np.asarray(lm.eigenvalues)
    constraint_roots = np.isclose(lm_roots, -1.0, atol=1e-4)  # λ² + 2λ + 1 = 0 (double)
    assert constraint_roots.sum() == 2 * m
    np.testing.assert_allclose(physical, np.sort_complex(lm_roots[~constraint_roots]), atol=1e-8)


def test_undamped_pendulum_is_not_asymptotically_stable():
    lin = jaxdae.linearize(
        DampedPendulum(damping=jnp.asarray(0.0)),
        jaxdae.RedundantCoordinates(dependent=(1,)),
        jnp.array([0.0, -1.0]),
    )
    assert int(lin.num_zero_roots) == 1
    assert not bool(lin.asymptotically_stable)  # ±i√g on the imaginary axis


def test_linearize_rejects_non_equilibrium():
    with pytest.raises(ValueError, match="not an equilibrium"):
        jaxdae.linearize(
            DampedPendulum(damping=jnp.asarray(0.5)),
            jaxdae.RedundantCoordinates(dependent=(1,)),
            jnp.array([0.6, -0.8]),
        )


@pytest.mark.slow
def test_linearize_jit_vmap_grad():
    formulation = jaxdae.RedundantCoordinates(dependent=(1,))
    q = jnp.array([0.0, -1.0])

    def trace(c):
        return jnp.trace(jaxdae.linearize(DampedPendulum(damping=c), formulation, q).A)

    # Trace of A: −c (x-velocity damping, projected) for this pendulum at the bottom.
    np.testing.assert_allclose(eqx.filter_jit(trace)(0.5), -0.5, atol=1e-10)
    np.testing.assert_allclose(jax.vmap(trace)(jnp.array([0.1, 0.2])), [-0.1, -0.2], atol=1e-10)
    np.testing.assert_allclose(jax.grad(trace)(0.5), -1.0, atol=1e-8)


def test_small_closed_forms_match_lapack():
    """`singular_ratio`, `small_det` and `lu_solver` (closed forms for 1 × 1 and 2 × 2,
    evaluated at every stage) against numpy's SVD, det and solve."""
    from jaxdae._formulations._redundant import lu_solver, singular_ratio, small_det

    rng = np.random.default_rng(1)
    for m in (1, 2, 3):
        jacobian = rng.normal(size=(m, m + 2))
        matrix = jacobian[:, :m]
        expected = (
            np.linalg.svd(matrix, compute_uv=False)[-1]
            / np.linalg.svd(jacobian, compute_uv=False)[0]
        )
        np.testing.assert_allclose(
            singular_ratio(jnp.asarray(matrix), jnp.asarray(jacobian)), expected, rtol=1e-12
        )
        np.testing.assert_allclose(
            small_det(jnp.asarray(matrix)), np.linalg.det(matrix), rtol=1e-12
        )
        b = rng.normal(size=(m, 3))
        np.testing.assert_allclose(
            lu_solver(jnp.asarray(matrix))(jnp.asarray(b)), np.linalg.solve(matrix, b), rtol=1e-10
        )
    nearly = np.array([[1.0, 1.0], [1.0, 1.0 + 1e-9]])
    jacobian = np.concatenate([nearly, np.eye(2)], axis=1)
    expected = (
        np.linalg.svd(nearly, compute_uv=False)[-1] / np.linalg.svd(jacobian, compute_uv=False)[0]
    )
    np.testing.assert_allclose(
        singular_ratio(jnp.asarray(nearly), jnp.asarray(jacobian)), expected, rtol=1e-6
    )
