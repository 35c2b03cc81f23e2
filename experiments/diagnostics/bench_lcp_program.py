"""The size, compile time and run time of one complementarity solve of `_compilation/_lcp.py`.

`solve_lcp` (frictionless contacts, joint limits) and `solve_frictional_lcp` (Coulomb
friction, in the plane with `--tangents 1`, in space with `--tangents 2`) for `--contacts`
contacts, on a fixed positive definite Delassus matrix (`2 I + 0.1`: each contact's
tangential response coupled to its normal, so that the spatial directions take
substitutions) with every contact closing (`b = −1`) and `μ = 0.5`, jitted alone and under
`jax.grad` of a sum of the solution. Prints per function the optimized program's HLO
instructions, its compile time (lowering and XLA, one cold compile) and the median of
`--calls` calls of the compiled function.

    python experiments/diagnostics/bench_lcp_program.py [--contacts 1] [--tangents 2]
"""

import argparse
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxdae  # noqa: F401  (float64, jaxdae's XLA options)
from jaxdae._compilation._lcp import solve_frictional_lcp, solve_lcp


def hlo_instructions(compiled) -> int:
    return sum(
        1 for line in compiled.as_text().splitlines() if re.match(r"\s+(ROOT )?%?\S+ = ", line)
    )


def measure(name, fn, args, calls):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_time = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    print(
        f"| {name} | {hlo_instructions(compiled):,} | {compile_time:.2f} | "
        f"{1e6 * statistics.median(times):.1f} |",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contacts", type=int, default=1)
    parser.add_argument("--tangents", type=int, default=2, choices=(1, 2))
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    u, k = options.contacts, options.tangents
    size = (1 + k) * u
    matrix = 2.0 * jnp.eye(size) + 0.1
    vector = -jnp.ones(size)
    friction = jnp.full(u, 0.5)
    everywhere = jnp.ones(u, bool)
    sign = jnp.ones(u) if k == 1 else jnp.ones((u, k)) / np.sqrt(k)

    def frictional(matrix, vector):
        return solve_frictional_lcp(matrix, vector, friction, everywhere, everywhere, sign).x

    def frictionless(matrix, vector):
        return solve_lcp(matrix[:u, :u], vector[:u]).x

    print(f"{u} contacts, {k} tangential component(s): {size} unknowns with friction\n")
    print("| function | HLO instructions | compile [s] | call [µs] |")
    print("| --- | ---: | ---: | ---: |")
    for name, fn in (("solve_lcp", frictionless), ("solve_frictional_lcp", frictional)):
        measure(name, fn, (matrix, vector), options.calls)
        gradient = jax.grad(lambda m, v, fn=fn: jnp.sum(fn(m, v)), argnums=(0, 1))
        measure("its gradient", gradient, (matrix, vector), options.calls)


if __name__ == "__main__":
    main()
