"""Projection onto the constraint manifold after every step: [`jaxdae.Projected`][]."""

from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._checks import check_instance, described
from .._compilation._linear_solvers import PositiveDefinite
from .._compilation._scalarize import scalarize
from .._custom_types import Array, Bool, PyTree, ScalarLike
from .._formulations._base import AbstractFormulation, multiplier_solve
from .._formulations._redundant import RedundantCoordinates
from .._solution import RESULTS
from .._systems._hamiltonian import HamiltonianSystem
from .._systems._system import AbstractSystem, ConstrainedTerms, LagrangianSystem


def _max_abs(x: Array) -> Array:
    return jnp.max(jnp.abs(x), initial=0.0)


def _correction(mass, jacobian, residual, linear_solver) -> Array:
    """`−M⁻¹ Gᵀ (G M⁻¹ Gᵀ)⁻¹ r` for `G = jacobian`: the smallest step `Δ` in the metric
    of the mass matrix `M` with `G Δ = −r`. [`multiplier_solve`][] of `M a + Gᵀλ = 0`,
    `G a = −r` (no forces), so the constraint solves are the formulations' own
    (`linear_solver`: `None` for the formulations' positive-definite solve, or a lineax
    solver such as `lineax.SVD()` for redundant rows)."""
    if linear_solver is None:
        linear_solver = PositiveDefinite()
    n, c = mass.shape[0], jacobian.shape[0]
    zeros = jnp.zeros((n,), mass.dtype)
    free = ConstrainedTerms(mass_matrix=mass, forces=zeros, phi=residual, dphi=residual,
                            psi=jnp.zeros((0,), mass.dtype), jacobian=jacobian,
                            bias=jnp.zeros((c,), mass.dtype))
    step, _ = multiplier_solve(free, -residual, linear_solver)
    return step


def _derives_velocities(formulation) -> bool:
    """Whether the formulation derives the velocities from the state
    ([`jaxdae.RedundantCoordinates`][]); a `ValueError` for another that does."""
    if isinstance(formulation, RedundantCoordinates):
        return True
    if type(formulation).velocities is not AbstractFormulation.velocities:
        raise ValueError(
            f"`jaxdae.Projected` cannot project the state of {described(formulation)}: it "
            "derives the velocities from the state in its own way "
            "(`AbstractFormulation.velocities`). Use it with a formulation whose state "
            "holds the velocities (or momenta), or with `jaxdae.RedundantCoordinates`.")
    return False


def _terms_at(system, formulation, t, q, s):
    return system.terms(t, q, formulation.velocities(system, t, q, s))


def _constraint_values(system, formulation, t, q, s):
    """`Φ(t, q)`: from `constraints` where the system's terms take `Φ` from it, else from
    its terms."""
    if type(system).terms in (LagrangianSystem.terms, HamiltonianSystem.terms):
        return system.constraints(t, q)
    return _terms_at(system, formulation, t, q, s).phi


# Each piece is traced once per system and formulation and, for small systems, re-traced
# as a scalar graph (`_scalarize.py`), as the right-hand side is: one function for the
# whole projection would exceed the size up to which that pays.
@eqx.filter_jit
@scalarize
def _first_iteration(system, formulation, t, q, s, linear_solver):
    """`M` and `J` at the unprojected state, and the first (Newton) iterate."""
    terms = _terms_at(system, formulation, t, q, s)
    jacobian = terms.jacobian[: terms.num_holonomic]
    return terms.mass_matrix, jacobian, q + _correction(terms.mass_matrix, jacobian,
                                                        terms.phi, linear_solver)


@eqx.filter_jit
@scalarize
def _next_iteration(system, formulation, t, q, s, mass, jacobian, linear_solver):
    """A simplified Newton iterate: `M` and `J` frozen."""
    phi = _constraint_values(system, formulation, t, q, s)
    return q + _correction(mass, jacobian, phi, linear_solver)


@eqx.filter_jit
@scalarize
def _velocity_projection(system, formulation, t, q, s, linear_solver, tol):
    """At the projected positions `q`: whether `Φ` converged, the projected `s`, and
    whether `[Φ̇; Ψ]` did."""
    terms = _terms_at(system, formulation, t, q, s)
    m = terms.num_holonomic
    position_ok = _max_abs(terms.phi) <= tol * (
        1.0 + _max_abs(terms.jacobian[:m]) * _max_abs(q))
    if _derives_velocities(formulation):
        return position_ok, s, jnp.array(True)
    # `[Φ̇; Ψ]` is affine in `v`, so one solve meets it up to rounding.
    residual = jnp.concatenate([terms.dphi, terms.psi])
    dv = _correction(terms.mass_matrix, terms.jacobian, residual, linear_solver)
    # `ṡ` is affine in `q̈`: its linear part maps a change of velocity to a change of `s`
    # (the identity for velocities, `M` for momenta).
    ds = (system.state_rate(t, q, s, terms, dv)
          - system.state_rate(t, q, s, terms, jnp.zeros_like(dv)))
    s_new = s + ds
    v_old, v_new = (system.velocities(t, q, x) for x in (s, s_new))
    residual = residual + terms.jacobian @ (v_new - v_old)
    velocity_ok = _max_abs(residual) <= tol * (
        1.0 + _max_abs(terms.jacobian) * _max_abs(v_new))
    return position_ok, s_new, velocity_ok


def project_state(system: AbstractSystem, formulation: AbstractFormulation, t, q, s,
                  linear_solver: lx.AbstractLinearSolver, iterations: int, tol: float):
    """The state `(q, s)` projected onto `Φ(t, q) = 0` and then onto `Φ̇ = 0, Ψ = 0`, and
    whether each projection converged (`(q, s), position_ok, velocity_ok`).

    Positions: simplified Newton iterations `q ← q − M⁻¹Jᵀ(J M⁻¹ Jᵀ)⁻¹ Φ(q)` with `M`
    and `J` frozen at the unprojected point `q̃` (Hairer, Lubich & Wanner, *Geometric
    Numerical Integration*, §IV.4, Algorithm 4.2): every iterate lies in
    `q̃ + range(M⁻¹Jᵀ)`, so the limit is the point of the manifold that is closest to `q̃`
    in the metric `M` up to a term of second order in the (small) drift. The first
    iteration is a full Newton step; `iterations` of them are always taken (straight-line
    code: differentiable in both modes and the same work in every member of a batch).

    Velocities: at the projected `q`, the state's velocities `v` are replaced by the
    closest in the metric `M(q)` that satisfy `G v = −c` (`[Φ̇; Ψ] = G v + c`, affine in
    `v`): one linear solve, `v ← v − M⁻¹Gᵀ(G M⁻¹ Gᵀ)⁻¹ [Φ̇; Ψ]`. A state that holds
    momenta (a [`jaxdae.HamiltonianSystem`][]) is changed by the matching impulse,
    `p ← p + M Δv` (exact for a Hamiltonian quadratic in `p`). A
    [`jaxdae.RedundantCoordinates`][] state is projected in its positions only: its
    velocities follow from the independent ones and satisfy `Φ̇ = 0` by construction.

    Converged means `max |Φ| ≤ tol (1 + max|J| max|q|)` and
    `max |[Φ̇; Ψ]| ≤ tol (1 + max|G| max|v|)` at the projected state: relative to the size
    of the terms that cancel in the residuals, which sets their rounding error.
    """
    _derives_velocities(formulation)
    mass, jacobian, q_new = _first_iteration(system, formulation, t, q, s, linear_solver)
    for _ in range(iterations - 1):
        q_new = _next_iteration(system, formulation, t, q_new, s, mass, jacobian,
                                linear_solver)
    position_ok, s_new, velocity_ok = _velocity_projection(system, formulation, t, q_new, s,
                                                           linear_solver, tol)
    return (q_new, s_new), position_ok, velocity_ok


class _ProjectedInterpolation(diffrax.AbstractLocalInterpolation):
    """The wrapped solver's dense output over a step, plus the projection's correction
    blended in linearly: `y(t) = ỹ(t) + θ (y₁ − ỹ₁)`, `θ = (t − t₀)/(t₁ − t₀)`, which starts
    at the (projected) start of the step and ends at its projected end."""

    t0: ScalarLike
    t1: ScalarLike
    inner: diffrax.AbstractLocalInterpolation
    correction: PyTree[Array]

    def evaluate(self, t0, t1=None, left: bool = True):
        if t1 is not None:
            return jax.tree.map(lambda a, b: a - b, self.evaluate(t1, left=left),
                                self.evaluate(t0, left=left))
        theta = (t0 - self.t0) / (self.t1 - self.t0)
        return jax.tree.map(lambda y, c: y + (theta * c).astype(y.dtype),
                            self.inner.evaluate(t0, left=left), self.correction)


def _interpolation(inner_cls: Callable) -> Callable:
    def build(*, t0, t1, inner, correction):
        return _ProjectedInterpolation(t0=t0, t1=t1, inner=inner_cls(t0=t0, t1=t1, **inner),
                                       correction=correction)

    return build


# The solver's result must be an item of diffrax's enumeration, and `RESULTS.promote` maps
# only diffrax's own items to jaxdae's; a failed projection is reported as the one item
# that no diffrax solver step returns (`conlim`, lineax's LSMR, which diffrax does not
# use), and `simulate` names it (`named_result`).
_CARRIER = diffrax.RESULTS.conlim


def _failure_item(failed: Bool[Array, ""], result):
    """`result` of the wrapped step, or the carrier of `projection_failed` where the step
    succeeded but its projection `failed`."""
    return diffrax.RESULTS.where(failed & (result == diffrax.RESULTS.successful), _CARRIER,
                                 result)


def named_result(solver, result: RESULTS) -> RESULTS:
    """`result` of a solve with `solver`, with a failed projection named
    `RESULTS.projection_failed` when `solver` is (or wraps) a [`jaxdae.Projected`][]."""
    while not isinstance(solver, Projected) and isinstance(
            getattr(solver, "solver", None), diffrax.AbstractSolver):
        solver = solver.solver
    if not isinstance(solver, Projected):
        return result
    return RESULTS.where(result == RESULTS.promote(_CARRIER), RESULTS.projection_failed,
                         result)


class Projected(diffrax.AbstractAdaptiveSolver):
    """Wraps a diffrax solver and projects the state onto the constraint manifold after
    every step: positions onto `Φ(t, q) = 0`, then velocities onto `Φ̇ = 0`, `Ψ = 0`, each
    by the smallest change in the metric of the mass matrix (coordinate projection, or
    post-stabilization: Hairer, Lubich & Wanner, *Geometric Numerical Integration*, §IV.4;
    Ascher & Petzold, *Computer Methods for ODEs and DAEs*, §10.1.4).

    The formulation's stabilization (Baumgarte's gains, the penalty of the modified
    Lagrange equation) keeps acting between the steps; the projection removes what drift is
    left at every step end, whatever the gains, so even [`jaxdae.Unstabilized`][] stays on
    the manifold. Use it with [`jaxdae.simulate`][] and [`jaxdae.simulate_ensemble`][] and
    any formulation and solver:

    ```python
    sol = jaxdae.simulate(system, jaxdae.Baumgarte(20.0, 100.0), 0.0, 2.0, q0, v0,
                          solver=jaxdae.Projected(diffrax.Tsit5()))
    ```

    **Positions**: `iterations` simplified Newton iterations
    `q ← q − M⁻¹Jᵀ(J M⁻¹ Jᵀ)⁻¹ Φ(q)`, `M` and `J = Φ_q` evaluated once at the step's end
    (the first iteration is a Newton step; the drift of one step is of the order of the
    local error, so two iterations usually reach rounding). **Velocities** (or momenta):
    one linear solve at the projected positions,
    `v ← v − M⁻¹Gᵀ(G M⁻¹ Gᵀ)⁻¹ [Φ̇; Ψ]`, `G = [Φ_q; Ψ_v]`. With
    [`jaxdae.RedundantCoordinates`][] only the positions are projected (the dependent
    velocities meet `Φ̇ = 0` by construction).

    **Error estimate and dense output**: the step's error estimate is the wrapped solver's
    for the unprojected step (the projection moves the state by less than that error). Saved
    states between step ends (`ts=`) come from the wrapped solver's dense output with the
    projection's correction blended in linearly over the step, so they are continuous and
    end on the manifold at every step end, but between step ends they are off it by up to
    the local error; to save projected states, make the save times step ends, e.g.
    `stepsize_controller=diffrax.ClipStepSizeController(diffrax.PIDController(rtol, atol),
    step_ts=ts)`. After each projection the wrapped solver evaluates the first stage anew
    (its first-same-as-last stage belongs to the unprojected state): one right-hand side
    per step more.

    **Gradients** flow through the discrete iteration: the projection is straight-line
    code (a fixed number of iterations and its convergence test), so reverse and forward
    mode differentiate the computed solution exactly. The default adjoint for this solver
    is `diffrax.RecursiveCheckpointAdjoint`; [`jaxdae.ReverseSweepAdjoint`][], which
    recomputes the wrapped Runge–Kutta steps without their projections, is refused. For
    forward mode (`adjoint=diffrax.ForwardMode()`) wrap a Runge–Kutta solver whose stages
    run in a plain loop, `Projected(diffrax.Tsit5(scan_kind="lax"))`: diffrax sets that on
    the solvers it sees, not on a wrapped one (its default loop over the stages supports
    reverse mode only, and a loop that supports both made every solve about 1.5× slower).

    **Failure**: a projection that leaves `max |Φ|` or `max |[Φ̇; Ψ]|` above `tol`, relative
    to the size of the terms that cancel in them (`1 + max|J| max|q|`, `1 + max|G| max|v|`),
    after an accepted step ends the solve with `jaxdae.RESULTS.projection_failed` (in an
    ensemble, the whole ensemble: the steps are shared).

    **Arguments:**

    - `solver`: the diffrax solver to wrap, e.g. `diffrax.Tsit5()`.
    - `iterations`: simplified Newton iterations for the positions (static); default 5.
        They converge linearly, at a rate set by how much `J` changes over the correction
        and by the conditioning of `J M⁻¹ Jᵀ`: a drift of 1e-9 needs one or two, the
        8e-5 of a modified-Lagrange step on the two-link arm near its fold four.
    - `tol`: convergence tolerance of the residuals (relative, see above); default
        `1000 ε` of the state's dtype (`2.2e-13` in float64).
    - `linear_solver`: how `G M⁻¹ Gᵀ` is solved. `None` (default, independent
        constraints): the positive-definite solve of [`jaxdae.Baumgarte`][] (an unrolled
        Cholesky for small systems, a banded factorization where the constraints are
        banded, LAPACK otherwise). A lineax solver otherwise, e.g. `lineax.SVD()` for
        redundant constraints, as [`jaxdae.PseudoInverse`][] does.

    **Raises:**

    `ValueError` for a `solver` that is not a diffrax solver, `iterations < 1` or
    `tol <= 0`; when the solve starts, for use outside `simulate` / `simulate_ensemble`
    and with a formulation that derives velocities other than
    [`jaxdae.RedundantCoordinates`][].
    """

    solver: diffrax.AbstractSolver
    iterations: int = eqx.field(default=5, static=True)
    tol: float | None = eqx.field(default=None, static=True)
    linear_solver: lx.AbstractLinearSolver | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_instance("solver", self.solver, diffrax.AbstractSolver,
                       "a diffrax solver instance such as `diffrax.Tsit5()`")
        if isinstance(self.iterations, bool) or not isinstance(
                self.iterations, (int, np.integer)) or self.iterations < 1:
            raise ValueError(
                f"`iterations` must be a positive integer; got {self.iterations!r}.")
        if self.tol is not None and not (np.isfinite(self.tol) and self.tol > 0):
            raise ValueError(f"`tol` must be a positive finite number; got {self.tol!r}.")
        check_instance("linear_solver", self.linear_solver, lx.AbstractLinearSolver,
                       "a lineax solver such as `lineax.SVD()`, or None", optional=True)

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    @property
    def interpolation_cls(self):  # pyright: ignore
        return _interpolation(self.solver.interpolation_cls)

    def order(self, terms):
        return self.solver.order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)

    def init(self, terms, t0, t1, y0, args):
        _check_args(y0, args)
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        system, formulation = _check_args(y0, args)
        # The stored first-same-as-last stage is that of the unprojected state: a jump.
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, True)
        q, s = y1
        tol = self.tol if self.tol is not None else float(1000 * jnp.finfo(q.dtype).eps)
        project = lambda q_, s_: project_state(
            system, formulation, t1, q_, s_, self.linear_solver, self.iterations, tol)
        if q.ndim == 1:
            (q_new, s_new), position_ok, velocity_ok = project(q, s)
            ok = keep = position_ok & velocity_ok
            failed = ~ok
        else:  # an ensemble: one projection per trajectory (row)
            (q_new, s_new), position_ok, velocity_ok = jax.vmap(project)(q, s)
            ok = position_ok & velocity_ok
            # Rows stopped by their formulation's failure (`_StopFailedTrajectories`)
            # stand still: neither projected nor counted.
            stopped = args[3] if len(args) > 3 else jnp.zeros_like(ok)
            failed = jnp.any(~ok & ~stopped)
            keep = (ok & ~stopped)[:, None]
        # Where the projection failed, the unprojected end (finite) is where it stopped.
        y_new = (jnp.where(keep, q_new, q), jnp.where(keep, s_new, s))
        correction = jax.tree.map(lambda a, b: a - b, y_new, y1)
        return (y_new, y_error, {"inner": dense_info, "correction": correction}, solver_state,
                _failure_item(failed, result))


def _check_args(y0, args) -> tuple[AbstractSystem, AbstractFormulation]:
    """The system and formulation of a `simulate` / `simulate_ensemble` solve."""
    if not (isinstance(args, tuple) and len(args) >= 3 and isinstance(args[0], AbstractSystem)
            and isinstance(args[1], AbstractFormulation) and isinstance(y0, tuple)
            and len(y0) == 2):
        raise ValueError(
            "`jaxdae.Projected` projects the states of `jaxdae.simulate` and "
            "`jaxdae.simulate_ensemble` (it reads the system and formulation from their "
            "solve); it does not apply to other solves (e.g. `jaxdae.simulate_actuated` "
            "or a direct `diffrax.diffeqsolve`).")
    return args[0], args[1]

