"""The main job: every torch build of the project's matrix, side by side, on this machine.

For each build (torch version) of ``asv.conf.json``'s matrix, or those asked for:

1. refuse it if this commit already has its results on this machine (unless ``force``);
2. ``asv run <commit>^!`` in asv's virtualenv for that build (asv creates it once and
   reuses it, its requirements installed by uv: asvenv.py; its name,
   ``virtualenv-py3.11-...-torch2.13.0-wheel``, is the name plain ``asv run`` gives it, so
   the two compare), with a config whose matrix holds that build only, into a staging
   directory;
3. copy the results into ``results/asv/<machine>/`` atomically (asvrun.import_results).

A build that cannot be installed or run is one line naming it; the others go on. Then
``asv publish`` into ``html/`` with the site's own parts (site.py: local scripts, the drift
page with kernel names), and the summary of what this run found: the builds side by side
at this commit, and each against this machine's previous commit in the same build.

The machine is named after its hardware (store/machine.py), never after the host. Results for
another machine, and files tracked in git, are never touched; benchmarks.json is rewritten
only when the benchmarks changed.

Numbers: durations in seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from matmul_drift.core.errors import Misuse, Param, UsageError
from matmul_drift.jobs import asvrun, confirm, reuse, selection, site
from matmul_drift.read import history, latest, render, summary
from matmul_drift.store import atomic, machine, scratch

STATE = Path(".asv") / "main-job"  # staging, generated configs and logs; git ignores .asv/
RESULTS = Path("results")
_BUILD = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")


class JobError(Exception):
    """The results could not be published or read back: one line, exit status 1."""


@dataclass
class Options:
    """One run of the main job. ``builds``: torch versions (None: the matrix's)."""

    repo: Path
    builds: list[str] | None = None
    force: bool = False
    bench: list[str] = field(default_factory=list)
    quick: bool = False
    launch_method: str | None = None
    publish: bool = True
    machine: str | None = None


@dataclass
class Outcome:
    """One build: ``status`` is recorded, already recorded or failed; ``seconds`` its wall time."""

    build: str
    env: str
    status: str
    message: str = ""
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Report:
    machine: str
    commit: str
    outcomes: list[Outcome]
    summary: summary.Summary | None
    seconds: float

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]


def log(msg: str) -> None:
    """One line on stderr: names from the results tree or asv (a file's, an env's) may hold a
    newline or an escape sequence, written as \\uXXXX (render.visible) so no line is forged."""
    print(f"matmul-drift run: {render.visible(msg)}", file=sys.stderr, flush=True)


def project_config(repo: Path) -> dict:
    """asv.conf.json, checked for the shape the job reads: an object, its matrix an object
    and its paths strings. UsageError (one line) otherwise."""
    # here, not at the top: importing asv is slow, and every command's parser imports this
    from asv import util

    path = repo / "asv.conf.json"
    try:
        conf = util.load_json(str(path), js_comments=True)
    except Exception as exc:  # asv raises its own UserError for bad JSON
        raise UsageError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(conf, dict):
        raise UsageError(f"{path} is not a JSON object")
    if not isinstance(conf.get("matrix", {}), dict):
        raise UsageError(f"{path}: its matrix is not an object")
    for key in ("env_dir", "benchmark_dir", "html_dir", "repo", "results_dir"):
        if not isinstance(conf.get(key, ""), str):
            raise UsageError(f"{path}: its {key} is not a path (a string)")
    # asv publish deletes html_dir before it writes the site: it must not hold what is kept.
    html = (repo / conf.get("html_dir", "html")).resolve()
    for what, kept in (("the results", (repo / RESULTS).resolve()),
                       ("the benchmarks",
                        (repo / conf.get("benchmark_dir", "benchmarks")).resolve())):
        if kept.is_relative_to(html) or html.is_relative_to(kept):
            raise UsageError(f"{path}: its html_dir {html} overlaps {what} ({kept}), "
                             "which asv publish would delete; give the site a folder of its own "
                             "(e.g. html)")
    return conf


def matrix_builds(conf: dict) -> list[str]:
    """The torch versions of the config's matrix ("" means unpinned, kept as it is)."""
    req = conf.get("matrix", {}).get("req", conf.get("matrix", {}))
    builds = req.get("torch") if isinstance(req, dict) else None
    if not isinstance(builds, list) or not builds:
        raise UsageError("asv.conf.json's matrix names no torch versions (matrix.req.torch)")
    return [str(b) for b in builds]


def check_build(text: str) -> str:
    """A torch version as pip takes it after ``torch==``; UsageError otherwise."""
    b = text.strip()
    if not _BUILD.match(b):
        raise UsageError(f"torch build {text!r} is not a version (expected e.g. 2.13.0)")
    return b


def build_config(repo: Path, conf: dict, build: str, results_dir: Path) -> dict:
    """The project's asv config with its matrix reduced to one torch build and every path
    absolute (the generated file lives elsewhere); results go to ``results_dir``."""
    out = json.loads(json.dumps(conf))
    req = out.setdefault("matrix", {}).setdefault("req", {})
    req["torch"] = [build]
    for key, default in (("env_dir", ".asv/env"), ("benchmark_dir", "benchmarks"),
                         ("html_dir", "html")):
        out[key] = str((repo / out.get(key, default)).resolve())
    out["repo"] = str((repo / out.get("repo", ".")).resolve())
    out["results_dir"] = str(results_dir)
    return out


def env_name(conf: dict) -> str:
    """The name asv gives the (single) environment of ``conf``."""
    # here, not at the top: importing asv is slow, and every command's parser imports this
    from asv import util

    # here, not at the top: importing asv is slow, and every command's parser imports this
    from matmul_drift.jobs import asvenv

    try:
        names = [e.name for e in asvenv.environments(conf)]
    except (RuntimeError, util.UserError) as exc:  # "Environment type must be specified", ...
        raise UsageError("asv.conf.json: "
                         f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
    if len(names) != 1:
        raise UsageError(f"the matrix gives {len(names)} environments for one torch build; "
                         "expected 1")
    return names[0]


def _git(repo: Path, *args: str) -> str:
    p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise UsageError(f"git {' '.join(args)}: "
                         f"{(p.stderr.strip().splitlines() or ['failed'])[0]}")
    return p.stdout.strip()


def head_commit(repo: Path) -> str:
    commit = _git(repo, "rev-parse", "HEAD")
    dirty = _git(repo, "status", "--porcelain", "--", "src", "pyproject.toml")
    if dirty:
        log("warning: src/ has uncommitted changes; asv measures the package as committed at "
            f"{commit[:8]}")
    return commit


# pip's lines that say why, most telling first; "×" leads the cause of pip's (and uv's) rich
# errors, as after "error: incomplete-download"
PIP_WHY = (r"ERROR: (No matching distribution.*)", r"ERROR: (Could not find a version.*)",
           r"ERROR: (Cannot install .*)", r"ERROR: (.*)", r"^\W*× (.+)")


def pip_why(lines: list[str]) -> str:
    """The first of pip's lines in ``lines`` that says why it failed, by PIP_WHY's order, less
    its prefix; "" where none does."""
    return _first(lines, PIP_WHY)


def _first(lines: list[str], patterns: tuple[str, ...]) -> str:
    """Group 1 of the first line matching the first pattern that any line matches; "" if none."""
    for pattern in patterns:
        for line in lines:
            if m := re.search(pattern, line):
                return m.group(1).strip()
    return ""


def _install_error(logfile: Path) -> str:
    """Why a build failed, from asv's log: too little free space for it (asvenv.py), pip's reason
    (pip_why) when its environment could not be made (no such torch, no network, a download cut
    short), else asv's own error line."""
    try:
        text = logfile.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    if why := _first(text, (r"matmul-drift: (no room to install .*)",)):
        return why
    if why := pip_why(text):
        return f"cannot make its environment: pip: {why}"
    return _first(text, (r"(Failure creating environment.*)", r"·+ (Error running .*)",
                         r"(\S*Error: .*)"))


def _progress(build: str):
    def show(line: str) -> None:
        print(f"[torch {build}] {line.strip()}", file=sys.stderr, flush=True)
    return show


def run_build(o: Options, conf: dict, name: str, build: str, commit: str) -> Outcome:
    """One torch build: asv run into staging, then the results into results/asv/<machine>/."""
    t0 = time.monotonic()
    state = o.repo / STATE
    staging = state / "staging" / f"{build}-{os.getpid()}"
    bconf = build_config(o.repo, conf, build, staging)
    env = env_name(bconf)
    results_dir = o.repo / RESULTS / "asv"
    old = asvrun.recorded(results_dir, name, commit, env)
    if old and not o.force:
        return Outcome(build, env, "already recorded",
                       f"{old[0].relative_to(o.repo)}; pass --force to measure again")
    path = asvrun.write_config(state / f"asv-torch-{build}.json", bconf)
    logfile = state / f"asv-torch-{build}.log"
    logfile.unlink(missing_ok=True)
    args = ["run", f"{commit}^!", "--machine", name, "--show-stderr"]
    bench, shown = selection.bench_args(o.bench)
    args += ["--quick"] if o.quick else []
    args += ["--launch-method", o.launch_method] if o.launch_method else []
    log(f"torch {build}: asv {' '.join(args)} {shown} in {env} "
        f"(log: {logfile.relative_to(o.repo)})")
    args += bench
    envvars = {**os.environ, "MATMUL_DRIFT_CATALOG": str(o.repo / RESULTS / "catalog"),
               "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # forkserver: no CUDA before the fork
    if os.environ.get(reuse.REUSE_VAR, "").strip() != "0":  # 0: measure every tree and fix afresh
        last = reuse.last_record(results_dir / name, env)  # a night costs what changed
        envvars[reuse.REUSE_VAR] = str(last) if last else "0"
    setup_log = state / f"setup-torch-{build}.log"  # setup_cache's lines, shown as they come
    setup_log.unlink(missing_ok=True)
    envvars[selection.PROGRESS_VAR] = str(setup_log)
    claim = scratch.claim(staging)  # a run killed from here on leaves it to the next run's sweep
    try:
        rc, tail = asvrun.run(path, *args, cwd=o.repo, env=envvars, log=logfile,
                              progress=_progress(build), hold=claim, follow=setup_log)
        cost = [ln for ln in _lines(setup_log) if ln.startswith(selection.COST)]
        if cost:
            log(f"torch {build}: {cost[-1]}")
        if o.publish:  # until the site is built: a run killed in between is published by the next
            atomic.write_text(_unpublished(o.repo), commit + "\n")
        files = asvrun.import_results(staging, results_dir, name, old, o.force, log)
    except asvrun.AlreadyRecorded as exc:  # recorded meanwhile by another run
        scratch.keep(staging, claim)
        return Outcome(build, env, "already recorded", f"{exc}; this run's results are left in "
                       f"{staging.relative_to(o.repo)}", seconds=time.monotonic() - t0)
    except asvrun.CutShort as exc:
        # asv killed as it wrote: nothing recorded, the next run measures it
        return Outcome(build, env, "failed", f"{exc}; nothing recorded (asv exit status {rc}; see "
                       f"{logfile.relative_to(o.repo)})", seconds=time.monotonic() - t0)
    else:
        scratch.done(staging, claim)
    finally:
        # its lock file stays where the folder does: the next run's sweep removes it
        claim.release()
    seconds = time.monotonic() - t0
    if not files:
        why = _install_error(logfile) or (tail[-1] if tail else f"asv exit status {rc}")
        return Outcome(build, env, "failed", f"{why} (see {logfile.relative_to(o.repo)})",
                       seconds=seconds)
    note = "" if rc == 0 else f" (asv exit status {rc}: some benchmark values failed; see the log)"
    return Outcome(build, env, "recorded",
                   ", ".join(str(f.relative_to(o.repo)) for f in files) + note, files, seconds)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _unpublished(repo: Path) -> Path:
    return repo / STATE / "unpublished"


def _left_unpublished(repo: Path) -> str | None:
    """The commit whose results a killed run recorded and did not publish, or None."""
    try:
        return _unpublished(repo).read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return None


def read(repo: Path, name: str | None = None) -> history.History:
    try:
        return history.read_history(repo / RESULTS, machine=name)
    except history.HistoryError as exc:
        raise JobError(f"cannot read the results back: {exc}") from None


def publish(repo: Path, conf: dict, name: str, commit: str) -> None:
    """asv publish into html/, then the site's own parts: local scripts and the drift page
    (every machine's latest commit against its previous one, and the kernel names)."""
    asvrun.checkpoint("publishing")

    def build(folder: Path, lock) -> list[str]:
        # into a scratch folder: html/ stays whole until it is done
        path = asvrun.write_config(repo / STATE / "asv-publish.json",
                                   {**build_config(repo, conf, matrix_builds(conf)[0],
                                                   repo / RESULTS / "asv"),
                                    "matrix": conf.get("matrix", {}), "html_dir": str(folder)})
        rc, tail = asvrun.run(path, "publish", cwd=repo, log=repo / STATE / "asv-publish.log",
                              progress=lambda _: None, hold=lock)
        if rc != 0:
            raise JobError(f"asv publish failed: {tail[-1] if tail else rc}; "
                           "the site is left as it was")
        hist = read(repo)
        result, runs = latest.runs(hist)
        return site.write(folder, hist, result, runs, title="the latest run on each machine")

    html = Path(conf.get("html_dir", "html"))
    for url in site.replace(html if html.is_absolute() else repo / html, build, log):
        log(f"warning: the site loads {url} from the network")


def run(o: Options) -> Report:
    """The main job; see the module docstring."""
    t0 = time.monotonic()
    conf = project_config(o.repo)
    builds = [check_build(b) for b in (o.builds or matrix_builds(conf))]
    commit = head_commit(o.repo)
    if o.machine and not machine.is_registered(o.machine):
        # asv would fail each build, in several lines
        raise Misuse(Param("machine"), f" {o.machine} is not in ~/.asv-machine.json: leave ",
                     Param("machine"), " out (this hardware registers itself), or add it with "
                     f"`asv machine --machine {o.machine}`")
    try:
        name = o.machine or machine.register()
    except machine.NotRegistered as exc:
        raise UsageError(str(exc)) from None
    log(f"machine {name}; commit {commit[:8]}; torch builds {', '.join(builds)}")
    for line in (asvrun.reap_orphans(o.repo)
                 + scratch.sweep_staging(o.repo / STATE / "staging", o.repo)):
        log(f"recovered: {line}")
    outcomes = []
    for build in builds:
        out = run_build(o, conf, name, build, commit)
        outcomes.append(out)
        log(f"torch {build}: {out.status}: {out.message}"
            + (f" ({out.seconds:.0f} s)" if out.seconds else ""))
    left = o.publish and _left_unpublished(o.repo) == commit
    recorded = any(x.status == "recorded" for x in outcomes)
    if all(x.status == "already recorded" for x in outcomes) and not left:
        raise Misuse(f"every build is already recorded at {commit[:8]} on {name}; pass ",
                     Param("force"), " to measure again")
    if left and not recorded:
        log(f"recovered: the results at {commit[:8]} were recorded by a run killed before its "
            "site was built; publishing them")
    result = None
    if recorded:  # before the site and the summary, which read the verdicts
        t_confirm = time.monotonic()
        kept = confirm.run(o.repo, conf, name, commit, read(o.repo, name), log)
        if kept is not None:
            log(f"re-measured in {time.monotonic() - t_confirm:.0f} s; "
                f"kept in {kept.relative_to(o.repo)}")
    if recorded or left:
        if o.publish:
            publish(o.repo, conf, name, commit)
            _unpublished(o.repo).unlink(missing_ok=True)
        hist = read(o.repo, name)
        result = summary.summarise(hist, summary.Options(at=commit))
        print(latest.compared(hist, commit))
        sys.stdout.write(render.render_plain(result))
    return Report(name, commit, outcomes, result, time.monotonic() - t0)
