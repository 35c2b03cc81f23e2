"""Consistent initialization: the nearest state on the constraint manifold."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import check_finite, check_positive
from .._compilation._linalg import full_precision
from .._custom_types import Array, ArrayLike, Bool, Coordinates, Float, ScalarLike, Velocities
from .._gains import is_concrete
from .._systems._system import LagrangianSystem, holonomic_terms, nonholonomic_terms


def _position_residual(y, args):
    """KKT conditions of `min ½ (q − q0)ᵀ M0 (q − q0)` s.t. `Φ(t0, q) = 0`."""
    q, lam = y
    system, t0, q0, mass0 = args
    phi_fn = lambda q_: system.constraints(t0, q_)  # noqa: E731
    phi, vjp = jax.vjp(phi_fn, q)
    (jt_lam,) = vjp(lam)
    return mass0 @ (q - q0) + jt_lam, phi


@eqx.filter_jit
def _project(system, t0, q0, v0, rtol, atol, max_steps):
    mass0 = system.mass_matrix(t0, q0)
    lam0 = jnp.zeros_like(system.constraints(t0, q0))
    solver = optx.Newton(rtol=rtol, atol=atol, linear_solver=lx.AutoLinearSolver(well_posed=False))
    sol = optx.root_find(
        _position_residual,
        solver,
        (q0, lam0),
        args=(system, t0, q0, mass0),
        max_steps=max_steps,
        throw=False,
    )
    q, _ = sol.value
    # Velocities: the mass-metric projection onto {G v = −(Φ_t, a)}, a linear problem.
    zero = jnp.zeros_like(v0)
    phi, phi_t, jac_phi, _ = holonomic_terms(system.constraints, t0, q, zero)
    psi0, jac_psi, _ = nonholonomic_terms(system.velocity_constraints, t0, q, zero)
    g = jnp.concatenate([jac_phi, jac_psi])
    offset = jnp.concatenate([phi_t, psi0])  # G v + offset = (Φ̇, Ψ)
    mass = system.mass_matrix(t0, q)
    minv_gt = jnp.linalg.solve(mass, g.T)
    a_matrix = lx.MatrixLinearOperator(g @ minv_gt, lx.positive_semidefinite_tag)
    v = v0
    for _ in range(2):  # the second pass refines the first's rounding (large |v0|)
        lam = lx.linear_solve(a_matrix, g @ v + offset, lx.SVD(), throw=False).value
        v = v - minv_gt @ lam
    phi_final = system.constraints(t0, q)
    _, dphi, _, _ = holonomic_terms(system.constraints, t0, q, v)
    psi = system.velocity_constraints(t0, q, v)
    return q, v, phi_final, dphi, psi, sol.result


_NOT_FOUND = (
    "No consistent initial state found near {where}: {detail}. The constraints may have no "
    "solution near q0 (e.g. a target outside the workspace): choose a closer q0 or check "
    "`constraints`."
)


@full_precision
def consistent_initial_state(
    system: LagrangianSystem,
    t0: ScalarLike,
    q0: Float[ArrayLike, " n"],
    v0: Float[ArrayLike, " n"],
    *,
    tol: float | None = None,
    max_steps: int = 64,
    throw: bool = True,
) -> tuple[Coordinates, Velocities] | tuple[Coordinates, Velocities, Bool[Array, ""]]:
    """The state nearest to `(q0, v0)` in the mass metric with `Φ = 0`, `Φ̇ = 0` and `Ψ = 0`.

    Positions solve the KKT system of `min ½ (q − q0)ᵀ M(q0) (q − q0)` subject to
    `Φ(t0, q) = 0` with optimistix's Newton method (least-squares linear solves, so redundant
    constraints are fine). Velocities are the `M`-orthogonal projection of `v0` onto
    `{Φ̇ = 0, Ψ = 0}`, which is exact since both are affine in `v`.

    **Arguments:**

    - `system`: a [`jaxdae.LagrangianSystem`][].
    - `t0`, `q0`, `v0`: the time and the guess.
    - `tol`: accepted residual `max(|Φ|, |Φ̇|, |Ψ|)`; default `1e3 · eps` of the dtype times
        `1 + max |q0|` for `Φ`, and times `(1 + max |q0|)(1 + max |v0|)` for `Φ̇` and `Ψ`
        (which scale with the velocities).
    - `max_steps`: Newton iterations.
    - `throw`: whether a guess with no consistent state near it raises (below). With
        `throw=False` it is reported instead, by a flag per call (one per member under
        `jax.vmap`), and the other members of a batch are projected as without it.

    **Returns:**

    `(q, v)`; with `throw=False`, `(q, v, found)`: `found` is False where no consistent
    state was found, and there `q` and `v` are `nan` (so that a solve started from them
    reports `RESULTS.invalid_input`, or a `ValueError`, rather than start from a state that
    is not consistent). Call that member alone with `throw=True` for the residual reached.

    **Raises:**

    `ValueError` for non-finite `t0`, `q0`, `v0` or a `tol` that is not positive (with
    either `throw`), and with `throw=True` if no consistent state is found near `q0` (the
    constraints may have no solution there, e.g. a point outside the workspace). Under
    `jax.jit`, `jax.vmap` or `jax.grad` that check runs inside the computation
    (`eqx.error_if`) and raises a runtime error with that message (for the whole batch:
    `throw=False` reports each member alone).

    Works under `jax.jit` and `jax.vmap` (e.g. to project a batch of perturbed starts in one
    call) and is differentiable: the gradient with respect to `q0`, `v0` or the system's
    parameters comes from the implicit function theorem at the solution (optimistix).
    """
    q0 = jnp.asarray(q0, dtype=jnp.result_type(float))
    v0 = jnp.asarray(v0, dtype=q0.dtype)
    t0 = jnp.asarray(t0, dtype=q0.dtype)
    if q0.ndim != 1 or q0.shape != v0.shape:
        raise ValueError(
            f"`q0` and `v0` must be 1-D arrays of the same shape (n,); got {q0.shape} and "
            f"{v0.shape}."
        )
    for name, value in (("t0", t0), ("q0", q0), ("v0", v0)):
        check_finite(name, value)
    check_positive("tol", tol, "residual")
    if tol is None:
        tol = 1e3 * float(jnp.finfo(q0.dtype).eps) * (1.0 + jnp.max(jnp.abs(q0), initial=0.0))
        velocity_tol = tol * (1.0 + jnp.max(jnp.abs(v0), initial=0.0))
    else:
        velocity_tol = tol
    # Arrays, not Python floats: a float would be a static argument of `_project`, one
    # compilation per guess.
    tol, velocity_tol = (
        jax.lax.stop_gradient(jnp.asarray(x, q0.dtype)) for x in (tol, velocity_tol)
    )
    q, v, phi, dphi, psi, result = _project(system, t0, q0, v0, 0.1 * tol, 0.1 * tol, max_steps)
    residual = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in (phi, dphi, psi)]))
    velocity_residual = jnp.max(jnp.abs(jnp.concatenate([dphi, psi])), initial=0.0)
    failed = ~(
        (jnp.max(jnp.abs(phi), initial=0.0) <= tol) & (velocity_residual <= velocity_tol)
    )  # also NaN
    if not throw:
        q, v = (jnp.where(failed, jnp.nan, x) for x in (q, v))
        return q, v, ~failed
    if not is_concrete(failed):
        return eqx.error_if(
            (q, v),
            failed,
            _NOT_FOUND.format(
                where="`q0`", detail="max(|Φ|, |Φ̇|, |Ψ|) > tol after the Newton projection"
            ),
        )
    if failed:
        raise ValueError(
            _NOT_FOUND.format(
                where=f"q0 = {np.asarray(q0)}",
                detail=f"after Newton projection max(|Φ|, |Φ̇|, |Ψ|) = {float(residual):.3g} > "
                f"tol = {float(tol):.3g} (velocities: {float(velocity_tol):.3g}; "
                f"{optx.RESULTS[result]!s})",
            )
        )
    return q, v
