"""Moore–Penrose multipliers for redundant constraints (Mukharlyamov and Deressa (2015),
eqs. [6]–[8])."""

from typing import ClassVar

from .._compilation._linear_solvers import PositiveSemidefinitePseudoInverse
from .._custom_types import Gain, GainLike
from ._arguments import explain_arguments
from ._base import AbstractBaumgarteFormulation, check_rcond, stabilization_gains
from ._baumgarte import LYAPUNOV_CONDITION
from ._multipliers import multiplier_solve


class PseudoInverse(AbstractBaumgarteFormulation):
    """Generalized Baumgarte stabilization with `A⁺`, for redundant or rank-deficient constraints.

    Mukharlyamov and Deressa (2015), eq. [6]: `λ = A⁺ (J M⁻¹ Q − s)` with `A = J M⁻¹ Jᵀ` and
    `A⁺` its Moore–Penrose inverse (the ideal-constraint choice `(I − A⁺A)u = 0` of
    Proposition 1). With independent constraints this is [`jaxdae.Baumgarte`][]; with
    redundant ones (a closure equation written twice, an over-constrained four-bar) it still
    gives the unique ideal reaction `−Jᵀλ`.

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
    gain_names: ClassVar[tuple[str, ...]] = ("kd", "kp", "kv")
    gain_condition: ClassVar[str] = LYAPUNOV_CONDITION

    @explain_arguments("PseudoInverse(kd=10.0, kp=25.0)")
    def __init__(self, kd: GainLike, kp: GainLike, kv: GainLike | None = None,
                 rcond: float | None = None):
        self.kd, self.kp, self.kv = stabilization_gains(kd, kp, kv)
        self.rcond = rcond

    def __check_init__(self):
        check_rcond(self.rcond)

    def accelerations(self, terms):
        return multiplier_solve(terms, self.target(terms),
                                PositiveSemidefinitePseudoInverse(self.rcond))
