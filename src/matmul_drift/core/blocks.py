"""Element-wise work over large flat arrays: in blocks, on every core.

A block's temporaries are small enough to come back from the heap, where full-size ones
are fresh pages each time: on an 8192 x 8192 output their page faults cost more than the
arithmetic. numpy releases the GIL inside its ufuncs, so threads run blocks side by side.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

SIZE = 1 << 20  # entries a block: 8 MiB of float64


def workers() -> int:
    """Threads to use: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def map_blocks(size: int, fn, block: int | None = None) -> list:
    """``[fn(s) for s in slices covering [0, size) in blocks]``, in order, on ``workers()``
    threads (``block`` entries each, default ``SIZE``). ``fn`` must not write what another
    block reads; an exception in one block is raised here."""
    block = SIZE if block is None else block
    parts = [slice(start, min(size, start + block)) for start in range(0, size, block)]
    n = min(workers(), len(parts))
    if n <= 1:
        return [fn(s) for s in parts]
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, parts))
