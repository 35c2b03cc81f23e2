"""Structure of the derived terms: sparsity patterns found from the user's jaxprs, compressed
derivatives, and the structured linear algebra against the dense path."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import jaxdae
from jaxdae import _thresholds
from jaxdae._compilation import _banded, _gather
from jaxdae._compilation._banded import banded_plan, banded_solve
from jaxdae._compilation._linalg import unrolled_cholesky_factor
from jaxdae._compilation._operators import SparseOperator
from jaxdae._compilation._scalarize import array_form_scope, scalarize
from jaxdae._compilation._sparse import (
    Pattern,
    SparseMatrix,
    block_inverse,
    blocks_positive_definite,
    sparse_add,
    sparse_matmul,
)
from jaxdae._compilation._sparsity import column_colouring, nonzero_masks
from jaxdae._systems._structure import terms_structure
from jaxdae._thresholds import STRUCTURED_MIN
from jaxdae.examples._scaling import BarNet, CartesianChain, FourBarLadder, NLinkPendulum

from ._jaxprs import assert_rates_loop_is_one_kernel, not_in_a_loop

# -- pattern detection --------------------------------------------------------------------


def _jacobian_mask(fn, n):
    (mask,) = nonzero_masks(jax.jacfwd(fn), jax.ShapeDtypeStruct((n,), jnp.float64))
    return mask


def _numeric_mask(fn, n, points=3):
    rng = np.random.default_rng(0)
    jacobian = jax.jit(jax.jacfwd(fn))  # one program (eagerly, each operation compiles alone)
    mask = np.zeros((), bool)
    for _ in range(points):
        mask = mask | (np.asarray(jacobian(rng.standard_normal(n))) != 0)
    return mask


def test_masks_through_an_optimization_barrier_of_several_operands():
    """A barrier passes each operand's mask through (the unrolled Cholesky reads its
    entries behind one): a lower-triangular factor of a tridiagonal matrix."""

    def factor(x):
        matrix = jnp.diag(2.0 + x**2) + jnp.diag(x[1:], 1) + jnp.diag(x[1:], -1)
        return unrolled_cholesky_factor(matrix)

    (mask,) = nonzero_masks(factor, jax.ShapeDtypeStruct((4,), jnp.float64))
    np.testing.assert_array_equal(mask, np.tri(4, k=0, dtype=bool) & ~np.tri(4, k=-2, dtype=bool))


def _chain_constraints_awkward(q):
    # `.at[].set` in a Python loop, a reshape and a transpose
    out = jnp.zeros(4)
    p = q.reshape(2, 4).T  # p[i] = (q[i], q[4 + i])
    for i in range(4):
        prev = p[i - 1] if i else jnp.zeros(2)
        out = out.at[i].set(jnp.sum((p[i] - prev) ** 2) - 1.0)
    return out


def _gathered(q):
    index = np.array([3, 0, 5, 5])
    return q[index] * jnp.sin(q[index + 1]) + jnp.where(q[2] > 0, q[1], 0.0)


def _scanned(q):
    def step(carry, x):
        return carry, carry * x

    _, ys = jax.lax.scan(step, q[0], q[1:])
    return ys


@pytest.mark.parametrize(
    "fn,n",
    [
        (_chain_constraints_awkward, 8),
        (_gathered, 7),
        (_scanned, 5),
        (lambda q: jnp.cumsum(q) ** 2, 5),
        (lambda q: jnp.cos(q) - 1.0, 4),
        (lambda q: jnp.outer(q, q) @ jnp.arange(4.0), 4),
    ],
)
def test_patterns_contain_every_nonzero(fn, n):
    found = _jacobian_mask(fn, n)
    numeric = _numeric_mask(fn, n)
    assert found.shape == numeric.shape
    assert not np.any(numeric & ~found), "an entry that is not zero was left out"


def test_patterns_are_exact_on_awkward_models():
    expected = np.zeros((4, 8), bool)
    for i in range(4):
        expected[i, [i, 4 + i]] = True
        if i:
            expected[i, [i - 1, 3 + i]] = True
    np.testing.assert_array_equal(_jacobian_mask(_chain_constraints_awkward, 8), expected)
    # both branches of the `where` count, whatever the point
    gathered = _jacobian_mask(_gathered, 7)
    np.testing.assert_array_equal(gathered[0], np.isin(np.arange(7), [1, 3, 4]))
    # a scan's iterations are merged: every output may depend on every scanned input
    assert np.all(_jacobian_mask(_scanned, 5))


def test_masks_are_reused_only_for_the_same_function(monkeypatch):
    """A function traced again (as a solve traces its step several times) reuses the masks
    found before; functions whose jaxprs print alike but gather at other index tables
    (`take`'s tables print as their type), or close over other constant values, do not."""
    from jaxdae._compilation import _sparsity

    runs = []
    run = _sparsity._run_closed
    monkeypatch.setattr(_sparsity, "_run_closed", lambda *a: runs.append(1) or run(*a))
    x = jax.ShapeDtypeStruct((3,), jnp.float64)

    def gather(index):
        return lambda y: _gather.take(y, index) * y

    assert nonzero_masks(jax.jacfwd(gather(np.array([0, 2, 1]))), x)[0].sum() == 5
    assert nonzero_masks(jax.jacfwd(gather(np.array([0, 2, 1]))), x)[0].sum() == 5
    assert len(runs) == 1
    expected = np.eye(3, dtype=bool)
    expected[2, 1] = True  # y[1] · y[2]
    np.testing.assert_array_equal(
        nonzero_masks(jax.jacfwd(gather(np.array([0, 1, 1]))), x)[0], expected
    )
    scale = np.array([1.0, 0.0, 2.0])
    masks = [nonzero_masks(lambda y, c=c: y * c, x)[0] for c in (scale, scale[::-1])]
    np.testing.assert_array_equal(masks[0], [True, False, True])
    np.testing.assert_array_equal(masks[1], [True, False, True][::-1])
    assert len(runs) == 4


class _Loops(jaxdae.LagrangianSystem):
    """Point masses on a line written with Python loops and `.at[].set`: diagonal `M`
    (masses as a parameter), a Jacobian with two entries per row."""

    masses: jax.Array
    structured_terms = True

    def kinetic_energy(self, t, q, v):
        total = 0.0
        for i in range(q.shape[0]):
            total = total + 0.5 * self.masses[i] * v[i] ** 2
        return total

    def potential_energy(self, t, q):
        return jnp.sum(jnp.cos(q))

    def constraints(self, t, q):
        phi = jnp.zeros(q.shape[0] - 1, q.dtype)
        for i in range(q.shape[0] - 1):
            phi = phi.at[i].set(jnp.sin(q[i + 1]) - q[i] * (1.0 + 0.1 * t))
        return phi


def test_system_structure():
    n = 6
    model = _Loops(jnp.linspace(1.0, 2.0, n))
    q, v = np.linspace(0.1, 0.6, n), np.linspace(-0.3, 0.3, n)
    structure = terms_structure(model, 0.0, q, v)
    assert structure.mass.is_diagonal and structure.mass_is_constant
    assert structure.jacobian.nnz == 2 * (n - 1)
    assert max(structure.position_colours) + 1 == 2
    assert max(structure.velocity_colours) + 1 == 1
    # the dense pendulum: full mass matrix that depends on q
    pendulum = StructuredPendulum(10)
    q, v = _initial_state(pendulum)
    structure = terms_structure(pendulum, 0.0, q, v)
    assert structure.mass.nnz == 100 and not structure.mass_is_constant
    # small systems keep the dense derivation unless they ask; large ones are structured
    q, v = _initial_state(CartesianChain(2))
    assert terms_structure(CartesianChain(2), 0.0, q, v) is None
    q, v = _initial_state(CartesianChain(20))
    assert terms_structure(CartesianChain(20), 0.0, q, v).jacobian.nnz == 4 * 20 - 2


def test_structured_above_threshold():
    """`STRUCTURED_MIN` coordinates keep the dense derivation, one more takes the patterns
    (`experiments/diagnostics/bench_structured_threshold.py` measured the crossover); the
    class attribute overrides both ways."""
    for model, structured in (
        (NLinkPendulum(STRUCTURED_MIN), False),
        (NLinkPendulum(STRUCTURED_MIN + 1), True),
        (CartesianChain(STRUCTURED_MIN // 2), False),
        (CartesianChain(STRUCTURED_MIN // 2 + 1), True),
        (StructuredChain(2), True),
        (DenseChain(STRUCTURED_MIN), False),
    ):
        q, v = _initial_state(model)
        assert (terms_structure(model, 0.0, q, v) is not None) == structured, model


def _equations(fn, *args):
    return len(jax.make_jaxpr(fn)(*args).jaxpr.eqns)


def test_array_form_scope():
    """`scalarize` re-traces a small function as a scalar graph, but not one that traces
    anything in `array_form_scope`; the structured terms run in that scope, so a small
    structured model keeps its array form where the dense one of the same size does not."""

    def small(x):
        return jnp.sin(x) * x + 1.0

    def marked(x):
        with array_form_scope():
            return small(x)

    x = np.linspace(0.1, 0.5, 4)
    assert _equations(scalarize(small), x) != _equations(small, x)
    assert _equations(scalarize(marked), x) == _equations(marked, x)
    # one program (eagerly, each operation compiles alone)
    np.testing.assert_allclose(*jax.jit(lambda x: (scalarize(marked)(x), small(x)))(x), rtol=1e-15)
    for cls, array_form in ((StructuredChain, True), (DenseChain, False)):
        model = cls(3)
        q, v = _state(model)

        def forces(q, v, model=model):
            return model.terms(0.0, q, v).forces

        assert (_equations(scalarize(forces), q, v) == _equations(forces, q, v)) == array_form


class _GivenMass(jaxdae.LagrangianSystem):
    """A constant block-diagonal mass matrix given by `mass_matrix` (2 × 2 blocks)."""

    structured_terms = True

    def mass_matrix(self, t, q):
        block = jnp.array([[2.0, 0.5], [0.5, 1.0]])
        return jnp.kron(jnp.eye(q.shape[0] // 2), block)

    def potential_energy(self, t, q):
        return 9.81 * jnp.sum(q[1::2])

    def constraints(self, t, q):
        p = q.reshape(-1, 2)
        return jnp.sum(jnp.diff(p, axis=0) ** 2, axis=1) - 1.0


@pytest.mark.slow
def test_given_block_mass():
    model = _GivenMass()
    q = jnp.array([0.0, 0.0, 1.0, 0.0, 1.0, -1.0, 2.0, -1.0])
    v = jnp.linspace(-1.0, 1.0, 8)
    structure = terms_structure(model, 0.0, q, v)
    assert structure.mass_is_constant and structure.mass.nnz == 16
    terms = model.terms(0.0, q, v)
    inverse = block_inverse(terms.mass_operator.matrix)
    np.testing.assert_allclose(inverse.dense() @ terms.mass_matrix, np.eye(8), atol=1e-14)


class _IndefiniteGivenMass(_GivenMass):
    """`_GivenMass` with its last block indefinite."""

    def mass_matrix(self, t, q):
        mass = super().mass_matrix(t, q)
        return mass.at[-2:, -2:].set(jnp.array([[1.0, 2.0], [2.0, 1.0]]))


class _MasslessLastChain(CartesianChain):
    """A structured chain whose last point mass is zero (`M` diagonal, one zero entry)."""

    structured_terms = True

    def kinetic_energy(self, t, q, v):
        return 0.5 * jnp.sum(v[:-2] ** 2)


def test_blocks_positive_definite():
    """By blocks as a dense Cholesky factorization says: positive blocks, an indefinite one,
    one singular in its last pivot, non-finite entries; a diagonal; no answer for a block
    larger than `BLOCK_MAX`."""
    block = np.array([[2.0, 0.5, 0.1], [0.5, 1.0, 0.2], [0.1, 0.2, 1.5]])
    singular = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    blocks = Pattern.from_mask(np.kron(np.eye(2), np.ones((3, 3))).astype(bool))
    diagonal = Pattern.from_mask(np.eye(4, dtype=bool))

    # one program for the blocks, one for the diagonals (eagerly, each operation compiles
    # alone)
    @jax.jit
    def by_blocks(block, last):
        dense = jax.scipy.linalg.block_diag(block, last)
        return blocks_positive_definite(SparseMatrix.from_dense(dense, blocks))

    @jax.jit
    def by_entries(values):
        return blocks_positive_definite(SparseMatrix(values, diagonal))

    for last, want in (
        (block, True),
        (np.diag([1.0, -1.0, 1.0]), False),
        (singular, False),
        (np.full((3, 3), np.nan), False),
    ):
        assert bool(by_blocks(block, last)) is want, last
    for values, want in (
        ([1.0, 2.0, 3.0, 4.0], True),
        ([1.0, 0.0, 3.0, 4.0], False),
        ([1.0, 2.0, -3.0, 4.0], False),
        ([1.0, np.nan, 3.0, 4.0], False),
        ([1.0, np.inf, 3.0, 4.0], False),
    ):
        assert bool(by_entries(np.asarray(values))) is want
    wide = Pattern.from_mask(np.ones((2 * _thresholds.BLOCK_MAX,) * 2, bool))
    # decided from the pattern alone: traced for its shape, nothing compiled
    assert (
        jax.eval_shape(
            lambda: blocks_positive_definite(
                SparseMatrix.from_dense(jnp.eye(2 * _thresholds.BLOCK_MAX), wide)
            )
        )
        is None
    )


@pytest.mark.parametrize("model", [_IndefiniteGivenMass(), _MasslessLastChain(5)])
def test_a_mass_that_is_not_positive_definite_is_refused(model):
    """The structured models' initial mass check (block by block, without a dense
    factorization; the traced check calls the same `initial_state_problems`)."""
    if isinstance(model, _IndefiniteGivenMass):
        q, v = np.array([0.0, 0.0, 1.0, 0.0, 1.0, -1.0, 2.0, -1.0]), np.zeros(8)
    else:
        q, v = _state(model)
    assert terms_structure(model, 0.0, q, v) is not None
    formulation = FORMULATIONS["Baumgarte"]
    with pytest.raises(ValueError, match="not symmetric positive definite"):
        jaxdae.simulate(model, formulation, 0.0, 0.1, q, v)


# -- sparse matrices ----------------------------------------------------------------------


def _random_sparse(rng, shape, density):
    mask = rng.random(shape) < density
    return rng.standard_normal(shape) * mask, Pattern.from_mask(mask)


def test_sparse_operations():
    rng = np.random.default_rng(1)
    a_dense, a_pattern = _random_sparse(rng, (7, 9), 0.3)
    b_dense, b_pattern = _random_sparse(rng, (9, 5), 0.3)
    c_dense, c_pattern = _random_sparse(rng, (7, 9), 0.3)
    x = rng.standard_normal(9)

    @jax.jit  # one program (eagerly, each operation compiles alone)
    def operations(a_dense, b_dense, c_dense, x):
        a = SparseMatrix.from_dense(a_dense, a_pattern)
        b = SparseMatrix.from_dense(b_dense, b_pattern)
        c = SparseMatrix.from_dense(c_dense, c_pattern)
        return (
            a.dense(),
            a.matvec(x),
            a.rmatvec(x[:7]),
            a.T.dense(),
            sparse_matmul(a, b).dense(),
            sparse_add(a, c).dense(),
        )

    dense, matvec, rmatvec, transpose, product, total = operations(a_dense, b_dense, c_dense, x)
    np.testing.assert_allclose(dense, a_dense)
    np.testing.assert_allclose(matvec, a_dense @ x, atol=1e-14)
    np.testing.assert_allclose(rmatvec, a_dense.T @ x[:7], atol=1e-14)
    np.testing.assert_allclose(transpose, a_dense.T)
    np.testing.assert_allclose(product, a_dense @ b_dense, atol=1e-14)
    np.testing.assert_allclose(total, a_dense + c_dense, atol=1e-14)


def test_pattern_positions_find_each_entry():
    """`Pattern.positions` of every place of random patterns (empty ones too): an entry's
    index in the values, `nnz` off the pattern, as a table of the whole matrix says."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        shape = tuple(int(k) for k in rng.integers(1, 12, 2))
        pattern = Pattern.from_mask(rng.random(shape) < rng.random())
        table = np.full(shape, pattern.nnz, np.int64)
        table[pattern.rows, pattern.cols] = np.arange(pattern.nnz)
        np.testing.assert_array_equal(pattern.positions(*np.indices(shape)), table)


def test_colouring_is_valid():
    rng = np.random.default_rng(2)
    mask = rng.random((30, 40)) < 0.1
    colours = column_colouring(mask)
    for colour in np.unique(colours):
        assert np.all(mask[:, colours == colour].sum(axis=1) <= 1)
    banded = np.abs(np.arange(20)[:, None] - np.arange(20)[None]) <= 2
    assert column_colouring(banded).max() + 1 == 5


# -- structured against dense ---------------------------------------------------------------


class DenseChain(CartesianChain):
    structured_terms = False


class DenseLadder(FourBarLadder):
    structured_terms = False


class DenseNet(BarNet):
    structured_terms = False


class StructuredChain(CartesianChain):
    structured_terms = True


class StructuredLadder(FourBarLadder):
    structured_terms = True


class StructuredPendulum(NLinkPendulum):
    structured_terms = True


class DenseGivenMass(_GivenMass):
    structured_terms = False


@eqx.filter_jit
def _initial_state(model):
    # one program a model (eagerly, each operation of `initial_state` compiles alone)
    return model.initial_state()


@eqx.filter_jit
def _state(model):
    q, _ = model.initial_state()
    v = 0.3 * jnp.cos(jnp.arange(q.size, dtype=float))
    return q, v


FORMULATIONS = {
    "Baumgarte": jaxdae.Baumgarte(kd=20.0, kp=100.0),
    "PseudoInverse": jaxdae.PseudoInverse(kd=20.0, kp=100.0),
    "ModifiedLagrange": jaxdae.ModifiedLagrange(alpha=50.0, kd=20.0, kp=100.0),
    "CoupledPerturbation": jaxdae.CoupledPerturbation(k10=-100.0, k11=-20.0),
    "Unstabilized": jaxdae.Unstabilized(),
}


def _pairs():
    chain, ladder = StructuredChain(5), StructuredLadder(3)
    return {
        "chain": (chain, DenseChain(5), *_state(chain)),
        "ladder": (ladder, DenseLadder(3), *_state(ladder)),
    }


@eqx.filter_jit
def _everything(model, q, v, formulations):
    terms = model.terms(0.1, q, v)
    fields = [
        getattr(terms, f) for f in ("mass_matrix", "forces", "phi", "dphi", "jacobian", "bias")
    ]
    return fields, [f.accelerations(terms) for f in formulations], terms.mass_operator is None


@pytest.mark.slow
@pytest.mark.parametrize("family", ["chain", "ladder"])
def test_structured_terms_and_accelerations_agree(family):
    structured, dense, q, v = _pairs()[family]
    formulations = list(FORMULATIONS.values())
    if family == "chain":  # one dependent y per link
        formulations.append(jaxdae.RedundantCoordinates(dependent=tuple(range(1, q.size, 2))))
    fields_s, results_s, dense_s = _everything(structured, q, v, formulations)
    fields_d, results_d, dense_d = _everything(dense, q, v, formulations)
    assert not dense_s and dense_d
    for a, b in zip(fields_s, fields_d, strict=False):
        np.testing.assert_allclose(a, b, atol=1e-12)
    for formulation, (acc_s, lam_s), (acc_d, lam_d) in zip(
        formulations, results_s, results_d, strict=False
    ):
        name = type(formulation).__name__
        np.testing.assert_allclose(acc_s, acc_d, rtol=1e-10, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(lam_s, lam_d, rtol=1e-10, atol=1e-10, err_msg=name)


class _DrivenSkate(CartesianChain):
    """A chain whose first rod hangs from an anchor moving with `t` (`Φ_t`, `Φ_tt` and
    `Φ_tq` not zero), whose masses change with `t`, and whose last mass moves like a skate:
    its velocity across the last rod vanishes (a velocity constraint with `Ψ_t` and `Ψ_q`)."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * jnp.sum((1.0 + 0.1 * jnp.arange(q.size) * jnp.cos(t)) * v**2)

    def constraints(self, t, q):
        p = q.reshape(-1, 2)
        anchor = jnp.array([0.3 * jnp.sin(2.0 * t), 0.1 * t**2])
        previous = jnp.concatenate([anchor[None], p[:-1]])
        return jnp.sum((p - previous) ** 2, axis=-1) - 1.0

    def velocity_constraints(self, t, q, v):
        p, u = q.reshape(-1, 2), v.reshape(-1, 2)
        rod = p[-1] - p[-2]
        return jnp.array([(1.0 + 0.2 * t) * (rod[0] * u[-1, 1] - rod[1] * u[-1, 0])])


class _StructuredDrivenSkate(_DrivenSkate):
    structured_terms = True


class _DenseDrivenSkate(_DrivenSkate):
    structured_terms = False


def test_time_and_velocity_dependent_terms_agree():
    # Every term that the structured path takes from its derivative along the motion
    # (`Φ̇`, `γ`, `Ψ_t + Ψ_q v`, `d/dt ∂T/∂v`) or along the seeds (`M`, `J`, `A`).
    structured, dense = _StructuredDrivenSkate(4), _DenseDrivenSkate(4)
    q, v = _state(structured)
    fields_s, (acc_s,), dense_s = _everything(structured, q, v, [FORMULATIONS["Baumgarte"]])
    fields_d, (acc_d,), dense_d = _everything(dense, q, v, [FORMULATIONS["Baumgarte"]])
    assert not dense_s and dense_d
    for a, b in zip(fields_s, fields_d, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(acc_s[0], acc_d[0], rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_given_mass_agrees():
    q = jnp.array([0.0, 0.0, 1.0, 0.0, 1.0, -1.0, 2.0, -1.0])
    v = jnp.linspace(-1.0, 1.0, 8)
    formulations = [FORMULATIONS["Baumgarte"], FORMULATIONS["ModifiedLagrange"]]
    _, results_s, _ = _everything(_GivenMass(), q, v, formulations)
    _, results_d, _ = _everything(DenseGivenMass(), q, v, formulations)
    for (acc_s, lam_s), (acc_d, lam_d) in zip(results_s, results_d, strict=False):
        np.testing.assert_allclose(acc_s, acc_d, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(lam_s, lam_d, rtol=1e-10, atol=1e-10)


def test_failure_check_agrees_on_a_singular_chain():
    # the ladder's first cell turned horizontal: its rails are parallel to its rung, the
    # three constraint gradients dependent, `J M⁻¹ Jᵀ` singular; 12 cells: 36 constraints,
    # whose `J M⁻¹ Jᵀ` is banded (block LDLᵀ factorization)
    cells = 12
    q = (
        np.stack([np.ones(cells), -np.arange(cells), 2 * np.ones(cells), -np.arange(cells)], axis=1)
        .ravel()
        .astype(float)
    )
    v = np.zeros(4 * cells)
    formulation = FORMULATIONS["Baumgarte"]
    structured, dense = StructuredLadder(cells), DenseLadder(cells)
    q0, v0 = _state(structured)
    # one program (eagerly, each operation compiles alone)
    phi = eqx.filter_jit(lambda model, q: model.constraints(0.0, q))(structured, q)
    np.testing.assert_allclose(phi, 0.0, atol=1e-15)
    for model in (structured, dense):
        assert bool(_fails(model, formulation, q, v))
        assert not bool(_fails(model, formulation, q0, v0))


@eqx.filter_jit
def _fails(model, formulation, q, v):
    terms = model.terms(0.0, q, v)
    return formulation.failure(terms, formulation.failure_reference(terms))


def test_take_is_a_gather_both_ways():
    # `take` (the sparse algebra's gather) against indexing: values, padding, derivatives in
    # both modes, batching; its transpose is a gather too (no scatter in the program)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 3))
    index = np.array([[6, 0, 7], [2, 2, 1]])  # 7 = padding (zeros); 2 read twice

    def loss(fn, x):
        return jnp.sum(jnp.sin(fn(x)) * jnp.arange(18.0).reshape(2, 3, 3))

    def ours(x):
        return _gather.take(x, index)

    def reference(x):
        return jnp.concatenate([x, jnp.zeros((1, 3))])[index]

    # ours and the reference: values, derivatives in both modes and batched along either
    # axis, all in one program (eagerly, each operation compiles alone)
    losses = [lambda x, fn=fn: loss(fn, x) for fn in (ours, reference)]

    @jax.jit
    def pairs(x, batches):
        return [
            (ours(x), reference(x)),
            *(tuple(transform(f)(x) for f in losses) for transform in (jax.grad, jax.jacfwd)),
            *(
                tuple(jax.vmap(jax.grad(f), in_axes=axis)(batch) for f in losses)
                for axis, batch in enumerate(batches)
            ),
        ]

    batches = [np.stack([x, 2 * x], axis=axis) for axis in (0, 1)]
    (got, want), *derivatives = pairs(x, batches)
    np.testing.assert_array_equal(got, want)
    for got, want in derivatives:
        np.testing.assert_allclose(got, want, rtol=1e-14)
    program = jax.jit(jax.grad(lambda x: loss(ours, x))).lower(x).compile().as_text()
    assert " scatter(" not in program


def test_add_at_is_a_gather_both_ways():
    # `add_at`, `take`'s transpose, against `.at[].add` (repeated indices included), with
    # derivatives; no scatter in the program, and the sparsity analysis sees which rows it
    # writes
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 2))
    index = np.array([[4, 0], [0, 2]])  # row 0 added to twice; rows 1 and 3 untouched
    values = rng.standard_normal((2, 2, 2))

    def loss(fn, x, values):
        return jnp.sum(jnp.sin(fn(x, values)) * jnp.arange(10.0).reshape(5, 2))

    ours = lambda x, v: _gather.add_at(x, index, v)  # noqa: E731
    reference = lambda x, v: x.at[index].add(v)  # noqa: E731

    losses = [lambda x, v, fn=fn: loss(fn, x, v) for fn in (ours, reference)]

    @jax.jit  # values and derivatives in one program, as for `take`
    def pairs(x, values):
        return [
            (ours(x, values), reference(x, values)),
            *(
                tuple(transform(f, argnums=(0, 1))(x, values) for f in losses)
                for transform in (jax.grad, jax.jacfwd)
            ),
        ]

    (got, want), *derivatives = pairs(x, values)
    np.testing.assert_allclose(got, want, rtol=1e-15)
    for got, want in derivatives:
        for a, b in zip(got, want, strict=False):
            np.testing.assert_allclose(a, b, rtol=1e-14)
    gradient = jax.jit(jax.grad(lambda v: loss(ours, jnp.asarray(x), v)))
    assert " scatter(" not in gradient.lower(values).compile().as_text()
    (mask,) = nonzero_masks(lambda v: _gather.add_at(jnp.zeros((5, 2)), index, v), values)
    np.testing.assert_array_equal(mask.reshape(5, 2).any(axis=1), [True, False, True, False, True])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rows", "block rows", "cyclic"])
def test_banded_factorization(method, monkeypatch):
    # row by row (`BandCholeskyFactor`), block row by block row (`BandedFactor`) and by
    # cyclic reduction (the accelerators' default), each at every half-bandwidth
    monkeypatch.setattr(_thresholds, "BAND_CHOLESKY_MIN_WIDTH", 1 if method == "rows" else 10**6)
    cyclic = method == "cyclic"
    kinds = {
        "rows": _banded.BandCholeskyFactor,
        "block rows": _banded.BandedFactor,
        "cyclic": _banded.CyclicReductionFactor,
    }
    rng = np.random.default_rng(3)
    # (200, 9): blocks wider than the unrolled Cholesky's limit (loops per block);
    # (9, 1): a block count that is not a power of two, at the banded minimum
    for size, band in ((40, 1), (64, 3), (37, 2), (200, 9), (9, 1)):
        mask = np.abs(np.arange(size)[:, None] - np.arange(size)[None]) <= band
        permutation = rng.permutation(size)  # scrambled: found again by reordering
        mask = mask[permutation][:, permutation]
        noise = rng.standard_normal((size, size)) * mask
        matrix = (0.3 * (noise + noise.T) + 5 * np.eye(size)) * mask
        plan = banded_plan(Pattern.from_mask(mask))
        assert plan is not None and plan.width <= 2 * band
        rhs = rng.standard_normal((size, 2))
        sparse = SparseMatrix.from_dense(jnp.asarray(matrix), Pattern.from_mask(mask))
        # (a tridiagonal matrix by blocks: its scalar LDLᵀ)
        kind = _banded.TridiagonalFactor if (method, plan.width) == ("block rows", 1) else None
        assert isinstance(_banded.banded_factor(sparse, plan, cyclic), kind or kinds[method])
        solve = jax.jit(lambda a, b, plan=plan: banded_solve(a, b, plan, cyclic))
        x, pivots = solve(sparse, jnp.asarray(rhs))
        np.testing.assert_allclose(x, np.linalg.solve(matrix, rhs), atol=1e-13)
        assert pivots.shape == (size,)
        eigenvalues = np.linalg.eigvalsh(matrix)
        assert np.all(pivots >= eigenvalues[0] * (1 - 1e-12))
        assert np.all(pivots <= eigenvalues[-1] * (1 + 1e-12))
        if not cyclic:  # the pivots of one elimination order
            np.testing.assert_allclose(np.prod(pivots), np.linalg.det(matrix), rtol=1e-10)
        # not positive definite: a pivot says so
        shift = eigenvalues[0] + 0.5 * (
            eigenvalues[1] - eigenvalues[0]
        )  # one eigenvalue below zero
        shifted = matrix - shift * np.eye(size)
        _, pivots = solve(
            SparseMatrix.from_dense(jnp.asarray(shifted), Pattern.from_mask(mask)), jnp.asarray(rhs)
        )
        assert not np.all(np.asarray(pivots) > 0)
    assert banded_plan(Pattern.full((40, 40))) is None


def test_band_cholesky_several_rows_per_step(monkeypatch):
    # the band Cholesky's scan takes several rows per iteration on wide bands: the same
    # factor as one row per iteration (the same operations in the same order), for sizes
    # that are not a multiple of the rows per step, and a pivot that says where the matrix
    # is not positive definite
    rng = np.random.default_rng(11)
    for size, band in ((45, 5), (90, 17)):
        mask = np.abs(np.arange(size)[:, None] - np.arange(size)[None]) <= band
        noise = rng.standard_normal((size, size)) * mask
        matrix = (0.3 * (noise + noise.T) + 9 * np.eye(size)) * mask
        pattern = Pattern.from_mask(mask)
        plan = banded_plan(pattern)
        sparse = SparseMatrix.from_dense(jnp.asarray(matrix), pattern)
        factors = {}
        for per_step in (1, 4):
            monkeypatch.setattr(_thresholds, "BAND_CHOLESKY_UNROLL_WIDTH", 1)
            monkeypatch.setattr(_thresholds, "BAND_CHOLESKY_ROWS_PER_STEP", per_step)
            assert _banded.band_rows_per_step(plan.width) == per_step
            factors[per_step] = jax.jit(lambda a, plan=plan: _banded.banded_factor(a, plan, False))(
                sparse
            )
        assert isinstance(factors[4], _banded.BandCholeskyFactor)
        np.testing.assert_array_equal(factors[4].columns, factors[1].columns)
        # under vmap: each member's own factor
        batch = jnp.stack([sparse.values, 2 * sparse.values])
        batched = jax.jit(
            jax.vmap(
                lambda values, plan=plan, pattern=pattern: (
                    _banded.banded_factor(SparseMatrix(values, pattern), plan, False).columns
                )
            )
        )(batch)
        np.testing.assert_allclose(batched[0], factors[1].columns, rtol=1e-15)
        real = slice(0, size)  # (the plan's padding rows, at the end, hold the identity)
        np.testing.assert_allclose(
            batched[1][real], np.sqrt(2) * factors[1].columns[real], rtol=1e-12, atol=1e-15
        )
        rhs = rng.standard_normal(size)
        np.testing.assert_allclose(
            factors[4].solve(jnp.asarray(rhs)), np.linalg.solve(matrix, rhs), atol=1e-13
        )
        shifted = matrix - (np.linalg.eigvalsh(matrix)[0] + 0.1) * np.eye(size)
        factor = _banded.banded_factor(
            SparseMatrix.from_dense(jnp.asarray(shifted), pattern), plan, False
        )
        assert not np.all(np.asarray(factor.pivots) > 0)


def test_tridiagonal_factorization():
    # the scalar LDLᵀ of a tridiagonal matrix (a chain's `J M⁻¹ Jᵀ`), scrambled and found
    # again by reordering: the solve and pivots against NumPy's, derivatives against the
    # dense solve's in reverse and forward mode and under vmap, float32, and nan (not a
    # finite wrong answer) where the matrix is not positive definite
    size = 12
    rng = np.random.default_rng(11)
    permutation = rng.permutation(size)
    band = np.abs(np.arange(size)[:, None] - np.arange(size)[None]) <= 1
    mask = band[permutation][:, permutation]
    noise = rng.standard_normal((size, size)) * mask
    matrix = (0.3 * (noise + noise.T) + 3 * np.eye(size)) * mask
    pattern = Pattern.from_mask(mask)
    plan = banded_plan(pattern)
    assert plan.width == 1
    values = jnp.asarray(matrix[pattern.rows, pattern.cols])
    rhs = jnp.asarray(rng.standard_normal((size, 2)))
    assert isinstance(
        _banded.banded_factor(SparseMatrix(values, pattern), plan, False), _banded.TridiagonalFactor
    )

    def loss(solve, values, rhs):
        return jnp.sum(jnp.sin(solve(values, rhs)) * jnp.arange(1.0, 3.0))

    def ours(values, rhs):
        return banded_solve(SparseMatrix(values, pattern), rhs, plan, False)[0]

    def dense(values, rhs):
        return jnp.linalg.solve(SparseMatrix(values, pattern).dense(), rhs)

    @jax.jit
    def results(values, rhs):
        x, pivots = banded_solve(SparseMatrix(values, pattern), rhs, plan, False)
        batch = jnp.stack([rhs, 2 * rhs])
        derivatives = [
            (
                transform(lambda v, r: loss(ours, v, r), argnums=(0, 1))(values, rhs),
                transform(lambda v, r: loss(dense, v, r), argnums=(0, 1))(values, rhs),
            )
            for transform in (jax.grad, jax.jacfwd)
        ]
        batched = [
            jax.vmap(jax.grad(lambda r, f=f: loss(f, values, r)))(batch) for f in (ours, dense)
        ]
        return x, pivots, derivatives, batched

    x, pivots, derivatives, (batched, batched_dense) = results(values, rhs)
    np.testing.assert_allclose(x, np.linalg.solve(matrix, rhs), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.prod(pivots), np.linalg.det(matrix), rtol=1e-12)
    for got, want in derivatives:
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(batched, batched_dense, rtol=1e-11, atol=1e-13)
    x32 = jax.jit(ours)(values.astype(jnp.float32), rhs.astype(jnp.float32))
    assert x32.dtype == jnp.float32
    np.testing.assert_allclose(x32, x, rtol=1e-4, atol=1e-5)
    shifted = matrix - (np.linalg.eigvalsh(matrix)[0] + 1e-3) * np.eye(size)
    x_bad, pivots_bad = results(jnp.asarray(shifted[pattern.rows, pattern.cols]), rhs)[:2]
    assert not np.all(np.isfinite(x_bad)) and not np.all(np.asarray(pivots_bad) > 0)


def test_cyclic_reduction_in_float32():
    # cyclic reduction alone leaves a float32 residual of 1e-2 on an ill-conditioned
    # (Laplacian-like, condition 6e4) band; with its refinement step, as small as the
    # sequential factorization's
    size = 200
    matrix = 2 * np.eye(size) - np.eye(size, k=1) - np.eye(size, k=-1)
    matrix[0, 0] = 1.001
    pattern = Pattern.from_mask(matrix != 0)
    plan = banded_plan(pattern)
    values = jnp.asarray(matrix[pattern.rows, pattern.cols], jnp.float32)
    rhs = np.random.default_rng(0).standard_normal(size)
    residuals = {}
    for cyclic in (False, True):  # one program each (eagerly, each operation compiles alone)
        x, _ = eqx.filter_jit(banded_solve)(
            SparseMatrix(values, pattern), jnp.asarray(rhs, jnp.float32), plan, cyclic
        )
        assert x.dtype == jnp.float32
        residuals[cyclic] = np.max(np.abs(matrix @ np.asarray(x, np.float64) - rhs))
    assert residuals[True] < 1e-4 * np.max(np.abs(rhs))
    assert residuals[True] < 2 * residuals[False]


@pytest.mark.slow
@pytest.mark.parametrize("rows", [True, False], ids=["rows", "block rows"])
@pytest.mark.parametrize("size,band", [(48, 2), (96, 9)])
def test_banded_solve_derivatives(size, band, rows, monkeypatch):
    # implicit derivatives (a solve with the same factor) against the dense solve's, in
    # reverse and forward mode and, for the sequential factorization and cyclic
    # reduction, under vmap; row by row, and by blocks of 2 rows (unrolled) and of 9
    # (loops, whose tangent solves reverse mode must transpose)
    monkeypatch.setattr(_thresholds, "BAND_CHOLESKY_MIN_WIDTH", 1 if rows else 10**6)
    rng = np.random.default_rng(5)
    mask = np.abs(np.arange(size)[:, None] - np.arange(size)[None]) <= band
    noise = rng.standard_normal((size, size)) * mask
    matrix = (0.3 * (noise + noise.T) + 5 * np.eye(size)) * mask
    pattern = Pattern.from_mask(mask)
    plan = banded_plan(pattern)
    assert (plan.width > _thresholds.UNROLL_MAX) == (band > 2)
    values = jnp.asarray(matrix[pattern.rows, pattern.cols])
    rhs = jnp.asarray(rng.standard_normal(size))

    def banded(values, rhs, cyclic=False):
        return jnp.sum(jnp.sin(banded_solve(SparseMatrix(values, pattern), rhs, plan, cyclic)[0]))

    def dense(values, rhs):
        return jnp.sum(jnp.sin(jnp.linalg.solve(SparseMatrix(values, pattern).dense(), rhs)))

    for transform in (jax.grad, jax.jacfwd):
        got = jax.jit(transform(banded, argnums=(0, 1)))(values, rhs)
        want = transform(dense, argnums=(0, 1))(values, rhs)
        for a, b in zip(got, want, strict=False):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    batch = jnp.stack([rhs, 2 * rhs])
    want = jax.vmap(jax.grad(dense, argnums=1), in_axes=(None, 0))(values, batch)
    for cyclic in (False, True):
        got = jax.jit(
            jax.vmap(jax.grad(lambda v, r, c=cyclic: banded(v, r, c), argnums=1), in_axes=(None, 0))
        )(values, batch)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_banded_multiplier_solve_derivatives():
    # `multiplier_solve` on sparse `M` (2 × 2 blocks) and `G` (a chain's pattern) whose
    # `G M⁻¹ Gᵀ` is banded: values and derivatives (reverse, forward, under vmap) with
    # respect to `M`, `G`, `Q` and the target against the dense elimination's (`M`'s
    # symmetric part, which the block inverse reads)
    from jaxdae._compilation._linear_solvers import StructuredCholesky
    from jaxdae._formulations._multipliers import multiplier_solve
    from jaxdae._systems._system import ConstrainedTerms

    rng = np.random.default_rng(7)
    links = 32
    n = 2 * links
    rows = np.repeat(np.arange(links), 4)[2:]
    cols = np.concatenate([[0, 1], (2 * np.arange(links)[1:, None] + np.arange(-2, 2)).ravel()])
    g_pattern = Pattern((links, n), rows, cols)
    blocks = np.kron(np.eye(links), np.ones((2, 2))) > 0
    m_pattern = Pattern.from_mask(blocks)
    noise = 0.3 * rng.standard_normal((n, n))
    mass = np.where(blocks, noise + noise.T + 3 * np.eye(n), 0.0)
    m_values = jnp.asarray(mass[m_pattern.rows, m_pattern.cols])
    g_values = jnp.asarray(rng.standard_normal(g_pattern.nnz))
    forces, target = (jnp.asarray(rng.standard_normal(size)) for size in (n, links))
    empty = jnp.zeros((0,))

    def structured(m_values, g_values, forces, target):
        mass, g = SparseMatrix(m_values, m_pattern), SparseMatrix(g_values, g_pattern)
        terms = ConstrainedTerms(
            mass.dense(),
            forces,
            target,
            target,
            empty,
            g.dense(),
            target,
            mass_operator=SparseOperator(mass, lx.positive_semidefinite_tag),
            jacobian_operator=SparseOperator(g),
        )
        return multiplier_solve(terms, target, StructuredCholesky())

    def dense(m_values, g_values, forces, target):
        mass = SparseMatrix(m_values, m_pattern).dense()
        mass = 0.5 * (mass + mass.T)
        g = SparseMatrix(g_values, g_pattern).dense()
        minv_gt = jnp.linalg.solve(mass, g.T)
        lam = jnp.linalg.solve(g @ minv_gt, g @ jnp.linalg.solve(mass, forces) - target)
        return jnp.linalg.solve(mass, forces) - minv_gt @ lam, lam

    args = (m_values, g_values, forces, target)
    assert (
        banded_plan(
            sparse_matmul(
                SparseMatrix(g_values, g_pattern), SparseMatrix(g_values, g_pattern).T
            ).pattern
        )
        is not None
    )
    assert "name=_banded_multipliers" in str(jax.make_jaxpr(structured)(*args))
    for a, b in zip(jax.jit(structured)(*args), dense(*args), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)

    def loss(fn):
        return lambda *x: sum(
            jnp.sum(jnp.sin(out) * w) for out, w in zip(fn(*x), (1.0, 0.7), strict=False)
        )

    tangents = tuple(jnp.asarray(rng.standard_normal(x.shape)) for x in args)
    batch = jnp.stack([forces, 2 * forces])

    def derivatives(fn):
        return (
            jax.grad(loss(fn), argnums=(0, 1, 2, 3))(*args),
            jax.jvp(fn, args, tangents),
            jax.vmap(jax.grad(loss(fn), argnums=(1, 2)), in_axes=(None, None, 0, None))(
                m_values, g_values, batch, target
            ),
        )

    derivatives = jax.jit(derivatives, static_argnums=0)
    for a, b in zip(
        *(jax.tree.leaves(derivatives(fn)) for fn in (structured, dense)), strict=False
    ):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_banded_path_agrees(monkeypatch):
    # banded factorizations from 4 rows on (32 by default), so that a small chain's
    # `J M⁻¹ Jᵀ` (9 × 9, tridiagonal) uses one
    monkeypatch.setattr(_thresholds, "BANDED_MIN", 4)
    _banded.banded_plan.cache_clear()
    structured, dense = StructuredChain(9), DenseChain(9)
    assert banded_plan(structured.terms(0.0, *_state(structured)).mass_operator.matrix.pattern)
    q, v = _state(structured)
    formulations = [FORMULATIONS["Baumgarte"], FORMULATIONS["ModifiedLagrange"]]
    _, results_s, dense_s = _everything(structured, q, v, formulations)
    _, results_d, _ = _everything(dense, q, v, formulations)
    assert not dense_s
    for (acc_s, lam_s), (acc_d, lam_d) in zip(results_s, results_d, strict=False):
        np.testing.assert_allclose(acc_s, acc_d, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(lam_s, lam_d, rtol=1e-10, atol=1e-10)
    # gradients through the banded path: w.r.t. the gains, the state and the parameters
    grad_s = _acceleration_gradient(structured, formulations, q, v)
    grad_d = _acceleration_gradient(dense, formulations, q, v)
    for a, b in zip(
        jax.tree_util.tree_leaves(grad_s), jax.tree_util.tree_leaves(grad_d), strict=False
    ):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    _banded.banded_plan.cache_clear()


@pytest.mark.slow
def test_gradients_through_wide_bands():
    # a net of 9 × 5 nodes: `J M⁻¹ Jᵀ` (81 × 81) of half-bandwidth 9, factorized row by
    # row; reverse mode transposes the tangent solves of the banded multipliers' derivative
    structured, dense = BarNet(9), DenseNet(9)
    q, _ = structured.initial_state()
    v = 0.3 * jnp.cos(jnp.arange(q.size, dtype=float))
    terms = structured.terms(0.0, q, v)
    g = terms.jacobian_operator.matrix
    assert banded_plan(sparse_matmul(g, g.T).pattern).width > _thresholds.UNROLL_MAX
    formulations = [FORMULATIONS["Baumgarte"]]
    grad_s = _acceleration_gradient(structured, formulations, q, v)
    grad_d = _acceleration_gradient(dense, formulations, q, v)
    for a, b in zip(
        jax.tree_util.tree_leaves(grad_s), jax.tree_util.tree_leaves(grad_d), strict=False
    ):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.max(np.abs(b)))


@eqx.filter_jit
def _acceleration_gradient(model, formulations, q, v):
    def loss(diff):
        model_, formulations_, q_, v_ = diff
        terms = model_.terms(0.1, q_, v_)
        return sum(jnp.sum(jnp.sin(f.accelerations(terms)[0])) for f in formulations_)

    return eqx.filter_grad(loss)((model, formulations, q, v))


@eqx.filter_jit
def _final(model, formulation, q0, v0):
    sol = jaxdae.simulate(model, formulation, 0.0, 0.3, q0, v0, rtol=1e-10, atol=1e-12)
    return sol.q_final, sol.v_final


@eqx.filter_jit
def _gradient(model, formulation, q0, v0):
    def loss(diff):
        formulation_, v0_ = diff
        sol = jaxdae.simulate(model, formulation_, 0.0, 0.3, q0, v0_, rtol=1e-10, atol=1e-12)
        return jnp.sum(sol.q_final**2)

    return eqx.filter_grad(loss)((formulation, v0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Baumgarte", "ModifiedLagrange"])
def test_simulations_and_gradients_agree(name):
    # 17 links, 34 coordinates: structured by default (not re-traced as a scalar graph)
    structured, dense = CartesianChain(17), DenseChain(17)
    q0, v0 = _state(structured)
    formulation = FORMULATIONS[name]
    for a, b in zip(
        _final(structured, formulation, q0, v0), _final(dense, formulation, q0, v0), strict=False
    ):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    grad_s = _gradient(structured, formulation, q0, v0)
    grad_d = _gradient(dense, formulation, q0, v0)
    for a, b in zip(
        jax.tree_util.tree_leaves(grad_s), jax.tree_util.tree_leaves(grad_d), strict=False
    ):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


# -- a constant mass matrix factored once per solve ----------------------------------------


class _ConstantMass(jaxdae.LagrangianSystem):
    """Point masses in the plane joined by unit bars (as `CartesianChain`), with a constant
    mass matrix that is not diagonal: 2 × 2 blocks per point, and with `coupled` every
    coordinate coupled to the next (one connected block: a dense Cholesky factor)."""

    structured_terms = True
    masses: jax.Array
    coupled: bool = eqx.field(static=True)

    def kinetic_energy(self, t, q, v):
        w = v.reshape(-1, 2)
        energy = 0.5 * jnp.sum(self.masses[:, None] * w**2) + 0.25 * jnp.sum(
            self.masses * w[:, 0] * w[:, 1]
        )
        return energy + 0.1 * jnp.sum(v[1:] * v[:-1]) if self.coupled else energy

    def potential_energy(self, t, q):
        return 9.81 * jnp.sum(self.masses * q[1::2])

    def constraints(self, t, q):
        p = q.reshape(-1, 2)
        previous = jnp.concatenate([jnp.zeros((1, 2), q.dtype), p[:-1]])
        return jnp.sum((p - previous) ** 2, axis=-1) - 1.0


_MASS_FORMULATIONS = ["Baumgarte", "PseudoInverse", "Unstabilized"]


@eqx.filter_jit
def _accelerations_with_factor(model, q, v):
    from jaxdae._systems._structure import constant_mass_factor, with_mass_factor

    terms = model.terms(0.1, q, v)
    factored = with_mass_factor(terms, constant_mass_factor(model, 0.0, q, v))
    return [
        (FORMULATIONS[name].accelerations(factored), FORMULATIONS[name].accelerations(terms))
        for name in _MASS_FORMULATIONS
    ]


@pytest.mark.slow
@pytest.mark.parametrize("coupled", [False, True])
def test_constant_mass_factor(coupled):
    from jaxdae._systems._structure import constant_mass_factor

    q0, _ = CartesianChain(8).initial_state()
    v0 = 0.3 * jnp.cos(jnp.arange(16.0))
    model = _ConstantMass(jnp.linspace(1.0, 2.0, 8), coupled)
    factor = constant_mass_factor(model, 0.0, q0, v0)
    # 2 × 2 blocks: inverted block by block; 16 coupled coordinates: one Cholesky factor
    assert (factor.inverse is None) == coupled and (factor.cholesky is None) != coupled
    terms = model.terms(0.0, q0, v0)
    np.testing.assert_allclose(factor.solve(terms.mass_matrix), np.eye(16), atol=1e-13)
    # a mass matrix that depends on the state is not factored ahead
    pendulum = StructuredPendulum(40)
    assert constant_mass_factor(pendulum, 0.0, *pendulum.initial_state()) is None
    # the formulations that solve with `M⁻¹` give the same accelerations and multipliers
    for name, (with_factor, without) in zip(
        _MASS_FORMULATIONS, _accelerations_with_factor(model, q0, v0), strict=False
    ):
        for a, b in zip(with_factor, without, strict=False):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.slow
def test_constant_mass_factor_in_simulate():
    # the solve factors `M` once (passed to every right-hand side) and ends where a solve
    # that factors it at every stage ends; its derivative with respect to the masses goes
    # through that one factor: against central differences
    from jaxdae._integration import _trajectories

    q0, v0 = CartesianChain(8).initial_state()
    formulation = FORMULATIONS["Baumgarte"]

    def loss(masses):
        model = _ConstantMass(masses, True)
        sol = jaxdae.simulate(model, formulation, 0.0, 0.3, q0, v0, rtol=1e-11, atol=1e-12)
        return jnp.sum(sol.q_final**2)

    masses = jnp.linspace(1.0, 2.0, 8)
    calls = []
    original = _trajectories.constant_mass_factor

    def per_stage(*args, **kwargs):  # returns None: the right-hand side factors `M` itself
        calls.append(original(*args, **kwargs))

    _trajectories.constant_mass_factor = per_stage
    try:
        unfactored = jax.jit(loss)(masses)
    finally:
        _trajectories.constant_mass_factor = original
    assert calls and calls[0] is not None
    value, got = jax.jit(jax.value_and_grad(loss))(masses)
    np.testing.assert_allclose(value, unfactored, rtol=1e-12)
    eps = 1e-5
    steps = eps * jnp.eye(8)[jnp.array([0, 3, 7])]
    ends = jax.jit(jax.vmap(loss))(jnp.concatenate([masses + steps, masses - steps]))
    np.testing.assert_allclose(
        got[jnp.array([0, 3, 7])], (ends[:3] - ends[3:]) / (2 * eps), rtol=1e-6, atol=1e-9
    )


# Slow (about 20 s each, mostly compiling): the constant factor itself is checked in the
# default run by `test_constant_mass_factor`.
@pytest.mark.slow
@pytest.mark.parametrize(
    "adjoint",
    [
        pytest.param(jaxdae.ReverseSweepAdjoint(), id="reverse-sweep"),
        pytest.param(diffrax.RecursiveCheckpointAdjoint(), id="checkpoint"),
    ],
)
def test_ensemble_shares_one_mass_factor(adjoint):
    # an ensemble's trajectories share the system: its constant `M` is factored once for all
    # of them, and the gradient with respect to the masses (the reverse sweep's own row-wise
    # products included) goes through that factor: against the trajectories solved one by one
    from jaxdae._integration import _trajectories

    q0, _ = CartesianChain(3).initial_state()
    rows = jnp.stack([q0, q0 + 0.01, q0 - 0.02])
    v0 = 0.1 * jnp.sin(jnp.arange(18.0)).reshape(3, 6)
    formulation = FORMULATIONS["Baumgarte"]
    options = dict(rtol=1e-10, atol=1e-12, adjoint=adjoint)

    def loss(masses, ensemble):
        model = _ConstantMass(masses, True)
        if ensemble:
            return jnp.sum(
                jaxdae.simulate_ensemble(model, formulation, 0.0, 0.2, rows, v0, **options).q_final
                ** 2
            )

        def one(q, v):
            return jaxdae.simulate(model, formulation, 0.0, 0.2, q, v, **options).q_final

        return jnp.sum(jax.vmap(one)(rows, v0) ** 2)

    masses = jnp.array([1.0, 1.5, 2.0])
    factors = []
    original = _trajectories.constant_mass_factor

    def recorded(*args, **kwargs):
        factors.append(original(*args, **kwargs))
        return factors[-1]

    _trajectories.constant_mass_factor = recorded
    try:
        value, grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)(masses, True)
    finally:
        _trajectories.constant_mass_factor = original
    # one factor, of one matrix: here the 36 entries of the dense `M⁻¹`
    assert factors and all(
        f is not None and {x.shape for x in jax.tree.leaves(f)} == {(36,)} for f in factors
    )
    expected, expected_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)(masses, False)
    np.testing.assert_allclose(value, expected, rtol=1e-10)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-7)


# -- what a solve's loop may hold ------------------------------------------------------------


class _ChainWithLevelCentre(CartesianChain):
    """The chain whose nodes' mean height is also held: a constraint on every node, so
    `J M⁻¹ Jᵀ` is not banded and is factorized densely (by the loop up to `LOOPED_MAX`)."""

    def constraints(self, t, q):
        heights = q.reshape(-1, 2)[:, 1]
        return jnp.concatenate([super().constraints(t, q), jnp.mean(heights)[None] + 1.0])


@pytest.mark.slow
@pytest.mark.perf(
    reason="pins which primitives the right-hand side of small structured models traces"
)
@pytest.mark.parametrize(
    "model",
    [
        CartesianChain(8),
        CartesianChain(16),
        FourBarLadder(4),
        FourBarLadder(8),
        _ChainWithLevelCentre(12),
    ],
    ids=["chain-8", "chain-16", "ladder-4", "ladder-8", "dense-13"],
)
def test_right_hand_side_runs_in_one_kernel(model):
    """The right-hand side evaluated at every stage, its vector–Jacobian product (the
    reverse sweep's) and the failure indicator of constrained models with 16 to 32
    coordinates hold no scatter, sort or custom call: each would make XLA:CPU run a solve
    kernel by kernel (the chain of 8 links took 4× the time per step with the scatter of its
    constraint matrix into a dense one). The chains and ladders take the banded
    factorization, the chain with its centre's height held the dense loop."""
    from jaxdae._integration._vector_fields import failure_reference, jitted_failure, jitted_rates

    formulation = jaxdae.Baumgarte(20.0, 100.0)
    q, v = model.initial_state()
    terms = model.terms(0.0, q, v)
    banded = (
        _banded.banded_plan(
            sparse_matmul(terms.jacobian_operator.matrix, terms.jacobian_operator.matrix.T).pattern
        )
        is not None
    )
    assert banded == (not isinstance(model, _ChainWithLevelCentre))
    reference = failure_reference(model, formulation, 0.0, q, v)

    def rates_and_vjp(q, v):
        out, pull = jax.vjp(lambda q, v: jitted_rates(model, formulation, 0.0, q, v), q, v)
        return out, pull(out), jitted_failure(model, formulation, 0.0, q, v, reference)

    jaxpr = jax.make_jaxpr(rates_and_vjp)(q, v).jaxpr
    found = not_in_a_loop(jaxpr)
    assert not found, found


class _ChainClosedTwice(CartesianChain):
    """The chain with its last link's length constraint written twice: `J M⁻¹ Jᵀ` is singular
    everywhere, so `PseudoInverse` takes its rank-deficient branch at every evaluation."""

    def constraints(self, t, q):
        phi = super().constraints(t, q)
        return jnp.concatenate([phi, phi[-1:]])


@pytest.mark.slow
@pytest.mark.perf(reason="pins that PseudoInverse's right-hand side compiles into one kernel")
@pytest.mark.parametrize(
    "model", [CartesianChain(5), _ChainClosedTwice(5)], ids=["independent", "redundant"]
)
def test_pseudo_inverse_loop_holds_no_lapack_call(model):
    """A loop of `PseudoInverse`'s right-hand side holds no custom call, in either branch of
    its solve (the factorization, or the pivoted one for a rank-deficient `J M⁻¹ Jᵀ`), and
    XLA compiles it into one kernel (`xla_cpu_small_call`): a LAPACK eigendecomposition in
    the untaken branch made a step of the chain of 5 links cost 6× `Baumgarte`'s. The
    rank-deficient branch gives the multipliers of `lineax.SVD`."""
    from jaxdae._compilation._linear_solvers import PositiveSemidefinitePseudoInverse
    from jaxdae._integration._vector_fields import system_terms
    from jaxdae._systems._structure import constant_mass_factor

    formulation = jaxdae.PseudoInverse(20.0, 100.0)
    q, v = model.initial_state()
    mass_factor = constant_mass_factor(model, 0.0, q, v, system_terms)  # once per solve
    assert_rates_loop_is_one_kernel(model, formulation, q, v, mass_factor)
    from jaxdae._formulations._multipliers import multiplier_solve

    terms = model.terms(0.0, q, v)
    target = jnp.linspace(-1.0, 1.0, terms.phi.shape[0])
    rcond = float(np.sqrt(np.finfo(q.dtype).eps))
    for x, y in zip(
        multiplier_solve(terms, target, PositiveSemidefinitePseudoInverse()),
        multiplier_solve(terms, target, lx.SVD(rcond=rcond)),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-11)
