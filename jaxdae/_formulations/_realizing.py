"""Realizing nonholonomic constraints by forces on the free system (Matyukhin (1999))."""

import abc
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_instance
from .._compilation._linear_solvers import StructuredCholesky
from .._custom_types import Array, Float, NonholonomicResidual
from .._gains import as_gain, is_concrete
from .._systems._system import AbstractOneSidedWrapper, AbstractSystem, ConstrainedTerms
from ._multipliers import multiplier_solve


def _positive(name: str, value: Array, law: str) -> Array:
    """`ValueError` when concrete and not all positive and finite; `eqx.error_if` when
    traced."""
    message = f"`{name}` must be positive and finite ({law}); got {{}}."
    if value.ndim > 1:
        raise ValueError(
            f"`{name}` must be a scalar or one value per nonholonomic constraint; "
            f"got shape {value.shape}."
        )
    if is_concrete(value):
        array = np.asarray(value)
        if not np.all(np.isfinite(array) & (array > 0)):
            raise ValueError(message.format(array))
        return value
    return eqx.error_if(
        value, ~jnp.all(jnp.isfinite(value) & (value > 0)), message.format("a non-positive value")
    )


class AbstractRealizingForce(eqx.Module):
    """A law `R(ψ)` for the forces `Aᵀ R` that replace nonholonomic constraints (Matyukhin (1999)).

    The free system is `M q̈ = Q + Aᵀ R − Φ_qᵀλ` with `A = Ψ_v`: `R` acts along the same
    directions as the ideal reactions `−Aᵀμ` (Matyukhin (1999), eqs. [2.1]–[4.6]).
    """

    @abc.abstractmethod
    def __call__(
        self, psi: NonholonomicResidual, reaction: Callable[[], NonholonomicResidual]
    ) -> NonholonomicResidual:
        """The force `R` for the constraint residual `ψ`.

        `reaction()` returns the equivalent force: the one that gives `ψ̇ = −rate · ψ`
        (`rate` from `equivalent_rate`; at 0 it is the constraint reaction `−μ`); laws
        that do not need it never call it.
        """

    def equivalent_rate(self) -> float:
        """The rate `κ` of the equivalent force that `reaction()` gives: `ψ̇ = −κ ψ`.
        Default 0, the constraint reaction."""
        return 0.0

    def check(self, num_nonholonomic: int) -> "AbstractRealizingForce":
        """Shape checks (`ValueError`) and traced value checks; returns the checked law."""
        return self


def _check_size(name, value, k):
    if value.ndim == 1 and value.shape[0] != k:
        raise ValueError(
            f"`{name}` has shape {value.shape} but the system has {k} nonholonomic "
            f"constraints: pass a scalar or shape ({k},)."
        )


class ViscousForce(AbstractRealizingForce):
    """Linear (viscous) realizing forces `R = −k ψ` (Matyukhin (1999), eq. [5.1], Theorem 1).

    `ψ = 0` is exponentially stable for motions whose constraint reactions vanish; other
    constrained motions are only approached as `k → ∞` (the classical realization): at finite
    `k`, `ψ` settles at `O(|reaction| / k)`, not at zero.

    **Arguments:**

    - `k`: gain, a scalar or one value per nonholonomic constraint, positive.
    """

    k: Float[Array, "..."]

    def __init__(self, k):
        self.k = as_gain(k)

    def __check_init__(self):
        if is_concrete(self.k):
            _positive("k", self.k, "Matyukhin (1999), Theorem 1 needs k_i ≥ K > 0")

    def check(self, num_nonholonomic):
        _check_size("k", self.k, num_nonholonomic)
        return eqx.tree_at(
            lambda f: f.k, self, _positive("k", self.k, "Matyukhin (1999), Theorem 1")
        )

    def __call__(self, psi, reaction):
        return -self.k.astype(psi.dtype) * psi


class BoundedForce(AbstractRealizingForce):
    """Bounded (dry-friction-like) realizing forces `R = −R̄ sign(ψ)` (Matyukhin (1999), eq. [6.4]).

    With `R̄ = r̄ + η`, `r̄` a bound of the constraint reactions along the motion (see
    [`jaxdae.reaction_bound`][]) and `η > 0`, every constrained motion is *finitely* stable:
    the free system reaches `ψ = 0` in finite time and then slides on it (Theorem 2, Filippov
    solutions). Two treatments of the discontinuity:

    - `smoothing=ε > 0`: `R = −R̄ tanh(ψ / ε)` (Matyukhin (1999), §7's smooth `R̃`): a smooth vector
        field, differentiable, and adaptive solvers take normal steps; `ψ` reaches a band of
        width `O(ε)` in finite time and stays there.
    - `smoothing=None` (default): the Filippov solution by its equivalent control. The force
        is `R = clip(R_eq, −R̄, R̄)` with `R_eq` the force that would give `ψ̇ = −rate · ψ`
        (the constraint reaction `−μ` plus `−rate · ψ / (A M⁻¹ Aᵀ)`). Away from the surface
        `R_eq` exceeds `R̄` and `R = −R̄ sign(ψ)` exactly (Theorem 2's law, reaching the
        surface in finite time); within `|ψ| ≲ (R̄ + r̄) |A M⁻¹ Aᵀ| / rate` the force is the
        sliding mode's equivalent control, so the motion *is* the constrained one (stabilized
        with `Ψ̇ = −rate · Ψ`) for as long as the reaction it needs stays below `R̄`, and leaves
        the surface where it does not (Filippov's condition). The law is continuous
        (Lipschitz constant `rate / (A M⁻¹ Aᵀ)`), so adaptive solvers need no special care;
        it becomes the discontinuous Filippov system as `rate → ∞`.

    **Arguments:**

    - `bound`: `R̄`, a scalar or one value per nonholonomic constraint, positive.
    - `smoothing`: `ε` of the `tanh` law, or `None` for the sliding-mode treatment.
    - `rate`: `κ` of the sliding-mode treatment, positive. Default `1e3`.
    """

    bound: Float[Array, "..."]
    smoothing: Float[Array, ""] | None
    rate: float = 1e3

    def __init__(self, bound, smoothing=None, rate=1e3):
        self.bound = as_gain(bound)
        self.smoothing = None if smoothing is None else as_gain(smoothing)
        self.rate = rate

    def __check_init__(self):
        if is_concrete(self.bound):
            _positive("bound", self.bound, "Matyukhin (1999), Theorem 2: R̄ = r̄ + η with η > 0")
        if self.smoothing is not None and is_concrete(self.smoothing):
            _positive("smoothing", self.smoothing, "the width ε of R̄ tanh(ψ/ε)")
        if not self.rate > 0:
            raise ValueError(f"`rate` must be positive; got {self.rate}.")

    def check(self, num_nonholonomic):
        _check_size("bound", self.bound, num_nonholonomic)
        new = eqx.tree_at(lambda f: f.bound, self, _positive("bound", self.bound, "Theorem 2"))
        if self.smoothing is not None:
            new = eqx.tree_at(
                lambda f: f.smoothing, new, _positive("smoothing", self.smoothing, "tanh law")
            )
        return new

    def equivalent_rate(self):
        return self.rate

    def __call__(self, psi, reaction):
        bound = self.bound.astype(psi.dtype)
        if self.smoothing is not None:
            return -bound * jnp.tanh(psi / self.smoothing.astype(psi.dtype))
        return jnp.clip(reaction(), -bound, bound)


class CustomForce(AbstractRealizingForce):
    """A user law `R = R̃(ψ)` (Matyukhin (1999), §7, eqs. [7.3]–[7.4]).

    Stability needs the power of the deviation `N = Σ Z_i ψ_i` to be small (Matyukhin (1999)); e.g.
    `lambda psi: -3.0 * jnp.tanh(psi / 1e-2) - 10.0 * psi`.

    **Arguments:**

    - `law`: a function from `ψ` (shape `(k,)`) to `R` (shape `(k,)`).
    """

    law: Callable

    def __call__(self, psi, reaction):
        force = self.law(psi)
        if jnp.shape(force) != psi.shape:
            raise ValueError(
                f"The realizing-force law must return shape {psi.shape} (one force "
                f"per nonholonomic constraint); got {jnp.shape(force)}."
            )
        return force


class RealizedConstraints(AbstractOneSidedWrapper):
    """The free system whose nonholonomic constraints are replaced by forces (Matyukhin (1999)).

    Wraps any system with nonholonomic constraints `Ψ = A(t, q) v + a(t, q)`: holonomic
    constraints stay constraints, each nonholonomic one becomes the generalized force `Aᵀ R(ψ)`
    with the law `force` ([`jaxdae.ViscousForce`][], [`jaxdae.BoundedForce`][],
    [`jaxdae.CustomForce`][]). Simulate it with any formulation (nonholonomic gains are unused);
    the state and [`jaxdae.Solution`][] are the wrapped system's, with `Solution.psi` empty:
    use [`jaxdae.RealizedConstraints.residuals`][] for `ψ(t)`.

    **Arguments:**

    - `system`: the constrained system (e.g. a [`jaxdae.LagrangianSystem`][]).
    - `force`: the realizing-force law.

    !!! Example

        ```python
        free = jaxdae.RealizedConstraints(sleigh, jaxdae.ViscousForce(100.0))
        sol = jaxdae.simulate(free, jaxdae.Unstabilized(), 0.0, 5.0, q0, v0, ts=ts)
        psi = free.residuals(sol)
        ```
    """

    system: AbstractSystem
    force: AbstractRealizingForce
    # The state is the wrapped system's, which may hold momenta.
    state_is_velocity: ClassVar[bool] = False

    def __check_init__(self):
        check_instance("system", self.system, AbstractSystem, "a jaxdae system")
        check_instance(
            "force",
            self.force,
            AbstractRealizingForce,
            "a realizing-force law such as `jaxdae.ViscousForce(k)` or "
            "`jaxdae.BoundedForce(bound)`",
        )

    def terms(self, t, q, s) -> ConstrainedTerms:
        full = self.system.terms(t, q, s)
        m, k = full.num_holonomic, full.num_nonholonomic
        if k == 0:
            raise ValueError(
                "`RealizedConstraints` needs a system with nonholonomic constraints "
                "(`velocity_constraints`); this one has none."
            )
        force = self.force.check(k)
        a_matrix = full.jacobian[m:]

        def reaction():
            # Equivalent control: exact multipliers with Φ̈ = 0, Ψ̇ = −rate Ψ; R = −μ.
            rate = force.equivalent_rate()
            target = full.bias + jnp.concatenate([jnp.zeros(m, q.dtype), -rate * full.psi])
            _, multipliers = multiplier_solve(full, target, StructuredCholesky())
            return -multipliers[m:]

        realizing = force(full.psi, reaction)
        return ConstrainedTerms(
            mass_matrix=full.mass_matrix,
            mass_operator=full.mass_operator,
            forces=full.forces + a_matrix.T @ realizing,
            phi=full.phi,
            dphi=full.dphi,
            psi=jnp.zeros((0,), q.dtype),
            jacobian=full.jacobian[:m],
            bias=full.bias[:m],
            energy=full.energy,  # (`energy` and `momenta` are the wrapped system's)
            momenta=full.momenta,
        )

    def energy(self, t, q, s):
        return self.system.energy(t, q, s)

    def velocities(self, t, q, s):
        return self.system.velocities(t, q, s)

    def momenta(self, t, q, s):
        return self.system.momenta(t, q, s)

    @property
    def wrapped_system(self):
        return self.system

    def state_rate(self, t, q, s, terms, acceleration):
        return self.system.state_rate(t, q, s, terms, acceleration)

    def velocity_constraint_curvature(self, t, q, s):
        return self.system.velocity_constraint_curvature(t, q, s)

    def residuals(self, solution) -> Float[Array, "N k"]:
        """`ψ(t)` of the wrapped system's nonholonomic constraints along a solution."""
        valid = jnp.isfinite(solution.ts)
        t = jnp.where(valid, solution.ts, 0.0)
        q = jnp.where(valid[:, None], solution.q, 0.0)
        v = jnp.where(valid[:, None], solution.v, 0.0)
        psi = jax.vmap(self.system.velocity_constraints)(t, q, v)
        return jnp.where(valid[:, None], psi, jnp.inf)


def reaction_bound(solution, num_holonomic: int | None = None) -> Float[Array, " k"]:
    """`r̄_i = max_t |μ_i(t)|`: a bound of the nonholonomic reactions along a constrained motion.

    Matyukhin (1999), Theorem 2 needs `R̄_i = r̄_i + η`, `η > 0`; estimate `r̄` from a simulation of
    the constrained system (any formulation) and pass `BoundedForce(r̄ + η)`.

    **Arguments:**

    - `solution`: a [`jaxdae.Solution`][] of the *constrained* system, saved densely enough
        (`ts=`) to see the largest reaction.
    - `num_holonomic`: number of holonomic constraints; default from `solution.phi`.

    **Returns:**

    Shape `(k,)`, one bound per nonholonomic constraint.
    """
    m = solution.phi.shape[-1] if num_holonomic is None else num_holonomic
    mu = solution.multipliers[..., m:]
    finite = jnp.isfinite(mu)
    return jnp.max(jnp.where(finite, jnp.abs(mu), 0.0), axis=-2)
