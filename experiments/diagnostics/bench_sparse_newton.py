"""`jaxdae.GeneralizedAlpha` on meshes of bars (`jaxdae/examples/_meshes.py`) with its
Newton matrix on the sparse LU factorization (`_compilation/_supernodal_lu.py`) against the
dense inverse, in one process: compile time, solve time, steps and matrix builds, the
gradient of the final positions' squared norm w.r.t. gravity (the default discrete
adjoint), and the largest difference of the two paths' results. "LU factors traced" says
whether the plan chose the sparse factorization for the Newton matrix (where it does not,
both rows run the dense inverse). The path measured second reuses what the first traced
(the patterns' analyses, the plans): compare compile times from `--paths sparse` and
`--paths dense` in separate processes.

The dense path is the same code with `saddle_point_plan` declining every plan
(`DENSE_WORK_FACTOR = 0`): the dense inverse (LAPACK beyond `LOOPED_INVERSE_MAX`). Both
factorize the error estimate's `G M⁻¹ Gᵀ` on its pattern. Each model is solved from rest
over `t ∈ [0, --t1]` at `rtol = 1e-6`, `atol = 1e-8`; times are medians of `--repeats`
calls after a first.

    .venv/bin/python experiments/diagnostics/bench_sparse_newton.py
        [--models square:10,cloth:12] [--t1 1.0] [--repeats 3] [--gradient]
        [--paths sparse,dense]
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae import _thresholds
from jaxdae._compilation._supernodal_lu import saddle_point_plan
from jaxdae._integration import _generalized_alpha_newton
from jaxdae.examples._meshes import FAMILIES

jax.config.update("jax_enable_x64", True)


def _timed(fn, *args, repeats):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_time = time.perf_counter() - start
    out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return out, compile_time, float(np.median(times))


def measure(system, t1, repeats, gradient):
    """`{compile, solve, steps, builds, q, [gradient_compile, gradient, dgravity]}`."""
    q0, v0 = system.initial_state()

    def solve(gravity):
        model = eqx.tree_at(lambda s: s.gravity, system, gravity)
        sol = jaxdae.simulate(
            model,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            t1,
            q0,
            v0,
            ts=jnp.array([t1]),
            solver=jaxdae.GeneralizedAlpha(),
            rtol=1e-6,
            atol=1e-8,
        )
        return sol.q[-1], sol.stats["num_steps"]

    (q, steps), compile_time, solve_time = _timed(solve, system.gravity, repeats=repeats)
    row = dict(compile=compile_time, solve=solve_time, steps=int(steps), q=np.asarray(q))
    if gradient:

        def loss(gravity):
            return jnp.sum(solve(gravity)[0] ** 2)

        g, g_compile, g_time = _timed(jax.grad(loss), system.gravity, repeats=repeats)
        row.update(gradient_compile=g_compile, gradient=g_time, dgravity=float(g))
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="square:10,cloth:12")
    parser.add_argument("--t1", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gradient", action="store_true")
    parser.add_argument("--paths", default="sparse,dense")
    args = parser.parse_args()
    dense_factor = _thresholds.DENSE_WORK_FACTOR
    traced = []  # the sparse factorizations traced by the Newton iteration
    original = _generalized_alpha_newton.supernodal_lu
    _generalized_alpha_newton.supernodal_lu = lambda *a: traced.append(1) or original(*a)
    print(
        "| model | coordinates | unknowns | path | compile (s) | solve (s) | steps "
        + ("| gradient compile (s) | gradient (s) " if args.gradient else "")
        + "| LU factors traced | difference |"
    )
    print("| --- " * (9 + 2 * args.gradient) + "|")
    for spec in args.models.split(","):
        family, size = spec.split(":")
        system = FAMILIES[family](int(size))
        q0, _ = system.initial_state()
        unknowns = q0.size + system.constraints(0.0, q0).size
        rows = {}
        paths = {"sparse": ("sparse LU", dense_factor), "dense": ("dense inverse", 0.0)}
        for path, factor in (paths[p] for p in args.paths.split(",")):
            _thresholds.DENSE_WORK_FACTOR = factor
            saddle_point_plan.cache_clear()
            traced.clear()
            rows[path] = measure(system, args.t1, args.repeats, args.gradient)
            rows[path]["traced"] = bool(traced)
        _thresholds.DENSE_WORK_FACTOR = dense_factor
        saddle_point_plan.cache_clear()
        for path, row in rows.items():
            other = rows.get("dense inverse", row)
            difference = np.abs(row["q"] - other["q"]).max()
            if args.gradient:
                difference = max(difference, abs(row["dgravity"] - other["dgravity"]))
            gradient = (
                f"| {row['gradient_compile']:.1f} | {row['gradient']:.3f} " if args.gradient else ""
            )
            print(
                f"| {family} {size} | {q0.size} | {unknowns} | {path} | {row['compile']:.1f} "
                f"| {row['solve']:.3f} | {row['steps']} {gradient}| {row['traced']} "
                f"| {difference:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
