"""The result of [`jaxdae.simulate`][]."""

import diffrax
import equinox as eqx
import numpy as np

from ._custom_types import Array, Float, Int


class RESULTS(diffrax.RESULTS):  # pyright: ignore[reportGeneralTypeIssues]
    """Outcomes of a simulation; `RESULTS.successful` or a named failure."""

    singular_constraint_matrix = (
        "The constraint matrix J M⁻¹ Jᵀ became singular (redundant constraints or a "
        "singular configuration), so the exact Lagrange multipliers do not exist there. "
        "Use `jaxdae.PseudoInverse` or `jaxdae.ModifiedLagrange`, which continue through "
        "such configurations."
    )
    singular_dependent_jacobian = (
        "The Jacobian ∂F/∂q_dep of the geometric constraints with respect to the dependent "
        "coordinates became singular (condition [4] of paper 000 fails), so the dependent "
        "velocities cannot be solved for: choose other coordinates as dependent in "
        "`jaxdae.RedundantCoordinates`, or use a Lagrange-multiplier formulation."
    )

    singular_decoupling_matrix = (
        "The decoupling matrix g = ∂f⁽ᵖ⁻¹⁾/∂w · B of the program constraints lost rank "
        "(g gᵀ became singular), so no input enforces them there (paper 002, eq. [2.9]; "
        "in the adaptive-optics element of §5: s(t) = 0 or sin φ = 0). Change the "
        "programmed motion so that it avoids the singular configuration."
    )

    non_finite_state = (
        "The state became non-finite (inf or nan) with a fixed step size: the step is too "
        "large for the system or for the gains. Check the spectral radius of the method's "
        "transition `jaxdae.transition_matrix(jaxdae.perturbation_matrix(...), solver, dt)` "
        "(it must be below 1, paper 002 §4), or reduce `dt0`."
    )


class SimulationError(RuntimeError):
    """Raised by [`jaxdae.simulate`][] with `throw=True` when the solve did not succeed."""


class Solution(eqx.Module):
    """A constrained trajectory and its diagnostics at the saved times.

    Rows after a failure (see `result`) are `inf`, as in diffrax.

    **Fields:**

    - `ts`: saved times, shape `(N,)`.
    - `q`, `v`: coordinates and velocities, shape `(N, n)` (all coordinates; with
        [`jaxdae.RedundantCoordinates`][] the dependent velocities are those of eq. [5]).
    - `p`: generalized momenta (`∂T/∂v` for a `LagrangianSystem`, the state's momenta for a
        `HamiltonianSystem`), shape `(N, n)`.
    - `phi`, `dphi`: holonomic residual `Φ` and its rate `Φ̇`, shape `(N, m)`.
    - `psi`: nonholonomic residual `Ψ`, shape `(N, k)`.
    - `multipliers`: the multipliers the formulation implies (`M q̈ = Q − Gᵀλ`), holonomic
        then nonholonomic, shape `(N, m + k)`.
    - `energy`: total mechanical energy `T + V`, shape `(N,)`.
    - `t_final`, `q_final`, `v_final`, `p_final`: where the solve ended (at `t1`, or where it
        failed).
    - `result`: a [`jaxdae.RESULTS`][] item.
    - `stats`: diffrax's step statistics (`num_steps`, `num_accepted_steps`,
        `num_rejected_steps`, `max_steps`).
    """

    ts: Float[Array, " N"]
    q: Float[Array, "N n"]
    v: Float[Array, "N n"]
    phi: Float[Array, "N m"]
    dphi: Float[Array, "N m"]
    psi: Float[Array, "N k"]
    multipliers: Float[Array, "N c"]
    energy: Float[Array, " N"]
    t_final: Float[Array, ""]
    q_final: Float[Array, " n"]
    v_final: Float[Array, " n"]
    result: RESULTS
    stats: dict[str, Int[Array, ""]]
    p: Float[Array, "N n"]
    p_final: Float[Array, " n"]

    @property
    def succeeded(self):
        """Boolean array: the solve reached `t1`."""
        return self.result == RESULTS.successful


def failure_message(sol: Solution) -> str | None:
    """A message naming the first failed solve with its final `t` and `q` (concrete values only)."""
    codes = np.asarray(sol.result._value)
    failed = codes != RESULTS.successful._value
    if not np.any(failed):
        return None
    index = tuple(int(i) for i in np.argwhere(failed)[0]) if codes.ndim else ()
    text = RESULTS._index_to_message[int(codes[index])]
    t = np.asarray(sol.t_final)[index]
    q = np.asarray(sol.q_final)[index]
    where = f" (batch element {index})" if index else ""
    return f"{text}\nThe solve stopped{where} at t = {t:.9g}, q = {np.array2string(q, precision=6)}."
