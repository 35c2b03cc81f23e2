from ._base import (
    AbstractBaumgarteFormulation as AbstractBaumgarteFormulation,
)
from ._base import (
    AbstractExactMultipliers as AbstractExactMultipliers,
)
from ._base import (
    AbstractFormulation as AbstractFormulation,
)
from ._base import (
    AbstractStabilizedFormulation as AbstractStabilizedFormulation,
)
from ._base import (
    baumgarte_target as baumgarte_target,
)
from ._baumgarte import Baumgarte as Baumgarte
from ._baumgarte import Unstabilized as Unstabilized
from ._coupled import CoupledPerturbation as CoupledPerturbation
from ._modified_lagrange import ModifiedLagrange as ModifiedLagrange
from ._multipliers import constraint_matrix as constraint_matrix
from ._multipliers import multiplier_solve as multiplier_solve
from ._pseudo_inverse import PseudoInverse as PseudoInverse
from ._redundant import RedundantCoordinates as RedundantCoordinates
