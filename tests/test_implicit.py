"""Implicit integration: diffrax's implicit solvers configured by `configure_implicit`, and
the generalized-α method for the index-3 equations (`GeneralizedAlpha`)."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest

import jaxdae
from jaxdae._integration._generalized_alpha import chung_hulbert
from jaxdae._integration._implicit import configure_for_controller
from jaxdae._integration._term import SystemTerm

from ._systems import TwicePendulum

PENDULUM = jaxdae.examples.CartesianPendulum()
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)
Q0, V0 = PENDULUM.state_from_angle(1.0, 0.0)
T1 = 1.0


def _reference(system=PENDULUM, t1=T1, q0=Q0, v0=V0, ts=None):
    return jaxdae.simulate(system, BAUMGARTE, 0.0, t1, q0, v0, ts=ts, rtol=1e-12, atol=1e-14)


REFERENCE = None


def reference():
    global REFERENCE
    if REFERENCE is None:
        REFERENCE = _reference()
    return REFERENCE


# --- configure_implicit ---------------------------------------------------------------


def test_configure_leaves_explicit_solvers_and_other_root_finders():
    tsit5 = diffrax.Tsit5()
    assert jaxdae.configure_implicit(tsit5, 1e-6, 1e-9) is tsit5
    newton = diffrax.Kvaerno5(root_finder=optx.Newton(rtol=1e-5, atol=1e-7))
    assert jaxdae.configure_implicit(newton, 1e-6, 1e-9) is newton
    assert (
        configure_for_controller(diffrax.Kvaerno5(), diffrax.ConstantStepSize()).root_finder
        is diffrax.Kvaerno5().root_finder
    )


def test_configure_replaces_very_chord():
    solver = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-6, 1e-9)
    finder = solver.root_finder
    assert isinstance(finder, jaxdae.FusedChord)
    assert (finder.rtol, finder.atol, finder.norm) == (1e-6, 1e-9, optx.rms_norm)
    own = diffrax.Kvaerno3(root_finder=diffrax.VeryChord(rtol=1e-3, atol=1e-4, kappa=0.1))
    finder = jaxdae.configure_implicit(own, 1e-6, 1e-9).root_finder
    assert isinstance(finder, jaxdae.FusedChord)
    assert (finder.rtol, finder.atol, finder.kappa) == (1e-3, 1e-4, 0.1)
    # a linear solver of its own stays: the lineax iteration with jaxdae's stopping test
    svd = diffrax.Kvaerno5(
        root_finder=diffrax.with_stepsize_controller_tols(diffrax.VeryChord)(linear_solver=lx.SVD())
    )
    finder = jaxdae.configure_implicit(svd, 1e-6, 1e-9).root_finder
    assert isinstance(finder, jaxdae.ToleranceChord)
    assert isinstance(finder.linear_solver, lx.SVD)
    controller = diffrax.ClipStepSizeController(diffrax.PIDController(rtol=1e-5, atol=1e-7))
    finder = configure_for_controller(diffrax.Kvaerno5(), controller).root_finder
    assert (finder.rtol, finder.atol) == (1e-5, 1e-7)


def test_configure_for_simulates_controller():
    """The hook for `simulate`: the controller `step_options` builds from `rtol`, `atol`
    gives the root finder its tolerances and norm."""
    from jaxdae._integration._problem import step_options

    controller, _ = step_options(None, None, 1e-6, 1e-9, jnp.float64, (0.0, 1.0))
    finder = configure_for_controller(diffrax.Kvaerno5(), controller).root_finder
    assert isinstance(finder, jaxdae.FusedChord)
    assert (float(finder.rtol), float(finder.atol)) == (1e-6, 1e-9)
    assert finder.norm is controller.norm
    assert configure_for_controller(None, controller) is None  # simulate's default solver


@pytest.mark.slow
def test_configured_kvaerno_takes_the_steps_of_an_explicit_solver():
    """On a non-stiff problem a `Kvaerno5` handed to `simulate` (which configures its root
    finder) takes no more than twice Tsit5's steps; diffrax's `VeryChord` rejected
    converged iterations and took several times more."""

    def steps(solver):
        sol = jaxdae.simulate(
            PENDULUM, BAUMGARTE, 0.0, 2.0, Q0, V0, solver=solver, rtol=1e-6, atol=1e-8
        )
        return int(sol.stats["num_steps"]), sol.q_final

    explicit, q_explicit = steps(diffrax.Tsit5())
    implicit, q_implicit = steps(diffrax.Kvaerno5())
    assert implicit <= 2 * explicit
    np.testing.assert_allclose(q_implicit, q_explicit, atol=1e-5)


# --- GeneralizedAlpha -------------------------------------------------------------------


def test_chung_hulbert_parameters():
    alpha_m, alpha_f, gamma, beta = chung_hulbert(1.0)
    assert (alpha_m, alpha_f, gamma, beta) == (0.5, 0.5, 0.5, 0.25)
    alpha_m, alpha_f, gamma, beta = chung_hulbert(0.0)
    assert (alpha_m, alpha_f, gamma, beta) == (-1.0, 0.0, 1.5, 1.0)


def _fixed(dt, rho_inf=0.8, t1=T1, system=PENDULUM, q0=Q0, v0=V0):
    solver = jaxdae.GeneralizedAlpha(rho_inf, root_finder=optx.Newton(rtol=1e-13, atol=1e-13))
    return jaxdae.simulate(
        system,
        BAUMGARTE,
        0.0,
        t1,
        q0,
        v0,
        solver=solver,
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=dt,
        max_steps=10_000,
    )


@pytest.mark.slow
def test_generalized_alpha_converges_with_order_two():
    dts = np.array([0.02, 0.01, 0.005])
    ref = reference()
    errors = [float(jnp.max(jnp.abs(_fixed(dt).q_final - ref.q_final))) for dt in dts]
    slope = np.polyfit(np.log(dts), np.log(errors), 1)[0]
    assert 1.8 < slope < 2.3, (errors, slope)


@pytest.mark.slow
def test_generalized_alpha_adaptive_meets_constraints_and_reference():
    ts = jnp.linspace(0.0, T1, 11)
    atol = 1e-10
    solver = jaxdae.GeneralizedAlpha()
    sol = jaxdae.simulate(
        PENDULUM, jaxdae.Unstabilized(), 0.0, T1, Q0, V0, ts=ts, solver=solver, rtol=1e-8, atol=atol
    )
    assert sol.succeeded
    # Φ = 0 to the Newton tolerance at the end of every step (between steps, `ts` are
    # interpolated)
    steps = diffrax.diffeqsolve(
        SystemTerm(PENDULUM, jaxdae.Unstabilized()),
        solver,
        0.0,
        T1,
        None,
        (Q0, V0),
        saveat=diffrax.SaveAt(steps=True),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=atol, norm=optx.rms_norm),
        max_steps=50_000,
    )
    q_steps = steps.ys[0][jnp.isfinite(steps.ts)]
    assert q_steps.shape[0] > 10
    phi = jax.vmap(lambda q: PENDULUM.constraints(0.0, q))(q_steps)
    assert float(jnp.max(jnp.abs(phi))) <= atol
    ref = _reference(ts=ts)
    assert float(jnp.max(jnp.abs(sol.q - ref.q))) < 2e-5
    assert float(jnp.max(jnp.abs(sol.v - ref.v))) < 1e-4
    # the saved multipliers (Unstabilized's, at the saved states) are the exact ones
    np.testing.assert_allclose(sol.multipliers, ref.multipliers, rtol=1e-3)


def test_generalized_alpha_init_eagerly_and_traced():
    """The start's consistent accelerations and multipliers, called outside `jit` and
    under it: the same, and those of the index-1 equations (`Unstabilized`)."""
    solver, term = jaxdae.GeneralizedAlpha(), SystemTerm(PENDULUM, BAUMGARTE)
    eager = solver.init(term, 0.0, T1, (Q0, V0), None)
    traced = jax.jit(lambda q, v: solver.init(term, 0.0, T1, (q, v), None))(Q0, V0)
    expected, multipliers = jaxdae.Unstabilized().accelerations(PENDULUM.terms(0.0, Q0, V0))
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(traced), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(eager[1], expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(eager[2], multipliers, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_generalized_alpha_redundant_constraints_with_a_least_squares_newton_solve():
    """The pendulum with its constraint written twice: the start's least-squares
    multipliers are finite, and with an SVD in the Newton iteration the motion is the
    pendulum's own; the default LU solve stops, named `singular_newton_matrix` (eagerly;
    `dt_min_reached` when traced), and raises with the fix in its message."""
    twice = TwicePendulum()
    svd = diffrax.with_stepsize_controller_tols(optx.Chord)(linear_solver=lx.SVD())

    def solve(system, solver):
        return jaxdae.simulate(
            system,
            jaxdae.PseudoInverse(10.0, 25.0),
            0.0,
            0.5,
            Q0,
            V0,
            solver=solver,
            rtol=1e-6,
            atol=1e-9,
            throw=False,
        )

    redundant = solve(twice, solver=jaxdae.GeneralizedAlpha(root_finder=svd))
    single = solve(PENDULUM, solver=jaxdae.GeneralizedAlpha())
    assert redundant.succeeded
    np.testing.assert_allclose(redundant.q_final, single.q_final, atol=1e-10)
    default = solve(twice, solver=jaxdae.GeneralizedAlpha())
    assert default.result == jaxdae.RESULTS.singular_newton_matrix
    traced = eqx.filter_jit(solve)(twice, jaxdae.GeneralizedAlpha())
    assert traced.result == jaxdae.RESULTS.dt_min_reached
    with pytest.raises(jaxdae.SimulationError, match="linear_solver=lineax.SVD()"):
        jaxdae.simulate(
            twice,
            jaxdae.PseudoInverse(10.0, 25.0),
            0.0,
            0.5,
            Q0,
            V0,
            solver=jaxdae.GeneralizedAlpha(),
            rtol=1e-6,
            atol=1e-9,
        )


@pytest.mark.slow
def test_generalized_alpha_gradient_matches_central_differences():
    def loss(gravity):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        return _fixed(0.02, t1=0.5, system=system).q_final[0]

    g = jnp.asarray(9.81)
    grad = jax.grad(loss)(g)
    eps = 1e-5
    central = (loss(g + eps) - loss(g - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, central, rtol=1e-6)


@pytest.mark.slow  # ~45 s on a busy 2-core machine
def test_generalized_alpha_adaptive_gradient():
    def loss(gravity):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        return jaxdae.simulate(
            system,
            BAUMGARTE,
            0.0,
            0.5,
            Q0,
            V0,
            rtol=1e-9,
            atol=1e-11,
            solver=jaxdae.GeneralizedAlpha(),
        ).q_final[0]

    g = jnp.asarray(9.81)
    grad = jax.grad(loss)(g)
    eps = 1e-4
    central = (loss(g + eps) - loss(g - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, central, rtol=1e-4)


@pytest.mark.slow
def test_generalized_alpha_vmap():
    angles = jnp.array([0.5, 1.0, 1.5])
    q0s, v0s = jax.vmap(PENDULUM.state_from_angle, in_axes=(0, None))(angles, 0.0)
    solver = jaxdae.GeneralizedAlpha()

    def solve(q0, v0):
        return jaxdae.simulate(
            PENDULUM, BAUMGARTE, 0.0, 0.5, q0, v0, solver=solver, rtol=1e-7, atol=1e-9
        ).q_final

    batched = jax.vmap(solve)(q0s, v0s)
    for i in range(3):  # the same steps; batched arithmetic rounds differently
        np.testing.assert_allclose(batched[i], solve(q0s[i], v0s[i]), atol=1e-8)


@pytest.mark.slow
def test_generalized_alpha_nonholonomic():
    """The knife edge (one nonholonomic constraint) follows its closed-form motion, with
    Ψ = 0 to the Newton tolerance."""
    system = jaxdae.examples.KnifeEdge()
    q0, v0 = jnp.zeros(3), jnp.array([0.0, 0.0, 2.0])
    atol = 1e-10
    sol = jaxdae.simulate(
        system,
        jaxdae.Unstabilized(),
        0.0,
        1.0,
        q0,
        v0,
        solver=jaxdae.GeneralizedAlpha(),
        rtol=1e-8,
        atol=atol,
    )
    assert float(jnp.max(jnp.abs(sol.psi))) < 10 * atol
    q1, _ = system.closed_form(jnp.asarray(1.0), 2.0)
    np.testing.assert_allclose(sol.q_final, q1, atol=1e-4)


@pytest.mark.slow
def test_generalized_alpha_newton_kernel_against_optimistix():
    """The fused modified Newton iteration of a step finds the root that optimistix's
    Newton method finds for the same equations, and keeps its matrix: four steps of one
    size build it once."""
    from jaxdae._integration._generalized_alpha import _residual, _split, _Step

    h, term = 0.01, SystemTerm(PENDULUM, jaxdae.Unstabilized())
    solver = eqx.tree_at(
        lambda s: (s.root_finder.rtol, s.root_finder.atol, s.root_finder.norm),
        jaxdae.GeneralizedAlpha(),
        (1e-8, 1e-10, optx.rms_norm),
    )

    @jax.jit
    def run(y):
        def one(carry, t):
            y, state = carry
            y1, _, _, state1, _ = solver.step(term, t, t + h, y, None, state, False)
            return (y1, state1), (y, state)

        state = solver.init(term, jnp.asarray(0.0), jnp.asarray(h), y, None)
        return jax.lax.scan(one, (y, state), h * jnp.arange(4.0))

    ((q4, _), last), ((q, v), states) = run((jnp.asarray(Q0), jnp.asarray(V0)))
    assert int(last[3].builds) == 1
    # the fourth step again, its equations solved by optimistix from the same guess
    alpha_m, alpha_f, gamma, beta = chung_hulbert(0.8)
    a0, qdd0, lam0 = states[0][3], states[1][3], states[2][3]
    hb = h**2 * beta
    q_hat = q[3] + h * v[3] + h**2 * (0.5 - beta) * a0
    step = _Step(
        h=jnp.asarray(h),
        c=hb * (1 - alpha_f) / (1 - alpha_m),
        hb=hb,
        q_hat=q_hat,
        q_tilde=q_hat + hb / (1 - alpha_m) * (alpha_f * qdd0 - alpha_m * a0),
        v_hat=v[3] + h * (1 - gamma) * a0,
        gamma=gamma,
        beta=beta,
    )
    guess = jnp.concatenate([step.q_tilde + step.c * qdd0, step.c * lam0])
    root = optx.root_find(
        lambda x, a: _residual(x, a)[0],
        optx.Newton(rtol=1e-14, atol=1e-14),
        guess,
        (PENDULUM, jnp.asarray(4 * h), step),
    ).value
    np.testing.assert_allclose(q4, _split(root, step)[0], atol=1e-12)


def test_generalized_alpha_error_estimate_is_per_unit_step():
    """The error estimate is the positions' local error divided by the step: halving the
    step divides it by about 4 (`O(h²)`, `error_order` 2)."""
    solver = jaxdae.GeneralizedAlpha()
    term = SystemTerm(PENDULUM, jaxdae.Unstabilized())
    solver = eqx.tree_at(
        lambda s: (s.root_finder.rtol, s.root_finder.atol, s.root_finder.norm),
        solver,
        (1e-10, 1e-12, optx.rms_norm),
    )
    y = tuple(jnp.asarray(x) for x in PENDULUM.state_from_angle(1.0, 1.0))  # swinging: q⃛ ≠ 0

    @jax.jit
    def estimate(h):
        state = solver.init(term, jnp.asarray(0.0), h, y, None)
        _, error, _, _, _ = solver.step(term, jnp.asarray(0.0), h, y, None, state, False)
        return jnp.max(jnp.abs(error[0]))

    ratio = float(estimate(jnp.asarray(2e-3)) / estimate(jnp.asarray(1e-3)))
    assert 3.0 < ratio < 5.0, ratio
    assert solver.error_order(None) == 2


def test_generalized_alpha_refuses_what_it_cannot_integrate():
    with pytest.raises(ValueError, match="rho_inf"):
        jaxdae.GeneralizedAlpha(1.5)
    with pytest.raises(ValueError, match="rho_inf"):
        jaxdae.GeneralizedAlpha(jnp.array([0.5, 0.6]))
    # NumPy and JAX scalars are numbers too.
    assert jaxdae.GeneralizedAlpha(np.float32(0.5)).rho_inf == 0.5
    assert jaxdae.GeneralizedAlpha(jnp.array(0.25)).rho_inf == 0.25
    with pytest.raises(ValueError, match="jax.vmap"):
        jaxdae.simulate_ensemble(
            PENDULUM, BAUMGARTE, 0.0, 0.1, Q0[None], V0[None], solver=jaxdae.GeneralizedAlpha()
        )
    arm = jaxdae.examples.CartesianArm()
    with pytest.raises(ValueError, match="momenta"):
        q0 = jnp.array([1.0, 0.0, 1.0, 1.0])
        jaxdae.simulate(
            arm, BAUMGARTE, 0.0, 0.1, q0, jnp.zeros(4), solver=jaxdae.GeneralizedAlpha()
        )
    # It declares the term of a system as its `term_structure`: diffrax refuses others.
    with pytest.raises(ValueError, match="AbstractSystemTerm"):
        diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: y),
            jaxdae.GeneralizedAlpha(),
            0.0,
            1.0,
            0.1,
            (Q0, V0),
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
        )


# --- FusedChord -------------------------------------------------------------------------


def _stiff_vdp(t, y, args):
    """Van der Pol with `μ = 100` (stiff), a non-autonomous forcing, and a third, linear
    component coupled to the first (a Jacobian that is not dense)."""
    return jnp.stack(
        [y[1], 100.0 * ((1 - y[0] ** 2) * y[1] - y[0]) + jnp.sin(t), -50.0 * (y[2] - y[0])]
    )


def _kvaerno(root_finder, y0):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_stiff_vdp),
        diffrax.Kvaerno5(root_finder=root_finder),
        0.0,
        1.0,
        0.5,
        y0,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-9),
        saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 11)),
        max_steps=4096,
    )
    return sol.ys, sol.stats["num_accepted_steps"], sol.stats["num_rejected_steps"]


@pytest.mark.slow
def test_fused_chord_iterates_as_the_lineax_chord():
    """Kvaerno5 with `FusedChord` takes the steps of the same iteration through lineax
    (`ToleranceChord`), rejections included (the first steps, of 0.5 and 0.1 s, do not
    converge: the iterates overflow, and the step is rejected and shrunk), and ends
    within the tolerance of diffrax's own `VeryChord` solve."""
    y0 = jnp.array([1.5, 0.5, 0.0])
    fused = jax.jit(lambda y0: _kvaerno(jaxdae.FusedChord(1e-6, 1e-9), y0))(y0)
    lineax = _kvaerno(jaxdae.ToleranceChord(1e-6, 1e-9), y0)
    assert int(fused[2]) > 0
    assert (int(fused[1]), int(fused[2])) == (int(lineax[1]), int(lineax[2]))
    np.testing.assert_allclose(fused[0], lineax[0], rtol=1e-9, atol=1e-12)
    very = _kvaerno(diffrax.with_stepsize_controller_tols(diffrax.VeryChord)(), y0)
    np.testing.assert_allclose(fused[0], very[0], rtol=1e-4, atol=1e-6)


def test_fused_chord_as_an_optimistix_root_finder():
    """Outside diffrax's step: the root of a small nonlinear system, as optimistix's
    Newton finds it, with a dense and a coloured Jacobian (the system's block
    structure); a wrong `jacobian` is refused."""

    def fn(y, args):
        a, b = y
        return (
            a**3 + a - args,
            jnp.stack([b[0] + 0.1 * jnp.sin(b[1]) - 1.0, b[1] - 0.2 * b[0] ** 2]),
        )

    y0 = (jnp.array(0.9), jnp.array([0.9, 0.1]))
    newton = optx.root_find(fn, optx.Newton(rtol=1e-12, atol=1e-12), y0, 2.0).value
    for jacobian in ("dense", "coloured"):
        chord = optx.root_find(
            fn,
            jaxdae.FusedChord(1e-12, 1e-12, jacobian=jacobian, kappa=1e-3),
            y0,
            2.0,
            max_steps=64,
        )
        assert chord.result == optx.RESULTS.successful
        for x, ref in zip(jax.tree.leaves(chord.value), jax.tree.leaves(newton), strict=True):
            np.testing.assert_allclose(x, ref, rtol=1e-10)
    with pytest.raises(ValueError, match="coloured"):
        jaxdae.FusedChord(1e-6, 1e-9, jacobian="sparse")


@pytest.mark.slow
def test_fused_chord_vmap_and_gradient():
    """Under `jax.vmap` each trajectory is its own solve; the gradient through `simulate`
    (default adjoint, each stage's root differentiated implicitly) equals central
    differences with fixed steps."""
    y0s = jnp.array([[2.0, 0.0, 1.0], [1.5, 0.5, 0.0]])
    batched = jax.vmap(lambda y0: _kvaerno(jaxdae.FusedChord(1e-6, 1e-9), y0)[0])(y0s)
    for i in range(2):
        np.testing.assert_allclose(
            batched[i], _kvaerno(jaxdae.FusedChord(1e-6, 1e-9), y0s[i])[0], rtol=1e-10, atol=1e-12
        )

    def loss(gravity):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        solver = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-10, 1e-12)
        return jaxdae.simulate(
            system,
            BAUMGARTE,
            0.0,
            0.5,
            Q0,
            V0,
            solver=solver,
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=0.01,
        ).q_final[0]

    g = jnp.asarray(9.81)
    grad = jax.grad(loss)(g)
    eps = 1e-5
    np.testing.assert_allclose(grad, (loss(g + eps) - loss(g - eps)) / (2 * eps), rtol=1e-6)


@pytest.mark.parametrize("chord", [jaxdae.FusedChord, jaxdae.ToleranceChord])
def test_chord_options_are_checked(chord):
    """Tolerances by the step-size controller's rule; `kappa` a fraction in (0, 1]."""
    for kappa in (-1.0, 0.0, 1e8, np.nan):
        with pytest.raises(ValueError, match="kappa"):
            chord(rtol=1e-6, atol=1e-9, kappa=kappa)
    with pytest.raises(ValueError, match="rtol"):
        chord(rtol=np.nan, atol=1e-9)
    with pytest.raises(ValueError, match="rtol"):
        jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol=np.nan, atol=1e-9)
    assert chord(rtol=1e-6, atol=1e-9, kappa=1.0).kappa == 1.0
