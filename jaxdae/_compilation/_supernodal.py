"""Sparse Cholesky factorization of symmetric positive definite matrices of any sparsity:
a fill-reducing ordering, supernodes, and a multifrontal factorization run as a static
schedule of batched dense block operations.

The symbolic work is done once per [`Pattern`][] in NumPy while tracing
([`supernodal_plan`][], cached):

- **Ordering.** A fill-reducing nested-dissection order (`_ordering.py`): on a 2-D mesh
  of `n` nodes a factor of `O(n log n)` entries and `O(n^1.5)` work, where a band ordering
  (reverse Cuthill–McKee, `_banded.py`) gives `O(n^1.5)` entries and `O(n²)` work.
- **Elimination tree, column counts, supernodes** (Liu, "The role of elimination trees in
  sparse factorization", SIAM J. Matrix Anal. Appl. 11, 1990; Davis, *Direct Methods for
  Sparse Linear Systems*, SIAM 2006, ch. 4): the tree by Liu's algorithm with path
  compression, postordered; fundamental supernodes (columns with nested structure), then
  relaxed amalgamation (Ashcraft and Grimes, 1989), which merges a child supernode into
  its parent where few explicit zeros result, with CHOLMOD's default limits (Chen, Davis,
  Hager and Rajamanickam, ACM TOMS 35, 2008).

The numeric factorization is multifrontal (Duff and Reid, 1983; Liu, "The multifrontal
method for sparse matrix solution: theory and practice", SIAM Review 34, 1992): each
supernode assembles a dense front from its columns of `A` and its children's update
matrices, factorizes its pivot block (`L₁₁ = chol(F₁₁)`, `L₂₁ = F₂₁ L₁₁⁻ᵀ`) and adds its
update matrix `F₂₂ − L₂₁ L₂₁ᵀ` into its parent's front (the extend-add). Multifrontal
rather than left- or right-looking supernodal: every supernode touches only its own front
and its parent's, so independent supernodes are processed together as one batch of dense
blocks, with one scatter-add per batch, and no supernode needs to know which descendants
update it (a left-looking step would gather from a varying number of them).

The schedule is static and does not grow with the matrix: supernodes are grouped by their
level in the supernodal elimination tree (leaves first; those of one level are
independent), padded to at most `SUPERNODAL_CLASSES` block-size classes (chosen to
minimize the padded work), and batched into tasks. A `lax.fori_loop` over the levels holds
one loop per class over that level's tasks of the class (their bounds are data); a task is
a batched dense Cholesky factorization (LAPACK's), triangular solve and product on slices of
two flat buffers, the assembled fronts (a task reads its own, then adds its update matrices
into its parents') and the factor's columns (only written), so that XLA updates both in
place (a `lax.switch` between the classes, or one buffer read after a write, made it copy
them at every task). The index arrays that say where each task reads and writes are data. The
substitutions are the same loops, up the tree then down. So the traced program has the
same size for every matrix with as many classes, and its compile time stays flat.

A solve is `jax.lax.custom_linear_solve` with the substitutions: differentiated implicitly
(`d(A⁻¹ r) = A⁻¹ (dr − dA A⁻¹ r)`, a solve with the same factor) and transposed as a solve
with the same symmetric matrix, so the loops themselves are never differentiated.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _thresholds
from .._custom_types import Array, Float
from ._banded import BandedPlan, banded_plan
from ._gather import take
from ._ordering import adjacency, fill_reducing_order
from ._sparse import Pattern, SparseMatrix

# Relaxed amalgamation: CHOLMOD's defaults (`nrelax`, `zrelax`). A merged supernode of at
# most `_RELAX_COLUMNS[i]` columns is kept where at most `_RELAX_ZEROS[i]` of its stored
# entries are zeros; any merge up to 4 columns is kept.
_RELAX_COLUMNS = (4, 16, 48)
_RELAX_ZEROS = (1.0, 0.8, 0.1, 0.05)

# Work equivalent (in multiply–adds) of one task of the loop, in choosing batch sizes and
# classes: the cost of a loop iteration's dispatch on the CPU (tens of microseconds).
_TASK_OVERHEAD = 20000.0

# Work equivalent of one entry of a front's storage (zeroed, assembled, read): a fresh
# page's first touch costs several multiply–adds per entry.
_ENTRY_COST = 4.0

# Work equivalent of one more class (a loop body per class in the factorization and in each
# substitution: compile time), so that small matrices take fewer classes.
_CLASS_COST = 200_000.0

# -- Symbolic factorization ----------------------------------------------------------------


def _etree(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The elimination tree (`parent[j]`, `-1` at roots) of a symmetric graph in its own
    order, by Liu's algorithm with path compression (Davis 2006, `cs_etree`)."""
    n = indptr.size - 1
    parent = np.full(n, -1, np.int64)
    ancestor = np.full(n, -1, np.int64)
    for j in range(n):
        for i in indices[indptr[j] : indptr[j + 1]].tolist():
            while i != -1 and i < j:
                following = ancestor[i]
                ancestor[i] = j
                if following == -1:
                    parent[i] = j
                i = following
    return parent


def _postorder(parent: np.ndarray) -> np.ndarray:
    """A postorder of the forest `parent` (children in increasing order)."""
    n = parent.size
    children = [[] for _ in range(n)]
    for j in range(n):
        if parent[j] >= 0:
            children[parent[j]].append(j)
    post = []
    for root in np.flatnonzero(parent < 0).tolist():
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                post.append(node)
                continue
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return np.asarray(post, np.int64)


def _column_structures(indptr, indices, parent) -> list[np.ndarray]:
    """For each column `j` of the factor, the rows below the diagonal (sorted)."""
    n = parent.size
    children = [[] for _ in range(n)]
    for j in range(n):
        if parent[j] >= 0:
            children[parent[j]].append(j)
    structure = [np.empty(0, np.int64)] * n
    for j in range(n):
        row = indices[indptr[j] : indptr[j + 1]]
        parts = [row[row > j]] + [structure[c][1:] for c in children[j]]
        structure[j] = np.unique(np.concatenate(parts)) if len(parts) > 1 else parts[0]
    return structure


def _supernodes(parent, structure) -> list[tuple[int, int, np.ndarray]]:
    """Fundamental supernodes, then relaxed amalgamation: `(first column, columns, rows
    below)` of each, in order."""
    n = parent.size
    counts = np.array([s.size for s in structure])
    n_children = np.bincount(parent[parent >= 0], minlength=n)
    nodes = []  # [first, ncols, below, true entries]
    for j in range(n):
        if nodes and parent[j - 1] == j and counts[j - 1] == counts[j] + 1 and n_children[j] == 1:
            node = nodes[-1]
            node[1] += 1
            node[2] = structure[j]
            node[3] += counts[j] + 1
        else:
            nodes.append([j, 1, structure[j], counts[j] + 1])
        # relaxed amalgamation: merge contiguous children into the node just completed,
        # once it is complete (its next column starts another supernode)
    merged: list[list] = []
    for node in nodes:
        while merged:
            child = merged[-1]
            below = child[2]
            if below.size == 0 or not (node[0] <= below[0] < node[0] + node[1]):
                break
            k = child[1] + node[1]
            r = node[2].size
            stored = k * (k + 1) // 2 + k * r
            zeros = (stored - child[3] - node[3]) / stored
            limit = next(
                (z for c, z in zip(_RELAX_COLUMNS, _RELAX_ZEROS, strict=False) if k <= c),
                _RELAX_ZEROS[-1],
            )
            if zeros > limit and k > _RELAX_COLUMNS[0]:
                break
            merged.pop()
            node = [child[0], k, node[2], child[3] + node[3]]
        merged.append(node)
    return [(first, k, below) for first, k, below, _ in merged]


def _block_cost(k, u) -> float:
    """Multiply–adds of one front with `k` pivots and `u` update rows (factorization,
    triangular solve, update, extend-add)."""
    return k**3 / 3 + k * k * u + k * u * u / 2 + _ENTRY_COST * (k + u) ** 2


def _classes(ks: np.ndarray, us: np.ndarray, levels: np.ndarray, max_classes: int):
    """Block-size classes: a partition of the supernodes, sorted by front size, into at most
    `max_classes` contiguous ranges minimizing the padded work (dynamic programming over
    the distinct front sizes). Returns each supernode's class and each class's `(k, u)`."""
    fronts = ks + us
    sizes = np.unique(fronts)
    m = sizes.size
    group = np.searchsorted(sizes, fronts)
    count = np.bincount(group, minlength=m)
    kmax = np.zeros(m, np.int64)
    umax = np.zeros(m, np.int64)
    np.maximum.at(kmax, group, ks)
    np.maximum.at(umax, group, us)
    # cost[a, b]: sizes[a..b] as one class (a task per level, roughly)
    overhead = _TASK_OVERHEAD * np.unique(levels).size
    cost = np.full((m, m), np.inf)
    for a in range(m):
        k = u = c = 0
        for b in range(a, m):
            k, u, c = max(k, kmax[b]), max(u, umax[b]), c + count[b]
            cost[a, b] = c * _block_cost(k, u) + overhead
    cost = cost + _CLASS_COST
    best = np.full((max_classes + 1, m + 1), np.inf)
    cut = np.zeros((max_classes + 1, m + 1), np.int64)
    best[0, 0] = 0.0
    for p in range(1, max_classes + 1):
        for b in range(1, m + 1):
            options = best[p - 1, :b] + cost[np.arange(b), b - 1]
            cut[p, b] = int(np.argmin(options))
            best[p, b] = options[cut[p, b]]
    p = int(np.argmin(best[:, m]))
    bounds, b = [], m
    while p > 0:
        a = cut[p, b]
        bounds.append((a, b))
        b, p = a, p - 1
    bounds.reverse()
    label = np.zeros(m, np.int64)
    shapes = []
    for c, (a, b) in enumerate(bounds):
        label[a:b] = c
        shapes.append((int(kmax[a:b].max()), int(umax[a:b].max())))
    return label[group], shapes


def _batch(level_counts: np.ndarray, cost: float) -> int:
    """The batch size (a power of two) minimizing the padded work of a class's tasks."""
    best, best_cost = 1, np.inf
    size = 1
    while True:
        total = np.sum(-(-level_counts // size)) * (size * cost + _TASK_OVERHEAD)
        if total < best_cost:
            best, best_cost = size, total
        if size >= level_counts.max(initial=1):
            return best
        size *= 2


class SupernodalPlan:
    """Static data of a multifrontal factorization of a symmetric pattern (see the module's
    docstring): the fill-reducing order, the supernodes and their fronts' places in one
    flat buffer, and the schedule of tasks (batches of independent supernodes of one
    block-size class).

    **Attributes:** `order` (the `k`-th row eliminated), `size`, `supernodes` (count),
    `classes` (`(k, u, batch)` of each class: pivots, update rows, supernodes per task),
    `tasks`, `flops` (padded multiply–adds of a factorization, with the tasks' overhead),
    `factor_nonzeros` (entries of the factor's structure), `factor_entries` (entries stored
    by the supernodes, with the zeros of amalgamation, without the classes' padding).
    """

    def __init__(self, pattern: Pattern, order: np.ndarray | None = None):
        n = pattern.shape[0]
        self.pattern, self.size = pattern, n
        order = fill_reducing_order(pattern) if order is None else np.asarray(order, np.int64)
        indptr, indices = adjacency(pattern, order)
        post = _postorder(_etree(indptr, indices))
        order = order[post]
        indptr, indices = adjacency(pattern, order)
        parent = _etree(indptr, indices)
        structure = _column_structures(indptr, indices, parent)
        self.factor_nonzeros = int(sum(s.size for s in structure)) + n
        nodes = _supernodes(parent, structure)
        self.order = order
        inverse = np.empty(n, np.int64)
        inverse[order] = np.arange(n)
        self.inverse_order = inverse
        self.supernodes = len(nodes)

        firsts = np.array([f for f, _, _ in nodes], np.int64)
        ks = np.array([k for _, k, _ in nodes], np.int64)
        us = np.array([b.size for _, _, b in nodes], np.int64)
        column_node = np.repeat(np.arange(len(nodes)), ks)
        node_parent = np.array([column_node[b[0]] if b.size else -1 for _, _, b in nodes], np.int64)
        level = np.zeros(len(nodes), np.int64)
        for s in range(len(nodes)):  # children precede parents
            if node_parent[s] >= 0:
                level[node_parent[s]] = max(level[node_parent[s]], level[s] + 1)
        label, shapes = _classes(ks, us, level, _thresholds.SUPERNODAL_CLASSES)

        # Tasks: by level, then class; each class's batch size.
        classes = []
        for c, (k, u) in enumerate(shapes):
            counts = np.bincount(level[label == c], minlength=level.max() + 1)
            classes.append((k, u, _batch(counts[counts > 0], _block_cost(k, u))))
        self.classes = tuple(classes)
        task_class, task_level, task_members = [], [], []
        for lv in range(int(level.max(initial=-1)) + 1):
            for c, (_, _, batch) in enumerate(classes):
                members = np.flatnonzero((level == lv) & (label == c))
                for start in range(0, members.size, batch):
                    task_class.append(c)
                    task_level.append(lv)
                    task_members.append(members[start : start + batch])
        self.tasks = len(task_class)
        self.levels = int(level.max(initial=-1)) + 1
        # `level_starts[c, lv]`: the first of class `c`'s tasks at level `lv`
        level_starts = np.zeros((len(classes), self.levels + 1), np.int64)
        np.add.at(level_starts, (np.asarray(task_class, np.int64), np.asarray(task_level) + 1), 1)
        self.level_starts = np.cumsum(level_starts, axis=1).astype(np.int32)

        # Two flat buffers: the assembled fronts, each task's `batch` fronts of `f × f` in
        # task order, then one entry that receives the padding's writes; and the factor,
        # each task's `batch` blocks of columns `f × k` in task order.
        slot_of = np.zeros(len(nodes), np.int64)  # front offset of each supernode
        factor_of = np.zeros(len(nodes), np.int64)  # columns' offset of each supernode
        task_offset, task_factor_offset, task_index = [], [], []
        offset, factor_offset, per_class = 0, 0, [0] * len(classes)
        for c, members in zip(task_class, task_members, strict=True):
            k, u, batch = classes[c]
            f = k + u
            slot_of[members] = offset + np.arange(members.size) * f * f
            factor_of[members] = factor_offset + np.arange(members.size) * f * k
            task_offset.append(offset)
            task_factor_offset.append(factor_offset)
            task_index.append(per_class[c])
            per_class[c] += 1
            offset += batch * f * f
            factor_offset += batch * f * k
        self.buffer_size, self.factor_size = offset, factor_offset
        trash = offset
        front_size = np.array([classes[c][0] + classes[c][1] for c in label], np.int64)
        node_k = np.array([classes[c][0] for c in label], np.int64)

        def position(s, rows):  # where global rows sit in supernode s's front
            inside = rows < firsts[s] + ks[s]
            below = np.searchsorted(nodes[s][2], rows)
            return np.where(inside, rows - firsts[s], node_k[s] + below)

        # The matrix's entries into the fronts: each stored entry (halved off the diagonal)
        # at both of its places in the front of the supernode of its first column.
        pr, pc = inverse[pattern.rows], inverse[pattern.cols]
        low, high = np.minimum(pr, pc), np.maximum(pr, pc)
        s = column_node[low]
        entry_low = np.empty(pattern.nnz, np.int64)
        entry_high = np.empty(pattern.nnz, np.int64)
        by_node = np.argsort(s, kind="stable")
        bounds = np.searchsorted(s[by_node], np.arange(len(nodes) + 1))
        for node in range(len(nodes)):
            where = by_node[bounds[node] : bounds[node + 1]]
            entry_low[where] = position(node, low[where])
            entry_high[where] = position(node, high[where])
        f = front_size[s]
        self.entry_positions = np.concatenate(
            [slot_of[s] + entry_high * f + entry_low, slot_of[s] + entry_low * f + entry_high]
        )
        # Padding pivots: an identity, so that they factorize to ones and change nothing.
        ones, pivot_positions = [], np.empty(n, np.int64)
        for node in range(len(nodes)):
            k, f = node_k[node], front_size[node]
            diagonal = slot_of[node] + np.arange(k) * (f + 1)
            pivot_positions[firsts[node] : firsts[node] + ks[node]] = factor_of[node] + np.arange(
                ks[node]
            ) * (k + 1)
            ones.append(diagonal[ks[node] :])
        self.pivot_positions = pivot_positions

        # Per class, per task: the front offset; per supernode slot: where its update
        # matrix's rows go in the parent's front (flat: parent offset + row · f_parent + col),
        # and the rows of its pivots and update rows (for the substitutions). Padding reads
        # row `n` (a zero) and writes row `n + 1`; padding updates go to `trash`.
        tables = []
        for c, (k, u, batch) in enumerate(classes):
            count = per_class[c]
            tables.append(
                dict(
                    offset=np.zeros(count, np.int64),
                    factor_offset=np.zeros(count, np.int64),
                    parent_offset=np.full((count, batch), trash, np.int64),
                    parent_size=np.zeros((count, batch), np.int64),
                    update_map=np.full((count, batch, u), -1, np.int64),
                    pivots=np.full((count, batch, k), n, np.int64),
                    rows=np.full((count, batch, u), n, np.int64),
                )
            )
        padding_ones = []
        for t, (c, members) in enumerate(zip(task_class, task_members, strict=True)):
            k, u, batch = classes[c]
            f = k + u
            table, j = tables[c], task_index[t]
            table["offset"][j] = task_offset[t]
            table["factor_offset"][j] = task_factor_offset[t]
            for b in range(members.size, batch):
                start = task_offset[t] + b * f * f
                padding_ones.append(start + np.arange(k) * (f + 1))
            for b, node in enumerate(members):
                below = nodes[node][2]
                table["pivots"][j, b, : ks[node]] = np.arange(firsts[node], firsts[node] + ks[node])
                table["rows"][j, b, : below.size] = below
                p = node_parent[node]
                if p >= 0:
                    table["parent_offset"][j, b] = slot_of[p]
                    table["parent_size"][j, b] = front_size[p]
                    table["update_map"][j, b, : below.size] = position(p, below)
        self.one_positions = np.concatenate(ones + padding_ones + [np.empty(0, np.int64)])
        index_type = np.int32 if max(offset, factor_offset, n) < 2**31 - 1 else np.int64
        self.tables = [
            {name: np.asarray(value, index_type) for name, value in table.items()}
            for table in tables
        ]
        self.factor_entries = int(
            sum(k * (k + 1) // 2 + k * u for k, u in zip(ks, us, strict=True))
        )
        self.flops = float(
            sum(
                batch * _block_cost(classes[c][0], classes[c][1]) + _TASK_OVERHEAD
                for c in task_class
                for batch in [classes[c][2]]
            )
        )

    def factor(self, matrix: SparseMatrix) -> "SupernodalFactor":
        """[`supernodal_factor`][] on this plan."""
        return supernodal_factor(matrix, self)

    def solve(self, matrix: SparseMatrix, rhs: Array) -> tuple[Array, Array]:
        """[`supernodal_solve`][] on this plan: `(A⁻¹ rhs, pivots)`."""
        return supernodal_solve(matrix, rhs, self)


@functools.lru_cache(maxsize=256)
def supernodal_plan(pattern: Pattern) -> SupernodalPlan | None:
    """A [`SupernodalPlan`][] for a symmetric pattern of at least `SUPERNODAL_MIN` rows,
    else `None`."""
    if pattern.shape[0] < _thresholds.SUPERNODAL_MIN:
        return None
    return SupernodalPlan(pattern)


@functools.lru_cache(maxsize=256)
def cholesky_plan(pattern: Pattern) -> BandedPlan | SupernodalPlan | None:
    """How a symmetric positive definite matrix on `pattern` is factorized: the banded plan
    where its half-bandwidth is below `SUPERNODAL_MIN_WIDTH`; else a [`SupernodalPlan`][]
    where its estimated work, times `SUPERNODAL_WORK_RATIO`, is below
    the banded factorization's (`size · (b + 1)²` for a half-bandwidth `b`) or, without a
    banded plan, the dense factorization's (`size³ / 3` times `DENSE_WORK_FACTOR`); else
    the `BandedPlan` of `banded_plan`, or `None` (dense)."""
    band = banded_plan(pattern)
    if band is not None and band.width < _thresholds.SUPERNODAL_MIN_WIDTH:
        return band  # no analysis for chains, ladders, narrow nets
    plan = supernodal_plan(pattern)
    if plan is None:
        return band
    size = pattern.shape[0]
    if band is not None:
        other = size * (band.width + 1) ** 2
    else:
        other = _thresholds.DENSE_WORK_FACTOR * size**3 / 3
    if plan.flops * _thresholds.SUPERNODAL_WORK_RATIO < other:
        return plan
    return band


# -- Numeric factorization and substitutions -----------------------------------------------


def _triangular(low: Array, rhs: Array, transpose: bool) -> Array:
    """`L⁻¹ rhs` (`L⁻ᵀ rhs` where `transpose`) for a batch of lower triangular `low`,
    `(batch, k, k)`, and `rhs`, `(batch, k, m)`."""
    return jax.lax.linalg.triangular_solve(
        low, rhs, left_side=True, lower=True, transpose_a=transpose
    )


def _cholesky(blocks: Array) -> Array:
    """Lower Cholesky factors of a batch of symmetric blocks (their lower triangles read);
    non-finite where a block is not positive definite. LAPACK's batched factorization at
    every size: unrolled factorizations of the small classes (`cholesky_factor`) would
    multiply the compile time for no gain at the sizes this path is chosen for."""
    return jax.lax.linalg.cholesky(blocks, symmetrize_input=False)


def _run_tasks(plan: SupernodalPlan, steps, carry, reverse: bool = False):
    """`carry` through `plan`'s tasks, level by level (from the root down where
    `reverse`): within a level, each class's tasks in a loop, task `j` of class `c`
    applying `steps[c](carry, j)`. The loops' bounds are data, so the program has one loop
    per class whatever the matrix; a task reads and writes the carry in place (a `switch`
    between the classes would copy it)."""
    starts = jnp.asarray(plan.level_starts)

    def level(i, carry):
        lv = plan.levels - 1 - i if reverse else i
        for c, step in enumerate(steps):
            carry = jax.lax.fori_loop(starts[c, lv], starts[c, lv + 1], step, carry)
        return carry

    return jax.lax.fori_loop(0, plan.levels, level, carry)


def extend_add(assembled: Array, table: dict, j: Array, update: Array, trash: int) -> Array:
    """`assembled` with task `j`'s update matrices, `(batch, u, u)`, added into their
    parents' fronts (the extend-add; padding and roots write to `trash`)."""
    rows = table["update_map"][j]
    parent = table["parent_offset"][j][:, None, None]
    index = parent + rows[:, :, None] * table["parent_size"][j][:, None, None]
    index = index + rows[:, None, :]
    valid = (rows[:, :, None] >= 0) & (rows[:, None, :] >= 0) & (parent < trash)
    return assembled.at[jnp.where(valid, index, trash)].add(update)


def _fronts(buffer: Array, offset: Array, batch: int, size: int) -> Array:
    return _columns(buffer, offset, batch, size, size)


def _columns(buffer: Array, offset: Array, batch: int, size: int, k: int) -> Array:
    return jax.lax.dynamic_slice_in_dim(buffer, offset, batch * size * k).reshape(batch, size, k)


class SupernodalFactor(eqx.Module):
    """The multifrontal Cholesky factorization `P A Pᵀ = L Lᵀ` of a symmetric positive
    definite sparse matrix on a [`SupernodalPlan`][] (see the module's docstring).

    **Fields:**

    - `fronts`: the flat buffer of the factor's columns: each supernode's `L₁₁` over `L₂₁`,
        padded to its class's `(k + u) × k`.
    - `matrix`: `A` (its products define the solve's derivative and transpose).
    - `plan`: the [`SupernodalPlan`][] (static).
    """

    fronts: Float[Array, " buffer"]
    matrix: SparseMatrix
    plan: SupernodalPlan = eqx.field(static=True)

    @property
    def pivots(self) -> Float[Array, " size"]:
        """The pivots `D` of `P A Pᵀ = L D Lᵀ` (`L` unit lower triangular), `L[j, j]²` in
        the elimination order: non-finite or not positive where `A` is not positive
        definite."""
        return take(self.fronts, self.plan.pivot_positions) ** 2

    def solve(self, rhs: Array, tangent: bool = False) -> Array:
        """`A⁻¹ rhs` for `rhs` of shape `(size,)` or `(size, m)`, as
        `jax.lax.custom_linear_solve` with [`substitutions`][SupernodalFactor.substitutions]:
        JAX transposes and differentiates it through `A`'s products (so whether or not
        `rhs` is a tangent; `tangent` is accepted for the interface of
        `BandedFactor.solve`)."""
        del tangent
        return _linear_solve(self, self.matrix, rhs)

    def substitutions(self, rhs: Array) -> Array:
        """`A⁻¹ rhs` by forward substitution level by level up the tree, back substitution
        down it (not differentiable: loops with bounds that are data)."""
        plan, fronts = self.plan, self.fronts
        n = plan.size
        columns = rhs[:, None] if rhs.ndim == 1 else rhs
        # rows `n` (read by padding: zero) and `n + 1` (written by padding)
        work = jnp.concatenate(
            [take(columns, plan.order), jnp.zeros((2, columns.shape[1]), columns.dtype)]
        )

        def written(index):
            return jnp.where(index == n, n + 1, index)

        def forward_step(c):
            k, u, batch = plan.classes[c]
            table = {name: jnp.asarray(v) for name, v in plan.tables[c].items()}

            def step(j, work):
                low = _columns(fronts, table["factor_offset"][j], batch, k + u, k)
                pivots = table["pivots"][j]
                x = work[pivots]
                y = _triangular(low[:, :k], x, False)
                work = work.at[written(pivots)].add(y - x)
                if u:
                    rows = table["rows"][j]
                    work = work.at[written(rows)].add(-(low[:, k:] @ y))
                return work

            return step

        def backward_step(c):
            k, u, batch = plan.classes[c]
            table = {name: jnp.asarray(v) for name, v in plan.tables[c].items()}

            def step(j, out):
                low = _columns(fronts, table["factor_offset"][j], batch, k + u, k)
                pivots = table["pivots"][j]
                z = work[pivots]
                if u:
                    z = z - jnp.swapaxes(low[:, k:], 1, 2) @ out[table["rows"][j]]
                x = _triangular(low[:, :k], z, True)
                return out.at[written(pivots)].add(x)

            return step

        count = len(plan.classes)
        work = _run_tasks(plan, [forward_step(c) for c in range(count)], work)
        out = _run_tasks(
            plan, [backward_step(c) for c in range(count)], jnp.zeros_like(work), reverse=True
        )
        out = take(out, plan.inverse_order)
        return out[:, 0] if rhs.ndim == 1 else out


def _linear_solve(factor: SupernodalFactor, matrix: SparseMatrix, rhs: Array) -> Array:
    """`A⁻¹ rhs` by `factor`'s substitutions, differentiated and transposed through the
    products with `(A + Aᵀ)/2` (what the factorization reads; `jax.lax.custom_linear_solve`,
    symmetric)."""

    def product(x):
        return 0.5 * (matrix.matvec(x) + matrix.rmatvec(x))

    matvec = product if rhs.ndim == 1 else jax.vmap(product, 1, 1)
    return jax.lax.custom_linear_solve(
        matvec, rhs, lambda _, r: factor.substitutions(r), symmetric=True
    )


def supernodal_factor(matrix: SparseMatrix, plan: SupernodalPlan) -> SupernodalFactor:
    """The multifrontal factorization of a symmetric positive definite `A` on `plan` (the
    symmetric part `(A + Aᵀ)/2` where the values are not symmetric). A matrix that is not
    positive definite gives non-finite entries, never an error. Not reverse-differentiable
    (loops with bounds that are data): [`supernodal_solve`][] differentiates the solve
    implicitly."""
    values = matrix.values
    trash = plan.buffer_size
    buffer = jnp.zeros(plan.buffer_size + 1, values.dtype)
    buffer = buffer.at[plan.entry_positions].add(0.5 * jnp.concatenate([values, values]))
    buffer = buffer.at[plan.one_positions].add(1.0)

    def step_for(c):
        k, u, batch = plan.classes[c]
        f = k + u
        table = {name: jnp.asarray(v) for name, v in plan.tables[c].items()}

        def step(j, buffers):
            # Two buffers, so that no step reads what it writes (XLA would copy a buffer
            # read by an operation after it is written in place): the assembled fronts
            # (read here, children's updates added to their parents'), and the factor's
            # columns (written).
            assembled, factored = buffers
            offset = table["offset"][j]
            fronts = _fronts(assembled, offset, batch, f)
            low = _cholesky(fronts[:, :k, :k])
            if u:
                below = jnp.swapaxes(
                    _triangular(low, jnp.swapaxes(fronts[:, k:, :k], 1, 2), False), 1, 2
                )
                update = fronts[:, k:, k:] - below @ jnp.swapaxes(below, 1, 2)
                columns = jnp.concatenate([low, below], axis=1)
                assembled = extend_add(assembled, table, j, update, trash)
            else:
                columns = low
            factored = jax.lax.dynamic_update_slice_in_dim(
                factored, columns.reshape(-1), table["factor_offset"][j], 0
            )
            return assembled, factored

        return step

    _, buffer = _run_tasks(
        plan,
        [step_for(c) for c in range(len(plan.classes))],
        (buffer, jnp.zeros(plan.factor_size, values.dtype)),
    )
    return SupernodalFactor(buffer, matrix, plan)


def supernodal_solve(matrix: SparseMatrix, rhs: Array, plan: SupernodalPlan) -> tuple[Array, Array]:
    """`(A⁻¹ rhs, pivots)` of a symmetric positive definite sparse `A` on `plan`; `rhs` of
    shape `(size,)` or `(size, m)`. The pivots (those of [`SupernodalFactor`][]) are a
    diagnostic, not differentiated (zero tangents).

    Differentiated implicitly, `d(A⁻¹ r) = A⁻¹ (dr − dA A⁻¹ r)`, with the factorization of
    the solve (`jax.lax.custom_linear_solve`): a derivative costs a solve with the same
    factor, not the derivative of the factorization."""
    frozen = SparseMatrix(jax.lax.stop_gradient(matrix.values), matrix.pattern)
    factor = supernodal_factor(frozen, plan)
    return _linear_solve(factor, matrix, rhs), factor.pivots
