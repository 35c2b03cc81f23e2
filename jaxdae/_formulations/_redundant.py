"""Redundant coordinates without multipliers: Shulgin's equations (Krasinskaya and Krasinskiy
(2013), eqs. [1]–[7])."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._checks import check_instance
from .._compilation._linalg import extreme_eigenvalues, spd_solve
from .._compilation._operators import sparse_matrix
from .._custom_types import Array, Float
from .._solution import RESULTS
from .._systems._system import ConstrainedTerms, LagrangianSystem
from ._base import AbstractIndependentVelocities
from ._multipliers import default_rcond


def split_jacobian(jacobian, dependent, independent):
    """`∂F/∂q_dep` (m×m) and `∂F/∂q_ind` (m×(n−m))."""
    dep = jnp.asarray(dependent, dtype=int)
    ind = jnp.asarray(independent, dtype=int)
    return jacobian[:, dep], jacobian[:, ind]


def singular_ratio(matrix: Float[Array, "m m"], jacobian: Float[Array, "m n"]) -> Float[Array, ""]:
    """`σ_min(∂F/∂q_dep) / σ_max(∂F/∂q)` (1 without constraints).

    Relative to the whole Jacobian, so that it is scale-free and also meaningful for one
    constraint (where `∂F/∂q_dep` is 1×1).
    """
    if matrix.shape[0] == 0:
        return jnp.ones((), matrix.dtype)
    tiny = jnp.finfo(matrix.dtype).tiny
    if matrix.shape[0] <= 2:
        # Closed forms (LAPACK's SVD is a call per step that XLA cannot fuse): the largest
        # singular value from the largest eigenvalue of A Aᵀ (no cancellation); the smallest
        # of a 2 × 2 as |det| / σ_max (σ_min σ_max = |det|), of a 1 × 1 its |entry|.
        smax = jnp.sqrt(extreme_eigenvalues(jacobian @ jacobian.T)[1])
        if matrix.shape[0] == 1:
            smin = jnp.abs(matrix[0, 0])
        else:
            smax_dep = jnp.sqrt(extreme_eigenvalues(matrix @ matrix.T)[1])
            smin = jnp.abs(small_det(matrix)) / jnp.maximum(smax_dep, tiny)
    else:
        smin = jnp.linalg.svd(matrix, compute_uv=False)[-1]
        smax = jnp.linalg.svd(jacobian, compute_uv=False)[0]
    return smin / jnp.maximum(smax, tiny)


def small_det(matrix: Float[Array, "m m"]) -> Float[Array, ""]:
    """`det(matrix)`, in closed form for sizes 1 and 2."""
    if matrix.shape[0] == 1:
        return matrix[0, 0]
    if matrix.shape[0] == 2:
        return matrix[0, 0] * matrix[1, 1] - matrix[0, 1] * matrix[1, 0]
    return jnp.linalg.det(matrix)


def lu_solver(matrix):
    """A function `b -> matrix⁻¹ b` (vectors or matrices) from one LU factorization
    (Cramer's rule for sizes 1 and 2: no LAPACK call per evaluation)."""
    if matrix.shape[0] in (1, 2):
        if matrix.shape[0] == 1:
            inverse = 1.0 / matrix
        else:
            adjugate = jnp.stack(
                [jnp.stack([matrix[1, 1], -matrix[0, 1]]), jnp.stack([-matrix[1, 0], matrix[0, 0]])]
            )
            inverse = adjugate / small_det(matrix)
        return lambda b: inverse @ b
    operator = lx.MatrixLinearOperator(matrix)
    solver = lx.LU()
    state = solver.init(operator, options={})

    def solve(b):
        if b.ndim == 2:
            return jax.vmap(solve, in_axes=1, out_axes=1)(b)
        return lx.linear_solve(operator, b, solver, state=state, throw=False).value

    return solve


def _mass_product(terms: ConstrainedTerms):
    """`x ↦ M x` for vectors and matrices: on `M`'s pattern where the terms carry one (its
    cost grows with the non-zeros of `M`, not with `n²`), else dense."""
    sparse = sparse_matrix(terms.mass_operator)
    if sparse is None:
        return lambda x: terms.mass_matrix @ x

    def product(x):
        if x.ndim == 2:
            return jax.vmap(sparse.matvec, in_axes=1, out_axes=1)(x)
        return sparse.matvec(x)

    return product


def _constraint_rates(system, t, q, v):
    """`F_q` and `F_t` at `(t, q)`, from `system.constraints` where the system's terms take
    them from there."""
    if system.terms_from_constraints:
        jac = jax.jacfwd(system.constraints, argnums=1)(t, q)
        _, phi_t = jax.jvp(lambda t_: system.constraints(t_, q), (t,), (jnp.ones_like(t),))
        return jac.reshape(phi_t.shape[0], q.shape[0]), phi_t
    terms = system.terms(t, q, v)
    m = terms.num_holonomic
    jac = terms.jacobian[:m]
    return jac, terms.dphi - jac @ v


class RedundantCoordinates(AbstractIndependentVelocities):
    """Redundant coordinates with the multiplier-free Shulgin equations (Krasinskaya and Krasinskiy
    (2013), eq. [7]).

    The `n` coordinates are split into `n − m` independent ones and the `m` **dependent**
    ones named here, one per geometric constraint `F(t, q) = 0` [1]. The once-differentiated
    constraints [2] are solved for the dependent velocities [5]:
    `q̇_dep = B(q) q̇_ind − (∂F/∂q_dep)⁻¹ F_t`, `B = −(∂F/∂q_dep)⁻¹ ∂F/∂q_ind`, by autodiff and
    one linear solve; this needs `det ∂F/∂q_dep ≠ 0` (condition [4]). The equations of
    motion are Shulgin's [7], written in matrix form: with `N = [I; B]` (rows ordered as the
    coordinates) and `q̈ = N q̈_ind + q̈₀`, `J q̈₀ = γ`,

        Nᵀ M N q̈_ind = Nᵀ (Q − M q̈₀),

    which is `d/dt ∂T*/∂q̇_j − ∂T*/∂q_j − Σ_k B_kj ∂T*/∂q_k = Q_j + Σ_k B_kj Q_k` term by
    term (the reactions `Jᵀλ` drop out because `JN = 0`). [`jaxdae.simulate`][] integrates
    `(q_ind, q_dep, q̇_ind)`: `q̇` comes from [5] at every evaluation (see `velocities`),
    so `Φ̇ = 0` exactly and `Φ` only drifts by the local integration error. The stored
    dependent velocities are not used by the dynamics; `Solution.v` reports [5].
    `Solution.multipliers` are the reactions the motion implies,
    `λ = (∂F/∂q_dep)⁻ᵀ (Q − M q̈)_dep`.

    Where the terms carry `M`'s sparsity pattern (`ConstrainedTerms.mass_operator`), the
    products with `M` follow it. `∂F/∂q_dep` is factorized densely (LU): `B` is dense in
    general whatever its pattern (on a chain of links in Cartesian coordinates with one
    dependent coordinate per link, `∂F/∂q_dep` is bidiagonal and its inverse a full
    triangle), and so is `Nᵀ M N`.

    Use it when a mechanism is naturally described with more coordinates than degrees of
    freedom (closed chains such as the four-bar lever of the Ball & Beam) and the choice
    of dependent coordinates is regular along the motion.

    **Arguments:**

    - `dependent`: indices of the `m` dependent coordinates (a tuple of ints, static).
    - `rcond`: the solve stops with `RESULTS.singular_dependent_jacobian` when
        `σ_min(∂F/∂q_dep) / σ_max(∂F/∂q)` falls below it. Default `sqrt(eps)`.
    - `tol`: accepted `max |Φ(q0)|` at the initial state (Shulgin's equations keep `Φ` at
        its initial value); default `1e-6`.

    **Raises:**

    `ValueError` when `dependent` does not name one distinct coordinate per geometric
    constraint, when the system has nonholonomic constraints, or (at the initial state)
    when `∂F/∂q_dep` is singular or `q0` violates the constraints.
    """

    dependent: tuple[int, ...] = eqx.field(static=True)
    rcond: float | None = eqx.field(default=None, static=True)
    tol: float = eqx.field(default=1e-6, static=True)

    def __check_init__(self):
        dep = self.dependent
        if not isinstance(dep, tuple) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in dep
        ):
            raise ValueError(
                "`dependent` must be a tuple of coordinate indices, e.g. "
                f"`RedundantCoordinates(dependent=(2,))`; got {dep!r}."
            )
        if len(set(dep)) != len(dep):
            raise ValueError(f"`dependent` contains repeated indices: {dep}.")
        tol = self.tol
        if (
            isinstance(tol, bool)
            or not isinstance(tol, (int, float, np.floating, np.integer))
            or not (np.isfinite(tol) and tol > 0)
        ):
            raise ValueError(
                "The `tol` of RedundantCoordinates, the accepted max |Φ(q0)| at the initial "
                f"state, must be a positive finite number; got {tol!r}. Pass e.g. `tol=1e-6` "
                "(the default)."
            )

    # -- index bookkeeping ---------------------------------------------------------------

    def independent(self, n: int) -> tuple[int, ...]:
        """Indices of the independent coordinates among `n`."""
        dep = self._checked(n)
        return tuple(i for i in range(n) if i not in dep)

    def _checked(self, n: int) -> tuple[int, ...]:
        dep = tuple(int(i) % n if -n <= i < n else int(i) for i in self.dependent)
        bad = [i for i in dep if not 0 <= i < n]
        if bad:
            raise ValueError(f"`dependent` indices {bad} are out of range for {n} coordinates.")
        if len(set(dep)) != len(dep):
            raise ValueError(f"`dependent` names the same coordinate twice: {self.dependent}.")
        return dep

    def _split(self, jacobian):
        n = jacobian.shape[1]
        dep = self._checked(n)
        return split_jacobian(jacobian, dep, self.independent(n)), dep

    # -- AbstractFormulation ------------------------------------------------------------

    def validate(self, num_holonomic, num_nonholonomic):
        if num_nonholonomic:
            raise ValueError(
                "`RedundantCoordinates` handles geometric constraints only "
                f"(Krasinskaya and Krasinskiy (2013)); the system has {num_nonholonomic} "
                "nonholonomic constraints. Use a Lagrange-multiplier formulation such as "
                "`jaxdae.Baumgarte`."
            )
        if len(self.dependent) != num_holonomic:
            raise ValueError(
                f"`dependent` must name one coordinate per geometric constraint: the system "
                f"has {num_holonomic} constraints but `dependent` = {self.dependent}."
            )
        return self

    def dependent_velocities(self, jacobian, phi_t, v):
        """`q̇` with the dependent entries replaced by eq. [5] (for any independent `v`)."""
        (jd, ji), dep = self._split(jacobian)
        ind = self.independent(v.shape[0])
        rhs = ji @ v[jnp.asarray(ind, dtype=int)] + phi_t
        v_dep = -lu_solver(jd)(rhs)
        return v.at[jnp.asarray(dep, dtype=int)].set(v_dep)

    def velocities(self, system, t, q, v):
        jac, phi_t = _constraint_rates(system, t, q, v)
        if jac.shape[0] != len(self.dependent):
            raise ValueError(
                f"`dependent` must name one coordinate per geometric constraint: the system "
                f"has {jac.shape[0]} constraints but `dependent` = {self.dependent}."
            )
        return self.dependent_velocities(jac, phi_t, v)

    def basis(self, jacobian) -> Float[Array, "n r"]:
        """`N` with `N[ind] = I`, `N[dep] = B` (so `J N = 0`): eq. [5] as a matrix."""
        (jd, ji), dep = self._split(jacobian)
        n = jacobian.shape[1]
        ind = self.independent(n)
        b = -lu_solver(jd)(ji)
        basis = jnp.zeros((n, len(ind)), jacobian.dtype)
        basis = basis.at[jnp.asarray(ind, dtype=int)].set(jnp.eye(len(ind), dtype=jacobian.dtype))
        return basis.at[jnp.asarray(dep, dtype=int)].set(b)

    def accelerations(self, terms: ConstrainedTerms):
        g = terms.jacobian
        (jd, _), dep = self._split(g)
        dep_idx = jnp.asarray(dep, dtype=int)
        n = g.shape[1]
        basis = self.basis(g)
        # Particular solution of J q̈₀ = γ with q̈₀[ind] = 0.
        acc0 = jnp.zeros((n,), g.dtype).at[dep_idx].set(lu_solver(jd)(terms.bias))
        mass = _mass_product(terms)
        reduced = basis.T @ mass(basis)
        reduced = 0.5 * (reduced + reduced.T)
        rhs = basis.T @ (terms.forces - mass(acc0))
        acc_ind = spd_solve(reduced, rhs)
        acc = basis @ acc_ind + acc0
        # Implied reactions: M q̈ = Q − Jᵀλ, read on the dependent rows.
        residual = (terms.forces - mass(acc))[dep_idx]
        lam = lu_solver(jd.T)(residual)
        return acc, lam

    def failure(self, terms, reference):
        """`sign(det ∂F/∂q_dep) · (ratio − rcond)`: a real-valued event function.

        diffrax stops the solve when it changes sign between two steps: when the ratio
        falls below `rcond` at a step end, and also when the motion steps across a
        singular configuration (the determinant changes sign) between step ends.
        """
        (jd, _), _ = self._split(terms.jacobian)
        if jd.shape[0] == 0:
            return jnp.ones((), jd.dtype)
        ratio = singular_ratio(jd, terms.jacobian)
        sign = jnp.where(small_det(jd) < 0, -1.0, 1.0).astype(jd.dtype)
        return sign * (ratio - default_rcond(self.rcond, jd.dtype))

    @property
    def can_fail(self):
        return True

    def fails_with(self, num_holonomic, num_nonholonomic):
        """Only with dependent coordinates (one per geometric constraint): without,
        `failure` is a constant."""
        return num_holonomic > 0

    @property
    def failure_result(self):
        return RESULTS.singular_dependent_jacobian

    @property
    def state_messages(self):
        return (
            (
                "∂F/∂q_dep is singular at q0 (condition [4] of Krasinskaya and Krasinskiy (2013) "
                f"fails): the dependent coordinates {self.dependent} cannot be solved for there. "
                "Choose other dependent coordinates or another initial configuration.",
                "σ_min/σ_max",
            ),
            (
                "q0 violates the geometric constraints (Shulgin's equations keep Φ at its "
                "initial value); start on the constraint manifold, e.g. with "
                "`jaxdae.consistent_initial_state`.",
                "max |Φ(q0)|",
            ),
        )

    def state_problems(self, system, t0, q0, v0):
        check_instance(
            "system",
            system,
            LagrangianSystem,
            "a `LagrangianSystem` for `RedundantCoordinates` (its state holds "
            "velocities, from which the dependent ones follow)",
        )
        jac, _ = _constraint_rates(system, t0, q0, v0)
        (jd, _), _ = self._split(jac)
        phi = (
            system.constraints(t0, q0)
            if system.terms_from_constraints
            else (system.terms(t0, q0, v0).phi)
        )
        ratio = singular_ratio(jd, jac)
        violation = jnp.max(jnp.abs(phi), initial=0.0)
        flags = jnp.stack(
            [~(ratio >= default_rcond(self.rcond, jd.dtype)), ~(violation <= self.tol)]
        )
        return flags, jnp.stack([ratio, violation]).astype(q0.dtype)
