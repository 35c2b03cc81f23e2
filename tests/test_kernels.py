"""`kernel_boundary` (`jaxdae/_compilation/_kernels.py`): the value passes unchanged, and a
loop whose body holds it runs kernel by kernel while the loops inside it stay one kernel each."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae  # noqa: F401  (sets the XLA loop option on import)
from jaxdae._compilation._kernels import kernel_boundary

SMALL_CALL = 'xla_cpu_small_call="true"'
# The kernels are counted as XLA compiles them for users, with its fusion emitters, which
# the test processes turn off to compile faster where XLA has the switch (`tests/conftest.py`):
# with the elemental emitters the two inner loops of the split program are four small calls.
AS_FOR_USERS = {"xla_cpu_use_fusion_emitters": True} if jax.__version_info__ < (0, 11) else {}
# The kernels counted are XLA:CPU's.
pytestmark = pytest.mark.usefixtures("on_cpu")


def _nested_loops(boundary: bool):
    def inner(i, y):
        return jnp.sin(y) * 1.01 + 0.1

    def outer(k, y):
        y = jax.lax.fori_loop(0, 3, inner, y)
        if boundary:
            y = kernel_boundary(y)
        return jax.lax.fori_loop(0, 3, inner, y)

    return jax.jit(lambda x: jax.lax.fori_loop(0, 20, outer, x))


@pytest.mark.parametrize("shape", [(), (1,), (2,), (3, 4)])
def test_the_value_passes_unchanged(shape):
    x = jnp.arange(np.prod(shape, dtype=int), dtype=float).reshape(shape) + 0.5
    y = jax.jit(kernel_boundary)(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)
    # (and its derivative is the identity's)
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(kernel_boundary(x) ** 2))(x), 2 * x)


def test_the_loop_around_it_runs_kernel_by_kernel():
    x = jnp.linspace(0.0, 1.0, 8)
    plain, split = (_nested_loops(b) for b in (False, True))
    np.testing.assert_array_equal(plain(x), split(x))
    # One kernel holding all three loops, against the two inner loops as kernels of their own.
    assert plain.lower(x).compile(compiler_options=AS_FOR_USERS).as_text().count(SMALL_CALL) == 3
    assert split.lower(x).compile(compiler_options=AS_FOR_USERS).as_text().count(SMALL_CALL) == 2
