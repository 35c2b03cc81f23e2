"""Constraint-enforcing control through actuator dynamics (Mukharlyamov (2019), §§2–5)."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import jaxdae
from jaxdae._systems._actuated import lie_derivatives
from jaxdae.examples import AdaptiveOpticsElement, BouncingBall, CartesianPendulum

OPTICS = AdaptiveOpticsElement()
CONTROL = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)
TS = jnp.linspace(0.0, 3.0, 7)


# one program a control (eagerly, each operation of the block matrix compiles alone)
_perturbation_matrix = eqx.filter_jit(jaxdae.perturbation_matrix)


def _exact_perturbations(control, num_constraints, ts, y0):
    """`y(t) = expm(H t) y0`, `y = (f, ḟ, …)` stacked by derivative then constraint."""
    h = np.asarray(_perturbation_matrix(control, num_constraints))
    return np.stack([scipy.linalg.expm(h * t) @ y0 for t in np.asarray(ts)])


def test_perturbations_decay_as_the_companion_equation():
    """Started off the programmed motion, the reflection-law residual and its first three
    derivatives follow `ẏ = H y` exactly (Mukharlyamov (2019), eq. [5.8]), so the crank settles on
    the programmed angle."""
    q0, v0, w0 = OPTICS.initial_state(angle_error=0.05)
    sol = jaxdae.simulate_actuated(OPTICS, CONTROL, 0.0, 3.0, q0, v0, w0, ts=TS)
    y = np.asarray(sol.residuals)[:, :, 0]
    expected = _exact_perturbations(CONTROL, 1, TS, y[0])
    scale = np.max(np.abs(y), axis=0)
    np.testing.assert_array_less(np.max(np.abs(y - expected), axis=0), 1e-6 * scale)
    assert abs(y[-1, 0]) < 1e-9 * abs(y[0, 0])
    # one program (eagerly, each operation compiles alone)
    angle = eqx.filter_jit(lambda system, t: system.programmed_angle(t))
    programmed = angle(OPTICS, np.asarray(TS)[-1:])
    np.testing.assert_allclose(np.asarray(sol.q)[-1, 0], programmed[0], atol=1e-9)
    assert sol.succeeded and sol.u.shape == (7, 1) and sol.w.shape == (7, 2)
    assert sol.t_final == 3.0


def test_lie_derivatives_and_decoupling_match_the_paper():
    """Autodiff gives the hand-derived `ḟ` of eq. [5.1] and `g = 2 c s sin φ k_M k_a/L`,
    `k_M = 1/(m l²)` (eq. [5.6]; the denominator of eq. [5.7] omits `k_M`), and the input is
    absent from `f, …, f⁽³⁾` (relative degree 4)."""
    t, q, v, w = 0.7, jnp.array([1.2]), jnp.array([0.3]), jnp.array([0.004, -0.02])

    @jax.jit
    def quantities(t, q, v, w):
        _, rates, gains = lie_derivatives(OPTICS, 4, t, (q, v, w))
        return rates[0][0], [g[0] for g in gains]  # the one group of constraints

    rate, gains = quantities(t, q, v, w)
    c, length, s = OPTICS.distance, OPTICS.mechanism.length, OPTICS.source(t)
    s_dot = OPTICS.source_amplitude * OPTICS.source_frequency * jnp.cos(OPTICS.source_frequency * t)
    phi, omega = q[0], v[0]
    expected_rate = (length - 2 * c * jnp.cos(phi)) * s_dot + 2 * c * s * jnp.sin(phi) * omega
    np.testing.assert_allclose(rate[0], expected_rate, rtol=1e-12)
    for g in gains[:3]:
        assert np.all(np.asarray(g) == 0)
    np.testing.assert_allclose(
        gains[3][0, 0],
        2
        * c
        * s
        * jnp.sin(phi)
        * OPTICS.torque_constant
        / OPTICS.inductance
        / (OPTICS.mechanism.mass * length**2),
        rtol=1e-12,
    )


def _final_residual(rate, angle_error=0.05, adjoint=None):
    q0, v0, w0 = OPTICS.initial_state(angle_error=angle_error)
    control = jaxdae.ConstraintEnforcingControl.with_poles(rate, order=4)
    sol = jaxdae.simulate_actuated(
        OPTICS,
        control,
        0.0,
        0.5,
        q0,
        v0,
        w0,
        ts=jnp.array([0.0, 0.25, 0.5]),
        adjoint=adjoint,
        max_steps=1024,
    )
    return sol.residuals[-1, 0, 0]


_ERRORS = jnp.array([0.05, -0.02])


def _batched_gradients(adjoint=None):
    """Values and gradients w.r.t. the poles' rate and the initial angle error of a vmapped
    batch of two angle errors: one compiled program."""
    return jax.jit(
        jax.vmap(
            jax.value_and_grad(lambda *a: _final_residual(*a, adjoint=adjoint), argnums=(0, 1)),
            in_axes=(None, 0),
        )
    )(10.0, _ERRORS)


@pytest.mark.slow
def test_vmap_and_grad_over_gains():
    """The gradient of a vmapped batch w.r.t. the gains and the initial state (the default
    adjoint, `ReverseSweepAdjoint`), against central differences."""
    batched, grads = _batched_gradients()
    one = [_final_residual(10.0, float(e)) for e in _ERRORS]
    np.testing.assert_allclose(batched, one, rtol=1e-10)

    eps = 1e-4
    fd = (_final_residual(10.0 + eps) - _final_residual(10.0 - eps)) / (2 * eps)  # at 0.05
    np.testing.assert_allclose(grads[0][0], fd, rtol=1e-5)
    assert grads[0][0] < 0  # faster poles: a smaller residual at t = 0.5
    eps = 1e-6
    fd = (_final_residual(10.0, 0.05 + eps) - _final_residual(10.0, 0.05 - eps)) / (2 * eps)
    np.testing.assert_allclose(grads[1][0], fd, rtol=1e-5)


@pytest.mark.slow
def test_vmap_and_grad_over_gains_with_checkpoints():
    """diffrax's `RecursiveCheckpointAdjoint` gives the default adjoint's batched values and
    gradients to rounding."""
    batched, grads = _batched_gradients()
    checkpointed = _batched_gradients(diffrax.RecursiveCheckpointAdjoint())
    np.testing.assert_allclose(checkpointed[0], batched, rtol=1e-12)
    for checkpointed_grad, grad in zip(checkpointed[1], grads, strict=False):
        np.testing.assert_allclose(checkpointed_grad, grad, rtol=1e-9)


def test_fixed_step_stability_follows_the_transition_matrix():
    """Mukharlyamov (2019) §4: the continuous perturbation equation is stable for every step, but
    under explicit Euler the residual stays bounded only when `ρ(I + τH) < 1`."""
    control = jaxdae.ConstraintEnforcingControl.with_poles(40.0, order=4)
    h = _perturbation_matrix(control, 1)
    q0, v0, w0 = OPTICS.initial_state(angle_error=0.02)

    def late_residual(dt):
        sol = jaxdae.simulate_actuated(
            OPTICS,
            control,
            0.0,
            6.0,
            q0,
            v0,
            w0,
            ts=jnp.linspace(3.0, 6.0, 31),
            solver=diffrax.Euler(),
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=dt,
            throw=False,
        )
        return sol.result, jnp.max(jnp.abs(sol.residuals[:, 0, 0]))

    stable, unstable = jnp.asarray(0.02), jnp.asarray(0.06)
    # one program for both steps (eagerly, each operation compiles alone)
    radius = jax.jit(
        lambda dt: jaxdae.spectral_radius(jaxdae.transition_matrix(h, diffrax.Euler(), dt))
    )
    assert radius(stable) < 1
    assert radius(unstable) > 1
    result, residual = late_residual(stable)
    assert result == jaxdae.RESULTS.successful and residual < 1e-3
    result, _ = late_residual(unstable)
    assert result == jaxdae.RESULTS.non_finite_state
    with pytest.raises(jaxdae.SimulationError, match="non-finite"):
        jaxdae.simulate_actuated(
            OPTICS,
            control,
            0.0,
            6.0,
            q0,
            v0,
            w0,
            ts=jnp.linspace(3.0, 6.0, 31),
            solver=diffrax.Euler(),
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=unstable,
        )


def test_singular_configuration_is_reported():
    """With the source passing `s = l c/(2c − l)`, the programmed crank angle reaches
    `φ = 0`, where `g = 2 c s sin φ k_a/L` vanishes (eq. [5.7])."""
    system = AdaptiveOpticsElement(source_mean=0.3, source_amplitude=0.28)
    q0, v0, w0 = system.initial_state()
    sol = jaxdae.simulate_actuated(system, CONTROL, 0.0, 3.0, q0, v0, w0, ts=TS, throw=False)
    assert sol.result == jaxdae.RESULTS.singular_decoupling_matrix
    assert 0.5 < sol.t_final < 3.0 and abs(sol.q_final[0]) < 0.1
    assert np.all(np.isinf(np.asarray(sol.u[-1])))
    # Without `ts` (t0 and t1 saved directly): the unreached t1 row is inf as well.
    default = jaxdae.simulate_actuated(system, CONTROL, 0.0, 3.0, q0, v0, w0, throw=False)
    assert default.result == jaxdae.RESULTS.singular_decoupling_matrix
    np.testing.assert_allclose(default.t_final, sol.t_final, rtol=1e-6)
    assert np.isinf(default.ts[1]) and np.all(np.isinf(np.asarray(default.residuals[1])))
    with pytest.raises(jaxdae.SimulationError, match="decoupling matrix"):
        jaxdae.simulate_actuated(system, CONTROL, 0.0, 3.0, q0, v0, w0, ts=TS)


class _PlanarMass(jaxdae.LagrangianSystem):
    mass: jax.Array

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * v @ v


class _ThreeThrusters(jaxdae.ActuatedSystem):
    """A point mass pushed by three thrusters at 120° with first-order lag; its programmed
    motion is a circle: two constraints, three inputs (minimum-norm input, eq. [2.11])."""

    mechanism: _PlanarMass
    lag: jax.Array

    def __init__(self):
        self.mechanism = _PlanarMass(jnp.asarray(2.0))
        self.lag = jnp.asarray(0.1)

    def directions(self):
        angles = jnp.array([0.0, 2.0, 4.0]) * jnp.pi / 3
        return jnp.stack([jnp.cos(angles), jnp.sin(angles)])

    def actuator_forces(self, t, q, v, w):
        return self.directions() @ w

    def actuator_drift(self, t, q, v, w):
        return -w / self.lag

    def input_matrix(self, t, q, v, w):
        return jnp.eye(3) / self.lag

    def program_constraints(self, t, q, v):
        return q - jnp.array([jnp.cos(t), jnp.sin(t)])


@pytest.mark.slow
def test_several_constraints_inputs_and_coupled_gains():
    system = _ThreeThrusters()
    coupling = jnp.array([[0.0, 0.3], [-0.3, 0.0]])
    control = jaxdae.ConstraintEnforcingControl(
        [125.0 * jnp.eye(2), 75.0 * jnp.eye(2) + coupling, jnp.array([15.0, 16.0])]
    )
    q0, v0, w0 = jnp.array([1.2, 0.1]), jnp.array([0.0, 0.8]), jnp.array([0.5, 0.0, -0.2])
    ts = jnp.linspace(0.0, 2.0, 5)
    sol = jaxdae.simulate_actuated(system, control, 0.0, 2.0, q0, v0, w0, ts=ts)
    y = np.asarray(sol.residuals).reshape(len(ts), -1)  # (f, ḟ, f̈) per row
    expected = _exact_perturbations(control, 2, ts, y[0])
    np.testing.assert_allclose(y, expected, atol=1e-7 * np.max(np.abs(y)))
    # The minimum-norm input lies in the row space of g = D/(m T) (no null-space part).
    null = np.cross(*np.asarray(system.directions()))
    np.testing.assert_allclose(np.asarray(sol.u) @ null, 0.0, atol=1e-8)
    assert sol.succeeded

    # A null-space input (eq. [2.10]): all thrusters pushing 2 N more cancel out, and the
    # part of `u₀` that would move the mass is projected away; the motion is unchanged.
    nominal = jnp.array([3.0, 2.0, 2.0])
    pushed = jaxdae.ConstraintEnforcingControl(
        control.gains, null_space_input=lambda t, q, v, w: nominal
    )
    sol2 = jaxdae.simulate_actuated(system, pushed, 0.0, 2.0, q0, v0, w0, ts=ts)
    np.testing.assert_allclose(sol2.q, sol.q, atol=1e-7)
    unit = null / np.linalg.norm(null)
    change = np.asarray(sol2.u) - np.asarray(sol.u)
    np.testing.assert_allclose(change, np.outer(change @ unit, unit), atol=1e-7)
    np.testing.assert_allclose(change @ unit, float(nominal @ unit), rtol=1e-7)


class _PositionAndSpeedGoals(_ThreeThrusters):
    """The same mass with a holonomic goal `x = cos t` (relative degree 3) and a velocity
    goal `ẏ = 0.5` (relative degree 2): groups of program constraints (Mukharlyamov (2019), eqs.
    [2.3]–[2.4])."""

    def program_constraints(self, t, q, v):
        return q[:1] - jnp.cos(t)[None], v[1:] - 0.5


@pytest.mark.slow
def test_groups_of_constraints_with_different_relative_degrees():
    system = _PositionAndSpeedGoals()
    control = jaxdae.ConstraintEnforcingControl(
        ([125.0, 75.0, 15.0], jaxdae.ConstraintEnforcingControl.with_poles(4.0, 2).gains)
    )
    assert control.order == (3, 2)
    q0, v0, w0 = jnp.array([1.2, 0.1]), jnp.array([0.0, 0.8]), jnp.array([0.5, 0.0, -0.2])
    ts = jnp.linspace(0.0, 2.0, 5)
    sol = jaxdae.simulate_actuated(system, control, 0.0, 2.0, q0, v0, w0, ts=ts)
    position, speed = sol.residuals
    assert position.shape == (5, 3, 1) and speed.shape == (5, 2, 1)
    y = np.concatenate([np.asarray(position)[:, :, 0], np.asarray(speed)[:, :, 0]], axis=1)
    expected = _exact_perturbations(control, (1, 1), ts, y[0])
    np.testing.assert_allclose(y, expected, atol=1e-7 * np.max(np.abs(y)))
    with pytest.raises(ValueError, match="returns 2 group\\(s\\) but the control has 1"):
        jaxdae.simulate_actuated(
            system, jaxdae.ConstraintEnforcingControl.with_poles(4.0, 3), 0.0, 2.0, q0, v0, w0
        )
    with pytest.raises(ValueError, match="group 1.*relative degree is 2"):
        jaxdae.simulate_actuated(
            system,
            jaxdae.ConstraintEnforcingControl(([125.0, 75.0, 15.0], [1.0, 3.0, 3.0])),
            0.0,
            2.0,
            q0,
            v0,
            w0,
        )


def test_consistent_state_in_a_weighted_metric():
    """The circle program fixes `q`, `v` and `D w = m c̈`, leaving `w` free along the null
    space of the thrust directions `D`: the weighted projection is the closed form
    `w = w0 + W⁻¹Dᵀ(D W⁻¹ Dᵀ)⁻¹(m c̈ − D w0)`."""
    system = _ThreeThrusters()
    control = jaxdae.ConstraintEnforcingControl.with_poles(5.0, order=3)
    q0, v0, w0 = jnp.array([1.2, 0.1]), jnp.array([0.0, 0.8]), jnp.array([0.5, 0.0, -0.2])
    directions, target = np.asarray(system.directions()), 2.0 * np.array([-1.0, 0.0])
    # One program for both weights (eagerly, each operation compiles alone).
    consistent = jax.jit(
        lambda w_w: jaxdae.consistent_actuated_state(
            system, control, 0.0, q0, v0, w0, weights=(1.0, 1.0, w_w)
        )
    )
    for w_w in (np.ones(3), np.array([1.0, 1.0, 100.0])):
        q, v, w = consistent(jnp.asarray(w_w))
        inverse = np.diag(1 / w_w)
        expected = w0 + inverse @ directions.T @ np.linalg.solve(
            directions @ inverse @ directions.T, target - directions @ w0
        )
        np.testing.assert_allclose(w, expected, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(q, [1.0, 0.0], atol=1e-14)
        np.testing.assert_allclose(v, [0.0, 1.0], atol=1e-14)
    assert abs(float(w[2]) - float(w0[2])) < 0.05  # the heavily weighted thruster kept its state
    with pytest.raises(ValueError, match="w_v must be positive"):
        jaxdae.consistent_actuated_state(system, control, 0.0, q0, v0, w0, weights=(1.0, -1.0, 1.0))
    with pytest.raises(ValueError, match=r"w_w must be a scalar or have shape \(3,\)"):
        jaxdae.consistent_actuated_state(
            system, control, 0.0, q0, v0, w0, weights=(1.0, 1.0, jnp.ones(2))
        )


def test_bad_input_is_refused(unchecked):
    q0, v0, w0 = OPTICS.initial_state(angle_error=0.05)
    with pytest.raises(ValueError, match="relative degree is 4.*pass 4 gains"):
        jaxdae.simulate_actuated(
            OPTICS,
            jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=5),
            0.0,
            1.0,
            q0,
            v0,
            w0,
        )
    with pytest.raises(ValueError, match="decoupling matrix .* singular at the initial"):
        jaxdae.simulate_actuated(
            OPTICS,
            jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=3),
            0.0,
            1.0,
            q0,
            v0,
            w0,
        )
    with pytest.raises(ValueError, match="not asymptotically stable"):
        jaxdae.ConstraintEnforcingControl([1.0, -2.0])
    with pytest.raises(ValueError, match="list or tuple"):
        jaxdae.ConstraintEnforcingControl(jnp.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="`w0` has shape \\(3,\\) but `actuator_drift`"):
        jaxdae.simulate_actuated(OPTICS, CONTROL, 0.0, 1.0, q0, v0, jnp.zeros(3))
    with pytest.raises(ValueError, match="`w0` contains non-finite"):
        jaxdae.simulate_actuated(OPTICS, CONTROL, 0.0, 1.0, q0, v0, w0.at[0].set(jnp.nan))
    with pytest.raises(ValueError, match="`t1` must be greater"):
        jaxdae.simulate_actuated(OPTICS, CONTROL, 1.0, 0.0, q0, v0, w0)
    with pytest.raises(ValueError, match="`t0` and `t1` must be finite"):
        jaxdae.simulate_actuated(OPTICS, CONTROL, 0.0, jnp.inf, q0, v0, w0)
    with pytest.raises(ValueError, match="ReverseSweepAdjoint` differentiates explicit"):
        jaxdae.simulate_actuated(
            OPTICS,
            CONTROL,
            0.0,
            1.0,
            q0,
            v0,
            w0,
            solver=diffrax.Kvaerno5(),
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )
    with pytest.raises(ValueError, match="ReverseSweepAdjoint` stores the steps"):
        jaxdae.simulate_actuated(
            OPTICS,
            CONTROL,
            0.0,
            1.0,
            q0,
            v0,
            w0,
            max_steps=None,
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )
    with pytest.raises(ValueError, match="`tol` must be a positive finite residual"):
        jaxdae.consistent_actuated_state(OPTICS, CONTROL, 0.0, q0, v0, w0, tol=0.0)
    with pytest.raises(ValueError, match="`v0` contains non-finite"):
        jaxdae.consistent_actuated_state(OPTICS, CONTROL, 0.0, q0, v0 * jnp.nan, w0)
    constrained = eqx.tree_at(
        lambda s: s.mechanism, OPTICS, CartesianPendulum(), is_leaf=lambda x: x is None
    )
    with pytest.raises(ValueError, match="no constraints of its own"):
        jaxdae.simulate_actuated(constrained, CONTROL, 0.0, 1.0, jnp.zeros(2), jnp.zeros(2), w0)
    bouncing = eqx.tree_at(
        lambda s: s.mechanism, OPTICS, BouncingBall(), is_leaf=lambda x: x is None
    )
    with pytest.raises(ValueError, match="one-sided constraints"):
        jaxdae.simulate_actuated(
            bouncing, CONTROL, 0.0, 1.0, jnp.array([0.0, 1.0]), jnp.zeros(2), w0
        )
    # All gains zero: the unstabilized law of eq. [2.9] is allowed, for comparison.
    assert jaxdae.ConstraintEnforcingControl([0.0] * 4).order == 4


def test_traced_gains_are_checked_for_stability():
    q0, v0, w0 = OPTICS.initial_state(angle_error=0.05)
    run = jax.jit(
        lambda gains: (
            jaxdae.simulate_actuated(
                OPTICS, jaxdae.ConstraintEnforcingControl(list(gains)), 0.0, 0.05, q0, v0, w0
            ).q_final
        )
    )
    stable = tuple(CONTROL.gains)
    assert jnp.all(jnp.isfinite(run(stable)))
    # All zero: the unstabilized law of eq. [2.9] passes the check under jit as well.
    assert jnp.all(jnp.isfinite(run(tuple(jnp.zeros_like(k) for k in stable))))
    unstable = stable[:3] + (-stable[3],)  # K_3 < 0: a root in the right half-plane
    with pytest.raises(Exception, match="not asymptotically stable"):
        jax.block_until_ready(run(unstable))  # on a GPU the error comes with the result


def test_uncoupled_companions_hold_the_companion_eigenvalues():
    # vector and scalar gains: the (p·size)-square companion matrix is block diagonal up to
    # a permutation, with one p × p block per constraint
    from jaxdae._formulations._constraint_enforcing import _companion
    from jaxdae._gains import uncoupled_companions

    gains = (np.array([6.0, 1.0, 10.0]), np.asarray(11.0), np.array([6.0, 3.0, 9.0]))
    # one program (eagerly, each operation compiles alone)
    blocks, companion = jax.jit(
        lambda gains: (uncoupled_companions(gains, 3, jnp.float64), _companion(gains, 3, "gains"))
    )(gains)
    assert blocks.shape == (3, 3, 3)
    full = np.linalg.eigvals(np.asarray(companion))
    np.testing.assert_allclose(
        np.sort_complex(np.linalg.eigvals(np.asarray(blocks)).ravel()),
        np.sort_complex(full),
        rtol=1e-9,
        atol=1e-9,
    )
    # decided from the gains' shapes: traced for them, nothing compiled
    coupled = (jnp.eye(3), jnp.asarray(1.0))
    assert jax.eval_shape(lambda: uncoupled_companions(coupled, 3, jnp.float64)) is None


def test_discrete_stability_penalty_reads_the_control_gains():
    penalty = jaxdae.DiscreteStability(diffrax.Euler(), dt=0.02, num_constraints=1)
    slow = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)
    fast = jaxdae.ConstraintEnforcingControl.with_poles(150.0, order=4)  # 1 − τγ = −2
    # the penalties and the gradient in one program (eagerly, each operation compiles alone)
    slow_penalty, fast_penalty, grads = jax.jit(
        lambda slow, fast: (penalty(slow), penalty(fast), jax.grad(lambda c: penalty(c))(fast))
    )(slow, fast)
    assert slow_penalty == 0 and fast_penalty > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.gains)


def test_gains_from_poles():
    # one program a shape (eagerly, each operation of the product of the factors compiles
    # alone); the check of conjugate pairs needs the poles' values, so it runs eagerly
    from_poles = eqx.filter_jit(jaxdae.ConstraintEnforcingControl.from_poles)
    repeated = from_poles(np.full(4, -10.0))
    np.testing.assert_allclose([float(k) for k in repeated.gains], [1e4, 4e3, 600.0, 40.0])
    pair = from_poles(np.array([-1 + 2j, -1 - 2j, -3.0]))
    np.testing.assert_allclose([float(k) for k in pair.gains], [15.0, 11.0, 5.0])  # np.poly
    eigenvalues = np.linalg.eigvals(np.asarray(_perturbation_matrix(pair, 1)))
    np.testing.assert_allclose(np.sort_complex(eigenvalues), [-3, -1 - 2j, -1 + 2j], atol=1e-12)
    with pytest.raises(ValueError, match="conjugate pairs"):
        jaxdae.ConstraintEnforcingControl.from_poles(jnp.array([-1 + 2j, -3.0]))
    grad = jax.jit(jax.grad(lambda p: jaxdae.ConstraintEnforcingControl.from_poles(p).gains[0]))(
        np.array([-1.0, -2.0])
    )
    np.testing.assert_allclose(grad, [-2.0, -1.0])  # K_0 = p_1 p_2


@pytest.mark.slow
def test_float32_states_give_a_float32_simulation():
    q0, v0, w0 = (x.astype(jnp.float32) for x in OPTICS.initial_state(angle_error=0.05))
    sol = jaxdae.simulate_actuated(OPTICS, CONTROL, 0.0, 3.0, q0, v0, w0, rtol=1e-5, atol=1e-7)
    assert sol.q.dtype == sol.u.dtype == sol.residuals.dtype == jnp.float32
    assert sol.succeeded and abs(float(sol.residuals[-1, 0, 0])) < 1e-6


@pytest.mark.slow
def test_consistent_state_is_the_programmed_state():
    """Four equations `f = … = f⃛ = 0` fix the element's four states: the projection of a
    guess 0.05 rad off equals the inverse-dynamics `programmed_state`; an unreachable
    program (cos φ = l (s + c)/(2 c s) > 1) is refused."""
    q0, v0, w0 = OPTICS.initial_state(angle_error=0.05)
    state = jaxdae.consistent_actuated_state(OPTICS, CONTROL, 0.0, q0, v0, w0)
    for got, expected in zip(state, OPTICS.programmed_state(0.0), strict=False):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
    unreachable = AdaptiveOpticsElement(source_mean=0.02, source_amplitude=0.0)
    with pytest.raises(ValueError, match="No state on the programmed motion"):
        jaxdae.consistent_actuated_state(unreachable, CONTROL, 0.0, q0, v0, w0)
    # Traced: a batch of guesses in one call, and the same refusal at run time.
    guesses = [OPTICS.initial_state(angle_error=e) for e in (0.05, -0.03)]
    batch = jax.vmap(lambda *x: jaxdae.consistent_actuated_state(OPTICS, CONTROL, 0.0, *x))(
        *(jnp.stack(parts) for parts in zip(*guesses, strict=False))
    )
    for got, expected in zip(batch, OPTICS.programmed_state(0.0), strict=False):
        np.testing.assert_allclose(got, jnp.stack([expected, expected]), rtol=1e-10, atol=1e-14)
    with pytest.raises(Exception, match="No state on the programmed motion"):
        jax.block_until_ready(
            jax.jit(
                lambda q: jaxdae.consistent_actuated_state(unreachable, CONTROL, 0.0, q, v0, w0)
            )(q0)
        )
