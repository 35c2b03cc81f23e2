"""The lineax solvers of the constraint solves (`jaxdae/_compilation/_linear_solvers.py`)
against lineax's own, and the structured formulations against the dense ones."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import jaxdae
from jaxdae import _thresholds
from jaxdae._compilation import _banded, _sparse
from jaxdae._compilation._jaxlib import LAPACK_BATCHES_CAN_DEADLOCK
from jaxdae._compilation._linear_solvers import (
    PositiveSemidefinitePseudoInverse,
    StructuredCholesky,
    symmetric_solve,
)
from jaxdae._compilation._operators import (
    FactoredOperator,
    MassFactor,
    SparseOperator,
    factor_of,
    is_state_independent,
    sparse_matrix,
    state_independent_tag,
)
from jaxdae._compilation._sparse import Pattern, SparseMatrix
from jaxdae._formulations._multipliers import multiplier_solve
from jaxdae._systems._system import ConstrainedTerms
from jaxdae._thresholds import UNROLL_MAX
from jaxdae.examples._scaling import CartesianChain

PSD = lx.positive_semidefinite_tag


def _spd(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


def _operator(matrix):
    return lx.MatrixLinearOperator(jnp.asarray(matrix), PSD)


def _solve(solver, matrix, rhs):
    return lx.linear_solve(lx.MatrixLinearOperator(matrix, PSD), rhs, solver).value


@pytest.mark.parametrize(
    "n",
    [
        1,
        pytest.param(2, marks=pytest.mark.slow),
        pytest.param(3, marks=pytest.mark.slow),
        UNROLL_MAX,
        UNROLL_MAX + 1,
        20,
    ],
)
def test_positive_definite_matches_lineax_cholesky(n):
    """Values, gradients (through `lineax.linear_solve`, w.r.t. matrix and right-hand side)
    and `vmap` against `lineax.Cholesky`, on either side of `UNROLL_MAX`; the pivots multiply
    to the determinant."""
    a, b = jnp.asarray(_spd(n, n)), jnp.asarray(np.random.default_rng(n).standard_normal(n))
    batch = jnp.stack([b, 2 * b, -b])

    def loss(solver):
        return lambda a, b: jnp.sum(jnp.sin(_solve(solver, a, b)))

    # Every quantity of a size in one compiled program (a program each compiles far longer).
    @jax.jit
    def compared(a, b, batch):
        ours, theirs = StructuredCholesky(), lx.Cholesky()
        return {
            "expected": _solve(theirs, a, b),
            "solved": _solve(ours, a, b),
            "direct": symmetric_solve(_operator(a), b, ours),
            "ours": jax.grad(loss(ours), argnums=(0, 1))(a, b),
            "theirs": jax.grad(loss(theirs), argnums=(0, 1))(a, b),
            "batched": jax.vmap(lambda c: _solve(ours, a, c))(batch),
            "batched_lx": jax.vmap(lambda c: _solve(theirs, a, c))(batch),
            "pivots": ours.init(_operator(a), {}).pivots,
        }

    out = compared(a, b, batch)
    expected = out["expected"]
    np.testing.assert_allclose(out["solved"], expected, rtol=1e-12)
    np.testing.assert_allclose(out["direct"], expected, rtol=1e-12)
    for x, y in zip(out["ours"], out["theirs"], strict=False):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["batched"], out["batched_lx"], rtol=1e-12)
    np.testing.assert_allclose(np.prod(out["pivots"]), np.linalg.det(np.asarray(a)), rtol=1e-10)


@pytest.mark.parametrize("n", [3, UNROLL_MAX + 1])
def test_direct_gradient_matches_lineax(n):
    """Applied directly (`symmetric_solve`), JAX differentiates the factorization itself; its
    gradient is lineax's along symmetric perturbations (the factorization reads one
    triangle)."""
    a, b = jnp.asarray(_spd(n, 7)), jnp.arange(1.0, n + 1.0)
    direction = jnp.asarray(np.random.default_rng(1).standard_normal((n, n)))
    direction = direction + direction.T

    # The four derivatives in one compiled program (a program each compiles far longer).
    def along(solve):
        return jax.jvp(lambda s: jnp.sum(jnp.sin(solve(a + s * direction, b))), (0.0,), (1.0,))[1]

    @jax.jit
    def derivatives():
        return (
            along(lambda m, c: symmetric_solve(_operator(m), c, StructuredCholesky())),
            along(lambda m, c: _solve(lx.Cholesky(), m, c)),
            jax.grad(
                lambda c: jnp.sum(jnp.sin(symmetric_solve(_operator(a), c, StructuredCholesky())))
            )(b),
            jax.grad(lambda c: jnp.sum(jnp.sin(_solve(lx.Cholesky(), a, c))))(b),
        )

    ours, theirs, grad, grad_lx = derivatives()
    np.testing.assert_allclose(ours, theirs, rtol=1e-10)
    np.testing.assert_allclose(grad, grad_lx, rtol=1e-10)


@pytest.mark.parametrize("n", [2, 5, UNROLL_MAX + 2])
def test_positive_definite_of_indefinite_matrix(n):
    """A matrix that is not positive definite: non-finite values (no error with
    `throw=False`), and a pivot that is not positive."""
    a = _spd(n, 3)
    w, v = np.linalg.eigh(a)
    a = (v * np.concatenate([[-1.0], w[1:]])) @ v.T
    # the solve and the factorization in one program (eagerly, each operation compiles alone)
    x, pivots = jax.jit(
        lambda m: (
            symmetric_solve(_operator(m), jnp.ones(n), StructuredCholesky()),
            StructuredCholesky().init(_operator(m), {}).pivots,
        )
    )(jnp.asarray(a))
    assert not np.all(np.isfinite(x))
    assert not np.all(pivots > 0)


def _banded_matrix(size, band, seed):
    rng = np.random.default_rng(seed)
    mask = np.abs(np.arange(size)[:, None] - np.arange(size)[None]) <= band
    permutation = rng.permutation(size)  # scrambled: found again by reordering
    mask = mask[permutation][:, permutation]
    noise = rng.standard_normal((size, size)) * mask
    matrix = (0.3 * (noise + noise.T) + 5 * np.eye(size)) * mask
    return SparseMatrix.from_dense(jnp.asarray(matrix), Pattern.from_mask(mask))


@pytest.mark.slow
def test_banded_operator_matches_lineax_cholesky():
    """A banded `SparseOperator` is factorized by the banded block LDLᵀ factorization; values,
    gradients w.r.t. its values and the right-hand side, and `vmap` equal `lineax.Cholesky`
    on the dense matrix."""
    sparse = _banded_matrix(40, 2, 0)
    operator = SparseOperator(sparse, PSD)
    state = StructuredCholesky().init(operator, {})
    assert state.plan is not None
    b = jnp.asarray(np.random.default_rng(2).standard_normal(40))
    dense = sparse.dense()
    np.testing.assert_allclose(np.prod(state.pivots), np.linalg.det(np.asarray(dense)), rtol=1e-9)

    def banded(values, c):
        op = SparseOperator(SparseMatrix(values, sparse.pattern), PSD)
        return jnp.sum(jnp.sin(lx.linear_solve(op, c, StructuredCholesky()).value))

    def reference(values, c):
        return jnp.sum(
            jnp.sin(_solve(lx.Cholesky(), SparseMatrix(values, sparse.pattern).dense(), c))
        )

    np.testing.assert_allclose(banded(sparse.values, b), reference(sparse.values, b), rtol=1e-12)
    ours = jax.grad(banded, argnums=(0, 1))(sparse.values, b)
    theirs = jax.grad(reference, argnums=(0, 1))(sparse.values, b)
    for x, y in zip(ours, theirs, strict=False):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
    values = jnp.stack([sparse.values, 2 * sparse.values])
    np.testing.assert_allclose(
        jax.vmap(banded, in_axes=(0, None))(values, b),
        jax.vmap(reference, in_axes=(0, None))(values, b),
        rtol=1e-12,
    )
    direct = symmetric_solve(operator, b, StructuredCholesky())
    np.testing.assert_allclose(direct, np.linalg.solve(np.asarray(dense), b), rtol=1e-10)


def _rank_deficient(n, rank, seed):
    a = np.random.default_rng(seed).standard_normal((n, rank))
    return a @ a.T


@pytest.mark.slow
@pytest.mark.parametrize(
    "n, rank", [(1, 1), (1, 0), (2, 2), (2, 1), (3, 2), (5, 3), (5, 5), (4, 0), (12, 7)]
)
def test_pseudo_inverse_matches_lineax_svd(n, rank):
    """Values against `lineax.SVD(rcond)` on random full-rank and rank-deficient positive
    semidefinite matrices, `vmap`, and gradients through `lineax.linear_solve`."""
    rcond = 1e-8
    a = jnp.asarray(_rank_deficient(n, rank, 10 * n + rank))
    b = jnp.asarray(np.random.default_rng(n).standard_normal(n))
    solver = PositiveSemidefinitePseudoInverse(rcond)
    expected = _solve(lx.SVD(rcond=rcond), a, b)
    np.testing.assert_allclose(_solve(solver, a, b), expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        symmetric_solve(_operator(a), b, solver), expected, rtol=1e-9, atol=1e-12
    )
    batch = jnp.stack([b, -3 * b])
    np.testing.assert_allclose(
        jax.vmap(lambda c: _solve(solver, a, c))(batch),
        jax.vmap(lambda c: _solve(lx.SVD(rcond=rcond), a, c))(batch),
        rtol=1e-9,
        atol=1e-12,
    )
    # gradients w.r.t. the right-hand side (any rank) and the matrix (lineax's rule)
    grad = jax.grad(lambda m, c: jnp.sum(jnp.sin(_solve(solver, m, c))), argnums=(0, 1))
    grad_lx = jax.grad(
        lambda m, c: jnp.sum(jnp.sin(_solve(lx.SVD(rcond=rcond), m, c))), argnums=(0, 1)
    )
    for x, y in zip(grad(a, b), grad_lx(a, b), strict=False):
        np.testing.assert_allclose(x, y, rtol=1e-7, atol=1e-9)


@pytest.mark.usefixtures("on_cpu")
def test_vmapped_pseudo_inverse_lapack_calls_run_in_sequence():
    """Under `vmap` (a solve's saved states, an ensemble) the rank-deficient branch stays
    batched loops: the program's LAPACK calls are the full-rank branch's factorization and
    its two substitutions, each waiting for the one before. Two batched LAPACK calls that
    run at once on XLA:CPU's thread pool each wait for pool threads the other holds (jaxlib
    splits a batched call over that pool): on 2 cores a vmapped solve can hang that way.
    With such a jaxlib the full-rank branch is batched loops on the CPU too, no LAPACK."""
    solver = PositiveSemidefinitePseudoInverse(1e-8)
    a = jnp.asarray(_rank_deficient(12, 7, 3))
    matrices = jnp.stack([a, a + 0.1 * jnp.eye(12)])
    b = jnp.asarray(np.random.default_rng(4).standard_normal(12))
    solve = jax.jit(jax.vmap(lambda m: _solve(solver, m, b))).lower(matrices).compile()
    calls = re.findall(r'custom_call_target="(lapack_\w+)"', solve.as_text())
    lapack = ["lapack_dpotrf_ffi"] + ["lapack_dtrsm_ffi"] * 2
    deadlocks = LAPACK_BATCHES_CAN_DEADLOCK
    assert sorted(calls) == ([] if deadlocks else lapack), calls
    # The program inspected is the one run (`jax.jit` would compile it again).
    np.testing.assert_allclose(
        solve(matrices)[0], _solve(lx.SVD(rcond=1e-8), a, b), rtol=1e-9, atol=1e-12
    )


def test_pseudo_inverse_direct_gradient_of_full_rank_pair():
    """For a 2 × 2 matrix the closed form is differentiated directly; for a full-rank one
    its gradient is that of the inverse."""
    a, b = jnp.asarray(_spd(2, 4)), jnp.array([0.3, -1.2])
    solver = PositiveSemidefinitePseudoInverse()
    # both gradients in one program (eagerly, each operation compiles alone)
    grad, grad_lx = jax.jit(
        lambda m: (
            jax.grad(lambda m: jnp.sum(symmetric_solve(_operator(m), b, solver) ** 2))(m),
            jax.grad(lambda m: jnp.sum(_solve(lx.Cholesky(), m, b) ** 2))(m),
        )
    )(a)
    sym = lambda g: 0.5 * (g + g.T)  # noqa: E731 - the closed form reads the mean off-diagonal
    np.testing.assert_allclose(sym(grad), sym(grad_lx), rtol=1e-10)


def test_structure_carrying_operators_in_lineax():
    """`SparseOperator` and `FactoredOperator` answer lineax's structural questions from
    their tags and pattern, and products and solves with them match their dense matrices."""
    rng = np.random.default_rng(3)
    dense_g = rng.standard_normal((4, 6)) * (rng.random((4, 6)) < 0.5)
    g = SparseOperator(
        SparseMatrix.from_dense(jnp.asarray(dense_g), Pattern.from_mask(dense_g != 0))
    )
    x = rng.standard_normal(6)
    np.testing.assert_allclose(g.mv(jnp.asarray(x)), dense_g @ x, atol=1e-14)
    np.testing.assert_allclose(g.T.as_matrix(), dense_g.T)
    assert not lx.is_symmetric(g) and not is_state_independent(g)
    with pytest.raises(ValueError, match="square matrix"):
        SparseOperator(g.matrix, PSD)

    blocks = [_spd(2, seed) for seed in range(3)]
    dense_m = np.zeros((6, 6))
    for k, block in enumerate(blocks):
        dense_m[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = block
    mass = SparseOperator(
        SparseMatrix.from_dense(jnp.asarray(dense_m), Pattern.from_mask(dense_m != 0)),
        (PSD, state_independent_tag),
    )
    assert lx.is_symmetric(mass) and lx.is_positive_semidefinite(mass) and mass.T is mass
    assert is_state_independent(mass) and not lx.is_diagonal(mass)
    assert not is_state_independent(_operator(dense_m))
    expected = np.linalg.solve(dense_m, x)

    factored = FactoredOperator(mass, MassFactor.factor(jnp.asarray(dense_m), mass.matrix))
    assert factored.factor.inverse is not None  # 2 × 2 blocks: inverted block by block
    assert factor_of(factored) is factored.factor and factor_of(mass) is None
    assert sparse_matrix(factored) is mass.matrix and sparse_matrix(_operator(dense_m)) is None
    assert is_state_independent(factored) and lx.is_positive_semidefinite(factored)

    # the solves and products with both operators in one program (eagerly, each
    # operation compiles alone)
    @jax.jit
    def solves(x):
        return (
            [lx.linear_solve(mass, x, s).value for s in (lx.Cholesky(), StructuredCholesky())],
            factored.factor.solve(x[:, None])[:, 0],
            factored.mv(x),
            lx.linear_solve(factored, x, lx.Cholesky()).value,
        )

    of_mass, factor_solved, product, of_factored = solves(jnp.asarray(x))
    for solved in of_mass:
        np.testing.assert_allclose(solved, expected, rtol=1e-12)
    np.testing.assert_allclose(factor_solved, expected, rtol=1e-12)
    np.testing.assert_allclose(product, dense_m @ x, atol=1e-13)
    np.testing.assert_allclose(of_factored, expected, rtol=1e-12)


def test_solvers_refuse_operators_that_are_not_symmetric():
    operator = lx.MatrixLinearOperator(jnp.asarray(_spd(3, 0)))
    for solver in (StructuredCholesky(), PositiveSemidefinitePseudoInverse()):
        with pytest.raises(ValueError, match="positive_semidefinite_tag"):
            solver.init(operator, {})


def _terms(c, seed):
    n = 4
    rng = np.random.default_rng(seed)
    g = jnp.asarray(rng.standard_normal((c, n)))
    return ConstrainedTerms(
        mass_matrix=jnp.asarray(_spd(n, seed)),
        forces=jnp.asarray(rng.standard_normal(n)),
        phi=jnp.zeros(c),
        dphi=jnp.zeros(c),
        psi=jnp.zeros(0),
        jacobian=g,
        bias=jnp.asarray(rng.standard_normal(c)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("c", [2, 3])
def test_multiplier_solve_takes_any_lineax_solver(c):
    """`multiplier_solve` with lineax's own solvers (through `lineax.linear_solve`) equals it
    with the project's, values and gradients."""
    terms = _terms(c, c)
    target = jnp.linspace(-1.0, 1.0, c)
    pairs = [
        (StructuredCholesky(), lx.Cholesky()),
        (StructuredCholesky(), lx.LU()),
        (PositiveSemidefinitePseudoInverse(), lx.SVD(rcond=1e-8)),
    ]
    for ours, theirs in pairs:
        for x, y in zip(
            multiplier_solve(terms, target, ours),
            multiplier_solve(terms, target, theirs),
            strict=False,
        ):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)

        def loss(solver):
            return lambda t: jnp.sum(jnp.sin(multiplier_solve(terms, t, solver)[0]))

        np.testing.assert_allclose(
            jax.grad(loss(ours))(target), jax.grad(loss(theirs))(target), rtol=1e-9
        )


# -- structured against dense, every formulation -------------------------------------------


class _StructuredChain(CartesianChain):
    structured_terms = True


class _DenseChain(CartesianChain):
    structured_terms = False


_FORMULATIONS = [
    jaxdae.Baumgarte(kd=20.0, kp=100.0),
    jaxdae.PseudoInverse(kd=20.0, kp=100.0),
    jaxdae.ModifiedLagrange(alpha=50.0, kd=20.0, kp=100.0),
    jaxdae.CoupledPerturbation(k10=-100.0, k11=-20.0),
    jaxdae.Unstabilized(),
]


@eqx.filter_jit
def _values_and_gradients(model, formulations, q, v):
    def loss(diff, formulation):
        formulation_, model_, v_ = diff
        acc, lam = formulation_.accelerations(model_.terms(0.1, q, v_))
        return jnp.sum(jnp.sin(acc)) + jnp.sum(jnp.cos(lam))

    values = [f.accelerations(model.terms(0.1, q, v)) for f in formulations]
    grads = [eqx.filter_grad(lambda d, f=f: loss(d, f))((f, model, v)) for f in formulations]
    return values, grads


@pytest.mark.slow
@pytest.mark.parametrize("banded", [False, True])
def test_structured_formulations_agree_with_dense(banded, monkeypatch):
    """Every formulation on a chain of 9 links (18 coordinates) with structured terms (sparse
    products; with `banded`, the banded factorization of `J M⁻¹ Jᵀ` and `M + Jᵀ𝔄J` from 4
    rows on) and with dense ones: accelerations, multipliers and gradients w.r.t. the
    gains, the model's parameters and the velocities agree to 1e-10."""
    if banded:
        monkeypatch.setattr(_thresholds, "BANDED_MIN", 4)
    _banded.banded_plan.cache_clear()
    links = 9
    structured, dense = _StructuredChain(links), _DenseChain(links)
    q, _ = structured.initial_state()
    v = 0.3 * jnp.cos(jnp.arange(q.size, dtype=float))
    formulations = [
        *_FORMULATIONS,
        jaxdae.RedundantCoordinates(dependent=tuple(range(1, q.size, 2))),
    ]
    terms = structured.terms(0.1, q, v)
    assert terms.mass_operator is not None and dense.terms(0.1, q, v).mass_operator is None
    if banded:
        assert (
            _banded.banded_plan(
                _sparse.sparse_matmul(
                    terms.jacobian_operator.matrix, terms.jacobian_operator.matrix.T
                ).pattern
            )
            is not None
        )
    values_s, grads_s = _values_and_gradients(structured, formulations, q, v)
    values_d, grads_d = _values_and_gradients(dense, formulations, q, v)
    _banded.banded_plan.cache_clear()
    for formulation, (acc_s, lam_s), (acc_d, lam_d) in zip(
        formulations, values_s, values_d, strict=False
    ):
        name = type(formulation).__name__
        np.testing.assert_allclose(acc_s, acc_d, rtol=1e-10, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(lam_s, lam_d, rtol=1e-10, atol=1e-10, err_msg=name)
    for formulation, grad_s, grad_d in zip(formulations, grads_s, grads_d, strict=False):
        leaves_s, leaves_d = jax.tree_util.tree_leaves(grad_s), jax.tree_util.tree_leaves(grad_d)
        assert len(leaves_s) == len(leaves_d) > 0
        for a, b in zip(leaves_s, leaves_d, strict=False):
            np.testing.assert_allclose(
                a, b, rtol=1e-9, atol=1e-10, err_msg=type(formulation).__name__
            )


@pytest.mark.parametrize("redundant", [pytest.param(False, marks=pytest.mark.slow), True])
def test_banded_pseudo_inverse_matches_lineax_svd(redundant):
    """`G Gᵀ` of a banded `G` (40 rows; with `redundant`, one row repeated, so rank 39) as a
    `SparseOperator`: solved through the banded factorization where it has full
    rank and by the eigendecomposition where it does not; values and gradients w.r.t. the
    right-hand side equal `lineax.SVD`'s."""
    size = 40
    rng = np.random.default_rng(5)
    g = np.diag(1.0 + rng.random(size)) + np.diag(rng.standard_normal(size - 1), 1)
    if redundant:
        g[7] = g[6]
    matrix = g @ g.T
    mask = np.abs(np.arange(size)[:, None] - np.arange(size)[None]) <= 2
    sparse = SparseMatrix.from_dense(jnp.asarray(matrix), Pattern.from_mask(mask))
    operator = SparseOperator(sparse, PSD)
    solver = PositiveSemidefinitePseudoInverse(1e-8)
    # the factorization one program, the two gradients another (eagerly, each operation
    # compiles alone)
    state = eqx.filter_jit(solver.init)(operator, {})
    assert state.factor.plan is not None
    assert bool(state.full_rank) is not redundant
    b = jnp.asarray(rng.standard_normal(size))

    def loss(solver_, op):
        return lambda c: jnp.sum(jnp.sin(lx.linear_solve(op, c, solver_).value))

    dense = _operator(matrix)
    np.testing.assert_allclose(
        lx.linear_solve(operator, b, solver).value,
        lx.linear_solve(dense, b, lx.SVD(rcond=1e-8)).value,
        rtol=1e-8,
        atol=1e-10,
    )
    grads = jax.jit(
        lambda c: (
            jax.grad(loss(solver, operator))(c),
            jax.grad(loss(lx.SVD(rcond=1e-8), dense))(c),
        )
    )(b)
    np.testing.assert_allclose(*grads, rtol=1e-8, atol=1e-10)
