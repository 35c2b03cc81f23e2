"""Projection onto the constraint manifold after every step: [`jaxdae.Projected`][]."""

from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .. import _thresholds
from .._checks import check_instance, described
from .._compilation._constants import jit_with_constants
from .._compilation._linalg import small_matmul
from .._compilation._linear_solvers import symmetric_operator
from .._compilation._scalarize import scalarize
from .._compilation._sparse import cholesky_factor, cholesky_solve
from .._custom_types import Array, Bool, Float, PyTree, ScalarLike
from .._formulations._base import AbstractFormulation, AbstractIndependentVelocities
from .._formulations._multipliers import eliminate
from .._solution import RESULTS
from .._systems._system import AbstractSystem, ConstrainedTerms
from ._solvers import AbstractSolverWrapper
from ._term import AbstractSystemTerm, is_system_term, replace_system_term
from ._vector_fields import constraint_residuals, form_of_terms


def _max_abs(x: Array) -> Array:
    return jnp.max(jnp.abs(x), initial=0.0)


class _Factored(eqx.Module):
    """`G M⁻¹ Gᵀ` factorized once, for solves with one residual at a time.

    `linear_solver=None`: the Cholesky factorization (unrolled for small systems, looped or
    LAPACK beyond) of `G M⁻¹ Gᵀ + δ I`, `δ = 100 c ε max diag(G M⁻¹ Gᵀ)` (`c` rows, `ε` the
    machine epsilon): above the rounding error of the zero eigenvalues that redundant
    constraints give the computed matrix, so the factorization exists for them too. A step
    `Δ = −M⁻¹Gᵀ(G M⁻¹ Gᵀ + δ I)⁻¹ r` lies in `range(M⁻¹Gᵀ)` and meets `G Δ = −r` up to a
    relative `δ / σ` along each eigenvalue `σ > 0` (the iterations of [`project_state`][]
    remove it); along the redundant directions, which `Gᵀ` maps to zero, its multipliers
    stay bounded by `|r| / δ`. A lineax solver otherwise (e.g. `lineax.SVD()`): its state
    (one factorization), applied to each residual."""

    factor: PyTree[Array]  # the Cholesky factor, or (the operator, the lineax solver's state)
    linear_solver: lx.AbstractLinearSolver | None = eqx.field(static=True)

    @classmethod
    def of(cls, matrix: Float[Array, "c c"], linear_solver: lx.AbstractLinearSolver | None):
        c = matrix.shape[0]
        if c == 0:
            return cls(matrix, None)
        if linear_solver is None:
            eps = float(jnp.finfo(matrix.dtype).eps)
            # The largest diagonal entry by a mask, not `jnp.diagonal`: a gather, whose
            # transpose (a scatter) keeps a gradient's reverse loop from running as one kernel.
            diagonal = jnp.where(jnp.eye(c, dtype=bool), matrix, -jnp.inf)
            shift = 100 * c * eps * jnp.max(diagonal)
            return cls(cholesky_factor(matrix + shift * jnp.eye(c, dtype=matrix.dtype)), None)
        operator = symmetric_operator(matrix)
        # Initialized as `lineax.linear_solve` does (without a gradient: its solve's own rule
        # differentiates with respect to the operator).
        state = linear_solver.init(symmetric_operator(jax.lax.stop_gradient(matrix)), {})
        return cls((operator, state), linear_solver)

    def solve(self, rhs: Float[Array, " c"]) -> Float[Array, " c"]:
        """`(G M⁻¹ Gᵀ)⁻¹ rhs`."""
        if rhs.shape[0] == 0:
            return rhs
        if self.linear_solver is None:
            return cholesky_solve(self.factor, rhs[:, None])[:, 0]
        operator, state = self.factor
        return lx.linear_solve(operator, rhs, self.linear_solver, state=state, throw=False).value


def _dense_minv_gt(terms: ConstrainedTerms):
    """`G M⁻¹ Gᵀ` and `M⁻¹Gᵀ` (dense) of the terms ([`eliminate`][])."""
    elimination = eliminate(terms)
    minv_gt = elimination.minv_gt
    if not isinstance(minv_gt, jax.Array):
        minv_gt = minv_gt.dense()
    return elimination.matrix, minv_gt


def _derives_velocities(formulation) -> bool:
    """Whether the formulation derives the velocities from the independent ones of the
    state ([`jaxdae.extend.AbstractIndependentVelocities`][], e.g.
    [`jaxdae.RedundantCoordinates`][]); a `ValueError` for another that derives them."""
    if isinstance(formulation, AbstractIndependentVelocities):
        return True
    if formulation.derives_velocities:
        raise ValueError(
            f"`jaxdae.Projected` cannot project the state of {described(formulation)}: it "
            "derives the velocities from the state in its own way "
            "(`AbstractFormulation.velocities`). Use it with a formulation whose state "
            "holds the velocities (or momenta), or with `jaxdae.RedundantCoordinates`."
        )
    return False


def _terms_at(system, formulation, t, q, s):
    return system.terms(t, q, formulation.velocities(system, t, q, s))


def _own_terms(system) -> bool:
    """Whether the system's terms take `Φ`, `Φ̇` and `Ψ` from its `constraints` and
    `velocity_constraints` (so they can be evaluated alone)."""
    return system.terms_from_constraints


def _momenta(system) -> bool:
    """Whether the state holds something other than the velocities (`state_rate` is not
    the identity)."""
    return not system.state_is_velocity


class _Gains(eqx.Module):
    """What [`project_state`][] freezes at the unprojected end `(q̃, s̃)` of a step: the
    gains `K = M⁻¹Gᵀ (G M⁻¹ Gᵀ)⁻¹` as their two factors, applied to one residual at a time
    (forming `K` would take a solve per constraint; an iteration takes one)."""

    positions: Float[Array, "n m"]  # `M⁻¹Jᵀ` for the holonomic rows `J`
    position_factor: _Factored  # of `J M⁻¹ Jᵀ`
    # `M⁻¹Gᵀ` for all rows `G = [Φ_q; Ψ_v]`, mapped to the state where it holds momenta
    velocities: Float[Array, "n c"]
    velocity_factor: _Factored  # of `G M⁻¹ Gᵀ`
    position_scale: Array  # `max |J|`
    velocity_scale: Array  # `max |G|`

    def position_step(self, phi: Float[Array, " m"]) -> Float[Array, " n"]:
        """`K_J Φ`."""
        return small_matmul(self.positions, self.position_factor.solve(phi))

    def velocity_step(self, residual: Float[Array, " c"]) -> Float[Array, " n"]:
        """`K_G r`, mapped to the state."""
        return small_matmul(self.velocities, self.velocity_factor.solve(residual))


# Each piece is traced once per system and formulation and, for small systems, re-traced
# as a scalar graph (`_scalarize.py`), as the right-hand side is: one function for the
# whole projection would exceed the size up to which that pays.
@jit_with_constants
@scalarize
def _gains(system, formulation, t, q, s, linear_solver, velocities: bool):
    """The gains `K` at the unprojected state, as their factors (`_Gains`; for the
    velocities mapped to the state where it holds momenta), and the first (Newton) iterate
    of the positions."""
    terms = _terms_at(system, formulation, t, q, s)
    m = terms.num_holonomic
    matrix, minv_gt = _dense_minv_gt(terms)
    # `Δ = −K r`, `K = M⁻¹Gᵀ (G M⁻¹ Gᵀ)⁻¹`, is the smallest step in the metric `M` with
    # `G Δ = −r`.
    position_factor = _Factored.of(matrix[:m, :m], linear_solver)
    if not velocities:
        all_rows, velocity_factor = minv_gt[:, :0], _Factored.of(matrix[:0, :0], None)
    elif m == matrix.shape[0]:
        all_rows, velocity_factor = minv_gt, position_factor
    else:
        all_rows, velocity_factor = minv_gt, _Factored.of(matrix, linear_solver)
    if velocities and _momenta(system):  # the state's change for each column's `Δv`
        all_rows = jax.vmap(
            lambda dv: _state_change(system, t, q, s, terms, dv), in_axes=1, out_axes=1
        )(all_rows)
    gains = _Gains(
        minv_gt[:, :m],
        position_factor,
        all_rows,
        velocity_factor,
        _max_abs(terms.jacobian[:m]),
        _max_abs(terms.jacobian),
    )
    return gains, q - gains.position_step(terms.phi)


@jit_with_constants
@scalarize
def _constraint_values(system, formulation, t, q, s):
    """`Φ(t, q)`: from `constraints` where the system's terms take `Φ` from it, else from
    its terms."""
    if _own_terms(system):
        with form_of_terms(system, t, q, s):
            return system.constraints(t, q)
    return _terms_at(system, formulation, t, q, s).phi


@jit_with_constants
@scalarize
def _velocity_residual(system, formulation, t, q, s):
    """`[Φ̇; Ψ]` at `(t, q, s)` and the velocities `v` (from `constraints` and
    `velocity_constraints` where the system's terms take them from these, else from its
    terms)."""
    v = system.velocities(t, q, s)
    if _own_terms(system):
        _, dphi, psi = constraint_residuals(system, t, q, v)
        return jnp.concatenate([dphi, psi]), v
    terms = system.terms(t, q, v)
    return jnp.concatenate([terms.dphi, terms.psi]), v


@jit_with_constants
@scalarize
def _state_change(system, t, q, s, terms, dv):
    """The change of the state `s` for a change `dv` of the velocities: the linear part of
    `ṡ(q̈)` (`ṡ` is affine in `q̈`; the identity for velocities, `M` for momenta)."""

    def rate(a):
        return system.state_rate(t, q, s, terms, a)

    return jax.jvp(rate, (jnp.zeros_like(dv),), (dv,))[1]


@jit_with_constants
@scalarize
def _exact_velocity_step(system, formulation, t, q, s, residual, linear_solver):
    """`Δs` for `Δv = −M⁻¹Gᵀ(G M⁻¹ Gᵀ)⁻¹ r` with `M` and `G` at `(q, s)`: one step meets the
    affine `[Φ̇; Ψ] = 0` up to rounding."""
    terms = _terms_at(system, formulation, t, q, s)
    matrix, minv_gt = _dense_minv_gt(terms)
    dv = -small_matmul(minv_gt, _Factored.of(matrix, linear_solver).solve(residual))
    return _state_change(system, t, q, s, terms, dv) if _momenta(system) else dv


# Up to this many iterations nest their `lax.cond`s; more run in a `lax.scan` (nested ones
# would recurse in Python as deep as the count, and compile one copy of the step each).
_NESTED_ITERATIONS = 8


def _iterate(step, x, residual, converged, iterations: int):
    """Up to `iterations` applications of `(x, residual) -> step(x, residual)`, each only
    while `converged(x, residual)` is false: nested `lax.cond`s, so that a converged
    iteration costs one test (straight-line code that reverse and forward mode
    differentiate; under `vmap` every step runs). Beyond `_NESTED_ITERATIONS`, a
    `lax.scan` of the same guarded step: differentiable in both modes too, one copy of the
    step, and a test per remaining iteration once converged."""
    if iterations > _NESTED_ITERATIONS:

        def guarded(carry, _):
            return jax.lax.cond(converged(*carry), lambda x_, r_: (x_, r_), step, *carry), None

        return jax.lax.scan(guarded, (x, residual), length=iterations)[0]
    if iterations == 0:
        return x, residual

    def go_on(x_, r_):
        return _iterate(step, *step(x_, r_), converged, iterations - 1)

    return jax.lax.cond(converged(x, residual), lambda x_, r_: (x_, r_), go_on, x, residual)


def project_state(
    system: AbstractSystem,
    formulation: AbstractFormulation,
    t,
    q,
    s,
    linear_solver: lx.AbstractLinearSolver | None,
    iterations: int,
    tol: float,
):
    """The state `(q, s)` projected onto `Φ(t, q) = 0` and then onto `Φ̇ = 0, Ψ = 0`, and
    whether each projection converged (`(q, s), position_ok, velocity_ok`).

    Both are simplified Newton iterations with the gain `K = M⁻¹Gᵀ(G M⁻¹ Gᵀ)⁻¹`, `M` and
    `G` frozen at the unprojected point `(q̃, ṽ)` and factorized once ([`_Factored`][]; Hairer,
    Lubich & Wanner, *Geometric Numerical Integration*, §IV.4, Algorithm 4.2; Ascher &
    Petzold, *Computer Methods for ODEs and DAEs*, §10.1.4).

    Positions: `q ← q − K_J Φ(q)` (`K_J` from the holonomic rows `J` of `G`), starting with
    a Newton step from `q̃`. Every iterate lies in `q̃ + range(M⁻¹Jᵀ)`, so the limit is the
    point of the manifold that is closest to `q̃` in the metric `M` up to a term of second
    order in the (small) drift.

    Velocities, at the projected `q`: `v ← v − K_G [Φ̇; Ψ](q, v)`. `[Φ̇; Ψ]` is affine in `v`
    and its matrix `G(q)` differs from the frozen `G(q̃)` by the order of the position
    correction, so each iteration multiplies the residual by about that much; the limit
    meets `G(q) v = −c` and lies in `ṽ + range(M⁻¹Gᵀ)`. Where the rate seen does not bring
    the residual below the tolerance within two more iterations (a large correction, a
    nearly singular `G M⁻¹ Gᵀ`), the iterations stop and one step evaluates `M` and `G` at
    `(q, v)` and factorizes anew: it meets the affine constraints up to rounding. A state
    that holds momenta (a [`jaxdae.HamiltonianSystem`][]) is changed by the matching impulse,
    `p ← p + M Δv` (exact for a Hamiltonian quadratic in `p`). A [`jaxdae.RedundantCoordinates`][]
    state is projected in its positions only: its velocities follow from the independent ones and
    satisfy `Φ̇ = 0` by construction.

    Each iteration runs only while its residual is above `tol / 100` (rounding level for the
    default `tol`), at most `iterations` of each (`lax.cond`, differentiable in both modes;
    under `vmap` every iteration runs). Converged means `max |Φ| ≤ tol (1 + max|J| max|q|)` and
    `max |[Φ̇; Ψ]| ≤ tol (1 + max|G| max|v|)` (`J`, `G` at `q̃`): relative to the size of the
    terms that cancel in the residuals, which sets their rounding error.
    """
    derived = _derives_velocities(formulation)
    gains, q_new = _gains(system, formulation, t, q, s, linear_solver, not derived)

    def position_step(q_, phi):
        q_ = q_ - gains.position_step(phi)
        return q_, _constraint_values(system, formulation, t, q_, s)

    # The iterations go on to `tol / STOP` (rounding level for the default `tol`); `tol`
    # decides whether the projection succeeded.
    def position_converged(q_, phi, tol=tol):
        return _max_abs(phi) <= tol * (1.0 + gains.position_scale * _max_abs(q_))

    phi = _constraint_values(system, formulation, t, q_new, s)
    q_new, phi = _iterate(
        position_step,
        q_new,
        phi,
        lambda q_, phi_: position_converged(q_, phi_, tol / _thresholds.PROJECTION_STOP),
        iterations - 1,
    )
    position_ok = position_converged(q_new, phi)
    if derived:
        return (q_new, s), position_ok, jnp.array(True)

    def velocity_converged(v, residual, tol=tol):
        return _max_abs(residual) <= tol * (1.0 + gains.velocity_scale * _max_abs(v))

    # The carry is `(s, v, r)`, `r` the largest residual before the last step: with the
    # residual after it, the rate of the frozen iteration.
    def frozen_step(carry, residual):
        s_, _, _ = carry
        s_ = s_ - gains.velocity_step(residual)
        residual_new, v = _velocity_residual(system, formulation, t, q_new, s_)
        return (s_, v, _max_abs(residual)), residual_new

    def done_or_slow(carry, residual):
        # Done, or the rate seen would not reach the tolerance within two more steps.
        size = _max_abs(residual)
        rate = size / carry[2]
        return velocity_converged(carry[1], residual, tol / _thresholds.PROJECTION_STOP) | ~(
            size * rate**2
            <= tol / _thresholds.PROJECTION_STOP * (1.0 + gains.velocity_scale * _max_abs(carry[1]))
        )

    def exact_step(carry, residual):
        s_ = carry[0] + _exact_velocity_step(
            system, formulation, t, q_new, carry[0], residual, linear_solver
        )
        residual_new, v = _velocity_residual(system, formulation, t, q_new, s_)
        return (s_, v, _max_abs(residual)), residual_new

    residual, v = _velocity_residual(system, formulation, t, q_new, s)
    # The first step is frozen (the rate is 0 until one is seen); then frozen steps while
    # they converge fast enough, and one exact step if that did not reach the tolerance
    # (under `vmap`, where every branch runs, one exact step in all).
    carry, residual = frozen_step((s, v, jnp.asarray(jnp.inf, residual.dtype)), residual)
    carry, residual = _iterate(frozen_step, carry, residual, done_or_slow, iterations - 1)
    carry, residual = _iterate(
        exact_step,
        carry,
        residual,
        lambda c_, r_: velocity_converged(c_[1], r_, tol / _thresholds.PROJECTION_STOP),
        1,
    )
    return (q_new, carry[0]), position_ok, velocity_converged(carry[1], residual)


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
            return jax.tree.map(
                lambda a, b: a - b, self.evaluate(t1, left=left), self.evaluate(t0, left=left)
            )
        theta = (t0 - self.t0) / (self.t1 - self.t0)
        return jax.tree.map(
            lambda y, c: y + (theta * c).astype(y.dtype),
            self.inner.evaluate(t0, left=left),
            self.correction,
        )


def _interpolation(inner_cls: Callable) -> Callable:
    def build(*, t0, t1, inner, correction):
        return _ProjectedInterpolation(
            t0=t0, t1=t1, inner=inner_cls(t0=t0, t1=t1, **inner), correction=correction
        )

    return build


# The solver's result must be an item of diffrax's enumeration, and `RESULTS.promote` maps
# only diffrax's own items to jaxdae's; a failed projection is reported as the one item
# that no diffrax solver step returns (`conlim`, lineax's LSMR, which diffrax does not
# use), and `Projected.name_result` names it.
_CARRIER = diffrax.RESULTS.conlim


def _failure_item(failed: Bool[Array, ""], result):
    """`result` of the wrapped step, or the carrier of `projection_failed` where the step
    succeeded but its projection `failed`."""
    return diffrax.RESULTS.where(failed & (result == diffrax.RESULTS.successful), _CARRIER, result)


class Projected(AbstractSolverWrapper):
    """Wraps a diffrax solver and projects the state onto the constraint manifold after
    every step: positions onto `Φ(t, q) = 0`, then velocities onto `Φ̇ = 0`, `Ψ = 0`, each
    by the smallest change in the metric of the mass matrix (coordinate projection, or
    post-stabilization: Hairer, Lubich & Wanner, *Geometric Numerical Integration*, §IV.4;
    Ascher & Petzold, *Computer Methods for ODEs and DAEs*, §10.1.4).

    The formulation's stabilization (Baumgarte's gains, the penalty of the modified
    Lagrange equation) keeps acting between the steps; the projection removes what drift is
    left at every step end, whatever the gains, so even [`jaxdae.Unstabilized`][] stays on
    the manifold. The equations integrated between the projections are the formulation's
    `for_projection()`: its own, except that [`jaxdae.ModifiedLagrange`][] refines its
    multipliers by two augmented Lagrangian iterations with its factorization of
    `M + Jᵀ𝔄J` (without them its dynamics pull the state back towards the penalty's
    equilibrium off the manifold, `Φ = O(1/α)`, after every projection, which costs steps
    and accuracy; at singular configurations they change little, and the solve passes them
    as the penalty does; the saved `multipliers` are the penalty's own at the saved
    states). Use it with [`jaxdae.simulate`][] and [`jaxdae.simulate_ensemble`][] and
    any formulation and solver:

    ```python
    sol = jaxdae.simulate(system, jaxdae.Baumgarte(20.0, 100.0), 0.0, 2.0, q0, v0,
                          solver=jaxdae.Projected(diffrax.Tsit5()))
    ```

    **Positions**: simplified Newton iterations `q ← q − M⁻¹Jᵀ(J M⁻¹ Jᵀ)⁻¹ Φ(q)`, `M` and
    `J = Φ_q` evaluated and factorized once, at the step's end (the first iteration is a
    Newton step; the drift of one step is of the order of the local error, so one or two
    usually reach rounding). **Velocities** (or momenta), at the projected positions:
    `v ← v − M⁻¹Gᵀ(G M⁻¹ Gᵀ)⁻¹ [Φ̇; Ψ]`, `G = [Φ_q; Ψ_v]`, with the same frozen `M` and
    the factorization of the same `G M⁻¹ Gᵀ` (one iteration usually reaches rounding; where
    they converge too slowly, one step with `M` and `G` evaluated at the projected
    positions). Each stops once its residual is below `tol`. With
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
    code (at most `iterations` of each iteration, each behind a `lax.cond` on its
    convergence test), so reverse and forward mode differentiate the computed solution
    exactly. The default adjoint for this solver
    is `diffrax.RecursiveCheckpointAdjoint`; [`jaxdae.ReverseSweepAdjoint`][], which
    recomputes the wrapped Runge–Kutta steps without their projections, is refused. For
    forward mode (`adjoint=diffrax.ForwardMode()`) wrap a Runge–Kutta solver whose stages
    run in a plain loop, `Projected(diffrax.Tsit5(scan_kind="lax"))`: diffrax sets that on
    the solvers it sees, not on a wrapped one (its default loop over the stages supports
    reverse mode only, and a loop that supports both makes every solve slower).

    **Failure**: a projection that leaves `max |Φ|` or `max |[Φ̇; Ψ]|` above `tol`, relative
    to the size of the terms that cancel in them (`1 + max|J| max|q|`, `1 + max|G| max|v|`),
    after an accepted step ends the solve with `jaxdae.RESULTS.projection_failed` (in an
    ensemble, the whole ensemble: the steps are shared).

    **Arguments:**

    - `solver`: the diffrax solver to wrap, e.g. `diffrax.Tsit5()`.
    - `iterations`: the most simplified Newton iterations for the positions, and with the
        frozen factorization for the velocities (static); default 5. They converge linearly, at a
        rate set by how much `J` changes over the correction and by the conditioning of `J M⁻¹ Jᵀ`:
        a drift of 1e-9 needs one, one of 8e-5 on the two-link arm near its fold four.
    - `tol`: convergence tolerance of the residuals (relative, see above); default
        `1000 ε` of the state's dtype (`2.2e-13` in float64).
    - `linear_solver`: how `G M⁻¹ Gᵀ` is solved. `None` (default): a Cholesky
        factorization (unrolled for small systems, LAPACK otherwise) of
        `G M⁻¹ Gᵀ + δ I`, `δ = 100 c ε max diag(G M⁻¹ Gᵀ)` for `c` constraints: for
        independent constraints the Cholesky solve up to a relative `δ / σ_min`, and it
        also projects redundant constraints, whose `G M⁻¹ Gᵀ` is singular (the iterations
        remove what the shift leaves). A lineax solver otherwise, e.g. `lineax.SVD()`.

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
        check_instance(
            "solver",
            self.solver,
            diffrax.AbstractSolver,
            "a diffrax solver instance such as `diffrax.Tsit5()`",
        )
        if (
            isinstance(self.iterations, bool)
            or not isinstance(self.iterations, (int, np.integer))
            or self.iterations < 1
        ):
            raise ValueError(f"`iterations` must be a positive integer; got {self.iterations!r}.")
        if self.tol is not None and not (np.isfinite(self.tol) and self.tol > 0):
            raise ValueError(f"`tol` must be a positive finite number; got {self.tol!r}.")
        check_instance(
            "linear_solver",
            self.linear_solver,
            lx.AbstractLinearSolver,
            "a lineax solver such as `lineax.SVD()`, or None",
            optional=True,
        )

    @property
    def interpolation_cls(self):  # pyright: ignore
        return _interpolation(self.solver.interpolation_cls)

    def name_result(self, result: RESULTS) -> RESULTS:
        """A failed projection named `RESULTS.projection_failed` (`_CARRIER`); the outcome
        asks the wrapped solver for its own names."""
        return RESULTS.where(result == RESULTS.promote(_CARRIER), RESULTS.projection_failed, result)

    def func(self, terms, t0, y0, args):
        return self.solver.func(_between_projections(y0, terms), t0, y0, args)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(_between_projections(y0, terms), t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        term = _checked_term(y0, terms)
        system, formulation = term.system, term.formulation
        # The stored first-same-as-last stage is that of the unprojected state: a jump.
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            _between_projections(y0, terms), t0, t1, y0, args, solver_state, True
        )
        q, s = y1
        tol = self.tol if self.tol is not None else float(1000 * jnp.finfo(q.dtype).eps)

        def project(q_, s_):
            return project_state(
                system, formulation, t1, q_, s_, self.linear_solver, self.iterations, tol
            )

        if q.ndim == 1:
            (q_new, s_new), position_ok, velocity_ok = project(q, s)
            ok = keep = position_ok & velocity_ok
            failed = ~ok
        else:  # an ensemble: one projection per trajectory (row)
            (q_new, s_new), position_ok, velocity_ok = jax.vmap(project)(q, s)
            ok = position_ok & velocity_ok
            # Rows stopped by their formulation's failure (`_StopFailedTrajectories`)
            # stand still: neither projected nor counted.
            stopped = term.stopped_rows()
            stopped = jnp.zeros_like(ok) if stopped is None else stopped
            failed = jnp.any(~ok & ~stopped)
            keep = (ok & ~stopped)[:, None]
        # Where the projection failed, the unprojected end (finite) is where it stopped.
        y_new = (jnp.where(keep, q_new, q), jnp.where(keep, s_new, s))
        correction = jax.tree.map(lambda a, b: a - b, y_new, y1)
        return (
            y_new,
            y_error,
            {"inner": dense_info, "correction": correction},
            solver_state,
            _failure_item(failed, result),
        )


def _between_projections(y0, terms):
    """The solve's terms with the formulation that is integrated between the
    projections (`AbstractFormulation.for_projection`)."""
    _checked_term(y0, terms)
    return replace_system_term(
        terms,
        lambda term: eqx.tree_at(lambda x: x.formulation, term, term.formulation.for_projection()),
    )


def _checked_term(y0, terms) -> AbstractSystemTerm:
    """The term of a `simulate` / `simulate_ensemble` solve, which holds the system and
    formulation to project with."""
    found = [x for x in jax.tree.leaves(terms, is_leaf=is_system_term) if is_system_term(x)]
    if not (len(found) == 1 and isinstance(y0, tuple) and len(y0) == 2):
        raise ValueError(
            "`jaxdae.Projected` projects the states of `jaxdae.simulate` and "
            "`jaxdae.simulate_ensemble` (it reads the system and formulation from their "
            "solve's term); it does not apply to other solves (e.g. "
            "`jaxdae.simulate_actuated` or a direct `diffrax.diffeqsolve`)."
        )
    return found[0]
