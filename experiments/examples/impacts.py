"""One-sided constraints by events, against closed forms and an independent engine.

- A ball dropped from 1 m (`jaxdae.examples.BouncingBall`, e = 0.8): the impact times,
  impulses and heights against the closed form (parabolas between impacts).
- A pendulum against a wall (`jaxdae.examples.PendulumWithStop`, released at 0.8 rad) for
  e = 0.25, 0.5, 0.75 and 1 in one `jax.vmap`: the impact times against the
  elliptic-integral closed form.
- Newton's cradle: five equal balls on a line, 1 mm apart, elastic
  (`jaxdae.multibody.DistanceStop`): the first ball's velocity passes to the last.
- The URDF arm of tests/data/three_link_arm.urdf swinging into its joint limits (enforced
  by `robot.mechanism()`, plastic). With `mujoco` installed, the same file in MuJoCo
  (its soft joint limits, RK4 at 0.1 ms): the time the first limit is reached, the joints
  before it, and the shoulder at rest on its limit. After the first impact the two differ
  by design: jaxdae's limits are exact and plastic, MuJoCo's soft (a spring-damper
  constraint that lets the joint past its limit and back), so the elbow's swing that
  follows differs.
- Housner's rocking block (`jaxdae.examples.RockingBlock`, 0.2 m × 0.8 m, tilted 0.1 rad,
  friction 1): the rocking energy kept through each plastic impact against Housner's
  `(1 − 1.5 sin² α)²`.
- Glocker's woodpecker toy (`jaxdae.examples.WoodpeckerToy`: impacts and Coulomb friction
  at three contacts) from the published state on its periodic motion: the state each time
  the bird swings down through the published angle, against the published state, and the
  phase portraits.

    python experiments/examples/impacts.py [--out output] [--quick]
    # writes OUT/impacts/impacts.png and results.json
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax
import jax.numpy as jnp
import numpy as np
from _common import figure, output_dir, parse_args, write_json

import jaxdae
import jaxdae.multibody as mb
from jaxdae.examples import BouncingBall, PendulumWithStop, RockingBlock, WoodpeckerToy

NAME = "impacts"
URDF = Path(__file__).resolve().parents[2] / "tests" / "data" / "three_link_arm.urdf"
TIGHT = {"rtol": 1e-11, "atol": 1e-13}
ARM_START = {"yaw": (0.0, 1.0), "shoulder": (0.3, 2.0), "elbow": (-0.5, 0.0), "wrist": 0.05}


def bouncing_ball(t1, num):
    ball = BouncingBall(e=0.8)
    ts = jnp.linspace(0.0, t1, num)
    sol = jaxdae.simulate(
        ball, jaxdae.Unstabilized(), 0.0, t1, jnp.array([0.0, 1.0]), jnp.zeros(2), ts=ts, **TIGHT
    )
    kinds = np.asarray(sol.events.kind[: int(sol.events.count)])
    bounces = int(np.sum(kinds == jaxdae.Events.IMPACT))
    times = np.asarray(sol.events.t[:bounces])
    reference = ball.impact_times(1.0, bounces)
    starts = np.concatenate([[0.0], reference])
    speeds = np.concatenate([[0.0], 0.8 * ball.impact_speeds(1.0, bounces)])
    heights = np.concatenate([[1.0], np.zeros(bounces)])
    t = np.asarray(ts)
    k = np.searchsorted(starts, t, side="right") - 1
    flight = t - starts[k]
    exact = heights[k] + speeds[k] * flight - 0.5 * 9.81 * flight**2
    return {
        "ts": t,
        "height": np.asarray(sol.q[:, 1]),
        "exact": exact,
        "impacts": times,
        "impact_time_error": float(np.max(np.abs(times - reference))),
        "impulse_error": float(
            np.max(
                np.abs(
                    np.asarray(sol.events.impulse[:bounces])
                    - 1.8 * ball.impact_speeds(1.0, bounces)
                )
                / (1.8 * ball.impact_speeds(1.0, bounces))
            )
        ),
        "height_error": float(np.max(np.abs(np.asarray(sol.q[:, 1]) - exact))),
        "events": int(sol.events.count),
    }


def pendulum_stop(t1, num):
    restitution = jnp.array([0.25, 0.5, 0.75, 1.0])
    ts = jnp.linspace(0.0, t1, num)

    def run(e):
        pendulum = PendulumWithStop(e=e)
        return jaxdae.simulate(
            pendulum,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            t1,
            *pendulum.initial_state(0.8),
            ts=ts,
            **TIGHT,
        )

    sols = jax.jit(jax.vmap(run))(restitution)
    rows = []
    for row, e in enumerate(np.asarray(restitution)):
        count = int(sols.events.count[row])
        reference = PendulumWithStop(e=e).impact_times(0.8, count)
        rows.append(
            {
                "e": float(e),
                "impacts": count,
                "impact_time_error": float(
                    np.max(np.abs(np.asarray(sols.events.t[row, :count]) - reference))
                ),
                "max_abs_phi": float(np.max(np.abs(np.asarray(sols.phi[row])))),
            }
        )
    angles = np.arctan2(-np.asarray(sols.q[..., 0]), -np.asarray(sols.q[..., 1]))
    return {"ts": np.asarray(ts), "angles": angles, "rows": rows}


def newtons_cradle(t1, num, balls=5):
    bodies = [
        mb.PlanarBody(f"b{k}", mass=1.0, inertia=0.01, position=(0.101 * k, 0.0))
        for k in range(balls)
    ]
    model = mb.Mechanism(
        bodies=bodies,
        joints=[mb.Prismatic("ground", f"b{k}", name=f"slide{k}") for k in range(balls)],
        stops=[
            mb.DistanceStop(f"b{k}", f"b{k + 1}", lower=0.1, restitution=1.0)
            for k in range(balls - 1)
        ],
    )
    q0, v0 = model.initial_state(joint_coordinates={"slide0": (-0.2, 1.0)})
    ts = jnp.linspace(0.0, t1, num)
    sol = jaxdae.simulate(model, jaxdae.Baumgarte(20.0, 100.0), 0.0, t1, q0, v0, ts=ts, **TIGHT)
    rates = model.joint_rates(sol.q_final, sol.v_final)
    positions = model.joint_coordinates(sol.q)
    return {
        "ts": np.asarray(ts),
        "positions": np.stack([np.asarray(positions[f"slide{k}"]) for k in range(balls)]),
        "final_rates": [float(rates[f"slide{k}"]) for k in range(balls)],
        "events": sol.events.table(),
    }


def arm_into_limits(t1, num):
    robot = mb.load_urdf(URDF)
    model = robot.mechanism(forces=[mb.Gravity()])
    q0, v0 = model.initial_state(joint_coordinates=ARM_START, tol=1e-12)
    ts = jnp.linspace(0.0, t1, num)
    start = time.perf_counter()
    sol = jaxdae.simulate(
        model, jaxdae.Baumgarte(20.0, 100.0), 0.0, t1, q0, v0, ts=ts, rtol=1e-9, atol=1e-11
    )
    jax.block_until_ready(sol.q)
    seconds = time.perf_counter() - start
    joints = model.joint_coordinates(sol.q)
    result = {
        "ts": np.asarray(ts),
        "names": robot.joint_names,
        "angles": np.stack([np.asarray(joints[n]) for n in robot.joint_names]),
        "events": [
            (t, model.gap_names[g], kind, impulse) for t, g, kind, impulse in sol.events.table()
        ],
        "seconds_with_compile": seconds,
    }
    reference = mujoco_arm(robot, t1, num)
    if reference is not None:
        result["mujoco"] = reference
    return result


def mujoco_arm(robot, t1, num):
    """The arm in MuJoCo (`None` where it is not installed): qpos of the four joints at
    the save times, from the same URDF file and start."""
    try:
        import mujoco
    except ImportError:
        return None
    model = mujoco.MjModel.from_xml_path(str(URDF))
    model.opt.timestep = 1e-4
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    data = mujoco.MjData(model)
    for name in robot.joint_names:
        joint = model.joint(name)
        value = ARM_START[name]
        angle, rate = value if isinstance(value, tuple) else (value, 0.0)
        data.qpos[joint.qposadr[0]] = angle
        data.qvel[joint.dofadr[0]] = rate
    ts = np.linspace(0.0, t1, num)
    angles = np.zeros((len(robot.joint_names), num))
    steps = int(round(t1 / model.opt.timestep))
    every = steps // (num - 1)
    start = time.perf_counter()
    for step in range(steps + 1):
        if step % every == 0:
            angles[:, step // every] = [
                data.qpos[model.joint(n).qposadr[0]] for n in robot.joint_names
            ]
        mujoco.mj_step(model, data)
    return {"ts": ts, "angles": angles, "seconds": time.perf_counter() - start}


def rocking_block(t1, num):
    block = RockingBlock()
    ts = jnp.linspace(0.0, t1, num)
    sol = jaxdae.simulate(
        block,
        jaxdae.Unstabilized(),
        0.0,
        t1,
        *block.initial_state(0.1),
        ts=ts,
        rtol=1e-12,
        atol=1e-14,
    )
    impacts = [row[0] for row in sol.events.table() if row[2] in ("impact", "contact")]
    bounds = [0.0] + impacts + [t1]
    t = np.asarray(ts)
    rocking = np.asarray(sol.energy) - block.rest_energy()
    levels = np.array(
        [
            np.median(rocking[(t > a) & (t < b)])
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            if np.any((t > a) & (t < b))
        ]
    )
    ratios = levels[1:] / levels[:-1]
    return {
        "ts": t,
        "angle": np.asarray(sol.q[:, 2]),
        "impacts": impacts,
        "ratios": ratios,
        "housner": block.energy_ratio(),
        "ratio_error": float(np.max(np.abs(ratios / block.energy_ratio() - 1))),
    }


def woodpecker(t1, num):
    toy = WoodpeckerToy()
    q0, v0 = toy.published_state()
    ts = jnp.linspace(0.0, t1, num)
    sol = jaxdae.simulate(
        toy,
        jaxdae.Unstabilized(),
        0.0,
        t1,
        q0,
        v0,
        ts=ts,
        rtol=1e-10,
        atol=1e-12,
        events=jaxdae.EventDriven(max_events=400),
    )
    t, q, v = np.asarray(ts), np.asarray(sol.q), np.asarray(sol.v)
    bird = q[:, 2]
    target = float(q0[2])
    crossings = np.where((bird[:-1] > target) & (bird[1:] <= target))[0]
    passes = []
    for k in crossings:  # linear interpolation between the save times
        f = (bird[k] - target) / (bird[k] - bird[k + 1])
        passes.append((t[k] + f * (t[1] - t[0]), *((1 - f) * v[k] + f * v[k + 1])))
    passes = np.array(passes)
    published = np.asarray(v0)
    kinds = [
        jaxdae.Events.KIND_NAMES[int(k)]
        for k in np.asarray(sol.events.kind[: int(sol.events.count)])
    ]
    return {
        "ts": t,
        "q": q,
        "v": v,
        "published_q": np.asarray(q0),
        "published_v": published,
        "passes": passes,
        "period": float(np.mean(np.diff(passes[:, 0]))),
        "rate_error": float(
            np.max(np.abs(passes[:, [1, 3]] - published[[0, 2]]) / np.abs(published[[0, 2]]))
        ),
        "descent": float((q[-1, 0] - q[0, 0]) / t1),
        "events": {kind: kinds.count(kind) for kind in sorted(set(kinds))},
    }


def first_limit_time(ts, angles, names, limits):
    """The first save time at which a joint is at or past one of its limits."""
    for k, t in enumerate(ts):
        for row, name in enumerate(names):
            limit = limits[name]
            if limit.lower is None:
                continue
            if angles[row, k] <= limit.lower + 1e-4 or angles[row, k] >= limit.upper - 1e-4:
                return float(t), name
    return None, None


def main(out: Path, quick: bool = False) -> dict:
    import matplotlib.pyplot as plt

    folder = output_dir(out, NAME)
    start = time.perf_counter()
    ball = bouncing_ball(2.0 if quick else 3.0, 301)
    pendulum = pendulum_stop(2.0 if quick else 4.0, 401)
    cradle = newtons_cradle(0.5, 201)
    arm = arm_into_limits(1.0 if quick else 2.0, 201)
    rocking = rocking_block(1.5 if quick else 3.0, 601)
    pecking = woodpecker(0.3 if quick else 0.9, 9001)
    elapsed = time.perf_counter() - start

    fig, axes = plt.subplots(3, 2, figsize=(13, 12), layout="constrained")
    ax = axes[0, 0]
    ax.plot(ball["ts"], ball["exact"], "k-", lw=2.5, alpha=0.3, label="closed form")
    ax.plot(ball["ts"], ball["height"], "C0.", ms=2.5, label="jaxdae (save times)")
    for t in ball["impacts"]:
        ax.axvline(t, color="C1", lw=0.5, alpha=0.6)
    ax.set(
        xlabel="t [s]",
        ylabel="height [m]",
        title=f"bouncing ball, e = 0.8: impact times within "
        f"{ball['impact_time_error']:.0e} s of the closed form",
    )
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    for row, r in enumerate(pendulum["rows"]):
        ax.plot(pendulum["ts"], pendulum["angles"][row], label=f"e = {r['e']:g}")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set(
        xlabel="t [s]",
        ylabel="angle from the vertical [rad]",
        title="pendulum against a wall at the vertical",
    )
    ax.legend(fontsize=8)
    ax = axes[1, 0]
    for k, x in enumerate(cradle["positions"]):
        ax.plot(cradle["ts"], x, label=f"ball {k}")
    ax.set(
        xlabel="t [s]",
        ylabel="x [m]",
        title="Newton's cradle: final rates "
        + ", ".join(f"{v:.3g}" for v in cradle["final_rates"]),
    )
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    for row, name in enumerate(arm["names"]):
        ax.plot(arm["ts"], arm["angles"][row], f"C{row}", label=f"{name} (jaxdae)")
        if "mujoco" in arm:
            ax.plot(arm["mujoco"]["ts"], arm["mujoco"]["angles"][row], f"C{row}--", lw=0.9)
    ax.set(
        xlabel="t [s]",
        ylabel="joint coordinate [rad, m]",
        title="URDF arm into its limits" + (" (dashed: MuJoCo)" if "mujoco" in arm else ""),
    )
    ax.legend(fontsize=8)
    ax = axes[2, 0]
    ax.plot(rocking["ts"], rocking["angle"], "C0")
    for t in rocking["impacts"]:
        ax.axvline(t, color="C1", lw=0.5, alpha=0.6)
    ax.set(
        xlabel="t [s]",
        ylabel="block angle [rad]",
        title=f"rocking block: energy kept per impact within "
        f"{rocking['ratio_error']:.0e} of Housner's {rocking['housner']:.4f}",
    )
    ax = axes[2, 1]
    ax.plot(pecking["q"][:, 2], pecking["v"][:, 2], "C0", lw=0.6, label="bird φ_S")
    ax.plot(pecking["q"][:, 1], pecking["v"][:, 1], "C2", lw=0.6, label="sleeve φ_M")
    ax.plot(
        pecking["published_q"][2], pecking["published_v"][2], "k*", ms=10, label="published state"
    )
    ax.set(
        xlabel="angle [rad]",
        ylabel="angular velocity [rad/s]",
        title=f"woodpecker toy: period {pecking['period'] * 1e3:.1f} ms, descends "
        f"{-pecking['descent'] * 1e3:.0f} mm/s",
    )
    ax.legend(fontsize=8)
    fig.savefig(folder / "impacts.png", dpi=120)
    plt.close(fig)

    limits = mb.load_urdf(URDF).limits
    arm_first, arm_joint = first_limit_time(arm["ts"], arm["angles"], arm["names"], limits)
    result = {
        "seconds": elapsed,
        "bouncing_ball": {k: v for k, v in ball.items() if k not in ("ts", "height", "exact")},
        "pendulum": pendulum["rows"],
        "cradle": {"final_rates": cradle["final_rates"], "events": cradle["events"]},
        "rocking_block": {
            "ratios": rocking["ratios"].tolist(),
            "housner": rocking["housner"],
            "ratio_error": rocking["ratio_error"],
        },
        "woodpecker": {
            "passes": pecking["passes"].tolist(),
            "period": pecking["period"],
            "rate_error": pecking["rate_error"],
            "descent": pecking["descent"],
            "events": pecking["events"],
        },
        "arm": {
            "events": arm["events"],
            "first_limit": [arm_first, arm_joint],
            "final": dict(zip(arm["names"], arm["angles"][:, -1].tolist(), strict=True)),
        },
    }
    table = (
        [
            "| case | checked | result |",
            "| --- | --- | --- |",
            f"| bouncing ball, e = 0.8 | impact times, impulses, heights vs closed form | "
            f"{ball['impact_time_error']:.1e} s, {ball['impulse_error']:.1e} (rel.), "
            f"{ball['height_error']:.1e} m |",
        ]
        + [
            f"| pendulum against a wall, e = {r['e']:g} | {r['impacts']} impact times vs "
            f"elliptic closed form | {r['impact_time_error']:.1e} s (max \\|Φ\\| "
            f"{r['max_abs_phi']:.0e}) |"
            for r in pendulum["rows"]
        ]
        + [
            "| Newton's cradle, 5 balls | final rates (1 m/s handed on) | "
            + ", ".join(f"{v:.2e}" for v in cradle["final_rates"])
            + " |",
            f"| rocking block, α = {np.degrees(np.arctan(0.25)):.1f}° | energy kept by "
            f"{len(rocking['ratios'])} impacts vs Housner's {rocking['housner']:.6f} | "
            f"{rocking['ratio_error']:.1e} (rel.) |",
            f"| woodpecker toy | ẏ, φ̇_S at the published φ_S in {len(pecking['passes'])} cycles "
            f"vs published | {pecking['rate_error']:.1e} (rel.); period "
            f"{pecking['period'] * 1e3:.1f} ms |",
        ]
    )
    if "mujoco" in arm:
        mj_first, mj_joint = first_limit_time(
            arm["mujoco"]["ts"], arm["mujoco"]["angles"], arm["names"], limits
        )
        result["arm"]["mujoco"] = {
            "first_limit": [mj_first, mj_joint],
            "final": dict(zip(arm["names"], arm["mujoco"]["angles"][:, -1].tolist(), strict=True)),
            "seconds": arm["mujoco"]["seconds"],
        }
        before = arm["ts"] < min(arm_first, mj_first)
        agreement = float(
            np.max(np.abs(arm["mujoco"]["angles"][:, before] - arm["angles"][:, before]))
        )
        shoulder = arm["names"].index("shoulder")
        result["arm"]["mujoco"]["agreement_before_first_limit"] = agreement
        table.append(
            f"| URDF arm into its limits | first limit reached (jaxdae / MuJoCo); "
            f"joints before it; shoulder at rest on its limit 1.5 | {arm_joint} at "
            f"{arm_first:.3f} s / {mj_joint} at {mj_first:.3f} s; within "
            f"{agreement:.0e}; {arm['angles'][shoulder, -1]:.4f} / "
            f"{arm['mujoco']['angles'][shoulder, -1]:.4f} (MuJoCo's soft limit) |"
        )
    else:
        table.append(
            f"| URDF arm into its limits | first limit reached | {arm_joint} at "
            f"{arm_first} s (MuJoCo not installed) |"
        )
    write_json(folder / "results.json", result)
    headline = (
        f"Exact events: the ball's impact times within {ball['impact_time_error']:.0e} s "
        f"of the closed form, the pendulum's within "
        f"{max(r['impact_time_error'] for r in pendulum['rows']):.0e} s; the cradle "
        "hands the velocity on; the URDF arm stops at its limits; the rocking block "
        f"keeps Housner's energy fraction to {rocking['ratio_error']:.0e}; the "
        "woodpecker toy with friction runs its published cycle."
    )
    print(headline)
    print("\n".join(table))
    print(f"({elapsed:.0f} s)")
    return {
        "headline": headline,
        "table": table,
        "figures": [
            figure(
                folder / "impacts.png",
                "Bouncing ball against its closed form, a pendulum against a wall for four "
                "coefficients of restitution, Newton's cradle, the URDF arm swinging into its "
                "joint limits (dashed: MuJoCo, where installed), Housner's rocking block and the "
                "woodpecker toy's phase portraits",
            )
        ],
    }


if __name__ == "__main__":
    args = parse_args(NAME, __doc__)
    main(args.out, args.quick)
