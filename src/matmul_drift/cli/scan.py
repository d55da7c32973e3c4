"""`matmul-drift scan`: where along one dimension do the kernels or the drift change?

Varies n, m or k over LO:HI with the other two fixed, measures each size the way
`explain` measures a slice, and searches each alignment class down to exact boundaries
(probes/scan.py; the driver is probes/scan_run.py: this module parses and prints).
Prints a table of regions and boundaries; --json FILE keeps every evaluated point
(rewritten atomically after each one, so --resume FILE continues an interrupted
scan); --plot FILE.png draws it. Exit status: 0, 2 for bad input (one line), 130 after
Ctrl-C and 143 after SIGTERM (the record kept either way).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import stat
import sys

from matmul_drift.cli.args import add_memory_argument, file_name, guarded, positive
from matmul_drift.read.render import visible as render_visible
from matmul_drift.core import cases
from matmul_drift.core.errors import UsageError
from matmul_drift.probes import classsearch, records, scan
from matmul_drift.store import atomic

PROG = "matmul-drift scan"


def _range(text: str) -> tuple[int, int]:
    try:
        return classsearch.parse_range(text)
    except classsearch.RangeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the scan's arguments to ``parser`` (a subcommand parser of matmul-drift)."""
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--vary", choices=scan.DIMS,
                        help="the dimension to vary (required, but with --render)")
    parser.add_argument("--range", type=_range, metavar="LO:HI",
                        help="sizes of the varied dimension, both included (required, but with "
                             "--render)")
    for d in scan.DIMS:
        parser.add_argument(f"--{d}", type=positive,
                            help=f"{d}, fixed (give the two dimensions not varied)")
    parser.add_argument("--within", type=positive, metavar="W",
                        help="n or m: slice every size from an operand W wide (default HI), as a "
                             "slice of a wider "
                             "tensor is laid out: the seed's v[:, :n] is --within 51000")
    parser.add_argument("--dtype", choices=cases.DTYPES, help="required, but with --render")
    parser.add_argument("--device", default="cpu", choices=cases.DEVICES)
    parser.add_argument("--step", type=positive, metavar="S",
                        help="coarse grid spacing in sizes within each alignment class (default: "
                             "each class in 20 pieces); kernels or drift that change and change "
                             "back between two grid points of a class are missed, --step 1 is a "
                             "dense sweep")
    parser.add_argument("--json", type=file_name, metavar="FILE",
                        help="write every point, boundary and region here, "
                        "once a second and at the end (refuses an existing FILE: use --resume)")
    parser.add_argument("--resume", type=file_name, metavar="FILE",
                        help="continue the scan recorded in FILE (same "
                        "parameters) and write it back there")
    parser.add_argument("--plot", type=file_name, metavar="FILE.png",
                        help="draw the regions and the drift (matplotlib)")
    parser.add_argument("--render", type=file_name, metavar="FILE",
                        help="print a record saved with --json as text (a GPU's, say), measuring "
                             "nothing")
    add_memory_argument(parser, "the top of the range")


def _check_paths(args) -> str | None:
    """The record's path; refuses anything that would overwrite a record or fail only at the end."""
    if args.resume and args.json and os.path.abspath(args.json) != os.path.abspath(args.resume):
        raise UsageError("--resume FILE writes back to FILE; drop --json or give it the same FILE")
    path = args.resume or args.json
    if path and args.plot and os.path.realpath(path) == os.path.realpath(args.plot):
        raise UsageError(f"--plot {args.plot} is the record's file too; the plot would replace the "
                         "record: name it apart")
    if args.resume:
        _regular_file(args.resume)
    for flag, p in (("--json", args.json), ("--plot", args.plot)):  # --resume: "not a regular file"
        if p and os.path.isdir(p):  # was "exists; continue it with --resume" for a folder
            raise UsageError(f"{flag} {p}: a folder; name a file in it")
    # a dangling link too: the write would fail
    if args.json and not args.resume and os.path.lexists(args.json):
        raise UsageError(f"{args.json} exists; continue it with --resume {args.json}, or choose "
                         "another name")
    if args.plot:
        if not args.plot.lower().endswith(".png"):
            raise UsageError(f"--plot {args.plot}: the plot is a PNG; name it FILE.png")
        if os.path.lexists(args.plot):
            raise UsageError(f"{args.plot} exists; remove it or choose another name")
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot needs matplotlib (pip install matplotlib)")
    for p in (path, args.plot):
        problem = p and atomic.folder_problem(p)
        if problem:
            raise UsageError(f"{p}: {problem}")
    return path


def _regular_file(path: str) -> None:
    """UsageError unless ``path`` is a regular file: opening a FIFO would wait for a writer forever,
    and the record is written back by replacing ``path``, which would put a file in a link's
    place and leave the record it points to behind."""
    if os.path.islink(path):
        raise UsageError(f"--resume {path}: a symbolic link; resume the record itself "
                         f"({os.path.realpath(path)})")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"--resume {path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"--resume {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"--resume {path}: not a regular file")


def _dims(args) -> dict:
    """m, k and n at the top of the range; UsageError unless exactly the two fixed ones
    are given."""
    lo, hi = args.range
    given = {d: getattr(args, d) for d in scan.DIMS}
    if given[args.vary] is not None:
        raise UsageError(f"--{args.vary} is the varied dimension; its sizes come from --range")
    missing = [f"--{d}" for d in scan.DIMS if d != args.vary and given[d] is None]
    if missing:
        raise UsageError(f"--vary {args.vary} needs {' and '.join(missing)}")
    if args.within is not None:
        if args.vary == "k":
            raise UsageError("--within goes with --vary n or m (each k is its own contiguous "
                             "product)")
        if args.within < hi:
            raise UsageError(f"--within {args.within} is below the range's top, {hi}: the sizes "
                             "are slices of it")
    return {**given, args.vary: _within(args) or hi}


def _within(args) -> int | None:
    """--within, None where it is the range's top (the default, which records name so)."""
    return None if args.within == args.range[1] else args.within


def run(args: argparse.Namespace) -> int:
    """Run the scan for parsed ``args``; returns the exit status."""
    return guarded(PROG, _run, (scan.ScanError, records.RecordError), args)


def _render(args) -> int:
    """A saved record as text: what `scan` printed at its end."""
    given = [f"--{k.replace('_', '-')}" for k in ("vary", "range", "m", "k", "n", "within", "dtype",
                                                  "step", "json", "resume", "plot")
             if getattr(args, k) is not None]
    given += ["--device"] * (args.device != "cpu")
    if given:  # ignored, they would mislead: the record is as it was saved
        raise UsageError("--render prints a saved record as text and measures nothing; it takes "
                         f"no {given[0]}")
    text = scan.render_saved(records.load(args.render), args.render)
    # a saved file's escape sequences must not reach the terminal
    print(render_visible(text, newlines=True))
    return 0


def _run(args) -> int:
    if args.render is not None:
        return _render(args)
    missing = [f for f, v in (("--vary", args.vary), ("--range", args.range),
                              ("--dtype", args.dtype)) if v is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)}")
    lo, hi = args.range
    _dims(args)
    path = _check_paths(args)
    fixed = {d: getattr(args, d) for d in scan.DIMS}
    # here: measuring needs torch, and the parser of every command imports this
    from matmul_drift.probes import scan_run

    out = scan_run.run(args.vary, lo, hi, fixed, args.dtype, args.device, args.step or 0, path,
                       resume=bool(args.resume), prog=PROG,
                       host_memory_check=not args.no_host_memory_check,
                       within=_within(args))
    print(f"{PROG}: {out.message}", file=sys.stderr, flush=True)
    if out.record is None:
        return out.status
    print(scan.render(out.record))
    if args.plot:
        # here: importing matplotlib slows every command's start
        from matmul_drift.probes import scan_plot

        scan_plot.plot(out.record, args.plot)
    return 0
