"""Faults in long jobs: mismatched and damaged checkpoints of `batch_map` and `tune`, bad
members of a batch or a tuning run, and a kill (`SIGKILL`) at several points of a long job,
resumed to the results of an uninterrupted run, bit for bit."""

import json
import os
import signal
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdae

# --- batch_map: a sweep's identity -------------------------------------------------------


def _scaled(scale):
    """The same function (name and code) closing over another value."""

    def sweep(x):
        return jnp.sin(x) * scale

    return sweep


def _bound(x, scale):
    return jnp.cos(x) * scale


XS = jnp.linspace(0.0, 1.0, 10)


def _sweep(fn, directory, *args, **kwargs):
    return jaxdae.batch_map(
        fn, *(args or (XS,)), chunk_size=4, checkpoint=directory, progress=False, **kwargs
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda value: _scaled(value),  # a Python float closed over
        lambda value: _scaled(jnp.array([value, 1.0])[0]),  # an array closed over
        lambda value: eqx.Partial(_bound, scale=jnp.asarray(value)),  # an eqx.Partial argument
    ],
)
def test_a_changed_closure_is_another_sweep(tmp_path, make):
    directory = tmp_path / "sweep"
    first = _sweep(make(1.0), directory)
    np.testing.assert_allclose(first, jaxdae.batch_map(make(1.0), XS))
    stamps = [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    assert len(stamps) == 3
    # The same closure resumes (nothing computed again) ...
    again = _sweep(make(1.0), directory)
    np.testing.assert_array_equal(again, first)
    assert stamps == [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    # ... another value of it is refused, not answered with the old chunks.
    with pytest.raises(
        ValueError,
        match=f"{directory} holds the chunks of another sweep "
        r"\(another function .*Use another `checkpoint`",
    ):
        _sweep(make(2.0), directory)


def test_a_changed_simulation_end_is_another_sweep(tmp_path):
    """The reported case: the end time of the simulations, closed over, changed."""
    system = jaxdae.examples.CartesianPendulum()

    def make(t1):
        def final_state(angle):
            q0, v0 = system.state_from_angle(angle, 0.0)
            return jaxdae.simulate(
                system,
                jaxdae.Baumgarte(4.0, 4.0),
                0.0,
                t1,
                q0,
                v0,
                throw=False,
                rtol=1e-5,
                atol=1e-7,
            ).q[-1]

        return final_state

    angles = jnp.array([0.2, 0.4, 0.6])
    directory = tmp_path / "sweep"
    jaxdae.batch_map(make(0.5), angles, checkpoint=directory, progress=False)
    with pytest.raises(ValueError, match="another function"):
        jaxdae.batch_map(make(1.0), angles, checkpoint=directory, progress=False)


def test_other_arguments_or_layout_name_what_differs(tmp_path):
    directory = tmp_path / "sweep"
    _sweep(_scaled(1.0), directory)
    with pytest.raises(ValueError, match=r"another sweep \(other arguments\)"):
        _sweep(_scaled(1.0), directory, XS + 1)
    with pytest.raises(ValueError, match=r"another sweep \(.*another batch size, chunk size"):
        jaxdae.batch_map(_scaled(1.0), XS, chunk_size=5, checkpoint=directory, progress=False)


# --- batch_map: damaged files --------------------------------------------------------------


def test_a_damaged_chunk_is_computed_again(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    full = _sweep(fn, directory)
    first, second = directory / "chunk_000000.npz", directory / "chunk_000001.npz"
    stamp = first.stat().st_mtime_ns
    second.write_bytes(second.read_bytes()[:40])  # truncated
    with pytest.warns(UserWarning, match="chunk_000001.npz is damaged.*computed again"):
        resumed = _sweep(fn, directory)
    np.testing.assert_array_equal(resumed, full)
    assert first.stat().st_mtime_ns == stamp  # the intact chunk is kept
    np.load(second).close()  # and the damaged one is whole again
    second.write_bytes(b"")  # an empty file
    with pytest.warns(UserWarning, match="chunk_000001.npz is damaged"):
        np.testing.assert_array_equal(_sweep(fn, directory), full)


def test_a_damaged_sweep_file_is_written_again_keeping_the_chunks(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    full = _sweep(fn, directory)
    stamps = [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    meta = directory / "sweep.json"
    meta.write_text(meta.read_text()[:25])
    with pytest.warns(
        UserWarning, match="sweep.json is damaged.*chunks of this sweep on disk are kept"
    ):
        resumed = _sweep(fn, directory)
    np.testing.assert_array_equal(resumed, full)
    assert stamps == [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    json.loads(meta.read_text())
    # With another sweep's chunks next to a damaged (or missing) sweep.json: refused.
    meta.write_text("{")
    with pytest.raises(
        ValueError, match="holds the chunks of another sweep.*sweep.json is damaged"
    ):
        _sweep(_scaled(4.0), directory)
    meta.unlink()
    with pytest.raises(ValueError, match="sweep.json is missing"):
        _sweep(_scaled(4.0), directory)


# --- tune: a run's identity, damaged checkpoints, bad scenarios, bad steps -------------------

TARGETS = jnp.array([0.5, 1.0, 1.5])


def _quadratic(model, target):
    return model.kd * target


def _square(output):
    return jnp.sum((output - 1.0) ** 2)


def _params():
    return jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: f.kd)


# One optimizer for the runs that do not vary it: `tune` compiles its step per optimizer
# object (a new `optax.adam(0.1)` is new functions), so the runs below share their steps'
# programs where their other settings match.
_ADAM = optax.adam(0.1)


def _tune(
    directory, steps=2, *, penalty=1e3, seed=0, ensemble=False, resume=True, log=None, **kwargs
):
    kwargs.setdefault("optimizer", _ADAM)
    kwargs.update(
        checkpointing=None
        if directory is None
        else jaxdae.Checkpointing(directory, every=1, resume=resume),
        batching=jaxdae.Batching(seed=seed, ensemble=ensemble),
        reporting=jaxdae.Reporting(log=log, progress=False),
        failures=jaxdae.Failures(penalty=penalty),
    )
    simulate_fn = kwargs.pop("simulate_fn", _quadratic)
    loss = kwargs.pop("loss", _square)
    scenarios = kwargs.pop("scenarios", TARGETS)
    return jaxdae.tune(_params(), simulate_fn, scenarios, loss, steps=steps, **kwargs)


def _offset(offset):
    def simulate_fn(model, target):
        return model.kd * target + offset

    return simulate_fn


def _weighted(weight):
    def loss(output):
        return weight * jnp.sum((output - 1.0) ** 2)

    return loss


# The run that each case below changes: one problem (the same functions) for every case,
# so that the cases share its compiled steps.
_BASE = dict(loss=_weighted(1.0), simulate_fn=_offset(0.0))


@pytest.mark.parametrize(
    "change, differs",
    [
        (dict(scenarios=TARGETS + 1), "other scenarios"),
        (dict(optimizer=optax.adam(0.2)), "another problem"),
        (dict(loss=_weighted(2.0)), "another problem"),
        (dict(simulate_fn=_offset(0.5)), "another problem"),
        (dict(penalty=5.0), "another problem"),
        (dict(seed=1), "other initial parameters or another seed"),
    ],
)
def test_a_tuning_checkpoint_is_resumed_only_by_its_own_run(tmp_path, change, differs):
    base = _BASE
    first = _tune(tmp_path, **base)
    # The same run resumes (and may go on for more steps) ...
    more = _tune(tmp_path, steps=3, **base)
    assert more.step == 3 and more.history["loss"][:2] == first.history["loss"]
    # ... another one is refused, with what differs.
    with pytest.raises(
        ValueError,
        match=f"checkpoint in {tmp_path} was written by a run with "
        f"{differs}.*Use another `checkpoint` directory",
    ):
        _tune(tmp_path, steps=3, **(base | change))


def test_a_damaged_tuning_checkpoint_names_the_file(tmp_path):
    _tune(tmp_path)
    meta = tmp_path / "checkpoint.json"
    text = meta.read_text()
    meta.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match="checkpoint.json is damaged.*resume=False"):
        _tune(tmp_path, steps=3)
    meta.write_text(text)
    state = tmp_path / json.loads(text)["state"]
    state.write_bytes(state.read_bytes()[:5])
    with pytest.raises(ValueError, match=f"checkpoint in {tmp_path} is damaged: {state.name}"):
        _tune(tmp_path, steps=3)
    fresh = _tune(tmp_path, steps=3, resume=False)  # the fix the message names
    assert fresh.step == 3


def _raises_for_negative(model, target):
    return eqx.error_if(model.kd * target, target < 0, "the target must be non-negative")


@pytest.mark.parametrize("ensemble", [False, True])
def test_a_scenario_that_raises_is_named_and_counted_as_failed(tmp_path, ensemble):
    """One scenario that raises (here a check on its own data) does not lose the run: it is
    named, and counts as failed, as a solve that failed with `throw=False` would."""
    targets = jnp.array([0.5, 1.0, -2.0, 1.5])
    with pytest.warns(
        UserWarning,
        match=r"in step 1, 1 scenario\(s\) raise when simulated on "
        r"their own \(scenario 2: .*non-negative\)",
    ):
        result = _tune(
            tmp_path,
            scenarios=targets,
            simulate_fn=_raises_for_negative,
            penalty=7.0,
            ensemble=ensemble,
        )
    assert result.step == 2 and result.history["failed_scenarios"] == [[2], [2]]
    # The others tune as they would without it: the same gradient steps (the failed
    # scenario adds `penalty / 4` to the mean loss and nothing to the gradient).
    alone = _tune(None, scenarios=targets[jnp.array([0, 1, 3])], simulate_fn=_quadratic)
    np.testing.assert_allclose(
        result.history["scenario_loss"][0], (3 * alone.history["scenario_loss"][0] + 7.0) / 4
    )
    assert float(result.model.kd) != 1.0
    # The checkpoint remembers it: a resume does not need to find it again.
    assert json.loads((tmp_path / "checkpoint.json").read_text())["excluded"] == [2]
    more = _tune(
        tmp_path,
        steps=3,
        scenarios=targets,
        simulate_fn=_raises_for_negative,
        penalty=7.0,
        ensemble=ensemble,
    )
    assert more.history["failed_scenarios"] == [[2], [2], [2]]
    # Every scenario raising stops the run, with the scenarios named.
    with pytest.raises(
        ValueError,
        match=r"Step 1 stopped: every scenario raises.*scenario 0: "
        r".*non-negative",
    ) as info:
        _tune(None, scenarios=-targets - 3, simulate_fn=_raises_for_negative)
    assert info.value.result.step == 0


def _sqrt_model(model, target):
    return jnp.sqrt(model.kd - target)  # nan (value and gradient) for target > kd


def test_failed_scenarios_are_named_in_the_history_and_the_log(tmp_path):
    log = tmp_path / "log.csv"
    with pytest.warns(UserWarning, match=r"at step 1, scenario\(s\) \[1, 3\] failed"):
        result = _tune(
            None,
            scenarios=jnp.array([0.0, 5.0, 0.5, 7.0]),
            simulate_fn=_sqrt_model,
            loss=lambda x: x,
            log=log,
        )
    assert result.history["failed_scenarios"] == [[1, 3], [1, 3]]
    assert result.history["num_failed"] == [2, 2]
    assert log.read_text().splitlines()[1].endswith(",1 3")


def test_an_update_out_of_the_gains_domain_is_named_and_not_applied(tmp_path):
    """`optax.sgd(1e6)` on a raw (not parametrized) gain makes it negative at step 1."""
    params = jaxdae.Baumgarte(1.0, 1.0)
    with pytest.raises(
        ValueError,
        match=r"Step 2's update took the parameters out of their "
        r"domain \(Baumgarte: `kd` must be .*Got values -.*it "
        r"was not applied.*lower the learning rate",
    ) as info:
        jaxdae.tune(
            params,
            _quadratic,
            TARGETS,
            _square,
            steps=5,
            optimizer=optax.chain(optax.sgd(1e-3), _huge_from_step(1)),
            checkpointing=jaxdae.Checkpointing(tmp_path, every=1),
            reporting=jaxdae.Reporting(progress=False),
        )
    kept = info.value.result
    assert kept.step == 1 and float(kept.model.kd) > 0
    # The checkpoint holds the kept step.
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 1


def _huge_from_step(first):
    """Scales the updates by 1e6 from step `first` (counting from 0)."""

    def update(updates, count, params=None):
        scale = jnp.where(count >= first, 1e6, 1.0)
        return jax.tree.map(lambda u: u * scale, updates), count + 1

    return optax.GradientTransformation(lambda params: jnp.zeros((), int), update)


def test_a_nonfinite_update_keeps_and_saves_the_last_good_parameters(tmp_path):
    with pytest.raises(FloatingPointError, match="Step 1: the update is not finite") as info:
        jaxdae.tune(
            _params(),
            _quadratic,
            TARGETS,
            _square,
            steps=3,
            optimizer=optax.adam(0.1),
            regularization=lambda m: jnp.sqrt(-m.kd),
            checkpointing=jaxdae.Checkpointing(tmp_path),
            reporting=jaxdae.Reporting(progress=False),
        )
    kept = info.value.result
    np.testing.assert_array_equal(kept.model.kd, 1.0)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 1


# --- kill (SIGKILL) and resume ----------------------------------------------------------------

# The job, run in a child process (killed) and in the test process (resumed there): the same
# source in both, so that the functions are the same (name, code and program).
JOB = """
import jax
import jax.numpy as jnp
import optax

import jaxdae

jax.config.update("jax_enable_x64", True)
SYSTEM = jaxdae.examples.CartesianPendulum()


def cheap(x, y):
    return jnp.sin(x) * y + jnp.cos(x * y), jnp.exp(-x * x)


def pendulum(angle, kd):
    q0, v0 = SYSTEM.state_from_angle(angle, 0.0)
    sol = jaxdae.simulate(SYSTEM, jaxdae.Baumgarte(kd, kd), 0.0, 0.5, q0 * 1.05, v0,
                          ts=jnp.linspace(0.0, 0.5, 4), throw=False, rtol=1e-6, atol=1e-8)
    return sol.q, sol.phi


XS = jnp.linspace(0.0, 2.0, 8)
ANGLES = jnp.linspace(0.1, 1.0, 4)


def sweep(kind, directory):
    if kind == "cheap":
        return jaxdae.batch_map(cheap, XS, 1.0 + XS, chunk_size=1, checkpoint=directory,
                                progress=False)
    return jaxdae.batch_map(pendulum, ANGLES, 2.0 + ANGLES, chunk_size=1,
                            checkpoint=directory, progress=False)


def quadratic(model, target):
    return model.kd * target


def loss(output):
    return jnp.sum((output - 1.0) ** 2)


def pendulum_run(formulation, angle):
    q0, v0 = SYSTEM.state_from_angle(angle, 0.3)
    return jaxdae.simulate(SYSTEM, formulation, 0.0, 0.5, q0 * 1.1, v0,
                           ts=jnp.linspace(0.0, 0.5, 6), throw=False, rtol=1e-6, atol=1e-8)


def tuning(kind, steps, directory=None, callback=None):
    params = jaxdae.parametrize(jaxdae.Baumgarte(1.0, 1.0), lambda f: (f.kd, f.kp))
    if kind == "cheap":
        problem = (quadratic, jnp.linspace(0.5, 2.0, 6), loss)
    else:
        problem = (pendulum_run, ANGLES, jaxdae.ConstraintViolation())
    return jaxdae.tune(params, *problem, optimizer=optax.adam(0.1), steps=steps,
                       batching=jaxdae.Batching(batch_size=3),
                       checkpointing=None if directory is None else jaxdae.Checkpointing(
                           directory, every=1),
                       reporting=jaxdae.Reporting(progress=False, callback=callback))
"""

CHILD = """
import sys, time
import jaxdae._tuning._batch
exec(open(sys.argv[1]).read())
what, kind, directory = sys.argv[2:5]
if what == "sweep":
    write = jaxdae._tuning._batch.atomic_write

    def slow_write(path, data):  # time for the parent to kill between two chunks
        write(path, data)
        time.sleep(0.3)

    jaxdae._tuning._batch.atomic_write = slow_write
    sweep(kind, directory)
else:
    tuning(kind, 40, directory, callback=lambda step, row: time.sleep(0.3))
"""


def _job():
    namespace = {}
    exec(JOB, namespace)
    return namespace


def _kill_when(tmp_path, what, kind, directory, ready):
    """Runs the job in a child process and kills it (`SIGKILL`) as soon as `ready()`."""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "child.py").write_text(CHILD)
    child = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "child.py"),
            str(tmp_path / "job.py"),
            what,
            kind,
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    try:
        while not ready():
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the child did not get there in 300 s"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL


def _check_sweep_resume(tmp_path, kind, after):
    job = _job()
    directory = tmp_path / f"sweep_{after}"
    chunk = directory / f"chunk_{after:06d}.npz"
    _kill_when(tmp_path, "sweep", kind, directory, chunk.exists)
    kept = {path.name: path.stat().st_mtime_ns for path in directory.glob("chunk_*.npz")}
    assert f"chunk_{after:06d}.npz" in kept and len(kept) < len(
        job["XS" if kind == "cheap" else "ANGLES"]
    )
    resumed = job["sweep"](kind, directory)
    for name, stamp in kept.items():  # the chunks done before the kill are kept
        assert (directory / name).stat().st_mtime_ns == stamp
    uninterrupted = job["sweep"](kind, tmp_path / f"whole_{after}")
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(uninterrupted), strict=False):
        np.testing.assert_array_equal(a, b)


def _checkpoint_step(directory):
    try:
        return json.loads((directory / "checkpoint.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


def _check_tuning_resume(tmp_path, kind, after, steps):
    job = _job()
    directory = tmp_path / f"tune_{after}"
    _kill_when(tmp_path, "tune", kind, directory, lambda: _checkpoint_step(directory) >= after)
    assert after <= _checkpoint_step(directory) < 40
    resumed = job["tuning"](kind, steps, directory)
    uninterrupted = job["tuning"](kind, steps)
    assert resumed.step == steps
    for a, b in zip(
        jax.tree.leaves((resumed.params, resumed.opt_state, resumed.key)),
        jax.tree.leaves((uninterrupted.params, uninterrupted.opt_state, uninterrupted.key)),
        strict=False,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed.history["loss"] == uninterrupted.history["loss"]
    assert resumed.history["failed_scenarios"] == uninterrupted.history["failed_scenarios"]


def test_a_killed_sweep_resumes_bit_identically(tmp_path):
    _check_sweep_resume(tmp_path, "cheap", 2)


def test_a_killed_tuning_run_resumes_bit_identically(tmp_path):
    _check_tuning_resume(tmp_path, "cheap", 2, 6)


@pytest.mark.slow
@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_killed_pendulum_sweep_resumes_bit_identically(tmp_path, after):
    _check_sweep_resume(tmp_path, "pendulum", after)


@pytest.mark.slow
@pytest.mark.parametrize("after", [1, 3, 5])
def test_a_killed_pendulum_tuning_run_resumes_bit_identically(tmp_path, after):
    _check_tuning_resume(tmp_path, "pendulum", after, 7)


# --- losses of a failed solve -----------------------------------------------------------------


@pytest.mark.slow
def test_the_loss_of_a_failed_solve_is_inf_with_a_zero_gradient():
    """One rule for every loss, tune's rule with `inf` for the penalty: a failed solve is
    never a small loss, and its gradient is zero, never nan. (Under the caller's `jit`, with
    a gain given as a Python float, which the diagnostics' backward pass receives as a typed
    Python scalar.)"""
    system = jaxdae.examples.CartesianPendulum()
    fast, slow = (system.state_from_angle(0.5, rate) for rate in (200.0, 0.0))
    ts = jnp.linspace(0.0, 1.0, 6)
    losses = [
        jaxdae.ConstraintViolation(),
        jaxdae.TrackingError(lambda t: jnp.zeros(2)),
        jaxdae.ControlEffort(),
        jaxdae.SettlingTime(1e-3),
        jaxdae.ConstraintViolation() + 0.0 * jaxdae.ControlEffort(),
    ]

    @jax.jit
    def values(kd, q0, v0):  # 2,435 steps from `fast`, 39 from `slow`
        sol = jaxdae.simulate(
            system,
            jaxdae.Baumgarte(kd, 1.0),
            0.0,
            1.0,
            q0 * 1.1,
            v0,
            ts=ts,
            throw=False,
            max_steps=64,
        )
        return jnp.stack([loss(sol) for loss in losses]), sol.succeeded

    (failed, succeeded) = values(1.0, *fast)
    assert not bool(succeeded)
    np.testing.assert_array_equal(failed, np.inf)
    gradient = jax.jacobian(lambda kd: values(kd, *fast)[0])(jnp.asarray(1.0))
    np.testing.assert_array_equal(gradient, 0.0)
    ok, succeeded = values(1.0, *slow)
    assert bool(succeeded) and np.all(np.isfinite(ok))
