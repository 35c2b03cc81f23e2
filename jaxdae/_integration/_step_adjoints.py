"""The reverse-mode derivative of one solver step, as [`jaxdae.ReplayAdjoint`][] applies it
to each replayed step: by default `eqx.filter_vjp` of the solver's `step`, or a derivative
written for the solver's type and registered here, and whether that derivative reuses the
step's outputs that the replay keeps ([`reuses_outputs`][])."""

import functools
from collections.abc import Callable

import diffrax
from jax.flatten_util import ravel_pytree

from .. import _thresholds
from .._custom_types import Array, PyTree
from ._autodiff_step import autodiff_step_vjp
from ._esdirk_adjoint import esdirk_step_vjp
from ._rosenbrock import Rodas5P
from ._rosenbrock_adjoint import rodas_step_vjp


@functools.singledispatch
def step_vjp(
    solver: diffrax.AbstractSolver,
    t0: Array,
    t1: Array,
    state: tuple[PyTree, PyTree],
    diff: PyTree,
    static: PyTree,
    outputs: PyTree = None,
) -> tuple[tuple[tuple[PyTree, PyTree], PyTree], Callable]:
    """One step of `solver` from `t0` to `t1` and its vector–Jacobian product, for the
    backward pass of [`jaxdae.ReplayAdjoint`][] (`_replay_adjoint._backward`), which calls
    it at every replayed step with `made_jump=False`.

    Dispatched on the type of `solver` (`functools.singledispatch`, so a derivative can be
    written for a class that jaxdae does not own, such as `diffrax.Kvaerno5`). The
    default is [`autodiff_step_vjp`][]: `eqx.filter_vjp` of `solver.step`. A solver
    whose step reverse mode differentiates slowly (a factorization, a Newton iteration, a
    Jacobian built by forward mode) registers its own derivative, e.g. the discrete
    adjoint of its stages, at the end of this module:

    ```python
    from ._my_solver_adjoint import my_step_vjp
    step_vjp.register(MySolver, my_step_vjp)
    ```

    Registration is by class and applies to subclasses; `solver` is the solver the user
    gave (the replay unwraps its own wrapper first), so a wrapper of a registered solver
    (`jaxdae.Projected`) takes the default unless it is registered itself.

    **Arguments:**

    - `solver`: the solver whose step is replayed.
    - `t0`, `t1`: the step's start and end, in the solver's time (`diffeqsolve` hands the
        solver its terms wrapped for the direction of time, and these times multiplied by
        it). Constants of the gradient: no cotangent is returned for them.
    - `state`: `(y0, solver_state0)`, the state and solver state at `t0`.
    - `diff`, `static`: the solve's `(terms, args)` split by `eqx.partition` into the
        leaves that the gradient reaches (`diff`: the perturbed ones, None elsewhere) and
        the rest; `eqx.combine(diff, static)` is `(terms, args)`.
    - `outputs`: None, or the step's outputs `((y1, solver_state1), dense_info)` as
        the replay's `solver.step` computed them, given where [`reuses_outputs`][] says
        so: a derivative that needs only values of the step (an ESDIRK's stages, in its
        dense output) takes them from here instead of running the step again, and
        returns them as its outputs.

    **Returns:**

    `(outputs, pullback)`, as `eqx.filter_vjp` of `(state, diff) ↦ outputs` returns them:

    - `outputs = ((y1, solver_state1), dense_info)`: the step's end state, solver state
        and dense output, equal to those of `solver.step(terms, t0, t1, y0, args,
        solver_state0, False)`: the same computation, not a rewrite of it (the replay's
        checkpoints and saved states come from `solver.step` itself, and separately
        compiled programs of it agree only to rounding). The error
        estimate is not an output: the step sizes are constants of the gradient.
    - `pullback(((y1_bar, solver_state1_bar), dense_bar))` returns `((y0_bar,
        solver_state0_bar), diff_bar)`. Each cotangent has the structure of its primal,
        with arrays (zeros where nothing flows) for the floating-point array leaves and
        None for the others: `dense_bar` is all zeros unless `ts` are saved inside the
        step (through `solver.interpolation_cls(t0=…, t1=…, **dense_info)`),
        `solver_state1_bar` is zeros for a solver without state carried between steps,
        and `diff_bar` is None wherever `diff` is, as `eqx.filter_vjp` makes it (the
        replay adds it leaf by leaf to the other steps' cotangents).

    A registered derivative is tested against [`autodiff_step_vjp`][] on one step
    (`tests/test_implicit_adjoint.py`, `tests/test_esdirk_adjoint.py`), to rounding.
    """
    return autodiff_step_vjp(solver, t0, t1, state, diff, static)


@functools.singledispatch
def reuses_outputs(solver: diffrax.AbstractSolver) -> bool:
    """Whether [`step_vjp`][] of `solver` takes the step's outputs from its `outputs`
    argument instead of running the step again: then [`jaxdae.ReplayAdjoint`][] keeps
    each replayed step's outputs (its dense output, whose size is the solver's: for an
    ESDIRK, `y0`, `y1` and one vector per stage) beside its start state, and passes them.
    Dispatched on the type of `solver`, as `step_vjp` is; registered with the derivative
    that uses them. Default: False (reverse mode, [`autodiff_step_vjp`][], runs the step
    to linearize it)."""
    del solver
    return False


# The solvers' own step adjoints.
step_vjp.register(diffrax.AbstractESDIRK, esdirk_step_vjp)
reuses_outputs.register(diffrax.AbstractESDIRK, lambda solver: True)


@step_vjp.register
def _rodas(solver: Rodas5P, t0, t1, state, diff, static, outputs=None):
    # Its discrete adjoint from `ROSENBROCK_ADJOINT_MIN` states, reverse mode below. Its
    # dense output holds combinations of the stages, not the stages: `outputs` is not
    # kept for it (`reuses_outputs` false).
    del outputs
    if ravel_pytree(state[0])[0].size < _thresholds.ROSENBROCK_ADJOINT_MIN:
        return autodiff_step_vjp(solver, t0, t1, state, diff, static)
    return rodas_step_vjp(solver, t0, t1, state, diff, static)
