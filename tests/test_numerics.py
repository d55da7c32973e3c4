"""Known truths for numerics: hand-built bit patterns and the unit roundoffs."""

import math

import numpy as np
import pytest
import torch

from matmul_drift.core import blocks, numerics


def bits32(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def bits16(values):
    return np.asarray(values, dtype=np.float16).view(np.uint16)


def test_signed_zeros_are_zero_apart():
    assert numerics.ulp_distance(bits32([0.0]), bits32([-0.0]), 32).tolist() == [0]
    assert numerics.ulp_distance(bits16([-0.0]), bits16([0.0]), 16).tolist() == [0]


def test_adjacent_floats_are_one_apart():
    x = np.float32(1.0)
    up = np.nextafter(x, np.float32(2))
    down = np.nextafter(x, np.float32(0))
    assert numerics.ulp_distance(bits32([x, x]), bits32([up, down]), 32).tolist() == [1, 1]
    big = np.float64(1e300)
    b64 = lambda v: np.asarray(v, dtype=np.float64).view(np.uint64)
    assert numerics.ulp_distance(b64([big]), b64([np.nextafter(big, np.inf)]), 64).tolist() == [1]


def test_subnormals_count_every_step():
    tiny = np.float32(2.0**-149)  # the smallest float32 subnormal, bit pattern 1
    assert bits32([tiny]).tolist() == [1]
    assert numerics.ulp_distance(bits32([0.0]), bits32([tiny * 5]), 32).tolist() == [5]
    # from the largest subnormal to the smallest normal is one step
    largest_sub = np.float32(2.0**-126) - tiny
    assert numerics.ulp_distance(bits32([largest_sub]), bits32([2.0**-126]), 32).tolist() == [1]


def test_mixed_signs_add_magnitudes():
    tiny16 = np.float16(2.0**-24)
    assert numerics.ulp_distance(bits16([tiny16]), bits16([-tiny16]), 16).tolist() == [2]
    # 1.0 and -1.0 in float16: bit magnitudes 0x3C00 each
    assert numerics.ulp_distance(bits16([1.0]), bits16([-1.0]), 16).tolist() == [2 * 0x3C00]
    # float64 extremes do not overflow: +max and -max are 2*(0x7FEF...) apart
    b64 = lambda v: np.asarray(v, dtype=np.float64).view(np.uint64)
    top = np.finfo(np.float64).max
    assert int(numerics.ulp_distance(b64([top]), b64([-top]), 64)[0]) == 2 * 0x7FEFFFFFFFFFFFFF


def test_bfloat16_bits_handled():
    one = np.array([0x3F80], dtype=np.uint16)  # bf16 1.0
    nxt = np.array([0x3F81], dtype=np.uint16)
    neg = np.array([0xBF80], dtype=np.uint16)
    assert numerics.ulp_distance(one, nxt, 16).tolist() == [1]
    assert numerics.ulp_distance(one, neg, 16).tolist() == [2 * 0x3F80]


def test_unit_roundoffs_and_ulps():
    assert numerics.unit_roundoff("float16") == 2.0**-11
    assert numerics.unit_roundoff("bfloat16") == 2.0**-8
    # one ulp is 2u at 1.0
    for dt in ("float64", "float32", "float16", "bfloat16"):
        assert numerics.ulp_of(1.0, dt) == 2 * numerics.unit_roundoff(dt)
    # the seed: magnitudes in [512, 1024) have an fp16 ulp of 0.5, [1024, 2048) of 1
    assert numerics.ulp_of(1000.0, "float16") == 0.5
    assert numerics.ulp_of(1024.0, "float16") == 1.0
    assert float(np.spacing(np.float16(1000.0))) == 0.5  # numpy agrees
    with pytest.raises(ValueError):
        numerics.unit_roundoff("float8")


def test_gamma_bound():
    assert numerics.gamma_k_u(4096, 2.0**-24) == pytest.approx(4096 / (1 - 4096 * 2.0**-24))
    assert numerics.gamma_k_u(2048, 2.0**-11) is None  # K u = 1
    assert numerics.gamma_k_u(4096, 2.0**-11) is None


def test_drift_and_error_normalisation():
    x = np.array([1.0, 2.0, 0.0], dtype=np.float32)
    y = np.array([1.0, np.nextafter(np.float32(2.0), np.float32(3)), 0.0], dtype=np.float32)
    absprod = np.array([1.0, 2.0, 0.0])
    d = numerics.drift(bits32(x), bits32(y), x, y, absprod, "float32")
    assert d["max_ulp"] == 1
    assert d["frac_differ"] == pytest.approx(1 / 3)
    # |diff| = 2^-22 at 2.0; u·|A||B| = 2^-24 · 2 = 2^-23, so max_u = 2
    assert d["max_u"] == 2.0
    assert d["ulp_at_max"] == 2.0**-22
    e = numerics.error(x, np.array([1.0, 2.0, 5.0]), np.zeros(3), np.ones(3, bool), absprod, "float32")
    assert e == {"error_u": 0.0, "entries": 2, "of": 3, "zero_misses": 0, "exact_zeros": 0, "subnormal": 0, "beyond_bound": 0}


def test_finite_max_of_each_dtype():
    assert numerics.finite_max("float16") == 65504.0
    assert numerics.finite_max("float32") == float(np.finfo(np.float32).max)
    assert numerics.finite_max("float64") == float(np.finfo(np.float64).max)
    assert numerics.finite_max("bfloat16") == float(torch.finfo(torch.bfloat16).max)


def test_nonfinite_entries_are_drift_not_dropped():
    # entry 0 agrees (NaN both sides, other payload); 1 turns finite -> inf; 2 NaN -> number;
    # 3 changes sign near zero; 4 agrees
    x = np.array([np.nan, 65504.0, np.nan, 2.0**-20, 1.0], dtype=np.float16)
    y = np.array([-np.nan, np.inf, 3.0, -(2.0**-20), 1.0], dtype=np.float16)
    absprod = np.array([1.0, 65504.0, 1.0, 2.0**-10, 1.0])
    d = numerics.drift(x.view(np.uint16), y.view(np.uint16), x, y, absprod, "float16")
    assert d["frac_differ"] == 3 / 5
    assert d["nonfinite_differ"] == 2
    assert d["sign_changes"] == 1
    # finite pairs only: entry 3 is 2·2^-20 apart = 2^-19 over u·|A||B| = 2^-11·2^-10
    assert d["max_u"] == 2.0**-19 / 2.0**-21
    assert d["max_ulp"] == 2 * (2.0**-20 / 2.0**-24)  # subnormal steps of 2^-24 on each side


def test_error_covers_finite_entries_and_counts_the_rest():
    c = np.array([np.inf, np.nan, 1.0, np.inf, 2.0, 0.5])
    hi = np.array([70000.0, np.nan, 1.0, 100.0, 2.0, 0.0])
    finite = np.array([True, False, True, True, True, True])
    absprod = np.array([70000.0, 1.0, 1.0, 100.0, 2.0, 0.0])
    e = numerics.error(c, hi, np.zeros(6), finite, absprod, "float16")
    assert e == {"error_u": 0.0, "entries": 2, "of": 6, "zero_misses": 1, "exact_zeros": 0, "subnormal": 0, "beyond_bound": 0}
    nf = numerics.nonfinite(c, hi, finite, "float16")
    assert nf == {"product": 3, "reference": 1, "overflow": 1, "spurious": 1, "mismatch": 0}
    nf = numerics.nonfinite(np.array([1.0, np.inf]), np.array([np.nan, -np.inf]), np.array([False, False]), "float16")
    assert nf["mismatch"] == 2 and nf["reference"] == 2


def test_only_inf_of_the_exact_values_sign_is_a_rounded_overflow():
    # exact values beyond float16's 65504: +inf is their rounding; NaN (partial sums that
    # overflowed both ways) and -inf are not, nor is inf where the exact value is in range
    hi = np.array([70000.0, 70000.0, 70000.0, -70000.0, 60000.0])
    c = np.array([np.inf, np.nan, -np.inf, -np.inf, np.inf])
    nf = numerics.nonfinite(c, hi, np.ones(5, dtype=bool), "float16")
    assert nf == {"product": 5, "reference": 0, "overflow": 2, "spurious": 3, "mismatch": 0}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_an_inf_is_the_rounding_only_from_the_dtypes_rounding_threshold(dtype):
    # torch's own rounding says where: between the largest finite value and that plus half
    # its ulp, an exact value rounds down to the largest finite value, not to inf
    top, over = numerics.finite_max(dtype), numerics.overflow_threshold(dtype)
    if dtype != "float64":
        # the threshold's neighbour below, in the widest type that rounds to the dtype at once:
        # torch rounds float64 to float16 and bfloat16 through float32, twice
        wide = np.float64 if dtype == "float32" else np.float32
        below = float(np.nextafter(wide(over), wide(0)))
        t = torch.tensor([top, below, over], dtype=getattr(torch, wide.__name__)).to(getattr(torch, dtype)).double()
        assert t.tolist() == [top, top, math.inf]
    else:  # beyond float64's own range: only an exact value that is itself inf in float64
        below, over = top, math.inf
    nf = numerics.nonfinite(np.array([np.inf, np.inf]), np.array([below, over]), np.ones(2, dtype=bool), dtype)
    assert (nf["overflow"], nf["spurious"]) == (1, 1)
    # a reference that may be off by more than the value (inputs spanning float64's range):
    # an inf it may round to, of either sign, is no spurious overflow
    hi, c = np.array([0.0, 0.0]), np.array([-np.inf, np.inf])
    assert numerics.nonfinite(c, hi, np.ones(2, dtype=bool), dtype)["spurious"] == 2
    nf = numerics.nonfinite(c, hi, np.ones(2, dtype=bool), dtype, np.array([np.inf, 1.0]))
    assert (nf["overflow"], nf["spurious"]) == (1, 1)


def test_bound_allows_underflow_but_not_more():
    # fp16, K = 1: 3.07e-5 · -3.23e-5 = -9.9e-10 is below half fp16's smallest subnormal
    # (2^-25): 0 is its correctly rounded value, 2^-24 / (u·|A||B|) ≈ 2048 u relative.
    exact = -9.9e-10
    e = numerics.error(np.array([-0.0]), np.array([exact]), np.zeros(1), np.ones(1, bool), np.array([-exact]),
                       "float16", k=1)
    assert e["error_u"] > 1000 and e["subnormal"] == 1 and e["beyond_bound"] == 0
    assert numerics.underflow_step("float16") == 2.0**-25
    # one subnormal step off at K = 1 exceeds γ_1·u·|A||B| + 2·η = 2^-24 (+ a hair): a defect
    e = numerics.error(np.array([2.0**-24 + 2.0**-23]), np.array([2.0**-24]), np.zeros(1), np.ones(1, bool),
                       np.array([2.0**-24]), "float16", k=1)
    assert e["beyond_bound"] == 1
    # a normal-range miss by 2 u at K = 1 is beyond γ_1 ≈ 1 u
    e = numerics.error(np.array([1.0 + 2**-9]), np.array([1.0]), np.zeros(1), np.ones(1, bool), np.array([1.0]),
                       "float16", k=1)
    assert e["beyond_bound"] == 1 and e["error_u"] == 4.0
    assert numerics.error(np.array([1.0]), np.array([1.0]), np.zeros(1), np.ones(1, bool), np.array([1.0]),
                          "float16", k=4096)["beyond_bound"] == 0  # K·u ≥ 1: no bound, never beyond


def chop32(x: np.ndarray) -> np.ndarray:
    """float64 values cut toward zero to float32."""
    f = x.astype(np.float32)
    return np.where(np.abs(f.astype(np.float64)) > np.abs(x), np.nextafter(f, np.float32(0)), f)


def tf32_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A TF32 tensor core at its worst: each fp32 input cut to 10 fraction bits, products exact,
    the running sum cut toward zero to fp32 after every addition (each sum exact in float64:
    the terms lie within 2^29 of each other)."""
    cut = lambda v: (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)  # noqa: E731
    terms = cut(a)[:, :, None] * cut(b)[None, :, :]
    s = np.zeros((a.shape[0], b.shape[1]))
    for i in range(a.shape[1]):
        s = chop32(s + terms[:, i, :])
    return s.astype(np.float32)


def test_tf32s_bound_holds_where_gamma_k_alone_does_not():
    """The TF32 precisions' bound (numerics.bound_u) against exact sums (math.fsum of float64
    products of float32 inputs, each exact): a kernel that cuts every input and every sum is
    within it, and beyond γ_K, which would call that correct kernel a defect."""
    import math
    # by hand, K = 1: 1 + 2^-10 − 2^-23 cut to 10 bits is 1, so its square loses 2^-9 (2^15 u)
    a = np.array([[1 + 2.0**-10 - 2.0**-23]], dtype=np.float32)
    c = tf32_kernel(a, a.T)
    exact = float(a[0, 0]) ** 2
    e = numerics.error(c, np.array([[exact]]), np.zeros((1, 1)), np.ones((1, 1), bool), np.array([[exact]]), "float32",
                       k=1, precision="float32-tf32")
    assert c[0, 0] == 1.0 and e["error_u"] == pytest.approx((exact - 1) / exact * 2**24) and e["beyond_bound"] == 0
    assert numerics.gamma_k_u(1, 2.0**-24) < 1.01 < 32000 < e["error_u"]
    assert e["error_u"] < numerics.bound_u(1, "float32", "float32-tf32")
    # K = 4096, positive inputs, so that every cut errs the same way
    rng = np.random.default_rng(3)
    k = 4096
    a = rng.uniform(0.5, 1, (4, k)).astype(np.float32)
    b = rng.uniform(0.5, 1, (k, 6)).astype(np.float32)
    c = tf32_kernel(a, b)
    terms = a.astype(np.float64)[:, :, None] * b.astype(np.float64)[None, :, :]
    exact = np.array([[math.fsum(terms[i, :, j]) for j in range(6)] for i in range(4)])
    hi = exact.astype(np.float64)
    lo = np.array([[float(math.fsum([*terms[i, :, j], -hi[i, j]])) for j in range(6)] for i in range(4)])
    args = (c, hi, lo, np.ones(c.shape, bool), exact, "float32")
    tf32, plain = numerics.error(*args, k=k, precision="float32-tf32"), numerics.error(*args, k=k)
    bound = numerics.bound_u(k, "float32", "float32-tf32")
    assert numerics.gamma_k_u(k, 2.0**-24) < tf32["error_u"] < bound
    assert tf32["beyond_bound"] == 0 and plain["beyond_bound"] == 24
    assert bound == pytest.approx(((1 + 2.0**-10) ** 2 * (1 + 2 * 2.0**-24 * k / (1 - 2 * k * 2.0**-24)) - 1) * 2**24)
    assert numerics.bound_u(k, "float32") == numerics.gamma_k_u(k, 2.0**-24)  # other precisions keep γ_K
    assert numerics.bound_u(2**23, "float32", "float32-high") is None  # 2K·u ≥ 1


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_blocks_and_threads_change_nothing(monkeypatch, dtype):
    # error, nonfinite and drift work in blocks on several threads: the same answers as in
    # one block, on entries of every kind (NaN, ±inf, ±0, subnormal, beyond range, |A||B| = 0)
    rng = np.random.default_rng(0)
    n = 1000
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0**-24, 7e4, -7e4])
    hi = np.where(rng.random(n) < 0.1, rng.choice(special, n), rng.standard_normal(n) * 100)
    finite = np.isfinite(hi) | (rng.random(n) < 0.5)
    with np.errstate(over="ignore"):
        c = hi.astype(dtype).astype(np.float64)
    c[rng.random(n) < 0.3] = np.nan
    y = c.copy()
    moved = rng.random(n) < 0.2
    y[moved] = np.nextafter(c[moved].astype(dtype), np.asarray(np.inf, dtype)).astype(np.float64)
    lo = rng.standard_normal(n) * 1e-12
    absprod = np.abs(hi) * np.where(rng.random(n) < 0.1, 0.0, 1.5)
    bits = lambda v: v.astype(dtype).view(np.uint16 if dtype == "float16" else np.uint32)  # noqa: E731

    def answers():
        return (numerics.error(c, hi, lo, finite, absprod, dtype, k=64), numerics.nonfinite(c, hi, finite, dtype),
                numerics.drift(bits(c), bits(y), c, y, absprod, dtype, k=64))

    monkeypatch.setattr(blocks, "SIZE", 10**9)
    whole = answers()
    monkeypatch.setattr(blocks, "SIZE", 7)
    monkeypatch.setattr(blocks, "workers", lambda: 3)
    assert answers() == whole
    assert whole[0]["entries"] > 0 and whole[2]["frac_differ"] > 0 and whole[1]["product"] > 0


def test_the_ulp_at_the_largest_drift_is_the_finer_one_at_a_power_of_two():
    # The seed's fp16 outputs straddle 1024, where the spacing doubles: 1023.5 and 1024 are
    # neighbours, one ulp of 0.5 apart, which the ulp of the larger value (1) made half an ulp.
    pairs = [(1023.5, 1024.0), (2048.0, 2047.0), (-2048.0, -2047.0), (1000.0, 1000.5), (2048.0, 2050.0),
             (2.0**-14, 2.0**-14 - 2.0**-24)]  # the smallest normal and the largest subnormal
    for x, y in pairs:
        xs, ys = np.array([x], dtype=np.float16), np.array([y], dtype=np.float16)
        d = numerics.drift(xs.view(np.uint16), ys.view(np.uint16), xs, ys, np.array([abs(x)]), "float16")
        spacing = float(np.spacing(np.minimum(np.abs(xs), np.abs(ys)))[0])  # numpy's gap above the smaller
        assert d["max_ulp"] == 1 and d["ulp_at_max"] == spacing == d["max_abs"], (x, y, d)


def test_a_correctly_rounded_tiny_sum_of_underflowed_terms_is_no_zero_miss():
    from fractions import Fraction

    from matmul_drift.measure import reference

    # Each product 2^-1076 underflows float64 (|A||B| reads 0), yet the three sum to
    # 0.75·2^-1074, which rounds to 2^-1074: a kernel returning that is right, not a defect.
    a = torch.full((1, 3), 2.0**-538, dtype=torch.float64)
    r = reference.exact_product(torch.matmul, a, a.T.contiguous())
    exact = 3 * Fraction(2) ** -1076
    assert r.absprod[0, 0] == 0 and r.hi[0, 0] == 2.0**-1074  # the exact value, rounded
    for c in (2.0**-1074, 0.0):  # each within one step of 2^-1074 of the exact value
        assert abs(Fraction(c) - exact) <= Fraction(2) ** -1074
        e = numerics.error(np.array([[c]]), r.hi, r.lo, r.finite, r.absprod, "float64", k=3)
        assert e["zero_misses"] == 0 and e["exact_zeros"] == 0  # 0 is not the exact value here
    # where every term is an exact zero, a non-zero output still is one, and 0 is exact
    z = torch.zeros((1, 3), dtype=torch.float64)
    r = reference.exact_product(torch.matmul, z, z.T.contiguous())
    assert numerics.error(np.array([[2.0**-1074]]), r.hi, r.lo, r.finite, r.absprod, "float64", k=3)["zero_misses"] == 1
    e = numerics.error(np.array([[-0.0]]), r.hi, r.lo, r.finite, r.absprod, "float64", k=3)
    assert (e["error_u"], e["entries"], e["zero_misses"], e["exact_zeros"]) == (None, 0, 0, 1)
