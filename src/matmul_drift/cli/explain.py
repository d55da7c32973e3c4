"""`matmul-drift explain`: measure one shape: error, slice drift, kernels, verdict."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from matmul_drift.cli.args import (Bar, add_memory_argument, add_shape_arguments, positive,
                                   progress, say_error)
from matmul_drift.core import cases
from matmul_drift.core.errors import UsageError
from matmul_drift.probes import explain
from matmul_drift.read.render import visible

PROG = "matmul-drift"
MAX_FIX_TIMEOUT_S = 10**6  # well below subprocess's limit of 2**31 - 1 ms (about 24.8 days)


def configure(p: argparse.ArgumentParser) -> None:
    add_shape_arguments(p)
    p.add_argument("--a", type=Path, help="A as .npy or .pt: (M, K) or (K,)")
    p.add_argument("--b", type=Path, help="B as .npy or .pt: (K, N)")
    p.add_argument("--dtype", choices=cases.PRECISIONS,
                   help="required, except with --render; float32-tf32 and float32-high are CUDA's "
                        "matmul modes")
    p.add_argument("--device", default="cpu", choices=cases.DEVICES)
    p.add_argument("--slice-n", type=positive, help="compare A @ B[:, :n] with (A @ B)[:, :n]")
    p.add_argument("--slice-m", type=positive, help="compare A[:m] @ B with (A @ B)[:m]")
    p.add_argument("--repeat", type=positive,
                   help="identical calls compared run to run (default 3)")
    p.add_argument("--layout", choices=("as-stored", "contiguous"), default="as-stored",
                   help="--a/--b files: keep the strides they were saved with (a Fortran-order "
                        ".npy is a transposed view; a .pt view keeps its strides and offset), or "
                        "copy them contiguous")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--try-fixes", action="store_true",
                   help="measure every candidate fix (probes/fixes.py) in a fresh process and say "
                        "which removes the drift")
    p.add_argument("--fix-timeout", type=positive, default=None, metavar="S",
                   help="with --try-fixes: seconds each candidate's process may take (default 600)")
    p.add_argument("--fix-budget", type=positive, default=None, metavar="S",
                   help="with --try-fixes: start no candidate's process after S seconds of trying "
                        "(the rest are reported as not tried); default: no limit")
    p.add_argument("--orders", action="store_true",
                   help="reveal the summation order of entry (0, 0) of the product and of each "
                        "slice (matmul-drift order)")
    p.add_argument("--render", type=Path, metavar="JSON",
                   help="print a report saved with --json as text, measuring nothing")
    add_memory_argument(p, "the product")


def run(args) -> int:
    if args.render is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("case", "m", "k", "n", "a", "b", "dtype",
                                                      "slice_n", "slice_m", "repeat", "json",
                                                      "try_fixes", "fix_timeout", "fix_budget",
                                                      "orders")
                 if getattr(args, k) not in (None, False)]
        given += ["--device"] * (args.device != "cpu") + ["--layout"] * (args.layout != "as-stored")
        if given:  # ignored, they would mislead: the report is as it was saved
            raise UsageError("--render prints a saved report as text and measures nothing; it "
                             f"takes no {given[0]}")
        text, defect = explain.read_saved(args.render)
        # a saved file's escape sequences must not reach the terminal
        print(visible(text, newlines=True))
        return 1 if defect else 0
    if args.dtype is None:
        raise UsageError("the following arguments are required: --dtype")
    for flag, value in (("--fix-timeout", args.fix_timeout), ("--fix-budget", args.fix_budget)):
        if value is not None and not args.try_fixes:
            raise UsageError(f"{flag} goes with --try-fixes")
    # subprocess polls in C-int milliseconds
    if args.fix_timeout is not None and args.fix_timeout > MAX_FIX_TIMEOUT_S:
        raise UsageError(f"--fix-timeout {args.fix_timeout} is beyond {MAX_FIX_TIMEOUT_S} s (about "
                         "11.6 days)")
    given = [args.case is not None, any(v is not None for v in (args.m, args.k, args.n)),
             args.a is not None or args.b is not None]
    if sum(given) != 1:
        raise UsageError("give exactly one of --case ID, --m M --k K --n N, or --a A --b B")
    if given[1] and None in (args.m, args.k, args.n):
        raise UsageError("--m, --k and --n go together")
    if given[2] and (args.a is None or args.b is None):
        raise UsageError("--a and --b go together")
    if args.try_fixes and args.dtype not in cases.DTYPES:
        raise UsageError(f"--try-fixes takes a dtype ({', '.join(cases.DTYPES)}), not the matmul "
                         f"mode {args.dtype}")
    if given[2] and args.try_fixes:  # before measuring, not after
        raise UsageError("--try-fixes takes --case ID or --m M --k K --n N (inputs the candidates "
                         "can redraw)")
    if given[2] and args.orders:
        raise UsageError("--orders takes --case ID or --m M --k K --n N (the probe makes its own "
                         "inputs)")
    req = explain.Request(
        dtype=args.dtype, device=args.device, case=args.case, m=args.m, k=args.k, n=args.n,
        a=args.a, b=args.b, slice_n=args.slice_n, slice_m=args.slice_m, repeat=args.repeat,
        keep_layout=args.layout == "as-stored", try_fixes=args.try_fixes,
        fix_timeout=args.fix_timeout, fix_budget=args.fix_budget, orders=args.orders,
        host_check=not args.no_host_memory_check,
    )
    # here: measuring needs torch, and the parser of every command imports this
    from matmul_drift.probes import explain_run

    ready = explain_run.prepare(req)
    progress(f"measuring {ready.case.id} in {args.dtype} on {args.device} ...")
    r = explain_run.explain(req, ready, fix_bar=Bar)
    print(json.dumps(r, indent=2, allow_nan=False) if args.json else explain.render_all(r))
    stopped = r.get("fixes", {}).get("stopped")
    if stopped:
        print(f"matmul-drift explain: {explain.stopped_line(r['fixes'])}", file=sys.stderr)
        return 128 + signal.Signals[stopped]
    if "failed" in r.get("fixes", {}):  # the measurement above stands; the fixes are missing
        say_error("matmul-drift explain", f"--try-fixes: {r['fixes']['failed']}")
        return 1
    return 1 if r["verdict"]["kind"] == "defect" else 0
