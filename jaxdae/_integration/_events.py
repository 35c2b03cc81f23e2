"""Event-driven solves of systems with one-sided constraints (`AbstractSystem.gaps`).

A solve of such a system is a sequence of diffrax solves, each from an event to the next:
it stops where a gap closes (a downcrossing of zero, located by a root finder on the
step's interpolation) or a resting contact's force would pull, applies the impact law
(`_formulations/_impacts.py`), decides which closed gaps rest, and goes on from there
until `t1`. The number of events is bounded ([`EventDriven`][]`.max_events`); a solve
that meets more ends with `RESULTS.event_budget_exceeded`.
"""

from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._compilation._constants import jit_with_constants
from .._compilation._kernels import kernel_boundary
from .._compilation._lcp import along, magnitudes, tangent_count, units
from .._compilation._operators import MassFactor
from .._compilation._private_apis import unvmap_any
from .._compilation._scalarize import scalarize
from .._compilation._stored_loop import stored_while_loop
from .._custom_types import Array, Bool, Float, Int
from .._formulations import AbstractFormulation
from .._formulations._impacts import (
    ContactModes,
    contact_problem,
    friction_coefficients,
    gap_terms,
    impact,
    resting_contacts,
    slip_tangents,
    unit_directions,
)
from .._solution import RESULTS, Events
from .._systems._structure import with_mass_factor
from .._systems._system import AbstractSystem
from ._contact_schemes import EventDriven
from ._controllers import AbstractControllerWrapper
from ._problem import SolveOptions, Times
from ._solve import integrate
from ._solvers import carries_contact_forces
from ._term import AbstractSystemTerm, Dynamics, system_term
from ._vector_fields import system_terms, terms_outside_steps


class ContactState(eqx.Module):
    """The gaps' state during one solve between events, in the term of that solve
    (`ContactTerm`):
    `modes`, which contacts rest and how those with friction stick or slip (see
    [`ContactModes`][]); `offset`, subtracted from an open gap in its event
    condition (a gap that starts closed counts as closing again only past the tolerance);
    `slip_offset`, subtracted from a slip's `d·v_T` in its conditions (a slip that starts
    from rest counts as stopping only past the tolerance); `gains`, `(k_d, k_p)`;
    `tolerance`, [`EventDriven`][]'s gap tolerance; `start_forces`, the resting contacts'
    forces at the solve's start (the transition's complementarity solution there), which
    its conditions read there."""

    modes: ContactModes
    offset: Float[Array, " u"]
    slip_offset: Float[Array, " u"]
    gains: tuple[Array, Array]
    tolerance: Array
    start_forces: Float[Array, " u_plus_f"]


def _contact_setup(system, formulation, contacts, t, q, s, mass_factor):
    s = formulation.velocities(system, t, q, s)
    terms = with_mass_factor(terms_outside_steps(system, t, q, s), mass_factor)
    gaps = gap_terms(system, t, q, system.velocities(t, q, s))
    return s, terms, gaps, contact_problem(formulation, terms, gaps, contacts.gains)


def _rates_and_terms(system, formulation, t, q, s, mass_factor):
    s = formulation.velocities(system, t, q, s)
    terms = with_mass_factor(system_terms(system, t, q, s), mass_factor)
    acceleration, _ = formulation.accelerations(terms)
    rates = system.velocities(t, q, s), system.state_rate(t, q, s, terms, acceleration)
    return s, terms, rates


# The terms and the plain rates as one scalar graph (`_scalarize.py`), whose terms the
# resting contacts' branch reuses: the step loop holds the equations of motion once.
_jitted_rates_and_terms = jit_with_constants(scalarize(_rates_and_terms))


@jit_with_constants
def contact_rates(system, formulation, contacts: ContactState, t, q, s, mass_factor=None):
    """`((q̇, ṡ), least)`: the rates with the resting contacts' forces, and the least of the
    event conditions there ([`condition_values`][], from the same contact forces); the plain
    rates and the least open gap, behind one branch, where none rests (in a batch: where
    none of the batch's does; the others get zero forces)."""
    s, terms, rates = _jitted_rates_and_terms(system, formulation, t, q, s, mass_factor)
    gap = jitted_open_gaps(system, contacts, t, q)

    def pushed():
        gaps = gap_terms(system, t, q, system.velocities(t, q, s))
        problem = contact_problem(formulation, terms, gaps, contacts.gains)
        forces = problem.forces(contacts.modes, contacts.tolerance)
        pushed_terms = eqx.tree_at(
            lambda x: x.forces, terms, terms.forces + gaps.directions.T @ forces
        )
        acceleration = problem.acceleration + problem.response @ forces
        least = jnp.min(_conditions(contacts, gap, forces, gaps.slip, gaps.friction))
        return (
            system.velocities(t, q, s),
            system.state_rate(t, q, s, pushed_terms, acceleration),
        ), least

    # (No contact rests: every tangential condition is `inf`.)
    plain = lambda: (rates, jnp.min(gap))  # noqa: E731
    return jax.lax.cond(unvmap_any(contacts.modes.active.any()), pushed, plain)


def open_gaps(system, contacts: ContactState, t, q):
    """Each gap less its offset: the event conditions where no contact rests."""
    return system.gaps(t, q) - contacts.offset


jitted_open_gaps = jit_with_constants(scalarize(open_gaps))


@jit_with_constants
def condition_values(
    system, formulation, contacts: ContactState, t, q, s, mass_factor=None, at_start: bool = False
):
    """Each gap's event condition (an event is a downcrossing of zero): the gap less its
    offset where open, the contact force where resting; then, where the contacts have
    friction, one per gap for the tangential mode: `μ λ − |λ_T|` where it sticks,
    `d·v_T` less its offset where it slips (`d` its direction, `±1` in the plane), `inf`
    where it does not touch; in space one more per gap, `d·v_T − cos 60° |v_T|` less the
    offset where it slips (the slip turned 60° from `d`: `d` is taken anew there, so that
    `d·v_T` reaches zero only where `v_T` does). The contact problem is solved behind one
    branch, where a contact rests (in a batch: any); `at_start` (static): at the solve's
    start, where `contacts.start_forces` are its forces."""
    gap = jitted_open_gaps(system, contacts, t, q)
    if at_start:
        friction = friction_coefficients(system, gap.shape[0], q.dtype)
        slip = jnp.zeros((0,), q.dtype)
        if friction.shape[0]:
            v = system.velocities(t, q, formulation.velocities(system, t, q, s))
            slip = system.slip_velocities(t, q, v).reshape(-1)
        return _conditions(contacts, gap, contacts.start_forces, slip, friction)

    def forces():
        _, _, gaps, problem = _contact_setup(system, formulation, contacts, t, q, s, mass_factor)
        return problem.forces(contacts.modes, contacts.tolerance), gaps.slip, gaps.friction

    def none():
        out = jax.eval_shape(forces)
        return tuple(jnp.zeros(x.shape, x.dtype) for x in out)

    active = unvmap_any(contacts.modes.active.any())
    return _conditions(contacts, gap, *jax.lax.cond(active, forces, none))


# The slip turned this far from its reference direction is an event that takes the
# direction anew (`_conditions`): far enough that the events are few, short of 90° so
# that `d·v_T` stays well away from zero while `v_T` does.
_TURN_COSINE = 0.5


def _conditions(contacts: ContactState, gap, force, slip, friction):
    """[`condition_values`][] from the open gaps less their offsets, the contact forces (read
    where a contact rests), the slip velocities and the coefficients of friction.

    A stick's condition is `μ λ − |λ_T|`, not the smooth `μ² λ² − |λ_T|²`: it keeps the
    units of the normal force's condition and is linear near its root, where `|λ_T| =
    μ λ > 0` is smooth; its kink at `λ_T = 0` lies where the condition is `μ λ`, far from
    zero, and [`magnitudes`][] gives it a zero derivative there."""
    size = gap.shape[0]
    normal = jnp.where(contacts.modes.active, force[:size], gap)
    if friction.shape[0] == 0:
        return normal
    sign = contacts.modes.sign
    tangents = tangent_count(sign)
    rubbing = contacts.modes.active & (friction > 0)
    velocity = slip.reshape(size, tangents)
    moving = along(sign, velocity) - contacts.slip_offset
    tangential = jnp.where(
        contacts.modes.stick,
        friction * force[:size] - magnitudes(force[size:].reshape(size, tangents)),
        moving,
    )
    conditions = [normal, jnp.where(rubbing, tangential, jnp.inf)]
    if tangents > 1:
        turned = moving - _TURN_COSINE * magnitudes(velocity)
        conditions.append(jnp.where(rubbing & ~contacts.modes.stick, turned, jnp.inf))
    return jnp.concatenate(conditions)


class ContactTerm(AbstractSystemTerm):
    """The term between two events of an event-driven solve: the rates with the resting
    contacts' forces (`contact_rates`; the plain rates, behind one branch, where no contact
    rests), for the gaps' state `contacts` since the last event."""

    system: AbstractSystem
    formulation: AbstractFormulation
    reference: Any = None
    mass_factor: MassFactor | None = None
    contacts: ContactState | None = None

    computes_located_with_rates: ClassVar[bool] = True

    def vf(self, t, y, args):
        rates, _ = self.rates_and_located(t, y, args)
        return rates

    def rates_and_located(self, t, y, args):
        del args
        q, s = y
        return contact_rates(
            self.system, self.formulation, self.contacts, t, q, s, self.mass_factor
        )

    def stopped_rows(self):
        return None


# One condition for all gaps, the least of theirs: each starts a solve positive (an open
# gap, a resting contact's push, or a closed gap's margin), so the least crosses zero
# where the first of them does. (One condition, not one per gap: diffrax compiles each
# condition at every place it evaluates it, the root finder's derivative too.)


def _default_float(value):
    # diffrax's event location pairs a condition's value with a Python `0.0` in a
    # `lax.cond`, whose branches must agree: the default float dtype (a float32 solve
    # under float64 mode otherwise fails to trace).
    return value.astype(jnp.result_type(float))


def _first_condition(t, y, args, *, terms, t0=None, **kwargs):
    del args, kwargs
    q, s = y
    term = system_term(terms)
    # The condition is evaluated at the solve's start with `t` its `t0` (the same array;
    # by diffrax, or by `StopAtCrossing`), where the transition's complementarity solution
    # gives the contact forces: the program then solves the contact problem in the step
    # loop and the root finder only.
    return _default_float(
        jnp.min(
            condition_values(
                term.system,
                term.formulation,
                term.contacts,
                t,
                q,
                s,
                term.mass_factor,
                at_start=t is t0,
            )
        )
    )


def event_dynamics(dynamics: Dynamics) -> Dynamics:
    """What an event-driven solve integrates between two events, from the plain `dynamics`
    with its failure conditions: the rates with the resting contacts' forces (the plain
    rates, behind one branch, where no contact rests), stopped where a gap's condition
    crosses zero (located) and at the formulation's conditions.

    One solve serves both cases: its program holds the solve once, and reverse mode
    differentiates one solve inside each pass of the event loop. The branches cost
    little in free flight because the contact forces are computed by array operations
    (`_compilation/_lcp.py`), which keep the step loop one kernel on the CPU
    (docs/design_measurements.md#one-solve-between-events)."""
    term = system_term(dynamics.term)
    return Dynamics(
        ContactTerm(term.system, term.formulation, term.reference, term.mass_factor),
        dynamics.conditions,
        dynamics.failures,
        located=(_first_condition,),
    )


class ApproachLimitedSteps(AbstractControllerWrapper):
    """An adaptive controller whose steps end at most just past the time an open gap that
    closes would reach zero at its present rate, `(g − offset + tol) / (−ġ)`.

    diffrax sees an event only in the signs of its condition at the ends of a step. In
    free flight the error control asks for nothing, and a step may pass a gap through
    (two balls that would have collided, each on the other side at the step's end). Limited
    so, a step that meets a gap ends inside it (`tol` past zero, for a gap that closes at
    constant rate), and the event is located there.
    """

    controller: diffrax.AbstractAdaptiveStepSizeController
    # The solve's term, whose gaps limit the steps.
    term: ContactTerm

    def wrap(self, direction):
        return ApproachLimitedSteps(self.controller.wrap(direction), self.term)

    def _limited(self, t, y, tnext):
        q, s = y
        term = self.term
        return jnp.minimum(
            tnext, t + approach_time(term.system, term.formulation, term.contacts, t, q, s)
        )

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        tnext, state = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return self._limited(t0, y0, tnext), state

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        keep, tprev, tnext, jump, state, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
        )
        y = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1_candidate, y0)
        return keep, tprev, self._limited(tprev, y, tnext), jump, state, result


def _approach_time(system, formulation, contacts: ContactState, t, q, s):
    """The least time in which an open gap that closes reaches the tolerance past zero at
    its present rate (`inf` where none closes): the step limit of `ApproachLimitedSteps`."""
    v = system.velocities(t, q, formulation.velocities(system, t, q, s))
    gap, rate = jax.jvp(lambda t_, q_: system.gaps(t_, q_), (t, q), (jnp.ones_like(t), v))
    room = gap - contacts.offset
    closing = ~contacts.modes.active & (rate < 0)
    time = jnp.min(
        jnp.where(closing, (room + contacts.tolerance) / jnp.where(closing, -rate, 1.0), jnp.inf),
        initial=jnp.inf,
    )
    return time


approach_time = jit_with_constants(scalarize(_approach_time))


class _Transition(eqx.Module):
    state: Float[Array, " n"]
    modes: ContactModes
    offset: Float[Array, " u"]
    slip_offset: Float[Array, " u"]
    triggered: Bool[Array, " u_plus_f"]
    impulses: Float[Array, " u_plus_f"]
    impact_solved: Bool[Array, ""]
    contacts_solved: Bool[Array, ""]
    forces: Float[Array, " u_plus_f"]


@jit_with_constants
def transition(
    system,
    formulation,
    settings: EventDriven,
    contacts: ContactState,
    t,
    q,
    s,
    hit,
    mass_factor=None,
) -> _Transition:
    """What happens at `(t, q, s)` where a solve stopped at an event (`hit`) or starts: the
    conditions that triggered it (at or below zero, the least among them), the impact of
    the closed gaps, the state after it, and which of them rest, stick or slip."""
    tolerance = settings.tolerance(q.dtype)
    active = contacts.modes.active
    size = active.shape[0]
    # The terms and the contact problem at the event, once for the conditions that
    # triggered it and the impact; the terms after the impact for the resting contacts.
    s, terms, gaps, problem = _contact_setup(system, formulation, contacts, t, q, s, mass_factor)
    held = problem.forces(contacts.modes)
    values = _conditions(
        contacts, jitted_open_gaps(system, contacts, t, q), held, gaps.slip, gaps.friction
    )
    triggered = hit & ((values <= 0) | (jnp.arange(values.shape[0]) == jnp.argmin(values)))
    v = system.velocities(t, q, s)
    restitution = jnp.broadcast_to(jnp.asarray(system.restitution(), v.dtype), (size,))
    released = triggered[:size] & active
    closed = active | triggered[:size] | (gaps.gap <= tolerance)
    outcome = impact(terms, gaps, closed, restitution, settings.min_bounce_speed)
    change = outcome.velocity_change
    s_after = s + change if system.state_is_velocity else s + terms.mass_matrix @ change
    gaps_after = gap_terms(system, t, q, v + change)
    # At rest after the impact (to rounding): those may carry a force from now on, and
    # stick where they have friction.
    at_rest_speed = 1e-3 * settings.min_bounce_speed + 64 * jnp.finfo(q.dtype).eps * jnp.max(
        jnp.abs(gaps.rate), initial=0.0
    )
    at_rest = gaps_after.rate <= at_rest_speed
    candidates = closed & ~released & at_rest
    terms_after = with_mass_factor(terms_outside_steps(system, t, q, s_after), mass_factor)
    # A contact at rest along its surface may stick, one that slides keeps its way. One
    # whose stick just failed (its tangential force at the friction limit) slips against
    # that force: at the limit, sticking would hold it on the boundary. In space the
    # direction `d` is the slip's present one (taken anew at every event), and that of a
    # failed stick, against its force, is the direction in which it starts to move where
    # the contact's tangential response is isotropic (a sphere, a point mass on a plane).
    free, sign = jnp.zeros((size,), bool), contacts.modes.sign
    turning = None
    speed = jnp.zeros((size,), q.dtype)
    slip_at_rest = at_rest_speed
    if gaps_after.slip.shape[0]:
        tangents = gaps_after.tangents
        slip_after = gaps_after.slip.reshape(size, tangents)
        speed = magnitudes(slip_after)
        # A slip's stop is located to the crossing's width in time (`64 ε (1 + |t|)`, the
        # events' `DownCrossing`): the slip left there, up to twice that width times the
        # slip's rate, is at rest too (in float32 it exceeds `at_rest_speed`).
        slip_rate = (problem.matrix @ held + problem.vector)[size:].reshape(size, tangents)
        width = 64 * jnp.finfo(q.dtype).eps * (1 + jnp.abs(t))
        slip_at_rest = at_rest_speed + 2 * width * magnitudes(slip_rate)
        if tangents == 1:
            sign = jnp.where(gaps_after.slip < 0, -1.0, 1.0).astype(q.dtype)
            opposed = jnp.where(held[size:] > 0, -1.0, 1.0).astype(q.dtype)
        else:
            # (A contact at rest to rounding keeps its last direction, or at the start,
            # whose are zero, the first tangent.)
            fallback = jnp.where(
                magnitudes(sign)[:, None] > 0, sign, unit_directions(size, tangents, q.dtype)
            )
            sign = units(slip_after, fallback)
            opposed = -units(held[size:].reshape(size, tangents), -sign)
        unstuck = triggered[size : 2 * size] & active & contacts.modes.stick
        free = (speed <= slip_at_rest) & ~unstuck
        turning = free | unstuck
        sign = jnp.where(unstuck if tangents == 1 else unstuck[:, None], opposed, sign)
    problem_after = contact_problem(formulation, terms_after, gaps_after, contacts.gains)
    modes, forces, solved = resting_contacts(problem_after, candidates, free, sign, turning)
    # A closed gap that does not rest starts its next solve open by a margin, so that its
    # condition is positive there and a step over its whole flight (a small bounce) still
    # ends below zero. The margin is the tolerance where it neither rests nor opens
    # (released, or touching without force: its rounding must not count as a new
    # impact), a millionth of it where it opens.
    lingering = gaps_after.rate <= settings.min_bounce_speed
    margin = jnp.where(lingering, tolerance, 1e-6 * tolerance)
    offset = jnp.where(~modes.active & closed, gaps.gap - margin, 0.0)
    # A slip that starts from rest starts with its condition a tolerance above zero, for
    # the same reason.
    slip_offset = jnp.zeros_like(offset)
    if gaps_after.slip.shape[0]:
        slip_offset = jnp.where(speed <= slip_at_rest, -tolerance, 0.0).astype(q.dtype)
    return _Transition(
        s_after,
        modes,
        offset,
        slip_offset,
        triggered,
        outcome.impulses,
        outcome.solved,
        solved,
        forces,
    )


class EventSolve(eqx.Module):
    """An event-driven solve as the solution assembly reads it: `ts` and `ys` laid out as
    diffrax saves them with `save_at`, diffrax's `result` (successful where it reached
    `t1`), the summed `stats`, and the [`jaxdae.Events`][]."""

    ts: object
    ys: object
    result: diffrax.RESULTS
    stats: dict
    events: Events


class _Carry(eqx.Module):
    # Where the last solve stopped (or the start), before the event's transition.
    t: Array
    q: Array
    s: Array
    contacts: ContactState
    hit: Bool[Array, ""]
    count: Int[Array, ""]
    done: Bool[Array, ""]
    reached: Bool[Array, ""]
    result: RESULTS
    rows: tuple
    saved: Array
    events: Events
    stats: dict


_STAT_KEYS = ("num_steps", "num_accepted_steps", "num_rejected_steps")


def _recorded(events: Events, record, t, after: _Transition, released) -> Events:
    """`events` with the event at `t` (its transition `after`) appended where `record`."""
    size = after.modes.active.shape[0]
    first = jnp.argmax(after.triggered)
    which = first % size
    normal = jnp.where(
        released,
        Events.RELEASE,
        jnp.where(after.modes.active[which], Events.CONTACT, Events.IMPACT),
    )
    tangential = jnp.where(after.modes.stick[which], Events.STICK, Events.SLIP)
    kind = jnp.where(first < size, normal, tangential)
    index = jnp.minimum(events.count, events.t.shape[0] - 1)

    def put(array, value):
        return array.at[index].set(jnp.where(record, value, array[index]))

    return Events(
        count=events.count + record,
        t=put(events.t, t),
        gap=put(events.gap, which),
        kind=put(events.kind, kind),
        impulse=put(events.impulse, after.impulses[which]),
    )


def shifted_start(term: diffrax.AbstractTerm, t, y):
    """The start `(t, y)` of a solve, as `(t₀, y₀)` with `t₀` a constant of the derivatives
    and `y₀` that carries `t`'s: `y₀` is `y`, with the derivative `ẏ − ṫ f(t, y)`.

    The flow `φ(s; t, y)` of `ẏ = f(t, y)` from `y` at `t` has `∂φ/∂t = −(∂φ/∂y) f(t, y)`,
    and so has every time and state that the solve computes from it (an event's time
    too): moving the start along the trajectory changes nothing after it. A derivative
    with respect to `t` is then one with respect to `y` along `−f`, to the solve's
    tolerance, and the solve's adjoint holds its steps' times constant. (The rates are
    evaluated by the derivatives only: a custom JVP.)"""
    return jax.lax.stop_gradient(t), _start_state(y, t, term)


@eqx.filter_custom_jvp
def _start_state(y, t, term):
    del t, term
    return y


@_start_state.def_jvp
def _start_state_jvp(primals, tangents):
    y, t, term = primals
    y_dot, t_dot, _ = tangents
    if t_dot is None:
        return y, y_dot
    rates = term.vf(t, y, None)
    if y_dot is None:
        y_dot = jax.tree.map(lambda _: None, y)
    return y, jax.tree.map(
        lambda d, f: -t_dot * f if d is None else d - t_dot * f,
        y_dot,
        rates,
        is_leaf=lambda d: d is None,
    )


def _held(tree):
    """`tree` with its floating-point arrays constants of the derivatives."""
    return jax.tree.map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, tree)


def integrate_with_events(
    dynamics: Dynamics, y0, times: Times, options: SolveOptions, settings: EventDriven
) -> tuple[EventSolve, RESULTS]:
    """The event-driven solve from `y0` over `times` (module docstring), and jaxdae's
    result. Each pass of its loop applies the transition of the event where the last
    solve stopped (at the start: the impacts and resting contacts of the initial state),
    then solves to the next event."""
    q0, s0 = y0
    t0, t1, ts = times.t0, times.t1, times.ts
    dtype = q0.dtype
    term = system_term(dynamics.term)
    system, formulation = term.system, term.formulation
    size = jax.eval_shape(system.gaps, t0, q0).shape[0]
    slips = friction_coefficients(system, size, dtype).shape[0]
    tangents = slip_tangents(system, t0, q0) if slips else 1
    gains = tuple(jnp.asarray(k, dtype) for k in settings.contact_gains)
    budget = settings.max_events
    count_rows = 0 if ts is None else ts.shape[0]
    carry = _Carry(
        t=t0,
        q=q0,
        s=s0,
        contacts=ContactState(
            ContactModes(
                jnp.zeros((size,), bool),
                jnp.zeros((size,), bool),
                jnp.zeros((size,) if tangents == 1 else (size, tangents), dtype),
            ),
            jnp.zeros((size,), dtype),
            jnp.zeros((size,), dtype),
            gains,
            jnp.asarray(settings.tolerance(dtype), dtype),
            jnp.zeros((size + tangents * slips,), dtype),
        ),
        hit=jnp.asarray(False),
        count=jnp.asarray(0),
        done=jnp.asarray(False),
        reached=jnp.asarray(False),
        result=RESULTS.successful,
        rows=(
            jnp.full((count_rows,) + q0.shape, jnp.inf, dtype),
            jnp.full((count_rows,) + s0.shape, jnp.inf, dtype),
        ),
        saved=jnp.zeros((count_rows,), bool),
        events=Events(
            count=jnp.asarray(0),
            t=jnp.full((budget,), jnp.inf, dtype),
            gap=jnp.full((budget,), -1),
            kind=jnp.full((budget,), -1),
            impulse=jnp.zeros((budget,), dtype),
        ),
        stats={key: jnp.asarray(0) for key in _STAT_KEYS},
    )

    tolerance = settings.tolerance(dtype)

    def step(carry: _Carry) -> _Carry:
        def apply():
            return transition(
                system,
                formulation,
                settings,
                carry.contacts,
                carry.t,
                carry.q,
                carry.s,
                carry.hit,
                term.mass_factor,
            )

        def none():  # all gaps open, none resting: nothing happens
            shapes = jax.eval_shape(apply)
            return _Transition(
                carry.s,
                carry.contacts.modes,
                carry.contacts.offset,
                carry.contacts.slip_offset,
                jnp.zeros(shapes.triggered.shape, bool),
                jnp.zeros(shapes.impulses.shape, dtype),
                jnp.asarray(True),
                jnp.asarray(True),
                jnp.zeros(shapes.forces.shape, dtype),
            )

        closed = jitted_open_gaps(system, carry.contacts, carry.t, carry.q) <= tolerance
        touching = carry.hit | closed.any() | carry.contacts.modes.active.any()
        after = jax.lax.cond(unvmap_any(touching), apply, none)
        released = (after.triggered[:size] & carry.contacts.modes.active).any()
        # An impact of the initial state (a closed gap that closes further at `t0`) is an
        # event too, though no solve stopped there.
        at_start = (carry.t == t0) & (carry.events.count == 0)
        record = carry.hit | (at_start & jnp.any(after.impulses > 0))
        events = _recorded(carry.events, record, carry.t, after, released)
        contacts = ContactState(
            after.modes,
            after.offset,
            after.slip_offset,
            gains,
            carry.contacts.tolerance,
            after.forces,
        )
        if ts is None:
            saveat = diffrax.SaveAt(t1=True)
        else:
            saveat = diffrax.SaveAt(
                subs=[diffrax.SubSaveAt(ts=jnp.clip(ts, carry.t, t1)), diffrax.SubSaveAt(t1=True)]
            )
        segment = eqx.tree_at(lambda t: t.contacts, term, contacts, is_leaf=lambda x: x is None)
        segment_options = options
        if adaptive:
            # (The controller's decisions are constants of the derivatives.)
            segment_options = eqx.tree_at(
                lambda o: o.stepsize_controller,
                options,
                ApproachLimitedSteps(options.stepsize_controller, _held(segment)),
            )
        # The stretch starts at the event's time as a constant of the derivatives, with a
        # start state that carries the time's derivative instead (`shifted_start`): the
        # adjoint then replays steps at fixed times. With adaptive steps it is solved from
        # the constant `t_before` (`_restart.py`).
        t_start, y_start = shifted_start(segment, carry.t, (carry.q, after.state))
        out, result = integrate(
            eqx.tree_at(lambda d: d.term, dynamics, segment),
            y_start,
            Times(t_before, t1, None) if adaptive else Times(t_start, t1, None),
            segment_options,
            saveat,
            start=t_start if adaptive else None,
        )
        segment_rows = None
        if ts is None:
            t_end, (q_end, s_end) = out.ts[0], (out.ys[0][0], out.ys[1][0])
        else:
            (_, end_t), (segment_rows, (end_q, end_s)) = out.ts, out.ys
            t_end, q_end, s_end = end_t[0], end_q[0], end_s[0]
        # The event loop runs its body kernel by kernel, and the diffrax solve inside it as
        # one kernel, compiled apart from the transition: as one kernel the whole loop
        # compiles several times longer, and it turns once per event only.
        y_end = kernel_boundary(jnp.concatenate([q_end, s_end]))
        q_end, s_end = y_end[: q_end.shape[0]], y_end[q_end.shape[0] :]
        reached = out.result == diffrax.RESULTS.successful
        hit = (out.result == diffrax.RESULTS.event_occurred) & out.event_mask[0]
        failed = ~reached & ~hit
        over = hit & (events.count >= budget)
        rows, saved = carry.rows, carry.saved
        if segment_rows is not None:
            inside = (ts >= carry.t) & ((ts < t_end) | (reached & (ts <= t_end)))
            rows = tuple(
                jnp.where(inside[:, None], new, old)
                for new, old in zip(segment_rows, rows, strict=True)
            )
            saved = saved | inside
        result = RESULTS.where(failed, result, RESULTS.successful)
        result = RESULTS.where(over, RESULTS.event_budget_exceeded, result)
        # An impact or contact forces without a solution end the solve where they
        # happened, before them; so does a contact that comes to rest where the solver
        # cannot carry its force.
        impact_unsolved = ~after.impact_solved
        contacts_unsolved = after.impact_solved & ~after.contacts_solved
        solved = after.impact_solved & after.contacts_solved
        unsupported = jnp.asarray(False) if carries_forces else after.modes.active.any() & solved
        ended = ~solved | unsupported
        keep = lambda old, new: jax.tree.map(  # noqa: E731
            lambda a, b: jnp.where(ended, a, b), old, new
        )
        result = RESULTS.where(unsupported, RESULTS.resting_contact_unsupported, result)
        # Gaps that turned non-finite hide every crossing: the motion passed them unchecked.
        lost = ~ended & ~jnp.all(jnp.isfinite(jitted_open_gaps(system, contacts, t_end, q_end)))
        result = RESULTS.where(lost, RESULTS.non_finite_gaps, result)
        ended_here = ended | lost
        return _Carry(
            t=keep(carry.t, t_end),
            q=keep(carry.q, q_end),
            s=keep(carry.s, s_end),
            contacts=contacts,
            hit=hit & ~ended_here,
            count=events.count,
            done=reached | failed | over | ended_here,
            reached=reached & ~ended_here,
            result=RESULTS.where(
                impact_unsolved,
                RESULTS.impact_not_solved,
                RESULTS.where(contacts_unsolved, RESULTS.contact_forces_not_solved, result),
            ),
            rows=keep(carry.rows, rows),
            saved=keep(carry.saved, saved),
            events=events,
            stats={key: carry.stats[key] + out.stats[key] for key in _STAT_KEYS},
        )

    carries_forces = carries_contact_forces(options.solver)
    adaptive = isinstance(options.stepsize_controller, diffrax.AbstractAdaptiveStepSizeController)
    # Before `t0` by the solve's length: strictly before every event.
    t_before = t0 - (t1 - t0)
    if isinstance(options.adjoint, diffrax.ForwardMode):
        final = jax.lax.while_loop(lambda c: ~c.done, step, carry)
    else:
        final = stored_while_loop(lambda c: ~c.done, step, carry, max_steps=budget + 1)
    if ts is None:
        saved_ts = jnp.stack([t0, final.t])
        ys = (jnp.stack([q0, final.q]), jnp.stack([s0, final.s]))
    else:
        saved_ts = (jnp.where(final.saved, ts, jnp.inf), final.t[None])
        ys = (final.rows, (final.q[None], final.s[None]))
    stats = {**final.stats, "max_steps": options.max_steps, "num_events": final.events.count}
    reached = diffrax.RESULTS.where(
        final.reached, diffrax.RESULTS.successful, diffrax.RESULTS.event_occurred
    )
    return EventSolve(saved_ts, ys, reached, stats, final.events), final.result
