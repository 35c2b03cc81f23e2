"""What jaxdae must know of the installed jaxlib: releases whose kernels misbehave in ways
that jaxdae's programs must route around."""

import importlib.metadata
import itertools


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: `"0.10.2"` → `(0, 10, 2)`."""
    numbers = []
    for part in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def lapack_batches_can_deadlock(jaxlib_version: str) -> bool:
    """Whether this jaxlib's CPU LAPACK kernels can deadlock on a large batch.

    From 0.10.0 up to 0.11.0, a batched LAPACK call with enough work splits its batch into
    tasks on XLA:CPU's intra-op thread pool and blocks its own pool thread until they are
    done. When the program runs as many such calls at once as the pool has threads (two
    independent solves on a 2-core machine), every thread waits for tasks that no thread is
    free to run, and the program never finishes. Later releases run the batch on the calling
    thread."""
    return (0, 10) <= _version(jaxlib_version) < (0, 11, 1)


LAPACK_BATCHES_CAN_DEADLOCK = lapack_batches_can_deadlock(importlib.metadata.version("jaxlib"))
