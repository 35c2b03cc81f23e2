"""The two paths of a `TreeMechanism`'s right-hand side, dense and recursive: µs per right-hand side
of chains of 8 to 64 links and of the humanoid, each path in its own process.

The dense path sums along the tree's paths by products with its ancestor matrix and factors the
composite-rigid-body `M` by Cholesky; the recursive one sums along paths and solves with
the articulated-body factor, one level of bodies per step of a loop. `ARTICULATED_MIN_BODIES`
(`jaxdae/_thresholds.py`) chooses between them; this script forces each in turn (the threshold
patched to 1 or to a number larger than any tree) and reports, per model, the CPU and wall time
per right-hand side (`Unstabilized`, `state_rates` as `simulate` evaluates it, in a compiled
loop of 1,000) and the CPU seconds to compile the right-hand side alone. `--rounds` alternates
the two paths' processes that many times and reports the medians.

    python experiments/diagnostics/bench_tree_paths.py [--rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HUMANOID = ROOT / "tests" / "data" / "humanoid.urdf"
MODELS = ("8", "16", "32", "64", "humanoid")
PATHS = {"dense": 10**9, "recursive": 1}


def _child(threshold: int) -> dict:
    """This process's measurements with `ARTICULATED_MIN_BODIES = threshold`."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    sys.path[:0] = [str(ROOT / "experiments"), str(ROOT / "experiments" / "benchmarks")]
    import bench_robots as br

    import jaxdae
    import jaxdae.multibody as mb
    from jaxdae import _thresholds
    from jaxdae._compilation._scalarize import scalarize
    from jaxdae._integration._vector_fields import state_rates

    _thresholds.ARTICULATED_MIN_BODIES = threshold
    folder = Path(tempfile.mkdtemp())
    out = {}
    for name in MODELS:
        path = HUMANOID if name == "humanoid" else folder / f"chain{name}.urdf"
        if name != "humanoid":
            path.write_text(br.chain_urdf(int(name)))
        tree = mb.load_urdf(path).mechanism(forces=[mb.Gravity(br.GRAVITY)], limits=False)
        n = tree.topology.num_coordinates
        q, v = jnp.full(n, 0.1), jnp.asarray(br.initial_rates(n))
        alone = jax.jit(lambda q, v, tree=tree: state_rates(tree, jaxdae.Unstabilized(), 0.3, q, v))
        began = time.process_time()
        alone.lower(q, v).compile()
        compile_s = time.process_time() - began
        loop = 1000
        rates = scalarize(state_rates)

        def rhs(y, tree=tree, rates=rates, n=n):
            return jnp.concatenate(rates(tree, jaxdae.Unstabilized(), 0.3, y[:n], y[n:]))

        run = jax.jit(
            lambda y, rhs=rhs, loop=loop: jax.lax.fori_loop(
                0, loop, lambda i, y: y + 1e-9 * rhs(y), y
            )
        )
        y = jnp.concatenate([q, v])
        jax.block_until_ready(run(y))
        wall, cpu = br._median_times(lambda run=run, y=y: run(y), 5)
        out[name] = {
            "cpu_us": 1e6 * cpu / loop,
            "wall_us": 1e6 * wall / loop,
            "compile_cpu_s": compile_s,
        }
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_child(args.child)))
        return
    runs: dict[str, list[dict]] = {path: [] for path in PATHS}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for path, threshold in PATHS.items():
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(threshold)],
                check=True,
                capture_output=True,
                text=True,
            )
            runs[path].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"load average at the start {load:.1f}; medians of {args.rounds} alternating "
        "processes per path\n"
    )
    print(
        "| model | dense CPU µs | recursive CPU µs | ratio | dense wall µs | recursive wall µs "
        "| dense compile s | recursive compile s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in MODELS:
        med = {
            path: {
                key: float(np.median([r[name][key] for r in runs[path]]))
                for key in ("cpu_us", "wall_us", "compile_cpu_s")
            }
            for path in PATHS
        }
        d, r = med["dense"], med["recursive"]
        label = name if name == "humanoid" else f"chain of {name}"
        print(
            f"| {label} | {d['cpu_us']:.2f} | {r['cpu_us']:.2f} | {r['cpu_us'] / d['cpu_us']:.2f} "
            f"| {d['wall_us']:.2f} | {r['wall_us']:.2f} | {d['compile_cpu_s']:.2f} "
            f"| {r['compile_cpu_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
