"""Work and precision of every formulation × integrator on four mechanisms.

Error against CPU time (log-log) for the formulations `Unstabilized` (for comparison),
`Baumgarte`, `PseudoInverse`, `ModifiedLagrange`, `CoupledPerturbation` and
`RedundantCoordinates` (where the mechanism has coordinates it can solve for), each
integrated by `diffrax.Tsit5`, `diffrax.Dopri8`, `diffrax.Kvaerno5` (which
`jaxdae.simulate` configures with its tolerances, `jaxdae.configure_implicit`) and
`jaxdae.Projected(diffrax.Tsit5())`, plus `jaxdae.GeneralizedAlpha` (which integrates the
index-3 equations itself: one run per mechanism, the formulation only gives the saved
multipliers), over a range of tolerances (`atol = 1e-3 rtol`).

Mechanisms, each against a reference computed without jaxdae's formulations or diffrax:

- **two-link arm through its fold**: Mukharlyamov and Deressa's (2015) arm
  (`jaxdae.examples.TwoLinkManipulator`), its tip driven along `y = l/2`, from its consistent start
  over [0, 1] s: the arm folds (`J M⁻¹ Jᵀ` singular, the gradient of `Φ1` vanishes) at 0.49 s. The
  constraints fix the motion: the reference is the inverse kinematics of the tip's path on the
  branch through the fold along which the joint angles stay smooth (analytic).
- **coupled wheels, two gradients vanishing at once**: three wheels on fixed pivots
  `(0, 0)`, `(L, 0)`, `(2L, 0)`, each with a crank pin at radius `r`, the pins coupled by two
  rods (wheels 1–2 and 2–3, a locomotive's coupling rods), in the coordinates
  `(θ1, θ2, θ3, φA, φB)` (wheel and rod angles, four loop-closure constraints, one degree of
  freedom). Wherever the cranks are horizontal (`θ = 0, π`) the mechanism lies flat and the
  gradients of both loops' x-closures vanish: `J M⁻¹ Jᵀ` loses two ranks at once, where the
  parallelogram branch (rods horizontal) crosses the anti-parallelogram ones. Released at
  `θ = 0.3` with `θ̇ = 6 rad/s`, it turns through the flat configuration four times in
  [0, 2] s. Reference: the one-degree-of-freedom equation of the parallelogram branch,
  `(3 I_w + 2 m_r r²) θ̈ = −2 m_r g r cos θ`, by scipy's DOP853 at rtol 1e-13.
- **Bricard's mechanism** (IFToMM A04, built with `jaxdae.multibody` by
  `experiments/examples/bricard.py`): spatial, one of its 30 constraints redundant everywhere, over
  [0, 1] s (quick: 0.5 s, without `Dopri8`, `Kvaerno5` and `GeneralizedAlpha`, whose
  compiles take minutes on its 35 coordinates). Reference: the null-space equations of the same
  model (`q̈ = G⁺γ + N (NᵀMN)⁻¹ Nᵀ (Q − M G⁺γ)`, `N` an orthonormal basis of the null space of
  `G` from an SVD: no multipliers, no stabilization) by scipy's DOP853 at rtol 1e-12.
- **stiff spring pendulum**: the pendulum of `experiments/studies/stiff_integration.py` (a mass on
  a unit rod carrying a second mass on a spring of stiffness 1e6 N/m, damping 1e3 N s/m)
  over [0, 1] s. Reference: its minimal coordinates (the rod's angle, the second mass's
  position) by scipy's Radau at rtol 1e-12.

Error: the largest deviation of `q` from the reference over the saved times, relative to
`max |q_ref|`; for a solve that stopped early (a named failure), the error over the times it
reached is reported with where and why it stopped. A combination *reaches* a requested
tolerance where its error is at most `10 rtol` (an adaptive solver controls each step's
local error to `rtol`; the global error usually ends a few times above it). Time: the median
CPU time (`time.process_time`) of the jitted solve after compiling it (the tolerances are
traced, so one compile serves every tolerance), over at least `--repeats` calls and more
while they take under 0.3 s in all; one call where it stops with a failure. OpenBLAS
runs on one thread unless `OPENBLAS_NUM_THREADS` says otherwise.

Projection: for every `Projected(Tsit5)` combination that runs, the same solve again with
its steps clipped to the saved times, so that each saved state is a step end, gives the
largest `|Φ|` and `|Φ̇|` at step ends (the dense output between step ends is off the
manifold by up to the local error); the table `projection_table` sets them beside the time
of the projected solve over the unprojected `Tsit5` solve's, same formulation and `rtol`.
`--projection-cost` times only these two, interleaved: each round times every solve in
turn, and the table gives the median of the rounds' ratios with their range
(OUT/work_precision/projection_cost.json).

Writes OUT/work_precision/work_precision.json (every run, a table of each combination at
each tolerance and the projection table), work_precision.png (error against time, one
panel per mechanism) and prints the tables. Each combination's runs are also stored in
OUT/work_precision/runs/ (and the references in OUT/work_precision/references/): a later
call with the same settings reads them instead of solving again, so the mechanisms can run
in separate processes (`--only`) and one call with `--stored-only` joins them.

    python experiments/studies/work_precision.py --out output [--quick]
    # in parallel:
    python experiments/studies/work_precision.py --out output --only two-link,wheels
    python experiments/studies/work_precision.py --out output --only spring,Bricard
    # then join:
    python experiments/studies/work_precision.py --out output --stored-only
    python experiments/studies/work_precision.py --out output --projection-cost [--only wheels]
"""

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import time
from pathlib import Path

# One BLAS thread (before NumPy and JAX load OpenBLAS): on a busy 2-core machine OpenBLAS's
# spinning threads made a 28-step Bricard solve (its SVDs) take 21 s of wall time; on one
# thread 70 steps take 0.16 s of CPU. Set OPENBLAS_NUM_THREADS to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax

jax.config.update("jax_enable_x64", True)

import diffrax
import jax.numpy as jnp
import numpy as np
from _common import figure, output_dir, progress, write_json

import jaxdae

NAME = "work_precision"
REACHED = 10.0  # a combination reaches rtol where its error is at most REACHED * rtol
MAX_STEPS = 20_000


# ---------------------------------------------------------------------------------------
# Mechanisms and their references
# ---------------------------------------------------------------------------------------


class CoupledWheels(jaxdae.LagrangianSystem):
    """Three wheels on pivots `(0, 0)`, `(L, 0)`, `(2L, 0)` with crank pins at radius `r`,
    coupled by two uniform rods of length `L` and mass `m_r` (wheels 1–2, wheels 2–3);
    `q = (θ1, θ2, θ3, φA, φB)`; gravity along −y acts on the rods (the wheels are
    balanced, inertia `I_w` about their pivots). Four loop-closure constraints, one degree
    of freedom; at `θ = 0, π` (flat) the x-closures' gradients vanish."""

    length: jax.Array
    radius: jax.Array
    rod_mass: jax.Array
    wheel_inertia: jax.Array
    gravity: jax.Array

    def __init__(self, length=1.0, radius=0.3, rod_mass=1.0, wheel_inertia=0.05, gravity=9.81):
        self.length, self.radius, self.rod_mass, self.wheel_inertia, self.gravity = (
            jnp.asarray(x, dtype=float) for x in (length, radius, rod_mass, wheel_inertia, gravity)
        )

    def _pin(self, q, i):
        return jnp.array(
            [i * self.length + self.radius * jnp.cos(q[i]), self.radius * jnp.sin(q[i])]
        )

    def _rod_centres(self, q):
        half = 0.5 * self.length
        return [
            self._pin(q, i) + half * jnp.array([jnp.cos(q[3 + i]), jnp.sin(q[3 + i])])
            for i in (0, 1)
        ]

    def kinetic_energy(self, t, q, v):
        _, velocities = jax.jvp(lambda q: jnp.stack(self._rod_centres(q)), (q,), (v,))
        rod_inertia = self.rod_mass * self.length**2 / 12
        return 0.5 * (
            self.wheel_inertia * v[:3] @ v[:3]
            + self.rod_mass * jnp.sum(velocities**2)
            + rod_inertia * v[3:] @ v[3:]
        )

    def potential_energy(self, t, q):
        return self.rod_mass * self.gravity * sum(c[1] for c in self._rod_centres(q))

    def constraints(self, t, q):
        closures = []
        for i in (0, 1):
            end = self._pin(q, i) + self.length * jnp.array([jnp.cos(q[3 + i]), jnp.sin(q[3 + i])])
            closures.append(end - self._pin(q, i + 1))
        return jnp.concatenate(closures)

    def reference(self, theta0, omega0, ts):
        """`q` on the parallelogram branch at `ts`: the 1-DOF equation by DOP853."""
        from scipy.integrate import solve_ivp

        inertia = 3 * float(self.wheel_inertia) + 2 * float(self.rod_mass * self.radius**2)
        torque = 2 * float(self.rod_mass * self.gravity * self.radius)
        sol = solve_ivp(
            lambda t, y: [y[1], -torque * np.cos(y[0]) / inertia],
            (ts[0], ts[-1]),
            [theta0, omega0],
            method="DOP853",
            t_eval=ts,
            rtol=1e-13,
            atol=1e-13,
        )
        theta = sol.y[0]
        return np.stack([theta, theta, theta, 0 * theta, 0 * theta], axis=1)


def two_link_reference(arm: jaxdae.examples.TwoLinkManipulator, ts, q0):
    """The arm's joint angles along its tip's path, on the branch through the fold where
    they stay smooth: `q2 = π + sign(P_x) arccos(...)` continued through `P_x = 0`."""
    (l1, l2), speed, x0 = (float(x) for x in arm.lengths), float(arm.speed), float(arm.x0)
    px, py = x0 - speed * ts, 0.5 * float(arm.length) * np.ones_like(ts)
    cos2 = np.clip((px**2 + py**2 - l1**2 - l2**2) / (2 * l1 * l2), -1.0, 1.0)
    # q2 crosses π with P_x: it is π + s · arccos(−cos q2) · sign(P_x), s from the start.
    s = np.sign(np.sin(float(q0[1]) - np.pi)) * np.sign(px[0])
    q2 = np.pi + s * np.sign(px) * np.arccos(-cos2)
    q1 = np.arctan2(py, px) - np.arctan2(l2 * np.sin(q2), l1 + l2 * np.cos(q2))
    q1 = np.unwrap(q1)
    q1 += 2 * np.pi * np.round((float(q0[0]) - q1[0]) / (2 * np.pi))
    return np.stack([q1, q2], axis=1)


def null_space_reference(system, q0, v0, ts, rtol=1e-12):
    """`q` at `ts` from the null-space equations of `system` (no multipliers, no
    stabilization): `q̈ = G⁺γ + N (NᵀMN)⁻¹ Nᵀ (Q − M G⁺γ)`, `N` an orthonormal basis of the
    null space of `G`, integrated by scipy's DOP853. Needs the rank of `G` constant along
    the motion (it is read at the start)."""
    from scipy.integrate import solve_ivp

    n = q0.shape[0]
    rank = int(np.linalg.matrix_rank(np.asarray(system.terms(0.0, q0, v0).jacobian), tol=1e-8))

    @jax.jit
    def acceleration(t, q, v):
        terms = system.terms(t, q, v)
        vt = jnp.linalg.svd(terms.jacobian)[2]
        null = vt[rank:].T
        particular = jnp.linalg.pinv(terms.jacobian, rtol=1e-10) @ terms.bias
        reduced = null.T @ terms.mass_matrix @ null
        rhs = null.T @ (terms.forces - terms.mass_matrix @ particular)
        return particular + null @ jnp.linalg.solve(reduced, rhs)

    def rhs(t, y):
        q, v = y[:n], y[n:]
        return np.concatenate([v, np.asarray(acceleration(t, q, v))])

    y0 = np.concatenate([np.asarray(q0), np.asarray(v0)])
    sol = solve_ivp(rhs, (ts[0], ts[-1]), y0, method="DOP853", t_eval=ts, rtol=rtol, atol=rtol)
    return sol.y[:n].T


def spring_reference(system, q0, v0, ts):
    """The spring pendulum in minimal coordinates `(θ, x2, y2)` (rod angle from the
    downward vertical, second mass position) by scipy's Radau at rtol 1e-12."""
    from scipy.integrate import solve_ivp

    m1, m2, k, c, rest, g = (
        float(x) for x in (system.m1, system.m2, system.k, system.c, system.rest, system.gravity)
    )
    q0, v0 = np.asarray(q0), np.asarray(v0)

    def rhs(t, y):
        theta, x2, y2, w, vx2, vy2 = y
        p1 = np.array([np.sin(theta), -np.cos(theta)])
        dp1 = np.array([np.cos(theta), np.sin(theta)])  # ∂p1/∂θ
        v1 = w * dp1
        d = np.array([x2, y2]) - p1
        length = np.hypot(*d)
        axis = d / length
        force = -(k * (length - rest) + c * ((np.array([vx2, vy2]) - v1) @ axis)) * axis
        # on mass 2: `force` and gravity; on mass 1: −force and gravity
        w_dot = ((-force + np.array([0.0, -m1 * g])) @ dp1) / m1
        return [w, vx2, vy2, w_dot, force[0] / m2, force[1] / m2 - g]

    theta0 = np.arctan2(q0[0], -q0[1])
    w0 = v0[:2] @ np.array([np.cos(theta0), np.sin(theta0)])
    sol = solve_ivp(
        rhs,
        (ts[0], ts[-1]),
        [theta0, q0[2], q0[3], w0, v0[2], v0[3]],
        method="Radau",
        t_eval=ts,
        rtol=1e-12,
        atol=1e-13,
    )
    theta = sol.y[0]
    return np.stack([np.sin(theta), -np.cos(theta), sol.y[1], sol.y[2]], axis=1)


@dataclasses.dataclass
class Mechanism:
    name: str
    system: jaxdae.LagrangianSystem
    q0: jax.Array
    v0: jax.Array
    t1: float
    formulations: dict  # name -> formulation, or a string saying why it does not apply
    # q at the saved times (a function computing it, until `main` calls it)
    reference: np.ndarray
    # the formulations run with the integrators in COSTLY (None: all), and whether
    # GeneralizedAlpha runs (not when empty): on the 35-coordinate Bricard model each of
    # their compiles takes minutes
    costly_with: tuple | None = None


def cached(folder: Path, key: str, compute) -> np.ndarray:
    """A reference from `folder/references/KEY.npy` when computed before with the same
    key, else computed (seconds to minutes) and stored."""
    path = folder / "references" / (re.sub(r"[^A-Za-z0-9.]+", "_", key) + ".npy")
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        np.save(path, np.asarray(compute()))
    return np.load(path)


def mechanisms(quick: bool, num: int, folder: Path) -> list[Mechanism]:
    from stiff_integration import SpringPendulum

    from jaxdae.examples._bricard import bricard

    def standard(kd, kp, alpha):
        kd, kp = jnp.asarray(kd), jnp.asarray(kp)
        return {
            "Unstabilized": jaxdae.Unstabilized(),
            "Baumgarte": jaxdae.Baumgarte(kd, kp),
            "PseudoInverse": jaxdae.PseudoInverse(kd, kp),
            "ModifiedLagrange": jaxdae.ModifiedLagrange(alpha, kd, kp),
            "CoupledPerturbation": jaxdae.CoupledPerturbation(k10=-kp, k11=-kd),
        }

    def reference(key, compute, *args):
        # computed when `main` calls it, for the mechanisms it runs
        return functools.partial(cached, folder, key, functools.partial(compute, *args))

    out = []
    # two-link arm through its fold
    arm = jaxdae.examples.TwoLinkManipulator()
    q0, v0 = jaxdae.consistent_initial_state(arm, 0.0, *arm.initial_state())[:2]
    t1 = 1.0
    ts = np.linspace(0.0, t1, num)
    formulations = standard(
        [20.0, 10.0], [100.0, 25.0], 1e3
    )  # Mukharlyamov and Deressa (2015), Case 1
    formulations["RedundantCoordinates"] = (
        "does not apply: as many constraints as coordinates (the motion is prescribed)"
    )
    out.append(
        Mechanism(
            "two-link arm through its fold",
            arm,
            q0,
            v0,
            t1,
            formulations,
            reference(f"two-link {t1} {num}", two_link_reference, arm, ts, q0),
        )
    )

    # coupled wheels
    wheels = CoupledWheels()
    theta0, omega0 = 0.3, 6.0
    q0 = jnp.array([theta0, theta0, theta0, 0.0, 0.0])
    v0 = jnp.array([omega0, omega0, omega0, 0.0, 0.0])
    t1 = 2.0
    ts = np.linspace(0.0, t1, num)
    formulations = standard(20.0, 100.0, 1e3)
    formulations["RedundantCoordinates"] = jaxdae.RedundantCoordinates(dependent=(1, 2, 3, 4))
    out.append(
        Mechanism(
            "coupled wheels (two gradients vanish when flat)",
            wheels,
            q0,
            v0,
            t1,
            formulations,
            reference(f"wheels {t1} {num}", wheels.reference, theta0, omega0, ts),
        )
    )

    # stiff spring pendulum
    spring = SpringPendulum(k=1e6, c=1e3)
    p1 = jnp.array([jnp.sin(jnp.pi / 3), -jnp.cos(jnp.pi / 3)])
    q0 = jnp.concatenate([p1, p1 + jnp.array([0.1, -0.5])])
    v0 = jnp.zeros(4)
    t1 = 1.0
    ts = np.linspace(0.0, t1, num)
    formulations = standard(10.0, 25.0, 1e3)
    formulations["RedundantCoordinates"] = jaxdae.RedundantCoordinates(dependent=(1,))
    out.append(
        Mechanism(
            "stiff spring pendulum (k = 1e6)",
            spring,
            q0,
            v0,
            t1,
            formulations,
            reference(f"spring {t1} {num}", spring_reference, spring, q0, v0, ts),
        )
    )

    # Bricard
    model = bricard()
    q0, v0 = model.initial_state()
    t1 = 0.5 if quick else 1.0
    ts = np.linspace(0.0, t1, num)
    formulations = standard(20.0, 100.0, 1e3)
    formulations["RedundantCoordinates"] = (
        "does not apply: a redundant constraint leaves no square, invertible ∂Φ/∂q_dep"
    )
    out.append(
        Mechanism(
            "Bricard (spatial, redundant)",
            model,
            q0,
            v0,
            t1,
            formulations,
            reference(f"bricard {t1} {num}", null_space_reference, model, q0, v0, ts),
            costly_with=None if not quick else (),
        )
    )

    return out


# ---------------------------------------------------------------------------------------
# Integrators and runs
# ---------------------------------------------------------------------------------------

INTEGRATORS = {
    "Tsit5": diffrax.Tsit5(),
    "Dopri8": diffrax.Dopri8(),
    "Kvaerno5": diffrax.Kvaerno5(),  # simulate configures its root finder (configure_implicit)
    "Projected(Tsit5)": jaxdae.Projected(diffrax.Tsit5()),
    "GeneralizedAlpha": jaxdae.GeneralizedAlpha(),
}
# GeneralizedAlpha integrates the index-3 equations itself: the formulation only gives the
# saved multipliers, so it runs once per mechanism, with this one (it has no failure test).
GA_FORMULATION = "ModifiedLagrange"
COSTLY = ("Dopri8", "Kvaerno5")
QUICK_FORMULATIONS = ("Baumgarte", "PseudoInverse", "ModifiedLagrange", "RedundantCoordinates")


def combinations(mechanism: Mechanism, integrators):
    for integrator in integrators:
        for name, formulation in mechanism.formulations.items():
            if integrator == "GeneralizedAlpha" and name != GA_FORMULATION:
                continue
            if mechanism.costly_with is not None:
                if integrator in COSTLY and name not in mechanism.costly_with:
                    continue
                if integrator == "GeneralizedAlpha" and not mechanism.costly_with:
                    continue
            if isinstance(formulation, jaxdae.RedundantCoordinates) and integrator in (
                "GeneralizedAlpha",
            ):
                continue
            yield integrator, name, formulation


def solve_fn(mechanism: Mechanism, formulation, solver, ts, step_ends: bool = False):
    """The jitted solve `(rtol) -> (q at ts, result, t_final, steps, rejected, max |Φ|,
    max |Φ̇|)`, the residuals over the saved times it reached; `atol = 1e-3 rtol`. With
    `step_ends`, the steps are clipped to the saved times (`diffrax.ClipStepSizeController`),
    so that every saved state is a step end."""
    system, q0, v0, t1 = mechanism.system, mechanism.q0, mechanism.v0, mechanism.t1

    @jax.jit
    def solve(rtol):
        controller = (
            diffrax.ClipStepSizeController(
                diffrax.PIDController(rtol=rtol, atol=1e-3 * rtol), step_ts=ts
            )
            if step_ends
            else None
        )  # None: simulate's own, from rtol and atol
        sol = jaxdae.simulate(
            system,
            formulation,
            0.0,
            t1,
            q0,
            v0,
            ts=ts,
            solver=solver,
            stepsize_controller=controller,
            rtol=rtol,
            atol=1e-3 * rtol,
            max_steps=MAX_STEPS,
            throw=False,
        )

        def largest(x):  # over the saved times reached (later ones are inf)
            return jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0))

        return (
            sol.q,
            sol.result,
            sol.t_final,
            sol.stats["num_accepted_steps"],
            sol.stats["num_rejected_steps"],
            largest(sol.phi),
            largest(sol.dphi),
        )

    return solve


def timed(solve, arg, repeats: int, budget: float = 0.3, limit: float = 10.0):
    """`(output of the first call, median CPU time in s)` of `solve(arg)`: at least
    `repeats` calls, more (at most 200) while they have taken less than `budget` s in all,
    fewer once one call has taken more than `limit` s; one call where it stops with a
    failure (its time is not a solve's). The median, not the best: on the shared virtual
    machine the process's CPU clock now and then reports a call of a few milliseconds as a
    tenth of that, which the best of 200 calls would pick."""
    times, out = [], None
    for i in range(200):
        start = time.process_time()
        result = jax.block_until_ready(solve(arg))
        times.append(time.process_time() - start)
        out = result if out is None else out
        if (
            _name(out[1]) != "successful"
            or times[-1] > limit
            or (i + 1 >= repeats and sum(times) >= budget)
        ):
            break
    return out, float(np.median(times))


def run(
    mechanism: Mechanism, integrator: str, formulation_name: str, formulation, rtols, repeats: int
) -> list[dict]:
    ts = jnp.linspace(0.0, mechanism.t1, mechanism.reference.shape[0])
    solver = INTEGRATORS[integrator]
    solve = solve_fn(mechanism, formulation, solver, ts)
    reference = mechanism.reference
    scale = float(np.max(np.abs(reference)))
    rows = []
    start = time.perf_counter()
    first = jax.block_until_ready(solve(jnp.asarray(rtols[0])))
    compile_s = time.perf_counter() - start
    for rtol in rtols:
        arg = jnp.asarray(rtol)
        out, seconds = timed(solve, arg, repeats)
        if rtol == rtols[0]:
            assert _name(first[1]) == _name(out[1]), "the solve is not deterministic"
        q, result, t_final = np.asarray(out[0]), _name(out[1]), float(out[2])
        steps, rejected, max_phi, max_dphi = (np.asarray(x) for x in out[3:])
        finite = np.all(np.isfinite(q), axis=1)
        reached = int(np.argmin(finite)) if not finite.all() else len(finite)
        error = (
            float(np.max(np.abs(q[:reached] - reference[:reached]))) / scale
            if reached
            else float("nan")
        )
        rows.append(
            dict(
                mechanism=mechanism.name,
                integrator=integrator,
                formulation=formulation_name,
                rtol=rtol,
                atol=1e-3 * rtol,
                error=error,
                succeeded=result == "successful" and bool(finite.all()),
                result=result,
                stopped_at=None if result == "successful" else t_final,
                steps=int(steps),
                rejected=int(rejected),
                max_phi=float(max_phi),
                max_dphi=float(max_dphi),
                time_ms=1e3 * seconds,
                compile_s=compile_s,
            )
        )
    if isinstance(solver, jaxdae.Projected) and any(r["succeeded"] for r in rows):
        # The constraint residuals at step ends: the same solve with its steps clipped to
        # the saved times (between step ends the dense output is off the manifold by up
        # to the local error).
        clipped = solve_fn(mechanism, formulation, solver, ts, step_ends=True)
        for row in rows:
            out = clipped(jnp.asarray(row["rtol"]))
            reached = np.isfinite(np.asarray(out[0])).all(axis=1)
            row["step_ends"] = {
                "result": _name(out[1]),
                "steps": int(out[3]),
                "max_phi": float(out[5]),
                "max_dphi": float(out[6]),
                "saved": int(reached.sum()),
            }
    return rows


def _name(result) -> str:
    """The name of a `jaxdae.RESULTS` item."""
    return next(name for name, item in jaxdae.RESULTS._name_to_item.items() if bool(item == result))


# ---------------------------------------------------------------------------------------
# Summary, table, figure
# ---------------------------------------------------------------------------------------


def verdict(rows: list[dict]) -> dict:
    """What one combination does over the tolerances: follows the reference (its error
    reaches `REACHED · rtol` at every tolerance), converges (reaches it at the tightest
    tolerance only), stalls (its error does not fall by 3× from the loosest tolerance to
    the tightest: the formulation's own error), stays above the tolerance (it falls, but
    not enough), or stops (a named failure)."""
    rows = sorted(rows, key=lambda r: -r["rtol"])
    stopped = [r for r in rows if not r["succeeded"]]
    tight = rows[-1]
    if stopped:
        # the stops that name the same failure at the same time, grouped
        groups = {}
        for r in stopped:
            groups.setdefault((r["result"], f"{r['stopped_at']:.3g}"), []).append(r)
        parts = []
        for (result, at), group in groups.items():
            part = f"stops at t = {at} s ({result})"
            errors = [f"{r['error']:.1e}" for r in group if np.isfinite(r["error"])]
            if errors:
                part += f", error {' / '.join(errors)} until then"
            rtols = (
                "every rtol"
                if len(group) == len(rows)
                else "rtol " + ", ".join(f"{r['rtol']:g}" for r in group)
            )
            parts.append(f"{part} at {rtols}")
        text = "; ".join(parts) + "".join(
            f"; at rtol {r['rtol']:g} it runs to t1 with error {r['error']:.1e}"
            for r in rows
            if r["succeeded"]
        )
        kind = "stops"
    elif all(r["error"] <= REACHED * r["rtol"] for r in rows):
        text, kind = (
            (f"follows the reference (error {tight['error']:.1e} at rtol {tight['rtol']:g})"),
            "follows",
        )
    elif tight["error"] <= REACHED * tight["rtol"]:
        missed = ", ".join(f"{r['rtol']:g}" for r in rows if r["error"] > REACHED * r["rtol"])
        text, kind = (
            (
                f"converges (error {tight['error']:.1e} at rtol {tight['rtol']:g}; "
                f"above {REACHED:g} rtol at rtol {missed})"
            ),
            "converges",
        )
    elif rows[0]["error"] < 3 * tight["error"]:  # tightening the tolerance did not help
        text, kind = f"stalls at error {min(r['error'] for r in rows):.1e}", "stalls"
    else:
        text, kind = (
            (f"error {tight['error']:.1e} at rtol {tight['rtol']:g}, above {REACHED:g} rtol"),
            "above",
        )
    return dict(
        kind=kind,
        text=text,
        errors={f"{r['rtol']:g}": r["error"] for r in rows},
        reached={
            f"{r['rtol']:g}": r["succeeded"] and r["error"] <= REACHED * r["rtol"] for r in rows
        },
        time_ms={f"{r['rtol']:g}": r["time_ms"] for r in rows},
        steps={f"{r['rtol']:g}": r["steps"] for r in rows},
    )


def fastest(rows: list[dict], target: float) -> dict | None:
    """The quickest successful run whose error is at most `target`."""
    good = [r for r in rows if r["succeeded"] and r["error"] <= target]
    return min(good, key=lambda r: r["time_ms"]) if good else None


def table(results: dict, rtols) -> list[str]:
    header = (
        "| mechanism | formulation | integrator | "
        + " | ".join(f"error at rtol {r:g}" for r in rtols)
        + f" | steps / time [ms] at rtol {rtols[-1]:g} | verdict |"
    )
    lines = [header, "|" + "---|" * (len(rtols) + 5)]
    for key, entry in results.items():
        mechanism, formulation, integrator = key.split(" | ")
        rows = {f"{r['rtol']:g}": r for r in entry["runs"]}
        cells = []
        for rtol in rtols:
            r = rows[f"{rtol:g}"]
            mark = "" if r["succeeded"] else " (stopped)"
            cells.append(f"{r['error']:.1e}{mark}")
        last = rows[f"{rtols[-1]:g}"]
        lines.append(
            f"| {mechanism} | {formulation} | {integrator} | "
            + " | ".join(cells)
            + f" | {last['steps']} / {last['time_ms']:.1f} | "
            f"{entry['verdict']['text']} |"
        )
    return lines


def projection_table(results: dict, rtols) -> list[str]:
    """For each mechanism × formulation solved with `Projected(Tsit5)`: the largest `|Φ|`
    and `|Φ̇|` at its step ends (the solve with its steps clipped to the saved times) over
    the tolerances at which it succeeded, and at each tolerance the CPU time of the
    projected solve over that of the unprojected `Tsit5` solve (or why there is none)."""
    lines = [
        "| mechanism | formulation | max abs Φ at step ends | max abs Φ̇ at step ends | "
        + " | ".join(f"time ratio at rtol {r:g}" for r in rtols)
        + " |",
        "|" + "---|" * (len(rtols) + 4),
    ]
    for key, entry in results.items():
        mechanism, formulation, integrator = key.split(" | ")
        if integrator != "Projected(Tsit5)":
            continue
        plain = results.get(f"{mechanism} | {formulation} | Tsit5")
        plain = {r["rtol"]: r for r in plain["runs"]} if plain else {}
        ends = [
            r["step_ends"]
            for r in entry["runs"]
            if "step_ends" in r and r["step_ends"]["result"] == "successful"
        ]
        if ends:
            phi = f"{max(e['max_phi'] for e in ends):.1e}"
            dphi = f"{max(e['max_dphi'] for e in ends):.1e}"
        else:
            first = entry["runs"][0]
            phi = dphi = f"— ({first['result']} at t = {first['stopped_at']:.3g} s)"
        cells = []
        for r in entry["runs"]:
            p = plain.get(r["rtol"])
            if not r["succeeded"]:
                cells.append(f"— (stops: {r['result']})")
            elif p is None or not p["succeeded"]:
                cells.append(
                    "— (Tsit5 " + ("not run" if p is None else f"stops: {p['result']}") + ")"
                )
            else:
                cells.append(
                    f"{r['time_ms'] / p['time_ms']:.2f} ({r['steps']} / {p['steps']} steps)"
                )
        lines.append(
            f"| {mechanism} | {formulation} | {phi} | {dphi} | " + " | ".join(cells) + " |"
        )
    return lines


def plot(folder: Path, results: dict, mechanism_names) -> None:
    import matplotlib.pyplot as plt

    integrators = list(INTEGRATORS)
    colors = dict(zip(integrators, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    markers = dict(
        zip(
            [
                "Unstabilized",
                "Baumgarte",
                "PseudoInverse",
                "ModifiedLagrange",
                "CoupledPerturbation",
                "RedundantCoordinates",
            ],
            "xosD^v",
            strict=False,
        )
    )
    fig, axes = plt.subplots(2, 2, figsize=(12, 10), layout="constrained")
    for ax, mechanism in zip(axes.flat, mechanism_names, strict=False):
        for key, entry in results.items():
            if not key.startswith(mechanism + " | "):
                continue
            _, formulation, integrator = key.split(" | ")
            runs = sorted(entry["runs"], key=lambda r: -r["rtol"])
            ok = [r for r in runs if r["succeeded"]]
            style = dict(color=colors[integrator], marker=markers[formulation], ms=5)
            if ok:
                ax.loglog(
                    [r["time_ms"] for r in ok],
                    [max(r["error"], 1e-16) for r in ok],
                    "-",
                    lw=1,
                    **style,
                )
            failed = [r for r in runs if not r["succeeded"] and r["error"] > 0]
            if failed:  # where it stopped: the error until then, hollow
                ax.loglog(
                    [r["time_ms"] for r in failed],
                    [max(r["error"], 1e-16) for r in failed],
                    ls="none",
                    mfc="none",
                    **style,
                )
        ax.set(xlabel="CPU time of the solve [ms]", ylabel="relative error of q", title=mechanism)
        ax.grid(True, which="both", alpha=0.3)
    from matplotlib.lines import Line2D

    handles = (
        [Line2D([], [], color=c, label=n) for n, c in colors.items()]
        + [Line2D([], [], color="k", marker=m, ls="none", label=n) for n, m in markers.items()]
        + [
            Line2D(
                [],
                [],
                color="k",
                marker="o",
                mfc="none",
                ls="none",
                label="stopped (error until then)",
            )
        ]
    )
    fig.legend(handles=handles, loc="outside lower center", ncol=6, fontsize=8)
    fig.savefig(folder / "work_precision.png", dpi=110)
    plt.close(fig)


def main(
    out: Path,
    quick: bool = False,
    repeats: int | None = None,
    only: list[str] | None = None,
    integrators: list[str] | None = None,
    stored_only: bool = False,
) -> dict:
    folder = output_dir(out, NAME)
    rtols = [1e-4, 1e-7] if quick else [1e-3, 1e-5, 1e-7, 1e-9]
    repeats = repeats or (1 if quick else 3)
    integrators = integrators or (
        ["Tsit5", "Kvaerno5", "Projected(Tsit5)", "GeneralizedAlpha"]
        if quick
        else list(INTEGRATORS)
    )
    all_mechanisms = mechanisms(quick, 21 if quick else 41, folder)
    if quick:
        for mechanism in all_mechanisms:
            mechanism.formulations = {
                k: v for k, v in mechanism.formulations.items() if k in QUICK_FORMULATIONS
            }
    if only:
        all_mechanisms = [m for m in all_mechanisms if any(o in m.name for o in only)]
    results, skipped = {}, {}
    for mechanism in all_mechanisms:
        mechanism.reference = mechanism.reference()
        settings = {
            "rtols": rtols,
            "repeats": repeats,
            "t1": mechanism.t1,
            "saved": mechanism.reference.shape[0],
            "max_steps": MAX_STEPS,
        }
        todo = list(combinations(mechanism, integrators))
        for integrator, name, formulation in progress(todo, mechanism.name, unit="solve"):
            key = f"{mechanism.name} | {name} | {integrator}"
            if isinstance(formulation, str):
                skipped[key] = formulation
                continue
            # Each combination's runs are kept in OUT/work_precision/runs/: a later call
            # with the same settings reads them instead of solving again (so that processes
            # running different mechanisms, `--only`, can be joined by one call without it).
            path = folder / "runs" / (re.sub(r"[^A-Za-z0-9.()]+", "_", key) + ".json")
            stored = json.loads(path.read_text()) if path.exists() else None
            if stored is not None and stored["settings"] == settings:
                runs = stored["runs"]
            elif stored_only:
                skipped[key] = "not run"
                continue
            else:
                runs = run(mechanism, integrator, name, formulation, rtols, repeats)
                path.parent.mkdir(exist_ok=True)
                write_json(path, {"settings": settings, "runs": runs})
            results[key] = dict(runs=runs, verdict=verdict(runs))
            print(f"  {key}: {results[key]['verdict']['text']}", flush=True)
    names = [m.name for m in all_mechanisms]
    best = {}
    for mechanism in names:
        rows = [r for k, e in results.items() if k.startswith(mechanism + " | ") for r in e["runs"]]
        best[mechanism] = {f"{t:g}": fastest(rows, t) for t in (1e-3, 1e-6)}
    lines = table(results, rtols)
    projection_lines = projection_table(results, rtols)
    write_json(
        folder / "work_precision.json",
        dict(
            rtols=rtols,
            reached_factor=REACHED,
            repeats=repeats,
            integrators=integrators,
            results=results,
            does_not_apply=skipped,
            fastest=best,
            table=lines,
            projection_table=projection_lines,
        ),
    )
    plot(folder, results, names)
    parts = []
    for mechanism, targets in best.items():
        for target, row in targets.items():
            if row is not None:
                parts.append(
                    f"{mechanism}: fastest to error ≤ {target}: {row['formulation']} "
                    f"+ {row['integrator']} ({row['time_ms']:.2f} ms)."
                )
    headline = " ".join(parts)
    print("\n".join(lines))
    print("\n".join(projection_lines))
    print(headline)
    return dict(
        headline=headline,
        table=lines,
        figures=[
            figure(
                folder / "work_precision.png",
                "relative error against CPU time for every formulation × integrator on four "
                "mechanisms (hollow: a solve that stopped, with its error until then)",
            )
        ],
    )


def projection_cost(
    out: Path, only: list[str] | None = None, formulations: list[str] | None = None, rounds: int = 3
) -> list[str]:
    """The projection's cost alone: for each mechanism (`only`) and formulation
    (`formulations`, default all) that `Projected(Tsit5)` applies to, the CPU time of the
    projected solve over that of the unprojected `Tsit5` solve at each of the study's
    tolerances. Both are compiled first; then `rounds` rounds each time every solve in turn
    (the median of as many calls as fit in 0.3 s, at least one), so that a change of load
    affects both alike, and the ratio of each round's pair is taken: the median over the
    rounds, with the smallest and largest; and the largest `|Φ|`, `|Φ̇|` at the step ends of
    the projected solve with its steps clipped to the saved times, over the tolerances at
    which it succeeds. Writes OUT/work_precision/projection_cost.json and prints the
    table."""
    folder = output_dir(out, NAME)
    rtols = [1e-3, 1e-5, 1e-7, 1e-9]
    chosen = [
        m for m in mechanisms(False, 41, folder) if not only or any(o in m.name for o in only)
    ]
    cases = []
    for mechanism in chosen:
        ts = jnp.linspace(0.0, mechanism.t1, 41)
        projected = INTEGRATORS["Projected(Tsit5)"]
        for name, formulation in mechanism.formulations.items():
            if isinstance(formulation, str) or (formulations and name not in formulations):
                continue
            solves = [
                solve_fn(mechanism, formulation, solver, ts)
                for solver in (diffrax.Tsit5(), projected)
            ]
            for solve in solves:  # compile
                jax.block_until_ready(solve(jnp.asarray(rtols[0])))
            # the residuals at step ends: the projected solve with its steps clipped to ts
            clipped = solve_fn(mechanism, formulation, projected, ts, step_ends=True)
            ends = [clipped(jnp.asarray(rtol)) for rtol in rtols]
            ends = [(float(out[5]), float(out[6])) for out in ends if _name(out[1]) == "successful"]
            residuals = (
                f"{max(e[0] for e in ends):.1e} / {max(e[1] for e in ends):.1e}" if ends else "—"
            )
            cases.append((mechanism.name, name, solves, residuals))
            print(f"  compiled {mechanism.name} | {name}", flush=True)
    times = {}
    for _ in range(rounds):
        for mechanism, name, solves, _ in cases:
            for rtol in rtols:
                for i, solve in enumerate(solves):
                    result, seconds = timed(solve, jnp.asarray(rtol), 1)
                    entry = times.setdefault((mechanism, name, rtol, i), dict(times=[]))
                    entry["times"].append(seconds)
                    entry.update(result=_name(result[1]), steps=int(result[3]))
    lines = [
        "| mechanism | formulation | max abs Φ / Φ̇ at step ends | "
        + " | ".join(f"rtol {r:g}: ratio (min–max; steps)" for r in rtols)
        + " |",
        "|" + "---|" * (len(rtols) + 3),
    ]
    rows = []
    for mechanism, name, _, residuals in cases:
        cells = []
        for rtol in rtols:
            plain, proj = (times[(mechanism, name, rtol, i)] for i in (0, 1))
            if "successful" not in (plain["result"], proj["result"]) or (
                plain["result"] != proj["result"]
            ):
                cells.append(f"— (Tsit5 {plain['result']}, projected {proj['result']})")
                continue
            ratios = np.array(proj["times"]) / np.array(plain["times"])
            cells.append(
                f"{np.median(ratios):.2f} ({ratios.min():.2f}–{ratios.max():.2f}; "
                f"{proj['steps']} / {plain['steps']})"
            )
            rows.append(
                dict(
                    mechanism=mechanism,
                    formulation=name,
                    rtol=rtol,
                    plain_ms=[1e3 * t for t in plain["times"]],
                    projected_ms=[1e3 * t for t in proj["times"]],
                    ratios=ratios.tolist(),
                    steps=[proj["steps"], plain["steps"]],
                )
            )
        lines.append(f"| {mechanism} | {name} | {residuals} | " + " | ".join(cells) + " |")
    write_json(folder / "projection_cost.json", dict(rounds=rounds, rows=rows, table=lines))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("output"),
        help=f"output root; results go to OUT/{NAME}/ (default: output)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="two tolerances, four integrators, shorter Bricard run"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed calls per run (best taken; default 3, quick 1)",
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated parts of mechanism names to run"
    )
    parser.add_argument(
        "--integrators",
        default=None,
        help=f"comma-separated integrators to run, of {', '.join(INTEGRATORS)}",
    )
    parser.add_argument(
        "--stored-only",
        action="store_true",
        help="solve nothing: tabulate and plot the runs stored under OUT "
        "(by earlier calls, e.g. one per mechanism with --only)",
    )
    parser.add_argument(
        "--projection-cost",
        action="store_true",
        help="time only Tsit5 against Projected(Tsit5), interleaved, "
        "median of --rounds (with --only, --formulations)",
    )
    parser.add_argument(
        "--formulations", default=None, help="with --projection-cost: comma-separated formulations"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="with --projection-cost: interleaved rounds (default 3)",
    )
    args = parser.parse_args()
    if args.projection_cost:
        projection_cost(
            args.out,
            args.only.split(",") if args.only else None,
            args.formulations.split(",") if args.formulations else None,
            args.rounds,
        )
        raise SystemExit
    main(
        args.out,
        args.quick,
        args.repeats,
        args.only.split(",") if args.only else None,
        args.integrators.split(",") if args.integrators else None,
        args.stored_only,
    )
