"""Systems with actuator dynamics whose outputs realize program constraints
(Mukharlyamov (2019)), and the Lie derivatives of the program constraints along them."""

import abc

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp

from .._compilation._linalg import (
    spd_solve,
)
from .._custom_types import Array, Float
from .._systems._system import LagrangianSystem


class ActuatedSystem(eqx.Module):
    """A mechanism driven through actuator dynamics (Mukharlyamov (2019), eq. [2.1]).

    The state is `(q, v, w)`: the mechanism's coordinates and velocities and the actuators'
    state `w` (currents, torques, pressures, …):

    `q̇ = v`, `M(t, q) v̇ = Q(t, q, v) + Q_a(t, q, v, w)`, `ẇ = b(t, q, v, w) + B(t, q, v, w) u`,

    where `M` and `Q` come from `mechanism` (a [`jaxdae.LagrangianSystem`][] without
    constraints of its own: its energies and forces, differentiated automatically) and
    `Q_a` are the generalized forces the actuators apply to it. The control `u` enforces
    the program constraints `f(t, q, v) = 0` (eqs. [2.3]–[2.4]) through
    [`jaxdae.ConstraintEnforcingControl`][] and [`jaxdae.simulate_actuated`][].

    Subclass it: declare `mechanism` and the actuators' parameters as fields and implement
    the four methods below. See `jaxdae.examples.AdaptiveOpticsElement` (Mukharlyamov (2019), §5).
    """

    mechanism: eqx.AbstractVar[LagrangianSystem]

    @abc.abstractmethod
    def actuator_forces(self, t, q, v, w) -> Float[Array, " n"]:
        """`Q_a`: the generalized forces of the actuators on the mechanism, shape `(n,)`."""

    @abc.abstractmethod
    def actuator_drift(self, t, q, v, w) -> Float[Array, " k"]:
        """`b`: the actuators' own dynamics at zero input, shape `(k,)`."""

    @abc.abstractmethod
    def input_matrix(self, t, q, v, w) -> Float[Array, "k s"]:
        """`B`: how the input `u` (shape `(s,)`) drives `ẇ`, shape `(k, s)`."""

    @abc.abstractmethod
    def program_constraints(self, t, q, v) -> Float[Array, " r"]:
        """`f`: the goals of the control, zero on the programmed motion, shape `(r,)`; or a
        tuple of such arrays, groups whose relative degrees differ (e.g. holonomic goals
        `f(t, q)` and velocity goals `φ(t, q, v)`, Mukharlyamov (2019) eqs. [2.3]–[2.4])."""

    def accelerations(self, t, q, v, w) -> Float[Array, " n"]:
        """`a(t, q, v, w) = M⁻¹ (Q + Q_a)` of eq. [2.1]."""
        terms = self.mechanism.terms(t, q, v)
        return spd_solve(terms.mass_matrix, terms.forces + self.actuator_forces(t, q, v, w))

    def drift(self, t, x):
        """`X(t, x)`, the state's rate at zero input (eq. [5.3])."""
        q, v, w = x
        return v, self.accelerations(t, q, v, w), self.actuator_drift(t, q, v, w)


def constraint_groups(system: ActuatedSystem, t, x) -> tuple:
    """`program_constraints` as a tuple of groups (one array is one group)."""
    f = system.program_constraints(t, x[0], x[1])
    return tuple(f) if isinstance(f, (tuple, list)) else (f,)


def lie_derivatives(system: ActuatedSystem, order: int, t, x):
    """The program constraints' derivatives along the motion at `(t, x)`, by autodiff.

    Returns `(values, rates, input_gains)`, each entry a tuple over the constraint groups
    (`constraint_groups`): `values[k] = f⁽ᵏ⁾ = L_X^k f` and
    `rates[k] = L_X^{k+1} f` (time derivatives along the drift `X`, `∂/∂t` of rheonomic
    constraints included) for `k < order`, and `input_gains[k] = ∂f⁽ᵏ⁾/∂w · B`, shape
    `(r, s)`: how the input moves `f⁽ᵏ⁺¹⁾` (zero below the relative degree; `g` at
    `k = order − 1`, eq. [2.9]). One `jax.linearize` of the nested `jax.jvp`s gives every
    order at once.
    """

    def series(k):
        if k == 0:
            return lambda t_, x_: (constraint_groups(system, t_, x_),)
        lower = series(k - 1)

        def extended(t_, x_):
            values, rates = jax.jvp(lower, (t_, x_), (jnp.ones_like(t_), system.drift(t_, x_)))
            return values + (rates[-1],)

        return extended

    values, linear = jax.linearize(series(order - 1), t, x)
    rates = linear(jnp.ones_like(t), system.drift(t, x))
    q, v, w = x

    def along(column):
        return linear(jnp.zeros_like(t), (jnp.zeros_like(q), jnp.zeros_like(v), column))

    input_gains = jax.vmap(along, in_axes=1, out_axes=-1)(system.input_matrix(t, q, v, w))
    return values, rates, input_gains
