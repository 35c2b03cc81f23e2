"""What `ModifiedLagrange`'s constraint mass `alpha` buys and what it costs.

Mukharlyamov and Deressa's (2015) two-link arm (Example 1, `jaxdae.examples.TwoLinkManipulator`)
from its consistent initial state over 0–2 s, through the singular configuration at t ≈ 0.49 s, with
the gains of the paper's Case 1 (`K_D = diag(20, 10)`, `K_P = diag(100, 25)`) and `𝔄 = αI`. For each
α the script prints, as a Markdown table:

- `max |Φ|` before the fold (t ≤ 0.4 s) and over the whole run: the largest constraint
  violation over 2001 saved times with the default adaptive `Tsit5` (rtol 1e-8, atol 1e-10),
  and its accepted and rejected steps;
- `cond(M + JᵀαJ)`: the largest condition number of the matrix the formulation solves with,
  over the saved states;
- `Heun, τ = 10 ms`: `max |Φ|` with a fixed-step explicit method (or the failure);
- `float32`: `max |Φ|` of the same adaptive solve in float32 (rtol 1e-5, atol 1e-7), or the
  failure.

    python experiments/studies/modified_lagrange_alpha.py [--alphas 1 10 100 1000 1e4 1e6 1e8]
"""

import argparse

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae

KD, KP = (20.0, 10.0), (100.0, 25.0)  # Mukharlyamov and Deressa (2015), Example 1, Case 1
T1 = 2.0


def solve(system, alpha, dtype, fixed_step=None):
    cast = lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x  # noqa: E731
    system = jax.tree_util.tree_map(cast, system)
    q0, v0 = (x.astype(dtype) for x in system.initial_state())
    formulation = jaxdae.ModifiedLagrange(
        jnp.asarray(alpha, dtype), jnp.asarray(KD, dtype), jnp.asarray(KP, dtype)
    )
    ts = jnp.linspace(0.0, T1, 2001, dtype=dtype)
    if fixed_step is not None:
        options = dict(
            solver=diffrax.Heun(),
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=fixed_step,
            max_steps=int(T1 / fixed_step) + 10,
        )
    elif dtype == jnp.float32:
        options = dict(rtol=1e-5, atol=1e-7)
    else:
        options = dict(rtol=1e-8, atol=1e-10)
    return jaxdae.simulate(system, formulation, 0.0, T1, q0, v0, ts=ts, throw=False, **options)


def largest_condition_number(system, sol, alpha):
    def cond(t, q, v):
        terms = system.terms(t, q, v)
        g = terms.jacobian
        return jnp.linalg.cond(terms.mass_matrix + alpha * g.T @ g)

    return float(jnp.max(jax.vmap(cond)(sol.ts, sol.q, sol.v)))


def violation(sol):
    if not bool(sol.succeeded):
        return f"fails at t = {float(sol.t_final):.3f} s"
    return f"{float(jnp.max(jnp.abs(sol.phi))):.2e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[1, 10, 100, 1e3, 1e4, 1e6, 1e8])
    args = parser.parse_args()
    system = jaxdae.examples.TwoLinkManipulator()
    print(
        "| α | max abs Φ, t ≤ 0.4 s [m] | max abs Φ [m] | steps (rejected) | cond(M + JᵀαJ) "
        "| Heun, τ = 10 ms: max abs Φ | float32: max abs Φ |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for alpha in args.alphas:
        sol = solve(system, alpha, jnp.float64)
        steps = int(sol.stats["num_accepted_steps"])
        rejected = int(sol.stats["num_rejected_steps"])
        heun = solve(system, alpha, jnp.float64, fixed_step=0.01)
        single = solve(system, alpha, jnp.float32)
        before_fold = float(jnp.max(jnp.where(sol.ts[:, None] <= 0.4, jnp.abs(sol.phi), 0.0)))
        print(
            f"| {alpha:g} | {before_fold:.2e} | {violation(sol)} "
            f"| {steps} ({rejected}) | {largest_condition_number(system, sol, alpha):.1e} "
            f"| {violation(heun)} | {violation(single)} |",
            flush=True,
        )
    print(
        f"\njax {jax.__version__}, {jax.devices()[0].device_kind}; two-link arm of "
        f"Mukharlyamov and Deressa (2015), Case 1 gains, 0–{T1:g} s"
    )


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
