"""Unit roundoff, ulp distance, error normalisation and bounds. numpy only, no torch.

Floating-point values arrive here as their raw bit patterns (unsigned integer arrays),
so bfloat16, which numpy lacks, is handled like the others.
"""

from __future__ import annotations

import math

import numpy as np

from matmul_drift.core import blocks

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


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, for b > 0: integer arithmetic, exact at any size (no float)."""
    return -(-a // b)


def unit_roundoff(dtype: str) -> float:
    """u of ``dtype`` (dimensionless): half the gap between 1 and the next float."""
    try:
        return UNIT_ROUNDOFF[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; "
                         f"expected one of {', '.join(UNIT_ROUNDOFF)}") from None


def gamma_k_u(k: int, u: float) -> float | None:
    """The deterministic bound γ_K / u = K / (1 − K·u), in units of u; None where K·u ≥ 1."""
    if k * u >= 1:
        return None
    return k / (1 - k * u)


# The TF32 precisions (CUDA): tensor cores take each fp32 input to 10 fraction bits, cut or
# rounded (a relative error below 2^-10 either way), multiply exactly and add in fp32 cutting
# toward zero (Fasi et al. 2021), whose unit roundoff is 2u. γ_K alone does not bound them.
TF32 = ("float32-tf32", "float32-high")
TF32_INPUT_REL = 2.0**-10


def bound_u(k: int, dtype: str, precision: str | None = None) -> float | None:
    """The deterministic bound on |C − AB| / (u·|A||B|) of a K-term product, in units of u of
    ``dtype``: γ_K / u; for a TF32 ``precision`` ((1 + r)²(1 + γ_K(2u)) − 1) / u with r =
    2^-10, the inputs' rounding and a sum cut toward zero. None where K·u (2K·u) ≥ 1."""
    u = unit_roundoff(dtype)
    if precision not in TF32:
        return gamma_k_u(k, u)
    g = gamma_k_u(k, 2 * u)
    return None if g is None else ((1 + TF32_INPUT_REL) ** 2 * (1 + 2 * u * g) - 1) / u


def bound_name(precision: str | None) -> str:
    """The name of ``bound_u``'s bound for ``precision``: "γ_K", or "γ_K(TF32)"."""
    return "γ_K(TF32)" if precision in TF32 else "γ_K"


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


def finite_max(dtype: str) -> float:
    """The largest finite value of ``dtype`` (output units): (2 − 2^(1−p)) · 2^emax."""
    p, bias = MANTISSA_BITS[dtype] + 1, EXPONENT_BIAS[dtype]
    return math.ldexp(2.0 - 2.0 ** (1 - p), bias)


def overflow_threshold(dtype: str) -> float:
    """The smallest magnitude that rounds to ±inf in ``dtype`` (output units; round to
    nearest): the largest finite value plus half its ulp, (2 − 2^-p) · 2^emax. For float64
    it lies beyond float64 itself: inf, which only a value beyond that range reaches."""
    p, bias = MANTISSA_BITS[dtype] + 1, EXPONENT_BIAS[dtype]
    return math.ldexp(2.0 - 2.0**-p, bias) if dtype != "float64" else math.inf


def underflow_step(dtype: str) -> float:
    """η: half the smallest subnormal of ``dtype`` (output units), the absolute error one
    rounding may add below the normal range, where u·|x| no longer bounds it."""
    return 2.0 ** (1 - EXPONENT_BIAS[dtype] - MANTISSA_BITS[dtype] - 1)


def allowance(absprod: np.ndarray, k: int, dtype: str,
              precision: str | None = None) -> np.ndarray | None:
    """The largest error a correct kernel may make per entry (output units):
    γ_K·u·|A||B| + (K+1)·η, the γ_K bound (``bound_u``: TF32's for a TF32 ``precision``) with
    gradual underflow (K products and one final rounding may each lose η; additions are exact
    there). None where K·u ≥ 1."""
    u = unit_roundoff(dtype)
    g = bound_u(k, dtype, precision)
    if g is None:
        return None
    return g * u * np.asarray(absprod, dtype=np.float64) + (k + 1) * underflow_step(dtype)


def drift(
    x_bits: np.ndarray,
    y_bits: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    absprod: np.ndarray,
    dtype: str,
    k: int | None = None,
    precision: str | None = None,
    absexp: np.ndarray | None = None,
) -> dict:
    """Drift between two products of one dtype (of one ``precision``, for the bound).

    ``x_bits``/``y_bits`` are the raw bits, ``x``/``y`` the same values as float64 and
    ``absprod`` is |A||B| in float64 for the same entries (output units) or, given ``absexp``
    (an integer per entry: Reference.absprod_pow2()), |A||B|·2^-absexp, finite where |A||B|
    overflows float64: max_u and beyond_bound judge those entries on x·2^-absexp and
    y·2^-absexp, as numerics.error does (2^0, no change, where |A||B| is finite). Two entries
    agree when their bits are equal after ±0 folding, or both are NaN. Returns
    ``frac_differ`` (fraction of entries that disagree, non-finite ones included),
    ``nonfinite_differ`` (entries that disagree where either side is NaN or ±inf: a
    finite value turned into inf, NaN into a number),
    ``max_ulp`` (int, output ulps, over entries finite on both sides),
    ``sign_changes`` (entries finite on both sides with opposite signs: their ulp count
    spans zero and says nothing of size),
    ``max_u`` (max |x−y| / (u·|A||B|) over entries finite on both sides with |A||B| > 0, and
    below inf unless ``absexp`` says where it overflows; ``max_u_entries`` says how many),
    ``max_abs`` (float, output units, finite entries), ``ulp_at_max`` (output units: one ulp
    of the dtype at the smaller magnitude of the entry with the largest |x−y|, the finer
    spacing where the two lie on either side of a power of two, so that neighbours such as
    1023.5 and 1024 in float16 are one ulp of 0.5 apart, not half of 1) and, given K,
    ``beyond_bound``: finite entries further apart than twice ``allowance`` (each product
    may be that far from the truth), which no correct pair of kernels can be.
    """
    flat = [np.asarray(v).reshape(-1) for v in (x_bits, y_bits)]
    flat += [np.asarray(v, dtype=np.float64).reshape(-1) for v in (x, y, absprod)]
    n = flat[0].size
    shift = None if absexp is None else -np.asarray(absexp).reshape(-1)

    # Entries with equal bits add nothing below (no ulp, no difference, no sign change), so
    # the rest looks at the others alone: on a GPU's 8192 x 8192 output, most often few.
    def part(s: slice) -> tuple:
        x_bits, y_bits, x, y, absprod = (v[s] for v in flat)
        kept = np.isfinite(x) & np.isfinite(y) & (absprod > 0) & np.isfinite(absprod)
        return np.count_nonzero(kept), s.start + np.flatnonzero(x_bits != y_bits)

    parts = blocks.map_blocks(n, part)
    max_u_entries = int(sum(p[0] for p in parts))
    at = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.intp)
    x_bits, y_bits, x, y, absprod = (v[at] for v in flat)
    both_finite = np.isfinite(x) & np.isfinite(y)
    d = ulp_distance(x_bits, y_bits, WIDTH[dtype])
    same = (d == 0) | (np.isnan(x) & np.isnan(y))
    d = d[both_finite]
    max_ulp = int(d.max()) if d.size else 0
    x, y, absprod = x[both_finite], y[both_finite], absprod[both_finite]
    with np.errstate(over="ignore"):  # finite values 2^1024 apart or more: inf in output units
        diff = np.abs(x - y)
    # in absprod's units; scaled before subtracting, as x − y may overflow where |A||B| does
    diff_u = diff
    if shift is not None:
        shift = shift[at][both_finite]
        diff_u = np.abs(np.ldexp(x, shift) - np.ldexp(y, shift))
    max_abs = float(diff.max()) if diff.size else 0.0
    if max_abs > 0:
        i = int(np.argmax(diff))
        ulp_at_max = ulp_of(min(abs(float(x[i])), abs(float(y[i]))), dtype)
    else:
        ulp_at_max = None
    return {
        "max_ulp": max_ulp,
        "frac_differ": float(np.count_nonzero(~same)) / n if n else 0.0,
        "nonfinite_differ": int(np.count_nonzero(~same & ~both_finite)),
        "sign_changes": int(np.count_nonzero((np.signbit(x) != np.signbit(y))
                                             & (x != 0) & (y != 0))),
        "max_u": normalised_max(diff_u, absprod, unit_roundoff(dtype)),
        "max_u_entries": max_u_entries,
        "max_abs": max_abs,
        "ulp_at_max": ulp_at_max,
        "beyond_bound": _beyond(diff_u, absprod, k, dtype, 2.0, precision=precision),
    }


def _beyond(absdiff: np.ndarray, absprod: np.ndarray, k: int | None, dtype: str, times: float,
            precision: str | None = None, slack: np.ndarray | None = None) -> int:
    """Entries whose absdiff exceeds ``times`` × allowance plus ``slack`` (output units, per
    entry: what the reference itself may be off by); 0 without K, or where K·u ≥ 1."""
    allowed = None if k is None else allowance(absprod, k, dtype, precision)
    if allowed is None:
        return 0
    slack = np.zeros(absdiff.shape) if slack is None else slack
    absdiff, allowed, slack = _kept(np.isfinite(absprod), absdiff, allowed, slack)
    return int(np.count_nonzero(absdiff > times * allowed + slack))


def normalised_max(absdiff: np.ndarray, absprod: np.ndarray, u: float) -> float:
    """max of absdiff / (u·absprod) over entries with 0 < absprod < inf, in units of u (0.0 if
    none)."""
    absdiff = np.asarray(absdiff, dtype=np.float64)
    absprod = np.asarray(absprod, dtype=np.float64)
    keep = (absprod > 0) & np.isfinite(absprod)
    if not keep.any():
        return 0.0
    absdiff, absprod = _kept(keep, absdiff, absprod)
    return float(np.max(absdiff / absprod / u))  # u·|A||B| would underflow to 0 for subnormals


def _kept(keep: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each array's entries where ``keep`` holds: the arrays themselves where it holds
    everywhere, as it most often does (a copy through an all-true mask is work for nothing)."""
    return arrays if keep.all() else tuple(a[keep] for a in arrays)


def error(c: np.ndarray, hi: np.ndarray, lo: np.ndarray, exact_finite: np.ndarray,
          absprod: np.ndarray, dtype: str, k: int | None = None, precision: str | None = None,
          ref_slack: np.ndarray | None = None, absexp: np.ndarray | None = None) -> dict:
    """The error of a product C against the exact product hi + lo (double-double, float64).

    c, hi, lo and ``ref_slack`` are in output units. ``absprod`` is |A||B| (output units)
    or, given ``absexp`` (an integer per entry: Reference.absprod_pow2()), |A||B|·2^-absexp,
    finite where |A||B| overflows float64: those entries are judged on c, hi, lo and
    ``ref_slack`` times 2^-absexp, a power of two that changes no ratio or comparison (it
    rounds only below 2^-1074 there, far below the bound).
    Returns ``error_u`` = max |C − (hi + lo)| / (u·|A||B|) in u of the output ``dtype``
    (None when no entry qualifies) and ``entries`` / ``of``: how many entries it covers
    out of all. An entry is covered when C and the exact value are both finite (not NaN,
    not inf, not beyond float64) and |A||B| > 0 (beyond float64 too, given ``absexp``);
    entries with |A||B| = 0 are exact zeros, and are covered by the count of non-zero
    ``zero_misses`` instead (where the exact value hi is 0: terms whose float64 products
    underflowed to 0 may still sum to a value that rounds to float64's smallest subnormal,
    which a kernel may rightly return);
    ``exact_zeros`` counts the others, the outputs that are 0 there: exact.
    ``subnormal``: covered entries whose |A||B| (as computed, float64) is below the dtype's
    smallest normal number. There every product, partial sum and the exact value lie below
    the normal range, where rounding is absolute, and the allowance's (K+1)·η exceeds
    (K+1)·u·|A||B|: error_u of a correct kernel may reach about (K+1)·smallest normal / |A||B|
    more than γ_K. An exact zero or a tiny value left by cancelling larger terms is not
    counted: its error is bounded relative to |A||B| like any other's.
    ``beyond_bound`` (given K): covered entries whose error exceeds ``allowance`` plus what
    the reference may be off by (``ref_slack``, per entry in output units:
    Reference.slack_or_relative(), large only where the exact value lies among float64's
    subnormals or the inputs span more binades than the reference's split reaches).
    """
    flat = [np.asarray(v, dtype=np.float64).reshape(-1) for v in (c, hi, lo, absprod)]
    if ref_slack is not None:
        flat.append(np.asarray(ref_slack, dtype=np.float64).reshape(-1))
    fin = np.asarray(exact_finite, dtype=bool).reshape(-1)
    u, smallest_normal = unit_roundoff(dtype), 2.0 ** (1 - EXPONENT_BIAS[dtype])
    shift = None if absexp is None else -np.asarray(absexp).reshape(-1)

    def part(at: slice) -> tuple:
        c, hi, lo, absprod, *slack = (v[at] for v in flat)
        # the same units as absprod: 2^0 (no change) wherever |A||B| is finite
        if shift is not None:
            c, hi, lo, *slack = (np.ldexp(v, shift[at]) for v in (c, hi, lo, *slack))
        ok = np.isfinite(c) & fin[at] & np.isfinite(hi)
        keep = ok & (absprod > 0) & np.isfinite(absprod)
        zero = ok & (absprod == 0) & (hi == 0)
        zero_misses = int(np.count_nonzero(zero & (c != 0)))
        exact_zeros = int(np.count_nonzero(zero)) - zero_misses
        c, hi, lo, absprod, *slack = _kept(keep, c, hi, lo, absprod, *slack)
        if not c.size:
            return None, 0, zero_misses, 0, 0, exact_zeros
        diff = np.abs((c - hi) - lo)
        subnormal = int(np.count_nonzero(absprod < smallest_normal))
        return (normalised_max(diff, absprod, u), c.size, zero_misses, subnormal,
                _beyond(diff, absprod, k, dtype, 1.0, precision, slack[0] if slack else None),
                exact_zeros)

    parts = blocks.map_blocks(fin.size, part)
    worst = [p[0] for p in parts if p[0] is not None]
    entries, zero_misses, subnormal, beyond, exact_zeros = (sum(p[i] for p in parts)
                                                            for i in range(1, 6))
    return {"error_u": max(worst) if worst else None, "entries": entries, "of": fin.size,
            "zero_misses": zero_misses, "exact_zeros": exact_zeros, "subnormal": subnormal,
            "beyond_bound": beyond}


def nonfinite(c: np.ndarray, hi: np.ndarray, exact_finite: np.ndarray, dtype: str,
              slack: np.ndarray | None = None, lo: np.ndarray | None = None) -> dict:
    """Counts of non-finite outputs, by cause.

    ``product``: entries of C that are NaN or ±inf; ``reference``: entries whose exact
    value is NaN or ±inf (only non-finite inputs make one); ``overflow``: C is ±inf where
    the exact value is finite but rounds to inf in the dtype (at least ``overflow_threshold``),
    with the same sign, so inf is the rounded result; ``spurious``: every other NaN or ±inf
    where the exact value is finite: within range, NaN, or inf of the wrong sign
    (intermediate sums overflowed, perhaps both ways, or a kernel defect). ``slack``
    (output units, per entry): how far hi + ``lo`` (a reference's low part, per entry; 0 if
    not given) may be from the exact value (the reference's own bound times |A||B|); an inf
    that the exact value may round to within it is ``overflow``.
    """
    c, hi = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (c, hi))
    fin = np.asarray(exact_finite, dtype=bool).reshape(-1)
    slack, lo = (np.zeros(1) if v is None else np.asarray(v, dtype=np.float64).reshape(-1)
                 for v in (slack, lo))
    over = overflow_threshold(dtype)

    def part(at: slice) -> tuple:
        c_, hi_, fin_ = c[at], hi[at], fin[at]
        s, lo_ = (v if v.size == 1 else v[at] for v in (slack, lo))
        bad = ~np.isfinite(c_)
        # within the slack of 0: either sign
        sign_ok = (np.sign(c_) == np.sign(hi_)) | (np.abs(hi_) <= s)
        # |hi + lo| + slack, the small parts first: hi alone may sit at float64's largest value
        # while hi + lo is the overflow threshold itself (and the sum then inf, on purpose)
        with np.errstate(over="ignore"):
            reach = np.abs(hi_) + (np.where(hi_ < 0, -lo_, lo_) + s)
        rounded_inf = fin_ & (reach >= over) & np.isinf(c_) & sign_ok
        return (np.count_nonzero(bad), np.count_nonzero(~fin_), np.count_nonzero(rounded_inf),
                np.count_nonzero(bad & fin_ & ~rounded_inf),
                np.count_nonzero(~fin_ & ~((np.isnan(c_) & np.isnan(hi_)) | (c_ == hi_))))

    parts = blocks.map_blocks(fin.size, part)
    return {name: int(sum(p[i] for p in parts))
            for i, name in enumerate(("product", "reference", "overflow", "spurious", "mismatch"))}


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


def by_magnitude(x_bits: np.ndarray, y_bits: np.ndarray, x: np.ndarray, y: np.ndarray,
                 dtype: str) -> dict:
    """Two outputs of one dtype compared entry by entry (``x`` and ``y`` their float64 values,
    output units): how many entries differ, and per binade [2^e, 2^(e+1)) of the larger |value|
    the entries that differ, the largest |difference| and the ulp there (output units). An
    entry finite on one side only counts as differing, outside every binade."""
    width = WIDTH[dtype]
    finite = np.isfinite(x) & np.isfinite(y)
    differ = (ulp_distance(x_bits, y_bits, width) > 0) & ~(np.isnan(x) & np.isnan(y))
    out = {"entries": int(x.size), "differ": int(differ.sum()),
           "nonfinite_differ": int((differ & ~finite).sum()),
           "bands": []}
    both = differ & finite
    if not both.any():
        return out
    mag = np.maximum(np.abs(x[both]), np.abs(y[both]))
    diff = np.abs(x[both] - y[both])
    steps = ulp_distance(x_bits[both], y_bits[both], width)
    e = np.frexp(mag)[1] - 1  # 2^e <= mag < 2^(e+1); zero (both zero with other signs) gives -1
    for b in np.unique(e):
        sel = e == b
        lo = 2.0 ** int(b)
        out["bands"].append({"lo": lo, "hi": 2 * lo, "ulp": ulp_of(lo, dtype),
                             "differ": int(sel.sum()),
                             "max_abs": float(diff[sel].max()), "max_ulp": int(steps[sel].max())})
    out["below"] = int((np.maximum(np.abs(x), np.abs(y))[finite] < out["bands"][0]["lo"]).sum())
    return out
