"""The contact schemes of [`jaxdae.simulate`][]: their abstract base, which the problem
stage consults, the check of the shapes of a system's one-sided constraint data before
either scheme solves, and the settings of the event-driven scheme
([`jaxdae.EventDriven`][], with `event_settings`; its solve is `_events.py`).
[`jaxdae.TimeStepping`][] is `_time_stepping.py`."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class AbstractContactScheme(eqx.Module):
    """How [`jaxdae.simulate`][] treats the one-sided constraints of a system, given as its
    `events`: exactly, by events ([`jaxdae.EventDriven`][]), or by fixed time steps
    ([`jaxdae.TimeStepping`][]). The problem stage (`_problem.py`) consults it once."""

    @abc.abstractmethod
    def configure(self, call, t0, t1):
        """`(call, stepping)`: the `SolveCall` of a solve from `t0` to `t1` as this scheme
        solves it, and the [`jaxdae.TimeStepping`][] that steps it (`None` for a scheme
        that integrates between events). Refuses, with a `ValueError`, options the scheme
        does not take."""


def check_stop_shapes(system, t0, q_one, q0, tolerance: float | None) -> None:
    """`ValueError` for stop data of the wrong shape: `restitution` or `friction` not one
    coefficient or one per gap, `slip_velocities` not one or two per gap; and, where
    `tolerance` is given (concrete values), a start `q0` that violates a gap by more than
    it. `q_one` is one trajectory's coordinates (for the shapes); the system has gaps."""
    shape = jax.eval_shape(system.gaps, t0, q_one).shape
    for name, values in (("restitution", system.restitution()), ("friction", system.friction())):
        if jnp.ndim(values) > 1 or jnp.size(values) not in (1, shape[0]):
            raise ValueError(
                f"`{name}` must return one coefficient or one per gap ({shape[0]}); got "
                f"shape {jnp.shape(values)}."
            )
    slip_shape = jax.eval_shape(system.slip_velocities, t0, q_one, q_one).shape
    if slip_shape not in (shape, (*shape, 2)):
        raise ValueError(
            f"`slip_velocities` must return one sliding velocity per gap, shape {shape} (in "
            f"the plane), or two, shape {(*shape, 2)} (in space); got shape {slip_shape}."
        )
    if tolerance is not None:
        gaps = np.asarray(system.gaps(t0, q0))
        if np.any(gaps < -tolerance):
            index = int(np.argmin(gaps))
            raise ValueError(
                f"The initial state violates {system.gap_label(index)}: g(t0, q0)[{index}] = "
                f"{gaps[index]:.6g} < 0 (a one-sided constraint `gaps(t, q) ≥ 0`). Start "
                "where every gap is open or closed (≥ 0)."
            )


def _event_count(value):
    """An integer count (a Python or NumPy integer, not a bool) as an `int`; anything else
    as it is, for the check to name."""
    if isinstance(value, np.integer) and not isinstance(value, np.bool_):
        return int(value)
    return value


class EventDriven(AbstractContactScheme):
    """How [`jaxdae.simulate`][] treats the one-sided constraints of a system
    ([`jaxdae.AbstractSystem.gaps`][]): exactly, by events.

    The solve stops where a gap closes, to the solver's tolerance in time, and applies
    Newton's impact law (the impulses in the mass metric that keep the bilateral
    constraints, no gap pulling, simultaneous impacts as one complementarity problem). A
    closed gap that comes to rest carries a force that holds it closed (`g̈ + k_d ġ + k_p g
    = 0`, any formulation between events) until that force would pull; then the solve
    stops again and releases it. [`jaxdae.Solution`][]`.events` lists what happened.

    With Coulomb friction ([`jaxdae.AbstractSystem.friction`][]) a resting contact sticks
    while its tangential force lies in the cone `|λ_T| ≤ μ λ_N` and slips with `λ_T = −μ
    λ_N v_T/|v_T|` otherwise (Pfeiffer and Glocker (1996), ch. 7; in space the isotropic
    cone of Glocker (2001)); stick and slip are events. In space a slipping contact's
    friction force turns with its slip between events; the solve stops to take the slip's
    reference direction anew where the slip has turned 60° from it (a `slip` event), so
    that its stop is located where the slip velocity vanishes (docs/guides/impacts.md).

    Gradients pass through the event times and the impact maps. Where an event appears or
    disappears with a parameter they are those of the branch the solve took: a gap that
    touches zero without changing sign within a step is no event; at an exact tie of two
    events the derivative of the least condition averages the tied ones
    (docs/guides/gradients_through_contact.md).

    **Arguments:**

    - `max_events`: the most events (impacts, contacts, releases) of one solve (static).
        One more ends the solve there with `RESULTS.event_budget_exceeded`.
    - `min_bounce_speed`: a gap that would bounce off slower than this (`e |ġ⁻|`, in its
        own units per unit time) closes plastically and rests, as Chrono's minimum bounce
        speed: without it a bouncing ball meets infinitely many impacts in a finite time.
    - `contact_gains`: `(k_d, k_p)` of the resting contacts' stabilization, positive.
    - `gap_tolerance`: gaps within this of zero count as closed at an event (default
        `0.01 √ε` of the state's dtype).
    """

    max_events: int = eqx.field(static=True, default=100, converter=_event_count)
    min_bounce_speed: float = 1e-3
    contact_gains: tuple[float, float] = (20.0, 100.0)
    gap_tolerance: float | None = None

    def __check_init__(self):
        if (
            isinstance(self.max_events, bool)
            or not isinstance(self.max_events, int)
            or self.max_events < 1
        ):
            raise ValueError(f"`max_events` must be a positive integer; got {self.max_events!r}.")
        if not (np.isfinite(self.min_bounce_speed) and self.min_bounce_speed >= 0):
            raise ValueError(
                "`min_bounce_speed` must be a finite non-negative speed; got "
                f"{self.min_bounce_speed!r}."
            )
        if len(self.contact_gains) != 2 or not all(
            np.isfinite(k) and k > 0 for k in self.contact_gains
        ):
            raise ValueError(
                "`contact_gains` must be two finite positive numbers `(k_d, k_p)`; "
                f"got {self.contact_gains!r}."
            )
        if self.gap_tolerance is not None and not self.gap_tolerance > 0:
            raise ValueError(f"`gap_tolerance` must be positive; got {self.gap_tolerance!r}.")

    def tolerance(self, dtype) -> float:
        """`gap_tolerance`, or its default for `dtype`."""
        if self.gap_tolerance is not None:
            return self.gap_tolerance
        return float(0.01 * np.sqrt(np.finfo(dtype).eps))

    def configure(self, call, t0, t1):
        return call, None


def event_settings(
    system, call, trajectories, t0, q0, q_one, gap_shape: tuple[int, ...], eager: bool
) -> EventDriven | None:
    """The [`EventDriven`][] settings of a solve (`call.events`, or the default) where the
    system has gaps (their shape `gap_shape`, as the structure check found it), checked
    with the gaps at the start (`q_one`: one trajectory's coordinates, or their shape);
    `None` where it has none."""
    if len(gap_shape) != 1:
        raise ValueError(f"`gaps` must return a vector of shape (u,); got shape {gap_shape}.")
    if gap_shape[0] == 0:
        return None
    settings = EventDriven() if call.events is None else call.events
    if not trajectories.event_driven:
        raise ValueError(
            "The system has one-sided constraints (`gaps`), whose events stop and restart "
            "each trajectory on its own; `simulate_ensemble` steps its trajectories "
            "together. Use `jax.vmap(jaxdae.simulate)` (each member with its own events)."
        )
    check_stop_shapes(system, t0, q_one, q0, settings.tolerance(q0.dtype) if eager else None)
    return settings
