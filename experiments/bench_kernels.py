"""Benchmark: where the run time of a compiled jaxdae function goes, kernel by kernel
(issue 2, item 9: find where the time goes).

XLA's CPU backend compiles a program into kernels: one per fusion outside loops, and one
per loop small enough to run as a single kernel (`_xla_flags.py`); JAX's runtime and the
Python that calls it are the rest. This script calls one of `bench_core.py`'s compiled
two-link functions in a loop while `perf` samples the process, then names each sampled
address of the compiled code by its kernel (XLA registers its code with gdb's JIT
interface, so `gdb` can name it; `perf` cannot). It prints the CPU time per call by thread
(the calling one, XLA's pool) and library, and by kernel with the operation (`op_name`) the
kernel's instruction came from in the optimized HLO. Threads run in parallel, so CPU times
may add up to more than the wall time. Needs Linux `perf` and `gdb`, and permission
to attach to the process (root, or `kernel.yama.ptrace_scope = 0`).

Session 19 used it to find why the sweep's stage VJP by `scalar_vjp` ran the gradient 25-70%
slower (docs/benchmarks.md): the kernel of the sweep's loop took 0.72 against 0.21 ms per
gradient, and where the default gradient's time goes (40% outside XLA's kernels).

`--call-paths ROUNDS` instead times the functions through `jax.jit` and through the
objects of `jax.jit(f).lower(...).compile()` (no `perf` needed): JAX calls the latter
through its Python path when the program has host callbacks (session 19).

    python experiments/bench_kernels.py [--function gradient] [--seconds 4] [--batch 256]
    python experiments/bench_kernels.py --call-paths 2000
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jaxdae  # noqa: E402, F401  (sets jaxdae's XLA option before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import _peers  # noqa: E402
import bench_core  # noqa: E402
from jaxdae.examples import TwoLinkManipulator  # noqa: E402

FUNCTIONS = ("forward", "gradient", "gradient, reverse sweep", "batch", "ensemble")


def arguments(name: str, batch: int):
    if name in ("batch", "ensemble"):  # bench_core.py's perturbed states
        q0, v0 = (jnp.asarray(x) for x in _peers.perturbed_states(batch))
    else:
        q0, v0 = (jnp.asarray(x) for x in TwoLinkManipulator().initial_state())
    return bench_core.jaxdae_params(), q0, v0


def require_tools():
    missing = [tool for tool in ("perf", "gdb") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"bench_kernels.py needs {' and '.join(missing)} on the PATH (Linux `perf` "
                 "samples the process, `gdb` names XLA's compiled kernels).")


SAMPLES_PER_SECOND = 4000


def sample(call, seconds: float, workdir: Path) -> tuple[Path, float, int, int]:
    """`perf` samples of this process's CPU time while a thread of its own calls `call` in
    a loop: the perf data file, the mean wall time per call in the sampled window, the
    number of calls and the calling thread's id."""
    stop, calls, caller = threading.Event(), [0], []

    def loop():
        caller.append(threading.get_native_id())
        while not stop.is_set():
            jax.block_until_ready(call())
            calls[0] += 1

    worker = threading.Thread(target=loop)
    worker.start()
    time.sleep(0.5)  # past the first calls
    data = workdir / "perf.data"
    before, start = calls[0], time.perf_counter()
    recorded = subprocess.run(
        ["perf", "record", "-e", "cpu-clock", "-F", str(SAMPLES_PER_SECOND), "-p",
         str(os.getpid()), "-o", str(data), "--", "sleep", str(seconds)],
        capture_output=True, text=True)
    elapsed, done = time.perf_counter() - start, calls[0] - before
    stop.set()
    worker.join()
    if recorded.returncode != 0 or not data.exists():
        sys.exit(f"`perf record` failed (exit {recorded.returncode}): "
                 f"{recorded.stderr.strip()[-400:]}")
    return data, elapsed / max(done, 1), max(done, 1), caller[0]


def samples_by_symbol(data: Path) -> list[tuple[int, int, str, str]]:
    """`(samples, thread id, dso, symbol)` rows of `perf report`."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "-n", "--sort", "pid,dso,sym", "--stdio"],
        capture_output=True, text=True).stdout
    rows = []
    for line in report.splitlines():
        match = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\d+):\S*\s+(\[JIT\] tid \d+|\S+)\s+"
                         r"\[.\]\s+(\S+)", line)
        if match:
            rows.append((int(match.group(1)), int(match.group(2)), match.group(3),
                         match.group(4)))
    return rows


def kernel_names(addresses: list[str], workdir: Path) -> dict[str, str]:
    """The kernel (symbol) of each address of compiled code, by `gdb`'s `info symbol`."""
    commands = workdir / "gdb_commands"
    commands.write_text("".join(f"info symbol {address}\n" for address in addresses))
    # Into a file, not a pipe: gdb stops this process, which then cannot read a pipe.
    log = workdir / "gdb_output"
    with open(log, "w") as out_file:
        subprocess.run(["gdb", "-p", str(os.getpid()), "-batch", "-x", str(commands)],
                       stdout=out_file, stderr=subprocess.DEVNULL)
    out = log.read_text()
    names = [line.split(" in section")[0].split(" + ")[0].strip()
             for line in out.splitlines()
             if " in section " in line or line.startswith("No symbol matches")]
    if len(names) != len(addresses):
        sys.exit("`gdb` could not name the compiled code's addresses (attaching to the "
                 "process needs root or `kernel.yama.ptrace_scope = 0`).")
    return {a: ("(unnamed)" if n.startswith("No symbol") else n)
            for a, n in zip(addresses, names)}


def op_names(compiled) -> dict[str, str]:
    """Kernel name (`<instruction>_kernel` or the fusion's name) → the `op_name` of the
    instruction it was compiled from, shortened to its last path components."""
    names = {}
    for line in compiled.as_text().splitlines():
        match = re.match(r"\s+(?:ROOT )?%(\S+) = .*op_name=\"([^\"]*)\"", line)
        if match:
            parts = [p for p in match.group(2).split("/")
                     if p not in ("while", "body", "cond") and not p.startswith("jit(")]
            names[match.group(1)] = "/".join(parts[-4:])
    return names


def call_paths(rounds: int):
    """Per-call wall time (medians of `rounds` interleaved calls, one process) of the
    two-link functions called through `jax.jit` and through the object of
    `jax.jit(f).lower(...).compile()`, for jaxdae, for diffrax on the hand-written
    equations and for a trivial function."""
    q0, v0 = (jnp.asarray(x) for x in TwoLinkManipulator().initial_state())
    jaxdae_args = (bench_core.jaxdae_params(), q0, v0)
    handwritten_args = (jnp.asarray(_peers.PARAMS), q0, v0)
    functions = [
        ("jaxdae forward", bench_core.jaxdae_functions()["forward"], jaxdae_args),
        ("jaxdae gradient (default adjoint)", bench_core.jaxdae_functions()["gradient"],
         jaxdae_args),
        ("diffrax forward, hand-written equations",
         bench_core.handwritten_functions()["forward"], handwritten_args),
        ("diffrax gradient, hand-written equations",
         bench_core.handwritten_functions()["gradient"], handwritten_args),
        ("`lambda p, q, v: q`", lambda p, q, v: q, jaxdae_args),
    ]
    calls = {}
    for label, fn, inputs in functions:
        jitted = jax.jit(fn)
        calls[label, "compiled"] = (jitted.lower(*inputs).compile(), inputs)
        calls[label, "jit"] = (jitted, inputs)
    times = {key: [] for key in calls}
    for _ in range(rounds):
        for key, (call, inputs) in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call(*inputs))
            times[key].append(time.perf_counter() - start)
    median = {key: 1e6 * statistics.median(t[1:]) for key, t in times.items()}
    print(f"\nMedians of {rounds} interleaved calls [µs]\n")
    print("| function | compiled object | `jax.jit` |")
    print("| --- | ---: | ---: |")
    for label, _, _ in functions:
        print(f"| {label} | {median[label, 'compiled']:.1f} | {median[label, 'jit']:.1f} |")
    forward, gradient = (median[f"jaxdae {name}", "jit"]
                         for name in ("forward", "gradient (default adjoint)"))
    print(f"\njaxdae gradient / forward through `jax.jit`: {gradient / forward:.2f}×")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--function", choices=FUNCTIONS, default="gradient")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=256,
                        help="trajectories of `batch` and `ensemble`")
    parser.add_argument("--top", type=int, default=12, help="kernels listed")
    parser.add_argument("--call-paths", type=int, metavar="ROUNDS", default=0,
                        help="instead: time the functions through `jax.jit` and through "
                        "their ahead-of-time compiled objects, ROUNDS interleaved calls")
    args = parser.parse_args()
    if args.call_paths:
        call_paths(args.call_paths)
        return
    require_tools()

    fn = bench_core.jaxdae_functions()[args.function]
    inputs = arguments(args.function, args.batch)
    # Called through `jax.jit`, as users do: a program with host callbacks (jaxdae's and
    # diffrax's runtime checks) called as `jax.jit(f).lower(...).compile()` takes JAX's
    # Python path, ≈ 0.1 ms more per call (docs/benchmarks.md, session 19).
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*inputs))
    compiled = jitted.lower(*inputs).compile()  # the same program, for its HLO
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        data, per_call, calls, caller = sample(lambda: jitted(*inputs), args.seconds, workdir)
        rows = samples_by_symbol(data)
        names = kernel_names(sorted({sym for _, _, dso, sym in rows if dso.startswith("[JIT]")}),
                             workdir)
    # CPU time per call (threads run in parallel: their sum may exceed the wall time).
    per_sample = 1e6 / SAMPLES_PER_SECOND / calls
    by_place, by_kernel = defaultdict(float), defaultdict(float)
    for samples, thread, dso, symbol in rows:
        where = "calling thread" if thread == caller else "XLA's threads"
        what = "compiled code" if dso.startswith("[JIT]") else dso
        by_place[(where, what)] += samples * per_sample
        if dso.startswith("[JIT]"):
            by_kernel[names[symbol]] += samples * per_sample
    origin = op_names(compiled)

    print(f"\n`{args.function}`: {1e6 * per_call:.1f} µs wall time per call ({calls} calls "
          f"sampled in {args.seconds:g} s), {sum(by_place.values()):.1f} µs CPU time\n")
    print("| thread | where | µs CPU per call |")
    print("| --- | --- | ---: |")
    for (where, what), micros in sorted(by_place.items(), key=lambda kv: -kv[1])[:8]:
        print(f"| {where} | {what} | {micros:.1f} |")
    print("\n| kernel | from (op_name) | µs CPU per call |")
    print("| --- | --- | ---: |")
    for kernel, micros in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"| {kernel} | {origin.get(kernel.removesuffix('_kernel'), '')} | {micros:.1f} |")


if __name__ == "__main__":
    main()
