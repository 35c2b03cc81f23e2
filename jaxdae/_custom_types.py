"""Shape-annotated array aliases shared by the whole package."""

from collections.abc import Sequence
from typing import TypeAlias

from jaxtyping import Array, ArrayLike, Bool, Float, Int, PyTree

Scalar: TypeAlias = Float[Array, ""]
ScalarLike: TypeAlias = float | Float[ArrayLike, ""]
Coordinates: TypeAlias = Float[Array, " n"]
Velocities: TypeAlias = Float[Array, " n"]
Momenta: TypeAlias = Float[Array, " n"]
MassMatrix: TypeAlias = Float[Array, "n n"]
HolonomicResidual: TypeAlias = Float[Array, " m"]
HolonomicJacobian: TypeAlias = Float[Array, "m n"]
NonholonomicResidual: TypeAlias = Float[Array, " k"]
NonholonomicJacobian: TypeAlias = Float[Array, "k n"]
Gain: TypeAlias = Float[Array, ""] | Float[Array, " c"] | Float[Array, "c c"]
# What `jnp.asarray` takes for a model's vectors and matrices: arrays, numbers, and tuples
# or lists of numbers or of such tuples, e.g. `RigidBody(..., position=(0.0, 0.0, 1.0))`.
ArrayLikeOrSequence: TypeAlias = ArrayLike | Sequence[ArrayLike] | Sequence[Sequence[ArrayLike]]
# Lists of floats too: `Baumgarte([20.0, 10.0], ...)`.
GainLike: TypeAlias = (
    float
    | Sequence[float]
    | Sequence[Sequence[float]]
    | Float[ArrayLike, ""]
    | Float[ArrayLike, " c"]
    | Float[ArrayLike, "c c"]
)

__all__ = [
    "Array",
    "ArrayLike",
    "ArrayLikeOrSequence",
    "Bool",
    "Coordinates",
    "Float",
    "Gain",
    "GainLike",
    "HolonomicJacobian",
    "HolonomicResidual",
    "Int",
    "MassMatrix",
    "Momenta",
    "NonholonomicJacobian",
    "NonholonomicResidual",
    "PyTree",
    "Scalar",
    "ScalarLike",
    "Velocities",
]
