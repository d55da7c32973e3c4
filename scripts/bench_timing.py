"""explain's `seconds` against torch.utils.benchmark, for four fp32 shapes, one thread and two.

For each shape and thread count: `matmul-drift explain --json` in a fresh process (its
threads set by OMP_NUM_THREADS), then Timer.blocked_autorange here on a product of the
same shape, dtype and layout at the same thread count. Prints both medians, explain's IQR
and run count, and their ratio; the target is a ratio within 1/1.3 .. 1.3.

    python scripts/bench_timing.py            # the four shapes
    python scripts/bench_timing.py --quick    # the three smaller ones
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch.utils.benchmark import Timer

SHAPES = [(8, 64, 16), (64, 512, 256), (256, 1024, 1024), (2048, 4096, 4096)]


def explain_seconds(m: int, k: int, n: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "explain", "--m", str(m),
                        "--k", str(k), "--n", str(n), "--dtype", "float32", "--json"],
                       capture_output=True, text=True, env=env)
    if p.returncode not in (0, 1):
        raise SystemExit(f"explain {m}x{k}x{n} failed: {p.stderr.strip()}")
    return json.loads(p.stdout)["seconds"]


def timer_seconds(m: int, k: int, n: int, threads: int) -> float:
    a, b = torch.rand(m, k), torch.rand(k, n)
    return Timer("a @ b", globals={"a": a, "b": b},
                 num_threads=threads).blocked_autorange(min_run_time=1.0).median


def main(quick: bool = False) -> int:
    shapes = SHAPES[:3] if quick else SHAPES
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'shape':>16} {'thr':>3} {'explain median':>15} {'IQR':>10} {'runs':>5} "
          f"{'Timer median':>13} {'ratio':>6}")
    worst = 1.0
    for m, k, n in shapes:
        for threads in (1, 2):
            s = explain_seconds(m, k, n, threads)
            t = timer_seconds(m, k, n, threads)
            ratio = s["median"] / t
            worst = max(worst, ratio, 1 / ratio)
            flag = " noisy" if s["noisy"] else ""
            print(f"{f'{m}x{k}x{n}':>16} {threads:>3} {s['median']:>15.4g} {s['iqr']:>10.3g} "
                  f"{s['runs']:>5} {t:>13.4g} {ratio:>6.3f}{flag}", flush=True)
    print(f"worst ratio {worst:.3f} (target ≤ 1.3)")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the three smaller shapes")
    sys.exit(main(ap.parse_args().quick))
