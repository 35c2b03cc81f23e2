"""The mesh families of `experiments/benchmarks/bench_sparse.py` (`jaxdae/examples/_meshes.py`)
on small sizes: consistent initial states, the structure jaxdae finds (the mesh's, not
dense), a short stabilized simulation, and the benchmark's peers (hand-written right-hand
side, CasADi) against jaxdae's equations."""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._compilation._operators import SparseOperator
from jaxdae._formulations._multipliers import eliminate
from jaxdae.examples._meshes import (
    FAMILIES,
    Cloth,
    FourBarChain,
    PrattTruss,
    SpaceFrame,
    SquareNet,
    family_size,
)
from jaxdae.examples._scaling import casadi_baumgarte_ode

GAINS = (20.0, 100.0)
# Small sizes, each above the 8 coordinates from which jaxdae derives structured terms.
SIZES = {"square": 4, "cloth": 3, "truss": 6, "frame": 2, "fourbars": 5}
# `(coordinates, constraints)` at size `N`, as the docstrings count them.
COUNTS = {
    SquareNet: lambda n: (2 * n * n - 4, 2 * n * (n - 1)),
    Cloth: lambda n: (3 * n * n - 6, (n - 1) * (3 * n - 1)),
    PrattTruss: lambda n: (4 * n, 3 * n + 1 + (n + 1) // 2),
    SpaceFrame: lambda n: (3 * n**3, n**3 + 2 * n * n * (n - 1)),
    FourBarChain: lambda n: (2 * n + 2, 2 * n + 1),
}


@functools.cache
def model(family):
    return FAMILIES[family](SIZES[family])


@functools.cache
def state(family):
    """`(q, v)`: the initial configuration with velocities that are not tangent to the
    constraints."""
    q, _ = model(family).initial_state()
    # NumPy (eagerly, each JAX operation on a new shape compiles alone)
    return q, 0.3 * np.cos(np.arange(q.size, dtype=float))


@eqx.filter_jit
def accelerations(system, q, v):
    return jaxdae.Baumgarte(*GAINS).accelerations(system.terms(0.0, q, v))[0]


@functools.cache
def jaxdae_rate(family):
    return accelerations(model(family), *state(family))


@eqx.filter_jit
def _constraints_and_jacobian(system, q):
    # one program a case (eagerly, each operation of `Φ` and of its Jacobian compiles alone)
    return system.constraints(0.0, q), jax.jacfwd(system.constraints, argnums=1)(0.0, q)


@pytest.mark.parametrize("cls", list(COUNTS))
@pytest.mark.parametrize("size", [4, 5])
def test_initial_states_are_consistent_and_counted(cls, size):
    system = cls(size)
    q0, v0 = system.initial_state()
    phi, jac = _constraints_and_jacobian(system, q0)
    assert (q0.size, phi.size) == COUNTS[cls](size) == (cls.coordinates(size), phi.size)
    np.testing.assert_allclose(phi, 0.0, atol=1e-12)
    np.testing.assert_array_equal(v0, 0.0)
    # A mechanism whose constraints are independent there: `J` has full row rank.
    jac = np.asarray(jac)
    assert phi.size < q0.size
    assert np.linalg.svd(jac, compute_uv=False).min() > 1e-2


def _pattern(family):
    """The pattern of `J M⁻¹ Jᵀ` that jaxdae's terms carry, and whether they carry `M` and
    `J` as sparse operators."""
    system = model(family)
    found = {}

    def matrix(q, v):
        terms = system.terms(0.0, q, v)
        found["operators"] = [terms.mass_operator, terms.jacobian_operator]
        elimination = eliminate(terms)
        found["pattern"] = elimination.sparse_matrix.pattern
        return elimination.matrix

    jax.eval_shape(matrix, *state(family))
    return found["pattern"], found["operators"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_constraint_matrix_has_the_mesh_pattern(family):
    """Entry `(e, f)` of `J M⁻¹ Jᵀ` may be non-zero exactly where bars `e` and `f` share a
    free node: the mesh's adjacency, not a dense matrix."""
    pattern, operators = _pattern(family)
    assert all(isinstance(op, SparseOperator) for op in operators)
    top = model(family).topology()
    free = top.rest.shape[0]
    incidence = np.zeros((top.first.size, free), bool)
    bars = np.arange(top.first.size)
    incidence[bars, top.first] = True
    incidence[bars[top.second < free], top.second[top.second < free]] = True
    expected = (incidence.astype(int) @ incidence.T.astype(int)) > 0
    np.testing.assert_array_equal(pattern.mask(), expected)
    assert pattern.density < 0.5


def test_larger_mesh_is_sparse():
    system = SquareNet(8)
    q, v = system.initial_state()
    found = {}

    def matrix(q, v):
        elimination = eliminate(system.terms(0.0, q, v))
        found["pattern"] = elimination.sparse_matrix.pattern
        return elimination.matrix

    jax.eval_shape(matrix, q, v)
    rows = found["pattern"].shape[0]
    assert rows == 2 * 8 * 7
    assert found["pattern"].nnz <= 7 * rows  # a bar meets at most 6 others


@eqx.filter_jit
def _simulate(system, q0, v0):
    sol = jaxdae.simulate(
        system,
        jaxdae.Baumgarte(*GAINS),
        0.0,
        0.3,
        q0,
        v0,
        solver=diffrax.Tsit5(),
        rtol=1e-7,
        atol=1e-9,
        ts=jnp.linspace(0.0, 0.3, 4),
    )
    return sol.q, sol.phi, sol.dphi


@pytest.mark.parametrize("family", list(FAMILIES))
def test_short_simulation_moves_and_keeps_the_constraints(family):
    system = model(family)
    q0, v0 = system.initial_state()
    q, phi, dphi = (np.asarray(x) for x in _simulate(system, q0, v0))
    assert np.max(np.abs(q[-1] - q0)) > 1e-2  # it falls
    assert np.max(np.abs(phi)) < 1e-7
    assert np.max(np.abs(dphi)) < 1e-6


@pytest.mark.parametrize("family", list(FAMILIES))
def test_handwritten_rhs_matches_jaxdae(family):
    system, (q, v) = model(family), state(family)
    rate = np.asarray(jax.jit(system.handwritten_rhs())(0.0, np.concatenate([q, v]), GAINS))
    np.testing.assert_array_equal(rate[: q.size], v)
    np.testing.assert_allclose(rate[q.size :], jaxdae_rate(family), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_casadi_ode_matches_jaxdae(family):
    ca = pytest.importorskip("casadi")
    system, (q, v) = model(family), state(family)
    dae = casadi_baumgarte_ode(ca, system)
    rate = ca.Function("f", [dae["x"], dae["p"]], [dae["ode"]])(
        np.concatenate([q, v]), np.array(GAINS)
    )
    np.testing.assert_allclose(
        np.asarray(rate).ravel()[q.size :], jaxdae_rate(family), rtol=1e-11, atol=1e-11
    )


def test_sizes_are_checked_and_chosen():
    for cls in FAMILIES.values():
        with pytest.raises(ValueError, match="at least"):
            cls(cls.min_size - 1)
    assert family_size("square", 200) == 10  # 196 coordinates
    assert family_size("frame", 1000) == 7  # 1029
    assert family_size("truss", 1) == PrattTruss.min_size
