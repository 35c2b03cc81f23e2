"""jaxdae: differentiable simulation of constrained mechanical systems in JAX.

Importing jaxdae enables 64-bit floats in JAX (`jax_enable_x64`), since accuracy matters for
constrained dynamics; arrays created as float32 stay float32 (e.g. for GPU batches). Set the
environment variable `JAXDAE_ENABLE_X64=0` before importing to leave JAX's setting alone.
"""

import os as _os

import jax as _jax

if _os.environ.get("JAXDAE_ENABLE_X64", "1") != "0":
    _jax.config.update("jax_enable_x64", True)

from . import examples as examples
from ._consistent import consistent_initial_state as consistent_initial_state
from ._formulation import (
    AbstractFormulation as AbstractFormulation,
    Baumgarte as Baumgarte,
    CoupledPerturbation as CoupledPerturbation,
    ModifiedLagrange as ModifiedLagrange,
    PseudoInverse as PseudoInverse,
    Unstabilized as Unstabilized,
)
from ._hamiltonian import HamiltonianForm as HamiltonianForm, HamiltonianSystem as HamiltonianSystem
from ._realizing import (
    AbstractRealizingForce as AbstractRealizingForce,
    BoundedForce as BoundedForce,
    CustomForce as CustomForce,
    RealizedConstraints as RealizedConstraints,
    ViscousForce as ViscousForce,
    reaction_bound as reaction_bound,
)
from ._simulate import simulate as simulate
from ._solution import RESULTS as RESULTS, SimulationError as SimulationError, Solution as Solution
from ._system import (
    AbstractSystem as AbstractSystem,
    ConstrainedTerms as ConstrainedTerms,
    LagrangianSystem as LagrangianSystem,
)

__version__ = "0.1.0"
