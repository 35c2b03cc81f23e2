"""The reverse-mode derivative of one solver step by automatic differentiation: the
default of `_step_adjoints.step_vjp`, what a derivative written for a solver falls back to
for steps it does not cover, and the reference that such a derivative is tested against."""

from collections.abc import Callable

import diffrax
import equinox as eqx

from .._custom_types import Array, PyTree


def autodiff_step_vjp(
    solver: diffrax.AbstractSolver,
    t0: Array,
    t1: Array,
    state: tuple[PyTree, PyTree],
    diff: PyTree,
    static: PyTree,
    outputs: PyTree = None,
) -> tuple[tuple[tuple[PyTree, PyTree], PyTree], Callable]:
    """The outputs of one step of `solver` and their pullback, by `eqx.filter_vjp` of
    `solver.step` (the default of [`step_vjp`][], and the reference that a registered
    derivative is tested against). Reverse mode runs the step again to linearize it:
    `outputs` is ignored."""
    del outputs

    def step(state, diff):
        terms, args = eqx.combine(diff, static)
        y1, _, dense, solver_state1, _ = solver.step(terms, t0, t1, state[0], args, state[1], False)
        return (y1, solver_state1), dense

    return eqx.filter_vjp(step, state, diff)
