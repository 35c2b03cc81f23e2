"""The cost of one-sided constraints: an inactive limit, events, batches.

- **Inactive limit.** A model with a joint limit that the motion never reaches against
  the same model without it: the event-driven solve's overhead where no event happens
  (the gaps' condition and the step limit at every step, the transition at the start).
  Two models: the planar double pendulum of rods (6 coordinates) and the URDF arm of
  `tests/data/three_link_arm.urdf` (28 coordinates), both under `Baumgarte(20, 100)`.
- **Events.** The bouncing ball (`jaxdae.examples.BouncingBall`, e = 0.8, 2 s, 8 impacts)
  and a batch of 1,024 with coefficients from 0.3 to 0.95 in one `jax.vmap` (each member
  with its own events: 3 to 36 of them).

Run time: medians of `--repeats` calls after compilation (float64, CPU); compile time: the
first call's, one cold compile each.

With `--out OUT` the two tables are also written to `OUT/bench_events/tables.json`
(`bench_events.inactive-limit`, `bench_events.bouncing-ball`).

    python experiments/benchmarks/bench_events.py [--repeats 7] [--out output]
"""

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _tables
from _tables import render, run_stamp, table, write  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402
from jaxdae.examples import BouncingBall  # noqa: E402

URDF = Path(__file__).resolve().parents[2] / "tests" / "data" / "three_link_arm.urdf"
TIGHT = {"rtol": 1e-8, "atol": 1e-10}


def double_pendulum(limited: bool):
    rods = [
        mb.PlanarBody(
            "upper", mass=1.2, inertia=0.1, markers={"top": (-0.5, 0.0), "bottom": (0.5, 0.0)}
        ),
        mb.PlanarBody("lower", mass=0.8, inertia=0.033, markers={"top": (-0.35, 0.0)}),
    ]
    stops = [mb.JointLimit("elbow", -3.0, 3.0)] if limited else []
    model = mb.Mechanism(
        rods,
        [
            mb.Revolute("ground", "upper.top", name="shoulder"),
            mb.Revolute("upper.bottom", "lower.top", name="elbow"),
        ],
        [mb.Gravity((0.0, -9.81))],
        stops=stops,
    )
    q0, v0 = model.initial_state(joint_coordinates={"shoulder": (-1.0, 0.0), "elbow": (0.5, 0.0)})
    return model, q0, v0, 3.0


def urdf_arm(limited: bool):
    robot = mb.load_urdf(URDF)
    stops = [mb.JointLimit("shoulder", -3.0, 3.0)] if limited else []
    model = robot.mechanism(
        forces=[mb.Gravity()], limits=False, stops=stops, coordinates="absolute"
    )
    q0, v0 = model.initial_state(
        joint_coordinates={"yaw": (0.0, 1.0), "shoulder": (0.4, 0.0), "elbow": -0.8, "wrist": 0.05}
    )
    return model, q0, v0, 0.5


def timed(fn, *args, repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    compile_time = time.perf_counter() - start
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        runs.append(time.perf_counter() - start)
    return compile_time, float(np.median(runs))


INACTIVE_COLUMNS = [
    ("model", "left"),
    ("without the limit [ms]", "right"),
    ("with it [ms]", "right"),
    ("ratio", "right"),
    ("compile without / with [s]", "right"),
]
BOUNCING_COLUMNS = [
    ("bouncing ball", "left"),
    ("run [ms]", "right"),
    ("compile [s]", "right"),
    ("events", "left"),
]


def inactive_limit_row(name, without, with_limit):
    """A row of the inactive limit's table from `(compile, run)` seconds without and with."""
    (c0, r0), (c1, r1) = without, with_limit
    return [name, f"{1e3 * r0:.2f}", f"{1e3 * r1:.2f}", f"{r1 / r0:.2f}", f"{c0:.1f} / {c1:.1f}"]


def inactive_limit(repeats):
    table_rows = []
    for name, build in (
        ("double pendulum (6 coordinates)", double_pendulum),
        ("URDF arm (28 coordinates, absolute)", urdf_arm),
    ):
        rows = []
        for limited in (False, True):
            model, q0, v0, t1 = build(limited)

            @jax.jit
            def run(q0, v0, model=model, t1=t1):
                sol = jaxdae.simulate(
                    model, jaxdae.Baumgarte(20.0, 100.0), 0.0, t1, q0, v0, **TIGHT
                )
                return sol.q_final

            rows.append(timed(run, q0, v0, repeats=repeats))
        table_rows.append(inactive_limit_row(name, *rows))
        print(" | ".join(table_rows[-1]), flush=True)
    return table_rows


def bouncing(repeats):
    def run(e):
        sol = jaxdae.simulate(
            BouncingBall(e=e),
            jaxdae.Unstabilized(),
            0.0,
            2.0,
            jnp.array([0.0, 1.0]),
            jnp.zeros(2),
            **TIGHT,
        )
        return sol.q_final, sol.events.count

    one = jax.jit(run)
    batch = jax.jit(jax.vmap(run))
    restitution = jnp.linspace(0.3, 0.95, 1024)
    c1, r1 = timed(one, jnp.asarray(0.8), repeats=repeats)
    cb, rb = timed(batch, restitution, repeats=max(repeats // 2, 1))
    counts = np.asarray(batch(restitution)[1])
    rows = [
        ["one, e = 0.8", f"{1e3 * r1:.2f}", f"{c1:.1f}", f"{int(one(0.8)[1])}"],
        ["vmap of 1,024", f"{1e3 * rb:.1f}", f"{cb:.1f}", f"{counts.min()} to {counts.max()}"],
    ]
    return rows


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the tables to OUT/bench_events/"
    )
    options = parser.parse_args()
    stamp = run_stamp()
    limit_rows = inactive_limit(options.repeats)
    ball_rows = bouncing(options.repeats)
    tables = [
        table("bench_events.inactive-limit", INACTIVE_COLUMNS, limit_rows, stamp),
        table("bench_events.bouncing-ball", BOUNCING_COLUMNS, ball_rows, stamp),
    ]
    print("\n\n".join(render(t) for t in tables))
    if options.out is not None:
        print("wrote", write(options.out, "bench_events", tables))


if __name__ == "__main__":
    main()
