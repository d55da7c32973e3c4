"""One alarm per cause: the flags of a night grouped into incidents, each with its cause, its
verdict, its cells and a repro per side; severity from what users live with (the output bits);
a time judged against its build's recent history. Synthetic asv trees (asv_fixtures)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import asv_fixtures as F
import pytest

from matmul_drift.cli.main import main as cli_main
from matmul_drift.read import history, render, summary
from matmul_drift.read.incidents import cause_line, ordered
from matmul_drift.store import catalog

SQUARE32, SQUARE64, TALL32 = 1, 0, 7  # write_tree's order: case, dtype, device




def _one_thread(data: dict, cat, torch: str) -> None:
    F.set_env(data, cat, torch, threads=1, env_vars={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def _renamed(data: dict, cat, i: int) -> None:
    """Combination ``i`` ran under another kernel name (MKL's NThr), the same bits."""
    kid = catalog.store(cat, "kernels", {"device": "cpu", "full": ["aten::matmul", "aten::mm",
                                                                    f"MKL SGEMM(N,N) CNR:OFF NThr:1 #{i}"]})
    F.set_value(data, F.KERNEL, i, kid)


def _three_nights(root, bits=True):
    """A; B, busy (every time 3x, the same environment); C, one thread: square float32 and
    float64 1.6x slower than A (but faster than B), two kernels renamed with the same bits."""
    cat = root / "catalog"

    def adjust(ci, ei, data):
        torch = ("2.13.0", "2.14.1")[ei]
        if ci == 1:
            for i in range(len(data["results"][F.TIME][F.COL["result"]])):
                if data["results"][F.TIME][F.COL["result"]][i] == data["results"][F.TIME][F.COL["result"]][i]:
                    F.scale_time(data, i, 3.0)
        if ci == 2:
            _one_thread(data, cat, torch)
            for i in (SQUARE32, SQUARE64):
                F.scale_time(data, i, 1.6)
                _renamed(data, cat, i)

    return F.write_tree(root, n_commits=3, adjust=adjust, bits=bits)


def _confirm(tree: F.Tree, ratios: list[float], i: int = SQUARE32, ei: int = 0) -> None:
    """A re-measurement of night C against night B (combination ``i``, build ``ei``), as
    jobs/confirm.py writes it, "slower" in every round."""
    check = {"benchmark": F.TIME, "params": tree.combos[i], "factor": 1.1, "slower": True,
             "verdict": "confirmed", "direction": "slower", "ratios": ratios, "rounds": len(ratios),
             "before": {"commit": tree.commits[1], "env": tree.env_names[ei]},
             "after": {"commit": tree.commits[2], "env": tree.env_names[ei]}}
    path = tree.root / "confirm" / tree.machine / f"{tree.commits[2][:8]}-{i}-{ei}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "machine": tree.machine, "checks": [check]}))


def _summary(tree, **kw) -> summary.Summary:
    return summary.summarise(history.read_history(tree.root), summary.Options(**kw))


def test_the_busy_night_raises_nothing_and_the_one_thread_night_one_incident(tmp_path):
    tree = _three_nights(tmp_path / "results")
    busy = _summary(tree, at=tree.commits[1])
    assert busy.flags == [] and busy.incidents == []
    assert any("in one recorded environment" in n for n in busy.timing_notes)

    # Before any re-measurement, the one-thread night's slowdown is a suspect against night A
    # (the faster of A and B), though its recorded times are below the busy night's.
    suspects = [f for f in _summary(tree, at=tree.commits[2], timing="suspects").flags if f.kind == "timing"]
    assert {(f.params["case"], f.params["dtype"], f.direction) for f in suspects} == {
        ("square", "float32", "slower"), ("square", "float64", "slower")}
    assert all(f.after.value < f.before.value for f in suspects)  # as recorded: "faster" than B
    assert all(f.benign == "not confirmed yet" for f in suspects)

    _confirm(tree, [1.63, 1.14, 1.6])
    s = _summary(tree, at=tree.commits[2])
    (inc,) = s.incidents  # both builds' flags: one cause
    assert inc.cause == f"threads 2 -> 1 (MKL_NUM_THREADS, OMP_NUM_THREADS) at {tree.commits[2][:8]}"
    assert {f.after.torch for f in inc.flags} == {"2.13.0+cpu", "2.14.1+cpu"}
    assert inc.verdict()[:3] == ["slower (square float32)", "output bits unchanged", "accuracy the same"]
    assert "kernels renamed, same bits (square float64, square float32)" in inc.verdict()
    assert inc.failing(summary.DEFAULT_FAIL_ON)  # the confirmed slowdown
    (timing,) = [f for f in inc.flags if f.kind == "timing"]
    assert timing.detail.startswith("1.6x slower, re-measured 3 times interleaved (range 1.14-1.63); as recorded ")
    assert re.search(r"\(1\.8\d?x faster\), against [\d.]+ ms at \w{8}, the faster of 2 runs", timing.detail)
    kernels = [f for f in inc.flags if f.kind == "kernel"]
    assert len(kernels) == 4 and all(f.benign == "same output bits" and not f.fails(summary.DEFAULT_FAIL_ON)
                                     for f in kernels)
    assert inc.notes == ["4 kernel changes with the same output bits: renamed, nothing computed changed"]


def test_renames_with_the_same_bits_alone_do_not_fail(tmp_path, capsys):
    tree = _three_nights(tmp_path / "results")  # no re-measurement: the slowdown waits
    assert cli_main(["summary", str(tree.root), "--at", tree.commits[2][:8]]) == 0
    out = capsys.readouterr().out
    assert out.startswith("matmul-drift summary: 1 incident (0 failing): 4 flags, none failing")
    assert "== incident 1 (informational): threads 2 -> 1" in out


def test_results_without_the_digest_fail_on_a_kernel_change_as_before(tmp_path, capsys):
    tree = _three_nights(tmp_path / "results", bits=False)
    s = _summary(tree, at=tree.commits[2])
    (inc,) = s.incidents
    assert inc.failing(summary.DEFAULT_FAIL_ON) and "output bits not recorded on both sides" in inc.verdict()
    assert [n for n in s.bits_notes] == [
        f"output bits: the results at {tree.commits[1][:8]} and 1 more record no digest (bits-id); their bits "
        "are judged through kernels, orders and drifts, as before"]


def test_bits_that_change_under_the_same_kernel_names_fail_and_name_the_part(tmp_path):
    cat = tmp_path / "results" / "catalog"

    def adjust(ci, ei, data):
        if ci == 1 and ei == 0:
            F.set_value(data, F.BITS, TALL32, F.bits_id(cat, "tall float32 cpu", moved=("slice_n=63",)))

    tree = F.write_tree(tmp_path / "results", n_commits=2, adjust=adjust, bits=True)
    s = _summary(tree, across="commits")
    (f,) = s.flags
    assert (f.kind, f.params["case"], f.params["dtype"]) == ("bits", "tall", "float32")
    assert f.detail == "output bits changed: slice_n=63; unchanged: full" and f.fails(summary.DEFAULT_FAIL_ON)
    (inc,) = s.incidents  # one build changed at one commit, nothing recorded differs
    assert inc.cause == f"no recorded difference between the two runs at {tree.commits[1][:8]}"
    assert inc.verdict() == ["output bits changed (tall float32)", "accuracy the same"]


def test_a_torch_build_pair_with_changes_is_one_incident_naming_its_libraries(tmp_path):
    cat = tmp_path / "results" / "catalog"
    newer = {**F.env_entry("2.14.1"), "libs": {"mkl": "2024.2", "onednn": "3.13"}}

    def adjust(ci, ei, data):
        if ei == 1:
            env = catalog.store(cat, "env", newer)
            row = data["results"][F.ENV]
            row[F.COL["result"]] = [v if v != v else env for v in row[F.COL["result"]]]
            for i in (SQUARE32, TALL32):
                F.set_value(data, F.BITS, i, F.bits_id(cat, f"{i}", moved=("full",)))
                F.set_value(data, F.ERROR_U, i, 9.0)

    tree = F.write_tree(tmp_path / "results", n_commits=1, adjust=adjust, bits=True)
    (inc,) = _summary(tree).incidents
    assert inc.cause == f"torch 2.13.0+cpu -> 2.14.1+cpu: oneDNN 3.12 -> 3.13, MKL unchanged at {tree.commits[0][:8]}"
    assert inc.verdict() == ["output bits changed (square float32, tall float32)",
                             "accuracy worse (square float32, tall float32, up to 150x)"]
    heads, rows = render.cell_table(inc)
    assert heads == ["case", "dtype", "device", "build", "bits", "accuracy"]
    assert [r[0] for r in rows] == ["square", "tall"] and rows[0][4] == "changed"


def test_an_undetermined_cause_stays_apart_from_the_others(tmp_path):
    cat = tmp_path / "results" / "catalog"

    def adjust(ci, ei, data):
        if ci == 1:
            F.set_value(data, F.ERROR_U, SQUARE32, 50.0)  # nothing recorded differs
            if ei == 1:
                _one_thread(data, cat, "2.14.1")
                F.set_value(data, F.ERROR_U, TALL32, 50.0)

    tree = F.write_tree(tmp_path / "results", n_commits=2, adjust=adjust)
    incs = _summary(tree, across="commits").incidents
    causes = sorted(i.cause.split(" at ")[0] for i in incs)
    assert causes == ["no recorded difference between the two runs", "threads 2 -> 1 (MKL_NUM_THREADS, OMP_NUM_THREADS)"]
    alone = next(i for i in incs if i.cause.startswith("no recorded"))
    assert [f.after.torch for f in alone.flags] == ["2.13.0+cpu"]


def test_each_repro_sets_its_sides_settings(tmp_path):
    tree = _three_nights(tmp_path / "results")
    (inc,) = _summary(tree, at=tree.commits[2]).incidents
    before, after = (r["command"] for r in inc.repros)
    assert before == ("env -u MKL_NUM_THREADS OMP_NUM_THREADS=2 matmul-drift explain --case square --dtype float64 "
                      "--device cpu")
    assert after == "MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 matmul-drift explain --case square --dtype float64 --device cpu"
    # Pasted into a shell, each side's command sees that side's settings, whatever the caller's.
    probe = (f"{sys.executable} -c \"import os; print(os.environ.get('MKL_NUM_THREADS'), "
             "os.environ.get('OMP_NUM_THREADS'))\"")
    caller = {**os.environ, "MKL_NUM_THREADS": "7", "OMP_NUM_THREADS": "7"}
    seen = [subprocess.run(c.replace("matmul-drift explain --case square --dtype float64 --device cpu", probe),
                           shell=True, env=caller, capture_output=True, text=True, check=True).stdout.split()
            for c in (before, after)]
    assert seen == [["None", "2"], ["1", "1"]]
    assert all(shlex.split(c) for c in (before, after))


def test_every_format_leads_with_incidents(tmp_path, capsys):
    tree = _three_nights(tmp_path / "results")
    _confirm(tree, [1.63, 1.14, 1.6])
    assert cli_main(["summary", str(tree.root), "--at", tree.commits[2][:8], "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (inc,) = doc["incidents"]
    assert inc["failing"] and [doc["flags"][k]["kind"] for k in inc["flags"]].count("kernel") == 4
    assert sorted(doc["flags"][k]["benign"] for k in inc["flags"]) == ["", *["same output bits"] * 4]
    assert [r["side"] for r in inc["repros"]] == ["before", "after"]
    assert cli_main(["summary", str(tree.root), "--at", tree.commits[2][:8], "--format", "github"]) == 1
    md = capsys.readouterr().out
    assert md.index("#### incident 1 (failing): threads 2 -> 1") < md.index("<details><summary>4 cells, 5 flags</summary>")
    assert f"<!-- matmul-drift incident {inc['key']} -->" in md
    assert cli_main(["summary", str(tree.root), "--at", tree.commits[2][:8]]) == 1
    plain = capsys.readouterr().out
    assert plain.index("== incident 1") < plain.index("verdict: slower (square float32)") < plain.index("repro before")


def test_an_incident_keeps_its_key_on_the_next_night(tmp_path):
    """The same cause at two commits (a torch build pair, night after night) has one key, so a
    nightly updates one issue; another cause has another."""
    cat = tmp_path / "results" / "catalog"

    def adjust(ci, ei, data):
        if ei == 1:
            F.set_value(data, F.ERROR_U, SQUARE32, 50.0)

    tree = F.write_tree(tmp_path / "results", n_commits=2, adjust=adjust)
    keys = [i.key for c in tree.commits for i in _summary(tree, at=c, across="envs").incidents]
    assert len(keys) == 2 and keys[0] == keys[1]
    del cat


@pytest.mark.parametrize("changes,expected", [
    (["env_vars.MKL_CBWR: none -> AVX2"], "MKL_CBWR=AVX2 set"),
    (["env_vars.ONEDNN_MAX_CPU_ISA: AVX2 -> none"], "ONEDNN_MAX_CPU_ISA=AVX2 unset"),
    (["flags.float32_matmul_precision: highest -> high"], "torch setting float32_matmul_precision highest -> high"),
    (["cuda.runtime: 12.8 -> 13.0", "cuda.driver: 570.1 -> 580.65"], "CUDA runtime 12.8 -> 13.0; CUDA driver 570.1 -> 580.65"),
    (["torch.git: aaaaaaaaaaaaaaaa -> bbbbbbbbbbbbbbbb"], "torch build aaaaaaaaaaaa -> bbbbbbbbbbbb"),
    (["weird.key: 1 -> 2"], "weird.key 1 -> 2"),
])
def test_a_cause_in_one_line(changes, expected):
    assert cause_line(changes, None, None) == expected


def test_incidents_order_failing_first(tmp_path):
    tree = _three_nights(tmp_path / "results")
    _confirm(tree, [1.63, 1.14, 1.6])
    s = summary.summarise(history.read_history(tree.root))
    got = ordered(s.incidents, summary.DEFAULT_FAIL_ON)
    flags = [i.failing(summary.DEFAULT_FAIL_ON) for i in got]
    assert flags == sorted(flags, reverse=True) and flags[0]
