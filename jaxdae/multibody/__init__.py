"""Planar multibody models: rigid bodies, joints and force elements assembled into a
[`jaxdae.LagrangianSystem`][].

A [`jaxdae.multibody.Mechanism`][] describes each body by the absolute coordinates
`(x, y, θ)` of its centre of mass; joints add holonomic constraints between markers (named
points on the bodies, `"body.marker"`), force elements add potentials and loads. The result
is an ordinary jaxdae system: simulate it with any formulation, differentiate with respect
to any of its numbers.
"""

from ._body import Ground as Ground
from ._body import PlanarBody as PlanarBody
from ._force import (
    AbstractForce as AbstractForce,
)
from ._force import (
    Force as Force,
)
from ._force import (
    Gravity as Gravity,
)
from ._force import (
    Load as Load,
)
from ._force import (
    RotationalSpringDamper as RotationalSpringDamper,
)
from ._force import (
    SpringDamper as SpringDamper,
)
from ._force import (
    Torque as Torque,
)
from ._joint import (
    AbstractJoint as AbstractJoint,
)
from ._joint import (
    Distance as Distance,
    Driver as Driver,
)
from ._joint import (
    Fixed as Fixed,
)
from ._joint import (
    Gear as Gear,
)
from ._joint import (
    PointOnLine as PointOnLine,
)
from ._joint import (
    Prismatic as Prismatic,
)
from ._joint import (
    Revolute as Revolute,
)
from ._kinematics import Frame as Frame
from ._kinematics import Kinematics as Kinematics
from ._model import Mechanism as Mechanism
from ._model import Mobility as Mobility
from ._model import Reaction as Reaction
