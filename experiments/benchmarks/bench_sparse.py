"""Benchmark: cost against the size of meshes of bars (jaxdae, hand-written diffrax, CasADi).

Four families whose constraint graphs are meshes (`jaxdae/examples/_meshes.py`): a planar
square net hanging from two corners, a spatial triangle-mesh cloth hanging from two
corners, a planar Pratt truss with open bays (a mechanism) pinned at both ends, and a
spatial cubic lattice hanging from a fixed top layer. Unlike the chains and ladders of
`bench_scaling.py`, the band of their `J M⁻¹ Jᵀ` widens as they grow, so the factorization
that jaxdae chooses decides how the cost grows: the script prints it per size (dense,
banded with its half-bandwidth `b`, or the plan of another factorization that
`StructuredCholesky` chooses), read from the solver's plan for the model's pattern.

Each model of about `--sizes` coordinates (the family's size `N` closest) is solved with
`Baumgarte(kd=20, kp=100)` over `t ∈ [0, 1]` from rest, Tsit5, `rtol = 1e-8`, `atol = 1e-10`,
float64, by

- jaxdae: one `jax.jit`-compiled `simulate` (compiled ahead of time; its compile time is
  trace + lower + XLA compile);
- "diffrax + hand-written RHS": the same ODE written by hand in `jax.numpy` (`bars_rhs`:
  `J Jᵀ` assembled densely and solved with `jnp.linalg.solve`) in `diffrax.diffeqsolve`;
- CasADi: the same ODE from SX derivatives with CasADi's sparse LDL, integrated by CVODES
  Adams (functional iteration) at the same tolerances (`bench_scaling.casadi_integrator`);
  its "compile" time is building the integrator. Left out if CasADi is not installed.

Times are medians of `--repeats` calls after a first call; "per step" divides a solve by its
steps (accepted and rejected). A method × size whose solve would exceed `--budget` seconds,
extrapolated from the previous size as `t · (n / n_prev)^2.5`, or whose compile took more
than `--compile-budget` seconds at the previous size, is skipped and marked
(`bench_scaling.predicted_skip`). The growth table fits `time ∝ n^p` (log-log least squares
over the sizes measured) to the time per step and to the solve, and to the time per step
over the largest three sizes (where the factorization, not the fixed cost of a step,
dominates).

The work–precision table solves one model per family of about each `--precision-sizes`
coordinates at `rtol` in `--tolerances` (`atol = rtol / 100`), by jaxdae with Tsit5 and with
Dopri8 (the explicit solver for tight tolerances), by the hand-written diffrax solve (up to
`HANDWRITTEN_PRECISION_MAX` coordinates: beyond, its dense solve takes minutes a call) and
by CasADi, which also runs at each decade down to `CASADI_EXTRA_DECADES` below the tightest
(CVODES-Adams ends 10–200× further from the reference than jaxdae at the same `rtol`, so its
curve must reach jaxdae's errors). It gives the largest error of `q(1)` against a
reference solved by jaxdae with Dopri8 at `rtol = 1e-12`, `atol = 1e-14`. A method's tighter
tolerances are skipped once its solve took more than `--budget` / 3. The matched-accuracy
table compares along the error, not the tolerance: for each jaxdae run, CasADi's time at
jaxdae's error, interpolated log-log between CasADi's two runs whose errors bracket it, and
the ratio.

    python experiments/benchmarks/bench_sparse.py [--quick] [--out output]
        [--sizes 50,100,200,400,700,1000] [--families square,cloth,truss,frame]
        [--budget 20] [--compile-budget 120] [--repeats 3]
        [--precision-sizes 200,1000] [--tolerances 1e-4,1e-6,1e-8,1e-10] [--no-precision]
        [--precision-only]
"""

import argparse
import os
import sys
import time
from pathlib import Path

# One BLAS thread before NumPy and JAX load OpenBLAS, as in bench_scaling.py.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _tables
import diffrax
import jax
import numpy as np
from _common import output_dir, write_json
from bench_scaling import (
    ATOL,
    CASADI,
    HANDWRITTEN,
    JAXDAE,
    KD,
    KP,
    METHODS,
    RTOL,
    T1,
    _compile,
    _median_time,
    ca,
    casadi_integrator,
    handwritten_functions,
    jaxdae_functions,
    predicted_skip,
    set_differences,
    warm_up_jax,
)

from jaxdae import _thresholds
from jaxdae._compilation._banded import BandedPlan, banded_plan
from jaxdae._compilation._linear_solvers import CholeskyFactor, StructuredCholesky
from jaxdae._formulations._multipliers import eliminate
from jaxdae.examples._meshes import FAMILIES, family_size

NAME = "bench_sparse"
DEFAULT_SIZES = (50, 100, 200, 400, 700, 1000)
QUICK_SIZES = (50, 100)
DEFAULT_TOLERANCES = (1e-4, 1e-6, 1e-8, 1e-10)
QUICK_TOLERANCES = (1e-6, 1e-8)
REFERENCE_TOLERANCES = (1e-12, 1e-14)
# jaxdae's explicit solver for tight tolerances, as a method of the work–precision table.
JAXDAE_DOPRI8 = "jaxdae, Dopri8"
HANDWRITTEN_PRECISION_MAX = 400
CASADI_EXTRA_DECADES = 3


# -- what jaxdae chooses ---------------------------------------------------------------------


def factorization(model) -> dict:
    """How jaxdae factorizes `model`'s `J M⁻¹ Jᵀ`: `{"constraints", "nnz", "path",
    "banded_width"}` (the half-bandwidth a banded plan would have, `None` where none applies)
    and, for a banded plan, its half-bandwidth `"width"`. Traced abstractly (no compile): the
    terms' pattern of the matrix and the plan that `StructuredCholesky` makes for it (a
    sparse plan is named with its estimated work, `flops`, where it gives one)."""
    q0, v0 = model.initial_state()
    found = {}

    def probe(q, v):
        elimination = eliminate(model.terms(0.0, q, v))
        found["constraints"] = elimination.matrix.shape[0]
        sparse = elimination.sparse_matrix
        found["nnz"] = None if sparse is None else sparse.pattern.nnz
        band = None if sparse is None else banded_plan(sparse.pattern)
        found["banded_width"] = None if band is None else band.width
        state = StructuredCholesky().init(elimination.operator, {})
        # Another kind of state than the dense and banded ones is another factorization.
        found["plan"] = getattr(state, "plan", None) if isinstance(state, CholeskyFactor) else state
        return elimination.matrix

    jax.eval_shape(probe, q0, v0)
    plan, size = found.pop("plan"), found["constraints"]
    if isinstance(plan, BandedPlan):
        found.update(path=f"banded, b = {plan.width}", width=plan.width)
    elif plan is not None:  # another factorization on the pattern
        flops = getattr(plan, "flops", None)
        details = [type(plan).__name__] + ([f"{flops:.2g} flops"] if flops else [])
        if found["banded_width"] is not None:
            details.append(f"banded b = {found['banded_width']}")
        found["path"] = f"sparse ({', '.join(details)})"
    elif size <= _thresholds.ARRAY_FORM_UNROLL_MAX:
        found["path"] = "dense, unrolled"
    elif size <= _thresholds.LOOPED_MAX:
        found["path"] = "dense, looped"
    else:
        found["path"] = "dense, LAPACK"
    return found


# -- one method on one model -----------------------------------------------------------------


def measure_jax(functions, model, repeats):
    """`{compile, single, steps, per_step, q_final}` of the `forward` of `functions`
    (`bench_scaling.jaxdae_functions` or `handwritten_functions`, bound to their options)."""
    forward, _ = functions(model)
    q0, v0 = model.initial_state()
    gains = (np.float64(KD), np.float64(KP))
    jitted, compile_times = _compile(forward, gains, q0, v0)
    (q_final, steps), single = _median_time(
        lambda: jax.block_until_ready(jitted(gains, q0, v0)), repeats
    )
    return {
        "compile": compile_times,
        "single": single,
        "steps": int(steps),
        "per_step": single / int(steps),
        "q_final": np.asarray(q_final),
    }


def measure_casadi(model, repeats, rtol=RTOL, atol=ATOL):
    """The same for CasADi's CVODES integrator; its compile time is its construction."""
    q0, v0 = (np.asarray(x) for x in model.initial_state())
    x0, gains = np.concatenate([q0, v0]), np.array([KD, KP])
    start = time.perf_counter()
    integrator = casadi_integrator(model, rtol, atol)
    built = time.perf_counter() - start

    def forward():
        return np.asarray(integrator(x0=x0, p=gains)["xf"]).ravel()[: q0.size]

    forward()
    q_final, single = _median_time(forward, repeats)
    steps = int(integrator.stats()["nsteps"])
    return {
        "compile": {"total": built},
        "single": single,
        "steps": steps,
        "per_step": single / steps,
        "q_final": q_final,
    }


def measure(method, model, repeats, rtol=RTOL, atol=ATOL, solver=None):
    if method == CASADI:
        return measure_casadi(model, repeats, rtol, atol)
    if method == JAXDAE_DOPRI8:
        method, solver = JAXDAE, diffrax.Dopri8()
    maker = jaxdae_functions if method == JAXDAE else handwritten_functions
    options = {"rtol": rtol, "atol": atol, "solver": solver or diffrax.Tsit5()}
    return measure_jax(lambda m: maker(m, **options), model, repeats)


# -- the runs --------------------------------------------------------------------------------


def run(families, sizes, methods, repeats, budget, compile_budget, on_row=None):
    """Each family at the sizes nearest `sizes` coordinates, by each method; `on_row(results)`
    after each size."""
    results = []
    for family in families:
        previous = dict.fromkeys(methods)
        for size in sorted({family_size(family, n) for n in sizes}):
            model = FAMILIES[family](size)
            n = int(model.initial_state()[0].size)
            row = {"family": family, "size": size, "coordinates": n, "methods": {}}
            row.update(factorization(model))
            print(f"{family} N={size}: {n} coordinates, jaxdae: {row['path']}", flush=True)
            for method in methods:
                skip, why = predicted_skip(previous[method], n, budget, compile_budget)
                if "all" in skip:
                    row["methods"][method] = {"skipped": why}
                    print(f"  {method}: skipped ({why})", flush=True)
                    continue
                start = time.perf_counter()
                result = measure(method, model, repeats)
                result["n"] = n
                row["methods"][method] = previous[method] = result
                print(
                    f"  {method}: solve {1e3 * result['single']:.4g} ms, {result['steps']} "
                    f"steps, compile {result['compile']['total']:.1f} s "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
            set_differences(row["methods"])
            results.append(row)
            if on_row is not None:
                on_row(results)
    return results


def precision_tolerances(method, tolerances) -> list[float]:
    """The `rtol` at which `method` runs in the work–precision table: `tolerances`, and for
    CasADi each decade down to `CASADI_EXTRA_DECADES` below the tightest."""
    if method != CASADI:
        return sorted(tolerances, reverse=True)
    tightest = min(tolerances)
    extra = [tightest * 10.0**-k for k in range(1, CASADI_EXTRA_DECADES + 1)]
    return sorted(set(tolerances) | set(extra), reverse=True)


def precision_run(families, sizes, tolerances, methods, repeats, budget, on_row=None):
    """The work–precision rows: one model per family of about each of `sizes` coordinates,
    each method at each of its `precision_tolerances` (`atol = rtol / 100`; tighter ones
    skipped once a solve took more than `budget / 3` seconds), its error against the
    reference."""
    rows = []
    for family in families:
        for coordinates in sizes:
            model = FAMILIES[family](family_size(family, coordinates))
            rows += _precision_of(model, family, tolerances, methods, repeats, budget, rows, on_row)
    return rows


def _precision_of(model, family, tolerances, methods, repeats, budget, done, on_row):
    """`precision_run`'s rows of one model (`done`: the rows of the models before it, which
    `on_row` receives with these)."""
    reference = measure(JAXDAE, model, 1, *REFERENCE_TOLERANCES, solver=diffrax.Dopri8())["q_final"]
    rows = []
    for method in methods:
        if method == HANDWRITTEN and reference.size > HANDWRITTEN_PRECISION_MAX:
            continue
        for rtol in precision_tolerances(method, tolerances):
            if rows and rows[-1]["method"] == method and rows[-1]["single"] > budget / 3:
                break
            result = measure(method, model, repeats, rtol, rtol / 100)
            result.update(
                family=family,
                size=model.size,
                coordinates=int(reference.size),
                method=method,
                rtol=rtol,
                error=float(np.max(np.abs(result.pop("q_final") - reference))),
            )
            rows.append(result)
            print(
                f"{family} N={model.size} {method} rtol={rtol:g}: "
                f"{1e3 * result['single']:.4g} ms, {result['steps']} steps, "
                f"error {result['error']:.1e}",
                flush=True,
            )
            if on_row is not None:
                on_row(done + rows)
    return rows


def time_at_error(runs, error) -> float | None:
    """The time of a method at `error`, interpolated log-log between its two `runs` (dicts
    with `error` and `single`) whose errors bracket it (the closest pair on each side); None
    outside their range."""
    points = sorted((r["error"], r["single"]) for r in runs if r["error"] > 0)
    for (e_low, t_low), (e_high, t_high) in zip(points, points[1:], strict=False):
        if e_low <= error <= e_high:
            if e_high == e_low:
                return min(t_low, t_high)
            weight = np.log(error / e_low) / np.log(e_high / e_low)
            return float(np.exp(np.log(t_low) + weight * np.log(t_high / t_low)))
    return None


def matched(precision) -> list[tuple]:
    """`(family, coordinates, jaxdae method, rtol, error, time, CasADi's time at that error
    or None)` for each jaxdae run of the work–precision `precision` rows."""
    out = []
    for r in precision:
        if r["method"] not in (JAXDAE, JAXDAE_DOPRI8):
            continue
        casadi = [
            c
            for c in precision
            if c["method"] == CASADI
            and (c["family"], c["coordinates"]) == (r["family"], r["coordinates"])
        ]
        out.append(
            (
                r["family"],
                r["coordinates"],
                r["method"],
                r["rtol"],
                r["error"],
                r["single"],
                time_at_error(casadi, r["error"]),
            )
        )
    return out


def growth(results, methods):
    """`(family, method, smallest n, largest n, exponent of the time per step, of the
    solve, of the time per step over the largest three sizes)`, fitted where a method ran at
    two sizes or more."""
    rows = []
    for family in dict.fromkeys(r["family"] for r in results):
        for method in methods:
            points = [
                (r["coordinates"], r["methods"][method]["per_step"], r["methods"][method]["single"])
                for r in results
                if r["family"] == family and "single" in r["methods"].get(method, {})
            ]
            if len(points) < 2:
                continue
            n, step, solve = (np.log(np.array(x)) for x in zip(*points, strict=True))
            rows.append(
                (
                    family,
                    method,
                    points[0][0],
                    points[-1][0],
                    float(np.polyfit(n, step, 1)[0]),
                    float(np.polyfit(n, solve, 1)[0]),
                    float(np.polyfit(n[-3:], step[-3:], 1)[0]),
                )
            )
    return rows


# -- tables ----------------------------------------------------------------------------------


SOLVE_COLUMNS = [
    ("family", "left"),
    ("N", "right"),
    ("coordinates", "right"),
    ("constraints", "right"),
    ("jaxdae's factorization", "left"),
    ("method", "left"),
    ("solve [ms]", "right"),
    ("steps", "right"),
    ("per step [µs]", "right"),
    ("compile [s]", "right"),
    ("max \\|Δq(1)\\| vs jaxdae", "right"),
]
GROWTH_COLUMNS = [
    ("family", "left"),
    ("method", "left"),
    ("coordinates", "right"),
    ("per step ∝ n^p", "right"),
    ("solve ∝ n^p", "right"),
    ("per step, largest three sizes", "right"),
]
PRECISION_COLUMNS = [
    ("family", "left"),
    ("coordinates", "right"),
    ("method", "left"),
    ("rtol", "right"),
    ("solve [ms]", "right"),
    ("steps", "right"),
    ("max \\|q(1) − reference\\|", "right"),
]
MATCHED_COLUMNS = [
    ("family", "left"),
    ("coordinates", "right"),
    ("jaxdae", "left"),
    ("rtol", "right"),
    ("error", "right"),
    ("jaxdae [ms]", "right"),
    ("CasADi at that error [ms]", "right"),
    ("ratio", "right"),
]


def solve_rows(results, methods):
    rows = []
    for row in results:
        for method in methods:
            r = row["methods"].get(method)
            if r is None:
                continue
            cells = [row["family"], row["size"], row["coordinates"], row["constraints"]]
            cells += [row["path"], method]
            if "skipped" in r:
                rows.append(cells + [f"skipped: {r['skipped']}", "", "", "", ""])
                continue
            rows.append(
                cells
                + [
                    f"{1e3 * r['single']:.4g}",
                    r["steps"],
                    f"{1e6 * r['per_step']:.3g}",
                    f"{r['compile']['total']:.1f}",
                    f"{r['difference']:.1e}" if "difference" in r else "–",
                ]
            )
    return rows


def growth_rows(results, methods):
    return [
        [family, method, f"{lo}–{hi}", f"{step:.2f}", f"{solve:.2f}", f"{tail:.2f}"]
        for family, method, lo, hi, step, solve, tail in growth(results, methods)
    ]


def precision_rows(rows):
    return [
        [
            r["family"],
            r["coordinates"],
            r["method"],
            f"{r['rtol']:g}",
            f"{1e3 * r['single']:.4g}",
            r["steps"],
            f"{r['error']:.1e}",
        ]
        for r in rows
    ]


def matched_rows(precision):
    return [
        [
            family,
            coordinates,
            "Dopri8" if method == JAXDAE_DOPRI8 else "Tsit5",
            f"{rtol:g}",
            f"{error:.1e}",
            f"{1e3 * time:.4g}",
            "outside CasADi's range" if casadi is None else f"{1e3 * casadi:.4g}",
            "–" if casadi is None else f"{time / casadi:.2f}",
        ]
        for family, coordinates, method, rtol, error, time, casadi in matched(precision)
    ]


def page_tables(results, precision, methods, stamp):
    """`bench_sparse.solves`, `bench_sparse.growth`, `bench_sparse.precision` and
    `bench_sparse.matched` (those with rows)."""
    tables = []
    for name, columns, rows in (
        ("solves", SOLVE_COLUMNS, solve_rows(results, methods)),
        ("growth", GROWTH_COLUMNS, growth_rows(results, methods)),
        ("precision", PRECISION_COLUMNS, precision_rows(precision)),
        ("matched", MATCHED_COLUMNS, matched_rows(precision)),
    ):
        if rows:
            tables.append(_tables.table(f"{NAME}.{name}", columns, rows, stamp))
    return tables


# -- the command line ------------------------------------------------------------------------


def _numbers(kind):
    def parse(text):
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated numbers, got {text!r}"
            ) from None
        if not values or min(values) <= 0:
            raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
        return values

    return parse


def _families(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown family {unknown or text!r}; choose from {', '.join(FAMILIES)}"
        )
    return names


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path("output"), help=f"results go to OUT/{NAME}/"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke test: about {QUICK_SIZES} coordinates, one repeat, "
        f"tolerances {QUICK_TOLERANCES} at 50 coordinates",
    )
    parser.add_argument(
        "--sizes",
        type=_numbers(int),
        default=None,
        help="coordinates, comma-separated; each family at its nearest sizes (default "
        + ",".join(map(str, DEFAULT_SIZES))
        + ")",
    )
    parser.add_argument(
        "--families",
        type=_families,
        default=list(FAMILIES),
        help="comma-separated subset of " + ",".join(FAMILIES),
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=20.0,
        help="seconds: skip a method × size whose solve is predicted to take longer",
    )
    parser.add_argument(
        "--compile-budget",
        type=float,
        default=120.0,
        help="seconds: skip the sizes after one whose compile took longer",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed calls; the median counts")
    parser.add_argument(
        "--precision-sizes",
        type=_numbers(int),
        default=None,
        help="coordinates of the work–precision models, comma-separated (default 200; --quick 50)",
    )
    parser.add_argument(
        "--tolerances",
        type=_numbers(float),
        default=None,
        help="rtol of the work–precision table (default "
        + ",".join(f"{x:g}" for x in DEFAULT_TOLERANCES)
        + "); atol = rtol / 100",
    )
    parser.add_argument(
        "--no-precision", action="store_true", help="leave out the work–precision table"
    )
    parser.add_argument(
        "--precision-only",
        action="store_true",
        help="only the work–precision and matched-accuracy tables",
    )
    args = parser.parse_args()
    if args.repeats < 1 or args.budget <= 0 or args.compile_budget <= 0:
        parser.error("--repeats must be at least 1, the budgets positive")
    if args.quick:
        args.repeats = 1
        args.sizes = args.sizes or list(QUICK_SIZES)
        args.tolerances = args.tolerances or list(QUICK_TOLERANCES)
        args.precision_sizes = args.precision_sizes or [50]
    if args.no_precision and args.precision_only:
        parser.error("--no-precision and --precision-only exclude each other")
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    args.tolerances = args.tolerances or list(DEFAULT_TOLERANCES)
    args.precision_sizes = args.precision_sizes or [200]
    return args


def main():
    args = parse_args()
    if ca is None:
        print("CasADi is not installed: its rows are left out (pip install casadi).")
    methods = [m for m in METHODS if m != CASADI or ca is not None]
    folder = output_dir(args.out, NAME)
    stamp = _tables.run_stamp()
    warm_up_jax()
    start, load = time.perf_counter(), os.getloadavg()[0]
    state = {"results": [], "precision": []}

    def report(final=False):
        header = (
            f"Baumgarte(kd={KD:g}, kp={KP:g}), t ∈ [0, {T1:g}] from rest, Tsit5, rtol={RTOL:g}, "
            f"atol={ATOL:g}, float64; medians of {args.repeats} calls; "
            f"{jax.devices()[0].device_kind}; load {load:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} now; jax {jax.__version__}"
            + (f", casadi {ca.__version__}" if ca is not None else "")
            + f"; budget {args.budget:g} s per solve; {time.perf_counter() - start:.0f} s in all."
        )
        tables = page_tables(state["results"], state["precision"], methods, stamp)
        rows = [
            {
                **row,
                "methods": {
                    m: {k: x for k, x in r.items() if k != "q_final"}
                    for m, r in row["methods"].items()
                },
            }
            for row in state["results"]
        ]
        write_json(
            folder / f"{NAME}.json",
            {
                "header": header,
                "results": rows,
                "precision": state["precision"],
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "complete": final,
            },
        )
        if tables:
            _tables.write(args.out, NAME, tables)
        if final:
            print("\n" + header)
            for data in tables:
                print(f"\n{data['name']}\n\n" + _tables.render(data))

    if not args.precision_only:
        state["results"] = run(
            args.families,
            args.sizes,
            methods,
            args.repeats,
            args.budget,
            args.compile_budget,
            on_row=lambda results: (state.update(results=results), report()),
        )
    if not args.no_precision:
        precision_methods = [JAXDAE, JAXDAE_DOPRI8] + [m for m in methods if m != JAXDAE]
        state["precision"] = precision_run(
            args.families,
            args.precision_sizes,
            args.tolerances,
            precision_methods,
            args.repeats,
            args.budget,
            on_row=lambda rows: (state.update(precision=rows), report()),
        )
    report(final=True)
    print(f"\nwrote {folder / (NAME + '.json')} and {args.out / NAME / 'tables.json'}")


if __name__ == "__main__":
    main()
