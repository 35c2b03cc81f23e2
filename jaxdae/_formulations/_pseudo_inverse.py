"""Moore–Penrose multipliers for redundant constraints (Mukharlyamov and Deressa (2015),
eqs. [6]–[8])."""

from .._compilation._linear_solvers import PositiveSemidefinitePseudoInverse
from ._base import AbstractBaumgarteFormulation
from ._baumgarte import AbstractMultiplierBaumgarte
from ._multipliers import multiplier_solve


class PseudoInverse(AbstractMultiplierBaumgarte, AbstractBaumgarteFormulation):
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

    def accelerations(self, terms):
        return multiplier_solve(
            terms, self.target(terms), PositiveSemidefinitePseudoInverse(self.rcond)
        )
