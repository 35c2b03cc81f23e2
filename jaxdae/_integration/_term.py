"""The DAE of a solve as a diffrax term: the system, its formulation and the structure of
the problem (the constant mass matrix's factor, the failure test's reference), which the
solvers, the event loop and the adjoints read from `terms`, as diffrax's solvers read
theirs. The solve's `args` are not used.

diffrax wraps the terms it is given (in its own term that flips time where `t1 < t0`), so
the parts that need the problem find its term inside `terms` (`system_term`) and replace it
there (`replace_system_term`)."""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._compilation._constants import detached
from .._compilation._operators import MassFactor
from .._formulations import AbstractFormulation
from .._solution import RESULTS
from .._systems._system import AbstractSystem
from ._vector_fields import jitted_failure, jitted_rates, jitted_rates_and_failure


class AbstractTimeTerm(diffrax.AbstractTerm):
    """A term whose control is time, `dy = vf(t, y, args) dt`, as `diffrax.ODETerm`'s."""

    def contr(self, t0, t1, **kwargs):
        del kwargs
        return t1 - t0

    def prod(self, vf, control):
        return jax.tree.map(lambda rate: control * rate, vf)


class AbstractTermWithVJP(AbstractTimeTerm):
    """A time term with its own vector–Jacobian product of `vf`, which
    [`jaxdae.ReverseSweepAdjoint`][] applies at each stage instead of differentiating `vf`
    (an ensemble applies each trajectory's own, row by row)."""

    # Whether `stage_vjp` reads the solver state at the end of the solve (so the adjoint
    # keeps it).
    reads_solver_state: ClassVar[bool] = False

    @abc.abstractmethod
    def stage_vjp(self, t, y, args, solver_state, t_start, cotangent):
        """`(y_bar, term_bar, args_bar)`: the vector–Jacobian product of `vf` at `(t, y)` in
        the step from `t_start` with respect to `y`, the term's arrays (`term_bar` has the
        term's structure) and `args` (None: no cotangent); `solver_state` is the solver
        state at the end of the solve (or of the segment that holds the step) where
        `reads_solver_state`, else None."""


class AbstractSystemTerm(AbstractTimeTerm):
    """The ODE that a formulation makes of a system's constrained equations of motion, with
    the state `y = (q, s)` (`s`: velocities or momenta, as the system says).

    Its fields are the problem the solve's parts read: the system, the formulation, the
    reference of the formulation's failure test (evaluated at the start, or None) and the
    factor of a constant mass matrix (computed once per solve and shared by every stage and
    every trajectory of an ensemble, or None)."""

    system: eqx.AbstractVar[AbstractSystem]
    formulation: eqx.AbstractVar[AbstractFormulation]
    reference: eqx.AbstractVar[Any]
    mass_factor: eqx.AbstractVar[MassFactor | None]

    @abc.abstractmethod
    def vf(self, t, y, args):
        """The rates `(q̇, ṡ)` of the state `y`."""

    @abc.abstractmethod
    def stopped_rows(self):
        """The trajectories (rows) of an ensemble that stand still in the step at hand, or
        None."""

    # Whether `rates_and_failure` computes the failure test with the rates (for a formulation
    # that `shares_failure_with_accelerations`): a solve then reads the test from the last
    # stage of each step (`_solve.StopAtFailure`).
    computes_failure_with_rates: ClassVar[bool] = False

    def failure(self, t, y):
        """The formulation's failure test at the state `y` of one trajectory (detached: a
        flag has no derivative, and a differentiated solve does not linearize it)."""
        q, s = y
        return jitted_failure(
            *detached((self.system, self.formulation, t, q, s, self.reference, self.mass_factor))
        )

    def rates_and_failure(self, t, y, args):
        """`(vf(t, y, args), failure(t, y))`, the failure's flag as a float of the state's
        dtype (0 or 1). Default: each computed on its own."""
        return self.vf(t, y, args), jnp.asarray(self.failure(t, y), y[0].dtype)

    # Whether `rates_and_located` computes the solve's located event condition with the
    # rates: a solve then reads it from the last stage of each step (`_solve.StopAtCrossing`).
    computes_located_with_rates: ClassVar[bool] = False

    def rates_and_located(self, t, y, args):
        """`(vf(t, y, args), value)`: the rates and the solve's located event condition (its
        `Dynamics.located`), for a term that `computes_located_with_rates`."""
        raise NotImplementedError(
            f"{type(self).__name__} does not compute its located condition with its rates."
        )


class SystemTerm(AbstractSystemTerm):
    """The term of one trajectory of [`jaxdae.simulate`][]: the rates of the state from
    the formulation's accelerations (`state_rates`)."""

    system: AbstractSystem
    formulation: AbstractFormulation
    reference: Any = None
    mass_factor: MassFactor | None = None

    computes_failure_with_rates: ClassVar[bool] = True

    def vf(self, t, y, args):
        if self.reference is not None and self.formulation.shares_failure_with_accelerations:
            # The function whose flag a solve reads at the steps' last stages
            # (`_solve.StopAtFailure`), so that JAX traces the rates once; XLA leaves out the
            # flag where it is not read.
            rates, _ = self.rates_and_failure(t, y, args)
            return rates
        q, s = y
        return jitted_rates(self.system, self.formulation, t, q, s, self.mass_factor)

    def rates_and_failure(self, t, y, args):
        del args
        q, s = y
        return jitted_rates_and_failure(
            self.system, self.formulation, t, q, s, self.reference, self.mass_factor
        )

    def stopped_rows(self):
        return None


class Dynamics(eqx.Module):
    """What the solve path integrates for a model `(system, strategy)` (a system and its
    formulation, or an actuated system and its control): the term, and the
    conditions (diffrax event conditions, which read the problem from the `terms` diffrax
    passes them) that stop the solve, each with the [`jaxdae.RESULTS`][] item it reports.

    `saves_solver_state`: the solve keeps its final solver state (an ensemble whose
    trajectories stop one by one reads the stopped rows from it)."""

    term: diffrax.AbstractTerm
    conditions: tuple[Callable, ...] = eqx.field(static=True, default=())
    failures: tuple[RESULTS, ...] = ()
    located: tuple[Callable, ...] = eqx.field(static=True, default=())
    saves_solver_state: bool = eqx.field(static=True, default=False)


def system_dynamics(system, formulation, reference, mass_factor, failure) -> Dynamics:
    """The `Dynamics` of one trajectory: its `SystemTerm`, stopped by the formulation's
    failure test (`failure_condition`, a `diffrax.Event`) with the result `failure`, where
    the formulation can fail (`failure` not None)."""
    term = SystemTerm(system, formulation, reference, mass_factor)
    if failure is None:
        return Dynamics(term)
    return Dynamics(term, (failure_condition,), (failure,))


def terms_within(terms) -> list:
    """The ODE terms and multi-terms inside `terms` (as `diffeqsolve` wrapped them):
    `diffrax.ODETerm` and jaxdae's terms whose control is time."""
    is_term = lambda x: isinstance(  # noqa: E731
        x, (diffrax.ODETerm, diffrax.MultiTerm, AbstractTimeTerm)
    )
    return [x for x in jax.tree.leaves(terms, is_leaf=is_term) if is_term(x)]


def one_ode_term(terms, solver: str):
    """The one ODE term inside `terms` (`terms_within`), or a `ValueError` naming `solver`,
    which integrates ODEs only."""
    odes = terms_within(terms)
    if len(odes) != 1 or isinstance(odes[0], diffrax.MultiTerm):
        raise ValueError(
            f"`{solver}` integrates an ODE given as one term whose control is time "
            f"(`diffrax.ODETerm`); got {[type(x).__name__ for x in odes]}."
        )
    return odes[0]


def failure_condition(t, y, args, *, terms, **kwargs):
    """The diffrax event condition of the formulation's failure test of one trajectory."""
    del args, kwargs
    return system_term(terms).failure(t, y)


def is_system_term(x) -> bool:
    return isinstance(x, AbstractSystemTerm)


def system_term(terms) -> AbstractSystemTerm:
    """The system's term inside the `terms` of a solve (as diffrax wrapped them)."""
    found = [x for x in jax.tree.leaves(terms, is_leaf=is_system_term) if is_system_term(x)]
    if len(found) != 1:
        raise ValueError(
            "This solver reads the system and formulation from the solve's term, which "
            "`jaxdae.simulate` and `jaxdae.simulate_ensemble` build: use it through them, "
            f"not in a `diffrax.diffeqsolve` of another term (got {terms!r:.200})."
        )
    return found[0]


def replace_system_term(terms, replace: Callable[[AbstractSystemTerm], AbstractSystemTerm]):
    """`terms` with the system's term inside them replaced by `replace(term)`."""
    return jax.tree.map(
        lambda x: replace(x) if is_system_term(x) else x, terms, is_leaf=is_system_term
    )
