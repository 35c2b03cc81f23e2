"""The tree of a [`jaxdae.multibody.TreeMechanism`][]: which joints carry which bodies,
found once from the bodies and joints, and the static index arrays its dynamics use."""

from typing import NamedTuple

import numpy as np

from ._body import GROUND
from ._joint import ScrewMotion, SphericalMotion, tree_motion
from ._kinematics import split

SCREW, SPHERICAL, FLOATING = "screw", "spherical", "floating"
_QUATERNION = ("e0", "e1", "e2", "e3")


class Topology(NamedTuple):
    """The tree, found once from the bodies and joints (static).

    Bodies are processed in `order` (body slots), grouped by the kind of their joint, so that
    each of `groups` (`(kind, start, stop)`, positions in `order`) is evaluated as one batch;
    `jumps` are the rounds of pointer jumping that compose their poses along the paths
    (each round's index of the position whose transform comes first, `len(order)` for
    none). Per position: `parent` (a position, −1 the ground), `joint` (the tree joint's
    index in `joints`, −1 for a free body), `dofs` (the indices of its coordinates in `q`,
    padded with `n`). `ancestors[i][k]` is 1 where position `i` is on the path from the
    ground to position `k` (itself included). `closures` are the joints that close loops."""

    order: tuple[int, ...]
    kinds: tuple[str, ...]
    parent: tuple[int, ...]
    joint: tuple[int, ...]
    groups: tuple[tuple[str, int, int], ...]
    jumps: tuple[tuple[int, ...], ...]
    dofs: tuple[tuple[int, ...], ...]
    ancestors: tuple[tuple[int, ...], ...]
    closures: tuple[int, ...]
    num_coordinates: int
    coordinate_names: tuple[str, ...]
    joint_offsets: tuple[tuple[str, int, int], ...]


def _tree_kind(joint) -> str | None:
    """The kind of the bodies `joint` carries (`tree_motion`), None where it closes loops."""
    motion = tree_motion(joint)
    if isinstance(motion, ScrewMotion):
        return SCREW
    if isinstance(motion, SphericalMotion):
        return SPHERICAL
    return None


def find_topology(bodies, joints, joint_names) -> Topology:
    """The spanning tree from the ground: a joint that can carry a body (`tree_motion`:
    revolute, prismatic, fixed, spherical, and the joints registered there) whose marker `a` is on a
    body already reached (or the ground) and `b` on a new one carries that body; a body that no such
    joint reaches is free (a floating base); the other joints close loops."""
    slot = {b.name: i for i, b in enumerate(bodies)}
    reached = {GROUND: -1}
    carrier = [-1] * len(bodies)
    parent_slot = [-1] * len(bodies)
    kinds = [FLOATING] * len(bodies)
    depth = [0] * len(bodies)
    used: set[int] = set()
    pending = list(range(len(bodies)))
    while pending:
        grew = True
        while grew:
            grew = False
            for index, joint in enumerate(joints):
                kind = _tree_kind(joint)
                body_a, body_b = split(joint.a)[0], split(joint.b)[0]
                if index in used or kind is None:
                    continue
                if body_a in reached and body_b not in reached:
                    b = slot[body_b]
                    reached[body_b] = b
                    carrier[b], parent_slot[b], kinds[b] = index, reached[body_a], kind
                    depth[b] = 0 if body_a == GROUND else depth[slot[body_a]] + 1
                    used.add(index)
                    grew = True
        pending = [b for b in range(len(bodies)) if bodies[b].name not in reached]
        for index, joint in enumerate(joints):
            body_a, body_b = split(joint.a)[0], split(joint.b)[0]
            if (
                _tree_kind(joint) is not None
                and body_b in reached
                and body_b != GROUND
                and body_a not in reached
            ):
                raise ValueError(
                    f"Joint {joint_names[index]!r} reaches body {body_a!r} from its marker "
                    f"`b` ({joint.b!r}): in a TreeMechanism a tree joint's marker `a` is on "
                    "the body nearer the ground. Swap `a` and `b` (the joint coordinate "
                    "changes sign)."
                )
        if pending:  # a free body: its own root
            reached[bodies[pending[0]].name] = pending[0]
    # coordinates: the free bodies', then the tree joints' in the order of `joints`
    names, offsets, body_dofs = [], [], {}
    for b in range(len(bodies)):
        if kinds[b] == FLOATING:
            body_dofs[b] = tuple(range(len(names), len(names) + 7))
            names += [f"{bodies[b].name}.{c}" for c in ("x", "y", "z") + _QUATERNION]
    for index, joint in enumerate(joints):
        if index not in used:
            continue
        b = slot[split(joint.b)[0]]
        motion = tree_motion(joint)
        size = 4 if isinstance(motion, SphericalMotion) else motion.num_coordinates
        body_dofs[b] = tuple(range(len(names), len(names) + size))
        offsets.append((joint_names[index], len(names), size))
        names += (
            [f"{joint_names[index]}.{c}" for c in _QUATERNION]
            if size == 4
            else [joint_names[index]] * size
        )
    # positions: by kind (floating, screw, spherical), then in the order of the coordinates
    # (where each body has one coordinate, per-body arrays are then `q`'s order, no gather)
    rank = {FLOATING: 0, SCREW: 1, SPHERICAL: 2}
    order = sorted(
        range(len(bodies)),
        key=lambda b: (
            rank[kinds[b]],
            body_dofs[b][0] if body_dofs[b] else len(names),
            depth[b],
            b,
        ),
    )
    position = {b: i for i, b in enumerate(order)}
    groups, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or kinds[order[i]] != kinds[order[start]]:
            groups.append((kinds[order[start]], start, i))
            start = i
    n = len(names)
    width = max([len(d) for d in body_dofs.values()] + [1])
    dofs = tuple(tuple(body_dofs[b]) + (n,) * (width - len(body_dofs[b])) for b in order)
    parent = tuple(-1 if parent_slot[b] < 0 else position[parent_slot[b]] for b in order)
    ancestors = np.eye(len(order), dtype=int)
    for k in range(len(order)):
        i = parent[k]
        while i >= 0:
            ancestors[i, k] = 1
            i = parent[i]
    closures = tuple(i for i in range(len(joints)) if i not in used)
    jumps, pointer = [], list(parent)
    while any(i >= 0 for i in pointer):
        jumps.append(tuple(len(order) if i < 0 else i for i in pointer))
        pointer = [-1 if i < 0 else pointer[i] for i in pointer]
    return Topology(
        tuple(order),
        tuple(kinds[b] for b in order),
        parent,
        tuple(carrier[b] for b in order),
        tuple(groups),
        tuple(jumps),
        dofs,
        tuple(map(tuple, ancestors.tolist())),
        closures,
        n,
        tuple(names),
        tuple(offsets),
    )
