"""A Rosenbrock (linearly implicit Runge–Kutta) solver for stiff ODEs, as a diffrax solver
([`jaxdae.Rodas5P`][])."""

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import diffrax
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .._compilation._linalg import factor_for_solves, solve_factored
from .._custom_types import Array, Float, PyTree
from ._jacobian import check_jacobian, linearization
from ._term import one_ode_term

# Rodas5P (Steinebach 2023), in the transformed variables of Hairer & Wanner (Solving ODEs
# II, §IV.7, (7.4')): `(I/(hγ) − J) kᵢ = f(t₀ + cᵢh, y₀ + Σⱼ aᵢⱼ kⱼ) + Σⱼ (Cᵢⱼ/h) kⱼ
# + h dᵢ ∂f/∂t`, `y₁ = y₀ + Σᵢ mᵢ kᵢ`. The method is stiffly accurate: the inputs of stages
# 7 and 8 are `y₀ + Σ a₆ⱼ kⱼ + k₆` and that `+ k₇`, the solution is that `+ k₈`, so `k₈` is
# the difference between the solution (order 5) and the embedded one (order 4).
_GAMMA = 0.21193756319429014
_A = {
    2: (3.0,),
    3: (2.849394379747939, 0.45842242204463923),
    4: (-6.954028509809101, 2.489845061869568, -10.358996098473584),
    5: (2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641),
    6: (
        -7.502846399306121,
        2.561846144803919,
        -11.627539656261098,
        -0.18268767659942256,
        0.030198172008377946,
    ),
}
_A[7] = _A[6] + (1.0,)
_A[8] = _A[7] + (1.0,)
_M = _A[8] + (1.0,)
_C = {
    2: (-14.155112264123755,),
    3: (-17.97296035885952, -2.859693295451294),
    4: (147.12150275711716, -1.41221402718213, 71.68940251302358),
    5: (165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306),
    6: (
        24.854864614690072,
        -3.0009227002832186,
        47.4931110020768,
        5.5814197821558125,
        -0.6610691825249471,
    ),
    7: (
        30.91273214028599,
        -3.1208243349937974,
        77.79954646070892,
        34.28646028294783,
        -19.097331116725623,
        -28.087943162872662,
    ),
    8: (
        37.80277123390563,
        -3.2571969029072276,
        112.26918849496327,
        66.9347231244047,
        -40.06618937091002,
        -54.66780262877968,
        -9.48861652309627,
    ),
}
_NODES = (
    0.0,
    0.6358126895828704,
    0.4095798393397535,
    0.9769306725060716,
    0.4288403609558664,
    1.0,
    1.0,
    1.0,
)
_D = (
    0.21193756319429014,
    -0.42387512638858027,
    -0.3384627126235924,
    1.8046452872882734,
    2.325825639765069,
    0.0,
    0.0,
    0.0,
)
# The dense output `y(t₀ + θh) = (1 − θ) y₀ + θ (y₁ + (1 − θ)(K₁ + θ (K₂ + θ K₃)))`, with
# `Kᵣ = Σᵢ Hᵣᵢ kᵢ` (order 4).
_H = (
    (
        25.948786856663858,
        -2.5579724845846235,
        10.433815404888879,
        -2.3679251022685204,
        0.524948541321073,
        1.1241088310450404,
        0.4272876194431874,
        -0.17202221070155493,
    ),
    (
        -9.91568850695171,
        -0.9689944594115154,
        3.0438037242978453,
        -24.495224566215796,
        20.176138334709044,
        15.98066361424651,
        -6.789040303419874,
        -6.710236069923372,
    ),
    (
        11.419903575922262,
        2.8879645146136994,
        72.92137995996029,
        80.12511834622643,
        -52.072871366152654,
        -59.78993625266729,
        -0.15582684282751913,
        4.883087185713722,
    ),
)
_STAGES = 8


def _combine(coefficients, ks):
    """`Σᵢ coefficients[i] ks[i]`, skipping zero coefficients."""
    terms = [c * k for c, k in zip(coefficients, ks, strict=False) if c != 0.0]
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


class StepTimes(NamedTuple):
    """A step's times as its stages use them: the start `t0` (floating point, in the
    type of the times or, for integer times, of the state), the end `t1` and the step
    `h = t1 − t0` in the type of the state."""

    t0: Array
    t1: Array
    h: Array

    def stage(self, i: int) -> Array:
        """The time of stage `i` (1 … 8), `t₀ + cᵢ h`."""
        return self.t0 + jnp.asarray(_NODES[i - 1], self.t0.dtype) * (self.t1 - self.t0)


def step_variables(t0, t1, y0) -> tuple[StepTimes, Float[Array, " n"], Callable]:
    """A step's `StepTimes`, its start state flattened and the function that unflattens
    a state."""
    y, unravel = ravel_pytree(y0)
    t0 = jnp.asarray(t0)
    h = jnp.asarray(t1 - t0, y.dtype)
    t_dtype = t0.dtype if jnp.issubdtype(t0.dtype, jnp.floating) else y.dtype
    return StepTimes(t0.astype(t_dtype), t1, h), y, unravel


def rate(
    terms, args, times: StepTimes, unravel: Callable, dtype
) -> Callable[[Array, Array], Array]:
    """The rate `f(t, y)` in the solver's time, on flattened states, in a step at `times`.

    diffrax solves in the time `direction × t` and hands the solver its terms wrapped
    (`diffrax.WrapTerm`), whose control carries the direction and whose vector field does
    not: the rate in the solver's time is the field times the control of a unit step
    (`vf_prod`), not the field itself, or a solve from `t0 > t1` runs forwards."""

    unit = terms.contr(jnp.zeros_like(times.t0), jnp.ones_like(times.t0))

    def f(t, x):
        return ravel_pytree(terms.vf_prod(t, unravel(x), args, unit))[0].astype(dtype)

    return f


def stages(
    f: Callable[[Array, Array], Array],
    times: StepTimes,
    y: Float[Array, " n"],
    jacobian: str,
    stage_rate: Callable[[int, Array, Array], Array] | None = None,
) -> tuple[Any, list[Array]]:
    """The stages `k₁ … k₈` of a Rodas5P step from `y` (flattened) with the rate `f`, and
    the factored `I − hγJ` that they are solved with (`factor_for_solves`). `stage_rate(i,
    t, x)`, if given, evaluates `f(t, x)` for stages 2 … 8 (the step's adjoint keeps their
    vector–Jacobian products)."""
    stage_rate = stage_rate or (lambda i, t, x: f(t, x))
    f0, jac, f_t, tangents = linearization(f, times.t0, y, jacobian)
    h = times.h
    hg = h * _GAMMA
    factored = factor_for_solves(jnp.eye(y.size, dtype=y.dtype) - hg * jac, tangents)
    ks = []
    for i in range(1, _STAGES + 1):
        f_i = f0 if i == 1 else stage_rate(i, times.stage(i), y + _combine(_A[i], ks))
        rhs = f_i
        if _D[i - 1] != 0.0:
            rhs = rhs + (h * _D[i - 1]) * f_t
        if i > 1:
            rhs = rhs + _combine(_C[i], ks) / h
        ks.append(solve_factored(factored, hg * rhs))
    return factored, ks


def step_outputs(
    y0: PyTree[Array], y: Float[Array, " n"], ks: list[Array], unravel: Callable
) -> tuple[PyTree[Array], PyTree[Array], dict]:
    """A step's end state, error estimate and dense output from its stages."""
    y1 = y + _combine(_M, ks)
    # A step that overflows (a singular `I − hγJ`, a blow-up) is rejected with an
    # infinite error and a NaN state: diffrax's step-size controller measures the
    # error against the step's start where the state is NaN, while an infinite state
    # would make the next step size NaN.
    finite = jnp.all(jnp.isfinite(y1))
    error = jnp.where(finite, ks[-1], jnp.inf)
    y1 = jnp.where(finite, y1, jnp.nan)
    dense = jnp.stack([_combine(row, ks) for row in _H])
    dense_info = {"y0": y0, "y1": unravel(y1), "k": jax.vmap(unravel)(dense)}
    return unravel(y1), unravel(error), dense_info


class RodasInterpolation(diffrax.AbstractLocalInterpolation):
    """The dense output of [`jaxdae.Rodas5P`][] over one step: `y(t₀ + θh) = (1 − θ) y₀
    + θ (y₁ + (1 − θ)(K₁ + θ (K₂ + θ K₃)))`, a polynomial of degree 4 in `θ` whose `Kᵣ` are
    combinations of the step's stages (Steinebach 2023)."""

    t0: Array
    t1: Array
    y0: PyTree[Array]
    y1: PyTree[Array]
    k: PyTree[Array]  # each leaf `(3, *shape)`: K₁, K₂, K₃

    def evaluate(self, t0, t1=None, left: bool = True) -> PyTree[Array]:
        del left
        if t1 is not None:
            return jax.tree.map(lambda a, b: a - b, self.evaluate(t1), self.evaluate(t0))
        span = self.t1 - self.t0
        theta = jnp.where(span == 0, 0.0, (t0 - self.t0) / jnp.where(span == 0, 1.0, span))

        def _evaluate(y0, y1, k):
            s = theta.astype(y0.dtype)
            return (1 - s) * y0 + s * (y1 + (1 - s) * (k[0] + s * (k[1] + s * k[2])))

        return jax.tree.map(_evaluate, self.y0, self.y1, self.k)


class Rodas5P(diffrax.AbstractAdaptiveSolver):
    """Rodas5P, a Rosenbrock method of order 5 for stiff ODEs (Steinebach 2023): L-stable,
    stiffly accurate, with an embedded method of order 4 for the step size and a dense
    output of order 4.

    A Rosenbrock method is linearly implicit: each step computes the Jacobian `J = ∂f/∂y`
    once, factorizes `I − hγJ` once (LU) and solves eight linear systems with it, one per
    stage (Hairer & Wanner, *Solving ODEs II*, §IV.7, eq. (7.4') in transformed variables):

    `(I/(hγ) − J) kᵢ = f(t₀ + cᵢh, y₀ + Σⱼ aᵢⱼ kⱼ) + Σⱼ (Cᵢⱼ/h) kⱼ + h dᵢ ∂f/∂t`,
    `y₁ = y₀ + Σᵢ mᵢ kᵢ`.

    There is no Newton iteration: no iteration count, no convergence test, no step
    rejected for a diverging iteration, and one step is a fixed sequence — one Jacobian,
    one LU factorization, eight evaluations of `f` and eight solves with the factors — that
    XLA compiles into one loop body. The price is that the order holds only with the exact Jacobian
    (here by automatic differentiation). The solve is L-stable (`R(∞) = 0`) and stiffly accurate
    (the solution is the last stage's input plus `k₈`), so stiff components are damped
    rather than carried along, and the step is set by the accuracy of the slow motion.
    Rodas5P is Rodas5 (Di Marzo 1993) with coefficients chosen by Steinebach for a
    smaller error on stiff (Prothero–Robinson) problems and a dense output of order 4,
    one of DifferentialEquations.jl's recommended solvers for small and medium stiff
    problems; it is preferred here to Rodas4 (order 4, embedded order 3, dense output of
    order 3) because an order-5 method reaches a relative error of `10⁻⁶` in fewer steps.

    **The Jacobian.** `∂f/∂y` and `∂f/∂t` come from one `jax.linearize` of the vector field
    at the step's start, applied to each tangent in turn (up to 17 tangents; beyond, to
    all at once with `jax.vmap`, whose batched products do not fuse on the CPU:
    docs/design_measurements.md#rosenbrock-tangents). With
    `jacobian="coloured"` (the default) the structural non-zeros of `∂f/∂y` are found
    once, when the solve is traced, from the vector field's jaxpr, and its columns are
    grouped so that no two columns of a group share a row (Curtis, Powell & Reid 1974): one
    tangent per group instead of one per state. A banded or block-diagonal Jacobian — an
    ODE with local couplings written out, an ensemble of independent trajectories — then
    costs a few tangents. The ODE of a constrained system from jaxdae's formulations is
    structurally dense (the solves with the mass matrix and for the multipliers couple
    every coordinate) and costs `n` tangents, as with `jacobian="dense"`, which skips the
    analysis.

    **With [`jaxdae.simulate`][]** pass it as the solver; it integrates the formulation's
    ODE like any diffrax solver (every formulation and system), with the default adjoint
    [`jaxdae.ReplayAdjoint`][] (the derivative of each accepted step, replayed at its
    recorded time; `jaxdae.ReverseSweepAdjoint` differentiates explicit Runge–Kutta
    methods only and refuses it):

    ```python
    sol = jaxdae.simulate(system, formulation, 0.0, 2.0, q0, v0, solver=jaxdae.Rodas5P(),
                          rtol=1e-6, atol=1e-9)
    ```

    and with `diffrax.diffeqsolve` directly (`diffrax.ODETerm`, an adaptive
    `diffrax.PIDController` or constant steps, `SaveAt(ts=...)` or `dense=True`).
    `jax.grad` (discretize-then-optimize through the steps, the LU factorization included)
    and `jax.vmap` work as with any diffrax solver.

    **When it pays.** Its steps do not shrink with the stiffness, and a step costs a
    fraction of an implicit Runge–Kutta step (`docs/guides/stiff_integration.md` measures
    both). Use it where the explicit step is held far below the accuracy-limited one.

    **What a successful solve promises.** The step-size controller keeps each step's
    estimated local error (`k₈`, the difference from the embedded solution of order 4)
    within `atol + rtol |y|`, and the estimate is not optimistic on stiff mechanical
    systems (on the flyball governor 3.5–27 times the true local error at 11 of 12 sampled
    steps, within 20 % of it at the last). The global error is those local errors carried
    along by the motion: where the motion contracts they die out and the error stays near
    the tolerance, but along a
    neutrally stable direction — the phase of a free rotation, an undamped oscillation —
    they add up over the run, and an error in a conserved rate grows into a phase error
    like `t²`. Success then does not mean an error near `rtol`: on the governor spinning
    freely for 10 s, `rtol = 10⁻³` ends at an error of order 1, almost all of it in the
    phase of the rotation (`docs/guides/stiff_integration.md`, `--study global_error`).
    Every solver with a local error control is subject to this (the configured
    `diffrax.Kvaerno5` ends near `rtol` on the governor only because its steps there keep
    their local errors far below the tolerance); for such motions choose `rtol` for the
    global error over the horizon, orders of magnitude below it, or compare with a solve
    at a tighter tolerance.

    **Cost per step**: one linearization, `n` (or the number of colours) Jacobian-vector
    products, an `n × n` LU factorization with partial pivoting, eight solves with it and
    eight evaluations of `f`. Up to 16 states, and up to 64 where the Jacobian takes at
    most 17 tangents (a banded or block-sparse one), the matrix is inverted once with
    array operations that XLA fuses into the step (pivoted LU factors, or a block
    elimination checked against partial pivoting), so that each stage's solve is one
    matrix–vector product; beyond, LAPACK's `getrf` factorizes it. For large dense `n`
    the factorization (`O(n³)`) dominates; for an ensemble given to
    [`jaxdae.simulate_ensemble`][] the matrix is that of the whole batch (block-diagonal,
    factorized densely): batch stiff solves with `jax.vmap(jaxdae.simulate)` instead.

    **Arguments:**

    - `jacobian`: `"coloured"` (default: compressed by a column colouring of the
        Jacobian's structural sparsity) or `"dense"` (`n` tangents).

    **Raises:**

    `ValueError` for another `jacobian`.

    **References:** G. Steinebach, "Construction of Rosenbrock–Wanner method Rodas5P and
    numerical benchmarks within the Julia Differential Equations package", BIT Numerical
    Mathematics 63 (2023) 27; E. Hairer, G. Wanner, *Solving Ordinary Differential
    Equations II*, 2nd ed., Springer 1996, §IV.7; A. R. Curtis, M. J. D. Powell,
    J. K. Reid, "On the estimation of sparse Jacobian matrices", IMA J. Appl. Math. 13
    (1974) 117–119.
    """

    jacobian: str = "coloured"

    # An ODE: `diffrax.ODETerm`, or the term of a system (`init` checks which).
    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = RodasInterpolation

    def __check_init__(self):
        check_jacobian("Rodas5P", self.jacobian)

    def order(self, terms):
        return 5

    def init(self, terms, t0, t1, y0, args):
        one_ode_term(terms, "jaxdae.Rodas5P")
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        times, y, unravel = step_variables(t0, t1, y0)
        factored, ks = stages(rate(terms, args, times, unravel, y.dtype), times, y, self.jacobian)
        y1, error, dense_info = step_outputs(y0, y, ks, unravel)
        return y1, error, dense_info, None, diffrax.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)
