"""The nightly job: one night of one machine (the merge of several machines' nights is merge.py).

A *results tree* is a worktree of the results branch (see resultsbranch.py)::

    nights/<date>-<machine>.json        the environment of the Python under test
    results/asv/<machine>/...           asv results, asv's own layout; results/asv/benchmarks.json
    results/catalog/{kernels,env}/      catalog entries (store/catalog.py)
    summaries/<date>-<machine>.{md,json}  the night against the machine's previous night
    summaries/<date>-all.{md,json}      a merge: every machine's latest night against its previous
    html/                               asv publish, plus drift.html (site.py); not committed
    .nightly/                           lock, generated asv configs, staging, the axis;
                                        not committed

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
from enum import Enum
from pathlib import Path

from matmul_drift.core.errors import BadValue, Misuse, Param, UsageError
from matmul_drift.jobs import asvrun, axis, resultsbranch, selection, site
from matmul_drift.read import history, latest, render, summary
from matmul_drift.read.incidents import ordered
from matmul_drift.store import atomic, scratch
from matmul_drift.store import machine as hardware
from matmul_drift.store.lock import Locked, TreeLock

STATE = ".nightly"
NIGHTS = "nights"
SUMMARIES = "summaries"
RESULTS = "results"  # asv's results in results/asv, the catalog in results/catalog
MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ALL = "all"  # the name of a merge's summary; no machine may take it


class NightError(Exception):
    """The night could not be recorded or published: one line, exit status 1."""


class Stage(str, Enum):
    """Where a night stands between copying its results and publishing them: pending.json's
    "stage". The values are the file's own words, so a night any run left is recovered; each
    is also the name MATMUL_DRIFT_KILL_AT takes to kill the run there (asvrun.checkpoint)."""

    COPYING = "copying"  # results going into the tree: a kill leaves a part, set aside
    COPIED = "copied"  # in the tree, not committed: the next run commits them
    COMMITTED = "committed"  # committed, the site not built: the run of that night publishes
    PUBLISHING = "publishing"  # the site being built: the run of that night publishes again


@dataclass(frozen=True)
class Finished:
    """A killed night that _finish_pending completed: its date and machine, and ``said``, the
    plain report of the commit it made for it ("" where the night was committed before)."""

    date: str
    machine: str
    said: str


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


def log(msg: str) -> None:
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
    tomorrow (UTC; tomorrow for a clock ahead of it). BadValue (``date``) otherwise."""
    try:
        # strftime writes year 1 as "1"
        night = datetime.strptime(text, "%Y-%m-%d").date().isoformat()
        axis.commit(night)
    except ValueError:
        raise BadValue("date", repr(text), "is not a date like 2026-01-31") from None
    except axis.AxisError as exc:
        raise BadValue("date", None, str(exc), colon=True) from None
    latest = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%d")
    if tonight and night > latest:
        raise BadValue("date", night, f"lies after {latest}: a night is tonight or one before")
    return night


# ---------------------------------------------------------------------------- the Python under test

_DESCRIBE = r"""
import json, os, sys
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # no CUDA context for the check
import asv_runner, torch
from matmul_drift.measure import environment
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
                         "(it needs torch, asv and matmul-drift): "
                         f"{lines[-1] if lines else p.returncode}")
    lines = p.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except ValueError:
        got = None
    if not isinstance(got, dict) or not {"python", "device", "environment"} <= got.keys():
        raise UsageError(f"{python} is not a Python that can describe its torch environment: "
                         "it ran, and printed "
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
        p = subprocess.run([exe, f"--query-gpu={','.join(fields)}",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return [dict(zip(fields, (v.strip() for v in line.split(","))))
            for line in p.stdout.splitlines() if line.strip()]


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
        # Derived from dates alone: a repository a killed run left locked (a ref's .lock) is made
        # again.
        log(f"recovered: asv's commit axis could not be extended ({first}); building it again")
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
    # here, not at the top: importing asv is slow, and every command's parser imports this
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    keep = ("version", "project", "project_url", "hash_length", "launch_method",
            "default_benchmark_timeout", "regressions_thresholds", "regressions_first_commits")
    out = {k: conf[k] for k in keep if k in conf}
    out.update({
        "show_commit_url": f"{site.PAGE}#night-",
        "repo": str(_axis_dir(tree)), "dvcs": "git", "branches": [branch],
        "environment_type": "existing",
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
    log(msg)
    asvrun.checkpoint("replaced")  # a recorded file moved aside, its successor not yet copied


def import_night(staging: Path, results_dir: Path, machine: str, commit: str,
                 force: bool) -> list[Path]:
    """asvrun.import_results for a night: every result ``machine`` has at ``commit`` is the
    night's (its environment is named after the Python's path, which may change)."""
    try:
        return asvrun.import_results(staging, results_dir, machine,
                                     asvrun.recorded(results_dir, machine, commit),
                                     force, _replacing)
    except asvrun.AlreadyRecorded as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------- summaries


def _failed_md(nights: list[dict], limit: int = 20) -> list[str]:
    out = []
    for n in nights:
        if n["failed"]:
            out += ["", f"#### {render.md_escape(n['machine'])}: {len(n['failed'])} benchmark "
                        f"values failed on {n['date']} (asv recorded null; see the job log)", ""]
            out += [f"- {render.md_escape(f)}" for f in n["failed"][:limit]]
            if len(n["failed"]) > limit:
                out.append(f"- ... and {len(n['failed']) - limit} more")
    return out


def write_summary(tree: Path, name: str, result: summary.Summary,
                  nights: list[dict]) -> tuple[Path, Path, str]:
    """summaries/<name>.md (GitHub Markdown) and .json (read/render.py's schema plus "nights");
    the Markdown also goes to $GITHUB_STEP_SUMMARY in GitHub Actions. Returns both paths
    and the plain-text report."""
    fail_on = summary.DEFAULT_FAIL_ON
    nights = [{**n, "bridged": latest.bridged(n, result)} for n in nights]
    md = "\n".join([*(f"- {render.md_escape(latest.night_line(n))}" for n in nights), "",
                    render.render_github(result, fail_on).rstrip(),
                    *_failed_md(nights)]) + "\n"
    doc = json.loads(render.render_json(result, fail_on))
    doc["nights"] = nights
    doc["issues"] = incident_issues(result, fail_on)
    texts = {tree / SUMMARIES / f"{name}.md": md,
             tree / SUMMARIES / f"{name}.json":
                 json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"}
    for path, text in texts.items():
        old = path.read_bytes() if path.is_file() else None
        if old == text.encode("utf-8"):  # a merge run again with nothing new: left as it is
            continue
        if old is not None:
            log(f"replacing {path.relative_to(tree)}: {name} was summarised before "
                "(that summary stays in the branch's history)")
        atomic.write_text(path, text)
    md_path, json_path = texts
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if os.environ.get("GITHUB_ACTIONS") == "true" and step:
        with open(step, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    return md_path, json_path, render.render_plain(result, fail_on)


ISSUE_TITLE = 240  # characters of an issue title (GitHub takes 256)


def incident_issues(result: summary.Summary, fail_on) -> list[dict]:
    """One GitHub issue per incident, for the workflow: {"key", "failing", "title", "body"}.
    The title ends in "[key]", by which the next night finds the issue of an incident that
    persists and updates it instead of filing another."""
    out = []
    for k, inc in enumerate(ordered(result.incidents, fail_on), 1):
        title = f"matmul-drift: {render.visible(inc.cause)}"
        title = ((title if len(title) <= ISSUE_TITLE else title[:ISSUE_TITLE - 1] + "…")
                 + f" [{inc.key}]")
        out.append({"key": inc.key, "failing": inc.failing(fail_on), "title": title,
                    "body": "\n".join(render.incident_markdown(k, inc, fail_on)) + "\n"})
    return out


def read_tree(tree: Path) -> history.History:
    try:
        return history.read_history(tree / RESULTS)
    except history.HistoryError as exc:
        raise NightError(f"cannot read the results back: {exc}") from None


def publish(tree: Path, repo: Path, branch: str) -> None:
    """asv publish over the tree's results, then the drift page and local assets (site.py)."""
    hist = read_tree(tree)
    dates = [latest.night_date(r.date) for runs in hist.runs.values() for r in runs]
    axis_repo(tree, max(dates, default=today()), branch)

    def build(folder: Path, lock) -> list[str]:
        # into a scratch folder: html/ stays whole until it is done
        conf = _write_config(tree, "asv-publish.json",
                             {**asv_config(repo, tree, branch, tree / RESULTS / "asv"),
                              "html_dir": str(folder)})
        rc, tail = asvrun.run(conf, "publish", cwd=tree, env=_asv_env(tree),
                              log=tree / STATE / "asv-publish.log", hold=lock)
        if rc != 0:
            raise NightError(f"asv publish failed: {tail[-1] if tail else rc}; "
                             "the site is left as it was")
        pairs, nights = latest.nights(hist)
        runs = [{**n, "line": latest.night_line(n)} for n in nights]
        return site.write(folder, hist, latest.compare(hist, pairs), runs, _recorded_nights(tree))

    for url in site.replace(tree / "html", build, log):
        log(f"warning: the site loads {url} from the network")
    log(f"site: {tree / 'html' / 'index.html'} (and {site.PAGE})")


# ---------------------------------------------------------------------------- one night


def lock_tree(tree: Path) -> TreeLock:
    try:
        return TreeLock(tree / STATE / "lock").acquire()
    except Locked as exc:
        raise UsageError(f"another nightly run holds this results tree: {exc}") from None


def open_tree(o: Options) -> Path:
    try:
        return resultsbranch.ensure_tree(o.repo, o.tree, o.branch, o.remote)
    except resultsbranch.GitError as exc:
        raise UsageError(str(exc)) from None


def git_step(step: str, fn, *args):
    try:
        return fn(*args)
    except resultsbranch.GitError as exc:
        raise NightError(f"{step}: {exc}") from None


def run_night(o: Options) -> Report:
    """One night of ``o.machine`` with ``o.python``; see the module docstring."""
    t0 = time.monotonic()
    tree = open_tree(o)
    lock = lock_tree(tree)
    try:
        return _night(o, tree, t0)
    finally:
        lock.release()


def _night(o: Options, tree: Path, t0: float) -> Report:
    # Everything that can fail on the tree runs here, before asv (which can take hours).
    for line in (git_step("repairing the results tree", resultsbranch.repair, tree, o.branch)
                 + asvrun.reap_orphans(Path(o.repo))
                 + scratch.sweep_staging(tree / STATE / "staging", tree)):
        log(f"recovered: {line}")
    finished = _finish_pending(tree)
    said = finished.said if finished else ""
    pushed = 0
    if o.remote:
        git_step("syncing with the remote", resultsbranch.sync, tree, o.branch, o.remote,
                 not o.push)
        pushed = (git_step("checking what is unpushed", resultsbranch.unpushed, tree, o.branch,
                           o.remote) if o.push else 0)
        if pushed:
            git_step("pushing what an earlier run left unpushed", resultsbranch.push, tree,
                     o.branch, o.remote)
            log(f"recovered: pushed {pushed} commit(s) an earlier run made and did not push")
    point = axis.commit(o.date)
    rel = f"{NIGHTS}/{o.date}-{o.machine}.json"
    recorded = asvrun.recorded(tree / RESULTS / "asv", o.machine, point)
    this_night = finished is not None and (finished.date, finished.machine) == (o.date, o.machine)
    if recorded and not o.force and (this_night or pushed):
        # The night was killed after its results were copied, or after its commit: it is
        # now committed (and pushed); what is left is to publish.
        log(f"night {o.date} on {o.machine} is recorded: completed what a killed run left")
        if o.publish:
            _publish_night(o, tree, point)
        _pending_path(tree).unlink(missing_ok=True)
        return _report(tree, o.date, o.machine, resultsbranch.head(tree), [], o.publish, said)
    if recorded and not o.force:
        raise Misuse(f"night {o.date} on {o.machine} is already recorded "
                     f"({recorded[0].relative_to(tree)}); pass ", Param("force"),
                     " to run it again and replace it")
    if recorded:
        log(f"night {o.date} on {o.machine}: running it again (--force)")
    elif _staged_night(tree, rel).exists():
        log(f"night {o.date} on {o.machine} was started before and has no results yet: running it")
    night = _describe_night(o, tree, rel)
    axis_repo(tree, o.date, o.branch)
    imported = _run_asv(o, tree, point, rel)
    commit, text = _record(tree, night, point, imported)
    if o.remote and o.push:
        commit = git_step("pushing the night", resultsbranch.push, tree, o.branch, o.remote)
    log(f"night commit {(commit or resultsbranch.head(tree))[:12]}: {night_title(night)}")
    if o.publish:
        _publish_night(o, tree, point)
    _pending_path(tree).unlink(missing_ok=True)
    report = _report(tree, o.date, o.machine, commit, imported, o.publish, said + text)
    log(f"night {o.date} on {o.machine} done in {time.monotonic() - t0:.0f} s; "
        f"summary {report.summary_md}")
    return report


def _record(tree: Path, night: dict, point: str, imported: list[Path]) -> tuple[str | None, str]:
    """Summarise a night whose results are in the tree, and make its one commit: its own
    files only (an earlier night's leftovers are not swept in). Clears the pending state.
    Returns the commit and the plain report."""
    date, machine = night["date"], night["machine"]
    hist = read_tree(tree)
    pair = latest.night_pair(hist, machine, point)
    if pair is None:
        raise NightError(f"the results of night {date} (asv commit {point[:12]}) "
                         "cannot be read back")
    info = latest.night_info(hist, machine, *pair)
    result = latest.compare(hist, {machine: pair})
    _, _, plain = write_summary(tree, f"{date}-{machine}", result, [info])
    for w in result.warnings:
        log(f"warning: {w}")
    failing = len(result.failing(summary.DEFAULT_FAIL_ON))
    if info["failed"]:
        log(f"{len(info['failed'])} benchmark values failed (recorded as null), e.g. "
            f"{info['failed'][0]}; asv's output: {tree / STATE / f'asv-{date}-{machine}.log'}")
    outcome = (f"summary: {len(result.flags)} flags, {failing} failing, "
               f"{len(info['failed'])} failed values")
    own = [".gitignore", f"{NIGHTS}/{date}-{machine}.json", f"{RESULTS}/catalog",
           f"{RESULTS}/asv/benchmarks.json", f"{RESULTS}/asv/{machine}/machine.json",
           f"{SUMMARIES}/{date}-{machine}.md", f"{SUMMARIES}/{date}-{machine}.json",
           f":(glob){RESULTS}/asv/{machine}/{point[:8]}-*"]
    commit = git_step("committing the night", resultsbranch.commit, tree, own,
                      commit_message(night, outcome), f"{date}T00:00:00+00:00")
    # the next run publishes it, remote or none
    _set_pending(tree, Stage.COMMITTED, night, point, [])
    asvrun.checkpoint(Stage.COMMITTED.value)
    return commit, plain


def _report(tree: Path, date: str, machine: str, commit: str | None, imported: list[Path],
            published: bool, text: str) -> Report:
    md, js = tree / SUMMARIES / f"{date}-{machine}.md", tree / SUMMARIES / f"{date}-{machine}.json"
    doc = json.loads(js.read_text(encoding="utf-8"))
    failed = [f for n in doc.get("nights", []) for f in n.get("failed", [])]
    return Report(commit, md, js, len(doc.get("flags", [])), int(doc.get("failing", 0)), failed,
                  imported, published, text)


def _publish_night(o: Options, tree: Path, point: str) -> None:
    """Publish the site, marked pending so that a run killed meanwhile is published by the next."""
    _set_pending(tree, Stage.PUBLISHING, {"date": o.date, "machine": o.machine}, point, [])
    asvrun.checkpoint(Stage.PUBLISHING.value)
    publish(tree, o.repo, o.branch)
    _pending_path(tree).unlink(missing_ok=True)


# A night's results reach the tree in two steps that a kill can separate from its commit:
# .nightly/pending.json says which night is between them, and what it copied.


def _pending_path(tree: Path) -> Path:
    return tree / STATE / "pending.json"


def _set_pending(tree: Path, stage: Stage, night: dict, point: str, files: list[str]) -> None:
    atomic.write_text(_pending_path(tree), json.dumps({
        "stage": stage.value, "date": night["date"], "machine": night["machine"], "point": point,
        "files": files}) + "\n")


def _finish_pending(tree: Path) -> Finished | None:
    """Finish what a killed night left between copying its results and publishing them.
    Copied in full: summarise and commit it (its own commit), and return it with its plain
    report. Copied in part: set the copied files aside (kept, not read) and put back what the
    branch had recorded (a --force run's), so the night runs again. Killed after its commit or
    while publishing: return it with no report; the run of that night publishes. The stage is
    read as the file's word: one that Stage does not name reads as a copy in part."""
    path = _pending_path(tree)
    if not path.exists():
        return None
    try:
        p = json.loads(path.read_text(encoding="utf-8"))
        date, machine, point, stage, files = (p["date"], p["machine"], p["point"], p["stage"],
                                              list(p["files"]))
        whole = stage == Stage.COPIED and files and all((tree / f).is_file() for f in files)
        night = (json.loads((tree / NIGHTS / f"{date}-{machine}.json").read_text(encoding="utf-8"))
                 if whole else None)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        path.unlink()
        log(f"warning: ignored {path.relative_to(tree)}, which cannot be read ({exc})")
        return None
    # committed, the site not built: the run of that night publishes
    if stage in (Stage.COMMITTED, Stage.PUBLISHING):
        how = "after its commit" if stage == Stage.COMMITTED else "while publishing"
        log(f"recovered: night {date} on {machine} was killed {how}; publishing it")
        return Finished(date, machine, "")
    if night is not None:
        log(f"recovered: night {date} on {machine} was killed after its results were copied; "
            "committing it")
        return Finished(date, machine, _record(tree, night, point, [tree / f for f in files])[1])
    loose = (git_step("reading what a killed night copied", resultsbranch.uncommitted, tree, files)
             if files else [])
    aside = [atomic.backup(tree / f) for f in loose if (tree / f).exists()]
    back = git_step("putting back what a killed night moved aside", resultsbranch.restore, tree,
                    loose)
    path.unlink()
    log(f"recovered: night {date} on {machine} was killed while its results were copied; "
         f"{len(aside)} file(s) set aside (*.replaced-*)"
         + (f", {len(back)} put back as recorded" if back else "")
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
    log(f"describing {o.python} ...")
    described = describe_python(o.python)
    night = {"date": o.date, "machine": o.machine, "python": o.python,
             "python_version": described["python"], "device": described["device"],
             "environment": described["environment"], "gpu_clocks": gpu_clocks(),
             "started_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    atomic.write_text(_staged_night(tree, rel), json.dumps(night, indent=2, sort_keys=True) + "\n")
    log(night_title(night))
    return night


def _recorded_nights(tree: Path) -> list[dict]:
    """Every night file of the tree, oldest first, with its axis commit as "point"."""
    out = []
    for p in sorted((tree / NIGHTS).glob("*.json")):
        try:
            n = json.loads(p.read_text(encoding="utf-8"))
            out.append({**n, "point": axis.commit(n["date"]), "title": night_title(n)})
        except (OSError, ValueError, KeyError, TypeError, axis.AxisError) as exc:
            log(f"warning: cannot read {p.relative_to(tree)}: {exc}")
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
    args = ["run", "-E", f"existing:{o.python}", f"--set-commit-hash={commit}", "--machine",
            o.machine, "--show-stderr"]
    bench, shown = selection.bench_args(o.bench)
    args += ["--quick"] if o.quick else []
    args += ["--launch-method", o.launch_method] if o.launch_method else []
    asv_log = _asv_log(tree, o)
    log(f"asv {' '.join(args)} {shown} (full output in {asv_log})")
    args += bench
    claim = scratch.claim(staging)  # a run killed from here on leaves it to the next run's sweep
    try:
        rc, tail = asvrun.run(conf, *args, cwd=tree, env=env, log=asv_log, hold=claim)
        night = {"date": o.date, "machine": o.machine}
        dest = Path(RESULTS) / "asv" / o.machine
        made = asvrun.results_files(staging / o.machine)
        if not made:  # nothing reaches the tree: it stays as it was
            raise NightError(f"asv run recorded no results (exit status {rc}): "
                             f"{tail[-1] if tail else ''}; see {asv_log}")
        try:  # before the pending state: a night that copies nothing leaves nothing to recover
            asvrun.check_written(made)
        except asvrun.CutShort as exc:
            raise NightError(f"{exc}; nothing of the night reached the tree "
                             f"(asv exit status {rc}; see {asv_log})") from None
        # what import_night moves aside (--force) too: another Python's results have other names
        aside = [str(p.relative_to(tree))
                 for p in asvrun.recorded(tree / RESULTS / "asv", o.machine, commit)]
        copying = list(dict.fromkeys([str(dest / f.name) for f in made] + aside + [rel]))
        _set_pending(tree, Stage.COPYING, night, commit, copying)
        imported = import_night(staging, tree / RESULTS / "asv", o.machine, commit, o.force)
        described = _staged_night(tree, rel).read_bytes()
        if (tree / rel).exists() and (tree / rel).read_bytes() != described:
            log(f"replacing {rel}; the old description is kept as {atomic.backup(tree / rel).name}")
        atomic.write_bytes(tree / rel, described)
        copied = [str(p.relative_to(tree)) for p in imported] + [rel]
        _set_pending(tree, Stage.COPIED, night, commit, copied)
        asvrun.checkpoint(Stage.COPIED.value)
        _staged_night(tree, rel).unlink()
        scratch.done(staging, claim)
    finally:
        # its lock file stays where the folder does: the next run's sweep removes it
        claim.release()
    log(f"results: {', '.join(str(p.relative_to(tree)) for p in imported)}"
         + ("" if rc == 0 else f" (asv exit status {rc}: some benchmarks failed)"))
    return imported


