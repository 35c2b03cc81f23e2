"""Sparsity patterns found from a function's jaxpr, and column colourings for compressed
derivatives.

[`nonzero_masks`][] traces a function to its jaxpr and runs it on *masks*: every array is
replaced by a boolean array of the same shape that is `False` where the entry is zero for
every value of the inputs (structurally zero), `True` where it may not be. Each primitive has
a rule: products intersect their operands' masks, sums unite them, structural operations
(reshape, transpose, slices, concatenations, gathers and scatters at known indices, dot
products, reductions) are applied to the masks themselves, zero-preserving functions (`sin`,
`sqrt`, `tanh`, ...) keep the mask, others (`cos`, `exp`, comparisons) give `True`
everywhere. Values that do not depend on the inputs (literals, `iota`, constant index arrays,
the identity tangents of `jax.jacfwd`) are evaluated, so a gather from a constant index array
or a product with a constant zero is exact. Anything without a rule, or indices that depend
on the inputs, gives `True`: the analysis may over-estimate a pattern, never miss an entry
(floating-point exceptions such as `0 · inf` aside), at every point, not only where it was
traced. Branches (`select_n`, `cond` with an unknown predicate) contribute the union of their
masks; loops (`while`, `scan`) iterate their carry's mask to a fixed point. The masks of a
jaxpr are kept (by its text, its equations' other parameters and its constants' values), so
that a function traced again is not analysed again.

[`column_colouring`][] groups the columns of a pattern so that no two columns of a group share
a row: one directional derivative per group then gives all of their entries (Curtis, Powell
and Reid, "On the estimation of sparse Jacobian matrices", 1974).
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex

from ._private_apis import scan_operand_groups

# Elementwise functions with f(0) = 0: the output may be non-zero only where the input is.
_ZERO_PRESERVING = frozenset(
    """neg sin tan asin atan sinh tanh asinh atanh sqrt cbrt abs sign expm1 log1p erf
    erf_inv floor ceil round square real imag conj copy copy_p reduce_precision
    convert_element_type stop_gradient""".split()
)
# Elementwise: the output may be non-zero where any operand is (sums, maxima).
_UNION = frozenset("add add_any sub max min or xor nextafter atan2".split())
# Elementwise: the output may be non-zero only where every operand is (products).
_INTERSECTION = frozenset({"mul", "and"})
# Elementwise: non-zero only where the first operand is (`x / y`, `x % y` for non-zero `y`).
_FIRST = frozenset({"div", "rem"})
# Linear in each (float) operand, or moving entries about: applied to 0/1 masks, whose
# entries are non-negative, so no sum cancels and a non-zero result marks a possible one.
_STRUCTURAL = frozenset(
    """reshape broadcast_in_dim squeeze expand_dims transpose rev slice reduce_sum reduce_max
    cumsum cummax concatenate stack pad split dot_general gather dynamic_slice dynamic_update_slice
    scatter scatter-add scatter_add select_and_gather_add jaxdae_gather_sum""".split()
)
_CALLS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


class _Abstract:
    """An array's mask (`False`: structurally zero) and, where it does not depend on the
    inputs, its value."""

    __slots__ = ("mask", "value")

    def __init__(self, mask, value=None):
        self.mask = np.asarray(mask, dtype=bool)
        self.value = value


def _full(aval) -> _Abstract:
    return _Abstract(np.ones(aval.shape, bool))


def _known(value) -> _Abstract:
    value = np.asarray(value)
    return _Abstract(value != 0, value)


def nonzero_masks(fn: Callable, *args) -> list[np.ndarray]:
    """The structural non-zero masks of the array outputs of `fn(*args)` (flattened).

    `args` are arrays or `jax.ShapeDtypeStruct`s (pytrees); only their shapes and dtypes are
    used: every input is taken as possibly non-zero everywhere.

    **Returns:** a list of boolean numpy arrays, one per output leaf, of the leaves' shapes.
    """
    closed = jax.make_jaxpr(fn)(*args)
    key = _key(closed)
    masks = _MASKS.get(key) if key is not None else None
    if masks is None:
        inputs = [_full(v.aval) for v in closed.jaxpr.invars]
        masks = [a.mask for a in _run_closed(closed, inputs)]
        if key is not None:
            while len(_MASKS) >= _MASKS_KEPT:
                del _MASKS[next(iter(_MASKS))]
            _MASKS[key] = masks
    return [m.copy() for m in masks]


# Masks found before, by jaxpr: a solve traces the same function several times (a solver's
# step for its state's shape and again for the loop, each Newton matrix's build), and the
# analysis of a large model's Jacobian costs far more than writing out its jaxpr's text
# (docs/design_measurements.md#sparse-newton).
_MASKS: dict = {}
_MASKS_KEPT = 64


def _key(closed) -> tuple | None:
    """What decides the analysis of `closed`: its text, the parameters of its equations
    that the text leaves out (objects such as the index tables of `take`, which print as
    their type), and the constants' values of it and of its inner jaxprs (their shapes alone
    for a tracer closed over, which the analysis takes as unknown); `None` where one of
    them cannot be compared."""
    parts: list = []
    if not _parts(closed.jaxpr, closed.consts, parts):
        return None
    return str(closed.jaxpr), tuple(parts)


def _parts(jaxpr, consts, out: list) -> bool:
    """Appends to `out` the values of a jaxpr's `consts` and its equations' parameters,
    inner jaxprs' included, other than jaxprs and functions (the analysis reads neither: it
    runs the inner jaxprs); false where one cannot be compared."""
    for c in consts:
        try:
            value = np.asarray(c)
        except Exception:  # a tracer closed over: unknown value
            out.append(("unknown", tuple(np.shape(c))))
            continue
        if value.dtype == object:
            return False
        out.append((value.dtype.str, value.shape, value.tobytes()))

    def collect(value) -> bool:
        if isinstance(value, jex.ClosedJaxpr):
            return _parts(value.jaxpr, value.consts, out)
        if isinstance(value, jex.Jaxpr):
            return _parts(value, [], out)
        if isinstance(value, (tuple, list)):
            return all(collect(v) for v in value)
        if callable(value) and not isinstance(value, type):
            return True
        try:
            hash(value)
        except TypeError:
            return False
        out.append(value)
        return True

    return all(collect(v) for eqn in jaxpr.eqns for v in eqn.params.values())


def _run_closed(closed, inputs):
    consts = [_const(c) for c in closed.consts]
    return _run(closed.jaxpr, consts, inputs)


def _const(value) -> _Abstract:
    try:
        return _known(np.asarray(value))
    except Exception:  # a tracer closed over: unknown value
        return _Abstract(np.ones(np.shape(value), bool))


def _run(jaxpr, consts, inputs):
    env = {
        **dict(zip(jaxpr.constvars, consts, strict=True)),
        **dict(zip(jaxpr.invars, inputs, strict=True)),
    }

    def read(var):
        if isinstance(var, jex.Literal):
            return _known(var.val)
        return env[var]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        outs = _equation(eqn, ins)
        for var, out in zip(eqn.outvars, outs, strict=False):
            if not isinstance(var, jex.DropVar):
                if out.mask.shape != tuple(var.aval.shape):
                    out = _Abstract(np.broadcast_to(out.mask, var.aval.shape))
                env[var] = out
    return [read(v) for v in jaxpr.outvars]


def _evaluate(eqn, values):
    outs = _numpy(eqn.primitive.name, eqn.params, values)
    if outs is None:  # evaluated by JAX (one small compile per shape)
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*values, **eqn.params)
        outs = out if eqn.primitive.multiple_results else [out]
    return [_known(np.asarray(o)) for o in outs]


_NUMPY_ELEMENTWISE = {
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "neg": np.negative,
    "max": np.maximum,
    "min": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.logical_and,
    "or": np.logical_or,
    "not": np.logical_not,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "sign": np.sign,
    "square": np.square,
}


def _numpy(name, params, args):
    """The primitive evaluated by numpy on concrete arguments, for the common ones (JAX's
    eager evaluation compiles each primitive for each shape: seconds per model); `None`
    for the others."""
    args = [np.asarray(a) for a in args]
    x = args[0] if args else None
    if name in _NUMPY_ELEMENTWISE:
        if name in ("and", "or", "not") and x.dtype != bool:
            return None
        return [_NUMPY_ELEMENTWISE[name](*args)]
    if name == "div" and np.issubdtype(x.dtype, np.inexact):
        return [np.divide(*args)]
    if name == "integer_pow":
        return [x ** params["y"]]
    if name in ("copy", "copy_p"):
        return [x]
    if name == "convert_element_type":
        return [x.astype(params["new_dtype"])]
    if name == "iota":
        shape, dimension = params["shape"], params["dimension"]
        index = np.arange(shape[dimension], dtype=params["dtype"])
        view = [1] * len(shape)
        view[dimension] = shape[dimension]
        return [np.broadcast_to(index.reshape(view), shape)]
    if name == "reshape" and params.get("dimensions") is None:
        return [np.reshape(x, params["new_sizes"])]
    if name == "broadcast_in_dim":
        shape, dims = params["shape"], tuple(params["broadcast_dimensions"])
        view = [x.shape[dims.index(i)] if i in dims else 1 for i in range(len(shape))]
        return [np.broadcast_to(x.reshape(view), shape)]
    if name == "transpose":
        return [np.transpose(x, params["permutation"])]
    if name == "squeeze":
        return [np.squeeze(x, axis=tuple(params["dimensions"]))]
    if name == "expand_dims":
        return [np.expand_dims(x, tuple(params["dimensions"]))]
    if name == "rev":
        return [np.flip(x, axis=tuple(params["dimensions"]))]
    if name == "slice":
        strides = params["strides"] or (1,) * x.ndim
        bounds = zip(params["start_indices"], params["limit_indices"], strides, strict=False)
        return [x[tuple(slice(a, b, c) for a, b, c in bounds)]]
    if name == "concatenate":
        return [np.concatenate(args, axis=params["dimension"])]
    if name == "split":
        cuts = np.cumsum(params["sizes"])[:-1]
        return np.split(x, cuts, axis=params["axis"])
    if name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_or", "reduce_and"):
        fn = {
            "reduce_sum": np.sum,
            "reduce_max": np.max,
            "reduce_min": np.min,
            "reduce_or": np.any,
            "reduce_and": np.all,
        }[name]
        return [fn(x, axis=tuple(params["axes"]))]
    if name == "cumsum":
        axis = params["axis"]
        if params.get("reverse"):
            return [np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)]
        return [np.cumsum(x, axis=axis)]
    if name == "select_n":
        cases = np.broadcast_arrays(*args[1:])
        return [np.choose(np.asarray(x, dtype=int), cases)]
    if name == "jaxdae_gather_sum":  # `_gather.take` and its transpose
        table = params["table"]
        padded = np.concatenate([x, np.zeros((1,) + x.shape[1:], x.dtype)])
        return [padded[table.index].sum(axis=1)]
    if name == "dot_general":
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        lhs, rhs = args
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        ls = [next(letters) for _ in range(lhs.ndim)]
        rs = [next(letters) for _ in range(rhs.ndim)]
        for i, j in zip(lc, rc, strict=False):
            rs[j] = ls[i]
        for i, j in zip(lb, rb, strict=False):
            rs[j] = ls[i]
        batch = [ls[i] for i in lb]
        free_l = [ls[i] for i in range(lhs.ndim) if i not in lc and i not in lb]
        free_r = [rs[j] for j in range(rhs.ndim) if j not in rc and j not in rb]
        spec = f"{''.join(ls)},{''.join(rs)}->{''.join(batch + free_l + free_r)}"
        return [np.einsum(spec, lhs, rhs)]
    return None


def _structural(eqn, ins):
    """Applies the primitive to float masks (non-float operands by their known values)."""
    args = []
    for var, a in zip(eqn.invars, ins, strict=False):
        if jnp.issubdtype(var.aval.dtype, jnp.inexact):
            args.append(
                a.mask.astype(
                    np.float64 if var.aval.dtype == np.float64 else np.dtype(var.aval.dtype)
                )
            )
        elif a.value is not None:
            args.append(a.value)
        else:
            return None  # e.g. indices that depend on the inputs
    params = dict(eqn.params)
    if "preferred_element_type" in params and params["preferred_element_type"] is not None:
        if not jnp.issubdtype(params["preferred_element_type"], jnp.inexact):
            return None
    try:
        outs = _evaluate(eqn, args)
    except Exception:
        return None
    return [_Abstract(o.mask) for o in outs]


def _equation(eqn, ins) -> list[_Abstract]:
    name = eqn.primitive.name
    outs_avals = [v.aval for v in eqn.outvars]
    sub = next((eqn.params[k] for k in _CALLS if k in eqn.params), None)
    if (
        all(a.value is not None for a in ins)
        and not eqn.effects
        and name not in ("while", "scan", "cond")
    ):
        try:
            return _evaluate(eqn, [a.value for a in ins])
        except Exception:
            pass
    if name == "optimization_barrier":  # the identity, operand by operand
        return list(ins)
    if name == "cond":
        return _cond(eqn, ins)
    if name == "while":
        return _while(eqn, ins)
    if name == "scan":
        return _scan(eqn, ins)
    if sub is not None:  # pjit, closed_call, custom_jvp_call, custom_vjp_call, remat, ...
        if isinstance(sub, jex.ClosedJaxpr):
            inner_ins = ins[len(ins) - len(sub.jaxpr.invars) :]
            return _run_closed(sub, inner_ins)
        if isinstance(sub, jex.Jaxpr):
            return _run(sub, [], ins[len(ins) - len(sub.invars) :])
    floating = all(jnp.issubdtype(a.dtype, jnp.inexact) for a in outs_avals)
    if floating and name in _ZERO_PRESERVING:
        return [_Abstract(ins[0].mask)]
    if floating and name in _UNION:
        return [_Abstract(np.logical_or(ins[0].mask, ins[1].mask))]
    if floating and name in _INTERSECTION:
        return [_Abstract(np.logical_and(ins[0].mask, ins[1].mask))]
    if floating and name in _FIRST:
        return [_Abstract(np.broadcast_to(ins[0].mask, outs_avals[0].shape))]
    if floating and name == "integer_pow" and eqn.params["y"] > 0:
        return [_Abstract(ins[0].mask)]
    if floating and name == "pow" and ins[1].value is not None and np.all(ins[1].value > 0):
        return [_Abstract(np.broadcast_to(ins[0].mask, outs_avals[0].shape))]
    if name == "select_n" and floating:
        predicate = ins[0]
        if predicate.value is not None:
            cases = [np.broadcast_to(c.mask, outs_avals[0].shape) for c in ins[1:]]
            chosen = np.choose(np.asarray(predicate.value, dtype=int), cases)
            return [_Abstract(chosen)]
        return [
            _Abstract(
                np.logical_or.reduce(
                    [np.broadcast_to(c.mask, outs_avals[0].shape) for c in ins[1:]]
                )
            )
        ]
    if floating and name == "clamp":
        return [
            _Abstract(
                np.logical_or.reduce([np.broadcast_to(a.mask, outs_avals[0].shape) for a in ins])
            )
        ]
    if floating and name in _STRUCTURAL:
        outs = _structural(eqn, ins)
        if outs is not None:
            return outs
    return [_full(a) for a in outs_avals]


def _union(a: Sequence[_Abstract], b: Sequence[_Abstract]) -> list[_Abstract]:
    return [_Abstract(np.logical_or(x.mask, y.mask)) for x, y in zip(a, b, strict=False)]


def _cond(eqn, ins):
    branches = eqn.params["branches"]
    index, operands = ins[0], ins[1:]
    if index.value is not None:
        which = int(np.clip(index.value, 0, len(branches) - 1))
        return _run_closed(branches[which], operands)
    outs = None
    for branch in branches:
        result = _run_closed(branch, operands)
        outs = result if outs is None else _union(outs, result)
    assert outs is not None  # a `cond` has at least one branch
    return [_Abstract(o.mask) for o in outs]


def _unknown(values: Sequence[_Abstract]) -> list[_Abstract]:
    return [_Abstract(v.mask) for v in values]


def _fixed_point(step, carry, limit=64):
    """Unites `carry` with `step(carry)` until it stops changing (masks only grow)."""
    carry = _unknown(carry)
    for _ in range(limit):
        new = _union(carry, step(carry))
        if all(np.array_equal(x.mask, y.mask) for x, y in zip(new, carry, strict=False)):
            return new, True
        carry = new
    return carry, False


def _while(eqn, ins):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    body_consts, carry = ins[nc : nc + nb], ins[nc + nb :]

    def step(c):
        return _run_closed(p["body_jaxpr"], list(body_consts) + list(c))

    carry, converged = _fixed_point(step, carry)
    if not converged:
        return [_full(v.aval) for v in eqn.outvars]
    return carry


def _scan(eqn, ins):
    p = eqn.params
    consts, carry, xs = scan_operand_groups(p, ins)
    ncarry = len(carry)
    # One iteration sees any slice of `xs`: the union over the scanned axis.
    x_slices = [_Abstract(np.any(x.mask, axis=0)) for x in xs]
    ys_masks = []

    def step(c):
        outs = _run_closed(p["jaxpr"], list(consts) + list(c) + x_slices)
        ys_masks.append(outs[ncarry:])
        return outs[:ncarry]

    carry, converged = _fixed_point(step, carry)
    if not converged:
        return [_full(v.aval) for v in eqn.outvars]
    ys = _run_closed(p["jaxpr"], list(consts) + list(carry) + x_slices)[ncarry:]
    ys = [
        _Abstract(np.broadcast_to(y.mask, v.aval.shape))
        for y, v in zip(ys, eqn.outvars[ncarry:], strict=False)
    ]
    return list(carry) + ys


def column_colouring(mask: np.ndarray) -> np.ndarray:
    """A colour per column of a `(rows, cols)` pattern such that no two columns of one
    colour have an entry in the same row (greedy, columns in order; a banded pattern gets
    about as many colours as its bandwidth).

    **Returns:** `(cols,)` integer colours `0, 1, ..., k − 1`.
    """
    mask = np.asarray(mask, bool)
    rows_of = [np.flatnonzero(mask[:, j]) for j in range(mask.shape[1])]
    # the colours already used in each row
    used: list[set[int]] = [set() for _ in range(mask.shape[0])]
    colours = np.zeros(mask.shape[1], dtype=np.int64)
    for j, rows in enumerate(rows_of):
        taken = set().union(*(used[i] for i in rows)) if rows.size else set()
        colour = 0
        while colour in taken:
            colour += 1
        colours[j] = colour
        for i in rows:
            used[i].add(colour)
    return colours
