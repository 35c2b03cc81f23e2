"""Compile time and time per step of one solve of `bench_sparse.py`'s meshes
(`jaxdae.examples._meshes.FAMILIES`), each run in a fresh process, sources alternating:
what a change to the factorizations of wide bands costs or gains.

The solve is `bench_scaling.py`'s `jaxdae_functions` (Baumgarte, the benchmarks' rtol and
atol, the solver named per mesh), compiled ahead of time as `bench_scaling.py` compiles it
(`_compile`: trace, lowering and XLA) and then called `--repeats` times; a run prints its
compile time, the median solve time, the number of steps and the time per step.
`--src DIR` (repeatable) imports jaxdae from `DIR/jaxdae` instead of this checkout (e.g. a
`git worktree` of another commit); the medians of `--rounds` rounds are printed.

    python experiments/diagnostics/bench_mesh_steps.py [--meshes square:22:Tsit5,cloth:18:Dopri8]
        [--rounds 3] [--repeats 5] [--src DIR ...]

A mesh is `family:N:solver` (`N` as `FAMILIES[family](N)`; `square:22` has 964 coordinates,
`cloth:18` 966, `square:10` 196).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MESHES = "square:22:Tsit5,cloth:18:Dopri8,square:10:Tsit5"


def _child(mesh: str, repeats: int) -> dict:
    sys.path.insert(0, str(ROOT / "experiments" / "benchmarks"))
    sys.path.insert(0, str(ROOT / "experiments"))
    import jax
    import jax.numpy as jnp
    from bench_scaling import (  # pyright: ignore
        KD,
        KP,
        SOLVERS,
        _compile,
        _median_time,
        jaxdae_functions,
    )

    import jaxdae
    from jaxdae.examples._meshes import FAMILIES

    family, size, solver = mesh.split(":")
    model = FAMILIES[family](int(size))
    forward = jaxdae_functions(model, solver=SOLVERS[solver])[0]
    q0, v0 = model.initial_state()
    gains = (jnp.asarray(KD), jnp.asarray(KP))
    compiled, compile_times = _compile(forward, gains, q0, v0)
    (_, steps), solve = _median_time(
        lambda: jax.block_until_ready(compiled(gains, q0, v0)), repeats
    )
    compile_s = compile_times["total"]
    return {
        "jaxdae": str(Path(jaxdae.__file__).parent),
        "coordinates": int(q0.shape[0]),
        "compile_s": compile_s,
        "solve_s": solve,
        "steps": int(steps),
        "per_step_ms": 1e3 * solve / int(steps),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", default=DEFAULT_MESHES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--src",
        action="append",
        default=None,
        help="import jaxdae from DIR/jaxdae (repeatable; default: this checkout)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_child(args.child, args.repeats)))
        return
    sources = args.src or [str(ROOT)]
    meshes = args.meshes.split(",")
    runs = {(mesh, src): [] for mesh in meshes for src in sources}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for src in sources:
            for mesh in meshes:
                command = [sys.executable, __file__, "--child", mesh]
                command += ["--repeats", str(args.repeats)]
                done = subprocess.run(
                    command,
                    check=True,
                    capture_output=True,
                    text=True,
                    env=dict(os.environ, PYTHONPATH=src),
                    cwd=ROOT,
                )
                runs[mesh, src].append(json.loads(done.stdout.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
    print(
        f"load average {min(loads):.1f}–{max(loads):.1f}; medians of {args.rounds} rounds of "
        "fresh processes, the sources alternating (each round's figure in brackets)\n"
    )
    print("| mesh | coordinates | jaxdae | steps | compile [s] | per step [ms] |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for mesh in meshes:
        for src in sources:
            rows = runs[mesh, src]
            cells = []
            for key in ("compile_s", "per_step_ms"):
                values = [r[key] for r in rows]
                each = ", ".join(f"{v:.3g}" for v in values)
                cells.append(f"{np.median(values):.3g} ({each})")
            print(
                f"| {mesh} | {rows[0]['coordinates']} | {rows[0]['jaxdae']} | "
                f"{rows[0]['steps']} | " + " | ".join(cells) + " |"
            )


if __name__ == "__main__":
    main()
