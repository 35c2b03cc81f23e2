"""Where the compile time of the humanoid's solve goes: trace and lowering, XLA's compilation
and the first call, and the compiled program's size, each measurement in a fresh process.

The solve is `bench_robots.py`'s (`jaxdae_rows`, `--only humanoid`): `tests/data/humanoid.urdf`
read by `load_urdf(...).mechanism()` (the joint-coordinate `TreeMechanism`, gravity, no
limits), `Unstabilized`, Tsit5 with `PIDController(rtol=atol=1e-7)` (the tolerance traced),
`eqx.filter_jit` around `jaxdae.simulate` returning `q_final` and the step count, over 1 s
from zero coordinates with 0.5 rad/s on joints 0, 2, 4, ...

Per round and per source tree, two processes: one splits the first call with
`solve.lower(...)` (trace and lowering), `.compile()` (XLA) and the call of the compiled
program, with wall and process CPU times and the optimized program's HLO instructions, fused
kernels and while loops; the other times the first call of the jitted solve as a user meets
it (`"total"`). JAX starts with two CPU devices, as in `bench_robots.py`. `--src DIR` (repeatable)
imports jaxdae from `DIR/jaxdae` instead of this checkout, so that two commits alternate
(e.g. `git archive <commit> jaxdae | tar -x -C /tmp/before`); the medians of `--rounds`
rounds are printed. `--constant-checks` gives the checks of the initial state constants for
its mass matrix and forces, so that the program no longer evaluates the tree's equations at
the initial state: what that copy costs.

    python experiments/diagnostics/bench_humanoid_compile.py [--rounds 3] [--src DIR ...]
        [--constant-checks]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HUMANOID = ROOT / "tests" / "data" / "humanoid.urdf"
KEYS = ("trace_lower_s", "trace_lower_cpu_s", "xla_s", "xla_cpu_s", "call_s", "total_s",
        "total_cpu_s", "hlo_instructions", "fusions", "while_loops")


def _child(mode: str, constant_checks: bool = False) -> dict:
    """This process's measurements: `"split"` or `"total"` (see the module's docstring)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=2").strip()
    import diffrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import jaxdae
    import jaxdae.multibody as mb

    if constant_checks:
        from jaxdae._integration import _reporting

        checked = _reporting.initial_state_problems

        def constant_inputs(system, formulation, state, terms, *args, **kwargs):
            mass, _, _ = terms
            return checked(system, formulation, state, (mass, jnp.array(True), jnp.zeros(1)),
                           *args, **kwargs)

        _reporting.initial_state_problems = constant_inputs

    model = mb.load_urdf(HUMANOID).mechanism(forces=[mb.Gravity((0.0, 0.0, -9.81))],
                                             limits=False)
    n = model.topology.num_coordinates
    q0 = jnp.zeros(n)
    v0 = jnp.asarray([0.5 if i % 2 == 0 else 0.0 for i in range(n)])
    args = (model, diffrax.Tsit5(), jnp.asarray(1e-7), q0, v0)

    @eqx.filter_jit
    def solve(model, solver, tolerance, q0, v0):
        controller = diffrax.PIDController(rtol=tolerance, atol=tolerance)
        sol = jaxdae.simulate(model, jaxdae.Unstabilized(), 0.0, 1.0, q0, v0, solver=solver,
                              stepsize_controller=controller)
        return sol.q_final, sol.stats["num_steps"]

    out = {"jaxdae": str(Path(jaxdae.__file__).parent)}
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "total":
        jax.block_until_ready(solve(*args))
        out.update(total_s=time.perf_counter() - wall, total_cpu_s=time.process_time() - cpu)
        return out
    lowered = solve.lower(*args)
    wall_lowered, cpu_lowered = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    wall_compiled, cpu_compiled = time.perf_counter(), time.process_time()
    jax.block_until_ready(compiled(*args))
    text = compiled.compiled.as_text()
    out.update(
        trace_lower_s=wall_lowered - wall, trace_lower_cpu_s=cpu_lowered - cpu,
        xla_s=wall_compiled - wall_lowered, xla_cpu_s=cpu_compiled - cpu_lowered,
        call_s=time.perf_counter() - wall_compiled,
        hlo_instructions=sum(1 for line in text.splitlines()
                             if re.match(r"\s+(ROOT )?%?\S+ = ", line)),
        fusions=text.count(" fusion("), while_loops=text.count(" while("))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--src", action="append", default=None,
                        help="import jaxdae from DIR/jaxdae (repeatable; default: this checkout)")
    parser.add_argument("--constant-checks", action="store_true",
                        help="constants for the initial state's mass and force checks")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_child(args.child, args.constant_checks)))
        return
    sources = args.src or [str(ROOT)]
    runs: dict[str, list[dict]] = {src: [] for src in sources}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for src in sources:
            row = {}
            for mode in ("split", "total"):
                env = dict(os.environ, PYTHONPATH=src)
                command = [sys.executable, __file__, "--child", mode]
                if args.constant_checks:
                    command.append("--constant-checks")
                done = subprocess.run(command, check=True, capture_output=True, text=True,
                                      env=env, cwd=ROOT)
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
            runs[src].append(row)
            loads.append(os.getloadavg()[0])
    print(f"load average {min(loads):.1f}–{max(loads):.1f}; medians of {args.rounds} rounds "
          "of fresh processes, the sources alternating (each round's figure in brackets)\n")
    print("| quantity | " + " | ".join(runs[src][0]["jaxdae"] for src in sources) + " |")
    print("| --- |" + " ---: |" * len(sources))
    for key in KEYS:
        cells = []
        for src in sources:
            values = [r[key] for r in runs[src]]
            each = ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in values)
            middle = np.median(values)
            cells.append(f"{middle:.3g} ({each})" if isinstance(values[0], float)
                         else f"{middle:.0f} ({each})")
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
