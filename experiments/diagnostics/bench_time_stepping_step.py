"""Where a time step of the quadruped batch spends its time (`jaxdae.TimeStepping`,
`experiments/benchmarks/bench_quadruped_batch.py`'s scene): each part of one step,
`jax.jit(jax.vmap(...))` over a batch of states near the stand pose, timed in turns
(medians and minima of 5-call means over 10 rounds, so that the machine's load falls on
every part alike), and the cone solve's iteration counts along drops.

Parts: the whole step (`contact_step`); the system's terms (`M` and the forces: the
tree's composite-rigid-body and recursive passes); `M` alone (`mass_matrix`); the
recursive Newton–Euler forces alone (`inverse_dynamics`); the contact rows `[W; W_T]`
with the gaps and contact velocities (`_contact_rows`: the tree's own, from its bodies'
frames, and `AbstractSystem`'s default, forward mode through the forward kinematics); the
contact response `M⁻¹ [W; W_T]ᵀ` through the tree's articulated factor and through the
dense Cholesky factor that a step takes (`_dense_factor`), each with the terms and rows it
needs.
With `--iterations`, drops from 0.35–0.55 m of `--t1` seconds: the accelerated
projected gradient iterations and fixed-point iterations (QPs) per step, per member
and at the batch's slowest member (which sets a batch's pace under `vmap`). The parts
are timed on the tree as built (13 bodies: its recursive path); with `--dense-tree`, on its
dense path (`ARTICULATED_MIN_BODIES` raised above its 13 bodies: products with the ancestor
matrix and the Cholesky factor of `M`), which is the path a time-stepped solve poses it on.

    python experiments/diagnostics/bench_time_stepping_step.py [--batch 64] [--iterations] \
        [--dense-tree]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
from jaxdae._compilation import _cones as cones
from jaxdae._formulations._impacts import constrained_inverse_mass, friction_coefficients
from jaxdae._integration import _time_stepping as stepping
from jaxdae._integration._vector_fields import system_terms

jax.config.update("jax_enable_x64", True)

DT = 1e-3


def parts(model, formulation, batch):
    """Median and minimum ms per call of each part, for `batch` states."""
    q0, _ = __import__("quadruped_drop").initial_state(model, 0.0)
    rng = np.random.default_rng(0)
    q = jnp.asarray(np.asarray(q0)[None] + 0.01 * rng.standard_normal((batch, q0.size)))
    v = jnp.asarray(0.1 * rng.standard_normal((batch, q0.size)))
    settings = jaxdae.TimeStepping(dt=DT).solver(jnp.float64)
    friction = friction_coefficients(model, 4, jnp.float64)
    start = jnp.zeros(12)

    def rows(q_, v_):
        return model._contact_rows(0.0, q_, v_, friction)[2]

    functions = {
        "step": lambda q_, v_: stepping.contact_step(
            settings, model, formulation, None, 0.0, DT, q_, v_, start
        )[:2],
        "terms (M, forces)": lambda q_, v_: (lambda t: (t.mass_matrix, t.forces))(
            system_terms(model, 0.0, q_, v_)
        ),
        "M alone": lambda q_, v_: model.mass_matrix(0.0, q_),
        "forces alone (RNEA)": lambda q_, v_: model.inverse_dynamics(0.0, q_, v_, 0 * v_),
        "contact rows": rows,
        "contact rows, forward mode": lambda q_, v_: jaxdae.AbstractSystem._contact_rows(
            model, 0.0, q_, v_, friction
        )[2],
        "response, articulated": lambda q_, v_: constrained_inverse_mass(
            system_terms(model, 0.0, q_, v_), rows(q_, v_).T
        ),
        "response, dense": lambda q_, v_: constrained_inverse_mass(
            stepping._dense_factor(system_terms(model, 0.0, q_, v_)), rows(q_, v_).T
        ),
    }
    compiled = {name: jax.jit(jax.vmap(f)) for name, f in functions.items()}
    for f in compiled.values():
        jax.block_until_ready(f(q, v))
    times = {name: [] for name in compiled}
    for _ in range(10):
        for name, f in compiled.items():
            begin = time.perf_counter()
            for _ in range(5):
                jax.block_until_ready(f(q, v))
            times[name].append((time.perf_counter() - begin) / 5)
    return {name: (1e3 * np.median(t), 1e3 * min(t)) for name, t in times.items()}


def iterations(model, formulation, batch, t1):
    """The cone solve's QPs and APGD iterations per step along `batch` drops: each step's
    problem from the simulated states, solved warm-started from the previous step's
    impulses at the default tolerance."""
    quadruped = __import__("quadruped_drop")
    q0, _ = quadruped.initial_state(model, 0.0)
    steps = int(round(t1 / DT))
    ts = jnp.linspace(0.0, t1, steps + 1)
    settings = jaxdae.TimeStepping(dt=DT).solver(jnp.float64)
    friction = friction_coefficients(model, 4, jnp.float64)

    def states(height):
        start = q0.at[2].add(height)
        sol = jaxdae.simulate(
            model,
            formulation,
            0.0,
            t1,
            start,
            jnp.zeros_like(start),
            events=jaxdae.TimeStepping(dt=DT),
            ts=ts,
        )
        return sol.q, sol.v

    def counts(qs, vs):
        def one(impulses, state):
            q, v = state
            captured = {}

            def capture(matrix, vector, friction_, start, tolerance, max_iterations, exact):
                captured.update(matrix=matrix, vector=vector, tolerance=tolerance)
                return cones.cone_solve(
                    matrix, vector, friction_, start, tolerance, max_iterations, exact
                )

            original = stepping.cone_solve
            stepping.cone_solve = capture
            try:
                # The step unjitted (`__wrapped__`), so that it is traced here and calls the
                # capture: a jitted step already traced with these shapes would not.
                stepping.contact_step.__wrapped__(
                    settings, model, formulation, None, 0.0, DT, q, v, impulses
                )
            finally:
                stepping.cone_solve = original
            # (The time step's own maximum of APGD iterations per QP.)
            x, _, k, n = cones._fixed_point(
                captured["matrix"],
                captured["vector"],
                friction,
                impulses,
                captured["tolerance"],
                settings.max_iterations,
            )
            return x, (k, n)

        return jax.lax.scan(one, jnp.zeros(12), (qs[:-1], vs[:-1]))[1]

    qs, vs = jax.jit(jax.vmap(states))(jnp.linspace(0.35, 0.55, batch))
    k, n = jax.jit(jax.vmap(counts))(qs, vs)
    return np.asarray(k), np.asarray(n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iterations", action="store_true")
    parser.add_argument("--t1", type=float, default=0.5)
    parser.add_argument("--dense-tree", action="store_true")
    args = parser.parse_args()
    if args.dense_tree:
        from jaxdae import _thresholds

        _thresholds.ARTICULATED_MIN_BODIES = 1_000
    quadruped = __import__("quadruped_drop")
    model, _ = quadruped.quadruped(quadruped.urdf_path())
    formulation = jaxdae.Baumgarte(kd=20.0, kp=100.0)
    print(f"batch {args.batch}, float64; ms per call of jit(vmap(part)), median and minimum")
    for name, (median, least) in parts(model, formulation, args.batch).items():
        print(f"  {name:28s} {median:8.2f} {least:8.2f}")
    if args.iterations:
        k, n = iterations(model, formulation, min(args.batch, 16), args.t1)
        print(
            f"QPs per step: mean {k.mean():.2f}, batch's slowest {k.max(0).mean():.2f}; "
            f"APGD iterations per step: mean {n.mean():.1f}, batch's slowest "
            f"{n.max(0).mean():.1f}, most {n.max()}"
        )


if __name__ == "__main__":
    main()
