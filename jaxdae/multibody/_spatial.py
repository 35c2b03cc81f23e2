"""Spatial vectors and inertias in the global frame, about the global origin.

Featherstone's Plücker notation (*Rigid Body Dynamics Algorithms*, 2008, ch. 2) with every
quantity in ground coordinates: a motion vector is `(ω, v_O)`, the angular velocity and the
velocity of the body-fixed point at the global origin; a force vector is `(n_O, f)`, the
moment about the origin and the force. In a fixed frame no coordinate transforms are needed:
velocities of a tree add along its paths, and Newton–Euler's `f = I a + v ×* I v` holds as
written (Featherstone, eq. 2.63). An inertia is kept as its three parts `(m, h, I_O)`: the
mass, the first moment `h = m c` (`c` the centre of mass) and the rotational inertia about
the origin, `I_O = I_c + m (|c|² 1 − c cᵀ)`; the parts of a composite body are sums.
The rotations of the joints (about an axis, of Euler parameters of any norm) are batched
over the bodies.
"""

import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, Float


def motion_cross(v: Float[Array, "*b 6"], m: Float[Array, "*b 6"]) -> Float[Array, "*b 6"]:
    """`v × m` of two motion vectors: `(ω × a, ω × b + v_O × a)` for `v = (ω, v_O)`,
    `m = (a, b)`."""
    w, u, a, b = v[..., :3], v[..., 3:], m[..., :3], m[..., 3:]
    return jnp.concatenate([jnp.cross(w, a), jnp.cross(w, b) + jnp.cross(u, a)], axis=-1)


def force_cross(v: Float[Array, "*b 6"], f: Float[Array, "*b 6"]) -> Float[Array, "*b 6"]:
    """`v ×* f` of a motion and a force vector: `(ω × n + v_O × f, ω × f)`."""
    w, u, n, g = v[..., :3], v[..., 3:], f[..., :3], f[..., 3:]
    return jnp.concatenate([jnp.cross(w, n) + jnp.cross(u, g), jnp.cross(w, g)], axis=-1)


def inertia_parts(
    mass: Float[Array, " *b"], centre: Float[Array, "*b 3"], rotational: Float[Array, "*b 3 3"]
) -> tuple[Float[Array, " *b"], Float[Array, "*b 3"], Float[Array, "*b 3 3"]]:
    """`(m, h, I_O)` of a body of mass `m` with centre of mass `c` and rotational inertia
    `I_c` about it (global axes)."""
    eye = jnp.eye(3, dtype=centre.dtype)
    cc = jnp.sum(centre * centre, axis=-1)[..., None, None]
    outer = centre[..., :, None] * centre[..., None, :]
    return mass, mass[..., None] * centre, rotational + mass[..., None, None] * (cc * eye - outer)


def apply_inertia(parts, v: Float[Array, "*b 6"]) -> Float[Array, "*b 6"]:
    """`I v`, the momentum of the motion `v = (ω, v_O)`: `(I_O ω + h × v_O, m v_O + ω × h)`."""
    mass, first, rotational = parts
    w, u = v[..., :3], v[..., 3:]
    angular = jnp.sum(rotational * w[..., None, :], axis=-1) + jnp.cross(first, u)
    return jnp.concatenate([angular, mass[..., None] * u + jnp.cross(w, first)], axis=-1)


def mat_mul(a: Float[Array, "*b i j"], b: Float[Array, "*b j k"]) -> Float[Array, "*b i k"]:
    """`a @ b` of batches of small matrices as a broadcast product and a sum, which XLA
    fuses with its neighbours, where a batched dot is a kernel of its own."""
    return jnp.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


def mat_vec(a: Float[Array, "*b i j"], x: Float[Array, "*b j"]) -> Float[Array, "*b i"]:
    """`a @ x` of batches of small matrices and vectors (as [`mat_mul`][])."""
    return jnp.sum(a * x[..., None, :], axis=-1)


# `w̃_ij = −ε_ijk w_k`: the cross-product matrices of a batch of vectors in one product
_LEVI_CIVITA = np.zeros((3, 3, 3))
for _i, _j, _k in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):
    _LEVI_CIVITA[_i, _j, _k], _LEVI_CIVITA[_j, _i, _k] = 1.0, -1.0


def skew_matrices(w):
    """The matrices `w̃` with `w̃ x = w × x` of a batch of vectors `(b, 3)`."""
    return jnp.einsum("ijk,bk->bij", jnp.asarray(-_LEVI_CIVITA, w.dtype), w)


def unit_rotation(p):
    """`R(p/|p|)` of a batch of Euler parameters `(b, 4)` of any norm (Haug's eq. 6.3.11,
    homogeneous of degree 0)."""
    e0, e = p[:, 0, None, None], p[:, 1:]
    norm2 = jnp.sum(p * p, axis=1)[:, None, None]
    return (
        (2 * e0**2 - norm2) * jnp.eye(3, dtype=p.dtype)
        + 2 * (e[:, :, None] * e[:, None, :] + e0 * skew_matrices(e))
    ) / norm2


def rate_map(p):
    """`2 E(p) / |p|²` of a batch of Euler parameters `(b, 4)`: the angular velocity of the
    rotation `R(p/|p|)` is `ω = 2 E(p) ṗ / |p|²` (`E = [−e, ẽ + e₀ I]`)."""
    e0, e = p[:, 0, None, None], p[:, 1:]
    rate = jnp.concatenate(
        [-e[:, :, None], skew_matrices(e) + e0 * jnp.eye(3, dtype=p.dtype)], axis=2
    )
    return 2 * rate / jnp.sum(p * p, axis=1)[:, None, None]


def axis_rotation(u, angle):
    """Rodrigues' rotations by `angle` about the unit vectors `u`, batched."""
    k = skew_matrices(u)
    s, c = jnp.sin(angle)[:, None, None], jnp.cos(angle)[:, None, None]
    return jnp.eye(3, dtype=k.dtype) + s * k + (1 - c) * (k @ k)
