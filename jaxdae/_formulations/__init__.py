from ._base import (
    AbstractBaumgarteFormulation as AbstractBaumgarteFormulation,
    AbstractExactMultipliers as AbstractExactMultipliers,
    AbstractFormulation as AbstractFormulation,
    AbstractIndependentVelocities as AbstractIndependentVelocities,
    AbstractStabilizedFormulation as AbstractStabilizedFormulation,
    baumgarte_target as baumgarte_target,
)
from ._baumgarte import Baumgarte as Baumgarte, Unstabilized as Unstabilized
from ._coupled import CoupledPerturbation as CoupledPerturbation
from ._modified_lagrange import ModifiedLagrange as ModifiedLagrange
from ._multipliers import (
    constraint_matrix as constraint_matrix,
    multiplier_solve as multiplier_solve,
)
from ._pseudo_inverse import PseudoInverse as PseudoInverse
from ._redundant import RedundantCoordinates as RedundantCoordinates
