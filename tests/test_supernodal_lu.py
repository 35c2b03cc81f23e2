"""The multifrontal sparse LU factorization (`jaxdae/_compilation/_supernodal_lu.py`) of
saddle-point matrices with unsymmetric values, against NumPy's dense solves, under `jit`,
`grad`, `vmap`, `vmap(grad)` and in float32; its saddle-point order; and its use by
`jaxdae.GeneralizedAlpha`'s Newton iteration against the dense inverse."""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import jaxdae
from jaxdae import _thresholds
from jaxdae._compilation import _supernodal_lu
from jaxdae._compilation._linalg import full_precision
from jaxdae._compilation._sparse import Pattern, SparseMatrix
from jaxdae._compilation._supernodal_lu import (
    LUPlan,
    saddle_point_order,
    saddle_point_plan,
    supernodal_lu,
)
from jaxdae._integration import _generalized_alpha_newton
from jaxdae.examples._meshes import SquareNet

COORDINATES = 64
CONSTRAINTS = 40


@functools.cache
def saddle_point(seed: int = 0) -> np.ndarray:
    """`[[K, Gᵀ], [D G, 0]]`: `K` a grid's stiffness with unsymmetric couplings, `G` rows of
    three random coordinates each, `D` scaling some rows (as the Newton matrix scales the
    nonholonomic ones); the multipliers' diagonal is zero."""
    rng = np.random.default_rng(seed)
    side = 8
    n = side * side
    k = np.zeros((n, n))
    for a in range(n):
        k[a, a] = 4.0 + rng.random()
        neighbours = ([a + 1] if (a + 1) % side else []) + ([a + side] if a + side < n else [])
        for b in neighbours:
            k[a, b], k[b, a] = -rng.random(), -rng.random()
    g = np.zeros((CONSTRAINTS, n))
    for row in range(CONSTRAINTS):
        g[row, rng.choice(n, 3, replace=False)] = rng.standard_normal(3)
    scale = np.where(np.arange(CONSTRAINTS) < 30, 1.0, 2.5)
    return np.block([[k, g.T], [scale[:, None] * g, np.zeros((CONSTRAINTS, CONSTRAINTS))]])


@functools.cache
def plan_and_values(seed: int = 0) -> tuple[LUPlan, np.ndarray]:
    matrix = saddle_point(seed)
    pattern = Pattern.from_mask(matrix != 0)
    return LUPlan(pattern, saddle_point_order(pattern, COORDINATES)), matrix[
        pattern.rows, pattern.cols
    ]


def _solve(plan, transpose=False):
    def solve(values, b):
        factors = supernodal_lu(SparseMatrix(values, plan.pattern), plan)
        return factors.substitutions(b, transpose) if transpose else factors.solve(b)

    return solve


def test_the_order_eliminates_each_multiplier_after_its_coordinates():
    """In the plan's order (after its postorder of the elimination tree), every multiplier
    comes after every coordinate its constraint involves, and the coordinates are a
    permutation of the fill-reducing order's."""
    plan, _ = plan_and_values()
    matrix = saddle_point()
    position = plan.supernodal.inverse_order
    for row in range(COORDINATES, COORDINATES + CONSTRAINTS):
        involved = np.flatnonzero(matrix[row, :COORDINATES])
        assert position[row] > position[involved].max()
    assert sorted(plan.supernodal.order) == list(range(COORDINATES + CONSTRAINTS))


@pytest.mark.parametrize("transpose", [False, True])
def test_solves_match_numpy(transpose):
    """`A⁻¹ b` and `A⁻ᵀ b`, for one right-hand side and for three columns, equal NumPy's to
    rounding, though `A`'s multiplier block is zero and its values unsymmetric."""
    plan, values = plan_and_values()
    matrix = saddle_point()
    reference = matrix.T if transpose else matrix
    rng = np.random.default_rng(1)
    solve = jax.jit(_solve(plan, transpose))
    for b in (
        rng.standard_normal(plan.supernodal.size),
        rng.standard_normal((plan.supernodal.size, 3)),
    ):
        expected = np.linalg.solve(reference, b)
        np.testing.assert_allclose(solve(values, b), expected, atol=1e-11 * np.abs(expected).max())


def test_gradient_matches_central_differences():
    """The gradient of a loss of the solution w.r.t. the values and the right-hand side
    (reverse mode transposes the solve into one with `Aᵀ`) equals central differences."""
    plan, values = plan_and_values()
    solve = _solve(plan)
    rng = np.random.default_rng(2)
    b = rng.standard_normal(plan.supernodal.size)

    def loss(v, b):
        x = solve(v, b)
        return jnp.sum(jnp.sin(x)) + 0.5 * jnp.sum(x**2)

    g_values, g_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(values, b)
    loss = jax.jit(loss)
    for _ in range(2):
        dv, db = rng.standard_normal(values.shape), rng.standard_normal(b.shape)
        h = 1e-6
        numeric = (loss(values + h * dv, b + h * db) - loss(values - h * dv, b - h * db)) / (2 * h)
        np.testing.assert_allclose(np.dot(g_values, dv) + np.dot(g_b, db), numeric, rtol=1e-6)


def test_vmap_and_vmap_of_grad_match_each_member():
    """`vmap` of the solve and `vmap(grad)` of a loss over a batch of matrices equal the
    members' own."""
    plan, base = plan_and_values()
    pattern = plan.pattern
    rng = np.random.default_rng(5)
    values = base * (1 + 0.2 * rng.standard_normal((3, base.size)))
    bs = np.random.default_rng(3).standard_normal((3, plan.supernodal.size))
    solve = _solve(plan)

    def loss(v, b):
        return jnp.sum(solve(v, b) ** 3)

    batched = jax.jit(jax.vmap(solve))(values, bs)
    grads = jax.jit(jax.vmap(jax.grad(loss)))(values, bs)
    grad = jax.jit(jax.grad(loss))
    for i in range(3):
        dense = np.zeros(pattern.shape)
        dense[pattern.rows, pattern.cols] = values[i]
        np.testing.assert_allclose(batched[i], np.linalg.solve(dense, bs[i]), rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(grads[i], grad(values[i], bs[i]), rtol=1e-9, atol=1e-11)


def test_float32():
    """In float32 the solve agrees with the float64 solution to about 1e-4 (relative)."""
    plan, values = plan_and_values()
    b = np.random.default_rng(4).standard_normal(plan.supernodal.size)
    expected = np.linalg.solve(saddle_point(), b)
    x = jax.jit(full_precision(_solve(plan)))(values.astype(np.float32), b.astype(np.float32))
    assert x.dtype == jnp.float32
    np.testing.assert_allclose(x, expected, atol=1e-4 * np.abs(expected).max())


def test_singular_matrix_is_no_error():
    """Two equal constraint rows make `A` singular: the factorization raises no error and
    its solution is not finite or far from solving `A x = b` (as LAPACK's dense LU gives:
    a pivot of rounding size), which the Newton iteration's residual test sees."""
    matrix = saddle_point().copy()
    matrix[COORDINATES + 1] = matrix[COORDINATES]
    matrix[:, COORDINATES + 1] = matrix[:, COORDINATES]
    pattern = Pattern.from_mask(matrix != 0)
    plan = LUPlan(pattern, saddle_point_order(pattern, COORDINATES))
    b = np.ones(pattern.shape[0])
    x = np.asarray(jax.jit(_solve(plan))(matrix[pattern.rows, pattern.cols], b))
    assert not np.all(np.isfinite(x)) or np.abs(matrix @ x - b).max() > 1e-3


@pytest.fixture
def sparse_newton(monkeypatch):
    """`saddle_point_plan` factorizes every saddle point from 16 rows on sparsely."""
    monkeypatch.setattr(_thresholds, "SUPERNODAL_MIN", 16)
    monkeypatch.setattr(_thresholds, "DENSE_WORK_FACTOR", 1e9)
    saddle_point_plan.cache_clear()
    yield
    saddle_point_plan.cache_clear()


def test_the_plan_weighs_the_dense_factorization():
    """A small saddle point keeps the dense factorization (`None`); the cost model turns
    to the sparse one only where its estimated work is lower."""
    plan, _ = plan_and_values()
    assert saddle_point_plan(plan.pattern, COORDINATES) is None


def _net_solve(system, solver, **options):
    q0, v0 = system.initial_state()

    def run(gravity):
        model = eqx.tree_at(lambda s: s.gravity, system, gravity)
        sol = jaxdae.simulate(
            model,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            0.3,
            q0,
            v0,
            ts=jnp.array([0.1, 0.3]),
            solver=solver,
            rtol=1e-6,
            atol=1e-8,
            **options,
        )
        return sol.q, sol.stats["num_steps"]

    return run


def test_the_newton_matrix_of_a_net_is_factorized_on_its_pattern(sparse_newton):
    """`GeneralizedAlpha`'s Newton matrix of a net of 46 coordinates and 40 bars (86
    unknowns) is assembled on its pattern; its sparse LU factors solve with it as the
    dense matrix does, and the step's exact Jacobian solve (the implicit function theorem's)
    agrees with the dense one."""
    from jaxdae._integration import _generalized_alpha as ga

    system = SquareNet(5)
    q0, v0 = system.initial_state()
    solver = jaxdae.GeneralizedAlpha()

    @jax.jit
    def solves(q0, v0, rhs):
        acc, lam = ga._consistent(system, 0.0, q0, v0)
        step = solver.prepare(0.0, 1e-2, q0, v0, acc, acc)
        x = jnp.concatenate([q0 + 1e-3, lam])
        args = (system, jnp.asarray(1e-2), step)
        matrix = ga._iteration_matrix(x, args)
        assert isinstance(matrix, _generalized_alpha_newton.SaddlePointMatrix)
        factor = matrix.factor(False, None)
        assert isinstance(factor, _generalized_alpha_newton.SparseLU)
        options = _generalized_alpha_newton.NewtonOptions(
            residual=ga._residual,
            matrix=ga._iteration_matrix,
            coefficient=ga._coefficient,
            measure=ga._measure,
            norm=optx.rms_norm,
            kappa=0.01,
            max_steps=10,
            least_squares=False,
            rcond=None,
            coordinates=q0.shape[0],
        )
        residual = lambda y: ga._residual(y, args)[0]  # noqa: E731
        exact = _generalized_alpha_newton._exact_solve(residual, x, rhs, options)
        return matrix.matrix.dense(), factor.apply(rhs), jax.jacfwd(residual)(x), exact

    rhs = np.random.default_rng(6).standard_normal(86)
    dense, solved, jacobian, exact = solves(q0, v0, rhs)
    np.testing.assert_allclose(solved, np.linalg.solve(dense, rhs), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(exact, np.linalg.solve(jacobian, rhs), rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_generalized_alpha_on_the_sparse_factors_matches_the_dense_inverse(
    sparse_newton, monkeypatch
):
    """A net of 46 coordinates and 40 bars (86 unknowns) solved by `GeneralizedAlpha`
    with its Newton matrix on the sparse LU factors takes the same steps as with the dense
    inverse and the same positions to 1e-10."""
    built = []
    original = _supernodal_lu.supernodal_lu

    def counting(matrix, plan):
        built.append(plan.supernodal.size)
        return original(matrix, plan)

    monkeypatch.setattr(_generalized_alpha_newton, "supernodal_lu", counting)
    system = SquareNet(5)
    run = jax.jit(_net_solve(system, jaxdae.GeneralizedAlpha()))
    q_sparse, steps_sparse = run(system.gravity)
    assert 86 in built  # the Newton matrix took the sparse path
    saddle_point_plan.cache_clear()
    monkeypatch.setattr(_thresholds, "DENSE_WORK_FACTOR", 0.0)
    run = jax.jit(_net_solve(system, jaxdae.GeneralizedAlpha()))
    q_dense, steps_dense = run(system.gravity)
    assert int(steps_sparse) == int(steps_dense)
    np.testing.assert_allclose(q_sparse, q_dense, atol=1e-10)


@pytest.mark.slow
def test_generalized_alpha_gradients_on_the_sparse_factors(sparse_newton, monkeypatch):
    """The gradient of the net's final positions w.r.t. gravity on the sparse factors
    equals the dense path's to 1e-8 (relative), by the default discrete adjoint (whose step
    solves refine with the kept sparse LU factors of `(∂r/∂x)ᵀ`), by forward mode and by
    diffrax's checkpointed loop (the implicit function theorem's solve on the sparse
    factors, and its transpose), and under `vmap`."""
    system = SquareNet(5)
    solver = jaxdae.GeneralizedAlpha()

    def loss(**options):
        run = _net_solve(system, solver, **options)
        return lambda g: jnp.sum(run(g)[0][-1] ** 2)

    def gradients():
        g = system.gravity
        reverse = jax.jit(jax.grad(loss()))(g)
        forward = jax.jit(jax.jacfwd(loss(adjoint=diffrax.ForwardMode())))(g)
        checkpointed = jax.jit(jax.grad(loss(adjoint=diffrax.RecursiveCheckpointAdjoint())))(g)
        batched = jax.jit(jax.vmap(jax.grad(loss())))(g * jnp.array([1.0, 1.1]))
        return np.array([reverse, forward, checkpointed, *batched])

    sparse = gradients()
    saddle_point_plan.cache_clear()
    monkeypatch.setattr(_thresholds, "DENSE_WORK_FACTOR", 0.0)
    dense = gradients()
    np.testing.assert_allclose(sparse, dense, rtol=1e-8)
    np.testing.assert_allclose(sparse[:3], sparse[0], rtol=1e-6)
    np.testing.assert_allclose(sparse[3], sparse[0], rtol=1e-9)
