"""The scan's cost against a dense sweep, for three ranges.

For each range: `matmul-drift scan` with its default grid (20 intervals per alignment class),
then the same scan with --step 1 (every size). Prints the evaluations, the dense count, their
ratio, the periodic segments found, and whether the default scan states the dense sweep's
state (kernels, drift zero or not) at every size, i.e. found every flip, and if not, where.

    python scripts/bench_scan.py
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from matmul_drift import cli_scan, scan

RANGES = [
    ["--vary", "n", "--range", "960:1100", "--m", "1", "--k", "4096", "--dtype", "float32"],
    ["--vary", "n", "--range", "1:2048", "--m", "1", "--k", "4096", "--dtype", "float32"],
    ["--vary", "k", "--range", "1:12000", "--m", "1", "--n", "8", "--dtype", "float16"],
]


def states(rec: dict) -> dict[int, tuple]:
    """Size -> (kernel-id, drift) as the record states it, from its class regions."""
    out = {}
    for r in rec["regions"]:
        for size in range(r["lo"], r["hi"] + 1):
            if scan.class_label(scan.size_class(size)) == r["class"]:
                out[size] = (r["kernel_id"], r["drift"])
    return out


def run(args: list[str], folder: Path, name: str) -> tuple[dict, float]:
    path = folder / name
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):  # the tables: only the figures are printed here
        rc = cli_scan.main([*args, "--json", str(path)])
    if rc != 0:
        raise SystemExit(f"scan {' '.join(args)} failed ({rc})")
    return json.loads(path.read_text()), time.monotonic() - t0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for i, args in enumerate(RANGES):
            rec, secs = run(args, Path(tmp), f"scan{i}.json")
            dense, dsecs = run([*args, "--step", "1"], Path(tmp), f"dense{i}.json")
            got, want = states(rec), states(dense)
            flips = sum(want[s] != want[s + 1] for s in range(min(want), max(want)))
            missed = [s for s in want if got.get(s) != want[s]]
            print(f"{' '.join(args[:4])}: {rec['evaluations']} evaluations / {dense['evaluations']} dense = "
                  f"{rec['evaluations'] / dense['evaluations']:.1%} ({secs:.0f} s vs {dsecs:.0f} s); "
                  f"dense flips {flips}; every size stated as dense: {not missed}"
                  + (f" (not at {len(missed)} sizes: {missed[:10]})" if missed else "") + "; "
                  f"periodic segments {sum(seg['periodic'] for seg in rec['pattern'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
