"""`matmul-drift explain`: its JSON contract, its verdicts and its one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from matmul_drift import explain


def run(*args, timeout=300):
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_explain_json_contract():
    rc, out, err = run("explain", "--m", "8", "--k", "256", "--n", "64", "--dtype", "float32", "--slice-n", "7", "--slice-m", "3", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert isinstance(r["error_u"], float)
    assert r["gamma_k_u"] == pytest.approx(256 / (1 - 256 * 2.0**-24))
    assert r["slice_n"]["n"] == 7 and isinstance(r["slice_n"]["max_ulp"], int)
    assert set(r["slice_n"]) >= {"n", "max_ulp", "frac_differ", "max_u"}
    assert r["slice_m"]["m"] == 3 and set(r["slice_m"]) >= {"m", "max_ulp", "frac_differ", "max_u"}
    assert set(r["run_to_run"]) >= {"repeat", "max_ulp", "max_u"}
    assert set(r["kernels"]) == {"full", "slice_n", "slice_m"}
    assert any("SGEMM" in k for k in r["kernels"]["full"])
    assert len(r["input_checksum"]) == 64
    assert r["environment"]["torch"]["version"] == torch.__version__
    assert r["verdict"]["kind"] in ("bit-identical", "rounding")


def test_gamma_null_when_ku_at_least_one():
    rc, out, err = run("explain", "--m", "2", "--k", "2048", "--n", "8", "--dtype", "float16", "--json")
    assert rc == 0, err
    assert json.loads(out)["gamma_k_u"] is None


def test_explain_files_1d_and_text(tmp_path):
    a = np.arange(16, dtype=np.float64) / 4  # exact in every dtype
    b = np.ones((16, 5), dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    torch.save(torch.from_numpy(b), tmp_path / "b.pt")
    rc, out, err = run("explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.pt"), "--dtype", "bfloat16", "--slice-n", "3")
    assert rc == 0, err
    assert "bit-identical" in out.splitlines()[-1]
    assert "error_u (u)" in out and "kernels (normalised)" in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--m", "4", "--k", "8", "--n", "8", "--dtype", "float8"], "invalid choice"),
        (["--m", "4", "--k", "8", "--n", "8", "--dtype", "float32", "--slice-n", "9"], "larger than N"),
        (["--m", "4", "--k", "8", "--n", "8", "--dtype", "float32", "--slice-m", "5"], "larger than M"),
        (["--case", "nope", "--dtype", "float32"], "unknown case"),
        (["--m", "4", "--k", "8", "--dtype", "float32"], "go together"),
        (["--case", "seed", "--m", "4", "--k", "8", "--n", "8", "--dtype", "float32"], "exactly one"),
        (["--m", "0", "--k", "8", "--n", "8", "--dtype", "float32"], "at least 1"),
    ],
)
def test_bad_arguments_one_line_exit_2(args, needle):
    rc, out, err = run("explain", *args)
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_bad_files_one_line_exit_2(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((3, 4)))
    np.save(tmp_path / "b.npy", np.ones((5, 2)))
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    np.save(tmp_path / "ints.npy", np.ones((4, 2), dtype=np.int32))
    cases = [
        (["--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy")], "do not match"),
        (["--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "missing.npy")], "cannot read"),
        (["--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "junk.npy")], "cannot read"),
        (["--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "ints.npy")], "floating-point"),
    ]
    for args, needle in cases:
        rc, out, err = run("explain", *args, "--dtype", "float32")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, (args, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_a_usage_error():
    rc, out, err = run("explain", "--case", "square", "--dtype", "float16", "--device", "cuda")
    assert rc == 2 and "no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_verdicts_from_hand_built_reports():
    base = {
        "dtype": "float16", "gamma_k_u": 100.0, "error_u": 1.0, "run_to_run": {"repeat": 3, "max_ulp": 0, "max_u": 0.0},
        "kernels": {"full": ["k1"], "slice_n": ["k2"], "slice_m": []},
        "slices": {"n": [{"n": 5, "max_ulp": 0, "max_u": 0.0, "frac_differ": 0.0, "max_abs": 0.0, "ulp_at_max": None}], "m": []},
    }
    assert explain.verdict(base)["kind"] == "bit-identical"
    drift = json.loads(json.dumps(base))
    drift["slices"]["n"][0].update(max_ulp=1, max_u=1.02, max_abs=0.5, ulp_at_max=0.5, frac_differ=0.1)
    v = explain.verdict(drift)
    assert v["kind"] == "rounding" and "k2" in v["text"] and "1 ulp" in v["text"]
    bad = json.loads(json.dumps(base))
    bad["error_u"] = 101.0
    assert explain.verdict(bad)["kind"] == "defect"
