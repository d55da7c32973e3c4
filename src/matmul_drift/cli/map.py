"""`matmul-drift map`: which batch sizes M give the same bits, for one shape, dtype and device?

For every M of --range it states whether row 0 of A[:M] @ B is the bits of A[:1] @ B, whether
its rows are those of the full product, and which kernels ran, measuring only the M that
scan's alignment-class search asks for (probes/batchmap.py; the driver is
probes/batchmap_run.py: this module parses and prints). --json FILE keeps the record
(rewritten atomically, so --resume FILE continues an interrupted map); --plot FILE.png draws
it. Exit status: 0, 2 for bad input (one line), 130 after Ctrl-C and 143 after SIGTERM (the
record kept either way).
"""

from __future__ import annotations

import argparse
import sys

from matmul_drift.cli.args import add_memory_argument, file_name, guarded, positive
from matmul_drift.cli.scan import _check_paths
from matmul_drift.core import cases
from matmul_drift.probes import batchmap, classsearch, interrupt, records

PROG = "matmul-drift map"


def _range(text: str) -> tuple[int, int]:
    try:
        return classsearch.parse_range(text, "a map")
    except classsearch.RangeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the map's arguments to ``parser`` (a subcommand parser of matmul-drift)."""
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--case", help=f"a catalog case with a batch dimension: "
                                       f"{', '.join(c.id for c in cases.CASES if c.op != 'mv')}")
    parser.add_argument("--k", type=positive, help="K, with --n (instead of --case)")
    parser.add_argument("--n", type=positive, help="N, with --k (instead of --case)")
    parser.add_argument("--dtype", required=True, choices=cases.PRECISIONS)
    parser.add_argument("--device", default="cpu", choices=cases.DEVICES)
    parser.add_argument("--range", type=_range, metavar="LO:HI",
                        help="batch sizes M, both included (default "
                             f"1:{batchmap.DEFAULT_TOP['cpu']} on the CPU, "
                             f"1:{batchmap.DEFAULT_TOP['cuda']} on CUDA, at most a case's M)")
    parser.add_argument("--json", type=file_name, metavar="FILE",
                        help="write the record here, once a second and "
                        "at the end (refuses an existing FILE: use --resume)")
    parser.add_argument("--resume", type=file_name, metavar="FILE",
                        help="continue the map recorded in FILE (same parameters) and write it "
                             "back there")
    parser.add_argument("--plot", type=file_name, metavar="FILE.png",
                        help="draw the map (matplotlib)")
    parser.add_argument("--modes", action="store_true",
                        help="map again under each path that claims determinism or batch "
                             "invariance (torch's deterministic algorithms, cuBLAS workspace, "
                             "split-K off, batch_invariant_ops; one thread and MKL_CBWR on the "
                             "CPU), each in a fresh process, with its time against the default's; "
                             "a path not available here is listed with the reason")
    add_memory_argument(parser, "the full product")


def run(args: argparse.Namespace) -> int:
    """Run the map for parsed ``args``; returns the exit status."""
    return guarded(PROG, _run, (batchmap.MapError, records.RecordError), args)


def _run(args) -> int:
    # here: needs torch, and the parser of every command imports this
    from matmul_drift.probes import batchmap_run

    path = _check_paths(args)
    out = batchmap_run.run(args.case, args.k, args.n, args.range, args.dtype, args.device, path,
                           resume=bool(args.resume), prog=PROG,
                           host_memory_check=not args.no_host_memory_check)
    print(f"{PROG}: {out.message}", file=sys.stderr, flush=True)
    if out.record is None:
        return out.status
    print(batchmap.render(out.record))
    if args.plot:
        # here: importing matplotlib slows every command's start
        from matmul_drift.probes import map_plot

        map_plot.plot([out.record], args.plot)
    if args.modes:
        # here: needs torch, and the parser of every command imports this
        from matmul_drift.probes import batchmap_modes

        p = out.record["params"]
        spec = {"case": args.case, "k": args.k, "n": args.n, "range": [p["lo"], p["hi"]],
                "precision": args.dtype, "device": args.device,
                "host_memory_check": not args.no_host_memory_check}
        stopped: list[int] = []
        with interrupt.deferred(stopped):
            print(batchmap_modes.words(batchmap_modes.run_modes(spec, stopped)))
        if stopped:
            return 128 + stopped[0]
    return 0
