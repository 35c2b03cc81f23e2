"""The modified Lagrange equation, a generalized penalty method (Mukharlyamov and Deressa
(2015), eqs. [22]–[31])."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .. import _thresholds
from .._compilation._linalg import small_matmul
from .._compilation._linear_solvers import StructuredCholesky
from .._compilation._sparse import SparseMatrix
from .._custom_types import Array, Gain, GainLike
from .._gains import as_gain, gain_matrix
from ._arguments import explain_arguments
from ._base import AbstractBaumgarteFormulation, AbstractFormulation, stabilization_gains
from ._multipliers import jacobian_matvec, penalized_mass

PENALTY_CONDITION = (
    "Mukharlyamov and Deressa (2015), eqs. [22]–[30]: the constraint masses 𝔄 and the gains "
    "K_D, K_P, K_V must be positive definite so that the violations y = Φ behave as a damped "
    "stable oscillator"
)


class ModifiedLagrange(AbstractBaumgarteFormulation):
    """Modified Lagrange equation: `(M + Jᵀ𝔄J) q̈ = Q − Jᵀ𝔄 (K_D Φ̇ + K_P Φ − γ)`
    (Mukharlyamov and Deressa (2015), eq. [30]).

    The violations are treated as extra coordinates with "constraint masses" `𝔄`, damping
    `K_D` and stiffness `K_P`; the multipliers are `λ = 𝔄 (Φ̈ + K_D Φ̇ + K_P Φ)` (eq. [31]).
    `M + Jᵀ𝔄J` is positive definite even for redundant constraints and at singular
    configurations, so the simulation runs through them where [`jaxdae.Baumgarte`][] stops.
    Nonholonomic rows enter the same way with `Ψ̇ + K_V Ψ`. With scalar gains this is
    Bayo's classical penalty method.

    The violation does not vanish: the penalty forces need one to act on. It falls like
    `1/α` away from singular configurations (more slowly near them) at an unchanged step
    count, while the condition number of `M + Jᵀ𝔄J` grows like `α`; keep it well below
    `1/eps` of the dtype, float32 especially. Mukharlyamov and Deressa (2015) (Remark 4) leaves the
    choice open; the guide "Choosing a formulation and its gains"
    (docs/guides/choosing_a_formulation.md) measures the trade-off
    (`experiments/studies/modified_lagrange_alpha.py`).

    Wrapped in [`jaxdae.Projected`][], the solve integrates this equation with its
    multipliers refined by two augmented Lagrangian iterations (`for_projection`,
    `λ ← λ + 𝔄 (G q̈ − s)` with the same factorization of `M + Jᵀ𝔄J`), which bring its
    flow to the manifold's where `J M⁻¹ Jᵀ` is well conditioned: the projection holds the
    manifold, and the penalty's equilibrium off it would only cost steps and accuracy.

    **Arguments:**

    - `alpha`: `𝔄`, scalar, one value per constraint (holonomic then nonholonomic), or an
        SPD matrix. The paper uses `𝔄 = αI`.
    - `kd`, `kp`, `kv`: as for [`jaxdae.Baumgarte`][].
    """

    alpha: Gain
    kd: Gain
    kp: Gain
    kv: Gain
    gain_names: ClassVar[tuple[str, ...]] = ("alpha", "kd", "kp", "kv")
    gain_condition: ClassVar[str] = PENALTY_CONDITION
    exact_perturbations: ClassVar[bool] = False

    @explain_arguments("ModifiedLagrange(alpha=100.0, kd=10.0, kp=25.0)")
    def __init__(self, alpha: GainLike, kd: GainLike, kp: GainLike, kv: GainLike | None = None):
        self.alpha = as_gain(alpha)
        self.kd, self.kp, self.kv = stabilization_gains(kd, kp, kv)

    def accelerations(self, terms):
        return _accelerations(self, terms, 0)

    def residual_allowance(self, terms):
        """The penalty's equilibrium violation, `Φ = K_P⁻¹ 𝔄⁻¹ λ` and `Ψ = K_V⁻¹ 𝔄⁻¹ λ`
        (eq. [31] at rest), for constraint forces `λ` of the size of the applied forces
        `|Q|`: the penalty's own multipliers measure the violation by itself, and the ideal
        ones grow without bound near a singular configuration, where the penalty's
        violation is no longer small."""
        forces = jnp.max(jnp.abs(terms.forces), initial=0.0)
        stiffness = _smallest(self.alpha) * jnp.minimum(_smallest(self.kp), _smallest(self.kv))
        return forces / stiffness.astype(forces.dtype)

    def for_projection(self):
        """This formulation with its multipliers refined by two augmented Lagrangian
        iterations (above), which [`jaxdae.Projected`][] integrates."""
        return _AugmentedLagrange(self, _thresholds.PROJECTED_ITERATIONS)

    def perturbation_matrix(self, num_holonomic, num_nonholonomic=0, constraint_matrix=None):
        """The perturbations obey (from eq. [30] by the Woodbury identity)
        `(Φ̈, Ψ̇) = −S (K_D Φ̇ + K_P Φ, K_V Ψ) + forcing`, `S = (I + W𝔄)⁻¹ W𝔄`,
        `W = G M⁻¹ Gᵀ`: with `constraint_matrix=W` (at a state of interest) this is that
        matrix, else the `𝔄 → ∞` limit `S = I`, Baumgarte's."""
        limit = super().perturbation_matrix(num_holonomic, num_nonholonomic)
        if constraint_matrix is None:
            return limit
        m, c = num_holonomic, num_holonomic + num_nonholonomic
        dtype = limit.dtype
        w = jnp.asarray(constraint_matrix, dtype)
        wa = w @ gain_matrix(jnp.asarray(self.alpha), c, dtype)
        scale = jnp.linalg.solve(jnp.eye(c, dtype=dtype) + wa, wa)
        # Rows of `Φ̈` and `Ψ̇`: the feedback of Baumgarte's rows, scaled by `S`.
        feedback = limit[m:]
        return limit.at[m:].set(scale @ feedback)


def _accelerations(
    formulation: ModifiedLagrange, terms, iterations: int, batched: bool | None = None
):
    """`(q̈, λ)` of the modified Lagrange equation, refined by `iterations` augmented
    Lagrangian iterations (`_AugmentedLagrange`) with the same factorization of
    `M + Jᵀ𝔄J`.

    An iteration's solve `(M + Jᵀ𝔄J)⁻¹ Gᵀ𝔄 r` is the product of `r` with the matrix
    `(M + Jᵀ𝔄J)⁻¹ Gᵀ𝔄`, one column per row of `G`. `batched` (default: where `G` has at
    most `iterations` rows) solves for that matrix beside `q̈`, in the same substitutions,
    so that the iterations are products with `G` and with it: no more columns than the
    iterations' solves would take, and none of them waits for another
    (docs/design_measurements.md#augmented-lagrangian). Otherwise each iteration solves
    with the factorization in turn."""
    alpha = formulation.alpha
    target = formulation.target(terms)
    lhs, masses_g = penalized_mass(terms, lambda g: _apply_masses(alpha, g))
    rhs = terms.forces + masses_g.rmatvec(target)
    if rhs.shape[0] == 0:
        return rhs, _apply_masses(alpha, -target)
    solver = StructuredCholesky()
    factor = solver.init(lhs, {})
    if batched is None:
        batched = 0 < target.shape[0] <= iterations
    if not (batched and iterations > 0):
        acc = solver.compute(factor, rhs, {})[0]
        residual = jacobian_matvec(terms, acc) - target
        multipliers = _apply_masses(alpha, residual)
        for _ in range(iterations):  # λ ← λ + 𝔄 (G q̈ − s)
            acc = acc - solver.compute(factor, masses_g.rmatvec(residual), {})[0]
            residual = jacobian_matvec(terms, acc) - target
            multipliers = multipliers + _apply_masses(alpha, residual)
        return acc, multipliers
    masses_gt = (masses_g.dense() if isinstance(masses_g, SparseMatrix) else masses_g.matrix).T
    columns = solver.compute(factor, jnp.concatenate([rhs[:, None], masses_gt], 1), {})[0]
    acc, gain = columns[:, 0], columns[:, 1:]  # `gain = (M + Jᵀ𝔄J)⁻¹ Gᵀ𝔄`
    # The residuals `r_k = G q̈_k − s` follow `r_{k+1} = (I − C) r_k`, `C = G gain`, so
    # `q̈_k = q̈_0 − gain P_k r_0` and `λ = 𝔄 P_{k+1} r_0`, `P_k = Σ_{j<k} (I − C)ʲ`
    # (Horner: `P_{k+1} = I + (I − C) P_k`), a product with `r_0` at the end.
    eye = jnp.eye(target.shape[0], dtype=rhs.dtype)
    step = eye - small_matmul(terms.jacobian, gain)
    polynomial = eye
    for _ in range(iterations - 1):
        polynomial = eye + small_matmul(step, polynomial)
    residual = jacobian_matvec(terms, acc) - target
    acc = acc - small_matmul(gain, small_matmul(polynomial, residual))
    multipliers = _apply_masses(
        alpha, residual + small_matmul(step, small_matmul(polynomial, residual))
    )
    return acc, multipliers


class _AugmentedLagrange(AbstractFormulation):
    """A [`jaxdae.ModifiedLagrange`][] formulation whose multipliers are refined by
    augmented Lagrangian iterations (Bayo & Ledesma, "Augmented Lagrangian and
    mass-orthogonal projection methods for constrained multibody dynamics", *Nonlinear
    Dynamics* 9, 1996): `λ ← λ + 𝔄 (G q̈ − s)`, `(M + Jᵀ𝔄J) q̈ = Q + Jᵀ𝔄 s − Jᵀλ`, `s` the
    target of [`jaxdae.Baumgarte`][] (`Φ̈ + K_D Φ̇ + K_P Φ = 0`), with one factorization.

    What [`jaxdae.Projected`][] integrates between its projections. On the manifold the
    penalty's `q̈` differs from the constrained one by `(M + Jᵀ𝔄J)⁻¹Jᵀλ`, in
    `range(M⁻¹Jᵀ)`: a change of the velocities that the projection removes, while the
    dynamics pull the state towards the penalty's equilibrium off the manifold
    (`Φ = O(1/α)`) within each step, which the step's error estimate sees. Each iteration
    multiplies `G q̈ − s` by `(I + 𝔄 G M⁻¹ Gᵀ)⁻¹`: by about `1/(α σ)` along an eigenvalue
    `σ` of `G M⁻¹ Gᵀ` well above `1/α`, by about 1 along one near zero (a singular
    configuration, a redundant constraint), where `M + Jᵀ𝔄J` and the multipliers stay
    bounded as without them. One iteration costs two products with `G` and two triangular
    solves, or, for as many constraints as iterations or fewer, one column more in the
    solve for `q̈` (`_accelerations`)."""

    formulation: ModifiedLagrange
    iterations: int = eqx.field(static=True)

    def accelerations(self, terms):
        return _accelerations(self.formulation, terms, self.iterations)

    def validate(self, num_holonomic, num_nonholonomic):
        self.formulation.validate(num_holonomic, num_nonholonomic)
        return self

    def traced_checks(self, num_holonomic, num_nonholonomic):
        return self.formulation.traced_checks(num_holonomic, num_nonholonomic)


def _smallest(gain: Gain) -> Array:
    """The smallest eigenvalue of a scalar, per-row or matrix gain."""
    if gain.ndim == 2:
        return jnp.linalg.eigvalsh(0.5 * (gain + gain.T))[0]
    return jnp.min(gain, initial=jnp.inf)


def _apply_masses(alpha: Gain, x):
    """`𝔄 x` for `x` of shape `(c,)` or `(c, n)` (an array or a `SparseMatrix`), without
    forming a scalar or diagonal `𝔄`."""
    if isinstance(x, SparseMatrix):
        if alpha.ndim == 2:
            return SparseMatrix.from_dense(_apply_masses(alpha, x.dense()))
        rows = x.pattern.rows
        scale = alpha.astype(x.values.dtype)
        return SparseMatrix(x.values * (scale[rows] if alpha.ndim == 1 else scale), x.pattern)
    alpha = alpha.astype(x.dtype)
    if alpha.ndim == 2:
        return small_matmul(alpha, x)
    if alpha.ndim == 1 and x.ndim == 2:
        return alpha[:, None] * x
    return alpha * x
