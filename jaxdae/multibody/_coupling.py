"""Couplings: holonomic constraints between the coordinates of two joints."""

from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float
from ._body import _scalar


class JointCoupling(eqx.Module):
    """A linear coupling of two joints' coordinates (1 equation):
    `θ_joint = multiplier · θ_leader + offset`, `Φ = θ_joint − multiplier · θ_leader − offset`.

    A gear train or belt between two joints' axes, a differential, or a URDF `<mimic>`
    (whose `multiplier` defaults to 1 and `offset` to 0). The coordinates are those of
    [`jaxdae.multibody.Mechanism.joint_coordinates`][]: a revolute joint's angle, a
    prismatic one's displacement. A [`jaxdae.multibody.TreeMechanism`][] reads them from
    `q` and adds the coupling to its constraints; a
    [`jaxdae.multibody.Mechanism`][] measures them from the markers' frames, so it refuses a
    coupling of a spatial revolute joint, whose angle it measures in `(−π, π]` only (the
    coupling would break where the angle jumps by `2π`): couple revolute joints in a
    `TreeMechanism`, or planar bodies' angles with [`jaxdae.multibody.Gear`][].

    **Arguments:**

    - `joint`: the driven joint's name.
    - `leader`: the name of the joint it follows.
    - `multiplier`: the ratio `dθ_joint / dθ_leader`. Default `1`.
    - `offset`: `θ_joint` where `θ_leader = 0`. Default `0`.
    - `name`: the coupling's name in outputs.
    """

    joint: str = eqx.field(static=True)
    leader: str = eqx.field(static=True)
    multiplier: Float[Array, ""]
    offset: Float[Array, ""]
    name: str | None = eqx.field(static=True)

    def __init__(
        self,
        joint: str,
        leader: str,
        multiplier: ArrayLike = 1.0,
        *,
        offset: ArrayLike = 0.0,
        name: str | None = None,
    ):
        for field, value in (("joint", joint), ("leader", leader)):
            if not isinstance(value, str):
                raise ValueError(
                    f"The `{field}` of a JointCoupling is a joint's name (a string); got {value!r}."
                )
        if joint == leader:
            raise ValueError(
                f"A JointCoupling ties two joints; `joint` and `leader` are both {joint!r}."
            )
        owner = f"the JointCoupling of joint {joint!r} to {leader!r}"
        self.joint, self.leader, self.name = joint, leader, name
        self.multiplier = _scalar(f"`multiplier` of {owner}", multiplier)
        self.offset = _scalar(f"`offset` of {owner}", offset)

    @property
    def joints(self) -> tuple[str, str]:
        """The two joints whose coordinates it reads: `(joint, leader)`."""
        return (self.joint, self.leader)

    def residual(self, coordinate: Callable[[str], Array]) -> Float[Array, " 1"]:
        """`θ_joint − multiplier · θ_leader − offset`, shape `(1,)`, from `coordinate`, a
        function of a joint's name that gives its coordinate."""
        follower, leader = coordinate(self.joint), coordinate(self.leader)
        dtype = jnp.result_type(follower, leader)
        return (follower - self.multiplier.astype(dtype) * leader - self.offset.astype(dtype))[None]
