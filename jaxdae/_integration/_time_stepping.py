"""Time stepping of systems with one-sided constraints and friction
([`jaxdae.TimeStepping`][]): a fixed step of the Moreau–Jean / Anitescu–Potra kind, as a
diffrax solver (`TimeSteppingSolver`) run with `diffrax.ConstantStepSize`, so that
diffrax's loop gives the saving, `jit`, `vmap` and `grad` (its checkpointed adjoint).
Each step solves one cone QP of all contacts at once (`_compilation/_cones.py`)."""

from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .. import _thresholds
from .._compilation._cones import cone_solve
from .._compilation._constants import jit_with_constants
from .._compilation._linalg import psd_pseudo_inverse
from .._compilation._operators import FactoredOperator, MassFactor, factor_of
from .._compilation._sparse import cholesky_factor
from .._custom_types import Array, Float
from .._formulations._impacts import (
    constrained_inverse_mass,
    friction_coefficients,
    slip_tangents,
)
from .._formulations._multipliers import eliminate
from .._gains import is_concrete
from .._solution import RESULTS
from .._systems._structure import with_mass_factor
from ._adjoint import adjoint_for
from ._contact_schemes import AbstractContactScheme, check_stop_shapes
from ._replay_adjoint import ReplayAdjoint
from ._solvers import AbstractFailureNamingSolver
from ._term import AbstractSystemTerm, system_term
from ._vector_fields import system_terms

# The diffrax result that carries `RESULTS.contact_not_converged` out of a step: one that
# no diffrax solver step returns (lineax's iterative solvers' `stagnation`).
_CARRIER = diffrax.RESULTS.stagnation


def _iteration_count(value):
    """An integer (a Python or NumPy integer, not a bool) as an `int`; anything else as
    it is, for the check to name."""
    if isinstance(value, np.integer) and not isinstance(value, np.bool_):
        return int(value)
    return value


def _flag(value):
    """A NumPy bool as a Python `bool`; anything else as it is, for the check to name."""
    return bool(value) if isinstance(value, np.bool_) else value


class TimeStepping(AbstractContactScheme):
    """How [`jaxdae.simulate`][] treats the one-sided constraints of a system
    ([`jaxdae.AbstractSystem.gaps`][]), with their restitution and Coulomb friction: by
    fixed time steps, all contacts at once, each step one convex problem.

    Pass it as `simulate(..., events=jaxdae.TimeStepping(dt=1e-3))`. Where
    [`jaxdae.EventDriven`][] stops at every impact, contact and release and treats each
    exactly, time stepping never stops: its cost per step is fixed whatever the contacts
    do, which suits scenes whose many contacts open and close, and batches (`jax.vmap`)
    whose members meet different contacts. Its accuracy is first order in `dt`.

    **One step** from `t` to `t + h` (Moreau (1988), Jean (1999); Anitescu and Potra
    (1997), Anitescu (2006)): the smooth part from the formulation, `v_free = v + h q̈`
    with `q̈` the formulation's accelerations at `(t, q, v)` (the bilateral constraints
    with its stabilization); then the impulses `P` of all contacts,
    `v⁺ = v_free + M̃⁻¹ [W; W_T]ᵀ P` with `M̃⁻¹` the inverse mass that keeps the
    bilateral constraints' rates; then `q⁺ = q + h q̇(q, v⁺)`, moved onto the holonomic
    constraints `Φ = 0` by one Newton step in the mass metric (as time-stepping codes
    renormalize their quaternions). With `D = [W; W_T] M̃⁻¹ [W; W_T]ᵀ` and the contact
    velocities `y = D P + b` (`b`: those of `v_free`, the normal ones plus `g/h`), the
    impulses solve Coulomb's cone complementarity problem:

    - normal: `0 ≤ P_n ⊥ ġ⁺ + g/h ≥ 0` — the gap closes no further than to zero within
        the step (every gap takes part: an open one pushes only where it would close
        within the step);
    - friction: `P_T` in the isotropic cone `|P_T| ≤ μ P_n`, against the slip with
        maximal dissipation (one tangent per contact in the plane, two in space).

    It is solved as a fixed point of convex cone QPs `min ½ PᵀDP + (b + s)ᵀP` over the
    cones, `s = [μ|v_T⁺|; 0]` from the last iterate (De Saxcé's correction; Acary et al.
    (2011)). With `relaxed=True`, one QP with `s = 0`: Anitescu's convex relaxation,
    whose normal condition reads `ġ⁺ + g/h ≥ μ|v_T⁺|`, so that a sliding contact lifts
    off at the rate `μ|v_T|` (by `O(h μ |v_T|)` in one step, after which it may fly;
    nothing while it sticks or rolls); it always has a solution and costs one QP. A
    contact that closes within the step faster than `min_bounce_speed / e` bounces
    instead, by Newton's law on the velocities (Moreau's impact law): `ġ⁺ ≥ −e ġ⁻`, `e`
    the system's [`restitution`][jaxdae.AbstractSystem.restitution], friction as above.

    Each QP is solved by accelerated projected gradient descent with restarts (APGD,
    Mazhar et al. (2015), as Project Chrono), warm-started from the previous step's
    impulses, until the residual of the problem's natural map is below `tolerance`
    times `max(1, |contact velocities|)`; a step that does not get there (`max_iterations`
    APGD iterations per QP, at most 50 QPs) ends the solve with
    `RESULTS.contact_not_converged`. Derivatives of a step are those of the implicit
    function theorem of the converged problem's natural map, not of its iterations.

    **What the solution holds.** `Solution.ts`, `q`, `v` at `ts` (linear interpolation
    between steps), the result, and `stats["num_steps"]`; `Solution.events` is `None`
    (time stepping locates no event). `jax.grad` differentiates the discrete trajectory
    by the reverse-mode derivative of its steps ([`jaxdae.ReplayAdjoint`][], the default);
    forward mode needs `adjoint=diffrax.ForwardMode()`. Where a parameter makes a contact
    open or close exactly at a step (a non-smooth point of the discrete trajectory), the
    derivative is one of the one-sided derivatives there (that of the active set the QP
    solution lies on, as JAX's derivative of the cone projection picks it).

    `rtol` and `atol` of [`jaxdae.simulate`][] do not apply (nothing adapts the step); the
    constraint residual a run may end with is that of fixed steps (`constraint_tol`). A run
    takes `(t1 − t0) / dt` steps: a `max_steps` passed must allow them; by default the limit
    is those steps and a percent more (at most 100,000) where `t0`, `t1` and `dt` are
    concrete.

    **Arguments:**

    - `dt`: the step, positive and finite.
    - `tolerance`: the relative tolerance of each step's contact problem, in units of the
        contact velocities (default: `max(10⁻⁶, √ε)` of the state's dtype: `10⁻⁶` in
        float64, `3.5e-4` in float32; far below the scheme's `O(dt)` error). Tighten it
        where derivatives are compared with finite differences: the derivative is that
        of the converged solution, and differences see the solver's error.
    - `max_iterations`: the most APGD iterations of a step's QP (static; default 1000).
    - `min_bounce_speed`: a contact that would bounce off slower than this closes
        plastically (as [`jaxdae.EventDriven`][]'s; default `1e-3`).
    - `relaxed`: Anitescu's convex relaxation instead of Coulomb's law (static; default
        False).

    **Raises:**

    `ValueError` for a `dt` that is not positive and finite or bad options; when the
    solve starts, for an adaptive `solver`, `stepsize_controller` or a `dt0` (the step is
    `dt`), [`jaxdae.simulate_ensemble`][], `jaxdae.ReverseSweepAdjoint`, a system whose
    state is not its velocities, bad restitution or friction data, and a start that
    violates a gap.

    **References:** J. J. Moreau, "Unilateral contact and dry friction in finite freedom
    dynamics", CISM 302 (1988) 1–82; M. Jean, "The non-smooth contact dynamics method",
    Comput. Methods Appl. Mech. Engrg. 177 (1999) 235–257; M. Anitescu, F. A. Potra,
    Nonlinear Dynamics 14 (1997) 231–247; M. Anitescu, "Optimization-based simulation of
    nonsmooth rigid multibody dynamics", Math. Program. 105 (2006) 113–143; V. Acary,
    F. Cadoux, C. Lemaréchal, J. Malick, ZAMM 91 (2011) 155–175;
    H. Mazhar, T. Heyn, D. Negrut, A. Tasora, ACM Trans. Graph. 34 (2015) 32.
    """

    dt: float | Array
    tolerance: float | None = None
    max_iterations: int = eqx.field(static=True, default=1000, converter=_iteration_count)
    min_bounce_speed: float = 1e-3
    relaxed: bool = eqx.field(static=True, default=False, converter=_flag)

    def __check_init__(self):
        if is_concrete(self.dt):
            dt = np.asarray(self.dt)
            if not (
                dt.ndim == 0
                and np.issubdtype(dt.dtype, np.number)
                and not np.iscomplexobj(dt)
                and np.isfinite(dt)
                and dt > 0
            ):
                raise ValueError(
                    f"`TimeStepping(dt=...)` must be a positive finite step; got {self.dt!r}."
                )
        if self.tolerance is not None and not (
            isinstance(self.tolerance, (int, float))
            and np.isfinite(self.tolerance)
            and 0 < self.tolerance < 1
        ):
            raise ValueError(
                "`TimeStepping(tolerance=...)` must be a number in (0, 1) (the relative "
                f"tolerance of each step's contact problem); got {self.tolerance!r}."
            )
        if (
            isinstance(self.max_iterations, bool)
            or not isinstance(self.max_iterations, int)
            or self.max_iterations < 1
        ):
            raise ValueError(
                "`TimeStepping(max_iterations=...)` must be a positive integer; got "
                f"{self.max_iterations!r}."
            )
        if not isinstance(self.relaxed, bool):
            raise ValueError(
                f"`TimeStepping(relaxed=...)` must be True or False; got {self.relaxed!r}."
            )
        if not (
            isinstance(self.min_bounce_speed, (int, float))
            and np.isfinite(self.min_bounce_speed)
            and self.min_bounce_speed >= 0
        ):
            raise ValueError(
                "`TimeStepping(min_bounce_speed=...)` must be a non-negative finite number; "
                f"got {self.min_bounce_speed!r}."
            )

    def configure(self, call, t0, t1):
        """`(call, self)`: `call` with the fixed step `dt` (`dt0` and
        `diffrax.ConstantStepSize`), without `events` (no event loop), and, unless it
        passed one, a step limit of the steps from `t0` to `t1` (`step_limit`). A `solver`,
        `stepsize_controller` or `dt0` of the call are refused: the step is `dt`."""
        for name in ("solver", "stepsize_controller", "dt0"):
            if getattr(call, name) is not None:
                raise ValueError(
                    f"`events=jaxdae.TimeStepping(...)` takes its own steps (`dt`) with its "
                    f"own scheme; `{name}` would be ignored. Leave `{name}` unset (set the "
                    "step with `TimeStepping(dt=...)`), or use `events=jaxdae.EventDriven()` "
                    "with an adaptive solver."
                )
        max_steps = call.max_steps
        if "max_steps" not in call.given:
            max_steps = self.step_limit(t0, t1, max_steps)
        call = eqx.tree_at(
            lambda c: (c.solver, c.stepsize_controller, c.dt0, c.events, c.max_steps),
            call,
            (None, diffrax.ConstantStepSize(), self.dt, None, max_steps),
            is_leaf=lambda x: x is None,
        )
        return call, self

    def step_limit(self, t0, t1, default: int) -> int:
        """The step limit of a run from `t0` to `t1` that passes none: the run's
        `⌈(t1 − t0) / dt⌉` steps, and a percent more for the rounding of the accumulated
        times (at most `default`), where `t0`, `t1` and `dt` are concrete; `default`
        otherwise. A tight limit keeps the stored-steps adjoint to one segment of steps,
        which compiles one fewer copy of the step into the gradient
        (`ReplayAdjoint`)."""
        if not is_concrete((t0, t1, self.dt)):
            return default
        values = [np.asarray(x) for x in (t0, t1, self.dt)]
        if not all(v.ndim == 0 and v.dtype.kind in "biuf" for v in values):
            return default  # (the times' checks name the problem)
        with np.errstate(all="ignore"):
            steps = (float(values[1]) - float(values[0])) / float(values[2])
        if not (np.isfinite(steps) and steps > 0):
            return default
        needed = int(np.ceil(steps))
        return min(needed + 1 + needed // 100, default)

    def solver(self, dtype) -> "TimeSteppingSolver":
        """The diffrax solver of its steps for states of `dtype`."""
        tolerance = self.tolerance
        if tolerance is None:
            tolerance = max(1e-6, float(np.sqrt(np.finfo(dtype).eps)))
        return TimeSteppingSolver(
            tolerance, self.max_iterations, self.min_bounce_speed, self.relaxed
        )


class TimeSteppingSolver(AbstractFailureNamingSolver):
    """One step of [`TimeStepping`][] (its docstring) as a diffrax solver, for a fixed step
    (`diffrax.ConstantStepSize`). It reads the system, the formulation and a constant mass
    matrix's factor from the solve's term (`_term.py`); its state is the last step's
    impulses (the next QP's warm start)."""

    tolerance: float
    max_iterations: int = eqx.field(static=True)
    min_bounce_speed: float
    relaxed: bool = eqx.field(static=True)

    term_structure: ClassVar = AbstractSystemTerm
    interpolation_cls: ClassVar = diffrax.LocalLinearInterpolation

    def order(self, terms):
        return 1

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)

    def init(self, terms, t0, t1, y0, args):
        q, _ = y0
        system = system_term(terms).system
        count = gap_count(system, t0, q)
        friction = friction_coefficients(system, count, q.dtype)
        # (Shapes only: tracing the contact rows here would lengthen the compile.)
        tangents = slip_tangents(system, t0, q) if friction.shape[0] else 0
        return jnp.zeros((count + tangents * friction.shape[0],), q.dtype)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del args, made_jump
        term = system_term(terms)
        q, v = y0
        q1, v1, impulses, converged = contact_step(
            self, term.system, term.formulation, term.mass_factor, t0, t1, q, v, solver_state
        )
        result = diffrax.RESULTS.where(converged, diffrax.RESULTS.successful, _CARRIER)
        y1 = (q1, v1)
        return y1, None, dict(y0=y0, y1=y1), impulses, result

    def name_result(self, result: RESULTS) -> RESULTS:
        """A step whose cone QP did not converge named `RESULTS.contact_not_converged`."""
        return RESULTS.where(
            result == RESULTS.promote(_CARRIER), RESULTS.contact_not_converged, result
        )


# A time-stepped solve is differentiated by the reverse-mode derivative of its steps,
# replayed at their times: its program holds the step and its derivative once each, where
# diffrax's checkpointed loop linearizes its whole loop body several times.
adjoint_for.register(TimeSteppingSolver, lambda solver: ReplayAdjoint())


# Jitted so that JAX traces a step once: diffrax calls the solver's `step` four times while
# it traces a solve (for the shapes of its dense output, twice for its loop body's, and the
# body itself), each a full trace of the terms, the contact rows and the cone solve.
@jit_with_constants
def contact_step(
    settings: TimeSteppingSolver,
    system,
    formulation,
    mass_factor,
    t0,
    t1,
    q: Float[Array, " n"],
    v: Float[Array, " n"],
    start: Float[Array, " k"],
):
    """One step of [`TimeStepping`][] from `(t0, q, v)` to `t1`, the QP warm-started from
    the impulses `start`: the new `(q, v)`, the impulses `P` (rows of `GapTerms`), and
    whether the QP converged."""
    h = t1 - t0
    terms = _dense_factor(with_mass_factor(system_terms(system, t0, q, v), mass_factor))
    acceleration, _ = formulation.accelerations(terms)
    v_free = v + h * acceleration
    friction = friction_coefficients(system, gap_count(system, t0, q), q.dtype)
    gap, velocity, directions = system._contact_rows(t0, q, v, friction)
    # `[ġ; v_T] = [W; W_T] v + offset` (the gaps' and slips' explicit time dependence).
    offset = velocity - directions @ v
    response = constrained_inverse_mass(terms, directions.T)
    delassus = directions @ response
    delassus = 0.5 * (delassus + delassus.T)
    free = directions @ v_free + offset
    count = gap.shape[0]
    rate = velocity[:count]
    restitution = jnp.broadcast_to(jnp.asarray(system.restitution(), q.dtype), (count,))
    # Newton's law on the velocities for a contact that closes within the step fast enough
    # to bounce; the others close no further than to zero within the step.
    bounces = (gap + h * rate < 0) & (-restitution * rate > settings.min_bounce_speed)
    target = jnp.where(bounces, restitution * jnp.minimum(rate, 0.0), gap / h)
    vector = free + jnp.concatenate([target, jnp.zeros_like(velocity[count:])])
    scale = jnp.maximum(1.0, jnp.max(jnp.abs(jax.lax.stop_gradient(free)), initial=0.0))
    solved = cone_solve(
        delassus,
        vector,
        friction,
        jax.lax.stop_gradient(start),
        settings.tolerance * scale,
        settings.max_iterations,
        not settings.relaxed,
    )
    v1 = v_free + response @ solved.impulses
    q1 = q + h * system.velocities(t0, q, v1)
    q1 = q1 - _position_correction(terms, system.constraints(t1, q1))
    return q1, v1, solved.impulses, solved.residual <= settings.tolerance * scale


def _dense_factor(terms):
    """`terms` whose mass operator carries the dense Cholesky factor of `M`, where they
    carry a factor of another kind (a sparse factor, or the articulated factor of a tree
    that a time-stepped solve did not pose on its dense path: one wrapped in another
    system) and `M` has at most `LOOPED_MAX` rows; else `terms`. A step solves with `M` for
    the accelerations and for the `u + tangents·f` columns of the contacts' response;
    under `vmap` each solve through the articulated factor is a loop over the tree's
    levels, and factorizing the dense `M` (which the terms hold) costs less than those
    solves (docs/design_measurements.md#time-stepping-dense-factor)."""
    factor = factor_of(terms.mass_operator)
    size = terms.mass_matrix.shape[0]
    if factor is None or isinstance(factor, MassFactor) or size > _thresholds.LOOPED_MAX:
        return terms
    mass = terms.mass_matrix
    operator = FactoredOperator(
        lx.MatrixLinearOperator(mass, lx.positive_semidefinite_tag),
        MassFactor(None, cholesky_factor(0.5 * (mass + mass.T))),
    )
    return eqx.tree_at(lambda x: x.mass_operator, terms, operator)


def _position_correction(terms, phi: Float[Array, " m"]) -> Float[Array, " n"]:
    """One Newton step in the mass metric onto the holonomic constraints from their residual
    `phi` at the step's end, `M⁻¹Gᵀ (G M⁻¹ Gᵀ)⁺ [Φ; 0]` (`M`, `G` of `terms`, at the step's
    start; the nonholonomic rows kept): the `O(h²)` drift of a step, which the formulation's
    stabilization alone leaves at `O(h)` after many steps (as time-stepping codes
    renormalize their quaternions)."""
    if phi.shape[0] == 0:
        return jnp.zeros_like(terms.forces)
    elimination = eliminate(terms)
    inverse = psd_pseudo_inverse(elimination.matrix, float(1e3 * jnp.finfo(phi.dtype).eps))
    residual = jnp.concatenate([phi, jnp.zeros(terms.jacobian.shape[0] - phi.shape[0], phi.dtype)])
    return elimination.apply_minv_gt(inverse @ residual)


def gap_count(system, t, q) -> int:
    """The number of gaps of `system` at `(t, q)`."""
    return jax.eval_shape(system.gaps, t, q).shape[0]


def check_time_stepping(system, formulation, trajectories, t0, q0, q_one, eager: bool) -> None:
    """`ValueError` for what [`TimeStepping`][] does not take: a system without gaps, an
    ensemble, a state that is not velocities, a formulation that changes the velocities,
    restitution, friction or slip velocities of the wrong shape, and a start that violates
    a gap (concrete; `q_one`: one trajectory's coordinates, or their shape)."""
    shape = jax.eval_shape(system.gaps, t0, q_one).shape
    if len(shape) != 1 or shape[0] == 0:
        raise ValueError(
            "`events=jaxdae.TimeStepping(...)` steps the contacts of a system's one-sided "
            f"constraints (`gaps`, a vector of shape (u,)); the system has none (shape {shape}). "
            "Leave `events` unset."
        )
    if not trajectories.event_driven:
        raise ValueError(
            "`simulate_ensemble` does not take `events=jaxdae.TimeStepping(...)`: use "
            "`jax.vmap(jaxdae.simulate)`, which batches the fixed steps just as well."
        )
    if not system.state_is_velocity:
        raise ValueError(
            "`jaxdae.TimeStepping` integrates positions and velocities; the state of "
            f"{type(system).__name__} holds something else (momenta of a `HamiltonianSystem`, "
            "realized constraints). Write it as a `jaxdae.LagrangianSystem`, or use "
            "`jaxdae.EventDriven`."
        )
    if formulation.derives_velocities:
        raise ValueError(
            f"`jaxdae.TimeStepping` changes the velocities by impulses; "
            f"{type(formulation).__name__} integrates other velocities (redundant "
            "coordinates). Pass e.g. `jaxdae.Baumgarte(...)` or `jaxdae.Unstabilized()`."
        )
    tolerance = 0.01 * np.sqrt(np.finfo(q0.dtype).eps)
    check_stop_shapes(system, t0, q_one, q0, float(tolerance) if eager else None)
