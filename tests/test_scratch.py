"""The published site is replaced whole, and scratch folders of runs that are gone are removed.

asv publish starts by deleting the folder it is given (asv 0.6.6 commands/publish.py: rmtree
of html_dir, then Benchmarks.load), so a publish that fails, or a run killed while it
publishes, once left a half-written or missing html/ where a whole site had been.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checkout import ROOT

from matmul_drift import asvrun, atomic, mainjob, nightly, site

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


def _asv_publish_that_fails(conf, *args, cwd, env=None, log=None, progress=None, hold=None):
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
    from matmul_drift import site

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
