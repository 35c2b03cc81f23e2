"""Diagnostic: one matrix inverse of 17 to 64 rows, by array operations against LAPACK.

From `LU_UNROLL_MAX + 1` to `LOOPED_INVERSE_MAX` rows jaxdae inverts with array operations:
`looped_inverse` (Gauss–Jordan with partial pivoting, a `lax.fori_loop` step per column),
`blocked_inverse` (block Gauss–Jordan in blocks of `NEWTON_INVERSE_BLOCK` rows, pivoting
within them: `GeneralizedAlpha`'s Newton matrix) and `checked_blocked_inverse` (the block
elimination, checked against partial pivoting: `inverse`, Rodas5P's and `FusedChord`'s
`I − hγJ`); beyond, LAPACK's LU factors (`jnp.linalg.inv`). This times one inversion of
each inside a jitted `lax.fori_loop` of `--loop` inversions (each
iteration's matrix depends on the last inverse, so none is hoisted), on random matrices
`n I + N(0, 1)`, float64: µs per inversion (median wall and CPU time of `--reps` calls
after a warm-up), µs per column of the looped one, and the compile time of each.
`--unrolled` adds `lu_factor`'s unrolled elimination forced beyond its threshold (its
compile takes tens of seconds at 33 rows).

    python experiments/diagnostics/bench_inverse.py [--sizes 33,52,64] [--loop 300]
        [--reps 5] [--unrolled]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdae import _thresholds
from jaxdae._compilation._linalg import (
    blocked_inverse,
    checked_blocked_inverse,
    looped_inverse,
    lu_factor,
    lu_solve,
)

jax.config.update("jax_enable_x64", True)


def unrolled_inverse(matrix):
    """`lu_factor`'s unrolled elimination at any size, and the solves with the identity."""
    saved = _thresholds.LU_UNROLL_MAX
    _thresholds.LU_UNROLL_MAX = matrix.shape[0]
    try:
        return lu_solve(lu_factor(matrix), jnp.eye(matrix.shape[0], dtype=matrix.dtype))
    finally:
        _thresholds.LU_UNROLL_MAX = saved


METHODS = {
    "looped Gauss–Jordan": looped_inverse,
    "block Gauss–Jordan": lambda a: blocked_inverse(a, _thresholds.NEWTON_INVERSE_BLOCK),
    "checked block Gauss–Jordan": checked_blocked_inverse,
    "LAPACK (jnp.linalg.inv)": jnp.linalg.inv,
}


def timed(method, matrix, loop: int, reps: int):
    """µs per inversion (median wall, median CPU) and the compile seconds."""

    def body(_, a):
        return matrix + 1e-12 * method(a)

    run = jax.jit(lambda a: jax.lax.fori_loop(0, loop, body, a))
    began = time.perf_counter()
    compiled = run.lower(matrix).compile()
    compile_s = time.perf_counter() - began
    jax.block_until_ready(compiled(matrix))
    walls, cpus = [], []
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(matrix))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return 1e6 * np.median(walls) / loop, 1e6 * np.median(cpus) / loop, compile_s


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="33,52,64")
    parser.add_argument("--loop", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--unrolled", action="store_true")
    args = parser.parse_args()
    methods = dict(METHODS, **({"unrolled LU": unrolled_inverse} if args.unrolled else {}))
    print("| rows | method | µs per inversion (wall) | CPU | µs per column | compile [s] |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for n in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(n)
        matrix = jnp.asarray(n * np.eye(n) + rng.standard_normal((n, n)))
        for name, method in methods.items():
            error = float(jnp.abs(method(matrix) @ matrix - jnp.eye(n)).max())
            if not error < 1e-10:
                raise RuntimeError(f"{name} at {n} rows: |A⁻¹A − I| = {error:.1e}")
            wall, cpu, compile_s = timed(method, matrix, args.loop, args.reps)
            per_column = f"{wall / n:.2f}" if method is looped_inverse else "—"
            print(
                f"| {n} | {name} | {wall:.1f} | {cpu:.1f} | {per_column} | {compile_s:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
