"""Core: autodiff-derived terms, formulations, simulate under jit / vmap / grad, physics."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import jaxdae
from jaxdae.examples import CartesianPendulum, TwoLinkManipulator

from ._systems import DoublePendulum, MovingSupportPendulum, TwicePendulum

PENDULUM = CartesianPendulum(mass=1.3, length=0.8)
Q_ON, V_ON = PENDULUM.state_from_angle(1.0, 0.5)


# -- autodiff-derived terms --------------------------------------------------------------


def test_terms_match_hand_derivation_for_moving_pivot():
    """M, Q, J, Φ_t and γ of a rheonomic constraint against their hand-derived values."""
    system = MovingSupportPendulum(amplitude=0.2, frequency=3.0)
    t, q, v = jnp.array(0.7), jnp.array([0.3, -0.9]), jnp.array([0.4, -0.2])
    terms = eqx.filter_jit(system.terms)(t, q, v)
    a, w = 0.2, 3.0
    pivot = np.array([a * np.sin(w * 0.7), 0.0])
    pivot_rate = np.array([a * w * np.cos(w * 0.7), 0.0])
    pivot_acc = np.array([-a * w**2 * np.sin(w * 0.7), 0.0])
    d, dd = np.asarray(q) - pivot, np.asarray(v) - pivot_rate
    np.testing.assert_allclose(terms.mass_matrix, np.eye(2))
    np.testing.assert_allclose(terms.forces, [0.0, -9.81])
    np.testing.assert_allclose(terms.phi, [d @ d - 1.0], rtol=1e-12)
    np.testing.assert_allclose(terms.dphi, [2 * d @ dd], rtol=1e-12)
    np.testing.assert_allclose(terms.jacobian, [2 * d], rtol=1e-12)
    # Φ̈ = 2 d·q̈ + 2|ḋ|² − 2 d·p̈  ⇒  γ = −2|ḋ|² + 2 d·p̈
    np.testing.assert_allclose(terms.bias, [-2 * dd @ dd + 2 * d @ pivot_acc], rtol=1e-12)


def test_two_link_terms_match_closed_form():
    """The two-link mass matrix and forces against the textbook closed form."""
    system = TwoLinkManipulator()
    q, v = jnp.array([0.4, 1.1]), jnp.array([0.7, -0.3])
    terms = eqx.filter_jit(system.terms)(jnp.array(0.0), q, v)
    np.testing.assert_allclose(terms.mass_matrix, _two_link_mass(np.asarray(q)), rtol=1e-12)
    np.testing.assert_allclose(
        terms.forces, _two_link_forces(np.asarray(q), np.asarray(v)), rtol=1e-12, atol=1e-12
    )


def test_mass_matrix_and_kinetic_energy_are_interchangeable():
    class FromMass(jaxdae.LagrangianSystem):
        def mass_matrix(self, t, q):
            return PENDULUM.mass * jnp.eye(2)

        def potential_energy(self, t, q):
            return PENDULUM.potential_energy(t, q)

        def constraints(self, t, q):
            return PENDULUM.constraints(t, q)

    a = eqx.filter_jit(PENDULUM.terms)(jnp.array(0.0), Q_ON, V_ON)
    b = eqx.filter_jit(FromMass().terms)(jnp.array(0.0), Q_ON, V_ON)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=False):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)


def test_system_without_energy_is_refused():
    class Empty(jaxdae.LagrangianSystem):
        pass

    with pytest.raises(TypeError, match="kinetic_energy.*mass_matrix"):
        Empty()


# -- the two-link example in numpy (independent of jaxdae) -------------------------------

M1, M2, L1, L2, G = 2.0, 1.0, 1.0, 0.5, 9.81
I1, I2 = M1 * L1**2 / 12, M2 * L2**2 / 12
SPEED, X0 = 0.6, L1 * np.cos(1.396263) + L2 * np.cos(1.396263 + 3.563268)


def _two_link_mass(q):
    c2 = np.cos(q[1])
    m11 = I1 + I2 + M1 * (L1 / 2) ** 2 + M2 * (L1**2 + (L2 / 2) ** 2 + L1 * L2 * c2)
    m12 = I2 + M2 * ((L2 / 2) ** 2 + L1 * (L2 / 2) * c2)
    m22 = I2 + M2 * (L2 / 2) ** 2
    return np.array([[m11, m12], [m12, m22]])


def _two_link_forces(q, v):
    h = M2 * L1 * (L2 / 2) * np.sin(q[1])
    coriolis = np.array([-h * (2 * v[0] * v[1] + v[1] ** 2), h * v[0] ** 2])
    c1, c12 = np.cos(q[0]), np.cos(q[0] + q[1])
    gravity = np.array(
        [(M1 * L1 / 2 + M2 * L1) * G * c1 + M2 * (L2 / 2) * G * c12, M2 * (L2 / 2) * G * c12]
    )
    return -coriolis - gravity


def _two_link_modified_lagrange_rhs(t, y, alpha, kd, kp):
    q, v = y[:2], y[2:]
    s1, c1 = np.sin(q[0]), np.cos(q[0])
    s12, c12 = np.sin(q[0] + q[1]), np.cos(q[0] + q[1])
    phi = np.array([L1 * s1 + L2 * s12 - 0.5, L1 * c1 + L2 * c12 + SPEED * t - X0])
    jac = np.array([[L1 * c1 + L2 * c12, L2 * c12], [-L1 * s1 - L2 * s12, -L2 * s12]])
    w = v[0] + v[1]
    gamma = np.array([L1 * s1 * v[0] ** 2 + L2 * s12 * w**2, L1 * c1 * v[0] ** 2 + L2 * c12 * w**2])
    dphi = jac @ v + np.array([0.0, SPEED])
    lhs = _two_link_mass(q) + alpha * jac.T @ jac
    rhs = _two_link_forces(q, v) - alpha * jac.T @ (kd * dphi + kp * phi - gamma)
    return np.concatenate([v, np.linalg.solve(lhs, rhs)])


def test_two_link_modified_lagrange_matches_scipy():
    """Mukharlyamov and Deressa (2015), eq. [30] for Example 1, against SciPy on hand-written numpy
    equations."""
    from scipy.integrate import solve_ivp

    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    alpha, kd, kp = 10.0, np.array([20.0, 10.0]), np.array([100.0, 25.0])
    ts = np.linspace(0.0, 2.0, 9)
    sol = jaxdae.simulate(
        system,
        jaxdae.ModifiedLagrange(alpha, kd, kp),
        0.0,
        2.0,
        q0,
        v0,
        ts=ts,
        rtol=1e-11,
        atol=1e-12,
    )
    ref = solve_ivp(
        _two_link_modified_lagrange_rhs,
        (0.0, 2.0),
        np.concatenate([q0, v0]),
        method="DOP853",
        t_eval=ts,
        rtol=1e-12,
        atol=1e-13,
        args=(alpha, kd, kp),
    )
    np.testing.assert_allclose(sol.q, ref.y[:2].T, atol=1e-7)
    np.testing.assert_allclose(sol.v, ref.y[2:].T, atol=1e-6)


@pytest.mark.slow
def test_two_link_baumgarte_stops_at_the_singular_configuration():
    """Mukharlyamov and Deressa (2015), Example 1, Case 1: Baumgarte fails where the arm folds (t =
    x0/v)."""
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    formulation = jaxdae.Baumgarte([20.0, 10.0], [100.0, 25.0])
    sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, throw=False)
    assert sol.result == jaxdae.RESULTS.singular_constraint_matrix
    assert abs(float(sol.t_final) - float(system.x0 / system.speed)) < 5e-3
    np.testing.assert_allclose(sol.q_final, [np.pi / 2, np.pi], atol=5e-3)
    with pytest.raises(jaxdae.SimulationError, match=r"singular[\s\S]*t = 0\.49"):
        jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0)
    # The penalty formulation passes through the same configuration.
    ok = jaxdae.simulate(
        system, jaxdae.ModifiedLagrange(10.0, [20.0, 10.0], [100.0, 25.0]), 0.0, 2.0, q0, v0
    )
    assert ok.succeeded
    assert np.max(np.abs(ok.phi)) < 0.05


def test_failure_tests_only_where_they_can_turn_true():
    """The exact-multiplier and redundant-coordinate formulations test `G M⁻¹ Gᵀ` or
    `∂F/∂q_dep`, which a system without constraints does not have: its solve has no failure
    test to trace, and no event that `BacksolveAdjoint` would have to refuse."""
    for formulation in (
        jaxdae.Unstabilized(),
        jaxdae.Baumgarte(1.0, 1.0),
        jaxdae.RedundantCoordinates((0,)),
    ):
        assert formulation.can_fail
        assert not formulation.fails_with(0, 0)
        assert formulation.fails_with(1, 0)
    assert jaxdae.Unstabilized().fails_with(0, 1)
    assert not jaxdae.ModifiedLagrange(1.0, 1.0, 1.0).fails_with(1, 0)
    sol = jaxdae.simulate(
        _Free(),
        jaxdae.Unstabilized(),
        0.0,
        0.1,
        jnp.zeros(1),
        jnp.ones(1),
        adjoint=diffrax.BacksolveAdjoint(),
    )
    np.testing.assert_allclose(sol.q_final, [0.1], rtol=1e-8)


class _Free(jaxdae.LagrangianSystem):
    """A free point on a line: no constraints."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v


class _OneLine(jaxdae.LagrangianSystem):
    """A point on the line `x = 1` written as `x² − 1 = 0`, whose gradient vanishes at `x = 0`."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 - 1.0])


def test_a_single_vanishing_constraint_gradient_is_named():
    """`J M⁻¹ Jᵀ = 4x²` is 1 × 1, so its own condition number is 1 all the way to `x = 0`;
    compared with its value at the start, Baumgarte stops there by name (it used to grind
    through 100,000 shrinking steps and report `max_steps_reached`). The underdamped gains
    make `Φ` overshoot from `x0 = 2` (`Φ = 3`) to `Φ = −1`."""
    system = _OneLine()
    formulation = jaxdae.Baumgarte(1.0, 25.0)
    q0, v0 = jnp.array([2.0, 0.0]), jnp.zeros(2)
    sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, throw=False)
    assert sol.result == jaxdae.RESULTS.singular_constraint_matrix
    assert int(sol.stats["num_steps"]) < 1000
    assert abs(float(sol.q_final[0])) < 1e-3
    with pytest.raises(jaxdae.SimulationError, match=r"singular[\s\S]*t = 0\.42"):
        jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0)


# -- exact perturbation dynamics ---------------------------------------------------------


@pytest.mark.parametrize(
    "kd, kp",
    [
        (3.0, 4.0),
        pytest.param(jnp.array([3.0, 5.0]), jnp.array([4.0, 9.0]), marks=pytest.mark.slow),
        (jnp.array([[4.0, 1.0], [1.0, 3.0]]), jnp.array([[6.0, -2.0], [-2.0, 5.0]])),
    ],
    ids=["scalar", "diagonal", "coupled-matrix"],
)
def test_baumgarte_perturbations_follow_their_linear_ode(kd, kp):
    """Started off the manifold, (Φ, Φ̇) = expm(H t)(Φ₀, Φ̇₀) with H of Mukharlyamov and Deressa
    (2015) eq. [16]."""
    system = DoublePendulum()
    q0 = jnp.array([0.75, -0.6, 1.4, -1.5])  # |q1| ≠ 1, |q2 − q1| ≠ 1
    v0 = jnp.array([0.3, 0.1, -0.2, 0.4])
    formulation = jaxdae.Baumgarte(kd, kp)
    ts = jnp.linspace(0.0, 1.5, 7)
    sol = jaxdae.simulate(system, formulation, 0.0, 1.5, q0, v0, ts=ts, rtol=1e-10, atol=1e-12)
    h = np.asarray(formulation.perturbation_matrix(2))
    y0 = np.concatenate([sol.phi[0], sol.dphi[0]])
    expected = np.stack([scipy.linalg.expm(h * t) @ y0 for t in np.asarray(ts)])
    np.testing.assert_allclose(sol.phi, expected[:, :2], atol=1e-8 * np.abs(y0).max())
    np.testing.assert_allclose(sol.dphi, expected[:, 2:], atol=1e-8 * np.abs(y0).max())
    assert np.abs(sol.phi[-1]).max() < 0.5 * np.abs(sol.phi[0]).max()


def test_energy_conserved_and_unstabilized_drifts_more():
    """Conservative scleronomic pendulum: T + V constant; Unstabilized drifts, Baumgarte not."""
    ts = jnp.linspace(0.0, 40.0, 81)
    kwargs = dict(ts=ts, rtol=1e-6, atol=1e-8)
    stab = jaxdae.simulate(PENDULUM, jaxdae.Baumgarte(10.0, 25.0), 0.0, 40.0, Q_ON, V_ON, **kwargs)
    drift = jaxdae.simulate(PENDULUM, jaxdae.Unstabilized(), 0.0, 40.0, Q_ON, V_ON, **kwargs)
    assert np.abs(stab.energy - stab.energy[0]).max() < 1e-4 * abs(float(stab.energy[0]))
    drift_stab, drift_free = np.abs(stab.phi).max(), np.abs(drift.phi).max()
    assert drift_free > 10 * drift_stab, (drift_free, drift_stab)
    tight = jaxdae.simulate(PENDULUM, jaxdae.Baumgarte(10.0, 25.0), 0.0, 40.0, Q_ON, V_ON, ts=ts)
    assert np.abs(tight.energy - tight.energy[0]).max() < 1e-6 * abs(float(tight.energy[0]))


# -- redundant constraints ---------------------------------------------------------------


@pytest.mark.slow
def test_redundant_constraints():
    """Same constraint written twice: PseudoInverse and ModifiedLagrange run, Baumgarte says why
    not."""
    system = TwicePendulum(mass=1.3, length=0.8)
    q0, v0 = Q_ON * 1.01, V_ON  # slightly off the manifold
    ts = jnp.linspace(0.0, 3.0, 31)
    pinv = jaxdae.simulate(system, jaxdae.PseudoInverse(10.0, 25.0), 0.0, 3.0, q0, v0, ts=ts)
    assert np.abs(pinv.phi[-1]).max() < 1e-3 * np.abs(pinv.phi[0]).max()
    # The penalty method keeps a small residual Φ ≈ λ / (α K_P) (Mukharlyamov and Deressa (2015),
    # eq. [31]).
    penalty = jaxdae.simulate(
        system, jaxdae.ModifiedLagrange(200.0, 10.0, 25.0), 0.0, 3.0, q0, v0, ts=ts
    )
    assert np.abs(penalty.phi[10:]).max() < 5e-3
    single = jaxdae.simulate(PENDULUM, jaxdae.Baumgarte(10.0, 25.0), 0.0, 3.0, q0, v0, ts=ts)
    np.testing.assert_allclose(pinv.q, single.q, atol=1e-7)  # same ideal reaction
    with pytest.raises(jaxdae.SimulationError, match="singular"):
        jaxdae.simulate(system, jaxdae.Baumgarte(10.0, 25.0), 0.0, 3.0, q0, v0)


# -- jit / vmap / grad -------------------------------------------------------------------


def _final_loss(formulation, q0, v0, system=PENDULUM, **kwargs):
    sol = jaxdae.simulate(system, formulation, 0.0, 1.0, q0, v0, **kwargs)
    return jnp.sum(sol.q[-1] ** 2) + jnp.sum(sol.v[-1]) + 10 * jnp.sum(sol.phi[-1] ** 2)


_TIGHT = dict(rtol=1e-12, atol=1e-12)
_loss = eqx.filter_jit(lambda f, q0, v0: _final_loss(f, q0, v0, **_TIGHT))
# One compiled gradient w.r.t. the gains and `q0` together (a gradient compiles in ≈ 10 s).
_grad = eqx.filter_jit(
    eqx.filter_grad(lambda gains_and_q0, v0: _final_loss(*gains_and_q0, v0, **_TIGHT))
)


def _central_difference(fn, x, eps=1e-6):
    x = np.asarray(x, dtype=float)
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        dx = np.zeros_like(x)
        dx[i] = eps
        out[i] = (fn(x + dx) - fn(x - dx)) / (2 * eps)
    return out


@pytest.mark.slow
def test_grad_wrt_gains_and_initial_state_matches_central_differences():
    q0, v0 = Q_ON * 1.02, V_ON + 0.1
    formulation = jaxdae.Baumgarte(jnp.array(6.0), jnp.array(9.0))
    grads, grad_q0 = _grad((formulation, q0), v0)
    for name in ("kd", "kp"):
        fd = _central_difference(
            lambda x, name=name: float(
                _loss(eqx.tree_at(lambda f: getattr(f, name), formulation, jnp.asarray(x)), q0, v0)
            ),
            getattr(formulation, name),
        )
        np.testing.assert_allclose(getattr(grads, name), fd, rtol=1e-5)
    fd_q0 = _central_difference(lambda x: float(_loss(formulation, jnp.asarray(x), v0)), q0)
    np.testing.assert_allclose(grad_q0, fd_q0, rtol=1e-5)


@pytest.mark.slow
def test_grad_wrt_system_parameters_and_alpha():
    q0, v0 = Q_ON, V_ON

    def loss(system, formulation):
        return _final_loss(formulation, q0, v0, system=system, **_TIGHT)

    system, formulation = PENDULUM, jaxdae.ModifiedLagrange(jnp.array(20.0), 6.0, 9.0)
    g_sys, g_form = jax.jit(jax.grad(loss, argnums=(0, 1)))(system, formulation)
    loss_jit = jax.jit(loss)
    fd_len = _central_difference(
        lambda x: float(
            loss_jit(eqx.tree_at(lambda s: s.length, system, jnp.asarray(x)), formulation)
        ),
        system.length,
    )
    fd_alpha = _central_difference(
        lambda x: float(
            loss_jit(system, eqx.tree_at(lambda f: f.alpha, formulation, jnp.asarray(x)))
        ),
        formulation.alpha,
    )
    np.testing.assert_allclose(g_sys.length, fd_len, rtol=1e-5)
    np.testing.assert_allclose(g_form.alpha, fd_alpha, rtol=1e-5)


@pytest.mark.slow
def test_vmap_over_initial_states_gains_and_parameters_matches_loop():
    ts = jnp.linspace(0.0, 1.0, 3)
    angles = jnp.array([0.2, 0.9, 1.6])
    states = jax.vmap(PENDULUM.state_from_angle, in_axes=(0, None))(angles, 0.0)
    kds = jnp.array([2.0, 6.0, 12.0])
    lengths = jnp.array([0.5, 0.8, 1.2])

    def run(system, kd, q0, v0):
        return jaxdae.simulate(system, jaxdae.Baumgarte(kd, 9.0), 0.0, 1.0, q0, v0, ts=ts).q

    systems = jax.vmap(lambda length: CartesianPendulum(mass=1.3, length=length))(lengths)
    q0s = states[0] * (lengths / 0.8)[:, None]
    v0s = states[1]
    batched = jax.jit(jax.vmap(run))(systems, kds, q0s, v0s)
    for i in range(3):
        single = run(CartesianPendulum(mass=1.3, length=lengths[i]), kds[i], q0s[i], v0s[i])
        np.testing.assert_allclose(batched[i], single, rtol=1e-9, atol=1e-12)


@pytest.mark.perf(reason="pins the jit cache size of the private `solve_problem`")
def test_fixed_step_solver_and_float32():
    """Any diffrax solver/controller may be passed; float32 inputs give a float32 solution."""
    sol = jaxdae.simulate(
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        Q_ON,
        V_ON,
        solver=diffrax.Heun(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=1e-3,
    )
    assert sol.stats["num_steps"] == 1000
    assert np.abs(sol.phi).max() < 1e-4
    float32 = lambda rtol: jaxdae.simulate(  # noqa: E731
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        Q_ON.astype(jnp.float32),
        V_ON.astype(jnp.float32),
        rtol=rtol,
        atol=1e-6,
    )
    sol32 = float32(1e-5)
    assert sol32.q.dtype == jnp.float32
    assert np.abs(sol32.phi).max() < 1e-4
    # A sweep over the step or the tolerances reuses the compiled solve.
    compiled = jaxdae._integration._simulate.solve_problem.jitted._cached._cache_size()
    sol = jaxdae.simulate(
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        Q_ON,
        V_ON,
        solver=diffrax.Heun(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=2e-3,
    )
    assert sol.stats["num_steps"] == 500
    assert float32(1e-4).stats["num_steps"] < sol32.stats["num_steps"]
    # So does an eager call with `throw=False` (it only decides what happens after the solve).
    unchecked = jaxdae.simulate(
        PENDULUM,
        jaxdae.Baumgarte(10.0, 25.0),
        0.0,
        1.0,
        Q_ON,
        V_ON,
        solver=diffrax.Heun(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=2e-3,
        throw=False,
    )
    assert unchecked.succeeded
    assert jaxdae._integration._simulate.solve_problem.jitted._cached._cache_size() == compiled


def test_float32_despite_a_models_float64_constants():
    """With float64 enabled, `jnp.eye(2)` in a model is float64 (`MovingSupportPendulum`'s
    mass matrix). A float32 solve stays float32 (its state and stage times too: the
    rheonomic constraint differentiates through them), with diffrax's `Tsit5` and with
    `UnrolledERK`, which must not promote the stage times with its float64 tableau."""
    system = MovingSupportPendulum()
    q0, v0 = jnp.array([0.6, -0.8], jnp.float32), jnp.zeros(2, jnp.float32)
    sols = [
        jaxdae.simulate(
            system,
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            1.0,
            q0,
            v0,
            solver=solver,
            rtol=1e-5,
            atol=1e-7,
        )
        for solver in (diffrax.Tsit5(), jaxdae.UnrolledERK(diffrax.Tsit5()))
    ]
    for sol in sols:
        assert sol.q.dtype == sol.phi.dtype == sol.multipliers.dtype == jnp.float32
        assert sol.succeeded
    np.testing.assert_allclose(sols[0].q_final, sols[1].q_final, atol=1e-5)


@pytest.mark.slow
def test_gradient_of_save_times_on_the_fixed_step_grid():
    """Save times on the step grid (`linspace(0, 1.5, 31)`, `dt0 = 0.01`): the reverse pass
    of diffrax's checkpointed loop recomputed the step ends with other rounding and counted
    the cotangent of `q(1.2)` twice under `jit` (`jaxdae._integration._solve.save_at`)."""
    ts = jnp.linspace(0.0, 1.5, 31)

    def solve(kd):
        return jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            1.5,
            Q_ON * 1.02,
            V_ON,
            ts=ts,
            solver=diffrax.Heun(),
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=0.01,
            max_steps=200,
        )

    def total(kd):
        return jnp.sum(solve(kd).q[:, 0])

    kd = jnp.asarray(6.0)
    # diffrax saved a few ulps early; the solution reports the requested times.
    np.testing.assert_array_equal(jax.jit(solve)(kd).ts, ts)
    forward = jax.jit(total)
    step = 1e-5
    fd = (forward(kd + step) - forward(kd - step)) / (2 * step)
    np.testing.assert_allclose(jax.jit(jax.grad(total))(kd), fd, rtol=1e-6)


# -- consistent initialization -----------------------------------------------------------


def test_consistent_initial_state_is_the_mass_metric_projection():
    q_guess = jnp.array([0.9, -0.5])
    v_guess = jnp.array([0.7, 0.4])
    q, v = jaxdae.consistent_initial_state(PENDULUM, 0.0, q_guess, v_guess)
    np.testing.assert_allclose(q, 0.8 * q_guess / jnp.linalg.norm(q_guess), atol=1e-12)
    radial = q / jnp.linalg.norm(q)
    np.testing.assert_allclose(v, v_guess - (v_guess @ radial) * radial, atol=1e-12)
    # Rheonomic: Φ̇ = 0 includes Φ_t.
    system = MovingSupportPendulum()
    q, v = jaxdae.consistent_initial_state(system, 0.3, jnp.array([0.2, -1.1]), jnp.zeros(2))
    terms = eqx.filter_jit(system.terms)(jnp.array(0.3), q, v)
    assert np.abs(terms.phi).max() < 1e-12 and np.abs(terms.dphi).max() < 1e-12


def test_consistent_initial_state_tolerance_scales_with_velocities():
    """A fast guess is projected to `Φ̇ = 0` up to rounding relative to its speed, not
    refused: the default tolerance of `Φ̇` and `Ψ` scales with `max |v0|`."""
    q, v = jaxdae.consistent_initial_state(
        PENDULUM, 0.0, jnp.array([0.9, -0.5]), 1e6 * jnp.array([0.7, 0.4])
    )
    assert abs(float(q @ v)) < 1e3 * np.finfo(float).eps * 1e6


@pytest.mark.perf(reason="pins the jit cache size of the private `_project`")
def test_consistent_initial_state_under_vmap_and_grad():
    """A batch projected with `vmap` equals the guesses projected one by one; the Jacobian of
    the pendulum's projection `q = L q0/|q0|` is `(L/|q0|)(I − q̂ q̂ᵀ)`; eager calls with new
    guesses reuse one compilation (the tolerance, scaled by the guess, is traced)."""
    from jaxdae._systems._consistent import _project

    guesses = jnp.array([[0.9, -0.5], [-0.3, -0.6], [0.1, 1.2]])
    velocities = jnp.array([[0.7, 0.4], [0.0, 1.0], [-2.0, 0.3]])
    project = lambda q, v: jaxdae.consistent_initial_state(PENDULUM, 0.0, q, v)  # noqa: E731
    compiled = _project._cached._cache_size()
    one_by_one = [project(q, v) for q, v in zip(guesses, velocities, strict=False)]
    assert _project._cached._cache_size() - compiled <= 1
    batch = jax.jit(jax.vmap(project))(guesses, velocities)
    for i, (q, v) in enumerate(one_by_one):
        np.testing.assert_allclose(batch[0][i], q, atol=1e-14)
        np.testing.assert_allclose(batch[1][i], v, atol=1e-14)

    q0 = guesses[0]
    jacobian = jax.jacobian(lambda q: project(q, jnp.zeros(2))[0])(q0)
    unit = q0 / jnp.linalg.norm(q0)
    expected = 0.8 / jnp.linalg.norm(q0) * (jnp.eye(2) - jnp.outer(unit, unit))
    np.testing.assert_allclose(jacobian, expected, atol=1e-10)


def test_traced_gain_checks_are_values():
    """A formulation returns the checks of its traced gains as `(flag, message)` pairs
    (`traced_checks`), which `simulate` joins to its own runtime checks as one error;
    `validate` checks shapes (and concrete values) and returns the formulation."""
    messages = []

    @jax.jit
    def flags(kd):
        formulation = jaxdae.Baumgarte(kd, 25.0)
        assert formulation.validate(1, 0) is formulation
        checks = formulation.traced_checks(1, 0)
        messages[:] = [message for _, message in checks]
        return jnp.stack([flag for flag, _ in checks])

    assert not np.any(np.asarray(flags(10.0)))
    bad = np.asarray(flags(-1.0))
    assert bad[0] and not bad[1]  # `kd` (and the default `kv = kd/2`), not `kp`
    assert messages[0].startswith("`kd` must be symmetric positive definite")
    assert jaxdae.Baumgarte(10.0, 25.0).traced_checks(1, 0) == ()  # checked eagerly
    with pytest.raises(ValueError, match="`kd` has shape"):
        jaxdae.Baumgarte(jnp.ones(3), 25.0).validate(2, 0)


@pytest.mark.slow
@pytest.mark.parametrize("saved", ["ts", "ends"])
def test_diagnostics_differentiate_alike_in_forward_and_reverse_mode(saved):
    """The saved states' residuals, multipliers, energy and momenta are the same function
    whatever the adjoint: `jax.jvp` (with `diffrax.ForwardMode()`, which differentiates
    them by JAX) and `jax.grad` (with the default `ReverseSweepAdjoint` and with
    `RecursiveCheckpointAdjoint`, which differentiate them by their own vector–Jacobian
    product, given cotangents for some of their outputs only) agree, at save times `ts`
    and at the two ends. Fixed steps: every adjoint differentiates the same computation.
    (Started off the constraint, so that the gain matters.)"""
    q0, v0 = PENDULUM.state_from_angle(1.0, 0.3)
    q0 = 1.05 * q0
    ts = jnp.linspace(0.0, 0.5, 6) if saved == "ts" else None

    def loss(kd, adjoint=None):
        sol = jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            0.5,
            q0,
            v0,
            ts=ts,
            solver=diffrax.Tsit5(),
            dt0=0.01,
            stepsize_controller=diffrax.ConstantStepSize(),
            adjoint=adjoint,
        )
        return (
            jnp.sum(sol.phi**2)
            + jnp.sum(sol.dphi)
            + jnp.sum(sol.energy)
            + jnp.sum(sol.multipliers)
            + jnp.sum(sol.p_final)
            + jnp.sum(sol.q_final)
        )

    kd = jnp.asarray(10.0)
    _, forward = jax.jvp(lambda k: loss(k, diffrax.ForwardMode()), (kd,), (jnp.ones(()),))
    swept = jax.grad(loss)(kd)
    checkpointed = jax.grad(loss)(kd, diffrax.RecursiveCheckpointAdjoint(checkpoints=8))
    assert abs(float(swept)) > 1e-4
    np.testing.assert_allclose(forward, swept, rtol=1e-10)
    np.testing.assert_allclose(checkpointed, swept, rtol=1e-10)
