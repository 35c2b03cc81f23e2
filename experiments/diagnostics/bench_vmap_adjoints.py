"""`jax.vmap(jax.grad(...))` of a batch of solves whose members take different numbers of
steps, differentiated by one of jaxdae's adjoints: compile time, run time, and the largest
relative difference from the members' gradients one by one.

- `--adjoint replay`: `jaxdae.ReplayAdjoint` on `jaxdae.Rodas5P` solves of a Van der Pol
  oscillator, `μ` from 1 to 30 across the batch, from `y0 = (2, 0)` over `t ∈ [0, 3]` at
  `rtol = 10⁻⁸`, `atol = 10⁻¹⁰`; the loss is the sum of squares of six saved states
  (inside the steps).
- `--adjoint sweep`: `jaxdae.ReverseSweepAdjoint` (the default of explicit Runge–Kutta
  solvers) on `diffrax.Tsit5` solves of the same oscillator, `μ` from 1 to 10, at
  `rtol = 10⁻⁶`, `atol = 10⁻⁸`.
- `--adjoint generalized-alpha`: `jaxdae.GeneralizedAlpha`'s default adjoint on
  `jaxdae.simulate` of the Cartesian pendulum under `Baumgarte(10, 25)`, gravity from 1
  to 60 across the batch, over `t ∈ [0, 1]` at `rtol = 10⁻⁴`; the loss is the sum of the
  horizontal coordinate at 11 saved times.

`--stored-steps` sets the adjoint's `stored_steps` (default: the adjoint's own). Every
solve has `max_steps = 2048`. Run time is the median of `--repeats` calls of the compiled
batch.

    python experiments/diagnostics/bench_vmap_adjoints.py [--adjoint replay|sweep|generalized-alpha]
        [--batch 64] [--stored-steps N] [--repeats 7]
    # compare checkouts: PYTHONPATH=<checkout> python experiments/diagnostics/...
"""

import argparse
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae.examples import CartesianPendulum

MAX_STEPS = 2048


def van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def oscillator_loss(solver, adjoint, rtol, atol):
    def loss(mu):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(van_der_pol),
            solver,
            0.0,
            3.0,
            0.01,
            jnp.array([2.0, 0.0]),
            args=mu,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.5, 3.0, 6)),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=MAX_STEPS,
            adjoint=adjoint,
        )
        return jnp.sum(sol.ys**2), sol.stats["num_accepted_steps"]

    return loss


def pendulum_loss(adjoint):
    pendulum = CartesianPendulum()
    q0, v0 = pendulum.state_from_angle(1.0, 0.0)

    def loss(gravity):
        sol = jaxdae.simulate(
            eqx.tree_at(lambda s: s.gravity, pendulum, gravity),
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            1.0,
            q0,
            v0,
            ts=jnp.linspace(0.0, 1.0, 11),
            rtol=1e-4,
            solver=jaxdae.GeneralizedAlpha(),
            max_steps=MAX_STEPS,
            adjoint=adjoint,
        )
        return jnp.sum(sol.q[:, 0]), sol.stats["num_accepted_steps"]

    return loss


def case(name: str, stored_steps: int | None):
    """`(loss with its step count, the batch's parameters from first to last)`."""
    given = {} if stored_steps is None else {"stored_steps": stored_steps}
    if name == "replay":
        loss = oscillator_loss(jaxdae.Rodas5P(), jaxdae.ReplayAdjoint(**given), 1e-8, 1e-10)
        return loss, (1.0, 30.0)
    if name == "sweep":
        loss = oscillator_loss(diffrax.Tsit5(), jaxdae.ReverseSweepAdjoint(**given), 1e-6, 1e-8)
        return loss, (1.0, 10.0)
    from jaxdae._integration._generalized_alpha_adjoint import GeneralizedAlphaAdjoint

    return pendulum_loss(GeneralizedAlphaAdjoint(**given)), (1.0, 60.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--adjoint", choices=("replay", "sweep", "generalized-alpha"), default="replay"
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--stored-steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    loss, (low, high) = case(options.adjoint, options.stored_steps)
    params = jnp.linspace(low, high, options.batch)
    grad = jax.grad(loss, has_aux=True)
    start = time.perf_counter()
    batched = jax.jit(jax.vmap(grad)).lower(params).compile()
    compile_s = time.perf_counter() - start
    gradients, steps = jax.block_until_ready(batched(params))
    times = []
    for _ in range(options.repeats):
        start = time.perf_counter()
        jax.block_until_ready(batched(params))
        times.append(time.perf_counter() - start)
    one = jax.jit(grad)
    members = range(0, options.batch, max(1, options.batch // 8))
    difference = max(
        abs(float(one(params[i])[0]) - float(gradients[i])) / abs(float(gradients[i]))
        for i in members
    )
    print(
        f"{options.adjoint}, batch {options.batch}, {int(steps.min())}–{int(steps.max())} "
        f"steps: compile {compile_s:.1f} s, run {1e3 * np.median(times):.1f} ms, "
        f"largest relative difference from one by one {difference:.1e}"
    )


if __name__ == "__main__":
    main()
