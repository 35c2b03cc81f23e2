"""Diagnostic: where the constraint residual of a completed solve ends, relative to the
tolerances (`RESIDUAL_TOLERANCE_FACTOR` in `jaxdae/_integration/_diagnostics.py`).

For the Cartesian pendulum (`jaxdae.examples.CartesianPendulum`, from 0.5 rad, 10 s) and the
two-link arm of Mukharlyamov and Deressa (2015) (`jaxdae.examples.TwoLinkManipulator`, 3 s,
its target leaves the workspace at t ≈ 2.85 s), under `Baumgarte(10, 25)`,
`PseudoInverse(10, 25)`, `ModifiedLagrange(1e4, 10, 25)` and `Unstabilized()` at `rtol` from
1e-8 to 1e-3 (`atol = rtol / 100`), prints the final residual `max(|Φ|, |Ψ|)` divided by
`atol + rtol · max(1, |q0|, |v0|)`, the largest such ratio over the saved times, and the
result with the default `constraint_tol`.

    python experiments/diagnostics/residual_tolerance.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _common  # noqa: E402, F401  (the benchmarks' folder on sys.path)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxdae  # noqa: E402
from jaxdae.examples import (  # noqa: E402
    TWO_LINK_Q0,
    TWO_LINK_V0,
    CartesianPendulum,
    TwoLinkManipulator,
)


def main():
    pendulum = CartesianPendulum()
    models = {
        "pendulum, 10 s": (pendulum, *pendulum.state_from_angle(0.5, 0.0), 10.0),
        "two-link arm, 3 s": (
            TwoLinkManipulator(),
            jnp.asarray(TWO_LINK_Q0),
            jnp.asarray(TWO_LINK_V0),
            3.0,
        ),
    }
    formulations = {
        "Baumgarte(10, 25)": jaxdae.Baumgarte(10.0, 25.0),
        "PseudoInverse(10, 25)": jaxdae.PseudoInverse(10.0, 25.0),
        "ModifiedLagrange(1e4, 10, 25)": jaxdae.ModifiedLagrange(1e4, 10.0, 25.0),
        "Unstabilized()": jaxdae.Unstabilized(),
    }
    print("| model | formulation | rtol | end / tol | max / tol | result |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for model, (system, q0, v0, t1) in models.items():
        scale = max(1.0, float(jnp.max(jnp.abs(jnp.concatenate([q0, v0])))))
        for name, formulation in formulations.items():
            for rtol in (1e-8, 1e-6, 1e-4, 1e-3):
                atol = rtol / 100
                sol = jaxdae.simulate(
                    system,
                    formulation,
                    0.0,
                    t1,
                    q0,
                    v0,
                    rtol=rtol,
                    atol=atol,
                    ts=jnp.linspace(0.0, t1, 51),
                    throw=False,
                    max_steps=50_000,
                )
                residual = np.max(np.abs(np.concatenate([sol.phi, sol.psi], 1)), axis=1)
                tol = atol + rtol * scale
                result = _name(sol.result)
                print(
                    f"| {model} | {name} | {rtol:.0e} | {residual[-1] / tol:.3g} | "
                    f"{np.max(residual) / tol:.3g} | {result} |"
                )


def _name(result):
    return next(name for name, item in jaxdae.RESULTS._name_to_item.items() if item == result)


if __name__ == "__main__":
    main()
