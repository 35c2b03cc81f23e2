"""What the analyses of a mechanism return: its mobility and its joints' reactions."""

from typing import NamedTuple

from .._custom_types import Array, Float


class Reaction(NamedTuple):
    """The load a joint exerts on its second body (marker `b`), from the multipliers.

    - `force`: the force in the global frame, `(..., d)`.
    - `torque`: the moment about marker `b`: `(...)` in the plane (zero for a revolute
        joint), `(..., 3)` in the global frame in space.

    The joint exerts `−force` on the body of marker `a`.
    """

    force: Float[Array, "*batch d"]
    torque: Float[Array, "*batch"]


class Mobility(NamedTuple):
    """Degrees of freedom of a mechanism at a configuration.

    - `coordinates`: `n`: 3 per planar body, 7 per spatial body.
    - `equations`: `m`, the number of constraint equations: the joints' and, in space, one
        Euler-parameter norm per body.
    - `grubler`: the Grübler (Chebychev–Grübler–Kutzbach) count `n − m` (in space
        `6 × bodies −` the joints' equations).
    - `rank`: the rank `r` of the constraint Jacobian `Φ_q` there.
    - `dof`: the degrees of freedom `n − r`.
    - `redundant`: the redundant constraint equations `m − r` (`dof − grubler`).
    """

    coordinates: int
    equations: int
    grubler: int
    rank: int
    dof: int
    redundant: int
