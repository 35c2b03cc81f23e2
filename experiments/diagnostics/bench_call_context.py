"""The two-link forward solve and gradient, call by call, depending on what the process ran
just before.

XLA's CPU runtime runs a program's operations ("thunks") one after the other on the calling
thread when every buffer they touch is at most 512 bytes, or when there are at most 8 of them.
Otherwise it runs them as a dependency graph and hands ready operations to its thread pool
whenever more than 8 are ready at once, and the program's speed then depends on what else
runs in the process. `simulate`'s forward program is of the first kind. Its gradient touches
kilobyte buffers (the stored steps), so jaxdae keeps the operations that can be ready at
once at 8 or fewer (one flat array of segment starts, joined input checks): it runs on the
calling thread too. This script checks that: with `--before casadi` the gradient's ratio to the
forward should stay where it is with `--before none` (see docs/benchmarks.md).

Each repetition times `--calls` forward solves, then optionally runs something else, then
times `--calls` gradients. It prints the medians over all calls, and the gradient's first
repetition call by call:

- `--before none`: nothing in between;
- `--before batch`: jaxdae's `vmap` batch of 1024 trajectories, as `bench_core.py` runs it
  between the two;
- `--before casadi`: that batch and CasADi's threaded `map` over the same batch.

    python experiments/diagnostics/bench_call_context.py [--before none|batch|casadi] [--reps 7]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _common  # noqa: E402, F401  (the benchmarks' folder on sys.path)
import bench_core  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxdae  # noqa: E402, F401  (sets jaxdae's XLA option before JAX starts)
from jaxdae.examples import (
    TwoLinkManipulator,  # noqa: E402
    _two_link_reference as _peers,
)

BATCH = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", choices=("none", "batch", "casadi"), default="none")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls of each per repetition")
    args = parser.parse_args()

    fns = bench_core.jaxdae_functions()
    params = bench_core.jaxdae_params()
    q0, v0 = (jnp.asarray(x) for x in TwoLinkManipulator().initial_state())
    qb, vb = (jnp.asarray(x) for x in _peers.perturbed_states(BATCH))
    forward, gradient, batch = (jax.jit(fns[k]) for k in ("forward", "gradient", "batch"))
    between = []
    if args.before in ("batch", "casadi"):
        between.append(lambda: np.asarray(batch(params, qb, vb)))
    if args.before == "casadi":
        integrator, _ = bench_core.casadi_integrator("adams")
        mapped, _ = bench_core.casadi_map(integrator, BATCH)
        xb = np.concatenate([np.asarray(qb), np.asarray(vb)], axis=1).T
        pb = np.tile(np.asarray(_peers.PARAMS)[:, None], (1, BATCH))
        between.append(lambda: np.asarray(mapped(x0=xb, p=pb)["xf"]))
    for run in (lambda: forward(params, q0, v0), lambda: gradient(params, q0, v0), *between):
        jax.block_until_ready(run())  # compile

    def timed(fn):
        start = time.perf_counter()
        np.asarray(jax.block_until_ready(fn(params, q0, v0)))
        return time.perf_counter() - start

    times = {"forward": [], "gradient": []}
    for _ in range(args.reps):
        times["forward"] += [timed(forward) for _ in range(args.calls)]
        for run in between:
            run()
        times["gradient"] += [timed(gradient) for _ in range(args.calls)]
    fwd, grad = (1e6 * statistics.median(times[k]) for k in ("forward", "gradient"))
    first = ", ".join(f"{1e6 * t:.0f}" for t in times["gradient"][: args.calls])
    print(
        f"before the gradients: {args.before}; medians of {args.reps} × {args.calls} calls: "
        f"forward {fwd:.0f} µs, gradient {grad:.0f} µs, ratio {grad / fwd:.2f}; "
        f"first repetition's gradients [µs]: {first}"
    )


if __name__ == "__main__":
    main()
