"""The jit of the functions a solve calls inside its trace (`jaxdae/_compilation/_constants.py`):
the caller's constants stay constants there, eager calls share one program, and constants
that differ in any bit are never confused; an eager solve's times given as Python numbers
are compiled in."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxdae
import jaxdae.multibody as mb
from jaxdae._compilation._constants import jit_with_constants
from jaxdae._integration import _simulate
from jaxdae._integration._problem import SolveKeywords, pose_problem
from jaxdae._integration._trajectories import SingleTrajectory
from jaxdae._integration._vector_fields import system_terms
from jaxdae.examples import CartesianPendulum

from ._jaxprs import equations

ARM = Path(__file__).parent / "data" / "three_link_arm.urdf"


def test_a_closed_over_array_is_a_constant_inside_a_jit_and_eager_calls_share_a_program():
    traced = []

    @jit_with_constants
    def scaled(a, x):
        traced.append(isinstance(a, jax.core.Tracer))
        return a * x

    a = jnp.array([1.0, 0.0])
    np.testing.assert_array_equal(jax.jit(lambda x: scaled(a, x))(2.0), [2.0, 0.0])
    assert traced == [False]
    # Eager: the array is an input of one program for all values.
    np.testing.assert_array_equal(scaled(a, 2.0), [2.0, 0.0])
    np.testing.assert_array_equal(scaled(a + 1.0, 2.0), [4.0, 2.0])
    assert traced == [False, True]
    # Too large to fold, or a PRNG key: an input inside the jit too.
    big = jnp.ones(2048)
    np.testing.assert_array_equal(jax.jit(lambda x: scaled(big, x))(2.0), 2.0 * big)
    assert traced == [False, True, True]
    key = jax.random.key(0)

    @jit_with_constants
    def draw(key, x):
        traced.append(isinstance(key, jax.core.Tracer))
        return jax.random.uniform(key) * x

    assert jax.jit(lambda x: draw(key, x))(2.0) == draw(key, 2.0)
    assert traced[-1]


def test_constants_that_differ_in_a_bit_or_a_weak_type_are_not_shared():
    @jit_with_constants
    def inverse(a, x):
        return x / a

    def under_jit(a):
        return jax.jit(lambda x: inverse(a, x))(jnp.asarray(1.0, jnp.float32))

    assert under_jit(jnp.array(0.0)) == np.inf
    assert under_jit(jnp.array(-0.0)) == -np.inf  # equal as numbers, a different constant
    # A weakly typed constant takes the argument's float32, a strongly typed one its float64.
    assert under_jit(jnp.asarray(2.0)).dtype == jnp.float32
    assert under_jit(jnp.asarray(2.0, jnp.float64)).dtype == jnp.float64
    assert under_jit(np.float64(2.0) * np.ones(())).dtype == jnp.float64


def test_a_closed_over_mechanism_folds_into_its_scalar_graph():
    """A URDF arm's joint axes and link frames, closed over by a jitted function, are
    constants of its right-hand side's scalar graph: fewer equations than where the arm is
    an argument, and the same terms as its array form."""
    model = mb.load_urdf(ARM).mechanism(forces=[mb.Gravity()])
    q0, v0 = model.initial_state()
    t = jnp.asarray(0.0)

    def closed(q, v):
        return system_terms(model, t, q, v)

    def passed(model, q, v):
        return system_terms(model, t, q, v)

    folded = jax.make_jaxpr(closed)(q0, v0)
    unfolded = jax.make_jaxpr(passed)(model, q0, v0)
    assert len(list(equations(folded.jaxpr))) < 0.8 * len(list(equations(unfolded.jaxpr)))
    # The same terms as the model's own, in array form.
    a, b = jax.jit(closed)(q0, v0), jax.jit(lambda q, v: model.terms(t, q, v))(q0, v0)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-13)


def test_times_given_as_python_numbers_are_compiled_into_an_eager_solve(monkeypatch):
    """`simulate`'s `t0` and `t1` as Python numbers are constants of its compiled program, as
    in `diffrax.diffeqsolve` (each value its own program, diffrax's 100 `prevbefore`s of `t1`
    folded); as arrays they are inputs of one program for all values. Both give the same
    solution."""
    system = CartesianPendulum(mass=0.7, length=1.1)
    formulation = jaxdae.Baumgarte(10.0, 25.0)
    q0, v0 = system.state_from_angle(1.0, 0.5)
    traces = []
    integrate = _simulate.integrate_problem
    monkeypatch.setattr(
        _simulate, "integrate_problem", lambda problem: traces.append(1) or integrate(problem)
    )

    def final(t0, t1):
        return jaxdae.simulate(system, formulation, t0, t1, q0, v0).q_final

    # Values of their own: no other test compiled these programs.
    numbers = final(0.0, 0.8125)
    assert len(traces) == 1
    final(0.0, 0.8125)
    assert len(traces) == 1
    final(0.0, 0.71875)
    assert len(traces) == 2
    arrays = final(jnp.asarray(0.0), jnp.asarray(0.8125))
    count = len(traces)
    final(jnp.asarray(0.0), jnp.asarray(0.71875))
    assert len(traces) == count
    np.testing.assert_allclose(numbers, arrays, rtol=1e-14, atol=1e-14)

    def compiled(t0, t1):
        call = ("simulate", {}, SolveKeywords)
        problem, _ = pose_problem(system, formulation, t0, t1, q0, v0, call, SingleTrajectory())
        return _simulate.solve_problem.jitted.lower(problem).lowered.compile().as_text()

    # XLA folds the constant ones (each of the 100 is several instructions).
    given = compiled(0.0, 0.8125).count("nextafter")
    inputs = compiled(jnp.asarray(0.0), jnp.asarray(0.8125)).count("nextafter")
    assert given + 100 <= inputs, (given, inputs)
