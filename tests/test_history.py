"""The reader of asv history: format, order, NaN vs null, bad input, fuzzed files."""

from __future__ import annotations

import json
import math
import shutil

import asv_fixtures as F
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matmul_drift.read import history, pairing, summary


@pytest.fixture
def tree(tmp_path):
    return F.write_tree(tmp_path / "results", n_commits=3)


def test_reads_every_file_in_date_then_torch_order(tree):
    h = history.read_history(tree.root)
    runs = h.runs["synthetic"]
    assert len(runs) == 3 * 2
    assert [(r.commit, r.torch) for r in runs] == [
        (c, f"{t}+cpu") for c in tree.commits for t in tree.torch
    ]
    assert [r.date for r in runs] == sorted(r.date for r in runs)
    # The kernels and env ids are 48-bit integers, held exactly.
    s = runs[0].series[F.KERNEL]
    assert s.values.shape == (len(tree.combos),)
    i = tree.index("square", "float32", "cpu")
    assert s.values[i] == F.load_results(tree.file(0, 0))["results"][F.KERNEL][0][i]


def test_asv_itself_reads_the_fixture_the_same_way(tree):
    # The fixture claims asv's format: asv's own loader must agree with ours value by value.
    asv_results = pytest.importorskip("asv.results")
    h = history.read_history(tree.root)
    for run in h.runs["synthetic"]:
        r = asv_results.Results.load(str(run.path), machine_name="synthetic")
        assert r.commit_hash == run.commit and r.env_name == run.env_name
        for name, s in run.series.items():
            theirs = r.get_result_value(name, r.get_result_params(name))
            assert [v is None for v in theirs] == s.failed.tolist()
            ours = [None if f else v for v, f in zip(s.values.tolist(), s.failed)]
            assert all((a is None and b is None) or (a == b) or (math.isnan(a) and math.isnan(b))
                       for a, b in zip(ours, theirs))
            if s.stats is not None:
                stats = r.get_result_stats(name, r.get_result_params(name))
                for k, st_ in enumerate(stats):
                    if st_:  # asv gives {} where a combination has no stats
                        assert s.stats["ci_99_a"][k] == st_["ci_99_a"]
                        assert s.stats["q_75"][k] == st_["q_75"]


def test_skipped_and_failed_are_kept_apart(tmp_path):
    def adjust(ci, ei, data):
        F.set_value(data, F.ERROR_U, 0, None)  # failed
        F.set_value(data, F.ERROR_U, 1, math.nan)  # skipped

    tree = F.write_tree(tmp_path / "results", n_commits=1, torch_versions=("2.13.0",), adjust=adjust)
    s = history.read_history(tree.root).runs["synthetic"][0].series[F.ERROR_U]
    assert [s.status(0), s.status(1), s.status(2)] == ["failed", "skipped", "ok"]
    assert np.isnan(s.values[0]) and np.isnan(s.values[1])
    # asv writes an all-failed column as a single null: every combination failed.
    data = F.load_results(tree.file(0, 0))
    data["results"][F.ERROR_U][F.COL["result"]] = None
    F.write_results(tree.machine_dir, data)
    s = history.read_history(tree.root).runs["synthetic"][0].series[F.ERROR_U]
    assert s.failed.all() and s.values.shape == (len(tree.combos),)


def test_a_one_sample_timing_as_asv_writes_it_is_read_without_a_warning(tmp_path, capsys):
    # `asv run --quick` (matmul-drift run --quick) times one sample, and asv writes its 99 % CI as
    # [-Infinity, Infinity]. Each file drew "N values are not finite numbers, skipped": a warning
    # that data was lost, on asv's own output, though every time was read.
    from asv_runner.statistics import compute_stats

    from matmul_drift.cli.main import main as cli_main

    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",))
    data = F.load_results(tree.file(1, 0))
    before = F.load_results(tree.file(0, 0))["results"][F.TIME][F.COL["result"]]
    i = tree.index("square", "float32", "cpu")
    for k, v in enumerate(before):
        if v is None or math.isnan(v):
            continue
        value, stats = compute_stats([v * 1.5 if k == i else v], 1)  # asv's own numbers
        F.set_value(data, F.TIME, k, value)
        row = data["results"][F.TIME]
        for col in ("ci_99_a", "ci_99_b", "q_25", "q_75", "repeat"):
            row[F.COL["stats_" + col]] = list(row[F.COL["stats_" + col]])
            row[F.COL["stats_" + col]][k] = stats[col]
    F.set_env(data, tree.catalog_dir, "2.13.0", threads=1)  # a setting changed: the suspect is worth asking about
    F.write_results(tree.machine_dir, data)
    assert "-Infinity" in tree.file(1, 0).read_text()
    h = history.read_history(tree.root)
    s = h.runs[tree.machine][1].series[F.TIME]
    assert h.warnings == [] and s.stats["ci_99_a"][i] == -math.inf and s.stats["ci_99_b"][i] == math.inf
    assert s.values[i] == before[i] * 1.5
    # one sample: the ratio alone makes a suspect; 1.5x is one, the unchanged times are not
    # (--timing suspects lists it: the next run or a re-measurement would decide)
    assert cli_main(["summary", str(tree.root), "--format", "json", "--timing", "suspects"]) == 0
    out, err = capsys.readouterr()
    flags = json.loads(out)["flags"]
    assert err == "" and [(f["kind"], f["params"]["dtype"], f["params"]["case"], f["detail"]) for f in flags] == [
        ("timing", "float32", "square", f"1.5x slower, suspected (one sample); as recorded {before[i] * 1e3:.3g} ms "
                                        f"-> {before[i] * 1.5e3:.3g} ms (1.5x slower)")]


def test_observations_are_keyed_by_machine_env_commit_benchmark_params(tree):
    h = history.read_history(tree.root)
    obs = {(o.machine, o.env_name, o.commit, o.benchmark, tuple(o.params.items())): o
           for o in h.observations()}
    key = ("synthetic", tree.env_names[1], tree.commits[2], F.ERROR_U,
           (("case", "tall"), ("dtype", "float32"), ("device", "cpu")))
    i = tree.index("tall", "float32", "cpu")
    assert obs[key].value == F.load_results(tree.file(2, 1))["results"][F.ERROR_U][0][i]
    assert obs[key].status == "ok"
    skipped = obs[key[:4] + ((("case", "tall"), ("dtype", "float32-tf32"), ("device", "cpu")),)]
    assert skipped.status == "skipped"
    assert len(obs) == 3 * 2 * len(F.BENCHMARKS) * len(tree.combos)


@pytest.mark.parametrize("lo,hi", [
    ("2.9.0", "2.13.0"), ("2.13.0", "2.14.1"), ("2.10.0", "2.10.1"), ("2.14.0rc1", "2.14.0"),
    ("2.14.0.dev20250101", "2.14.0rc1"), ("2.14.0", "2.14.0.post1"), ("==2.9.1", "2.10.0+cpu"),
])
def test_versions_compare_numerically(lo, hi):
    assert history.version_key(lo) < history.version_key(hi)


def test_version_spellings_of_one_release_compare_equal_but_for_the_label():
    assert history.version_key("==2.13.0")[:2] == history.version_key("2.13.0+cpu")[:2]
    assert history.version_key("2.13")[:2] == history.version_key("2.13.0")[:2]
    assert history.version_key(None) > history.version_key("99.0")


def test_torch_versions_are_ordered_numerically_within_a_commit(tmp_path):
    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0", "2.9.0", "2.10.1"))
    h = history.read_history(tree.root)
    runs = h.runs["synthetic"]
    assert [r.torch for r in runs[:3]] == ["2.9.0+cpu", "2.10.1+cpu", "2.13.0+cpu"]
    pairs = pairing.make_pairs(h, summary.Options(across="envs"))
    assert [(p.before.torch, p.after.torch) for p in pairs[:2]] == [
        ("2.9.0+cpu", "2.10.1+cpu"), ("2.10.1+cpu", "2.13.0+cpu")]


def test_torch_version_falls_back_on_asv_params_without_catalog(tree):
    shutil.rmtree(tree.catalog_dir / "env")
    h = history.read_history(tree.root)
    assert {r.torch for r in h.runs["synthetic"]} == {"2.13.0", "2.14.1"}
    assert any("catalog entry env/" in w for w in h.warnings)


def test_results_dir_or_asv_dir_both_work(tree):
    a = history.read_history(tree.root)
    b = history.read_history(tree.asv_dir)
    assert a.catalog.root == b.catalog.root == tree.catalog_dir
    assert [r.path for r in a.runs["synthetic"]] == [r.path for r in b.runs["synthetic"]]


def test_catalog_entries_are_read_once(tree):
    h = history.read_history(tree.root)
    ident = h.runs["synthetic"][0].series[F.KERNEL].values[0]
    first = h.catalog.get("kernels", ident)
    (tree.catalog_dir / "kernels" / f"{int(ident):012x}.json").unlink()
    assert h.catalog.get("kernels", ident) == first  # served from the cache


def test_rows_with_other_params_are_read_as_they_are(tmp_path):
    # An older run measured fewer cases: its row carries its own params; nothing is lost.
    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",))
    data = F.load_results(tree.file(0, 0))
    row = data["results"][F.ERROR_U]
    n_square = len(F.DTYPES)
    row[F.COL["params"]] = [["'square'"], row[F.COL["params"]][1], row[F.COL["params"]][2]]
    row[F.COL["result"]] = row[F.COL["result"]][:n_square]
    F.write_results(tree.machine_dir, data)
    s = history.read_history(tree.root).runs["synthetic"][0].series[F.ERROR_U]
    assert s.params[0] == ("'square'",) and s.values.size == n_square


# ---------------------------------------------------------------------------- bad input


def test_missing_directory(tmp_path):
    with pytest.raises(history.HistoryError, match="does not exist"):
        history.read_history(tmp_path / "nope")


def test_empty_directory(tmp_path):
    (tmp_path / "results").mkdir()
    with pytest.raises(history.HistoryError, match="no asv results"):
        history.read_history(tmp_path / "results")


def test_unknown_machine_names_the_known_ones(tree):
    with pytest.raises(history.HistoryError, match="unknown machine 'other'.*synthetic"):
        history.read_history(tree.root, machine="other")


def test_missing_benchmarks_json(tree):
    (tree.asv_dir / "benchmarks.json").unlink()
    with pytest.raises(history.HistoryError, match="benchmarks.json is missing"):
        history.read_history(tree.root)


def test_machine_without_machine_json_is_skipped_with_a_warning(tree):
    other = tree.asv_dir / "stray"
    other.mkdir()
    shutil.copy(tree.file(0, 0), other)
    h = history.read_history(tree.root)
    assert list(h.runs) == ["synthetic"]
    assert any(str(other) in w and "machine.json" in w for w in h.warnings)


@pytest.mark.parametrize("damage,reason", [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: "\x00\x01garbage", "not valid JSON"),
    (lambda text: text.replace('"version": 2', '"version": 1'), "format version 1"),
    (lambda text: text.replace('"version": 2', '"version": 3'), "format version 3"),
    (lambda text: text.replace('"commit_hash"', '"commit"'), "no commit_hash"),
])
def test_a_bad_results_file_is_named_and_the_rest_is_read(tree, damage, reason):
    bad = tree.file(1, 0)
    bad.write_text(damage(bad.read_text()))
    h = history.read_history(tree.root)
    assert len(h.runs["synthetic"]) == 5
    assert [w for w in h.warnings if str(bad) in w and reason in w]


def test_non_utf8_file_is_named(tree):
    bad = tree.file(0, 1)
    bad.write_bytes(b"\xff\xfe{\x00")
    h = history.read_history(tree.root)
    assert [w for w in h.warnings if str(bad) in w and "UTF-8" in w]


def test_nothing_readable_is_an_error_that_keeps_the_warnings(tree):
    for p in tree.files:
        p.write_text("{")
    with pytest.raises(history.HistoryError, match="no readable") as exc:
        history.read_history(tree.root)
    assert len(exc.value.warnings) == len(tree.files)


# ---------------------------------------------------------------------------- fuzzing


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=6,
)


@st.composite
def _broken(draw, text: str):
    raw = text.encode()
    mode = draw(st.sampled_from(["truncate", "garbage", "splice", "structure"]))
    if mode == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if mode == "garbage":
        return draw(st.binary(max_size=300))
    if mode == "splice":
        pos = draw(st.integers(0, len(raw)))
        return raw[:pos] + draw(st.binary(min_size=1, max_size=20)) + raw[pos + draw(st.integers(0, 20)):]
    # structure: replace one node of the parsed document by another JSON value
    data = json.loads(text)
    node = data
    while True:
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        k = draw(st.sampled_from(keys))
        child = node[k]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            node = child
            continue
        node[k] = draw(_json_values)
        break
    return json.dumps(data).encode()


_SAMPLE = None


def _sample_text(tmp_path_factory) -> tuple[F.Tree, str]:
    global _SAMPLE
    if _SAMPLE is None:
        tree = F.write_tree(tmp_path_factory.mktemp("fuzz") / "results", n_commits=2,
                            torch_versions=("2.13.0", "2.14.1"))
        _SAMPLE = (tree, tree.file(1, 0).read_text())
    return _SAMPLE


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_results_file_never_raises_and_is_named(tmp_path_factory, data):
    tree, text = _sample_text(tmp_path_factory)
    target = tree.file(1, 0)
    blob = data.draw(_broken(text))
    target.write_bytes(blob)
    try:
        h = history.read_history(tree.root)  # must not raise: three other files are fine
        loaded = {r.path for r in h.runs["synthetic"]}
        if target not in loaded:
            assert [w for w in h.warnings if str(target) in w], h.warnings
        summary.summarise(h)  # and judging what was read must not raise either
    finally:
        target.write_text(text)
