"""What long jobs ([`jaxdae.tune`][], [`jaxdae.batch_map`][] with `checkpoint=`) share to
never lose work: atomic writes, fingerprints that tie a checkpoint to its run, a progress bar."""

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from jax.extend import core as jax_core

# Memory addresses in reprs (e.g. of a function held by a module, or printed in a jaxpr's
# parameters) change between processes; they are left out of every fingerprint.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def atomic_write(path: Path, write: Callable) -> None:
    """Calls `write(file)` on a temporary binary file next to `path`, flushes it to disk and
    moves it onto `path`: an interruption (even `SIGKILL` or a power cut) leaves either the
    old file or the new one, never a truncated one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str):
    """Writes `text` to `path` so that an interruption leaves the old file or the new one."""
    atomic_write(path, lambda file: file.write(text.encode()))


def read_json(path: Path, fix: str) -> dict:
    """The JSON object in `path`; a damaged file raises a `ValueError` that names it and
    says `fix`."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is damaged ({type(error).__name__}: {error}). {fix}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{path} is damaged (not a JSON object). {fix}")
    return value


def sealed(record: dict) -> dict:
    """`record` with a `digest` entry: the SHA-256 of the rest of it, so that a change to
    any of its content (an edit by hand, a partial copy) is detected by `unsealed`."""
    return {**record, "digest": _record_digest(record)}


def unsealed(record: dict, path: Path, fix: str) -> dict:
    """`record` (read from `path`) without its `digest`, which must match the rest
    (`sealed`); else a `ValueError` that names the file and says `fix`."""
    content = {key: value for key, value in record.items() if key != "digest"}
    if record.get("digest") != _record_digest(content):
        raise ValueError(
            f"{path} is damaged (its content does not match the digest written "
            f"with it: edited or only partly written). {fix}"
        )
    return content


def write_record(path: Path, record: dict) -> None:
    """Writes the JSON object `record`, `sealed`, to `path` (`atomic_write`)."""
    atomic_write_text(path, json.dumps(sealed(record)))


def read_record(path: Path, fix: str) -> dict:
    """The record that `write_record` wrote to `path`, checked against its digest; a
    damaged file raises a `ValueError` that names it and says `fix` (`read_json`,
    `unsealed`)."""
    return unsealed(read_json(path, fix), path, fix)


def _record_digest(record: dict) -> str:
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def short(identity: str) -> str:
    """The first 12 hexadecimal digits of a fingerprint, to name it in a message."""
    return identity[:12]


def _update(digest, tree) -> None:
    text = _ADDRESS.sub("", str(jax.tree.structure(tree)))
    digest.update(text.encode())
    for leaf in jax.tree.leaves(tree):
        try:
            leaf = np.asarray(leaf)
        except Exception:  # an opaque object: its repr, addresses left out
            digest.update(_ADDRESS.sub("", repr(leaf)).encode())
            continue
        digest.update(f"{leaf.dtype}{leaf.shape}".encode())
        digest.update(leaf.tobytes() if leaf.dtype != object else repr(leaf).encode())


def fingerprint(tree, *extra) -> str:
    """A digest of `tree`'s structure and array values and of `extra` (their `str`), so a
    checkpoint is never resumed by a run with other inputs. Memory addresses in the text
    (e.g. of a function held by a module) are left out: they change between processes."""
    digest = hashlib.sha256(_ADDRESS.sub("", "|".join(map(str, extra))).encode())
    _update(digest, tree)
    return digest.hexdigest()


def _constants(jaxpr):
    """The constants of `jaxpr` and of every jaxpr nested in its equations (a `jit`, a
    loop body, a custom derivative, ...)."""
    if isinstance(jaxpr, jax_core.ClosedJaxpr):
        yield from jaxpr.consts
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, (jax_core.ClosedJaxpr, jax_core.Jaxpr)):
                    yield from _constants(sub)


def program_fingerprint(jaxpr: jax_core.ClosedJaxpr) -> str:
    """A digest of the program `jaxpr`: its text (every operation, shape and literal, e.g. a
    Python float closed over by the function) and the values of its constants (arrays
    closed over). Two functions that compute the same thing from their inputs share it;
    a changed closure, `eqx.Partial` argument, loss weight or learning rate changes it.
    The text is the same in every process (checked across processes and hash seeds); it may
    change with the JAX version."""
    digest = hashlib.sha256(_ADDRESS.sub("", str(jaxpr)).encode())
    _update(digest, list(_constants(jaxpr)))
    return digest.hexdigest()


def progress_bar(total, initial, enabled, description):
    """A tqdm bar (`None` if disabled or tqdm is not installed)."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # optional dependency: no bar
        return None
    return tqdm(total=total, initial=initial, desc=description, leave=False)
