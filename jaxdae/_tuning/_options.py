"""The option groups of [`jaxdae.tune`][]: how scenarios are batched, where checkpoints go,
what is reported, and how failures count."""

import dataclasses
import math
import numbers
import os
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax


def _integer(field: str, value: Any, meaning: str, low: int, high: int | None = None) -> int:
    """`value` as a Python int in `[low, high)` (`high=None`: no upper bound); else a
    `ValueError` naming `field`, what it means and an example."""
    integral = (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and (isinstance(value, numbers.Integral) or float(value).is_integer())
    )
    if integral and low <= int(value) and (high is None or int(value) < high):
        return int(value)
    span = (
        f"≥ {low}"
        if high is None
        else "in [-2**63, 2**63)"
        if high == 2**63
        else f"in [{low}, {high})"
    )
    raise ValueError(f"`{field}` must be an integer {span} ({meaning}); got {value!r}.")


def _optional_count(field: str, meaning: str):
    """A converter: `None`, or a positive integer (see `_integer`)."""

    def convert(value: Any) -> int | None:
        return None if value is None else _integer(field, value, meaning, 1)

    return convert


def _seed(value: Any) -> int:
    return _integer("Batching.seed", value, "a PRNG seed, e.g. seed=0", -(2**63), 2**63)


def _every(value: Any) -> int:
    return _integer(
        "Checkpointing.every", value, "a checkpoint every so many steps, e.g. every=10", 1
    )


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

    batch_size: int | None = eqx.field(
        default=None,
        converter=_optional_count(
            "Batching.batch_size", "scenarios per step; None for all of them"
        ),
    )
    seed: int = eqx.field(default=0, converter=_seed)
    chunk_size: int | None = eqx.field(
        default=None,
        converter=_optional_count(
            "Batching.chunk_size", "scenarios simulated at once; None for all of them"
        ),
    )
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

    - `path`: a directory for checkpoints (`"."` for the working directory; an empty path is
        refused).
    - `every`: checkpoint period in steps, a positive integer (a checkpoint is also written
        at the end).
    - `resume`: resume from the checkpoint in `path` if there is one.
    """

    path: str | os.PathLike
    every: int = eqx.field(default=10, converter=_every)
    resume: bool = True

    def __check_init__(self):
        if not isinstance(self.path, str | os.PathLike):
            raise ValueError(
                f"`Checkpointing.path` must be a directory (a str or os.PathLike); "
                f"got {self.path!r}."
            )
        if not os.fspath(self.path):
            raise ValueError(
                "`Checkpointing.path` is empty: give the directory for the "
                'checkpoints, e.g. Checkpointing("ckpt") (Checkpointing(".") '
                "for the working directory)."
            )


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
        loss a successful scenario can have). Must be finite and non-negative.
    - `on_nonfinite`: `"raise"` (default) or `"skip"`: what a non-finite update does.
    """

    penalty: float = 1e3
    on_nonfinite: str = "raise"

    def __check_init__(self):
        try:
            penalty = float(self.penalty)
        except (TypeError, ValueError):
            raise ValueError(
                f"`Failures.penalty` must be a number (the loss of a failed "
                f"scenario); got {self.penalty!r}."
            ) from None
        if not math.isfinite(penalty):
            raise ValueError(f"`Failures.penalty` must be finite; got {penalty}.")
        if penalty < 0:
            raise ValueError(
                f"`Failures.penalty` must be non-negative; got {penalty}. It is the loss of a "
                "failed scenario, so a negative one rewards failing: choose it above any loss "
                "a successful scenario can have (default 1e3)."
            )
        if self.on_nonfinite not in ("raise", "skip"):
            raise ValueError(
                f"`on_nonfinite` must be 'raise' or 'skip'; got {self.on_nonfinite!r}."
            )


# Old keyword of `tune` -> (option class, its field).
DEPRECATED_KEYWORDS = {
    keyword: (cls, field)
    for cls, renames in (
        (
            Batching,
            {
                "batch_size": "batch_size",
                "seed": "seed",
                "chunk_size": "chunk_size",
                "mesh": "mesh",
                "ensemble": "ensemble",
            },
        ),
        (Checkpointing, {"checkpoint": "path", "checkpoint_every": "every", "resume": "resume"}),
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

    **Raises:** `TypeError` for a keyword `tune` does not know; `ValueError` for a keyword
    that sets a field of an option object also given to another value."""
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
            DeprecationWarning,
            stacklevel=3,
        )
    result = {}
    for cls, given in options.items():
        changes = fields.get(cls, {})
        if given is not None and not isinstance(given, cls):
            raise TypeError(f"expected a jaxdae.{cls.__name__}; got {type(given).__name__}.")
        if given is not None:
            for field, value in changes.items():
                if not _same(getattr(given, field), value):
                    keyword = next(
                        k for k, (c, f) in DEPRECATED_KEYWORDS.items() if c is cls and f == field
                    )
                    raise ValueError(
                        f"The keyword `{keyword}={value!r}` conflicts with "
                        f"`{cls.__name__.lower()}=jaxdae.{cls.__name__}({field}="
                        f"{getattr(given, field)!r}, ...)`: give `{field}` in the "
                        f"jaxdae.{cls.__name__} only."
                    )
        if cls is Checkpointing and given is None:
            if changes.get("path") is None:
                # No checkpoints: the other fields are still checked (on a stand-in path).
                Checkpointing(path=os.curdir, **{k: v for k, v in changes.items() if k != "path"})
                result[cls] = None
                continue
            given = Checkpointing(path=changes.pop("path"))
        elif given is None:
            given = cls()
        result[cls] = dataclasses.replace(given, **changes) if changes else given
    return result


def _same(a: Any, b: Any) -> bool:
    """Whether an option's value `a` and a keyword's `b` agree."""
    try:
        return a is b or bool(a == b)
    except Exception:  # e.g. arrays of several elements
        return False
