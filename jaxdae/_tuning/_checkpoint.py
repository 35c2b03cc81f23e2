"""The files of a tuning run's checkpoint ([`jaxdae.tune`][] with `checkpoint=`): the
state of the last step, headed by the run and the step it holds, and `checkpoint.json`
naming it with the run's identity and its history, each written atomically and checked
when the run resumes."""

import hashlib
import io
import json
from pathlib import Path

import equinox as eqx
import numpy as np

from ._persist import atomic_write, fingerprint as run_fingerprint, read_record, short, write_record

_META_FILE = "checkpoint.json"

#: Columns of the tuning history (and of the CSV log).
HISTORY_COLUMNS = (
    "step",
    "loss",
    "scenario_loss",
    "regularization",
    "num_failed",
    "grad_norm",
    "skipped",
    "time",
    "failed_scenarios",
)


# What each part of a run's identity covers (for the message when one differs).
_PARTS = {
    "start": "other initial parameters or another seed",
    "scenarios": "other scenarios",
    "problem": "another problem: another `simulate_fn`, `loss`, `optimizer`, "
    "`regularization`, failure penalty, fixed parameters, or `batching` "
    "(batch size, chunk size, mesh, ensemble: the compiled step differs)",
}
_FIX = (
    "Use another `checkpoint` directory, or `resume=False` to start afresh (the "
    "checkpoint is then overwritten)."
)


def run_name(identity: dict) -> str:
    """The fingerprint of a tuning run (of the parts of its identity)."""
    return run_fingerprint(None, *sorted(identity.items()))


# The first line of a state file: what it holds (then the `eqx.tree_serialise_leaves` bytes).
_STATE_HEADER = "jaxdae.tune state"


def save_checkpoint(
    directory: Path, state, step: int, history: dict, identity: dict, excluded=None
):
    """Writes the state of step `step` to its own file (headed by the run and the step it
    holds), then `checkpoint.json` naming it, sealed with the digest of all its content
    (both atomically), then removes older states: a run killed at any point leaves a
    `checkpoint.json` and the state it names, of the same step."""
    directory.mkdir(parents=True, exist_ok=True)
    run = run_name(identity)
    buffer = io.BytesIO()
    buffer.write((json.dumps({"holds": _STATE_HEADER, "run": run, "step": step}) + "\n").encode())
    eqx.tree_serialise_leaves(buffer, state)
    data = buffer.getvalue()
    name = f"state_{step:06d}.eqx"
    atomic_write(directory / name, lambda file: file.write(data))
    meta = {
        "run": run,
        "step": step,
        "state": name,
        "state_sha256": hashlib.sha256(data).hexdigest(),
        "parts": identity,
        "history": history,
        "excluded": [] if excluded is None else np.flatnonzero(excluded).tolist(),
    }
    write_record(directory / _META_FILE, meta)
    for old in directory.glob("state_*.eqx"):
        if old.name != name:
            old.unlink(missing_ok=True)


def _state_owner(data: bytes) -> tuple[str, int] | None:
    """The run and step that a state file's header names (None: no such header)."""
    line = data.split(b"\n", 1)[0]
    try:
        header = json.loads(line)
        if header.get("holds") == _STATE_HEADER:
            return str(header["run"]), int(header["step"])
    except (ValueError, AttributeError, KeyError, TypeError):
        pass
    return None


def load_checkpoint(directory: Path, like, identity: dict):
    """The state, step, history and excluded scenarios of the checkpoint in `directory`
    (None if there is none), checked: all of `checkpoint.json` against its digest, its run
    against this one (`identity`), the state file against the run and step it names and
    against its digest. A `ValueError` otherwise, naming the file and what differs."""
    meta_path = directory / _META_FILE
    if not meta_path.exists():
        return None
    meta = read_record(meta_path, _FIX)
    parts, run = meta.get("parts", {}), run_name(identity)
    differ = [text for part, text in _PARTS.items() if parts.get(part) != identity[part]]
    if differ:
        raise ValueError(
            f"The checkpoint in {directory} was written by a run with {'; '.join(differ)}: "
            f"resuming would continue that run (run {short(str(meta.get('run')))} at step "
            f"{meta.get('step')} on disk, run {short(run)} here). {_FIX}"
        )
    state_path = directory / str(meta.get("state"))

    def damaged(why):
        return ValueError(
            f"The checkpoint in {directory} is damaged: {state_path.name} ({why}). {_FIX}"
        )

    try:
        data = state_path.read_bytes()
        step, history = int(meta["step"]), meta["history"]
        rows = {len(history[c]) for c in HISTORY_COLUMNS}
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise damaged(f"{type(error).__name__}: {error}") from error
    owner = _state_owner(data)
    if owner is not None and owner != (run, step):
        raise ValueError(
            f"The checkpoint in {directory} is not one checkpoint: {state_path.name} holds "
            f"step {owner[1]} of run {short(owner[0])}, but {_META_FILE} names step {step} of "
            f"run {short(run)} (a state file copied over another one?). {_FIX}"
        )
    if owner is None or hashlib.sha256(data).hexdigest() != meta.get("state_sha256"):
        raise damaged("its content is not the one checkpoint.json recorded")
    if rows != {step}:
        raise damaged("the history does not have one row per step")
    try:
        state = eqx.tree_deserialise_leaves(io.BytesIO(data.split(b"\n", 1)[1]), like)
    except Exception as error:  # structure or dtype mismatch
        raise ValueError(
            f"The checkpoint in {directory} does not match these parameters / optimizer "
            f"({error}). {_FIX}"
        ) from error
    return state, step, history, meta.get("excluded", [])
