"""The mass matrix of a system as a solve uses it: factored once where its structure says
that it does not depend on the state, and checked positive definite block by block where
it is made of small blocks."""

import functools

import jax
import jax.numpy as jnp

from .._compilation._linalg import is_positive_definite
from .._compilation._operators import MassFactor, sparse_matrix
from .._compilation._sparse import SparseMatrix, blocks_positive_definite
from .._custom_types import Array, Bool, Float
from ._structure import terms_structure


def constant_mass_factor(system, t, q, v, terms=None) -> MassFactor | None:
    """`M⁻¹` of the system's mass matrix, factored at `(t, q, v)`, where its structure says
    that `M` does not depend on the state (`TermsStructure.mass_is_constant`), else `None`.

    A solve factors it once, before its loop, and hands it to every right-hand side
    ([`with_mass_factor`][]): only the parameters enter it, so its derivative is taken once
    per solve too. `terms(system, t, q, v)` computes the terms (default `system.terms`).
    """
    if jnp.ndim(q) != 1:
        return None
    structure = terms_structure(system, t, q, v)
    if structure is None or not structure.mass_is_constant:
        return None
    # `M` does not depend on the state: detached, a differentiated solve does not linearize
    # the other terms computed with it.
    t, q, v = (jax.lax.stop_gradient(x) for x in (t, q, v))
    at = (system.terms if terms is None else functools.partial(terms, system))(t, q, v)
    return MassFactor.factor(at.mass_matrix, sparse_matrix(at.mass_operator))


def is_mass_positive_definite(system, t, q, v, mass: Float[Array, "n n"]) -> Bool[Array, ""]:
    """Whether `mass`, the symmetric mass matrix of `system` at `(t, q, v)`, is positive
    definite: block by block where the system's structure ([`terms_structure`][]) finds it
    made of small diagonal blocks ([`blocks_positive_definite`][]), else by one dense
    Cholesky factorization ([`is_positive_definite`][]). `simulate` checks the initial mass
    matrix so, at a cost small against a solve's even for large models
    (docs/design_measurements.md#mass-check)."""
    if jnp.ndim(q) == 1:
        structure = terms_structure(system, t, q, v)
        if structure is not None:
            blocks = blocks_positive_definite(SparseMatrix.from_dense(mass, structure.mass))
            if blocks is not None:
                return blocks
    return is_positive_definite(mass)
