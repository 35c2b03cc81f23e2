"""Constrained mechanical systems and the terms of their equations of motion.

The user writes energies, forces and constraints as plain JAX functions; everything the
formulations need (`M`, the velocity-dependent forces, `J = Φ_q`, `γ`, `A = Ψ_v`, ...) is
derived here by automatic differentiation (notation: docs/methods.md).
"""

import abc
import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._compilation._gather import take
from .._compilation._operators import SparseOperator, state_independent_tag
from .._compilation._scalarize import array_form_scope
from .._compilation._sparse import SparseMatrix
from .._custom_types import (
    Array,
    ArrayLike,
    Coordinates,
    Float,
    HolonomicResidual,
    MassMatrix,
    Momenta,
    NonholonomicResidual,
    Scalar,
    ScalarLike,
    Velocities,
)
from ._nonholonomic import velocity_curvature
from ._structure import colour_matrix, model_defines, terms_structure


class ConstrainedTerms(eqx.Module):
    """Every term of the constrained equations of motion at one state `(t, q, v)`.

    The equations are `M q̈ = Q − Gᵀ λ` with the stacked constraint Jacobian
    `G = [Φ_q; Ψ_v]` and the constraint accelerations
    `[Φ̈; Ψ̇] = G q̈ − bias`, `bias = [γ; −(Ψ_t + Ψ_q v)]` (`γ` as in docs/methods.md).

    **Fields:**

    - `mass_matrix`: `M(t, q)`, shape `(n, n)`.
    - `forces`: `Q` of docs/methods.md — applied forces minus potential, Coriolis and centrifugal
        terms — so that the unconstrained system is `M q̈ = Q`; shape `(n,)`.
    - `phi`, `dphi`: holonomic residual `Φ` and its rate `Φ̇ = Φ_q v + Φ_t`; shape `(m,)`.
    - `psi`: nonholonomic residual `Ψ = A v + a`; shape `(k,)`.
    - `jacobian`: `G = [Φ_q; Ψ_v]`, shape `(m + k, n)`.
    - `bias`: shape `(m + k,)`, see above.
    - `energy`, `momenta`: the system's `energy` and `momenta` at the state, where deriving
        the terms computes them anyway (`None`: [`jaxdae.simulate`][] asks the system). They
        spare `simulate`'s diagnostics a trace of their own.
    - `mass_operator`, `jacobian_operator`: `M` and `G` again, as lineax operators whose
        type and tags carry what the system found about them, or `None` (nothing beyond
        the dense arrays). A system that derives them on their static sparsity patterns
        (`_systems/_structure.py`) gives `SparseOperator`s; `M`'s is tagged symmetric and
        positive semidefinite, and `state_independent_tag` where `M` does not depend on
        `(t, q, v)`. A solve factors such an `M` once, outside its loop, and hands it to
        every evaluation as a `FactoredOperator`. The dense fields always hold the same
        matrices; under `jit`, a field nobody reads costs nothing.
    """

    mass_matrix: MassMatrix
    forces: Float[Array, " n"]
    phi: HolonomicResidual
    dphi: HolonomicResidual
    psi: NonholonomicResidual
    jacobian: Float[Array, "c n"]
    bias: Float[Array, " c"]
    energy: Scalar | None = None
    momenta: Momenta | None = None
    mass_operator: lx.AbstractLinearOperator | None = None
    jacobian_operator: lx.AbstractLinearOperator | None = None

    @property
    def num_holonomic(self) -> int:
        return self.phi.shape[0]

    @property
    def num_nonholonomic(self) -> int:
        return self.psi.shape[0]


class AbstractSystem(eqx.Module):
    """A constrained mechanical system, in whatever form it is written.

    Subclasses provide [`jaxdae.AbstractSystem.terms`][], the data every formulation works on.
    """

    @abc.abstractmethod
    def terms(self, t: ScalarLike, q: Coordinates, v: Velocities) -> ConstrainedTerms:
        """All terms of the equations of motion at `(t, q, v)`."""

    @abc.abstractmethod
    def energy(self, t: ScalarLike, q: Coordinates, v: Velocities) -> Scalar:
        """Total mechanical energy `T + V` (conserved by conservative scleronomic systems)."""

    # The state is `(q, s)`; `s` is the velocities `v` unless a subclass says otherwise
    # (e.g. the momenta of a `HamiltonianSystem`). `terms`, `energy` and these take `s`.

    state_is_velocity: ClassVar[bool] = True
    """Whether the state `s` is the velocities themselves (`velocities` and `state_rate`
    are the identity). A subclass whose state holds something else (momenta), or may
    (a wrapper of another system), declares `False`."""

    structured_terms: ClassVar[bool | None] = False
    """Whether `terms` are derived from the sparsity patterns of the model's functions,
    found from their jaxprs: `None` above 8 coordinates, `True` always, `False` never. A
    [`jaxdae.LagrangianSystem`][] derives them so (default `None`, see its "Structure");
    other systems write their terms and keep `False`."""

    terms_from_constraints: ClassVar[bool] = False
    """Whether `terms` takes `Φ`, `Φ̇` and `Ψ` from `constraints` and `velocity_constraints`,
    so that those can be evaluated alone (as projections do) and a solve whose constraints
    contradict each other names them (`RESULTS.constraints_not_met`). `LagrangianSystem` and
    `HamiltonianSystem` declare `True`; a subclass of theirs that writes its own `terms`
    declares `False`."""

    def velocities(self, t: ScalarLike, q: Coordinates, s: Velocities) -> Velocities:
        """`q̇` at the state `(q, s)`. Default: `s` (the state holds velocities)."""
        return s

    def gaps(self, t: ScalarLike, q: Coordinates) -> Float[Array, " u"]:
        """One-sided constraints `g(t, q) ≥ 0`, shape `(u,)`: joint limits, stops, contacts.

        Each gap is open while positive. When one closes, [`jaxdae.simulate`][] stops there
        (the event located to the solver's tolerance), applies Newton's impact law with
        the coefficients of [`restitution`][jaxdae.AbstractSystem.restitution], and goes
        on; a contact that comes to rest pushes as a bilateral constraint until it would
        pull (see [`jaxdae.EventDriven`][]). Default: none (`u = 0`).
        """
        del t
        return jnp.zeros((0,), q.dtype)

    def restitution(self) -> ScalarLike | Float[ArrayLike, " u"]:
        """Newton's coefficients of restitution `e` of the [`gaps`][jaxdae.AbstractSystem.gaps],
        in `[0, 1]`, one per gap or one for all: a gap that closes at the rate `ġ⁻ < 0`
        opens at `ġ⁺ = −e ġ⁻` (for simultaneous impacts, the least impulses that achieve at
        least that, with none pulling). Default: `0`, plastic impacts."""
        return 0.0

    def friction(self) -> ScalarLike | Float[ArrayLike, " u"]:
        """Coulomb's coefficients of friction `μ ≥ 0` of the contacts at the
        [`gaps`][jaxdae.AbstractSystem.gaps], one per gap or one for all, acting along the
        [`slip_velocities`][jaxdae.AbstractSystem.slip_velocities]: a closed gap sticks
        while its tangential force stays within `μ` times its normal force, else slips
        against it (stick and slip are events; see [`jaxdae.EventDriven`][]). Default:
        `0`, frictionless contacts."""
        return 0.0

    def _contact_rows(
        self, t, q: Float[Array, " n"], v: Float[Array, " n"], friction: Float[Array, " f"]
    ) -> tuple[Float[Array, " u"], Float[Array, " r"], Float[Array, "r n"]]:
        """The gaps `g`, the contact velocities `[ġ; v_T]` and their rows `[W; W_T]` at
        `(t, q, v)`, for a step that needs no second derivatives (a time step); the slips
        only where `friction` has entries. Default: one forward-mode pass of `gaps` with
        `n + 1` tangents and, with friction, one of `slip_velocities` (linear in `v`) with
        `n`."""
        t = jnp.asarray(t, q.dtype)

        def gaps(t_, q_):
            value = self.gaps(t_, q_)
            return value, value

        (along_t, jacobian), gap = jax.jacfwd(gaps, argnums=(0, 1), has_aux=True)(t, q)
        rate = along_t + jacobian @ v
        if friction.shape[0] == 0:
            return gap, rate, jacobian

        def slips(v_):
            value = self.slip_velocities(t, q, v_).reshape(-1)
            return value, value

        slip_jacobian, slip = jax.jacfwd(slips, has_aux=True)(v)
        return (
            gap,
            jnp.concatenate([rate, slip]),
            jnp.concatenate([jacobian, slip_jacobian]),
        )

    def _dense_mass_variant(self) -> "AbstractSystem":
        """This system for a solve that factors the dense `M` itself (a time step): the
        same equations, computed along the path that suits that. Default: itself."""
        return self

    constraints_are_regular: ClassVar[bool] = False
    """Whether the constraint Jacobian `G = [Φ_q; Ψ_v]` has full row rank at every state a
    solve can reach, so that `G M⁻¹ Gᵀ` is never singular: a formulation's test for a
    singular `G M⁻¹ Gᵀ` (that of [`jaxdae.Baumgarte`][] and the other exact-multiplier
    formulations) is then left out of the solve, which compiles faster. Default: False (the
    test runs). A mechanism of free bodies alone declares True: its only constraints are the
    unit norms of the bodies' Euler parameters, whose rows are independent wherever the
    parameters are not all zero."""

    def gap_label(self, index: int) -> str:
        """How messages name gap `index` of the [`gaps`][jaxdae.AbstractSystem.gaps].
        Default: `gap <index>`."""
        return f"gap {index}"

    def stop_checks(self) -> tuple[tuple[ArrayLike, str], ...]:
        """Checks of the data of the [`gaps`][jaxdae.AbstractSystem.gaps] beyond
        [`restitution`][jaxdae.AbstractSystem.restitution] and
        [`friction`][jaxdae.AbstractSystem.friction] (which are always checked), for data
        that may be traced (a model under `jit`, `vmap` or `grad`): pairs `(problem, rule)`,
        `problem` a boolean true where a value breaks `rule`, a sentence that names the
        value and what it must be. [`jaxdae.simulate`][] raises `ValueError` with the rule
        where the values are concrete; where they are traced the solve ends with
        `RESULTS.invalid_input` (an error with the rule under `throw=True`). Default:
        none."""
        return ()

    def slip_velocities(
        self, t: ScalarLike, q: Coordinates, v: Velocities
    ) -> Float[Array, " u"] | Float[Array, "u 2"]:
        """The sliding velocity `v_T = W_T(t, q) v + w_T(t, q)` at each gap's contact,
        affine in `v`: along one tangent (friction in the plane), shape `(u,)`, or along
        two orthonormal tangents of the contact's tangent plane (friction in space, an
        isotropic cone `|λ_T| ≤ μ λ_N`), shape `(u, 2)`. Friction acts along it where
        [`friction`][jaxdae.AbstractSystem.friction] is not zero. Default: zero (no
        sliding direction)."""
        del v
        return jnp.zeros_like(self.gaps(t, q))

    def momenta(self, t: ScalarLike, q: Coordinates, s: Velocities) -> Momenta:
        """Generalized momenta at the state `(q, s)`. Default: `M(t, q) q̇`."""
        return self.terms(t, q, s).mass_matrix @ self.velocities(t, q, s)

    def state_rate(
        self,
        t: ScalarLike,
        q: Coordinates,
        s: Velocities,
        terms: ConstrainedTerms,
        acceleration: Float[Array, " n"],
    ) -> Velocities:
        """`ṡ` given `q̈` from a formulation (`terms` as returned by `terms(t, q, s)`).

        Default: `q̈` (the state holds velocities).
        """
        return acceleration

    def constraints(self, t: ScalarLike, q: Coordinates) -> HolonomicResidual:
        """Holonomic constraints `Φ(t, q)`, shape `(m,)`. Default: none."""
        return jnp.zeros((0,), q.dtype)

    def velocity_constraints(
        self, t: ScalarLike, q: Coordinates, v: Velocities
    ) -> NonholonomicResidual:
        """Nonholonomic constraints `Ψ = A(t, q) v + a(t, q)` in the velocities, shape `(k,)`.

        Default: none. Must be affine in `v`: [`jaxdae.simulate`][] refuses (`ValueError`) a
        `Ψ` whose second derivative in `v` is not zero at the initial state.
        """
        return jnp.zeros((0,), q.dtype)

    def velocity_constraint_curvature(
        self, t: ScalarLike, q: Coordinates, s: Velocities
    ) -> tuple[Scalar, Scalar]:
        """`(max |∂²Ψ/∂v²|, max |Ψ_v|)` near the state; `simulate` refuses a non-affine `Ψ`."""
        return velocity_curvature(self.velocity_constraints, t, q, self.velocities(t, q, s))


class AbstractOneSidedWrapper(AbstractSystem):
    """A system that wraps another and has its one-sided constraints: the gaps,
    coefficients of restitution and friction, and slip velocities of `wrapped_system`."""

    @property
    @abc.abstractmethod
    def wrapped_system(self) -> AbstractSystem:
        """The system whose one-sided constraints these are."""

    def gaps(self, t, q):
        return self.wrapped_system.gaps(t, q)

    def restitution(self):
        return self.wrapped_system.restitution()

    def friction(self):
        return self.wrapped_system.friction()

    def slip_velocities(self, t, q, v):
        return self.wrapped_system.slip_velocities(t, q, v)

    def stop_checks(self):
        return self.wrapped_system.stop_checks()

    def gap_label(self, index):
        return self.wrapped_system.gap_label(index)


class LagrangianSystem(AbstractSystem):
    """A mechanical system `M q̈ + Φ_qᵀ λ + Ψ_vᵀ μ = Q`, `Φ(t, q) = 0`, `Ψ(t, q, v) = 0`.

    Subclass it, declare the physical parameters as fields (JAX arrays, so that gradients
    reach them) and override what the model needs; every method takes `t` first:

    - `kinetic_energy(t, q, v)` **or** `mass_matrix(t, q)` (one is required);
    - `potential_energy(t, q)` (default 0);
    - `generalized_forces(t, q, v)`: non-conservative applied forces (default 0);
    - `constraints(t, q)`: holonomic `Φ`, shape `(m,)` (default: none);
    - `velocity_constraints(t, q, v)`: nonholonomic `Ψ = A(t, q) v + a(t, q)`, shape `(k,)`
        (default: none).

    Each returns one JAX array of that shape (the energies may return a Python number, a
    constant); [`jaxdae.simulate`][] refuses a list or tuple (stack it with `jnp.stack`),
    and forces of another shape than `(n,)` (a scalar is not broadcast), naming the method.
    The methods are traced: write them with `jax.numpy`, and branch on values with
    `jnp.where` or `jax.lax.cond`, not a Python `if`.

    All the matrices of the equations of motion (the mass matrix `∂²T/∂v²`, Coriolis and
    centrifugal terms, `∂V/∂q`, `J = Φ_q`, `Φ_t`, `γ`, `A = Ψ_v`) are derived from these by
    automatic differentiation, also for rheonomic constraints and time-dependent energies.

    !!! Example

        ```python
        class Pendulum(jaxdae.LagrangianSystem):
            mass: jax.Array
            length: jax.Array

            def kinetic_energy(self, t, q, v):
                return 0.5 * self.mass * v @ v

            def potential_energy(self, t, q):
                return self.mass * 9.81 * q[1]

            def constraints(self, t, q):
                return jnp.array([q @ q - self.length**2])
        ```

    !!! Note "Structure"

        For more than 8 coordinates, jaxdae finds the sparsity patterns of `M` and of the
        constraint Jacobians, and whether `M` is constant, from the jaxprs of these methods
        (a structural analysis: valid for every state and parameter value), derives the
        matrices with one directional derivative per colour of their columns, and the
        formulations' linear algebra follows the patterns (a diagonal or block-diagonal `M` is
        inverted block by block, `G M⁻¹ Gᵀ` is assembled from sparse products). The class
        attribute `structured_terms` overrides the choice: `True` uses the patterns at any
        size, `False` never (both give the same matrices).

    !!! Warning "Parameters must be arrays to get gradients"

        Store every parameter you may differentiate or vary as a JAX array: build the model
        with `Pendulum(mass=jnp.array(1.0), length=jnp.array(0.5))`, or convert in
        `__init__` with `jnp.asarray(value, dtype=float)` as `jaxdae.examples` do. Equinox
        treats a field that holds a Python `float` as a static constant: `eqx.filter_grad`
        returns `None` for it without an error, [`jaxdae.tune`][] does not tune it, and
        `eqx.filter_jit` compiles again for every new value.
    """

    # `None`: derive the terms from their sparsity patterns above 8 coordinates; `True`
    # / `False`: always / never (see "Structure" above).
    structured_terms: ClassVar[bool | None] = None
    # A subclass that writes `terms` itself declares `False` (see `AbstractSystem`).
    terms_from_constraints: ClassVar[bool] = True

    def __check_init__(self):
        if not (
            model_defines(self, "kinetic_energy", LagrangianSystem)
            or model_defines(self, "mass_matrix", LagrangianSystem)
        ):
            cls = type(self)
            raise TypeError(
                f"{cls.__name__} must override `kinetic_energy(self, t, q, v)` or "
                "`mass_matrix(self, t, q)`: jaxdae derives the other one from it."
            )

    # -- what the user overrides -------------------------------------------------------

    def kinetic_energy(self, t: ScalarLike, q: Coordinates, v: Velocities) -> Scalar:
        """`T(t, q, v)`. Default: `½ vᵀ M(t, q) v` from `mass_matrix`."""
        return 0.5 * v @ (self.mass_matrix(t, q) @ v)

    def mass_matrix(self, t: ScalarLike, q: Coordinates) -> MassMatrix:
        """`M(t, q) = ∂²T/∂v²`. Default: the Hessian of `kinetic_energy` at `v = 0`."""
        return jax.hessian(self.kinetic_energy, argnums=2)(t, q, jnp.zeros_like(q))

    def potential_energy(self, t: ScalarLike, q: Coordinates) -> Scalar:
        """`V(t, q)`. Default: 0."""
        return jnp.zeros((), q.dtype)

    def generalized_forces(
        self, t: ScalarLike, q: Coordinates, v: Velocities
    ) -> Float[Array, " n"]:
        """Non-conservative applied generalized forces. Default: 0."""
        return jnp.zeros_like(q)

    # -- derived by autodiff -----------------------------------------------------------

    def energy(self, t, q, v):
        return self.kinetic_energy(t, q, v) + self.potential_energy(t, q)

    def momenta(self, t, q, v):
        """`p = ∂T/∂v` (Shemelova's (2016) Legendre transform)."""
        return jax.grad(self.kinetic_energy, argnums=2)(t, q, v)

    def terms(self, t, q, v) -> ConstrainedTerms:
        # Every term comes from ONE batched JVP of the local quantities
        # `(L_q, L_v, Φ, Φ̇, Ψ)` at (t, q, v), `L = T − V`, along 2n + 1 tangents:
        #   (0, 0, e_i) → M = L_vv = T_vv and A = Ψ_v;   (0, e_i, 0) → J = Φ_q;
        #   (1, v, 0)   → d/dt ∂T/∂v − M q̈ = L_vq v + L_vt, −γ (docs/methods.md identity,
        #                 `Φ̇ = Φ_t + Φ_q v` with v held fixed) and Ψ_t + Ψ_q v.
        # (`vmap` of `jvp` computes the unbatched primal once; for the two-link arm it traces
        # in two thirds of the time of `jax.linearize` followed by `vmap` of the linear map.)
        n = q.shape[0]
        mass_given = model_defines(self, "mass_matrix", LagrangianSystem)
        structure = terms_structure(self, t, q, v)

        def lagrangian(t_, q_, v_):
            energies = self.kinetic_energy(t_, q_, v_), self.potential_energy(t_, q_)
            for name, energy in zip(("kinetic_energy", "potential_energy"), energies, strict=False):
                if jnp.shape(energy) != ():  # checked here: no trace of its own
                    raise ValueError(
                        f"`{name}` must return a scalar (shape ()); got shape "
                        f"{jnp.shape(energy)}. Return e.g. `expr[0]` or "
                        "`jnp.sum(expr)`."
                    )
            return energies[0] - energies[1], energies[0] + energies[1]

        def local(t_, q_, v_):
            (lag_q, lag_v), energy = jax.grad(lagrangian, argnums=(1, 2), has_aux=True)(t_, q_, v_)
            phi, dphi = jax.jvp(self.constraints, (t_, q_), (jnp.ones_like(t_), v_))
            psi = self.velocity_constraints(t_, q_, v_)
            return lag_q, lag_v, phi, dphi, psi, energy

        dtype, ttype = q.dtype, jnp.result_type(t)
        if structure is not None:
            with array_form_scope():  # not re-traced as a scalar graph
                return self._structured_terms(structure, local, t, q, v, mass_given)
        eye, zeros = jnp.eye(n, dtype=dtype), jnp.zeros((n, n), dtype)
        tangent_t = jnp.concatenate([jnp.zeros((2 * n,), ttype), jnp.ones((1,), ttype)])
        tangent_q = jnp.concatenate([zeros, eye, v[None]])
        tangent_v = jnp.concatenate([eye, zeros, jnp.zeros((1, n), dtype)])
        (lag_q, lag_v, phi, dphi, psi, energy), (_, d_lag_v, d_phi, d_dphi, d_psi, _) = jax.vmap(
            lambda *tangents: jax.jvp(local, (t, q, v), tangents), out_axes=(None, 0)
        )(tangent_t, tangent_q, tangent_v)
        _require_vector("constraints", phi, "m")
        _require_vector("velocity_constraints", psi, "k")
        momentum_rate, second, psi_rate = d_lag_v[2 * n], d_dphi[2 * n], d_psi[2 * n]
        d_lag_v, d_psi, d_phi = d_lag_v[:n], d_psi[:n], d_phi[n : 2 * n]
        mass = self.mass_matrix(t, q) if mass_given else 0.5 * (d_lag_v + d_lag_v.T)
        # Lagrange: d/dt ∂T/∂v = M q̈ + (∂²T/∂v∂q) v + ∂²T/∂v∂t.
        forces = applied_forces(self, t, q, v) + lag_q - momentum_rate
        jacobian = jnp.concatenate(
            [d_phi.T.reshape(phi.shape[0], n), d_psi.T.reshape(psi.shape[0], n)], axis=0
        )
        bias = jnp.concatenate([-second, -psi_rate])
        # `p = ∂T/∂v = L_v`
        return derived_terms(
            self,
            (mass, forces, phi, dphi, psi, jacobian, bias),
            energy,
            lag_v,
            dtype,
            LagrangianSystem,
        )

    def _structured_terms(self, structure, local, t, q, v, mass_given):
        # As above, with compressed tangents: one per colour of `[M; Ψ_v]`'s columns
        # (`(0, 0, s)`), one per colour of `Φ_q`'s (`(0, s, 0)`), and `(1, v, 0)`. Entry
        # `(i, j)` of a matrix is row `i` of the derivative along the seed of `j`'s colour.
        n, dtype, ttype = q.shape[0], q.dtype, jnp.result_type(t)
        seeds_v = jnp.asarray(colour_matrix(structure.velocity_colours), dtype)
        seeds_q = jnp.asarray(colour_matrix(structure.position_colours), dtype)
        kv, kq = seeds_v.shape[0], seeds_q.shape[0]
        tangent_t = jnp.concatenate([jnp.zeros((kv + kq,), ttype), jnp.ones((1,), ttype)])
        tangent_q = jnp.concatenate([jnp.zeros((kv, n), dtype), seeds_q, v[None]])
        tangent_v = jnp.concatenate([seeds_v, jnp.zeros((kq + 1, n), dtype)])
        (lag_q, lag_v, phi, dphi, psi, energy), (_, d_lag_v, d_phi, d_dphi, d_psi, _) = jax.vmap(
            lambda *tangents: jax.jvp(local, (t, q, v), tangents), out_axes=(None, 0)
        )(tangent_t, tangent_q, tangent_v)
        _require_vector("constraints", phi, "m")
        _require_vector("velocity_constraints", psi, "k")
        m = phi.shape[0]
        momentum_rate, second, psi_rate = d_lag_v[-1], d_dphi[-1], d_psi[-1]
        colours_v = np.asarray(structure.velocity_colours)
        colours_q = np.asarray(structure.position_colours)
        if mass_given:
            mass = SparseMatrix.from_dense(self.mass_matrix(t, q), structure.mass)
        else:
            p = structure.mass
            mass = SparseMatrix(
                take(d_lag_v.reshape(-1), colours_v[p.cols] * n + p.rows), p
            ).symmetrized()
        mass_tags = {lx.symmetric_tag, lx.positive_semidefinite_tag}
        if structure.mass_is_constant:
            mass = SparseMatrix(jax.lax.optimization_barrier(mass.values), mass.pattern)
            mass_tags.add(state_independent_tag)
        g = structure.jacobian
        holonomic = g.rows < m
        k = psi.shape[0]
        values = jnp.concatenate(
            [
                take(
                    d_phi.reshape(-1), (kv + colours_q[g.cols[holonomic]]) * m + g.rows[holonomic]
                ),
                take(d_psi.reshape(-1), colours_v[g.cols[~holonomic]] * k + g.rows[~holonomic] - m),
            ]
        ).astype(dtype)
        jacobian = SparseMatrix(values, g)
        forces = applied_forces(self, t, q, v) + lag_q - momentum_rate
        bias = jnp.concatenate([-second, -psi_rate])
        return derived_terms(
            self,
            (mass.dense(), forces, phi, dphi, psi, jacobian.dense(), bias),
            energy,
            lag_v,
            dtype,
            LagrangianSystem,
            mass_operator=SparseOperator(mass, mass_tags),
            jacobian_operator=SparseOperator(jacobian),
        )


def applied_forces(system, t, q, s) -> Float[Array, " n"]:
    """`system.generalized_forces(t, q, s)`, refused unless of shape `(n,)` (a scalar would
    broadcast to every coordinate)."""
    forces = system.generalized_forces(t, q, s)
    require_output("generalized_forces", forces, (q.shape[0],))
    return forces


@functools.singledispatch
def inertia_minus_forces(
    system: AbstractSystem,
    t: ScalarLike,
    q: Coordinates,
    v: Velocities,
    acceleration: Float[Array, " n"],
) -> Float[Array, " n"] | None:
    """`M(t, q) q̈ − Q(t, q, v)` at `q̈ = acceleration`, computed as products of the model's
    functions without forming `M`, or None where only the system's `terms` give it (the
    default).

    [`jaxdae.GeneralizedAlpha`][] evaluates its step's equations with it at every Newton
    iteration on a system of more than `STRUCTURED_MIN` coordinates whose terms take `Φ`
    and `Ψ` from `constraints` and `velocity_constraints` (`terms_from_constraints`), the
    constraint reactions then being reverse-mode products of those. Dispatched on the type
    of `system` (`functools.singledispatch`), so that a system class of one's own declares
    it by registering it:

    ```python
    jaxdae.extend.inertia_minus_forces.register(MySystem, my_inertia_minus_forces)
    ```

    Registered here: [`jaxdae.LagrangianSystem`][], the Lagrange expression
    `d/dt ∂L/∂v − ∂L/∂q − Q_applied`, `L = T − V`.

    **Arguments:**

    - `system`: the system.
    - `t`, `q`, `v`: the state (velocities `v`).
    - `acceleration`: `q̈`, shape `(n,)`.

    **Returns:**

    Shape `(n,)`, or None.
    """
    del system, t, q, v, acceleration
    return None


@inertia_minus_forces.register(LagrangianSystem)
def _lagrange_expression(system, t, q, v, acceleration):
    # `d/dt ∂L/∂v` is one forward-mode derivative of the gradient of `L` along `(1, v, q̈)`.
    def gradients(t_, q_, v_):
        def lagrangian(y, w):
            return system.kinetic_energy(t_, y, w) - system.potential_energy(t_, y)

        return jax.grad(lagrangian, argnums=(0, 1))(q_, v_)

    (lag_q, _), (_, momentum_rate) = jax.jvp(
        gradients, (t, q, v), (jnp.ones_like(t), v, acceleration)
    )
    return momentum_rate - lag_q - applied_forces(system, t, q, v)


@functools.singledispatch
def terms_in_array_form(
    system: AbstractSystem, t: ScalarLike, q: Coordinates, v: Velocities
) -> bool:
    """Whether the system's `terms` at the shapes of `(t, q, v)` trace its model's
    functions in array form (inside `array_form_scope`) rather than as a scalar graph;
    default False.

    [`jaxdae.Projected`][] then evaluates `constraints` and `velocity_constraints` alone
    in the same form. Dispatched on the type of `system` (`functools.singledispatch`), so
    that a system class of one's own declares it by registering it:

    ```python
    jaxdae.extend.terms_in_array_form.register(MySystem, lambda system, t, q, v: True)
    ```

    Registered here: [`jaxdae.LagrangianSystem`][], whose terms are in array form where
    they are derived from their sparsity patterns (its `structured_terms`).

    **Arguments:**

    - `system`: the system.
    - `t`, `q`, `v`: the state, for its shapes.

    **Returns:**

    A Python bool.
    """
    del system, t, q, v
    return False


@terms_in_array_form.register(LagrangianSystem)
def _structured(system, t, q, v):
    return terms_structure(system, t, q, v) is not None


def derived_terms(
    system, matrices: tuple, energy, momenta, dtype, base: type, **operators
) -> ConstrainedTerms:
    """The `ConstrainedTerms` a system derived, cast to `dtype`: `matrices` are `(M, Q, Φ,
    Φ̇, Ψ, G, bias)`, `operators` the structure found. `energy` and `momenta` come along
    where the derivation computed them anyway, unless the model (a subclass of `base`)
    writes its own (they are then left to its methods)."""
    return cast_floating(
        ConstrainedTerms(
            *matrices,
            energy=None if model_defines(system, "energy", base) else energy,
            momenta=None if model_defines(system, "momenta", base) else momenta,
            **operators,
        ),
        dtype,
    )


def cast_floating(tree, dtype):
    """`tree` with its floating arrays cast to `dtype`: the state's dtype sets the precision,
    also against a model's float64 constants (e.g. `jnp.eye(n)` with float64 enabled) in a
    float32 simulation."""

    def cast(x):
        return x.astype(dtype) if eqx.is_inexact_array(x) and x.dtype != dtype else x

    return jax.tree_util.tree_map(cast, tree)


def holonomic_terms(constraints, t, q, v):
    """`Φ`, `Φ̇`, `J = Φ_q` and `γ = −d²/ds² Φ(t + s, q + s v)|₀` (docs/methods.md identity)."""
    one = jnp.ones_like(t)

    def along_motion(t_, q_):
        return jax.jvp(constraints, (t_, q_), (one, v))

    (phi, dphi), (_, second) = jax.jvp(along_motion, (t, q), (one, v))
    _require_vector("constraints", phi, "m")
    jac = jax.jacfwd(constraints, argnums=1)(t, q)
    return phi, dphi, jac.reshape(phi.shape[0], q.shape[0]), -second


def nonholonomic_terms(velocity_constraints, t, q, v):
    """`Ψ`, `A = Ψ_v` and `Ψ_t + Ψ_q v`, so that `Ψ̇ = A q̈ + Ψ_t + Ψ_q v` for affine `Ψ`."""
    one = jnp.ones_like(t)
    psi, psi_rate = jax.jvp(lambda t_, q_: velocity_constraints(t_, q_, v), (t, q), (one, v))
    _require_vector("velocity_constraints", psi, "k")
    jac = jax.jacfwd(velocity_constraints, argnums=2)(t, q, v)
    return psi, jac.reshape(psi.shape[0], q.shape[0]), psi_rate


def _require_vector(method: str, value, size: str) -> None:
    require_output(method, value, (size,))


_OUTPUT_FIXES = {
    0: "Return one scalar, e.g. `expr[0]` or `jnp.sum(expr)`.",
    1: "Return a 1-D JAX array: stack the entries with `jnp.stack([...])` or "
    "`jnp.array([...])`, and wrap a single one as `jnp.array([expr])` or "
    "`jnp.atleast_1d(expr)`.",
    2: "Return a 2-D JAX array, e.g. `jnp.array([[...], ...])`.",
}


def require_output(method: str, value, shape: tuple[int | str, ...], owner: str = "") -> None:
    """`ValueError` naming the model method `method` (of the class `owner`) unless it
    returned an array of `shape` (a `str` entry, e.g. "m", is a size of any value). A
    Python number passes for a scalar (a constant energy); a list or tuple does not: jaxdae
    differentiates the methods and takes one array from each."""
    expected = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    fix = _OUTPUT_FIXES.get(len(shape), "")
    source = f" from {owner}" if owner else ""
    what = f"a {len(shape)}-D array of shape {expected}" if shape else "a scalar (shape ())"
    if not shape and isinstance(value, (int, float)) and not isinstance(value, bool):
        return
    if not hasattr(value, "shape"):
        got = type(value).__name__
        if isinstance(value, (list, tuple)):
            got = f"a {got} of {len(value)} entr{'y' if len(value) == 1 else 'ies'}"
        raise ValueError(f"`{method}` must return {what}; got {got}{source}. {fix}")
    got = tuple(value.shape)
    if len(got) != len(shape) or any(
        isinstance(s, int) and s != g for s, g in zip(shape, got, strict=True)
    ):
        if method == "generalized_forces" and got == ():
            fix = (
                "It must hold one force per coordinate (a scalar is not broadcast); "
                "return e.g. `jnp.zeros_like(q).at[i].set(f)` for a force on coordinate "
                "`i` alone."
            )
        raise ValueError(f"`{method}` must return {what}; got shape {got}{source}. {fix}")
