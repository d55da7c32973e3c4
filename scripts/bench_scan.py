"""The scan's cost against a dense sweep, for three ranges.

For each range: `matmul-drift scan` with its default grid (20 intervals per alignment class),
then the same scan with --step 1 (every size). Prints the evaluations, the dense count, their
ratio, the periodic segments found, and whether the default scan states the dense sweep's
state (kernels, drift zero or not) at every size, i.e. found every flip, and if not, where.

A size where the two disagree is measured again with other inputs (the same shape, drawn
with other seeds). Where the scan's state holds for some of them, the dense sweep's inputs
happened to round alike there (one tail column computed in another order can still give the
same bits): a coincidence of values, not a route the search missed. Where it holds for none,
the search missed a flip.

    python scripts/bench_scan.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from matmul_drift.cli.main import main as cli_main
from matmul_drift.core import cases
from matmul_drift.measure import measure
from matmul_drift.probes import classsearch

SEEDS = range(1, 6)  # other draws for the sizes where scan and dense disagree

# A scan too small to count, run first: the first scan in a process pays its one-time costs
# (lazy imports, the profiler's set-up: 2.6 s here), which would otherwise land on the first range.
WARM_UP = ["--vary", "n", "--range", "1:4", "--m", "1", "--k", "64", "--dtype", "float32"]

RANGES = [
    ["--vary", "n", "--range", "960:1100", "--m", "1", "--k", "4096", "--dtype", "float32"],
    ["--vary", "n", "--range", "1:2048", "--m", "1", "--k", "4096", "--dtype", "float32"],
    ["--vary", "k", "--range", "1:12000", "--m", "1", "--n", "8", "--dtype", "float16"],
]


def states(rec: dict) -> dict[int, tuple]:
    """Size -> (kernel-id, drift non-zero) as the record states it, from its class regions
    (as classsearch.region_key puts it; drift None where there is none, along k)."""
    out = {}
    for r in rec["regions"]:
        for size in range(r["lo"], r["hi"] + 1):
            if classsearch.class_label(classsearch.size_class(size)) == r["class"]:
                out[size] = (r["kernel_id"], {"non-zero": True, "zero": False}.get(r["drift"]))
    return out


def run(args: list[str], folder: Path, name: str) -> tuple[dict, float]:
    path = folder / name
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):  # the tables: only the figures are printed here
        rc = cli_main(["scan", *args, "--json", str(path)])
    if rc != 0:
        raise SystemExit(f"scan {' '.join(args)} failed ({rc})")
    return json.loads(path.read_text()), time.monotonic() - t0


def other_draws(args: list[str], sizes: list[int], stated: dict[int, tuple]) -> dict[int, int]:
    """For each size, how many of the other draws give the state the scan stated there."""
    opt = dict(zip(args[::2], args[1::2]))
    vary, top = opt["--vary"], int(opt["--range"].split(":")[1])
    dims = {d: int(opt[f"--{d}"]) for d in "mkn" if d != vary} | {vary: top}
    dtype = opt["--dtype"]
    held = dict.fromkeys(sizes, 0)
    for seed in SEEDS:
        case = cases.adhoc(dims["m"], dims["k"], dims["n"])
        a, b, _ = measure.operand_bits(case, dtype, "cpu", seed=seed, with_checksum=False)
        ops = measure.make_operands(a, b, dtype, "cpu", case)
        full = None if vary == "k" else measure.top_product(ops)
        for size in sizes:
            p = measure.scan_point(ops, vary, size, full, dtype=dtype, device="cpu")
            held[size] += classsearch.region_key(p) == stated[size]
    return held


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        run(WARM_UP, Path(tmp), "warm-up.json")
        for i, args in enumerate(RANGES):
            rec, secs = run(args, Path(tmp), f"scan{i}.json")
            dense, dsecs = run([*args, "--step", "1"], Path(tmp), f"dense{i}.json")
            got, want = states(rec), states(dense)
            flips = sum(want[s] != want[s + 1] for s in range(min(want), max(want)))
            missed = [s for s in want if got.get(s) != want[s]]
            print(f"{' '.join(args[:4])}: {rec['evaluations']} evaluations / "
                  f"{dense['evaluations']} dense = {rec['evaluations'] / dense['evaluations']:.1%} "
                  f"({secs:.1f} s vs {dsecs:.1f} s); dense flips {flips}; every size stated as "
                  f"dense: {not missed}"
                  + (f" (not at {len(missed)} sizes: {missed[:10]})" if missed else "") + "; "
                  f"periodic segments {sum(seg['periodic'] for seg in rec['pattern'])}", flush=True)
            if missed:
                held = other_draws(args, missed[:10], got)
                for size, n in held.items():
                    print(f"  at {size}: the scan states {got[size]}, the dense sweep "
                          f"{want[size]}; {n} of {len(SEEDS)} other draws give the scan's state: "
                          + ("values coincide, not a missed route" if n else "a missed flip"),
                          flush=True)
    return 0


if __name__ == "__main__":
    # --help, before minutes of measuring
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
