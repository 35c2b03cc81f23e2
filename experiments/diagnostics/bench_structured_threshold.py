"""Where the structured derivation of the terms overtakes the dense one (`STRUCTURED_MIN`).

For each model, the same `simulate` (`Baumgarte(20, 100)`, Tsit5, `t ∈ [0, 1]`,
`rtol=1e-8, atol=1e-10`, float64; `bench_scaling.py`'s forward function) compiled twice: with
the terms derived densely (`structured_terms = False`) and from the sparsity patterns
(`structured_terms = True`). Prints the wall time of the solve's compile (trace + lower + XLA)
and the process CPU time per step of one solve and of its gradient (`bench_scaling.py`'s, with
respect to the gains and the initial velocities; medians of `--repeats`, the two variants
interleaved). `jaxdae/_thresholds.py` sets `STRUCTURED_MIN`, the largest number of
coordinates that keeps the dense derivation by default, from these figures.

    python experiments/diagnostics/bench_structured_threshold.py [--repeats 7]
        [chain:4 ladder:2 pendulum:8 ...]

The models are `jaxdae/examples/_scaling.py`'s families at `family:N` (the chain has `2N`
coordinates, the ladder `4N`, the pendulum `N`); the default is every size from 8 to 32
coordinates that the family has in steps of 8, and 10 and 12.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _common  # noqa: E402, F401  (the benchmarks' folder on sys.path)
import jax
import jax.numpy as jnp
from bench_scaling import KD, KP, jaxdae_functions

import jaxdae.examples._scaling as scaling_models

DEFAULT = (
    "chain:4",
    "chain:5",
    "chain:6",
    "chain:8",
    "chain:12",
    "chain:16",
    "ladder:2",
    "ladder:3",
    "ladder:4",
    "ladder:6",
    "ladder:8",
    "pendulum:8",
    "pendulum:10",
    "pendulum:12",
    "pendulum:16",
    "pendulum:24",
    "pendulum:32",
)


def variant(family: str, size: int, structured: bool):
    """`family`'s model of `size` with the terms derived from the patterns or densely."""
    base = scaling_models.FAMILIES[family]
    name = f"{base.__name__}{'Structured' if structured else 'Dense'}"
    return type(name, (base,), {"structured_terms": structured})(size)


def compare(family: str, size: int, repeats: int) -> dict:
    gains = (jnp.asarray(KD), jnp.asarray(KP))
    compiled, row = {}, {}
    for structured in (False, True):
        model = variant(family, size, structured)
        q0, v0 = model.initial_state()
        forward, gradient = jaxdae_functions(model)
        start = time.perf_counter()
        compiled[structured] = jax.jit(forward).trace(gains, q0, v0).lower().compile()
        row[structured] = {
            "compile": time.perf_counter() - start,
            "times": [],
            "gradient times": [],
            "steps": int(compiled[structured](gains, q0, v0)[1]),
        }
        compiled[structured, "gradient"] = jax.jit(gradient).lower(gains, q0, v0).compile()
        jax.block_until_ready(compiled[structured, "gradient"](gains, q0, v0))
    for _ in range(repeats):
        for structured in (False, True):
            for key, fn in (
                ("times", compiled[structured]),
                ("gradient times", compiled[structured, "gradient"]),
            ):
                start = time.process_time()
                jax.block_until_ready(fn(gains, q0, v0))
                row[structured][key].append(time.process_time() - start)
    return {
        "coordinates": int(q0.shape[0]),
        **{
            key: {
                "compile [s]": r["compile"],
                "steps": r["steps"],
                "per step [µs]": 1e6 * statistics.median(r["times"]) / r["steps"],
                "gradient per step [µs]": 1e6 * statistics.median(r["gradient times"]) / r["steps"],
            }
            for key, r in (("dense", row[False]), ("structured", row[True]))
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT, help="family:N")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(
        "| model | coordinates | steps | solve per step, dense / structured [µs] | "
        "gradient per step, dense / structured [µs] | compile, dense / structured [s] |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.models:
        family, _, size = spec.partition(":")
        if family not in scaling_models.FAMILIES or not size.isdigit():
            raise SystemExit(
                f"models are family:N with family in "
                f"{sorted(scaling_models.FAMILIES)}; got {spec!r}"
            )
        r = compare(family, int(size), args.repeats)
        d, s = r["dense"], r["structured"]
        print(
            f"| {spec} | {r['coordinates']} | {d['steps']} | {d['per step [µs]']:.1f} / "
            f"{s['per step [µs]']:.1f} | {d['gradient per step [µs]']:.1f} / "
            f"{s['gradient per step [µs]']:.1f} | {d['compile [s]']:.2f} / "
            f"{s['compile [s]']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
