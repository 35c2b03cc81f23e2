import os

import jax

jax.config.update("jax_enable_x64", True)
# Four host CPU devices in every test process (set before any backend starts), so that the
# sharded batch tests (tests/test_batch.py) run on a real multi-device mesh. Computations
# that are not sharded still run on one device.
jax.config.update("jax_num_cpu_devices", 4)
# Reuse compiled XLA programs across test processes and runs.
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAXDAE_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "jax")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

# Files that take longest go first (with `--no-loadscope-reorder`, `make test` hands files to
# the two workers in this order): started last, the notebooks (≈ 2.5 min on one worker) left
# the other worker idle for a minute or more.
_FIRST = ("test_notebooks.py", "test_core.py", "test_actuated.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(_FIRST)))
