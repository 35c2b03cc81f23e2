"""The slider-crank of the guide "Building a mechanism", built with `jaxdae.multibody`: the
model that its experiment (`experiments/examples/slider_crank.py`, which simulates it for
the animation benchmark and the docs' figures too) and the animation tests share."""

import jaxdae.multibody as mb


def slider_crank() -> mb.Mechanism:
    """A crank of 0.1 m about the ground's origin, a rod of 0.3 m and a slider on the x
    axis, under gravity. Joints `crank` (revolute at the ground) and `slide` (prismatic)
    have coordinates; the rod's ends are pinned."""
    crank = mb.PlanarBody("crank", mass=1.0, inertia=2e-3, markers={"pin": (0.1, 0.0)})
    rod = mb.PlanarBody(
        "rod",
        mass=0.5,
        inertia=4e-3,
        markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)},
        position=(0.25, 0.0),
    )
    slider = mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0))
    joints = [
        mb.Revolute("ground", "crank", name="crank"),
        mb.Revolute("crank.pin", "rod.a"),
        mb.Revolute("rod.b", "slider"),
        mb.Prismatic("ground", "slider", name="slide"),
    ]
    return mb.Mechanism([crank, rod, slider], joints, [mb.Gravity()])
