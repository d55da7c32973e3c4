"""`matmul-drift scan`: where along one dimension do the kernels or the drift change?

Varies n, m or k over LO:HI with the other two fixed, measures each size the way
`explain` measures a slice, and bisects between coarse grid points down to exact
boundaries. Prints a table of regions and boundaries; --json FILE keeps every evaluated
point (rewritten atomically after each one, so --resume FILE continues an interrupted
scan); --plot FILE.png draws it. Exit status: 0, 2 for bad input (one line), 130 after
Ctrl-C and 143 after SIGTERM (the record kept either way).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time

from . import cases, scan
from .cli import _positive  # one parser of positive sizes for every subcommand

PROG = "matmul-drift scan"
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


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
        parser.add_argument(f"--{d}", type=_positive, help=f"{d}, fixed (give the two dimensions not varied)")
    parser.add_argument("--dtype", required=True, choices=cases.DTYPES)
    parser.add_argument("--device", default="cpu", choices=cases.DEVICES)
    parser.add_argument("--step", type=_positive, metavar="S",
                        help="coarse grid spacing in sizes within each alignment class (default: each class "
                             "in 20 pieces); a route changing inside a class between grid points can be "
                             "missed, --step 1 is a dense sweep")
    parser.add_argument("--json", metavar="FILE", help="write every point, boundary and region here, "
                        "after every point (refuses an existing FILE: use --resume)")
    parser.add_argument("--resume", metavar="FILE", help="continue the scan recorded in FILE (same "
                        "parameters) and write it back there")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the regions and the drift (matplotlib)")


class _Fail(Exception):
    """One line for stderr, exit status 2."""


def _check_paths(args) -> str | None:
    """The record's path; refuses anything that would overwrite a record or fail only at the end."""
    if args.resume and args.json and os.path.abspath(args.json) != os.path.abspath(args.resume):
        raise _Fail("--resume FILE writes back to FILE; drop --json or give it the same FILE")
    path = args.resume or args.json
    if args.resume and not os.path.exists(args.resume):
        raise _Fail(f"--resume {args.resume}: no such file")
    if args.json and not args.resume and os.path.exists(args.json):
        raise _Fail(f"{args.json} exists; continue it with --resume {args.json}, or choose another name")
    if args.plot:
        if not args.plot.lower().endswith(".png"):
            raise _Fail(f"--plot {args.plot}: the plot is a PNG; name it FILE.png")
        if os.path.exists(args.plot):
            raise _Fail(f"{args.plot} exists; remove it or choose another name")
        if importlib.util.find_spec("matplotlib") is None:
            raise _Fail("--plot needs matplotlib (pip install matplotlib)")
    for p in (path, args.plot):
        if p and not os.path.isdir(os.path.dirname(os.path.abspath(p))):
            raise _Fail(f"{p}: its folder does not exist")
    return path


def _dims(args) -> dict:
    """m, k and n at the top of the range; _Fail unless exactly the two fixed ones are given."""
    lo, hi = args.range
    given = {d: getattr(args, d) for d in scan.DIMS}
    if given[args.vary] is not None:
        raise _Fail(f"--{args.vary} is the varied dimension; its sizes come from --range")
    missing = [f"--{d}" for d in scan.DIMS if d != args.vary and given[d] is None]
    if missing:
        raise _Fail(f"--vary {args.vary} needs {' and '.join(missing)}")
    return {**given, args.vary: hi}


def _available(device: str) -> tuple[int | None, int | None]:
    """Bytes available on the host (MemAvailable) and, on CUDA, free on the GPU; None if unknown."""
    host = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    gpu = None
    if device == "cuda":
        import torch

        gpu = torch.cuda.mem_get_info()[0]
    return host, gpu


def _check_memory(vary: str, dims: dict, dtype: str, device: str) -> None:
    need_host, need_gpu = scan.bytes_needed(vary, dims["m"], dims["k"], dims["n"], ITEMSIZE[dtype], device)
    host, gpu = _available(device)
    for need, have, where in ((need_host, host, "memory available (MemAvailable)"), (need_gpu, gpu, "GPU memory free")):
        if have is not None and need > have:
            raise _Fail(f"the top of the range, m={dims['m']} k={dims['k']} n={dims['n']} in {dtype}, needs about "
                        f"{need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB of {where}")


class _Progress:
    """A progress bar on stderr while it is a terminal; a closing line always."""

    def __init__(self, n_grid: int, known: int):
        self.n_grid, self.known, self.done, self.t0 = n_grid, known, 0, time.monotonic()
        self.tty = sys.stderr.isatty()

    def tick(self, size: int) -> None:
        self.done += 1
        if not self.tty:
            return
        seen = self.known + self.done
        if seen <= self.n_grid:
            filled = 30 * seen // self.n_grid
            text = f"[{'#' * filled}{'.' * (30 - filled)}] grid {seen}/{self.n_grid}"
        else:
            text = f"[{'#' * 30}] grid done, bisecting: {seen - self.n_grid} more"
        print(f"\r{PROG}: {text} (at {size}, {time.monotonic() - self.t0:.0f} s)\x1b[K", end="", file=sys.stderr, flush=True)

    def close(self, line: str) -> None:
        if self.tty:
            print("\r\x1b[K", end="", file=sys.stderr)
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the scan for parsed ``args``; returns the exit status."""
    try:
        return _run(args)
    except (_Fail, scan.ScanError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside the search (drawing inputs, plotting): no point in hand
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    from . import catalog, environment, measure

    lo, hi = args.range
    dims = _dims(args)
    path = _check_paths(args)
    step = args.step or 0  # 0: each class's grid cut into scan.CLASS_INTERVALS pieces
    try:
        measure.check_device(args.device, args.dtype)
    except measure.Unavailable as exc:
        raise _Fail(str(exc)) from None
    _check_memory(args.vary, dims, args.dtype, args.device)
    env = environment.describe(args.device)  # no MKL banner: it is not known before a product
    params = scan.Params(args.vary, lo, hi, args.m, args.k, args.n, args.dtype, args.device, step,
                         measure.SEED, catalog.hex_id(catalog.object_id(env)))
    rec = scan.load(path) if args.resume else None
    if rec is not None:
        scan.check_record(rec, params)  # before drawing inputs, which can take minutes

    # Inputs as explain draws them for this shape: uniform [0, 1), as the seed.
    case = cases.adhoc(dims["m"], dims["k"], dims["n"])
    a_bits, b_bits, checksum = measure.operand_bits(case, args.dtype, args.device)
    points = scan.resume_points(rec, params, checksum) if rec else {}
    sessions = list(rec.get("sessions", [])) if rec else []
    ops = measure.make_operands(a_bits, b_bits, args.dtype, args.device, case)
    del a_bits, b_bits
    top = None if args.vary == "k" else measure.top_product(ops)

    progress = _Progress(scan.grid_count(lo, hi, step), len(points))
    session = {"evaluated": 0, "seconds": 0.0, "complete": False}
    sessions.append(session)
    t0 = time.monotonic()

    def save(all_points: dict, complete: bool) -> None:
        session["seconds"] = round(time.monotonic() - t0, 3)
        session["complete"] = complete
        if path:
            scan.write_atomic(path, scan.record(params, all_points, input_checksum=checksum, environment=env,
                                                sessions=sessions, complete=complete))

    live = dict(points)
    stopped: list[int] = []

    def evaluate(size: int) -> dict:
        p = measure.scan_point(ops, args.vary, size, top, dtype=args.dtype, device=args.device)
        live[size] = p
        session["evaluated"] += 1
        save(live, complete=False)
        progress.tick(size)
        if stopped:
            raise KeyboardInterrupt
        return p

    def stop(signum, frame):
        # Ctrl-C (or `timeout`'s SIGTERM) lets the point in hand finish and be recorded, so
        # nothing is cut in the middle (a product, a file write, the captured stdout); a
        # second signal stops at once.
        if stopped:
            raise KeyboardInterrupt
        stopped.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        points = scan.class_search(lo, hi, evaluate, known=points, step=step)
    except KeyboardInterrupt:
        where = f"{path} holds them: continue with --resume {path}" if path else "nothing was recorded (--json FILE keeps a resumable record)"
        progress.close(f"interrupted after {session['evaluated']} evaluations; {where}")
        return 128 + (stopped[0] if stopped else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if session["evaluated"] or (rec and not rec.get("complete")):
        save(points, complete=True)
    result = scan.record(params, points, input_checksum=checksum, environment=env, sessions=sessions, complete=True)
    progress.close(f"{session['evaluated']} evaluated here, {result['evaluations']} in all, "
                   f"for {result['dense_equivalent']} sizes; {scan.boundary_count(result)}"
                   + (f"; record in {path}" if path else ""))
    print(render(result))
    if args.plot:
        from . import scan_plot

        scan_plot.plot(result, args.plot)
    return 0


def render(result: dict) -> str:
    """The pattern, the regions and boundaries of each class of a complete scan record, as text."""
    from tabulate import tabulate

    p = result["params"]
    drift = p["vary"] != "k"  # k has no sliced product to compare: kernel-id and error_u only
    fixed = ", ".join(f"{d}={p[d]}" for d in scan.DIMS if d != p["vary"])
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
    if p["step"] == 1:
        parts.append("Every size was evaluated (a dense sweep): this is what holds at every size of the range.")
    else:
        grid = f"every {p['step']} sizes" if p["step"] else f"{scan.CLASS_INTERVALS} intervals"
        parts.append(f"Each alignment class ({', '.join(result['classes'])}) was searched on its own coarse grid "
                     f"({grid} per class), then bisected to adjacent members: every boundary above is exact within "
                     "its class, and routes that depend on the size modulo 2 to 32 show as patterns. Not seen: a "
                     "route that changes at a single size inside a class, between two of its grid points; "
                     "--step S tightens the grid (--step 1 is a dense sweep).")
    return "\n\n".join(parts)


def _num(x) -> str:
    return "—" if x is None else format(x, ".4g") if isinstance(x, float) else str(x)


def _side(point: dict, drift: bool) -> str:
    """One side of a boundary: its drift (ulps, u) for n and m, its error_u (u) for k."""
    return f"{point['max_ulp']} ulp, {_num(point['max_u'])} u" if drift else _num(point["error_u"])


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"{PROG}: error: {message}", file=sys.stderr)
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
