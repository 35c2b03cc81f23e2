"""Projection onto the constraint manifold (`jaxdae.Projected`): drift and cost.

For each mechanism and formulation, the same adaptive `Tsit5` solve (rtol 1e-8,
atol 1e-10) with and without `jaxdae.Projected(diffrax.Tsit5())`:

- `max |Φ|`, `max |[Φ̇; Ψ]|` over 201 save times that are step ends (the steps are clipped
  to them, `diffrax.ClipStepSizeController(step_ts=ts)`), leaving out the initial state
  (up to where that solve stopped, if it stopped early);
- steps and wall time of the solve without save times (a jitted solve, the best of
  interleaved repetitions; the machine's other load makes single timings noisy);
- the gradient of a final-state loss with respect to a system parameter: its time, and its
  agreement with central differences.

Mechanisms: the Cartesian pendulum (0–10 s), Mukharlyamov and Deressa's (2015) two-link arm tracking
its line (0–0.45 s, before its singular configuration at 0.49 s, where `Baumgarte` stops; 0–1 s
through it for `PseudoInverse` and `ModifiedLagrange`), the exact Ball & Beam with its
four-bar lever (Krasinskaya and Krasinskiy (2013); 0–2 s, open loop), and Shemelova's (2016)
Cartesian arm in Hamiltonian form (0–5 s). Writes `projection.json`, `projection_drift.png`,
`projection_cost.png`.

    python experiments/studies/projection.py --out output [--quick]
    python experiments/studies/projection.py --out output \
        --only "Cartesian pendulum | ModifiedLagrange"
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax

jax.config.update("jax_enable_x64", True)

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
from _common import figure, output_dir, parse_args, progress, write_json

import jaxdae
from jaxdae.examples import (
    BallAndBeam,
    CartesianArm,
    CartesianPendulum,
    TwoLinkManipulator,
)

RTOL, ATOL = 1e-8, 1e-10


def mechanisms(quick: bool):
    """`(name, system, (q0, s0), t1, formulations, parameter)`: `parameter` picks the
    system field the gradient is taken with respect to."""
    pendulum = CartesianPendulum()
    arm = TwoLinkManipulator()
    arm_state = jaxdae.consistent_initial_state(arm, 0.0, *arm.initial_state())[:2]
    beam = BallAndBeam(exact=True)
    hamiltonian = CartesianArm()
    kd, kp = (
        jnp.array([20.0, 10.0]),
        jnp.array([100.0, 25.0]),
    )  # Mukharlyamov and Deressa (2015), Case 1
    scale = 0.2 if quick else 1.0
    return [
        (
            "Cartesian pendulum",
            pendulum,
            pendulum.state_from_angle(1.0, 0.0),
            10.0 * scale,
            {
                "Unstabilized": jaxdae.Unstabilized(),
                "Baumgarte(10, 25)": jaxdae.Baumgarte(10.0, 25.0),
                "PseudoInverse(10, 25)": jaxdae.PseudoInverse(10.0, 25.0),
                "ModifiedLagrange(10, 20, 100)": jaxdae.ModifiedLagrange(10.0, 20.0, 100.0),
                "RedundantCoordinates(y)": jaxdae.RedundantCoordinates(dependent=(1,)),
            },
            lambda s: s.length,
        ),
        (
            "two-link arm",
            arm,
            arm_state,
            0.45,
            {
                "Unstabilized": jaxdae.Unstabilized(),
                "Baumgarte(Case 1)": jaxdae.Baumgarte(kd, kp),
            },
            lambda s: s.speed,
        ),
        (
            "two-link arm through the fold",
            arm,
            arm_state,
            1.0,
            {
                "PseudoInverse(Case 1)": jaxdae.PseudoInverse(kd, kp),
                "ModifiedLagrange(10, Case 1)": jaxdae.ModifiedLagrange(10.0, kd, kp),
            },
            lambda s: s.speed,
        ),
        (
            "Ball & Beam (four-bar)",
            beam,
            beam.state(0.3, 0.2, 0.0, 0.5),
            2.0 * scale,
            {
                "Unstabilized": jaxdae.Unstabilized(),
                "Baumgarte(10, 25)": jaxdae.Baumgarte(10.0, 25.0),
                "ModifiedLagrange(10, 20, 100)": jaxdae.ModifiedLagrange(10.0, 20.0, 100.0),
                "RedundantCoordinates(α)": jaxdae.RedundantCoordinates(dependent=beam.dependent),
            },
            lambda s: s.lever_length,
        ),
        (
            "Cartesian arm (Hamiltonian)",
            hamiltonian,
            hamiltonian.initial_state(),
            5.0 * scale,
            {
                "Unstabilized": jaxdae.Unstabilized(),
                "Baumgarte(10, 25)": jaxdae.Baumgarte(10.0, 25.0),
                "paper's perturbation eq.": CartesianArm.paper_formulation(
                    -25.0, -10.0, -25.0, -10.0
                ),
            },
            lambda s: s.lengths,
        ),
    ]


def _name(result) -> str:
    """The name of a `jaxdae.RESULTS` item."""
    return next(name for name, item in jaxdae.RESULTS._name_to_item.items() if bool(item == result))


def best_times(functions: dict, repeats: int) -> dict:
    """The best wall time of each function, the functions called in turn `repeats` times
    (interleaved, so that a change in the machine's load affects them alike)."""
    for fn in functions.values():
        jax.block_until_ready(fn())
    best = {name: np.inf for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def run_case(system, state, t1, formulation, parameter, repeats, gradient: bool):
    q0, s0 = state
    ts = jnp.linspace(0.0, t1, 201)
    solvers = {"plain": diffrax.Tsit5(), "projected": jaxdae.Projected(diffrax.Tsit5())}
    row = {}
    for name, solver in solvers.items():
        clipped = diffrax.ClipStepSizeController(
            diffrax.PIDController(rtol=RTOL, atol=ATOL), step_ts=ts
        )
        sol = jaxdae.simulate(
            system,
            formulation,
            0.0,
            t1,
            q0,
            s0,
            ts=ts,
            solver=solver,
            stepsize_controller=clipped,
            throw=False,
        )
        # Rows after a stop are inf: the residuals up to where the solve stopped.
        reached = np.isfinite(np.asarray(sol.ts[1:]))
        residual_v = np.concatenate([np.asarray(sol.dphi[1:]), np.asarray(sol.psi[1:])], axis=1)[
            reached
        ]
        row[name] = {
            "saved_result": _name(sol.result),
            "saved_until": float(sol.t_final),
            "max_phi": float(np.max(np.abs(sol.phi[1:][reached]))),
            "max_dphi": float(np.max(np.abs(residual_v))),
        }
    solves = {
        name: jax.jit(
            lambda q, s, solver=solver: jaxdae.simulate(
                system, formulation, 0.0, t1, q, s, solver=solver, rtol=RTOL, atol=ATOL, throw=False
            )
        )
        for name, solver in solvers.items()
    }
    for name, solve in solves.items():
        sol = solve(q0, s0)
        row[name]["steps"] = int(sol.stats["num_accepted_steps"])
        row[name]["rejected"] = int(sol.stats["num_rejected_steps"])
        row[name]["ok"] = bool(sol.succeeded)
        row[name]["result"] = _name(sol.result)
        row[name]["t_final"] = float(sol.t_final)
    times = best_times(
        {name: (lambda solve=solve: solve(q0, s0).q_final) for name, solve in solves.items()},
        repeats,
    )
    for name in solvers:
        row[name]["time_ms"] = 1e3 * times[name]
    row["time_ratio"] = times["projected"] / times["plain"]

    if not gradient:
        return row

    # Gradient of the final coordinates' sum with respect to one system parameter: the
    # unprojected solve with its default adjoint (`ReverseSweepAdjoint`) and with the
    # projected solve's (`RecursiveCheckpointAdjoint`, which differentiates through the
    # projection's iterations).
    @eqx.filter_jit
    def loss(value, solver, adjoint):
        model = eqx.tree_at(parameter, system, value)
        sol = jaxdae.simulate(
            model,
            formulation,
            0.0,
            t1,
            q0,
            s0,
            solver=solver,
            rtol=RTOL,
            atol=ATOL,
            adjoint=adjoint,
            throw=False,
        )
        return jnp.sum(sol.q_final)

    checkpointed = diffrax.RecursiveCheckpointAdjoint(checkpoints=32)
    variants = {
        "plain": (solvers["plain"], None),
        "plain_checkpointed": (solvers["plain"], checkpointed),
        "projected": (solvers["projected"], None),
    }
    value = parameter(system)
    direction = jnp.ones_like(value)
    grads = {name: jax.jit(jax.grad(lambda x, v=v: loss(x, *v))) for name, v in variants.items()}
    gtimes = best_times(
        {name: (lambda g=g: g(value)) for name, g in grads.items()}, max(3, repeats // 3)
    )
    for name, variant in variants.items():
        h = 1e-6
        fd = (loss(value + h * direction, *variant) - loss(value - h * direction, *variant)) / (
            2 * h
        )
        g = float(jnp.sum(grads[name](value) * direction))
        entry = row.setdefault(name, {})
        entry["grad_ms"] = 1e3 * gtimes[name]
        entry["grad_rel_err_fd"] = abs(g - float(fd)) / max(abs(float(fd)), 1e-300)
    row["grad_time_ratio"] = gtimes["projected"] / gtimes["plain"]
    row["grad_time_ratio_same_adjoint"] = gtimes["projected"] / gtimes["plain_checkpointed"]
    return row


def plot(results, out):
    import matplotlib.pyplot as plt

    labels = [f"{r['mechanism']}\n{r['formulation']}" for r in results]
    y = np.arange(len(results))
    fig, axes = plt.subplots(
        1, 2, figsize=(11, 0.38 * len(results) + 1.5), sharey=True, layout="constrained"
    )
    for ax, key, title in (
        (axes[0], "max_phi", "max |Φ| at step ends"),
        (axes[1], "max_dphi", "max |dΦ/dt|, |Ψ| at step ends"),
    ):
        for offset, name, colour in ((-0.2, "plain", "tab:red"), (0.2, "projected", "tab:blue")):
            values = np.maximum([r[name][key] for r in results], 1e-17)
            ax.barh(
                y + offset,
                values,
                height=0.4,
                color=colour,
                label={"plain": "Tsit5", "projected": "Projected(Tsit5)"}[name],
            )
        ax.axvline(1e-12, color="k", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
    axes[0].set_yticks(y, labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=7, loc="lower right")
    drift = out / "projection_drift.png"
    fig.savefig(drift, dpi=130)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(results) + 1.5), layout="constrained")
    ax.barh(y - 0.2, [r["time_ratio"] for r in results], height=0.4, label="solve")
    ax.barh(
        y + 0.2,
        [r.get("grad_time_ratio", np.nan) for r in results],
        height=0.4,
        label="gradient (one formulation per mechanism)",
    )
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(1.5, color="k", lw=0.8, ls="--")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time projected / time unprojected (Tsit5, rtol 1e-8)")
    ax.legend(fontsize=7)
    cost = out / "projection_cost.png"
    fig.savefig(cost, dpi=130)
    plt.close(fig)
    return [
        figure(drift, "max |Φ| and |dΦ/dt|, |Ψ| at step ends, with and without projection"),
        figure(cost, "cost of the projection: time ratio of the solve and its gradient"),
    ]


def main(out: Path, quick: bool = False, only: list[str] | None = None) -> dict:
    out = output_dir(out, "projection")
    repeats = 5 if quick else 30
    results = []
    # Quick: two formulations per mechanism. The gradient is timed for the second
    # formulation of each mechanism (quick: the pendulum's only).
    cases = [
        (m, f, i == 1 and (not quick or k == 0))
        for k, m in enumerate(mechanisms(quick))
        for i, f in enumerate(list(m[4].items())[: 2 if quick else None])
    ]
    if only:  # the rows whose "mechanism | formulation" contains one of `only`
        cases = [c for c in cases if any(o in f"{c[0][0]} | {c[1][0]}" for o in only)]
    for (name, system, state, t1, _, parameter), (fname, formulation), gradient in progress(
        cases, "projection"
    ):
        row = run_case(system, state, t1, formulation, parameter, repeats, gradient)
        row.update(mechanism=name, formulation=fname, t1=t1)
        results.append(row)
    figures = plot(results, out)
    lines = [
        (
            "| mechanism | formulation | max abs Φ plain / projected | max abs Φ̇,Ψ plain / "
            "projected | steps plain / projected | time ratio | gradient time ratio (same "
            "adjoint) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p, j = r["plain"], r["projected"]
        grad = (
            f"{r['grad_time_ratio']:.2f} ({r['grad_time_ratio_same_adjoint']:.2f})"
            if "grad_time_ratio" in r
            else "—"
        )
        steps = " / ".join(
            str(x["steps"]) + ("" if x["ok"] else f" ({x['result']} at t = {x['t_final']:.3g})")
            for x in (p, j)
        )
        until = (
            ""
            if p["saved_until"] >= r["t1"]
            else f" (to t = {p['saved_until']:.3g}: {p['saved_result']})"
        )
        lines.append(
            f"| {r['mechanism']} | {r['formulation']} | {p['max_phi']:.1e} / {j['max_phi']:.1e}"
            f"{until} | {p['max_dphi']:.1e} / {j['max_dphi']:.1e} | {steps} | "
            f"{r['time_ratio']:.2f} | {grad} |"
        )
    print("\n".join(lines))
    worst = max(max(r["projected"]["max_phi"], r["projected"]["max_dphi"]) for r in results)
    headline = (
        f"Projected(Tsit5): max |Φ|, |Φ̇, Ψ| ≤ {worst:.1e} at every step end of "
        f"{len(results)} mechanism × formulation solves; solve time ratio "
        f"{min(r['time_ratio'] for r in results):.2f}–"
        f"{max(r['time_ratio'] for r in results):.2f}"
    )
    print(headline)
    write_json(
        out / "projection.json", {"rtol": RTOL, "atol": ATOL, "quick": quick, "results": results}
    )
    return {"headline": headline, "table": lines, "figures": figures}


if __name__ == "__main__":
    args = parse_args("projection", __doc__, only=True)
    main(args.out, args.quick, args.only.split(",") if args.only else None)
