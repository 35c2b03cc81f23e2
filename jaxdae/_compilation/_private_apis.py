"""The one home of the private JAX, diffrax and equinox names that jaxdae uses.

Each name below has no public counterpart (the reason is given beside it); the rest of
jaxdae imports it from here, never from `jax._src`, `diffrax._*` or `equinox.internal`
directly. `tests/test_private_apis.py` checks that each still exists and behaves as jaxdae
relies on, and names the installed versions when one has moved, so that a new release
that breaks one fails that test rather than a solve somewhere else.

Three of them only make jaxdae faster and have a safe answer when they are gone:
`backends_are_initialized` (then: assume JAX has computed nothing yet),
`traced_for_jit` (then: never, so `jit_unless_staged` always jits) and
`diffeqsolve_unjitted` (then: `diffrax.diffeqsolve` itself). The others are needed for
correct results and are imported without a fallback.
"""

import importlib

import jax
import numpy as np

# The names of diffrax and equinox are imported when first used: `backends_are_initialized`
# is asked before jaxdae imports them, and some releases start JAX's backend on import.
_LAZY = {
    # The marker with which a root finder made by the public
    # `diffrax.with_stepsize_controller_tols` (the default of every implicit diffrax solver)
    # says "take `rtol`, `atol` and `norm` from the step size controller"; `diffeqsolve`
    # replaces it. diffrax exports the wrapper, not the marker, and jaxdae needs it to tell
    # whether a root finder has tolerances of its own.
    "use_stepsize_tol": ("diffrax._root_finder", "use_stepsize_tol"),
    # `jnp.any` over the entries of a batched array as one unbatched flag; equinox's own
    # `while_loop`s use it to skip work that no batch entry needs. JAX has no public way for
    # a function to ignore the batch dimension that `jax.vmap` adds.
    "unvmap_any": ("equinox.internal", "unvmap_any"),
    # The largest entry of a batched integer array as one unbatched value: a loop bounded by
    # it keeps an unbatched counter under `jax.vmap`, so that its reads and writes at the
    # counter stay slices rather than becoming gathers and scatters.
    "unvmap_max": ("equinox.internal", "unvmap_max"),
    # `diffrax.diffeqsolve` without its own `eqx.filter_jit` (the function that equinox's
    # wrapper keeps as `__wrapped__`): a solve is always traced inside a jit (its own,
    # `jit_unless_staged`, or the caller's). Reverse mode stages a jitted call before it
    # differentiates it, and staging the adjoint's custom VJP traces the primal solve,
    # which the gradient then does not use (docs/design_measurements.md#unjitted-solve).
    "diffeqsolve_unjitted": ("diffrax", "diffeqsolve.__wrapped__"),
}
# What stands in for a name that only makes jaxdae faster, where it is gone.
_FALLBACK = {"diffeqsolve_unjitted": ("diffrax", "diffeqsolve")}


def _resolve(module: str, path: str):
    value = importlib.import_module(module)
    for attribute in path.split("."):
        value = getattr(value, attribute)
    return value


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = _resolve(*_LAZY[name])
    except AttributeError:
        if name not in _FALLBACK:
            raise
        MISSING[".".join(_LAZY[name])] = _versions()
        value = _resolve(*_FALLBACK[name])
    globals()[name] = value
    return value


# Names found missing (at import, or a lazy one with a fallback when first used), each with
# the library versions it was missing from; tests/test_private_apis.py requires this to be
# empty.
MISSING: dict[str, str] = {}


def _versions() -> str:
    import diffrax
    import equinox

    return f"jax {jax.__version__}, diffrax {diffrax.__version__}, equinox {equinox.__version__}"


# Whether JAX has started a backend (and so read `XLA_FLAGS`). `jax.extend.backend` offers
# `backends()`, which starts them: no public function asks without doing so.
try:
    from jax._src.xla_bridge import backends_are_initialized as backends_are_initialized
except ImportError:
    MISSING["jax._src.xla_bridge.backends_are_initialized"] = _versions()

    def backends_are_initialized() -> bool:
        """Assumed False: the backend cannot be asked (see `MISSING`)."""
        return False


# The trace of `jax.jit` (and `jax.make_jaxpr`): a tracer whose trace stack holds one is being
# staged into a jaxpr. JAX exposes tracers (`jax.core.Tracer`) but not the types of traces,
# nor a public question "is this value being traced for a jit?".
try:
    from jax._src.interpreters.partial_eval import DynamicJaxprTrace as DynamicJaxprTrace
except ImportError:
    MISSING["jax._src.interpreters.partial_eval.DynamicJaxprTrace"] = _versions()
    DynamicJaxprTrace = None


def traced_for_jit(values) -> bool:
    """Whether the first tracer among the leaves of `values` is traced for an enclosing
    `jax.jit`: a trace under its own (a `grad`'s or `vmap`'s is over the jit's) stages a
    jaxpr. False for concrete values, under eager transformations, and when JAX's trace
    internals (`Tracer._trace`, `Trace.parent_trace`) have moved."""
    tracer = next(
        (x for x in jax.tree_util.tree_leaves(values) if isinstance(x, jax.core.Tracer)), None
    )
    if tracer is None or DynamicJaxprTrace is None:
        return False
    try:
        trace = tracer._trace
        while not isinstance(trace, DynamicJaxprTrace):
            trace = trace.parent_trace
    except AttributeError:  # an eager trace at the bottom
        return False
    return True


# The integer codes of the items of an equinox enumeration (diffrax's and jaxdae's
# `RESULTS`) and the messages by code: equinox gives an item's comparisons, `where` and
# message, but not its code, which the results of the elements of a batch (one code each)
# are read and written by.
def result_codes(item) -> "jax.Array | np.ndarray":
    """The integer code array of `item`, an item of an equinox enumeration (any shape:
    one code per element of a batch; a NumPy array for a constant item)."""
    return item._value


def with_result_codes(item, codes):
    """`item` with its code array replaced by `codes` (of its enumeration)."""
    import equinox as eqx  # not at import: see `_LAZY`

    return eqx.tree_at(lambda r: r._value, item, codes)


def result_messages(enumeration) -> list[str]:
    """The messages of the items of `enumeration`, indexed by their codes."""
    return enumeration._index_to_message


# The arguments that diffrax's Runge–Kutta step hands to the root finder of an implicit
# stage: `(stage, aᵢᵢ, vf, prod, tᵢ, …)` in f-space, `(stage, aᵢᵢ, vf_prod, tᵢ, …)` in
# k-space (`diffrax._solver.runge_kutta`). They are positional and undocumented; a root
# finder that builds the stages' iteration matrix reads the diagonal coefficient from them.
def stage_diagonal(args) -> "jax.Array | None":
    """The diagonal coefficient `aᵢᵢ` among the root-find arguments of an implicit
    Runge–Kutta stage; None for other arguments (a layout this does not recognise)."""
    import equinox as eqx  # not at import: see `_LAZY`

    if not (isinstance(args, tuple) and len(args) in (7, 8)):
        return None
    stage, diagonal, vf = args[:3]
    if not (
        eqx.is_array(stage)
        and jax.numpy.issubdtype(stage.dtype, jax.numpy.integer)
        and eqx.is_array(diagonal)
        and jax.numpy.shape(diagonal) == ()
        and callable(vf)
    ):
        return None
    return diagonal


# How a `scan` equation's operands split into its constants, carry and scanned inputs: its
# `num_consts` and `num_carry` up to JAX 0.10, from JAX 0.11 its `ft_in`, a flat tree of the
# three groups (as JAX's own `_scan_impl` reads it). The parameters of a primitive are not
# public; the sparsity patterns follow a scan's carry through them.
def scan_operand_groups(params, operands) -> tuple[list, list, list]:
    """`(consts, carry, xs)` among the `operands` of a `scan` equation with `params`."""
    if "ft_in" in params:
        consts, carry, xs = params["ft_in"].update(tuple(operands)).unpack()
        return list(consts), list(carry), list(xs)
    nconsts, ncarry = params["num_consts"], params["num_carry"]
    operands = list(operands)
    return (
        operands[:nconsts],
        operands[nconsts : nconsts + ncarry],
        operands[nconsts + ncarry :],
    )
