"""The host's element-wise work at GPU sizes: in one piece against in blocks, on one core and all.

Drawing and rounding the seed's inputs (A 4096, B 4096 x 51000: 209 M entries) and the
numerics of one 8192 x 8192 output (error, nonfinite, drift with no entry moved and with
one in 8 moved), as `explain` and the suite do them on a GPU machine's host. Each is timed
in three ways, taken in turn, --repeat times:
  whole    one block and one thread: full-size temporaries, as before blocks.py
  blocks   blocks of blocks.SIZE entries on one thread
  threads  blocks on every core (blocks.workers())
Prints each way's median in seconds and whole / threads. All three give the same answers
(tests/test_numerics.py and tests/test_inputs.py hold that); this checks it too.

    python scripts/bench_blocks.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time

import numpy as np

from matmul_drift.core import blocks, numerics
from matmul_drift.measure import inputs

WAYS = ("whole", "blocks", "threads")


def configure(way: str, size: int):
    blocks.SIZE = size if way == "whole" else DEFAULT_SIZE
    blocks.workers = (lambda: 1) if way != "threads" else DEFAULT_WORKERS


def jobs():
    """(name, entries, callable) for each measured piece of work."""
    seed = inputs.draw(1, "bench:B", (4096, 51000))
    n = 8192 * 8192
    rng = np.random.default_rng(0)
    hi = rng.standard_normal(n) * 64
    c = hi.astype(np.float32).astype(np.float64)  # a float32 product of that exact value
    moved = c.copy()
    moved[::8] = np.nextafter(c[::8].astype(np.float32), np.float32(np.inf)).astype(np.float64)
    lo, absprod, finite = np.zeros(n), np.abs(hi) * 2, np.ones(n, dtype=bool)
    cb, mb = c.astype(np.float32).view(np.uint32), moved.astype(np.float32).view(np.uint32)
    same = cb.copy()
    yield "draw B", seed.size, lambda: inputs.draw(1, "bench:B", (4096, 51000))
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        yield f"round B to {dtype}", seed.size, lambda dtype=dtype: inputs.round_bits(seed, dtype)
    yield "error", n, lambda: numerics.error(c, hi, lo, finite, absprod, "float32", 8192)
    yield "nonfinite", n, lambda: numerics.nonfinite(c, hi, finite, "float32")
    yield "drift, none moved", n, lambda: numerics.drift(cb, same, c, c, absprod, "float32", 8192)
    yield "drift, 1 in 8 moved", n, lambda: numerics.drift(cb, mb, c, moved, absprod,
                                                           "float32", 8192)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {DEFAULT_WORKERS()} cores, blocks of {DEFAULT_SIZE} entries, "
          f"{args.repeat} rounds, median seconds")
    print(f"{'work':>22} {'entries':>10} " + " ".join(f"{w:>8}" for w in WAYS)
          + f" {'whole/threads':>14}")
    for name, size, run in jobs():
        times = {w: [] for w in WAYS}
        answers = {}
        for _ in range(args.repeat):
            for way in WAYS:
                configure(way, size)
                t0 = time.perf_counter()
                got = run()
                times[way].append(time.perf_counter() - t0)
                answers[way] = (hashlib.sha256(got).hexdigest() if isinstance(got, np.ndarray)
                                else repr(got))
                del got
        configure("threads", size)
        if len(set(answers.values())) != 1:
            print(f"{name}: the three ways disagree", file=sys.stderr)
            return 1
        med = {w: statistics.median(times[w]) for w in WAYS}
        print(f"{name:>22} {size:>10} " + " ".join(f"{med[w]:>8.3f}" for w in WAYS)
              + f" {med['whole'] / med['threads']:>14.2f}", flush=True)
    return 0


DEFAULT_SIZE, DEFAULT_WORKERS = blocks.SIZE, blocks.workers

if __name__ == "__main__":
    sys.exit(main())
