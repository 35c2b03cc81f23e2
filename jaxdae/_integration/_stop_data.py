"""What the two contact schemes ([`jaxdae.EventDriven`][], [`jaxdae.TimeStepping`][])
share: their abstract base, which the problem stage consults, and the check of the shapes
of a system's one-sided constraint data before either solves."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class AbstractContactScheme(eqx.Module):
    """How [`jaxdae.simulate`][] treats the one-sided constraints of a system, given as its
    `events`: exactly, by events ([`jaxdae.EventDriven`][]), or by fixed time steps
    ([`jaxdae.TimeStepping`][]). The problem stage (`_problem.py`) consults it once."""

    @abc.abstractmethod
    def configure(self, call, t0, t1):
        """`(call, stepping)`: the `SolveCall` of a solve from `t0` to `t1` as this scheme
        solves it, and the [`jaxdae.TimeStepping`][] that steps it (`None` for a scheme
        that integrates between events). Refuses, with a `ValueError`, options the scheme
        does not take."""


def check_stop_shapes(system, t0, q_one, q0, tolerance: float | None) -> None:
    """`ValueError` for stop data of the wrong shape: `restitution` or `friction` not one
    coefficient or one per gap, `slip_velocities` not one or two per gap; and, where
    `tolerance` is given (concrete values), a start `q0` that violates a gap by more than
    it. `q_one` is one trajectory's coordinates (for the shapes); the system has gaps."""
    shape = jax.eval_shape(system.gaps, t0, q_one).shape
    for name, values in (("restitution", system.restitution()), ("friction", system.friction())):
        if jnp.ndim(values) > 1 or jnp.size(values) not in (1, shape[0]):
            raise ValueError(
                f"`{name}` must return one coefficient or one per gap ({shape[0]}); got "
                f"shape {jnp.shape(values)}."
            )
    slip_shape = jax.eval_shape(system.slip_velocities, t0, q_one, q_one).shape
    if slip_shape not in (shape, (*shape, 2)):
        raise ValueError(
            f"`slip_velocities` must return one sliding velocity per gap, shape {shape} (in "
            f"the plane), or two, shape {(*shape, 2)} (in space); got shape {slip_shape}."
        )
    if tolerance is not None:
        gaps = np.asarray(system.gaps(t0, q0))
        if np.any(gaps < -tolerance):
            index = int(np.argmin(gaps))
            raise ValueError(
                f"The initial state violates {system.gap_label(index)}: g(t0, q0)[{index}] = "
                f"{gaps[index]:.6g} < 0 (a one-sided constraint `gaps(t, q) ≥ 0`). Start "
                "where every gap is open or closed (≥ 0)."
            )
