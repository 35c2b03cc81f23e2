"""Trace-time cost of the factorization plans of `J M⁻¹ Jᵀ` on large meshes: the wall time
and the peak memory (`tracemalloc`, NumPy's allocations included) of `cholesky_plan` on the
pattern of a 2-D grid (the five-point stencil of `bench_sparse_factor.py`), for each
side given, each from cold caches in this process. `cholesky_plan` builds the banded plan
(its bandwidth order and the place of every entry in its blocks) and, from a
half-bandwidth of `SUPERNODAL_MIN_WIDTH`, the multifrontal analysis, then keeps the
cheaper one; this work is done once per traced solve. The time is of one call, the memory
of another (`tracemalloc` slows what it traces).

With `--nets N,...` it also times, for `SquareNet(N)` of `jaxdae.examples._meshes`, the
trace of `Baumgarte`'s accelerations (`jax.make_jaxpr`, from cold caches) and, within it,
the analysis of the terms' structure (`_systems/_structure.py`: the sparsity of `M` and
`[Φ_q; Ψ_v]`, found on dense masks of their derivatives' programs).

To compare two commits, run it with `PYTHONPATH` at each checkout:

    python experiments/diagnostics/bench_plan_analysis.py [--sides 32,64,128,181]
        [--nets 22,45,70]
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


def measure_net(size: int) -> dict:
    """The trace of `Baumgarte`'s accelerations of `SquareNet(size)` from cold caches, and
    the structure analysis within it: `{"coordinates", "trace", "structure"}` (seconds)."""
    import jax

    import jaxdae
    from jaxdae._compilation import _sparsity
    from jaxdae._systems import _structure
    from jaxdae.examples._meshes import SquareNet

    model = SquareNet(size)
    q0, v0 = model.initial_state()
    formulation = jaxdae.Baumgarte(20.0, 100.0)
    analysed = []
    analyse = _structure._analyse

    def timed(*args):
        start = time.perf_counter()
        out = analyse(*args)
        analysed.append(time.perf_counter() - start)
        return out

    _structure._CACHE.clear()
    _sparsity._MASKS.clear()
    for cached in (_banded.banded_plan, _supernodal.supernodal_plan, _supernodal.cholesky_plan):
        cached.cache_clear()
    jax.clear_caches()
    _structure._analyse = timed
    try:
        start = time.perf_counter()
        jax.make_jaxpr(lambda q, v: formulation.accelerations(model.terms(0.0, q, v)))(q0, v0)
        trace = time.perf_counter() - start
    finally:
        _structure._analyse = analyse
    return {"coordinates": q0.shape[0], "trace": trace, "structure": sum(analysed)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="32,64,128,181")
    parser.add_argument("--nets", default="", help="sizes N of SquareNet(N) to trace")
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
    if args.nets:
        measure_net(4)  # the imports and first compiles of a trace
        print()
        print("| square net | coordinates | trace of the accelerations [s] | structure [s] |")
        print("| ---: | ---: | ---: | ---: |")
        for size in (int(s) for s in args.nets.split(",")):
            row = measure_net(size)
            cells = f"{row['coordinates']:,} | {row['trace']:.2f} | {row['structure']:.2f}"
            print(f"| {size} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
