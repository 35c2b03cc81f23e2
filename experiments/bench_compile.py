"""Benchmark: where the compile time of `simulate` and its gradients goes (issue 2, item 9).

The three jaxdae functions of `bench_core.py` (the two-link forward solve, the gradient with
the default adjoint and with `ReverseSweepAdjoint`), each traced, lowered and compiled from
cold caches `--repeats` times. Prints per phase the minimum and median wall time, the
process CPU time of the XLA compile (all its threads; steadier than wall time on this
machine's virtual cores), and the size of the compiled program: StableHLO operations
before and HLO instructions after XLA's optimizations, conditionals (each traced check is
one) and host callbacks.

To compare two commits, run it alternately from each checkout (the figures move by 20–30%
between minutes on a 2-core virtual machine; alternate and compare medians):

    git worktree add /tmp/before <commit>
    for i in 1 2 3; do
      (cd /tmp/before && PYTHONPATH=$PWD <venv>/python experiments/bench_compile.py)
      PYTHONPATH=$PWD <venv>/python experiments/bench_compile.py
    done

    python experiments/bench_compile.py [--repeats 3] [--only forward]
"""

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_core  # noqa: E402
from jaxdae.examples import TwoLinkManipulator  # noqa: E402

FUNCTIONS = ("forward", "gradient", "gradient, reverse sweep")


def program_size(lowered, compiled) -> dict:
    """Operations of the lowered module, instructions of the optimized one, and its
    conditionals and custom calls (host callbacks)."""
    optimized = compiled.as_text()
    instruction = re.compile(r"\s+(ROOT )?%?\S+ = ")
    return {
        "stablehlo ops": sum(1 for line in lowered.as_text().splitlines()
                             if re.match(r"\s+%\S+ = ", line)),
        "HLO instructions": sum(1 for line in optimized.splitlines()
                                if instruction.match(line)),
        "conditionals": optimized.count(" conditional("),
        "custom calls": optimized.count(" custom-call("),
    }


def measure(fn, args, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        jax.clear_caches()
        start = time.perf_counter()
        traced = jax.jit(fn).trace(*args)
        traced_at = time.perf_counter()
        lowered = traced.lower()
        lowered_at = time.perf_counter()
        cpu = time.process_time()
        compiled = lowered.compile()
        runs.append((traced_at - start, lowered_at - traced_at,
                     time.perf_counter() - lowered_at, time.process_time() - cpu,
                     time.perf_counter() - start))
    runs = np.asarray(runs)
    return {"min": runs.min(axis=0), "median": np.median(runs, axis=0),
            **program_size(lowered, compiled)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=FUNCTIONS, action="append")
    options = parser.parse_args()
    bench_core.warm_up_jax()
    functions = bench_core.jaxdae_functions()
    q0, v0 = (jnp.asarray(x) for x in TwoLinkManipulator().initial_state())
    args = (bench_core.jaxdae_params(), q0, v0)
    print("| function | | trace [s] | lower [s] | XLA compile [s] | XLA compile, CPU [s] | "
          "total [s] | StableHLO ops | HLO instructions | conditionals | custom calls |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in options.only or FUNCTIONS:
        m = measure(functions[name], args, options.repeats)
        for stat in ("min", "median"):
            times = " | ".join(f"{x:.2f}" for x in m[stat])
            size = (f"{m['stablehlo ops']} | {m['HLO instructions']} | {m['conditionals']} | "
                    f"{m['custom calls']}") if stat == "min" else "| | |"
            print(f"| {name} | {stat} | {times} | {size} |", flush=True)


if __name__ == "__main__":
    main()
