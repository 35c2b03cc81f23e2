"""`eqx.filter_jit` for the functions a solve calls inside its own trace, keeping the
caller's constants constant.

`eqx.filter_jit` makes every array argument an input of the jitted function, so that one
program serves all values of the same shape. Inside an enclosing `jax.jit`, though, the
program is traced once into the caller's, and an array that the caller holds as a constant
(a model closed over by the user's jitted function: a robot's joint axes, its link frames
and inertias) would become a traced input there. The scalar graphs (`_scalarize.py`) then
keep every product with its zeros and ones, which a constant would have folded away. So
where the call is traced for a jit, [`jit_with_constants`][] passes such arrays as static
data, compared by value, and the jitted function sees them as the constants they are.
Eager calls keep `eqx.filter_jit`'s behaviour: their compiled program is shared by all
values. A solve's own compiled program is jitted only where nothing encloses it
([`jit_unless_staged`][]).

Values that are constant for differentiation (a reference state, the inputs of checks)
are [`detached`][].
"""

import functools
from collections.abc import Callable

import equinox as eqx
import jax
import numpy as np

from .. import _thresholds
from ._private_apis import traced_for_jit


class _Constant:
    """A concrete array held as static data of a jitted call: equal to another exactly
    when its type, dtype, weak type, shape and bytes are (so `0.0` and `-0.0` differ, and a
    `nan` equals itself), as a constant of a traced program must be to be reused."""

    __slots__ = ("array", "_key")

    def __init__(self, array):
        host = np.asarray(array)
        self.array = array
        self._key = (
            type(array),
            host.dtype.str,
            bool(getattr(array, "weak_type", False)),
            host.shape,
            host.tobytes(),
        )

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Constant) and self._key == other._key


def _is_constant(x) -> bool:
    """A concrete array of numbers or booleans (not PRNG keys or objects) small enough to be
    folded into a scalar graph (`MAX_ELEMENTS`), on one device."""
    if not (
        isinstance(x, np.ndarray | jax.Array)
        and isinstance(x.dtype, np.dtype)
        and x.dtype.kind in "biufc"
        and x.size <= _thresholds.MAX_ELEMENTS
    ):
        return False
    return isinstance(x, np.ndarray) or (
        not isinstance(x, jax.core.Tracer) and len(x.sharding.device_set) == 1
    )


def _unwrap(tree):
    return jax.tree.map(
        lambda x: x.array if isinstance(x, _Constant) else x,
        tree,
        is_leaf=lambda x: isinstance(x, _Constant),
    )


def jit_with_constants(fn: Callable) -> Callable:
    """`eqx.filter_jit(fn)`; where the call is traced for an enclosing `jax.jit` (under
    `grad` or `vmap` too), its concrete array arguments of at most `MAX_ELEMENTS` entries
    stay constants of `fn`'s trace (module docstring)."""

    def unwrapped(*args, **kwargs):
        return fn(*_unwrap(args), **_unwrap(kwargs))

    # Named and signed as `fn` (equinox follows `__wrapped__`): the name of its calls in the
    # traced program and in profiles. Not its annotations: the arguments may be `_Constant`s.
    functools.update_wrapper(
        unwrapped, fn, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=()
    )
    jitted = eqx.filter_jit(unwrapped)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if traced_for_jit((args, kwargs)):
            args, kwargs = jax.tree.map(
                lambda x: _Constant(x) if _is_constant(x) else x, (args, kwargs)
            )
        return jitted(*args, **kwargs)

    return call


def jit_unless_staged(fn: Callable) -> Callable:
    """`eqx.filter_jit(fn)`, but `fn` itself when its input is traced for an enclosing
    `jax.jit` (under `grad` or `vmap` too), which compiles it whole anyway.

    JAX stages a jitted function before it differentiates it, and staging a custom VJP
    (the swept solve, diffrax's checkpointed loop) traces its primal solve, which reverse
    mode then does not use: it traces the forward solve. Called inline, only the forward
    solve is traced, which shortens the gradient's trace by a fifth or so on the two-link
    benchmark (`experiments/benchmarks/bench_compile.py --only gradient`). The price: a loss that
    calls `fn` several times traces each call's solves (the jitted `fn`'s are cached); at three
    calls the two trace equally long. Eager calls, eager `jax.grad` and `jax.vmap` included, keep
    the jitted `fn`: they run its compiled program rather than one operation at a time."""
    jitted = eqx.filter_jit(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return (fn if traced_for_jit((args, kwargs)) else jitted)(*args, **kwargs)

    call.jitted = jitted
    return call


def detached(tree):
    """`tree` with `stop_gradient` on its arrays (a computation on it is not linearized)."""
    return jax.tree.map(lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x, tree)
