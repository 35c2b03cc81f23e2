"""Gradients of `Rodas5P` and diffrax's implicit Runge–Kutta solves by the derivative of
their replayed steps (`ReplayAdjoint`, those solvers' default adjoint): the gradient of
diffrax's loop with one checkpoint per step, whatever the number of steps kept at once."""

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._integration._adjoint import default_adjoint

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
    sol = diffrax.diffeqsolve(diffrax.ODETerm(_van_der_pol), solver, 0.0, 1.0, dt0, y0,
                              args=mu, saveat=diffrax.SaveAt(ts=TS, t1=True),
                              stepsize_controller=controller, max_steps=MAX_STEPS,
                              adjoint=adjoint)
    return jnp.sum(sol.ys[0] ** 2) + jnp.sum(jnp.sin(sol.ys[1]))


_grad = eqx.filter_jit(jax.grad(_loss))
DIFF = (jnp.asarray(5.0), jnp.array([2.0, 0.0]))


def test_default_for_rosenbrock_and_implicit_solvers():
    kvaerno = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-6, 1e-9)
    for solver in (jaxdae.Rodas5P(), kvaerno, diffrax.Kvaerno3()):
        assert isinstance(default_adjoint(solver, 100), jaxdae.ReplayAdjoint)
        assert isinstance(default_adjoint(solver, None), diffrax.RecursiveCheckpointAdjoint)


@pytest.mark.slow
def test_rodas_gradient_is_that_of_a_checkpoint_per_step():
    """Adaptive steps, saves inside the steps (the dense output) and at the end: the
    gradient with respect to a parameter and the initial state equals diffrax's loop
    differentiated with one checkpoint per step, in one segment and in segments of 3
    steps."""
    grads = [_grad(DIFF, jaxdae.Rodas5P(), adjoint) for adjoint in
             (EVERY_STEP, jaxdae.ReplayAdjoint(), jaxdae.ReplayAdjoint(stored_steps=3))]
    assert _relative(grads[1], grads[0]) < 1e-12
    assert _relative(grads[2], grads[1]) < 1e-13


@pytest.mark.slow
def test_kvaerno_gradient_is_that_of_a_checkpoint_per_step():
    """As for Rodas5P, with the configured Kvaerno5 and Kvaerno3 (a root found in each
    stage, differentiated by the implicit-function rule in both adjoints)."""
    for solver in (diffrax.Kvaerno5(), diffrax.Kvaerno3()):
        solver = jaxdae.configure_implicit(solver, 1e-6, 1e-8)
        grads = [_grad(DIFF, solver, adjoint) for adjoint in
                 (EVERY_STEP, jaxdae.ReplayAdjoint(), jaxdae.ReplayAdjoint(stored_steps=3))]
        assert _relative(grads[1], grads[0]) < 1e-11
        assert _relative(grads[2], grads[1]) < 1e-13


@pytest.mark.slow
def test_fixed_step_gradients_against_central_differences():
    """Constant steps: the gradient is that of the discrete map, which central
    differences of the solve approximate to their truncation error."""
    kvaerno = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-12, 1e-12)
    eps = 1e-6
    for solver in (jaxdae.Rodas5P(), kvaerno):
        def loss(diff, solver=solver):
            return _loss(diff, solver, jaxdae.ReplayAdjoint(stored_steps=7),
                         diffrax.ConstantStepSize(), 0.02)

        mu, y0 = DIFF
        grad_mu, grad_y0 = jax.jit(jax.grad(loss))(DIFF)
        central = [(loss((mu + eps, y0)) - loss((mu - eps, y0))) / (2 * eps)]
        central += [(loss((mu, y0.at[i].add(eps))) - loss((mu, y0.at[i].add(-eps)))) / (2 * eps)
                    for i in range(2)]
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
        return jaxdae.simulate(model, formulation, 0.0, 1.0, q0, v0, solver=jaxdae.Rodas5P(),
                               rtol=1e-8, atol=1e-11, max_steps=steps,
                               adjoint=adjoint).q_final[0]

    mass = jnp.asarray(1.0)
    every, segments = (float(jax.jit(jax.grad(loss), static_argnums=1)(mass, a)) for a in (
        diffrax.RecursiveCheckpointAdjoint(checkpoints=steps),
        jaxdae.ReplayAdjoint(stored_steps=1000)))
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
        sol = diffrax.diffeqsolve(diffrax.ODETerm(_van_der_pol), jaxdae.Rodas5P(), 0.0, 0.5,
                                  0.05, DIFF[1], args=mu, saveat=diffrax.SaveAt(steps=True),
                                  stepsize_controller=diffrax.ConstantStepSize(),
                                  max_steps=16, adjoint=adjoint)
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0))

    ours, diffrax_loop = (jax.jit(jax.grad(steps_loss), static_argnums=1)(DIFF[0], a)
                          for a in (adjoint, diffrax.RecursiveCheckpointAdjoint()))
    assert abs(float(diffrax_loop)) > 1e-3
    np.testing.assert_allclose(ours, diffrax_loop, rtol=1e-12)


def test_rodas_runs_backwards_in_time():
    """diffrax hands a solve from `t0 > t1` its terms wrapped with the direction of time in
    their control, not in their vector field (the terms the adjoint sees): Rodas5P
    integrates `y' = −y` from `y(1) = 1` back to `y(0) = e`."""
    sol = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, args: -y), jaxdae.Rodas5P(), 1.0,
                              0.0, -0.1, jnp.array([1.0]),
                              stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10))
    np.testing.assert_allclose(sol.ys[-1], [np.e], rtol=1e-6)


def test_an_adaptive_solve_it_cannot_replay_warns():
    """Saving every step of an adaptive solve is not replayed: tracing its gradient warns
    that it goes through diffrax's checkpointed loop, naming the fix; fixed steps do not."""
    def loss(mu, controller):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(_van_der_pol), jaxdae.Rodas5P(), 0.0, 0.5,
                                  0.05, DIFF[1], args=mu, saveat=diffrax.SaveAt(steps=True),
                                  stepsize_controller=controller, max_steps=16,
                                  adjoint=jaxdae.ReplayAdjoint())
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0))

    with pytest.warns(UserWarning, match="ReplayAdjoint` does not replay.*max_steps"):
        jax.make_jaxpr(jax.grad(loss), static_argnums=1)(
            DIFF[0], diffrax.PIDController(rtol=1e-4, atol=1e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        jax.make_jaxpr(jax.grad(loss), static_argnums=1)(DIFF[0], diffrax.ConstantStepSize())
