"""`matmul-drift map`: the map's verdict at every M against a dense truth measured here with
plain torch (under the default route and under MKL_CBWR=AVX2 and COMPATIBLE), its words,
its cost against a dense sweep, one-line errors, and an interrupted map resumed."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from matmul_drift.cli.main import main as cli_main
from matmul_drift.core import cases, mapruns
from matmul_drift.measure import batchpoint, kernels, measure
from matmul_drift.probes import batchmap, classsearch, scan

PNG = b"\x89PNG\r\n\x1a\n"


def map_cli(capsys, *args):
    """Run the map in this process: (exit status, stdout, stderr)."""
    rc = cli_main(["map", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return rc, out, err


def run_map(capsys, tmp_path, *args) -> tuple[dict, str]:
    out = tmp_path / f"map{len(list(tmp_path.iterdir()))}.json"
    rc, text, err = map_cli(capsys, *args, "--json", out)
    assert rc == 0, err
    return json.loads(out.read_text()), text


# --- the dense truth ------------------------------------------------------------------------
# Where the bits or the route change with M depends on the CPU and on MKL_CBWR and
# ONEDNN_MAX_CPU_ISA, so no M is named here: every M is measured densely with plain torch on
# the machine that runs the test, and the map must state exactly that at every M.

DENSE_TOP = 256
DENSE_N = 48


def dense_truth(dtype: str, k: int, n: int, hi: int) -> dict[int, tuple[tuple[str, ...], bool, bool]]:
    """{M: (route, row 0 of A[:M] @ B equal to A[:1] @ B?, A[:M] @ B equal to (A @ B)[:M]?)} for
    every M of 1..hi, on the inputs the map draws for the shape (hi, k, n)."""
    a_bits, b_bits, _ = measure.operand_bits(cases.adhoc(hi, k, n), dtype, "cpu")
    a, b = measure.to_tensor(a_bits, dtype, "cpu"), measure.to_tensor(b_bits, dtype, "cpu")
    one, full = a[:1] @ b, a @ b
    truth = {}
    for m in range(1, hi + 1):
        y = a[:m] @ b
        truth[m] = (tuple(kernels.route(lambda m=m: a[:m] @ b, "cpu")), torch.equal(y[0], one[0]),
                    torch.equal(y, full[:m]))
    return truth


def narrowest_run(truth: dict, lo: int, hi: int) -> int:
    """The fewest members of an alignment class in one run of one state (the search's limit)."""
    fewest = hi
    for c in range(classsearch.CLASS_TOP + 1):
        states = [truth[m] for m in classsearch.class_members(lo, hi, c)]
        runs, start = [], 0
        for i in range(1, len(states) + 1):
            if i == len(states) or states[i] != states[i - 1]:
                runs.append(i - start)
                start = i
        if len(runs) > 2:
            fewest = min(fewest, *runs[1:-1])
    return fewest


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_map_states_the_dense_truth_at_every_m(dtype, capsys, tmp_path):
    for k in (64, 256):
        truth = dense_truth(dtype, k, DENSE_N, DENSE_TOP)
        rec, text = run_map(capsys, tmp_path, "--k", k, "--n", DENSE_N, "--dtype", dtype, "--range", f"1:{DENSE_TOP}")
        names = {p["kernel_id"]: tuple(p["kernels"]) for p in rec["points"]}
        stated = {m: (names[kid], row0, rows) for m, (kid, row0, rows) in mapruns.per_m(rec["verdicts"]).items()}
        wrong = [m for m in truth if stated[m] != truth[m]]
        assert not wrong, (f"{dtype} k={k}: the map differs from the dense truth at M = {wrong} (the narrowest "
                           f"inner run of one state in a class here: {narrowest_run(truth, 1, DENSE_TOP)} members; "
                           f"the grid's gap: {rec['grid_gap']} sizes)")
        assert rec["complete"] and rec["params"]["m_full"] == DENSE_TOP and rec["params"]["full"] == "range"
        assert f"measured {rec['measured']} of {DENSE_TOP} batch sizes" in text


@pytest.mark.parametrize("route", ["MKL_CBWR=AVX2", "MKL_CBWR=COMPATIBLE"])
def test_map_states_the_dense_truth_under_other_routes(route):
    """The same dense-truth test in a process whose MKL and oneDNN take other routes (both are
    read when the libraries load, so only a fresh process can take them)."""
    key, value = route.split("=")
    env = {**os.environ, key: value, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           f"{__file__}::test_map_states_the_dense_truth_at_every_m"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1], check=False)
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


# --- cost -----------------------------------------------------------------------------------


def test_a_map_of_256_batch_sizes_measures_fewer_and_says_how_many(capsys, tmp_path):
    recs = {}
    for dtype in ("float32", "bfloat16"):
        rec, text = run_map(capsys, tmp_path, "--k", 256, "--n", 48, "--dtype", dtype, "--range", "1:256")
        assert rec["range_size"] == 256 and rec["products"] == rec["measured"] + 2
        assert rec["measured"] == len(rec["points"]) == sum(s["evaluated"] for s in rec["sessions"])
        assert f"measured {rec['measured']} of 256 batch sizes" in text
        recs[dtype] = rec
    assert any(r["measured"] < 256 for r in recs.values()), {d: r["measured"] for d, r in recs.items()}


# --- words ----------------------------------------------------------------------------------


def point(size, kernel, row0_ulp, rows_ulp, rows_frac=None):
    """A constructed map point: ulps 0 and no entry differing is invariant."""
    return {"size": size, "kernel_id": kernel, "kernels": ["aten::mm", f"route {kernel}"],
            "row0_max_ulp": row0_ulp, "row0_frac_differ": 0.5 if row0_ulp else 0.0, "row0_max_u": 0.0,
            "rows_max_ulp": rows_ulp, "rows_frac_differ": (0.5 if rows_ulp else 0.0) if rows_frac is None else rows_frac,
            "rows_max_u": 0.0}


def test_words_for_constructed_points():
    points = {m: point(m, "aaa" if m < 8 else "bbb", 0 if m <= 3 or 8 <= m <= 9 else 2,
                       0 if m % 4 == 0 else m % 3 + 1) for m in range(1, 17)}
    assert batchmap.words(points, 1, 16, 16) == (
        "row 0 as at M = 1: invariant at M = 1..3, 8..9; drifts elsewhere (max 2 ulp)\n"
        "rows as in the full product (M = 16): invariant at M = 4, 8, 12, 16; drifts elsewhere (max 3 ulp)\n"
        "kernels: aaa at M = 1..7; bbb at M = 8..16\n"
        "    aaa: route aaa\n"
        "    bbb: route bbb")
    # every M alike; drift in entries between finite and inf alone (0 ulp) is drift
    same = {m: point(m, "aaa", 0, 0, rows_frac=0.25) for m in range(1, 5)}
    assert batchmap.words(same, 1, 4, 4) == (
        "row 0 as at M = 1: invariant at every M, 1..4\n"
        "rows as in the full product (M = 4): drifts at every M (entries differ between finite and NaN/inf only)\n"
        "kernels: one route at every M: aaa (route aaa)")
    # more runs than MAX_SPANS: stated by alignment class, as scan states a pattern
    periodic = {m: point(m, "aaa", 1, 0 if m % 4 == 0 else 3) for m in range(1, 49)}
    assert batchmap.words(periodic, 1, 48, 48).splitlines()[1] == (
        "rows as in the full product (M = 48): invariant at 12 of 48 M, by alignment: "
        "1..48: drift, except multiples of 4: no drift (max 3 ulp)")


def test_unmeasured_m_take_their_class_state():
    # measured: odd 1 and 9 alike, so 3..7 odd are stated as they are; 2 mod 4 likewise
    measured = {m: point(m, "aaa", 0, 0) for m in (1, 2, 4, 8, 9, 10)}
    runs = batchmap.verdicts(measured, 1, 10)
    assert runs == [{"lo": 1, "hi": 10, "kernel_id": "aaa", "row0": True, "rows": True, "measured": 6}]


# --- bad input --------------------------------------------------------------------------------

BASE = ["--k", "32", "--n", "8", "--dtype", "float32"]


@pytest.mark.parametrize("args, needle", [
    ([*BASE, "--range", ""], "expected LO:HI"),
    ([*BASE, "--range", "9:3"], "9:3 is reversed"),
    ([*BASE, "--range", "0:5"], "sizes start at 1"),
    ([*BASE, "--range", "4:4"], "a map needs at least two"),
    ([*BASE, "--range", "1:x"], "expected two integers"),
    (["--k", "32", "--n", "8", "--dtype", "float32-tf32"], "a CUDA matmul mode; it does not apply on the CPU"),
    (["--k", "32", "--n", "8", "--dtype", "int8"], "invalid choice"),
    (["--k", "32", "--dtype", "float32"], "give --case NAME, or --k K and --n N"),
    (["--case", "bmm", "--k", "4", "--dtype", "float32"], "--case bmm fixes K and N"),
    (["--case", "seed", "--dtype", "float32"], "no batch dimension"),
    (["--case", "nope", "--dtype", "float32"], "unknown case 'nope'"),
    (["--case", "skinny", "--dtype", "float32", "--range", "1:9"], "skinny has M = 8 on cpu"),
    ([*BASE, "--resume", "/nonexistent/map.json"], "no such file"),
    ([*BASE, "--plot", "map.svg"], "name it FILE.png"),
])
def test_bad_input_one_line_exit_2(args, needle, capsys):
    rc, out, err = map_cli(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_one_line(capsys):
    rc, out, err = map_cli(capsys, *BASE, "--device", "cuda")
    assert rc == 2 and out == "" and "no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_memory_is_checked_before_anything_is_drawn(capsys, monkeypatch):
    from matmul_drift.measure import memory

    monkeypatch.setattr(memory, "available", lambda device: (1 << 20, None))  # 1 MiB
    monkeypatch.setattr(measure, "operand_bits", lambda *a, **kw: pytest.fail("inputs drawn before the check"))
    rc, _, err = map_cli(capsys, *BASE, "--range", "1:8")
    assert rc == 2 and "MemAvailable" in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.undo()
    monkeypatch.setattr(memory, "available", lambda device: (1 << 20, None))
    rc, out, err = map_cli(capsys, *BASE, "--range", "1:8", "--no-host-memory-check")
    assert rc == 0 and "measured 8 of 8 batch sizes" in out, err


def test_resume_refuses_what_is_not_this_map(capsys, tmp_path):
    rec_path = tmp_path / "m.json"
    assert map_cli(capsys, *BASE, "--range", "1:8", "--json", rec_path)[0] == 0
    bad = tmp_path / "bad.json"
    for text, needle in (("{not json", "is not JSON"), ("null", "not a map record"),
                         (json.dumps({"schema": scan.SCHEMA}), "not a map record")):
        bad.write_text(text)
        rc, _, err = map_cli(capsys, *BASE, "--range", "1:8", "--resume", bad)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    rc, _, err = map_cli(capsys, "--k", "16", "--n", "8", "--dtype", "float32", "--range", "1:8", "--resume", rec_path)
    assert rc == 2 and "the record is another map; k: recorded 32, here 16" in err, err
    rec = json.loads(rec_path.read_text())
    rec["points"][0]["rows_max_ulp"] = "many"
    bad.write_text(json.dumps(rec))
    rc, _, err = map_cli(capsys, *BASE, "--range", "1:8", "--resume", bad)
    assert rc == 2 and "malformed point" in err and len(err.strip().splitlines()) == 1, err
    rc, _, err = map_cli(capsys, *BASE, "--range", "1:8", "--json", rec_path)
    assert rc == 2 and "exists; continue it with --resume" in err


# --- interruption -------------------------------------------------------------------------------


def test_ctrl_c_keeps_the_record_and_resume_gives_the_uninterrupted_map(capsys, tmp_path, monkeypatch):
    args = ["--k", "256", "--n", "48", "--dtype", "float32", "--range", "1:128"]
    whole, _ = run_map(capsys, tmp_path, *args)
    measured, calls = batchpoint.batch_point, []

    def pressed(*a, **kw):  # Ctrl-C during the tenth M: it finishes and is kept
        calls.append(a[1])
        if len(calls) == 10:
            os.kill(os.getpid(), signal.SIGINT)
        return measured(*a, **kw)

    monkeypatch.setattr(batchpoint, "batch_point", pressed)
    path, plot = tmp_path / "cut.json", tmp_path / "cut.png"
    rc, out, err = map_cli(capsys, *args, "--json", path)
    assert rc == 130 and out == "" and f"interrupted after 10 batch sizes; {path} holds them" in err, err
    cut = json.loads(path.read_text())
    assert not cut["complete"] and sorted(p["size"] for p in cut["points"]) == sorted(calls)

    monkeypatch.setattr(batchpoint, "batch_point", measured)
    rc, out, err = map_cli(capsys, *args, "--resume", path, "--plot", plot)
    assert rc == 0, err
    final = json.loads(path.read_text())
    assert final["complete"] and [s["evaluated"] for s in final["sessions"]] == [10, whole["measured"] - 10]
    for key in ("verdicts", "words", "measured", "points"):
        assert final[key] == whole[key], key
    assert f"measured {whole['measured']} of 128 batch sizes" in out
    assert plot.read_bytes()[:8] == PNG


def test_a_case_maps_against_its_own_m_and_plots(capsys, tmp_path):
    plot = tmp_path / "bmm.png"
    rec, text = run_map(capsys, tmp_path, "--case", "bmm", "--dtype", "float32", "--range", "1:40", "--plot", plot)
    p = rec["params"]
    assert (p["case"], p["op"], p["m_full"], p["full"], p["batch"]) == ("bmm", "bmm", 64, "case", 16)
    assert "with the full product A[:64] @ B (M = 64, the case's M)" in text
    assert plot.read_bytes()[:8] == PNG and plot.stat().st_size < 200_000


# --- paths that claim determinism or batch invariance (--modes) ------------------------------


def test_every_path_is_mapped_against_its_own_dense_truth_or_said_unavailable(capsys):
    """Each setting of the fix finder is either mapped, in a fresh process with the setting in
    force, and that map equals a dense truth measured by plain torch in another fresh process
    under the same setting; or listed with the reason it does not apply here. None is left out."""
    from matmul_drift.probes import batchmap_modes, fixes

    spec = {"case": None, "k": 64, "n": DENSE_N, "range": [1, 64], "precision": "float32", "device": "cpu"}
    got = batchmap_modes.run_modes(spec)
    settings = [c.name for c, _ in fixes.candidates("cpu", {"slice_m"}, "m", fixes.onednn_isa_in_force(), "float32")
                if not c.changes_code]
    assert [r["name"] for r in got["modes"]] == settings
    measured = [r for r in got["modes"] if "record" in r]
    assert measured and "record" in got["default"], got
    assert all(r["why"] for r in got["modes"] if "record" not in r), got  # no path silently skipped
    assert all("why" in r for r in got["modes"] if r["name"] in ("deterministic algorithms", "batch_invariant_ops kernels"))
    for r in [{"name": None, "env": {}, **got["default"]}, *measured]:
        c = next((c for c, _ in batchmap_modes.paths("cpu", "float32") if c.name == r["name"]), None)
        code = (fixes.prelude(c) if c else "import torch\n") + (
            "import json, sys\nsys.path.insert(0, sys.argv[1])\nfrom test_map import dense_truth\n"
            "print(json.dumps({m: v for m, v in dense_truth('float32', 64, %d, 64).items()}))\n" % DENSE_N)
        done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env={**os.environ, **r["env"]},
                              capture_output=True, text=True, timeout=300, check=True)
        truth = {int(m): (tuple(route), row0, rows) for m, (route, row0, rows) in json.loads(done.stdout).items()}
        rec = r["record"]
        names = {p["kernel_id"]: tuple(p["kernels"]) for p in rec["points"]}
        stated = {m: (names[kid], row0, rows) for m, (kid, row0, rows) in mapruns.per_m(rec["verdicts"]).items()}
        assert stated == truth, (r["name"], [m for m in truth if stated[m] != truth[m]])
        assert r["seconds"]["median"] > 0


def test_the_paths_words_give_no_ratio_where_the_default_moved():
    from matmul_drift.probes import batchmap_modes

    rec = {"verdicts": [{"lo": 1, "hi": 8, "row0": True, "rows": True, "kernel_id": "a", "measured": 4}],
           "words": "row 0 as at M = 1: invariant at every M, 1..8\nrows as in the full product (M = 8): x\nkernels: y"}
    s = {"median": 1e-3, "iqr": 1e-5, "runs": 5}
    steady = {"default": {"record": rec, "seconds": s, "seconds_after": s, "stable": True},
              "modes": [{"name": "one thread", "env": {}, "record": rec, "seconds": {**s, "median": 2e-3}, "time_ratio": 2.0},
                        {"name": "TF32 off", "env": {}, "why": "a CUDA setting; this case runs on cpu"},
                        {"name": "split-K off", "env": {}, "failed": "AssertionError: no split-K setting"}]}
    text = batchmap_modes.words(steady)
    assert "one thread: the same map as the default; full product 2 ms a call (IQR 0.01 ms), 2.00x the default's time" in text
    assert "TF32 off: not available here: a CUDA setting; this case runs on cpu" in text
    assert "split-K off: failed: AssertionError: no split-K setting" in text
    moved = {**steady, "default": {**steady["default"], "stable": False}}
    moved["modes"] = [{k: v for k, v in m.items() if k != "time_ratio"} for m in steady["modes"]]
    assert "(the load changed: no ratios)" in batchmap_modes.words(moved) and "x the default's" not in batchmap_modes.words(moved)


# --- the suite's way: plan, Mapper, complete, confirm, the catalog entry ----------------------


def test_the_suites_map_is_the_clis_and_its_entry_is_confirmed_and_drawn(capsys, tmp_path):
    """The suite maps without a file or signals (batchmap_run.complete): the same record as the
    command's; its catalog entry (batchmap.entry) is confirmed on the same inputs by each run's
    first and last M, refuted where it states another state, and drawn by map_plot."""
    from matmul_drift.probes import batchmap_run, map_plot

    rec, _ = run_map(capsys, tmp_path, "--case", "bmm", "--dtype", "float32", "--range", "1:40")
    mapper = batchmap_run.Mapper(batchmap_run.plan("bmm", None, None, (1, 40), "float32", "cpu"))
    whole = batchmap_run.complete(mapper)
    for key in ("verdicts", "words", "measured", "points", "input_checksum", "anchor_checksum", "params"):
        assert whole[key] == rec[key], key
    assert whole["complete"] and whole["sessions"][0]["evaluated"] == whole["measured"]

    e = batchmap.entry(whole)
    assert "env_id" not in e["params"] and e["measured"] == sorted(p["size"] for p in rec["points"])
    assert batchmap.entry_misfit(e, mapper.plan.params) is None
    held = batchmap_run.confirm(mapper, e["verdicts"])
    assert held["differ"] == [] and held["sizes"] == mapruns.ends(e["verdicts"], batchmap_run.CONFIRM_MOST)
    assert held["sizes"][0] == 1 and held["sizes"][-1] == 40 and len(held["sizes"]) <= batchmap_run.CONFIRM_MOST

    first = e["verdicts"][0]  # M = 1 is always row 0 of A[:1] @ B: recorded as drifting, refuted there
    wrong = [dict(first, row0=not first["row0"]), *e["verdicts"][1:]]
    refuted = batchmap_run.confirm(mapper, wrong)
    assert refuted["differ"][0][0] == 1 and refuted["differ"][0][1][1] is False and refuted["differ"][0][2][1] is True

    shorter = batchmap_run.plan("bmm", None, None, (1, 32), "float32", "cpu").params
    assert batchmap.entry_misfit(e, shorter) == "another map: hi 40, here 32"
    longer = [*e["verdicts"][:-1], dict(e["verdicts"][-1], hi=41)]
    assert batchmap.entry_misfit({**e, "verdicts": longer}, mapper.plan.params) == "its verdicts end at M = 41, not 40"
    assert batchmap.entry_misfit({**e, "verdicts": e["verdicts"][1:]}, mapper.plan.params) == (
        "its verdicts do not cover M = 1..40 run by run (at M = 1)")
    assert batchmap.entry_misfit({"schema": "x"}, mapper.plan.params).startswith("not a map entry")
    assert map_plot.png([map_plot.from_entry(e)])[:8] == PNG


def test_the_map_takes_the_row_slices_the_measurement_made_of_the_same_inputs(monkeypatch):
    """measure makes skinny's A[:m] @ B for M = 1..7 and the full product (M = 8); the suite's map
    of M = 1..8 after it, in the same process, makes none of them again (its anchors, M = 1 and
    the full product, neither), and states what a map made from scratch states."""
    from matmul_drift.probes import batchmap_run

    def mapper():
        return batchmap_run.Mapper(batchmap_run.plan("skinny", None, None, None, "float32", "cpu"))

    monkeypatch.setattr(measure, "_ROWS", {})
    fresh = batchmap_run.complete(mapper())
    calls, real = [], measure.Operands.product
    monkeypatch.setattr(measure.Operands, "product", lambda self, *a: (calls.append(a), real(self, *a))[1])
    measure.measure(cases.get("skinny"), "float32", "cpu", timing=False)
    made = len(calls)
    m = mapper()
    after = batchmap_run.complete(m)
    # the one product the map makes: |A||B| (abs_product_pow2), of the operands' absolute values
    assert sorted(m.made) == list(range(1, 9)) and after["measured"] == 8 and len(calls) == made + 1
    for key in ("verdicts", "words", "measured", "points", "input_checksum", "anchor_checksum", "params"):
        assert after[key] == fresh[key], key
    assert measure.rows_made("skinny", m.checksum, "float64", "cpu") == {}  # another precision: its own products
    assert measure.rows_made("skinny", "0" * 64, "float32", "cpu") == {}  # other inputs
    monkeypatch.setattr(measure, "_ROWS", {})
    monkeypatch.setattr(measure, "ROWS_TOTAL", 9 * 4096 * 4)  # 9 rows of float32: the full product's 8, then M = 1
    measure.measure(cases.get("skinny"), "float32", "cpu", timing=False)
    assert sorted(measure.rows_made("skinny", m.checksum, "float32", "cpu")) == [1, 8]  # no more than it holds
    threads = torch.get_num_threads()
    torch.set_num_threads(threads - 1 if threads > 1 else 2)
    try:
        assert measure.rows_made("skinny", m.checksum, "float32", "cpu") == {}  # another thread count
    finally:
        torch.set_num_threads(threads)


def test_ends_are_each_runs_first_and_last_m_spread_where_many():

    def run(lo, hi):
        return {"lo": lo, "hi": hi, "kernel_id": "a", "row0": True, "rows": lo % 2 == 0}

    assert mapruns.ends([run(1, 3), run(4, 4), run(5, 64)], 12) == [1, 3, 4, 5, 64]
    periodic = [run(m, m) for m in range(1, 257)]  # a run every M: 256 ends
    got = mapruns.ends(periodic, 12)
    assert len(got) == 12 and got[0] == 1 and got[-1] == 256 and got == sorted(got)


def test_the_suite_maps_only_to_64_where_the_cpu_runs_torchs_own_loop(tmp_path, monkeypatch):
    """The suite's range on the CPU follows the route measured here, not a dtype: 1..64 where
    the full product ran torch's own loop ("native": fp16 or bf16 without a vendor kernel on this
    CPU), the case's whole range elsewhere."""
    from matmul_drift.jobs import selection, suite
    from matmul_drift.jobs.selection import Cell
    from matmul_drift.store import catalog

    monkeypatch.setenv(selection.ORDERS_VAR, "0")
    monkeypatch.setenv(selection.FIXES_VAR, "0")
    out = suite.measure_all(["linear"], ["float32", "float16", "bfloat16"], ["cpu"], root=tmp_path, log=open(os.devnull, "w"))
    m = cases.get("linear").shape("cpu").m
    for p in ("float32", "float16", "bfloat16"):
        v = out[Cell("linear", p, "cpu")]
        full = catalog.load(tmp_path, "kernels", v["kernel_id"])["full"]
        native = [k for k in full if not k.startswith("aten::")] == ["native"]
        entry = catalog.load(tmp_path, "maps", v["map_id"])
        assert entry["params"]["hi"] == (min(64, m) if native else min(256, m)), (p, full, entry["params"])


# --- the search on synthetic routes (no torch) ------------------------------------------------
# Routes whose invariance has a period that is no power of two, as kernels that block M by 6 or
# 14 give it, and runs that change and change back inside one class: the search must state
# every M as the route has it, or say that it did not see a run (no spot check on it, narrower
# than the grid), or fall back to measuring densely and say so.


def synthetic(rows_invariant, kernel=lambda m: "aaa"):
    """An evaluate(M) for batchmap.search and its truth: row 0 drifts above M = 1, the rows are
    invariant where ``rows_invariant(M)``."""
    def evaluate(m):
        return point(m, kernel(m), 0 if m == 1 else 1, 0 if rows_invariant(m) else 2)
    return evaluate, lambda m: batchmap.state(evaluate(m))


def mapped(evaluate, lo=1, hi=256):
    calls = []
    points, found = batchmap.search(lo, hi, lambda m: calls.append(m) or evaluate(m))
    assert len(calls) == len(set(calls)) == len(points)  # nothing measured twice
    params = batchmap.Params(None, "mm", lo, hi, hi, "range", 64, 48, None, "float32", "cpu", 0,
                             "0" * 12)
    rec = batchmap.record(params, points, input_checksum="x", anchor_checksum="y", environment={},
                          sessions=[], complete=True, search=found)
    stated = mapruns.per_m(rec["verdicts"])
    return rec, stated, found


@pytest.mark.parametrize("period, holds", [(6, (0, 4, 5)), (14, (0, 1, 2, 3, 4, 5, 6, 7)),
                                           (12, (8, 9, 10, 11, 0))])
def test_a_route_with_a_period_of_6_or_14_is_stated_exactly(period, holds):
    evaluate, truth = synthetic(lambda m: m % period in holds)
    rec, stated, found = mapped(evaluate)
    assert [m for m in range(1, 257) if stated[m] != truth(m)] == []
    assert found["period"] % period == 0 and found["prefix"] == [1, classsearch.PREFIX]
    assert not found["failed"] and all(m not in found["checked"] for m in range(1, classsearch.PREFIX + 1))
    text = batchmap.render(rec)
    assert f"measured {rec['measured']} of 256 batch sizes" in text
    assert f"by the batch size modulo {found['period']}" in text
    if found["checked"]:
        checks = f"{len(found['checked'])} batch sizes not measured were spot-checked"
        assert f"{checks} (seed {classsearch.CHECK_SEED}" in text
    # the same route under the search by powers of two alone states it wrongly: what #68 found
    views = {m: batchmap._view(evaluate(m)) for m in range(1, 257)}
    alone = classsearch.class_search(1, 256, lambda m: views[m])
    assert any(classsearch.state_at(alone, m)[0] != batchmap.state(evaluate(m)) for m in range(1, 257))
    # the same route after a change of period part-way (6, then 12 above M = 36), as MKL's AVX2 gave
    evaluate, truth = synthetic(lambda m: m % 6 in (0, 4, 5) if m <= 36
                                else m % 12 in (8, 9, 10, 11, 0))
    rec, stated, found = mapped(evaluate)
    assert [m for m in range(1, 257) if stated[m] != truth(m)] == []


@pytest.mark.parametrize("width", [1, 3, 7, 15])
def test_a_run_that_changes_back_inside_one_class_is_stated_or_said_unseen(width):
    """A run of odd M alone in another state, at each place of the range beyond the prefix: where
    a spot check lands on it, the search measures its stretch densely and says so; where none
    does, and it is narrower than the grid, the map says that such runs can go unseen."""
    caught = missed = 0
    for start in range(classsearch.PREFIX + 1, 256 - 2 * width, 2):
        run = range(start | 1, (start | 1) + 2 * width, 2)  # `width` odd M
        evaluate, truth = synthetic(lambda m, run=run: m not in run)
        rec, stated, found = mapped(evaluate)
        wrong = [m for m in range(1, 257) if stated[m] != truth(m)]
        hit = [m for m in found["checked"] if m in run]
        if hit:  # a check on the run: stated exactly; where the check failed, its stretch measured
            assert wrong == [], (start, found)
            failed = [m for m in hit if m in found["failed"]]
            caught += bool(failed)
            assert all(any(a <= m <= b for a, b in found["dense"]) for m in failed)
            assert not failed or "were measured densely" in batchmap.render(rec)
        elif wrong:
            missed += 1
            assert set(wrong) <= set(run) and 2 * width < rec["grid_gap"], (start, wrong)
            assert f"a run of fewer than {rec['grid_gap']} batch sizes" in batchmap.render(rec)
    assert caught or (width > 3 and not missed), "no spot check caught a run the grid missed"


def test_a_route_with_no_pattern_falls_back_to_dense_and_says_so():
    """Beyond a regular prefix, M that drift follow no period (a hash of M picks one in five): the
    spot checks keep failing, and the last round measures every M left; the map is then exact
    at every M and says how it got there."""
    evaluate, truth = synthetic(lambda m: m <= classsearch.PREFIX or (m * 2654435761) % 1021 % 5)
    rec, stated, found = mapped(evaluate)
    assert [m for m in range(1, 257) if stated[m] != truth(m)] == []
    assert found["period"] == 1 and found["failed"] and found["rest"] and rec["measured"] == 256
    assert "every size left was measured (a dense sweep)" in batchmap.render(rec)
