"""Solvers around a diffrax solver: the base of solvers that name their own failures, the
base that delegates to a wrapped solver, and an explicit Runge–Kutta solver with its stages
written out, for batched solves."""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import described
from .._compilation._private_apis import unvmap_any
from .._custom_types import Array, PyTree, ScalarLike
from .._solution import RESULTS, Solution
from ._forwarding import Forwarded


def _combine(base: PyTree[Array], weights, ks: list) -> PyTree[Array]:
    """`base + Σ_j weights[j] · ks[j]`, leaving out the zero weights."""
    terms = [(float(w), k) for w, k in zip(weights, ks, strict=False) if float(w) != 0.0]
    if not terms:
        return base
    return jax.tree.map(
        lambda b, *k: b + sum(w * k_j for (w, _), k_j in zip(terms, k, strict=False)),
        base,
        *(k for _, k in terms),
    )


class AbstractFailureNamingSolver(diffrax.AbstractSolver):
    """A solver that names its own failures in jaxdae's terms ([`jaxdae.RESULTS`][]).

    The outcome of a solve asks every solver that declares this base (`name_result`,
    `name_stall`), and every solver inside a jaxdae wrapper ([`AbstractSolverWrapper`][]),
    from the outside in, rather than knowing which solvers can fail in which way. Both
    default to leaving the result as it is; a solver overrides what it can name."""

    def name_result(self, result: RESULTS) -> RESULTS:
        """The `result` of a solve with this solver (traced, at the end of the solve), with
        the failures that this solver reports through diffrax's result named."""
        return result

    def name_stall(self, sol: Solution, system) -> Solution:
        """`sol` (concrete) of a solve of `system` with this solver, relabelled where this
        solver explains why its steps stalled (`dt_min_reached`). Called after the solve,
        eagerly."""
        return sol


@functools.singledispatch
def carries_contact_forces(solver: diffrax.AbstractSolver) -> bool:
    """Whether `solver` integrates the rates of the solve's term, which between events hold
    the resting contacts' forces (`_events.ContactTerm`). A solver that integrates the
    system's own equations instead, as [`jaxdae.GeneralizedAlpha`][] does, registers False:
    an event-driven solve with it ends with `RESULTS.resting_contact_unsupported` where a
    contact comes to rest. Dispatched on the solver's class; jaxdae's wrappers ask what
    they wrap."""
    del solver
    return True


class AbstractSolverWrapper(AbstractFailureNamingSolver, diffrax.AbstractAdaptiveSolver):
    """A solver around a wrapped diffrax `solver`, from which it takes what it does not
    override (terms, interpolation, order, vector field), and whose failures it names.

    Not a `diffrax.AbstractWrappedSolver`, whose metaclass makes every `isinstance` test
    see through to the wrapped solver: `Projected(Tsit5())` would pass as a
    `diffrax.AbstractERK` without the tableau that its class promises, a wrapper of
    `GeneralizedAlpha` as an implicit solver whose `root_finder` diffrax rewrites, and
    `diffrax.ForwardMode` and `DirectAdjoint` would set the `scan_kind` of any wrapped
    Runge–Kutta solver. A wrapper here is what its class says; what it forwards is
    declared below. The outcome asks the wrapped solver to name its failures too."""

    solver: eqx.AbstractVar[diffrax.AbstractSolver]
    term_structure = Forwarded("solver")
    term_compatible_contr_kwargs = Forwarded("solver")
    interpolation_cls = Forwarded("solver")
    order = Forwarded("solver")
    error_order = Forwarded("solver")
    func = Forwarded("solver")


carries_contact_forces.register(
    AbstractSolverWrapper, lambda solver: carries_contact_forces(solver.solver)
)


class AbstractSteppingWrapper(AbstractSolverWrapper):
    """A solver that computes the steps of the wrapped diffrax `solver` its own way: the
    same steps up to rounding (an adjoint may recompute them with the wrapped solver)."""


class UnrolledERK(AbstractSteppingWrapper):
    """Wraps a diffrax explicit Runge–Kutta solver (`Tsit5`, `Dopri5`, `Bosh3`, `Heun`, …)
    and computes its steps with the stages written out one after the other, instead of in
    diffrax's loop over stages. Same tableau, error estimate, dense output and
    first-same-as-last reuse, so the same steps up to rounding.

    Without the stage loop XLA fuses more of a step, and batches gain most, on a GPU most of
    all, where every loop of a step is a chain of kernel launches. The price is compile time:
    the right-hand side is compiled once per stage ([benchmarks](../benchmarks.md),
    `experiments/benchmarks/bench_unrolled.py`). Use it for batches, ensembles, tuning and any batch
    on a GPU; keep the plain solver where compile time matters.

    ```python
    solver = jaxdae.UnrolledERK(diffrax.Tsit5())
    sols = jax.vmap(lambda q0, v0: jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0,
                                                   solver=solver))(q0s, v0s)
    ```

    **Arguments:**

    - `solver`: a `diffrax.AbstractERK` with a single `diffrax.ButcherTableau`.
    """

    solver: diffrax.AbstractERK

    def __check_init__(self):
        # The class, not `isinstance`: a wrapped solver (`diffrax.HalfSolver`) passes
        # diffrax's `isinstance` tests of what it wraps, and has no tableau.
        if not (
            issubclass(type(self.solver), diffrax.AbstractERK)
            and isinstance(self.solver.tableau, diffrax.ButcherTableau)
        ):
            raise ValueError(
                "`UnrolledERK` wraps an explicit Runge–Kutta solver with one Butcher "
                "tableau (e.g. `diffrax.Tsit5()`, `diffrax.Dopri5()`, `diffrax.Heun()`); got "
                f"{described(self.solver)}. Pass other solvers to `simulate` directly."
            )

    def _fsal(self, terms, t0, t1, y0, args) -> bool:
        # As diffrax: reusing the last stage needs the vector field itself, not `vf_prod`.
        return self.solver.tableau.fsal and not terms.is_vf_expensive(t0, t1, y0, args)

    def init(self, terms, t0, t1, y0, args):
        """The first stage's vector field for first-same-as-last tableaus, else `None`."""
        return terms.vf(t0, y0, args) if self._fsal(terms, t0, t1, y0, args) else None

    def step(self, terms, t0: ScalarLike, t1: ScalarLike, y0, args, solver_state, made_jump):
        tableau = self.solver.tableau
        dt, control = t1 - t0, terms.contr(t0, t1)
        fsal = self._fsal(terms, t0, t1, y0, args)
        if fsal and made_jump is False:
            f0 = solver_state  # diffrax passes a static `False` when no jump can happen
        elif fsal:
            # After a jump the stored last stage is stale. One flag for the whole batch, so
            # that `vmap` keeps a branch instead of evaluating both.
            f0 = jax.lax.cond(
                unvmap_any(made_jump), lambda: terms.vf(t0, y0, args), lambda: solver_state
            )
        else:
            f0 = terms.vf(t0, y0, args)
        fs, ks = [f0], [terms.prod(f0, control)]
        yi = y0  # the last stage's state (an `ssal` tableau has at least one stage)
        for c, row in zip(tableau.c, tableau.a_lower, strict=False):
            yi = _combine(y0, row, ks)
            # Python floats: the tableau's float64 numbers would promote float32 times.
            ti = t1 if c == 1 else t0 + float(c) * dt
            fs.append(terms.vf(ti, yi, args))
            ks.append(terms.prod(fs[-1], control))
        y1 = yi if tableau.ssal else _combine(y0, tableau.b_sol, ks)
        y_error = _combine(jax.tree.map(jnp.zeros_like, y0), tableau.b_error, ks)
        dense_info = dict(y0=y0, y1=y1, k=jax.tree.map(lambda *k: jnp.stack(k), *ks))
        new_state = fs[-1] if fsal else None
        return y1, y_error, dense_info, new_state, diffrax.RESULTS.successful
