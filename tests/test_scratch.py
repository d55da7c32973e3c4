"""The published site is replaced whole, and scratch folders of runs that are gone are removed.

asv publish starts by deleting the folder it is given (asv 0.6.6 commands/publish.py: rmtree
of html_dir, then Benchmarks.load), so a publish that fails, or a run killed while it
publishes, once left a half-written or missing html/ where a whole site had been.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from checkout import ROOT

from matmul_drift.jobs import asvrun, mainjob, nightly, site
from matmul_drift.store import atomic

PY = sys.executable


def _old_site(parent: Path) -> Path:
    html = parent / "html"
    (html / "graphs").mkdir(parents=True)
    (html / "index.html").write_text("the old site")
    (html / "graphs" / "g.json").write_text("[1]")
    return html


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


HELD: list[bool] = []


def _asv_publish_that_fails(conf, *args, cwd, env=None, log=None, progress=None, hold=None, follow=None):
    """What `asv publish` does when it fails after its first step: html_dir deleted, part of
    a new site written, a non-zero exit."""
    assert args == ("publish",)
    HELD.append(hold is not None and hold.fileno() is not None)  # asv holds the scratch folder's lock
    html = Path(json.loads(Path(conf).read_text())["html_dir"])
    shutil.rmtree(html, ignore_errors=True)
    html.mkdir(parents=True)
    (html / "index.html").write_text("half a site")
    return 1, ["asv.util.UserError: benchmarks.json is not valid JSON"]


def test_a_failing_asv_publish_of_the_main_job_leaves_the_old_site_whole(tmp_path, monkeypatch):
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "asv.conf.json").write_text('{"matrix": {"req": {"torch": ["2.13.0"]}}}')
    html = _old_site(proj)
    before = _files(html)
    monkeypatch.setattr(asvrun, "run", _asv_publish_that_fails)
    HELD.clear()
    with pytest.raises(mainjob.JobError, match="asv publish failed") as exc:
        mainjob.publish(proj, mainjob.project_config(proj), "m", "0" * 40)
    assert _files(html) == before and str(exc.value).endswith("; the site is left as it was") and HELD == [True]
    assert sorted(p.name for p in proj.iterdir()) == [".asv", "asv.conf.json", "html"]  # nothing left beside it


def test_a_failing_asv_publish_of_the_nightly_leaves_the_old_site_whole(tmp_path, monkeypatch):
    import asv_fixtures as F

    tree = tmp_path / "tree"
    F.write_tree(tree / "results", n_commits=1, torch_versions=("2.13.0",), cases=("square",), dtypes=("float32",))
    html = _old_site(tree)
    before = _files(html)
    monkeypatch.setattr(asvrun, "run", _asv_publish_that_fails)
    HELD.clear()
    with pytest.raises(nightly.NightError, match="asv publish failed"):
        nightly.publish(tree, ROOT, "results")
    assert _files(html) == before and HELD == [True]
    assert sorted(p.name for p in tree.iterdir()) == [".nightly", "html", "results"]


_BUILD_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from matmul_drift.jobs import site

    def build(folder, lock):
        folder.mkdir()
        (folder / "index.html").write_text("half a site")
        os.kill(os.getpid(), signal.SIGKILL)  # a lost node, the OOM killer

    site.replace(Path(sys.argv[1]), build, print)
""")


def test_a_run_killed_while_building_the_site_leaves_the_old_one_and_the_next_clears_up(tmp_path):
    html = _old_site(tmp_path)
    before = _files(html)
    p = subprocess.run([PY, "-c", _BUILD_AND_DIE, str(html)], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert _files(html) == before
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "html")
    assert len(left) == 2 and left[0].startswith(".html.new-") and left[1] == left[0] + ".lock", left

    def failing(folder, lock):
        folder.mkdir()
        raise RuntimeError("the drift page could not be written")

    lines: list[str] = []
    with pytest.raises(RuntimeError):
        site.replace(html, failing, lines.append)
    assert _files(html) == before
    assert lines == [f"recovered: removed {tmp_path / left[0]}, the site a killed run was building"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["html"]

    def whole(folder, lock):
        (folder / "graphs").mkdir(parents=True)
        (folder / "index.html").write_text("the new site")
        return ["nothing from the network"]

    assert site.replace(html, whole, lines.append) == ["nothing from the network"]
    assert _files(html) == {"index.html": "the new site"} and len(lines) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["html"]


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_folder_swaps_the_new_in_and_keeps_the_old_at_its_name(tmp_path, monkeypatch, exchange):
    if not exchange:  # a kernel or file system without RENAME_EXCHANGE: two renames
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    new, dest = tmp_path / "new", tmp_path / "dest"
    for folder, text in ((new, "new"), (dest, "old")):
        folder.mkdir()
        (folder / "f").write_text(text)
    atomic.replace_folder(new, dest)
    assert (dest / "f").read_text() == "new" and (new / "f").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "new"]
    shutil.rmtree(new)
    (tmp_path / "first").mkdir()
    atomic.replace_folder(tmp_path / "first", tmp_path / "none-yet")  # nothing to replace: a rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "none-yet"]


# ---------------------------------------------------------------------------- staging of runs that are gone

_CLAIM = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from matmul_drift.jobs import asvrun
    from matmul_drift.store import scratch

    folder = Path(sys.argv[1])
    lock = scratch.claim(folder)
    (folder / "m").mkdir()
    (folder / "m" / "abcd1234-env.json").write_text("{")  # asv's results, half written
    if sys.argv[2] == "asv":  # an asv that outlives this run: `python -m asv` here is the fake one
        asvrun.run(Path("conf.json"), "run", cwd=Path.cwd(), env={**os.environ, "PYTHONPATH": sys.argv[3]}, hold=lock)
    elif sys.argv[2] == "live":
        print("ready", flush=True)
        sys.stdin.read()
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _killed_run(folder: Path) -> Path:
    """``folder`` claimed (scratch.claim) by a run that was then killed."""
    p = subprocess.run([PY, "-c", _CLAIM, str(folder), "die"], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL and folder.is_dir(), p.stderr
    return folder


def _live_run(folder: Path) -> subprocess.Popen:
    p = subprocess.Popen([PY, "-c", _CLAIM, str(folder), "live"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p


def test_sweep_removes_the_staging_of_a_run_that_is_gone_and_nothing_a_live_one_owns(tmp_path):
    from matmul_drift.store import scratch

    staging = tmp_path / "staging"
    dead = _killed_run(staging / "a")
    live = _live_run(staging / "b")
    kept = staging / "c"
    scratch.keep(kept, scratch.claim(kept))  # kept on purpose: its results are named in a message
    (staging / "d").mkdir()  # made before staging folders had locks: whose it is, nobody knows
    try:
        assert scratch.sweep(staging) == [dead]
        assert sorted(p.name for p in staging.iterdir()) == ["b", "b.lock", "c", "d"]
    finally:
        live.kill()
        live.wait()
    assert scratch.sweep(staging) == [staging / "b"] and sorted(p.name for p in staging.iterdir()) == ["c", "d"]


def test_the_asv_a_killed_run_left_running_keeps_its_staging(tmp_path):
    """A run killed with SIGKILL leaves its asv running, still writing into the staging
    folder; the lock it was handed keeps that folder from the next run's sweep until it exits."""
    from matmul_drift.store import scratch

    fake = tmp_path / "fake"
    (fake / "asv").mkdir(parents=True)
    (fake / "asv" / "__init__.py").write_text("")
    (fake / "asv" / "__main__.py").write_text(
        "import os, sys, time\nopen(os.environ['FAKE_ASV_PID'], 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    folder, pid_file = tmp_path / "staging" / "a", tmp_path / "asv.pid"
    run = subprocess.Popen([PY, "-c", _CLAIM, str(folder), "asv", str(fake)], cwd=tmp_path,
                           env={**os.environ, "FAKE_ASV_PID": str(pid_file)})
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    asv_pid = int(pid_file.read_text())
    try:
        run.kill()  # the run, not its asv
        run.wait()
        assert scratch.sweep(folder.parent) == [] and folder.is_dir()
    finally:
        os.kill(asv_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (removed := scratch.sweep(folder.parent)) and time.monotonic() < deadline:  # until it is gone
        time.sleep(0.05)
    assert removed == [folder] and list(folder.parent.iterdir()) == []


def test_the_main_job_removes_the_staging_of_a_killed_run_with_one_line(tmp_path, monkeypatch, capsys):
    from test_mainjob import _bare_project

    from matmul_drift.cli import main as cli

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    proj = _bare_project(tmp_path, '{"matrix": {"req": {"torch": ["2.13.0"]}}, "environment_type": "virtualenv"}')
    staging = proj / mainjob.STATE / "staging"
    dead = _killed_run(staging / "2.13.0-1")
    live = _live_run(staging / "2.13.0-2")
    seen = []

    def asv(conf, *args, cwd, env=None, log=None, progress=None, hold=None, follow=None):  # records nothing
        seen.append(Path(json.loads(Path(conf).read_text())["results_dir"]))
        return 1, ["no results"]

    monkeypatch.setattr(asvrun, "run", asv)
    try:
        rc = cli.main(["run", "--repo", str(proj), "--no-publish"])
        assert sorted(p.name for p in staging.iterdir()) == ["2.13.0-2", "2.13.0-2.lock"]
    finally:
        live.kill()
        live.wait()
    err = capsys.readouterr().err
    assert rc == 1 and seen and not seen[0].exists() and not dead.exists(), err
    assert [ln for ln in err.splitlines() if "removed" in ln] == [
        "matmul-drift run: recovered: removed .asv/main-job/staging/2.13.0-1, the staging folder of a run that was killed"]
