"""`jaxdae.UnrolledERK(diffrax.Tsit5())` against diffrax's `Tsit5` (stages in a loop).

Mukharlyamov and Deressa's (2015) two-link example, `ModifiedLagrange(10, [20, 10], [100, 25])`, t ∈
[0, 2], default tolerances, float64. Loss `Σ q(2)² + |Φ(2)|²` (mean over a batch); gradient w.r.t.
the five gains. Rows: one trajectory; `jax.vmap(jaxdae.simulate)` and `jaxdae.simulate_ensemble`
over `--batch` initial states perturbed by 1e-3. Each function is compiled first (compile + first
call reported), then all are timed in turn (interleaved), and the table reports the minimum
over repetitions: on shared virtual cores the minimum is the steadiest estimate of the cost.

With `--out OUT` the comparison also goes to `OUT/bench_unrolled/tables.json` (as
`bench_unrolled.tsit5`, the table of docs/benchmarks.md).

    python experiments/benchmarks/bench_unrolled.py [--batch 256] [--repeats 11] [--out output]
"""

import argparse
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp

import jaxdae
from jaxdae.examples import TwoLinkManipulator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _tables
from _tables import run_stamp, table, write  # noqa: E402

SOLVERS = ("diffrax Tsit5", "UnrolledERK(Tsit5)")


def _losses(system, q0s, v0s, solver):
    def one(formulation, q0, v0):
        sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, solver=solver)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    def ensemble(formulation):
        sol = jaxdae.simulate_ensemble(system, formulation, 0.0, 2.0, q0s, v0s, solver=solver)
        return jnp.mean(jnp.sum(sol.q_final**2, axis=-1) + jnp.sum(sol.phi[:, -1] ** 2, axis=-1))

    return {
        "one trajectory": lambda f: one(f, q0s[0], v0s[0]),
        "`jax.vmap(simulate)`": lambda f: jnp.mean(
            jax.vmap(one, in_axes=(None, 0, 0))(f, q0s, v0s)
        ),
        "`simulate_ensemble`": ensemble,
    }


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.1f}"


def comparison_table(ms: dict, compile_s: dict, rows: list, batch: int, stamp: dict) -> dict:
    """`bench_unrolled.tsit5`: per row, `Tsit5` → `UnrolledERK` for the forward and the
    gradient (minimum times, with the speed-up) and for the gradient's compile."""
    old, new = SOLVERS
    cells = []
    for row in rows:
        pair = [
            f"{_ms(ms[row, old, kind])} → {_ms(ms[row, new, kind])} "
            f"({ms[row, old, kind] / ms[row, new, kind]:.1f}×)"
            for kind in ("forward", "gradient")
        ]
        label = row if row == "one trajectory" else f"{row}, {batch:,}"
        compile_cell = (
            f"{compile_s[row, old, 'gradient']:.1f} → {compile_s[row, new, 'gradient']:.1f}"
        )
        cells.append([label, *pair, compile_cell])
    columns = [
        ("run", "left"),
        ("forward, `Tsit5` → `UnrolledERK` [ms]", "right"),
        ("gradient, `Tsit5` → `UnrolledERK` [ms]", "right"),
        ("compile of the gradient [s]", "right"),
    ]
    return table("bench_unrolled.tsit5", columns, cells, stamp)


def main(batch: int = 256, repeats: int = 11, out: Path | None = None):
    stamp = run_stamp()
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    q0s = q0 + 1e-3 * jax.random.normal(jax.random.key(0), (batch, 2), q0.dtype)
    v0s = jnp.broadcast_to(v0, (batch, 2))
    formulation = jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    solvers = dict(
        zip(SOLVERS, (diffrax.Tsit5(), jaxdae.UnrolledERK(diffrax.Tsit5())), strict=True)
    )
    fns, compile_s = {}, {}
    for solver_name, solver in solvers.items():
        for row, loss in _losses(system, q0s, v0s, solver).items():
            for kind, fn in (("forward", jax.jit(loss)), ("gradient", jax.jit(jax.grad(loss)))):
                start = time.perf_counter()
                jax.block_until_ready(fn(formulation))
                compile_s[row, solver_name, kind] = time.perf_counter() - start
                fns[row, solver_name, kind] = fn
    times = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            inner = 10 if key[0] == "one trajectory" else 2
            start = time.perf_counter()
            for _ in range(inner):
                out = fn(formulation)
            jax.block_until_ready(out)
            times[key].append((time.perf_counter() - start) / inner)
    ms = {key: 1e3 * min(values) for key, values in times.items()}
    print(
        f"device: {jax.devices()[0].platform}; batch {batch}; minimum of {repeats} interleaved "
        "repetitions\n"
    )
    print(
        "| run | solver | forward [ms] | gradient [ms] | gradient / forward "
        "| compile forward [s] | compile gradient [s] |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in _losses(system, q0s, v0s, None):
        for solver_name in solvers:
            fwd, grad = ms[row, solver_name, "forward"], ms[row, solver_name, "gradient"]
            print(
                f"| {row} | {solver_name} | {fwd:.3f} | {grad:.3f} | {grad / fwd:.1f} | "
                f"{compile_s[row, solver_name, 'forward']:.2f} | "
                f"{compile_s[row, solver_name, 'gradient']:.2f} |"
            )
    if out is not None:
        rows = list(_losses(system, q0s, v0s, None))
        write(out, "bench_unrolled", [comparison_table(ms, compile_s, rows, batch, stamp)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the table to OUT/bench_unrolled/"
    )
    main(**vars(parser.parse_args()))
