"""What bad arguments are told: the shared wording of type errors."""


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
