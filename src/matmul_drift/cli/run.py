"""`matmul-drift run`: the main job, every torch build of the matrix side by side on this machine.

    matmul-drift run [--torch VERSION ...] [--force] [--bench REGEX] [--quick] ...

Exit status: 0 when every build was recorded (or already was, for some); 1 when a build
could not be installed or run (the others are still recorded, and each failure is one line)
or the site could not be built; 2 for bad input, or when every build is already recorded at
this commit (without --force).
"""

from __future__ import annotations

import argparse
import os
import sys

from matmul_drift.cli.args import bench_regex, folder, os_error, say_error
from matmul_drift.core.errors import UsageError
from matmul_drift.jobs import mainjob, resultsbranch, selection
from matmul_drift.jobs.nightly import check_machine

PROG = "matmul-drift run"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--torch", metavar="VERSION", action="append", default=[],
                        help="only this torch build (repeatable, or a comma list; default: every "
                             "build in asv.conf.json's matrix; the environment variable "
                             "TORCH_VERSION does the same)")
    parser.add_argument("--force", action="store_true",
                        help="measure builds already recorded at this commit again (the old files "
                             "are kept beside)")
    parser.add_argument("--bench", metavar="REGEX", action="append", default=[], type=bench_regex,
                        help="only benchmarks matching REGEX (asv run --bench; repeatable)")
    parser.add_argument("--quick", action="store_true", help="asv run --quick: one sample each")
    parser.add_argument("--launch-method", choices=("spawn", "forkserver"),
                        help="asv's launch method")
    parser.add_argument("--no-publish", dest="publish", action="store_false",
                        help="skip asv publish and the site")
    parser.add_argument("--machine", metavar="NAME",
                        help="asv machine name (default: named after this hardware, see "
                             "`matmul-drift machine`)")
    parser.add_argument("--repo", type=folder, metavar="DIR",
                        help="the project checkout (default: the one here)")


def _minutes(seconds: float) -> str:
    whole = round(seconds)  # rounded first: 179.6 s is 3m 00s, not 2m 60s
    return f"{whole // 60}m {whole % 60:02d}s"


def options(args: argparse.Namespace) -> mainjob.Options:
    try:
        repo = resultsbranch.project_checkout(args.repo)
        selection.read()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    given = args.torch or ([os.environ["TORCH_VERSION"]] if os.environ.get("TORCH_VERSION") else [])
    builds = [b for t in given for b in t.split(",") if b.strip()]
    if given and not builds:  # not every build of the matrix, silently
        where = "--torch" if args.torch else "$TORCH_VERSION"
        raise UsageError(f"{where} {','.join(given)!r} names no torch version (e.g. --torch "
                         "2.13.0,2.14.1)")
    if args.machine is not None:
        check_machine(args.machine)
    return mainjob.Options(repo=repo, builds=builds or None, force=args.force, bench=args.bench,
                           quick=args.quick, launch_method=args.launch_method, publish=args.publish,
                           machine=args.machine)


def run(args: argparse.Namespace) -> int:
    try:
        report = mainjob.run(options(args))
    except mainjob.JobError as exc:
        say_error(PROG, exc)
        return 1
    # a full disk, a read-only checkout: recorded files stay whole (atomic writes)
    except OSError as exc:
        say_error(PROG, os_error(exc))
        return 1
    parts = [f"torch {o.build} {o.status}" + (f" ({_minutes(o.seconds)})" if o.seconds else "")
             for o in report.outcomes]
    print(f"{PROG}: done in {_minutes(report.seconds)} on {report.machine} at {report.commit[:8]}: "
          f"{'; '.join(parts)}. Results under results/asv/{report.machine}/, site under html/ "
          "(drift.html names the kernels; `asv preview` serves it)", file=sys.stderr)
    for o in report.failed:
        say_error(PROG, f"torch {o.build}: {o.message}")
    return 1 if report.failed else 0
