"""The Jacobians of the stiff solvers (`Rodas5P`, `FusedChord`, `GeneralizedAlpha`): the columns of
`∂f/∂y` as tangents of one `jax.linearize`, compressed by a column colouring of the structural
sparsity."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._compilation._gather import take
from .._compilation._sparse import Pattern, SparseMatrix
from .._compilation._sparsity import column_colouring, nonzero_masks
from .._custom_types import Array, Float

JACOBIANS = ("coloured", "dense")


def check_jacobian(owner: str, jacobian: str) -> None:
    """Raises the `ValueError` of a `jacobian=` argument that is not one of `JACOBIANS`."""
    if jacobian not in JACOBIANS:
        raise ValueError(
            f'`{owner}(jacobian=...)` must be "coloured" (compressed by the '
            f'Jacobian\'s sparsity) or "dense"; got {jacobian!r}.'
        )


def column_seeds(
    f_of_y: Callable[[Array], Array], y: Float[Array, " n"], jacobian: str
) -> tuple[np.ndarray, Callable[[Array], Array]]:
    """The tangents in `y` that give `∂f/∂y` (`f_of_y` maps `y`, of shape `(n,)`, to
    `(n,)`), as `(seeds, expand)`: `seeds` of shape `(groups, n)`, one per column
    (`"dense"`) or per colour group of columns (`"coloured"`, the structural non-zeros found
    once, when traced, from `f_of_y`'s jaxpr: Curtis, Powell & Reid 1974), and `expand`,
    which turns the compressed Jacobian `(n, groups)` (column `g` holds `Σ_{j in g}
    ∂f/∂y_j`) into the `(n, n)` one."""
    n = y.size
    if jacobian == "coloured" and n:
        (mask,) = nonzero_masks(jax.jacfwd(f_of_y), y)
        mask = np.asarray(mask, bool).reshape(n, n)
        colours = column_colouring(mask)
        groups = int(colours.max()) + 1
        if groups < n:
            seeds = (colours[None, :] == np.arange(groups)[:, None]).astype(np.float64)
            return seeds, lambda compressed: jnp.where(mask, compressed[:, colours], 0)
    return np.eye(n), lambda compressed: compressed


def tangent_products(tangent: Callable, *directions: np.ndarray) -> Array:
    """`tangent` (a linearized function) applied to each of a batch of directions, stacked:
    `directions` holds one array per argument of `tangent`, each with the batch along its
    first axis. Applied one after the other up to `TANGENT_LOOP_MAX` directions (small
    products that XLA fuses), to all at once with `jax.vmap` beyond."""
    count = len(directions[0])
    if count <= _thresholds.TANGENT_LOOP_MAX:
        return jnp.stack([tangent(*(jnp.asarray(d[i]) for d in directions)) for i in range(count)])
    return jax.vmap(tangent)(*(jnp.asarray(d) for d in directions))


def linearization(f, t, y, jacobian: str):
    """`f(t, y)`, `∂f/∂y`, `∂f/∂t` and the number of tangents in `y` that gave `∂f/∂y`, from
    one `jax.linearize` of `f` and a batch of tangents: one per column of `∂f/∂y`
    (`"dense"`) or per colour group of its columns (`"coloured"`), and one in `t`."""
    f0, tangent = jax.linearize(f, t, y)
    seeds, expand = column_seeds(lambda x: f(t, x), y, jacobian)
    directions = np.concatenate([seeds, np.zeros((1, y.size))]).astype(y.dtype)
    in_t = np.zeros(len(directions), t.dtype)
    in_t[-1] = 1.0
    products = tangent_products(tangent, in_t, directions)  # (tangents, n)
    return f0, expand(products[:-1].T), products[-1], len(seeds)


def sparse_jacobian(f_of_y: Callable[[Array], Array], y: Float[Array, " n"]) -> SparseMatrix:
    """`∂f/∂y` (`f_of_y` maps `(n,)` to `(k,)`) on its structural pattern (found once, when
    traced, from `f_of_y`'s jaxpr) from one `jax.linearize` and one tangent per colour group
    of its columns (Curtis, Powell & Reid 1974), never as a dense matrix."""
    (mask,) = nonzero_masks(jax.jacfwd(f_of_y), y)
    size = jax.eval_shape(f_of_y, y).shape[0]
    pattern = Pattern.from_mask(np.asarray(mask, bool).reshape(size, y.size))
    if pattern.nnz == 0:
        return SparseMatrix(jnp.zeros((0,), y.dtype), pattern)
    colours = column_colouring(pattern.mask())
    seeds = (colours[None, :] == np.arange(int(colours.max()) + 1)[:, None]).astype(y.dtype)
    _, tangent = jax.linearize(f_of_y, y)
    products = tangent_products(tangent, seeds)  # (groups, k): row g holds Σ_{j in g} ∂f/∂y_j
    return SparseMatrix(
        take(products.reshape(-1), colours[pattern.cols] * size + pattern.rows), pattern
    )
