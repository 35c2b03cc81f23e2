"""What bad arguments are told: the shared wording of the input checks, and the conversion
of a user's array of numbers to a floating array."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._custom_types import Array
from ._gains import is_concrete


def described(value) -> str:
    """How an argument of the wrong kind is named in an error message (a class passed where
    an instance belongs is the usual mistake)."""
    if isinstance(value, type):
        return f"the class {value.__name__} itself; pass an instance, e.g. {value.__name__}(...)"
    return type(value).__name__


def check_instance(
    name: str, value, kind: type | tuple[type, ...], expected: str, *, optional: bool = False
) -> None:
    """`ValueError` unless `value` is an instance of `kind` (or `None`, the default of an
    `optional` argument)."""
    if not (isinstance(value, kind) or (optional and value is None)):
        raise ValueError(f"`{name}` must be {expected}; got {described(value)}.")


def check_finite(name: str, value) -> None:
    """`ValueError` if a concrete `value` holds nan or inf (traced values pass)."""
    if is_concrete(value) and not np.all(np.isfinite(np.asarray(value))):
        raise ValueError(f"`{name}` contains non-finite values (nan or inf); got {value}.")


def check_positive(name: str, value, kind: str, *, allow_zero: bool = False) -> None:
    """`ValueError` unless a concrete `value` is a positive (or, with `allow_zero`,
    non-negative) finite scalar; `None` (a default) and traced values pass. `kind` names
    it: "step", "residual", "weight", ..."""
    if value is None or not is_concrete(value):
        return
    ok = np.ndim(value) == 0 and np.isfinite(float(value))
    if not (ok and (float(value) >= 0 if allow_zero else float(value) > 0)):
        sign = "non-negative" if allow_zero else "positive"
        raise ValueError(f"`{name}` must be a {sign} finite {kind} (a scalar); got {value}.")


def check_count(name: str, value, what: str, minimum: int = 0) -> None:
    """`ValueError` unless `value` is a Python or NumPy integer of at least `minimum` (not
    a bool); `what` says what it counts, e.g. "Gauss–Newton iterations"."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        bound = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer of at least {minimum}"
        )
        raise ValueError(f"`{name}` must be {bound} ({what}); got {value!r}.")


TOLERANCE_RULE = "finite and non-negative, not both zero, with `rtol` at most 1"


def tolerance_problem(rtol, atol, xnp=jnp):
    """True where `(rtol, atol)` break [`check_tolerances`][]'s rule. `xnp` is
    `jax.numpy` (traced values give a traced flag) or `numpy` (eager checks)."""
    rtol, atol = xnp.asarray(rtol), xnp.asarray(atol)
    finite = xnp.all(xnp.isfinite(rtol)) & xnp.all(xnp.isfinite(atol))
    return (
        ~finite
        | xnp.any(rtol < 0)
        | xnp.any(rtol > 1)
        | xnp.any(atol < 0)
        | xnp.any((rtol <= 0) & (atol <= 0))
    )


def check_tolerances(rtol, atol, whose: str = "") -> None:
    """`ValueError` unless concrete `rtol` and `atol` (a step's relative and absolute
    error tolerances) follow `TOLERANCE_RULE`; traced values pass (`tolerance_problem`
    gives their flag). `whose` prefixes the names, e.g. "The step-size controller's ".

    The rule is SUNDIALS' (CVODE's `CVodeSStolerances`): each tolerance non-negative, and
    either may be zero alone. `atol = 0` is pure relative error control; a state component
    that stays exactly zero then has no error weight and every step is rejected, so pass
    `atol > 0` for such states. `rtol = 0` is pure absolute control. Beyond SUNDIALS,
    `rtol > 1` is refused: it asks for no correct digit. `atol` has no upper bound: it
    carries the state's units."""
    if not is_concrete(rtol, atol):
        return
    check_real(rtol=rtol, atol=atol)
    rtol_np, atol_np = np.asarray(rtol, float), np.asarray(atol, float)
    if not bool(tolerance_problem(rtol_np, atol_np, np)):
        return
    if not np.all(np.isfinite(rtol_np) & (rtol_np >= 0) & (rtol_np <= 1)):
        which = (
            "`rtol` must be in [0, 1] (a relative tolerance above 1 accepts any step)"
            if np.all(rtol_np >= 0)
            else "`rtol` must be in [0, 1]"
        )
    elif not np.all(np.isfinite(atol_np) & (atol_np >= 0)):
        which = "`atol` must be a finite non-negative number"
    else:
        which = "they must not both be zero (no step would pass its error test)"
    raise ValueError(
        f"{whose}`rtol` and `atol` must be {TOLERANCE_RULE}: {which}; got "
        f"rtol = {rtol}, atol = {atol}."
    )


_SMALL_FLOATS = ("float16", "bfloat16")


def dtype_problem(dtype) -> str | None:
    """What is wrong with an input of `dtype` for jaxdae (completing "`name` ..."), or
    None: complex values (their imaginary parts would be dropped) or a float type narrower
    than float32."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (
            f"must be real: it is complex ({dtype}), and jaxdae computes in real "
            "arithmetic (the imaginary parts would be dropped)"
        )
    if dtype.name in _SMALL_FLOATS:
        return (
            f"must be float32 or float64: jaxdae does not support {dtype.name} (its "
            "rounding is too coarse for the error tests and the constraint checks)"
        )
    return None


def check_real(**named) -> None:
    """`ValueError` naming the first of the `named` inputs (array-likes or None) whose dtype
    has a `dtype_problem`; `TypeError` naming the first that holds text (a string, or a
    NumPy array of them), which NumPy would otherwise convert to a number or refuse without
    naming the input."""
    for name, value in named.items():
        if _holds_text(value):
            raise TypeError(
                f"`{name}` must be a real number or an array of real numbers; got text "
                f"({value!r:.60}). Pass the number itself, e.g. `float(...)` of the string."
            )
        if value is None or not eqx.is_array_like(value):
            continue
        problem = dtype_problem(jnp.result_type(value))
        if problem is not None:
            raise ValueError(f"`{name}` {problem}.")


def _holds_text(value) -> bool:
    """Whether `value` is a string, holds one (a list or tuple, nested), or is a NumPy array
    of them."""
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "SU"
    if isinstance(value, (list, tuple)):
        return any(_holds_text(item) for item in value)
    return False


def check_leaf_dtypes(tree, what: str) -> None:
    """`ValueError` naming the field of `tree` (a system or formulation, `what` says which:
    "system parameter", "gain") whose array has a `dtype_problem`."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not eqx.is_array_like(leaf) or isinstance(leaf, (bool, int, float)):
            continue
        problem = dtype_problem(jnp.result_type(leaf))
        if problem is not None:
            name = jax.tree_util.keystr(path, simple=True, separator=".") or "?"
            raise ValueError(f"The {what} `{name}` of {described(tree)} {problem}.")


def float_array(name: str, value) -> Array:
    """`value` as a real floating array (integers become floats); complex and float16
    values are refused (`dtype_problem`), and so are values that are not numbers (`TypeError`;
    a NumPy object array of numbers is converted)."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        try:
            value = value.astype(float)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"`{name}` must be an array of real numbers; got a NumPy object "
                f"array that does not convert to floats ({error}). Pass e.g. "
                f"`np.asarray({name}, dtype=float)`."
            ) from error
    try:
        array = jnp.asarray(value)
    except TypeError as error:
        raise TypeError(
            f"`{name}` must be an array of real numbers; got {described(value)} "
            f"({error}). Pass a JAX or NumPy array of floats."
        ) from error
    check_real(**{name: array})
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.result_type(float))
    return array
