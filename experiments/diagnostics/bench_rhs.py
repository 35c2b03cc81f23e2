"""Benchmark: the right-hand side as an array program vs as a scalar graph
(`jaxdae/_compilation/_scalarize.py`).

1. Mukharlyamov and Deressa's (2015) two-link right-hand side
   (`ModifiedLagrange(10, [20, 10], [100, 25])`) in three forms: jaxdae's derived equations as
   traced (array form), the same re-traced as a scalar graph (what `simulate` integrates), and the
   hand-written equations of `jaxdae/examples/_two_link_reference.py`. For each: equations in the
   jaxpr, operations and fusions in XLA's optimized HLO, and the time per evaluation inside one
   compiled `lax.fori_loop` (no dispatch), alone and vmapped over a batch of 1024 states. One more
   row keeps XLA's `sin`/`cos` in the scalar graph instead of `_scalarize.sincos`'s polynomials.
2. Whole simulations of chains of k point masses joined by unit links (n = 2k coordinates,
   k length constraints, `Baumgarte(10, 25)`, t ∈ [0, 2]) with scalar graphs switched on and
   off (`MAX_WORK = 0`): compile + first call and time per trajectory (interleaved medians).
3. What bounds the gradient's cost: one Tsit5 step of the two-link and its vector–Jacobian
   product (w.r.t. the state and the gains, as in the reverse pass of `simulate`'s gradient),
   in a compiled loop whose step times change at every iteration: diffrax's `Tsit5` (stages in
   a loop) and the same tableau with its stages unrolled, next to the right-hand side alone.
   µs per iteration and XLA fusions.

    python experiments/diagnostics/bench_rhs.py
"""

import collections
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _common  # noqa: E402, F401  (the benchmarks' folder on sys.path)
import diffrax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from bench_precision import Chain  # noqa: E402

import jaxdae  # noqa: E402
from jaxdae import _thresholds
from jaxdae._compilation import _scalarize  # noqa: E402
from jaxdae._integration._term import SystemTerm  # noqa: E402
from jaxdae._integration._vector_fields import state_rates  # noqa: E402
from jaxdae.examples import (
    TwoLinkManipulator,  # noqa: E402
    _two_link_reference as _peers,
)

LOOP = 10_000
BATCH = 1024
DEFAULT_WORK = _thresholds.MAX_WORK
SINCOS = dict(_scalarize._SINCOS)


def _hlo_counts(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    ops = collections.Counter(re.findall(r"= \w+\[[^\]]*\]\S* ([\w-]+)\(", text))
    skip = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}
    return sum(v for k, v in ops.items() if k not in skip), ops["fusion"]


def _per_evaluation_us(rhs, y0, loop=LOOP):
    """µs per evaluation of `rhs(y) -> ẏ` inside one compiled loop (tiny Euler steps)."""
    run = jax.jit(lambda y: jax.lax.fori_loop(0, loop, lambda i, y: y + 1e-7 * rhs(y), y))
    jax.block_until_ready(run(y0))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(run(y0))
        times.append(time.perf_counter() - start)
    return 1e6 * min(times) / loop


def _batched_ns(rhs, y0):
    """ns per evaluation per trajectory of the vmapped `rhs` on a batch of `BATCH` states."""
    ys = y0 + 1e-2 * jax.random.normal(jax.random.key(0), (BATCH, y0.shape[0]), y0.dtype)
    return 1e3 * _per_evaluation_us(jax.vmap(rhs), ys, loop=LOOP // 50) / BATCH


def right_hand_sides():
    system = TwoLinkManipulator()
    formulation = jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    q0, v0 = system.initial_state()
    y0 = jnp.concatenate([q0, v0])
    t = jnp.asarray(0.3)

    def jaxdae_rhs(fn):
        def rhs(y):
            return jnp.concatenate(fn(system, formulation, t, y[:2], y[2:]))

        return rhs

    def handwritten(y):
        return jnp.stack(_peers._equations(jnp, t, y, jnp.asarray(_peers.PARAMS))[0])

    forms = {  # (function, scalar graphs' work limit, their sin/cos polynomials)
        "array form (autodiff-derived, as traced)": (jaxdae_rhs(state_rates), 0, True),
        "scalar graph with XLA's sin/cos": (jaxdae_rhs(state_rates), DEFAULT_WORK, False),
        "scalar graph (what simulate integrates)": (jaxdae_rhs(state_rates), DEFAULT_WORK, True),
        "hand-written jax.numpy equations": (handwritten, DEFAULT_WORK, True),
    }
    reference = np.asarray(jax.jit(handwritten)(y0))
    print(
        "| two-link right-hand side | jaxpr equations | HLO operations | fusions | "
        f"µs per evaluation | ns per trajectory, batch of {BATCH} | "
        "max abs diff vs hand-written |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (rhs, max_work, polynomials) in forms.items():
        _thresholds.MAX_WORK = max_work  # 0: nothing is re-traced as a scalar graph
        _scalarize._SINCOS.clear()  # empty: sin and cos stay XLA's
        _scalarize._SINCOS.update(SINCOS if polynomials else {})
        jax.clear_caches()
        jaxpr = jax.make_jaxpr(rhs)(y0).jaxpr
        equations = _count_equations(jaxpr)
        ops, fusions = _hlo_counts(rhs, y0)
        diff = np.max(np.abs(np.asarray(jax.jit(rhs)(y0)) - reference))
        print(
            f"| {name} | {equations} | {ops} | {fusions} | "
            f"{_per_evaluation_us(rhs, y0):.3f} | {_batched_ns(rhs, y0):.1f} | {diff:.1e} |"
        )
    _thresholds.MAX_WORK = DEFAULT_WORK
    _scalarize._SINCOS.update(SINCOS)


def _count_equations(jaxpr) -> int:
    """Equations of a jaxpr, those inside `jit` calls included."""
    total = 0
    for eqn in jaxpr.eqns:
        inner = eqn.params.get("jaxpr") if eqn.primitive.name in ("jit", "pjit") else None
        total += 1 if inner is None else _count_equations(inner.jaxpr)
    return total


def chains():
    """Both variants compiled first, then timed alternately (interleaved medians)."""
    print("\n| n | scalar graphs | compile + first call [s] | one trajectory [ms] |")
    print("| ---: | --- | ---: | ---: |")
    for links in (2, 4, 6, 8):
        system = Chain(links=links)
        q0, v0 = system.hanging_state()
        solves, compile_s = {}, {}
        for on in (False, True):
            _thresholds.MAX_WORK = DEFAULT_WORK if on else 0
            jax.clear_caches()
            start = time.perf_counter()
            # Compiled ahead of time: `jax.clear_caches()` does not touch the executable.
            solves[on] = (
                jax.jit(
                    lambda q: (
                        jaxdae.simulate(
                            system,  # noqa: B023
                            jaxdae.Baumgarte(10.0, 25.0),
                            0.0,
                            2.0,
                            q,
                            v0,  # noqa: B023
                        ).q_final
                    )
                )
                .lower(q0)
                .compile()
            )
            jax.block_until_ready(solves[on](q0))
            compile_s[on] = time.perf_counter() - start
        times = {False: [], True: []}
        for _ in range(15):
            for on, solve in solves.items():
                start = time.perf_counter()
                jax.block_until_ready(solve(q0))
                times[on].append(time.perf_counter() - start)
        for on in (False, True):
            print(
                f"| {2 * links} | {'on' if on else 'off'} | {compile_s[on]:.2f} | "
                f"{1e3 * float(np.median(times[on])):.2f} |"
            )
    _thresholds.MAX_WORK = DEFAULT_WORK


def steps(loop: int = 130):
    system = TwoLinkManipulator()
    formulation = jaxdae.ModifiedLagrange(10.0, jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    y0 = system.initial_state()

    def stepper(solver):
        """One step from `y`, its first stage evaluated (by `init` or in the stage loop)."""

        def step(formulation, t0, t1, y):
            term = SystemTerm(system, formulation)  # no failure reference
            state = solver.init(term, t0, t1, y, None)
            return solver.step(term, t0, t1, y, None, state, False)[0]

        return step

    diffrax_step = stepper(diffrax.Tsit5())
    unrolled_step = stepper(jaxdae.UnrolledERK(diffrax.Tsit5()))

    def rhs(formulation, t0, t1, y):
        rates = SystemTerm(system, formulation).vf(t0, y, None)
        return jax.tree.map(lambda y_, f: y_ + 1e-9 * f, y, rates)

    def forward(step):
        return jax.jit(
            lambda f, y: jax.lax.fori_loop(
                0, loop, lambda i, y: step(f, 0.01 * i, 0.01 * (i + 1), y), y
            )
        )

    def reverse(step):
        def run(formulation, y):
            def body(i, carry):  # linearized at (formulation, y) with the step's times
                cotangent, gains = carry
                _, vjp = jax.vjp(
                    lambda f, y_: step(f, 0.01 * i, 0.01 * (i + 1), y_), formulation, y
                )
                d_gains, d_state = vjp(cotangent)
                return d_state, jax.tree.map(jnp.add, gains, d_gains)

            return jax.lax.fori_loop(0, loop, body, (y, formulation))

        return jax.jit(run)

    rows = (
        ("right-hand side alone", rhs),
        ("diffrax `Tsit5` step", diffrax_step),
        ("Tsit5 step, stages unrolled", unrolled_step),
    )
    compiled = {}
    for name, step in rows:
        for kind, build in (("forward", forward), ("vjp", reverse)):
            fn = build(step)
            compiled[name, kind] = (fn, _hlo_counts(fn, formulation, y0)[1])
            jax.block_until_ready(fn(formulation, y0))
    # Interleaved; the minimum over repetitions estimates the cost without the noise of
    # other work on the (virtual) cores.
    times = {key: [] for key in compiled}
    for _ in range(15):
        for key, (fn, _) in compiled.items():
            start = time.perf_counter()
            for _ in range(10):
                out = fn(formulation, y0)
            jax.block_until_ready(out)
            times[key].append((time.perf_counter() - start) / 10)
    us = {key: 1e6 * min(values) / loop for key, values in times.items()}
    print(
        f"\n| per iteration of a compiled loop ({loop} iterations; minimum of 15 interleaved "
        "repetitions) | forward [µs] | fusions | vjp [µs] | fusions | vjp / forward |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, _ in rows:
        fwd, rev = us[name, "forward"], us[name, "vjp"]
        print(
            f"| {name} | {fwd:.2f} | {compiled[name, 'forward'][1]} | {rev:.2f} | "
            f"{compiled[name, 'vjp'][1]} | {rev / fwd:.1f} |"
        )


if __name__ == "__main__":
    right_hand_sides()
    chains()
    steps()
