"""Where the gradient's time goes without `simulate`'s checks and diagnostics (issue 2's ≤ 3×).

The benchmark problem of `bench_core.py` (two-link, `ModifiedLagrange(10, [20, 10],
[100, 25])`, t ∈ [0, 2], rtol 1e-8, atol 1e-10, Tsit5 with a PID controller) integrated by a
bare `diffrax.diffeqsolve` of jaxdae's right-hand side, and the loss `Σ q(2)²`,
differentiated with respect to the five gains:

- **checkpointed** — `diffrax.RecursiveCheckpointAdjoint(checkpoints=32)`, jaxdae's
  default before session 13: reverse mode through diffrax's whole loop (steps recomputed
  from 32 checkpoints);
- **reverse sweep** — the solve of [`jaxdae.ReverseSweepAdjoint`][] (`jaxdae/_adjoint.py`):
  the forward pass stores every accepted step, the backward pass runs over the steps in
  reverse, recomputing each step's stages and applying the right-hand side's
  vector–Jacobian product at each. Its two halves are also timed alone.

`bench_rhs.py` (third table) found that the vector–Jacobian product of diffrax's Tsit5 step
costs ≈ 5× the step while the right-hand side's own costs ≈ 3.3× the right-hand side; this
script measures what is left when only the latter is paid. `bench_core.py` times the same
through `simulate`. "compile" is trace, lowering and XLA compilation, in the order of the
table within one process (the traces of the right-hand side that the first function makes
are reused by the others).

    PYTHONPATH=. .venv/bin/python experiments/bench_stage_adjoint.py    # ≈ 1 min
"""

import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

import jaxdae
from jaxdae import _adjoint
from jaxdae._simulate import _vector_field
from jaxdae.examples import TwoLinkManipulator

T1, RTOL, ATOL, STORED_STEPS = 2.0, 1e-8, 1e-10, 4096
SYSTEM = TwoLinkManipulator()
Q0, V0 = SYSTEM.initial_state()
SAVEAT = diffrax.SaveAt(t0=True, t1=True)  # as `simulate` saves without `ts`


def controller():
    return diffrax.PIDController(rtol=RTOL, atol=ATOL)


def args_of(params):
    return SYSTEM, jaxdae.ModifiedLagrange(*params), None  # (system, formulation, reference)


def checkpointed(params):
    q1, _ = diffrax.diffeqsolve(
        diffrax.ODETerm(_vector_field), diffrax.Tsit5(), 0.0, T1, None, (Q0, V0),
        args=args_of(params), saveat=SAVEAT, stepsize_controller=controller(),
        adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=32), max_steps=100_000).ys
    return jnp.sum(q1[-1] ** 2)


def swept(params):
    q1, _ = _adjoint.swept_diffeqsolve(
        _vector_field, diffrax.Tsit5(), 0.0, T1, None, (Q0, V0), args=args_of(params),
        saveat=SAVEAT, ts=None, stepsize_controller=controller(), event=None,
        max_steps=STORED_STEPS, adjoint=_adjoint.ReverseSweepAdjoint(STORED_STEPS)).ys
    return jnp.sum(q1[-1] ** 2)


def halves(params):
    """The sweep's forward pass (storing every step) and its backward pass, as functions."""
    static = _adjoint.sweep_options(_vector_field, diffrax.Tsit5(), SAVEAT, controller(), None,
                                    STORED_STEPS, STORED_STEPS)

    def vjp_arg(params):
        return args_of(params), (Q0, V0), 0.0, T1, None, None

    def forward(params):
        return _adjoint._solve(vjp_arg(params), static)

    stored = jax.jit(lambda p: forward(p)[1])(params)
    system, formulation, _ = args_of(params)
    perturbed = ((jax.tree.map(lambda _: False, system),  # the gains only, as in `swept`
                  jax.tree.map(lambda x: isinstance(x, jax.Array), formulation), None),
                 (False, False), False, False, None, None)
    out_bar = jax.tree.map(lambda _: None, jax.eval_shape(lambda p: forward(p)[0], params))
    q_bar = jnp.array([[0.0, 0.0], [1.0, 1.0]])  # the cotangent of q(2) only
    out_bar = eqx.tree_at(lambda o: o.ys, out_bar, (q_bar, None), is_leaf=lambda x: x is None)

    def backward(params):
        return _adjoint._backward(stored, out_bar, perturbed, vjp_arg(params), static)[0]

    return forward, backward, int(stored[2])


def main():
    params = (jnp.asarray(10.0), jnp.asarray([20.0, 10.0]), jnp.asarray([100.0, 25.0]))
    forward_half, backward_half, steps = halves(params)
    functions = {
        "forward solve": checkpointed,
        "gradient, checkpointed (the default before session 13)":
            jax.value_and_grad(checkpointed),
        "gradient, reverse sweep (ReverseSweepAdjoint)": jax.value_and_grad(swept),
        "  its forward solve storing every step": forward_half,
        "  its reverse sweep alone": backward_half,
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
    reference = compiled["gradient, checkpointed (the default before session 13)"](params)[1]
    ours = compiled["gradient, reverse sweep (ReverseSweepAdjoint)"](params)[1]
    difference = max(float(jnp.max(jnp.abs(a - b) / jnp.abs(a)))
                     for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(ours)))
    print(f"two-link, t1 = {T1}, {steps} accepted steps; minimum of 15 interleaved "
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
