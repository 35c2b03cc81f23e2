"""The discrete adjoint of one [`jaxdae.Rodas5P`][] step, for [`jaxdae.ReplayAdjoint`][]
(registered in `_step_adjoints`): the stages' linear solves transposed with the step's own
factorization, instead of reverse mode through the Jacobian's construction and the
inverse."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._compilation._linalg import solve_factored
from ._rosenbrock import (
    _A,
    _C,
    _D,
    _GAMMA,
    _H,
    _M,
    _STAGES,
    Rodas5P,
    rate,
    stages,
    step_outputs,
    step_variables,
)


def rodas_step_vjp(solver: Rodas5P, t0, t1, state, diff, static):
    """One Rodas5P step and its vector–Jacobian product (the `step_vjp` of
    `_step_adjoints`; arguments, outputs and cotangents as documented there).

    The step (Hairer & Wanner, *Solving ODEs II*, §IV.7, (7.4') in transformed
    variables; Steinebach 2023) is, with `W = I − hγJ`, `J = ∂f/∂y(t₀, y₀)`:
    `W kᵢ = hγ (f(tᵢ, xᵢ) + h dᵢ ∂f/∂t(t₀, y₀) + Σⱼ Cᵢⱼ kⱼ / h)`,
    `xᵢ = y₀ + Σⱼ aᵢⱼ kⱼ`, `y₁ = y₀ + Σⱼ mⱼ kⱼ`, and the dense output's
    `Kᵣ = Σⱼ Hᵣⱼ kⱼ`. Its adjoint runs over the stages from the last: with `k̄ᵢ` the
    cotangent of `kᵢ` (from `y₁`, the dense output and the later stages), `rᵢ = hγ W⁻ᵀ
    k̄ᵢ` is that of the stage's right-hand side; it is passed to the earlier stages
    (`Cᵢⱼ rᵢ / h`), to `f` at `xᵢ` (one vector–Jacobian product, in the state and the
    parameters, whose state part goes to `y₀` and to the earlier stages through `aᵢⱼ`)
    and to `∂f/∂t` (`h dᵢ rᵢ`). Since `dW = −hγ dJ`, the cotangent of `J` is `Σᵢ rᵢ kᵢᵀ`:
    its pull-back to `(y₀, parameters)` is the gradient of `Σᵢ rᵢᵀ (∂f/∂y) kᵢ +
    t̄ᵀ ∂f/∂t + r₁ᵀ f(t₀, y₀)` (the first stage's rate is also evaluated at `y₀`), one
    reverse pass over nine directional derivatives (reverse over forward mode), never
    the derivative of the built Jacobian. The transposed solves use the factorization of
    the forward step (`jax.linear_transpose` of its solve) and the stages' products are
    kept from it, so one step costs one forward step, eight transposed solves, seven
    vector–Jacobian products of `f` and the reverse pass over the directional
    derivatives. `_step_adjoints` applies it from `ROSENBROCK_ADJOINT_MIN` states: below,
    reverse mode through the step costs no more
    (docs/design_measurements.md#rosenbrock-step-adjoint).
    """
    y0, _ = state
    times, y, unravel = step_variables(t0, t1, y0)
    dtype = y.dtype

    def f_of(t, x, diff):
        terms, args = eqx.combine(diff, static)
        return rate(terms, args, times, unravel, dtype)(t, x)

    pulls = {}

    def stage_rate(i, t, x):
        f_i, pulls[i] = eqx.filter_vjp(lambda x, d: f_of(t, x, d), x, diff)
        return f_i

    factored, ks = stages(lambda t, x: f_of(t, x, diff), times, y, solver.jacobian, stage_rate)
    y1, _, dense_info = step_outputs(y0, y, ks, unravel)
    h = times.h
    hg = h * _GAMMA
    finite = jnp.all(jnp.isfinite(ravel_pytree(y1)[0]))
    transposed_solve = jax.linear_transpose(lambda r: solve_factored(factored, r), y)

    def pullback(out_bar):
        (y1_bar, _), dense_bar = out_bar
        y_end_bar = ravel_pytree(y1_bar)[0] + ravel_pytree(dense_bar["y1"])[0]
        y_end_bar = jnp.where(finite, y_end_bar, 0.0)  # `y₁` is NaN where not finite
        y_bar = y_end_bar + ravel_pytree(dense_bar["y0"])[0]
        dense_k_bar = jax.vmap(lambda k: ravel_pytree(k)[0])(dense_bar["k"])
        k_bars = [
            _M[j] * y_end_bar + sum(_H[r][j] * dense_k_bar[r] for r in range(3))
            for j in range(_STAGES)
        ]
        diff_bar = None
        rs, t_bar = [None] * _STAGES, jnp.zeros_like(y)
        for i in range(_STAGES, 0, -1):
            (lam,) = transposed_solve(k_bars[i - 1])
            r = hg * lam
            rs[i - 1] = r
            if _D[i - 1] != 0.0:
                t_bar = t_bar + (h * _D[i - 1]) * r
            if i > 1:
                for j, c in enumerate(_C[i]):
                    k_bars[j] = k_bars[j] + (c / h) * r
                x_bar, d_bar = pulls[i](r)
                y_bar = y_bar + x_bar
                for j, a in enumerate(_A[i]):
                    k_bars[j] = k_bars[j] + a * x_bar
                diff_bar = d_bar if diff_bar is None else _add(diff_bar, d_bar)

        # `f(t₀, y₀)`, `(∂f/∂y) kᵢ` and `∂f/∂t` as functions of `(y₀, parameters)`.
        directions = jnp.stack([*ks, jnp.zeros_like(y)])
        in_t = np.zeros(_STAGES + 1, times.t0.dtype)
        in_t[-1] = 1.0

        def at_start(x, d):
            # The nine products batched by `vmap`, not applied in turn as the forward step's
            # Jacobian columns are (`tangent_products`): differentiated in reverse, each
            # copy of the linearized `f` would bring its own transposed program, and the
            # batched one has a fifth of the operations
            # (docs/design_measurements.md#rosenbrock-step-adjoint).
            f0, tangent = jax.linearize(lambda t, x: f_of(t, x, d), times.t0, x)
            return f0, jax.vmap(tangent)(jnp.asarray(in_t), directions)

        _, pull = eqx.filter_vjp(at_start, y, diff)
        x_bar, d_bar = pull((rs[0], jnp.stack([*rs, t_bar])))
        y_bar = y_bar + x_bar
        diff_bar = d_bar if diff_bar is None else _add(diff_bar, d_bar)
        return (unravel(y_bar), None), diff_bar

    return ((y1, None), dense_info), pullback


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)
