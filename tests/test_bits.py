"""The output digest (bits_id): the sha256 of each output's raw bits, the full product's and
each slice's, checked against digests computed apart, across runs, bit flips and routes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from matmul_drift.core import cases, ids
from matmul_drift.core.cases import Case, Shape
from matmul_drift.jobs import selection, suite
from matmul_drift.jobs.selection import Cell
from matmul_drift.measure import measure
from matmul_drift.store import catalog

CPU_DTYPES = ("float64", "float32", "float16", "bfloat16")


def _sha(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes, computed apart from measure's own code."""
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _measured(case: Case, dtype: str, a=None, b=None):
    """measure_operands on ``case``'s drawn operands, or on the tensors ``a`` and ``b`` (B as
    stored: W for linear), on the CPU; the Measurement and the Operands."""
    if a is None:
        a_bits, b_bits, _ = measure.operand_bits(case, dtype, "cpu", with_checksum=False)
    else:
        dt = getattr(torch, dtype)
        a_bits, b_bits = measure.tensor_bits(a.to(dt)), measure.tensor_bits(b.to(dt))
    ops = measure.make_operands(a_bits, b_bits, dtype, "cpu", case)
    shape = case.shape("cpu")
    if case.layout == "strided":  # B a view into a wider matrix, as the suite's slice-n-view is
        wide = torch.zeros(*ops.b.shape[:-1], shape.n + 3, dtype=ops.b.dtype)
        wide[..., 1:shape.n + 1] = ops.b
        ops.b = wide[..., 1:shape.n + 1]
        assert not ops.b.is_contiguous()
    m = measure.measure_operands(ops, case=case, precision=dtype, device="cpu", checksum="",
                                 slice_n=case.slice_n, slice_m=case.slice_m, repeat=2,
                                 with_kernels=False, timing=False)
    return m, ops


def _apart(case: Case, ops) -> dict:
    """Every output's digest, each product made again and hashed apart."""
    want = {"full": _sha(ops.product())}
    for form in case.forms:
        a = ops.a.unsqueeze(0) if form == "2d" else ops.a
        for n in case.slice_n:
            y = ops.product(a, ops.b[..., :n])
            part = f"slice_n={n}" + ("" if form == "as-is" else f" {form}")
            want[part] = _sha(y.squeeze(0) if form == "2d" else y)
    for m in case.slice_m:
        want[f"slice_m={m}"] = _sha(ops.product(ops.a[..., :m, :]))
    return want


SHAPES = [
    Case("mm", "mm", Shape(6, 40, 9), Shape(6, 40, 9), slice_n=(1, 4), slice_m=(1, 5)),
    Case("strided", "mm", Shape(5, 33, 10), Shape(5, 33, 10), layout="strided", slice_n=(3, 7)),
    Case("mv", "mv", Shape(1, 50, 12), Shape(1, 50, 12), layout="strided", slice_n=(5, 11),
         forms=("as-is", "2d")),
    Case("linear", "linear", Shape(4, 24, 8), Shape(4, 24, 8), slice_m=(2,)),
    Case("bmm", "bmm", Shape(3, 16, 5, batch=2), Shape(3, 16, 5, batch=2), slice_m=(1,)),
    Case("ones", "mm", Shape(1, 1, 1), Shape(1, 1, 1), slice_n=(1,), slice_m=(1,)),
    Case("empty-slices", "mm", Shape(4, 8, 6), Shape(4, 8, 6), slice_n=(0, 3), slice_m=(0,)),
    Case("m0", "mm", Shape(0, 8, 6), Shape(0, 8, 6), slice_n=(3,)),
    Case("n0", "mm", Shape(4, 8, 0), Shape(4, 8, 0), slice_m=(2,)),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: c.id)
def test_each_outputs_digest_is_the_sha256_of_its_bits_made_apart(case, dtype):
    m, ops = _measured(case, dtype)
    assert m.bits == _apart(case, ops)
    assert m.bits_id == ids.object_id(m.bits) and 0 < m.bits_id < 1 << 48
    assert float(m.bits_id) == m.bits_id  # a float64 (asv's) holds it


def test_an_empty_output_has_the_digest_of_no_bytes():
    m, _ = _measured(SHAPES[-3], "float32")
    empty = hashlib.sha256(b"").hexdigest()
    assert m.bits["slice_n=0"] == m.bits["slice_m=0"] == empty != m.bits["full"]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_nan_and_inf_outputs_are_hashed_bit_for_bit(dtype):
    case = Case("nonfinite", "mm", Shape(4, 6, 5), Shape(4, 6, 5), slice_n=(2,), slice_m=(3,))
    a = torch.ones(4, 6, dtype=torch.float64)
    b = torch.ones(6, 5, dtype=torch.float64)
    a[0, 0], a[1, 1], b[2, 3] = float("inf"), float("nan"), -float("inf")  # inf, NaN and inf - inf
    m, ops = _measured(case, dtype, a, b)
    y = ops.product().double()
    assert torch.isnan(y).any() and torch.isinf(y).any()
    assert m.nonfinite["product"] > 0 and m.bits == _apart(case, ops)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_one_flipped_bit_changes_the_digest(dtype):
    t = torch.linspace(-3, 3, 35, dtype=torch.float64).reshape(5, 7).to(getattr(torch, dtype))
    bits = measure.tensor_bits(t)
    assert measure.bits_digest(bits) == _sha(t)
    for i in (0, 17, bits.size - 1):
        flipped = bits.copy()
        flipped.flat[i] ^= 1  # the last bit of one element
        assert measure.bits_digest(flipped) != measure.bits_digest(bits)
    # C order, whatever its strides
    assert measure.bits_digest(bits.T) == measure.bits_digest(bits.T.copy())


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_minus_zero_and_nan_payloads_are_other_bits(dtype):
    dt = getattr(torch, dtype)
    plus, minus = torch.zeros(3, dtype=dt), torch.zeros(3, dtype=dt)
    minus[1] = -0.0
    assert torch.equal(plus, minus)  # equal as numbers
    digest = [measure.bits_digest(measure.tensor_bits(t)) for t in (plus, minus)]
    assert digest[0] != digest[1]
    nan = measure.tensor_bits(torch.full((2,), float("nan"), dtype=dt))
    other = nan.copy()
    other[0] ^= 1  # another NaN payload: still NaN
    assert measure.to_tensor(other, dtype, "cpu").isnan().all()
    assert measure.bits_digest(nan) != measure.bits_digest(other)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_on_cuda_the_digest_is_that_of_the_outputs_copied_to_the_host():
    case = SHAPES[0]
    a_bits, b_bits, _ = measure.operand_bits(case, "float32", "cuda", with_checksum=False)
    ops = measure.make_operands(a_bits, b_bits, "float32", "cuda", case)
    m = measure.measure_operands(ops, case=case, precision="float32", device="cuda", checksum="",
                                 slice_n=case.slice_n, slice_m=case.slice_m, with_kernels=False,
                                 timing=False)
    assert m.bits == _apart(case, ops)  # each product made on the GPU again, hashed on the host


def test_two_runs_of_a_cell_give_one_bits_id_and_its_catalog_entry_names_each_part(monkeypatch,
                                                                                    tmp_path):
    for var in (selection.ORDERS_VAR, selection.FIXES_VAR, selection.MAPS_VAR):
        monkeypatch.setenv(var, "0")
    k = Cell("skinny", "float32", "cpu")
    runs = [suite.measure_all(case_ids=("skinny",), precisions=("float32",), devices=("cpu",),
                              root=tmp_path / str(i))[k] for i in (0, 1)]
    assert runs[0]["bits_id"] == runs[1]["bits_id"] and runs[0]["bits_id"] > 0
    entry = catalog.load(tmp_path / "0", "bits", runs[0]["bits_id"])
    skinny = cases.get("skinny")
    assert sorted(entry) == sorted(["full", *(f"slice_m={m}" for m in skinny.slice_m)])
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in entry.values())
    found = catalog.find(tmp_path / "0", ids.hex_id(runs[0]["bits_id"]))
    assert found == [("bits", runs[0]["bits_id"])]


ROUTE = """
import json, sys
import numpy as np
from matmul_drift.core import cases
from matmul_drift.measure import measure
out = {}
for c, dtype in (("square", "float32"), ("square", "float64"), ("skinny", "float32")):
    case = cases.get(c)
    m = measure.measure(case, dtype, "cpu", with_kernels=False, timing=False, repeat=1)
    a, b, _ = measure.operand_bits(case, dtype, "cpu", with_checksum=False)
    ops = measure.make_operands(a, b, dtype, "cpu", case)
    outs = {"full": ops.product(), **{f"slice_m={k}": ops.product(ops.a[:k]) for k in case.slice_m}}
    for part, y in outs.items():
        np.save(f"{sys.argv[1]}/{c}-{dtype}-{part}.npy", measure.tensor_bits(y))
    out[f"{c}-{dtype}"] = m.bits
print(json.dumps(out))
"""


@pytest.mark.skipif("mkl" not in torch.__config__.show().lower(), reason="torch without MKL here")
def test_a_route_that_changes_the_bits_changes_the_digest_and_one_that_does_not_keeps_it(tmp_path):
    """MKL_CBWR=COMPATIBLE, and the default again, against the default route, each in its own
    process: the digests differ exactly where the products' bits do (whichever that is on this
    CPU; on an Intel Xeon with AVX-512 COMPATIBLE changed every output of these cells)."""
    got = {}
    for name, extra in (("default", {}), ("compatible", {"MKL_CBWR": "COMPATIBLE"}), ("again", {})):
        (tmp_path / name).mkdir()
        env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | extra
        p = subprocess.run([sys.executable, "-c", ROUTE, str(tmp_path / name)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        got[name] = json.loads(p.stdout.splitlines()[-1])
    compared = 0
    for cell, parts in got["default"].items():
        for part, digest in parts.items():
            x = np.load(tmp_path / "default" / f"{cell}-{part}.npy")
            assert hashlib.sha256(x.tobytes()).hexdigest() == digest  # the measured product's bits
            for side in ("compatible", "again"):
                y = np.load(tmp_path / side / f"{cell}-{part}.npy")
                moved = not np.array_equal(x, y)
                assert (got[side][cell][part] != digest) == moved, (side, cell, part)
                compared += 1
    assert compared == 2 * (3 + len(cases.get("skinny").slice_m))
