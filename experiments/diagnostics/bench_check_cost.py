"""What the traced checks cost a successful solve: the two-link rows of
`experiments/benchmarks/bench_core.py` (forward solve and gradient under `jax.jit`) with the
checks as they are (one conditional holding the host callbacks that write the failure and
raise the error); with the checks computed but that conditional replaced by arithmetic on
the same flags; and with the checks left out of the program (`attach_check` replaced by the
identity: no input checks, no failure check, nothing kept alive for them). `--against DIR`
adds the same rows with the jaxdae and `bench_core.py` of another checkout (for example
`git worktree add /tmp/before REV`), as they are there.

Each variant runs in its own process, the variants alternate (`--rounds` of each), and
every process is pinned to one core where the platform allows it (`--core`), since the
difference is a few percent of a sub-millisecond call. Each process reports the median of
`--calls` calls after a warm-up call; the table gives the median over the rounds and the
ratio of the checked program to the unchecked one.

    python experiments/diagnostics/bench_check_cost.py [--rounds 4] [--calls 500] [--core 1]
        [--against DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = """
import json, statistics, sys, time
sys.path.insert(0, {benchmarks!r})
import jax, jax.numpy as jnp
if {variant!r} == "left out":
    import jaxdae._integration._outcome as reporting
    reporting.attach_check = lambda sol, check: sol
elif {variant!r} == "no callbacks":
    import jaxdae._integration._outcome as reporting
    reporting.raise_reported = lambda x, sol, wrong, error: x + 0 * jnp.any(wrong)
import bench_core
functions = bench_core.jaxdae_functions()
params = bench_core.jaxdae_params()
q0, v0 = (jnp.asarray(x) for x in bench_core.TwoLinkManipulator().initial_state())
medians = {{}}
for name in ("forward", "gradient"):
    call = jax.jit(functions[name])
    jax.block_until_ready(call(params, q0, v0))
    times = []
    for _ in range({calls}):
        start = time.perf_counter()
        jax.block_until_ready(call(params, q0, v0))
        times.append(time.perf_counter() - start)
    medians[name] = statistics.median(times) * 1e3
print(json.dumps(medians))
"""


VARIANTS = ("as they are", "no callbacks", "left out")


def _run(variant: str, calls: int, core: int | None, root: str = ROOT) -> dict[str, float]:
    code = _CHILD.format(
        benchmarks=os.path.join(root, "experiments", "benchmarks"), variant=variant, calls=calls
    )
    command = [sys.executable, "-c", code]
    if core is not None and hasattr(os, "sched_setaffinity"):
        command = ["taskset", "-c", str(core)] + command
    env = {**os.environ, "PYTHONPATH": root}  # that checkout's jaxdae
    out = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--core", type=int, default=1, help="-1: not pinned")
    parser.add_argument("--against", help="another checkout, run as it is")
    args = parser.parse_args()
    core = None if args.core < 0 else args.core
    runs = {variant: [] for variant in VARIANTS}
    if args.against:
        runs["at " + args.against] = []
    for _ in range(args.rounds):
        for variant in VARIANTS:
            runs[variant].append(_run(variant, args.calls, core))
        if args.against:
            root = os.path.abspath(args.against)
            runs["at " + args.against].append(_run(VARIANTS[0], args.calls, core, root))
    columns = list(runs)
    print("| call | " + " | ".join(f"checks {v} (ms)" for v in VARIANTS), end="")
    print("".join(f" | {c} (ms)" for c in columns[len(VARIANTS) :]) + " | ratios to left out |")
    print("| --- |" + " ---: |" * (len(columns) + 1))
    for name in ("forward", "gradient"):
        medians = {c: statistics.median(r[name] for r in runs[c]) for c in columns}
        left_out = medians[VARIANTS[-1]]
        ratios = ", ".join(f"{m / left_out:.3f}" for c, m in medians.items() if c != VARIANTS[-1])
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in medians.values()) + f" | {ratios} |")
    with open("/proc/loadavg") if os.path.exists("/proc/loadavg") else open(os.devnull) as f:
        print("load:", f.read().strip() or "unknown")


if __name__ == "__main__":
    main()
