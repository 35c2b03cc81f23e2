"""The right-hand sides that a solve integrates: the state's rates from a formulation's
accelerations, the failure indicator checked after every step, and their vector-Jacobian
products."""

import contextlib
import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._constants import jit_with_constants
from .._compilation._scalarize import array_form_scope, scalarize
from .._systems._structure import with_mass_factor
from .._systems._system import terms_in_array_form


@jit_with_constants
def _equations(system, t, q, v):
    # The system's terms, jitted so that JAX traces them once for both forms below: the
    # scalar graphs re-trace the jaxpr that this trace leaves in JAX's cache.
    return system.terms(t, q, v)


# The per-state functions are jitted so that JAX traces them (and their derivatives) once,
# however often diffrax and autodiff call them: tracing, not XLA, dominated compile time.
# For small systems the terms, the right-hand side and the failure check (evaluated at
# every stage of every step) are re-traced as scalar graphs, which XLA fuses
# (`_scalarize.py`).
@jit_with_constants
@scalarize
def system_terms(system, t, q, v):
    return _equations(system, t, q, v)


# The terms evaluated outside the steps' stages (the diagnostics at the saved states; the
# contact problem at an event and, while a contact rests, in the gaps' conditions), where
# a scalar graph's speed buys little: XLA compiles each place that evaluates the terms
# anew, and the scalar graph of larger terms compiles to many times the array form's size.
@jit_with_constants
@functools.partial(scalarize, max_work=_thresholds.OUTSIDE_STEPS_MAX_WORK)
def terms_outside_steps(system, t, q, v):
    return _equations(system, t, q, v)


def state_rates(system, formulation, t, q, s, mass_factor=None):
    """`(q̇, ṡ)` of the state `(q, s)`: the system says what `s` holds (velocities or
    momenta); a formulation may fill in dependent velocities (redundant coordinates).
    `mass_factor`: the factor of a constant `M`, computed once per solve (or `None`)."""
    s = formulation.velocities(system, t, q, s)
    terms = with_mass_factor(system_terms(system, t, q, s), mass_factor)
    acc, _ = formulation.accelerations(terms)
    return system.velocities(t, q, s), system.state_rate(t, q, s, terms, acc)


def failure_indicator(system, formulation, t, q, v, reference, mass_factor=None):
    """The formulation's `failure` at the state `(q, v)` (`mass_factor` as for
    `state_rates`)."""
    return formulation.failure(
        with_mass_factor(system_terms(system, t, q, v), mass_factor), reference
    )


@jit_with_constants
def failure_reference(system, formulation, t, q, v):
    """The formulation's `failure_reference` at the initial state `(q, v)` (evaluated once
    per solve, so not re-traced as a scalar graph)."""
    return formulation.failure_reference(system_terms(system, t, q, v))


def rates_and_failure(system, formulation, t, q, s, reference, mass_factor=None):
    """`state_rates` and the flag of `failure_indicator` (without derivative, as a float of
    the state's dtype) at one state, from one evaluation of the terms, the failure test
    reading what the accelerations computed (`AbstractFormulation.accelerations_and_failure`
    of a formulation that `shares_failure_with_accelerations`)."""
    s = formulation.velocities(system, t, q, s)
    terms = with_mass_factor(system_terms(system, t, q, s), mass_factor)
    (acc, _), failed = formulation.accelerations_and_failure(terms, reference)
    if jnp.result_type(failed) != jnp.bool_:
        raise TypeError(
            f"`{type(formulation).__name__}` declares `shares_failure_with_accelerations`, "
            "whose `failure` must return a flag (a boolean scalar); got "
            f"{jnp.result_type(failed)}. Return `value < 0` or the like, or leave the "
            "declaration out (the solve then evaluates `failure` after each step)."
        )
    rates = system.velocities(t, q, s), system.state_rate(t, q, s, terms, acc)
    return rates, jax.lax.stop_gradient(jnp.asarray(failed, q.dtype))


jitted_rates = jit_with_constants(scalarize(state_rates))


jitted_failure = jit_with_constants(scalarize(failure_indicator))


jitted_rates_and_failure = jit_with_constants(scalarize(rates_and_failure))


@jit_with_constants
def formulation_velocities(system, formulation, t, q, v):
    return formulation.velocities(system, t, q, v)


def form_of_terms(system, t, q, s):
    """[`array_form_scope`][] where the system's terms are in array form
    ([`terms_in_array_form`][]: a `LagrangianSystem`'s derived from their sparsity
    patterns), else no scope: what is evaluated from `constraints` and
    `velocity_constraints` alone takes the form of the terms. A scalar graph is many small
    kernels wherever the solve's loop does not run as one (a LAPACK call in it, as on
    Bricard's mechanism of `experiments/studies/work_precision.py`: 35 coordinates, whose
    projection ran about 1,560 kernels with them, 460 in array form)."""
    if terms_in_array_form(system, t, q, s):
        return array_form_scope()
    return contextlib.nullcontext()


def constraint_residuals(system, t, q, v):
    """`(Φ, Φ̇, Ψ)` at `(t, q, v)` from the system's `constraints` and
    `velocity_constraints` alone, equal to those of its terms where it declares
    `terms_from_constraints` (`holonomic_terms`, `nonholonomic_terms`)."""
    with form_of_terms(system, t, q, v):
        phi, dphi = jax.jvp(system.constraints, (t, q), (jnp.ones_like(t), v))
        return phi, dphi, system.velocity_constraints(t, q, v)


def rates_vjp(system, formulation, mass_factor, t, q, s, cotangent):
    """The vector–Jacobian product of `jitted_rates` with respect to the system, the formulation,
    the constant mass matrix's factor (or None) and the state."""
    _, pull = eqx.filter_vjp(
        lambda sfm, q, s: jitted_rates(*sfm[:2], t, q, s, sfm[2]),
        (system, formulation, mass_factor),
        q,
        s,
    )
    return pull(cotangent)


jitted_row_vjp = jit_with_constants(scalarize(rates_vjp))
