"""The fix finder's cost: `explain --try-fixes` against a plain `explain` of the same case
(fp32, A 2048x4096, B 4096x1024, slice_m 5 by default), each timed once as the user runs it.
Prints both wall times and their ratio (the target is at most 10).

    python scripts/bench_fixes.py [--m 2048 --k 4096 --n 1024 --slice-m 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def wall(args: list[str]) -> float:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "explain", *args], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"explain {' '.join(args)} failed: {p.stderr.strip().splitlines()[-1:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    for d, v in (("m", 2048), ("k", 4096), ("n", 1024), ("slice-m", 5)):
        ap.add_argument(f"--{d}", type=int, default=v)
    a = ap.parse_args()
    case = ["--m", str(a.m), "--k", str(a.k), "--n", str(a.n), "--slice-m", str(a.slice_m), "--dtype", "float32"]
    plain = wall(case)
    fixes = wall([*case, "--try-fixes"])
    print(f"explain {a.m}x{a.k}x{a.n} fp32 slice_m {a.slice_m}: plain {plain:.1f} s, --try-fixes {fixes:.1f} s, "
          f"ratio {fixes / plain:.1f} (target at most 10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
