"""Equilibria, linearization and the stability verdict of Krasinskaya and Krasinskiy (2013)
(§§2–4)."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import check_count, check_finite, check_instance, check_positive, check_real
from .._compilation._linalg import full_precision
from .._custom_types import Array, ArrayLike, Bool, Float, Int, ScalarLike
from .._formulations import AbstractFormulation, AbstractIndependentVelocities, Unstabilized
from .._gains import attach_checks, is_concrete
from .._systems._control import ConstantControl, is_controlled, with_controller
from .._systems._system import AbstractSystem


def _indices(name, value, n):
    idx = tuple(int(i) % n if -n <= int(i) < n else int(i) for i in value)
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise ValueError(f"`{name}` indices {bad} are out of range for {n} coordinates.")
    if len(set(idx)) != len(idx):
        raise ValueError(f"`{name}` contains repeated indices: {value}.")
    return idx


def _with_input(system, u):
    return system if u is None else with_controller(system, ConstantControl(u))


# -- equilibria -------------------------------------------------------------------------


class Equilibrium(eqx.Module):
    """An equilibrium found by [`jaxdae.equilibrium`][].

    **Fields:**

    - `q`: all coordinates, `(n,)`; `v`: velocities, zero except for cyclic coordinates
        (steady motions, e.g. the current through a motor's charge coordinate), `(n,)`.
    - `u`: the equilibrium input `(p,)` (empty for an uncontrolled system).
    - `residual`: `max(|Φ|, |q̈|)` at the solution.
    """

    q: Float[Array, " n"]
    v: Float[Array, " n"]
    u: Float[Array, " p"]
    residual: Float[Array, ""]


def _equilibrium_residual(z, args):
    system, t, q_guess, free, cyclic, has_u = args
    q_free, v_cyclic, u = z
    q = q_guess.at[jnp.asarray(free, dtype=int)].set(q_free)
    v = jnp.zeros_like(q_guess).at[jnp.asarray(cyclic, dtype=int)].set(v_cyclic)
    system = _with_input(system, u if has_u else None)
    terms = system.terms(t, q, v)
    acc, _ = Unstabilized().accelerations(terms)
    return jnp.concatenate([terms.phi, acc])


@eqx.filter_jit
def _solve_equilibrium(system, t, q_guess, v_cyclic, u_guess, free, cyclic, rtol, max_steps):
    has_u = u_guess.shape[0] > 0
    z0 = (q_guess[jnp.asarray(free, dtype=int)], v_cyclic, u_guess)
    args = (system, t, q_guess, free, cyclic, has_u)
    sol = optx.least_squares(
        _equilibrium_residual,
        optx.GaussNewton(rtol=rtol, atol=rtol, linear_solver=lx.AutoLinearSolver(well_posed=False)),
        z0,
        args=args,
        max_steps=max_steps,
        throw=False,
    )
    q_free, v_cyc, u = sol.value
    q = q_guess.at[jnp.asarray(free, dtype=int)].set(q_free)
    v = jnp.zeros_like(q_guess).at[jnp.asarray(cyclic, dtype=int)].set(v_cyc)
    residual = jnp.max(jnp.abs(_equilibrium_residual(sol.value, args)), initial=0.0)
    return q, v, u, residual


@full_precision
def equilibrium(
    system,
    q_guess: Float[ArrayLike, " n"] | Sequence[ScalarLike],
    *,
    fixed: tuple[int, ...] = (),
    cyclic: tuple[int, ...] = (),
    v_guess: Float[ArrayLike, " n"] | Sequence[ScalarLike] | None = None,
    u_guess: Float[ArrayLike, " p"] | Sequence[ScalarLike] | None = None,
    t: float = 0.0,
    tol: ScalarLike | None = None,
    max_steps: int = 256,
) -> Equilibrium:
    """Finds an equilibrium (Krasinskaya and Krasinskiy (2013), eq. [11]) with optimistix'
    Gauss–Newton.

    Unknowns: the coordinates not listed in `fixed` or `cyclic`, the velocities of the
    `cyclic` coordinates (steady motions) and — for a controlled system given `u_guess` —
    the input `u`. Equations: `Φ(q) = 0` and `q̈ = 0` with the exact multipliers, i.e.
    `Q(q, v, u) ∈ range Φ_qᵀ`. Projected on the independent directions `N = [I; B]` this
    is eq. [11], `∂W/∂q_i + B_ui ∂W/∂q_u = Q_i + B_ui Q_u`: in redundant coordinates an
    equilibrium need not be a stationary point of `Π` (the reactions balance the rest),
    and it does not depend on which coordinates are called dependent.

    **Arguments:**

    - `system`: a [`jaxdae.LagrangianSystem`][] (controlled or not).
    - `q_guess`: initial guess; the `fixed` (and `cyclic`) entries are kept as given —
        e.g. the ball position `r0` of the Ball & Beam.
    - `fixed`: indices of coordinates held at their `q_guess` values.
    - `cyclic`: indices of cyclic coordinates (their position appears nowhere, e.g. an
        electric charge); their velocities are unknowns (guess from `v_guess`).
    - `u_guess`: guess of the equilibrium input; if given, `u` is solved for (the system
        must be a [`jaxdae.AbstractControlledSystem`][], see [`jaxdae.with_controller`][]).
    - `t`: the time (for time-dependent systems).
    - `tol`: accepted `max(|Φ|, |q̈|)`; default `1e-8` in float64, `1e-4` in float32.
    - `max_steps`: Gauss–Newton iterations (least-squares steps via SVD, so redundant
        equations are fine).

    **Returns:**

    An [`jaxdae.Equilibrium`][].

    **Raises:**

    `ValueError` for bad indices, a `max_steps` below 1, complex or float16 input,
    non-finite `q_guess`, `v_guess`, `u_guess` or `t`, a `tol` that is not positive and
    finite, and when no
    equilibrium is found (residual above `tol`); under `jit` the value checks are an
    `eqx.error_if` runtime error with the same message.
    """
    check_instance("system", system, AbstractSystem, "a jaxdae system")
    check_real(q_guess=q_guess, v_guess=v_guess, u_guess=u_guess, t=t, tol=tol)
    check_count("max_steps", max_steps, "Gauss–Newton iterations", minimum=1)
    max_steps = int(max_steps)
    q_guess = jnp.asarray(q_guess, dtype=jnp.result_type(q_guess, float))
    if q_guess.ndim != 1:
        raise ValueError(f"`q_guess` must be 1-D (n,); got shape {q_guess.shape}.")
    n = q_guess.shape[0]
    dtype = q_guess.dtype
    fixed = _indices("fixed", fixed, n)
    cyclic = _indices("cyclic", cyclic, n)
    free = tuple(i for i in range(n) if i not in fixed and i not in cyclic)
    v_all = jnp.zeros(n, dtype) if v_guess is None else jnp.asarray(v_guess, dtype=dtype)
    v_cyclic = v_all[jnp.asarray(cyclic, dtype=int)]
    t = jnp.asarray(t, dtype=dtype)
    if u_guess is None:
        u0 = jnp.zeros((0,), dtype)
    else:
        if not is_controlled(system):
            raise ValueError(
                "`u_guess` was given but the system has no `controller` field to set the "
                "input through (see `jaxdae.AbstractControlledSystem`)."
            )
        u0 = jnp.atleast_1d(jnp.asarray(u_guess, dtype=dtype))
    checks = list(_finite_checks(q_guess=q_guess, v_guess=v_all, u_guess=u0, t=t))
    if tol is None:
        tol = 1e-8 if dtype == jnp.float64 else 1e-4
    checks += _positive_checks("residual tolerance", tol=tol)
    rtol = 1e-3 * tol
    q, v, u, residual = _solve_equilibrium(
        system, t, q_guess, v_cyclic, u0, free, cyclic, rtol, max_steps
    )
    message = (
        "No equilibrium found near `q_guess`: max(|Φ|, |q̈|) stayed above tol{tol}. "
        "Check the fixed values (is an equilibrium possible there?), give the equilibrium "
        "input as unknown with `u_guess`, or start closer."
    )
    if is_concrete(residual, tol):
        if not float(residual) <= tol:
            raise ValueError(
                message.format(tol=f" = {float(tol):.3g}") + f" (residual {float(residual):.3g})"
            )
    else:
        checks.append((~(residual <= tol), message.format(tol="")))
    return attach_checks(Equilibrium(q=q, v=v, u=u, residual=residual), checks)


# -- linearization ----------------------------------------------------------------------


class Linearization(eqx.Module):
    """The first approximation `ẋ = A x + B u` about an equilibrium, and its verdict.

    **Fields:**

    - `A` `(s, s)`, `B` `(s, p)`: Jacobians of the formulation's vector field.
    - `positions`, `velocities`: the coordinate / velocity indices making up `x`
        (`x = (q[positions], v[velocities])`; pass them to [`jaxdae.LinearFeedback`][]).
    - `eigenvalues`: the characteristic roots, `(s,)` complex.
    - `num_zero_roots`: roots with `|λ| ≤ tol`.
    - `num_constraints`: `m`, the number of geometric constraints.
    - `expected_zero_roots`: the zero roots the constraints account for — `m` in redundant
        coordinates (Krasinskaya and Krasinskiy (2013) eqs. [16]–[18], `z = y − B x` carries `λ^m`),
        `0` in a stabilized Lagrange-multiplier form (there the constraint roots are those of the
        stabilization, e.g. `λ² + K_D λ + K_P`).
    - `tol`: the tolerance used: a root is zero if `|λ| ≤ tol`, negative if `Re λ < −tol`.
    - `asymptotically_stable`: the verdict of Krasinskaya and Krasinskiy's (2013) theorem — exactly
        `expected_zero_roots` zero roots and every other root with `Re λ < −tol`.
    """

    A: Float[Array, "s s"]
    B: Float[Array, "s p"]
    eigenvalues: Array
    num_zero_roots: Int[Array, ""]
    num_constraints: int = eqx.field(static=True)
    expected_zero_roots: int = eqx.field(static=True)
    tol: Float[Array, ""]
    asymptotically_stable: Bool[Array, ""]
    positions: tuple[int, ...] = eqx.field(static=True)
    velocities: tuple[int, ...] = eqx.field(static=True)


def _state_map(formulation, n, cyclic):
    positions = tuple(i for i in range(n) if i not in cyclic)
    if isinstance(formulation, AbstractIndependentVelocities):
        velocities = formulation.independent(n)
    else:
        velocities = tuple(range(n))
    return positions, velocities


def _vector_field(x, u, args):
    system, formulation, t, q_eq, v_eq, positions, velocities = args
    pos = jnp.asarray(positions, dtype=int)
    vel = jnp.asarray(velocities, dtype=int)
    s = len(positions)
    q = q_eq.at[pos].set(x[:s])
    v = v_eq.at[vel].set(x[s:])
    system = _with_input(system, u)
    v = formulation.velocities(system, t, q, v)
    acc, _ = formulation.accelerations(system.terms(t, q, v))
    return jnp.concatenate([v[pos], acc[vel]])


@eqx.filter_jit
def _linearize(system, formulation, t, q, v, u, positions, velocities, cyclic):
    args = (system, formulation, t, q, v, positions, velocities)
    x0 = jnp.concatenate(
        [q[jnp.asarray(positions, dtype=int)], v[jnp.asarray(velocities, dtype=int)]]
    )
    a = jax.jacfwd(_vector_field, argnums=0)(x0, u, args)
    if u is None:
        b = jnp.zeros((x0.shape[0], 0), x0.dtype)
    else:
        b = jax.jacfwd(_vector_field, argnums=1)(x0, u, args)
    # Cyclic coordinates must not enter the vector field.
    if cyclic:
        cyc = jnp.asarray(cyclic, dtype=int)

        def of_cyclic(qc):
            full = (system, formulation, t, q.at[cyc].set(qc), v, positions, velocities)
            return _vector_field(x0, u, full)

        dcyc = jax.jacfwd(of_cyclic)(q[cyc])
    else:
        dcyc = jnp.zeros((x0.shape[0], 0), x0.dtype)
    drift = _vector_field(x0, u, args)
    return a, b, dcyc, drift


@full_precision
def linearize(
    system,
    formulation: AbstractFormulation,
    q: Float[ArrayLike, " n"],
    v: Float[ArrayLike, " n"] | None = None,
    u: Float[ArrayLike, " p"] | None = None,
    *,
    t: float = 0.0,
    cyclic: tuple[int, ...] = (),
    tol: ScalarLike | None = None,
) -> Linearization:
    """First approximation about an equilibrium and the stability verdict of
    Krasinskaya and Krasinskiy (2013).

    `A = ∂f/∂x`, `B = ∂f/∂u` by forward-mode autodiff of the vector field `f` that
    [`jaxdae.simulate`][] integrates with `formulation`:

    - a Lagrange-multiplier form ([`jaxdae.Baumgarte`][], [`jaxdae.ModifiedLagrange`][],
      ...): `x = (q, q̇)` — `2n` states;
    - [`jaxdae.RedundantCoordinates`][]: `x = (q_ind, q_dep, q̇_ind)` — `2n − m` states;
      the constraint equations `ż = (…) ẋ` [16] contribute `m` zero roots [18].

    Cyclic coordinates (named in `cyclic`) are left out of `x` (their positions appear
    nowhere; their velocities stay). **Theorem** (Krasinskaya and Krasinskiy (2013) §4): if the
    roots other than the `m` zero roots of the constraints all have negative real parts, the
    equilibrium is asymptotically stable (not merely stable). The result states the count
    of (numerically) zero roots and the tolerance used.

    **Arguments:**

    - `system`: the system; if it is controlled ([`jaxdae.AbstractControlledSystem`][])
        and `u` is given, the input is set to the constant `u` and `B = ∂f/∂u` (for a closed
        loop, pass the system with its feedback law and `u=None`: then `B` has no columns).
    - `formulation`: as for `simulate`.
    - `q`, `v`: the equilibrium (e.g. from [`jaxdae.equilibrium`][]); `v` defaults to 0.
    - `u`: the equilibrium input, or `None`.
    - `t`: time; `cyclic`: indices of cyclic coordinates.
    - `tol`: a root is zero if `|λ| ≤ tol`; default `1e-6 · max(1, max|A|)`.

    **Returns:**

    A [`jaxdae.Linearization`][].

    **Raises:**

    `ValueError` for complex or float16 input, non-finite `q`, `v`, `u` or `t`, a `tol`
    that is not positive and finite, a point where the formulation cannot be evaluated (as
    `simulate` refuses such a `q0`: for [`jaxdae.RedundantCoordinates`][], a singular
    `∂F/∂q_dep`), a linearization that is not finite, when (concrete) `(q, v, u)` is not
    an equilibrium of the vector field (`|f| > 1e-6` scaled), or a `cyclic` coordinate
    does enter the equations. Under `jit` the value checks are `eqx.error_if` runtime
    errors with the same messages.
    """
    check_instance("system", system, AbstractSystem, "a jaxdae system")
    check_instance(
        "formulation",
        formulation,
        AbstractFormulation,
        "a jaxdae formulation such as `jaxdae.Unstabilized()` or "
        "`jaxdae.RedundantCoordinates(dependent)`",
    )
    check_real(q=q, v=v, u=u, t=t, tol=tol)
    q = jnp.asarray(q, dtype=jnp.result_type(q, float))
    if q.ndim != 1:
        raise ValueError(f"`q` must be 1-D (n,); got shape {q.shape}.")
    n = q.shape[0]
    v = jnp.zeros_like(q) if v is None else jnp.asarray(v, dtype=q.dtype)
    if v.shape != q.shape:
        raise ValueError(f"`v` must have the shape of `q`, ({n},); got shape {v.shape}.")
    if u is not None:
        u = jnp.atleast_1d(jnp.asarray(u, dtype=q.dtype))
        if not is_controlled(system):
            raise ValueError(
                "`u` was given but the system has no `controller` field (see "
                "`jaxdae.AbstractControlledSystem`)."
            )
    t = jnp.asarray(t, dtype=q.dtype)
    cyclic = _indices("cyclic", cyclic, n)
    terms = eqx.filter_eval_shape(lambda s: s.terms(t, q, v), system)
    counts = (terms.num_holonomic, terms.num_nonholonomic)
    formulation = attach_checks(formulation.validate(*counts), formulation.traced_checks(*counts))
    checks = [
        *_finite_checks(q=q, v=v, u=u, t=t),
        *_positive_checks("root tolerance", tol=tol),
        *_point_checks(system, formulation, t, q, v),
    ]
    positions, velocities = _state_map(formulation, n, cyclic)
    a, b, dcyc, drift = _linearize(system, formulation, t, q, v, u, positions, velocities, cyclic)
    scale = 1.0 + jnp.max(jnp.abs(a), initial=0.0)
    if is_concrete(a, drift, dcyc):
        if not (np.all(np.isfinite(np.asarray(a))) and np.all(np.isfinite(np.asarray(b)))):
            raise ValueError(_NOT_FINITE)
        if float(jnp.max(jnp.abs(dcyc), initial=0.0)) > 1e-8 * float(scale):
            raise ValueError(
                f"Coordinates {cyclic} are not cyclic: the equations of motion depend on them "
                f"(max |∂f/∂q_cyclic| = {float(jnp.max(jnp.abs(dcyc))):.3g})."
            )
        if float(jnp.max(jnp.abs(drift), initial=0.0)) > 1e-6 * float(scale):
            raise ValueError(
                "(q, v, u) is not an equilibrium: the vector field is "
                f"{np.asarray(drift)} there. Find one first with `jaxdae.equilibrium`."
            )
    tol = 1e-6 * scale if tol is None else jnp.asarray(tol, dtype=q.dtype)
    eig = jnp.linalg.eigvals(a)
    zero = jnp.abs(eig) <= tol
    m = terms.num_holonomic
    expected = m if isinstance(formulation, AbstractIndependentVelocities) else 0
    num_zero = jnp.sum(zero)
    stable = (num_zero == expected) & jnp.all(zero | (jnp.real(eig) < -tol))
    if not is_concrete(a, b):
        checks.append((~(jnp.all(jnp.isfinite(a)) & jnp.all(jnp.isfinite(b))), _NOT_FINITE))
    return attach_checks(
        Linearization(
            A=a,
            B=b,
            eigenvalues=eig,
            num_zero_roots=num_zero,
            num_constraints=m,
            expected_zero_roots=expected,
            tol=tol,
            asymptotically_stable=stable,
            positions=positions,
            velocities=velocities,
        ),
        checks,
    )


_NOT_FINITE = (
    "The linearization is not finite: the vector field or its Jacobian holds nan or inf at "
    "(q, v, u). Evaluate the model there (a square root or division that leaves its "
    "domain), or choose another equilibrium."
)


def _finite_checks(**named) -> tuple:
    """`ValueError` naming the first concrete input (arrays or None) that holds nan or inf;
    the traced ones' checks `(flag, message)`."""
    checks = []
    for name, value in named.items():
        if value is None:
            continue
        if is_concrete(value):
            check_finite(name, value)
        else:
            checks.append(
                (
                    ~jnp.all(jnp.isfinite(value)),
                    f"`{name}` contains non-finite values (nan or inf).",
                )
            )
    return tuple(checks)


def _positive_checks(kind: str, **named) -> tuple:
    """As `_finite_checks`, for values that must be positive and finite (`kind` names
    them: "residual tolerance", ...)."""
    checks = []
    for name, value in named.items():
        if value is None or is_concrete(value):
            check_positive(name, value, kind)
        else:
            checks.append(
                (
                    ~(jnp.isfinite(value) & (value > 0)),
                    f"`{name}` must be a positive finite {kind}.",
                )
            )
    return tuple(checks)


@eqx.filter_jit
def _state_problems(system, formulation, t, q, v):
    return formulation.state_problems(system, t, q, v)


def _point_checks(system, formulation, t, q, v) -> tuple:
    """What the formulation refuses at the linearization point, as `simulate` checks its
    initial state (`state_problems`; e.g. [`jaxdae.RedundantCoordinates`][] at a
    configuration where `∂F/∂q_dep` is singular, whose `A` would be nan): `ValueError`
    where concrete, else checks `(flag, message)`."""
    flags, values = _state_problems(system, formulation, t, q, v)
    where = "The linearization point (checked as `simulate` checks its `q0`): "
    if is_concrete(flags, values):
        for flag, value, (message, name) in zip(
            np.asarray(flags), np.asarray(values), formulation.state_messages, strict=True
        ):
            if flag:
                raise ValueError(
                    f"{where}{message} ({name}: {float(value):.3g} at q = {np.asarray(q)})"
                )
        return ()
    return tuple(
        (flags[i], where + message) for i, (message, _) in enumerate(formulation.state_messages)
    )


def closed_loop_matrix(linearization: Linearization, gain: Float[Array, "p s"]):
    """`A − B K` for a gain on the linearization's own state."""
    return linearization.A - linearization.B @ gain
