"""Parametrizations: unconstrained parameters that map to positive / SPD gains.

Gradient descent on a raw gain can leave the set where the formulation is stable
(Mukharlyamov and Deressa (2015), eq. [18]: `K_D ≻ 0`, `K_P ≻ 0`; `𝔄 ≻ 0` for eqs. [22]–[30]). A
parametrization stores an unconstrained array and returns a gain that is positive definite by
construction, so every optimizer step gives a valid formulation. Put one in place of a gain with
[`jaxdae.parametrize`][] and turn a tree of parametrizations back into gains with
[`jaxdae.unwrap`][].
"""

import abc
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float, PyTree


def _softplus_inverse(y):
    # log(exp(y) - 1), stable for large y.
    return y + jnp.log(-jnp.expm1(-y))


def _as_float(value) -> Array:
    array = jnp.asarray(value)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.result_type(float))
    return array


class AbstractParametrization(eqx.Module):
    """A value computed from unconstrained parameters (the leaves an optimizer updates).

    Subclasses implement `value()`. [`jaxdae.unwrap`][] replaces every parametrization in a
    PyTree by its `value()`.
    """

    @abc.abstractmethod
    def value(self) -> Array:
        """The constrained value (e.g. a positive definite gain)."""


class Positive(AbstractParametrization):
    """Elementwise positive values `minimum + softplus(raw)` (or `minimum + exp(raw)`): a
    positive scalar gain, or a positive diagonal gain given as a vector (one per constraint).

    **Arguments:**

    - `value`: the initial positive value (scalar or vector); stored as `raw` with
        `value = minimum + softplus(raw)`.
    - `minimum`: a lower bound, `>= 0` (default 0), e.g. to keep a gain away from zero.
    - `log_scale`: use `exp` instead of `softplus`: an optimizer step then changes the gain
        by a relative amount, which suits gains spanning decades (`K_P` from 10 to 2500).

    **Raises:**

    `ValueError` if `value` is not a scalar or a vector, or not `> minimum`.
    """

    raw: Float[Array, "*c"]
    minimum: float = eqx.field(static=True, default=0.0)
    log_scale: bool = eqx.field(static=True, default=False)

    def __init__(self, value: ArrayLike, minimum: float = 0.0, log_scale: bool = False):
        value = _as_float(value)
        if value.ndim > 1:
            raise ValueError(
                f"`Positive` takes a scalar or a vector (a diagonal gain); got shape "
                f"{value.shape}. Use `PositiveDefinite` for a full matrix."
            )
        if minimum < 0:
            raise ValueError(f"`minimum` must be >= 0; got {minimum}.")
        if not bool(jnp.all(value > minimum)):
            raise ValueError(f"`Positive` needs values > minimum = {minimum}; got {value}.")
        self.minimum = float(minimum)
        self.log_scale = bool(log_scale)
        self.raw = jnp.log(value - minimum) if log_scale else _softplus_inverse(value - minimum)

    def value(self):
        positive = jnp.exp(self.raw) if self.log_scale else jax.nn.softplus(self.raw)
        return self.minimum + positive


class PositiveDefinite(AbstractParametrization):
    """A symmetric positive definite matrix `L Lᵀ + minimum·I` from a Cholesky factor `L`
    (lower triangular, diagonal `softplus(raw)`), e.g. a full `K_D`, `K_P` or LQR weight.

    **Arguments:**

    - `value`: the initial SPD matrix (a vector or scalar is read as a diagonal matrix;
        a scalar needs `size`).
    - `minimum`: `>= 0`, added to the diagonal: eigenvalues stay `>= minimum`.
    - `size`: the matrix size when `value` is a scalar.

    **Raises:**

    `ValueError` if `value` is not square, or `value − minimum·I` is not SPD.
    """

    lower: Float[Array, "c c"]
    raw_diagonal: Float[Array, " c"]
    minimum: float = eqx.field(static=True, default=0.0)

    def __init__(self, value: ArrayLike, minimum: float = 0.0, size: int | None = None):
        value = _as_float(value)
        if value.ndim == 0:
            if size is None:
                raise ValueError("`PositiveDefinite` of a scalar needs `size=`.")
            value = value * jnp.eye(size, dtype=value.dtype)
        elif value.ndim == 1:
            value = jnp.diag(value)
        if value.ndim != 2 or value.shape[0] != value.shape[1]:
            raise ValueError(f"`PositiveDefinite` takes a square matrix; got shape {value.shape}.")
        if minimum < 0:
            raise ValueError(f"`minimum` must be >= 0; got {minimum}.")
        eye = jnp.eye(value.shape[0], dtype=value.dtype)
        factor = jnp.linalg.cholesky(0.5 * (value + value.T) - minimum * eye)
        if not bool(jnp.all(jnp.isfinite(factor))):
            raise ValueError(
                f"`PositiveDefinite` needs a symmetric matrix with eigenvalues > minimum = "
                f"{minimum}; got eigenvalues {jnp.linalg.eigvalsh(0.5 * (value + value.T))}."
            )
        self.minimum = float(minimum)
        self.lower = jnp.tril(factor, -1)
        self.raw_diagonal = _softplus_inverse(jnp.diag(factor))

    def value(self):
        size = self.raw_diagonal.shape[0]
        factor = jnp.tril(self.lower, -1) + jnp.diag(jax.nn.softplus(self.raw_diagonal))
        eye = jnp.eye(size, dtype=factor.dtype)
        return factor @ factor.T + self.minimum * eye


def _is_parametrization(x) -> bool:
    return isinstance(x, AbstractParametrization)


def unwrap(tree: PyTree) -> PyTree:
    """Replaces every [`jaxdae.AbstractParametrization`][] in `tree` by its `value()`.

    **Arguments:**

    - `tree`: any PyTree, e.g. a formulation whose gains were replaced by
        [`jaxdae.parametrize`][].

    **Returns:**

    The same tree with plain arrays in place of the parametrizations.
    """
    return jax.tree.map(
        lambda x: x.value() if _is_parametrization(x) else x, tree, is_leaf=_is_parametrization
    )


def parametrize(
    tree: PyTree,
    where: Callable[[PyTree], Sequence[Array]],
    parametrization: type[AbstractParametrization]
    | Callable[[Array], AbstractParametrization]
    | Sequence[Callable[[Array], AbstractParametrization]] = Positive,
) -> PyTree:
    """Replaces the gains selected by `where` with parametrizations of their current values.

    ```python
    params = jaxdae.parametrize(
        jaxdae.ModifiedLagrange(10.0, kd=[20.0, 10.0], kp=[100.0, 25.0]),
        lambda f: (f.alpha, f.kd, f.kp),
        jaxdae.Positive,
    )
    formulation = jaxdae.unwrap(params)  # a ModifiedLagrange again
    ```

    **Arguments:**

    - `tree`: a formulation, controller or any PyTree of them.
    - `where`: selects the leaves to parametrize, as for `eqx.tree_at` (a sequence of
        leaves, or one leaf).
    - `parametrization`: called on each selected value, e.g. [`jaxdae.Positive`][]
        (default; scalars and diagonal gains) or [`jaxdae.PositiveDefinite`][] (full SPD
        matrices); or a sequence of them, one per selected leaf.

    **Returns:**

    `tree` with the selected leaves replaced (use [`jaxdae.unwrap`][] to get gains back).
    The construction-time checks of the formulation are not rerun; `simulate` checks the
    unwrapped gains.
    """
    nodes = where(tree)
    single = not isinstance(nodes, (tuple, list))
    nodes_seq = (nodes,) if single else tuple(nodes)
    if isinstance(parametrization, (tuple, list)):
        if len(parametrization) != len(nodes_seq):
            raise ValueError(
                f"`parametrization` has {len(parametrization)} entries but `where` selects "
                f"{len(nodes_seq)} leaves; pass one per leaf or a single one."
            )
        makers = tuple(parametrization)
    else:
        makers = (parametrization,) * len(nodes_seq)
    replaced = tuple(make(node) for make, node in zip(makers, nodes_seq, strict=False))
    return eqx.tree_at(where, tree, replace=replaced[0] if single else replaced)
