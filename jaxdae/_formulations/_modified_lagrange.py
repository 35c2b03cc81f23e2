"""The modified Lagrange equation, a generalized penalty method (paper 004, eqs. [22]–[31])."""

from .._custom_types import Gain, GainLike
from .._gains import as_gain
from .._compilation._linalg import small_matmul
from .._compilation._linear_solvers import PositiveDefinite, symmetric_solve
from .._compilation._sparse import SparseMatrix
from ._arguments import explain_arguments
from ._base import (
    AbstractFormulation,
    baumgarte_target,
    jacobian_matvec,
    penalized_mass,
)
from ._baumgarte import (
    check_gain_values,
    check_stabilization_gains,
    stabilization_checks,
    stabilization_gains,
)

_PENALTY = (
    "paper 004, eqs. [22]–[30]: the constraint masses 𝔄 and the gains K_D, K_P, K_V must be "
    "positive definite so that the violations y = Φ behave as a damped stable oscillator"
)


class ModifiedLagrange(AbstractFormulation):
    """Modified Lagrange equation: `(M + Jᵀ𝔄J) q̈ = Q − Jᵀ𝔄 (K_D Φ̇ + K_P Φ − γ)` (paper 004, eq. [30]).

    The violations are treated as extra coordinates with "constraint masses" `𝔄`, damping
    `K_D` and stiffness `K_P`; the multipliers are `λ = 𝔄 (Φ̈ + K_D Φ̇ + K_P Φ)` (eq. [31]).
    `M + Jᵀ𝔄J` is positive definite even for redundant constraints and at singular
    configurations, so the simulation runs through them where [`jaxdae.Baumgarte`][] stops.
    Nonholonomic rows enter the same way with `Ψ̇ + K_V Ψ`. With scalar gains this is
    Bayo's classical penalty method.

    The violation does not vanish: the penalty forces need one to act on. It falls like
    `1/α` away from singular configurations (more slowly near them) at an unchanged step
    count, while the condition number of `M + Jᵀ𝔄J` grows like `α`; keep it well below
    `1/eps` of the dtype, float32 especially. Paper 004 (Remark 4) leaves the choice open;
    the guide "Choosing a formulation and its gains" (docs/guides/choosing_a_formulation.md)
    measures the trade-off (`experiments/modified_lagrange_alpha.py`).

    **Arguments:**

    - `alpha`: `𝔄`, scalar, one value per constraint (holonomic then nonholonomic), or an
        SPD matrix. The paper uses `𝔄 = αI`.
    - `kd`, `kp`, `kv`: as for [`jaxdae.Baumgarte`][].
    """

    alpha: Gain
    kd: Gain
    kp: Gain
    kv: Gain

    @explain_arguments("ModifiedLagrange(alpha=100.0, kd=10.0, kp=25.0)")
    def __init__(self, alpha: GainLike, kd: GainLike, kp: GainLike,
                 kv: GainLike | None = None):
        self.alpha = as_gain(alpha)
        self.kd, self.kp, self.kv = stabilization_gains(kd, kp, kv)

    def __check_init__(self):
        check_gain_values(self, ("alpha", "kd", "kp", "kv"), _PENALTY)

    def check_values(self):
        check_gain_values(self, ("alpha", "kd", "kp", "kv"), _PENALTY)

    def accelerations(self, terms):
        target = baumgarte_target(terms, self.kd, self.kp, self.kv)
        lhs, masses_g = penalized_mass(terms, lambda g: _apply_masses(self.alpha, g))
        rhs = terms.forces + masses_g.rmatvec(target)
        acc = symmetric_solve(lhs, rhs, PositiveDefinite())
        return acc, _apply_masses(self.alpha, jacobian_matvec(terms, acc) - target)

    def validate(self, num_holonomic, num_nonholonomic):
        return check_stabilization_gains(
            self, ("alpha", "kd", "kp", "kv"), num_holonomic, num_nonholonomic, _PENALTY
        )

    def traced_checks(self, num_holonomic, num_nonholonomic):
        return stabilization_checks(self, ("alpha", "kd", "kp", "kv"), _PENALTY)


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
