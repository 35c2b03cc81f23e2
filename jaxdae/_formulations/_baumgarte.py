"""Exact Lagrange multipliers with generalized Baumgarte stabilization (Mukharlyamov and
Deressa (2015))."""

from typing import ClassVar

import jax.numpy as jnp

from .._compilation._linear_solvers import StructuredCholesky
from .._custom_types import Gain, GainLike
from ._arguments import explain_arguments
from ._base import (
    AbstractBaumgarteFormulation,
    AbstractExactMultipliers,
    AbstractFormulation,
    check_rcond,
    stabilization_gains,
)
from ._multipliers import multiplier_solve

LYAPUNOV_CONDITION = (
    "Mukharlyamov and Deressa (2015), eq. [18]: a global Lyapunov function exists iff there "
    "is ε > 0 with K_D − εI ≻ 0 and K_P + εK_D − ε²I ≻ 0, which for symmetric gains means "
    "K_D ≻ 0 and K_P ≻ 0; use `Unstabilized()` for no stabilization"
)


class Unstabilized(AbstractExactMultipliers):
    """Index reduction only: `Φ̈ = 0`, `Ψ̇ = 0`, exact Lagrange multipliers.

    The constraint violations drift (linearly or quadratically in time); useful as a
    baseline for the stabilized formulations (Mukharlyamov and Deressa (2015), eq. [6] with
    `γ_s = γ`).

    **Arguments:**

    - `rcond`: the simulation stops with `RESULTS.singular_constraint_matrix` when the
        smallest pivot of `J M⁻¹ Jᵀ` (its eigenvalues for one or two constraints, the
        Cholesky factorization's pivots for more) falls below `rcond` times its largest (now
        or at the initial state, whichever is larger). Default `sqrt(eps)`.
    """

    rcond: float | None = None

    def __check_init__(self):
        check_rcond(self.rcond)

    def accelerations(self, terms):
        return multiplier_solve(terms, terms.bias, StructuredCholesky())

    def residual_allowance(self, terms):
        # Nothing pulls the drift back: the residual grows with time (no bound to test).
        return jnp.full((), jnp.inf, terms.forces.dtype)

    def validate(self, num_holonomic, num_nonholonomic):
        return self


class AbstractMultiplierBaumgarte(AbstractFormulation):
    """The fields and constructor of a generalized Baumgarte formulation whose multipliers
    solve `(J M⁻¹ Jᵀ) λ = J M⁻¹ Q − s` (Mukharlyamov and Deressa (2015), eqs. [6], [21]):
    the gains `kd`, `kp`, `kv` under the Lyapunov condition of eq. [18] and the `rcond` of
    that solve. [`jaxdae.Baumgarte`][] and [`jaxdae.PseudoInverse`][] differ only in how they
    solve for `λ` (`accelerations`).

    A final class lists this base first (equinox gives a class the `__init__` of its first
    base) and `AbstractBaumgarteFormulation` last, after `AbstractExactMultipliers`, whose
    `tests_target_range` must take precedence."""

    kd: Gain
    kp: Gain
    kv: Gain
    rcond: float | None = None
    gain_names: ClassVar[tuple[str, ...]] = ("kd", "kp", "kv")
    gain_condition: ClassVar[str] = LYAPUNOV_CONDITION

    @explain_arguments("kd=10.0, kp=25.0")
    def __init__(
        self, kd: GainLike, kp: GainLike, kv: GainLike | None = None, rcond: float | None = None
    ):
        self.kd, self.kp, self.kv = stabilization_gains(kd, kp, kv)
        self.rcond = rcond

    def __check_init__(self):
        check_rcond(self.rcond)


class Baumgarte(
    AbstractMultiplierBaumgarte, AbstractExactMultipliers, AbstractBaumgarteFormulation
):
    """Generalized Baumgarte stabilization (Mukharlyamov and Deressa (2015), eqs.
    [16]–[21]; Mukharlyamov (2019), eq. [0.7]).

    Replaces `Φ̈ = 0` by `Φ̈ + K_D Φ̇ + K_P Φ = 0` and `Ψ̇ = 0` by `Ψ̇ + K_V Ψ = 0` and solves
    for the exact multipliers `λ = (J M⁻¹ Jᵀ)⁻¹ (J M⁻¹ Q − s)` (eq. [21]). Constraint
    perturbations then obey that linear ODE exactly and decay for positive definite gains.

    Fails where `J M⁻¹ Jᵀ` is singular (redundant constraints, singular configurations):
    the solve stops there with `RESULTS.singular_constraint_matrix`. Use
    [`jaxdae.PseudoInverse`][] or [`jaxdae.ModifiedLagrange`][] there.

    **Arguments:**

    - `kd`, `kp`: `K_D`, `K_P` — a scalar, one value per holonomic constraint (diagonal),
        or a full symmetric positive definite matrix. Remark 3 of Mukharlyamov and Deressa
        (2015): critically damped `kd = 2k`, `kp = k²`.
    - `kv`: `K_V` for nonholonomic constraints (same forms). Default: `mean(diag K_D) / 2`,
        the rate `k` of a critically damped `K_D`.
    - `rcond`: `J M⁻¹ Jᵀ` is treated as singular when its smallest pivot (its eigenvalues
        for one or two constraints, the pivots of its Cholesky factorization for more; see
        [`jaxdae.AbstractExactMultipliers`][]) falls below `rcond` times its largest (now or
        at the initial state, whichever is larger), so a single constraint whose gradient
        vanishes is caught too. Default `sqrt(eps)` of the state's dtype.

    **Raises:**

    `ValueError` if a gain is not a scalar/vector/square matrix or violates the
    Lyapunov condition of Mukharlyamov and Deressa (2015) (not symmetric positive definite).
    """

    def accelerations(self, terms):
        return multiplier_solve(terms, self.target(terms), StructuredCholesky())
