"""The fix finder's cost: `explain --try-fixes` against a plain `explain` of the same case
(fp32, A 2048x4096, B 4096x1024, slice_m 5 by default), each timed once as the user runs it.
Prints both wall times and their ratio (the target is at most 10).

``--load``: instead, how steady a time ratio is under load: with a CPU burner on one core,
the ratio of "pad m to a multiple of 4" to the default computation (fp32 64x512x256,
A[:1] @ B), estimated ``--repeats`` times in one process, the old way (the default timed
once, first; each candidate later, alone) and as the fix finder does now (fixrun.paired:
rounds beside the default). Prints each estimate, their range and its max/min.

    python scripts/bench_fixes.py [--m 2048 --k 4096 --n 1024 --slice-m 5] [--load [--repeats 8]]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def wall(args: list[str]) -> float:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "explain", *args],
                       capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"explain {' '.join(args)} failed: {p.stderr.strip().splitlines()[-1:]}")
    return time.monotonic() - t0


def under_load(repeats: int) -> None:
    import numpy as np

    from matmul_drift.measure import measure
    from matmul_drift.probes import fixrun

    burner = subprocess.Popen([sys.executable, "-c",
                               "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
    try:
        spec = {"m": 64, "k": 512, "n": 256, "dtype": "float32", "device": "cpu", "slice_m": [1]}
        case, ops = fixrun.operands(spec)
        ops.product()  # as in the fix finder's processes: the full product ran before any timing
        default, pad = (fixrun.timed_calls(ops, case, spec, code, {"slice_m"})
                        for code in (None, "pad:m:4"))
        both = {"old": [], "new": []}
        took = {"old": 0.0, "new": 0.0}
        # the old way: once, first
        base = measure.time_call(lambda: [c() for c in default], "cpu")["median"]
        for _ in range(repeats):
            t0 = time.monotonic()
            both["old"].append(measure.time_call(lambda: [c() for c in pad], "cpu")["median"]
                               / base)
            t1 = time.monotonic()
            both["new"].append(fixrun.paired(pad, lambda: fixrun._round(default, "cpu")["median"],
                                             "cpu", fixrun.ROUNDS)["time_ratio"])
            took["old"], took["new"] = took["old"] + t1 - t0, took["new"] + time.monotonic() - t1
        for way, what in (("old", "the default timed once, first"),
                          ("new", "paired rounds beside the default")):
            v = np.array(both[way])
            print(f"{way} ({what}): " + " ".join(f"{x:.3g}" for x in v)
                  + f"; range {v.min():.3g}..{v.max():.3g}, max/min {v.max() / v.min():.3g}, "
                  f"{took[way] / repeats:.2f} s per estimate")
    finally:
        burner.kill()
        burner.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for d, v in (("m", 2048), ("k", 4096), ("n", 1024), ("slice-m", 5)):
        ap.add_argument(f"--{d}", type=int, default=v)
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--repeats", type=int, default=8)
    a = ap.parse_args()
    if a.load:
        print(f"pad m to a multiple of 4 over A[:1] @ B (fp32 64x512x256), {a.repeats} estimates, "
              "a CPU burner on core 0:")
        under_load(a.repeats)
        return 0
    case = ["--m", str(a.m), "--k", str(a.k), "--n", str(a.n), "--slice-m", str(a.slice_m),
            "--dtype", "float32"]
    plain = wall(case)
    fixes = wall([*case, "--try-fixes"])
    print(f"explain {a.m}x{a.k}x{a.n} fp32 slice_m {a.slice_m}: plain {plain:.1f} s, --try-fixes "
          f"{fixes:.1f} s, ratio {fixes / plain:.1f} (target at most 10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
