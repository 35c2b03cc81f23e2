"""Mukharlyamov (2019), §5: constraint-enforcing control of an adaptive-optics element through a DC
motor.

A mirror on a crank, turned by a DC motor (armature voltage `u`), must reflect a ray from a
moving source `P = (s(t), 0)` onto a fixed point `C = (c, 0)`: the program constraint
`f = l (s + c) − 2 c s cos φ = 0` (eq. [5.1]). The voltage reaches `f` through the motor's
torque dynamics, so it first appears in `f⁽⁴⁾` (relative degree 4). The paper gives no
numbers; `jaxdae.examples.AdaptiveOpticsElement` documents the ones used here.

1. Adaptive integration (Tsit5, rtol 1e-10): `jaxdae.ConstraintEnforcingControl` with all four
   poles at −10 (eqs. [3.4]–[3.5], [5.8]) against the unstabilized law of eq. [2.9] (all
   gains zero, the constraint only a first integral), from the programmed motion and from
   an error in the crank angle.
2. Fixed steps (Mukharlyamov (2019) §4): explicit Euler and Heun with step `τ`, poles at −10 and
   −40. The perturbations are asymptotically stable in continuous time for every `τ`; the
   discrete ones are bounded only if the spectral radius of the method's transition
   `R(τH)` is below 1 (`jaxdae.transition_matrix`). The table lists `ρ(R(τH))`, `‖R(τH)‖₂`
   and the measured residual. The paper's sufficient condition `‖R‖ ≤ ϑ < 1` depends on the
   norm: in the Euclidean norm of `y = (f, ḟ, f̈, f⃛)`, whose entries scale with powers of
   the poles, it never holds here, while the spectral radius (the same in every norm) is
   the necessary condition the table tests.
3. Tuning (the paper's `h_β`, here `K_0 … K_3`, through their four poles) for explicit
   Euler at τ = 20 ms with `jaxdae.tune` and the discrete-stability penalty, against the
   single-rate family `(μ + γ)⁴` on a grid of the same budget.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import (
    figure,
    interactive,
    legend_below,
    log_values,
    loop_done,
    output_dir,
    parse_args,
    progress,
    write_json,
)

import jaxdae
from jaxdae.examples import AdaptiveOpticsElement

NAME = "adaptive_optics"
RATE = 10.0  # poles of the adaptive study
ANGLE_ERROR = 0.05  # rad, initial error of the crank angle
SMALL_ERROR = 1e-4  # rad, for the unstabilized law


@eqx.filter_jit
def _adaptive(system, control, q0, v0, w0, ts):
    return jaxdae.simulate_actuated(
        system, control, ts[0], ts[-1], q0, v0, w0, ts=ts, rtol=1e-10, atol=1e-12, throw=False
    )


def _result_name(result) -> str:
    for name in (
        "successful",
        "singular_decoupling_matrix",
        "max_steps_reached",
        "non_finite_state",
    ):
        if result == getattr(jaxdae.RESULTS, name):
            return name
    return str(result)


def _adaptive_study(system, t1, n_save):
    ts = jnp.linspace(0.0, t1, n_save)
    on_program = system.programmed_state(0.0)
    q_err = on_program[0] + ANGLE_ERROR
    q_small = on_program[0] + SMALL_ERROR
    stabilized = jaxdae.ConstraintEnforcingControl.with_poles(RATE, order=4)
    unstabilized = jaxdae.ConstraintEnforcingControl([0.0] * 4)
    runs = [
        ("poles at −10", "programmed", stabilized, on_program[0]),
        ("poles at −10", f"φ₀ error {ANGLE_ERROR:g}", stabilized, q_err),
        ("unstabilized [2.9]", "programmed", unstabilized, on_program[0]),
        ("unstabilized [2.9]", f"φ₀ error {SMALL_ERROR:g}", unstabilized, q_small),
    ]
    phi_program = np.asarray(jax.vmap(system.programmed_angle)(ts))
    rows = []
    for law, start, control, q0 in progress(runs, "adaptive runs", unit="run"):
        sol = _adaptive(system, control, q0, on_program[1], on_program[2], ts)
        f = np.asarray(sol.residuals[:, 0, 0])
        late = (np.asarray(ts) >= t1 / 2) & np.isfinite(f)
        rows.append(
            dict(
                law=law,
                start=start,
                result=_result_name(sol.result),
                succeeded=bool(sol.succeeded),
                t_final=float(sol.t_final),
                max_abs_f_late=float(np.max(np.abs(f[late]))),
                abs_f_final=float(abs(f[np.isfinite(f)][-1])),
                max_abs_angle_error_late=float(
                    np.max(np.abs(np.asarray(sol.q[late, 0]) - phi_program[late]))
                ),
                max_abs_voltage=float(np.max(np.abs(np.asarray(sol.u)[np.isfinite(f)]))),
                steps=int(sol.stats["num_steps"]),
                _ts=np.asarray(ts),
                _f=f,
                _phi_error=np.asarray(sol.q[:, 0]) - phi_program,
                _u=np.asarray(sol.u[:, 0]),
                _torque=np.asarray(sol.w[:, 0]),
            )
        )
    return rows


def _fixed_step_study(system, rates, steps, t1):
    """max |f| on [t1/2, t1] for every (solver, rate, τ), with ρ(R(τH)) and ‖R(τH)‖₂."""
    q0, v0, w0 = system.programmed_state(0.0)
    q0 = q0 + 0.02
    ts = jnp.linspace(t1 / 2, t1, 31)
    rows = []
    for solver in progress((diffrax.Euler(), diffrax.Heun()), "fixed-step sweeps", unit="solver"):

        @jax.jit
        @jax.vmap
        def run(rate, dt, solver=solver):
            control = jaxdae.ConstraintEnforcingControl.with_poles(rate, order=4)
            sol = jaxdae.simulate_actuated(
                system,
                control,
                0.0,
                t1,
                q0,
                v0,
                w0,
                ts=ts,
                solver=solver,
                stepsize_controller=diffrax.ConstantStepSize(),
                dt0=dt,
                max_steps=int(np.ceil(t1 / min(steps))) + 8,
                throw=False,
            )
            transition = jaxdae.transition_matrix(
                jaxdae.perturbation_matrix(control, 1), solver, dt
            )
            residual = jnp.max(jnp.abs(sol.residuals[:, 0, 0]))
            return (
                sol.result._value,
                residual,
                jaxdae.spectral_radius(transition),
                jnp.linalg.norm(transition, 2),
            )

        grid = [(r, tau) for r in rates for tau in steps]
        codes, residuals, radii, norms = run(
            jnp.array([g[0] for g in grid]), jnp.array([g[1] for g in grid])
        )
        for (rate, tau), code, res, rho, norm in zip(
            grid, codes, residuals, radii, norms, strict=False
        ):
            ok = int(code) == int(jaxdae.RESULTS.successful._value)
            rows.append(
                dict(
                    solver=type(solver).__name__,
                    rate=rate,
                    tau=tau,
                    spectral_radius=float(rho),
                    norm=float(norm),
                    bounded=ok,
                    max_abs_f_late=float(res) if ok else float("inf"),
                )
            )
    return rows


TUNE_STEP = 0.02  # s, explicit Euler
TUNE_T1 = 3.0


def _fixed_step_run(system, control, angle_error):
    """The Euler closed loop from the programmed state with an angle error (for tuning)."""
    q0, v0, w0 = system.programmed_state(0.0)
    return jaxdae.simulate_actuated(
        system,
        control,
        0.0,
        TUNE_T1,
        q0 + angle_error,
        v0,
        w0,
        ts=jnp.linspace(0.0, TUNE_T1, 61),
        solver=diffrax.Euler(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=TUNE_STEP,
        max_steps=int(TUNE_T1 / TUNE_STEP) + 8,
        throw=False,
    )


def _violation(sol):
    """`∫ f² dt` over the run (the constraint-violation loss), in mrad²·s-like units."""
    return 1e4 * TUNE_T1 * jnp.mean(sol.residuals[:, 0, 0] ** 2)


def _tuning_study(system, quick):
    """Tunes the gains `K_0 … K_3` (the paper's `h_β`) for explicit Euler at τ = 20 ms with
    `jaxdae.tune`, through their four poles (`ConstraintEnforcingControl.from_poles`), keeping
    `ρ(I + τH) ≤ 0.95` with `jaxdae.DiscreteStability`, against the single-rate family
    `(μ + γ)⁴` of Mukharlyamov (2019) searched on a grid of the same budget."""
    import optax

    steps = 10 if quick else 40
    train = jnp.linspace(-0.05, 0.05, 8)
    held_out = jax.random.uniform(jax.random.key(1), (32,), minval=-0.06, maxval=0.06)

    # Tuned: the four poles −γ_i, through log γ_i (stable by construction).
    def control_of(rates):
        return jaxdae.ConstraintEnforcingControl.from_poles(-rates)

    start_rates = jnp.array([7.0, 9.0, 11.0, 13.0])
    params = jaxdae.Positive(start_rates, log_scale=True)
    stability = jaxdae.DiscreteStability(
        diffrax.Euler(), dt=TUNE_STEP, num_constraints=1, select=control_of
    )
    start = time.perf_counter()
    result = jaxdae.tune(
        params,
        lambda rates, e: _fixed_step_run(system, control_of(rates), e),
        train,
        _violation,
        optimizer=optax.adam(0.1),
        steps=steps,
        regularization=stability,
        failures=jaxdae.Failures(penalty=1e3),
        reporting=jaxdae.Reporting(progress=interactive()),
    )
    tune_seconds = time.perf_counter() - start
    loop_done("jaxdae.tune", steps, "step", tune_seconds)

    @jax.jit
    def batch_loss(control, errors):
        sols = jax.vmap(lambda e: _fixed_step_run(system, control, e))(errors)
        losses = jax.vmap(_violation)(sols)
        return jnp.mean(jnp.where(sols.succeeded, losses, jnp.inf))

    def with_rate(rate):
        return jaxdae.ConstraintEnforcingControl.with_poles(rate, order=4)

    start = time.perf_counter()
    rates = np.geomspace(3.0, 60.0, steps)
    grid = [
        float(batch_loss(with_rate(r), train))
        for r in progress(rates, "single-rate grid", unit="rate")
    ]
    best_rate = float(rates[int(np.argmin(grid))])
    grid_seconds = time.perf_counter() - start

    def summary(name, control):
        h = jaxdae.perturbation_matrix(control, 1)
        rho = jaxdae.spectral_radius(jaxdae.transition_matrix(h, diffrax.Euler(), TUNE_STEP))
        return dict(
            law=name,
            gains=[float(k) for k in control.gains],
            held_out_loss=float(batch_loss(control, held_out)),
            spectral_radius=float(rho),
            poles=[complex(z) for z in np.linalg.eigvals(np.asarray(h))],
        )

    tuned_rates = ", ".join(f"{float(r):.3g}" for r in result.model)
    rows = [
        summary(f"poles at −{RATE:g} (Mukharlyamov's (2019) (μ + γ)⁴)", with_rate(RATE)),
        summary("start of the tuning: poles −7, −9, −11, −13", control_of(start_rates)),
        summary(f"best (μ + γ)⁴ on the grid, γ = {best_rate:.3g}", with_rate(best_rate)),
        summary(f"tuned poles (jaxdae.tune): −({tuned_rates})", control_of(result.model)),
    ]
    return dict(
        rows=rows,
        history=result.history["loss"],
        tune_seconds=tune_seconds,
        grid_seconds=grid_seconds,
        steps=steps,
    )


def main(out: Path, quick: bool = False) -> dict:
    import matplotlib.pyplot as plt

    folder = output_dir(out, NAME)
    system = AdaptiveOpticsElement()
    t1 = 4.0 if quick else 8.0
    steps = (
        [0.01, 0.03, 0.06, 0.1]
        if quick
        else [0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25]
    )
    start = time.perf_counter()
    adaptive = _adaptive_study(system, t1, 201 if quick else 801)
    fixed = _fixed_step_study(system, [10.0, 40.0], steps, 6.0)
    tuning = _tuning_study(system, quick)
    elapsed = time.perf_counter() - start

    fig, axes = plt.subplots(2, 2, figsize=(14, 9), layout="constrained")
    for r in adaptive:
        label = f"{r['law']}, {r['start']}"
        axes[0, 0].semilogy(r["_ts"], log_values(r["_f"], 1e-18), label=label)
        axes[0, 1].semilogy(r["_ts"], log_values(r["_phi_error"], 1e-16), label=label)
        axes[1, 0].plot(r["_ts"], r["_u"], label=label)
    axes[0, 0].set_title("Reflection-law residual |f(t)| (eq. [5.1])")
    axes[0, 0].set_ylabel("|f| [m²]")
    axes[0, 1].set_title("Crank angle error |φ(t) − φ*(t)| (φ*: the programmed motion)")
    axes[0, 1].set_ylabel("|φ − φ*| [rad]")
    axes[1, 0].set_yscale("symlog", linthresh=1.0)
    axes[1, 0].set_title("Armature voltage u(t)")
    axes[1, 0].set_ylabel("u [V] (symmetric log scale)")
    for ax in axes.flat[:3]:
        ax.set_xlabel("t [s]")
    fig.legend(
        *axes[0, 0].get_legend_handles_labels(),
        loc="outside upper center",
        ncol=4,
        fontsize=9,
        title="Tsit5 (adaptive): law, initial crank angle",
    )
    overflow = 1e3
    for solver, style in (("Euler", "o-"), ("Heun", "s--")):
        for rate in (10.0, 40.0):
            rows = [r for r in fixed if r["solver"] == solver and r["rate"] == rate]
            taus = [r["tau"] for r in rows]
            axes[1, 1].loglog(
                taus,
                [min(r["max_abs_f_late"], overflow) for r in rows],
                style,
                label=f"{solver}, poles at −{rate:g}",
            )
    axes[1, 1].axhline(overflow, color="grey", lw=0.5)
    axes[1, 1].set_ylim(top=overflow * 10)
    axes[1, 1].set_title(f"Fixed steps: max |f| on [3, 6] s (drawn at {overflow:g}: overflowed)")
    axes[1, 1].set_xlabel("step τ [s]")
    axes[1, 1].set_ylabel("max |f| on [3, 6] s [m²]")
    legend_below(axes[1, 1])
    fig.savefig(folder / "adaptive_optics.png", dpi=120)
    plt.close(fig)

    write_json(
        folder / "results.json",
        dict(
            seconds=elapsed,
            t1=t1,
            rate=RATE,
            adaptive=[{k: v for k, v in r.items() if not k.startswith("_")} for r in adaptive],
            fixed_step=fixed,
            tuning=tuning,
        ),
    )
    table = [
        "| law | start | max\\|f\\| on second half | max\\|φ − φ*\\| on second half | "
        "max\\|u\\| [V] | steps | result |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ] + [
        f"| {r['law']} | {r['start']} | {r['max_abs_f_late']:.1e} | "
        f"{r['max_abs_angle_error_late']:.1e} | {r['max_abs_voltage']:.3g} | {r['steps']} | "
        f"{'ok' if r['succeeded'] else r['result'] + ' at t = {:.3g}'.format(r['t_final'])} |"
        for r in adaptive
    ]
    table += [
        "",
        "| solver | poles | τ [s] | ρ(R(τH)) | ‖R(τH)‖₂ | max\\|f\\| on [3, 6] s |",
        "| --- | --- | --- | --- | --- | --- |",
    ] + [
        f"| {r['solver']} | −{r['rate']:g} | {r['tau']:g} | {r['spectral_radius']:.3f} | "
        f"{r['norm']:.3g} | {r['max_abs_f_late']:.1e} |"
        for r in fixed
    ]

    table += [
        "",
        f"Tuning for explicit Euler, τ = {TUNE_STEP:g} s, loss ∫f² dt (×1e4) over 0–{TUNE_T1:g} s, "
        f"8 training / 32 held-out angle errors, {tuning['steps']} loss evaluations each "
        f"(tune {tuning['tune_seconds']:.0f} s, grid {tuning['grid_seconds']:.0f} s, "
        "compilation included):",
        "",
        "| gains | K_0, K_1, K_2, K_3 | held-out loss | ρ(I + τH) |",
        "| --- | --- | --- | --- |",
    ] + [
        f"| {r['law']} | {', '.join(f'{k:.4g}' for k in r['gains'])} | "
        f"{r['held_out_loss']:.3g} | {r['spectral_radius']:.3f} |"
        for r in tuning["rows"]
    ]

    def largest_bounded(solver, rate):
        ok = [
            r["tau"] for r in fixed if r["solver"] == solver and r["rate"] == rate and r["bounded"]
        ]
        return max(ok) if ok else float("nan")

    def largest_stable(solver, rate):
        ok = [
            r["tau"]
            for r in fixed
            if r["solver"] == solver and r["rate"] == rate and r["spectral_radius"] < 1
        ]
        return max(ok) if ok else float("nan")

    stab, unstab = adaptive[1], adaptive[3]
    headline = (
        f"With all four poles at −{RATE:g}, an initial angle error of {ANGLE_ERROR:g} rad "
        f"decays to max|f| = {stab['max_abs_f_late']:.1e} on the second half; the unstabilized "
        f"law of eq. [2.9] lets a {SMALL_ERROR:g} rad error grow until the solve stops "
        f"({unstab['result']} at t = {unstab['t_final']:.3g} s). With fixed steps the "
        f"residual stays bounded only where ρ(R(τH)) < 1: explicit Euler, poles at −40: "
        f"largest bounded τ {largest_bounded('Euler', 40.0):g} s (ρ < 1 up to "
        f"{largest_stable('Euler', 40.0):g} s in the grid); ρ < 1 is necessary, not "
        f"sufficient. Gains tuned for Euler at τ = {TUNE_STEP:g} s reach a held-out loss of "
        f"{tuning['rows'][3]['held_out_loss']:.3g} "
        f"against {tuning['rows'][2]['held_out_loss']:.3g} for the best single-rate "
        f"(μ + γ)⁴ and {tuning['rows'][0]['held_out_loss']:.3g} for poles at −{RATE:g}: both "
        f"optima lie near the deadbeat poles −1/τ = −{1 / TUNE_STEP:g}, where I + τH is "
        "nilpotent (table)."
    )
    print(headline)
    print("\n".join(table))
    print(f"({elapsed:.0f} s)")
    return {
        "headline": headline,
        "table": table,
        "figures": [
            figure(
                folder / "adaptive_optics.png",
                "the mirror's reflection-law residual, crank-angle error and armature voltage "
                "under the stabilized and the unstabilized control law; the residual with fixed "
                "steps against the step τ, bounded only where ρ(R(τH)) < 1",
            )
        ],
    }


if __name__ == "__main__":
    args = parse_args(NAME, __doc__)
    main(args.out, args.quick)
