"""Reading traced programs in tests."""

from collections.abc import Iterator

import jax.extend.core as jex_core


def equations(jaxpr: jex_core.Jaxpr) -> Iterator[jex_core.JaxprEqn]:
    """Every equation of `jaxpr` and of the jaxprs inside it (loops, conditionals, calls)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jex_core.ClosedJaxpr):
                    yield from equations(sub.jaxpr)
                elif isinstance(sub, jex_core.Jaxpr):
                    yield from equations(sub)


# Primitives that keep XLA:CPU from compiling a solve's while loop into one kernel
# (`jaxdae/_compilation/_xla_flags.py`): scatters, sorts and custom calls (LAPACK, host
# callbacks).
NOT_IN_A_LOOP = frozenset({"scatter", "scatter-add", "scatter_add", "sort", "cholesky",
                           "triangular_solve", "lu", "eigh", "svd", "qr", "pure_callback",
                           "linear_solve"})


def not_in_a_loop(jaxpr: jex_core.Jaxpr) -> set[str]:
    """The primitives of `NOT_IN_A_LOOP` that `jaxpr` (nested jaxprs included) holds."""
    return {eqn.primitive.name for eqn in equations(jaxpr)} & NOT_IN_A_LOOP
