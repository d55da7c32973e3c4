"""`matmul-drift explain`: its JSON contract, its verdicts and its one-line errors."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from matmul_drift.core import cases, ids
from matmul_drift.probes import explain, explain_run


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
    assert set(r["bits"]) == {"full", "slice_n=7", "slice_m=3"}
    assert all(len(h) == 64 for h in r["bits"].values())
    assert r["bits_id"] == ids.hex_id(ids.object_id(r["bits"]))
    assert r["environment"]["torch"]["version"] == torch.__version__
    assert r["verdict"]["kind"] in ("bit-identical", "rounding")
    t = r["seconds"]
    assert t["runs"] >= 5 and t["threads"] == torch.get_num_threads() and 0 < t["median"] < 1
    assert t["iqr"] >= 0 and t["noisy"] == (t["iqr"] / t["median"] > 0.1)


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
    # the full product's digest beside its bits-id, the slice's in the drift table (12 hex each)
    assert re.search(r"^bits-id +[0-9a-f]{12} \(full product's sha256 [0-9a-f]{12}\)$", out, re.M)
    assert re.search(r"^slice_n +3 .* [0-9a-f]{12}$", out, re.M)


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
        (["--m", "4", "--k", "8", "--n", "8", "--dtype", "float32", "--fix-timeout", "5"], "--fix-timeout goes with --try-fixes"),
        (["--m", "4", "--k", "8", "--n", "8", "--dtype", "float32", "--fix-budget", "5"], "--fix-budget goes with --try-fixes"),
        (["--m", "4", "--k", "8", "--n", "8", "--dtype", "float32", "--try-fixes", "--fix-budget", "0"], "at least 1"),
    ],
)
def test_bad_arguments_one_line_exit_2(args, needle):
    rc, out, err = run("explain", *args)
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("command", ["explain", "order"])
def test_a_slice_the_case_lacks_is_named_before_a_missing_gpu(command):
    # the GPU check's command lines are tried on machines without one: a bad slice must show there.
    # explain and order check slices in one place (order once took A[:1] of the seed's 1-D A
    # and died in an IndexError)
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    no_gpu = "cuda requested but no CUDA GPU is available"
    tries = [(["--slice-n", "60000"], "--slice-n 60000 is larger than N = 51000"),
             (["--slice-m", "1"], "--slice-m needs a 2-D A"), ([], no_gpu)]
    if command == "order":  # its --form 2d makes the 1-D A one row
        tries += [(["--form", "2d", "--slice-m", "1"], no_gpu), (["--form", "2d", "--slice-m", "2"], "--slice-m 2 is larger than M = 1")]
    for args, needle in tries:
        rc, out, err = run(command, "--case", "seed", "--dtype", "float16", "--device", "cuda", *args)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


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


def _main(*args):
    """cli.main in this process: (exit status, stdout, stderr); an exception escaping is a traceback."""
    import contextlib
    import io

    from matmul_drift.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(args))
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("layout", ["as-stored", "contiguous"])
@pytest.mark.parametrize("make,needle", [
    (lambda: torch.eye(4).to_sparse(), "a sparse tensor (torch.sparse_coo); explain measures dense operands"),
    (lambda: torch.eye(4).to_sparse_csr(), "a sparse tensor (torch.sparse_csr)"),
    (lambda: torch.empty(4, 4, device="meta"), "a meta tensor, shape (4, 4) and no values"),
    (lambda: torch.nested.nested_tensor([torch.ones(4), torch.ones(4)]), "a nested tensor; explain measures dense operands"),
])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")  # torch's, making the input
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")  # likewise
def test_tensors_without_dense_values_are_refused_in_one_line(tmp_path, make, needle, layout):
    torch.save(make(), tmp_path / "a.pt")
    np.save(tmp_path / "b.npy", np.ones((4, 3), dtype=np.float32))
    rc, out, err = _main("explain", "--a", str(tmp_path / "a.pt"), "--b", str(tmp_path / "b.npy"),
                         "--dtype", "float32", "--layout", layout)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and needle in err, err


def test_legacy_pt_files_larger_than_memory_are_refused_before_reading(tmp_path, monkeypatch):
    """torch's legacy format cannot be mapped: it is read whole, so its size is weighed first."""
    from matmul_drift.measure import memory

    torch.save(torch.ones(16, 16), tmp_path / "a.pt", _use_new_zipfile_serialization=False)  # about 1.4 KB
    np.save(tmp_path / "b.npy", np.ones((16, 4), dtype=np.float32))
    monkeypatch.setattr(memory, "available", lambda device: (1000, None))
    args = ["explain", "--a", str(tmp_path / "a.pt"), "--b", str(tmp_path / "b.npy"), "--dtype", "float32"]
    rc, out, err = _main(*args)
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert "a.pt: torch's legacy format" in err and "re-save it with torch.save's default format" in err
    rc, out, err = _main(*args, "--no-host-memory-check")
    assert rc in (0, 1) and "16×16 @ 16×4" in out and "Traceback" not in err, err


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_files_in_the_other_byte_order_are_measured_as_their_values(tmp_path, order):
    """A .npy written on (or for) a big-endian machine, '>f8' or '>f4', holds the same values
    as its native twin; torch.from_numpy refuses it, and explain once said 'cannot read'."""
    g = np.random.default_rng(11)
    a, b = g.standard_normal((6, 9)), g.standard_normal((9, 5)).astype(np.float32)
    keep = np.asfortranarray if order == "F" else np.ascontiguousarray
    for name, x in (("a", a), ("b", b)):
        np.save(tmp_path / f"{name}.npy", keep(x))
        np.save(tmp_path / f"{name}_swapped.npy", keep(x.astype(x.dtype.newbyteorder("S"))))
    assert not np.load(tmp_path / "a_swapped.npy").dtype.isnative
    reports = []
    for suffix in ("", "_swapped"):
        rc, out, err = _main("explain", "--a", str(tmp_path / f"a{suffix}.npy"), "--b", str(tmp_path / f"b{suffix}.npy"),
                             "--dtype", "float64", "--slice-n", "4", "--slice-m", "2", "--json")
        assert rc == 0, err
        reports.append(json.loads(out))
    native, swapped = reports
    for key in ("error_u", "error_entries", "input_checksum", "layout", "slices", "nonfinite"):
        assert swapped[key] == native[key], key
    assert swapped["layout"]["a"]["order"] == order


def test_a_swapped_npy_larger_than_memory_is_refused_before_reading(tmp_path, monkeypatch):
    """Swapping the bytes reads the file whole (it cannot be mapped as torch wants), so its
    size is weighed first, as for torch's legacy format."""
    from matmul_drift.measure import memory

    np.save(tmp_path / "a.npy", np.ones((16, 16), dtype=">f4"))
    np.save(tmp_path / "b.npy", np.ones((16, 4), dtype=np.float32))
    monkeypatch.setattr(memory, "available", lambda device: (500, None))
    args = ["explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--dtype", "float32"]
    rc, out, err = _main(*args)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "a.npy: values in the other byte order" in err and "re-save it in this machine's byte order" in err, err
    rc, out, err = _main(*args, "--no-host-memory-check")
    assert rc == 0 and "16×16 @ 16×4" in out, err


def test_entries_that_rounding_to_dtype_makes_inf_or_zero_are_named(tmp_path):
    """A file's finite values beyond float16's range become inf, tiny ones 0: the verdict once
    said 'A has 3 NaN or inf entries' of a file that has none, and nothing of values lost to 0.
    IEEE binary16: |x| >= 65504 + 16 (half its last ulp) rounds to inf, |x| <= 2^-25 (half the
    smallest subnormal, a tie that goes to the even 0) to 0."""
    a = np.array([[1e6, 1.0, 1e-10, 2.0**-25], [65519.0, 65520.0, -7e4, 2.0**-24]], dtype=np.float32)
    b = np.array([[1.0], [2.0**-26], [1.0], [3.0]])  # float64
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc, out, err = _main("explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--dtype", "float16", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["rounding"] == {"a": {"to_inf": 3, "to_zero": 2}, "b": {"to_inf": 0, "to_zero": 1}}
    assert r["nonfinite"]["a"] == 3 and r["verdict"]["kind"] == "non-finite inputs"
    assert r["verdict"]["text"].endswith("; rounding the files to float16 made 3 finite entries of A ±inf, "
                                         "2 non-zero entries of A 0 and 1 non-zero entry of B 0")
    rc, out, err = _main("explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--dtype", "float32", "--json")
    r = json.loads(out)  # float32 holds every value but B's 2^-26, exactly
    assert rc == 0 and r["rounding"] == {"a": {"to_inf": 0, "to_zero": 0}, "b": {"to_inf": 0, "to_zero": 0}}, err
    assert "rounding the files" not in r["verdict"]["text"]


@pytest.mark.parametrize("dtype", [d for d in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                                                 "float8_e8m0fnu") if hasattr(torch, d)])
def test_float8_files_are_measured_as_the_float32_values_they_hold(tmp_path, dtype):
    """float32 holds every float8 value exactly, so a float8 file and its float32 copy are the
    same operands: the same report. (torch counts nothing in float8: counting what rounding
    lost once raised NotImplementedError there.)"""
    g = np.random.default_rng(3)
    a8 = torch.from_numpy(g.uniform(0.25, 4, (5, 7)).astype(np.float32)).to(getattr(torch, dtype))
    b8 = torch.from_numpy(g.uniform(0.25, 4, (7, 3)).astype(np.float32)).to(getattr(torch, dtype))
    torch.save(a8, tmp_path / "a8.pt")
    torch.save(b8.t().contiguous().t(), tmp_path / "b8.pt")  # a transposed view, as stored
    torch.save(a8.float(), tmp_path / "a32.pt")
    torch.save(b8.float().t().contiguous().t(), tmp_path / "b32.pt")
    reports = []
    for w in ("8", "32"):
        rc, out, err = _main("explain", "--a", str(tmp_path / f"a{w}.pt"), "--b", str(tmp_path / f"b{w}.pt"),
                             "--dtype", "float16", "--json")
        assert rc == 0, err
        reports.append(json.loads(out))
    for key in ("error_u", "input_checksum", "layout", "rounding", "nonfinite"):
        assert reports[0][key] == reports[1][key], key


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="no float4 in this torch")
@pytest.mark.parametrize("layout", ["as-stored", "contiguous"])
def test_a_float_dtype_torch_cannot_convert_is_one_line(tmp_path, layout):
    """float4_e2m1fn_x2 is a floating-point dtype (two values packed per byte) that torch
    cannot convert to any other: its NotImplementedError once escaped as a traceback."""
    torch.save(torch.zeros(4, 5, dtype=torch.uint8).view(torch.float4_e2m1fn_x2), tmp_path / "a.pt")
    np.save(tmp_path / "b.npy", np.ones((5, 3), dtype=np.float32))
    rc, out, err = _main("explain", "--a", str(tmp_path / "a.pt"), "--b", str(tmp_path / "b.npy"), "--dtype", "float32",
                         "--layout", layout)
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert "a.pt: torch cannot convert torch.float4_e2m1fn_x2 to float32" in err, err


def test_files_that_are_not_regular_are_refused_before_opening(tmp_path):
    np.save(tmp_path / "b.npy", np.ones((4, 4), dtype=np.float32))
    os.mkfifo(tmp_path / "fifo.npy")  # np.load or torch.load would wait for a writer forever
    os.mkfifo(tmp_path / "fifo.pt")
    os.symlink(tmp_path / "fifo.pt", tmp_path / "link.pt")
    os.mkdir(tmp_path / "dir.npy")
    for a, b, needle in [("fifo.npy", "b.npy", "fifo.npy: not a regular file (a FIFO)"),
                         ("b.npy", "link.pt", "link.pt: not a regular file (a FIFO)"),
                         ("b.npy", "dir.npy", "dir.npy: not a regular file (a directory)")]:
        rc, out, err = run("explain", "--dtype", "float32", "--a", str(tmp_path / a), "--b", str(tmp_path / b), timeout=60)
        assert (rc, out) == (2, "") and len(err.strip().splitlines()) == 1 and needle in err, (a, b, err)


@pytest.mark.parametrize("flag,needle", [("--orders", "--orders takes --case ID or --m M --k K --n N"),
                                          ("--try-fixes", "--try-fixes takes --case ID or --m M --k K --n N")])
def test_files_with_orders_or_fixes_are_refused_before_measuring(tmp_path, monkeypatch, flag, needle):
    def measured(*args, **kwargs):
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(explain_run, "measure_operands", measured)
    np.save(tmp_path / "a.npy", np.ones((4, 4), dtype=np.float32))
    rc, out, err = _main("explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "a.npy"), "--dtype", "float32", flag)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize("make", [lambda: torch.ones(4, 4, requires_grad=True), lambda: torch.nn.Parameter(torch.ones(4, 4))])
def test_tensors_that_require_grad_are_measured_by_value(tmp_path, make):
    torch.save(make(), tmp_path / "a.pt")
    torch.save(make(), tmp_path / "b.pt")
    rc, out, err = _main("explain", "--a", str(tmp_path / "a.pt"), "--b", str(tmp_path / "b.pt"), "--dtype", "float32", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["error_u"] == 0 and r["verdict"]["kind"] == "bit-identical"  # ones @ ones: 4.0 everywhere, exactly


def test_a_product_larger_than_memory_is_refused_before_drawing():
    from matmul_drift.measure import memory

    have = memory.available("cpu")[0]
    if have is None:
        pytest.skip("no MemAvailable in /proc/meminfo")
    n = 1 << 20
    while memory.bytes_needed(n, n, n, "float32", "cpu")[0] < 4 * have:  # this machine's memory, not a constant
        n *= 2
    t0 = time.monotonic()
    rc, out, err = run("explain", "--m", str(n), "--k", str(n), "--n", str(n), "--dtype", "float32")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"m={n} k={n} n={n} in float32, needs about" in err and "MemAvailable" in err
    assert time.monotonic() - t0 < 30  # refused up front: drawing 4x this machine's memory would not end


def test_input_files_larger_than_memory_are_refused_before_reading(tmp_path):
    """A .npy whose values would need 4x this machine's memory (a sparse file: its header is
    real, its body holes) is mapped, not read, so the memory check comes first."""
    from matmul_drift.measure import memory

    have = memory.available("cpu")[0]
    if have is None:
        pytest.skip("no MemAvailable in /proc/meminfo")
    k = 1024
    m = max(1, 4 * have // (4 * k))  # float32: A alone is 4x the memory available
    a = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=np.float32, shape=(m, k))  # holes: no disk
    del a
    np.save(tmp_path / "b.npy", np.ones((k, 2), dtype=np.float32))
    t0 = time.monotonic()
    rc, out, err = run("explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--dtype", "float32",
                       timeout=120)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"m={m} k={k} n=2 in float32, needs about" in err and "MemAvailable" in err
    assert time.monotonic() - t0 < 60  # refused up front: reading the file would take most of that


def test_a_view_kept_as_stored_is_weighed_with_the_storage_it_spans(tmp_path, monkeypatch):
    """A .pt view keeps its storage offset and strides (--layout as-stored), so its copy spans
    offset + (M-1)·stride_0 + ... elements of the new dtype, not M·K: the last row of a 2^22 x 4
    float32 W saved alone (torch.save writes W's whole storage) needs 2^24 float64 elements,
    128 MiB, for one row of 4. The memory check once weighed the 1x4 shape alone."""
    from matmul_drift.measure import memory

    w = torch.ones(1 << 22, 4)
    torch.save(w[-1:], tmp_path / "a.pt")  # offset 2^24 - 4: the whole storage travels with it
    torch.save(torch.ones(4, 2), tmp_path / "b.pt")
    span = (1 << 24) * 8  # bytes of the float64 copy, offset included
    base = memory.bytes_needed(1, 4, 2, "float64", "cpu")[0]
    monkeypatch.setattr(memory, "available", lambda device: (base + span // 2, None))
    args = ["explain", "--a", str(tmp_path / "a.pt"), "--b", str(tmp_path / "b.pt"), "--dtype", "float64"]
    rc, out, err = _main(*args)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "MemAvailable" in err, err
    rc, out, err = _main(*args, "--layout", "contiguous")  # a copy of its 4 values: nothing more to weigh
    assert rc == 0 and "1×4 @ 4×2" in out, err
    monkeypatch.setattr(memory, "available", lambda device: (base + 2 * span, None))
    rc, out, err = _main(*args, "--json")
    assert rc == 0, err
    assert json.loads(out)["layout"]["a"] == {"shape": [1, 4], "strides": [4, 1], "offset": (1 << 24) - 4, "order": "C"}


def test_no_host_memory_check_starts_where_memavailable_reads_too_little(capsys, monkeypatch):
    from matmul_drift.cli import main as cli
    from matmul_drift.measure import memory

    monkeypatch.setattr(memory, "available", lambda device: (1 << 20, None))  # 1 MiB, as a VM that grows
    small = ["explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32"]
    assert cli.main(small) == 2
    err = capsys.readouterr().err
    assert "more than the 0.0 GiB of memory available (MemAvailable); --no-host-memory-check" in err
    assert cli.main([*small, "--no-host-memory-check"]) == 0
    assert "2×64 @ 64×8" in capsys.readouterr().out  # measured and reported


def _fail_with(exc_factory):
    def measure(*args, **kwargs):
        exc_factory()
    return measure


@pytest.mark.parametrize("allocate", [
    lambda: np.empty(1 << 50, dtype=np.uint8),  # 1 PiB: more than any address space, whatever the overcommit
    lambda: torch.empty(1 << 50, dtype=torch.uint8),  # torch's CPU allocator raises RuntimeError
])
def test_running_out_of_memory_part_way_is_one_line_exit_1(capsys, monkeypatch, allocate):
    from matmul_drift.cli import main as cli

    monkeypatch.setattr(explain_run, "measure", _fail_with(allocate))
    assert cli.main(["explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.err.startswith("matmul-drift: error: out of memory: ")


def test_other_runtime_errors_are_not_called_out_of_memory(monkeypatch):
    from matmul_drift.cli import main as cli

    def broken():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(explain_run, "measure", _fail_with(broken))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        cli.main(["explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_a_usage_error():
    rc, out, err = run("explain", "--case", "square", "--dtype", "float16", "--device", "cuda")
    assert rc == 2 and "no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def _row(**kw):
    return {"max_ulp": 0, "max_u": 0.0, "frac_differ": 0.0, "max_abs": 0.0, "ulp_at_max": None,
            "sign_changes": 0, "nonfinite_differ": 0, "beyond_bound": 0, "max_u_entries": 1, **kw}


def test_verdicts_from_hand_built_reports():
    base = {
        "dtype": "float16", "gamma_k_u": 100.0, "error_u": 1.0, "run_to_run": {"repeat": 3, **_row()},
        "error_entries": {"entries": 10, "of": 10, "zero_misses": 0, "subnormal": 0, "beyond_bound": 0},
        "nonfinite": {"a": 0, "b": 0, "product": 0, "reference": 0, "overflow": 0, "spurious": 0, "mismatch": 0},
        "kernels": {"full": ["k1"], "slice_n": ["k2"], "slice_m": []},
        "slices": {"n": [{"n": 5, **_row()}], "m": []},
    }
    assert explain.verdict(base)["kind"] == "bit-identical"
    drift = json.loads(json.dumps(base))
    drift["slices"]["n"][0].update(max_ulp=900, max_u=1.02, max_abs=0.5, ulp_at_max=0.5, frac_differ=0.1, sign_changes=2)
    v = explain.verdict(drift)
    assert v["kind"] == "rounding" and "k2" in v["text"]
    # max_u and the share of entries lead; one ulp count, with the sign changes called out
    assert v["text"].startswith("rounding-level drift: slice_n n=5 moves 10% of entries by up to 1.02 u")
    assert v["text"].count("ulp") == 1 and "900 ulp" in v["text"] and "2 entries change sign" in v["text"]
    bad = json.loads(json.dumps(base))
    bad["error_u"] = 101.0
    bad["error_entries"]["beyond_bound"] = 1
    assert explain.verdict(bad)["kind"] == "defect"
    assert explain.verdict(bad)["text"].startswith("DEFECT: 1 entry has an error beyond the γ_K bound 100 u")
    # Below the normal range the allowance adds (K+1)·η: a drift past 2·γ_K there is no defect,
    # and the verdict must not claim it within 2·γ_K alone.
    tiny = json.loads(json.dumps(drift))
    tiny["slices"]["n"][0].update(max_u=250.0)
    v = explain.verdict(tiny)
    assert v["kind"] == "rounding" and "by up to 250 u" in v["text"]
    assert "within the bound 2·γ_K = 200 u plus twice (K+1)·η, the absolute rounding below float16's normal range" in v["text"]
    assert "200 u plus" not in explain.verdict(drift)["text"]
    far = json.loads(json.dumps(drift))
    far["slices"]["n"][0].update(beyond_bound=3, max_u=250.0)
    assert explain.verdict(far)["kind"] == "defect"
    zero = json.loads(json.dumps(base))
    zero["error_entries"]["zero_misses"] = 1
    assert explain.verdict(zero) == {"kind": "defect", "text": "DEFECT: 1 output is non-zero where every product term is zero"}
    nan_in = json.loads(json.dumps(base))
    nan_in["nonfinite"].update(a=1, product=3, reference=3)
    nan_in["slices"]["n"][0].update(frac_differ=0.1, nonfinite_differ=1)
    v = explain.verdict(nan_in)
    assert v["kind"] == "non-finite inputs"
    assert v["text"].startswith("non-finite inputs: A has 1 NaN or inf entry, B 0; 3 outputs are NaN or inf in the exact")
    over = json.loads(json.dumps(base))
    over["nonfinite"].update(product=2, overflow=2)
    over["error_u"] = None
    v = explain.verdict(over)
    assert v["kind"] == "overflow" and v["text"].startswith("overflow: 2 outputs are inf because the exact value is beyond "
                                                            "float16's largest finite value 65504")
    over["nonfinite"].update(overflow=1, spurious=1)
    assert "1 output is inf because" in explain.verdict(over)["text"]
    assert "; 1 output is NaN or inf although the exact value is finite" in explain.verdict(over)["text"]
    # a real defect among the finite entries still wins over non-finite ones
    nan_in["error_entries"]["beyond_bound"] = 1
    assert explain.verdict(nan_in)["kind"] == "defect"


def _slice_report(per_call: list[str], drifts: dict) -> dict:
    """A hand-built report of n = 1 and 8 on full's route X or on Y: ``drifts`` maps n to its max_ulp."""
    r = {
        "dtype": "float16", "gamma_k_u": 100.0, "error_u": 1.0, "run_to_run": {"repeat": 3, **_row()},
        "error_entries": {"entries": 10, "of": 10, "zero_misses": 0, "subnormal": 0, "beyond_bound": 0},
        "nonfinite": {"a": 0, "b": 0, "product": 0, "reference": 0, "overflow": 0, "spurious": 0, "mismatch": 0},
        "kernels": {"full": ["aten::mm", "X"], "slice_n": ["aten::mm", "Y", "X"], "slice_n per call": per_call,
                    "slice_m": []},
        "slices": {"n": [{"n": n, "form": "as-is", **_row()} for n in (1, 8)], "m": []},
    }
    for row in r["slices"]["n"]:
        if drifts.get(row["n"]):
            row.update(max_ulp=drifts[row["n"]], max_u=0.5 * drifts[row["n"]], max_abs=0.5, ulp_at_max=0.5, frac_differ=0.1)
    return r


def test_the_verdict_names_the_kernels_of_the_slice_that_drifts():
    # n = 1 ran Y, n = 8 full's X: the merged slice_n list holds Y whichever slice drifts
    per_call = ["n=1: aten::mm; Y", "n=8: aten::mm; X"]
    v = explain.verdict(_slice_report(per_call, {8: 3}))
    assert "slice_n n=8 moves" in v["text"] and "the same kernels ran" in v["text"] and "Y" not in v["text"], v
    v = explain.verdict(_slice_report(per_call, {1: 3}))
    assert "slice_n n=1 moves" in v["text"] and "a different kernel ran (Y)" in v["text"], v
    v = explain.verdict(_slice_report(per_call, {1: 1, 8: 3}))  # the worst slice's kernels, not the first's
    assert "slice_n n=8 moves" in v["text"] and "the same kernels ran" in v["text"], v
    # two forms of one n (the seed's 1-D A and A.unsqueeze(0)): the label names the form
    r = _slice_report(["n=8 as-is: aten::mm; X", "n=8 2d: aten::mm; Y"], {})
    r["slices"]["n"] = [{"n": 8, "form": form, **_row(max_ulp=ulp, max_u=ulp / 2, frac_differ=0.1 * ulp)}
                        for form, ulp in (("as-is", 0), ("2d", 2))]
    assert "a different kernel ran (Y)" in explain.verdict(r)["text"]
    r["slices"]["n"][0].update(max_ulp=4, max_u=2.0, frac_differ=0.5)  # now the 1-D form drifts most
    assert "the same kernels ran" in explain.verdict(r)["text"]


def test_the_verdict_says_which_form_of_a_1d_a_drifts():
    # s @ v[:, :8] bit-identical, s.unsqueeze(0) @ v[:, :8] not: the user's own 1-D product does not drift
    r = _slice_report(["n=8 as-is: aten::mm; X", "n=8 2d: aten::mm; Y"], {})
    r["slices"]["n"] = [{"n": 8, "form": form, **_row(max_ulp=ulp, max_u=ulp / 2, frac_differ=0.1 * ulp)}
                        for form, ulp in (("as-is", 0), ("2d", 2))]
    assert explain.verdict(r)["text"].startswith("rounding-level drift: slice_n n=8 (A 2-D) moves 20% of entries")
    r["slices"]["n"][0].update(max_ulp=4, max_u=2.0, frac_differ=0.5)
    assert explain.verdict(r)["text"].startswith("rounding-level drift: slice_n n=8 moves 50% of entries")
    r["slices"]["n"][1].update(beyond_bound=1, max_u=900.0)
    assert explain.verdict(r)["text"].startswith("DEFECT: slice_n n=8 (A 2-D) moves 1 entry further than")


def test_a_slice_that_ran_fewer_kernels_is_not_called_another_order():
    # cuBLAS split-K: the full product runs a GEMM and a reduction, the slice the GEMM alone
    gemm, reduce = "nvjet_tst_64x8_64x16_1x4_h_bz_splitK_TNT", "splitKreduce_kernel<__half, __half, __half, __half>"
    r = _slice_report([], {8: 1})
    r["kernels"] = {"full": ["aten::mm", gemm, reduce], "slice_n": ["aten::mm", gemm], "slice_m": []}
    text = explain.verdict(r)["text"]
    assert f"a different set of kernels ran ({reduce} did not run)" in text and "another order" not in text, text
    r["kernels"]["slice_n"] = ["aten::mm", reduce, gemm]
    assert "a different kernel ran (another order of the same kernels)" in explain.verdict(r)["text"]
    # a kernel the full product launched twice: the merged list holds every name once, so the
    # slices that all ran the full product's list are no "other order"
    r["kernels"] = {"full": ["aten::mm", gemm, gemm], "slice_n": ["aten::mm", gemm], "slice_m": []}
    assert "the same kernels ran" in explain.verdict(r)["text"]


def test_the_report_lists_each_slices_kernels_where_they_differ(monkeypatch, tmp_path):
    from matmul_drift.core.cases import Case, Shape
    from matmul_drift.measure import kernels, measure

    # hand-built routes (which kernel this CPU picks is not the point): n = 1 on Y, the rest on full's F
    routes = {16: "F", 1: "Y", 2: "F", 8: "F"}
    monkeypatch.setattr(kernels, "traced", lambda call, device: (y := call(), ["aten::mm", routes[y.shape[-1]]]))
    m = measure.measure(Case("routes", "mm", Shape(4, 8, 16), Shape(4, 8, 16), slice_n=(1, 2, 8)), "float32", "cpu",
                        timing=False)
    r = json.loads(json.dumps(explain.report(m), allow_nan=False))
    assert r["kernels"]["slice_n per call"] == ["n=1: aten::mm; Y", "n=2: aten::mm; F", "n=8: aten::mm; F"]
    assert list(r["kernels"]) == ["full", "slice_n", "slice_n per call", "slice_m"]
    for row in r["slices"]["n"]:  # hand-built drift: n = 2 alone (what this CPU's slices do is not the point)
        row.update(_row(**({"max_ulp": 2, "max_u": 1.0, "frac_differ": 0.25, "max_abs": 1.0, "ulp_at_max": 0.5}
                           if row["n"] == 2 else {})))
    r["verdict"] = explain.verdict(r)
    assert "slice_n n=2 moves" in r["verdict"]["text"] and "the same kernels ran" in r["verdict"]["text"]
    (tmp_path / "new.json").write_text(json.dumps(r))
    rc, text, err = _main("explain", "--render", str(tmp_path / "new.json"))
    assert (rc, err) == (0, "") and "slice_n per call  n=1: aten::mm; Y" in text, text
    del r["kernels"]["slice_n per call"]  # a report saved before the per-call lists
    (tmp_path / "old.json").write_text(json.dumps(r))
    rc, text, err = _main("explain", "--render", str(tmp_path / "old.json"))
    assert (rc, err) == (0, "") and "per call" not in text and r["verdict"]["text"] in text


def _mkl_route(a_path, b_path, contiguous: bool) -> str:
    """The SGEMM transposes MKL itself prints for a direct A @ B on the loaded files, in a
    fresh process (MKL_VERBOSE=1), parsed here rather than by the project's normaliser."""
    load = ("lambda p: torch.from_numpy(np.load(p)) if p.endswith('.npy') "
            "else torch.load(p, weights_only=True)")
    code = (f"import numpy as np, torch; load = {load}; a, b = load({str(a_path)!r}), load({str(b_path)!r}); "
            + ("a, b = a.contiguous(), b.contiguous(); " if contiguous else "") + "a @ b")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MKL_VERBOSE": "1"})
    calls = re.findall(r"MKL_VERBOSE SGEMM\(([NT]),([NT]),", p.stdout)
    assert len(calls) == 1, p.stdout + p.stderr
    return "SGEMM({},{})".format(*calls[0])


@pytest.mark.parametrize("layout", ["as-stored", "contiguous"])
def test_files_keep_their_layout_and_route(tmp_path, layout):
    g = np.random.default_rng(7)
    np.save(tmp_path / "a.npy", np.asfortranarray(g.random((48, 96), dtype=np.float32)))  # a transposed view
    base = torch.from_numpy(g.random((40, 96), dtype=np.float32))
    torch.save(base.t(), tmp_path / "b.pt")  # a .pt holding a transposed view: strides (1, 96)
    rc, out, err = run("explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.pt"), "--dtype", "float32",
                       "--slice-m", "5", "--layout", layout, "--json")
    assert rc == 0, err
    r = json.loads(out)
    want = _mkl_route(tmp_path / "a.npy", tmp_path / "b.pt", contiguous=layout == "contiguous")
    assert [k for k in r["kernels"]["full"] if "SGEMM" in k][0].startswith(f"MKL {want}")
    if layout == "as-stored":
        assert want == "SGEMM(T,T)"  # column-major A and B: MKL transposes both
        assert r["layout"]["a"] == {"shape": [48, 96], "strides": [1, 48], "offset": 0, "order": "F"}
        assert r["layout"]["b"]["strides"] == [1, 96]
    else:
        assert want == "SGEMM(N,N)" and r["layout"]["a"]["order"] == r["layout"]["b"]["order"] == "C"


def test_run_durations_round_before_splitting_minutes():
    from matmul_drift.cli import run as cli_run

    assert [cli_run._minutes(s) for s in (179.6, 59.4, 0.2, 3601)] == ["3m 00s", "0m 59s", "0m 00s", "60m 01s"]


@pytest.mark.parametrize("spelling", ["1e1000000", "1e999999", "0e99999", "1e15", "1" + "0" * 20])
def test_catalog_ids_too_large_for_any_id_are_refused_at_once(tmp_path, spelling):
    t0 = time.monotonic()
    rc, out, err = _main("catalog", "--root", str(tmp_path), "--", spelling)
    assert time.monotonic() - t0 < 5  # int(Decimal('1e999999')) took 48 s of CPU
    assert (rc, out) == (2, "") and err == f"matmul-drift: error: {spelling!r} is not an id: ids are below 2**48 = 281474976710656\n"


def test_catalog_spellings_of_real_ids_still_find_them(tmp_path):
    from matmul_drift.store import catalog

    ident = catalog.store(tmp_path, "env", {"torch": "2.13.0"})
    for spelling in (f"{ident:012x}", f"{ident}.0", f"{ident:.3g}"):
        assert any(lo <= ident <= hi for lo, hi in catalog.parse_spelling(spelling)), spelling
    assert catalog.parse_spelling("281474976710655") == [(2**48 - 1, 2**48 - 1)]  # the largest id
    assert catalog.parse_spelling("3e+14") == [(2.5e14, 3.5e14)]  # rounded, reaching below 2**48
    rc, out, err = _main("catalog", "--root", str(tmp_path), f"{ident}.0")
    assert rc == 0 and out.startswith(f"env {ident:012x}"), err


def test_a_catalog_entry_nested_too_deeply_is_unreadable_not_a_traceback(tmp_path):
    import asv_fixtures as F

    tree = F.write_tree(tmp_path / "results", n_commits=2)
    entry = sorted((tree.catalog_dir / "env").glob("*.json"))[0]  # every summary reads these
    entry.write_text("[" * 100000)
    rc, out, err = _main("catalog", "--root", str(tree.catalog_dir), entry.stem)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"catalog entry env/{entry.stem} is unreadable: maximum recursion depth exceeded" in err
    rc, out, err = _main("summary", str(tree.root))
    assert rc in (0, 1) and "Traceback" not in err
    assert [ln for ln in err.splitlines() if "warning" in ln and f"env/{entry.stem} is unreadable" in ln], err


def test_ctrl_c_while_the_parser_is_built_is_one_line_exit_130(monkeypatch):
    from matmul_drift.cli import main as cli

    def interrupted():  # Ctrl-C while build_parser imports the subcommands' modules (~0.3 s)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    try:
        result = _main("catalog", "0")
    except KeyboardInterrupt:  # escaping, it would stop pytest itself rather than fail this test
        pytest.fail("KeyboardInterrupt escaped main: a traceback")
    assert result == (130, "", "matmul-drift: interrupted\n")


def test_importing_the_cli_imports_nothing_of_the_project_before_main():
    code = "import sys, matmul_drift.cli.main; print(sorted(m for m in sys.modules if m.startswith('matmul_drift')))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "['matmul_drift', 'matmul_drift.cli', 'matmul_drift.cli.main']", p.stdout + p.stderr  # Ctrl-C there: a traceback


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("buffered", [True, False])
def test_a_stdout_that_fails_is_one_line_and_a_reader_that_left_is_silent(tmp_path, buffered):
    from matmul_drift.store import catalog

    ident = catalog.store(tmp_path, "env", {"torch": "2.13.0"})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered: it fails at the last flush
    env.update({} if buffered else {"PYTHONUNBUFFERED": "1"})  # unbuffered: it fails in print
    for args in (["--help"], ["catalog", "--root", str(tmp_path), f"{ident:012x}"],
                 ["explain", "--m", "2", "--k", "8", "--n", "4", "--dtype", "float32", "--json"]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", *args], stdout=full, stderr=subprocess.PIPE,
                               text=True, env=env, timeout=120)
        assert (p.returncode, p.stderr) == (1, "matmul-drift: error: cannot write to stdout: No space left on device\n"), args
        read, write = os.pipe()
        os.close(read)  # `| head` gone before anything is written
        try:
            p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", *args], stdout=write, stderr=subprocess.PIPE,
                               text=True, env=env, timeout=120)
        finally:
            os.close(write)
        assert (p.returncode, p.stderr) == (141, ""), args


def test_a_stdout_that_cannot_encode_a_character_prints_it_escaped(tmp_path):
    # PYTHONIOENCODING=ascii (a log collector's pipe, an old terminal): the text report's 'γ_K'
    # and '×' were a UnicodeEncodeError traceback, exit 1
    rc, out, _ = _main("explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32", "--json")
    (tmp_path / "r.json").write_text(out)
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "explain", "--render", str(tmp_path / "r.json")],
                       capture_output=True, env={**os.environ, "PYTHONIOENCODING": "ascii"}, timeout=120)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr[-300:]
    assert b"2\\xd764 @ 64\\xd78" in p.stdout and b"\\u03b3_K bound (u)" in p.stdout, p.stdout[:300]


def test_escape_sequences_in_a_saved_report_or_a_catalog_entry_never_reach_the_terminal(tmp_path):
    # were printed raw: a hostile file could recolour, retitle or rewrite what the terminal shows
    from matmul_drift.store import catalog

    evil = "evil\x1b]0;pwned\x07\x1b[31mRED\u202e"
    rc, out, _ = _main("explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32", "--json")
    r = json.loads(out)
    r["kernels"]["full"] = [evil]
    (tmp_path / "r.json").write_text(json.dumps(r))
    rc, rendered, err = _main("explain", "--render", str(tmp_path / "r.json"))
    assert rc == 0 and "evil\\u001b]0;pwned\\u0007\\u001b[31mRED\\u202e" in rendered, rendered
    ident = catalog.store(tmp_path / "cat", "kernels", {"device": "cpu\x1b[2J", "full\x1b[1A": [evil]})
    rc, shown, err = _main("catalog", "--root", str(tmp_path / "cat"), ids.hex_id(ident))
    assert rc == 0 and "full\\u001b[1A (cpu\\u001b[2J):" in shown and "evil\\u001b]0;pwned" in shown, shown
    assert not any(c in rendered + shown for c in "\x1b\x07\u202e")


def test_a_file_name_that_is_not_utf8_is_reported_as_text_json_readers_take(tmp_path):
    # was a lone surrogate ("\\udcff") in --json's "case": strict JSON readers refuse it
    a = tmp_path / os.fsdecode(b"a\xff.npy")
    np.save(a, np.ones((2, 8), np.float32))
    np.save(tmp_path / "b.npy", np.ones((8, 3), np.float32))
    rc, out, err = _main("explain", "--a", str(a), "--b", str(tmp_path / "b.npy"), "--dtype", "float32", "--json")
    assert rc == 0, err
    case = json.loads(out)["case"]
    assert case == "files:a\\xff.npy@b.npy" and case.encode("utf-8"), case


def test_a_catalog_root_that_is_no_folder_is_named_as_such(tmp_path):
    # was "no catalog entry under it has the id", as if the folder were there and lacked it
    rc, out, err = _main("catalog", "--root", str(tmp_path / "nope"), "1")
    assert (rc, out, err) == (2, "", f"matmul-drift: error: --root {tmp_path / 'nope'}: no such folder\n")


def test_render_prints_a_saved_report_and_takes_no_other_option(tmp_path):
    rc, out, _ = _main("explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32", "--json")
    assert rc == 0
    (tmp_path / "r.json").write_text(out)
    rc, text, err = _main("explain", "--render", str(tmp_path / "r.json"))
    assert rc == 0 and err == "" and "2×64 @ 64×8" in text and "γ_K bound (u)" in text
    for extra, name in ((["--dtype", "float64"], "--dtype"), (["--json"], "--json"), (["--slice-n", "3"], "--slice-n"),
                        (["--device", "cuda"], "--device")):
        rc, out, err = _main("explain", "--render", str(tmp_path / "r.json"), *extra)
        assert (rc, out) == (2, "") and err.strip().splitlines() == [
            f"matmul-drift: error: --render prints a saved report as text and measures nothing; it takes no {name}"], err
    (tmp_path / "bad.json").write_text("{")
    good = json.loads((tmp_path / "r.json").read_text())
    damaged = [json.dumps({**good, "verdict": {"text": "hello"}}),  # no kind: once a KeyError past the checks
               json.dumps({**good, "reference": {**good["reference"], "error_bound_u": 10**400}}),  # once an OverflowError
               json.dumps({**good, "error_u": math.nan})]  # NaN: no JSON number
    for i, text in enumerate(damaged):
        (tmp_path / f"bad{i}.json").write_text(text)
    for name in ["bad.json"] + [f"bad{i}.json" for i in range(len(damaged))]:
        rc, out, err = _main("explain", "--render", str(tmp_path / name))
        assert (rc, out) == (2, "") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (name, err)


def test_a_saved_fixes_report_whose_cheapest_names_no_candidate_is_one_line(tmp_path):
    rc, out, _ = _main("explain", "--m", "2", "--k", "64", "--n", "8", "--dtype", "float32", "--json")
    assert rc == 0
    drift = {"slice_n": {"max_ulp": 1, "frac_differ": 0.25}}
    row = {"name": "one thread", "code_change": None, "verdict": "removes", "drift": {"slice_n": {"max_ulp": 0, "frac_differ": 0.0}},
           "error_u": 0.5, "time_ratio": 1.0, "spread": 0.1}
    fixes = {"baseline": {"drift": drift}, "drifts": ["slice_n"], "candidates": [row], "cheapest": "one thread"}
    for cheapest, want in (("one thread", 0), ("x", 2)):
        (tmp_path / "r.json").write_text(json.dumps({**json.loads(out), "fixes": {**fixes, "cheapest": cheapest}}))
        rc, text, err = _main("explain", "--render", str(tmp_path / "r.json"))
        assert rc == want, err
    assert text == "" and err.count("\n") == 1 and "not an explain report saved with --json (KeyError: 'x')" in err, err


@pytest.mark.parametrize("seconds", ["1000001", "2200000", "10000000000"])
def test_a_fix_timeout_beyond_subprocess_s_range_is_refused_before_measuring(monkeypatch, seconds):
    """subprocess waits in C-int milliseconds: 2200000 s was an OverflowError after the measurement."""

    monkeypatch.setattr(explain_run, "measure", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
    rc, out, err = _main("explain", "--m", "4", "--k", "16", "--n", "9", "--dtype", "float32", "--try-fixes",
                         "--fix-timeout", seconds)
    assert (rc, out) == (2, "") and err == f"matmul-drift: error: --fix-timeout {seconds} is beyond 1000000 s (about 11.6 days)\n"


@pytest.mark.parametrize("shape,needle", [(("--m", "4", "--k", "1", "--n", "4"), "--orders: K = 1: a sum of one product"),
                                          (("--m", "1", "--k", "2", "--n", "2"), None)])
def test_orders_that_cannot_be_probed_are_refused_before_measuring(monkeypatch, shape, needle):
    """K = 1 has no order: one line, exit 2, before a measurement the probe would then lose."""

    if needle:
        monkeypatch.setattr(explain_run, "measure", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
    rc, out, err = _main("explain", *shape, "--dtype", "float32", "--orders", "--json")
    if needle:
        assert (rc, out) == (2, "") and err.count("\n") == 1 and needle in err, err
    else:
        assert rc == 0 and json.loads(out)["orders"]["full"]["order_id"], err


@pytest.mark.parametrize("args", [
    ("explain", "--m", "9223372036854775807", "--k", "4", "--n", "4", "--dtype", "float32"),
    ("explain", "--m", "99999999999999999999", "--k", "4", "--n", "4", "--dtype", "float32"),
    ("order", "--m", "9223372036854775807", "--k", "4", "--n", "4", "--dtype", "float32"),
    ("scan", "--vary", "n", "--range", "1:99999999999999999999", "--m", "2", "--k", "4", "--dtype", "float32"),
])
def test_sizes_beyond_any_machine_are_one_line_even_without_the_host_memory_check(args):
    """--no-host-memory-check skips MemAvailable, not sense: sizes past int64 were tracebacks."""
    rc, out, err = _main(*args, "--no-host-memory-check")
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "beyond any machine's memory (1 EiB)" in err, err


def test_an_unreadable_candidate_of_a_rounded_id_does_not_hide_the_others(tmp_path):
    """`catalog 1.43e+14` where two entries round to it and one is broken: the other was never
    shown (the listing stopped at the broken one with its error)."""
    import itertools

    from matmul_drift.store import catalog

    seen = {}
    for i in itertools.count():  # two objects whose ids asv's graphs show alike
        rounded = f"{float(ids.object_id({'x': i})):.3g}"
        if rounded in seen:
            break
        seen[rounded] = i
    good, bad = (catalog.store(tmp_path, kind, {"x": x}) for kind, x in (("env", seen[rounded]), ("kernels", i)))
    catalog.entry_path(tmp_path, "kernels", bad).write_text("")
    rc, out, err = _main("catalog", "--root", str(tmp_path), rounded)
    assert rc == 2 and f"env {good:012x}" in out and f'"x": {seen[rounded]}' in out, (out, err)
    assert err == f"matmul-drift: error: catalog entry kernels/{bad:012x} is unreadable: Expecting value: line 1 column 1 (char 0)\n"


@pytest.mark.parametrize("args,option", [(("run", "--repo", ""), "--repo"), (("catalog", "1", "--root", ""), "--root")])
def test_an_empty_folder_name_is_refused_not_read_as_the_current_folder(args, option, monkeypatch):
    # Path("") is ".": `run --repo "$CHECKOUT"` with the variable empty ran the main job on
    # whatever checkout it was started in (nightly's --merge/--tree/--repo: test_nightly)
    from matmul_drift.jobs import mainjob

    monkeypatch.setattr(mainjob, "run", lambda o: pytest.fail(f"the main job ran on {o.repo}"))
    assert _main(*args) == (2, "", f"matmul-drift: error: argument {option}: needs a folder, got an empty name\n")


@pytest.mark.parametrize("sub", ["run", "nightly"])
@pytest.mark.parametrize("regex,why", [("[", "not a regular expression: '[' (unterminated character set"),
                                       ("", "needs a regular expression, got an empty one")])
def test_a_bench_regex_asv_would_refuse_or_read_as_everything_stops_before_anything_runs(sub, regex, why, monkeypatch):
    # was passed to asv, which failed after building its environments ("["), or ran every benchmark ("")
    from matmul_drift.jobs import mainjob, nightly

    monkeypatch.setattr(mainjob, "run", lambda o: pytest.fail("the main job ran"))
    monkeypatch.setattr(nightly, "run_night", lambda *a: pytest.fail("the night ran"))
    extra = ["--python", sys.executable, "--machine", "x"] if sub == "nightly" else []
    rc, out, err = _main(sub, *extra, "--bench", regex)
    assert rc == 2 and out == "" and err.startswith(f"matmul-drift: error: argument --bench: {why}") and err.count("\n") == 1, err


def test_bench_memory_reads_each_childs_own_peak_not_its_own():
    # scripts/bench_memory.py read wait4's ru_maxrss, which Linux carries over from the process
    # that starts the child: with 512 MiB more held here, `matmul-drift --help` read this peak.
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_memory", Path(__file__).resolve().parents[1] / "scripts/bench_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    hog = np.ones(1 << 26)  # 512 MiB, every page touched
    mine = next(int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
    peak = bench.peak_bytes(["--help"])
    assert 0 < peak < mine - hog.nbytes // 2, (peak, mine)


def test_the_memory_check_of_try_fixes_counts_the_candidates_process_too(monkeypatch):
    """explain --try-fixes measures, then waits while a process of its own measures each
    candidate: 2x8x8 peaked at 305 MiB in explain and 303 MiB in its candidate's process, 608
    together, where the check counted one process (512 MiB). With that much less one byte
    available, explain alone starts and --try-fixes is refused."""
    from matmul_drift.measure import memory

    args = ("explain", "--m", "2", "--k", "8", "--n", "8", "--dtype", "float32")
    rc, peak, err = memory.peak_bytes([*args, "--try-fixes"])
    alone = memory.peak_bytes(list(args))[1]
    assert rc in (0, 1) and peak > 1.5 * alone, (peak, alone, err)  # the candidate's process counted (1: a defect)
    monkeypatch.setattr(memory, "available", lambda device: (peak - 1, None))
    assert _main(*args)[0] in (0, 1)
    rc, out, err = _main(*args, "--try-fixes")
    assert rc == 2 and "with --try-fixes, needs about" in err and out == "", err


HOLDER = """import os, subprocess, sys, time
mib = os.environ.pop("HOLD_MIB", None)  # in the measured process alone, not in its holder
if mib:
    h = subprocess.Popen([sys.executable, "-c", "import sys, numpy; x = numpy.ones(%d << 17); print(flush=True); sys.stdin.read()"
                          % int(mib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    h.stdout.readline()  # it holds them now, until this process ends
    time.sleep(0.5)
"""


def test_peak_bytes_counts_a_process_that_runs_beside_and_writes_no_peak(tmp_path):
    """explain --try-fixes holds three processes at once, and fixfind's default timer is
    killed at the end, so it never wrote its own peak: peak_bytes missed it (and so
    bench_memory's --try-fixes row). Here `matmul-drift --help` starts a process holding
    512 MiB (from a sitecustomize) that writes no peak either: before, the peak read ~100 MiB."""
    from matmul_drift.measure import memory

    (tmp_path / "sitecustomize.py").write_text(HOLDER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "HOLD_MIB": "512"}
    rc, peak, err = memory.peak_bytes(["--help"], env)
    assert rc == 0 and peak > 512 << 20, (peak / 2**20, err)


def test_try_fixes_on_cuda_gives_the_cached_gpu_memory_back_before_the_candidates(monkeypatch):
    """The measurement's tensors are gone by then, but torch's caching allocator keeps their
    blocks, which a candidate's process, measuring the same product, would find taken."""
    import torch

    from matmul_drift.probes import explain, explain_run, fixfind

    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(fixfind, "try_fixes_many", lambda *a, **kw: calls.append("try") or [{"candidates": []}])
    req = explain.Request(dtype="float16", device="cuda", case="seed")
    explain_run._try_fixes(req, cases.get("seed"), (45999,), None, None)
    assert calls == ["empty_cache", "try"]
    calls.clear()
    explain_run._try_fixes(explain.Request(dtype="float16", device="cpu", case="seed"), cases.get("seed"), (45999,), None, None)
    assert calls == ["try"]


def test_try_fixes_on_cuda_counts_the_contexts_and_flushes_of_its_other_processes(monkeypatch):
    """explain --try-fixes on CUDA runs explain, a candidate's process and the default's timer
    at once: two CUDA contexts beyond explain's own, and three 256 MiB L2 flushes. A GPU with
    1.5 GiB free holds one tiny measurement, not the three (the check counted neither flush nor
    context: under 1 MiB for 64x64x64 fp16)."""
    from matmul_drift.measure import memory

    monkeypatch.setattr(memory, "available", lambda device: (None, 1536 << 20))
    memory.check(memory.bytes_needed(64, 64, 64, "float16", "cuda"), "the product", "cuda")
    with pytest.raises(memory.TooLarge, match="GPU memory free"):
        memory.check(memory.bytes_needed(64, 64, 64, "float16", "cuda", fixes=True), "the product", "cuda")


@pytest.mark.parametrize("m, k, n, dtype", [(64, 1024, 8192, "float32"), (8192, 1024, 64, "float32"),
                                            (8192, 1024, 64, "float64"), (2, 8, 8, "float32")])
def test_memory_estimate_covers_operands_with_nan_and_inf(tmp_path, m, k, n, dtype):
    """memory.bytes_needed is what explain checks before it reads a file's values, so it must
    cover the peak whatever the values: one NaN in A and one -inf in B send the reference
    through its IEEE indicator products. Those once held a dozen float64 indicators of A and
    of B at once: peaks of 952, 982 and 1290 MiB here against estimates of 746, 746 and 1042.
    2×8×8 is torch alone: 794 MiB under 2.14.1+cu130 without a GPU, once estimated at 512."""
    from matmul_drift.measure import memory

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    a[1, 2], b[3, 4] = np.nan, -np.inf
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc, peak, err = memory.peak_bytes(["explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"),
                                       "--dtype", dtype])
    assert rc in (0, 1), err
    need = memory.bytes_needed(m, k, n, dtype, "cpu")[0]
    assert peak <= need, f"peak {peak / 2**20:.0f} MiB above the estimate {need / 2**20:.0f} MiB"


@pytest.mark.parametrize("args", [
    ["explain", "--a", "{x}", "--b", "{x}", "--dtype", "float32"],
    ["explain", "--render", "{x}"],
    ["catalog", "--root", "{x}", "123456789abc"],
    ["summary", "{x}"],
    ["run", "--repo", "{x}"],
    ["scan", "--vary", "n", "--range", "1:4", "--m", "2", "--k", "2", "--dtype", "float32", "--out", "{x}/f.json"],
])
def test_an_error_naming_a_file_whose_name_holds_a_newline_is_one_line(tmp_path, args):
    # `explain --a "$(printf 'x\ny.npy')"` printed its error on two lines, the second a bare 'y.npy'
    x = str(tmp_path / "x\ny\u202e.npy")  # a newline and a bidi override, each shown as \uXXXX
    rc, out, err = _main(*(a.replace("{x}", x) for a in args))
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.endswith("\n"), err
    assert ": error: " in err and "x\\u000ay\\u202e.npy" in err, err


def test_the_worst_slice_n_names_the_form_of_a_1d_a_it_was_measured_with():
    # slice_n of `explain --json` had no form: where the 1-D A's 2-D form drifted most, the verdict
    # said "n=8 (A 2-D)" while slice_n could not say which product its numbers were of
    import dataclasses

    from matmul_drift.core import cases
    from matmul_drift.measure import measure

    m = measure.measure(cases.adhoc(1, 8, 9), "float32", "cpu", slice_n=(8,), slice_m=(), repeat=1, timing=False)
    rows = [{"n": 8, "form": form, "cols": 8, **_row(max_ulp=ulp, max_u=ulp / 2, frac_differ=0.1 * ulp)}
            for form, ulp in (("as-is", 1), ("2d", 3))]
    r = explain.report(dataclasses.replace(m, slice_n=rows), 8)
    assert r["slice_n"]["form"] == "2d" and r["slice_n"]["max_ulp"] == 3
    assert "slice_n n=8 (A 2-D) moves 30% of entries" in r["verdict"]["text"]
    rows[0].update(max_ulp=5, max_u=2.5, frac_differ=0.5)
    r = explain.report(dataclasses.replace(m, slice_n=rows))
    assert r["slice_n"]["form"] == "as-is" and "slice_n n=8 moves 50% of entries" in r["verdict"]["text"]
    assert "form" not in (explain.report(dataclasses.replace(m, slice_n=[], slice_m=[{"m": 1, **_row()}]))["slice_m"])


def test_the_catalog_is_found_in_the_checkout_where_the_command_runs_not_beside_the_package(tmp_path):
    """A plain `pip install .` puts the package in site-packages: its catalog is the checkout's
    where the command runs (results/catalog), and a command elsewhere says where it looked. The
    checkout is one made here with a catalog of one known entry: the project's own catalog grows
    with every main job run in it, and 1.71e+14 may then name more than one entry."""
    site = tmp_path / "site-packages"
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "src" / "matmul_drift", site / "matmul_drift",
                    ignore=shutil.ignore_patterns("__pycache__"))
    checkout = tmp_path / "checkout"
    kernels = Path("results", "catalog", "kernels")
    (checkout / kernels).mkdir(parents=True)
    (checkout / "docs").mkdir()
    shutil.copy(repo / "asv.conf.json", checkout)
    shutil.copy(repo / kernels / "9b9327e25992.json", checkout / kernels)
    env = {k: v for k, v in os.environ.items() if k != "MATMUL_DRIFT_CATALOG"}
    env["PYTHONPATH"] = str(site)
    run = lambda cwd: subprocess.run([sys.executable, "-m", "matmul_drift.cli", "catalog", "1.71e+14"],  # noqa: E731
                                     cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    p = run(checkout / "docs")  # in the checkout, below its root
    assert p.returncode == 0 and p.stdout.startswith("kernels 9b9327e25992"), p.stdout + p.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = run(elsewhere)
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"matmul-drift: error: no catalog entry under {elsewhere}/results/catalog has the id 1.71e+14\n"
