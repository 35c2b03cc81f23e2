"""Where XLA:CPU splits a while loop into separately compiled kernels.

jaxdae raises XLA:CPU's small-loop limit on import (`_xla_flags.py`), so that a while loop
without a scatter, a dot or a custom call is compiled into one CPU kernel: one LLVM
function holding the loop and every loop inside it. Running a solve's loop that way is
several times faster for small systems; compiling it costs more than its size, and one
such kernel is compiled on one thread. [`kernel_boundary`][] makes a loop run its body
kernel by kernel instead, while the loops inside that body each stay one kernel, compiled
separately and in parallel. It pays where a loop's body holds several large loops and an
iteration costs far more than the handful of kernel launches it adds: the reverse sweep's
step, whose stage loops linearize and transpose the right-hand side.
"""

import jax.numpy as jnp

from .._custom_types import Array

# The entries that the boundary's scatter touches: XLA rewrites a scatter into one entry as
# a dynamic update and drops it, but keeps one into two.
_ENTRIES = (0, 1)


def kernel_boundary(x: Array) -> Array:
    """`x` (a floating array of at least two entries) unchanged, through a scatter: XLA:CPU
    does not compile a loop whose body holds a scatter into one kernel (its
    `SmallWhileLoopHoistingPass`), so the loop that computes `x` runs its body kernel by
    kernel and compiles the loops inside it as separate kernels (see the module
    docstring). Split kernels compile in parallel: the gradient of a large model compiles
    faster and runs at the same speed (docs/design_measurements.md#kernel-boundary)."""
    flat = jnp.ravel(x)
    if flat.size < len(_ENTRIES):
        return x
    return flat.at[jnp.asarray(_ENTRIES)].add(0).reshape(jnp.shape(x))
