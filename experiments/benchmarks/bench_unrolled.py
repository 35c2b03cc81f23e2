"""`jaxdae.UnrolledERK(diffrax.Tsit5())` against diffrax's `Tsit5` (stages in a loop).

Mukharlyamov and Deressa's (2015) two-link example, `ModifiedLagrange(10, [20, 10], [100, 25])`, t ∈
[0, 2], default tolerances, float64. Loss `Σ q(2)² + |Φ(2)|²` (mean over a batch); gradient w.r.t.
the five gains. Rows: one trajectory; `jax.vmap(jaxdae.simulate)` and `jaxdae.simulate_ensemble`
over `--batch` initial states perturbed by 1e-3. Each function is compiled first (compile + first
call reported), then all are timed in turn (interleaved), and the table reports the minimum
over repetitions: on shared virtual cores the minimum is the steadiest estimate of the cost.

    python experiments/benchmarks/bench_unrolled.py [--batch 256] [--repeats 11]
"""

import argparse
import time

import diffrax
import jax
import jax.numpy as jnp

import jaxdae
from jaxdae.examples import TwoLinkManipulator


def _losses(system, q0s, v0s, solver):
    def one(formulation, q0, v0):
        sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, solver=solver)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    def ensemble(formulation):
        sol = jaxdae.simulate_ensemble(system, formulation, 0.0, 2.0, q0s, v0s, solver=solver)
        return jnp.mean(jnp.sum(sol.q_final**2, axis=-1) + jnp.sum(sol.phi[:, -1] ** 2, axis=-1))

    return {
        "one trajectory": lambda f: one(f, q0s[0], v0s[0]),
        "`jax.vmap(simulate)`": lambda f: jnp.mean(
            jax.vmap(one, in_axes=(None, 0, 0))(f, q0s, v0s)
        ),
        "`simulate_ensemble`": ensemble,
    }


def main(batch: int = 256, repeats: int = 11):
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    q0s = q0 + 1e-3 * jax.random.normal(jax.random.key(0), (batch, 2), q0.dtype)
    v0s = jnp.broadcast_to(v0, (batch, 2))
    formulation = jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    solvers = {
        "diffrax Tsit5": diffrax.Tsit5(),
        "UnrolledERK(Tsit5)": jaxdae.UnrolledERK(diffrax.Tsit5()),
    }
    fns, compile_s = {}, {}
    for solver_name, solver in solvers.items():
        for row, loss in _losses(system, q0s, v0s, solver).items():
            for kind, fn in (("forward", jax.jit(loss)), ("gradient", jax.jit(jax.grad(loss)))):
                start = time.perf_counter()
                jax.block_until_ready(fn(formulation))
                compile_s[row, solver_name, kind] = time.perf_counter() - start
                fns[row, solver_name, kind] = fn
    times = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            inner = 10 if key[0] == "one trajectory" else 2
            start = time.perf_counter()
            for _ in range(inner):
                out = fn(formulation)
            jax.block_until_ready(out)
            times[key].append((time.perf_counter() - start) / inner)
    ms = {key: 1e3 * min(values) for key, values in times.items()}
    print(
        f"device: {jax.devices()[0].platform}; batch {batch}; minimum of {repeats} interleaved "
        "repetitions\n"
    )
    print(
        "| run | solver | forward [ms] | gradient [ms] | gradient / forward "
        "| compile forward [s] | compile gradient [s] |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in _losses(system, q0s, v0s, None):
        for solver_name in solvers:
            fwd, grad = ms[row, solver_name, "forward"], ms[row, solver_name, "gradient"]
            print(
                f"| {row} | {solver_name} | {fwd:.3f} | {grad:.3f} | {grad / fwd:.1f} | "
                f"{compile_s[row, solver_name, 'forward']:.2f} | "
                f"{compile_s[row, solver_name, 'gradient']:.2f} |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=11)
    main(**vars(parser.parse_args()))
