"""Compile and run time of the gradient of an event-driven solve, by the adjoint that
differentiates its stretches between events: what `EVENT_REPLAY_MAX_STEPS` and
`EVENT_REPLAYED_STEPS` (`jaxdae/_thresholds.py`) choose between.

The problem is `bench_compile.py --model ball`'s: the third impact time of
`jaxdae.examples.BouncingBall` (e = 0.8, dropped from 1 m, 2 s at rtol 1e-10) and its
gradient with respect to `e` and the height. Each case runs in a fresh process and prints
the gradient's compile time (trace, lowering and XLA, `bench_scaling._compile`, first in
the process) and the median times (called through `jax.jit`) of the forward solve, of the
gradient and of `jax.vmap` of the gradient over
`--batch` drops (restitutions 0.6–0.9, heights 0.8–1.2 m). A case is `max_steps:adjoint`,
the adjoint `default` (what `simulate` chooses for that step limit), `replay` (
`jaxdae.ReplayAdjoint(stored_steps=EVENT_REPLAYED_STEPS)`) or `checkpointed`
(`diffrax.RecursiveCheckpointAdjoint(checkpoints=CHECKPOINTS)`); the medians of `--rounds`
rounds, the cases alternating, are printed.

    python experiments/diagnostics/bench_event_adjoints.py [--cases 100000:default,4096:default,
        100000:replay] [--rounds 3] [--repeats 50] [--batch 64]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CASES = "100000:default,4096:default,100000:replay,4096:checkpointed"


def _child(case: str, repeats: int, batch: int) -> dict:
    sys.path.insert(0, str(ROOT / "experiments" / "benchmarks"))
    import diffrax
    import jax
    import jax.numpy as jnp
    from bench_compile import ball_functions  # pyright: ignore
    from bench_scaling import _compile, _median_time  # pyright: ignore

    import jaxdae
    from jaxdae import _thresholds

    jax.config.update("jax_enable_x64", True)
    max_steps, name = case.split(":")
    adjoint = {
        "default": None,
        "replay": jaxdae.ReplayAdjoint(stored_steps=_thresholds.EVENT_REPLAYED_STEPS),
        "checkpointed": diffrax.RecursiveCheckpointAdjoint(checkpoints=_thresholds.CHECKPOINTS),
    }[name]

    functions, one = ball_functions(int(max_steps), adjoint)
    third_impact, gradient = functions["forward"], functions["gradient"]
    many = (jnp.linspace(0.6, 0.9, batch), jnp.linspace(0.8, 1.2, batch))
    _, compile_times = _compile(gradient, *one)
    # Timed through `jax.jit`: the compiled objects of `_compile` are called through JAX's
    # Python path where a program has host callbacks, as these do, which lengthens each call.
    times = {}
    for label, fn, inputs in [
        ("forward", third_impact, one),
        ("gradient", gradient, one),
        ("batch", jax.vmap(gradient), many),
    ]:
        jitted = jax.jit(fn)
        jax.block_until_ready(jitted(*inputs))
        times[label] = _median_time(
            lambda f=jitted, a=inputs: jax.block_until_ready(f(*a)), repeats
        )[1]
    return {"compile": compile_times["total"], **times}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.repeats, args.batch)))
        return
    cases = args.cases.split(",")
    runs = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            command = [sys.executable, __file__, "--child", case]
            command += ["--repeats", str(args.repeats), "--batch", str(args.batch)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[case].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"| case (max_steps:adjoint) | gradient compile [s] | forward [ms] | gradient [ms] "
        f"| vmap of {args.batch} gradients [ms] |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for case in cases:
        median = {key: float(np.median([run[key] for run in runs[case]])) for key in runs[case][0]}
        print(
            f"| {case} | {median['compile']:.2f} | {1e3 * median['forward']:.3f} "
            f"| {1e3 * median['gradient']:.3f} | {1e3 * median['batch']:.1f} |"
        )


if __name__ == "__main__":
    main()
