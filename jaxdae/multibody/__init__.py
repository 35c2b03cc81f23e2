"""Planar multibody models: rigid bodies, joints and force elements assembled into a
[`jaxdae.LagrangianSystem`][].

A [`jaxdae.multibody.Mechanism`][] describes each body by the absolute coordinates
`(x, y, θ)` of its centre of mass; joints add holonomic constraints between markers (named
points on the bodies, `"body.marker"`), force elements add potentials and loads. The result
is an ordinary jaxdae system: simulate it with any formulation, differentiate with respect
to any of its numbers.
"""

from ._body import Body as Body, Ground as Ground
from ._force import (
    AbstractForce as AbstractForce,
    Force as Force,
    Gravity as Gravity,
    Load as Load,
    RotationalSpringDamper as RotationalSpringDamper,
    SpringDamper as SpringDamper,
    Torque as Torque,
)
from ._joint import (
    AbstractJoint as AbstractJoint,
    Distance as Distance,
    Fixed as Fixed,
    Gear as Gear,
    PointOnLine as PointOnLine,
    Prismatic as Prismatic,
    Revolute as Revolute,
)
from ._kinematics import Frame as Frame, Kinematics as Kinematics
from ._model import Mechanism as Mechanism, Mobility as Mobility, Reaction as Reaction
