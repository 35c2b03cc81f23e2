"""jaxdae.tune: loss decrease, SPD gains, checkpoint/resume, failed scenarios, guards;
parametrizations, losses and the discrete stability of Mukharlyamov (2019) §4."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdae

# Tuning runs with failed scenarios on purpose: the warning that names them is checked in
# tests/test_faults_jobs.py.
pytestmark = pytest.mark.filterwarnings(r"ignore:jaxdae\.tune. at step:UserWarning")

SYSTEM = jaxdae.examples.CartesianPendulum()
TS = jnp.linspace(0.0, 1.0, 11)
OPTIMIZER = optax.adam(0.5)
LOSS = jaxdae.ConstraintViolation(rate_weight=0.01)


def run(formulation, scenario):
    """One pendulum simulation: the module-level function keeps the compiled step shared."""
    q0, v0 = scenario
    return jaxdae.simulate(
        SYSTEM,
        formulation,
        0.0,
        1.0,
        q0,
        v0,
        ts=TS,
        throw=False,
        rtol=1e-6,
        atol=1e-8,
        max_steps=256,
    )


def scenarios(scale=1.15):
    angles = jnp.array([0.2, 0.5, 0.8, 1.1])
    q0, v0 = jax.vmap(lambda a: SYSTEM.state_from_angle(a, 0.5))(angles)
    return q0 * scale, v0  # off the manifold: Φ(0) = scale² − 1


def initial_params():
    return jaxdae.parametrize(jaxdae.Baumgarte(0.5, 0.5), lambda f: (f.kd, f.kp), jaxdae.Positive)


QUIET = jaxdae.Reporting(progress=False)
PENALTY_10 = jaxdae.Failures(penalty=10.0)


def tune(steps, **kwargs):
    kwargs.setdefault("reporting", QUIET)
    return jaxdae.tune(
        initial_params(), run, scenarios(), LOSS, optimizer=OPTIMIZER, steps=steps, **kwargs
    )


@pytest.fixture(scope="module")
def reference():
    """An uninterrupted run (reused by several tests)."""
    return tune(12)


@pytest.mark.slow
def test_tuning_decreases_loss(reference):
    loss = np.asarray(reference.history["loss"])
    assert np.all(np.isfinite(loss))
    assert reference.history["num_failed"] == [0] * 12
    # Decreases on average (first third vs last third) and by a stated factor.
    assert loss[-4:].mean() < loss[:4].mean()
    assert loss[-1] < 0.5 * loss[0], loss
    # The gains stay positive (Lyapunov condition of Mukharlyamov and Deressa (2015) eq. [18]): this
    # loss pushes the damping towards 0 and the stiffness up; the softplus keeps K_D > 0.
    model = reference.model
    assert isinstance(model, jaxdae.Baumgarte)
    assert 0 < float(model.kd) < 0.5 < float(model.kp)
    model.check_values()  # SPD check of the formulation itself
    # The model is a usable formulation: the tuned loss, recomputed, is the history's trend.
    tuned = float(jnp.mean(jax.vmap(lambda s: LOSS(run(model, s)))(scenarios())))
    assert tuned < loss[0]


@pytest.mark.slow
def test_checkpoint_resume_is_bit_identical(reference, tmp_path):
    class Interrupt(Exception):
        pass

    def interrupt(step, row):
        if step == 7:
            raise Interrupt

    log = tmp_path / "log.csv"
    with pytest.raises(Interrupt):
        tune(
            12,
            checkpointing=jaxdae.Checkpointing(tmp_path / "ckpt", every=3),
            reporting=jaxdae.Reporting(log=log, progress=False, callback=interrupt),
        )
    resumed = tune(
        12,
        checkpointing=jaxdae.Checkpointing(tmp_path / "ckpt", every=3),
        reporting=jaxdae.Reporting(log=log, progress=False),
    )
    assert resumed.step == 12
    leaves = jax.tree.leaves(eqx.filter(resumed.params, eqx.is_array))
    expected = jax.tree.leaves(eqx.filter(reference.params, eqx.is_array))
    for a, b in zip(leaves, expected, strict=False):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(
        jax.tree.leaves(resumed.opt_state), jax.tree.leaves(reference.opt_state), strict=False
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed.history["loss"] == reference.history["loss"]
    rows = log.read_text().strip().splitlines()
    assert rows[0].startswith("step,loss") and len(rows) == 13
    # A finished checkpoint resumes to the same result without stepping.
    again = tune(12, checkpointing=jaxdae.Checkpointing(tmp_path / "ckpt"))
    np.testing.assert_array_equal(np.asarray(again.model.kd), np.asarray(reference.model.kd))
    # Another run (other seed or start) refuses the checkpoint.
    with pytest.raises(ValueError, match="other initial parameters or another seed"):
        tune(
            12,
            checkpointing=jaxdae.Checkpointing(tmp_path / "ckpt"),
            batching=jaxdae.Batching(seed=3),
        )


@pytest.mark.slow
def test_failed_scenario_gives_penalty_not_nan():
    q0, v0 = scenarios()
    # A fast spin needs more than `max_steps`: the solve stops (max_steps_reached).
    v0 = v0.at[2].multiply(400.0)
    sol = run(jaxdae.Baumgarte(0.5, 0.5), (q0[2], v0[2]))
    assert not bool(sol.succeeded)
    result = jaxdae.tune(
        initial_params(),
        run,
        (q0, v0),
        LOSS,
        optimizer=OPTIMIZER,
        steps=2,
        failures=jaxdae.Failures(penalty=7.0),
        reporting=QUIET,
    )
    assert result.history["num_failed"] == [1, 1]
    assert not any(result.history["skipped"])
    assert np.isfinite(result.history["grad_norm"]).all()
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(result.opt_state))
    # The penalty enters the mean loss: (3 successful + 7.0) / 4.
    assert result.history["scenario_loss"][0] > 7.0 / 4


def _sqrt_model(model, target):
    return jnp.sqrt(model.kd - target)  # nan (value and gradient) for target > kd


def test_nan_scenario_gets_zero_gradient():
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.array([0.0, 0.5, 5.0])
    result = jaxdae.tune(
        params,
        _sqrt_model,
        targets,
        lambda x: x,
        optimizer=OPTIMIZER,
        steps=1,
        failures=PENALTY_10,
        reporting=QUIET,
    )
    assert result.history["num_failed"] == [1]
    np.testing.assert_allclose(
        result.history["scenario_loss"][0], (1.0 + np.sqrt(0.5) + 10.0) / 3, rtol=1e-12
    )
    assert np.isfinite(result.history["grad_norm"][0]) and result.history["grad_norm"][0] > 0
    assert float(result.model.kd) < 1.0  # the successful scenarios pull kd down


def _sqrt_ensemble(model, targets):
    return jnp.sqrt(model.kd - targets)  # the batch at once


def test_ensemble_chunks_fail_together_when_the_gradient_is_not_finite():
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.array([0.0, 0.5, 5.0])
    kwargs = dict(optimizer=OPTIMIZER, steps=1, failures=PENALTY_10, reporting=QUIET)
    # Chunks [0, 0.5] and [5.0, 5.0 (padding)]: only the second fails, as in the vmap test.
    chunked = jaxdae.tune(
        params,
        _sqrt_ensemble,
        targets,
        lambda x: x,
        batching=jaxdae.Batching(chunk_size=2, ensemble=True),
        **kwargs,
    )
    assert chunked.history["num_failed"] == [1]
    np.testing.assert_allclose(
        chunked.history["scenario_loss"][0], (1.0 + np.sqrt(0.5) + 10.0) / 3, rtol=1e-12
    )
    reference = jaxdae.tune(
        params,
        _sqrt_model,
        targets,
        lambda x: x,
        optimizer=OPTIMIZER,
        steps=1,
        failures=PENALTY_10,
        reporting=QUIET,
    )
    np.testing.assert_allclose(chunked.model.kd, reference.model.kd, rtol=1e-12)
    # One chunk: the nan scenario's gradient poisons the chunk's (a shared solve), so
    # the failure takes the whole batch, and no gradient is applied.
    together = jaxdae.Batching(ensemble=True)
    whole = jaxdae.tune(params, _sqrt_ensemble, targets, lambda x: x, batching=together, **kwargs)
    assert whole.history["num_failed"] == [3]
    assert whole.history["scenario_loss"] == [10.0] and whole.history["grad_norm"] == [0.0]
    assert np.isfinite(whole.history["loss"][0])
    # A function of one scenario passed with ensemble=True: the error says what to do.
    with pytest.raises(ValueError, match="leading axis of that size.*ensemble=False"):
        jaxdae.tune(
            params,
            lambda model, targets: jnp.sum(model.kd * targets),
            targets,
            lambda x: x,
            batching=together,
            **kwargs,
        )


class _Flagged(eqx.Module):
    """An output with per-scenario success flags, as a `Solution` has."""

    value: jax.Array
    succeeded: jax.Array


def _flagged(model, targets):
    # Targets above 2 "fail" with a finite value, as a trajectory that stops alone in
    # `simulate_ensemble` does; works for one scenario and for a batch at once.
    return _Flagged(model.kd * targets, targets < 2.0)


def test_ensemble_scenario_fails_alone():
    """A failed scenario with a finite gradient counts as the penalty and gives no
    gradient; the other scenarios of its chunk still tune, exactly as with `vmap`."""
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.array([0.5, 1.0, 5.0])
    kwargs = dict(optimizer=OPTIMIZER, steps=1, failures=PENALTY_10, reporting=QUIET)
    together = jaxdae.tune(
        params,
        _flagged,
        targets,
        lambda out: out.value,
        batching=jaxdae.Batching(ensemble=True),
        **kwargs,
    )
    alone = jaxdae.tune(params, _flagged, targets, lambda out: out.value, **kwargs)
    assert together.history["num_failed"] == alone.history["num_failed"] == [1]
    np.testing.assert_allclose(together.history["scenario_loss"][0], (1.5 + 10.0) / 3)
    assert together.history["grad_norm"][0] > 0
    np.testing.assert_allclose(together.model.kd, alone.model.kd, rtol=1e-12)


@pytest.mark.slow
def test_ensemble_tuning_matches_vmap():
    """`ensemble=True` with `simulate_ensemble`, differentiated by `ReverseSweepAdjoint`: the
    same losses and gains as the vmapped scenarios with the default adjoint, to the solver
    tolerance (the ensemble shares its step sizes)."""

    def run_ensemble(formulation, scenarios):
        q0, v0 = scenarios
        return jaxdae.simulate_ensemble(
            SYSTEM,
            formulation,
            0.0,
            1.0,
            q0,
            v0,
            ts=TS,
            throw=False,
            rtol=1e-6,
            atol=1e-8,
            max_steps=256,
            adjoint=jaxdae.ReverseSweepAdjoint(),
        )

    params = jaxdae.parametrize(
        jaxdae.ModifiedLagrange(1.0, 0.5, 0.5), lambda f: (f.alpha, f.kd, f.kp), jaxdae.Positive
    )
    kwargs = dict(optimizer=optax.adam(0.3), steps=2, reporting=QUIET)
    plain = jaxdae.tune(params, run, scenarios(), LOSS, **kwargs)
    together = jaxdae.tune(
        params, run_ensemble, scenarios(), LOSS, batching=jaxdae.Batching(ensemble=True), **kwargs
    )
    assert together.history["num_failed"] == [0, 0]
    np.testing.assert_allclose(together.history["loss"], plain.history["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(together.model), jax.tree.leaves(plain.model), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-5)


# Cheap problems (no simulation) for the argument checks and guards.
def _quadratic(model, target):
    return model.kd * target


def _square(output):
    return jnp.sum((output - 1.0) ** 2)


def test_nonfinite_update_raises_or_skips():
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.array([1.0, 2.0])
    bad = lambda model: jnp.sqrt(-model.kd)  # noqa: E731  nan
    with pytest.raises(FloatingPointError, match="not finite"):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            regularization=bad,
            reporting=QUIET,
        )
    result = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        optimizer=OPTIMIZER,
        steps=2,
        regularization=bad,
        reporting=QUIET,
        failures=jaxdae.Failures(on_nonfinite="skip"),
    )
    assert result.history["skipped"] == [True, True]
    np.testing.assert_array_equal(np.asarray(result.model.kd), 1.0)


def test_deterministic_minibatches_and_bad_arguments(unchecked):
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.linspace(0.5, 2.0, 6)
    kwargs = dict(optimizer=OPTIMIZER, steps=5, reporting=QUIET)
    a = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        batching=jaxdae.Batching(batch_size=2, seed=1),
        **kwargs,
    )
    b = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        batching=jaxdae.Batching(batch_size=2, seed=1),
        **kwargs,
    )
    c = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        batching=jaxdae.Batching(batch_size=2, seed=2),
        **kwargs,
    )
    assert a.history["loss"] == b.history["loss"]
    assert a.history["loss"] != c.history["loss"]
    with pytest.raises(ValueError, match="batch_size"):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            batching=jaxdae.Batching(batch_size=7),
        )
    with pytest.raises(ValueError, match="on_nonfinite"):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            failures=jaxdae.Failures(on_nonfinite="ignore"),
        )
    with pytest.raises(ValueError, match="Nothing to tune"):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            trainable=lambda x: False,
        )
    with pytest.raises(ValueError, match="optimizer"):
        jaxdae.tune(params, _quadratic, targets, _square, optimizer=None, steps=1)


@pytest.mark.slow
def test_sharded_float32_tuning_with_progress_bar():
    if jax.default_backend() != "cpu" and jax.device_count() < 4:
        pytest.skip("needs 4 devices: tests/conftest.py gives 4 host CPU devices on CPU")
    mesh = jax.make_mesh((4,), ("batch",))
    params = jaxdae.parametrize(
        jaxdae.Baumgarte(jnp.float32(1.0), jnp.float32(1.0)), lambda f: f.kd
    )
    targets = jnp.linspace(0.5, 2.0, 6, dtype=jnp.float32)
    kwargs = dict(optimizer=OPTIMIZER, steps=3, failures=PENALTY_10)
    plain = jaxdae.tune(
        params, _quadratic, targets, _square, reporting=jaxdae.Reporting(progress=True), **kwargs
    )
    sharded = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        batching=jaxdae.Batching(mesh=mesh, chunk_size=1),
        reporting=QUIET,
        **kwargs,
    )
    assert plain.model.kd.dtype == jnp.float32
    np.testing.assert_allclose(sharded.history["loss"], plain.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(sharded.model.kd, plain.model.kd, rtol=1e-6)
    # As one ensemble per chunk, each chunk split over the 4 devices (6 → 2 chunks of 4).
    together = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        batching=jaxdae.Batching(mesh=mesh, chunk_size=1, ensemble=True),
        reporting=QUIET,
        **kwargs,
    )
    np.testing.assert_allclose(together.history["loss"], plain.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(together.model.kd, plain.model.kd, rtol=1e-6)


def test_parametrizations():
    p = jaxdae.Positive(jnp.array([2.0, 3.0]), minimum=0.5)
    np.testing.assert_allclose(p.value(), [2.0, 3.0], rtol=1e-12)
    # Any raw value maps to a value above the minimum.
    assert float(eqx.tree_at(lambda x: x.raw, p, jnp.array([-50.0, 50.0])).value()[0]) >= 0.5
    log = jaxdae.Positive(jnp.array([10.0, 2500.0]), log_scale=True)
    np.testing.assert_allclose(log.value(), [10.0, 2500.0], rtol=1e-12)
    np.testing.assert_allclose(log.raw, np.log([10.0, 2500.0]), rtol=1e-12)
    k = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    spd = jaxdae.PositiveDefinite(k)
    np.testing.assert_allclose(spd.value(), k, rtol=1e-12)
    random = eqx.tree_at(
        lambda x: (x.lower, x.raw_diagonal),
        spd,
        (jnp.array([[0.0, 0.0], [5.0, 0.0]]), jnp.array([-3.0, 2.0])),
    )
    value = random.value()
    np.testing.assert_allclose(value, value.T)
    assert np.linalg.eigvalsh(np.asarray(value)).min() > 0
    formulation = jaxdae.unwrap(
        jaxdae.parametrize(
            jaxdae.ModifiedLagrange(3.0, [20.0, 10.0], [[100.0, 0.0], [0.0, 25.0]]),
            lambda f: (f.alpha, f.kd, f.kp),
            (jaxdae.Positive, jaxdae.Positive, jaxdae.PositiveDefinite),
        )
    )
    np.testing.assert_allclose(formulation.kp, [[100.0, 0.0], [0.0, 25.0]], rtol=1e-12)
    np.testing.assert_allclose(formulation.kd, [20.0, 10.0], rtol=1e-12)
    # Gradients through the parametrization (jit + grad).
    grad = jax.jit(jax.grad(lambda s: jnp.trace(s.value())))(spd)
    assert np.all(np.isfinite(np.asarray(grad.raw_diagonal)))
    with pytest.raises(ValueError, match="minimum"):
        jaxdae.Positive(0.1, minimum=0.5)
    with pytest.raises(ValueError, match="PositiveDefinite"):
        jaxdae.Positive(jnp.eye(2))
    with pytest.raises(ValueError, match="eigenvalues"):
        jaxdae.PositiveDefinite(jnp.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="size"):
        jaxdae.PositiveDefinite(1.0)
    with pytest.raises(ValueError, match="one per leaf"):
        jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: (f.kd, f.kp), (jaxdae.Positive,))


@pytest.mark.slow
def test_losses_on_a_solution(reference):
    sol = run(reference.model, jax.tree.map(lambda x: x[0], scenarios()))
    t = np.asarray(sol.ts)
    phi = np.asarray(sol.phi)[:, 0]
    dphi = np.asarray(sol.dphi)[:, 0]
    np.testing.assert_allclose(
        jaxdae.ConstraintViolation(rate_weight=0.5)(sol),
        np.trapezoid(phi**2 + 0.5 * dphi**2, t),
        rtol=1e-12,
    )
    combined = jaxdae.ConstraintViolation() + 2.0 * jaxdae.ControlEffort()
    effort = np.trapezoid(np.sum(np.asarray(sol.multipliers) ** 2, axis=1), t)
    np.testing.assert_allclose(
        combined(sol), np.trapezoid(phi**2 + dphi**2, t) + 2 * effort, rtol=1e-12
    )
    tracking = jaxdae.TrackingError(lambda s: jnp.zeros(1), output=lambda s, q: q[:1])
    np.testing.assert_allclose(
        tracking(sol), np.trapezoid(np.asarray(sol.q)[:, 0] ** 2, t), rtol=1e-12
    )
    # The settling surrogate is between 0 and the horizon and grows with a tighter band.
    loose, tight = jaxdae.SettlingTime(1e-1)(sol), jaxdae.SettlingTime(1e-4)(sol)
    assert 0 < float(loose) < float(tight) <= 1.0
    # Rows after a failure are ignored (finite values).
    failed = eqx.tree_at(
        lambda s: (s.ts, s.phi), sol, (sol.ts.at[5:].set(jnp.inf), sol.phi.at[5:].set(jnp.inf))
    )
    assert np.isfinite(float(jaxdae.ConstraintViolation()(failed)))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jaxdae.SettlingTime(-1e-3), "`tolerance` must be a positive finite band"),
        (lambda: jaxdae.SettlingTime(1e-3, width=0.0), "`width` must be a positive"),
        (lambda: jaxdae.ConstraintViolation(rate_weight=-1.0), "`rate_weight` must be a non-neg"),
        (
            lambda: jaxdae.ConstraintViolation(nonholonomic_weight=float("nan")),
            "`nonholonomic_weight` must be a non-negative finite",
        ),
    ],
    ids=["settling-tolerance", "settling-width", "rate-weight", "nonholonomic-weight"],
)
def test_loss_weights_are_checked(make, match):
    """A negative weight or tolerance would give a loss without a minimum or a nan."""
    with pytest.raises(ValueError, match=match):
        make()


def test_transition_matrix_is_the_stability_function(unchecked):
    """Mukharlyamov (2019) §4: Euler gives I + τH, the two-stage RK family I + τH + τ²H²/2."""
    formulation = jaxdae.Baumgarte(jnp.array([4.0, 2.0]), jnp.array([4.0, 9.0]))
    h = jaxdae.perturbation_matrix(formulation, 2)
    np.testing.assert_array_equal(h, formulation.perturbation_matrix(2))
    tau = 0.1
    eye = np.eye(4)
    np.testing.assert_allclose(
        jaxdae.transition_matrix(h, diffrax.Euler(), tau), eye + tau * h, rtol=1e-12, atol=1e-14
    )
    second = eye + tau * h + 0.5 * tau**2 * h @ h
    for solver in (diffrax.Heun(), diffrax.Midpoint(), diffrax.Ralston()):
        np.testing.assert_allclose(
            jaxdae.transition_matrix(h, solver, tau), second, rtol=1e-12, atol=1e-14
        )
    # Implicit Euler: (I − τH)⁻¹.
    implicit = jaxdae.transition_matrix(h, diffrax.ImplicitEuler(), tau)
    np.testing.assert_allclose(implicit, np.linalg.inv(eye - tau * np.asarray(h)), rtol=1e-6)
    with pytest.raises(ValueError, match="square"):
        jaxdae.transition_matrix(jnp.ones((2, 3)), diffrax.Euler(), tau)
    for bad in (0.0, -tau, np.inf):
        with pytest.raises(ValueError, match="`dt` must be a positive finite step"):
            jaxdae.transition_matrix(h, diffrax.Euler(), bad)
    with pytest.raises(ValueError, match="no perturbation matrix"):
        jaxdae.perturbation_matrix(jaxdae.Unstabilized(), 2)


@pytest.mark.slow
def test_discrete_stability_penalty():
    # Critically damped gains: a double eigenvalue, where eigenvalue gradients are nan.
    k = 10.0
    formulation = jaxdae.Baumgarte(2 * k, k**2)
    h = jaxdae.perturbation_matrix(formulation, 1)
    for tau in (0.05, 0.25):
        r = jaxdae.transition_matrix(h, diffrax.Heun(), tau)
        rho = float(jaxdae.spectral_radius(r))
        bound = float(jaxdae.spectral_radius_bound(r, power=256))
        assert rho <= bound <= rho * 1.05 + 1e-12
    # Heun: |1 + z + z²/2| < 1 needs z = −kτ > −2: stable for τ = 0.05, unstable for 0.25.
    stable = jaxdae.DiscreteStability(diffrax.Heun(), 0.05, 1, margin=0.0)
    unstable = jaxdae.DiscreteStability(diffrax.Heun(), 0.25, 1, margin=0.0)
    assert float(stable(formulation)) == 0.0
    assert float(unstable(formulation)) > 0.0
    grad = jax.jit(jax.grad(lambda f: unstable(f)))(formulation)
    assert np.isfinite(float(grad.kd)) and np.isfinite(float(grad.kp))
    assert float(grad.kd) > 0  # lower gains make the step stable
    # Modified Lagrange with W = J M⁻¹ Jᵀ: S = (I + Wα)⁻¹ Wα scales the gains (→ I as α → ∞).
    ml = jaxdae.ModifiedLagrange(1e8, 2 * k, k**2)
    w = jnp.array([[2.0]])
    np.testing.assert_allclose(jaxdae.perturbation_matrix(ml, 1, w), h, rtol=1e-7)
    soft = jaxdae.perturbation_matrix(jaxdae.ModifiedLagrange(0.5, 2 * k, k**2), 1, w)
    np.testing.assert_allclose(soft[1], 0.5 * h[1], rtol=1e-12)


TWO_LINK = jaxdae.examples.TwoLinkManipulator()


def _two_link(formulation, scenario):
    q0, v0 = scenario
    return jaxdae.simulate(
        TWO_LINK,
        formulation,
        0.0,
        0.8,
        q0,
        v0,
        ts=jnp.linspace(0.0, 0.8, 9),
        throw=False,
        rtol=1e-6,
        atol=1e-8,
    )


@pytest.mark.slow
def test_baumgarte_stopping_at_the_singularity_is_a_failed_scenario():
    """Mukharlyamov and Deressa (2015) Example 1: Baumgarte (Case 1) stops where the arm folds (t ≈
    0.493 s); inside a batch that scenario gets the penalty and a zero gradient, the other one
    tunes."""
    q0, v0 = TWO_LINK.initial_state()
    qs, vs = jnp.stack([q0, q0 + jnp.array([0.0, 0.3])]), jnp.stack([v0, v0])
    params = jaxdae.parametrize(
        jaxdae.Baumgarte(jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0])),
        lambda f: (f.kd, f.kp),
    )
    assert not bool(_two_link(jaxdae.unwrap(params), (q0, v0)).succeeded)
    result = jaxdae.tune(
        params,
        _two_link,
        (qs, vs),
        jaxdae.ConstraintViolation(),
        optimizer=OPTIMIZER,
        steps=2,
        failures=jaxdae.Failures(penalty=1e3),
        reporting=QUIET,
    )
    assert result.history["num_failed"] == [1, 1]
    assert np.all(np.isfinite(result.history["grad_norm"]))
    assert result.history["grad_norm"][0] > 0


def test_deprecated_keywords_warn_and_match_the_option_objects():
    """The keywords that the option objects group still work, each warning with the object
    that replaces it, and give the same run."""
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.linspace(0.5, 2.0, 6)
    grouped = jaxdae.tune(
        params,
        _quadratic,
        targets,
        _square,
        optimizer=OPTIMIZER,
        steps=3,
        batching=jaxdae.Batching(batch_size=2, seed=4),
        failures=jaxdae.Failures(penalty=5.0),
        reporting=QUIET,
    )
    with pytest.warns(DeprecationWarning) as record:
        old = jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=3,
            batch_size=2,
            seed=4,
            failure_penalty=5.0,
            progress=False,
        )
    messages = {str(w.message) for w in record if w.category is DeprecationWarning}
    for expected in (
        "batching=jaxdae.Batching(batch_size=",
        "batching=jaxdae.Batching(seed=",
        "failures=jaxdae.Failures(penalty=",
        "reporting=jaxdae.Reporting(progress=",
    ):
        assert any(expected in m for m in messages), (expected, messages)
    assert old.history["loss"] == grouped.history["loss"]
    with pytest.warns(DeprecationWarning, match=r"jaxdae\.Failures\(penalty="):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            failure_penalty=5.0,
            reporting=QUIET,
        )
    with pytest.raises(TypeError, match="unexpected keyword"):
        jaxdae.tune(params, _quadratic, targets, _square, optimizer=OPTIMIZER, steps=1, batchsize=2)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: jaxdae.Checkpointing("ckpt", every=float("nan")),
            r"`Checkpointing.every` must be an integer ≥ 1 .*got nan",
        ),
        (
            lambda: jaxdae.Checkpointing("ckpt", every=float("inf")),
            r"`Checkpointing.every` must be an integer ≥ 1 .*got inf",
        ),
        (
            lambda: jaxdae.Checkpointing(""),
            r"`Checkpointing.path` is empty.*Checkpointing\(\"ckpt\"\)",
        ),
        (lambda: jaxdae.Batching(batch_size=1.5), r"`Batching.batch_size` must be an integer ≥ 1"),
        (lambda: jaxdae.Batching(seed=1.5), r"`Batching.seed` must be an integer in \[-2\*\*63"),
        (lambda: jaxdae.Batching(seed=2**70), r"`Batching.seed` must be an integer in \[-2\*\*63"),
        (
            lambda: jaxdae.Failures(penalty=-1.0),
            r"`Failures.penalty` must be non-negative.*rewards",
        ),
    ],
)
def test_option_values_are_refused_naming_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_keyword_that_conflicts_with_an_option_object_is_refused():
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)
    targets = jnp.linspace(0.5, 2.0, 3)
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(
            ValueError,
            match=r"`batch_size=3` conflicts with `batching=jaxdae.Batching\("
            r"batch_size=2, \.\.\.\)`",
        ),
    ):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            batching=jaxdae.Batching(batch_size=2),
            batch_size=3,
            reporting=QUIET,
        )
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="path` is empty"):
        jaxdae.tune(
            params,
            _quadratic,
            targets,
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            checkpoint="",
            reporting=QUIET,
        )
    assert jaxdae.Batching(batch_size=2.0, seed=np.int64(3)) == jaxdae.Batching(2, 3)
    assert type(jaxdae.Checkpointing(".", every=4.0).every) is int


def test_option_objects_check_their_values(unchecked):
    with pytest.raises(ValueError, match="every"):
        jaxdae.Checkpointing("ckpt", every=0)
    with pytest.raises(ValueError, match="on_nonfinite"):
        jaxdae.Failures(on_nonfinite="ignore")
    with pytest.raises(TypeError, match="jaxdae.Batching"):
        jaxdae.tune(
            jaxdae.Baumgarte(1.0, 1.0),
            _quadratic,
            jnp.ones(2),
            _square,
            optimizer=OPTIMIZER,
            steps=1,
            batching=3,
        )
