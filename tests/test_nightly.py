"""The nightly job on this CPU: real asv runs in an existing environment, real git, a real site.

One shared world (built once, also opened in a browser at the end of this file): a bare remote and three
clones of a committed copy of this checkout. Machine box-a runs two nights, 2026-01-01 as is
and 2026-01-02 under MKL_CBWR=COMPATIBLE (MKL's CNR mode: other bits, and MKL verbose then
says CNR:COMPATIBLE instead of CNR:OFF); box-b runs 2026-01-02; a third clone merges both.
Each of box-a's nights is `asv run --bench 'Drift\\.'` on the `square` case only; box-b's, which
the tests read only as merged and listed (its kernel-id), and those of the tests that kill
nights are quicker still (QUICK).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import asv_fixtures as F
import pytest
from checkout import ROOT, committed_copy, git

from matmul_drift.core import trees
from matmul_drift.jobs import axis, merge, nightly, resultsbranch, site
from matmul_drift.read import history, latest, summary
from matmul_drift.store import catalog
from matmul_drift.store import machine as hardware
from matmul_drift.store.lock import Locked, TreeLock

PY = sys.executable
BENCH = r"Drift\."
# A night of which no assertion reads a measured value but a kernel-id (a run killed or
# recovered, a site merged): square in float32 alone, without the probes, and that one
# benchmark. asv's and the night's own steps are all still run; the measuring they skip took
# a quarter of such a night here (one without publishing: 12.9-16.9 s in full, 10.6-12.1 s
# quick).
QUICK = {"MATMUL_DRIFT_PRECISIONS": "float32", "MATMUL_DRIFT_ORDERS": "0", "MATMUL_DRIFT_FIXES": "0",
         "MATMUL_DRIFT_MAPS": "0"}
QUICK_BENCH = r"Drift\.track_kernel_id"


@dataclass
class World:
    base: Path
    proj: Path
    remote: Path
    a: Path
    b: Path
    m: Path
    env: dict
    runs: dict = field(default_factory=dict)

    def tree(self, clone: str) -> Path:
        return getattr(self, clone) / "nightly"

    def nightly(self, clone: str, *args, timeout=600, **extra_env) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "scripts/nightly.sh", *args], cwd=getattr(self, clone),
                              env={**self.env, **extra_env}, capture_output=True, text=True, timeout=timeout)

    def night_commits(self, clone: str, machine: str) -> list[tuple[str, str]]:
        """(hash, subject) of each night commit of ``machine``, oldest first."""
        out = git(self.tree(clone), "log", "--reverse", "--format=%H %s", "refs/heads/results")
        return [tuple(ln.split(" ", 1)) for ln in out.splitlines()
                if ln.split(" ", 1)[1].startswith("night ") and f" {machine}:" in ln]


_WORLD: list[World] = []


def build_world(factory) -> World:
    """The shared world (see the module docstring), built on first use."""
    if _WORLD:
        return _WORLD[0]
    base = factory.mktemp("nightly")
    proj = base / "proj"
    committed_copy(proj)
    remote = base / "remote.git"
    git(base, "clone", "-q", "--bare", str(proj), str(remote))
    for name in "abm":
        git(base, "clone", "-q", str(remote), str(base / name))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MATMUL_DRIFT_", "MKL_", "GITHUB_"))}
    # HOME: asv writes ~/.asv-machine.json there, and git finds no identity (CI runners have none).
    env.update(HOME=str(base / "home"), MATMUL_DRIFT_CASES="square", PYTHON=PY)
    w = World(base, proj, remote, base / "a", base / "b", base / "m", env)
    night = ("--python", PY, "--bench", BENCH, "--remote", "origin")
    steps = [
        ("a1", "a", (*night, "--machine", "box-a", "--date", "2026-01-01"), {}),
        ("a2", "a", (*night, "--machine", "box-a", "--date", "2026-01-02"),
         {"MKL_CBWR": "COMPATIBLE", "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(base / "step-summary.md")}),
        # box-b's night is merged and listed (its kernel-id), no other value of it read: quick
        ("b1", "b", ("--python", PY, "--bench", QUICK_BENCH, "--remote", "origin", "--machine", "box-b",
                     "--date", "2026-01-02"), QUICK),
        ("merge", "m", ("--merge", "../a/nightly", "../b/nightly", "--remote", "origin", "--date", "2026-01-02"), {}),
    ]
    for key, clone, args, extra in steps:
        p = w.runs[key] = w.nightly(clone, *args, **extra)
        assert p.returncode == 0, f"{key}: exit {p.returncode}\n{p.stderr[-4000:]}"
    _WORLD.append(w)
    return w


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    return build_world(tmp_path_factory)


def snapshot(tree: Path) -> dict:
    """Every file of a tree but its run state, with its bytes; and the branch's head."""
    files = {str(p.relative_to(tree)): p.read_bytes() for p in tree.rglob("*")
             if p.is_file() and ".nightly" not in p.relative_to(tree).parts}
    return {"files": files, "head": git(tree, "rev-parse", "HEAD")}


# ---------------------------------------------------------------------------- end to end


def test_two_nights_end_to_end(world):
    import torch

    tree = world.tree("a")
    nights = world.night_commits("a", "box-a")
    assert [s.split()[1] for _, s in nights] == ["2026-01-01", "2026-01-02"]  # two commits, in order
    (h1, s1), (h2, s2) = nights
    # One commit per night and nothing else: the first night is the branch's root.
    assert git(tree, "rev-list", "refs/heads/results").split() == [h2, h1]
    # The message names the torch version, its git hash, CUDA and the machine.
    # CUDA: the build's (torch.version.cuda) on a machine without a GPU; none for a CPU build
    assert s1 == (f"night 2026-01-01 box-a: torch {torch.__version__} (git {torch.version.git_version[:12]}), "
                  f"CUDA {torch.version.cuda or 'none'}, machine box-a")
    assert git(tree, "log", "-1", "--format=%ad", "--date=short", h2) == "2026-01-02"
    assert {h1, h2} <= set(git(world.remote, "rev-list", "results").split())  # pushed
    # Each night's commit holds its environment, its results (keyed by asv's point for the
    # night, axis.py's commit for the day) and its summary.
    p1, p2 = axis.commit("2026-01-01"), axis.commit("2026-01-02")
    for h, p, day in ((h1, p1, "2026-01-01"), (h2, p2, "2026-01-02")):
        added = git(tree, "diff-tree", "--root", "--no-commit-id", "--name-only", "-r", h).splitlines()
        assert {f"nights/{day}-box-a.json", f"summaries/{day}-box-a.md", f"summaries/{day}-box-a.json"} <= set(added)
        results = [f for f in added if f.startswith("results/asv/box-a/") and not f.endswith("machine.json")]
        assert len(results) == 1 and results[0].startswith(f"results/asv/box-a/{p[:8]}-existing-py_")
        assert f"asv point: {p}" in git(tree, "log", "-1", "--format=%B", h)

    # The environment of each night, as the Python under test described it.
    n1 = json.loads((tree / "nights/2026-01-01-box-a.json").read_text())
    n2 = json.loads((tree / "nights/2026-01-02-box-a.json").read_text())
    assert n1["environment"]["torch"]["version"] == torch.__version__ and n1["python"] == PY
    assert "MKL_CBWR" not in n1["environment"]["env_vars"] and n2["environment"]["env_vars"]["MKL_CBWR"] == "COMPATIBLE"

    # Results of both nights, one existing environment, at asv's two points.
    hist = history.read_history(tree / "results", machine="box-a")
    runs = hist.runs["box-a"]
    assert [r.commit for r in runs] == [p1, p2]
    assert runs[0].env_name == runs[1].env_name and runs[0].env_name.startswith("existing-py_")
    # each night says which hardware made it (asv's `machine --yes --machine NAME` recorded the name alone)
    fp = hardware.fingerprint()
    for r in runs:
        assert (r.env_params.get("cpu"), r.env_params.get("num_cpu"), r.env_params.get("arch")) == (
            fp["cpu"], str(fp["cores"]), fp["arch"]), r.env_params
    vals = [{tuple(o.params.values()): o.value for o in hist.observations("box-a")
             if o.commit == h and o.benchmark == "drift.Drift.track_error_u"} for h in (p1, p2)]
    key = ("square", "float32", "cpu")
    assert 0 < vals[0][key] < 512 and 0 < vals[1][key] < 512  # measured, within γ_K (K = 512)
    assert vals[0][key] != vals[1][key]  # CNR mode changed the bits

    # The summary compared the second night with the first and names the kernels.
    doc = json.loads((tree / "summaries/2026-01-02-box-a.json").read_text())
    assert doc["nights"][0]["commit"] == p2 and doc["nights"][0]["previous"]["commit"] == p1
    kernel = [f for f in doc["flags"] if f["kind"] == "kernel" and f["params"] == dict(zip(("case", "dtype", "device"), key))]
    assert len(kernel) == 1
    assert any("CNR:OFF" in k for k in kernel[0]["before"]["kernels"]["full"])
    assert any("CNR:COMPATIBLE" in k for k in kernel[0]["after"]["kernels"]["full"])
    assert "env_vars.MKL_CBWR: none -> COMPATIBLE" in kernel[0]["attribution"]
    md = (tree / "summaries/2026-01-02-box-a.md").read_text()
    assert "CNR:COMPATIBLE" in md and "against 2026-01-01" in md
    first = json.loads((tree / "summaries/2026-01-01-box-a.json").read_text())
    assert first["nights"][0]["previous"] is None and first["flags"] == []
    assert "CNR:COMPATIBLE" in world.runs["a2"].stdout  # the plain tables, printed
    assert "fatal" not in world.runs["a2"].stderr  # git's own noise stays out of the log
    assert (world.base / "step-summary.md").read_text().strip() == md.strip()  # GitHub's job summary

    # asv publish made a site whose graph holds both nights as two points.
    index = json.loads((tree / "html/index.json").read_text())
    rev = {h: int(r) for r, h in index["revision_to_hash"].items()}
    graph = next(g for g in (tree / "html/graphs").rglob("drift.Drift.track_error_u.json")
                 if "machine-box-a" in g.parts)  # beside arch-, cpu-, ...: asv's path holds each param
    points = json.loads(graph.read_text())
    assert [p[0] for p in points] == [rev[p1], rev[p2]]
    assert index["show_commit_url"] == f"{site.PAGE}#night-"  # a point opens its night on the drift page
    assert site.PAGE in (tree / "html/index.html").read_text()


def test_existing_night_refused_and_nothing_changes(world):
    tree = world.tree("a")
    before = snapshot(tree)
    p = world.nightly("a", "--python", PY, "--machine", "box-a", "--date", "2026-01-02", "--bench", BENCH,
                      timeout=120, MKL_CBWR="COMPATIBLE")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "already recorded" in lines[0] and "--force" in lines[0], p.stderr
    assert snapshot(tree) == before


def test_merge_two_machines_one_site_one_summary(world):
    tree = world.tree("m")
    doc = json.loads((tree / "summaries/2026-01-02-all.json").read_text())
    assert doc["machines"] == ["box-a", "box-b"]
    assert [n["machine"] for n in doc["nights"]] == ["box-a", "box-b"]
    assert doc["nights"][1]["previous"] is None  # box-b's first night
    assert {f["machine"] for f in doc["flags"]} == {"box-a"} and doc["failing"] >= 2
    md = (tree / "summaries/2026-01-02-all.md").read_text()
    assert "box-a" in md and "box-b" in md
    index = json.loads((tree / "html/index.json").read_text())
    assert set(index["params"]["machine"]) == {"box-a", "box-b"}
    hashes = set(index["revision_to_hash"].values())
    for machine, days in (("box-a", ("2026-01-01", "2026-01-02")), ("box-b", ("2026-01-02",))):
        assert {axis.commit(d) for d in days} <= hashes
        assert [g for g in (tree / "html/graphs").rglob("drift.Drift.track_kernel_id.json")
                if f"machine-{machine}" in g.parts]
    page = (tree / "html" / site.PAGE).read_text()
    assert "box-a" in page and "box-b" in page and "CNR:COMPATIBLE" in page
    # Both machines' results are on the remote's results branch.
    files = git(world.remote, "ls-tree", "-r", "--name-only", "results").splitlines()
    assert any(f.startswith("results/asv/box-a/") and f.endswith(".json") and "machine" not in f for f in files)
    assert any(f.startswith("results/asv/box-b/") and f.endswith(".json") and "machine" not in f for f in files)
    assert "summaries/2026-01-02-all.json" in files
    assert "warning" not in world.runs["merge"].stderr  # every result is at its night's axis commit


def _asv_children(repo: Path) -> dict[int, str]:
    """asv's forkservers (and the benchmarks they fork) and setup_caches serving benchmarks
    under ``repo``: {pid: "run_server" or "setup_cache"}."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            args = (d / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        kind = next((a for a in args if a in ("run_server", "setup_cache")), None)
        if kind and any(a.startswith(str(repo.resolve())) for a in args):
            out[int(d.name)] = kind
    return out


def _stat(pid: int) -> tuple[str, int]:
    """A process's state letter (T: stopped, Z: a zombie; "X" when it is gone) and its parent's pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "X", 0
    return fields[0], int(fields[1])


def test_killed_mid_run_then_a_failing_night(world):
    tree = world.tree("a")
    args = ("--python", PY, "--machine", "box-k", "--date", "2026-01-03", "--bench", BENCH, "--no-publish")
    # More than one case: its setup_cache measures long after it is found (square alone is done in seconds).
    env = {**world.env, "MATMUL_DRIFT_CASES": "square,skinny,long-k,batch-invariance-2"}
    proc = subprocess.Popen(["bash", "scripts/nightly.sh", *args], cwd=world.a, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    held = []
    try:  # killed while asv's setup_cache measures (a night's longest step), its forkserver waiting
        end, found = time.monotonic() + 300, {}
        while "setup_cache" not in found.values():
            assert proc.poll() is None and time.monotonic() < end, "the night never reached asv's setup_cache"
            time.sleep(0.02)
            found = _asv_children(world.a)
        # Its output goes to a pipe that only the night's asv reads: with asv gone, its next
        # progress line would end it (BrokenPipeError). The test keeps the pipe open instead.
        cache = {p: _stat(p)[1] for p, k in found.items() if k == "setup_cache"}  # {pid: its asv's pid}
        held = [os.open(f"/proc/{p}/fd/1", os.O_RDONLY | os.O_NONBLOCK) for p in cache]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    # Held where it is, so that it still measures when the next night starts. Only once it has
    # another parent: a process group with a stopped member gets SIGHUP when it is orphaned, and
    # a dying asv loses its command line before it hands its children on.
    for pid, asv in cache.items():
        end = time.monotonic() + 10
        while _stat(pid)[1] == asv and time.monotonic() < end:
            time.sleep(0.01)
        assert _stat(pid)[1] != asv, f"asv's setup_cache {pid} kept its killed asv {asv} as parent"
        os.kill(pid, signal.SIGSTOP)
        end = time.monotonic() + 10
        while (state := _stat(pid)[0]) not in "TZX" and time.monotonic() < end:
            time.sleep(0.01)
        assert state == "T", f"asv's setup_cache {pid} was not stopped: state {state!r}"
    for fd in held:
        os.close(fd)
    # Both are in process groups of their own: they outlive the killed night; the next one stops them.
    orphans = _asv_children(world.a)
    assert sorted(orphans.values()) == ["run_server", "setup_cache"], orphans
    # Every earlier results file still parses; nothing of the killed night was recorded.
    files = [p for p in (tree / "results").rglob("*.json")]
    assert len(files) > 5
    for p in files:
        json.loads(p.read_text())
    hist = history.read_history(tree / "results")
    assert not hist.warnings and "box-k" not in hist.runs
    assert {m: len(r) for m, r in hist.runs.items()} == {"box-a": 2}
    TreeLock(tree / ".nightly" / "lock").acquire().release()  # the lock died with its holder

    # The night runs again (its commit exists, it has no results), and every benchmark
    # fails (the environment names another torch): reported, recorded as null, not fatal.
    p = world.nightly("a", *args, MATMUL_DRIFT_EXPECT_TORCH="0.0.0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "has no results yet" in p.stderr and "benchmark values failed" in p.stderr
    assert len(world.night_commits("a", "box-k")) == 1
    assert _asv_children(world.a) == {}, "the next night left the killed one's asv processes running"
    for pid, kind in orphans.items():
        what = "forkserver" if kind == "run_server" else "setup_cache"
        assert f"recovered: stopped asv's {what} {pid} for " in p.stderr, p.stderr[-3000:]
    doc = json.loads((tree / "summaries/2026-01-03-box-k.json").read_text())
    failed = doc["nights"][0]["failed"]
    assert "drift.Drift.track_error_u square float32 cpu" in failed
    assert "benchmark values failed" in (tree / "summaries/2026-01-03-box-k.md").read_text()
    run = history.read_history(tree / "results", machine="box-k").runs["box-k"][0]
    assert run.series["drift.Drift.track_error_u"].failed.all()


# A reference-transaction hook runs inside git while it holds its locks (index.lock, the
# branch's ref lock): killing the whole process group from there is a real SIGKILL during
# `git commit` or during `git rebase`, as a lost node would leave them.
_KILL_HOOK = """#!/bin/sh
read -r _ _ ref || true
busy=false
for d in rebase-merge rebase-apply; do [ -d "$(git rev-parse --git-path $d)" ] && busy=true; done
case "$MATMUL_DRIFT_KILL_GIT:$1:$busy" in
  commit:prepared:false) case "$ref" in HEAD|refs/heads/*) kill -KILL 0 ;; esac ;;
  rebase:committed:true) [ "$ref" = HEAD ] && kill -KILL 0 ;;  # HEAD just detached onto the remote's
esac
exit 0
"""


def test_killed_at_every_step_that_writes_then_the_next_run_recovers(world, tmp_path):
    # (during asv: test_killed_mid_run_then_a_failing_night)
    # Its own remote and clone, so the other tests' trees and remote stay as they were.
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(world.remote), str(remote))
    k, other = tmp_path / "k", tmp_path / "other"
    for clone in (k, other):
        git(tmp_path, "clone", "-q", str(remote), str(clone))
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "reference-transaction").write_text(_KILL_HOOK)
    (hooks / "reference-transaction").chmod(0o755)
    tree = k / "nightly"
    args = ("--python", PY, "--machine", "box-r", "--date", "2026-01-04", "--bench", QUICK_BENCH,
            "--remote", "origin", "--no-publish")

    def night(timeout=600, publish=False, **extra):
        p = subprocess.run(["bash", "scripts/nightly.sh", *(args if not publish else args[:-1])], cwd=k,
                           env={**world.env, **QUICK, **extra},
                           capture_output=True, text=True, timeout=timeout, start_new_session=True)
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        return p

    def commits_of_the_night(where) -> int:
        log = git(where, "log", "--format=%s", "refs/heads/results") if where != remote else \
            git(remote, "log", "--format=%s", "results")
        return sum(s.startswith("night 2026-01-04 box-r:") for s in log.splitlines())

    # 1. Killed after the results were copied into the tree, before anything was committed.
    p = night(MATMUL_DRIFT_KILL_AT="copied")
    assert p.returncode == -signal.SIGKILL or p.returncode == 128 + signal.SIGKILL, p.stderr[-2000:]
    pending = json.loads((tree / ".nightly/pending.json").read_text())
    assert pending["stage"] == "copied" and all((tree / f).is_file() for f in pending["files"])
    assert commits_of_the_night(tree) == 0

    # 2. The next run is killed inside `git commit`, holding index.lock and the branch's lock.
    git(k, "config", "core.hooksPath", str(hooks))
    p = night(timeout=300, MATMUL_DRIFT_KILL_GIT="commit")
    assert p.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), p.stderr[-2000:]
    assert "killed after its results were copied" in p.stderr
    # git holds HEAD.lock and the branch's ref lock at that moment (index.lock too, earlier on)
    locks = [Path(tree, git(tree, "rev-parse", "--git-path", n))
             for n in ("index.lock", "HEAD.lock", "refs/heads/results.lock")]
    assert any(p.is_file() for p in locks) and commits_of_the_night(tree) == 0
    git(k, "config", "--unset", "core.hooksPath")

    # 3. The next run removes the stale locks, commits the night and is killed before its push.
    p = night(timeout=300, MATMUL_DRIFT_KILL_AT="committed")
    assert p.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), p.stderr[-2000:]
    assert "recovered: removed" in p.stderr and not any(p.exists() for p in locks)
    assert commits_of_the_night(tree) == 1 and commits_of_the_night(remote) == 0
    assert json.loads((tree / ".nightly/pending.json").read_text())["stage"] == "committed"  # not yet published

    # 4. Meanwhile another machine pushes; the next run must rebase, and is killed in the rebase.
    theirs = other / "nightly"
    resultsbranch.ensure_tree(other, theirs, "results", "origin")
    _tree_with(theirs, {"notes/other-machine.txt": b"pushed while box-r was down"})
    resultsbranch.commit(theirs, ["notes"], "another machine's commit")
    resultsbranch.push(theirs, "results", "origin")
    git(k, "config", "core.hooksPath", str(hooks))
    p = night(timeout=300, MATMUL_DRIFT_KILL_GIT="rebase")
    assert p.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), p.stderr[-2000:]
    assert git(tree, "branch", "--show-current") == ""  # detached, mid-rebase
    git(k, "config", "--unset", "core.hooksPath")

    # 5. The next run aborts the rebase, rebases again, pushes, and is killed building the site.
    p = night(timeout=300, publish=True, MATMUL_DRIFT_KILL_AT="publishing")
    assert p.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), p.stderr[-2000:]
    assert "recovered: aborted a rebase" in p.stderr and "completed what a killed run left" in p.stderr
    assert json.loads((tree / ".nightly/pending.json").read_text())["stage"] == "publishing"
    assert commits_of_the_night(remote) == 1

    # 6. The next run publishes the site and says the night is complete.
    p = night(timeout=300, publish=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "killed while publishing" in p.stderr and "completed what a killed run left" in p.stderr
    assert (tree / "html/index.html").is_file() and not (tree / ".nightly/pending.json").exists()
    assert git(tree, "branch", "--show-current") == "results"
    assert commits_of_the_night(tree) == 1 and commits_of_the_night(remote) == 1  # one commit per night
    assert git(tree, "rev-parse", "HEAD") == git(remote, "rev-parse", "results")
    assert (tree / "notes/other-machine.txt").is_file()
    assert resultsbranch.uncommitted(tree, ["nights", "results", "summaries"]) == []
    hist = history.read_history(tree / "results", machine="box-r")
    assert not hist.warnings and len(hist.runs["box-r"]) == 1
    # And a later run of the same night is refused as recorded, changing nothing.
    before = snapshot(tree)
    p = night(timeout=120)
    assert p.returncode == 2 and "already recorded" in p.stderr and snapshot(tree) == before


def test_a_night_killed_while_copying_is_set_aside_and_run_again(tmp_path):
    # Unit level: the pending state says "copying", one of two files made it; nothing is lost.
    tree = tmp_path / "tree"
    git(tmp_path, "init", "-q", "-b", "results", str(tree))
    _tree_with(tree, {"nights/2026-01-05-m.json": json.dumps({"date": "2026-01-05", "machine": "m"}).encode(),
                      "results/asv/m/abcd1234-env.json": b"{}"})
    (tree / ".nightly").mkdir()
    (tree / ".nightly/pending.json").write_text(json.dumps({
        "stage": "copying", "date": "2026-01-05", "machine": "m", "point": "abcd1234" * 5,
        "files": ["results/asv/m/abcd1234-env.json", "results/asv/m/abcd1234-env2.json"]}))
    assert nightly._finish_pending(tree) is None
    assert not (tree / ".nightly/pending.json").exists()
    assert not (tree / "results/asv/m/abcd1234-env.json").exists()
    kept = list((tree / "results/asv/m").glob("abcd1234-env.json.replaced-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b"{}"


def test_a_forced_night_killed_while_copying_puts_the_recorded_files_back(tmp_path):
    # --force moved the recorded result aside and was killed before copying its own.
    tree = tmp_path / "tree"
    git(tmp_path, "init", "-q", "-b", "results", str(tree))
    rel = "results/asv/m/abcd1234-env.json"
    _tree_with(tree, {"nights/2026-01-05-m.json": json.dumps({"date": "2026-01-05", "machine": "m"}).encode(),
                      rel: b'{"recorded": 1}'})
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "night")
    (tree / rel).rename(tree / f"{rel}.replaced-20260105T000000Z")
    (tree / ".nightly").mkdir()
    (tree / ".nightly/pending.json").write_text(json.dumps({
        "stage": "copying", "date": "2026-01-05", "machine": "m", "point": "abcd1234" * 5,
        "files": [rel, "nights/2026-01-05-m.json"]}))
    assert nightly._finish_pending(tree) is None and not (tree / ".nightly/pending.json").exists()
    assert (tree / rel).read_bytes() == b'{"recorded": 1}'
    assert (tree / f"{rel}.replaced-20260105T000000Z").read_bytes() == b'{"recorded": 1}'


def test_without_a_remote_a_failed_a_killed_and_a_forced_night_each_leave_the_next_run_whole(world, tmp_path):
    """No remote: a night that records nothing, one killed after its commit, and a --force
    run that fails or is killed after moving the recorded file aside. After each, the next
    run goes on without --force or a hand fix, and what was recorded is as it was."""
    git(tmp_path, "clone", "-q", str(world.remote), str(tmp_path / "k"))
    k, tree = tmp_path / "k", tmp_path / "k/nightly"
    args = ("--machine", "box-n", "--date", "2026-01-06")
    other = tmp_path / "other-python"  # asv names an environment after its Python's path
    other.write_text(f'#!/bin/sh\nexec {PY} "$@"\n')
    other.chmod(0o755)

    def night(*extra, python=PY, **env):
        p = subprocess.run(["bash", "scripts/nightly.sh", "--python", str(python), *args, *extra], cwd=k,
                           env={**world.env, **QUICK, **env}, capture_output=True, text=True, timeout=600,
                           start_new_session=True)
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        return p

    killed = (-signal.SIGKILL, 128 + signal.SIGKILL)
    # 1. asv records nothing: one error, and nothing of the night is left pending or in the tree.
    p = night("--bench", "NoSuchBenchmark", "--no-publish")
    assert p.returncode == 1 and "recorded no results" in p.stderr.strip().splitlines()[-1], p.stderr[-2000:]
    assert not (tree / ".nightly/pending.json").exists() and not (tree / "nights").exists()
    # 2. Killed right after its commit: the next run of the night publishes it; no --force.
    p = night("--bench", QUICK_BENCH, MATMUL_DRIFT_KILL_AT="committed")
    assert p.returncode in killed and not (tree / "html").exists(), p.stderr[-2000:]
    p = night("--bench", QUICK_BENCH)
    assert p.returncode == 0 and "killed after its commit" in p.stderr, p.stderr[-2000:]
    assert "completed what a killed run left" in p.stderr and (tree / "html/index.html").is_file()
    assert not (tree / ".nightly/pending.json").exists()
    recorded = snapshot(tree)
    (result,) = [f for f in recorded["files"] if f.startswith("results/asv/box-n/") and "machine" not in f]
    # 3. A --force run that records nothing leaves the recorded night, its description included.
    p = night("--bench", "NoSuchBenchmark", "--no-publish", "--force")
    assert p.returncode == 1 and resultsbranch.uncommitted(tree, ["nights", "results", "summaries"]) == []
    # 4. A --force run in another Python killed once the recorded result is moved aside, before
    # its own (under another name) is copied.
    p = night("--bench", QUICK_BENCH, "--no-publish", "--force", python=other,
              MATMUL_DRIFT_KILL_AT="replaced")
    assert p.returncode in killed and not (tree / result).exists(), p.stderr[-2000:]
    p = night("--bench", QUICK_BENCH, "--no-publish")  # recovered: the night is recorded as it was
    assert p.returncode == 2 and "1 put back as recorded" in p.stderr and "already recorded" in p.stderr, p.stderr
    assert (tree / result).read_bytes() == recorded["files"][result]
    assert [f for f in resultsbranch.uncommitted(tree, ["nights", "results", "summaries"])
            if ".replaced-" not in f] == []  # what the killed run moved aside is kept beside, untracked
    assert git(tree, "rev-parse", "HEAD") == recorded["head"]
    # 5. And a forced night that finishes replaces the night, keeping the old beside.
    p = night("--bench", QUICK_BENCH, "--no-publish", "--force")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the old description is kept as 2026-01-06-box-n.json.replaced-" in p.stderr
    assert git(tree, "rev-parse", "HEAD^") == recorded["head"]
    assert resultsbranch.uncommitted(tree, ["nights/2026-01-06-box-n.json", result]) == []


def test_a_night_left_copied_with_no_files_runs_again(tmp_path):
    # What an earlier version left when asv recorded nothing: it must not stop every later night.
    tree = tmp_path / "tree"
    git(tmp_path, "init", "-q", "-b", "results", str(tree))
    _tree_with(tree, {"nights/2026-01-05-m.json": json.dumps({"date": "2026-01-05", "machine": "m"}).encode()})
    (tree / ".nightly").mkdir()
    (tree / ".nightly/pending.json").write_text(json.dumps({
        "stage": "copied", "date": "2026-01-05", "machine": "m", "point": "ab" * 20, "files": []}))
    assert nightly._finish_pending(tree) is None and not (tree / ".nightly/pending.json").exists()


def test_the_pending_state_is_written_as_before_and_one_written_before_is_recovered(tmp_path):
    """pending.json's bytes do not depend on Stage being an enum: a night left by any run
    reads back, and the stages are the words MATMUL_DRIFT_KILL_AT names."""
    tree = tmp_path / "tree"
    (tree / ".nightly").mkdir(parents=True)
    night = {"date": "2026-01-05", "machine": "m"}
    nightly._set_pending(tree, nightly.Stage.COPIED, night, "ab" * 20, ["nights/2026-01-05-m.json"])
    assert (tree / ".nightly/pending.json").read_text() == (
        '{"stage": "copied", "date": "2026-01-05", "machine": "m", "point": "' + "ab" * 20
        + '", "files": ["nights/2026-01-05-m.json"]}\n')
    assert [s.value for s in nightly.Stage] == ["copying", "copied", "committed", "publishing"]
    for stage in ("committed", "publishing"):  # as an earlier run wrote it: the night's run publishes
        (tree / ".nightly/pending.json").write_text(json.dumps({
            "stage": stage, "date": "2026-01-05", "machine": "m", "point": "ab" * 20, "files": []}) + "\n")
        assert nightly._finish_pending(tree) == nightly.Finished("2026-01-05", "m", "")


def test_backups_in_one_second_keep_every_old_file(tmp_path, monkeypatch):
    from datetime import datetime

    from matmul_drift.store import atomic

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 5, 12, 0, 0, tzinfo=tz)

    monkeypatch.setattr(atomic, "datetime", Frozen)
    f = tmp_path / "note.md"
    kept = []
    for version in (b"A", b"B", b"C"):
        f.write_bytes(version)
        kept.append(atomic.backup(f))
    assert not f.exists() and [k.read_bytes() for k in kept] == [b"A", b"B", b"C"]
    assert [k.name for k in kept] == ["note.md.replaced-20260105T120000Z", "note.md.replaced-20260105T120000Z-2",
                                      "note.md.replaced-20260105T120000Z-3"]


@pytest.mark.parametrize("old", [b"", b'{"a": ', b"[]"])
def test_an_unreadable_benchmarks_json_is_kept_beside_and_rewritten(tmp_path, old):
    from matmul_drift.jobs import asvrun

    path = tmp_path / "benchmarks.json"
    path.write_bytes(old)
    said = []
    asvrun.merge_benchmarks(path, {"b": 1, "version": 2}, said.append)
    (kept,) = tmp_path.glob("benchmarks.json.replaced-*")
    assert json.loads(path.read_text()) == {"b": 1, "version": 2} and kept.read_bytes() == old
    assert said == [f"{path} could not be read; rewritten, the old file kept as {kept.name}"]
    asvrun.merge_benchmarks(path, {"c": 1}, said.append)
    assert len(said) == 1 and json.loads(path.read_text())["b"] == 1


def test_repair_removes_stale_locks_and_aborts_a_rebase(tmp_path):
    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "results", str(repo))
    git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    assert resultsbranch.repair(repo, "results") == []
    Path(repo, ".git/index.lock").write_text("")
    Path(repo, ".git/refs/heads/results.lock").write_text("")
    done = resultsbranch.repair(repo, "results")
    assert len(done) == 2 and all("killed" in d for d in done)
    assert not Path(repo, ".git/index.lock").exists() and not Path(repo, ".git/refs/heads/results.lock").exists()


# ---------------------------------------------------------------------------- the parts


def test_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    path = tmp_path / "lock"
    holder = subprocess.Popen(
        [PY, "-c", "import sys, time; from matmul_drift.store.lock import TreeLock; TreeLock(sys.argv[1]).acquire(); "
                   "print('held', flush=True); time.sleep(600)", str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Locked, match=f"pid {holder.pid} "):
            TreeLock(path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with TreeLock(path):
        with pytest.raises(Locked):
            TreeLock(path).acquire()


def test_tree_comes_back_after_a_ci_clean(tmp_path):
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "commit", "-q", "--allow-empty", "-m", "init")
    tree = resultsbranch.ensure_tree(repo, repo / "nightly", "results")
    assert (tree / ".gitignore").read_text() == resultsbranch.IGNORE
    assert not resultsbranch.born(tree) and sorted(p.name for p in tree.iterdir()) == [".git", ".gitignore"]
    first = resultsbranch.commit(tree, [".gitignore"], "night 1")
    assert git(tree, "rev-list", "HEAD").split() == [first]  # the first night is the root
    shutil.rmtree(tree)  # what `git clean -ffdx` does to it on a CI runner
    tree = resultsbranch.ensure_tree(repo, repo / "nightly", "results")
    assert resultsbranch.head(tree) == first
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f").write_text("x")
    with pytest.raises(resultsbranch.GitError, match="not a git work tree"):
        resultsbranch.ensure_tree(repo, tmp_path / "other", "results")


def test_commit_message_names_torch_git_cuda_machine():
    env = {"torch": {"version": "2.15.0.dev20260101+cu130", "git": "0123456789abcdef0123", "cuda_build": "13.0"},
           "cuda": {"runtime": "13.0", "gpu": "NVIDIA H100", "driver": "580.65", "cublas": "13.0.2"},
           "env_vars": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}}
    night = {"date": "2026-01-05", "machine": "h100", "python": "/v/bin/python", "python_version": "3.11.9",
             "device": "cuda", "environment": env}
    msg = nightly.commit_message(night, "summary: 0 flags")
    assert msg.splitlines()[0] == ("night 2026-01-05 h100: torch 2.15.0.dev20260101+cu130 (git 0123456789ab), "
                                   "CUDA 13.0, machine h100")
    assert "NVIDIA H100" in msg and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in msg and "summary: 0 flags" in msg
    assert f"asv point: {axis.commit('2026-01-05')}" in msg



_KERNEL_COMBO = 1  # square float32 cpu


def _three_nights(root: Path, middle) -> F.Tree:
    """Three nights of one machine, each in its own venv (asv env name), the kernel-id of one
    combination changed on the third; ``middle(data, k)`` edits the second night's results."""
    k = _KERNEL_COMBO
    new_kernel = catalog.store(root / "catalog", "kernels", {"device": "cpu", "full": ["aten::matmul", "other"]})

    def adjust(ci, ei, data):
        data["env_name"] = f"existing-py_home_ci_venv-night{ci}_bin_python"
        if ci == 1:
            middle(data, k)
        if ci == 2:
            F.set_value(data, F.KERNEL, k, new_kernel)

    return F.write_tree(root, n_commits=3, torch_versions=("2.13.0",), adjust=adjust)


@pytest.mark.parametrize("middle", [
    lambda data, k: F.set_value(data, F.KERNEL, k, None),  # failed (asv null)
    lambda data, k: data["results"].pop(F.KERNEL),  # not run (asv run --bench)
], ids=["failed", "not-run"])
def test_a_change_across_a_night_without_the_value_is_flagged(tmp_path, middle):
    tree = _three_nights(tmp_path / "results", middle)
    hist = history.read_history(tree.root)
    pairs, nights = latest.nights(hist)
    assert pairs == {tree.machine: (tree.commits[1], tree.commits[2])}
    result = latest.compare(hist, pairs)
    kernel = [f for f in result.flags if f.kind == "kernel"]
    # Judged against the first night, named by its own commit and environment.
    assert [(f.before.commit, f.before.env, f.after.commit, f.after.env) for f in kernel] == [
        (tree.commits[0], "existing-py_home_ci_venv-night0_bin_python",
         tree.commits[2], "existing-py_home_ci_venv-night2_bin_python")]
    assert [f.params for f in kernel] == [tree.combos[_KERNEL_COMBO]]
    # The runs keep their own environment names for whatever reads the history next (the site).
    assert [r.env_name for r in hist.runs[tree.machine]] == [f"existing-py_home_ci_venv-night{i}_bin_python" for i in range(3)]
    _, js, plain = nightly.write_summary(tmp_path, "2025-01-03-synthetic", result, nights)
    doc = json.loads(js.read_text())
    assert doc["failing"] == 1 and [f["kind"] for f in doc["flags"] if f["failing"]] == ["kernel"]  # the workflow files an issue
    assert tree.commits[0][:8] in plain and "1 failing (kernel)" in plain
    # The night line says "against" the second night; it must also say that this flag was judged
    # against the first, or "kernel changed" reads as a change since the second night.
    dates = {r.commit: latest.night_date(r.date) for r in hist.runs[tree.machine]}
    (line,) = [ln for ln in (tmp_path / "summaries/2025-01-03-synthetic.md").read_text().splitlines()
               if ln.startswith(f"- {tree.machine}: ")]
    assert line.endswith(f"; 1 flag against {dates[tree.commits[0]]} ({tree.commits[0][:8]}) instead, "
                         f"where {dates[tree.commits[1]]} had no value"), line
    assert doc["nights"][0]["bridged"] == [{"commit": tree.commits[0], "date": dates[tree.commits[0]], "flags": 1}]


def test_a_code_change_before_a_night_without_the_benchmark_stops_the_walk_back(tmp_path):
    # The first night ran other benchmark code: the kernel-ids are not compared across it.
    def middle(data, k):
        del data["results"][F.KERNEL]

    tree = _three_nights(tmp_path / "results", middle)
    first = F.load_results(tree.files[0])
    F.set_version(first, F.KERNEL, "old code")
    F.write_results(tree.machine_dir, first)
    hist = history.read_history(tree.root)
    result = latest.compare(hist, latest.nights(hist)[0])
    assert result.flags == [] and result.failing(summary.DEFAULT_FAIL_ON) == []
    assert len(result.method_notes) == 1 and "Drift.track_kernel_id: benchmark code changed between " \
        f"{tree.commits[0][:8]} and {tree.commits[2][:8]}" in result.method_notes[0], result.method_notes


def _on_other_cpu(data: dict) -> None:
    data["params"].update(cpu="AMD EPYC 9B14 96-Core Processor")


def _vm_nights(tmp_path: Path, n: int, other_cpu: set[int], kernel: dict[int, str | None]) -> tuple[F.Tree, history.History]:
    """Nights 0..n-1 of machine "vm" (one torch build): those in ``other_cpu`` ran on another
    CPU, and ``kernel`` sets the kernel-id of _KERNEL_COMBO on a night ("new": a new kernel
    list, None: failed). The tree and its history."""
    root = tmp_path / "results"
    new = catalog.store(root / "catalog", "kernels", {"device": "cpu", "full": ["aten::mm", "NEW"]})

    def adjust(ci, ei, data):
        if ci in other_cpu:
            _on_other_cpu(data)
        if ci in kernel:
            F.set_value(data, F.KERNEL, _KERNEL_COMBO, new if kernel[ci] == "new" else kernel[ci])

    tree = F.write_tree(root, machine="vm", n_commits=n, torch_versions=("2.13.0",), adjust=adjust)
    return tree, history.read_history(root)


def test_a_machine_seen_on_two_hardwares_keeps_the_flags_of_its_latest_night(tmp_path):
    # Night 0 ran on another CPU under the same machine name (a partition's other node): the
    # summary then labels each hardware "vm [cpu, ...]", and compare kept only flags labelled
    # "vm", so the kernel change of night 2 against night 1 (one hardware) was dropped: 0 flags.
    tree, hist = _vm_nights(tmp_path, 3, other_cpu={0}, kernel={2: "new"})
    pairs, _ = latest.nights(hist)
    assert pairs == {"vm": (tree.commits[1], tree.commits[2])}
    result = latest.compare(hist, pairs)
    kernel = [(f.before.commit, f.after.commit, f.params) for f in result.flags if f.kind == "kernel"]
    assert kernel == [(tree.commits[1], tree.commits[2], tree.combos[_KERNEL_COMBO])]
    # the same flags as `summary --base --head` over this machine's results alone
    alone = summary.summarise(hist, summary.Options(base=tree.commits[1], head=tree.commits[2]))
    assert [(f.kind, f.benchmark, f.params) for f in result.flags] == [(f.kind, f.benchmark, f.params) for f in alone.flags]


def test_nightly_sh_reads_relative_paths_from_where_it_is_called(tmp_path):
    # It changed into the checkout first: `cd /data && nightly.sh --merge ./artifacts` merged the
    # checkout's own ./artifacts, or said "not a directory" about a folder that is there
    (tmp_path / "only-here").mkdir()
    p = subprocess.run(["bash", str(ROOT / "scripts" / "nightly.sh"),
                        "--merge", "./only-here", "--date", "bogus"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "matmul-drift nightly: error: --date 'bogus' is not a date like 2026-01-31"], p.stderr


def test_a_machine_on_two_hardwares_says_which_flags_were_judged_against_an_earlier_night(tmp_path):
    # Its flags are labelled "vm [cpu, ...]": the night line matched "vm" alone, so a flag judged
    # against night 1 (night 2 had no value) lost its "instead" note
    tree, hist = _vm_nights(tmp_path, 4, other_cpu={0}, kernel={2: None, 3: "new"})  # night 2 failed
    pairs, (night,) = latest.nights(hist)
    result = latest.compare(hist, pairs)
    assert [f.before.commit for f in result.flags if f.kind == "kernel"] == [tree.commits[1]]
    (b,) = latest.bridged(night, result)
    assert (b["commit"], b["flags"]) == (tree.commits[1], 1)


@pytest.mark.parametrize("last_on_other", [False, True])
def test_a_night_is_compared_with_the_previous_night_on_its_own_hardware(tmp_path, last_on_other):
    # Night 1 ran on another CPU under the same name. Night 2 (back on the first CPU, its kernel
    # changed) was paired with night 1: the summary compares no hardwares, so nothing was
    # judged (0 comparisons, no flag) while the line said "against" night 1. It is judged
    # against night 0 now. Where night 2 is itself on the other CPU, after nights 0 and 1 on
    # the first, it has nothing to compare with on its hardware, and the line says so.
    tree, hist = _vm_nights(tmp_path, 3, other_cpu={2 if last_on_other else 1}, kernel={2: "new"})
    pairs, (night,) = latest.nights(hist)
    dates = [latest.night_date(d) for d in tree.dates]
    line = latest.night_line({**night, "bridged": []})
    result = latest.compare(hist, pairs)
    if last_on_other:
        assert pairs == {"vm": (None, tree.commits[2])} and result.pairs == 0 and result.flags == []
        assert line == (f"vm: {dates[2]} ({tree.commits[2][:8]}, torch 2.13.0+cpu), the first night on this hardware: "
                        f"nothing to compare with ({dates[1]} ({tree.commits[1][:8]}) ran on other hardware)")
    else:
        assert pairs == {"vm": (tree.commits[0], tree.commits[2])} and result.pairs == 1
        assert [(f.kind, f.before.commit, f.params) for f in result.flags] == [
            ("kernel", tree.commits[0], tree.combos[_KERNEL_COMBO])]
        assert f", against {dates[0]} ({tree.commits[0][:8]}, torch 2.13.0+cpu)" in line


def test_a_merge_counts_and_warns_about_each_machines_own_nights_only(tmp_path):
    # box-a's nights are days 0 and 1, box-b's days 0, 1 and 2: one latest pair each. Each
    # machine was summarised over every machine's results, so box-b's days 0 -> 1 were counted
    # in box-a's comparison too (3 comparisons, not 2), and box-b's warned about box-a's lack of
    # day 2 ("box-a: environment ... has results only at base; not compared").
    root = tmp_path / "results"
    F.write_tree(root, machine="box-a", n_commits=2, torch_versions=("2.13.0",))
    later = F.write_tree(root, machine="box-b", n_commits=3, torch_versions=("2.13.0",))
    hist = history.read_history(root)
    pairs, _ = latest.nights(hist)
    assert pairs == {"box-a": (later.commits[0], later.commits[1]), "box-b": (later.commits[1], later.commits[2])}
    result = latest.compare(hist, pairs)
    assert result.pairs == 2 and result.warnings == [] and result.flags == []


def test_a_merged_night_whose_environment_parts_are_not_objects_is_still_listed(tmp_path):
    # check_night_file takes any object as environment: its torch and cuda may be strings there
    tree = _tree_with(tmp_path, {"nights/2026-01-01-gpu-a.json": json.dumps(
        {"date": "2026-01-01", "machine": "gpu-a", "environment": {"torch": "2.14.1", "cuda": 5}}).encode()})
    merge.check_night_file(Path("nights/2026-01-01-gpu-a.json"), (tree / "nights/2026-01-01-gpu-a.json").read_bytes())
    (night,) = nightly._recorded_nights(tree)
    assert night["title"] == "night 2026-01-01 gpu-a: torch None (git unknown), CUDA none, machine gpu-a"

def test_a_night_file_whose_machine_is_not_a_string_is_still_listed_on_the_site(tmp_path):
    # A tree's night file edited by hand (the merge checks them; a tree on disk is read as it is):
    # its machine null beside another night of that date made sorting the page's table of
    # nights raise TypeError, and the site was not built.
    tree = _tree_with(tmp_path, {f"nights/2026-01-01-{m}.json": json.dumps(
        {"date": "2026-01-01", "machine": v, "environment": {}}).encode() for m, v in (("a", "box-a"), ("b", None), ("c", 7))})
    nights = nightly._recorded_nights(tree)
    rows = [ln for ln in site._all_nights(nights) if ln.startswith("<tr")]
    assert len(rows) == 3 and sum(f'id="night-{axis.commit("2026-01-01")}"' in r for r in rows) == 1
    assert [n["machine"] for n in nights] == ["box-a", None, 7]
    for title in ("machine box-a", "machine None", "machine 7"):
        assert sum(title in r for r in rows) == 1, rows


def _tree_with(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_plan_merge_copies_new_skips_same_flags_conflicts(tmp_path):
    tree = _tree_with(tmp_path / "tree", {"results/asv/a/x.json": b"1", "results/asv/a/machine.json": b'"m1"',
                                          "results/catalog/env/e.json": b'"e"'})
    src = _tree_with(tmp_path / "src", {
        "results/asv/a/x.json": b"1",  # the same: skipped
        "results/asv/a/machine.json": b'"m2"',  # asv's machine description: updated
        "results/asv/b/y.json": b"2", "results/catalog/kernels/k.json": b'"k"',  # new
        "results/asv/benchmarks.json": b"{}", "summaries/d-b.md": b"s", "notes.txt": b"ignored",
    })
    copies, benches, conflicts = merge.plan_merge(tree, [src])
    rels = [str(d.relative_to(tree)) for _, d in copies]
    assert rels == ["results/catalog/kernels/k.json", "results/asv/a/machine.json", "results/asv/b/y.json",
                    "summaries/d-b.md"]  # catalog first, results before summaries
    assert [(d, b.name) for d, b in benches] == [(None, "benchmarks.json")] and conflicts == []
    clash = _tree_with(tmp_path / "clash", {"results/asv/a/x.json": b'"other"'})
    copies, _, conflicts = merge.plan_merge(tree, [clash])
    assert conflicts == ["results/asv/a/x.json differs from the recorded file"] and len(copies) == 1


def test_a_source_without_a_tree_is_named_and_the_others_still_merge(tmp_path, capsys):
    # an empty artifact (a machine that uploaded nothing) must not stop the others' merge, and
    # must not pass unsaid: it merged 0 files with no word
    tree = _tree_with(tmp_path / "tree", {"results/asv/a/x.json": b"1"})
    src = _tree_with(tmp_path / "src", {"results/asv/b/y.json": b"2"})
    (tmp_path / "empty").mkdir()
    copies, _, _ = merge.plan_merge(tree, [tmp_path / "empty", src])
    assert [str(d.relative_to(tree)) for _, d in copies] == ["results/asv/b/y.json"]
    err = capsys.readouterr().err
    assert f"warning: --merge {tmp_path / 'empty'} holds none of results/, summaries/, nights/" in err, err
    assert str(src) not in err


@pytest.mark.parametrize("newer_first", [True, False])
def test_a_merge_keeps_the_newest_benchmark_descriptions_whatever_the_order(tmp_path, newer_first):
    # asv publish draws a result only where its benchmark version is benchmarks.json's. box-b's
    # tree is older (its nights are days 0-1, before its benchmark changed); box-a's (days 10-11)
    # ran the new code. Merged after box-a's, box-b's benchmarks.json won, and asv's own
    # get_result_keys then dropped track_error_u from box-a's newest results: gone from the site.
    from asv.results import Results

    version = F.bench_version(F.ERROR_U, "new code")

    def newer(ci, ei, data):
        data["date"] += 10 * F.DAY_MS
        F.set_version(data, F.ERROR_U, version)

    new = F.write_tree(tmp_path / "a/results", machine="box-a", n_commits=2, torch_versions=("2.13.0",), adjust=newer)
    bench = json.loads((new.asv_dir / "benchmarks.json").read_text())
    bench[F.ERROR_U]["version"] = version
    (new.asv_dir / "benchmarks.json").write_text(json.dumps(bench))
    F.write_tree(tmp_path / "b/results", machine="box-b", n_commits=2, torch_versions=("2.13.0",))
    o = _merge_target(tmp_path)
    sources = [tmp_path / "a", tmp_path / "b"]
    merge.run_merge(o, sources if newer_first else sources[::-1])
    merged = json.loads((o.tree / "results/asv/benchmarks.json").read_text())
    newest = Results.load(str(o.tree / "results/asv/box-a" / new.file(1, 0).name))
    assert merged[F.ERROR_U]["version"] == version and F.ERROR_U in newest.get_result_keys(merged)


def test_a_merge_reads_order_trees_deeper_than_json_loads_goes(tmp_path):
    """A sequential tree is K deep: the project's own results hold such catalog entries, and a
    GPU check's order-*.json reports; json.loads stops at about 1000 levels."""

    deep = 0
    for i in range(1, 1500):
        deep = [deep, i]
    entry = trees.entry_text(deep, 1500).encode()
    report = trees.report_text({"k": 1500, "summary": "sequential"}, deep).encode()
    with pytest.raises(RecursionError):
        json.loads(entry)
    tree = _tree_with(tmp_path / "tree", {})
    src = _tree_with(tmp_path / "src", {"results/catalog/orders/0123456789ab.json": entry,
                                        "results/gpu-check/h200/0123abcd/order-seed-float16.json": report})
    copies, _, conflicts = merge.plan_merge(tree, [src])
    assert sorted(str(d.relative_to(tree)) for _, d in copies) == [
        "results/catalog/orders/0123456789ab.json", "results/gpu-check/h200/0123abcd/order-seed-float16.json"]
    back = trees.read_report(report.decode())
    assert trees.to_json(back.pop("tree")) == trees.to_json(deep) and back == {"k": 1500, "summary": "sequential"}
    assert trees.to_json(trees.read_report(report.decode().replace("\n", "\r\n"))["tree"]) == trees.to_json(deep)
    cut = _tree_with(tmp_path / "cut", {"results/catalog/orders/0123456789ab.json": entry[:-9]})
    with pytest.raises(nightly.UsageError, match="orders/0123456789ab.json is not valid JSON"):
        merge.plan_merge(tree, [cut])


def test_import_night_never_replaces_without_force(tmp_path):
    commit = "ab" * 20
    staging = _tree_with(tmp_path / "staging", {f"m/{commit[:8]}-env.json": b'{"new": 1}', "m/machine.json": b"{}",
                                                "benchmarks.json": b'{"b": 2, "version": 2}'})
    results = _tree_with(tmp_path / "results", {f"m/{commit[:8]}-old-env.json": b'{"old": 1}',
                                                "benchmarks.json": b'{"a": 1, "version": 2}'})
    with pytest.raises(nightly.UsageError, match="--force"):
        nightly.import_night(staging, results, "m", commit, force=False)
    assert sorted(p.name for p in (results / "m").iterdir()) == [f"{commit[:8]}-old-env.json"]
    out = nightly.import_night(staging, results, "m", commit, force=True)
    assert [p.read_bytes() for p in out] == [b'{"new": 1}']
    kept = [p for p in (results / "m").iterdir() if ".replaced-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"old": 1}'  # moved aside, not lost
    assert json.loads((results / "benchmarks.json").read_text()) == {"a": 1, "b": 2, "version": 2}


def test_cli_errors_are_one_line_exit_2(world, tmp_path):
    bare = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(bare)], check=True)
    cases = [
        ((), world.b, "give --python PY and --machine NAME"),
        (("--python", PY, "--machine", "a/b"), world.b, "machine name"),
        (("--python", PY, "--machine", "x", "--date", "2026-02-30"), world.b, "not a date"),
        (("--python", PY, "--machine", "x", "--date", ""), world.b, "--date '' is not a date"),  # was read as today
        (("--merge", "--date", "0001-01-01"), world.b, "the night 0001-01-01 lies before"),  # was '1-01-01'
        (("--merge", "--python", PY), world.b, "--merge takes no"),
        (("--merge", str(tmp_path / "absent")), world.b, "not a directory"),
        # a results folder itself merged 0 files and committed a summary: its parent was meant
        (("--merge", str(tmp_path / "art" / "results")), world.b, "a results/ folder itself; give the folder that holds it, --merge "),
        (("--python", "no-such-python", "--machine", "x"), world.b, "no such executable"),
        (("--python", PY, "--machine", "x"), tmp_path, "not inside a git checkout"),
        (("--python", PY, "--machine", "x", "--tree", str(tmp_path / "t")), world.b, "already checked out"),
        (("--python", str(bare / "bin" / "python"), "--machine", "x"), world.b, "cannot describe its torch environment"),
        (("--python", "/bin/true", "--machine", "x"), world.b, "/bin/true is not a Python that can describe"),
        (("--python", "/bin/echo", "--machine", "x"), world.b, "/bin/echo is not a Python that can describe"),
        (("--python", PY, "--machine", "x", "--date", "9999-12-31"), world.b, "more than a year from today"),
        # a value git would read as an option never reaches git
        (("--python", PY, "--machine", "x", "--remote", "--upload-pack=touch /tmp/pwned"), world.b, "--remote"),
        (("--python", PY, "--machine", "x", "--branch=--orphan"), world.b, "not a valid git branch name"),
        (("--python", PY, "--machine", "x", "--branch", "a..b"), world.b, "not a valid git branch name"),
    ]
    # a selection the suite would refuse stops the night before it starts
    cases.append((("--python", PY, "--machine", "x"), world.b, "$MATMUL_DRIFT_PRECISIONS names unknown precisions: fp8"))
    (tmp_path / "art" / "results" / "asv").mkdir(parents=True)
    for args, cwd, needle in cases:
        env = {**world.env, "MATMUL_DRIFT_PRECISIONS": "fp8"} if "fp8" in needle else world.env
        p = subprocess.run([PY, "-m", "matmul_drift.cli", "nightly", *args], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=120)
        lines = p.stderr.strip().splitlines()  # progress lines may come before the one error line
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr)
        assert lines[-1].startswith("matmul-drift nightly: error: ") and needle in lines[-1], (args, p.stderr)
        assert sum(": error: " in ln for ln in lines) == 1, (args, p.stderr)


def test_site_uses_local_copies_of_asv_cdn_files():
    import asv

    index = (Path(asv.__file__).parent / "www" / "index.html").read_text()
    text, external = site.localise(index)
    assert external == [] and "vendor/jquery-3.3.1.min.js" in text
    import base64
    import hashlib
    import re

    for url, (local, identical) in site.CDN.items():
        assert url in index
        data = (site.VENDOR / local).read_bytes()
        if identical:  # the browser checks this hash; check it here too
            algo, want = re.search(re.escape(url) + r'"[^>]*integrity="(sha\d+)-([^"]+)"', index).groups()
            assert base64.b64encode(hashlib.new(algo, data).digest()).decode() == want, local
    assert site.add_link(site.add_link(text)).count(site.PAGE) == 1


# ---------------------------------------------------------------------------- Slurm


def _stub(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)


def _submit(tmp_path: Path, partitions: str, scontrol_fails_on: str = "none") -> tuple[subprocess.CompletedProcess, list[str]]:
    """`slurm-nightly.sbatch --submit` for machines h100 and a100 on ``partitions``, with stub
    sbatch (job 4242), scancel and scontrol (which fails on a partition named
    ``scontrol_fails_on``): (the run, every Slurm call it made, one line each)."""
    log = tmp_path / "calls"
    _stub(tmp_path / "bin", "sbatch", f'echo "sbatch $*" >> {log}; echo 4242')
    _stub(tmp_path / "bin", "scontrol", f'echo "scontrol $*" >> {log}; case "$*" in *{scontrol_fails_on}*) exit 1;; esac')
    _stub(tmp_path / "bin", "scancel", f'echo "scancel $*" >> {log}')
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "MATMUL_DRIFT_REPO": str(ROOT),
           "MATMUL_DRIFT_MACHINES": "h100 a100", "MATMUL_DRIFT_PARTITIONS": partitions}
    p = subprocess.run(["bash", str(ROOT / "scripts/slurm-nightly.sbatch"), "--submit"], env=env,
                       capture_output=True, text=True, timeout=60)
    return p, log.read_text().splitlines()


def test_slurm_submit_moves_each_task_to_its_partition(tmp_path):
    p, calls = _submit(tmp_path, "gpu-h100 gpu-a100")
    assert p.returncode == 0, p.stderr
    assert calls[0].startswith("sbatch --parsable --hold --array=0-1 ")
    assert calls[1:4] == ["scontrol update JobId=4242_0 Partition=gpu-h100",
                          "scontrol update JobId=4242_1 Partition=gpu-a100", "scontrol release 4242"]
    assert "--dependency=afterany:4242" in calls[4] and "NIGHTLY_MERGE=1" in calls[4]


def test_slurm_submit_with_a_partition_slurm_refuses_runs_the_other_machines(tmp_path):
    # `scontrol update` failing (a mistyped partition) stopped --submit under set -e after
    # `sbatch --hold`: the whole array stayed held, no merge was queued, every machine lost the night
    p, calls = _submit(tmp_path, "gpu-typo gpu-a100", scontrol_fails_on="gpu-typo")
    assert p.returncode == 1 and "cannot move h100 to partition gpu-typo" in p.stderr, p.stderr
    assert calls[1:5] == ["scontrol update JobId=4242_0 Partition=gpu-typo", "scancel 4242_0",
                          "scontrol update JobId=4242_1 Partition=gpu-a100", "scontrol release 4242"], calls
    assert "--dependency=afterany:4242" in calls[5] and "NIGHTLY_MERGE=1" in calls[5]


def test_slurm_task_stops_in_one_line_when_its_pull_fails(tmp_path):
    # The task's clone exists and its origin is gone: the pull fails, and the night must not
    # run on the stale code (set -e does not apply inside $(...), where the clone once ran).
    for name in ("sbatch", "scontrol"):
        _stub(tmp_path / "bin", name, "exit 0")
    _stub(tmp_path / "bin", "nvidia-smi", "echo 'GPU 0: stub'")
    _stub(tmp_path / "bin", "python-under-test", f"touch {tmp_path / 'night-ran'}")
    root, gone = tmp_path / "root", tmp_path / "gone"
    committed_copy(gone)
    git(tmp_path, "clone", "-q", str(gone), str(root / "gpu-x"))
    shutil.rmtree(gone)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "MATMUL_DRIFT_REPO": str(gone),
           "MATMUL_DRIFT_MACHINES": "gpu-x", "MATMUL_DRIFT_PYTHON": str(tmp_path / "bin/python-under-test"),
           "NIGHTLY_ROOT": str(root), "SLURM_ARRAY_TASK_ID": "0"}
    for extra in ({}, {"NIGHTLY_MERGE": "1"}):
        if extra:  # the merge's clone, made before its origin went away
            git(tmp_path, "clone", "-q", str(root / "gpu-x"), str(root / "merge"))
            git(root / "merge", "remote", "set-url", "origin", str(gone))
        p = subprocess.run(["bash", str(ROOT / "scripts/slurm-nightly.sbatch")], env={**env, **extra},
                           capture_output=True, text=True, timeout=60)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "GPU 0" not in ln]
        assert p.returncode == 1 and len(lines) == 1, p.stderr
        assert lines[0].startswith("slurm-nightly: error: cannot update") and "git pull" in lines[0]
        assert not (tmp_path / "night-ran").exists()


def test_slurm_task_and_merge_run_the_nightly(world, tmp_path):
    _stub(tmp_path / "bin", "nvidia-smi", "echo 'GPU 0: stub'")
    env = {**world.env, "PATH": f"{tmp_path / 'bin'}:{world.env['PATH']}", "SLURM_SUBMIT_DIR": str(world.proj),
           "MATMUL_DRIFT_MACHINES": "gpu-x cpu-y", "MATMUL_DRIFT_PYTHON": PY, "NIGHTLY_ROOT": str(tmp_path / "root"),
           "NIGHTLY_BENCH": QUICK_BENCH, **QUICK}
    script = str(ROOT / "scripts/slurm-nightly.sbatch")
    p = subprocess.run(["bash", script], env={**env, "SLURM_ARRAY_TASK_ID": "1"}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run(["bash", script], env={**env, "NIGHTLY_MERGE": "1"}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    merged = tmp_path / "root/merge/nightly"
    assert json.loads((merged / "html/index.json").read_text())["params"]["machine"] == ["cpu-y"]
    # The task pushed nothing; the merge made the night's one commit, naming its torch build.
    log = git(tmp_path / "root/results.git", "log", "--format=%s%n%b%x00", "results").split("\0")
    assert len([c for c in log if c.strip()]) == 1
    assert log[0].startswith("night ") and "cpu-y merged" in log[0].splitlines()[0] and "machine cpu-y" in log[0]


# ---------------------------------------------------------------------------- asv's axis


def test_axis_commits_are_what_git_makes(tmp_path):
    # The hashes come from axis.py alone; git, given the same days, must make the same commits.
    tip = axis.build(tmp_path / "axis.git", "2020-03-01", "results")
    assert tip == axis.commit("2020-03-01")
    log = git(tmp_path / "axis.git", "log", "--format=%H %ad %s", "--date=short", "results").splitlines()
    assert len(log) == 61 and log[-1].split()[1:] == ["2020-01-01", "night", "2020-01-01"]
    assert all(h == axis.commit(d) and s == f"night {d}" for h, d, s in (ln.split(" ", 2) for ln in log))
    assert git(tmp_path / "axis.git", "ls-tree", "results") == ""  # empty commits
    # It grows by the days it lacks and never shrinks.
    assert axis.build(tmp_path / "axis.git", "2020-03-03", "results") == axis.commit("2020-03-03")
    assert git(tmp_path / "axis.git", "rev-parse", "results~2") == tip
    assert axis.build(tmp_path / "axis.git", "2020-02-01", "results") == axis.commit("2020-03-03")
    assert axis.night_of(axis.commit("2020-02-29"), "2020-03-03") == "2020-02-29"
    with pytest.raises(axis.AxisError, match="before 2020-01-01"):
        axis.commit("2019-12-31")
    from datetime import datetime, timedelta, timezone

    today = datetime.now(timezone.utc).date()
    axis.commit(str(today + timedelta(days=30)))  # a results date from a clock ahead: still on the axis
    for late in (str(today + timedelta(days=400)), "9999-12-31"):  # 9999-12-31 had no next day: OverflowError
        with pytest.raises(axis.AxisError, match="more than a year from today"):
            axis.commit(late)
    # the CLI's --date: tonight, or tomorrow for a clock ahead of UTC (3 days: no flake at midnight)
    assert nightly.check_date(str(today + timedelta(days=1)), tonight=True) == str(today + timedelta(days=1))
    with pytest.raises(nightly.UsageError, match="a night is tonight or one before"):
        nightly.check_date(str(today + timedelta(days=3)), tonight=True)
    assert nightly.check_date(str(today + timedelta(days=3))) == str(today + timedelta(days=3))  # a merged night


def _projects_of_one_remote(tmp_path, *names) -> dict[str, Path]:
    """Project checkouts (one empty commit each) sharing the bare remote tmp_path/remote.git as origin."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    repos = {}
    for name in names:
        repos[name] = tmp_path / name
        git(tmp_path, "init", "-q", "-b", "main", str(repos[name]))
        git(repos[name], "commit", "-q", "--allow-empty", "-m", "init")
        git(repos[name], "remote", "add", "origin", str(remote))
    return repos


def test_no_push_tree_adopts_the_remote_and_keeps_its_files(tmp_path):
    # A CI machine fetches the branch but never pushes; the merge job makes the night's commit.
    repos = _projects_of_one_remote(tmp_path, "machine", "merge")
    mine = resultsbranch.ensure_tree(repos["machine"], repos["machine"] / "nightly", "results", "origin")
    _tree_with(mine, {"results/asv/m/a.json": b"night 1", "results/asv/benchmarks.json": b"mine"})
    local = resultsbranch.commit(mine, [".gitignore", "results"], "night 1 m")  # never pushed
    merged = resultsbranch.ensure_tree(repos["merge"], repos["merge"] / "nightly", "results", "origin")
    _tree_with(merged, {"results/asv/m/a.json": b"night 1", "results/asv/benchmarks.json": b"union",
                        "results/asv/n/b.json": b"other machine"})
    resultsbranch.commit(merged, [".gitignore", "results"], "night 1: m, n merged")
    upstream = resultsbranch.push(merged, "results", "origin")
    _tree_with(mine, {"results/asv/m/c.json": b"night 2, not committed"})
    resultsbranch.sync(mine, "results", "origin", adopt=True)
    assert resultsbranch.head(mine) == upstream
    assert (mine / "results/asv/benchmarks.json").read_bytes() == b"union"  # the remote's wins
    assert (mine / "results/asv/n/b.json").read_bytes() == b"other machine"
    assert (mine / "results/asv/m/c.json").read_bytes() == b"night 2, not committed"  # kept
    assert git(mine, "rev-parse", f"refs/nightly-unpushed/{local[:12]}") == local  # kept, not lost



class _Killed(BaseException):
    """Stands for a SIGKILL at one git call: nothing after it runs."""


def _killed_at(monkeypatch, *words, after=False):
    """Make resultsbranch.git raise _Killed at the first call whose arguments start with
    ``words``: before it runs, or ``after`` it."""
    real = resultsbranch.git

    def git_until(cwd, *args, **kw):
        if args[:len(words)] == words:
            monkeypatch.setattr(resultsbranch, "git", real)
            if after:
                real(cwd, *args, **kw)
            raise _Killed(" ".join(args))
        return real(cwd, *args, **kw)

    monkeypatch.setattr(resultsbranch, "git", git_until)


@pytest.mark.parametrize("adopt", [False, True])
@pytest.mark.parametrize("step", [("read-tree",), ("checkout",), ("update-ref", "refs/heads/results")])
def test_a_sync_killed_half_way_never_lets_a_night_delete_the_remotes_files(tmp_path, monkeypatch, adopt, step):
    """A tree unborn (or adopting) takes the remote's branch: killed in the middle, the next
    sync must finish it, so the next night's commit keeps another machine's files."""
    repos = _projects_of_one_remote(tmp_path, "a", "b")
    mine = resultsbranch.ensure_tree(repos["b"], repos["b"] / "nightly", "results", "origin")
    if adopt:
        _tree_with(mine, {"nights/old-b.json": b"b's own"})
        resultsbranch.commit(mine, [".gitignore", "nights"], "b's night, never pushed")
    theirs = resultsbranch.ensure_tree(repos["a"], repos["a"] / "nightly", "results", "origin")
    _tree_with(theirs, {"nights/2026-01-01-box-a.json": b"a's night", "results/asv/box-a/x.json": b"a"})
    resultsbranch.commit(theirs, [".gitignore", "nights", "results"], "night a")
    upstream = resultsbranch.push(theirs, "results", "origin")
    _killed_at(monkeypatch, *step, after=True)  # the branch moved last: killed after, the sync is whole
    with pytest.raises(_Killed):
        resultsbranch.sync(mine, "results", "origin", adopt)
    resultsbranch.sync(mine, "results", "origin", adopt)  # the next run
    assert resultsbranch.head(mine) == upstream
    _tree_with(mine, {"nights/2026-01-02-box-b.json": b"b's night"})
    resultsbranch.commit(mine, ["nights/2026-01-02-box-b.json"], "night b")
    kept = git(mine, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert "nights/2026-01-01-box-a.json" in kept and "results/asv/box-a/x.json" in kept, kept


def test_a_tree_whose_creation_was_killed_is_finished_by_the_next_run(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "commit", "-q", "--allow-empty", "-m", "init")
    _killed_at(monkeypatch, "symbolic-ref")  # after `worktree add --detach`: the tree is on main's commit
    with pytest.raises(_Killed):
        resultsbranch.ensure_tree(repo, repo / "nightly", "results")
    tree = resultsbranch.ensure_tree(repo, repo / "nightly", "results")
    assert git(tree, "symbolic-ref", "HEAD") == "refs/heads/results" and not resultsbranch.born(tree)
    assert resultsbranch.commit(tree, [".gitignore"], "night 1")  # the first night is the branch's root
    assert git(tree, "rev-list", "--count", "HEAD") == "1"


def _killed_checking_out(tmp_path, path: str, call: str) -> None:
    """Run ``call`` (Python, with resultsbranch imported) in a process of its own whose git is
    SIGKILLed, with that whole process, as it checks ``path`` out: a smudge filter kills the
    process group there, as a lost node would, after git wrote the files before it."""
    attrs = tmp_path / "kill-attributes"
    attrs.write_text(f"{path} filter=kill\n")
    config = {"core.attributesFile": str(attrs), "filter.kill.smudge": "kill -KILL 0", "filter.kill.required": "true"}
    env = {**os.environ, "GIT_CONFIG_COUNT": str(len(config))}
    for i, (k, v) in enumerate(config.items()):
        env.update({f"GIT_CONFIG_KEY_{i}": k, f"GIT_CONFIG_VALUE_{i}": v})
    p = subprocess.run([PY, "-c", f"from pathlib import Path\nfrom matmul_drift.jobs import resultsbranch\n{call}"],
                       env=env, capture_output=True, text=True, timeout=60, start_new_session=True)
    assert p.returncode == -signal.SIGKILL, p.stderr


def _remote_with_two_nights(tmp_path) -> tuple[dict[str, Path], str, str]:
    """Projects a and b of one remote; a pushed night 1 (b's tree has it) and night 2 (b's has
    not). Returns the repos and the two commits."""
    repos = _projects_of_one_remote(tmp_path, "a", "b")
    theirs = resultsbranch.ensure_tree(repos["a"], repos["a"] / "nightly", "results", "origin")
    _tree_with(theirs, {"nights/2026-01-01-box-a.json": b"a's night 1", "results/asv/box-a/x.json": b"x 1"})
    resultsbranch.commit(theirs, [".gitignore", "nights", "results"], "night 1")
    first = resultsbranch.push(theirs, "results", "origin")
    resultsbranch.ensure_tree(repos["b"], repos["b"] / "nightly", "results", "origin")
    _tree_with(theirs, {"nights/2026-01-02-box-a.json": b"a's night 2", "results/asv/box-a/x.json": b"x 2",
                        "results/asv/box-a/y.json": b"y 2"})
    resultsbranch.commit(theirs, ["nights", "results"], "night 2")
    return repos, first, resultsbranch.push(theirs, "results", "origin")


def test_a_tree_whose_checkout_was_killed_keeps_every_recorded_file_in_its_next_commit(tmp_path):
    """`git worktree add` killed half-way through its checkout (a tree made again after a CI
    clean) leaves the tree on its branch with no index: every file looked deleted, and the next
    night's commit deleted every other night and machine from the branch (and pushed that)."""
    repos, first, _ = _remote_with_two_nights(tmp_path)
    tree = repos["b"] / "nightly"
    shutil.rmtree(tree)  # the CI clean
    _killed_checking_out(tmp_path, "results/asv/box-a/x.json",
                         f"resultsbranch.ensure_tree(Path({str(repos['b'])!r}), Path({str(tree)!r}), 'results')")
    assert (tree / "nights/2026-01-01-box-a.json").is_file() and not (tree / "results/asv/box-a/x.json").exists()
    # the next run
    assert resultsbranch.ensure_tree(repos["b"], tree, "results") == tree
    assert "finished a checkout that was killed (the tree had no index)" in resultsbranch.repair(tree, "results")
    _tree_with(tree, {"nights/2026-01-03-box-b.json": b"b's night"})
    resultsbranch.commit(tree, ["nights/2026-01-03-box-b.json"], "night b")
    kept = git(tree, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert kept == sorted(git(tree, "ls-tree", "-r", "--name-only", first).split() + ["nights/2026-01-03-box-b.json"])
    assert (tree / "results/asv/box-a/x.json").read_bytes() == b"x 1"  # the checkout is finished
    assert resultsbranch.uncommitted(tree, ["."]) == []


@pytest.mark.parametrize("reason", [None, "initialisation en cours"])
def test_a_tree_whose_checkout_was_killed_and_then_cleaned_is_made_again(tmp_path, reason):
    # The killed `git worktree add` leaves its worktree locked ("initializing", or that word in
    # the locale's language); after the next CI clean, `worktree prune` kept it and every later
    # run failed: "a missing but locked worktree".
    repos, first, _ = _remote_with_two_nights(tmp_path)
    tree = repos["b"] / "nightly"
    shutil.rmtree(tree)
    _killed_checking_out(tmp_path, "results/asv/box-a/x.json",
                         f"resultsbranch.ensure_tree(Path({str(repos['b'])!r}), Path({str(tree)!r}), 'results')")
    (lock,) = (repos["b"] / ".git" / "worktrees").glob("*/locked")
    if reason:  # as git writes it under LANG=fr_FR
        lock.write_text(reason)
    shutil.rmtree(tree)  # the next CI clean
    assert resultsbranch.ensure_tree(repos["b"], tree, "results") == tree
    assert resultsbranch.head(tree) == first and (tree / "results/asv/box-a/x.json").read_bytes() == b"x 1"


def test_a_fast_forward_killed_half_way_is_finished_by_the_next_sync(tmp_path):
    """`git merge --ff-only` killed while writing the remote's files leaves them in the work tree
    with the index and branch as they were: every later sync refused them ("untracked working
    tree files would be overwritten") and no night ran until a hand fix."""
    repos, first, upstream = _remote_with_two_nights(tmp_path)
    tree = repos["b"] / "nightly"
    assert resultsbranch.head(tree) == first
    _tree_with(tree, {"notes/mine.txt": b"b's own, not committed"})
    _killed_checking_out(tmp_path, "results/asv/box-a/y.json",
                         f"resultsbranch.sync(Path({str(tree)!r}), 'results', 'origin')")
    assert (tree / "nights/2026-01-02-box-a.json").is_file() and resultsbranch.head(tree) == first
    assert (tree / "results/asv/box-a/x.json").read_bytes() == b"x 2"
    (tree / "results/asv/box-a/x.json").write_bytes(b"x")  # as if cut short by the kill
    resultsbranch.repair(tree, "results")  # the next run
    resultsbranch.sync(tree, "results", "origin")
    assert resultsbranch.head(tree) == upstream
    for rel in ("nights/2026-01-02-box-a.json", "results/asv/box-a/x.json", "results/asv/box-a/y.json"):
        assert (tree / rel).read_bytes() == git(tree, "cat-file", "blob", f"{upstream}:{rel}").encode()
    assert (tree / "notes/mine.txt").read_bytes() == b"b's own, not committed"
    # what differed from the remote's is kept beside; what the killed merge wrote whole is not
    assert resultsbranch.uncommitted(tree, ["nights", "results"]) == [
        p.relative_to(tree).as_posix() for p in (tree / "results/asv/box-a").glob("x.json.replaced-*")]
    (kept,) = (tree / "results/asv/box-a").glob("x.json.replaced-*")
    assert kept.read_bytes() == b"x"


def test_an_axis_a_killed_run_left_locked_is_built_again(tmp_path):
    tree = tmp_path / "tree"
    path = nightly.axis_repo(tree, "2026-01-03", "results")
    Path(path, "refs/heads/results.lock").write_text("")  # git fast-import killed while updating the ref
    assert nightly.axis_repo(tree, "2026-01-09", "results") == path
    assert git(path, "rev-parse", "refs/heads/results") == axis.commit("2026-01-09")

def _merge_target(tmp_path) -> nightly.Options:
    proj = tmp_path / "proj"
    git(tmp_path, "init", "-q", "-b", "main", str(proj))
    (proj / "asv.conf.json").write_text("{}")
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "p")
    return nightly.Options(machine=None, date="2026-01-05", tree=proj / "nightly", repo=proj, publish=False)


GOOD_NIGHT = {"date": "2026-01-05", "machine": "m", "environment": {}}


def test_a_results_file_asv_left_cut_short_never_reaches_the_tree(tmp_path, monkeypatch):
    """asv killed (or out of disk space) while it writes its results file leaves it cut short
    in staging. It was copied into the tree as the night's result, the night could not read it
    back, and every later run stopped at the same "cannot be read back", --force or not, until
    the file was removed by hand. Now it never reaches the tree, and the next run records."""
    from datetime import datetime, timezone

    import asv_fixtures as F

    from matmul_drift.jobs import asvrun

    o = _merge_target(tmp_path)
    night = nightly.Options(machine="m", date=o.date, tree=o.tree, repo=o.repo, python=PY, publish=False)
    synthetic = F.write_tree(tmp_path / "synthetic", machine="m", n_commits=1, torch_versions=("2.13.0",))
    asv_killed = [True]

    def asv(conf, *args, cwd, env=None, log=None, progress=None, hold=None, follow=None):  # what `asv run` leaves in staging
        if args[0] != "run":
            return 0, []
        staging = Path(json.loads(Path(conf).read_text())["results_dir"])
        point = next(a.split("=", 1)[1] for a in args if a.startswith("--set-commit-hash="))
        shutil.copytree(synthetic.catalog_dir, o.tree / "results/catalog", dirs_exist_ok=True)
        (staging / "m").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(synthetic.asv_dir / "benchmarks.json", staging / "benchmarks.json")
        shutil.copyfile(synthetic.machine_dir / "machine.json", staging / "m/machine.json")
        data = F.load_results(synthetic.files[0])
        data.update(commit_hash=point, date=int(datetime(2026, 1, 5, tzinfo=timezone.utc).timestamp() * 1000))
        text = json.dumps(data)
        (staging / "m" / f"{point[:8]}-{data['env_name']}.json").write_text(text[:len(text) // 2] if asv_killed[0] else text)
        return (-signal.SIGKILL, ["Killed"]) if asv_killed[0] else (0, [])

    monkeypatch.setattr(asvrun, "run", asv)
    monkeypatch.setattr(nightly, "describe_python", lambda python: {"python": "3.11", "device": "cpu", "environment": {}})
    with pytest.raises(nightly.NightError, match=r"^asv's results file \S+ is cut short \(not a JSON object\); nothing of the night"):
        nightly.run_night(night)
    assert asvrun.recorded(o.tree / "results/asv", "m", axis.commit(o.date)) == []
    assert not (o.tree / "nights/2026-01-05-m.json").exists() and not (o.tree / ".nightly/pending.json").exists()
    # its staging is left (the cut-short file in it); named as an earlier second's, so that
    # the next run's own staging, which it removes itself, cannot be taken for it
    (left,) = [p for p in (o.tree / ".nightly/staging").iterdir() if not p.name.endswith(".lock")]
    for p in (left, left.with_name(left.name + ".lock")):
        if p.exists():
            p.rename(p.with_name(p.name.replace(left.name, left.name + "0")))
    asv_killed[0] = False
    report = nightly.run_night(night)  # the next night, with no --force and no hand fix
    assert report.commit and len(report.imported) == 1
    assert list((o.tree / ".nightly/staging").iterdir()) == []  # the failed night's staging went with it
    assert history.read_history(o.tree / "results", machine="m").runs["m"][0].commit == axis.commit(o.date)


@pytest.mark.parametrize("night,why", [
    (b"{}", "do not match its name"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps(GOOD_NIGHT).encode()[:20], "not valid JSON"),
    (json.dumps({**GOOD_NIGHT, "environment": "cpu"}).encode(), "environment is not a JSON object"),
    (json.dumps({**GOOD_NIGHT, "date": "2026-13-01"}).encode(), "do not match its name"),
])
def test_a_malformed_night_file_stops_the_merge_before_anything_is_copied(tmp_path, night, why):
    o = _merge_target(tmp_path)
    src = _tree_with(tmp_path / "src", {"results/asv/m/machine.json": b'{"machine": "m"}',
                                        "results/asv/m/abcd1234-env.json": b"{}",
                                        "nights/2026-01-05-m.json": night})
    with pytest.raises(nightly.UsageError, match=why) as exc:
        merge.run_merge(o, [src])
    assert "\n" not in str(exc.value) and "nothing merged" in str(exc.value)
    assert not (o.tree / "results").exists() and not (o.tree / "nights").exists()


def test_a_merge_clears_what_a_killed_git_left_first(tmp_path):
    o = _merge_target(tmp_path)
    tree = resultsbranch.ensure_tree(o.repo, o.tree, o.branch)
    lock = Path(tree, git(tree, "rev-parse", "--git-path", "index.lock"))
    lock.write_text("")  # a merge killed inside `git commit`
    import asv_fixtures as F

    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode()})
    F.write_tree(src / "results", machine="m", n_commits=1)
    report = merge.run_merge(o, [src])
    assert report.commit and not lock.exists()


@pytest.mark.parametrize("how", ["symlink", "fifo", "top-symlink"])
def test_a_merge_copies_no_symlink_and_no_fifo(tmp_path, how):
    o = _merge_target(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the results branch")
    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode()})
    (src / "results/catalog/env").mkdir(parents=True)
    target = src / "results/catalog/env/0123456789ab.json"
    if how == "symlink":
        target.symlink_to(secret)
    elif how == "fifo":
        os.mkfifo(target)
    else:  # a whole folder of the source: os.walk follows a link it is given
        _tree_with(tmp_path / "elsewhere", {"secret.md": b"not for the results branch"})
        (src / "summaries").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(nightly.UsageError, match="not a regular file" if how == "fifo" else "symlink"):
        merge.run_merge(o, [src])
    assert not (o.tree / "results").exists() and not (o.tree / "summaries").exists()


def test_a_merge_copies_a_night_description_kept_beside_by_force(tmp_path):
    tree = _tree_with(tmp_path / "tree", {})
    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode(),
                                        "nights/2026-01-05-m.json.replaced-20260105T000000Z": b'{"old": 1}'})
    copies, _, conflicts = merge.plan_merge(tree, [src])
    assert sorted(d.name for _, d in copies) == ["2026-01-05-m.json", "2026-01-05-m.json.replaced-20260105T000000Z"]
    assert conflicts == []


def test_a_merge_after_one_killed_mid_copy_names_all_it_commits(tmp_path):
    # Killed after copying, a merge left its files uncommitted; the next merge finds them
    # already there (no copy) and commits them: its message counts and names them all the same.
    o = _merge_target(tmp_path)
    tree = resultsbranch.ensure_tree(o.repo, o.tree, o.branch)
    import asv_fixtures as F

    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode()})
    F.write_tree(src / "results", machine="m", n_commits=1)
    files = [f.relative_to(src) for f in merge._source_files(src) if f.name != "benchmarks.json"]
    for rel in files[: len(files) - 1]:  # all but the last copied, then killed
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, tree / rel)
    report = merge.run_merge(o, [src])
    message = git(tree, "log", "-1", "--format=%B")
    assert report.commit and f"merged {len(files)} files" in message, message
    assert message.startswith("night 2026-01-05: m merged"), message
    assert not resultsbranch.uncommitted(tree, ["results", "nights"])


def test_a_merge_run_again_leaves_its_summary_files_as_they_are(tmp_path):
    # A merge run again on the same nights (a re-queued merge job) rewrote both summary files
    # with the bytes they held: a new inode each, a window for a kill, and nothing for git.
    o = _merge_target(tmp_path)
    import asv_fixtures as F

    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode()})
    F.write_tree(src / "results", machine="m", n_commits=1)
    first = merge.run_merge(o, [src])
    files = (first.summary_md, first.summary_json)
    before = [(p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in files]
    again = merge.run_merge(o, [src])
    assert again.commit is None and (again.summary_md, again.summary_json) == files
    assert [(p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == before


def test_a_second_merge_of_a_night_says_it_replaces_the_summary_whose_first_stays_in_history(tmp_path, capsys):
    # A later machine's night merged on the same date rewrote summaries/DATE-all.* without a word
    o = _merge_target(tmp_path)
    import asv_fixtures as F

    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode()})
    F.write_tree(src / "results", machine="m", n_commits=1)
    first = merge.run_merge(o, [src])
    old = first.summary_md.read_bytes()
    capsys.readouterr()
    late = _tree_with(tmp_path / "late", {"nights/2026-01-05-m2.json": json.dumps({**GOOD_NIGHT, "machine": "m2"}).encode()})
    F.write_tree(late / "results", machine="m2", n_commits=1)
    again = merge.run_merge(o, [late])
    err = capsys.readouterr().err
    for suffix in ("md", "json"):
        assert (f"replacing summaries/2026-01-05-all.{suffix}: 2026-01-05-all was summarised before "
                "(that summary stays in the branch's history)") in err, err
    assert again.commit and again.summary_md.read_bytes() != old
    assert git(o.tree, "show", f"{first.commit}:summaries/2026-01-05-all.md").encode() + b"\n" == old


@pytest.mark.parametrize("entry", [[PY, "-m", "matmul_drift.cli", "nightly"], ["bash", str(Path(__file__).resolve().parents[1] / "scripts" / "nightly.sh")]])
def test_a_merge_whose_stdout_reader_left_is_still_committed(tmp_path, entry):
    # `nightly.sh --merge ... | head`, or a log collector that died: the summary on stdout is a
    # courtesy; the merge (or night) it reports must be recorded all the same.
    o = _merge_target(tmp_path)
    import asv_fixtures as F

    src = _tree_with(tmp_path / "src", {"nights/2026-01-05-m.json": json.dumps(GOOD_NIGHT).encode()})
    F.write_tree(src / "results", machine="m", n_commits=1)
    r, w = os.pipe()
    os.close(r)  # the reader has left before a line is written
    try:
        p = subprocess.run([*entry, "--merge", str(src), "--repo", str(o.repo), "--no-publish",
                            "--date", "2026-01-05"], cwd=o.repo, stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=120, env={**os.environ, "PYTHON": PY})
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and ": error: " not in p.stderr, p.stderr[-2000:]
    tree = o.tree
    assert resultsbranch.born(tree), p.stderr[-2000:]
    assert git(tree, "log", "-1", "--format=%s").startswith("night 2026-01-05: m merged")
    assert not resultsbranch.uncommitted(tree, ["results", "nights", "summaries"])
    assert p.returncode == 141, p.returncode  # as any matmul-drift command whose reader left


@pytest.mark.parametrize("args", [("--merge", ""), ("--merge", "--tree", ""), ("--merge", "--repo", ""),
                                  ("--python", PY, "--machine", "x", "--tree", "")])
def test_an_empty_folder_name_is_refused_not_read_as_the_current_folder(tmp_path, args):
    # `--merge "$ARTIFACTS"` with the variable empty merged the folder it ran in (a checkout's own
    # results/: 154 files committed), as Path("") is "."; --tree and --repo likewise.
    o = _merge_target(tmp_path)
    p = subprocess.run([PY, "-m", "matmul_drift.cli", "nightly", *args, "--no-publish"], cwd=o.repo,
                       capture_output=True, text=True, timeout=120)
    option = [a for a in args if a.startswith("--")][-1]
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"matmul-drift: error: argument {option}: needs a folder, got an empty name"], p.stderr
    assert not (o.repo / "nightly").exists() and git(o.repo, "status", "--porcelain") == ""


# ---------------------------------------------------------------------------- the site in a browser


from browsing import _errors, _serving, _wait  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(world, base URL) with the merged tree's html/ served on 127.0.0.1."""
    world = build_world(tmp_path_factory)
    with _serving(world.tree("m") / "html") as url:
        yield world, url



def test_benchmark_list_and_a_drift_graph_render(browser, served):
    world, url = served
    browser.get(f"{url}/index.html#/summarylist")
    rows = _wait(browser, "return document.querySelectorAll('#summarylist-body tbody tr').length")
    assert rows > 100
    assert "drift.Drift.track_error_u" in browser.find_element("id", "summarylist-body").text
    assert _errors(browser) == []

    h1, h2 = axis.commit("2026-01-01"), axis.commit("2026-01-02")  # asv's points for the two nights
    # asv's parameter values are Python reprs: 'square', quotes included.
    browser.get(f"{url}/index.html#drift.Drift.track_error_u?machine=box-a"
                "&p-case=%27square%27&p-dtype=%27float32%27&p-device=%27cpu%27")
    # The graph is drawn (flot's canvas) with one point per night, at the recorded values,
    # and its commit range runs from the first night to the second.
    _wait(browser, "return document.querySelectorAll('#main-graph canvas.flot-base').length")
    series = _wait(browser, "var p = $('#main-graph').data('plot'); return p && p.getData().map(s => s.data)")
    recorded = [o.value for o in history.read_history(world.tree("m") / "results", machine="box-a").observations()
                if o.benchmark == "drift.Drift.track_error_u" and o.params == {"case": "square", "dtype": "float32",
                                                                              "device": "cpu"}]
    assert len(series) == 1 and [v for _, v in series[0]] == pytest.approx(recorded) and len(recorded) == 2
    assert browser.execute_script("return document.getElementById('range').value") == f"{h1[:8]}..{h2[:8]}"
    assert "error.html" not in browser.current_url  # asv sends a page whose scripts failed there
    assert _errors(browser) == []


def test_drift_page_shows_kernel_names_and_is_linked(browser, served):
    world, url = served
    browser.get(f"{url}/index.html")
    link = _wait(browser, "return document.querySelector('#nav-li-drift a')")
    link.click()
    _wait(browser, f"return location.pathname.endsWith('/{site.PAGE}')")
    kernels = browser.find_element("css selector", "table.kernels").text
    assert "MKL SGEMM(N,N) CNR:OFF NThr:" in kernels and "MKL SGEMM(N,N) CNR:COMPATIBLE NThr:" in kernels
    assert "kernel-id" in kernels and "box-b: square float32 cpu" in kernels
    # the incident's block, its flags folded beneath it until a click opens them
    browser.find_element("css selector", "section.incident details.flags summary").click()
    flags = browser.find_element("css selector", "table.flags").text
    assert "Drift.track_kernel_id" in flags and "CNR:COMPATIBLE" in flags
    assert "box-a" in browser.find_element("id", "nights").find_element("xpath", "following-sibling::ul").text
    # A point's link (asv's show_commit_url + its commit) lands on that night's row.
    main = json.loads((world.tree("m") / "html/index.json").read_text())
    browser.get(f"{url}/{main['show_commit_url']}{axis.commit('2026-01-02')}")
    row = _wait(browser, "return document.getElementById(location.hash.slice(1))")
    assert "2026-01-02" in row.text and "machine box-a" in row.text
    assert _errors(browser) == []


def test_drift_page_leads_with_the_flags_and_folds_the_notes(browser, served):
    """The nightly world's page: the flags before anything else, the notes below them folded,
    and each kernel change listed per case with the ids linked to their names."""
    world, url = served
    browser.get(f"{url}/{site.PAGE}")
    order = browser.execute_script("return [...document.querySelectorAll('h2')].map(h => h.id)")
    assert order[0] == "flags" and order.index("flags") < order.index("nights") < order.index("kernels"), order
    if "notes" in order:  # folded: closed until asked
        assert order.index("notes") == 1
        assert browser.execute_script("return [...document.querySelectorAll('details.notes')].every(d => !d.open)")
    incident = browser.find_element("css selector", "section.incident")
    assert "MKL_CBWR=COMPATIBLE" in incident.text  # the cause, and the repro of the side that set it
    assert browser.execute_script("return [...document.querySelectorAll('details.flags')].every(d => !d.open)")
    incident.find_element("css selector", "details.flags summary").click()
    repro = browser.find_element("css selector", "table.flags").text
    assert "matmul-drift explain --case square --dtype float32 --device cpu" in repro
    changes = browser.find_element("css selector", "table.changes")
    link = changes.find_element("css selector", "a")
    target = link.get_attribute("href").split("#", 1)[1]
    link.click()
    row = _wait(browser, f"return document.getElementById('{target}')")
    assert row.tag_name == "tr" and "MKL" in row.text
    assert _errors(browser) == []
