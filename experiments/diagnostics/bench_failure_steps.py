"""What the failure test of the exact-multiplier formulations costs a solve, read from the
rates of each step's last stage or evaluated after each step as a `diffrax.Event`.

One solve of `bench_sparse.py`'s meshes (`--model family:coordinates`, default a cloth of
about 186 coordinates: `Baumgarte(kd=20, kp=100)` over `t ∈ [0, 1]` from rest, `rtol =
1e-8`, `atol = 1e-10`), jitted, with

- `Tsit5, in the steps`: `diffrax.Tsit5()`, a first-same-as-last solver, whose solve reads
  the test from the last stage of each step (`StopAtFailure` in `_integration/_solve.py`);
- `Tsit5, as an event`: the same solver registered as keeping no last stage
  (`last_stage_in_state`), whose solve evaluates the test after each step as a
  `diffrax.Event`;
- `Dopri8`: not first-same-as-last, so its solve evaluates the test as an event.

Prints per variant the compile time (trace, lowering and XLA, one cold compile), the
optimized program's HLO instructions, the steps and the median of `--calls` solves,
the variants' calls alternating.

    python experiments/diagnostics/bench_failure_steps.py [--model cloth:186] [--calls 7]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_scaling  # noqa: E402
import diffrax  # noqa: E402
import jax  # noqa: E402

import jaxdae  # noqa: E402
from jaxdae._integration._solve import last_stage_in_state  # noqa: E402
from jaxdae.examples._meshes import FAMILIES, family_size  # noqa: E402


class EventTsit5(diffrax.Tsit5):
    """`diffrax.Tsit5`, declared as keeping no last stage."""


last_stage_in_state.register(EventTsit5, lambda solver: None)

VARIANTS = {
    "Tsit5, in the steps": diffrax.Tsit5(),
    "Tsit5, as an event": EventTsit5(),
    "Dopri8": diffrax.Dopri8(),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cloth:186", help="family:coordinates")
    parser.add_argument("--calls", type=int, default=7)
    args = parser.parse_args()
    family, coordinates = args.model.split(":")
    model = FAMILIES[family](family_size(family, int(coordinates)))
    q0, v0 = model.initial_state()
    formulation = jaxdae.Baumgarte(bench_scaling.KD, bench_scaling.KP)
    print(f"{family}, {q0.shape[0]} coordinates, {jax.devices()[0].platform}")

    compiled, rows = {}, {}
    for name, solver in VARIANTS.items():

        def solve(q0, v0, solver=solver):
            return jaxdae.simulate(
                model, formulation, 0.0, 1.0, q0, v0, solver=solver, rtol=1e-8, atol=1e-10
            )

        start = time.perf_counter()
        compiled[name] = jax.jit(solve).lower(q0, v0).compile()
        compile_s = time.perf_counter() - start
        text = compiled[name].as_text()
        instructions = sum(1 for line in text.splitlines() if " = " in line)
        sol = jax.block_until_ready(compiled[name](q0, v0))
        rows[name] = dict(
            compile_s=compile_s,
            instructions=instructions,
            steps=int(sol.stats["num_steps"]),
            times=[],
        )
    for _ in range(args.calls):
        for name, call in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(call(q0, v0))
            rows[name]["times"].append(time.perf_counter() - start)

    print("| variant | compile [s] | HLO instructions | steps | solve [ms] |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        solve_ms = 1e3 * statistics.median(row["times"])
        print(
            f"| {name} | {row['compile_s']:.2f} | {row['instructions']} | {row['steps']} | "
            f"{solve_ms:.1f} |"
        )


if __name__ == "__main__":
    main()
