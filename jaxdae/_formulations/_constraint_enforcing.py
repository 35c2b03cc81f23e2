"""Constraint-enforcing control: the inputs that make the program constraints obey a
linear, Hurwitz perturbation equation (Mukharlyamov (2019), eqs. [3.12], [5.8])."""

import math
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

from .._compilation._linalg import spd_solve
from .._compilation._stability import not_hurwitz
from .._custom_types import Array, Float, Gain, GainLike
from .._gains import (
    as_gain,
    attach_checks,
    check_gain_size,
    check_gain_structure,
    gain_matrix,
    is_concrete,
    uncoupled_companions,
)
from .._systems._actuated import ActuatedSystem, lie_derivatives


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

    def __init__(
        self,
        gains: Sequence[GainLike] | Sequence[Sequence[GainLike]],
        rcond: float | None = None,
        null_space_input: Callable | None = None,
    ):
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

        grouped = (
            isinstance(gains, Sequence)
            and len(gains) > 0
            and all(isinstance(g, (list, tuple)) for g in gains)
        )
        self.gains = (
            tuple(convert(g, f"gains[{i}]") for i, g in enumerate(gains))
            if grouped
            else convert(gains, "gains")
        )
        self.rcond = rcond
        self.null_space_input = null_space_input
        if is_concrete(self.gains):
            self._check_hurwitz()

    @classmethod
    def with_poles(
        cls,
        rate: GainLike,
        order: int,
        rcond: float | None = None,
        null_space_input: Callable | None = None,
    ) -> "ConstraintEnforcingControl":
        """The gains whose characteristic polynomial is `(μ + rate)^order` (one `order`-fold
        pole at `−rate`, per constraint when `rate` is a vector): the choice of Ascher, Chin
        and Reich that Mukharlyamov (2019) recommends (eqs. [0.8]–[0.10]); `K_j = C(order, j)
        rate^(order − j)`."""
        rate = as_gain(rate)
        if rate.ndim > 1:
            raise ValueError(f"`rate` must be a scalar or a vector; got shape {rate.shape}.")
        return cls(
            [math.comb(order, j) * rate ** (order - j) for j in range(order)],
            rcond,
            null_space_input,
        )

    @classmethod
    def from_poles(
        cls, poles, rcond: float | None = None, null_space_input: Callable | None = None
    ) -> "ConstraintEnforcingControl":
        """The scalar gains whose characteristic polynomial `Π (μ − p_i)` has the given
        poles (their number is the relative degree): real poles, or complex ones in
        conjugate pairs. Differentiable in the poles, so tuning them (e.g. the logarithms of
        `−p_i`) keeps the perturbation equation stable by construction."""
        poles = jnp.asarray(poles)
        if poles.ndim != 1 or poles.shape[0] == 0:
            raise ValueError(f"`poles` must be a non-empty 1-D array; got shape {poles.shape}.")
        coefficients = jnp.ones((1,), poles.dtype)  # of μ^k, highest power first
        for pole in poles:
            coefficients = jnp.concatenate(
                [coefficients, jnp.zeros((1,), poles.dtype)]
            ) - pole * jnp.concatenate([jnp.zeros((1,), poles.dtype), coefficients])
        if jnp.iscomplexobj(coefficients):
            if is_concrete(coefficients) and np.max(
                np.abs(np.imag(np.asarray(coefficients)))
            ) > 1e-9 * np.max(np.abs(coefficients)):
                raise ValueError(
                    "Complex `poles` must come in conjugate pairs (the gains are "
                    "real); got " + np.array2string(np.asarray(poles)) + "."
                )
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
                    f"{largest:.4g}); the constraints would not be restored (Mukharlyamov (2019), "
                    "§3). Use e.g. `ConstraintEnforcingControl.with_poles(rate, order)`, or all "
                    "gains zero for the unstabilized law."
                )

    def validate(self, num_constraints: int | Sequence[int]) -> "ConstraintEnforcingControl":
        """Checks the gains' sizes against `num_constraints` (one per group for grouped
        gains) and returns the control. Concrete gains were checked for stability at
        construction; traced ones (under `jit`, `vmap`, `grad`) come back wrapped in one
        `eqx.error_if` (`attach_checks`), which raises at run time unless each group's companion
        matrix is Hurwitz or all its gains are zero (Lyapunov's test, as for
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
                _companion(group, size, f"gains[{i}]") if blocks is None else blocks
            )
            unstabilized = jnp.all(jnp.stack([jnp.all(k == 0) for k in group]))
            bad = bad | (not_hurwitz(companion, jnp) & ~unstabilized)
        message = (
            "The perturbation equation `f⁽ᵖ⁾ + Σ K_j f⁽ʲ⁾ = 0` of the traced "
            "`ConstraintEnforcingControl` gains is not asymptotically stable (H is not "
            "Hurwitz): the constraints would not be restored (Mukharlyamov (2019), §3). Tune "
            "the poles of `ConstraintEnforcingControl.from_poles` to keep the gains "
            "stable by construction."
        )
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
        blocks = [
            _companion(group, r, f"gains[{i}]" if self.grouped else "gains")
            for i, (group, r) in enumerate(zip(self.groups, sizes, strict=False))
        ]
        return jax.scipy.linalg.block_diag(*blocks)

    def outputs(self, system: ActuatedSystem, t, q, v, w):
        """`(u, y)` at a state: the input and the perturbations `y = (f, …, f⁽ᵖ⁻¹⁾)`
        (shape `(ρ, r)`; a tuple over groups for grouped gains)."""
        orders = tuple(len(group) for group in self.groups)
        values, rates, input_gains = lie_derivatives(system, max(orders), t, (q, v, w))
        ys, rows, rhs = [], [], []
        for i, (group, order) in enumerate(zip(self.groups, orders, strict=False)):
            y = jnp.stack([values[k][i] for k in range(order)])
            target = -sum(
                k * yj if k.ndim <= 1 else k @ yj for k, yj in zip(group, y, strict=False)
            )
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
