"""jaxdae: differentiable simulation of constrained mechanical systems in JAX.

Importing jaxdae changes three of JAX's settings, for the whole process
(`jaxdae/_compilation/_xla_flags.py`):

- it enables 64-bit floats (`jax_enable_x64`), since accuracy matters for constrained
  dynamics; arrays created as float32 stay float32 (e.g. for GPU batches). The environment
  variable `JAXDAE_ENABLE_X64=0`, or JAX's own `JAX_ENABLE_X64`, leaves JAX's setting alone.
- it lets XLA compile whole while loops into single CPU kernels
  (`xla_cpu_small_while_loop_byte_threshold` in `XLA_FLAGS`): solves of small systems run
  several times faster.
- it disables one XLA:CPU pass
  (`--xla_disable_hlo_passes=dot-library-rewriter` in `XLA_FLAGS`), whose library calls
  would split such a loop into separate kernels again.

Import jaxdae before the first JAX computation for the two XLA options to apply;
`JAXDAE_SET_XLA_FLAGS=0`, or naming an option in `XLA_FLAGS` yourself, leaves it alone.
"""

from ._compilation._xla_flags import configure_on_import as _configure_on_import

# Before anything computes: XLA reads its flags when JAX starts its first backend.
_configure_on_import()

from . import examples as examples, multibody as multibody, viz as viz
from ._analysis._actuated import consistent_actuated_state as consistent_actuated_state
from ._analysis._discrete import (
    DiscreteStability as DiscreteStability,
    perturbation_matrix as perturbation_matrix,
    spectral_radius as spectral_radius,
    spectral_radius_bound as spectral_radius_bound,
    transition_matrix as transition_matrix,
)
from ._analysis._linearize import (
    Equilibrium as Equilibrium,
    Linearization as Linearization,
    equilibrium as equilibrium,
    linearize as linearize,
)
from ._analysis._lqr import LQRSolution as LQRSolution, lqr as lqr
from ._formulations import (
    AbstractBaumgarteFormulation as AbstractBaumgarteFormulation,
    AbstractExactMultipliers as AbstractExactMultipliers,
    AbstractFormulation as AbstractFormulation,
    AbstractStabilizedFormulation as AbstractStabilizedFormulation,
    Baumgarte as Baumgarte,
    CoupledPerturbation as CoupledPerturbation,
    ModifiedLagrange as ModifiedLagrange,
    PseudoInverse as PseudoInverse,
    RedundantCoordinates as RedundantCoordinates,
    Unstabilized as Unstabilized,
    baumgarte_target as baumgarte_target,
    constraint_matrix as constraint_matrix,
    multiplier_solve as multiplier_solve,
)
from ._formulations._constraint_enforcing import (
    ConstraintEnforcingControl as ConstraintEnforcingControl,
)
from ._formulations._realizing import (
    AbstractRealizingForce as AbstractRealizingForce,
    BoundedForce as BoundedForce,
    CustomForce as CustomForce,
    RealizedConstraints as RealizedConstraints,
    ViscousForce as ViscousForce,
    reaction_bound as reaction_bound,
)
from ._integration._actuated import (
    ActuatedSolution as ActuatedSolution,
    simulate_actuated as simulate_actuated,
)
from ._integration._adjoint import ReverseSweepAdjoint as ReverseSweepAdjoint
from ._integration._contact_schemes import EventDriven as EventDriven
from ._integration._ensemble import worst_trajectory_rms as worst_trajectory_rms
from ._integration._generalized_alpha import GeneralizedAlpha as GeneralizedAlpha
from ._integration._generalized_alpha_adjoint import (
    GeneralizedAlphaAdjoint as GeneralizedAlphaAdjoint,
)
from ._integration._implicit import (
    FusedChord as FusedChord,
    ToleranceChord as ToleranceChord,
    configure_implicit as configure_implicit,
)
from ._integration._projection import Projected as Projected
from ._integration._replay_adjoint import ReplayAdjoint as ReplayAdjoint
from ._integration._rosenbrock import Rodas5P as Rodas5P
from ._integration._simulate import simulate as simulate, simulate_ensemble as simulate_ensemble
from ._integration._solvers import UnrolledERK as UnrolledERK
from ._integration._time_stepping import TimeStepping as TimeStepping
from ._solution import (
    RESULTS as RESULTS,
    Events as Events,
    SimulationError as SimulationError,
    Solution as Solution,
)
from ._systems._actuated import ActuatedSystem as ActuatedSystem
from ._systems._consistent import consistent_initial_state as consistent_initial_state
from ._systems._control import (
    AbstractControlledSystem as AbstractControlledSystem,
    AbstractController as AbstractController,
    ConstantControl as ConstantControl,
    LinearFeedback as LinearFeedback,
    with_controller as with_controller,
)
from ._systems._hamiltonian import (
    HamiltonianForm as HamiltonianForm,
    HamiltonianSystem as HamiltonianSystem,
)
from ._systems._system import (
    AbstractSystem as AbstractSystem,
    ConstrainedTerms as ConstrainedTerms,
    LagrangianSystem as LagrangianSystem,
)
from ._tuning._batch import batch_map as batch_map, batch_sharding as batch_sharding
from ._tuning._losses import (
    AbstractLoss as AbstractLoss,
    ConstraintViolation as ConstraintViolation,
    ControlEffort as ControlEffort,
    SettlingTime as SettlingTime,
    TrackingError as TrackingError,
)
from ._tuning._options import (
    Batching as Batching,
    Checkpointing as Checkpointing,
    Failures as Failures,
    Reporting as Reporting,
)
from ._tuning._parametrization import (
    AbstractParametrization as AbstractParametrization,
    Positive as Positive,
    PositiveDefinite as PositiveDefinite,
    parametrize as parametrize,
    unwrap as unwrap,
)
from ._tuning._tune import TuneResult as TuneResult, tune as tune

__version__ = "0.1.0"
