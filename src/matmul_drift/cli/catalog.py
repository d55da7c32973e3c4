"""`matmul-drift catalog ID`: the kernel names or environment behind an id, as asv shows it."""

from __future__ import annotations

import argparse
import json

from matmul_drift.cli.args import folder
from matmul_drift.core import ids, trees, words
from matmul_drift.core.errors import UsageError
from matmul_drift.read.render import visible
from matmul_drift.store import catalog

PROG = "matmul-drift"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID",
                   help="12 hex digits, or the number asv shows (143656636881798.0, 1.9e+12)")
    p.add_argument("--root", type=folder,
                   help="the catalog (default: results/catalog of the checkout)")


def run(args) -> int:
    """Print every catalog entry the id can name; 2 when none does or one is unreadable."""
    root = args.root or catalog.default_root()
    # a missing folder is named as such, not reported as "no catalog entry under it has the id"
    if args.root is not None and not args.root.is_dir():
        raise UsageError(f"--root {args.root}: no such folder")
    try:
        found = catalog.find(root, args.id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not found:
        raise UsageError(f"no catalog entry under {root} has the id {args.id}")
    if len(found) > 1:
        print(f"{args.id} can be any of {len(found)} entries (asv rounded it):")
    broken = []
    for kind, ident in found:
        try:
            entry = catalog.load(root, kind, ident)
        except catalog.MissingEntry as exc:
            broken.append(str(exc))  # the other candidates are still shown
            continue
        print(f"{kind} {ids.hex_id(ident)} (asv: {float(ident):.1f}, {float(ident):.3g})")
        if kind == "kernels" and isinstance(entry, dict):
            for product, names in entry.items():
                if product != "device":
                    # a hostile entry's escape sequences must not reach the terminal
                    print(f"  {visible(product)} ({visible(entry.get('device', '?'))}):")
                    print("".join(f"    {visible(n)}\n"
                                  for n in (names if isinstance(names, list) else [names])), end="")
        elif kind == "orders":  # a tree K deep: json.dumps would recurse
            print(f"  K = {entry['k']}: {words.describe(entry['tree'])}\n  "
                  f"{trees.to_json(entry['tree'])}")
        else:
            print("  " + json.dumps(entry, indent=2, sort_keys=True).replace("\n", "\n  "))
    if broken:
        raise UsageError("; ".join(broken))
    return 0
