"""Benchmark: trajectories per second of a batch of quadruped drops, jaxdae's time stepping
against MJX, at the same 1 ms step, on JAX's default device (the CPU, or a GPU).

The quadruped is that of `experiments/examples/quadruped_drop.py` (pybullet_data's A1: a
free trunk, twelve PD-held joints, four frictional foot contacts, μ = 0.8). The batch
drops it in its stand pose from base heights spread evenly over 0.35–0.55 m and simulates
`T` seconds:

- jaxdae: `jax.jit(jax.vmap(...))` of `jaxdae.simulate(model, Baumgarte(20, 100), ...,
  events=jaxdae.TimeStepping(dt=1e-3), ts=[T])` (one cone QP of the four contacts per
  step);
- MJX: `jax.vmap(mjx.step)` in a `jax.lax.scan` of `T / dt` steps, jitted, on the model
  `experiments/_mjcf.py` writes from the same jaxdae model (elliptic cones, semi-implicit
  Euler, `dt = 1e-3`);
- MuJoCo (C): `mj_step` in a Python loop over the batch, one thread, for scale.

The JAX rows run in each type of `--dtypes` (float64 by default; float32 runs MJX with
JAX's 64-bit types off, so that its own constants are float32 too, and jaxdae from float32
states) on JAX's default device; each is compiled first (`lower` and `compile`, timed
apart), then run `--reps` times: the table gives the median, the trajectories per second,
and the largest difference of the final base heights from MuJoCo's over the first
`--reference-members` drops (all by default). jaxdae solves with `throw=False`, and the
drops that end before `T` (`sol.result`) are listed. The target configuration is `--batch 1024
--t1 5`; the defaults (batch 64, T = 0.5 s) take a few minutes on 2 cores. The JSON file
is rewritten after each row, so that an interrupted run keeps the rows it finished.

    python experiments/benchmarks/bench_quadruped_batch.py [--batch 64] [--t1 0.5] \
        [--reps 3] [--dtypes float64,float32] [--reference-members 8] [--quick] [--no-mjx] \
        [--out output]
    # writes OUT/bench_quadruped_batch/bench_quadruped_batch.json
"""

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import output_dir, write_json

import jaxdae
from jaxdae._compilation._private_apis import result_codes, result_messages

jax.config.update("jax_enable_x64", True)

NAME = "bench_quadruped_batch"
DT = 1e-3
HEIGHTS = (0.35, 0.55)  # m: the URDF base frame's start heights across the batch
DTYPES = {"float64": jnp.float64, "float32": jnp.float32}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("output"))
    parser.add_argument("--batch", type=int, default=64, help="drops per batch (default 64)")
    parser.add_argument("--t1", type=float, default=0.5, help="seconds simulated (default 0.5)")
    parser.add_argument("--reps", type=int, default=3, help="timed runs, median (default 3)")
    parser.add_argument(
        "--dtypes", default="float64", help="comma-separated: float64, float32 (default float64)"
    )
    parser.add_argument(
        "--reference-members",
        type=int,
        default=None,
        help="MuJoCo's C reference for the first this many drops (default all)",
    )
    parser.add_argument("--quick", action="store_true", help="batch 8, T = 0.2 s, 2 runs")
    parser.add_argument(
        "--no-mjx",
        action="store_true",
        help="skip MJX (on the CPU with jaxlib 0.10.0 to 0.11.0 its batched step can deadlock)",
    )
    args = parser.parse_args()
    args.dtypes = [name.strip() for name in args.dtypes.split(",")]
    for name in args.dtypes:
        if name not in DTYPES:
            parser.error(f"--dtypes: {name!r} is not one of {', '.join(DTYPES)}")
    if args.quick:
        args.batch, args.t1, args.reps = 8, 0.2, 2
    return args


def _timed(fn, reps):
    """The result of the last of `reps` calls of `fn` and the median seconds."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def _compiled(fn, *args):
    """`jax.jit(fn)` lowered and compiled for `args`, and the seconds that took."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def bench_jaxdae(model, q0, heights, t1, reps, dtype):
    """jaxdae's vmapped time stepping from states of `dtype` (`throw=False`): final base
    heights, compile s, median run s, and the members that ended before `t1` (index, time
    and result)."""
    events = jaxdae.TimeStepping(dt=DT)
    q0, heights = q0.astype(dtype), heights.astype(dtype)
    formulation = jaxdae.Baumgarte(kd=20.0, kp=100.0)
    ts = jnp.asarray([t1], dtype)

    def drop(height):
        start = q0.at[2].add(height)
        sol = jaxdae.simulate(
            model,
            formulation,
            0.0,
            t1,
            start,
            jnp.zeros_like(start),
            events=events,
            ts=ts,
            throw=False,
        )
        return sol.q_final[2], sol.t_final, sol.result

    compiled, compile_s = _compiled(jax.vmap(drop), heights)
    (z, t_final, result), seconds = _timed(lambda: compiled(heights), reps)
    z, t_final = np.asarray(z), np.asarray(t_final)
    codes = np.asarray(result_codes(result))
    messages = result_messages(jaxdae.RESULTS)
    reached = codes == 0
    stopped = [
        {
            "member": int(i),
            "t_final": float(t_final[i]),
            "height": float(heights[i]),
            "result": messages[codes[i]],
        }
        for i in np.nonzero(~reached)[0]
    ]
    return z, compile_s, seconds, stopped


def bench_mjx(mj, qpos, t1, reps, dtype):
    """MJX's vmapped steps in a scan, in `dtype`: final base heights, compile s, median
    run s (`None` where MJX is not installed)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # "Failed to import warp": not used
            from mujoco import mjx
    except ImportError:
        print("mujoco-mjx is not installed: MJX skipped")
        return None
    # MJX's own constants follow JAX's default type: float32 runs with 64-bit types off.
    with jax.enable_x64(dtype == jnp.float64):

        def cast(tree):
            return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)

        device_model = cast(mjx.put_model(mj))
        blank = cast(mjx.make_data(device_model))
        batch = jax.vmap(lambda p: blank.replace(qpos=p))(jnp.asarray(qpos, dtype))
        steps = int(round(t1 / DT))

        def run(data):
            def step(data, _):
                return jax.vmap(mjx.step, in_axes=(None, 0))(device_model, data), None

            return jax.lax.scan(step, data, None, length=steps)[0].qpos[:, 2]

        compiled, compile_s = _compiled(run, batch)
        z, seconds = _timed(lambda: compiled(batch), reps)
    return np.asarray(z), compile_s, seconds


def bench_mujoco(mj, qpos, t1):
    """MuJoCo's C steps in a Python loop over the batch: final base heights, seconds."""
    import mujoco

    data = mujoco.MjData(mj)
    steps = int(round(t1 / DT))
    z = np.zeros(len(qpos))
    start = time.perf_counter()
    for i, p in enumerate(qpos):
        mujoco.mj_resetData(mj, data)
        data.qpos[:] = p
        for _ in range(steps):
            mujoco.mj_step(mj, data)
        z[i] = data.qpos[2]
    return z, time.perf_counter() - start


def main():
    import quadruped_drop

    args = parse_args()
    out = output_dir(args.out, NAME)
    load = os.getloadavg()[0]
    path = quadruped_drop.urdf_path()
    if path is None or not path.exists():
        print("pybullet_data (pip install pybullet) holds the A1's URDF: nothing to run")
        return
    model, _ = quadruped_drop.quadruped(path)
    q0, _ = quadruped_drop.initial_state(model, 0.0)
    heights = jnp.linspace(*HEIGHTS, args.batch)
    members = args.batch if args.reference_members is None else args.reference_members
    device = jax.devices()[0]
    print(
        f"batch {args.batch}, T = {args.t1} s, dt = {DT} s, {int(round(args.t1 / DT))} steps; "
        f"median of {args.reps}; {device.platform} ({device.device_kind}); load average "
        f"{load:.1f} at the start",
        flush=True,
    )
    result = {
        "batch": args.batch,
        "t1": args.t1,
        "dt": DT,
        "reps": args.reps,
        "heights": HEIGHTS,
        "load_average": load,
        "devices": str(jax.devices()),
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "reference_members": members,
        "rows": {},
    }
    reference = None

    def report(name, z, compile_s, run_s, **extra):
        per_s = args.batch / run_s
        dz = None if reference is None else float(np.nanmax(np.abs(z[:members] - reference)))
        shown = "—" if compile_s is None else f"{compile_s:.1f}"
        print(
            f"{name:30s} {shown:>12s} {run_s:10.3f} {per_s:10.1f} "
            + ("—" if dz is None else f"{dz:15.2e}"),
            flush=True,
        )
        result["rows"][name] = {
            "compile_s": compile_s,
            "run_s": run_s,
            "trajectories_per_s": per_s,
            "max_abs_final_height_vs_mujoco": dz,
            "final_height_range": [float(z.min()), float(z.max())],
            **extra,
        }
        write_json(out / f"{NAME}.json", result)

    print(f"{'':30s} {'compile [s]':>12s} {'run [s]':>10s} {'traj/s':>10s} {'|Δz| vs MuJoCo':>15s}")
    try:
        import _mjcf
        import mujoco
    except ImportError:
        print("mujoco is not installed: MJX and MuJoCo skipped")
        mj = qpos = None
    else:
        mj = mujoco.MjModel.from_xml_string(_mjcf.mjcf(model, timestep=DT))
        start = np.asarray(q0)
        qpos = np.stack(
            [_mjcf.to_mujoco(model, mj, start + np.eye(start.size)[2] * h)[0] for h in heights]
        )
        reference, seconds = bench_mujoco(mj, qpos[:members], args.t1)
        # The C loop's time scaled to the whole batch (it is linear in the drops).
        report("MuJoCo (C, loop)", reference, None, seconds * args.batch / members)
    for name in args.dtypes:
        dtype = DTYPES[name]
        if mj is not None and not args.no_mjx:
            mjx_row = bench_mjx(mj, qpos, args.t1, args.reps, dtype)
            if mjx_row is not None:
                report(f"MJX, {name}", *mjx_row)
        z, compile_s, seconds, stopped = bench_jaxdae(model, q0, heights, args.t1, args.reps, dtype)
        report(f"jaxdae TimeStepping, {name}", z, compile_s, seconds, ended_before_t1=stopped)
        if stopped:
            print(f"  {len(stopped)} of {args.batch} ended before t1: {stopped[:5]}", flush=True)
    print(f"wrote {out / f'{NAME}.json'}")


if __name__ == "__main__":
    main()
