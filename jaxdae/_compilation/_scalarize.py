"""Scalar expression graphs for small systems: a few fused loops per right-hand side.

The equations of motion are derived by automatic differentiation (`jax.jvp` batched over
stacked tangents, small matrix products, slices of slices). For a handful of coordinates this
gives thousands of tiny array operations; XLA's CPU backend runs many of them as separate
kernels, so a derived right-hand side costs many times a hand-written one
(docs/design_measurements.md#scalar-graphs).

[`scalarize`][] re-traces such a function element by element: every array in its jaxpr
becomes a list of scalars, structural operations (slices, reshapes, transposes, broadcasts,
pads, concatenations) become index bookkeeping at trace time, products and sums are unrolled,
constants are folded (the zeros and ones of the identity tangents vanish), repeated
subexpressions are shared (each `sin q_i` is computed once) and sines and cosines become
vectorizable polynomials ([`sincos`][]). What is left is a graph of scalar
operations, like CasADi's SX graphs, that XLA fuses into a few loops (and, under `vmap`,
into elementwise operations on the batch). The result is the same function: autodiff, `vmap` and
`jit` apply to it as to the original.

Functions whose arrays are large, or that contain operations without a scalar rule, still
work: unknown primitives are applied to their operands re-assembled into arrays, and
large functions (`MAX_ELEMENTS`, `MAX_WORK`) are not re-traced at all.
"""

import functools
import math
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex
from jax.extend.core.primitives import add_jaxvals_p

from .. import _thresholds

# Functions that trace anything under this name scope ([`array_form_scope`][]) keep their
# array form, whatever their size: the terms derived from sparsity patterns
# (`_systems/_structure.py`) are gathers and loops that a scalar graph would unroll into
# more operations than it saves (docs/design_measurements.md#scalar-graphs).
ARRAY_FORM_SCOPE = "jaxdae_array_form"


def array_form_scope():
    """A name scope: the functions [`scalarize`][] wraps keep their array form where they
    trace anything inside it."""
    return jax.named_scope(ARRAY_FORM_SCOPE)


_ELEMENTWISE = frozenset(
    """add add_any sub mul div rem pow max min atan2 nextafter neg sin cos tan asin acos atan
    sinh cosh tanh asinh acosh atanh exp exp2 log log1p expm1 sqrt rsqrt cbrt abs sign floor
    ceil round is_finite integer_pow square logistic erf erfc erf_inv not and or xor eq ne lt le
    gt ge select_n convert_element_type clamp copy copy_p reduce_precision""".split()
)
_COMMUTATIVE = frozenset({"add", "mul", "max", "min", "eq", "ne", "and", "or", "xor"})
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint"})

# Constant folding in numpy for the common operations (others are evaluated by JAX eagerly).
_NUMPY = {
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": lambda a, b: (
        np.divide(a, b)
        if np.issubdtype(a.dtype, np.inexact)
        else np.trunc(np.divide(a, b)).astype(a.dtype)
    ),
    "neg": np.negative,
    "max": np.maximum,
    "min": np.minimum,
    "sin": np.sin,
    "cos": np.cos,
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "abs": np.abs,
    "sign": np.sign,
    "tanh": np.tanh,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.logical_and,
    "or": np.logical_or,
    "not": np.logical_not,
    "square": np.square,
}


def _is_const(x) -> bool:
    return isinstance(x, np.ndarray)


def _is_inexact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class _Graph:
    """One re-tracing: folds constants and shares repeated scalar operations."""

    def __init__(self):
        self.memo: dict = {}
        self.alive: list = []  # keeps memo keys' objects alive so that their ids stay unique

    def key(self, x):
        if _is_const(x):
            return ("c", x.dtype.str, x.item())
        return id(x)

    def apply(self, prim, params: dict, args: list, dtype):
        """`prim` on scalars `args` (tracers or 0-d numpy constants), result of `dtype`."""
        if prim is add_jaxvals_p:  # the tangents' `add_any` is an ordinary sum here
            prim, params = lax.add_p, _params(lax.add)
        name = prim.name
        folded = _fold(name, params, args, dtype)
        if folded is not None:
            return folded
        if prim in (lax.sin_p, lax.cos_p) and np.dtype(dtype) in _SINCOS:
            key = ("sincos", self.key(args[0]))
            if key not in self.memo:
                self.memo[key] = sincos(args[0])
                self.alive.append(args)
            return self.memo[key][0 if prim is lax.sin_p else 1]
        try:
            operands = [self.key(a) for a in args]
            if name in _COMMUTATIVE:
                operands.sort(key=repr)
            key = (prim, tuple(sorted(params.items())), tuple(operands))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self.memo:
            return self.memo[key]
        if all(_is_const(a) for a in args):
            out = _eval_const(prim, params, args, dtype)
        else:
            out = prim.bind(*args, **params)
        if key is not None:
            self.memo[key] = out
            self.alive.append(args)
        return out

    # -- sums and products with folding ----------------------------------------------

    def add(self, a, b, dtype):
        return self.apply(lax.add_p, _params(lax.add), [a, b], dtype)

    def mul(self, a, b, dtype):
        return self.apply(lax.mul_p, _params(lax.mul), [a, b], dtype)

    def sub(self, a, b, dtype):
        return self.apply(lax.sub_p, _params(lax.sub), [a, b], dtype)

    def div(self, a, b, dtype):
        return self.apply(lax.div_p, _params(lax.div), [a, b], dtype)

    def neg(self, a, dtype):
        return self.apply(lax.neg_p, {}, [a], dtype)

    def unary(self, fn: Callable, a, dtype):
        """`fn` (a `lax` function of one argument) of the scalar `a`."""
        prim, params = _unary(fn)
        return self.apply(prim, params, [a], dtype)

    def sum(self, items: list, dtype):
        total = np.zeros((), dtype)
        for item in items:
            total = self.add(total, item, dtype)
        return total


# -- sine and cosine as vectorizable arithmetic ------------------------------------------
#
# XLA's CPU backend evaluates float64 `sin`/`cos` by a libm call per element, which keeps the
# loop around it from being vectorized, and its fusion pass counts real `sin`/`cos` as cheap,
# so it recomputes them in every fusion that reads them. Written as Cody–Waite reduction plus
# polynomials, they are a few dozen multiply-adds that XLA vectorizes; recomputing those is
# cheap (docs/design_measurements.md#sine-and-cosine).

# Per dtype: π/2 split in three parts whose leading two have few enough bits that `n · part`
# is exact for `|n| < 2^20` (float64, fdlibm's `pio2_1`, `pio2_2`, `pio2_2t`) or `2^13`
# (float32, Cephes' `DP1..DP3` doubled), and minimax coefficients on `[-π/4, π/4]`:
# `sin r = r + r·z·S(z)`, `cos r = 1 - z/2 + z²·C(z)` with `z = r²` (fdlibm's `__kernel_sin`,
# `__kernel_cos`; Cephes' `sinf`, `cosf`).
_SINCOS = {
    np.dtype(np.float64): (
        (1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624879595063154e-21),
        (
            -1.66666666666666324348e-01,
            8.33333333332248946124e-03,
            -1.98412698298579493134e-04,
            2.75573137070700676789e-06,
            -2.50507602534068634195e-08,
            1.58969099521155010221e-10,
        ),
        (
            4.16666666666666019037e-02,
            -1.38888888888741095749e-03,
            2.48015872894767294178e-05,
            -2.75573143513906633035e-07,
            2.08757232129817482790e-09,
            -1.13596475577881948265e-11,
        ),
    ),
    np.dtype(np.float32): (
        (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8),
        (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4),
        (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5),
    ),
}


def _horner(z, coefficients):
    total = coefficients[-1]
    for c in coefficients[-2::-1]:
        total = total * z + c
    return total


@jax.custom_jvp
def sincos(x):
    """`(sin x, cos x)` of a float32/float64 array by vectorizable arithmetic.

    Within 1 ulp (of 1) of `jnp.sin`/`jnp.cos` where the reduction `r = x - n·π/2` is
    exact by construction, `|x| < 2^20·π/2 ≈ 1.6e6` in float64 (`2^13·π/2 ≈ 1.3e4` in
    float32; tested). Beyond that `r` is rounded about as `x` itself is: on the 2-core
    CPU the error stayed within 1 ulp up to `|x| = 1e14` (float64) and 1.2 ulp up to
    `2e6` (float32). For arguments whose ulp exceeds 1 the values are meaningless but
    stay in `[-1, 1]`. Non-finite `x` gives nan, as `jnp.sin`.
    """
    split, sin_coefficients, cos_coefficients = _SINCOS[np.dtype(x.dtype)]
    n = lax.round(x * (2 / np.pi), lax.RoundingMethod.TO_NEAREST_EVEN)
    r = x
    for part in split:
        r = r - n * part
    # Only arguments far beyond the accurate range (whose ulp exceeds 1) leave |r| ≤ π/4;
    # clipping keeps their values bounded instead of overflowing the polynomials.
    r = jnp.clip(r, -1, 1)
    z = r * r
    s = r + r * z * _horner(z, sin_coefficients)
    c = 1 - 0.5 * z + z * z * _horner(z, cos_coefficients)
    quadrant = n - 4 * lax.floor(n * 0.25)  # n mod 4, exact in floating point
    swap = (quadrant == 1) | (quadrant == 3)
    sin, cos = jnp.where(swap, c, s), jnp.where(swap, s, c)
    sin = jnp.where(quadrant >= 2, -sin, sin)
    cos = jnp.where((quadrant == 1) | (quadrant == 2), -cos, cos)
    return sin, cos


@sincos.defjvp
def _sincos_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    sin, cos = sincos(x)
    return (sin, cos), (cos * dx, -sin * dx)


@functools.cache
def _params(binary: Callable) -> dict:
    """The parameters JAX binds `binary`'s primitive with (they differ between versions)."""
    (eqn,) = jax.make_jaxpr(binary)(1.0, 1.0).eqns
    return dict(eqn.params)


@functools.cache
def _unary(fn: Callable) -> tuple:
    """The primitive and parameters JAX binds for `fn` of one argument."""
    (eqn,) = jax.make_jaxpr(fn)(1.0).eqns
    return eqn.primitive, dict(eqn.params)


def _constant(x):
    """The value of a constant operand, `None` for a traced one."""
    return x.item() if _is_const(x) else None


def _fold(name, params, args, dtype):
    """Algebraic simplifications with one constant operand; `None` when none applies.

    `x · 0 → 0` drops nan/inf propagation through that product; the zeros folded here are
    structural (identity tangents, zero blocks), and a non-finite state still reaches the
    result through the other terms, so diffrax still rejects such a step.
    """
    if name in ("mul", "add", "add_any", "sub", "div") and len(args) == 2:
        a, b = args
        ca, cb = _constant(a), _constant(b)
        if ca is not None and cb is not None:
            return None
        if name == "mul":
            if ca == 0 or cb == 0:
                return np.zeros((), dtype)
            if ca == 1:
                return b
            if cb == 1:
                return a
        elif name in ("add", "add_any"):
            if ca == 0:
                return b
            if cb == 0:
                return a
        elif name == "sub" and cb == 0:
            return a
        elif name == "div":
            if ca == 0:
                return np.zeros((), dtype)
            if cb == 1:
                return a
    elif name == "convert_element_type" and not _is_const(args[0]):
        if args[0].dtype == dtype:
            return args[0]
    elif name == "integer_pow" and params["y"] == 1:
        return args[0]
    elif name == "select_n" and _is_const(args[0]):
        return args[1 + int(args[0].item())]
    elif name in ("copy", "copy_p"):
        return args[0]
    return None


def _eval_const(prim, params, args, dtype):
    numpy_fn = _NUMPY.get(prim.name)
    if numpy_fn is not None:
        with np.errstate(all="ignore"):
            return np.asarray(numpy_fn(*args), dtype=dtype)
    if prim.name == "convert_element_type":
        return np.asarray(args[0], dtype=dtype)
    if prim.name == "integer_pow":
        with np.errstate(all="ignore"):
            return np.asarray(args[0] ** params["y"], dtype=dtype)
    if prim.name == "select_n":
        return np.asarray(args[1 + int(args[0].item())], dtype=dtype)
    with jax.ensure_compile_time_eval():
        return np.asarray(prim.bind(*args, **params), dtype=dtype)


# -- arrays as flat lists of scalars -----------------------------------------------------


class _Value:
    """An array of `shape` and `dtype` held as a flat (row-major) list of scalars."""

    __slots__ = ("elements", "shape", "dtype")

    def __init__(self, elements: list, shape: Sequence[int], dtype):
        self.elements, self.shape, self.dtype = elements, tuple(shape), np.dtype(dtype)

    def indices(self) -> np.ndarray:
        return np.arange(len(self.elements)).reshape(self.shape)

    def take(self, index: np.ndarray | np.integer) -> "_Value":
        return _Value([self.elements[i] for i in index.reshape(-1)], index.shape, self.dtype)


def _from_array(x, dtype) -> _Value:
    shape = np.shape(x)
    if isinstance(x, np.ndarray | np.generic) or (
        isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
    ):
        flat = np.asarray(x, dtype=dtype).reshape(-1)
        return _Value([np.asarray(e) for e in flat], shape, dtype)
    flat = jnp.reshape(x, (-1,))
    elements = [lax.squeeze(lax.slice(flat, (i,), (i + 1,)), (0,)) for i in range(flat.size)]
    return _Value(elements, shape, dtype)


def _to_array(value: _Value):
    if all(_is_const(e) for e in value.elements):
        return jnp.asarray(
            np.asarray([e.item() for e in value.elements], dtype=value.dtype).reshape(value.shape)
        )
    if not value.elements:
        return jnp.zeros(value.shape, value.dtype)
    scalars = [
        lax.convert_element_type(e, value.dtype) if _is_const(e) or e.dtype != value.dtype else e
        for e in value.elements
    ]
    return jnp.stack(scalars).reshape(value.shape)


# -- structural rules: index arithmetic, no operations emitted ---------------------------


def _broadcast_in_dim(x: _Value, shape, broadcast_dimensions, **_):
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = x.shape[src]
    return x.take(np.broadcast_to(x.indices().reshape(expanded), shape))


def _pad(x: _Value, pad_value: _Value, padding_config):
    index = x.indices()
    for axis, (low, high, interior) in enumerate(padding_config):
        size = index.shape[axis]
        if interior and size:
            grown = list(index.shape)
            grown[axis] = size + (size - 1) * interior
            spaced = np.full(grown, -1)
            where = [slice(None)] * index.ndim
            where[axis] = slice(None, None, interior + 1)
            spaced[tuple(where)] = index
            index = spaced
        widths = [(0, 0)] * index.ndim
        widths[axis] = (max(low, 0), max(high, 0))
        index = np.pad(index, widths, constant_values=-1)
        cut = [slice(None)] * index.ndim
        cut[axis] = slice(max(-low, 0), index.shape[axis] - max(-high, 0))
        index = index[tuple(cut)]
    elements = x.elements + [pad_value.elements[0]]
    return _Value([elements[i] for i in index.reshape(-1)], index.shape, x.dtype)


def _structural(name, params, args: list[_Value]) -> list[_Value] | None:
    x = args[0] if args else None
    if name == "broadcast_in_dim":
        return [_broadcast_in_dim(x, params["shape"], params["broadcast_dimensions"])]
    if name == "optimization_barrier":
        # (The unrolled Cholesky reads its entries behind one, for XLA's sake; a scalar
        # graph holds scalars already.)
        return list(args)
    if name == "reshape":
        if params.get("dimensions") is not None:
            return None
        return [_Value(x.elements, params["new_sizes"], x.dtype)]
    if name == "squeeze":
        shape = [d for i, d in enumerate(x.shape) if i not in set(params["dimensions"])]
        return [_Value(x.elements, shape, x.dtype)]
    if name == "expand_dims":
        return [
            _Value(x.elements, np.expand_dims(x.indices(), params["dimensions"]).shape, x.dtype)
        ]
    if name == "transpose":
        return [x.take(x.indices().transpose(params["permutation"]))]
    if name == "rev":
        return [x.take(np.flip(x.indices(), params["dimensions"]))]
    if name == "slice":
        strides = params["strides"] or (1,) * len(x.shape)
        cut = tuple(
            slice(lo, hi, st)
            for lo, hi, st in zip(
                params["start_indices"], params["limit_indices"], strides, strict=False
            )
        )
        return [x.take(x.indices()[cut])]
    if name == "concatenate":
        offsets = np.cumsum([0] + [len(a.elements) for a in args])
        index = np.concatenate(
            [a.indices() + o for a, o in zip(args, offsets, strict=False)], axis=params["dimension"]
        )
        elements = [e for a in args for e in a.elements]
        return [_Value([elements[i] for i in index.reshape(-1)], index.shape, x.dtype)]
    if name == "stack":
        offsets = np.cumsum([0] + [len(a.elements) for a in args])
        index = np.stack(
            [a.indices() + o for a, o in zip(args, offsets, strict=False)], axis=params["axis"]
        )
        elements = [e for a in args for e in a.elements]
        return [_Value([elements[i] for i in index.reshape(-1)], index.shape, x.dtype)]
    if name == "unstack":
        indices = x.indices()
        return [
            x.take(np.take(indices, i, axis=params["axis"]))
            for i in range(indices.shape[params["axis"]])
        ]
    if name == "pad":
        return [_pad(x, args[1], params["padding_config"])]
    if name == "split":
        axis, start, outs = params["axis"], 0, []
        for size in params["sizes"]:
            cut = [slice(None)] * len(x.shape)
            cut[axis] = slice(start, start + size)
            outs.append(x.take(x.indices()[tuple(cut)]))
            start += size
        return outs
    return None


# -- arithmetic rules --------------------------------------------------------------------


def _elementwise(graph: _Graph, prim, params, args: list[_Value], out_shape, dtype):
    # Operands may broadcast (size-1 dimensions or scalars), as in numpy.
    columns = [
        a.elements
        if a.shape == tuple(out_shape)
        else a.take(np.broadcast_to(a.indices(), out_shape)).elements
        for a in args
    ]
    return _Value(
        [graph.apply(prim, params, list(row), dtype) for row in zip(*columns, strict=False)],
        out_shape,
        dtype,
    )


def _reduce(graph: _Graph, prim, x: _Value, axes, out_shape, dtype):
    keep = [i for i in range(len(x.shape)) if i not in set(axes)]
    count = math.prod(x.shape[i] for i in axes)
    index = x.indices().transpose(keep + list(axes)).reshape(math.prod(out_shape), count)
    combine = {
        "reduce_sum": lax.add,
        "reduce_max": lax.max,
        "reduce_min": lax.min,
        "reduce_prod": lax.mul,
    }[prim.name]
    combine_prim = {lax.add: lax.add_p, lax.max: lax.max_p, lax.min: lax.min_p, lax.mul: lax.mul_p}[
        combine
    ]
    identity = {"reduce_sum": 0, "reduce_max": -np.inf, "reduce_min": np.inf, "reduce_prod": 1}[
        prim.name
    ]
    out = []
    for row in index:
        if not len(row):
            with np.errstate(all="ignore"):
                out.append(np.asarray(identity).astype(dtype))
            continue
        acc = x.elements[row[0]]
        for i in row[1:]:
            acc = graph.apply(combine_prim, _params(combine), [acc, x.elements[i]], dtype)
        out.append(acc)
    return _Value(out, out_shape, dtype)


def _dot_general(graph: _Graph, lhs: _Value, rhs: _Value, dimension_numbers, out_shape, dtype):
    if lhs.dtype != rhs.dtype:  # mixed operands (a float32 state, a float64 model) meet
        lhs, rhs = (
            x
            if x.dtype == dtype
            else _elementwise(
                graph,
                lax.convert_element_type_p,
                {"new_dtype": dtype, "weak_type": False, "sharding": None},
                [x],
                x.shape,
                dtype,
            )
            for x in (lhs, rhs)
        )  # both in the result's type
    (lc, rc), (lb, rb) = dimension_numbers
    lf = [i for i in range(len(lhs.shape)) if i not in lc and i not in lb]
    rf = [i for i in range(len(rhs.shape)) if i not in rc and i not in rb]
    batch = math.prod(lhs.shape[i] for i in lb)
    contract = math.prod(lhs.shape[i] for i in lc)
    li = (
        lhs.indices()
        .transpose(list(lb) + lf + list(lc))
        .reshape(batch, math.prod(lhs.shape[i] for i in lf), contract)
    )
    ri = (
        rhs.indices()
        .transpose(list(rb) + rf + list(rc))
        .reshape(batch, math.prod(rhs.shape[i] for i in rf), contract)
    )
    out = []
    for b in range(batch):
        for row in li[b]:
            for col in ri[b]:
                products = [
                    graph.mul(lhs.elements[i], rhs.elements[j], lhs.dtype)
                    for i, j in zip(row, col, strict=False)
                ]
                total = graph.sum(products, lhs.dtype)
                if lhs.dtype != dtype:
                    total = graph.apply(
                        lax.convert_element_type_p,
                        {"new_dtype": dtype, "weak_type": False, "sharding": None},
                        [total],
                        dtype,
                    )
                out.append(total)
    return _Value(out, out_shape, dtype)


def _fallback(graph: _Graph, eqn, args: list[_Value]) -> list[_Value]:
    """Applies an equation without a scalar rule to its operands as arrays."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*[_to_array(a) for a in args], **params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    return [_from_array(o, v.aval.dtype) for o, v in zip(outs, eqn.outvars, strict=False)]


def _eval(graph: _Graph, jaxpr, consts: list, args: list[_Value]) -> list[_Value]:
    env: dict = {
        **dict(zip(jaxpr.constvars, consts, strict=True)),
        **dict(zip(jaxpr.invars, args, strict=True)),
    }

    def read(var):
        if isinstance(var, jex.Literal):
            return _from_array(np.asarray(var.val), var.aval.dtype)
        return env[var]

    for eqn in jaxpr.eqns:
        name, params = eqn.primitive.name, eqn.params
        operands = [read(v) for v in eqn.invars]
        out_aval = eqn.outvars[0].aval if eqn.outvars else None
        outs = None
        if name in _CALLS and "jaxpr" in params:
            inner = params["jaxpr"]
            if isinstance(inner, jex.ClosedJaxpr):
                consts_in = [_from_array(c, np.asarray(c).dtype) for c in inner.consts]
                outs = _eval(graph, inner.jaxpr, consts_in, operands)
            elif not inner.constvars:
                outs = _eval(graph, inner, [], operands)
        elif name in _ELEMENTWISE:
            outs = [
                _elementwise(graph, eqn.primitive, params, operands, out_aval.shape, out_aval.dtype)
            ]
        elif name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
            outs = [
                _reduce(
                    graph,
                    eqn.primitive,
                    operands[0],
                    params["axes"],
                    out_aval.shape,
                    out_aval.dtype,
                )
            ]
        elif name == "dot_general":
            outs = [
                _dot_general(
                    graph, *operands, params["dimension_numbers"], out_aval.shape, out_aval.dtype
                )
            ]
        elif name == "iota":
            outs = [_iota(out_aval, params)]
        elif name == "jaxdae_gather_sum":
            outs = [_gather_sum(graph, operands[0], params["table"], out_aval)]
        else:
            outs = _structural(name, params, operands)
        if outs is None:
            outs = _fallback(graph, eqn, operands)
        for var, value in zip(eqn.outvars, outs, strict=False):
            if not isinstance(var, jex.DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _gather_sum(graph: _Graph, x: _Value, table, aval) -> _Value:
    """jaxdae's gather-sum (`_gather.take`, `add_at`): each row of the result is the sum
    of the rows of `x` that its row of the static table names (`table.size` standing for
    zero)."""
    rows = x.indices().reshape(x.shape[0], -1) if x.shape[0] else np.zeros((0, 0), int)
    width = math.prod(aval.shape[1:])
    zero = np.asarray(0).astype(x.dtype)
    out = []
    for entries in table.index:
        reads = [rows[j] for j in entries if j < table.size]
        for k in range(width):
            if not reads:
                out.append(zero)
                continue
            acc = x.elements[reads[0][k]]
            for row in reads[1:]:
                acc = graph.apply(lax.add_p, _params(lax.add), [acc, x.elements[row[k]]], x.dtype)
            out.append(acc)
    return _Value(out, aval.shape, x.dtype)


def _iota(aval, params) -> _Value:
    shape, dimension = aval.shape, params["dimension"]
    values = np.broadcast_to(
        np.arange(shape[dimension]).reshape(
            [-1 if i == dimension else 1 for i in range(len(shape))]
        ),
        shape,
    )
    return _from_array(values, aval.dtype)


# Equations whose outputs a scalar graph does not compute: a broadcast repeats scalars it
# already has, and a call's outputs are those of the equations inside it (counted there).
_NOT_COMPUTED = frozenset({"broadcast_in_dim"}) | _CALLS


def _sizes(jaxpr) -> tuple[int, int]:
    """`(largest array, total entries computed)` of a jaxpr, calls included."""
    largest = max(
        [
            math.prod(getattr(v.aval, "shape", ()))
            for v in list(jaxpr.invars) + list(jaxpr.constvars)
        ],
        default=0,
    )
    work = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            size = math.prod(getattr(var.aval, "shape", ()))
            largest = max(largest, size)
            work += 0 if eqn.primitive.name in _NOT_COMPUTED else size
        inner = eqn.params.get("jaxpr")
        if eqn.primitive.name in _CALLS and inner is not None:
            inner_largest, inner_work = _sizes(getattr(inner, "jaxpr", inner))
            largest, work = max(largest, inner_largest), work + inner_work
    return largest, work


def _traced(flat_fn: Callable, leaves: list, max_work: int):
    """`flat_fn`'s closed jaxpr at `leaves`, its outputs' shapes and tree, and whether it
    keeps its array form: side effects, an array of more than `MAX_ELEMENTS` entries,
    more than `max_work` entries computed in all, or an `array_form_scope` inside."""
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)
    largest, work = _sizes(closed.jaxpr)
    return (
        closed,
        out_leaves,
        out_tree,
        bool(closed.effects)
        or largest > _thresholds.MAX_ELEMENTS
        or (work > max_work)
        or _in_array_form_scope(closed.jaxpr),
    )


def _in_array_form_scope(jaxpr) -> bool:
    """Whether an equation of `jaxpr` or of the calls in it was traced in
    [`array_form_scope`][] (its name, transformed or not, is in the equation's name stack)."""
    for eqn in jaxpr.eqns:
        if ARRAY_FORM_SCOPE in str(eqn.source_info.name_stack):
            return True
        inner = eqn.params.get("jaxpr")
        if (
            eqn.primitive.name in _CALLS
            and inner is not None
            and _in_array_form_scope(getattr(inner, "jaxpr", inner))
        ):
            return True
    return False


def _const_values(closed) -> list[_Value]:
    """The jaxpr's constants as values (tracers a closure held are constants here)."""
    return [
        _from_array(c, c.dtype if hasattr(c, "dtype") else np.asarray(c).dtype)
        for c in closed.consts
    ]


def scalarize(fn: Callable, max_work: int | None = None) -> Callable:
    """`fn` (pytrees of arrays in and out) re-traced as a graph of scalar operations.

    Same values, same derivatives (it is built from JAX primitives). Functions with an array
    of more than `MAX_ELEMENTS` entries, computing more than `max_work` (default
    `MAX_WORK`) entries in all, with side effects, or tracing anything in
    [`array_form_scope`][], keep their array form.
    """
    max_work = _thresholds.MAX_WORK if max_work is None else max_work

    @functools.wraps(fn)
    def scalarized(*args):
        dynamic, static = eqx.partition(args, eqx.is_array)
        leaves, treedef = jax.tree_util.tree_flatten(dynamic)

        def flat_fn(*flat):
            return fn(*eqx.combine(jax.tree_util.tree_unflatten(treedef, flat), static))

        closed, out_leaves, out_tree, array_form = _traced(flat_fn, leaves, max_work)
        if array_form:  # replay the jaxpr rather than tracing `fn` a second time
            return jax.tree_util.tree_unflatten(out_tree, jex.jaxpr_as_fun(closed)(*leaves))
        inputs = [_from_array(x, x.dtype) for x in leaves]
        outs = _eval(_Graph(), closed.jaxpr, _const_values(closed), inputs)
        arrays = [
            _to_array(o).astype(s.dtype).reshape(s.shape)
            for o, s in zip(outs, out_leaves, strict=False)
        ]
        return jax.tree_util.tree_unflatten(out_tree, arrays)

    return scalarized
