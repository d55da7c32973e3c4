"""One asv results file read into a Run, within limits. Never imports torch.

In a results file each benchmark is a row of columns named by ``result_columns``. The
``result`` column is a flat list over ``itertools.product(*params)`` of the row's own
``params`` (lists of ``repr`` strings, e.g. ``"'float32'"``); ``null`` for the whole
column means every combination failed. Within it, ``NaN`` is a skipped combination
(``NotImplementedError`` in setup) and ``null`` a failed one; the two are kept apart
here. The ``stats_*`` columns align with ``result`` the same way.

One results file becomes a :class:`Run`: per benchmark a :class:`Series` of numpy arrays,
so judging works on whole arrays rather than one Python object per observation.
Values are in the benchmark's asv ``unit`` (seconds, u, ulp, or a 48-bit id held exactly
in a float64); dates are milliseconds since the epoch, as asv stores them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from matmul_drift.store import bounded

RESULTS_API_VERSION = 2  # asv.results.Results.api_version
MAX_COMBINATIONS = 1 << 20  # parameter combinations in one results row (the suite has 108)
MAX_DATE_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: datetime holds no later day
_INT_PAST_FLOAT = 2**1024 - 2**970  # the least integer float() rounds to infinity (OverflowError)
_KNOWN_COLUMNS = {
    "result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
    "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile",
}
_STATS = ("stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_repeat")


class BadFile(ValueError):
    """One results file cannot be used; the reader warns and goes on with the others."""



@dataclass
class Series:
    """One benchmark's row in one results file.

    ``values`` (float64, in the benchmark's unit) holds one entry per combination of
    ``params`` in ``itertools.product`` order, NaN where skipped *or* failed; ``failed``
    marks the nulls, so skipped == isnan(values) & ~failed. ``stats`` maps asv stat names
    (ci_99_a, ci_99_b, q_25, q_75, repeat; seconds except repeat) to float64 arrays, NaN
    where absent (a one-sample CI is [-inf, inf], as asv writes it); it is None for benchmarks
    without stats (tracks).
    """

    params: tuple[tuple[str, ...], ...]
    version: str | None
    values: np.ndarray
    failed: np.ndarray
    stats: dict[str, np.ndarray] | None = None

    def status(self, i: int) -> str:
        """'failed' (asv null), 'skipped' (asv NaN) or 'ok' for combination ``i``."""
        if self.failed[i]:
            return "failed"
        return "skipped" if math.isnan(self.values[i]) else "ok"


@dataclass
class Run:
    """One results file: one machine, one commit, one environment."""

    machine: str
    commit: str
    env_name: str
    date: int  # commit date, ms since the epoch
    env_params: dict
    path: Path
    series: dict[str, Series]
    torch: str | None = None  # torch version that ran, best known (see History._torch_version)
    rank: int = 0  # its commit's place in the history's commit order (gitorder.commit_ranks)
    # {series: version} of the measuring method (core/series.py), recorded in the env entries or
    # derived from the commit; None where neither is known
    method: dict[str, int] | None = None
    method_recorded: bool = False

    @property
    def order_key(self) -> tuple:
        return (self.rank, version_key(self.torch), self.env_name, self.commit)



# Numbers of at most 18 digits: a longer run (a results file may hold anything) is the
# local label's, not an int() past Python's 4300-digit limit.
_VERSION = re.compile(
    r"v?(\d{1,18}(?:\.\d{1,18})*)"
    r"(?:[-_.]?(a|alpha|b|beta|rc|c|pre|preview)[-_.]?(\d{0,18}))?"
    r"(?:[-_.]?(post|rev|r)[-_.]?(\d{0,18}))?"
    r"(?:[-_.]?(dev)[-_.]?(\d{0,18}))?"
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "rc": 2, "c": 2, "pre": 2, "preview": 2}


def version_key(text: str | None) -> tuple:
    """Sort key comparing versions numerically ("2.9.0" < "2.13.0"), PEP 440 style.

    Accepts asv's mangled matrix strings ("==2.13.0") and local labels ("2.14.1+cu130";
    the label breaks ties only). Unknown versions (None, no digits) sort after all others.
    """
    if not text:
        return (1, (), "")
    m = _VERSION.search(str(text))
    if not m:
        return (1, (), str(text))
    release = tuple(int(x) for x in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]  # 2.13 == 2.13.0
    pre, pre_n, post, post_n, dev, dev_n = m.group(2, 3, 4, 5, 6, 7)
    # Final releases rank above their pre-releases; a bare .devN ranks below everything.
    if pre:
        pre_key = (_PRE_RANK[pre.lower()], int(pre_n or 0))
    elif dev and not post:
        pre_key = (-1, 0)
    else:
        pre_key = (3, 0)
    post_key = int(post_n or 0) if post else -1
    dev_key = (0, int(dev_n or 0)) if dev else (1, 0)
    local = str(text)[m.end():]
    return (0, (release, pre_key, post_key, dev_key), local)


def load_json(path: Path, root: Path):
    """The JSON of ``path``, read within bounded's limits (no link out of ``root``)."""
    return json.loads(bounded.read_bytes(path, root).decode("utf-8"))


def is_params(params) -> bool:
    """asv's params: a list of lists of strings."""
    return isinstance(params, list) and all(
        isinstance(p, list) and all(isinstance(x, str) for x in p) for p in params
    )


def read_results_file(path: Path, machine: str, interned: dict | None = None,
                      warnings: list[str] | None = None) -> Run:
    """One asv results file as a Run. Raises BadFile (or a ValueError) naming what is wrong.

    ``interned`` lets equal param lists share one tuple, so the judge can align two
    series by identity instead of by value. A value of the wrong type where a number
    belongs (JSON true, a string) is skipped (read as asv's NaN) with a line in ``warnings``.
    """
    d = load_json(path, path.parent.parent)
    if not isinstance(d, dict):
        raise BadFile("not a JSON object")
    if d.get("version") != RESULTS_API_VERSION:
        raise BadFile(
            f"asv results format version {d.get('version')!r}; this reader understands "
            f"version {RESULTS_API_VERSION} (asv 0.5+; run `asv update` on older results)"
        )
    commit, env_name, date, env_params = (d.get("commit_hash"), d.get("env_name"), d.get("date"),
                                          d.get("params"))
    if not isinstance(commit, str) or not commit:
        raise BadFile("no commit_hash")
    if not isinstance(env_name, str):
        raise BadFile("no env_name")
    if not isinstance(env_params, dict):
        raise BadFile("no environment params")
    if env_params.get("machine", machine) != machine:
        raise BadFile(f"machine is {env_params.get('machine')!r}, "
                      f"not {machine!r} as machine.json says")
    if isinstance(date, bool) or not isinstance(date, (int, float)):
        raise BadFile("no commit date")
    if not 0 <= date <= MAX_DATE_MS or date != int(date):  # NaN fails the first test
        raise BadFile(f"commit date {date!r:.30} is not whole ms from 1970 to 9999")
    columns = d.get("result_columns")
    rows = d.get("results")
    if not isinstance(columns, list) or not isinstance(rows, dict):
        raise BadFile("no result_columns or results")
    unknown = [c for c in columns if c not in _KNOWN_COLUMNS]
    if unknown:
        raise BadFile(f"unknown result column {unknown[0]!r}")
    col = {c: i for i, c in enumerate(columns)}
    if "result" not in col or "params" not in col:
        raise BadFile("result_columns lack 'result' or 'params'")
    if interned is None:
        interned = {}

    series, odd = {}, []
    for name, row in rows.items():
        if not isinstance(row, list):
            raise BadFile(f"{name}: row is not a list")
        series[name] = _read_row(name, row, col, interned, odd)
    if odd and warnings is not None:
        warnings.append(f"{path}: {len(odd)} values are not finite numbers, skipped "
                        f"(e.g. {odd[0]})")
    return Run(machine, commit, env_name, int(date), env_params, path, series)


def _column(row: list, col: dict, key: str):
    i = col.get(key)
    return row[i] if i is not None and i < len(row) else None


def _read_row(name: str, row: list, col: dict, interned: dict, odd: list[str]) -> Series:
    params = _column(row, col, "params")
    if params is None:
        params = []
    if not is_params(params):
        raise BadFile(f"{name}: params are not lists of strings")
    n = math.prod(len(p) for p in params)
    if n > MAX_COMBINATIONS:  # a few hundred bytes of params can name 10^8 combinations
        raise BadFile(f"{name}: params give {n} combinations, more than {MAX_COMBINATIONS}")
    key = tuple(tuple(p) for p in params)
    params_t = interned.setdefault(key, key)
    version = _column(row, col, "version")
    if version is not None and not isinstance(version, str):
        raise BadFile(f"{name}: version is not a string")

    result = _column(row, col, "result")
    if result is None:
        # asv compresses an all-null column to null: every combination failed.
        values, failed = np.full(n, np.nan), np.ones(n, dtype=bool)
    else:
        values, failed = _floats(name, "result", result, n, odd=odd)

    stats = None
    if any(_column(row, col, k) is not None for k in _STATS):
        stats = {}
        for k in _STATS:
            v = _column(row, col, k)
            stats[k[6:]] = (np.full(n, np.nan) if v is None
                            else _floats(name, k, v, n, stats=True, odd=odd)[0])
    return Series(params_t, version, values, failed, stats)


def _floats(name: str, column: str, lst, n: int, stats: bool = False,
            odd: list[str] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A JSON list of numbers/nulls as (float64 array with NaN for null, null mask or None; None
    for a ``stats`` column). An entry that is neither a number nor null (true, "1.5", a list), an
    integer no float64 holds (10**400: numpy raises on it, which would drop the whole file), or
    is ±Infinity in a result (no value of this suite, and one the judge could not compare),
    becomes NaN, and its description is appended to ``odd``: numpy alone would read true as 1
    and "1.5" as 1.5. In a stats column ±Infinity is kept: asv writes a one-sample 99 % CI
    (asv run --quick) as [-Infinity, Infinity]."""
    if not isinstance(lst, list) or len(lst) != n:
        raise BadFile(f"{name}: {column} has "
                      f"{len(lst) if isinstance(lst, list) else 'no'} entries, "
                      f"params give {n}")
    # `None in lst` scans in C; the common no-failure case then skips the Python loop.
    if stats:
        failed = None
    elif None in lst:
        failed = np.fromiter((v is None for v in lst), dtype=bool, count=n)
    else:
        failed = np.zeros(n, dtype=bool)
    bad = [i for i, v in enumerate(lst)
           if v is not None and (not -_INT_PAST_FLOAT < v < _INT_PAST_FLOAT if type(v) is int else
                                 type(v) is not float
                                 or (not stats and v in (math.inf, -math.inf)))]
    if bad:
        if odd is not None:
            odd += [f"{name} {column}[{i}] = {json.dumps(lst[i])[:40]}" for i in bad]
        skip = set(bad)
        lst = [math.nan if i in skip else v for i, v in enumerate(lst)]
    values = np.array(lst, dtype=np.float64)  # numpy turns null into NaN
    return values, failed
