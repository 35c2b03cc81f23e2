"""What importing jaxdae changes in JAX: 64-bit floats and two XLA:CPU options for while loops.

They are set by `configure_on_import`, which `jaxdae/__init__.py` calls first thing; float64
and the XLA options each have an opt-out, an environment variable read at the import.

**float64.** `jax_enable_x64` is turned on: JAX's float32 default cannot meet the
tolerances that constrained dynamics needs (`rtol=1e-8` is below float32's resolution).
Arrays created as float32 stay float32, and a float32 `q0` runs the whole simulation in
float32. Left alone when `JAXDAE_ENABLE_X64=0`, or when JAX's own `JAX_ENABLE_X64` is set
(the user chose).

**Whole while loops as one CPU kernel.** XLA's CPU runtime executes a compiled program as a
sequence of "thunks", one per fused kernel, and pays a fixed cost for each at every iteration
of a while loop. A diffrax step of a small constrained system is a few dozen small kernels,
so the dispatching costs more than the arithmetic. XLA compiles a while loop into one kernel
when it accesses fewer bytes than `xla_cpu_small_while_loop_byte_threshold`, 1 kB by
default, which excludes every solve. jaxdae raises the limit so that its solves (and the
user's other loops) run as single kernels. A loop whose body holds a scatter, a sort or a
custom call (a LAPACK routine, a host callback) still runs kernel by kernel, so the
right-hand sides of the solves avoid them (`SparseMatrix.dense`, `LOOPED_MAX` in
`_linalg.py`).

**No library fusions inside those loops.** XLA:CPU hands matrix–matrix products with a
dimension of 8 or more, with the operations around them, to a library (YNNPACK, its
`dot-library-rewriter` pass); such a call is a separate kernel, so a loop that holds one
runs kernel by kernel. The right-hand sides of mid-sized models hold such products (the
elimination's `J M⁻¹ Jᵀ` of a Cartesian chain of 5 or 6 links; a rigid body's small products
batched over the tangents of the derivatives; a user's own matrix products). jaxdae disables
that pass (`--xla_disable_hlo_passes`, joined to the passes the user disables; XLA ignores a
pass name it does not know).

What each option gains, and why XLA's compile-time options are left to their defaults:
docs/design_measurements.md#xla-options.

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


DOT_LIBRARY_PASS = "dot-library-rewriter"
_DISABLED_PASSES = "--xla_disable_hlo_passes="


def _joined(flags: str, flag: str, item: str) -> str:
    """`flags` with `item` added to the comma-separated value of the last `flag` (a prefix
    such as `--xla_disable_hlo_passes=`) given, or with `flag + item` appended."""
    tokens = flags.split()
    given = [i for i, token in enumerate(tokens) if token.startswith(flag)]
    if given:
        value = tokens[given[-1]][len(flag):]
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
