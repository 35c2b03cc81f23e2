import os

# XLA's code generation in every test process, unless `JAXDAE_TEST_OPTIMIZE=1`: LLVM's
# optimization level 0 and XLA:CPU's elemental emitters in place of its fusion emitters. The
# default run is mostly compiling small programs, which these settings compile in about half
# the time (the fusion emitters alone take half of a solve's compile), and they compute the
# same values to rounding. Speed is measured by the benchmarks, never by these tests.
# `make test-slow` keeps XLA's defaults: at level 0, separately compiled programs round
# alike, which hides what some slow tests look for. Set before JAX starts a backend; each
# joins any `XLA_FLAGS` given unless that names it, and test subprocesses inherit them.
# (Importing JAX starts no backend: the options may follow it.) The switch of the emitters
# is XLA:CPU's up to JAX 0.10; JAX 0.11's XLA no longer knows it, and an option that XLA does
# not know aborts the process.
import jax

if os.environ.get("JAXDAE_TEST_OPTIMIZE") != "1":
    _OPTIONS = ["--xla_backend_optimization_level=0"]
    if jax.__version_info__ < (0, 11):
        _OPTIONS.append("--xla_cpu_use_fusion_emitters=false")
    for _option in _OPTIONS:
        if _option.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_option}".strip()

jax.config.update("jax_enable_x64", True)
# Four host CPU devices in every test process (set before any backend starts), so that the
# sharded batch tests (tests/test_batch.py) run on a real multi-device mesh. Computations
# that are not sharded still run on one device.
jax.config.update("jax_num_cpu_devices", 4)
# Reuse compiled XLA programs across test processes and runs. JAX does not store programs
# with host callbacks (every `simulate` has them: its traced checks), so this saves the
# compiles of the smaller helpers only.
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get(
        "JAXDAE_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "jax")
    ),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

import jaxtyping  # noqa: E402
import pytest  # noqa: E402

# jaxtyping checks jaxdae's annotations (shapes and dtypes, consistent across each call's
# arguments and return) with beartype on every call, as diffrax's and equinox's tests do,
# unless `JAXDAE_TYPECHECK=0`. The hook rewrites the modules of `jaxdae` as they are imported,
# so it is installed before jaxdae's first import and stays installed for the subpackages
# imported later. Test subprocesses import jaxdae without it. beartype takes an `int` for a
# `float`, as PEP 484 and pyright do.
#
# The scalar-graph builder is left out: its helpers take Python values, not arrays, and run
# tens of thousands of times per trace, where the checks' wrapper (a signature bound per
# call) made each trace of `simulate` about 40 % longer.
_UNCHECKED = ("jaxdae._compilation._scalarize",)


def _checked_modules() -> list[str]:
    """jaxdae's modules for the hook: all but `_UNCHECKED`. The hook matches a name and
    everything under it, so the packages above an unchecked module are left out too (their
    `__init__` files define no functions) and their other modules are listed one by one."""
    root = os.path.join(os.path.dirname(__file__), "..", "jaxdae")
    names = []
    for folder, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f != "__pycache__"]
        relative = os.path.relpath(folder, root)
        package = ".".join(["jaxdae", *([] if relative == "." else relative.split(os.sep))])
        for file in files:
            if file.endswith(".py"):
                names.append(package if file == "__init__.py" else f"{package}.{file[:-3]}")
    return [
        name for name in names if not any(u == name or u.startswith(name + ".") for u in _UNCHECKED)
    ]


def pytest_configure(config):
    """Installs the hook and imports jaxdae, in each process that runs tests. The controller
    of a `pytest -n N` run runs none, and its import would delay the workers' start."""
    if config.getoption("numprocesses", default=None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return
    if os.environ.get("JAXDAE_TYPECHECK") != "0":
        typechecker = "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"
        jaxtyping.install_import_hook(_checked_modules(), typechecker)
    # jaxdae before any test module: its XLA option must be set before something (some
    # diffrax releases, on import) starts JAX's backend.
    import jaxdae  # noqa: F401


# Files go to the two `make test` workers longest first (with `--no-loadscope-reorder` in
# this order), so that the last ones handed out are short and both workers finish together
# (longest-processing-time-first). Ordered by the sum of each file's test durations in the
# default run (`python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
# --durations=0`, summed per file); the files whose tests are all `slow` close the list. A
# file not listed runs first: its length is unknown, and a long file handed out last leaves
# the other worker idle. Re-measure and reorder when a file grows.
_ORDER = (
    "test_time_stepping.py",
    "test_faults_inputs.py",
    "test_failure_steps.py",
    "test_friction_spatial.py",
    "test_adjoint.py",
    "test_implicit_adjoint.py",
    "test_xla_flags.py",
    "test_projection.py",
    "test_faults_success.py",
    "test_structure.py",
    "test_supernodal.py",
    "test_meshes.py",
    "test_viz_plots.py",
    "test_faults_jobs.py",
    "test_core.py",
    "test_events.py",
    "test_linalg.py",
    "test_rosenbrock.py",
    "test_multibody_urdf.py",
    "test_declared_capabilities.py",
    "test_supernodal_lu.py",
    "test_multibody_spatial.py",
    "test_references.py",
    "test_actuated.py",
    "test_viz_animate.py",
    "test_nonholonomic.py",
    "test_extending.py",
    "test_linear_solvers.py",
    "test_errors.py",
    "test_ball_and_beam.py",
    "test_faults.py",
    "test_scaling_models.py",
    "test_restart.py",
    "test_redundant_coordinates.py",
    "test_friction.py",
    "test_scalarize.py",
    "test_constants.py",
    "test_tune.py",
    "test_multibody_tree.py",
    "test_docs.py",
    "test_esdirk_adjoint.py",
    "test_ensemble.py",
    "test_solvers.py",
    "test_stored_loop.py",
    "test_batch.py",
    "test_rolling_disc.py",
    "test_multibody.py",
    "test_implicit.py",
    "test_lqr.py",
    "test_faults_batches.py",
    "test_hamiltonian.py",
    "test_faults_models.py",
    "test_generalized_alpha_residual.py",
    "test_private_apis.py",
    "test_multibody_groups.py",
    "test_faults_viz.py",
    "test_kernels.py",
    "test_viz_viewer.py",
    "test_multibody_stops.py",
    "test_architecture.py",
    "test_realizing_forces.py",
    "test_faults_multibody.py",
    "test_typechecks.py",
    "test_bench_stiff.py",
    "test_contact_gradients.py",
    "test_faults_contacts.py",
    "test_generalized_alpha_adjoint.py",
    "test_multihost.py",
    "test_notebooks.py",
    "test_singular_passages.py",
)


@pytest.fixture
def on_cpu():
    """The test's computations on the host CPU, whatever JAX's default backend (a GPU
    machine's included): for tests that read the program XLA:CPU compiles."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def unchecked():
    """No annotation checks in this test: for tests of the errors that jaxdae raises for
    arguments of the wrong type, which the checks would refuse first."""
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, -1))
