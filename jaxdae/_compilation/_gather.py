"""Gathers at static indices whose transpose is again a gather.

[`take`][] and [`add_at`][] read and accumulate entries at index arrays fixed while
tracing. They are one primitive whose transpose is a gather at static indices (the entries
that read each source entry, summed), not the scatter-add JAX transposes a gather into:
XLA's CPU backend runs a scatter as a serial loop over its entries, which made the reverse
pass of a sparse product several times its forward pass
(docs/design_measurements.md#gathers).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.interpreters import ad, batching, mlir

from .. import _thresholds
from .._custom_types import Array


def row_sum(x: Array) -> Array:
    """`x.sum(axis=1)` (the padded axis of a gather)."""
    width = x.shape[1]
    if width > _thresholds.SLICED_SUM_MAX:
        return jnp.sum(x, axis=1)
    total = x[:, 0]
    for w in range(1, width):
        total = total + x[:, w]
    return total


def group_by(keys: np.ndarray, num: int, items: np.ndarray, fill: int):
    """`items` grouped by `keys` (in `range(num)`) into a `(num, width)` array padded with
    `fill`."""
    order = np.argsort(keys, kind="stable")
    keys, items = keys[order], items[order]
    counts = np.bincount(keys, minlength=num)
    width = max(int(counts.max(initial=0)), 1)
    out = np.full((num, width), fill, np.int64)
    slot = np.arange(keys.size) - np.repeat(np.cumsum(counts) - counts, counts)
    out[keys, slot] = items
    return out


class _Table:
    """A static index table `(rows, width)` into a source of `size` entries along axis 0:
    entry `i` of the result is the sum of the source entries `table[i, :]`, index `size`
    standing for zero (padding). Hashable and compared by value (a primitive parameter)."""

    __slots__ = ("_hash", "_transposed", "index", "size")

    def __init__(self, index: np.ndarray, size: int):
        self.index = np.asarray(index, np.int64)
        self.index.setflags(write=False)
        self.size = int(size)
        self._hash = hash((self.index.shape, self.size, self.index.tobytes()))
        self._transposed = None

    def transposed(self) -> "_Table":
        """The table of the transpose: for each source entry, the result entries that read
        it (padded with the number of result entries)."""
        if self._transposed is None:
            rows, width = self.index.shape
            flat = self.index.reshape(-1)
            reads = flat < self.size
            readers = np.repeat(np.arange(rows), width)[reads]
            self._transposed = _Table(group_by(flat[reads], self.size, readers, rows), rows)
            self._transposed._transposed = self
        return self._transposed

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (
            isinstance(other, _Table)
            and self.size == other.size
            and self.index.shape == other.index.shape
            and np.array_equal(self.index, other.index)
        )


def _gather_sum(x, *, table: _Table):
    padded = jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])
    gathered = padded[table.index]
    return row_sum(gathered)


def _gather_sum_batched(args, dims, *, table: _Table):
    (x,), (dim,) = args, dims
    if dim == 0:  # the gathered axis first, the batch after it
        x, dim = jnp.moveaxis(x, 0, 1), 1
    return _gather_sum_p.bind(x, table=table), dim


_gather_sum_p = jex.Primitive("jaxdae_gather_sum")
_gather_sum_p.def_impl(_gather_sum)
_gather_sum_p.def_abstract_eval(
    lambda x, *, table: jax.core.ShapedArray((table.index.shape[0],) + x.shape[1:], x.dtype)
)
ad.deflinear2(
    _gather_sum_p, lambda ct, x, *, table: [_gather_sum_p.bind(ct, table=table.transposed())]
)
batching.primitive_batchers[_gather_sum_p] = _gather_sum_batched
mlir.register_lowering(_gather_sum_p, mlir.lower_fun(_gather_sum, multiple_results=False))


def take(x: Array, index) -> Array:
    """`x[index]` along axis 0 for a static integer `index` array (numpy, any shape); an
    index equal to `len(x)` gives zeros (padding). Differentiated, batched and transposed as
    a gather: the transpose gathers, for each entry of `x`, the entries that read it."""
    index = np.asarray(index, np.int64)
    if index.size == 0 or x.shape[0] == 0:
        padded = jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])
        return padded[index]
    out = _gather_sum_p.bind(
        x, table=_table(index.reshape(-1, 1).tobytes(), index.size, x.shape[0])
    )
    return out.reshape(index.shape + x.shape[1:])


def add_at(x: Array, index, values: Array) -> Array:
    """`x.at[index].add(values)` along axis 0 for a static integer `index` array (numpy, any
    shape; `values` of shape `index.shape + x.shape[1:]`), as the transpose of [`take`][]: a
    gather of the entries added to each row of `x`, not a scatter (which keeps XLA:CPU from
    compiling a solve's loop into one kernel)."""
    index = np.asarray(index, np.int64).reshape(-1)
    if index.size == 0:
        return x
    values = jnp.reshape(values, (index.size,) + x.shape[1:])
    table = _table(index.reshape(-1, 1).tobytes(), index.size, x.shape[0]).transposed()
    return x + _gather_sum_p.bind(values.astype(x.dtype), table=table)


@functools.lru_cache(maxsize=1024)
def _table(index_bytes: bytes, count: int, size: int) -> _Table:
    return _Table(np.frombuffer(index_bytes, np.int64).reshape(count, 1), size)
