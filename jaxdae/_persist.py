"""What long jobs ([`jaxdae.tune`][], [`jaxdae.batch_map`][] with `checkpoint=`) share to
never lose work: atomic writes, fingerprints that tie a checkpoint to its run, a progress bar."""

import hashlib
import os
import re
from pathlib import Path

import jax
import numpy as np


def atomic_write_text(path: Path, text: str):
    """Writes `text` to `path` so that an interruption leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def fingerprint(tree, *extra) -> str:
    """A digest of `tree`'s structure and array values and of `extra` (their `str`), so a
    checkpoint is never resumed by a run with other inputs. Memory addresses in the text
    (e.g. of a function held by a module) are left out: they change between processes."""
    text = f"{jax.tree.structure(tree)}|{'|'.join(map(str, extra))}"
    digest = hashlib.sha256(re.sub(r" at 0x[0-9a-fA-F]+", "", text).encode())
    for leaf in jax.tree.leaves(tree):
        leaf = np.asarray(leaf)
        digest.update(f"{leaf.dtype}{leaf.shape}".encode())
        digest.update(leaf.tobytes())
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
