"""`matmul-drift summary`: flag kernel, invariance, accuracy and timing changes in the asv history.

Exit status: 0 when nothing of a --fail-on kind was flagged, 1 when something was, 2 for a
usage error or unreadable input (one line on stderr). Warnings (a bad results file, a
missing catalog entry) go to stderr; the readable rest is still summarised. Never imports torch.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

from matmul_drift.cli.args import folder, say_error
from matmul_drift.read import flags, history, render, summary
from matmul_drift.store import atomic

PROG = "matmul-drift summary"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the summary's arguments to ``parser`` (a subcommand parser of matmul-drift)."""
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("results_dir", nargs="?", default="results", metavar="RESULTS_DIR",
                        type=folder,
                        help="results/ (asv results in results/asv, catalog in results/catalog), "
                             "or asv's results dir itself (catalog then at ../catalog); default: "
                             "results")
    parser.add_argument("--machine", metavar="NAME", help="only this asv machine")
    parser.add_argument("--across", choices=summary.ACROSS, default=None,
                        help="commits: neighbouring commits in one environment; envs: neighbouring "
                             "torch versions at one commit; both (default); "
                             "machines: one commit and environment on two machines or hardwares "
                             "(never compared otherwise)")
    parser.add_argument("--base", metavar="REF", help="compare only this commit (hash prefix) ...")
    parser.add_argument("--head", metavar="REF",
                        help="... with this one, environment by environment")
    parser.add_argument("--at", metavar="REF",
                        help="only what changed at this commit: its torch builds "
                        "side by side, and each against the machine's previous commit")
    parser.add_argument("--format", choices=render.FORMATS, default="plain",
                        help="plain tables (default), github Markdown, or json (schema: "
                             "matmul_drift.read.render)")
    parser.add_argument("--fail-on", metavar="KINDS", default=None,
                        help=f"comma list of {', '.join(flags.KINDS)}, or none, or all; default: "
                             f"{','.join(k for k in flags.KINDS if k in summary.DEFAULT_FAIL_ON)}")
    parser.add_argument("--output", metavar="FILE",
                        help="write the report to this new file (never over one that exists) "
                             "instead of stdout")
    parser.add_argument("--catalog", metavar="DIR",
                        help="catalog directory (default: beside the asv results)")
    parser.add_argument("--u-tolerance", type=float, default=summary.DEFAULT_U_TOLERANCE,
                        metavar="F",
                        help="flag error_u when it grows or shrinks by more than this factor "
                             f"(default {summary.DEFAULT_U_TOLERANCE:g}: "
                             "identical kernels give identical bits, so any change is a new route; "
                             "2x keeps tiny reorderings out)")
    parser.add_argument("--ulp-growth", type=float, default=summary.DEFAULT_ULP_GROWTH, metavar="F",
                        help=f"report non-zero ulp drift that grows by more than this factor "
                             f"(informational; default {summary.DEFAULT_ULP_GROWTH:g})")
    parser.add_argument("--time-factor", type=float, default=summary.DEFAULT_TIME_FACTOR,
                        metavar="F",
                        help="suspect a time whose ratio exceeds this factor and whose 99%% CIs "
                             f"are apart (default {summary.DEFAULT_TIME_FACTOR:g}, as asv compare)")
    parser.add_argument("--timing", choices=summary.TIMING, default="evidence",
                        help="evidence (default): flag a suspected time only on evidence across "
                             "runs (a re-measurement, or the next run); suspects: every suspect "
                             "not yet re-measured")


def _error(message: str) -> int:
    say_error(PROG, message)
    return 2


def _warn(warnings: list[str]) -> None:
    """Each warning once, in the order met (a missing catalog entry can be asked for twice), on
    one line: names from results trees (an env name, a file's) hold any character, and their
    newlines and escape sequences would forge lines or drive the terminal (as say_error)."""
    for w in dict.fromkeys(warnings):
        print(f"{PROG}: warning: {render.visible(w)}", file=sys.stderr)


def _output_problem(path: str) -> str | None:
    """Why ``--output`` cannot be written, checked before anything is read: a file that exists is
    never replaced (it may be a results file); a device such as /dev/null is written to."""
    if not path:
        return "--output: the name is empty"
    if _is_device(path):
        return None
    if os.path.lexists(path):
        return f"--output {path} exists; remove it or choose another name"
    problem = atomic.folder_problem(path)
    return problem and f"--output {path}: {problem}"


def _is_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _write_output(path: str, text: str) -> None:
    if _is_device(path):  # /dev/null, /dev/stdout
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:  # whole or not at all, and never over a file made since the check
        atomic.write_new(path, text.encode("utf-8"))


def run(args: argparse.Namespace) -> int:
    """Run the summary for parsed ``args``; returns the exit status."""
    problem = _output_problem(args.output) if args.output is not None else None
    # else a warning per id
    if args.catalog is not None and not (args.catalog and Path(args.catalog).is_dir()):
        problem = f"--catalog {args.catalog or repr('')} is not a directory"
    if problem:
        return _error(problem)
    try:
        fail_on = summary.parse_fail_on(args.fail_on)
        options = summary.Options(
            across=args.across or "both", base=args.base, head=args.head, at=args.at,
            u_tolerance=args.u_tolerance, ulp_growth=args.ulp_growth, time_factor=args.time_factor,
            timing=args.timing,
        )
        options.check()
        hist = history.read_history(args.results_dir, machine=args.machine, catalog=args.catalog)
        result = summary.summarise(hist, options)
    except history.HistoryError as exc:
        _warn(exc.warnings)
        return _error(str(exc))
    text = render.render(result, args.format, fail_on)
    _warn(result.warnings)
    if args.output is not None:
        try:
            _write_output(args.output, text)
        except atomic.Taken as exc:
            return _error(f"{args.output} appeared meanwhile and is left as it is; the report is "
                          f"in {exc.kept}")
        except OSError as exc:
            return _error(f"cannot write {args.output}: {exc.strerror}")
    else:
        sys.stdout.write(text)
    return 1 if result.failing(fail_on) else 0
