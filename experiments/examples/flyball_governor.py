"""The stiff flyball governor (IFToMM multibody benchmark A05) with `jaxdae.multibody`.

A vertical shaft (1 m × 0.01 m × 0.01 m, density 3000 kg/m³) turns about z on the ground,
starting at 2π rad/s; a slider block (0.1 m cube, same density) slides along it, starting at
s = 0.5 m. Two rods like the shaft hang from hinges at the shaft's top, 0.05 m either side
of it, at 30° below the horizontal, each carrying a 5 kg point mass at its end. The
coupler rods of Watt's governor are replaced by two spring-dampers (K = 8e5 N/m,
C = 4e4 N·s/m, rest length 0.5 m) from the slider, 0.05 m off its centre, to the rods'
midpoints: a stiff system. Gravity 9.81 m/s² along −z. The output is the slider's position
s(t), the quantity the benchmark reports. The set-up follows the benchmark's specification as
the OpenSim benchmark implementation (MBS benchmarks in OpenSim, University of Padua) builds
it; each rod and its point mass are one rigid body here.

The solve uses diffrax's implicit Kvaerno5 (the spring-damper's time constant m/C is
0.1 ms) over 10 s, the horizon of the OpenSim implementation's A05 run (`--quick`: 0.5 s).
With `exudyn` installed, the same governor is solved by Exudyn's generalized-α integrator at
two fixed step sizes (their difference measures Exudyn's own discretization error) and the
s(t) are plotted together.

    python experiments/examples/flyball_governor.py [--out output] [--quick]
    # writes OUT/flyball_governor/flyball_governor.png and flyball_governor.json
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae.examples._flyball_governor import (
    governor,
    initial_state,
)


def exudyn_s(model, t1, steps):
    """s(t) from Exudyn (`None` where exudyn is not installed)."""
    try:
        import exudyn as exu
        from exudyn.utilities import SensorBody
    except ImportError:
        return None
    q0, v0 = initial_state(model)
    from _common import exudyn_governor_system, exudyn_solve

    container, mbs, numbers = exudyn_governor_system(exu, model, q0, v0)
    sensor = mbs.AddSensor(
        SensorBody(
            bodyNumber=numbers["slider"],
            storeInternal=True,
            outputVariableType=exu.OutputVariableType.Position,
        )
    )
    data, elapsed = exudyn_solve(exu, mbs, sensor, t1, steps)
    return data[:, 0], data[:, 3], elapsed


def main():
    import matplotlib.pyplot as plt
    from _common import log_values, output_dir, parse_args, write_json

    args = parse_args("flyball_governor", __doc__.splitlines()[0])
    out = output_dir(args.out, "flyball_governor")
    t1, num = (0.5, 51) if args.quick else (10.0, 1001)
    model = governor()
    q0, v0 = initial_state(model)
    ts = jnp.linspace(0.0, t1, num)

    def solve():
        sol = jaxdae.simulate(
            model,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            t1,
            q0,
            v0,
            ts=ts,
            solver=diffrax.Kvaerno5(),
            rtol=1e-8,
            atol=1e-8,
            max_steps=1_000_000,
        )
        return jax.block_until_ready(sol)

    start = time.perf_counter()
    sol = solve()
    first = time.perf_counter() - start
    start = time.perf_counter()
    sol = solve()
    elapsed = time.perf_counter() - start
    s = np.asarray(model.joint_coordinates(sol.q)["slide"])
    # Exudyn at two step sizes: their difference bounds Exudyn's own error
    dts = (1e-3, 5e-4)
    references = [exudyn_s(model, t1, int(round(t1 / dt))) for dt in dts]
    result = {
        "mobility": model.mobility(q0)._asdict(),
        "t1": t1,
        "s_final": float(s[-1]),
        "s_min": float(s.min()),
        "s_max": float(s.max()),
        "max_abs_phi": float(np.abs(sol.phi).max()),
        "steps": int(sol.stats["num_steps"]),
        "accepted_steps": int(sol.stats["num_accepted_steps"]),
        "seconds_first_call_with_compile": first,
        "seconds": elapsed,
    }
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4), layout="constrained")
    ax1.plot(sol.ts, s, label="jaxdae (Kvaerno5)")
    if references[0] is not None:
        (ts_c, s_c, sec_c), (ts_f, s_f, sec_f) = references
        ax1.plot(ts_f, s_f, "k--", lw=0.8, label=f"Exudyn (generalized-α, h = {dts[1]:g} s)")
        on_grid = np.asarray(sol.ts)
        fine = np.interp(on_grid, ts_f, s_f)
        coarse = np.interp(on_grid, ts_c, s_c)
        ax2.semilogy(on_grid, log_values(fine - s, 1e-10), label="|jaxdae − Exudyn (fine)|")
        ax2.semilogy(
            on_grid,
            log_values(fine - coarse, 1e-10),
            lw=0.8,
            label="|Exudyn (fine) − Exudyn (coarse)|",
        )
        ax2.set(xlabel="t [s]", ylabel="|Δs| [m]", title="differences in s")
        ax2.legend(fontsize=8)
        result.update(
            {
                "exudyn_steps": [int(round(t1 / dt)) for dt in dts],
                "exudyn_max_s_difference": float(np.abs(fine - s).max()),
                "exudyn_final_s_difference": float(abs(fine[-1] - s[-1])),
                "exudyn_self_max_s_difference": float(np.abs(fine - coarse).max()),
                "exudyn_seconds": [sec_c, sec_f],
            }
        )
    ax1.set(xlabel="t [s]", ylabel="s [m]", title="flyball governor: slider position")
    ax1.legend(fontsize=8)
    ax3.semilogy(sol.ts, log_values(np.abs(np.asarray(sol.phi)).max(axis=1), 1e-14))
    ax3.set(xlabel="t [s]", ylabel="max |Φ|", title="constraint violation")
    fig.savefig(out / "flyball_governor.png", dpi=120)
    write_json(out / "flyball_governor.json", result)
    for key, value in result.items():
        print(f"{key}: {value}")
    print(f"wrote {out / 'flyball_governor.png'}")


if __name__ == "__main__":
    main()
