"""Factor + solve time and compile time of a symmetric positive definite matrix on a 2-D
grid pattern (5-point Laplacian plus diagonal) against its size: the multifrontal
factorization on a nested-dissection order (`_compilation/_supernodal.py`), the banded
factorization on its plan (`_compilation/_banded.py`), and the dense Cholesky
(`jnp.linalg.cholesky`); with the growth exponents (least-squares slopes of log time
against log size).

    .venv/bin/python experiments/diagnostics/bench_sparse_factor.py [--sizes 10,20,40,63]
        [--repeats 3] [--dense-max 2500]

`--sizes` are the grid's sides (`n = side²`).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdae._compilation._banded import banded_plan, banded_solve
from jaxdae._compilation._sparse import Pattern, SparseMatrix
from jaxdae._compilation._supernodal import supernodal_plan, supernodal_solve

jax.config.update("jax_enable_x64", True)


def grid_pattern(side: int) -> Pattern:
    n = side * side
    index = np.arange(n).reshape(side, side)
    pairs = [(index[:, :-1], index[:, 1:]), (index[:-1], index[1:])]
    rows = np.concatenate(
        [np.arange(n)] + [a.ravel() for a, _ in pairs] + [b.ravel() for _, b in pairs]
    )
    cols = np.concatenate(
        [np.arange(n)] + [b.ravel() for _, b in pairs] + [a.ravel() for a, _ in pairs]
    )
    return Pattern((n, n), rows, cols)


def grid_values(pattern: Pattern, seed: int = 0) -> np.ndarray:
    """Symmetric, diagonally dominant values on `pattern`."""
    rng = np.random.default_rng(seed)
    n = pattern.shape[0]
    key = np.minimum(pattern.rows, pattern.cols) * n + np.maximum(pattern.rows, pattern.cols)
    _, pair = np.unique(key, return_inverse=True)
    weights = -rng.random(pair.max() + 1)[pair]
    off = pattern.rows != pattern.cols
    diagonal = np.zeros(n)
    np.add.at(diagonal, pattern.rows[off], -weights[off])
    return np.where(off, weights, diagonal[pattern.rows] + 1.0)


def measure(fn, args, repeats):
    """(compile seconds, median run seconds) of `jax.jit(fn)`."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_time = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - start)
    return compile_time, float(np.median(runs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,20,32,45,63")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dense-max", type=int, default=2500)
    args = parser.parse_args()
    sides = [int(s) for s in args.sizes.split(",")]
    rows = []
    for side in sides:
        pattern = grid_pattern(side)
        n = pattern.shape[0]
        values = jnp.asarray(grid_values(pattern))
        rhs = jnp.asarray(np.random.default_rng(1).standard_normal(n))
        dense = SparseMatrix(values, pattern).dense()
        start = time.perf_counter()
        plan = supernodal_plan(pattern)
        analysis = time.perf_counter() - start
        band = banded_plan(pattern)
        reference = np.linalg.solve(np.asarray(dense), np.asarray(rhs))
        row = {"n": n, "analysis": analysis}

        def sparse_fn(v, b, plan=plan, pattern=pattern):
            return supernodal_solve(SparseMatrix(v, pattern), b, plan)[0]

        def banded_fn(v, b, band=band, pattern=pattern):
            return banded_solve(SparseMatrix(v, pattern), b, band)[0]

        def dense_fn(a, b):
            low = jnp.linalg.cholesky(a)
            y = jax.lax.linalg.triangular_solve(low, b[:, None], left_side=True, lower=True)
            return jax.lax.linalg.triangular_solve(
                low, y, left_side=True, lower=True, transpose_a=True
            )[:, 0]

        for name, fn, operand in (
            ("supernodal", sparse_fn, values),
            ("banded", banded_fn, values),
            ("dense", dense_fn, dense),
        ):
            if (name == "banded" and band is None) or (name == "dense" and n > args.dense_max):
                row[name] = (np.nan, np.nan)
                continue
            compile_time, run = measure(fn, (operand, rhs), args.repeats)
            error = float(np.max(np.abs(np.asarray(jax.jit(fn)(operand, rhs)) - reference)))
            assert error < 1e-8, (name, n, error)
            row[name] = (compile_time, run)
        row["supernodes"] = plan.supernodes if plan else 0
        row["tasks"] = plan.tasks if plan else 0
        row["width"] = band.width if band else 0
        rows.append(row)
        print(
            f"n={n:6d} analysis {analysis:6.3f}s  "
            + "  ".join(
                f"{k} run {row[k][1] * 1e3:8.3f} ms compile {row[k][0]:6.2f} s"
                for k in ("supernodal", "banded", "dense")
            ),
            flush=True,
        )
    names = ("supernodal", "banded", "dense")
    print()
    print(
        "| n | half-bandwidth | supernodes / tasks | analysis (s) | "
        + " | ".join(f"{name} run (ms)" for name in names)
        + " | "
        + " | ".join(f"{name} compile (s)" for name in names)
        + " |"
    )
    print("|---" * 10 + "|")
    for r in rows:
        cells = ["–" if np.isnan(r[k][1]) else f"{r[k][1] * 1e3:.3g}" for k in names] + [
            "–" if np.isnan(r[k][0]) else f"{r[k][0]:.2f}" for k in names
        ]
        head = (
            f"| {r['n']} | {r['width']} | {r['supernodes']} / {r['tasks']} | {r['analysis']:.2f} | "
        )
        print(head + " | ".join(cells) + " |")
    sizes = np.log([r["n"] for r in rows])
    upper = sizes >= np.median(sizes)  # the asymptotic range
    for name in names:
        for what, column in (("run", 1), ("compile", 0)):
            times = np.array([r[name][column] for r in rows])
            for within in (np.ones_like(upper), upper):
                ok = np.isfinite(times) & within
                if ok.sum() >= 2:
                    slope = np.polyfit(sizes[ok], np.log(times[ok]), 1)[0]
                    low, high = (round(float(np.exp(x))) for x in sizes[ok][[0, -1]])
                    print(f"{name}: {what} time ∝ n^{slope:.2f} over n = {low}…{high}")


if __name__ == "__main__":
    main()
