"""A night costs what changed: where a combination's kernel id, environment id and input id
equal this machine's last recorded result for the same build, its order tree, fix verdicts and
batch-invariance map are confirmed cheaply instead of measured again (docs/design.md, "The main
job").

The main job names that result in $MATMUL_DRIFT_REUSE (a results file of this machine and
build); a plain `asv run` sets nothing and measures everything. The environment id covers the
torch build, the CPU or GPU, the route variables, the threads and the measuring method's
versions, so a record from another build, machine or method version is never reused.
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
from pathlib import Path

from matmul_drift.jobs import asvrun
from matmul_drift.jobs.selection import Cell
from matmul_drift.read import history
from matmul_drift.store import catalog

REUSE_VAR = "MATMUL_DRIFT_REUSE"  # a results file of this machine and build; unset or "0": none
SAME = ("kernel_id", "env_id", "input_id")
KEPT = ("order_id", "fix_id", "fix_cost", "map_id")


def record_path(env: dict | None = None) -> Path | None:
    """The results file named by $MATMUL_DRIFT_REUSE, or None where it is unset or "0"."""
    raw = (os.environ if env is None else env).get(REUSE_VAR, "").strip()
    return None if raw in ("", "0") else Path(raw)


def last_record(folder: Path, env_name: str) -> Path | None:
    """The results file of environment ``env_name`` in a machine's ``folder`` that was measured
    last (asv's started_at), or None where there is none that can be read."""
    best, when = None, -1
    for path in asvrun.results_files(folder):
        d = asvrun.json_object(path)
        if not d or d.get("env_name") != env_name or not isinstance(d.get("result_columns"), list) \
                or "started_at" not in d["result_columns"] \
                or not isinstance(d.get("results"), dict):
            continue
        col = d["result_columns"].index("started_at")
        started = [row[col] for row in d["results"].values() if isinstance(row, list)
                   and len(row) > col and isinstance(row[col], (int, float))]
        if started and max(started) > when:
            best, when = path, max(started)
    return best


def previous(path: Path) -> tuple[str, dict[Cell, dict[str, float]]]:
    """(commit, {cell: {series: value}}) of the recorded result at ``path`` (its folder names
    the machine): the ids in SAME and the values in KEPT, NaN where skipped or failed.
    ValueError (or OSError) naming what is wrong where it cannot be read."""
    run = history.read_results_file(path, path.parent.name)
    out: dict[Cell, dict[str, float]] = {}
    for name in (*SAME, *KEPT):
        s = run.series.get(f"drift.Drift.track_{name}")
        if s is None:
            continue
        for i, combo in enumerate(itertools.product(*s.params)):
            cell = Cell(*(history.display_param(p) for p in combo))
            out.setdefault(cell, {})[name] = float(s.values[i])
    return run.commit, out


def matches(values: dict, record: dict | None, name: str) -> bool:
    """Whether ``record`` may stand for ``values`` for the series ``name``: the same kernel,
    environment and input ids (all recorded, none NaN), and ``name`` recorded there."""
    if not record:
        return False
    got = [record.get(k, math.nan) for k in (*SAME, name)]
    return all(not math.isnan(x) for x in got) and all(values.get(k) == record[k] for k in SAME)


def stored(values: dict, record: tuple[str, dict] | None, k: Cell, name: str, kind: str, root,
           what: str, afresh: str = "measured afresh"
           ) -> tuple[str, float, object | None, str | None]:
    """The catalog entry (kind ``kind``) that ``record`` (previous's) holds for combination
    ``k``'s series ``name``, where it may stand for ``values``: (commit, its id, the entry, None).
    Otherwise the entry is None and the last item says why in a log line's words ("measured
    afresh: ..."; ``what`` names the entry, "{ident}" its 12 hex), or is None where nothing was
    recorded for ``k``."""
    if record is None or k not in record[1]:
        return "", math.nan, None, None
    commit, rec = record[0][:8], record[1][k]
    if not matches(values, rec, name):
        return commit, math.nan, None, f"{afresh}: {differs(values, rec, name)} at {commit}"
    try:
        return commit, rec[name], catalog.load(root, kind, rec[name]), None
    except (catalog.MissingEntry, ValueError) as exc:
        entry = what.format(ident=_hex(rec[name]))
        return commit, rec[name], None, f"{afresh}: {entry} of {commit} cannot be read ({exc})"


def differs(values: dict, record: dict, name: str) -> str:
    """Why ``record`` may not stand for ``values`` (matches is False): the first id that changed,
    or ``name`` not recorded."""
    for k in SAME:
        if values.get(k) != record.get(k):
            return f"{k.replace('_', ' ')} {_hex(values.get(k))} was {_hex(record.get(k))}"
    return f"no {name.replace('_', ' ')} recorded"


def _hex(x) -> str:
    return "none" if x is None or math.isnan(x) else f"{int(x):012x}"


def fresh_seed() -> int:
    """A seed no earlier run used: the draws that confirm a tree are new each night."""
    return secrets.randbits(63)


def removers(entry: dict) -> list[str]:
    """The candidates a stored fix entry (suite.fix_entry) says remove every drift."""
    return sorted(name for name, v in entry.get("verdicts", {}).items() if v == "removes")
