"""Attributes that a wrapper reads through from the object it wraps."""

from typing import Any


class Forwarded:
    """A read-only attribute of a wrapper module: the attribute of the same name of the
    object in its field `wrapped` (a solver wrapper's `order`, a controller wrapper's
    `rtol`). Declared once per name as `rtol = Forwarded("controller")`; read on every
    access, so the wrapper says what the wrapped object says. On the class itself it is the
    descriptor, as a `property` would be."""

    def __init__(self, wrapped: str):
        self.wrapped = wrapped
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return getattr(getattr(instance, self.wrapped), self.name)
