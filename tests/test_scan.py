"""`matmul-drift scan`: exact boundaries against dense sweeps, agreement with explain, cost,
one-line errors, and a real Ctrl-C followed by --resume."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from matmul_drift.cli import main as cli
from matmul_drift.cli.main import main as cli_main
from matmul_drift.core import cases, ids, numerics
from matmul_drift.measure import kernels, measure
from matmul_drift.probes import classsearch, interrupt, records, scan

ENTRY = [sys.executable, "-m", "matmul_drift.cli", "scan"]


def scan_cli(capsys, *args):
    """Run the scan in this process: (exit status, stdout, stderr)."""
    rc = cli_main(["scan", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return rc, out, err


def pairs(rec):
    return [(b["lo"], b["hi"]) for b in rec["boundaries"]]


# --- the search alone, on synthetic classes ---------------------------------------------


def fake_point(size, cuts):
    """A point whose region is the number of cuts at or below ``size``."""
    region = sum(size >= c for c in cuts)
    return {"size": size, "kernel_id": f"{region % 2}", "kernels": [str(region % 2)], "error_u": 0.5,
            "max_ulp": region // 2 % 2, "frac_differ": 0.0, "max_u": 0.0}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(2, 400), st.data())
def test_search_finds_every_boundary_of_regions_at_least_a_step_wide(step, width, data):
    lo, hi = 7, 7 + width
    # starts of new regions, each region at least `step` wide: the grid must sample every one
    cuts, at = [], lo
    while True:
        at += data.draw(st.integers(step, step + 40))
        if at > hi:
            break
        cuts.append(at)
    if cuts and hi - cuts[-1] + 1 < step:
        cuts.pop()
    calls = []
    points = classsearch.search(lo, hi, step, lambda s: calls.append(s) or fake_point(s, cuts))
    assert [b["hi"] for b in classsearch.boundaries(points)] == cuts
    assert all(b["exact"] for b in classsearch.boundaries(points))
    assert len(calls) == len(set(calls)) == len(points)  # nothing evaluated twice
    # regions tile the range exactly
    regs = classsearch.regions(points)
    assert regs[0]["lo"] == lo and regs[-1]["hi"] == hi
    assert all(a["hi"] + 1 == b["lo"] for a, b in zip(regs, regs[1:]))
    # the search replays over its own points without evaluating anything: how --resume works
    assert classsearch.search(lo, hi, step, lambda s: pytest.fail(f"re-evaluated {s}"), known=points) == points


def test_bits_that_differ_only_where_one_side_is_inf_are_drift():
    # 65504 in one product, inf in the other (a sum that overflowed in one order only):
    # max_ulp leaves such entries out, frac_differ counts them, and both say drift
    x = np.array([65504.0, 1.0], dtype=np.float16)
    y = np.array([np.inf, 1.0], dtype=np.float16)
    d = numerics.drift(x.view(np.uint16), y.view(np.uint16), x.astype(np.float64), y.astype(np.float64),
                       np.array([70000.0, 1.0]), "float16")
    assert d["max_ulp"] == 0 and d["frac_differ"] == 0.5
    point = {"kernel_id": "k", **{key: d[key] for key in ("max_ulp", "frac_differ", "max_u")}}
    assert classsearch.region_key(point) == ("k", True)
    assert classsearch.region_key({**point, "frac_differ": 0.0}) == ("k", False)


def test_a_region_narrower_than_the_step_can_be_missed():
    # The documented limit: sizes 50..52 run another kernel, but the grid 1, 41, 81, 100 straddles them.
    def narrow(s):
        return {**fake_point(s, []), "kernel_id": "b" if 50 <= s <= 52 else "a"}

    assert classsearch.boundaries(classsearch.search(1, 100, 40, narrow)) == []
    points = classsearch.search(1, 100, 3, narrow)  # --step 3 puts a grid point at 52
    assert pairs({"boundaries": classsearch.boundaries(points)}) == [(49, 50), (52, 53)]


def _kernel_run(start, end):
    """Kernel b at sizes start..end, a elsewhere: A → B → A."""
    return lambda s: {**fake_point(s, []), "kernel_id": "b" if start <= s <= end else "a"}


def _widest_class_gap(lo, hi, step):
    """From the sizes the search evaluates where nothing changes: the widest distance between
    neighbouring grid points of a class that skips members (0 when none does)."""
    by_class = classsearch._by_class(classsearch.class_search(lo, hi, lambda s: fake_point(s, []), step=step))
    gaps = []
    for c, sizes in by_class.items():
        d = [b - a for a, b in zip(sizes, sizes[1:])]
        if any(x > 2 ** min(c + 1, classsearch.CLASS_TOP) for x in d):
            gaps.append(max(d))
    return max(gaps, default=0)


def test_a_run_narrower_than_the_grid_is_missed_and_the_output_says_how_wide():
    # The documented limit, with its width: on 1..12000 the default grid puts a class's grid
    # points 600-odd sizes apart, and 501 sizes of another kernel fall between them in every class.
    gap = _widest_class_gap(1, 12000, None)
    assert 501 < gap == classsearch.grid_gap(1, 12000, None)
    points = classsearch.class_search(1, 12000, _kernel_run(4900, 5400))
    assert classsearch.class_boundaries(points) == []
    params = scan.Params("n", 1, 12000, 1, 64, None, "float32", "cpu", 0, 0, "0" * 12)
    text = scan.render(scan.record(params, points, input_checksum="x", environment={}, sessions=[], complete=True))
    assert f"grid points up to {gap} sizes apart" in text and f"a run of fewer than {gap} sizes" in text
    # a --step that evaluates every member of every class is a dense sweep, and says so
    assert classsearch.grid_gap(1, 100, 2) == _widest_class_gap(1, 100, 2) == 0
    dense = scan.render(scan.record(scan.Params(**{**params.to_dict(), "hi": 100, "step": 2}),
                                        classsearch.class_search(1, 100, _kernel_run(50, 50), step=2),
                                        input_checksum="x", environment={}, sessions=[], complete=True))
    assert "a dense sweep):" in dense and "Not seen" not in dense


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 500), st.integers(2, 3000), st.one_of(st.none(), st.integers(1, 200)), st.data())
def test_a_run_at_least_as_wide_as_the_grid_gap_is_stated_at_every_size(lo, width, step, data):
    hi = lo + width
    gap = classsearch.grid_gap(lo, hi, step)
    assert gap == _widest_class_gap(lo, hi, step)
    run = data.draw(st.integers(max(gap, 1), width + 1))  # the promise: any run this wide is seen
    start = data.draw(st.integers(lo, hi - run + 1))
    evaluate = _kernel_run(start, start + run - 1)
    points = classsearch.class_search(lo, hi, evaluate, step=step)
    by_class = classsearch._by_class(points)
    for size in range(lo, hi + 1):
        assert classsearch.state_at(points, size, by_class) == classsearch.region_key(evaluate(size)), size
    # two changes within one grid step (A → B → C) are both found, exactly
    three = lambda s: {**fake_point(s, []), "kernel_id": "a" if s < start else "b" if s < start + 1 else "c"}  # noqa: E731
    if lo < start < hi:
        pts = classsearch.class_search(lo, hi, three, step=step)
        assert all(classsearch.state_at(pts, s) == classsearch.region_key(three(s)) for s in range(lo, hi + 1))


def test_resume_with_another_step_names_the_default_grid_as_the_option_does():
    # --step takes 1 or more; "recorded 0" named a value no option gives, so no way back
    made = scan.Params("n", 1, 100, 1, 64, None, "float32", "cpu", 0, 0, "0" * 12)
    rec = scan.record(made, {}, input_checksum="x", environment={}, sessions=[], complete=False)
    for recorded, here, words in ((0, 4, "step: recorded the default grid (no --step), here 4"),
                                  (4, 0, "step: recorded 4, here the default grid (no --step)")):
        rec["params"]["step"] = recorded
        with pytest.raises(records.RecordError) as exc:
            scan.check_record(rec, scan.Params(**{**made.to_dict(), "step": here}))
        assert str(exc.value) == "the record is another scan; " + words


@pytest.mark.parametrize("text,needle", [
    ("5:5", "5:5 holds one size, 5"), ("10:2", "reversed"), ("1.5:3", "two integers"), ("a:b", "two integers"),
    ("12", "LO:HI"), ("1:2:3", "LO:HI"), ("0:10", "start at 1"), ("-3:10", "start at 1"),
])
def test_parse_range_rejects(text, needle):
    with pytest.raises(classsearch.RangeError, match=needle) as exc:
        classsearch.parse_range(text)
    assert "empty" not in str(exc.value)  # LO:HI includes both ends: no range of integers here is empty


# --- real scans on the CPU ------------------------------------------------------------------
# Where a route or a drift changes depends on the CPU and on MKL/oneDNN settings (MKL_CBWR,
# ONEDNN_MAX_CPU_ISA), so nothing below names a boundary: cheap candidate sweeps are measured
# densely with plain torch on the machine that runs the test, and the scan must find exactly
# the boundaries found there.

SWEEPS = (
    # fp16/bf16: where oneDNN has a half-precision GEMM, torch's native loop below a size, oneDNN above
    dict(vary="n", lo=2, hi=200, fixed={"m": 1, "k": 64}, dtype="float16", step=16),
    dict(vary="n", lo=2, hi=200, fixed={"m": 1, "k": 64}, dtype="bfloat16", step=16),
    # fp32 MKL: A[:m] @ B against (A @ B)[:m], one SGEMM route, drift at some m
    dict(vary="m", lo=1, hi=300, fixed={"k": 1024, "n": 256}, dtype="float32", step=32),
    dict(vary="m", lo=1, hi=200, fixed={"k": 512, "n": 64}, dtype="float64", step=32),
    # one column of a strided B: MKL is called with other transposes than for two or more
    dict(vary="n", lo=1, hi=100, fixed={"m": 4, "k": 64}, dtype="float32", step=16),
)


def dense_sweep(vary, lo, hi, fixed, dtype, **_):
    """Every size from lo to hi with plain torch: (route, drift non-zero?), and the boundaries."""
    dims = {**fixed, vary: hi}
    a_bits, b_bits, _ = measure.operand_bits(cases.adhoc(dims["m"], dims["k"], dims["n"]), dtype, "cpu")
    a = measure.to_tensor(a_bits, dtype, "cpu")
    b = measure.to_tensor(b_bits, dtype, "cpu")
    full = measure.tensor_bits(a @ b)
    classes = {}
    for s in range(lo, hi + 1):
        if vary == "n":
            call, ref = (lambda s=s: a @ b[:, :s]), full[:, :s]
        else:
            call, ref = (lambda s=s: a[:s] @ b), full[:s]
        moved = bool(np.any(measure.tensor_bits(call()) != ref))
        classes[s] = (tuple(kernels.route(call, "cpu")), moved)
    cuts = [(s - 1, s) for s in range(lo + 1, hi + 1) if classes[s] != classes[s - 1]]
    return classes, cuts


@functools.lru_cache(maxsize=None)
def _measured(i):
    return dense_sweep(**SWEEPS[i])


def sweep_with(kind):
    """The first candidate sweep whose dense sweep here has a boundary of ``kind`` ('route': the
    kernels change; 'drift': only whether the slice drifts), else the first with any boundary,
    so the test checks a real boundary on every CPU. Fails when no candidate has one."""
    def has(i, k):
        classes, cuts = _measured(i)
        return any(k is None or (classes[lo][0] != classes[hi][0]) == (k == "route") for lo, hi in cuts)

    for k in (kind, None):
        for i in range(len(SWEEPS)):
            if has(i, k):
                return SWEEPS[i], *_measured(i)
    pytest.fail("no candidate sweep has a boundary on this machine: " + "; ".join(map(str, SWEEPS)))


def scan_state(rec, size):
    """(kernels, drift non-zero?) that a complete scan record states for ``size``, from the
    region of its alignment class that holds it."""
    period = rec["search"]["period"]
    label = classsearch.class_label(classsearch.size_class(size, period), period)
    r = next(r for r in rec["regions"] if r["class"] == label and r["lo"] <= size <= r["hi"])
    return tuple(r["kernels"]), r["drift"] == "non-zero"


def class_safe_step(truth, lo, hi, most):
    """The largest --step (≤ most) at which every run of one state within every class holds a
    grid point, so the scan must see every flip of the dense sweep."""
    step = most
    for c in range(classsearch.CLASS_TOP + 1):
        members = list(classsearch.class_members(lo, hi, c))
        runs, start = [], 0
        for i in range(1, len(members) + 1):
            if i == len(members) or truth[members[i]] != truth[members[i - 1]]:
                runs.append(i - start)
                start = i
        if len(runs) > 1:
            step = min(step, 2 ** min(c + 1, classsearch.CLASS_TOP) * min(runs))
    return max(1, step)


def run_scan(capsys, tmp_path, c, *extra):
    out = tmp_path / f"scan{len(list(tmp_path.iterdir()))}.json"
    fixed = [x for d, v in c["fixed"].items() for x in (f"--{d}", v)]
    rc, text, err = scan_cli(capsys, "--vary", c["vary"], "--range", f"{c['lo']}:{c['hi']}", *fixed,
                             "--dtype", c["dtype"], "--json", out, *extra)
    assert rc == 0, err
    return json.loads(out.read_text()), text


@pytest.mark.parametrize("kind", ["route", "drift"])
def test_scan_states_the_dense_sweep_at_every_size(kind, capsys, tmp_path):
    c, truth, cuts = sweep_with(kind)
    step = class_safe_step(truth, c["lo"], c["hi"], c["step"])
    plot = tmp_path / "scan.png"
    rec, text = run_scan(capsys, tmp_path, c, "--step", step, "--plot", plot)
    for size in range(c["lo"], c["hi"] + 1):  # every flip of the dense sweep is found
        assert scan_state(rec, size) == truth[size], (size, c)
    for b in rec["boundaries"]:
        assert b["exact"]
        for side in ("before", "after"):
            p = b[side]
            assert (tuple(p["kernels"]), p["max_ulp"] > 0) == truth[p["size"]]
    assert rec["complete"] and rec["evaluations"] == len(rec["points"]) <= rec["dense_equivalent"] == c["hi"] - c["lo"] + 1
    assert any(seg["text"] in text for seg in rec["pattern"])
    head = plot.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size < 200_000


# Ranges where a route may depend on the size modulo a power of two (cheap to sweep densely).
PERIODIC = (
    dict(vary="n", lo=960, hi=1100, fixed={"m": 1, "k": 4096}, dtype="float32"),
    dict(vary="m", lo=1, hi=48, fixed={"k": 2048, "n": 512}, dtype="float32"),
    dict(vary="m", lo=1, hi=64, fixed={"k": 4096, "n": 1024}, dtype="float32"),
    dict(vary="n", lo=1, hi=160, fixed={"m": 1, "k": 4096}, dtype="float32"),
    dict(vary="n", lo=1, hi=128, fixed={"m": 4, "k": 1024}, dtype="float32"),
)


def periodic(truth, lo, hi):
    """True when some size's state differs from both neighbours' (which agree): a pattern no
    contiguous region describes."""
    return any(truth[s - 1] == truth[s + 1] != truth[s] for s in range(lo + 1, hi))


def test_periodic_routes_are_found_at_every_size(capsys, tmp_path):
    measured = []
    for c in PERIODIC:  # swept in order until two are periodic: a range after those is never chosen
        measured.append((c, dense_sweep(**c)[0]))
        if sum(periodic(t, x["lo"], x["hi"]) for x, t in measured) == 2:
            break
    chosen = [(c, t) for c, t in measured if periodic(t, c["lo"], c["hi"])][:2]
    if len(chosen) < 2:  # this machine has fewer periodic ranges: check ranges with any flip
        chosen += [(c, t) for c, t in measured if (c, t) not in chosen and len(set(t.values())) > 1][: 2 - len(chosen)]
    assert chosen, "no candidate range has any flip on this machine: " + "; ".join(map(str, PERIODIC))
    for c, truth in chosen:
        rec, text = run_scan(capsys, tmp_path, c)  # the default grid: 20 intervals per class
        for size in range(c["lo"], c["hi"] + 1):
            assert scan_state(rec, size) == truth[size], (size, c)
        if periodic(truth, c["lo"], c["hi"]):
            assert any(seg["periodic"] for seg in rec["pattern"]) and "except" in text


def test_12000_wide_scan_costs_at_most_5_percent(capsys, tmp_path):
    out = tmp_path / "k.json"
    rc, text, err = scan_cli(capsys, "--vary", "k", "--range", "1:12000", "--m", 1, "--n", 8,
                             "--dtype", "float16", "--json", out)
    assert rc == 0, err
    rec = json.loads(out.read_text())
    assert rec["dense_equivalent"] == 12000
    assert rec["evaluations"] == len(rec["points"]) <= 0.05 * 12000
    assert f"{rec['evaluations']} evaluations for 12000 sizes" in text
    # Every region's route, checked with plain tensors at its ends and at sizes the scan never
    # evaluated; every boundary is a real change of route between adjacent sizes.
    a = torch.from_numpy(measure.operand_bits(cases.adhoc(1, 12000, 8), "float16", "cpu")[0].view(np.float16))
    b = torch.from_numpy(measure.operand_bits(cases.adhoc(1, 12000, 8), "float16", "cpu")[1].view(np.float16))
    route = lambda k: kernels.route(lambda: a[:, :k].contiguous() @ b[:k], "cpu")  # noqa: E731
    rng = np.random.default_rng(12000)
    for r in rec["regions"]:
        members = [k for k in range(r["lo"], r["hi"] + 1) if classsearch.class_label(classsearch.size_class(k)) == r["class"]]
        unseen = [members[int(i)] for i in rng.integers(0, len(members), size=3)]
        for k in (r["lo"], r["hi"], *unseen):
            assert route(k) == r["kernels"], (k, r)
    for bd in rec["boundaries"]:
        assert bd["exact"] and route(bd["lo"]) != route(bd["hi"])


# --- scan and explain agree ----------------------------------------------------------------


def explain_json(capsys, *args):
    rc = cli.main(["explain", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def one_scan(capsys, tmp_path, *args):
    out = tmp_path / f"{len(list(tmp_path.iterdir()))}.json"
    rc, _, err = scan_cli(capsys, *args, "--json", out)
    assert rc == 0, err
    return {p["size"]: p for p in json.loads(out.read_text())["points"]}


def first_drifting_n(m, k, hi, dtype):
    """The smallest n in 2..hi where A @ B[:, :n] differs from (A @ B)[:, :n] here, else 2."""
    a_bits, b_bits, _ = measure.operand_bits(cases.adhoc(m, k, hi), dtype, "cpu")
    a, b = measure.to_tensor(a_bits, dtype, "cpu"), measure.to_tensor(b_bits, dtype, "cpu")
    full = measure.tensor_bits(a @ b)
    return next((n for n in range(2, hi) if np.any(measure.tensor_bits(a @ b[:, :n]) != full[:, :n])), 2)


def test_points_equal_explain_for_n_and_m(capsys, tmp_path):
    s = first_drifting_n(1, 4096, 40, "float32")  # a point that drifts, where one does here
    pts = one_scan(capsys, tmp_path, "--vary", "n", "--range", f"{s}:40", "--m", 1, "--k", 4096, "--dtype", "float32", "--step", 8)
    for n in (s, 40):
        r = explain_json(capsys, "--m", 1, "--k", 4096, "--n", 40, "--slice-n", n, "--dtype", "float32")
        row = next(x for x in r["slices"]["n"] if x["n"] == n)
        assert {k: pts[n][k] for k in ("max_ulp", "frac_differ", "max_u")} == {k: row[k] for k in ("max_ulp", "frac_differ", "max_u")}
        assert pts[n]["kernels"] == r["kernels"]["slice_n"]
    assert pts[40]["error_u"] == r["error_u"]  # the top of the range is explain's full product
    # an interior point's error_u against numpy's float64 product of the same rounded inputs
    a_bits, b_bits, _ = measure.operand_bits(cases.adhoc(1, 4096, 40), "float32", "cpu")
    a, b = a_bits.view(np.float32), b_bits.view(np.float32)
    exact = a.astype(np.float64) @ b[:, :s].astype(np.float64)
    got = (torch.from_numpy(a) @ torch.from_numpy(b)[:, :s]).double().numpy()
    # both float64 references are within K·2^-53 (relative) of the truth: K·2^-29 in fp32 u
    assert pts[s]["error_u"] == pytest.approx(np.max(np.abs(got - exact) / (2.0**-24 * exact)), abs=4096 * 2.0**-29)

    pts = one_scan(capsys, tmp_path, "--vary", "m", "--range", "150:200", "--k", 1024, "--n", 256, "--dtype", "float32", "--step", 10)
    for s in (150, 200):
        r = explain_json(capsys, "--m", 200, "--k", 1024, "--n", 256, "--slice-m", s, "--dtype", "float32")
        row = r["slice_m"]
        assert {k: pts[s][k] for k in ("max_ulp", "frac_differ", "max_u")} == {k: row[k] for k in ("max_ulp", "frac_differ", "max_u")}
        assert pts[s]["kernels"] == r["kernels"]["slice_m"]


def test_within_slices_a_wider_operand_as_explain_and_torch_do(capsys, tmp_path):
    """--within W: every point is A @ B[:, :n] of a B W columns wide (the seed's v[:, :n] of
    51000), against (A @ B)[:, :n]; the record names W, and resuming under another W is refused."""
    s = first_drifting_n(1, 4096, 40, "float32")
    out = tmp_path / "w.json"
    rc, text, err = scan_cli(capsys, "--vary", "n", "--range", f"{max(s - 2, 1)}:{s + 2}", "--within", 40, "--m", 1,
                             "--k", 4096, "--dtype", "float32", "--step", 1, "--json", out)
    assert rc == 0, err
    rec = json.loads(out.read_text())
    assert rec["params"]["within"] == 40 and "slices of n=40" in text
    a_bits, b_bits, _ = measure.operand_bits(cases.adhoc(1, 4096, 40), "float32", "cpu")
    a, b = measure.to_tensor(a_bits, "float32", "cpu"), measure.to_tensor(b_bits, "float32", "cpu")
    full = measure.tensor_bits(a @ b)
    for p in rec["points"]:
        n = p["size"]
        differ = np.mean(measure.tensor_bits(a @ b[:, :n]) != full[:, :n])  # torch, independent of measure
        assert p["frac_differ"] == pytest.approx(differ), n
        r = explain_json(capsys, "--m", 1, "--k", 4096, "--n", 40, "--slice-n", n, "--dtype", "float32")
        row = next(x for x in r["slices"]["n"] if x["n"] == n)
        assert {k: p[k] for k in ("max_ulp", "frac_differ", "max_u")} == {k: row[k] for k in ("max_ulp", "frac_differ", "max_u")}
        assert p["kernels"] == r["kernels"]["slice_n"]
    rc, _, err = scan_cli(capsys, "--vary", "n", "--range", f"{max(s - 2, 1)}:{s + 2}", "--within", 41, "--m", 1,
                          "--k", 4096, "--dtype", "float32", "--step", 1, "--resume", out)
    assert rc == 2 and "within: recorded 40, here 41" in err and len(err.strip().splitlines()) == 1
    rc, _, err = scan_cli(capsys, "--vary", "n", "--range", f"{max(s - 2, 1)}:{s + 2}", "--m", 1,
                          "--k", 4096, "--dtype", "float32", "--step", 1, "--resume", out)
    assert rc == 2 and "within: recorded 40, here the range's top (no --within)" in err, err  # was "here None"
    # --within at the range's top is the default, recorded as such
    rc, _, err = scan_cli(capsys, *BASE, "--within", 40, "--json", tmp_path / "top.json")
    assert rc == 0 and json.loads((tmp_path / "top.json").read_text())["params"]["within"] is None
    rc, _, err = scan_cli(capsys, *BASE, "--resume", tmp_path / "top.json")
    assert rc == 0 and "0 evaluated here" in err


def test_points_equal_explain_for_k(capsys, tmp_path):
    pts = one_scan(capsys, tmp_path, "--vary", "k", "--range", "670:700", "--m", 2, "--n", 3, "--dtype", "float16", "--step", 4)
    a_bits, b_bits, _ = measure.operand_bits(cases.adhoc(2, 700, 3), "float16", "cpu")
    for k in (670, 700):
        np.save(tmp_path / "a.npy", a_bits.view(np.float16)[:, :k])
        np.save(tmp_path / "b.npy", b_bits.view(np.float16)[:k])
        r = explain_json(capsys, "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "--dtype", "float16")
        assert pts[k]["error_u"] == r["error_u"]
        assert pts[k]["kernels"] == r["kernels"]["full"] and pts[k]["kernel_id"] == r["kernel_id"]
        assert pts[k]["max_ulp"] is None


# --- bad input, Ctrl-C and --resume ----------------------------------------------------------

BASE = ["--vary", "n", "--range", "2:40", "--m", "2", "--k", "32", "--dtype", "float32"]


@pytest.mark.parametrize("args,needle", [
    (["--vary", "n", "--range", "40:40", "--m", "2", "--k", "32", "--dtype", "float32"], "holds one size"),
    (["--vary", "n", "--range", "40:2", "--m", "2", "--k", "32", "--dtype", "float32"], "reversed"),
    (["--vary", "n", "--range", "2:4e4", "--m", "2", "--k", "32", "--dtype", "float32"], "two integers"),
    (["--vary", "n", "--range", "2:10000000000", "--m", "100000", "--k", "100000", "--dtype", "float32"], "GiB"),
    (["--vary", "n", "--range", "2:40", "--m", "2", "--dtype", "float32"], "needs --k"),
    ([*BASE, "--n", "8"], "varied dimension"),
    ([*BASE, "--plot", "x.svg"], "PNG"),
    ([*BASE, "--resume", "/nonexistent/scan.json"], "no such file"),
    ([*BASE, "--json", "/nonexistent/dir/scan.json"], "folder does not exist"),
    ([*BASE, "--json", "/proc/scan.json/"], "/proc/scan.json/: it ends in a slash"),  # never written, on old code either
    ([*BASE, "--step", "0"], "at least 1"),
    ([*BASE, "--json", ""], "argument --json: needs a file name, got an empty one"),
    ([*BASE, "--resume", ""], "argument --resume: needs a file name"),
    ([*BASE, "--plot", ""], "argument --plot: needs a file name"),
    ([*BASE, "--vary", "q"], "invalid choice"),
    ([*BASE, "--json", "/tmp"], "--json /tmp: a folder; name a file in it"),  # was "continue it with --resume /tmp"
    ([*BASE, "--within", "39"], "--within 39 is below the range's top, 40"),
    (["--vary", "k", "--range", "2:40", "--m", "2", "--n", "3", "--dtype", "float32", "--within", "50"], "--vary n or m"),
    ([*BASE, "--within", "0"], "at least 1"),
])
def test_bad_input_one_line_exit_2(args, needle, capsys):
    rc, out, err = scan_cli(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_one_line(capsys):
    rc, out, err = scan_cli(capsys, *BASE, "--device", "cuda")
    assert rc == 2 and "no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_records_are_never_overwritten_and_resume_checks_parameters(capsys, tmp_path):
    out = tmp_path / "s.json"
    assert scan_cli(capsys, *BASE, "--json", out)[0] == 0
    before = out.read_bytes()
    rc, _, err = scan_cli(capsys, *BASE, "--json", out)
    assert rc == 2 and "--resume" in err and out.read_bytes() == before
    rc, _, err = scan_cli(capsys, *BASE[:-1], "float64", "--resume", out)
    assert rc == 2 and "dtype: recorded 'float32', here 'float64'" in err and len(err.strip().splitlines()) == 1
    rc, _, err = scan_cli(capsys, *BASE, "--step", "3", "--resume", out)
    assert rc == 2 and "step" in err
    rc, text, err = scan_cli(capsys, *BASE, "--resume", out)  # complete: nothing to evaluate, same record
    assert rc == 0 and "0 evaluated here" in err and out.read_bytes() == before
    old = json.loads(before)
    old["schema"] = "matmul-drift-scan/1"  # a record from the single-grid search
    (tmp_path / "old.json").write_text(json.dumps(old))
    rc, _, err = scan_cli(capsys, *BASE, "--resume", tmp_path / "old.json")
    assert rc == 2 and "from an older search (matmul-drift-scan/1)" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "junk.json").write_text("{not json")
    rc, _, err = scan_cli(capsys, *BASE, "--resume", tmp_path / "junk.json")
    assert rc == 2 and "not JSON" in err
    (tmp_path / "null.json").write_text("null")  # JSON, and no record: once started afresh and written over
    rc, _, err = scan_cli(capsys, *BASE, "--resume", tmp_path / "null.json")
    assert rc == 2 and "not a scan record" in err and (tmp_path / "null.json").read_text() == "null"
    # a link: writing back replaced the link with a file and left the record it points to behind
    os.symlink(out, tmp_path / "link.json")
    rc, _, err = scan_cli(capsys, *BASE, "--resume", tmp_path / "link.json")
    assert rc == 2 and "symbolic link" in err and str(out) in err and len(err.strip().splitlines()) == 1
    assert os.path.islink(tmp_path / "link.json") and out.read_bytes() == before


def drawn(monkeypatch, rec, tmp_path):
    """scan_plot.plot's figure, kept for reading instead of closed."""
    import matplotlib.pyplot as plt

    from matmul_drift.probes import scan_plot

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    scan_plot.plot(rec, str(tmp_path / "p.png"))
    return figs[0]


@pytest.mark.parametrize("errors", [[None] * 6, [None, 0.5, None, 2.0, None, None]])
def test_plot_has_an_error_scale_only_where_an_error_was_computed(monkeypatch, tmp_path, errors):
    # fp16 with k=300000 of inputs in [0, 1) overflows every output: error_u is None at every size.
    # The left axis then ran 0 to 1e-9 u under a legend entry for error_u: an error of nothing, read as tiny.
    params = scan.Params("n", 1, 6, 1, 300000, None, "float16", "cpu", 1, measure.SEED, "0" * 12)
    points = {s: {**fake_point(s, [4]), "error_u": e} for s, e in zip(range(1, 7), errors)}
    rec = scan.record(params, points, input_checksum="x", environment={}, sessions=[], complete=True)
    fig = drawn(monkeypatch, rec, tmp_path)
    ax = fig.axes[0]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    if any(e is not None for e in errors):
        assert ax.get_ylim()[1] == pytest.approx(2.0 * 1.15) and any(t.startswith("error_u") for t in legend)
    else:
        assert list(ax.get_yticks()) == [] and "not computed" in ax.get_ylabel()
        assert not any(t.startswith("error_u") for t in legend)


def test_plot_and_record_in_one_file_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = scan_cli(capsys, *BASE, "--json", "same.png", "--plot", "./same.png")
    assert rc == 2 and out == "" and not os.path.exists("same.png")
    assert err == "matmul-drift scan: error: --plot ./same.png is the record's file too; the plot would replace the record: name it apart\n"
    assert scan_cli(capsys, *BASE, "--json", "same.png")[0] == 0
    before = (tmp_path / "same.png").read_bytes()
    rc, _, err = scan_cli(capsys, *BASE, "--resume", "same.png", "--plot", tmp_path / "same.png")
    assert rc == 2 and "the record's file too" in err and (tmp_path / "same.png").read_bytes() == before


def test_resume_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # opening it would wait for a writer forever
    for name in ("fifo", "."):
        done = subprocess.run([*ENTRY, *BASE, "--resume", str(tmp_path / name)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == f"matmul-drift scan: error: --resume {tmp_path / name}: not a regular file\n"


def unwritable_folder(tmp_path):
    """A folder this process cannot create files in. Root writes through permission bits, so
    for root one the kernel refuses: /proc, where os.access still says yes to root."""
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    for folder in (ro, "/proc"):
        try:
            open(os.path.join(folder, "probe"), "x").close()
        except OSError:
            return str(folder)
        os.remove(os.path.join(folder, "probe"))
    pytest.skip("every candidate folder is writable here")


@pytest.mark.parametrize("flag,name", [("--json", "s.json"), ("--plot", "s.png")])
def test_unwritable_folder_is_refused_before_measuring(flag, name, capsys, tmp_path, monkeypatch):
    target = os.path.join(unwritable_folder(tmp_path), name)
    monkeypatch.setattr(measure, "scan_point", lambda *a, **k: pytest.fail("measured before refusing"))
    rc, out, err = scan_cli(capsys, *BASE, flag, target)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"matmul-drift scan: error: {target}: its folder is not writable ("), err


@pytest.mark.parametrize("flag,target", [("--json", "/proc/s.json"), ("--plot", "/proc/s.png")])
def test_a_write_the_system_refuses_is_refused_before_measuring(flag, target, capsys, monkeypatch):
    # /proc takes no new file, from root either, though os.access lets root pass: the write is tried first
    monkeypatch.setattr(measure, "scan_point", lambda *a, **k: pytest.fail("measured before refusing"))
    rc, out, err = scan_cli(capsys, *BASE, flag, target)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"matmul-drift scan: error: {target}: its folder is not writable ("), err


@pytest.mark.parametrize("flag,ext", [("--json", ".json"), ("--plot", ".png")])
def test_a_dangling_link_or_a_name_too_long_is_refused_before_measuring(flag, ext, capsys, tmp_path, monkeypatch):
    """A link to nowhere is a name taken (the write would fail on it only after the scan), and
    a name longer than the folder takes fails only when written: both are refused first."""
    monkeypatch.setattr(measure, "scan_point", lambda *a, **k: pytest.fail("measured before refusing"))
    link = tmp_path / f"link{ext}"
    link.symlink_to(tmp_path / "nowhere" / f"x{ext}")
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    long = tmp_path / ("a" * (longest + 1 - len(ext)) + ext)
    for target, message in ((link, "exists"), (long, f"its name is longer than its folder takes ({longest} bytes)")):
        rc, out, err = scan_cli(capsys, *BASE, flag, target)
        assert rc == 2 and out == "" and len(err.splitlines()) == 1 and message in err, err
    assert os.path.islink(link) and not os.path.lexists(long)


@pytest.mark.parametrize("flag,name", [("--json", "s.json"), ("--plot", "s.png")])
def test_a_file_made_while_scanning_is_not_replaced(flag, name, capsys, tmp_path, monkeypatch):
    target = tmp_path / name
    measured = measure.scan_point

    def intrude(*args, **kwargs):  # someone else creates the file once the scan has started
        if not target.exists():
            target.write_text("someone else's")
        return measured(*args, **kwargs)

    monkeypatch.setattr(measure, "scan_point", intrude)
    extra = ["--plot", tmp_path / "p.png"] if flag == "--json" else ["--json", tmp_path / "r.json"]
    rc, _, err = scan_cli(capsys, *BASE, flag, target, *extra)
    assert rc == 2 and target.read_text() == "someone else's"
    line = err.strip().splitlines()[-1]
    head = f"matmul-drift scan: error: {target} appeared while the scan ran and is left as it is; "
    assert line.startswith(head), err
    kept = line[len(head):].split(" is in ")[1].split(":")[0]
    assert os.path.dirname(kept) == str(tmp_path) and kept.endswith(".part")
    if flag == "--plot":  # the record was written before; the plot is whole, beside the other file
        assert line == head + f"the plot is in {kept}"
        assert open(kept, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and json.loads((tmp_path / "r.json").read_text())["complete"]
        return
    assert err == line + "\n" and line == head + f"the record is in {kept}: --resume {kept} continues it" and not (tmp_path / "p.png").exists()
    monkeypatch.setattr(measure, "scan_point", measured)
    first = json.loads(open(kept).read())["points"]  # the record as far as it went: nothing measured was lost
    rc, _, err = scan_cli(capsys, *BASE, "--resume", kept)
    final = json.loads(open(kept).read())
    assert rc == 0 and first and f"{final['evaluations'] - len(first)} evaluated here" in err
    assert final["complete"] and all(p in final["points"] for p in first)


def test_memory_estimate_refuses_before_drawing(capsys):
    t0 = time.monotonic()
    rc, _, err = scan_cli(capsys, "--vary", "m", "--range", "1:3000000", "--k", "100000", "--n", "8", "--dtype", "float32")
    assert rc == 2 and "MemAvailable" in err and time.monotonic() - t0 < 5


def test_no_host_memory_check_starts_where_memavailable_reads_too_little(capsys, monkeypatch):
    from matmul_drift.measure import memory

    monkeypatch.setattr(memory, "available", lambda device: (1 << 20, None))  # 1 MiB, as a VM that grows
    small = ["--vary", "n", "--range", "1:8", "--m", "2", "--k", "512", "--dtype", "float32", "--step", "1"]
    rc, _, err = scan_cli(capsys, *small)
    assert rc == 2 and "more than the 0.0 GiB of memory available (MemAvailable)" in err
    rc, out, _ = scan_cli(capsys, *small, "--no-host-memory-check")
    assert rc == 0 and "8 evaluations for 8 sizes" in out


def test_ctrl_c_leaves_a_record_that_resume_finishes(tmp_path):
    out = tmp_path / "scan.json"
    # --step 16: half the evaluations of --step 4 (365 against 777 on a 2-core EPYC), and a search
    # still several times the second to its first save (resumable.SAVE_EVERY_S) that the
    # interrupt waits for
    args = ["--vary", "m", "--range", "1:1000", "--k", "1024", "--n", "256", "--dtype", "float32",
            "--step", "16", "--json", str(out)]
    proc = subprocess.Popen([*ENTRY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists():
            seen = len(json.loads(out.read_text())["points"])
            if seen >= 5:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the scan ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and f"--resume {out}" in err
    first = json.loads(out.read_text())  # valid JSON, by construction of the atomic write
    assert not first["complete"] and first["evaluations"] >= seen
    assert [p for p in os.listdir(tmp_path) if p.endswith(".part")] == []

    done = subprocess.run([*ENTRY, *args[:-2], "--resume", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = json.loads(out.read_text())
    assert final["complete"] and len(final["sessions"]) == 2
    by_size = {p["size"]: p for p in final["points"]}
    assert all(by_size[p["size"]] == p for p in first["points"])  # nothing recorded was lost or changed
    assert final["sessions"][0]["evaluated"] == first["evaluations"]
    assert sum(s["evaluated"] for s in final["sessions"]) == final["evaluations"]  # nothing evaluated twice
    p = final["params"]
    assert classsearch.class_search(p["lo"], p["hi"], lambda s: pytest.fail(f"missing {s}"), known=by_size,
                             step=p["step"]) == by_size


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_points_equal_explain(capsys, tmp_path):
    pts = one_scan(capsys, tmp_path, "--vary", "n", "--range", "4000:4100", "--m", 1, "--k", 4096,
                   "--dtype", "float16", "--device", "cuda", "--step", 20)
    for s in (4000, 4100):
        r = explain_json(capsys, "--m", 1, "--k", 4096, "--n", 4100, "--slice-n", s, "--dtype", "float16", "--device", "cuda")
        # explain lists a slice's kernels once each; a point keeps the launch order as it ran
        assert pts[s]["max_ulp"] == r["slice_n"]["max_ulp"] and kernels.unique(pts[s]["kernels"]) == r["kernels"]["slice_n"]
    assert ids.hex_id(ids.object_id({"device": "cuda", "full": pts[4100]["kernels"]})) == pts[4100]["kernel_id"]


def test_resume_refuses_a_tampered_record(capsys, tmp_path):
    out = tmp_path / "s.json"
    assert scan_cli(capsys, *BASE, "--json", out)[0] == 0
    rec = json.loads(out.read_text())
    for tamper, needle in ((lambda r: r["points"][3].pop("kernel_id"), "malformed point"),
                           (lambda r: r.update(input_checksum="0" * 64), "inputs differ")):
        bad = json.loads(json.dumps(rec))
        tamper(bad)
        out.write_text(json.dumps(bad))
        rc, _, err = scan_cli(capsys, *BASE, "--resume", out)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def _put(rec, where, value):
    """``rec`` as JSON text with the value at ``where`` (keys) spelled ``value`` verbatim."""
    rec = json.loads(json.dumps(rec))
    *path, last = where
    obj = rec
    for key in path:
        obj = obj[key]
    obj[last] = "@@"
    return json.dumps(rec).replace('"@@"', value)


@pytest.mark.parametrize("where,value,needle", [
    (("points", 0, "max_u"), "1e400", "holds the number 1e400, beyond the range of a double"),
    (("points", 0, "error_u"), "NaN", "is not JSON: NaN is not a JSON number (RFC 8259)"),
    (("sessions", 0, "seconds"), "-Infinity", "is not JSON: -Infinity is not a JSON number"),
    (("points",), "5", "the record's points is not a list: 5"),
    (("sessions",), "5", "the record's sessions is not a list: 5"),
    (("params",), "[1]", "the record's params is not an object: [1]"),
    (("points", 0, "kernels"), "[1, 2]", "malformed point"),
    (("points", 0, "max_ulp"), "1" + "0" * 400, "malformed point"),  # an integer beyond a double
    (("points", 0, "max_ulp"), "true", "malformed point"),
    (("sessions", 0, "evaluated"), '"x"', "malformed session"),
    ((), "[" * 100_000 + "]" * 100_000, "nested too deeply to be a scan record"),
])
def test_resume_refuses_a_hostile_record_in_one_line(where, value, needle, capsys, tmp_path):
    out = tmp_path / "s.json"
    assert scan_cli(capsys, *BASE, "--json", out)[0] == 0
    good = json.loads(out.read_text())
    bad = value if not where else _put(good, where, value)
    out.write_text(bad)
    rc, text, err = scan_cli(capsys, *BASE, "--resume", out)
    assert rc == 2 and text == "" and needle in err and len(err.strip().splitlines()) == 1, err
    assert out.read_text() == bad  # left as it was


# --- alignment classes, on synthetic routes -----------------------------------------------


def periodic_point(size, limit, modulus, kernel_cut=None):
    """Drift at sizes ≤ limit except multiples of modulus; kernels change at kernel_cut."""
    kid = "k2" if kernel_cut and size >= kernel_cut else "k1"
    return {"size": size, "kernel_id": kid, "kernels": [kid], "error_u": 0.5,
            "max_ulp": int(size <= limit and size % modulus != 0), "frac_differ": 0.0, "max_u": 0.0}


def test_classes_partition_every_range():
    for lo, hi in ((1, 1), (1, 700), (45990, 46010), (3, 64)):
        members = sorted(s for c in range(classsearch.CLASS_TOP + 1) for s in classsearch.class_members(lo, hi, c))
        assert members == list(range(lo, hi + 1))
        assert all(classsearch.size_class(s) == c for c in range(classsearch.CLASS_TOP + 1) for s in classsearch.class_members(lo, hi, c))
    assert [classsearch.class_label(c) for c in range(6)] == ["odd", "≡ 2 mod 4", "≡ 4 mod 8", "≡ 8 mod 16",
                                                        "≡ 16 mod 32", "≡ 0 mod 32"]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([2, 4, 8, 16, 32]), st.one_of(st.none(), st.integers(2, 3000)),
       st.integers(0, 2000))
def test_class_search_sees_periodic_routes_exactly(limit, modulus, kernel_cut, lo):
    hi = lo + 1 + 3000
    lo += 1
    evaluate = functools.partial(periodic_point, limit=limit, modulus=modulus, kernel_cut=kernel_cut)
    points = classsearch.class_search(lo, hi, evaluate)
    by_class = classsearch._by_class(points)
    for size in range(lo, hi + 1):  # every size, evaluated or not, is stated as the truth
        assert classsearch.state_at(points, size, by_class) == classsearch.region_key(evaluate(size)), size
    assert len(points) <= 0.10 * (hi - lo + 1)  # 3001 sizes: within 10 %


def test_a_boundary_of_drift_in_inf_entries_alone_shows_that_drift():
    # fp16 near its overflow: the slice gives 65504 where the top of the range gave inf. max_ulp
    # and max_u leave out entries non-finite on either side, so only frac_differ sees the drift.
    def point(n):
        moved = n >= 30
        return {"size": n, "kernel_id": "k", "kernels": ["k"], "error_u": 0.5, "max_ulp": 0,
                "frac_differ": 0.25 if moved else 0.0, "max_u": 0.0}

    points = classsearch.class_search(2, 60, point, step=1)
    params = scan.Params("n", 2, 60, 4, 300000, None, "float16", "cpu", 1, 0, "0" * 12)
    rec = scan.record(params, points, input_checksum="x", environment={}, sessions=[], complete=True)
    assert rec["boundaries"] and all(b["drift_changed"] for b in rec["boundaries"])
    rows = [line for line in scan.render(rec).splitlines() if " → " in line]
    assert len(rows) == len(rec["boundaries"])
    for row in rows:  # each side says what it is: none differ before, a quarter of the entries after
        assert row.rstrip().endswith("0 ulp, 0 u, 25% of entries between finite and NaN/inf"), row
        assert row.count("25%") == 1


def test_pattern_reads_as_the_route_is():
    points = classsearch.class_search(1, 700, functools.partial(periodic_point, limit=11, modulus=4))
    assert [p["text"] for p in classsearch.pattern(points, 1, 700)] == [
        "1..12: drift, except multiples of 4: no drift", "13..700: no drift"]
    points = classsearch.class_search(1, 2048, lambda n: periodic_point(n, 10**9, 16) if n >= 1008 else periodic_point(n, 0, 1))
    assert [p["text"] for p in classsearch.pattern(points, 1, 2048)] == [
        "1..1008: no drift", "1009..2048: drift, except multiples of 16: no drift"]
    wide = classsearch.class_search(1, 12000, functools.partial(periodic_point, limit=11, modulus=4, kernel_cut=513))
    assert len(wide) <= 0.05 * 12000
    assert [p["periodic"] for p in classsearch.pattern(wide, 1, 12000)] == [True, False, False]


@pytest.mark.parametrize("links", [True, False])
def test_write_new_creates_once_and_keeps_what_it_could_not_place(links, tmp_path, monkeypatch):
    """atomic.write_new, which the record's first write and the plot use; without hard links
    (some network file systems refuse them) it falls back to a check and a rename."""
    import errno

    from matmul_drift.store import atomic

    if not links:
        def refuse(src, dst):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        monkeypatch.setattr(os, "link", refuse)
    path = tmp_path / "r.json"
    atomic.write_new(path, b"first")
    assert path.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with pytest.raises(atomic.Taken) as taken:
        atomic.write_new(path, b"second")
    assert path.read_bytes() == b"first" and open(taken.value.kept, "rb").read() == b"second"


def test_a_profiler_that_loses_kernels_stops_the_scan_with_its_points_kept(capsys, tmp_path, monkeypatch):
    """kernels.ProfilerLost (CUDA only: no try of a traced call was whole) ends the scan in one
    line, exit 1, with the points so far recorded; --resume finishes the same record."""
    whole = tmp_path / "whole.json"
    assert scan_cli(capsys, *BASE, "--json", whole)[0] == 0
    point, done = measure.scan_point, []

    def loses_after_five(*args, **kw):
        if len(done) == 5:
            raise kernels.ProfilerLost("the profiler lost kernel records at each of 4 tries")
        done.append(1)
        return point(*args, **kw)

    monkeypatch.setattr(measure, "scan_point", loses_after_five)
    out = tmp_path / "s.json"
    rc, text, err = scan_cli(capsys, *BASE, "--json", out)
    assert rc == 1 and text == ""
    assert err == (f"matmul-drift scan: stopped after 5 evaluations: the profiler lost kernel records at each of 4 "
                   f"tries; {out} holds them: continue with --resume {out}\n")
    rec = json.loads(out.read_text())
    assert rec["complete"] is False and len(rec["points"]) == 5
    monkeypatch.setattr(measure, "scan_point", point)
    rc, _, err = scan_cli(capsys, *BASE, "--resume", out)
    want = json.loads(whole.read_text())
    assert rc == 0 and json.loads(out.read_text())["boundaries"] == want["boundaries"]


def test_timeouts_two_sigterms_let_the_point_in_hand_finish_and_a_later_one_stops_at_once(capsys, tmp_path, monkeypatch):
    out = tmp_path / "s.json"
    measured, calls = measure.scan_point, []

    def signalled(*args, **kwargs):  # as `timeout` does: the command, then its process group, at once
        calls.append(args[2])
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return measured(*args, **kwargs)

    monkeypatch.setattr(measure, "scan_point", signalled)
    rc, _, err = scan_cli(capsys, *BASE, "--step", "1", "--json", out)
    rec = json.loads(out.read_text())
    assert rc == 143 and "interrupted after 4 evaluations" in err, err
    assert sorted(p["size"] for p in rec["points"]) == sorted(calls)  # the fourth, signalled mid-point, was kept

    calls.clear()
    out.unlink()

    def twice(*args, **kwargs):  # a person's second Ctrl-C, a while after the first: stop at once
        calls.append(args[2])
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(interrupt.ECHO_S + 0.1)
            os.kill(os.getpid(), signal.SIGINT)
        return measured(*args, **kwargs)

    monkeypatch.setattr(measure, "scan_point", twice)
    rc, _, err = scan_cli(capsys, *BASE, "--step", "1", "--json", out)
    assert rc == 130 and "interrupted after 3 evaluations" in err, err
    assert sorted(p["size"] for p in json.loads(out.read_text())["points"]) == sorted(calls[:3])


def test_ctrl_c_again_while_the_interrupted_scan_saves_loses_nothing(capsys, tmp_path, monkeypatch):
    out = tmp_path / "s.json"
    measured, written, calls = measure.scan_point, records.write_atomic, []

    def first(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(interrupt.ECHO_S + 0.1)  # later Ctrl-Cs are a person's: stop at once
        return measured(*args, **kwargs)

    def pressed(*args, **kwargs):  # Ctrl-C held down: one more at every write once stopping
        if calls and len(calls) >= 4:
            os.kill(os.getpid(), signal.SIGINT)
        return written(*args, **kwargs)

    monkeypatch.setattr(measure, "scan_point", first)
    monkeypatch.setattr(records, "write_atomic", pressed)
    rc, _, err = scan_cli(capsys, *BASE, "--step", "1", "--json", out)
    assert rc == 130 and f"--resume {out}" in err, err
    assert sorted(p["size"] for p in json.loads(out.read_text())["points"]) == sorted(calls)
    assert [p for p in os.listdir(tmp_path) if p.endswith(".part")] == []  # the cut write left nothing


def test_bench_scan_times_its_first_range_without_the_processs_start_up(monkeypatch, capsys):
    """scripts/bench_scan.py prints each range's seconds, scan against dense. The first scan of a
    process pays its one-time costs (2.6 s here, against 0.15 s for the scan itself), which
    once landed on the first range's scan: '(3 s vs 1 s)' for a scan that is quicker than
    the dense sweep. A fake clock: the first call costs 10 s more, every call 1 s."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_scan.py"
    spec = importlib.util.spec_from_file_location("bench_scan", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    clock = [0.0]

    def fake_scan(args):
        clock[0] += 1 + 10 * (clock[0] == 0)
        sizes = (1, 2)
        rec = {"evaluations": 2, "pattern": [], "regions": [
            {"lo": s, "hi": s, "class": classsearch.class_label(classsearch.size_class(s)), "kernel_id": "k", "drift": "zero"}
            for s in sizes]}
        Path(args[args.index("--json") + 1]).write_text(json.dumps(rec))
        return 0

    monkeypatch.setattr(bench, "cli_main", fake_scan)
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(bench, "RANGES", bench.RANGES[:1])
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "(1.0 s vs 1.0 s)" in out, out


def test_a_saved_record_renders_as_text_without_measuring(tmp_path, capsys):
    """`scan --render FILE` prints what the scan printed at its end, from its record alone: the
    H200's committed seed scan reads on any machine (`explain --render` once met it with
    "KeyError: 'shape'")."""
    root = Path(__file__).resolve().parents[1] / "results" / "gpu-check"
    (saved,) = root.glob("*/*/scan-seed-float16.json")
    assert cli.main(["scan", "--render", str(saved)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("scan of n over 40000..52000 (m=1, k=4096), float16 on cuda: 181 evaluations") and not err
    assert "nvjet_sm90_hsh_512x8_64x3_4x1_v_bz_NNT" in out and "\\u000a" not in out
    rec = json.loads(saved.read_text())
    rec["complete"] = False
    unfinished = tmp_path / "s.json"
    unfinished.write_text(json.dumps(rec))
    assert cli.main(["scan", "--render", str(unfinished)]) == 0
    assert capsys.readouterr().out.startswith(f"{unfinished}: an unfinished scan (--resume {unfinished} continues it)")
    other = tmp_path / "explain.json"
    other.write_text(json.dumps({"case": "seed", "shape": {}}))
    assert cli.main(["scan", "--render", str(other)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"matmul-drift scan: error: {other} is not a record `scan --json` writes (")
    assert cli.main(["scan", "--render", str(saved), "--dtype", "float16"]) == 2
    assert capsys.readouterr().err == ("matmul-drift scan: error: --render prints a saved record as text and "
                                       "measures nothing; it takes no --dtype\n")
