"""The order probe's cost on this CPU: entry (0, 0) of every full product of the CPU suite,
revealed and replayed as the suite does (order.order_of, each computation once), in one run. Prints per
combination the matmul calls against the issue's target 2K/N + 64 (N the probes a call holds)
and the stated bound rounds x ceil(2(K-1)c/N) (c the chunks of k the output is read in), the
seconds (target: under 60 s each), and the total.

    python scripts/bench_orders.py [--cases seed,skinny] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import sys
import time

from matmul_drift.core import cases
from matmul_drift.probes import order


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(cases.CASE_IDS))
    ap.add_argument("--dtypes", default=",".join(cases.DTYPES))
    a = ap.parse_args()
    total, worst, memo = 0.0, 0.0, {}
    print(f"{'case':<20} {'dtype':<9} {'K':>6} {'N':>6} {'calls':>5} {'2K/N+64':>7} {'bound':>6} {'s':>6}  order")
    for c in a.cases.split(","):
        for dtype in a.dtypes.split(","):
            t = order.target(cases.get(c), dtype, "cpu")
            t0 = time.perf_counter()
            got = order.order_of(t, memo=memo)
            s = time.perf_counter() - t0
            total, worst = total + s, max(worst, s)
            target = 2 * t.k // t.width + 64
            bound = order.expected_calls(t)
            words = got["summary"] if got["tree"] is not None else f"{got['summary']}: {got['reason']}"
            words = f"as {got['same_as']}: {words}" if "same_as" in got else words
            print(f"{c:<20} {dtype:<9} {t.k:>6} {t.width:>6} {got['calls']:>5} {target:>7} {bound:>6} {s:>6.1f}  "
                  f"{words[:90]}", flush=True)
    print(f"total {total:.1f} s; slowest {worst:.1f} s (target under 60 s each); "
          f"chunk sizes: fp16 {order.chunk_size('float16')}, bf16 {order.chunk_size('bfloat16')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
