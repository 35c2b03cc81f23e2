"""Arrays on meshes with Explicit axes, for the functions that do not support them."""

import jax
from jax.sharding import AxisType, Mesh, NamedSharding


def auto_mesh(mesh: Mesh) -> Mesh:
    """The same mesh with Auto axes."""
    # Inside `shard_map` over Explicit axes, shapes carry sharding types that lineax's
    # structure checks reject; Auto axes give plain per-device shapes.
    if all(kind == AxisType.Auto for kind in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)


def explicit_to_auto(x):
    """`x` placed on the Auto version of its mesh if it is on Explicit axes (no data moves)."""
    # Arrays placed on a mesh with Explicit axes (the default of `jax.make_mesh`) carry
    # their sharding in their type, which `lax.map`, lineax and diffrax refuse; the same
    # placement on the Auto version of the mesh moves no data.
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return x
    sharding = x.sharding
    if isinstance(sharding, NamedSharding) and any(
        kind == AxisType.Explicit for kind in sharding.mesh.axis_types
    ):
        return jax.device_put(x, NamedSharding(auto_mesh(sharding.mesh), sharding.spec))
    return x


def is_explicitly_sharded(x) -> bool:
    """Whether the (possibly traced) array `x` carries an Explicit sharding in its type."""
    sharding = jax.typeof(x).sharding
    return (
        isinstance(sharding, NamedSharding)
        and any(kind == AxisType.Explicit for kind in sharding.mesh.axis_types)
        and any(axis is not None for axis in sharding.spec)
    )
