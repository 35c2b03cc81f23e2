"""Where a test run's time goes: XLA compiles and seconds of tracing, lowering and XLA
compile per test, from `jax.monitoring`'s events.

As a pytest plugin (each process, xdist workers included, writes its own table of rows):

    PYTHONPATH=experiments/diagnostics .venv/bin/python -m pytest -q -p compile_counts \\
        tests/test_events.py
    .venv/bin/python experiments/diagnostics/compile_counts.py output/compile_counts/*.tsv

The second command sums the rows per file, longest first; `--tests 20` lists the 20 longest
tests instead. `COMPILE_COUNTS_DIR` sets the folder (default `output/compile_counts`).

The counts do not depend on the machine's load, the seconds do. The trace events of nested
`jit`s nest, so the trace seconds count some time twice. A program that a file no longer
compiles may be compiled by the next file in the same process that needs it (eager
operations on equal shapes compile once per process): compare whole runs, not files alone.
"""

import argparse
import collections
import csv
import os
import time
from pathlib import Path

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "xla",
}
_COLUMNS = ("compiles", "trace", "lower", "xla", "wall")
_rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_current = {"test": "<collection>", "start": 0.0, "controller": False}


def _listener(event, duration, **_):
    phase = _EVENTS.get(event)
    if phase is None:
        return
    row = _rows[_current["test"]]
    row[phase] += duration
    row["compiles"] += phase == "xla"


def pytest_configure(config):
    # The controller of `pytest -n N` runs no test (it only relays the workers' reports).
    worker = "PYTEST_XDIST_WORKER" in os.environ
    _current["controller"] = bool(config.getoption("numprocesses", default=None)) and not worker
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_listener)


def pytest_runtest_logstart(nodeid, location):
    _current.update(test=nodeid, start=time.perf_counter())


def pytest_runtest_logfinish(nodeid, location):
    _rows[nodeid]["wall"] += time.perf_counter() - _current["start"]
    _current["test"] = "<between tests>"


def pytest_sessionfinish(session, exitstatus):
    if _current["controller"]:
        return
    folder = Path(os.environ.get("COMPILE_COUNTS_DIR", "output/compile_counts"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(folder / f"{worker}-{os.getpid()}.tsv", "w", newline="") as file:
        writer = csv.writer(file, delimiter="\t")
        writer.writerow(("test", *_COLUMNS))
        for test, row in _rows.items():
            writer.writerow((test, row["compiles"], *(f"{row[c]:.3f}" for c in _COLUMNS[1:])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", type=Path, help="the plugin's .tsv files")
    parser.add_argument("--tests", type=int, default=0, help="list the N longest tests")
    args = parser.parse_args()
    rows = []
    for path in args.tables:
        with open(path, newline="") as file:
            rows += list(csv.DictReader(file, delimiter="\t"))
    if args.tests:
        rows.sort(key=lambda r: -float(r["wall"]))
        groups = [(r["test"], [r]) for r in rows[: args.tests]]
    else:
        by_file = collections.defaultdict(list)
        for r in rows:
            by_file[r["test"].split("::")[0]].append(r)
        groups = sorted(by_file.items(), key=lambda g: -sum(float(r["wall"]) for r in g[1]))
    print(f"{'':60s} {'compiles':>8s} {'trace':>7s} {'lower':>7s} {'xla':>7s} {'wall':>7s}")
    for name, group in groups:
        sums = [sum(float(r[c]) for r in group) for c in _COLUMNS]
        print(f"{name[-60:]:60s} {int(sums[0]):8d} " + " ".join(f"{x:7.1f}" for x in sums[1:]))


if __name__ == "__main__":
    main()
