"""[`jaxdae.tune`][]: gradient-based tuning of gains over a batch of scenarios, with optax."""

import csv
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._compilation._sharding import auto_mesh
from .._custom_types import Array, PyTree
from .._formulations._base import AbstractFormulation
from ._batch import (
    _batch_map,
    _pad,
    _place,
    batch_size_of,
    batch_spec,
    check_ensemble_output,
    chunk_layout,
)
from ._checkpoint import HISTORY_COLUMNS, load_checkpoint, save_checkpoint
from ._options import Batching, Checkpointing, Failures, Reporting, options_from_keywords
from ._outcome import output_failed
from ._parametrization import unwrap
from ._persist import (
    atomic_write_text,
    fingerprint as run_fingerprint,
    program_fingerprint,
    progress_bar,
)


class TuneResult(eqx.Module):
    """What [`jaxdae.tune`][] returns.

    **Fields:**

    - `params`: the tuned parameters, in the form passed in (parametrizations kept).
    - `model`: `jaxdae.unwrap(params)`: the tuned formulation / controller with plain gains.
    - `history`: a dict of per-step lists (`HISTORY_COLUMNS`): `loss` (batch loss at the
        parameters before the step, failed scenarios counted at the penalty, plus the
        regularization), `scenario_loss`, `regularization`, `num_failed`, `grad_norm`,
        `skipped` (a non-finite update that was not applied), `time` (seconds since start,
        including compilation), `failed_scenarios` (the indices of the scenarios that
        failed at that step, into `scenarios`).
    - `opt_state`: the optimizer state after the last step.
    - `key`: the PRNG key after the last step.
    - `step`: the number of steps done.
    """

    params: PyTree
    model: PyTree
    history: dict
    opt_state: PyTree
    key: Array
    step: int


def _strong(tree):
    return jax.tree.map(lambda x: jnp.array(x, dtype=x.dtype) if eqx.is_array(x) else x, tree)


def _all_finite(tree) -> Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _scenario_value_and_grad(trainable, static, simulate_fn, loss, penalty, scenario):
    """One scenario's loss and gradient; a failed scenario gives `penalty` and zero gradient."""

    def scenario_loss(trainable):
        model = unwrap(eqx.combine(trainable, static))
        output = simulate_fn(model, scenario)
        return loss(output), output_failed(output)

    (value, failed), grads = eqx.filter_value_and_grad(scenario_loss, has_aux=True)(trainable)
    ok = ~failed & jnp.isfinite(value) & _all_finite(grads)
    # `where` on the computed values (not inside the differentiated function): a failed
    # scenario's inf/nan cannot leak into the batch gradient.
    value = jnp.where(ok, value, penalty.astype(jnp.result_type(value)))
    grads = jax.tree.map(lambda g: jnp.where(ok, g, jnp.zeros_like(g)), grads)
    return value, grads, ok


def _ensemble_value_and_grad(trainable, static, simulate_fn, loss, penalty, scenarios, weights):
    """A chunk of scenarios simulated together (e.g. by `simulate_ensemble`): their losses
    and the gradient of `Σ weights_i loss_i` over the scenarios that succeeded with a
    finite loss. The others count as `penalty`, as with `vmap`. They share the solve,
    though: if the chunk's gradient is not finite all the same, every scenario of the
    chunk counts as `penalty` and the chunk gives a zero gradient."""

    def chunk_loss(trainable):
        model = unwrap(eqx.combine(trainable, static))
        output = simulate_fn(model, scenarios)
        check_ensemble_output(
            output, weights.shape[0], "`simulate_fn(model, scenarios)`", "scenario"
        )
        values = jax.vmap(loss)(output)
        kept = ~output_failed(output) & jnp.isfinite(values)
        return jnp.sum(jnp.where(kept, weights * values, 0.0)), (values, kept)

    (_, (values, kept)), grads = eqx.filter_value_and_grad(chunk_loss, has_aux=True)(trainable)
    finite = _all_finite(grads)
    ok = kept & finite
    values = jnp.where(ok, values, penalty.astype(jnp.result_type(values)))
    grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
    return values, grads, ok


def _ensemble_map(fn, scenarios, chunk_size, mesh, dropped=None):
    """`fn(chunk, weights)` over chunks of `chunk_size` scenarios per device (default: all
    at once), one after the other, each split over `mesh` when given (`chunk_layout`); the
    batch is padded with copies of its last scenario, weighted 0, as are the `dropped`
    scenarios. Returns the per-scenario
    values and `ok`, and the gradient of the batch mean."""
    size = batch_size_of(scenarios)
    mesh = None if mesh is None else auto_mesh(mesh)
    per_chunk, padded = chunk_layout(size, chunk_size, 1 if mesh is None else mesh.size)
    dtype = jnp.result_type(float)
    weights = jnp.where(jnp.arange(padded) < size, 1.0 / size, 0.0).astype(dtype)
    if dropped is not None:  # no gradient from these scenarios
        weights = jnp.where(_pad(dropped, padded - size), 0.0, weights)
    scenarios = jax.tree.map(lambda x: _pad(jnp.asarray(x), padded - size), scenarios)

    def chunk(args):
        if mesh is not None:
            args = jax.tree.map(lambda x: _place(x, mesh, batch_spec(mesh)), args)
        return fn(*args)

    if padded == per_chunk:
        values, grads, ok = chunk((scenarios, weights))
    else:
        split = lambda x: x.reshape((padded // per_chunk, per_chunk) + x.shape[1:])  # noqa: E731
        values, grads, ok = jax.lax.map(chunk, jax.tree.map(split, (scenarios, weights)))
        values, ok = values.reshape(-1), ok.reshape(-1)
        grads = jax.tree.map(lambda g: jnp.sum(g, axis=0), grads)
    return values[:size], grads, ok[:size]


def _regularization_value_and_grad(trainable, static, regularization):
    if regularization is None:
        zero = jnp.zeros(())
        return zero, jax.tree.map(jnp.zeros_like, trainable)

    def reg(trainable):
        return regularization(unwrap(eqx.combine(trainable, static)))

    return eqx.filter_value_and_grad(reg)(trainable)


def _rows(mask, x):
    return mask.reshape(mask.shape + (1,) * (jnp.ndim(x) - 1))


@eqx.filter_jit
def _tune_step(
    trainable,
    static,
    opt_state,
    key,
    scenarios,
    simulate_fn,
    loss,
    regularization,
    optimizer,
    penalty,
    batch_size,
    chunk_size,
    mesh,
    ensemble,
    excluded=None,
):
    key, subkey = jax.random.split(key)
    size = batch_size_of(scenarios)
    # Scenarios that raise when simulated run as a copy of one that does not, and then
    # count as failed: `penalty`, no gradient.
    substitute = (
        None if excluded is None else jax.tree.map(lambda x: x[jnp.argmin(excluded)], scenarios)
    )
    if batch_size is None:
        index = jnp.arange(size)
    else:
        index = jax.random.choice(subkey, size, (batch_size,), replace=False)
        scenarios = jax.tree.map(lambda x: x[index], scenarios)
    dropped = None if excluded is None else excluded[index]
    if dropped is not None:
        scenarios = jax.tree.map(
            lambda x, s: jnp.where(_rows(dropped, x), s, x), scenarios, substitute
        )
    if ensemble:
        fn = eqx.Partial(_ensemble_value_and_grad, trainable, static, simulate_fn, loss, penalty)
        values, grads, ok = _ensemble_map(fn, scenarios, chunk_size, mesh, dropped)
    else:
        fn = eqx.Partial(_scenario_value_and_grad, trainable, static, simulate_fn, loss, penalty)
        values, grads, ok = _batch_map(fn, (scenarios,), chunk_size, mesh)
        if dropped is not None:
            grads = jax.tree.map(lambda g: jnp.where(_rows(dropped, g), 0.0, g), grads)
        grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)
    if dropped is not None:
        ok = ok & ~dropped
        values = jnp.where(dropped, penalty.astype(values.dtype), values)
    scenario_loss = jnp.mean(values)
    reg_value, reg_grads = _regularization_value_and_grad(trainable, static, regularization)
    grads = jax.tree.map(jnp.add, grads, reg_grads)
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = optimizer.update(grads, opt_state, trainable)
    new_trainable = eqx.apply_updates(trainable, updates)
    finite = _all_finite((grads, new_trainable, new_opt_state)) & jnp.isfinite(reg_value)
    # A non-finite update is never applied: parameters and optimizer state stay as they were.
    keep = lambda new, old: jax.tree.map(  # noqa: E731
        lambda a, b: jnp.where(finite, a, b) if eqx.is_array(a) else a, new, old
    )
    trainable = keep(new_trainable, trainable)
    opt_state = keep(new_opt_state, opt_state)
    stats = dict(
        loss=scenario_loss + reg_value,
        scenario_loss=scenario_loss,
        regularization=reg_value,
        num_failed=jnp.sum(~ok),
        grad_norm=grad_norm,
        skipped=~finite,
        failed=jnp.where(ok, -1, index),  # the failed scenarios' indices, -1 elsewhere
    )
    return trainable, opt_state, key, stats


def _csv_cell(value):
    return " ".join(map(str, value)) if isinstance(value, list) else value


class _Logger:
    """CSV (`.csv`, one row per step) or JSON (`.json`, rewritten at checkpoints and at the end)."""

    def __init__(self, path, history):
        self.path = None if path is None else Path(path)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.csv = self.path.suffix.lower() == ".csv"
        if self.csv:
            with open(self.path, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(HISTORY_COLUMNS)
                for row in zip(*(history[c] for c in HISTORY_COLUMNS), strict=False):
                    writer.writerow(map(_csv_cell, row))
        else:
            self.flush(history)

    def row(self, history):
        if self.path is not None and self.csv:
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerow([_csv_cell(history[c][-1]) for c in HISTORY_COLUMNS])

    def flush(self, history):
        if self.path is not None and not self.csv:
            atomic_write_text(self.path, json.dumps(history, indent=1))


def _run_identity(step_args: tuple, start: str, scenarios) -> dict:
    """The parts of a tuning run's identity: its start (initial parameters, seed), its
    scenarios, and its problem: the program of one step (the jaxpr of `_tune_step`, with
    every literal such as a learning rate or a loss weight, and the arrays closed over: see
    `program_fingerprint`) and the array leaves of the functions and fixed parameters."""
    program = eqx.filter_make_jaxpr(_tune_step)(*step_args)[0]
    functions = eqx.filter(step_args[1:2] + step_args[5:10], eqx.is_array)
    return {
        "start": start,
        "scenarios": run_fingerprint(scenarios),
        "problem": run_fingerprint(functions, program_fingerprint(program)),
    }


def _domain_errors(model) -> list[str]:
    """The messages of the eager value checks (`check_values`, e.g. a gain that is not
    positive definite or not finite) of every formulation in `model`."""
    errors = []
    is_checked = lambda x: isinstance(x, AbstractFormulation)  # noqa: E731
    for node in jax.tree.leaves(model, is_leaf=is_checked):
        if is_checked(node):
            try:
                node.check_values()
            except (ValueError, FloatingPointError) as error:
                errors.append(f"{type(node).__name__}: {error}")
    return errors


def _first_line(error: BaseException) -> str:
    """The line of `error`'s message that says what happened: for an error raised inside
    compiled code (`eqx.error_if`), the runtime error's own message, not the callback's
    traceback around it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    inner = [
        line.split("RuntimeError: ", 1)[1] for line in lines if "EquinoxRuntimeError: " in line
    ]
    return inner[-1] if inner else f"{type(error).__name__}: {lines[0] if lines else ''}"


def _bad_scenarios(model, simulate_fn, scenarios, ensemble, candidates) -> list[tuple]:
    """The scenarios among `candidates` whose simulation raises on its own while running:
    `(index, error)`. (One compiled call per scenario: run only after a step raised.)"""
    one = eqx.filter_jit(
        simulate_fn
        if not ensemble
        else lambda m, s: simulate_fn(m, jax.tree.map(lambda x: x[None], s))
    )
    bad = []
    for i in candidates:
        try:
            jax.block_until_ready(one(model, jax.tree.map(lambda x, i=i: x[i], scenarios)))
        except RuntimeError as error:  # raised while running, by this scenario's values
            bad.append((i, _first_line(error)))
    return bad


def tune(
    params: PyTree,
    simulate_fn: Callable[[PyTree, PyTree], Any],
    scenarios: PyTree,
    loss: Callable[[Any], Array],
    *,
    optimizer: optax.GradientTransformation,
    steps: int,
    regularization: Callable[[PyTree], Array] | None = None,
    trainable: Any = eqx.is_inexact_array,
    batching: Batching | None = None,
    checkpointing: Checkpointing | None = None,
    reporting: Reporting | None = None,
    failures: Failures | None = None,
    **deprecated_keywords,
) -> TuneResult:
    """Tunes gains (any differentiable leaves of `params`) by gradient descent over scenarios.

    Minimizes `mean_i loss(simulate_fn(model, scenarios[i])) + regularization(model)`,
    `model = jaxdae.unwrap(params)`, with an optax optimizer; the scenarios are simulated
    with `vmap` (see [`jaxdae.batch_map`][] for `chunk_size` and `mesh`), or together as
    one ensemble per chunk (`Batching(ensemble=True)`). Gains stay
    positive definite when `params` holds [`jaxdae.Positive`][] / [`jaxdae.PositiveDefinite`][]
    parametrizations (see [`jaxdae.parametrize`][]). This answers Mukharlyamov and Deressa's (2015)
    Remark 4 (choosing `𝔄, K_D, K_P` is open) by optimization.

    ```python
    params = jaxdae.parametrize(jaxdae.Baumgarte(2.0, 1.0), lambda f: (f.kd, f.kp))

    def run(formulation, scenario):
        q0, v0 = scenario
        return jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, ts=ts, throw=False)

    result = jaxdae.tune(params, run, (q0s, v0s), jaxdae.ConstraintViolation(),
                         optimizer=optax.adam(0.05), steps=100,
                         checkpointing=jaxdae.Checkpointing("ckpt"))
    result.model.kd, result.history["loss"]
    ```

    **Failed scenarios** (documented rule): a scenario fails when `simulate_fn` returns a
    [`jaxdae.Solution`][] that did not succeed (use `throw=False`), or when its loss or
    gradient is not finite. It then counts as `Failures.penalty` in the loss and contributes
    a zero gradient (selected with `jnp.where` on the computed per-scenario gradients, so a
    failed scenario's `inf`/`nan` never reaches the optimizer); `history["num_failed"]`
    counts them. If the update is still not finite (e.g. from the regularization), it is not
    applied: `Failures(on_nonfinite="raise")` (default) raises `FloatingPointError`, `"skip"`
    records `skipped` in the history and goes on.

    **Checkpoints and determinism:** the run is a pure function of `(params, scenarios,
    seed)`. Every `Checkpointing.every` steps (and at the end) the trainable parameters,
    optimizer state, step, PRNG key and history are saved in `Checkpointing.path`, each file
    atomically; calling `tune` again with the same arguments resumes, to parameters
    bit-identical to an uninterrupted run's after exactly `steps` steps. A checkpoint of
    another run (other initial parameters or seed, other scenarios, or another problem: the
    traced program of one step with the values it closes over), a damaged or edited one, or
    one that holds more than `steps` steps is refused, saying why ([`jaxdae.Checkpointing`][]).
    `steps`, `checkpointing.every`, `reporting` and `failures.on_nonfinite` may change.

    **A step that cannot run** stops the run with its last good parameters kept (and
    checkpointed), as `error.result` (a `TuneResult`): an update that would take a gain out
    of its domain (the formulation's `check_values`, e.g. a learning rate so large that a
    gain becomes negative) is not applied, and the error names the step and the gain.
    **Scenarios that raise** when simulated (e.g. a check on their data inside
    `simulate_fn`) are found one by one, named in a warning, and count as failed from then
    on (`Failures.penalty`, no gradient, listed in `history["failed_scenarios"]`); the run
    stops only if every scenario raises.

    **Arguments:**

    - `params`: the PyTree to tune: a formulation, a controller, a tuple of them, with
        parametrizations in place of constrained gains.
    - `simulate_fn`: `simulate_fn(model, scenario) -> output` for one scenario, usually
        a `jaxdae.simulate(..., throw=False)` call returning a Solution. Pass the same
        function object on every call to reuse the compiled step.
    - `scenarios`: a PyTree whose array leaves have a leading batch axis (initial states,
        system parameters, ...).
    - `loss`: `loss(output) -> scalar` for one scenario, e.g.
        [`jaxdae.ConstraintViolation`][], [`jaxdae.TrackingError`][],
        [`jaxdae.ControlEffort`][], [`jaxdae.SettlingTime`][], their weighted sums, or any
        function.
    - `optimizer`: an optax `GradientTransformation`, e.g. `optax.adam(1e-2)`.
    - `steps`: total number of optimizer steps (including those done before a resume).
    - `regularization`: `regularization(model) -> scalar` added once per step, e.g.
        [`jaxdae.DiscreteStability`][] to tune for a fixed-step method.
    - `trainable`: which leaves of `params` are tuned: an `eqx.partition` filter (a
        function of a leaf or a PyTree of bools). Default: every floating-point array.
    - `batching`: a [`jaxdae.Batching`][]: minibatch size, seed, `chunk_size`, `mesh` and
        `ensemble` (simulate a chunk of scenarios together: one solve and one reverse pass
        per chunk instead of one per scenario; a failed or non-finite scenario counts as
        the penalty and gives no gradient, as with `vmap`, and the other scenarios of its
        chunk still do unless the chunk's gradient is not finite all the same: then the
        whole chunk counts as the penalty and gives a zero gradient).
    - `checkpointing`: a [`jaxdae.Checkpointing`][]: directory, period and `resume`
        (default: no checkpoints).
    - `reporting`: a [`jaxdae.Reporting`][]: log file, progress bar and callback.
    - `failures`: a [`jaxdae.Failures`][]: the penalty of a failed scenario and
        `on_nonfinite` (see above).

    The keywords `batch_size`, `seed`, `chunk_size`, `mesh`, `ensemble`, `checkpoint`,
    `checkpoint_every`, `resume`, `log`, `progress`, `callback`, `failure_penalty` and
    `on_nonfinite` are deprecated: each still works and warns with the option object
    that replaces it.

    **Returns:**

    A [`jaxdae.TuneResult`][] with the tuned `params`, the unwrapped `model` and the `history`.

    **Raises:**

    `ValueError` for bad arguments, a checkpoint that does not match or is damaged, an update
    that took the parameters out of their domain, or scenarios that raise;
    `FloatingPointError` for a non-finite update with `on_nonfinite="raise"`. The last two
    carry the last good state as `error.result`.
    """
    options = options_from_keywords(
        {
            Batching: batching,
            Checkpointing: checkpointing,
            Reporting: reporting,
            Failures: failures,
        },
        deprecated_keywords,
    )
    run = _TuningRun(
        params, simulate_fn, scenarios, loss, optimizer, steps, regularization, trainable, options
    )
    return run.run()


class _TuningRun:
    """One tuning run: its state between steps (parameters, optimizer state, PRNG key,
    history, the scenarios found to raise) and what it does at each step."""

    def __init__(
        self,
        params,
        simulate_fn,
        scenarios,
        loss,
        optimizer,
        steps,
        regularization,
        trainable,
        options,
    ):
        self.batching, self.checkpointing = options[Batching], options[Checkpointing]
        self.reporting, self.failures = options[Reporting], options[Failures]
        self.simulate_fn, self.scenarios, self.loss = simulate_fn, scenarios, loss
        self.optimizer, self.steps, self.regularization = optimizer, steps, regularization
        self.size = batch_size_of(scenarios)
        if self.size == 0:
            raise ValueError(
                "`scenarios` holds no scenario (its leading axis has length 0): pass at least one."
            )
        self._check(steps, optimizer)
        trainable_params, self.static = eqx.partition(params, trainable)
        if not jax.tree.leaves(trainable_params):
            raise ValueError(
                "Nothing to tune: `trainable` selects no floating-point arrays in `params`."
            )
        # Strong types: a weakly typed leaf would become strong after the first update and
        # force a second compilation.
        self.trainable = _strong(trainable_params)
        self.opt_state = _strong(optimizer.init(self.trainable))
        self.key = jax.random.PRNGKey(self.batching.seed)
        self.step = 0
        self.history = {c: [] for c in HISTORY_COLUMNS}
        self.penalty = jnp.asarray(self.failures.penalty, dtype=jnp.result_type(float))
        self.excluded = None  # once scenarios raise: a mask of them (they count as failed)
        self.elapsed_before = 0.0
        self.identity = None
        self.directory = None
        if self.checkpointing is not None:
            self.directory = Path(self.checkpointing.path)
            self.identity = _run_identity(
                self.step_args(), run_fingerprint(self.trainable, self.batching.seed), scenarios
            )
            if self.checkpointing.resume:
                self._resume()

    def _check(self, steps, optimizer):
        if int(steps) != steps or steps < 0:
            raise ValueError(f"`steps` must be a non-negative integer; got {steps}.")
        if not isinstance(optimizer, optax.GradientTransformation):
            raise ValueError(
                "`optimizer` must be an optax GradientTransformation, e.g. optax.adam(1e-2)."
            )
        batch_size = self.batching.batch_size
        if batch_size is not None and not 1 <= batch_size <= self.size:
            raise ValueError(
                f"`batch_size` must be in [1, {self.size}] (the number of "
                f"scenarios); got {batch_size}."
            )

    def _resume(self):
        loaded = load_checkpoint(self.directory, self.state(), self.identity)
        if loaded is None:
            return
        step = loaded[1]
        if step > self.steps:
            raise ValueError(
                f"The checkpoint in {self.directory} holds {step} steps of this run, more than "
                f"the {self.steps} asked for: a checkpoint keeps only its last state, so the "
                f"parameters after step {self.steps} are not in it. Ask for `steps={step}` "
                f"(or more) to resume, or pass `resume=False` to run {self.steps} steps "
                "afresh (the checkpoint is then overwritten), or use another `checkpoint` "
                "directory."
            )
        (self.trainable, self.opt_state, self.key), self.step, self.history, dropped = loaded
        if dropped:
            self.excluded = np.zeros(self.size, bool)
            self.excluded[dropped] = True
        if self.history["time"]:
            self.elapsed_before = self.history["time"][-1]

    def state(self):
        return (self.trainable, self.opt_state, self.key)

    def step_args(self):
        b = self.batching
        return (
            self.trainable,
            self.static,
            self.opt_state,
            self.key,
            self.scenarios,
            self.simulate_fn,
            self.loss,
            self.regularization,
            self.optimizer,
            self.penalty,
            b.batch_size,
            b.chunk_size,
            b.mesh,
            bool(b.ensemble),
            None if self.excluded is None else jnp.asarray(self.excluded),
        )

    def save(self):
        if self.directory is not None:
            save_checkpoint(
                self.directory, self.state(), self.step, self.history, self.identity, self.excluded
            )

    def result(self) -> TuneResult:
        tuned = eqx.combine(self.trainable, self.static)
        return TuneResult(
            params=tuned,
            model=unwrap(tuned),
            history=self.history,
            opt_state=self.opt_state,
            key=self.key,
            step=self.step,
        )

    def stop(self, error_type, message, cause):
        """Saves the run as it stands (its last good state) and raises `error_type` with
        `message`; the exception's `result` is that state as a `TuneResult`."""
        if self.directory is not None:
            self.save()
            message += f" It is saved in {self.directory}."
        _Logger(self.reporting.log, self.history)  # the log as the run stands
        error = error_type(message)
        error.result = self.result()
        raise error from cause

    def run(self) -> TuneResult:
        logger = _Logger(self.reporting.log, self.history)
        bar = progress_bar(self.steps, self.step, self.reporting.progress, "tune")
        self.start = time.perf_counter()
        self.warned = False
        try:
            while self.step < self.steps:
                try:
                    new_trainable, new_opt_state, new_key, stats = _tune_step(*self.step_args())
                    stats = jax.device_get(stats)
                except Exception as error:  # raised inside the step, e.g. by `simulate_fn`
                    self.on_step_error(error)  # raises unless some scenarios were excluded
                    continue
                row = self.apply(new_trainable, new_opt_state, new_key, stats, logger)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{row['loss']:.4g}", failed=row["num_failed"])
                self.after(row, logger)
        finally:
            if bar is not None:
                bar.close()
        logger.flush(self.history)
        return self.result()

    def on_step_error(self, error):
        """Finds the scenarios that raise on their own and excludes them from then on; or
        stops the run (every scenario raises, or the parameters left their domain); or
        re-raises `error` with a note."""
        model = unwrap(eqx.combine(self.trainable, self.static))
        step = self.step
        domain = _domain_errors(model)
        if domain:
            self.stop(
                ValueError,
                f"The parameters at step {step} are outside their "
                f"domain ({domain[0]}): step {step + 1} could not run "
                f"({_first_line(error)}).",
                error,
            )
        excluded = self.excluded
        candidates = [i for i in range(self.size) if excluded is None or not excluded[i]]
        # An error while running (not while tracing: a bug in the code, the same for every
        # scenario) may come from some scenarios' data: find them.
        bad = (
            []
            if not isinstance(error, RuntimeError)
            else _bad_scenarios(
                model, self.simulate_fn, self.scenarios, bool(self.batching.ensemble), candidates
            )
        )
        listed = "; ".join(f"scenario {i}: {text}" for i, text in bad[:5])
        listed += f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        if bad and len(bad) < len(candidates):
            excluded = np.zeros(self.size, bool) if excluded is None else excluded.copy()
            excluded[[i for i, _ in bad]] = True
            self.excluded = excluded
            warnings.warn(
                f"jaxdae.tune: in step {step + 1}, {len(bad)} scenario(s) raise when "
                f"simulated on their own ({listed}); from now on they count as "
                f"failed (`Failures.penalty` = {self.failures.penalty}, no gradient) and "
                "`history['failed_scenarios']` names them. Fix or remove them, or "
                "simulate with `throw=False`.",
                stacklevel=4,
            )
            return
        if bad:
            self.stop(
                ValueError,
                f"Step {step + 1} stopped: every scenario raises when simulated on "
                f"its own ({listed}). The parameters after step {step} are kept: "
                "`error.result`.",
                error,
            )
        self.save()
        if isinstance(error, TypeError) and "scalar-output" in str(error):
            error.add_note(
                "`loss` must return a scalar for one scenario (it is applied to "
                "each scenario's output, and the losses are averaged): reduce "
                "it, e.g. with `jnp.sum`."
            )
        error.add_note(
            f"(raised by jaxdae.tune in step {step + 1}"
            + (
                ""
                if self.directory is None
                else f"; the parameters after step {step} are saved in {self.directory}"
            )
            + ")"
        )
        raise error

    def apply(self, new_trainable, new_opt_state, new_key, stats, logger) -> dict:
        """Takes a step's update (unless it left the parameters' domain) and records its
        row in the history and the log."""
        domain = _domain_errors(unwrap(eqx.combine(new_trainable, self.static)))
        if domain:
            self.stop(
                ValueError,
                f"Step {self.step + 1}'s update took the parameters out of their domain "
                f"({domain[0]}); it was not applied (loss {float(stats['loss'])}, "
                f"gradient norm {float(stats['grad_norm'])}). The optimizer's steps are "
                "too large for these gains: lower the learning rate, or parametrize the "
                "gains (`jaxdae.parametrize` with `jaxdae.Positive`) so that every "
                f"update stays valid. The parameters after step {self.step} are kept: "
                "`error.result`.",
                None,
            )
        self.trainable, self.opt_state, self.key = new_trainable, new_opt_state, new_key
        self.step += 1
        row = dict(
            step=self.step,
            loss=float(stats["loss"]),
            scenario_loss=float(stats["scenario_loss"]),
            regularization=float(stats["regularization"]),
            num_failed=int(stats["num_failed"]),
            grad_norm=float(stats["grad_norm"]),
            skipped=bool(stats["skipped"]),
            time=self.elapsed_before + time.perf_counter() - self.start,
            failed_scenarios=sorted({int(i) for i in stats["failed"] if i >= 0}),
        )
        for c in HISTORY_COLUMNS:
            self.history[c].append(row[c])
        logger.row(self.history)
        return row

    def after(self, row, logger):
        """What follows a recorded step: the warning on failed scenarios, the stop on a
        non-finite update, the checkpoint and the callback."""
        step, excluded = self.step, self.excluded
        unnamed = [i for i in row["failed_scenarios"] if excluded is None or not excluded[i]]
        if unnamed and not self.warned:
            self.warned = True
            warnings.warn(
                f"jaxdae.tune: at step {step}, scenario(s) {unnamed[:10]}"
                f"{' ...' if len(unnamed) > 10 else ''} failed (a solve that did not "
                "succeed, or a non-finite loss or gradient); they count as "
                f"`Failures.penalty` = {self.failures.penalty} with no gradient. "
                "`history['failed_scenarios']` lists them at every step.",
                stacklevel=4,
            )
        if row["skipped"] and self.failures.on_nonfinite == "raise":
            self.stop(
                FloatingPointError,
                f"Step {step}: the update is not finite (loss {row['loss']}, gradient "
                f"norm {row['grad_norm']}); it was not applied. Failed scenarios are "
                "already masked, so look at the regularization, the optimizer's "
                "learning rate or the loss; pass `on_nonfinite='skip'` to skip such "
                "steps. The parameters before this step are kept: `error.result`.",
                None,
            )
        if self.directory is not None and (
            step % self.checkpointing.every == 0 or step == self.steps
        ):
            self.save()
            logger.flush(self.history)
        if self.reporting.callback is not None:
            self.reporting.callback(step, row)
