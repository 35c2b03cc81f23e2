"""diffrax's implicit solvers configured for jaxdae's solves: the root finder's termination
test and tolerances ([`jaxdae.configure_implicit`][])."""

from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax.numpy as jnp
import optimistix as optx

from .._compilation._private_apis import use_stepsize_tol
from .._custom_types import PyTree, Scalar
from ._solvers import AbstractSolverWrapper


class ToleranceChord(optx.AbstractRootFinder):
    """The chord iteration of diffrax's implicit Runge–Kutta solvers (`diffrax.VeryChord`:
    one Jacobian per step, reused by every stage), stopped by the size of its increments
    measured in the step's own tolerances.

    `diffrax.VeryChord` (and `optimistix.Chord` without its Cauchy test) estimates the
    contraction rate `θ = ‖Δₖ‖/‖Δₖ₋₁‖` and reports divergence when `θ > 2`, unless the
    increment is below an absolute `10⁻¹³` of the scaled norm. Once an iteration has
    converged, its next increment is rounding noise, and so is `θ`: noise of size
    `10⁻¹⁶ |f|` is `10⁻¹⁰`–`10⁻⁴` of a step tolerance `atol + rtol |f|` between `10⁻⁶`
    and `10⁻¹²`, far above `10⁻¹³`, so `θ > 2` happens about half the time. Each such
    "divergence" rejects the step; the smaller step's better predictor makes the first
    increment smaller still, closer to the noise, and the solve spirals into tiny steps
    (`docs/guides/stiff_integration.md` counts the steps on its models).

    Here an iteration has converged as soon as its increment is below `kappa` of the
    tolerance (`‖Δₖ‖ ≤ κ`, scaled norm: the classical test of Hairer & Wanner, *Solving
    ODEs II*, §IV.8, with the remaining error bounded by the increment), or when the
    rate test of `VeryChord` says so (`θ/(1 − θ) ‖Δₖ‖ < κ`); it has diverged only where
    `θ > 2` with an increment above `κ`. Everything else (the Jacobian's reuse, the
    linear solve) is `diffrax.VeryChord`'s.

    **Arguments:**

    - `rtol`, `atol`: tolerances of the increments, as those of the step-size
        controller: `Δ` is measured in units of `atol + rtol |y|`.
    - `norm`: the norm of the scaled increments (default `optimistix.rms_norm`, as
        [`jaxdae.simulate`][]'s step-size controller).
    - `kappa`: the fraction of the tolerance at which the iteration stops (default `0.01`).
    - `linear_solver`: the lineax solver of the Newton systems (default: lineax's
        automatic choice, an LU factorization for a square matrix).
    """

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = optx.rms_norm
    kappa: float = 1e-2
    linear_solver: Any = None

    @property
    def _chord(self) -> diffrax.VeryChord:
        options = {} if self.linear_solver is None else dict(linear_solver=self.linear_solver)
        return diffrax.VeryChord(rtol=self.rtol, atol=self.atol, norm=self.norm,
                                 kappa=self.kappa, **options)

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        return self._chord.init(fn, y, args, options, f_struct, aux_struct, tags)

    def step(self, fn, y, args, options, state, tags):
        return self._chord.step(fn, y, args, options, state, tags)

    def terminate(self, fn, y, args, options, state, tags):
        del fn, y, args, options, tags
        rate = state.diffsize / state.diffsize_prev
        small = (state.step >= 1) & (state.diffsize <= self.kappa)
        at_least_two = state.step >= 2
        converged = at_least_two & (rate < 1) & (state.diffsize * rate / (1 - rate)
                                                 < self.kappa)
        diverged = at_least_two & ~small & ~converged & ((rate > 2) | ~jnp.isfinite(rate))
        result = optx.RESULTS.where(diverged, optx.RESULTS.nonlinear_divergence,
                                    optx.RESULTS.successful)
        failed_linear_solve = state.result != optx.RESULTS.successful
        result = optx.RESULTS.where(failed_linear_solve, state.result, result)
        return failed_linear_solve | small | converged | diverged, result

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


def configure_implicit(solver: diffrax.AbstractSolver, rtol, atol,
                       norm: Callable[[PyTree], Scalar] = optx.rms_norm
                       ) -> diffrax.AbstractSolver:
    """An implicit diffrax solver whose Newton (chord) iterations stop where they should;
    any other solver unchanged.

    diffrax's implicit Runge–Kutta solvers (`diffrax.Kvaerno5()`, `Kvaerno3`, `Kvaerno4`,
    `ImplicitEuler`, `KenCarp…`) iterate with `diffrax.VeryChord`, whose divergence test
    fires on converged iterations (see [`jaxdae.ToleranceChord`][]): steps are rejected
    for nothing and the solve takes many times the steps it needs. This replaces such a root
    finder by a [`jaxdae.ToleranceChord`][] with the given tolerances — those of the
    step-size controller, unless the solver's root finder has its own — and leaves every
    other solver (explicit ones, and implicit ones with another root finder) as it is.

    ```python
    solver = jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol=1e-6, atol=1e-9)
    sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, solver=solver,
                          rtol=1e-6, atol=1e-9)
    ```

    The guide `docs/guides/stiff_integration.md` counts the steps of Kvaerno5 as diffrax
    builds it and configured, on the two-link arm and on a stiff spring pendulum
    (`experiments/studies/stiff_integration.py`).

    **Arguments:**

    - `solver`: any diffrax solver.
    - `rtol`, `atol`: the step's tolerances (as given to [`jaxdae.simulate`][]).
    - `norm`: the norm of the step-size controller (default `optimistix.rms_norm`, that of
        `simulate`'s default controller).

    **Returns:**

    `solver`, with a `diffrax.VeryChord` root finder replaced by a
    [`jaxdae.ToleranceChord`][] (its `kappa` and linear solver kept).
    """
    if isinstance(solver, AbstractSolverWrapper):  # e.g. `jaxdae.Projected`: the wrapped one
        return eqx.tree_at(lambda s: s.solver, solver,
                           configure_implicit(solver.solver, rtol, atol, norm))
    if not isinstance(solver, diffrax.AbstractImplicitSolver):
        return solver
    finder = solver.root_finder
    if not isinstance(finder, diffrax.VeryChord):
        return solver
    own = finder.rtol is not use_stepsize_tol
    chord = ToleranceChord(
        rtol=finder.rtol if own else rtol,
        atol=finder.atol if own else atol,
        norm=finder.norm if finder.norm is not use_stepsize_tol else norm,
        kappa=finder.kappa,
        linear_solver=finder.linear_solver,
    )
    return eqx.tree_at(lambda s: s.root_finder, solver, chord)


def configure_for_controller(solver: diffrax.AbstractSolver, stepsize_controller
                             ) -> diffrax.AbstractSolver:
    """[`jaxdae.configure_implicit`][] with the tolerances and norm of
    `stepsize_controller` (a `diffrax.PIDController`, possibly inside a
    `diffrax.ClipStepSizeController`); `solver` unchanged for other controllers (fixed
    steps have no tolerance: diffrax then asks for the root finder's own)."""
    controller = stepsize_controller
    while isinstance(getattr(controller, "controller", None),
                     diffrax.AbstractStepSizeController):
        controller = controller.controller
    if not isinstance(controller, diffrax.PIDController):
        return solver
    return configure_implicit(solver, controller.rtol, controller.atol, controller.norm)
