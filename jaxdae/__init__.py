"""jaxdae: differentiable simulation of constrained mechanical systems in JAX.

Importing jaxdae changes two settings of JAX (`jaxdae/_compilation/_xla_flags.py`):

- it enables 64-bit floats (`jax_enable_x64`), since accuracy matters for constrained
  dynamics; arrays created as float32 stay float32 (e.g. for GPU batches). The environment
  variable `JAXDAE_ENABLE_X64=0`, or JAX's own `JAX_ENABLE_X64`, leaves JAX's setting alone.
- it lets XLA compile whole while loops into single CPU kernels (two options in
  `XLA_FLAGS`: the size limit of such loops, and no library fusions, which keep a loop
  from one kernel): solves of small systems run several times faster. Import jaxdae
  before the first JAX computation for them to apply; `JAXDAE_SET_XLA_FLAGS=0` leaves
  `XLA_FLAGS` alone.
"""

from ._compilation._xla_flags import configure_on_import as _configure_on_import

# Before anything computes: XLA reads its flags when JAX starts its first backend.
_configure_on_import()

from . import examples as examples
from . import multibody as multibody
from ._analysis._consistent import consistent_initial_state as consistent_initial_state
from ._analysis._control import (
    AbstractController as AbstractController,
)
from ._analysis._control import (
    ConstantControl as ConstantControl,
)
from ._analysis._control import (
    LinearFeedback as LinearFeedback,
)
from ._analysis._control import (
    with_controller as with_controller,
)
from ._analysis._discrete import (
    DiscreteStability as DiscreteStability,
)
from ._analysis._discrete import (
    perturbation_matrix as perturbation_matrix,
)
from ._analysis._discrete import (
    spectral_radius as spectral_radius,
)
from ._analysis._discrete import (
    spectral_radius_bound as spectral_radius_bound,
)
from ._analysis._discrete import (
    transition_matrix as transition_matrix,
)
from ._analysis._linearize import (
    Equilibrium as Equilibrium,
)
from ._analysis._linearize import (
    Linearization as Linearization,
)
from ._analysis._linearize import (
    equilibrium as equilibrium,
)
from ._analysis._linearize import (
    linearize as linearize,
)
from ._analysis._lqr import LQRSolution as LQRSolution
from ._analysis._lqr import lqr as lqr
from ._formulations import (
    AbstractBaumgarteFormulation as AbstractBaumgarteFormulation,
)
from ._formulations import (
    AbstractExactMultipliers as AbstractExactMultipliers,
)
from ._formulations import (
    AbstractFormulation as AbstractFormulation,
)
from ._formulations import (
    AbstractStabilizedFormulation as AbstractStabilizedFormulation,
)
from ._formulations import (
    Baumgarte as Baumgarte,
)
from ._formulations import (
    CoupledPerturbation as CoupledPerturbation,
)
from ._formulations import (
    ModifiedLagrange as ModifiedLagrange,
)
from ._formulations import (
    PseudoInverse as PseudoInverse,
)
from ._formulations import (
    RedundantCoordinates as RedundantCoordinates,
)
from ._formulations import (
    Unstabilized as Unstabilized,
)
from ._formulations import (
    baumgarte_target as baumgarte_target,
)
from ._formulations import (
    constraint_matrix as constraint_matrix,
)
from ._formulations import (
    multiplier_solve as multiplier_solve,
)
from ._formulations._realizing import (
    AbstractRealizingForce as AbstractRealizingForce,
)
from ._formulations._realizing import (
    BoundedForce as BoundedForce,
)
from ._formulations._realizing import (
    CustomForce as CustomForce,
)
from ._formulations._realizing import (
    RealizedConstraints as RealizedConstraints,
)
from ._formulations._realizing import (
    ViscousForce as ViscousForce,
)
from ._formulations._realizing import (
    reaction_bound as reaction_bound,
)
from ._integration._actuated import (
    ActuatedSolution as ActuatedSolution,
)
from ._integration._actuated import (
    ActuatedSystem as ActuatedSystem,
)
from ._integration._actuated import (
    ConstraintEnforcingControl as ConstraintEnforcingControl,
)
from ._integration._actuated import (
    consistent_actuated_state as consistent_actuated_state,
)
from ._integration._actuated import (
    simulate_actuated as simulate_actuated,
)
from ._integration._adjoint import ReverseSweepAdjoint as ReverseSweepAdjoint
from ._integration._generalized_alpha import GeneralizedAlpha as GeneralizedAlpha
from ._integration._implicit import (
    ToleranceChord as ToleranceChord,
)
from ._integration._implicit import (
    configure_implicit as configure_implicit,
)
from ._integration._projection import Projected as Projected
from ._integration._rosenbrock import Rodas5P as Rodas5P
from ._integration._simulate import (
    simulate as simulate,
)
from ._integration._simulate import (
    simulate_ensemble as simulate_ensemble,
)
from ._integration._simulate import (
    worst_trajectory_rms as worst_trajectory_rms,
)
from ._integration._solvers import UnrolledERK as UnrolledERK
from ._solution import RESULTS as RESULTS
from ._solution import SimulationError as SimulationError
from ._solution import Solution as Solution
from ._systems._hamiltonian import HamiltonianForm as HamiltonianForm
from ._systems._hamiltonian import HamiltonianSystem as HamiltonianSystem
from ._systems._system import (
    AbstractSystem as AbstractSystem,
)
from ._systems._system import (
    ConstrainedTerms as ConstrainedTerms,
)
from ._systems._system import (
    LagrangianSystem as LagrangianSystem,
)
from ._tuning._batch import batch_map as batch_map
from ._tuning._batch import batch_sharding as batch_sharding
from ._tuning._losses import (
    AbstractLoss as AbstractLoss,
)
from ._tuning._losses import (
    ConstraintViolation as ConstraintViolation,
)
from ._tuning._losses import (
    ControlEffort as ControlEffort,
)
from ._tuning._losses import (
    SettlingTime as SettlingTime,
)
from ._tuning._losses import (
    TrackingError as TrackingError,
)
from ._tuning._parametrization import (
    AbstractParametrization as AbstractParametrization,
)
from ._tuning._parametrization import (
    Positive as Positive,
)
from ._tuning._parametrization import (
    PositiveDefinite as PositiveDefinite,
)
from ._tuning._parametrization import (
    parametrize as parametrize,
)
from ._tuning._parametrization import (
    unwrap as unwrap,
)
from ._tuning._tune import TuneResult as TuneResult
from ._tuning._tune import tune as tune

__version__ = "0.1.0"
