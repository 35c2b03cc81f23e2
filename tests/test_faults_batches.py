"""Faults in batches and in saved work: an ensemble member whose model turns non-finite,
the row of a sweep that raises, members of a batched consistent initialization that have
no solution, and checkpoints that were edited, copied over one another or asked for less
than they hold."""

import json
import shutil

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae

from .test_faults_jobs import XS, _scaled, _sweep, _tune

# --- simulate_ensemble: a member whose model turns non-finite ------------------------------


class _Barrier(jaxdae.examples.CartesianPendulum):
    """The pendulum, with forces that are zero for `x ≥ −0.7` and nan beyond."""

    def generalized_forces(self, t, q, v):
        gap = jnp.sqrt(q[0] + 0.7)
        return jnp.zeros(2) + (gap - gap)


BARRIER = _Barrier()
# Released at rest from these angles: only the third swings past x = −0.7 (sin 1 = 0.84).
ANGLES = jnp.array([0.2, 0.4, 1.0, 0.6])
ENSEMBLE_TS = jnp.linspace(0.0, 1.5, 7)
NON_FINITE = dict(rtol=1e-7, atol=1e-9)
DT_MIN = int(jaxdae.RESULTS.dt_min_reached._value)


def _starts(angles):
    return jax.vmap(lambda a: BARRIER.state_from_angle(a, 0.0))(angles)


@eqx.filter_jit
def _barrier_ensemble(formulation, q0, v0):
    return jaxdae.simulate_ensemble(
        BARRIER, formulation, 0.0, 1.5, q0, v0, ts=ENSEMBLE_TS, throw=False, **NON_FINITE
    )


def test_an_ensemble_member_whose_model_turns_non_finite_stops_alone():
    """Traced: the member stops at the barrier with `dt_min_reached` (what a traced
    `simulate` reports for it), and the others reach `t1` as they do with a good member in
    its place (the same compiled solve)."""
    formulation = jaxdae.ModifiedLagrange(5.0, 10.0, 25.0)
    sol = _barrier_ensemble(formulation, *_starts(ANGLES))
    good = _barrier_ensemble(formulation, *_starts(ANGLES.at[2].set(0.3)))
    assert np.asarray(sol.result._value).tolist() == [0, 0, DT_MIN, 0]
    assert good.succeeded.all()
    others = np.array([0, 1, 3])
    np.testing.assert_allclose(sol.q[others], good.q[others], atol=1e-6)
    np.testing.assert_array_equal(sol.t_final[others], 1.5)
    # The member stopped where it reached the barrier: its later saves are `inf`.
    assert 0.5 < float(sol.t_final[2]) < 1.5
    np.testing.assert_allclose(sol.q_final[2, 0], -0.7, atol=1e-6)
    later = ENSEMBLE_TS > sol.t_final[2]
    assert np.all(np.isinf(sol.q[2][later])) and np.all(np.isfinite(sol.q[2][~later]))
    assert int(sol.stats["num_steps"][0]) < 400


@pytest.mark.slow
@pytest.mark.parametrize(
    "formulation",
    [jaxdae.ModifiedLagrange(5.0, 10.0, 25.0), jaxdae.Baumgarte(10.0, 25.0)],
    ids=["cannot-fail", "can-fail"],
)
def test_an_ensemble_member_whose_model_turns_non_finite_is_named_as_alone(formulation):
    """Eagerly, the member's result names the non-finite term, as `simulate` alone does,
    at the same time; the others match their own `simulate` solves; `throw=True` raises
    with the member named."""
    q0, v0 = _starts(ANGLES)
    sol = jaxdae.simulate_ensemble(
        BARRIER, formulation, 0.0, 1.5, q0, v0, ts=ENSEMBLE_TS, throw=False, **NON_FINITE
    )
    alone = [
        jaxdae.simulate(
            BARRIER, formulation, 0.0, 1.5, q, v, ts=ENSEMBLE_TS, throw=False, **NON_FINITE
        )
        for q, v in zip(q0, v0, strict=True)
    ]
    assert [int(s.result._value) for s in alone] == np.asarray(sol.result._value).tolist()
    assert int(sol.result._value[2]) == int(jaxdae.RESULTS.non_finite_forces._value)
    np.testing.assert_allclose(sol.t_final[2], alone[2].t_final, rtol=1e-6)
    np.testing.assert_allclose(sol.q_final[2], alone[2].q_final, atol=1e-6)
    for i in (0, 1, 3):
        for field in ("q", "v", "q_final", "t_final"):
            np.testing.assert_allclose(
                getattr(sol, field)[i], getattr(alone[i], field), atol=1e-6, err_msg=field
            )
    with pytest.raises(
        jaxdae.SimulationError, match=r"(?s)non-finite generalized forces.*batch element \(2,\)"
    ):
        jaxdae.simulate_ensemble(
            BARRIER, formulation, 0.0, 1.5, q0, v0, ts=ENSEMBLE_TS, **NON_FINITE
        )
    # Fixed steps: the member stops at the step that left the domain (`non_finite_state`,
    # as on its own); the others take the same steps as on their own.
    fixed = dict(
        stepsize_controller=diffrax.ConstantStepSize(), dt0=0.01, ts=ENSEMBLE_TS, throw=False
    )
    sol = jaxdae.simulate_ensemble(BARRIER, formulation, 0.0, 1.5, q0, v0, **fixed)
    alone = [
        jaxdae.simulate(BARRIER, formulation, 0.0, 1.5, q, v, **fixed)
        for q, v in zip(q0, v0, strict=True)
    ]
    assert [int(s.result._value) for s in alone] == np.asarray(sol.result._value).tolist()
    assert int(sol.result._value[2]) == int(jaxdae.RESULTS.non_finite_state._value)
    for i in (0, 1, 3):
        np.testing.assert_allclose(sol.q[i], alone[i].q, rtol=0, atol=1e-12)
    # The others' loss has a finite gradient (the sweep stops the member's rows too).
    grad = jax.grad(
        lambda q0: jnp.sum(
            jaxdae.simulate_ensemble(
                BARRIER, formulation, 0.0, 1.5, q0, v0, throw=False, **NON_FINITE
            ).q_final[np.array([0, 1, 3])]
            ** 2
        )
    )(q0)
    assert np.all(np.isfinite(grad)) and np.any(grad[0] != 0)


# --- batch_map: the row that raises --------------------------------------------------------


def _raises_at_row_7(x):
    return eqx.error_if(jnp.sin(x), x == XS[7], "row 7 is bad")


@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_row_that_raises_is_named_in_the_whole_batch(tmp_path, checkpointed):
    """Chunks of 3 rows: row 7 is the second row of chunk 2, and is named as row 7."""
    kwargs = dict(checkpoint=tmp_path, progress=False) if checkpointed else {}
    with pytest.raises(RuntimeError, match="row 7 is bad") as info:
        jaxdae.batch_map(_raises_at_row_7, XS, chunk_size=3, **kwargs)
    note = " ".join(getattr(info.value, "__notes__", []))
    assert "row 7 of the batch raises, in chunk 2 (rows 6 to 8)" in note
    if checkpointed:  # the chunks before it are saved
        assert sorted(p.name for p in tmp_path.glob("chunk_*.npz")) == [
            "chunk_000000.npz",
            "chunk_000001.npz",
        ]


# --- batch_map: chunk files ---------------------------------------------------------------


def test_a_chunk_copied_over_another_is_refused_naming_both(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    full = _sweep(fn, directory)
    first, second = directory / "chunk_000000.npz", directory / "chunk_000001.npz"
    kept = second.read_bytes()
    shutil.copy(first, second)  # right format and sweep, wrong chunk
    with pytest.raises(
        ValueError,
        match=r"chunk_000001.npz holds chunk 0 of this sweep "
        r"\(\w{12}\), not chunk 1: a chunk file copied",
    ):
        _sweep(fn, directory)
    _sweep(_scaled(4.0), tmp_path / "other")  # another sweep's chunk 1
    shutil.copy(tmp_path / "other" / "chunk_000001.npz", second)
    with pytest.raises(
        ValueError,
        match=r"chunk_000001.npz holds chunk 1 of another sweep "
        r"\((\w{12})\), not chunk 1 of this sweep "
        r"\((?!\1)\w{12}\)",
    ):
        _sweep(fn, directory)
    second.write_bytes(kept)
    np.testing.assert_array_equal(_sweep(fn, directory), full)


def test_every_entry_of_a_chunk_file_is_covered_by_its_digest(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    full = _sweep(fn, directory)
    path = directory / "chunk_000001.npz"
    with np.load(path) as data:
        entries = {name: data[name] for name in data.files}
    entries["arr_0"] = entries["arr_0"] + 1.0  # a value edited, the file rewritten whole
    with open(path, "wb") as file:
        np.savez(file, **entries)
    with pytest.warns(
        UserWarning,
        match="chunk_000001.npz is damaged \\(its content does not "
        "match the digest.*computed again",
    ):
        np.testing.assert_array_equal(_sweep(fn, directory), full)
    meta = directory / "sweep.json"
    record = json.loads(meta.read_text())
    record["size"] = 4
    meta.write_text(json.dumps(record))
    with pytest.warns(UserWarning, match="sweep.json is damaged \\(its content does not match"):
        np.testing.assert_array_equal(_sweep(fn, directory), full)


def test_a_sweep_resumed_with_fewer_rows_is_refused_saying_why(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    _sweep(fn, directory)
    with pytest.raises(
        ValueError,
        match=r"another sweep .* It holds a sweep of 10 rows in 3 "
        r"chunks, this call has 6 rows in 2 chunks: a "
        r"directory holds one sweep",
    ):
        _sweep(fn, directory, XS[:6])


# --- tune: checkpoints ----------------------------------------------------------------------


def test_a_tuning_checkpoint_holds_exactly_the_steps_asked_for(tmp_path):
    three = _tune(tmp_path, steps=3)
    again = _tune(tmp_path, steps=3)  # as many steps as it holds: as saved
    assert again.step == 3 and again.history["loss"] == three.history["loss"]
    with pytest.raises(
        ValueError,
        match=r"holds 3 steps of this run, more than the 2 asked "
        r"for.*`steps=3`.*`resume=False`",
    ):
        _tune(tmp_path, steps=2)
    fresh = _tune(tmp_path, steps=2, resume=False)
    assert fresh.step == 2 and fresh.history["loss"] == three.history["loss"][:2]


def test_an_edited_tuning_history_is_refused(tmp_path):
    _tune(tmp_path, steps=2)
    meta = tmp_path / "checkpoint.json"
    record = json.loads(meta.read_text())
    record["history"]["loss"][0] = 0.0
    meta.write_text(json.dumps(record))
    with pytest.raises(
        ValueError,
        match=r"checkpoint.json is damaged \(its content does not "
        r"match the digest.*resume=False",
    ):
        _tune(tmp_path, steps=3)


def test_a_tuning_state_copied_over_another_is_refused_naming_both(tmp_path):
    _tune(tmp_path / "one", steps=1)
    _tune(tmp_path / "two", steps=2)
    # The state of step 1, renamed as that of step 2 (right format, wrong step).
    shutil.copy(tmp_path / "one" / "state_000001.eqx", tmp_path / "two" / "state_000002.eqx")
    with pytest.raises(
        ValueError,
        match=r"state_000002.eqx holds step 1 of run (\w{12}), but "
        r"checkpoint.json names step 2 of run \1 \(a state "
        r"file copied",
    ):
        _tune(tmp_path / "two", steps=3)
    # A whole checkpoint of another run (another seed): both runs named.
    _tune(tmp_path / "seed", steps=2, seed=1)
    for name in ("checkpoint.json", "state_000002.eqx"):
        shutil.copy(tmp_path / "seed" / name, tmp_path / "two" / name)
    with pytest.raises(
        ValueError,
        match=r"another seed: resuming would continue that run "
        r"\(run (\w{12}) at step 2 on disk, run (?!\1)\w{12} "
        r"here\)",
    ):
        _tune(tmp_path / "two", steps=3)


# --- consistent_initial_state: a member with no consistent state -------------------------


class _Shrinking(jaxdae.LagrangianSystem):
    """`Φ = q₀² − 1 + t`: consistent states for `t ≤ 1` only."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 - 1.0 + t])


def _projected(t):
    """The consistent state nearest to `(Q_GUESS, V_GUESS)` at `t ≤ 1` (`M = I`)."""
    x = np.sqrt(1.0 - t)
    return np.array([x, 0.1]), np.array([-0.5 / x, 0.2])


Q_GUESS, V_GUESS = jnp.array([0.8, 0.1]), jnp.array([0.3, 0.2])


def test_no_consistent_state_is_a_flag_with_throw_false():
    q, v, found = jaxdae.consistent_initial_state(_Shrinking(), 0.5, Q_GUESS, V_GUESS, throw=False)
    assert bool(found)
    np.testing.assert_allclose(np.concatenate([q, v]), np.concatenate(_projected(0.5)), atol=1e-12)
    q, v, found = jaxdae.consistent_initial_state(_Shrinking(), 2.0, Q_GUESS, V_GUESS, throw=False)
    assert not bool(found) and np.all(np.isnan(q)) and np.all(np.isnan(v))
    with pytest.raises(ValueError, match="No consistent initial state found"):
        jaxdae.consistent_initial_state(_Shrinking(), 2.0, Q_GUESS, V_GUESS)


@pytest.mark.slow
def test_a_batch_member_with_no_consistent_state_is_reported_alone():
    """Under `vmap`, `throw=False`: the member with no consistent state is flagged (and
    `nan`), the others are projected as on their own; `throw=True` raises for the batch."""
    times = jnp.array([0.0, 2.0, 0.5])
    q, v, found = jax.jit(
        jax.vmap(
            lambda t: jaxdae.consistent_initial_state(
                _Shrinking(), t, Q_GUESS, V_GUESS, throw=False
            )
        )
    )(times)
    assert found.tolist() == [True, False, True]
    assert np.all(np.isnan(q[1])) and np.all(np.isnan(v[1]))
    for i in (0, 2):
        np.testing.assert_allclose(
            np.concatenate([q[i], v[i]]), np.concatenate(_projected(float(times[i]))), atol=1e-12
        )
    with pytest.raises(Exception, match="No consistent initial state found"):
        jax.vmap(lambda t: jaxdae.consistent_initial_state(_Shrinking(), t, Q_GUESS, V_GUESS))(
            times
        )


def test_chunks_of_outputs_of_size_zero():
    # A `Solution` without nonholonomic constraints has `psi` of shape (N, 0).
    # (and a Python number among the outputs, as a `Solution`'s step limit)
    out = jaxdae.batch_map(lambda x: (2 * x, jnp.zeros((3, 0)), 7), jnp.arange(5.0), chunk_size=2)
    np.testing.assert_array_equal(out[0], 2 * np.arange(5.0))
    assert out[1].shape == (5, 3, 0)
    np.testing.assert_array_equal(out[2], [7] * 5)
    assert jaxdae.batch_map(lambda x: 2 * x, jnp.zeros(0), chunk_size=4).shape == (0,)


def test_no_scenarios_and_a_vector_loss_are_named():
    with pytest.raises(ValueError, match="holds no scenario"):
        _tune(None, scenarios=jnp.zeros(0))
    with pytest.raises(TypeError, match="`loss` must return a scalar"):
        _tune(None, loss=lambda output: jnp.stack([output, output]))
