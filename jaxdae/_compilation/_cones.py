"""The cone quadratic program of one time step with frictional contacts
([`jaxdae.TimeStepping`][]): Anitescu's convex relaxation of the Coulomb cone
complementarity problem,

`min_P ½ Pᵀ D P + bᵀ P` over `P ∈ K = K₁ × … × K_u`, `K_i = {(P_n, P_T) : |P_T| ≤ μ_i P_n}`,

whose optimality conditions are the cone complementarity problem `K ∋ P ⊥ D P + b ∈ K*`
(`K*` the dual cone, `|y_T| ≤ y_n / μ`; Anitescu, "Optimization-based simulation of
nonsmooth rigid multibody dynamics", Math. Program. 105 (2006), eq. (20)). The impulses
`P` are stacked as the rows of `GapTerms`: the normal ones `(u,)`, then each contact's
`tangents` tangential ones. Frictionless contacts (`μ` of shape `(0,)`) make `K` the
non-negative orthant: a linear complementarity problem. Coulomb's law itself, the cone
complementarity problem with De Saxcé's correction `D P + b + [μ|y_T|; 0] ∈ K*`, is
solved as a fixed point of such QPs (`exact`).

It is solved by accelerated projected gradient descent with gradient restarts (APGD:
Mazhar, Heyn, Negrut, Tasora, "Using Nesterov's method to accelerate multibody dynamics
with friction and contact", ACM TOG 34 (2015), Alg. 1, as Project Chrono's
`ChSolverAPGD`; restarts of O'Donoghue and Candès, Found. Comput. Math. 15 (2015)), to a
tolerance on the natural map's residual with an iteration cap, and differentiated by the
implicit function theorem of that natural map at the solution (not through the
iterations): [`solve_cone_qp`][]."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, Float, ScalarLike


def _safe_norm(x: Float[Array, "u t"]) -> Float[Array, " u"]:
    """Row norms with a finite derivative at zero (zero there)."""
    squared = jnp.sum(x * x, axis=-1)
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def project_cones(x: Float[Array, " k"], friction: Float[Array, " f"]) -> Float[Array, " k"]:
    """The Euclidean projection of the stacked impulses `x` (normal ones, then each
    contact's tangential ones) onto the product of Coulomb cones `|x_T| ≤ μ x_n`; onto the
    non-negative orthant where `friction` is empty (frictionless contacts).

    Per contact (Fukushima, Luo, Tseng, SIAM J. Optim. 12 (2002), Prop. 3.3): the point
    itself inside the cone, zero inside its polar cone (`μ |x_T| ≤ −x_n`), else
    `x_n' = (x_n + μ|x_T|)/(1 + μ²)`, `x_T' = μ x_n' x_T/|x_T|`."""
    count = friction.shape[0]
    if count == 0:
        return jnp.maximum(x, 0.0)
    normal, tangential = x[:count], x[count:].reshape(count, -1)
    norm = _safe_norm(tangential)
    # (`normal ≥ 0` for `μ = 0`, whose cone is the ray `x_T = 0, x_n ≥ 0`.)
    inside = (norm <= friction * normal) & (normal >= 0)
    polar = friction * norm <= -normal
    boundary = (normal + friction * norm) / (1 + friction**2)
    scale = jnp.where(norm > 0, friction * boundary / jnp.where(norm > 0, norm, 1.0), 0.0)
    new_normal = jnp.where(inside, normal, jnp.where(polar, 0.0, boundary))
    new_tangential = jnp.where(
        inside[:, None], tangential, jnp.where(polar[:, None], 0.0, scale[:, None] * tangential)
    )
    return jnp.concatenate([new_normal, new_tangential.reshape(-1)])


def lipschitz_bound(matrix: Float[Array, "k k"]) -> Float[Array, ""]:
    """An upper bound of the largest eigenvalue of the symmetric positive semidefinite
    `matrix`: the smaller of its Gershgorin bound and its Frobenius norm (array operations
    only: no eigenvalue solver inside the time loop, on a GPU least of all)."""
    gershgorin = jnp.max(jnp.sum(jnp.abs(matrix), axis=1), initial=0.0)
    frobenius = jnp.sqrt(jnp.sum(matrix * matrix))
    tiny = jnp.finfo(matrix.dtype).tiny
    return jnp.maximum(jnp.minimum(gershgorin, frobenius), jnp.sqrt(tiny))


def de_saxce_shift(
    velocity: Float[Array, " k"], friction: Float[Array, " f"]
) -> Float[Array, " k"]:
    """De Saxcé's correction `[μ|y_T|; 0]` of the contact velocities `y = D x + b`: with
    it the cone complementarity problem is Coulomb's law exactly (`y_n ≥ 0` rather than
    `y_n ≥ μ|y_T|`; De Saxcé and Feng, Math. Comput. Model. 28 (1998))."""
    count = friction.shape[0]
    if count == 0:
        return jnp.zeros_like(velocity)
    slip = _safe_norm(velocity[count:].reshape(count, -1))
    return jnp.concatenate([friction * slip, jnp.zeros_like(velocity[count:])])


def natural_residual(x, matrix, vector, friction, lipschitz, exact: bool) -> Float[Array, " k"]:
    """The natural map `L (x − Π_K(x − y/L))` of the contact velocities `y = D x + b`
    (`exact`: with De Saxcé's correction, `y + [μ|y_T|; 0]`), zero exactly at the
    solutions of the cone complementarity problem (in the units of `y`: velocities)."""
    velocity = matrix @ x + vector
    if exact:
        velocity = velocity + de_saxce_shift(velocity, friction)
    return lipschitz * (x - project_cones(x - velocity / lipschitz, friction))


def _apgd(matrix, vector, friction, start, tolerance, max_iterations: int):
    """APGD (module docstring) from `start`: the iterate with the smallest natural
    residual, that residual and the number of iterations."""
    lipschitz = lipschitz_bound(matrix)
    step = 1 / lipschitz
    x0 = project_cones(start, friction)

    def residual(x):
        return jnp.max(
            jnp.abs(natural_residual(x, matrix, vector, friction, lipschitz, False)), initial=0
        )

    r0 = residual(x0)
    one = jnp.ones((), x0.dtype)

    def cond(state):
        k, _, _, _, _, best_r = state
        return (k < max_iterations) & (best_r > tolerance)

    def body(state):
        k, x, y, theta, best_x, best_r = state
        gradient = matrix @ y + vector
        x_new = project_cones(y - step * gradient, friction)
        theta_new = 0.5 * theta * (jnp.sqrt(theta**2 + 4) - theta)
        beta = theta * (1 - theta) / (theta**2 + theta_new)
        # Gradient restart: momentum that climbs the objective is dropped.
        restart = gradient @ (x_new - x) > 0
        y_new = jnp.where(restart, x_new, x_new + beta * (x_new - x))
        theta_new = jnp.where(restart, one, theta_new)
        r = residual(x_new)
        better = r < best_r
        return (
            k + 1,
            x_new,
            y_new,
            theta_new,
            jnp.where(better, x_new, best_x),
            jnp.where(better, r, best_r),
        )

    state = (jnp.zeros((), jnp.int32), x0, x0, one, x0, r0)
    k, _, _, _, best_x, best_r = jax.lax.while_loop(cond, body, state)
    return best_x, best_r, k


def _fixed_point(matrix, vector, friction, start, tolerance, max_iterations: int):
    """Coulomb's exact cone complementarity problem as a fixed point of cone QPs (Acary,
    Cadoux, Lemaréchal, Malick, "A formulation of the linear discrete Coulomb friction
    problem via convex optimization", ZAMM 91 (2011)): the QP with `b` shifted by De
    Saxcé's correction `[μ|y_T|; 0]` of the last iterate's velocities, solved by APGD
    (warm-started, each to `INNER_TOLERANCE` times `tolerance`), until the exact natural
    residual is at most `tolerance`, or `FIXED_POINT_ITERATIONS` QPs. Returns the
    impulses, their exact residual, the number of QPs and the APGD iterations of all of
    them."""
    lipschitz = lipschitz_bound(matrix)

    def residual(x):
        return jnp.max(
            jnp.abs(natural_residual(x, matrix, vector, friction, lipschitz, True)), initial=0
        )

    def cond(state):
        k, _, r, _ = state
        return (k < FIXED_POINT_ITERATIONS) & (r > tolerance)

    def body(state):
        k, x, _, inner = state
        shifted = vector + de_saxce_shift(matrix @ x + vector, friction)
        x, _, count = _apgd(
            matrix, shifted, friction, x, INNER_TOLERANCE * tolerance, max_iterations
        )
        return k + 1, x, residual(x), inner + count

    zero = jnp.zeros((), jnp.int32)
    x0 = project_cones(start, friction)
    k, x, r, inner = jax.lax.while_loop(cond, body, (zero, x0, residual(x0), zero))
    return x, r, k, inner


# The most cone QPs of one exact solve (`_fixed_point`).
FIXED_POINT_ITERATIONS = 50

# Each QP of the fixed point is solved to this fraction of its tolerance. At an iterate
# whose exact residual lies within rounding above the tolerance, the QP's own residual (the
# same map, summed in another order) can lie below it: a QP to the full tolerance would
# return the iterate unchanged, and the fixed point would stall there until its last QP.
INNER_TOLERANCE = 0.5


def solve_cone_qp(
    matrix: Float[Array, "k k"],
    vector: Float[Array, " k"],
    friction: Float[Array, " f"],
    start: Float[Array, " k"],
    tolerance: ScalarLike,
    max_iterations: int,
    exact: bool = False,
) -> Float[Array, " k"]:
    """The impulses `P` of the cone QP `min ½ Pᵀ D P + bᵀ P, P ∈ K` (module docstring):
    `matrix` `D` (symmetric positive semidefinite), `vector` `b`, `friction` `μ` per
    contact (`(0,)`: frictionless, `K` the orthant), solved by APGD from `start` (a warm
    start: the previous step's impulses) until the natural residual (`natural_residual`,
    max-norm) is at most `tolerance`, or `max_iterations` (static) iterations; the best
    iterate. With `exact` (static), Coulomb's cone complementarity problem itself
    ([`_fixed_point`][]: `D P + b + [μ|y_T|; 0] ∈ K*`, no lift-off of sliding contacts).
    Check the residual to know whether it converged.

    Derivatives (forward and reverse mode, `jax.jacfwd` and `jax.grad`) are those of the
    implicit function theorem applied to the natural map `F(P; D, b, μ) = 0` at the
    returned `P`: `dP = −F_P⁺ (F_D dD + F_b db + F_μ dμ)`, with the pseudo-inverse where
    `F_P` is singular (impulses that the contacts do not determine: the least-norm
    derivative). `start` and `tolerance` have no derivative."""
    return _solved(matrix, vector, friction, start, tolerance, max_iterations, exact)[0]


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
def _solved(matrix, vector, friction, start, tolerance, max_iterations: int, exact: bool):
    """[`solve_cone_qp`][]'s impulses, with its derivative, and the residual its loop stopped
    at, whose tangent is zero."""
    if exact and friction.shape[0] > 0:
        x, residual, _, _ = _fixed_point(matrix, vector, friction, start, tolerance, max_iterations)
        return x, residual
    x, residual, _ = _apgd(matrix, vector, friction, start, tolerance, max_iterations)
    return x, residual


@_solved.defjvp
def _solved_jvp(max_iterations, exact, primals, tangents):
    matrix, vector, friction, start, tolerance = primals
    d_matrix, d_vector, d_friction, _, _ = tangents
    x, residual = _solved(matrix, vector, friction, start, tolerance, max_iterations, exact)
    lipschitz = jax.lax.stop_gradient(lipschitz_bound(matrix))

    def natural(x_, matrix_, vector_, friction_):
        return natural_residual(x_, matrix_, vector_, friction_, lipschitz, exact)

    jacobian = jax.jacfwd(natural)(x, matrix, vector, friction)
    _, d_natural = jax.jvp(
        lambda m, b, mu: natural(x, m, b, mu),
        (matrix, vector, friction),
        (d_matrix, d_vector, d_friction),
    )
    return (x, residual), (-jnp.linalg.pinv(jacobian) @ d_natural, jnp.zeros_like(residual))


class ConeSolve(eqx.Module):
    """The solution of one step's cone QP: the `impulses` and the natural `residual`
    (max-norm) that they leave."""

    impulses: Float[Array, " k"]
    residual: Float[Array, ""]


def cone_solve(
    matrix, vector, friction, start, tolerance, max_iterations: int, exact: bool = False
) -> ConeSolve:
    """[`solve_cone_qp`][] and the residual of its solution (not differentiated): the one its
    loop stopped at, so that a solve that stopped at its tolerance is accepted as
    converged (the same residual computed apart, its sums in another order, can differ by
    rounding)."""
    impulses, residual = _solved(matrix, vector, friction, start, tolerance, max_iterations, exact)
    return ConeSolve(impulses, jax.lax.stop_gradient(residual))
