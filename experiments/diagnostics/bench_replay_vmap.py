"""`jax.vmap(jax.grad(...))` of a solve differentiated by `jaxdae.ReplayAdjoint`, whose
members take different numbers of steps: compile time, run time, and the largest relative
difference from the members' gradients one by one.

The solve: a Van der Pol oscillator, `μ` from 1 to 30 across the batch (52 to 90 steps),
`jaxdae.Rodas5P` from `y0 = (2, 0)` over `t ∈ [0, 3]` at `rtol = 10⁻⁸`, `atol = 10⁻¹⁰`,
six saved states (inside the steps), `max_steps = 2048`; the loss is the sum of their
squares. Run time is the median of `--repeats` calls of the compiled batch.

    python experiments/diagnostics/bench_replay_vmap.py [--batch 64] [--stored-steps 4096]
    # compare checkouts: PYTHONPATH=<checkout> python experiments/diagnostics/...
"""

import argparse
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae


def van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def loss(mu, stored_steps: int):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(van_der_pol),
        jaxdae.Rodas5P(),
        0.0,
        3.0,
        0.01,
        jnp.array([2.0, 0.0]),
        args=mu,
        saveat=diffrax.SaveAt(ts=jnp.linspace(0.5, 3.0, 6)),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
        max_steps=2048,
        adjoint=jaxdae.ReplayAdjoint(stored_steps=stored_steps),
    )
    return jnp.sum(sol.ys**2), sol.stats["num_accepted_steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--stored-steps", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    mus = jnp.linspace(1.0, 30.0, options.batch)
    grad = jax.grad(lambda mu: loss(mu, options.stored_steps), has_aux=True)
    start = time.perf_counter()
    batched = jax.jit(jax.vmap(grad)).lower(mus).compile()
    compile_s = time.perf_counter() - start
    gradients, steps = jax.block_until_ready(batched(mus))
    times = []
    for _ in range(options.repeats):
        start = time.perf_counter()
        jax.block_until_ready(batched(mus))
        times.append(time.perf_counter() - start)
    one = jax.jit(grad)
    members = range(0, options.batch, max(1, options.batch // 8))
    difference = max(
        abs(float(one(mus[i])[0]) - float(gradients[i])) / abs(float(gradients[i]))
        for i in members
    )
    print(
        f"batch {options.batch}, {int(steps.min())}–{int(steps.max())} steps: "
        f"compile {compile_s:.1f} s, run {1e3 * np.median(times):.1f} ms, "
        f"largest relative difference from one by one {difference:.1e}"
    )


if __name__ == "__main__":
    main()
