# Two entry points (see README): `make demo` and `make test`. Each sets up its own venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOWEST := .venv-lowest
LOWEST_TESTS := tests/test_private_apis.py tests/test_xla_flags.py tests/test_linalg.py tests/test_core.py tests/test_lqr.py \
	tests/test_tune.py::test_tuning_decreases_loss tests/test_tune.py::test_losses_on_a_solution
# uv installs the packages without bytecode, and with PYTHONDONTWRITEBYTECODE set (as on
# some CI machines) each test process, and each subprocess a test starts, would compile
# JAX, SciPy and jaxdae from source again; make lets Python write its bytecode caches.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help demo lint test test-slow test-perf test-lowest bench docs clean
.DEFAULT_GOAL := help

## List the targets, one line each (`make` alone does this).
help:
	@awk '/^## /{doc = doc (doc ? " " : "") substr($$0, 4); next} \
	     /^[A-Za-z][A-Za-z0-9_-]*:/{if (doc) {sub(/:.*/, "", $$1); printf "  make %-11s %s\n", $$1, doc}} \
	     {doc = ""}' $(firstword $(MAKEFILE_LIST))

# uv installs the locked packages in parallel and compiles no bytecode ahead (Python
# compiles what it imports), a fraction of pip's time; pip where uv cannot be installed or
# cannot install them (uv reads no pip configuration, such as a local package index).
$(STAMP): pyproject.toml requirements-lock.txt
	$(PYTHON) -m venv $(VENV)
	( $(PY) -m pip install --quiet -c requirements-lock.txt uv && \
	  $(VENV)/bin/uv pip install --quiet --python $(PY) -c requirements-lock.txt -e ".[dev]" ) || \
	( $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet -c requirements-lock.txt -e ".[dev]" )
	touch $(STAMP)

## Reproduce the papers' worked examples: figures + output/SUMMARY.md
## (ARGS=--quick: a smoke test; ARGS="--only NAME[,NAME]"; ARGS=--help).
demo: $(STAMP)
	$(PY) experiments/run_all.py --out output $(ARGS)

## Lint (ruff), check the formatting (ruff format) and type-check (pyright) the code; the
## configuration is in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

## The lint and the fast tests (`slow` and `perf` excluded): ruff first, then pyright beside
## the tests (its report printed after theirs); fails if any of the three fails.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright > $(VENV)/pyright.log 2>&1 & pyright=$$!; \
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder; tests=$$?; \
	wait $$pyright; typed=$$?; cat $(VENV)/pyright.log; \
	if [ $$tests -ne 0 ]; then exit $$tests; fi; exit $$typed

## The long tests only, compiled at XLA's default optimization (the default run compiles at
## level 0; some slow tests need the rounding of optimized programs).
test-slow: $(STAMP)
	JAXDAE_TEST_OPTIMIZE=1 $(PY) -m pytest -q -n 2 -m slow

## The performance guards only: they pin private details (jit cache sizes, traced programs).
test-perf: $(STAMP)
	$(PY) -m pytest -q -m perf

$(LOWEST)/.installed: pyproject.toml requirements-lowest.txt
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet --upgrade pip
	$(LOWEST)/bin/python -m pip install --quiet -c requirements-lowest.txt -e ".[test]"
	touch $@

## The lowest supported dependency versions (requirements-lowest.txt, in .venv-lowest/) on a
## subset of the tests: the private-API checks, import settings, linear algebra, simulation,
## LQR and tuning.
test-lowest: $(LOWEST)/.installed
	JAXDAE_TEST_CACHE=.cache/jax-lowest $(LOWEST)/bin/python -m pytest -q -p no:xdist $(LOWEST_TESTS)

## Benchmarks against SciPy, CasADi, MuJoCo/MJX, Exudyn and IDA (prints Markdown tables, writes JSON to output/, renders the tables of docs/benchmarks.md that it measures; see that page).
bench: $(STAMP)
	$(PY) experiments/benchmarks/bench_core.py --out output
	$(PY) experiments/benchmarks/bench_batch.py --out output
	$(PY) experiments/benchmarks/bench_adjoint.py --out output
	$(PY) experiments/benchmarks/bench_compile.py --out output
	$(PY) experiments/benchmarks/bench_compile.py --model ball --repeats 1 --out output
	$(PY) experiments/benchmarks/bench_compile.py --model urdf-arm --repeats 1 --out output
	$(PY) experiments/benchmarks/bench_solves.py --out output
	$(PY) experiments/benchmarks/bench_unrolled.py --out output
	$(PY) experiments/benchmarks/bench_precision.py --out output
	$(PY) experiments/benchmarks/bench_scaling.py --out output
	$(PY) experiments/benchmarks/bench_sparse.py --out output
	$(PY) experiments/benchmarks/bench_events.py --out output
	$(PY) experiments/benchmarks/bench_robots.py --out output
	$(PY) experiments/benchmarks/bench_animate.py --out output
	$(PY) experiments/benchmarks/bench_viewer.py --out output
	OPENBLAS_NUM_THREADS=1 $(PY) experiments/benchmarks/bench_multibody.py --out output
	$(PY) experiments/benchmarks/bench_stiff.py --out output
	$(PY) experiments/render_benchmarks.py --collect output

## Build the documentation site into site/ (mkdocs --strict: a warning fails the build).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

## Remove the virtual environments, output/ and the built site/.
clean:
	rm -rf $(VENV) $(LOWEST) output site
