"""`matmul-drift bisect`: which torch build changed one product's bits, and what changed.

    matmul-drift bisect --case seed --slice-n 45999 --dtype float16 --torch 2.8.0..2.14.1

Exit status: 0 when no build changed the bits (or fewer than two could be measured), 1 when
one did, 2 for bad input or a refusal (too little memory or disk, an interrupted bisection).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from matmul_drift.cli.args import (
    add_memory_argument,
    add_shape_arguments,
    folder,
    positive,
    say_error,
)
from matmul_drift.core import cases
from matmul_drift.core.errors import UsageError
from matmul_drift.jobs import bisect, builds, resultsbranch
from matmul_drift.probes import explain
from matmul_drift.read.render import visible
from matmul_drift.store import space

PROG = "matmul-drift bisect"


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "matmul-drift" / "bisect"


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.splitlines()[0]
    add_shape_arguments(p)
    p.add_argument("--dtype", required=True, choices=cases.PRECISIONS)
    p.add_argument("--device", default="cpu", choices=cases.DEVICES)
    p.add_argument("--slice-n", type=positive, help="compare A @ B[:, :n] with (A @ B)[:, :n]")
    p.add_argument("--slice-m", type=positive, help="compare A[:m] @ B with (A @ B)[:m]")
    p.add_argument(
        "--torch",
        required=True,
        metavar="A..B|A,B,C",
        help="the builds: every release the index offers from A to B, or these builds as named",
    )
    p.add_argument(
        "--find-links",
        type=folder,
        metavar="DIR",
        help="take the torch builds from this folder of wheels, not from the package index",
    )
    p.add_argument(
        "--all",
        dest="every",
        action="store_true",
        help="measure every build instead of bisecting, and print each build's digest",
    )
    p.add_argument(
        "--resume", action="store_true", help="go on with an interrupted bisection of this question"
    )
    p.add_argument(
        "--cache",
        type=folder,
        metavar="DIR",
        default=None,
        help=f"where the builds' environments and the state are kept (default {default_cache()})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_memory_argument(p, "the product")


def _request(args):
    given = [args.case is not None, any(v is not None for v in (args.m, args.k, args.n))]
    if sum(given) != 1:
        raise UsageError("give exactly one of --case ID or --m M --k K --n N")
    if given[1] and None in (args.m, args.k, args.n):
        raise UsageError("--m, --k and --n go together")
    return explain.Request(
        dtype=args.dtype,
        device=args.device,
        case=args.case,
        m=args.m,
        k=args.k,
        n=args.n,
        slice_n=args.slice_n,
        slice_m=args.slice_m,
        host_check=not args.no_host_memory_check,
    )


def _log(line: str) -> None:
    print(f"{PROG}: {visible(line)}", file=sys.stderr, flush=True)


def run(args) -> int:
    if args.find_links is not None and not args.find_links.is_dir():
        raise UsageError(f"--find-links {args.find_links}: not a folder")
    product = bisect.plan(_request(args))  # the memory refused here, before any install
    try:
        offered = builds.releases(args.find_links)
    except builds.Failed as exc:
        raise UsageError(f"cannot list the torch releases: {exc}") from None
    where = builds.source_name(args.find_links)
    try:
        versions = builds.select(args.torch, offered, where)
    except builds.NotOffered as exc:
        raise UsageError(f"--torch {args.torch}: {exc}") from None
    except ValueError as exc:
        raise UsageError(
            f"--torch {exc} (e.g. --torch 2.8.0..2.14.1 or --torch 2.12.1,2.13.0)"
        ) from None
    if len(versions) < 2:
        raise UsageError(
            f"--torch {args.torch} gives {len(versions)} build: a bisection compares at least two"
        )
    try:
        repo = resultsbranch.project_checkout(None)
    except ValueError:
        repo = None  # not in a checkout: no asv environments to reuse
    try:
        report = bisect.run(
            product,
            versions,
            args.cache or default_cache(),
            find_links=args.find_links,
            repo=repo,
            every=args.every,
            resume=args.resume,
            log=_log,
        )
    except bisect.Unfinished as exc:
        raise UsageError(
            f"{exc}: pass --resume to go on with it, or delete that file to start again"
        ) from None
    except space.NoSpace as exc:
        say_error(
            PROG,
            f"{exc}; free some space, then run again with --resume (what was measured is kept)",
        )
        return 2
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else bisect.render(report))
    return 1 if report["verdict"]["kind"] == "changed" else 0
