"""How far a hand-written reverse sweep gets the gradient/forward ratio (issue 2's ≤ 3×).

A measurement, not a library feature. The benchmark problem of `bench_core.py` (two-link,
`ModifiedLagrange(10, [20, 10], [100, 25])`, t ∈ [0, 2], rtol 1e-8, atol 1e-10, Tsit5 with
a PID controller) and the loss `Σ q(2)²`, differentiated with respect to the five gains:

- **checkpointed** — `diffrax.RecursiveCheckpointAdjoint(checkpoints=32)`, jaxdae's default:
  reverse mode through diffrax's whole loop (steps recomputed from 32 checkpoints);
- **reverse sweep** — a `custom_vjp` around the solve: the forward solve stores every
  accepted step (`SaveAt(steps=True)`, a buffer of `max_steps` = 4,096 states), and the
  backward pass runs over the steps in reverse, recomputing each step's six stages and
  applying the right-hand side's vector–Jacobian product at each (the discrete adjoint of
  the Runge–Kutta step; the step sizes are constants, as diffrax's controller makes them by
  `stop_gradient`). It gives the same gradient.

`bench_rhs.py` (third table) found that the vector–Jacobian product of diffrax's Tsit5 step
costs ≈ 5× the step while the right-hand side's own costs ≈ 3.3× the right-hand side; this
script measures what is left when only the latter is paid, and where the rest goes (the two
halves of the reverse sweep timed alone). "compile" is trace, lowering and XLA compilation,
in the order of the table within one process (the traces of the right-hand side that the
first function makes are reused by the others).

    PYTHONPATH=. .venv/bin/python experiments/bench_stage_adjoint.py    # ≈ 1 min
"""

import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae._simulate import _rates
from jaxdae.examples import TwoLinkManipulator

T1, RTOL, ATOL, STORED_STEPS = 2.0, 1e-8, 1e-10, 4096
SYSTEM = TwoLinkManipulator()
Q0, V0 = SYSTEM.initial_state()
TABLEAU = diffrax.Tsit5().tableau
STAGES = 6  # the seventh (first-same-as-last) stage does not enter the step's solution
A = np.zeros((STAGES, STAGES))
for row, coefficients in enumerate(TABLEAU.a_lower[: STAGES - 1]):
    A[row + 1, : row + 1] = coefficients
B = np.asarray(TABLEAU.b_sol[:STAGES])
C = np.concatenate([[0.0], TABLEAU.c[: STAGES - 1]])


def vector_field(t, y, formulation):
    q, v = y
    return _rates(SYSTEM, formulation, t, q, v)


def solve(formulation, saveat, adjoint, max_steps=100_000):
    return diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field), diffrax.Tsit5(), 0.0, T1, None,
        (Q0, V0), args=formulation, saveat=saveat, adjoint=adjoint,
        stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL), max_steps=max_steps)


def stored_steps(formulation):
    """The forward solve, keeping every accepted step's end time and state."""
    out = solve(formulation, diffrax.SaveAt(steps=True), diffrax.RecursiveCheckpointAdjoint(),
                STORED_STEPS)
    steps = out.stats["num_accepted_steps"]
    return jax.tree.map(lambda y: y[steps - 1], out.ys), (out.ts, out.ys, steps)


def reverse_sweep(formulation, stored, y_bar):
    """Cotangent of the formulation's gains from that of the final state."""
    ts, ys, steps = stored
    gains, static = eqx.partition(formulation, eqx.is_inexact_array)
    y0 = jnp.concatenate([Q0, V0])  # the state (q, v) as one vector
    ys = jnp.concatenate(ys, axis=1)
    y_bar = jnp.concatenate([jnp.zeros_like(Q0) if y is None else y for y in y_bar])

    def rates(t, y, gains):
        return jnp.concatenate(vector_field(t, (y[:Q0.size], y[Q0.size:]),
                                            eqx.combine(gains, static)))

    def step_back(k, carry):
        y_bar, gains_bar = carry
        i = steps - 1 - k
        previous = jnp.maximum(i - 1, 0)
        t0 = jnp.where(i > 0, ts[previous], 0.0)
        y_start = jnp.where(i > 0, ys[previous], y0)
        h = ts[i] - t0

        def stage(j, k_stages):
            y_stage = y_start + h * (jnp.asarray(A)[j] @ k_stages)
            return k_stages.at[j].set(rates(t0 + jnp.asarray(C)[j] * h, y_stage, gains))

        k_stages = jax.lax.fori_loop(0, STAGES, stage, jnp.zeros((STAGES, y0.size)))
        # λ_j: cotangent of stage j; y_{n+1} = y_n + h Σ b_j k_j, Y_j = y_n + h Σ a_jm k_m.
        stage_bar = h * jnp.asarray(B)[:, None] * y_bar[None, :]

        def stage_back(jj, carry):
            stage_bar, y_bar, gains_bar = carry
            j = STAGES - 1 - jj
            y_stage = y_start + h * (jnp.asarray(A)[j] @ k_stages)
            _, pull = jax.vjp(lambda y, g: rates(t0 + jnp.asarray(C)[j] * h, y, g), y_stage, gains)
            mu, g_bar = pull(stage_bar[j])
            stage_bar = stage_bar + h * jnp.asarray(A)[j][:, None] * mu[None, :]
            return stage_bar, y_bar + mu, jax.tree.map(jnp.add, gains_bar, g_bar)

        _, y_bar, gains_bar = jax.lax.fori_loop(0, STAGES, stage_back,
                                                (stage_bar, y_bar, gains_bar))
        return y_bar, gains_bar

    zero = jax.tree.map(jnp.zeros_like, gains)
    return jax.lax.fori_loop(0, steps, step_back, (y_bar, zero))[1]


@eqx.filter_custom_vjp
def final_state(wrapped):
    return stored_steps(wrapped[0])[0]


def _forward(perturbed, wrapped):
    return stored_steps(wrapped[0])


def _backward(stored, y_bar, perturbed, wrapped):
    return (reverse_sweep(wrapped[0], stored, y_bar),)


final_state.def_fwd(_forward)
final_state.def_bwd(_backward)


def gains(params):
    return jaxdae.ModifiedLagrange(*params)


def forward(params):
    q1, _ = solve(gains(params), diffrax.SaveAt(t1=True),
                  diffrax.RecursiveCheckpointAdjoint(checkpoints=32)).ys
    return jnp.sum(q1[-1] ** 2)


def swept(params):
    return jnp.sum(final_state((gains(params),))[0] ** 2)


def main():
    params = (jnp.asarray(10.0), jnp.asarray([20.0, 10.0]), jnp.asarray([100.0, 25.0]))
    stored = jax.jit(lambda p: stored_steps(gains(p))[1])(params)
    functions = {
        "forward solve": forward,
        "gradient, checkpointed (jaxdae's default)": jax.value_and_grad(forward),
        "gradient, reverse sweep": jax.value_and_grad(swept),
        "  its forward solve storing every step": lambda p: stored_steps(gains(p)),
        "  its reverse sweep alone": lambda p: reverse_sweep(gains(p), stored,
                                                             (jnp.ones(2), None)),
    }
    compiled, compile_s = {}, {}
    for name, fn in functions.items():
        start = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(params).compile()
        compile_s[name] = time.perf_counter() - start
        jax.block_until_ready(compiled[name](params))
    times = {name: [] for name in functions}
    for _ in range(15):  # interleaved: the machine's speed drifts
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params))
            times[name].append(time.perf_counter() - start)
    best = {name: min(t) for name, t in times.items()}
    reference = compiled["gradient, checkpointed (jaxdae's default)"](params)[1]
    ours = compiled["gradient, reverse sweep"](params)[1]
    difference = max(float(jnp.max(jnp.abs(a - b) / jnp.abs(a)))
                     for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(ours)))
    print(f"two-link, t1 = {T1}, {int(stored[2])} accepted steps; minimum of 15 interleaved "
          f"calls; jax {jax.__version__}, diffrax {diffrax.__version__}, "
          f"{jax.devices()[0].platform}")
    print("\n| function | compile [s] | time [ms] | / forward solve |")
    print("| --- | ---: | ---: | ---: |")
    for name in functions:
        print(f"| {name} | {compile_s[name]:.2f} | {best[name] * 1e3:.3f} | "
              f"{best[name] / best['forward solve']:.2f} |")
    print(f"\nlargest relative difference of the two gradients: {difference:.1e}")


if __name__ == "__main__":
    main()
