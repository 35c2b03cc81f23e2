"""What the two kinds of mechanism share: their stops as one-sided constraints, the rates of
their joint coordinates, and prescribed joint coordinates for a consistent start."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, Float
from .._systems._system import LagrangianSystem
from ._body import GROUND
from ._kinematics import split
from ._stop import AbstractStop, StopKinematics


def over_leading(fn, *arrays):
    """`fn` on the last axis of `arrays`, mapped over their (shared) leading axes."""
    batch = arrays[0].shape[:-1]
    if not batch:
        return fn(*arrays)
    flat = [x.reshape((-1, x.shape[-1])) for x in arrays]
    out = jax.vmap(fn)(*flat)
    return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


class AbstractMechanism(eqx.Module):
    """The stops of a [`jaxdae.multibody.Mechanism`][] or
    [`jaxdae.multibody.TreeMechanism`][] as the system's `gaps` (with their coefficients of
    restitution and friction and their slip velocities), read through the mechanism's
    `_stop_kinematics`, and `joint_rates` from its `joint_coordinates`. Listed before the
    system class among a mechanism's bases, so that these override the system's defaults
    (no gaps)."""

    stops: eqx.AbstractVar[tuple[AbstractStop, ...]]
    stop_names: eqx.AbstractVar[tuple[str, ...]]

    @abc.abstractmethod
    def _stop_kinematics(self, t, q, v=None) -> StopKinematics:
        """The markers, joint coordinates and velocities the stops read at `(t, q, v)`."""

    @abc.abstractmethod
    def joint_coordinates(self, q: Float[Array, "*batch n"]) -> dict[str, Float[Array, "*batch"]]:
        """The joint coordinates by joint name."""

    def _check_ref(self, owner, ref):
        """Raise `ValueError` where `ref` names a body or marker the mechanism lacks."""
        body, marker = split(ref)
        names = (GROUND,) + self.body_names
        if body not in names:
            raise ValueError(
                f"The {owner} refers to body {body!r}, which is not in the mechanism (bodies: "
                f"{', '.join(names)}). Add the body to `bodies` or fix the name."
            )
        if marker is not None and marker not in self.body(body).markers:
            known = sorted(self.body(body).markers)
            raise ValueError(
                f"The {owner} refers to marker {ref!r}, but body {body!r} has no marker "
                f"{marker!r} (its markers: {known or 'none'}). Add it to the body's "
                "`markers` or refer to the body alone for its centre of mass."
            )

    def gaps(self, t, q):
        """The stops' gaps in the order of `stops` (see `gap_names`)."""
        if not self.stops:
            return jnp.zeros((0,), q.dtype)
        stop_kin = self._stop_kinematics(t, q)
        return jnp.concatenate([stop.gaps(stop_kin) for stop in self.stops])

    def restitution(self):
        """The stops' coefficients of restitution, one per gap."""
        return jnp.concatenate([jnp.broadcast_to(stop.restitution, (stop.num_gaps,))
                                for stop in self.stops]) if self.stops else 0.0

    def friction(self):
        """The stops' coefficients of friction, one per gap (`0` without friction)."""
        return jnp.concatenate([stop.friction_coefficients() for stop in self.stops]
                               ) if self.stops else 0.0

    def slip_velocities(self, t, q, v):
        """The sliding velocities of the stops' contacts, one per gap (zero for gaps
        without friction)."""
        if not self.stops:
            return jnp.zeros((0,), q.dtype)
        stop_kin = self._stop_kinematics(t, q, v)
        return jnp.concatenate([stop.slip_velocities(stop_kin).astype(q.dtype)
                                for stop in self.stops])

    @property
    def gap_names(self) -> tuple[str, ...]:
        """The gaps' names: each stop's name, with its label per gap (`.lower`, `.upper`)."""
        return tuple(f"{name}.{label}" if label else name
                     for name, stop in zip(self.stop_names, self.stops, strict=True)
                     for label in stop.gap_labels)

    def joint_rates(self, q: Float[Array, "*batch n"], v: Float[Array, "*batch n"]
                    ) -> dict[str, Float[Array, "*batch"]]:
        """The rates of the joint coordinates, `d/dt joint_coordinates(q)`."""
        return over_leading(lambda q_, v_: jax.jvp(self.joint_coordinates, (q_,), (v_,))[1],
                             q, v)


def constraint_rank(mechanism, q, t, rtol: float) -> int:
    """The rank of the constraint Jacobian `Φ_q` of `mechanism` at `(t, q)`: its singular
    values above `rtol · σ_max` (0 without constraints)."""
    if not mechanism.num_equations:
        return 0
    jac = np.asarray(jax.jacfwd(mechanism.constraints, argnums=1)(jnp.asarray(t, q.dtype), q))
    sigma = np.linalg.svd(jac, compute_uv=False)
    return int(np.sum(sigma > rtol * max(sigma[0], np.finfo(jac.dtype).tiny)))


def prescribed(mechanism, joint_coordinates, dtype) -> "Prescribed":
    """The joints and `(value, rate)`s of `joint_coordinates` (by joint name, a value or a
    pair), checked: each joint must be in `mechanism` and have a coordinate."""
    names, values, rates = [], [], []
    for name, value in (joint_coordinates or {}).items():
        joint = mechanism.joint(name)
        if not joint.has_coordinate:
            with_one = sorted(n for n, j in zip(mechanism.joint_names, mechanism.joints,
                                                strict=True) if j.has_coordinate)
            raise ValueError(f"Joint {name!r} has no joint coordinate to prescribe; joints with "
                             f"one: {with_one}.")
        value, rate = value if isinstance(value, tuple) else (value, 0.0)
        names.append(name)
        values.append(jnp.asarray(value, dtype))
        rates.append(jnp.asarray(rate, dtype))
    empty = jnp.zeros((0,), dtype)
    return Prescribed(tuple(names), jnp.stack(values) if names else empty,
                      jnp.stack(rates) if names else empty)


class Prescribed(eqx.Module):
    """Joint coordinates prescribed along `value + rate (t − t0)`, by joint name."""

    names: tuple[str, ...] = eqx.field(static=True)
    values: Float[Array, " d"]
    rates: Float[Array, " d"]


class Driven(LagrangianSystem):
    """`mechanism` with the joint coordinates of `prescribed` driven along
    `value + rate (t − t0)`: what `initial_state` finds a consistent state of."""

    mechanism: LagrangianSystem | eqx.Module
    prescribed: Prescribed
    t0: Float[Array, ""]

    def mass_matrix(self, t, q):
        return self.mechanism.mass_matrix(t, q)

    def constraints(self, t, q):
        parts = [self.mechanism.constraints(t, q)]
        if self.prescribed.names:
            coords = self.mechanism.joint_coordinates(q)
            driven = jnp.stack([coords[n] for n in self.prescribed.names])
            parts.append(driven - self.prescribed.values
                         - self.prescribed.rates * (t - self.t0))
        return jnp.concatenate(parts)
