"""The reverse-mode derivative of one step of diffrax's ESDIRK methods (`diffrax.Kvaerno3`,
`Kvaerno4`, `Kvaerno5`), written out stage by stage, for [`jaxdae.ReplayAdjoint`][]
(`_step_adjoints.step_vjp`).

Differentiating diffrax's step itself (`eqx.filter_vjp` of `solver.step`) differentiates
each implicit stage's root by optimistix's implicit-function rule with lineax's automatic
solver: a Jacobian built from one product per state and an LU factorization, for every
implicit stage of every step. The implicit stages of an ESDIRK share their diagonal
coefficient `γ`, and their points lie within one step: one matrix `I − hγJ` per step
serves all of them as the preconditioner of an iterative refinement that solves each
stage's exact transposed equations to rounding.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._compilation._linalg import factor_for_solves, solve_factored
from .._compilation._private_apis import unvmap_any
from ._autodiff_step import autodiff_step_vjp
from ._jacobian import column_seeds, tangent_products
from ._term import terms_within

# Iterative refinement of a stage's transposed equations with the matrix of a later stage
# of the step: at most this many corrections, each at least this factor smaller than the
# last, before the stage's own matrix is built (`_stage_solve`). A stage's matrix differs
# from its neighbours' by the change of the Jacobian between stage points, a small part
# of a step, so the corrections usually shrink by far more than this: by 10⁻³–10⁻⁵ on the
# stiff integration guide's cases, where rounding takes up to seven corrections
# (docs/design_measurements.md#esdirk-adjoint).
_REFINE_ITERATIONS = 8
_REFINE_RATE = 0.1

# A correction below this many units of rounding of the largest entry ends the refinement.
_ROUNDING_UNITS = 4

# Corrections with a stage's own matrix, after which its solve is taken as it is (a direct
# solve's accuracy: `_stage_solve`).
_OWN_MATRIX_CORRECTIONS = 2

_GOING, _DONE, _BUILD = 0, 1, 2


def _written_out(solver, terms) -> bool:
    """Whether `esdirk_step_vjp` differentiates this step by its stages: one Butcher
    tableau whose solution is the weighted sum of the stages (not the last stage's
    value), and one ODE term (`k = h f`, as `diffeqsolve` wraps it for the direction of
    time)."""
    tableau = solver.tableau
    if not isinstance(tableau, diffrax.ButcherTableau) or tableau.ssal:
        return False
    odes = terms_within(terms)
    return len(odes) == 1 and not isinstance(odes[0], diffrax.MultiTerm)


def _coefficients(tableau: diffrax.ButcherTableau, dtype):
    """`(a, b, c)`: the whole lower triangle of the tableau with its diagonal (`a₀₀ = 0`,
    `aᵢᵢ = γ` after it), the solution's weights and the stages' times."""
    stages = tableau.num_stages
    a = np.zeros((stages, stages))
    for i, row in enumerate(tableau.a_lower):
        a[i + 1, : i + 1] = row
    a[np.diag_indices(stages)] = tableau.a_diagonal
    c = np.concatenate([[tableau.c1], np.asarray(tableau.c)])
    return jnp.asarray(a, dtype), jnp.asarray(tableau.b_sol, dtype), c


class _Refinement(eqx.Module):
    """The state of `_stage_solve`: the solution `w` so far and its products
    `(Jᵀw, f_pᵀw)`, the factorized matrix solved with, the size of the last correction,
    the corrections since that matrix was built or kept, and the status."""

    w: jax.Array
    products: tuple
    factored: object
    size: jax.Array
    iteration: jax.Array
    own: jax.Array  # whether `factored` is this stage's own matrix
    status: jax.Array


def _stage_solve(products_of, scale, f_bar, factored, valid, matrix_of):
    """`w` with `(I − scale·J)ᵀ w = f̄` (`products_of(w) = (Jᵀw, f_pᵀw)`, one
    vector–Jacobian product), its products, and the factorized matrix to keep.

    Iterative refinement (Golub & Van Loan 2013, §3.5.3) with `factored`, the transposed
    matrix of a later stage (`matrix_of() = (matrix, tangents)`, factorized by
    `factor_for_solves`): `w ← w + M⁻ᵀ (f̄ − w + scale·Jᵀw)`, each correction one
    product, which also gives the
    products that the adjoint needs, so that the solve ends with them. It ends where a
    correction is at the rounding level of `w` (then `w` and its products are those
    before that correction); where the corrections do not shrink by `_REFINE_RATE`, or
    have not reached rounding after `_REFINE_ITERATIONS`, or no matrix is kept yet
    (`valid` false), this stage's own matrix is built (`matrix_of()`), factorized and
    kept, and `_OWN_MATRIX_CORRECTIONS` corrections with it end the solve: the strategy
    of the forward step's chord iteration, applied to the linear adjoint equations, as
    `jaxdae.GeneralizedAlphaAdjoint` solves its steps' equations.
    """
    eps = jnp.finfo(f_bar.dtype).eps
    zero_products = jax.tree.map(jnp.zeros_like, jax.eval_shape(products_of, f_bar))

    def correct(state):
        def build(factored):
            own = factor_for_solves(*matrix_of())
            return jax.tree.map(
                lambda new, old: jnp.where(state.status == _BUILD, new, old), own, factored
            )

        building = state.status == _BUILD
        # (Under `vmap`, the matrix is built where any member needs it.)
        factored = jax.lax.cond(unvmap_any(building), build, lambda f: f, state.factored)
        own = state.own | building
        iteration = jnp.where(building, 0, state.iteration)
        previous = jnp.where(building, jnp.inf, state.size)
        delta = solve_factored(factored, f_bar - state.w + scale * state.products[0])
        size = jnp.max(jnp.abs(delta))
        w = state.w + delta
        rounding = size <= _ROUNDING_UNITS * eps * jnp.max(jnp.abs(state.w))
        keep = rounding & ~building  # the state before this correction, and its products
        w = jnp.where(keep, state.w, w)
        products = jax.lax.cond(unvmap_any(~keep), products_of, lambda _: state.products, w)
        products = jax.tree.map(
            lambda old, new: jnp.where(keep, old, new), state.products, products
        )
        slow = (
            (size > _REFINE_RATE * previous)
            | ~jnp.isfinite(size)
            | (iteration + 1 >= _REFINE_ITERATIONS)
        )
        finished = keep | (own & (iteration + 1 >= _OWN_MATRIX_CORRECTIONS))
        status = jnp.where(finished, _DONE, jnp.where(slow & ~own, _BUILD, _GOING))
        return _Refinement(w, products, factored, size, iteration + 1, own, status)

    start = _Refinement(
        jnp.zeros_like(f_bar),
        zero_products,
        factored,
        jnp.asarray(jnp.inf, f_bar.dtype),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.bool_),
        jnp.where(valid, _GOING, _BUILD),
    )
    end = jax.lax.while_loop(lambda s: s.status != _DONE, correct, start)
    return end.w, end.products, end.factored


def esdirk_step_vjp(solver: diffrax.AbstractESDIRK, t0, t1, state, diff, static, outputs=None):
    """One step of an ESDIRK method (`diffrax.Kvaerno5`, …) and its vector–Jacobian
    product, by the discrete adjoint of its stages (the contract of
    `_step_adjoints.step_vjp`, whose default, `eqx.filter_vjp` of the step, it equals to
    rounding).

    The step (diffrax's `AbstractRungeKutta.step`, in f-space, `k = h f`) computes
    `fᵢ = f(tᵢ, zᵢ)` with `zᵢ = y₀ + h Σ_{j<i} aᵢⱼ fⱼ + hγ fᵢ` (`f₀` the
    first-same-as-last value carried in the solver state, or `f(t₀, y₀)` on the first
    step) and `y₁ = y₀ + h Σ bᵢ fᵢ`; its dense output holds `y₀`, `y₁` and `kᵢ = h fᵢ`, its
    solver state the last stage's `f`. Each implicit stage's root `fᵢ` moves with its
    inputs by `(I − hγJᵢ) dfᵢ = Jᵢ d(zᵢ − hγfᵢ) + f_p dp` (`Jᵢ = ∂f/∂y` at `zᵢ`; the
    implicit function theorem, as optimistix's `ImplicitAdjoint` differentiates it). In
    reverse, from the last stage to the first, with `f̄ᵢ` the cotangent of `fᵢ`:

    - `(I − hγJᵢ)ᵀ wᵢ = f̄ᵢ`,
    - `z̄ᵢ = Jᵢᵀ wᵢ` and `p̄ += f_pᵀ wᵢ` (one vector–Jacobian product of `f` at `zᵢ`),
    - `ȳ₀ += z̄ᵢ`, `f̄ⱼ += h aᵢⱼ z̄ᵢ` for `j < i`

    (Hairer & Wanner, *Solving ODEs II*, §IV.6, the DIRK stage equations (6.4) with
    `aᵢᵢ = γ`; the stage times `tᵢ = t₀ + cᵢ h` are constants of the gradient). The
    transposed stage equations are solved to rounding by iterative refinement
    (`_stage_solve`) with one factorized matrix per step, `(I − hγJ)ᵀ` at the last
    stage's point, its Jacobian built as [`jaxdae.FusedChord`][] builds the forward
    iteration's (`column_seeds`, `tangent_products`); a stage where the refinement does
    not contract builds its own, which the stages before it then refine with.

    The stages `kᵢ` are those of the step's dense output: from `outputs`, the step's
    outputs as the replay computed them (`_step_adjoints.reuses_outputs`), or else by
    running the step. Steps of other forms (a tableau whose solution is its last stage,
    terms other than one ODE term) take the default, `eqx.filter_vjp` of the step.
    """
    terms, args = eqx.combine(diff, static)
    if not _written_out(solver, terms):
        return autodiff_step_vjp(solver, t0, t1, state, diff, static)
    y0, solver_state = state
    if outputs is None:
        y1, _, dense, solver_state1, _ = solver.step(terms, t0, t1, y0, args, solver_state, False)
        outputs = ((y1, solver_state1), dense)
    dense = outputs[1]
    flat_y0, unravel = ravel_pytree(y0)
    dtype = flat_y0.dtype
    a, b, c = _coefficients(solver.tableau, dtype)
    stages = a.shape[0]
    scale = terms.contr(t0, t1) * a[-1, -1]  # `hγ`
    h = terms.contr(t0, t1)

    def flat_stages(k):
        return jax.vmap(lambda ki: ravel_pytree(ki)[0])(k)

    points = flat_y0 + a @ flat_stages(dense["k"])  # `zᵢ`, from `kᵢ = h fᵢ`
    times = jnp.stack([jnp.where(ci == 1, t1, t0 + ci * (t1 - t0)) for ci in c])
    # The first stage is evaluated on the first step (no value carried in yet), else it
    # is the last stage of the step before.
    evaluated = jnp.asarray(True) if solver_state is None else solver_state[0]

    def f(t, z, diff):
        terms, args = eqx.combine(diff, static)
        return ravel_pytree(terms.vf(t, unravel(z), args))[0]

    def transposed_matrix(i):
        """`(I − hγJ)ᵀ` at stage `i`'s point, and the number of tangents that gave `J`."""

        def f_i(z):
            return f(times[i], z, diff)

        _, tangent = jax.linearize(f_i, points[i])
        seeds, expand = column_seeds(f_i, points[i], "coloured")
        jacobian = expand(tangent_products(tangent, seeds.astype(dtype)).T)
        return (jnp.eye(flat_y0.size, dtype=dtype) - scale * jacobian).T, len(seeds)

    def pullback(bars):
        (y1_bar, solver_state1_bar), dense_bar = bars
        y1_bar = ravel_pytree(y1_bar)[0] + ravel_pytree(dense_bar["y1"])[0]
        f_bar = h * (b[:, None] * y1_bar + flat_stages(dense_bar["k"]))
        if solver_state is not None:
            f_bar = f_bar.at[-1].add(ravel_pytree(solver_state1_bar[1])[0])
        earlier = jnp.arange(stages)

        def stage_back(j, carry):
            i = stages - 1 - j
            f_bar, y0_bar, diff_bar, kept = carry
            _, vjp = eqx.filter_vjp(lambda z, d: f(times[i], z, d), points[i], diff)

            def implicit(kept):
                factored, valid = kept
                _, products, factored = _stage_solve(
                    vjp, scale, f_bar[i], factored, valid, lambda: transposed_matrix(i)
                )
                return products, (factored, jnp.ones((), jnp.bool_))

            def explicit(kept):  # `f₀ = f(t₀, y₀)`, where it was evaluated
                return vjp(jnp.where(evaluated, f_bar[0], 0.0)), kept

            (z_bar, stage_diff_bar), kept = jax.lax.cond(i > 0, implicit, explicit, kept)
            f_bar = f_bar + jnp.where((earlier < i)[:, None], h * a[i][:, None] * z_bar, 0.0)
            return (f_bar, y0_bar + z_bar, jax.tree.map(jnp.add, diff_bar, stage_diff_bar), kept)

        diff_bar = jax.tree.map(jnp.zeros_like, diff)
        y0_bar = y1_bar + ravel_pytree(dense_bar["y0"])[0]
        # No matrix yet: the last stage builds its own, and the stages before it refine
        # with it.
        empty = (
            jax.tree.map(
                jnp.zeros_like, jax.eval_shape(lambda: factor_for_solves(*transposed_matrix(0)))
            ),
            jnp.zeros((), jnp.bool_),
        )
        f_bar, y0_bar, diff_bar, _ = jax.lax.fori_loop(
            0, stages, stage_back, (f_bar, y0_bar, diff_bar, empty)
        )
        solver_state_bar = (
            None if solver_state is None else (None, unravel(jnp.where(evaluated, 0.0, f_bar[0])))
        )
        return (unravel(y0_bar), solver_state_bar), diff_bar

    return outputs, pullback
