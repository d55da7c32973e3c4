"""Import what scripts/gpu_check.sh brought back into results/ (matmul_drift.jobs.gpucheck):

    python scripts/import_gpu_check.py OUT/gpu-check.tar.gz [--results results] [--force]

The GPU machine's results land under its own machine name, their environment named after
the torch build that ran; `matmul-drift summary results/` and the site then show it like
any other machine. Exit 0, or 2 with one line when the archive is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matmul_drift.cli import main as cli
from matmul_drift.cli.args import Parser, folder
from matmul_drift.core.errors import UsageError
from matmul_drift.jobs import gpucheck

PROG = "import_gpu_check"


def main(argv: list[str] | None = None) -> int:
    return cli.guarded(lambda: _main(argv), PROG)


def _main(argv: list[str] | None) -> int:
    parser = Parser(prog=PROG, description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # errors: one line
    parser.add_argument("archive", type=Path,
                        help="gpu-check.tar.gz as the GPU machine's OUT brought it back")
    parser.add_argument("--results", type=folder,
                        default=Path(__file__).resolve().parents[1] / "results",
                        help="the results folder to import into (default: this checkout's "
                             "results/)")
    parser.add_argument("--force", action="store_true",
                        help="replace results already recorded (kept beside)")
    try:
        args = parser.parse_args(argv)
        done = gpucheck.import_archive(args.archive, args.results, args.force)
    except (UsageError, gpucheck.ImportRefused) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    for w in done.warnings:  # before the paths: a stdout whose reader left must not cost them
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    print(f"{PROG}: {len(done.written)} files into {args.results}", file=sys.stderr)
    for p in done.written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
