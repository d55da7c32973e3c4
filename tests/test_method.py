"""The measuring method (core/series.py METHOD): every result records it, the summary never
judges a series across a change of it (one note instead), and the code behind each series
cannot change without its version moving or the change being recorded as keeping it."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import shutil
from pathlib import Path

import asv_fixtures as F

from matmul_drift.core import series
from matmul_drift.read import history, summary
from matmul_drift.store import catalog

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "matmul_drift"
GOLDEN = ROOT / "tests" / "fixtures" / "method.json"

# The code that decides what each series records. A change to any of it changes what the suite
# may measure, so its fingerprint must be one that GOLDEN lists under the series' current version.
_VALUES = ["jobs/suite.py", "measure/measure.py", "measure/record.py", "core/cases.py", "measure/inputs.py"]
_ACCURACY = [*_VALUES, "measure/reference.py", "core/numerics.py", "core/blocks.py"]
SOURCES = {
    "error_u": _ACCURACY, "nonfinite": _ACCURACY, "gamma_k_u": _ACCURACY, "slice_n_ulp": _ACCURACY,
    "slice_m_ulp": _ACCURACY, "run_to_run_ulp": _ACCURACY,
    "kernel_id": [*_VALUES, "measure/kernels.py", "core/routes.py", "core/blaslog.py"],
    "input_id": _VALUES,
    "bits_id": _VALUES,  # the outputs measure_operands holds, hashed there
    "cuda_seconds": _VALUES, "cuda_q20_seconds": _VALUES, "cuda_q80_seconds": _VALUES, "cuda_clock_fell": _VALUES,
    "fix_cost": [*_VALUES, "probes/fixes.py", "probes/fixfind.py", "probes/fixrun.py"],
    "fix_id": [*_VALUES, "probes/fixes.py", "probes/fixfind.py", "probes/fixrun.py"],
    "order_id": [*_VALUES, "probes/order.py", "probes/order_tree.py", "probes/order_replay.py",
                 "probes/order_plan.py", "core/trees.py"],
    "map_id": [*_VALUES, "measure/kernels.py", "core/routes.py", "core/blaslog.py", "core/numerics.py",
               "measure/batchpoint.py", "probes/scan.py", "probes/classsearch.py", "probes/records.py",
               "probes/batchmap.py", "probes/batchmap_run.py", "core/mapruns.py"],
    "time_matmul": [*_VALUES, "../../benchmarks/timing.py"],
}


def fingerprint(package: Path, files: list[str]) -> str:
    """sha256 over the modules' syntax trees, docstrings left out: comments, docstrings and
    formatting may change freely; anything the interpreter runs may not."""
    h = hashlib.sha256()
    for rel in files:
        tree = ast.parse((package / rel).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        h.update(rel.encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    return h.hexdigest()[:16]


def stale(package: Path) -> list[str]:
    golden = json.loads(GOLDEN.read_text())
    out = []
    for key, files in SOURCES.items():
        fp = fingerprint(package, files)
        if fp not in golden.get(key, {}).get(str(series.METHOD[key]), []):
            out.append(f"{key} (method {series.METHOD[key]}): {fp}")
    return out


def test_every_series_has_a_method_and_its_sources():
    assert set(SOURCES) == set(series.METHOD)
    assert {series.method_key(n) for n in (f"drift.Drift.track_{u}" for u in series.UNITS)} - {None} \
        == set(series.METHOD) - {"time_matmul"}
    assert series.method_key("timing.Time.time_matmul") == "time_matmul"
    for name, version, commit, what in series.METHOD_CHANGES:
        assert 1 < version <= series.METHOD[name] and len(commit) == 40 and what


def test_the_code_behind_each_series_is_that_of_its_method_version():
    """Fails when code that decides what a series records changes. Then either bump METHOD[key]
    (core/series.py) and add a METHOD_CHANGES line, or, where what is recorded stays the same
    (a rename, a refactor), add the new fingerprint to tests/fixtures/method.json under the
    current version. Either way the change is a decision someone made."""
    assert not stale(PACKAGE), ("the code behind these series changed without their method moving: "
                                f"{stale(PACKAGE)}; see this test's docstring")


def test_a_change_to_what_the_suite_measures_is_caught(tmp_path):
    copy = tmp_path / "src" / "matmul_drift"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "site_vendor"))
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "timing.py", tmp_path / "benchmarks" / "timing.py")
    kernels = copy / "measure" / "kernels.py"
    kernels.write_text(kernels.read_text() + "\n\ndef normalise_more(name):\n    return name.lower()\n")
    assert [s.split(" ")[0] for s in stale(copy)] == ["kernel_id", "map_id"]  # a map's states hold kernel-ids
    trees = copy / "core" / "trees.py"
    trees.write_text(trees.read_text().replace('"""', '"""Docstrings may change. ', 1) + "\n# so may comments\n")
    assert [s.split(" ")[0] for s in stale(copy)] == ["kernel_id", "map_id"]


def test_the_environment_records_the_method():
    from matmul_drift.measure import environment

    assert environment.describe("cpu")["method"] == series.METHOD


# ---------------------------------------------------------------------------- judging


def test_the_committed_history_reads_its_method_changes_as_notes_not_flags(monkeypatch, committed_results):
    """At b505477 the committed history held 30 kernel flags (intel-xeon-amx-2c-32d676,
    0f15837e -> 341f96ba -> 72056fb1) and 2 failing order flags (amd-epyc-avx512-2c-ba0ecb,
    9cc27615 -> d8ed3b76), all this project's own method changes."""
    hist = history.read_history(committed_results)
    now = summary.summarise(hist)
    assert not [f for f in now.flags if f.kind in ("kernel", "order")]
    notes = "\n".join(now.method_notes)
    assert "intel-xeon-amx-2c-32d676: kernel_id: method 1 -> 3 between 0f15837e and 341f96ba" in notes
    assert "intel-xeon-amx-2c-32d676: kernel_id: method 3 -> 4 between 341f96ba and 72056fb1" in notes
    assert "amd-epyc-avx512-2c-ba0ecb: order_id: method 1 -> 2 between 9cc27615 and d8ed3b76" in notes
    monkeypatch.setattr(series, "METHOD_CHANGES", ())  # every result one method: the flags as they were
    before = summary.summarise(history.read_history(committed_results))
    kinds = [f.kind for f in before.flags]
    assert (kinds.count("kernel"), kinds.count("order")) == (30, 2)
    # asv's own versions still part runs; b001e055's results record their methods themselves
    assert sorted(n for n in before.method_notes if "benchmark code changed" not in n) == [
        f"amd-epyc-avx512-2c-ba0ecb: {key}: method 1 -> {v} between d8ed3b76 and b001e055"
        for key, v in (("cuda_seconds", 3), ("kernel_id", 6), ("nonfinite", 2))]


def _with_env(tree: F.Tree, ci: int, ei: int, **changes) -> None:
    """Results (commit ci, env ei) re-recorded with an env entry changed by ``changes``."""
    path = tree.file(ci, ei)
    data = F.load_results(path)
    entry = {**F.env_entry(tree.torch[ei]), **changes}
    env_id = catalog.store(tree.catalog_dir, "env", entry)
    row = data["results"][F.ENV][F.COL["result"]]
    data["results"][F.ENV][F.COL["result"]] = [v if v is None or (isinstance(v, float) and math.isnan(v)) else env_id
                                               for v in row]
    F.write_results(tree.machine_dir, data)


def _new_kernel(tree: F.Tree, ci: int, ei: int, i: int) -> None:
    path = tree.file(ci, ei)
    data = F.load_results(path)
    F.set_value(data, F.KERNEL, i, catalog.store(tree.catalog_dir, "kernels", {"device": "cpu", "full": ["other"]}))
    F.write_results(tree.machine_dir, data)


def test_a_kernel_change_under_one_method_is_flagged(tmp_path):
    """The same commit run with MKL_CBWR=COMPATIBLE in one environment: a kernel flag, failing,
    attributed to the setting."""
    tree = F.write_tree(tmp_path / "results", n_commits=1)
    i = tree.index("square", "float32", "cpu")
    _with_env(tree, 0, 1, env_vars={"MKL_CBWR": "COMPATIBLE"})
    _new_kernel(tree, 0, 1, i)
    s = summary.summarise(history.read_history(tmp_path / "results"))
    kernel = [f for f in s.flags if f.kind == "kernel"]
    assert len(kernel) == 1 and kernel[0].params == {"case": "square", "dtype": "float32", "device": "cpu"}
    assert "env_vars.MKL_CBWR: none -> COMPATIBLE" in kernel[0].attribution, kernel[0].attribution
    assert kernel[0] in s.failing(summary.DEFAULT_FAIL_ON) and not s.method_notes


def test_a_kernel_change_across_a_method_change_is_one_note(tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    method = {**series.METHOD, "kernel_id": series.METHOD["kernel_id"] + 1}
    for ei in (0, 1):
        _with_env(tree, 1, ei, method=method)
        for case in ("square", "tall"):
            _new_kernel(tree, 1, ei, tree.index(case, "float32", "cpu"))
    s = summary.summarise(history.read_history(tmp_path / "results"))
    assert not [f for f in s.flags if f.kind == "kernel"] and not s.failing(summary.DEFAULT_FAIL_ON)
    v = series.METHOD["kernel_id"]
    assert s.method_notes == [f"synthetic: kernel_id: method {v} -> {v + 1} between {tree.commits[0][:8]} and "
                              f"{tree.commits[1][:8]}"]


def test_a_result_without_a_method_is_compared_as_before_and_said_so(tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    for ei in (0, 1):
        _with_env(tree, 0, ei, method=None)
    _new_kernel(tree, 1, 0, tree.index("square", "float32", "cpu"))
    s = summary.summarise(history.read_history(tmp_path / "results"))
    assert [(f.kind, f.across) for f in s.flags] == [("kernel", "commits"), ("kernel", "envs")]
    assert s.method_notes == [f"synthetic: the measuring method of the results at {tree.commits[0][:8]} is not "
                              "recorded and git does not know their commit; they are compared as before"]
