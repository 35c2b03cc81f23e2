"""Gains: conversion, shape checks and positive-definiteness checks.

A gain is a scalar (`k I`), a vector (`diag(k)`, one value per constraint) or a full matrix.
Values are checked eagerly when they are concrete (`ValueError`); traced ones (under `jit`,
`vmap`, `grad`) give `(flag, message)` pairs, `flag` true where `message` applies, that the
caller attaches (`attach_checks`): `simulate` attaches a formulation's (its `traced_checks`)
with its own checks as one error. So the checks never break `jit`, `vmap` or `grad` over
the gains.
"""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._custom_types import Array, Bool, Float, Gain, GainLike

# A flag (a Python `False` where a check is settled at trace time) and its message.
TracedCheck = tuple[Bool[Array, ""] | bool, str]
"""A check of traced values: `(flag, message)`, the flag true where the message applies."""


def as_gain(value: GainLike) -> Gain:
    """Converts a Python number or array to a floating-point JAX array (ints become floats).
    A complex gain is refused (its imaginary part would be dropped), as is float16."""
    array = jnp.asarray(value)
    if jnp.issubdtype(array.dtype, jnp.complexfloating) or array.dtype.name in (
        "float16",
        "bfloat16",
    ):
        raise ValueError(
            f"A gain must be real, of float32 or float64; got {array.dtype} "
            f"({np.array2string(np.asarray(value), precision=4)})."
        )
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.result_type(float))
    return array


def is_concrete(*values) -> bool:
    """True when no leaf is a tracer, i.e. values can be checked eagerly in Python."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(values))


def attach_checks(value, checks: Sequence[TracedCheck]):
    """`value` (any PyTree) with the traced `checks` attached as one
    `eqx.branched_error_if`, which raises the message of the first flag that is true; `value`
    itself when there are none. One error for all: each is a `lax.cond` with host callbacks
    in the compiled program (`experiments/benchmarks/bench_compile.py` counts them)."""
    if not checks:
        return value
    flags = jnp.stack([jnp.asarray(flag) for flag, _ in checks])
    return eqx.branched_error_if(
        value, jnp.any(flags), jnp.argmax(flags), tuple(message for _, message in checks)
    )


def check_gain_structure(name: str, gain: Array, *, allow_zero_dim: bool = True) -> None:
    """Raises a `ValueError` if `gain` is not a scalar, a vector or a square matrix."""
    if gain.ndim > 2 or (gain.ndim == 2 and gain.shape[0] != gain.shape[1]):
        raise ValueError(
            f"`{name}` must be a scalar, a vector (one value per constraint) or a square "
            f"matrix; got shape {gain.shape}."
        )


def check_gain_size(name: str, gain: Array, size: int, what: str) -> None:
    """Raises a `ValueError` if a vector/matrix gain does not match the number of constraints."""
    if gain.ndim >= 1 and gain.shape[0] != size:
        expected = f"({size},) or ({size}, {size})"
        raise ValueError(
            f"`{name}` has shape {gain.shape} but the system has {size} {what}: pass a "
            f"scalar or an array of shape {expected}."
        )


def gain_matrix(gain: Gain, size: int, dtype) -> Float[Array, "c c"]:
    """The gain as a full `(size, size)` matrix."""
    gain = gain.astype(dtype)
    if gain.ndim == 0:
        return gain * jnp.eye(size, dtype=dtype)
    if gain.ndim == 1:
        return jnp.diag(gain)
    return gain


def uncoupled_companions(
    gains: Sequence[Gain], size: int, dtype
) -> Float[Array, "size p p"] | None:
    """The companion matrices of `f⁽ᵖ⁾ + Σ_j K_j f⁽ʲ⁾ = 0` (`gains = (K_0, …, K_{p−1})`)
    constraint by constraint, `(size, p, p)`, where every `K_j` is a scalar or a vector: the
    `(p·size)`-square companion matrix is then, up to a permutation, block diagonal with
    these blocks, and Hurwitz iff each of them is. `None` where a gain is a matrix."""
    if any(jnp.ndim(gain) > 1 for gain in gains):
        return None
    order = len(gains)
    last = -jnp.stack(
        [jnp.broadcast_to(jnp.asarray(gain, dtype), (size,)) for gain in gains], axis=-1
    )
    shift = jnp.broadcast_to(
        jnp.eye(order, k=1, dtype=dtype)[: order - 1], (size, order - 1, order)
    )
    return jnp.concatenate([shift, last[:, None, :]], axis=1)


def apply_gain(gain: Gain, x: Float[Array, " c"]) -> Float[Array, " c"]:
    """`K x` without forming `K` for scalar and diagonal gains."""
    gain = gain.astype(x.dtype)
    if gain.ndim <= 1:
        return gain * x
    return gain @ x


def not_positive_definite(gain: Gain | np.ndarray, xnp=jnp) -> Bool[Array, ""] | np.bool_:
    """True if the gain is not (symmetric) positive definite, or not finite.

    `xnp` is `jax.numpy` (traced checks) or `numpy` (fast eager checks).
    """
    if gain.ndim <= 1:  # one reduction (traced: one operation in the compiled program)
        return xnp.any(~((gain > 0) & xnp.isfinite(gain)))
    sym = 0.5 * (gain + gain.T)
    asym = xnp.max(xnp.abs(gain - gain.T), initial=0.0) > 1e-10 * (
        1 + xnp.max(xnp.abs(gain), initial=0.0)
    )
    finite = xnp.all(xnp.isfinite(sym))
    lowest = xnp.min(xnp.linalg.eigvalsh(xnp.where(finite, sym, 0.0)), initial=xnp.inf)
    return asym | (lowest <= 0) | xnp.any(~xnp.isfinite(gain))


def describe_gain(gain) -> str:
    gain = np.asarray(gain)
    if gain.ndim <= 1:
        return f"values {np.array2string(gain, precision=4)}"
    return (
        f"eigenvalues of its symmetric part {np.linalg.eigvalsh(0.5 * (gain + gain.T))}, "
        f"asymmetry max|K - Kᵀ| = {np.max(np.abs(gain - gain.T)):.3g}"
    )


def gain_limit(dtype) -> float:
    """The largest gain entry of `dtype` whose products with another stay finite:
    `√(largest float)` (1.3e154 in float64, 1.8e19 in float32)."""
    return float(np.sqrt(np.finfo(dtype).max))


def too_large(gain, xnp=jnp) -> Bool[Array, ""] | np.bool_:
    """True where an entry of `gain` is infinite or exceeds `gain_limit` (`xnp` as for
    `not_positive_definite`; nan is left to that test)."""
    return xnp.any(xnp.abs(gain) > gain_limit(gain.dtype))


def require_positive_definite(name: str, gain: Array, reason: str) -> tuple[TracedCheck, ...]:
    """Checks that `gain` is finite, not so large that its products overflow
    (`too_large`), and SPD: eagerly (`ValueError`, one message each) if concrete, returning
    no check; traced, returns one check `(flag, message)` for both, for the caller to
    attach (`attach_checks`)."""
    overflow = (
        f"`{name}` must have entries of at most {gain_limit(gain.dtype):.3g} in magnitude "
        f"(√ of the largest {gain.dtype.name}): the formulation multiplies gains with each "
        "other and with the state, so a larger one overflows to inf or nan in the "
        "equations of motion, and the solve would fail as if the model had broken down. "
        "Stabilization gains are usually far smaller (larger ones make the equations stiff)."
    )
    message = f"`{name}` must be symmetric positive definite ({reason})."
    if is_concrete(gain):
        gain_np = np.asarray(gain)
        if bool(too_large(gain_np, np)):
            raise ValueError(f"{overflow} Got an entry of {np.max(np.abs(gain_np)):.3g}.")
        if bool(not_positive_definite(gain_np, np)):
            raise ValueError(f"{message} Got {describe_gain(gain)}.")
        return ()
    # One check per gain (each is a branch of the compiled program's error).
    return (
        (
            too_large(gain) | not_positive_definite(gain),
            f"{message[:-1]}, with entries of at most {gain_limit(gain.dtype):.3g} in "
            "magnitude (larger ones overflow in the equations of motion, and the solve "
            "would fail as if the model had broken down).",
        ),
    )
