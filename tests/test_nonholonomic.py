"""Nonholonomic constraints Ψ = A(t, q) v + a(t, q), alone and mixed with holonomic ones.

Reference: the Chaplygin sleigh (body mass m, inertia J about the centre of mass C, blade at
P = C − a e). With the forward speed u and the turn rate ω, the constrained equations reduce
to u̇ = a ω², ω̇ = −(m a / I) u ω, I = J + m a² (inertia about P). The energy
E = ½ m u² + ½ I ω² is conserved, so with U² = 2E/m and c = m a / I, u̇ = c (U² − u²) gives

    u(t) = U tanh(c U t + φ),  φ = artanh(u₀ / U),
    ω(t) = ω₀ cosh φ / cosh(c U t + φ),
    θ(t) = θ₀ + ω₀ cosh φ (gd(c U t + φ) − gd φ) / (c U),  gd x = arctan(sinh x),

and the lateral reaction at P is F = m (u ω + a ω̇) = −μ (`M q̈ = Q − Aᵀμ` with
A = [−sin θ, cos θ, −a]). `ChaplyginSleigh.reduced_solution` implements these formulas.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import jaxdae
from jaxdae.examples import ChaplyginSleigh, KnifeEdge

U0, W0 = 0.5, 2.0
TS = jnp.linspace(0.0, 4.0, 21)


class HeadingSleigh(jaxdae.LagrangianSystem):
    """The sleigh with the heading as a unit vector (c, s): one holonomic constraint
    c² + s² = 1 mixed with the nonholonomic blade constraint."""

    mass: jax.Array
    inertia: jax.Array
    distance: jax.Array

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * (v[0] ** 2 + v[1] ** 2) + 0.5 * self.inertia * (
            v[2] ** 2 + v[3] ** 2
        )

    def constraints(self, t, q):
        return jnp.array([q[2] ** 2 + q[3] ** 2 - 1.0])

    def velocity_constraints(self, t, q, v):
        c, s = q[2], q[3]
        return jnp.array([-v[0] * s + v[1] * c - self.distance * (c * v[3] - s * v[2])])


class SquaredConstraint(jaxdae.LagrangianSystem):
    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def velocity_constraints(self, t, q, v):
        return jnp.array([v[0] ** 2 - v[1]])


class CubicConstraint(SquaredConstraint):
    def velocity_constraints(self, t, q, v):
        return jnp.array([v[0] ** 3])


@eqx.filter_jit
def run(system, formulation, q0, v0, ts):
    return jaxdae.simulate(system, formulation, ts[0], ts[-1], q0, v0, ts=ts)


@pytest.fixture(scope="module")
def sleigh():
    return ChaplyginSleigh(mass=1.0, inertia=0.1, distance=0.5)


def heading_state(sleigh):
    q, v = sleigh.initial_state(U0, W0, theta=0.3)
    c, s = jnp.cos(q[2]), jnp.sin(q[2])
    return (jnp.array([q[0], q[1], c, s]), jnp.array([v[0], v[1], -s * v[2], c * v[2]]))


def check_closed_form(sleigh, ts, theta, u, omega, mu, tol):
    u_ref, w_ref, th_ref = sleigh.reduced_solution(ts, U0, W0, theta=0.3)
    np.testing.assert_allclose(u, u_ref, atol=tol)
    np.testing.assert_allclose(omega, w_ref, atol=tol)
    np.testing.assert_allclose(jnp.unwrap(theta), th_ref, atol=tol)
    i_p = sleigh.inertia + sleigh.mass * sleigh.distance**2
    w_dot = -(sleigh.mass * sleigh.distance / i_p) * u_ref * w_ref
    reaction = sleigh.mass * (u_ref * w_ref + sleigh.distance * w_dot)
    np.testing.assert_allclose(mu, -reaction, atol=10 * tol)


@pytest.mark.slow
def test_sleigh_closed_form(sleigh):
    q0, v0 = sleigh.initial_state(U0, W0, theta=0.3)
    sol = run(sleigh, jaxdae.Baumgarte(20.0, 100.0, kv=10.0), q0, v0, TS)
    th = sol.q[:, 2]
    u = sol.v[:, 0] * jnp.cos(th) + sol.v[:, 1] * jnp.sin(th)
    check_closed_form(sleigh, TS, th, u, sol.v[:, 2], sol.multipliers[:, 0], 1e-7)
    assert sol.psi.shape == (TS.shape[0], 1) and sol.phi.shape == (TS.shape[0], 0)
    assert float(jnp.max(jnp.abs(sol.psi))) < 1e-8
    assert float(jnp.ptp(sol.energy)) < 1e-8 * float(sol.energy[0])
    # the reaction is really non-zero along this motion
    assert float(jnp.max(jnp.abs(sol.multipliers))) > 0.1


@pytest.mark.parametrize(
    "formulation",
    [
        jaxdae.Baumgarte(20.0, 100.0, kv=10.0),
        pytest.param(jaxdae.PseudoInverse(20.0, 100.0, kv=10.0), marks=pytest.mark.slow),
        pytest.param(jaxdae.ModifiedLagrange(1e4, 20.0, 100.0, kv=10.0), marks=pytest.mark.slow),
    ],
    ids=["baumgarte", "pseudo_inverse", "modified_lagrange"],
)
def test_mixed_constraints_every_formulation(sleigh, formulation):
    system = HeadingSleigh(sleigh.mass, sleigh.inertia, sleigh.distance)
    q0, v0 = heading_state(sleigh)
    sol = run(system, formulation, q0, v0, TS)
    c, s = sol.q[:, 2], sol.q[:, 3]
    u = sol.v[:, 0] * c + sol.v[:, 1] * s
    omega = c * sol.v[:, 3] - s * sol.v[:, 2]
    # the penalty method is exact only as 𝔄 → ∞ (errors O(1/α)): looser
    tol = 1e-5 if isinstance(formulation, jaxdae.ModifiedLagrange) else 1e-7
    check_closed_form(sleigh, TS, jnp.arctan2(s, c), u, omega, sol.multipliers[:, 1], tol)
    assert sol.multipliers.shape == (TS.shape[0], 2)  # holonomic, then nonholonomic
    assert float(jnp.max(jnp.abs(sol.psi))) < tol
    assert float(jnp.max(jnp.abs(sol.phi))) < tol
    assert float(jnp.ptp(sol.energy)) < 10 * tol


def test_knife_edge_closed_form():
    skate = KnifeEdge()
    ts = jnp.linspace(0.0, 3.0, 16)
    q0, v0 = jnp.zeros(3), jnp.array([0.0, 0.0, 2.0])
    sol = run(skate, jaxdae.Baumgarte(20.0, 100.0), q0, v0, ts)
    q_ref, v_ref = skate.closed_form(ts, 2.0)
    np.testing.assert_allclose(sol.q, q_ref, atol=1e-7)
    np.testing.assert_allclose(sol.v, v_ref, atol=1e-7)
    assert float(jnp.max(jnp.abs(sol.psi))) < 1e-8


def test_default_kv_is_documented_rate():
    f = jaxdae.Baumgarte(kd=jnp.array([20.0, 40.0]), kp=100.0)
    assert float(f.kv) == pytest.approx(0.5 * 30.0)


def test_nonholonomic_perturbation_decays_at_kv(sleigh):
    """Started off the constraint, Ψ̇ + K_V Ψ = 0 holds exactly: Ψ(t) = Ψ₀ e^{−K_V t}."""
    q0, v0 = sleigh.initial_state(U0, W0)
    v0 = v0 + jnp.array([0.0, 0.1, 0.0])
    sol = run(sleigh, jaxdae.Baumgarte(20.0, 100.0, kv=3.0), q0, v0, TS)
    np.testing.assert_allclose(sol.psi[:, 0], 0.1 * jnp.exp(-3.0 * TS), atol=1e-8)


@pytest.mark.slow
def test_coupled_blocks_follow_linear_ode(sleigh):
    """(Φ, Φ̇, Ψ) follow d/dt y = H y exactly, H with every coupling block non-zero."""
    system = HeadingSleigh(sleigh.mass, sleigh.inertia, sleigh.distance)
    q0, v0 = heading_state(sleigh)
    q0 = q0.at[2:].multiply(1.05)  # Φ ≠ 0
    v0 = v0 + jnp.array([0.0, 0.1, 0.05, 0.02])  # Φ̇ ≠ 0, Ψ ≠ 0
    f = jaxdae.CoupledPerturbation(
        k10=jnp.array([[-25.0]]),
        k11=jnp.array([[-8.0]]),
        k12=jnp.array([[2.0]]),
        k20=jnp.array([[1.0]]),
        k21=jnp.array([[-0.5]]),
        k22=jnp.array([[-4.0]]),
    )
    h = np.asarray(f.perturbation_matrix(1, 1))
    assert np.max(np.linalg.eigvals(h).real) < 0
    sol = run(system, f, q0, v0, TS)
    y = jnp.concatenate([sol.phi, sol.dphi, sol.psi], axis=1)
    expected = np.stack([scipy.linalg.expm(h * float(t)) @ np.asarray(y[0]) for t in TS])
    np.testing.assert_allclose(y, expected, atol=1e-8)
    assert float(jnp.max(jnp.abs(y[0]))) > 0.05


@pytest.mark.slow
def test_coupled_is_baumgarte_special_case(sleigh):
    system = HeadingSleigh(sleigh.mass, sleigh.inertia, sleigh.distance)
    q0, v0 = heading_state(sleigh)
    q0, v0 = q0.at[2:].multiply(1.05), v0 + 0.05
    a = run(system, jaxdae.Baumgarte(20.0, 100.0, kv=10.0), q0, v0, TS)
    # zero coupling blocks (given as (1, 1) matrices: the same compiled program as above)
    zero = jnp.zeros((1, 1))
    f = jaxdae.CoupledPerturbation(
        k10=-100.0 * jnp.ones((1, 1)),
        k11=-20.0 * jnp.ones((1, 1)),
        k12=zero,
        k20=zero,
        k21=zero,
        k22=-10.0 * jnp.ones((1, 1)),
    )
    b = run(system, f, q0, v0, TS)
    np.testing.assert_allclose(a.q, b.q, atol=1e-9)
    np.testing.assert_allclose(a.v, b.v, atol=1e-9)
    np.testing.assert_allclose(a.multipliers, b.multipliers, atol=1e-7)


@pytest.mark.slow
def test_coupled_jit_vmap_grad(sleigh):
    """Gains are differentiable (vs central differences) and vmappable; traced checks work."""
    q0, v0 = sleigh.initial_state(U0, W0)
    v0 = v0 + jnp.array([0.0, 0.1, 0.0])
    ts = jnp.linspace(0.0, 1.0, 3)

    def psi_end(k22):
        sol = run(sleigh, jaxdae.CoupledPerturbation(k22=k22), q0, v0, ts)
        return sol.psi[-1, 0]

    # One compiled program: the gradient of a vmapped batch of gains.
    batched = jax.jit(jax.vmap(jax.value_and_grad(psi_end)))
    ks = jnp.array([-3.0, -1.0, -2.0])
    values, grads = batched(ks)
    np.testing.assert_allclose(values, 0.1 * jnp.exp(ks), rtol=1e-6)  # Ψ(1) = 0.1 e^{k t}
    np.testing.assert_allclose(grads, 0.1 * jnp.exp(ks), rtol=1e-5)  # d/dk 0.1 e^{k t}
    h = 1e-5
    fd = (psi_end(ks[0] + h) - psi_end(ks[0] - h)) / (2 * h)
    np.testing.assert_allclose(grads[0], fd, rtol=1e-5)
    # traced gains: the Hurwitz check runs through eqx.error_if (same compiled program)
    with pytest.raises(Exception, match="Hurwitz"):
        jax.block_until_ready(batched(jnp.array([-1.0, 2.0, -2.0])))


# -- bad input ------------------------------------------------------------------------------


def test_non_affine_velocity_constraint_refused():
    q0, v0 = jnp.zeros(2), jnp.array([1.0, 1.0])
    with pytest.raises(ValueError, match="not affine"):
        jaxdae.simulate(SquaredConstraint(), jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, q0, v0)
    # v³ has zero curvature at v = 0: the check also looks at a shifted velocity
    with pytest.raises(ValueError, match="not affine"):
        jaxdae.simulate(CubicConstraint(), jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, q0, 0 * v0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k10=100.0, k11=-20.0), "not Hurwitz"),
        (dict(k10=-1.0, k11=0.0), "not Hurwitz"),
        (dict(k10=jnp.ones((2, 3))), "square matrix"),
        (dict(k12=jnp.ones(3)), "couples different constraint kinds"),
        (dict(k10=-jnp.eye(2), k11=-jnp.ones(3)), "disagree"),
    ],
)
def test_coupled_bad_blocks(unchecked, kwargs, match):
    with pytest.raises(ValueError, match=match):
        jaxdae.CoupledPerturbation(**kwargs)


def test_traced_hurwitz_checks_of_many_constraints():
    # traced gains (under jit, vmap, grad) of many constraints: uncoupled scalar or diagonal
    # blocks are checked constraint by constraint (the (2m)² × (2m)² Lyapunov system of
    # m = 200 would hold 1.3e11 entries); coupled blocks beyond the Lyapunov limit by the
    # host's eigenvalues, row by row under vmap
    m = 200

    def uncoupled(k10, k11):
        ((flag, _),) = jaxdae.CoupledPerturbation(k10=k10, k11=k11).traced_checks(m, 0)
        return flag

    stable = jnp.full(m, -25.0)
    check = jax.jit(uncoupled).lower(stable, -10.0).compile()
    assert check.memory_analysis().temp_size_in_bytes < 1e6
    assert not check(stable, -10.0)
    assert check(stable.at[17].set(1.0), -10.0)
    assert check(stable, 0.0)  # undamped

    def coupled(k22):
        formulation = jaxdae.CoupledPerturbation(k10=-25.0, k11=-10.0, k12=0.1, k22=k22)
        ((flag, _),) = formulation.traced_checks(20, 2)
        return flag

    np.testing.assert_array_equal(
        jax.jit(jax.vmap(coupled))(jnp.array([-5.0, 1.0, -1.0])), [False, True, False]
    )

    def matrix_k22(k22):  # uncoupled, but a full `K22`: checked as one matrix
        ((flag, _),) = jaxdae.CoupledPerturbation(k10=-25.0, k11=-10.0, k22=k22).traced_checks(3, 2)
        return flag

    assert not jax.jit(matrix_k22)(jnp.array([[-2.0, 1.0], [0.0, -1.0]]))
    assert jax.jit(matrix_k22)(jnp.array([[-2.0, 1.0], [0.0, 1.0]]))


def test_coupled_blocks_must_fit_system(sleigh):
    q0, v0 = sleigh.initial_state(U0, W0)
    with pytest.raises(ValueError, match="pass `k22`"):
        jaxdae.simulate(sleigh, jaxdae.CoupledPerturbation(k10=-1.0, k11=-2.0), 0.0, 1.0, q0, v0)
    with pytest.raises(ValueError, match="sized for 2 nonholonomic"):
        jaxdae.simulate(sleigh, jaxdae.CoupledPerturbation(k22=-jnp.ones(2)), 0.0, 1.0, q0, v0)


def test_kv_shape_checked(sleigh):
    q0, v0 = sleigh.initial_state(U0, W0)
    with pytest.raises(ValueError, match="nonholonomic constraints"):
        jaxdae.simulate(sleigh, jaxdae.Baumgarte(1.0, 1.0, kv=jnp.ones(2)), 0.0, 1.0, q0, v0)
    with pytest.raises(ValueError, match="positive definite"):
        jaxdae.Baumgarte(1.0, 1.0, kv=-1.0)


def test_non_affine_velocity_constraint_refused_when_traced():
    q0 = jnp.zeros(2)
    simulate = jax.jit(
        lambda v0: (
            jaxdae.simulate(SquaredConstraint(), jaxdae.Baumgarte(1.0, 1.0), 0.0, 1.0, q0, v0).q
        )
    )
    with pytest.raises(Exception, match="not affine"):
        jax.block_until_ready(simulate(jnp.ones(2)))


def test_concrete_coupled_gains_closed_over_in_jit():
    """A concrete `CoupledPerturbation` captured by a jitted function is checked eagerly
    inside the trace (its Hurwitz check used to fail converting a tracer to numpy)."""
    from jaxdae.examples import CartesianPendulum

    pendulum = CartesianPendulum()
    q0, v0 = pendulum.state_from_angle(0.5, 0.0)
    stable = jaxdae.CoupledPerturbation(k10=-25.0, k11=-10.0)
    run = jax.jit(lambda q: jaxdae.simulate(pendulum, stable, 0.0, 1.0, q, v0).q_final)
    np.testing.assert_allclose(
        run(q0), jaxdae.simulate(pendulum, stable, 0.0, 1.0, q0, v0).q_final, rtol=1e-12
    )
    # Gains changed after construction are checked there too.
    unstable = eqx.tree_at(lambda f: f.k10, stable, jnp.asarray(25.0))
    with pytest.raises(ValueError, match="not Hurwitz"):
        jax.jit(lambda q: jaxdae.simulate(pendulum, unstable, 0.0, 1.0, q, v0).q_final)(q0)
