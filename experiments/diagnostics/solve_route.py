"""The route of one `jaxdae.simulate` call through jaxdae's modules.

Records every call from a function of one jaxdae module into a function of another
(through equinox's method wrappers, but not from inside JAX or diffrax: what diffrax calls
back, the vector field and the adjoint's loop, is the solve's work, not its route), during
a call that traces and compiles (`CartesianPendulum`, `Baumgarte`, `Tsit5`, saved at three
times). Prints the modules entered, how often each is entered, and the re-entries (entries
after the first), for the whole package and for the solve path alone
(`jaxdae._integration`, the formulations and the systems; the base layer's helpers, gain
checks, argument checks, compilation helpers and the result types, are counted apart, as
library calls are).

    python experiments/diagnostics/solve_route.py
"""

import collections
import sys

import jax.numpy as jnp

import jaxdae
from jaxdae.examples import CartesianPendulum

# Frames that only pass a call on (method and decorator wrappers).
PASS_THROUGH = ("equinox", "functools", "contextlib", "jaxtyping", "typing", "wadler_lindig")
SOLVE_PATH = ("jaxdae._integration", "jaxdae._formulations", "jaxdae._systems")


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "")


def route() -> list[tuple[str, str]]:
    """The `(caller, callee)` modules of the calls between jaxdae modules in one call of
    `simulate` that traces and compiles."""
    system = CartesianPendulum()
    q0, v0 = jnp.array([1.0, 0.0]), jnp.zeros(2)
    # The model's own jitted functions traced once, as in a session that has run it.
    jaxdae.simulate(system, jaxdae.Baumgarte(5.0, 5.0), 0.0, 0.1, q0, v0)
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
            calls.append((source, callee))

    sys.setprofile(profile)
    try:
        jaxdae.simulate(
            system, jaxdae.Baumgarte(5.0, 5.0), 0.0, 1.0, q0, v0, ts=jnp.linspace(0.0, 1.0, 3)
        )
    finally:
        sys.setprofile(None)
    return calls


def report(calls, title: str) -> None:
    entries = collections.Counter(callee for _, callee in calls)
    modules = {"jaxdae._integration._simulate"} | set(entries)
    print(f"{title}: {len(modules)} modules, {sum(entries.values()) - len(entries)} re-entries")
    for module, count in entries.items():
        print(f"  {module:48s} entered {count}")


def main() -> None:
    calls = route()
    report(calls, "All of jaxdae")
    on_path = [(a, b) for a, b in calls if a.startswith(SOLVE_PATH) and b.startswith(SOLVE_PATH)]
    report(on_path, "Solve path")


if __name__ == "__main__":
    main()
