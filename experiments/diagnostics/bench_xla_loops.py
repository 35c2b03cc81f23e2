"""Why jaxdae raises XLA's small-while-loop limit (`jaxdae/_compilation/_xla_flags.py`): loop cost
per iteration with and without it.

A `jax.lax.fori_loop` of 672 iterations whose body evaluates the two-link right-hand side
(`ModifiedLagrange(10, [20, 10], [100, 25])`, jaxdae's scalarized rates, `SystemTerm.vf`) at `k`
different states, `k = 1, 2, 4, 6` (a Tsit5 step evaluates it 6 times), or its
vector–Jacobian product once. Each configuration runs in its own process, once with the
option jaxdae sets on import and once with `JAXDAE_SET_XLA_FLAGS=0` (XLA reads its flags
when a process starts its backend). Reported: µs per iteration, minimum over 20 calls.

Without the option XLA runs every fused kernel of the loop body as a separate "thunk" with a
fixed cost per iteration, unless the loop accesses fewer than 1 kB: the cost jumps as the
body grows. With it, each loop is compiled into one kernel.

    PYTHONPATH=. .venv/bin/python experiments/diagnostics/bench_xla_loops.py    # ≈ 1 min
"""

import json
import os
import subprocess
import sys
import time

ITERATIONS = 672
BODIES = ("rhs ×1", "rhs ×2", "rhs ×4", "rhs ×6", "vjp ×1")


def measure() -> dict:
    """Per-iteration times in this process (µs)."""
    import jax
    import jax.numpy as jnp

    import jaxdae
    from jaxdae._integration._term import SystemTerm
    from jaxdae.examples import TwoLinkManipulator

    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    states = jnp.concatenate([q0, v0]) + 1e-3 * jax.random.normal(
        jax.random.PRNGKey(0), (ITERATIONS, 4)
    )
    times = jnp.linspace(0.0, 2.0, ITERATIONS)
    params = (jnp.asarray(10.0), jnp.asarray([20.0, 10.0]), jnp.asarray([100.0, 25.0]))

    def rates(t, y, params):
        term = SystemTerm(system, jaxdae.ModifiedLagrange(*params))
        return jnp.concatenate(term.vf(t, (y[:2], y[2:]), None))

    def loop(k):
        def body(i, total):
            for j in range(k):
                total = total + rates(times[i] + 0.01 * j, states[i] + 1e-3 * j, params)
            return total

        return lambda: jax.lax.fori_loop(0, ITERATIONS, body, jnp.zeros(4))

    def vjp_loop():
        def body(i, total):
            _, pull = jax.vjp(lambda y, p: rates(times[i], y, p), states[i], params)
            return total + pull(states[i])[0]

        return jax.lax.fori_loop(0, ITERATIONS, body, jnp.zeros(4))

    functions = dict(zip(BODIES, [loop(1), loop(2), loop(4), loop(6), vjp_loop], strict=False))
    result = {}
    for name, fn in functions.items():
        compiled = jax.jit(fn).lower().compile()
        jax.block_until_ready(compiled())
        best = min(_timed(compiled) for _ in range(20))
        result[name] = best / ITERATIONS * 1e6
    return result


def _timed(fn) -> float:
    start = time.perf_counter()
    fn().block_until_ready()
    return time.perf_counter() - start


def main():
    runs = {}
    for label, opt_out in (("with the option", "1"), ("JAXDAE_SET_XLA_FLAGS=0", "0")):
        env = dict(os.environ, JAXDAE_SET_XLA_FLAGS=opt_out)
        env.pop("XLA_FLAGS", None)
        out = subprocess.run(
            [sys.executable, __file__, "--measure"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        runs[label] = json.loads(out.strip().splitlines()[-1])
    labels = list(runs)
    print(f"fori_loop of {ITERATIONS} iterations; µs per iteration, minimum of 20 calls\n")
    print("| loop body | " + " | ".join(labels) + " | ratio |")
    print("| --- |" + " ---: |" * (len(labels) + 1))
    for body in BODIES:
        a, b = (runs[label][body] for label in labels)
        print(f"| {body} | {a:.3f} | {b:.3f} | {b / a:.1f}× |")


if __name__ == "__main__":
    if "--measure" in sys.argv:
        print(json.dumps(measure()))
    else:
        main()
