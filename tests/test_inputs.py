"""Inputs are bit-identical with golden checksums, and rounding agrees with torch's."""

import numpy as np
import pytest
import torch

from matmul_drift import blocks, cases, inputs, measure

# Frozen from the first run. If one of these changes, every recorded input_id changes
# with it and the summary will refuse to compare old and new results.
GOLDEN_SMALL = {
    "float64": "712830b119689acb",
    "float32": "d788bda2ff050f8f",
    "float16": "f15b0602791ff458",
    "bfloat16": "aefdf385b6a22050",
}
GOLDEN_CASES = {
    ("square", "float32"): "6a2718da29f682a8",
    ("square", "bfloat16"): "56ff17058eb52441",
    ("bmm", "float32"): "193e089c5f591606",
    ("bmm", "bfloat16"): "3be9619fb6514a04",
    ("linear", "float32"): "72f072b9acda8309",
    ("linear", "bfloat16"): "2e2a388a69637b88",
}


@pytest.mark.parametrize("dtype", sorted(GOLDEN_SMALL))
def test_golden_small(dtype):
    bits = inputs.round_bits(inputs.draw(7, "golden", (3, 5), "uniform"), dtype)
    assert inputs.checksum(bits)[:16] == GOLDEN_SMALL[dtype]


def test_golden_distributions():
    for dist, want in (("signed", "407bdba022212b4b"), ("int", "2b29b9630e771e2f")):
        bits = inputs.round_bits(inputs.draw(7, "golden", (64,), dist), "float32")
        assert inputs.checksum(bits)[:16] == want


@pytest.mark.parametrize("case_id,dtype", sorted(GOLDEN_CASES))
def test_golden_case_operands(case_id, dtype):
    assert measure.operand_bits(cases.get(case_id), dtype, "cpu")[2][:16] == GOLDEN_CASES[(case_id, dtype)]


def test_independent_of_chunking_and_threads(monkeypatch):
    whole = inputs.draw(3, "x", (1000,), "signed")
    rounded = {dtype: inputs.round_bits(whole, dtype) for dtype in inputs.BITS_DTYPE}
    monkeypatch.setattr(inputs, "_CHUNK", 7)
    monkeypatch.setattr(blocks, "SIZE", 13)  # 77 blocks, on every core
    monkeypatch.setattr(blocks, "workers", lambda: 4)
    assert np.array_equal(whole, inputs.draw(3, "x", (1000,), "signed"))
    for dtype, bits in rounded.items():
        assert np.array_equal(bits, inputs.round_bits(whole, dtype)), dtype


def test_ranges():
    u = inputs.draw(1, "u", (10000,), "uniform")
    s = inputs.draw(1, "s", (10000,), "signed")
    i = inputs.draw(1, "i", (10000,), "int", int_range=3)
    assert u.min() >= 0 and u.max() < 1
    assert s.min() >= -1 and s.max() < 1 and s.min() < -0.9
    assert set(np.unique(i).tolist()) == {-3, -2, -1, 0, 1, 2, 3}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rounding_matches_torch(dtype):
    # Independent computation: torch's own float32 -> dtype conversion (round to nearest even).
    v = inputs.draw(5, "r", (4096,), "signed") * np.float32(1000)
    ours = inputs.round_bits(v, dtype)
    theirs = measure.tensor_bits(torch.from_numpy(v).to(getattr(torch, dtype)))
    assert np.array_equal(ours, theirs)


def test_tensor_roundtrip_is_bit_exact():
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        bits = inputs.round_bits(inputs.draw(2, "t", (17, 3), "signed"), dtype)
        t = measure.to_tensor(bits, dtype, "cpu")
        assert str(t.dtype) == f"torch.{dtype}"
        assert np.array_equal(measure.tensor_bits(t), bits)
