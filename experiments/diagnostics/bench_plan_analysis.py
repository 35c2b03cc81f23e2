"""Trace-time cost of the factorization plans of `J M⁻¹ Jᵀ` on large meshes: the wall time
and the peak memory (`tracemalloc`, NumPy's allocations included) of `cholesky_plan` on the
pattern of a 2-D grid (the five-point stencil of `bench_sparse_factor.py`), for each
side given, each from cold caches in this process. `cholesky_plan` builds the banded plan
(its bandwidth order and the place of every entry in its blocks) and, from a
half-bandwidth of `SUPERNODAL_MIN_WIDTH`, the multifrontal analysis, then keeps the
cheaper one; this work is done once per traced solve. The time is of one call, the memory
of another (`tracemalloc` slows what it traces).

To compare two commits, run it with `PYTHONPATH` at each checkout:

    python experiments/diagnostics/bench_plan_analysis.py [--sides 32,64,128,181]
"""

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_sparse_factor

from bench_sparse_factor import grid_pattern  # noqa: E402

from jaxdae._compilation import _banded, _supernodal  # noqa: E402


def _plan(pattern):
    for cached in (_banded.banded_plan, _supernodal.supernodal_plan, _supernodal.cholesky_plan):
        cached.cache_clear()
    return _supernodal.cholesky_plan(pattern)


def measure(side: int) -> dict:
    """`cholesky_plan` of the grid of `side × side` rows: its kind, its wall time, and its
    peak memory in another call (`tracemalloc` slows what it traces)."""
    pattern = grid_pattern(side)
    start = time.perf_counter()
    plan = _plan(pattern)
    seconds = time.perf_counter() - start
    tracemalloc.start()
    _plan(pattern)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "rows": pattern.shape[0],
        "plan": type(plan).__name__,
        "seconds": seconds,
        "peak_mib": peak / 2**20,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="32,64,128,181")
    args = parser.parse_args()
    _plan(grid_pattern(8))  # the imports of the first analysis (SciPy's, METIS's)
    print("| rows | plan kept | analysis [s] | peak memory [MiB] |")
    print("| ---: | --- | ---: | ---: |")
    for side in (int(s) for s in args.sides.split(",")):
        row = measure(side)
        print(
            f"| {row['rows']:,} | {row['plan']} | {row['seconds']:.2f} | {row['peak_mib']:,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
