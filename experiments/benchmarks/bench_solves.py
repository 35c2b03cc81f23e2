"""Run time of whole solves for the formulations the core benchmark does not cover.

`bench_core.py` times Mukharlyamov and Deressa's (2015) two-link arm under `ModifiedLagrange`. This
script times one trajectory and a `jax.vmap` batch of 64 for:

- the Cartesian pendulum under `Baumgarte(10, 25)` over 10 s (its failure check, the
  extreme eigenvalues of `J M⁻¹ Jᵀ`, runs at every step);
- Krasinskaya and Krasinskiy's (2013) Ball & Beam, LQR closed loop on the exact model in redundant
  coordinates (`RedundantCoordinates`, Shulgin's equations) over 20 s, rtol 1e-6;
- Mukharlyamov's (2019) adaptive-optics element under `ConstraintEnforcingControl` (poles at −10)
  over 3 s, rtol 1e-8;
- Shemelova's (2016) Cartesian arm in Hamiltonian form (`HamiltonianForm` of the Lagrangian model:
  the Legendre transform at every stage) under the paper's perturbation gains over 6 s;
- the Cartesian pendulum with its constraint written twice (a rank-1 `J M⁻¹ Jᵀ`) under
  `PseudoInverse(10, 25)` over 10 s (Mukharlyamov and Deressa (2015) eqs. [6]–[8]: `A⁺` at every
  stage).

Medians of interleaved repetitions, float64, after compilation.

A second table times the gradient of the adaptive-optics element's saved residuals and
final actuator state w.r.t. the pole rate and `w0` (t ∈ [0, 0.5], saves at 4 times) with
diffrax's `RecursiveCheckpointAdjoint` and with `jaxdae.ReverseSweepAdjoint` (the default):
compile time (one cold compile each) and run time.

With `--out OUT` both tables also go to `OUT/bench_solves/tables.json` (as
`bench_solves.solves` and `bench_solves.gradient`, the tables of docs/benchmarks.md).

    python experiments/benchmarks/bench_solves.py [--repeats 15] [--out output]
"""

import argparse
import sys
import time
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _common  # noqa: E402, F401  (the examples' folder on sys.path: ball_and_beam)
from _tables import run_stamp, table, write  # noqa: E402

import jaxdae  # noqa: E402
from jaxdae.examples import AdaptiveOpticsElement, CartesianPendulum  # noqa: E402

BATCH = 64


def pendulum():
    system = CartesianPendulum()

    def run(angle):
        q0, v0 = system.state_from_angle(angle, 0.0)
        return jaxdae.simulate(system, jaxdae.Baumgarte(10.0, 25.0), 0.0, 10.0, q0, v0).q_final

    return run, jnp.asarray(0.5), jnp.linspace(0.2, 1.2, BATCH)


def ball_and_beam():
    import ball_and_beam

    design = ball_and_beam.design()
    exact, equilibrium = design["exact"], design["eq_e"]

    def run(start):
        q0, v0 = exact.state(start[0], start[1], current=equilibrium.v[3])
        return jaxdae.simulate(
            design["closed"],
            design["shulgin"],
            0.0,
            20.0,
            q0,
            v0,
            rtol=1e-6,
            atol=1e-8,
            max_steps=20_000,
            throw=False,
        ).q_final

    starts = jnp.stack([jnp.linspace(0.2, 0.8, BATCH), jnp.linspace(-0.2, 0.2, BATCH)], axis=1)
    return run, jnp.array([0.3, 0.1]), starts


def adaptive_optics():
    system = AdaptiveOpticsElement()
    control = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)

    def run(angle_error):
        q0, v0, w0 = system.initial_state(angle_error=angle_error)
        return jaxdae.simulate_actuated(system, control, 0.0, 3.0, q0, v0, w0).q_final

    return run, jnp.asarray(0.05), jnp.linspace(-0.05, 0.05, BATCH)


def cartesian_arm():
    from jaxdae.examples import CartesianArm, CartesianArmLagrangian

    masses, forces = (1.0, 2.0), (0.0, -1.0, 0.5, -2.0)  # as experiments/examples/cartesian_arm_…
    arm = CartesianArm(masses=masses, forces=forces)
    lagrangian = CartesianArmLagrangian(masses=masses, forces=forces)
    system = jaxdae.HamiltonianForm(lagrangian)
    formulation = CartesianArm.paper_formulation(-200.0, -30.0, -200.0, -30.0)
    q0, p0 = arm.initial_state()
    v0 = arm.velocities(0.0, q0, p0)

    # The formulation crosses a jit boundary (as in
    # experiments/examples/cartesian_arm_hamiltonian.py).
    solve = eqx.filter_jit(
        lambda system, formulation, q, p: (
            jaxdae.simulate(system, formulation, 0.0, 6.0, q, p).q_final
        )
    )

    def run(scale):  # scale the first point's position: off the constraints
        q = q0 * jnp.array([scale, scale, 1.0, 1.0])
        return solve(system, formulation, q, lagrangian.momenta(0.0, q, v0))

    return run, jnp.asarray(1.02), jnp.linspace(0.98, 1.05, BATCH)


class _TwicePendulum(CartesianPendulum):
    """The pendulum's length constraint written twice: redundant constraints."""

    def constraints(self, t, q):
        phi = super().constraints(t, q)
        return jnp.concatenate([phi, phi])


def redundant_pendulum():
    system = _TwicePendulum()

    def run(angle):
        q0, v0 = system.state_from_angle(angle, 0.0)
        return jaxdae.simulate(system, jaxdae.PseudoInverse(10.0, 25.0), 0.0, 10.0, q0, v0).q_final

    return run, jnp.asarray(0.5), jnp.linspace(0.2, 1.2, BATCH)


# The rows as docs/benchmarks.md names them.
PAGE_LABELS = {
    "pendulum, Baumgarte, 10 s": (
        "Cartesian pendulum, `Baumgarte(10, 25)`, 10 s (the failure check at every step)"
    ),
    "Ball & Beam, RedundantCoordinates + LQR, 20 s": (
        "Ball & Beam, `RedundantCoordinates` + LQR, 20 s, `rtol=1e-6`"
    ),
    "adaptive optics, ConstraintEnforcingControl, 3 s": (
        "adaptive optics, `ConstraintEnforcingControl` (poles at −10), 3 s"
    ),
    "Cartesian arm, HamiltonianForm + CoupledPerturbation, 6 s": (
        "Cartesian arm, `HamiltonianForm` + `CoupledPerturbation`, the paper's gains, 6 s"
    ),
    "pendulum, constraint twice, PseudoInverse, 10 s": (
        "Cartesian pendulum, constraint written twice, `PseudoInverse(10, 25)`, 10 s"
    ),
    "RecursiveCheckpointAdjoint(checkpoints=32)": "`RecursiveCheckpointAdjoint(checkpoints=32)`",
    "ReverseSweepAdjoint (the default)": "`ReverseSweepAdjoint()` (the default)",
}

CASES = {
    "pendulum, Baumgarte, 10 s": pendulum,
    "Ball & Beam, RedundantCoordinates + LQR, 20 s": ball_and_beam,
    "adaptive optics, ConstraintEnforcingControl, 3 s": adaptive_optics,
    "Cartesian arm, HamiltonianForm + CoupledPerturbation, 6 s": cartesian_arm,
    "pendulum, constraint twice, PseudoInverse, 10 s": redundant_pendulum,
}


def solves_table(medians_ms: dict, stamp: dict) -> dict:
    """`bench_solves.solves`: per case, the medians of one trajectory and of the batch [ms]."""
    rows = [
        [PAGE_LABELS[name], f"{one:.2f}", f"{batch:.1f}"]
        for name, (one, batch) in medians_ms.items()
    ]
    columns = [
        ("system, formulation, time span", "left"),
        ("one trajectory [ms]", "right"),
        (f"batch of {BATCH} [ms]", "right"),
    ]
    return table("bench_solves.solves", columns, rows, stamp)


def gradient_table(results: dict, stamp: dict) -> dict:
    """`bench_solves.gradient`: per adjoint, `(compile [s], run [ms], max rel. difference)`."""
    rows = [
        [
            PAGE_LABELS[name],
            f"{compile_s:.1f}",
            f"{run_ms:.2f}",
            "0" if difference == 0 else f"{difference:.1e}",
        ]
        for name, (compile_s, run_ms, difference) in results.items()
    ]
    columns = [
        ("adjoint", "left"),
        ("compile [s]", "right"),
        ("run [ms]", "right"),
        ("max rel. difference", "right"),
    ]
    return table("bench_solves.gradient", columns, rows, stamp)


def main(repeats: int = 15, out: Path | None = None):
    stamp = run_stamp()
    rows = {}
    for name, make in CASES.items():
        run, one, batch = make()
        single, batched = eqx.filter_jit(run), eqx.filter_jit(jax.vmap(run))
        jax.block_until_ready((single(one), batched(batch)))
        rows[name] = (single, one, batched, batch)
    times = {(name, kind): [] for name in rows for kind in ("one", "batch")}
    for _ in range(repeats):
        for name, (single, one, batched, batch) in rows.items():
            for kind, fn, arg in (("one", single, one), ("batch", batched, batch)):
                start = time.perf_counter()
                jax.block_until_ready(fn(arg))
                times[(name, kind)].append(time.perf_counter() - start)
    print(f"device: {jax.devices()[0].platform}, {repeats} interleaved repetitions\n")
    print(f"| system | one trajectory [ms] | batch of {BATCH} [ms] |")
    print("| --- | ---: | ---: |")
    medians_ms = {}
    for name in rows:
        one, batch = (1e3 * float(np.median(times[(name, k)])) for k in ("one", "batch"))
        medians_ms[name] = (one, batch)
        print(f"| {name} | {one:.2f} | {batch:.1f} |")
    gradients = actuated_gradients(repeats)
    if out is not None:
        write(
            out,
            "bench_solves",
            [solves_table(medians_ms, stamp), gradient_table(gradients, stamp)],
        )


def actuated_gradients(repeats: int) -> dict:
    """Prints the gradient table; per adjoint `(compile [s], run [ms], max rel. difference)`."""
    system = AdaptiveOpticsElement()
    q0, v0, w0 = system.initial_state(angle_error=0.05)

    def loss(rate, w0, adjoint):
        control = jaxdae.ConstraintEnforcingControl.with_poles(rate, order=4)
        sol = jaxdae.simulate_actuated(
            system,
            control,
            0.0,
            0.5,
            q0,
            v0,
            w0,
            ts=jnp.linspace(0.0, 0.5, 4),
            adjoint=adjoint,
            max_steps=1024,
        )
        return jnp.sum(sol.residuals[:, 0, 0] ** 2) + jnp.sum(sol.w_final**2)

    adjoints = {
        "RecursiveCheckpointAdjoint(checkpoints=32)": diffrax.RecursiveCheckpointAdjoint(
            checkpoints=32
        ),
        "ReverseSweepAdjoint (the default)": jaxdae.ReverseSweepAdjoint(),
    }
    compiled, compile_s, grads = {}, {}, {}
    for name, adjoint in adjoints.items():
        jax.clear_caches()
        start = time.perf_counter()
        compiled[name] = (
            jax.jit(jax.value_and_grad(lambda r, w, a=adjoint: loss(r, w, a), argnums=(0, 1)))
            .lower(10.0, w0)
            .compile()
        )
        compile_s[name] = time.perf_counter() - start
        grads[name] = jax.block_until_ready(compiled[name](10.0, w0))
    times = {name: [] for name in adjoints}
    for _ in range(repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(10.0, w0))
            times[name].append(time.perf_counter() - start)
    reference = jax.tree.leaves(grads[next(iter(adjoints))][1])
    print(
        "\n| adaptive optics, gradient w.r.t. (rate, w0) | compile [s] | run [ms] | "
        "max rel. difference |\n| --- | ---: | ---: | ---: |"
    )
    results = {}
    for name in adjoints:
        difference = max(
            float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
            for a, b in zip(jax.tree.leaves(grads[name][1]), reference, strict=False)
        )
        print(
            f"| {name} | {compile_s[name]:.1f} | {1e3 * np.median(times[name]):.3f} | "
            f"{difference:.1e} |"
        )
        results[name] = (compile_s[name], 1e3 * float(np.median(times[name])), difference)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the tables to OUT/bench_solves/"
    )
    options = parser.parse_args()
    main(options.repeats, options.out)
