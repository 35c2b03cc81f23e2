"""Input checks of a solve, eager where the inputs are concrete: the system and
formulation's types and shapes, the initial state, the times, the solver options and the
step-size controller's values."""

import typing
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (
    TOLERANCE_RULE,
    check_instance,
    check_leaf_dtypes,
    check_real,
    check_tolerances,
    dtype_problem,
    tolerance_problem,
)
from .._compilation._constants import jit_with_constants
from .._compilation._operators import FactoredOperator
from .._custom_types import Array, Bool
from .._formulations import AbstractFormulation, AbstractStabilizedFormulation
from .._gains import is_concrete
from .._systems._hamiltonian import HamiltonianSystem
from .._systems._nonholonomic import is_not_affine
from .._systems._structure import is_mass_positive_definite
from .._systems._system import (
    AbstractSystem,
    LagrangianSystem,
    cast_floating,
    model_defines,
    require_output,
)
from ._solvers import AbstractSolverWrapper
from ._vector_fields import system_terms


def check_initial_state(
    system: AbstractSystem, formulation, t0, q0, v0
) -> tuple[Array, Array, Array]:
    """The mass matrix at the initial state, one flag per problem in
    `INITIAL_STATE_MESSAGES` followed by the formulation's `state_problems` flags, and the
    values those quote (the eager checks)."""
    terms = system_terms(system, t0, q0, v0)
    flags, values = initial_state_problems(
        system,
        formulation,
        (t0, q0, v0),
        (terms.mass_matrix, factored_positive_definite(terms), terms.forces),
        terms.num_nonholonomic,
    )
    return terms.mass_matrix, flags, values


def factored_positive_definite(terms) -> Array | None:
    """Whether the mass matrix of `terms` is positive definite, where the factor that its
    operator carries shows it (`AbstractMassFactor.positive_definite`: a tree's articulated
    pivots); else `None`, and `initial_state_problems` tests the dense matrix.

    A system whose terms carry such a factor computes it with its terms, and its forces
    are nan wherever the factor shows `M` not positive definite (`TreeMechanism.terms`), so
    that the rates of every formulation are: a solve stalls there. A traced solve of such
    a system therefore checks neither `M` nor the forces at the initial state
    (`check_traced`); the eager checks (`check_initial_state`) and the naming of a stalled
    solve (`non_finite_term`) read the factor."""
    operator = terms.mass_operator
    return operator.factor.positive_definite() if isinstance(operator, FactoredOperator) else None


def initial_state_problems(
    system, formulation, state, terms, num_nonholonomic: int, rows: str | None = None
) -> tuple[Array, Array]:
    """The flags and values of `check_initial_state` at the initial `state = (t0, q0, v0)`,
    given `terms = (mass matrix, definite, forces)` there, `definite` whether the mass
    matrix is positive definite as its factor shows it (`factored_positive_definite`; None:
    the matrix itself is tested). `terms=None`: the mass matrix and the forces are not
    checked (their flags are false), as for a traced solve of a system whose forces turn
    nan where its factor shows `M` not positive definite (`check_traced`).

    With `rows`, the name of a `vmap` axis over trajectories, each flag says whether it holds
    in any row. A flag that is the same in every row (a constant) then stays one value: as a
    column broadcast over the rows and reduced, XLA's GPU compiler would constant-fold it row
    by row (docs/design_measurements.md#constant-row-flags)."""
    t0, q0, v0 = state
    if terms is None:
        indefinite = non_finite_forces = False
    else:
        mass, definite, forces = terms
        indefinite = ~mass_positive_definite(system, (t0, q0, v0), mass, definite)
        non_finite_forces = ~jnp.all(jnp.isfinite(forces))
    if jnp.shape(q0) == jnp.shape(v0):  # one reduction: one operation fewer in the program
        q0_finite, v0_finite = jnp.all(jnp.isfinite(jnp.stack([q0, v0])).reshape(2, -1), axis=1)
    else:
        q0_finite, v0_finite = jnp.all(jnp.isfinite(q0)), jnp.all(jnp.isfinite(v0))
    flags = [
        ~q0_finite,
        ~v0_finite,
        indefinite,
        non_finite_forces,
        # Only nonholonomic constraints can fail to be affine (a Hessian costs trace time).
        is_not_affine(*system.velocity_constraint_curvature(t0, q0, v0))
        if num_nonholonomic
        else False,
    ]
    problems, values = formulation.state_problems(system, t0, q0, v0)
    if rows is not None:

        def anywhere(flag):
            return jax.lax.psum(jnp.asarray(flag, jnp.int32), rows) > 0

        flags, problems = [anywhere(f) for f in flags], anywhere(problems)
    return jnp.concatenate([jnp.stack(flags), problems]), values


def mass_positive_definite(system, state, mass, definite) -> Array:
    """Whether the mass matrix `mass` of `system` at `state = (t, q, v)` is symmetric
    positive definite: `definite` where its factor shows it (`factored_positive_definite`),
    else tested on the matrix (`is_mass_positive_definite` of its symmetric part, and
    symmetric to `10⁻⁸` of its largest entry, or to 100 units in the last place where its
    type is coarser: a float32 `M` is symmetric only to its rounding)."""
    if definite is not None:
        return definite
    tolerance = max(1e-8, 100 * float(jnp.finfo(mass.dtype).eps))
    asym = jnp.max(jnp.abs(mass - mass.T)) > tolerance * (1 + jnp.max(jnp.abs(mass)))
    return ~asym & is_mass_positive_definite(system, *state, 0.5 * (mass + mass.T))


def initial_state_message(formulation, problem: int) -> str:
    """The message of flag `problem` of `check_initial_state`."""
    if problem < len(INITIAL_STATE_MESSAGES):
        return INITIAL_STATE_MESSAGES[problem]
    return formulation.state_messages[problem - len(INITIAL_STATE_MESSAGES)][0]


INITIAL_STATE_MESSAGES = (
    "`q0` contains non-finite values (nan or inf); pass finite initial coordinates.",
    "`v0` contains non-finite values (nan or inf); pass finite initial velocities.",
    "The mass matrix at `q0` is not symmetric positive definite; check `kinetic_energy` / "
    "`mass_matrix` (every coordinate needs inertia) or move `q0` away from a degenerate "
    "configuration.",
    "The generalized forces at (t0, q0, v0) are not finite; check `potential_energy`, "
    "`generalized_forces` and `kinetic_energy` at the initial state.",
    "`velocity_constraints` is not affine in the velocities (∂²Ψ/∂v² ≠ 0 near the initial "
    "state): every formulation needs Ψ = A(t, q) v + a(t, q) (Shemelova (2016) eq. [1]). Rewrite "
    "it linearly in v (e.g. a rolling condition `v_x sin θ − v_y cos θ`, not its square).",
)


check_initial_state_jit = jit_with_constants(check_initial_state)


def check_types(system, formulation):
    """The system and formulation are jaxdae's, with real arrays of float32 or float64
    (`check_leaf_dtypes`: a complex parameter would lose its imaginary part when cast to
    the state's dtype)."""
    check_instance(
        "system",
        system,
        AbstractSystem,
        "a jaxdae system (e.g. a `jaxdae.LagrangianSystem` subclass)",
    )
    check_instance(
        "formulation",
        formulation,
        AbstractFormulation,
        "a jaxdae formulation such as `jaxdae.Baumgarte(kd, kp)` or "
        "`jaxdae.ModifiedLagrange(alpha, kd, kp)`",
    )
    check_leaf_dtypes(system, "system parameter")
    check_leaf_dtypes(formulation, "gain")


def check_solve_options(solver, stepsize_controller, adjoint, max_steps) -> None:
    """The diffrax options of a solve are instances of the right kind; `max_steps` is a
    positive integer or `None`. (What [`jaxdae.ReverseSweepAdjoint`][] cannot sweep — an
    implicit solver, `max_steps=None` — it refuses itself when the solve is traced.)"""
    check_instance(
        "solver",
        solver,
        diffrax.AbstractSolver,
        "a diffrax solver instance such as `diffrax.Tsit5()`",
        optional=True,
    )
    if solver is not None:
        check_ode_solver(solver)
    check_instance(
        "stepsize_controller",
        stepsize_controller,
        diffrax.AbstractStepSizeController,
        "a diffrax step-size controller such as `diffrax.PIDController(rtol, atol)` "
        "or `diffrax.ConstantStepSize()`",
        optional=True,
    )
    check_instance(
        "adjoint",
        adjoint,
        diffrax.AbstractAdjoint,
        "a diffrax adjoint such as `diffrax.RecursiveCheckpointAdjoint()` or "
        "`jaxdae.ReverseSweepAdjoint()`",
        optional=True,
    )
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1
    ):
        raise ValueError(f"`max_steps` must be a positive integer or None; got {max_steps!r}.")
    check_controller_values(stepsize_controller)
    if isinstance(adjoint, diffrax.RecursiveCheckpointAdjoint) and not (
        adjoint.checkpoints is None
        or (isinstance(adjoint.checkpoints, (int, np.integer)) and adjoint.checkpoints >= 1)
    ):
        raise ValueError(
            "`diffrax.RecursiveCheckpointAdjoint(checkpoints=...)` must be a "
            f"positive integer or None; got {adjoint.checkpoints!r}."
        )


def controller_value(name, value, rule, fix):
    """`ValueError` naming `name` unless a concrete `value` satisfies `rule` (None and
    traced values pass)."""
    if value is None or not is_concrete(value):
        return
    array = np.asarray(value, dtype=float)
    if not (array.ndim == 0 and np.isfinite(array) and rule(float(array))):
        raise ValueError(f"The step-size controller's `{name}` must be {fix}; got {value!r}.")


def check_ode_solver(solver) -> None:
    """`ValueError` for a diffrax solver that does not integrate one ODE term (its
    `term_structure` is a `diffrax.MultiTerm` or a tuple): the solvers of stochastic
    differential equations, IMEX and partitioned solvers. `simulate` solves one
    `diffrax.ODETerm`."""
    structure = solver.term_structure
    origin = typing.get_origin(structure) or structure
    if (
        isinstance(origin, type)
        and issubclass(origin, diffrax.AbstractTerm)
        and not issubclass(origin, diffrax.MultiTerm)
    ):
        return
    inner = solver
    while isinstance(inner, AbstractSolverWrapper):
        inner = inner.solver
    name = type(inner).__name__
    if isinstance(
        inner, (diffrax.AbstractItoSolver, diffrax.AbstractStratonovichSolver, diffrax.AbstractSRK)
    ):
        raise ValueError(
            f"`solver` is `diffrax.{name}`, a solver of stochastic differential equations: "
            "its terms are a drift and a diffusion driven by a Brownian motion "
            f"({structure}). jaxdae integrates an ODE (one `diffrax.ODETerm`) and cannot "
            "use it; pass an ODE solver such as `diffrax.Tsit5()` (adaptive), "
            "`diffrax.Heun()` (fixed steps) or `diffrax.Kvaerno5()` (stiff)."
        )
    raise ValueError(
        f"`solver` is `diffrax.{name}`, which integrates several terms ({structure}: an "
        "IMEX solver's explicit and implicit parts, or a partitioned solver's two halves "
        "of the state). jaxdae integrates one ODE term (`diffrax.ODETerm`); pass a solver "
        "of one term such as `diffrax.Tsit5()` or, for stiff problems, `diffrax.Kvaerno5()`."
    )


def check_controller_values(controller) -> None:
    """The numbers of a diffrax step-size controller that the user passed, checked as
    `simulate` checks its own `rtol` and `atol` (concrete values only): a
    `diffrax.PIDController`'s tolerances, coefficients, step bounds and factors, the
    controller inside a `diffrax.ClipStepSizeController` and its times, a `diffrax.StepTo`'s
    times. A negative `rtol`, say, would make every step pass its error test."""
    if isinstance(controller, diffrax.ClipStepSizeController):
        for name in ("step_ts", "jump_ts"):
            times = getattr(controller, name)
            if (
                times is not None
                and is_concrete(times)
                and not np.all(np.isfinite(np.asarray(times)))
            ):
                raise ValueError(
                    f"`diffrax.ClipStepSizeController({name}=...)` must hold "
                    f"finite times; got {times}."
                )
        controller = controller.controller
    if isinstance(controller, diffrax.StepTo):
        times = controller.ts
        if is_concrete(times):
            times = np.asarray(times)
            if not (np.all(np.isfinite(times)) and np.all(np.diff(times) > 0)):
                raise ValueError(
                    "`diffrax.StepTo(ts=...)` must hold finite, strictly "
                    f"increasing times; got {times}."
                )
    if not isinstance(controller, diffrax.PIDController):
        return
    check_tolerances(controller.rtol, controller.atol, "The step-size controller's ")
    for name in ("pcoeff", "icoeff", "dcoeff"):
        controller_value(name, getattr(controller, name), lambda x: True, "finite")
    controller_value(
        "icoeff",
        controller.icoeff,
        lambda x: x > 0,
        "positive (it sets how the step follows the error)",
    )
    for name in ("dtmin", "dtmax"):
        controller_value(
            name, getattr(controller, name), lambda x: x > 0, "a positive finite step or None"
        )
    dtmin, dtmax = controller.dtmin, controller.dtmax
    if (
        dtmin is not None
        and dtmax is not None
        and is_concrete(dtmin, dtmax)
        and (float(dtmin) > float(dtmax))
    ):
        raise ValueError(
            f"The step-size controller's `dtmin` ({dtmin}) must not exceed its `dtmax` ({dtmax})."
        )
    controller_value("factormin", controller.factormin, lambda x: 0 < x <= 1, "in (0, 1]")
    controller_value("factormax", controller.factormax, lambda x: x >= 1, "at least 1")
    controller_value("safety", controller.safety, lambda x: 0 < x <= 1, "in (0, 1]")


def signature(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(
        (jnp.shape(x), jnp.result_type(x)) if eqx.is_array_like(x) else x for x in leaves
    )


def check_inputs(system, formulation, call, t0, t1, one, dtype, dense_mass: bool = False):
    """The inputs of a solve checked once, in the order one fixes them: the types of the
    system and formulation ([`check_types`][]) and of the call's solve options
    ([`check_solve_options`][]), the times ([`checked_times`][]), then, in the state's
    precision (`cast_floating`; with its dense mass matrix where a time step factors it,
    `dense_mass`), the model's outputs and constraint counts at one trajectory's state
    `one = (q, v)` ([`check_structure`][]) and the formulation's gains against them
    (`AbstractFormulation.checked`).

    Returns `(system, formulation, (t0, t1, ts), counts, gap_shape, gain_checks,
    failure)`: the system and formulation in the state's precision (the formulation
    validated), the times as arrays of `dtype`, the constraint counts, the shape of the
    system's gaps, the formulation's traced checks and its failure's result (None: its
    test cannot stop this solve)."""
    check_types(system, formulation)
    check_solve_options(call.solver, call.stepsize_controller, call.adjoint, call.max_steps)
    times = checked_times(call, t0, t1, dtype)
    if dense_mass:
        system = system._dense_mass_variant()
    system, formulation = cast_floating((system, formulation), dtype)
    counts, gap_shape = check_structure(system, times[0], *one)
    formulation, gain_checks, failure = formulation.checked(
        *counts, constraints_regular=system.constraints_are_regular
    )
    return system, formulation, times, counts, gap_shape, gain_checks, failure


def checked_times(call, t0, t1, dtype) -> tuple[Array, Array, Array | None]:
    """`t0`, `t1` and the call's `ts` as arrays of `dtype`, checked (real numbers:
    `check_real`, with the call's other numbers; [`check_times`][])."""
    check_real(t0=t0, t1=t1, ts=call.ts, dt0=call.dt0, rtol=call.rtol, atol=call.atol)
    t0, t1 = jnp.asarray(t0, dtype=dtype), jnp.asarray(t1, dtype=dtype)
    ts = None if call.ts is None else jnp.asarray(call.ts, dtype=dtype)
    check_times(t0, t1, ts)
    return t0, t1, ts


def check_structure(system, t0, q0, v0) -> tuple[tuple[int, int], tuple[int, ...]]:
    """Shapes of the model's outputs at `(t0, q0, v0)`: returns the constraint counts
    `(holonomic, nonholonomic)` and the shape of the system's gaps (cached per signature of
    the system and the state)."""
    if q0.shape != v0.shape:
        raise ValueError(
            f"`q0` and `v0` must have the same shape (n,); got {q0.shape} and {v0.shape}."
        )
    if q0.shape[0] == 0:
        raise ValueError(
            f"`q0` and `v0` are empty (shape {q0.shape}): a system needs at least "
            "one coordinate; pass one entry per generalized coordinate."
        )
    key = (signature(system), signature((t0, q0, v0)))
    structure = STRUCTURES.get(key)
    if structure is None:
        check_model_outputs(system, t0, q0, v0)
        terms = eqx.filter_eval_shape(system_terms, system, t0, q0, v0)
        n = q0.shape[0]
        if terms.mass_matrix.shape != (n, n):
            raise ValueError(
                f"The mass matrix has shape {terms.mass_matrix.shape} but `q0` has {n} "
                f"coordinates; `q0` and `v0` must have one entry per generalized coordinate."
            )
        if terms.forces.shape != (n,):
            raise ValueError(
                f"`generalized_forces` must return shape ({n},); got {terms.forces.shape}."
            )
        counts = (terms.phi.shape[0], terms.psi.shape[0])
        structure = STRUCTURES[key] = (counts, jax.eval_shape(system.gaps, t0, q0).shape)
    return structure


STRUCTURES: dict = {}  # constraint counts and gaps' shape per (system, state) signature

# The model functions a user writes, with the arguments they take and the shape of what
# they return (a `str`: a size of any value; "n" the number of coordinates).
_MODEL_FUNCTIONS = {
    "kinetic_energy": (3, ()),
    "mass_matrix": (2, ("n", "n")),
    "potential_energy": (2, ()),
    "generalized_forces": (3, ("n",)),
    "hamiltonian": (3, ()),
    "constraints": (2, ("m",)),
    "velocity_constraints": (3, ("k",)),
}

_TRACER_FIXES = (
    (
        jax.errors.TracerArrayConversionError,
        "converts a traced JAX array to a NumPy array (a `numpy` function such as `np.sin` "
        "called on `q`, or `np.asarray`): jaxdae traces the model functions to differentiate "
        "and compile them. Use `jax.numpy` (`jnp.sin`, ...) instead of `numpy` on values that "
        "depend on t, q or v",
    ),
    (
        jax.errors.ConcretizationTypeError,
        "asks for the concrete value of a traced array (a Python `if` or `while` on a value "
        "that depends on t, q or v, or `bool()`, `float()`, `int()` of it): jaxdae traces the "
        "model functions to differentiate and compile them. Use `jnp.where(cond, a, b)` or "
        "`jax.lax.cond` instead of a Python `if` on values",
    ),
    (
        jax.errors.TracerIntegerConversionError,
        "uses a traced array as a Python integer (an index or a `range`): jaxdae traces the "
        "model functions. Index with static integers, or use `jnp.take` / `jax.lax.dynamic_slice`",
    ),
)


def check_model_outputs(system, t0, q0, v0) -> None:
    """The first trace of each model function of `system` (one its class defines, among
    `_MODEL_FUNCTIONS`), by shapes only (`eqx.filter_eval_shape`): `TypeError` naming the
    function where JAX refuses to trace it (NumPy on a tracer, a Python `if` on a value),
    `ValueError` where it returns something other than an array of its shape (a Python
    number is a constant energy), complex values (their imaginary parts would be dropped),
    integers (which have no derivatives) or float16 values. Other exceptions of the
    function (the model's own, an index out of range) are left to the terms' trace."""
    if not isinstance(system, (LagrangianSystem, HamiltonianSystem)):
        return  # (jaxdae's multibody systems build their functions themselves)
    cls = type(system).__name__
    n = q0.shape[0]
    base = LagrangianSystem if isinstance(system, LagrangianSystem) else HamiltonianSystem
    for name, (arity, shape) in _MODEL_FUNCTIONS.items():
        if not model_defines(system, name, base):
            continue
        args = (t0, q0, v0)[:arity]
        try:
            out = eqx.filter_eval_shape(lambda s, a, name=name: getattr(s, name)(*a), system, args)
        except tuple(kind for kind, _ in _TRACER_FIXES) as error:
            fix = next(fix for kind, fix in _TRACER_FIXES if isinstance(error, kind))
            raise TypeError(f"`{name}` of {cls} {fix}. (JAX: {type(error).__name__}.)") from error
        except IndexError as error:
            raise ValueError(
                f"`{name}` of {cls} indexes beyond the state it was given ({error}): `q0` "
                f"and `v0` have shape {q0.shape}; they must have one entry per generalized "
                "coordinate of the model."
            ) from error
        except Exception:  # reported by the terms' trace, with its own message
            continue
        require_output(name, out, tuple(n if s == "n" else s for s in shape), cls)
        if not hasattr(out, "dtype"):
            continue  # a Python number: a constant
        dtype = np.dtype(out.dtype)
        problem = dtype_problem(dtype)
        if problem is None and not np.issubdtype(dtype, np.floating):
            problem = (
                f"must be floating: it is {dtype.name}, and integers have no "
                "derivatives. Return floats (write constants as `1.0`, or "
                "`jnp.asarray(x, float)`)"
            )
        if problem is not None:
            raise ValueError(f"The output of `{name}` of {cls} {problem}.")


def fixed_step_radius(
    formulation, num_constraints: int, solver, dt, num_nonholonomic: int = 0
) -> float | None:
    """`ρ(R(τH))` for a fixed step `τ = dt` of `solver` on the perturbations of
    `formulation` (Mukharlyamov (2019) §4), in NumPy, or None where it is not known cheaply and
    exactly: traced gains or step, no constraints, a formulation whose perturbations do not
    obey `ẏ = H y` exactly (`exact_perturbations` false: [`jaxdae.ModifiedLagrange`][]'s
    depend on the state), or a solver that is neither `diffrax.Euler` nor an explicit
    Runge–Kutta method.

    `R` is built from the Butcher tableau, `K_i = H (I + τ Σ_{j<i} a_ij K_j)`,
    `R = I + τ Σ_i b_i K_i` (explicit Euler: `I + τH`), as [`jaxdae.transition_matrix`][]
    computes it by stepping the solver, without compiling anything (`simulate` asks it
    before every fixed-step solve)."""
    if not (
        isinstance(formulation, AbstractStabilizedFormulation)
        and formulation.exact_perturbations
        and num_constraints
        and dt is not None
        and is_concrete(formulation, dt)
    ):
        return None
    if isinstance(solver, diffrax.Euler):
        a_lower, b = (), np.ones(1)
    elif isinstance(solver, diffrax.AbstractERK):
        a_lower, b = solver.tableau.a_lower, np.asarray(solver.tableau.b_sol)
    else:
        return None
    with jax.ensure_compile_time_eval():
        h = np.asarray(
            formulation.perturbation_matrix(num_constraints, num_nonholonomic), np.float64
        )
    tau, eye = float(dt), np.eye(h.shape[0])
    stages = [h]
    for row in a_lower:
        stages.append(h @ (eye + tau * sum(a * k for a, k in zip(row, stages, strict=False))))
    transition = eye + tau * sum(w * k for w, k in zip(b, stages, strict=False))
    return float(np.max(np.abs(np.linalg.eigvals(transition))))


def warn_unstable_step(formulation, counts: tuple[int, int], solver, dt0) -> None:
    """A `UserWarning` before a fixed-step solve whose step makes the constraint
    perturbations grow: `ρ(R(τH)) > 1` (Mukharlyamov (2019) §4; [`fixed_step_radius`][], known for
    formulations with exact perturbations and concrete gains and step). A warning, not an
    error: a short solve, or a study of the instability, may mean it; a solve whose
    residual then explodes ends with `RESULTS.diverged`."""
    radius = fixed_step_radius(formulation, counts[0], solver, dt0, counts[1])
    if radius is not None and radius > 1 + 1e-12:
        warnings.warn(
            f"The fixed step dt0 = {float(dt0):.4g} of {type(solver).__name__} makes the "
            f"constraint perturbations of {type(formulation).__name__} unstable: the "
            f"spectral radius of the step's transition R(τH) is {radius:.4g} > 1 "
            "(Mukharlyamov (2019) §4), so the residual grows by that factor per step. Reduce `dt0` "
            "(or the gains) until `jaxdae.spectral_radius(jaxdae.transition_matrix("
            "jaxdae.perturbation_matrix(formulation, m), solver, dt0))` < 1.",
            UserWarning,
            stacklevel=6,
        )


def check_times(t0, t1, ts):
    if t0.ndim != 0 or t1.ndim != 0:
        raise ValueError(f"`t0` and `t1` must be scalars; got shapes {t0.shape} and {t1.shape}.")
    if ts is not None and (ts.ndim != 1 or ts.shape[0] == 0):
        raise ValueError(f"`ts` must be a non-empty 1-D array of times; got shape {ts.shape}.")
    if is_concrete(t0, t1):
        if not (np.isfinite(float(t0)) and np.isfinite(float(t1))):
            raise ValueError(
                f"`t0` and `t1` must be finite times; got t0 = {t0}, t1 = {t1}. (An infinite "
                "`t1` would step until `max_steps`.)"
            )
        if not float(t1) > float(t0):
            raise ValueError(f"`t1` must be greater than `t0`; got t0 = {t0}, t1 = {t1}.")
    if ts is not None and is_concrete(ts, t0, t1):
        ts_np = np.asarray(ts)
        if not np.all(np.isfinite(ts_np)):
            raise ValueError(f"`ts` must hold finite times; got {ts_np}.")
        if np.any(np.diff(ts_np) < 0):
            raise ValueError(
                "`ts` must be sorted in increasing order; sort it (e.g. `jnp.sort(ts)`)."
            )
        if ts_np[0] < float(t0) or ts_np[-1] > float(t1):
            raise ValueError(
                f"`ts` must lie in [t0, t1] = [{float(t0)}, {float(t1)}]; got "
                f"[{ts_np[0]}, {ts_np[-1]}]."
            )


def _span_problem(t0, t1):
    return ~(t1 > t0) | ~jnp.isfinite(t1 - t0)


def _ts_problem(t0, t1, ts):
    return jnp.any(jnp.diff(ts) < 0) | (ts[0] < t0) | (ts[-1] > t1) | ~jnp.all(jnp.isfinite(ts))


def _step_problem(dt0):
    return ~jnp.isfinite(dt0) | ~(dt0 > 0)


def traced_input_checks(times, dt0, controller) -> tuple[tuple[Bool[Array, ""] | bool, str], ...]:
    """`(flag, message)` checks of a traced solve's times, first step `dt0` and default
    controller's tolerances, the flag true where the message applies (`check_traced`
    reports them; [`solvable_inputs`][] keeps them from diffrax's own checks)."""
    t0, t1, ts = times.t0, times.t1, times.ts
    checks = [
        (_span_problem(t0, t1), "`t0` and `t1` must be finite, with `t1` greater than `t0`."),
        (
            False if ts is None else _ts_problem(t0, t1, ts),
            "`ts` must be finite, sorted and lie in [t0, t1].",
        ),
    ]
    if dt0 is not None:
        checks.append((_step_problem(dt0), "`dt0` must be a positive finite step."))
    if isinstance(controller, diffrax.PIDController):
        checks.append(
            (
                tolerance_problem(controller.rtol, controller.atol),
                f"`rtol` and `atol` must be {TOLERANCE_RULE}.",
            )
        )
    return tuple(checks)


def solvable_inputs(times, dt0, controller):
    """`(times, dt0, controller)` with what `traced_input_checks` flags replaced by
    values that diffrax accepts: `t0, t1 = 0, 1`, evenly spaced `ts`, a hundredth of the
    span as the first step, loose tolerances. diffrax checks its times and step itself,
    with an error that `throw=False` cannot turn into `RESULTS.invalid_input` and that
    does not say which input is wrong; the solve then runs on these, and its result is
    reported as invalid (or raises with jaxdae's message). Concrete values were checked
    eagerly and are kept."""
    t0, t1, ts = times.t0, times.t1, times.ts
    if not is_concrete(t0, t1):
        span = _span_problem(t0, t1)
        t0, t1 = jnp.where(span, 0, t0), jnp.where(span, 1, t1)
    if ts is not None and not is_concrete(ts, times.t0, times.t1):
        bad = _span_problem(times.t0, times.t1) | _ts_problem(times.t0, times.t1, ts)
        ts = jnp.where(bad, jnp.linspace(t0, t1, ts.shape[0], dtype=ts.dtype), ts)
    if dt0 is not None and not is_concrete(dt0, t0, t1):
        dt0 = jnp.where(_step_problem(dt0), (t1 - t0) / 100, dt0).astype(dt0.dtype)
    if isinstance(controller, diffrax.PIDController) and not is_concrete(
        controller.rtol, controller.atol
    ):
        bad = tolerance_problem(controller.rtol, controller.atol)
        controller = eqx.tree_at(
            lambda c: (c.rtol, c.atol),
            controller,
            (jnp.where(bad, 1e-3, controller.rtol), jnp.where(bad, 1e-6, controller.atol)),
        )
    return (
        eqx.tree_at(lambda x: (x.t0, x.t1, x.ts), times, (t0, t1, ts), is_leaf=lambda x: x is None),
        dt0,
        controller,
    )
