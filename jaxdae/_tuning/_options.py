"""The option groups of [`jaxdae.tune`][]: how scenarios are batched, where checkpoints go,
what is reported, and how failures count."""

import dataclasses
import os
import warnings
from collections.abc import Callable

import equinox as eqx
import jax


class Batching(eqx.Module):
    """How [`jaxdae.tune`][] draws and runs its scenarios at each step.

    **Arguments:**

    - `batch_size`: scenarios drawn (without replacement) per step; default all of them.
    - `seed`: seed of the PRNG key used for the minibatches.
    - `chunk_size`, `mesh`: memory bound and devices of the batch, as in
        [`jaxdae.batch_map`][].
    - `ensemble`: simulate the scenarios together: `simulate_fn(model, scenarios)` then
        receives a batch of scenarios (all of them, the minibatch, or a chunk of
        `chunk_size`) and returns one output with a leading batch axis, typically a
        [`jaxdae.simulate_ensemble`][] Solution; `loss` is still written for one scenario.
    """

    batch_size: int | None = None
    seed: int = 0
    chunk_size: int | None = None
    mesh: jax.sharding.Mesh | None = None
    ensemble: bool = False


class Checkpointing(eqx.Module):
    """Where and how often [`jaxdae.tune`][] saves its state.

    A resume returns the run after exactly `steps` steps, or refuses and says why: the
    checkpoint must be of this run (initial parameters and seed, scenarios, the program of
    one step). `checkpoint.json` is sealed with a digest of all its content (the history
    included) and names the state file, whose first line names its run and step: an
    edited file is refused as damaged, a state file of another step or run is refused
    naming both. A checkpoint keeps only its last state, so one that holds more steps than
    asked for is refused too: ask for at least its steps, or pass `resume=False`.

    **Arguments:**

    - `path`: a directory for checkpoints.
    - `every`: checkpoint period in steps (a checkpoint is also written at the end).
    - `resume`: resume from the checkpoint in `path` if there is one.
    """

    path: str | os.PathLike
    every: int = 10
    resume: bool = True

    def __check_init__(self):
        if int(self.every) != self.every or self.every < 1:
            raise ValueError(f"`Checkpointing.every` must be a positive integer; got {self.every}.")


class Reporting(eqx.Module):
    """What [`jaxdae.tune`][] reports while it runs.

    **Arguments:**

    - `log`: a `.csv` file (one row per step) or `.json` file (the history) to write.
    - `progress`: show a tqdm progress bar (if tqdm is installed).
    - `callback`: `callback(step, row)` after every step (`row` the history entries).
    """

    log: str | os.PathLike | None = None
    progress: bool = True
    callback: Callable[[int, dict], None] | None = None


class Failures(eqx.Module):
    """How [`jaxdae.tune`][] counts failed scenarios and non-finite updates.

    **Arguments:**

    - `penalty`: the loss value of a failed scenario (default 1e3; choose it above any
        loss a successful scenario can have). Must be finite.
    - `on_nonfinite`: `"raise"` (default) or `"skip"`: what a non-finite update does.
    """

    penalty: float = 1e3
    on_nonfinite: str = "raise"

    def __check_init__(self):
        if self.on_nonfinite not in ("raise", "skip"):
            raise ValueError(
                f"`on_nonfinite` must be 'raise' or 'skip'; got {self.on_nonfinite!r}.")


# Old keyword of `tune` -> (option class, its field).
DEPRECATED_KEYWORDS = {
    keyword: (cls, field)
    for cls, renames in (
        (Batching, {"batch_size": "batch_size", "seed": "seed", "chunk_size": "chunk_size",
                    "mesh": "mesh", "ensemble": "ensemble"}),
        (Checkpointing, {"checkpoint": "path", "checkpoint_every": "every",
                         "resume": "resume"}),
        (Reporting, {"log": "log", "progress": "progress", "callback": "callback"}),
        (Failures, {"failure_penalty": "penalty", "on_nonfinite": "on_nonfinite"}),
    )
    for keyword, field in renames.items()
}


def options_from_keywords(options: dict, keywords: dict) -> dict:
    """`options` (option class -> the object given, or `None`) with the deprecated
    keywords of `tune` applied to them; each keyword warns with the option object that
    replaces it. Returns option class -> object (a default one where none was given;
    `None` for `Checkpointing` without a path).

    **Raises:** `TypeError` for a keyword `tune` does not know."""
    unknown = sorted(set(keywords) - set(DEPRECATED_KEYWORDS))
    if unknown:
        raise TypeError(f"tune() got unexpected keyword argument(s) {', '.join(unknown)}.")
    fields: dict[type, dict] = {}
    for name, value in keywords.items():
        cls, field = DEPRECATED_KEYWORDS[name]
        fields.setdefault(cls, {})[field] = value
        warnings.warn(
            f"jaxdae.tune's keyword `{name}` is deprecated: pass "
            f"`{cls.__name__.lower()}=jaxdae.{cls.__name__}({field}=...)` instead.",
            DeprecationWarning, stacklevel=3)
    result = {}
    for cls, given in options.items():
        changes = fields.get(cls, {})
        if given is not None and not isinstance(given, cls):
            raise TypeError(f"expected a jaxdae.{cls.__name__}; got {type(given).__name__}.")
        if cls is Checkpointing and given is None:
            if changes.get("path") is None:
                Checkpointing(path="", **{k: v for k, v in changes.items() if k != "path"})
                result[cls] = None
                continue
            given = Checkpointing(path=changes.pop("path"))
        elif given is None:
            given = cls()
        result[cls] = dataclasses.replace(given, **changes) if changes else given
    return result
