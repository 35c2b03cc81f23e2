"""diffrax's implicit solvers configured for jaxdae's solves: the root finder's termination
test and tolerances, and a chord iteration compiled into the step
([`jaxdae.configure_implicit`][])."""

from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
from jax.flatten_util import ravel_pytree

from .._checks import check_tolerances
from .._compilation._linalg import factor_for_solves, solve_factored
from .._compilation._private_apis import stage_diagonal, use_stepsize_tol
from .._custom_types import Array, PyTree, Scalar, ScalarLike
from .._gains import is_concrete
from ._controllers import inner_controller
from ._jacobian import check_jacobian, column_seeds, tangent_products
from ._solvers import AbstractSolverWrapper


def _terminate(state, kappa: float):
    """The stopping test of [`jaxdae.ToleranceChord`][] and [`jaxdae.FusedChord`][] on a
    state holding the scaled sizes of the last two increments (`diffsize`,
    `diffsize_prev`), the iteration count (`step`) and the linear solve's `result`."""
    rate = state.diffsize / state.diffsize_prev
    small = (state.step >= 1) & (state.diffsize <= kappa)
    at_least_two = state.step >= 2
    converged = at_least_two & (rate < 1) & (state.diffsize * rate / (1 - rate) < kappa)
    diverged = at_least_two & ~small & ~converged & ((rate > 2) | ~jnp.isfinite(rate))
    result = optx.RESULTS.where(
        diverged, optx.RESULTS.nonlinear_divergence, optx.RESULTS.successful
    )
    failed_linear_solve = state.result != optx.RESULTS.successful
    result = optx.RESULTS.where(failed_linear_solve, state.result, result)
    return failed_linear_solve | small | converged | diverged, result


def check_chord_options(name: str, rtol, atol, kappa) -> None:
    """`ValueError` for a chord iteration's tolerances that break `check_tolerances`' rule
    (the step-size controller's), or a `kappa` outside `(0, 1]`: the iteration stops at
    increments of `kappa` times the tolerance, and above the tolerance itself the step's
    error estimate no longer bounds what the iteration leaves."""
    check_tolerances(rtol, atol, whose=f"`{name}`'s ")
    if is_concrete(kappa) and not (np.ndim(kappa) == 0 and 0 < float(kappa) <= 1):
        raise ValueError(
            f"`{name}(kappa=...)` must be in (0, 1] (the fraction of the tolerance at which "
            f"the iteration stops; default 0.01); got {kappa!r}."
        )


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

    rtol: ScalarLike  # the step-size controller's, a JAX scalar there
    atol: ScalarLike
    norm: Callable[[PyTree], Scalar] = optx.rms_norm
    kappa: float = 1e-2
    linear_solver: Any = None

    def __check_init__(self):
        check_chord_options("ToleranceChord", self.rtol, self.atol, self.kappa)

    @property
    def _chord(self) -> diffrax.VeryChord:
        options = {} if self.linear_solver is None else dict(linear_solver=self.linear_solver)
        return diffrax.VeryChord(
            rtol=self.rtol, atol=self.atol, norm=self.norm, kappa=self.kappa, **options
        )

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        return self._chord.init(fn, y, args, options, f_struct, aux_struct, tags)

    def step(self, fn, y, args, options, state, tags):
        return self._chord.step(fn, y, args, options, state, tags)

    def terminate(self, fn, y, args, options, state, tags):
        del fn, y, args, options, tags
        return _terminate(state, self.kappa)

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


class _FusedChordState(eqx.Module):
    factored: PyTree[Array]  # the inverse of the iteration matrix, or its LU factors
    diffsize: Scalar
    diffsize_prev: Scalar
    result: optx.RESULTS
    step: Array


class FusedChord(optx.AbstractRootFinder):
    """The chord (simplified Newton) iteration of diffrax's implicit Runge–Kutta solvers,
    with its iteration matrix built, factorized and applied by array operations that XLA
    compiles into the step, stopped as [`jaxdae.ToleranceChord`][] stops.

    The stages of an ESDIRK method (`diffrax.Kvaerno5`, …) solve `z − h aᵢᵢ f(tᵢ, yᵢ + z)
    = …`; their iteration matrix `I − h γ J` (`J = ∂f/∂y`) is the same for every stage
    of a step, so diffrax computes it once per step and every stage's iteration reuses it
    (Hairer & Wanner, *Solving ODEs II*, §IV.8, the simplified Newton iteration (8.16)).
    `diffrax.VeryChord` builds it with lineax: the Jacobian by `jax.vmap` over the
    tangents, an LU factorization by LAPACK and one triangular solve pair per iteration,
    custom calls that cut a solve's loop into separately dispatched kernels on the CPU.
    Here:

    - the Jacobian of the stage equation comes from one `jax.linearize`, applied to its
        tangents one after the other (compressed by the sparsity's column colouring with
        `jacobian="coloured"`), as in [`jaxdae.Rodas5P`][];
    - it is inverted once per step with array operations (`factor_for_solves`: up to 16
        states, and up to 64 where the Jacobian takes at most 17 tangents), so that each
        iteration is one evaluation of `f` and one matrix–vector product; beyond, it is
        LU-factorized by LAPACK;
    - diffrax's step also asks for the matrix of its explicit first stage (`aᵢᵢ = 0`,
        the identity): it is returned without a linearization.

    The iteration, its tolerances and its test are [`jaxdae.ToleranceChord`][]'s: it has
    converged once an increment is below `kappa` of the tolerance (or the rate test says
    so), diverged where the rate exceeds 2 with an increment above it, which makes
    diffrax reject the step. Gradients: diffrax's step differentiates each stage's root
    implicitly (optimistix's `ImplicitAdjoint`, with lineax's solve), as with
    `VeryChord`; the chord iterations themselves are not differentiated.

    [`jaxdae.configure_implicit`][] (and so [`jaxdae.simulate`][]) installs it in place
    of a `diffrax.VeryChord` with lineax's default linear solver.

    **Arguments:**

    - `rtol`, `atol`: tolerances of the increments, as those of the step-size
        controller: `Δ` is measured in units of `atol + rtol |y|`.
    - `norm`: the norm of the scaled increments (default `optimistix.rms_norm`).
    - `kappa`: the fraction of the tolerance at which the iteration stops (default `0.01`).
    - `jacobian`: `"coloured"` (default: one tangent per group of columns of the
        Jacobian's structural sparsity that share no row) or `"dense"` (one per state).

    **Raises:**

    `ValueError` for another `jacobian`.
    """

    rtol: ScalarLike  # the step-size controller's, a JAX scalar there
    atol: ScalarLike
    norm: Callable[[PyTree], Scalar] = optx.rms_norm
    kappa: float = 1e-2
    jacobian: str = "coloured"

    def __check_init__(self):
        check_chord_options("FusedChord", self.rtol, self.atol, self.kappa)
        check_jacobian("FusedChord", self.jacobian)

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        del f_struct, aux_struct, tags
        if "init_state" in options:  # diffrax's step: the matrix of the step's stages
            return options["init_state"]
        x, unravel = ravel_pytree(y)

        def residual(z):
            return ravel_pytree(fn(unravel(z), args)[0])[0]

        def factor():
            _, tangent = jax.linearize(residual, x)
            seeds, expand = column_seeds(residual, x, self.jacobian)
            columns = tangent_products(tangent, seeds.astype(x.dtype)).T
            return factor_for_solves(expand(columns), len(seeds))

        diagonal = stage_diagonal(args)
        if diagonal is None:
            factored = factor()
        else:
            identity = jax.tree.map(
                lambda leaf: (
                    jnp.eye(x.size, dtype=leaf.dtype)
                    if leaf.ndim == 2
                    else jnp.arange(x.size, dtype=leaf.dtype)
                ),
                jax.eval_shape(factor),
            )
            factored = jax.lax.cond(diagonal == 0, lambda: identity, factor)
        return _FusedChordState(
            factored=jax.lax.stop_gradient(factored),
            diffsize=jnp.array(jnp.inf, x.dtype),
            diffsize_prev=jnp.array(1.0, x.dtype),
            result=optx.RESULTS.successful,
            step=jnp.array(0),
        )

    def step(self, fn, y, args, options, state, tags):
        del options, tags
        fx, aux = fn(y, args)
        x, unravel = ravel_pytree(y)
        diff = solve_factored(jax.lax.stop_gradient(state.factored), ravel_pytree(fx)[0])
        # A diverging iteration that overflows ends at NaN, not at infinities: diffrax's
        # step-size controller measures a rejected step against its state where it is
        # NaN, while an infinite one would make the next step size NaN.
        new = x - diff
        new = jnp.where(jnp.all(jnp.isfinite(new)), new, jnp.nan)
        with jax.numpy_dtype_promotion("standard"):
            diffsize = self.norm(unravel(diff / (self.atol + self.rtol * jnp.abs(new))))
        new_state = _FusedChordState(
            factored=state.factored,
            diffsize=diffsize,
            diffsize_prev=state.diffsize,
            result=state.result,
            step=state.step + 1,
        )
        return unravel(new), new_state, aux

    def terminate(self, fn, y, args, options, state, tags):
        del fn, y, args, options, tags
        return _terminate(state, self.kappa)

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


def configure_implicit(
    solver: diffrax.AbstractSolver, rtol, atol, norm: Callable[[PyTree], Scalar] = optx.rms_norm
) -> diffrax.AbstractSolver:
    """An implicit diffrax solver whose Newton (chord) iterations stop where they should and
    run inside the compiled step; any other solver unchanged.

    diffrax's implicit Runge–Kutta solvers (`diffrax.Kvaerno5()`, `Kvaerno3`, `Kvaerno4`,
    `ImplicitEuler`, `KenCarp…`) iterate with `diffrax.VeryChord`, whose divergence test
    fires on converged iterations (see [`jaxdae.ToleranceChord`][]): steps are rejected
    for nothing and the solve takes many times the steps it needs; and whose lineax
    solves run as separate kernels on the CPU. This replaces such a root finder by a
    [`jaxdae.FusedChord`][] (the same test, its iteration matrix factorized by array
    operations and applied as a product with its inverse), or, where the `VeryChord` was
    given its own linear solver, by a [`jaxdae.ToleranceChord`][] that keeps it, with the
    given tolerances — those of the step-size controller, unless the solver's root finder
    has its own — and leaves every other solver (explicit ones, and implicit ones with
    another root finder) as it is.

    ```python
    solver = jaxdae.configure_implicit(diffrax.Kvaerno5(), rtol=1e-6, atol=1e-9)
    sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, solver=solver,
                          rtol=1e-6, atol=1e-9)
    ```

    The guide `docs/guides/stiff_integration.md` counts the steps of Kvaerno5 as diffrax
    builds it and configured, on the two-link arm and on a stiff spring pendulum, and
    measures the cost of a step (`experiments/studies/stiff_integration.py`).

    A successful solve means that each step's estimated local error was within the
    tolerance, not that the solution is within it: along a neutrally stable direction (the
    phase of a free rotation) the local errors add up over the run, as
    [`jaxdae.Rodas5P`][]'s docstring and the guide's flyball governor show; there choose
    `rtol` for the global error over the horizon.

    **Arguments:**

    - `solver`: any diffrax solver.
    - `rtol`, `atol`: the step's tolerances (as given to [`jaxdae.simulate`][]).
    - `norm`: the norm of the step-size controller (default `optimistix.rms_norm`, that of
        `simulate`'s default controller).

    **Returns:**

    `solver`, with a `diffrax.VeryChord` root finder replaced by a
    [`jaxdae.FusedChord`][] (its `kappa` kept), or by a [`jaxdae.ToleranceChord`][] where
    it has a linear solver other than lineax's default.
    """
    if isinstance(solver, AbstractSolverWrapper):  # e.g. `jaxdae.Projected`: the wrapped one
        return eqx.tree_at(
            lambda s: s.solver, solver, configure_implicit(solver.solver, rtol, atol, norm)
        )
    if not isinstance(solver, diffrax.AbstractImplicitSolver):
        return solver
    finder = solver.root_finder
    if not isinstance(finder, diffrax.VeryChord):
        return solver
    own = finder.rtol is not use_stepsize_tol
    options = dict(
        rtol=finder.rtol if own else rtol,
        atol=finder.atol if own else atol,
        norm=finder.norm if finder.norm is not use_stepsize_tol else norm,
        kappa=finder.kappa,
    )
    if finder.linear_solver == lx.AutoLinearSolver(well_posed=None):  # lineax's default
        chord = FusedChord(**options)
    else:
        chord = ToleranceChord(**options, linear_solver=finder.linear_solver)
    return eqx.tree_at(lambda s: s.root_finder, solver, chord)


def configure_for_controller(
    solver: diffrax.AbstractSolver | None, stepsize_controller
) -> diffrax.AbstractSolver | None:
    """[`jaxdae.configure_implicit`][] with the tolerances and norm of
    `stepsize_controller` (a `diffrax.PIDController`, possibly inside a
    `diffrax.ClipStepSizeController`); `solver` unchanged for other controllers (fixed
    steps have no tolerance: diffrax then asks for the root finder's own) and None
    (`simulate`'s default solver) unchanged."""
    controller = inner_controller(stepsize_controller)
    if solver is None or not isinstance(controller, diffrax.PIDController):
        return solver
    return configure_implicit(solver, controller.rtol, controller.atol, controller.norm)
