"""The records that scan and the map keep: read, checked before a resume, written atomically.

A record is a JSON object with a ``schema``, the ``params`` of what was searched, every
measured ``points`` (one a line, so a rewrite is quick and a diff readable) and the
``sessions`` that measured them. No torch here.
"""

from __future__ import annotations

import json
import math

from matmul_drift.core import ids
from matmul_drift.store import atomic


class RecordError(ValueError):
    """A record that cannot be read, written or resumed as asked (one line)."""


def integer(x) -> bool:
    """An int that is no bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def number(x) -> bool:
    """A finite number that fits a double: the plot converts it, json.dumps(allow_nan=False)
    writes it."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:  # an integer beyond a double
        return False


def head(schema: str, params: dict, complete: bool) -> dict:
    """What every record begins with: its ``schema``, ``params`` and whether it is ``complete``."""
    return {"schema": schema, "params": params, "complete": complete}


def point_ok(p, lo: int, hi: int) -> bool:
    """What every point holds: a ``size`` in lo..hi, a ``kernel_id`` and ``kernels`` (strings)."""
    return (isinstance(p, dict) and integer(p.get("size")) and lo <= p["size"] <= hi
            and isinstance(p.get("kernel_id"), str)
            and isinstance(p.get("kernels"), list)
            and all(isinstance(k, str) for k in p["kernels"]))


def check(rec, params: dict, *, schema: str, what: str, point_ok, param_words=None) -> None:
    """RecordError unless ``rec`` is a record of ``schema`` whose params are ``params``, with
    every point passing ``point_ok(point)`` and well-formed sessions (a resumed point is
    rendered, plotted and written back as it is). ``what`` ("scan", "map") names the record in
    the messages; ``param_words(key, value)`` words a parameter (default: repr)."""
    words = param_words or (lambda key, value: repr(value))
    if not isinstance(rec, dict) or rec.get("schema") != schema:
        raise RecordError(f"not a {what} record (schema {schema} expected)")
    for key, kind, shape in (("params", dict, "an object"), ("points", list, "a list"),
                             ("sessions", list, "a list")):
        if not isinstance(rec.get(key), kind):
            raise RecordError(f"the record's {key} is not {shape}: {str(rec.get(key))[:40]}")
    recorded = rec["params"]
    differ = [f"{key}: recorded {words(key, recorded.get(key))}, here {words(key, value)}"
              for key, value in params.items() if recorded.get(key) != value]
    if differ:
        raise RecordError(f"the record is another {what}; " + "; ".join(differ))
    for p in rec["points"]:
        if not point_ok(p):
            raise RecordError(f"the record holds a malformed point: {str(p)[:80]}")
    for s in rec["sessions"]:
        if not (isinstance(s, dict) and s.keys() == {"evaluated", "seconds", "complete"}
                and integer(s["evaluated"]) and number(s["seconds"])
                and isinstance(s["complete"], bool)):
            raise RecordError(f"the record holds a malformed session: {str(s)[:80]}")


def load(path: str) -> dict:
    """A record from ``path``; RecordError (one line) if unreadable."""
    # 1e400 is valid JSON, but inf once parsed, and no rewrite could write it
    def parse_number(text):
        x = float(text)
        if not math.isfinite(x):
            raise RecordError(f"{path} holds the number {text[:40]}, beyond the range of a double")
        return x

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh, parse_constant=ids.no_constant, parse_float=parse_number)
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror}") from None
    except RecordError:
        raise
    except ValueError as exc:
        raise RecordError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise RecordError(f"{path} is nested too deeply to be a scan record") from None


def dumps(rec: dict) -> str:
    """A record as JSON text with one point per line: readable, diffable and quick to rewrite."""
    head = json.dumps({k: v for k, v in rec.items() if k != "points"}, indent=1, allow_nan=False)
    points = ",\n".join(json.dumps(p, allow_nan=False) for p in rec["points"])
    return f'{head[:-2]},\n "points": [\n{points}\n ]\n}}\n'


def write_atomic(path: str, obj: dict, new: bool = False) -> None:
    """Write ``obj`` as JSON atomically: an interruption leaves the old file or the new one.
    ``new``: the record's first write, which leaves alone a file that appeared at ``path``."""
    write_file(path, dumps(obj).encode(), new,
               "the record is in {kept}: --resume {kept} continues it")


def write_file(path: str, data: bytes, new: bool, kept_words: str) -> None:
    """Write ``data`` to ``path`` atomically (``new``: only where nothing is); RecordError (one
    line) when the system refuses, or when ``path`` appeared meanwhile: then the data are kept
    beside it, and ``kept_words`` (with {kept}, the file's name) says where."""
    try:
        (atomic.write_new if new else atomic.write_bytes)(path, data)
    except atomic.Taken as exc:
        raise RecordError(f"{path} appeared while the scan ran and is left as it is; "
                          + kept_words.format(kept=exc.kept)) from None
    # a folder made read-only meanwhile, a full disk, /proc (root passes os.access)
    except OSError as exc:
        raise RecordError(f"cannot write {path}: {exc.strerror or exc}") from None
