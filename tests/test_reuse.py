"""A night costs what changed (jobs/reuse.py, suite.add_orders, suite.add_fixes, suite.add_maps):
a combination whose kernel, environment and input ids equal the last recorded result's has its
tree replayed on fresh draws, its recorded fixes tried once and its map confirmed at each run's
first and last M, instead of being measured again; anything that does not hold, or cannot be
read, is measured afresh and says why.

The record is written in asv's results format from a first measurement on this machine (the
main job's own round trip through real asv is in test_mainjob.py)."""

from __future__ import annotations

import io
import itertools
import json
import math
import re
import shutil

import asv_fixtures as F
import pytest

from matmul_drift.core import ids
from matmul_drift.jobs import reuse, suite
from matmul_drift.jobs.selection import Cell
from matmul_drift.probes import fixfind, order_plan, order_tree
from matmul_drift.store import catalog

CASES, PRECISIONS, DEVICES = ("bmm", "linear"), ("float32", "bfloat16"), ("cpu",)
COMMIT = "c0ffee" + "0" * 34
SERIES = (*reuse.SAME, *reuse.KEPT, "slice_m_ulp", "slice_n_ulp", "run_to_run_ulp")


def write_record(out: dict, folder, commit: str = COMMIT, started: int = 1_800_000_000_000, env_name: str = "env-a"):
    """``out`` (measure_all's) as asv writes a results file: NaN where skipped, null where failed."""
    params = [[repr(c) for c in CASES], [repr(p) for p in PRECISIONS], [repr(d) for d in DEVICES]]
    results = {}
    for name in SERIES:
        values = []
        for combo in itertools.product(CASES, PRECISIONS, DEVICES):
            v = out.get(Cell(*combo), {})
            values.append(None if "error" in v else v.get(name, math.nan))
        row = [None] * len(F.RESULT_COLUMNS)
        row[F.COL["result"]], row[F.COL["params"]], row[F.COL["started_at"]] = values, params, started
        results[f"drift.Drift.track_{name}"] = row[: F.COL["started_at"] + 1]
    data = {"commit_hash": commit, "env_name": env_name, "date": 1_700_000_000_000, "params": {"machine": folder.name},
            "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": F.RESULT_COLUMNS,
            "results": results, "durations": {}, "version": 2}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{commit[:8]}-{env_name}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The first measurement, afresh: (catalog root, its values, its log, the record of it)."""
    base = tmp_path_factory.mktemp("reuse")
    log = io.StringIO()
    out = suite.measure_all(CASES, PRECISIONS, DEVICES, root=base / "catalog", log=log)
    assert all("skip" not in v and "error" not in v for v in out.values()), out
    return base / "catalog", out, log.getvalue(), write_record(out, base / "asv" / "this-machine")


def again(first, tmp_path, monkeypatch, record=None, edit=None, only=None, **env):
    """measure_all once more, on a copy of the first's catalog, reusing ``record`` (default: the
    first's; ``edit(data, root)`` may change it first), of every cell or of the cell ``only``.
    Returns (values, log)."""
    root, out, _, path = first
    shutil.copytree(root, tmp_path / "catalog")
    if edit:
        data = json.loads(path.read_text())
        edit(data, tmp_path / "catalog")
        path = tmp_path / "asv" / "this-machine" / path.name
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(data))
    monkeypatch.setenv(reuse.REUSE_VAR, str(record or path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = io.StringIO()
    cells = (CASES, PRECISIONS, DEVICES) if only is None else tuple((x,) for x in only)
    got = suite.measure_all(*cells, root=tmp_path / "catalog", log=log)
    return got, log.getvalue()


def _drifting(out: dict) -> list[str]:
    return [k for k, v in out.items() if suite._drifts(v)]


def _set(data: dict, name: str, key: str, value) -> None:
    i = list(itertools.product(CASES, PRECISIONS, DEVICES)).index(tuple(key))
    data["results"][f"drift.Drift.track_{name}"][F.COL["result"]][i] = value


def test_a_second_measurement_reuses_every_tree_and_fix_and_confirms_them(first, tmp_path, monkeypatch):
    _, out, log1, _ = first
    # the confirmation times nothing, so it starts no timer process for a setting's candidates
    monkeypatch.setattr(fixfind, "_timer", lambda *a, **k: pytest.fail("a timer for an untimed confirmation"))
    got, log = again(first, tmp_path, monkeypatch)
    for k, v in out.items():
        assert got[k]["order_id"] == v["order_id"] and got[k]["fix_id"] == v["fix_id"], k
    confirmed = re.findall(r"^\[orders \d+/4 .*\] (\S+ \S+ cpu): .*: reused from c0ffee00, confirmed "
                           rf"\({suite.DRAWS} fresh draws replayed bit for bit, (\d+) calls?\)$", log, re.M)
    assert len(confirmed) == 4, log
    # each confirmation took fewer calls than its reveal (the first run's "(N calls)")
    revealed = dict(re.findall(r"^\[orders \d+/4 .*\] (\S+ \S+ cpu): .* \((\d+) calls\)$", log1, re.M))
    assert all(int(calls) <= int(revealed[what]) for what, calls in confirmed), (confirmed, revealed)
    drifting = _drifting(out)
    assert drifting, "bmm and linear in float32 drift along M here: the fixes have something to confirm"
    for k in drifting:
        assert re.search(rf"^fixes of {re.escape(str(k))}: reused from c0ffee00, confirmed \(.+ still removes? slice_m in "
                         r"one run; fix cost as recorded\)$", log, re.M), log
        # untimed: the recorded cost carried over exactly, never a second timing of it
        assert got[k]["fix_cost"] == out[k]["fix_cost"] > 0
    # only the recorded removers were tried: no setting that removed nothing got a process
    entries = [catalog.load(first[0], "fixes", out[k]["fix_id"]) for k in drifting]
    removers = set().union(*(reuse.removers(e) for e in entries))
    tried = set(re.findall(r"^\[fixes \d+/\d+ .*\] confirming recorded fixes: (.+)$", log, re.M))
    assert tried - {"the default computation and its code changes", "done"} <= removers, (tried, removers)
    assert "(4 reused), fixes" in log and f"({len(drifting)} reused), maps" in log
    # every map confirmed: the same id, each run's first and last M measured again
    assert all(got[k]["map_id"] == v["map_id"] for k, v in out.items())
    maps = re.findall(r"^\[maps \d/4 .*\] (\S+ \S+) cpu: row 0 as at M = 1: .*\(reused from c0ffee00, confirmed "
                      r"\(\d+ M measured again, each run's first and last, in the same state\)\)$", log, re.M)
    assert len(maps) == 4, log
    assert re.search(r"maps [\d.]+ s \(4 reused\); reused from c0ffee00$", log, re.M), log


def test_a_tree_that_no_longer_replays_is_revealed_afresh(first, tmp_path, monkeypatch):
    """The record names another tree of the same K (a plain chain): the kernel's own output on
    fresh draws refutes it, and the probe reveals the real one again."""
    _, out, _, _ = first
    k = Cell("linear", "float32", "cpu")
    chain_k = order_plan.target(suite.cases.get("linear"), "float32", "cpu").k

    def edit(data, root):
        chain = 0
        for i in range(1, chain_k):
            chain = [chain, i]
        _set(data, "order_id", k, float(order_tree.store(root, chain, chain_k)))

    got, log = again(first, tmp_path, monkeypatch, edit=edit, MATMUL_DRIFT_FIXES="0")
    assert got[k]["order_id"] == out[k]["order_id"]
    line = next(ln for ln in log.splitlines() if ln.startswith("[orders") and "linear float32" in ln)
    assert re.search(r"matched \d+ of \d+ fresh draws \(seed \d+; first mismatch .*\): revealed afresh$", line), line
    assert "(3 reused), fixes" in log


@pytest.mark.parametrize("what", ["environment", "kernel", "missing tree", "no order id", "fix that no longer removes",
                                  "no fix cost"])
def test_a_record_that_cannot_stand_is_measured_afresh_and_says_why(first, tmp_path, monkeypatch, what):
    _, out, _, _ = first
    # The fixes are tried only where the first run drifted, which depends on the CPU and its caps
    # (under MKL_CBWR=AVX2 bmm float32 may not drift): a float32 combination that did.
    drifting = [k for k in (Cell("bmm", "float32", "cpu"), Cell("linear", "float32", "cpu"))
                if any(out[k][n] > 0 for n in ("slice_n_ulp", "slice_m_ulp", "run_to_run_ulp"))]
    assert drifting, {k: out[k] for k in out}
    k = drifting[0]
    name = f"{k.case} {k.precision}"

    def edit(data, root):
        if what == "environment":
            _set(data, "env_id", k, float(catalog.store(root, "env", {"another": "environment"})))
        elif what == "kernel":
            _set(data, "kernel_id", k, 123.0)
        elif what == "missing tree":
            catalog.entry_path(root, "orders", out[k]["order_id"]).unlink()
        elif what == "no order id":
            _set(data, "order_id", k, None)
        elif what == "no fix cost":  # nothing to carry over: the verdicts are measured afresh, and timed
            _set(data, "fix_cost", k, None)
        else:  # a setting that does nothing recorded as removing: trying it refutes the record
            entry = catalog.load(root, "fixes", out[k]["fix_id"])
            nothing = next(n for n, v in entry["verdicts"].items() if v == "no effect")
            _set(data, "fix_id", k, float(catalog.store(root, "fixes", {**entry, "verdicts": {
                **entry["verdicts"], nothing: "removes"}})))

    fixes_too = what in ("environment", "fix that no longer removes", "no fix cost")  # the fix finder takes seconds a run
    # k alone is measured again: every assertion reads k's values and lines, and the record's
    # other cells would only add their orders, maps and fix finder's work (half of its run)
    got, log = again(first, tmp_path, monkeypatch, edit=edit, only=k,
                     MATMUL_DRIFT_FIXES="1" if fixes_too else "0")
    assert got[k]["order_id"] == out[k]["order_id"] and got[k].get("fix_id") == (out[k]["fix_id"] if fixes_too else None)
    orders = next(ln for ln in log.splitlines() if ln.startswith("[orders") and name in ln)
    fixes = [ln for ln in log.splitlines() if ln.startswith(f"fixes of {k}:")]
    why = {"environment": "env id ", "kernel": "was 00000000007b", "missing tree": "cannot be read",
           "no order id": "no order id recorded"}.get(what)
    if what == "no fix cost":
        assert "reused from c0ffee00, confirmed" in orders
        assert fixes == [f"fixes of {k}: measured afresh: no fix cost recorded at c0ffee00"], fixes
        assert got[k]["fix_cost"] > 0
    elif what == "fix that no longer removes":
        assert "reused from c0ffee00, confirmed" in orders
        assert len(fixes) == 1 and re.search(r"the verdicts of c0ffee00 did not hold \(still removing: .*\): measured afresh$",
                                             fixes[0]), fixes
    else:
        assert "measured afresh" in orders and why in orders and "reused" not in orders.split(";")[0], orders
        if fixes_too:  # the fixes do not stand either
            assert len(fixes) == 1 and "measured afresh" in fixes[0] and why in fixes[0], fixes


def test_an_unreadable_record_is_one_line_and_everything_is_measured(first, tmp_path, monkeypatch):
    bad = tmp_path / "asv" / "m" / "deadbeef-env.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"version": 2, "results": ')
    # No fix finder: without a record it runs as in the first measurement (the fixture's own),
    # and what this reads, the orders' ids and the cost line, it leaves as they are.
    got, log = again(first, tmp_path, monkeypatch, record=bad, MATMUL_DRIFT_FIXES="0")
    assert len(re.findall(r"^not reusing .*deadbeef-env\.json: .*; measuring everything afresh$", log, re.M)) == 1
    assert "(0 reused), fixes" in log and "; nothing to reuse" in log
    assert all(got[k]["order_id"] == v["order_id"] for k, v in first[1].items())


def test_switches_keep_working_with_a_record(first, tmp_path, monkeypatch):
    got, log = again(first, tmp_path, monkeypatch, MATMUL_DRIFT_ORDERS="0")
    assert all("order_id" not in v for v in got.values()) and "[orders" not in log
    assert f"({len(_drifting(first[1]))} reused), maps" in log
    got, log = again(first, tmp_path / "maps-off", monkeypatch, MATMUL_DRIFT_MAPS="0", MATMUL_DRIFT_FIXES="0")
    assert all("map_id" not in v for v in got.values()) and "[maps" not in log
    assert "maps 0.0 s (0 reused); reused from c0ffee00" in log


def test_a_map_that_holds_is_reused_and_one_that_does_not_is_mapped_afresh(first, tmp_path, monkeypatch):
    """The first run maps each batched combination (a line each, with what it measured); the
    record then names, for bmm in float32, a map whose first run of M has row 0 drifting (M = 1
    never does): its confirmation refutes it and the map is made afresh, with the line saying
    why; the other three are confirmed."""
    _, out, log1, _ = first
    mapped = re.findall(r"^\[maps \d/4 .*\] (\S+ \S+) cpu: row 0 as at M = 1: .*; rows as in the full product "
                        r"\(M = \d+\): .* \(measured \d+ of \d+ M\)$", log1, re.M)
    assert sorted(mapped) == sorted(f"{c} {p}" for c in CASES for p in PRECISIONS), log1
    k = Cell("bmm", "float32", "cpu")

    def edit(data, root):
        e = catalog.load(root, "maps", out[k]["map_id"])
        wrong = {**e, "verdicts": [dict(e["verdicts"][0], row0=False), *e["verdicts"][1:]]}
        _set(data, "map_id", k, float(catalog.store(root, "maps", wrong)))

    got, log = again(first, tmp_path, monkeypatch, edit=edit, MATMUL_DRIFT_ORDERS="0", MATMUL_DRIFT_FIXES="0")
    assert all(got[x]["map_id"] == v["map_id"] for x, v in out.items())  # afresh, the true map again
    line = next(ln for ln in log.splitlines() if ln.startswith("[maps") and "bmm float32" in ln)
    assert re.search(r"\(measured \d+ of 64 M\); the map \w{12} of c0ffee00 did not hold at \d+ of \d+ M measured "
                     r"again \(first M = 1: recorded kernel-id \w+, row 0 drifting, rows \w+, now kernel-id \w+, "
                     r"row 0 invariant, rows \w+\): mapped afresh$", line), line
    assert len(re.findall(r"^\[maps .*reused from c0ffee00, confirmed", log, re.M)) == 3
    assert re.search(r"maps [\d.]+ s \(3 reused\); reused from c0ffee00$", log, re.M), log


def test_the_last_record_is_the_one_measured_last_in_the_same_build(tmp_path):
    folder = tmp_path / "m"
    out = {}
    older = write_record(out, folder, commit="a" * 40, started=1_800_000_000_000)
    newer = write_record(out, folder, commit="b" * 40, started=1_800_000_500_000)
    write_record(out, folder, commit="c" * 40, started=1_900_000_000_000, env_name="env-b")  # another build
    (folder / f"{'d' * 8}-env-a.json").write_text('{"env_name": "env-a", "results": ')  # cut short
    assert reuse.last_record(folder, "env-a") == newer and older != newer
    assert reuse.last_record(folder, "env-c") is None and reuse.last_record(tmp_path / "none", "env-a") is None


def test_matches_needs_every_id_recorded_and_equal():
    v = {"kernel_id": 1.0, "env_id": 2.0, "input_id": 3.0}
    rec = {**v, "order_id": 4.0}
    assert reuse.matches(v, rec, "order_id")
    assert not reuse.matches(v, {**rec, "order_id": math.nan}, "order_id")
    assert not reuse.matches(v, {**rec, "input_id": math.nan}, "order_id")
    assert not reuse.matches(v, None, "order_id") and not reuse.matches(v, rec, "fix_id")
    assert reuse.differs(v, {**rec, "env_id": 9.0}, "order_id") == f"env id {ids.hex_id(2)} was {ids.hex_id(9)}"
