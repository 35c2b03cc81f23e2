"""A bounded while loop whose reverse mode stores the carry of every pass.

The event loop of an event-driven solve (`_integration/_events.py`) runs few passes (at
most `EventDriven.max_events + 1`), each a whole diffrax solve. Its reverse mode needs the
carry at the start of each pass, and storing all of them costs little. What costs is the
trace: equinox's checkpointed `while_loop` (the general tool, for loops of unknown length)
linearizes its body several times to find which values are perturbed and which
cotangents are zero, and every diffrax solve inside the body does the same again inside
each of those traces. This loop's backward pass is one `jax.vjp` of the body, traced once,
inside a loop that runs over the stored passes in reverse; every floating-point value of
the carry is taken as perturbed, and of the values the body closes over those that the
caller differentiates (equinox's `perturbed`): the others stay constants of the pass's
linearization, which is then smaller.

It has reverse mode only (`jax.vjp`, `jax.grad`, and either under `jax.vmap`), as every
custom VJP: a solve differentiated in forward mode runs its events in a `lax.while_loop`
instead. Its memory is that of a checkpoint per pass, as equinox's loop with as many
checkpoints as passes. Under `jax.vmap` each of its two loops (the passes, and the passes
back) batches its body once (`_batching.py`). `tests/test_stored_loop.py` checks it against
equinox's loop.
"""

from collections.abc import Callable
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ._batching import batched_like

Carry = TypeVar("Carry")


def _split(tree):
    # The floating-point leaves, and Python floats: a closed-over Python float that is
    # differentiated reaches the backward pass as its primal value.
    return eqx.partition(tree, lambda x: isinstance(x, float) or eqx.is_inexact_array(x))


def _while(cond_fun, body_fun, carry, max_steps: int, store: bool):
    """The loop from `carry`; with `store`, also every pass's starting carry (in a buffer of
    `max_steps` rows) and the number of passes."""

    def cond(state):
        step, value, _ = state
        return (step < max_steps) & cond_fun(value)

    def body(state):
        step, value, stored = state
        if stored is not None:
            stored = jax.tree.map(lambda rows, leaf: rows.at[step].set(leaf), stored, value)
        return step + 1, body_fun(value), stored

    stored = None
    if store:
        stored = jax.tree.map(lambda leaf: jnp.zeros((max_steps,) + leaf.shape, leaf.dtype), carry)
    # Under `vmap` the passes' count differs between members: the predicate is batched,
    # and with it every value of the state.
    state = batched_like((jnp.asarray(0), carry, stored), (cond_fun, body_fun, carry))
    return jax.lax.while_loop(cond, body, state)


@eqx.filter_custom_vjp
def _stored_loop(operands, max_steps):
    cond_fun, body_fun, carry = operands
    _, final, _ = _while(cond_fun, body_fun, carry, max_steps, store=False)
    return final


@_stored_loop.def_fwd
def _stored_loop_fwd(perturbed, operands, max_steps):
    del perturbed
    cond_fun, body_fun, carry = operands
    passes, final, stored = _while(cond_fun, body_fun, carry, max_steps, store=True)
    return final, (passes, stored)


@_stored_loop.def_bwd
def _stored_loop_bwd(residuals, final_cotangent, perturbed, operands, max_steps):
    passes, stored = residuals
    cond_fun, body_fun, carry = operands
    body_diff, body_static = eqx.partition(body_fun, perturbed[1])
    final_cotangent = jax.tree.map(
        lambda leaf, ct: None if leaf is None else jnp.zeros_like(leaf) if ct is None else ct,
        _split(carry)[0],
        final_cotangent,
        is_leaf=lambda x: x is None,
    )

    def one_pass(step, carry_cotangent, body_cotangent):
        start = jax.tree.map(lambda rows: rows[step], stored)
        start_diff, start_static = _split(start)

        def pass_of(body_d, carry_d):
            out = eqx.combine(body_d, body_static)(eqx.combine(carry_d, start_static))
            return _split(out)[0]

        _, vjp = jax.vjp(pass_of, body_diff, start_diff)
        body_ct, carry_ct = vjp(carry_cotangent)
        return carry_ct, jax.tree.map(jnp.add, body_cotangent, body_ct)

    def cond(state):
        return state[0] >= 0

    def body(state):
        step, carry_ct, body_ct = state
        carry_ct, body_ct = one_pass(step, carry_ct, body_ct)
        return step - 1, carry_ct, body_ct

    body_zero = jax.tree.map(jnp.zeros_like, body_diff)
    state = batched_like((passes - 1, final_cotangent, body_zero), (passes, stored))
    _, carry_ct, body_ct = jax.lax.while_loop(cond, body, state)
    return (jax.tree.map(lambda _: None, cond_fun), body_ct, carry_ct)


def stored_while_loop(
    cond_fun: Callable[[Carry], jax.Array],
    body_fun: Callable[[Carry], Carry],
    init: Carry,
    *,
    max_steps: int,
) -> Carry:
    """`body_fun` applied to `init` while `cond_fun` holds, at most `max_steps` times
    (module docstring). Values that `body_fun` closes over are differentiated too."""
    init = jax.tree.map(jnp.asarray, init)
    body = eqx.filter_closure_convert(body_fun, init)
    cond = eqx.filter_closure_convert(cond_fun, init)
    return _stored_loop((cond, body, init), max_steps)
