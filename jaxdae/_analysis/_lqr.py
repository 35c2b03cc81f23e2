"""Differentiable linear-quadratic regulator: the continuous-time algebraic Riccati equation.

Krasinskaya and Krasinskiy (2013) (§6) designs the Ball & Beam controller by minimising
`∫ (xᵀQx + uᵀRu) dt` (Krasovsky / Malkin): `u = −K x`, `K = R⁻¹BᵀP`, with `P` the
stabilizing solution of

    AᵀP + PA − PBR⁻¹BᵀP + Q = 0.

How it is solved (no Schur decomposition, so it runs on any backend, under `jit`/`vmap`):

1. the matrix sign function of the Hamiltonian `H = [[A, −BR⁻¹Bᵀ], [−Q, −Aᵀ]]` by the
   determinant-scaled Newton iteration `Z ← ½(cZ + (cZ)⁻¹)`, `c = |det Z|^{-1/2n}`, run by
   `optimistix.fixed_point`; the stable invariant subspace `[I; P]` is the null space of
   `sign(H) + I`, so `[S₁₂; S₂₂ + I] P = −[S₁₁ + I; S₂₁]` (Roberts' method, a least-squares
   solve);
2. a Newton polish of the Riccati residual itself with `optimistix.root_find` (each Newton
   step is a Kleinman step: a Lyapunov equation with the closed-loop matrix);
3. gradients by the implicit function theorem (`optimistix.ImplicitAdjoint`): the backward
   pass solves the adjoint Lyapunov equation `A_cl Y + Y A_clᵀ = P̄`, well posed because
   `A_cl = A − BK` is Hurwitz. Nothing is differentiated through the iterations.

The sign iteration converges iff `H` has no eigenvalue on the imaginary axis, i.e. when
`(A, B)` is stabilizable and `(Q, A)` detectable — exactly when the stabilizing solution
exists.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import check_finite, check_real
from .._compilation._linalg import full_precision
from .._custom_types import Array, ArrayLike, Bool, Float, ScalarLike
from .._gains import attach_checks, is_concrete


class LQRSolution(eqx.Module):
    """The result of [`jaxdae.lqr`][].

    **Fields:**

    - `gain`: `K = R⁻¹BᵀP`, shape `(p, n)`; the optimal control is `u = −K x`.
    - `riccati`: `P`, the symmetric positive semidefinite stabilizing solution, `(n, n)`.
    - `closed_loop_eigenvalues`: eigenvalues of `A − BK` (all with negative real part).
    - `residual`: `max |AᵀP + PA − PBR⁻¹BᵀP + Q|` at the returned `P`.
    - `stabilizing`: whether `P` is the stabilizing solution (finite, `A − BK` Hurwitz,
        a small residual). Always true with `throw=True` (which raises otherwise); with
        `throw=False` false where the inputs are not finite or no stabilizing solution
        exists (then `gain` and `riccati` are nan), one flag per member under `vmap`.
        `succeeded` reads it, as for a [`jaxdae.Solution`][].
    """

    gain: Float[Array, "p n"]
    riccati: Float[Array, "n n"]
    closed_loop_eigenvalues: Array
    residual: Float[Array, ""]
    stabilizing: Bool[Array, ""]

    @property
    def succeeded(self) -> Bool[Array, "*batch"]:
        """`stabilizing`: a stabilizing solution was found (per member of a batch)."""
        return self.stabilizing

    @property
    def K(self):  # noqa: N802 — the control-theory name
        return self.gain

    @property
    def P(self):  # noqa: N802
        return self.riccati


def _sym(x):
    return 0.5 * (x + x.T)


def _riccati_residual(p, args):
    a, b, q, r = args
    r_inv_bt = jnp.linalg.solve(r, b.T)
    return a.T @ p + p @ a - p @ b @ r_inv_bt @ p + q


def _sign_step(z, args):
    n2 = z.shape[0]
    _, logdet = jnp.linalg.slogdet(z)
    c = jnp.exp(-logdet / n2)
    cz = c * z
    return 0.5 * (cz + jnp.linalg.inv(cz))


def _sign_solution(a, b, q, r, rtol, max_steps):
    """Stabilizing `P` from the matrix sign function of the Hamiltonian (Roberts' method)."""
    n = a.shape[0]
    g = b @ jnp.linalg.solve(r, b.T)
    h = jnp.block([[a, -g], [-q, -a.T]])
    sol = optx.fixed_point(
        _sign_step,
        optx.FixedPointIteration(rtol=rtol, atol=rtol),
        h,
        max_steps=max_steps,
        throw=False,
    )
    s = sol.value
    eye = jnp.eye(n, dtype=a.dtype)
    lhs = jnp.concatenate([s[:n, n:], s[n:, n:] + eye], axis=0)
    rhs = -jnp.concatenate([s[:n, :n] + eye, s[n:, :n]], axis=0)
    p = jnp.linalg.lstsq(lhs, rhs)[0]
    return _sym(p), sol.result


def _uncontrollable_unstable_modes(a, b, tol):
    """Eigenvalues `λ` of `A` with `Re λ ≥ 0` that fail the PBH test `rank [A − λI, B] = n`."""
    a, b = np.asarray(a), np.asarray(b)
    n = a.shape[0]
    bad = []
    for lam in np.linalg.eigvals(a):
        if lam.real < -tol * max(1.0, np.abs(a).max()):
            continue
        svals = np.linalg.svd(np.concatenate([a - lam * np.eye(n), b], axis=1), compute_uv=False)
        if svals[-1] <= tol * max(1.0, svals[0]):
            bad.append(lam)
    return bad


def _eigenvalues(matrix: Float[Array, "n n"]) -> Array:
    """The eigenvalues of `matrix`, nan where it is not finite: the eigenvalue routine
    (`geev`, LAPACK's or on a GPU cuSOLVER's) is given finite matrices only, whose result
    for other input is not defined, so that a non-finite member of a batch leaves the
    others' eigenvalues as they are."""
    finite = jnp.all(jnp.isfinite(matrix))
    return jnp.where(finite, jnp.linalg.eigvals(jnp.where(finite, matrix, 0.0)), jnp.nan)


@eqx.filter_jit
def _lqr(a, b, q, r, rtol, max_steps):
    # The initial guess needs no gradient. It is computed in the widest float available
    # (optimistix' fixed-point state is float64 under x64, whatever the input dtype).
    wide = jnp.result_type(float)
    p0, sign_result = _sign_solution(
        *(jax.lax.stop_gradient(x).astype(wide) for x in (a, b, q, r)),
        jnp.maximum(jax.lax.stop_gradient(rtol), 100 * jnp.finfo(wide).eps),
        max_steps,
    )
    p0 = p0.astype(a.dtype)
    solver = optx.Newton(rtol=rtol, atol=rtol, linear_solver=lx.LU())
    sol = optx.root_find(
        _riccati_residual,
        solver,
        p0,
        args=(a, b, q, r),
        max_steps=max_steps,
        adjoint=optx.ImplicitAdjoint(linear_solver=lx.LU()),
        throw=False,
    )
    p = _sym(sol.value)
    gain = jnp.linalg.solve(r, b.T @ p)
    closed = _eigenvalues(a - b @ gain) if a.shape[0] else jnp.zeros((0,), complex)
    residual = jnp.max(jnp.abs(_riccati_residual(p, (a, b, q, r))), initial=0.0)
    scale = (
        1.0
        + jnp.max(jnp.abs(q), initial=0.0)
        + jnp.max(jnp.abs(p), initial=0.0) * (1.0 + jnp.max(jnp.abs(a), initial=0.0))
    )
    bad = (
        ~jnp.all(jnp.isfinite(p)) | ~jnp.all(jnp.real(closed) < 0) | (residual > 1e3 * rtol * scale)
    )
    return gain, p, closed, residual, bad, sign_result


_NOT_STABILIZABLE = (
    "No stabilizing solution of the Riccati equation: (A, B) must be stabilizable (every "
    "eigenvalue of A with Re λ ≥ 0 controllable, rank [A − λI, B] = n) and (Q, A) "
    "detectable (e.g. Q positive definite). Add actuators or check the linearization."
)


def _scale_note(q, r, residual) -> str:
    """Where the weights' scales may explain a failure (concrete values): the Riccati
    residual is not finite (the iteration overflowed), or `max |Q| / max |R|` lies
    beyond `1/ε` either way (`P` and the gain lose their digits). Else ""."""
    q_size, r_size = float(np.max(np.abs(q), initial=0.0)), float(np.max(np.abs(r)))
    ratio = q_size / r_size
    limit = 1 / float(np.finfo(np.asarray(q).dtype).eps)
    overflowed = not np.isfinite(float(residual))
    if not (overflowed or ratio > limit or 0 < ratio < 1 / limit):
        return ""
    what = "overflowed to nan" if overflowed else "lost its precision"
    return (
        f" The weights are badly scaled (max |Q| = {q_size:.3g}, max |R| = {r_size:.3g}, "
        f"a ratio of {ratio:.3g}): the Riccati iteration {what}. The gain depends only "
        "on the ratio of `Q` to `R`: scale both by the same factor to bring them near 1 "
        "(e.g. divide both by max |Q|), or choose the state's units so that their ratio "
        "lies within 1e15."
    )


@full_precision
def lqr(
    A: Float[ArrayLike, "n n"],  # noqa: N803
    B: Float[ArrayLike, "n p"] | Float[ArrayLike, " n"],  # noqa: N803
    Q: Float[ArrayLike, "n n"],  # noqa: N803
    R: Float[ArrayLike, "p p"] | ScalarLike,  # noqa: N803
    *,
    rtol: ScalarLike | None = None,
    max_steps: int = 100,
    throw: bool = True,
) -> LQRSolution:
    """Continuous-time LQR: minimises `∫ (xᵀQx + uᵀRu) dt` for `ẋ = Ax + Bu`
    (Krasinskaya and Krasinskiy (2013), §6).

    Solves `AᵀP + PA − PBR⁻¹BᵀP + Q = 0` for the stabilizing `P` (matrix sign function of
    the Hamiltonian, then Newton; see the module docstring) and returns `K = R⁻¹BᵀP`.
    Differentiable with respect to `A`, `B`, `Q`, `R` by implicit differentiation (the
    backward pass solves one adjoint Lyapunov equation); works under `jit` and `vmap`.
    `Q` and `R` are symmetrized.

    **Arguments:**

    - `A`, `B`: the linear model, shapes `(n, n)` and `(n, p)`.
    - `Q`, `R`: weights, `Q` symmetric positive semidefinite `(n, n)` with `(Q, A)`
        detectable, `R` symmetric positive definite `(p, p)`. The paper's weights (integrand
        `x₁² + … + x₅² + u²`) are `Q = I`, `R = I`.
    - `rtol`: relative tolerance of the iterations, in `(0, 1]`; default `100 · eps` of
        the dtype.
    - `max_steps`: iterations of each of the two stages.
    - `throw`: raise where no stabilizing solution is found (and, traced, where the inputs
        are not finite); with `False` report it in `LQRSolution.stabilizing` instead, one
        flag per member under `vmap`.

    **Returns:**

    An [`jaxdae.LQRSolution`][] with `gain` (`K`), `riccati` (`P`), the closed-loop
    eigenvalues, the Riccati residual and whether `P` is stabilizing.

    **Raises:**

    `ValueError` for bad shapes, complex or float16 inputs, an `rtol` outside `(0, 1]`, and
    (concrete inputs) for non-finite entries, `Q` not positive semidefinite, `R` not
    positive definite; with `throw=True` also for `(A, B)` not stabilizable or when no
    stabilizing solution is found. Under `jit`/`vmap`/`grad` the last two, and non-finite
    entries, are `eqx.error_if` runtime errors with the same messages (a gradient near an
    uncontrollable pair works where the solution exists).
    """
    # (Nested lists as arrays: `jnp.result_type` takes no lists.)
    A, B, Q, R = (np.asarray(x) if isinstance(x, (list, tuple)) else x for x in (A, B, Q, R))
    check_real(A=A, B=B, Q=Q, R=R)
    dtype = jnp.result_type(A, B, Q, R, float)
    a, b, q, r = (jnp.asarray(x, dtype=dtype) for x in (A, B, Q, R))
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"`A` must be square (n, n); got shape {a.shape}.")
    n = a.shape[0]
    if b.ndim == 1:
        b = b[:, None]
    if b.ndim != 2 or b.shape[0] != n:
        raise ValueError(f"`B` must have shape ({n}, p); got {b.shape}.")
    p_dim = b.shape[1]
    if q.shape != (n, n):
        raise ValueError(f"`Q` must have shape ({n}, {n}); got {q.shape}.")
    r = jnp.atleast_2d(r)
    if r.shape != (p_dim, p_dim):
        raise ValueError(f"`R` must have shape ({p_dim}, {p_dim}); got {r.shape}.")
    q, r = _sym(q), _sym(r)
    rtol = float(100 * jnp.finfo(dtype).eps) if rtol is None else rtol
    checks = list(_check_options(rtol, max_steps))
    stabilizable = True
    if is_concrete(a, b, q, r):
        for name, value in (("A", a), ("B", b), ("Q", q), ("R", r)):
            check_finite(name, value)
        r_np = np.asarray(r)
        if np.linalg.eigvalsh(r_np)[0] <= 0:
            raise ValueError("`R` must be symmetric positive definite (every input costs).")
        if np.linalg.eigvalsh(np.asarray(q))[0] < -1e-10 * max(1.0, np.abs(np.asarray(q)).max()):
            raise ValueError("`Q` must be symmetric positive semidefinite.")
        bad_modes = _uncontrollable_unstable_modes(a, b, float(np.sqrt(np.finfo(dtype).eps)))
        if bad_modes and throw:
            modes = ", ".join(f"{complex(x):.4g}" for x in bad_modes)
            raise ValueError(
                f"(A, B) is not stabilizable: the modes λ = {modes} (Re λ ≥ 0) are not "
                f"controllable (PBH test rank [A − λI, B] < n). {_NOT_STABILIZABLE}"
            )
        stabilizable = not bad_modes
    else:
        checks.append(
            (
                ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in (a, b, q, r)])),
                "`A`, `B`, `Q` and `R` must be finite; a traced one holds nan or inf.",
            )
        )
    gain, p, closed, residual, bad, _ = _lqr(a, b, q, r, rtol, max_steps)
    bad = bad | (not stabilizable)
    # `residual` as well: under an eager `jax.grad` the flag is concrete and it is not.
    if is_concrete(bad, residual) and throw:
        if bool(bad):
            note = _scale_note(q, r, residual)
            if note:  # the likelier cause first
                raise ValueError(
                    f"No stabilizing solution of the Riccati equation (residual "
                    f"{float(residual):.3g}).{note} Else: "
                    f"{_NOT_STABILIZABLE.split(': ', 1)[1]}"
                )
            raise ValueError(f"{_NOT_STABILIZABLE} (Riccati residual {float(residual):.3g}).")
    failed = bad
    for flag, _ in checks:
        failed = failed | flag
    if throw:
        gain = attach_checks(
            gain, [*checks, (bad, _NOT_STABILIZABLE)] if not is_concrete(bad, residual) else checks
        )
    else:
        gain, p = (jnp.where(failed, jnp.nan, x) for x in (gain, p))
    return LQRSolution(
        gain=gain,
        riccati=p,
        closed_loop_eigenvalues=closed,
        residual=residual,
        stabilizing=~jnp.asarray(failed),
    )


def _check_options(rtol, max_steps) -> tuple:
    """`ValueError` for a concrete `rtol` outside `(0, 1]` or a `max_steps` that is not a
    positive integer; a traced `rtol`'s check `(flag, message)`."""
    if (
        isinstance(max_steps, bool)
        or not isinstance(max_steps, (int, np.integer))
        or (max_steps < 1)
    ):
        raise ValueError(f"`max_steps` must be a positive integer; got {max_steps!r}.")
    check_real(rtol=rtol)
    message = "`rtol` must be a relative tolerance in (0, 1]"
    if is_concrete(rtol):
        if not (np.ndim(rtol) == 0 and 0 < float(rtol) <= 1):
            raise ValueError(f"{message}; got {rtol}.")
        return ()
    return ((~((rtol > 0) & (rtol <= 1)), message + "."),)


def is_stabilizing(a, b, gain) -> Bool[Array, ""]:
    """Whether `A − BK` is Hurwitz."""
    return jnp.all(jnp.real(_eigenvalues(a - b @ gain)) < 0)
