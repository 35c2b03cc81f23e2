"""What each part of an event-driven solve costs its compile: the whole program against the
same program with one part replaced by a trivial stand-in, each in a fresh process.

The programs are `experiments/benchmarks/bench_compile.py`'s (`--model urdf-arm`: the URDF
arm's first 0.05 s with its six limit gaps; `--model sphere`: the event-driven sphere of the
closed forms, friction in space; `--model ball`: the bouncing ball's third impact time),
`--function` one of the model's rows (default: `forward, limits`, `forward`, `forward`).
Each variant leaves out one part of `_integration/_events.py`'s program; what is left
computes nothing meaningful, so that only its size and compile time are measured:

- `transition`: the transition at an event returns the state unchanged, its modes turned
  by a comparison with the time, so that XLA cannot fold them (the contact branches of the
  rates and of the conditions stay);
- `root-finder`: the gaps' condition stops a stretch at the end of the step where it
  crossed zero, not located within it;
- `contact-conditions`: the conditions are the open gaps alone where the solve evaluates
  them on their own (no contact problem in the root finder; after each step the condition
  still comes with the rates of the step's last stage);
- `impact`: the impact changes no velocity (no impact problem in the transition);
- `condition-as-event` (not left out but moved back): the gaps' condition is a
  `diffrax.Event` condition evaluated after each step, with its own contact problem, instead
  of coming with the rates of each step's last stage (`_solve.StopAtCrossing`); this
  variant computes what the full program does.

Per round, one fresh process per variant (the full program first) lowers and compiles the
function: trace and lowering, XLA's compilation (wall and process CPU), the optimized
program's HLO instructions and fused kernels, and the median time of five calls of the
compiled program (after a first; `nan` where a variant's program fails at run time, as one
that leaves out a part may). The medians of `--rounds` rounds are printed,
with each variant's difference from the full program.

    python experiments/diagnostics/bench_event_compile.py [--model urdf-arm] [--function NAME]
        [--rounds 3]
        [--variants transition,root-finder,contact-conditions,impact,condition-as-event]
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
VARIANTS = ("transition", "root-finder", "contact-conditions", "impact", "condition-as-event")
DEFAULT_FUNCTION = {"urdf-arm": "forward, limits", "sphere": "forward", "ball": "forward"}
KEYS = ("trace_lower_s", "xla_s", "xla_cpu_s", "hlo_instructions", "fusions", "call_ms")


def _left_out(variant: str) -> None:
    """Replaces the part of `_integration/_events.py` that `variant` names (the docstring)."""
    import diffrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxdae._formulations._impacts import Impact
    from jaxdae._integration import _events, _solve

    if variant == "transition":

        def unchanged(system, formulation, settings, contacts, t, q, s, hit, mass_factor=None):
            del system, formulation, settings, mass_factor
            count = contacts.start_forces.shape[0]
            turned = jax.tree.map(
                lambda m: jnp.where(t > 1e300, m, ~m if m.dtype == bool else -m), contacts.modes
            )
            return _events._Transition(
                s + 0 * t,
                turned,
                contacts.offset,
                contacts.slip_offset,
                jnp.zeros((count,), bool) | hit,
                jnp.zeros((count,), s.dtype),
                jnp.asarray(True),
                jnp.asarray(True),
                jnp.zeros((count,), s.dtype),
            )

        _events.transition = unchanged
    elif variant == "root-finder":

        def at_step_end(out, solver, condition, terms, saveat, start=None):
            del solver, condition, terms, saveat, start
            crossed = out.solver_state.crossed
            flags = [] if out.event_mask is None else [m & ~crossed for m in out.event_mask]
            result = diffrax.RESULTS.where(crossed, diffrax.RESULTS.event_occurred, out.result)
            return eqx.tree_at(
                lambda o: (o.event_mask, o.result),
                out,
                ([crossed, *flags], result),
                is_leaf=lambda x: x is None,
            )

        _solve.located_crossing = at_step_end
    elif variant == "contact-conditions":

        def open_gaps_only(system, formulation, contacts, t, q, s, mass_factor=None, **kwargs):
            return _events.jitted_open_gaps(system, contacts, t, q)

        _events.condition_values = open_gaps_only
    elif variant == "impact":

        def no_change(terms, gaps, closed, restitution, min_bounce_speed):
            del restitution, min_bounce_speed
            count = gaps.rate.shape[0] + gaps.slip.shape[0]
            return Impact(
                jnp.zeros(terms.forces.shape, terms.forces.dtype),
                jnp.zeros((count,), terms.forces.dtype) + 0 * closed.any(),
                jnp.asarray(True),
            )

        _events.impact = no_change
    elif variant == "condition-as-event":
        _solve.locates_in_steps = lambda dynamics, solver, adjoint: None
    elif variant != "full":
        raise SystemExit(f"unknown variant {variant!r}")


def _child(model: str, function: str, variant: str) -> dict:
    sys.path.insert(0, str(ROOT / "experiments" / "benchmarks"))
    import bench_compile  # pyright: ignore[reportMissingImports]
    import jax

    _left_out(variant)
    functions, args = bench_compile.model_functions(model)
    if function not in functions:
        raise SystemExit(f"--function: one of {sorted(functions)}")
    wall = time.perf_counter()
    lowered = jax.jit(functions[function]).lower(*args)
    wall_lowered, cpu_lowered = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    text = compiled.as_text()
    calls = []
    try:
        jax.block_until_ready(compiled(*args))
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            calls.append(time.perf_counter() - start)
    except Exception:  # noqa: BLE001 (a variant that leaves out a part may fail at run time)
        calls = [float("nan")]
    return {
        "call_ms": 1e3 * float(np.median(calls)),
        "trace_lower_s": wall_lowered - wall,
        "xla_s": time.perf_counter() - wall_lowered,
        "xla_cpu_s": time.process_time() - cpu_lowered,
        "hlo_instructions": sum(
            1 for line in text.splitlines() if re.match(r"\s+(ROOT )?%?\S+ = ", line)
        ),
        "fusions": text.count(" fusion("),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="urdf-arm", choices=sorted(DEFAULT_FUNCTION))
    parser.add_argument("--function", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    function = args.function or DEFAULT_FUNCTION[args.model]
    if args.child is not None:
        print(json.dumps(_child(args.model, function, args.child)))
        return
    variants = ["full"] + [v for v in args.variants.split(",") if v]
    unknown = set(variants) - {"full", *VARIANTS}
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for variant in variants:
            command = [sys.executable, __file__, "--model", args.model, "--child", variant]
            command += ["--function", function]
            done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    print(
        f"{args.model}, {function!r}: load average {min(loads):.1f}–{max(loads):.1f}; "
        f"medians of {args.rounds} rounds of fresh processes, the variants alternating\n"
    )
    print("| left out | " + " | ".join(KEYS) + " | XLA compile saved [s] |")
    print("| --- |" + " ---: |" * (len(KEYS) + 1))
    full = {key: float(np.median([r[key] for r in runs["full"]])) for key in KEYS}
    for variant in variants:
        medians = {key: float(np.median([r[key] for r in runs[variant]])) for key in KEYS}
        cells = [
            f"{medians[key]:.0f}"
            if key in ("hlo_instructions", "fusions")
            else f"{medians[key]:.2f}"
            for key in KEYS
        ]
        saved = "" if variant == "full" else f"{full['xla_s'] - medians['xla_s']:.2f}"
        print(
            f"| {'nothing' if variant == 'full' else variant} | "
            + " | ".join(cells)
            + f" | {saved} |"
        )


if __name__ == "__main__":
    main()
