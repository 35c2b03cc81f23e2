"""What a system declares: a controlled system by its base, and the capabilities the solve
path reads from a system's class or a registry, each given to a user's own system class;
and that the solve path asks for capabilities rather than testing classes."""

import sys
import warnings
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.extend
import jaxdae.multibody as mb
from jaxdae._systems._control import is_controlled
from jaxdae.examples import CartesianPendulum
from jaxdae.examples._scaling import CartesianChain

# -- controlled systems --------------------------------------------------------------------


class FieldOnlyCart(jaxdae.LagrangianSystem):
    """A mass pushed by its input, with a field `controller` and no controlled base."""

    mass: jax.Array
    controller: jaxdae.AbstractController

    def kinetic_energy(self, t, q, v):
        return 0.5 * self.mass * v @ v

    def generalized_forces(self, t, q, v):
        return self.controller(t, q, v)


class Cart(FieldOnlyCart, jaxdae.AbstractControlledSystem):
    """The same mass, declared a controlled system."""


def test_the_in_repo_controlled_systems_declare_their_base():
    link = mb.PlanarBody("link", mass=1.0, inertia=0.1)
    body = mb.RigidBody("body", 1.0, np.eye(3))
    for system in (jaxdae.examples.BallAndBeam(), mb.Mechanism([link]), mb.TreeMechanism([body])):
        assert isinstance(system, jaxdae.AbstractControlledSystem)


def test_a_controlled_system_closes_its_loop_without_a_warning():
    cart = Cart(jnp.asarray(2.0), jaxdae.ConstantControl(jnp.zeros(1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pushed = jaxdae.with_controller(cart, jaxdae.ConstantControl(jnp.ones(1)))
        lin = jaxdae.linearize(
            pushed, jaxdae.Unstabilized(), jnp.zeros(1), jnp.zeros(1), u=jnp.zeros(1)
        )
    np.testing.assert_allclose(lin.B, [[0.0], [0.5]])


def test_a_field_controller_alone_is_deprecated():
    cart = FieldOnlyCart(jnp.asarray(2.0), jaxdae.ConstantControl(jnp.zeros(1)))
    match = r"FieldOnlyCart .* subclass `jaxdae.AbstractControlledSystem`"
    with pytest.warns(DeprecationWarning, match=match) as record:
        pushed = jaxdae.with_controller(cart, jaxdae.ConstantControl(jnp.ones(1)))
    assert record[0].filename == __file__  # named at the user's line, where Python shows it
    np.testing.assert_allclose(pushed.controller.u, [1.0])
    with pytest.warns(DeprecationWarning):
        lin = jaxdae.linearize(
            cart, jaxdae.Unstabilized(), jnp.zeros(1), jnp.zeros(1), u=jnp.zeros(1)
        )
    np.testing.assert_allclose(lin.B, [[0.0], [0.5]])


def test_a_system_without_a_controller_is_not_controlled():
    pendulum = jaxdae.examples.CartesianPendulum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not is_controlled(pendulum)
    with pytest.raises(ValueError, match="subclasses `jaxdae.AbstractControlledSystem`"):
        jaxdae.with_controller(pendulum, jaxdae.ConstantControl(0.0))


# -- capabilities a system class of one's own declares ------------------------------------


class OwnSystem(jaxdae.AbstractSystem):
    """A system written on `AbstractSystem` directly, its terms those of `inner`; it
    declares nothing."""

    inner: jaxdae.LagrangianSystem

    def terms(self, t, q, v):
        return self.inner.terms(t, q, v)

    def energy(self, t, q, v):
        return self.inner.energy(t, q, v)

    def constraints(self, t, q):
        return self.inner.constraints(t, q)

    def velocity_constraints(self, t, q, v):
        return self.inner.velocity_constraints(t, q, v)


class FromConstraints(OwnSystem):
    """The same, declaring that its terms take `Φ` and `Ψ` from its constraints."""

    terms_from_constraints: ClassVar[bool] = True


class WithProducts(FromConstraints):
    """The same, with `M q̈ − Q` as products and its terms in array form registered."""


TRACED: list[str] = []


@jaxdae.extend.inertia_minus_forces.register(WithProducts)
def _inertia_minus_forces(system, t, q, v, acceleration):
    TRACED.append("inertia_minus_forces")
    return jaxdae.extend.inertia_minus_forces(system.inner, t, q, v, acceleration)


@jaxdae.extend.terms_in_array_form.register(WithProducts)
def _terms_in_array_form(system, t, q, v):
    TRACED.append("terms_in_array_form")
    return True


class Incompatible(CartesianPendulum):
    """`|q|² = 1` and `|q|² = 4`: no configuration meets both."""

    def constraints(self, t, q):
        return jnp.array([q @ q - 1.0, q @ q - 4.0])


def test_terms_from_constraints_gives_the_range_test():
    q0, v0 = CartesianPendulum().state_from_angle(0.5, 0.0)
    formulation = jaxdae.ModifiedLagrange(10.0, 10.0, 25.0)
    results = [
        jaxdae.simulate(cls(Incompatible()), formulation, 0.0, 1.0, q0, v0, throw=False).result
        for cls in (OwnSystem, FromConstraints)
    ]
    assert results[0] != jaxdae.RESULTS.constraints_not_met  # the test is not run
    assert results[1] == jaxdae.RESULTS.constraints_not_met


def test_generalized_alpha_evaluates_a_registered_inertia_minus_forces():
    chain = CartesianChain(5)  # 10 coordinates: above `STRUCTURED_MIN`
    q0, v0 = chain.initial_state()

    def solve(system):
        return jaxdae.simulate(
            system,
            jaxdae.Unstabilized(),
            0.0,
            0.05,
            q0,
            v0,
            solver=jaxdae.GeneralizedAlpha(),
            rtol=1e-6,
            atol=1e-8,
        )

    TRACED.clear()
    reference = solve(FromConstraints(chain))
    assert "inertia_minus_forces" not in TRACED
    mine = solve(WithProducts(chain))
    assert "inertia_minus_forces" in TRACED
    np.testing.assert_allclose(mine.q, reference.q, atol=1e-10)


def test_projection_takes_the_declared_form_of_the_terms():
    from jaxdae._compilation._scalarize import _in_array_form_scope
    from jaxdae._integration._projection import _constraint_values

    pendulum = CartesianPendulum()
    q, v = pendulum.state_from_angle(0.5, 0.0)
    formulation = jaxdae.Baumgarte(1.0, 1.0)
    for system, array_form in ((FromConstraints(pendulum), False), (WithProducts(pendulum), True)):
        jaxpr = jax.make_jaxpr(
            lambda q_, v_, s=system: _constraint_values(s, formulation, 0.0, q_, v_)
        )(q * 1.001, v)
        assert _in_array_form_scope(jaxpr.jaxpr) == array_form


# -- the solve path asks what a part can do, not what class it is -------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "diagnostics"))
import solve_route  # noqa: E402  # pyright: ignore[reportMissingImports]


def test_the_route_of_simulate_tests_no_concrete_class_and_probes_no_attribute():
    """`isinstance` on a concrete jaxdae class, `getattr` with a default and `hasattr` in
    jaxdae's code along one `simulate` (experiments/diagnostics/solve_route.py)."""
    solve_route._simulate(0.1, saves=0)
    assert solve_route.type_probes() == []


def test_the_route_of_simulate_enters_few_modules_once():
    """The modules that one `simulate` (traced and compiled: saved at a number of times no
    other test uses) enters along the solve path, and how often it returns to one it left:
    a guard against a route that grows back (experiments/diagnostics/solve_route.py prints
    it)."""
    calls = solve_route.solve_path(solve_route.route(saves=13))
    entered = solve_route.entries(calls)
    # The three stages were traced (a cached solve would skip the integration's calls).
    assert {"_problem", "_solve", "_outcome"} <= {m.rsplit(".", 1)[1] for m in entered}
    modules, reentries = solve_route.counts(calls)
    assert modules <= 12, entered
    assert reentries <= 3, entered


def _impact_time(height, events=None):
    sol = jaxdae.simulate(
        jaxdae.examples.BouncingBall(),
        jaxdae.Unstabilized(),
        0.0,
        0.5,
        jnp.stack([0.0, height]),
        jnp.zeros(2),
        events=events,
    )
    return sol.events.t[0] if events is None else sol.q_final[1]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: _impact_time(1.0), id="events", marks=pytest.mark.slow),
        pytest.param(lambda: _impact_time(0.3, jaxdae.TimeStepping(dt=1e-2)), id="time stepping"),
        pytest.param(
            lambda: jax.grad(_impact_time)(1.0), id="events, gradient", marks=pytest.mark.slow
        ),
    ],
)
def test_the_routes_with_contacts_test_no_concrete_class(call):
    """The same along an event-driven solve, a time-stepped one and a gradient."""
    call()
    assert solve_route.type_probes(call) == []


def test_the_type_probes_see_what_they_look_for():
    import builtins

    from jaxdae._checks import check_instance
    from jaxdae._compilation._constants import _Constant

    real = builtins.isinstance
    with pytest.raises(ValueError, match="events"):
        solve_route.type_probes(lambda: check_instance("events", 1.0, jaxdae.EventDriven, "x"))
    assert builtins.isinstance is real
    found = solve_route.type_probes(lambda: _Constant(np.ones(2)))
    assert [(probe, what) for probe, _, what in found] == [("getattr", "weak_type")]
    found = solve_route.type_probes(
        lambda: check_instance("events", jaxdae.EventDriven(), jaxdae.EventDriven, "a scheme")
    )
    assert [(probe, what) for probe, _, what in found] == [("isinstance", "EventDriven")]
    assert found[0][1].startswith("jaxdae/_checks.py:")
