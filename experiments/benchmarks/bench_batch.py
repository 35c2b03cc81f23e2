"""Benchmark: batch throughput of the two-link example vs batch size.

`ModifiedLagrange(10, [20, 10], [100, 25])` on `TwoLinkManipulator` over `t ∈ [0, 2]` from
perturbed paper states, simulated with plain `jax.jit(jax.vmap(jaxdae.simulate ...))` (every
trajectory stepped on its own) and with `jaxdae.simulate_ensemble` (the batch as one ODE on a
shared step sequence, "ensemble" rows):

- trajectories per second vs batch size, float64 (`rtol = 1e-8`, `atol = 1e-10`) and float32
  (`rtol = 1e-5`, `atol = 1e-7`: float32 cannot meet 1e-8), against CasADi CVODES-Adams (a
  Python loop and `Function.map` with threads) and SciPy DOP853 (a Python loop) at the same
  tolerances;
- the same forward `jax.jit`-compiled with the batch axis sharded over one XLA CPU device
  per core (`jax.sharding`, "sharded ×N" rows, batches of 256 and more), since CasADi's map
  uses all cores too;
- compile time per batch size (`jax.jit` retraces and recompiles for every batch shape);
- the cost of the gradient of a batch loss (mean over the batch of `Σ q(2)² + |Φ(2)|²`)
  w.r.t. the shared gains `(alpha, kd, kp)`, relative to the batched forward solve, with
  the default adjoint (`jaxdae.ReverseSweepAdjoint()` in segments at the default
  `max_steps`) and with `max_steps=1024` (one segment), `vmap` and ensemble.

The device is detected (`jax.devices()`); on the CPU the batch sizes stop at 4096 by
default (≈ 1–4 s per call on 2 cores; `--max-batch` raises the cap), on a GPU they go to 10⁶
(CasADi's `map`, on the host's cores, to 65,536).
Every repetition times every tool at every size in turn (interleaved); figures are medians.
The agreement of `q(2)` at the largest batch is reported: float32 against float64, and on a
GPU its float64 against the CPU's for the first 256 states.
With `--unrolled` the jaxdae rows use `solver=jaxdae.UnrolledERK(diffrax.Tsit5())` instead of
diffrax's `Tsit5` (the stages written out; see `experiments/benchmarks/bench_unrolled.py`).

`--large` measures instead the batches of 65,536 and 10⁶ trajectories through
`jaxdae.batch_map` in chunks (`--chunk`, default 4096 rows per device; `ensemble=True` for
the ensemble rows, each chunk one ensemble), on one device and sharded over one CPU device
per core: two calls per row (the first compiles), the second timed; the peak memory of the
process is reported at the end (≈ 11 min on 2 cores).

    python experiments/benchmarks/bench_batch.py [--quick] [--out output] [--max-batch N] \
        [--unrolled]
    python experiments/benchmarks/bench_batch.py --large [--chunk 4096] [--sizes 65536,1000000]
"""

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common
# One XLA CPU device per core, for the "sharded" rows (plain vmap runs on one device/core).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import output_dir, write_json  # noqa: E402
from _tables import run_stamp, table, write  # noqa: E402
from bench_core import T1, casadi_integrator, casadi_map  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import jaxdae  # noqa: E402
from jaxdae._systems._system import cast_floating  # noqa: E402
from jaxdae.examples import (
    TwoLinkManipulator,  # noqa: E402
    _two_link_reference as _peers,
)

NAME = "bench_batch"
LOSS_LABELS = {
    "vmap": "`jax.vmap(simulate)`",
    "ensemble": "`simulate_ensemble`",
    "sweep": "`jax.vmap(simulate)`, `ReverseSweepAdjoint`",
    "ensemble sweep": "`simulate_ensemble`, `ReverseSweepAdjoint`",
}
TOLERANCES = {"float64": (1e-8, 1e-10), "float32": (1e-5, 1e-7)}
# The batch-loss rows as docs/benchmarks.md names them.
PAGE_LOSS_LABELS = {
    "vmap": "`jax.vmap(simulate)`, default adjoint",
    "ensemble": "`simulate_ensemble`, default adjoint",
    "sweep": "`jax.vmap(simulate)`, one segment (`max_steps=1024`)",
    "ensemble sweep": "`simulate_ensemble`, one segment",
}


def _table_name(kind: str, unrolled: bool) -> str:
    """`bench_batch.KIND-cpu` (or `-gpu`), with `-unrolled` for `--unrolled`."""
    device = "cpu" if jax.default_backend() == "cpu" else "gpu"
    return f"{NAME}.{kind}-{device}" + ("-unrolled" if unrolled else "")


def _size(n: int) -> str:
    """A batch size as the page writes it: 10⁶ and 10⁷ as powers, others with commas."""
    if n >= 10**6 and 10 ** (len(str(n)) - 1) == n:
        return "10" + str(len(str(n)) - 1).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    return f"{n:,}"


def _tool_label(tool: str, unrolled: bool, map_mode: str | None = None) -> str:
    """A row's label on the page: `jaxdae ensemble float32 sharded ×2` as `ensemble, float32,
    sharded ×2`; `CasADi map @float64 tol` as "CasADi `map`, float64 tolerances (...)"."""
    dname = "float32" if "float32" in tool else "float64"
    if tool.startswith("CasADi map"):
        threads = (map_mode or "").removeprefix("thread×")
        how = f"{threads} threads" if threads.isdigit() else map_mode
        return f"CasADi `map`, {dname} tolerances ({how})"
    label = ("ensemble" if "ensemble" in tool else "`vmap`") + f", {dname}"
    if "sharded" in tool:
        label += ", sharded " + tool.rpartition("sharded ")[2]
    return label + (", `UnrolledERK(Tsit5)`" if unrolled else "")


def throughput_tables(
    stamp, sizes, med, tools, map_mode, grad_batch, c_loss, ratios, unrolled
) -> list[dict]:
    """The page's tables of a default run: trajectories per second by batch size (jaxdae's
    rows and CasADi's `map`), and the batch loss's gradient."""
    rows = [
        [_tool_label(tool, unrolled, map_mode)]
        + [f"{s / med[(tool, s)]:,.0f}" if (tool, s) in med else "–" for s in sizes]
        for tool in tools
        if tool.startswith(("jaxdae", "CasADi map"))
    ]
    throughput = table(
        _table_name("throughput", unrolled),
        [("tool", "left")] + [(f"{s:,}", "right") for s in sizes],
        rows,
        stamp,
    )
    suffix = ", `UnrolledERK`" if unrolled else ""
    loss_rows = [
        [
            PAGE_LOSS_LABELS[kind] + suffix,
            f"{med[(f'loss forward {kind}', grad_batch)]:.3f}",
            f"{med[(f'loss gradient {kind}', grad_batch)]:.3f}",
            f"{ratios[kind]:.2f}",
            f"{c_grad:.1f}",
        ]
        for kind, (_, c_grad) in c_loss.items()
    ]
    gradient = table(
        _table_name("gradient", unrolled),
        [("batch", "left")]
        + [
            (t, "right")
            for t in (
                "forward [s]",
                "value and gradient [s]",
                "gradient / forward",
                "compile gradient [s]",
            )
        ],
        loss_rows,
        stamp,
    )
    return [throughput, gradient]


def large_table(stamp, sizes, rows, unrolled) -> dict:
    """The page's table of a `--large` run: trajectories per second of the second call at
    each size, and the first call (compile included) at the largest."""
    labels = dict.fromkeys(label for label, _ in rows)
    cells = [
        [_tool_label(label, unrolled)]
        + [f"{size / rows[(label, size)][1]:,.0f}" for size in sizes]
        + [f"{rows[(label, sizes[-1])][0]:.1f}"]
        for label in labels
    ]
    return table(
        _table_name("large", unrolled),
        [("tool", "left")]
        + [(f"{s:,} [traj/s]", "right") for s in sizes]
        + [(f"first call at {_size(sizes[-1])} [s]", "right")],
        cells,
        stamp,
    )


def device_name() -> str:
    device = jax.devices()[0]
    return f"{device.platform}: {device.device_kind} ×{len(jax.devices(device.platform))}"


def jaxdae_solve(dtype, solver=None, **options):
    """One trajectory's `Solution` as a function of `(params, q0, v0)`; `options` go to
    `simulate` (e.g. `adjoint`)."""
    system = cast_floating(TwoLinkManipulator(), dtype)
    rtol, atol = TOLERANCES[jnp.dtype(dtype).name]

    def solve(params, q0, v0):
        alpha, kd, kp = params
        return jaxdae.simulate(
            system,
            jaxdae.ModifiedLagrange(alpha, kd, kp),
            0.0,
            T1,
            q0,
            v0,
            rtol=rtol,
            atol=atol,
            solver=solver,
            **options,
        )

    return solve


def batch_loss(solve):
    """The mean over a batch of `Σ q(2)² + |Φ(2)|²`, by `jax.vmap` of `solve`."""

    def loss(params, q0, v0):
        def one(q, v):
            sol = solve(params, q, v)
            return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

        return jnp.mean(jax.vmap(one)(q0, v0))

    return loss


def jaxdae_batch(dtype, solver=None, **options):
    """`(forward, loss)`: batched final `q` and the mean batch loss, gains as arguments, by
    `jax.vmap(simulate)` and by `simulate_ensemble`; `options` go to both (e.g. `adjoint`)."""
    system = cast_floating(TwoLinkManipulator(), dtype)
    rtol, atol = TOLERANCES[jnp.dtype(dtype).name]
    solve = jaxdae_solve(dtype, solver, **options)

    def forward(params, q0, v0):
        return jax.vmap(lambda q, v: solve(params, q, v).q_final)(q0, v0)

    def ensemble(params, q0, v0):
        alpha, kd, kp = params
        return jaxdae.simulate_ensemble(
            system,
            jaxdae.ModifiedLagrange(alpha, kd, kp),
            0.0,
            T1,
            q0,
            v0,
            rtol=rtol,
            atol=atol,
            solver=solver,
            **options,
        )

    def ensemble_forward(params, q0, v0):
        return ensemble(params, q0, v0).q_final

    def ensemble_loss(params, q0, v0):
        sol = ensemble(params, q0, v0)
        return jnp.mean(jnp.sum(sol.q_final**2, axis=-1) + jnp.sum(sol.phi[:, -1] ** 2, axis=-1))

    return {"vmap": (forward, batch_loss(solve)), "ensemble": (ensemble_forward, ensemble_loss)}


def params_of(dtype):
    alpha, kd1, kd2, kp1, kp2 = _peers.PARAMS
    return (
        jnp.asarray(alpha, dtype),
        jnp.asarray([kd1, kd2], dtype),
        jnp.asarray([kp1, kp2], dtype),
    )


def compiled(fn, *args):
    start = time.perf_counter()
    out = jax.jit(fn).lower(*args).compile()
    return out, time.perf_counter() - start


def main(
    out: Path, quick: bool = False, max_batch: int | None = None, unrolled: bool = False
) -> dict:
    stamp = run_stamp()
    folder = output_dir(out, NAME)
    solver = jaxdae.UnrolledERK(diffrax.Tsit5()) if unrolled else None
    solver_name = "`UnrolledERK(Tsit5)`" if unrolled else "diffrax `Tsit5`"
    on_gpu = jax.default_backend() != "cpu"
    if quick:
        sizes, reps = [1, 16, 64], 2
    elif on_gpu:
        sizes, reps = [1, 256, 4096, 65536, 1_000_000], 3
    else:
        sizes, reps = [1, 16, 256, 1024, 4096], 3
    if max_batch is not None:
        sizes = sorted({s for s in sizes if s <= max_batch} | {max_batch})
    loop_cap = 16 if quick else 64  # Python loops (CasADi loop, SciPy) run at most this many
    # CasADi's map runs on the host's cores: on a GPU machine it stops at 65,536 (≈ 4 s a call
    # on 16 cores), so that the run fits in a device lease.
    map_cap = 65_536 if on_gpu else max(sizes)
    grad_batch = 16 if quick else 256
    dtypes = ["float64", "float32"]
    qs, vs = _peers.perturbed_states(max(sizes))

    # jaxdae: one compiled function per (dtype, size).
    runners, compile_s = {}, {}
    for dname in dtypes:
        dtype = jnp.dtype(dname)
        params = params_of(dtype)
        for kind, (forward, _) in jaxdae_batch(dtype, solver).items():
            label = "jaxdae" if kind == "vmap" else "jaxdae ensemble"
            for size in sizes:
                q0, v0 = jnp.asarray(qs[:size], dtype), jnp.asarray(vs[:size], dtype)
                fn, compile_s[(kind, dname, size)] = compiled(forward, params, q0, v0)
                runners[(f"{label} {dname}", size)] = lambda fn=fn, a=(params, q0, v0): (
                    jax.block_until_ready(fn(*a))
                )
                cpus = jax.devices("cpu")
                if len(cpus) > 1 and size % len(cpus) == 0 and not on_gpu and size >= 256:
                    mesh = jax.sharding.Mesh(np.array(cpus), ("batch",))
                    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
                    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
                    args = (
                        jax.device_put(params, rep),
                        jax.device_put(q0, split),
                        jax.device_put(v0, split),
                    )
                    fn_sharded, _ = compiled(forward, *args)
                    runners[(f"{label} {dname} sharded ×{len(cpus)}", size)] = (
                        lambda fn=fn_sharded, a=args: jax.block_until_ready(fn(*a))
                    )
            print(f"  compiled {label} {dname}", file=sys.stderr, flush=True)

    # Peers: CasADi CVODES-Adams (loop and threaded map), SciPy DOP853 (loop), each at the
    # tolerances of each dtype row.
    map_mode = None
    for dname in dtypes:
        rtol, atol = TOLERANCES[dname]
        integrator, _ = casadi_integrator("adams", rtol=rtol, atol=atol)
        rhs = _peers.numpy_rhs()
        for size in sizes:
            x = np.concatenate([qs[:size], vs[:size]], axis=1)
            if size <= loop_cap:
                runners[(f"CasADi loop @{dname} tol", size)] = lambda f=integrator, x=x: [
                    f(x0=xi, p=_peers.PARAMS)["xf"] for xi in x
                ]
                runners[(f"SciPy DOP853 loop @{dname} tol", size)] = (
                    lambda x=x, rtol=rtol, atol=atol: [
                        solve_ivp(rhs, (0.0, T1), xi, method="DOP853", rtol=rtol, atol=atol)  # noqa: B023
                        for xi in x
                    ]
                )
            if size > map_cap:
                continue
            mapped, map_mode = casadi_map(integrator, size)
            pb = np.tile(_peers.PARAMS[:, None], (1, size))
            runners[(f"CasADi map @{dname} tol", size)] = lambda f=mapped, x=x.T, p=pb: f(x0=x, p=p)

    # Gradient / forward of a batch loss (float64).
    dtype = jnp.float64
    params = params_of(dtype)
    qg, vg = jnp.asarray(qs[:grad_batch]), jnp.asarray(vs[:grad_batch])
    c_loss = {}
    losses = {kind: loss for kind, (_, loss) in jaxdae_batch(dtype, solver).items()}
    # The default adjoint at the default `max_steps` runs in segments; with `max_steps=1024`
    # (the two-link takes ≈ 130 steps) every step is stored in one.
    swept = jaxdae_batch(dtype, solver, max_steps=1024, adjoint=jaxdae.ReverseSweepAdjoint())
    losses["sweep"], losses["ensemble sweep"] = swept["vmap"][1], swept["ensemble"][1]
    for kind, loss in losses.items():
        fwd_loss, c_fwd = compiled(loss, params, qg, vg)
        grad_loss, c_grad = compiled(jax.value_and_grad(loss), params, qg, vg)
        c_loss[kind] = (c_fwd, c_grad)
        runners[(f"loss forward {kind}", grad_batch)] = lambda f=fwd_loss: jax.block_until_ready(
            f(params, qg, vg)
        )
        runners[(f"loss gradient {kind}", grad_batch)] = lambda f=grad_loss: jax.block_until_ready(
            f(params, qg, vg)
        )

    for run in runners.values():  # warm-up
        run()
    times = {key: [] for key in runners}
    for rep in range(reps):
        for key, run in runners.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
        print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    med = {key: statistics.median(t) for key, t in times.items()}

    # Agreement at the largest batch: float32 against float64 (same device), and on a GPU its
    # float64 against the CPU's for the first 256 states.
    big = max(sizes)
    final = {
        key: np.asarray(runners[key]())
        for key in runners
        if key[1] == big and key[0].startswith("jaxdae") and "sharded" not in key[0]
    }
    agreement = {
        kind: float(
            np.max(np.abs(final[(f"{label} float32", big)] - final[(f"{label} float64", big)]))
        )
        for kind, label in (("vmap", "jaxdae"), ("ensemble", "jaxdae ensemble"))
    }
    if on_gpu:
        cpu = jax.devices("cpu")[0]
        forward = jaxdae_batch(jnp.float64, solver)["vmap"][0]
        n = min(256, big)
        on_cpu = jax.device_put(
            (params_of(jnp.float64), jnp.asarray(qs[:n]), jnp.asarray(vs[:n])), cpu
        )
        reference = np.asarray(jax.jit(forward)(*on_cpu))
        agreement["gpu float64 vs cpu float64"] = float(
            np.max(np.abs(final[("jaxdae float64", big)][:n] - reference))
        )

    tools = sorted(
        {tool for tool, _ in runners if not tool.startswith("loss")},
        key=lambda t: (not t.startswith("jaxdae"), "float32" in t, "ensemble" in t, t),
    )
    lines = [
        f"Two-link, ModifiedLagrange(10, [20, 10], [100, 25]), t ∈ [0, {T1:g}]; device "
        f"{device_name()}; jaxdae solver {solver_name}; float64 rows at rtol=1e-8, "
        "atol=1e-10, float32 rows (and peers "
        f"'@float32 tol') at rtol=1e-5, atol=1e-7; medians of {reps} interleaved repetitions; "
        f"CasADi map: {map_mode}; Python loops only up to {loop_cap}.",
        "",
        "Trajectories per second:",
        "",
        "| tool | " + " | ".join(f"batch {s:,}" for s in sizes) + " |",
        "| --- |" + " ---: |" * len(sizes),
    ]
    for tool in tools:
        cells = [f"{s / med[(tool, s)]:,.0f}" if (tool, s) in med else "–" for s in sizes]
        lines.append(f"| {tool} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "jaxdae compile time [s] (trace + lower + XLA, per batch shape):",
        "",
        "| function | " + " | ".join(f"batch {s:,}" for s in sizes) + " |",
        "| --- |" + " ---: |" * len(sizes),
    ]
    for kind in ("vmap", "ensemble"):
        for dname in dtypes:
            lines.append(
                f"| {kind} {dname} | "
                + " | ".join(f"{compile_s[(kind, dname, s)]:.1f}" for s in sizes)
                + " |"
            )
    lines += [
        "",
        f"Agreement of q(2) at batch {big:,}, max |difference| [rad]: "
        f"float32 vs float64 {agreement['vmap']:.1e} (`vmap`), {agreement['ensemble']:.1e} "
        "(ensemble)"
        + (
            f"; {device_name()} float64 vs the CPU's, first {min(256, big)} "
            f"states: {agreement['gpu float64 vs cpu float64']:.1e}"
            if on_gpu
            else ""
        )
        + ".",
    ]
    ratios = {
        kind: med[(f"loss gradient {kind}", grad_batch)] / med[(f"loss forward {kind}", grad_batch)]
        for kind in c_loss
    }
    ratio = min(ratios.values())
    lines += [
        "",
        f"Batch loss (mean of Σ q(2)² + |Φ(2)|² over {grad_batch} states, float64), gradient "
        "w.r.t. (alpha, kd, kp) by `jax.value_and_grad` (default adjoint; last two rows "
        "with `max_steps=1024`, one segment):",
        "",
        "| batch | forward [s] | value and gradient [s] | gradient/forward (target ≤ 4) | "
        "compile forward [s] | compile gradient [s] |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, (c_fwd, c_grad) in c_loss.items():
        lines.append(
            f"| {LOSS_LABELS[kind]} | "
            f"{med[(f'loss forward {kind}', grad_batch)]:.3f} | "
            f"{med[(f'loss gradient {kind}', grad_batch)]:.3f} | {ratios[kind]:.2f} | "
            f"{c_fwd:.1f} | {c_grad:.1f} |"
        )
    print("\n".join(lines))
    write_json(
        folder / ("bench_batch_unrolled.json" if unrolled else "bench_batch.json"),
        {
            "device": device_name(),
            "solver": solver_name,
            "sizes": sizes,
            "reps": reps,
            "map_mode": map_mode,
            "median_s": {f"{k[0]} | {k[1]}": v for k, v in med.items()},
            "raw_s": {f"{k[0]} | {k[1]}": v for k, v in times.items()},
            "compile_s": {" | ".join(map(str, k)): v for k, v in compile_s.items()},
            "gradient_forward_ratio": ratios,
            "compile_loss": c_loss,
            "agreement": agreement,
        },
    )
    write(
        out,
        NAME,
        throughput_tables(stamp, sizes, med, tools, map_mode, grad_batch, c_loss, ratios, unrolled),
    )
    rate = {tool: big / med[(tool, big)] for tool in tools if (tool, big) in med}
    mapped = max(s for s in sizes if ("CasADi map @float64 tol", s) in med)
    cas = {
        tool: med[("CasADi map @float64 tol", mapped)] / med[(tool, mapped)]
        for tool in ("jaxdae float64", "jaxdae ensemble float64")
    }
    headline = (
        f"{device_name()}: at batch {big:,}, jaxdae float64 "
        f"{rate['jaxdae float64']:,.0f} traj/s, ensemble "
        f"{rate['jaxdae ensemble float64']:,.0f}; float32 {rate['jaxdae float32']:,.0f}, "
        f"ensemble {rate['jaxdae ensemble float32']:,.0f}; at batch {mapped:,}, "
        f"{cas['jaxdae float64']:.1f}× and {cas['jaxdae ensemble float64']:.1f}× CasADi "
        f"map (float64); batch-loss gradient/forward {ratio:.2f}"
    )
    print(headline)
    return {"headline": headline, "table": lines}


def large_batches(out: Path, sizes: list[int], chunk: int, unrolled: bool = False) -> dict:
    """Throughput of chunked batches through `jaxdae.batch_map` (`--large`)."""
    stamp = run_stamp()
    folder = output_dir(out, NAME)
    solver = jaxdae.UnrolledERK(diffrax.Tsit5()) if unrolled else None
    cpus = jax.devices()
    mesh = jax.make_mesh((len(cpus),), ("batch",)) if len(cpus) > 1 else None
    qs, vs = _peers.perturbed_states(max(sizes))
    rows = {}
    for dname in ("float64", "float32"):
        dtype = jnp.dtype(dname)
        params = params_of(dtype)
        solve = jaxdae_solve(dtype, solver)
        for kind, (forward, _) in jaxdae_batch(dtype, solver).items():
            ensemble = kind == "ensemble"
            # One function object per kind: batch_map's compiled programs are cached on it.
            fn = eqx.Partial(
                forward if ensemble else lambda params, q, v: solve(params, q, v).q_final,  # noqa: B023
                params,
            )
            for devices in (None, mesh) if mesh is not None else (None,):
                label = f"jaxdae {'ensemble ' if ensemble else ''}{dname}" + (
                    "" if devices is None else f" sharded ×{devices.size}"
                )
                for size in sizes:
                    q0, v0 = jnp.asarray(qs[:size], dtype), jnp.asarray(vs[:size], dtype)
                    calls = []
                    for _ in range(2):
                        start = time.perf_counter()
                        jax.block_until_ready(
                            jaxdae.batch_map(
                                fn, q0, v0, chunk_size=chunk, mesh=devices, ensemble=ensemble
                            )
                        )
                        calls.append(time.perf_counter() - start)
                    rows[(label, size)] = calls
                    print(
                        f"  {label} {size:,}: {calls[1]:.1f} s ({size / calls[1]:,.0f} "
                        f"traj/s; first call {calls[0]:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    # CasADi's threaded map at the largest size of the default run, for the ratio.
    cas = {}
    for dname in ("float64", "float32"):
        rtol, atol = TOLERANCES[dname]
        integrator, _ = casadi_integrator("adams", rtol=rtol, atol=atol)
        mapped, map_mode = casadi_map(integrator, 4096)
        x = np.concatenate([qs[:4096], vs[:4096]], axis=1).T
        start = time.perf_counter()
        mapped(x0=x, p=np.tile(_peers.PARAMS[:, None], (1, 4096)))
        cas[dname] = 4096 / (time.perf_counter() - start)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
    lines = [
        f"Two-link, ModifiedLagrange(10, [20, 10], [100, 25]), t ∈ [0, {T1:g}]; device "
        f"{device_name()}; `jaxdae.batch_map(..., chunk_size={chunk})` (rows per device and "
        "chunk; ensemble rows with `ensemble=True`: one `simulate_ensemble` per chunk); "
        "tolerances as in the default run; second of two calls (the first compiles). "
        f"CasADi map ({map_mode}) at batch 4,096, one call: {cas['float64']:,.0f} traj/s "
        f"@float64 tol, {cas['float32']:,.0f} @float32 tol. Peak resident memory of the "
        f"whole run: {peak_gib:.1f} GiB.",
        "",
        "| tool | "
        + " | ".join(f"batch {s:,} [traj/s]" for s in sizes)
        + " | vs CasADi map | first call at the largest batch [s] |",
        "| --- |" + " ---: |" * (len(sizes) + 2),
    ]
    for label in dict.fromkeys(label for label, _ in rows):
        rates = [size / rows[(label, size)][1] for size in sizes]
        ratio = rates[-1] / cas["float32" if "float32" in label else "float64"]
        lines.append(
            f"| {label} | "
            + " | ".join(f"{r:,.0f}" for r in rates)
            + f" | {ratio:.0f}× | {rows[(label, sizes[-1])][0]:.1f} |"
        )
    print("\n".join(lines))
    write_json(
        folder / "bench_batch_large.json",
        {
            "device": device_name(),
            "chunk": chunk,
            "sizes": sizes,
            "casadi_map": cas,
            "peak_rss_gib": peak_gib,
            "calls_s": {f"{k[0]} | {k[1]}": v for k, v in rows.items()},
        },
    )
    write(out, NAME, [large_table(stamp, sizes, rows, unrolled)])
    return {"table": lines}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("output"))
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="largest batch size (default 4096 on the CPU, 10**6 on a GPU)",
    )
    parser.add_argument(
        "--unrolled",
        action="store_true",
        help="jaxdae rows with jaxdae.UnrolledERK(diffrax.Tsit5())",
    )
    parser.add_argument(
        "--large",
        action="store_true",
        help="chunked batches of 65,536 and 10**6 through jaxdae.batch_map",
    )
    parser.add_argument(
        "--chunk", type=int, default=4096, help="with --large: rows per device and chunk"
    )
    parser.add_argument(
        "--sizes", default="65536,1000000", help="with --large: comma-separated batch sizes"
    )
    args = parser.parse_args()
    if args.large:
        large_batches(args.out, [int(s) for s in args.sizes.split(",")], args.chunk, args.unrolled)
    else:
        main(args.out, args.quick, args.max_batch, args.unrolled)
