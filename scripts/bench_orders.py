"""The order probe's cost on this CPU: entry (0, 0) of every full product of the CPU suite,
revealed and replayed as the suite does (order.order_of, each computation once), in one run. Prints
per combination the matmul calls against the issue's target 2K/N + 64 (N the probes a call holds)
and the stated bound rounds x ceil(2(K-1)c/N) (c the chunks of k the output is read in), the
seconds (target: under 60 s each), and the total.

--compare: each combination also probed one row a call (fp16 and bf16 chunks not spread over
rows: order.spread_rows forced to 1), with its calls and seconds, and whether the two trees are
the same. --slices: the case's slices too (explain's targets), after its full product.

    python scripts/bench_orders.py [--cases seed,skinny] [--dtypes float32,bfloat16]
        [--compare] [--slices]
"""

from __future__ import annotations

import argparse
import sys
import time

from matmul_drift.core import cases
from matmul_drift.probes import order, order_plan


def probe(t, memo: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    got = order.order_of(t, memo=memo)
    return got, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(cases.CASE_IDS))
    ap.add_argument("--dtypes", default=",".join(cases.DTYPES))
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--slices", action="store_true")
    a = ap.parse_args()
    total, worst, memo, one_memo, spread_rows, one_total = 0.0, 0.0, {}, {}, order.spread_rows, 0.0
    print(f"{'case':<36} {'dtype':<9} {'K':>6} {'N':>6} {'calls':>5} {'2K/N+64':>7} "
          f"{'bound':>6} {'s':>6}  "
          + ("one row: calls, s, same tree  " if a.compare else "") + "order-id      order")
    for c in a.cases.split(","):
        case = cases.get(c)
        for dtype, sn, sm in [(d, sn, sm) for d in a.dtypes.split(",") for sn, sm in
                              [(None, None),
                               *(((n, None) for n in case.slice_n) if a.slices else ()),
                               *(((None, m) for m in case.slice_m) if a.slices else ())]]:
            t = order_plan.target(case, dtype, "cpu", sn, sm)
            if order_plan.over_budget(t):
                print(f"{t.label:<36} {dtype:<9} {t.k:>6} {t.width:>6}  "
                      f"not probed: {order_plan.over_budget(t)}", flush=True)
                continue
            got, s = probe(t, memo)
            total, worst = total + s, max(worst, s)
            target = 2 * t.k // t.width + 64
            bound = order_plan.expected_calls(t)
            words = (got["summary"] if got["tree"] is not None
                     else f"{got['summary']}: {got['reason']}")
            words = (f"as {got['same_as']}: {words}" if "same_as" in got else
                     f"{got['adopted']}'s tree: {words}" if "adopted" in got else words)
            one = ""
            if a.compare:
                order.spread_rows = lambda t: 1
                try:
                    o, os_ = probe(t, one_memo)
                finally:
                    order.spread_rows = spread_rows
                one_total += os_
                one = (f"{o['calls']:>5} {os_:>6.1f} "
                       f"{'same' if o['order_id'] == got['order_id'] else 'DIFFERENT'}  ")
            print(f"{t.label:<36} {dtype:<9} {t.k:>6} {t.width:>6} {got['calls']:>5} {target:>7} "
                  f"{bound:>6} {s:>6.1f}  {one}{got['order_id'] or '-':<12}  {words[:80]}",
                  flush=True)
    print(f"total {total:.1f} s" + (f" (one row: {one_total:.1f} s)" if a.compare else "") +
          f"; slowest {worst:.1f} s (target under 60 s each); chunk sizes: fp16 "
          f"{order_plan.chunk_size('float16')}, bf16 {order_plan.chunk_size('bfloat16')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
