"""Content-addressed texts (kernel lists, environments, output digests) beside the asv results.

An id is 48 bits of the sha256 of a canonical JSON text (core/ids.py). Each text is
stored once under ``<root>/<kind>/<12 hex>.json``. Writes go to a temporary file and
are renamed into place, so parallel writers and merged machines never conflict.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal, InvalidOperation
from pathlib import Path

from matmul_drift.core import ids, trees
from matmul_drift.core.ids import ID_HEX_DIGITS, hex_id
from matmul_drift.store import atomic, bounded

KINDS = ("kernels", "env", "fixes", "orders", "maps", "bits")


def default_root() -> Path:
    """Where the catalog lives: $MATMUL_DRIFT_CATALOG; else results/catalog of the project
    checkout around the current directory (asv.conf.json and results/ in it or above); else of
    the checkout this package is installed from (an editable install); else ./results/catalog.
    Never beside an installed package (site-packages/../results)."""
    env = os.environ.get("MATMUL_DRIFT_CATALOG")
    if env:
        return Path(env)
    try:
        cwd = Path.cwd()
    except OSError:  # the current directory was removed
        cwd = None
    for d in (cwd, *cwd.parents) if cwd else ():
        if (d / "asv.conf.json").is_file() and (d / "results").is_dir():
            return d / "results" / "catalog"
    source = Path(__file__).resolve().parents[3]
    if (source / "asv.conf.json").is_file():
        return source / "results" / "catalog"
    return Path(cwd or ".") / "results" / "catalog"


def entry_path(root: Path | str, kind: str, ident: int | float) -> Path:
    if kind not in KINDS:
        raise ValueError(f"unknown catalog kind {kind!r}; expected one of {', '.join(KINDS)}")
    return Path(root) / kind / f"{hex_id(ident)}.json"


def store(root: Path | str, kind: str, obj) -> int:
    """Store ``obj`` under its id (idempotent, atomic) and return the id."""
    return store_text(root, kind, ids.canonical(obj))


def store_text(root: Path | str, kind: str, text: str) -> int:
    """Store a canonical JSON ``text`` made elsewhere (a tree too deep for json.dumps). A file
    already under the id that ``load`` refuses (cut short, edited, merged badly) is kept beside
    it (atomic.backup: ``<id>.json.replaced-<time>``, a name no reader takes) and replaced."""
    ident = ids.text_id(text)
    path = entry_path(root, kind, ident)
    if os.path.lexists(path):
        try:
            load(root, kind, ident)
            return ident
        except MissingEntry:
            try:
                atomic.backup(path)
            except FileNotFoundError:  # removed meanwhile
                pass
    atomic.write_text(path, text + "\n")
    return ident


class MissingEntry(LookupError):
    """A catalog entry that an id names is not on disk."""


def load(root: Path | str, kind: str, ident: int | float):
    """The object stored under ``ident``; MissingEntry names the hex id if absent or unreadable."""
    path = entry_path(root, kind, ident)
    try:
        text = bounded.read_bytes(path, root).decode("utf-8").strip()
        if kind == "orders":  # trees are K deep: json.loads and json.dumps recurse
            obj = trees.parse_entry(text)
            canon = trees.entry_text(obj["tree"], obj["k"])
        else:
            obj = json.loads(text)
            canon = ids.canonical(obj)
        found = ids.text_id(canon)  # a ValueError where the text holds a lone surrogate ("\ud800")
    except FileNotFoundError:
        raise MissingEntry(f"catalog entry {kind}/{hex_id(ident)} is missing ({path})") from None
    # RecursionError: JSON nested too deeply to parse
    except (OSError, ValueError, RecursionError) as exc:
        raise MissingEntry(f"catalog entry {kind}/{hex_id(ident)} is unreadable: {exc}") from None
    if found != int(ident):
        raise MissingEntry(f"catalog entry {kind}/{hex_id(ident)} does not match its id")
    return obj


def parse_spelling(text: str) -> list[tuple[int, int]]:
    """The id ranges [lo, hi] a spelling of an id can mean, as asv and this project print it:
    12 hex digits (``9b9327e25992``), a decimal integer or float (``143656636881798.0``), or a
    rounded float as asv's graphs show it (``1.9e+12``: every id that rounds to it).
    ValueError if it is none of these."""
    t = text.strip().lower()
    out = []
    if len(t) == ID_HEX_DIGITS and all(c in "0123456789abcdef" for c in t):
        ident = int(t, 16)
        out.append((ident, ident))
        if not t.isdigit():
            return out
    try:
        d = Decimal(t)
    except InvalidOperation:
        d = None
    if d is None or not d.is_finite() or d < 0:
        if out:
            return out
        raise ValueError(f"{text!r} is not an id: expected 12 hex digits, "
                         "or a number as asv shows it")
    # 1e15 and up, or rounded that coarsely: none is an id, and int() of a huge exponent
    # (1e999999) is slow
    if d.adjusted() >= 15:
        raise ValueError(f"{text!r} is not an id: ids are below 2**48 = {1 << 4 * ID_HEX_DIGITS}")
    exp = d.as_tuple().exponent
    # 1.9e+12 stands for [1.85e12, 1.95e12]
    half = Decimal(10) ** exp / 2 if exp > 0 else Decimal(0)
    lo, hi = (int((d - half).to_integral_value("ROUND_CEILING")),
              int((d + half).to_integral_value("ROUND_FLOOR")))
    if exp <= 0 and d != d.to_integral_value():
        raise ValueError(f"{text!r} is not an id: ids are whole numbers")
    out.append((lo, hi))
    return out


def find(root: Path | str, text: str) -> list[tuple[str, int]]:
    """(kind, id) of every stored entry that ``text`` (see parse_spelling) can name."""
    ranges = parse_spelling(text)
    found = []
    for kind in KINDS:
        folder = Path(root) / kind
        names = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        for stem in names:
            try:
                ident = int(stem, 16)
            except ValueError:
                continue
            if len(stem) == ID_HEX_DIGITS and any(lo <= ident <= hi for lo, hi in ranges):
                found.append((kind, ident))
    return found
