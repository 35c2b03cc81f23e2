"""Multibody models: planar and spatial rigid bodies, joints and force elements assembled
into a jaxdae system, and URDF import.

A [`jaxdae.multibody.Mechanism`][] describes each body by absolute coordinates: `(x, y, θ)`
of a planar body's centre of mass and orientation, or the position and Euler parameters of
a spatial one. Joints add holonomic constraints between markers (named points and frames on
the bodies, `"body.marker"`), force elements add potentials and loads. A
[`jaxdae.multibody.TreeMechanism`][] takes the same spatial bodies, joints and force
elements in joint coordinates: the joints of a tree from the ground carry its bodies, its
dynamics come from the recursive algorithms of robotics, and only the joints that close
loops are constraints. Either is an ordinary jaxdae system: simulate it with any
formulation, differentiate with respect to any of its numbers.
"""

from ._body import Ground as Ground, PlanarBody as PlanarBody, RigidBody as RigidBody
from ._coupling import JointCoupling as JointCoupling
from ._force import (
    AbstractActuatedForce as AbstractActuatedForce,
    AbstractForce as AbstractForce,
    Force as Force,
    Gravity as Gravity,
    JointSpringDamper as JointSpringDamper,
    Load as Load,
    RotationalSpringDamper as RotationalSpringDamper,
    SpringDamper as SpringDamper,
    Torque as Torque,
)
from ._joint import (
    AbstractJoint as AbstractJoint,
    Cylindrical as Cylindrical,
    Distance as Distance,
    Driver as Driver,
    Fixed as Fixed,
    Gear as Gear,
    PointOnLine as PointOnLine,
    Prismatic as Prismatic,
    Revolute as Revolute,
    Rolling as Rolling,
    Spherical as Spherical,
    Universal as Universal,
)
from ._kinematics import (
    Frame as Frame,
    Kinematics as Kinematics,
    rotation_matrix as rotation_matrix,
    rpy_matrix as rpy_matrix,
)
from ._model import Mechanism as Mechanism
from ._results import Mobility as Mobility, Reaction as Reaction
from ._stop import (
    AbstractRangeStop as AbstractRangeStop,
    AbstractStop as AbstractStop,
    DistanceStop as DistanceStop,
    JointLimit as JointLimit,
    PlaneContact as PlaneContact,
    StopKinematics as StopKinematics,
)
from ._tree import TreeMechanism as TreeMechanism
from ._tree_kinematics import TreeKinematics as TreeKinematics
from ._urdf import UrdfLimit as UrdfLimit, UrdfRobot as UrdfRobot, load_urdf as load_urdf
from ._urdf_geometry import UrdfCollision as UrdfCollision, UrdfVisual as UrdfVisual
