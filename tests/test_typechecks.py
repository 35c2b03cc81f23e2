"""The test run checks jaxdae's annotations at run time (jaxtyping's import hook, installed by
`conftest.py` unless `JAXDAE_TYPECHECK=0`)."""

import os

import jax.numpy as jnp
import pytest

from jaxdae._compilation._linalg import unrolled_cholesky_factor

pytestmark = pytest.mark.skipif(
    os.environ.get("JAXDAE_TYPECHECK") == "0", reason="runtime type checks turned off"
)


def test_a_shape_against_its_annotation_is_refused():
    """`unrolled_cholesky_factor` takes a square `Float[Array, "n n"]`."""
    unrolled_cholesky_factor(jnp.eye(2))
    with pytest.raises(Exception, match="n n"):
        unrolled_cholesky_factor(jnp.ones((2, 3)))
