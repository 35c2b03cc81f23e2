"""Singular passages on IFToMM benchmark A02 (two parallelograms in a row): where the cranks
lie flat the constraints lose rank. `PseudoInverse` stays on the parallelogram branch, the
1-DOF motion, and `singular_passages` names the flat configurations; `ModifiedLagrange`
names them too but leaves that branch (docs/failures.md, "Singular passages";
experiments/studies/singular_passages.py)."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import jaxdae

from ._systems import NFourBar

N, T1, DT = 2, 1.5, 0.01
TS = np.linspace(0.0, T1, round(T1 / DT) + 1)
SYSTEM = NFourBar(N)


def _reference():
    """`x` of the first crank's tip, `cos φ`, at `TS`, and the times where `sin φ = 0`: the
    parallelogram's motion `I φ̈ = −g c cos φ` (all cranks at `φ`, couplers horizontal)."""
    inertia, weight = (N + 1) / 3 + N, (N + 1) / 2 + N

    def field(t, y):
        return [y[1], -9.81 * weight * np.cos(y[0]) / inertia]

    def flat(t, y):
        return np.sin(y[0])

    sol = solve_ivp(
        field,
        (0.0, T1),
        [np.pi / 2, -1.0],
        method="DOP853",
        t_eval=TS,
        events=flat,
        rtol=1e-12,
        atol=1e-12,
    )
    return np.cos(sol.y[0]), sol.t_events[0]


X_REF, FLAT = _reference()


def _solve(formulation):
    q0, v0 = SYSTEM.initial_state()
    return jaxdae.simulate(
        SYSTEM, formulation, 0.0, T1, q0, v0, ts=jnp.asarray(TS), rtol=1e-8, atol=1e-10, throw=False
    )


def _off_branch(q):
    """Distance from the parallelogram: cranks at one angle, couplers horizontal."""
    turn = q[:, : N + 1] - q[:, :1]
    return np.max(np.abs(np.arctan2(np.sin(turn), np.cos(turn))), axis=1) + np.max(
        np.abs(np.sin(q[:, N + 1 :])), axis=1
    )


@pytest.mark.slow
def test_singular_passages_of_the_four_bar_chain():
    assert FLAT.size == 2  # φ = 0 at t ≈ 0.71 s and φ = −π at t ≈ 1.23 s

    sol = _solve(jaxdae.PseudoInverse(10.0, 25.0))
    assert bool(sol.succeeded)
    q = np.asarray(sol.q)
    assert np.max(np.abs(np.cos(q[:, 0]) - X_REF)) < 1e-5
    assert np.max(_off_branch(q)) < 1e-8
    passages = sol.singular_passages()
    assert passages.shape == FLAT.shape
    assert np.max(np.abs(passages - FLAT)) <= DT

    # The penalty reports the same flat configurations, but leaves the parallelogram at
    # the second of them.
    for alpha in (1e3, 1e7):
        sol = _solve(jaxdae.ModifiedLagrange(alpha, 10.0, 25.0))
        passages = sol.singular_passages()
        assert passages.shape == FLAT.shape
        assert np.max(np.abs(passages - FLAT)) <= DT
        off_branch = _off_branch(np.asarray(sol.q))
        assert np.max(off_branch[TS < FLAT[1] - 0.05]) < 1e-2
        assert np.max(off_branch[TS > FLAT[1] + 0.05]) > 1e-2
