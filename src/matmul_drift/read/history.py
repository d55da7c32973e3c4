"""asv results plus the catalog, read into observations. Never imports torch.

Layout read (asv 0.6 result format version 2, as written by ``asv.results.Results.save``)::

    <asv dir>/benchmarks.json                  name -> {"unit", "params", "param_names", "version", ...}
    <asv dir>/<machine>/machine.json           {"machine": name, ...}
    <asv dir>/<machine>/<commit8>-<env>.json   one run: a commit in an environment
    <catalog dir>/{kernels,env,fixes}/<12 hex>.json  content-addressed entries (see store/catalog.py)

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

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from matmul_drift.core import series
from matmul_drift.read import commits as gitorder
from matmul_drift.store import bounded
from matmul_drift.store import catalog as _catalog

RESULTS_API_VERSION = 2  # asv.results.Results.api_version
BENCHMARKS_API_VERSION = 2  # asv.benchmarks.Benchmarks.api_version
_SKIP_FILES = {"machine.json", "benchmarks.json"}
_TRACK = re.compile(r"^drift\.Drift\.track_(\w+)$")  # the suite's series, named as asv names them
MAX_COMBINATIONS = 1 << 20  # parameter combinations in one results row (the suite has 108)
MAX_DATE_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: datetime holds no later day
_INT_PAST_FLOAT = 2**1024 - 2**970  # the least integer that float() rounds to infinity (OverflowError)
_KNOWN_COLUMNS = {
    "result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
    "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile",
}
_STATS = ("stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_repeat")


class HistoryError(Exception):
    """Nothing can be summarised: missing or empty directory, unknown machine, no benchmarks.json.

    ``warnings`` holds what was met before giving up (e.g. each unreadable results file).
    """

    def __init__(self, message: str, warnings: list[str] | None = None):
        super().__init__(message)
        self.warnings = list(warnings or [])


class BadFile(ValueError):
    """One results file cannot be used; the reader warns and goes on with the others."""


@dataclass
class Benchmark:
    """One entry of benchmarks.json: what a series means. ``params`` are asv repr strings."""

    name: str
    unit: str
    type: str
    param_names: list[str]
    params: list[list[str]]
    version: str | None


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


@dataclass
class Observation:
    """One value: keyed by machine, environment, commit, benchmark and parameters."""

    machine: str
    env_name: str
    commit: str
    date: int
    torch: str | None
    benchmark: str
    params: dict[str, str]
    value: float  # NaN when status is not 'ok'
    status: str  # 'ok', 'skipped' or 'failed'
    version: str | None


class Catalog:
    """Catalog entries, each read at most once (hits and misses are both cached).

    A missing or unreadable entry gives None and one warning naming its hex id.
    """

    def __init__(self, root: Path | str, warnings: list[str] | None = None):
        self.root = Path(root)
        self.warnings = warnings if warnings is not None else []
        self._cache: dict[tuple[str, int], object] = {}

    def get(self, kind: str, ident: float | int | None):
        if ident is None or not math.isfinite(ident) or ident < 0 or ident != int(ident):
            return None
        key = (kind, int(ident))
        try:
            return self._cache[key]
        except KeyError:
            pass
        try:
            obj = _catalog.load(self.root, kind, int(ident))
        except _catalog.MissingEntry as exc:
            self.warnings.append(str(exc))
            obj = None
        self._cache[key] = obj
        return obj


@dataclass
class History:
    """Everything read: benchmarks, machines and their runs in order, and warnings.

    ``runs[machine]`` is ordered by commit (git's order where the repository is at hand, else
    by commit date: see read/commits.py), then torch version (numerically), then environment
    name. ``warnings`` name each file that could not be used.
    """

    asv_dir: Path
    catalog: Catalog
    benchmarks: dict[str, Benchmark]
    machines: dict[str, dict]
    runs: dict[str, list[Run]]
    warnings: list[str] = field(default_factory=list)
    # re-measurements of suspected timing changes (results/confirm), by rules.confirmation_key
    confirmations: dict[tuple, dict] = field(default_factory=dict)

    def units(self) -> dict[str, str]:
        return {name: b.unit for name, b in self.benchmarks.items()}

    def of(self, machine: str) -> History:
        """The history of ``machine`` alone: its runs (the same objects), the warnings list shared."""
        return History(self.asv_dir, self.catalog, self.benchmarks, {machine: self.machines.get(machine, {})},
                       {machine: self.runs.get(machine, [])}, self.warnings, self.confirmations)

    def param_names(self, benchmark: str, params: tuple) -> list[str]:
        """Names for a row's params: benchmarks.json's, if they fit the row, else p0, p1, ..."""
        b = self.benchmarks.get(benchmark)
        if b is not None and len(b.param_names) == len(params):
            return b.param_names
        return [f"p{i}" for i in range(len(params))]

    def params_dict(self, benchmark: str, params: tuple, combo: tuple[str, ...]) -> dict[str, str]:
        """{param name: display value} for one combination (repr strings unquoted)."""
        return dict(zip(self.param_names(benchmark, params), (display_param(p) for p in combo)))

    def env_entry(self, run: Run, params: dict[str, str]) -> dict | None:
        """The env catalog entry (measure/environment.py) that ``run`` recorded for the
        combination ``params`` ({name: display value}); None where it recorded none."""
        s = run.series.get(ENV_SERIES)
        if s is None:
            return None
        names = self.param_names(ENV_SERIES, s.params)
        for i, combo in enumerate(itertools.product(*s.params)):
            if all(params.get(n) == display_param(v) for n, v in zip(names, combo)):
                entry = self.catalog.get("env", float(s.values[i]))
                return entry if isinstance(entry, dict) else None
        return None

    def observations(self, machine: str | None = None) -> Iterator[Observation]:
        """Every value, one object each: convenient, not fast (the summary uses the arrays)."""
        for m, runs in self.runs.items():
            if machine is not None and m != machine:
                continue
            for run in runs:
                for name, s in run.series.items():
                    for i, combo in enumerate(itertools.product(*s.params)):
                        yield Observation(
                            m, run.env_name, run.commit, run.date, run.torch, name,
                            self.params_dict(name, s.params, combo), float(s.values[i]),
                            s.status(i), s.version,
                        )


# ---------------------------------------------------------------------------- helpers


_PARAM_REPR = re.compile(r"^u?'(.+)'$|^<class '(.+)'>$")


def display_param(text: str) -> str:
    """An asv param repr as a person writes it: "'float32'" -> "float32" (as asv displays it)."""
    m = _PARAM_REPR.match(text)
    if m:
        inner = m.group(1) or m.group(2)
        if inner.strip():
            return inner
    return text


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


_ENV_TORCH = re.compile(r"torch[=<>~!_-]*v?(\d+(?:\.\d+)+[^-]*)")


def resolve_dirs(path: Path | str = "results", catalog: Path | str | None = None) -> tuple[Path, Path]:
    """(asv results dir, catalog dir) for RESULTS_DIR.

    ``results/`` means ``results/asv`` and ``results/catalog``; a directory that is itself
    asv's results dir (it has benchmarks.json or machine folders) has its catalog at
    ``../catalog``. ``catalog`` overrides the catalog dir.
    """
    p = Path(path)
    if not p.exists():
        raise HistoryError(f"results directory {p} does not exist")
    if not p.is_dir():
        raise HistoryError(f"{p} is not a directory")
    if (p / "asv").is_dir():
        asv_dir, cat = p / "asv", p / "catalog"
    else:
        asv_dir, cat = p, p.parent / "catalog"
    return asv_dir, Path(catalog) if catalog is not None else cat


# ---------------------------------------------------------------------------- reading


def read_history(
    path: Path | str = "results",
    *,
    machine: str | None = None,
    catalog: Path | str | None = None,
) -> History:
    """Read RESULTS_DIR (see resolve_dirs) into a History.

    Raises HistoryError when nothing can be summarised: the directory is missing or holds
    no readable results, benchmarks.json is missing or unreadable, or ``machine`` is not
    there. A bad results file, machine.json or catalog entry only adds a warning.
    """
    asv_dir, cat_dir = resolve_dirs(path, catalog)
    warnings: list[str] = []
    benchmarks = _read_benchmarks(asv_dir, warnings)
    _check_units(benchmarks, warnings)

    machine_dirs = []
    for d in sorted(_subdirs(asv_dir)):
        try:
            if d.is_symlink() and not bounded.inside(d, asv_dir):
                warnings.append(f"skipping {d}: a symlink out of {asv_dir}; not followed")
                continue
        except bounded.Refused as exc:
            warnings.append(f"skipping {d}: {exc}")
            continue
        if not _has_json(d):
            continue
        if _shown(d.name) != d.name:  # its name would reach the report as unwritable surrogates
            warnings.append(f"skipping results in {_shown(d)}: the folder's name is not UTF-8")
            continue
        machine_dirs.append(d)
    if not machine_dirs:
        raise HistoryError(f"no asv results under {asv_dir}")
    machines: dict[str, dict] = {}
    dirs_by_machine: dict[str, Path] = {}
    for d in machine_dirs:
        info = _read_machine(d, warnings)
        if info is None:
            continue
        name, other = info["machine"], dirs_by_machine.get(info["machine"])
        if other is not None:  # two folders, one machine: asv keeps one, named for it
            keep, drop = (d, other) if d.name == name != other.name else (other, d)
            warnings.append(f"skipping results in {drop}: its machine.json names {name!r}, as {keep}'s does; "
                            "asv keeps one folder per machine, named for it")
            if keep is other:
                continue
        machines[name] = info
        dirs_by_machine[name] = d
    if machine is not None:
        if machine not in dirs_by_machine:
            known = ", ".join(sorted(dirs_by_machine)) or "none"
            raise HistoryError(f"unknown machine {machine!r} under {asv_dir}; known: {known}", warnings)
        dirs_by_machine = {machine: dirs_by_machine[machine]}
        machines = {machine: machines[machine]}

    history = History(asv_dir, Catalog(cat_dir, warnings), benchmarks, machines, {}, warnings)
    interned: dict[tuple, tuple] = {}
    for name, d in dirs_by_machine.items():
        runs = []
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            if not entry.name.endswith(".json") or entry.name in _SKIP_FILES:
                continue  # anything else named .json (a FIFO, a link) is refused below, with a warning
            p = Path(entry.path)
            if _shown(entry.name) != entry.name:
                warnings.append(f"skipping {_shown(p)}: the file's name is not UTF-8")
                continue
            try:
                run = read_results_file(p, name, interned, warnings)
            except (BadFile, ValueError, TypeError, KeyError, IndexError, AttributeError,
                    OverflowError, RecursionError, OSError) as exc:
                # UnicodeDecodeError and json.JSONDecodeError are ValueErrors.
                warnings.append(f"skipping {p}: {_reason(exc)}")
                continue
            runs.append(run)
        for run in runs:
            run.torch = _torch_version(run, history)
        history.runs[name] = runs
    if not any(history.runs.values()):
        raise HistoryError(f"no readable asv results under {asv_dir}", warnings)
    dates: dict[str, int] = {}
    for run in (r for runs in history.runs.values() for r in runs):
        dates[run.commit] = min(run.date, dates.get(run.commit, run.date))
    ranks = gitorder.commit_ranks(dates, asv_dir, warnings)
    for runs in history.runs.values():
        for run in runs:
            run.rank = ranks[run.commit]
        runs.sort(key=lambda r: r.order_key)
    _methods(history, asv_dir)
    history.confirmations = read_confirmations(asv_dir.parent / CONFIRM, set(history.runs), warnings)
    return history


CONFIRM = "confirm"  # beside asv's results dir: <confirm>/<machine>/<commit8>-<time>.json


def read_confirmations(folder: Path, machines: set[str], warnings: list[str]) -> dict[tuple, dict]:
    """Every re-measurement under ``folder`` (jobs/confirm.py writes them), keyed as
    rules.confirmation_key; of two for one pair, the later file's. A file that cannot be read
    is a warning."""
    out: dict[tuple, dict] = {}
    for machine in sorted(machines):
        d = folder / machine
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.json")):
            try:
                doc = json.loads(bounded.read_bytes(p, folder))
                for c in doc["checks"]:
                    b, a = c["before"], c["after"]
                    key = (machine, c["benchmark"], tuple(sorted((str(k), str(v)) for k, v in c["params"].items())),
                           b["commit"], b["env"], a["commit"], a["env"])
                    out[key] = c
            except (OSError, ValueError, KeyError, TypeError, AttributeError, bounded.Refused) as exc:
                warnings.append(f"skipping {_shown(p)}: not a re-measurement record ({type(exc).__name__}: {exc})")
    return out


ENV_SERIES = "drift.Drift.track_env_id"


def _methods(history: History, asv_dir: Path) -> None:
    """Each run's measuring method: as its env entries recorded it, else derived from its commit."""
    unrecorded = []
    for run in (r for runs in history.runs.values() for r in runs):
        s = run.series.get(ENV_SERIES)
        found = None
        for env_id in () if s is None else dict.fromkeys(s.values[np.isfinite(s.values)].tolist()):
            entry = history.catalog.get("env", env_id)
            if isinstance(entry, dict) and isinstance(entry.get("method"), dict):
                found = {k: v for k, v in entry["method"].items() if isinstance(v, int) and not isinstance(v, bool)}
                break
        if found is not None:
            run.method, run.method_recorded = found, True
        else:
            unrecorded.append(run)
    if unrecorded:
        derived = gitorder.method_versions(list(dict.fromkeys(r.commit for r in unrecorded)), asv_dir, [])
        for run in unrecorded:
            run.method = derived.get(run.commit)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (BadFile, bounded.Refused)):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); truncated or corrupt?"
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    return f"malformed results file ({type(exc).__name__}: {exc})"


def _shown(path: Path | str) -> str:
    """``path`` as text any output can hold: bytes that are not UTF-8 (which Python keeps
    as lone surrogates) written as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _subdirs(p: Path) -> list[Path]:
    try:
        entries = list(os.scandir(p))
    except OSError as exc:
        raise HistoryError(f"cannot list {p}: {exc.strerror}") from None
    out = []
    for e in entries:
        try:
            if e.is_dir():
                out.append(Path(e.path))
        except OSError:  # a symlink loop is no directory
            pass
    return out


def _has_json(d: Path) -> bool:
    try:
        return any(e.name.endswith(".json") for e in os.scandir(d))
    except OSError:
        return False


def _load_json(path: Path, root: Path):
    return json.loads(bounded.read_bytes(path, root).decode("utf-8"))


def _read_benchmarks(asv_dir: Path, warnings: list[str]) -> dict[str, Benchmark]:
    path = asv_dir / "benchmarks.json"
    if not os.path.lexists(path):  # a broken or looping symlink is there: the reader refuses it
        if not any((d / "machine.json").exists() for d in _subdirs(asv_dir)):
            raise HistoryError(f"no asv results under {asv_dir}")
        raise HistoryError(f"{path} is missing; it says which unit each benchmark has")
    try:
        data = _load_json(path, asv_dir)
    except (OSError, ValueError, RecursionError) as exc:
        raise HistoryError(f"cannot read {path}: {_reason(exc)}") from None
    if not isinstance(data, dict):
        raise HistoryError(f"cannot read {path}: not a JSON object")
    if data.get("version") != BENCHMARKS_API_VERSION:
        raise HistoryError(
            f"{path} is asv benchmarks format version {data.get('version')!r}; "
            f"this reader understands version {BENCHMARKS_API_VERSION}"
        )
    out = {}
    for name, b in data.items():
        if name == "version":
            continue
        try:
            params = b.get("params") or []
            names = b.get("param_names") or []
            if not (isinstance(b["unit"], str) and _is_params(params)
                    and all(isinstance(n, str) for n in names)):
                raise TypeError
            version = b.get("version")
            out[name] = Benchmark(name, b["unit"], str(b.get("type", "")), list(names),
                                  [list(p) for p in params], None if version is None else str(version))
        except (TypeError, KeyError, AttributeError):
            warnings.append(f"benchmarks.json: entry {name!r} is malformed; its results are not judged")
    return out


# How strictly a unit is judged (summary.py's rules): ids, u, ulp and counts give failing
# flags by default; seconds and the u bound only inform.
_STRICTNESS = {"kernel-id": 2, "input-id": 2, "env-id": 2, "fix-id": 2, "order-id": 2, "map-id": 2, "u": 2, "ulp": 2, "count": 2, "u-bound": 1,
               "seconds": 1, "ratio": 1, "q20-seconds": 1, "q80-seconds": 1, "clock-fell": 1}


def _check_units(benchmarks: dict[str, Benchmark], warnings: list[str]) -> None:
    """benchmarks.json says how each series is judged; a tree can say it wrongly (a kernel-id
    relabelled seconds would turn a failing kernel flag into an informational timing one).
    The suite's own record (series.UNITS, which its benchmarks take their units from) is
    checked against it: a disagreement is a warning, and the stricter judgement wins."""
    for name, b in benchmarks.items():
        m = _TRACK.search(name)
        want = series.UNITS.get(m.group(1)) if m else None
        if want is None or want == b.unit:
            continue
        use = b.unit if _STRICTNESS.get(b.unit, 0) > _STRICTNESS[want] else want
        warnings.append(f"benchmarks.json gives {name} the unit {b.unit!r}, the suite's record {want!r}; "
                        f"judged as {use!r}")
        b.unit = use


def _read_machine(d: Path, warnings: list[str]) -> dict | None:
    path = d / "machine.json"
    try:
        info = _load_json(path, d.parent)
        if not isinstance(info, dict) or not isinstance(info.get("machine"), str):
            raise BadFile("no machine name")
    except FileNotFoundError:
        warnings.append(f"skipping results in {d}: no machine.json")
        return None
    except (OSError, ValueError, RecursionError) as exc:
        warnings.append(f"skipping results in {d}: {path.name} unreadable: {_reason(exc)}")
        return None
    return info


def _is_params(params) -> bool:
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
    d = _load_json(path, path.parent.parent)
    if not isinstance(d, dict):
        raise BadFile("not a JSON object")
    if d.get("version") != RESULTS_API_VERSION:
        raise BadFile(
            f"asv results format version {d.get('version')!r}; this reader understands "
            f"version {RESULTS_API_VERSION} (asv 0.5+; run `asv update` on older results)"
        )
    commit, env_name, date, env_params = d.get("commit_hash"), d.get("env_name"), d.get("date"), d.get("params")
    if not isinstance(commit, str) or not commit:
        raise BadFile("no commit_hash")
    if not isinstance(env_name, str):
        raise BadFile("no env_name")
    if not isinstance(env_params, dict):
        raise BadFile("no environment params")
    if env_params.get("machine", machine) != machine:
        raise BadFile(f"machine is {env_params.get('machine')!r}, not {machine!r} as machine.json says")
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
        warnings.append(f"{path}: {len(odd)} values are not finite numbers, skipped (e.g. {odd[0]})")
    return Run(machine, commit, env_name, int(date), env_params, path, series)


def _column(row: list, col: dict, key: str):
    i = col.get(key)
    return row[i] if i is not None and i < len(row) else None


def _read_row(name: str, row: list, col: dict, interned: dict, odd: list[str]) -> Series:
    params = _column(row, col, "params")
    if params is None:
        params = []
    if not _is_params(params):
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
            stats[k[6:]] = np.full(n, np.nan) if v is None else _floats(name, k, v, n, stats=True, odd=odd)[0]
    return Series(params_t, version, values, failed, stats)


def _floats(name: str, column: str, lst, n: int, stats: bool = False,
            odd: list[str] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A JSON list of numbers/nulls as (float64 array with NaN for null, null mask or None; None
    for a ``stats`` column). An entry that is neither a number nor null (true, "1.5", a list), an
    integer no float64 holds (10**400: numpy raised, and the whole file was dropped), or
    is ±Infinity in a result (no value of this suite, and one the judge could not compare),
    becomes NaN, and its description is appended to ``odd``: numpy alone would read true as 1
    and "1.5" as 1.5. In a stats column ±Infinity is kept: asv writes a one-sample 99 % CI
    (asv run --quick) as [-Infinity, Infinity]."""
    if not isinstance(lst, list) or len(lst) != n:
        raise BadFile(f"{name}: {column} has {len(lst) if isinstance(lst, list) else 'no'} entries, "
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
                                 type(v) is not float or (not stats and v in (math.inf, -math.inf)))]
    if bad:
        if odd is not None:
            odd += [f"{name} {column}[{i}] = {json.dumps(lst[i])[:40]}" for i in bad]
        skip = set(bad)
        lst = [math.nan if i in skip else v for i, v in enumerate(lst)]
    values = np.array(lst, dtype=np.float64)  # numpy turns null into NaN
    return values, failed


def _torch_version(run: Run, history: History) -> str | None:
    """The torch version of a run: what the env-id catalog says actually ran, else asv's
    env params (matrix strings may be mangled, "==2.13.0"), else the env name."""
    for name, s in run.series.items():
        b = history.benchmarks.get(name)
        if b is None or b.unit != "env-id":
            continue
        finite = s.values[np.isfinite(s.values)]
        if finite.size:
            entry = history.catalog.get("env", finite[0])
            if isinstance(entry, dict) and isinstance(entry.get("torch"), dict):
                v = entry["torch"].get("version")
                if v:
                    return str(v)
        break
    v = run.env_params.get("torch")
    if v:
        return str(v).lstrip("=<>~! ")
    m = _ENV_TORCH.search(run.env_name)
    return m.group(1) if m else None
