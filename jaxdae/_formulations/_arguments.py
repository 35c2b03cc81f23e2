"""Constructor arguments of the formulations: errors that quote the signature."""

import functools
import inspect

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._checks import dtype_problem


def explain_arguments(example: str):
    """Decorates a formulation's `__init__` so that a missing, extra or misspelt argument
    raises a `TypeError` that quotes the constructor's signature, says how the positional
    arguments were read (gains are easy to pass one place off, e.g. `kd, kp` to
    `ModifiedLagrange(alpha, kd, kp)`) and shows `example`, a call that works.

    The wrapped `__init__` itself is unchanged; `inspect.signature` still shows its
    arguments (`functools.wraps`).
    """

    def decorate(init):
        signature = inspect.signature(init)

        @functools.wraps(init)
        def wrapper(self, *args, **kwargs):
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError as error:
                message = _message(type(self).__name__, signature, args, kwargs, example, error)
                raise TypeError(message) from None
            _check_dtypes(type(self).__name__, list(bound.arguments.items())[1:])
            init(self, *args, **kwargs)

        return wrapper

    return decorate


def _check_dtypes(name: str, arguments) -> None:
    """`ValueError` naming the first argument whose array is complex or float16
    (`dtype_problem`): converted to the state's dtype, a complex gain would lose its
    imaginary part. `TypeError` for a string (JAX's own error would not name the gain)."""
    for argument, value in arguments:
        if _is_text(value):
            raise TypeError(
                f"The gain `{argument}` of {name} must be a number or an array of "
                f"numbers; got {value!r}. Pass e.g. `{argument}=10.0`, not a string."
            )
        if value is None or not eqx.is_array_like(value) or isinstance(value, (int, float)):
            continue
        problem = dtype_problem(jnp.result_type(value))
        if problem is not None:
            raise ValueError(f"The gain `{argument}` of {name} {problem}.")


def _is_text(value) -> bool:
    """Whether `value` is a string, or a list, tuple or NumPy array of them."""
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_is_text(item) for item in value)
    return (
        isinstance(value, np.ndarray)
        and value.dtype.kind in "USO"
        and any(_is_text(item) for item in value.ravel().tolist())
    )


def _message(name, signature, args, kwargs, example, error) -> str:
    params = list(signature.parameters.values())[1:]  # without `self`
    names = [p.name for p in params]
    required = [p.name for p in params if p.default is p.empty]
    shown = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)
    call = f"`{name}({shown})`"
    read = dict(zip(names, args, strict=False))
    if len(read) > 1:
        reading = f" The {len(args)} positional arguments were read in order as {_pairs(read)}."
    elif read:
        reading = f" The positional argument was read as {_pairs(read)}."
    else:
        reading = ""
    unknown = [k for k in kwargs if k not in names]
    twice = [k for k in kwargs if k in read]
    missing = [n for n in required if n not in read and n not in kwargs]
    if unknown:
        problem = f"{call} has no argument {_names(unknown)}; its arguments are {_names(names)}."
        reading = ""
    elif len(args) > len(names):
        problem = f"{call} takes at most {len(names)} arguments; got {len(args)} positional ones."
        reading = ""
    elif twice:
        problem = f"{call} got {_names(twice)} both by position and by name."
    elif missing:
        needs = "needs the gain" if len(required) == 1 else "needs the gains"
        problem = f"{call} {needs} {_names(required)}; {_names(missing)} {_is(missing)} missing."
        if len(read) > 1 and not kwargs and len(args) < len(required):
            # The same values read as the last gains instead: the other likely intent.
            shifted = dict(zip(required[len(required) - len(args) :], args, strict=False))
            others = required[: len(required) - len(args)]
            reading += f" If you meant {_pairs(shifted)}, {_names(others)} {_is(others)} missing."
    else:  # pragma: no cover - `bind` failed for a reason not listed above
        problem = f"{call}: {error}"
    return f"{problem}{reading} Pass the gains by name, e.g. `{example}`."


def _pairs(values: dict) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in values.items())


def _names(names) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _is(names) -> str:
    return "is" if len(names) == 1 else "are"


def _short(value) -> str:
    """A value as written in a call, or its shape when it is a larger array."""
    shape = np.shape(value)
    if int(np.prod(shape)) > 4:
        return f"<array of shape {shape}>"
    if isinstance(value, (int, float)):
        return repr(value)
    try:
        return repr(np.asarray(value).tolist())
    except TypeError:  # a tracer (jax.errors.TracerArrayConversionError)
        return f"<{type(value).__name__} of shape {shape}>"
