"""An eager `jaxdae.simulate` with its times as Python numbers (compiled into the program)
and as arrays (inputs of the program).

Eager calls run `simulate`'s compiled solve through `eqx.filter_jit`. Times given as Python
numbers are static there, as in `diffrax.diffeqsolve`, and jaxdae holds them as constants of
the program (`Times.given`, `compiled_times`); times given as arrays are its inputs, one program
for all their values. Each case runs in its own process: the first call (trace, compile and
run), a second call with the same times, a call with another `t1` (a new program for Python
numbers, the same one for arrays), and the optimized program's HLO instructions.

    PYTHONPATH=. .venv/bin/python experiments/diagnostics/bench_compiled_times.py [--rounds 3]

Models: the two-link arm of the benchmark report (`ModifiedLagrange(10, [20, 10], [100, 25])`,
`t ∈ [0, 2]`) and the bouncing ball (`BouncingBall(e=0.8)`, events, `t ∈ [0, 2]`).
"""

import argparse
import json
import subprocess
import sys
import time

CASES = ("python", "array")
MODELS = ("two-link", "ball")


def measure(model: str, case: str) -> dict:
    """The figures of one model and one kind of times, in this process."""
    import jax.numpy as jnp

    import jaxdae
    from jaxdae._integration._problem import SolveKeywords
    from jaxdae._integration._simulate import pose_problem, solve_problem
    from jaxdae._integration._trajectories import SingleTrajectory
    from jaxdae.examples import BouncingBall, TwoLinkManipulator

    if model == "two-link":
        system = TwoLinkManipulator()
        formulation = jaxdae.ModifiedLagrange(10.0, [20.0, 10.0], [100.0, 25.0])
        q0, v0 = system.initial_state()
    else:
        system = BouncingBall(e=0.8)
        formulation = jaxdae.Unstabilized()
        q0, v0 = jnp.array([0.0, 1.0]), jnp.zeros(2)

    def times(t1):
        return (0.0, t1) if case == "python" else (jnp.asarray(0.0), jnp.asarray(t1))

    def run(t1):
        start = time.perf_counter()
        sol = jaxdae.simulate(system, formulation, *times(t1), q0, v0)
        sol.q_final.block_until_ready()
        return time.perf_counter() - start

    first, again, other = run(2.0), run(2.0), run(1.5)
    t0, t1 = times(2.0)
    problem, _ = pose_problem(
        system, formulation, t0, t1, q0, v0, ("simulate", {}, SolveKeywords), SingleTrajectory()
    )
    text = solve_problem.jitted.lower(problem).lowered.compile().as_text()
    instructions = sum(" = " in line for line in text.splitlines())
    return {"first": first, "again": again, "other t1": other, "instructions": instructions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", nargs=2, metavar=("MODEL", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    rows = {(model, case): [] for model in MODELS for case in CASES}
    for _ in range(args.rounds):
        for model in MODELS:
            for case in CASES:  # alternated, each in a fresh process
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", model, case],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows[model, case].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| model | times | first call [s] | again [ms] | another `t1` [s] | HLO instructions |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (model, case), runs in rows.items():

        def median(key, runs=runs):
            return sorted(run[key] for run in runs)[len(runs) // 2]

        print(
            f"| {model} | {case} | {median('first'):.2f} | {1e3 * median('again'):.2f} | "
            f"{median('other t1'):.3f} | {median('instructions'):,} |"
        )


if __name__ == "__main__":
    main()
