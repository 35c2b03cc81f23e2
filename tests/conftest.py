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
