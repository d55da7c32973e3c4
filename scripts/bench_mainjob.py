"""How efficient is the main job? Runs it once (`matmul-drift run --force`, both builds by
default; extra arguments go to it), then prints, from that one run:

- the main job's wall time (seconds);
- the summed benchmark time: what asv recorded for each build (setup_cache plus every
  benchmark's duration), in seconds;
- their ratio (the suite's efficiency: the rest is installing, discovering, publishing);
- the most expensive parameters, so that no single one dominates: for setup_cache each
  case x dtype measured in this Python (torch needed; the same code asv runs), and for
  time_matmul the samples asv took times their mean.

    python scripts/bench_mainjob.py [--torch 2.13.0] [...]
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "run", "--force", *argv], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        return p.returncode
    files = [ROOT / f for f in re.findall(r"recorded: (results/asv/\S+\.json)", p.stderr)]
    print(f"main job: wall {wall:.1f} s for {len(files)} torch builds ({' '.join(argv) or 'defaults'})")
    summed = 0.0
    costs = []
    for f in files:
        d = json.loads(f.read_text())
        cols = d["result_columns"]
        setup = sum(d.get("durations", {}).values())
        benches = 0.0
        for name, row in d["results"].items():
            r = dict(zip(cols, row))
            benches += r.get("duration") or 0.0
            if r.get("stats_repeat"):  # timing: samples x mean per parameter
                for combo, mean, n in zip(itertools.product(*r["params"]), r["result"], r["stats_repeat"]):
                    if mean is not None and n and mean == mean:
                        costs.append((mean * n, f"{d['params']['torch']} {name} {' '.join(combo)}"))
        summed += setup + benches
        print(f"  torch {d['params']['torch']}: {setup + benches:.1f} s of benchmarks "
              f"(setup_cache {setup:.1f} s, {len(d['results'])} benchmarks {benches:.1f} s)")
    print(f"summed benchmark time {summed:.1f} s; efficiency (summed / wall) {summed / wall:.2f}")

    # setup_cache, parameter by parameter, as asv's setup_cache runs it
    try:
        import torch  # noqa: F401  the main job's own Python needs none; this part does
    except ImportError:
        print("most expensive parameters: not measured (no torch in this Python: pip install torch==2.13.0)")
        return 0
    from matmul_drift.core import cases
    from matmul_drift.jobs import suite

    log = io.StringIO()
    suite.measure_all(devices=("cpu",), precisions=cases.DTYPES, root=ROOT / ".asv" / "bench-catalog", log=log)
    prev = 0.0
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
    return 0


if __name__ == "__main__":
    # its own --help; every other argument goes to matmul-drift run
    sys.exit(main(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_known_args()[1]))
