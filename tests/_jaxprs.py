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
NOT_IN_A_LOOP = frozenset(
    {
        "scatter",
        "scatter-add",
        "scatter_add",
        "sort",
        "cholesky",
        "triangular_solve",
        "lu",
        "eigh",
        "svd",
        "qr",
        "pure_callback",
        "linear_solve",
    }
)


def not_in_a_loop(jaxpr: jex_core.Jaxpr) -> set[str]:
    """The primitives of `NOT_IN_A_LOOP` that `jaxpr` (nested jaxprs included) holds."""
    return {eqn.primitive.name for eqn in equations(jaxpr)} & NOT_IN_A_LOOP


def assert_rates_loop_is_one_kernel(system, formulation, q, v, mass_factor=None) -> None:
    """XLA compiles a jitted loop of `system`'s right-hand side under `formulation` (with
    the factor of a constant mass matrix, as a solve passes it) into one CPU kernel: the
    while loop is hoisted into a call (`xla_cpu_small_call`) and the program holds no custom
    call (LAPACK, a library fusion: `jaxdae/_compilation/_xla_flags.py`)."""
    import jax

    from jaxdae._integration._vector_fields import jitted_rates

    @jax.jit
    def loop(q, v, count):
        def body(_, y):
            dq, dv = jitted_rates(system, formulation, 0.0, *y, mass_factor)
            return y[0] + 1e-9 * dq, y[1] + 1e-9 * dv

        return jax.lax.fori_loop(0, count, body, (q, v))

    with jax.default_device(jax.devices("cpu")[0]):  # XLA:CPU's program, on any machine
        text = loop.lower(q, v, 10).compile().as_text()
    entry = text[text.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    assert " while(" not in entry and "xla_cpu_small_call" in entry
    assert "kind=kCustom" not in text and "custom_call_target" not in text


def batch_indexed_in_loops(jaxpr: jex_core.Jaxpr, batch: int) -> list[str]:
    """The gathers and scatters inside `jaxpr`'s loops whose indices carry a batch of
    `batch` members (an index array with a dimension of that size): reads and writes at
    per-member positions, which a loop with unbatched counters does without."""
    found = []
    for eqn in equations(jaxpr):
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                body = sub.jaxpr if isinstance(sub, jex_core.ClosedJaxpr) else sub
                if eqn.primitive.name in ("while", "scan") and isinstance(body, jex_core.Jaxpr):
                    found += [
                        inner.primitive.name
                        for inner in equations(body)
                        if inner.primitive.name.startswith(("gather", "scatter"))
                        and batch in inner.invars[1].aval.shape
                    ]
    return found
