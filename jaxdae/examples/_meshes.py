"""Bar frameworks whose constraint graphs are meshes, for the benchmark of general sparsity
(`experiments/benchmarks/bench_sparse.py`) and the tests of structured terms.

Each family is unit point masses (planar or spatial) joined by rigid massless bars,
`Φ_e = |p_a − p_b|² − ℓ_e² = 0`, some nodes pinned (fixed points, not coordinates), under
gravity `g` along the last axis (−y in the plane, −z in space), written in plain vectorized
`jax.numpy` as [`BarNet`][] is: jaxdae finds the sparsity of `M` (the identity) and `J` from
the jaxprs and derives the terms from it. Unlike the chains, ladders and the 5-wide net of
`_scaling.py`, whose `J M⁻¹ Jᵀ` keeps a band of fixed width as they grow, a mesh's band is as
wide as the mesh (after reverse Cuthill–McKee ordering: about `2N` constraints for an
`N × N` planar mesh, `3N²` for an `N × N × N` lattice), so a banded factorization costs
`O(n²)` (planar) or `O(n^{7/3})` (spatial) for `n` coordinates, and a nested-dissection
Cholesky `O(n^{3/2})` (planar; George, "Nested dissection of a regular finite element mesh",
1973) or `O(n²)` (spatial).

- [`SquareNet`][]: a planar `N × N` square mesh (`2N² − 4` coordinates) hanging from its two
  top corners: `2N(N − 1)` bars, `2N − 4` degrees of freedom.
- [`Cloth`][]: a spatial `N × N` triangle mesh (grid plus one diagonal per cell,
  `3N² − 6` coordinates) hanging from its two top corners: `(N − 1)(3N − 1)` bars, `4N − 7`
  degrees of freedom. In the plane a triangulated sheet is rigid and over-constrained; in
  space it is a mechanism, whose bars are independent where it is not flat: it starts curved
  (a spherical cap).
- [`PrattTruss`][]: a planar Pratt truss of `N` bays (`4N` coordinates) pinned at both ends
  of its bottom chord. With every diagonal it would be rigid (and pinned at both ends
  over-constrained by one); here only the even bays have their diagonal, so it is a chain
  of rigid panels joined by open four-bar bays, `⌊N/2⌋ − 1` degrees of freedom, `N` closed
  loops. It starts sagging (its bottom chord below the line of the supports), so that it
  never passes through the straight, singular chord.
- [`SpaceFrame`][]: a cubic lattice of `N × N` columns of `N` nodes (`3N³` coordinates)
  hanging from the `N × N` fixed nodes of a top layer: bars along the lattice's edges,
  `N³ + 2N²(N − 1)` of them, `2N²` degrees of freedom.
- [`FourBarChain`][]: `N` parallelogram four-bars side by side (`2N + 2` coordinates), the
  N-four-bar mechanism of the IFToMM benchmark library (A02) at large `N`, swinging from
  rest: a closed-loop chain, whose `J M⁻¹ Jᵀ` keeps a narrow band (the others' reference).

Every mesh starts at rest from a consistent configuration: the bars' lengths are the
distances of the rest positions, which are moved off the regular grid by `0.1 · N(0, 1)`
(seed 0, as [`BarNet`][]) so that no line of bars is straight between fixed points (a
singular configuration) and the constraints are independent (the four-bars keep A02's exact
geometry). None of them is at
equilibrium: they fall and swing under gravity.

As the families of `_scaling.py`, each also gives its Baumgarte ODE written by hand
(`handwritten_rhs`, [`bars_rhs`][]) and its energies and constraints for CasADi
(`casadi_model`, for [`casadi_baumgarte_ode`][]). `FAMILIES` maps their names to the classes;
`family_size(name, coordinates)` gives the size `N` closest to a number of coordinates.
"""

import abc
import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._systems._system import LagrangianSystem
from ._scaling import GRAVITY, bars_rhs


class Topology(NamedTuple):
    """A bar framework: `rest` positions of the free nodes `(V, d)`, the fixed points
    `anchors` `(A, d)`, and bar `e` joining free node `first[e]` to point `second[e]` of
    `[rest; anchors]` (an anchor where `second[e] ≥ V`)."""

    rest: np.ndarray
    anchors: np.ndarray
    first: np.ndarray
    second: np.ndarray


def _noise(shape) -> np.ndarray:
    return 0.1 * np.random.default_rng(0).standard_normal(shape)


def _framework(points: np.ndarray, pinned: np.ndarray, edges: np.ndarray) -> Topology:
    """The [`Topology`][] of `points` `(P, d)` joined by `edges` `(E, 2)`, with the points
    where `pinned` fixed; no edge joins two fixed points."""
    free = np.flatnonzero(~pinned)
    index = np.empty(len(points), np.int64)
    index[free] = np.arange(free.size)
    index[pinned] = free.size + np.arange(int(pinned.sum()))
    a, b = index[edges[:, 0]], index[edges[:, 1]]
    # `first` is the free end of each bar.
    first, second = np.where(a < free.size, a, b), np.where(a < free.size, b, a)
    if np.any(first >= free.size):
        raise ValueError("a bar joins two fixed points")
    return Topology(points[free], points[pinned], first, second)


def _grid_edges(rows: int, cols: int, diagonals: bool) -> np.ndarray:
    """Edges of a `rows × cols` grid (node `i cols + j`), row by row: right, down and, with
    `diagonals`, down-right."""
    node = np.arange(rows * cols).reshape(rows, cols)
    edges = []
    for i in range(rows):
        row = [np.stack([node[i, :-1], node[i, 1:]], -1)]
        if i + 1 < rows:
            row.append(np.stack([node[i], node[i + 1]], -1))
            if diagonals:
                row.append(np.stack([node[i, :-1], node[i + 1, 1:]], -1))
        edges += row
    return np.concatenate(edges)


@functools.cache
def square_net_topology(size: int) -> Topology:
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    sag = 0.15 * size * np.sin(np.pi * cols / (size - 1))  # no row taut between the corners
    points = np.stack([cols, -rows - sag], -1).reshape(-1, 2) + _noise((size * size, 2))
    pinned = np.zeros(size * size, bool)
    pinned[[0, size - 1]] = True
    return _framework(points, pinned, _grid_edges(size, size, diagonals=False))


@functools.cache
def cloth_topology(size: int) -> Topology:
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    centre = 0.5 * (size - 1)
    # In the vertical x–z plane, bulged along y onto a sphere of radius `size`.
    bulge = ((cols - centre) ** 2 + (rows - centre) ** 2) / (2.0 * size)
    points = np.stack([cols, bulge, -rows], -1).reshape(-1, 3) + _noise((size * size, 3))
    pinned = np.zeros(size * size, bool)
    pinned[[0, size - 1]] = True
    return _framework(points, pinned, _grid_edges(size, size, diagonals=True))


@functools.cache
def pratt_truss_topology(size: int) -> Topology:
    bays = np.arange(size + 1)
    sag = -0.15 * size * np.sin(np.pi * bays / size)
    bottom = np.stack([bays, sag], -1)
    # Node 2i: bottom chord, 2i + 1: top chord, one unit above.
    points = np.stack([bottom, bottom + [0.0, 1.0]], 1).reshape(-1, 2) + _noise((2 * size + 2, 2))
    pinned = np.zeros(2 * size + 2, bool)
    pinned[[0, 2 * size]] = True
    edges = []
    for i in range(size + 1):
        edges.append([2 * i, 2 * i + 1])  # vertical
        if i < size:
            edges += [[2 * i, 2 * i + 2], [2 * i + 1, 2 * i + 3]]  # chords
            if i % 2 == 0:  # Pratt diagonal, sloping down towards mid-span
                edges.append([2 * i + 1, 2 * i + 2] if 2 * i + 1 < size else [2 * i, 2 * i + 3])
    return _framework(points, pinned, np.array(edges))


@functools.cache
def space_frame_topology(size: int) -> Topology:
    layers = size + 1  # layer 0 is fixed
    a, b, c = np.meshgrid(np.arange(size), np.arange(size), np.arange(layers), indexing="ij")
    node = np.arange(size * size * layers).reshape(size, size, layers)
    points = np.stack([a + 0.3 * c, b, -c], -1).reshape(-1, 3).astype(float)  # sheared
    points = points + _noise(points.shape)
    pinned = (c == 0).ravel()
    edges = [
        np.stack([node[:, :, :-1].ravel(), node[:, :, 1:].ravel()], -1),  # vertical
        np.stack([node[:-1, :, 1:].ravel(), node[1:, :, 1:].ravel()], -1),  # along x
        np.stack([node[:, :-1, 1:].ravel(), node[:, 1:, 1:].ravel()], -1),  # along y
    ]
    return _framework(points, pinned, np.concatenate(edges))


@functools.cache
def four_bars_topology(size: int) -> Topology:
    angle = -0.5 * np.pi + 0.6  # cranks 0.6 rad from hanging down
    pivots = np.stack([np.arange(size + 1.0), np.zeros(size + 1)], -1)
    tips = pivots + [np.cos(angle), np.sin(angle)]
    pinned = np.arange(2 * size + 2) > size  # the pivots
    tip = np.arange(size + 1)
    edges = np.concatenate(
        [np.stack([tip, tip + size + 1], -1), np.stack([tip[:-1], tip[1:]], -1)]  # cranks, couplers
    )
    return _framework(np.concatenate([tips, pivots]), pinned, edges)


class _AbstractBarFramework(LagrangianSystem):
    """Unit point masses joined by bars, as a [`Topology`][] of one size."""

    size: int = eqx.field(static=True)
    squared_lengths: jax.Array
    gravity: jax.Array

    min_size: eqx.AbstractClassVar[int]

    def __init__(self, size: int, gravity: float = GRAVITY):
        if int(size) < self.min_size:
            raise ValueError(
                f"`size` of {type(self).__name__} must be at least {self.min_size}; got {size}."
            )
        self.size = int(size)
        self.gravity = jnp.asarray(gravity, dtype=float)
        rest = self.topology()
        points = np.concatenate([rest.rest, rest.anchors])
        lengths = np.sum((points[rest.first] - points[rest.second]) ** 2, axis=-1)
        self.squared_lengths = jnp.asarray(lengths)

    @abc.abstractmethod
    def topology(self) -> Topology:
        """The framework at this size (cached)."""

    @staticmethod
    @abc.abstractmethod
    def coordinates(size: int) -> int:
        """The number of coordinates at `size`."""

    @property
    def dim(self) -> int:
        return self.topology().rest.shape[1]

    def kinetic_energy(self, t, q, v):
        return 0.5 * v @ v

    def potential_energy(self, t, q):
        return self.gravity * jnp.sum(q.reshape(-1, self.dim)[:, -1])

    def constraints(self, t, q):
        top = self.topology()
        points = jnp.concatenate([q.reshape(-1, self.dim), jnp.asarray(top.anchors, q.dtype)])
        d = points[top.first] - points[top.second]
        return jnp.sum(d**2, axis=-1) - self.squared_lengths

    def initial_state(self):
        """`(q0, v0)`: the rest positions, at rest."""
        q0 = jnp.asarray(self.topology().rest.ravel())
        return q0, jnp.zeros_like(q0)

    # -- peers ---------------------------------------------------------------------------

    def bars(self):
        """`(first, second, anchors, lengths)` of [`bars_rhs`][], in the order of
        `constraints`."""
        top = self.topology()
        num = top.rest.shape[0]
        anchored = top.second >= num
        anchors = np.where(
            anchored[:, None], top.anchors[np.where(anchored, top.second - num, 0)], 0.0
        )
        second = np.where(anchored, -1, top.second)
        return top.first, second, anchors, np.sqrt(np.asarray(self.squared_lengths))

    def handwritten_rhs(self):
        return bars_rhs(*self.bars(), self.gravity)

    def casadi_model(self, ca, q, v):
        top = self.topology()
        num = top.rest.shape[0]
        nodes = ca.reshape(q, self.dim, num)  # column k: node k

        def point(k):
            return nodes[:, int(k)] if k < num else ca.DM(top.anchors[k - num])

        squared = np.asarray(self.squared_lengths)
        phi = [
            ca.sumsqr(point(a) - point(b)) - float(s)
            for a, b, s in zip(top.first, top.second, squared, strict=True)
        ]
        kinetic = 0.5 * ca.dot(v, v)
        potential = float(self.gravity) * ca.sum2(nodes[self.dim - 1, :])
        return kinetic, potential, ca.vertcat(*phi)


class SquareNet(_AbstractBarFramework):
    """A planar `N × N` square mesh of unit point masses joined by bars along the grid's
    edges, hanging from its two top corners (fixed): `2N² − 4` coordinates, `2N(N − 1)`
    constraints, `2N − 4` degrees of freedom. Node `(i, j)` rests near `(j, −i)`.

    **Arguments:**

    - `size`: `N ≥ 3`.
    - `gravity`: `g` (along −y).
    """

    min_size = 3

    def topology(self) -> Topology:
        return square_net_topology(self.size)

    @staticmethod
    def coordinates(size: int) -> int:
        return 2 * size * size - 4


class Cloth(_AbstractBarFramework):
    """A spatial `N × N` triangle mesh (the square grid with the diagonal from `(i, j)` to
    `(i + 1, j + 1)` in every cell) of unit point masses joined by bars, hanging from its two
    top corners (fixed): `3N² − 6` coordinates, `(N − 1)(3N − 1)` constraints, `4N − 7`
    degrees of freedom. Node `(i, j)` rests near `(j, y, −i)` on a sphere of radius `N`
    (`y = ((i − c)² + (j − c)²) / 2N`, `c = (N − 1)/2`): a flat triangulated sheet would be
    a singular configuration.

    **Arguments:**

    - `size`: `N ≥ 3`.
    - `gravity`: `g` (along −z).
    """

    min_size = 3

    def topology(self) -> Topology:
        return cloth_topology(self.size)

    @staticmethod
    def coordinates(size: int) -> int:
        return 3 * size * size - 6


class PrattTruss(_AbstractBarFramework):
    """A planar Pratt truss of `N` unit bays, one unit deep, of unit point masses joined by
    bars (chords, verticals, and the diagonal of every even bay), pinned at both ends of its
    bottom chord: `4N` coordinates, `3N + 1 + ⌈N/2⌉` constraints, `⌊N/2⌋ − 1` degrees of
    freedom (the odd bays are open four-bars). Bottom node `i` rests near
    `(i, −0.15 N sin(π i / N))`, its top node one unit above.

    **Arguments:**

    - `size`: `N ≥ 4`.
    - `gravity`: `g` (along −y).
    """

    min_size = 4

    def topology(self) -> Topology:
        return pratt_truss_topology(self.size)

    @staticmethod
    def coordinates(size: int) -> int:
        return 4 * size


class SpaceFrame(_AbstractBarFramework):
    """A cubic lattice of unit point masses joined by bars along its edges: `N` layers of
    `N × N` nodes below a fixed top layer, each node joined to the node above it and, within
    its layer, to its neighbours: `3N³` coordinates, `N³ + 2N²(N − 1)` constraints, `2N²`
    degrees of freedom. Node `(a, b, c)` rests near `(a, b, −c)`.

    **Arguments:**

    - `size`: `N ≥ 2`.
    - `gravity`: `g` (along −z).
    """

    min_size = 2

    def topology(self) -> Topology:
        return space_frame_topology(self.size)

    @staticmethod
    def coordinates(size: int) -> int:
        return 3 * size**3


class FourBarChain(_AbstractBarFramework):
    """`N` parallelogram four-bars side by side, after the N-four-bar mechanism of the
    IFToMM benchmark library (problem A02): `N + 1` unit cranks pinned to the ground at
    `(i, 0)`, their tips (unit point masses) joined by `N` unit couplers: `2N + 2`
    coordinates, `2N + 1` constraints, one degree of freedom, `N` closed loops. The cranks
    start at rest 0.6 rad from hanging down and swing as one pendulum; A02's cranks turn
    through the horizontal, where the constraints are dependent (every bar horizontal),
    which a swing from here never reaches.

    **Arguments:**

    - `size`: `N ≥ 1`.
    - `gravity`: `g` (along −y).
    """

    min_size = 1

    def topology(self) -> Topology:
        return four_bars_topology(self.size)

    @staticmethod
    def coordinates(size: int) -> int:
        return 2 * size + 2


FAMILIES = {
    "square": SquareNet,
    "cloth": Cloth,
    "truss": PrattTruss,
    "frame": SpaceFrame,
    "fourbars": FourBarChain,
}


def family_size(family: str, coordinates: int) -> int:
    """The size `N` of `FAMILIES[family]` whose number of coordinates is closest to
    `coordinates` (at least the family's smallest)."""
    cls = FAMILIES[family]
    size = cls.min_size
    while abs(cls.coordinates(size + 1) - coordinates) < abs(cls.coordinates(size) - coordinates):
        size += 1
    return size
