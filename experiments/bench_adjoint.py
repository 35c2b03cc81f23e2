"""Gradient cost vs diffrax checkpoints: `adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=N)`.

Paper 004's two-link example, `ModifiedLagrange(10, [20, 10], [100, 25])`, t ∈ [0, 2], default
tolerances; gradient of `Σ q(2)² + |Φ(2)|²` w.r.t. the formulation. More checkpoints mean less
recomputation in the backward pass (and less to compile) but memory of about
`checkpoints × (size of the solver's loop state)` per trajectory — multiplied by the batch
size under `vmap`, which is why jaxdae keeps diffrax's default (`log(max_steps)`).

    python experiments/bench_adjoint.py
"""

import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae.examples import TwoLinkManipulator


def _median_ms(fn, *args, repeats=15):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main():
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    formulation = jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    forward = jax.jit(lambda q: jaxdae.simulate(system, formulation, 0.0, 2.0, q, v0).q[-1])
    jax.block_until_ready(forward(q0))
    forward_ms = _median_ms(forward, q0)
    print(f"forward: {forward_ms:.2f} ms (device {jax.devices()[0].platform})\n")
    print("| adjoint | compile + first call [s] | gradient [ms] | gradient / forward |")
    print("| --- | ---: | ---: | ---: |")
    for checkpoints in (None, 256, 4096):
        adjoint = diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints)

        def loss(f, q):
            sol = jaxdae.simulate(system, f, 0.0, 2.0, q, v0, adjoint=adjoint)
            return jnp.sum(sol.q[-1] ** 2) + jnp.sum(sol.phi[-1] ** 2)

        grad = eqx.filter_jit(eqx.filter_grad(loss))
        start = time.perf_counter()
        jax.block_until_ready(grad(formulation, q0))
        compile_s = time.perf_counter() - start
        grad_ms = _median_ms(grad, formulation, q0)
        name = "default (log(max_steps))" if checkpoints is None else f"checkpoints={checkpoints}"
        print(f"| {name} | {compile_s:.2f} | {grad_ms:.1f} | {grad_ms / forward_ms:.1f} |")


if __name__ == "__main__":
    main()
