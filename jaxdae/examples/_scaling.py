"""Model families of growing size for the scaling benchmarks
(`experiments/benchmarks/bench_scaling.py`) and the tests of structured terms, written as users
write them.

Four planar families, each with unit masses, unit link lengths and gravity `g` along −y, in
plain vectorized `jax.numpy` (no hand-derived matrices: jaxdae derives `M`, `J`, `γ`, ...):

- [`CartesianChain`][]: `N` point masses in Cartesian coordinates (`2N` coordinates), each
  at distance 1 from the previous one and the first from the origin: `N` holonomic
  constraints `|p_i − p_{i−1}|² − 1 = 0`, `p_0 = 0`. Constant (identity) mass matrix, banded
  constraint Jacobian.
- [`NLinkPendulum`][]: the same chain in relative joint angles (`N` coordinates, no
  constraints); the kinetic energy is written from the velocities of the link ends, so the
  mass matrix is dense and depends on `q`.
- [`FourBarLadder`][]: `N` four-bars stacked into a ladder, in absolute coordinates: point
  masses `L_i`, `R_i` (`4N` coordinates) hanging from the fixed pivots `L_0 = (0, 0)`,
  `R_0 = (w, 0)`, joined by rails `|L_i − L_{i−1}| = |R_i − R_{i−1}| = 1` and rungs
  `|R_i − L_i| = w`: `3N` holonomic constraints, `N` degrees of freedom, a closed loop per
  cell. Point masses joined by bars (a planar truss) rather than rigid bodies `(x, y, θ)`:
  the ladder then has 3 constraints per 4 coordinates,
  and each cell is a parallelogram four-bar whose rung stays horizontal.
- [`BarNet`][]: a net of `N` rows of 5 point masses (`10N` coordinates) joined by bars to
  their neighbours above and to the left, hanging from fixed points: `9N` holonomic
  constraints coupled in two directions, whose `J M⁻¹ Jᵀ` has a band of 9 rows (1 for the
  chain, 3 for the ladder).

The chain and the pendulum are the same mechanism: `NLinkPendulum(N)` and `CartesianChain(N)`
move alike from the same initial state (`tests/test_scaling_models.py` checks it).

Each family also gives, for the peers of the benchmark, its equations by hand in `jax.numpy`
(`handwritten_rhs`: the Baumgarte ODE with a dense `jnp.linalg.solve`) and its energies and
constraints as CasADi expressions (`casadi_model`), from which `casadi_baumgarte_ode`
derives the same ODE with CasADi's SX derivatives and sparse linear algebra.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._systems._system import LagrangianSystem

GRAVITY = 9.81


def initial_angles(num: int, amplitude: float = 0.6, offset: float = 0.3) -> np.ndarray:
    """Absolute link angles from the downward vertical, `(num,)`: a smooth, non-trivial
    configuration, `amplitude · cos(0.7 i) + offset` (by default within ±0.9 rad of
    hanging down)."""
    i = np.arange(num)
    return amplitude * np.cos(0.7 * i) + offset


def _unit_links(angles):
    """Link vectors `(sin θ, −cos θ)`, shape `(N, 2)`."""
    return jnp.stack([jnp.sin(angles), -jnp.cos(angles)], axis=-1)


class _Links(LagrangianSystem):
    """`N` unit links with unit masses under gravity: the chain's and the pendulum's fields."""

    num_links: int = eqx.field(static=True)
    gravity: jax.Array

    def __init__(self, num_links: int, gravity: float = GRAVITY):
        if int(num_links) < 1:
            raise ValueError(f"`num_links` must be at least 1; got {num_links}.")
        self.num_links = int(num_links)
        self.gravity = jnp.asarray(gravity, dtype=float)


class CartesianChain(_Links):
    """`N` unit point masses in the plane, `q = (x_1, y_1, …, x_N, y_N)`, joined by massless
    rods of length 1, the first to the origin: `Φ_i = |p_i − p_{i−1}|² − 1`, `p_0 = 0`.

    **Arguments:**

    - `num_links`: `N ≥ 1`.
    - `gravity`: `g` (along −y).
    """

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return self.gravity * jnp.sum(q.reshape(-1, 2)[:, 1])

    def constraints(self, t, q):
        p = q.reshape(-1, 2)
        previous = jnp.concatenate([jnp.zeros((1, 2), q.dtype), p[:-1]])
        return jnp.sum((p - previous) ** 2, axis=-1) - 1.0

    def initial_state(self):
        """`(q0, v0)` on the constraint manifold: the links at `initial_angles`, at rest."""
        positions = jnp.cumsum(_unit_links(jnp.asarray(initial_angles(self.num_links))), axis=0)
        q0 = positions.ravel()
        return q0, jnp.zeros_like(q0)

    # -- peers ---------------------------------------------------------------------------

    def bars(self):
        """`(first, second, anchors, lengths)` of `handwritten_rhs`: bar `e` joins node
        `first[e]` to node `second[e]`, or to the fixed point `anchors[e]` where
        `second[e] < 0`."""
        n = self.num_links
        first = np.arange(n)
        second = np.arange(n) - 1
        return first, second, np.zeros((n, 2)), np.ones(n)

    def handwritten_rhs(self):
        return bars_rhs(*self.bars(), self.gravity)

    def casadi_model(self, ca, q, v):
        p = ca.reshape(q, 2, self.num_links)  # column i: (x_i, y_i)
        phi = [ca.sumsqr(p[:, 0]) - 1.0]
        phi += [ca.sumsqr(p[:, i] - p[:, i - 1]) - 1.0 for i in range(1, self.num_links)]
        kinetic = 0.5 * ca.dot(v, v)
        potential = float(self.gravity) * ca.sum2(p[1, :])
        return kinetic, potential, ca.vertcat(*phi)


class NLinkPendulum(_Links):
    """`N` unit point masses at the ends of `N` massless unit links, in relative joint
    angles: `q_i` is link `i`'s angle to link `i − 1` (link 1's to the downward vertical).

    `T = ½ Σ_k |ṗ_k|²` with `p_k = Σ_{j≤k} (sin θ_j, −cos θ_j)`, `θ = cumsum(q)`: the mass
    matrix is dense. No constraints.

    **Arguments:**

    - `num_links`: `N ≥ 1`.
    - `gravity`: `g` (along −y).
    """

    def positions(self, q):
        """Link ends `p_k`, shape `(N, 2)`."""
        return jnp.cumsum(_unit_links(jnp.cumsum(q)), axis=0)

    def kinetic_energy(self, t, q, v):
        angles, rates = jnp.cumsum(q), jnp.cumsum(v)
        tangents = jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-1)
        velocities = jnp.cumsum(rates[:, None] * tangents, axis=0)
        return 0.5 * jnp.sum(velocities**2)

    def potential_energy(self, t, q):
        return self.gravity * jnp.sum(self.positions(q)[:, 1])

    def initial_state(self):
        """`(q0, v0)`: the links at `initial_angles`, at rest."""
        angles = jnp.asarray(initial_angles(self.num_links))
        q0 = jnp.diff(angles, prepend=0.0)
        return q0, jnp.zeros_like(q0)

    # -- peers ---------------------------------------------------------------------------

    def handwritten_rhs(self):
        """`rhs(t, y, gains)` of `y = (q, v)` from the closed-form equations in absolute
        angles `θ = cumsum(q)`: `Σ_l c_jl [cos(θ_j − θ_l) θ̈_l + sin(θ_j − θ_l) θ̇_l²] +
        g (N − j) sin θ_j = 0`, `c_jl = N − max(j, l)` (0-based), solved densely for `θ̈`,
        then `q̈ = diff(θ̈)`. The gains do not enter (no constraints)."""
        n = self.num_links
        index = np.arange(n)
        weights = jnp.asarray(n - np.maximum(index[:, None], index[None, :]), dtype=float)
        below = jnp.asarray(n - index, dtype=float)
        gravity = self.gravity

        def rhs(t, y, gains):
            q, v = y[:n], y[n:]
            angles, rates = jnp.cumsum(q), jnp.cumsum(v)
            difference = angles[:, None] - angles[None, :]
            mass = weights * jnp.cos(difference)
            forces = -(weights * jnp.sin(difference)) @ rates**2 - gravity * below * jnp.sin(angles)
            angular = jnp.linalg.solve(mass, forces)
            return jnp.concatenate([v, jnp.diff(angular, prepend=0.0)])

        return rhs

    def casadi_model(self, ca, q, v):
        angle = rate = 0.0
        x = y = vx = vy = 0.0
        kinetic = potential = 0.0
        for i in range(self.num_links):
            angle, rate = angle + q[i], rate + v[i]
            x, y = x + ca.sin(angle), y - ca.cos(angle)
            vx, vy = vx + rate * ca.cos(angle), vy + rate * ca.sin(angle)
            kinetic += 0.5 * (vx**2 + vy**2)
            potential += float(self.gravity) * y
        return kinetic, potential, ca.SX(0, 1)


class FourBarLadder(LagrangianSystem):
    """`N` parallelogram four-bars stacked into a ladder hanging from the fixed pivots
    `L_0 = (0, 0)` and `R_0 = (w, 0)`, in absolute coordinates:
    `q = (L_1, R_1, L_2, R_2, …)` (unit point masses, `4N` coordinates).

    Per cell `i`, three constraints (in this order): the rails
    `|L_i − L_{i−1}|² − 1`, `|R_i − R_{i−1}|² − 1` and the rung `|R_i − L_i|² − w²`.

    **Arguments:**

    - `num_cells`: `N ≥ 1`.
    - `width`: the rung length `w`.
    - `gravity`: `g` (along −y).
    """

    num_cells: int = eqx.field(static=True)
    width: jax.Array
    gravity: jax.Array

    def __init__(self, num_cells: int, width: float = 1.0, gravity: float = GRAVITY):
        if int(num_cells) < 1:
            raise ValueError(f"`num_cells` must be at least 1; got {num_cells}.")
        self.num_cells = int(num_cells)
        self.width = jnp.asarray(width, dtype=float)
        self.gravity = jnp.asarray(gravity, dtype=float)

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return self.gravity * jnp.sum(q.reshape(-1, 2)[:, 1])

    def constraints(self, t, q):
        nodes = q.reshape(-1, 2, 2)  # (cell, left/right, xy)
        pivots = jnp.array([[0.0, 0.0], [self.width, 0.0]], q.dtype)
        previous = jnp.concatenate([pivots[None], nodes[:-1]])
        rails = jnp.sum((nodes - previous) ** 2, axis=-1) - 1.0
        rungs = jnp.sum((nodes[:, 1] - nodes[:, 0]) ** 2, axis=-1) - self.width**2
        return jnp.concatenate([rails, rungs[:, None]], axis=1).ravel()

    def initial_state(self):
        """`(q0, v0)` on the constraint manifold: the rails of cell `i` at
        `initial_angles(N, 0.2, 0.1)[i]` from the downward vertical, at rest. (A cell is
        singular where its rails turn parallel to its rung; from larger angles the free end
        of a long ladder whips up to that within `t = 1`.)"""
        rails = jnp.cumsum(
            _unit_links(jnp.asarray(initial_angles(self.num_cells, 0.2, 0.1))), axis=0
        )
        nodes = jnp.stack([rails, rails + jnp.array([1.0, 0.0]) * self.width], axis=1)
        q0 = nodes.ravel()
        return q0, jnp.zeros_like(q0)

    # -- peers ---------------------------------------------------------------------------

    def bars(self):
        """As [`CartesianChain.bars`][]: nodes `2i` (`L_{i+1}`) and `2i + 1` (`R_{i+1}`)."""
        n, w = self.num_cells, float(self.width)
        first, second, anchors = [], [], []
        for i in range(n):
            left, right = 2 * i, 2 * i + 1
            first += [left, right, right]
            second += [left - 2 if i else -1, right - 2 if i else -1, left]
            anchors += [[0.0, 0.0], [w, 0.0], [0.0, 0.0]]
        lengths = np.tile([1.0, 1.0, w], n)
        return np.array(first), np.array(second), np.array(anchors), lengths

    def handwritten_rhs(self):
        return bars_rhs(*self.bars(), self.gravity)

    def casadi_model(self, ca, q, v):
        nodes = ca.reshape(q, 2, 2 * self.num_cells)  # column 2i: L_{i+1}, 2i + 1: R_{i+1}
        w = float(self.width)
        phi = []
        for i in range(self.num_cells):
            left, right = nodes[:, 2 * i], nodes[:, 2 * i + 1]
            if i:
                below_left, below_right = nodes[:, 2 * i - 2], nodes[:, 2 * i - 1]
            else:
                below_left, below_right = ca.DM([0.0, 0.0]), ca.DM([w, 0.0])
            phi += [
                ca.sumsqr(left - below_left) - 1.0,
                ca.sumsqr(right - below_right) - 1.0,
                ca.sumsqr(right - left) - w**2,
            ]
        kinetic = 0.5 * ca.dot(v, v)
        potential = float(self.gravity) * ca.sum2(nodes[1, :])
        return kinetic, potential, ca.vertcat(*phi)


class BarNet(LagrangianSystem):
    """A net of `N × C` unit point masses (`N` rows of `C` nodes, `2NC` coordinates) hanging
    by its top row from the fixed points `(j, 0)`: each node is joined by a bar to the node
    above it (or its anchor) and to its left neighbour, `NC + N(C − 1)` holonomic
    constraints `|p_a − p_b|² − ℓ_ab² = 0`, `N` degrees of freedom.

    The bars' lengths are those of `rest_positions` (a unit grid moved by `0.1 · N(0, 1)`,
    seed 0), so that the rest state is consistent and the constraints independent (on a
    straight grid the collinear bars would meet in singular configurations). The net's
    `J M⁻¹ Jᵀ` is banded with blocks of about `2C` rows, which grow with its width and not
    its length: at `C = 5`, 9 rows, beyond the factorization's unrolled blocks (`C` fixed,
    the family grows in length).

    **Arguments:**

    - `num_rows`: `N ≥ 1`.
    - `num_cols`: `C ≥ 1` (default 5).
    - `gravity`: `g` (along −y).
    """

    num_rows: int = eqx.field(static=True)
    num_cols: int = eqx.field(static=True)
    squared_lengths: jax.Array
    gravity: jax.Array

    def __init__(self, num_rows: int, num_cols: int = 5, gravity: float = GRAVITY):
        if int(num_rows) < 1 or int(num_cols) < 1:
            raise ValueError(
                f"`num_rows` and `num_cols` must be at least 1; got {num_rows}, {num_cols}."
            )
        self.num_rows, self.num_cols = int(num_rows), int(num_cols)
        self.gravity = jnp.asarray(gravity, dtype=float)
        self.squared_lengths = self._squared_distances(self.rest_positions())

    def rest_positions(self) -> jax.Array:
        """`q` of the rest state: node `(i, j)` near `(j, −1 − i)`."""
        rows, cols = np.meshgrid(np.arange(self.num_rows), np.arange(self.num_cols), indexing="ij")
        grid = np.stack([cols, -1.0 - rows], axis=-1)
        grid = grid + 0.1 * np.random.default_rng(0).standard_normal(grid.shape)
        return jnp.asarray(grid.ravel())

    def _squared_distances(self, q):
        """`|p_a − p_b|²` of every bar, row by row: the row's hanging bars, then its bars
        across."""
        nodes = q.reshape(self.num_rows, self.num_cols, 2)
        anchors = jnp.stack(
            [jnp.arange(self.num_cols, dtype=q.dtype), jnp.zeros(self.num_cols, q.dtype)], axis=-1
        )
        above = jnp.concatenate([anchors[None], nodes[:-1]])
        hanging = jnp.sum((nodes - above) ** 2, axis=-1)
        across = jnp.sum((nodes[:, 1:] - nodes[:, :-1]) ** 2, axis=-1)
        return jnp.concatenate([hanging, across], axis=1).ravel()

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return self.gravity * jnp.sum(q.reshape(-1, 2)[:, 1])

    def constraints(self, t, q):
        return self._squared_distances(q) - self.squared_lengths

    def initial_state(self):
        """`(q0, v0)`: the rest positions, at rest."""
        q0 = self.rest_positions()
        return q0, jnp.zeros_like(q0)

    # -- peers ---------------------------------------------------------------------------

    def bars(self):
        """As [`CartesianChain.bars`][], in the order of `constraints`: node `i C + j` is
        node `(i, j)`."""
        rows, cols = self.num_rows, self.num_cols
        first, second, anchors = [], [], []
        for i in range(rows):
            for j in range(cols):
                first.append(i * cols + j)
                second.append((i - 1) * cols + j if i else -1)
                anchors.append([float(j), 0.0])
            for j in range(1, cols):
                first.append(i * cols + j)
                second.append(i * cols + j - 1)
                anchors.append([0.0, 0.0])
        lengths = np.sqrt(np.asarray(self.squared_lengths))
        return np.array(first), np.array(second), np.array(anchors), lengths

    def handwritten_rhs(self):
        return bars_rhs(*self.bars(), self.gravity)

    def casadi_model(self, ca, q, v):
        first, second, anchors, lengths = self.bars()
        nodes = ca.reshape(q, 2, self.num_rows * self.num_cols)  # column k: node k
        phi = [
            ca.sumsqr(nodes[:, a] - (nodes[:, b] if b >= 0 else ca.DM(anchor))) - float(length) ** 2
            for a, b, anchor, length in zip(first, second, anchors, lengths, strict=True)
        ]
        kinetic = 0.5 * ca.dot(v, v)
        potential = float(self.gravity) * ca.sum2(nodes[1, :])
        return kinetic, potential, ca.vertcat(*phi)


def bars_rhs(first, second, anchors, lengths, gravity):
    """The Baumgarte ODE of unit point masses joined by bars, written by hand.

    `Φ_e = |d_e|² − L_e²`, `d_e = p_{first} − p_{second}` (or `− anchor`), so `J_e` holds
    `±2 d_e` in the two nodes' columns and `Φ̈ = J q̈ + 2 |ḋ_e|²`. A node has as many
    coordinates as an anchor (`anchors.shape[1]`: 2 or 3), gravity along the last. With
    `M = I` and `Q = (0, −g)` (or `(0, 0, −g)`) per node: `(J Jᵀ) λ = J Q − s`,
    `s = −2 |ḋ|² − k_D Φ̇ − k_P Φ`, `q̈ = Q − Jᵀ λ` (Mukharlyamov and Deressa (2015)
    eq. [21]); `J Jᵀ` is assembled densely and
    solved with `jnp.linalg.solve`. Returns `rhs(t, y, (kd, kp))` of `y = (q, v)`.
    """
    first, second = np.asarray(first), np.asarray(second)
    anchored = second < 0
    second_node = np.where(anchored, 0, second)
    anchors = jnp.asarray(anchors, dtype=float)
    squared = jnp.asarray(lengths, dtype=float) ** 2
    bars = np.arange(first.size)
    num_nodes = int(max(first.max(), second.max())) + 1
    dim = anchors.shape[1]
    mask = jnp.asarray(~anchored, dtype=float)[:, None]

    def rhs(t, y, gains):
        kd, kp = gains
        q, v = y[: dim * num_nodes].reshape(-1, dim), y[dim * num_nodes :].reshape(-1, dim)
        keep = mask.astype(y.dtype)  # float32 states stay float32
        d = q[first] - jnp.where(keep > 0, q[second_node], anchors.astype(y.dtype))
        dd = v[first] - keep * v[second_node]
        phi = jnp.sum(d**2, axis=-1) - squared.astype(y.dtype)
        dphi = 2 * jnp.sum(d * dd, axis=-1)
        target = -2 * jnp.sum(dd**2, axis=-1) - kd * dphi - kp * phi
        jac = jnp.zeros((first.size, num_nodes, dim), y.dtype)
        jac = jac.at[bars, first].add(2 * d).at[bars, second_node].add(-2 * d * keep)
        jac = jac.reshape(first.size, -1)
        forces = jnp.zeros((num_nodes, dim), y.dtype).at[:, -1].set(-gravity).ravel()
        lam = jnp.linalg.solve(jac @ jac.T, jac @ forces - target)
        return jnp.concatenate([v.ravel(), forces - jac.T @ lam])

    return rhs


FAMILIES = {
    "chain": CartesianChain,
    "pendulum": NLinkPendulum,
    "ladder": FourBarLadder,
    "net": BarNet,
}


def casadi_baumgarte_ode(ca, model):
    """The Baumgarte ODE of `model` (one of this module's families) for CasADi.

    `T`, `V`, `Φ` are CasADi SX expressions (`model.casadi_model`); `M = T_vv`,
    `Q = T_q − V_q − T_vq v`, `J = Φ_q` and `γ` come from SX derivatives (sparse). With a
    diagonal `M` (chain, ladder) the multipliers solve the sparse `(J M⁻¹ Jᵀ) λ = J M⁻¹ Q − s`,
    `s = γ − k_D Φ̇ − k_P Φ`, with CasADi's sparse LDL (`casadi.solve(..., "ldl")`); without
    constraints (pendulum) `M q̈ = Q` is solved with it. Returns `{x, p, ode}` (MX) for
    `casadi.integrator`, `x = (q, v)`, `p = (k_D, k_P)`.
    """
    n = int(model.initial_state()[0].shape[0])
    q, v = ca.SX.sym("q", n), ca.SX.sym("v", n)
    gains = ca.SX.sym("p", 2)
    kinetic, potential, phi = model.casadi_model(ca, q, v)
    mass, _ = ca.hessian(kinetic, v)
    forces = (
        ca.gradient(kinetic, q)
        - ca.gradient(potential, q)
        - ca.jtimes(ca.gradient(kinetic, v), q, v)
    )
    x, p = ca.MX.sym("x", 2 * n), ca.MX.sym("p", 2)
    if phi.numel() == 0:
        terms = ca.Function("terms", [q, v], [mass, forces])
        m_x, q_x = terms(x[:n], x[n:])
        return {"x": x, "p": p, "ode": ca.vertcat(x[n:], ca.solve(m_x, q_x, "ldl"))}
    if not mass.sparsity().is_diag():
        raise NotImplementedError("constraints with a non-diagonal mass matrix")
    jac = ca.jacobian(phi, q)
    dphi = ca.mtimes(jac, v)
    gamma = -ca.jtimes(dphi, q, v)
    target = gamma - gains[0] * dphi - gains[1] * phi
    inverse = 1.0 / ca.diag(mass)
    minv_q = inverse * forces
    minv_jt = ca.mtimes(ca.diag(inverse), jac.T)
    matrix = ca.mtimes(jac, minv_jt)
    terms = ca.Function(
        "terms", [q, v, gains], [matrix, ca.mtimes(jac, minv_q) - target, minv_q, minv_jt]
    )
    a_x, b_x, minv_q_x, minv_jt_x = terms(x[:n], x[n:], p)
    lam = ca.solve(a_x, b_x, "ldl")
    return {"x": x, "p": p, "ode": ca.vertcat(x[n:], minv_q_x - ca.mtimes(minv_jt_x, lam))}
