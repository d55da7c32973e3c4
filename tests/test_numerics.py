"""Known truths for numerics: hand-built bit patterns and the unit roundoffs."""

import numpy as np
import pytest

from matmul_drift import numerics


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
    assert numerics.error_u(x, np.array([1.0, 2.0, 5.0]), absprod, "float32") == 0.0
