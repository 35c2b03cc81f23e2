"""Benchmark: float32 accuracy and speed of jaxdae's full-precision matrix products.

On GPUs JAX multiplies float32 matrices in TF32 by default (a 10-bit mantissa); jaxdae's
functions trace their products at full precision instead (`jaxdae/_compilation/_linalg.py`,
`full_precision`), unless the user sets a precision. This script compares, in float32:

- jaxdae's default (full precision) against the products in TF32, obtained by setting
  `jax.default_matmul_precision("tensorfloat32")` (JAX's GPU default, which jaxdae keeps when
  the user asks for it);
- on `jaxdae.lqr` (a random 4-state, 2-input problem) and on `jaxdae.simulate` of a chain of
  12 point masses (24 coordinates, 12 constraints, `Baumgarte(10, 25)`, `t ∈ [0, 1]`,
  `rtol=1e-5, atol=1e-7`; too large for a scalar graph, so its products stay matrix
  products), a `vmap` batch of 1,024 perturbed states;
- error: max relative difference from the float64 result; steps: the solver's steps per
  trajectory; time: median of 5 calls of the compiled batch.

On the CPU the two rows agree (XLA's CPU backend has no TF32); run it on a GPU.

    python experiments/benchmarks/bench_precision.py [--out output]
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import output_dir, parse_args, write_json  # noqa: E402
from _tables import run_stamp, table, write  # noqa: E402

import jaxdae  # noqa: E402

NAME = "bench_precision"
PRECISIONS = {"full (jaxdae's default)": None, "TF32 (JAX's GPU default)": "tensorfloat32"}


class Chain(jaxdae.LagrangianSystem):
    """k unit point masses in a vertical plane, joined by unit links to each other and the
    origin."""

    links: int

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * jnp.sum(q[1::2])

    def constraints(self, t, q):
        points = q.reshape(-1, 2)
        previous = jnp.concatenate([jnp.zeros((1, 2), q.dtype), points[:-1]])
        return jnp.sum((points - previous) ** 2, axis=1) - 1.0

    def hanging_state(self):
        angles = jnp.linspace(0.3, 1.0, self.links)
        points = jnp.cumsum(jnp.stack([jnp.sin(angles), -jnp.cos(angles)], axis=1), axis=0)
        return points.reshape(-1), jnp.zeros(2 * self.links)


def lqr_problem(dtype):
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(4, 4)), rng.normal(size=(4, 2))
    q, r = np.eye(4) + 0.1 * np.ones((4, 4)), np.array([[2.0, 0.3], [0.3, 1.0]])
    return tuple(jnp.asarray(x, dtype) for x in (a, b, q, r))


def chain_batch(dtype, size):
    system = Chain(links=12)
    q0, v0 = system.hanging_state()
    noise = np.random.default_rng(0).normal(scale=1e-2, size=(size, q0.shape[0]))
    qs, vs = jnp.asarray(q0 + noise, dtype), jnp.asarray(np.tile(v0, (size, 1)), dtype)
    rtol, atol = (1e-5, 1e-7) if dtype == jnp.float32 else (1e-9, 1e-11)

    def solve(q, v):
        formulation = jaxdae.Baumgarte(jnp.asarray(10.0, dtype), jnp.asarray(25.0, dtype))
        sol = jaxdae.simulate(
            system, formulation, 0.0, 1.0, q, v, rtol=rtol, atol=atol, throw=False
        )
        return sol.q_final, sol.stats["num_steps"]

    return jax.vmap(solve), (qs, vs)


def relative_error(x, reference):
    x, reference = np.asarray(x, float), np.asarray(reference, float)
    return float(np.max(np.abs(x - reference)) / np.max(np.abs(reference)))


def timed(fn, args, reps=5):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def precision_table(rows: dict, stamp: dict) -> dict:
    """`bench_precision.float32`: per precision of the matrix products, the errors, the
    chain's steps, its batch's time and its compile time."""
    cells = [
        [
            label,
            f"{row['lqr_error']:.1e}",
            f"{row['chain_error']:.1e}",
            f"{row['chain_steps_median']:.0f}, {row['chain_steps_max']}",
            f"{row['chain_batch_s']:.3f}",
            f"{row['chain_compile_s']:.1f}",
        ]
        for label, row in rows.items()
    ]
    columns = [("matrix products", "left")] + [
        (title, "right")
        for title in (
            "`lqr` error",
            "chain `q(1)` error",
            "chain steps (median, max)",
            "chain batch [s]",
            "compile [s]",
        )
    ]
    return table(f"{NAME}.float32", columns, cells, stamp)


def main(out: Path, quick: bool = False) -> dict:
    stamp = run_stamp()
    folder = output_dir(out, NAME)
    size = 16 if quick else 1024
    p_ref = jaxdae.lqr(*lqr_problem(jnp.float64)).riccati
    fn64, args64 = chain_batch(jnp.float64, size)
    q_ref, _ = jax.jit(fn64)(*args64)
    rows = {}
    for label, precision in PRECISIONS.items():
        with jax.default_matmul_precision(precision):
            p32 = jaxdae.lqr(*lqr_problem(jnp.float32)).riccati
            fn32, args32 = chain_batch(jnp.float32, size)
            start = time.perf_counter()
            compiled = jax.jit(fn32).lower(*args32).compile()
            compile_s = time.perf_counter() - start
            q32, steps = compiled(*args32)
            rows[label] = {
                "lqr_error": relative_error(p32, p_ref),
                "chain_error": relative_error(q32, q_ref),
                "chain_steps_median": float(np.median(steps)),
                "chain_steps_max": int(np.max(steps)),
                "chain_compile_s": compile_s,
                "chain_batch_s": timed(compiled, args32),
            }
    device = jax.devices()[0]
    lines = [
        f"float32 on {device.platform}: {device.device_kind}; chain of 12 masses, batch of "
        f"{size:,}, `Baumgarte(10, 25)`, t ∈ [0, 1], rtol=1e-5, atol=1e-7; errors relative to "
        "float64.",
        "",
        "| matrix products | `lqr` error | chain `q(1)` error | chain steps (median, max) | "
        "chain batch [s] | compile [s] |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, row in rows.items():
        lines.append(
            f"| {label} | {row['lqr_error']:.1e} | {row['chain_error']:.1e} | "
            f"{row['chain_steps_median']:.0f}, {row['chain_steps_max']} | "
            f"{row['chain_batch_s']:.3f} | {row['chain_compile_s']:.1f} |"
        )
    print("\n".join(lines))
    write_json(folder / "bench_precision.json", {"device": str(device), "size": size, "rows": rows})
    write(out, NAME, [precision_table(rows, stamp)])
    return {"table": lines}


if __name__ == "__main__":
    args = parse_args(NAME, __doc__.splitlines()[0])
    main(args.out, args.quick)
