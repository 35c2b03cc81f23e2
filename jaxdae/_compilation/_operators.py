"""Matrices as lineax operators that carry the structure the solves follow.

The terms of the equations of motion (`ConstrainedTerms`) hold `M` and `G` as dense arrays,
and, where the system found more about them, as lineax operators whose type and tags say
what it found; the formulations choose their linear algebra from these.

- [`SparseOperator`][]: a [`SparseMatrix`][] (values on a static pattern) as a lineax
  operator. Products follow the pattern, and the solvers can read it ([`StructuredCholesky`][]
  factorizes a banded one by a banded factorization).
- [`state_independent_tag`][]: a lineax tag for a matrix that does not depend on the state
  `(t, q, v)`, only on the model's parameters (a constant mass matrix).
- [`FactoredOperator`][]: an operator together with a factorization of its inverse
  (an [`AbstractMassFactor`][]: [`MassFactor`][], dense or block by block), computed once
  per solve outside its loop for a state-independent `M`, or where a system computes its
  `M` (a tree's articulated-body factor).
"""

import abc
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

from .._custom_types import Array, Bool, Float
from ._sparse import SparseMatrix, block_inverse, cholesky_factor, cholesky_solve


class _Tag:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name


state_independent_tag = _Tag("state_independent_tag")
"""Tag of an operator that does not depend on the state `(t, q, v)` (only on parameters)."""


# Tags that imply symmetry, as for lineax's own operators.
_SYMMETRIC_TAGS = frozenset(
    {lx.symmetric_tag, lx.positive_semidefinite_tag, lx.negative_semidefinite_tag}
)


def _tag_set(tags: object) -> frozenset:
    if isinstance(tags, (frozenset, set, tuple, list)):
        return frozenset(tags)
    return frozenset([tags])


class SparseOperator(lx.AbstractLinearOperator):
    """A [`SparseMatrix`][] as a lineax operator.

    **Arguments:**

    - `matrix`: the matrix, its values on its static pattern.
    - `tags`: lineax tags (`lineax.symmetric_tag`, `lineax.positive_semidefinite_tag`, ...)
        or [`state_independent_tag`][]. Unchecked, as lineax's own; a symmetric tag needs a
        square matrix.
    """

    matrix: SparseMatrix
    tags: frozenset = eqx.field(static=True)

    def __init__(self, matrix: SparseMatrix, tags: object = ()):
        tags = _tag_set(tags)
        rows, cols = matrix.shape
        if rows != cols and tags & _SYMMETRIC_TAGS:
            raise ValueError(
                f"A symmetric `SparseOperator` needs a square matrix; got {matrix.shape}."
            )
        self.matrix = matrix
        self.tags = tags

    def mv(self, vector):
        return self.matrix.matvec(vector)

    def as_matrix(self):
        return self.matrix.dense()

    def transpose(self):
        if self.tags & _SYMMETRIC_TAGS:
            return self
        return SparseOperator(self.matrix.T, self.tags & {state_independent_tag})

    def in_structure(self):
        return jax.ShapeDtypeStruct((self.matrix.shape[1],), self.matrix.values.dtype)

    def out_structure(self):
        return jax.ShapeDtypeStruct((self.matrix.shape[0],), self.matrix.values.dtype)


class AbstractMassFactor(eqx.Module):
    """`M⁻¹` of a symmetric positive definite matrix, factored once and applied to many
    right-hand sides with `solve`. `inverse` is `M⁻¹` on `M`'s diagonal blocks where the
    factor holds it so (the sparse products of the multiplier solves read it), else
    `None`."""

    inverse: eqx.AbstractVar[SparseMatrix | None]

    @abc.abstractmethod
    def solve(self, rhs: Float[Array, "n k"]) -> Float[Array, "n k"]:
        """`M⁻¹ rhs` (dense)."""

    def positive_definite(self) -> Bool[Array, ""] | None:
        """Whether `M` is symmetric positive definite, where the factor shows it from what it
        holds (a factorization's pivots); `None` where it does not, and the dense matrix is
        tested instead (`simulate`'s check of the initial mass matrix)."""
        return None


class MassFactor(AbstractMassFactor):
    """`M⁻¹` of a symmetric positive definite matrix, factored once and applied to many
    right-hand sides: `jaxdae.simulate` factors a state-independent mass matrix so, once per
    solve, and every evaluation of the right-hand side applies it.

    **Fields:**

    - `inverse`: `M⁻¹` on `M`'s diagonal blocks ([`block_inverse`][]), or `None`.
    - `cholesky`: else the lower Cholesky factor of `M`, dense `(n, n)`.
    """

    inverse: SparseMatrix | None
    cholesky: Array | None

    @classmethod
    def factor(cls, mass: Float[Array, "n n"], sparse: SparseMatrix | None = None) -> "MassFactor":
        """The factor of `mass` (its values on their pattern as `sparse`, where known): block
        by block where its blocks are small, else one dense Cholesky factorization."""
        inverse = None if sparse is None else block_inverse(sparse)
        if inverse is not None:
            return cls(inverse, None)
        return cls(None, cholesky_factor(0.5 * (mass + mass.T)))

    def positive_definite(self) -> Bool[Array, ""] | None:
        """Whether `M` is positive definite, from the Cholesky factor's diagonal: a pivot
        that is not positive makes its square root `nan` or zero, and every later entry
        non-finite. `None` for a factor block by block (`inverse`), whose small inverses
        are finite whatever the blocks' signs."""
        if self.cholesky is None:
            return None
        return jnp.all(jnp.diagonal(self.cholesky) > 0)

    def solve(self, rhs: Float[Array, "n k"]) -> Float[Array, "n k"]:
        """`M⁻¹ rhs` (dense)."""
        if self.inverse is not None:
            return jax.vmap(self.inverse.matvec, in_axes=1, out_axes=1)(rhs)
        return cholesky_solve(self.cholesky, rhs)


class FactoredOperator(lx.AbstractLinearOperator):
    """A symmetric positive definite operator with its inverse factored ahead of use:
    products go through `operator`, solves use `factor`. A state-independent `M` is
    factored so once per solve (its `operator` tagged [`state_independent_tag`][]); a
    system that factors its own `M` where it computes it (a tree's, in joint coordinates)
    hands it on so, so that the formulations' solves use that factor.

    **Arguments:**

    - `operator`: the operator.
    - `factor`: the [`AbstractMassFactor`][] of the same matrix.
    """

    operator: lx.AbstractLinearOperator
    factor: AbstractMassFactor

    def mv(self, vector):
        return self.operator.mv(vector)

    def as_matrix(self):
        return self.operator.as_matrix()

    def transpose(self):
        return self

    def in_structure(self):
        return self.operator.in_structure()

    def out_structure(self):
        return self.operator.out_structure()

    @property
    def tags(self) -> frozenset:
        return frozenset({lx.symmetric_tag, lx.positive_semidefinite_tag}) | (
            _tag_set(self.operator.tags) & {state_independent_tag}
        )


@functools.singledispatch
def is_state_independent(operator: lx.AbstractLinearOperator) -> bool:
    """Whether `operator` does not depend on the state `(t, q, v)`: tagged
    [`state_independent_tag`][] (a [`FactoredOperator`][] of such an operator included).
    Asked as lineax asks its own structural questions (`lineax.is_symmetric`, ...)."""
    del operator
    return False


def sparse_matrix(operator: lx.AbstractLinearOperator | None) -> SparseMatrix | None:
    """The [`SparseMatrix`][] behind `operator` (a [`SparseOperator`][], or one that a
    [`FactoredOperator`][] wraps), else `None`."""
    if isinstance(operator, FactoredOperator):
        operator = operator.operator
    return operator.matrix if isinstance(operator, SparseOperator) else None


def factor_of(operator: lx.AbstractLinearOperator | None) -> AbstractMassFactor | None:
    """The factor a [`FactoredOperator`][] carries, else `None`."""
    return operator.factor if isinstance(operator, FactoredOperator) else None


def _itself(operator):
    return operator


def _diagonal(operator):
    return jnp.diagonal(operator.as_matrix())


def _tridiagonal(operator):
    matrix = operator.as_matrix()
    return jnp.diagonal(matrix, -1), jnp.diagonal(matrix), jnp.diagonal(matrix, 1)


def _has_tag(tag):
    return lambda operator: tag in operator.tags


def _pattern_is(test):
    def query(operator):
        matrix = sparse_matrix(operator)
        return matrix is not None and bool(test(matrix.pattern))

    return query


# lineax asks every operator these questions through `functools.singledispatch`; the
# values are real, so `conj` is the operator itself.
_ANSWERS = {
    lx.linearise: _itself,
    lx.materialise: _itself,
    lx.conj: _itself,
    lx.diagonal: _diagonal,
    lx.tridiagonal: _tridiagonal,
    lx.is_symmetric: lambda operator: bool(operator.tags & _SYMMETRIC_TAGS),
    lx.is_positive_semidefinite: _has_tag(lx.positive_semidefinite_tag),
    lx.is_negative_semidefinite: _has_tag(lx.negative_semidefinite_tag),
    lx.has_unit_diagonal: _has_tag(lx.unit_diagonal_tag),
    lx.is_diagonal: _pattern_is(lambda p: p.is_diagonal),
    lx.is_tridiagonal: _pattern_is(lambda p: abs(p.rows - p.cols).max(initial=0) <= 1),
    lx.is_lower_triangular: _pattern_is(lambda p: (p.rows >= p.cols).all()),
    lx.is_upper_triangular: _pattern_is(lambda p: (p.rows <= p.cols).all()),
    is_state_independent: _has_tag(state_independent_tag),
}
for _operator_type in (SparseOperator, FactoredOperator):
    for _query, _answer in _ANSWERS.items():
        _query.register(_operator_type)(_answer)
is_state_independent.register(lx.MatrixLinearOperator)(_has_tag(state_independent_tag))
