"""Gradients of `GeneralizedAlpha` solves by the discrete adjoint of their accepted steps
(`GeneralizedAlphaAdjoint`, the solver's default adjoint): the gradient of diffrax's loop
with one checkpoint per step, whatever the number of steps kept at once."""

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import jaxdae
from jaxdae._integration._adjoint import default_adjoint
from jaxdae._integration._generalized_alpha_adjoint import GeneralizedAlphaAdjoint, _not_replayed
from jaxdae._integration._sweep_forward import warn_checkpointed
from jaxdae._integration._term import SystemTerm

from ._systems import stiff_arm

PENDULUM = jaxdae.examples.CartesianPendulum()
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)
Q0, V0 = PENDULUM.state_from_angle(1.0, 0.0)
MAX_STEPS = 2000
EVERY_STEP = diffrax.RecursiveCheckpointAdjoint(checkpoints=MAX_STEPS)


def _relative(a, b):
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (a, b))
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def test_default_for_generalized_alpha():
    assert isinstance(default_adjoint(jaxdae.GeneralizedAlpha(), 100), GeneralizedAlphaAdjoint)
    assert not isinstance(default_adjoint(jaxdae.GeneralizedAlpha(), None), GeneralizedAlphaAdjoint)


@pytest.mark.slow
def test_gradient_with_saves_inside_steps():
    """Adaptive steps, states saved inside the steps (the cubic Hermite dense output) and
    at the end: gradients with respect to a parameter and the initial state equal diffrax's
    loop differentiated with one checkpoint per step, in one segment and in segments of 8
    steps."""
    ts = jnp.linspace(0.0, 0.3, 7)

    def loss(diff, adjoint):
        gravity, q0, v0 = diff
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        sol = jaxdae.simulate(
            system,
            BAUMGARTE,
            0.0,
            0.3,
            q0,
            v0,
            ts=ts,
            rtol=1e-6,
            atol=1e-8,
            solver=jaxdae.GeneralizedAlpha(),
            max_steps=MAX_STEPS,
            adjoint=adjoint,
        )
        return jnp.sum(sol.q**2) + jnp.sum(jnp.sin(sol.v)) + jnp.sum(sol.q_final**3)

    diff = (jnp.asarray(9.81), Q0, V0 + 0.3)
    grads = [
        eqx.filter_jit(jax.grad(loss))(diff, adjoint)
        for adjoint in (EVERY_STEP, None, GeneralizedAlphaAdjoint(stored_steps=8))
    ]
    assert _relative(grads[1], grads[0]) < 1e-9
    assert _relative(grads[2], grads[1]) < 1e-12


@pytest.mark.slow
def test_forward_mode_is_refused_with_the_fix():
    def final(gravity):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        return jaxdae.simulate(
            system,
            BAUMGARTE,
            0.0,
            0.05,
            Q0,
            V0,
            rtol=1e-6,
            atol=1e-8,
            solver=jaxdae.GeneralizedAlpha(),
        ).q_final

    with pytest.raises(ValueError, match="adjoint=diffrax.ForwardMode()"):
        jax.jvp(final, (jnp.asarray(9.81),), (jnp.asarray(1.0),))


@pytest.mark.slow
def test_adaptive_gradient_does_not_depend_on_checkpoints():
    """On the stiff arm (about 1,200 adaptive steps) the default gradient equals the
    one-checkpoint-per-step gradient of diffrax's loop (which fewer checkpoints do not:
    their recomputed steps need not be the forward solve's), in any number of segments."""
    system, formulation, q0, v0 = stiff_arm()
    steps = 4000

    def loss(mass, adjoint):
        model = eqx.tree_at(lambda s: s.masses, system, jnp.stack([mass, system.masses[1]]))
        return jaxdae.simulate(
            model,
            formulation,
            0.0,
            0.5,
            q0,
            v0,
            rtol=1e-7,
            atol=1e-10,
            solver=jaxdae.GeneralizedAlpha(),
            max_steps=steps,
            adjoint=adjoint,
        ).q_final[0]

    mass = jnp.asarray(1.0)
    every, default, segments = (
        float(jax.jit(jax.grad(loss), static_argnums=1)(mass, a))
        for a in (
            diffrax.RecursiveCheckpointAdjoint(checkpoints=steps),
            None,
            GeneralizedAlphaAdjoint(stored_steps=100),
        )
    )
    assert abs(default - every) <= 1e-9 * abs(every)
    assert abs(segments - default) <= 1e-12 * abs(default)


@pytest.mark.slow
def test_fixed_step_gradient_against_central_differences_and_under_vmap():
    """Fixed steps: the gradient equals central differences, and a batch of gradients
    under `vmap` equals the gradients one by one."""
    solver = jaxdae.GeneralizedAlpha(root_finder=optx.Newton(rtol=1e-12, atol=1e-12))

    def loss(gravity, q0):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        return jaxdae.simulate(
            system,
            BAUMGARTE,
            0.0,
            0.5,
            q0,
            V0,
            solver=solver,
            dt0=0.01,
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=100,
        ).q_final[0]

    g, eps = jnp.asarray(9.81), 1e-5
    grad = jax.jit(jax.grad(loss))
    central = (loss(g + eps, Q0) - loss(g - eps, Q0)) / (2 * eps)
    np.testing.assert_allclose(grad(g, Q0), central, rtol=1e-6)
    q0s = jnp.stack([Q0, PENDULUM.state_from_angle(0.5, 0.0)[0]])
    batched = jax.vmap(grad, in_axes=(None, 0))(g, q0s)
    np.testing.assert_allclose(batched, [grad(g, q) for q in q0s], rtol=1e-12)


@pytest.mark.slow
def test_adaptive_gradients_under_vmap_with_different_step_counts():
    """Adaptive steps, in segments of 32: a batch whose members take different numbers of
    steps and segments gives under `vmap` the gradients one by one, saves inside the steps
    included."""

    def loss(gravity):
        sol = jaxdae.simulate(
            eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity),
            BAUMGARTE,
            0.0,
            0.5,
            Q0,
            V0,
            ts=jnp.linspace(0.1, 0.5, 5),
            rtol=1e-5,
            atol=1e-7,
            solver=jaxdae.GeneralizedAlpha(),
            max_steps=1000,
            adjoint=GeneralizedAlphaAdjoint(stored_steps=32),
        )
        return jnp.sum(sol.q[:, 0]), sol.stats["num_accepted_steps"]

    gravities = jnp.array([1.0, 9.81, 60.0])
    grad = jax.grad(loss, has_aux=True)
    batched, steps = jax.jit(jax.vmap(grad))(gravities)
    assert len(set(np.asarray(steps).tolist())) == 3, steps
    one_by_one = jnp.stack([jax.jit(grad)(g)[0] for g in gravities])
    assert float(jnp.max(jnp.abs(one_by_one))) > 1e-3
    assert _relative(batched, one_by_one) < 1e-11


@pytest.mark.slow
def test_saved_steps_are_replayed():
    """States saved at every step (`SaveAt(steps=True)`, with `t0`) are replayed: with
    adaptive steps the gradient equals diffrax's loop with one checkpoint per step, and
    nothing is warned of."""
    steps = 512

    def loss(gravity, adjoint):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        sol = diffrax.diffeqsolve(
            SystemTerm(system, BAUMGARTE),
            jaxdae.GeneralizedAlpha(),
            0.0,
            0.2,
            0.01,
            (Q0, V0),
            saveat=diffrax.SaveAt(
                subs=[diffrax.SubSaveAt(t0=True, steps=True), diffrax.SubSaveAt(t1=True)]
            ),
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-7),
            max_steps=steps,
            adjoint=adjoint,
        )
        saved = jnp.where(jnp.isfinite(sol.ys[0][0]), sol.ys[0][0], 0.0)
        return jnp.sum(saved[:, 0] ** 2) + jnp.sum(jnp.sin(sol.ys[1][1]))

    g = jnp.asarray(9.81)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = jax.jit(jax.grad(loss), static_argnums=1)(g, GeneralizedAlphaAdjoint())
    every = jax.jit(jax.grad(loss), static_argnums=1)(
        g, diffrax.RecursiveCheckpointAdjoint(checkpoints=steps)
    )
    assert abs(float(every)) > 1e-3
    np.testing.assert_allclose(ours, every, rtol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    "saveat, event, what",
    [
        (diffrax.SaveAt(t1=True, dense=True), None, "a dense output"),
        (diffrax.SaveAt(steps=2), None, "every few steps"),
        (
            diffrax.SaveAt(t1=True),
            diffrax.Event(lambda t, y, args, **kw: y[0][0] - 0.5, optx.Newton(1e-8, 1e-8)),
            "root finder",
        ),
    ],
)
def test_what_the_sweep_does_not_replay_warns_with_the_fix(saveat, event, what):
    """With adaptive steps, a solve that the sweep does not replay is differentiated
    through diffrax's checkpointed loop, and says so when traced, naming the fix."""

    def loss(gravity):
        system = eqx.tree_at(lambda s: s.gravity, PENDULUM, gravity)
        sol = diffrax.diffeqsolve(
            SystemTerm(system, BAUMGARTE),
            jaxdae.GeneralizedAlpha(),
            0.0,
            0.2,
            0.01,
            (Q0, V0),
            saveat=saveat,
            event=event,
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
            max_steps=64,
            adjoint=GeneralizedAlphaAdjoint(),
        )
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys[0]), sol.ys[0], 0.0))

    with pytest.warns(UserWarning, match=f"(?s){what}.*checkpoints=max_steps"):
        jax.eval_shape(jax.grad(loss), jnp.asarray(9.81))


@pytest.mark.slow
def test_gradient_with_respect_to_the_end_time_warns():
    """A gradient with respect to `t1` goes through diffrax's loop; with adaptive steps
    it says so when traced."""

    def final(t1):
        return jaxdae.simulate(
            PENDULUM,
            BAUMGARTE,
            0.0,
            t1,
            Q0,
            V0,
            rtol=1e-6,
            atol=1e-8,
            solver=jaxdae.GeneralizedAlpha(),
            max_steps=256,
        ).q_final[0]

    with pytest.warns(UserWarning, match="with respect to `t0`, `t1`"):
        jax.eval_shape(jax.grad(final), jnp.asarray(0.2))


def test_fixed_steps_go_through_diffrax_loop_without_a_warning():
    """Fixed steps take no adaptive decision: through diffrax's loop their gradient does
    not depend on the checkpoints, and nothing is said; adaptive steps are warned of."""
    unreplayed = _not_replayed(diffrax.SaveAt(dense=True), None, 100, False, False)
    assert unreplayed is not None and "dense" in unreplayed[0]
    assert (
        _not_replayed(diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 3)), None, 100, False, False) is None
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_checkpointed(diffrax.ConstantStepSize(), *unreplayed)
    with pytest.warns(UserWarning, match="dense output"):
        warn_checkpointed(diffrax.PIDController(rtol=1e-6, atol=1e-8), *unreplayed)
