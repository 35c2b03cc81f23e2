"""The structure of a system's derived terms, found from the user's functions while tracing.

For a [`jaxdae.LagrangianSystem`][] with more than `STRUCTURED_MIN` coordinates,
[`terms_structure`][] finds, from the jaxprs of the user's `kinetic_energy` (or
`mass_matrix`), `constraints` and `velocity_constraints`:

- the sparsity pattern of the mass matrix `M = ∂²T/∂v²` and whether it depends on `(t, q, v)`
  at all (a constant mass matrix);
- the sparsity pattern of the stacked constraint Jacobian `G = [Φ_q; Ψ_v]`;
- column colourings of both, so that `terms` derives them with one directional derivative
  per colour (a banded `J` needs about its bandwidth's number, whatever `n`) instead of one
  per coordinate.

The patterns come from a structural analysis of the jaxprs ([`nonzero_masks`][]): an entry
left out is zero for every state and every parameter value, not only where it was traced.
Everything here runs once per model type and shape (cached) and yields static data; the
terms then carry it as [`SparseMatrix`][] values, and the formulations' linear algebra
follows the patterns.

The mass matrix as a solve uses it follows from its structure too: factored once where
it does not depend on the state ([`constant_mass_factor`][]), and checked positive
definite block by block where it is made of small blocks
([`is_mass_positive_definite`][]).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .. import _thresholds
from .._compilation._linalg import is_positive_definite
from .._compilation._operators import (
    FactoredOperator,
    MassFactor,
    sparse_matrix,
    state_independent_tag,
)
from .._compilation._sparse import Pattern, SparseMatrix, blocks_positive_definite
from .._compilation._sparsity import column_colouring, nonzero_masks
from .._custom_types import Array, Bool, Float


class TermsStructure(eqx.Module):
    """What is known about the terms of one model at one size (all static).

    **Fields:**

    - `mass`: pattern of `M`, `(n, n)`, symmetric.
    - `mass_is_constant`: `M` does not depend on `t`, `q` or `v` (only on the parameters).
    - `jacobian`: pattern of `G = [Φ_q; Ψ_v]`, `(m + k, n)`.
    - `velocity_colours`: colour of each column for the tangents in `v`, `(n,)`: no two
        columns of a colour share a row of `[M; Ψ_v]`.
    - `position_colours`: the same for the tangents in `q` and `Φ_q`.
    """

    mass: Pattern = eqx.field(static=True)
    mass_is_constant: bool = eqx.field(static=True)
    jacobian: Pattern = eqx.field(static=True)
    velocity_colours: tuple[int, ...] = eqx.field(static=True)
    position_colours: tuple[int, ...] = eqx.field(static=True)

    @property
    def num_velocity_colours(self) -> int:
        return max(self.velocity_colours, default=-1) + 1

    @property
    def num_position_colours(self) -> int:
        return max(self.position_colours, default=-1) + 1


def _key(system, t, q, v):
    params, static = eqx.partition(system, eqx.is_array)
    leaves = tuple((x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(params))
    shapes = tuple((jnp.shape(x), str(jnp.result_type(x))) for x in (t, q, v))
    key = (type(system), jax.tree_util.tree_structure(params), static, leaves, shapes)
    try:
        hash(key)
    except TypeError:  # a static field that is not hashable: analyse every time
        return None
    return key


def terms_structure(system, t, q, v) -> TermsStructure | None:
    """The [`TermsStructure`][] of a `LagrangianSystem` at the shapes of `(t, q, v)`, or
    `None` where the dense derivation is used: systems of at most `STRUCTURED_MIN`
    coordinates, unless the class sets `structured_terms` (`True`: always structured,
    `False`: always dense)."""
    choice = system.structured_terms
    if choice is False or (choice is None and q.shape[0] <= _thresholds.STRUCTURED_MIN):
        return None
    key = _key(system, t, q, v)
    if key is None:
        return _analyse(system, t, q, v)
    return _cached(key, system, t, q, v)


_CACHE: dict = {}


def _cached(key, system, t, q, v):
    if key not in _CACHE:
        if len(_CACHE) > 128:
            _CACHE.clear()
        _CACHE[key] = _analyse(system, t, q, v)
    return _CACHE[key]


def model_defines(system, name: str, base: type | None = None) -> bool:
    """Whether the model class of `system` writes the method `name` itself rather than
    inheriting the default of `base` (`LagrangianSystem` or `HamiltonianSystem`; None: the
    class that declares `name` first, e.g. `LagrangianSystem` for `mass_matrix`).

    This is jaxdae's one test of what a subclass overrides, kept because the public
    contract of [`jaxdae.LagrangianSystem`][] asks for it: a model writes
    `kinetic_energy` **or** `mass_matrix` without declaring which, and each default is
    derived from the other, so only the class can say which one is the model's (the terms
    differentiate that one; differentiating the default would derive it twice). The same
    test leaves `energy` and `momenta` to a model that writes its own, and limits the
    checks of a model's outputs to the functions it writes."""
    return _defines(type(system), name, base)


@functools.cache
def _defines(cls: type, name: str, base: type | None) -> bool:
    mro = cls.__mro__
    if base is None:
        base = next(c for c in reversed(mro) if name in vars(c))
    return any(name in vars(c) for c in mro if issubclass(c, base) and c is not base)


def _avals(tree):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree
    )


def _analyse(system, t, q, v) -> TermsStructure:

    params, static = eqx.partition(system, eqx.is_array)
    n = q.shape[0]
    mass_given = model_defines(system, "mass_matrix")

    def model(p):
        return eqx.combine(p, static)

    def mass(p, t_, q_, v_):
        s = model(p)
        if mass_given:
            return s.mass_matrix(t_, q_)
        return jax.hessian(s.kinetic_energy, argnums=2)(t_, q_, v_)

    def mass_rate(p, t_, q_, v_):
        return jax.jvp(
            lambda a, b, c: mass(p, a, b, c),
            (t_, q_, v_),
            (jnp.ones_like(t_), jnp.ones_like(q_), jnp.ones_like(v_)),
        )[1]

    def jacobians(p, t_, q_, v_):
        s = model(p)
        phi_q = jax.jacfwd(s.constraints, argnums=1)(t_, q_)
        psi_v = jax.jacfwd(s.velocity_constraints, argnums=2)(t_, q_, v_)
        return phi_q.reshape(-1, n), psi_v.reshape(-1, n)

    args = _avals((params, t, q, v))
    (mass_mask,) = nonzero_masks(mass, *args)
    (rate_mask,) = nonzero_masks(mass_rate, *args)
    phi_mask, psi_mask = nonzero_masks(jacobians, *args)
    mass_mask = mass_mask.reshape(n, n)
    mass_mask = mass_mask | mass_mask.T | np.eye(n, dtype=bool)
    velocity_rows = psi_mask if mass_given else np.concatenate([mass_mask, psi_mask])
    return TermsStructure(
        mass=Pattern.from_mask(mass_mask),
        mass_is_constant=not bool(rate_mask.any()),
        jacobian=Pattern.from_mask(np.concatenate([phi_mask, psi_mask])),
        velocity_colours=tuple(int(c) for c in column_colouring(velocity_rows)),
        position_colours=tuple(int(c) for c in column_colouring(phi_mask)),
    )


def with_mass_factor(terms, factor: MassFactor | None):
    """`terms` (a `ConstrainedTerms`) whose mass operator carries `factor`
    ([`constant_mass_factor`][]) as a `FactoredOperator`; unchanged where `factor` is
    `None`."""
    if factor is None:
        return terms
    operator = terms.mass_operator
    if operator is None:
        operator = lx.MatrixLinearOperator(
            terms.mass_matrix, (lx.positive_semidefinite_tag, state_independent_tag)
        )
    return eqx.tree_at(
        lambda x: x.mass_operator,
        terms,
        FactoredOperator(operator, factor),
        is_leaf=lambda x: x is None,
    )


@functools.lru_cache(maxsize=64)
def colour_matrix(colours: tuple[int, ...]) -> np.ndarray:
    """`S[c, j] = 1` where column `j` has colour `c`: the seed directions, `(k, n)`."""
    colours = np.asarray(colours, np.int64)
    k = int(colours.max(initial=-1)) + 1
    return (np.arange(k)[:, None] == colours[None, :]).astype(np.float64)


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
