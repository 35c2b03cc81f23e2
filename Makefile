# Two entry points (see README): `make demo` and `make test`. Each sets up its own venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench clean

$(STAMP): pyproject.toml requirements-lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements-lock.txt -e ".[dev]"
	touch $(STAMP)

## Reproduce every paper's worked example: figures + SUMMARY.md in output/.
demo: $(STAMP)
	$(PY) experiments/run_all.py --out output

## Default test run (fast; `slow` tests excluded).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

## The long tests only.
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

## Benchmarks against SciPy and CasADi (prints Markdown tables, writes JSON to output/; see docs/benchmarks.md).
bench: $(STAMP)
	$(PY) experiments/bench_core.py --out output
	$(PY) experiments/bench_batch.py --out output
	$(PY) experiments/bench_adjoint.py
	$(PY) experiments/bench_compile.py
	$(PY) experiments/bench_solves.py
	$(PY) experiments/bench_unrolled.py
	$(PY) experiments/bench_precision.py --out output

clean:
	rm -rf $(VENV) output
