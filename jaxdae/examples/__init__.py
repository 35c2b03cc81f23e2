"""Worked examples from the source papers, each a ready-to-simulate system."""

from ._adaptive_optics import AdaptiveOpticsElement as AdaptiveOpticsElement, Crank as Crank
from ._ball_and_beam import BallAndBeam as BallAndBeam
from ._cartesian_arm import (
    CartesianArm as CartesianArm,
    CartesianArmLagrangian as CartesianArmLagrangian,
)
from ._impacts import (
    BouncingBall as BouncingBall,
    PendulumWithStop as PendulumWithStop,
    RockingBlock as RockingBlock,
    SlidingBlock as SlidingBlock,
)
from ._nonholonomic import ChaplyginSleigh as ChaplyginSleigh, KnifeEdge as KnifeEdge
from ._pendulum import CartesianPendulum as CartesianPendulum
from ._rolling_disc import RollingDisc as RollingDisc
from ._two_link import (
    TWO_LINK_Q0 as TWO_LINK_Q0,
    TWO_LINK_V0 as TWO_LINK_V0,
    TwoLinkManipulator as TwoLinkManipulator,
)
from ._woodpecker import WoodpeckerToy as WoodpeckerToy
