"""Reverse against forward mode for a gradient through contact with one parameter.

The loss is that of `notebooks/friction_fit.ipynb` (the guide "Gradients through contact"):
a 10 × 10 × 5 cm box of 1 kg, a `PlaneContact` with Coulomb friction `μ = exp(θ)` in a
spatial `Mechanism`, launched sliding along four directions and solved event-driven over
0.7 s (saved at 29 times, `rtol=1e-10, atol=1e-12`, `jax.vmap` over the launches); the
loss is the mean squared distance of the paths from zeros. Its derivative with respect to
`θ` is taken by reverse mode (`jax.grad`, the default adjoint) and by forward mode
(`jax.jacfwd` with `adjoint=diffrax.ForwardMode()`), each jitted from cold caches with the
notebook's compiler options (XLA's backend optimizations off). Prints per mode the trace,
lowering and XLA compile times, the time per call (mean of `--calls` after the first) and
the derivative.

    python experiments/diagnostics/bench_contact_gradient_modes.py [--calls 3]
"""

import argparse
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
import jaxdae.multibody as mb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common
import _common  # noqa: E402, F401  (the benchmarks' folder on sys.path)
from bench_compile import compile_phases  # noqa: E402  # pyright: ignore[reportMissingImports]

jax.config.update("jax_enable_x64", True)

GRAVITY, HALF = 9.81, (0.05, 0.05, 0.025)
LAUNCHES = np.array([[1.5, 0.0], [1.2, 1.2], [0.0, -2.0], [-1.8, 0.8]])  # [m/s]
TS = np.linspace(0.0, 0.7, 29)
# The notebook's: XLA's backend optimizations off.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def box(mu):
    a, b, c = (2 * h for h in HALF)
    inertia = jnp.array([b**2 + c**2, a**2 + c**2, a**2 + b**2]) / 12
    return mb.Mechanism(
        bodies=[mb.RigidBody("box", mass=1.0, inertia=inertia)],
        forces=[mb.Gravity([0.0, 0.0, -GRAVITY])],
        stops=[mb.PlaneContact("box", friction=mu)],
    )


Q0, _ = box(0.35).initial_state()


def slide(mu, v0, adjoint):
    v = jnp.zeros(7).at[:2].set(v0)
    options = {} if adjoint is None else {"adjoint": adjoint}
    sol = jaxdae.simulate(
        box(mu), jaxdae.Unstabilized(), 0.0, TS[-1], Q0, v, ts=jnp.asarray(TS), rtol=1e-10,
        atol=1e-12, **options,
    )  # fmt: skip
    return sol.q[:, :2]


def loss(theta, launches, adjoint=None):
    paths = jax.vmap(slide, (None, 0, None))(jnp.exp(theta), launches, adjoint)
    return jnp.mean(paths**2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3, help="calls timed after the first")
    calls = parser.parse_args().calls
    args = (jnp.asarray(np.log(0.6)), jnp.asarray(LAUNCHES))
    modes = {
        "reverse (jax.grad)": jax.grad(loss),
        "forward (jax.jacfwd, ForwardMode)": jax.jacfwd(
            lambda theta, launches: loss(theta, launches, diffrax.ForwardMode())
        ),
    }
    print("| mode | trace [s] | lower [s] | XLA compile [s] | total [s] | call [ms] | dL/dθ |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, fn in modes.items():
        _, compiled, (trace, lower, xla, _, total) = compile_phases(fn, args, FAST_COMPILE)
        value = compiled(*args).block_until_ready()
        first = time.perf_counter()
        for _ in range(calls):
            compiled(*args).block_until_ready()
        per_call = (time.perf_counter() - first) / calls
        print(
            f"| {name} | {trace:.1f} | {lower:.1f} | {xla:.1f} | {total:.1f} | "
            f"{1e3 * per_call:.0f} | {float(value):.10e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
