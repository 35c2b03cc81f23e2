"""Multibody models: planar and spatial rigid bodies, joints and force elements assembled
into a [`jaxdae.LagrangianSystem`][], and URDF import.

A [`jaxdae.multibody.Mechanism`][] describes each body by absolute coordinates: `(x, y, θ)`
of a planar body's centre of mass and orientation, or the position and Euler parameters of
a spatial one. Joints add holonomic constraints between markers (named points and frames on
the bodies, `"body.marker"`), force elements add potentials and loads. The result is an
ordinary jaxdae system: simulate it with any formulation, differentiate with respect to any
of its numbers.
"""

from ._body import Ground as Ground
from ._body import PlanarBody as PlanarBody
from ._body import RigidBody as RigidBody
from ._force import AbstractForce as AbstractForce
from ._force import Force as Force
from ._force import Gravity as Gravity
from ._force import JointSpringDamper as JointSpringDamper
from ._force import Load as Load
from ._force import RotationalSpringDamper as RotationalSpringDamper
from ._force import SpringDamper as SpringDamper
from ._force import Torque as Torque
from ._joint import AbstractJoint as AbstractJoint
from ._joint import Cylindrical as Cylindrical
from ._joint import Distance as Distance
from ._joint import Driver as Driver
from ._joint import Fixed as Fixed
from ._joint import Gear as Gear
from ._joint import PointOnLine as PointOnLine
from ._joint import Prismatic as Prismatic
from ._joint import Revolute as Revolute
from ._joint import Rolling as Rolling
from ._joint import Spherical as Spherical
from ._joint import Universal as Universal
from ._kinematics import Frame as Frame
from ._kinematics import Kinematics as Kinematics
from ._kinematics import rotation_matrix as rotation_matrix
from ._kinematics import rpy_matrix as rpy_matrix
from ._model import Mechanism as Mechanism
from ._model import Mobility as Mobility
from ._model import Reaction as Reaction
from ._urdf import JointLimit as JointLimit
from ._urdf import UrdfRobot as UrdfRobot
from ._urdf import load_urdf as load_urdf
