"""Diagnostic: Rodas5P's and the configured Kvaerno5's solves with the iteration matrix
inverted by array operations against LAPACK's LU factors, between 17 and 64 states.

`factor_for_solves` inverts `I − hγJ` with array operations (`checked_blocked_inverse`) up
to `LOOPED_INVERSE_MAX` states where the Jacobian takes at most `TANGENT_LOOP_MAX` tangents,
and keeps LAPACK's `getrf` and `trsm` otherwise. This solves a case of the stiff study
(`experiments/studies/stiff_integration.py`) both ways in one process: `array` with the
thresholds as they are (`--force-array` also for a Jacobian of many tangents), `lapack`
with the array inverse limited to `INVERSE_MAX` states. Per solver and way: the LAPACK
custom calls in the lowered program, the first call's wall time (compile included), the
median wall time of `--reps` calls (the two ways called in turn), the steps, and the
largest difference between the two ways' final states; first, the number of tangents that
the case's Jacobian takes.

    python experiments/diagnostics/bench_stiff_factorization.py [--case chain|governor]
        [--rtol 1e-5] [--reps 3] [--force-array]

The spring chain (64 states, 3 colours) takes seconds to compile; the flyball governor (56
states, a structurally dense Jacobian: 56 tangents) takes LAPACK's factors unless
`--force-array`, with which its Rodas5P solve compiles for about six minutes.
"""

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax

import jaxdae
from jaxdae import _thresholds
from jaxdae._integration import _jacobian

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))
import stiff_integration  # noqa: E402  # pyright: ignore[reportMissingImports]

CASES = {
    "chain": (stiff_integration.chain_case, 1.0),
    "governor": (stiff_integration.governor_case, 10.0),
}


def jacobian_tangents(system, formulation, q0, v0):
    """The number of tangents that Rodas5P's Jacobian of the case's ODE takes (`"coloured"`),
    read from `column_seeds` while a short solve is traced."""
    counts = []
    column_seeds = _jacobian.column_seeds

    def counted(*args):
        seeds, expand = column_seeds(*args)
        counts.append(len(seeds))
        return seeds, expand

    _jacobian.column_seeds = counted
    try:
        jax.eval_shape(
            lambda q, v: jaxdae.simulate(
                system, formulation, 0.0, 1e-3, q, v, solver=jaxdae.Rodas5P()
            ),
            q0,
            v0,
        )
    finally:
        _jacobian.column_seeds = column_seeds
    return counts[0]


def compiled_solve(system, formulation, q0, v0, t1, solver, rtol, way, force_array):
    """The jitted solve, traced and compiled with the thresholds of `way`, its LAPACK custom
    calls and the first call's wall time."""
    saved = (_thresholds.INVERSE_MAX, _thresholds.LOOPED_INVERSE_MAX)
    if way == "lapack":
        _thresholds.LOOPED_INVERSE_MAX = _thresholds.INVERSE_MAX
    elif force_array:  # the inverse whatever the number of tangents
        _thresholds.INVERSE_MAX = _thresholds.LOOPED_INVERSE_MAX
    try:
        solve = eqx.filter_jit(
            lambda q, v: jaxdae.simulate(
                system,
                formulation,
                0.0,
                t1,
                q,
                v,
                solver=solver,
                rtol=rtol,
                atol=1e-3 * rtol,
                max_steps=200_000,
            )
        )
        calls = sorted(set(re.findall(r"custom_call @(lapack_\w+)", solve.lower(q0, v0).as_text())))
        start = time.perf_counter()
        jax.block_until_ready(solve(q0, v0))
        first = time.perf_counter() - start
    finally:
        _thresholds.INVERSE_MAX, _thresholds.LOOPED_INVERSE_MAX = saved
    return solve, calls, first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=tuple(CASES), default="chain")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--force-array", action="store_true")
    args = parser.parse_args()
    make, t1 = CASES[args.case]
    system, formulation, q0, v0, _ = make()
    print(
        f"{args.case}: {2 * q0.size} states, Jacobian of "
        f"{jacobian_tangents(system, formulation, q0, v0)} tangents, rtol {args.rtol:g}, "
        f"t1 {t1:g} s"
    )
    for name in ("Rodas5P", "Kvaerno5 (configured)"):
        solver = stiff_integration.solvers(args.rtol, 1e-3 * args.rtol)[name]
        ways = {
            way: compiled_solve(
                system, formulation, q0, v0, t1, solver, args.rtol, way, args.force_array
            )
            for way in ("array", "lapack")
        }
        times = {way: [] for way in ways}
        solutions = {}
        for _ in range(args.reps):
            for way, (solve, _, _) in ways.items():
                start = time.perf_counter()
                solutions[way] = jax.block_until_ready(solve(q0, v0))
                times[way].append(time.perf_counter() - start)
        difference = float(abs(solutions["array"].q[-1] - solutions["lapack"].q[-1]).max())
        for way, (_, calls, first) in ways.items():
            sol = solutions[way]
            print(
                f"  {name}, {way}: first call {first:.2f} s, median "
                f"{1e3 * statistics.median(times[way]):.1f} ms of {args.reps} "
                f"({', '.join(f'{1e3 * t:.1f}' for t in times[way])}), "
                f"{int(sol.stats['num_steps'])} steps, LAPACK calls {calls or 'none'}"
            )
        print(f"  {name}: final states differ by {difference:.2e}")


if __name__ == "__main__":
    main()
