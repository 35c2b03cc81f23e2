"""Fill-reducing orderings of symmetric sparsity patterns for the sparse Cholesky
factorization (`_supernodal.py`), computed once per pattern in NumPy while tracing.

Nested dissection (George, "Nested dissection of a regular finite element mesh", SIAM J.
Numer. Anal. 10, 1973): a separator splits the graph into parts ordered first, the separator
last, recursively. METIS's multilevel nested dissection (Karypis and Kumar, 1998) through
`pymetis` where installed (the `sparse` extra); otherwise a separator from the middle level
of a breadth-first level structure rooted at a pseudo-peripheral node (George and Liu,
*Computer Solution of Large Sparse Positive Definite Systems*, 1981, ch. 8).
"""

import numpy as np

from ._sparse import Pattern

# Subgraphs up to this size end the nested dissection of the fallback ordering.
_DISSECTION_LEAF = 8


def adjacency(pattern: Pattern, order: np.ndarray | None = None):
    """CSR `(indptr, indices)` of the symmetrized pattern's graph, without self loops; with
    `order`, of the graph renumbered so that node `order[k]` becomes `k`."""
    n = pattern.shape[0]
    off = pattern.rows != pattern.cols
    rows, cols = pattern.rows[off], pattern.cols[off]
    if order is not None:
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        rows, cols = inverse[rows], inverse[cols]
    keys = np.unique(np.concatenate([rows * n + cols, cols * n + rows]))
    rows, cols = keys // n, keys % n
    return np.searchsorted(rows, np.arange(n + 1)).astype(np.int64), cols.astype(np.int64)


def _metis_order(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray | None:
    try:
        import pymetis
    except ImportError:
        return None
    n = indptr.size - 1
    if indices.size == 0:
        return np.arange(n, dtype=np.int64)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis 2025.2 on
        graph = {"adjacency": pymetis.CSRAdjacency(indptr.tolist(), indices.tolist())}
    else:
        graph = {"xadj": indptr.tolist(), "adjncy": indices.tolist()}
    order, _ = pymetis.nested_dissection(**graph)
    return np.asarray(order, np.int64)


def _levels(indptr, indices, active, root):
    """Breadth-first level structure of the nodes `active` (a boolean mask) reachable from
    `root`: the list of levels (arrays of nodes)."""
    seen = ~active.copy()
    seen[root] = True
    levels, frontier = [], np.array([root], np.int64)
    while frontier.size:
        levels.append(frontier)
        starts, ends = indptr[frontier], indptr[frontier + 1]
        counts = ends - starts
        if counts.sum() == 0:
            break
        neighbours = indices[np.repeat(ends - counts.cumsum(), counts) + np.arange(counts.sum())]
        neighbours = np.unique(neighbours[~seen[neighbours]])
        seen[neighbours] = True
        frontier = neighbours
    return levels


def _dissection_order(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Nested dissection by level-structure separators (George 1973; George and Liu 1981):
    each connected subgraph larger than `_DISSECTION_LEAF` is split at the middle level of
    a breadth-first level structure from a pseudo-peripheral node, thinned to the nodes
    that touch the far side; the two sides are ordered first, the separator last."""
    n = indptr.size - 1
    degree = np.diff(indptr)
    order = np.empty(n, np.int64)
    end = n  # `order[:end]` is still to be filled; separators fill it from the back
    stack = [np.arange(n, dtype=np.int64)]
    active = np.zeros(n, bool)
    while stack:
        nodes = stack.pop()
        active[nodes] = True
        remaining = nodes
        parts = []
        while remaining.size:  # connected components
            start = remaining[np.argmin(degree[remaining])]
            levels = _levels(indptr, indices, active, start)
            for _ in range(4):  # pseudo-peripheral node (George and Liu's search)
                last = levels[-1]
                candidate = last[np.argmin(degree[last])]
                deeper = _levels(indptr, indices, active, candidate)
                if len(deeper) <= len(levels):
                    break
                levels = deeper
            component = np.concatenate(levels)
            active[component] = False
            remaining = remaining[active[remaining]]
            active[remaining] = True
            parts.append(levels)
        active[nodes] = False
        for levels in parts:
            component = np.concatenate(levels)
            if component.size <= _DISSECTION_LEAF or len(levels) < 3:
                order[end - component.size : end] = component
                end -= component.size
                continue
            sizes = np.cumsum([level.size for level in levels])
            middle = int(np.searchsorted(sizes, sizes[-1] / 2))
            middle = min(max(middle, 1), len(levels) - 2)
            upper = np.concatenate(levels[middle + 1 :])
            level = levels[middle]
            touches = np.zeros(n, bool)
            touches[upper] = True
            # keep the separator's nodes with a neighbour on the far side
            counts = degree[level]
            owner = np.repeat(np.arange(level.size), counts)
            neighbour = indices[
                np.repeat(indptr[level], counts)
                + np.arange(counts.sum())
                - np.repeat(np.cumsum(counts) - counts, counts)
            ]
            keep = np.zeros(level.size, bool)
            keep[owner[touches[neighbour]]] = True
            separator = level[keep]
            lower = np.concatenate([*levels[:middle], level[~keep]])
            order[end - separator.size : end] = separator
            end -= separator.size
            stack.append(lower)
            stack.append(upper)
    return order


def fill_reducing_order(pattern: Pattern) -> np.ndarray:
    """A fill-reducing elimination order of a symmetric pattern (`order[k]`: the `k`-th row
    eliminated): METIS's nested dissection where `pymetis` is installed, the level-structure
    nested dissection of `_dissection_order` otherwise."""
    indptr, indices = adjacency(pattern)
    order = _metis_order(indptr, indices)
    return _dissection_order(indptr, indices) if order is None else order
