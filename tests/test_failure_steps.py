"""The failure test of the exact-multiplier formulations read from the rates of each step's
last stage (`_integration/_solve.py`, `StopAtFailure`): the pivots it reads are those of the
factorization the multipliers are solved with, and a solve stops where, and with the
result that, the test as a `diffrax.Event` after every step stops it."""

import diffrax
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import jaxdae
from jaxdae._compilation._linear_solvers import StructuredCholesky
from jaxdae._formulations._multipliers import eliminate, pivot_range, recording_pivots
from jaxdae._integration._solve import last_stage_in_state
from jaxdae._integration._vector_fields import system_terms
from jaxdae.examples import TwoLinkManipulator
from jaxdae.examples._meshes import Cloth
from jaxdae.examples._slider_crank import slider_crank


class EventTsit5(diffrax.Tsit5):
    """`diffrax.Tsit5` declared as keeping no last stage: its solves test the failure as a
    `diffrax.Event` after every step, the reference here."""


last_stage_in_state.register(EventTsit5, lambda solver: None)


def _terms_at(system, q, v):
    return system_terms(system, jnp.asarray(0.0), q, v)


# One system per way `multiplier_solve` solves: closed-form pivots (two constraints), a
# dense factorization of a sparse `G M⁻¹ Gᵀ` (eight), a banded plan (a small cloth).
SYSTEMS = {
    "two-link": TwoLinkManipulator,
    "slider-crank": slider_crank,
    "cloth": lambda: Cloth(3),
}


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_the_solve_records_the_pivots_of_its_factorization(name):
    system = SYSTEMS[name]()
    q0, v0 = system.initial_state()
    formulation = jaxdae.Baumgarte(10.0, 25.0)
    terms = _terms_at(system, q0, v0)
    with recording_pivots() as record:
        accelerations = formulation.accelerations(terms)
    assert len(record) == 1 and record[0][0] is terms
    recorded, separate = record[0][1], pivot_range(eliminate(terms))
    np.testing.assert_allclose(recorded.smallest, separate.smallest, rtol=1e-12)
    np.testing.assert_allclose(recorded.largest, separate.largest, rtol=1e-12)
    assert bool(recorded.finite)
    # The accelerations are those of the plain call.
    plain = formulation.accelerations(terms)
    np.testing.assert_allclose(accelerations[0], plain[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_shared_failure_test_is_the_formulations_own(name):
    """At the start and where the reference scale makes the test fail (a reference far
    above the pivots), the shared test gives the flag of `failure`."""
    system = SYSTEMS[name]()
    q0, v0 = system.initial_state()
    formulation = jaxdae.Baumgarte(10.0, 25.0)
    terms = _terms_at(system, q0, v0)
    reference = formulation.failure_reference(terms)
    for scale in (1.0, 1e12):
        (acc, lam), flag = formulation.accelerations_and_failure(terms, scale * reference)
        assert bool(flag) == bool(formulation.failure(terms, scale * reference)) == (scale > 1)
        plain_acc, plain_lam = formulation.accelerations(terms)
        np.testing.assert_allclose(acc, plain_acc, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lam, plain_lam, rtol=1e-12, atol=1e-12)


def _folding_arm(solver, speed=0.6, ts=None):
    """Mukharlyamov and Deressa's (2015) Example 1: Baumgarte stops where the arm folds, at
    `t = x0 / speed`."""
    system = TwoLinkManipulator(speed=speed)
    q0, v0 = system.initial_state()
    formulation = jaxdae.Baumgarte([20.0, 10.0], [100.0, 25.0])
    return jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, solver=solver, ts=ts, throw=False)


@pytest.mark.parametrize("solver", [diffrax.Tsit5(), jaxdae.UnrolledERK(diffrax.Tsit5())])
def test_stops_where_the_event_stops(solver):
    sol, ref = _folding_arm(solver), _folding_arm(EventTsit5())
    assert sol.result == ref.result == jaxdae.RESULTS.singular_constraint_matrix
    assert int(sol.stats["num_steps"]) == int(ref.stats["num_steps"])
    np.testing.assert_allclose(sol.t_final, ref.t_final, rtol=1e-7)
    np.testing.assert_allclose(sol.q_final, ref.q_final, rtol=1e-7)


def test_stops_each_member_under_jit_and_vmap():
    """A batch whose members fail at different times, one not within `t1` (the slowest),
    with saved times."""
    speeds = jnp.asarray([0.6, 0.3, 0.1])
    ts = jnp.linspace(0.0, 2.0, 9)

    def run(solver):
        return jax.jit(jax.vmap(lambda speed: _folding_arm(solver, speed, ts)))(speeds)

    sols, refs = run(diffrax.Tsit5()), run(EventTsit5())
    failed = np.asarray(sols.result == jaxdae.RESULTS.singular_constraint_matrix)
    np.testing.assert_array_equal(
        failed, np.asarray(refs.result == jaxdae.RESULTS.singular_constraint_matrix)
    )
    np.testing.assert_array_equal(failed, [True, True, False])
    np.testing.assert_allclose(sols.t_final, refs.t_final, rtol=1e-7)
    np.testing.assert_allclose(sols.q, refs.q, rtol=1e-7, atol=1e-9)


def test_failure_at_the_start_stops_before_a_step():
    """Restarted where a solve stopped, `G M⁻¹ Gᵀ` is singular at `t0`: the condition at
    the start reports it before any step, as the event does."""
    stopped = _folding_arm(diffrax.Tsit5())
    system = TwoLinkManipulator()
    formulation = jaxdae.Baumgarte([20.0, 10.0], [100.0, 25.0])
    t0 = float(stopped.t_final)
    for solver in (diffrax.Tsit5(), EventTsit5()):
        sol = jaxdae.simulate(
            system,
            formulation,
            t0,
            2.0,
            stopped.q_final,
            stopped.v_final,
            solver=solver,
            throw=False,
        )
        assert sol.result == jaxdae.RESULTS.singular_constraint_matrix
        assert float(sol.t_final) == t0
        assert int(sol.stats["num_steps"]) == 0


def test_the_gradient_is_the_events():
    """Through a solve that ends before the arm folds, with the default adjoint."""
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()

    def loss(kp, solver):
        formulation = jaxdae.Baumgarte([20.0, 10.0], kp)
        sol = jaxdae.simulate(system, formulation, 0.0, 0.3, q0, v0, solver=solver)
        return jnp.sum(sol.q_final**2)

    kp = jnp.asarray([100.0, 25.0])
    grads = [jax.grad(loss)(kp, solver) for solver in (diffrax.Tsit5(), EventTsit5())]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-8)


def test_forward_mode_takes_the_event():
    """`diffrax.ForwardMode` sets the stage loop of the solver `diffeqsolve` sees, so its
    solves keep the test as an event (the wrapped solver's loop would not be
    differentiable in forward mode); its derivative is the reverse one's."""
    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()

    def loss(kp, adjoint=None):
        formulation = jaxdae.Baumgarte([20.0, 10.0], kp)
        sol = jaxdae.simulate(system, formulation, 0.0, 0.3, q0, v0, adjoint=adjoint)
        return jnp.sum(sol.q_final**2)

    kp, tangent = jnp.asarray([100.0, 25.0]), jnp.asarray([1.0, -2.0])
    _, forward = jax.jvp(lambda k: loss(k, diffrax.ForwardMode()), (kp,), (tangent,))
    np.testing.assert_allclose(forward, jax.grad(loss)(kp) @ tangent, rtol=1e-6)


def test_solve_with_pivots_is_init_and_compute():
    """On a banded sparse operator (one factorization for both) and a dense one."""
    system = Cloth(3)
    q0, v0 = system.initial_state()
    elimination = eliminate(_terms_at(system, q0, v0))
    rhs = jnp.linspace(1.0, 2.0, elimination.matrix.shape[0])
    solver = StructuredCholesky()
    dense = lx.MatrixLinearOperator(elimination.matrix, lx.positive_semidefinite_tag)
    for operator in (elimination.operator, dense):
        solution, pivots = solver.solve_with_pivots(operator, rhs)
        state = solver.init(operator, {})
        np.testing.assert_allclose(solution, solver.compute(state, rhs, {})[0], rtol=1e-12)
        np.testing.assert_allclose(pivots, state.pivots, rtol=1e-12)
