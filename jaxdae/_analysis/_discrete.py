"""Stability of the constraint perturbations under a fixed-step method (Mukharlyamov (2019), §4).

With constant gains the perturbations `y = (Φ, Φ̇)` obey `ẏ = H y` (Mukharlyamov (2019), eq. [0.11];
Mukharlyamov and Deressa (2015), eq. [16]). A one-step method with step `τ` maps `y_k` to
`y_{k+1} = R(τH) y_k`, `R` the method's stability function (explicit Euler: `I + τH`; two-stage RK:
`I + τH + τ²H²/2`, Mukharlyamov (2019) §4). Asymptotic stability of `ẏ = Hy` is not enough: the
numerical drift stays bounded only when the spectral radius `ρ(R(τH)) < 1`.

Here `R(τH)` is computed generically by applying one step of the diffrax solver to the
linear ODE `ẏ = Hy` from each unit vector, so it works for any diffrax one-step solver
(explicit, implicit, SDIRK) without typing in a Butcher tableau.
"""

from collections.abc import Sequence

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

from .._checks import check_count, check_positive
from .._compilation._linalg import full_precision
from .._custom_types import Array, Float, ScalarLike
from .._formulations._base import AbstractStabilizedFormulation
from .._formulations._constraint_enforcing import ConstraintEnforcingControl


def _use_stepsize_tol():
    from .._compilation._private_apis import use_stepsize_tol  # the marker diffeqsolve replaces

    return use_stepsize_tol


def _linear_field(t, y, matrix):
    return matrix @ y


@full_precision
def transition_matrix(
    matrix: Float[Array, "d d"], solver: diffrax.AbstractSolver, dt: ScalarLike
) -> Float[Array, "d d"]:
    """The one-step transition `R(τH)` of `solver` with step `τ = dt` on `ẏ = H y`.

    Mukharlyamov (2019), §4: explicit Euler gives `I + τH`, the two-stage RK family
    `I + τH + τ²H²/2`; in general `R` is the method's stability function. Computed by
    stepping `solver` once from each unit vector (differentiable in `H` and `dt`).

    **Arguments:**

    - `matrix`: `H`, shape `(d, d)` (e.g. [`jaxdae.perturbation_matrix`][]).
    - `solver`: a diffrax one-step ODE solver (`Euler()`, `Heun()`, `Midpoint()`,
        `Tsit5()`, `ImplicitEuler()`, ...).
    - `dt`: the step `τ`.

    **Returns:**

    `R(τH)`, shape `(d, d)`.
    """
    matrix = jnp.asarray(matrix)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"`matrix` must be square; got shape {matrix.shape}.")
    dtype = matrix.dtype
    term = diffrax.ODETerm(_linear_field)
    if isinstance(solver, diffrax.AbstractImplicitSolver):
        # Implicit solvers take their Newton tolerances from `diffeqsolve`'s step-size
        # controller; set the ones still unset (the relation is linear: one or two iterations).
        tol = 100 * float(jnp.finfo(dtype).eps)
        values = {"rtol": tol, "atol": tol, "norm": optx.rms_norm}
        unset = [a for a in values if getattr(solver.root_finder, a) is _use_stepsize_tol()]
        if unset:
            solver = eqx.tree_at(
                lambda s: tuple(getattr(s.root_finder, a) for a in unset),
                solver,
                tuple(values[a] for a in unset),
            )
    t0 = jnp.zeros((), dtype)
    t1 = jnp.asarray(dt, dtype)
    check_positive("dt", t1, "step")

    def step(y0):
        state = solver.init(term, t0, t1, y0, matrix)
        y1, _, _, _, _ = solver.step(term, t0, t1, y0, matrix, state, made_jump=False)
        return y1

    return jax.vmap(step, out_axes=1)(jnp.eye(matrix.shape[0], dtype=dtype))


@full_precision
def perturbation_matrix(
    formulation: eqx.Module,
    num_constraints: int | Sequence[int],
    constraint_matrix: Float[Array, "c c"] | None = None,
    *,
    num_nonholonomic: int = 0,
) -> Float[Array, "d d"]:
    """`H` of `d/dt (Φ, Φ̇, Ψ) = H (Φ, Φ̇, Ψ)` for the gains of a stabilized formulation, or
    of `ẏ = H y`, `y = (f, …, f⁽ᵖ⁻¹⁾)`, for a [`jaxdae.ConstraintEnforcingControl`][].

    `H = [[0, I], [−K_P, −K_D]]` (Mukharlyamov and Deressa (2015), eq. [16]; Mukharlyamov
    (2019), eq. [0.11]) for [`jaxdae.Baumgarte`][] and [`jaxdae.PseudoInverse`][], exactly;
    the block matrix of Mukharlyamov (2019), eq. [0.12] for
    [`jaxdae.CoupledPerturbation`][]. For [`jaxdae.ModifiedLagrange`][] the perturbations
    obey (from Mukharlyamov and Deressa (2015), eq. [30] by the Woodbury identity)
    `Φ̈ = −S (K_D Φ̇ + K_P Φ) + forcing`, `S = (I + W𝔄)⁻¹ W𝔄`, `W = J M⁻¹ Jᵀ`; pass
    `constraint_matrix=W` (at a state of interest) to get `[[0, I], [−S K_P, −S K_D]]`,
    else the `𝔄 → ∞` limit `S = I` is used. Any
    [`jaxdae.AbstractStabilizedFormulation`][] answers through its own
    `perturbation_matrix`.

    **Arguments:**

    - `formulation`: a stabilized formulation, or a
        [`jaxdae.ConstraintEnforcingControl`][] (its companion matrix, Mukharlyamov (2019) eqs.
        [3.12], [5.8]).
    - `num_constraints`: `m`, the number of holonomic (or program) constraints; for a
        constraint-enforcing control with grouped gains, one size per group.
    - `constraint_matrix`: `W = G M⁻¹ Gᵀ` for the modified Lagrange formulation.
    - `num_nonholonomic`: `k`, the number of nonholonomic constraints (default 0): their
        rows `Ψ` are appended.

    **Returns:**

    `H`, shape `(2m + k, 2m + k)` (`(ρm, ρm)` for a constraint-enforcing control).

    **Raises:**

    `ValueError` if the formulation has no perturbation matrix (it is not stabilized), or
    for a count of constraints that is not a non-negative integer.
    """

    counts = (
        num_constraints
        if isinstance(formulation, ConstraintEnforcingControl)
        and isinstance(num_constraints, (list, tuple))
        else (num_constraints,)
    )
    for count in counts:
        check_count("num_constraints", count, "the number of constraints")
    check_count("num_nonholonomic", num_nonholonomic, "the number of nonholonomic constraints")
    if isinstance(formulation, AbstractStabilizedFormulation):
        return formulation.perturbation_matrix(num_constraints, num_nonholonomic, constraint_matrix)
    if isinstance(formulation, ConstraintEnforcingControl):
        return formulation.perturbation_matrix(num_constraints)
    raise ValueError(
        f"{type(formulation).__name__} has no perturbation matrix: `perturbation_matrix` "
        "needs a stabilized formulation (a `jaxdae.AbstractStabilizedFormulation`: Baumgarte, "
        "PseudoInverse, ModifiedLagrange, CoupledPerturbation) or a "
        "`jaxdae.ConstraintEnforcingControl`."
    )


def spectral_radius(matrix: Float[Array, "d d"]) -> Float[Array, ""]:
    """`max |eig(R)|` (for reporting; use [`jaxdae.spectral_radius_bound`][] in a loss)."""
    return jnp.max(jnp.abs(jnp.linalg.eigvals(matrix)))


@full_precision
def spectral_radius_bound(matrix: Float[Array, "d d"], power: int = 256) -> Float[Array, ""]:
    """The Gelfand bound `‖R^k‖_F^{1/k} >= ρ(R)`, smooth in `R`, for losses and penalties.

    Eigenvalues are not differentiable where they coincide (a critically damped
    `K_D = 2k, K_P = k²` gives a double eigenvalue), so penalties use this upper bound
    instead. `ρ(R)^k = ρ(R^k) <= ‖R^k‖_F`, so `bound < 1` implies `ρ < 1`; the bound tends
    to `ρ(R)` as `k → ∞` (the excess factor is `(√d)^{1/k}` for a diagonalizable `R` with
    orthogonal eigenvectors, larger for non-normal `R` and Jordan blocks).
    Computed by repeated squaring with rescaling (no overflow).

    **Arguments:**

    - `matrix`: `R`, shape `(d, d)`.
    - `power`: `k`, rounded up to a power of two (default 256).
    """
    squarings = max(0, int(power - 1).bit_length())
    matrix = jnp.asarray(matrix)
    log_scale = jnp.zeros((), matrix.dtype)
    tiny = jnp.finfo(matrix.dtype).tiny
    for _ in range(squarings):
        norm = jnp.sqrt(jnp.sum(matrix**2) + tiny)
        matrix = matrix / norm
        log_scale = 2.0 * (log_scale + jnp.log(norm))
        matrix = matrix @ matrix
    log_norm = log_scale + 0.5 * jnp.log(jnp.sum(matrix**2) + tiny)
    return jnp.exp(log_norm / 2**squarings)


class DiscreteStability(eqx.Module):
    """A penalty that keeps the perturbations stable under a fixed-step method (Mukharlyamov (2019)
    §4).

    `weight · max(0, ρ̂ − (1 − margin))²` with `ρ̂` = [`jaxdae.spectral_radius_bound`][] of
    `R(τH)`, `H` = [`jaxdae.perturbation_matrix`][] of the formulation. Use it as the
    `regularization` of [`jaxdae.tune`][] when tuning for `diffrax.ConstantStepSize()`.

    **Arguments:**

    - `solver`: the diffrax solver the gains are tuned for, e.g. `diffrax.Heun()`.
    - `dt`: the fixed step `τ`.
    - `num_constraints`: `m`, the number of holonomic (or program) constraints.
    - `margin`: require `ρ̂ <= 1 − margin` (default 0.05).
    - `weight`: penalty weight (default 1e3).
    - `select`: picks the formulation out of the tuned model (default: the model itself).
    - `constraint_matrix`: `W = J M⁻¹ Jᵀ` for [`jaxdae.ModifiedLagrange`][] (see
        [`jaxdae.perturbation_matrix`][]).
    - `power`: the `k` of the Gelfand bound.
    """

    solver: diffrax.AbstractSolver
    dt: float
    num_constraints: int = eqx.field(static=True)
    margin: float = 0.05
    weight: float = 1e3
    select: object = None
    constraint_matrix: Array | None = None
    power: int = eqx.field(static=True, default=256)

    def radius(self, model) -> Float[Array, ""]:
        """The bound `ρ̂` on the spectral radius of `R(τH)` for the model's gains."""
        formulation = model if self.select is None else self.select(model)
        h = perturbation_matrix(formulation, self.num_constraints, self.constraint_matrix)
        return spectral_radius_bound(transition_matrix(h, self.solver, self.dt), self.power)

    def __call__(self, model) -> Float[Array, ""]:
        excess = jax.nn.relu(self.radius(model) - (1.0 - self.margin))
        return self.weight * excess**2
