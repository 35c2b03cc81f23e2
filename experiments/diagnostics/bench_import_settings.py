"""Why importing jaxdae changes two JAX settings (`jaxdae/_compilation/_xla_flags.py`): the
two-link benchmark problem with each of them left alone.

Paper 004's `ModifiedLagrange(10, [20, 10], [100, 25])` on `TwoLinkManipulator` over
`t ∈ [0, 2]`, `rtol = 1e-8`, `atol = 1e-10` (as `experiments/bench_core.py`): the
jitted forward solve (`q(2)`) and the gradient of `Σ q(2)² + |Φ(2)|²` with respect to the
gains. Each configuration runs in its own process (both settings are read when a process
imports jaxdae): as imported, with `JAXDAE_SET_XLA_FLAGS=0` (no XLA loop option) and with
`JAXDAE_ENABLE_X64=0` (JAX's float32 default: the paper's state and gains become float32
arrays). Reported: the first call of each (trace and compile included), the median of
`--calls` calls after it, the number of steps and the distance of `q(2)` from the float64
result.

    PYTHONPATH=. .venv/bin/python experiments/diagnostics/bench_import_settings.py   # ≈ 2 min
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGURATIONS = {
    "as imported": {},
    "JAXDAE_SET_XLA_FLAGS=0": {"JAXDAE_SET_XLA_FLAGS": "0"},
    "JAXDAE_ENABLE_X64=0": {"JAXDAE_ENABLE_X64": "0"},
}


def measure(calls: int) -> dict:
    """Times, steps and `q(2)` in this process."""
    import jax
    import jax.numpy as jnp

    import jaxdae
    from jaxdae.examples import TwoLinkManipulator

    system = TwoLinkManipulator()
    q0, v0 = (jnp.asarray(x) for x in system.initial_state())
    gains = (jnp.asarray(10.0), jnp.asarray([20.0, 10.0]), jnp.asarray([100.0, 25.0]))

    def solve(gains):
        return jaxdae.simulate(system, jaxdae.ModifiedLagrange(*gains), 0.0, 2.0, q0, v0,
                               rtol=1e-8, atol=1e-10)

    def loss(gains):
        sol = solve(gains)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    functions = {"forward": jax.jit(lambda g: solve(g).q_final),
                 "gradient": jax.jit(jax.grad(loss))}
    result = {"dtype": str(q0.dtype), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    for name, fn in functions.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(gains))
        result[f"{name} first call s"] = time.perf_counter() - start
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            jax.block_until_ready(fn(gains))
            times.append(time.perf_counter() - start)
        result[f"{name} ms"] = 1e3 * statistics.median(times)
    sol = jax.jit(solve)(gains)
    result["steps"] = int(sol.stats["num_steps"])
    result["q(2)"] = [float(x) for x in sol.q_final]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="timed calls after the first")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.calls)))
        return
    runs = {}
    for label, variables in CONFIGURATIONS.items():
        env = {k: v for k, v in os.environ.items()
               if k not in ("XLA_FLAGS", "JAXDAE_SET_XLA_FLAGS", "JAXDAE_ENABLE_X64",
                            "JAX_ENABLE_X64")} | variables
        out = subprocess.run([sys.executable, __file__, "--measure", "--calls", str(args.calls)],
                             env=env, check=True, capture_output=True, text=True).stdout
        runs[label] = json.loads(out.strip().splitlines()[-1])
    reference = runs["as imported"]["q(2)"]
    print(f"two-link, rtol=1e-8; median of {args.calls} calls after the first\n")
    print("| configuration | dtype | steps | forward ms | gradient ms | first forward s "
          "| first gradient s | max abs q(2) difference |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, run in runs.items():
        difference = max(abs(a - b) for a, b in zip(run["q(2)"], reference))
        print(f"| {label} | {run['dtype']} | {run['steps']} | {run['forward ms']:.3f} | "
              f"{run['gradient ms']:.3f} | {run['forward first call s']:.1f} | "
              f"{run['gradient first call s']:.1f} | {difference:.1e} |")


if __name__ == "__main__":
    main()
