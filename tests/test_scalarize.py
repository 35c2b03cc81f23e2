"""The scalar re-tracing of small right-hand sides (`jaxdae/_compilation/_scalarize.py`): same
values, same derivatives, same batching; and it really produces a scalar graph."""

import collections

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._compilation._scalarize import scalarize, sincos
from jaxdae._integration._vector_fields import failure_indicator, state_rates
from jaxdae._thresholds import MAX_ELEMENTS, MAX_WORK
from jaxdae.examples import (
    CartesianArm,
    ChaplyginSleigh,
    TwoLinkManipulator,
)

from ._systems import DoublePendulum, TwicePendulum

CASES = {
    "two-link, modified Lagrange": (
        TwoLinkManipulator(),
        jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0])),
        jnp.array([0.3, 1.2]),
        jnp.array([0.1, -0.2]),
    ),
    "double pendulum, Baumgarte with matrix gains": (
        DoublePendulum(),
        jaxdae.Baumgarte(jnp.array([[4.0, 1.0], [1.0, 3.0]]), jnp.array([9.0, 4.0])),
        jnp.array([0.6, -0.8, 1.5, -1.1]),
        jnp.array([0.2, 0.1, -0.3, 0.4]),
    ),
    "redundant pendulum, pseudo-inverse": (
        TwicePendulum(),
        jaxdae.PseudoInverse(4.0, 4.0),
        jnp.array([0.6, -0.8]),
        jnp.array([0.8, 0.6]),
    ),
    "Chaplygin sleigh (nonholonomic)": (
        ChaplyginSleigh(),
        jaxdae.Baumgarte(2.0, 1.0),
        jnp.array([0.1, 0.2, 0.3]),
        jnp.array([0.5, -0.2, 0.7]),
    ),
    "Hamiltonian arm, coupled perturbation": (
        CartesianArm(),
        CartesianArm.paper_formulation(-4.0, -4.0, -9.0, -6.0),
        *CartesianArm().initial_state(),
    ),
}


def _pair(fn):
    return eqx.filter_jit(fn), eqx.filter_jit(scalarize(fn))


RATES, RATES_SCALAR = _pair(state_rates)


# The two costliest cases run in the slow tier; the others cover the same rules.
_SLOW_CASES = {"Hamiltonian arm, coupled perturbation", "two-link, modified Lagrange"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.slow) if name in _SLOW_CASES else name for name in CASES],
)
def test_same_rates_and_gradients(name):
    system, formulation, q, v = CASES[name]
    t = jnp.asarray(0.4)
    expected = RATES(system, formulation, t, q, v)
    got = RATES_SCALAR(system, formulation, t, q, v)
    for a, b in zip(expected, got, strict=False):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)

    def loss(fn):
        def f(system, formulation, q, v):
            dq, dv = fn(system, formulation, t, q, v)
            return jnp.sum(jnp.sin(dq)) + jnp.sum(dv**2)

        return eqx.filter_jit(eqx.filter_grad(f))

    g1 = loss(state_rates)(system, formulation, q, v)
    g2 = loss(scalarize(state_rates))(system, formulation, q, v)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=False):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_vmap_float32_and_failure_indicator():
    system, formulation, q, v = CASES["double pendulum, Baumgarte with matrix gains"]
    qs = q + 0.01 * jnp.arange(12.0).reshape(3, 4)
    batched = jax.vmap(lambda q_: RATES_SCALAR(system, formulation, 0.0, q_, v)[1])(qs)
    plain = jax.vmap(lambda q_: RATES(system, formulation, 0.0, q_, v)[1])(qs)
    np.testing.assert_allclose(batched, plain, rtol=1e-12)

    system32, formulation32, q32, v32 = jax.tree.map(
        lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x,
        (system, formulation, q, v),
    )
    out = RATES_SCALAR(system32, formulation32, jnp.float32(0.0), q32, v32)[1]
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, RATES(system, formulation, 0.0, q, v)[1], rtol=1e-4)

    failure, failure_scalar = _pair(failure_indicator)
    reference = formulation.failure_reference(system.terms(0.0, q, v))
    args = (system, formulation, 0.0, q, v, reference)
    assert failure(*args) == failure_scalar(*args)


def test_products_of_mixed_precision_operands():
    """A float32 state meets a float64 model's constants in one product (a URDF model's
    arrays stay float64 when a batch runs in float32): both are taken in the result's
    type, as JAX's own product does."""
    model = np.arange(9.0).reshape(3, 3) / 7

    def product(x):
        return jax.lax.dot_general(
            x, model, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    x = jnp.asarray([0.1, -0.2, 0.3], jnp.float32)
    got = jax.jit(scalarize(product))(x)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, jax.jit(product)(x), rtol=2e-7)


@pytest.mark.perf(reason="bounds the size and the primitives of a traced right-hand side")
def test_produces_a_scalar_graph():
    """The two-link right-hand side becomes scalar operations only: no matrix products,
    no data movement, the sine and cosine of each angle evaluated once, as polynomials."""
    system, formulation, q, v = CASES["two-link, modified Lagrange"]
    jaxpr = jax.make_jaxpr(lambda t, q, v: scalarize(state_rates)(system, formulation, t, q, v))(
        0.0, q, v
    )
    counts = collections.Counter(e.primitive.name for e in jaxpr.eqns)
    assert not {"dot_general", "pad", "concatenate", "transpose", "unstack", "jit"} & set(counts), (
        counts
    )
    assert counts["sin"] == counts["cos"] == 0 and counts["custom_jvp_call"] == 2, counts
    assert sum(counts.values()) < 620, counts


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_sincos_matches_sin_and_cos(dtype):
    """Within 1 ulp (of 1) of numpy over the range its argument reduction is exact for,
    exact derivatives, nan for non-finite input, bounded for any input."""
    limit = {jnp.float64: 2.0**20, jnp.float32: 2.0**13}[dtype] * np.pi / 2
    ulp = float(jnp.finfo(dtype).eps)
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-scale, scale, 4000) for scale in (1.0, 100.0, limit)])
    x = np.concatenate([x, np.arange(-64, 65) * np.pi / 4]).astype(dtype)
    sin, cos = jax.jit(sincos)(jnp.asarray(x))
    assert sin.dtype == cos.dtype == dtype
    reference = x.astype(np.float64)
    np.testing.assert_allclose(sin, np.sin(reference), rtol=0, atol=1.5 * ulp)
    np.testing.assert_allclose(cos, np.cos(reference), rtol=0, atol=1.5 * ulp)

    odd = jnp.asarray([np.inf, -np.inf, np.nan, 1e30, -3e38], dtype)
    sin, cos = sincos(odd)
    assert np.all(np.isnan(sin[:3])) and np.all(np.isnan(cos[:3]))
    assert np.all(np.abs(sin[3:]) <= 1) and np.all(np.abs(cos[3:]) <= 1)

    points = jnp.asarray([-7.0, -0.3, 0.0, 1.2, 2.5, 40.0], dtype)
    d_sin = jax.vmap(jax.grad(lambda t: sincos(t)[0]))(points)
    d_cos = jax.vmap(jax.grad(lambda t: sincos(t)[1]))(points)
    np.testing.assert_allclose(d_sin, np.cos(np.asarray(points, np.float64)), atol=2 * ulp)
    np.testing.assert_allclose(d_cos, -np.sin(np.asarray(points, np.float64)), atol=2 * ulp)


def _kitchen_sink(x, y):
    """Every structural and arithmetic rule, plus primitives without a scalar rule."""
    a = jax.lax.pad(x, jnp.asarray(0.5, x.dtype), ((1, -1, 0), (2, 1, 0)))  # negative padding
    b = jax.lax.pad(x, jnp.asarray(-1.0, x.dtype), ((0, 0, 1), (1, 0, 2)))  # interior
    c = jnp.flip(x, 0).T @ y + jnp.einsum("ij,ij->i", x, x)[None, :]
    d = jnp.concatenate(jnp.split(x, [1], axis=1)[::-1], axis=1)
    d = d + jnp.stack(jnp.unstack(y, axis=1)[::-1], axis=0)  # JAX's stack/unstack primitives
    e = jnp.where(x > 0.2, jnp.maximum(x, 0.3), jnp.tanh(x) ** 3)
    f = jnp.einsum("bij,bjk->bik", x[None], y[None])[0]  # batch dimensions
    g = jnp.max(x, axis=0) * jnp.prod(y, axis=1) + jnp.arange(3) * 1.5
    h = jnp.cumsum(x, axis=0) + jnp.sort(y, axis=1)  # no scalar rule: applied as arrays
    i = jnp.linalg.eigvalsh(x @ x.T + jnp.eye(3))
    # Control flow and linear solves inside a model: applied as arrays, derivatives intact.
    j = jax.lax.cond(x[0, 0] > 0, lambda z: jnp.sin(z), lambda z: z**2, y[0])
    k = jax.lax.fori_loop(0, 3, lambda _, z: z * 0.5 + x[1], y[2])
    m = jnp.linalg.solve(x @ x.T + jnp.eye(3), y[1]) + jnp.linalg.norm(x, axis=1)
    return (
        jnp.sum(a) + jnp.sum(b),
        c,
        d,
        e,
        f,
        g,
        h,
        i,
        j + k + m,
        (x * y[:, :1]).astype(jnp.float32),
        jnp.sqrt(jnp.abs(x)) / (1 + x**2),
    )


def test_every_rule_matches_jax():
    key1, key2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key1, (3, 3))
    y = jax.random.normal(key2, (3, 3))
    expected = jax.jit(_kitchen_sink)(x, y)
    got = jax.jit(scalarize(_kitchen_sink))(x, y)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=False):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    for out in (4, 8):  # (jitted: eagerly each scalar operation would compile alone)
        g1 = jax.jit(jax.grad(lambda x: jnp.sum(_kitchen_sink(x, y)[out] ** 2)))(x)  # noqa: B023
        g2 = jax.jit(jax.grad(lambda x: jnp.sum(scalarize(_kitchen_sink)(x, y)[out] ** 2)))(x)  # noqa: B023
        np.testing.assert_allclose(g2, g1, rtol=1e-11)


@pytest.mark.perf(reason="pins the private size thresholds `MAX_ELEMENTS` and `MAX_WORK`")
def test_large_functions_keep_their_array_form():
    n = int(np.sqrt(MAX_ELEMENTS)) + 2
    jaxpr = jax.make_jaxpr(scalarize(lambda a: a @ a))(jnp.ones((n, n)))
    assert [e.primitive.name for e in jaxpr.eqns] == ["dot_general"]

    def many_small(x):  # every array small, too much work in all
        for _ in range(MAX_WORK // x.size + 1):
            x = jnp.sin(x)
        return x

    jaxpr = jax.make_jaxpr(scalarize(many_small))(jnp.ones(8))
    assert {e.primitive.name for e in jaxpr.eqns} == {"sin"}
    assert all(e.outvars[0].aval.shape == (8,) for e in jaxpr.eqns)


def test_gathers_of_the_project_become_element_bookkeeping():
    """`_gather.take` (rows read, padding as zero) and `add_at` (rows summed) re-trace into
    the same values and derivatives, with no gather left in the scalar graph."""
    from jaxdae._compilation._gather import add_at, take

    index = np.array([[2, 0], [3, 1]])  # 3: the padding row (zeros)

    def fn(x):
        rows = take(x, index)  # (2, 2, 2)
        return add_at(jnp.sin(x), np.array([0, 0, 2]), rows[0, :, :].sum(0) * x[:3])

    x = jnp.arange(6.0).reshape(3, 2) / 7
    scalar = scalarize(fn)
    np.testing.assert_allclose(scalar(x), fn(x), rtol=1e-15)
    np.testing.assert_allclose(jax.jacfwd(scalar)(x), jax.jacfwd(fn)(x), rtol=1e-14)

    def names(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn.primitive.name
            inner = eqn.params.get("jaxpr")
            if inner is not None:
                yield from names(getattr(inner, "jaxpr", inner))

    assert "jaxdae_gather_sum" in set(names(jax.make_jaxpr(fn)(x).jaxpr))
    assert "jaxdae_gather_sum" not in set(names(jax.make_jaxpr(scalar)(x).jaxpr))
