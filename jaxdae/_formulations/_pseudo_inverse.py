"""Moore–Penrose multipliers for redundant constraints (paper 004, eqs. [6]–[8])."""

from .._compilation._linear_solvers import PositiveSemidefinitePseudoInverse
from .._custom_types import Gain, GainLike
from ._arguments import explain_arguments
from ._base import AbstractFormulation, baumgarte_target, multiplier_solve
from ._baumgarte import (
    _LYAPUNOV,
    check_gain_values,
    check_rcond,
    check_stabilization_gains,
    stabilization_checks,
    stabilization_gains,
)


class PseudoInverse(AbstractFormulation):
    """Generalized Baumgarte stabilization with `A⁺`, for redundant or rank-deficient constraints.

    Paper 004, eq. [6]: `λ = A⁺ (J M⁻¹ Q − s)` with `A = J M⁻¹ Jᵀ` and `A⁺` its
    Moore–Penrose inverse (the ideal-constraint choice `(I − A⁺A)u = 0` of Proposition 1).
    With independent constraints this is [`jaxdae.Baumgarte`][]; with redundant ones
    (a closure equation written twice, an over-constrained four-bar) it still gives the
    unique ideal reaction `−Jᵀλ`.

    **Arguments:**

    - `kd`, `kp`, `kv`: as for [`jaxdae.Baumgarte`][].
    - `rcond`: singular values of `A` below `rcond · σ_max` are treated as zero.
        Default `sqrt(eps)` of the state's dtype. For more than two constraints `A` is
        first factorized by Cholesky (a banded factorization where its pattern is banded):
        where every pivot exceeds `rcond` times the largest, `A` counts as of full rank and
        is solved through that factorization; elsewhere by its eigendecomposition.
    """

    kd: Gain
    kp: Gain
    kv: Gain
    rcond: float | None = None

    @explain_arguments("PseudoInverse(kd=10.0, kp=25.0)")
    def __init__(self, kd: GainLike, kp: GainLike, kv: GainLike | None = None,
                 rcond: float | None = None):
        self.kd, self.kp, self.kv = stabilization_gains(kd, kp, kv)
        self.rcond = rcond

    def __check_init__(self):
        check_gain_values(self, ("kd", "kp", "kv"), _LYAPUNOV)
        check_rcond(self.rcond)

    def check_values(self):
        check_gain_values(self, ("kd", "kp", "kv"), _LYAPUNOV)

    def accelerations(self, terms):
        target = baumgarte_target(terms, self.kd, self.kp, self.kv)
        return multiplier_solve(terms, target, PositiveSemidefinitePseudoInverse(self.rcond))

    def validate(self, num_holonomic, num_nonholonomic):
        return check_stabilization_gains(
            self, ("kd", "kp", "kv"), num_holonomic, num_nonholonomic, _LYAPUNOV
        )

    def traced_checks(self, num_holonomic, num_nonholonomic):
        return stabilization_checks(self, ("kd", "kp", "kv"), _LYAPUNOV)
