"""Inputs are bit-identical with golden checksums, and rounding agrees with torch's."""

import numpy as np
import pytest
import torch

from matmul_drift.core import blocks, cases
from matmul_drift.measure import inputs, measure

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


@pytest.mark.parametrize("dist", inputs.DISTRIBUTIONS)
def test_drawing_a_block_at_a_time_gives_the_bits_of_the_whole_draw_rounded(monkeypatch, dist):
    # measure.operand_bits draws each block and rounds it at once, with no float32 copy of the
    # operand; the bits are those of rounding the whole draw, in blocks of any size, on any core
    shapes = [(0,), (1,), (3, 0), (1, 1), (17, 3), (2, 70_001)]  # 140002: past a _CHUNK, uneven
    want = {(shape, dtype): inputs.round_bits(inputs.draw(9, "bb", shape, dist, int_range=5), dtype)
            for shape in shapes for dtype in inputs.BITS_DTYPE}
    for chunk, size, workers in ((None, None, None), (7, 13, 4), (1 << 16, 1 << 20, 1), (997, 100_000, 3)):
        if chunk:
            monkeypatch.setattr(inputs, "_CHUNK", chunk)
            monkeypatch.setattr(blocks, "SIZE", size)
            monkeypatch.setattr(blocks, "workers", lambda w=workers: w)
        for (shape, dtype), bits in want.items():
            if chunk == 7 and len(shape) > 1 and shape[1] > 1000:  # 10770 blocks of 13: slow, and no more telling
                continue
            got = inputs.draw_bits(9, "bb", shape, dtype, dist, int_range=5)
            assert got.dtype == bits.dtype and got.shape == shape and np.array_equal(got, bits), (shape, dtype, chunk)
    with pytest.raises(ValueError, match="unknown dtype"):
        inputs.draw_bits(9, "bb", (2,), "float8", dist)
    with pytest.raises(ValueError, match="unknown distribution"):
        inputs.draw_bits(9, "bb", (2,), "float32", "normal")


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


def _nearest(x, p: int, emin: int, emax: int) -> float:
    """x (a Fraction) rounded once to a binary format of p bits and exponents emin..emax,
    to nearest, ties to even; ±inf beyond it. Independent of numpy and torch."""
    from fractions import Fraction

    if x == 0:
        return 0.0
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += 1 if a >= Fraction(2) ** (e + 1) else -1 if a < Fraction(2) ** e else 0  # 2^e <= a < 2^(e+1)
    q = Fraction(2) ** (max(e, emin) - p + 1)
    v = round(a / q) * q  # Fraction's round takes ties to even
    return (1 if x > 0 else -1) * (float("inf") if v >= Fraction(2) ** (emax + 1) else float(v))


def _float64_cases() -> np.ndarray:
    """Near-ties and edges of float16 and bfloat16 a float32 step would round wrongly, and random ones."""
    t = 2.0 ** -40
    crafted = [1 + 2**-11 + t, 1 + 2**-11 - t, 1 + 3 * 2**-11 - t, 1 + 2**-8 + t, 1 + 2**-8 - t, 1 + 3 * 2**-8 + t,
               65519.99, 65520.0, 65520.0 - 2**-20, 2.0**-25 + 2**-60, 2.0**-25, 2.0**-24 * 1.5 + 2**-70,
               2.0**-133 * (1 + 2**-30), 2.0**-134 * 3, 3.3961e38, 3.39617e38, 3.4e38, 1e300, -1e300,
               5e-324, 0.0, -0.0, float("inf"), float("-inf")]
    rng = np.random.default_rng(3)
    wide = rng.standard_normal(3000) * np.exp2(rng.integers(-140, 130, 3000).astype(np.float64))
    bits = rng.integers(0, 2**64, 3000, dtype=np.uint64).view(np.float64)
    vals = np.concatenate([crafted, [-v for v in crafted], wide, bits])
    return vals[np.isfinite(vals) | np.isinf(vals)]  # the random bits' NaNs aside


@pytest.mark.parametrize("dtype,p,emin,emax", [("float16", 11, -14, 15), ("bfloat16", 8, -126, 127),
                                               ("float32", 24, -126, 127)])
def test_float64_values_are_rounded_once(dtype, p, emin, emax):
    """A float64 file measured in float16 or bfloat16 is rounded to nearest once, as exact
    rational arithmetic rounds it (torch on the CPU goes through float32 and rounds twice)."""
    from fractions import Fraction

    vals = _float64_cases()
    got = measure.to_tensor(inputs.round_bits(vals, dtype), dtype, "cpu").double().numpy()
    want = np.array([v if not np.isfinite(v) else _nearest(Fraction(v), p, emin, emax) for v in vals])
    bad = np.flatnonzero(~((got == want) & (np.signbit(got) == np.signbit(want)) | (want == 0) & (got == 0)))
    assert bad.size == 0, [(vals[i], got[i], want[i]) for i in bad[:5]]
    nan = inputs.round_bits(np.array([np.nan, -np.nan]), dtype)
    assert np.isnan(measure.to_tensor(nan, dtype, "cpu").double().numpy()).all()


def test_a_float64_file_is_rounded_once_and_keeps_its_layout():
    """measure.restride (explain's --a/--b): float64 to float16 rounded once, strides kept."""
    t = torch.tensor([[1 + 2**-11 + 2**-40, 3.0], [65520.0 - 2**-20, 1 + 2**-11]], dtype=torch.float64).t()
    out = measure.restride(t, torch.float16, "cpu", keep=True)
    assert out.stride() == t.stride() and out.tolist() == [[1 + 2**-10, 65504.0], [3.0, 1.0]]
    assert measure.restride(t, torch.float16, "cpu", keep=False).tolist() == out.tolist()
