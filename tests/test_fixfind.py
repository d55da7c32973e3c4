"""The fix finder's verdicts, true by construction: each CPU verdict is checked against its
own computation, plain torch in a fresh process under the same setting, on the same inputs.
The drifting slice is found at test time on the machine that runs it (never hard-coded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from matmul_drift import fixes, fixfind, machine, measure

M, K, N = 64, 512, 256

# Plain torch: the same inputs (the project's generator), the product and the comparison
# written here; prints whether A[:m] @ B (or A @ B[:, :n]) is bit-identical to the full
# product's rows (columns), for the computation the candidate names.
PLAIN = r"""
import json, sys, numpy as np, torch
from matmul_drift import inputs
seed, m, k, n, dim, size, code = json.loads(sys.argv[1])
bits = lambda name, shape: torch.from_numpy(inputs.round_bits(inputs.draw(seed, f"adhoc-{m}x{k}x{n}:{name}", shape, "uniform"), "float32").view(np.int32)).view(torch.float32)
A, B = bits("A", (m, k)), bits("B", (k, n))
full = A @ B
if dim == "m":
    if code == "full":
        y = full[:size]
    elif code and code.startswith("pad:m:"):
        mult = int(code.split(":")[2]); rows = -size % mult
        y = (torch.cat([A[:size], torch.zeros(rows, k)]) @ B)[:size]
    else:
        y = A[:size] @ B
    ref = full[:size]
else:
    if code == "full":
        y = full[:, :size]
    elif code == "contiguous":
        y = A @ B[:, :size].contiguous()
    elif code and code.startswith("pad:n:"):
        mult = int(code.split(":")[2]); cols = -size % mult
        y = (A @ torch.cat([B[:, :size], torch.zeros(k, cols)], dim=1))[:, :size]
    else:
        y = A @ B[:, :size]
    ref = full[:, :size]
print(json.dumps(bool(torch.equal(y.contiguous().view(torch.int32), ref.contiguous().view(torch.int32)))))
"""


def plain(c: fixes.Candidate | None, dim: str, size: int) -> bool:
    code = (fixes.prelude(c) if c else "import torch\n") + PLAIN
    env = {**os.environ, **(c.env if c else {})}
    p = subprocess.run([sys.executable, "-c", code, json.dumps([measure.SEED, M, K, N, dim, size, c.compute if c else None])],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def drifting_slice() -> tuple[str, int]:
    """The first slice of A (rows) or B (columns), by size, that drifts on this machine."""
    for dim, sizes in (("m", range(1, 17)), ("n", range(N - 1, N - 17, -1))):
        for size in sizes:
            if not plain(None, dim, size):
                return dim, size
    pytest.fail("no slice of a 64x512x256 fp32 product drifts on this machine: choose another shape")


@pytest.fixture(scope="module")
def report(drifting_slice):
    dim, size = drifting_slice
    spec = {"m": M, "k": K, "n": N, "dtype": "float32", "device": "cpu", "repeat": 3,
            "slice_n": size if dim == "n" else None, "slice_m": size if dim == "m" else None}
    return fixfind.try_fixes(spec, fixes.onednn_isa(machine.fingerprint()["isa"]))


def test_each_cpu_verdict_matches_plain_torch_under_the_same_setting(report, drifting_slice):
    dim, size = drifting_slice
    assert report["drifts"] == [f"slice_{dim}"]
    by_name = {c.name: c for c, _ in fixes.candidates("cpu", set(report["drifts"]), dim,
                                                       fixes.onednn_isa(machine.fingerprint()["isa"]))}
    measured = [r for r in report["candidates"] if r["verdict"] in ("removes", "reduces", "no effect")]
    assert len(measured) >= 8
    for r in measured:
        identical = plain(by_name[r["name"]], dim, size)
        assert (r["verdict"] == "removes") == identical, (r["name"], r["verdict"], identical)
    verdicts = {r["verdict"] for r in measured}
    assert "removes" in verdicts and ("no effect" in verdicts or "reduces" in verdicts)  # both, really measured


def test_the_report_names_the_cheapest_fix_and_marks_code_changes(report):
    rows = {r["name"]: r for r in report["candidates"]}
    assert rows["full product, then slice"]["verdict"] == "removes" and rows["full product, then slice"]["code_change"]
    assert rows["TF32 off"]["verdict"] == "not applicable" and "CUDA" in rows["TF32 off"]["reason"]
    removes = [r for r in report["candidates"] if r["verdict"] == "removes"]
    assert report["cheapest"] == min(removes, key=lambda r: r["time_ratio"])["name"]
    text = fixfind.render(report)
    assert text.strip().splitlines()[-1].startswith(f"cheapest that removes every drift: {report['cheapest']}")
    json.dumps(report, allow_nan=False)  # strict JSON


def test_a_case_without_drift_says_so_in_one_line(tmp_path):
    rep = {"baseline": {"drift": {"slice_n": {"max_ulp": 0, "max_u": 0.0, "frac_differ": 0.0}}}, "drifts": [],
           "candidates": [], "cheapest": None}
    assert fixfind.render(rep).count("\n") == 1 and "no drift" in fixfind.render(rep)


def test_a_crashing_candidate_is_reported_and_the_others_run(monkeypatch, drifting_slice):
    dim, size = drifting_slice
    bad = fixes.Candidate("crashes", "cpu", fixes.DRIFTS, setup="raise SystemExit('boom')")
    monkeypatch.setattr(fixes, "CANDIDATES", (bad, fixes.CANDIDATES[0]))
    monkeypatch.setattr(fixes, "PAD_MULTIPLES", ())
    rep = fixfind.try_fixes({"m": M, "k": K, "n": N, "dtype": "float32", "device": "cpu", "repeat": 2,
                             "slice_n": size if dim == "n" else None, "slice_m": size if dim == "m" else None},
                            None, timeout=120)
    rows = {r["name"]: r for r in rep["candidates"]}
    assert rows["crashes"]["verdict"] == "failed" and "boom" in rows["crashes"]["reason"]
    assert rows["one thread"]["verdict"] in ("removes", "reduces", "no effect")


def test_try_fixes_on_files_is_one_line_exit_2(tmp_path, capsys):
    import numpy as np

    from matmul_drift import cli

    np.save(tmp_path / "a.npy", np.ones((4, 8), dtype=np.float32))
    np.save(tmp_path / "b.npy", np.ones((8, 4), dtype=np.float32))
    rc = cli.main(["explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--dtype", "float32",
                   "--try-fixes"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--try-fixes takes --case" in err[0]
