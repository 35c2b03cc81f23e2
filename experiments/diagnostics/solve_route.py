"""The route of one `jaxdae.simulate` call through jaxdae's modules.

Records every call from a function of one jaxdae module into a function of another
(through equinox's method wrappers, but not inside what diffrax calls back: the vector
field, the adjoint's loop and the event conditions are the solve's work, not its route),
during a call that traces and compiles (`CartesianPendulum`, `Baumgarte`, `Tsit5`, saved
at three times; the system and formulation built before it). Prints the modules entered,
how often each is entered, and the re-entries (entries after the first: every call into a
module counts, a constructor of its classes too), for the whole package and for the solve
path alone (`jaxdae._integration`, the formulations and the systems; the base layer's
helpers, gain checks, argument checks, compilation helpers and the result types, are
counted apart, as library calls are). `tests/test_declared_capabilities.py` bounds the
solve path's counts (`route`, `solve_path`, `counts`).

It also lists the type probes that jaxdae's code makes in such a call: `isinstance` tests on
a concrete jaxdae class (not named `Abstract...` and without abstract methods), and
attribute probes (`getattr` with a default, `hasattr`). A solve path that asks a system,
solver or option what it can do, rather than what class it is, has none (`type_probes`;
`tests/test_declared_capabilities.py` checks it).

    python experiments/diagnostics/solve_route.py
"""

import builtins
import collections
import inspect
import sys

import jax.numpy as jnp

import jaxdae
from jaxdae.examples import CartesianPendulum

# Frames that only pass a call on (method and decorator wrappers).
PASS_THROUGH = ("equinox", "functools", "contextlib", "jaxtyping", "typing", "wadler_lindig")
SOLVE_PATH = ("jaxdae._integration", "jaxdae._formulations", "jaxdae._systems")


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "")


SYSTEM = CartesianPendulum()
FORMULATION = jaxdae.Baumgarte(5.0, 5.0)


def _simulate(t1: float, saves: int = 3) -> None:
    """The solve of the route: `CartesianPendulum`, `Baumgarte`, Tsit5, saved at `saves`
    times (0: at `t1`)."""
    q0, v0 = jnp.array([1.0, 0.0]), jnp.zeros(2)
    ts = jnp.linspace(0.0, t1, saves) if saves else None
    jaxdae.simulate(SYSTEM, FORMULATION, 0.0, t1, q0, v0, ts=ts)


def _called_back(frame) -> bool:
    """Whether `frame` runs inside a call from diffrax (a callback: the vector field, the
    adjoint's loop, an event's condition)."""
    while frame is not None:
        if _module(frame).split(".")[0] == "diffrax":
            return True
        frame = frame.f_back
    return False


def route(saves: int = 3) -> list[tuple[str, str]]:
    """The `(caller, callee)` modules of the calls between jaxdae modules in one call of
    `simulate` that traces and compiles (saved at `saves` times: a count that no earlier
    solve of the process used, so that its program is traced)."""
    # The model's own jitted functions traced once, as in a session that has run it.
    _simulate(0.1, saves=0)
    calls = []

    def profile(frame, event, arg):
        if event != "call":
            return
        caller = frame.f_back
        while caller is not None and _module(caller).split(".")[0] in PASS_THROUGH:
            caller = caller.f_back
        if caller is None:
            return
        callee, source = _module(frame), _module(caller)
        if callee.startswith("jaxdae") and source.startswith("jaxdae") and callee != source:
            if not _called_back(caller):
                calls.append((source, callee))

    sys.setprofile(profile)
    try:
        _simulate(1.0, saves)
    finally:
        sys.setprofile(None)
    return calls


def _is_concrete_jaxdae_class(kind) -> bool:
    return (
        isinstance(kind, type)
        and kind.__module__.startswith("jaxdae")
        and not kind.__name__.startswith("Abstract")
        and not inspect.isabstract(kind)
    )


def type_probes(call=lambda: _simulate(0.2)) -> list[tuple[str, str, str]]:
    """`(probe, place, what)` of each type test on a concrete jaxdae class and each
    attribute probe that jaxdae's own code makes during `call` (by default one `simulate`
    of the route), found by replacing the built-ins `isinstance`, `getattr` and `hasattr`
    while it runs: `("isinstance", "jaxdae/...py:LINE", class names)`, `("getattr", ...,
    attribute)`, `("hasattr", ..., attribute)`."""
    found = {}
    real_isinstance, real_getattr, real_hasattr = isinstance, getattr, hasattr

    def caller():
        # The frame that called the replaced built-in, if it is jaxdae's.
        code = sys._getframe(2).f_code
        path = code.co_filename.replace("\\", "/")
        if "/jaxdae/" not in path:
            return None
        return "jaxdae/" + path.rsplit("/jaxdae/", 1)[1] + f":{sys._getframe(2).f_lineno}"

    def probed_isinstance(value, kinds):
        place = caller()
        if place is not None:
            kinds_ = kinds if real_isinstance(kinds, tuple) else (kinds,)
            concrete = [k.__name__ for k in kinds_ if _is_concrete_jaxdae_class(k)]
            if concrete:
                found[("isinstance", place, ", ".join(concrete))] = None
        return real_isinstance(value, kinds)

    def probed_getattr(value, name, *default):
        place = caller()
        if place is not None and default:
            found[("getattr", place, name)] = None
        return real_getattr(value, name, *default)

    def probed_hasattr(value, name):
        place = caller()
        if place is not None:
            found[("hasattr", place, name)] = None
        return real_hasattr(value, name)

    builtins.isinstance, builtins.getattr, builtins.hasattr = (
        probed_isinstance,
        probed_getattr,
        probed_hasattr,
    )
    try:
        call()
    finally:
        builtins.isinstance, builtins.getattr, builtins.hasattr = (
            real_isinstance,
            real_getattr,
            real_hasattr,
        )
    return list(found)


def entries(calls) -> collections.Counter:
    """How often each module is entered along `calls` (`_simulate`, where the route
    starts, counts as entered)."""
    entered = collections.Counter(callee for _, callee in calls)
    entered.setdefault("jaxdae._integration._simulate", 0)
    return entered


def counts(calls) -> tuple[int, int]:
    """`(modules, re-entries)` of `calls`: the modules entered, and the entries into a
    module after its first."""
    entered = entries(calls)
    return len(entered), sum(n - 1 for n in entered.values() if n > 1)


def solve_path(calls) -> list[tuple[str, str]]:
    """The calls of `calls` between modules of the solve path (`SOLVE_PATH`)."""
    return [(a, b) for a, b in calls if a.startswith(SOLVE_PATH) and b.startswith(SOLVE_PATH)]


def report(calls, title: str) -> None:
    modules, reentries = counts(calls)
    print(f"{title}: {modules} modules, {reentries} re-entries")
    for module, count in entries(calls).items():
        if count:
            print(f"  {module:48s} entered {count}")


def main() -> None:
    calls = route()
    report(calls, "All of jaxdae")
    report(solve_path(calls), "Solve path")
    probes = type_probes()
    print(f"Type and attribute probes in jaxdae's code: {len(probes)}")
    for probe, place, what in probes:
        print(f"  {probe:10s} {place:48s} {what}")


if __name__ == "__main__":
    main()
