"""Large batches of simulations: `vmap` in chunks, sharded over devices with JAX's runtime."""

import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._checks import check_instance
from .._compilation._sharding import auto_mesh as _auto, explicit_to_auto as _explicit_to_auto
from .._custom_types import PyTree
from ._persist import (
    atomic_write,
    fingerprint,
    program_fingerprint,
    progress_bar,
    read_record,
    short,
    write_record,
)


def batch_size_of(args: PyTree) -> int:
    """The common leading axis of every array leaf in `args` (`ValueError` otherwise)."""
    leaves = [x for x in jax.tree.leaves(args) if eqx.is_array_like(x)]
    if not leaves:
        raise ValueError("`batch_map` needs at least one array argument with a batch axis.")
    sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
    if None in sizes or len(sizes) != 1:
        raise ValueError(
            "Every array in the batched arguments needs the same leading (batch) axis; got "
            f"shapes {[jnp.shape(x) for x in leaves]}. Close over arguments that are shared "
            "by the whole batch (or pass them with `eqx.Partial`)."
        )
    return sizes.pop()


def _rows_of(fn, ensemble: bool):
    """The function of a chunk of rows: `fn` vmapped over them, or, with `ensemble=True`,
    `fn` itself (it takes the whole chunk, e.g. a `simulate_ensemble` call), its output
    checked for the chunk's leading axis."""
    if not ensemble:
        return jax.vmap(lambda a: fn(*a))

    def rows(a):
        out = fn(*a)
        check_ensemble_output(out, batch_size_of(a), "`fn`", "row")
        return out

    return rows


def check_ensemble_output(output: PyTree, size: int, function: str, row: str) -> None:
    """With `ensemble=True`, `function` took `size` rows at once: every array of its
    `output` needs that leading axis (`ValueError` otherwise)."""
    shapes = [jnp.shape(x) for x in jax.tree.leaves(output) if eqx.is_array_like(x)]
    if not shapes or any(shape[:1] != (size,) for shape in shapes):
        raise ValueError(
            f"With `ensemble=True`, {function} receives {size} {row}s at once and must "
            "return outputs with a leading axis of that size (e.g. a "
            f"`jaxdae.simulate_ensemble` Solution); got shapes {shapes}. For a function of "
            f"one {row}, use `ensemble=False`."
        )


def chunk_layout(size: int, chunk_size: int | None, devices: int) -> tuple[int, int]:
    """`(per_step, padded)` for a batch of `size` split over `devices`: the rows run at once
    (`chunk_size` per device, at most each device's share of the batch; a multiple of
    `devices`) and the padded batch size (a multiple of `per_step`)."""
    share = -(-size // devices)
    per_step = devices * (share if chunk_size is None else min(chunk_size, share))
    return per_step, -(-size // per_step) * per_step


def _pad(x, pad):
    if pad == 0:
        return x
    return jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)], axis=0)


def batch_spec(mesh: Mesh) -> PartitionSpec:
    """The `PartitionSpec` that splits a batch axis over every axis of `mesh`."""
    return PartitionSpec(tuple(mesh.axis_names))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """`NamedSharding` of a batch split over every axis of `mesh` (for `jax.device_put`)."""
    return NamedSharding(mesh, batch_spec(mesh))


def _place(x, mesh: Mesh, spec: PartitionSpec):
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _chunked_map(fn, args, size: int, chunk_size: int):
    """`fn` over the rows of `args`, `chunk_size` rows at a time (`jax.lax.map`). Outputs of
    size zero (a `Solution`'s `psi` without nonholonomic constraints) are left out of the
    map and filled in after: `jax.lax.map` with a `batch_size` cannot split them. Their
    shapes are read while `fn` is traced for the map, not by a trace of their own."""
    if size == 0:
        return jax.vmap(lambda a: fn(*a))(args)
    outputs = {}

    def nonempty_outputs(a):
        leaves, outputs["tree"] = jax.tree.flatten(fn(*a))
        leaves = [jnp.asarray(x) for x in leaves]
        outputs["leaves"] = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        return [x for x in leaves if x.size]

    kept = iter(jax.lax.map(nonempty_outputs, args, batch_size=chunk_size))
    leaves = [
        next(kept) if math.prod(x.shape) else jnp.zeros((size,) + x.shape, x.dtype)
        for x in outputs["leaves"]
    ]
    return jax.tree.unflatten(outputs["tree"], leaves)


@eqx.filter_jit
def _batch_map(fn, args, chunk_size, mesh, ensemble=False):
    size = batch_size_of(args)
    rows = _rows_of(fn, ensemble)
    if mesh is None and not ensemble:
        if chunk_size is None:
            return rows(args)
        return _chunked_map(fn, args, size, chunk_size)
    # The batch axis is sharded over the mesh and the vmapped program partitioned by XLA
    # (GSPMD): each device runs its slice of every chunk. (`shard_map` would let each device
    # run its own solver loop without meeting the others at every iteration, faster on a
    # forward batch (docs/design_measurements.md#sharding) — but inside it reverse-mode
    # gradients of diffrax's
    # checkpointed loops fail in equinox's closure conversion (with `check_vma=False`; with
    # `check_vma=True` already the linearization in `LagrangianSystem.terms` is refused).)
    # An ensemble's chunks are padded (with copies of the last row, which cannot change a
    # shared step size) rather than run with a smaller remainder, a second compilation.
    mesh = None if mesh is None else _auto(mesh)
    spec = None if mesh is None else batch_spec(mesh)
    devices = 1 if mesh is None else mesh.size
    per_step, padded = chunk_layout(size, chunk_size, devices)
    args = jax.tree.map(lambda x: _pad(jnp.asarray(x), padded - size), args)

    def place(x, spec):
        return x if mesh is None else _place(x, mesh, spec)

    def chunk(a):
        a = jax.tree.map(lambda x: place(x, spec), a)
        return jax.tree.map(lambda x: place(x, spec), rows(a))

    if padded == per_step:
        out = chunk(args)
    else:
        # Device d owns the contiguous rows [d·B/D, (d+1)·B/D) and runs them chunk by chunk:
        # (B,) -> (D, steps, c) -> (steps, D·c), sharded along D·c: no data moves.
        steps = padded // per_step
        local = per_step // devices

        def split(x):
            x = place(x, spec)
            x = x.reshape((devices, steps, local) + x.shape[1:]).swapaxes(0, 1)
            return place(
                x.reshape((steps, per_step) + x.shape[3:]),
                None if mesh is None else PartitionSpec(None, spec[0]),
            )

        def merge(x):
            x = x.reshape((steps, devices, local) + x.shape[2:]).swapaxes(0, 1)
            return place(x.reshape((padded,) + x.shape[3:]), spec)

        out = jax.tree.map(merge, jax.lax.map(chunk, jax.tree.map(split, args)))
    return jax.tree.map(lambda x: x[:size], out)


def batch_map(
    fn: Callable[..., PyTree],
    *args: PyTree,
    chunk_size: int | None = None,
    mesh: Mesh | None = None,
    checkpoint: str | os.PathLike | None = None,
    progress: bool = True,
    ensemble: bool = False,
) -> PyTree:
    """Maps `fn` over the leading axis of `args`: a batch of simulations, chunked and sharded.

    ```python
    def run(q0, v0):
        return jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, ts=ts, throw=False)

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    sol = jaxdae.batch_map(run, q0s, v0s, chunk_size=4096, mesh=mesh)  # sol.q: (B, N, n)
    ```

    With `mesh`, the batch axis is sharded over the mesh (`NamedSharding`) and the jitted,
    vmapped program is partitioned by XLA: device `d` owns the contiguous rows
    `[d·B/D, (d+1)·B/D)` and runs them `chunk_size` at a time (a `jax.lax.map` over chunks,
    a `vmap` per chunk), so memory is bounded by the chunk, not the batch. A batch that is
    not a multiple of `D · chunk_size` is padded with copies of its last element and cut
    back. Without `mesh`, everything runs on the default device
    (`jax.lax.map(..., batch_size=chunk_size)`). Multi-host: call
    `jax.distributed.initialize()` on every process, build the mesh over `jax.devices()`
    (all hosts' devices) and pass global arrays (e.g.
    `jax.make_array_from_process_local_data(jaxdae.batch_sharding(mesh), local)`).
    (`jax.shard_map` is not used: reverse-mode gradients through diffrax's checkpointed loops
    fail inside it, see `docs/benchmarks.md`.)

    **A long sweep never loses work** with `checkpoint=dir`: the chunks then run one after
    the other from Python (each one compiled call, the same program for every chunk), and
    each chunk's output is written to `dir` as soon as it is computed. Calling `batch_map`
    again with the same function and arguments after an interruption computes only the
    chunks that are missing, and returns the same values as an uninterrupted run, bit for
    bit (also after the process was killed). A directory written by another sweep is
    refused, with what differs: another function (its name, the program it computes on a
    chunk, i.e. its code and every value it closes over, or the arrays it binds with
    `eqx.Partial`), other arguments, or another batch size, chunk size, mesh or output
    shapes; a call with fewer (or more) rows is another sweep too, refused with both sizes
    (for some rows of a sweep, resume it whole and slice the result). Each chunk file
    carries the sweep's fingerprint, its index and a digest of all of it: a damaged chunk
    (truncated, empty, edited) is computed again and a damaged `sweep.json` written again,
    with a warning, keeping every intact chunk; a chunk file that holds another chunk (of
    another sweep, or of this one: a file copied over another) is refused, naming both.
    The output is assembled on the host and returned as device arrays (on the mesh when
    given); single-process only.

    **Ensembles** (`ensemble=True`): `fn` receives a whole chunk of rows at once (leading
    axis `chunk_size` per device, or the whole batch without `chunk_size`) and returns
    outputs with that leading axis, typically a [`jaxdae.simulate_ensemble`][] call, whose
    trajectories share their steps. Each chunk is then one ensemble with its own step
    sequence: a million trajectories run as chunks of a few thousand, with the memory of
    one chunk. The batch is padded to whole chunks with copies of its last row (a copy
    does not change a shared step size) and cut back.

    The call is jit-compiled; `fn` is part of the cache key, so pass the same function
    object (or an `eqx.Partial` whose array arguments may change) to reuse the compiled
    program. Simulations inside `fn` should use `throw=False` and report failures through
    `Solution.result`; a raised error stops the whole batch. An error raised while running
    (e.g. a `throw=True` solve that failed) gets a note naming the row of the batch that
    raises: the chunk that raised is run again with halves of its rows (at most
    `log2(chunk_size) + 1` more runs of the chunk; without `checkpoint`, the chunks up to
    the one that raises are run again first). A traced solve's line on standard error
    names the element within its chunk.

    **Arguments:**

    - `fn`: a function of one batch element, `fn(*args_i) -> PyTree` (a Solution, a loss,
        ...). Arguments shared by the batch are closed over or bound with `eqx.Partial`.
    - `*args`: PyTrees whose array leaves all have the batch size `B` as leading axis.
    - `chunk_size`: number of elements vmapped at once per device (default: all).
    - `mesh`: a `jax.sharding.Mesh`; the batch axis is split over all of its axes.
    - `checkpoint`: a directory for the chunks' outputs (default: none, one compiled call).
    - `progress`: with `checkpoint`, show a tqdm progress bar over the chunks (if tqdm is
        installed).
    - `ensemble`: `fn` takes a chunk of rows, not one row (see above).

    **Returns:**

    `fn`'s output with a leading batch axis `B` (sharded over `mesh` when given).

    **Raises:**

    `ValueError` if the arguments disagree on the batch size, `chunk_size < 1`,
    `checkpoint` holds the chunks of another sweep (the message names the directory and
    what differs), or, with `ensemble=True`, `fn`'s output
    lacks the chunk's leading axis.
    """
    if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
        raise ValueError(f"`chunk_size` must be a positive integer or None; got {chunk_size}.")
    check_instance(
        "mesh",
        mesh,
        Mesh,
        "a `jax.sharding.Mesh`, e.g. `jax.make_mesh((jax.device_count(),), ('batch',))`",
        optional=True,
    )
    size = batch_size_of(args)
    args = jax.tree.map(_explicit_to_auto, args)
    chunk_size = None if chunk_size is None else int(chunk_size)
    if checkpoint is None:
        try:
            return _batch_map(fn, args, chunk_size, mesh, bool(ensemble))
        except RuntimeError as error:  # raised while running, by the values of some row
            per_step, padded = chunk_layout(size, chunk_size, 1 if mesh is None else mesh.size)
            _name_failed_row(
                error, fn, args, per_step, mesh, bool(ensemble), range(padded // per_step)
            )
            raise
    return _checkpointed_batch_map(
        fn, args, chunk_size, mesh, Path(checkpoint), progress, bool(ensemble)
    )


def _raised_by_a_check(error: BaseException) -> bool:
    """Whether `error` was raised by a check on values inside the compiled program
    (`eqx.error_if`, e.g. a `throw=True` solve that failed; under the caller's `jax.jit` a
    JAX runtime error that quotes it), rather than by running the program (e.g. out of
    memory)."""
    return isinstance(error, eqx.EquinoxRuntimeError) or "EquinoxRuntimeError" in str(error)


def _name_failed_row(
    error: BaseException, fn, args, per_step: int, mesh, ensemble: bool, chunks
) -> None:
    """Adds to `error`, raised by a sweep of more than one chunk, a note naming the row of
    the batch that raises (the first one, among `chunks`); a traced solve's line on standard
    error names the element within its chunk. The chunks are run again, one after the
    other until one raises, as one compiled program (the chunk's; each with its rows,
    padded by repeating them), then halves of that chunk's rows down to one row."""
    size = batch_size_of(args)
    if per_step >= size or not _raised_by_a_check(error):
        return  # one chunk (its elements are the batch's rows), or not a row's values

    def raises(rows) -> bool:
        rows = np.resize(rows, per_step)
        try:
            jax.block_until_ready(
                _batch_map(fn, jax.tree.map(lambda x: x[rows], args), None, mesh, ensemble)
            )
        except RuntimeError as again:
            return _raised_by_a_check(again)
        return False

    for k in chunks:
        rows = np.arange(k * per_step, min((k + 1) * per_step, size))
        if raises(rows):
            break
    else:
        rows = None
    known = True  # `rows` raise
    while rows is not None and len(rows) > 1:
        half = len(rows) // 2
        known = raises(rows[:half])
        rows = rows[:half] if known else rows[half:]
    if rows is None or not (known or raises(rows)):
        error.add_note(
            "(jaxdae.batch_map: run again chunk by chunk and row by row, no row "
            "raised on its own, so the row that failed is not known.)"
        )
        return
    k = int(rows[0]) // per_step  # the chunk that raised: halving stays within it
    error.add_note(
        f"(jaxdae.batch_map: row {int(rows[0])} of the batch raises, in chunk {k} (rows "
        f"{k * per_step} to {min((k + 1) * per_step, size) - 1}); a batch element named "
        "on standard error counts from the start of its chunk. Simulate with "
        "`throw=False` to have each row's failure in its own `result`.)"
    )


_SWEEP_FILE = "sweep.json"
# The entries of every chunk file besides its arrays: the sweep and the chunk it holds, and
# the digest of all of it (`_chunk_digest`).
_FINGERPRINT, _INDEX, _DIGEST = "sweep_fingerprint", "chunk_index", "chunk_digest"

# What each part of a sweep's identity covers (for the message when one differs).
_PARTS = {
    "function": "another function (another name or code, or other values that it closes "
    "over or binds with `eqx.Partial`)",
    "arguments": "other arguments",
    "layout": "another batch size, chunk size, mesh or output shapes",
}
_FIX = "Use another `checkpoint` directory, or empty this one (its chunks are then computed again)."


def _sweep_identity(fn, args, chunk_args, mesh, ensemble, size, per_step):
    """The parts of a sweep's identity and the output shapes of one chunk.

    The function is identified by its name, the program it computes on a chunk (the text
    of its jaxpr with every literal, and the values of the arrays it closes over: see
    `program_fingerprint`) and the values of its own array leaves (an `eqx.Partial`'s
    arguments), so a changed closure or bound argument is another sweep."""
    program, out_dynamic, out_static = eqx.filter_make_jaxpr(_batch_map)(
        fn, chunk_args, None, mesh, ensemble
    )
    out_shape = eqx.combine(out_dynamic, out_static)
    shapes = [(x.shape, x.dtype) for x in jax.tree.leaves(out_shape)]
    name = getattr(getattr(fn, "func", fn), "__qualname__", type(fn).__qualname__)
    parts = {
        "function": fingerprint(eqx.filter(fn, eqx.is_array), name, program_fingerprint(program)),
        "arguments": fingerprint(args),
        "layout": fingerprint(
            None, size, per_step, shapes, ensemble, None if mesh is None else mesh.shape
        ),
    }
    return parts, fingerprint(None, *sorted(parts.items())), out_shape


def _chunk_digest(arrays, identity: str, index: int) -> str:
    """The digest of a chunk file's content: its arrays, its sweep and its index."""
    return fingerprint(list(arrays), identity, index)


def _read_chunk(path: Path, identity: str, index: int, shapes) -> tuple[str, Any]:
    """What the file `path` holds for chunk `index` of the sweep `identity`: `("ok",
    arrays)`; `("damaged", why)` (unreadable, truncated, content that does not match its
    digest, other shapes); or `("other", (sweep, chunk))` for a chunk of another sweep or
    another chunk of this one (`chunk` None where a file without an index or digest names
    another sweep)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            names = sorted(
                (f for f in data.files if f.startswith("arr_")), key=lambda f: int(f[4:])
            )
            owner = str(data[_FINGERPRINT]) if _FINGERPRINT in data.files else None
            if _DIGEST not in data.files or _INDEX not in data.files:
                if owner is not None and owner != identity:
                    return "other", (owner, None)
                return "damaged", "it has no chunk index or digest"
            place, digest = int(data[_INDEX]), str(data[_DIGEST])
            arrays = [data[f] for f in names]
    except Exception as error:  # a truncated or overwritten file: zipfile, OSError, KeyError
        return "damaged", f"{type(error).__name__}: {error}"
    if digest != _chunk_digest(arrays, str(owner), place):
        return "damaged", "its content does not match the digest written with it"
    if owner != identity or place != index:
        return "other", (owner, place)
    if len(arrays) != len(shapes):
        return "damaged", f"{len(arrays)} arrays, expected {len(shapes)}"
    for array, (shape, dtype) in zip(arrays, shapes, strict=True):
        if array.shape != shape or array.dtype != dtype:
            return "damaged", (
                f"an array of shape {array.shape} {array.dtype}, expected {shape} {dtype}"
            )
    return "ok", arrays


def _refuse_chunk(path: Path, identity: str, index: int, owner: tuple) -> None:
    """The `ValueError` for a chunk file that holds another chunk (`owner`: its sweep and
    index), naming both."""
    sweep, place = owner
    held = "a chunk" if place is None else f"chunk {place}"
    if sweep == identity:
        what = f"{held} of this sweep ({short(identity)}), not chunk {index}"
    else:
        what = (
            f"{held} of another sweep ({short(sweep)}), not chunk {index} of this sweep "
            f"({short(identity)})"
        )
    raise ValueError(
        f"{path} holds {what}: a chunk file copied over another one? Resuming would return "
        "those rows in the place of others. Delete it (the chunk is then computed again), "
        "or use another `checkpoint` directory."
    )


def _check_sweep_file(directory: Path, parts: dict, identity: str, paths, shapes, record):
    """Accepts `directory` for this sweep or refuses it (`ValueError`). A missing or damaged
    `sweep.json` is (re)written when no chunk on disk belongs to another sweep."""
    meta = directory / _SWEEP_FILE
    damaged = None
    if meta.exists():
        try:
            old = read_record(meta, _FIX)
        except ValueError as error:
            damaged = error
        else:
            if old.get("fingerprint") == identity:
                return
            differ = [
                text
                for part, text in _PARTS.items()
                if old.get("parts", {}).get(part) != parts[part]
            ]
            sizes = ""
            if (old.get("size"), old.get("chunks")) != (record["size"], record["chunks"]):
                sizes = (
                    f" It holds a sweep of {old.get('size')} rows in {old.get('chunks')} "
                    f"chunks, this call has {record['size']} rows in "
                    f"{record['chunks']} chunks: a directory holds one sweep (to get "
                    "some of its rows, resume the whole sweep and slice its result)."
                )
            raise ValueError(
                f"{directory} holds the chunks of another sweep ({'; '.join(differ)}) than "
                f"this call of `batch_map`: resuming would return that sweep's results (sweep "
                f"{short(str(old.get('fingerprint')))} on disk, {short(identity)} "
                f"here).{sizes} {_FIX}"
            )
    others = [
        path
        for k, path in enumerate(paths)
        if path.exists() and _read_chunk(path, identity, k, shapes)[0] == "other"
    ]
    if others:
        raise ValueError(
            f"{directory} holds the chunks of another sweep ({others[0].name} and "
            f"{len(others) - 1} more), and its {_SWEEP_FILE} is "
            f"{'damaged' if damaged else 'missing'}. {_FIX}"
        )
    if damaged is not None:
        warnings.warn(
            f"{damaged.args[0].split('. ')[0]}; it was written again: the chunks "
            "of this sweep on disk are kept, damaged ones computed again.",
            stacklevel=4,
        )
    write_record(meta, record)


def _checkpointed_batch_map(
    fn, args, chunk_size, mesh, directory: Path, progress: bool, ensemble: bool
):
    """`batch_map` chunk by chunk from Python, each chunk's output saved in `directory`
    (`chunk_000000.npz`, ... with the sweep's fingerprint, the chunk's index and their
    digest) and reused by a later call with the same sweep; a damaged chunk is computed
    again, another chunk (another sweep's, or another index) refused."""
    if jax.process_count() > 1:
        raise ValueError(
            "`checkpoint` works in a single process; in a multi-host run, "
            "checkpoint each process's share of the sweep yourself."
        )
    size = batch_size_of(args)
    mesh = None if mesh is None else _auto(mesh)
    per_step, padded = chunk_layout(size, chunk_size, 1 if mesh is None else mesh.size)
    given = args
    args = jax.tree.map(lambda x: _pad(jnp.asarray(x), padded - size), args)
    num_chunks = padded // per_step

    def chunk(k):
        return jax.tree.map(lambda x: x[k * per_step : (k + 1) * per_step], args)

    # One chunk is one vmap (or one ensemble) over `per_step` rows (split over the mesh):
    # one compilation, traced once here for the sweep's identity and reused by the calls.
    parts, identity, out_shape = _sweep_identity(
        fn, given, chunk(0), mesh, ensemble, size, per_step
    )
    leaves_shape, treedef = jax.tree.flatten(out_shape)
    shapes = [(x.shape, np.dtype(x.dtype)) for x in leaves_shape]
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"chunk_{k:06d}.npz" for k in range(num_chunks)]
    name = getattr(getattr(fn, "func", fn), "__qualname__", type(fn).__qualname__)
    _check_sweep_file(
        directory,
        parts,
        identity,
        paths,
        shapes,
        {
            "fingerprint": identity,
            "parts": parts,
            "function": name,
            "size": size,
            "chunks": num_chunks,
        },
    )
    saved: list = [None] * num_chunks
    for k, path in enumerate(paths):
        if path.exists():
            status, read = _read_chunk(path, identity, k, shapes)
            if status == "other":
                _refuse_chunk(path, identity, k, read)
            if status == "damaged":
                warnings.warn(
                    f"{path} is damaged ({read}); the chunk is computed again.", stacklevel=3
                )
            else:
                saved[k] = read
    done = sum(x is not None for x in saved)
    bar = progress_bar(num_chunks, done, progress, "batch_map")
    try:
        for k, path in enumerate(paths):
            if saved[k] is not None:
                continue
            try:
                out = [
                    np.asarray(x)
                    for x in jax.tree.leaves(_batch_map(fn, chunk(k), None, mesh, ensemble))
                ]
            except RuntimeError as error:  # raised while running, by the values of some row
                _name_failed_row(error, fn, given, per_step, mesh, ensemble, [k])
                raise
            digest = _chunk_digest(out, identity, k)
            atomic_write(
                path,
                lambda file, out=out, k=k, digest=digest: np.savez(
                    file,
                    *out,
                    **{
                        _FINGERPRINT: np.array(identity),
                        _INDEX: np.array(k),
                        _DIGEST: np.array(digest),
                    },
                ),
            )
            saved[k] = out
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    leaves = [np.concatenate(column)[:size] for column in zip(*saved, strict=False)]
    if mesh is None or size % mesh.size:  # an uneven split cannot be placed on the mesh
        return jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    return jax.tree.unflatten(treedef, [jax.device_put(x, batch_sharding(mesh)) for x in leaves])
