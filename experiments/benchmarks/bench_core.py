"""Benchmark: jaxdae vs SciPy and CasADi on Mukharlyamov and Deressa's (2015) two-link example.

`ModifiedLagrange(10, [20, 10], [100, 25])` on `TwoLinkManipulator` from its paper state over
`t ∈ [0, 2]`, `rtol = 1e-8`, `atol = 1e-10`, float64. Timed side by side in one interleaved
run: every repetition times every tool in turn, and the reported figure is the median over
all calls of all repetitions. One trajectory and the gradient are both timed call by call,
`inner` calls in a row per repetition for both and for every tool, so that their ratio
compares like with like. The JSON also keeps the median of the repetitions' means
(`block_means`, which counts each block's first, colder call in):

- compile / set-up time (jaxdae: trace + lower + XLA compile, each measured from cold caches,
  median of 3, after one unrelated diffrax compile that pays the process's one-time costs);
- time of one trajectory (jaxdae and diffrax: a call of the `jax.jit`-compiled function);
- throughput of a batch of perturbed initial states (jaxdae: `jax.jit(jax.vmap(simulate))`,
  every trajectory stepped on its own, and `jaxdae.simulate_ensemble`, the batch as one ODE
  on a shared step sequence; CasADi: `Function.map` with threads; SciPy: a Python loop over
  a subset, extrapolated);
- time of the gradient of `Σ q(2)² + |Φ(2)|²` w.r.t. `(alpha, kd, kp)` (jaxdae: `jax.grad`
  with the default adjoint, `ReverseSweepAdjoint()` at the default `max_steps = 100_000`:
  segments of at most 1024 steps, checkpointed; row "jaxdae ReverseSweepAdjoint": with
  `max_steps=1024`, every step stored in one segment; their ratio taken to jaxdae's forward
  solve; CasADi: CVODES adjoint sensitivities; each returns the value and the gradient as
  one array, as each forward returns `q(2)`);
- agreement of `q(2)` with a tight-tolerance reference (SciPy DOP853, `rtol = 1e-13`).

A row "diffrax + hand-written RHS" solves the same ODE with diffrax (same solver, controller
and tolerances) on the peers' hand-written equations: the floor that jaxdae's
autodiff-derived right-hand side is measured against.

The SciPy and CasADi right-hand sides are written by hand in
`jaxdae/examples/_two_link_reference.py`.

    python experiments/benchmarks/bench_core.py [--quick] [--out output]
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import casadi as ca  # noqa: E402
import diffrax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import output_dir, parse_args, write_json  # noqa: E402
from _tables import run_stamp, table, write  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import jaxdae  # noqa: E402
from jaxdae.examples import (
    TwoLinkManipulator,  # noqa: E402
    _two_link_reference as _peers,
)

NAME = "bench_core"
HANDWRITTEN = "diffrax + hand-written RHS"
ENSEMBLE = "jaxdae simulate_ensemble"
SWEEP = "jaxdae ReverseSweepAdjoint"
T1, RTOL, ATOL = 2.0, 1e-8, 1e-10


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def _block(x):
    return jax.block_until_ready(x)


# -- jaxdae --------------------------------------------------------------------------------


def jaxdae_functions(dtype=jnp.float64):
    """Plain-`jax.jit` forward, batched forward and gradient of the benchmark problem."""
    system = TwoLinkManipulator()

    def gains(params):
        alpha, kd, kp = params
        return jaxdae.ModifiedLagrange(alpha, kd, kp)

    def forward(params, q0, v0, **options):
        return jaxdae.simulate(
            system, gains(params), 0.0, T1, q0, v0, rtol=RTOL, atol=ATOL, **options
        )

    def final_q(params, q0, v0):
        return forward(params, q0, v0).q_final

    def loss(params, q0, v0, **options):
        sol = forward(params, q0, v0, **options)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    def ensemble(params, q0, v0):
        return jaxdae.simulate_ensemble(
            system, gains(params), 0.0, T1, q0, v0, rtol=RTOL, atol=ATOL
        ).q_final

    return {
        "forward": final_q,
        "batch": jax.vmap(final_q, in_axes=(None, 0, 0)),
        "ensemble": ensemble,
        "gradient": value_and_gradient(loss),
        # One segment: no checkpoints, no re-solve code in the program.
        "gradient, reverse sweep": value_and_gradient(
            lambda *args: loss(*args, adjoint=jaxdae.ReverseSweepAdjoint(), max_steps=1024)
        ),
    }


def value_and_gradient(loss):
    """`jax.value_and_grad(loss)` as one array, `[value, gradient with respect to the first
    argument, flattened]`, as CasADi's gradient and every forward here return one array.
    (A jitted function returning four arrays, as `(value, (alpha, kd, kp))`, takes tens of
    µs more per call to reach NumPy than one returning one array: a cost of the harness, not
    of the gradient.)"""

    def value_and_vector(*args):
        value, grads = jax.value_and_grad(loss)(*args)
        return jnp.concatenate([value[None], ravel_pytree(grads)[0]])

    return value_and_vector


def split_gradient(vector):
    """`(value, gradient)` of a `value_and_gradient` output."""
    vector = np.asarray(vector)
    return float(vector[0]), vector[1:]


def compile_jaxdae(fn, *args, repeats: int = 3):
    """Trace, lower and compile `jax.jit(fn)` from cold caches, `repeats` times; returns
    `(jax.jit(fn), times)` with the median of each phase.

    The timed calls go through `jax.jit`, as users call a compiled function, not through
    the compiled object: JAX calls a program with host callbacks (jaxdae's and diffrax's
    runtime checks) through its Python path when it was compiled ahead of time, ≈ 0.1 ms
    more per call. `jax.jit(fn)` compiles again at its first call (the warm-up before the
    timings)."""
    runs = []
    for _ in range(repeats):
        jax.clear_caches()
        jitted = jax.jit(fn)
        traced, t_trace = _timed(jitted.trace, *args)
        lowered, t_lower = _timed(traced.lower)
        _, t_compile = _timed(lowered.compile)
        runs.append((t_trace, t_lower, t_compile, t_trace + t_lower + t_compile))
    trace, lower, xla, total = (float(np.median(column)) for column in zip(*runs, strict=False))
    return jitted, {"trace": trace, "lower": lower, "compile": xla, "total": total}


def warm_up_jax():
    """Compiles an unrelated diffrax solve (and its gradient) once, so that the one-time
    costs of a process's first trace (Python-level caches in JAX, equinox and diffrax) are
    not charged to whichever tool happens to be compiled first."""

    def solve(k):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, k: -k * y),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.1,
            jnp.ones(3),
            args=k,
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
        ).ys[-1, 0]

    jax.block_until_ready(
        (jax.jit(solve)(1.0), jax.jit(jax.grad(solve))(1.0), jax.jit(jax.vmap(solve))(jnp.ones(4)))
    )


def jaxdae_params(dtype=jnp.float64):
    alpha, kd1, kd2, kp1, kp2 = _peers.PARAMS
    return (
        jnp.asarray(alpha, dtype),
        jnp.asarray([kd1, kd2], dtype),
        jnp.asarray([kp1, kp2], dtype),
    )


def handwritten_functions():
    """The same solve with diffrax directly on the hand-written right-hand side of the peers
    (`_peers._equations` in `jax.numpy`): a floor for what autodiff-derived terms could reach
    with the same solver (Tsit5, same controller and tolerances)."""

    def rhs(t, y, p):
        return jnp.stack(_peers._equations(jnp, t, y, p)[0])

    def final_y(p, q0, v0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(rhs),
            diffrax.Tsit5(),
            0.0,
            T1,
            None,
            jnp.concatenate([q0, v0]),
            args=p,
            saveat=diffrax.SaveAt(t1=True),
            max_steps=100_000,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
        )
        return sol.ys[-1]

    def final_q(p, q0, v0):
        return final_y(p, q0, v0)[:2]

    def loss(p, q0, v0):
        y = final_y(p, q0, v0)
        return jnp.sum(y[:2] ** 2) + jnp.sum(jnp.stack(_peers._equations(jnp, T1, y, p)[1]) ** 2)

    return {
        "forward": final_q,
        "batch": jax.vmap(final_q, in_axes=(None, 0, 0)),
        "gradient": value_and_gradient(loss),
    }


# -- CasADi --------------------------------------------------------------------------------


def casadi_integrator(method: str, t1: float = T1, rtol: float = RTOL, atol: float = ATOL):
    dae, phi = _peers.casadi_dae(ca)
    opts = {
        "abstol": atol,
        "reltol": rtol,
        "linear_multistep_method": method,
        "max_num_steps": 100_000,
    }
    return ca.integrator(f"F_{method}", "cvodes", dae, 0.0, t1, opts), phi


def casadi_map(integrator, num: int):
    """`integrator.map(num, "thread", cores)` if CasADi has threads, else serial."""
    cores = os.cpu_count() or 1
    try:
        return integrator.map(num, "thread", cores), f"thread×{cores}"
    except RuntimeError:
        return integrator.map(num), "serial"


def casadi_gradient(integrator, phi, x0):
    """`(loss, ∂loss/∂p)` with reverse mode through the integrator (CVODES adjoints)."""
    p = ca.MX.sym("p", 5)
    xf = integrator(x0=x0, p=p)["xf"]
    loss = ca.sumsqr(xf[:2]) + ca.sumsqr(phi(T1, xf))
    grad = ca.jtimes(loss, p, ca.DM.ones(1), True)
    return ca.Function("G", [p], [loss, grad])


# -- the run -------------------------------------------------------------------------------


def main(out: Path, quick: bool = False) -> dict:
    stamp = run_stamp()
    folder = output_dir(out, NAME)
    reps = 2 if quick else 7
    batch = 64 if quick else 1024
    scipy_batch = 4 if quick else 16
    inner = 3 if quick else 10  # calls per repetition for the single-trajectory timings

    q0, v0 = (np.asarray(x) for x in TwoLinkManipulator().initial_state())
    y0 = np.concatenate([q0, v0])
    qb, vb = _peers.perturbed_states(batch)
    params_np = _peers.PARAMS
    params = jaxdae_params()

    # Reference for q(2): SciPy DOP853 at tight tolerances.
    reference = solve_ivp(
        _peers.numpy_rhs(), (0.0, T1), y0, method="DOP853", rtol=1e-13, atol=1e-14
    ).y[:2, -1]

    # Set-up / compile.
    warm_up_jax()
    fns = jaxdae_functions()
    args1 = (params, jnp.asarray(q0), jnp.asarray(v0))
    argsb = (params, jnp.asarray(qb), jnp.asarray(vb))
    jd_forward, c_forward = compile_jaxdae(fns["forward"], *args1)
    jd_batch, c_batch = compile_jaxdae(fns["batch"], *argsb)
    jd_ensemble, c_ensemble = compile_jaxdae(fns["ensemble"], *argsb)
    jd_grad, c_grad = compile_jaxdae(fns["gradient"], *args1)
    jd_sweep, c_sweep = compile_jaxdae(fns["gradient, reverse sweep"], *args1)
    setup = {
        "jaxdae": c_forward["total"],
        "jaxdae (gradient)": c_grad["total"],
        "jaxdae (batch)": c_batch["total"],
        ENSEMBLE: c_ensemble["total"],
        SWEEP: c_sweep["total"],
    }
    hw = handwritten_functions()
    p_hw = jnp.asarray(params_np)
    hw1 = (p_hw, jnp.asarray(q0), jnp.asarray(v0))
    hwb = (p_hw, jnp.asarray(qb), jnp.asarray(vb))
    hw_forward, hc_forward = compile_jaxdae(hw["forward"], *hw1)
    hw_batch, hc_batch = compile_jaxdae(hw["batch"], *hwb)
    hw_grad, hc_grad = compile_jaxdae(hw["gradient"], *hw1)
    setup[HANDWRITTEN] = hc_forward["total"]
    setup[HANDWRITTEN + " (gradient)"] = hc_grad["total"]
    setup[HANDWRITTEN + " (batch)"] = hc_batch["total"]
    cas = {}
    map_mode = None
    for method in ("adams", "bdf"):
        start = time.perf_counter()
        integrator, phi = casadi_integrator(method)
        mapped, map_mode = casadi_map(integrator, batch)
        grad = casadi_gradient(integrator, phi, y0)
        setup[f"CasADi CVODES-{method}"] = time.perf_counter() - start
        cas[method] = (integrator, mapped, grad)
    setup["SciPy DOP853"] = setup["SciPy LSODA"] = 0.0
    rhs = _peers.numpy_rhs(params_np)

    runners = {
        "jaxdae": {
            "single": lambda: np.asarray(_block(jd_forward(*args1))),
            "batch": lambda: np.asarray(_block(jd_batch(*argsb))),
            "grad": lambda: split_gradient(_block(jd_grad(*args1))),
        },
        ENSEMBLE: {
            "single": None,
            "batch": lambda: np.asarray(_block(jd_ensemble(*argsb))),
            "grad": None,
        },
        SWEEP: {
            "single": None,
            "batch": None,
            "grad": lambda: split_gradient(_block(jd_sweep(*args1))),
        },
    }
    runners[HANDWRITTEN] = {
        "single": lambda: np.asarray(_block(hw_forward(*hw1))),
        "batch": lambda: np.asarray(_block(hw_batch(*hwb))),
        "grad": lambda: split_gradient(_block(hw_grad(*hw1))),
    }
    for method in ("adams", "bdf"):
        integrator, mapped, grad = cas[method]
        xb = np.concatenate([qb, vb], axis=1).T
        pb = np.tile(params_np[:, None], (1, batch))
        runners[f"CasADi CVODES-{method}"] = {
            "single": (lambda f: lambda: np.asarray(f(x0=y0, p=params_np)["xf"]).ravel()[:2])(
                integrator
            ),
            "batch": (lambda f, xb, pb: lambda: np.asarray(f(x0=xb, p=pb)["xf"])[:2].T)(  # noqa: B023
                mapped, xb, pb
            ),
            "grad": (
                lambda g: lambda: (lambda o: (float(o[0]), np.asarray(o[1]).ravel()))(g(params_np))
            )(grad),
        }
    for method in ("DOP853", "LSODA"):

        def single(method=method, y=y0):
            return solve_ivp(rhs, (0.0, T1), y, method=method, rtol=RTOL, atol=ATOL).y[:2, -1]

        def loop(method=method):
            return np.stack(
                [single(method, np.concatenate([qb[i], vb[i]])) for i in range(scipy_batch)]
            )

        runners[f"SciPy {method}"] = {"single": single, "batch": loop, "grad": None}

    # Warm up (first calls), then the interleaved repetitions.
    results = {name: {"single": [], "batch": [], "grad": []} for name in runners}
    block_means = {name: {"single": [], "grad": []} for name in runners}
    outputs = {}
    for name, run in runners.items():
        outputs[name] = {}
        if run["batch"] is not None:
            outputs[name]["batch"] = run["batch"]()
        if run["single"] is not None:
            outputs[name]["single"] = run["single"]()
        if run["grad"] is not None:
            outputs[name]["grad"] = run["grad"]()
    for rep in range(reps):
        for name, run in runners.items():
            if run["single"] is not None:
                calls = [_timed(run["single"])[1] for _ in range(inner)]
                results[name]["single"] += calls
                block_means[name]["single"].append(statistics.mean(calls))
            if run["batch"] is not None:
                _, t = _timed(run["batch"])
                results[name]["batch"].append(t)
            if run["grad"] is not None:
                calls = [_timed(run["grad"])[1] for _ in range(inner)]
                results[name]["grad"] += calls
                block_means[name]["grad"].append(statistics.mean(calls))
        print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr, flush=True)

    med = {
        name: {k: (statistics.median(v) if v else None) for k, v in r.items()}
        for name, r in results.items()
    }
    med_blocks = {
        name: {k: (statistics.median(v) if v else None) for k, v in r.items()}
        for name, r in block_means.items()
    }
    n_batch = {name: (scipy_batch if name.startswith("SciPy") else batch) for name in runners}
    throughput = {
        name: n_batch[name] / med[name]["batch"] for name in runners if med[name]["batch"]
    }
    agreement = {
        name: float(np.max(np.abs(outputs[name]["single"] - reference)))
        for name in runners
        if "single" in outputs[name]
    }
    batch_agreement = {
        name: float(
            np.max(
                np.abs(
                    outputs[name]["batch"] - outputs["CasADi CVODES-bdf"]["batch"][: n_batch[name]]
                )
            )
        )
        for name in runners
        if "batch" in outputs[name]
    }
    grad_ref = outputs["CasADi CVODES-bdf"]["grad"][1]
    grad_agreement = {
        name: float(np.max(np.abs(outputs[name]["grad"][1] - grad_ref)) / np.max(np.abs(grad_ref)))
        for name in runners
        if "grad" in outputs[name]
    }

    # Tables.
    lines = [
        f"Two-link, ModifiedLagrange(10, [20, 10], [100, 25]), t ∈ [0, {T1:g}], rtol={RTOL:g}, "
        f"atol={ATOL:g}, float64; medians over {reps} interleaved repetitions (one "
        f"trajectory and gradient: {inner} calls each per repetition, timed one by one); "
        f"batch = {batch} perturbed initial states (SciPy: loop over {scipy_batch}, "
        f"extrapolated); CasADi map: {map_mode}; device: {jax.devices()[0].device_kind}.",
        "",
        "| tool | setup/compile [s] | one trajectory [ms] | batch throughput [traj/s] | "
        "gradient [ms] | grad/forward | max abs err q(2) | batch q(2) vs CVODES-bdf | "
        "grad rel. diff vs CVODES-bdf |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in runners:
        m = med[name]
        single_ms = f"{1e3 * m['single']:.3g}" if m["single"] else "–"
        grad_ms = f"{1e3 * m['grad']:.3g}" if m["grad"] else "n/a"
        forward = med["jaxdae"]["single"] if name == SWEEP else m["single"]  # same forward
        ratio = f"{m['grad'] / forward:.2f}" if m["grad"] else "n/a"
        gagree = f"{grad_agreement[name]:.1e}" if name in grad_agreement else "n/a"
        err = f"{agreement[name]:.1e}" if name in agreement else "–"
        compile_s = (
            f"{setup[name]:.2f} (grad {setup[name + ' (gradient)']:.2f}, "
            f"batch {setup[name + ' (batch)']:.2f})"
            if name + " (batch)" in setup
            else f"grad {setup[name]:.2f}"
            if name == SWEEP
            else f"{setup[name]:.2f}"
            if name == ENSEMBLE
            else f"{setup[name]:.3f}"
        )
        rate = f"{throughput[name]:,.0f}" if name in throughput else "–"
        batch_err = f"{batch_agreement[name]:.1e}" if name in batch_agreement else "–"
        lines.append(
            f"| {name} | {compile_s} | {single_ms} | {rate} | "
            f"{grad_ms} | {ratio} | {err} | {batch_err} | {gagree} |"
        )
    lines += [
        "",
        "jaxdae compile breakdown [s]:",
        "",
        "| function | trace | lower | XLA compile | total |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, c in (
        ("simulate", c_forward),
        ("gradient", c_grad),
        ("gradient, ReverseSweepAdjoint", c_sweep),
        ("vmap batch", c_batch),
        ("simulate_ensemble batch", c_ensemble),
        ("hand-written RHS: solve", hc_forward),
        ("hand-written RHS: gradient", hc_grad),
        ("hand-written RHS: vmap batch", hc_batch),
    ):
        lines.append(
            f"| {label} | {c['trace']:.2f} | {c['lower']:.2f} | {c['compile']:.2f} | "
            f"{c['total']:.2f} |"
        )

    jd, adams = med["jaxdae"], med["CasADi CVODES-adams"]
    sweep = med[SWEEP]["grad"]
    # Batch target: the faster of jaxdae's two batch APIs (both are reported).
    best_batch = max(throughput["jaxdae"], throughput[ENSEMBLE])

    def batch_ratio(peer):
        return (
            f"ensemble {throughput[ENSEMBLE] / throughput[peer]:.1f}×, "
            f"vmap {throughput['jaxdae'] / throughput[peer]:.1f}×"
        )

    targets = [
        (
            "one trajectory ≤ CasADi CVODES-Adams",
            jd["single"] <= adams["single"],
            f"{1e3 * jd['single']:.3g} ms vs {1e3 * adams['single']:.3g} ms",
        ),
        (
            "batch throughput ≥ 10× CasADi map (Adams)",
            best_batch >= 10 * throughput["CasADi CVODES-adams"],
            batch_ratio("CasADi CVODES-adams"),
        ),
        (
            "batch throughput ≥ 10× CasADi map (BDF)",
            best_batch >= 10 * throughput["CasADi CVODES-bdf"],
            batch_ratio("CasADi CVODES-bdf"),
        ),
        (
            "gradient ≤ CasADi adjoint (Adams)",
            jd["grad"] <= adams["grad"],
            f"{1e3 * jd['grad']:.3g} ms vs {1e3 * adams['grad']:.3g} ms",
        ),
        # The default adjoint decides the gradient targets; one segment is reported beside.
        (
            "gradient ≤ 3× own forward",
            jd["grad"] <= 3 * jd["single"],
            f"{jd['grad'] / jd['single']:.2f}× (one segment, `max_steps=1024`: "
            f"{sweep / jd['single']:.2f}×; by medians of the repetitions' means: "
            f"{med_blocks['jaxdae']['grad'] / med_blocks['jaxdae']['single']:.2f}× and "
            f"{med_blocks[SWEEP]['grad'] / med_blocks['jaxdae']['single']:.2f}×)",
        ),
        ("compile simulate ≤ 2 s", c_forward["total"] <= 2.0, f"{c_forward['total']:.2f} s"),
        (
            "compile gradient ≤ 5 s",
            c_grad["total"] <= 5.0,
            f"{c_grad['total']:.2f} s (one segment, `max_steps=1024`: {c_sweep['total']:.2f} s)",
        ),
    ]
    lines += ["", "| target | met | measured |", "| --- | :---: | --- |"]
    lines += [f"| {t} | {'yes' if ok else 'NO'} | {v} |" for t, ok, v in targets]
    print("\n".join(lines))

    write_json(
        folder / "bench_core.json",
        {
            "medians": med,
            "block_means": med_blocks,
            "inner": inner,
            "throughput": throughput,
            "setup": setup,
            "compile": {
                "forward": c_forward,
                "gradient": c_grad,
                "sweep_gradient": c_sweep,
                "batch": c_batch,
                "ensemble": c_ensemble,
            },
            "agreement_q2": agreement,
            "batch_agreement_q2": batch_agreement,
            "grad_agreement": grad_agreement,
            "raw": results,
            "map_mode": map_mode,
            "targets": {t: bool(ok) for t, ok, _ in targets},
            "reps": reps,
            "batch": batch,
        },
    )
    write(
        out,
        NAME,
        page_tables(
            stamp,
            batch=batch,
            med=med,
            throughput=throughput,
            setup=setup,
            compile_s={
                "forward": c_forward,
                "gradient": c_grad,
                "sweep": c_sweep,
                "batch": c_batch,
                "ensemble": c_ensemble,
                "hand-written forward": hc_forward,
                "hand-written gradient": hc_grad,
                "hand-written batch": hc_batch,
            },
            agreement=agreement,
            batch_agreement=batch_agreement,
            grad_agreement=grad_agreement,
            targets=targets,
        ),
    )
    met = sum(ok for _, ok, _ in targets)
    headline = (
        f"jaxdae {1e3 * jd['single']:.2g} ms/trajectory vs CVODES-Adams "
        f"{1e3 * adams['single']:.2g} ms; batch {throughput['jaxdae']:,.0f} traj/s "
        f"({throughput['jaxdae'] / throughput['CasADi CVODES-adams']:.1f}× CasADi map), "
        f"ensemble {throughput[ENSEMBLE]:,.0f} traj/s "
        f"({throughput[ENSEMBLE] / throughput['CasADi CVODES-adams']:.1f}×); "
        f"{met}/{len(targets)} targets met"
    )
    return {"headline": headline, "table": lines}


# -- the tables of docs/benchmarks.md --------------------------------------------------------

PAGE_TOOLS = {
    "jaxdae": "jaxdae `simulate`",
    ENSEMBLE: "jaxdae `simulate_ensemble`",
    SWEEP: "jaxdae, one segment (`max_steps=1024`)",
    HANDWRITTEN: "diffrax on hand-written equations",
    "CasADi CVODES-adams": "CasADi CVODES-Adams",
    "CasADi CVODES-bdf": "CasADi CVODES-BDF",
    "SciPy DOP853": "SciPy DOP853",
    "SciPy LSODA": "SciPy LSODA",
}


def _error(x: float | None) -> str:
    return "–" if x is None else "0" if x == 0 else f"{x:.1e}"


def page_tables(
    stamp: dict,
    *,
    batch: int,
    med: dict,
    throughput: dict,
    setup: dict,
    compile_s: dict,
    agreement: dict,
    batch_agreement: dict,
    grad_agreement: dict,
    targets: list,
) -> list[dict]:
    """The three tables of docs/benchmarks.md (`bench_core.tools`, `bench_core.compile`,
    `bench_core.targets`) from the run's medians (seconds), compile times and agreements."""
    rows = []
    for name, label in PAGE_TOOLS.items():
        m = med[name]
        if name + " (batch)" in setup:
            compile_cell = (
                f"{setup[name]:.2f} (gradient {setup[name + ' (gradient)']:.2f}, "
                f"batch {setup[name + ' (batch)']:.2f})"
            )
        elif name == SWEEP:
            compile_cell = f"gradient {setup[name]:.2f}"
        elif name == ENSEMBLE:
            compile_cell = f"{setup[name]:.2f}"
        elif name.startswith("SciPy"):
            compile_cell = "–"
        else:
            compile_cell = f"{setup[name]:.3f}"
        forward = med["jaxdae"]["single"] if name == SWEEP else m["single"]
        rows.append(
            [
                label,
                compile_cell,
                f"{1e3 * m['single']:.3g}" if m["single"] else "–",
                f"{throughput[name]:,.0f}" if name in throughput else "–",
                f"{1e3 * m['grad']:.3g}" if m["grad"] else "–",
                f"{m['grad'] / forward:.2f}" if m["grad"] else "–",
                _error(agreement.get(name)),
                _error(batch_agreement.get(name)),
                _error(grad_agreement.get(name)),
            ]
        )
    tools = table(
        "bench_core.tools",
        [("tool", "left")]
        + [
            (title, "right")
            for title in (
                "compile [s]",
                "one trajectory [ms]",
                "batch [traj/s]",
                "gradient [ms]",
                "gradient / forward",
                "max abs err q(2)",
                "batch q(2) vs CVODES-BDF",
                "gradient rel. diff. vs CVODES-BDF",
            )
        ],
        rows,
        stamp,
    )
    phases = []
    for label, key in (
        ("`simulate`", "forward"),
        ("gradient, default adjoint", "gradient"),
        ("gradient, one segment", "sweep"),
        (f"`jax.vmap(simulate)`, {batch:,}", "batch"),
        (f"`simulate_ensemble`, {batch:,}", "ensemble"),
    ):
        c = compile_s[key]
        phases.append([label, *(f"{c[k]:.2f}" for k in ("trace", "lower", "compile", "total"))])
    hand = [compile_s[f"hand-written {k}"] for k in ("forward", "gradient", "batch")]
    phases.append(
        [
            "diffrax on hand-written equations: solve / gradient / batch",
            *(
                " / ".join(f"{c[k]:.2f}" for c in hand)
                for k in ("trace", "lower", "compile", "total")
            ),
        ]
    )
    compile_table = table(
        "bench_core.compile",
        [("function", "left")] + [(t, "right") for t in ("trace", "lower", "XLA compile", "total")],
        phases,
        stamp,
    )
    jd, adams = med["jaxdae"], med["CasADi CVODES-adams"]
    rate = throughput["CasADi CVODES-adams"]
    c = {k: compile_s[k]["total"] for k in ("forward", "gradient", "sweep")}
    met = {text: ok for text, ok, _ in targets}

    def yes(prefix):
        return next("yes" if ok else "no" for text, ok in met.items() if text.startswith(prefix))

    target_rows = [
        [
            "one trajectory ≤ CasADi CVODES-Adams",
            yes("one trajectory"),
            f"{1e3 * jd['single']:.3g} vs {1e3 * adams['single']:.3g} ms "
            f"({adams['single'] / jd['single']:.1f}× faster)",
        ],
        [
            f"batch of {batch:,} ≥ 10× CasADi's `map` (Adams)",
            yes("batch throughput ≥ 10× CasADi map (Adams)"),
            f"ensemble {throughput[ENSEMBLE] / rate:.1f}× "
            f"(`vmap` {throughput['jaxdae'] / rate:.1f}×)",
        ],
        [
            "gradient ≤ CasADi's adjoint (Adams)",
            yes("gradient ≤ CasADi"),
            f"{1e3 * jd['grad']:.3g} vs {1e3 * adams['grad']:.3g} ms "
            f"({adams['grad'] / jd['grad']:.1f}× faster)",
        ],
        [
            "gradient ≤ 3× its own forward solve",
            yes("gradient ≤ 3×"),
            f"{jd['grad'] / jd['single']:.2f}× (one segment "
            f"{med[SWEEP]['grad'] / jd['single']:.2f}×)",
        ],
        ["compile `simulate` ≤ 2 s", yes("compile simulate"), f"{c['forward']:.2f} s"],
        [
            "compile gradient ≤ 5 s",
            yes("compile gradient"),
            f"{c['gradient']:.2f} s (one segment {c['sweep']:.2f} s)",
        ],
    ]
    targets_table = table(
        "bench_core.targets",
        [("target", "left"), ("met", "left"), ("measured", "left")],
        target_rows,
        stamp,
    )
    return [tools, compile_table, targets_table]


if __name__ == "__main__":
    args = parse_args(NAME, __doc__.splitlines()[0])
    main(args.out, args.quick)
