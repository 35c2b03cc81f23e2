"""Why importing jaxdae changes two JAX settings (`jaxdae/_compilation/_xla_flags.py`): the
two-link benchmark problem with each of them left alone.

Mukharlyamov and Deressa's (2015) `ModifiedLagrange(10, [20, 10], [100, 25])` on
`TwoLinkManipulator` over `t ∈ [0, 2]`, `rtol = 1e-8`, `atol = 1e-10` (as
`experiments/benchmarks/bench_core.py`): the jitted forward solve (`q(2)`) and the gradient of
`Σ q(2)² + |Φ(2)|²` with respect to the gains. Each configuration runs in its own process (both
settings are read when a process imports jaxdae): as imported, with `JAXDAE_SET_XLA_FLAGS=0` (no XLA
loop option) and with `JAXDAE_ENABLE_X64=0` (JAX's float32 default: the paper's state and gains
become float32 arrays). Reported: the first call of each (trace and compile included), the median of
`--calls` calls after it, the number of steps and the distance of `q(2)` from the float64
result.

    PYTHONPATH=. .venv/bin/python experiments/diagnostics/bench_import_settings.py   # ≈ 2 min

`--model governor`: the flyball governor of `experiments/examples/flyball_governor.py` (4 rigid
bodies, 28 coordinates, `Baumgarte(20, 100)`) as imported and with XLA's library fusions
left on (`JAXDAE_SET_XLA_FLAGS=0` with the small-loop option set by hand): CPU time per
evaluation of the right-hand side in a loop of 2,000 (trip count unknown to XLA) and per
Tsit5 step over [0, 0.05] s (rtol 1e-6, atol 1e-9), medians of `--calls` calls (default
7 here), and the first calls (≈ 1 min).
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


GOVERNOR_CONFIGURATIONS = {
    "as imported": {},
    "XLA's library fusions on": {
        "JAXDAE_SET_XLA_FLAGS": "0",
        "XLA_FLAGS": "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold="
        "1000000000",
    },
}
GOVERNOR_LOOP = 2000


def measure_governor(calls: int) -> dict:
    """CPU times of the governor's right-hand side in a loop and of a Tsit5 step, in this
    process."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # experiments/: _common
    import _common  # noqa: F401  (the examples' folder on sys.path: flyball_governor)
    import diffrax
    import jax

    import jaxdae
    from jaxdae._integration._vector_fields import jitted_rates
    from jaxdae.examples import _flyball_governor as flyball_governor

    model = flyball_governor.governor()
    q0, v0 = flyball_governor.initial_state(model)
    formulation = jaxdae.Baumgarte(20.0, 100.0)

    @jax.jit
    def loop(q, v, count):
        def body(_, y):
            dq, dv = jitted_rates(model, formulation, 0.0, *y)
            return y[0] + 1e-9 * dq, y[1] + 1e-9 * dv

        return jax.lax.fori_loop(0, count, body, (q, v))

    @jax.jit
    def solve(q, v):
        return jaxdae.simulate(
            model,
            formulation,
            0.0,
            0.05,
            q,
            v,
            solver=diffrax.Tsit5(),
            rtol=1e-6,
            atol=1e-9,
            throw=False,
        )

    functions = {
        "right-hand side": (lambda: loop(q0, v0, GOVERNOR_LOOP), GOVERNOR_LOOP),
        "Tsit5 step": (lambda: solve(q0, v0), None),
    }
    result = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    for name, (fn, count) in functions.items():
        start = time.process_time()
        out = jax.block_until_ready(fn())
        result[f"{name} first call s"] = time.process_time() - start
        count = count or int(out.stats["num_steps"])
        times = []
        for _ in range(calls):
            start = time.process_time()
            jax.block_until_ready(fn())
            times.append(time.process_time() - start)
        result[f"{name} us"] = 1e6 * statistics.median(times) / count
    return result


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
        return jaxdae.simulate(
            system, jaxdae.ModifiedLagrange(*gains), 0.0, 2.0, q0, v0, rtol=1e-8, atol=1e-10
        )

    def loss(gains):
        sol = solve(gains)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    functions = {
        "forward": jax.jit(lambda g: solve(g).q_final),
        "gradient": jax.jit(jax.grad(loss)),
    }
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
    parser.add_argument(
        "--calls",
        type=int,
        default=None,
        help="timed calls after the first (default 200; the governor: 7)",
    )
    parser.add_argument("--model", choices=("two-link", "governor"), default="two-link")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    governor = args.model == "governor"
    calls = args.calls or (7 if governor else 200)
    if args.measure:
        print(json.dumps(measure_governor(calls) if governor else measure(calls)))
        return
    runs = {}
    for label, variables in (GOVERNOR_CONFIGURATIONS if governor else CONFIGURATIONS).items():
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("XLA_FLAGS", "JAXDAE_SET_XLA_FLAGS", "JAXDAE_ENABLE_X64", "JAX_ENABLE_X64")
        } | variables
        out = subprocess.run(
            [sys.executable, __file__, "--measure", "--calls", str(calls), "--model", args.model],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        runs[label] = json.loads(out.strip().splitlines()[-1])
    if governor:
        print(f"flyball governor; CPU time, median of {calls} calls after the first\n")
        print(
            "| configuration | right-hand side µs | Tsit5 step µs | first loop s | first solve s |"
        )
        print("| --- | ---: | ---: | ---: | ---: |")
        for label, run in runs.items():
            print(
                f"| {label} | {run['right-hand side us']:.1f} | {run['Tsit5 step us']:.0f} "
                f"| {run['right-hand side first call s']:.1f} "
                f"| {run['Tsit5 step first call s']:.1f} |"
            )
        return
    reference = runs["as imported"]["q(2)"]
    print(f"two-link, rtol=1e-8; median of {calls} calls after the first\n")
    print(
        "| configuration | dtype | steps | forward ms | gradient ms | first forward s "
        "| first gradient s | max abs q(2) difference |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, run in runs.items():
        difference = max(abs(a - b) for a, b in zip(run["q(2)"], reference, strict=False))
        print(
            f"| {label} | {run['dtype']} | {run['steps']} | {run['forward ms']:.3f} | "
            f"{run['gradient ms']:.3f} | {run['forward first call s']:.1f} | "
            f"{run['gradient first call s']:.1f} | {difference:.1e} |"
        )


if __name__ == "__main__":
    main()
