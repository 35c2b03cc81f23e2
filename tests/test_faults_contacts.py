"""Fault suite where the solvers meet contacts: every solver jaxdae offers (explicit,
`Projected`, ESDIRK, Rosenbrock, generalized-α) against a rod pressed against its joint
limit and a block that comes to stick by friction on an incline (the ball at rest on the
floor: `tests/test_events.py`). A solver whose rates carry the contact forces holds the
contact; generalized-α, which integrates the bilateral constraints alone, ends the solve
where the contact came to rest, with `RESULTS.resting_contact_unsupported`."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import SlidingBlock

from ._systems import solver_named
from .test_multibody_stops import rod_with_limit

# The rod's limit, 0.3 rad before the bottom of its swing: gravity presses it there.
LIMIT = -np.pi / 2 - 0.3


def _pressed_rod():
    """A uniform rod on a revolute joint at its top, let go 0.5 rad beyond its plastic limit
    (seen from the bottom): it swings into the limit and rests pressed against it."""
    rod = rod_with_limit(0.0, upper=LIMIT)
    return rod, rod.initial_state(joint_coordinates={"pivot": LIMIT - 0.5})


SOLVERS = ["tsit5", "projected", "kvaerno5", "rodas5p", "generalized_alpha"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SOLVERS)
def test_every_solver_holds_a_rod_on_its_limit_or_says_it_cannot(name):
    rod, (q0, v0) = _pressed_rod()
    sol = jaxdae.simulate(
        rod,
        jaxdae.Baumgarte(20.0, 100.0),
        0.0,
        1.5,
        q0,
        v0,
        solver=solver_named(name),
        rtol=1e-8,
        atol=1e-10,
        throw=False,
    )
    angle = float(rod.joint_coordinate("pivot", sol.q_final))
    arrival = float(sol.events.t[0])
    assert int(sol.events.kind[0]) == jaxdae.Events.CONTACT
    if name == "generalized_alpha":
        assert sol.result == jaxdae.RESULTS.resting_contact_unsupported
        np.testing.assert_allclose(float(sol.t_final), arrival, atol=1e-9)
    else:
        assert sol.succeeded and float(sol.t_final) == 1.5
        assert arrival < 1.0
        np.testing.assert_allclose(angle, LIMIT, atol=1e-6)
        np.testing.assert_allclose(float(sol.v_final @ sol.v_final), 0.0, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("name", SOLVERS)
def test_every_solver_holds_a_block_sticking_or_says_it_cannot(name):
    block = SlidingBlock(slope=0.2)
    time, distance = block.stopping(0.5)
    sol = jaxdae.simulate(
        block,
        jaxdae.Unstabilized(),
        0.0,
        time + 0.5,
        jnp.zeros(2),
        jnp.array([0.5, 0.0]),
        solver=solver_named(name),
        rtol=1e-8,
        atol=1e-10,
        throw=False,
    )
    # At the start it rests on the plane, sliding; then it sticks at the closed form's time.
    kinds = [int(k) for k in sol.events.kind[: int(sol.events.count)]]
    if name == "generalized_alpha":
        assert sol.result == jaxdae.RESULTS.resting_contact_unsupported
        np.testing.assert_allclose(float(sol.t_final), 0.0, atol=1e-12)
    else:
        assert sol.succeeded, sol.result
        assert kinds[-1] == jaxdae.Events.STICK
        np.testing.assert_allclose(float(sol.events.t[len(kinds) - 1]), time, atol=1e-6)
        np.testing.assert_allclose(float(sol.q_final[0]), distance, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(sol.v_final), 0.0, atol=1e-8)
