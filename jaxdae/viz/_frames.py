"""The frames of an animation or a playback: one member of a solution, its saved states
interpolated at the frames' times."""

import numpy as np

from .._gains import is_concrete


def member_states(solution, member) -> tuple[np.ndarray, np.ndarray]:
    """`(ts (N,), q (N, n))` of one member of a (possibly batched) solution, without the
    rows after a failure (`inf`)."""
    if not is_concrete(solution.ts, solution.q):
        raise ValueError(
            "Drawing reads a concrete solution: pass the solution returned outside `jax.jit` "
            "and `jax.vmap` (return the solution from the compiled function, then draw it)."
        )
    ts, q = np.asarray(solution.ts, dtype=float), np.asarray(solution.q, dtype=float)
    batch = q.shape[:-2]
    if q.ndim < 2 or ts.shape[-1] != q.shape[-2]:
        raise ValueError(
            f"`solution` must have `ts` (N,) and `q` (N, n) (with leading batch axes for a "
            f"batch); got shapes {ts.shape} and {q.shape}."
        )
    if batch:
        if member is None:
            raise ValueError(
                f"`solution` holds a batch of shape {batch}: pick the member to show with "
                f"`member=` (an index, or a tuple of {len(batch)} indices)."
            )
        index = member_index(member, batch)
        q = q[index]
        ts = ts[index[: ts.ndim - 1]] if ts.ndim > 1 else ts
    elif member is not None:
        raise ValueError("`member=` picks one solution of a batch; this solution is not one.")
    finite = np.isfinite(ts) & np.all(np.isfinite(q), axis=-1)
    if not np.any(finite):
        raise ValueError("`solution` has no finite saved state to show.")
    return ts[finite], q[finite]


def member_index(member, batch: tuple[int, ...]) -> tuple[int, ...]:
    """`member` as one integer index per batch axis, each within its axis (negative ones
    count from the end, as in NumPy)."""
    flat = np.atleast_1d(np.asarray(member))
    if flat.shape != (len(batch),) or not np.issubdtype(flat.dtype, np.integer):
        raise ValueError(
            f"`member={member!r}` does not index the batch of shape {batch}: pass "
            f"{'an integer' if len(batch) == 1 else f'a tuple of {len(batch)} integers'}, "
            "e.g. `member=0`."
        )
    index = tuple(int(i) for i in flat)
    for axis, (i, size) in enumerate(zip(index, batch, strict=True)):
        if not -size <= i < size:
            raise ValueError(
                f"`member={member!r}` is out of range: axis {axis} of the batch of shape "
                f"{batch} has {size} members, so pick an index from 0 to {size - 1}."
            )
    return index


def check_fps(fps) -> float:
    """`fps` as a float, refused unless it is a finite positive number."""
    try:
        value = float(fps)
    except (TypeError, ValueError):
        value = float("nan")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(
            f"`fps` must be a finite positive number of frames per second, e.g. fps=30; "
            f"got {fps!r}."
        )
    return value


def resample(ts, q, frames, fps):
    """The frame times and `q` there, interpolated linearly between the saved states."""
    if frames is None:  # real time
        frames = int(round((ts[-1] - ts[0]) * fps)) + 1
    if isinstance(frames, int | np.integer):
        if frames < 1:
            raise ValueError(f"`frames` must be a positive integer; got {frames}.")
        times = np.linspace(ts[0], ts[-1], int(frames))
    else:
        times = np.asarray(frames, dtype=float)
        if times.ndim != 1 or times.size == 0 or not np.all(np.isfinite(times)):
            raise ValueError(
                "`frames` must be a number of frames, or the frames' times as a "
                f"1-D array (e.g. `sol.ts`); got {frames!r}."
            )
    if ts.size == 1:
        return times, np.repeat(q, times.size, axis=0)
    return times, np.stack([np.interp(times, ts, column) for column in q.T], axis=-1)


def frame_states(solution, member, frames, fps) -> tuple[np.ndarray, np.ndarray]:
    """The frames' times and coordinates of `solution` (its member `member` where it is a
    batch): `frames` equally spaced frames (default: `fps` per simulated second, real time)
    or the frames' times as an array, the saved states interpolated linearly."""
    return resample(*member_states(solution, member), frames, fps)
