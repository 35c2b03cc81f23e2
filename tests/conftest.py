import os

import jax

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
    os.environ.get("JAXDAE_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "jax")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

# jaxdae before any test module: its XLA option must be set before something (some diffrax
# releases, on import) starts JAX's backend.
import jaxdae  # noqa: E402, F401

# Files go to the two `make test` workers longest first (with `--no-loadscope-reorder` in
# this order), so that the last ones handed out are short and both workers finish together
# (longest-processing-time-first). Order by each file's time on a cold compilation cache,
# as on CI; a file not listed runs last. Re-measure and reorder when a file grows.
_ORDER = (
    "test_notebooks.py", "test_events.py", "test_friction.py", "test_multibody_spatial.py", "test_multibody.py", "test_implicit.py",
    "test_core.py", "test_structure.py", "test_linear_solvers.py", "test_projection.py",
    "test_faults.py",
    "test_multibody_urdf.py", "test_multibody_tree.py", "test_multibody_stops.py",
    "test_viz_plots.py",
    "test_viz_animate.py", "test_viz_viewer.py",
    "test_actuated.py", "test_ensemble.py", "test_faults_jobs.py",
    "test_nonholonomic.py", "test_ball_and_beam.py", "test_tune.py",
    "test_redundant_coordinates.py", "test_hamiltonian.py", "test_scalarize.py",
    "test_realizing_forces.py", "test_batch.py", "test_adjoint.py", "test_references.py",
    "test_solvers.py", "test_xla_flags.py", "test_scaling_models.py", "test_docs.py",
    "test_lqr.py", "test_errors.py", "test_linalg.py", "test_private_apis.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, len(_ORDER)))
