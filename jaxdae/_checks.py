"""What bad arguments are told: the shared wording of the input checks."""

import numpy as np

from ._gains import is_concrete


def described(value) -> str:
    """How an argument of the wrong kind is named in an error message (a class passed where
    an instance belongs is the usual mistake)."""
    if isinstance(value, type):
        return f"the class {value.__name__} itself; pass an instance, e.g. {value.__name__}(...)"
    return type(value).__name__


def check_instance(name: str, value, kind: type | tuple[type, ...], expected: str, *,
                   optional: bool = False) -> None:
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
