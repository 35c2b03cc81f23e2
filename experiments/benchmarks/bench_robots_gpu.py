"""Benchmark: the robots' batches on a GPU, jaxdae against MJX, in float64 and float32.

The batch part of `bench_robots.py` (its robots, start and perturbed rates) on JAX's
default device, meant for a GPU: for the arm (`tests/data/three_link_arm.urdf`, 4 joints)
and the humanoid (`tests/data/humanoid.urdf`, 28 joints), for each batch size and each of
float64 and float32:

- **jaxdae**: one `jaxdae.simulate_ensemble` of the batch (shared steps; on a GPU the
  batch is one set of arrays) of `load_urdf(...).mechanism()`, the joint-coordinate
  `TreeMechanism`, under `Unstabilized`, at the setting that reaches a joint error of 1e-6
  after 1 s in float64: the loosest `rtol = atol` of Tsit5 or Dopri8 on `bench_robots`'s
  ladder, the faster of the two for one trajectory on the device. float32 runs the same
  solver at `max(rtol, FLOAT32_TOLERANCE)` (float32 cannot meet tighter tolerances).
- **MJX**: `jax.vmap(mjx.step)` in a `jax.lax.scan` over MuJoCo's RK4 at the largest step
  that reaches the same joint error (`bench_robots.steps_to_tolerance`), the model's and
  the data's arrays in the run's type.

Each is compiled apart (its compile time reported), then run `--reps` times: trajectories
per second of the median wall time, and member 0's joint error at 1 s against MuJoCo's RK4
reference at h = 1/`REFERENCE_STEPS` s (C, on the host). The device and JAX's version are
printed with the table.

    python experiments/benchmarks/bench_robots_gpu.py [--out output] [--quick] [--only arm]
        [--sizes 1024,16384] [--reps 3]  (default: a batch of 1,024)
    # prints a Markdown table, writes OUT/bench_robots_gpu/bench_robots_gpu.json and the
    # page's table as `bench_robots_gpu.batches` in OUT/bench_robots_gpu/tables.json

On a CPU it runs too (one device), as a check of the script; `--quick` runs a batch of 8
with a coarse reference.
"""

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import bench_robots as robots  # noqa: E402  (its robots, reference and ladders)
import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import output_dir, write_json  # noqa: E402
from _tables import render, run_stamp, table, write  # noqa: E402

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402

jax.config.update("jax_enable_x64", True)

NAME = "bench_robots_gpu"
ROBOTS = {"arm": robots.DATA / "three_link_arm.urdf", "humanoid": robots.DATA / "humanoid.urdf"}
REFERENCE_STEPS = 200_000  # MuJoCo RK4 steps over 1 s for the reference (--quick: 4,000)
FLOAT32_TOLERANCE = 1e-5
DTYPES = {"float64": jnp.float64, "float32": jnp.float32}
SOLVERS = {"Tsit5": diffrax.Tsit5(), "Dopri8": diffrax.Dopri8()}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("output"))
    parser.add_argument("--quick", action="store_true", help="a batch of 8, coarse reference")
    parser.add_argument("--only", default=None, help="comma-separated robot names")
    parser.add_argument("--sizes", default="1024", help="comma-separated batch sizes")
    parser.add_argument("--reps", type=int, default=3)
    return parser.parse_args()


def _median_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def _compiled(fn, *args):
    """`fn` jit-compiled for `args`, and its compile time (lowering included)."""
    began = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - began


def jaxdae_setting(model, v0, q_ref, reps: int) -> dict:
    """The float64 setting that reaches `robots.TOLERANCE` for one trajectory: per solver
    the loosest tolerance of `robots.JAXDAE_TOLERANCES` that does, the faster of the two on
    the device."""
    formulation = jaxdae.Unstabilized()
    q0 = jnp.zeros_like(jnp.asarray(v0))

    @eqx.filter_jit
    def solve(solver, tolerance):
        return jaxdae.simulate(
            model,
            formulation,
            0.0,
            robots.T1,
            q0,
            jnp.asarray(v0),
            solver=solver,
            rtol=tolerance,
            atol=tolerance,
        ).q_final

    found = {}
    for label, solver in SOLVERS.items():
        for tolerance in robots.JAXDAE_TOLERANCES:
            traced = jnp.asarray(tolerance)
            if robots.joint_error(solve(solver, traced), q_ref) <= robots.TOLERANCE:
                ms = 1e3 * _median_seconds(lambda s=solver, t=traced: solve(s, t), reps)
                found[label] = {"solver": label, "tolerance": tolerance, "one_ms": ms}
                break
    if not found:
        raise RuntimeError("no jaxdae setting on the ladder reaches the joint error")
    return min(found.values(), key=lambda r: r["one_ms"])


def jaxdae_batch(model, setting: dict, rates: np.ndarray, dtype, q_ref, reps: int) -> dict:
    """`simulate_ensemble` of the batch in `dtype` at `setting`: trajectories per second,
    compile time, member 0's error and the steps."""
    tolerance = setting["tolerance"]
    if dtype == jnp.float32:
        tolerance = max(tolerance, FLOAT32_TOLERANCE)
    solver = SOLVERS[setting["solver"]]
    v0 = jnp.asarray(rates, dtype)

    def batch(v0):
        sol = jaxdae.simulate_ensemble(
            model,
            jaxdae.Unstabilized(),
            0.0,
            robots.T1,
            jnp.zeros_like(v0),
            v0,
            solver=solver,
            rtol=tolerance,
            atol=tolerance,
        )
        return sol.q_final, sol.stats["num_steps"]

    run, compile_s = _compiled(batch, v0)
    q1, steps = jax.block_until_ready(run(v0))
    seconds = _median_seconds(lambda: run(v0), reps)
    return {
        "per_s": rates.shape[0] / seconds,
        "seconds": seconds,
        "compile_s": compile_s,
        "error0": robots.joint_error(np.asarray(q1[0], np.float64), q_ref),
        "steps": int(np.max(steps)),
        "tolerance": tolerance,
        "dtype": str(q1.dtype),
    }


def mjx_batch(path: Path, joints, rates: np.ndarray, steps: int, dtype, q_ref, reps: int) -> dict:
    """MJX's RK4 at `steps` steps over 1 s for the batch, in `dtype`: trajectories per
    second, compile time, member 0's error."""
    with contextlib.redirect_stdout(io.StringIO()):  # "Failed to import warp": not used
        from mujoco import mjx

    # MJX's own constants follow JAX's default type: float32 runs with 64-bit types off.
    with jax.enable_x64(dtype == jnp.float64):
        model = robots.mujoco_model(path, "RK4", steps)

        def cast(tree):
            return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)

        device_model = cast(mjx.put_model(model))
        blank = cast(mjx.make_data(device_model))
        qvel = np.zeros((rates.shape[0], model.nv))
        qvel[:, joints.dofs] = rates
        batch = jax.vmap(lambda v: blank.replace(qvel=v))(jnp.asarray(qvel, dtype))

        def run(data):
            def step(data, _):
                return jax.vmap(mjx.step, in_axes=(None, 0))(device_model, data), None

            return jax.lax.scan(step, data, None, length=steps)[0]

        try:
            compiled, compile_s = _compiled(run, batch)
            end = jax.block_until_ready(compiled(batch))
            seconds = _median_seconds(lambda: compiled(batch), reps)
        except Exception as error:  # reported in the table, the benchmark goes on
            return {"per_s": None, "note": f"{type(error).__name__}: {str(error)[:200]}"}
        return {
            "per_s": rates.shape[0] / seconds,
            "seconds": seconds,
            "compile_s": compile_s,
            "error0": robots.joint_error(np.asarray(end.qpos[0], np.float64)[joints.qpos], q_ref),
            "steps": steps,
            "dtype": str(end.qpos.dtype),
            "note": "",
        }


def run_robot(name: str, path: Path, sizes, quick: bool, reps: int) -> dict:
    robot = mb.load_urdf(path)
    mujoco_model = robots.mujoco_model(path)
    joints = robots.joint_map(mujoco_model, robot.joint_names)
    v0 = robots.initial_rates(len(robot.joint_names))
    _, q, _, _ = robots.reference_run(path, joints, v0, 4_000 if quick else REFERENCE_STEPS)
    q_ref = q[-1]
    rk4 = robots.steps_to_tolerance(path, joints, v0, q_ref, "RK4", 0.2 if quick else 3.0)
    model = robot.mechanism(forces=[mb.Gravity(robots.GRAVITY)], limits=False)
    setting = jaxdae_setting(model, v0, q_ref, reps)
    print(
        f"  {name}: reference, MuJoCo's RK4 ({rk4['steps']} steps) and jaxdae's setting "
        f"({setting['solver']}, {setting['tolerance']:.1e}) done",
        flush=True,
    )
    rows = []
    for size in sizes:
        rates = robots.batch_rates(v0, size)
        for label, dtype in DTYPES.items():
            ours = jaxdae_batch(model, setting, rates, dtype, q_ref, reps)
            theirs = mjx_batch(path, joints, rates, rk4["steps"], dtype, q_ref, reps)
            rows.append({"size": size, "dtype": label, "jaxdae": ours, "mjx": theirs})
            print(f"  {name}: {size} in {label} done", flush=True)
    return {"robot": name, "rk4_steps": rk4["steps"], "setting": setting, "rows": rows}


def _f(value, spec: str) -> str:
    return robots.DASH if value is None else format(value, spec)


def print_table(results: list[dict]) -> None:
    device = jax.devices()[0]
    print(f"\n### Batches on {device.platform}: {device.device_kind} (JAX {jax.__version__})\n")
    print(
        "| robot | batch | type | jaxdae: setting, steps | trajectories/s | error | "
        "compile [s] | MJX: RK4 steps | trajectories/s | error | compile [s] | "
        "jaxdae / MJX |"
    )
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        for row in result["rows"]:
            ours, theirs = row["jaxdae"], row["mjx"]
            ratio = (ours["per_s"] / theirs["per_s"]) if theirs["per_s"] else None
            print(
                f"| {result['robot']} | {row['size']:,} | {row['dtype']} | "
                f"{result['setting']['solver']}, {ours['tolerance']:.1e}, {ours['steps']} | "
                f"{ours['per_s']:,.0f} | {ours['error0']:.1e} | {ours['compile_s']:.1f} | "
                f"{result['rk4_steps']} | {_f(theirs['per_s'], ',.0f')} | "
                f"{_f(theirs.get('error0'), '.1e')} | {_f(theirs.get('compile_s'), '.1f')} | "
                f"{_f(ratio, '.1f')} |"
            )
            if theirs.get("note"):
                print(
                    f"\nMJX, {result['robot']}, {row['size']}, {row['dtype']}: {theirs['note']}\n"
                )


COLUMNS = [
    ("robot", "left"),
    ("batch", "right"),
    ("type", "left"),
    ("jaxdae: steps", "right"),
    ("traj./s", "right"),
    ("error", "right"),
    ("compile [s]", "right"),
    ("MJX: traj./s", "right"),
    ("error", "right"),
    ("compile [s]", "right"),
    ("jaxdae / MJX", "right"),
]


def _e(value) -> str:
    """`2.4e-7` for 2.37e-07."""
    if value is None:
        return robots.DASH
    mantissa, exponent = format(value, ".1e").split("e")
    return f"{mantissa}e{int(exponent)}"


def table_rows(results: list[dict]) -> list[list[str]]:
    """The page's rows (`COLUMNS`) of the results of `run_robot`."""
    rows = []
    for result in results:
        for row in result["rows"]:
            ours, theirs = row["jaxdae"], row["mjx"]
            ratio = (ours["per_s"] / theirs["per_s"]) if theirs["per_s"] else None
            rows.append(
                [
                    result["robot"],
                    f"{row['size']:,}",
                    row["dtype"],
                    f"{ours['steps']}",
                    f"{ours['per_s']:,.0f}",
                    _e(ours["error0"]),
                    f"{ours['compile_s']:.1f}",
                    _f(theirs["per_s"], ",.0f"),
                    _e(theirs.get("error0")),
                    _f(theirs.get("compile_s"), ".1f"),
                    robots.DASH if ratio is None else f"**{ratio:.1f}**",
                ]
            )
    return rows


def main():
    args = parse()
    stamp = run_stamp()
    out = output_dir(args.out, NAME)
    sizes = [8] if args.quick else [int(s) for s in args.sizes.split(",")]
    names = [n for n in ROBOTS if args.only is None or n in args.only.split(",")]
    device = jax.devices()[0]
    print(f"{NAME}: {device.platform} ({device.device_kind}), batches {sizes}", flush=True)
    results = []
    for name in names:  # written after each robot, so a run cut short keeps what it measured
        results.append(run_robot(name, ROBOTS[name], sizes, args.quick, args.reps))
        write_json(
            out / f"{NAME}.json",
            {
                "device": f"{device.platform}: {device.device_kind}",
                "jax": jax.__version__,
                "results": results,
            },
        )
        print_table(results[-1:])
    print_table(results)
    print(f"wrote {out / f'{NAME}.json'}")
    data = table(f"{NAME}.batches", COLUMNS, table_rows(results), stamp)
    print(render(data))
    print("wrote", write(args.out, NAME, [data]))


if __name__ == "__main__":
    main()
