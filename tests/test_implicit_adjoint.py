"""Gradients of `Rodas5P` and diffrax's implicit Runge–Kutta solves by the derivative of
their replayed steps (`ReplayAdjoint`, those solvers' default adjoint): the gradient of
diffrax's loop with one checkpoint per step, whatever the number of steps kept at once."""

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import jaxdae
from jaxdae import _thresholds
from jaxdae._integration._adjoint import default_adjoint, resolve_adjoint
from jaxdae._integration._autodiff_step import autodiff_step_vjp
from jaxdae._integration._rosenbrock_adjoint import rodas_step_vjp

from ._systems import stiff_arm

MAX_STEPS = 400
EVERY_STEP = diffrax.RecursiveCheckpointAdjoint(checkpoints=MAX_STEPS)
TS = jnp.linspace(0.0, 1.0, 6)


def _relative(a, b):
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (a, b))
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def _van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0] + jnp.sin(t)])


def _loss(diff, solver, adjoint, controller=None, dt0=None):
    """A loss of the states saved at `TS` (inside the steps) and at the end of a forced
    Van der Pol solve, differentiated with respect to `mu` and `y0`."""
    mu, y0 = diff
    controller = controller or diffrax.PIDController(rtol=1e-6, atol=1e-8)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_van_der_pol),
        solver,
        0.0,
        1.0,
        dt0,
        y0,
        args=mu,
        saveat=diffrax.SaveAt(ts=TS, t1=True),
        stepsize_controller=controller,
        max_steps=MAX_STEPS,
        adjoint=adjoint,
    )
    return jnp.sum(sol.ys[0] ** 2) + jnp.sum(jnp.sin(sol.ys[1]))


_grad = eqx.filter_jit(jax.grad(_loss))
DIFF = (jnp.asarray(5.0), jnp.array([2.0, 0.0]))


def test_default_for_rosenbrock_and_implicit_solvers():
    kvaerno = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-6, 1e-9)
    for solver in (jaxdae.Rodas5P(), kvaerno, diffrax.Kvaerno3()):
        assert isinstance(default_adjoint(solver, 100), jaxdae.ReplayAdjoint)
        assert isinstance(default_adjoint(solver, None), diffrax.RecursiveCheckpointAdjoint)


@pytest.mark.slow
def test_rodas_gradient_is_that_of_a_checkpoint_per_step(monkeypatch):
    """Adaptive steps, saves inside the steps (the dense output) and at the end: the
    gradient with respect to a parameter and the initial state, each step differentiated
    by its discrete adjoint (`ROSENBROCK_ADJOINT_MIN` lowered to this system's two
    states), equals diffrax's loop differentiated with one checkpoint per step, in one
    segment and in segments of 3 steps."""
    monkeypatch.setattr(_thresholds, "ROSENBROCK_ADJOINT_MIN", 2)
    grads = [
        _grad(DIFF, jaxdae.Rodas5P(), adjoint)
        for adjoint in (EVERY_STEP, jaxdae.ReplayAdjoint(), jaxdae.ReplayAdjoint(stored_steps=3))
    ]
    assert _relative(grads[1], grads[0]) < 1e-12
    assert _relative(grads[2], grads[1]) < 1e-13


@pytest.mark.slow
def test_kvaerno_gradient_is_that_of_a_checkpoint_per_step():
    """As for Rodas5P, with the configured Kvaerno5 and Kvaerno3 (a root found in each
    stage, differentiated by the implicit-function rule in both adjoints)."""
    for solver in (diffrax.Kvaerno5(), diffrax.Kvaerno3()):
        solver = jaxdae.configure_implicit(solver, 1e-6, 1e-8)
        grads = [
            _grad(DIFF, solver, adjoint)
            for adjoint in (
                EVERY_STEP,
                jaxdae.ReplayAdjoint(),
                jaxdae.ReplayAdjoint(stored_steps=3),
            )
        ]
        assert _relative(grads[1], grads[0]) < 1e-11
        assert _relative(grads[2], grads[1]) < 1e-13


@pytest.mark.slow
def test_fixed_step_gradients_against_central_differences(monkeypatch):
    """Constant steps: the gradient is that of the discrete map, which central
    differences of the solve approximate to their truncation error (Rodas5P's steps by
    their discrete adjoint)."""
    monkeypatch.setattr(_thresholds, "ROSENBROCK_ADJOINT_MIN", 2)
    kvaerno = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-12, 1e-12)
    eps = 1e-6
    for solver in (jaxdae.Rodas5P(), kvaerno):

        def loss(diff, solver=solver):
            return _loss(
                diff, solver, jaxdae.ReplayAdjoint(stored_steps=7), diffrax.ConstantStepSize(), 0.02
            )

        mu, y0 = DIFF
        grad_mu, grad_y0 = jax.jit(jax.grad(loss))(DIFF)
        central = [(loss((mu + eps, y0)) - loss((mu - eps, y0))) / (2 * eps)]
        central += [
            (loss((mu, y0.at[i].add(eps))) - loss((mu, y0.at[i].add(-eps)))) / (2 * eps)
            for i in range(2)
        ]
        np.testing.assert_allclose([grad_mu, *grad_y0], central, rtol=1e-6)


@pytest.mark.slow
def test_simulate_gradient_is_that_of_a_checkpoint_per_step():
    """Rodas5P through `simulate` on the stiff arm, the stiff integration guide's gradient
    (1 s, `rtol = 10⁻⁸`, about 2,200 adaptive steps): the default adjoint's gradient (here
    in segments of 1,000 steps) equals the one-checkpoint-per-step gradient of diffrax's
    loop. (With 32 checkpoints diffrax's recomputed steps can differ from the forward
    solve's where XLA optimizes the two programs differently; the guide's study shows
    1.3 × 10⁻⁶ on this case. At LLVM's optimization level 0, as in the default test run,
    the recomputation rounds as the forward solve and the two agree.)"""
    system, formulation, q0, v0 = stiff_arm()
    steps = 4000

    def loss(mass, adjoint):
        model = eqx.tree_at(lambda s: s.masses, system, jnp.stack([mass, system.masses[1]]))
        return jaxdae.simulate(
            model,
            formulation,
            0.0,
            1.0,
            q0,
            v0,
            solver=jaxdae.Rodas5P(),
            rtol=1e-8,
            atol=1e-11,
            max_steps=steps,
            adjoint=adjoint,
        ).q_final[0]

    mass = jnp.asarray(1.0)
    every, segments = (
        float(jax.jit(jax.grad(loss), static_argnums=1)(mass, a))
        for a in (
            diffrax.RecursiveCheckpointAdjoint(checkpoints=steps),
            jaxdae.ReplayAdjoint(stored_steps=1000),
        )
    )
    assert isinstance(default_adjoint(jaxdae.Rodas5P(), steps), jaxdae.ReplayAdjoint)
    assert abs(segments - every) <= 1e-10 * abs(every)


@pytest.mark.slow
def test_under_vmap_and_what_is_not_replayed():
    """A batch of gradients under `vmap` equals the gradients one by one; saving every
    step is not replayed: that solve is differentiated through diffrax's loop."""
    adjoint = jaxdae.ReplayAdjoint(stored_steps=5)
    y0s = jnp.array([[2.0, 0.0], [1.0, 0.5]])
    batched = jax.vmap(lambda y0: _grad((DIFF[0], y0), jaxdae.Rodas5P(), adjoint))(y0s)
    for i, y0 in enumerate(y0s):
        one = _grad((DIFF[0], y0), jaxdae.Rodas5P(), adjoint)
        assert _relative(jax.tree.map(lambda x, i=i: x[i], batched), one) < 1e-12

    def steps_loss(mu, adjoint):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_van_der_pol),
            jaxdae.Rodas5P(),
            0.0,
            0.5,
            0.05,
            DIFF[1],
            args=mu,
            saveat=diffrax.SaveAt(steps=True),
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=16,
            adjoint=adjoint,
        )
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0))

    ours, diffrax_loop = (
        jax.jit(jax.grad(steps_loss), static_argnums=1)(DIFF[0], a)
        for a in (adjoint, diffrax.RecursiveCheckpointAdjoint())
    )
    assert abs(float(diffrax_loop)) > 1e-3
    np.testing.assert_allclose(ours, diffrax_loop, rtol=1e-12)


def _forced_oscillators(t, y, args):
    """A Van der Pol oscillator, stiff at `μ = 50`, forced at a frequency in `args`,
    with the state as a dictionary (a pytree the step flattens)."""
    mu, omega = args
    return {"x": y["v"], "v": mu * (1 - y["x"] ** 2) * y["v"] - y["x"] + jnp.sin(omega * t)}


@pytest.mark.parametrize(
    "factors",
    [
        "inverse",
        pytest.param("unrolled LU", marks=pytest.mark.slow),
        pytest.param("LAPACK LU", marks=pytest.mark.slow),
    ],
)
def test_rodas_step_adjoint_is_the_step_derivative(factors, monkeypatch):
    """One Rodas5P step's discrete adjoint (the step's own factorization transposed, one
    vector–Jacobian product of `f` per stage, the Jacobian's derivative by directional
    derivatives) equals `eqx.filter_vjp` of `Rodas5P.step` to rounding: the cotangents of
    the start state and of both parameters (one of them in the time-dependent forcing,
    through `∂f/∂t`), from random cotangents of the end state and of the dense output,
    with each of the factorizations that the step solves with."""
    if factors != "inverse":
        monkeypatch.setattr(_thresholds, "INVERSE_MAX", 0)
        monkeypatch.setattr(_thresholds, "LOOPED_INVERSE_MAX", 0)
    if factors == "LAPACK LU":
        monkeypatch.setattr(_thresholds, "LU_UNROLL_MAX", 0)
    solver = jaxdae.Rodas5P()
    diff, static = eqx.partition(
        (diffrax.ODETerm(_forced_oscillators), (jnp.asarray(50.0), jnp.asarray(3.0))),
        eqx.is_inexact_array,
    )
    y0 = {"x": jnp.array([2.0]), "v": jnp.array([-0.3])}

    @jax.jit
    def pulled(bars):
        return [
            fn(solver, jnp.asarray(0.3), jnp.asarray(0.35), (y0, None), diff, static)[1](bars)
            for fn in (autodiff_step_vjp, rodas_step_vjp)
        ]

    outputs = jax.eval_shape(
        lambda: autodiff_step_vjp(
            solver, jnp.asarray(0.3), jnp.asarray(0.35), (y0, None), diff, static
        )[0]
    )
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    bars = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), outputs)
    reference, ours = pulled(bars)
    assert jax.tree.structure(ours) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference), strict=True):
        assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(b))


@pytest.mark.slow
def test_rodas_gradient_backwards_in_time(monkeypatch):
    """A solve from `t0 > t1` (terms wrapped with the direction of time, which the step's
    discrete adjoint differentiates through): the replayed gradient equals diffrax's loop
    with a checkpoint per step."""
    monkeypatch.setattr(_thresholds, "ROSENBROCK_ADJOINT_MIN", 2)

    def loss(diff, adjoint):
        mu, y0 = diff
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_van_der_pol),
            jaxdae.Rodas5P(),
            1.0,
            0.0,
            -0.05,
            y0,
            args=mu,
            saveat=diffrax.SaveAt(ts=TS[::-1]),
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
            max_steps=MAX_STEPS,
            adjoint=adjoint,
        )
        return jnp.sum(sol.ys**2)

    every, replayed = (
        jax.jit(jax.grad(loss), static_argnums=1)(DIFF, a)
        for a in (EVERY_STEP, jaxdae.ReplayAdjoint())
    )
    assert _relative(replayed, every) < 1e-12


def test_rodas_runs_backwards_in_time():
    """diffrax hands a solve from `t0 > t1` its terms wrapped with the direction of time in
    their control, not in their vector field (the terms the adjoint sees): Rodas5P
    integrates `y' = −y` from `y(1) = 1` back to `y(0) = e`."""
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: -y),
        jaxdae.Rodas5P(),
        1.0,
        0.0,
        -0.1,
        jnp.array([1.0]),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
    )
    np.testing.assert_allclose(sol.ys[-1], [np.e], rtol=1e-6)


def test_an_adaptive_solve_it_cannot_replay_warns():
    """Saving every step of an adaptive solve is not replayed: tracing its gradient warns
    that it goes through diffrax's checkpointed loop, naming the fix; fixed steps do not."""

    def loss(mu, controller):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_van_der_pol),
            jaxdae.Rodas5P(),
            0.0,
            0.5,
            0.05,
            DIFF[1],
            args=mu,
            saveat=diffrax.SaveAt(steps=True),
            stepsize_controller=controller,
            max_steps=16,
            adjoint=jaxdae.ReplayAdjoint(),
        )
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0))

    with pytest.warns(UserWarning, match="ReplayAdjoint` does not replay.*max_steps"):
        jax.make_jaxpr(jax.grad(loss), static_argnums=1)(
            DIFF[0], diffrax.PIDController(rtol=1e-4, atol=1e-6)
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        jax.make_jaxpr(jax.grad(loss), static_argnums=1)(DIFF[0], diffrax.ConstantStepSize())


def _event_loss(diff, adjoint, saveat):
    """A loss of the time and state at which a forced Van der Pol solve first brings its
    position down to 0.5 (an event located by a root finder), and of the states saved
    before it."""
    mu, y0 = diff
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_van_der_pol),
        diffrax.Tsit5(),
        0.0,
        3.0,
        None,
        y0,
        args=mu,
        saveat=saveat,
        stepsize_controller=diffrax.PIDController(rtol=1e-9, atol=1e-11),
        event=diffrax.Event(
            lambda t, y, args, **kwargs: y[0] - 0.5, optx.Newton(rtol=1e-12, atol=1e-12)
        ),
        max_steps=MAX_STEPS,
        adjoint=adjoint,
    )
    # The event's row is the last finite one (diffrax drops the saves after it).
    last = jnp.sum(jnp.isfinite(sol.ts)) - 1
    before = jnp.where(jnp.arange(sol.ts.shape[0]) < last, sol.ys[:, 0], 0.0)
    return 3.0 * sol.ts[last] + jnp.sum(jnp.sin(sol.ys[last])) + jnp.sum(before**2)


@pytest.mark.parametrize(
    "saveat",
    [
        pytest.param(diffrax.SaveAt(t1=True), marks=pytest.mark.slow),
        diffrax.SaveAt(t0=True, ts=jnp.linspace(0.1, 2.9, 8), t1=True),
    ],
    ids=["t1", "t0-ts-t1"],
)
def test_an_event_located_by_a_root_finder_is_replayed(saveat):
    """A solve stopped by an event that a root finder locates: the gradient of the event's
    time, of the state there and of the states saved before it, replayed in several
    segments of steps, is that of a checkpoint per step, and matches central
    differences."""
    diff = (jnp.asarray(0.8), jnp.array([2.0, 0.0]))
    reference = _event_grad(diff, EVERY_STEP, saveat)
    assert abs(float(reference[0])) > 0.1
    replayed = _event_grad(diff, jaxdae.ReplayAdjoint(stored_steps=3), saveat)
    assert _relative(replayed, reference) < 1e-9
    h = 1e-6
    central = (
        _event_loss((diff[0] + h, diff[1]), EVERY_STEP, saveat)
        - _event_loss((diff[0] - h, diff[1]), EVERY_STEP, saveat)
    ) / (2 * h)
    np.testing.assert_allclose(reference[0], central, rtol=1e-5)


_event_grad = eqx.filter_jit(jax.grad(_event_loss))


@pytest.mark.slow
def test_an_event_located_by_a_root_finder_is_replayed_under_vmap():
    """The same gradients (in one segment of steps) for a batch of `μ`, under `vmap`, are
    those of each member."""
    saveat = diffrax.SaveAt(t0=True, ts=jnp.linspace(0.1, 2.9, 8), t1=True)
    y0, mus = jnp.array([2.0, 0.0]), jnp.array([0.8, 1.1, 0.6])
    batched = jax.vmap(lambda mu: _event_grad((mu, y0), jaxdae.ReplayAdjoint(), saveat))(mus)
    for i, mu in enumerate(mus):
        one = _event_grad((mu, y0), EVERY_STEP, saveat)
        assert _relative(jax.tree.map(lambda x, i=i: x[i], batched), one) < 1e-9


def test_default_for_event_driven_solves():
    """An event-driven solve's stretches between events are replayed by default where each
    is allowed at most `EVENT_REPLAY_MAX_STEPS` steps and the controller makes no jumps;
    otherwise diffrax's checkpointed loop differentiates them."""
    limit = _thresholds.EVENT_REPLAY_MAX_STEPS
    jumps = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-6, atol=1e-8), jump_ts=jnp.array([0.5])
    )
    for max_steps, controller, replayed in [
        (limit, None, True),
        (16, diffrax.PIDController(rtol=1e-6, atol=1e-8), True),
        (limit + 1, None, False),
        (None, None, False),
        (limit, jumps, False),
    ]:
        adjoint, _ = resolve_adjoint(
            None, diffrax.Tsit5(), max_steps, True, ("gaps",), "events", controller
        )
        assert isinstance(adjoint, jaxdae.ReplayAdjoint) == replayed
        assert replayed or isinstance(adjoint, diffrax.RecursiveCheckpointAdjoint)
