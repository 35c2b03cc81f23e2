"""What differs between one trajectory and an ensemble of them: the layout of the initial
states, the traced initial state's checks, the error norm, the dynamics and the solution's
assembly. [`jaxdae.simulate`][] solves with `SingleTrajectory`,
[`jaxdae.simulate_ensemble`][] with `EnsembleTrajectories`; the solve itself
(`_simulate.py`) is the same for both."""

import abc
import functools
from collections.abc import Callable
from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

from .._checks import float_array
from .._compilation._constants import detached
from .._custom_types import Array
from .._solution import RESULTS, Solution
from .._systems._structure import constant_mass_factor
from ._diagnostics import assemble_solution, cut_at
from ._ensemble import (
    StopFailedTrajectories,
    ensemble_term,
    stopped_results,
    worst_trajectory_rms,
)
from ._term import Dynamics, system_dynamics
from ._vector_fields import failure_reference, system_terms


class AbstractTrajectories(eqx.Module):
    """How the trajectories of a solve are laid out: the strategy that the solve of a
    system and its formulation asks wherever one trajectory and an ensemble differ."""

    # The shape of `q0` and `v0`, for messages.
    state_shape: eqx.AbstractClassVar[str]
    # The step-size controller's default error norm.
    error_norm: eqx.AbstractClassVar[Callable]
    # Whether the solve can stop and restart at events (a system with gaps).
    event_driven: ClassVar[bool] = False

    @abc.abstractmethod
    def state_array(self, name: str, value) -> Array:
        """`value` (`q0` or `v0`) as a floating array, its shape checked (`state_shape`)."""

    def initial_states(self, q0, v0) -> tuple[Array, Array, tuple]:
        """`q0` and `v0` as floating arrays of one dtype and shape (`state_array`), and the
        state of one trajectory (`one_state`)."""
        q0, v0 = self.state_array("q0", q0), self.state_array("v0", v0)
        dtype = jnp.result_type(q0, v0)
        q0, v0 = q0.astype(dtype), v0.astype(dtype)
        if q0.shape != v0.shape:
            raise ValueError(
                f"`q0` and `v0` must have the same shape {self.state_shape}; "
                f"got {q0.shape} and {v0.shape}."
            )
        return q0, v0, self.one_state(q0, v0)

    @abc.abstractmethod
    def one_state(self, q0: Array, v0: Array) -> tuple:
        """The state of one trajectory (shapes, for the structure checks)."""

    @abc.abstractmethod
    def first_state(self, q0: Array, v0: Array) -> tuple[Array, Array]:
        """The initial state of the first trajectory."""

    @abc.abstractmethod
    def traced_state_flags(
        self, problems: Callable, initial: tuple, throw: bool
    ) -> tuple[Array | None, Array | bool]:
        """The initial state's flags of a traced solve from `problems(*initial, rows=rows)`
        (`initial_state_problems`; `initial = (q0, v0)`, then the mass matrix, whether its
        factor shows it positive definite and the forces where they are checked):
        `(flags, rows_invalid)`, the flags that join the solve's error (None: none) and,
        with `throw=False`, the trajectories whose initial state has a problem."""

    @abc.abstractmethod
    def solvable_start(self, q0: Array, v0: Array) -> tuple[Array, Array]:
        """The initial states that a traced solve with `throw=False` integrates (the
        invalid ones are reported by their result)."""

    @abc.abstractmethod
    def failure_reference(self, system, formulation, t0, q0, v0):
        """The formulation's `failure_reference` of each trajectory."""

    def dynamics(
        self,
        system,
        formulation,
        t0,
        q0,
        v0,
        solver: diffrax.AbstractSolver,
        failure: RESULTS | None,
    ) -> tuple[Dynamics, diffrax.AbstractSolver]:
        """What the solve from `(t0, q0, v0)` integrates, and its solver: the term of the
        system and its formulation (`term`), with the reference of the formulation's
        failure test where it stops the solve with the result `failure` (None: it cannot
        fail with the system's constraint counts) and the factor of a constant mass matrix,
        both computed once per solve."""
        reference = None
        if failure is not None:
            # Detached before the call: stopped after it, the call would still be linearized.
            reference = self.failure_reference(*detached((system, formulation, t0, q0, v0)))
        # A constant mass matrix is factored here, not at every stage (an ensemble's
        # trajectories share the system, so they share it too).
        mass_factor = constant_mass_factor(system, t0, *self.first_state(q0, v0), system_terms)
        return self.term(system, formulation, reference, mass_factor, solver, failure)

    @abc.abstractmethod
    def term(
        self,
        system,
        formulation,
        reference,
        mass_factor,
        solver: diffrax.AbstractSolver,
        failure: RESULTS | None,
    ) -> tuple[Dynamics, diffrax.AbstractSolver]:
        """`dynamics` from the failure reference (or None), the constant mass matrix's
        factor (or None) and the result of the formulation's failure (None: it cannot
        fail)."""

    @abc.abstractmethod
    def solution(
        self,
        system,
        formulation,
        start,
        ts,
        out: diffrax.Solution,
        result: RESULTS,
        limit: tuple[Array, Array],
        reverse: bool,
    ) -> tuple[Solution, tuple]:
        """The [`jaxdae.Solution`][] of the solve `out` from `start = (t0, q0, v0)` with
        jaxdae's `result`, and the mass matrix, whether its factor shows it positive
        definite and the forces at the initial states (`assemble_solution`; `limit`: each
        trajectory's residual limit; `reverse`: the solve is differentiable in reverse mode
        only)."""


class SingleTrajectory(AbstractTrajectories):
    """One trajectory: initial states of shape `(n,)`; a failure stops the solve."""

    state_shape: ClassVar[str] = "(n,)"
    error_norm: ClassVar[Callable] = staticmethod(optx.rms_norm)
    event_driven: ClassVar[bool] = True

    def state_array(self, name, value):
        array = float_array(name, value)
        if array.ndim != 1:
            raise ValueError(
                f"`{name}` must be a 1-D array of shape (n,); got shape {array.shape}."
            )
        return array

    def one_state(self, q0, v0):
        return q0, v0

    def first_state(self, q0, v0):
        return q0, v0

    def traced_state_flags(self, problems, initial, throw):
        return problems(*initial, rows=None)[0], False

    def solvable_start(self, q0, v0):
        return q0, v0

    def failure_reference(self, system, formulation, t0, q0, v0):
        return failure_reference(system, formulation, t0, q0, v0)

    def term(self, system, formulation, reference, mass_factor, solver, failure):
        return system_dynamics(system, formulation, reference, mass_factor, failure), solver

    def solution(self, system, formulation, start, ts, out, result, limit, reverse):
        reached = out.result == diffrax.RESULTS.successful
        return assemble_solution(
            system,
            formulation,
            start,
            ts,
            (out.ts, out.ys),
            (reached, result, out.stats),
            limit,
            reverse,
        )


class EnsembleTrajectories(AbstractTrajectories):
    """An ensemble: initial states of shape `(B, n)`, one row per trajectory, integrated as
    one ODE on shared steps; a trajectory whose formulation fails or whose model turns
    non-finite stops alone (`StopFailedTrajectories`)."""

    state_shape: ClassVar[str] = "(B, n)"
    error_norm: ClassVar[Callable] = staticmethod(worst_trajectory_rms)

    def state_array(self, name, value):
        array = float_array(name, value)
        if array.ndim != 2 or array.shape[0] == 0:
            raise ValueError(
                f"`{name}` must be a 2-D array of shape (B, n), one row per trajectory "
                f"(B ≥ 1); got shape {array.shape}."
            )
        return array

    def one_state(self, q0, v0):
        # Shapes only: no slicing, as `q0` may be sharded.
        lane = jax.ShapeDtypeStruct(q0.shape[1:], q0.dtype)
        return lane, lane

    def first_state(self, q0, v0):
        return q0[0], v0[0]

    def traced_state_flags(self, problems, initial, throw):
        if throw:  # one flag per problem, raised for any row
            flags, _ = jax.vmap(
                functools.partial(problems, rows="rows"), axis_name="rows", out_axes=(None, 0)
            )(*initial)
            return flags, False
        # each row's own flags, for its own result
        flags, _ = jax.vmap(functools.partial(problems, rows=None), out_axes=(0, 0))(*initial)
        return None, jnp.any(flags, axis=1)

    def solvable_start(self, q0, v0):
        # A row with a non-finite start would stall the shared steps of every row: it is
        # solved as a copy of a finite row.
        finite = jnp.all(jnp.isfinite(q0), axis=1) & jnp.all(jnp.isfinite(v0), axis=1)
        donor = jnp.argmax(finite)
        return tuple(jnp.where(finite[:, None], x, x[donor]) for x in (q0, v0))

    def failure_reference(self, system, formulation, t0, q0, v0):
        return jax.vmap(failure_reference, in_axes=(None, None, None, 0, 0))(
            system, formulation, t0, q0, v0
        )

    def term(self, system, formulation, reference, mass_factor, solver, failure):
        # Each trajectory stops alone (its formulation fails or its model turns non-finite),
        # read from the solver state.
        term = ensemble_term(system, formulation, reference, mass_factor)
        return (
            Dynamics(term, saves_solver_state=True),
            StopFailedTrajectories(solver, failure is not None),
        )

    def solution(self, system, formulation, start, ts, out, result, limit, reverse):
        t0, q0, v0 = start
        reached = out.result == diffrax.RESULTS.successful

        def trajectory(q0, v0, ys, t_failed, failure, limit):
            failed = jnp.isfinite(t_failed)
            ts_saved, ys = cut_at(ts, out.ts, ys, t_failed)
            return assemble_solution(
                system,
                formulation,
                (t0, q0, v0),
                ts,
                (ts_saved, ys),
                (reached & ~failed, RESULTS.where(failed, failure, result), out.stats),
                limit,
                reverse,
            )

        # Saved states are (time, trajectory, coordinate) in an ensemble: one trajectory each.
        t_failed, failures = stopped_results(out.solver_state, formulation)
        return jax.vmap(trajectory, in_axes=(0, 0, 1, 0, 0, 0))(
            q0, v0, out.ys, t_failed, failures, limit
        )
