"""The generalized-α method for the index-3 equations of motion, as a diffrax solver
([`jaxdae.GeneralizedAlpha`][])."""

from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .. import _thresholds
from .._compilation._linalg import (
    looped_cholesky,
    looped_triangular_solve,
    lu_factor,
    lu_solve,
)
from .._compilation._linear_solvers import PositiveSemidefinitePseudoInverse
from .._compilation._operators import sparse_matrix
from .._compilation._sparse import SparseMatrix, sparse_add, sparse_blocks
from .._compilation._supernodal import cholesky_plan
from .._custom_types import Array, Float, ScalarLike
from .._formulations._multipliers import eliminate, multiplier_solve
from .._gains import is_concrete
from .._solution import RESULTS
from .._systems._system import AbstractSystem, inertia_minus_forces
from ._generalized_alpha_newton import (
    DenseInverse,
    DenseNewtonMatrix,
    IterationMatrix,
    NewtonOptions,
    SaddlePointMatrix,
    newton_solve,
)
from ._jacobian import linearization, sparse_jacobian
from ._solvers import AbstractFailureNamingSolver, carries_contact_forces
from ._term import AbstractSystemTerm, system_term

# The Newton iteration stops once its remaining error is below this fraction of the
# step's tolerance (as `jaxdae.ToleranceChord`'s default `kappa`).
_KAPPA = 1e-2


def chung_hulbert(rho_inf: float) -> tuple[float, float, float, float]:
    """`(α_m, α_f, γ, β)` of the generalized-α method with spectral radius `ρ∞` at infinite
    step (Chung & Hulbert 1993; as used by Arnold & Brüls 2007): `α_m = (2ρ∞ − 1)/(ρ∞ + 1)`,
    `α_f = ρ∞/(ρ∞ + 1)`, `γ = ½ + α_f − α_m`, `β = ¼ (γ + ½)²`."""
    alpha_m = (2 * rho_inf - 1) / (rho_inf + 1)
    alpha_f = rho_inf / (rho_inf + 1)
    gamma = 0.5 + alpha_f - alpha_m
    beta = 0.25 * (gamma + 0.5) ** 2
    return alpha_m, alpha_f, gamma, beta


class _Step(eqx.Module):
    """The quantities of one step that do not depend on the unknown new positions."""

    h: ScalarLike  # a float where the step's times are
    c: ScalarLike  # ∂q_{n+1}/∂q̈_{n+1} = h² β (1 − α_f)/(1 − α_m)
    hb: ScalarLike  # h² β
    q_hat: Float[Array, " n"]  # q_{n+1} − h² β a_{n+1}
    q_tilde: Float[Array, " n"]  # q_{n+1} − c q̈_{n+1}
    v_hat: Float[Array, " n"]  # v_{n+1} − h γ a_{n+1}
    gamma: float
    beta: float

    def unpack(self, q):
        """`(v, q̈, a)` at the new positions `q`."""
        a = (q - self.q_hat) / self.hb
        return self.v_hat + self.h * self.gamma * a, (q - self.q_tilde) / self.c, a


def _split(x, step):
    n = step.q_hat.shape[0]
    return x[:n], x[n:]


def _residual(x, args):
    """The step's equations in units of position: `c (M q̈ + Gᵀλ − Q)` with `μ = c λ`,
    `Φ(t, q)` and `h Ψ(t, q, v)`; `x = (q, μ)` flat. No `aux` (`()`).

    The Newton iteration evaluates them at every iteration, and they need products, not
    the matrices `M` and `G` that `terms` builds column by column: for a system whose
    terms take `Φ` and `Ψ` from its constraints (`terms_from_constraints`) and are derived
    in array form (more than `STRUCTURED_MIN` coordinates), `M q̈ − Q` is the system's
    [`inertia_minus_forces`][] (for a [`jaxdae.LagrangianSystem`][] the Lagrange
    expression) and `Gᵀμ` the reverse-mode product of the constraints with `μ`. Smaller
    systems' terms are a scalar graph that costs as little as the products, and the
    others' are all they define: from `terms`."""
    system, t, step = args
    q, mu = _split(x, step)
    v, qdd, _ = step.unpack(q)
    inertia = None
    if system.terms_from_constraints and q.shape[0] > _thresholds.STRUCTURED_MIN:
        inertia = inertia_minus_forces(system, t, q, v, qdd)
    if inertia is None:
        terms = system.terms(t, q, v)
        dynamics = step.c * (terms.mass_matrix @ qdd - terms.forces) + terms.jacobian.T @ mu
        return jnp.concatenate([dynamics, terms.phi, step.h * terms.psi]), ()
    phi, pull_q = jax.vjp(lambda y: system.constraints(t, y), q)
    psi, pull_v = jax.vjp(lambda w: system.velocity_constraints(t, q, w), v)
    m = phi.shape[0]
    (reaction,), (reaction_v,) = pull_q(mu[:m]), pull_v(mu[m:])
    dynamics = step.c * inertia + reaction + reaction_v
    return jnp.concatenate([dynamics, phi, step.h * psi]), ()


def _kept_terms(system, t, q, v):
    """The terms at the step's end, for the error estimate's projection
    ([`_tangential`][]); not differentiated (the error estimate only sizes the steps)."""
    return jax.lax.stop_gradient(system.terms(t, q, v))


def _iteration_matrix(x, args):
    """The iteration matrix of the step's equations at `x = (q, μ)`, from the structured
    terms: `[[M − c (∂Q/∂q + s ∂Q/∂v), Gᵀ], [Φ_q; (γ/β) Ψ_v, 0]]` with `s = ∂v/∂q =
    γ/(hβ)`. `∂Q/∂q + s ∂Q/∂v` is the forward-mode derivative of the forces alone along
    `(dq, s dq)`, one tangent per coordinate (or per colour group of its columns, where
    the forces couple few coordinates). Left out, as in Arnold & Brüls (2007, §3) and the
    multibody codes: the derivatives of `M(q) q̈` and `Gᵀ μ` with respect to `q` (of order
    `c` next to `M`) and `h Ψ_q` (of order `h` next to `(γ/β) Ψ_v`); they slow the
    iteration's contraction, not its solution.

    Of more than `LOOPED_INVERSE_MAX` unknowns, where the terms carry `M` and `G` on their
    patterns, the matrix is assembled on its pattern (`K` from one tangent per colour group
    of its columns) for the sparse LU factorization ([`SaddlePointMatrix`][])."""
    system, t, step = args
    q, _ = _split(x, step)
    v, _, _ = step.unpack(q)
    terms = system.terms(t, q, v)
    m = terms.num_holonomic
    mass, jacobian = sparse_matrix(terms.mass_operator), sparse_matrix(terms.jacobian_operator)
    if x.shape[0] > _thresholds.LOOPED_INVERSE_MAX and mass is not None and jacobian is not None:
        stiffness = sparse_jacobian(lambda y: system.terms(t, y, step.unpack(y)[0]).forces, q)
        scaled = SparseMatrix(-step.c * stiffness.values, stiffness.pattern)
        nonholonomic = jacobian.pattern.rows >= m
        rows = SparseMatrix(
            jnp.where(nonholonomic, step.gamma / step.beta, 1.0) * jacobian.values,
            jacobian.pattern,
        )
        matrix = sparse_blocks([[sparse_add(mass, scaled), jacobian.T], [rows, None]])
        return SaddlePointMatrix(matrix, q.shape[0])
    _, stiffness, _, _ = linearization(
        lambda time, y: system.terms(time, y, step.unpack(y)[0]).forces, t, q, "coloured"
    )
    rows = jnp.concatenate([terms.jacobian[:m], (step.gamma / step.beta) * terms.jacobian[m:]])
    top = jnp.concatenate([terms.mass_matrix - step.c * stiffness, terms.jacobian.T], 1)
    bottom = jnp.concatenate([rows, jnp.zeros((rows.shape[0], rows.shape[0]), x.dtype)], 1)
    return DenseNewtonMatrix(jnp.concatenate([top, bottom], 0))


def _tangential(terms, error, least_squares: bool):
    """`error` without its part along `M⁻¹ Φ_qᵀ`, `W (Φ_q W)⁻¹ Φ_q error` with `W = M⁻¹
    Φ_qᵀ` (`terms` at the step's end): the oblique projection onto the tangent space of the
    position constraints along the directions in which the multipliers move the positions.
    The step holds `Φ(q) = 0` to the Newton tolerance whatever the step size, and that part
    of `a_{n+1} − a_n` is the index-3 method's velocity drift `Φ̇ = O(h²)` over the step
    (`Φ(q̂) ≈ h Φ̇`, corrected through `M⁻¹ Φ_qᵀ μ`), which does not shrink with the step.

    `M⁻¹ Gᵀ` and `G M⁻¹ Gᵀ` come from [`eliminate`][], which follows the structure the terms
    carry (a mass matrix of small blocks inverted block by block, or its factor kept by the
    solve): a dense Cholesky factorization of `M` here would be a LAPACK call inside the
    solve's loop, which then runs kernel by kernel (`_xla_flags.py`). Of more than
    `LOOPED_MAX` holonomic constraints alone, `G M⁻¹ Gᵀ` on its pattern is factorized as
    the multiplier solves do (`cholesky_plan`: banded or sparse), where it has one."""
    m = terms.num_holonomic
    if m == 0:
        return error
    elimination = eliminate(terms)
    gram = elimination.matrix[:m, :m]
    rhs = terms.jacobian[:m] @ error
    sparse = elimination.sparse_matrix
    plan = None
    if (
        sparse is not None
        and not least_squares
        and terms.num_nonholonomic == 0
        and m > _thresholds.LOOPED_MAX
    ):
        plan = cholesky_plan(sparse.pattern)
    if plan is not None:
        coefficients, _ = plan.solve(sparse, rhs)
    elif least_squares:
        coefficients = jnp.linalg.pinv(gram) @ rhs
    elif m <= _thresholds.LU_UNROLL_MAX:
        coefficients = lu_solve(lu_factor(gram), rhs)
    else:
        # `G M⁻¹ Gᵀ` is positive definite for independent constraints: a looped Cholesky
        # factorization keeps the solve of an unbatched step inside its loop, where LAPACK's
        # LU beyond `LU_UNROLL_MAX` rows would be a call out of it.
        low = looped_cholesky(gram)
        coefficients = looped_triangular_solve(
            low, looped_triangular_solve(low, rhs[:, None]), transpose=True
        )[:, 0]
    padded = jnp.concatenate([coefficients, jnp.zeros(terms.num_nonholonomic, error.dtype)])
    return error - elimination.apply_minv_gt(padded)


def _coefficient(args):
    return args[2].c


def _measure(x, delta, args):
    """A Newton increment in units of velocity, `s Δ` with `s = ∂v/∂q = γ/(hβ)`, against
    the velocities (and `s μ`): an increment `Δq` of the positions changes the step's
    velocities by `s Δq` and its accelerations by `Δq/c`, and a stiff force by
    `∂Q/∂q Δq`, so that positions converged to `atol` leave errors of `atol/h` in the
    velocities, which the next steps integrate."""
    step = args[2]
    q, mu = _split(x, step)
    slope = step.gamma / (step.h * step.beta)
    return slope * delta, jnp.concatenate([step.unpack(q)[0], slope * mu])


def _concrete_float(value):
    """A concrete real scalar (a Python, NumPy or JAX number) as a float; anything else as
    it is, for the check to name."""
    if isinstance(value, bool) or not is_concrete(value):
        return value
    try:
        return float(value) if np.ndim(value) == 0 and np.isreal(value) else value
    except TypeError:
        return value


class GeneralizedAlpha(
    AbstractFailureNamingSolver, diffrax.AbstractImplicitSolver, diffrax.AbstractAdaptiveSolver
):
    """The generalized-α method (Chung & Hulbert 1993) applied to the index-3 equations
    `M q̈ + Φ_qᵀ λ + Ψ_vᵀ μ = Q`, `Φ(t, q) = 0`, `Ψ(t, q, v) = 0` as Arnold & Brüls (2007)
    formulate it, with an adaptive step: the implicit integrator of multibody codes
    (Chrono's and Exudyn's default), for stiff systems — stiff springs and bushings,
    large stabilization gains, fast actuator dynamics — whose step an explicit solver
    must keep within its stability region.

    One step from `t_n` to `t_{n+1} = t_n + h` (Arnold & Brüls 2007):

    - `q_{n+1} = q_n + h v_n + h² (½ − β) a_n + h² β a_{n+1}`,
    - `v_{n+1} = v_n + h (1 − γ) a_n + h γ a_{n+1}`,
    - `(1 − α_m) a_{n+1} + α_m a_n = (1 − α_f) q̈_{n+1} + α_f q̈_n`,
    - the equations of motion and the constraints at `t_{n+1}`: `Φ(t_{n+1}, q_{n+1}) = 0`
        (positions, index 3) and `Ψ(t_{n+1}, q_{n+1}, v_{n+1}) = 0`.

    `a` is an acceleration-like variable, `α_m, α_f, γ, β` follow from the spectral radius
    `ρ∞` at infinite step (Chung–Hulbert: second order, high frequencies damped to `ρ∞`
    per step, low ones barely). The unknowns are the new positions and the scaled
    multipliers `μ = c λ` (`c = h² β (1 − α_f)/(1 − α_m)`), so that every equation is in
    units of position.

    **The Newton iteration** is a modified Newton method compiled into the step (one
    `lax.while_loop` of array operations, no library call for small models). Its matrix
    is built from the structured terms, `[[M − c (∂Q/∂q + s ∂Q/∂v), Gᵀ], [Φ_q; (γ/β) Ψ_v,
    0]]` with `s = γ/(hβ)` (the forces' derivatives by forward mode on the forces alone;
    the derivatives of `M(q) q̈`, `Gᵀμ` and `h Ψ_q`, of order `c` and `h`, left out as in
    Arnold & Brüls 2007, §3), factorized once and kept across iterations and steps:
    inverted in array operations up to `LOOPED_INVERSE_MAX` unknowns; beyond, where the
    terms carry `M` and `G` on their patterns (meshes, trusses, long chains of bodies in
    absolute coordinates), assembled on its pattern and factorized by a sparse LU
    factorization on an order that eliminates each multiplier after its constraint's
    coordinates, wherever that costs less than the dense inverse (LAPACK's otherwise). It is
    rebuilt
    only where the iteration contracts by less than a factor 2 per iteration, or where
    the step's `c` changed by more than a factor 1/0.6 since it was built (DASSL's and
    IDA's rule). Each iteration evaluates the equations from products, `M q̈` as the
    derivative of `∂L/∂v` along `q̈` and `Gᵀμ` by reverse mode, not from the matrices
    `M` and `G` (for a [`jaxdae.LagrangianSystem`][] of more than `STRUCTURED_MIN`
    coordinates). The
    iteration stops once its remaining error, estimated from the contraction rate
    (Hairer & Wanner, *Solving ODEs II*, §IV.8), is below 1 % of the tolerance measured
    in units of velocity (`s Δq`: a position converged to `atol` would leave errors of
    `atol/h` in the velocities, and of `k atol` in the force of a spring of stiffness
    `k`). The step's derivative is taken by the implicit function theorem at the
    converged step, with the exact Jacobian of its equations (not through the loop).

    **Local error estimate** (Géradin & Cardona, *Flexible Multibody Dynamics*, 2001;
    Arnold & Brüls 2007): the Taylor expansion of the step, with `a_n ≈ q̈(t_n +
    (α_m − α_f) h)`, leaves `h³ (β − 1/6 + (α_m − α_f)/2) q⃛` in the positions, and
    `a_{n+1} − a_n ≈ h q⃛`, so `e = h² (β − 1/6 + (α_m − α_f)/2) (a_{n+1} − a_n)` (for
    Newmark's average acceleration, `ρ∞ = 1`, the classical `h² (β − 1/6)(a_{n+1} −
    a_n)` of Zienkiewicz & Xie). Its part along `M⁻¹ Φ_qᵀ` is dropped (an oblique
    projection onto the constraints' tangent space: the step holds `Φ = 0` whatever its
    size, and that part is the index-3 velocity drift over `h`). The controller is given `e/h`, the
    error per unit step (Shampine), with `error_order = 2`: the local errors of a run then add up to
    about `(t1 − t0)` times the tolerance, where per-step control (`e`) let them add up to the
    number of steps times it. The velocities' entries of the estimate are zero. A step whose Newton
    iteration does not converge is rejected and retried with a smaller step.

    **What the tolerance promises.** `rtol`, `atol` bound the positions' error per unit
    time. On the guide's cases (`docs/guides/stiff_integration.md`: stiff spring
    pendulums, a Cartesian arm, a chain on stiff springs, the flyball governor) the
    global error of the positions is 1–25 times `rtol` (relative to the largest
    coordinate) for `rtol` from `10⁻³` to `10⁻⁶`; it grows with the horizon where errors
    in the phase of a motion accumulate. The velocities (`O(h²)`) and the multipliers and `q̈`
    (whose errors are of lower order after a change of step, as in every index-3 method) are not
    controlled; `Φ̇` is not enforced.

    **When it pays.** Its steps do not grow with the stiffness and a step costs a few
    evaluations of the terms (a Tsit5 step costs six): on stiff systems at engineering
    accuracy, `docs/guides/stiff_integration.md` measures it against the explicit and the
    other implicit solvers.

    **Start.** The accelerations and multipliers at `t0` are consistent: those of the
    index-1 equations `Φ̈ = 0`, `Ψ̇ = 0` with least-squares multipliers
    ([`jaxdae.PseudoInverse`][] without gains; the same as [`jaxdae.Unstabilized`][]'s
    where the constraints are independent), and `a_0 = q̈_0`. `q0` should satisfy `Φ = 0`
    ([`jaxdae.consistent_initial_state`][]): the first step moves it onto the constraints
    in one step.

    **Redundant constraints** make each step's Newton matrix singular: the default LU
    inverse is not finite, every step is rejected and the solve stops. Called eagerly,
    [`jaxdae.simulate`][] then finds the constraint Jacobian rank-deficient at the state
    where it stopped and reports `RESULTS.singular_newton_matrix` (traced, under your own
    `jit`, `vmap` or `grad`: `dt_min_reached`). Pass a root finder with a least-squares
    linear solve,
    `root_finder=diffrax.with_stepsize_controller_tols(optimistix.Chord)(linear_solver=lineax.SVD())`.

    **With [`jaxdae.simulate`][].** Pass it as the solver:

    ```python
    sol = jaxdae.simulate(system, jaxdae.Baumgarte(10.0, 25.0), 0.0, 2.0, q0, v0,
                          solver=jaxdae.GeneralizedAlpha(), rtol=1e-6, atol=1e-9)
    ```

    It integrates the exact constraints itself and reads the system from the solve's term
    (`jaxdae.extend.system_term`); the formulation does not change the motion. It is used
    where `simulate` uses it besides the integration: the saved multipliers (the
    formulation's, at the saved states, where `Φ ≈ 0`; for the exact ones of the index-1
    equations pass [`jaxdae.Unstabilized`][]) and the formulation's failure test (e.g.
    [`jaxdae.Baumgarte`][] stops at a singular `G M⁻¹ Gᵀ`; [`jaxdae.ModifiedLagrange`][]
    does not). `Φ̇` is not enforced and is `O(h²)`. Saved states between step ends are
    interpolated (cubic Hermite), and there `Φ` is the interpolation's error. `jax.vmap`
    works as with any solver. `jax.grad` takes, by default (with an integer `max_steps`),
    the discrete adjoint of the accepted steps, replayed at their recorded times: each
    step's equations differentiated implicitly at its solution, the step sizes held
    constant. It equals the gradient of diffrax's loop with one checkpoint per step
    (`diffrax.RecursiveCheckpointAdjoint(checkpoints=max_steps)`), at a few forward solves'
    cost (`docs/guides/stiff_integration.md`). Fewer checkpoints are not the default:
    diffrax recomputes the steps between them in another compiled program, whose rounding
    can make an adaptive decision differently, and the gradient then differentiates steps
    the solve did not take. A formulation that changes the velocities
    ([`jaxdae.RedundantCoordinates`][]), a system whose state holds momenta
    ([`jaxdae.HamiltonianSystem`][]) or realized constraints, and
    [`jaxdae.simulate_ensemble`][] are refused with a `ValueError`; batch with
    `jax.vmap(simulate)`.

    **Arguments:**

    - `rho_inf`: the spectral radius at infinite step, in `[0, 1]` (default `0.8`): `1`
        damps nothing (Newmark's average acceleration), `0` annihilates the highest
        frequencies in one step.
    - `root_finder`: gives the Newton iteration its tolerances and norm, and its linear
        solve: default `diffrax.with_stepsize_controller_tols(optimistix.Chord)()`, whose
        `rtol`, `atol` and norm diffrax fills in from the step-size controller. With a
        fixed step (`diffrax.ConstantStepSize()`) pass one with tolerances, e.g.
        `optimistix.Newton(rtol=1e-10, atol=1e-10)`. A `linear_solver=lineax.SVD()`
        makes the iteration's inverse a pseudo-inverse (redundant constraints). The
        iteration itself is always the modified Newton method above.
    - `root_find_max_steps`: the most Newton iterations of a step (default `10`).

    **Raises:**

    `ValueError` for `rho_inf` outside `[0, 1]`; when the solve starts, for the
    combinations above.

    **References:** M. Arnold, O. Brüls, "Convergence of the generalized-α scheme for
    constrained mechanical systems", Multibody System Dynamics 18 (2007) 185–202;
    J. Chung, G. M. Hulbert, J. Appl. Mech. 60 (1993) 371–375; M. Géradin, A. Cardona,
    *Flexible Multibody Dynamics: A Finite Element Approach*, Wiley 2001; L. F. Shampine,
    *Numerical Solution of Ordinary Differential Equations*, Chapman & Hall 1994
    (error per unit step); E. Hairer, G. Wanner, *Solving Ordinary Differential Equations
    II*, Springer 1996, §IV.8.
    """

    rho_inf: float = eqx.field(default=0.8, converter=_concrete_float)
    root_finder: optx.AbstractRootFinder = diffrax.with_stepsize_controller_tols(optx.Chord)()
    root_find_max_steps: int = 10

    # The DAE of `jaxdae.simulate` (`_term.py`): the method reads the system from it.
    term_structure: ClassVar = AbstractSystemTerm
    interpolation_cls: ClassVar = diffrax.ThirdOrderHermitePolynomialInterpolation

    def __check_init__(self):
        if not (isinstance(self.rho_inf, float) and 0 <= self.rho_inf <= 1):
            raise ValueError(
                f"`GeneralizedAlpha(rho_inf=...)` must be a number in [0, 1] "
                "(concrete: it sets the method's coefficients when the solve is "
                f"traced); got {self.rho_inf!r}."
            )
        if not (isinstance(self.root_find_max_steps, int) and self.root_find_max_steps >= 1):
            raise ValueError(
                "`GeneralizedAlpha(root_find_max_steps=...)` must be a positive "
                f"integer; got {self.root_find_max_steps!r}."
            )

    def order(self, terms):
        return 2

    def error_order(self, terms):
        return 2

    def init(self, terms, t0, t1, y0, args):
        system = _system(y0, terms)
        acc, multipliers = _consistent(system, t0, *y0)
        size = y0[0].shape[0] + multipliers.shape[0]
        if size <= _thresholds.LOOPED_INVERSE_MAX:
            factor = DenseInverse(jnp.zeros((size, size), acc.dtype))
        else:  # the structure of the factorization that the steps will build
            x = jnp.concatenate([y0[0], multipliers])
            step = self.prepare(t0, t1, *y0, acc, acc)
            factor = jax.eval_shape(
                lambda: _iteration_matrix(x, (system, t0, step)).factor(
                    _solves_least_squares(self), _rcond(self)
                )
            )
        return acc, acc, multipliers, IterationMatrix.empty(factor, acc.dtype)

    def prepare(self, t0, t1, q0, v0, a0, qdd0) -> _Step:
        """The quantities of the step from `t0` to `t1` that do not depend on its unknown
        new positions, from the start's positions, velocities, `a` and `q̈`."""
        alpha_m, alpha_f, gamma, beta = chung_hulbert(float(self.rho_inf))
        h = t1 - t0
        hb = h**2 * beta
        q_hat = q0 + h * v0 + h**2 * (0.5 - beta) * a0
        return _Step(
            h=h,
            c=hb * (1 - alpha_f) / (1 - alpha_m),
            hb=hb,
            q_hat=q_hat,
            q_tilde=q_hat + hb / (1 - alpha_m) * (alpha_f * qdd0 - alpha_m * a0),
            v_hat=v0 + h * (1 - gamma) * a0,
            gamma=gamma,
            beta=beta,
        )

    def residual(self, x, system: AbstractSystem, t, step: _Step):
        """The step's equations at `x = (q, μ)` (`_residual`), flat."""
        return _residual(x, (system, t, step))[0]

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del made_jump
        system = _system(y0, terms)
        q0, v0 = y0
        a0, qdd0, lam0, kept = solver_state
        alpha_m, alpha_f, _, beta = chung_hulbert(float(self.rho_inf))
        step = self.prepare(t0, t1, q0, v0, a0, qdd0)
        h, hb = step.h, step.hb
        guess = jnp.concatenate([step.q_tilde + step.c * qdd0, step.c * lam0])
        finder = self.root_finder
        options = NewtonOptions(
            residual=_residual,
            matrix=_iteration_matrix,
            coefficient=_coefficient,
            measure=_measure,
            norm=finder.norm,
            kappa=_KAPPA,
            max_steps=self.root_find_max_steps,
            least_squares=_solves_least_squares(self),
            rcond=_rcond(self),
            coordinates=q0.shape[0],
        )
        x, matrix, converged, _, _ = newton_solve(
            guess, (system, t1, step), kept, finder.rtol, finder.atol, options=options
        )
        q1, mu = _split(x, step)
        v1, qdd1, a1 = step.unpack(q1)
        kept_terms = _kept_terms(system, t1, q1, v1)
        # The local error of the positions, per unit step (see the docstring).
        local = _tangential(
            kept_terms,
            hb * (beta - 1 / 6 + (alpha_m - alpha_f) / 2) * (a1 - a0),
            options.least_squares,
        )
        q_error = jnp.where(converged, local / h, jnp.inf)
        y1 = (q1, v1)
        dense_info = dict(y0=y0, y1=y1, k0=(h * v0, h * qdd0), k1=(h * v1, h * qdd1))
        result = diffrax.RESULTS.where(
            converged, diffrax.RESULTS.successful, diffrax.RESULTS.nonlinear_divergence
        )
        return (
            y1,
            (q_error, jnp.zeros_like(v1)),
            dense_info,
            (a1, qdd1, mu / step.c, matrix),
            result,
        )

    def func(self, terms, t0, y0, args):
        system = _system(y0, terms)
        q, v = y0
        acc, _ = _consistent(system, t0, q, v)
        return v, acc

    def name_stall(self, sol, system: AbstractSystem):
        """`sol` (concrete) relabelled `RESULTS.singular_newton_matrix` where this solver's
        Newton iteration needs a nonsingular matrix and it stalled (`dt_min_reached`) at a
        state whose constraint Jacobian `G = [Φ_q; Ψ_v]` has fewer independent rows than
        rows (singular values below `√ε σ_max`, as `checked_result` counts the range of
        `G`): redundant constraints, or a singular configuration."""
        if (
            _solves_least_squares(self)
            or np.ndim(sol.t_final) != 0
            or sol.result != RESULTS.dt_min_reached
        ):
            return sol
        jacobian = np.asarray(system.terms(sol.t_final, sol.q_final, sol.v_final).jacobian)
        if jacobian.shape[0] == 0 or not np.all(np.isfinite(jacobian)):
            return sol
        singular_values = np.linalg.svd(jacobian, compute_uv=False)
        floor = np.sqrt(np.finfo(jacobian.dtype).eps) * singular_values[0]
        if np.sum(singular_values > floor) == jacobian.shape[0]:
            return sol
        return eqx.tree_at(lambda s: s.result, sol, RESULTS.singular_newton_matrix)


def _linear_solver(solver: GeneralizedAlpha) -> lx.AbstractLinearSolver | None:
    """The linear solver of the Newton iteration, where its root finder has one."""
    finder = solver.root_finder
    has_one = isinstance(finder, optx.Newton | optx.Chord | diffrax.VeryChord)
    return finder.linear_solver if has_one else None


def _rcond(solver: GeneralizedAlpha) -> float | None:
    """The relative cut-off of the least-squares solve, where its root finder's linear
    solver gives one."""
    linear_solver = _linear_solver(solver)
    return linear_solver.rcond if isinstance(linear_solver, lx.SVD) else None


def _solves_least_squares(solver: GeneralizedAlpha) -> bool:
    """Whether the Newton iteration of `solver` solves rank-deficient systems (an SVD)."""
    linear_solver = _linear_solver(solver)
    return isinstance(linear_solver, lx.SVD) or (
        isinstance(linear_solver, lx.AutoLinearSolver) and linear_solver.well_posed is False
    )


def _consistent(system, t, q, v):
    """`(q̈, multipliers)` of the index-1 equations `Φ̈ = 0`, `Ψ̇ = 0` at `(t, q, v)`: the
    least-squares multipliers (those of [`jaxdae.PseudoInverse`][] without stabilization:
    its solve for the unstabilized right-hand side `G q̈ = bias`), so that redundant
    constraints, whose `G M⁻¹ Gᵀ` is singular, start from finite accelerations. Built
    without a formulation, whose gain checks refuse zero gains outside `jit`."""
    terms = system.terms(t, q, v)
    return multiplier_solve(terms, terms.bias, PositiveSemidefinitePseudoInverse(None))


def _system(y0, terms) -> AbstractSystem:
    """The system of a solve, read from its term (`_term.py`), checked for what the
    method needs."""
    term = system_term(terms)
    system, formulation = term.system, term.formulation
    if y0[0].ndim != 1:
        raise ValueError(
            "`jaxdae.GeneralizedAlpha` integrates one trajectory at a time: batch it with "
            "`jax.vmap(jaxdae.simulate)` instead of `jaxdae.simulate_ensemble`."
        )
    if not system.state_is_velocity:
        raise ValueError(
            f"`jaxdae.GeneralizedAlpha` integrates positions and velocities; the state of "
            f"{type(system).__name__} holds something else (momenta of a "
            "`HamiltonianSystem`, realized constraints). Integrate it with an ODE solver "
            "(e.g. `diffrax.Tsit5()`), or write it as a `jaxdae.LagrangianSystem`."
        )
    if formulation.derives_velocities:
        raise ValueError(
            f"`jaxdae.GeneralizedAlpha` enforces the constraints itself; "
            f"{type(formulation).__name__} integrates other velocities (redundant "
            "coordinates) and cannot be combined with it. Pass e.g. `jaxdae.Unstabilized()` "
            "or `jaxdae.Baumgarte(...)` (used only for the saved multipliers)."
        )
    return system


# It integrates the system's own equations with the bilateral constraints, not the term's
# rates, which between events carry the resting contacts' forces.
carries_contact_forces.register(GeneralizedAlpha, lambda solver: False)
