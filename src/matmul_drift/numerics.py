"""Unit roundoff, ulp distance, error normalisation and bounds. numpy only, no torch.

Floating-point values arrive here as their raw bit patterns (unsigned integer arrays),
so bfloat16, which numpy lacks, is handled like the others.
"""

from __future__ import annotations

import math

import numpy as np

# Unit roundoff u = 2^-p of each output dtype (p = significand bits incl. the hidden one).
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
# Bits of the significand stored explicitly, and of the whole format.
MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}
WIDTH = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}
EXPONENT_BIAS = {"float64": 1023, "float32": 127, "float16": 15, "bfloat16": 127}


def unit_roundoff(dtype: str) -> float:
    """u of ``dtype`` (dimensionless): half the gap between 1 and the next float."""
    try:
        return UNIT_ROUNDOFF[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(UNIT_ROUNDOFF)}") from None


def gamma_k_u(k: int, u: float) -> float | None:
    """The deterministic bound γ_K / u = K / (1 − K·u), in units of u; None where K·u ≥ 1."""
    if k * u >= 1:
        return None
    return k / (1 - k * u)


def ordered(bits: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Split bit patterns into (negative?, magnitude) so that value order is integer order.

    +0 and −0 both have magnitude 0. Returns a bool array and a uint64 array.
    """
    b = np.asarray(bits).astype(np.uint64, copy=False)
    sign_bit = np.uint64(1) << np.uint64(width - 1)
    negative = (b & sign_bit) != 0
    magnitude = b & ~sign_bit
    return negative, magnitude


def ulp_distance(x_bits: np.ndarray, y_bits: np.ndarray, width: int) -> np.ndarray:
    """|ord(x) − ord(y)| per entry, as uint64: the number of floats between x and y.

    ord maps +0 and −0 to 0 and mirrors negatives. The sum of two magnitudes < 2^63
    fits in uint64, so no width overflows.
    """
    xn, xm = ordered(x_bits, width)
    yn, ym = ordered(y_bits, width)
    same = xn == yn
    with np.errstate(over="ignore"):
        return np.where(same, np.maximum(xm, ym) - np.minimum(xm, ym), xm + ym)


def drift(
    x_bits: np.ndarray,
    y_bits: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    absprod: np.ndarray,
    dtype: str,
) -> dict:
    """Drift between two products of one dtype.

    ``x_bits``/``y_bits`` are the raw bits, ``x``/``y`` the same values as float64 and
    ``absprod`` is |A||B| in float64 for the same entries. Returns
    ``max_ulp`` (int, output ulps), ``frac_differ`` (fraction of entries whose bits
    differ after ±0 folding), ``max_u`` (max |x−y| / (u·|A||B|), entries with
    |A||B| = 0 left out), ``max_abs`` (float, output units) and ``ulp_at_max`` (one ulp
    of the dtype at the larger magnitude of the entry with the largest |x−y|).
    """
    d = ulp_distance(x_bits, y_bits, WIDTH[dtype])
    n = d.size
    max_ulp = int(d.max()) if n else 0
    frac = float(np.count_nonzero(d)) / n if n else 0.0
    diff = np.abs(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64))
    max_abs = float(np.nanmax(diff)) if n else 0.0
    if n and max_abs > 0:
        at = int(np.nanargmax(diff))
        mag = max(abs(float(np.ravel(x)[at])), abs(float(np.ravel(y)[at])))
        ulp_at_max = ulp_of(mag, dtype)
    else:
        ulp_at_max = None
    return {
        "max_ulp": max_ulp,
        "frac_differ": frac,
        "max_u": normalised_max(diff, absprod, unit_roundoff(dtype)),
        "max_abs": max_abs,
        "ulp_at_max": ulp_at_max,
    }


def normalised_max(absdiff: np.ndarray, absprod: np.ndarray, u: float) -> float:
    """max of absdiff / (u·absprod) over entries with absprod > 0, in units of u (0.0 if none)."""
    absdiff = np.asarray(absdiff, dtype=np.float64)
    absprod = np.asarray(absprod, dtype=np.float64)
    keep = absprod > 0
    if not keep.any():
        return 0.0
    return float(np.max(absdiff[keep] / (u * absprod[keep])))


def error_u(c: np.ndarray, c64: np.ndarray, absprod: np.ndarray, dtype: str) -> float:
    """error_u = max |C − C64| / (u·(|A||B|)), in units of u of the output ``dtype``."""
    c = np.asarray(c, dtype=np.float64)
    return normalised_max(np.abs(c - np.asarray(c64, dtype=np.float64)), absprod, unit_roundoff(dtype))


def ulp_of(x: float, dtype: str) -> float:
    """The gap between |x| and the next larger float of ``dtype`` (output units).

    For subnormals and zero it is the smallest subnormal step.
    """
    p = MANTISSA_BITS[dtype]
    emin = 1 - EXPONENT_BIAS[dtype]
    x = abs(float(x))
    if x == 0 or not math.isfinite(x):
        return 2.0 ** (emin - p)
    e = max(math.frexp(x)[1] - 1, emin)
    return 2.0 ** (e - p)
