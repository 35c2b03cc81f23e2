"""Benchmark: cost against the size of the mechanism (jaxdae, hand-written diffrax, CasADi).

Four model families of growing size (`jaxdae/examples/_scaling.py`): the Cartesian chain
of `N` point masses (`2N` coordinates, `N` constraints), the `N`-link pendulum in relative
joint angles (`N` coordinates, dense mass matrix, no constraints), a ladder of `N`
four-bars in absolute coordinates (`4N` coordinates, `3N` constraints) and a net of `N`
rows of 5 point masses joined by bars (`10N` coordinates, `9N` constraints). Every model is
solved with `Baumgarte(kd=20, kp=100)` over `t ∈ [0, 1]` from rest, `rtol = 1e-8`,
`atol = 1e-10`, float64, by

- jaxdae: one `jax.jit`-compiled `simulate` (Tsit5, or `--solver`; PID controller); its
  gradient, with
  `eqx.filter_grad`, of `|q(1)|²` with respect to the gains and the initial velocities (the
  pendulum has no constraints: its gains do not enter); a `jax.vmap` batch of initial
  velocities perturbed by `1e-3 · N(0, 1)`; the compile times (trace + lower + XLA compile,
  ahead of time) of the solve and of the gradient;
- "diffrax + hand-written RHS": the same ODE written by hand in `jax.numpy` (dense
  `jnp.linalg.solve` of `J M⁻¹ Jᵀ`, or of `M` for the pendulum), solved by
  `diffrax.diffeqsolve` with the same solver and controller; the same quantities;
- CasADi: the same ODE from SX derivatives of `T`, `V`, `Φ` with CasADi's sparse LDL
  (`casadi.solve(..., "ldl")`), integrated by CVODES Adams with functional iteration at the
  same tolerances; its gradient by CVODES adjoint sensitivities; the batch with
  `Function.map` over threads. Left out if CasADi is not installed.

OpenBLAS (LAPACK inside JAX) runs on one thread unless `OPENBLAS_NUM_THREADS` says otherwise.
Times are medians of `--repeats` calls after a first (warm-up) call; "per step" divides a
solve by its number of steps (accepted and rejected). A method × size whose single solve
would exceed `--budget` seconds, extrapolated from the previous size as `t · (n / n_prev)^2.5`,
or whose compile took more than `--compile-budget` seconds at the previous size, is skipped and
marked so in the table; the batch shrinks at large sizes to what fits in `--budget`. The table's
last column is the largest `|q(1)|` difference from jaxdae's end state.

`--cpu-per-step` measures instead, for jaxdae only, the process CPU time (all threads; steadier
than wall time on a shared machine) of one solve per step, of one right-hand side (`R` of them
in a compiled loop), of the gradient against the solve, of the failure test that ends every
step and of one vector–Jacobian product of the right-hand side (the reverse sweep's, at every
stage), at each size, and fits the growth exponent of the time per step against the number of
coordinates (log-log least squares).

    python experiments/benchmarks/bench_scaling.py [--quick] [--out output] [--sizes 2,4,8,...]
        [--families chain,pendulum,ladder,net] [--max-coordinates chain=512,pendulum=64]
        [--batch 256] [--budget 20] [--repeats 3] [--solver Tsit5|Dopri8] [--cpu-per-step]
"""

import argparse
import functools
import math
import os
import statistics
import sys
import time
from pathlib import Path

# One BLAS thread (before NumPy and JAX load OpenBLAS), as CVODES and CasADi's LDL run: on a
# busy 2-core machine OpenBLAS's threads made LAPACK's `eigvalsh` of a 64 × 64 matrix take
# 7 ms of CPU instead of 0.44 ms and a 128 × 128 Cholesky 2–12 ms instead of 0.1 ms, which
# would measure the contention, not the methods. Set OPENBLAS_NUM_THREADS to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _tables
import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import output_dir, write_json

import jaxdae
import jaxdae.examples._scaling as scaling_models
from jaxdae._systems._system import cast_floating  # the library's own float32 cast

try:
    import casadi as ca
except ImportError:  # the CasADi rows are left out
    ca = None
if ca is not None:
    from bench_core import casadi_map, warm_up_jax
else:  # bench_core needs CasADi
    casadi_map = None

    def warm_up_jax():
        pass


NAME = "bench_scaling"
T1, RTOL, ATOL = 1.0, 1e-8, 1e-10
KD, KP = 20.0, 100.0
JAXDAE, HANDWRITTEN, CASADI = "jaxdae", "diffrax + hand-written RHS", "CasADi CVODES-Adams"
METHODS = (JAXDAE, HANDWRITTEN, CASADI)
DEFAULT_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
QUICK_SIZES = (2, 8)
GROWTH = 2.5  # exponent of the extrapolation that decides what to skip


def _median_time(fn, repeats):
    """`(first output, median seconds of repeats calls)`; `fn` was called once before."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def perturbed_velocities(v0, batch, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(np.asarray(v0) + 1e-3 * rng.standard_normal((batch, v0.shape[0])))


# -- jaxdae and hand-written diffrax ---------------------------------------------------------


SOLVERS = {"Tsit5": diffrax.Tsit5(), "Dopri8": diffrax.Dopri8()}


def jaxdae_functions(model, solver=SOLVERS["Tsit5"], rtol=RTOL, atol=ATOL):
    """`forward(gains, q0, v0) -> (q(1), steps)` and `gradient(gains, q0, v0)`, solved with
    `solver` at `rtol`, `atol`."""

    def simulate(gains, q0, v0):
        return jaxdae.simulate(
            model, jaxdae.Baumgarte(*gains), 0.0, T1, q0, v0, solver=solver, rtol=rtol, atol=atol
        )

    def forward(gains, q0, v0):
        sol = simulate(gains, q0, v0)
        return sol.q_final, sol.stats["num_steps"]

    def gradient(gains, q0, v0):
        def loss(diff):
            formulation, v0_ = diff
            sol = jaxdae.simulate(
                model, formulation, 0.0, T1, q0, v0_, solver=solver, rtol=rtol, atol=atol
            )
            return jnp.sum(sol.q_final**2)

        return eqx.filter_grad(loss)((jaxdae.Baumgarte(*gains), v0))

    return forward, gradient


def handwritten_functions(model, solver=SOLVERS["Tsit5"], rtol=RTOL, atol=ATOL):
    """The same as `jaxdae_functions` on `model.handwritten_rhs()` with `diffrax` directly."""
    rhs = model.handwritten_rhs()

    def solve(gains, q0, v0):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(rhs),
            solver,
            0.0,
            T1,
            None,
            jnp.concatenate([q0, v0]),
            args=gains,
            saveat=diffrax.SaveAt(t1=True),
            max_steps=100_000,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        )

    def forward(gains, q0, v0):
        sol = solve(gains, q0, v0)
        return sol.ys[-1, : q0.shape[0]], sol.stats["num_steps"]

    def gradient(gains, q0, v0):
        def loss(diff):
            gains_, v0_ = diff
            return jnp.sum(solve(gains_, q0, v0_).ys[-1, : q0.shape[0]] ** 2)

        return jax.grad(loss)((gains, v0))

    return forward, gradient


def _compile(fn, *args):
    """`(compiled fn, {"trace", "lower", "compile", "total"})`: `jax.jit(fn)` traced, lowered
    and compiled ahead of time (each model is new, so no cache holds it), once. The timings
    call the compiled object, which JAX calls through its Python path when the program has
    host callbacks (jaxdae's and diffrax's runtime checks): about 0.1 ms more per call, on
    both JAX rows (`bench_core.compile_jaxdae` instead compiles twice to call through
    `jax.jit`)."""
    times = {}
    start = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    times["trace"] = time.perf_counter() - start
    lowered = traced.lower()
    times["lower"] = time.perf_counter() - start - times["trace"]
    compiled = lowered.compile()
    times["total"] = time.perf_counter() - start
    times["compile"] = times["total"] - times["trace"] - times["lower"]
    jax.block_until_ready(compiled(*args))
    return compiled, times


def measure_jax(functions, model, skip, batch, repeats, budget):
    """Times one JAX method (`jaxdae_functions` or `handwritten_functions`) on `model`;
    `skip` names the parts ("all", "gradient") extrapolated past the budget."""
    forward, gradient = functions(model)
    q0, v0 = model.initial_state()
    gains = (jnp.asarray(KD), jnp.asarray(KP))
    out = {}
    jitted, out["compile"] = _compile(forward, gains, q0, v0)
    (q_final, steps), single = _median_time(
        lambda: jax.block_until_ready(jitted(gains, q0, v0)), repeats
    )
    out.update(
        single=single, steps=int(steps), per_step=single / int(steps), q_final=np.asarray(q_final)
    )
    if "gradient" not in skip:
        jitted_grad, out["compile_gradient"] = _compile(gradient, gains, q0, v0)
        _, out["gradient"] = _median_time(
            lambda: jax.block_until_ready(jitted_grad(gains, q0, v0)), repeats
        )
    size = int(min(batch, max(1, budget // single)))
    vb = perturbed_velocities(v0, size)
    batched = jax.jit(jax.vmap(lambda v: forward(gains, q0, v)[0]))
    jax.block_until_ready(batched(vb))
    _, t_batch = _median_time(
        lambda: jax.block_until_ready(batched(vb)), 1 if size * single > 1.0 else repeats
    )
    out.update(batch=size, batch_time=t_batch, throughput=size / t_batch)
    return out


def cpu_per_step(families, sizes, repeats, max_coordinates=None, calls=300):
    """The `--cpu-per-step` rows: `(family, size, coordinates, steps, solve per step [µs],
    right-hand side [µs], gradient / solve, failure test [µs], vector–Jacobian product of the
    right-hand side [µs])`, process CPU time, medians of `repeats`; sizes above
    `max_coordinates[family]` (where given) left out. The failure test is the formulation's
    check at the end of every step (`Baumgarte`: the pivots of `J M⁻¹ Jᵀ`); the product is the
    one the gradient's reverse sweep applies at every stage of every step (with respect to the
    state and the gains, its right-hand side evaluated with it)."""
    from jaxdae._integration._vector_fields import failure_reference, jitted_failure, jitted_rates

    formulation = jaxdae.Baumgarte(KD, KP)
    gains = (jnp.asarray(KD), jnp.asarray(KP))
    rows = []
    for family in families:
        for size in sizes:
            if coordinates(family, size) > (max_coordinates or {}).get(family, math.inf):
                continue
            model = scaling_models.FAMILIES[family](size)
            q0, v0 = model.initial_state()

            @jax.jit
            def rates(q, v, model=model):
                def body(i, total):  # each call depends on the last: not hoisted
                    return total + jitted_rates(model, formulation, 0.0, q + 1e-9 * total, v)[1]

                return jax.lax.fori_loop(0, calls, body, jnp.zeros_like(v))

            @jax.jit
            def failure(q, v, model=model):
                reference = failure_reference(model, formulation, 0.0, q, v)

                def body(i, total):
                    failed = jitted_failure(model, formulation, 0.0, q + 1e-9 * total, v, reference)
                    return total + jnp.asarray(failed, q.dtype)

                return jax.lax.fori_loop(0, calls, body, jnp.zeros((), q.dtype))

            @jax.jit
            def rates_vjp(q, v, model=model):
                def body(i, total):
                    out, pull = jax.vjp(
                        lambda q_, v_, f_: jitted_rates(model, f_, 0.0, q_, v_),
                        q + 1e-9 * total,
                        v,
                        formulation,
                    )
                    q_bar, v_bar, _ = pull(out)
                    return total + q_bar + v_bar

                return jax.lax.fori_loop(0, calls, body, jnp.zeros_like(v))

            forward, gradient = (jax.jit(f) for f in jaxdae_functions(model))
            steps = int(forward(gains, q0, v0)[1])
            jax.block_until_ready(
                (rates(q0, v0), gradient(gains, q0, v0), failure(q0, v0), rates_vjp(q0, v0))
            )
            times = {"solve": [], "rates": [], "gradient": [], "failure": [], "vjp": []}
            for _ in range(repeats):  # interleaved
                for name, fn, fn_args in (
                    ("solve", forward, (gains, q0, v0)),
                    ("rates", rates, (q0, v0)),
                    ("gradient", gradient, (gains, q0, v0)),
                    ("failure", failure, (q0, v0)),
                    ("vjp", rates_vjp, (q0, v0)),
                ):
                    start = time.process_time()
                    jax.block_until_ready(fn(*fn_args))
                    times[name].append(time.process_time() - start)
            solve, rhs, grad, fail, vjp = (
                statistics.median(times[k])
                for k in ("solve", "rates", "gradient", "failure", "vjp")
            )
            row = (
                family,
                size,
                q0.size,
                steps,
                1e6 * solve / steps,
                1e6 * rhs / calls,
                grad / solve,
                1e6 * fail / calls,
                1e6 * vjp / calls,
            )
            rows.append(row)
            print(
                "| {} | {} | {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |".format(*row),
                flush=True,
            )
    for family in families:
        mine = [r for r in rows if r[0] == family]
        if len(mine) > 1:
            n = np.log([r[2] for r in mine])
            step, rhs = (np.polyfit(n, np.log([r[k] for r in mine]), 1)[0] for k in (4, 5))
            print(
                f"{family}: time per step grows as n^{step:.2f}, one right-hand side as "
                f"n^{rhs:.2f} ({mine[0][2]} to {mine[-1][2]} coordinates)"
            )
    return rows


# -- CasADi ----------------------------------------------------------------------------------


def casadi_integrator(model, rtol, atol):
    """CVODES Adams with functional iteration on `model`'s Baumgarte ODE (parameters: the
    gains), from 0 to `T1`."""
    dae = scaling_models.casadi_baumgarte_ode(ca, model)
    options = {
        "abstol": atol,
        "reltol": rtol,
        "linear_multistep_method": "adams",
        "nonlinear_solver_iteration": "functional",
        "max_num_steps": 100_000,
    }
    return ca.integrator("F", "cvodes", dae, 0.0, T1, options)


def measure_casadi(model, skip, batch, repeats, budget):
    q0, v0 = (np.asarray(x) for x in model.initial_state())
    n = q0.size
    x0 = np.concatenate([q0, v0])
    gains = np.array([KD, KP])
    start = time.perf_counter()
    integrator = casadi_integrator(model, RTOL, ATOL)
    out = {"compile": {"total": time.perf_counter() - start}}

    def forward():
        return np.asarray(integrator(x0=x0, p=gains)["xf"]).ravel()[:n]

    forward()
    q_final, single = _median_time(forward, repeats)
    steps = int(integrator.stats()["nsteps"])
    out.update(single=single, steps=steps, per_step=single / steps, q_final=q_final)
    if "gradient" not in skip:
        start = time.perf_counter()
        p, v = ca.MX.sym("p", 2), ca.MX.sym("v0", n)
        xf = integrator(x0=ca.vertcat(ca.DM(q0), v), p=p)["xf"]
        loss = ca.sumsqr(xf[:n])
        grad = ca.Function("G", [p, v], [ca.gradient(loss, ca.vertcat(p, v))])
        grad(gains, v0)
        out["compile_gradient"] = {"total": time.perf_counter() - start}
        _, out["gradient"] = _median_time(lambda: np.asarray(grad(gains, v0)), repeats)
    size = int(min(batch, max(1, budget // single)))
    mapped, mode = casadi_map(integrator, size)
    xb = np.concatenate(
        [np.tile(q0[:, None], (1, size)), np.asarray(perturbed_velocities(v0, size)).T]
    )
    pb = np.tile(gains[:, None], (1, size))
    mapped(x0=xb, p=pb)
    _, t_batch = _median_time(lambda: mapped(x0=xb, p=pb), 1 if size * single > 1.0 else repeats)
    out.update(batch=size, batch_time=t_batch, throughput=size / t_batch, map_mode=mode)
    return out


# -- batch throughput (GPU) -----------------------------------------------------------------

# float32 cannot meet rtol = 1e-8: its rows use the tolerances of `bench_batch.py`.
THROUGHPUT_TOLERANCES = {"float64": (RTOL, ATOL), "float32": (1e-5, 1e-7)}
THROUGHPUT_TOOLS = ("vmap", "ensemble", "vmap, UnrolledERK", "hand-written, vmap")


def batched_solve(model, tool, dtype):
    """`solve(gains, q0, v0) -> (q(1), steps)` of a batch (leading axis of `v0`) of `model`'s
    Baumgarte ODE in `dtype`, by `tool` (one of `THROUGHPUT_TOOLS`)."""
    model = cast_floating(model, dtype)
    rtol, atol = THROUGHPUT_TOLERANCES[jnp.dtype(dtype).name]
    if tool == "hand-written, vmap":
        rhs = model.handwritten_rhs()

        def one(gains, q0, v0):
            # Times in the state's dtype, as jaxdae's: float64 times would promote a float32
            # solve's increments to float64 (half the steps on the chain of 64 links).
            t0, t1 = jnp.asarray(0.0, q0.dtype), jnp.asarray(T1, q0.dtype)
            sol = diffrax.diffeqsolve(
                diffrax.ODETerm(rhs),
                diffrax.Tsit5(),
                t0,
                t1,
                None,
                jnp.concatenate([q0, v0]),
                args=gains,
                saveat=diffrax.SaveAt(t1=True),
                max_steps=100_000,
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            )
            return sol.ys[-1, : q0.shape[0]], sol.stats["num_steps"]

        return jax.vmap(one, in_axes=(None, None, 0))
    solver = jaxdae.UnrolledERK(diffrax.Tsit5()) if "Unrolled" in tool else diffrax.Tsit5()
    options = {"solver": solver, "rtol": rtol, "atol": atol}
    if tool == "ensemble":

        def ensemble(gains, q0, v0):
            q0 = jnp.broadcast_to(q0, v0.shape)
            sol = jaxdae.simulate_ensemble(
                model, jaxdae.Baumgarte(*gains), 0.0, T1, q0, v0, **options
            )
            return sol.q_final, sol.stats["num_steps"]

        return ensemble

    def one(gains, q0, v0):
        sol = jaxdae.simulate(model, jaxdae.Baumgarte(*gains), 0.0, T1, q0, v0, **options)
        return sol.q_final, sol.stats["num_steps"]

    return jax.vmap(one, in_axes=(None, None, 0))


def batch_throughput(family, size, batch, repeats, tools, on_row=None):
    """The `--throughput` rows: trajectories per second of `batch` perturbed trajectories of
    `family` of `size` by each of `tools`, float64 and float32, on the default device, with
    compile times, step counts and the agreement of `q(1)` (float32 against float64, every
    tool against jaxdae's `vmap`, and on an accelerator float64 against the host CPU's for
    the first 16 trajectories)."""
    model = scaling_models.FAMILIES[family](size)
    q0, v0 = model.initial_state()
    vb = perturbed_velocities(v0, batch)
    rows, finals = [], {}
    for dtype in ("float64", "float32"):
        gains = (jnp.asarray(KD, dtype), jnp.asarray(KP, dtype))
        args = (gains, q0.astype(dtype), vb.astype(dtype))
        for tool in tools:
            start = time.perf_counter()
            compiled, compile_times = _compile(batched_solve(model, tool, dtype), *args)
            (q_final, steps), seconds = _median_time(
                lambda compiled=compiled, args=args: jax.block_until_ready(compiled(*args)), repeats
            )
            finals[tool, dtype] = np.asarray(q_final, dtype=np.float64)
            steps = np.asarray(steps)
            row = {
                "tool": tool,
                "dtype": dtype,
                "batch": batch,
                "seconds": seconds,
                "throughput": batch / seconds,
                "compile": compile_times["total"],
                "steps_median": float(np.median(steps)),
                "steps_max": int(steps.max()),
                "finite": bool(np.isfinite(finals[tool, dtype]).all()),
            }
            rows.append(row)
            print(
                f"  {tool} {dtype}: {batch / seconds:,.0f} traj/s ({seconds:.3g} s a call, "
                f"compile {row['compile']:.1f} s; {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            if on_row is not None:
                on_row(rows, {})
        if casadi_map is not None:
            rows.append(casadi_throughput(model, vb, repeats, dtype))
            finals[rows[-1]["tool"], dtype] = rows[-1].pop("q_final")
            print(
                f"  {rows[-1]['tool']}, {dtype} tolerances: {rows[-1]['throughput']:,.0f} traj/s",
                flush=True,
            )
    reference = finals["vmap", "float64"]
    agreement = {}
    for row in rows:
        final = finals[row["tool"], row["dtype"]]
        row["difference"] = float(np.max(np.abs(final - reference[: final.shape[0]])))
        if row["dtype"] == "float32" and row["tool"] in tools:
            agreement[f"{row['tool']}: float32 against float64"] = float(
                np.max(np.abs(final - finals[row["tool"], "float64"]))
            )
    if jax.default_backend() != "cpu":
        cpu = jax.devices("cpu")[0]
        head = 16
        with jax.default_device(cpu):
            args = ((jnp.asarray(KD), jnp.asarray(KP)), q0, vb[:head])
            args = jax.device_put(args, cpu)
            q_cpu, _ = jax.jit(batched_solve(model, "vmap", "float64"))(*args)
        agreement["vmap float64: accelerator against host CPU (16 trajectories)"] = float(
            np.max(np.abs(reference[:head] - np.asarray(q_cpu)))
        )
    if on_row is not None:
        on_row(rows, agreement)
    return rows, agreement


def casadi_throughput(model, vb, repeats, dtype):
    """CasADi's row of `batch_throughput`: `Function.map` of the CVODES integrator over the
    host's cores, in float64 at the tolerances of `dtype`'s rows, on as many of the batch's
    trajectories as take about a second (at most all of them)."""
    rtol, atol = THROUGHPUT_TOLERANCES[dtype]
    integrator = casadi_integrator(model, rtol, atol)
    q0, v0 = (np.asarray(x) for x in model.initial_state())
    gains = np.array([KD, KP])
    start = time.perf_counter()
    integrator(x0=np.concatenate([q0, v0]), p=gains)
    single = time.perf_counter() - start
    size = int(min(len(vb), max(16, (os.cpu_count() or 1) / single)))
    mapped, mode = casadi_map(integrator, size)
    xb = np.concatenate([np.tile(q0[:, None], (1, size)), np.asarray(vb[:size]).T])
    pb = np.tile(gains[:, None], (1, size))
    out, seconds = _median_time(lambda: mapped(x0=xb, p=pb), repeats)
    steps = int(integrator.stats()["nsteps"])
    return {
        "tool": f"CasADi `map` ({mode})",
        "dtype": dtype,
        "batch": size,
        "seconds": seconds,
        "throughput": size / seconds,
        "compile": None,
        "steps_median": float(steps),
        "steps_max": steps,
        "finite": True,
        "q_final": np.asarray(out["xf"])[: q0.size].T,
    }


def throughput_table(rows, agreement):
    lines = [
        (
            "| tool | dtype | batch | trajectories / s | seconds a call | steps (median, max) "
            "| compile [s] | largest `q(1)` difference from `vmap` float64 |"
        ),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        difference = f"{r['difference']:.1e}" if "difference" in r else "–"
        compile_time = "–" if r["compile"] is None else f"{r['compile']:.1f}"
        lines.append(
            f"| {r['tool']} | {r['dtype']} | {r['batch']:,} | {r['throughput']:,.0f} | "
            f"{r['seconds']:.3g} | {r['steps_median']:g}, {r['steps_max']} | "
            f"{compile_time} | {difference} |"
        )
    lines += [f"- {name}: {value:.1e}" for name, value in agreement.items()]
    return lines


# The `--throughput` rows as docs/benchmarks.md names them.
THROUGHPUT_LABELS = {
    "vmap": "`jax.vmap(simulate)`",
    "ensemble": "`simulate_ensemble`",
    "vmap, UnrolledERK": "`vmap`, `UnrolledERK(Tsit5)`",
    "hand-written, vmap": "hand-written ODE, `vmap`",
}


def throughput_page_table(results: dict, stamp: dict) -> dict:
    """`bench_scaling.throughput-cpu` (or `-gpu`): trajectories per second of each tool, a
    column per model and dtype, with the steps (median over the batch) and the compile time;
    `results` maps `(family, size)` to `batch_throughput`'s rows."""
    columns, cells = [("tool", "left")], {}
    for (family, size), rows in results.items():
        for dtype in ("float64", "float32"):
            column = len(columns)
            columns.append((f"{family} of {size}, {dtype}", "right"))
            for r in rows:
                if r["dtype"] != dtype:
                    continue
                if r["compile"] is None:  # CasADi's `map`, on the host's cores
                    threads = r["tool"].partition("thread×")[2].rstrip(")")
                    label = f"CasADi `map`, {threads} host cores" if threads else r["tool"]
                    cell = f"{r['throughput']:,.0f} ({r['steps_median']:g} steps)"
                else:
                    label = THROUGHPUT_LABELS.get(r["tool"], r["tool"])
                    cell = (
                        f"{r['throughput']:,.0f} ({r['steps_median']:g} steps; "
                        f"{r['compile']:.1f} s)"
                    )
                cells.setdefault(label, {})[column] = cell
    body = [
        [label] + [row.get(column, "–") for column in range(1, len(columns))]
        for label, row in cells.items()
    ]
    device = "cpu" if jax.default_backend() == "cpu" else "gpu"
    return _tables.table(f"{NAME}.throughput-{device}", columns, body, stamp)


# -- the run ---------------------------------------------------------------------------------


def coordinates(family, size):
    return {"chain": 2 * size, "pendulum": size, "ladder": 4 * size, "net": 10 * size}[family]


def constraints(family, size):
    return {"chain": size, "pendulum": 0, "ladder": 3 * size, "net": 9 * size}[family]


def predicted_skip(previous, n, budget, compile_budget):
    """What to skip at `n` coordinates from the previous measured size (None: nothing)."""
    if previous is None:
        return set(), ""
    scale = (n / previous["n"]) ** GROWTH
    single = previous["single"] * scale
    if single > budget:
        return {"all"}, f"solve ≈ {single:.0f} s > budget"
    if previous["compile"]["total"] > compile_budget:  # compile time is no smooth power law
        return {
            "all"
        }, f"compile {previous['compile']['total']:.0f} s > budget at n = {previous['n']}"
    if "gradient" not in previous or previous["gradient"] * scale > budget:
        grad = previous.get("gradient")
        return {"gradient"}, (
            "gradient skipped at the previous size"
            if grad is None
            else f"gradient ≈ {grad * scale:.0f} s > budget"
        )
    return set(), ""


def run(
    families,
    sizes,
    batch,
    budget,
    compile_budget,
    repeats,
    methods,
    on_row=None,
    max_coordinates=None,
    solver=SOLVERS["Tsit5"],
):
    """Measures every family × size × method, the JAX methods with `solver`; `on_row(results)`
    after each size. Sizes with more coordinates than `max_coordinates[family]` (where
    given) are left out."""
    results = []
    for family in families:
        previous = dict.fromkeys(methods)
        for size in sizes:
            n = coordinates(family, size)
            if n > (max_coordinates or {}).get(family, n):
                continue
            model = scaling_models.FAMILIES[family](size)
            row = {
                "family": family,
                "size": size,
                "coordinates": n,
                "constraints": constraints(family, size),
                "methods": {},
            }
            for method in methods:
                skip, why = predicted_skip(previous[method], n, budget, compile_budget)
                if "all" in skip:
                    row["methods"][method] = {"skipped": why}
                    print(f"  {family} N={size} {method}: skipped ({why})", flush=True)
                    continue
                start = time.perf_counter()
                if method == CASADI:
                    result = measure_casadi(model, skip, batch, repeats, budget)
                else:
                    functions = functools.partial(
                        jaxdae_functions if method == JAXDAE else handwritten_functions,
                        solver=solver,
                    )
                    result = measure_jax(functions, model, skip, batch, repeats, budget)
                result["n"] = n
                if "gradient" in skip:
                    result["gradient_skipped"] = why
                row["methods"][method] = result
                previous[method] = result
                print(
                    f"  {family} N={size} {method}: solve {1e3 * result['single']:.3g} ms, "
                    f"{result['steps']} steps ({time.perf_counter() - start:.1f} s)",
                    flush=True,
                )
            set_differences(row["methods"])
            results.append(row)
            if on_row is not None:
                on_row(results)
    return results


def set_differences(methods: dict) -> None:
    """Each method's `difference`: the largest `|q(1)|` difference from jaxdae's end state."""
    reference = methods.get(JAXDAE, {}).get("q_final")
    for result in methods.values():
        if reference is not None and "q_final" in result:
            result["difference"] = float(np.max(np.abs(result["q_final"] - reference)))


def _ms(seconds):
    return f"{1e3 * seconds:.3g}"


# the page's tables (docs/benchmarks.md): `bench_scaling.solves` (the chain, the pendulum and
# the ladder), `bench_scaling.net`, `bench_scaling.per-step` (`--cpu-per-step`) and, with
# `--solver Dopri8`, `bench_scaling.dopri8`
SOLVE_COLUMNS = [("family", "left"), ("N", "right"), ("coordinates", "right"), ("method", "left")]
SOLVE_COLUMNS += [
    (title, "right")
    for title in (
        "solve [ms]",
        "steps",
        "per step [µs]",
        "gradient [ms]",
        "grad/solve",
        "batch [traj/s] (size)",
        "compile solve / gradient [s]",
        "max \\|Δq(1)\\| vs jaxdae",
    )
]
PER_STEP_COLUMNS = [("family", "left")] + [
    (title, "right")
    for title in (
        "coordinates",
        "steps",
        "solve per step [µs]",
        "one right-hand side [µs]",
        "gradient / solve",
        "failure test [µs]",
        "vector–Jacobian product [µs]",
    )
]
AGAINST_CASADI_COLUMNS = [("run", "right")] + [
    (title, "right")
    for title in (
        "jaxdae solve",
        "CasADi solve",
        "ratio",
        "hand-written diffrax solve",
        "\\|Δq(1)\\| CasADi vs jaxdae",
    )
]


def per_step_cells(row):
    """A `cpu_per_step` row as the page's `bench_scaling.per-step` shows it (no N)."""
    family, _, n, steps, solve, rhs, ratio, fail, vjp = row
    return [family, str(n), str(steps), f"{solve:.1f}"] + [
        f"{x:.2f}" for x in (rhs, ratio, fail, vjp)
    ]


def against_casadi_rows(results):
    """One row per model: jaxdae's solve, CasADi's, their ratio, the hand-written diffrax
    solve [ms] and the end states' difference (the run's label: `1` for a single model)."""
    rows = []
    for row in results:
        m = row["methods"]
        ours, theirs, hand = m.get(JAXDAE), m.get(CASADI), m.get(HANDWRITTEN)
        if not ours or not theirs or "single" not in ours or "single" not in theirs:
            continue
        label = "1" if len(results) == 1 else f"{row['family']} {row['size']}"
        rows.append(
            [
                label,
                _ms(ours["single"]),
                _ms(theirs["single"]),
                f"{ours['single'] / theirs['single']:.2f}",
                _ms(hand["single"]) if hand and "single" in hand else "–",
                f"{theirs['difference']:.1e}" if "difference" in theirs else "–",
            ]
        )
    return rows


def table_rows(results, methods):
    """The rows of the solve table (`SOLVE_COLUMNS`)."""
    rows = []
    for row in results:
        for method in methods:
            r = row["methods"].get(method)
            if r is None:
                continue
            cells = [row["family"], str(row["size"]), str(row["coordinates"]), method]
            if "skipped" in r:
                rows.append(cells + [f"skipped: {r['skipped']}"] + [""] * 7)
                continue
            grad = r.get("gradient")
            compile_grad = r.get("compile_gradient", {}).get("total")
            cells += [
                _ms(r["single"]),
                str(r["steps"]),
                f"{1e6 * r['per_step']:.3g}",
                _ms(grad) if grad else "skipped",
                f"{grad / r['single']:.2f}" if grad else "–",
                f"{r['throughput']:,.3g} ({r['batch']})",
                f"{r['compile']['total']:.2f} / "
                + (f"{compile_grad:.2f}" if compile_grad is not None else "–"),
                f"{r['difference']:.1e}" if "difference" in r else "–",
            ]
            rows.append(cells)
    return rows


def markdown_lines(results, methods):
    """The solve table as Markdown lines."""
    rule = ["---:" if align == "right" else "---" for _, align in SOLVE_COLUMNS]
    lines = ["| " + " | ".join(t for t, _ in SOLVE_COLUMNS) + " |", "| " + " | ".join(rule) + " |"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in table_rows(results, methods)]


def page_tables(results, methods, solver, stamp):
    """The page's tables of a run: the solve table (its net rows apart), and with a solver
    other than Tsit5 the comparison with CasADi."""
    rows = table_rows(results, methods)
    tables = []
    for name, keep in (("solves", lambda r: r[0] != "net"), ("net", lambda r: r[0] == "net")):
        mine = [r for r in rows if keep(r)]
        if mine:
            tables.append(_tables.table(f"{NAME}.{name}", SOLVE_COLUMNS, mine, stamp))
    against = against_casadi_rows(results)
    if solver != "Tsit5" and against:
        tables.append(
            _tables.table(f"{NAME}.{solver.lower()}", AGAINST_CASADI_COLUMNS, against, stamp)
        )
    return tables


def plot(results, methods, path):
    import matplotlib.pyplot as plt
    from _common import legend_below

    colors = dict(zip(METHODS, ("C0", "C1", "C2"), strict=False))
    markers = {"chain": "o", "pendulum": "s", "ladder": "^"}
    styles = {"chain": "-", "pendulum": ":", "ladder": "--"}
    fig, ax = plt.subplots(figsize=(7, 5.5), layout="constrained")
    for family, marker in markers.items():
        for method in methods:
            points = [
                (row["coordinates"], row["methods"][method]["per_step"])
                for row in results
                if row["family"] == family and "per_step" in row["methods"].get(method, {})
            ]
            if points:
                x, y = zip(*points, strict=False)
                ax.plot(
                    x,
                    1e6 * np.asarray(y),
                    styles[family],
                    marker=marker,
                    color=colors[method],
                    label=f"{method}, {family}",
                )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("coordinates n")
    ax.set_ylabel("time per step [µs]")
    ax.set_title(
        f"Baumgarte(kd={KD:g}, kp={KP:g}), t ∈ [0, {T1:g}], rtol={RTOL:g}, atol={ATOL:g}, float64",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    legend_below(ax, ncol=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("output"),
        help=f"output root; results go to OUT/{NAME}/ (default: output)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke test: sizes {QUICK_SIZES}, batch 8, one repeat",
    )
    parser.add_argument(
        "--sizes",
        type=_int_list,
        default=None,
        help="links (cells) per model, comma-separated (default: "
        + ",".join(map(str, DEFAULT_SIZES))
        + ")",
    )
    parser.add_argument(
        "--families",
        type=_family_list,
        default=list(scaling_models.FAMILIES),
        help="comma-separated subset of " + ",".join(scaling_models.FAMILIES),
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="trajectories per vmap / map batch (default 256, fewer where "
        "the batch would exceed --budget; with --throughput 4096)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=20.0,
        help="seconds: skip a method × size whose single solve is predicted "
        "to take longer (default 20)",
    )
    parser.add_argument(
        "--compile-budget",
        type=float,
        default=120.0,
        help="seconds: skip the sizes after one whose compile took longer (default 120)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed calls per measurement; the median is reported (default 3)",
    )
    parser.add_argument(
        "--max-coordinates",
        type=_limits,
        default={},
        help="leave out the sizes with more coordinates: one number for "
        "every family, or family=number pairs, e.g. chain=512,pendulum=64",
    )
    parser.add_argument(
        "--solver",
        choices=list(SOLVERS),
        default="Tsit5",
        help="the explicit solver of jaxdae and of the hand-written diffrax solve (default Tsit5)",
    )
    parser.add_argument(
        "--cpu-per-step",
        action="store_true",
        help="jaxdae only: CPU time per step, per right-hand side and "
        "gradient / solve at each size, and the growth exponents",
    )
    parser.add_argument(
        "--throughput",
        action="store_true",
        help="trajectories per second of one batch (--batch, default 4096) "
        "of each family × size (default: chains of 64 links), float64 and "
        "float32, by vmap, the ensemble, UnrolledERK, the hand-written ODE "
        "and CasADi's map; for GPUs",
    )
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 4096 if args.throughput else 256
    if args.throughput:
        args.sizes = args.sizes or [64]
        if "--families" not in " ".join(sys.argv):
            args.families = ["chain"]
    if args.batch < 1 or args.repeats < 1 or args.budget <= 0 or args.compile_budget <= 0:
        parser.error("--batch and --repeats must be at least 1, the budgets positive")
    if args.quick:
        args.sizes = args.sizes or list(QUICK_SIZES)
        args.batch, args.repeats = min(args.batch, 8), 1
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    return args


def _int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be integers ≥ 1, got {text!r}")
    return sorted(set(values))


def _limits(text):
    limits = {}
    for item in text.split(","):
        family, _, number = item.strip().rpartition("=")
        if not number.isdigit() or (family and family not in scaling_models.FAMILIES):
            raise argparse.ArgumentTypeError(
                f"expected a number or family=number pairs, got {text!r}"
            )
        for name in [family] if family else scaling_models.FAMILIES:
            limits[name] = int(number)
    return limits


def _family_list(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in scaling_models.FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown family {unknown or text!r}; choose from {', '.join(scaling_models.FAMILIES)}"
        )
    return names


def throughput_run(args, folder):
    """`--throughput`: `batch_throughput` of each family × size, its table printed and
    written with the JSON after every row (`bench_scaling_throughput.{md,json}`), and as
    the table of docs/benchmarks.md (`tables.json`)."""
    stamp = _tables.run_stamp()
    warm_up_jax()
    device = jax.devices()[0]
    header = (
        f"Baumgarte(kd={KD:g}, kp={KP:g}), t ∈ [0, {T1:g}], velocities perturbed by "
        f"1e-3·N(0, 1), Tsit5; float64 at rtol={RTOL:g}, atol={ATOL:g}, float32 at "
        "rtol={:g}, atol={:g}; medians of {} calls; device: {} ({}); jax {}".format(
            *THROUGHPUT_TOLERANCES["float32"],
            args.repeats,
            device.device_kind,
            device.platform,
            jax.__version__,
        )
        + (f", casadi {ca.__version__} on {os.cpu_count()} host cores" if ca is not None else "")
    )
    results, models = {}, {}
    for family in args.families:
        for size in args.sizes:
            key = f"{family} N={size} ({coordinates(family, size)} coordinates)"
            models[key] = (family, size)
            print(key, flush=True)

            def report(rows, agreement, key=key):
                results[key] = {"rows": rows, "agreement": agreement}
                lines = [header, ""]
                for name, result in results.items():
                    lines += (
                        [f"**{name}**", ""]
                        + throughput_table(result["rows"], result["agreement"])
                        + [""]
                    )
                (folder / "bench_scaling_throughput.md").write_text("\n".join(lines))
                write_json(
                    folder / "bench_scaling_throughput.json",
                    {
                        "header": header,
                        "results": results,
                        "batch": args.batch,
                        "repeats": args.repeats,
                        "jax": jax.__version__,
                    },
                )
                by_model = {models[name]: result["rows"] for name, result in results.items()}
                _tables.write(args.out, NAME, [throughput_page_table(by_model, stamp)])
                return lines

            batch_throughput(
                family, size, args.batch, args.repeats, THROUGHPUT_TOOLS, on_row=report
            )
    print((folder / "bench_scaling_throughput.md").read_text())


def main():
    args = parse_args()
    if args.cpu_per_step:
        warm_up_jax()
        print(
            "| family | N | coordinates | steps | solve per step [µs] | right-hand side [µs] "
            "| gradient / solve | failure test [µs] | vector–Jacobian product [µs] |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        )
        stamp = _tables.run_stamp()
        rows = cpu_per_step(args.families, args.sizes, args.repeats, args.max_coordinates)
        data = _tables.table(
            f"{NAME}.per-step", PER_STEP_COLUMNS, [per_step_cells(r) for r in rows], stamp
        )
        print("\n" + _tables.render(data))
        print("wrote", _tables.write(args.out, NAME, [data]))
        return
    if ca is None:
        print("CasADi is not installed: its rows are left out (pip install casadi).")
    folder = output_dir(args.out, NAME)
    if args.throughput:
        throughput_run(args, folder)
        return
    methods = [m for m in METHODS if m != CASADI or ca is not None]
    stamp = _tables.run_stamp()
    warm_up_jax()
    start = time.perf_counter()

    def report(results, final=False):
        """Writes the table, the JSON and the figure of what is measured so far."""
        lines = [
            f"Baumgarte(kd={KD:g}, kp={KP:g}), t ∈ [0, {T1:g}] from rest, {args.solver}, "
            f"rtol={RTOL:g}, "
            f"atol={ATOL:g}, float64; medians of {args.repeats} calls; device: "
            f"{jax.devices()[0].device_kind}; jax {jax.__version__}"
            + (f", casadi {ca.__version__}" if ca is not None else "")
            + f"; budget {args.budget:g} s per solve; {time.perf_counter() - start:.0f} s in all.",
            "",
        ] + markdown_lines(results, methods)
        if final:
            print("\n".join(lines))
        plot(results, methods, folder / "bench_scaling.png")
        rows = [
            {
                **row,
                "methods": {
                    m: {k: x for k, x in r.items() if k != "q_final"}
                    for m, r in row["methods"].items()
                },
            }
            for row in results
        ]
        write_json(
            folder / "bench_scaling.json",
            {
                "results": rows,
                "sizes": args.sizes,
                "families": args.families,
                "batch": args.batch,
                "budget": args.budget,
                "repeats": args.repeats,
                "max_coordinates": args.max_coordinates,
                "jax": jax.__version__,
                "casadi": None if ca is None else ca.__version__,
                "complete": final,
                "table": lines,
            },
        )

    results = run(
        args.families,
        args.sizes,
        args.batch,
        args.budget,
        args.compile_budget,
        args.repeats,
        methods,
        on_row=report,
        max_coordinates=args.max_coordinates,
        solver=SOLVERS[args.solver],
    )
    report(results, final=True)
    print(f"wrote {folder / 'bench_scaling.json'} and {folder / 'bench_scaling.png'}")
    tables = page_tables(results, methods, args.solver, stamp)
    if tables:
        print("wrote", _tables.write(args.out, NAME, tables))


if __name__ == "__main__":
    main()
