"""Hostile input that once ended in a traceback: commit dates datetime cannot hold, names
that are not UTF-8 (folders, files, JSON escapes, git's output), and a --tree that is a file.
Each now ends in a warning or a one-line error."""

from __future__ import annotations

import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import asv_fixtures as F
import pytest
from checkout import git

from matmul_drift.cli.main import main as cli_main
from matmul_drift.jobs import resultsbranch
from matmul_drift.read import history

LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant datetime holds


def _writable(texts) -> bool:
    """Whether every text encodes as UTF-8 (a lone surrogate does not)."""
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---------------------------------------------------------------------------- commit dates


@pytest.mark.parametrize("date", [3e14, 10**20, -10**20, -1, 1.5, LAST_MS + 1,
                                  True, "2025-01-01", None, math.nan])
def test_a_date_datetime_cannot_hold_is_a_skipped_file(capsys, tmp_path, date):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    bad = F.write_results(tree.machine_dir, F.derive(F.load_results(tree.file(1, 0)), "f" * 40, date))
    h = history.read_history(tree.root)
    warned = [w for w in h.warnings if str(bad) in w]
    assert len(warned) == 1 and re.fullmatch(
        rf"skipping {re.escape(str(bad))}: (no commit date|commit date .+ is not whole ms from 1970 to 9999)",
        warned[0]), h.warnings
    assert all(r.path != bad for runs in h.runs.values() for r in runs)
    assert cli_main(["summary", str(tree.root), "--format", "github"]) == 0
    assert f"warning: skipping {bad}" in capsys.readouterr().err


@pytest.mark.parametrize("date", [0, LAST_MS, float(F.START_MS + 3 * F.DAY_MS)])
def test_dates_from_1970_to_9999_are_read(tmp_path, date):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    F.write_results(tree.machine_dir, F.derive(F.load_results(tree.file(1, 0)), "f" * 40, date))
    h = history.read_history(tree.root)
    assert h.warnings == [] and int(date) in [r.date for r in h.runs[tree.machine]]
    assert datetime.fromtimestamp(LAST_MS / 1000, timezone.utc).year == 9999  # as the nightly shows it


# ---------------------------------------------------------------------------- names not UTF-8


def test_a_machine_folder_named_in_other_bytes_is_skipped_and_named_safely(capsys, tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    odd = os.path.join(os.fsencode(tree.asv_dir), b"bad\xff")
    os.mkdir(odd)
    Path(os.fsdecode(odd), "x.json").write_text("{}")
    h = history.read_history(tree.root)
    assert f"skipping results in {tree.asv_dir}/bad\\xff: the folder's name is not UTF-8" in h.warnings
    assert _writable(h.warnings) and list(h.runs) == [tree.machine]
    out = tmp_path / "out.md"
    assert cli_main(["summary", str(tree.root), "--format", "github", "--output", str(out)]) == 0
    assert "bad\\\\xff" in out.read_text(encoding="utf-8") and "Traceback" not in capsys.readouterr().err


def test_a_results_file_named_in_other_bytes_is_skipped_and_named_safely(tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    odd = os.path.join(os.fsencode(tree.machine_dir), b"x\xff.json")
    Path(os.fsdecode(odd)).write_text(tree.file(1, 0).read_text())
    h = history.read_history(tree.root)
    assert f"skipping {tree.machine_dir}/x\\xff.json: the file's name is not UTF-8" in h.warnings
    assert _writable(h.warnings) and len(h.runs[tree.machine]) == len(tree.files)


@pytest.mark.parametrize("fmt", ["plain", "github", "json"])
def test_a_lone_surrogate_in_a_results_file_is_escaped_in_the_report(capsys, tmp_path, fmt):
    # machine.json and the results files name the machine "m\udcff", a JSON escape; error_u
    # of square float32 (combination 1) grows at the second commit, so the report names it.
    tree = F.write_tree(tmp_path / "results", machine="m\udcff", n_commits=2,
                        adjust=lambda ci, ei, data: ci and F.set_value(data, F.ERROR_U, 1, 50.0))
    tree.machine_dir.rename(tree.asv_dir / "m")  # a folder name that is UTF-8
    out = tmp_path / "out"
    assert cli_main(["summary", str(tree.root), "--format", fmt, "--output", str(out)]) == 1
    text = out.read_text(encoding="utf-8")
    assert re.search(r"m(\\)?\\udcff", text) and "Traceback" not in capsys.readouterr().err
    if fmt == "json":  # the same data reads back
        assert json.loads(text)["machines"] == ["m\udcff"]


def test_warnings_on_stderr_are_one_line_each_and_control_free(capsys, tmp_path):
    # An env name from a results file and a results file's name, each holding a newline, an
    # escape sequence and a bidi control, reached stderr as they were: a warning broke into a
    # forged "matmul-drift summary: no changes" line and ESC[2J cleared the terminal.
    evil = "env\x1b[2J\nmatmul-drift summary: no changes\u202e"

    def adjust(ci, ei, data):
        if ei == 0:
            data["env_name"] = evil
        if ci == 1:  # the kernel-ids measure square only: a warning names the pair's env names
            row = data["results"][F.KERNEL]
            row[F.COL["params"]] = [["'square'"], *row[F.COL["params"]][1:]]
            row[F.COL["result"]] = row[F.COL["result"]][:len(F.DTYPES)]

    tree = F.write_tree(tmp_path / "results", n_commits=2, adjust=adjust)
    (tree.machine_dir / "bad\nname\x1b[31m.json").write_text("{")
    assert cli_main(["summary", str(tree.root)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(ln.startswith("matmul-drift summary: warning: ") for ln in lines), lines
    assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e]", "".join(lines)), lines
    assert sum("env\\u001b[2J\\u000amatmul-drift summary: no changes\\u202e" in ln for ln in lines) == 1, lines
    assert sum("bad\\u000aname\\u001b[31m.json" in ln for ln in lines) == 1, lines


# ---------------------------------------------------------------------------- git's output


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "commit", "-q", "--allow-empty", "-m", "init")
    return repo


def test_git_output_that_is_not_utf8_is_read_not_a_traceback(repo):
    assert resultsbranch.git(repo, "check-ref-format", "--branch", "a\udcffb") == "a\ufffdb"
    with pytest.raises(resultsbranch.GitError) as exc:
        resultsbranch.git(repo, "remote", "get-url", "a\udcffb")
    assert "\n" not in str(exc.value) and "a\ufffdb" in str(exc.value)
    Path(os.fsdecode(os.path.join(os.fsencode(repo), b"f\xff"))).write_text("x")
    assert resultsbranch.uncommitted(repo, ["."]) == ["f\ufffd"]


# ---------------------------------------------------------------------------- --tree


def test_a_tree_that_is_a_file_is_a_usage_error(capsys, repo):
    (repo / "asv.conf.json").write_text("{}")
    afile = repo / "afile"
    afile.write_text("x")
    with pytest.raises(resultsbranch.GitError, match=re.escape(f"--tree {afile} is a file, not a folder")):
        resultsbranch.ensure_tree(repo, afile, "results")
    assert cli_main(["nightly", "--merge", "--repo", str(repo), "--tree", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"matmul-drift nightly: error: --tree {afile} is a file, not a folder"], err


@pytest.mark.parametrize("text,why", [('{"torch": {"version": "\\ud800"}}', "unreadable"),
                                      ('{"device": "cpu", "full": ["evil"]}', "does not match its id")])
def test_a_catalog_entry_that_is_not_its_id_is_missing_not_a_traceback(tmp_path, text, why):
    from matmul_drift.store import catalog

    ident = catalog.store(tmp_path, "env", {"torch": {"version": "2.13.0"}})
    catalog.entry_path(tmp_path, "env", ident).write_text(text)
    with pytest.raises(catalog.MissingEntry, match=why):
        catalog.load(tmp_path, "env", ident)


def test_the_nightly_and_main_job_log_lines_are_one_line_whatever_a_name_holds(capsys):
    # their warnings name results files and environments, which may hold a newline or ESC
    from matmul_drift.jobs import mainjob, nightly

    for say in (nightly.log, mainjob.log):
        say("warning: existing-py\n matmul-drift nightly: no changes\x1b[2J\u202e")
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "\x1b" not in err and "\u202e" not in err, err
        assert "\\u000a" in err and "\\u001b[2J" in err
