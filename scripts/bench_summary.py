"""How long `matmul-drift summary` takes over a long synthetic history, and how it scales.

Builds (in a temporary directory) 365 commits x 3 environments x 300 parameter sets, in the
asv layout tests/asv_fixtures.py writes, with a kernel change and a timing step now and then,
then times the whole summary (read, judge, render) at 1x and 4x that many commits.
The budget is 5 s at 1x; the 4x/1x ratio should be about 4 (linear).

    python scripts/bench_summary.py [--commits 365] [--scales 1,4] [--repeat 3]
                                    [--builds 3] [--machines 1] [--keep DIR]

``--machines 3 --builds 2`` is a year of nights on three machines, two torch builds each;
``--keep DIR`` leaves the trees there, for timing another checkout's summary on them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

import asv_fixtures as F  # noqa: E402

from matmul_drift.cli.main import main as cli_main  # noqa: E402
from matmul_drift.store import catalog  # noqa: E402

CASES = tuple(f"case{k:02d}" for k in range(25))  # 25 cases x 6 dtypes x 2 devices = 300
TORCH = ("2.12.0", "2.13.0", "2.14.1")
BUDGET_S = 5.0


def build(root: Path, n_commits: int, builds: int = len(TORCH),
          machine: str = "synthetic") -> F.Tree:
    cat = root / "results" / "catalog"
    new_kernel = catalog.store(cat, "kernels", {"device": "cuda", "full": [
        "aten::matmul", "aten::mm", "nvjet_sm90_tst_384x8_64x4_2x1_v_bz_TNT"]})

    def adjust(ci: int, ei: int, data: dict) -> None:
        # Something to report: every 73rd commit one environment picks another kernel for
        # one combination and one time steps up by half, with its stats.
        if ci % 73 == 72 and ei == ci % 3:
            F.set_value(data, F.KERNEL, 1, new_kernel)
            F.set_value(data, F.TIME, 2, F.get_value(data, F.TIME, 2) * 1.5)
            for k, f in (("stats_ci_99_a", 1.45), ("stats_ci_99_b", 1.55)):
                row = data["results"][F.TIME]
                row[F.COL[k]] = list(row[F.COL[k]])
                row[F.COL[k]][2] = F.get_value(data, F.TIME, 2) / 1.5 * f

    return F.write_tree(root / "results", n_commits=n_commits, torch_versions=TORCH[:builds],
                        cases=CASES, devices=("cpu", "cuda"), adjust=adjust, machine=machine)


def time_summary(results: Path, repeat: int) -> tuple[list[float], int]:
    times, rc = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        rc = cli_main(["summary", str(results), "--output", os.devnull])
        times.append(time.perf_counter() - t0)
    return times, rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=365)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--builds", type=int, default=len(TORCH), choices=range(1, len(TORCH) + 1))
    ap.add_argument("--machines", type=int, default=1)
    ap.add_argument("--keep", metavar="DIR", help="build the trees in DIR and leave them there")
    args = ap.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",")]
    best = {}
    with tempfile.TemporaryDirectory(prefix="bench-summary-") as tmp:
        for scale in scales:
            root = Path(args.keep or tmp) / f"x{scale}"
            n = args.commits * scale
            t0 = time.perf_counter()
            trees = [build(root, n, args.builds, f"synthetic-{m}") for m in range(args.machines)]
            built = time.perf_counter() - t0
            files = [p for tree in trees for p in tree.files]
            size = sum(p.stat().st_size for p in files) / 1e6
            times, rc = time_summary(trees[0].root, args.repeat)
            best[scale] = min(times)
            print(f"{scale}x: {args.machines} machines x {n} commits x {args.builds} envs x "
                  f"{len(trees[0].combos)} params = "
                  f"{len(files)} files, {size:.0f} MB (built in {built:.1f} s); summary "
                  f"{', '.join(f'{t:.2f}' for t in times)} s (best {best[scale]:.2f} s), exit {rc}")
    if 1 in best:
        print(f"1x best {best[1]:.2f} s: {'within' if best[1] <= BUDGET_S else 'OVER'} the "
              f"{BUDGET_S:g} s budget")
        for s in scales:
            if s != 1:
                print(f"{s}x/1x ratio: {best[s] / best[1]:.2f} (linear would be {s})")
    return 0 if best.get(1, 0) <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
