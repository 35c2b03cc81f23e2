"""XLA:CPU options against compile time and run time: what `_xla_flags.py` chooses.

Runs, each in its own Python process (XLA reads `XLA_FLAGS` once) and alternating for
`--runs` rounds, the same measurements with jaxdae's settings as imported and with each
`--flags` given (default: `--xla_cpu_use_fusion_emitters=true`, XLA's own default, which
jaxdae changes). Per function: the wall time of the trace and lowering, the process CPU time
of the XLA compile, and the median process CPU time of a call of the compiled program. The
functions: `bench_core.py`'s two-link solve, its gradient and a `vmap` batch of 1024
trajectories; `bench_scaling.py`'s solve and gradient of the chain of 64 point masses (128
coordinates) and of the ladder of 128 four-bars (512 coordinates).

    python experiments/diagnostics/bench_xla_compile_options.py [--runs 3]
        [--flags "--xla_cpu_use_fusion_emitters=true" ...]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXPERIMENTS = Path(__file__).parent.parent
CASES = ("two-link/forward", "two-link/gradient", "two-link/batch of 1024", "chain:64/forward",
         "chain:64/gradient", "ladder:128/forward", "ladder:128/gradient")


def measure() -> dict:
    """The measurements of this process (run by `main` in a new process per setting)."""
    sys.path.insert(0, str(EXPERIMENTS))
    import bench_compile
    import bench_core
    import jax
    import jax.numpy as jnp
    import numpy as np

    bench_core.warm_up_jax()
    out = {}

    def one(key, fn, args, calls):
        jax.clear_caches()
        start = time.perf_counter()
        lowered = jax.jit(fn).trace(*args).lower()
        lowered_at = time.perf_counter()
        cpu = time.process_time()
        compiled = lowered.compile()
        compile_cpu = time.process_time() - cpu
        jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(calls):
            cpu = time.process_time()
            jax.block_until_ready(compiled(*args))
            times.append(time.process_time() - cpu)
        out[key] = {"trace and lower [s]": lowered_at - start, "XLA compile, CPU [s]": compile_cpu,
                    "call, CPU [ms]": 1e3 * statistics.median(times)}

    functions, args = bench_compile.model_functions("two-link")
    params, q0, v0 = args
    one("two-link/forward", functions["forward"], args, 15)
    one("two-link/gradient", functions["gradient"], args, 15)
    rng = np.random.default_rng(0)
    qb = jnp.asarray(np.asarray(q0) + 1e-2 * rng.standard_normal((1024, q0.shape[0])))
    vb = jnp.broadcast_to(v0, (1024, v0.shape[0]))
    one("two-link/batch of 1024", bench_core.jaxdae_functions()["batch"], (params, qb, vb), 5)
    for model in ("chain:64", "ladder:128"):
        functions, args = bench_compile.model_functions(model)
        for name in ("forward", "gradient"):
            one(f"{model}/{name}", functions[name], args, 5)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flags", action="append",
                        help="an XLA_FLAGS value to compare with jaxdae's settings")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    settings = ["", *(args.flags or ["--xla_cpu_use_fusion_emitters=true"])]
    results = {s: [] for s in settings}
    env = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    for _ in range(args.runs):
        for flags in settings:
            run = subprocess.run([sys.executable, __file__, "--measure"],
                                 env=dict(env, XLA_FLAGS=flags), capture_output=True, text=True)
            if run.returncode:
                raise SystemExit(run.stderr)
            results[flags].append(json.loads(run.stdout.splitlines()[-1]))
            print(f"XLA_FLAGS={flags!r}: done", file=sys.stderr, flush=True)
    print("| function | XLA_FLAGS | trace and lower [s] | XLA compile, CPU [s] | call, CPU [ms] |")
    print("| --- | --- | ---: | ---: | ---: |")
    for case in CASES:
        for flags in settings:
            cells = []
            for key in ("trace and lower [s]", "XLA compile, CPU [s]", "call, CPU [ms]"):
                values = [r[case][key] for r in results[flags]]
                cells.append(f"{min(values):.3g}–{max(values):.3g}")
            label = f"`{flags}`" if flags else "as imported"
            print(f"| {case} | {label} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
