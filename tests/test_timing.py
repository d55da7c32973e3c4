"""Timing flags rest on evidence across runs, never on one run's own intervals: a suspect (ratio
beyond the factor, 99% CIs apart) becomes a flag only when a re-measurement (results/confirm)
confirms it, or the next run shows it again with its settings unchanged; the same environment
on both sides, or two builds that differed the same way before, is never one. The re-measurement
itself: each side's settings reproduced in fresh processes, interleaved."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

import asv_fixtures as F
import pytest

from matmul_drift.jobs import confirm as job
from matmul_drift.probes import confirm
from matmul_drift.read import flags, history, summary

I = 1  # combination 1: square float32 cpu (write_tree's order: case, dtype, device)




def _summary(tree: F.Tree, **options) -> summary.Summary:
    return summary.summarise(history.read_history(tree.root), summary.Options(**options))


def _timing(s: summary.Summary) -> list[flags.Flag]:
    return [f for f in s.flags if f.kind == "timing"]


def test_the_combination_is_square_float32_on_the_cpu(tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=1)
    assert tree.combos[I] == {"case": "square", "dtype": "float32", "device": "cpu"}


def test_a_slower_run_in_one_recorded_environment_is_never_a_flag(tmp_path):
    """The busy-machine run: 2x slower at the second commit, the same torch, libraries and settings."""
    tree = F.write_tree(tmp_path / "results", n_commits=3, torch_versions=("2.13.0",),
                        adjust=lambda ci, ei, d: ci >= 1 and F.scale_time(d, I, 2.0))
    s = _summary(tree)
    assert not _timing(s)
    # both busy runs against the recent baseline (commit 0): neither is a flag
    assert s.timing_notes == ["synthetic: 2 timing differences in one recorded environment (this machine's own "
                              "variation)"]
    assert not _timing(_summary(tree, timing="suspects"))  # nor worth re-measuring


def _threads_from(ci0: int, factors: dict[int, float], cat: Path):
    """adjust(): from commit ``ci0`` on, the run records threads=1 (its env-id changes), and
    combination I takes ``factors[ci]`` times its time."""
    def adjust(ci, ei, d):
        if ci >= ci0:
            F.set_env(d, cat, "2.13.0", threads=1, env_vars={"OMP_NUM_THREADS": "1"})
        if ci in factors:
            F.scale_time(d, I, factors[ci])
    return adjust


def test_a_change_of_settings_that_holds_at_the_next_run_is_a_flag_with_its_evidence(tmp_path):
    cat = tmp_path / "results" / "catalog"
    tree = F.write_tree(tmp_path / "results", n_commits=3, torch_versions=("2.13.0",),
                        adjust=_threads_from(1, {1: 1.9, 2: 1.8}, cat))
    (f,) = _timing(_summary(tree))
    assert (f.before.commit, f.after.commit) == (tree.commits[0], tree.commits[1])
    assert re.match(rf"1\.9\d?x slower, held at the next run: 1\.8\d?x slower at {tree.commits[2][:8]}; "
                    r"as recorded [\d.]+ ms -> [\d.]+ ms \(1\.9\d?x slower\)$", f.detail), f.detail
    assert "threads: 2 -> 1" in f.attribution and "env_vars.OMP_NUM_THREADS: none -> 1" in f.attribution
    assert f.fails(summary.DEFAULT_FAIL_ON) and f.direction == "slower"  # a slowdown on evidence fails


def test_a_change_gone_at_the_next_run_is_transient_and_one_at_the_latest_run_waits(tmp_path):
    cat = tmp_path / "results" / "catalog"
    tree = F.write_tree(tmp_path / "results", n_commits=3, torch_versions=("2.13.0",),
                        adjust=_threads_from(1, {1: 1.9}, cat))
    s = _summary(tree)
    assert not _timing(s) and s.timing_notes == [  # and back, with the same settings: the machine's own
        "synthetic: 1 timing difference gone at the next run (transient)",
        "synthetic: 1 timing difference in one recorded environment (this machine's own variation)"]
    tree = F.write_tree(tmp_path / "latest" / "results", n_commits=2, torch_versions=("2.13.0",),
                        adjust=_threads_from(1, {1: 1.9}, tmp_path / "latest" / "results" / "catalog"))
    s = _summary(tree)
    assert not _timing(s) and "suspected at the latest run, not confirmed yet" in s.timing_notes[0]
    (f,) = _timing(_summary(tree, timing="suspects"))  # what the main job re-measures
    assert re.match(r"1\.9\d?x slower, suspected \(99% CIs apart\); as recorded", f.detail), f.detail
    assert not f.fails(summary.DEFAULT_FAIL_ON)  # a suspect is worth re-measuring, not an alarm


def _record(tree: F.Tree, verdict: str, ratios: list[float]) -> Path:
    """A re-measurement of the pair (commit 0 -> commit 1, the first env) of combination I, as
    jobs/confirm.py writes it."""
    check = {"benchmark": F.TIME, "params": tree.combos[I], "factor": 1.1, "slower": True, "verdict": verdict,
             "ratios": ratios, "rounds": len(ratios),
             "before": {"commit": tree.commits[0], "env": tree.env_names[0]},
             "after": {"commit": tree.commits[1], "env": tree.env_names[0]}}
    path = tree.root / "confirm" / tree.machine / f"{tree.commits[1][:8]}-x.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "machine": tree.machine, "checks": [check]}))
    return path


def test_a_confirmed_re_measurement_is_the_evidence_and_a_refuted_one_is_a_note(tmp_path):
    cat = tmp_path / "results" / "catalog"
    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",),
                        adjust=_threads_from(1, {1: 1.9}, cat))
    _record(tree, "confirmed", [1.92, 1.85, 1.97])
    (f,) = _timing(_summary(tree))
    assert f.detail.startswith("1.92x slower, re-measured 3 times interleaved (range 1.85-1.97); as recorded "), \
        f.detail
    assert not _timing(_summary(tree, timing="suspects"))  # judged already: not measured again
    _record(tree, "refuted", [1.02, 0.99, 1.3])
    s = _summary(tree)
    assert not _timing(s) and s.timing_notes == [
        "synthetic: 1 timing difference re-measured and not confirmed (noise)"]


def test_two_builds_that_differ_as_they_did_before_are_not_a_change(tmp_path):
    """torch 2.14.1 1.5x slower than 2.13.0 at every commit: a flag at the first, held at the
    second (the evidence), and at the second and third, as before: notes."""
    tree = F.write_tree(tmp_path / "results", n_commits=3, adjust=lambda ci, ei, d: ei == 1 and F.scale_time(d, I, 1.5))
    s = _summary(tree)
    (f,) = _timing(s)
    assert (f.across, f.before.env, f.after.env, f.after.commit) == ("envs", *tree.env_names, tree.commits[0])
    assert re.match(rf"1\.5\d?x slower, held at the next commit: 1\.[45]\d?x slower at {tree.commits[1][:8]}; ",
                    f.detail), f.detail
    assert s.timing_notes == ["synthetic: 2 timing differences between two builds as at the commit before (not a "
                              "change)"]
    assert not _timing(_summary(tree, at=tree.commits[2], timing="suspects"))  # nothing to re-measure


def _envs_record(tree: F.Tree, ci: int, ratios: list[float]) -> None:
    """A confirmed re-measurement of the builds' pair at commit ``ci`` (env 0 -> env 1), combination I."""
    check = {"benchmark": F.TIME, "params": tree.combos[I], "factor": 1.1, "slower": True, "verdict": "confirmed",
             "ratios": ratios, "rounds": len(ratios),
             "before": {"commit": tree.commits[ci], "env": tree.env_names[0]},
             "after": {"commit": tree.commits[ci], "env": tree.env_names[1]}}
    path = tree.root / "confirm" / tree.machine / f"{tree.commits[ci][:8]}-x.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "machine": tree.machine, "checks": [check]}))


def test_two_unchanged_builds_that_part_under_load_are_the_machine_not_torch(tmp_path):
    """The busy-core run: at the second commit torch 2.14.1 reads 2.1x slower than 2.13.0, and a
    re-measurement under the same load confirms it (one build bears a busy core worse), though
    neither build changed since the first commit, where they did not differ: a note, not a flag.
    Where 2.14.1's environment did change (another MKL_CBWR), the same evidence is a flag."""
    adjust = lambda ci, ei, d: ci == 1 and ei == 1 and F.scale_time(d, I, 2.1)  # noqa: E731
    tree = F.write_tree(tmp_path / "results", n_commits=2, adjust=adjust)
    _envs_record(tree, 1, [1.31, 2.37, 2.05])
    s = _summary(tree)
    assert not _timing(s), [f.detail for f in _timing(s)]
    assert s.timing_notes == [  # 2.14.1 across the commits too: one environment
        "synthetic: 1 timing difference in one recorded environment (this machine's own variation)",
        "synthetic: 1 timing difference between two builds that did not change since the commit before, where "
        "they did not differ (this machine's conditions)"]
    assert not _timing(_summary(tree, timing="suspects"))  # nothing for the main job to re-measure

    cat = tmp_path / "changed" / "results" / "catalog"

    def changed(ci, ei, d):
        if ci == 1 and ei == 1:
            F.set_env(d, cat, "2.14.1", env_vars={"MKL_CBWR": "AVX2"})
            F.scale_time(d, I, 2.1)
    tree = F.write_tree(tmp_path / "changed" / "results", n_commits=2, adjust=changed)
    _envs_record(tree, 1, [1.31, 2.37, 2.05])
    (f,) = _timing(_summary(tree))
    assert (f.across, f.after.commit) == ("envs", tree.commits[1])
    assert f.detail.startswith("2.05x slower, re-measured 3 times interleaved (range 1.31-2.37); "), f.detail


# ---------------------------------------------------------------------------- the re-measurement


def test_verdict_needs_every_round_beyond_the_factor_in_the_suspected_direction():
    s = confirm.Setting(sys.executable)
    c = confirm.Check("square", "float32", s, s, slower=True, factor=1.1)
    c.seconds = {"before": [1.0, 1.0, 1.0], "after": [1.9, 1.8, 1.95]}
    assert confirm.verdict(c) == {"verdict": "confirmed", "direction": "slower", "ratios": [1.9, 1.8, 1.95], "rounds": 3}
    c.seconds["after"] = [1.9, 1.05, 1.95]  # one round within the factor: load, not the change
    assert confirm.verdict(c)["verdict"] == "refuted"
    c.seconds["after"] = [1.9, 0.5, 1.95]  # rounds that disagree in direction
    assert confirm.verdict(c)["verdict"] == "refuted"
    # seen: a side recorded under load read 1.1x faster; measured now, 1.73x slower: the change is real
    c.seconds["after"] = [1.73, 1.67, 1.92]
    assert confirm.verdict(c)["verdict"] == "confirmed"
    c.slower, c.seconds["after"] = True, [0.5, 0.6, 0.55]  # faster than the suspect said
    assert confirm.verdict(c)["direction"] == "faster"
    c.seconds["after"] = [0.5, None, 0.55]  # a process gave nothing
    assert confirm.verdict(c)["verdict"] == "not measured"


def test_each_side_runs_with_its_own_recorded_settings_in_fresh_processes(monkeypatch):
    """threads and route variables as each side recorded them; a route variable of this process
    that a side did not record is not passed on."""
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    before = confirm.Setting(sys.executable, threads=1, env_vars=(("ONEDNN_MAX_CPU_ISA", "AVX2"),))
    after = confirm.Setting(sys.executable, threads=2)
    assert before.environ(dict(os.environ)).get("MKL_CBWR") is None
    assert before.environ(dict(os.environ))["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    calls = []
    real = confirm._measure
    monkeypatch.setattr(confirm, "_measure", lambda s, cells, base: calls.append(s) or real(s, cells, base))
    (rec,) = confirm.run([confirm.Check("square", "float32", before, after, slower=True, factor=1.1)], rounds=2)
    assert calls == [before, after, after, before]  # interleaved, the order turned each round
    assert rec["threads"] == {"before": 1, "after": 2}
    assert len(rec["seconds"]["before"]) == 2 and all(x > 0 for x in rec["seconds"]["before"] + rec["seconds"]["after"])
    assert rec["verdict"] in ("confirmed", "refuted") and len(rec["ratios"]) == 2


def test_a_side_whose_python_is_gone_is_not_measured():
    gone = confirm.Setting("/nonexistent/bin/python")
    (rec,) = confirm.run([confirm.Check("square", "float32", gone, gone, slower=True, factor=1.1)], rounds=1)
    assert rec["verdict"] == "not measured" and "/nonexistent/bin/python" in rec["errors"][0]


def test_the_main_job_re_measures_what_its_run_suspects_and_keeps_the_verdict(tmp_path):
    """jobs/confirm.run on a results tree whose last run changed threads: the suspect is timed
    again (square float32, this machine, both sides in this Python standing in for asv's
    virtualenvs), the record lands under results/confirm/ beside the others, and the summary
    takes its verdict: a flag where it confirmed the change, a note where it did not."""
    repo = tmp_path / "repo"
    cat = repo / "results" / "catalog"
    tree = F.write_tree(repo / "results", n_commits=2, torch_versions=("2.13.0",), adjust=_threads_from(1, {1: 1.9}, cat))
    env = repo / ".asv" / "env" / hashlib.md5(tree.env_names[0].encode()).hexdigest() / "bin"
    env.mkdir(parents=True)
    (env / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # a venv's python, as asv makes one
    (env / "python").chmod(0o755)
    lines = []
    hist = history.read_history(tree.root)
    path = job.run(repo, {}, tree.machine, tree.commits[1], hist, lines.append)
    assert path.parent == repo / "results" / "confirm" / tree.machine and path.name.startswith(tree.commits[1][:8])
    doc = json.loads(path.read_text())
    (check,) = doc["checks"]
    assert check["params"] == tree.combos[I] and check["before"]["threads"] == 2 and check["after"]["threads"] == 1
    assert check["after"]["env_vars"] == {"OMP_NUM_THREADS": "1"} and check["threads"] == {"before": 2, "after": 1}
    assert lines[0].startswith("confirming 1 suspected timing change (square float32): 3 rounds")
    s = _summary(tree)
    flagged = bool(_timing(s))
    assert flagged == (check["verdict"] == "confirmed"), (check, s.timing_notes)
    again = job.run(repo, {}, tree.machine, tree.commits[1], history.read_history(tree.root), lines.append)
    assert again is None and path.exists()  # judged: nothing more to measure, nothing rewritten


@pytest.mark.parametrize("ratio", [math.inf, 0.0])
def test_an_extreme_ratio_is_judged_without_a_warning(tmp_path, ratio):
    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",))
    assert summary.Judge(history.read_history(tree.root), summary.Options())._beyond(ratio, True) is math.isinf(ratio)
