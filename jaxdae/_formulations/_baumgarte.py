"""Exact Lagrange multipliers with generalized Baumgarte stabilization (paper 004)."""

import jax.numpy as jnp

from .._custom_types import Gain, GainLike
from .._gains import (
    as_gain,
    check_gain_size,
    check_gain_structure,
    gain_matrix,
    is_concrete,
    require_positive_definite,
)
from .._compilation._linear_solvers import PositiveDefinite
from .._systems._system import ConstrainedTerms
from ._arguments import explain_arguments
from ._base import (
    AbstractExactMultipliers,
    baumgarte_target,
    multiplier_solve,
    second_order_matrix,
)

_LYAPUNOV = (
    "paper 004, eq. [18]: a global Lyapunov function exists iff there is ε > 0 with "
    "K_D − εI ≻ 0 and K_P + εK_D − ε²I ≻ 0, which for symmetric gains means K_D ≻ 0 and "
    "K_P ≻ 0; use `Unstabilized()` for no stabilization"
)


def default_kv(kd: Gain) -> Gain:
    """Default nonholonomic gain: the decay rate `k` of a critically damped `K_D = 2k`."""
    if kd.ndim == 2:
        return 0.5 * jnp.mean(jnp.diag(kd))
    return 0.5 * jnp.mean(kd)


def stabilization_gains(kd: GainLike, kp: GainLike, kv: GainLike | None):
    """Converts `(kd, kp, kv)` to arrays, filling in the default `kv`."""
    kd, kp = as_gain(kd), as_gain(kp)
    return kd, kp, default_kv(kd) if kv is None else as_gain(kv)


def check_gain_values(formulation, names, reason) -> None:
    """Construction-time checks: structure always, values when concrete."""
    for name in names:
        gain = getattr(formulation, name)
        check_gain_structure(name, gain)
        if is_concrete(gain):
            require_positive_definite(name, gain, reason)


def check_stabilization_gains(formulation, names, num_holonomic, num_nonholonomic, reason):
    """Shape checks of `kd`, `kp`, `kv`, ... against the constraint counts, and SPD checks of
    the concrete ones (`ValueError`); traced ones: `stabilization_checks`. Returns
    `formulation`."""
    sizes = {"kd": num_holonomic, "kp": num_holonomic, "kv": num_nonholonomic}
    what = {"kd": "holonomic constraints", "kp": "holonomic constraints",
            "kv": "nonholonomic constraints"}
    for name in names:
        gain = getattr(formulation, name)
        size = sizes.get(name, num_holonomic + num_nonholonomic)
        check_gain_size(name, gain, size, what.get(name, "constraints (holonomic + nonholonomic)"))
        if is_concrete(gain):
            require_positive_definite(name, gain, reason)
    return formulation


def stabilization_checks(formulation, names, reason) -> tuple:
    """The `(flag, message)` checks that the traced gains `names` are SPD (the
    formulation's `traced_checks`)."""
    return sum((require_positive_definite(name, getattr(formulation, name), reason)
                for name in names), ())


def check_rcond(rcond: float | None) -> None:
    if rcond is not None and not 0 <= rcond < 1:
        raise ValueError(f"`rcond` must be in [0, 1) or None (default sqrt(eps)); got {rcond}.")


class Unstabilized(AbstractExactMultipliers):
    """Index reduction only: `Φ̈ = 0`, `Ψ̇ = 0`, exact Lagrange multipliers.

    The constraint violations drift (linearly or quadratically in time); useful as a
    baseline for the stabilized formulations (paper 004, eq. [6] with `γ_s = γ`).

    **Arguments:**

    - `rcond`: the simulation stops with `RESULTS.singular_constraint_matrix` when the
        smallest pivot of `J M⁻¹ Jᵀ` (its eigenvalues for one or two constraints, the
        Cholesky factorization's pivots for more) falls below `rcond` times its largest (now
        or at the initial state, whichever is larger). Default `sqrt(eps)`.
    """

    rcond: float | None = None

    def __check_init__(self):
        check_rcond(self.rcond)

    def accelerations(self, terms):
        return multiplier_solve(terms, terms.bias, PositiveDefinite())

    def validate(self, num_holonomic, num_nonholonomic):
        return self


class Baumgarte(AbstractExactMultipliers):
    """Generalized Baumgarte stabilization (paper 004, eqs. [16]–[21]; paper 002, eq. [0.7]).

    Replaces `Φ̈ = 0` by `Φ̈ + K_D Φ̇ + K_P Φ = 0` and `Ψ̇ = 0` by `Ψ̇ + K_V Ψ = 0` and solves
    for the exact multipliers `λ = (J M⁻¹ Jᵀ)⁻¹ (J M⁻¹ Q − s)` (eq. [21]). Constraint
    perturbations then obey that linear ODE exactly and decay for positive definite gains.

    Fails where `J M⁻¹ Jᵀ` is singular (redundant constraints, singular configurations):
    the solve stops there with `RESULTS.singular_constraint_matrix`. Use
    [`jaxdae.PseudoInverse`][] or [`jaxdae.ModifiedLagrange`][] there.

    **Arguments:**

    - `kd`, `kp`: `K_D`, `K_P` — a scalar, one value per holonomic constraint (diagonal),
        or a full symmetric positive definite matrix. Remark 3 of paper 004: critically
        damped `kd = 2k`, `kp = k²`.
    - `kv`: `K_V` for nonholonomic constraints (same forms). Default: `mean(diag K_D) / 2`,
        the rate `k` of a critically damped `K_D`.
    - `rcond`: `J M⁻¹ Jᵀ` is treated as singular when its smallest pivot (its eigenvalues
        for one or two constraints, the pivots of its Cholesky factorization for more; see
        `AbstractExactMultipliers`) falls below `rcond` times its largest (now or at the
        initial state, whichever is larger), so a single constraint whose gradient vanishes
        is caught too. Default `sqrt(eps)` of the state's dtype.

    **Raises:**

    `ValueError` if a gain is not a scalar/vector/square matrix or violates the
    Lyapunov condition of paper 004 (not symmetric positive definite).
    """

    kd: Gain
    kp: Gain
    kv: Gain
    rcond: float | None = None

    @explain_arguments("Baumgarte(kd=10.0, kp=25.0)")
    def __init__(self, kd: GainLike, kp: GainLike, kv: GainLike | None = None,
                 rcond: float | None = None):
        self.kd, self.kp, self.kv = stabilization_gains(kd, kp, kv)
        self.rcond = rcond

    def __check_init__(self):
        check_gain_values(self, ("kd", "kp", "kv"), _LYAPUNOV)
        check_rcond(self.rcond)

    def check_values(self):
        check_gain_values(self, ("kd", "kp", "kv"), _LYAPUNOV)

    def accelerations(self, terms: ConstrainedTerms):
        target = baumgarte_target(terms, self.kd, self.kp, self.kv)
        return multiplier_solve(terms, target, PositiveDefinite())

    def validate(self, num_holonomic, num_nonholonomic):
        return check_stabilization_gains(
            self, ("kd", "kp", "kv"), num_holonomic, num_nonholonomic, _LYAPUNOV
        )

    def traced_checks(self, num_holonomic, num_nonholonomic):
        return stabilization_checks(self, ("kd", "kp", "kv"), _LYAPUNOV)

    def perturbation_matrix(self, num_holonomic: int):
        """`H` of `d/dt (Φ, Φ̇) = H (Φ, Φ̇)` (paper 002 eq. [0.11]) for these gains."""
        dtype = jnp.result_type(self.kd, self.kp)
        return second_order_matrix(
            gain_matrix(self.kp, num_holonomic, dtype), gain_matrix(self.kd, num_holonomic, dtype)
        )
