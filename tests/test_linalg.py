"""The small dense linear algebra (`jaxdae/_compilation/_linalg.py`) against NumPy and lineax.

Each helper has an unrolled or closed-form path for tiny matrices and a LAPACK path (lineax or
`jnp.linalg`) beyond `UNROLL_MAX` (the loops of vector operations, `looped_cholesky`, too);
every path is checked, under `vmap` and `grad` too.
"""

import functools
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import jaxdae
from jaxdae._compilation._jaxlib import LAPACK_BATCHES_CAN_DEADLOCK, lapack_batches_can_deadlock
from jaxdae._compilation._linalg import (
    blocked_inverse,
    checked_blocked_inverse,
    cholesky_pivots,
    extreme_eigenvalues,
    factor_for_solves,
    full_precision,
    inverse,
    inverse_is_accurate,
    is_positive_definite,
    looped_cholesky,
    looped_inverse,
    looped_triangular_solve,
    lu_factor,
    lu_solve,
    pivoted_cholesky,
    psd_pseudo_solve,
    reciprocal_condition,
    small_matmul,
    solve_factored,
    spd_solve,
    unrolled_cholesky_factor,
)
from jaxdae._compilation._stability import not_hurwitz
from jaxdae._thresholds import (
    INVERSE_MAX,
    LOOPED_INVERSE_MAX,
    LU_UNROLL_MAX,
    LYAPUNOV_MAX,
    NEWTON_INVERSE_BLOCK,
    TANGENT_LOOP_MAX,
    UNROLL_MAX,
)

SIZES = [1, 2, 3, UNROLL_MAX, UNROLL_MAX + 1]


def _spd(n, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    return (a @ a.T + n * np.eye(n)).astype(dtype)


@jax.jit
def _spd_solves(a, b):
    """Matrix and vector right-hand sides and `vmap` over columns: one program a case
    (eagerly, each operation of the unrolled factorization compiles alone)."""
    return (
        spd_solve(a, b),
        spd_solve(a, b[:, 0]),
        jax.vmap(spd_solve, in_axes=(None, 1), out_axes=1)(a, b),
    )


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spd_solve(n, dtype):
    """Matrix and vector right-hand sides, and `vmap` over columns, equal NumPy's solve."""
    a = _spd(n, n, dtype)
    b = np.random.default_rng(n).standard_normal((n, 3)).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    x, vector, batched = _spd_solves(a, b)
    assert x.dtype == dtype
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=tol, atol=tol)
    np.testing.assert_allclose(vector, np.linalg.solve(a, b[:, 0]), rtol=tol, atol=tol)
    np.testing.assert_allclose(batched, np.linalg.solve(a, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [3, UNROLL_MAX + 1])
def test_spd_solve_gradient_matches_lineax(n):
    """The unrolled Cholesky's gradient w.r.t. matrix and right-hand side is lineax's. The
    unrolled factorization reads the lower triangle only, so the matrix gradients are compared
    as derivatives along symmetric perturbations (lower triangle of `G + Gᵀ − diag G`)."""
    a, b = _spd(n, 7), np.arange(1.0, n + 1.0)

    def ours(a, b):
        return jnp.sum(jnp.sin(spd_solve(a, b)))

    def reference(a, b):
        operator = lx.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
        return jnp.sum(jnp.sin(lx.linear_solve(operator, b, lx.Cholesky()).value))

    def symmetric(g):
        g = np.asarray(g)
        return np.tril(g + g.T) - np.diag(np.diag(g))

    # each gradient one program (eagerly, each operation compiles alone)
    (got_a, got_b), (want_a, want_b) = (
        jax.jit(jax.grad(ours, (0, 1)))(a, b),
        jax.jit(jax.grad(reference, (0, 1)))(a, b),
    )
    np.testing.assert_allclose(symmetric(got_a), symmetric(want_a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [2, UNROLL_MAX + 1])
def test_spd_solve_of_indefinite_matrix_is_not_finite(n):
    """Like `lineax.linear_solve(..., throw=False)`: non-finite values, not an error, so that
    the ODE solver rejects the step."""
    a = np.eye(n)
    a[0, 0] = -1.0
    # one program (eagerly, each operation of the unrolled factorization compiles alone)
    assert not np.all(np.isfinite(jax.jit(spd_solve)(a, np.ones(n))))


@pytest.mark.parametrize("n", [5, UNROLL_MAX + 1])
def test_looped_cholesky_and_substitutions(n):
    """The looped factorization and substitutions equal LAPACK's; their derivatives (the
    factorization's rule, implicit substitutions) equal those of `jnp.linalg.cholesky` and
    `solve_triangular` in both modes, on symmetric perturbations, also under `vmap`; the
    programs have no LAPACK call and no scatter (which would keep XLA:CPU from compiling a
    solve's loop as one kernel)."""
    a, b = _spd(n, 11), np.random.default_rng(n).standard_normal((n, 2))
    tangent = _spd(n, 12)
    indefinite = a.copy()
    indefinite[n // 2, n // 2] = -1.0
    batch = np.stack([a, 2.0 * a, indefinite])

    def solve(factor, triangular):
        return lambda a, b: jnp.sum(jnp.cos(triangular(factor(0.5 * (a + a.T)), b)))

    ours = solve(looped_cholesky, lambda low, b: looped_triangular_solve(low, b, True))
    reference = solve(
        jnp.linalg.cholesky,
        lambda low, b: jax.scipy.linalg.solve_triangular(low, b, lower=True, trans=1),
    )

    @jax.jit  # one program for all the comparisons (eagerly, each operation compiles alone)
    def pairs(a, b, tangent, batch):
        low = jnp.linalg.cholesky(a)
        return {
            "factor": (looped_cholesky(a), low),
            **{
                f"substitution, transpose={transpose}": (
                    looped_triangular_solve(low, b, transpose),
                    jax.scipy.linalg.solve_triangular(low, b, lower=True, trans=int(transpose)),
                )
                for transpose in (False, True)
            },
            "factor's tangent": (
                jax.jvp(looped_cholesky, (a,), (tangent,))[1],
                jax.jvp(jnp.linalg.cholesky, (a,), (tangent,))[1],
            ),
            "gradient": (jax.grad(ours, (0, 1))(a, b), jax.grad(reference, (0, 1))(a, b)),
            # under `vmap`: unrolled or LAPACK's batched routines
            "batched factor": (
                jax.vmap(looped_cholesky)(batch[:2]),
                jnp.linalg.cholesky(batch[:2]),
            ),
            "batched gradient": (
                jax.vmap(jax.grad(ours, (0, 1)), in_axes=(0, None))(batch[:2], b),
                jax.vmap(jax.grad(reference, (0, 1)), in_axes=(0, None))(batch[:2], b),
            ),
            "indefinite, alone and batched": (
                looped_cholesky(indefinite),
                jax.vmap(looped_cholesky)(batch)[2],
            ),
        }

    for name, (got, want) in pairs(a, b, tangent, batch).items():
        if name.startswith("indefinite"):
            assert not np.all(np.isfinite(got)) and not np.all(np.isfinite(want))
            continue
        if name.startswith("substitution"):
            tolerance = {"rtol": 1e-12}
        elif "tangent" in name or "gradient" in name:
            tolerance = {"rtol": 1e-10, "atol": 1e-12}
        else:
            tolerance = {"rtol": 1e-12, "atol": 1e-13}
        for got_, want_ in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(got_, want_, err_msg=name, **tolerance)
    program = jax.jit(jax.grad(ours, (0, 1))).lower(a, b).compile().as_text()
    assert " scatter(" not in program and " custom-call(" not in program


@pytest.mark.parametrize(
    "version, deadlocks",
    [
        ("0.9.2", False),
        ("0.10.0", True),
        ("0.10.2", True),
        ("0.11.0rc1", True),
        ("0.11.0", True),
        ("0.11.1", False),
        ("0.12.0.1", False),
    ],
)
def test_lapack_batches_can_deadlock(version, deadlocks):
    """The jaxlib releases whose CPU LAPACK kernels split a batch over XLA's thread pool
    and wait for it (a deadlock when all the pool's threads do so at once)."""
    assert lapack_batches_can_deadlock(version) == deadlocks


@pytest.mark.usefixtures("on_cpu")
def test_vmapped_loops_avoid_lapack_where_it_can_deadlock():
    """Under `vmap` beyond `UNROLL_MAX` rows the factorization and the substitutions are
    LAPACK's batched routines, or batched loops on the CPU where those can deadlock; both
    equal LAPACK's results. (Read in the program compiled for the CPU.)"""
    n = UNROLL_MAX + 1
    batch = np.stack([_spd(n, 5), _spd(n, 6)])
    rhs = np.random.default_rng(7).standard_normal((2, n, 3))

    def both(a, b):
        low = looped_cholesky(a)
        return low, looped_triangular_solve(low, b, False), looped_triangular_solve(low, b, True)

    compiled = jax.jit(jax.vmap(both)).lower(batch, rhs).compile()
    calls = re.findall(r'custom_call_target="(lapack_\w+)"', compiled.as_text())
    deadlocks = LAPACK_BATCHES_CAN_DEADLOCK
    assert bool(calls) == (not deadlocks), calls
    low, forward, back = compiled(batch, rhs)
    want = np.linalg.cholesky(batch)
    np.testing.assert_allclose(low, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(forward, np.linalg.solve(want, rhs), rtol=1e-10)
    np.testing.assert_allclose(back, np.linalg.solve(np.swapaxes(want, 1, 2), rhs), rtol=1e-10)


@jax.jit
def _positive_definite(matrices):
    """`is_positive_definite` of each matrix, and under `vmap` of the first two: one program
    a size (eagerly, each operation of the unrolled factorization compiles alone)."""
    return [is_positive_definite(m) for m in matrices], jax.vmap(is_positive_definite)(matrices[:2])


@pytest.mark.parametrize("n", SIZES)
def test_is_positive_definite(n):
    a = _spd(n, 3)
    indefinite = a.copy()
    indefinite[-1, -1] = -abs(indefinite[-1, -1]) - 10.0 * n
    singular = np.zeros((n, n))
    not_finite = a.copy()
    not_finite[0, 0] = np.nan
    each, batched = _positive_definite(np.stack([a, indefinite, singular, not_finite]))
    assert [bool(x) for x in each] == [True, False, False, False]
    assert batched.tolist() == [True, False]


def test_unrolled_cholesky_reads_its_entries_behind_a_barrier():
    """No arithmetic of the unrolled Cholesky factorization takes a reshaped entry: it
    reads its entries (each a slice reshaped to a scalar) behind an optimization barrier.
    XLA's reshape mover would otherwise sink those reshapes through the factorization's
    chain of operations one operation per round of its simplification pipeline, running
    it to its round limit over the whole program."""
    matrix = _spd(UNROLL_MAX, 0)
    functions = {
        "factor": unrolled_cholesky_factor,
        "positive definite": is_positive_definite,
        "pivots": cholesky_pivots,
    }
    arithmetic = re.compile(r"= stablehlo\.(add|subtract|multiply|divide|sqrt|negate) (.*?) :")
    for name, function in functions.items():
        text = jax.jit(function).lower(matrix).as_text()
        reshaped = set(re.findall(r"(%[\w#]+) = stablehlo\.reshape", text))
        operands = {o for _, ops in arithmetic.findall(text) for o in re.findall(r"%[\w#]+", ops)}
        assert reshaped and not operands & reshaped, name


@pytest.mark.parametrize(
    "shapes", [((2, 3), (3,)), ((2, 3), (3, 4)), ((9, 9), (9, 2)), ((3, 12), (12,))]
)
def test_small_matmul(shapes):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape) for shape in shapes)
    # one program a case (eagerly, each of the unrolled products compiles alone)
    product = jax.jit(small_matmul)(a, b)
    np.testing.assert_allclose(product, a @ b, rtol=1e-13)


def test_extreme_eigenvalues_in_closed_form_match_eigvalsh():
    """The failure checks' eigenvalues (closed form for 1 × 1 and 2 × 2, evaluated at every
    step) equal LAPACK's, also for a nearly singular matrix."""
    rng = np.random.default_rng(0)
    g = rng.normal(size=(2, 3))
    nearly_singular = np.array([[1.0, 1.0], [1.0, 1.0 + 1e-7]])
    # one program a shape (eagerly, each operation of the closed forms compiles alone)
    eigenvalues, condition = jax.jit(extreme_eigenvalues), jax.jit(reciprocal_condition)
    for matrix in (g @ g.T, np.diag([3.0, 0.5]), nearly_singular, np.array([[2.5]]), g.T @ g):
        expected = np.linalg.eigvalsh(matrix)
        smallest, largest = eigenvalues(matrix)
        np.testing.assert_allclose(
            [smallest, largest], [expected[0], expected[-1]], rtol=1e-9, atol=1e-15 * expected[-1]
        )
    assert abs(condition(nearly_singular) - 2.5e-8) < 1e-12
    assert condition(np.zeros((0, 0))) == 1.0


def test_pseudo_inverse_in_closed_form_matches_pinv():
    """`PseudoInverse`'s `A⁺ b` for one or two constraints (closed form) equals the
    eigendecomposition's pseudo-inverse with the same cut-off, for full rank, rank one (a
    constraint written twice, or nearly so), zero and 3 × 3 (lineax); its gradient stays
    finite at rank one."""
    rcond = 1.5e-8
    rng = np.random.default_rng(1)
    g = rng.normal(size=(2, 3))
    row = rng.normal(size=(1, 3))
    twice = np.concatenate([row, row]) @ np.concatenate([row, row]).T
    nearly = np.array([[1.0, 1.0], [1.0, 1.0 + 1e-10]])
    cases = (
        g @ g.T,
        twice,
        nearly,
        np.diag([2.0, 0.0]),
        np.zeros((2, 2)),
        np.array([[2.5]]),
        np.zeros((1, 1)),
        g.T @ g,
    )
    solve = jax.jit(psd_pseudo_solve)  # one program a shape (eagerly, each operation alone)
    for matrix in cases:
        b = rng.normal(size=matrix.shape[0])
        w, vectors = np.linalg.eigh(matrix)
        keep = w > rcond * max(w.max(), 0.0)
        expected = vectors[:, keep] @ ((vectors[:, keep].T @ b) / w[keep])
        got = solve(matrix, b, rcond)
        np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-12)
    grad = jax.jit(jax.grad(lambda m: jnp.sum(psd_pseudo_solve(m, jnp.ones(2), rcond))))(twice)
    assert np.all(np.isfinite(grad))


def _oscillators(count, damping, last_damping=None):
    """`count` oscillators `ẍ_i = −4 x_i − damping ẋ_i + 0.1 x_{i+1}`, as one first-order
    matrix (NumPy: eagerly, each JAX operation on a new shape compiles alone); the last one
    damped by `last_damping` where given."""
    block = np.kron(np.eye(count), np.asarray([[0.0, 1.0], [-4.0, -damping]]))
    matrix = block + 0.1 * np.eye(2 * count, k=1) * np.tile([0.0, 1.0], count)[:, None]
    if last_damping is not None:
        matrix[-1, -1] = -last_damping
    return matrix


# one program a shape, shared by the cases and tests below
_traced_not_hurwitz = jax.jit(lambda m: not_hurwitz(m, jnp))


@pytest.mark.parametrize(
    "matrix, hurwitz",
    [
        ([[-1.0]], True),
        ([[0.0]], False),
        ([[0.0, 1.0], [-4.0, -0.5]], True),  # damped oscillator
        ([[0.0, 1.0], [-4.0, 0.0]], False),  # undamped: eigenvalues on the imaginary axis
        ([[0.0, 1.0], [4.0, -1.0]], False),  # a saddle
        ([[-1.0, 5.0, 0.0], [0.0, -2.0, 3.0], [0.0, 0.0, -0.1]], True),
        ([[np.nan, 0.0], [0.0, -1.0]], False),
        # beyond LYAPUNOV_MAX rows (traced: eigenvalues on the host): 15 coupled oscillators,
        # all damped, and with the last undamped
        (_oscillators(15, damping=0.5), True),
        (_oscillators(15, damping=0.5, last_damping=0.0), False),
    ],
)
def test_not_hurwitz_eager_and_traced_agree_with_eigenvalues(matrix, hurwitz):
    """The eager path (NumPy's eigenvalues) and the traced one (Lyapunov's equation, or the
    host's eigenvalues for large matrices) agree."""
    matrix = np.asarray(matrix)
    assert bool(not_hurwitz(matrix, np)) == (not hurwitz)
    assert bool(_traced_not_hurwitz(matrix)) == (not hurwitz)


def test_not_hurwitz_of_stacks_and_batches():
    """A stack is Hurwitz where each of its matrices is; batches of large matrices (host
    eigenvalues) keep one verdict per row."""
    stack = np.asarray([[[0.0, 1.0], [-4.0, -0.5]], [[0.0, 1.0], [4.0, -1.0]]])
    traced = _traced_not_hurwitz
    for matrices, bad in ((stack[:1], False), (stack, True), (stack[:0], False)):
        assert bool(not_hurwitz(matrices, np)) == bad
        assert bool(traced(matrices)) == bad
    large = np.stack([_oscillators(15, damping=d) for d in (0.5, 0.0, 0.1)])
    assert large.shape[-1] > LYAPUNOV_MAX
    np.testing.assert_array_equal(jax.vmap(traced)(large), [False, True, False])
    np.testing.assert_array_equal(jax.vmap(traced)(large[:, None]), [False, True, False])


def test_full_precision_keeps_the_users_choice():
    """Products are traced at the highest precision unless the user set one."""
    product = full_precision(lambda a: a @ a)
    a = jnp.ones((2, 2), jnp.float32)

    def precisions():
        jaxpr = jax.make_jaxpr(product)(a).jaxpr
        return {
            eqn.params["precision"] for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"
        }

    assert precisions() == {(jax.lax.Precision.HIGHEST,) * 2}
    with jax.default_matmul_precision("tensorfloat32"):
        assert precisions() == {(jax.lax.Precision.HIGH,) * 2}


@pytest.mark.parametrize("size", [3, 12])
def test_cholesky_pivots(size):
    rng = np.random.default_rng(size)
    a = rng.standard_normal((size, size))
    matrix = a @ a.T + 0.1 * np.eye(size)
    pivots_of = jax.jit(cholesky_pivots)  # one program (eagerly, each operation alone)
    pivots = np.asarray(pivots_of(matrix))
    eig = np.linalg.eigvalsh(matrix)
    np.testing.assert_allclose(np.prod(pivots), np.linalg.det(matrix), rtol=1e-9)
    assert eig[0] * (1 - 1e-12) <= pivots.min() and pivots.max() <= eig[-1] * (1 + 1e-12)
    singular = matrix.copy()
    singular[-1], singular[:, -1] = matrix[0], matrix[:, 0]
    singular[-1, -1] = matrix[0, 0]
    pivots = np.asarray(pivots_of(singular))
    assert not pivots.min() > 1e-8 * pivots.max()


@jax.jit
def _lu_and_reference(a, b):
    """Our factors and solves (matrix and vector right-hand sides) and `jax.scipy`'s and
    LAPACK's: one program a case (eagerly, each operation compiles alone)."""
    factors = lu_factor(a)
    return (
        factors,
        lu_solve(factors, b),
        lu_solve(factors, b[:, 0]),
        jax.scipy.linalg.lu_solve(jax.scipy.linalg.lu_factor(a), b),
        jax.lax.linalg.lu(a)[2],
    )


@pytest.mark.parametrize(
    "n",
    [
        1,
        pytest.param(2, marks=pytest.mark.slow),
        pytest.param(5, marks=pytest.mark.slow),
        LU_UNROLL_MAX,
        LU_UNROLL_MAX + 1,
    ],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lu_solve_matches_scipy(n, dtype):
    """`lu_factor`/`lu_solve` (unrolled up to `LU_UNROLL_MAX`, LAPACK beyond) give
    `jax.scipy.linalg.lu_solve`'s solution, for vector and matrix right-hand sides, and
    the row permutation of LAPACK's partial pivoting."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, 3)).astype(dtype)
    factors, matrix_solution, vector_solution, expected, permutation = _lu_and_reference(a, b)
    tol = 1e-10 if dtype == np.float64 else 1e-3
    scale = np.max(np.abs(expected))
    np.testing.assert_allclose(matrix_solution, expected, atol=tol * scale)
    np.testing.assert_allclose(vector_solution, expected[:, 0], atol=tol * scale)
    np.testing.assert_array_equal(factors[1], permutation)
    assert factors[0].dtype == dtype


def test_lu_pivots_where_the_leading_entries_are_small():
    """`I − hγJ` of a mechanical system `ẏ = [[0, I], [A, B]] y` for a large `hγ`: its
    leading block is 1 next to entries of 10⁸. Elimination without row exchanges loses
    the solution to rounding; partial pivoting keeps it."""
    stiffness = np.array([[-2.0, 1.0], [1.0, -2.0]]) * 1e8
    jacobian = np.block([[np.zeros((2, 2)), np.eye(2)], [stiffness, -1e3 * np.eye(2)]])
    matrix = np.eye(4) - 1.0 * jacobian
    matrix[0, 0] = 1e-12  # a tiny first pivot
    b = np.arange(1.0, 5.0)
    solve = jax.jit(lambda m, b: lu_solve(lu_factor(m), b))  # one program a shape
    x = solve(matrix, b)
    np.testing.assert_allclose(matrix @ np.asarray(x), b, rtol=0, atol=1e-6)
    np.testing.assert_allclose(x, np.linalg.solve(matrix, b), rtol=1e-8)
    permutation = np.array([[0.0, 1.0], [1.0, 0.0]])  # a zero on the diagonal
    np.testing.assert_allclose(solve(permutation, np.array([2.0, 3.0])), [3.0, 2.0])


def test_lu_singular_gives_non_finite_values():
    x = jax.jit(lambda m, b: lu_solve(lu_factor(m), b))(np.ones((3, 3)), np.ones(3))
    assert not np.all(np.isfinite(x))


@pytest.mark.slow
def test_lu_under_vmap_and_grad():
    rng = np.random.default_rng(0)
    a = np.eye(4) + 0.3 * rng.standard_normal((5, 4, 4))
    b = rng.standard_normal(4)
    batched = jax.vmap(lambda m: lu_solve(lu_factor(m), b))(a)
    np.testing.assert_allclose(batched, np.linalg.solve(a, b), rtol=1e-10)
    loss = lambda m: jnp.sum(jnp.sin(lu_solve(lu_factor(m), b)))  # noqa: E731
    reference = lambda m: jnp.sum(jnp.sin(jnp.linalg.solve(m, b)))  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss)(a[0]), jax.grad(reference)(a[0]), rtol=1e-10)


def _saddle_point(n, m, seed):
    """The Newton matrix of an index-3 generalized-α step, `[[M − cK, Gᵀ], [G, 0]]`
    (`M` positive definite, `cK` of a stiff spring 10⁸ times larger, `m` constraint rows):
    its zero block makes elimination without row exchanges break down."""
    rng = np.random.default_rng(seed)
    mass = _spd(n, seed)
    stiffness = rng.standard_normal((n, n))
    g = rng.standard_normal((m, n))
    top = np.concatenate([mass + 1e8 * (stiffness @ stiffness.T), g.T], 1)
    return np.concatenate([top, np.concatenate([g, np.zeros((m, m))], 1)], 0)


_inverse = jax.jit(inverse)  # one program a shape, shared by the tests below


@pytest.mark.parametrize(
    "n", [LU_UNROLL_MAX + 1, 33, pytest.param(LOOPED_INVERSE_MAX, marks=pytest.mark.slow)]
)
def test_looped_inverse_matches_numpy(n):
    """`inverse` (the checked block elimination from `LU_UNROLL_MAX + 1` rows up to
    `LOOPED_INVERSE_MAX`) against NumPy's LAPACK inverse and `jnp.linalg.solve`, on a
    random matrix and on a generalized-α Newton matrix; `factor_for_solves` keeps the
    inverse up to `INVERSE_MAX` rows and, for a Jacobian of few tangents, up to
    `LOOPED_INVERSE_MAX`, the LU factors beyond."""
    rng = np.random.default_rng(n)
    for matrix in (rng.standard_normal((n, n)), _saddle_point(n - n // 4, n // 4, n)):
        result = np.asarray(_inverse(matrix))
        expected = np.linalg.inv(matrix)
        cond = np.linalg.cond(matrix)
        np.testing.assert_allclose(result, expected, atol=1e-14 * cond * np.max(np.abs(expected)))
        factored = jax.eval_shape(factor_for_solves, matrix)
        assert isinstance(factored, tuple) == (n > INVERSE_MAX)  # LU factors or the inverse
        for tangents, lu in ((TANGENT_LOOP_MAX, False), (TANGENT_LOOP_MAX + 1, n > INVERSE_MAX)):
            factored = jax.eval_shape(lambda m, k=tangents: factor_for_solves(m, k), matrix)
            assert isinstance(factored, tuple) == lu
        b = rng.standard_normal(n)
        np.testing.assert_allclose(
            solve_factored(result, b),
            jnp.linalg.solve(matrix, b),
            atol=1e-14 * cond * np.max(np.abs(expected @ b)),
        )


@functools.partial(jax.jit, static_argnums=0)
def _tangents(fn, a, da):
    """The tangents of `fn` and of `jnp.linalg.inv` at `a` along `da`: one program (eagerly,
    each operation compiles alone)."""
    return jax.jvp(fn, (a,), (da,))[1], jax.jvp(jnp.linalg.inv, (a,), (da,))[1]


def test_looped_inverse_pivots_derivative_and_singular():
    """A permutation (zeros on the diagonal) is inverted exactly; the derivative is
    `jnp.linalg.inv`'s; a singular matrix gives non-finite entries; `vmap` works."""
    n = LU_UNROLL_MAX + 1
    permutation = np.roll(np.eye(n), 1, axis=0)
    np.testing.assert_array_equal(_inverse(permutation), permutation.T)
    rng = np.random.default_rng(1)
    a, da = rng.standard_normal((2, n, n))
    tangent, expected = _tangents(looped_inverse, a, da)
    np.testing.assert_allclose(tangent, expected, rtol=1e-10, atol=1e-12)
    assert not np.all(np.isfinite(_inverse(np.ones((n, n)))))
    stack = np.stack([a, a + da])
    np.testing.assert_allclose(
        jax.jit(jax.vmap(looped_inverse))(stack), np.linalg.inv(stack), rtol=1e-9, atol=1e-12
    )


_blocked = jax.jit(blocked_inverse, static_argnums=1)


def _newton_blocked_inverse(matrix):
    return blocked_inverse(matrix, NEWTON_INVERSE_BLOCK)


def _banded(n, width, seed):
    """A random non-symmetric matrix of half-bandwidth `width` whose diagonal dominates."""
    rng = np.random.default_rng(seed)
    band = np.abs(np.subtract.outer(np.arange(n), np.arange(n))) <= width
    return rng.standard_normal((n, n)) * band + (2 * width + 2) * np.eye(n)


def _chain_newton_matrix():
    """`jaxdae.GeneralizedAlpha`'s Newton matrix on the stiff spring chain of the stiff
    study (16 masses on springs `k = 10⁸`, one rod: 32 + 1 unknowns), for a step of 4 ms
    from its initial state."""
    root = Path(__file__).resolve().parents[1] / "experiments"
    sys.path[:0] = [str(root), str(root / "studies")]
    try:
        from stiff_integration import chain_case  # pyright: ignore[reportMissingImports]
    finally:
        del sys.path[:2]
    from jaxdae._integration import _generalized_alpha as ga

    system, _, q0, v0, _ = chain_case()
    solver = jaxdae.GeneralizedAlpha()

    @jax.jit  # one program (eagerly, each operation of the step compiles alone)
    def matrix(q0, v0):
        zero = jnp.zeros_like(q0)
        step = solver.prepare(0.0, 4e-3, q0, v0, zero, zero)
        x = jnp.concatenate([step.q_tilde, jnp.zeros(1)])
        return ga._iteration_matrix(x, (system, jnp.asarray(4e-3), step)).matrix

    return np.asarray(matrix(q0, v0))


@pytest.mark.parametrize("n", [33, pytest.param(LU_UNROLL_MAX + 1, marks=pytest.mark.slow)])
def test_blocked_inverse_matches_lapack(n):
    """`GeneralizedAlpha`'s `invert`, which is `blocked_inverse` from `LU_UNROLL_MAX + 1`
    rows (sizes that are not multiples of the block), against `jnp.linalg.solve` and
    NumPy's inverse on a random banded matrix and on a generalized-α Newton matrix with
    constraint rows (zeros on the diagonal: the pivot blocks pivot within themselves); for
    33 rows also on the spring chain's real Newton matrix."""
    from jaxdae._integration._generalized_alpha_newton import invert

    assert LU_UNROLL_MAX < n <= LOOPED_INVERSE_MAX  # the sizes `invert` gives to it
    rng = np.random.default_rng(n)
    matrices = [_banded(n, 3, n), _saddle_point(n - n // 4, n // 4, n)]
    if n == 33:
        matrices.append(_chain_newton_matrix())
    newton_inverse = jax.jit(lambda m: invert(m, False, None))
    for matrix in matrices:
        result = np.asarray(newton_inverse(matrix))
        expected = np.linalg.inv(matrix)
        scale = np.linalg.cond(matrix) * np.max(np.abs(expected))
        np.testing.assert_allclose(result, expected, atol=1e-13 * scale)
        b = rng.standard_normal(n)
        np.testing.assert_allclose(
            result @ b, jnp.linalg.solve(matrix, b), atol=1e-13 * scale * np.max(np.abs(b)) * n
        )


def test_blocked_inverse_derivative_vmap_and_singular_block():
    """The derivative is `jnp.linalg.inv`'s; `vmap` works; a singular pivot block (the
    elimination does not pivot across blocks) gives non-finite entries, not a wrong
    inverse."""
    n = LU_UNROLL_MAX + 1
    a, da = _banded(n, 2, 0), _banded(n, 2, 1)
    tangent, expected = _tangents(_newton_blocked_inverse, a, da)
    np.testing.assert_allclose(tangent, expected, rtol=1e-10, atol=1e-12)
    stack = np.stack([a, a + 0.1 * da])
    batched = jax.jit(jax.vmap(_newton_blocked_inverse))(stack)
    np.testing.assert_allclose(batched, np.linalg.inv(stack), rtol=1e-9, atol=1e-12)
    singular = np.roll(np.eye(n), NEWTON_INVERSE_BLOCK, axis=0)  # zero pivot blocks
    assert np.isfinite(np.linalg.inv(singular)).all()
    assert not np.all(np.isfinite(_blocked(singular, NEWTON_INVERSE_BLOCK)))


def test_checked_blocked_inverse_pivots_where_the_blocks_cannot():
    """`checked_blocked_inverse` keeps the block elimination's inverse where it is accurate
    (a random matrix) and falls back to partial pivoting where a pivot block is singular
    (a permutation) or nearly so (its entries would grow by 10¹²), alone and under `vmap`
    with one such matrix in the batch; float32 too."""
    n = LU_UNROLL_MAX + 3
    rng = np.random.default_rng(4)
    a = rng.standard_normal((n, n))
    permutation = np.roll(np.eye(n), NEWTON_INVERSE_BLOCK, axis=0)
    nearly = permutation + 1e-12 * rng.standard_normal((n, n))
    checked = jax.jit(checked_blocked_inverse)
    accurate = jax.jit(inverse_is_accurate)
    for matrix, blocks_suffice in ((a, True), (permutation, False), (nearly, False)):
        assert bool(accurate(matrix, _blocked(matrix, NEWTON_INVERSE_BLOCK))) == blocks_suffice
        np.testing.assert_allclose(
            checked(matrix),
            np.linalg.inv(matrix),
            rtol=1e-10,
            atol=1e-12 * np.max(np.abs(np.linalg.inv(matrix))),
        )
    stack = np.stack([a, nearly])
    np.testing.assert_allclose(
        jax.jit(jax.vmap(checked_blocked_inverse))(stack),
        np.linalg.inv(stack),
        rtol=1e-9,
        atol=1e-10,
    )
    single = np.asarray(checked(a.astype(np.float32)))
    assert single.dtype == np.float32
    np.testing.assert_allclose(single, np.linalg.inv(a), rtol=1e-3, atol=1e-4)
    assert not bool(accurate(np.ones((n, n)), np.full((n, n), np.nan)))


def test_pivoted_cholesky_of_a_rank_deficient_matrix():
    """`A = L diag(D) Lᵀ` for a positive semidefinite `A` of rank 7 (12 × 12, entries of
    different sizes): seven positive pivots, the largest remaining diagonal entry first,
    `L[order]` unit lower trapezoidal with entries at most 1 in magnitude, zero columns
    where the pivots are cut."""
    rng = np.random.default_rng(3)
    f = rng.standard_normal((12, 7)) * np.array([1e-3, 1.0, 5.0, 0.2, 3.0, 1.0, 0.05])
    a = f @ f.T
    low, pivots, order = (
        np.asarray(x) for x in jax.jit(pivoted_cholesky, static_argnums=1)(a, 1e-8)
    )
    np.testing.assert_allclose(low @ np.diag(pivots) @ low.T, a, atol=1e-12 * np.abs(a).max())
    assert np.sum(pivots > 0) == 7 and np.all(pivots[7:] == 0) and np.all(low[:, 7:] == 0)
    assert np.all(np.diff(pivots[:7]) <= 0) and pivots[0] == np.max(np.diag(a))
    assert sorted(order) == list(range(12))
    permuted = low[order]
    np.testing.assert_array_equal(np.diagonal(permuted)[:7], 1.0)
    assert np.all(np.triu(permuted, 1) == 0) and np.max(np.abs(low)) <= 1.0
