"""The memory estimate against what explain and scan use, measured in one run.

Runs `matmul-drift explain` on four shapes (outputs few and B wide, A tall, outputs many, all
alike) in float16, float32 and float64, one with --try-fixes (explain and the processes it
starts, their resident sizes summed: a shape whose first row drifts here, so that explain, a
setting's process and the default's timer run at once; a budget of 20 s), one of float64 files
whose |A||B| overflows float64 everywhere, two scans (along n and along k) and three order
probes (with --verify; their trees go to a temporary catalog), each in a process of its own;
prints its peak resident size (memory.peak_bytes), the estimate (memory.bytes_needed,
which explain and scan check before they start; memory.probe_bytes of Target.probe_sizes for
order) and their ratio.
A ratio above 1 means the estimate is too low: the check could let through a shape that
then runs out of memory. Took 2 min 3 s on 2 cores (Intel Xeon with AMX); on an AMD EPYC Zen 4
(no native fp16: torch's own loop) its first three explains alone took 10 min.

    python scripts/bench_memory.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from matmul_drift.measure import memory

SHAPES = [(64, 4096, 46000), (46000, 4096, 64), (4096, 256, 4096), (2048, 2048, 4096)]
DTYPES = ["float16", "float32", "float64"]
# drifts in slice_m on the Xeon: three processes at once (1254 MiB)
FIXES = (1024, 2048, 2048, "float32")
# A ~ N(0, 1)·2^1000, B ~ N(0, 1)·2^18: |A||B| beyond float64, the exact values within
OVERFLOWS = (4096, 256, 4096)
SCANS = [  # (vary, lo, hi, fixed dims, dtype)
    ("n", 44000, 46000, {"m": 64, "k": 4096}, "float16"),
    ("k", 4000, 6000, {"m": 8192, "n": 64}, "float64"),
]
ORDERS = [  # the seed's slice (probes in 45952 columns), a copied slice, outputs many in float64
    ["--case", "seed", "--slice-n", "45999", "--dtype", "float16"],
    ["--case", "slice-n-copy", "--slice-n", "1000", "--dtype", "float32"],
    ["--m", "4096", "--k", "256", "--n", "4096", "--dtype", "float64"],
]


def peak_bytes(args: list[str], env: dict | None = None, ok=(0,)) -> int:
    """The peak resident size (bytes) of `matmul-drift ARGS` in a process of its own."""
    rc, peak, err = memory.peak_bytes(args, env)
    if rc not in ok:
        raise SystemExit(f"matmul-drift {' '.join(args)} failed ({rc}): {err.strip()[-500:]}")
    return peak


def show(label: str, peak: int, need: int) -> float:
    print(f"{label:<44} peak {peak / 2**20:7.0f} MiB  estimate {need / 2**20:7.0f} MiB  "
          f"peak/estimate {peak / need:.2f}", flush=True)
    return peak / need


def _order_target(args: list[str]):
    from matmul_drift.cli import main as cli
    from matmul_drift.cli import order as cli_order

    return cli_order._target(cli.build_parser().parse_args(["order", *args]))


def main() -> int:
    ratios = []
    for m, k, n in SHAPES:
        for dtype in DTYPES:
            peak = peak_bytes(["explain", "--m", str(m), "--k", str(k), "--n", str(n),
                               "--dtype", dtype])
            ratios.append(show(f"explain {m} x {k} x {n} {dtype}", peak,
                               memory.bytes_needed(m, k, n, dtype, "cpu")[0]))
    m, k, n, dtype = FIXES
    peak = peak_bytes(["explain", "--m", str(m), "--k", str(k), "--n", str(n), "--dtype", dtype,
                       "--try-fixes", "--fix-budget", "20"], ok=(0, 1))
    ratios.append(show(f"explain --try-fixes {m} x {k} x {n} {dtype}", peak,
                       memory.bytes_needed(m, k, n, dtype, "cpu", fixes=True)[0]))
    with tempfile.TemporaryDirectory() as tmp:
        # float64 files whose |A||B| ~ 2^1025 overflows everywhere: the reference's scaled copy
        m, k, n = OVERFLOWS
        g = np.random.default_rng(0)
        np.save(os.path.join(tmp, "a.npy"), np.ldexp(g.standard_normal((m, k)), 1000))
        np.save(os.path.join(tmp, "b.npy"), np.ldexp(g.standard_normal((k, n)), 18))
        peak = peak_bytes(["explain", "--a", os.path.join(tmp, "a.npy"),
                           "--b", os.path.join(tmp, "b.npy"), "--dtype",
                           "float64", "--slice-n", str(n - 1), "--slice-m", "1"], ok=(0, 1))
        ratios.append(show(f"explain --a/--b {m} x {k} x {n} float64 |A||B| > 2^1024", peak,
                           memory.bytes_needed(m, k, n, "float64", "cpu")[0]))
        for vary, lo, hi, fixed, dtype in SCANS:
            dims = {**fixed, vary: hi}
            fixed_args = [a for d, v in fixed.items() for a in (f"--{d}", str(v))]
            peak = peak_bytes(["scan", "--vary", vary, "--range", f"{lo}:{hi}", *fixed_args,
                               "--dtype", dtype, "--step", str((hi - lo) // 2),
                               "--json", os.path.join(tmp, f"{vary}.json")])
            need = memory.bytes_needed(dims["m"], dims["k"], dims["n"], dtype, "cpu",
                                       prefix_a=vary == "k")[0]
            ratios.append(show(f"scan {vary} {lo}:{hi} {fixed} {dtype}", peak, need))
        env = {**os.environ, "MATMUL_DRIFT_CATALOG": tmp}
        for args in ORDERS:  # 1: not revealed on this route, measured all the same
            peak = peak_bytes(["order", *args, "--verify"], env, ok=(0, 1))
            ratios.append(show(f"order {' '.join(args)}", peak,
                               memory.probe_bytes(**_order_target(args).probe_sizes())[0]))
    print(f"largest peak/estimate {max(ratios):.2f} (above 1: the estimate is too low)")
    return 0


if __name__ == "__main__":
    # --help, before minutes of measuring
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
