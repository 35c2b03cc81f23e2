"""The core against independent references.

- `LagrangianSystem.terms` derives every term from one linearization; it agrees with the
  textbook derivation (Hessian, jvp of the gradient, jvp of jvp, jacfwd).
- The formulations' small SPD solves agree with dense NumPy solves for every gain form.
- `simulate` with `ts=None` returns exactly what an explicit `ts=[t0, t1]` returns, also after
  a failure; a two-link solve agrees with SciPy's; gradients w.r.t. the gains agree with
  central differences.
- jaxdae's matrix products are traced at full precision (GPUs default to TF32 for float32).
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import jaxdae
from jaxdae import _thresholds
from jaxdae.examples import CartesianPendulum, TwoLinkManipulator, _two_link_reference as _peers

from ._jaxprs import equations


def reference_terms(system, t, q, v):
    """The separate-pass derivation that `LagrangianSystem.terms` replaced."""
    one = jnp.ones_like(t)
    mass = jax.hessian(system.kinetic_energy, argnums=2)(t, q, v)
    momentum = lambda t_, q_: jax.grad(system.kinetic_energy, argnums=2)(t_, q_, v)  # noqa: E731
    _, momentum_rate = jax.jvp(momentum, (t, q), (one, v))
    lag_q = jax.grad(lambda q_: system.kinetic_energy(t, q_, v) - system.potential_energy(t, q_))(q)
    forces = system.generalized_forces(t, q, v) + lag_q - momentum_rate
    along = lambda t_, q_: jax.jvp(system.constraints, (t_, q_), (one, v))  # noqa: E731
    (phi, dphi), (_, second) = jax.jvp(along, (t, q), (one, v))
    jac_phi = jax.jacfwd(system.constraints, argnums=1)(t, q).reshape(phi.shape[0], q.shape[0])
    psi, psi_rate = jax.jvp(lambda t_, q_: system.velocity_constraints(t_, q_, v), (t, q), (one, v))
    jac_psi = jax.jacfwd(system.velocity_constraints, argnums=2)(t, q, v)
    jac_psi = jac_psi.reshape(psi.shape[0], q.shape[0])
    return dict(
        mass_matrix=mass,
        forces=forces,
        phi=phi,
        dphi=dphi,
        psi=psi,
        jacobian=jnp.concatenate([jac_phi, jac_psi]),
        bias=jnp.concatenate([-second, -psi_rate]),
    )


class Rheonomic(jaxdae.LagrangianSystem):
    """Time-dependent, velocity-non-quadratic energy, rheonomic + nonholonomic constraints."""

    def kinetic_energy(self, t, q, v):
        inertia = jnp.array(
            [[2.0 + jnp.cos(q[1]), 0.3, 0.0], [0.3, 1.0 + 0.1 * t, 0.0], [0.0, 0.0, 1.5]]
        )
        return 0.5 * v @ inertia @ v + 0.05 * (v @ v) ** 2 + jnp.sin(t) * v[0] * q[2]

    def potential_energy(self, t, q):
        return 9.81 * jnp.sin(q[0]) + 0.5 * q @ q

    def generalized_forces(self, t, q, v):
        return -0.1 * v + jnp.array([jnp.cos(t), 0.0, 0.2])

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 + q[1] ** 2 - 1.0 - 0.1 * jnp.sin(2 * t)])

    def velocity_constraints(self, t, q, v):
        return jnp.array([jnp.cos(q[0]) * v[2] - jnp.sin(q[1]) * v[0] + 0.3 * t])


class GivenMass(jaxdae.LagrangianSystem):
    """Overrides `mass_matrix` (kinetic energy from it)."""

    def mass_matrix(self, t, q):
        return jnp.array([[3.0 + jnp.cos(q[1]), 0.5], [0.5, 1.0]])

    def constraints(self, t, q):
        return jnp.array([q[0] - jnp.sin(q[1])])


@pytest.mark.parametrize(
    "system, n",
    [(TwoLinkManipulator(), 2), (CartesianPendulum(), 2), (Rheonomic(), 3), (GivenMass(), 2)],
)
def test_terms_match_separate_derivation(system, n):
    # Compiled: run op by op, the autodiff of both derivations took ≈ 10 s per system.
    terms, reference = eqx.filter_jit(type(system).terms), eqx.filter_jit(reference_terms)
    rng = np.random.default_rng(1)
    for _ in range(3):
        t = jnp.asarray(rng.uniform(0, 2))
        q, v = jnp.asarray(rng.standard_normal(n)), jnp.asarray(rng.standard_normal(n))
        got = terms(system, t, q, v)
        want = reference(system, t, q, v)
        for name, value in want.items():
            np.testing.assert_allclose(
                getattr(got, name), value, rtol=1e-11, atol=1e-11, err_msg=name
            )
        # The energy and momenta `terms` computes anyway (simulate's diagnostics read them).
        np.testing.assert_allclose(got.energy, system.energy(t, q, v), rtol=1e-12)
        np.testing.assert_allclose(got.momenta, system.momenta(t, q, v), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_terms_energy_and_momenta_of_other_systems_and_overrides():
    """Hamiltonian and realized-constraint systems carry their methods' energy and momenta
    in `terms`; a subclass that overrides `energy` gets `None` there, and `simulate`'s
    `Solution.energy` is the override's."""
    from jaxdae.examples import ChaplyginSleigh

    pendulum = CartesianPendulum()
    q, v = jnp.array([0.6, -0.8]), jnp.array([0.3, 0.2])
    sleigh = ChaplyginSleigh(mass=1.0, inertia=0.1, distance=0.5)
    q_sleigh, v_sleigh = sleigh.initial_state(0.5, 2.0)
    for system, state in [
        (jaxdae.HamiltonianForm(pendulum), (q, pendulum.momenta(0.0, q, v))),
        (jaxdae.RealizedConstraints(sleigh, jaxdae.ViscousForce(10.0)), (q_sleigh, v_sleigh + 0.1)),
    ]:
        terms = system.terms(jnp.asarray(0.3), *state)
        np.testing.assert_allclose(terms.energy, system.energy(0.3, *state), rtol=1e-12)
        np.testing.assert_allclose(terms.momenta, system.momenta(0.3, *state), rtol=1e-12)

    class Shifted(CartesianPendulum):
        def energy(self, t, q, v):
            return super().energy(t, q, v) + 1.0

    shifted = Shifted()
    assert shifted.terms(0.0, q, v).energy is None
    assert shifted.terms(0.0, q, v).momenta is not None
    sol = jaxdae.simulate(shifted, jaxdae.Baumgarte(20.0, 100.0), 0.0, 0.05, q, v * 0)
    want = [shifted.energy(t, q_t, v_t) for t, q_t, v_t in zip(sol.ts, sol.q, sol.v, strict=False)]
    np.testing.assert_allclose(sol.energy, want, rtol=1e-12)


def _dense(gain, size):
    gain = np.asarray(gain, dtype=float)
    return gain * np.eye(size) if gain.ndim == 0 else (np.diag(gain) if gain.ndim == 1 else gain)


@pytest.mark.parametrize("alpha", [3.0, [3.0, 5.0], [[3.0, 1.0], [1.0, 4.0]]])
def test_modified_lagrange_matches_dense_solve(alpha):
    system = TwoLinkManipulator()
    q, v = system.initial_state()
    terms = system.terms(jnp.asarray(0.3), q + 0.1, v)
    kd, kp = [20.0, 10.0], [[100.0, 5.0], [5.0, 25.0]]
    acc, lam = jaxdae.ModifiedLagrange(alpha, kd, kp).accelerations(terms)
    m, f, g, bias = (
        np.asarray(x) for x in (terms.mass_matrix, terms.forces, terms.jacobian, terms.bias)
    )
    a = _dense(alpha, 2)
    target = bias - _dense(kd, 2) @ np.asarray(terms.dphi) - _dense(kp, 2) @ np.asarray(terms.phi)
    want = np.linalg.solve(m + g.T @ a @ g, f + g.T @ a @ target)
    np.testing.assert_allclose(acc, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lam, a @ (g @ want - target), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize(
    "formulation",
    [
        jaxdae.Baumgarte([20.0, 10.0], [100.0, 25.0]),
        jaxdae.PseudoInverse(20.0, 100.0),
        jaxdae.Unstabilized(),
    ],
)
def test_multiplier_formulations_match_dense_solve(formulation):
    system = TwoLinkManipulator()
    q, v = system.initial_state()
    terms = system.terms(jnp.asarray(0.3), q + 0.1, v)
    acc, lam = formulation.accelerations(terms)
    m, f, g, bias = (
        np.asarray(x) for x in (terms.mass_matrix, terms.forces, terms.jacobian, terms.bias)
    )
    target = bias
    if not isinstance(formulation, jaxdae.Unstabilized):
        target = bias - (
            _dense(formulation.kd, 2) @ np.asarray(terms.dphi)
            + _dense(formulation.kp, 2) @ np.asarray(terms.phi)
        )
    minv = np.linalg.inv(m)
    want = np.linalg.solve(g @ minv @ g.T, g @ minv @ f - target)
    np.testing.assert_allclose(lam, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(acc, minv @ (f - g.T @ want), rtol=1e-10, atol=1e-10)


@pytest.fixture(scope="module")
def two_link():
    system = TwoLinkManipulator()
    return system, *system.initial_state()


@pytest.mark.slow
def test_default_save_times_equal_explicit(two_link):
    system, q0, v0 = two_link
    formulation = jaxdae.ModifiedLagrange(10.0, [20.0, 10.0], [100.0, 25.0])
    a = jaxdae.simulate(system, formulation, 0.0, 1.0, q0, v0)
    b = jaxdae.simulate(system, formulation, 0.0, 1.0, q0, v0, ts=jnp.array([0.0, 1.0]))
    for name in (
        "ts",
        "q",
        "v",
        "phi",
        "dphi",
        "multipliers",
        "energy",
        "t_final",
        "q_final",
        "v_final",
    ):
        np.testing.assert_allclose(
            getattr(a, name), getattr(b, name), rtol=1e-13, atol=1e-13, err_msg=name
        )


def test_baumgarte_failure_rows(two_link):
    system, q0, v0 = two_link
    sol = jaxdae.simulate(
        system, jaxdae.Baumgarte([20.0, 10.0], [100.0, 25.0]), 0.0, 2.0, q0, v0, throw=False
    )
    assert sol.result == jaxdae.RESULTS.singular_constraint_matrix
    assert abs(float(sol.t_final) - 0.493) < 5e-3
    np.testing.assert_allclose(sol.q_final, [np.pi / 2, np.pi], atol=5e-3)
    assert np.isinf(sol.ts[1]) and np.all(np.isinf(sol.q[1])) and np.all(np.isinf(sol.phi[1]))
    np.testing.assert_array_equal(sol.q[0], q0)


def test_two_link_matches_scipy_peer(two_link):
    system, q0, v0 = two_link
    sol = jaxdae.simulate(
        system, jaxdae.ModifiedLagrange(10.0, [20.0, 10.0], [100.0, 25.0]), 0.0, 2.0, q0, v0
    )
    ref = solve_ivp(
        _peers.numpy_rhs(),
        (0.0, 2.0),
        np.concatenate([q0, v0]),
        method="DOP853",
        rtol=1e-12,
        atol=1e-13,
    ).y[:, -1]
    np.testing.assert_allclose(sol.q_final, ref[:2], atol=1e-7)
    np.testing.assert_allclose(sol.v_final, ref[2:], atol=1e-6)


@pytest.mark.slow
def test_gradient_wrt_gains_matches_central_differences(two_link):
    system, q0, v0 = two_link

    @jax.jit
    def loss(p):
        formulation = jaxdae.ModifiedLagrange(p[0], p[1:3], p[3:5])
        sol = jaxdae.simulate(system, formulation, 0.0, 1.0, q0, v0)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    p = jnp.array([10.0, 20.0, 10.0, 100.0, 25.0])
    grad = jax.jit(jax.grad(loss))(p)
    eye = np.eye(5)
    steps = 1e-4 * np.abs(np.asarray(p))
    fd = np.array(
        [(loss(p + h * e) - loss(p - h * e)) / (2 * h) for h, e in zip(steps, eye, strict=False)]
    )
    assert np.max(np.abs(grad - fd)) < 1e-5 * np.max(np.abs(fd))


def _dot_precisions(jaxpr) -> list:
    """The `precision` of every matrix product in `jaxpr` and its sub-jaxprs."""
    return [
        eqn.params["precision"] for eqn in equations(jaxpr) if eqn.primitive.name == "dot_general"
    ]


class _ArrayFormPendulum(CartesianPendulum):
    """The pendulum with a matrix product in its kinetic energy (kept in array form below)."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * v @ jnp.eye(2, dtype=v.dtype) @ v


def test_matrix_products_at_full_precision(monkeypatch):
    """On GPUs JAX's float32 products default to TF32 (`jaxdae.lqr` was off by 1.6e-3 on an
    H100): jaxdae traces its products at full precision, gradients included, unless the
    user set a precision."""
    highest = (jax.lax.Precision.HIGHEST,) * 2
    a = jnp.array([[0.0, 1.0], [2.0, -1.0]], jnp.float32)
    b = jnp.array([[0.0], [1.0]], jnp.float32)
    lqr = jax.make_jaxpr(
        lambda a: jaxdae.lqr(a, b, jnp.eye(2, dtype=a.dtype), jnp.eye(1, dtype=a.dtype)).riccati
    )
    precisions = _dot_precisions(lqr(a).jaxpr)
    assert precisions and all(p == highest for p in precisions)
    with jax.default_matmul_precision("tensorfloat32"):  # the user's choice is kept
        assert (jax.lax.Precision.HIGH,) * 2 in _dot_precisions(lqr(a).jaxpr)

    # The simulation's gradient, with the right-hand side left in array form (a scalar
    # graph has no products): the reverse sweep's backward pass and the diagnostics' (the
    # loss reads `phi`) are traced at transpose time; diffrax's checkpointed loop replays
    # the traced step.
    monkeypatch.setattr(_thresholds, "MAX_WORK", 0)
    pend = _ArrayFormPendulum()
    q0, v0 = (x.astype(jnp.float32) for x in pend.state_from_angle(0.4, 0.0))

    for adjoint in (None, diffrax.RecursiveCheckpointAdjoint()):

        def loss(kp, adjoint=adjoint):
            sol = jaxdae.simulate(
                pend,
                jaxdae.Baumgarte(jnp.float32(2.0), kp),
                0.0,
                0.1,
                q0,
                v0,
                rtol=1e-5,
                atol=1e-7,
                adjoint=adjoint,
            )
            return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

        precisions = _dot_precisions(jax.make_jaxpr(jax.grad(loss))(jnp.float32(4.0)).jaxpr)
        assert precisions and all(p == highest for p in precisions), adjoint
