"""asv results plus the catalog, read into observations. Never imports torch.

Layout read (asv 0.6 result format version 2, as written by ``asv.results.Results.save``)::

    <asv dir>/benchmarks.json                  name -> {"unit", "params", "param_names",
                                               "version", ...}
    <asv dir>/<machine>/machine.json           {"machine": name, ...}
    <asv dir>/<machine>/<commit8>-<env>.json   one run: a commit in an environment
    <catalog dir>/{kernels,env,fixes}/<12 hex>.json  content-addressed entries
                                                     (see store/catalog.py)

One results file becomes a Run (resultsfile.py); the runs, the benchmarks and the catalog
become a History, and its observations.
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
from matmul_drift.read.resultsfile import (BadFile, Run, Series, is_params, load_json,
                                           read_results_file, version_key)
from matmul_drift.store import catalog as _catalog

BENCHMARKS_API_VERSION = 2  # asv.benchmarks.Benchmarks.api_version
_SKIP_FILES = {"machine.json", "benchmarks.json"}
_TRACK = re.compile(r"^drift\.Drift\.track_(\w+)$")  # the suite's series, named as asv names them


class HistoryError(Exception):
    """Nothing can be summarised: missing or empty directory, unknown machine, no benchmarks.json.

    ``warnings`` holds what was met before giving up (e.g. each unreadable results file).
    """

    def __init__(self, message: str, warnings: list[str] | None = None):
        super().__init__(message)
        self.warnings = list(warnings or [])


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
        """The history of ``machine`` alone: its runs (the same objects), the warnings list
        shared."""
        return History(self.asv_dir, self.catalog, self.benchmarks,
                       {machine: self.machines.get(machine, {})},
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


_ENV_TORCH = re.compile(r"torch[=<>~!_-]*v?(\d+(?:\.\d+)+[^-]*)")


def resolve_dirs(path: Path | str = "results",
                 catalog: Path | str | None = None) -> tuple[Path, Path]:
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
            warnings.append(f"skipping results in {drop}: its machine.json names {name!r}, "
                            f"as {keep}'s does; "
                            "asv keeps one folder per machine, named for it")
            if keep is other:
                continue
        machines[name] = info
        dirs_by_machine[name] = d
    if machine is not None:
        if machine not in dirs_by_machine:
            known = ", ".join(sorted(dirs_by_machine)) or "none"
            raise HistoryError(f"unknown machine {machine!r} under {asv_dir}; known: {known}",
                               warnings)
        dirs_by_machine = {machine: dirs_by_machine[machine]}
        machines = {machine: machines[machine]}

    history = History(asv_dir, Catalog(cat_dir, warnings), benchmarks, machines, {}, warnings)
    interned: dict[tuple, tuple] = {}
    for name, d in dirs_by_machine.items():
        runs = []
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            if not entry.name.endswith(".json") or entry.name in _SKIP_FILES:
                # anything else named .json (a FIFO, a link) is refused below, with a warning
                continue
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
    history.confirmations = read_confirmations(asv_dir.parent / CONFIRM, set(history.runs),
                                               warnings)
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
                    key = (machine, c["benchmark"],
                           tuple(sorted((str(k), str(v)) for k, v in c["params"].items())),
                           b["commit"], b["env"], a["commit"], a["env"])
                    out[key] = c
            except (OSError, ValueError, KeyError, TypeError, AttributeError,
                    bounded.Refused) as exc:
                warnings.append(f"skipping {_shown(p)}: not a re-measurement record "
                                f"({type(exc).__name__}: {exc})")
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
                found = {k: v for k, v in entry["method"].items()
                         if isinstance(v, int) and not isinstance(v, bool)}
                break
        if found is not None:
            run.method, run.method_recorded = found, True
        else:
            unrecorded.append(run)
    if unrecorded:
        derived = gitorder.method_versions(list(dict.fromkeys(r.commit for r in unrecorded)),
                                           asv_dir, [])
        for run in unrecorded:
            run.method = derived.get(run.commit)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (BadFile, bounded.Refused)):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return (f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                "truncated or corrupt?")
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


def _read_benchmarks(asv_dir: Path, warnings: list[str]) -> dict[str, Benchmark]:
    path = asv_dir / "benchmarks.json"
    if not os.path.lexists(path):  # a broken or looping symlink is there: the reader refuses it
        if not any((d / "machine.json").exists() for d in _subdirs(asv_dir)):
            raise HistoryError(f"no asv results under {asv_dir}")
        raise HistoryError(f"{path} is missing; it says which unit each benchmark has")
    try:
        data = load_json(path, asv_dir)
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
            if not (isinstance(b["unit"], str) and is_params(params)
                    and all(isinstance(n, str) for n in names)):
                raise TypeError
            version = b.get("version")
            out[name] = Benchmark(name, b["unit"], str(b.get("type", "")), list(names),
                                  [list(p) for p in params],
                                  None if version is None else str(version))
        except (TypeError, KeyError, AttributeError):
            warnings.append(f"benchmarks.json: entry {name!r} is malformed; "
                            "its results are not judged")
    return out


# How strictly a unit is judged (summary.py's rules): ids, u, ulp and counts give failing
# flags by default; seconds and the u bound only inform.
_STRICTNESS = {"kernel-id": 2, "input-id": 2, "env-id": 2, "fix-id": 2, "order-id": 2, "map-id": 2,
               "u": 2, "ulp": 2, "count": 2, "u-bound": 1,
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
        warnings.append(f"benchmarks.json gives {name} the unit {b.unit!r}, "
                        f"the suite's record {want!r}; "
                        f"judged as {use!r}")
        b.unit = use


def _read_machine(d: Path, warnings: list[str]) -> dict | None:
    path = d / "machine.json"
    try:
        info = load_json(path, d.parent)
        if not isinstance(info, dict) or not isinstance(info.get("machine"), str):
            raise BadFile("no machine name")
    except FileNotFoundError:
        warnings.append(f"skipping results in {d}: no machine.json")
        return None
    except (OSError, ValueError, RecursionError) as exc:
        warnings.append(f"skipping results in {d}: {path.name} unreadable: {_reason(exc)}")
        return None
    return info


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
