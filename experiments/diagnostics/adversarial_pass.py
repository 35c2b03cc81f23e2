"""Diagnostic: an adversarial pass over jaxdae's public API, tried as a new user would.

Runs about 300 small cases of bad input, faults and edge cases (shapes and dtypes, nan and
inf in every input, odd times, bad gains, broken model functions, redundant and singular
constraints, `jit` / `vmap` / `grad`, ensembles, solvers and adjoints, events, contact in
space (friction, time stepping, URDF collision shapes), multibody models and URDF files,
`tune` and `batch_map` with their checkpoints, the analysis and control functions), each in
a worker process with a time limit, and classifies each
outcome automatically:

- `named`: a `ValueError`, `TypeError`, `jaxdae.SimulationError` (or a runtime error of a
  traced check) that names the problem, or a result with the `RESULTS` member or flag
  that is right for the case;
- `ok`: legitimate input, handled correctly (checked against a closed form, an independent
  solve or a second method);
- `misnamed`: a jaxdae error or `RESULTS` member that names another problem than the
  case's;
- `cryptic`: an exception from inside JAX, diffrax, equinox or NumPy without a jaxdae
  sentence naming the cause (`AttributeError`, `IndexError`, a shape error of a JAX
  primitive, ...);
- `silent_wrong`: success (or a value) where the answer is wrong, or nan without a failure;
- `lost`: a batch member lost for another's fault, or saved work silently misused;
- `hang`: no answer within the time limit.

Prints a table of counts per category and per area, the share of `cryptic`, and each case
that is not `named` or `ok` with what it does and its exception or verdict. With `--out
DIR`, writes the same (with each case's source, its reproduction) to
`DIR/adversarial_pass/results.json`. Takes about 10 minutes on a 2-core CPU.

    python experiments/diagnostics/adversarial_pass.py
    python experiments/diagnostics/adversarial_pass.py --only events,urdf --out output
"""

import os

# The whole traceback, so that an exception's origin is the frame that raised it.
os.environ.setdefault("JAX_TRACEBACK_FILTERING", "off")

import argparse  # noqa: E402
import dataclasses
import functools
import inspect
import io
import json
import multiprocessing
import re
import shutil
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxdae  # noqa: E402  (before JAX computes: its XLA options)
import jaxdae.multibody as mb
from jaxdae.examples import AdaptiveOpticsElement, BouncingBall, CartesianPendulum

KINDS = ("named", "ok", "misnamed", "cryptic", "silent_wrong", "lost", "hang")
JAXDAE_DIR = str(Path(jaxdae.__file__).resolve().parent)
THIS_FILE = str(Path(__file__).resolve())
# A message names a fix when it says what to do.
FIX_WORDS = re.compile(
    r"\b(pass|use|give|choose|check|fix|return|e\.g\.|instead|should|"
    r"must|needs?|set|call|reduce|raise|lower|loosen|add|remove|try|"
    r"ask|install|rename|run|make)\b",
    re.I,
)
CRYPTIC_TYPES = (
    AttributeError,
    IndexError,
    KeyError,
    AssertionError,
    ZeroDivisionError,
    NotImplementedError,
    RecursionError,
    NameError,
    UnboundLocalError,
    UnicodeError,
)


# --- the cases' registry and verdicts ------------------------------------------------------


@dataclasses.dataclass
class Case:
    name: str
    area: str
    what: str
    fn: object
    expect: str | None  # regex of what a good error message names
    user_error: bool  # the expected error is the user's own exception


CASES: dict[str, Case] = {}


def case(area, what, expect=None, user_error=False):
    def register(fn):
        CASES[fn.__name__] = Case(fn.__name__, area, what, fn, expect, user_error)
        return fn

    return register


@dataclasses.dataclass
class Verdict:
    kind: str
    detail: str = ""


def ok(detail=""):
    return Verdict("ok", detail)


def named(detail=""):
    return Verdict("named", detail)


def wrong(detail):
    return Verdict("silent_wrong", detail)


def lost(detail):
    return Verdict("lost", detail)


def misnamed(detail):
    return Verdict("misnamed", detail)


def result_names(result):
    """The RESULTS member names of a (batched) result, as a list."""
    codes = np.atleast_1d(np.asarray(result._value))
    by_code = {
        int(np.asarray(item._value)): name for name, item in jaxdae.RESULTS._name_to_item.items()
    }
    return [by_code.get(int(c), f"<{int(c)}>") for c in codes]


def close(actual, expected, atol, what="state"):
    """`ok` if `actual` is within `atol` of `expected`, else `silent_wrong` (nan included)."""
    actual, expected = np.asarray(actual, float), np.asarray(expected, float)
    if actual.shape != expected.shape:
        return wrong(f"{what} has shape {actual.shape}, expected {expected.shape}")
    if not np.all(np.isfinite(actual)):
        return wrong(f"{what} holds non-finite values without a failure: {actual}")
    err = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    if err <= atol:
        return ok(f"{what} within {err:.2e} of the reference")
    return wrong(
        f"{what} is {err:.3g} off the reference (allowed {atol:g}): "
        f"{np.array2string(actual.ravel()[:6], precision=6)} vs "
        f"{np.array2string(expected.ravel()[:6], precision=6)}"
    )


def judge(sol, failures=(), check=None):
    """A solution's verdict: a failure in `failures` is `named`, another failure
    `misnamed`; success is judged by `check(sol)` (`silent_wrong` without one)."""
    names = result_names(sol.result)
    if all(n == "successful" for n in names):
        if check is None:
            return wrong(f"succeeded, expected one of {list(failures)}")
        return check(sol)
    bad = [n for n in names if n != "successful"]
    if failures and all(n in failures for n in bad):
        return named(f"result {bad}")
    if not failures and check is not None:
        return misnamed(f"result {names} for a legitimate input")
    return misnamed(f"result {names}, expected one of {list(failures)}")


# --- shared models and references ------------------------------------------------------------

PEND = CartesianPendulum()
THETA0 = 0.5
Q0, V0 = PEND.state_from_angle(THETA0, 0.0)
BAUM = jaxdae.Baumgarte(10.0, 25.0)
G = 9.81


@functools.cache
def _truth(theta0, omega0, t1, length=1.0, g=G, t0=0.0):
    """The pendulum's state at `t1` from the angle equation `θ̈ = −(g/l) sin θ`, solved by
    diffrax alone at tight tolerances (no jaxdae formulation)."""

    def rhs(t, y, args):
        return jnp.array([y[1], -(g / length) * jnp.sin(y[0])])

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        diffrax.Tsit5(),
        t0,
        t1,
        0.01,
        jnp.array([theta0, omega0]),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-14),
        max_steps=100_000,
    )
    th, om = (float(x) for x in sol.ys[-1])
    q = length * np.array([np.sin(th), -np.cos(th)])
    v = length * om * np.array([np.cos(th), np.sin(th)])
    return q, v


def truth(t1, theta0=THETA0, omega0=0.0, **kw):
    return _truth(float(theta0), float(omega0), float(t1), **kw)


def pend_ok(sol, t1, atol=1e-5, **kw):
    q, _ = truth(t1, **kw)
    return close(sol.q_final, q, atol, "q(t1)")


def simulate(*args, **kw):
    return jaxdae.simulate(*args, **kw)


def pend(t1=0.5, **kw):
    return jaxdae.simulate(PEND, BAUM, 0.0, t1, Q0, V0, **kw)


class TwoPoint(jaxdae.LagrangianSystem):
    """Two unit point masses, each on a circle about the origin (radii 1 and 2): two
    independent constraints, so that vector and matrix gains apply."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return G * (q[1] + q[3])

    def constraints(self, t, q):
        return jnp.array([q[:2] @ q[:2] - 1.0, q[2:] @ q[2:] - 4.0])


TWO_Q0 = jnp.concatenate([Q0, 2 * Q0])
TWO_V0 = jnp.zeros(4)


def two_truth(t1):
    q1, _ = truth(t1)
    q2, _ = truth(t1, length=2.0)
    return np.concatenate([q1, q2])


class Twice(CartesianPendulum):
    """The pendulum's constraint written twice: redundant and consistent."""

    def constraints(self, t, q):
        c = q @ q - self.length**2
        return jnp.array([c, c])


class Incompatible(CartesianPendulum):
    def constraints(self, t, q):
        return jnp.array([q @ q - 1.0, q @ q - 4.0])


def fd(f, x, h=1e-6):
    """Central difference of a scalar function of a scalar."""
    return (f(x + h) - f(x - h)) / (2 * h)


def catch_warnings_run(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught]


# ============================================================================================
# simulate: shapes, dtypes and values of the arguments
# ============================================================================================


@case("inputs", "q0, v0 as Python lists")
def q0_python_list():
    return pend_ok(simulate(PEND, BAUM, 0.0, 0.5, [float(x) for x in Q0], [0.0, 0.0]), 0.5)


@case("inputs", "q0, v0 as integer arrays (pendulum released horizontally)", expect=r"`q0`")
def q0_int_array():
    sol = simulate(PEND, BAUM, 0.0, 0.3, jnp.array([1, 0]), jnp.array([0, 0]))
    return pend_ok(sol, 0.3, theta0=np.pi / 2)


@case("inputs", "q0 a boolean array (read as 1.0, 0.0?)", expect=r"`q0`")
def q0_bool():
    sol = simulate(PEND, BAUM, 0.0, 0.3, jnp.array([True, False]), jnp.zeros(2))
    return pend_ok(sol, 0.3, theta0=np.pi / 2)


@case("inputs", "q0 a NumPy object array", expect=r"`q0`")
def q0_object_array():
    sol = simulate(PEND, BAUM, 0.0, 0.3, np.array([float(Q0[0]), float(Q0[1])], dtype=object), V0)
    return pend_ok(sol, 0.3)


@case("inputs", "q0 a Python scalar for a system of 2 coordinates", expect=r"`q0`")
def q0_scalar():
    simulate(PEND, BAUM, 0.0, 0.3, 0.5, 0.0)
    return wrong("a scalar q0 was accepted for 2 coordinates")


@case("inputs", "q0, v0 empty arrays for the pendulum", expect=r"`q0`|coordinates|shape")
def q0_empty():
    simulate(PEND, BAUM, 0.0, 0.3, jnp.zeros(0), jnp.zeros(0))
    return wrong("empty q0 accepted for the pendulum")


@case("inputs", "q0 float32, v0 float64 (mixed precision)", expect=r"`q0`|`v0`|dtype|float32")
def q0_mixed_precision():
    sol = simulate(PEND, BAUM, 0.0, 0.5, Q0.astype(jnp.float32), V0, rtol=1e-5, atol=1e-7)
    return pend_ok(sol, 0.5, atol=1e-3)


@case("inputs", "q0 a (2, 1) column", expect=r"`q0`")
def q0_column():
    simulate(PEND, BAUM, 0.0, 0.3, Q0[:, None], V0[:, None])
    return wrong("a (2, 1) q0 was accepted")


@case("inputs", "ts as a Python list")
def ts_list():
    sol = simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=[0.0, 0.25, 0.5])
    return close(sol.q[1], truth(0.25)[0], 1e-5, "q(0.25)")


@case("inputs", "ts with a repeated time", expect=r"`ts`")
def ts_duplicates():
    sol = simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=jnp.array([0.0, 0.25, 0.25, 0.5]))
    return close(sol.q[1:3], np.stack([truth(0.25)[0]] * 2), 1e-5, "q at the repeated time")


@case("inputs", "ts a 2-D array", expect=r"`ts`")
def ts_2d():
    simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=jnp.array([[0.0, 0.1], [0.2, 0.5]]))
    return wrong("a 2-D ts was accepted")


@case("inputs", "ts an empty array", expect=r"`ts`")
def ts_empty():
    sol = simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=jnp.zeros(0))
    if sol.q.shape[0] == 0:
        return close(sol.q_final, truth(0.5)[0], 1e-5, "q_final with no saved times")
    return wrong(f"empty ts gave {sol.q.shape[0]} saved rows")


@case("inputs", "ts a single time t1")
def ts_single():
    sol = simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=jnp.array([0.5]))
    return close(sol.q[0], truth(0.5)[0], 1e-5, "q(0.5)")


@case("inputs", "ts that omits t0")
def ts_without_t0():
    sol = simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=jnp.array([0.2, 0.4]))
    return close(sol.q, np.stack([truth(0.2)[0], truth(0.4)[0]]), 1e-5, "q(ts)")


@case("inputs", "ts an integer array [0, 1]")
def ts_int():
    sol = simulate(PEND, BAUM, 0, 1, Q0, V0, ts=jnp.array([0, 1]))
    return close(sol.q[-1], truth(1.0)[0], 1e-5, "q(1)")


@case("inputs", "the span shifted to t0 = 100 (autonomous system)")
def t0_shifted():
    return pend_ok(simulate(PEND, BAUM, 100.0, 100.5, Q0, V0), 0.5)


@case("inputs", "negative times t0 = -1, t1 = -0.5")
def negative_times():
    return pend_ok(simulate(PEND, BAUM, -1.0, -0.5, Q0, V0), 0.5)


@case("inputs", "huge times t0 = 1e9, t1 = 1e9 + 0.5", expect=r"`t0`|`t1`|precision|resolution")
def huge_times():
    sol = simulate(PEND, BAUM, 1e9, 1e9 + 0.5, Q0, V0, throw=False)
    return judge(sol, ("dt_min_reached",), lambda s: pend_ok(s, 0.5, atol=1e-4))


@case(
    "inputs",
    "huge times t0 = 1e15, span 0.5 (about 2 ulps of t)",
    expect=r"`t0`|`t1`|precision|resolution|rounding",
)
def huge_times_1e15():
    sol = simulate(PEND, BAUM, 1e15, 1e15 + 0.5, Q0, V0, throw=False, max_steps=2000)
    return judge(
        sol,
        ("dt_min_reached", "max_steps_reached"),
        lambda s: pend_ok(s, float(np.float64(1e15 + 0.5) - 1e15), atol=1e-3),
    )


@case("inputs", "a tiny span t1 - t0 = 1e-12")
def tiny_span():
    return close(simulate(PEND, BAUM, 0.0, 1e-12, Q0, V0).q_final, Q0, 1e-12, "q(1e-12)")


@case("inputs", "a subnormal span t1 = 1e-310", expect=r"`t1`|`t0`|span")
def subnormal_span():
    sol = simulate(PEND, BAUM, 0.0, 1e-310, Q0, V0, throw=False)
    return judge(sol, ("dt_min_reached",), lambda s: close(s.q_final, Q0, 1e-12, "q_final"))


@case("inputs", "a long span t1 = 1e6 with max_steps = 300")
def huge_span_max_steps():
    sol = simulate(PEND, BAUM, 0.0, 1e6, Q0, V0, max_steps=300, throw=False)
    return judge(sol, ("max_steps_reached",))


@case("inputs", "t0, t1 as Python ints")
def times_int():
    return pend_ok(simulate(PEND, BAUM, 0, 1, Q0, V0), 1.0)


@case("inputs", "t1 the string '1.0'", expect=r"`t1`")
def t1_string():
    return pend_ok(simulate(PEND, BAUM, 0.0, "1.0", Q0, V0), 1.0)


@case("inputs", "t0 = -inf", expect=r"`t0`")
def t0_neg_inf():
    simulate(PEND, BAUM, -np.inf, 1.0, Q0, V0)
    return wrong("t0 = -inf accepted")


@case("inputs", "dt0 = 10, larger than the span 0.5 (adaptive)")
def dt0_larger_than_span():
    return pend_ok(simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, dt0=10.0), 0.5)


@case("inputs", "dt0 = 1e-300 (adaptive controller)", expect=r"`dt0`")
def dt0_tiny():
    return pend_ok(simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, dt0=1e-300), 0.5)


@case("inputs", "max_steps = 100.5 (a float)", expect=r"`max_steps`")
def max_steps_float():
    sol = pend(max_steps=100.5)
    return wrong(f"max_steps=100.5 accepted ({result_names(sol.result)})")


@case("inputs", "max_steps = -5", expect=r"`max_steps`")
def max_steps_negative():
    pend(max_steps=-5)
    return wrong("max_steps=-5 accepted")


@case("inputs", "max_steps a NumPy int64")
def max_steps_numpy():
    return pend_ok(pend(max_steps=np.int64(5000)), 0.5)


@case("inputs", "rtol the string '1e-8'", expect=r"`rtol`")
def rtol_string():
    return pend_ok(pend(rtol="1e-8"), 0.5)


@case("inputs", "constraint_tol a vector for one trajectory", expect=r"`constraint_tol`")
def constraint_tol_vector():
    sol = pend(constraint_tol=jnp.array([1e-3, 1e-3]))
    return wrong(f"a vector constraint_tol accepted: result {result_names(sol.result)}")


@case("inputs", "ConstantStepSize without dt0", expect=r"`dt0`")
def constant_step_no_dt0():
    pend(stepsize_controller=diffrax.ConstantStepSize())
    return wrong("ConstantStepSize without dt0 accepted")


# ============================================================================================
# non-finite values and system parameters
# ============================================================================================


@case("nonfinite", "pendulum length = nan", expect=r"`length`|non-finite|nan")
def param_length_nan():
    sol = simulate(CartesianPendulum(length=jnp.nan), BAUM, 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("non_finite_constraints", "invalid_input", "dt_min_reached"))


@case(
    "nonfinite", "pendulum mass = inf", expect=r"`mass`|mass matrix|non-finite|not finite|nan|inf"
)
def param_mass_inf():
    sol = simulate(CartesianPendulum(mass=jnp.inf), BAUM, 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("non_finite_mass_matrix", "non_finite_forces", "invalid_input"))


@case("nonfinite", "gravity = nan", expect=r"`gravity`|non-finite|not finite|nan")
def param_gravity_nan():
    sol = simulate(CartesianPendulum(gravity=jnp.nan), BAUM, 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("non_finite_forces", "invalid_input"))


@case("nonfinite", "an integer system parameter length = 2")
def param_int():
    pendulum = CartesianPendulum(length=2)
    q0, v0 = pendulum.state_from_angle(THETA0, 0.0)
    return pend_ok(simulate(pendulum, BAUM, 0.0, 0.5, q0, v0), 0.5, length=2.0)


@case(
    "nonfinite",
    "a vector length (2,) makes two contradicting constraints",
    expect=r"`length`|constraint",
)
def param_vector_length():
    pendulum = CartesianPendulum(length=jnp.array([1.0, 2.0]))
    sol = simulate(pendulum, BAUM, 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("singular_constraint_matrix", "constraints_not_met"))


@case("nonfinite", "Baumgarte kv = nan", expect=r"`kv`")
def gain_kv_nan():
    jaxdae.Baumgarte(10.0, 25.0, kv=jnp.nan)
    return wrong("kv = nan accepted")


@case("nonfinite", "PseudoInverse rcond = nan", expect=r"`rcond`")
def rcond_nan():
    jaxdae.PseudoInverse(10.0, 25.0, rcond=float("nan"))
    return wrong("rcond = nan accepted")


@case("nonfinite", "ModifiedLagrange alpha = [nan]", expect=r"`alpha`")
def alpha_nan_vector():
    jaxdae.ModifiedLagrange(jnp.array([jnp.nan]), 10.0, 25.0)
    return wrong("alpha = [nan] accepted")


@case("nonfinite", "a gain set to nan after construction (eqx.tree_at)", expect=r"`kd`")
def gain_tree_at_nan():
    bad = eqx.tree_at(lambda f: f.kd, BAUM, jnp.array(jnp.nan))
    simulate(PEND, bad, 0.0, 0.5, Q0, V0)
    return wrong("nan gain accepted by simulate")


@case(
    "nonfinite",
    "forces nan at the start (sqrt of a negative number)",
    expect=r"non-finite|forces|potential",
)
def nan_forces_at_start():
    class Broken(CartesianPendulum):
        def potential_energy(self, t, q):
            return jnp.sqrt(q[1] - 10.0)

    simulate(Broken(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("nan forces at t0 accepted")


@case(
    "nonfinite",
    "constraints nan at the start (sqrt of a negative coordinate)",
    expect=r"non-finite|constraints",
)
def nan_constraints_at_start():
    class Broken(CartesianPendulum):
        def constraints(self, t, q):
            return jnp.array([jnp.sqrt(q[1]) - 1.0])

    sol = simulate(Broken(), BAUM, 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("non_finite_constraints", "invalid_input"))


# ============================================================================================
# formulations: gains
# ============================================================================================


@case("gains", "Baumgarte gains as strings", expect=r"`kd`")
def gain_string():
    jaxdae.Baumgarte("10", 25.0)
    return wrong("a string gain accepted")


@case("gains", "Baumgarte gains as booleans", expect=r"`kd`|`kp`")
def gain_bool():
    sol = simulate(PEND, jaxdae.Baumgarte(True, True), 0.0, 0.5, 1.05 * Q0, V0)
    ones = simulate(PEND, jaxdae.Baumgarte(1.0, 1.0), 0.0, 0.5, 1.05 * Q0, V0)
    return close(sol.q_final, ones.q_final, 1e-14, "q(0.5) against Baumgarte(1.0, 1.0)")


@case("gains", "vector gains as Python lists on two constraints")
def gain_lists():
    sol = simulate(
        TwoPoint(), jaxdae.Baumgarte([10.0, 20.0], [25.0, 100.0]), 0.0, 0.5, TWO_Q0, TWO_V0
    )
    return close(sol.q_final, two_truth(0.5), 1e-5, "q(0.5)")


@case("gains", "matrix gains on two constraints (diagonal, equal to the vector form)")
def gain_matrix_equals_vector():
    matrix = simulate(
        TwoPoint(),
        jaxdae.Baumgarte(jnp.diag(jnp.array([10.0, 20.0])), jnp.diag(jnp.array([25.0, 100.0]))),
        0.0,
        0.5,
        1.01 * TWO_Q0,
        TWO_V0,
    )
    vector = simulate(
        TwoPoint(),
        jaxdae.Baumgarte(jnp.array([10.0, 20.0]), jnp.array([25.0, 100.0])),
        0.0,
        0.5,
        1.01 * TWO_Q0,
        TWO_V0,
    )
    return close(matrix.q, vector.q, 1e-10, "matrix-gain trajectory")


@case("gains", "a 3-D gain array", expect=r"`kd`")
def gain_3d():
    jaxdae.Baumgarte(jnp.ones((1, 1, 1)), 25.0)
    return wrong("a 3-D gain accepted")


@case("gains", "a 3x3 gain matrix for 1 constraint", expect=r"`kd`")
def gain_matrix_wrong_size():
    simulate(PEND, jaxdae.Baumgarte(10.0 * jnp.eye(3), 25.0), 0.0, 0.5, Q0, V0)
    return wrong("3x3 kd accepted for one constraint")


@case("gains", "kp = [25, -1] on two constraints", expect=r"`kp`")
def gain_vector_negative_entry():
    jaxdae.Baumgarte(10.0, jnp.array([25.0, -1.0]))
    return wrong("a negative entry of kp accepted")


@case("gains", "PseudoInverse(kd=-1)", expect=r"`kd`")
def pseudo_negative():
    jaxdae.PseudoInverse(-1.0, 25.0)
    return wrong("PseudoInverse(kd=-1) accepted")


@case("gains", "PseudoInverse(rcond=-0.1)", expect=r"`rcond`")
def pseudo_rcond_negative():
    jaxdae.PseudoInverse(10.0, 25.0, rcond=-0.1)
    return wrong("rcond = -0.1 accepted")


@case("gains", "ModifiedLagrange(alpha=-I) as a matrix", expect=r"`alpha`")
def modlag_alpha_negative_matrix():
    jaxdae.ModifiedLagrange(-jnp.eye(1), 10.0, 25.0)
    return wrong("alpha = -I accepted")


@case("gains", "Unstabilized(rcond=-1)", expect=r"`rcond`")
def unstabilized_rcond_negative():
    jaxdae.Unstabilized(rcond=-1.0)
    return wrong("Unstabilized(rcond=-1) accepted")


@case(
    "gains",
    "RedundantCoordinates with a repeated dependent index",
    expect=r"`dependent`|repeat|twice|duplicate",
)
def redundant_duplicate():
    simulate(TwoPoint(), jaxdae.RedundantCoordinates((1, 1)), 0.0, 0.5, TWO_Q0, TWO_V0)
    return wrong("dependent=(1, 1) accepted")


@case(
    "gains",
    "RedundantCoordinates with a negative index (-1: the last coordinate)",
    expect=r"`dependent`|range|negative",
)
def redundant_negative_index():
    sol = simulate(PEND, jaxdae.RedundantCoordinates((-1,)), 0.0, 0.5, Q0, V0)
    return pend_ok(sol, 0.5)


@case("gains", "RedundantCoordinates(tol=-1)", expect=r"`tol`")
def redundant_tol_negative():
    simulate(PEND, jaxdae.RedundantCoordinates((1,), tol=-1.0), 0.0, 0.5, Q0, V0)
    return wrong("tol=-1 accepted")


@case("gains", "a gain replaced by a wrong-shape array after construction", expect=r"`kp`")
def gain_tree_at_shape():
    bad = eqx.tree_at(lambda f: f.kp, BAUM, jnp.ones(3))
    simulate(PEND, bad, 0.0, 0.5, Q0, V0)
    return wrong("kp of shape (3,) accepted for one constraint")


@case("gains", "traced asymmetric matrix kd under jit, throw=False")
def traced_asymmetric_gain():
    @jax.jit
    def run(kd):
        return simulate(
            TwoPoint(), jaxdae.Baumgarte(kd, 25.0), 0.0, 0.3, TWO_Q0, TWO_V0, throw=False
        ).result._value

    return _verdict_code(run(jnp.array([[10.0, 5.0], [0.0, 10.0]])), "invalid_input")


def _verdict_code(code, expected):
    by_code = {
        int(np.asarray(item._value)): name for name, item in jaxdae.RESULTS._name_to_item.items()
    }
    got = by_code[int(np.asarray(code))]
    if got == expected:
        return named(f"result {got}")
    if got == "successful":
        return wrong(f"succeeded, expected {expected}")
    return misnamed(f"result {got}, expected {expected}")


@case("gains", "float32 gains with a float64 state")
def gain_float32():
    formulation = jaxdae.Baumgarte(jnp.float32(10.0), jnp.float32(25.0))
    return pend_ok(simulate(PEND, formulation, 0.0, 0.5, Q0, V0), 0.5)


@case("gains", "huge but finite gains Baumgarte(1e6, 1e12), max_steps=2000")
def gain_huge_finite():
    sol = simulate(PEND, jaxdae.Baumgarte(1e6, 1e12), 0.0, 0.1, Q0, V0, max_steps=2000, throw=False)
    return judge(sol, ("max_steps_reached",), lambda s: pend_ok(s, 0.1))


@case("gains", "CoupledPerturbation with only k10 given", expect=r"`k11`")
def coupled_missing_block():
    simulate(PEND, jaxdae.CoupledPerturbation(k10=-25.0), 0.0, 0.5, Q0, V0)
    return wrong("CoupledPerturbation without k11 accepted")


# ============================================================================================
# model functions
# ============================================================================================


@case("models", "potential_energy returns a tuple", expect=r"potential_energy")
def potential_tuple():
    class Bad(CartesianPendulum):
        def potential_energy(self, t, q):
            return (G * q[1], 0.0)

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a tuple potential accepted")


@case("models", "kinetic_energy returns a vector (2,)", expect=r"kinetic_energy")
def kinetic_vector():
    class Bad(CartesianPendulum):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v * v

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a vector kinetic energy accepted")


@case("models", "mass_matrix returns 3x3 for 2 coordinates", expect=r"mass_matrix|mass matrix")
def mass_wrong_shape():
    class Bad(CartesianPendulum):
        def mass_matrix(self, t, q):
            return jnp.eye(3)

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a 3x3 mass matrix accepted")


@case("models", "mass_matrix not symmetric", expect=r"symmetric")
def mass_asymmetric():
    class Bad(CartesianPendulum):
        def mass_matrix(self, t, q):
            return jnp.array([[1.0, 0.5], [0.0, 1.0]])

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("an asymmetric mass matrix accepted")


@case("models", "mass_matrix singular diag(1, 0)", expect=r"mass matrix")
def mass_singular():
    class Bad(CartesianPendulum):
        def mass_matrix(self, t, q):
            return jnp.diag(jnp.array([1.0, 0.0]))

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a singular mass matrix accepted")


@case("models", "mass_matrix negative definite", expect=r"mass matrix")
def mass_negative():
    class Bad(CartesianPendulum):
        def mass_matrix(self, t, q):
            return -jnp.eye(2)

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a negative definite mass matrix accepted")


@case("models", "mass matrix diag(1, 1 - t) turns singular at t = 1 (and indefinite after)")
def mass_singular_mid_run():
    class Fading(CartesianPendulum):
        def mass_matrix(self, t, q):
            return jnp.diag(jnp.array([1.0, 1.0 - t]))

    sol = simulate(Fading(), BAUM, 0.0, 1.5, Q0, V0, throw=False, max_steps=20_000)
    return judge(
        sol,
        (
            "dt_min_reached",
            "non_finite_rates",
            "non_finite_mass_matrix",
            "indefinite_mass_matrix",
            "singular_constraint_matrix",
            "max_steps_reached",
            "non_finite_forces",
        ),
    )


@case(
    "models",
    "generalized_forces returns shape (3,) for 2 coordinates",
    expect=r"generalized_forces",
)
def forces_wrong_shape():
    class Bad(CartesianPendulum):
        def generalized_forces(self, t, q, v):
            return jnp.zeros(3)

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("forces of shape (3,) accepted")


@case(
    "models",
    "generalized_forces returns a scalar (broadcast to every coordinate?)",
    expect=r"generalized_forces",
)
def forces_scalar():
    class Bad(CartesianPendulum):
        def generalized_forces(self, t, q, v):
            return -0.5 * v[0]

    sol = simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong(f"a scalar force accepted and broadcast (result {result_names(sol.result)})")


@case(
    "models", "generalized_forces returns a Python list of scalars", expect=r"`generalized_forces`"
)
def forces_list():
    class Listed(CartesianPendulum):
        def generalized_forces(self, t, q, v):
            return [0.0 * q[0], 0.0 * q[1]]

    return pend_ok(simulate(Listed(), BAUM, 0.0, 0.5, Q0, V0), 0.5)


@case("models", "constraints return shape (1, 1)", expect=r"`constraints`")
def constraints_2d():
    class Bad(CartesianPendulum):
        def constraints(self, t, q):
            return jnp.array([[q @ q - 1.0]])

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("2-D constraints accepted")


@case("models", "constraints return a tuple of one scalar", expect=r"`constraints`")
def constraints_tuple():
    class Tupled(CartesianPendulum):
        def constraints(self, t, q):
            return (q @ q - 1.0,)

    return pend_ok(simulate(Tupled(), BAUM, 0.0, 0.5, Q0, V0), 0.5)


@case("models", "constraints call NumPy on a tracer (np.sin)", expect=r"constraints")
def constraints_numpy():
    class Bad(CartesianPendulum):
        def constraints(self, t, q):
            return jnp.array([np.sin(q[0]) ** 2 + q[1] ** 2 - 1.0])

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("NumPy on a tracer accepted")


@case("models", "constraints branch with a Python `if` on q", expect=r"constraints")
def constraints_python_if():
    class Bad(CartesianPendulum):
        def constraints(self, t, q):
            if q[0] > 0:
                return jnp.array([q @ q - 1.0])
            return jnp.array([q @ q - 1.0])

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a Python branch on a tracer accepted")


@case("models", "velocity_constraints return shape (1, 1)", expect=r"velocity_constraints")
def velocity_constraints_2d():
    class Bad(CartesianPendulum):
        def velocity_constraints(self, t, q, v):
            return jnp.array([[v[0] * 0.0]])

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("2-D velocity constraints accepted")


@case("models", "the model raises its own exception", expect=r"user bug", user_error=True)
def model_raises():
    class Bad(CartesianPendulum):
        def constraints(self, t, q):
            raise ValueError("user bug in constraints")

    simulate(Bad(), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("no error")


@case("models", "potential_energy returns a Python int constant")
def potential_int():
    class Flat(CartesianPendulum):
        def potential_energy(self, t, q):
            return 1

    # no gravity: released at rest it stays
    return close(simulate(Flat(), BAUM, 0.0, 0.5, Q0, V0).q_final, Q0, 1e-8, "q(0.5)")


@case("models", "Coulomb friction -mu m g sign(v) on a bead on a line (discontinuous)")
def coulomb_friction():
    class Bead(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v

        def generalized_forces(self, t, q, v):
            return jnp.array([-0.5 * G * jnp.sign(v[0]), 0.0])

        def constraints(self, t, q):
            return jnp.array([q[1]])

    sol = simulate(
        Bead(), BAUM, 0.0, 0.5, jnp.zeros(2), jnp.array([1.0, 0.0]), max_steps=20_000, throw=False
    )
    stop = 1.0 / (2 * 0.5 * G)  # v0² / (2 μ g)
    return judge(
        sol,
        ("dt_min_reached", "max_steps_reached"),
        lambda s: close(s.q_final[0], stop, 1e-4, "stopping distance"),
    )


@case("models", "a kinked potential k|x| (non-differentiable at 0), bead on a line")
def kinked_potential():
    class Kink(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v

        def potential_energy(self, t, q):
            return 2.0 * jnp.abs(q[0])

        def constraints(self, t, q):
            return jnp.array([q[1]])

    # from x = 1 at rest: x = 0 at t = 1 (speed 2), x = -1 at rest at t = 2
    sol = simulate(Kink(), BAUM, 0.0, 2.0, jnp.array([1.0, 0.0]), jnp.zeros(2))
    return close(sol.q_final[0], -1.0, 1e-5, "x(2)")


@case(
    "models",
    "kinetic energy not quadratic in v: T = v²/2 + v⁴/10",
    expect=r"kinetic_energy|quadratic",
)
def non_quadratic_kinetic():
    class Quartic(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v + 0.1 * v[0] ** 4

        def potential_energy(self, t, q):
            return 0.5 * q[0] ** 2

        def constraints(self, t, q):
            return jnp.array([q[1]])

    # Euler-Lagrange: (1 + 1.2 v²) a = -x
    def rhs(t, y, args):
        return jnp.array([y[1], -y[0] / (1 + 1.2 * y[1] ** 2)])

    ref = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        diffrax.Tsit5(),
        0.0,
        1.0,
        0.01,
        jnp.array([0.0, 1.0]),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-14),
    ).ys[-1]
    sol = simulate(Quartic(), BAUM, 0.0, 1.0, jnp.zeros(2), jnp.array([1.0, 0.0]))
    return close(sol.q_final[0], ref[0], 1e-5, "x(1)")


@case("models", "kinetic energy with a gyroscopic term (rotating frame, linear in v)")
def gyroscopic_kinetic():
    omega = 2.0

    class Rotating(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            w = v[:2] + omega * jnp.array([-q[1], q[0]])
            return 0.5 * w @ w + 0.5 * v[2] ** 2

        def constraints(self, t, q):
            return jnp.array([q[2]])  # a third coordinate held at 0

    # q̈ = -2 ω J v + ω² q, J = [[0, -1], [1, 0]]
    def rhs(t, y, args):
        q, v = y[:2], y[2:]
        jv = jnp.array([-v[1], v[0]])
        return jnp.concatenate([v, -2 * omega * jv + omega**2 * q])

    ref = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        diffrax.Tsit5(),
        0.0,
        0.5,
        0.01,
        jnp.array([1.0, 0.0, 0.0, 0.5]),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-14),
    ).ys[-1]
    sol = simulate(
        Rotating(), BAUM, 0.0, 0.5, jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 0.5, 0.0])
    )
    return close(sol.q_final[:2], ref[:2], 1e-5, "q(0.5)")


@case("models", "a time-dependent mass T = (1 + t) v²/2 (d/dt of M v)")
def time_dependent_mass():
    class Growing(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * (1.0 + t) * v @ v

        def constraints(self, t, q):
            return jnp.array([q[1]])

    sol = simulate(Growing(), BAUM, 0.0, 1.0, jnp.zeros(2), jnp.array([1.0, 0.0]))
    return close(sol.q_final[0], np.log(2.0), 1e-6, "x(1) = ln 2")


@case("models", "a system without constraints (free fall) under Baumgarte")
def free_fall_no_constraints():
    class Free(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v

        def potential_energy(self, t, q):
            return G * q[1]

    sol = simulate(Free(), BAUM, 0.0, 1.0, jnp.zeros(2), jnp.array([1.0, 0.0]))
    return close(sol.q_final, [1.0, -0.5 * G], 1e-8, "q(1)")


@case("models", "a system with no coordinates at all (n = 0)", expect=r"`q0`|coordinates")
def zero_dof():
    class Nothing(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v

    sol = simulate(Nothing(), BAUM, 0.0, 1.0, jnp.zeros(0), jnp.zeros(0))
    if sol.succeeded and sol.q_final.shape == (0,):
        return ok("empty state returned")
    return wrong(f"n = 0 gave {result_names(sol.result)}, shape {sol.q_final.shape}")


# ============================================================================================
# constraints: redundant, inconsistent, singular
# ============================================================================================


@case("constraints", "a redundant consistent constraint (written twice), CoupledPerturbation")
def redundant_coupled():
    formulation = jaxdae.CoupledPerturbation(k10=-25.0, k11=-10.0)
    sol = simulate(Twice(), formulation, 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("singular_constraint_matrix",))


@case("constraints", "the redundant pair under ModifiedLagrange (runs through)")
def redundant_modified_lagrange():
    sol = simulate(Twice(), jaxdae.ModifiedLagrange(1e3, 10.0, 25.0), 0.0, 0.5, Q0, V0)
    return pend_ok(sol, 0.5, atol=5e-3)


@case("constraints", "3 consistent constraints on 2 coordinates (point fixed at origin)")
def overdetermined_pseudo():
    class Pinned(CartesianPendulum):
        def constraints(self, t, q):
            return jnp.array([q[0], q[1], q[0] + q[1]])

    sol = simulate(Pinned(), jaxdae.PseudoInverse(10.0, 25.0), 0.0, 0.5, jnp.zeros(2), jnp.zeros(2))
    return close(sol.q_final, [0.0, 0.0], 1e-8, "q(0.5)")


@case("constraints", "a constraint whose gradient vanishes at q0 (Φ = x², x0 = 0)")
def vanishing_gradient_start():
    class Square(CartesianPendulum):
        def constraints(self, t, q):
            return jnp.array([q[0] ** 2])

    sol = simulate(Square(), BAUM, 0.0, 0.5, jnp.zeros(2), jnp.zeros(2), throw=False)
    return judge(sol, ("singular_constraint_matrix",))


@case("constraints", "start 3x off the constraint, Baumgarte pulls it back (t1 = 3)")
def far_inconsistent_start():
    sol = simulate(PEND, BAUM, 0.0, 3.0, 3.0 * Q0, V0, ts=jnp.array([0.0, 3.0]))
    phi = float(np.max(np.abs(sol.phi[-1])))
    return ok(f"|Φ(3)| = {phi:.1e}") if phi < 1e-3 else wrong(f"|Φ(3)| = {phi:.3g}")


@case("constraints", "a radial start velocity (Φ̇ ≠ 0), Baumgarte pulls it back")
def inconsistent_velocity():
    sol = simulate(PEND, BAUM, 0.0, 3.0, Q0, 0.5 * Q0, ts=jnp.array([0.0, 3.0]))
    dphi = float(np.max(np.abs(sol.dphi[-1])))
    return ok(f"|Φ̇(3)| = {dphi:.1e}") if dphi < 1e-3 else wrong(f"|Φ̇(3)| = {dphi:.3g}")


@case("constraints", "contradicting constraints under Projected(Tsit5) with PseudoInverse")
def incompatible_projected():
    sol = simulate(
        Incompatible(),
        jaxdae.PseudoInverse(10.0, 25.0),
        0.0,
        0.5,
        Q0,
        V0,
        solver=jaxdae.Projected(diffrax.Tsit5()),
        throw=False,
    )
    return judge(sol, ("projection_failed", "constraints_not_met"))


@case("constraints", "contradicting constraints under Unstabilized")
def incompatible_unstabilized():
    sol = simulate(Incompatible(), jaxdae.Unstabilized(), 0.0, 0.5, Q0, V0, throw=False)
    return judge(sol, ("singular_constraint_matrix", "constraints_not_met"))


@case("constraints", "consistent_initial_state with Python lists")
def consistent_lists():
    q, v = jaxdae.consistent_initial_state(PEND, 0.0, [0.0, -2.0], [1.0, 1.0])
    return close(np.concatenate([q, v]), [0.0, -1.0, 1.0, 0.0], 1e-10, "projected state")


@case("constraints", "consistent_initial_state of a system without constraints")
def consistent_no_constraints():
    class Free(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v

    q, v = jaxdae.consistent_initial_state(
        Free(), 0.0, jnp.array([0.3, 0.4]), jnp.array([1.0, 2.0])
    )
    return close(np.concatenate([q, v]), [0.3, 0.4, 1.0, 2.0], 1e-14, "state")


@case("constraints", "consistent_initial_state(max_steps=0)", expect=r"`max_steps`")
def consistent_max_steps_zero():
    jaxdae.consistent_initial_state(PEND, 0.0, 1.1 * Q0, V0, max_steps=0)
    return wrong("max_steps=0 accepted")


@case("constraints", "consistent_initial_state with v0 of the wrong length", expect=r"`v0`")
def consistent_v0_shape():
    jaxdae.consistent_initial_state(PEND, 0.0, Q0, jnp.zeros(3))
    return wrong("v0 of length 3 accepted")


@case(
    "constraints",
    "consistent_initial_state from the centre (no nearest point)",
    expect=r"consistent|singular",
)
def consistent_from_centre():
    q, v, found = jaxdae.consistent_initial_state(
        PEND, 0.0, jnp.zeros(2), jnp.zeros(2), throw=False
    )
    if not bool(found):
        return named("found = False")
    phi = abs(float(q @ q) - 1.0)
    return ok(f"|Φ| = {phi:.1e}") if phi < 1e-8 else wrong(f"found, but |Φ| = {phi:.3g}")


@case("constraints", "gradient of consistent_initial_state w.r.t. q0 vs finite differences")
def consistent_grad():
    def f(x):
        q, _ = jaxdae.consistent_initial_state(PEND, 0.0, jnp.array([x, -1.2]), jnp.zeros(2))
        return q[0]

    grad = float(jax.grad(f)(0.5))
    # nearest point of the unit circle: q/|q|, d/dx (x / r) = y² / r³
    expected = 1.2**2 / (0.5**2 + 1.2**2) ** 1.5
    return close(grad, expected, 1e-6, "dq/dx0")


# ============================================================================================
# jit, vmap and grad
# ============================================================================================


@functools.cache
def _vmapped_t1():
    return jax.jit(jax.vmap(lambda t1: simulate(PEND, BAUM, 0.0, t1, Q0, V0, throw=False)))


def _batch_verdict(sol, bad, expected, others, reference):
    names = result_names(sol.result)
    if names[bad] == "successful":
        return wrong(f"member {bad} succeeded: {names}")
    if names[bad] not in expected:
        return misnamed(f"member {bad}: {names[bad]}, expected {expected}")
    for i in others:
        if names[i] != "successful":
            return lost(f"member {i} failed too: {names}")
        verdict = close(sol.q_final[i], reference(i), 1e-5, f"member {i}")
        if verdict.kind != "ok":
            return lost(verdict.detail)
    return named(f"{names}")


@case("transforms", "vmap over t1 with a member t1 < t0, throw=False")
def vmap_t1_before_t0():
    t1 = jnp.array([0.5, -1.0, 0.3])
    sol = _vmapped_t1()(t1)
    return _batch_verdict(sol, 1, ("invalid_input",), (0, 2), lambda i: truth(float(t1[i]))[0])


@case("transforms", "vmap over t1 with a member t1 == t0, throw=False")
def vmap_t1_equal_t0():
    t1 = jnp.array([0.5, 0.0, 0.3])
    sol = _vmapped_t1()(t1)
    return _batch_verdict(sol, 1, ("invalid_input",), (0, 2), lambda i: truth(float(t1[i]))[0])


@case("transforms", "vmap over t1 with a member t1 = nan, throw=False")
def vmap_t1_nan():
    t1 = jnp.array([0.5, jnp.nan, 0.3])
    sol = _vmapped_t1()(t1)
    return _batch_verdict(sol, 1, ("invalid_input",), (0, 2), lambda i: truth(float(t1[i]))[0])


@case("transforms", "grad of x(t1) w.r.t. t1 equals the velocity v_x(t1)")
def grad_t1():
    def f(t1):
        return simulate(PEND, BAUM, 0.0, t1, Q0, V0).q_final[0]

    return close(float(jax.grad(f)(0.5)), truth(0.5)[1][0], 1e-5, "dx/dt1")


@case("transforms", "grad of x(t1) w.r.t. t0 equals -v_x(t1) (autonomous)")
def grad_t0():
    def f(t0):
        return simulate(PEND, BAUM, t0, 0.5, Q0, V0).q_final[0]

    return close(float(jax.grad(f)(0.0)), -truth(0.5)[1][0], 1e-5, "dx/dt0")


@case("transforms", "grad of x(t1) w.r.t. the pendulum length vs finite differences")
def grad_length():
    def f(length):
        pendulum = CartesianPendulum(length=length)
        q0, v0 = pendulum.state_from_angle(THETA0, 0.0)
        return simulate(pendulum, BAUM, 0.0, 0.5, q0, v0, rtol=1e-10, atol=1e-12).q_final[0]

    def reference(length):
        return truth(0.5, length=length)[0][0]

    return close(float(jax.grad(f)(jnp.asarray(1.0))), fd(reference, 1.0), 1e-4, "dx/dl")


@case(
    "transforms",
    "grad through a failing solve (max_steps=3), throw=True",
    expect=r"maximum number|max_steps",
)
def grad_failing_throw():
    def f(kd):
        return simulate(PEND, jaxdae.Baumgarte(kd, 25.0), 0.0, 0.5, Q0, V0, max_steps=3).q_final[0]

    g = jax.grad(f)(10.0)
    return wrong(f"no error; gradient {g}")


@case("transforms", "grad w.r.t. kd through Projected(Tsit5) vs finite differences")
def grad_projected():
    def f(kd):
        sol = simulate(
            PEND,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            0.3,
            Q0,
            V0 + 0.3,
            solver=jaxdae.Projected(diffrax.Tsit5()),
            rtol=1e-10,
            atol=1e-12,
        )
        return sol.q_final[0]

    return close(float(jax.grad(f)(10.0)), float(fd(f, 10.0, 1e-4)), 1e-5, "dx/dkd")


@case("transforms", "jax.hessian of the final x w.r.t. kp", expect=r"ForwardMode|forward")
def hessian_kp():
    def f(kp):
        return simulate(PEND, jaxdae.Baumgarte(10.0, kp), 0.0, 0.3, 1.05 * Q0, V0).q_final[0]

    h = float(jax.hessian(f)(25.0))
    expected = float(fd(lambda k: jax.grad(f)(k), 25.0, 1e-3))
    return close(h, expected, 1e-5, "d²x/dkp²")


@case("transforms", "jax.jacfwd w.r.t. q0 with adjoint=ForwardMode()")
def jacfwd_forward_mode():
    def f(x):
        q0 = jnp.array([x, Q0[1]])
        return simulate(
            PEND, BAUM, 0.0, 0.3, q0, V0, adjoint=diffrax.ForwardMode(), rtol=1e-10, atol=1e-12
        ).q_final[0]

    return close(float(jax.jacfwd(f)(Q0[0])), float(fd(f, Q0[0], 1e-5)), 1e-5, "dx/dx0")


@case("transforms", "vmap over lengths with a nan member, throw=False")
def vmap_param_nan_member():
    lengths = jnp.array([1.0, jnp.nan, 1.2])

    def run(length):
        pendulum = CartesianPendulum(length=length)
        q0 = length * jnp.array([jnp.sin(THETA0), -jnp.cos(THETA0)])
        return simulate(pendulum, BAUM, 0.0, 0.3, q0, V0, throw=False)

    sol = jax.vmap(run)(lengths)
    expected = ("invalid_input", "non_finite_constraints", "non_finite_forces", "dt_min_reached")
    return _batch_verdict(
        sol, 1, expected, (0, 2), lambda i: truth(0.3, length=float(lengths[i]))[0]
    )


@case("transforms", "vmap over t1, one member hits max_steps, throw=False")
def vmap_member_max_steps():
    t1 = jnp.array([0.3, 100.0])
    sol = jax.vmap(lambda t: simulate(PEND, BAUM, 0.0, t, Q0, V0, max_steps=200, throw=False))(t1)
    return _batch_verdict(sol, 1, ("max_steps_reached",), (0,), lambda i: truth(0.3)[0])


@case("transforms", "nested vmap (2 x 2 batch of start angles)")
def nested_vmap():
    angles = jnp.array([[0.3, 0.5], [0.7, 0.9]])

    def run(a):
        q0, v0 = PEND.state_from_angle(a, 0.0)
        return simulate(PEND, BAUM, 0.0, 0.3, q0, v0).q_final

    out = jax.vmap(jax.vmap(run))(angles)
    expected = np.stack([[truth(0.3, theta0=float(a))[0] for a in row] for row in angles])
    return close(out, expected, 1e-5, "batch")


@case(
    "transforms",
    "filter_jit solve that fails (max_steps), throw=True",
    expect=r"maximum number|max_steps",
)
def filter_jit_failure():
    run = eqx.filter_jit(lambda q: simulate(PEND, BAUM, 0.0, 0.5, q, V0, max_steps=3).q_final)
    out = run(Q0)
    return wrong(f"no error: {out}")


@case(
    "transforms",
    "jax.jit solve whose model turns nan mid-run, throw=True",
    expect=r"step size|dt_min|non-finite",
)
def jit_nan_mid_run():
    class Late(CartesianPendulum):
        def potential_energy(self, t, q):
            return G * q[1] * (1 + jnp.sqrt(0.2 - t) - jnp.sqrt(0.2 - t))

    run = jax.jit(lambda q: simulate(Late(), BAUM, 0.0, 0.5, q, V0).q_final)
    out = jax.block_until_ready(run(Q0))
    return wrong(f"no error: {out}")


@case("transforms", "grad of sum(x(ts)) w.r.t. traced ts equals v_x at ts")
def grad_ts():
    ts = jnp.array([0.1, 0.3])

    def f(ts):
        return jnp.sum(simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=ts).q[:, 0])

    grad = jax.grad(f)(ts)
    return close(grad, [truth(0.1)[1][0], truth(0.3)[1][0]], 1e-5, "d/dts")


@case("transforms", "vmap over ts rows, one row unsorted, throw=False")
def vmap_ts_unsorted_row():
    rows = jnp.array([[0.0, 0.2, 0.5], [0.0, 0.4, 0.2], [0.0, 0.1, 0.5]])
    sol = jax.vmap(lambda ts: simulate(PEND, BAUM, 0.0, 0.5, Q0, V0, ts=ts, throw=False))(rows)
    return _batch_verdict(sol, 1, ("invalid_input",), (0, 2), lambda i: truth(0.5)[0])


@case("transforms", "grad with max_steps=None (default adjoint)", expect=r"max_steps")
def grad_max_steps_none():
    def f(kd):
        return simulate(
            PEND,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            0.3,
            1.05 * Q0,
            V0,
            max_steps=None,
            rtol=1e-10,
            atol=1e-12,
        ).q_final[0]

    return close(float(jax.grad(f)(10.0)), float(fd(f, 10.0, 1e-4)), 1e-5, "dx/dkd")


# ============================================================================================
# simulate_ensemble
# ============================================================================================


@case("ensembles", "an ensemble of zero rows", expect=r"`q0`|rows|empty|batch")
def ensemble_empty():
    sol = jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, jnp.zeros((0, 2)), jnp.zeros((0, 2)))
    if sol.q_final.shape == (0, 2):
        return ok("an empty ensemble returns empty arrays")
    return wrong(f"shape {sol.q_final.shape}")


@case("ensembles", "an ensemble of one row equals simulate")
def ensemble_one_row():
    sol = jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, Q0[None], V0[None])
    return close(sol.q_final[0], truth(0.5)[0], 1e-5, "row 0")


@case("ensembles", "a row starting at the singular centre (Baumgarte), throw=False")
def ensemble_singular_row():
    q0 = jnp.stack([Q0, jnp.zeros(2), 0.9 * Q0 / jnp.linalg.norm(Q0)])
    v0 = jnp.zeros((3, 2))
    sol = jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.3, q0, v0, throw=False)
    alone = [simulate(PEND, BAUM, 0.0, 0.3, q0[i], v0[i], throw=False) for i in (1, 2)]
    # What the row gives alone (the formulation's test, eagerly), or, traced in the batch
    # where the row's rates turn non-finite first, the stall at its vanishing Jacobian.
    expected = (*result_names(alone[0].result), "stalled_near_singular_constraints")
    return _batch_verdict(
        sol, 1, expected, (0, 2), lambda i: truth(0.3)[0] if i == 0 else alone[1].q_final
    )


@case("ensembles", "grad over the good rows of an ensemble with a singular row")
def ensemble_grad_failed_row():
    v0 = jnp.zeros((3, 2))

    def loss(q0):
        sol = jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.3, q0, v0, throw=False)
        return sol.q_final[0, 0] + sol.q_final[2, 0]

    q0 = jnp.stack([Q0, jnp.zeros(2), 1.02 * Q0])
    grad = jax.grad(loss)(q0)
    alone = [
        jax.grad(lambda q: simulate(PEND, BAUM, 0.0, 0.3, q, jnp.zeros(2)).q_final[0])(q0[i])
        for i in (0, 2)
    ]
    verdict = close(grad[np.array([0, 2])], np.stack(alone), 1e-6, "good rows' gradient")
    if verdict.kind != "ok":
        return lost(verdict.detail)
    return verdict


@case("ensembles", "per-row constraint_tol [1e-15, 1e-3]", expect=r"`constraint_tol`")
def ensemble_constraint_tol_rows():
    sol = jaxdae.simulate_ensemble(
        PEND,
        BAUM,
        0.0,
        0.5,
        jnp.stack([Q0, Q0]),
        jnp.stack([V0, V0]),
        constraint_tol=jnp.array([1e-15, 1e-3]),
        throw=False,
    )
    names = result_names(sol.result)
    if names == ["constraint_tol_exceeded", "successful"]:
        return named(f"{names}")
    return misnamed(f"{names}")


@case("ensembles", "an ensemble with Projected(Tsit5) equals per-row simulate")
def ensemble_projected():
    solver = jaxdae.Projected(diffrax.Tsit5())
    q0 = jnp.stack([Q0, PEND.state_from_angle(0.8, 0.0)[0]])
    sol = jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, q0, jnp.zeros((2, 2)), solver=solver)
    return close(sol.q_final, np.stack([truth(0.5)[0], truth(0.5, theta0=0.8)[0]]), 1e-5, "rows")


@case("ensembles", "a float32 ensemble")
def ensemble_float32():
    q0 = jnp.stack([Q0, Q0]).astype(jnp.float32)
    sol = jaxdae.simulate_ensemble(
        PEND, BAUM, 0.0, 0.5, q0, jnp.zeros_like(q0), rtol=1e-5, atol=1e-7
    )
    return close(sol.q_final, np.stack([truth(0.5)[0]] * 2), 1e-3, "rows")


@case("ensembles", "an ensemble from nested Python lists")
def ensemble_lists():
    q0 = [[float(Q0[0]), float(Q0[1])]] * 2
    sol = jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, q0, [[0.0, 0.0]] * 2)
    return close(sol.q_final, np.stack([truth(0.5)[0]] * 2), 1e-5, "rows")


@case("ensembles", "vmap over simulate_ensemble")
def ensemble_vmapped():
    q0 = jnp.stack([jnp.stack([Q0, Q0]), jnp.stack([Q0, Q0])])
    sol = jax.vmap(lambda q: jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, q, jnp.zeros_like(q)))(
        q0
    )
    return close(sol.q_final, np.broadcast_to(truth(0.5)[0], (2, 2, 2)), 1e-5, "rows")


@case("ensembles", "an ensemble with ts beyond t1", expect=r"`ts`")
def ensemble_ts_outside():
    jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, Q0[None], V0[None], ts=jnp.array([0.0, 1.0]))
    return wrong("ts beyond t1 accepted")


@case("ensembles", "an ensemble with q0 of shape (2, 2, 2)", expect=r"`q0`|shape")
def ensemble_3d():
    jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, jnp.zeros((2, 2, 2)), jnp.zeros((2, 2, 2)))
    return wrong("a 3-D q0 accepted")


@case("ensembles", "an ensemble with a row whose t1 is traced per row (vmap inside jit)")
def ensemble_rows_under_jit():
    run = jax.jit(
        lambda q: jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.5, q, jnp.zeros_like(q)).q_final
    )
    out = run(jnp.stack([Q0, PEND.state_from_angle(0.2, 0.0)[0]]))
    return close(out, np.stack([truth(0.5)[0], truth(0.5, theta0=0.2)[0]]), 1e-5, "rows")


# ============================================================================================
# solvers, controllers and adjoints
# ============================================================================================


@case("solvers", "Kvaerno5 (implicit) on the pendulum")
def solver_kvaerno5():
    return pend_ok(pend(solver=diffrax.Kvaerno5()), 0.5, atol=1e-5)


@case("solvers", "jaxdae.Rodas5P on the pendulum")
def solver_rodas():
    return pend_ok(pend(solver=jaxdae.Rodas5P()), 0.5, atol=1e-5)


@case("solvers", "Dopri8 with ConstantStepSize(dt0=0.01)")
def solver_dopri8_fixed():
    sol = pend(solver=diffrax.Dopri8(), stepsize_controller=diffrax.ConstantStepSize(), dt0=0.01)
    return pend_ok(sol, 0.5, atol=1e-6)


@case(
    "solvers",
    "Euler (no error estimate) with the default adaptive controller",
    expect=r"Euler|error estimate|ConstantStepSize|adaptive",
)
def solver_euler_adaptive():
    sol = pend(solver=diffrax.Euler())
    return wrong(f"Euler accepted with an adaptive controller: {result_names(sol.result)}")


@case("solvers", "StepTo controller with dt0 given too", expect=r"dt0|StepTo")
def stepto_with_dt0():
    sol = pend(stepsize_controller=diffrax.StepTo(ts=jnp.linspace(0.0, 0.5, 51)), dt0=0.01)
    return pend_ok(sol, 0.5, atol=1e-4)


@case("solvers", "StepTo whose times end before t1", expect=r"StepTo|`ts`|t1")
def stepto_short():
    sol = pend(stepsize_controller=diffrax.StepTo(ts=jnp.linspace(0.0, 0.3, 31)), throw=False)
    return wrong(f"StepTo ending at 0.3 < t1 accepted: {result_names(sol.result)}")


@case("solvers", "BacksolveAdjoint grad vs finite differences", expect=r"BacksolveAdjoint")
def backsolve_grad():
    def f(kd):
        return simulate(
            PEND,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            0.3,
            1.05 * Q0,
            V0,
            adjoint=diffrax.BacksolveAdjoint(),
            rtol=1e-10,
            atol=1e-12,
        ).q_final[0]

    return close(float(jax.grad(f)(10.0)), float(fd(f, 10.0, 1e-4)), 1e-4, "dx/dkd")


@case("solvers", "DirectAdjoint grad vs finite differences")
def direct_adjoint_grad():
    def f(kd):
        return simulate(
            PEND,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            0.3,
            1.05 * Q0,
            V0,
            adjoint=diffrax.DirectAdjoint(),
            rtol=1e-10,
            atol=1e-12,
            max_steps=4096,
        ).q_final[0]

    return close(float(jax.grad(f)(10.0)), float(fd(f, 10.0, 1e-4)), 1e-5, "dx/dkd")


@case(
    "solvers",
    "ImplicitAdjoint (steady states only)",
    expect=r"ImplicitAdjoint.*(simulate|jaxdae|steady)|`adjoint` must",
)
def implicit_adjoint():
    def f(kd):
        return simulate(
            PEND, jaxdae.Baumgarte(kd, 25.0), 0.0, 0.3, Q0, V0, adjoint=diffrax.ImplicitAdjoint()
        ).q_final[0]

    g = jax.grad(f)(10.0)
    return wrong(f"ImplicitAdjoint accepted, gradient {g}")


@case("solvers", "ReverseSweepAdjoint(stored_steps=0)", expect=r"stored_steps")
def reverse_sweep_zero():
    jaxdae.ReverseSweepAdjoint(stored_steps=0)
    return wrong("stored_steps=0 accepted")


@case("solvers", "UnrolledERK(Kvaerno5()) (not explicit)", expect=r"explicit|Runge")
def unrolled_implicit():
    jaxdae.UnrolledERK(diffrax.Kvaerno5())
    return wrong("UnrolledERK of an implicit solver accepted")


@case("solvers", "UnrolledERK(Tsit5()) on the pendulum")
def unrolled_tsit5():
    return pend_ok(pend(solver=jaxdae.UnrolledERK(diffrax.Tsit5())), 0.5)


@case("solvers", "GeneralizedAlpha on the pendulum")
def generalized_alpha():
    return pend_ok(pend(solver=jaxdae.GeneralizedAlpha()), 0.5, atol=1e-3)


@case("solvers", "Projected(iterations=2.5)", expect=r"`iterations`")
def projected_iterations_float():
    jaxdae.Projected(diffrax.Tsit5(), iterations=2.5)
    return wrong("iterations=2.5 accepted")


@case("solvers", "Projected(Projected(Tsit5())) nested", expect=r"Projected")
def projected_nested():
    sol = pend(solver=jaxdae.Projected(jaxdae.Projected(diffrax.Tsit5())))
    return pend_ok(sol, 0.5)


@case(
    "solvers",
    "Projected(Tsit5()) from a start 5% off the constraint (default tolerances)",
    expect=r"`q0`|initial|consistent_initial_state",
)
def projected_inconsistent_start():
    sol = simulate(PEND, BAUM, 0.0, 0.5, 1.05 * Q0, V0, solver=jaxdae.Projected(diffrax.Tsit5()))
    phi = float(np.max(np.abs(sol.phi[-1])))
    return ok(f"|Φ(t1)| = {phi:.1e}") if phi < 1e-9 else wrong(f"|Φ(t1)| = {phi:.3g}")


@case("solvers", "Projected(Kvaerno5()) (implicit inner solver)")
def projected_kvaerno():
    return pend_ok(pend(solver=jaxdae.Projected(diffrax.Kvaerno5())), 0.5)


@case("solvers", "Projected(Euler) with coarse fixed steps keeps Φ = 0")
def projected_euler_coarse():
    sol = pend(
        solver=jaxdae.Projected(diffrax.Euler()),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=0.05,
    )
    phi = float(np.max(np.abs(sol.phi)))
    return ok(f"|Φ| ≤ {phi:.1e}") if phi < 1e-9 else wrong(f"|Φ| = {phi:.3g}")


@case("solvers", "PIDController(dtmax=1e-5) with max_steps=100")
def pid_dtmax_tiny():
    sol = pend(
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10, dtmax=1e-5),
        max_steps=100,
        throw=False,
    )
    return judge(sol, ("max_steps_reached",))


@case("solvers", "ClipStepSizeController with step_ts outside the span")
def clip_step_ts_outside():
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-8, atol=1e-10), step_ts=jnp.array([5.0, 6.0])
    )
    return pend_ok(pend(stepsize_controller=controller), 0.5)


@case("solvers", "ClipStepSizeController with unsorted jump_ts", expect=r"`jump_ts`")
def clip_jump_ts_unsorted():
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-8, atol=1e-10), jump_ts=jnp.array([0.4, 0.2])
    )
    return pend_ok(pend(stepsize_controller=controller), 0.5)


@case(
    "solvers",
    "a solver instance of the wrong kind (a diffrax adjoint as solver)",
    expect=r"`solver`",
)
def solver_wrong_kind():
    pend(solver=diffrax.RecursiveCheckpointAdjoint())
    return wrong("an adjoint accepted as a solver")


# ============================================================================================
# one-sided constraints: events
# ============================================================================================

BALL_Q0 = jnp.array([0.0, 1.0])


def _ball(e=0.8, **kw):
    return BouncingBall(e=e, **kw)


@case("events", "BouncingBall with e = 0 comes to rest on the floor")
def ball_plastic():
    sol = simulate(_ball(0.0), jaxdae.Unstabilized(), 0.0, 1.0, BALL_Q0, jnp.zeros(2))
    return close(sol.q_final[1], 0.0, 1e-6, "y(1)")


@case("events", "BouncingBall with e = 1 against the closed form")
def ball_elastic():
    t1 = 1.0  # impact at t* = √(2/g) = 0.4515, back at the top at 2 t*
    sol = simulate(_ball(1.0), jaxdae.Unstabilized(), 0.0, t1, BALL_Q0, jnp.zeros(2))
    tstar = np.sqrt(2.0 / G)
    y = 1.0 - 0.5 * G * (2 * tstar - t1) ** 2
    return close(sol.q_final[1], y, 1e-6, "y(1)")


@case("events", "BouncingBall starting on the floor moving down (impact at t0)")
def ball_impact_at_t0():
    sol = simulate(
        _ball(0.8), jaxdae.Unstabilized(), 0.0, 0.1, jnp.zeros(2), jnp.array([0.0, -1.0])
    )
    y = 0.8 * 0.1 - 0.5 * G * 0.1**2
    return close(sol.q_final[1], y, 1e-6, "y(0.1)")


@case("events", "BouncingBall at rest on the floor stays there")
def ball_resting():
    sol = simulate(_ball(0.8), jaxdae.Unstabilized(), 0.0, 0.5, jnp.zeros(2), jnp.zeros(2))
    return close(sol.q_final, [0.0, 0.0], 1e-6, "q(0.5)")


@case("events", "EventDriven(min_bounce_speed=-1)", expect=r"`min_bounce_speed`")
def events_min_bounce_negative():
    jaxdae.EventDriven(min_bounce_speed=-1.0)
    return wrong("min_bounce_speed=-1 accepted")


@case("events", "EventDriven(gap_tolerance=nan)", expect=r"`gap_tolerance`")
def events_gap_tol_nan():
    jaxdae.EventDriven(gap_tolerance=float("nan"))
    return wrong("gap_tolerance=nan accepted")


@case("events", "EventDriven(max_events=2.5)", expect=r"`max_events`")
def events_max_events_float():
    jaxdae.EventDriven(max_events=2.5)
    return wrong("max_events=2.5 accepted")


@case("events", "events=EventDriven() on a system without gaps", expect=r"gaps|`events`")
def events_without_gaps():
    return pend_ok(pend(events=jaxdae.EventDriven()), 0.5)


@case("events", "vmap over drop heights: first impact time vs √(2h/g)")
def ball_vmap_heights():
    heights = jnp.array([0.5, 1.0])

    def run(h):
        sol = simulate(
            _ball(0.8),
            jaxdae.Unstabilized(),
            0.0,
            0.5,
            jnp.array([0.0, h]),
            jnp.zeros(2),
            throw=False,
        )
        return sol.events.t[0]

    return close(
        jax.vmap(run)(heights), np.sqrt(2 * np.asarray(heights) / G), 1e-6, "first impact times"
    )


@case("events", "grad of y(0.6) after one bounce w.r.t. the height vs closed form")
def ball_grad_height():
    e = 0.8

    def y_final(h):
        return simulate(
            _ball(e),
            jaxdae.Unstabilized(),
            0.0,
            0.6,
            jnp.stack([0.0, h]),
            jnp.zeros(2),
            rtol=1e-10,
            atol=1e-12,
        ).q_final[1]

    def closed(h):
        t1 = np.sqrt(2 * h / G)
        s = 0.6 - t1
        return e * np.sqrt(2 * G * h) * s - 0.5 * G * s**2

    return close(float(jax.grad(y_final)(1.0)), fd(closed, 1.0), 1e-5, "dy/dh")


@case("events", "BouncingBall without gravity, moving up (no impact)")
def ball_no_gravity():
    sol = simulate(
        _ball(0.8, gravity=0.0), jaxdae.Unstabilized(), 0.0, 1.0, BALL_Q0, jnp.array([0.0, 1.0])
    )
    return close(sol.q_final[1], 2.0, 1e-8, "y(1)")


@case("events", "BouncingBall(e=nan)", expect=r"restitution|`e`")
def ball_e_nan():
    simulate(_ball(jnp.nan), jaxdae.Unstabilized(), 0.0, 1.0, BALL_Q0, jnp.zeros(2))
    return wrong("e = nan accepted")


@case("events", "SlidingBlock(friction_coefficient=-0.5)", expect=r"friction")
def sliding_negative_friction():
    from jaxdae.examples import SlidingBlock

    block = SlidingBlock(friction_coefficient=-0.5)
    simulate(block, jaxdae.Unstabilized(), 0.0, 0.5, jnp.zeros(2), jnp.array([1.0, 0.0]))
    return wrong("a negative friction coefficient accepted")


@case("events", "BouncingBall in float32")
def ball_float32():
    sol = simulate(
        _ball(0.8),
        jaxdae.Unstabilized(),
        0.0,
        0.5,
        BALL_Q0.astype(jnp.float32),
        jnp.zeros(2, jnp.float32),
        rtol=1e-5,
        atol=1e-7,
    )
    return close(sol.events.t[0], np.sqrt(2 / G), 1e-4, "first impact")


@case("events", "BouncingBall with Projected(Tsit5)")
def ball_projected():
    sol = simulate(
        _ball(0.8),
        jaxdae.Unstabilized(),
        0.0,
        0.5,
        BALL_Q0,
        jnp.zeros(2),
        solver=jaxdae.Projected(diffrax.Tsit5()),
    )
    return close(sol.events.t[0], np.sqrt(2 / G), 1e-6, "first impact")


@case("events", "BouncingBall with a ball starting below the floor at y = -1e-12", expect=r"gap")
def ball_just_below():
    sol = simulate(
        _ball(0.8), jaxdae.Unstabilized(), 0.0, 0.3, jnp.array([0.0, -1e-12]), jnp.zeros(2)
    )
    return close(sol.q_final[1], 0.0, 1e-6, "y")


# ============================================================================================
# contact in space
# ============================================================================================


R_BALL = 0.1


def _sphere(mu=0.3, radius=R_BALL, body="ball", restitution=0.0):
    """A uniform sphere resting on the ground in space, with Coulomb friction `mu`."""
    return mb.Mechanism(
        bodies=[
            mb.RigidBody(
                "ball", mass=1.0, inertia=0.4 * R_BALL**2 * np.eye(3), position=[0, 0, R_BALL]
            )
        ],
        forces=[mb.Gravity([0.0, 0.0, -G])],
        stops=[mb.PlaneContact(body, radius=radius, friction=mu, restitution=restitution)],
    )


def _launched(speed, ball=None):
    ball = _sphere() if ball is None else ball
    q0, v0 = ball.initial_state()
    return ball, q0, v0.at[0].set(speed)


@case("contact", "PlaneContact in space with friction -0.3", expect=r"friction|μ")
def sphere_negative_friction():
    ball, q0, v0 = _launched(1.0, _sphere(mu=-0.3))
    simulate(ball, jaxdae.Unstabilized(), 0.0, 0.1, q0, v0)
    return wrong("a negative friction coefficient accepted")


@case("contact", "PlaneContact in space with friction nan", expect=r"friction|μ")
def sphere_nan_friction():
    ball, q0, v0 = _launched(1.0, _sphere(mu=jnp.nan))
    simulate(ball, jaxdae.Unstabilized(), 0.0, 0.1, q0, v0)
    return wrong("a nan friction coefficient accepted")


@case("contact", "PlaneContact in space with friction nan, traced", expect=r"friction|μ")
def sphere_nan_friction_traced():
    def final(mu):
        ball, q0, v0 = _launched(1.0, _sphere(mu=mu))
        return simulate(ball, jaxdae.Unstabilized(), 0.0, 0.1, q0, v0).q_final

    q = jax.jit(final)(jnp.nan)
    return wrong(f"a traced nan friction coefficient accepted: q = {np.asarray(q)[:3]}")


@case("contact", "PlaneContact with radius -0.1", expect=r"radius")
def sphere_negative_radius():
    ball, q0, v0 = _launched(1.0, _sphere(radius=-0.1))
    simulate(ball, jaxdae.Unstabilized(), 0.0, 0.1, q0, v0)
    return wrong("a negative contact radius accepted")


@case("contact", "PlaneContact on a body that does not exist", expect=r"'wheel'|body")
def sphere_unknown_body():
    _sphere(body="wheel")
    return wrong("a contact on an unknown body accepted")


@case("contact", "TimeStepping(dt=0)", expect=r"dt|step")
def time_stepping_zero_step():
    ball, q0, v0 = _launched(1.0)
    simulate(ball, BAUM, 0.0, 0.1, q0, v0, events=jaxdae.TimeStepping(dt=0.0))
    return wrong("a zero time step accepted")


@case("contact", "TimeStepping(dt=-1e-3)", expect=r"dt|step")
def time_stepping_negative_step():
    ball, q0, v0 = _launched(1.0)
    simulate(ball, BAUM, 0.0, 0.1, q0, v0, events=jaxdae.TimeStepping(dt=-1e-3))
    return wrong("a negative time step accepted")


@case("contact", "TimeStepping(dt=nan)", expect=r"dt|step")
def time_stepping_nan_step():
    ball, q0, v0 = _launched(1.0)
    simulate(ball, BAUM, 0.0, 0.1, q0, v0, events=jaxdae.TimeStepping(dt=float("nan")))
    return wrong("a nan time step accepted")


def _roll_time(speed, mu=0.3):
    return 2 * speed / (7 * mu * G)


@case("contact", "a sphere launched sliding rolls at 2 v0 / (7 mu g), event-driven")
def sphere_rolls_event_driven():
    ball, q0, v0 = _launched(2.0)
    sol = simulate(ball, jaxdae.Unstabilized(), 0.0, 0.5, q0, v0, rtol=1e-10, atol=1e-12)
    verdict = close(sol.events.t[0], _roll_time(2.0), 1e-8, "roll time")
    if verdict.kind != "ok":
        return verdict
    return close(sol.v_final[0], 5 * 2.0 / 7, 1e-8, "rolling speed")


@case("contact", "the sphere's rolling speed by TimeStepping(dt=1e-3)")
def sphere_rolls_time_stepping():
    ball, q0, v0 = _launched(2.0)
    sol = simulate(ball, BAUM, 0.0, 0.5, q0, v0, events=jaxdae.TimeStepping(dt=1e-3))
    return close(sol.v_final[0], 5 * 2.0 / 7, 1e-2, "rolling speed")


@case("contact", "vmap(grad) of the sphere's roll time w.r.t. the launch speed")
def sphere_roll_time_vmap_grad():
    ball, q0, v0 = _launched(2.0)

    def roll_time(speed):
        sol = simulate(
            ball, jaxdae.Unstabilized(), 0.0, 0.5, q0, v0.at[0].set(speed), rtol=1e-10, atol=1e-12
        )
        return sol.events.t[0]

    speeds = jnp.array([1.0, 1.5, 2.0])
    return close(
        jax.vmap(jax.grad(roll_time))(speeds), np.full(3, 2 / (7 * 0.3 * G)), 1e-6, "dt/dv0"
    )


@case("contact", "jacfwd (ForwardMode) of the sphere's roll time w.r.t. mu")
def sphere_roll_time_jacfwd_mu():
    def roll_time(mu):
        ball, q0, v0 = _launched(2.0, _sphere(mu=mu))
        sol = simulate(
            ball,
            jaxdae.Unstabilized(),
            0.0,
            0.5,
            q0,
            v0,
            rtol=1e-10,
            atol=1e-12,
            adjoint=diffrax.ForwardMode(),
        )
        return sol.events.t[0]

    return close(jax.jacfwd(roll_time)(0.3), -_roll_time(2.0) / 0.3, 1e-6, "dt/dmu")


@case("contact", "the sphere's roll time in float32")
def sphere_float32():
    ball = _sphere(mu=jnp.asarray(0.3, jnp.float32))
    q0, v0 = ball.initial_state()
    q0, v0 = q0.astype(jnp.float32), v0.astype(jnp.float32).at[0].set(2.0)
    sol = simulate(ball, jaxdae.Unstabilized(), 0.0, 0.5, q0, v0, rtol=1e-5, atol=1e-7)
    return close(sol.events.t[0], _roll_time(2.0), 1e-4, "roll time")


@case("contact", "grad of the sphere's distance at t = 0.5 w.r.t. mu by TimeStepping")
def sphere_time_stepping_grad_mu():
    speed, t1 = 2.0, 0.5

    def distance(mu):
        ball, q0, v0 = _launched(speed, _sphere(mu=mu))
        sol = simulate(ball, BAUM, 0.0, t1, q0, v0, events=jaxdae.TimeStepping(dt=1e-4))
        return sol.q_final[0]

    def closed(mu):
        tr = _roll_time(speed, mu)
        return speed * tr - 0.5 * mu * G * tr**2 + 5 * speed / 7 * (t1 - tr)

    return close(jax.grad(distance)(0.3), fd(closed, 0.3), 2e-2, "dx/dmu")


@case("contact", "a URDF link with a collision cylinder as contacts", expect=r"cylinder")
def urdf_collision_cylinder():
    robot = _urdf(
        '<link name="a"/>',
        '<link name="b">'
        + INERTIAL.format(m="1", i="0.1")
        + '<collision><geometry><cylinder radius="0.1" length="0.2"/></geometry></collision>'
        + "</link>",
        _joint("j", "a", "b"),
    )
    robot.contacts(["b"], friction=0.5)
    return wrong("a collision cylinder mapped to point contacts")


@case("contact", "URDF contacts with friction -1", expect=r"friction|μ")
def urdf_contacts_negative_friction():
    robot = _urdf(
        '<link name="a"/>',
        '<link name="b">'
        + INERTIAL.format(m="1", i="0.1")
        + '<collision><geometry><sphere radius="0.05"/></geometry></collision>'
        + "</link>",
        _joint("j", "a", "b"),
    )
    stops = robot.contacts(["b"], friction=-1.0)
    model = robot.mechanism(forces=[mb.Gravity()], stops=list(stops))
    q0, v0 = model.initial_state()
    simulate(model, jaxdae.Unstabilized(), 0.0, 0.05, q0, v0)
    return wrong("a negative friction coefficient accepted")


# ============================================================================================
# multibody
# ============================================================================================


def _rod(**kw):
    kw.setdefault("markers", {"top": (-0.5, 0.0)})
    return mb.PlanarBody("rod", mass=kw.pop("mass", 1.0), inertia=kw.pop("inertia", 1 / 12), **kw)


@case("multibody", "PlanarBody(mass=nan)", expect=r"mass")
def body_mass_nan():
    mb.PlanarBody("a", jnp.nan, 0.1)
    return wrong("mass nan accepted")


@case("multibody", "PlanarBody(inertia=inf)", expect=r"inertia")
def body_inertia_inf():
    mb.PlanarBody("a", 1.0, jnp.inf)
    return wrong("inertia inf accepted")


@case("multibody", "PlanarBody(mass=[1, 2])", expect=r"mass")
def body_mass_vector():
    mb.PlanarBody("a", jnp.array([1.0, 2.0]), 0.1)
    return wrong("a vector mass accepted")


@case("multibody", "PlanarBody markers given as a list", expect=r"markers")
def body_markers_list():
    mb.PlanarBody("a", 1.0, 0.1, markers=[(0.1, 0.0)])
    return wrong("markers as a list accepted")


@case("multibody", "PlanarBody with an empty name", expect=r"name")
def body_name_empty():
    mb.Mechanism([mb.PlanarBody("", 1.0, 0.1)], [mb.Revolute("ground", ".")])
    return wrong("an empty name accepted")


@case("multibody", "PlanarBody with an integer name", expect=r"name")
def body_name_int():
    mb.PlanarBody(3, 1.0, 0.1)
    return wrong("an integer name accepted")


@case("multibody", "Mechanism with no bodies", expect=r"bod")
def mechanism_empty():
    mb.Mechanism([])
    return wrong("a mechanism without bodies accepted")


@case("multibody", "a joint in the bodies list", expect=r"bod")
def mechanism_joint_as_body():
    mb.Mechanism([_rod(), mb.Revolute("ground", "rod.top")])
    return wrong("a joint accepted as a body")


def _rod_pendulum(revolutes=1):
    joints = [mb.Revolute("ground", "rod.top", name=f"pin{i}") for i in range(revolutes)]
    return mb.Mechanism([_rod()], joints, [mb.Gravity((0.0, -G))])


def _rod_truth(t1, theta0=0.5):
    # a uniform rod about its end: θ̈ = -(3 g / 2 l) sin θ, i.e. a pendulum of length 2/3
    q, _ = truth(t1, theta0=theta0, length=2.0 / 3.0)
    return q * 0.75  # the centre at l/2 = 0.5 from the pin (q of length 2/3 scaled)


def _rod_start(mech, theta0=0.5):
    # the rod's x axis along the rod: angle from +x is θ - π/2
    return mech.initial_state(joint_coordinates={"pin0": theta0 - np.pi / 2})


@case("multibody", "a rod pendulum against θ̈ = -(3g/2l) sin θ")
def mechanism_rod_pendulum():
    mech = _rod_pendulum()
    q0, v0 = _rod_start(mech)
    sol = simulate(mech, BAUM, 0.0, 0.5, q0, v0)
    return close(sol.q_final[:2], _rod_truth(0.5), 1e-5, "centre at 0.5 s")


@case("multibody", "the same pin joint twice under Baumgarte (redundant)")
def mechanism_double_pin_baumgarte():
    mech = _rod_pendulum(2)
    q0, v0 = _rod_start(mech)
    sol = simulate(mech, BAUM, 0.0, 0.5, q0, v0, throw=False)
    return judge(sol, ("singular_constraint_matrix",))


@case("multibody", "the same pin joint twice under PseudoInverse")
def mechanism_double_pin_pseudo():
    mech = _rod_pendulum(2)
    q0, v0 = _rod_start(mech)
    sol = simulate(mech, jaxdae.PseudoInverse(10.0, 25.0), 0.0, 0.5, q0, v0)
    return close(sol.q_final[:2], _rod_truth(0.5), 1e-5, "centre at 0.5 s")


SPATIAL_INERTIA = (0.1, 0.1, 0.1)


def _hinged(axis, tree=False):
    body = mb.RigidBody("a", 1.0, SPATIAL_INERTIA, {"p": (0.0, 0.0, 0.1)})
    kind = mb.TreeMechanism if tree else mb.Mechanism
    mech = kind([body], [mb.Revolute("ground", "a.p", axis=axis)], [mb.Gravity()])
    q0 = mech.reference_coordinates()
    sol = simulate(mech, BAUM, 0.0, 0.1, q0, jnp.zeros_like(q0), max_steps=2000)
    return wrong(f"accepted: {result_names(sol.result)}, q_final {sol.q_final}")


@case("multibody", "spatial Revolute with a zero axis (Mechanism), simulated", expect=r"axis")
def spatial_zero_axis():
    return _hinged((0.0, 0.0, 0.0))


@case("multibody", "spatial Revolute with a nan axis (Mechanism), simulated", expect=r"axis")
def spatial_nan_axis():
    return _hinged((np.nan, 0.0, 1.0))


@case("multibody", "spatial Revolute with a zero axis (TreeMechanism), simulated", expect=r"axis")
def tree_zero_axis():
    return _hinged((0.0, 0.0, 0.0), tree=True)


@case("multibody", "Distance with length nan", expect=r"length")
def distance_nan():
    mb.Distance("ground", "rod.top", jnp.nan)
    return wrong("length nan accepted")


@case(
    "multibody",
    "Gravity((nan, -9.81))",
    expect=r"acceleration|gravity|Gravity|not finite|non-finite",
)
def gravity_nan():
    mech = mb.Mechanism(
        [_rod()], [mb.Revolute("ground", "rod.top", name="pin0")], [mb.Gravity((jnp.nan, -G))]
    )
    q0, v0 = _rod_start(mech)
    sol = simulate(mech, BAUM, 0.0, 0.5, q0, v0, throw=False)
    return judge(sol, ("non_finite_forces", "invalid_input"))


@case("multibody", "Gear with ratio nan, simulated", expect=r"ratio")
def gear_ratio_nan():
    ground = mb.Ground(markers={"o": (1.0, 0.0)})
    a = mb.PlanarBody("a", 1.0, 0.1)
    b = mb.PlanarBody("b", 1.0, 0.1, position=(1.0, 0.0))
    mech = mb.Mechanism(
        [ground, a, b],
        [mb.Revolute("ground", "a"), mb.Revolute("ground.o", "b"), mb.Gear("a", "b", jnp.nan)],
    )
    q0 = mech.reference_coordinates()
    sol = simulate(mech, BAUM, 0.0, 0.1, q0, jnp.zeros_like(q0).at[2].set(1.0), max_steps=2000)
    return wrong(f"gear ratio nan accepted: {result_names(sol.result)}")


@case(
    "multibody",
    "JointLimit(lower=nan) on a rod pendulum, simulated",
    expect=r"`lower`|bound|JointLimit",
)
def joint_limit_nan():
    mech = mb.Mechanism(
        [_rod()],
        [mb.Revolute("ground", "rod.top", name="pin0")],
        [mb.Gravity((0.0, -G))],
        stops=[mb.JointLimit("pin0", lower=jnp.nan, upper=1.0)],
    )
    q0, v0 = mech.initial_state(joint_coordinates={"pin0": -1.0})
    sol = simulate(mech, BAUM, 0.0, 0.5, q0, v0, max_steps=2000)
    return wrong(f"lower = nan accepted: {result_names(sol.result)}")


@case("multibody", "initial_state with an unknown joint name", expect=r"joint")
def initial_state_unknown_joint():
    _rod_pendulum().initial_state(joint_coordinates={"nope": 0.1})
    return wrong("an unknown joint accepted")


@case("multibody", "RigidBody inertia of shape (2,)", expect=r"inertia")
def rigid_inertia_shape():
    mb.RigidBody("a", 1.0, (0.1, 0.1))
    return wrong("a 2-vector inertia accepted")


@case("multibody", "RigidBody orientation 2·I (not a rotation)", expect=r"rotation|orientation")
def rigid_orientation_bad():
    body = mb.RigidBody("a", 1.0, SPATIAL_INERTIA, orientation=2 * np.eye(3))
    q0 = mb.Mechanism([body], forces=[mb.Gravity()]).reference_coordinates()
    norm = float(jnp.linalg.norm(q0[3:7]))
    if abs(norm - 1.0) > 1e-12:
        return wrong(f"accepted; its Euler parameters have norm {norm:.6f}, not 1")
    return wrong("orientation 2I accepted (read as a rotation)")


@case(
    "multibody",
    "TreeMechanism with a body joined to nothing falls freely",
    expect=r"joint|connect|tree",
)
def tree_disconnected():
    a = mb.RigidBody("a", 1.0, SPATIAL_INERTIA, {"p": (0.0, 0.0, 0.1)})
    b = mb.RigidBody("b", 1.0, SPATIAL_INERTIA, position=(1.0, 0.0, 0.0))
    tree = mb.TreeMechanism([a, b], [mb.Revolute("ground", "a.p")], [mb.Gravity((0.0, 0.0, -G))])
    q0 = tree.reference_coordinates()
    sol = simulate(tree, BAUM, 0.0, 0.3, q0, jnp.zeros_like(q0))
    return close(
        tree.marker_position(sol.q_final, "b"),
        [1.0, 0.0, -0.5 * G * 0.09],
        1e-8,
        "free body's position",
    )


@case("multibody", "Driver whose motion returns 3 numbers in the plane", expect=r"motion")
def driver_bad_shape():
    mech = mb.Mechanism(
        [_rod()], [mb.Driver("ground", "rod.top", lambda t: jnp.array([0.0, 0.0, t]))]
    )
    q0 = mech.reference_coordinates()
    simulate(mech, BAUM, 0.0, 0.5, q0, jnp.zeros_like(q0))
    return wrong("a 3-vector planar motion accepted")


@case("multibody", "SpringDamper(stiffness=nan)", expect=r"stiffness")
def spring_nan():
    mb.SpringDamper("ground", "rod.top", stiffness=jnp.nan)
    return wrong("stiffness nan accepted")


# --- URDF ---------------------------------------------------------------------------------

INERTIAL = (
    '<inertial><mass value="{m}"/><inertia ixx="{i}" iyy="0.1" izz="0.1" ixy="0" '
    'ixz="0" iyz="0"/></inertial>'
)


def _link(name, m="1", i="0.1"):
    return f'<link name="{name}">{INERTIAL.format(m=m, i=i)}</link>'


def _joint(name, parent, child, kind="revolute", extra='<axis xyz="0 0 1"/>'):
    limit = '<limit lower="-1" upper="1" effort="1" velocity="1"/>'
    return (
        f'<joint name="{name}" type="{kind}"><parent link="{parent}"/>'
        f'<child link="{child}"/>{extra}{limit}</joint>'
    )


def _urdf(*parts):
    with tempfile.NamedTemporaryFile("w", suffix=".urdf", delete=False) as file:
        file.write('<robot name="r">\n' + "\n".join(parts) + "\n</robot>\n")
    try:
        return mb.load_urdf(file.name)
    finally:
        os.unlink(file.name)


@case("urdf", "a joint whose parent link is missing", expect=r"parent|link 'x'|'x'")
def urdf_missing_parent():
    _urdf('<link name="a"/>', _link("b"), _joint("j", "x", "b"))
    return wrong("a missing parent link accepted")


@case("urdf", "a cycle of URDF joints", expect=r"loop|cycle|two parents|root")
def urdf_cycle():
    _urdf(
        '<link name="a"/>', _link("b"), _link("c"), _joint("j1", "b", "c"), _joint("j2", "c", "b")
    )
    return wrong("a cycle accepted")


@case("urdf", "a link with two parents", expect=r"two parents|two joints|child of")
def urdf_two_parents():
    _urdf(
        '<link name="a"/>', _link("b"), _link("c"), _joint("j1", "a", "c"), _joint("j2", "b", "c")
    )
    return wrong("two parents accepted")


@case("urdf", "a moving link of mass 0", expect=r"mass")
def urdf_zero_mass():
    _urdf('<link name="a"/>', _link("b", m="0"), _joint("j", "a", "b"))
    return wrong("mass 0 accepted")


@case("urdf", "a moving link of negative mass", expect=r"mass")
def urdf_negative_mass():
    _urdf('<link name="a"/>', _link("b", m="-1"), _joint("j", "a", "b"))
    return wrong("mass -1 accepted")


@case("urdf", "inertia ixx = nan", expect=r"inertia|ixx|finite")
def urdf_inertia_nan():
    _urdf('<link name="a"/>', _link("b", i="nan"), _joint("j", "a", "b"))
    return wrong("ixx = nan accepted")


@case("urdf", "inertia ixx = -0.1", expect=r"inertia|positive")
def urdf_inertia_negative():
    _urdf('<link name="a"/>', _link("b", i="-0.1"), _joint("j", "a", "b"))
    return wrong("ixx = -0.1 accepted")


@case("urdf", "a planar joint", expect=r"planar")
def urdf_planar_joint():
    _urdf('<link name="a"/>', _link("b"), _joint("j", "a", "b", kind="planar"))
    return wrong("a planar joint accepted")


@case("urdf", "an unknown joint type 'hinge'", expect=r"hinge|type")
def urdf_unknown_type():
    _urdf('<link name="a"/>', _link("b"), _joint("j", "a", "b", kind="hinge"))
    return wrong("joint type 'hinge' accepted")


@case("urdf", "a limit with lower > upper", expect=r"lower|upper|limit")
def urdf_limit_reversed():
    text = _joint("j", "a", "b").replace('lower="-1" upper="1"', 'lower="1" upper="-1"')
    robot = _urdf('<link name="a"/>', _link("b"), text)
    robot.mechanism()
    return wrong("lower > upper accepted")


@case("urdf", "a link named 'ground'", expect=r"ground")
def urdf_link_ground():
    _urdf('<link name="base"/>', _link("ground"), _joint("j", "base", "ground"))
    return wrong("a link named ground accepted")


@case("urdf", "a link name with a dot", expect=r"'\.'|\.")
def urdf_link_dot():
    _urdf('<link name="a"/>', _link("b.c"), _joint("j", "a", "b.c"))
    return wrong("a dotted link name accepted")


@case("urdf", "a robot without links", expect=r"no links|no <link>|empty|without links")
def urdf_no_links():
    robot = _urdf()
    robot.mechanism()
    return wrong("a robot without links accepted")


@case(
    "urdf", "two links with the same name (masses 1 and 5)", expect=r"duplicate|twice|same name|'b'"
)
def urdf_duplicate_link():
    robot = _urdf('<link name="a"/>', _link("b"), _link("b", m="5"), _joint("j", "a", "b"))
    masses = [float(b.mass) for b in robot.bodies if b.name == "b"]
    return wrong(f"duplicate links accepted silently; body 'b' has mass {masses}")


@case("urdf", "the path is a directory", expect=r"URDF|read|directory")
def urdf_directory():
    with tempfile.TemporaryDirectory() as directory:
        mb.load_urdf(directory)
    return wrong("a directory accepted")


@case("urdf", "mass value='abc'", expect=r"line \d|link 'b'")
def urdf_mass_text():
    _urdf('<link name="a"/>', _link("b", m="abc"), _joint("j", "a", "b"))
    return wrong("mass 'abc' accepted")


@case("urdf", "a joint origin with rpy = nan", expect=r"origin|rpy|finite|rotation")
def urdf_origin_nan():
    robot = _urdf(
        '<link name="a"/>',
        _link("b"),
        _joint("j", "a", "b", extra='<origin rpy="nan 0 0" xyz="0 0 0"/><axis xyz="0 0 1"/>'),
    )
    tree = robot.mechanism()
    pos = tree.marker_position(tree.reference_coordinates(), "b")
    return wrong(f"rpy = nan accepted (position of b: {pos})")


@case("urdf", "fixed_base=False with a root link without <inertial>", expect=r"inertial|mass")
def urdf_floating_root_massless():
    with tempfile.NamedTemporaryFile("w", suffix=".urdf", delete=False) as file:
        file.write(
            '<robot name="r"><link name="a"/>' + _link("b") + _joint("j", "a", "b") + "</robot>"
        )
    try:
        mb.load_urdf(file.name, fixed_base=False)
    finally:
        os.unlink(file.name)
    return wrong("a massless free root accepted")


@case(
    "urdf", "a robot with only a fixed joint (no coordinates)", expect=r"coordinates|moving|fixed"
)
def urdf_only_fixed():
    robot = _urdf('<link name="a"/>', _link("b"), _joint("j", "a", "b", kind="fixed", extra=""))
    tree = robot.mechanism()
    q0 = tree.reference_coordinates()
    sol = simulate(tree, BAUM, 0.0, 0.1, q0, jnp.zeros_like(q0))
    return ok(f"{q0.shape[0]} coordinates, {result_names(sol.result)}")


@case("urdf", "a revolute joint without <axis> (URDF's default 1 0 0)")
def urdf_default_axis():
    explicit = _urdf(
        '<link name="a"/>',
        _link("b"),
        _joint("j", "a", "b", extra='<origin xyz="0 0 0"/><axis xyz="1 0 0"/>'),
    )
    implicit = _urdf(
        '<link name="a"/>', _link("b"), _joint("j", "a", "b", extra='<origin xyz="0 0 0"/>')
    )
    force = [mb.Gravity((0.0, 9.81, 0.0))]
    runs = []
    for robot in (explicit, implicit):
        tree = robot.mechanism(forces=force)
        q0 = tree.reference_coordinates() + 0.1
        runs.append(simulate(tree, BAUM, 0.0, 0.3, q0, jnp.zeros_like(q0)).q_final)
    return close(runs[1], runs[0], 1e-12, "implicit-axis motion")


# ============================================================================================
# tune
# ============================================================================================

TARGETS = jnp.array([0.5, 1.0, 1.5])


def _quadratic(model, target):
    return model.kd * target


def _square(output):
    return jnp.sum((output - 1.0) ** 2)


def _params(log_scale=False):
    return jaxdae.parametrize(
        jaxdae.Baumgarte(1.0, 1.0),
        lambda f: f.kd,
        functools.partial(jaxdae.Positive, log_scale=log_scale),
    )


def _tune(steps=2, directory=None, *, resume=True, every=1, batch_size=None, params=None, **kwargs):
    kwargs.setdefault("optimizer", _ADAM)
    checkpointing = (
        None if directory is None else jaxdae.Checkpointing(directory, every=every, resume=resume)
    )
    return jaxdae.tune(
        params if params is not None else _params(),
        kwargs.pop("simulate_fn", _quadratic),
        kwargs.pop("scenarios", TARGETS),
        kwargs.pop("loss", _square),
        steps=steps,
        checkpointing=checkpointing,
        batching=jaxdae.Batching(batch_size=batch_size),
        reporting=jaxdae.Reporting(progress=False),
        **kwargs,
    )


def _adam():
    import optax

    return optax.adam(0.1)


_ADAM = _adam()


@case("tune", "scenarios with mismatched leading axes", expect=r"scenarios|leading|axis")
def tune_mismatched_scenarios():
    _tune(scenarios=(jnp.ones(3), jnp.ones(4)), simulate_fn=lambda m, s: m.kd * s[0] * s[1])
    return wrong("mismatched scenarios accepted")


@case(
    "tune",
    "no scenarios (leading axis 0)",
    expect=r"no scenarios|empty|zero scenarios|at least one",
)
def tune_empty_scenarios():
    result = _tune(scenarios=jnp.zeros(0))
    return wrong(f"empty scenarios accepted: loss {result.history['loss']}")


@case("tune", "steps = 0 returns the initial parameters")
def tune_steps_zero():
    result = _tune(steps=0)
    return close(float(result.model.kd), 1.0, 1e-12, "kd")


@case("tune", "steps = -1", expect=r"`steps`")
def tune_steps_negative():
    _tune(steps=-1)
    return wrong("steps=-1 accepted")


@case("tune", "steps = 2.5", expect=r"`steps`")
def tune_steps_float():
    _tune(steps=2.5)
    return wrong("steps=2.5 accepted")


@case("tune", "a loss that is nan for every scenario", expect=r"scenario|fail|nan|finite")
def tune_loss_nan():
    result, caught = catch_warnings_run(lambda: _tune(loss=lambda out: jnp.nan * out))
    if any("fail" in w for w in caught) and result.history["num_failed"][0] == 3:
        return named(f"warned: {caught[0][:120]}")
    return wrong(f"no warning; history {result.history['num_failed']}, kd {float(result.model.kd)}")


@case("tune", "a loss that returns a vector", expect=r"`loss`")
def tune_loss_vector():
    _tune(loss=lambda out: jnp.stack([out, out]))
    return wrong("a vector loss accepted")


@case("tune", "optax.adam(nan) (a nan learning rate)", expect=r"not finite|learning")
def tune_lr_nan():
    import optax

    _tune(optimizer=optax.adam(float("nan")))
    return wrong("a nan learning rate accepted")


@case("tune", "Checkpointing path is an existing file", expect=r"directory|file|exists")
def tune_checkpoint_is_file():
    with tempfile.NamedTemporaryFile() as file:
        _tune(directory=file.name)
    return wrong("a file path accepted as checkpoint directory")


@case("tune", "Checkpointing path under a regular file", expect=r"directory|Not a directory")
def tune_checkpoint_parent_file():
    with tempfile.NamedTemporaryFile() as file:
        _tune(directory=Path(file.name) / "ckpt")
    return wrong("a path under a file accepted")


def _tune_dir(fn):
    directory = tempfile.mkdtemp()
    try:
        return fn(Path(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@case("tune", "checkpoint.json replaced by '{}'", expect=r"checkpoint.json|damaged")
def tune_checkpoint_json_empty():
    def run(d):
        _tune(2, d)
        (d / "checkpoint.json").write_text("{}")
        _tune(3, d)
        return wrong("'{}' checkpoint accepted")

    return _tune_dir(run)


@case("tune", "checkpoint.json replaced by binary garbage", expect=r"checkpoint.json|damaged")
def tune_checkpoint_json_binary():
    def run(d):
        _tune(2, d)
        (d / "checkpoint.json").write_bytes(bytes(range(256)))
        _tune(3, d)
        return wrong("binary checkpoint accepted")

    return _tune_dir(run)


@case("tune", "the state file deleted", expect=r"state|damaged|missing")
def tune_state_deleted():
    def run(d):
        _tune(2, d)
        state = d / json.loads((d / "checkpoint.json").read_text())["state"]
        state.unlink()
        _tune(3, d)
        return wrong("a checkpoint without its state accepted")

    return _tune_dir(run)


@case("tune", "checkpoint.json deleted, state files kept: a fresh run")
def tune_json_deleted():
    def run(d):
        _tune(2, d)
        (d / "checkpoint.json").unlink()
        again = _tune(3, d)
        fresh = _tune(3)
        return close(again.history["loss"], fresh.history["loss"], 0.0, "losses")

    return _tune_dir(run)


@case("tune", "a resume with more steps equals an uninterrupted run")
def tune_resume_identical():
    def run(d):
        _tune(2, d)
        resumed = _tune(4, d)
        fresh = _tune(4)
        verdict = close(resumed.history["loss"], fresh.history["loss"], 0.0, "losses")
        return verdict if verdict.kind == "ok" else lost(verdict.detail)

    return _tune_dir(run)


@case("tune", "a resume with another `trainable` filter", expect=r"another|differ|trainable")
def tune_resume_trainable():
    def run(d):
        params = jaxdae.Baumgarte(1.0, 1.0)
        _tune(2, d, params=params, trainable=eqx.is_inexact_array)
        only_kp = eqx.tree_at(
            lambda f: (f.kd, f.kp), jax.tree.map(lambda _: False, params), (False, True)
        )
        resumed = _tune(3, d, params=params, trainable=only_kp)
        return lost(f"resumed with another trainable set: kd {float(resumed.model.kd)}")

    return _tune_dir(run)


@case("tune", "a resume with another regularization", expect=r"another|differ")
def tune_resume_regularization():
    def run(d):
        _tune(2, d)
        _tune(3, d, regularization=lambda m: 0.1 * m.kd**2)
        return lost("resumed with another regularization")

    return _tune_dir(run)


@case("tune", "a resume with another batch size", expect=r"another|differ|batch")
def tune_resume_batch_size():
    def run(d):
        _tune(2, d)
        _tune(3, d, batch_size=2)
        return lost("resumed with another batch size")

    return _tune_dir(run)


@case("tune", "a resume with another parametrization (log_scale)", expect=r"another|differ|initial")
def tune_resume_parametrization():
    def run(d):
        _tune(2, d)
        _tune(3, d, params=_params(log_scale=True))
        return lost("resumed with another parametrization")

    return _tune_dir(run)


@case("tune", "a resume with the scenarios in float32", expect=r"another|differ|scenarios")
def tune_resume_float32():
    def run(d):
        _tune(2, d)
        resumed = _tune(4, d, scenarios=TARGETS.astype(jnp.float32))
        fresh = _tune(4, scenarios=TARGETS.astype(jnp.float32))
        verdict = close(resumed.history["loss"], fresh.history["loss"], 0.0, "losses")
        return (
            verdict
            if verdict.kind == "ok"
            else lost(f"resumed a float64 run for float32 scenarios: {verdict.detail}")
        )

    return _tune_dir(run)


@case("tune", "a resume with another checkpoint period equals an uninterrupted run")
def tune_resume_every():
    def run(d):
        _tune(2, d, every=1)
        resumed = _tune(4, d, every=3)
        fresh = _tune(4)
        verdict = close(resumed.history["loss"], fresh.history["loss"], 0.0, "losses")
        return verdict if verdict.kind == "ok" else lost(verdict.detail)

    return _tune_dir(run)


@case("tune", "resume=False over an old checkpoint equals a fresh run")
def tune_resume_false():
    def run(d):
        _tune(4, d)
        again = _tune(2, d, resume=False)
        fresh = _tune(2)
        return close(again.history["loss"], fresh.history["loss"], 0.0, "losses")

    return _tune_dir(run)


@case("tune", "a checkpoint directory holding unrelated files")
def tune_foreign_files():
    def run(d):
        (d / "notes.txt").write_text("mine")
        (d / "state_000099.eqx").write_bytes(b"not a state")
        result = _tune(2, d)
        fresh = _tune(2)
        return close(result.history["loss"], fresh.history["loss"], 0.0, "losses")

    return _tune_dir(run)


@case("tune", "Positive(nan)", expect=r"value|positive|finite")
def tune_positive_nan():
    jaxdae.Positive(jnp.nan)
    return wrong("Positive(nan) accepted")


class _Gains(eqx.Module):
    k: float = 1.0


@case(
    "tune", "parametrize a Python float field, then tune it towards 2", expect=r"where|array|float"
)
def tune_parametrize_float_field():
    params = jaxdae.parametrize(_Gains(), lambda g: g.k)
    result = _tune(
        5,
        params=params,
        simulate_fn=lambda m, s: m.k * s,
        loss=lambda out: (out - 2.0) ** 2,
        scenarios=jnp.ones(2),
    )
    k = float(result.model.k)
    return ok(f"k = {k:.3f}") if k > 1.2 else wrong(f"k stayed at {k}")


# ============================================================================================
# batch_map
# ============================================================================================

XS = jnp.linspace(0.0, 1.0, 10)


def _sine(x):
    return jnp.sin(x)


@case("batch_map", "chunk_size larger than the batch")
def batch_chunk_larger():
    return close(jaxdae.batch_map(_sine, XS, chunk_size=64), np.sin(XS), 1e-15, "output")


@case("batch_map", "chunk_size 3 that does not divide 10 rows")
def batch_chunk_not_dividing():
    return close(jaxdae.batch_map(_sine, XS, chunk_size=3), np.sin(XS), 1e-15, "output")


@case("batch_map", "chunk_size = 2.5", expect=r"`chunk_size`")
def batch_chunk_float():
    jaxdae.batch_map(_sine, XS, chunk_size=2.5)
    return wrong("chunk_size=2.5 accepted")


@case("batch_map", "chunk_size = -2", expect=r"`chunk_size`|chunk_size")
def batch_chunk_negative():
    jaxdae.batch_map(_sine, XS, chunk_size=-2)
    return wrong("chunk_size=-2 accepted")


@case("batch_map", "fn returns None", expect=r"`fn`|None|output")
def batch_fn_none():
    out = jaxdae.batch_map(lambda x: None, XS)
    return ok(f"returned {out!r}") if out is None else wrong(f"returned {out!r}")


@case("batch_map", "a scalar argument (no batch axis)", expect=r"leading|batch|axis")
def batch_scalar_arg():
    jaxdae.batch_map(_sine, jnp.asarray(1.0))
    return wrong("a scalar argument accepted")


@case("batch_map", "an empty batch (0 rows)", expect=r"empty|rows|batch")
def batch_empty():
    out = jaxdae.batch_map(_sine, jnp.zeros(0), chunk_size=4)
    return ok("empty output") if out.shape == (0,) else wrong(f"shape {out.shape}")


@case("batch_map", "rows that fail with throw=False keep their own results")
def batch_failing_rows():
    t1 = jnp.array([0.3, 100.0, 0.2, 100.0, 0.4])

    def run(t):
        return simulate(PEND, BAUM, 0.0, t, Q0, V0, max_steps=200, throw=False)

    sol = jaxdae.batch_map(run, t1, chunk_size=2)
    names = result_names(sol.result)
    if names != ["successful", "max_steps_reached"] * 2 + ["successful"]:
        return lost(f"{names}")
    return close(
        sol.q_final[np.array([0, 2, 4])],
        np.stack([truth(float(t))[0] for t in (0.3, 0.2, 0.4)]),
        1e-5,
        "good rows",
    )


@case("batch_map", "a Solution per row, 4 rows in chunks of 2")
def batch_solution_chunks():
    t1 = jnp.array([0.3, 0.2, 0.4, 0.1])
    sol = jaxdae.batch_map(
        lambda t: simulate(PEND, BAUM, 0.0, t, Q0, V0, throw=False), t1, chunk_size=2
    )
    return close(sol.q_final, np.stack([truth(float(t))[0] for t in t1]), 1e-5, "rows")


def _batch_dir(fn):
    directory = tempfile.mkdtemp()
    try:
        return fn(Path(directory) / "sweep")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _cosine(x):
    return jnp.cos(3.0 * x)


def _sweep(directory, xs=XS, **kwargs):
    return jaxdae.batch_map(
        _cosine, xs, chunk_size=4, checkpoint=directory, progress=False, **kwargs
    )


@case("batch_map", "checkpoint is an existing file", expect=r"directory|file|exists")
def batch_checkpoint_is_file():
    with tempfile.NamedTemporaryFile() as file:
        _sweep(file.name)
    return wrong("a file accepted as checkpoint directory")


@case("batch_map", "a chunk file deleted is computed again")
def batch_chunk_deleted():
    def run(d):
        full = _sweep(d)
        (d / "chunk_000001.npz").unlink()
        return close(_sweep(d), full, 0.0, "resumed sweep")

    return _batch_dir(run)


@case("batch_map", "sweep.json replaced by a JSON list", expect=r"sweep.json")
def batch_sweep_json_list():
    def run(d):
        full = _sweep(d)
        (d / "sweep.json").write_text("[]")
        again, caught = catch_warnings_run(lambda: _sweep(d))
        verdict = close(again, full, 0.0, "resumed sweep")
        if verdict.kind == "ok" and any("sweep.json" in w for w in caught):
            return named("warned and rewrote sweep.json")
        return verdict

    return _batch_dir(run)


@case("batch_map", "a checkpoint directory holding unrelated files")
def batch_foreign_files():
    def run(d):
        d.mkdir(parents=True)
        (d / "notes.txt").write_text("mine")
        (d / "chunk_000099.npz").write_bytes(b"junk")
        return close(_sweep(d), np.cos(3.0 * XS), 1e-15, "sweep")

    return _batch_dir(run)


@case("batch_map", "a dict of arrays as argument")
def batch_dict_args():
    out = jaxdae.batch_map(lambda d: d["a"] * d["b"], {"a": XS, "b": 2.0 * XS}, chunk_size=4)
    return close(out, 2.0 * XS**2, 1e-15, "output")


@case(
    "batch_map", "a sweep resumed with the same values in float32", expect=r"another|differ|dtype"
)
def batch_resume_other_dtype():
    def run(d):
        _sweep(d)
        again = _sweep(d, XS.astype(jnp.float32))
        if again.dtype == jnp.float32:
            return close(again, np.cos(3.0 * np.asarray(XS, np.float32)), 1e-6, "sweep")
        return lost(f"a float32 call returned the float64 sweep on disk ({again.dtype})")

    return _batch_dir(run)


@case("batch_map", "ensemble=True with a chunk_size that does not divide the batch")
def batch_ensemble_padding():
    q0 = jnp.stack([PEND.state_from_angle(a, 0.0)[0] for a in (0.3, 0.5, 0.7)])

    def run(q):
        return jaxdae.simulate_ensemble(PEND, BAUM, 0.0, 0.3, q, jnp.zeros_like(q)).q_final

    out = jaxdae.batch_map(run, q0, chunk_size=2, ensemble=True)
    return close(out, np.stack([truth(0.3, theta0=a)[0] for a in (0.3, 0.5, 0.7)]), 1e-5, "rows")


# ============================================================================================
# analysis and control
# ============================================================================================

BOTTOM = jnp.array([0.0, -1.0])


@case("analysis", "linearize at a point that is not an equilibrium", expect=r"equilibrium")
def linearize_non_equilibrium():
    jaxdae.linearize(PEND, BAUM, Q0)
    return wrong("a non-equilibrium accepted")


@case("analysis", "linearize with q of shape (2, 1)", expect=r"`q`")
def linearize_q_shape():
    jaxdae.linearize(PEND, BAUM, BOTTOM[:, None])
    return wrong("q of shape (2, 1) accepted")


@case("analysis", "linearize with v of the wrong length", expect=r"`v`")
def linearize_v_shape():
    jaxdae.linearize(PEND, BAUM, BOTTOM, jnp.zeros(3))
    return wrong("v of length 3 accepted")


@case("analysis", "linearize with u for a system without a controller", expect=r"`u`|controller")
def linearize_u_no_controller():
    jaxdae.linearize(PEND, BAUM, BOTTOM, u=jnp.ones(1))
    return wrong("u accepted without a controller")


@case("analysis", "linearize with a cyclic index out of range", expect=r"`cyclic`|range")
def linearize_cyclic_range():
    jaxdae.linearize(PEND, BAUM, BOTTOM, cyclic=(5,))
    return wrong("cyclic=(5,) accepted")


@case("analysis", "linearize at the bottom: roots ±i√(g/l) and the Baumgarte roots")
def linearize_bottom_roots():
    lin = jaxdae.linearize(PEND, BAUM, BOTTOM)
    eig = np.sort_complex(np.asarray(lin.eigenvalues))
    want = np.sqrt(G)
    has = np.any(np.abs(eig - 1j * want) < 1e-6) and np.any(np.abs(eig + 1j * want) < 1e-6)
    stab = np.any(np.abs(eig + 5.0) < 1e-3)  # λ² + 10 λ + 25 = 0: λ = -5 (double)
    return ok("roots found") if has and stab else wrong(f"eigenvalues {eig}")


@case("analysis", "equilibrium with `fixed` out of range", expect=r"`fixed`|range")
def equilibrium_fixed_range():
    jaxdae.equilibrium(PEND, BOTTOM, fixed=(7,))
    return wrong("fixed=(7,) accepted")


@case(
    "analysis",
    "equilibrium of a bead under a constant force (none exists)",
    expect=r"No equilibrium",
)
def equilibrium_none():
    class Pushed(jaxdae.LagrangianSystem):
        def kinetic_energy(self, t, q, v):
            return 0.5 * v @ v

        def potential_energy(self, t, q):
            return q[0]

        def constraints(self, t, q):
            return jnp.array([q[1]])

    eq = jaxdae.equilibrium(Pushed(), jnp.zeros(2))
    return wrong(f"an equilibrium was returned: {eq.q}, residual {eq.residual}")


@case("analysis", "equilibrium(max_steps=0)", expect=r"`max_steps`")
def equilibrium_max_steps_zero():
    jaxdae.equilibrium(PEND, jnp.array([0.1, -1.0]), max_steps=0)
    return wrong("max_steps=0 accepted")


@case("analysis", "equilibrium with q_guess of shape (2, 1)", expect=r"`q_guess`")
def equilibrium_q_shape():
    eq = jaxdae.equilibrium(PEND, jnp.array([[0.1], [-1.0]]))
    return wrong(f"q_guess of shape (2, 1) accepted: q = {eq.q}")


DI_A = jnp.array([[0.0, 1.0], [0.0, 0.0]])
DI_B = jnp.array([[0.0], [1.0]])


@case("analysis", "lqr with an asymmetric Q (only its symmetric part counts)", expect=r"`Q`")
def lqr_q_asymmetric():
    q = jnp.array([[1.0, 1.0], [0.0, 1.0]])
    sol = jaxdae.lqr(DI_A, DI_B, q, jnp.eye(1))
    symmetric = jaxdae.lqr(DI_A, DI_B, 0.5 * (q + q.T), jnp.eye(1))
    return close(sol.gain, symmetric.gain, 1e-10, "gain against the symmetric part's")


@case("analysis", "lqr with Q negative definite", expect=r"`Q`")
def lqr_q_negative():
    jaxdae.lqr(DI_A, DI_B, -jnp.eye(2), jnp.eye(1))
    return wrong("Q = -I accepted")


@case("analysis", "lqr with R = 0", expect=r"`R`")
def lqr_r_zero():
    jaxdae.lqr(DI_A, DI_B, jnp.eye(2), jnp.zeros((1, 1)))
    return wrong("R = 0 accepted")


@case("analysis", "lqr with R of shape (2, 2) for one input", expect=r"`R`")
def lqr_r_shape():
    jaxdae.lqr(DI_A, DI_B, jnp.eye(2), jnp.eye(2))
    return wrong("R of shape (2, 2) accepted")


@case("analysis", "lqr with a 1-D A", expect=r"`A`")
def lqr_a_1d():
    jaxdae.lqr(jnp.array([0.0, 1.0]), DI_B, jnp.eye(2), jnp.eye(1))
    return wrong("a 1-D A accepted")


@case("analysis", "lqr with integer matrices (double integrator: K = [1, √3])")
def lqr_int():
    sol = jaxdae.lqr(
        np.array([[0, 1], [0, 0]]), np.array([[0], [1]]), np.eye(2, dtype=int), np.eye(1, dtype=int)
    )
    return close(sol.gain, [[1.0, np.sqrt(3.0)]], 1e-9, "gain")


@case("analysis", "lqr with Q = 0 on an unstable scalar system (K = 2)")
def lqr_q_zero_unstable():
    sol = jaxdae.lqr(
        jnp.ones((1, 1)), jnp.ones((1, 1)), jnp.zeros((1, 1)), jnp.ones((1, 1)), throw=False
    )
    if not bool(sol.succeeded):
        return misnamed("no stabilizing solution reported; A - BK = -1 with K = 2 exists")
    return close(sol.gain, [[2.0]], 1e-8, "gain")


@case(
    "analysis",
    "lqr with Q = 1e200 I (stabilizable, detectable, overflows)",
    expect=r"overflow|too large|magnitude|scale",
)
def lqr_huge():
    sol = jaxdae.lqr(DI_A, DI_B, 1e200 * jnp.eye(2), jnp.eye(1))
    return (
        wrong(f"returned gain {sol.gain}")
        if not np.all(np.isfinite(sol.gain))
        else ok(f"gain {sol.gain}")
    )


@case("analysis", "spectral_radius of a non-square matrix", expect=r"square|shape")
def spectral_radius_nonsquare():
    jaxdae.spectral_radius(jnp.ones((2, 3)))
    return wrong("a non-square matrix accepted")


@case(
    "analysis",
    "transition_matrix with an implicit solver (Kvaerno5)",
    expect=r"explicit|solver|Kvaerno5",
)
def transition_implicit():
    h = jaxdae.perturbation_matrix(BAUM, 1)
    t = jaxdae.transition_matrix(h, diffrax.Kvaerno5(), 0.01)
    exact = jax.scipy.linalg.expm(0.01 * h)
    return close(t, exact, 1e-6, "transition matrix")


@case("analysis", "perturbation_matrix with -1 constraints", expect=r"`num_constraints`")
def perturbation_negative():
    jaxdae.perturbation_matrix(BAUM, -1)
    return wrong("num_constraints=-1 accepted")


# ============================================================================================
# actuated systems, Hamiltonian form, Solution methods
# ============================================================================================

OPTICS = AdaptiveOpticsElement()
CONTROL = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)


@case("actuated", "simulate_actuated with unsorted ts", expect=r"`ts`")
def actuated_ts_unsorted():
    jaxdae.simulate_actuated(
        OPTICS,
        CONTROL,
        0.0,
        0.1,
        *OPTICS.initial_state(angle_error=0.05),
        ts=jnp.array([0.0, 0.08, 0.05]),
    )
    return wrong("unsorted ts accepted")


@case("actuated", "ConstraintEnforcingControl with a nan gain", expect=r"gain|finite|stable")
def actuated_nan_gain():
    jaxdae.ConstraintEnforcingControl([jnp.nan, 1.0, 1.0, 1.0])
    return wrong("a nan gain accepted")


@case("actuated", "ConstraintEnforcingControl.with_poles(rate=-10)", expect=r"rate|stable")
def actuated_negative_rate():
    jaxdae.ConstraintEnforcingControl.with_poles(-10.0, order=4)
    return wrong("a negative pole rate accepted")


@case(
    "actuated",
    "simulate_actuated on a system that is not an ActuatedSystem",
    expect=r"`system`|ActuatedSystem",
)
def actuated_wrong_system():
    jaxdae.simulate_actuated(PEND, CONTROL, 0.0, 0.1, Q0, V0, jnp.zeros(1))
    return wrong("a CartesianPendulum accepted")


@case("actuated", "simulate_actuated with w0 as a Python list equals the array")
def actuated_w0_list():
    q0, v0, w0 = OPTICS.initial_state(angle_error=0.05)
    a = jaxdae.simulate_actuated(OPTICS, CONTROL, 0.0, 0.1, q0, v0, w0)
    b = jaxdae.simulate_actuated(
        OPTICS, CONTROL, 0.0, 0.1, q0, v0, [float(x) for x in np.atleast_1d(w0)]
    )
    return close(b.q_final, a.q_final, 1e-14, "q(0.1)")


@case("hamiltonian", "HamiltonianForm of the pendulum equals the Lagrangian solve")
def hamiltonian_form_pendulum():
    form = jaxdae.HamiltonianForm(PEND)
    sol = simulate(form, BAUM, 0.0, 0.5, Q0, V0)  # p0 = m v0 with m = 1
    return pend_ok(sol, 0.5)


@case(
    "hamiltonian",
    "HamiltonianForm of a system with a singular mass matrix",
    expect=r"mass matrix|singular|Legendre",
)
def hamiltonian_form_singular():
    class Flat(CartesianPendulum):
        def mass_matrix(self, t, q):
            return jnp.diag(jnp.array([1.0, 0.0]))

    simulate(jaxdae.HamiltonianForm(Flat()), BAUM, 0.0, 0.5, Q0, V0)
    return wrong("a singular Legendre transform accepted")


@case(
    "solution", "singular_passages(threshold=nan) on the two-link arm's fold", expect=r"`threshold`"
)
def passages_nan():
    from jaxdae.examples import TWO_LINK_Q0, TWO_LINK_V0, TwoLinkManipulator

    sol = simulate(
        TwoLinkManipulator(),
        jaxdae.PseudoInverse(10.0, 25.0),
        0.0,
        0.8,
        TWO_LINK_Q0,
        TWO_LINK_V0,
        ts=jnp.linspace(0.0, 0.8, 81),
    )
    found = sol.singular_passages()
    out = sol.singular_passages(threshold=float("nan"))
    return wrong(f"threshold=nan accepted: {out} (default threshold: {found})")


@case("solution", "singular_passages of a vmapped batch of solutions", expect=r"batch|member|vmap")
def passages_batch():
    sols = jax.vmap(lambda a: simulate(PEND, BAUM, 0.0, 0.5, *PEND.state_from_angle(a, 0.0)))(
        jnp.array([0.3, 0.5])
    )
    out = sols.singular_passages()
    return ok(f"{out}") if np.size(out) == 0 or len(out) == 2 else wrong(f"{out}")


@case("solution", "RESULTS of a failed solve printed and compared")
def result_repr():
    sol = pend(max_steps=3, throw=False)
    text = repr(sol.result)
    if "max" in text.lower() and not sol.succeeded:
        return named(text)
    return wrong(text)


# ============================================================================================
# the harness
# ============================================================================================


def _origin(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    path = str(Path(frames[-1].filename).resolve())
    if path.startswith(JAXDAE_DIR):
        return "jaxdae"
    if path == THIS_FILE:
        return "case"
    parts = Path(path).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return Path(path).name


def _message(exc):
    notes = getattr(exc, "__notes__", None) or []
    return "\n".join([str(exc), *notes])


TRACED_ERRORS = ("EquinoxRuntimeError", "JaxRuntimeError", "XlaRuntimeError")


def headline(message):
    """The message without the stack that a runtime error of a traced check carries."""
    found = re.search(r"EquinoxRuntimeError: (.*?)(\n\n-{5,}|\Z)", message, re.S)
    if found:
        return found.group(1).strip()
    lines = [line for line in message.splitlines() if re.match(r"^[\w.]*Error: ", line)]
    if "CpuCallback error" in message and lines:
        return message[message.rindex(lines[-1]) :].split("\n\n")[0].strip()
    return message.split("\n--------------------\nFor simplicity")[0].strip()


def classify_exception(exc, c, stderr=""):
    """The verdict of a case that raised (see the module docstring)."""
    message = _message(exc)
    origin = _origin(exc)
    name = type(exc).__name__
    if c.user_error:
        matched = re.search(c.expect, message, re.I | re.S) is not None
        return Verdict("named" if matched else "cryptic", "the model's own error")
    if isinstance(exc, CRYPTIC_TYPES):
        return Verdict("cryptic", f"{name} from {origin}")
    traced = name in TRACED_ERRORS
    from_jaxdae = (
        origin == "jaxdae"
        or isinstance(exc, jaxdae.SimulationError)
        or (traced and "jaxdae.SimulationError" in stderr)
    )
    if c.expect is None:  # a legitimate input: any error is a fault
        if from_jaxdae:
            return Verdict("misnamed", "a legitimate input refused by jaxdae")
        return Verdict("cryptic", f"a legitimate input fails: {name} from {origin}")
    if re.search(c.expect, message, re.I | re.S):
        fix = "" if FIX_WORDS.search(headline(message)) else " (no fix named)"
        if from_jaxdae or traced:
            return Verdict("named", f"raised in {origin}{fix}")
        if isinstance(exc, (ValueError, TypeError, RuntimeError, OSError)):
            return Verdict("named", f"upstream message from {origin}{fix}")
    if from_jaxdae and isinstance(
        exc, (ValueError, TypeError, FloatingPointError, jaxdae.SimulationError)
    ):
        return Verdict("misnamed", f"a jaxdae error that does not name {c.expect!r}")
    return Verdict("cryptic", f"{name} from {origin}")


def run_case(c):
    """Runs one case in this process: its verdict, exception, warnings and stderr."""
    record = dict(name=c.name, area=c.area, what=c.what)
    stderr_file = tempfile.TemporaryFile(mode="w+b")
    saved_fd = os.dup(2)
    sys.stderr.flush()
    os.dup2(stderr_file.fileno(), 2)
    start = time.perf_counter()
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            verdict = c.fn()
            if not isinstance(verdict, Verdict):
                verdict = Verdict("cryptic", f"case returned {verdict!r}")
            record.update(kind=verdict.kind, detail=verdict.detail)
        except Exception as exc:  # every outcome is classified
            error = exc
    record["seconds"] = round(time.perf_counter() - start, 2)
    sys.stderr.flush()
    os.dup2(saved_fd, 2)
    os.close(saved_fd)
    stderr_file.seek(0)
    err = stderr_file.read().decode(errors="replace")
    stderr_file.close()
    record["stderr"] = "\n".join(line for line in err.splitlines() if line.startswith("jaxdae"))[
        :600
    ]
    if error is not None:
        verdict = classify_exception(error, c, record["stderr"])
        record.update(
            kind=verdict.kind,
            detail=verdict.detail,
            exception=type(error).__name__,
            origin=_origin(error),
            message=headline(_message(error))[:2000],
        )
    record["warnings"] = [str(w.message)[:300] for w in caught][:5]
    return record


def _worker(conn):
    conn.send("ready")
    while True:
        name = conn.recv()
        if name is None:
            return
        conn.send(run_case(CASES[name]))


def run_all(names, timeout):
    ctx = multiprocessing.get_context("spawn")
    records, worker, conn = [], None, None
    for i, name in enumerate(names, 1):
        if worker is None:
            conn, child = ctx.Pipe()
            worker = ctx.Process(target=_worker, args=(child,), daemon=True)
            worker.start()
            conn.recv()  # imported
        c = CASES[name]
        conn.send(name)
        if conn.poll(timeout):
            try:
                record = conn.recv()
            except EOFError:
                record = dict(
                    name=name,
                    area=c.area,
                    what=c.what,
                    kind="cryptic",
                    detail=f"the worker process died (exit code {worker.exitcode})",
                    exception="crash",
                )
                worker = None
        else:
            worker.kill()
            worker.join()
            worker = None
            record = dict(
                name=name,
                area=c.area,
                what=c.what,
                kind="hang",
                detail=f"no answer within {timeout} s",
            )
        records.append(record)
        print(
            f"[{i:3d}/{len(names)}] {record['kind']:12s} {name} ({record.get('seconds', '-')} s)",
            flush=True,
        )
    if worker is not None:
        conn.send(None)
        worker.join(10)
    return records


def report(records):
    out = io.StringIO()
    total = len(records)
    counts = {k: sum(r["kind"] == k for r in records) for k in KINDS}
    out.write(f"\n{total} cases\n\n| category | cases | share |\n| --- | ---: | ---: |\n")
    for k in KINDS:
        out.write(f"| {k} | {counts[k]} | {counts[k] / max(total, 1):.1%} |\n")
    out.write(f"\nShare of cryptic among all cases: {counts['cryptic'] / max(total, 1):.1%}\n")
    areas = list(dict.fromkeys(r["area"] for r in records))
    out.write("\n| area | " + " | ".join(KINDS) + " |\n| --- |" + " ---: |" * len(KINDS) + "\n")
    for area in areas:
        row = [sum(r["area"] == area and r["kind"] == k for r in records) for k in KINDS]
        out.write(f"| {area} | " + " | ".join(map(str, row)) + " |\n")
    upstream = [r for r in records if r["kind"] == "named" and "upstream" in r.get("detail", "")]
    if upstream:
        out.write(
            f"\nOf the named, {len(upstream)} by an upstream library's message (jaxdae "
            "checks nothing first): " + ", ".join(r["name"] for r in upstream) + "\n"
        )
    flagged = [r for r in records if r["kind"] not in ("named", "ok")]
    out.write(f"\n{len(flagged)} cases to look at:\n")
    for r in flagged:
        out.write(f"\n- [{r['kind']}] {r['area']}/{r['name']}: {r['what']}\n")
        if r.get("detail"):
            out.write(f"    verdict: {r['detail']}\n")
        if r.get("exception"):
            message = " ".join(r["message"].split())[:300]
            out.write(f"    {r['exception']}: {message}\n")
        if r.get("stderr"):
            out.write(f"    stderr: {' '.join(r['stderr'].split())[:300]}\n")
    return out.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write DIR/adversarial_pass/results.json and summary.md",
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated parts of case names or areas to run"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    names = list(CASES)
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        names = [n for n in names if any(k in n or k == CASES[n].area for k in keys)]
    if args.list:
        for n in names:
            print(f"{CASES[n].area:12s} {n}: {CASES[n].what}")
        return
    records = run_all(names, args.timeout)
    text = report(records)
    print(text)
    if args.out is not None:
        folder = args.out / "adversarial_pass"
        folder.mkdir(parents=True, exist_ok=True)
        for r in records:
            r["source"] = textwrap.dedent(inspect.getsource(CASES[r["name"]].fn))
        (folder / "results.json").write_text(json.dumps(records, indent=2, default=str))
        (folder / "summary.md").write_text(text)
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
