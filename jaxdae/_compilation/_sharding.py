"""Arrays on meshes with Explicit axes, for the functions that do not support them, and the
abstract mesh that a solve's entry point sets for its traces."""

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import jax
from jax.sharding import AxisType, Mesh, NamedSharding

# The signature that `in_current_mesh` keeps.
_P = ParamSpec("_P")
_R = TypeVar("_R")


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


def in_current_mesh(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn` run with JAX's current abstract mesh set explicitly (the empty mesh outside
    any mesh).

    When reverse mode differentiates a jitted function (a solve called eagerly), JAX
    replays its equations with the context each was recorded in, which names the empty
    mesh where the caller's context named none. What is traced lazily there
    (`ReverseSweepAdjoint`'s forward solve) then missed every trace cache that the
    structure checks had filled, and traced the equations of motion and the solve a second
    time. Setting the current mesh explicitly keeps those caches valid
    (`experiments/benchmarks/bench_compile.py` shows the gradient's trace time)."""

    @functools.wraps(fn)
    def in_mesh(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(jax.sharding.get_abstract_mesh()):
            return fn(*args, **kwargs)

    return in_mesh
