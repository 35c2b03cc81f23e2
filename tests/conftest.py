import os

import jax

jax.config.update("jax_enable_x64", True)
# Reuse compiled XLA programs across test processes and runs.
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAXDAE_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "jax")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
