"""`stored_while_loop` (`_compilation/_stored_loop.py`) against equinox's checkpointed loop."""

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdae._compilation._batching import batched_like
from jaxdae._compilation._stored_loop import stored_while_loop

from ._jaxprs import equations


def _stored(cond_fun, body_fun, init, max_steps):
    return stored_while_loop(cond_fun, body_fun, init, max_steps=max_steps)


def _checkpointed(cond_fun, body_fun, init, max_steps):
    return eqxi.while_loop(
        cond_fun, body_fun, init, max_steps=max_steps, kind="checkpointed", checkpoints=max_steps
    )


def _grown(rate, x0, loop, max_steps=30):
    """A state that grows by `rate` (closed over, as a Python float or an array) until its
    sum passes 50, carried with an integer counter and a flag: a loss of the final state
    and the counter."""

    def body(carry):
        count, x, done = carry
        x = x * rate + 0.1 * jnp.sin(x)
        return count + 1, x, x.sum() > 50.0

    count, x, _ = loop(lambda c: ~c[2], body, (0, x0, jnp.asarray(False)), max_steps)
    return jnp.sum(x**2) + count


X0 = jnp.array([1.0, 2.0])


@pytest.mark.parametrize("rate", [1.1, jnp.asarray(1.3)])
def test_gradient_matches_equinox_checkpointed_loop(rate):
    got = jax.grad(_grown, argnums=(0, 1))(rate, X0, _stored)
    want = jax.grad(_grown, argnums=(0, 1))(rate, X0, _checkpointed)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13)
    # Against central differences, so that both cannot be wrong together.
    h = 1e-6
    rate = float(rate)
    central = (_grown(rate + h, X0, _stored) - _grown(rate - h, X0, _stored)) / (2 * h)
    np.testing.assert_allclose(got[0], central, rtol=1e-6)


def test_batched_gradients_with_different_pass_counts():
    rates = jnp.array([1.05, 1.3, 2.0])  # 28, 11 and 5 passes
    per_member = jax.grad(lambda r, x: _grown(r, x, _stored), argnums=(0, 1))
    got = jax.jit(jax.vmap(per_member, in_axes=(0, None)))(rates, X0)
    for i, rate in enumerate(rates):
        want = jax.grad(_grown, argnums=(0, 1))(rate, X0, _checkpointed)
        np.testing.assert_allclose(got[0][i], want[0], rtol=1e-13)
        np.testing.assert_allclose(got[1][i], want[1], rtol=1e-13)
    summed = jax.grad(lambda r: jax.vmap(lambda b: _grown(b, X0, _stored))(r).sum())(rates)
    np.testing.assert_allclose(summed, got[0], rtol=1e-13)


def test_stops_at_max_steps_like_equinox():
    got = _grown(1.05, X0, _stored, max_steps=4)
    want = _grown(1.05, X0, _checkpointed, max_steps=4)
    np.testing.assert_allclose(got, want, rtol=1e-15)
    np.testing.assert_allclose(
        jax.grad(_grown)(1.05, X0, _stored, 4), jax.grad(_grown)(1.05, X0, _checkpointed, 4)
    )


def test_a_closed_over_array_not_differentiated_stays_a_constant():
    """Of the values the body closes over, only the differentiated ones are linearized: the
    backward pass of a loss differentiated by `rate` alone is a smaller program than by
    `rate` and `scale`, and the gradients are equinox's loop's."""

    def loss(rate, scale, loop):
        def body(carry):
            count, x, done = carry
            x = x * rate + 0.1 * jnp.sin(scale * x)
            return count + 1, x, x.sum() > 50.0

        count, x, _ = loop(lambda c: ~c[2], body, (0, X0, jnp.asarray(False)), 30)
        return jnp.sum(x**2) + count

    rate, scale = jnp.asarray(1.2), jnp.array([0.5, 2.0])
    for argnums in (0, (0, 1)):
        got = jax.grad(loss, argnums)(rate, scale, _stored)
        want = jax.grad(loss, argnums)(rate, scale, _checkpointed)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-13)

    def size(argnums):
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums), static_argnums=2)(rate, scale, _stored)
        return len(list(equations(jaxpr.jaxpr)))

    assert size(0) < size((0, 1))


def _probe(calls: list):
    """The identity, whose batching rule appends `(axis size, which leaves are batched)` to
    `calls`: it runs once per batching pass over a body that calls it, and only where its
    input is batched."""

    @jax.custom_batching.custom_vmap
    def probe(tree):
        return tree

    @probe.def_vmap
    def _(axis_size, in_batched, tree):
        calls.append((axis_size, in_batched[0]))
        return tree, in_batched[0]

    return probe


def test_batched_loop_batches_its_body_once():
    """Under `jax.vmap` the loop's body is batched once, not once per value of the carry
    found batched and once more for the loop: a marker in the body (the identity, with a
    batching rule that counts its calls) is batched once, and the batched loop gives each
    member's result."""
    calls = []
    marker = _probe(calls)

    def grown(rate):
        def body(carry):
            count, x, done = carry
            x = marker(x) * rate + 0.1 * jnp.sin(x)
            return count + 1, x, x.sum() > 50.0

        return stored_while_loop(lambda c: ~c[2], body, (0, X0, jnp.asarray(False)), max_steps=30)

    rates = jnp.array([1.05, 1.3, 2.0])
    count, x, done = jax.vmap(grown)(rates)
    assert [size for size, _ in calls] == [3]
    for i, rate in enumerate(rates):
        want = grown(rate)
        np.testing.assert_array_equal(count[i], want[0])
        np.testing.assert_allclose(x[i], want[1], rtol=1e-15)
        assert bool(done[i]) == bool(want[2])


def test_batched_like_batches_where_its_reference_is():
    """`batched_like` returns its tree; under `vmap` with every leaf batched where a leaf of
    the reference is batched, and as given where none is (what a probe with a batching
    rule sees of its output: the rule runs only for a batched input)."""
    seen = []
    probe = _probe(seen)

    zeros = (jnp.zeros(2), jnp.asarray(0))

    def aligned(reference, other):
        return probe(batched_like(zeros, reference)), other

    out, _ = jax.vmap(aligned)(jnp.arange(3.0), jnp.arange(3.0))
    assert [batched for _, batched in seen] == [(True, True)]
    np.testing.assert_array_equal(out[0], np.zeros((3, 2)))
    jax.vmap(aligned, in_axes=(None, 0))(1.0, jnp.arange(3.0))
    assert len(seen) == 1  # nothing batched reaches the probe: its rule does not run
    assert batched_like(zeros, jnp.ones(3)) is not None
