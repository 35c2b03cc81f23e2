"""Whether a matrix is Hurwitz (every eigenvalue with a negative real part): the stability
test of the stabilization gains' companion matrices, eagerly and traced."""

import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._custom_types import Array, ArrayLike, Bool, Float


def not_hurwitz(
    matrix: Float[ArrayLike, "*stack d d"], xnp
) -> Bool[Array, ""] | Bool[np.ndarray, ""] | np.bool_:
    """True unless every eigenvalue of `matrix`, or of every matrix of a stack, has a
    negative real part.

    Eagerly (`numpy`) from the eigenvalues. Traced (`jax.numpy`) up to `LYAPUNOV_MAX` rows by
    Lyapunov's theorem — `H` is Hurwitz iff `Hᵀ P + P H = −I` has a symmetric positive
    definite solution — since a non-symmetric eigensolver is not available on every JAX
    backend; larger matrices from NumPy's eigenvalues through a host callback. A matrix that
    is block diagonal up to a permutation (the companion matrix of scalar or diagonal gains)
    is Hurwitz iff its blocks are: callers pass the stack of blocks (`uncoupled_companions`
    in `jaxdae/_gains.py`).
    """
    n = matrix.shape[-1]
    if matrix.size == 0:
        return xnp.asarray(False)
    if xnp is np:
        return np.any(_host_not_hurwitz(np.asarray(matrix)))
    if n > _thresholds.LYAPUNOV_MAX:
        stack = matrix.ndim - 2

        def host(matrices):  # under `vmap`, with the batch axes in front
            bad = _host_not_hurwitz(np.asarray(matrices))
            return np.any(bad.reshape(bad.shape[: bad.ndim - stack] + (-1,)), axis=-1)

        return jax.pure_callback(
            host, jax.ShapeDtypeStruct((), jnp.bool_), matrix, vmap_method="expand_dims"
        )
    return jnp.any(jax.vmap(_lyapunov_not_hurwitz)(matrix.reshape(-1, n, n)))


def _host_not_hurwitz(matrix: np.ndarray) -> np.ndarray | np.bool_:
    """`not_hurwitz` of each matrix of a NumPy stack, from the eigenvalues."""
    finite = np.all(np.isfinite(matrix), axis=(-2, -1))
    safe = np.where(finite[..., None, None], matrix, 0.0)
    return ~finite | (np.max(np.linalg.eigvals(safe).real, axis=-1) >= 0)


def _lyapunov_not_hurwitz(matrix: Float[Array, "d d"]) -> Bool[Array, ""]:
    n = matrix.shape[0]
    finite = jnp.all(jnp.isfinite(matrix))
    matrix = jnp.where(finite, matrix, 0.0)
    eye = jnp.eye(n, dtype=matrix.dtype)
    # vec(Hᵀ P + P H) = (I ⊗ Hᵀ + Hᵀ ⊗ I) vec(P) for row-major vec
    lyapunov = jnp.kron(matrix.T, eye) + jnp.kron(eye, matrix.T)
    solution = jnp.linalg.solve(lyapunov, -eye.reshape(-1)).reshape(n, n)
    sym = 0.5 * (solution + solution.T)
    ok = jnp.all(jnp.isfinite(sym))
    lowest = jnp.linalg.eigvalsh(jnp.where(ok, sym, 0.0))[0]
    residual = jnp.max(jnp.abs(matrix.T @ sym + sym @ matrix + eye))
    scale = 1.0 + 2.0 * jnp.max(jnp.abs(matrix)) * jnp.max(jnp.abs(sym)) * n
    tol = jnp.sqrt(jnp.finfo(matrix.dtype).eps) * scale
    return ~finite | ~ok | ~(lowest > 0) | ~(residual <= tol)
