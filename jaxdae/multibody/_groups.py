"""Elements of one kind evaluated together.

A [`jaxdae.multibody.Mechanism`][] of many joints, bodies and force elements writes its
equations once per *group*: the elements of one class with the same static configuration and
the same shapes of parameters. A group's parameters are stacked along a leading axis and its
formula runs once under `jax.vmap`, so that the traced program grows with the number of kinds
of element, not with the number of elements (a chain of 64 revolute joints traces one
revolute residual). The elements stay the mechanism's leaves (its public structure and
`eqx.filter_grad` are unchanged); their parameters are stacked while tracing (one `stack`
equation per parameter of a group).
"""

import dataclasses
from collections.abc import Callable, Hashable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._gather import take
from .._custom_types import Array

# Static fields that name an element's markers (and its name): the elements of a group may
# differ in them; the group reads the markers' frames by position instead.
_REFERENCES = frozenset({"a", "b", "at", "name"})


def group_key(element, markers: Sequence[str]) -> Hashable | None:
    """A key under which elements evaluate together, or `None` for one that must evaluate
    alone: a parameter that is not an array (a Python function, e.g. a `Driver`'s `motion`,
    a function actuator) or a static field that cannot be hashed.

    Equal keys mean: the same class, equal static fields (other than the marker names and the
    name), the same structure and shapes of parameters, and the same pattern of repeated
    markers (so that reading the markers by position is the same as by name)."""
    parts: list = [type(element)]
    for field in dataclasses.fields(element):
        if field.name in _REFERENCES:
            continue
        value = getattr(element, field.name)
        if field.metadata.get("static", False):
            try:
                hash(value)
            except TypeError:
                return None
            parts.append((field.name, value))
            continue
        leaves, treedef = jax.tree_util.tree_flatten(value)
        if not all(eqx.is_array(leaf) for leaf in leaves):
            return None
        parts.append(
            (field.name, treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves))
        )
    markers = tuple(markers)
    parts.append(tuple(markers.index(m) for m in markers))
    return tuple(parts)


def groups(keys: Sequence[Hashable | None]) -> list[list[int]]:
    """The indices of the elements, grouped by equal keys in order of first appearance; an
    element with key `None` is a group of its own."""
    out: list[list[int]] = []
    where: dict = {}
    for index, key in enumerate(keys):
        if key is None:
            out.append([index])
        elif key in where:
            out[where[key]].append(index)
        else:
            where[key] = len(out)
            out.append([index])
    return out


def vmapped(elements: Sequence[eqx.Module], fn: Callable, *args):
    """`fn(element, *args)` for every element, as one `jax.vmap` over the elements' stacked
    parameters and the leading axis of `args` (the elements share one group key; the
    static fields are the first element's)."""
    treedef = jax.tree_util.tree_structure(elements[0])
    leaves = [
        jnp.stack(column)
        for column in zip(*(jax.tree_util.tree_leaves(e) for e in elements), strict=True)
    ]
    if not leaves:
        return jax.vmap(lambda *a: fn(elements[0], *a))(*args)
    return jax.vmap(lambda ls, *a: fn(jax.tree_util.tree_unflatten(treedef, ls), *a))(leaves, *args)


def reorder(parts: Sequence[Array], positions: Sequence[int | np.integer]) -> Array:
    """The concatenated `parts` with entry `i` moved to `positions[i]` (one gather at static
    indices, `_gather.take`; none when they are in order)."""
    flat = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    positions = np.asarray(positions, dtype=np.int64)
    if np.array_equal(positions, np.arange(positions.shape[0])):
        return flat
    return take(flat, np.argsort(positions))
