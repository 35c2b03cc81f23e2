import sys
import time

sys.path.insert(0, "experiments/benchmarks")
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
from bench_batch import jaxdae_batch, params_of

for dtype in (jnp.float32, jnp.float64):
    fwd = jaxdae_batch(dtype)["ensemble"][0]
    for B in (4096, 1_000_000, 10_000_000):
        q0 = jnp.ones((B, 2), dtype) * jnp.array([1.9, 1.2], dtype)
        v0 = jnp.zeros((B, 2), dtype)
        t = time.perf_counter()
        low = jax.jit(fwd).lower(params_of(dtype), q0, v0)
        t1 = time.perf_counter()
        c = low.compile()
        t2 = time.perf_counter()
        jax.block_until_ready(c(params_of(dtype), q0, v0))
        t3 = time.perf_counter()
        jax.block_until_ready(c(params_of(dtype), q0, v0))
        t4 = time.perf_counter()
        print(
            f"{jnp.dtype(dtype).name} B={B}: trace+lower {t1 - t:.2f} s, XLA {t2 - t1:.2f} s, run "
            f"{t4 - t3:.3f} s",
            flush=True,
        )
