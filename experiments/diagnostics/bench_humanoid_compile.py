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
rounds are printed.

`--in-process N` instead lowers and compiles the solve `N` times in one process per source
(JAX's caches cleared before each) and prints the least and the median CPU time of tracing
and lowering and of XLA's compilation: steadier than fresh processes on a machine that other
jobs share.

Variants of the program, to show what a part of it costs. The first two act on the checks
of the initial state's mass matrix and forces, which a traced solve of a tree on the
recursive path no longer makes (its forces are nan where its articulated pivots show `M`
not positive definite, so that such a start stalls the solve); on such sources they leave
the program as it is, and they measure the sources that made them (`--src`).

- `--constant-checks` gives the checks of the initial state constants for its mass matrix
  and forces, so that the program no longer evaluates the tree's equations at the initial
  state: what that copy costs.
- `--checks-in-branch` evaluates the two checks' inputs (whether the articulated pivots are
  positive and the forces finite) in a `lax.cond` taken only where the solve failed: what a
  check made only after a failed solve would cost XLA.
- `--plain-loop` runs diffrax's loops as plain `lax.while_loop`s instead of checkpointed
  ones (which trace the step three times): what tracing would save where the solve's
  forward pass is not differentiated.

`--rhs` instead times one right-hand side of the humanoid and of the arm
(`tests/data/three_link_arm.urdf`) as `bench_robots.py`'s `jaxdae_rhs_us` does (a compiled
loop of 2,000, from zero coordinates and the start's rates), 15 repeats, and prints the
medians of the rounds in µs of wall and of process CPU time (the steadier on a shared
machine), one fresh process per round and source.

    python experiments/diagnostics/bench_humanoid_compile.py [--rounds 3] [--src DIR ...]
        [--in-process N] [--constant-checks] [--checks-in-branch] [--plain-loop] [--rhs]
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
KEYS = (
    "trace_lower_s",
    "trace_lower_cpu_s",
    "xla_s",
    "xla_cpu_s",
    "call_s",
    "total_s",
    "total_cpu_s",
    "hlo_instructions",
    "fusions",
    "while_loops",
)
REPEAT_KEYS = (
    "trace_lower_cpu_min_s",
    "trace_lower_cpu_median_s",
    "xla_cpu_min_s",
    "xla_cpu_median_s",
    "hlo_instructions",
)
RHS_KEYS = ("humanoid_rhs_us", "humanoid_rhs_cpu_us", "arm_rhs_us", "arm_rhs_cpu_us")
ARM = ROOT / "tests" / "data" / "three_link_arm.urdf"
VARIANTS = ("constant_checks", "checks_in_branch", "plain_loop")


def _instructions(text: str) -> int:
    return sum(1 for line in text.splitlines() if re.match(r"\s+(ROOT )?%?\S+ = ", line))


def _apply_variants(variants) -> None:
    """Replaces the parts of jaxdae or diffrax that `variants` name (see the docstring)."""
    import functools

    import jax
    import jax.numpy as jnp

    if "constant_checks" in variants:
        from jaxdae._integration import _outcome

        checked = _outcome.initial_state_problems

        def constant_inputs(system, formulation, state, terms, *args, **kwargs):
            if terms is None:  # not checked: nothing to replace
                return checked(system, formulation, state, terms, *args, **kwargs)
            mass, _, _ = terms
            return checked(
                system, formulation, state, (mass, jnp.array(True), jnp.zeros(1)), *args, **kwargs
            )

        _outcome.initial_state_problems = constant_inputs
    if "checks_in_branch" in variants:
        from jaxdae._integration import _outcome
        from jaxdae._integration._validation import factored_positive_definite
        from jaxdae._integration._vector_fields import system_terms
        from jaxdae._solution import RESULTS

        check_traced = _outcome.check_traced

        def in_branch(
            sol, system, formulation, times, initial, checks, trajectories, steps=(None, None)
        ):
            q0, v0, mass, _, _ = initial

            def evaluate():
                terms = system_terms(system, times.t0, q0, v0)
                return factored_positive_definite(terms), jnp.all(jnp.isfinite(terms.forces))

            definite, finite = jax.lax.cond(
                sol.result != RESULTS.successful,
                evaluate,
                lambda: (jnp.array(True), jnp.array(True)),
            )
            forces = jnp.where(finite, 0.0, jnp.nan)[None]
            return check_traced(
                sol,
                system,
                formulation,
                times,
                (q0, v0, mass, definite, forces),
                checks,
                trajectories,
                steps,
            )

        _outcome.check_traced = in_branch
    if "plain_loop" in variants:
        import diffrax._adjoint as adjoint

        def plain_loop(
            self,
            *,
            terms,
            saveat,
            init_state,
            max_steps,
            throw,
            passed_solver_state,
            passed_controller_state,
            **kwargs,
        ):
            del throw, passed_solver_state, passed_controller_state
            return self._loop(
                terms=terms,
                saveat=saveat,
                init_state=init_state,
                max_steps=max_steps,
                inner_while_loop=functools.partial(adjoint._inner_loop, kind="lax"),
                outer_while_loop=functools.partial(adjoint._outer_loop, kind="lax"),
                **kwargs,
            )

        adjoint.RecursiveCheckpointAdjoint.loop = plain_loop


def _child(mode: str, variants=(), repeats: int = 1) -> dict:
    """This process's measurements: `"split"`, `"total"` or `"repeat"` (see the module's
    docstring)."""
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()
    import diffrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import jaxdae
    import jaxdae.multibody as mb

    _apply_variants(variants)

    model = mb.load_urdf(HUMANOID).mechanism(forces=[mb.Gravity((0.0, 0.0, -9.81))], limits=False)
    n = model.topology.num_coordinates
    q0 = jnp.zeros(n)
    v0 = jnp.asarray([0.5 if i % 2 == 0 else 0.0 for i in range(n)])
    args = (model, diffrax.Tsit5(), jnp.asarray(1e-7), q0, v0)

    def solve(model, solver, tolerance, q0, v0):
        controller = diffrax.PIDController(rtol=tolerance, atol=tolerance)
        sol = jaxdae.simulate(
            model,
            jaxdae.Unstabilized(),
            0.0,
            1.0,
            q0,
            v0,
            solver=solver,
            stepsize_controller=controller,
        )
        return sol.q_final, sol.stats["num_steps"]

    out = {"jaxdae": str(Path(jaxdae.__file__).parent)}
    if mode == "rhs":
        sys.path.insert(0, str(ROOT / "experiments" / "benchmarks"))
        from bench_robots import (  # pyright: ignore[reportMissingImports]
            _median_times,
            initial_rates,
        )

        from jaxdae._compilation._scalarize import scalarize
        from jaxdae._integration._vector_fields import state_rates

        rates, loop = scalarize(state_rates), 2000
        for name, path in (("humanoid", HUMANOID), ("arm", ARM)):
            robot = mb.load_urdf(path).mechanism(
                forces=[mb.Gravity((0.0, 0.0, -9.81))], limits=False
            )
            size = robot.topology.num_coordinates

            def rhs(y, robot=robot, size=size):
                return jnp.concatenate(rates(robot, jaxdae.Unstabilized(), 0.3, y[:size], y[size:]))

            run = jax.jit(
                lambda y, rhs=rhs: jax.lax.fori_loop(0, loop, lambda i, y: y + 1e-9 * rhs(y), y)
            )
            y = jnp.concatenate([jnp.zeros(size), jnp.asarray(initial_rates(size))])
            jax.block_until_ready(run(y))
            wall, cpu = _median_times(lambda run=run, y=y: run(y), 15)
            out.update(
                {f"{name}_rhs_us": 1e6 * wall / loop, f"{name}_rhs_cpu_us": 1e6 * cpu / loop}
            )
        return out
    if mode == "repeat":
        traced, compiled_cpu = [], []
        for _ in range(repeats):
            jax.clear_caches()
            cpu = time.process_time()
            lowered = eqx.filter_jit(solve).lower(*args)
            traced.append(time.process_time() - cpu)
            cpu = time.process_time()
            compiled = lowered.compile()
            compiled_cpu.append(time.process_time() - cpu)
        jax.block_until_ready(compiled(*args))
        out.update(
            trace_lower_cpu_min_s=min(traced),
            trace_lower_cpu_median_s=float(np.median(traced)),
            xla_cpu_min_s=min(compiled_cpu),
            xla_cpu_median_s=float(np.median(compiled_cpu)),
            hlo_instructions=_instructions(compiled.compiled.as_text()),
        )
        return out
    solve = eqx.filter_jit(solve)
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
        trace_lower_s=wall_lowered - wall,
        trace_lower_cpu_s=cpu_lowered - cpu,
        xla_s=wall_compiled - wall_lowered,
        xla_cpu_s=cpu_compiled - cpu_lowered,
        call_s=time.perf_counter() - wall_compiled,
        hlo_instructions=_instructions(text),
        fusions=text.count(" fusion("),
        while_loops=text.count(" while("),
    )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--src",
        action="append",
        default=None,
        help="import jaxdae from DIR/jaxdae (repeatable; default: this checkout)",
    )
    parser.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="N",
        help="lower and compile N times in one process per source and round",
    )
    parser.add_argument(
        "--constant-checks",
        action="store_true",
        help="constants for the initial state's mass and force checks",
    )
    parser.add_argument(
        "--checks-in-branch",
        action="store_true",
        help="the checks' inputs evaluated only where the solve failed",
    )
    parser.add_argument(
        "--plain-loop", action="store_true", help="diffrax's loops as plain lax while loops"
    )
    parser.add_argument(
        "--rhs",
        action="store_true",
        help="time one right-hand side of the humanoid and the arm instead",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = tuple(v for v in VARIANTS if getattr(args, v))
    if args.child is not None:
        print(json.dumps(_child(args.child, variants, args.in_process)))
        return
    sources = args.src or [str(ROOT)]
    runs: dict[str, list[dict]] = {src: [] for src in sources}
    modes = ("rhs",) if args.rhs else ("repeat",) if args.in_process else ("split", "total")
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for src in sources:
            row = {}
            for mode in modes:
                env = dict(os.environ, PYTHONPATH=src)
                command = [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--in-process",
                    str(args.in_process),
                ]
                command += ["--" + v.replace("_", "-") for v in variants]
                done = subprocess.run(
                    command, check=True, capture_output=True, text=True, env=env, cwd=ROOT
                )
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
            runs[src].append(row)
            loads.append(os.getloadavg()[0])
    each = (
        "right-hand sides, a fresh process each"
        if args.rhs
        else f"{args.in_process} compiles in one process per round"
        if args.in_process
        else "fresh processes"
    )
    print(
        f"load average {min(loads):.1f}–{max(loads):.1f}; medians of {args.rounds} rounds "
        f"of {each}, the sources alternating (each round's figure in brackets)"
        + (f"; variants: {', '.join(variants)}" if variants else "")
        + "\n"
    )
    print("| quantity | " + " | ".join(runs[src][0]["jaxdae"] for src in sources) + " |")
    print("| --- |" + " ---: |" * len(sources))
    for key in RHS_KEYS if args.rhs else REPEAT_KEYS if args.in_process else KEYS:
        cells = []
        for src in sources:
            values = [r[key] for r in runs[src]]
            each = ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in values)
            middle = np.median(values)
            cells.append(
                f"{middle:.3g} ({each})"
                if isinstance(values[0], float)
                else f"{middle:.0f} ({each})"
            )
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
