"""Which branch each formulation follows through singular configurations: IFToMM A02.

The IFToMM library of computational benchmark problems, problem A02 ("N four-bar
mechanism"): N parallelograms in a row, 2N + 1 links of 1 m, each a uniform rod of 1 kg,
gravity 9.81 m/s² along −y. Ground pivots `A_i = (i, 0)`, i = 0…N; the cranks `A_i B_i`
start vertical and the couplers `B_{i−1} B_i` horizontal, with the x-velocity of `B_0`
1 m/s. It is a 1-DOF mechanism: all cranks turn together through one angle `φ` and the
couplers stay horizontal. It turns over and over, and each time the cranks lie flat
(`φ ≡ 0 mod π`) the constraint Jacobian loses N of its 2N ranks: there every four-bar can
leave the parallelogram and fold. The published problem has N = 40 over 20 s.

The model is written in the links' angles (cranks `θ_0…θ_N`, couplers `ψ_1…ψ_N`, 2N
closure equations, no redundancy away from the flat configurations). N = 24 by default:
the largest N whose 2N constraints `Solution.jacobian_conditioning` covers (48), from
which `singular_passages` comes; `--n 40` runs the published size without them. The
reference is the parallelogram motion, `I φ̈ = −g c cos φ` with `I = (N+1)/3 + N`,
`c = (N+1)/2 + N` (diffrax `Dopri8`, rtol = atol = 1e-12), and its flat configurations
are the roots of `sin φ`.

`PseudoInverse`, `Baumgarte` and `ModifiedLagrange` at α = 1e3, 1e5, 1e7 (all with
`K_D = 10`, `K_P = 25`), each in one adaptive `Tsit5` solve (rtol 1e-8, atol 1e-10)
over 10 s saved every 10 ms, `throw=False`; then the first of each kind again at rtol
1e-6 and 1e-10 (atol = rtol / 100). Per solve:

- the result and where the solve ended;
- `max |x_B0 − x_ref|` over the saved times it reached, and the first saved time where
  that error exceeds 1e-3 ("departs");
- the first saved time where the links are more than 0.01 rad from the parallelogram
  branch, `max_i |θ_i − θ_0| + max_i |sin ψ_i|` (angles modulo 2π) ("leaves branch");
- the change of the energy `T + V` (the motion is conservative) and `|Φ|` at the end;
- `sol.singular_passages()` against the reference's flat times: how many of those
  reached are matched within one save interval, and how many other passages it reports.

Writes `singular_passages.csv`, `singular_passages.json` and `singular_passages.png`
(`x_B0` against the reference, and the Jacobian's conditioning, at rtol 1e-8). About
two minutes on two cores, most of it compilation; `--quick`: N = 3 over 3 s, rtol 1e-8 only.

    python experiments/studies/singular_passages.py --out output [--quick] [--n 24] [--t1 10]
"""

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import figure, legend_below, output_dir, progress, write_json  # noqa: E402
from scipy.optimize import brentq  # noqa: E402

import jaxdae  # noqa: E402

KD, KP = 10.0, 25.0
ALPHAS = (1e3, 1e5, 1e7)
SAVE_DT = 0.01
RTOL, ATOL = 1e-8, 1e-10
DEPARTURE = 1e-3  # m: the tracked coordinate has left the reference
OFF_BRANCH = 1e-2  # rad: the links have left the parallelogram
SWEEP = (1e-6, 1e-10)  # further rtol (atol = rtol / 100) for the second table


class NFourBar(jaxdae.LagrangianSystem):
    """IFToMM A02: `n` parallelograms of unit bars (uniform rods of 1 kg) in a row.

    `q = (θ_0…θ_n, ψ_1…ψ_n)`: the cranks' angles from +x (crank `i` pinned to the ground
    at `(i, 0)`) and the couplers' angles (coupler `i` joins the tips of cranks `i − 1`
    and `i`). Loop `i` closes with `B_{i−1} + e(ψ_i) = B_i`: two equations per loop.
    """

    gravity: jax.Array
    n: int = eqx.field(static=True)

    def __init__(self, n: int, gravity: float = 9.81):
        self.n = n
        self.gravity = jnp.asarray(gravity, dtype=float)

    def kinetic_energy(self, t, q, v):
        theta, psi = q[: self.n + 1], q[self.n + 1 :]
        dtheta, dpsi = v[: self.n + 1], v[self.n + 1 :]
        # A coupler's centre moves with the tip of the crank before it plus half its turn.
        vx = -dtheta[:-1] * jnp.sin(theta[:-1]) - 0.5 * dpsi * jnp.sin(psi)
        vy = dtheta[:-1] * jnp.cos(theta[:-1]) + 0.5 * dpsi * jnp.cos(psi)
        return jnp.sum(dtheta**2) / 6 + 0.5 * jnp.sum(vx**2 + vy**2) + jnp.sum(dpsi**2) / 24

    def potential_energy(self, t, q):
        theta, psi = q[: self.n + 1], q[self.n + 1 :]
        heights = 0.5 * jnp.sum(jnp.sin(theta)) + jnp.sum(jnp.sin(theta[:-1]) + 0.5 * jnp.sin(psi))
        return self.gravity * heights

    def constraints(self, t, q):
        theta, psi = q[: self.n + 1], q[self.n + 1 :]
        return jnp.concatenate(
            [
                jnp.cos(theta[:-1]) + jnp.cos(psi) - jnp.cos(theta[1:]) - 1.0,
                jnp.sin(theta[:-1]) + jnp.sin(psi) - jnp.sin(theta[1:]),
            ]
        )

    def initial_state(self):
        """Cranks vertical, `B_0` moving at 1 m/s along +x."""
        q0 = jnp.concatenate([jnp.full(self.n + 1, jnp.pi / 2), jnp.zeros(self.n)])
        v0 = jnp.concatenate([jnp.full(self.n + 1, -1.0), jnp.zeros(self.n)])
        return q0, v0


def reference(n: int, t1: float, ts: np.ndarray):
    """The parallelogram motion: `φ` at `ts`, and the times where `sin φ = 0` in (0, t1]."""
    inertia, weight = (n + 1) / 3 + n, (n + 1) / 2 + n

    def field(t, y, args):
        return jnp.array([y[1], -9.81 * weight * jnp.cos(y[0]) / inertia])

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Dopri8(),
        0.0,
        t1,
        1e-3,
        jnp.array([jnp.pi / 2, -1.0]),
        saveat=diffrax.SaveAt(dense=True),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
        max_steps=100_000,
    )
    phi = np.asarray(jax.vmap(lambda t: sol.evaluate(t)[0])(jnp.asarray(ts)))
    sine = np.sin(phi)
    crossings = np.flatnonzero(np.sign(sine[1:]) != np.sign(sine[:-1]))
    flat = [
        brentq(lambda t: float(jnp.sin(sol.evaluate(t)[0])), ts[k], ts[k + 1], xtol=1e-12)
        for k in crossings
    ]
    return phi, np.array(flat)


def formulations() -> dict:
    rows = {
        f"PseudoInverse({KD:g}, {KP:g})": jaxdae.PseudoInverse(KD, KP),
        f"Baumgarte({KD:g}, {KP:g})": jaxdae.Baumgarte(KD, KP),
    }
    for alpha in ALPHAS:
        rows[f"ModifiedLagrange({alpha:.0e}, {KD:g}, {KP:g})"] = jaxdae.ModifiedLagrange(
            alpha, KD, KP
        )
    return rows


def _name(result) -> str:
    """The name of a `jaxdae.RESULTS` item."""
    return next(name for name, item in jaxdae.RESULTS._name_to_item.items() if bool(item == result))


def measure(system, formulation, ts, phi_ref, flat, rtol=RTOL):
    q0, v0 = system.initial_state()
    start = time.perf_counter()
    sol = jaxdae.simulate(
        system,
        formulation,
        0.0,
        float(ts[-1]),
        q0,
        v0,
        ts=jnp.asarray(ts),
        rtol=rtol,
        atol=rtol * ATOL / RTOL,
        throw=False,
    )
    t_final = float(sol.t_final)
    seconds = time.perf_counter() - start
    reached = np.isfinite(np.asarray(sol.ts))
    q = np.asarray(sol.q)[reached]
    n = system.n
    error = np.abs(np.cos(q[:, 0]) - np.cos(phi_ref[reached]))
    departs = np.flatnonzero(error > DEPARTURE)
    turn = q[:, : n + 1] - q[:, :1]
    off_branch = np.max(np.abs(np.arctan2(np.sin(turn), np.cos(turn))), axis=1) + np.max(
        np.abs(np.sin(q[:, n + 1 :])), axis=1
    )
    leaves = np.flatnonzero(off_branch > OFF_BRANCH)
    energy = np.asarray(sol.energy)[reached]
    passages = np.asarray(sol.singular_passages())
    flat_reached = flat[flat <= t_final + SAVE_DT]  # a solve may stop at one
    matched = sum(bool(np.any(np.abs(passages - t) <= SAVE_DT)) for t in flat_reached)
    conditioning = np.asarray(sol.jacobian_conditioning)
    return {
        "result": _name(sol.result),
        "t_final": t_final,
        "max_error": float(error.max()),
        "departs": float(ts[reached][departs[0]]) if departs.size else None,
        "max_off_branch": float(off_branch.max()),
        "leaves_branch": float(ts[reached][leaves[0]]) if leaves.size else None,
        "energy_change": float(energy[-1] - energy[0]),
        "final_residual": float(np.max(np.abs(np.asarray(sol.phi)[reached][-1]))),
        "passages": passages.tolist(),
        "flat_reached": int(flat_reached.size),
        "flat_matched": matched,
        "conditioning_computed": bool(np.all(np.isfinite(conditioning[reached]))),
        "steps": int(sol.stats["num_accepted_steps"]),
        "seconds": seconds,
        "x_b0": np.cos(q[:, 0]),
        "conditioning": conditioning[reached],
    }


def plot(out: Path, ts, phi_ref, flat, rows) -> dict:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, layout="constrained")
    top.plot(ts, np.cos(phi_ref), "k--", lw=1.5, label="reference (parallelogram)")
    for name, row in rows.items():
        reached = ts[: row["x_b0"].size]
        top.plot(reached, row["x_b0"], lw=0.9, label=name)
        bottom.semilogy(reached, np.maximum(row["conditioning"], 1e-12), lw=0.9)
    for t in flat:
        bottom.axvline(t, color="k", lw=0.5, ls=":")
    top.set_ylabel("x of B0 [m]")
    legend_below(top, ncol=3)
    bottom.set_ylabel("σ_r / σ_1 of Φ_q")
    bottom.set_xlabel("t [s]   (dotted: the reference's flat configurations)")
    path = out / "singular_passages.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return figure(
        path,
        "x of B0 against the parallelogram reference, and the constraint "
        "Jacobian's conditioning at the saved times",
    )


def _passages_cell(row) -> str:
    if not row["conditioning_computed"]:
        return "not computed (> 48 constraints)"
    extra = len(row["passages"]) - row["flat_matched"]
    return f"{row['flat_matched']}/{row['flat_reached']}" + (f" + {extra} other" if extra else "")


def _time(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(rows) -> list[str]:
    lines = [
        "| formulation | rtol | result (t_final) | max err x_B0 [m] | departs [s] | "
        "leaves branch [s] | ΔE [J] | abs Φ at end | passages: flat matched + other |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for (name, rtol), r in rows.items():
        lines.append(
            f"| {name} | {rtol:.0e} | {r['result']} ({r['t_final']:.2f}) | {r['max_error']:.1e} "
            f"| {_time(r['departs'])} | {_time(r['leaves_branch'])} | "
            f"{r['energy_change']:.1e} | {r['final_residual']:.1e} | {_passages_cell(r)} |"
        )
    return lines


def main(out: Path, quick: bool = False, n: int | None = None, t1: float | None = None):
    n = n if n is not None else (3 if quick else 24)
    t1 = t1 if t1 is not None else (3.0 if quick else 10.0)
    out = output_dir(out, "singular_passages")
    ts = np.linspace(0.0, t1, int(round(t1 / SAVE_DT)) + 1)
    phi_ref, flat = reference(n, t1, ts)
    system = NFourBar(n)
    chosen = formulations()
    # Every formulation at RTOL; the first of each kind also at the SWEEP tolerances.
    cases = [(name, RTOL) for name in chosen]
    if not quick:
        kinds = {}
        for name in chosen:
            kinds.setdefault(name.split("(")[0], name)
        cases += [(name, rtol) for name in kinds.values() for rtol in SWEEP]
    rows = {
        (name, rtol): measure(system, chosen[name], ts, phi_ref, flat, rtol)
        for name, rtol in progress(cases, "singular passages", unit="solve")
    }
    lines = table(rows)
    print("\n".join(lines))
    print(f"reference flat configurations (s): {np.array2string(flat, precision=3)}")
    on_branch = [
        name for (name, rtol), r in rows.items() if rtol == RTOL and r["leaves_branch"] is None
    ]
    headline = (
        f"A02, N = {n}, 0–{t1:g} s, {flat.size} flat configurations; on the "
        f"parallelogram branch throughout at rtol {RTOL:.0e}: "
        f"{', '.join(on_branch) or 'none'}"
    )
    print(headline)
    columns = [
        "formulation",
        "rtol",
        "result",
        "t_final",
        "max_error",
        "departs",
        "leaves_branch",
        "max_off_branch",
        "energy_change",
        "final_residual",
        "flat_reached",
        "flat_matched",
        "steps",
        "seconds",
        "passages",
    ]
    with open(out / "singular_passages.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for (name, rtol), r in rows.items():
            writer.writerow(
                [name, rtol]
                + [
                    " ".join(f"{t:.2f}" for t in r[c]) if c == "passages" else r[c]
                    for c in columns[2:]
                ]
            )
    figures = [
        plot(out, ts, phi_ref, flat, {name: r for (name, rtol), r in rows.items() if rtol == RTOL})
    ]
    write_json(
        out / "singular_passages.json",
        {
            "n": n,
            "t1": t1,
            "save_dt": SAVE_DT,
            "atol_over_rtol": ATOL / RTOL,
            "kd": KD,
            "kp": KP,
            "reference_flat_times": flat,
            "results": [
                {
                    "formulation": name,
                    "rtol": rtol,
                    **{k: v for k, v in r.items() if k not in ("x_b0", "conditioning")},
                }
                for (name, rtol), r in rows.items()
            ],
        },
    )
    return {"headline": headline, "table": lines, "figures": figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("output"),
        help="output root; results go to OUT/singular_passages/",
    )
    parser.add_argument("--quick", action="store_true", help="N = 3 over 3 s")
    parser.add_argument("--n", type=int, default=None, help="four-bars (default 24)")
    parser.add_argument("--t1", type=float, default=None, help="end time [s] (default 10)")
    args = parser.parse_args()
    main(args.out, args.quick, args.n, args.t1)
