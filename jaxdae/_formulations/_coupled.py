"""The general linear constraint-perturbation equation (Mukharlyamov (2019), eqs. [0.11]–[0.12])."""

import jax
import jax.numpy as jnp
import numpy as np

from .._compilation._linear_solvers import StructuredCholesky
from .._compilation._stability import not_hurwitz
from .._custom_types import Array, Float
from .._gains import apply_gain, as_gain, gain_matrix, is_concrete, uncoupled_companions
from .._systems._system import ConstrainedTerms
from ._arguments import explain_arguments
from ._base import AbstractExactMultipliers, AbstractStabilizedFormulation
from ._multipliers import multiplier_solve

_EXAMPLE = "CoupledPerturbation(k10=-25.0, k11=-10.0, k22=-5.0)"
_BLOCKS = ("k10", "k11", "k12", "k20", "k21", "k22")
# (rows, columns) of each block: "m" holonomic, "k" nonholonomic constraints.
_SHAPES = {"k10": "mm", "k11": "mm", "k12": "mk", "k20": "km", "k21": "km", "k22": "kk"}


def _block(gain, rows: int, cols: int, dtype):
    if gain is None:
        return jnp.zeros((rows, cols), dtype)
    if rows == cols:
        return gain_matrix(gain, rows, dtype)
    return jnp.broadcast_to(gain.astype(dtype), (rows, cols))


class CoupledPerturbation(AbstractExactMultipliers, AbstractStabilizedFormulation):
    """Constraint perturbations with arbitrary linear coupling (Mukharlyamov (2019), eqs.
    [0.11]–[0.12]).

    The exact multipliers are chosen so that the perturbations `y = (Φ, Φ̇, Ψ)` obey

    ```
    d/dt (Φ, Φ̇, Ψ) = [[0, I, 0], [K10, K11, K12], [K20, K21, K22]] (Φ, Φ̇, Ψ),
    ```

    i.e. `Φ̈ = K10 Φ + K11 Φ̇ + K12 Ψ` and `Ψ̇ = K20 Φ + K21 Φ̇ + K22 Ψ` (signs as written: a
    stable choice has negative `K10`, `K11`, `K22`). Off-diagonal blocks couple or weight the
    deviations. [`jaxdae.Baumgarte`]`(kd, kp, kv)` is the special case `K10 = −K_P`,
    `K11 = −K_D`, `K22 = −K_V`, other blocks zero; Shemelova's (2016) `ÿ = c1 y + c2 ẏ` is
    `K10 = c1`, `K11 = c2`. As for Baumgarte, the solve stops with
    `RESULTS.singular_constraint_matrix` where `G M⁻¹ Gᵀ` is singular.

    **Arguments:**

    - `k10`, `k11`: `(m, m)` blocks acting on `Φ`, `Φ̇` in `Φ̈` (scalars and vectors mean
        `k I` and `diag(k)`). Required when the system has holonomic constraints.
    - `k22`: `(k, k)` block acting on `Ψ` in `Ψ̇` (same forms). Required when the system
        has nonholonomic constraints.
    - `k12` `(m, k)`, `k20` `(k, m)`, `k21` `(k, m)`: coupling blocks; `None` (default) is 0.
    - `rcond`: as for [`jaxdae.Baumgarte`][].

    **Raises:**

    `ValueError` if the blocks' shapes do not fit together or the system, a block needed by
    the system is missing, or the block matrix is not Hurwitz (an eigenvalue with
    non-negative real part: the perturbations would not decay). The Hurwitz check runs
    eagerly for concrete blocks and through `eqx.error_if` for traced ones: constraint by
    constraint where the coupling blocks are absent and the others scalars or vectors (so it
    costs `O(m + k)` for any number of constraints), else on the whole matrix (Lyapunov's
    equation up to 24 rows, the eigenvalues on the host beyond).
    """

    k10: Float[Array, "..."] | None = None
    k11: Float[Array, "..."] | None = None
    k12: Float[Array, "..."] | None = None
    k20: Float[Array, "..."] | None = None
    k21: Float[Array, "..."] | None = None
    k22: Float[Array, "..."] | None = None
    rcond: float | None = None

    @explain_arguments(_EXAMPLE)
    def __init__(self, k10=None, k11=None, k12=None, k20=None, k21=None, k22=None, rcond=None):
        self.k10, self.k11, self.k12, self.k20, self.k21, self.k22 = (
            None if g is None else as_gain(g) for g in (k10, k11, k12, k20, k21, k22)
        )
        self.rcond = rcond

    def __check_init__(self):
        self._sizes()
        if is_concrete(self):
            self.check_values()

    def _sizes(self) -> tuple[int | None, int | None]:
        """`(m, k)` implied by the non-scalar blocks (None where no block says)."""
        sizes: dict[str, set[int]] = {"m": set(), "k": set()}
        for name in _BLOCKS:
            gain = getattr(self, name)
            if gain is None:
                continue
            rows, cols = _SHAPES[name]
            if rows != cols and gain.ndim not in (0, 2):
                raise ValueError(
                    f"`{name}` couples different constraint kinds: pass a matrix of shape "
                    f"({rows}, {cols}) (or a scalar for a constant block); got shape {gain.shape}."
                )
            if rows == cols and (
                gain.ndim > 2 or (gain.ndim == 2 and gain.shape[0] != gain.shape[1])
            ):
                raise ValueError(
                    f"`{name}` must be a scalar, a vector or a square matrix; got shape "
                    f"{gain.shape}."
                )
            if gain.ndim >= 1:
                sizes[rows].add(gain.shape[0])
                sizes[cols].add(gain.shape[-1])
        for kind, found in sizes.items():
            if len(found) > 1:
                what = "holonomic (m)" if kind == "m" else "nonholonomic (k)"
                raise ValueError(
                    f"The blocks disagree on the number of {what} constraints: sizes "
                    f"{sorted(found)}."
                )
        return tuple(next(iter(sizes[x])) if sizes[x] else None for x in ("m", "k"))

    def perturbation_matrix(self, num_holonomic, num_nonholonomic=0, constraint_matrix=None):
        """The `(2m + k) × (2m + k)` block matrix of Mukharlyamov (2019), eq. [0.12]."""
        return self._matrix(num_holonomic, num_nonholonomic)

    def _matrix(self, num_holonomic: int, num_nonholonomic: int, dtype=None):
        m, k = num_holonomic, num_nonholonomic
        if dtype is None:
            dtype = jnp.result_type(*[g for g in self._gains() if g is not None], float)
        b = {
            name: _block(getattr(self, name), *(dict(m=m, k=k)[x] for x in _SHAPES[name]), dtype)
            for name in _BLOCKS
        }
        zero = lambda r, c: jnp.zeros((r, c), dtype)  # noqa: E731
        return jnp.block(
            [
                [zero(m, m), jnp.eye(m, dtype=dtype), zero(m, k)],
                [b["k10"], b["k11"], b["k12"]],
                [b["k20"], b["k21"], b["k22"]],
            ]
        )

    def _gains(self):
        return [getattr(self, name) for name in _BLOCKS]

    def _effective_sizes(self):
        m, k = self._sizes()
        has_m = self.k10 is not None or self.k11 is not None or self.k12 is not None
        has_k = self.k22 is not None or self.k20 is not None or self.k21 is not None
        return (m if m is not None else int(has_m)), (k if k is not None else int(has_k))

    def check_values(self):
        """Eager Hurwitz check with the sizes the blocks imply (scalar blocks: size 1)."""
        if not is_concrete(self):
            return
        m, k = self._effective_sizes()
        self._check_missing(m, k, system=False)
        # Evaluated now even inside a `jit` trace (a concrete formulation closed over).
        with jax.ensure_compile_time_eval():
            matrix = np.asarray(self.perturbation_matrix(m, k))
        if bool(not_hurwitz(matrix, np)):
            eig = np.linalg.eigvals(matrix) if np.all(np.isfinite(matrix)) else "non-finite"
            raise ValueError(
                "The perturbation matrix [[0, I, 0], [K10, K11, K12], [K20, K21, K22]] is not "
                f"Hurwitz (eigenvalues {eig}): the constraint perturbations would not decay "
                "(Mukharlyamov (2019), eq. [0.12]). Choose blocks whose matrix has all eigenvalues "
                "with negative real part, e.g. K10 = −k², K11 = −2k, K22 = −k."
            )

    def validate(self, num_holonomic, num_nonholonomic):
        m, k = num_holonomic, num_nonholonomic
        bm, bk = self._sizes()
        for kind, given, actual in (("holonomic", bm, m), ("nonholonomic", bk, k)):
            if given is not None and given != actual:
                raise ValueError(
                    f"The blocks are sized for {given} {kind} constraints but the system has "
                    f"{actual}."
                )
        self._check_missing(m, k, system=True)
        return self

    def _check_missing(self, m: int, k: int, system: bool) -> None:
        """`ValueError` naming the blocks needed for `m` holonomic and `k` nonholonomic
        constraints (the `system`'s, else those the blocks given act on) that are not
        given: `k10` and `k11` (without either, `Φ` or `Φ̇` has no restoring term and the
        matrix is not Hurwitz), `k22`."""
        missing = [n for n in ("k10", "k11") if m > 0 and getattr(self, n) is None]
        missing += ["k22"] if k > 0 and self.k22 is None else []
        if missing:
            counts = [f"{m} holonomic"] if m else []
            counts += [f"{k} nonholonomic"] if k else []
            whose = (
                f"The system has {' and '.join(counts)} constraint{'s' if m + k > 1 else ''}"
                if system
                else f"The blocks given act on {' and '.join(c.split()[1] for c in counts)} "
                "constraints"
            )
            raise ValueError(
                f"{whose}: "
                f"pass {' and '.join(f'`{n}`' for n in missing)} to `CoupledPerturbation` "
                "(Φ̈ = K10 Φ + K11 Φ̇ + ..., Ψ̇ = K22 Ψ + ...), e.g. "
                f"`{_EXAMPLE}` (critically damped, rate 5)."
            )

    def traced_checks(self, num_holonomic, num_nonholonomic):
        if is_concrete(self):
            return ()
        m, k = num_holonomic, num_nonholonomic
        dtype = jnp.result_type(*[g for g in self._gains() if g is not None], float)
        message = (
            "The perturbation matrix of `CoupledPerturbation` is not Hurwitz: the "
            "constraint perturbations would not decay (Mukharlyamov (2019), eq. [0.12])."
        )
        # Uncoupled scalar or diagonal blocks: Hurwitz iff each constraint's block is, the
        # companion `[[0, 1], [k10_i, k11_i]]` of `f̈ − k11_i ḟ − k10_i f` and `k22_j`.
        holonomic = None
        if (
            self.k12 is None
            and self.k20 is None
            and self.k21 is None
            and (self.k22 is None or self.k22.ndim <= 1)
        ):
            holonomic = uncoupled_companions(
                [-(jnp.zeros((), dtype) if g is None else g) for g in (self.k10, self.k11)],
                m,
                dtype,
            )
        if holonomic is None:
            matrix = self._matrix(m, k, dtype)
            return ((not_hurwitz(jax.lax.stop_gradient(matrix), jnp), message),)
        k22 = jnp.zeros((k,), dtype) if self.k22 is None else self.k22
        nonholonomic = jnp.broadcast_to(k22, (k,))[:, None, None]
        flag = not_hurwitz(jax.lax.stop_gradient(holonomic), jnp) | not_hurwitz(
            jax.lax.stop_gradient(nonholonomic), jnp
        )
        return ((flag, message),)

    def target(self, terms: ConstrainedTerms):
        m, k = terms.num_holonomic, terms.num_nonholonomic
        dtype = terms.mass_matrix.dtype
        sizes = {"m": m, "k": k}

        def times(name, x):  # K x, without forming a scalar or diagonal K
            gain = getattr(self, name)
            rows, cols = _SHAPES[name]
            if gain is None:
                return jnp.zeros((sizes[rows],), dtype)
            if rows == cols:
                return jnp.broadcast_to(apply_gain(gain, x), (sizes[rows],))
            return _block(gain, sizes[rows], sizes[cols], dtype) @ x

        phi, dphi, psi = terms.phi, terms.dphi, terms.psi
        # G q̈ − bias = (Φ̈, Ψ̇) = (K10 Φ + K11 Φ̇ + K12 Ψ, K20 Φ + K21 Φ̇ + K22 Ψ)
        rates = jnp.concatenate(
            [
                times("k10", phi) + times("k11", dphi) + times("k12", psi),
                times("k20", phi) + times("k21", dphi) + times("k22", psi),
            ]
        )
        return terms.bias + rates

    def accelerations(self, terms: ConstrainedTerms):
        return multiplier_solve(terms, self.target(terms), StructuredCholesky())
