"""The abstract formulations: what every formulation provides, and the bases of the exact-multiplier
and the stabilized formulations."""

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Array, Bool, Float, Gain
from .._gains import (
    apply_gain,
    as_gain,
    check_gain_size,
    check_gain_structure,
    gain_matrix,
    is_concrete,
    require_positive_definite,
)
from .._solution import RESULTS
from .._systems._system import ConstrainedTerms
from ._multipliers import (
    PivotRange,
    default_rcond,
    eliminate,
    extreme_pivots,
    pivot_range,
    recording_pivots,
)


class AbstractFormulation(eqx.Module):
    """Turns the constrained equations of motion into an ODE `q̈ = a(t, q, v)`.

    A formulation decides how the multipliers are computed (exact Lagrange multipliers,
    a pseudo-inverse, a penalty) and how constraint violations are fed back
    (Baumgarte-type gains). Gains are array fields, so `eqx.filter_grad` reaches them.

    What a formulation can do is declared by its bases and class variables, never probed:
    [`jaxdae.AbstractStabilizedFormulation`][] for a target and a perturbation matrix,
    [`jaxdae.AbstractExactMultipliers`][] for a failure test on `G M⁻¹ Gᵀ`, and
    `derives_velocities` below.
    """

    derives_velocities: ClassVar[bool] = False
    """Whether `velocities` maps the state to other velocities than the state itself (True
    for [`jaxdae.RedundantCoordinates`][], whose dependent velocities follow from the
    independent ones); solvers that integrate positions and velocities themselves refuse
    such a formulation."""

    @abc.abstractmethod
    def accelerations(
        self, terms: ConstrainedTerms
    ) -> tuple[Float[Array, " n"], Float[Array, " c"]]:
        """Returns `(q̈, multipliers)` with `M q̈ = Q − Gᵀ multipliers`."""

    @abc.abstractmethod
    def validate(self, num_holonomic: int, num_nonholonomic: int) -> "AbstractFormulation":
        """Checks the gains against the system's constraint counts and values.

        Shapes raise `ValueError`, and so do concrete values; traced values are checked by
        `traced_checks`. Returns the formulation.
        """

    def traced_checks(
        self, num_holonomic: int, num_nonholonomic: int
    ) -> tuple[tuple[Bool[Array, ""], str], ...]:
        """The checks of traced gain values (under `jit`, `vmap`, `grad`) as `(flag,
        message)` pairs, the flag true where the message applies: `simulate` attaches them
        with its own checks as one `eqx.branched_error_if`, other callers with
        `attach_checks`. Default: none."""
        return ()

    def check_values(self) -> None:
        """Eager checks of concrete gain values (`ValueError`); called by `simulate`."""

    # Whether `failure` tests for a singular `G M⁻¹ Gᵀ` and nothing else: a system whose
    # constraints are regular (`AbstractSystem.constraints_are_regular`) never reaches it.
    tests_constraint_rank: ClassVar[bool] = False

    def checked(
        self, num_holonomic: int, num_nonholonomic: int, constraints_regular: bool = False
    ) -> tuple["AbstractFormulation", tuple[tuple[Bool[Array, ""], str], ...], RESULTS | None]:
        """The formulation's checks against a system's constraint counts, as a solve makes
        them, in one call: `validate`, `check_values` where the gains are concrete, and
        `traced_checks`. Returns the validated formulation, its traced checks, and the
        result that its failure test reports when it stops the solve (`failure_result`),
        or None where it cannot fail with these counts (`fails_with`), or where it tests
        the rank of the constraints only (`tests_constraint_rank`) and the system declares
        them regular (`constraints_regular`). Not overridden: a formulation overrides the
        checks it calls."""
        formulation = self.validate(num_holonomic, num_nonholonomic)
        traced = tuple(formulation.traced_checks(num_holonomic, num_nonholonomic))
        if is_concrete(formulation):
            formulation.check_values()
        fails = formulation.fails_with(num_holonomic, num_nonholonomic) and not (
            constraints_regular and formulation.tests_constraint_rank
        )
        return formulation, traced, formulation.failure_result if fails else None

    def failure(self, terms: ConstrainedTerms, reference) -> Bool[Array, ""] | Float[Array, ""]:
        """True where the formulation cannot continue (checked at the end of every step).

        `reference` is `failure_reference` at the initial state. May instead return a real
        value: the solve then stops where it changes sign between two steps (a diffrax
        `Event` condition), which also catches a singular configuration stepped over
        between step ends.
        """
        return jnp.array(False)

    def failure_reference(self, terms: ConstrainedTerms):
        """What `failure` compares with, evaluated once at the initial state (a scale that
        makes its test relative). Default: `None`."""
        return None

    # Whether `accelerations_and_failure` reads the failure test, a flag, from what the
    # accelerations compute: a solve with a first-same-as-last solver then evaluates it with
    # the rates of each step's last stage, for little more than the rates.
    shares_failure_with_accelerations: ClassVar[bool] = False

    def accelerations_and_failure(self, terms: ConstrainedTerms, reference):
        """`(accelerations(terms), failure(terms, reference))`. Default: each on its own; a
        formulation whose test reads what its accelerations compute overrides it (and
        declares `shares_failure_with_accelerations`)."""
        return self.accelerations(terms), self.failure(terms, reference)

    @property
    def can_fail(self) -> bool:
        """Whether the formulation has a `failure` test at all."""
        return False

    def fails_with(self, num_holonomic: int, num_nonholonomic: int) -> bool:
        """Whether `failure` needs checking during the solve of a system with these
        constraint counts: a test that cannot turn true for them is left out of the solve
        (it would be traced for nothing). Default: `can_fail`."""
        return self.can_fail

    @property
    def failure_result(self) -> RESULTS:
        """The [`jaxdae.RESULTS`][] item reported when `failure` stops the solve."""
        return RESULTS.singular_constraint_matrix

    def residual_allowance(self, terms: ConstrainedTerms) -> Float[Array, ""]:
        """The constraint residual `max(|Φ|, |Ψ|)` that this formulation leaves by design at
        the state of `terms`, beyond the integration error: `simulate` reports
        `RESULTS.constraint_tol_exceeded` for a solve that ends further from its constraints
        than its tolerances and this allow. Default 0 (the constraints are enforced
        exactly by the equations integrated); `inf` for a formulation that promises no bound
        ([`jaxdae.Unstabilized`][])."""
        return jnp.zeros((), terms.forces.dtype)

    def for_projection(self) -> "AbstractFormulation":
        """The formulation whose equations [`jaxdae.Projected`][] integrates between its
        projections. Default: this one ([`jaxdae.ModifiedLagrange`][] adds augmented
        Lagrangian iterations, which bring its flow closer to the manifold's)."""
        return self

    def velocities(self, system, t, q: Float[Array, " n"], v: Float[Array, " n"]):
        """The velocities `q̇` the formulation implies at the state `(q, v)`.

        Default: `v` itself. A formulation that integrates fewer velocities (e.g.
        [`jaxdae.RedundantCoordinates`][], whose dependent velocities follow from the
        independent ones) overrides it; `simulate` integrates `q̇` = this and reports it.
        """
        return v

    @property
    def state_messages(self) -> tuple[tuple[str, str], ...]:
        """`(message, name of the value it quotes)` for each flag of `state_problems`."""
        return ()

    def state_problems(
        self, system, t0, q0: Float[Array, " n"], v0: Float[Array, " n"]
    ) -> tuple[Bool[Array, " k"], Float[Array, " k"]]:
        """What is wrong with the initial state for this formulation: `(flags, values)`,
        with `flags[i]` true where `state_messages[i]` applies and `values[i]` the value it
        quotes. Array code only: `simulate` evaluates it eagerly (a `ValueError`), traced
        (with its other input checks) and row by row for ensembles. Default: nothing.
        """
        return jnp.zeros(0, bool), jnp.zeros(0, jnp.result_type(q0))


class AbstractExactMultipliers(AbstractFormulation):
    """Formulations whose multipliers solve `(G M⁻¹ Gᵀ) λ = G M⁻¹ Q − s` exactly
    (Mukharlyamov and Deressa (2015), eq. [21]): they cannot continue where `G M⁻¹ Gᵀ` is singular,
    so the solve stops with `RESULTS.singular_constraint_matrix` when its smallest *pivot* falls
    below `rcond` (default `sqrt(eps)` of the state's dtype) times the larger of its largest pivot
    now and at the initial state. The second makes the test relative also where the whole matrix
    vanishes, e.g. a single constraint whose gradient vanishes (`G M⁻¹ Gᵀ` is 1 × 1, so its
    own condition number is always 1).

    The pivots are the eigenvalues for one or two constraints (closed forms) and, for more,
    the diagonal of `D` in the factorization `G M⁻¹ Gᵀ = L D Lᵀ` (the squared diagonal of its
    Cholesky factor), the factorization the multipliers are solved with anyway: each lies
    between the smallest and the largest eigenvalue, and one of them vanishes where the
    matrix turns singular (a non-positive or non-finite pivot also counts as failed). This
    costs a Cholesky factorization per step instead of an eigenvalue decomposition.
    """

    rcond: eqx.AbstractVar[float | None]
    tests_constraint_rank: ClassVar[bool] = True

    def failure_reference(self, terms):
        """The largest pivot of `G M⁻¹ Gᵀ` at the initial state."""
        elimination = eliminate(terms)
        return extreme_pivots(elimination)[1] if elimination.matrix.shape[0] else None

    shares_failure_with_accelerations: ClassVar[bool] = True

    def failure(self, terms, initial_largest):
        elimination = eliminate(terms)
        if elimination.matrix.shape[0] == 0:
            return jnp.array(False)
        return self._fails_at(
            pivot_range(elimination), elimination.matrix.shape[0], initial_largest
        )

    def accelerations_and_failure(self, terms, initial_largest):
        """The accelerations, and the failure test on the pivots of the factorization that
        they solved the multipliers with, where they call [`jaxdae.multiplier_solve`][]
        once on `terms` with its default solver (which then records the pivots); else the
        test on its own."""
        with recording_pivots() as record:
            accelerations = self.accelerations(terms)
        size = terms.jacobian.shape[0]
        if size == 0 or len(record) != 1 or record[0][0] is not terms:
            return accelerations, self.failure(terms, initial_largest)
        return accelerations, self._fails_at(record[0][1], size, initial_largest)

    def _fails_at(self, pivots: PivotRange, size: int, initial_largest):
        """The test on the `pivots` of `G M⁻¹ Gᵀ` of `size` rows."""
        tol = default_rcond(self.rcond, pivots.smallest.dtype)
        if size <= 2:
            return pivots.smallest <= tol * jnp.maximum(pivots.largest, initial_largest)
        # A pivot that is not positive (nan from the factorization) counts as failed; a
        # matrix that is not finite is the non-finite check's to report.
        return pivots.finite & ~(
            pivots.smallest > tol * jnp.maximum(pivots.largest, initial_largest)
        )

    @property
    def can_fail(self):
        return True

    def fails_with(self, num_holonomic, num_nonholonomic):
        """Only with constraints: without, `G M⁻¹ Gᵀ` is empty and nothing can fail."""
        return num_holonomic + num_nonholonomic > 0

    @property
    def tests_target_range(self) -> bool:
        """Whether `simulate` tests at the end that the target lies in the range of `G`.

        Not at the default `rcond`: constraints that contradict each other make `G M⁻¹ Gᵀ`
        singular, which the failure test reports at the start, so a solve that succeeded has
        a `G` of full rank, whose range holds every target; the test would only add compile
        time (docs/design_measurements.md#range-test).
        """
        return self.rcond is not None


class AbstractIndependentVelocities(AbstractFormulation):
    """A formulation whose velocities are the independent ones of the state, the dependent
    ones following from the holonomic constraints (`velocities`), so that `Φ̇ = 0` holds by
    construction, as in [`jaxdae.RedundantCoordinates`][] (Krasinskaya and Krasinskiy (2013),
    eq. [5]).

    The base declares what the rest of jaxdae reads from it: [`jaxdae.Projected`][]
    projects such a state in its positions only, and [`jaxdae.linearize`][] takes the
    positions and the `independent` velocities as the state and expects one zero root per
    holonomic constraint (the positions off the constraint manifold). A formulation that
    derives its velocities in another way declares `derives_velocities` without this base.
    """

    derives_velocities: ClassVar[bool] = True

    @abc.abstractmethod
    def independent(self, n: int) -> tuple[int, ...]:
        """The indices of the independent coordinates among `n`, whose velocities the
        state holds."""


class AbstractStabilizedFormulation(AbstractFormulation):
    """A formulation that drives the constraint accelerations to a target `G q̈ = s` that
    feeds the violations back, so that the perturbations `y = (Φ, Φ̇, Ψ)` obey a linear ODE
    `ẏ = H y` (Mukharlyamov (2019), eqs. [0.11]–[0.12]).

    Subclasses provide `target` and `perturbation_matrix`; [`jaxdae.perturbation_matrix`][],
    [`jaxdae.DiscreteStability`][] and the end-of-solve checks of [`jaxdae.simulate`][] read
    them. `exact_perturbations` says whether the perturbations obey `ẏ = H y` exactly (exact
    multipliers) or only in a limit (a penalty).
    """

    exact_perturbations: ClassVar[bool] = True

    @abc.abstractmethod
    def target(self, terms: ConstrainedTerms) -> Float[Array, " c"]:
        """The right-hand side `s` of `G q̈ = s`, shape `(m + k,)`."""

    @abc.abstractmethod
    def perturbation_matrix(
        self,
        num_holonomic: int,
        num_nonholonomic: int = 0,
        constraint_matrix: Float[Array, "c c"] | None = None,
    ) -> Float[Array, "d d"]:
        """`H` of `d/dt (Φ, Φ̇, Ψ) = H (Φ, Φ̇, Ψ)`, shape `(2m + k, 2m + k)`.

        `constraint_matrix` is `W = G M⁻¹ Gᵀ` at a state of interest, for formulations
        whose perturbations depend on it (a penalty); the others ignore it.
        """

    @property
    def tests_target_range(self) -> bool:
        """Whether `simulate` tests at the end of a solve that the target lies in the range
        of `G` (contradicting constraints have no solution, whatever the multipliers)."""
        return True


class AbstractBaumgarteFormulation(AbstractStabilizedFormulation):
    """A stabilized formulation with generalized Baumgarte feedback:
    `Φ̈ + K_D Φ̇ + K_P Φ = 0` and `Ψ̇ + K_V Ψ = 0` (Mukharlyamov and Deressa (2015),
    eq. [16]; Mukharlyamov (2019), eq. [0.7]).

    Subclasses declare the gains as fields `kd`, `kp`, `kv` and name in `gain_names` the
    gain fields that must be symmetric positive definite (`gain_condition` says why, in the
    error message). The base class checks them at construction, against the system's
    constraint counts (`validate`) and under `jit` (`traced_checks`), and provides the
    target and the perturbation matrix.
    """

    kd: eqx.AbstractVar[Gain]
    kp: eqx.AbstractVar[Gain]
    kv: eqx.AbstractVar[Gain]
    gain_names: eqx.AbstractClassVar[tuple[str, ...]]
    gain_condition: eqx.AbstractClassVar[str]

    def __check_init__(self):
        check_gain_values(self, self.gain_names, self.gain_condition)

    def check_values(self):
        check_gain_values(self, self.gain_names, self.gain_condition)

    def validate(self, num_holonomic, num_nonholonomic):
        return check_stabilization_gains(
            self, self.gain_names, num_holonomic, num_nonholonomic, self.gain_condition
        )

    def traced_checks(self, num_holonomic, num_nonholonomic):
        return stabilization_checks(self, self.gain_names, self.gain_condition)

    def target(self, terms):
        return baumgarte_target(terms, self.kd, self.kp, self.kv)

    def perturbation_matrix(self, num_holonomic, num_nonholonomic=0, constraint_matrix=None):
        """`H = [[0, I, 0], [−K_P, −K_D, 0], [0, 0, −K_V]]` (Mukharlyamov (2019),
        eq. [0.11]; the last row and column only with nonholonomic constraints)."""
        m, k = num_holonomic, num_nonholonomic
        dtype = jnp.result_type(self.kd, self.kp, self.kv)
        kp, kd = (gain_matrix(jnp.asarray(g), m, dtype) for g in (self.kp, self.kd))
        holonomic = second_order_matrix(kp, kd)
        if k == 0:
            return holonomic
        kv = gain_matrix(jnp.asarray(self.kv), k, dtype)
        return jnp.block(
            [[holonomic, jnp.zeros((2 * m, k), dtype)], [jnp.zeros((k, 2 * m), dtype), -kv]]
        )


def default_kv(kd: Gain) -> Gain:
    """Default nonholonomic gain: the decay rate `k` of a critically damped `K_D = 2k`."""
    if kd.ndim == 2:
        return 0.5 * jnp.mean(jnp.diag(kd))
    return 0.5 * jnp.mean(kd)


def stabilization_gains(kd, kp, kv):
    """Converts `(kd, kp, kv)` to arrays, filling in the default `kv`."""
    kd, kp = as_gain(kd), as_gain(kp)
    return kd, kp, default_kv(kd) if kv is None else as_gain(kv)


def check_gain_values(formulation, names, reason) -> None:
    """Construction-time checks: structure always, values when concrete."""
    for name in names:
        gain = getattr(formulation, name)
        check_gain_structure(name, gain)
        if is_concrete(gain):
            require_positive_definite(name, gain, reason)


def check_stabilization_gains(formulation, names, num_holonomic, num_nonholonomic, reason):
    """Shape checks of `kd`, `kp`, `kv`, ... against the constraint counts, and SPD checks of
    the concrete ones (`ValueError`); traced ones: `stabilization_checks`. Returns
    `formulation`."""
    sizes = {"kd": num_holonomic, "kp": num_holonomic, "kv": num_nonholonomic}
    what = {
        "kd": "holonomic constraints",
        "kp": "holonomic constraints",
        "kv": "nonholonomic constraints",
    }
    for name in names:
        gain = getattr(formulation, name)
        size = sizes.get(name, num_holonomic + num_nonholonomic)
        check_gain_size(name, gain, size, what.get(name, "constraints (holonomic + nonholonomic)"))
        if is_concrete(gain):
            require_positive_definite(name, gain, reason)
    return formulation


def stabilization_checks(formulation, names, reason) -> tuple:
    """The `(flag, message)` checks that the traced gains `names` are SPD (the
    formulation's `traced_checks`)."""
    return sum(
        (require_positive_definite(name, getattr(formulation, name), reason) for name in names), ()
    )


def check_rcond(rcond: float | None) -> None:
    if rcond is not None and not 0 <= rcond < 1:
        raise ValueError(f"`rcond` must be in [0, 1) or None (default sqrt(eps)); got {rcond}.")


def baumgarte_target(terms: ConstrainedTerms, kd, kp, kv) -> Float[Array, " c"]:
    """Right-hand side `s` of `G q̈ = s` that enforces Mukharlyamov and Deressa (2015) eq. [16] and
    Mukharlyamov (2019) eq. [0.7].

    `Φ̈ + K_D Φ̇ + K_P Φ = 0` and `Ψ̇ + K_V Ψ = 0` with `Φ̈ = J q̈ − γ`, `Ψ̇ = A q̈ − bias_Ψ`, so
    `s = bias + [−K_D Φ̇ − K_P Φ; −K_V Ψ]` (Mukharlyamov and Deressa (2015) eq. [20]).
    """
    feedback = jnp.concatenate(
        [
            -apply_gain(kd, terms.dphi) - apply_gain(kp, terms.phi),
            -apply_gain(kv, terms.psi),
        ]
    )
    return terms.bias + feedback


def second_order_matrix(
    stiffness: Float[Array, "m m"], damping: Float[Array, "m m"]
) -> Float[Array, "2*m 2*m"]:
    """`H = [[0, I], [−K_P, −K_D]]` of `d/dt (Φ, Φ̇) = H (Φ, Φ̇)` (Mukharlyamov (2019), eq.
    [0.11])."""
    m = stiffness.shape[0]
    eye = jnp.eye(m, dtype=stiffness.dtype)
    return jnp.block([[jnp.zeros_like(eye), eye], [-stiffness, -damping]])
