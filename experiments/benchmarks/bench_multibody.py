"""Benchmark: mechanisms built with `jaxdae.multibody` against the same models written by
hand.

Each model is simulated twice with the same formulation, solver and tolerances: once as a
`jaxdae.multibody.Mechanism`, once as a `jaxdae.LagrangianSystem` written by hand in the
same absolute coordinates (`(x, y, θ)` per body: a constant diagonal mass matrix, the joints'
equations written out with array operations). For each it reports:

- the size of the traced right-hand side: the equations of the jaxpr of
  `Baumgarte.accelerations(system.terms(t, q, v))`, nested ones included;
- the compile time of the solve (`jax.jit(solve).lower(q0, v0).compile()`, CPU time by
  `time.process_time`, so that other processes on a shared machine do not count);
- the time of one compiled solve: the median CPU time of `--reps` calls after a warm-up
  call, the built and the hand-written model called in turn (interleaved; the median, as
  this virtual machine's process clock now and then reports a call at a tenth of its time);
- steps and the largest difference of the end states.

The ratio built / hand is the layer's cost. Models:

- the slider-crank of the guide (3 bodies, 8 equations), 1 s;
- Mukharlyamov and Deressa's (2015) two-link arm with its tip driven along a line (2 bodies, 6
  equations), 0.4 s, also against `jaxdae.examples.TwoLinkManipulator` (relative angles, 2
  equations): the same motion in other coordinates;
- a pendulum chain of N uniform links joined by revolute joints, released from rest at
  30° under gravity (3N coordinates, 2N equations), 0.5 s; above 8 coordinates the core
  derives the terms from their sparsity patterns (both versions), and the script reports
  what the longest chain hands the core, built and by hand: the non-zeros of `M` and
  `Φ_q` and the half-bandwidth of `Φ_q Φ_qᵀ`.

`Baumgarte(20, 100)`, Tsit5, `rtol = atol = 1e-8`, float64, CPU.

    OPENBLAS_NUM_THREADS=1 python experiments/benchmarks/bench_multibody.py [--out output] [--quick]
        [--reps 7] [--links 4,16,64] [--no-small]
    # prints the table, writes OUT/bench_multibody/bench_multibody.json and the table as
    # `bench_multibody.built-vs-hand` in OUT/bench_multibody/tables.json
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import output_dir, write_json  # noqa: E402
from _tables import render, run_stamp, table, write  # noqa: E402

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402
from jaxdae._compilation._operators import is_state_independent, sparse_matrix  # noqa: E402
from jaxdae.examples import TwoLinkManipulator  # noqa: E402

jax.config.update("jax_enable_x64", True)

FORMULATION = jaxdae.Baumgarte(20.0, 100.0)
RTOL = ATOL = 1e-8
G = 9.81


def _rot(theta):
    c, s = jnp.cos(theta), jnp.sin(theta)
    return jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)


def _points(q, arms):
    """Points `r_i + R(θ_i) s_i` for bodies `i` (`q` as `(bodies, 3)`, `arms` `(bodies, 2)`)."""
    return q[:, :2] + jnp.einsum("bij,bj->bi", _rot(q[:, 2]), arms)


class HandPlanar(jaxdae.LagrangianSystem):
    """Common part of the hand-written models: `M = diag(m, m, I)` per body, gravity."""

    masses: jax.Array
    inertias: jax.Array

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.stack([self.masses, self.masses, self.inertias], 1).reshape(-1))

    def potential_energy(self, t, q):
        return G * jnp.sum(self.masses * q.reshape(-1, 3)[:, 1])


# -- slider-crank ------------------------------------------------------------------------

CRANK = {"masses": (1.0, 0.5, 0.3), "inertias": (2e-3, 4e-3, 1e-4)}


def built_slider_crank():
    (m1, m2, m3), (i1, i2, i3) = CRANK["masses"], CRANK["inertias"]
    return mb.Mechanism(
        [
            mb.PlanarBody("crank", m1, i1, markers={"pin": (0.1, 0.0)}),
            mb.PlanarBody(
                "rod", m2, i2, markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)}, position=(0.25, 0.0)
            ),
            mb.PlanarBody("slider", m3, i3, position=(0.4, 0.0)),
        ],
        [
            mb.Revolute("ground", "crank", name="crank"),
            mb.Revolute("crank.pin", "rod.a"),
            mb.Revolute("rod.b", "slider"),
            mb.Prismatic("ground", "slider", name="slide"),
        ],
        [mb.Gravity()],
    )


class HandSliderCrank(HandPlanar):
    def constraints(self, t, q):
        b = q.reshape(3, 3)
        pin, a_end, b_end = _points(
            b[jnp.array([0, 1, 1])], jnp.array([[0.1, 0.0], [-0.15, 0.0], [0.15, 0.0]])
        )
        return jnp.concatenate(
            [b[0, :2], pin - a_end, b_end - b[2, :2], jnp.stack([b[2, 1], b[2, 2]])]
        )


# -- two-link arm ------------------------------------------------------------------------


class LineTarget(eqx.Module):
    x0: jax.Array
    speed: jax.Array
    height: jax.Array

    def __call__(self, t):
        return jnp.stack([self.x0 - self.speed * t, self.height + 0.0 * t])


def built_two_link(arm):
    (l1, l2), (m1, m2) = arm.lengths, arm.masses
    return mb.Mechanism(
        [
            mb.PlanarBody(
                "link1", m1, m1 * l1**2 / 12, markers={"base": (-l1 / 2, 0.0), "end": (l1 / 2, 0.0)}
            ),
            mb.PlanarBody(
                "link2", m2, m2 * l2**2 / 12, markers={"base": (-l2 / 2, 0.0), "tip": (l2 / 2, 0.0)}
            ),
        ],
        [
            mb.Revolute("ground", "link1.base"),
            mb.Revolute("link1.end", "link2.base"),
            mb.Driver(
                "ground", "link2.tip", LineTarget(arm.x0, arm.speed, 0.5 * arm.length), name="tip"
            ),
        ],
        [mb.Gravity(jnp.stack([0.0, -arm.gravity]))],
    )


class HandTwoLink(HandPlanar):
    lengths: jax.Array
    x0: jax.Array
    speed: jax.Array

    def constraints(self, t, q):
        b = q.reshape(2, 3)
        half = 0.5 * self.lengths
        zero = jnp.zeros_like(half)
        base = _points(b, jnp.stack([-half, zero], 1))
        end = _points(b, jnp.stack([half, zero], 1))
        target = jnp.stack([self.x0 - self.speed * t, 0.5 * self.lengths[0]])
        return jnp.concatenate([base[0], end[0] - base[1], end[1] - target])


# -- a chain of N links ------------------------------------------------------------------

LINK, LINK_MASS, START = 0.3, 1.0, np.deg2rad(-60.0)  # 30° below the horizontal


def chain_start(n):
    """Links hanging in a straight line at 30° below the horizontal, at rest."""
    u = np.array([np.cos(START), np.sin(START)])
    centres = (np.arange(n)[:, None] + 0.5) * LINK * u
    q = np.concatenate([centres, np.full((n, 1), START)], axis=1).reshape(-1)
    return jnp.asarray(q), jnp.zeros(3 * n)


def built_chain(n):
    inertia = LINK_MASS * LINK**2 / 12
    ends = {"a": (-LINK / 2, 0.0), "b": (LINK / 2, 0.0)}
    bodies = [mb.PlanarBody(f"link{i}", LINK_MASS, inertia, markers=ends) for i in range(n)]
    joints = [mb.Revolute("ground", "link0.a")] + [
        mb.Revolute(f"link{i - 1}.b", f"link{i}.a") for i in range(1, n)
    ]
    return mb.Mechanism(bodies, joints, [mb.Gravity()])


class HandChain(HandPlanar):
    def constraints(self, t, q):
        b = q.reshape(-1, 3)
        n = b.shape[0]
        half = jnp.broadcast_to(jnp.array([LINK / 2, 0.0]), (n, 2))
        a_ends, b_ends = _points(b, -half), _points(b, half)
        return jnp.concatenate([a_ends[0], (b_ends[:-1] - a_ends[1:]).reshape(-1)])


def hand_chain(n):
    return HandChain(masses=jnp.full(n, LINK_MASS), inertias=jnp.full(n, LINK_MASS * LINK**2 / 12))


# -- timing ------------------------------------------------------------------------------


def equations(jaxpr) -> int:
    """The number of equations of a jaxpr, those of nested jaxprs (loops, calls) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += equations(inner)
    return count


def rhs_equations(system, q0, v0) -> int:
    """The size of the traced right-hand side (the model closed over, as in a solve)."""

    def rhs(t, q, v):
        return FORMULATION.accelerations(system.terms(t, q, v))

    return equations(jax.make_jaxpr(rhs)(jnp.asarray(0.0), q0, v0).jaxpr)


def compiled_solve(system, t1, q0, v0):
    """`(compiled solve, compile seconds)`: CPU time of lowering and compiling."""

    @jax.jit
    def solve(q0, v0):
        sol = jaxdae.simulate(system, FORMULATION, 0.0, t1, q0, v0, rtol=RTOL, atol=ATOL)
        return sol.q[-1], sol.stats["num_steps"]

    start = time.process_time()
    compiled = solve.lower(q0, v0).compile()
    return compiled, time.process_time() - start


def timed_pair(built, hand, t1, q0, v0, reps):
    """Compile both, then time them in turn: `{which: (median CPU seconds, compile seconds,
    steps, q(t1))}`."""
    runs = {}
    for which, system in (("built", built), ("hand", hand)):
        compiled, seconds = compiled_solve(system, t1, q0, v0)
        q1, steps = jax.block_until_ready(compiled(q0, v0))  # warm-up
        runs[which] = [compiled, seconds, int(steps), np.asarray(q1), []]
    for _ in range(reps):
        for run in runs.values():
            start = time.process_time()
            jax.block_until_ready(run[0](q0, v0))
            run[4].append(time.process_time() - start)
    return {
        which: (float(np.median(run[4])), run[1], run[2], run[3]) for which, run in runs.items()
    }


def structure_check(n):
    """What the chain of `n` links hands the core, built and by hand: the terms' sparse `M`
    and `Φ_q` (non-zeros), and the half-bandwidth of `Φ_q Φ_qᵀ` (whose band the core
    factorizes)."""
    q0, v0 = chain_start(n)
    out = {"links": n, "coordinates": 3 * n, "equations": 2 * n}
    for which, model in (("built", built_chain(n)), ("hand", hand_chain(n))):
        terms = model.terms(0.0, q0, v0)
        mass, jac = sparse_matrix(terms.mass_operator), sparse_matrix(terms.jacobian_operator)
        entry = {"sparse_mass": mass is not None, "sparse_jacobian": jac is not None}
        if mass is not None and jac is not None:
            mask = np.zeros(jac.pattern.shape, bool)
            mask[jac.pattern.rows, jac.pattern.cols] = True
            rows, cols = np.nonzero(mask.astype(int) @ mask.T.astype(int))
            entry.update(
                mass_nonzeros=int(mass.pattern.rows.shape[0]),
                jacobian_nonzeros=int(jac.pattern.rows.shape[0]),
                jacobian_density=float(jac.pattern.density),
                mass_is_constant=is_state_independent(terms.mass_operator),
                half_bandwidth=int(np.abs(rows - cols).max()),
            )
        out[which] = entry
    return out


COLUMNS = [
    ("model", "left"),
    ("coordinates", "right"),
    ("jaxpr equations, built / by hand", "right"),
    ("compile [s], built / by hand", "right"),
    ("solve [ms], built / by hand", "right"),
    ("ratio", "right"),
    ("steps", "right"),
]


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def table_row(row: dict) -> list[str]:
    """The page's row of one model (a row of the JSON's `rows`)."""
    steps = (
        f"{row['built_steps']}"
        if row["built_steps"] == row["hand_steps"]
        else f"{row['built_steps']} / {row['hand_steps']}"
    )
    return [
        row["model"],
        f"{row['coordinates']}",
        f"{row['built_equations']:,} / {row['hand_equations']:,}",
        f"{row['built_compile_s']:.1f} / {row['hand_compile_s']:.1f}",
        f"{_ms(row['built_ms'])} / {_ms(row['hand_ms'])}",
        f"{row['ratio']:.2f}",
        steps,
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("output"))
    parser.add_argument("--quick", action="store_true", help="chains of 4 and 16 links only")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--links",
        default=None,
        help="comma-separated chain lengths (default 4,16,64; --quick: 4,16)",
    )
    parser.add_argument(
        "--no-small",
        action="store_true",
        help="the chains only (not the slider-crank and the two-link arm)",
    )
    args = parser.parse_args()
    stamp = run_stamp()
    out = output_dir(args.out, "bench_multibody")
    links = (
        [int(n) for n in args.links.split(",")]
        if args.links
        else [4, 16]
        if args.quick
        else [4, 16, 64]
    )

    arm = TwoLinkManipulator()
    q_rel, v_rel = jaxdae.consistent_initial_state(arm, 0.0, *arm.initial_state())

    def absolute(q):
        c1, c2 = arm._centres(q)
        return jnp.concatenate([c1, q[:1], c2, (q[0] + q[1])[None]])

    cases = []
    if not args.no_small:
        arm_q0, arm_v0 = jax.jvp(absolute, (q_rel,), (v_rel,))
        (l1, l2), (m1, m2) = arm.lengths, arm.masses
        hand_arm = HandTwoLink(
            masses=jnp.stack([m1, m2]),
            inertias=jnp.stack([m1 * l1**2 / 12, m2 * l2**2 / 12]),
            lengths=jnp.stack([l1, l2]),
            x0=arm.x0,
            speed=arm.speed,
        )
        crank = built_slider_crank()
        crank_q0, crank_v0 = crank.initial_state(joint_coordinates={"crank": (0.5, 10.0)})
        hand_crank = HandSliderCrank(
            masses=jnp.asarray(CRANK["masses"]), inertias=jnp.asarray(CRANK["inertias"])
        )
        cases += [
            ("slider-crank", 1.0, crank, hand_crank, crank_q0, crank_v0),
            ("two-link arm", 0.4, built_two_link(arm), hand_arm, arm_q0, arm_v0),
        ]
    for n in links:
        cases.append((f"chain of {n} links", 0.5, built_chain(n), hand_chain(n), *chain_start(n)))

    rows = []
    header = (
        f"{'model':<20} {'n':>4} {'jaxpr built/hand':>17} {'compile built/hand [s]':>23} "
        f"{'built [ms]':>11} {'hand [ms]':>10} {'ratio':>6} {'steps':>11} "
        f"{'max |Δq(t1)|':>13}"
    )
    print(header)
    print("-" * len(header))
    for name, t1, built, hand, q0, v0 in cases:
        eb, eh = rhs_equations(built, q0, v0), rhs_equations(hand, q0, v0)
        runs = timed_pair(built, hand, t1, q0, v0, args.reps)
        (tb, cb, sb, qb), (th, ch, sh, qh) = runs["built"], runs["hand"]
        row = dict(
            model=name,
            coordinates=int(q0.shape[0]),
            t1=t1,
            built_equations=eb,
            hand_equations=eh,
            built_ms=1e3 * tb,
            hand_ms=1e3 * th,
            ratio=tb / th,
            built_steps=sb,
            hand_steps=sh,
            built_compile_s=cb,
            hand_compile_s=ch,
            max_q_difference=float(np.abs(qb - qh).max()),
        )
        rows.append(row)
        print(
            f"{name:<20} {row['coordinates']:>4} {f'{eb}/{eh}':>17} "
            f"{f'{cb:.1f}/{ch:.1f}':>23} {row['built_ms']:>11.2f} {row['hand_ms']:>10.2f} "
            f"{row['ratio']:>6.2f} {f'{sb}/{sh}':>11} {row['max_q_difference']:>13.1e}",
            flush=True,
        )
    result = {
        "rows": rows,
        "reps": args.reps,
        "rtol": RTOL,
        "atol": ATOL,
        "device": jax.devices()[0].device_kind,
    }
    if not args.no_small:
        # the same arm in relative angles (the paper's model), for scale
        compiled, cr = compiled_solve(arm, 0.4, q_rel, v_rel)
        _, sr = jax.block_until_ready(compiled(q_rel, v_rel))
        times = []
        for _ in range(args.reps):
            start = time.process_time()
            jax.block_until_ready(compiled(q_rel, v_rel))
            times.append(time.process_time() - start)
        tr = float(np.median(times))
        print(
            f"{'two-link (relative)':<20} {2:>4} {'':>17} {f'{cr:.1f}':>23} {'':>11} "
            f"{1e3 * tr:>10.2f} {'':>6} {int(sr):>11}"
        )
        result.update(relative_two_link_ms=1e3 * tr, relative_two_link_steps=int(sr))
    structure = structure_check(max(links))
    print(f"structure handed to the core by the built chain: {structure}")
    result["structure"] = structure
    write_json(out / "bench_multibody.json", result)
    print(f"wrote {out / 'bench_multibody.json'}")
    data = table("bench_multibody.built-vs-hand", COLUMNS, [table_row(r) for r in rows], stamp)
    print(render(data))
    print("wrote", write(args.out, "bench_multibody", [data]))


if __name__ == "__main__":
    main()
