"""`matmul-drift order`: in which order does the kernel add the K products of one entry?

Reveals the accumulation tree over K (probes/order.py) at the exact shape, dtype,
layout and device of ``--m/--k/--n`` or ``--case`` (with ``--slice-n``/``--slice-m`` for one
of its slices), for the entry ``--row/--col``; prints a summary in words and the order-id
(kept in the catalog under orders/). ``--json FILE`` writes the tree (docs/design.md: "The order
tree format"); ``--verify`` replays it against the kernel on random inputs, and a tree the
replay disagrees with sends the probe to its next width. Exit status: 0, 1 when the order is
not revealed (at no width a tree that fits, and replays with ``--verify``), 2 for bad input.
"""

from __future__ import annotations

import argparse
import os

from matmul_drift.cli.args import Bar, add_memory_argument, add_shape_arguments, file_name, positive
from matmul_drift.core import cases, ids, trees, words
from matmul_drift.core.errors import UsageError
from matmul_drift.measure import record
from matmul_drift.probes import order_tree
from matmul_drift.probes.order_plan import over_budget, target
from matmul_drift.store import atomic, catalog

PROG = "matmul-drift"


def configure(p: argparse.ArgumentParser) -> None:
    add_shape_arguments(p)
    p.add_argument("--slice-n", type=positive, help="with --case: the product A @ B[:, :N]")
    p.add_argument("--slice-m", type=positive, help="with --case: the product A[:M] @ B")
    p.add_argument("--form", default="as-is", choices=("as-is", "2d"),
                   help="with --case: A as the case holds it, or a 1-D A as A.unsqueeze(0) (the "
                        "seed's 2d form)")
    p.add_argument("--dtype", required=True, choices=cases.DTYPES)
    p.add_argument("--device", default="cpu", choices=cases.DEVICES)
    p.add_argument("--row", type=int, default=0, help="the entry's row (default 0)")
    p.add_argument("--col", type=int, default=0, help="the entry's column (default 0)")
    p.add_argument("--json", type=file_name, metavar="FILE",
                   help="write the tree and what was measured")
    p.add_argument("--verify", action="store_true",
                   help="replay the tree against the kernel on 100 random draws")
    p.add_argument("--max-calls", type=positive, default=4000,
                   help="refuse a probe expected to need more matmul calls (default 4000)")
    add_memory_argument(p, "the probe")


def _target(args):
    if (args.case is None) == (args.m is None and args.k is None and args.n is None):
        raise UsageError("give --case ID or --m M --k K --n N")
    if args.case is None and None in (args.m, args.k, args.n):
        raise UsageError("--m, --k and --n go together")
    if args.case is None and (args.slice_n or args.slice_m):
        raise UsageError("--slice-n and --slice-m go with --case")
    if args.slice_n and args.slice_m:
        raise UsageError("give one of --slice-n and --slice-m")
    # as scan's --json: nothing recorded is overwritten (a link either)
    if args.json and os.path.lexists(args.json):
        raise UsageError(f"--json {args.json} exists; remove it or choose another name")
    problem = args.json and atomic.folder_problem(args.json)
    if problem:
        raise UsageError(f"--json {args.json}: {problem}")
    return checked_target(args.case, (args.m, args.k, args.n), args.slice_n, args.slice_m,
                          args.form, args.dtype, args.device, args.row, args.col,
                          not args.no_host_memory_check, args.max_calls)


def run(args) -> int:
    # here: needs torch, and the parser of every command imports this
    from matmul_drift.probes import order

    t = _target(args)
    with Bar("order", "call") as bar:
        try:
            r = order.reveal(t, progress=lambda calls, expected: bar.update(
                                 f"{calls} calls", calls, max(expected, calls + 1)),
                                   max_calls=args.max_calls, verify=args.verify)
        except order_tree.NotRevealed as exc:
            print(f"matmul-drift order: order not revealed after {exc.calls} matmul calls: {exc}")
            return 1
    try:
        oid = order_tree.store(catalog.default_root(), r.tree, t.k)
    except OSError as exc:  # the catalog changed while probing
        raise UsageError(f"cannot store the tree in the catalog: {exc.strerror or exc}") from None
    reading = words.describe(r.tree)
    verified = r.verified
    # before the lines below: a reader that closes stdout early (| head) must not cost the file
    if args.json:
        meta = {"case": t.case.id, "slice_n": t.slice_n, "slice_m": t.slice_m, "form": t.form,
                "dtype": t.dtype, "device": t.device,
                "row": t.row, "col": t.col, "k": t.k, "order_id": ids.hex_id(oid),
                "summary": reading, "calls": r.calls, "pairs": r.probes, "rounds": r.rounds,
                "seconds": round(r.seconds, 3), "notes": r.notes,
                "verified": verified}
        try:  # whole or not at all, and never over a file made while probing
            atomic.write_new(args.json, trees.report_text(meta, r.tree).encode())
        except atomic.Taken as exc:
            raise UsageError(f"--json {args.json} appeared while probing and is left as it is; "
                             f"the tree is in {exc.kept}") from None
        except OSError as exc:
            raise UsageError(f"cannot write --json {args.json}: {exc.strerror or exc}") from None
    where = f"{t.case.id}" + (f"[:, :{t.slice_n}]" if t.slice_n
                              else f"[:{t.slice_m}]" if t.slice_m else "")
    where += " (A 2-D)" if t.form == "2d" else ""
    print(f"{where} {t.dtype} on {t.device}, entry ({t.row}, {t.col}), K = {t.k}: {reading}")
    print(f"order-id {ids.hex_id(oid)}; {r.calls} matmul calls, {r.probes} pairs, {r.rounds} "
          f"round{'s' * (r.rounds != 1)}, {r.seconds:.1f} s; {'; '.join(r.notes)}")
    if verified:
        ways = verified.get("fused_add")
        print(f"replay: {verified['matched']} of {verified['draws']} random draws bit-identical to "
              "the kernel"
              + (f"; its fused adds round as {' or '.join(ways)}" if ways else ""))
    else:  # the tree fits the probe's readings; only a replay shows it reproduces the kernel's bits
        print("replay: not run (--verify replays the tree against the kernel)")
    return 0


def checked_target(case_id: str | None, mkn: tuple, slice_n: int | None, slice_m: int | None,
                   form: str, dtype: str, device: str, row: int, col: int, host_check: bool,
                   max_calls: int):
    """The Target of `matmul-drift order`: case ``case_id``, else the ad-hoc (m, k, n) of ``mkn``.
    UsageError (one line) when the probe cannot run: a slice or entry the case lacks, a device or
    dtype it cannot take, too little memory, more than ``max_calls`` calls expected, or a catalog
    that cannot take the tree."""
    # here: the estimate asks torch (its build, the GPU's free memory), and the parser of every
    # command imports this
    from matmul_drift.measure import memory

    try:
        case = cases.get(case_id) if case_id is not None else cases.adhoc(*mkn)
        cases.check_slices(case, case.shape(device), slice_n, slice_m, form)
        t = target(case, dtype, device, slice_n, slice_m, row, col, form)
    except (ValueError, record.Unavailable) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    try:
        memory.check(memory.probe_bytes(**t.probe_sizes()),
                     f"the probe of {t.label} in {t.dtype},", t.device, host_check)
    except memory.TooLarge as exc:
        raise UsageError(str(exc)) from None
    refused = over_budget(t, max_calls)
    if refused:
        raise UsageError(f"{refused} (--max-calls)")
    orders = catalog.default_root() / "orders"  # checked before minutes of probing, not after
    try:
        orders.mkdir(parents=True, exist_ok=True)
        problem = atomic.folder_problem(orders / "tree.json")
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem:
        raise UsageError(f"the catalog cannot take the tree: {orders}: {problem} "
                         "(MATMUL_DRIFT_CATALOG names another)")
    return t
