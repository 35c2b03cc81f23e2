"""The Rosenbrock solver `Rodas5P`: its order (linear and nonlinear), stability, dense output,
accuracy on stiff problems against scipy's Radau, the compressed Jacobian, and the
transformations (`jit`, `grad`, `vmap`, float32) through `diffeqsolve` and `simulate`."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._integration._jacobian import linearization as jacobian_linearization

DECAY = diffrax.ODETerm(lambda t, y, args: args * y)


def _forced_vdp(t, y, args):
    """A mildly nonlinear, non-autonomous test ODE (forced Van der Pol, `μ = 1`)."""
    return jnp.stack([y[1], (1 - y[0] ** 2) * y[1] - y[0] + jnp.sin(3 * t)])


VDP_Y0 = jnp.array([2.0, 0.0])


@jax.jit
def _fixed(y0, dt):
    """Rodas5P with a constant step `dt` (traced: one compile for every step)."""
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_forced_vdp),
        jaxdae.Rodas5P(),
        0.0,
        1.0,
        dt,
        y0,
        stepsize_controller=diffrax.ConstantStepSize(),
        max_steps=256,
    )
    return sol.ys[-1]


def _reference(t1=1.0):
    return diffrax.diffeqsolve(
        diffrax.ODETerm(_forced_vdp),
        diffrax.Dopri8(),
        0.0,
        t1,
        0.01,
        VDP_Y0,
        stepsize_controller=diffrax.PIDController(rtol=1e-13, atol=1e-13),
        max_steps=10_000,
    ).ys[-1]


def _slope(hs, errors):
    return np.polyfit(np.log(hs), np.log(errors), 1)[0]


def test_stability_function_and_embedded_estimate():
    """One step of `y' = λy`: `R(z) − eᶻ = O(z⁶)` (order 5), the error estimate `O(z⁵)`
    (embedded order 4), and `R(−∞) = 0` (L-stable)."""
    solver = jaxdae.Rodas5P()
    # One program for every `λ` (eagerly, each operation of the step compiles alone).
    step = jax.jit(lambda lam: solver.step(DECAY, 0.0, 1.0, jnp.ones(1), lam, None, False))
    zs = np.array([0.2, 0.1, 0.05])
    local, estimate = [], []
    for z in zs:
        y1, error, _, _, result = step(jnp.asarray(-z))
        assert result == diffrax.RESULTS.successful
        local.append(abs(float(y1[0]) - np.exp(-z)))
        estimate.append(abs(float(error[0])))
    assert _slope(zs, local) > 5.8
    assert 4.7 < _slope(zs, estimate) < 5.5
    for stiff in (1e6, 1e10):
        y1, *_ = step(jnp.asarray(-stiff))
        assert abs(float(y1[0])) < 100 / stiff  # R(z) = O(1/z)


@pytest.mark.slow
def test_order_five_on_a_nonlinear_non_autonomous_ode():
    reference = _reference()
    hs = np.array([1 / 8, 1 / 16, 1 / 32])
    errors = [float(jnp.max(jnp.abs(_fixed(VDP_Y0, h) - reference))) for h in hs]
    assert 4.6 < _slope(hs, errors) < 5.5, errors
    assert errors[-1] < 1e-7


@pytest.mark.slow
def test_dense_output_is_fourth_order():
    """Saved between the step ends, the interpolant's error falls like `h⁵` (locally)."""
    ts = jnp.linspace(0.0, 1.0, 9)[1:]
    term = diffrax.ODETerm(_forced_vdp)
    reference = diffrax.diffeqsolve(
        term,
        diffrax.Dopri8(),
        0.0,
        1.0,
        0.01,
        VDP_Y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-13, atol=1e-13),
    ).ys
    hs = np.array([0.3, 0.15, 0.075])  # step ends never at the saved times
    errors = []
    for h in hs:
        sol = diffrax.diffeqsolve(
            term, jaxdae.Rodas5P(), 0.0, 1.0, h, VDP_Y0, saveat=diffrax.SaveAt(ts=ts), max_steps=64
        )
        errors.append(float(jnp.max(jnp.abs(sol.ys - reference))))
    assert _slope(hs, errors) > 3.8, errors


def test_coloured_jacobian_equals_the_dense_one():
    """A tridiagonal vector field: three tangents (colours) give the whole Jacobian."""

    def f(t, y):
        inner = -2.0 * y**3 + jnp.sin(t) * y
        inner = inner.at[1:].add(y[:-1] ** 2).at[:-1].add(jnp.cos(y[1:]))
        return inner

    y = jnp.linspace(0.1, 1.0, 12)
    t = jnp.asarray(0.3)

    # both linearizations and the references in one program (eagerly, each operation
    # compiles alone)
    @jax.jit
    def linearizations(t, y):
        return (
            jacobian_linearization(f, t, y, "coloured"),
            jacobian_linearization(f, t, y, "dense"),
            (f(t, y), jax.jacfwd(lambda x: f(t, x))(y), jax.jacfwd(lambda s: f(s, y))(t)),
        )

    (f0, coloured, f_t, colours), (_, dense, _, tangents), references = linearizations(t, y)
    f_reference, jacobian, time_derivative = references
    assert (colours, tangents) == (3, 12)
    np.testing.assert_allclose(coloured, jacobian, atol=1e-14)
    np.testing.assert_allclose(dense, coloured, atol=1e-14)
    np.testing.assert_allclose(f0, f_reference)
    np.testing.assert_allclose(f_t, time_derivative, atol=1e-14)


def _stiff_tridiagonal(t, y, args):
    """A stiff nonlinear diffusion along a line of 24 cells, forced at one end."""
    diffusion = jnp.zeros_like(y).at[1:].add(y[:-1] - y[1:]).at[:-1].add(y[1:] - y[:-1])
    return 1e4 * diffusion - y**3 + jnp.zeros_like(y).at[0].set(jnp.sin(10 * t))


def test_banded_jacobian_of_many_states_is_inverted_without_lapack():
    """Between 17 and 64 states a Jacobian from a few tangents (3 colours) is inverted with
    array operations, in Rodas5P's step and in the configured Kvaerno5's chord iteration:
    the solve's program holds no LU factorization or triangular solve (which would keep
    XLA from compiling its loop into one kernel), and gives the solution of the dense
    Jacobian's LAPACK factors to rounding."""
    from ._jaxprs import not_in_a_loop

    y0 = jnp.linspace(0.0, 1.0, 24)

    def solve(solver, y0):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(_stiff_tridiagonal),
            solver,
            0.0,
            0.1,
            1e-4,
            y0,
            stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-9),
            max_steps=4096,
        ).ys[-1]

    chord = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-7, 1e-9)
    dense = jaxdae.Rodas5P(jacobian="dense")  # 24 tangents: LAPACK's factors
    lapack = {"lu", "triangular_solve"}
    traced = {
        name: jax.jit(lambda y, s=solver: solve(s, y)).trace(y0)
        for name, solver in (("array", jaxdae.Rodas5P()), ("chord", chord), ("lapack", dense))
    }
    for name, program in traced.items():
        assert bool(lapack & not_in_a_loop(program.jaxpr.jaxpr)) == (name == "lapack")
    results = [traced[name].lower().compile()(y0) for name in ("array", "lapack")]
    np.testing.assert_allclose(results[0], results[1], rtol=1e-9, atol=1e-12)


def _robertson(t, y, args, np=jnp):
    k1, k2, k3 = 0.04, 3e7, 1e4
    return np.stack(
        [
            -k1 * y[0] + k3 * y[1] * y[2],
            k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2,
            k2 * y[1] ** 2,
        ]
    )


def _robertson_jacobian(t, y):
    k2, k3 = 3e7, 1e4
    return np.array(
        [
            [-0.04, k3 * y[2], k3 * y[1]],
            [0.04, -k3 * y[2] - 2 * k2 * y[1], -k3 * y[1]],
            [0.0, 2 * k2 * y[1], 0.0],
        ]
    )


def test_robertson_against_scipy_radau():
    from scipy.integrate import solve_ivp

    ts = np.array([1.0, 10.0, 100.0, 1000.0])
    y0 = np.array([1.0, 0.0, 0.0])
    radau = solve_ivp(
        lambda t, y: _robertson(t, y, None, np=np),
        (0.0, ts[-1]),
        y0,
        method="Radau",
        rtol=1e-12,
        atol=1e-16,
        t_eval=ts,
        jac=_robertson_jacobian,
    ).y.T
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_robertson),
        jaxdae.Rodas5P(),
        0.0,
        ts[-1],
        1e-6,
        jnp.asarray(y0),
        saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
        max_steps=2000,
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-12),
    )
    relative = np.abs(np.asarray(sol.ys) - radau) / np.abs(radau)
    assert np.max(relative) < 1e-6, relative
    assert int(sol.stats["num_accepted_steps"]) < 300


@pytest.mark.slow
def test_van_der_pol_relaxation_against_scipy_radau():
    """Van der Pol with `μ = 10³` over two relaxation periods (fast jumps between slow
    phases), against Radau at `rtol = 1e-12`."""
    from scipy.integrate import solve_ivp

    mu = 1e3
    ts = np.linspace(0.0, 3000.0, 31)
    y0 = np.array([2.0, -0.66])

    def vdp(t, y, args=None):
        return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])

    radau = solve_ivp(
        lambda t, y: np.array([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]),
        (0.0, ts[-1]),
        y0,
        method="Radau",
        rtol=1e-12,
        atol=1e-12,
        t_eval=ts,
        jac=lambda t, y: np.array([[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]]),
    ).y.T
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vdp),
        jaxdae.Rodas5P(),
        0.0,
        ts[-1],
        1e-6,
        jnp.asarray(y0),
        saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
        max_steps=20_000,
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
    )
    # the position y₀ (the velocity is O(μ) only within the jumps)
    assert np.max(np.abs(np.asarray(sol.ys[:, 0]) - radau[:, 0])) < 1e-4


def _dragged_spring(t, y, args):
    """A unit mass dragged along `sin t` by a spring–damper of stiffness `k` and damping
    `c` (`args`), damping ratio `c / (2√k)`: `ẍ = −k (x − sin t) − c (ẋ − cos t)`, whose
    exact solution from `(0, 1)` is `x = sin t`. The stiff mode is damped, and the motion
    after it quasi-static: the model of a stiff bushing in a mechanism."""
    k, c = args
    return jnp.stack([y[1], -k * (y[0] - jnp.sin(t)) - c * (y[1] - jnp.cos(t))])


@jax.jit
def _dragged_solve(args):
    ts = jnp.linspace(0.0, 10.0, 11)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_dragged_spring),
        jaxdae.Rodas5P(),
        0.0,
        10.0,
        None,
        jnp.array([0.0, 1.0]),
        args=args,
        saveat=diffrax.SaveAt(ts=ts),
        max_steps=5000,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-9),
    )
    return sol.stats["num_accepted_steps"], jnp.max(jnp.abs(sol.ys[:, 0] - jnp.sin(ts)))


@pytest.mark.slow
def test_steps_on_a_stiff_damped_spring_do_not_grow_with_the_stiffness():
    """From `k = 10⁶` to `10¹⁰` (damping ratio 0.5) an explicit solver's steps grow like
    `√k` (Tsit5 at rtol 1e-6: 7,530 and 376,355); Rodas5P's stay those of the slow motion,
    within 1.5× of scipy's Radau (Radau IIA, order 5) with the exact Jacobian, and the
    solution within 10 rtol of `sin t`."""
    from scipy.integrate import solve_ivp

    steps = []
    for k in (1e6, 1e10):
        args = (jnp.asarray(k), jnp.asarray(np.sqrt(k)))
        count, error = _dragged_solve(args)
        radau = solve_ivp(
            lambda t, y, args=args: np.asarray(_dragged_spring(t, y, args)),
            (0.0, 10.0),
            [0.0, 1.0],
            method="Radau",
            rtol=1e-6,
            atol=1e-9,
            jac=lambda t, y, k=k: np.array([[0.0, 1.0], [-k, -np.sqrt(k)]]),
        )
        assert int(count) <= 1.5 * (len(radau.t) - 1), (k, int(count), len(radau.t) - 1)
        assert float(error) < 1e-5, (k, float(error))
        steps.append(int(count))
    assert steps[1] <= 1.3 * steps[0], steps


# --- through jaxdae.simulate ----------------------------------------------------------

PENDULUM = jaxdae.examples.CartesianPendulum()
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)
Q0, V0 = PENDULUM.state_from_angle(1.0, 0.0)


@jax.jit
def _simulate(length, q0, v0):
    system = jaxdae.examples.CartesianPendulum(length=length)
    return jaxdae.simulate(
        system,
        BAUMGARTE,
        0.0,
        1.0,
        q0,
        v0,
        solver=jaxdae.Rodas5P(),
        ts=jnp.linspace(0.0, 1.0, 5),
        rtol=1e-8,
        atol=1e-10,
    )


def test_simulate_matches_the_explicit_reference():
    sol = _simulate(PENDULUM.length, Q0, V0)
    reference = jaxdae.simulate(
        PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, ts=jnp.linspace(0.0, 1.0, 5), rtol=1e-12, atol=1e-14
    )
    assert sol.succeeded
    np.testing.assert_allclose(sol.q, reference.q, atol=1e-7)
    assert np.max(np.abs(np.asarray(sol.phi))) < 1e-7


def test_vmap_over_initial_states():
    angles = np.array([0.5, 1.0])
    # one program (eagerly, each operation compiles alone)
    q0s, v0s = jax.jit(jax.vmap(lambda a: PENDULUM.state_from_angle(a, 0.0)))(angles)
    batched = jax.vmap(_simulate, in_axes=(None, 0, 0))(PENDULUM.length, q0s, v0s)
    single = _simulate(PENDULUM.length, *(np.asarray(x)[0] for x in (q0s, v0s)))
    np.testing.assert_allclose(np.asarray(batched.q)[0], single.q, atol=1e-12)


@pytest.mark.slow
def test_grad_with_fixed_steps_equals_central_differences():
    """`jax.grad` through the steps (Jacobians and LU factorizations included) with the
    default adjoint, against central differences of the same fixed-step solve."""

    @jax.jit
    def final_x(length):
        system = jaxdae.examples.CartesianPendulum(length=length)
        return jaxdae.simulate(
            system,
            BAUMGARTE,
            0.0,
            0.5,
            Q0 * length,
            V0,
            dt0=0.05,
            solver=jaxdae.Rodas5P(),
            stepsize_controller=diffrax.ConstantStepSize(),
        ).q_final[0]

    length, eps = jnp.asarray(1.0), 1e-5
    grad = float(jax.jit(jax.grad(final_x))(length))
    central = float((final_x(length + eps) - final_x(length - eps)) / (2 * eps))
    assert abs(grad - central) < 1e-7 * max(1.0, abs(central)), (grad, central)


def test_float32_runs_without_nan():
    q0, v0 = np.asarray(Q0, np.float32), np.asarray(V0, np.float32)
    sol = jaxdae.simulate(
        PENDULUM,
        BAUMGARTE,
        0.0,
        1.0,
        q0,
        v0,
        solver=jaxdae.Rodas5P(),
        ts=np.linspace(0.0, 1.0, 5, dtype=np.float32),
        rtol=1e-4,
        atol=1e-6,
    )
    assert sol.q.dtype == jnp.float32 and sol.succeeded
    assert np.all(np.isfinite(np.asarray(sol.q)))
    reference = _simulate(PENDULUM.length, Q0, V0)
    np.testing.assert_allclose(sol.q, reference.q, atol=1e-3)


def test_reverse_sweep_adjoint_refuses_it():
    with pytest.raises(ValueError, match="explicit Runge–Kutta.*Rodas5P.*RecursiveCheckpoint"):
        jaxdae.simulate(
            PENDULUM,
            BAUMGARTE,
            0.0,
            0.1,
            Q0,
            V0,
            solver=jaxdae.Rodas5P(),
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )


def test_bad_jacobian_option():
    with pytest.raises(ValueError, match="coloured"):
        jaxdae.Rodas5P(jacobian="sparse")
