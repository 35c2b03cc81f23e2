"""The multifrontal sparse Cholesky factorization (`jaxdae/_compilation/_supernodal.py`)
against NumPy's dense solves, under `jit`, `grad`, `vmap`, `vmap(grad)`, `jacfwd` and in
float32; its orderings (METIS and the fallback nested dissection); its choice by
`StructuredCholesky`; and the size of its traced program against the matrix's."""

import functools
import sys
import tracemalloc

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import jaxdae
from jaxdae import _thresholds
from jaxdae._compilation import _ordering, _supernodal
from jaxdae._compilation._banded import BandedPlan, banded_plan
from jaxdae._compilation._linalg import full_precision
from jaxdae._compilation._linear_solvers import (
    PositiveSemidefinitePseudoInverse,
    StructuredCholesky,
    symmetric_solve,
)
from jaxdae._compilation._operators import SparseOperator
from jaxdae._compilation._ordering import adjacency, fill_reducing_order
from jaxdae._compilation._sparse import Pattern, SparseMatrix
from jaxdae._compilation._supernodal import (
    SupernodalPlan,
    cholesky_plan,
    supernodal_solve,
)
from jaxdae.examples._meshes import SquareNet

PSD = lx.positive_semidefinite_tag


def _symmetric(n, rows, cols) -> Pattern:
    rows, cols = np.asarray(rows), np.asarray(cols)
    keys = np.unique(np.concatenate([rows * n + cols, cols * n + rows, np.arange(n) * (n + 1)]))
    return Pattern((n, n), keys // n, keys % n)


def grid(rows, cols, diagonals=False) -> Pattern:
    """The 5-point grid graph (with `diagonals`, a triangular mesh: one diagonal per cell)."""
    index = np.arange(rows * cols).reshape(rows, cols)
    pairs = [(index[:, :-1], index[:, 1:]), (index[:-1], index[1:])]
    if diagonals:
        pairs.append((index[:-1, :-1], index[1:, 1:]))
    a = np.concatenate([p.ravel() for p, _ in pairs])
    b = np.concatenate([q.ravel() for _, q in pairs])
    return _symmetric(rows * cols, a, b)


def chain(n) -> Pattern:
    return _symmetric(n, np.arange(n - 1), np.arange(1, n))


def random_pattern(n, edges, seed) -> Pattern:
    rng = np.random.default_rng(seed)
    return _symmetric(n, rng.integers(0, n, edges), rng.integers(0, n, edges))


def disconnected() -> Pattern:
    """Two grids, a chain and isolated rows, interleaved by a permutation."""
    parts = [grid(5, 6), grid(4, 4, diagonals=True), chain(7), Pattern.full((1, 1))]
    rows, cols, offset = [], [], 0
    for part in [*parts, Pattern.full((1, 1))]:
        rows.append(part.rows + offset)
        cols.append(part.cols + offset)
        offset += part.shape[0]
    permutation = np.random.default_rng(3).permutation(offset)
    return Pattern(
        (offset, offset), permutation[np.concatenate(rows)], permutation[np.concatenate(cols)]
    )


PATTERNS = {
    "grid": lambda: grid(9, 9),
    "triangular mesh": lambda: grid(7, 8, diagonals=True),
    "random": lambda: random_pattern(60, 90, 1),
    "disconnected": disconnected,
    "chain": lambda: chain(70),
}


def spd_values(pattern: Pattern, seed: int, dtype=np.float64) -> np.ndarray:
    """Symmetric values on `pattern`, strictly diagonally dominant (positive definite) and
    not an M-matrix (random signs)."""
    rng = np.random.default_rng(seed)
    n = pattern.shape[0]
    key = np.minimum(pattern.rows, pattern.cols) * n + np.maximum(pattern.rows, pattern.cols)
    _, pair = np.unique(key, return_inverse=True)
    weights = rng.standard_normal(pair.max() + 1)[pair]
    off = pattern.rows != pattern.cols
    diagonal = np.zeros(n)
    np.add.at(diagonal, pattern.rows[off], np.abs(weights[off]))
    values = np.where(off, weights, diagonal[pattern.rows] + 0.5 + rng.random(pattern.nnz))
    return values.astype(dtype)


def dense(pattern: Pattern, values) -> np.ndarray:
    out = np.zeros(pattern.shape)
    out[pattern.rows, pattern.cols] = np.asarray(values, np.float64)
    return out


@functools.cache
def plan_of(name: str) -> SupernodalPlan:
    return SupernodalPlan(PATTERNS[name]())


@functools.cache
def solver(plan: SupernodalPlan):
    """`(x, X, pivots)` for a vector and a three-column right-hand side, one program."""

    def solve(values, b, columns):
        matrix = SparseMatrix(values, plan.pattern)
        x, pivots = supernodal_solve(matrix, b, plan)
        return x, supernodal_solve(matrix, columns, plan)[0], pivots

    return jax.jit(solve)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_solves_match_numpy(name):
    """On each pattern, the solves for a vector and for columns equal `numpy.linalg.solve`'s
    to 1e-10 (relative), and the pivots are positive and equal the squared diagonal of the
    dense Cholesky factor of the permuted matrix."""
    plan = plan_of(name)
    pattern = plan.pattern
    n = pattern.shape[0]
    rng = np.random.default_rng(0)
    values = spd_values(pattern, 1)
    b, columns = rng.standard_normal(n), rng.standard_normal((n, 3))
    x, xs, pivots = solver(plan)(values, b, columns)
    a = dense(pattern, values)
    scale = np.abs(np.linalg.solve(a, b)).max()
    np.testing.assert_allclose(x, np.linalg.solve(a, b), atol=1e-10 * scale)
    np.testing.assert_allclose(xs, np.linalg.solve(a, columns), atol=1e-10 * scale)
    permuted = a[np.ix_(plan.order, plan.order)]
    np.testing.assert_allclose(pivots, np.diag(np.linalg.cholesky(permuted)) ** 2, rtol=1e-10)
    assert np.all(np.asarray(pivots) > 0)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_symbolic_structure_holds_the_factor(name):
    """The order is a permutation, and every nonzero of the permuted matrix's dense Cholesky
    factor lies in a supernode's block (the symbolic factorization's structure)."""
    plan = plan_of(name)
    n = plan.size
    assert np.array_equal(np.sort(plan.order), np.arange(n))
    a = dense(plan.pattern, spd_values(plan.pattern, 2))
    low = np.linalg.cholesky(a[np.ix_(plan.order, plan.order)])
    counted = np.count_nonzero(np.abs(low) > 1e-14)
    assert counted <= plan.factor_entries


def _fill(pattern: Pattern, order) -> int:
    return SupernodalPlan(pattern, order).factor_nonzeros


def test_orderings_reduce_fill_on_a_grid(monkeypatch):
    """On a 30 × 30 grid both nested dissections (METIS where installed, and the fallback
    by level-structure separators) are permutations and give a factor with less than half
    the entries of the natural (banded) order's and a third fewer than reverse
    Cuthill–McKee's."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    pattern = grid(30, 30)
    n = pattern.shape[0]
    natural = _fill(pattern, np.arange(n))
    graph = csr_matrix((np.ones(pattern.nnz), (pattern.rows, pattern.cols)))
    rcm = _fill(pattern, np.asarray(reverse_cuthill_mckee(graph, symmetric_mode=True)))
    orders = {}
    if _ordering._metis_order(*adjacency(pattern)) is not None:
        orders["metis"] = fill_reducing_order(pattern)
    monkeypatch.setitem(sys.modules, "pymetis", None)  # `import pymetis` fails
    orders["fallback"] = fill_reducing_order(pattern)
    for name, order in orders.items():
        assert np.array_equal(np.sort(order), np.arange(n)), name
        fill = _fill(pattern, order)
        assert fill < natural / 2 and fill < 2 / 3 * rcm, (name, fill, natural, rcm)


def test_fallback_order_solves(monkeypatch):
    """Without pymetis the plan orders by the fallback nested dissection, and its solves on a
    disconnected pattern equal NumPy's."""
    monkeypatch.setitem(sys.modules, "pymetis", None)
    pattern = disconnected()
    order = fill_reducing_order(pattern)
    assert np.array_equal(np.sort(order), np.arange(pattern.shape[0]))
    plan = SupernodalPlan(pattern)
    values = spd_values(pattern, 4)
    b = np.random.default_rng(5).standard_normal(pattern.shape[0])
    x, _, _ = solver(plan)(values, b, np.zeros((pattern.shape[0], 3)))
    np.testing.assert_allclose(x, np.linalg.solve(dense(pattern, values), b), atol=1e-10)


@pytest.mark.skipif(
    _ordering._metis_order(np.zeros(2, np.int64), np.zeros(0, np.int64)) is None,
    reason="pymetis is not installed (the `sparse` extra)",
)
def test_metis_order_is_used():
    """With pymetis installed, the plan's order is METIS's nested dissection (up to the
    postorder of its elimination tree, which keeps its fill)."""
    pattern = grid(9, 9)
    metis = fill_reducing_order(pattern)
    assert _fill(pattern, metis) == plan_of("grid").factor_nonzeros


def test_indefinite_matrix_gives_non_finite_values():
    """A symmetric matrix that is not positive definite gives non-finite or non-positive
    pivots and a non-finite solution, not an error."""
    plan = plan_of("grid")
    pattern = plan.pattern
    values = spd_values(pattern, 1)
    diagonal = np.flatnonzero(pattern.rows == pattern.cols)
    values[diagonal[40]] = -50.0
    b = np.ones(pattern.shape[0])
    x, _, pivots = solver(plan)(values, b, np.zeros((pattern.shape[0], 3)))
    pivots = np.asarray(pivots)
    assert not np.all(np.isfinite(pivots) & (pivots > 0))
    assert not np.all(np.isfinite(np.asarray(x)))


@functools.cache
def _loss_and_grad(plan: SupernodalPlan):
    def loss(values, b):
        x, _ = supernodal_solve(SparseMatrix(values, plan.pattern), b, plan)
        return jnp.sum(jnp.sin(x)) + 0.5 * jnp.sum(x**2)

    return jax.jit(loss), jax.jit(jax.grad(loss, argnums=(0, 1)))


def test_gradient_matches_central_differences():
    """The gradient of a loss of the solution w.r.t. the matrix's values and the right-hand
    side equals central differences along random directions (float64)."""
    plan = plan_of("triangular mesh")
    n = plan.size
    rng = np.random.default_rng(6)
    values, b = spd_values(plan.pattern, 7), rng.standard_normal(n)
    loss, grad = _loss_and_grad(plan)
    g_values, g_b = grad(values, b)
    for _ in range(2):
        dv, db = rng.standard_normal(values.shape), rng.standard_normal(n)
        h = 1e-6
        numeric = (loss(values + h * dv, b + h * db) - loss(values - h * dv, b - h * db)) / (2 * h)
        analytic = np.dot(g_values, dv) + np.dot(g_b, db)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6)


def test_vmap_and_vmap_of_grad_match_each_member():
    """`vmap` of the solve and `vmap(grad)` of the loss over a batch of matrices and
    right-hand sides equal the members' own; `jacfwd` w.r.t. the right-hand side is `A⁻¹`."""
    plan = plan_of("triangular mesh")
    n = plan.size
    rng = np.random.default_rng(8)
    values = np.stack([spd_values(plan.pattern, s) for s in range(3)])
    bs = rng.standard_normal((3, n))
    loss, grad = _loss_and_grad(plan)

    def solve(v, b):
        return supernodal_solve(SparseMatrix(v, plan.pattern), b, plan)[0]

    batched = jax.jit(jax.vmap(solve))(values, bs)
    batched_grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(values, bs)
    for i in range(3):
        np.testing.assert_allclose(
            batched[i], np.linalg.solve(dense(plan.pattern, values[i]), bs[i]), atol=1e-10
        )
        g_values, g_b = grad(values[i], bs[i])
        np.testing.assert_allclose(batched_grads[0][i], g_values, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(batched_grads[1][i], g_b, rtol=1e-9, atol=1e-12)
    jacobian = jax.jit(jax.jacfwd(solve, argnums=1))(values[0], bs[0])
    np.testing.assert_allclose(jacobian, np.linalg.inv(dense(plan.pattern, values[0])), atol=1e-10)


def test_float32():
    """In float32 the solve and its gradient w.r.t. the right-hand side agree with the
    float64 solution to about 1e-4 (relative), at full precision as a solve runs it (on a
    GPU, float32 matrix products otherwise default to TF32)."""
    plan = plan_of("grid")
    n = plan.size
    values = spd_values(plan.pattern, 1)
    b = np.random.default_rng(9).standard_normal(n)
    reference = np.linalg.solve(dense(plan.pattern, values), b)

    @full_precision
    def solve(v, b):
        return supernodal_solve(SparseMatrix(v, plan.pattern), b, plan)[0]

    x = jax.jit(solve)(values.astype(np.float32), b.astype(np.float32))
    assert x.dtype == jnp.float32
    np.testing.assert_allclose(x, reference, atol=1e-4 * np.abs(reference).max())
    g = jax.jit(jax.grad(lambda v, b: jnp.sum(solve(v, b)), argnums=1))(
        values.astype(np.float32), b.astype(np.float32)
    )
    expected = np.linalg.solve(dense(plan.pattern, values), np.ones(n))
    np.testing.assert_allclose(g, expected, atol=1e-4 * np.abs(expected).max())


def _equations(jaxpr) -> int:
    count = 0
    for equation in jaxpr.eqns:
        count += 1
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(inner, jax.extend.core.ClosedJaxpr):
                    count += _equations(inner.jaxpr)
                elif isinstance(inner, jax.extend.core.Jaxpr):
                    count += _equations(inner)
    return count


def test_program_does_not_grow_with_the_matrix():
    """The traced factorization and solve (with its gradient) of 45 × 45, 90 × 90 and
    126 × 126 grids (2,025 to 15,876 rows), all with `SUPERNODAL_CLASSES` block-size
    classes, have the same number of equations up to the update code of the root's class
    (absent where no class has update rows): the schedule is data, not unrolled. An 8 × 8
    grid (fewer classes) has fewer."""
    counts = []
    for side in (8, 45, 90, 126):
        plan = SupernodalPlan(grid(side, side))
        n = plan.size

        def loss(values, b, plan=plan):
            x, pivots = supernodal_solve(SparseMatrix(values, plan.pattern), b, plan)
            return jnp.sum(x**2) + jnp.sum(pivots)

        values, b = jnp.ones(plan.pattern.nnz), jnp.ones(n)
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(values, b).jaxpr
        counts.append((len(plan.classes), _equations(jaxpr)))
    classes, equations = zip(*counts, strict=True)
    assert set(classes[1:]) == {_thresholds.SUPERNODAL_CLASSES}
    assert max(equations[1:]) < 1.1 * min(equations[1:])
    assert equations[0] < min(equations[1:])


@pytest.fixture
def sparse_path(monkeypatch):
    """`StructuredCholesky` takes the multifrontal path from 16 rows on, whatever its work
    and its band."""
    monkeypatch.setattr(_thresholds, "SUPERNODAL_MIN", 16)
    monkeypatch.setattr(_thresholds, "SUPERNODAL_WORK_RATIO", 0.0)
    monkeypatch.setattr(_thresholds, "SUPERNODAL_MIN_WIDTH", 0)
    _supernodal.supernodal_plan.cache_clear()
    cholesky_plan.cache_clear()
    yield
    _supernodal.supernodal_plan.cache_clear()
    cholesky_plan.cache_clear()


def test_structured_cholesky_uses_the_sparse_path(sparse_path):
    """Through `StructuredCholesky` on a `SparseOperator` (and `PositiveSemidefinitePseudo
    Inverse` beyond `LOOPED_MAX` rows, which factorizes with it): the multifrontal plan, the
    pivots, the solution and its gradient w.r.t. the values equal the dense ones."""
    pattern = grid(9, 9)
    n = pattern.shape[0]
    assert n > _thresholds.LOOPED_MAX
    values = jnp.asarray(spd_values(pattern, 10))
    b = jnp.asarray(np.random.default_rng(11).standard_normal(n))
    a = dense(pattern, values)

    def operator(v):
        return SparseOperator(SparseMatrix(v, pattern), PSD)

    state = eqx.filter_jit(lambda v: StructuredCholesky().init(operator(v), {}))(values)
    assert isinstance(state.plan, SupernodalPlan)
    assert np.all(np.asarray(state.pivots) > 0)

    def loss(v, solver_):
        return jnp.sum(symmetric_solve(operator(v), b, solver_) ** 2)

    for solver_ in (StructuredCholesky(), PositiveSemidefinitePseudoInverse()):
        x = jax.jit(lambda v, s=solver_: symmetric_solve(operator(v), b, s))(values)
        np.testing.assert_allclose(x, np.linalg.solve(a, b), atol=1e-10)
    x = np.linalg.solve(a, b)
    y = np.linalg.solve(a, x)  # the gradient w.r.t. the symmetric part of `A`
    expected = -(np.outer(y, x) + np.outer(x, y))[pattern.rows, pattern.cols]
    g = jax.jit(jax.grad(lambda v: loss(v, StructuredCholesky())))(values)
    np.testing.assert_allclose(g, expected, rtol=1e-8, atol=1e-12)


def test_banded_patterns_keep_the_banded_plan():
    """With the default thresholds a chain of 400 rows and a ladder keep the banded plan
    (without the sparse analysis), and a small grid below `SUPERNODAL_MIN` too; a grid of
    128 × 128 takes the multifrontal plan."""
    ladder = _symmetric(
        400,
        np.concatenate([np.arange(0, 398), np.arange(0, 400, 2)]),
        np.concatenate([np.arange(2, 400), np.arange(1, 400, 2)]),
    )
    cholesky_plan.cache_clear()
    _supernodal.supernodal_plan.cache_clear()
    for pattern in (chain(400), ladder):
        assert isinstance(cholesky_plan(pattern), BandedPlan)
    assert _supernodal.supernodal_plan.cache_info().currsize == 0
    assert not isinstance(cholesky_plan(grid(7, 7)), SupernodalPlan)
    assert isinstance(cholesky_plan(grid(128, 128)), SupernodalPlan)


def test_the_plans_of_a_large_grid_take_memory_of_their_entries():
    """The plans of a grid of 4,096 rows (half-bandwidth 64 in its bandwidth order): the
    banded plan places each entry in its block from the entries alone, and neither it nor
    the multifrontal analysis allocates a table of the whole matrix (4,096² indices,
    134 MB). On smaller patterns (a triangulated grid, a random one, a chain) the blocks it
    gives are those of that table."""
    banded_plan.cache_clear()
    cholesky_plan.cache_clear()
    _supernodal.supernodal_plan.cache_clear()
    tracemalloc.start()
    try:
        band = banded_plan(grid(64, 64))
        _supernodal.supernodal_plan(grid(64, 64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert band is not None and band.width == 64
    assert peak < 32 * 2**20
    for pattern in (grid(12, 9, diagonals=True), random_pattern(150, 300, seed=4), chain(40)):
        band = banded_plan(pattern)
        assert band is not None
        # The table of every entry's position in the permuted matrix, cut into blocks.
        size, width = pattern.shape[0], band.width
        inverse = np.empty(size, np.int64)
        inverse[band.order] = np.arange(size)
        padded = band.blocks * width
        table = np.full((padded, padded), pattern.nnz, np.int64)
        table[inverse[pattern.rows], inverse[pattern.cols]] = np.arange(pattern.nnz)
        blocks = table.reshape(band.blocks, width, band.blocks, width)
        index = np.arange(band.blocks)
        np.testing.assert_array_equal(band.diagonal, blocks[index, :, index, :])
        np.testing.assert_array_equal(band.lower[1:], blocks[index[1:], :, index[:-1], :])
        assert np.all(band.lower[0] == pattern.nnz)


def test_multiplier_solve_of_a_mesh_through_the_sparse_plan(sparse_path, monkeypatch):
    """`Baumgarte`'s accelerations and multipliers of a 6 × 6 square net of bars (60
    constraints; `G M⁻¹ Gᵀ` factorized on the multifrontal plan by the sparse multiplier
    solve), and their gradient w.r.t. the velocities and the gains, equal those on the
    banded plan to 1e-10."""
    model = SquareNet(6)
    q, _ = model.initial_state()
    v = 0.1 * jnp.cos(jnp.arange(q.size, dtype=float))
    formulation = jaxdae.Baumgarte(2.0, 3.0)

    @eqx.filter_jit
    def values_and_gradient(formulation, v):
        def loss(args):
            formulation, v = args
            acc, lam = formulation.accelerations(model.terms(0.1, q, v))
            return jnp.sum(acc**2) + jnp.sum(jnp.sin(lam)), (acc, lam)

        return eqx.filter_grad(loss, has_aux=True)((formulation, v))

    factorized = []
    factor = _supernodal.supernodal_factor
    monkeypatch.setattr(
        _supernodal, "supernodal_factor", lambda m, p: factorized.append(p.size) or factor(m, p)
    )
    grads, (acc, lam) = values_and_gradient(formulation, v)
    assert factorized and set(factorized) == {lam.size}
    monkeypatch.setattr(_thresholds, "SUPERNODAL_MIN", 10**9)
    _supernodal.supernodal_plan.cache_clear()
    cholesky_plan.cache_clear()
    factorized.clear()
    grads_b, (acc_b, lam_b) = values_and_gradient(formulation, v)
    assert not factorized
    np.testing.assert_allclose(acc, acc_b, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lam, lam_b, rtol=1e-10, atol=1e-10)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)


def _simulate_gradient(batched: bool):
    """The gradient w.r.t. `Baumgarte`'s gains of `|q(0.2)|²` for a 5 × 5 square net (40
    constraints) from a perturbed rest, compiled (with `batched`, `vmap` over two initial
    velocities of the gradient w.r.t. `kd`)."""
    model = SquareNet(5)
    q0, v0 = model.initial_state()
    v0 = v0 + 0.01 * jnp.cos(jnp.arange(v0.size, dtype=float))

    def loss(formulation, v):
        return jnp.sum(jaxdae.simulate(model, formulation, 0.0, 0.2, q0, v).q[-1] ** 2)

    formulation = jaxdae.Baumgarte(10.0, 25.0)
    if not batched:
        return eqx.filter_jit(eqx.filter_grad(loss))(formulation, v0)
    vs = jnp.stack([v0, v0 + 1e-3 * jnp.sin(jnp.arange(v0.size, dtype=float))])
    return eqx.filter_jit(jax.vmap(lambda v: eqx.filter_grad(loss)(formulation, v).kd))(vs)


@pytest.mark.slow
def test_simulate_gradients_through_the_sparse_plan(sparse_path, monkeypatch):
    """`jaxdae.simulate`'s gradient w.r.t. the gains of a square net's motion, and its `vmap`
    over initial velocities, with `G M⁻¹ Gᵀ` on the multifrontal plan equal those on the
    banded plan to 1e-9 (relative)."""
    factorized = []
    factor = _supernodal.supernodal_factor
    monkeypatch.setattr(
        _supernodal, "supernodal_factor", lambda m, p: factorized.append(p.size) or factor(m, p)
    )
    sparse, sparse_batch = _simulate_gradient(False), _simulate_gradient(True)
    assert factorized
    monkeypatch.setattr(_thresholds, "SUPERNODAL_MIN", 10**9)
    _supernodal.supernodal_plan.cache_clear()
    cholesky_plan.cache_clear()
    factorized.clear()
    banded, banded_batch = _simulate_gradient(False), _simulate_gradient(True)
    assert not factorized
    for a, b in ((sparse.kd, banded.kd), (sparse.kp, banded.kp), (sparse_batch, banded_batch)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15)
