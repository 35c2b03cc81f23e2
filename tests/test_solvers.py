"""`jaxdae.UnrolledERK`: diffrax's explicit Runge–Kutta steps with the stages written out."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._integration._term import SystemTerm
from jaxdae.examples import CartesianPendulum

PENDULUM = CartesianPendulum(mass=1.3, length=0.8)
Q0 = PENDULUM.state_from_angle(0.7, 0.0)[0]
V0 = jnp.array([0.3, 0.4])  # off the velocity constraint: the stabilization is at work
TSIT5 = jaxdae.UnrolledERK(diffrax.Tsit5())


def _max_diff(a, b):
    return max(
        float(jnp.max(jnp.abs(x - y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False)
    )


@pytest.mark.parametrize(
    "solver",
    [diffrax.Tsit5(), diffrax.Dopri5(), diffrax.Bosh3(), diffrax.Heun(), diffrax.Ralston()],
    ids=lambda s: type(s).__name__,
)
def test_step_matches_the_wrapped_solver(solver):
    """One step: solution, error estimate and dense output (first-same-as-last or not)."""
    term, y0 = SystemTerm(PENDULUM, jaxdae.Baumgarte(10.0, 25.0)), (Q0, V0)
    args = None
    unrolled = jaxdae.UnrolledERK(solver)
    ours = unrolled.step(term, 0.1, 0.15, y0, args, unrolled.init(term, 0.1, 0.15, y0, args), False)
    theirs = solver.step(term, 0.1, 0.15, y0, args, solver.init(term, 0.1, 0.15, y0, args), False)
    assert _max_diff(ours[0], theirs[0]) < 1e-14
    assert _max_diff(ours[1], theirs[1]) < 1e-14
    dense = [
        s.interpolation_cls(t0=0.1, t1=0.15, **out[2]).evaluate(0.13)
        for s, out in ((unrolled, ours), (solver, theirs))
    ]
    assert _max_diff(*dense) < 1e-14
    if solver.tableau.fsal:  # the stored last stage is the next step's first
        np.testing.assert_allclose(ours[3][1], term.vf(0.15, ours[0], args)[1], atol=1e-12)


class PushedPendulum(CartesianPendulum):
    """A horizontal push switched on at t = 0.5 and off at t = 1: the right-hand side jumps."""

    def generalized_forces(self, t, q, v):
        return jnp.where((t >= 0.5) & (t < 1.0), 2.0, 0.0) * jnp.array([1.0, 0.0])


@pytest.mark.slow
def test_solve_matches_with_jumps():
    """Whole adaptive solves agree step for step, also across jumps of the right-hand side
    (declared to the controller: there the stored last stage is stale and the first stage
    is evaluated again)."""
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-8, atol=1e-10), jump_ts=jnp.array([0.5, 1.0])
    )
    pushed = PushedPendulum(mass=1.3, length=0.8)
    sols = [
        jaxdae.simulate(
            pushed,
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            2.0,
            Q0,
            V0,
            ts=jnp.linspace(0.0, 2.0, 9),
            stepsize_controller=controller,
            solver=solver,
        )
        for solver in (TSIT5, diffrax.Tsit5())
    ]
    assert sols[0].stats["num_steps"] == sols[1].stats["num_steps"]
    assert _max_diff((sols[0].q, sols[0].v), (sols[1].q, sols[1].v)) < 1e-12


def test_gradient_matches_central_differences():
    def loss(kd):
        sol = jaxdae.simulate(PENDULUM, jaxdae.Baumgarte(kd, 25.0), 0.0, 1.0, Q0, V0, solver=TSIT5)
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi**2)

    forward, step = jax.jit(loss), 1e-5
    fd = (forward(10.0 + step) - forward(10.0 - step)) / (2 * step)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(10.0), fd, rtol=1e-5)


def test_refuses_solvers_it_cannot_unroll(unchecked):
    with pytest.raises(ValueError, match="explicit Runge–Kutta solver with one Butcher"):
        jaxdae.UnrolledERK(diffrax.Kvaerno5())
