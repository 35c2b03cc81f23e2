"""Large batches of simulations: `vmap` in chunks, sharded over devices with JAX's runtime."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._checks import check_instance
from ._custom_types import PyTree
from ._sharding import auto_mesh as _auto, explicit_to_auto as _explicit_to_auto


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


def _local_map(fn, args, chunk_size):
    def one(a):
        return fn(*a)

    if chunk_size is None:
        return jax.vmap(one)(args)
    return jax.lax.map(one, args, batch_size=chunk_size)


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


@eqx.filter_jit
def _batch_map(fn, args, chunk_size, mesh):
    size = batch_size_of(args)
    if mesh is None:
        return _local_map(fn, args, chunk_size)
    # The batch axis is sharded over the mesh and the vmapped program partitioned by XLA
    # (GSPMD): each device runs its slice of every chunk. (`shard_map` would let each device
    # run its own solver loop without meeting the others at every iteration — 1.47× on a
    # forward batch on 2 CPU devices — but inside it reverse-mode gradients of diffrax's
    # checkpointed loops fail in equinox's closure conversion (with `check_vma=False`; with
    # `check_vma=True` already the linearization in `LagrangianSystem.terms` is refused).)
    mesh = _auto(mesh)
    spec = batch_spec(mesh)
    per_step, padded = chunk_layout(size, chunk_size, mesh.size)
    args = jax.tree.map(lambda x: _pad(jnp.asarray(x), padded - size), args)

    def one(a):
        return fn(*a)

    def chunk(a):
        a = jax.tree.map(lambda x: _place(x, mesh, spec), a)
        return jax.tree.map(lambda x: _place(x, mesh, spec), jax.vmap(one)(a))

    if padded == per_step:
        out = chunk(args)
    else:
        # Device d owns the contiguous rows [d·B/D, (d+1)·B/D) and runs them chunk by chunk:
        # (B,) -> (D, steps, c) -> (steps, D·c), sharded along D·c: no data moves.
        steps, devices = padded // per_step, mesh.size
        local = per_step // devices

        def split(x):
            x = _place(x, mesh, spec)
            x = x.reshape((devices, steps, local) + x.shape[1:]).swapaxes(0, 1)
            return _place(x.reshape((steps, per_step) + x.shape[3:]), mesh,
                          PartitionSpec(None, spec[0]))

        def merge(x):
            x = x.reshape((steps, devices, local) + x.shape[2:]).swapaxes(0, 1)
            return _place(x.reshape((padded,) + x.shape[3:]), mesh, spec)

        out = jax.tree.map(merge, jax.lax.map(chunk, jax.tree.map(split, args)))
    return jax.tree.map(lambda x: x[:size], out)


def batch_map(
    fn: Callable[..., PyTree],
    *args: PyTree,
    chunk_size: int | None = None,
    mesh: Mesh | None = None,
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

    The call is jit-compiled; `fn` is part of the cache key, so pass the same function
    object (or an `eqx.Partial` whose array arguments may change) to reuse the compiled
    program. Simulations inside `fn` should use `throw=False` and report failures through
    `Solution.result`; a raised error would stop the whole batch.

    **Arguments:**

    - `fn`: a function of one batch element, `fn(*args_i) -> PyTree` (a Solution, a loss,
        ...). Arguments shared by the batch are closed over or bound with `eqx.Partial`.
    - `*args`: PyTrees whose array leaves all have the batch size `B` as leading axis.
    - `chunk_size`: number of elements vmapped at once per device (default: all).
    - `mesh`: a `jax.sharding.Mesh`; the batch axis is split over all of its axes.

    **Returns:**

    `fn`'s output with a leading batch axis `B` (sharded over `mesh` when given).

    **Raises:**

    `ValueError` if the arguments disagree on the batch size or `chunk_size < 1`.
    """
    if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
        raise ValueError(f"`chunk_size` must be a positive integer or None; got {chunk_size}.")
    check_instance("mesh", mesh, Mesh, "a `jax.sharding.Mesh`, e.g. "
                   "`jax.make_mesh((jax.device_count(),), ('batch',))`", optional=True)
    batch_size_of(args)
    args = jax.tree.map(_explicit_to_auto, args)
    return _batch_map(fn, args, None if chunk_size is None else int(chunk_size), mesh)
