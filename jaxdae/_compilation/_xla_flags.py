"""What importing jaxdae changes in JAX: 64-bit floats and two XLA options for while loops.

They are set by `configure_on_import`, which `jaxdae/__init__.py` calls first thing; each has
an opt-out, an environment variable read at the import.

**float64.** `jax_enable_x64` is turned on: JAX's float32 default cannot meet the
tolerances that constrained dynamics needs (`rtol=1e-8` is below float32's resolution; on
paper 004's two-link arm a float32 solve at that tolerance takes 23× the steps and 45× the
time of the float64 one and ends 2.7e-7 away from it;
`experiments/diagnostics/bench_import_settings.py`). Arrays created as float32 stay float32, and a
float32 `q0` runs the whole simulation in float32. Left alone when `JAXDAE_ENABLE_X64=0`,
or when JAX's own `JAX_ENABLE_X64` is set (the user chose).

**Whole while loops as one CPU kernel.** XLA's CPU runtime executes a compiled program as a
sequence of "thunks", one per fused kernel, and pays a fixed cost for each at every iteration
of a while loop. A diffrax step of a small constrained system is a few dozen small kernels,
so the dispatching costs more than the arithmetic. XLA compiles a while loop into one kernel
when it accesses fewer bytes than `xla_cpu_small_while_loop_byte_threshold`, 1 kB by
default, which excludes every solve. jaxdae raises the limit so that its solves (and the
user's other loops) run as single kernels. On paper 004's two-link arm (2-core CPU) a loop
evaluating the right-hand side 6 times per iteration runs about 6× faster with it
(`experiments/diagnostics/bench_xla_loops.py`); one trajectory takes 0.14 ms instead of
0.54 ms and its gradient 0.37 ms instead of 10–12 ms, at unchanged compile times
(`experiments/diagnostics/bench_import_settings.py`, which runs the two-link benchmark with
and without `JAXDAE_SET_XLA_FLAGS=0`). A loop whose body holds a scatter, a sort or a
custom call (a LAPACK routine, a host callback) still runs kernel by kernel, so the
right-hand sides of the solves avoid them (`SparseMatrix.dense`, `LOOPED_MAX` in
`_linalg.py`).

**No library fusions inside those loops.** XLA:CPU hands some operations to a library
(YNNPACK's "library fusions": a matrix product whose largest dimension is 8 or more, some
reductions), and a loop holding one is not compiled into one kernel either. The products
and sums of jaxdae's right-hand sides are small (rotation matrices, a body's `4 × 4`
blocks) but batched over the tangents of the derivatives, which makes them that large:
the flyball governor of `experiments/flyball_governor.py` (4 rigid bodies, 28
coordinates) evaluated its right-hand side in 74 µs with them and in 27 µs without (a
loop of 2,000 evaluations, CPU time, 2-core CPU, load 4–5), and a Tsit5 step took 459 µs
against 208 µs (`experiments/diagnostics/bench_import_settings.py --model governor`).
jaxdae therefore turns the library fusions off (`--xla_cpu_experimental_ynn_fusion_type=`,
an empty list); XLA then compiles those operations itself, as it does without the
library.

XLA's compile time is left to XLA's defaults: its classic CPU fusion emitters
(`--xla_cpu_use_fusion_emitters=false`) compiled jaxdae's programs with 15–37% less CPU time
(two-link solve 1.3 → 0.8 s), but some of the programs ran 25–40% slower (the structured
solves of the chain and the ladder at 32 coordinates) and others 4× faster, so the choice
belongs to the user.

The options live in `XLA_FLAGS`, which XLA reads once, when JAX starts its first backend;
so they are set when jaxdae is imported, before any computation. Each is left alone when
`XLA_FLAGS` already names it (e.g. `...byte_threshold=1024`, XLA's default), and both when
the environment variable `JAXDAE_SET_XLA_FLAGS` is `0`. If JAX has already computed
something when jaxdae is imported, a warning says how to get the option. GPU backends do
not read it.
"""

import os
import warnings

SMALL_LOOP_OPTION = "xla_cpu_small_while_loop_byte_threshold"
SMALL_LOOP_BYTES = 1_000_000_000
_EXTRA_OPTIONS = "--xla_backend_extra_options="
LIBRARY_FUSION_OPTION = "xla_cpu_experimental_ynn_fusion_type"
LIBRARY_FUSIONS = ""  # none


def with_small_loop_option(flags: str) -> str:
    """`flags` (the value of `XLA_FLAGS`) with XLA:CPU's small-while-loop limit raised to
    `SMALL_LOOP_BYTES`, unless it already names the option. The option joins the last
    `--xla_backend_extra_options` given, if any, so that the user's extra options stay.
    Options starting with `xla_` are XLA's own: GPU backends do not pass them to LLVM."""
    if SMALL_LOOP_OPTION in flags:
        return flags
    option = f"{SMALL_LOOP_OPTION}={SMALL_LOOP_BYTES}"
    tokens = flags.split()
    extra = [i for i, token in enumerate(tokens) if token.startswith(_EXTRA_OPTIONS)]
    if extra:
        given = tokens[extra[-1]][len(_EXTRA_OPTIONS):]
        tokens[extra[-1]] = _EXTRA_OPTIONS + (f"{given},{option}" if given else option)
    else:
        tokens.append(_EXTRA_OPTIONS + option)
    return " ".join(tokens)


def without_library_fusions(flags: str) -> str:
    """`flags` (the value of `XLA_FLAGS`) with XLA:CPU's library fusions turned off
    (`LIBRARY_FUSIONS`), unless it already names the option."""
    if LIBRARY_FUSION_OPTION in flags:
        return flags
    return " ".join(flags.split() + [f"--{LIBRARY_FUSION_OPTION}={LIBRARY_FUSIONS}"])


def loop_options(flags: str) -> str:
    """`flags` with both of jaxdae's options for loops (see the module docstring)."""
    return without_library_fusions(with_small_loop_option(flags))


def set_xla_flags() -> None:
    """Raises XLA:CPU's small-while-loop limit and turns its library fusions off in
    `XLA_FLAGS` (see the module docstring)."""
    flags = os.environ.get("XLA_FLAGS", "")
    wanted = loop_options(flags)
    if wanted == flags:
        return
    from ._private_apis import backends_are_initialized

    if backends_are_initialized():
        warnings.warn(
            "jaxdae was imported after JAX started its backend, so XLA runs while loops (every "
            "solve) kernel by kernel, several times slower on the CPU. Import jaxdae before "
            "the first JAX computation, or set the environment variable before starting "
            f"Python: XLA_FLAGS='{wanted}' (set JAXDAE_SET_XLA_FLAGS=0 to silence this).",
            stacklevel=2)
        return
    os.environ["XLA_FLAGS"] = wanted


def configure_on_import() -> None:
    """Sets what importing jaxdae changes (see the module docstring): the XLA option unless
    `JAXDAE_SET_XLA_FLAGS=0`, then float64 unless `JAXDAE_ENABLE_X64=0` or `JAX_ENABLE_X64`
    is set. Runs before jaxdae computes anything."""
    if os.environ.get("JAXDAE_SET_XLA_FLAGS", "1") != "0":
        set_xla_flags()
    if os.environ.get("JAXDAE_ENABLE_X64", "1") != "0" and "JAX_ENABLE_X64" not in os.environ:
        import jax

        jax.config.update("jax_enable_x64", True)
