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


def batch_indexed_in_loops(jaxpr: jex_core.Jaxpr, batch: int, depth: int = 1) -> list[str]:
    """The gathers and scatters inside at least `depth` nested loops of `jaxpr` whose
    array and indices both carry a batch of `batch` members (a dimension of that size):
    reads and writes of per-member data at per-member positions, which a loop with
    unbatched counters does without. (Reads of shared data at per-member positions, such
    as a permutation by a member's pivots, are not counted.)"""
    found = []

    def visit(jaxpr, loops):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if loops >= depth and name.startswith(("gather", "scatter")):
                array, indices = (v.aval.shape for v in eqn.invars[:2])
                if batch in array and batch in indices:
                    found.append(name)
            inner = loops + (name in ("while", "scan"))
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    if isinstance(sub, jex_core.ClosedJaxpr):
                        visit(sub.jaxpr, inner)
                    elif isinstance(sub, jex_core.Jaxpr):
                        visit(sub, inner)

    visit(jaxpr, 0)
    return found
