"""Constraint-enforcing control through actuator dynamics (Mukharlyamov (2019), §§2–5).

A mechanism `q̇ = v`, `v̇ = a(t, q, v, w)` is driven by actuators with their own state `w`,
`ẇ = b(t, q, v, w) + B(t, q, v, w) u` (Mukharlyamov (2019), eq. [2.1]). The goal of the control `u` is a
set of *program constraints* `f(t, q, v) = 0` (eqs. [2.3]–[2.4]). `u` reaches `f` only through
the actuators, so it first appears in the derivative of order `ρ` (the relative degree) of
`f` along the motion: `f⁽ᵖ⁾ = L_X^ρ f + g u` with the decoupling matrix
`g = ∂(f⁽ᵖ⁻¹⁾)/∂w · B` (eqs. [2.8]–[2.9]; for the adaptive-optics element of §5, `ρ = 4` and
`g = 2 c s(t) sin φ k_a/(L m l²)`, eq. [5.6]).

[`jaxdae.ConstraintEnforcingControl`][] chooses `u` so that the perturbations
`y = (f, ḟ, …, f⁽ᵖ⁻¹⁾)` obey the linear equation `f⁽ᵖ⁾ + K_{ρ−1} f⁽ᵖ⁻¹⁾ + … + K_0 f = 0`
(eqs. [3.4]–[3.5], [3.12], [5.8]), i.e. `ẏ = H y` with `H` in companion form: the
minimum-norm solution `u = gᵀ(g gᵀ)⁻¹(−Σ K_j f⁽ʲ⁾ − L_X^ρ f)` of eq. [2.11] (`g⁻¹` when `g`
is square). All derivatives are Lie derivatives computed by automatic differentiation
(nested `jax.jvp` along the drift): the user writes `f`, the mechanism's energies and the
actuator equations, never `f⁽ᵏ⁾` or `g` by hand. With all gains zero this is the
unstabilized law of eq. [2.9], for which the constraints are only first integrals.
"""

import abc
import functools
import math
from collections.abc import Callable, Sequence

import diffrax
import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import check_finite, check_instance, check_positive
from .._compilation._linalg import (
    extreme_eigenvalues,
    full_precision,
    not_hurwitz,
    reciprocal_condition,
    spd_solve,
)
from .._compilation._scalarize import scalarize
from .._custom_types import Array, ArrayLike, Float, Gain, GainLike, Int, ScalarLike
from .._formulations._multipliers import default_rcond
from .._gains import (
    as_gain,
    attach_checks,
    check_gain_size,
    check_gain_structure,
    gain_matrix,
    is_concrete,
    uncoupled_companions,
)
from .._solution import RESULTS
from .._systems._system import LagrangianSystem, cast_floating
from ._adjoint import forward_mode_hint, jit_unless_staged
from ._diagnostics import at_valid, masked, saved_rows
from ._failures import raise_failure
from ._simulate import Dynamics, SolveCall, in_current_mesh, integrate
from ._validation import float_array


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


class ConstraintEnforcingControl(eqx.Module):
    """Constraint stabilization through actuator dynamics (Mukharlyamov (2019), eqs. [2.9]–[2.11],
    [3.4]–[3.5], [5.7]–[5.8]).

    The input `u` makes the program constraints' perturbations obey
    `f⁽ᵖ⁾ + K_{ρ−1} f⁽ᵖ⁻¹⁾ + … + K_1 ḟ + K_0 f = 0`, `ρ = len(gains)` the relative degree
    (the order of the first derivative of `f` in which `u` appears): in the paper's notation
    `y⁽ᵖ⁾ = Σ_β h_β y⁽ᵝ⁻¹⁾` with `h_β = −K_{β−1}`. The perturbations decay when the
    companion matrix `H` ([`jaxdae.perturbation_matrix`][]) is Hurwitz; under a fixed-step
    method they stay bounded only when the spectral radius of its transition `R(τH)` is
    below 1 (Mukharlyamov (2019), §4; [`jaxdae.transition_matrix`][]).

    `u = gᵀ(g gᵀ)⁻¹(−Σ_j K_j f⁽ʲ⁾ − L_X^ρ f)`, the minimum-norm input (eq. [2.11]; `g⁻¹`
    for as many inputs as constraints). It fails where `g gᵀ` is singular (in §5: at
    `s(t) = 0` or `sin φ = 0`): [`jaxdae.simulate_actuated`][] stops there with
    `RESULTS.singular_decoupling_matrix`.

    **Arguments:**

    - `gains`: `(K_0, …, K_{ρ−1})`, each a scalar, a vector (one value per constraint) or a
        matrix; their number is the relative degree `ρ`. For grouped program constraints,
        one such sequence per group (`order` is then a tuple). The companion matrix must be
        Hurwitz, except that all gains zero gives the unstabilized law of eq. [2.9] for
        comparison. Concrete gains are checked here, traced ones (under `jit`/`vmap`/`grad`,
        e.g. in [`jaxdae.tune`][]) by [`jaxdae.simulate_actuated`][] through `eqx.error_if`
        (a run-time error). When tuning, keep them Hurwitz by construction: tune the poles
        of `from_poles` (or the `rate` of `with_poles`), or penalize with
        [`jaxdae.DiscreteStability`][] for explicit Euler, since `ρ(I + τH) < 1` implies
        that `H` is Hurwitz.
    - `null_space_input`: optional `(t, q, v, w) -> u₀`, shape `(s,)`, for more inputs than
        constraints: its component in the null space of `g`, `(I − gᵀ(ggᵀ)⁻¹g) u₀`, is
        added (the free part `u⁰u^τ` of eq. [2.10]); it does not affect the constraints
        (e.g. a co-contraction of redundant actuators, or an effort-shaping term).
    - `rcond`: `g gᵀ` counts as singular when its smallest eigenvalue falls below `rcond`
        times its largest at the initial state, or its reciprocal condition number at the
        initial state is below `rcond` (default `sqrt(machine epsilon)`).
    """

    gains: tuple[Gain, ...] | tuple[tuple[Gain, ...], ...]
    rcond: float | None = eqx.field(static=True, default=None)
    null_space_input: Callable | None = None

    def __init__(self, gains: Sequence[GainLike] | Sequence[Sequence[GainLike]],
                 rcond: float | None = None, null_space_input: Callable | None = None):
        def convert(group, name):
            if isinstance(group, (jax.Array, np.ndarray)) or not isinstance(group, Sequence):
                raise ValueError(
                    f"`{name}` must be a list or tuple `(K_0, …, K_{{ρ−1}})`, one gain per "
                    f"derivative of the program constraints; got {type(group).__name__}. For "
                    "the relative degree ρ = 4 of Mukharlyamov (2019) §5, e.g. "
                    "`ConstraintEnforcingControl.with_poles(10.0, order=4)`."
                )
            if len(group) == 0:
                raise ValueError(f"`{name}` must hold at least one gain (relative degree ≥ 1).")
            group = tuple(as_gain(k) for k in group)
            for j, gain in enumerate(group):
                check_gain_structure(f"{name}[{j}]", gain)
            return group

        grouped = (isinstance(gains, Sequence) and len(gains) > 0
                   and all(isinstance(g, (list, tuple)) for g in gains))
        self.gains = (tuple(convert(g, f"gains[{i}]") for i, g in enumerate(gains))
                      if grouped else convert(gains, "gains"))
        self.rcond = rcond
        self.null_space_input = null_space_input
        if is_concrete(self.gains):
            self._check_hurwitz()

    @classmethod
    def with_poles(cls, rate: GainLike, order: int, rcond: float | None = None,
                   null_space_input: Callable | None = None) -> "ConstraintEnforcingControl":
        """The gains whose characteristic polynomial is `(μ + rate)^order` (one `order`-fold
        pole at `−rate`, per constraint when `rate` is a vector): the choice of Ascher, Chin
        and Reich that Mukharlyamov (2019) recommends (eqs. [0.8]–[0.10]); `K_j = C(order, j)
        rate^(order − j)`."""
        rate = as_gain(rate)
        if rate.ndim > 1:
            raise ValueError(f"`rate` must be a scalar or a vector; got shape {rate.shape}.")
        return cls([math.comb(order, j) * rate ** (order - j) for j in range(order)], rcond,
                   null_space_input)

    @classmethod
    def from_poles(cls, poles, rcond: float | None = None,
                   null_space_input: Callable | None = None) -> "ConstraintEnforcingControl":
        """The scalar gains whose characteristic polynomial `Π (μ − p_i)` has the given
        poles (their number is the relative degree): real poles, or complex ones in
        conjugate pairs. Differentiable in the poles, so tuning them (e.g. the logarithms of
        `−p_i`) keeps the perturbation equation stable by construction."""
        poles = jnp.asarray(poles)
        if poles.ndim != 1 or poles.shape[0] == 0:
            raise ValueError(f"`poles` must be a non-empty 1-D array; got shape {poles.shape}.")
        coefficients = jnp.ones((1,), poles.dtype)  # of μ^k, highest power first
        for pole in poles:
            coefficients = (jnp.concatenate([coefficients, jnp.zeros((1,), poles.dtype)])
                            - pole * jnp.concatenate([jnp.zeros((1,), poles.dtype), coefficients]))
        if jnp.iscomplexobj(coefficients):
            if is_concrete(coefficients) and np.max(np.abs(np.imag(np.asarray(coefficients)))
                                                    ) > 1e-9 * np.max(np.abs(coefficients)):
                raise ValueError("Complex `poles` must come in conjugate pairs (the gains are "
                                 "real); got " + np.array2string(np.asarray(poles)) + ".")
            coefficients = jnp.real(coefficients)
        return cls(list(coefficients[1:][::-1]), rcond, null_space_input)

    @property
    def grouped(self) -> bool:
        """Whether `gains` holds one gain sequence per group of program constraints."""
        return isinstance(self.gains[0], tuple)

    @property
    def groups(self) -> tuple[tuple[Gain, ...], ...]:
        """The gain sequences, one per group of program constraints."""
        return self.gains if self.grouped else (self.gains,)

    @property
    def order(self) -> int | tuple[int, ...]:
        """The relative degree `ρ` (one per group for grouped gains)."""
        orders = tuple(len(group) for group in self.groups)
        return orders if self.grouped else orders[0]

    def _check_hurwitz(self):
        for i, group in enumerate(self.groups):
            name = f"gains[{i}]" if self.grouped else "gains"
            gains = [np.asarray(k) for k in group]
            if all(np.all(k == 0) for k in gains):
                continue
            sizes = {k.shape[0] for k in gains if k.ndim >= 1}
            size = sizes.pop() if len(sizes) == 1 else (1 if not sizes else None)
            if size is None:
                raise ValueError(
                    f"`{name}` have different sizes; vector and matrix gains must all have "
                    "one row per program constraint."
                )
            with jax.ensure_compile_time_eval():  # also inside a `jit` trace
                matrix = np.asarray(_companion(group, size, name))
            if not np.all(np.isfinite(matrix)):
                raise ValueError(f"`{name}` must be finite.")
            largest = float(np.max(np.linalg.eigvals(matrix).real))
            if largest >= 0:
                raise ValueError(
                    f"The perturbation equation `f⁽ᵖ⁾ + Σ K_j f⁽ʲ⁾ = 0` of `{name}` is not "
                    f"asymptotically stable (largest real part of an eigenvalue of H: "
                    f"{largest:.4g}); the constraints would not be restored (Mukharlyamov (2019), §3). "
                    "Use e.g. `ConstraintEnforcingControl.with_poles(rate, order)`, or all "
                    "gains zero for the unstabilized law."
                )

    def validate(self, num_constraints: int | Sequence[int]) -> "ConstraintEnforcingControl":
        """Checks the gains' sizes against `num_constraints` (one per group for grouped
        gains) and returns the control. Concrete gains were checked for stability at
        construction; traced ones (under `jit`, `vmap`, `grad`) come back wrapped in one
        `eqx.error_if` (`attach_checks`), which raises at run time unless each group's companion matrix is
        Hurwitz or all its gains are zero (Lyapunov's test, as for
        [`jaxdae.CoupledPerturbation`][]; for scalar and vector gains, constraint by
        constraint)."""
        self.perturbation_matrix(num_constraints)  # raises for gains of the wrong size
        if is_concrete(self.gains):
            return self
        sizes = tuple(num_constraints) if self.grouped else (num_constraints,)
        bad = jnp.asarray(False)
        for i, (group, size) in enumerate(zip(self.groups, sizes, strict=False)):
            blocks = uncoupled_companions(group, size, jnp.result_type(*group))
            companion = jax.lax.stop_gradient(
                _companion(group, size, f"gains[{i}]") if blocks is None else blocks)
            unstabilized = jnp.all(jnp.stack([jnp.all(k == 0) for k in group]))
            bad = bad | (not_hurwitz(companion, jnp) & ~unstabilized)
        message = ("The perturbation equation `f⁽ᵖ⁾ + Σ K_j f⁽ʲ⁾ = 0` of the traced "
                   "`ConstraintEnforcingControl` gains is not asymptotically stable (H is not "
                   "Hurwitz): the constraints would not be restored (Mukharlyamov (2019), §3). Tune "
                   "the poles of `ConstraintEnforcingControl.from_poles` to keep the gains "
                   "stable by construction.")
        # One check for all the gains (one `lax.cond` with host callbacks each).
        return eqx.tree_at(lambda c: c.gains, self, attach_checks(self.gains, [(bad, message)]))

    def perturbation_matrix(self, num_constraints: int | Sequence[int]) -> Float[Array, "d d"]:
        """`H` of `ẏ = H y`, `y = (f, ḟ, …, f⁽ᵖ⁻¹⁾)`, shape `(ρr, ρr)` (eqs. [3.12], [5.8]);
        for grouped gains pass one size per group: `H` is block diagonal, one companion
        block per group, `y` the groups' perturbations one after the other."""
        sizes = tuple(num_constraints) if self.grouped else (num_constraints,)
        if len(sizes) != len(self.groups):
            raise ValueError(
                f"`num_constraints` must give one size per group of gains ({len(self.groups)}); "
                f"got {num_constraints}."
            )
        blocks = [_companion(group, r, f"gains[{i}]" if self.grouped else "gains")
                  for i, (group, r) in enumerate(zip(self.groups, sizes, strict=False))]
        return jax.scipy.linalg.block_diag(*blocks)

    def outputs(self, system: ActuatedSystem, t, q, v, w):
        """`(u, y)` at a state: the input and the perturbations `y = (f, …, f⁽ᵖ⁻¹⁾)`
        (shape `(ρ, r)`; a tuple over groups for grouped gains)."""
        orders = tuple(len(group) for group in self.groups)
        values, rates, input_gains = lie_derivatives(system, max(orders), t, (q, v, w))
        ys, rows, rhs = [], [], []
        for i, (group, order) in enumerate(zip(self.groups, orders, strict=False)):
            y = jnp.stack([values[k][i] for k in range(order)])
            target = -sum(k * yj if k.ndim <= 1 else k @ yj for k, yj in zip(group, y, strict=False))
            ys.append(y)
            rows.append(input_gains[order - 1][i])
            rhs.append(target - rates[order - 1][i])
        g = jnp.concatenate(rows)
        gram = g @ g.T
        # `g gᵀ` is SPD where `g` has full row rank: an unrolled Cholesky for small `r`
        # (a LAPACK call per right-hand side otherwise).
        u = g.T @ spd_solve(gram, jnp.concatenate(rhs))
        if self.null_space_input is not None:  # eq. [2.10]: add its part in the null space of g
            free = self.null_space_input(t, q, v, w)
            u = u + free - g.T @ spd_solve(gram, g @ free)
        return u, tuple(ys) if self.grouped else ys[0]


def _companion(gains: tuple[Gain, ...], size: int, name: str) -> Float[Array, "d d"]:
    """The companion matrix of `f⁽ᵖ⁾ + Σ K_j f⁽ʲ⁾ = 0` for `size` constraints."""
    order, dtype = len(gains), jnp.result_type(*gains)
    for j, gain in enumerate(gains):
        check_gain_size(f"{name}[{j}]", gain, size, "program constraints")
    shift = jnp.eye(order * size, k=size, dtype=dtype)[: (order - 1) * size]
    last = jnp.concatenate([-gain_matrix(k, size, dtype) for k in gains], axis=1)
    return jnp.concatenate([shift, last], axis=0)


def _program_residual(system, control, t, x):
    """`y = (f, …, f⁽ᵖ⁻¹⁾)` of every group, flattened."""
    orders = tuple(len(group) for group in control.groups)
    values = lie_derivatives(system, max(orders), t, x)[0]
    return jnp.concatenate([values[k][i] for i, order in enumerate(orders)
                            for k in range(order)])


def _kkt_residual(y, args):
    """KKT conditions of `min ½ (x − x0)ᵀ W (x − x0)` s.t. `y(x) = 0`, `W = diag(metric)`
    (in the flattened state)."""
    x, lam = y
    system, control, t0, x0, metric, unravel = args
    residual, vjp = jax.vjp(lambda x_: _program_residual(system, control, t0, unravel(x_)), x)
    return metric * (x - x0) + vjp(lam)[0], residual


@eqx.filter_jit
def _programmed_state(system, control, t0, guess, weights, tol, max_steps):
    """Newton's method on `_kkt_residual` from the `guess = (q0, v0, w0)`: the state, its
    residual `y` and optimistix's result."""
    # Flattened inside the trace: an `unravel` made outside would be a new static argument,
    # and a recompilation, at every call.
    x0, unravel = jax.flatten_util.ravel_pytree(guess)
    metric, _ = jax.flatten_util.ravel_pytree(weights)
    lam0 = jnp.zeros_like(_program_residual(system, control, t0, unravel(x0)))
    solver = optx.Newton(rtol=0.1 * tol, atol=0.1 * tol,
                         linear_solver=lx.AutoLinearSolver(well_posed=False))
    sol = optx.root_find(_kkt_residual, solver, (x0, lam0),
                         args=(system, control, t0, x0, metric, unravel), max_steps=max_steps,
                         throw=False)
    x = sol.value[0]
    return unravel(x), _program_residual(system, control, t0, unravel(x)), sol.result


def _initial_state(q0, v0, w0):
    """`(q0, v0, w0)` as 1-D floating arrays of one dtype, `q0` and `v0` of one shape;
    concrete values must be finite."""
    q0, v0, w0 = (float_array(name, value) for name, value in
                  (("q0", q0), ("v0", v0), ("w0", w0)))
    if q0.shape != v0.shape:
        raise ValueError(
            f"`q0` and `v0` must have the same shape (n,); got {q0.shape} and {v0.shape}.")
    for name, value in (("q0", q0), ("v0", v0), ("w0", w0)):
        check_finite(name, value)
    dtype = jnp.result_type(q0, v0, w0)
    return q0.astype(dtype), v0.astype(dtype), w0.astype(dtype)


def _metric_weights(weights, state):
    """`weights` (default ones) broadcast to the shapes of `state = (q, v, w)`; concrete
    weights must be positive and finite."""
    if weights is None:
        return tuple(jnp.ones_like(x) for x in state)
    if not (isinstance(weights, (tuple, list)) and len(weights) == 3):
        raise ValueError("`weights` must be a tuple `(w_q, w_v, w_w)` of the metric's weights "
                         f"for q, v and w; got {weights!r}.")
    out = []
    for name, weight, x in zip(("w_q", "w_v", "w_w"), weights, state, strict=False):
        weight = jnp.asarray(weight, x.dtype)
        try:
            weight = jnp.broadcast_to(weight, x.shape)
        except ValueError:
            raise ValueError(f"`weights`: {name} must be a scalar or have shape {x.shape}; "
                             f"got shape {weight.shape}.") from None
        values = np.asarray(weight) if is_concrete(weight) else None
        if values is not None and not (np.all(values > 0) and np.all(np.isfinite(values))):
            raise ValueError(f"`weights`: {name} must be positive and finite; got {weight}.")
        out.append(weight)
    return tuple(out)


_NOT_PROGRAMMED = (
    "No state on the programmed motion found near the guess: {detail}. The program "
    "constraints may have no solution near it (e.g. a configuration the mechanism cannot "
    "reach): choose a closer guess."
)


@full_precision
def consistent_actuated_state(
    system: ActuatedSystem,
    control: ConstraintEnforcingControl,
    t0: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    w0: Float[ArrayLike, " k"],
    *,
    weights: tuple[ArrayLike, ArrayLike, ArrayLike] | None = None,
    tol: float | None = None,
    max_steps: int = 64,
) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, " k"]]:
    """The state nearest to `(q0, v0, w0)` (in the metric `weights`) on the programmed motion:
    `f = ḟ = … = f⁽ᵖ⁻¹⁾ = 0` for every group (Mukharlyamov (2019), eq. [2.5]), the start for which
    even the unstabilized law of eq. [2.9] keeps the constraints.

    Newton's method (optimistix) on the KKT conditions of `min ½ (x − x0)ᵀ W (x − x0)`
    subject to those equations, with least-squares linear solves. When the equations fix the
    whole state (as in the adaptive-optics element: four equations, four states) the result
    is the unique programmed state, whatever the metric. When they leave some of it free,
    the metric says what to keep: positions, velocities and actuator states have different
    units, and a large weight keeps that part of the guess.

    **Arguments:**

    - `system`, `control`: as for [`jaxdae.simulate_actuated`][] (the control's relative
        degrees say how many derivatives vanish).
    - `t0`, `q0`, `v0`, `w0`: the time and the guess.
    - `weights`: `(w_q, w_v, w_w)`, the positive diagonal of `W` for `q`, `v` and `w`
        (scalars or arrays of their shapes); default all ones (the Euclidean norm).
    - `tol`: accepted `max |f⁽ᵏ⁾|`; default `1e3 · eps`, scaled by the size of the guess.
    - `max_steps`: Newton iterations.

    **Returns:**

    `(q, v, w)`.

    **Raises:**

    `ValueError` if no such state is found near the guess; under `jax.jit`, `jax.vmap` or
    `jax.grad` (which it supports, as [`jaxdae.consistent_initial_state`][] does) a runtime
    error with the same message.
    """
    q0, v0, w0 = _initial_state(q0, v0, w0)
    dtype = q0.dtype
    t0 = jnp.asarray(t0, dtype)
    system, control = cast_floating((system, control), dtype)
    check_finite("t0", t0)
    check_positive("tol", tol, "residual")
    weights = _metric_weights(weights, (q0, v0, w0))
    _check_system(system, control, t0, q0, v0, w0)
    if tol is None:
        size = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in (q0, v0, w0)]))
        tol = 1e3 * float(jnp.finfo(dtype).eps) * (1.0 + size)
    tol = jax.lax.stop_gradient(jnp.asarray(tol, dtype))
    state, residual, result = _programmed_state(system, control, t0, (q0, v0, w0), weights, tol,
                                                max_steps)
    worst = jnp.max(jnp.abs(residual), initial=0.0)
    failed = ~(worst <= tol)  # also NaN
    if not is_concrete(failed):
        return eqx.error_if(state, failed, _NOT_PROGRAMMED.format(
            detail="max|f⁽ᵏ⁾| > tol after the Newton projection"))
    if failed:
        raise ValueError(_NOT_PROGRAMMED.format(
            detail=f"after Newton projection max|f⁽ᵏ⁾| = {float(worst):.3g} > tol = "
                   f"{float(tol):.3g} ({optx.RESULTS[result]!s})"))
    return state


class ActuatedSolution(eqx.Module):
    """The result of [`jaxdae.simulate_actuated`][]. Rows after a failure are `inf`.

    **Fields:**

    - `ts`: saved times, shape `(N,)`.
    - `q`, `v`, `w`: coordinates, velocities and actuator states, shapes `(N, n)`, `(N, n)`,
        `(N, k)`.
    - `u`: the input, shape `(N, s)`.
    - `residuals`: the perturbations `(f, ḟ, …, f⁽ᵖ⁻¹⁾)` of the program constraints,
        shape `(N, ρ, r)`; a tuple of those, one per group, for grouped constraints.
    - `t_final`, `q_final`, `v_final`, `w_final`: where the solve ended.
    - `result`: a [`jaxdae.RESULTS`][] item; `stats`: diffrax's step statistics.
    """

    ts: Float[Array, " N"]
    q: Float[Array, "N n"]
    v: Float[Array, "N n"]
    w: Float[Array, "N k"]
    u: Float[Array, "N s"]
    residuals: Float[Array, "N order r"] | tuple[Float[Array, "N order r"], ...]
    t_final: Float[Array, ""]
    q_final: Float[Array, " n"]
    v_final: Float[Array, " n"]
    w_final: Float[Array, " k"]
    result: RESULTS
    stats: dict[str, Int[Array, ""]]

    @property
    def succeeded(self):
        """Boolean array: the solve reached `t1`."""
        return self.result == RESULTS.successful


def _closed_loop(system, control, t, q, v, w):
    u, _ = control.outputs(system, t, q, v, w)
    _, acceleration, drift = system.drift(t, (q, v, w))
    return v, acceleration, drift + system.input_matrix(t, q, v, w) @ u


# As for `simulate`: traced once, re-traced as scalar graphs for small systems.
_rates = eqx.filter_jit(scalarize(_closed_loop))
_outputs = eqx.filter_jit(scalarize(lambda system, control, t, q, v, w: control.outputs(
    system, t, q, v, w)))


def _vector_field(t, x, args):
    system, control, _ = args
    return _rates(system, control, t, *x)


def _decoupling_eigenvalues(system, control, t, q, v, w):
    """The smallest and largest eigenvalue of `g gᵀ`."""
    orders = tuple(len(group) for group in control.groups)
    input_gains = lie_derivatives(system, max(orders), t, (q, v, w))[2]
    g = jnp.concatenate([input_gains[order - 1][i] for i, order in enumerate(orders)])
    return extreme_eigenvalues(g @ g.T)


_eigenvalues = eqx.filter_jit(scalarize(_decoupling_eigenvalues))


def _singular(t, x, args, **kwargs):
    """`g gᵀ` lost rank: its smallest eigenvalue fell below `rcond` times its largest at
    the initial state (a relative test also for one constraint, where `g gᵀ` is 1 × 1)."""
    system, control, initial_largest = args
    smallest, _ = _eigenvalues(system, control, t, *x)
    return smallest < default_rcond(control.rcond, smallest.dtype) * initial_largest


@eqx.filter_jit
def _input_reach(system, control, t, q, v, w):
    """For `k < ρ`: the largest entry of `∂f⁽ᵏ⁾/∂w · B` (zero below the relative degree) and
    of `f⁽ᵏ⁺¹⁾` (for scale); the reciprocal condition of `g gᵀ`."""
    orders = tuple(len(group) for group in control.groups)
    _, rates, input_gains = lie_derivatives(system, max(orders), t, (q, v, w))
    # (derivative, group) tables
    reach = jnp.stack([jnp.stack([jnp.max(jnp.abs(g)) for g in row]) for row in input_gains])
    scale = jnp.stack([jnp.stack([jnp.max(jnp.abs(f)) for f in row]) for row in rates])
    g = jnp.concatenate([input_gains[order - 1][i] for i, order in enumerate(orders)])
    return reach, scale, reciprocal_condition(g @ g.T)


def _check_system(system, control, t0, q0, v0, w0):
    """Structure and, for concrete values, the relative degree at the initial state; returns
    the control with its traced gains checked (`ConstraintEnforcingControl.validate`)."""
    check_instance("system", system, ActuatedSystem, "a `jaxdae.ActuatedSystem`")
    check_instance("control", control, ConstraintEnforcingControl,
                   "a `jaxdae.ConstraintEnforcingControl`")
    terms = jax.eval_shape(system.mechanism.terms, t0, q0, v0)
    if terms.phi.shape[0] or terms.psi.shape[0]:
        raise ValueError(
            "The `mechanism` of an `ActuatedSystem` must have no constraints of its own (its "
            "`constraints`/`velocity_constraints` give shapes "
            f"{terms.phi.shape}/{terms.psi.shape}); state the goals of the control as "
            "`program_constraints`."
        )
    forces = jax.eval_shape(system.actuator_forces, t0, q0, v0, w0).shape
    if forces != q0.shape:
        raise ValueError(f"`actuator_forces` must return shape {q0.shape}, one force per "
                         f"coordinate; got {forces}.")
    drift = jax.eval_shape(system.actuator_drift, t0, q0, v0, w0).shape
    if drift != w0.shape:
        raise ValueError(
            f"`w0` has shape {w0.shape} but `actuator_drift` returns shape {drift}: `w0` "
            "must hold one value per actuator state.")
    inputs = jax.eval_shape(system.input_matrix, t0, q0, v0, w0).shape
    if len(inputs) != 2 or inputs[0] != w0.shape[0]:
        raise ValueError(
            f"`input_matrix` must return shape (k, s) = ({w0.shape[0]}, s); got {inputs}.")
    shapes = [g.shape for g in jax.eval_shape(constraint_groups, system, t0, (q0, v0, w0))]
    if any(len(shape) != 1 or shape[0] == 0 for shape in shapes):
        raise ValueError("`program_constraints` must return an array of shape (r,), r ≥ 1, or "
                         f"a tuple of such groups; got shapes {shapes}.")
    if len(shapes) != len(control.groups) or (len(shapes) > 1 and not control.grouped):
        raise ValueError(
            f"`program_constraints` returns {len(shapes)} group(s) but the control has "
            f"{len(control.groups)} gain sequence(s): pass one sequence `(K_0, …, K_{{ρ−1}})` "
            "per group (groups may differ in relative degree, e.g. holonomic and velocity "
            "goals, Mukharlyamov (2019) eqs. [2.3]–[2.4])."
        )
    sizes = [shape[0] for shape in shapes]
    if sum(sizes) > inputs[1]:
        raise ValueError(
            f"{sum(sizes)} program constraints need at least as many inputs; `input_matrix` "
            f"has {inputs[1]} columns (Mukharlyamov (2019) requires the rows of g = ψ_w B to be "
            "linearly independent, eq. [2.9])."
        )
    control = control.validate(sizes if control.grouped else sizes[0])
    if not is_concrete(system, control, t0, q0, v0, w0):
        return control
    reach, scale, rcond = (np.asarray(a) for a in _input_reach(system, control, t0, q0, v0, w0))
    for i, group in enumerate(control.groups):
        which = f" (group {i})" if control.grouped else ""
        for k in range(len(group) - 1):
            if reach[k, i] > 1e-8 * (1.0 + scale[k, i]):
                raise ValueError(
                    f"The input first appears in derivative {k + 1} of "
                    f"`program_constraints`{which}, so their relative degree is {k + 1}, but "
                    f"the gains have {len(group)} entries: pass {k + 1} gains (e.g. "
                    f"`ConstraintEnforcingControl.with_poles(rate, order={k + 1})`)."
                )
    if not float(rcond) >= default_rcond(control.rcond, q0.dtype):
        raise ValueError(
            f"The decoupling matrix g = ∂f⁽ᵖ⁻¹⁾/∂w · B is singular at the initial state "
            f"(reciprocal condition of g gᵀ: {float(rcond):.3g}), so the input cannot "
            f"enforce the program constraints there: either a relative degree is larger "
            f"than {control.order} (the input does not appear in that derivative), or the "
            "initial state is a singular configuration (Mukharlyamov (2019) §5: s(t) = 0 or "
            "sin φ = 0)."
        )
    return control


@full_precision
@in_current_mesh
def simulate_actuated(
    system: ActuatedSystem,
    control: ConstraintEnforcingControl,
    t0: ScalarLike,
    t1: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    w0: Float[ArrayLike, " k"],
    *,
    ts: Float[ArrayLike, " N"] | None = None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: ScalarLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
) -> ActuatedSolution:
    """Simulates an actuated system under constraint-enforcing control (Mukharlyamov (2019), eq.
    [2.12] with the stabilized input of [3.4]–[3.5]), with diffrax.

    Works under `jax.jit`, `jax.vmap` and `jax.grad` (w.r.t. the gains, the system's
    parameters and the initial state).

    **Arguments:**

    - `system`: a [`jaxdae.ActuatedSystem`][].
    - `control`: a [`jaxdae.ConstraintEnforcingControl`][]; its number of gains must be the
        relative degree of `system.program_constraints`.
    - `t0`, `t1`: start and end time, `t1 > t0`.
    - `q0`, `v0`, `w0`: initial coordinates, velocities and actuator state. They need not
        satisfy the program constraints: the control pulls the motion back.
    - `ts`, `solver`, `stepsize_controller`, `dt0`, `rtol`, `atol`, `max_steps`, `adjoint`,
        `throw`: as for [`jaxdae.simulate`][]. For a fixed-step method pass e.g.
        `solver=diffrax.Euler(), stepsize_controller=diffrax.ConstantStepSize(), dt0=τ`.
        The default adjoint for explicit Runge–Kutta solvers, [`jaxdae.ReverseSweepAdjoint`][],
        gives `diffrax.RecursiveCheckpointAdjoint`'s gradient faster: for the adaptive-optics
        element's gains and actuator state it compiled in 4–5 s instead of 12–14 s and ran
        1.3–1.7× faster (`experiments/bench_solves.py`, 2-core CPU, with all steps stored),
        agreeing to rounding.

    **Returns:**

    An [`jaxdae.ActuatedSolution`][].

    **Raises:**

    `ValueError` for bad input (shapes, non-finite values, a mechanism with constraints of
    its own, a number of gains that is not the relative degree, a singular decoupling
    matrix at the initial state, non-finite times, `t1 <= t0`, unsorted `ts`, negative or
    zero tolerances); [`jaxdae.SimulationError`][] with `throw=True` when the solve fails
    (e.g. `g gᵀ` becomes singular on the way).
    """
    call = SolveCall(ts=ts, ensemble=False, solver=solver,
                     stepsize_controller=stepsize_controller, dt0=dt0, rtol=rtol, atol=atol,
                     max_steps=max_steps, adjoint=adjoint, throw=throw)
    q0, v0, w0 = _initial_state(q0, v0, w0)
    dtype = q0.dtype
    times = call.times(t0, t1, dtype)
    call.check_options()
    # The state's dtype sets the precision: float32 states give a float32 simulation.
    system, control = cast_floating((system, control), dtype)
    control = _check_system(system, control, times.t0, q0, v0, w0)
    options = call.options(dtype)
    with forward_mode_hint():
        sol = _simulate_actuated(system, control, times, (q0, v0, w0), options)
    return raise_failure(sol) if throw else sol


# The actuated system's ODE on the common solve path: `args = (system, control, λ_max)`, the
# largest eigenvalue of `g gᵀ` at the start the scale of `_singular`'s test.
_DYNAMICS = Dynamics(_vector_field, (_singular,), (RESULTS.singular_decoupling_matrix,))


@jit_unless_staged
def _simulate_actuated(system, control, times, y0, options) -> ActuatedSolution:
    """The solve (`integrate`) and its `ActuatedSolution`."""
    t0 = times.t0
    # The scale of `_singular`'s test: a constant of the gradient, as the event is.
    initial_largest = jax.lax.stop_gradient(_eigenvalues(system, control, t0, *y0)[1])
    out, result = integrate(_DYNAMICS, (system, control, initial_largest), y0, times, options)
    ts_out, ys, (t_final, y_final) = saved_rows(
        times.ts, (out.ts, out.ys), out.result == diffrax.RESULTS.successful)
    # Rows the solve did not reach are inf: evaluate at the initial state, then mask.
    valid = jnp.isfinite(ts_out)
    u, residuals = jax.vmap(_outputs, in_axes=(None, None, 0, 0, 0, 0))(
        system, control, *at_valid(valid, (ts_out, *ys), (t0, *y0)))
    (q, v, w), (q_final, v_final, w_final) = ys, y_final
    return ActuatedSolution(
        ts=ts_out, q=q, v=v, w=w, u=masked(valid, u),
        residuals=jax.tree.map(functools.partial(masked, valid), residuals),
        t_final=t_final, q_final=q_final, v_final=v_final, w_final=w_final,
        result=result, stats=out.stats,
    )
