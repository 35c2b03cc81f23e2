"""Benchmark: where the compile time of `simulate` and its gradients goes.

The three jaxdae functions of `bench_core.py` (the two-link forward solve, the gradient with
the default adjoint and with `ReverseSweepAdjoint`) and the gradient of the arm's energy
drift (a loss on a diagnostic, `energy_drift_gradient`), each traced, lowered and compiled from
cold caches `--repeats` times. Prints per phase the minimum and median wall time, the
process CPU time of the XLA compile (all its threads; steadier than wall time on this
machine's virtual cores), and the size of the compiled program: StableHLO operations
before and HLO instructions after XLA's optimizations, conditionals (each traced check is
one) and host callbacks.

To compare two commits, run this script alternately with `PYTHONPATH` at each checkout
(jaxdae is imported from there; the figures move by 20–30% between minutes on a 2-core
virtual machine, so alternate and compare medians):

    git worktree add /tmp/before <commit>
    for i in 1 2 3; do
      PYTHONPATH=/tmp/before .venv/bin/python experiments/benchmarks/bench_compile.py
      PYTHONPATH=$PWD .venv/bin/python experiments/benchmarks/bench_compile.py
    done

`--stages` also splits the trace of `simulate` (the forward function) by stage: the
equations of motion (`LagrangianSystem.terms`, first trace), their scalar graphs
(`scalarize`), diffrax's solve (which includes the right-hand side's first trace),
the diagnostics at the saved states (`assemble_solution`), the input, structure and gain
checks (`check_inputs`) and the joined runtime checks (`check_traced`), by wrapping those
functions where the solve looks them up.

`--model chain:64` (or `ladder:128`, `pendulum:32`, `net:32`) measures instead the forward
solve and the gradient of `bench_scaling.py` on that family and size
(`jaxdae/examples/_scaling.py`).

Two models with one-sided constraints (solved by events):

- `--model ball`: the time of the third impact of `jaxdae.examples.BouncingBall` (e = 0.8,
  dropped from 1 m, 2 s at rtol 1e-10), its gradient with respect to `e` and the height,
  and that gradient under `jax.vmap` over 8 copies of them; `--model ball:N` allows `N`
  steps between two events instead of `simulate`'s default 100,000 (at most 4,096: the
  gradient replays each stretch, `jaxdae.ReplayAdjoint`).
- `--model urdf-arm`: the first 0.05 s of the guide's URDF arm (`tests/data/three_link_arm.urdf`,
  four joints in joint coordinates under gravity) without its joint limits, with them (six
  gaps), and with them under `jax.vmap` over 8 initial states.

Two models with contacts in space:

- `--model sphere`: the event-driven sphere of the closed forms (a uniform sphere of radius
  0.1 m, a `PlaneContact` with friction 0.3 in a spatial `Mechanism`, set sliding at
  1.5 m/s without spin): the time at which it starts to roll, and that time's derivative
  with respect to the launch speed.
- `--model quadruped`: the A1 of `experiments/examples/quadruped_drop.py` (its URDF from
  `pybullet_data`) dropped from 0.4 m, time-stepped (`TimeStepping(dt=1e-3)`) for 0.1 s: its
  final base height, and that height's derivative with respect to the drop height.

    python experiments/benchmarks/bench_compile.py [--repeats 3] [--only forward] [--stages]
        [--model two-link | ball | ball:N | urdf-arm | sphere | quadruped | chain:N | ladder:N |
        pendulum:N | net:N]
"""

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import bench_core  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _tables import run_stamp, table, write  # noqa: E402

from jaxdae.examples import TwoLinkManipulator  # noqa: E402

FUNCTIONS = ("forward", "gradient", "gradient, reverse sweep")  # bench_core.py's
URDF_ARM = Path(__file__).resolve().parents[2] / "tests" / "data" / "three_link_arm.urdf"


def program_size(lowered, compiled) -> dict:
    """Operations of the lowered module, instructions of the optimized one, and its
    conditionals and custom calls (host callbacks)."""
    optimized = compiled.as_text()
    instruction = re.compile(r"\s+(ROOT )?%?\S+ = ")
    return {
        "stablehlo ops": sum(
            1 for line in lowered.as_text().splitlines() if re.match(r"\s+%\S+ = ", line)
        ),
        "HLO instructions": sum(1 for line in optimized.splitlines() if instruction.match(line)),
        "conditionals": optimized.count(" conditional("),
        "custom calls": optimized.count(" custom-call("),
    }


def compile_phases(fn, args, compiler_options=None):
    """`jax.jit(fn)` at `args` traced, lowered and compiled from cold caches: the lowered
    and compiled objects, and the seconds of each phase `(trace, lower, XLA compile, XLA
    compile's process CPU time, total)`."""
    jax.clear_caches()
    start = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    traced_at = time.perf_counter()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    cpu = time.process_time()
    compiled = lowered.compile(compiler_options)
    seconds = (
        traced_at - start,
        lowered_at - traced_at,
        time.perf_counter() - lowered_at,
        time.process_time() - cpu,
        time.perf_counter() - start,
    )
    return lowered, compiled, seconds


def measure(fn, args, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        lowered, compiled, seconds = compile_phases(fn, args)
        runs.append(seconds)
    runs = np.asarray(runs)
    return {
        "min": runs.min(axis=0),
        "median": np.median(runs, axis=0),
        **program_size(lowered, compiled),
    }


def trace_stages(fn, args, repeats: int) -> dict:
    """Wall time per stage of `repeats` cold traces of `fn` (medians), by wrapping the
    functions named in the module docstring; nested stages count in their parents too."""

    import jaxdae._compilation._scalarize as scalarize_module
    import jaxdae._integration._outcome as outcome_module
    import jaxdae._integration._problem as problem_module
    import jaxdae._integration._solve as solve_module
    import jaxdae._integration._trajectories as trajectories_module
    from jaxdae import LagrangianSystem

    spent: dict = {}
    active: set = set()

    def timed(label, function):
        def wrapper(*a, **k):
            if label in active:  # a recursive call (`_eval` of a nested jaxpr)
                return function(*a, **k)
            active.add(label)
            start = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                active.discard(label)
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        return wrapper

    patches = [
        (LagrangianSystem, "terms", "equations of motion (LagrangianSystem.terms)"),
        (scalarize_module, "_eval", "scalar graphs (scalarize)"),
        (
            trajectories_module,
            "assemble_solution",
            "diagnostics at the saved states (assemble_solution)",
        ),
        (problem_module, "check_inputs", "input, structure and gain checks (check_inputs)"),
        (outcome_module, "check_traced", "joined runtime checks (check_traced)"),
        (solve_module, "diffeqsolve_unjitted", "diffrax.diffeqsolve (with the right-hand side)"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for (owner, name, label), (_, _, original) in zip(patches, originals, strict=True):
            setattr(owner, name, timed(label, original))
        runs = []
        for _ in range(repeats):
            jax.clear_caches()
            spent.clear()
            start = time.perf_counter()
            jax.jit(fn).trace(*args)
            runs.append({"whole trace": time.perf_counter() - start, **spent})
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    return {label: float(np.median([run.get(label, 0.0) for run in runs])) for label in runs[0]}


def ball_functions(max_steps: int = 100_000, adjoint=None):
    """The third impact time of the bouncing ball, and its gradient, with `max_steps` steps
    allowed between two events (and `adjoint`; None: `simulate`'s choice)."""
    import jaxdae
    from jaxdae.examples import BouncingBall

    def third_impact(restitution, height):
        sol = jaxdae.simulate(
            BouncingBall(e=restitution),
            jaxdae.Unstabilized(),
            0.0,
            2.0,
            jnp.stack([0.0 * height, height]),
            jnp.zeros(2),
            rtol=1e-10,
            atol=1e-12,
            max_steps=max_steps,
            adjoint=adjoint,
        )
        return sol.events.t[2]

    gradient = jax.grad(third_impact, argnums=(0, 1))
    batched = jax.vmap(gradient)
    return (
        {
            "forward": third_impact,
            "gradient": gradient,
            "vmap of 8, gradient": lambda e, h: batched(jnp.full(8, e), jnp.full(8, h)),
        },
        (jnp.asarray(0.8), jnp.asarray(1.0)),
    )


def urdf_arm_functions():
    """The URDF arm's first 0.05 s without and with its limits, and with them batched."""
    import jaxdae
    import jaxdae.multibody as mb

    robot = mb.load_urdf(URDF_ARM)

    def final_q(limits):
        model = robot.mechanism(forces=[mb.Gravity()], limits=limits)

        def run(q0, v0):
            return jaxdae.simulate(model, jaxdae.Unstabilized(), 0.0, 0.05, q0, v0).q_final

        return run

    q0, v0 = robot.mechanism().initial_state(
        joint_coordinates={"yaw": (0.0, 1.0), "shoulder": (0.4, 0.0), "elbow": -0.8, "wrist": 0.05}
    )
    batched = jax.vmap(final_q(True))
    functions = {
        "forward, no limits": final_q(False),
        "forward, limits": final_q(True),
        "vmap of 8, limits": lambda q, v: batched(jnp.tile(q, (8, 1)), jnp.tile(v, (8, 1))),
    }
    return functions, (q0, v0)


def sphere_functions():
    """The sliding sphere's roll time (the time of its stick event) as a function of its
    launch speed, and its derivative."""
    import jaxdae
    import jaxdae.multibody as mb

    radius, mu = 0.1, 0.3
    sphere = mb.Mechanism(
        bodies=[
            mb.RigidBody(
                "ball", mass=1.0, inertia=0.4 * radius**2 * np.eye(3), position=[0, 0, radius]
            )
        ],
        forces=[mb.Gravity([0.0, 0.0, -9.81])],
        stops=[mb.PlaneContact("ball", radius=radius, friction=mu)],
    )
    q0, v0 = sphere.initial_state()

    def roll_time(speed):
        v = v0.at[0].set(speed)
        sol = jaxdae.simulate(
            sphere, jaxdae.Unstabilized(), 0.0, 0.5, q0, v, rtol=1e-10, atol=1e-12
        )
        return sol.events.t[0]

    return {"forward": roll_time, "gradient": jax.grad(roll_time)}, (jnp.asarray(1.5),)


def quadruped_functions():
    """The A1's time-stepped drop: its final base height after 0.1 s as a function of the
    drop height, and its derivative."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import quadruped_drop

    import jaxdae

    path = quadruped_drop.urdf_path()
    if path is None or not path.exists():
        raise SystemExit(
            "--model quadruped reads the A1's URDF from pybullet_data: pip install pybullet"
        )
    model, _ = quadruped_drop.quadruped(path)
    q0, _ = quadruped_drop.initial_state(model, 0.0)

    def final_height(height):
        start = q0.at[2].add(height)
        sol = jaxdae.simulate(
            model,
            jaxdae.Baumgarte(kd=20.0, kp=100.0),
            0.0,
            0.1,
            start,
            jnp.zeros_like(start),
            events=jaxdae.TimeStepping(dt=1e-3),
        )
        return sol.q_final[2]

    return {"forward": final_height, "gradient": jax.grad(final_height)}, (jnp.asarray(0.4),)


def energy_drift_gradient():
    """The gradient of the two-link arm's energy drift at 5 saved times with respect to its
    gains: a loss on a diagnostic that the model's own functions give (the energy)."""
    import jaxdae

    system = TwoLinkManipulator()

    def drift(params, q0, v0):
        sol = jaxdae.simulate(
            system,
            jaxdae.ModifiedLagrange(*params),
            0.0,
            bench_core.T1,
            q0,
            v0,
            ts=jnp.linspace(0.0, bench_core.T1, 5),
            rtol=bench_core.RTOL,
            atol=bench_core.ATOL,
        )
        return jnp.sum((sol.energy - sol.energy[0]) ** 2)

    return bench_core.value_and_gradient(drift)


def model_functions(model: str):
    """`(functions by name, their arguments)` of `--model`."""
    if model == "two-link":
        q0, v0 = (jnp.asarray(x) for x in TwoLinkManipulator().initial_state())
        core = bench_core.jaxdae_functions()
        functions = {name: core[name] for name in FUNCTIONS}
        functions["gradient, energy drift"] = energy_drift_gradient()
        return functions, (bench_core.jaxdae_params(), q0, v0)
    if model == "ball":
        return ball_functions()
    if model.startswith("ball:") and model[5:].isdigit():
        return ball_functions(int(model[5:]))
    if model == "urdf-arm":
        return urdf_arm_functions()
    if model == "sphere":
        return sphere_functions()
    if model == "quadruped":
        return quadruped_functions()
    import bench_scaling

    import jaxdae.examples._scaling as scaling_models

    family, _, size = model.partition(":")
    if family not in scaling_models.FAMILIES or not size.isdigit():
        raise SystemExit(
            "--model: two-link, ball, ball:N, urdf-arm, sphere, quadruped, or chain:N, "
            f"ladder:N, pendulum:N, net:N; got {model!r}"
        )
    system = scaling_models.FAMILIES[family](int(size))
    forward, gradient = bench_scaling.jaxdae_functions(system)
    q0, v0 = system.initial_state()
    gains = (jnp.asarray(bench_scaling.KD), jnp.asarray(bench_scaling.KP))
    return {"forward": forward, "gradient": gradient}, (gains, q0, v0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only", action="append", help="one of the model's functions (e.g. forward, gradient)"
    )
    parser.add_argument(
        "--stages", action="store_true", help="split the trace of `simulate` by stage"
    )
    parser.add_argument(
        "--model",
        default="two-link",
        help="two-link (bench_core's problem), ball, ball:N, urdf-arm, sphere, quadruped, or "
        "chain:N, ladder:N, pendulum:N, net:N",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also write the table to OUT/bench_compile/tables.json (as bench_compile.MODEL)",
    )
    options = parser.parse_args()
    stamp = run_stamp()
    bench_core.warm_up_jax()
    functions, args = model_functions(options.model)
    rows = []
    print(
        "| function | | trace [s] | lower [s] | XLA compile [s] | XLA compile, CPU [s] | "
        "total [s] | StableHLO ops | HLO instructions | conditionals | custom calls |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in options.only or list(functions):
        m = measure(functions[name], args, options.repeats)
        for stat in ("min", "median"):
            times = " | ".join(f"{x:.2f}" for x in m[stat])
            size = (
                (
                    f"{m['stablehlo ops']} | {m['HLO instructions']} | {m['conditionals']} | "
                    f"{m['custom calls']}"
                )
                if stat == "min"
                else "| | |"
            )
            print(f"| {name} | {stat} | {times} | {size} |", flush=True)
        trace, lower, xla, _, total = m["median"]
        rows.append(
            [
                name,
                f"{trace:.2f}",
                f"{lower:.2f}",
                f"{xla:.2f}",
                f"{total:.2f}",
                f"{m['stablehlo ops']:,}",
                f"{m['HLO instructions']:,}",
            ]
        )
    if options.out is not None:
        columns = [("function", "left")] + [
            (title, "right")
            for title in (
                "trace [s]",
                "lower [s]",
                "XLA compile [s]",
                "total [s]",
                "StableHLO ops",
                "HLO instructions",
            )
        ]
        name = "bench_compile." + options.model.replace(":", "-")
        write(options.out, "bench_compile", [table(name, columns, rows, stamp)])
    if options.stages:
        print("\n| stage of the trace of `simulate` (median) | wall [s] |\n| --- | ---: |")
        stages = trace_stages(functions["forward"], args, options.repeats)
        for label, seconds in stages.items():
            print(f"| {label} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
