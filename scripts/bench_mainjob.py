"""What does the main job cost, and where does its time go? Runs it (`matmul-drift run --force`,
both builds by default; extra arguments go to it) and prints, for each build, from that run:

- its wall time (seconds), and of it: setup_cache's measuring (the exact reference's share),
  order probes, fix finder and batch-invariance maps, with how many trees, fix verdicts and
  maps were reused and from which commit (the suite's "matmul-drift cost:" line); the timing
  and track benchmarks (asv's durations); and asv's own overhead, the rest (environment,
  install, discovery, processes);
- the whole run's wall time.

--twice: runs it first with nothing reused ($MATMUL_DRIFT_REUSE=0), then again reusing the
first run's trees, verdicts and maps (what a night at a new commit with nothing changed does),
and prints the second's wall time over the first's; for each build, its orders, fixes and maps
(what reuse spares) and the rest (what every night measures again), second over first.
$MATMUL_DRIFT_MAPS=0 (and the suite's other switches) reach the main job as they are: run it
with and without to see what the maps cost.
--parameters: also measures setup_cache one parameter at a time in this Python (torch needed)
and prints the most expensive ones.

    python scripts/bench_mainjob.py [--twice] [--parameters] [--torch 2.13.0] [...]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# maps optional: no maps before the suite mapped
COST = re.compile(r"torch (\S+): matmul-drift cost: measuring ([\d.]+) s "
                  r"\(exact reference ([\d.]+) s\), "
                  r"orders ([\d.]+) s \((\d+) reused\), fixes ([\d.]+) s \((\d+) reused\)"
                  r"(?:, maps ([\d.]+) s \((\d+) reused\))?; (.*)$")
BUILD = re.compile(r"torch (\S+): recorded: (.*?)(?: \(asv exit status.*)? \((\d+) s\)$")


def run_once(argv: list[str], reuse: bool) -> tuple[float, str] | None:
    env = {**os.environ,
           "MATMUL_DRIFT_REUSE": os.environ.get("MATMUL_DRIFT_REUSE", "") if reuse else "0"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "run", "--force", *argv],
                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        return None
    return wall, p.stderr


def report(title: str, wall: float, stderr: str) -> dict[str, tuple[float, float]]:
    """Prints the run's costs; returns {build: (its seconds, its orders + fixes + maps seconds)}."""
    print(f"{title}: wall {wall:.1f} s")
    parts = {}
    costs = {m.group(1): m for m in map(COST.search, stderr.splitlines()) if m}
    for m in filter(None, map(BUILD.search, stderr.splitlines())):
        build, files, seconds = m.group(1), m.group(2).split(", "), float(m.group(3))
        benches = 0.0
        for f in files:
            d = json.loads((ROOT / f).read_text())
            col = d["result_columns"].index("duration")
            benches += sum(r[col] or 0.0 for r in d["results"].values() if len(r) > col)
        c = costs.get(build)
        if c is None:
            print(f"  torch {build}: {seconds:.0f} s; no cost line (a setup_cache of an older "
                  "suite?)")
            continue
        measuring, reference, orders, fixes = (float(c.group(i)) for i in (2, 3, 4, 6))
        maps = float(c.group(8) or 0.0)
        setup = measuring + orders + fixes + maps
        parts[build] = (seconds, orders + fixes + maps)
        print(f"  torch {build}: {seconds:.0f} s = setup_cache {setup:.1f} s (measuring "
              f"{measuring:.1f} s, of it exact reference {reference:.1f} s; orders {orders:.1f} s, "
              f"{c.group(5)} reused; fixes {fixes:.1f} s, {c.group(7)} reused; maps {maps:.1f} s, "
              f"{c.group(9) or 0} reused, {100 * maps / seconds:.1f}% of the build; {c.group(10)}) "
              f"+ benchmarks {benches:.1f} s + asv's own {seconds - setup - benches:.1f} s")
    return parts


def parameters() -> None:
    try:
        import torch  # noqa: F401  the main job's own Python needs none; this part does
    except ImportError:
        print("most expensive parameters: not measured (no torch in this Python: pip install "
              "torch==2.13.0)")
        return
    from matmul_drift.core import cases
    from matmul_drift.jobs import suite

    log = io.StringIO()
    suite.measure_all(devices=("cpu",), precisions=cases.DTYPES,
                      root=ROOT / ".asv" / "bench-catalog", log=log)
    costs, prev = [], 0.0
    for line in log.getvalue().splitlines():
        m = re.match(r"\[\d+/\d+\s+([\d.]+)s\] (.*): ok", line)
        if m:
            costs.append((float(m.group(1)) - prev, f"setup_cache {m.group(2)}"))
            prev = float(m.group(1))
    costs.sort(reverse=True)
    total = sum(c for c, _ in costs)
    print(f"most expensive parameters (of {total:.1f} s measured per parameter):")
    for c, what in costs[:6]:
        print(f"  {c:7.2f} s  {100 * c / total:5.1f}%  {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--twice", action="store_true", help="afresh, then reusing the first run")
    ap.add_argument("--parameters", action="store_true",
                    help="the most expensive setup_cache parameters too")
    args, rest = ap.parse_known_args()
    first = run_once(rest, reuse=not args.twice)
    if first is None:
        return 1
    before = report("main job" + (" afresh ($MATMUL_DRIFT_REUSE=0)" if args.twice else ""), *first)
    if args.twice:
        second = run_once(rest, reuse=True)
        if second is None:
            return 1
        after = report("main job again, reusing the first", *second)
        print(f"second / first wall time: {second[0] / first[0]:.2f}")
        # What reuse can save (orders, fixes, maps) apart from what every night measures again.
        for build in sorted(before.keys() & after.keys()):
            (b, bp), (a, ap) = before[build], after[build]
            print(f"  torch {build}: second / first {a / b:.2f}; orders, fixes and maps "
                  f"{ap:.1f} s / {bp:.1f} s = {ap / bp if bp else float('nan'):.2f}; "
                  f"the rest {a - ap:.1f} s / {b - bp:.1f} s")
    if args.parameters:
        parameters()
    return 0


if __name__ == "__main__":
    sys.exit(main())
