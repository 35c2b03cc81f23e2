"""Gradient cost vs the adjoint: jaxdae's reverse sweep, diffrax's checkpoint count, and
forward mode.

Mukharlyamov and Deressa's (2015) two-link example, `ModifiedLagrange(10, [20, 10], [100, 25])`,
default tolerances; gradient of `Σ q(t1)² + |Φ(t1)|²` w.r.t. the formulation's five gains, over
`t ∈ [0, 2]` (≈130 steps) and `t ∈ [0, 8]` (≈2000 steps: the arm is driven out of its workspace
after 2.85 s and the solve gets stiff). Rows:

- `ReverseSweepAdjoint()`, jaxdae's default for explicit Runge–Kutta solvers: at most 1024 steps
  stored, so over `t ∈ [0, 8]` the solve runs in segments and the backward pass re-solves all but
  the last; and `ReverseSweepAdjoint(stored_steps=4096)`, every step stored.
- `RecursiveCheckpointAdjoint(checkpoints=N)` for diffrax's default (`None`: about
  `sqrt(2 max_steps)` ≈ 450 for `max_steps = 100_000`) and for several `N`; jaxdae's default
  for solvers that are not explicit Runge–Kutta methods is `N = 32`
  (`jaxdae._thresholds.CHECKPOINTS`). Memory per trajectory is about
  `N × (size of the solver's loop state)`, multiplied by the batch size under `vmap`.
- `ForwardMode` + `jax.jacfwd` (forward sensitivities, one tangent per gain).

Every repetition times every row in turn; the table reports medians.

With `--out OUT` the table also goes to `OUT/bench_adjoint/tables.json` (as
`bench_adjoint.gradient`, the table of docs/benchmarks.md).

    python experiments/benchmarks/bench_adjoint.py [--repeats 7] [--out output]
"""

import argparse
import sys
import time
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae.examples import TwoLinkManipulator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _tables
from _tables import run_stamp, table, write  # noqa: E402

CHECKPOINTS = (None, 16, 32, 64, 256)


def _loss(system, q0, v0, t1, adjoint):
    def loss(formulation):
        sol = jaxdae.simulate(system, formulation, 0.0, t1, q0, v0, adjoint=adjoint)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    return loss


def row_label(kind) -> str:
    """A row's adjoint as docs/benchmarks.md names it."""
    if kind == "sweep 1024":
        return (
            "`ReverseSweepAdjoint()` (the default: segments of 1,024 steps, earlier ones re-solved)"
        )
    if kind == "sweep 4096":
        return "`ReverseSweepAdjoint(stored_steps=4096)` (every step stored)"
    if kind is None:
        return "`RecursiveCheckpointAdjoint()` (diffrax's default, ≈ 450 checkpoints)"
    if kind == 32:
        return "`RecursiveCheckpointAdjoint(checkpoints=32)` (the default for other solvers)"
    if kind == "jacfwd":
        return "`diffrax.ForwardMode()` with `jax.jacfwd` (one tangent per gain)"
    return f"`RecursiveCheckpointAdjoint(checkpoints={kind})`"


def gradient_table(median_ms: dict, stamp: dict) -> dict:
    """`bench_adjoint.gradient`: per adjoint and `t1`, the gradient's time as a multiple of
    the forward solve's, and in milliseconds."""
    spans = sorted({t1 for t1, _ in median_ms})
    kinds = [kind for t1, kind in median_ms if t1 == spans[0] and kind != "forward"]
    rows = [
        [row_label(kind)]
        + [
            f"{median_ms[(t1, kind)] / median_ms[(t1, 'forward')]:.1f}× "
            f"({median_ms[(t1, kind)]:.2f} ms)"
            for t1 in spans
        ]
        for kind in kinds
    ]
    columns = [("adjoint", "left")] + [(f"`t1 = {t1:g}`", "right") for t1 in spans]
    return table("bench_adjoint.gradient", columns, rows, stamp)


def main(repeats: int = 7, inner: int = 5, out: Path | None = None):
    stamp = run_stamp()
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    formulation = jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    rows = {}
    for t1 in (2.0, 8.0):
        rows[(t1, "forward")] = eqx.filter_jit(_loss(system, q0, v0, t1, None))
        for stored in (1024, 4096):
            rows[(t1, f"sweep {stored}")] = eqx.filter_jit(
                eqx.filter_grad(
                    _loss(system, q0, v0, t1, jaxdae.ReverseSweepAdjoint(stored_steps=stored))
                )
            )
        for checkpoints in CHECKPOINTS:
            adjoint = diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints)
            rows[(t1, checkpoints)] = eqx.filter_jit(
                eqx.filter_grad(_loss(system, q0, v0, t1, adjoint))
            )
        rows[(t1, "jacfwd")] = eqx.filter_jit(
            eqx.filter_jacfwd(_loss(system, q0, v0, t1, diffrax.ForwardMode()))
        )
    compile_s, times = {}, {key: [] for key in rows}
    for key, fn in rows.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(formulation))
        compile_s[key] = time.perf_counter() - start
    for _ in range(repeats):
        for key, fn in rows.items():
            start = time.perf_counter()
            for _ in range(inner):
                out = fn(formulation)
            jax.block_until_ready(out)
            times[key].append((time.perf_counter() - start) / inner)
    median_ms = {key: 1e3 * float(np.median(v)) for key, v in times.items()}
    print(f"device: {jax.devices()[0].platform}, {repeats} interleaved repetitions\n")
    print("| t1 | adjoint | compile + first call [s] | time [ms] | / forward |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for (t1, kind), ms in median_ms.items():
        if kind == "forward":
            name = "forward solve (no gradient)"
        elif kind == "jacfwd":
            name = "ForwardMode + jacfwd"
        elif kind is None:
            name = "RecursiveCheckpointAdjoint() (diffrax default)"
        elif kind == "sweep 1024":
            name = "ReverseSweepAdjoint() (jaxdae default)"
        elif kind == "sweep 4096":
            name = "ReverseSweepAdjoint(stored_steps=4096)"
        else:
            name = f"RecursiveCheckpointAdjoint(checkpoints={kind})"
        forward = median_ms[(t1, "forward")]
        print(f"| {t1:g} | {name} | {compile_s[(t1, kind)]:.2f} | {ms:.2f} | {ms / forward:.1f} |")
    if out is not None:
        write(out, "bench_adjoint", [gradient_table(median_ms, stamp)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the table to OUT/bench_adjoint/"
    )
    options = parser.parse_args()
    main(options.repeats, out=options.out)
