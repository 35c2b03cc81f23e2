"""Small systems used only by the tests."""

import diffrax
import equinox as eqx
import jax.numpy as jnp

import jaxdae
from jaxdae.examples import CartesianPendulum


class DoublePendulum(jaxdae.LagrangianSystem):
    """Two unit point masses in Cartesian coordinates, two length constraints (m = 2)."""

    length: jnp.ndarray

    def __init__(self, length=1.0):
        self.length = jnp.asarray(length, dtype=float)

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return 9.81 * (q[1] + q[3])

    def constraints(self, t, q):
        d = q[2:] - q[:2]
        return jnp.array([q[:2] @ q[:2] - self.length**2, d @ d - self.length**2])


class TwicePendulum(CartesianPendulum):
    """The pendulum with its one constraint written twice: redundant, J M⁻¹ Jᵀ singular."""

    def constraints(self, t, q):
        c = q @ q - self.length**2
        return jnp.array([c, c])


class DegenerateMass(jaxdae.LagrangianSystem):
    """`T = ½ q₀² |v|²`: the mass matrix vanishes at q₀ = 0."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * q[0] ** 2 * v @ v


class Unreachable(jaxdae.LagrangianSystem):
    """A constraint with no real solution: `q₀² + 1 = 0`."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 + 1.0])


class MovingSupportPendulum(jaxdae.LagrangianSystem):
    """A pendulum whose pivot moves as `x = a sin(ω t)` (rheonomic constraint)."""

    amplitude: jnp.ndarray
    frequency: jnp.ndarray

    def __init__(self, amplitude=0.2, frequency=3.0):
        self.amplitude = jnp.asarray(amplitude, dtype=float)
        self.frequency = jnp.asarray(frequency, dtype=float)

    def mass_matrix(self, t, q):
        return jnp.eye(2)

    def potential_energy(self, t, q):
        return 9.81 * q[1]

    def constraints(self, t, q):
        pivot = jnp.array([self.amplitude * jnp.sin(self.frequency * t), 0.0])
        d = q - pivot
        return jnp.array([d @ d - 1.0])


class Bead(jaxdae.LagrangianSystem):
    """A point on the lines `x = ±1`, `y = 0`: `J M⁻¹ Jᵀ = diag(4x², 1)` is singular at
    `x = 0`. Released at `x0 > 1` under underdamped Baumgarte gains, `Φ₁ = x² − 1`
    overshoots to about `−0.73 Φ₁(0)`: from `x0 ≈ 1.54` on, the bead reaches `x = 0`."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def constraints(self, t, q):
        return jnp.array([q[0] ** 2 - 1.0, q[1]])


class NFourBar(jaxdae.LagrangianSystem):
    """IFToMM benchmark A02: `n` parallelograms of unit bars (uniform rods of 1 kg) in a row,
    cranks pinned to the ground at `(i, 0)`. `q = (θ_0…θ_n, ψ_1…ψ_n)`, the cranks' and the
    couplers' angles from +x; 2n closure equations. Where the cranks lie flat the Jacobian
    loses n ranks (experiments/studies/singular_passages.py)."""

    n: int = eqx.field(static=True)

    def kinetic_energy(self, t, q, v):
        theta, psi, dtheta, dpsi = (
            q[: self.n + 1],
            q[self.n + 1 :],
            v[: self.n + 1],
            v[self.n + 1 :],
        )
        vx = -dtheta[:-1] * jnp.sin(theta[:-1]) - 0.5 * dpsi * jnp.sin(psi)
        vy = dtheta[:-1] * jnp.cos(theta[:-1]) + 0.5 * dpsi * jnp.cos(psi)
        return jnp.sum(dtheta**2) / 6 + 0.5 * jnp.sum(vx**2 + vy**2) + jnp.sum(dpsi**2) / 24

    def potential_energy(self, t, q):
        theta, psi = q[: self.n + 1], q[self.n + 1 :]
        return 9.81 * (
            0.5 * jnp.sum(jnp.sin(theta)) + jnp.sum(jnp.sin(theta[:-1]) + 0.5 * jnp.sin(psi))
        )

    def constraints(self, t, q):
        theta, psi = q[: self.n + 1], q[self.n + 1 :]
        return jnp.concatenate(
            [
                jnp.cos(theta[:-1]) + jnp.cos(psi) - jnp.cos(theta[1:]) - 1.0,
                jnp.sin(theta[:-1]) + jnp.sin(psi) - jnp.sin(theta[1:]),
            ]
        )

    def initial_state(self):
        """Cranks vertical, the first crank's tip moving at 1 m/s along +x."""
        return (
            jnp.concatenate([jnp.full(self.n + 1, jnp.pi / 2), jnp.zeros(self.n)]),
            jnp.concatenate([jnp.full(self.n + 1, -1.0), jnp.zeros(self.n)]),
        )


def stiff_arm():
    """`(system, formulation, q0, v0)`: the Cartesian two-link arm with
    `Baumgarte(2000, 10⁶)` of the stiff integration guide, from its consistent state."""
    system = jaxdae.examples.CartesianArmLagrangian(forces=(0.0, -9.81, 0.0, -9.81))
    return system, jaxdae.Baumgarte(2000.0, 1e6), *system.initial_state()


def solver_named(name: str):
    """Each kind of solver jaxdae offers, by name: explicit, `Projected`, ESDIRK,
    Rosenbrock, generalized-α."""
    return {
        "tsit5": diffrax.Tsit5(),
        "projected": jaxdae.Projected(diffrax.Tsit5()),
        "kvaerno5": diffrax.Kvaerno5(),
        "rodas5p": jaxdae.Rodas5P(),
        "generalized_alpha": jaxdae.GeneralizedAlpha(),
    }[name]
