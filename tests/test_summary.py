"""The summary: which changes it flags, how it renders them, its exit status, and bad input."""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import asv_fixtures as F
import checkout
import kernel_names
import pytest

from matmul_drift.cli.main import main as cli_main
from matmul_drift.core import ids, series, trees
from matmul_drift.probes import order_tree
from matmul_drift.read.incidents import ordered
from matmul_drift.read import flags, history, latest, pairing, render, rules, summary
from matmul_drift.store import catalog

REPO = Path(__file__).resolve().parents[1]
REAL_RESULTS = REPO / "results"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = cli_main(["summary", *(str(a) for a in argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv) -> tuple[int, dict, str]:
    rc, out, err = run_cli(capsys, *argv, "--format", "json")
    return rc, (json.loads(out) if out else None), err


def flag_keys(doc: dict) -> set:
    return {(f["kind"], f["benchmark"], tuple(sorted(f["params"].items()))) for f in doc["flags"]}


def params_of(tree: F.Tree, i: int) -> tuple:
    return tuple(sorted(tree.combos[i].items()))


def assert_one_line_error(err: str, pattern: str) -> None:
    lines = [ln for ln in err.splitlines() if "warning:" not in ln]
    assert len(lines) == 1 and re.search(pattern, lines[0]), err
    assert "Traceback" not in err


@pytest.fixture
def tree(tmp_path):
    return F.write_tree(tmp_path / "results", n_commits=3)


# ---------------------------------------------------------------------------- the mutation test


def _mutate_latest(capsys, results_root: Path) -> None:
    """From the latest run, derive a run of a new, later commit; unmutated it flags nothing;
    with one kernel-id changed, one error_u x10 and one ulp 0 -> 3 it flags exactly those."""
    h = history.read_history(results_root)
    machine = sorted(h.runs)[0]
    src = h.runs[machine][-1]
    units = h.units()
    by_unit = lambda unit: sorted(n for n in src.series if units.get(n) == unit)
    base_data = F.load_results(src.path)
    new_commit = "feedfacecafe" + "0" * 28
    date = max(r.date for runs in h.runs.values() for r in runs) + F.DAY_MS
    new = F.derive(base_data, new_commit, date)
    F.write_results(src.path.parent, new)
    args = [results_root, "--machine", machine, "--base", src.commit[:10], "--head", new_commit[:12]]

    rc, doc, err = run_json(capsys, *args)
    assert (rc, doc["flags"], doc["pairs"]) == (0, [], 1), err

    # Pick three combinations (distinct where the data allows) that can carry each mutation.
    used: set[int] = set()

    def pick(bench: str, ok) -> int:
        s = src.series[bench]
        cands = [i for i in range(s.values.size) if s.status(i) == "ok" and ok(s.values[i])]
        assert cands, f"no combination of {bench} fits the mutation"
        i = next((c for c in cands if c not in used), cands[0])
        used.add(i)
        return i

    kbench = by_unit("kernel-id")[0]
    ki = pick(kbench, lambda v: True)
    ubench = by_unit("u")[0]
    ui = pick(ubench, lambda v: v > 0 and math.isfinite(v))
    zero = [(b, i) for b in by_unit("ulp") for i in range(src.series[b].values.size)
            if src.series[b].status(i) == "ok" and src.series[b].values[i] == 0]
    assert zero, "no ulp series is 0 anywhere"
    lbench, li = next(((b, i) for b, i in zero if i not in used), zero[0])

    cat_dir = h.catalog.root
    old_id = src.series[kbench].values[ki]
    old = h.catalog.get("kernels", old_id) or {"device": "cpu"}
    new_entry = dict(old, full=list(old.get("full") or []) + ["mutated_sgemm_kernel<float>"])
    new_id = catalog.store(cat_dir, "kernels", new_entry)
    F.set_value(new, kbench, ki, new_id)
    F.set_value(new, ubench, ui, F.get_value(new, ubench, ui) * 10)
    F.set_value(new, lbench, li, 3)
    F.write_results(src.path.parent, new)

    rc, doc, err = run_json(capsys, *args)
    combo = lambda b, i: tuple(sorted(h.params_dict(b, src.series[b].params,
                                                    _combo(src.series[b].params, i)).items()))
    assert flag_keys(doc) == {
        ("kernel", kbench, combo(kbench, ki)),
        ("accuracy", ubench, combo(ubench, ui)),
        ("invariance", lbench, combo(lbench, li)),
    }, doc["flags"]
    assert len(doc["flags"]) == 3 and rc == 1
    kflag = next(f for f in doc["flags"] if f["kind"] == "kernel")
    assert "mutated_sgemm_kernel<float>" in kflag["detail"]
    assert kflag["after"]["kernels"] == new_entry and kflag["before"]["id"] == ids.hex_id(old_id)
    assert all(f["before"]["commit"] == src.commit and f["after"]["commit"] == new_commit
               for f in doc["flags"])


def _combo(params, i):
    return list(itertools.product(*params))[i]


def test_mutations_of_a_synthetic_history_are_flagged_exactly(capsys, tree):
    _mutate_latest(capsys, tree.root)
    # The whole history (not only base/head) has nothing else to flag either.
    rc, doc, _ = run_json(capsys, tree.root)
    assert rc == 1 and len(doc["flags"]) == 3
    assert {f["kind"] for f in doc["flags"]} == {"kernel", "accuracy", "invariance"}
    assert all(f["after"]["commit"].startswith("feedface") for f in doc["flags"])


def _has_real_results() -> bool:
    asv_dir = REAL_RESULTS / "asv"
    return asv_dir.is_dir() and any(
        p.name not in ("machine.json", "benchmarks.json") for p in asv_dir.glob("*/*.json"))


def test_mutations_of_the_real_history_are_flagged_exactly(capsys, tmp_path):
    if not _has_real_results():
        pytest.skip("results/asv holds no results yet")
    root = tmp_path / "results"
    shutil.copytree(REAL_RESULTS / "asv", root / "asv")
    if (REAL_RESULTS / "catalog").is_dir():
        shutil.copytree(REAL_RESULTS / "catalog", root / "catalog")
    _mutate_latest(capsys, root)


# ---------------------------------------------------------------------------- each kind


def test_untouched_history_flags_nothing(capsys, tree):
    rc, doc, err = run_json(capsys, tree.root)
    assert rc == 0 and doc["flags"] == [] and doc["failing"] == 0
    # 3 commits x 2 envs: 2 commit pairs per env + 1 env pair per commit.
    assert doc["pairs"] == 2 * 2 + 3
    assert err == ""


def _tree_with(tmp_path, change, n_commits=2, **kw) -> F.Tree:
    """A tree whose last commit, first env, is changed by change(data, catalog_dir)."""
    cat = tmp_path / "results" / "catalog"

    def adjust(ci, ei, data):
        if ci == n_commits - 1 and ei == 0:
            change(data, cat)

    return F.write_tree(tmp_path / "results", n_commits=n_commits, adjust=adjust, **kw)


def _idx(case="square", dtype="float32", device="cpu", cases=("square", "tall"), devices=("cpu",)):
    return [(c, d, v) for c in cases for d in F.DTYPES for v in devices].index((case, dtype, device))


def _new_ids(results) -> tuple[int, int]:
    """A kernel-id and an order-id in ``results``' catalog that no run of write_tree has."""
    cat = results / "catalog"
    return (catalog.store(cat, "kernels", {"device": "cpu", "full": ["aten::matmul", "aten::mm", "other"]}),
            order_tree.store(cat, F.order_tree("pairwise"), 8))


def test_kernel_change_shows_old_and_new_names(capsys, tmp_path):
    i = _idx(dtype="float32")

    def change(data, cat):
        kid = catalog.store(cat, "kernels", {"device": "cpu", "full": [
            "aten::matmul", "aten::mm", "MKL SGEMM(N,N) CNR:COMPATIBLE NThr:2"]})
        F.set_value(data, F.KERNEL, i, kid)

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    (f,) = doc["flags"]
    assert rc == 1 and f["kind"] == "kernel" and f["params"] == tree.combos[i]
    old_name = F.default_kernel_names()[1]  # float32 is the second (dtype, device) pair
    seq = ids.hex_id(trees.order_id(F.order_tree("sequential"), 8))
    assert f["detail"] == (f"full: aten::matmul, aten::mm, {old_name} -> "
                           "aten::matmul, aten::mm, MKL SGEMM(N,N) CNR:COMPATIBLE NThr:2; "
                           f"renamed, same order: sequential (order-id {seq})")
    rc, out, _ = run_cli(capsys, tree.root, "--across", "commits")
    assert "CNR:COMPATIBLE" in out and old_name in out and "synthetic: kernel" in out


def test_an_order_change_is_flagged_as_order_even_with_the_same_kernels(capsys, tmp_path):
    same, both, lost = _idx(dtype="float32"), _idx(dtype="float16"), _idx(case="tall", dtype="float64")

    def change(data, cat):
        F.set_value(data, F.ORDER_ID, same, order_tree.store(cat, F.order_tree("pairwise"), 8))
        F.set_value(data, F.ORDER_ID, both, order_tree.store(cat, F.order_tree("pairwise"), 8))
        F.set_value(data, F.KERNEL, both, catalog.store(cat, "kernels", {"device": "cpu", "full": ["new kernel"]}))
        # the readings fit no tree
        F.set_value(data, F.ORDER_ID, lost, order_tree.store(cat, None, 8))

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    got = {(f["kind"], f["params"]["case"], f["params"]["dtype"]): f["detail"] for f in doc["flags"]}
    assert rc == 1 and "order" in doc["fail_on"]
    assert got.pop(("kernel", "square", "float16")).endswith("-> new kernel")  # no "renamed": the order moved too
    assert got == {
        ("order", "square", "float32"): "order of entry (0, 0): sequential -> pairwise; "
                                        "kernel-id unchanged: the same kernels add in another order",
        ("order", "square", "float16"): "order of entry (0, 0): sequential -> pairwise",
        ("order", "tall", "float64"): "order of entry (0, 0): sequential -> not revealed; "
                                      "kernel-id unchanged: the probe read the same kernels' order on one side only",
    }
    rc, out, _ = run_cli(capsys, tree.root, "--across", "commits", "--fail-on", "kernel")
    assert rc == 1 and "synthetic: order" in out and "sequential -> pairwise" in out
    rc, _, _ = run_cli(capsys, tree.root, "--across", "commits", "--fail-on", "accuracy")
    assert rc == 0


def test_a_fix_that_stops_or_starts_working_is_flagged_as_fix(capsys, tmp_path):
    # The fixture's slice_n drifts where the index is a multiple of 3; its fixes entry says
    # MKL_CBWR=AVX2 and "full product, then slice" remove it, one thread does not.
    stops, starts = _idx(dtype="float64"), _idx(case="tall", dtype="bfloat16")
    assert stops % 3 == 0 and starts % 3 == 0

    def change(data, cat):
        F.set_value(data, F.FIX_ID, stops, catalog.store(cat, "fixes", F.fix_entry("cpu", ["slice_n"], {
            "MKL_CBWR=AVX2": "no effect"})))
        F.set_value(data, F.FIX_ID, starts, catalog.store(cat, "fixes", F.fix_entry("cpu", ["slice_n"], {
            "one thread": "removes"})))

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    got = {(f["params"]["case"], f["params"]["dtype"]): f["detail"] for f in doc["flags"] if f["kind"] == "fix"}
    assert rc == 1 and len(doc["flags"]) == 2 and "fix" in doc["fail_on"]
    assert got == {
        ("square", "float64"): "stopped removing the drift: MKL_CBWR=AVX2 (now no effect)\n"
                               "removes it now: full product, then slice",
        ("tall", "bfloat16"): "started removing the drift: one thread\n"
                             "removes it now: MKL_CBWR=AVX2; full product, then slice; one thread",
    }
    rc, out, _ = run_cli(capsys, tree.root, "--across", "commits", "--fail-on", "kernel")
    assert rc == 0 and "synthetic: fix" in out and "(now no effect)" in out


def _map_after(tmp_path, changes: dict, n_commits: int, ci: int, ei: int) -> F.Tree:
    """A tree whose commit ``ci``, env ``ei`` records the maps ``changes`` ({dtype: runs}) of square."""
    cat = tmp_path / "results" / "catalog"

    def adjust(c, e, data):
        if c >= ci and e == ei:
            for dtype, runs in changes.items():
                F.set_value(data, F.MAP_ID, _idx(dtype=dtype), catalog.store(cat, "maps", F.map_entry("square", dtype,
                                                                                                      runs=runs)))

    return F.write_tree(tmp_path / "results", n_commits=n_commits, adjust=adjust)


def test_a_map_change_names_the_m_whose_state_changed(capsys, tmp_path):
    """Two asv results of one commit, torch 2.13.0 and 2.14.1; the second's maps of square differ
    from the first's (row 0 invariant at M = 1..3, the rows at every M, one kernel): a failing
    `map` flag each, naming the M that changed and the build."""
    r = F.map_run
    after = {"float32": [r(1, 3, True, True), r(4, 7, False, True), r(8, 15, False, False), r(16, 16, False, True)],
             "bfloat16": [r(1, 5, True, True), r(6, 8, False, True), r(9, 16, False, True, kernel="bbbbbbbbbbbb")]}
    tree = _map_after(tmp_path, after, n_commits=1, ci=0, ei=1)
    rc, doc, _ = run_json(capsys, tree.root)
    got = {f["params"]["dtype"]: f["detail"] for f in doc["flags"]}
    assert rc == 1 and {f["kind"] for f in doc["flags"]} == {"map"} and "map" in doc["fail_on"], doc["flags"]
    assert all(f["across"] == "envs" and f["after"]["torch"].startswith("2.14.1") for f in doc["flags"])
    torch = doc["flags"][0]["after"]["torch"]
    assert got == {
        "float32": f"M = 8..15 became drifting (rows as in the full product) under torch {torch}",
        "bfloat16": f"M = 4..5 became invariant (row 0 as at M = 1) under torch {torch}\n"
                    "M = 9..16 ran kernel-id bbbbbbbbbbbb (was aaaaaaaaaaaa)",
    }
    rc, out, _ = run_cli(capsys, tree.root)
    assert rc == 1 and "synthetic: map" in out and "M = 8..15 became drifting" in out
    rc, _, _ = run_cli(capsys, tree.root, "--fail-on", "kernel")
    assert rc == 0


def test_a_map_change_across_commits_names_the_commit(capsys, tmp_path):
    r = F.map_run
    tree = _map_after(tmp_path, {"float64": [r(1, 16, True, True)]}, n_commits=2, ci=1, ei=0)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    (f,) = doc["flags"]
    assert rc == 1 and f["kind"] == "map" and f["params"] == tree.combos[_idx(dtype="float64")]
    assert f["detail"] == f"M = 4..16 became invariant (row 0 as at M = 1) at {tree.commits[1][:8]}"


def test_a_map_change_across_a_method_change_is_one_note(capsys, tmp_path):
    r = F.map_run
    tree = _map_after(tmp_path, {"float32": [r(1, 16, False, False)]}, n_commits=2, ci=1, ei=0)
    method = {**series.METHOD, "map_id": series.METHOD["map_id"] + 1}
    data = F.load_results(tree.file(1, 0))
    F.set_env(data, tree.catalog_dir, tree.torch[0], method=method)
    F.write_results(tree.machine_dir, data)
    s = summary.summarise(history.read_history(tree.root), summary.Options(across="commits"))
    assert not [f for f in s.flags if f.kind == "map"]
    v = series.METHOD["map_id"]
    assert s.method_notes == [f"synthetic: map_id: method {v} -> {v + 1} between {tree.commits[0][:8]} and "
                              f"{tree.commits[1][:8]}"]


def test_map_detail_from_two_catalog_entries():
    r = F.map_run
    before = F.map_entry("bmm", "float32")
    # the same state at every M: the words that changed (a drift's size) are the detail
    wider = F.map_entry("bmm", "float32", words=before["words"].replace("max 2 ulp", "max 3 ulp"))
    assert rules.map_detail(1, 2, before, wider, " under torch 2.14.1") == (
        "every M in the same state under torch 2.14.1; the words changed: row 0 as at M = 1: invariant at "
        "M = 1..3; drifts elsewhere (max 2 ulp) -> row 0 as at M = 1: invariant at M = 1..3; drifts elsewhere "
        "(max 3 ulp)")
    # another range: the M one map has alone, and the params that moved
    longer = F.map_entry("bmm", "float32", runs=[r(1, 3, True, True), r(4, 32, False, True)])
    longer["params"].update(hi=32, m_full=32)
    assert rules.map_detail(1, 2, before, longer) == "M = 17..32 mapped now only\nmapped otherwise: hi 16 -> 32; m_full 16 -> 32"
    # a periodic change: the spans listed up to a count
    periodic = F.map_entry("bmm", "float32", runs=[r(m, m, m % 2 == 1 or m <= 3, True) for m in range(1, 41)])
    periodic["params"].update(hi=40, m_full=40)
    line = rules.map_detail(1, 2, before, periodic).splitlines()[0]
    assert line == "M = 5, 7, 9, 11, 13, 15 became invariant (row 0 as at M = 1)"
    many = F.map_entry("bmm", "float32", runs=[r(m, m, m % 2 == 1, True) for m in range(1, 41)])
    many["params"].update(hi=40, m_full=40)
    assert rules.map_detail(1, 2, periodic, many).splitlines()[0] == "M = 2 became drifting (row 0 as at M = 1)"
    flipped = F.map_entry("bmm", "float32", runs=[r(m, m, m % 2 == 0, True) for m in range(1, 41)])
    flipped["params"].update(hi=40, m_full=40)
    assert rules.map_detail(1, 2, many, flipped).splitlines() == [
        "M = 1, 3, 5, 7, 9, 11, 13, 15, ... (20 M in 20 runs) became drifting (row 0 as at M = 1)",
        "M = 2, 4, 6, 8, 10, 12, 14, 16, ... (20 M in 20 runs) became invariant (row 0 as at M = 1)"]
    # what a results tree may hold instead: one line, never an exception
    for bad, why in ((None, "no runs of M"), ({"verdicts": [{"lo": 3, "hi": 1}]}, "a malformed run: {'lo': 3, 'hi': 1}"),
                     ({"verdicts": [r(1, 1 << 20, True, True)]}, "more than 65536 M"),
                     ({"verdicts": [r(1, 4, True, True), r(3, 5, True, True)]}, "runs that overlap")):
        assert rules.map_detail(0xABC, 2, before, bad) == (
            f"map-id 000000000abc -> 000000000002 (maps not in the catalog or unreadable: {why})")


def test_invariance_lost_regained_and_growth(capsys, tmp_path):
    # In the fixture slice_n is 2 ulp where the index is a multiple of 3, else 0; slice_m is 0.
    lost, regained = _idx(dtype="float32"), _idx(dtype="float64")
    grew, small = _idx(dtype="bfloat16"), _idx(case="tall", dtype="float64")

    def change(data, cat):
        F.set_value(data, F.SLICE_M, lost, 5)
        for i, v in ((regained, 0.0), (grew, 7.0), (small, 3.0)):
            F.set_value(data, F.SLICE_N, i, v)

    tree = _tree_with(tmp_path, change)
    base = F.load_results(tree.file(0, 0))["results"][F.SLICE_N][0]
    assert base[regained] == base[grew] == base[small] == 2.0
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    got = {(f["kind"], f["benchmark"], f["params"]["case"], f["params"]["dtype"]): f["detail"]
           for f in doc["flags"]}
    assert got == {
        ("invariance", F.SLICE_M, "square", "float32"): "invariance lost: 0 ulp -> 5 ulp",
        ("invariance", F.SLICE_N, "square", "float64"): "invariance regained: 2 ulp -> 0 ulp",
        ("ulp-growth", F.SLICE_N, "square", "bfloat16"): "drift grew 3.5x: 2 ulp -> 7 ulp",
    }  # 2 -> 3 ulp is within the default growth factor of 2
    assert rc == 1
    # Growth alone is informational unless named.
    rc, _, _ = run_cli(capsys, tree.root, "--fail-on", "ulp-growth", "--format", "json")
    assert rc == 1
    rc, _, _ = run_cli(capsys, tree.root, "--fail-on", "timing", "--format", "json")
    assert rc == 0


def test_nonfinite_outputs_appearing_is_a_failing_flag(capsys, tmp_path):
    i = _idx(dtype="float16")
    tree = _tree_with(tmp_path, lambda data, cat: F.set_value(data, F.NONFINITE, i, 12))
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    assert [(f["kind"], f["params"]["dtype"], f["detail"]) for f in doc["flags"]] == [
        ("nonfinite", "float16", "non-finite outputs 0 -> 12")]
    assert rc == 1 and doc["failing"] == 1


@pytest.mark.parametrize("factor,tolerance,flagged", [
    (1.9, None, False), (2.1, None, True), (0.4, None, True), (0.6, None, False),
    (3.0, "5", False), (6.0, "5", True),
])
def test_accuracy_tolerance(capsys, tmp_path, factor, tolerance, flagged):
    i = _idx(dtype="float32")
    tree = _tree_with(tmp_path, lambda d, t: F.set_value(d, F.ERROR_U, i, F.get_value(d, F.ERROR_U, i) * factor))
    extra = ["--u-tolerance", tolerance] if tolerance else []
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits", *extra)
    assert flag_keys(doc) == ({("accuracy", F.ERROR_U, params_of(tree, i))} if flagged else set())
    assert rc == (1 if flagged else 0)


@pytest.mark.parametrize("dtype,name", [("float32", "γ_K"), ("float32-high", "γ_K(TF32)")])
def test_accuracy_crossing_the_gamma_bound_is_flagged_even_within_tolerance(capsys, tmp_path, dtype, name):
    """The flag names the bound that the u-bound series holds: TF32's for a TF32 precision."""
    i = _idx(dtype=dtype)
    bound = F.K / (1 - F.K * 2.0**-24)

    def change(data, cat):
        F.set_value(data, F.ERROR_U, i, bound * 1.2)

    def before(ci, ei, data):
        F.set_value(data, F.ERROR_U, i, bound * 0.9 if ci == 0 else bound * 1.2)

    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",), adjust=before)
    rc, doc, _ = run_json(capsys, tree.root)
    (f,) = doc["flags"]
    assert f["kind"] == "accuracy" and f"now above the {name} bound " in f["detail"] and rc == 1
    # Vacuous bound (fp16: K u >= 1 gives NaN): no crossing, and 1.3x is within tolerance.
    j = _idx(dtype="float16")
    tree2 = F.write_tree(tmp_path / "r2", n_commits=2, torch_versions=("2.13.0",),
                         adjust=lambda ci, ei, d: F.set_value(d, F.ERROR_U, j, 1e6 * (1.3 if ci else 1)))
    rc, doc, _ = run_json(capsys, tree2.root)
    assert doc["flags"] == [] and rc == 0


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_extreme_values_are_flagged_without_numpy_warnings(capsys, tmp_path):
    """A value of 5e-324 before and 1.7e308 after: every ratio overflows to inf. That is a flag
    (each series grew without bound), not an 'overflow encountered' line on stderr."""
    i = _idx()

    def adjust(ci, ei, data):
        for name in (F.ERROR_U, F.SLICE_N, F.TIME):
            F.set_value(data, name, i, 1.7e308 if ci else 5e-324)
        _set_time(data, i, 1.7e308 if ci else 5e-324, 0.0)
        if ci:
            F.set_env(data, tmp_path / "results" / "catalog", "2.13.0", threads=1)

    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",), adjust=adjust)
    rc, doc, err = run_json(capsys, tree.root, "--timing", "suspects")
    assert err == "" and rc == 1, err
    assert {f["kind"] for f in doc["flags"]} >= {"accuracy", "timing"}, doc["flags"]


def _set_time(data, i, value, ci_halfwidth):
    F.set_value(data, F.TIME, i, value)
    row = data["results"][F.TIME]
    for k, v in (("stats_ci_99_a", value - ci_halfwidth), ("stats_ci_99_b", value + ci_halfwidth)):
        row[F.COL[k]] = list(row[F.COL[k]])
        row[F.COL[k]][i] = v


def test_timing_needs_the_ratio_and_apart_intervals_and_a_suspect_never_fails(capsys, tmp_path):
    i, j = _idx(dtype="float32"), _idx(dtype="float64")
    t_i = 1e-3 * (1 + 0.1 * (i % 7))
    t_j = 1e-3 * (1 + 0.1 * (j % 7))

    def change(data, cat):
        F.set_env(data, cat, "2.13.0", threads=1)  # a setting changed: the suspects are worth asking about
        _set_time(data, i, t_i * 1.5, t_i * 0.03)  # 1.5x, CIs apart
        _set_time(data, j, t_j * 1.5, t_j * 0.6)  # 1.5x, but noisy: CIs overlap

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits", "--timing", "suspects")
    assert flag_keys(doc) == {("timing", F.TIME, params_of(tree, i))}
    assert "99% CIs apart" in doc["flags"][0]["detail"] and not doc["flags"][0]["failing"]
    assert doc["flags"][0]["benign"] == "not confirmed yet" and rc == 0
    rc, _, _ = run_cli(capsys, tree.root, "--fail-on", "timing", "--timing", "suspects")
    assert rc == 0  # what the main job re-measures, not an alarm
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits", "--time-factor", "1.6", "--timing", "suspects")
    assert doc["flags"] == []
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")  # no evidence across runs: a note
    assert doc["flags"] == [] and doc["timing_notes"] == [
        "synthetic: 1 timing difference suspected at the latest run, not confirmed yet (a re-measurement or the "
        "next run decides)"]


def test_input_mismatch_is_reported_and_not_compared(capsys, tmp_path):
    i = _idx(dtype="float32")

    def change(data, cat):
        F.set_value(data, F.INPUT, i, 12345)
        F.set_value(data, F.ERROR_U, i, 100.0)  # would be an accuracy flag
        F.set_value(data, F.KERNEL, i, 999)  # would be a kernel flag

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    assert flag_keys(doc) == {("input", F.INPUT, params_of(tree, i))} and rc == 1
    assert "not compared" in doc["flags"][0]["detail"]


def test_benchmark_code_change_is_not_compared(capsys, tmp_path):
    i = _idx(dtype="float32")

    def change(data, cat):
        F.set_version(data, F.ERROR_U, F.bench_version(F.ERROR_U, "v2"))
        F.set_value(data, F.ERROR_U, i, 100.0)

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    assert doc["flags"] == [] and rc == 0  # this project's change: a note, never a flag
    assert doc["method_notes"] == [f"synthetic: Drift.track_error_u: benchmark code changed between {tree.commits[0][:8]} "
                                   f"and {tree.commits[1][:8]} (asv version {F.bench_version(F.ERROR_U)[:12]} -> "
                                   f"{F.bench_version(F.ERROR_U, 'v2')[:12]})"]


def test_new_failure_is_reported_apart_from_skips(capsys, tmp_path):
    i, j = _idx(dtype="float32"), _idx(dtype="float64")

    def change(data, cat):
        F.set_value(data, F.ERROR_U, i, None)
        F.set_value(data, F.ERROR_U, j, math.nan)

    tree = _tree_with(tmp_path, change)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    assert flag_keys(doc) == {("failure", F.ERROR_U, params_of(tree, i))}
    assert doc["flags"][0]["after"]["status"] == "failed" and rc == 0


def test_a_change_across_a_run_without_the_value_is_flagged(capsys, tmp_path):
    # Commit 1 failed one kernel-id, skipped one error_u, and ran without the order-id and timing
    # benchmarks (asv run --bench); commit 2 measures them again, changed: each is judged against
    # commit 0, but for the timing, whose code changed meanwhile.
    k, u, o = _idx(dtype="float32"), _idx(dtype="float64"), _idx(dtype="bfloat16")
    new_kernel, new_order = _new_ids(tmp_path / "results")

    def adjust(ci, ei, data):
        if ci == 1:
            F.set_value(data, F.KERNEL, k, None)
            F.set_value(data, F.ERROR_U, u, math.nan)
            del data["results"][F.ORDER_ID], data["results"][F.TIME]
        if ci == 2:
            F.set_value(data, F.KERNEL, k, new_kernel)
            F.set_value(data, F.ERROR_U, u, F.get_value(data, F.ERROR_U, u) * 10)
            F.set_value(data, F.ORDER_ID, o, new_order)
            F.set_version(data, F.TIME, "new code")

    tree = F.write_tree(tmp_path / "results", n_commits=3, adjust=adjust)
    for args in ([], ["--at", tree.commits[2][:8]], ["--base", tree.commits[1][:8], "--head", tree.commits[2][:8]]):
        rc, doc, _ = run_json(capsys, tree.root, "--across", "commits", "--fail-on", "kernel,accuracy,order", *args)
        judged = {(f["kind"], f["benchmark"], f["after"]["env"]): f for f in doc["flags"] if f["kind"] != "failure"}
        assert set(judged) == {(kind, bench, env) for kind, bench in
                               (("kernel", F.KERNEL), ("accuracy", F.ERROR_U), ("order", F.ORDER_ID))
                               for env in tree.env_names}, doc["flags"]
        assert [n for n in doc["method_notes"] if "Time.time_matmul: benchmark code changed" in n], doc["method_notes"]
        assert all((f["before"]["commit"], f["after"]["commit"]) == (tree.commits[0], tree.commits[2])
                   for f in judged.values())
        assert judged["kernel", F.KERNEL, tree.env_names[0]]["after"]["id"] == ids.hex_id(new_kernel)
        assert rc == 1 and doc["failing"] == 6


def _env_changed(**fields):
    """A _tree_with change: every measured combination's env entry given ``fields``, and
    float32's error_u raised so that a flag carries the attribution."""
    i = _idx(dtype="float32")

    def change(data, cat):
        eid = catalog.store(cat, "env", {**F.env_entry("2.13.0"), **fields})
        for k in range(len(data["results"][F.ENV][0])):
            if not math.isnan(F.get_value(data, F.ENV, k)):
                F.set_value(data, F.ENV, k, eid)
        F.set_value(data, F.ERROR_U, i, 10.0)

    return change


def test_attribution_names_what_changed_in_the_environment(capsys, tmp_path):
    tree = _tree_with(tmp_path, _env_changed(env_vars={"MKL_CBWR": "COMPATIBLE"}))
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    (f,) = doc["flags"]
    assert f["attribution"] == ["env_vars.MKL_CBWR: none -> COMPATIBLE"]
    # Across torch versions at one commit, the version is what changed.
    rc, doc, _ = run_json(capsys, tree.root, "--across", "envs", "--fail-on", "none")
    f = next(f for f in doc["flags"] if f["after"]["commit"] == tree.commits[1])
    assert "torch.version: 2.13.0+cpu -> 2.14.1+cpu" in f["attribution"]
    assert "env_vars.MKL_CBWR: COMPATIBLE -> none" in f["attribution"]
    assert rc == 0


def test_an_environment_nested_as_deep_as_json_reads_is_attributed_in_one_short_line(capsys, tmp_path):
    # was a RecursionError's traceback: a hostile env entry whose value nests 600 lists deep
    deep_list, deep_dict = 1, {"v": 1}
    for _ in range(600):
        deep_list, deep_dict = [deep_list], {"a": deep_dict}
    tree = _tree_with(tmp_path, _env_changed(env_vars={"MKL_CBWR": deep_list}, libs=deep_dict))
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    (f,) = doc["flags"]
    assert f"env_vars.MKL_CBWR: none -> {'[' * flags.LEAF_CHARS}…" in f["attribution"]
    assert "libs." + ".".join(["a"] * 600) + ".v: none -> 1" in f["attribution"]
    assert all(len(line.split(": ", 1)[1]) <= 2 * flags.LEAF_CHARS + 10 for line in f["attribution"])


def test_envs_axis_compares_torch_versions_at_one_commit(capsys, tmp_path):
    i = _idx(dtype="float32")
    tree = F.write_tree(tmp_path / "results", n_commits=2,
                        adjust=lambda ci, ei, d: ei == 1 and F.set_value(d, F.ERROR_U, i, 50.0))
    rc, doc, _ = run_json(capsys, tree.root, "--across", "envs")
    assert len(doc["flags"]) == 2 and doc["pairs"] == 2
    for f in doc["flags"]:
        assert (f["across"], f["before"]["torch"], f["after"]["torch"]) == ("envs", "2.13.0+cpu", "2.14.1+cpu")
        assert "torch.version: 2.13.0+cpu -> 2.14.1+cpu" in f["attribution"]
    rc, doc, _ = run_json(capsys, tree.root, "--across", "commits")
    assert doc["flags"] == [] and doc["pairs"] == 2


def test_base_head_compares_only_those_commits(capsys, tmp_path):
    i = _idx(dtype="float32")
    tree = F.write_tree(tmp_path / "results", n_commits=4,
                        adjust=lambda ci, ei, d: ci == 1 and F.set_value(d, F.ERROR_U, i, 50.0))
    rc, doc, _ = run_json(capsys, tree.root, "--base", tree.commits[2][:7], "--head", tree.commits[3])
    assert (rc, doc["flags"], doc["pairs"]) == (0, [], 2)
    rc, doc, _ = run_json(capsys, tree.root, "--base", tree.commits[0][:7], "--head", tree.commits[1][:7])
    assert rc == 1 and len(doc["flags"]) == 2  # one per environment


def test_base_head_judges_what_base_lacks_against_the_latest_run_before_it(capsys, tmp_path):
    # Kernel X at commit 0, failed at 1, not run at 2, Y at 3: --base 2 --head 3 flags X -> Y
    # against commit 0, the latest run at or before base that has it; commit 1's failure
    # hides nothing. With --base 1 the Y of commit 2 (after base) is not what head is judged against.
    k = _idx(dtype="float32")
    new_kernel, _ = _new_ids(tmp_path / "results")

    def adjust(ci, ei, data):
        if ci == 1:
            F.set_value(data, F.KERNEL, k, None)
        if ci == 2:
            del data["results"][F.KERNEL]
        if ci == 3:
            F.set_value(data, F.KERNEL, k, new_kernel)

    tree = F.write_tree(tmp_path / "results", n_commits=4, adjust=adjust)
    for base in (1, 2):
        rc, doc, _ = run_json(capsys, tree.root, "--base", tree.commits[base][:8], "--head", tree.commits[3][:8])
        kernel = [f for f in doc["flags"] if f["kind"] == "kernel"]
        assert [(f["before"]["commit"], f["after"]["commit"], f["after"]["env"]) for f in kernel] == [
            (tree.commits[0], tree.commits[3], env) for env in tree.env_names], doc["flags"]
        assert all(f["after"]["id"] == ids.hex_id(new_kernel) for f in kernel)
        assert rc == 1 and doc["failing"] == 2 and doc["pairs"] == 2
    # Head before base: nothing earlier is judged (there is no run between to step over).
    rc, doc, _ = run_json(capsys, tree.root, "--base", tree.commits[3][:8], "--head", tree.commits[1][:8])
    assert [f["kind"] for f in doc["flags"]] == ["failure", "failure"] and rc == 0


def _rebased_project(root: Path, changes: dict[int, int]) -> tuple[list[str], F.Tree]:
    """A git repository with commits A -> B -> C -> D whose author dates, which asv's results
    hold (asv's Git.get_date), are days 0, 2, 1 and 1, as a rebase that keeps them leaves them
    (committed in one second), with asv.conf.json (repo ".") and one environment's results
    beside it. Combination i's kernel is new from commit ``changes[i]`` on. Returns the hashes."""
    from asv.plugins.git import Git

    root.mkdir(parents=True)
    checkout.git(root.parent, "init", "-q", "-b", "main", str(root))
    (root / "asv.conf.json").write_text(json.dumps({"version": 1, "project": "p", "repo": ".", "dvcs": "git",
                                                    "branches": ["main"], "results_dir": "results/asv"}))
    hashes = []
    for name, day in zip("ABCD", (0, 2, 1, 1)):
        (root / name).write_text(name)
        stamp = {"GIT_AUTHOR_DATE": f"@{F.START_MS // 1000 + day * 86400} +0000",
                 "GIT_COMMITTER_DATE": f"@{F.START_MS // 1000 + 9 * 86400} +0000"}
        subprocess.run([*checkout.GIT, "add", "-A"], cwd=root, check=True)
        subprocess.run([*checkout.GIT, "commit", "-qm", name], cwd=root, check=True, env={**os.environ, **stamp})
        hashes.append(checkout.git(root, "rev-parse", "HEAD"))
    dates = [Git(str(root), str(root / ".asv" / "repo")).get_date(h) for h in hashes]
    new_kernel, _ = _new_ids(root / "results")

    def adjust(ci, ei, data):
        data["commit_hash"], data["date"] = hashes[ci], dates[ci]
        for i, first in changes.items():
            if ci >= first:
                F.set_value(data, F.KERNEL, i, new_kernel)

    return hashes, F.write_tree(root / "results", n_commits=4, torch_versions=("2.13.0",), adjust=adjust)


def _kernel_flags(doc: dict) -> list[tuple]:
    return sorted((f["params"]["dtype"], f["before"]["commit"], f["after"]["commit"])
                  for f in doc["flags"] if f["kind"] == "kernel")


def test_commits_are_paired_in_git_order_where_the_repository_is_at_hand(capsys, tmp_path, monkeypatch):
    # By author date the runs read A, C, D, B (C and D tied): the float32 kernel, new at B,
    # was put on C, and the float64 one, new at C, read "new at C, back to the old at B".
    from asv.plugins.git import Git

    i, j = _idx(dtype="float32"), _idx(dtype="float64")
    (A, B, C, D), tree = _rebased_project(tmp_path / "project", {i: 1, j: 2})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # no repository here: asv.conf.json beside the results names it
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    rc, doc, err = run_json(capsys, tree.root, "--across", "commits")
    assert _kernel_flags(doc) == [("float32", A, B), ("float64", B, C)], doc["flags"]
    assert rc == 1 and len(doc["flags"]) == 2 and doc["warnings"] == [] and "warning" not in err
    # The order of asv's site: each commit's revision in asv's own get_revisions.
    revision = Git(str(tmp_path / "project"), str(tmp_path / "mirror")).get_revisions({A, B, C, D})
    assert [r.commit for r in history.read_history(tree.root).runs[tree.machine]] == sorted(revision, key=revision.get)

    # The results alone, away from the project: by date, and C and D's shared date said in one line.
    copy = tmp_path / "copy" / "results"
    shutil.copytree(tree.root, copy)
    for fmt in ("json", "github", "plain"):
        rc, out, err = run_cli(capsys, copy, "--across", "commits", "--format", fmt)
        tie = [w for w in (json.loads(out)["warnings"] if fmt == "json" else err.splitlines()) if "share the commit date" in w]
        assert len(tie) == 1 and C[:8] in tie[0] and D[:8] in tie[0] and "2025-01-02 00:00:00 UTC" in tie[0], (fmt, out, err)
        assert fmt != "github" or "share the commit date 2025-01-02 00:00:00 UTC" in out
    # Run from the project's checkout, the copy is in git's order again; a commit git does not
    # know (results of a deleted branch) keeps its place by date, and is named.
    data = F.load_results(tree.machine_dir / f"{D[:8]}-{tree.env_names[0]}.json")
    F.write_results(copy / "asv" / tree.machine, F.derive(data, "f" * 40, F.START_MS + 5 * F.DAY_MS))
    monkeypatch.chdir(tmp_path / "project")
    rc, doc, err = run_json(capsys, copy, "--across", "commits")
    assert _kernel_flags(doc) == [("float32", A, B), ("float64", B, C)], doc["flags"]
    assert doc["warnings"] == [f"git at {tmp_path / 'project'} does not know 1 of the 5 commits in the "
                               "results (e.g. ffffffff); those are placed by their commit dates"]
    assert [r.commit for r in history.read_history(copy).runs[tree.machine]] == [A, B, C, D, "f" * 40]


def test_git_order_reads_the_named_repository_under_a_hooks_git_variables(tmp_path, monkeypatch):
    # Inside a git hook GIT_DIR, GIT_WORK_TREE and GIT_INDEX_FILE are set: git then ignored the
    # repository it ran in and read the hook's (before: the other repository's commit came back).
    from matmul_drift.read import commits as gitorder

    heads = {}
    for name in ("project", "hooked"):
        checkout.git(tmp_path, "init", "-q", name)
        checkout.git(tmp_path / name, "commit", "-q", "--allow-empty", "-m", name)
        heads[name] = checkout.git(tmp_path / name, "rev-parse", "HEAD")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "hooked" / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path / "hooked"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "hooked" / ".git" / "index"))
    assert gitorder.revisions(tmp_path / "project") == {heads["project"]: 0}


def test_missing_catalog_entry_is_named_and_the_flag_kept(capsys, tmp_path):
    i = _idx(dtype="float32")
    tree = _tree_with(tmp_path, lambda d, t: F.set_value(d, F.KERNEL, i, 0xABCDEF012345))
    rc, doc, err = run_json(capsys, tree.root, "--across", "commits")
    assert rc == 1 and flag_keys(doc) == {("kernel", F.KERNEL, params_of(tree, i))}
    assert "abcdef012345" in doc["flags"][0]["detail"]
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "kernels/abcdef012345" in warnings[0]


# ---------------------------------------------------------------------------- bad input and usage


def test_corrupt_file_is_named_and_the_rest_still_summarised(capsys, tmp_path):
    i = _idx(dtype="float32")
    tree = _tree_with(tmp_path, lambda d, t: F.set_value(d, F.ERROR_U, i, 50.0), n_commits=3)
    bad = tree.file(0, 1)
    bad.write_text(bad.read_text()[:1000])
    rc, doc, err = run_json(capsys, tree.root)
    assert rc == 1 and ("accuracy", F.ERROR_U, params_of(tree, i)) in flag_keys(doc)
    assert f"warning: skipping {bad}" in err and "Traceback" not in err


def test_results_of_another_format_version_are_named(capsys, tree):
    old = tree.file(2, 1)
    data = F.load_results(old)
    data["version"] = 1
    F.write_results(tree.machine_dir, data)
    rc, doc, err = run_json(capsys, tree.root)
    assert rc == 0 and re.search(rf"skipping {re.escape(str(old))}: asv results format version 1", err)


@pytest.mark.parametrize("setup,argv,pattern", [
    (lambda p: None, ["{root}/missing"], "does not exist"),
    (lambda p: (p / "empty").mkdir(), ["{root}/empty"], "no asv results"),
    (lambda p: F.write_tree(p / "results", n_commits=1), ["{root}/results", "--catalog", "{root}/nope"],
     "/nope is not a directory"),  # was rc 0 and a warning per id
    (lambda p: F.write_tree(p / "results", n_commits=1), ["{root}/results", "--catalog", ""],
     "--catalog '' is not a directory"),  # '' read as '.'
    (lambda p: F.write_tree(p / "results", n_commits=1), ["{root}/results", "--machine", "nope"],
     "unknown machine 'nope'"),
    (lambda p: F.write_tree(p / "results", n_commits=1), ["{root}/results", "--fail-on", "bogus"],
     "unknown kind 'bogus'"),
    (lambda p: F.write_tree(p / "results", n_commits=1), [""], "argument RESULTS_DIR: needs a folder, got an empty name"),  # was read as the current folder
    (lambda p: F.write_tree(p / "results", n_commits=1), ["{root}/results", "--fail-on", "all,none"],
     "--fail-on: none stands alone; give it by itself"),  # was "unknown kind 'all'"
    (lambda p: F.write_tree(p / "results", n_commits=1), ["{root}/results", "--fail-on", "kernel,all"],
     "--fail-on: all stands alone; give it by itself"),
    (lambda p: F.write_tree(p / "results", n_commits=2), ["{root}/results", "--base", "0000000"],
     "--base and --head go together"),
    (lambda p: F.write_tree(p / "results", n_commits=2),
     ["{root}/results", "--base", "0000000", "--head", "1111111"], "no results for commit '0000000'"),
    (lambda p: F.write_tree(p / "results", n_commits=2),
     ["{root}/results", "--base", "a", "--head", "b", "--across", "envs"], "--across envs does not apply"),
    (lambda p: F.write_tree(p / "results", n_commits=2), ["{root}/results", "--u-tolerance", "0.5"],
     "--u-tolerance must be a number >= 1"),
])
def test_usage_and_unreadable_input_exit_2_with_one_line(capsys, tmp_path, setup, argv, pattern):
    setup(tmp_path)
    rc, out, err = run_cli(capsys, *[a.format(root=tmp_path) for a in argv])
    assert rc == 2 and out == ""
    assert_one_line_error(err, re.escape(pattern))


def test_argparse_errors_return_2(capsys, tree):
    rc, out, err = run_cli(capsys, tree.root, "--format", "yaml")
    assert rc == 2 and "invalid choice" in err and "Traceback" not in err


def test_ambiguous_commit_prefix(capsys, tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=40)
    firsts = {}
    for c in tree.commits:
        firsts.setdefault(c[0], []).append(c)
    prefix = next(k for k, v in firsts.items() if len(v) > 1)
    rc, _, err = run_cli(capsys, tree.root, "--base", prefix, "--head", tree.commits[0])
    assert rc == 2
    assert_one_line_error(err, f"commit '{prefix}' is ambiguous")


def test_output_file(capsys, tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    out_file = tmp_path / "summary.md"
    rc, out, _ = run_cli(capsys, tree.root, "--format", "github", "--output", out_file)
    assert rc == 0 and out == ""
    assert out_file.read_text().startswith("### matmul-drift summary")


def test_output_never_replaces_a_file_and_never_waits_on_a_fifo(capsys, tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    machine_json = next(tree.root.rglob("machine.json"))  # a recorded file: the worst to lose
    before = machine_json.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, message in ((machine_json, "exists; remove it"), (fifo, "exists; remove it"),
                            (tmp_path / "no" / "s.md", "its folder does not exist"), ("", "the name is empty"),
                            (f"{tmp_path}/s.md/", "ends in a slash"),
                            ("/proc/s.md", r"its folder is not writable \(")):  # root passes os.access there
        rc, out, err = run_cli(capsys, tree.root, "--output", target)
        assert rc == 2 and out == "", (target, err)
        assert_one_line_error(err, message)
    assert machine_json.read_bytes() == before
    rc, out, _ = run_cli(capsys, tree.root, "--output", os.devnull)  # a device is written to
    assert rc == 0 and out == ""


def test_output_made_while_summarising_is_not_replaced(capsys, tmp_path, monkeypatch):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    target, rendered = tmp_path / "s.md", render.render

    def intrude(*args, **kwargs):  # someone else writes the file after the check
        target.write_text("someone else's")
        return rendered(*args, **kwargs)

    monkeypatch.setattr(render, "render", intrude)
    rc, out, err = run_cli(capsys, tree.root, "--output", target)
    assert rc == 2 and out == "" and target.read_text() == "someone else's"
    assert_one_line_error(err, f"{target} appeared meanwhile and is left as it is; the report is in ")
    kept = err.strip().rsplit(" ", 1)[1]
    assert "matmul-drift summary" in open(kept).read()


# ---------------------------------------------------------------------------- rendering


def _fixture_kernel_names() -> list[str]:
    names = [name for _, name in kernel_names.tagged()]
    # Real names lack a few characters that must be escaped too; these carry them.
    return names + ["gemm|split`k`<*>_tile", "x_y*z [link](http://e.com) @someone $a$ ~~s~~ &amp; \\|"]


def _gfm_cells(md: str) -> list[list[str]]:
    """The text of every table body cell of ``md`` as GitHub renders it (markdown-it's GFM: tables,
    strikethrough, autolinks): <br> as a newline, entities decoded; AssertionError if any other
    markup (emphasis, links, HTML, strikethrough) came out of the text."""
    from html.parser import HTMLParser

    from markdown_it import MarkdownIt

    html_text = MarkdownIt("gfm-like").render(md)

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.rows, self.cell, self.in_body, self.tags = [], None, False, set()

        def handle_starttag(self, tag, attrs):
            self.in_body |= tag == "tbody"
            if tag == "tr" and self.in_body:
                self.rows.append([])
            elif tag == "td":
                self.cell = []
            elif tag == "br" and self.cell is not None:
                self.cell.append("\n")
            elif self.cell is not None:
                self.tags.add(tag)

        def handle_endtag(self, tag):
            self.in_body &= tag != "tbody"  # the next table's header row is no body row
            if tag == "td":
                self.rows[-1].append("".join(self.cell))
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    p = Cells()
    p.feed(html_text)
    assert p.tags <= {"code"}, p.tags  # no <em>, <a>, <s>, <img>, ... made from a name
    return p.rows


def test_github_markdown_keeps_every_kernel_name_intact(capsys, tmp_path):
    names = _fixture_kernel_names()
    # Enough cases that every name gets a combination of its own (tf32 on cpu is skipped: 5 of 6).
    cases = tuple(f"c{k}" for k in range(len(names) // 5 + 1))

    def adjust(ci, ei, data):
        if ci == 1:
            ok = [k for k in range(len(cases) * len(F.DTYPES)) if not math.isnan(F.get_value(data, F.KERNEL, k))]
            for k, name in zip(ok, names):
                kid = catalog.store(tmp_path / "results" / "catalog", "kernels",
                                    {"device": "cpu", "full": ["aten::mm", name]})
                F.set_value(data, F.KERNEL, k, kid)

    tree = F.write_tree(tmp_path / "results", n_commits=2, cases=cases, torch_versions=("2.13.0",),
                        kernel_names=names, adjust=adjust)
    h = history.read_history(tree.root)
    result = summary.summarise(h)
    kernel_flags = [f for f in result.flags if f.kind == "kernel"]
    assert {n for f in kernel_flags for n in names if n in f.detail} == set(names)
    md = render.render_github(result)
    rows = _gfm_cells(md)
    incidents = ordered(result.incidents, summary.DEFAULT_FAIL_ON)
    cells = [c for inc in incidents for c in inc.cells()]
    assert len(rows) == len(cells) + len(result.flags)  # each incident's cells, then its flags
    flag_rows = [r for r in rows if r[0] == "Drift.track_kernel_id"]
    assert len(flag_rows) == len(result.flags) and all(len(r) == len(render.HEADERS) for r in flag_rows)
    # as the text, not markup
    assert [r[4] for r in flag_rows] == [render.cut(f.detail) for inc in incidents for f in inc.flags]
    # raw, names read as themselves: no entity but &amp;, the backslashes before markup only
    assert not re.search(r"&#\d+;", md)
    assert "brg_matmul:avx10_1_512" in md or "splitKreduce_kernel" in md


def test_drift_page_keeps_every_kernel_name_intact_and_injects_nothing(tmp_path):
    from html.parser import HTMLParser

    from matmul_drift.jobs import site

    names = _fixture_kernel_names() + ['cutlass::gemm<float, 128>&amp;</script><script>alert("x")</script>',
                                       "<img src=x onerror='alert(1)'> \" ' &lt;"]
    cases = tuple(f"c{k}" for k in range(len(names) // 5 + 2))  # a spare combination for the missing id
    missing = []

    def adjust(ci, ei, data):
        if ci == 1:
            ok = [k for k in range(len(cases) * len(F.DTYPES)) if not math.isnan(F.get_value(data, F.KERNEL, k))]
            for k, name in zip(ok, names):
                F.set_value(data, F.KERNEL, k, catalog.store(tmp_path / "results" / "catalog", "kernels",
                                                            {"device": "cpu", "full": ["aten::mm", name]}))
            F.set_value(data, F.KERNEL, ok[-1], 0xDEADBEEF)  # an id the catalog lacks
            missing.append(0xDEADBEEF)

    tree = F.write_tree(tmp_path / "results", n_commits=2, cases=cases, torch_versions=("2.13.0",),
                        machine="m\u00e4chine-\u540d", kernel_names=names, adjust=adjust)
    h = history.read_history(tree.root)
    result, runs = latest.runs(h)
    page = site.page(h, result, runs)

    class Cells(HTMLParser):  # the tags the page holds, the text of each <code>, of each kernels row
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.tags, self.code, self.rows, self.in_code, self.row = set(), [], {}, False, None
            self.imgs = []

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)
            if tag == "img":
                self.imgs.append(dict(attrs))
            if tag == "tr" and dict(attrs).get("id", "").startswith("k-"):
                self.row = dict(attrs)["id"]
                self.rows[self.row] = ""
            if tag == "code":
                self.in_code = True
                self.code.append("")

        def handle_endtag(self, tag):
            self.row = None if tag == "tr" else self.row
            self.in_code = self.in_code and tag != "code"

        def handle_data(self, data):
            if self.in_code:
                self.code[-1] += data
            if self.row:
                self.rows[self.row] += data

    p = Cells()
    p.feed(page)
    # the only pictures are the maps' (the fixture maps every combination), none a kernel name made
    assert "script" not in p.tags and p.imgs and all(
        set(i) == {"class", "src", "alt"} and i["class"] == "map" and re.fullmatch(r"maps/[0-9a-f]{12}\.png", i["src"])
        for i in p.imgs), p.imgs
    assert set(names) <= set(p.code)  # each name whole, in a <code> of the kernels table
    assert any(f.kind == "kernel" for f in result.flags)
    assert "m\u00e4chine-\u540d" in html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "not in the catalog" in p.rows[f"k-{missing[0]:012x}"]


def test_json_records_follow_the_documented_schema(capsys, tmp_path):
    i = _idx(dtype="float32")
    tree = _tree_with(tmp_path, lambda d, t: F.set_value(d, F.ERROR_U, i, 50.0))
    rc, doc, _ = run_json(capsys, tree.root)
    assert set(doc) == {"version", "fail_on", "failing", "pairs", "machines", "incidents", "flags",
                        "different_hardware", "method_notes", "timing_notes", "bits_notes", "warnings"}
    assert doc["different_hardware"] == [] and doc["version"] == 2
    assert doc["fail_on"] == ["bits", "kernel", "order", "map", "invariance", "accuracy", "nonfinite", "input", "fix",
                              "timing"]
    f = doc["flags"][0]
    assert set(f) == {"kind", "failing", "benign", "machine", "across", "benchmark", "unit", "params", "before",
                      "after", "detail", "attribution", "repro"}
    inc = doc["incidents"][0]
    assert set(inc) == {"key", "machine", "across", "commit", "cause", "changes", "failing", "verdict", "cells",
                        "repros", "notes", "flags"}
    assert 0 in inc["flags"] and inc["failing"] and re.fullmatch(r"[0-9a-f]{12}", inc["key"])
    assert f["repro"] == "matmul-drift explain --case square --dtype float32 --device cpu"
    assert set(f["before"]) == {"commit", "date", "env", "torch", "value", "status"}
    assert f["params"] == {"case": "square", "dtype": "float32", "device": "cpu"}
    assert f["after"]["value"] == 50.0 and isinstance(f["before"]["date"], int)
    # Every key written is documented in the schema docstring the README copies.
    for key in [*doc, *f, *f["before"], *inc, *inc["repros"][0], "id", "kernels"]:
        assert f'"{key}":' in render.__doc__, key
    # ... and every kind the summary can write, in the schema's list of kinds
    kind_doc = re.search(r'"kind": "kernel",\s*#([^"]*)"failing"', render.__doc__).group(1)
    documented = {k.strip(" #\n") for k in kind_doc.split("|")}
    assert documented == set(flags.KINDS), documented ^ set(flags.KINDS)


def test_every_flag_kind_and_the_default_fail_on_are_documented():
    """docs/summary.md named neither `nonfinite` nor `failure`, and not which kinds fail by
    default (`fix` and `nonfinite` among them): a reader of --format json met kinds it never saw."""
    doc = " ".join((REPO / "docs" / "summary.md").read_text().split())
    assert not [k for k in flags.KINDS if f"`{k}`" not in doc]
    default = ",".join(k for k in flags.KINDS if k in summary.DEFAULT_FAIL_ON)
    assert f"`--fail-on`'s default is `{default}`" in doc


def test_plain_output_groups_by_machine_and_kind(capsys, tmp_path):
    i = _idx(dtype="float32")

    def change(data, cat):
        F.set_value(data, F.ERROR_U, i, 50.0)
        F.set_value(data, F.SLICE_M, i, 4.0)

    tree = _tree_with(tmp_path, change)
    rc, out, _ = run_cli(capsys, tree.root, "--across", "commits")
    heads = re.findall(r"^== (.*) ==$", out, re.M)
    assert heads[1:] == ["the flags, by machine and kind", "synthetic: invariance (1, failing)",
                         "synthetic: accuracy (1, failing)", "output bits not recorded (judged as before)"]
    assert heads[0].startswith("incident 1 (failing): ")
    assert out.splitlines()[0].startswith("matmul-drift summary: 1 incident (1 failing): 2 flags, 2 failing")


# ---------------------------------------------------------------------------- no torch


def test_summary_runs_where_torch_cannot_be_imported(tmp_path):
    i = _idx(dtype="float32")
    tree = _tree_with(tmp_path, lambda d, t: F.set_value(d, F.ERROR_U, i, 50.0))
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
        sys.meta_path.insert(0, NoTorch())
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("the block did not work")
        from matmul_drift.cli.main import main as cli_main
        from matmul_drift.read import history, summary, render
        rc = cli_main(["summary", {str(tree.root)!r}, "--format", "json"])
        assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
        print("EXIT", rc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("EXIT 1")
    assert '"kind": "accuracy"' in proc.stdout


def test_runs_with_different_params_are_compared_on_the_common_combinations(capsys, tmp_path):
    # The older run measured only 'square'; the newer adds 'tall'. Common combinations are
    # compared (by parameter values, not by position), the new ones are not.
    i_new = _idx(case="square", dtype="float32")
    tree = _tree_with(tmp_path, lambda d, c: F.set_value(d, F.ERROR_U, i_new, 50.0))
    data = F.load_results(tree.file(0, 0))
    n = len(F.DTYPES)
    for name, row in data["results"].items():
        row[F.COL["params"]] = [["'square'"], *row[F.COL["params"]][1:]]
        for k in ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75",
                  "stats_number", "stats_repeat"):
            if F.COL[k] < len(row) and row[F.COL[k]] is not None:
                row[F.COL[k]] = row[F.COL[k]][:n]
    # Reverse the dtypes of the old run, so that positions differ as well.
    for name, row in data["results"].items():
        row[F.COL["params"]][1] = row[F.COL["params"]][1][::-1]
        for k in ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75",
                  "stats_number", "stats_repeat"):
            if F.COL[k] < len(row) and row[F.COL[k]] is not None:
                row[F.COL[k]] = row[F.COL[k]][::-1]
    F.write_results(tree.machine_dir, data)
    rc, doc, err = run_json(capsys, tree.root, "--across", "commits")
    assert flag_keys(doc) == {("accuracy", F.ERROR_U, params_of(tree, i_new))}, doc["flags"]
    (f,) = doc["flags"]
    assert f["before"]["value"] == pytest.approx(0.05 + 0.01 * (i_new % 13)) and f["after"]["value"] == 50.0
    # and said once, for the one pair: a combination in one run only is never compared
    (line,) = err.strip().splitlines()
    assert rc == 1 and "the benchmarks' params differ" in line and f"{tree.commits[0][:8]} (" in line, err
    assert doc["warnings"] == [line.split(": warning: ", 1)[1]]  # a JSON reader learns it too


def test_a_value_measured_before_and_skipped_now_is_said_not_flagged(capsys, tree):
    # asv's NaN (skipped: a budget spent, a probe switched off) is never compared, but a value
    # that was measured and is skipped now went without a word: the summary said "no changes"
    i = tree.index("square", "float16", "cpu")
    data = F.load_results(tree.file(2, 0))
    F.set_value(data, F.ERROR_U, i, float("nan"))
    F.write_results(tree.machine_dir, data)
    rc, doc, err = run_json(capsys, tree.root, "--across", "commits")
    assert rc == 0 and doc["flags"] == [], doc["flags"]
    (line,) = [ln for ln in err.splitlines() if "skipped now" in ln]
    assert f"{tree.commits[1][:8]} (" in line and f"-> {tree.commits[2][:8]} (" in line, line
    assert f"1 value measured before is skipped now (asv NaN), not compared: {F.ERROR_U}(square, float16, cpu)" in line
    F.set_value(data, F.ERROR_U, i, None)  # failed: a flag, not this line
    F.write_results(tree.machine_dir, data)
    rc, doc, err = run_json(capsys, tree.root, "--across", "commits")
    assert "skipped now" not in err and [f["kind"] for f in doc["flags"]] == ["failure"], doc["flags"]


def test_timing_without_intervals_falls_back_on_iqr_then_on_the_ratio(capsys, tmp_path):
    devices = ("cpu", "cuda")
    iqr, one = _idx(dtype="float32", devices=devices), _idx(dtype="float64", devices=devices)
    cuda = _idx(dtype="float32", device="cuda", devices=devices)
    apart, overlap = _idx(dtype="float64", device="cuda", devices=devices), _idx(dtype="float16", device="cuda", devices=devices)
    fell = _idx(dtype="bfloat16", device="cuda", devices=devices)
    t = lambda i: 1e-3 * (1 + 0.1 * (i % 7))

    def change(data, cat):
        row = data["results"][F.TIME]
        for k in F.COL:
            if k.startswith("stats_") and F.COL[k] < len(row):
                row[F.COL[k]] = list(row[F.COL[k]])
        F.set_value(data, F.TIME, iqr, t(iqr) * 1.3)  # CI dropped; IQRs (±1 %) apart
        row[F.COL["stats_ci_99_a"]][iqr] = row[F.COL["stats_ci_99_b"]][iqr] = None
        row[F.COL["stats_q_25"]][iqr], row[F.COL["stats_q_75"]][iqr] = t(iqr) * 1.29, t(iqr) * 1.31
        F.set_value(data, F.TIME, one, t(one) * 1.3)  # one sample: the ratio alone
        row[F.COL["stats_repeat"]][one] = 1
        for i, spread in ((cuda, 0.01), (apart, 0.01), (overlap, 0.3), (fell, 0.01)):  # CUDA tracks
            t_new = F.get_value(data, F.CUDA_SECONDS, i) * 1.3
            F.set_value(data, F.CUDA_SECONDS, i, t_new)
            F.set_value(data, F.CUDA_Q20, i, t_new * (1 - spread))
            F.set_value(data, F.CUDA_Q80, i, t_new * (1 + spread))
        for q in (F.CUDA_Q20, F.CUDA_Q80):
            F.set_value(data, q, cuda, None)  # no quantiles recorded (an older suite): the ratio alone
        F.set_value(data, F.CLOCK_FELL, fell, 1.0)
        F.set_env(data, cat, "2.13.0", threads=1)

    cuda_of = {cuda: "float32", apart: "float64", overlap: "float16", fell: "bfloat16"}
    tree = _tree_with(tmp_path, change, devices=devices)
    rc, doc, err = run_json(capsys, tree.root, "--across", "commits", "--timing", "suspects")
    got = {(f["benchmark"], f["params"]["dtype"], f["params"]["device"]):
           re.search(r"suspected \((.*?)\);", f["detail"]).group(1) for f in doc["flags"]}
    # 1.3x apart by quantiles (±1 %) is a suspect; within quantiles of ±30 % it is not; a run
    # whose clock fell is never compared, and a note counts it
    assert got == {(F.TIME, "float32", "cpu"): "IQRs apart", (F.TIME, "float64", "cpu"): "one sample",
                   (F.CUDA_SECONDS, cuda_of[cuda], "cuda"): "no stats",
                   (F.CUDA_SECONDS, cuda_of[apart], "cuda"): "20-80% quantiles apart"}, got
    assert rc == 0
    assert "1 timing difference where the GPU's SM clock fell while timed (not compared)" in " ".join(doc["timing_notes"]), doc["timing_notes"]


# ---------------------------------------------------------------------------- hardware


def _other_cpu(data: dict) -> None:
    data["params"].update(cpu="AMD EPYC 9B14 96-Core Processor", isa="avx2 avx512f")
    for i in range(len(data["results"][F.KERNEL][F.COL["result"]])):
        if F.get_value(data, F.KERNEL, i) is not None and not math.isnan(F.get_value(data, F.KERNEL, i)):
            F.set_value(data, F.KERNEL, i, F.get_value(data, F.KERNEL, i) + 1)  # other routes on that CPU


def test_two_folders_naming_one_machine_keep_the_one_named_for_it(tmp_path, capsys):
    # a copy of the machine's folder under another name, holding the last commit's runs: the
    # later folder once replaced the first without a word, and the first's runs were dropped
    i = _idx(case="square", dtype="float32")
    tree = _tree_with(tmp_path, lambda d, c: F.set_value(d, F.ERROR_U, i, 50.0), n_commits=3)
    rc, doc, err = run_json(capsys, tree.root)
    assert rc == 1 and err == "" and ("accuracy", F.ERROR_U, params_of(tree, i)) in flag_keys(doc)
    twin = tree.machine_dir.parent / ("zz-" + tree.machine_dir.name)
    twin.mkdir()
    shutil.copy(tree.machine_dir / "machine.json", twin)
    for ei in range(len(tree.env_names)):
        shutil.move(tree.file(2, ei), twin)
    rc, doc2, err = run_json(capsys, tree.root)
    (line,) = err.strip().splitlines()
    assert f"skipping results in {twin}" in line and f"as {tree.machine_dir}'s does" in line, err
    assert doc2["pairs"] < doc["pairs"] and not [f for f in doc2["flags"] if f["kind"] == "accuracy"], doc2["flags"]


def test_one_machine_name_on_two_hardwares_is_never_judged_as_one_history(tmp_path, capsys):
    # A newcomer whose host has the committed history's name: commit 2 ran on another CPU,
    # where every route differs. Nothing is flagged across the change; it is named instead.
    root = tmp_path / "results"
    tree = F.write_tree(root, machine="vm", n_commits=3, adjust=lambda ci, ei, d: ci == 2 and _other_cpu(d))
    rc, doc, err = run_json(capsys, root)
    assert rc == 0 and [f for f in doc["flags"] if f["kind"] != "timing"] == [], doc["flags"]
    notes = doc["different_hardware"]
    assert len(notes) == 1 and tree.commits[1][:8] in notes[0] and tree.commits[2][:8] in notes[0]
    assert "AMD EPYC" in notes[0] and "different hardware" in notes[0]
    # commits 0 -> 1 (one hardware) in two environments, and the torch builds at each commit
    assert doc["pairs"] == 2 + 3
    rc, out, _ = run_cli(capsys, root)
    assert "== different hardware (1, not compared) ==" in out
    rc, md, _ = run_cli(capsys, root, "--format", "github")
    assert "different hardware (1, not compared)" in md


@pytest.mark.parametrize("other", [1, 2])
def test_the_sites_run_line_names_the_commit_compared_on_the_same_hardware(tmp_path, other):
    # The drift page's run line said "against" the machine's previous commit even where that
    # ran on other hardware, which the summary never compares.

    root = tmp_path / "results"
    tree = F.write_tree(root, machine="vm", n_commits=3, adjust=lambda ci, ei, d: ci == other and _other_cpu(d))
    result, (run,) = latest.runs(history.read_history(root))
    compared = {p.before.commit for p in pairing.make_pairs(history.read_history(root), summary.Options(at=tree.commits[2]))
                if p.across == "commits"}
    if other == 1:  # commit 2 is judged against commit 0, on its hardware
        assert compared == {tree.commits[0]} and run["line"].endswith(f"; against {tree.commits[0][:8]}"), run["line"]
    else:
        assert compared == set() and run["line"].endswith(
            f"; its first recorded commit on this hardware ({tree.commits[1][:8]} ran on other hardware; not compared)"), run["line"]


def test_across_machines_compares_hardwares_only_when_asked(tmp_path, capsys):
    root = tmp_path / "results"
    F.write_tree(root, machine="box-a", n_commits=2)
    F.write_tree(root, machine="box-b", n_commits=2, adjust=lambda ci, ei, d: _other_cpu(d))
    rc, doc, _ = run_json(capsys, root)
    assert rc == 0 and doc["different_hardware"] == [] and not [f for f in doc["flags"] if f["kind"] == "kernel"]
    rc, doc, _ = run_json(capsys, root, "--across", "machines")
    assert rc == 1 and doc["pairs"] == 2 * 2  # 2 commits x 2 torch builds, box-a against box-b
    kernel = [f for f in doc["flags"] if f["kind"] == "kernel"]
    assert kernel and all(f["machine"] == "box-a vs box-b" and f["across"] == "machines" for f in kernel)


def test_at_keeps_what_one_commit_changed(tmp_path, capsys):
    root = tmp_path / "results"
    tree = F.write_tree(root, n_commits=3)
    h = history.read_history(root)
    pairs = pairing.make_pairs(h, summary.Options(at=tree.commits[2][:10]))
    got = sorted((p.across, p.before.commit, p.after.commit, p.after.env_name) for p in pairs)
    assert got == sorted([("commits", tree.commits[1], tree.commits[2], e) for e in tree.env_names]
                         + [("envs", tree.commits[2], tree.commits[2], tree.env_names[1])])
    rc, _, err = run_cli(capsys, root, "--at", tree.commits[2][:10], "--base", tree.commits[0][:10],
                         "--head", tree.commits[1][:10])
    assert rc == 2 and "--at goes with neither" in err


def test_hardware_params_of_any_json_type_are_compared_not_hashed(tmp_path, capsys):
    # Found by the fuzzer: a results file whose params hold a list where asv writes a string.
    root = tmp_path / "results"
    F.write_tree(root, n_commits=2, adjust=lambda ci, ei, d: ci == 1 and d["params"].update(arch=[], num_cpu=2))
    rc, doc, err = run_json(capsys, root)
    assert rc == 0 and "Traceback" not in err
    assert len(doc["different_hardware"]) == 1 and "different hardware" in doc["different_hardware"][0]


def test_control_and_bidi_characters_are_escaped_in_every_output(tmp_path):
    evil = "gemm\u202eKCATTA\u202c\x1b[31m\x07\u2066x\u2069\x85\nnext line"

    def adjust(ci, ei, data):
        if ci == 1:
            kid = catalog.store(tmp_path / "results" / "catalog", "kernels", {"device": "cpu", "full": ["aten::mm", evil]})
            F.set_value(data, F.KERNEL, 0, kid)

    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",), adjust=adjust)
    result = summary.summarise(history.read_history(tree.root))
    assert any(evil.replace("\n", "\\u000a") in f.detail for f in result.flags)  # a detail's lines are its own
    raw = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
    plain, md, js = render.render_plain(result), render.render_github(result), render.render_json(result)
    for text in (plain, md, js):
        assert not raw.search(text), repr(text[:200])
    assert "\\u202e" in plain and "\\\\u202e" in md  # shown as text (the backslash escaped in Markdown)
    assert "\\u000anext line" in plain  # the name's newline is shown, not made
    doc = json.loads(js)
    assert any(evil in f["after"]["kernels"]["full"] for f in doc["flags"])  # JSON escapes: the same data back


def test_a_torch_version_longer_than_int_takes_is_read(tmp_path, capsys):
    def adjust(ci, ei, d):
        if ci == 2 and ei == 0:
            d["params"]["torch"] = "1." + "9" * 5000  # past Python's 4300-digit int()
            del d["results"][F.ENV]  # no env-id: the version comes from asv's params
    F.write_tree(tmp_path / "results", adjust=adjust)
    rc, doc, err = run_json(capsys, tmp_path / "results")
    assert rc == 0 and doc["flags"] is not None and "Traceback" not in err


@pytest.mark.parametrize("later", [{"gpu": "none"}, {"num_cpu": 2}, {"arch": "aarch64"}])
def test_hardwares_described_alike_keep_their_runs(tmp_path, capsys, later):
    """A kernel change from commit 0 to 1 on one hardware; commit 2's params spell the same
    hardware otherwise (no gpu recorded, then "none"; "2" cpus, then 2) or name another
    arch. The change is flagged either way: no group's runs are dropped under another's label."""
    root = tmp_path / "results"

    def adjust(ci, ei, d):
        if ci == 1 and ei == 0:
            kid = catalog.store(root / "catalog", "kernels", {"device": "cpu", "full": ["aten::mm", "NEW"]})
            F.set_value(d, F.KERNEL, 0, kid)
        if ci == 2:
            d["params"].update(later)
    F.write_tree(root, adjust=adjust)
    rc, doc, _ = run_json(capsys, root)
    assert rc == 1 and [f["kind"] for f in doc["flags"] if f["kind"] != "timing"].count("kernel") >= 1, doc["flags"]
    assert len(doc["different_hardware"]) == ("arch" in later)
    groups = pairing.hardware_groups(history.read_history(root))
    assert sum(len(runs) for runs in groups.values()) == 3 * 2  # 3 commits x 2 torch builds, none dropped


def test_an_unchanged_error_is_never_flagged_whatever_its_value(tmp_path, capsys):
    F.write_tree(tmp_path / "results", adjust=lambda ci, ei, d: F.set_value(d, F.ERROR_U, 0, -1.0))
    rc, doc, _ = run_json(capsys, tmp_path / "results")
    assert rc == 0 and [f for f in doc["flags"] if f["kind"] == "accuracy"] == [], doc["flags"]



def test_a_kernel_change_in_several_lists_shows_one_line_each(tmp_path, capsys):
    # The detail's lines once showed as a literal \u000a in the plain and Markdown tables.
    root = tmp_path / "results"

    def adjust(ci, ei, d):
        if ci == 1 and ei == 0:
            kid = catalog.store(root / "catalog", "kernels", {"device": "cpu", "full": ["aten::mm", "NEW"],
                                                               "slice_n": ["aten::mm", "X"]})
            F.set_value(d, F.KERNEL, 0, kid)
    F.write_tree(root, adjust=adjust)
    rc, out, _ = run_cli(capsys, root)
    assert rc == 1 and "u000a" not in out and re.search(r"^ +slice_n: .* -> aten::mm, X", out, re.M), out
    rc, md, _ = run_cli(capsys, root, "--format", "github")
    assert "u000a" not in md and re.search(r"-> aten::mm, NEW<br>slice_n: ", md), md


def test_a_change_across_a_torch_build_without_the_value_is_flagged(capsys, tmp_path):
    # Three builds at one commit; the middle one failed one kernel-id and did not run the order-id
    # benchmark: the last is judged against the first, as on the commits axis.
    k, o = _idx(dtype="float32"), _idx(dtype="bfloat16")
    new_kernel, new_order = _new_ids(tmp_path / "results")

    def adjust(ci, ei, data):
        if ei == 1:
            F.set_value(data, F.KERNEL, k, None)
            del data["results"][F.ORDER_ID]
        if ei == 2:
            F.set_value(data, F.KERNEL, k, new_kernel)
            F.set_value(data, F.ORDER_ID, o, new_order)

    tree = F.write_tree(tmp_path / "results", n_commits=1, torch_versions=("2.12.0", "2.13.0", "2.14.1"), adjust=adjust)
    rc, doc, _ = run_json(capsys, tree.root, "--across", "envs", "--fail-on", "kernel,order")
    judged = {(f["kind"], f["benchmark"]): f for f in doc["flags"] if f["kind"] != "failure"}
    assert set(judged) == {("kernel", F.KERNEL), ("order", F.ORDER_ID)}, doc["flags"]
    assert all((f["across"], f["before"]["torch"], f["after"]["torch"]) == ("envs", "2.12.0+cpu", "2.14.1+cpu")
               for f in judged.values())
    assert judged["kernel", F.KERNEL]["after"]["id"] == ids.hex_id(new_kernel)
    assert rc == 1 and doc["failing"] == 2


def test_failing_flags_come_before_informational_ones_whatever_the_machine(tmp_path):
    """Machine "a" changed a time (held at the next run: a flag, informational), machine "b" a
    kernel (failing): b's kernel is read first, then a's timing, then the notes."""
    i = _idx(dtype="float32")
    cat = tmp_path / "results" / "catalog"

    def slower(ci, ei, data):
        if ci >= 1:
            F.set_env(data, cat, "2.13.0", threads=1)
            _set_time(data, i, F.get_value(data, F.TIME, i) * 2, 1e-6)

    F.write_tree(tmp_path / "results", machine="a", n_commits=3, torch_versions=("2.13.0",), adjust=slower)
    new_kernel, _ = _new_ids(tmp_path / "results")
    F.write_tree(tmp_path / "results", machine="b", n_commits=2, torch_versions=("2.13.0",),
                 adjust=lambda ci, ei, d: ci and F.set_value(d, F.KERNEL, i, new_kernel))
    result = summary.summarise(history.read_history(tmp_path / "results"), summary.Options())
    heads = re.findall(r"^== (.*) ==$", render.render_plain(result, frozenset({"kernel"})), re.M)
    assert heads[0].startswith("incident 1 (failing): ") and heads[1].startswith("incident 2 (informational): ")
    assert heads[3:5] == ["b: kernel (1, failing)", "a: timing (1, informational)"], heads
    md = render.render_github(result, frozenset({"kernel"}))
    assert md.index("Time.time_matmul") > md.index("Drift.track_kernel_id")


@pytest.mark.parametrize("case,dtype,device", [("x; rm -rf ~", "float32", "cpu"), ("square", "$(id)", "cpu"),
                                               ("tall", "float32", "cpu"), ("square", "float32", "cpu`")])
def test_a_repro_is_built_only_from_names_the_case_catalog_knows(case, dtype, device):
    side = flags.Side("c" * 40, "env", "2.13.0", 0)
    flag = flags.Flag("kernel", "m", "commits", F.KERNEL, "kernel-id", {"case": case, "dtype": dtype, "device": device},
                        side, side, "d")
    assert rules.repro(flag) is None
    ok = flags.Flag("kernel", "m", "commits", F.KERNEL, "kernel-id",
                      {"case": "linear", "dtype": "float32-tf32", "device": "cuda"}, side, side, "d")
    assert rules.repro(ok) == "matmul-drift explain --case linear --dtype float32-tf32 --device cuda"
