"""The kit for writing jaxdae parts: what the built-in formulations, force elements,
joints and solvers use, for a user who writes their own (docs/guides/extending.md).

- **Registries**, `functools.singledispatch` functions that a new class registers with,
  as lineax's operator rules are: [`adjoint_for`][jaxdae.extend.adjoint_for] (the default
  adjoint of a solver), [`step_vjp`][jaxdae.extend.step_vjp] and
  [`reuses_outputs`][jaxdae.extend.reuses_outputs] (the derivative of one solver step
  that [`jaxdae.ReplayAdjoint`][] applies),
  [`last_stage_in_state`][jaxdae.extend.last_stage_in_state] (where a first-same-as-last
  solver keeps its last stage, from which a solve reads the formulation's failure test),
  [`tree_motion`][jaxdae.extend.tree_motion]
  (the joints that carry a body in a [`jaxdae.multibody.TreeMechanism`][]),
  [`inertia_minus_forces`][jaxdae.extend.inertia_minus_forces] and
  [`terms_in_array_form`][jaxdae.extend.terms_in_array_form] (what a system of one's own
  offers the solvers beyond its terms).
- **The DAE as a diffrax term**: [`AbstractSystemTerm`][jaxdae.extend.AbstractSystemTerm]
  carries the system, its formulation and the structure of the problem into the solve; a
  solver of one's own reads them from its `terms` ([`system_term`][jaxdae.extend.system_term]).
- **Declared capabilities**:
  [`AbstractIndependentVelocities`][jaxdae.extend.AbstractIndependentVelocities] for a formulation
  whose state holds the independent velocities.
- **Gains**: their conversion and the checks of their structure and values, eager where
  they are concrete and attached to the result under `jit`.
- **Force elements**: the actuator's value of an element with an input channel and a
  norm with a zero derivative at zero.
- **Joints**: the spatial constraint primitives the built-in joints are written with
  (Haug's dot-1 and dot-2 conditions) and the rotations of Euler parameters.
- **Linear algebra**: the Cholesky solver that follows the structure of a symmetric
  positive definite operator, and the banded and multifrontal sparse factorizations behind
  it; the multifrontal sparse LU factorization of saddle-point matrices (the Newton
  matrices of the index-3 equations).
"""

from ._compilation._banded import (
    BandedPlan as BandedPlan,
    banded_plan as banded_plan,
    banded_solve as banded_solve,
)
from ._compilation._linear_solvers import StructuredCholesky as StructuredCholesky
from ._compilation._sparse import Pattern as Pattern, SparseMatrix as SparseMatrix
from ._compilation._supernodal import (
    SupernodalPlan as SupernodalPlan,
    cholesky_plan as cholesky_plan,
    supernodal_plan as supernodal_plan,
    supernodal_solve as supernodal_solve,
)
from ._compilation._supernodal_lu import (
    LUPlan as LUPlan,
    SupernodalLU as SupernodalLU,
    saddle_point_order as saddle_point_order,
    saddle_point_plan as saddle_point_plan,
    supernodal_lu as supernodal_lu,
)
from ._formulations._base import AbstractIndependentVelocities as AbstractIndependentVelocities
from ._gains import (
    apply_gain as apply_gain,
    as_gain as as_gain,
    attach_checks as attach_checks,
    check_gain_size as check_gain_size,
    check_gain_structure as check_gain_structure,
    gain_matrix as gain_matrix,
    is_concrete as is_concrete,
    not_positive_definite as not_positive_definite,
    require_positive_definite as require_positive_definite,
)
from ._integration._adjoint import adjoint_for as adjoint_for
from ._integration._solve import last_stage_in_state as last_stage_in_state
from ._integration._step_adjoints import (
    autodiff_step_vjp as autodiff_step_vjp,
    reuses_outputs as reuses_outputs,
    step_vjp as step_vjp,
)
from ._integration._term import (
    AbstractSystemTerm as AbstractSystemTerm,
    SystemTerm as SystemTerm,
    system_term as system_term,
)
from ._systems._system import (
    inertia_minus_forces as inertia_minus_forces,
    terms_in_array_form as terms_in_array_form,
)
from .multibody._force import actuation as actuation, safe_norm as safe_norm
from .multibody._joint import (
    ScrewMotion as ScrewMotion,
    SphericalMotion as SphericalMotion,
    aligned_axes as aligned_axes,
    along_axis as along_axis,
    axis_basis as axis_basis,
    locked_orientation as locked_orientation,
    on_axis as on_axis,
    tree_motion as tree_motion,
)
from .multibody._kinematics import (
    body_map as body_map,
    euler_rotation as euler_rotation,
    global_map as global_map,
    skew as skew,
)
