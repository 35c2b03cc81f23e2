"""The result of [`jaxdae.simulate`][], the base it shares with
[`jaxdae.ActuatedSolution`][], the outcomes of a solve and their messages.

Below the formulations, which name their failures with `RESULTS`: this module imports
nothing of jaxdae's but its types and the adapter of private names. Plotting lives above
it, in `jaxdae.viz`, which registers its function with [`plot`][] when imported.
"""

import functools
import warnings
from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import numpy as np

from . import _thresholds
from ._compilation._private_apis import result_codes, result_messages
from ._custom_types import Array, Float, Int
from ._gains import is_concrete

with warnings.catch_warnings():  # `successful` gets a message (diffrax's is empty)
    warnings.simplefilter("ignore")

    class RESULTS(diffrax.RESULTS):  # pyright: ignore[reportGeneralTypeIssues]
        """Outcomes of a simulation: `RESULTS.successful` or a named failure.

        `sol.result == jaxdae.RESULTS.successful` (or `sol.succeeded`) tests an outcome;
        printed, an item shows its message. Besides diffrax's own (`max_steps_reached`,
        `dt_min_reached`, ...): `singular_constraint_matrix`,
        `stalled_near_singular_constraints`, `singular_dependent_jacobian`,
        `singular_decoupling_matrix`, `non_finite_state` (fixed steps),
        `non_finite_mass_matrix`, `indefinite_mass_matrix`,
        `non_finite_forces`, `non_finite_constraints`, `non_finite_rates` (the model broke
        mid-run),
        `diverged`, `constraints_not_met`, `constraint_tol_exceeded` (checks after the
        solve), `projection_failed`
        ([`jaxdae.Projected`][]), `singular_newton_matrix` ([`jaxdae.GeneralizedAlpha`][]),
        `event_budget_exceeded`, `impact_not_solved`, `contact_forces_not_solved` and
        `resting_contact_unsupported` ([`jaxdae.EventDriven`][]), `contact_not_converged`
        ([`jaxdae.TimeStepping`][]) and `invalid_input`
        (a bad member of a traced batch with `throw=False`). The guide "Failures and
        guarantees" (docs/failures.md) says what each means and what to do about it."""

        successful = "The solve reached `t1`."

        singular_constraint_matrix = (
            "The constraint matrix J M⁻¹ Jᵀ became singular (redundant constraints or a "
            "singular configuration), so the exact Lagrange multipliers do not exist there. "
            "Use `jaxdae.PseudoInverse` or `jaxdae.ModifiedLagrange`, which continue through "
            "such configurations."
        )
        stalled_near_singular_constraints = (
            "The steps shrank until the solve stalled (it reached `max_steps`, or a step "
            "size at the rounding level of `t`) where the constraint Jacobian has lost most "
            "of its scale: its smallest singular value below a tenth of its largest, now or "
            "at t0. The constraints degenerate there (a constraint whose gradient vanishes, "
            "such as a pendulum whose prescribed length reaches zero, or a configuration "
            "where they stop being independent), and more steps will not carry the solve "
            "through: end it before the reported `t`, or write the constraints so that their "
            "gradient keeps its rank. With `ts`, `sol.jacobian_conditioning` shows the "
            "approach."
        )
        singular_dependent_jacobian = (
            "The Jacobian ∂F/∂q_dep of the geometric constraints with respect to the dependent "
            "coordinates became singular (condition [4] of Krasinskaya and Krasinskiy (2013) "
            "fails), so the dependent velocities cannot be solved for: choose other coordinates "
            "as dependent in `jaxdae.RedundantCoordinates`, or use a Lagrange-multiplier "
            "formulation."
        )

        singular_decoupling_matrix = (
            "The decoupling matrix g = ∂f⁽ᵖ⁻¹⁾/∂w · B of the program constraints lost rank "
            "(g gᵀ became singular), so no input enforces them there (Mukharlyamov (2019), eq. "
            "[2.9]; in the adaptive-optics element of §5: s(t) = 0 or sin φ = 0). Change the "
            "programmed motion so that it avoids the singular configuration."
        )

        non_finite_state = (
            "The state became non-finite (inf or nan) with a fixed step size: the step is too "
            "large for the system or for the gains (or the model itself produced nan or inf "
            "there: evaluate it at the reported t and q). Check the spectral radius of the "
            "method's "
            "transition `jaxdae.transition_matrix(jaxdae.perturbation_matrix(...), solver, dt)` "
            "(it must be below 1, Mukharlyamov (2019) §4), or reduce `dt0`."
        )

        non_finite_mass_matrix = (
            "The model produced a non-finite mass matrix (nan or inf) during the solve, so "
            "the step size shrank to nothing: check `kinetic_energy` / `mass_matrix` near "
            "the reported t and q (a square root or division that leaves its domain)."
        )
        non_finite_forces = (
            "The model produced non-finite generalized forces (nan or inf) during the "
            "solve, so the step size shrank to nothing: check `potential_energy`, "
            "`generalized_forces` and the velocity terms of `kinetic_energy` near the "
            "reported t and q (a square root or division that leaves its domain)."
        )
        non_finite_constraints = (
            "The model produced non-finite constraints or constraint derivatives (nan or "
            "inf) during the solve, so the step size shrank to nothing: check `constraints` "
            "/ `velocity_constraints` (and their first and second derivatives) near the "
            "reported t and q."
        )
        non_finite_gaps = (
            "The system's gaps (`gaps`, its one-sided constraints) became non-finite (nan or "
            "inf) during the solve, so no crossing of theirs could be found: the motion "
            "passed them unchecked. Check `gaps` near the reported t and q, and between the "
            "last event and it."
        )
        non_finite_rates = (
            "The rates of the state became non-finite (nan or inf) during the solve although "
            "the mass matrix, forces and constraints are finite there: the formulation's "
            "linear solve broke down (a singular mass matrix or constraint matrix). Check "
            "the model near the reported t and q."
        )
        diverged = (
            "The solve diverged: the constraint residual grew more than a million-fold "
            "(above 1e6 · max(|Φ(t0)|, 1), docs/failures.md), so the trajectory is "
            "meaningless. With a fixed step, the step is too large for the gains: check "
            "`jaxdae.spectral_radius(jaxdae.transition_matrix(jaxdae.perturbation_matrix("
            "formulation, m), solver, dt0))` < 1 (Mukharlyamov (2019) §4), or reduce `dt0` or the "
            "gains."
        )
        constraints_not_met = (
            "The constraints cannot be met: at the end of the solve more than a tenth of "
            "the stabilization's target G q̈ = s lies outside the range of the constraint "
            "Jacobian G while |Φ| is not small (docs/failures.md): the constraints "
            "contradict each other (e.g. |q|² = 1 and |q|² = 4) and the formulation settled "
            "on a compromise. Check `constraints` for inconsistent rows."
        )
        constraint_tol_exceeded = (
            "The solve reached `t1`, but its constraint residual max(|Φ|, |Ψ|) there exceeds "
            "what the formulation and the tolerances promise (`constraint_tol` of "
            "`jaxdae.simulate`; by default 1000 · (atol + rtol · max(1, |q0|, |v0|)), or "
            "10⁻³ · max(1, |q0|, |v0|) with fixed steps, plus the violation a penalty "
            "formulation leaves by design, or the violation at t0 if larger; "
            "docs/failures.md), so the trajectory is off its constraints. Tighten "
            "`rtol`/`atol` or the step `dt0`, check that the constraints can be met along "
            "the motion (a prescribed motion that leaves the workspace), or pass "
            "`constraint_tol=` the residual you accept."
        )
        projection_failed = (
            "The projection onto the constraint manifold (`jaxdae.Projected`) did not "
            "converge after an accepted step: its Newton iterations left |Φ| or |Φ̇, Ψ| "
            "above its tolerance: a start far off the constraints (project it first with "
            "`jaxdae.consistent_initial_state`), a singular configuration nearby, where "
            "J M⁻¹ Jᵀ is nearly singular, or constraints that no configuration meets. Reduce "
            "`rtol`/`atol` (a smaller drift per step), raise `Projected(iterations=...)` or "
            "loosen its `tol`."
        )
        invalid_input = (
            "The input of this member of a traced batch is invalid (a non-finite initial "
            "state, a mass matrix that is not positive definite at q0, non-finite forces "
            "at the start, gains that are not positive definite, or bad times, `dt0` or "
            "tolerances; for a `jaxdae.multibody.TreeMechanism` on its recursive path, 12 "
            "bodies or more, such a mass matrix or such forces stall the solve: "
            "`dt_min_reached`); with "
            "`throw=False` it is reported here instead of raising for the whole batch. "
            "Call `jaxdae.simulate` on this member alone for the exact message."
        )
        singular_newton_matrix = (
            "The steps of `jaxdae.GeneralizedAlpha` failed until the step size shrank to "
            "nothing, because its Newton matrix is singular: the constraint Jacobian [Φ_q; Ψ_v] "
            "has dependent rows at the reported state (redundant constraints, or a singular "
            "configuration), and the Newton iteration's LU solve needs independent ones. Pass a "
            "least-squares solve: `jaxdae.GeneralizedAlpha(root_finder="
            "diffrax.with_stepsize_controller_tols(optimistix.Chord)("
            "linear_solver=lineax.SVD()))`."
        )

        event_budget_exceeded = (
            "The solve met more events (impacts, contacts, releases of the system's `gaps`) "
            "than `jaxdae.EventDriven(max_events=...)` allows and stopped at the last one: "
            "raise `max_events`, or raise `min_bounce_speed` so that slow bounces end as "
            "resting contact (a ball that bounces ever lower meets infinitely many impacts "
            "in a finite time)."
        )
        impact_not_solved = (
            "The impact problem at an event had no solution (its complementarity problem "
            "did not converge): the gaps' Jacobian at the reported state has rows that the "
            "mass metric cannot separate (gaps that repeat each other, or that the "
            "bilateral constraints already fix). Check `gaps` near the reported t and q."
        )
        contact_forces_not_solved = (
            "The contact forces at an event had no solution: with Coulomb friction, a "
            "sliding contact whose normal force would have to pull to stay closed "
            "(Painlevé's paradox: a large coefficient of friction on a contact that slides "
            "in the direction that loads it, e.g. a rod dragged along the ground at a steep "
            "angle), or contacts whose forces repeat each other. No Coulomb force is "
            "consistent there (the motion would need a tangential impact, which is not "
            "applied), so the solve ends at that event. Lower `friction` at that contact, "
            "or check `gaps` and `slip_velocities` near the reported t and q."
        )
        resting_contact_unsupported = (
            "A contact came to rest, and the solver integrates the bilateral constraints "
            "alone (`jaxdae.GeneralizedAlpha`): the resting contact's force is not in its "
            "equations, and the motion would pass through the contact. The solve ends where "
            "the contact closed. Integrate a system whose contacts rest with an ODE solver "
            "(`diffrax.Tsit5()`, `diffrax.Kvaerno5()`, `jaxdae.Rodas5P()`) or "
            "`jaxdae.Projected`, whose rates carry the contact forces."
        )
        contact_not_converged = (
            "The contact problem of a step of `jaxdae.TimeStepping` (its cone quadratic "
            "program) did not converge to its tolerance within `max_iterations`, and the "
            "solve ends at that step: contacts with very different stiffness in the mass "
            "metric (a light body pressed between heavy ones), or many redundant contacts. "
            "Raise `TimeStepping(max_iterations=...)`, loosen its `tolerance`, or reduce `dt`."
        )
        indefinite_mass_matrix = (
            "The mass matrix stopped being positive definite during the solve (singular or "
            "indefinite), so the accelerations have no meaning there and the step size "
            "shrank to nothing: a negative or zero mass or inertia (e.g. a design parameter "
            "after an optimizer's step), or a configuration where the model loses the "
            "inertia of a coordinate. Check the masses and inertias (`kinetic_energy` / "
            "`mass_matrix`, a tree's bodies) near the reported t and q."
        )


RESULTS.__module__ = "jaxdae"  # printed as `jaxdae.RESULTS<message>`


class SimulationError(RuntimeError):
    """Raised by [`jaxdae.simulate`][] with `throw=True` when the solve did not succeed."""


class Events(eqx.Module):
    """The events of a solve of a system with one-sided constraints
    ([`jaxdae.AbstractSystem.gaps`][]), in the order they happened, at most `max_events`
    of [`jaxdae.EventDriven`][].

    **Fields:**

    - `count`: how many events happened.
    - `t`: their times, shape `(E,)` (`inf` past `count`).
    - `gap`: the index of the gap that triggered each, shape `(E,)` (`-1` past `count`).
    - `kind`: what happened, shape `(E,)`: `Events.IMPACT` (the gap closed and opened
        again), `Events.CONTACT` (it closed and stays closed: resting contact, a link on
        its limit), `Events.RELEASE` (a resting contact let go: its force would pull),
        for contacts with friction `Events.STICK` (it stopped sliding and sticks) and
        `Events.SLIP` (it started to slide, or slides the other way; in space also where
        its slip has turned 60° from the direction it had at the last event, which the
        solve takes anew there), and `-1` past `count`.
    - `impulse`: the normal impulse of the triggering gap (its multiplier's time integral
        over the impact, `≥ 0`; zero for a release, a stick or a slip), shape `(E,)`.
    """

    count: Int[Array, ""]
    t: Float[Array, " E"]
    gap: Int[Array, " E"]
    kind: Int[Array, " E"]
    impulse: Float[Array, " E"]

    IMPACT: ClassVar[int] = 0
    CONTACT: ClassVar[int] = 1
    RELEASE: ClassVar[int] = 2
    STICK: ClassVar[int] = 3
    SLIP: ClassVar[int] = 4
    KIND_NAMES: ClassVar[tuple[str, ...]] = ("impact", "contact", "release", "stick", "slip")

    def table(self) -> list:
        """The events as `(t, gap, kind, impulse)` rows (concrete values only). For the
        events of a batch (`jax.vmap(jaxdae.simulate)`), one table per member, as a list
        (nested as the batch is)."""
        if not is_concrete(self.count):
            raise ValueError(
                "`Events.table()` reads concrete events: call it on the "
                "solution returned outside `jax.jit` and `jax.vmap`."
            )
        if np.ndim(self.count):
            return [
                jax.tree.map(lambda x, i=i: x[i], self).table()
                for i in range(np.shape(self.count)[0])
            ]
        count = int(self.count)
        return [
            (
                float(self.t[i]),
                int(self.gap[i]),
                self.KIND_NAMES[int(self.kind[i])],
                float(self.impulse[i]),
            )
            for i in range(count)
        ]


class AbstractSolution(eqx.Module):
    """What every solution holds: the saved times and states, the result, where the solve
    ended and its step statistics. The base of [`jaxdae.Solution`][] and
    [`jaxdae.ActuatedSolution`][], which document these fields with their own."""

    ts: Float[Array, " N"]
    q: Float[Array, "N n"]
    v: Float[Array, "N n"]
    result: RESULTS
    t_final: Float[Array, ""]
    q_final: Float[Array, " n"]
    v_final: Float[Array, " n"]
    stats: dict[str, Int[Array, ""]]

    @property
    def succeeded(self):
        """Boolean array (one per trajectory of a batch): `result` is
        `RESULTS.successful`, i.e. the solve reached `t1` (and, for a `Solution`, passed
        the checks after it: finite, not diverged, constraints met within
        `constraint_tol`; docs/failures.md).
        With `throw=False`, test it before using a solution."""
        return self.result == RESULTS.successful

    def plot(self, **kwargs):
        """Plots this solution against time, one panel each (a batch as lines or a
        percentile band): for a `Solution` coordinates, constraint violations, energy
        drift, multipliers and events; for an `ActuatedSolution` coordinates, actuator
        states, inputs and the perturbations of the program constraints. The keyword
        arguments are those of `jaxdae.viz.plot_solution`.

        Needs matplotlib, the `viz` extra: `pip install jaxdae[viz]`.

        **Returns:**

        The matplotlib `Figure`.
        """
        return plot(self, **kwargs)


@functools.singledispatch
def plot(solution: AbstractSolution, **kwargs):
    """Draws `solution`: the body of `AbstractSolution.plot`, dispatched on the type of
    the solution. `jaxdae.viz` registers its `plot_solution` here for every solution type
    when it is imported (as `import jaxdae` does), so that the core does not import the
    plotting layer."""
    del kwargs
    raise NotImplementedError(
        f"No plotting function is registered for {type(solution).__name__}: "
        "`import jaxdae.viz` registers one."
    )


class Solution(AbstractSolution):
    """A constrained trajectory and its diagnostics at the saved times.

    Rows after a failure (see `result`) are `inf`, as in diffrax.

    **Fields:**

    - `ts`: saved times, shape `(N,)`.
    - `q`, `v`: coordinates and velocities, shape `(N, n)` (all coordinates; with
        [`jaxdae.RedundantCoordinates`][] the dependent velocities are those of eq. [5]).
    - `p`: generalized momenta (`∂T/∂v` for a `LagrangianSystem`, the state's momenta for a
        `HamiltonianSystem`), shape `(N, n)`.
    - `phi`, `dphi`: holonomic residual `Φ` and its rate `Φ̇`, shape `(N, m)`.
    - `psi`: nonholonomic residual `Ψ`, shape `(N, k)`.
    - `multipliers`: the multipliers the formulation implies (`M q̈ = Q − Gᵀλ`), holonomic
        then nonholonomic, shape `(N, m + k)`.
    - `energy`: total mechanical energy `T + V`, shape `(N,)`.
    - `t_final`, `q_final`, `v_final`, `p_final`: where the solve ended (at `t1`, or where it
        failed).
    - `result`: a [`jaxdae.RESULTS`][] item.
    - `stats`: diffrax's step statistics (`num_steps`, `num_accepted_steps`,
        `num_rejected_steps`, `max_steps`).
    - `events`: the events of a system with [`gaps`][jaxdae.AbstractSystem.gaps] (impacts,
        contacts, releases; a [`jaxdae.Events`][]), else `None`.
    - `jacobian_conditioning`: `σ_r / σ_1` of the constraint Jacobian `G = [Φ_q; Ψ_v]` at
        each saved time, shape `(N,)`, `σ_r` its smallest singular value among those that
        were non-zero at `t0` (so redundant constraints do not count), `σ_1` its largest
        there or at `t0`, whichever is larger: 1 without constraints, near 0 near a singular
        configuration, where the motion's continuation is not unique (`singular_passages`). `nan`
        for more than 48 constraints (its cost would exceed the solve's).
    """

    phi: Float[Array, "N m"]
    dphi: Float[Array, "N m"]
    psi: Float[Array, "N k"]
    multipliers: Float[Array, "N c"]
    energy: Float[Array, " N"]
    p: Float[Array, "N n"]
    p_final: Float[Array, " n"]
    jacobian_conditioning: Float[Array, " N"]
    events: "Events | None" = None

    def singular_passages(self, threshold: float = 1e-2) -> np.ndarray | list:
        """The saved times where the solve passed through or near a singular configuration
        (concrete solutions only): the local minima of `jacobian_conditioning` below
        `threshold`. There the constraints lose rank and the continuation of the motion
        is not unique: [`jaxdae.ModifiedLagrange`][] may follow another branch than
        [`jaxdae.PseudoInverse`][] (the guide "Failures and guarantees",
        docs/failures.md). Resolved at the saved times: pass dense `ts` to find them.
        For a batch, the times of each trajectory, as a list."""
        if isinstance(threshold, str) or np.ndim(threshold) != 0 or not (0 < float(threshold) <= 1):
            raise ValueError(
                "`threshold` must be a number in (0, 1] (the conditioning σ_r / σ_1 below "
                f"which a saved time counts as near a singular configuration); got {threshold}."
            )
        if not is_concrete(self.jacobian_conditioning):
            raise ValueError(
                "`singular_passages()` reads a concrete solution: call it on the solution "
                "returned outside `jax.jit` and `jax.vmap` (return the solution from the "
                "compiled function, then call it)."
            )
        conditioning, ts = np.asarray(self.jacobian_conditioning), np.asarray(self.ts)
        if conditioning.ndim > 1:  # a batch, nested or not: one entry per member
            return [
                Solution.singular_passages(  # pyright: ignore[reportReturnType]
                    eqx.tree_at(
                        lambda s: (s.ts, s.jacobian_conditioning), self, (ts[i], conditioning[i])
                    ),
                    threshold,
                )
                for i in range(conditioning.shape[0])
            ]
        if np.shape(self.phi)[-1] + np.shape(self.psi)[-1] > _thresholds.CONDITIONING_MAX:
            raise ValueError(
                "This solution has no `jacobian_conditioning` to read: its constraint "
                f"Jacobian has more than {_thresholds.CONDITIONING_MAX} rows, beyond which "
                "the conditioning is not computed at the saved states (`nan`). Evaluate "
                "`jnp.linalg.svd(system.terms(t, q, v).jacobian, compute_uv=False)` at the "
                "saved states of interest instead."
            )
        below = np.isfinite(conditioning) & (conditioning < threshold)
        # One time per passage: the lowest row of each run of rows below the threshold.
        edges = np.flatnonzero(np.diff(np.concatenate([[0], below.astype(int), [0]])))
        return np.array(
            [
                ts[start + np.argmin(conditioning[start:end])]
                for start, end in zip(edges[::2], edges[1::2], strict=True)
            ]
        )


def failure_message(sol: AbstractSolution) -> str | None:
    """A message naming the first failed solve with its final `t` and `q` (concrete values only)."""
    return failure_text(result_codes(sol.result), sol.t_final, sol.q_final, *residuals(sol))


@functools.singledispatch
def residuals(sol: AbstractSolution) -> tuple:
    """The saved constraint residuals `(Φ, Ψ)` that a failure message quotes, registered
    per solution type; `()` for a solution without them (an `ActuatedSolution`)."""
    del sol
    return ()


@residuals.register
def _(sol: Solution) -> tuple:
    return (sol.phi, sol.psi)


def failure_text(codes, t_final, q_final, phi=None, psi=None, element=None) -> str | None:
    """[`failure_message`][] from the arrays of a solution (NumPy values; with leading batch
    axes, the first failed element is named), or None if every solve succeeded. `phi` and
    `psi` (saved residuals) add the constraint residual to a divergence's message; `element`
    (one index per batch axis, after those of `codes`) names the element these values were
    taken from."""
    codes = np.asarray(codes)
    failed = codes != result_codes(RESULTS.successful)
    if not np.any(failed):
        return None
    index = tuple(int(i) for i in np.argwhere(failed)[0]) if codes.ndim else ()
    named = index if element is None else index + tuple(int(i) for i in np.asarray(element)[index])
    text = result_messages(RESULTS)[int(codes[index])]
    t = np.asarray(t_final)[index]
    q = np.asarray(q_final)[index]
    where = f" (batch element {named})" if named else ""
    message = (
        f"{text}\nThe solve stopped{where} at t = {t:.9g}, q = {np.array2string(q, precision=6)}."
    )
    if phi is not None and int(codes[index]) in (
        result_codes(RESULTS.diverged),
        result_codes(RESULTS.constraints_not_met),
    ):
        residual = np.concatenate([np.asarray(phi)[index], np.asarray(psi)[index]], axis=-1)
        last = residual[np.all(np.isfinite(residual), axis=-1)]
        if len(last):
            message += (
                f" Constraint residual at the last saved time: |Φ| = "
                f"{np.max(np.abs(last[-1]), initial=0.0):.3g} "
                f"(at the start: {np.max(np.abs(residual[0]), initial=0.0):.3g})."
            )
    return message
