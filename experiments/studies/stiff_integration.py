"""Stiff systems: implicit integrators against explicit ones, steps and time at matched accuracy.

Six studies, each written to OUT/stiff_integration/ (summary.json, figures):

1. **Configuration of diffrax's implicit solvers.** `diffrax.Kvaerno5()` as diffrax builds it
   (its `VeryChord` root finder) against `jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol,
   atol)` and `diffrax.Tsit5()`: Mukharlyamov and Deressa's (2015) two-link arm with
   `ModifiedLagrange(α, [20, 10], [100, 25])`, α = 10, 1e3, 1e5, over [0, 2] s at rtol 1e-6,
   atol 1e-8 (not stiff), and the stiff spring pendulum below at rtol 1e-6, atol 1e-9.
2. **Work–precision on stiff cases**, against a reference solved at rtol 1e-12 (Tsit5):
   - *spring pendulum*: a unit pendulum (`|p₁|² = 1`, mass 1, `Baumgarte(10, 25)`) carrying a
     second mass (1 kg) on a spring of rest length 0.5 m, stiffness `k = 10⁶` N/m and damping
     `10³` N·s/m (and `k = 10⁸`, damping `10⁴`), over [0, 2] s;
   - *Cartesian arm, Baumgarte gains in the thousands*: Shemelova's (2016) two-link arm in Cartesian
     coordinates (`jaxdae.examples.CartesianArmLagrangian`, gravity as applied forces) with
     `Baumgarte(2000, 10⁶)` (both constraint perturbations decay at rate 1000 s⁻¹), from a
     consistent state, over [0, 2] s;
   - *spring chain*: 16 unit masses joined by spring–dampers (`k = 10⁸`, `c = 10⁴`), the
     first on a rigid rod (64 states), released from rest, over [0, 1] s;
   - *flyball governor* (IFToMM A05, `experiments/examples/flyball_governor.py`: 56 states, springs
     `K = 8·10⁵`, `C = 4·10⁴`), over the benchmark's [0, 10] s.
   Solvers: `Tsit5`, `Dopri5`, `Dopri8`, the configured `Kvaerno5`,
   `jaxdae.GeneralizedAlpha()` and `jaxdae.Rodas5P()` over a range of tolerances (the
   governor: Tsit5, Dopri8, GeneralizedAlpha and Rodas5P at five tolerances); error = max over 41
   saved times of |q − q_ref| / max |q_ref|; time = best CPU time (`time.process_time`) of 5 calls
   (the governor: 1) of the jitted solve after compiling, the solvers of a case called in turn. The
   table compares, per case, the cheapest run of each solver that reaches a relative error of 1e-3
   and of 1e-6.
3. **Gradients** on the stiff cases: `jax.grad` of the final position with respect to a mass,
   through Tsit5 and each implicit solver with its default adjoint (and through diffrax's
   loop with one checkpoint per step and with 32; Kvaerno5's default adjoint also with
   `eqx.filter_vjp` of each step), against central differences, its time
   against the forward solve's (wall time, median of three, called in turn in one
   process) and the time to compile both; `replay_segments`: Rodas5P's default adjoint
   keeping 1,024 and 4,096 steps' states at once, the same with each step differentiated
   by its discrete adjoint, and diffrax's loop with a checkpoint per step (seven calls in
   turn, medians); `gradient_segments`: GeneralizedAlpha's
   default adjoint keeping 1,024, 4,096 and all steps' states at once, and with a new
   matrix of each step's adjoint equations at every step.
4. **Where an implicit step's time goes**, on the spring pendulum (`k = 10⁶`) as an 8-state
   ODE (`Baumgarte(10, 25)`): the cost of one right-hand side, of its Jacobian
   (`jax.jacfwd`), of the same ODE's written out by hand and of an 8 × 8 LU factorization and
   solve (each inside a `lax.scan` of 2,000 repetitions); the cost per step of Tsit5, the
   configured Kvaerno5 (`FusedChord`; and with its chord iteration through lineax,
   `ToleranceChord`) and Rodas5P on jaxdae's right-hand side, on the one written out, on
   the Cartesian arm's and on a test ODE `A y − 0.01 y³`; Kvaerno5's steps and its step size after
   the transient with the chord iteration stopped at `kappa` = 1e-2 and 1e-4 of the tolerance; an n
   × n LU factorization and nine solves by `jax.scipy.linalg` and by lineax, n = 4 … 128.
5. **Independent stiff codes** (`crosscheck`): scipy's Radau and BDF, SUNDIALS' CVODE.
6. **Global error on the flyball governor** (`global_error`): Rodas5P's and the configured
   Kvaerno5's error at rtol 1e-3 against time, split into the phase of the rotation and
   the rest, and their error estimates against the true local errors of sampled steps.

    OPENBLAS_NUM_THREADS=1 python experiments/studies/stiff_integration.py --out output [--quick]
        [--study configuration|work_precision|gradients|gradient_segments|replay_segments|
         step_costs|crosscheck|global_error]...
        [--case TEXT]... [--solver TEXT]...  (`--solver`: the gradient runs named so)
"""

import contextlib
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # threads spin under load: LAPACK 10-100x

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax

jax.config.update("jax_enable_x64", True)

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
from _common import figure, legend_below, output_dir, parse_args, progress, write_json

import jaxdae
from jaxdae import _thresholds

NAME = "stiff_integration"
T1 = 2.0
TARGETS = (1e-3, 1e-6)  # relative errors at which the solvers are compared


class SpringPendulum(jaxdae.LagrangianSystem):
    """A point mass `m1` on a massless rod of unit length (`Φ = |p₁|² − 1`), carrying a
    second mass `m2` on a spring–damper of rest length `rest`, stiffness `k` and damping `c`;
    gravity along −y. `q = (p₁, p₂)`."""

    m1: jax.Array
    m2: jax.Array
    k: jax.Array
    c: jax.Array
    rest: jax.Array
    gravity: jax.Array

    def __init__(self, m1=1.0, m2=1.0, k=1e6, c=1e3, rest=0.5, gravity=9.81):
        self.m1, self.m2, self.k, self.c, self.rest, self.gravity = (
            jnp.asarray(x, dtype=float) for x in (m1, m2, k, c, rest, gravity)
        )

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.m1 * v[:2] @ v[:2] + 0.5 * self.m2 * v[2:] @ v[2:]

    def potential_energy(self, t, q):
        d = q[2:] - q[:2]
        stretch = jnp.sqrt(d @ d) - self.rest
        return self.gravity * (self.m1 * q[1] + self.m2 * q[3]) + 0.5 * self.k * stretch**2

    def generalized_forces(self, t, q, v):
        d = q[2:] - q[:2]
        axis = d / jnp.sqrt(d @ d)
        damping = -self.c * ((v[2:] - v[:2]) @ axis) * axis  # on the second mass
        return jnp.concatenate([-damping, damping])

    def constraints(self, t, q):
        return jnp.array([q[:2] @ q[:2] - 1.0])


def spring_case(k=1e6, c=1e3):
    system = SpringPendulum(k=k, c=c)
    p1 = jnp.array([jnp.sin(jnp.pi / 3), -jnp.cos(jnp.pi / 3)])
    q0 = jnp.concatenate([p1, p1 + jnp.array([0.1, -0.5])])
    return system, jaxdae.Baumgarte(10.0, 25.0), q0, jnp.zeros(4), "m1"


def arm_case():
    system = jaxdae.examples.CartesianArmLagrangian(forces=(0.0, -9.81, 0.0, -9.81))
    return system, jaxdae.Baumgarte(2000.0, 1e6), *system.initial_state(), "masses"


CASES = {
    "spring pendulum (k = 1e6)": spring_case,
    "spring pendulum (k = 1e8)": lambda: spring_case(k=1e8, c=1e4),
    "Cartesian arm, Baumgarte(2000, 1e6)": arm_case,
}


def solvers(rtol, atol):
    return {
        "Tsit5": diffrax.Tsit5(),
        "Dopri5": diffrax.Dopri5(),
        "Dopri8": diffrax.Dopri8(),
        "Kvaerno5 (configured)": jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol, atol),
        "GeneralizedAlpha": jaxdae.GeneralizedAlpha(),
        "Rodas5P": jaxdae.Rodas5P(),
    }


EXPLICIT = ("Tsit5", "Dopri5", "Dopri8")


class SpringChain(jaxdae.LagrangianSystem):
    """`num` unit point masses in the plane joined by spring–dampers of rest length 1,
    stiffness `k` and damping `c` (a stiff rope or a chain of links on stiff bushings), the
    first on a rigid rod of unit length from the origin (`Φ = |p₁|² − 1`); gravity along −y.
    `q = (p₁, …, p_num)`: `2 num` coordinates, `4 num` states."""

    num: int = eqx.field(static=True)
    k: jax.Array
    c: jax.Array
    gravity: jax.Array

    def __init__(self, num=16, k=1e8, c=1e4, gravity=9.81):
        self.num = num
        self.k, self.c, self.gravity = (jnp.asarray(x, dtype=float) for x in (k, c, gravity))

    def _links(self, x):
        p = x.reshape(self.num, 2)
        return p[1:] - p[:-1]

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        stretch = jnp.sqrt(jnp.sum(self._links(q) ** 2, axis=1)) - 1.0
        return self.gravity * jnp.sum(q[1::2]) + 0.5 * self.k * jnp.sum(stretch**2)

    def generalized_forces(self, t, q, v):
        d = self._links(q)
        axis = d / jnp.sqrt(jnp.sum(d**2, axis=1))[:, None]
        force = -self.c * jnp.sum(self._links(v) * axis, axis=1)[:, None] * axis  # on p_{i+1}
        return jnp.zeros((self.num, 2)).at[1:].add(force).at[:-1].add(-force).reshape(-1)

    def constraints(self, t, q):
        return jnp.array([q[:2] @ q[:2] - 1.0])


def chain_case(num=16, k=1e8, c=1e4):
    """The chain released from rest, its links at the angles `0.6 cos(0.7 i) + 0.3` from
    the downward vertical (unstretched)."""
    system = SpringChain(num, k, c)
    angles = 0.6 * np.cos(0.7 * np.arange(num)) + 0.3
    q0 = jnp.asarray(np.cumsum(np.stack([np.sin(angles), -np.cos(angles)], 1), 0).reshape(-1))
    return system, jaxdae.Baumgarte(10.0, 25.0), q0, jnp.zeros(2 * num), "k"


def governor_case():
    """The stiff flyball governor (IFToMM A05) of `experiments/examples/flyball_governor.py`: 4
    rigid bodies in absolute coordinates (28 coordinates, 56 states), spring–dampers
    `K = 8·10⁵`, `C = 4·10⁴` (time constant 0.1 ms), `Baumgarte(20, 100)`."""
    from jaxdae.examples import _flyball_governor as flyball_governor

    model = flyball_governor.governor()
    q0, v0 = flyball_governor.initial_state(model)
    return model, jaxdae.Baumgarte(20.0, 100.0), q0, v0, None


RTOLS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9)
# case: (make, horizon, solvers, tolerances, timed calls). The governor, over the
# benchmark's 10 s (its explicit solves take seconds), is run at fewer tolerances, timed
# once after compiling, and Tsit5 and Dopri8 stand for the explicit solvers; it leaves out
# the configured Kvaerno5 (a step of its dense 56-state Jacobian costs milliseconds).
LARGE_CASES = {
    "spring chain, 16 masses (k = 1e8)": (
        chain_case,
        1.0,
        EXPLICIT + ("GeneralizedAlpha", "Rodas5P", "Kvaerno5 (configured)"),
        RTOLS[1:],
        5,
    ),
    "flyball governor (A05)": (
        governor_case,
        10.0,
        ("Tsit5", "Dopri8", "GeneralizedAlpha", "Rodas5P"),
        (1e-3, 1e-4, 1e-5, 1e-6, 1e-7),
        1,
    ),
}


def all_cases(quick, only=None):
    """`case: (make, horizon, solvers, tolerances, repeats)`, those whose names contain one
    of `only` (all by default)."""
    cases = {case: (make, T1, tuple(solvers(1e-6, 1e-9)), RTOLS, 5) for case, make in CASES.items()}
    cases.update(LARGE_CASES)
    if quick:
        cases = {
            case: (make, min(t1, 0.2) if case in LARGE_CASES else t1, names, (1e-3, 1e-5, 1e-7), 3)
            for case, (make, t1, names, _, _) in cases.items()
        }
    return {
        case: spec
        for case, spec in cases.items()
        if only is None or any(part in case for part in only)
    }


def solve_fn(system, formulation, name, ts=None, t1=T1):
    """The jitted solve `(q0, v0, rtol, atol) -> Solution` with solver `name` of `solvers`:
    the tolerances are traced, so one compile serves every tolerance."""

    @jax.jit
    def solve(q0, v0, rtol, atol):
        return jaxdae.simulate(
            system,
            formulation,
            0.0,
            t1,
            q0,
            v0,
            ts=ts,
            solver=solvers(rtol, atol)[name],
            rtol=rtol,
            atol=atol,
            max_steps=400_000,
            throw=False,
        )

    return solve


def timed(solve, *args, repeats=5):
    """The solution and the best CPU time (`time.process_time`) of `repeats` calls (after
    one to compile)."""
    sols, best = timed_interleaved({"": solve}, args, repeats)
    return sols[""], best[""]


def timed_interleaved(solves: dict, args, repeats=5):
    """Each solve's solution and best CPU time of `repeats` calls, the solves called in
    turn (after one call each to compile), so that a change of the machine's load affects
    all alike."""
    sols = {name: jax.block_until_ready(solve(*args)) for name, solve in solves.items()}
    best = dict.fromkeys(solves, np.inf)
    for _ in range(repeats):
        for name, solve in solves.items():
            start = time.process_time()
            jax.block_until_ready(solve(*args))
            best[name] = min(best[name], time.process_time() - start)
    return sols, best


def median_walls(fns: dict, args, calls: int) -> dict:
    """Each compiled function's median wall time of `calls` calls, the functions called in
    turn, so that a change of the machine's load affects all alike."""
    walls = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            walls[name].append(time.perf_counter() - start)
    return {name: float(np.median(w)) for name, w in walls.items()}


def stats(sol, wall):
    return dict(
        steps=int(sol.stats["num_accepted_steps"]),
        rejected=int(sol.stats["num_rejected_steps"]),
        time_ms=1e3 * wall,
        succeeded=bool(sol.succeeded),
    )


def configuration_study(quick):
    """Study 1: Kvaerno5 as diffrax builds it, configured, and Tsit5."""
    import optimistix as optx

    rows = []
    arm = jaxdae.examples.TwoLinkManipulator()
    q0, v0 = arm.initial_state()
    runs = [
        (
            f"two-link arm, ModifiedLagrange(α = {alpha:g})",
            arm,
            jaxdae.ModifiedLagrange(alpha, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0])),
            q0,
            v0,
            1e-6,
            1e-8,
        )
        for alpha in ((10.0,) if quick else (10.0, 1e3, 1e5))
    ]
    system, formulation, q0, v0, _ = spring_case()
    runs.append(("spring pendulum (k = 1e6)", system, formulation, q0, v0, 1e-6, 1e-9))
    for label, system, formulation, q0, v0, rtol, atol in progress(
        runs, "configuration", unit="case"
    ):
        # the formulation's ODE solved by `diffrax.diffeqsolve` itself: `simulate` would
        # configure the `VeryChord` of Kvaerno5 as diffrax builds it
        term = diffrax.ODETerm(_ode(system, formulation))
        for name, solver in (
            ("Tsit5", diffrax.Tsit5()),
            ("Kvaerno5 (diffrax's VeryChord)", diffrax.Kvaerno5()),
            (
                "Kvaerno5 (configure_implicit)",
                jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol, atol),
            ),
        ):
            solve = jax.jit(
                lambda y0, solver=solver, term=term, rtol=rtol, atol=atol: diffrax.diffeqsolve(
                    term,
                    solver,
                    0.0,
                    T1,
                    None,
                    y0,
                    max_steps=200_000,
                    throw=False,
                    stepsize_controller=diffrax.PIDController(
                        rtol=rtol, atol=atol, norm=optx.rms_norm
                    ),
                )
            )
            sol, wall = timed(
                solve, jnp.concatenate([q0, v0]), repeats=1 if "VeryChord" in name else 5
            )
            rows.append(
                dict(
                    case=label,
                    solver=name,
                    rtol=rtol,
                    atol=atol,
                    steps=int(sol.stats["num_accepted_steps"]),
                    rejected=int(sol.stats["num_rejected_steps"]),
                    time_ms=1e3 * wall,
                    succeeded=bool(sol.result == diffrax.RESULTS.successful),
                )
            )
    return rows


def work_precision(quick, only=None):
    """Study 2: error against steps and time for each solver and tolerance (the solvers of
    a case timed in turn at each tolerance)."""
    results = {}
    for case, (make, t1, names, rtols, repeats) in all_cases(quick, only).items():
        system, formulation, q0, v0, _ = make()
        ts = jnp.linspace(0.0, t1, 41)
        reference = jaxdae.simulate(
            system, formulation, 0.0, t1, q0, v0, ts=ts, rtol=1e-12, atol=1e-14, max_steps=10**7
        ).q
        scale = float(jnp.max(jnp.abs(reference)))
        solves = {name: solve_fn(system, formulation, name, ts, t1) for name in names}
        rows = []
        for rtol in progress(rtols, case, unit="tolerance"):
            atol = 1e-3 * rtol
            sols, walls = timed_interleaved(
                solves, (q0, v0, jnp.asarray(rtol), jnp.asarray(atol)), repeats
            )
            for name, sol in sols.items():
                error = float(jnp.max(jnp.abs(sol.q - reference))) / scale
                rows.append(
                    dict(
                        solver=name,
                        rtol=rtol,
                        atol=atol,
                        error=error,
                        t1=t1,
                        max_phi=float(jnp.max(jnp.abs(sol.phi))),
                        **stats(sol, walls[name]),
                    )
                )
        results[case] = rows
    return results


def at_target(rows, target):
    """Per solver, its run with the fewest steps among those with an error at most `target`
    (by steps, not time: the times are noisy)."""
    best = {}
    for row in rows:
        if (
            row["error"] <= target
            and row["succeeded"]
            and (row["solver"] not in best or row["steps"] < best[row["solver"]]["steps"])
        ):
            best[row["solver"]] = row
    return best


GRADIENT_MAX_STEPS = 200_000


ESDIRK_BY_AUTODIFF = "Kvaerno5 (configured), eqx.filter_vjp of each step"


@contextlib.contextmanager
def esdirk_steps_by_autodiff(active: bool):
    """Within it, if `active`, `ReplayAdjoint` differentiates the steps of diffrax's
    ESDIRKs (Kvaerno5) by `eqx.filter_vjp` of the solver's step rather than by their
    written-out derivative (read when a gradient is traced)."""
    from jaxdae._integration._autodiff_step import autodiff_step_vjp
    from jaxdae._integration._step_adjoints import step_vjp

    written = step_vjp.dispatch(diffrax.AbstractESDIRK)
    if active:
        step_vjp.register(diffrax.AbstractESDIRK, autodiff_step_vjp)
    try:
        yield
    finally:
        step_vjp.register(diffrax.AbstractESDIRK, written)


def gradient_runs(rtol):
    """The gradient study's solvers and adjoints: `(name, solver, adjoint)`, the default
    adjoint (None) and, for the implicit solvers, diffrax's loop with one checkpoint per
    step and with the 32 checkpoints that were its default for them; for Kvaerno5 also
    the default adjoint with `eqx.filter_vjp` of each step (`ESDIRK_BY_AUTODIFF`)."""
    implicit = solvers(rtol, 1e-3 * rtol)
    every_step = diffrax.RecursiveCheckpointAdjoint(checkpoints=GRADIENT_MAX_STEPS)
    thirty_two = diffrax.RecursiveCheckpointAdjoint(checkpoints=32)
    runs = [("Tsit5", diffrax.Tsit5(), None)]
    for name in ("Kvaerno5 (configured)", "GeneralizedAlpha", "Rodas5P"):
        runs += [
            (name, implicit[name], None),
            (f"{name}, diffrax's loop, a checkpoint per step", implicit[name], every_step),
            (f"{name}, diffrax's loop, 32 checkpoints", implicit[name], thirty_two),
        ]
    runs.insert(2, (ESDIRK_BY_AUTODIFF, implicit["Kvaerno5 (configured)"], None))
    return tuple(runs)


def mass_solve(parts, t1, mass, solver, adjoint, rtol):
    """The solve of the gradient studies' loss: the case `parts = make()` (a `CASES` value)
    over `[0, t1]` with its first mass (or the mass of its first body) set to `mass`, at
    `rtol` (`atol = 10⁻³ rtol`), through `solver` and `adjoint`."""
    system, formulation, q0, v0, field = parts
    value = mass if field == "m1" else jnp.stack([mass, system.masses[1]])
    model = eqx.tree_at(lambda s: getattr(s, field), system, value)
    return jaxdae.simulate(
        model,
        formulation,
        0.0,
        t1,
        q0,
        v0,
        solver=solver,
        rtol=rtol,
        atol=1e-3 * rtol,
        max_steps=GRADIENT_MAX_STEPS,
        adjoint=adjoint,
    )


def gradients(quick, only=None, solvers_only=None):
    """Study 3: d q_final[0] / d mass through each solver and adjoint (`gradient_runs`; the
    cases whose names contain one of `only`, the runs whose names contain one of
    `solvers_only`; all by default),
    against central differences of the same solver and of a reference (Tsit5 at rtol
    1e-12), and its wall time against the forward solve's: the jitted gradient and the
    jitted forward solve called in turn, median of three, in one process; and the time to
    compile each (`jax.jit(...).lower(...).compile()`)."""
    rows = []
    t1 = 0.5 if quick else 1.0
    rtol = 1e-8
    for case, make in list(CASES.items())[::2]:
        if only is not None and not any(part in case for part in only):
            continue
        parts = make()

        def loss(mass, solver, adjoint, parts=parts, rtol=rtol):
            sol = mass_solve(parts, t1, mass, solver, adjoint, rtol)
            return sol.q_final[0], sol.stats["num_accepted_steps"]

        mass, eps = jnp.asarray(1.0), 1e-4
        reference = float(
            (
                loss(mass + eps, diffrax.Tsit5(), None, rtol=1e-12)[0]
                - loss(mass - eps, diffrax.Tsit5(), None, rtol=1e-12)[0]
            )
            / (2 * eps)
        )
        runs = [
            run
            for run in gradient_runs(rtol)
            if solvers_only is None or any(part in run[0] for part in solvers_only)
        ]
        for name, solver, adjoint in progress(runs, case, unit="solver"):
            compile_s = {}
            fns = {}
            for label, fn in (
                (
                    "grad",
                    jax.jit(
                        jax.grad(
                            lambda m, solver=solver, adjoint=adjoint: loss(m, solver, adjoint)[0]
                        )
                    ),
                ),
                ("forward", jax.jit(lambda m, solver=solver: loss(m, solver, None))),
            ):
                start = time.perf_counter()
                with esdirk_steps_by_autodiff(name == ESDIRK_BY_AUTODIFF):
                    fns[label] = fn.lower(mass).compile()
                compile_s[label] = time.perf_counter() - start
            grad_fn, forward_fn = fns["grad"], fns["forward"]
            grad = float(grad_fn(mass))
            steps = int(jax.block_until_ready(forward_fn(mass))[1])
            walls = median_walls({"grad": grad_fn, "forward": forward_fn}, (mass,), 3)
            central = float((forward_fn(mass + eps)[0] - forward_fn(mass - eps)[0]) / (2 * eps))
            grad_s, forward_s = walls["grad"], walls["forward"]
            rows.append(
                dict(
                    case=case,
                    solver=name,
                    rtol=rtol,
                    steps=steps,
                    gradient=grad,
                    central=central,
                    relative_difference=abs(grad - central) / abs(central),
                    reference=reference,
                    error_vs_reference=abs(grad - reference) / abs(reference),
                    time_ms=1e3 * grad_s,
                    forward_ms=1e3 * forward_s,
                    ratio=grad_s / forward_s,
                    compile_gradient_s=compile_s["grad"],
                    compile_forward_s=compile_s["forward"],
                )
            )
    return rows


def gradient_segments(quick):
    """GeneralizedAlpha's default adjoint with its states kept in segments of 1,024 and
    4,096 steps and in one segment, and in segments of 1,024 with a new matrix of each
    step's adjoint equations at every step (no refinement with a kept one): the gradient
    of study 3 and its wall time against the forward solve's (called in turn in one
    process, median of three)."""
    from jaxdae._integration import _generalized_alpha_adjoint as ga_adjoint
    from jaxdae._integration._generalized_alpha_adjoint import GeneralizedAlphaAdjoint

    rows = []
    t1, rtol = (0.5 if quick else 1.0), 1e-8
    for case, make in list(CASES.items())[::2]:
        parts = make()

        def loss(mass, adjoint, parts=parts):
            return mass_solve(parts, t1, mass, jaxdae.GeneralizedAlpha(), adjoint, rtol).q_final[0]

        mass = jnp.asarray(1.0)
        fns = {"forward": jax.jit(lambda m, loss=loss: loss(m, None))}
        for stored in (1024, 4096, GRADIENT_MAX_STEPS):
            adjoint = GeneralizedAlphaAdjoint(stored_steps=stored)
            fns[stored] = jax.jit(jax.grad(lambda m, loss=loss, a=adjoint: loss(m, a)))
        every_step = "1024, a new matrix at every step"
        fns[every_step] = jax.jit(jax.grad(lambda m, loss=loss: loss(m, None)))
        kept = ga_adjoint._REFINE_ITERATIONS
        ga_adjoint._REFINE_ITERATIONS = 0  # read when the gradient is traced, here
        try:
            values = {every_step: float(fns[every_step](mass))}
        finally:
            ga_adjoint._REFINE_ITERATIONS = kept
        values.update({k: float(fn(mass)) for k, fn in fns.items() if k != every_step})
        walls = median_walls(fns, (mass,), 3)
        forward = walls["forward"]
        rows += [
            dict(
                case=case,
                stored_steps=k,
                gradient=values[k],
                time_ms=1e3 * walls[k],
                forward_ms=1e3 * forward,
                ratio=walls[k] / forward,
            )
            for k in fns
            if k != "forward"
        ]
    return rows


DISCRETE_STEPS = "ReplayAdjoint(stored_steps=4096), each step by its discrete adjoint"


@contextlib.contextmanager
def discrete_step_adjoint(active: bool):
    """Within it, if `active`, `ReplayAdjoint` differentiates every Rodas5P step by its
    discrete adjoint, whatever the number of states (`ROSENBROCK_ADJOINT_MIN`, read when a
    gradient is traced)."""
    kept = _thresholds.ROSENBROCK_ADJOINT_MIN
    if active:
        _thresholds.ROSENBROCK_ADJOINT_MIN = 0
    try:
        yield
    finally:
        _thresholds.ROSENBROCK_ADJOINT_MIN = kept


def replay_segments(quick, only=None):
    """Rodas5P's default adjoint (`jaxdae.ReplayAdjoint`) keeping 1,024 and 4,096 steps'
    states at once, the same with every step differentiated by its discrete adjoint (the
    default from `ROSENBROCK_ADJOINT_MIN` states; the cases here have 8), and diffrax's
    loop with one checkpoint per step: the gradient of study 3, its wall time against the forward
    solve's (seven calls of each in turn in one process, medians) and the time to compile
    it."""
    rows = []
    t1, rtol = (0.5 if quick else 1.0), 1e-8
    for case, make in list(CASES.items())[::2]:
        if only is not None and not any(part in case for part in only):
            continue
        parts = make()

        def loss(mass, adjoint, parts=parts):
            return mass_solve(parts, t1, mass, jaxdae.Rodas5P(), adjoint, rtol).q_final[0]

        mass = jnp.asarray(1.0)
        adjoints = {
            "ReplayAdjoint(stored_steps=1024)": jaxdae.ReplayAdjoint(stored_steps=1024),
            "ReplayAdjoint(stored_steps=4096)": jaxdae.ReplayAdjoint(stored_steps=4096),
            DISCRETE_STEPS: jaxdae.ReplayAdjoint(stored_steps=4096),
            "diffrax's loop, a checkpoint per step": diffrax.RecursiveCheckpointAdjoint(
                checkpoints=GRADIENT_MAX_STEPS
            ),
        }
        fns, compile_s = {}, {}
        for label, fn in [("forward", jax.jit(lambda m, loss=loss: loss(m, None)))] + [
            (name, jax.jit(jax.grad(lambda m, loss=loss, a=a: loss(m, a))))
            for name, a in adjoints.items()
        ]:
            start = time.perf_counter()
            with discrete_step_adjoint(label == DISCRETE_STEPS):
                fns[label] = fn.lower(mass).compile()
            compile_s[label] = time.perf_counter() - start
        values = {k: float(fn(mass)) for k, fn in fns.items()}
        walls = median_walls(fns, (mass,), 7)
        forward = walls["forward"]
        rows += [
            dict(
                case=case,
                adjoint=k,
                gradient=values[k],
                time_ms=1e3 * walls[k],
                forward_ms=1e3 * forward,
                ratio=walls[k] / forward,
                compile_s=compile_s[k],
                compile_forward_s=compile_s["forward"],
            )
            for k in adjoints
        ]
    return rows


def _spring_ode(k=1e6, c=1e3):
    """The spring pendulum's ODE `(y, f_jaxdae, f_hand)`: jaxdae's right-hand side of
    `Baumgarte(10, 25)` and the same written out (unit masses, rest length 0.5)."""
    system, formulation, q0, v0, _ = spring_case(k, c)

    def f_jaxdae(t, y, args):
        q, v = y[:4], y[4:]
        return jnp.concatenate([v, formulation.accelerations(system.terms(t, q, v))[0]])

    def f_hand(t, y, args):
        p1, p2, v1, v2 = y[:2], y[2:4], y[4:6], y[6:]
        d = p2 - p1
        axis = d / jnp.sqrt(d @ d)
        force = -(k * (jnp.sqrt(d @ d) - 0.5) + c * ((v2 - v1) @ axis)) * axis
        gravity = jnp.array([0.0, -9.81])
        free = gravity - force
        lam = (2 * p1 @ free + 2 * v1 @ v1 + 20 * p1 @ v1 + 25 * (p1 @ p1 - 1)) / (4 * p1 @ p1)
        return jnp.concatenate([v1, v2, free - 2 * p1 * lam, force + gravity])

    return jnp.concatenate([q0, v0]), f_jaxdae, f_hand


def _best_us(fn, repeats):
    jax.block_until_ready(fn())
    best = np.inf
    for _ in range(repeats):
        start = time.process_time()
        jax.block_until_ready(fn())
        best = min(best, time.process_time() - start)
    return 1e6 * best


def step_costs(quick):
    """Study 4: the cost of the pieces of an implicit step and of whole steps."""
    import lineax as lx

    y0, f_jaxdae, f_hand = _spring_ode()
    count = 2000

    def scanned(g):
        return jax.jit(
            lambda: jax.lax.scan(lambda y, _: (y + 1e-12 * g(y), None), y0, None, length=count)[0]
        )

    def lu(y):
        solver = lx.LU()
        state = solver.init(lx.MatrixLinearOperator(jnp.eye(8) + 1e-3 * jnp.outer(y, y)), {})
        return solver.compute(state, y, {})[0]

    def in_turn(y):
        _, tangent = jax.linearize(lambda y: f_jaxdae(0.0, y, None), y)
        return jnp.stack([tangent(e) for e in jnp.eye(y.size)], 1)[0]

    pieces = {
        "right-hand side (jaxdae)": lambda y: f_jaxdae(0.0, y, None),
        "Jacobian, jax.jacfwd: tangents batched by vmap (jaxdae)": lambda y: jax.jacfwd(
            lambda y: f_jaxdae(0.0, y, None)
        )(y)[0],
        "Jacobian, jax.linearize: tangents in turn (jaxdae)": in_turn,
        "Jacobian, jax.jacfwd (written out)": lambda y: jax.jacfwd(lambda y: f_hand(0.0, y, None))(
            y
        )[0],
        "LU factorization + solve, 8 x 8 (lineax)": lu,
    }
    costs = {name: _best_us(scanned(g), 7) / count for name, g in pieces.items()}
    matrix = jax.random.normal(jax.random.PRNGKey(0), (8, 8)) * 0.1
    rtol = 1e-7
    arm, arm_formulation, arm_q0, arm_v0, _ = arm_case()
    odes = {
        "jaxdae": (f_jaxdae, y0),
        "written out": (f_hand, y0),
        "Cartesian arm, Baumgarte(2000, 1e6) (jaxdae)": (
            _ode(arm, arm_formulation),
            jnp.concatenate([arm_q0, arm_v0]),
        ),
        "test ODE A y - 0.01 y^3": (lambda t, y, args: matrix @ y - 0.01 * y**3, jnp.ones(8)),
    }
    per_step = generalized_alpha_step_costs(rtol)
    for label, (fn, y) in odes.items():
        solves = {}
        for name in ("Tsit5", "Kvaerno5 (configured)", LINEAX_KVAERNO, "Rodas5P", LAPACK_RODAS):
            if name == LINEAX_KVAERNO:
                solver = diffrax.Kvaerno5(root_finder=jaxdae.ToleranceChord(rtol, 1e-3 * rtol))
            else:
                solver = solvers(rtol, 1e-3 * rtol)[
                    name.split(" (")[0] if name == LAPACK_RODAS else name
                ]

            def solve(fn=fn, y=y, solver=solver):
                term = diffrax.ODETerm(lambda t, y, args: fn(t, y, args))  # one per variant
                sol = diffrax.diffeqsolve(
                    term,
                    solver,
                    0.0,
                    T1,
                    1e-4,
                    y,
                    max_steps=10**6,
                    stepsize_controller=diffrax.PIDController(rtol=rtol, atol=1e-3 * rtol),
                )
                return sol.stats["num_accepted_steps"] + sol.stats["num_rejected_steps"], sol.ys

            solves[name] = jax.jit(_lapack_rodas(solve) if name == LAPACK_RODAS else solve)
        steps = {name: int(solve()[0]) for name, solve in solves.items()}
        _, best = timed_interleaved(solves, (), 3)
        per_step += [
            dict(
                ode=label,
                solver=name,
                steps=steps[name],
                us_per_step=1e6 * best[name] / steps[name],
            )
            for name in solves
        ]
    chord = []
    for rtol in [1e-6] if quick else [1e-6, 1e-7]:
        for kappa in (1e-2, 1e-4):
            solver = jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol, 1e-3 * rtol)
            solver = eqx.tree_at(lambda s: s.root_finder.kappa, solver, kappa)
            sol = jax.jit(
                lambda solver=solver, rtol=rtol: diffrax.diffeqsolve(
                    diffrax.ODETerm(f_hand),
                    solver,
                    0.0,
                    T1,
                    1e-4,
                    y0,
                    max_steps=20_000,
                    saveat=diffrax.SaveAt(steps=True),
                    stepsize_controller=diffrax.PIDController(rtol=rtol, atol=1e-3 * rtol),
                )
            )()
            ts = np.asarray(sol.ts)
            ts = ts[np.isfinite(ts)]
            late = np.diff(ts)[ts[1:] > 0.5]
            chord.append(
                dict(
                    rtol=rtol,
                    kappa=kappa,
                    steps=int(sol.stats["num_accepted_steps"]),
                    rejected=int(sol.stats["num_rejected_steps"]),
                    median_step_after_half_second=float(np.median(late)),
                )
            )
    return dict(pieces_us=costs, per_step=per_step, chord_tolerance=chord, lu_us=lu_costs(quick))


def generalized_alpha_step_costs(rtol, repeats=3):
    """CPU time per step (accepted and rejected) of `GeneralizedAlpha` and Tsit5 on the
    spring pendulums (`k = 10⁶`, `10⁸`) through `jaxdae.simulate` (the generalized-α
    method integrates the index-3 equations, not an ODE), the two called in turn, and
    the Newton matrices the generalized-α solve built over its accepted steps."""
    import optimistix as optx

    rows = []
    for label, (k, c) in (
        ("spring pendulum (k = 1e6)", (1e6, 1e3)),
        ("spring pendulum (k = 1e8)", (1e8, 1e4)),
    ):
        system, formulation, q0, v0, _ = spring_case(k, c)
        solves = {
            name: solve_fn(system, formulation, name) for name in ("Tsit5", "GeneralizedAlpha")
        }
        args = (q0, v0, jnp.asarray(rtol), jnp.asarray(1e-3 * rtol))
        sols, best = timed_interleaved(solves, args, repeats)
        controller = diffrax.PIDController(rtol=rtol, atol=1e-3 * rtol, norm=optx.rms_norm)
        steps_only = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: y),
            jaxdae.GeneralizedAlpha(),
            0.0,
            T1,
            None,
            (q0, v0),
            args=(system, formulation, None),
            max_steps=400_000,
            saveat=diffrax.SaveAt(t1=True, solver_state=True),
            stepsize_controller=controller,
        )
        builds = int(steps_only.solver_state[3].builds)
        for name, sol in sols.items():
            steps = int(sol.stats["num_accepted_steps"] + sol.stats["num_rejected_steps"])
            row = dict(
                ode=f"{label}, jaxdae.simulate",
                solver=name,
                steps=steps,
                us_per_step=1e6 * best[name] / steps,
            )
            if name == "GeneralizedAlpha":
                row["matrices_built"] = builds
            rows.append(row)
    return rows


LAPACK_RODAS = "Rodas5P (LAPACK LU, tangents batched by vmap)"
# Kvaerno5 with the chord iteration through lineax (`diffrax.VeryChord`'s, with jaxdae's
# stopping test), for comparison with `configure_implicit`'s `FusedChord`
LINEAX_KVAERNO = "Kvaerno5 (ToleranceChord: lineax solves)"


def _lapack_rodas(fn):
    """`fn` traced with Rodas5P's LU by LAPACK (`getrf`, `trsm`) at every size (neither
    unrolled nor looped) and the Jacobian's tangents batched by `jax.vmap`, for comparison
    with the defaults."""
    names = ("LU_UNROLL_MAX", "LOOPED_INVERSE_MAX", "TANGENT_LOOP_MAX")

    def traced(*args):
        saved = [getattr(_thresholds, name) for name in names]
        for name in names:
            setattr(_thresholds, name, 0)
        try:
            return fn(*args)
        finally:
            for name, value in zip(names, saved, strict=True):
                setattr(_thresholds, name, value)

    return traced


def lu_costs(quick):
    """An `n × n` LU factorization and nine solves with it (a Rodas5P step's linear
    algebra) by `jax.scipy.linalg.lu_factor`/`lu_solve`, by lineax's `LU` and by jaxdae's
    `lu_factor`/`lu_solve` (unrolled up to 16 rows, the others' LAPACK beyond), each inside
    a `lax.scan` of repetitions, for n = 4 … 128."""
    import lineax as lx

    from jaxdae._compilation._linalg import lu_factor, lu_solve

    rows = []
    for n in (4, 16, 64) if quick else (4, 8, 16, 32, 64, 128):
        count = max(20, 20_000 // n**2 * 4)
        base = jnp.eye(n) + 0.1 * jax.random.normal(jax.random.PRNGKey(n), (n, n)) / np.sqrt(n)
        b = jnp.ones(n)

        def scipy_lu(x, base=base, b=b, n=n):
            lu = jax.scipy.linalg.lu_factor(base + 1e-9 * x[0] * jnp.eye(n))
            for _ in range(9):
                x = x + 1e-12 * jax.scipy.linalg.lu_solve(lu, b)
            return x

        def lineax_lu(x, base=base, b=b, n=n):
            solver = lx.LU()
            state = solver.init(lx.MatrixLinearOperator(base + 1e-9 * x[0] * jnp.eye(n)), {})
            for _ in range(9):
                x = x + 1e-12 * solver.compute(state, b, {})[0]
            return x

        def unrolled_lu(x, base=base, b=b, n=n):
            factors = lu_factor(base + 1e-9 * x[0] * jnp.eye(n))
            for _ in range(9):
                x = x + 1e-12 * lu_solve(factors, b)
            return x

        row = {"n": n}
        for label, g in (
            ("jax.scipy.linalg", scipy_lu),
            ("lineax.LU", lineax_lu),
            ("lu_factor", unrolled_lu),
        ):
            fn = jax.jit(
                lambda g=g, b=b, count=count: jax.lax.scan(
                    lambda x, _: (g(x), None), b, None, length=count
                )[0]
            )
            row[label] = _best_us(fn, 5) / count
        rows.append(row)
    return rows


def _fewest_steps(rows, target=1e-6):
    """Per code, the run with the fewest steps whose error is at most `target`."""
    return {
        code: min(
            (r for r in rows if r["code"] == code and r["error"] <= target),
            key=lambda r: r["steps"],
            default=None,
        )
        for code in dict.fromkeys(r["code"] for r in rows)
    }


def _ode(system, formulation):
    """The formulation's ODE `f(t, y, args)` in `y = (q, v)`, as `simulate` integrates it."""

    def f(t, y, args):
        n = y.size // 2
        q, v = y[:n], y[n:]
        return jnp.concatenate([v, formulation.accelerations(system.terms(t, q, v))[0]])

    return f


def _sundials_callbacks(f, jac):
    """SUNDIALS' callbacks `rhs(t, y, yp)` and `jacobian(t, y, yp, matrix)`, which fill
    their last argument (scikit-sundae counts the arguments: no defaults)."""

    def rhs(t, y, yp):
        yp[:] = np.asarray(f(t, y))

    def jacobian(t, y, yp, matrix):
        matrix[:, :] = np.asarray(jac(t, y))

    return rhs, jacobian


def crosscheck(quick):
    """Study 5: the ODEs of the three small stiff cases (`CASES`) solved by independent
    stiff codes — scipy's Radau (Radau IIA, order 5) and BDF with the exact Jacobian,
    SUNDIALS' CVODE (BDF, `scikit-sundae`, when installed) — and by diffrax with Tsit5,
    Dopri8, Rodas5P and the configured Kvaerno5, at rtol 1e-3 … 1e-8 (atol 1e-3 rtol):
    accepted steps and the error in `q` (41 times, relative to max |q_ref|) against Dopri8
    at rtol 1e-13. Then the double pendulum with its spring made rigid (a second
    constraint, from the spring pendulum's state at t = 0.05 s, after the spring's
    transient), for the steps that the slow motion alone needs."""
    import scipy.integrate

    try:
        from sksundae.cvode import CVODE
    except ImportError:
        CVODE = None
    rtols = (1e-4, 1e-6) if quick else (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
    ts = np.linspace(0.0, T1, 41)
    out = {}
    for case, make in CASES.items():
        system, formulation, q0, v0, _ = make()
        f_ode = _ode(system, formulation)
        y0 = jnp.concatenate([q0, v0])
        n = q0.size
        term = diffrax.ODETerm(f_ode)
        reference = np.asarray(
            diffrax.diffeqsolve(
                term,
                diffrax.Dopri8(),
                0.0,
                T1,
                1e-6,
                y0,
                saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
                max_steps=10**7,
                stepsize_controller=diffrax.PIDController(rtol=1e-13, atol=1e-15),
            ).ys
        )
        scale = np.max(np.abs(reference[:, :n]))
        f = jax.jit(lambda t, y, f_ode=f_ode: f_ode(t, y, None))
        jac = jax.jit(jax.jacfwd(lambda t, y, f_ode=f_ode: f_ode(t, y, None), argnums=1))
        rows = []
        for rtol in progress(rtols, f"crosscheck {case}", unit="tolerance"):
            atol = 1e-3 * rtol

            def record(
                code, steps, ys, rtol=rtol, n=n, reference=reference, scale=scale, rows=rows
            ):
                error = float(np.max(np.abs(np.asarray(ys)[:, :n] - reference[:, :n])) / scale)
                rows.append({"code": code, "rtol": rtol, "steps": int(steps), "error": error})

            for method in ("Radau", "BDF"):
                sol = scipy.integrate.solve_ivp(
                    lambda t, y, f=f: np.asarray(f(t, y)),
                    (0.0, T1),
                    np.asarray(y0),
                    method=method,
                    jac=lambda t, y, jac=jac: np.asarray(jac(t, y)),
                    rtol=rtol,
                    atol=atol,
                    dense_output=True,
                )
                record(f"scipy {method}", len(sol.t) - 1, sol.sol(ts).T)
            if CVODE is not None:
                rhs, jacobian = _sundials_callbacks(f, jac)

                def cvode(span, rtol=rtol, atol=atol, rhs=rhs, jacobian=jacobian, y0=y0):
                    return CVODE(
                        rhs, rtol=rtol, atol=atol, jacfn=jacobian, max_num_steps=10**6
                    ).solve(span, np.asarray(y0))

                record("SUNDIALS CVODE (BDF)", len(cvode(np.array([0.0, T1])).t) - 1, cvode(ts).y)
            for name, solver in (
                ("Tsit5", diffrax.Tsit5()),
                ("Dopri8", diffrax.Dopri8()),
                ("Rodas5P", jaxdae.Rodas5P()),
                (
                    "Kvaerno5 (configured)",
                    jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol, atol),
                ),
            ):
                sol = diffrax.diffeqsolve(
                    term,
                    solver,
                    0.0,
                    T1,
                    None,
                    y0,
                    saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
                    max_steps=400_000,
                    throw=False,
                    stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
                )
                record(f"diffrax {name}", sol.stats["num_accepted_steps"], sol.ys)
        out[case] = {"runs": rows, "fewest_steps_at_1e-6": _fewest_steps(rows)}
    out["rigid double pendulum"] = _rigid_double_pendulum(rtols)
    out["Rodas5P local error at t = 1 s"] = local_error_split()
    return out


def local_error_split(t0=1.0, rtol=1e-6, atol=1e-9):
    """One Rodas5P step of the spring pendulum (`k = 10⁶`, the ODE written out) from the
    exact state at `t0`, for h = 1 … 16 ms: its error estimate and its true local error
    (against Dopri8 at rtol 1e-14), each in the controller's RMS norm (relative to
    `atol + rtol |y|`) and split along the eigenvectors of `∂f/∂y` at `t0` into the
    stiff modes (the axial oscillation of the spring, `|λ| > 200`) and the others."""
    y0, _, f_hand = _spring_ode()
    term = diffrax.ODETerm(f_hand)

    def exact(y, start, h):
        return diffrax.diffeqsolve(
            term,
            diffrax.Dopri8(),
            start,
            start + h,
            1e-7,
            y,
            max_steps=10**6,
            stepsize_controller=diffrax.PIDController(rtol=1e-14, atol=1e-16),
        ).ys[-1]

    y = exact(y0, 0.0, t0)
    eigenvalues, vectors = np.linalg.eig(np.asarray(jax.jacfwd(lambda x: f_hand(t0, x, None))(y)))
    inverse = np.linalg.inv(vectors)
    stiff = np.abs(eigenvalues) > 200

    def split(e, scale):
        modes = inverse @ np.asarray(e)
        part = lambda mask: np.real(vectors[:, mask] @ modes[mask]) / scale  # noqa: E731
        rms = lambda x: float(np.sqrt(np.mean(x**2)))  # noqa: E731
        return rms(np.asarray(e) / scale), rms(part(stiff)), rms(part(~stiff))

    rows = []
    for h in (1e-3, 2e-3, 4e-3, 8e-3, 16e-3):
        y1, estimate, *_ = jaxdae.Rodas5P().step(term, t0, t0 + h, y, None, None, False)
        scale = atol + rtol * np.maximum(np.abs(y), np.abs(y1))
        rows.append(
            {"h": h, "estimate": split(estimate, scale), "true": split(y1 - exact(y, t0, h), scale)}
        )
    return {"stiff_eigenvalues": [str(x) for x in eigenvalues[stiff]], "steps": rows}


class RigidDoublePendulum(jaxdae.LagrangianSystem):
    """The spring pendulum with its spring made rigid: unit masses, `|p₁|² = 1`,
    `|p₂ − p₁|² = 0.25`, gravity along −y."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * (q[1] + q[3])

    def constraints(self, t, q):
        d = q[2:] - q[:2]
        return jnp.array([q[:2] @ q[:2] - 1.0, d @ d - 0.25])


def _rigid_double_pendulum(rtols, t0=0.05):
    """Steps and error of Tsit5, Dopri8 and Rodas5P on the rigid double pendulum from the
    spring pendulum's state at `t0` (projected onto the rigid link), over [t0, 2] s."""
    y0, _, f_hand = _spring_ode()
    y = diffrax.diffeqsolve(
        diffrax.ODETerm(f_hand),
        diffrax.Dopri8(),
        0.0,
        t0,
        1e-6,
        y0,
        max_steps=10**6,
        stepsize_controller=diffrax.PIDController(rtol=1e-13, atol=1e-15),
    ).ys[-1]
    p1, p2, v1, v2 = y[:2], y[2:4], y[4:6], y[6:]
    axis = (p2 - p1) / jnp.linalg.norm(p2 - p1)
    q0 = jnp.concatenate([p1, p1 + 0.5 * axis])
    v0 = jnp.concatenate([v1, v2 - ((v2 - v1) @ axis) * axis])
    system, formulation = RigidDoublePendulum(), jaxdae.Baumgarte(10.0, 25.0)
    ts = jnp.linspace(t0, T1, 41)
    reference = jaxdae.simulate(
        system,
        formulation,
        t0,
        T1,
        q0,
        v0,
        ts=ts,
        solver=diffrax.Dopri8(),
        rtol=1e-13,
        atol=1e-15,
        max_steps=10**6,
    ).q
    scale = float(jnp.max(jnp.abs(reference)))
    rows = []
    for name, solver in (
        ("Tsit5", diffrax.Tsit5()),
        ("Dopri8", diffrax.Dopri8()),
        ("Rodas5P", jaxdae.Rodas5P()),
    ):
        for rtol in rtols:
            sol = jaxdae.simulate(
                system,
                formulation,
                t0,
                T1,
                q0,
                v0,
                ts=ts,
                solver=solver,
                rtol=rtol,
                atol=1e-3 * rtol,
                max_steps=10**6,
            )
            rows.append(
                {
                    "code": f"diffrax {name}",
                    "rtol": rtol,
                    "steps": int(sol.stats["num_accepted_steps"]),
                    "error": float(jnp.max(jnp.abs(sol.q - reference))) / scale,
                }
            )
    return {"runs": rows, "fewest_steps_at_1e-6": _fewest_steps(rows)}


def global_error(quick):
    """Study 6: where the error of Rodas5P and the configured Kvaerno5 on the flyball
    governor comes from, at rtol 1e-3 (atol 1e-6) over [0, 10] s ([0, 2] s with --quick).
    (a) Its error in `q` (relative to max |q_ref|, against Tsit5 at rtol 1e-12) at 21 times,
    split into the error of the rods' azimuth (the phase of the free rotation about the
    shaft) and what remains of the rod's position error once the numerical rod is rotated
    back by that phase error. (b) The step's error estimate against its true local error:
    accepted steps sampled evenly along the run, each redone from its own start and
    compared with Tsit5 at rtol 1e-13 from there, both in the controller's RMS norm
    (`atol + rtol max(|y₀|, |y₁|)`)."""
    import optimistix as optx

    system, formulation, q0, v0, _ = governor_case()
    f = _ode(system, formulation)
    term = diffrax.ODETerm(f)
    y0 = jnp.concatenate([q0, v0])
    n, t1, rtol = q0.size, (2.0 if quick else 10.0), 1e-3
    ts = jnp.linspace(0.0, t1, 21)

    def controller(rtol, atol):
        return diffrax.PIDController(rtol=rtol, atol=atol, norm=optx.rms_norm)

    reference = np.asarray(
        diffrax.diffeqsolve(
            term,
            diffrax.Tsit5(),
            0.0,
            t1,
            None,
            y0,
            saveat=diffrax.SaveAt(ts=ts),
            max_steps=10**6,
            stepsize_controller=controller(1e-12, 1e-14),
        ).ys
    )
    scale = np.max(np.abs(reference[:, :n]))
    rod = 14  # rod1's centre (x, y, z): the coordinates of the third body
    out = {}
    for name, solver in (
        ("Rodas5P", jaxdae.Rodas5P()),
        ("Kvaerno5 (configured)", jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol, 1e-3 * rtol)),
    ):

        def run(saveat, solver=solver):
            return diffrax.diffeqsolve(
                term,
                solver,
                0.0,
                t1,
                None,
                y0,
                saveat=saveat,
                max_steps=100_000,
                throw=False,
                stepsize_controller=controller(rtol, 1e-3 * rtol),
            )

        ys = np.asarray(run(diffrax.SaveAt(ts=ts)).ys)
        error = np.max(np.abs(ys[:, :n] - reference[:, :n]), axis=1) / scale
        azimuth = np.unwrap(np.arctan2(ys[:, rod + 1], ys[:, rod]))
        phase = azimuth - np.unwrap(np.arctan2(reference[:, rod + 1], reference[:, rod]))
        c, s = np.cos(-phase), np.sin(-phase)
        back = np.stack(
            [
                c * ys[:, rod] - s * ys[:, rod + 1],
                s * ys[:, rod] + c * ys[:, rod + 1],
                ys[:, rod + 2],
            ],
            1,
        )
        without_phase = np.max(np.abs(back - reference[:, rod : rod + 3]), axis=1) / scale
        steps = run(diffrax.SaveAt(steps=True))
        step_ts = np.asarray(steps.ts)
        kept = np.isfinite(step_ts)
        starts = np.concatenate([[0.0], step_ts[kept]])
        states = np.concatenate([np.asarray(y0)[None], np.asarray(steps.ys)[kept]])
        one_step = jax.jit(
            lambda a, b, y, solver=solver: solver.step(
                term, a, b, y, None, solver.init(term, a, b, y, None), False
            )[:2]
        )
        exact = jax.jit(
            lambda a, b, y: diffrax.diffeqsolve(
                term,
                diffrax.Tsit5(),
                a,
                b,
                None,
                y,
                max_steps=10**6,
                stepsize_controller=controller(1e-13, 1e-15),
            ).ys[-1]
        )
        local = []
        for i in np.linspace(0, len(starts) - 2, 6 if quick else 12).astype(int):
            a, b, y = jnp.asarray(starts[i]), jnp.asarray(starts[i + 1]), jnp.asarray(states[i])
            y1, estimate = one_step(a, b, y)
            weight = 1e-3 * rtol + rtol * np.maximum(np.abs(states[i]), np.abs(np.asarray(y1)))
            rms = lambda e, weight=weight: float(np.sqrt(np.mean((np.asarray(e) / weight) ** 2)))  # noqa: E731
            local.append(
                {
                    "t": float(starts[i]),
                    "h": float(starts[i + 1] - starts[i]),
                    "estimate": rms(estimate),
                    "true": rms(y1 - exact(a, b, y)),
                }
            )
        late = slice(2, None)
        growth = np.polyfit(np.log(np.asarray(ts)[late]), np.log(np.abs(phase[late]) + 1e-300), 1)[
            0
        ]
        out[name] = {
            "rtol": rtol,
            "steps": int(steps.stats["num_accepted_steps"]),
            "ts": np.asarray(ts).tolist(),
            "error": error.tolist(),
            "rod_phase_error_rad": phase.tolist(),
            "rod_error_without_phase": without_phase.tolist(),
            "phase_error_growth_exponent": float(growth),
            "local": local,
        }
    return out


STUDIES = (
    "configuration",
    "work_precision",
    "gradients",
    "gradient_segments",
    "replay_segments",
    "step_costs",
    "crosscheck",
    "global_error",
)


def main(out: Path, quick: bool = False, studies=STUDIES, only=None, solvers_only=None) -> dict:
    folder = output_dir(out, NAME)
    configuration = configuration_study(quick) if "configuration" in studies else []
    precision = work_precision(quick, only) if "work_precision" in studies else {}
    grads = gradients(quick, only, solvers_only) if "gradients" in studies else []
    segments = gradient_segments(quick) if "gradient_segments" in studies else []
    replayed = replay_segments(quick, only) if "replay_segments" in studies else []
    costs = step_costs(quick) if "step_costs" in studies else {}
    checks = crosscheck(quick) if "crosscheck" in studies else {}
    governor = global_error(quick) if "global_error" in studies else {}
    best = {
        f"{target:g}": {case: at_target(rows, target) for case, rows in precision.items()}
        for target in TARGETS
    }
    write_json(
        folder / "summary.json",
        dict(
            target_relative_errors=TARGETS,
            t1=T1,
            configuration=configuration,
            work_precision=precision,
            at_target=best,
            gradients=grads,
            gradient_segments=segments,
            replay_segments=replayed,
            step_costs=costs,
            crosscheck=checks,
            global_error=governor,
        ),
    )
    if precision:
        _plot(folder, precision)

    table = ["| case | solver | steps (rejected) | time [ms] |", "|---|---|---|---|"]
    for row in configuration:
        table.append(
            f"| {row['case']} | {row['solver']} | {row['steps']} ({row['rejected']}) "
            f"| {row['time_ms']:.1f} |"
        )
    table += [
        "",
        "| target | stiff case | solver | rtol | rel. error | steps (rejected) | time [ms] |",
        "|---|---|---|---|---|---|---|",
    ]
    for target, cases in best.items():
        for case, rows in cases.items():
            for name, row in rows.items():
                table.append(
                    f"| {target} | {case} | {name} | {row['rtol']:g} | "
                    f"{row['error']:.1e} | {row['steps']} ({row['rejected']}) | "
                    f"{row['time_ms']:.2f} |"
                )
    table += [
        "",
        "| stiff case | solver | steps | gradient | central difference (same "
        "solver) | rel. diff. | rel. diff. to reference | forward [ms] | gradient [ms] | "
        "gradient / forward | compile: forward, gradient [s] |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in grads:
        table.append(
            f"| {row['case']} | {row['solver']} | {row['steps']} | "
            f"{row['gradient']:.10g} | {row['central']:.8g} | "
            f"{row['relative_difference']:.1e} | {row['error_vs_reference']:.1e} | "
            f"{row['forward_ms']:.2f} | {row['time_ms']:.1f} | {row['ratio']:.1f} | "
            f"{row['compile_forward_s']:.1f}, {row['compile_gradient_s']:.1f} |"
        )
    table += [
        "",
        "| stiff case | GeneralizedAlpha's adjoint, stored steps | gradient | "
        "gradient [ms] | forward [ms] | gradient / forward |",
        "|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['case']} | {r['stored_steps']} | {r['gradient']:.10g} | {r['time_ms']:.1f} "
        f"| {r['forward_ms']:.2f} | {r['ratio']:.1f} |"
        for r in segments
    ]
    table += [
        "",
        "| stiff case | Rodas5P's adjoint | gradient | gradient [ms] | forward [ms] | "
        "gradient / forward | compile: forward, gradient [s] |",
        "|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['case']} | {r['adjoint']} | {r['gradient']:.12g} | {r['time_ms']:.1f} | "
        f"{r['forward_ms']:.2f} | {r['ratio']:.2f} | {r['compile_forward_s']:.1f}, "
        f"{r['compile_s']:.1f} |"
        for r in replayed
    ]
    if costs:
        table += _cost_table(costs)
    for name, result in governor.items():
        table += [
            "",
            f"| governor, {name} at rtol {result['rtol']:g}: t | error | rod phase "
            "error [rad] | rod error without the phase |",
            "|---|---|---|---|",
        ]
        table += [
            f"| {t:g} | {e:.1e} | {p:+.1e} | {w:.1e} |"
            for t, e, p, w in zip(
                result["ts"],
                result["error"],
                result["rod_phase_error_rad"],
                result["rod_error_without_phase"],
                strict=True,
            )
        ][::4]
        table += ["", "| t | h | estimate | true local error |", "|---|---|---|---|"]
        table += [
            f"| {r['t']:.3g} | {r['h']:.2g} | {r['estimate']:.2g} | {r['true']:.2g} |"
            for r in result["local"]
        ]
    for case, result in checks.items():
        if "runs" not in result:
            table += [
                "",
                "| h | estimate (stiff, slow) | true local error (stiff, slow) |",
                "|---|---|---|",
            ]
            table += [
                "| {:g} | {:.2g} ({:.2g}, {:.2g}) | {:.2g} ({:.2g}, {:.2g}) |".format(
                    r["h"], *r["estimate"], *r["true"]
                )
                for r in result["steps"]
            ]
            continue
        table += ["", f"| {case}: code | rtol | steps | rel. error |", "|---|---|---|---|"]
        table += [
            f"| {r['code']} | {r['rtol']:g} | {r['steps']} | {r['error']:.1e} |"
            for r in result["runs"]
        ]
    headline = _headline(configuration, best)
    print("\n".join(table))
    print(headline)
    return dict(
        headline=headline,
        table=table,
        figures=[
            figure(
                folder / "work_precision.png",
                "relative error against accepted steps and CPU time for explicit (Tsit5, Dopri5, "
                "Dopri8) and implicit (configured Kvaerno5, GeneralizedAlpha, Rodas5P) solvers on "
                "the stiff cases",
            )
        ],
    )


def _cost_table(costs) -> list[str]:
    table = ["", "| piece of an implicit step (spring pendulum) | µs |", "|---|---|"]
    table += [f"| {name} | {us:.2f} |" for name, us in costs["pieces_us"].items()]
    table += ["", "| ODE | solver | steps (incl. rejected) | µs per step |", "|---|---|---|---|"]
    table += [
        f"| {r['ode']} | {r['solver']} | {r['steps']} | {r['us_per_step']:.1f} |"
        for r in costs["per_step"]
    ]
    table += [
        "",
        "| rtol | kappa | steps (rejected) | median step for t > 0.5 s |",
        "|---|---|---|---|",
    ]
    table += [
        f"| {r['rtol']:g} | {r['kappa']:g} | {r['steps']} ({r['rejected']}) | "
        f"{r['median_step_after_half_second']:.2e} |"
        for r in costs["chord_tolerance"]
    ]
    table += [
        "",
        "| n | LU + 9 solves, jax.scipy.linalg [µs] | lineax.LU [µs] | lu_factor [µs] |",
        "|---|---|---|---|",
    ]
    table += [
        f"| {r['n']} | {r['jax.scipy.linalg']:.1f} | {r['lineax.LU']:.1f} | {r['lu_factor']:.1f} |"
        for r in costs["lu_us"]
    ]
    return table


def _headline(configuration, best) -> str:
    spring = {r["solver"]: r for r in configuration if r["case"].startswith("spring")}
    parts = []
    if spring:
        before = spring["Kvaerno5 (diffrax's VeryChord)"]
        after = spring["Kvaerno5 (configure_implicit)"]
        parts.append(
            f"Spring pendulum, Kvaerno5: {before['steps']} steps "
            f"({before['rejected']} rejected) as diffrax builds it, {after['steps']} "
            f"({after['rejected']}) configured; Tsit5 {spring['Tsit5']['steps']}."
        )
    for target, cases in best.items():
        for case, rows in cases.items():
            explicit = [r for n, r in rows.items() if n in EXPLICIT]
            if not explicit:
                continue
            fewest = min(explicit, key=lambda r: r["steps"])
            fastest = min(explicit, key=lambda r: r["time_ms"])
            for name in ("Kvaerno5 (configured)", "GeneralizedAlpha", "Rodas5P"):
                if name not in rows:
                    continue
                row = rows[name]
                parts.append(
                    f"{case}, {name} at relative error ≤ {target}: "
                    f"{fewest['steps'] / row['steps']:.1f}× fewer steps than "
                    f"the explicit solver with fewest ({fewest['solver']}), "
                    f"{fastest['time_ms'] / row['time_ms']:.2f}× less time than the "
                    f"fastest ({fastest['solver']})."
                )
    return " ".join(parts)


def _plot(folder: Path, precision: dict) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(
        len(precision), 2, figsize=(10, 4 * len(precision)), layout="constrained", squeeze=False
    )
    for (case, rows), (ax_steps, ax_time) in zip(precision.items(), axes, strict=False):
        for name in dict.fromkeys(r["solver"] for r in rows):
            mine = [r for r in rows if r["solver"] == name and r["succeeded"]]
            errors = [r["error"] for r in mine]
            ax_steps.loglog([r["steps"] for r in mine], errors, "o-", label=name)
            ax_time.loglog([r["time_ms"] for r in mine], errors, "o-", label=name)
        for ax, label in ((ax_steps, "accepted steps"), (ax_time, "CPU time [ms]")):
            ax.xaxis.set_minor_formatter(NullFormatter())
            for target in TARGETS:
                ax.axhline(target, color="gray", ls=":", lw=1)
            ax.set_xlabel(label)
            ax.set_ylabel("relative error")
            ax.set_title(case, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
        legend_below(ax_steps)
    fig.savefig(folder / "work_precision.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    # `--study NAME` (repeatable) runs only those studies, `--case TEXT` (repeatable) only
    # the work-precision and gradient cases whose names contain TEXT, `--solver TEXT`
    # (repeatable) only the gradient runs whose names contain TEXT
    studies = tuple(sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--study")
    only = tuple(sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--case") or None
    solvers_only = tuple(sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--solver") or None
    for flag in ("--study", "--case", "--solver"):
        while flag in sys.argv:
            i = sys.argv.index(flag)
            del sys.argv[i : i + 2]
    args = parse_args(NAME, __doc__)
    main(args.out, args.quick, studies or STUDIES, only, solvers_only)
