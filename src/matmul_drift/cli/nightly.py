"""`matmul-drift nightly`: one night of the nightly job on one machine, or the merge of nights.

    matmul-drift nightly --python PY --machine NAME [--date D] [--force] [--remote R] ...
    matmul-drift nightly --merge [SRC ...] [--remote R] ...

Exit status: 0 when the night (or merge) was recorded and published, flagged changes and
failed benchmark values included (both are reported); 1 when it could not be recorded or
published; 2 for bad input, a night already recorded (without --force) or a tree locked by
another run (one line on stderr). Torch is imported only by the Python under test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from matmul_drift.cli.args import bench_regex, folder, os_error, say_error
from matmul_drift.core.errors import UsageError
from matmul_drift.jobs import merge, nightly, resultsbranch, selection

PROG = "matmul-drift nightly"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the nightly's arguments to ``parser`` (a subcommand parser of matmul-drift)."""
    parser.description = __doc__.splitlines()[0]
    run = parser.add_argument_group("one night")
    run.add_argument("--python", metavar="PY", help="the Python holding the torch build under test "
                     "(with asv and matmul-drift installed); asv runs in it as an existing "
                     "environment")
    run.add_argument("--machine", metavar="NAME",
                     help="asv machine name: results go to results/asv/NAME/")
    run.add_argument("--bench", metavar="REGEX", action="append", default=[], type=bench_regex,
                     help="only benchmarks matching REGEX (asv run --bench; repeatable)")
    run.add_argument("--quick", action="store_true", help="asv run --quick")
    run.add_argument("--launch-method", choices=("spawn", "forkserver"), help="asv's launch method")
    parser.add_argument("--merge", nargs="*", metavar="SRC", type=folder,
                        help="merge these results trees or artifact folders (results/, summaries/, "
                             "nights/) into the tree, summarise every machine's latest night, "
                             "publish")
    parser.add_argument("--date", help="the night, YYYY-MM-DD (default: today, UTC)")
    parser.add_argument("--tree", type=folder, metavar="DIR",
                        help="the results worktree (default: REPO/nightly; created on the branch "
                             "if absent)")
    parser.add_argument("--repo", type=folder, metavar="DIR",
                        help="the project checkout: its asv.conf.json and benchmarks/ (default: "
                             "the one here)")
    parser.add_argument("--branch", default="results", help="the results branch (default: results)")
    parser.add_argument("--remote", metavar="NAME",
                        help="git remote shared by several machines: fetch before, push the commit "
                             "after")
    parser.add_argument("--no-push", dest="push", action="store_false",
                        help="fetch from --remote but push nothing (a CI matrix: the merge job "
                             "commits the night)")
    parser.add_argument("--force", action="store_true",
                        help="run a night that already has results again (the old files are kept "
                             "beside)")
    parser.add_argument("--no-publish", dest="publish", action="store_false",
                        help="skip asv publish")


def _error(message: str, status: int = 2) -> int:
    say_error(PROG, message)
    return status


def options(args: argparse.Namespace) -> nightly.Options:
    """Checked Options from parsed ``args``; UsageError names what is wrong."""
    merging = args.merge is not None
    if merging and (args.python or args.machine or args.bench or args.quick or args.launch_method):
        raise UsageError("--merge takes no --python, --machine, --bench, --quick or "
                         "--launch-method")
    if not merging and (not args.python or not args.machine):
        raise UsageError("give --python PY and --machine NAME for a night, or --merge [SRC ...]")
    try:
        resultsbranch.check_names(args.branch, args.remote)
        repo = resultsbranch.project_checkout(args.repo)
        if not merging:
            selection.read()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    python = None
    if not merging:
        found = shutil.which(args.python)
        if found is None:
            raise UsageError(f"--python {args.python}: no such executable")
        python = os.path.abspath(found)  # not resolved: a venv's python is a symlink to its base
    if not args.push and not args.remote:
        raise UsageError("--no-push needs --remote (what to fetch from)")
    for src in args.merge or []:
        if not src.is_dir():
            raise UsageError(f"--merge {src}: not a directory")
        # merged 0 files, and said nothing
        if src.name in merge.IMPORTED and not merge.holds_a_tree(src):
            raise UsageError(f"--merge {src}: a {src.name}/ folder itself; give the folder that "
                             f"holds it, --merge {src.parent}")
    return nightly.Options(
        machine=None if merging else nightly.check_machine(args.machine),
        date=(nightly.check_date(args.date, tonight=True) if args.date is not None
              else nightly.today()),
        tree=(args.tree or repo / "nightly").absolute(), repo=repo, python=python,
        branch=args.branch,
        remote=args.remote, push=args.push, force=args.force, bench=args.bench, quick=args.quick,
        launch_method=args.launch_method, publish=args.publish,
    )


def run(args: argparse.Namespace) -> int:
    """Run a night or a merge for parsed ``args``; returns the exit status."""
    try:
        o = options(args)
        if args.merge is not None:
            report = merge.run_merge(o, [p.resolve() for p in args.merge])
        else:
            report = nightly.run_night(o)
    except nightly.NightError as exc:
        return _error(str(exc), 1)
    # a full disk, a read-only tree: recorded files stay whole (atomic writes)
    except OSError as exc:
        return _error(os_error(exc), 1)
    sys.stdout.write(report.text)  # last: all is recorded, whether stdout takes it or not
    return 0
