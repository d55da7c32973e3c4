"""`matmul-drift scan`: where along one dimension do the kernels or the drift change?

Varies n, m or k over LO:HI with the other two fixed, measures each size the way
`explain` measures a slice, and searches each alignment class down to exact boundaries
(scan.py; the driver is scan_run.py: this module parses and renders). Prints a table of regions and boundaries; --json FILE keeps every evaluated
point (rewritten atomically after each one, so --resume FILE continues an interrupted
scan); --plot FILE.png draws it. Exit status: 0, 2 for bad input (one line), 130 after
Ctrl-C and 143 after SIGTERM (the record kept either way).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import stat
import sys

from . import atomic, cases, scan
from .cli import say_error
from .cli_args import file_name, positive

PROG = "matmul-drift scan"


def _range(text: str) -> tuple[int, int]:
    try:
        return scan.parse_range(text)
    except scan.ScanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the scan's arguments to ``parser`` (a subcommand parser of matmul-drift)."""
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--vary", required=True, choices=scan.DIMS, help="the dimension to vary")
    parser.add_argument("--range", required=True, type=_range, metavar="LO:HI",
                        help="sizes of the varied dimension, both included")
    for d in scan.DIMS:
        parser.add_argument(f"--{d}", type=positive, help=f"{d}, fixed (give the two dimensions not varied)")
    parser.add_argument("--within", type=positive, metavar="W",
                        help="n or m: slice every size from an operand W wide (default HI), as a slice of a wider "
                             "tensor is laid out: the seed's v[:, :n] is --within 51000")
    parser.add_argument("--dtype", required=True, choices=cases.DTYPES)
    parser.add_argument("--device", default="cpu", choices=cases.DEVICES)
    parser.add_argument("--step", type=positive, metavar="S",
                        help="coarse grid spacing in sizes within each alignment class (default: each class "
                             "in 20 pieces); kernels or drift that change and change back between two grid points "
                             "of a class are missed, --step 1 is a dense sweep")
    parser.add_argument("--json", type=file_name, metavar="FILE", help="write every point, boundary and region here, "
                        "once a second and at the end (refuses an existing FILE: use --resume)")
    parser.add_argument("--resume", type=file_name, metavar="FILE", help="continue the scan recorded in FILE (same "
                        "parameters) and write it back there")
    parser.add_argument("--plot", type=file_name, metavar="FILE.png", help="draw the regions and the drift (matplotlib)")
    from .cli import add_memory_argument

    add_memory_argument(parser, "the top of the range")


class _Fail(Exception):
    """One line for stderr, exit status 2."""


def _check_paths(args) -> str | None:
    """The record's path; refuses anything that would overwrite a record or fail only at the end."""
    if args.resume and args.json and os.path.abspath(args.json) != os.path.abspath(args.resume):
        raise _Fail("--resume FILE writes back to FILE; drop --json or give it the same FILE")
    path = args.resume or args.json
    if path and args.plot and os.path.realpath(path) == os.path.realpath(args.plot):
        raise _Fail(f"--plot {args.plot} is the record's file too; the plot would replace the record: name it apart")
    if args.resume:
        _regular_file(args.resume)
    for flag, p in (("--json", args.json), ("--plot", args.plot)):  # --resume: "not a regular file"
        if p and os.path.isdir(p):  # was "exists; continue it with --resume" for a folder
            raise _Fail(f"{flag} {p}: a folder; name a file in it")
    if args.json and not args.resume and os.path.lexists(args.json):  # a dangling link too: the write would fail
        raise _Fail(f"{args.json} exists; continue it with --resume {args.json}, or choose another name")
    if args.plot:
        if not args.plot.lower().endswith(".png"):
            raise _Fail(f"--plot {args.plot}: the plot is a PNG; name it FILE.png")
        if os.path.lexists(args.plot):
            raise _Fail(f"{args.plot} exists; remove it or choose another name")
        if importlib.util.find_spec("matplotlib") is None:
            raise _Fail("--plot needs matplotlib (pip install matplotlib)")
    for p in (path, args.plot):
        problem = p and atomic.folder_problem(p)
        if problem:
            raise _Fail(f"{p}: {problem}")
    return path


def _regular_file(path: str) -> None:
    """_Fail unless ``path`` is a regular file: opening a FIFO would wait for a writer forever,
    and the record is written back by replacing ``path``, which would put a file in a link's
    place and leave the record it points to behind."""
    if os.path.islink(path):
        raise _Fail(f"--resume {path}: a symbolic link; resume the record itself ({os.path.realpath(path)})")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise _Fail(f"--resume {path}: no such file") from None
    except OSError as exc:
        raise _Fail(f"--resume {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise _Fail(f"--resume {path}: not a regular file")


def _dims(args) -> dict:
    """m, k and n at the top of the range; _Fail unless exactly the two fixed ones are given."""
    lo, hi = args.range
    given = {d: getattr(args, d) for d in scan.DIMS}
    if given[args.vary] is not None:
        raise _Fail(f"--{args.vary} is the varied dimension; its sizes come from --range")
    missing = [f"--{d}" for d in scan.DIMS if d != args.vary and given[d] is None]
    if missing:
        raise _Fail(f"--vary {args.vary} needs {' and '.join(missing)}")
    if args.within is not None:
        if args.vary == "k":
            raise _Fail("--within goes with --vary n or m (each k is its own contiguous product)")
        if args.within < hi:
            raise _Fail(f"--within {args.within} is below the range's top, {hi}: the sizes are slices of it")
    return {**given, args.vary: _within(args) or hi}


def _within(args) -> int | None:
    """--within, None where it is the range's top (the default, which records name so)."""
    return None if args.within == args.range[1] else args.within


def run(args: argparse.Namespace) -> int:
    """Run the scan for parsed ``args``; returns the exit status."""
    try:
        return _run(args)
    except (_Fail, scan.ScanError) as exc:
        say_error(PROG, exc)
        return 2
    except KeyboardInterrupt:  # outside the search (drawing inputs, plotting): no point in hand
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    from . import scan_run

    lo, hi = args.range
    _dims(args)
    path = _check_paths(args)
    fixed = {d: getattr(args, d) for d in scan.DIMS}
    out = scan_run.run(args.vary, lo, hi, fixed, args.dtype, args.device, args.step or 0, path,
                       resume=bool(args.resume), prog=PROG, host_memory_check=not args.no_host_memory_check,
                       within=_within(args))
    print(f"{PROG}: {out.message}", file=sys.stderr, flush=True)
    if out.record is None:
        return out.status
    print(render(out.record))
    if args.plot:
        from . import scan_plot

        scan_plot.plot(out.record, args.plot)
    return 0


def render(result: dict) -> str:
    """The pattern, the regions and boundaries of each class of a complete scan record, as text."""
    from tabulate import tabulate

    p = result["params"]
    drift = p["vary"] != "k"  # k has no sliced product to compare: kernel-id and error_u only
    fixed = ", ".join(f"{d}={p[d]}" for d in scan.DIMS if d != p["vary"])
    if p.get("within"):
        fixed += f", slices of {p['vary']}={p['within']}"
    n_eval, dense = result["evaluations"], result["dense_equivalent"]
    head = (f"scan of {p['vary']} over {p['lo']}..{p['hi']} ({fixed}), {p['dtype']} on {p['device']}: "
            f"{n_eval} evaluations for {dense} sizes ({n_eval / dense:.1%} of a dense sweep), "
            f"{scan.boundary_count(result)} within the alignment classes")
    pattern = "\n".join(f"  {p['vary']} {seg['text']}" for seg in result["pattern"])
    headers = ["class", "sizes", "kernel-id", "kernels"] + (["drift", "max ulp", "max_u"] if drift else []) + ["max error_u", "points"]
    rows = []
    for r in sorted(result["regions"], key=lambda r: (r["lo"], r["class"])):
        cells = [r["drift"], _num(r["max_ulp"]), _num(r["max_u"])] if drift else []
        rows.append([r["class"], f"{r['lo']}..{r['hi']}", r["kernel_id"], "\n".join(r["kernels"]),
                     *cells, _num(r["max_error_u"]), r["points"]])
    parts = [head, "What holds where:\n" + pattern, tabulate(rows, headers=headers)]
    if result["boundaries"]:
        brows = []
        for b in result["boundaries"]:
            before, after = b["before"], b["after"]
            change = " and ".join(w for w, c in (("kernels", b["kernel_changed"]), ("drift", b["drift_changed"])) if c)
            brows.append([b["class"], f"{b['lo']} → {b['hi']}", change, "\n".join(before["kernels"]),
                          "(same)" if before["kernels"] == after["kernels"] else "\n".join(after["kernels"]),
                          _side(before, drift), _side(after, drift)])
        what = "drift" if drift else "error_u"
        parts.append(tabulate(brows, headers=["class", "boundary", "change", "kernels before", "kernels after",
                                              f"{what} before", f"{what} after"]))
    gap = scan.grid_gap(p["lo"], p["hi"], p["step"])
    if not gap:
        parts.append("Every size was evaluated (a dense sweep): this is what holds at every size of the range.")
    else:
        grid = f"every {p['step']} sizes" if p["step"] else f"{scan.CLASS_INTERVALS} intervals"
        parts.append(f"Each alignment class ({', '.join(result['classes'])}) was searched on its own coarse grid "
                     f"({grid} per class, grid points up to {gap} sizes apart), then bisected to adjacent members: "
                     "every boundary above is exact within its class, and routes that depend on the size modulo 2 "
                     "to 32 show as patterns. Not seen: kernels or drift that change and change back between two "
                     f"grid points of a class (a run of fewer than {gap} sizes), or a size whose drift vanishes only "
                     "because these inputs round alike there; --step S tightens the grid (--step 1 is a dense sweep).")
    return "\n\n".join(parts)


def _num(x) -> str:
    return "—" if x is None else format(x, ".4g") if isinstance(x, float) else str(x)


def _side(point: dict, drift: bool) -> str:
    """One side of a boundary: its drift (ulps, u) for n and m, its error_u (u) for k. Drift
    that max_ulp and max_u leave out (entries finite on one side only: 65504 against inf)
    is given as the share of entries that differ, which alone makes that side drift."""
    if not drift:
        return _num(point["error_u"])
    text = f"{point['max_ulp']} ulp, {_num(point['max_u'])} u"
    if point["frac_differ"] and not point["max_ulp"]:
        text += f", {100 * point['frac_differ']:.3g}% of entries between finite and NaN/inf"
    return text


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        say_error(PROG, message)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run; usage errors print one line and return 2."""
    parser = _Parser(prog=PROG)
    configure(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
