"""What importing jaxdae changes in JAX: 64-bit floats and two XLA options for the CPU.

Both are set by `configure_on_import`, which `jaxdae/__init__.py` calls first thing; each has
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
and without `JAXDAE_SET_XLA_FLAGS=0`).

**XLA's classic CPU fusion emitters.** `xla_cpu_use_fusion_emitters=false` has XLA:CPU
generate its fused kernels with its classic LLVM emitters instead of the MLIR-based ones,
which take longer to compile the many small fusions of a solve and of its gradient. Measured
by `experiments/diagnostics/bench_xla_compile_options.py` (each setting in its own process,
three runs each, process CPU time of the XLA compile, 2-core CPU): the two-link solve
1.26–1.36 → 0.78–0.89 s, its gradient 3.03–3.21 → 2.19–2.55 s, a `vmap` batch of it
2.36–2.47 → 1.78–1.88 s, the chain of 64 point masses (128 coordinates) 2.28–2.34 →
1.83–1.91 s and its gradient 4.92–5.29 → 4.24–4.42 s, the ladder of 128 four-bars (512
coordinates) 2.93–3.05 → 2.29–2.39 s and its gradient 6.68–7.04 → 5.55–6.03 s; the compiled
programs ran as fast (medians within 3%, within the spread between runs). XLA aborts on an
option it does not know, so it is set only for the jaxlib versions it was measured on
(`FUSION_JAXLIB`, the 0.10 series).

The options live in `XLA_FLAGS`, which XLA reads once, when JAX starts its first backend;
so they are set when jaxdae is imported, before any computation. Each is left alone when
`XLA_FLAGS` already names it (e.g. `...byte_threshold=1024` or
`--xla_cpu_use_fusion_emitters=true`, XLA's defaults); `JAXDAE_SET_XLA_FLAGS=0` leaves
`XLA_FLAGS` alone altogether. If JAX has already computed something when jaxdae is
imported, a warning says how to get the options. GPU backends do not read them.
"""

import os
import re
import warnings

SMALL_LOOP_OPTION = "xla_cpu_small_while_loop_byte_threshold"
SMALL_LOOP_BYTES = 1_000_000_000
FUSION_OPTION = "xla_cpu_use_fusion_emitters"
FUSION_JAXLIB = ((0, 10), (0, 11))  # jaxlib releases [from, to) that take `FUSION_OPTION`
_EXTRA_OPTIONS = "--xla_backend_extra_options="


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


def with_fusion_option(flags: str) -> str:
    """`flags` (the value of `XLA_FLAGS`) with XLA:CPU's classic fusion emitters chosen
    (`FUSION_OPTION=false`), unless it already names the option."""
    if FUSION_OPTION in flags:
        return flags
    return " ".join([*flags.split(), f"--{FUSION_OPTION}=false"])


def jaxlib_knows_fusion_option() -> bool:
    """Whether the installed jaxlib is of a series on which `FUSION_OPTION` was measured
    (`FUSION_JAXLIB`); read from `jaxlib.version`, which starts no backend."""
    try:
        from jaxlib.version import __version__
    except ImportError:
        return False
    release = tuple(int(x) for x in re.findall(r"\d+", __version__)[:2])
    return FUSION_JAXLIB[0] <= release < FUSION_JAXLIB[1]


def wanted_flags(flags: str) -> str:
    """`flags` with jaxdae's options added (see the module docstring)."""
    wanted = with_small_loop_option(flags)
    return with_fusion_option(wanted) if jaxlib_knows_fusion_option() else wanted


def set_xla_flags() -> None:
    """Adds jaxdae's XLA:CPU options to `XLA_FLAGS` (see the module docstring)."""
    flags = os.environ.get("XLA_FLAGS", "")
    wanted = wanted_flags(flags)
    if wanted == flags:
        return
    from ._private_apis import backends_are_initialized

    if backends_are_initialized():
        warnings.warn(
            "jaxdae was imported after JAX started its backend, so XLA runs while loops (every "
            "solve) kernel by kernel, several times slower on the CPU, and compiles more "
            "slowly. Import jaxdae before the first JAX computation, or set the environment "
            "variable before starting "
            f"Python: XLA_FLAGS='{wanted}' (set JAXDAE_SET_XLA_FLAGS=0 to silence this).",
            stacklevel=2)
        return
    os.environ["XLA_FLAGS"] = wanted


def configure_on_import() -> None:
    """Sets what importing jaxdae changes (see the module docstring): the XLA options unless
    `JAXDAE_SET_XLA_FLAGS=0`, then float64 unless `JAXDAE_ENABLE_X64=0` or `JAX_ENABLE_X64`
    is set. Runs before jaxdae computes anything."""
    if os.environ.get("JAXDAE_SET_XLA_FLAGS", "1") != "0":
        set_xla_flags()
    if os.environ.get("JAXDAE_ENABLE_X64", "1") != "0" and "JAX_ENABLE_X64" not in os.environ:
        import jax

        jax.config.update("jax_enable_x64", True)
