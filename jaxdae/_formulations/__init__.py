from ._base import AbstractFormulation as AbstractFormulation
from ._baumgarte import Baumgarte as Baumgarte, Unstabilized as Unstabilized
from ._modified_lagrange import ModifiedLagrange as ModifiedLagrange
from ._pseudo_inverse import PseudoInverse as PseudoInverse
from ._coupled import CoupledPerturbation as CoupledPerturbation
from ._redundant import RedundantCoordinates as RedundantCoordinates
