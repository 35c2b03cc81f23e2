"""Checks shared by every system with nonholonomic constraints
`Ψ(t, q, v) = A(t, q) v + a(t, q)`."""

import jax
import jax.numpy as jnp

from .._custom_types import Array, Bool, Scalar


def velocity_curvature(velocity_constraints, t, q, v) -> tuple[Scalar, Scalar]:
    """`max |∂²Ψ/∂v²|` at `v` and at a shifted velocity, and `max |Ψ_v|` for scale.

    Every formulation assumes `Ψ` affine in `v` (Shemelova (2016) eq. [1], Mukharlyamov (2019) eq.
    [0.7]): then `Ψ̇ = A q̈ + Ψ_t + Ψ_q v` exactly. Autodiff makes `∂²Ψ/∂v²` exactly zero for an
    affine `Ψ`; it is evaluated at two velocities (`v` and `v + w`, `w` a fixed non-symmetric
    direction) so that e.g. `Ψ = v³` is not missed at `v = 0`.
    """
    n = v.shape[0]
    shift = (1.0 + jnp.max(jnp.abs(v), initial=0.0)) * (
        1.0 + jnp.arange(n, dtype=v.dtype) / max(n, 1)
    )
    hessian = jax.hessian(velocity_constraints, argnums=2)
    curvature = jnp.maximum(
        jnp.max(jnp.abs(hessian(t, q, v)), initial=0.0),
        jnp.max(jnp.abs(hessian(t, q, v + shift)), initial=0.0),
    )
    scale = jnp.max(jnp.abs(jax.jacfwd(velocity_constraints, argnums=2)(t, q, v)), initial=0.0)
    return curvature, scale


def is_not_affine(curvature: Scalar, scale: Scalar) -> Bool[Array, ""]:
    """True when the curvature of `Ψ` in `v` is not round-off relative to `A`."""
    tol = jnp.sqrt(jnp.finfo(curvature.dtype).eps) * (1.0 + scale)
    return ~(curvature <= tol)
