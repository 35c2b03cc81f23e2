"""Fault injection at the model and the arguments: model methods that return the wrong
shape or kind of value or cannot be traced, empty and object-array states, and arguments
of the solve, formulations and analysis functions outside their domain. Each is refused
eagerly, before anything compiles, with a message that names the method or argument and
the fix (docs/failures.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae._integration._validation import check_model_outputs
from jaxdae.examples import CartesianPendulum

PENDULUM = CartesianPendulum()
Q0, V0 = PENDULUM.state_from_angle(0.5, 0.0)
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)


def _model(method, body):
    """A pendulum whose `method` is `body(t, q, v)` (`v` absent for methods of `(t, q)`)."""

    def of_position(self, t, q):
        return body(t, q, None)

    def of_state(self, t, q, v):
        return body(t, q, v)

    positional = method in ("constraints", "potential_energy", "mass_matrix")
    return type("Bad", (CartesianPendulum,), {method: of_position if positional else of_state})()


def _branching(t, q, v):
    if q[0] > 0:
        return jnp.array([q @ q - 1.0])
    return jnp.array([q @ q - 1.0])


# Model methods ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, body, error, match",
    [
        (
            "generalized_forces",
            lambda t, q, v: -0.5 * v[0],
            ValueError,
            r"`generalized_forces` must return a 1-D array of shape \(2,\); got shape \(\) "
            r"from Bad\. .*not broadcast",
        ),
        (
            "generalized_forces",
            lambda t, q, v: jnp.zeros(3),
            ValueError,
            r"`generalized_forces` must return a 1-D array of shape \(2,\); got shape \(3,\)",
        ),
        (
            "generalized_forces",
            lambda t, q, v: [0.0 * q[0], 0.0 * q[1]],
            ValueError,
            r"`generalized_forces` must return a 1-D array of shape \(2,\); got a list of 2 ",
        ),
        (
            "potential_energy",
            lambda t, q, v: (9.81 * q[1], 0.0),
            ValueError,
            r"`potential_energy` must return a scalar \(shape \(\)\); got a tuple of 2 entries "
            r"from Bad",
        ),
        (
            "constraints",
            lambda t, q, v: (q @ q - 1.0,),
            ValueError,
            r"`constraints` must return a 1-D array of shape \(m,\); got a tuple of 1 entry",
        ),
        (
            "constraints",
            lambda t, q, v: jnp.array([np.sin(q[0]) ** 2 + q[1] ** 2 - 1.0]),
            TypeError,
            r"`constraints` of Bad converts a traced JAX array.*Use `jax.numpy`",
        ),
        (
            "constraints",
            _branching,
            TypeError,
            r"`constraints` of Bad asks for the concrete value.*`jnp.where",
        ),
    ],
    ids=[
        "forces-scalar",
        "forces-shape",
        "forces-list",
        "potential-tuple",
        "constraints-tuple",
        "constraints-numpy",
        "constraints-python-if",
    ],
)
def test_a_bad_model_method_is_named(method, body, error, match):
    with pytest.raises(error, match=match):
        jaxdae.simulate(_model(method, body), BAUMGARTE, 0.0, 0.3, Q0, V0)


def test_a_scalar_force_is_refused_outside_simulate():
    """The terms check the forces' shape themselves, for every entry point."""
    bad = _model("generalized_forces", lambda t, q, v: -0.5 * v[0])
    with pytest.raises(ValueError, match=r"`generalized_forces` must return a 1-D array"):
        jax.eval_shape(bad.terms, 0.0, Q0, V0)


def test_a_python_number_is_a_constant_energy():
    check_model_outputs(_model("potential_energy", lambda t, q, v: 1), 0.0, Q0, V0)
    check_model_outputs(_model("potential_energy", lambda t, q, v: 1.0), 0.0, Q0, V0)


# The state ----------------------------------------------------------------------------


class _Nothing(jaxdae.LagrangianSystem):
    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v


@pytest.mark.parametrize("system", [PENDULUM, _Nothing()], ids=["pendulum", "no-coordinates"])
def test_an_empty_state_is_refused(system):
    with pytest.raises(ValueError, match=r"`q0` and `v0` are empty.*at least one coordinate"):
        jaxdae.simulate(system, BAUMGARTE, 0.0, 0.3, jnp.zeros(0), jnp.zeros(0))


@pytest.mark.usefixtures("unchecked")
def test_an_object_array_state_is_converted_or_named():
    from jaxdae._checks import float_array

    q0 = float_array("q0", np.array([0.48, -0.88], dtype=object))
    assert q0.dtype == jnp.result_type(float) and np.allclose(q0, [0.48, -0.88])
    with pytest.raises(TypeError, match=r"`q0` must be an array of real numbers"):
        jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.3, np.array(["a", "b"], dtype=object), V0)


# Arguments of the solve and the formulations -------------------------------------------


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 0.5, Q0, V0, dt0=1e-300),
            ValueError,
            r"`dt0` = 1e-300 is not above the shortest step.*Pass a larger `dt0`",
        ),
        (
            lambda: jaxdae.Baumgarte("10", 25.0),
            TypeError,
            r"The gain `kd` of Baumgarte must be a number or an array of numbers; got '10'",
        ),
        (
            lambda: jaxdae.RedundantCoordinates((1,), tol=-1.0),
            ValueError,
            r"The `tol` of RedundantCoordinates.*must be a positive finite number; got -1.0",
        ),
        (
            lambda: jaxdae.CoupledPerturbation(k10=-25.0),
            ValueError,
            r"act on holonomic constraints: pass `k11` to `CoupledPerturbation`",
        ),
    ],
    ids=["dt0-below-stall-floor", "gain-string", "redundant-tol-negative", "coupled-missing-k11"],
)
def test_a_bad_argument_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_numpy_max_steps_becomes_an_int():
    from jaxdae._integration._problem import SolveCall

    call = SolveCall(
        ts=None,
        solver=None,
        stepsize_controller=None,
        dt0=None,
        rtol=1e-6,
        atol=1e-8,
        max_steps=np.int64(5000),
        adjoint=None,
        throw=True,
    )
    call.check_options()
    assert type(call.max_steps) is int and call.max_steps == 5000


# Analysis and control -------------------------------------------------------------------


@pytest.mark.usefixtures("unchecked")
@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: jaxdae.equilibrium(PENDULUM, jnp.array([0.1, -1.0]), max_steps=0),
            r"`max_steps` must be a positive integer \(Gauss–Newton iterations\); got 0",
        ),
        (
            lambda: jaxdae.perturbation_matrix(BAUMGARTE, -1),
            r"`num_constraints` must be a non-negative integer.*got -1",
        ),
        (
            lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, jnp.array([[0.0], [-1.0]])),
            r"`q` must be 1-D \(n,\); got shape \(2, 1\)",
        ),
        (
            lambda: jaxdae.linearize(PENDULUM, BAUMGARTE, jnp.array([0.0, -1.0]), jnp.zeros(3)),
            r"`v` must have the shape of `q`, \(2,\); got shape \(3,\)",
        ),
    ],
    ids=[
        "equilibrium-max-steps-zero",
        "perturbation-negative",
        "linearize-q-2d",
        "linearize-v-shape",
    ],
)
def test_analysis_names_a_bad_count_or_shape(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_lqr_names_badly_scaled_weights():
    """The note `lqr` adds to its failure (checked without solving)."""
    from jaxdae._analysis._lqr import _scale_note

    overflow = _scale_note(1e200 * np.eye(2), np.eye(1), np.nan)
    assert "overflowed to nan" in overflow and "ratio of `Q` to `R`" in overflow
    assert "lost its precision" in _scale_note(np.eye(2), 1e-40 * np.eye(1), 0.0)
    assert _scale_note(np.eye(2), np.eye(1), 1.0) == ""


class _ShrinkingPendulum(jaxdae.LagrangianSystem):
    """A point on a circle whose radius `0.8 − t` reaches zero at `t = 0.8`: there the
    constraint's gradient `2q` vanishes, whatever the formulation."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * q[1]

    def constraints(self, t, q):
        return jnp.array([q @ q - (0.8 - t) ** 2])


_shrinking_results = jax.jit(
    jax.vmap(
        lambda speed: (
            jaxdae.simulate(
                _ShrinkingPendulum(),
                jaxdae.PseudoInverse(10.0, 25.0),
                0.0,
                1.0,
                jnp.array([0.8, 0.0]),
                jnp.array([-1.0, 0.0]) * speed,
                max_steps=500,
                throw=False,
            ).result._value
        )
    )
)


def test_a_stall_where_the_constraints_degenerate_is_named():
    """A prescribed length that reaches zero stalls every formulation, its steps shrinking
    towards `t = 0.8`: the solve names that (not `max_steps_reached`, whose advice, more
    steps, would not help), eagerly and per member of a traced batch."""
    named = jaxdae.RESULTS.stalled_near_singular_constraints
    with pytest.raises(jaxdae.SimulationError, match="constraints degenerate there"):
        jaxdae.simulate(
            _ShrinkingPendulum(),
            BAUMGARTE,
            0.0,
            1.0,
            jnp.array([0.8, 0.0]),
            jnp.array([-1.0, 0.0]),
            max_steps=500,
        )
    assert _shrinking_results(jnp.ones(2)).tolist() == [named._value] * 2
