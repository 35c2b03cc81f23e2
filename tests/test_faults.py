"""Fault injection: models that break mid-run, solves that blow up, constraints that cannot
be met, bad strategy objects and batches with bad members. Every case ends in a named
failure (or a named error), never in a silent wrong result or a hang (docs/failures.md)."""

import re
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
from jaxdae.examples import CartesianPendulum, TwoLinkManipulator

from ._systems import TwicePendulum

PENDULUM = CartesianPendulum()
Q0, V0 = PENDULUM.state_from_angle(0.5, 0.0)
BAUMGARTE = jaxdae.Baumgarte(10.0, 25.0)
T_BAD = 0.3  # where the broken models below stop being finite
NEVER = 1e6  # a time the solves below do not reach


def _broken(t, t_bad):
    """0 before `t_bad`, nan after (and in every derivative there)."""
    return jnp.sqrt(t_bad - t) - jnp.sqrt(t_bad - t)


class Broken(CartesianPendulum):
    """The pendulum whose forces, mass matrix or constraints turn nan at the times given
    (arrays: one program for the three, the term that breaks set by the values alone)."""

    forces_from: jax.Array = eqx.field(default=NEVER, converter=jnp.asarray)
    mass_from: jax.Array = eqx.field(default=NEVER, converter=jnp.asarray)
    constraints_from: jax.Array = eqx.field(default=NEVER, converter=jnp.asarray)

    def potential_energy(self, t, q):
        return super().potential_energy(t, q) * (1 + _broken(t, self.forces_from))

    def mass_matrix(self, t, q):
        return jnp.eye(2) * (1 + _broken(t, self.mass_from))

    def constraints(self, t, q):
        return super().constraints(t, q) + _broken(t, self.constraints_from)


class Incompatible(CartesianPendulum):
    """`|q|² = 1` and `|q|² = 4`: no configuration meets both."""

    def constraints(self, t, q):
        return jnp.array([q @ q - 1.0, q @ q - 4.0])


# Model faults mid-run ---------------------------------------------------------------


@pytest.mark.parametrize(
    "system, result, term",
    [
        (Broken(forces_from=T_BAD), jaxdae.RESULTS.non_finite_forces, "generalized forces"),
        (Broken(mass_from=T_BAD), jaxdae.RESULTS.non_finite_mass_matrix, "mass matrix"),
        (Broken(constraints_from=T_BAD), jaxdae.RESULTS.non_finite_constraints, "constraints"),
    ],
)
def test_a_model_that_turns_non_finite_mid_run_is_named(system, result, term):
    """Not `max_steps_reached`, and no endless loop with `max_steps=None`: the solve stops
    where the model broke, and the result names the term."""
    sol = jaxdae.simulate(system, BAUMGARTE, 0.0, 1.0, Q0, V0, max_steps=None, throw=False)
    assert sol.result == result
    assert not sol.succeeded
    assert float(sol.t_final) == pytest.approx(T_BAD, abs=1e-9)
    assert int(sol.stats["num_steps"]) < 500
    assert term in jaxdae.RESULTS[sol.result]


def test_a_non_finite_model_raises_with_the_term_time_and_state():
    # (the solve of the cases above: one compiled program for all)
    with pytest.raises(
        jaxdae.SimulationError, match=r"non-finite generalized forces(.|\n)*stopped at t = 0\.3"
    ):
        jaxdae.simulate(Broken(forces_from=T_BAD), BAUMGARTE, 0.0, 1.0, Q0, V0, max_steps=None)


def test_a_non_finite_model_stops_under_jit_and_vmap():
    """Traced, the member whose model broke stops there (`dt_min_reached`: the term is named
    only eagerly, to keep the probe out of every compiled solve); the others reach `t1`."""
    solve = jax.jit(
        jax.vmap(
            lambda t1: (
                jaxdae.simulate(
                    Broken(forces_from=T_BAD),
                    BAUMGARTE,
                    0.0,
                    t1,
                    Q0,
                    V0,
                    max_steps=1000,
                    throw=False,
                ).result._value
            )
        )
    )
    codes = np.asarray(solve(jnp.array([0.2, 1.0, 0.25])))
    expected = [jaxdae.RESULTS.successful, jaxdae.RESULTS.dt_min_reached, jaxdae.RESULTS.successful]
    assert codes.tolist() == [int(r._value) for r in expected]


# Divergence -------------------------------------------------------------------------

EULER_UNSTABLE = dict(
    solver=diffrax.Euler(), stepsize_controller=diffrax.ConstantStepSize(), dt0=0.1
)


def test_an_unstable_fixed_step_warns_and_its_divergence_is_a_failure():
    """Explicit Euler at τ = 0.1 with K_D = 200, K_P = 10⁴: ρ(I + τH) = 9 (Mukharlyamov (2019) §4),
    said before the solve; the residual then grows past 10⁶ and the solve fails."""
    formulation = jaxdae.Baumgarte(200.0, 1e4)
    with pytest.warns(UserWarning, match=r"spectral radius .* is 9 > 1"):
        sol = jaxdae.simulate(
            PENDULUM, formulation, 0.0, 1.0, Q0, V0, throw=False, **EULER_UNSTABLE
        )
    assert sol.result == jaxdae.RESULTS.diverged
    assert not sol.succeeded
    with (
        pytest.warns(UserWarning),
        pytest.raises(jaxdae.SimulationError, match=r"diverged(.|\n)*\|Φ\| = 2\.87e\+07"),
    ):
        jaxdae.simulate(PENDULUM, formulation, 0.0, 1.0, Q0, V0, **EULER_UNSTABLE)


def test_a_stable_fixed_step_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = jaxdae.simulate(
            PENDULUM,
            BAUMGARTE,
            0.0,
            1.0,
            Q0,
            V0,
            solver=diffrax.Heun(),
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=0.01,
        )
    assert sol.succeeded
    assert repr(sol.result) == "jaxdae.RESULTS<The solve reached `t1`.>"


@pytest.mark.slow
def test_fixed_step_radius_matches_transition_matrix():
    from jaxdae._integration._validation import fixed_step_radius

    for formulation, m in (
        (jaxdae.Baumgarte(200.0, 1e4), 1),
        (jaxdae.PseudoInverse([20.0, 10.0], [100.0, 25.0]), 2),
    ):
        for solver in (diffrax.Euler(), diffrax.Heun(), diffrax.Tsit5()):
            h = jaxdae.perturbation_matrix(formulation, m)
            exact = float(jaxdae.spectral_radius(jaxdae.transition_matrix(h, solver, 0.05)))
            assert fixed_step_radius(formulation, m, solver, 0.05) == pytest.approx(exact, rel=1e-6)


# Constraints that cannot be met -----------------------------------------------------


@pytest.mark.parametrize(
    "formulation",
    [
        pytest.param(jaxdae.PseudoInverse(10.0, 25.0), marks=pytest.mark.slow, id="PseudoInverse"),
        pytest.param(jaxdae.ModifiedLagrange(10.0, 10.0, 25.0), id="ModifiedLagrange"),
    ],
)
def test_incompatible_constraints_are_a_failure(formulation):
    sol = jaxdae.simulate(Incompatible(), formulation, 0.0, 1.0, Q0, V0, throw=False)
    assert sol.result == jaxdae.RESULTS.constraints_not_met
    with pytest.raises(
        jaxdae.SimulationError, match=r"cannot be met(.|\n)*\|Φ\| = 1\.5\d+ \(at the start: 3\)"
    ):
        jaxdae.simulate(Incompatible(), formulation, 0.0, 1.0, Q0, V0)


@pytest.mark.slow
def test_range_test_floor_follows_the_precision():
    # a residual at float32's rounding level is not tested (no SVD where nothing failed);
    # the same residual in float64, and a float32 model whose constraints contradict each
    # other, are
    from jaxdae._integration._diagnostics import checked_result

    def verdict(dtype, residual):
        g = jnp.asarray([[1.0, 0.0], [1.0, 0.0]], dtype)  # s outside the range of G
        target = jnp.asarray([1.0, -1.0], dtype)
        return checked_result(
            jnp.zeros((), dtype),
            jnp.asarray(residual, dtype),
            (g, target),
            jaxdae.RESULTS.successful,
        )

    assert verdict(jnp.float32, 2e-5) == jaxdae.RESULTS.successful
    assert verdict(jnp.float64, 2e-5) == jaxdae.RESULTS.constraints_not_met
    assert verdict(jnp.float32, 1e-2) == jaxdae.RESULTS.constraints_not_met
    system = jax.tree.map(
        lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x, Incompatible()
    )
    formulation = jaxdae.PseudoInverse(jnp.float32(10.0), jnp.float32(25.0))
    sol = jaxdae.simulate(
        system,
        formulation,
        0.0,
        1.0,
        Q0.astype(jnp.float32),
        V0.astype(jnp.float32),
        rtol=1e-5,
        atol=1e-7,
        throw=False,
    )
    assert sol.q_final.dtype == jnp.float32
    assert sol.result == jaxdae.RESULTS.constraints_not_met


class ThreeIncompatible(CartesianPendulum):
    """`|q|² = 1, 4, 9`: three constraints, so the range test takes an SVD."""

    def constraints(self, t, q):
        return jnp.array([q @ q - 1.0, q @ q - 4.0, q @ q - 9.0])


@pytest.mark.slow
def test_range_test_of_a_batch():
    # Under vmap the range test runs once for the batch where any trajectory needs it, not
    # on every row (its SVD sits in a conditional), and each row keeps its own verdict.
    from ._jaxprs import equations

    formulation = jaxdae.PseudoInverse(2.0, 1.0)
    q0 = jnp.stack([Q0, 1.5 * Q0])  # the second row's residual is large but consistent
    solve = jax.vmap(
        lambda system, q: jaxdae.simulate(system, formulation, 0.0, 0.5, q, V0, throw=False),
        in_axes=(None, 0),
    )
    assert np.all(solve(PENDULUM, q0).result == jaxdae.RESULTS.successful)
    failed = solve(ThreeIncompatible(), q0)
    assert np.all(failed.result == jaxdae.RESULTS.constraints_not_met)
    jaxpr = jax.make_jaxpr(lambda q: solve(ThreeIncompatible(), q))(q0).jaxpr

    def outside_conditionals(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name != "cond":
                yield eqn.primitive.name
                for param in eqn.params.values():
                    for sub in param if isinstance(param, (tuple, list)) else (param,):
                        inner = getattr(sub, "jaxpr", sub)
                        if hasattr(inner, "eqns"):
                            yield from outside_conditionals(inner)

    assert "svd" in {eqn.primitive.name for eqn in equations(jaxpr)}
    assert "svd" not in set(outside_conditionals(jaxpr))


def test_contradicting_constraints_under_baumgarte():
    # Baumgarte's singularity test reports them at the start; at its default `rcond` the
    # solve then has no range test at its end (no SVD in the program), with a given one it
    # keeps it
    from ._jaxprs import equations

    sol = jaxdae.simulate(ThreeIncompatible(), BAUMGARTE, 0.0, 1.0, Q0, V0, throw=False)
    assert sol.result == jaxdae.RESULTS.singular_constraint_matrix and sol.t_final == 0.0
    for rcond, has_range_test in ((None, False), (1e-12, True)):
        formulation = jaxdae.Baumgarte(10.0, 25.0, rcond=rcond)
        jaxpr = jax.make_jaxpr(
            lambda q, f=formulation: (
                jaxdae.simulate(ThreeIncompatible(), f, 0.0, 1.0, q, V0, throw=False).q_final
            )
        )(Q0).jaxpr
        assert ("svd" in {eqn.primitive.name for eqn in equations(jaxpr)}) == has_range_test


@pytest.mark.parametrize(
    "system, formulation, scale, t1",
    [
        pytest.param(
            TwicePendulum(),
            jaxdae.PseudoInverse(10.0, 25.0),
            1.3,
            0.2,  # redundant
            marks=pytest.mark.slow,
            id="redundant",
        ),
        pytest.param(
            PENDULUM,
            jaxdae.PseudoInverse(2.0, 1.0),
            1.5,
            0.5,  # a slow, large transient
            marks=pytest.mark.slow,
            id="slow-transient",
        ),
        pytest.param(PENDULUM, jaxdae.ModifiedLagrange(1.0, 2.0, 1.0), 1.5, 0.5, id="weak-penalty"),
        pytest.param(
            PENDULUM,
            jaxdae.Unstabilized(),
            1.2,
            1.0,  # a violation that never decays
            id="unstabilized",
        ),
    ],
)
def test_legitimate_residuals_are_not_failures(system, formulation, scale, t1):
    """Residuals that are still large at the end, or that no gain pulls back, are not a
    failure where the constraints are consistent."""
    sol = jaxdae.simulate(system, formulation, 0.0, t1, scale * Q0, V0)
    assert sol.succeeded
    assert float(jnp.max(jnp.abs(sol.phi[-1]))) > 1e-3


# Strategy objects -------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(stepsize_controller=diffrax.PIDController(rtol=-1, atol=1e-8)), r"`rtol` must be"),
        (
            dict(stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=float("nan"))),
            r"`atol` must be",
        ),
        (dict(stepsize_controller=diffrax.PIDController(rtol=0.0, atol=0.0)), r"not both be zero"),
        (
            dict(stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8, dtmin=-1.0)),
            r"`dtmin` must be a positive",
        ),
        (
            dict(
                stepsize_controller=diffrax.PIDController(
                    rtol=1e-6, atol=1e-8, dtmin=0.1, dtmax=0.01
                )
            ),
            r"`dtmin` .* must not exceed",
        ),
        (
            dict(stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8, factormax=0.5)),
            r"`factormax` must be at least 1",
        ),
        (
            dict(stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8, safety=0.0)),
            r"`safety` must be in \(0, 1\]",
        ),
        (
            dict(
                stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8, pcoeff=float("inf"))
            ),
            r"`pcoeff` must be",
        ),
        (
            dict(
                stepsize_controller=diffrax.ClipStepSizeController(
                    diffrax.PIDController(rtol=-1e-6, atol=1e-8)
                )
            ),
            r"`rtol` must be",
        ),
        (
            dict(
                stepsize_controller=diffrax.ClipStepSizeController(
                    diffrax.PIDController(rtol=1e-6, atol=1e-8), jump_ts=[0.5, float("nan")]
                )
            ),
            r"jump_ts=...\)` must hold finite times",
        ),
        (
            dict(adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=0)),
            r"\(checkpoints=\.\.\.\)` must be a positive integer",
        ),
    ],
)
def test_bad_strategy_objects_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, Q0, V0, **options)


# Batches with bad members -----------------------------------------------------------

GOOD_Q0 = jnp.stack([Q0, 1.01 * Q0])
BAD_Q0 = jnp.stack([Q0, Q0.at[0].set(jnp.nan), 1.01 * Q0])
BAD_V0 = jnp.stack([V0, V0, V0])
INVALID = int(jaxdae.RESULTS.invalid_input._value)
SUCCESS = int(jaxdae.RESULTS.successful._value)


@pytest.mark.slow
def test_a_bad_member_under_vmap_is_that_members_failure():
    """`throw=False`: a nan start or a negative gain fails its own member only."""
    by_state = jax.jit(
        jax.vmap(lambda q, v: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, q, v, throw=False))
    )
    sol = by_state(BAD_Q0, BAD_V0)
    assert np.asarray(sol.result._value).tolist() == [SUCCESS, INVALID, SUCCESS]
    assert np.all(np.isnan(sol.q_final[1]))
    good = by_state(GOOD_Q0, BAD_V0[:2])
    np.testing.assert_allclose(sol.q_final[np.array([0, 2])], good.q_final, rtol=0, atol=1e-12)

    by_gain = jax.vmap(
        lambda kp: jaxdae.simulate(
            PENDULUM, jaxdae.Baumgarte(10.0, kp), 0.0, 1.0, Q0, V0, throw=False
        )
    )
    sol = by_gain(jnp.array([25.0, -1.0]))
    assert np.asarray(sol.result._value).tolist() == [SUCCESS, INVALID]
    assert np.all(np.isfinite(sol.q_final[0]))


@pytest.mark.slow  # the default run has an ensemble member's own failure in test_faults_batches
def test_a_bad_row_of_a_traced_ensemble_is_that_rows_failure():
    """`throw=False`: the row with a nan start does not stall the others' shared steps,
    which give what they give without it."""
    solve = jax.jit(
        lambda q, v: jaxdae.simulate_ensemble(PENDULUM, BAUMGARTE, 0.0, 1.0, q, v, throw=False)
    )
    sol = solve(BAD_Q0, BAD_V0)
    assert np.asarray(sol.result._value).tolist() == [SUCCESS, INVALID, SUCCESS]
    assert np.all(np.isnan(sol.q_final[1]))
    good = solve(GOOD_Q0, BAD_V0[:2])
    np.testing.assert_allclose(sol.q_final[np.array([0, 2])], good.q_final, rtol=0, atol=1e-12)


def test_a_bad_member_still_raises_with_throw():
    with pytest.raises(Exception, match=r"`q0` contains non-finite values"):
        jax.vmap(lambda q, v: jaxdae.simulate(PENDULUM, BAUMGARTE, 0.0, 1.0, q, v))(BAD_Q0, BAD_V0)


@pytest.mark.slow
def test_traced_failure_reports_member_time_and_state(capsys):
    """Under the caller's `jax.jit` and `vmap`, a failed solve writes what happened, the
    failed member, `t` and `q` to standard error before the error (whose message is fixed
    at compile time); successful solves write nothing."""
    arm = TwoLinkManipulator()
    q0, v0 = arm.initial_state()
    solve = jax.jit(
        jax.vmap(
            lambda t1: jaxdae.simulate(arm, jaxdae.Baumgarte(20.0, 100.0), 0.0, t1, q0, v0).q_final
        )
    )
    solve(jnp.array([0.2, 0.3]))
    assert "jaxdae" not in capsys.readouterr().err
    with pytest.raises(Exception, match="singular"):
        solve(jnp.array([0.2, 2.0]))
    err = capsys.readouterr().err
    assert err.startswith("jaxdae.SimulationError: The constraint matrix")
    assert re.search(r"stopped \(batch element \(1,\)\) at t = 0\.49\d+, q = \[", err)
    ensemble = jax.jit(
        lambda q, v: (
            jaxdae.simulate_ensemble(arm, jaxdae.Baumgarte(20.0, 100.0), 0.0, 2.0, q, v).q_final
        )
    )
    with pytest.raises(Exception, match="singular"):
        ensemble(jnp.stack([q0, q0]), jnp.stack([v0, 1.01 * v0]))
    assert re.search(r"stopped \(batch element \(0,\)\) at t = 0\.49\d+", capsys.readouterr().err)
