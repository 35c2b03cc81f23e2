"""What importing jaxdae changes in JAX: 64-bit floats and two XLA:CPU options for while loops.

They are set by `configure_on_import`, which `jaxdae/__init__.py` calls first thing; float64
and the XLA options each have an opt-out, an environment variable read at the import.

- **float64** (`jax_enable_x64`): float32 cannot meet the tolerances that constrained
  dynamics needs. Arrays created as float32 stay float32. Left alone when
  `JAXDAE_ENABLE_X64=0`, or when JAX's own `JAX_ENABLE_X64` is set (the user chose).
- **Whole while loops as one CPU kernel** (`xla_cpu_small_while_loop_byte_threshold`):
  XLA:CPU pays a fixed dispatch cost per fused kernel at every iteration of a while loop,
  and a small system's diffrax step is a few dozen small kernels; above the limit (1 kB by
  default, below every solve) a loop runs kernel by kernel. A loop whose body holds a
  scatter, a sort or a custom call still does, so the right-hand sides of the solves avoid
  them (`SparseMatrix.dense`, `LOOPED_MAX` in `_linalg.py`).
- **No library fusions inside those loops** (`--xla_disable_hlo_passes=dot-library-rewriter`,
  joined to the passes the user disables): the pass hands mid-sized matrix products to a
  library call, a separate kernel that makes the whole loop run kernel by kernel again.
  XLA ignores a pass name it does not know.

The options live in `XLA_FLAGS`, which XLA reads once, when JAX starts its first backend,
and they stay process-wide: XLA refuses the loop limit as a per-program compile option
(`jax.jit`'s `compiler_options`), and a user's own `jax.jit` around `jaxdae.simulate`
compiles the user's program, not jaxdae's, so per-program options would miss it.
Each is left alone when `XLA_FLAGS` already names it, and both when
`JAXDAE_SET_XLA_FLAGS=0`. If JAX has already computed something when jaxdae is imported, a
warning says how to get them. GPU backends do not read them. The measurements behind each
choice, with their commands: `docs/guides/performance.md#what-importing-jaxdae-changes`.
"""

import os
import warnings

SMALL_LOOP_OPTION = "xla_cpu_small_while_loop_byte_threshold"
SMALL_LOOP_BYTES = 1_000_000_000
_EXTRA_OPTIONS = "--xla_backend_extra_options="


DOT_LIBRARY_PASS = "dot-library-rewriter"
_DISABLED_PASSES = "--xla_disable_hlo_passes="


def _joined(flags: str, flag: str, item: str) -> str:
    """`flags` with `item` added to the comma-separated value of the last `flag` (a prefix
    such as `--xla_disable_hlo_passes=`) given, or with `flag + item` appended."""
    tokens = flags.split()
    given = [i for i, token in enumerate(tokens) if token.startswith(flag)]
    if given:
        value = tokens[given[-1]][len(flag) :]
        tokens[given[-1]] = flag + (f"{value},{item}" if value else item)
    else:
        tokens.append(flag + item)
    return " ".join(tokens)


def with_small_loop_option(flags: str) -> str:
    """`flags` (the value of `XLA_FLAGS`) with XLA:CPU's small-while-loop limit raised to
    `SMALL_LOOP_BYTES`, unless it already names the option. The option joins the last
    `--xla_backend_extra_options` given, if any, so that the user's extra options stay.
    Options starting with `xla_` are XLA's own: GPU backends do not pass them to LLVM."""
    if SMALL_LOOP_OPTION in flags:
        return flags
    return _joined(flags, _EXTRA_OPTIONS, f"{SMALL_LOOP_OPTION}={SMALL_LOOP_BYTES}")


def without_dot_library_pass(flags: str) -> str:
    """`flags` with XLA:CPU's `DOT_LIBRARY_PASS` disabled, unless they already name it. The
    pass joins the last `--xla_disable_hlo_passes` given, if any. XLA ignores a pass name
    it does not know (a version without the pass)."""
    if DOT_LIBRARY_PASS in flags:
        return flags
    return _joined(flags, _DISABLED_PASSES, DOT_LIBRARY_PASS)


def set_xla_flags() -> None:
    """Sets jaxdae's XLA:CPU options in `XLA_FLAGS` (see the module docstring)."""
    flags = os.environ.get("XLA_FLAGS", "")
    wanted = without_dot_library_pass(with_small_loop_option(flags))
    if wanted == flags:
        return
    from ._private_apis import backends_are_initialized

    if backends_are_initialized():
        warnings.warn(
            "jaxdae was imported after JAX started its backend, so XLA runs while loops (every "
            "solve) kernel by kernel, several times slower on the CPU. Import jaxdae before "
            "the first JAX computation, or set the environment variable before starting "
            f"Python: XLA_FLAGS='{wanted}' (set JAXDAE_SET_XLA_FLAGS=0 to silence this).",
            stacklevel=2,
        )
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
