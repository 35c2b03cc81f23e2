"""How `GeneralizedAlphaAdjoint` solves its steps' adjoint equations on a mesh of bars: how
many of its solves refine with the factorization kept from a later step and how many build
their own `∂r/∂x`, how fast the refinement's corrections shrink, and the gradient's time.

The model is a family of `jaxdae/examples/_meshes.py` (`--model cloth:6`), solved by
`GeneralizedAlpha` from rest over `[0, --t1]` at `rtol = 1e-6`, `atol = 1e-8`; the gradient
is that of `|q(t1)|²` with respect to gravity. The counts come from `jax.debug.callback`s
placed around `_adjoint_solve` and `_transposed_factor` (the builds); the corrections are
ten applications of the kept factorization at each solve, before the solve itself, their
sizes relative to the largest entry of the solution, medians and 90th percentiles over the
solves.

`--attainable-units 4` ends the refinement only at rounding (the adjoint's
`_ATTAINABLE_UNITS`; its default 1024 also ends it where the corrections stall above it).

    .venv/bin/python experiments/diagnostics/adjoint_refinement.py [--model cloth:6]
        [--t1 0.3] [--corrections 10] [--attainable-units 1024]
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae._integration import _generalized_alpha_adjoint as adjoint
from jaxdae.examples._meshes import FAMILIES


def instrument(counts: dict, sizes: list, corrections: int) -> None:
    """Wraps the adjoint's solve and its matrix build with callbacks that count them and
    record the sizes of `corrections` trial corrections with the kept factorization."""
    solve, build = adjoint._adjoint_solve, adjoint._transposed_factor

    def counted_build(*args, **kwargs):
        jax.debug.callback(lambda: counts.__setitem__("builds", counts["builds"] + 1))
        return build(*args, **kwargs)

    def counted_solve(transposed, x_bar, kept, factorize):
        w, relative = kept.factor.apply(x_bar), []
        for _ in range(corrections):
            delta = kept.factor.apply(x_bar - transposed(w))
            relative.append(jnp.max(jnp.abs(delta)) / jnp.max(jnp.abs(w)))
            w = w + delta

        def record(relative, valid):
            counts["solves"] += 1
            if valid:
                sizes.append(np.asarray(relative))

        jax.debug.callback(record, jnp.stack(relative), kept.valid)
        return solve(transposed, x_bar, kept, factorize)

    adjoint._transposed_factor, adjoint._adjoint_solve = counted_build, counted_solve


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cloth:6", help="family:N of the meshes' families")
    parser.add_argument("--t1", type=float, default=0.3)
    parser.add_argument("--corrections", type=int, default=10)
    parser.add_argument("--attainable-units", type=float, default=adjoint._ATTAINABLE_UNITS)
    args = parser.parse_args()
    adjoint._ATTAINABLE_UNITS = args.attainable_units
    family, size = args.model.split(":")
    system = FAMILIES[family](int(size))
    q0, v0 = system.initial_state()
    counts, sizes = {"solves": 0, "builds": 0}, []
    instrument(counts, sizes, args.corrections)

    def loss(gravity):
        model = eqx.tree_at(lambda s: s.gravity, system, gravity)
        sol = jaxdae.simulate(
            model,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            args.t1,
            q0,
            v0,
            solver=jaxdae.GeneralizedAlpha(),
            rtol=1e-6,
            atol=1e-8,
        )
        return jnp.sum(sol.q_final**2), sol.stats["num_steps"]

    gradient = jax.jit(jax.grad(loss, has_aux=True))
    jax.block_until_ready(gradient(system.gravity))
    counts.update(solves=0, builds=0)
    sizes.clear()
    start = time.perf_counter()
    value, steps = jax.block_until_ready(gradient(system.gravity))
    elapsed = time.perf_counter() - start
    print(
        f"{args.model}, t1 = {args.t1}, attainable units {args.attainable_units:g}: "
        f"{int(steps)} steps, {counts['solves']} adjoint solves, "
        f"{counts['builds']} built their own matrix; gradient {float(value)!r} in "
        f"{elapsed:.2f} s (the trial corrections included)"
    )
    table = np.array(sizes)
    if table.size:
        np.set_printoptions(precision=1, linewidth=120)
        print("trial corrections / |w|, by iteration (median):", np.median(table, axis=0))
        print("trial corrections / |w|, by iteration (90 %):  ", np.quantile(table, 0.9, axis=0))
    print(f"units of rounding: 4 ε = {4 * np.finfo(float).eps:.1e}")


if __name__ == "__main__":
    main()
