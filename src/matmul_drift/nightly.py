"""The nightly job: one night of one machine, and the merge of several machines' nights.

A *results tree* is a worktree of the results branch (see resultsbranch.py)::

    nights/<date>-<machine>.json        the environment of the Python under test
    results/asv/<machine>/...           asv results, asv's own layout; results/asv/benchmarks.json
    results/catalog/{kernels,env}/      catalog entries (catalog.py)
    summaries/<date>-<machine>.{md,json}  the night against the machine's previous night
    summaries/<date>-all.{md,json}      a merge: every machine's latest night against its previous
    html/                               asv publish, plus drift.html (site.py); not committed
    .nightly/                           lock, generated asv configs, staging, the axis; not committed

asv's commit axis is axis.py's derived chain with one commit per day (``.nightly/axis.git``,
rebuilt on demand): results name the day's commit, which cannot be the commit that holds
them. A night: lock the tree; refuse if the night already has results (unless ``force``);
describe the Python under test; ``asv run`` in that Python as an existing environment with
``--set-commit-hash`` (the day's axis commit) into a staging directory; copy the results
into the tree atomically; summarise against the previous night; make the night's one commit
(environment, results, summary; its author date is the night) and push it when a remote is
given; ``asv publish``. asv itself writes non-atomically, so it never writes into the tree:
a run that dies leaves every earlier file as it was.

Numbers: dates are ``YYYY-MM-DD`` (UTC); asv dates are ms since the epoch; durations seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from . import asvrun, atomic, axis, bounded, history, render, resultsbranch, scratch, site, summary
from . import machine as hardware
from .lock import Locked, TreeLock

STATE = ".nightly"
NIGHTS = "nights"
SUMMARIES = "summaries"
RESULTS = "results"  # asv's results in results/asv, the catalog in results/catalog
MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ALL = "all"  # the name of a merge's summary; no machine may take it
IMPORTED = ("results", "summaries", "nights")  # what a merge copies from a source tree


class UsageError(Exception):
    """Bad input or a refusal (an existing night, a locked tree): one line, exit status 2."""


class NightError(Exception):
    """The night could not be recorded or published: one line, exit status 1."""


@dataclass
class Options:
    """One night (or one merge). ``tree`` is the results worktree, ``repo`` the project
    checkout whose asv.conf.json and benchmarks/ are used."""

    machine: str | None
    date: str
    tree: Path
    repo: Path
    python: str | None = None
    branch: str = "results"
    remote: str | None = None
    push: bool = True
    force: bool = False
    bench: list[str] = field(default_factory=list)
    quick: bool = False
    launch_method: str | None = None
    publish: bool = True


@dataclass
class Report:
    """What a night or a merge recorded. ``flags``/``failing`` count summary flags. ``text``, the
    plain report, is for the caller to print once all is recorded: a stdout that fails (its
    reader left) then costs no commit, push or site."""

    commit: str | None
    summary_md: Path
    summary_json: Path
    flags: int
    failing: int
    failed: list[str]
    imported: list[Path]
    published: bool
    text: str = ""


def _log(msg: str) -> None:
    """One line on stderr: names from the results tree or asv (a file's, an env's) may hold a
    newline or an escape sequence, written as \\uXXXX (render.visible) so no line is forged."""
    print(f"matmul-drift nightly: {render.visible(msg)}", file=sys.stderr, flush=True)


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def check_machine(name: str) -> str:
    if not MACHINE_NAME.match(name or "") or name == ALL:
        raise UsageError(f"machine name {name!r} must be 1-64 letters, digits, '.', '_' or '-' "
                         f"(starting with a letter or digit), and not {ALL!r}")
    return name


def check_date(text: str, tonight: bool = False) -> str:
    """The night ``text`` names, on asv's axis; with ``tonight`` (the CLI's --date) no later than
    tomorrow (UTC; tomorrow for a clock ahead of it). UsageError otherwise."""
    try:
        night = datetime.strptime(text, "%Y-%m-%d").date().isoformat()  # strftime writes year 1 as "1"
        axis.commit(night)
    except ValueError:
        raise UsageError(f"--date {text!r} is not a date like 2026-01-31") from None
    except axis.AxisError as exc:
        raise UsageError(f"--date: {exc}") from None
    latest = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%d")
    if tonight and night > latest:
        raise UsageError(f"--date {night} lies after {latest}: a night is tonight or one before")
    return night


# ---------------------------------------------------------------------------- the Python under test

_DESCRIBE = r"""
import json, os, sys
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # no CUDA context for the check
import asv_runner, torch
from matmul_drift import environment
device = "cuda" if torch.cuda.is_available() else "cpu"
print(json.dumps({"python": sys.version.split()[0], "device": device,
                  "environment": environment.describe(device)}))
"""


def describe_python(python: str) -> dict:
    """{"python": version, "device": "cpu"|"cuda", "environment": environment.describe(...)}
    as the Python under test reports it. UsageError when it cannot (no torch, no project)."""
    try:
        p = subprocess.run([python, "-c", _DESCRIBE], capture_output=True, text=True, timeout=600)
    except OSError as exc:
        raise UsageError(f"cannot run {python}: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise NightError(f"{python} did not describe its environment within 600 s") from None
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        raise UsageError(f"{python} cannot describe its torch environment "
                         f"(it needs torch, asv and matmul-drift): {lines[-1] if lines else p.returncode}")
    lines = p.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except ValueError:
        got = None
    if not isinstance(got, dict) or not {"python", "device", "environment"} <= got.keys():
        raise UsageError(f"{python} is not a Python that can describe its torch environment: it ran, and printed "
                         + (f"{lines[-1][:60]!r} last" if lines else "nothing"))
    return got


def gpu_clocks() -> list[dict] | None:
    """Clocks and limits per GPU from nvidia-smi (MHz, W), or None without nvidia-smi.
    Recorded beside the night: a throttled or down-clocked GPU explains a slow night."""
    fields = ("index", "name", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.limit", "persistence_mode", "driver_version")
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return [dict(zip(fields, (v.strip() for v in line.split(",")))) for line in p.stdout.splitlines() if line.strip()]


def _object(x) -> dict:
    # a night file from a merge is checked as an object, its parts are not: read what is there
    return x if isinstance(x, dict) else {}


def night_title(night: dict) -> str:
    """'night <date> <machine>: torch <version> (git <hash>), CUDA <version>, machine <machine>'."""
    env = _object(night.get("environment"))
    torch = _object(env.get("torch"))
    cuda = _object(env.get("cuda")).get("runtime") or torch.get("cuda_build") or "none"
    git = (torch.get("git") or "unknown")[:12]
    return (f"night {night['date']} {night['machine']}: torch {torch.get('version')} (git {git}), "
            f"CUDA {cuda}, machine {night['machine']}")


def commit_message(night: dict, outcome: str) -> str:
    """The night's commit message: torch version, its git hash, CUDA and the machine; the
    Python, GPU and settings; asv's point for the night; ``outcome`` (the summary's counts)."""
    env = night["environment"]
    lines = [night_title(night), "", outcome,
             f"asv point: {axis.commit(night['date'])} (axis.py's commit for {night['date']})",
             f"python: {night['python']} ({night['python_version']}), device {night['device']}"]
    if env.get("cuda"):
        c = env["cuda"]
        lines.append(f"gpu: {c.get('gpu')}, driver {c.get('driver')}, cuBLAS {c.get('cublas')}")
    for k, v in sorted((env.get("env_vars") or {}).items()):
        lines.append(f"{k}={v}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- asv


def _axis_dir(tree: Path) -> Path:
    return tree / STATE / "axis.git"


def axis_repo(tree: Path, last: str, branch: str) -> Path:
    """The tree's axis repository (axis.py), built up to the night ``last``."""
    path = _axis_dir(tree)
    try:
        axis.build(path, last, branch)
    except axis.AxisError as first:
        # Derived from dates alone: a repository a killed run left locked (a ref's .lock) is made again.
        _log(f"recovered: asv's commit axis could not be extended ({first}); building it again")
        shutil.rmtree(path, ignore_errors=True)
        try:
            axis.build(path, last, branch)
        except axis.AxisError as exc:
            raise NightError(f"cannot build asv's commit axis: {exc}") from None
    return path


def asv_config(repo: Path, tree: Path, branch: str, results_dir: Path) -> dict:
    """asv's config for the results tree: the project's, with the tree's axis repository
    (its ``branch`` is the commit axis), the project's benchmarks, and ``results_dir``.
    A point's link opens the drift page at that night."""
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    keep = ("version", "project", "project_url", "hash_length", "launch_method",
            "default_benchmark_timeout", "regressions_thresholds", "regressions_first_commits")
    out = {k: conf[k] for k in keep if k in conf}
    out.update({
        "show_commit_url": f"{site.PAGE}#night-",
        "repo": str(_axis_dir(tree)), "dvcs": "git", "branches": [branch], "environment_type": "existing",
        "benchmark_dir": str((repo / conf.get("benchmark_dir", "benchmarks")).resolve()),
        "results_dir": str(results_dir), "html_dir": str(tree / "html"),
    })
    return out


def _write_config(tree: Path, name: str, conf: dict) -> Path:
    return asvrun.write_config(tree / STATE / name, conf)



def _asv_env(tree: Path) -> dict:
    return {**os.environ, "MATMUL_DRIFT_CATALOG": str(tree / RESULTS / "catalog"),
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # forkserver: no CUDA before the fork


# ---------------------------------------------------------------------------- moving results


def _replacing(msg: str) -> None:
    _log(msg)
    asvrun.checkpoint("replaced")  # a recorded file moved aside, its successor not yet copied


def import_night(staging: Path, results_dir: Path, machine: str, commit: str, force: bool) -> list[Path]:
    """asvrun.import_results for a night: every result ``machine`` has at ``commit`` is the
    night's (its environment is named after the Python's path, which may change)."""
    try:
        return asvrun.import_results(staging, results_dir, machine, asvrun.recorded(results_dir, machine, commit),
                                     force, _replacing)
    except asvrun.AlreadyRecorded as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------- summaries


def _ms_date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d")


def _commits(runs: list[history.Run]) -> list[str]:
    return list(dict.fromkeys(r.commit for r in runs))  # runs are in night (date) order


def latest(hist: history.History, machine: str, commit: str | None = None) -> tuple[str | None, str] | None:
    """(previous night's commit on the same hardware or None, the night's commit) for
    ``machine``: ``commit``, or its latest night when None. None if the machine has no
    readable results. The summary never compares two hardwares (summary.hardware_key)."""
    runs = hist.runs.get(machine, [])
    head = commit if commit is not None else runs[-1].commit if runs else None
    if head is None or all(r.commit != head for r in runs):
        return None
    same, _ = summary.earlier_runs(runs, head)
    return (same.commit if same else None), head


def _one_environment(hist: history.History, machine: str, commits: tuple[str, str]) -> dict[str, str]:
    """Give ``machine``'s nights up to the later of ``commits`` one environment name, so that the
    summary pairs the two nights and judges what the earlier lacks against the nights before it.
    asv names an existing environment after its Python's path, so a fresh venv each night is a
    new environment; a night is compared with the ones before whichever Python each used.
    Returns {commit: its own environment name} for each night relabelled (one run a night)."""
    runs = hist.runs[machine]
    nights = _commits(runs)
    upto = nights[:max(nights.index(c) for c in commits) + 1]
    alone = {c: [r for r in runs if r.commit == c] for c in upto}
    alone = {c: found[0] for c, found in alone.items() if len(found) == 1}
    if not all(c in alone for c in commits):
        return {}  # a night of several environments: paired by name as they are
    before, after = (alone[c].env_name for c in commits)
    label = before if before == after else f"{before} -> {after}"
    own = {c: r.env_name for c, r in alone.items()}
    for r in alone.values():
        r.env_name = label
    return own


def compare(hist: history.History, pairs: dict[str, tuple[str | None, str]]) -> summary.Summary:
    """Each machine's night against its previous night, as one Summary over all of them."""
    flags, npairs = [], 0
    for machine, (prev, head) in sorted(pairs.items()):
        if prev is None:
            continue  # a machine's first night has nothing to compare with
        own = _one_environment(hist, machine, (prev, head))
        try:  # this machine's results alone: its flags (labelled "machine [hardware]" on two), pairs, warnings
            s = summary.summarise(hist.of(machine), summary.Options(base=prev, head=head))
        finally:
            for r in hist.runs[machine]:
                r.env_name = own.get(r.commit, r.env_name)
        for side in (x for f in s.flags for x in (f.before, f.after)):
            side.env = own.get(side.commit, side.env)  # each night by its own environment
        flags += s.flags
        npairs += s.pairs
    return summary.Summary(flags, npairs, sorted(pairs), list(dict.fromkeys(hist.warnings)))


def failed_in(hist: history.History, machine: str, commit: str) -> list[str]:
    """'benchmark param param ...' for each value asv recorded as failed (null) at ``commit``."""
    return [f"{o.benchmark} {' '.join(o.params.values())}".strip()
            for o in hist.observations(machine) if o.commit == commit and o.status == "failed"]


def night_info(hist: history.History, machine: str, prev: str | None, head: str) -> dict:
    """Plain facts about one machine's night for the summary and the site."""
    run = next(r for r in hist.runs[machine] if r.commit == head)
    before = next((r for r in hist.runs[machine] if r.commit == prev), None)
    # with no previous night on its hardware, the latest earlier night on another, not compared
    other = None if before else summary.earlier_runs(hist.runs[machine], head)[1]
    return {"machine": machine, "date": _ms_date(run.date), "commit": head, "torch": run.torch,
            "previous": None if before is None else {"commit": prev, "date": _ms_date(before.date),
                                                     "torch": before.torch},
            "other_hardware": other and {"commit": other.commit, "date": _ms_date(other.date)},
            "failed": failed_in(hist, machine, head)}


def bridged(n: dict, result: summary.Summary) -> list[dict]:
    """The earlier nights that flags of night ``n`` (night_info) were judged against, as the
    night before had no value there (summary's bridge): {"commit", "date", "flags"}, newest first."""
    prev = (n["previous"] or {}).get("commit")
    out: dict[str, dict] = {}
    for f in result.flags:
        mine = f.machine == n["machine"] or f.machine.startswith(f"{n['machine']} [")  # "vm [cpu, ...]" on two hardwares
        if mine and f.after.commit == n["commit"] and f.before.commit != prev:
            out.setdefault(f.before.commit, {"commit": f.before.commit, "date": _ms_date(f.before.date), "flags": 0})["flags"] += 1
    return sorted(out.values(), key=lambda b: b["date"], reverse=True)


def night_line(n: dict) -> str:
    """One line about a machine's night (a dict of nightly.night_info, with "bridged" where
    known) and the one before."""
    prev, other = n["previous"], n.get("other_hardware")
    against = (f"against {prev['date']} ({prev['commit'][:8]}, torch {prev['torch']})" if prev
               else f"the first night on this hardware: nothing to compare with ({other['date']} "
                    f"({other['commit'][:8]}) ran on other hardware)" if other
               else "the first night: nothing to compare with")
    line = f"{n['machine']}: {n['date']} ({n['commit'][:8]}, torch {n['torch']}), {against}"
    if n.get("bridged"):
        earlier = " and ".join(f"{b['flags']}{' flag' + 's' * (b['flags'] != 1) if i == 0 else ''} against {b['date']} ({b['commit'][:8]})"
                               for i, b in enumerate(n["bridged"]))
        line += f"; {earlier} instead, where {prev['date']} had no value"
    return line


def latest_nights(hist: history.History) -> tuple[dict[str, tuple[str | None, str]], list[dict]]:
    """Every machine's latest night: {machine: (previous commit, commit)} and night_info of each."""
    pairs = {m: p for m in sorted(hist.runs) if (p := latest(hist, m)) is not None}
    return pairs, [night_info(hist, m, *p) for m, p in pairs.items()]


def _failed_md(nights: list[dict], limit: int = 20) -> list[str]:
    out = []
    for n in nights:
        if n["failed"]:
            out += ["", f"#### {render.md_escape(n['machine'])}: {len(n['failed'])} benchmark values failed "
                        f"on {n['date']} (asv recorded null; see the job log)", ""]
            out += [f"- {render.md_escape(f)}" for f in n["failed"][:limit]]
            if len(n["failed"]) > limit:
                out.append(f"- ... and {len(n['failed']) - limit} more")
    return out


def write_summary(tree: Path, name: str, result: summary.Summary, nights: list[dict]) -> tuple[Path, Path, str]:
    """summaries/<name>.md (GitHub Markdown) and .json (render.py's schema plus "nights");
    the Markdown also goes to $GITHUB_STEP_SUMMARY in GitHub Actions. Returns both paths
    and the plain-text report."""
    fail_on = summary.DEFAULT_FAIL_ON
    nights = [{**n, "bridged": bridged(n, result)} for n in nights]
    md = "\n".join([*(f"- {render.md_escape(night_line(n))}" for n in nights), "",
                    render.render_github(result, fail_on).rstrip(),
                    *_failed_md(nights)]) + "\n"
    doc = json.loads(render.render_json(result, fail_on))
    doc["nights"] = nights
    texts = {tree / SUMMARIES / f"{name}.md": md,
             tree / SUMMARIES / f"{name}.json": json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"}
    for path, text in texts.items():
        old = path.read_bytes() if path.is_file() else None
        if old == text.encode("utf-8"):  # a merge run again with nothing new: left as it is
            continue
        if old is not None:
            _log(f"replacing {path.relative_to(tree)}: {name} was summarised before (that summary stays in the "
                 "branch's history)")
        atomic.write_text(path, text)
    md_path, json_path = texts
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if os.environ.get("GITHUB_ACTIONS") == "true" and step:
        with open(step, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    return md_path, json_path, render.render_plain(result, fail_on)


def _read(tree: Path) -> history.History:
    try:
        return history.read_history(tree / RESULTS)
    except history.HistoryError as exc:
        raise NightError(f"cannot read the results back: {exc}") from None


def publish(tree: Path, repo: Path, branch: str) -> None:
    """asv publish over the tree's results, then the drift page and local assets (site.py)."""
    hist = _read(tree)
    dates = [_ms_date(r.date) for runs in hist.runs.values() for r in runs]
    axis_repo(tree, max(dates, default=today()), branch)

    def build(folder: Path, lock) -> list[str]:  # into a scratch folder: html/ stays whole until it is done
        conf = _write_config(tree, "asv-publish.json",
                             {**asv_config(repo, tree, branch, tree / RESULTS / "asv"), "html_dir": str(folder)})
        rc, tail = asvrun.run(conf, "publish", cwd=tree, env=_asv_env(tree), log=tree / STATE / "asv-publish.log",
                              hold=lock)
        if rc != 0:
            raise NightError(f"asv publish failed: {tail[-1] if tail else rc}; the site is left as it was")
        pairs, nights = latest_nights(hist)
        runs = [{**n, "line": night_line(n)} for n in nights]
        return site.write(folder, hist, compare(hist, pairs), runs, _recorded_nights(tree))

    for url in site.replace(tree / "html", build, _log):
        _log(f"warning: the site loads {url} from the network")
    _log(f"site: {tree / 'html' / 'index.html'} (and {site.PAGE})")


# ---------------------------------------------------------------------------- one night


def _lock(tree: Path) -> TreeLock:
    try:
        return TreeLock(tree / STATE / "lock").acquire()
    except Locked as exc:
        raise UsageError(f"another nightly run holds this results tree: {exc}") from None


def _open_tree(o: Options) -> Path:
    try:
        return resultsbranch.ensure_tree(o.repo, o.tree, o.branch, o.remote)
    except resultsbranch.GitError as exc:
        raise UsageError(str(exc)) from None


def _git(step: str, fn, *args):
    try:
        return fn(*args)
    except resultsbranch.GitError as exc:
        raise NightError(f"{step}: {exc}") from None


def run_night(o: Options) -> Report:
    """One night of ``o.machine`` with ``o.python``; see the module docstring."""
    t0 = time.monotonic()
    tree = _open_tree(o)
    lock = _lock(tree)
    try:
        return _night(o, tree, t0)
    finally:
        lock.release()


def _night(o: Options, tree: Path, t0: float) -> Report:
    # Everything that can fail on the tree runs here, before asv (which can take hours).
    for line in (_git("repairing the results tree", resultsbranch.repair, tree, o.branch) + asvrun.reap_orphans(Path(o.repo))
                 + scratch.sweep_staging(tree / STATE / "staging", tree)):
        _log(f"recovered: {line}")
    finished = _finish_pending(tree)  # (date, machine, the report of a night it committed)
    said = finished[2] if finished else ""
    pushed = 0
    if o.remote:
        _git("syncing with the remote", resultsbranch.sync, tree, o.branch, o.remote, not o.push)
        pushed = _git("checking what is unpushed", resultsbranch.unpushed, tree, o.branch, o.remote) if o.push else 0
        if pushed:
            _git("pushing what an earlier run left unpushed", resultsbranch.push, tree, o.branch, o.remote)
            _log(f"recovered: pushed {pushed} commit(s) an earlier run made and did not push")
    point = axis.commit(o.date)
    rel = f"{NIGHTS}/{o.date}-{o.machine}.json"
    recorded = asvrun.recorded(tree / RESULTS / "asv", o.machine, point)
    if recorded and not o.force and ((finished and finished[:2] == (o.date, o.machine)) or pushed):
        # The night was killed after its results were copied, or after its commit: it is
        # now committed (and pushed); what is left is to publish.
        _log(f"night {o.date} on {o.machine} is recorded: completed what a killed run left")
        if o.publish:
            _publish_night(o, tree, point)
        _pending_path(tree).unlink(missing_ok=True)
        return _report(tree, o.date, o.machine, resultsbranch.head(tree), [], o.publish, said)
    if recorded and not o.force:
        raise UsageError(f"night {o.date} on {o.machine} is already recorded ({recorded[0].relative_to(tree)}); "
                         "pass --force to run it again and replace it")
    if recorded:
        _log(f"night {o.date} on {o.machine}: running it again (--force)")
    elif _staged_night(tree, rel).exists():
        _log(f"night {o.date} on {o.machine} was started before and has no results yet: running it")
    night = _describe_night(o, tree, rel)
    axis_repo(tree, o.date, o.branch)
    imported = _run_asv(o, tree, point, rel)
    commit, text = _record(tree, night, point, imported)
    if o.remote and o.push:
        commit = _git("pushing the night", resultsbranch.push, tree, o.branch, o.remote)
    _log(f"night commit {(commit or resultsbranch.head(tree))[:12]}: {night_title(night)}")
    if o.publish:
        _publish_night(o, tree, point)
    _pending_path(tree).unlink(missing_ok=True)
    report = _report(tree, o.date, o.machine, commit, imported, o.publish, said + text)
    _log(f"night {o.date} on {o.machine} done in {time.monotonic() - t0:.0f} s; summary {report.summary_md}")
    return report


def _record(tree: Path, night: dict, point: str, imported: list[Path]) -> tuple[str | None, str]:
    """Summarise a night whose results are in the tree, and make its one commit: its own
    files only (an earlier night's leftovers are not swept in). Clears the pending state.
    Returns the commit and the plain report."""
    date, machine = night["date"], night["machine"]
    hist = _read(tree)
    pair = latest(hist, machine, point)
    if pair is None:
        raise NightError(f"the results of night {date} (asv commit {point[:12]}) cannot be read back")
    info = night_info(hist, machine, *pair)
    result = compare(hist, {machine: pair})
    _, _, plain = write_summary(tree, f"{date}-{machine}", result, [info])
    for w in result.warnings:
        _log(f"warning: {w}")
    failing = len(result.failing(summary.DEFAULT_FAIL_ON))
    if info["failed"]:
        _log(f"{len(info['failed'])} benchmark values failed (recorded as null), e.g. {info['failed'][0]}; "
             f"asv's output: {tree / STATE / f'asv-{date}-{machine}.log'}")
    outcome = f"summary: {len(result.flags)} flags, {failing} failing, {len(info['failed'])} failed values"
    own = [".gitignore", f"{NIGHTS}/{date}-{machine}.json", f"{RESULTS}/catalog", f"{RESULTS}/asv/benchmarks.json",
           f"{RESULTS}/asv/{machine}/machine.json", f"{SUMMARIES}/{date}-{machine}.md",
           f"{SUMMARIES}/{date}-{machine}.json", f":(glob){RESULTS}/asv/{machine}/{point[:8]}-*"]
    commit = _git("committing the night", resultsbranch.commit, tree, own, commit_message(night, outcome),
                  f"{date}T00:00:00+00:00")
    _set_pending(tree, "committed", night, point, [])  # the next run publishes it, remote or none
    asvrun.checkpoint("committed")
    return commit, plain


def _report(tree: Path, date: str, machine: str, commit: str | None, imported: list[Path], published: bool,
            text: str) -> Report:
    md, js = tree / SUMMARIES / f"{date}-{machine}.md", tree / SUMMARIES / f"{date}-{machine}.json"
    doc = json.loads(js.read_text(encoding="utf-8"))
    failed = [f for n in doc.get("nights", []) for f in n.get("failed", [])]
    return Report(commit, md, js, len(doc.get("flags", [])), int(doc.get("failing", 0)), failed, imported, published, text)


def _publish_night(o: Options, tree: Path, point: str) -> None:
    """Publish the site, marked pending so that a run killed meanwhile is published by the next."""
    _set_pending(tree, "publishing", {"date": o.date, "machine": o.machine}, point, [])
    asvrun.checkpoint("publishing")
    publish(tree, o.repo, o.branch)
    _pending_path(tree).unlink(missing_ok=True)


# A night's results reach the tree in two steps that a kill can separate from its commit:
# .nightly/pending.json says which night is between them, and what it copied.


def _pending_path(tree: Path) -> Path:
    return tree / STATE / "pending.json"


def _set_pending(tree: Path, stage: str, night: dict, point: str, files: list[str]) -> None:
    atomic.write_text(_pending_path(tree), json.dumps({"stage": stage, "date": night["date"], "machine": night["machine"],
                                                       "point": point, "files": files}) + "\n")


def _finish_pending(tree: Path) -> tuple[str, str, str] | None:
    """Finish what a killed night left between copying its results and publishing them.
    Copied in full: summarise and commit it (its own commit), and return (date, machine, its
    plain report). Copied in part: set the copied files aside (kept, not read) and put back what
    the branch had recorded (a --force run's), so the night runs again. Killed after its commit
    or while publishing: return (date, machine, ""); the run of that night publishes."""
    path = _pending_path(tree)
    if not path.exists():
        return None
    try:
        p = json.loads(path.read_text(encoding="utf-8"))
        date, machine, point, stage, files = p["date"], p["machine"], p["point"], p["stage"], list(p["files"])
        night = (json.loads((tree / NIGHTS / f"{date}-{machine}.json").read_text(encoding="utf-8"))
                 if stage == "copied" and files and all((tree / f).is_file() for f in files) else None)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        path.unlink()
        _log(f"warning: ignored {path.relative_to(tree)}, which cannot be read ({exc})")
        return None
    if stage in ("committed", "publishing"):  # committed, its site not built: the run of that night publishes
        _log(f"recovered: night {date} on {machine} was killed "
             + ("after its commit" if stage == "committed" else "while publishing") + "; publishing it")
        return date, machine, ""
    if night is not None:
        _log(f"recovered: night {date} on {machine} was killed after its results were copied; committing it")
        return date, machine, _record(tree, night, point, [tree / f for f in files])[1]
    loose = _git("reading what a killed night copied", resultsbranch.uncommitted, tree, files) if files else []
    aside = [asvrun.backup(tree / f) for f in loose if (tree / f).exists()]
    back = _git("putting back what a killed night moved aside", resultsbranch.restore, tree, loose)
    path.unlink()
    _log(f"recovered: night {date} on {machine} was killed while its results were copied; "
         f"{len(aside)} file(s) set aside (*.replaced-*)" + (f", {len(back)} put back as recorded" if back else "")
         + ", the night runs again")
    return None


def _asv_log(tree: Path, o: Options) -> Path:
    return tree / STATE / f"asv-{o.date}-{o.machine}.log"


def _staged_night(tree: Path, rel: str) -> Path:
    """Where a night's description waits for its results: it reaches ``rel`` with them, so a
    run that fails or is killed before never replaces a recorded night's description."""
    return tree / STATE / rel


def _describe_night(o: Options, tree: Path, rel: str) -> dict:
    """Describe the Python under test into _staged_night (written atomically) and return it."""
    _log(f"describing {o.python} ...")
    described = describe_python(o.python)
    night = {"date": o.date, "machine": o.machine, "python": o.python, "python_version": described["python"],
             "device": described["device"], "environment": described["environment"], "gpu_clocks": gpu_clocks(),
             "started_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    atomic.write_text(_staged_night(tree, rel), json.dumps(night, indent=2, sort_keys=True) + "\n")
    _log(night_title(night))
    return night


def _recorded_nights(tree: Path) -> list[dict]:
    """Every night file of the tree, oldest first, with its axis commit as "point"."""
    out = []
    for p in sorted((tree / NIGHTS).glob("*.json")):
        try:
            n = json.loads(p.read_text(encoding="utf-8"))
            out.append({**n, "point": axis.commit(n["date"]), "title": night_title(n)})
        except (OSError, ValueError, KeyError, TypeError, axis.AxisError) as exc:
            _log(f"warning: cannot read {p.relative_to(tree)}: {exc}")
    return out


def _run_asv(o: Options, tree: Path, commit: str, rel: str) -> list[Path]:
    """asv run in the Python under test into a staging directory, then the results into the
    tree (import_night) and the night's description to ``rel`` (the old one, if other, kept
    beside). A run that records nothing is a NightError; failed values are not."""
    staging = tree / STATE / "staging" / f"{o.date}-{o.machine}-{int(time.time())}"
    conf = _write_config(tree, "asv-run.json", asv_config(o.repo, tree, o.branch, staging))
    env = _asv_env(tree)
    try:  # the hardware with the name: asv's `machine --yes --machine NAME` records the name alone
        hardware.register(as_name=o.machine)
    except hardware.NotRegistered as exc:
        raise NightError(str(exc)) from None
    args = ["run", "-E", f"existing:{o.python}", f"--set-commit-hash={commit}", "--machine", o.machine,
            "--show-stderr", *(a for b in o.bench for a in ("--bench", b))]
    args += ["--quick"] if o.quick else []
    args += ["--launch-method", o.launch_method] if o.launch_method else []
    log = _asv_log(tree, o)
    _log(f"asv {' '.join(args)} (full output in {log})")
    claim = scratch.claim(staging)  # a run killed from here on leaves it to the next run's sweep
    try:
        rc, tail = asvrun.run(conf, *args, cwd=tree, env=env, log=log, hold=claim)
        night = {"date": o.date, "machine": o.machine}
        dest = Path(RESULTS) / "asv" / o.machine
        made = asvrun.results_files(staging / o.machine)
        if not made:  # nothing reaches the tree: it stays as it was
            raise NightError(f"asv run recorded no results (exit status {rc}): {tail[-1] if tail else ''}; see {log}")
        try:  # before the pending state: a night that copies nothing leaves nothing to recover
            asvrun.check_written(made)
        except asvrun.CutShort as exc:
            raise NightError(f"{exc}; nothing of the night reached the tree (asv exit status {rc}; see {log})") from None
        # what import_night moves aside (--force) too: another Python's results have other names
        aside = [str(p.relative_to(tree)) for p in asvrun.recorded(tree / RESULTS / "asv", o.machine, commit)]
        _set_pending(tree, "copying", night, commit, list(dict.fromkeys([str(dest / f.name) for f in made] + aside + [rel])))
        imported = import_night(staging, tree / RESULTS / "asv", o.machine, commit, o.force)
        described = _staged_night(tree, rel).read_bytes()
        if (tree / rel).exists() and (tree / rel).read_bytes() != described:
            _log(f"replacing {rel}; the old description is kept as {asvrun.backup(tree / rel).name}")
        atomic.write_bytes(tree / rel, described)
        _set_pending(tree, "copied", night, commit, [str(p.relative_to(tree)) for p in imported] + [rel])
        asvrun.checkpoint("copied")
        _staged_night(tree, rel).unlink()
        scratch.done(staging, claim)
    finally:
        claim.release()  # its lock file stays where the folder does: the next run's sweep removes it
    _log(f"results: {', '.join(str(p.relative_to(tree)) for p in imported)}"
         + ("" if rc == 0 else f" (asv exit status {rc}: some benchmarks failed)"))
    return imported


# ---------------------------------------------------------------------------- merging machines


def holds_a_tree(src: Path) -> bool:
    """Whether ``src`` has any of the folders a merge takes (IMPORTED)."""
    return any((src / top).is_dir() for top in IMPORTED)


def _source_files(src: Path) -> list[Path]:
    """The files a merge takes from ``src``: regular files only. A symlink (whose target
    could be anything on the machine) or a FIFO or device is a UsageError, before anything
    is copied."""
    out = []
    for top in IMPORTED:
        if (src / top).is_symlink():  # os.walk follows a link it is given, though none below
            raise UsageError(f"--merge {src}: {top} is a symlink; a merge copies regular files only, nothing merged")
        for dirpath, dirnames, filenames in os.walk(src / top):  # does not descend into symlinked folders
            for name in sorted(dirnames + filenames):
                p = Path(dirpath) / name
                if p.is_symlink():
                    raise UsageError(f"--merge {src}: {p.relative_to(src)} is a symlink; a merge copies "
                                     "regular files only, nothing merged")
                if name in filenames and not name.startswith(".tmp-"):
                    if not p.is_file():
                        raise UsageError(f"--merge {src}: {p.relative_to(src)} is not a regular file, nothing merged")
                    out.append(p)
    return sorted(out)


def check_night_file(rel: Path, data: bytes) -> None:
    """UsageError (one line) unless ``data`` is a night file: a JSON object whose date and
    machine match its name and whose environment is an object."""
    try:
        night = json.loads(data.decode("utf-8"))
        if not isinstance(night, dict):
            raise ValueError("not a JSON object")
        date, machine = night.get("date"), night.get("machine")
        if not isinstance(date, str) or not isinstance(machine, str) or rel.name != f"{date}-{machine}.json":
            raise ValueError("its date and machine do not match its name")
        check_date(date)
        check_machine(machine)
        if not isinstance(night.get("environment"), dict):
            raise ValueError("its environment is not a JSON object")
    except (ValueError, UsageError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = "not valid JSON (truncated?)" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise UsageError(f"malformed night file {rel}: {reason}; nothing merged") from None


def _rank(rel: Path) -> int:
    # Catalog entries, then machine.json, then results, then summaries and nights: a reader
    # never meets a result whose catalog entries or machine are missing.
    if rel.parts[:2] == (RESULTS, "catalog"):
        return 0
    return 1 if rel.name == "machine.json" else 2 if rel.parts[0] == RESULTS else 3


def _loads(rel: Path, text: str):
    """A file's JSON. Order trees are K deep, past json.loads' recursion: a catalog entry of
    orders/ and an `order --json` report (a GPU check's order-*.json) are read without it."""
    from . import order

    if rel.parent.name == "orders" and rel.parts[:2] == (RESULTS, "catalog"):
        return order.parse_entry(text)
    if rel.name.startswith("order-") and rel.parts[:2] == (RESULTS, "gpu-check"):
        return order.read_report(text)
    return json.loads(text)


def plan_merge(tree: Path, sources: list[Path]) -> tuple[list[tuple[Path, Path]], list[tuple[int | None, Path]], list[str]]:
    """(copies in writing order, benchmarks.json files, conflicts) for merging ``sources``
    into ``tree``. A file the tree lacks is copied; an identical one skipped; a different one
    is a conflict (and copied, after a backup, only with --force); machine.json is asv's
    description of a machine, which asv itself rewrites on each run, so a newer one is copied.
    Each benchmarks.json comes with the latest commit date (ms) of its source's asv results
    (None without one), oldest first: the order in which the newest descriptions win."""
    copies, benches, conflicts, seen = [], [], [], {}
    for src in sources:
        newest, found = None, []
        if not holds_a_tree(src):  # a machine's empty artifact must not stop the others' merge
            _log(f"warning: --merge {src} holds none of {', '.join(t + '/' for t in IMPORTED)}: nothing to take from it")
        for f in _source_files(src):
            rel = f.relative_to(src)
            try:
                data = bounded.read_bytes(f, src)
            except (OSError, ValueError) as exc:
                raise UsageError(f"--merge {src}: cannot read {rel}: {exc}; nothing merged") from None
            if rel.parts[0] == NIGHTS and rel.suffix == ".json":  # not an old one a --force night kept beside
                check_night_file(rel, data)
            elif rel.suffix == ".json":
                try:
                    doc = _loads(rel, data.decode("utf-8"))
                except (ValueError, RecursionError):
                    raise UsageError(f"--merge {src}: {rel} is not valid JSON (truncated?); nothing merged") from None
                if rel.name == "benchmarks.json" and not isinstance(doc, dict):
                    raise UsageError(f"--merge {src}: {rel} is not a JSON object; nothing merged")
                if rel.parts[:2] == (RESULTS, "asv") and len(rel.parts) == 4 and isinstance(doc, dict) \
                        and rel.name != "machine.json" and type(doc.get("date")) is int:
                    newest = max(newest or doc["date"], doc["date"])
            if rel.name == "benchmarks.json":
                found.append(f)
                continue
            if rel in seen:
                if seen[rel] != data and rel.name != "machine.json":
                    conflicts.append(f"{rel} differs between sources")
                continue
            seen[rel] = data
            dst = tree / rel
            if dst.exists():
                if dst.read_bytes() == data:
                    continue
                if rel.name != "machine.json":
                    conflicts.append(f"{rel} differs from the recorded file")
            copies.append((f, dst))
        benches += [(newest, f) for f in found]
    copies.sort(key=lambda c: _rank(c[1].relative_to(tree)))
    benches.sort(key=lambda b: -1 if b[0] is None else b[0])
    return copies, benches, conflicts


def run_merge(o: Options, sources: list[Path]) -> Report:
    """Merge other trees (or artifacts laid out like one) into ``o.tree``; summarise every
    machine's latest night against its previous one; publish."""
    t0 = time.monotonic()
    tree = _open_tree(o)
    lock = _lock(tree)
    try:
        for line in _git("repairing the results tree", resultsbranch.repair, tree, o.branch):
            _log(f"recovered: {line}")
        if o.remote:
            _git("syncing with the remote", resultsbranch.sync, tree, o.branch, o.remote, not o.push)
        copies, benches, conflicts = plan_merge(tree, sources)
        if conflicts and not o.force:
            raise UsageError(f"{len(conflicts)} files conflict, nothing merged: {conflicts[0]}; "
                             "pass --force to replace (the old files are kept beside)")
        # asv publish draws a result only where its benchmark version is benchmarks.json's: a
        # source's descriptions replace the tree's only if its results are as new (its own added).
        recorded = asvrun.newest_run(tree / RESULTS / "asv") if benches else None
        for newest, f in benches:
            keep = recorded is not None and (newest is None or newest < recorded)
            asvrun.merge_benchmarks(tree / RESULTS / "asv" / "benchmarks.json", json.loads(f.read_text()), _log, keep)
        imported = []
        for src, dst in copies:
            if dst.exists() and dst.name != "machine.json":
                _log(f"replacing {dst.relative_to(tree)}; the old file is kept as {asvrun.backup(dst).name}")
            imported.append(atomic.copy(src, dst))
        imported += _left_by_a_killed_merge(tree, imported)
        _log(f"merged {len(imported)} files from {len(sources)} sources")
        hist = _read(tree)
        _check_commits(tree, hist)
        pairs, nights = latest_nights(hist)
        result = compare(hist, pairs)
        md, js, plain = write_summary(tree, f"{o.date}-{ALL}", result, nights)
        commit = _git("committing the merge", resultsbranch.commit, tree, [".gitignore", RESULTS, SUMMARIES, NIGHTS],
                      merge_message(o.date, result, len(pairs), imported), f"{o.date}T00:00:00+00:00")
        if o.remote and o.push:
            commit = _git("pushing the merge", resultsbranch.push, tree, o.branch, o.remote)
        if o.publish:
            publish(tree, o.repo, o.branch)
        _log(f"merge done in {time.monotonic() - t0:.0f} s; summary {md}")
        return Report(commit, md, js, len(result.flags), len(result.failing(summary.DEFAULT_FAIL_ON)),
                      [f for n in nights for f in n["failed"]], imported, o.publish, plain)
    finally:
        lock.release()


def _left_by_a_killed_merge(tree: Path, copied: list[Path]) -> list[Path]:
    """The files of results/ and nights/ that a merge killed after copying left uncommitted:
    this merge found them already there and copied nothing, but its commit brings them in,
    so its message counts and names them (benchmarks.json and files kept beside excluded)."""
    waiting = {tree / f for f in resultsbranch.uncommitted(tree, [RESULTS, NIGHTS])} - set(copied)
    return sorted(p for p in waiting if p.name != "benchmarks.json" and not asvrun.is_backup(p) and p.is_file())


def merge_message(date: str, result: summary.Summary, machines: int, imported: list[Path]) -> str:
    """The merge's commit message: the summary's counts, then each night it brought in, named
    by torch version, git hash, CUDA and machine."""
    nights = [json.loads(p.read_text(encoding="utf-8")) for p in imported if p.parent.name == NIGHTS]
    failing = len(result.failing(summary.DEFAULT_FAIL_ON))
    who = ", ".join(n["machine"] for n in nights)
    counts = f"{len(result.flags)} flags, {failing} failing, on {machines} machines"
    lines = [f"night {date}: {who} merged; {counts}" if nights else f"summary {date}: {counts}; no new night", ""]
    lines += [night_title(n) for n in nights]
    lines += [f"merged {len(imported)} files"]
    return "\n".join(lines) + "\n"


def _check_commits(tree: Path, hist: history.History) -> None:
    # asv publish plots a result only if its commit is the axis commit of its night; say so
    # for any that is not (results made before the axis, or by hand).
    for machine, runs in hist.runs.items():
        for r in runs:
            night = _ms_date(r.date)
            try:
                on_axis = axis.commit(night) == r.commit
            except axis.AxisError:
                on_axis = False
            if not on_axis:
                _log(f"warning: {r.path.relative_to(tree)} names commit {r.commit[:12]}, which is not asv's "
                     f"axis commit for {night}; asv publish will leave it out")
