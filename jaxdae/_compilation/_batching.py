"""A loop's carry batched from its start under `jax.vmap`.

The batching rule of `lax.while_loop` (and so of `fori_loop` and `scan` with a carry)
batches the loop's body until it has found which values of the carry end up batched:
once with the carry as it enters the loop, once more for every value it then finds
batched, and, where that last pass differs from the one it builds the loop from, once
more for that. Each pass over a body that holds a diffrax solve, an impact or their
linearization costs about as much as tracing it, and a loop inside the body is batched
again at each pass of the loop around it. A loop whose carry starts with zeros (the
cotangents a backward pass accumulates, a buffer of rows) that a batched body fills
pays one pass more per such value, at each level of nesting. [`batched_like`][] makes
those values batched from the start wherever the values they will follow are, so that
the rule's first pass finds the carry as it stays (JAX caches that pass for the loop it
builds).
"""

import equinox as eqx
import jax
import jax.numpy as jnp


@jax.custom_batching.custom_vmap
def _aligned(tree, reference):
    del reference
    return tree


@_aligned.def_vmap
def _aligned_batched(axis_size, in_batched, tree, reference):
    del reference
    tree_batched, reference_batched = in_batched
    if not any(jax.tree.leaves(reference_batched)):
        return tree, tree_batched
    tree = jax.tree.map(
        lambda batched, x: x if batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)),
        tree_batched,
        tree,
    )
    return tree, jax.tree.map(lambda _: True, tree)


def batched_like(tree, reference):
    """`tree` (a pytree of arrays) unchanged; under `jax.vmap`, with every leaf batched
    wherever a leaf of `reference` is (module docstring). For the initial carry of a loop
    whose body makes it batched anyway: a value that would stay unbatched is computed once
    per member instead. Not differentiated (`jax.custom_batching.custom_vmap` has no
    reverse mode): for the loops of backward passes and of custom VJPs' forward passes."""
    reference = [x for x in jax.tree.leaves(reference) if eqx.is_array(x)]
    return _aligned(tree, reference)
