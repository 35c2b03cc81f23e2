"""Benchmark: stiff mechanisms against Exudyn's generalized-α and SUNDIALS IDA.

Cases (`--only` takes comma-separated parts of these names):

- `governor`: the stiff flyball governor (IFToMM A05) of
  `experiments/examples/flyball_governor.py` over the benchmark's 10 s: 4 rigid bodies in
  absolute coordinates (Euler parameters), spring–dampers `K = 8·10⁵` N/m, `C = 4·10⁴`
  N·s/m, `Baumgarte(20, 100)` for jaxdae's ODE solvers. Peer: Exudyn, the same bodies,
  joints and spring–dampers (built from jaxdae's model: masses, inertias, markers, initial
  positions and velocities), its generalized-α integrator at fixed steps.
- `chain`: the stiff-integration guide's spring chain (`SpringChain` of
  `experiments/studies/stiff_integration.py`: 16 unit masses in the plane joined by
  spring–dampers `k = 10⁸`, `c = 10⁴`, the first on a rigid rod of unit length), over 1 s.
  Peers: Exudyn (2-D mass points, spring–dampers, a distance constraint) and IDA.
- `spring6`, `spring8`: the guide's spring pendulum, `k = 10⁶` (`c = 10³`) and `10⁸`
  (`c = 10⁴`), over 2 s; `arm`: the guide's Cartesian arm under `Baumgarte(2000, 10⁶)`, over
  2 s. Peer: IDA.

**Accuracy.** Every run is compared with a reference, jaxdae's `Dopri8` at `rtol = 1e-12`
(`atol = 1e-14`), at saved times (the governor: every 0.01 s; the chain: every 0.02 s;
the others: 41 times). The governor's error is the largest deviation, in metres, of the
slider's height and of the two rods' centres of mass (each rod with its point mass); the
others' is the guide's, the largest deviation of any coordinate relative to `max |q_ref|`.
For the governor, Exudyn at h = 2e-4 and 1e-4 s is compared with the reference too (the
two models must agree to within Exudyn's own second-order error), and with their
Richardson extrapolation.

**Targets.** With Exudyn as a peer: Exudyn's error at h = 5e-4 s, that of its most accurate
setting there (a Newton iteration stopped early adds its own error); with IDA: relative
errors of 1e-3 and 1e-6. For each target and each code the cheapest run that reaches it
is chosen from ladders:

- Exudyn: step sizes halving from 2e-3 s (the chain: from 4e-3 s) with its defaults
  (index 3, `ρ∞ = 0.9`, modified Newton to a relative 1e-8; Eigen's dense LU); at 1e-3,
  5e-4 and 2.5e-4 s also with Newton to a relative 1e-6 and with its index-2 constraints
  (which it offers with Newmark's parameters only: `β = ¼`, `γ = ½`);
- IDA (`sksundae.ida.IDA`, dense linear solver, the exact Jacobian): `rtol` 1e-3 … 1e-8
  (`atol = 1e-3 rtol`) in two forms: the stabilized index-2 DAE of Gear, Gupta & Leimkuhler
  (1985) built from jaxdae's terms, `q' = v − Gᵀμ`, `M v' = Q − Gᵀλ`, `0 = Φ̇`, `0 = Φ`
  (`y = (q, v, λ, μ)`, the multipliers left out of the error test by a large `atol`: what an
  IDA user would write, no stabilization gains), and jaxdae's ODE written as the residual
  `y' − f(y)` (the same ODE jaxdae's solvers integrate, gains included). Each residual and
  Jacobian is a jit-compiled JAX function called from SUNDIALS through Python; the time
  spent in those calls is reported;
- jaxdae: `jaxdae.simulate` with `Tsit5`, `Dopri8` (explicit), `Kvaerno5` (configured by
  `simulate`), `Rodas5P` and `GeneralizedAlpha` (implicit) at `rtol` 1e-3 … 1e-9
  (`atol = 1e-3 rtol`), one ahead-of-time compiled solve per solver (the tolerances are
  arguments), its compile time apart; on the cases with Exudyn also `GeneralizedAlpha(0.9)`
  at Exudyn's fixed steps (1e-3, 5e-4, 2.5e-4 s): the same method.

A ladder stops at the first run that reaches the case's tightest target, or after a run
longer than the case's cap (a run's time bounds the cost of the tighter ones). The chosen
runs of a case are then timed again, interleaved, and the median of three is reported
(runs longer than the final cap keep their one timing; the tables say so). Wall time
(`time.perf_counter`): Exudyn's `SolveDynamic` (assembly excluded), IDA's `solve` over the
saved times, jaxdae's compiled call to `block_until_ready`.

    OPENBLAS_NUM_THREADS=1 python experiments/benchmarks/bench_stiff.py [--out output] [--quick]
        [--only governor,chain,spring6,spring8,arm]
    # prints Markdown tables, writes OUT/bench_stiff/bench_stiff.json and the page's
    # tables (bench_stiff.governor, bench_stiff.chain, bench_stiff.ida) to tables.json
"""

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # threads spin under load: LAPACK 10-100x

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optimistix as optx  # noqa: E402
from _common import (  # noqa: E402
    exudyn_governor_system,
    exudyn_solve,
    selected,
    start_run,
    write_json,
)
from _tables import commit, render, run_stamp, table, write  # noqa: E402
from stiff_integration import (  # noqa: E402  # pyright: ignore[reportMissingImports]
    arm_case,
    chain_case,
    governor_case,
    spring_case,
)

import jaxdae  # noqa: E402

jax.config.update("jax_enable_x64", True)

NAME = "bench_stiff"
REFERENCE_RTOL, REFERENCE_ATOL = 1e-12, 1e-14
EXUDYN_TARGET_H = 5e-4
IDA_TARGETS = (1e-3, 1e-6)
JAXDAE_RTOLS = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9)
IDA_RTOLS = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
EXPLICIT = ("Tsit5", "Dopri8")
# jaxdae's generalized-α at Exudyn's fixed steps, ρ∞ and Newton tolerance: the same method
# (on the cases with Exudyn)
FIXED_GA = "GeneralizedAlpha, fixed h, ρ∞ = 0.9"
IMPLICIT = ("Kvaerno5", "Rodas5P", "GeneralizedAlpha", FIXED_GA)
# Exudyn's settings: the defaults of its generalized-α (index 3, ρ∞ = 0.9, modified Newton
# to a relative 1e-8) with Eigen's dense LU, and two cheaper variants
EXUDYN_DEFAULT = "index 3, ρ∞ = 0.9, Newton rel. 1e-8"
EXUDYN_SETTINGS = {
    EXUDYN_DEFAULT: {},
    "index 3, ρ∞ = 0.9, Newton rel. 1e-6": {"timeIntegration.newton.relativeTolerance": 1e-6},
    "index 2, Newmark β = ¼, γ = ½": {
        "timeIntegration.generalizedAlpha.useIndex2Constraints": True,
        "timeIntegration.generalizedAlpha.useNewmark": True,
        "timeIntegration.generalizedAlpha.newmarkBeta": 0.25,
        "timeIntegration.generalizedAlpha.newmarkGamma": 0.5,
    },
}


def solver(name: str) -> diffrax.AbstractSolver:
    return {
        "Tsit5": diffrax.Tsit5,
        "Dopri8": diffrax.Dopri8,
        "Kvaerno5": diffrax.Kvaerno5,
        "Rodas5P": jaxdae.Rodas5P,
        "GeneralizedAlpha": jaxdae.GeneralizedAlpha,
    }[name]()


class Settings(NamedTuple):
    """What a full run and a `--quick` smoke run do differently."""

    governor_t1: float
    chain_t1: float
    small_t1: float
    exudyn_reference_h: tuple[float, ...]  # the governor's Exudyn check against the reference
    caps: dict  # case -> (ladder cap, final-timing cap) in seconds
    repeats: int  # final timings (median)
    jaxdae_rtols: tuple[float, ...]
    ida_rtols: tuple[float, ...]
    solvers: tuple[str, ...]


FULL = Settings(
    10.0,
    1.0,
    2.0,
    (2e-4, 1e-4),
    {"governor": (25.0, 12.0), "chain": (8.0, 4.0), "small": (4.0, 2.0)},
    3,
    JAXDAE_RTOLS,
    IDA_RTOLS,
    EXPLICIT + IMPLICIT,
)
# the smoke run: short horizons, one solver (Dopri8, which also gives the reference: the
# implicit solvers' compiles of the governor take minutes)
QUICK = Settings(
    0.5,
    0.1,
    0.5,
    (2e-4,),
    {"governor": (5.0, 1.0), "chain": (3.0, 1.0), "small": (2.0, 1.0)},
    1,
    (1e-3, 1e-5, 1e-7),
    (1e-3, 1e-6),
    ("Dopri8",),
)


# -- cases -------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    label: str
    system: jaxdae.AbstractSystem
    formulation: jaxdae.AbstractFormulation
    q0: jax.Array
    v0: jax.Array
    t1: float
    ts: np.ndarray
    measure: Callable  # q on ts (N, n) -> compared quantities (N, k)
    scale: float  # errors are deviations over this (1: absolute)
    unit: str
    exudyn: Callable | None  # () -> (mbs, sensors, sensor data list -> (N, k)) or None
    ida: bool
    share: str  # cases with the same `share` reuse one compiled jaxdae solve
    cap: tuple[float, float]
    targets: dict = field(default_factory=dict)


def governor_positions(model):
    """Slider height and the rods' centres of mass, (N, 7), from jaxdae's coordinates."""

    def measure(q):
        q = jnp.asarray(q)
        return np.concatenate(
            [np.asarray(model.marker_position(q, "slider"))[:, 2:]]
            + [np.asarray(model.marker_position(q, rod)) for rod in ("rod1", "rod2")],
            axis=1,
        )

    return measure


def exudyn_governor(model, q0, v0):
    """The governor in Exudyn, from jaxdae's model: every body a rigid body (Euler
    parameters, its mass, principal inertias and pose), the joints as Exudyn's revolute and
    prismatic joints at the same points and axes, the spring–dampers between the same
    markers; a position sensor on the slider and on each rod."""
    import exudyn as exu
    from exudyn.utilities import SensorBody

    def build():
        _, mbs, numbers = exudyn_governor_system(exu, model, q0, v0)
        sensors = [
            mbs.AddSensor(
                SensorBody(
                    bodyNumber=numbers[name],
                    storeInternal=True,
                    outputVariableType=exu.OutputVariableType.Position,
                )
            )
            for name in ("slider", "rod1", "rod2")
        ]

        def measure(data):
            slider, rod1, rod2 = data
            return np.concatenate([slider[:, 3:4], rod1[:, 1:4], rod2[:, 1:4]], axis=1)

        return mbs, sensors, measure

    return build


def exudyn_chain(system, q0):
    """The spring chain in Exudyn: 2-D mass points, spring–dampers of rest length 1 between
    neighbours, a distance constraint of length 1 from the origin to the first; a position
    sensor on each mass."""
    import exudyn as exu
    from exudyn.utilities import ObjectGround, SensorBody

    points = np.asarray(q0).reshape(-1, 2)
    k, c, g = float(system.k), float(system.c), float(system.gravity)

    def build():
        mbs = exu.SystemContainer().AddSystem()
        ground = mbs.AddObject(ObjectGround())
        masses = [
            mbs.CreateMassPoint(
                referencePosition=[x, y, 0.0], mass=1.0, gravity=[0.0, -g, 0.0], create2D=True
            )
            for x, y in points
        ]
        mbs.CreateDistanceConstraint(itemNumbers=[ground, masses[0]], distance=1.0)
        for a, b in zip(masses[:-1], masses[1:], strict=True):
            mbs.CreateSpringDamper(itemNumbers=[a, b], referenceLength=1.0, stiffness=k, damping=c)
        sensors = [
            mbs.AddSensor(
                SensorBody(
                    bodyNumber=m,
                    storeInternal=True,
                    outputVariableType=exu.OutputVariableType.Position,
                )
            )
            for m in masses
        ]

        def measure(data):
            return np.concatenate([d[:, 1:3] for d in data], axis=1)

        return mbs, sensors, measure

    return build


def make_cases(settings: Settings, have_exudyn: bool, have_ida: bool) -> dict[str, Case]:
    cases = {}
    model, formulation, q0, v0, _ = governor_case()
    t1 = settings.governor_t1
    cases["governor"] = Case(
        "governor",
        f"flyball governor, {t1:g} s",
        model,
        formulation,
        q0,
        v0,
        t1,
        np.linspace(0.0, t1, int(round(t1 / 0.01)) + 1),
        governor_positions(model),
        1.0,
        "m",
        exudyn_governor(model, q0, v0) if have_exudyn else None,
        False,
        "governor",
        settings.caps["governor"],
    )
    system, formulation, q0, v0, _ = chain_case()
    t1 = settings.chain_t1
    cases["chain"] = Case(
        "chain",
        f"spring chain, 16 masses, k = 1e8, {t1:g} s",
        system,
        formulation,
        q0,
        v0,
        t1,
        np.linspace(0.0, t1, int(round(t1 / 0.02)) + 1),
        np.asarray,
        0.0,
        "relative",
        exudyn_chain(system, q0) if have_exudyn else None,
        have_ida,
        "chain",
        settings.caps["chain"],
    )
    t1 = settings.small_t1
    for name, label, make in (
        ("spring6", "spring pendulum, k = 1e6", spring_case),
        ("spring8", "spring pendulum, k = 1e8", lambda: spring_case(k=1e8, c=1e4)),
        ("arm", "Cartesian arm, Baumgarte(2000, 1e6)", arm_case),
    ):
        system, formulation, q0, v0, _ = make()
        cases[name] = Case(
            name,
            f"{label}, {t1:g} s",
            system,
            formulation,
            q0,
            v0,
            t1,
            np.linspace(0.0, t1, 41),
            np.asarray,
            0.0,
            "relative",
            None,
            have_ida,
            "spring" if name.startswith("spring") else name,
            settings.caps["small"],
        )
    return cases


# -- runs --------------------------------------------------------------------------------


@dataclass
class Run:
    """One solve of a case by one code at one setting: `go()` solves and returns the
    compared quantities on the case's saved times and the code's counters."""

    code: str  # "Exudyn", "IDA", "jaxdae"
    setting: str  # Exudyn's settings, IDA's form, jaxdae's solver
    knob: str  # "h = 5e-4", "rtol = 1e-6"
    go: Callable = field(repr=False)
    error: float = np.inf
    seconds: float = np.inf
    counts: dict = field(default_factory=dict)
    ok: bool = False
    timings: list = field(default_factory=list)

    def record(self, case: Case, reference: np.ndarray) -> "Run":
        try:
            values, self.seconds, self.counts = self.go()
        except Exception as error:  # a peer's failure is a row of the table, not a crash
            self.counts = {"failure": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
            return self
        self.ok = bool(self.counts.pop("ok", True)) and bool(np.all(np.isfinite(values)))
        self.error = case_error(case, values, reference) if self.ok else np.inf
        self.timings = [self.seconds]
        return self

    def row(self) -> dict:
        return {
            "code": self.code,
            "setting": self.setting,
            "knob": self.knob,
            "error": self.error,
            "seconds": self.seconds,
            "timings": self.timings,
            "ok": self.ok,
            **self.counts,
        }


def case_error(case: Case, values: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(values) - reference)) / case.scale)


def compiled_solves(case: Case, names, cache: dict) -> dict:
    """Per solver, the ahead-of-time compiled solve `(params, q0, v0, rtol, atol) ->
    (q on ts, accepted, rejected, succeeded)` and its compile time; the system's arrays
    are arguments, so cases sharing `case.share` reuse one compile."""
    params, static = eqx.partition(case.system, _is_jax_array)
    ts = jnp.asarray(case.ts)
    out = {}
    for name in names:
        key = (case.share, name)
        if key not in cache:

            def solve(params, q0, v0, rtol, atol, name=name):
                sol = jaxdae.simulate(
                    eqx.combine(params, static),
                    case.formulation,
                    0.0,
                    case.t1,
                    q0,
                    v0,
                    ts=ts,
                    solver=solver(name),
                    rtol=rtol,
                    atol=atol,
                    max_steps=2_000_000,
                    throw=False,
                )
                return (
                    sol.q,
                    sol.stats["num_accepted_steps"],
                    sol.stats["num_rejected_steps"],
                    sol.succeeded,
                )

            start = time.perf_counter()
            compiled = jax.jit(solve).lower(params, case.q0, case.v0, 1e-6, 1e-9).compile()
            cache[key] = (compiled, time.perf_counter() - start)
            # a first call, untimed: it allocates what later calls reuse
            jax.block_until_ready(compiled(params, case.q0, case.v0, 1e-3, 1e-6))
            print(f"  compiled jaxdae {name} for {case.name}: {cache[key][1]:.1f} s", flush=True)
        out[name] = cache[key]
    return out


def compiled_fixed_ga(case: Case, cache: dict):
    """The compiled solve `(params, q0, v0, h) -> ...` of `GeneralizedAlpha(0.9)` at the
    fixed step `h`, and its compile time. Its Newton iteration stops at a relative 1e-6,
    absolute 1e-8 in the positions: at 1e-8 and 1e-10 (Exudyn's figures, which Exudyn
    measures against the first residual) it does not converge on the governor, and a
    fixed step has no smaller step to retry."""
    key = (case.share, FIXED_GA)
    if key not in cache:
        params, static = eqx.partition(case.system, _is_jax_array)
        ts = jnp.asarray(case.ts)

        def solve(params, q0, v0, h):
            sol = jaxdae.simulate(
                eqx.combine(params, static),
                case.formulation,
                0.0,
                case.t1,
                q0,
                v0,
                ts=ts,
                solver=jaxdae.GeneralizedAlpha(0.9, root_finder=optx.Chord(rtol=1e-6, atol=1e-8)),
                stepsize_controller=diffrax.ConstantStepSize(),
                dt0=h,
                max_steps=2_000_000,
                throw=False,
            )
            return (
                sol.q,
                sol.stats["num_accepted_steps"],
                sol.stats["num_rejected_steps"],
                sol.succeeded,
            )

        start = time.perf_counter()
        compiled = jax.jit(solve).lower(params, case.q0, case.v0, 1e-3).compile()
        cache[key] = (compiled, time.perf_counter() - start)
        print(f"  compiled jaxdae {FIXED_GA} for {case.name}: {cache[key][1]:.1f} s", flush=True)
        jax.block_until_ready(compiled(params, case.q0, case.v0, case.t1 / 10))
    return cache[key]


def fixed_ga_run(case: Case, compiled, h: float) -> Run:
    params = eqx.filter(case.system, _is_jax_array)

    def go():
        start = time.perf_counter()
        q, accepted, rejected, succeeded = jax.block_until_ready(
            compiled(params, case.q0, case.v0, h)
        )
        seconds = time.perf_counter() - start
        return (
            case.measure(np.asarray(q)),
            seconds,
            {"steps": int(accepted), "rejected": int(rejected), "ok": bool(succeeded)},
        )

    return Run("jaxdae", FIXED_GA, f"h = {h:g}", go)


def _is_jax_array(x) -> bool:
    # NumPy arrays in a model stay static: models use them while tracing
    return isinstance(x, jax.Array)


def jaxdae_run(case: Case, name: str, compiled, rtol: float, atol: float | None = None) -> Run:
    params = eqx.filter(case.system, _is_jax_array)
    atol = 1e-3 * rtol if atol is None else atol

    def go():
        start = time.perf_counter()
        q, accepted, rejected, succeeded = jax.block_until_ready(
            compiled(params, case.q0, case.v0, rtol, atol)
        )
        seconds = time.perf_counter() - start
        return (
            case.measure(np.asarray(q)),
            seconds,
            {"steps": int(accepted), "rejected": int(rejected), "ok": bool(succeeded)},
        )

    return Run("jaxdae", name, f"rtol = {rtol:g}", go)


def exudyn_run(case: Case, setting: str, h: float) -> Run:
    import exudyn as exu

    build = case.exudyn
    assert build is not None
    mbs, sensors, measure = build()
    steps = int(round(case.t1 / h))
    every = float(case.ts[1] - case.ts[0])
    options = {
        "timeIntegration.newton.relativeTolerance": 1e-8,
        "solution.sensors.writePeriod": every,
        **EXUDYN_SETTINGS[setting],
    }

    def go():
        data, seconds = exudyn_solve(exu, mbs, sensors, case.t1, steps, options=options)
        counters = mbs.sys["dynamicSolver"].it
        values = measure(data)
        times = np.asarray(data[0][:, 0])
        if times.shape != case.ts.shape or np.max(np.abs(times - case.ts)) > 1e-9:
            values = np.stack([np.interp(case.ts, times, column) for column in values.T], 1)
        return (
            values,
            seconds,
            {
                "steps": steps,
                "newton_iterations": int(counters.newtonStepsCount),
                "jacobians": int(counters.newtonJacobiCount),
            },
        )

    return Run("Exudyn", setting, f"h = {h:g}", go)


# -- IDA ---------------------------------------------------------------------------------


def ode_residual(case: Case):
    """jaxdae's ODE `y' = f(t, y)` as the residual `y' − f(t, y)`, with the IDA iteration
    matrix `cj I − ∂f/∂y`; consistent `y0`, `y0'`; no algebraic variables."""
    system, formulation = case.system, case.formulation
    n = case.q0.size

    def f(t, y):
        q, v = y[:n], y[n:]
        return jnp.concatenate([v, formulation.accelerations(system.terms(t, q, v))[0]])

    residual = jax.jit(lambda t, y, yp: yp - f(t, y))
    matrix = jax.jit(lambda t, y, yp, cj: cj * jnp.eye(y.size) - jax.jacfwd(f, argnums=1)(t, y))
    y0 = jnp.concatenate([case.q0, case.v0])
    return residual, matrix, np.asarray(y0), np.asarray(f(0.0, y0)), 2 * n, 0


def ggl_residual(case: Case):
    """The stabilized index-2 form of Gear, Gupta & Leimkuhler (1985) in `y = (q, v, λ, μ)`
    from jaxdae's terms: `q' − v + Gᵀμ`, `M v' − Q + Gᵀλ`, `Φ̇`, `Φ`; the iteration matrix
    `∂F/∂y + cj ∂F/∂y'`; `y0'` from the consistent accelerations and multipliers at t = 0
    (`μ = 0` on the exact solution)."""
    system = case.system
    n = case.q0.size
    terms0 = system.terms(0.0, case.q0, case.v0)
    m = terms0.phi.size
    if terms0.psi.size:
        raise ValueError("the GGL form here covers holonomic constraints only")

    def residual(t, y, yp):
        q, v, lam, mu = y[:n], y[n : 2 * n], y[2 * n : 2 * n + m], y[2 * n + m :]
        terms = system.terms(t, q, v)
        g = terms.jacobian
        return jnp.concatenate(
            [
                yp[:n] - v + g.T @ mu,
                terms.mass_matrix @ yp[n : 2 * n] - terms.forces + g.T @ lam,
                terms.dphi,
                terms.phi,
            ]
        )

    def matrix(t, y, yp, cj):
        return jax.jacfwd(residual, argnums=1)(t, y, yp) + cj * jax.jacfwd(residual, argnums=2)(
            t, y, yp
        )

    g, mass = terms0.jacobian, terms0.mass_matrix
    kkt = jnp.block([[mass, g.T], [g, jnp.zeros((m, m))]])
    acc_lam = jnp.linalg.solve(kkt, jnp.concatenate([terms0.forces, terms0.bias]))
    y0 = jnp.concatenate([case.q0, case.v0, acc_lam[n:], jnp.zeros(m)])
    yp0 = jnp.concatenate([case.v0, acc_lam[:n], jnp.zeros(2 * m)])
    return jax.jit(residual), jax.jit(matrix), np.asarray(y0), np.asarray(yp0), 2 * n, 2 * m


IDA_FORMS = {"GGL index-2 DAE": ggl_residual, "jaxdae's ODE as a residual": ode_residual}


def ida_runs(case: Case, form: str, rtols) -> tuple[list[Run], dict]:
    """IDA's runs of one form at each `rtol`, and the form's compile time."""
    from sksundae.ida import IDA

    start = time.perf_counter()
    residual, matrix, y0, yp0, differential, algebraic = IDA_FORMS[form](case)
    jax.block_until_ready(residual(0.0, y0, yp0))
    jax.block_until_ready(matrix(0.0, y0, yp0, 1.0))
    compile_s = time.perf_counter() - start
    n = case.q0.size
    inside = [0.0]

    def resfn(t, y, yp, res):
        start = time.perf_counter()
        res[:] = np.asarray(residual(t, y, yp))
        inside[0] += time.perf_counter() - start

    def jacfn(t, y, yp, res, cj, jj):
        start = time.perf_counter()
        jj[:, :] = np.asarray(matrix(t, y, yp, cj))
        inside[0] += time.perf_counter() - start

    def make(rtol):
        # the multipliers are left out of the error test (and weigh nothing in the Newton
        # test): their error is that of an index-2 and -3 variable, not the motion's
        atol = np.concatenate([np.full(differential, 1e-3 * rtol), np.full(algebraic, 1e10)])
        return IDA(
            resfn,
            jacfn=jacfn,
            rtol=rtol,
            atol=atol,
            max_num_steps=10**6,
            linsolver="dense",
            algebraic_idx=list(range(differential, differential + algebraic)) or None,
        )

    def run(rtol):
        steps = []

        def go():
            inside[0] = 0.0
            solver = make(rtol)
            start = time.perf_counter()
            sol = solver.solve(case.ts, y0, yp0)
            seconds = time.perf_counter() - start
            in_callbacks = inside[0]
            if not steps:  # a solve with one output per step counts them
                steps.append(len(make(rtol).solve(np.array([0.0, case.t1]), y0, yp0).t) - 1)
            return (
                case.measure(np.asarray(sol.y)[:, :n]),
                seconds,
                {
                    "steps": steps[0],
                    "residuals": int(sol.nfev),
                    "jacobians": int(sol.njev),
                    "seconds_in_callbacks": in_callbacks,
                    "ok": bool(sol.success),
                },
            )

        return Run("IDA", form, f"rtol = {rtol:g}", go)

    return [run(rtol) for rtol in rtols], {"compile_and_first_call_s": compile_s}


# -- a case ------------------------------------------------------------------------------


def ladder(runs: list[Run], case: Case, reference, tightest: float, cap: float) -> list[Run]:
    """Records the runs in turn (loosest first) until one reaches `tightest` or takes
    longer than `cap` seconds."""
    done = []
    for run in runs:
        done.append(run.record(case, reference))
        if run.error <= tightest or run.seconds > cap:
            break
    return done


def cheapest(runs: list[Run], target: float) -> dict[tuple[str, str], Run]:
    """Per code and setting, the run with the fewest steps among those that reach
    `target` (by steps, not time: the times of one call are noisy, and with one setting
    the cost follows the steps)."""
    best = {}
    for run in runs:
        key = (run.code, run.setting)
        if (
            run.ok
            and run.error <= target
            and (key not in best or run.counts["steps"] < best[key].counts["steps"])
        ):
            best[key] = run
    return best


def run_case(case: Case, settings: Settings, cache: dict) -> dict:
    print(f"\n## {case.label}\n", flush=True)
    began = time.perf_counter()
    result: dict = {
        "case": case.name,
        "label": case.label,
        "t1": case.t1,
        "saved_times": len(case.ts),
        "unit": case.unit,
    }
    solves = compiled_solves(case, [n for n in settings.solvers if n != FIXED_GA], cache)
    result["compile_s"] = {name: s for name, (_, s) in solves.items()}
    reference_run = jaxdae_run(case, "Dopri8", solves["Dopri8"][0], REFERENCE_RTOL, REFERENCE_ATOL)
    values, seconds, counts = reference_run.go()
    reference = values
    if case.scale == 0.0:
        case.scale = float(np.max(np.abs(reference)))
    result["reference"] = {
        "solver": "Dopri8",
        "rtol": REFERENCE_RTOL,
        "atol": REFERENCE_ATOL,
        "seconds": seconds,
        **counts,
    }
    print(
        f"  reference (Dopri8, rtol {REFERENCE_RTOL:g}): {counts['steps']} steps, {seconds:.1f} s",
        flush=True,
    )
    ladder_cap, final_cap = case.cap
    runs: list[Run] = []
    targets: dict[str, float] = {}
    if case.exudyn is not None:
        if case.name == "governor":
            result["agreement"] = exudyn_agreement(case, reference, settings)
        steps_h = (
            [4e-3 * 0.5**k for k in range(5)]
            if case.name == "chain"
            else [2e-3 * 0.5**k for k in range(4)]
        )
        exudyn = [exudyn_run(case, EXUDYN_DEFAULT, h).record(case, reference) for h in steps_h]
        for setting in list(EXUDYN_SETTINGS)[1:]:
            exudyn += [
                exudyn_run(case, setting, h).record(case, reference)
                for h in (2 * EXUDYN_TARGET_H, EXUDYN_TARGET_H, EXUDYN_TARGET_H / 2)
            ]
        # Exudyn's accuracy at h = 5e-4: that of its most accurate setting there (a
        # setting whose Newton iteration stops early adds its own error)
        at_target = min(
            (r for r in exudyn if r.knob == f"h = {EXUDYN_TARGET_H:g}"), key=lambda r: r.error
        )
        targets[f"Exudyn at h = {EXUDYN_TARGET_H:g}"] = at_target.error
        result["exudyn_target_setting"] = at_target.setting
        runs += exudyn
        if FIXED_GA in settings.solvers:
            compiled, result["compile_s"][FIXED_GA] = compiled_fixed_ga(case, cache)
            runs += [
                fixed_ga_run(case, compiled, h).record(case, reference)
                for h in (2 * EXUDYN_TARGET_H, EXUDYN_TARGET_H, EXUDYN_TARGET_H / 2)
            ]
    if case.ida:
        for target in IDA_TARGETS:
            targets[f"{target:g}"] = target
    if not targets:
        targets = {f"{target:g}": target for target in IDA_TARGETS}
    tightest = min(targets.values())
    if case.ida:
        result["ida_compile"] = {}
        for form in IDA_FORMS:
            form_runs, info = ida_runs(case, form, settings.ida_rtols)
            result["ida_compile"][form] = info
            runs += ladder(form_runs, case, reference, tightest, ladder_cap)
    for name, (compiled, _) in solves.items():
        runs += ladder(
            [jaxdae_run(case, name, compiled, rtol) for rtol in settings.jaxdae_rtols],
            case,
            reference,
            tightest,
            ladder_cap,
        )
        last = runs[-1]
        print(
            f"  jaxdae {name}: down to {last.knob}, error {last.error:.2e}, {last.seconds:.2f} s",
            flush=True,
        )
    # the chosen runs, timed again in turn
    chosen = {label: cheapest(runs, target) for label, target in targets.items()}
    again = list(
        {
            id(r): r for best in chosen.values() for r in best.values() if r.seconds <= final_cap
        }.values()
    )
    for _ in range(settings.repeats - 1):
        for run in again:
            values, seconds, _ = run.go()
            run.timings.append(seconds)
    for run in again:
        run.seconds = float(np.median(run.timings))
    result["targets"] = targets
    result["runs"] = [r.row() for r in runs]
    result["at_target"] = {
        label: [r.row() for r in best.values()] for label, best in chosen.items()
    }
    result["seconds"] = time.perf_counter() - began
    print_case(result)
    return result


def exudyn_agreement(case: Case, reference: np.ndarray, settings: Settings) -> dict:
    """Exudyn at small fixed steps against jaxdae's reference: the two models agree when
    the differences fall like h² (Exudyn's order) and the Richardson extrapolation of the
    two finest runs is closer still."""
    rows, values = [], []
    for h in settings.exudyn_reference_h:
        run = exudyn_run(case, EXUDYN_DEFAULT, h)
        data, seconds, counts = run.go()
        values.append(data)
        rows.append(
            {"h": h, "seconds": seconds, "max_difference": case_error(case, data, reference)}
        )
        print(
            f"  Exudyn h = {h:g} against the reference: {rows[-1]['max_difference']:.2e} "
            f"{case.unit} ({seconds:.1f} s)",
            flush=True,
        )
    out = {"exudyn": rows}
    if len(values) >= 2:
        (h1, x1), (h2, x2) = zip(settings.exudyn_reference_h[-2:], values[-2:], strict=True)
        extrapolated = x2 + (x2 - x1) / ((h1 / h2) ** 2 - 1)
        out["richardson"] = case_error(case, extrapolated, reference)
        print(f"  Richardson extrapolation of the two: {out['richardson']:.2e} {case.unit}")
    return out


# -- tables ------------------------------------------------------------------------------


def counts_text(row: dict) -> str:
    if "failure" in row:
        return row["failure"][:60]
    if not row["ok"]:
        return "failed" + (f" after {row['steps']} steps" if "steps" in row else "")
    if row["code"] == "jaxdae":
        return f"{row['steps']} ({row['rejected']})"
    if row["code"] == "Exudyn":
        return f"{row['steps']}, {row['newton_iterations']} Newton it., {row['jacobians']} Jac."
    return (
        f"{row['steps']}, {row['residuals']} res., {row['jacobians']} Jac.; "
        f"{row['seconds_in_callbacks']:.2f} s in callbacks"
    )


def seconds_text(row: dict) -> str:
    repeats = len(row["timings"])
    return f"{row['seconds']:.3g}" + ("" if repeats > 1 else " (1 run)")


def print_case(result: dict) -> None:
    unit = result["unit"]
    print(f"\n### {result['label']}: every run\n")
    print(f"| code | setting | | error ({unit}) | steps etc. | wall [s] |")
    print("| --- | --- | --- | ---: | --- | ---: |")
    for row in result["runs"]:
        print(
            f"| {row['code']} | {row['setting']} | {row['knob']} | {row['error']:.2e} | "
            f"{counts_text(row)} | {row['seconds']:.3g} |"
        )
    for label, rows in result["at_target"].items():
        target = result["targets"][label]
        print(
            f"\n### {result['label']}: cheapest run per code at an error ≤ {target:.2e} ({label})\n"
        )
        print("| code | setting | | error | steps etc. | wall [s] | / fastest | compile [s] |")
        print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: |")
        fastest = min((r["seconds"] for r in rows), default=np.nan)
        for row in sorted(rows, key=lambda r: r["seconds"]):
            compile_s = (
                f"{result['compile_s'][row['setting']]:.1f}" if row["code"] == "jaxdae" else "–"
            )
            print(
                f"| {row['code']} | {row['setting']} | {row['knob']} | {row['error']:.2e} | "
                f"{counts_text(row)} | {seconds_text(row)} | "
                f"{row['seconds'] / fastest:.2f} | {compile_s} |"
            )
    print(f"\n{result['label']}: {result['seconds']:.0f} s", flush=True)


def verdicts(results: list[dict]) -> list[str]:
    lines = []
    for result in results:
        for label, rows in result["at_target"].items():
            mine = [r for r in rows if r["code"] == "jaxdae"]
            best = min(mine, key=lambda r: r["seconds"], default=None)
            explicit = min(
                (r for r in mine if r["setting"] in EXPLICIT),
                key=lambda r: r["seconds"],
                default=None,
            )
            implicit = min(
                (r for r in mine if r["setting"] in IMPLICIT),
                key=lambda r: r["seconds"],
                default=None,
            )
            for peer in ("Exudyn", "IDA"):
                theirs = min(
                    (r for r in rows if r["code"] == peer), key=lambda r: r["seconds"], default=None
                )
                if theirs is None:
                    continue
                if best is None:
                    lines.append(
                        f"{result['label']}, error ≤ {label}: no jaxdae run reached "
                        f"it; {peer} {theirs['setting']} {theirs['knob']} "
                        f"{theirs['seconds']:.3g} s"
                    )
                    continue
                lines.append(
                    f"{result['label']}, error ≤ {label}: jaxdae {best['setting']} "
                    f"{best['knob']} {best['seconds']:.3g} s against {peer} "
                    f"{theirs['setting']} {theirs['knob']} {theirs['seconds']:.3g} s: "
                    f"{best['seconds'] / theirs['seconds']:.2f}×"
                )
            if explicit is not None and implicit is not None:
                lines.append(
                    f"{result['label']}, error ≤ {label}: best jaxdae implicit "
                    f"({implicit['setting']}, {implicit['knob']}, {implicit['seconds']:.3g} s) "
                    f"/ best explicit ({explicit['setting']}, {explicit['knob']}, "
                    f"{explicit['seconds']:.3g} s) = "
                    f"{implicit['seconds'] / explicit['seconds']:.2f}"
                )
    return lines


# -- the page's tables ----------------------------------------------------------------------

# jaxdae's settings as the page names them
PAGE_SETTING = {FIXED_GA: "GeneralizedAlpha(0.9), fixed step"}
CHAIN_CODES = ("GeneralizedAlpha", FIXED_GA, "Tsit5", "Dopri8", "Kvaerno5", "Rodas5P")


def _knob(row: dict) -> str:
    """`h = 0.5 ms` for `h = 0.0005`; `rtol = 1e-6` for `rtol = 1e-06`."""
    name, value = row["knob"].split(" = ")
    if name == "h":
        return f"h = {1e3 * float(value):g} ms"
    return f"{name} = {float(value):.0e}".replace("e-0", "e-")


def _ms(row: dict) -> str:
    return f"{1e3 * row['seconds']:.3g}"


def _label(target: str) -> str:
    """The page's name of a target: `10⁻³`, or `Exudyn's at h = 0.5 ms`."""
    if target.startswith("Exudyn"):
        return "Exudyn's at " + _knob({"knob": target.removeprefix("Exudyn at ")})
    exponent = str(int(np.log10(float(target))))
    return "10" + exponent.translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def _targets(result: dict) -> list[str]:
    """The case's targets, loosest first."""
    return sorted(result["at_target"], key=lambda label: -result["targets"][label])


def governor_rows(result: dict) -> list[list[str]]:
    """The cheapest run per code at Exudyn's error at h = 0.5 ms, fastest first."""
    label = next(t for t in result["targets"] if t.startswith("Exudyn"))
    rows = sorted(result["at_target"][label], key=lambda r: r["seconds"])
    fastest = rows[0]["seconds"] if rows else np.nan
    cells = []
    for row in rows:
        if row["code"] == "jaxdae":
            code = f"jaxdae {PAGE_SETTING.get(row['setting'], row['setting'])}"
            compile_s = f"{result['compile_s'][row['setting']]:.1f}"
        else:
            code, compile_s = f"{row['code']}, {row['setting']}", "–"
        cells.append(
            [
                code,
                _knob(row),
                f"{row['error']:.2e}",
                counts_text(row),
                seconds_text(row),
                f"{row['seconds'] / fastest:.2f}",
                compile_s,
            ]
        )
    return cells


def _best(rows: list[dict], keep) -> dict | None:
    return min((r for r in rows if keep(r)), key=lambda r: r["seconds"], default=None)


def _chain_cell(row: dict | None, fastest: float) -> str:
    if row is None:
        return "not reached"
    text = f"{_knob(row)}: {_ms(row)}"
    return f"**{text}**" if row["seconds"] == fastest else text


def chain_rows(result: dict) -> list[list[str]]:
    """Per target, the cheapest run of each jaxdae solver, Exudyn and IDA's GGL form
    (`setting: ms`, the fastest in bold) and the best implicit over the best explicit."""
    cells = []
    for target in _targets(result):
        rows = result["at_target"][target]
        fastest = min((r["seconds"] for r in rows), default=np.nan)
        best = [
            _best(rows, lambda r, name=name: r["code"] == "jaxdae" and r["setting"] == name)
            for name in CHAIN_CODES
        ]
        best.append(_best(rows, lambda r: r["code"] == "Exudyn"))
        best.append(_best(rows, lambda r: r["setting"] == "GGL index-2 DAE"))
        cells.append([_label(target)] + [_chain_cell(r, fastest) for r in best] + [_ratio(rows)])
    return cells


def _ratio(rows: list[dict]) -> str:
    mine = [r for r in rows if r["code"] == "jaxdae"]
    implicit = min((r["seconds"] for r in mine if r["setting"] in IMPLICIT), default=None)
    explicit = min((r["seconds"] for r in mine if r["setting"] in EXPLICIT), default=None)
    return "–" if implicit is None or explicit is None else f"{implicit / explicit:.2f}"


def _ida_cell(row: dict | None, named: bool = False) -> str:
    """`1e-5: 3418 steps, 479` (IDA), `Tsit5 1e-3: 5624 steps, 18.4` (jaxdae, `named`)."""
    if row is None:
        return "not reached"
    knob = _knob(row).removeprefix("rtol = ")
    if named:
        setting = PAGE_SETTING.get(row["setting"], row["setting"])
        knob = f"{setting}, {knob}" if knob.startswith("h") else f"{setting} {knob}"
    return f"{knob}: {row['steps']} steps, {_ms(row)}"


def ida_rows(results: list[dict]) -> list[list[str]]:
    """Per case with IDA and per target: the cheapest run of each IDA form, of jaxdae's
    explicit and of its implicit solvers (`rtol: steps, ms`)."""
    cells = []
    for result in results:
        if not any(r["code"] == "IDA" for r in result["runs"]):
            continue
        for i, target in enumerate(t for t in _targets(result) if not t.startswith("Exudyn")):
            rows = result["at_target"][target]
            explicit = _best(rows, lambda r: r["code"] == "jaxdae" and r["setting"] in EXPLICIT)
            implicit = _best(rows, lambda r: r["code"] == "jaxdae" and r["setting"] in IMPLICIT)
            cells.append(
                [
                    result["label"] if i == 0 else "",
                    _label(target),
                    _ida_cell(_best(rows, lambda r: r["setting"] == "GGL index-2 DAE")),
                    _ida_cell(_best(rows, lambda r: r["setting"] == "jaxdae's ODE as a residual")),
                    _ida_cell(explicit, named=True),
                    _ida_cell(implicit, named=True),
                    _ratio(rows),
                ]
            )
    return cells


GOVERNOR_COLUMNS = [
    ("code", "left"),
    ("run", "left"),
    ("error [m]", "right"),
    ("steps", "left"),
    ("wall [s]", "right"),
    ("/ fastest", "right"),
    ("compile [s]", "right"),
]
CHAIN_COLUMNS = [
    ("target", "left"),
    ("GeneralizedAlpha", "left"),
    ("GeneralizedAlpha(0.9), fixed step", "left"),
    ("Tsit5", "left"),
    ("Dopri8", "left"),
    ("Kvaerno5", "left"),
    ("Rodas5P", "left"),
    ("Exudyn", "left"),
    ("IDA, GGL", "left"),
    ("best implicit / best explicit", "right"),
]
IDA_COLUMNS = [
    ("case", "left"),
    ("target", "left"),
    ("IDA, GGL index-2 DAE", "left"),
    ("IDA, jaxdae's ODE", "left"),
    ("jaxdae explicit", "left"),
    ("jaxdae implicit", "left"),
    ("implicit / explicit", "right"),
]


def page_tables(results: list[dict], stamp: dict) -> list[dict]:
    """The tables of docs/benchmarks.md of the cases run."""
    by_case = {r["case"]: r for r in results}
    tables = []
    if "governor" in by_case and any(
        t.startswith("Exudyn") for t in by_case["governor"]["targets"]
    ):
        tables.append(
            table(
                "bench_stiff.governor", GOVERNOR_COLUMNS, governor_rows(by_case["governor"]), stamp
            )
        )
    if "chain" in by_case:
        tables.append(
            table("bench_stiff.chain", CHAIN_COLUMNS, chain_rows(by_case["chain"]), stamp)
        )
    ida = ida_rows(results)
    if ida:
        tables.append(table("bench_stiff.ida", IDA_COLUMNS, ida, stamp))
    return tables


def peers_available() -> tuple[bool, bool]:
    try:
        import exudyn  # noqa: F401

        have_exudyn = True
    except ImportError:
        have_exudyn = False
        print("exudyn is not installed: Exudyn's runs are skipped (pip install exudyn)")
    try:
        import sksundae.ida  # noqa: F401

        have_ida = True
    except ImportError:
        have_ida = False
        print("scikit-sundae is not installed: IDA's runs are skipped (pip install scikit-sundae)")
    return have_exudyn, have_ida


def main():
    args, out, began, load = start_run(NAME, __doc__.splitlines()[0], only=True)
    stamp = run_stamp()
    settings = QUICK if args.quick else FULL
    have_exudyn, have_ida = peers_available()
    cases = selected(make_cases(settings, have_exudyn, have_ida), args.only)
    revision = commit()
    versions = {"jax": jax.__version__}
    if have_exudyn:
        import exudyn

        versions["exudyn"] = exudyn.__version__
    if have_ida:
        import sksundae

        versions["scikit-sundae"] = sksundae.__version__
    cache: dict = {}
    results = []
    for case in cases.values():
        results.append(run_case(case, settings, cache))
        lines = verdicts(results)
        total = time.perf_counter() - began
        # after every case, so that a long run stopped half way keeps its finished cases
        write_json(
            out / f"{NAME}.json",
            {
                "results": results,
                "verdicts": lines,
                "quick": args.quick,
                "settings": settings._asdict(),
                "seconds": total,
                "load_average": load,
                "load_average_end": os.getloadavg()[0],
                "commit": revision,
                "versions": versions,
            },
        )
    lines = verdicts(results)
    print("\n### Verdicts\n")
    for line in lines:
        print(f"- {line}")
    total = time.perf_counter() - began
    print(
        f"\ntotal {total:.0f} s; load average at the start {load:.1f}, at the end "
        f"{os.getloadavg()[0]:.1f}; jaxdae at {revision}"
    )
    print(f"wrote {out / (NAME + '.json')}")
    tables = page_tables(results, stamp)
    for data in tables:
        print("\n" + render(data))
    if tables:
        print("wrote", write(args.out, NAME, tables))


if __name__ == "__main__":
    main()
