"""Control inputs: feedback laws that a controlled system reads through its `controller` field.

A *controlled system* is a [`jaxdae.AbstractControlledSystem`][]: its `controller` (an
[`jaxdae.AbstractController`][]) gives the input that its `generalized_forces` (or
energies) read as `u = self.controller(t, q, v)`. Closing a loop is then a pure function of
the model: `jaxdae.with_controller(system, jaxdae.LinearFeedback(...))`, and
[`jaxdae.linearize`][] / [`jaxdae.equilibrium`][] obtain the input matrix `B` and the
equilibrium input by swapping in a [`jaxdae.ConstantControl`][]. Nothing in
`simulate` knows about controls.
"""

import abc
import dataclasses
import os
import sys
import warnings

import equinox as eqx
import jax.numpy as jnp

from .._checks import check_instance, check_real, described
from .._custom_types import Array, ArrayLike, Float, ScalarLike
from ._system import AbstractSystem


class AbstractController(eqx.Module):
    """A feedback law `u = controller(t, q, v)`, shape `(p,)` (Krasinskaya and Krasinskiy (2013) §6,
    Mukharlyamov (2019) [2.1])."""

    @abc.abstractmethod
    def __call__(
        self, t: ScalarLike, q: Float[Array, " n"], v: Float[Array, " n"]
    ) -> Float[Array, " p"]:
        """The input at the state `(t, q, v)`."""


class ConstantControl(AbstractController):
    """An open-loop constant input `u` (also what `linearize` uses to differentiate in `u`).

    **Arguments:**

    - `u`: the input, shape `(p,)`.
    """

    u: Float[Array, " p"]

    def __init__(self, u: ScalarLike | Float[ArrayLike, " p"]):
        check_real(u=u)
        self.u = jnp.atleast_1d(jnp.asarray(u, dtype=jnp.result_type(u, float)))

    def __call__(self, t, q, v):
        return self.u


class LinearFeedback(AbstractController):
    """`u = u_ref − K (x − x_ref)`, `x = (q[positions], v[velocities])` (Krasinskaya and Krasinskiy
    (2013), §6).

    The state ordering is the one of [`jaxdae.linearize`][] (`Linearization.positions`,
    `Linearization.velocities`), so an LQR gain designed on a linearization plugs in
    directly; a gain designed on another model (e.g. the simplified Ball & Beam) is applied
    to the matching coordinates of the exact one by naming its indices.

    **Arguments:**

    - `gain`: `K`, shape `(p, s)`.
    - `q_ref`, `v_ref`: the reference state (full coordinate and velocity vectors, `(n,)`).
    - `u_ref`: the equilibrium input, `(p,)`.
    - `positions`, `velocities`: the coordinate and velocity indices that make up `x`
        (static tuples, `len(positions) + len(velocities) = s`).
    """

    gain: Float[Array, "p s"]
    q_ref: Float[Array, " n"]
    v_ref: Float[Array, " n"]
    u_ref: Float[Array, " p"]
    positions: tuple[int, ...] = eqx.field(static=True)
    velocities: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, gain, q_ref, v_ref, u_ref, positions, velocities):
        check_real(gain=gain, q_ref=q_ref, v_ref=v_ref, u_ref=u_ref)
        dtype = jnp.result_type(gain, q_ref, v_ref, u_ref, float)
        self.gain = jnp.atleast_2d(jnp.asarray(gain, dtype=dtype))
        self.q_ref = jnp.asarray(q_ref, dtype=dtype)
        self.v_ref = jnp.asarray(v_ref, dtype=dtype)
        self.u_ref = jnp.atleast_1d(jnp.asarray(u_ref, dtype=dtype))
        self.positions = tuple(int(i) for i in positions)
        self.velocities = tuple(int(i) for i in velocities)

    def __check_init__(self):
        size = len(self.positions) + len(self.velocities)
        if self.gain.ndim != 2 or self.gain.shape != (self.u_ref.shape[0], size):
            raise ValueError(
                f"`gain` must have shape (p, s) = ({self.u_ref.shape[0]}, {size}) for "
                f"{len(self.positions)} positions + {len(self.velocities)} velocities and "
                f"{self.u_ref.shape[0]} inputs; got {self.gain.shape}."
            )
        if self.q_ref.shape != self.v_ref.shape or self.q_ref.ndim != 1:
            raise ValueError(
                f"`q_ref` and `v_ref` must be 1-D of equal shape (n,); got {self.q_ref.shape} "
                f"and {self.v_ref.shape}."
            )

    def state(self, q, v):
        """`x = (q[positions], v[velocities])`."""
        pos = jnp.asarray(self.positions, dtype=int)
        vel = jnp.asarray(self.velocities, dtype=int)
        return jnp.concatenate([q[pos], v[vel]])

    def __call__(self, t, q, v):
        dx = self.state(q, v) - self.state(self.q_ref, self.v_ref)
        return self.u_ref - self.gain @ dx


class AbstractControlledSystem(AbstractSystem):
    """A system driven by a feedback law: its `controller` gives the input
    `u = self.controller(t, q, v)`, shape `(p,)`, that its `generalized_forces` (or
    energies) read.

    [`jaxdae.with_controller`][] closes a loop by replacing the controller, and
    [`jaxdae.linearize`][] and [`jaxdae.equilibrium`][] find the input matrix `B` and the
    equilibrium input by replacing it with a [`jaxdae.ConstantControl`][]. A model declares
    the field with its type, e.g. `controller: jaxdae.AbstractController`, beside its
    other bases:

    ```python
    class Cart(jaxdae.LagrangianSystem, jaxdae.AbstractControlledSystem):
        mass: jax.Array
        controller: jaxdae.AbstractController

        def kinetic_energy(self, t, q, v):
            return 0.5 * self.mass * v @ v

        def generalized_forces(self, t, q, v):
            return self.controller(t, q, v)
    ```
    """

    controller: eqx.AbstractVar[AbstractController]


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames of the wrappers that jaxtyping's import hook puts around jaxdae's functions (with a
# typechecker, beartype) count as jaxdae's.
_WRAPPERS = ("jaxtyping.", "beartype.")


def is_controlled(system) -> bool:
    """Whether `system` is a controlled system ([`jaxdae.AbstractControlledSystem`][]).

    A system with a field `controller` that does not subclass it counts too, with a
    `DeprecationWarning`: that convention ends in the next release."""
    if isinstance(system, AbstractControlledSystem):
        return True
    if not (
        dataclasses.is_dataclass(system)
        and any(field.name == "controller" for field in dataclasses.fields(system))
    ):
        return False
    warnings.warn(
        f"{type(system).__name__} is a controlled system by its field `controller` alone, "
        "which is deprecated and stops working in the next release: subclass "
        "`jaxdae.AbstractControlledSystem` as well.",
        DeprecationWarning,
        stacklevel=_user_level(),
    )
    return True


def _user_level() -> int:
    """The `stacklevel` of `warnings.warn`, called from a function of jaxdae, that names the
    first frame outside jaxdae: the user's line, where Python shows a `DeprecationWarning`."""
    frame = sys._getframe(1)
    while _wrapper(frame):  # around this function
        frame = frame.f_back
    frame, level = frame.f_back, 2  # level 1: the function that warns
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(_PACKAGE + os.sep) or _wrapper(frame)
    ):
        frame, level = frame.f_back, level + 1
    return level


def _wrapper(frame) -> bool:
    return frame.f_globals.get("__name__", "").startswith(_WRAPPERS)


def with_controller(system, controller: AbstractController):
    """A copy of a controlled `system` with its `controller` field replaced.

    **Raises:**

    `ValueError` if `system` is not a controlled system
    ([`jaxdae.AbstractControlledSystem`][]).
    """
    if not is_controlled(system):
        raise ValueError(
            f"{described(system)} has no `controller` field: a controlled system subclasses "
            "`jaxdae.AbstractControlledSystem`, declares `controller: "
            "jaxdae.AbstractController` and reads `u = self.controller(t, q, v)`."
        )
    check_instance("controller", controller, AbstractController, "a `jaxdae.AbstractController`")
    return eqx.tree_at(lambda s: s.controller, system, controller)


def num_inputs(system, t, q, v) -> int:
    """`p`, the size of the input of a controlled system (0 without a `controller`)."""
    if not is_controlled(system):
        return 0
    return int(jnp.shape(eqx.filter_eval_shape(system.controller, t, q, v))[0])
