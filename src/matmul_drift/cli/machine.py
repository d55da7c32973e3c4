"""`matmul-drift machine`: this hardware's asv machine name, and what it is made of."""

from __future__ import annotations

import argparse
import json
import sys

from matmul_drift.core.errors import UsageError
from matmul_drift.store import machine

PROG = "matmul-drift"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--register", action="store_true",
                   help="also record it in ~/.asv-machine.json (as `asv machine --yes` does), for "
                        "`asv run --machine NAME`")


def run(args) -> int:
    """Print this hardware's machine name (stdout) and its fingerprint (stderr)."""
    fp = machine.fingerprint()
    try:
        print(machine.register(fp) if args.register else machine.name(fp))
    except machine.NotRegistered as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(fp, indent=2), file=sys.stderr)
    return 0
