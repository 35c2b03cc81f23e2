"""The slider-crank of the guide "Building a mechanism", built with `jaxdae.multibody`: the
model that its experiment, the animation benchmark, the docs' figures and the animation
tests share."""

import jax.numpy as jnp

import jaxdae.multibody as mb

from .._formulations._baumgarte import Baumgarte
from .._integration._simulate import simulate


def slider_crank() -> mb.Mechanism:
    """A crank of 0.1 m about the ground's origin, a rod of 0.3 m and a slider on the x
    axis, under gravity. Joints `crank` (revolute at the ground) and `slide` (prismatic)
    have coordinates; the rod's ends are pinned."""
    crank = mb.PlanarBody("crank", mass=1.0, inertia=2e-3, markers={"pin": (0.1, 0.0)})
    rod = mb.PlanarBody("rod", mass=0.5, inertia=4e-3,
                        markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)}, position=(0.25, 0.0))
    slider = mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0))
    joints = [mb.Revolute("ground", "crank", name="crank"), mb.Revolute("crank.pin", "rod.a"),
              mb.Revolute("rod.b", "slider"), mb.Prismatic("ground", "slider", name="slide")]
    return mb.Mechanism([crank, rod, slider], joints, [mb.Gravity()])


def slider_crank_run(t1: float = 1.0, num: int = 501):
    """`(model, solution)`: the slider-crank from a crank angle of 0.5 rad at 10 rad/s under
    `Baumgarte(20, 100)` for `t1` seconds, `num` saved states."""
    model = slider_crank()
    q0, v0 = model.initial_state(joint_coordinates={"crank": (0.5, 10.0)})
    return model, simulate(model, Baumgarte(20.0, 100.0), 0.0, t1, q0, v0,
                           ts=jnp.linspace(0.0, t1, num))
