"""The written-out derivative of diffrax's ESDIRK steps (`_esdirk_adjoint.esdirk_step_vjp`,
what `jaxdae.ReplayAdjoint` applies to `Kvaerno3/4/5`): on one step, equal to the solution
of the step's stacked stage equations and to `eqx.filter_vjp` of the solver's own step;
through a solve, equal to diffrax's loop with one checkpoint per step and to central
differences."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._integration import _esdirk_adjoint
from jaxdae._integration._autodiff_step import autodiff_step_vjp
from jaxdae._integration._esdirk_adjoint import _coefficients, esdirk_step_vjp
from jaxdae._integration._step_adjoints import reuses_outputs, step_vjp


def _relative(a, b):
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (a, b))
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def _van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0] + jnp.sin(t)])


KVAERNO3 = jaxdae.configure_implicit(diffrax.Kvaerno3(), 1e-6, 1e-8)
KVAERNO5 = jaxdae.configure_implicit(diffrax.Kvaerno5(), 1e-6, 1e-8)


@eqx.filter_jit
def _first_and_next_step(solver):
    """A stiff Van der Pol oscillator (μ = 1000) on its slow manifold: the terms as
    `diffeqsolve` hands them to the solver (wrapped for the direction of time), `μ`, and
    the states of a first step (its first stage evaluated) and of the next (its first
    stage carried in)."""
    from diffrax._term import WrapTerm

    terms = WrapTerm(diffrax.ODETerm(_van_der_pol), jnp.asarray(1.0))
    t0, t1, t2 = jnp.asarray(0.3), jnp.asarray(0.301), jnp.asarray(0.303)
    y0, mu = jnp.array([2.0, -0.6]), jnp.asarray(1000.0)
    state0 = solver.init(terms, t0, t1, y0, mu)
    y1, _, _, state1, _ = solver.step(terms, t0, t1, y0, mu, state0, False)
    return terms, mu, [(t0, t1, (y0, state0)), (t1, t2, (y1, state1))]


def _bars(outputs, seed):
    """Random cotangents of a step's outputs (end state, solver state, dense output)."""
    keys = iter(jax.random.split(jax.random.key(seed), 8))
    return jax.tree.map(
        lambda x: (
            jax.random.normal(next(keys), jnp.shape(x), x.dtype)
            if eqx.is_inexact_array(x)
            else None
        ),
        outputs,
    )


@eqx.filter_jit
def _pulled(vjp, solver, terms, t0, t1, state, mu, seed, given=False):
    """The outputs of one step and the cotangents at its start (`(y0, solver state)`, then
    `μ`) of random cotangents of its outputs; if `given`, with the step's outputs passed
    to `vjp`, as `jaxdae.ReplayAdjoint` passes those it keeps."""
    diff, static = eqx.partition((terms, mu), (False, True))
    kept = {}
    if given:
        y1, _, dense, solver_state1, _ = solver.step(terms, t0, t1, state[0], mu, state[1], False)
        kept = {"outputs": ((y1, solver_state1), dense)}
    outputs, pull = vjp(solver, t0, t1, state, diff, static, **kept)
    state_bar, (_, mu_bar) = pull(_bars(outputs, seed))
    return outputs, (state_bar, mu_bar)


@eqx.filter_jit
def _stacked(solver, terms, t0, t1, state, mu, seed):
    """The cotangents of `_pulled` from the step's stage equations solved together:
    `Fᵢ = f(tᵢ, y₀ + h Σⱼ aᵢⱼ Fⱼ)` for every stage (the first one `F₀ = f₀`, carried in,
    after a first step), differentiated by the implicit function theorem with dense
    Jacobians (`jax.jacfwd`) and one linear solve of all stages at once."""
    y0, (first_step, f0) = state
    n = y0.size
    outputs = solver.step(terms, t0, t1, y0, mu, (first_step, f0), False)
    y1, _, dense, _, _ = outputs
    (y1_bar, (_, f1_bar)), dense_bar = _bars(((y1, outputs[3]), dense), seed)
    a, b, c = _coefficients(solver.tableau, y0.dtype)
    s = a.shape[0]
    h = t1 - t0
    points = y0 + a @ dense["k"]
    times = t0 + jnp.asarray(c) * h
    jac_y = jax.vmap(jax.jacfwd(lambda t, z: terms.vf(t, z, mu), 1))(times, points)
    jac_mu = jax.vmap(jax.jacfwd(lambda t, z, m: terms.vf(t, z, m), 2), (0, 0, None))(
        times, points, mu
    )
    equation = jnp.concatenate([jnp.reshape(first_step, (1,)), jnp.ones(s - 1, bool)])
    jac_y = jnp.where(equation[:, None, None], jac_y, 0.0)
    jac_mu = jnp.where(equation[:, None], jac_mu, 0.0)
    # dF = blockdiag(Jᵢ) (1 ⊗ dy₀ + h (A ⊗ I) dF) + f_μ dμ (+ df₀ in row 0 if carried).
    blocks = jax.scipy.linalg.block_diag(*jac_y)
    matrix = jnp.eye(s * n) - h * blocks @ jnp.kron(a, jnp.eye(n))
    y1_total = y1_bar + dense_bar["y1"]
    f_bar = h * (b[:, None] * y1_total + dense_bar["k"])
    f_bar = f_bar.at[-1].add(f1_bar)
    w = jnp.linalg.solve(matrix.T, f_bar.reshape(-1)).reshape(s, n)
    y0_bar = y1_total + dense_bar["y0"] + jnp.einsum("sij,si->j", jac_y, w)
    f0_bar = jnp.where(first_step, 0.0, w[0])
    return (y0_bar, (None, f0_bar)), jnp.sum(jac_mu * w)


def test_step_derivative_solves_the_stacked_stage_equations():
    """On a first step and on the step after it, with cotangents of the end state, the
    carried stage and the dense output, Kvaerno3's written-out derivative (each stage's
    transposed equations solved by refinement) equals the stacked stage equations'
    derivative to rounding."""
    assert step_vjp.dispatch(type(KVAERNO3)) is esdirk_step_vjp
    terms, mu, steps = _first_and_next_step(KVAERNO3)
    for t0, t1, state in steps:
        written = _pulled(esdirk_step_vjp, KVAERNO3, terms, t0, t1, state, mu, 0)
        assert _relative(written[1], _stacked(KVAERNO3, terms, t0, t1, state, mu, 0)) < 1e-12
        given = _pulled(esdirk_step_vjp, KVAERNO3, terms, t0, t1, state, mu, 0, True)
        assert _relative(given[0], written[0]) == 0.0
        assert _relative(given[1], written[1]) < 1e-13


def test_replay_keeps_outputs_for_the_esdirk_derivative_only():
    """The replay keeps the steps' outputs for diffrax's ESDIRKs, whose derivative takes
    the stages from them, and not for Rodas5P (its dense output holds combinations of
    the stages) or a solver differentiated by reverse mode."""
    assert reuses_outputs(KVAERNO5) and reuses_outputs(diffrax.Kvaerno3())
    assert not reuses_outputs(jaxdae.Rodas5P())
    assert not reuses_outputs(diffrax.Tsit5())


@pytest.mark.slow
def test_step_derivative_is_that_of_the_step(monkeypatch):
    """The written-out derivative equals `eqx.filter_vjp` of Kvaerno3's and Kvaerno5's
    steps, outputs to the bit and cotangents to rounding, with the stages refined from the
    last stage's matrix and with every stage's own (refinement stopped after one
    correction)."""
    for solver in (KVAERNO3, KVAERNO5):
        terms, mu, steps = _first_and_next_step(solver)
        for t0, t1, state in steps:
            reference = _pulled(autodiff_step_vjp, solver, terms, t0, t1, state, mu, 0)
            written = _pulled(esdirk_step_vjp, solver, terms, t0, t1, state, mu, 0)
            assert jax.tree.structure(written) == jax.tree.structure(reference)
            assert _relative(written[0], reference[0]) == 0.0
            assert _relative(written[1], reference[1]) < 1e-12
    monkeypatch.setattr(_esdirk_adjoint, "_REFINE_ITERATIONS", 1)
    t0, t1, state = steps[1]
    own = _pulled(esdirk_step_vjp, KVAERNO5, terms, t0, t1, state, mu, 1)[1]
    assert (
        _relative(own, _pulled(autodiff_step_vjp, KVAERNO5, terms, t0, t1, state, mu, 1)[1]) < 1e-12
    )


MAX_STEPS = 400
TS = jnp.linspace(0.0, 1.0, 6)


def _loss(diff, solver, adjoint, dt0=None):
    """The forced Van der Pol loss of `tests/test_implicit_adjoint.py` (states saved inside
    the steps and at the end), of `μ` and `y0`; adaptive steps, or fixed ones of `dt0`."""
    mu, y0 = diff
    controller = (
        diffrax.PIDController(rtol=1e-6, atol=1e-8) if dt0 is None else diffrax.ConstantStepSize()
    )
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


@pytest.mark.slow
def test_solve_gradient_is_that_of_a_checkpoint_per_step():
    """Through an adaptive Kvaerno5 solve (μ = 5), the replayed gradient with the
    written-out step derivative equals diffrax's loop differentiated with one checkpoint
    per step; in segments of 5 steps under `vmap`, the gradients one by one; with fixed
    steps, central differences in `μ` (with adaptive ones those also see the step sizes
    change, by about the tolerance)."""
    diff = (jnp.asarray(5.0), jnp.array([2.0, 0.0]))
    grad = eqx.filter_jit(jax.grad(_loss))
    replayed = grad(diff, KVAERNO5, jaxdae.ReplayAdjoint())
    every_step = grad(diff, KVAERNO5, diffrax.RecursiveCheckpointAdjoint(checkpoints=MAX_STEPS))
    assert _relative(replayed, every_step) < 1e-10
    segments = jaxdae.ReplayAdjoint(stored_steps=5)
    y0s = jnp.array([[2.0, 0.0], [1.0, 0.5]])
    batched = jax.vmap(lambda y0: grad((diff[0], y0), KVAERNO5, segments))(y0s)
    for i, y0 in enumerate(y0s):
        one = grad((diff[0], y0), KVAERNO5, segments)
        assert _relative(jax.tree.map(lambda x, i=i: x[i], batched), one) < 1e-12
    fixed = grad(diff, KVAERNO5, jaxdae.ReplayAdjoint(), 0.01)
    loss = eqx.filter_jit(_loss)
    eps, forward = 1e-5, diffrax.RecursiveCheckpointAdjoint()
    central = (
        loss((diff[0] + eps, diff[1]), KVAERNO5, forward, 0.01)
        - loss((diff[0] - eps, diff[1]), KVAERNO5, forward, 0.01)
    ) / (2 * eps)
    assert abs(fixed[0] - central) < 1e-7 * abs(central)
