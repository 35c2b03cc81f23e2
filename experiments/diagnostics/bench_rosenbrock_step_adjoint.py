"""Diagnostic: one Rodas5P step's vector–Jacobian product, by reverse mode through the step
against its discrete adjoint, at the sizes around `ROSENBROCK_ADJOINT_MIN`.

`jaxdae.ReplayAdjoint` differentiates each replayed Rodas5P step by `step_vjp`: from
`ROSENBROCK_ADJOINT_MIN` states by the step's discrete adjoint
(`_integration/_rosenbrock_adjoint.py`), below by `eqx.filter_vjp` of `Rodas5P.step`. This
times, per step, inside a jitted `lax.scan` of `--steps` steps of `h = 10⁻⁴` on the stiff
study's ODEs (jaxdae's right-hand side of the spring pendulum and of the Cartesian arm, 8
states; the spring chain of 4 and 8 masses, 16 and 32 states): the step itself, and the
step with its pullback by each (the cotangents of the state and of the system's parameters),
the three called in turn, medians of `--calls` wall times, and the compile time of each.

    python experiments/diagnostics/bench_rosenbrock_step_adjoint.py [--steps 100]
        [--calls 7] [--cases spring,arm,chain4,chain8]
"""

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import stiff_integration as study  # noqa: E402  # pyright: ignore[reportMissingImports]

import jaxdae  # noqa: E402
from jaxdae._integration._autodiff_step import autodiff_step_vjp  # noqa: E402
from jaxdae._integration._rosenbrock_adjoint import rodas_step_vjp  # noqa: E402


def case(name):
    if name.startswith("chain"):
        return study.chain_case(num=int(name[len("chain") :]))[:4]
    key = {"spring": "spring pendulum (k = 1e6)", "arm": "Cartesian arm, Baumgarte(2000, 1e6)"}[
        name
    ]
    return study.CASES[key]()[:4]


def bench(name, steps, calls, h=1e-4):
    system, formulation, q0, v0 = case(name)

    def f(t, y, system):
        n = y.size // 2
        return jnp.concatenate([y[n:], formulation.accelerations(system.terms(t, y[:n], y[n:]))[0]])

    terms, solver = diffrax.ODETerm(f), jaxdae.Rodas5P()
    y0 = jnp.concatenate([q0, v0])
    diff, static = eqx.partition((terms, system), eqx.is_inexact_array)
    times = jnp.arange(steps, dtype=y0.dtype) * h

    def forward(y):
        def body(y, t):  # every step from `y`, its result kept live
            return y + 0 * solver.step(terms, t, t + h, y, system, None, False)[0], None

        return jax.lax.scan(body, y, times)[0]

    def pulled(step_vjp):
        def run(y):
            def body(bars, t):
                y_bar, p_bar = bars
                (_, dense), pull = step_vjp(solver, t, t + h, (y, None), diff, static)
                (y_bar1, _), p_bar1 = pull(((y_bar, None), jax.tree.map(jnp.zeros_like, dense)))
                return (y_bar + 1e-3 * y_bar1, jax.tree.map(jnp.add, p_bar, p_bar1)), None

            return jax.lax.scan(body, (y, jax.tree.map(jnp.zeros_like, diff)), times)[0]

        return run

    fns, compile_s = {}, {}
    for label, fn in (
        ("step", forward),
        ("reverse mode", pulled(autodiff_step_vjp)),
        ("discrete adjoint", pulled(rodas_step_vjp)),
    ):
        start = time.perf_counter()
        fns[label] = jax.jit(fn).lower(y0).compile()
        compile_s[label] = time.perf_counter() - start
        jax.block_until_ready(fns[label](y0))
    walls = study.median_walls(fns, (y0,), calls)
    print(
        f"| {name} | {y0.size} | "
        + " | ".join(f"{1e6 * walls[k] / steps:.1f} ({compile_s[k]:.0f} s)" for k in fns)
        + " |",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--cases", default="spring,arm,chain4,chain8")
    args = parser.parse_args()
    print(
        "| case | states | step [µs] (compile) | step and pullback, reverse mode | "
        "step and pullback, discrete adjoint |\n|---|---|---|---|---|"
    )
    for name in args.cases.split(","):
        bench(name, args.steps, args.calls)


if __name__ == "__main__":
    main()
