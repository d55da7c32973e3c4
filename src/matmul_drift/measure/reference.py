"""The reference product of the rounded inputs: exact for float64, twice as precise otherwise.

float64 inputs (Ozaki, Ogita, Oishi & Rump 2012, "Error-free transformations of matrix
multiplication"): each row of A and each column of B is split into slices of at most
``53 − ρ`` significant bits, with ρ = ⌈(53 + ⌈log2 K⌉)/2⌉, so that every product of two
slices, summed over K in any order (BLAS, split-K, FMA), is exact in float64. The slice
products are then added in double-double (TwoSum, Ogita–Rump–Oishi Sum2), so the result
is hi + lo with a relative error near 2^-104: at least twice the precision of float64.
The suite's generated float64 inputs (24 bits) need 2 slices each (4 GEMMs), full float64
inputs 3. Where a row or column spans more binades than 8 slices reach, or so many that
its smallest bits fall among float64's subnormals, the reference says it is not exact and
bounds what it missed (``exact``, ``bound_rel``). float32, float16 and bfloat16 inputs: one
float64 GEMM, whose products are exact and whose sum is within γ_K·2^-53·|A||B| (K·2^-29 u
of float32 at most).

Non-finite inputs follow IEEE arithmetic on the exact terms: an output is NaN when a
term is NaN (NaN, or inf × 0) or when +inf and −inf terms meet, ±inf when only one sign
of infinite term occurs. These are found with exact 0/1 indicator products.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

METHOD = "ozaki-double-double"
MAX_SLICES = 8  # per operand; each slice carries 53 − ρ bits (≥ 8 even for K = 2^36)
# Rows of A and columns of B are scaled to a maximum near 2^HEADROOM, not near 1: scaling
# down loses the bits it pushes below 2^-1074, and a slice product underflows there too: the
# high scale keeps the first away from rows spanning under 1470 binades, and the second from
# a row and a column spanning under 1970 together. Sums of K slice products stay below
# K·2^896, far from overflow.
HEADROOM = 448
SMALLEST = 2.0**-1074  # float64's smallest subnormal: its spacing below 2^-1021
F64_MAX = float.fromhex("0x1.fffffffffffffp+1023")  # float64's largest finite value
# Where terms underflowed, the reference is within about 3·|A||B| of the truth (each rounding
# moves a sum by at most the term it rounds; the slices' magnitudes add up to at most 3|x|):
# the relative bound is capped there, with room.
LOST = 8.0


@dataclass
class Reference:
    """The exact product as a double-double, on the host, in output units.

    ``hi`` + ``lo`` (float64 arrays) is the product of the rounded inputs; ``hi`` is NaN or
    ±inf where the exact result is (``finite`` False), and ±inf where it is finite but
    beyond float64's range. ``absprod`` is |A||B| over the finite terms (float64, output
    units; inf where it overflows float64). ``absprod_scaled`` and ``absexp`` (None where
    it overflows nowhere) hold it there too: |A||B| = absprod_scaled·2^absexp, with absexp an
    integer per entry (``absprod_pow2``).
    ``slices`` (A's, B's) and ``exact`` (every input bit was used, so hi + lo is exact up
    to the final double-double rounding) describe the method; ``bound_rel`` bounds
    |hi + lo − exact| / |A||B| (dimensionless) over all entries. ``slack`` (output units, per
    entry; float64 inputs the reference could not take exactly, else None) bounds
    |hi + lo − exact| entry by entry: one row beyond the split's reach leaves the others'
    bound tight, and it holds where |A||B| itself overflows float64.
    """

    hi: np.ndarray
    lo: np.ndarray
    finite: np.ndarray
    absprod: np.ndarray
    slices: tuple[int, int]
    exact: bool
    bound_rel: float
    method: str = METHOD
    slack: np.ndarray | None = None
    absprod_scaled: np.ndarray | None = None
    absexp: np.ndarray | None = None

    def describe(self, u: float) -> dict:
        """The JSON entry: method, slices, and the reference's own error bound in u."""
        return {
            "method": self.method,
            "slices": list(self.slices),
            "exact_products": self.exact,
            "error_bound_u": self.bound_rel / u,
        }

    def __getitem__(self, cut) -> Reference:
        part = lambda v: None if v is None else v[cut]  # noqa: E731
        return Reference(self.hi[cut], self.lo[cut], self.finite[cut], self.absprod[cut],
                         self.slices, self.exact, self.bound_rel, self.method,
                         part(self.slack), part(self.absprod_scaled), part(self.absexp))

    def absprod_pow2(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(|A||B|·2^-e, e) per entry, e an integer: 0, and ``absprod`` itself, except where
        |A||B| overflows float64 (output units; e is None where it overflows nowhere)."""
        if self.absexp is None:
            return self.absprod, None
        return self.absprod_scaled, self.absexp

    def slack_or_relative(self) -> np.ndarray:
        """``slack``, or where there is none ``bound_rel``·|A||B| (output units; inf where
        that overflows float64: there no finite error is called beyond the bound)."""
        if self.slack is not None:
            return self.slack
        absprod, e = self.absprod_pow2()
        if e is None:
            return np.where(np.isfinite(absprod), self.bound_rel * absprod, 0.0)
        with np.errstate(over="ignore"):
            return np.ldexp(self.bound_rel * absprod, e)


def rho(k: int) -> int:
    """ρ of Ozaki's split for a reduction of length K: slices keep 53 − ρ bits."""
    return math.ceil((53 + math.ceil(math.log2(max(k, 1)))) / 2)


def _abs_max(x, dim: int):
    """max|x| per row (dim=-1) or column (dim=-2): max(amax, −amin), two reductions that
    read x in place, cheaper than x.abs() first."""
    return torch.maximum(x.amax(dim=dim, keepdim=True), -x.amin(dim=dim, keepdim=True))


def _pow2_scale(x, dim: int, mu=None):
    """Per row (dim=-1) or column (dim=-2) exponent e with max|x| < 2^e (0 where all zero)."""
    mu = _abs_max(x, dim) if mu is None else mu
    e = torch.frexp(mu).exponent
    return torch.where(mu > 0, e, torch.zeros_like(e))


def _scratch(ws: dict | None, name: str, like):
    """``ws``'s tensor ``name`` of ``like``'s shape and dtype, made the first time it is asked
    for (None without ``ws``): B's blocks reuse their temporaries, whose fresh pages cost more
    than the arithmetic on them (the seed: 0.8-1.4 M page faults a float64 reference)."""
    if ws is None:
        return None
    # the last block may be narrower: one set at a time
    if name not in ws or ws[name].shape != like.shape:
        ws[name] = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    return ws[name]


def _split(x, dim: int, r: int, ws: dict | None = None) -> tuple[list, object, float]:
    """Ozaki slices of x (already scaled per row/column) and the remainder, and the exponent
    of the smallest step any slice's entries are multiples of (σ·2^-53 of the smallest σ
    used; an integer, or inf without slices). ``ws``: _scratch's tensors, which they are made in."""
    out, rest, step = [], x, math.inf
    one = torch.ones((), dtype=x.dtype, device=x.device)
    while len(out) < MAX_SLICES and rest.numel():
        mu = _abs_max(rest, dim)
        if not bool((mu > 0).any()):
            break
        e = _pow2_scale(rest, dim, mu) + r
        sigma = torch.ldexp(one, e.to(x.dtype))
        # the leading 53 − ρ bits
        part = torch.add(rest, sigma, out=_scratch(ws, f"slice{len(out)}", rest)).sub_(sigma)
        out.append(part)
        # an exponent: 2^step may be below float64's range
        step = min(step, int(e[mu > 0].min()) - 53)
        rest = (torch.sub(rest, part, out=_scratch(ws, "rest", rest)) if rest is x
                else rest.sub_(part))  # exact; x is kept
    return out, rest, step


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _ldexp(x, e, out=None):
    """x · 2^e for an integer tensor e, in steps of at most 2^±1000 so no factor overflows;
    into ``out`` where given (x's shape)."""
    e = e.to(torch.float64)  # e is per row or column: small beside x
    for _ in range(4):  # |e| < 3100 always: exponents of two float64 row maxima less 2·HEADROOM
        step = e.clamp(-1000, 1000)
        x = torch.mul(x, torch.exp2(step), out=out)
        e = e - step
        if not bool((e != 0).any()):
            break
    return x


def _pow2_scaled(xf, dim: int, out=None) -> tuple:
    """(xf·2^-e, e): xf (finite, float64) scaled per row (dim=-1) or column (dim=-2) by a
    power of two to a maximum in [2^(HEADROOM-1), 2^HEADROOM), and e (integers, one per row
    or column). Exact, but for entries scaled down among float64's subnormals. Into ``out``
    where given."""
    e = _pow2_scale(xf, dim) - HEADROOM
    return _ldexp(xf, -e, out), e


def _out_exponent(ea, eb, one_d: bool):
    """e_i + e_j in the output's shape from A's row and B's column exponents: (…, M, 1) +
    (…, 1, N), or for a 1-D A (``one_d``), (1,) + (N,)."""
    return ea + (eb.squeeze(-2) if one_d else eb)


def _overflow_pow2(product, absprod, a_s, b_s, scale) -> tuple | None:
    """Where ``absprod`` (|A||B| on the device, float64, output units) overflows float64:
    (|A||B|·2^-e, e) on the device, from ``a_s`` and ``b_s`` (A's rows and B's columns scaled
    by 2^-e_i and 2^-e_j, as _pow2_scaled does: the product of their absolute values is at most
    K·2^896, finite) and ``scale`` (e_i + e_j in the output's shape); ``absprod`` itself and
    e = 0 (int16) elsewhere, so entries in range are unchanged bit for bit. None where
    ``absprod`` overflows nowhere. Scaling rounded only entries 2^1074 below their row's or
    column's maximum: 2K·2^-627 at most, in a sum of at least 2^-128."""
    over = torch.isinf(absprod)
    if not bool(over.any()):
        return None
    absexp = torch.where(over, torch.broadcast_to(scale, over.shape), 0).to(torch.int16)
    return torch.where(over, product(a_s.abs(), b_s.abs()), absprod), absexp


def abs_product_pow2(product, a, b) -> tuple[np.ndarray, np.ndarray | None]:
    """(|A||B|·2^-e, e) on the host, as Reference.absprod_pow2() gives it, without the exact
    reference (fixrun's lean mode): one float64 product of |A| and |B| (``product`` as
    exact_product takes it; output units), and only where that overflows float64 one more of
    |A| and |B| scaled per row and column by powers of two, as the reference scales its
    operands (their finite parts; e None where nothing overflows). Entries in range are the
    first product's, bit for bit, with e = 0."""
    a_abs, b_abs = a.abs().double(), b.abs().double()
    absprod = product(a_abs, b_abs)
    if all_finite(absprod) or not bool(torch.isinf(absprod).any()):  # NaN alone: non-finite inputs
        return absprod.cpu().numpy(), None
    # in place: the first product is made
    a_s, ea = _pow2_scaled(a_abs.nan_to_num_(0.0, 0.0, 0.0), -1)
    del a_abs
    b_s, eb = _pow2_scaled(b_abs.nan_to_num_(0.0, 0.0, 0.0), -2)
    del b_abs
    scaled, absexp = _overflow_pow2(product, absprod, a_s, b_s, _out_exponent(ea, eb, a.dim() == 1))
    return scaled.cpu().numpy(), absexp.cpu().numpy()


# B's float64 bytes per block of columns. Small blocks reuse freed heap memory; blocks of
# 256 MB are served fresh pages by the kernel each time, which is slower.
CHUNK_BYTES = 8 << 20


def exact_product(product, a, b) -> Reference:
    """The reference for ``product(a, b)`` (a callable doing the case's op on two tensors of
    one dtype; a (…, M, K) or (K,), b (…, K, N)), computed in float64 on a's device.

    float64 inputs get the Ozaki split (below). Narrower inputs get one float64 GEMM: their
    products are exact in float64 and the sum is within γ_K·2^-53·|A||B| of the truth, at
    least twice the precision of the output (K·2^-29 u for float32) at a fifth of the cost.

    Columns of B are exact independently (each has its own scale), so a wide B is done in
    blocks of columns to bound memory (the seed's B is 4096 × 51000: 1.6 GB per float64 copy).
    """
    if a.dtype != b.dtype:
        raise ValueError(f"operands differ in dtype: {a.dtype} and {b.dtype}")
    if str(a.dtype) != "torch.float64":
        return _float64_gemm(product, a, b)
    r = rho(int(a.shape[-1]))
    sa = _sliced(a, -1, r)  # once: every block of B's columns meets the same rows of A
    n, per_col = int(b.shape[-1]), 8 * max(1, b.numel() // max(1, int(b.shape[-1])))
    step = max(1, CHUNK_BYTES // per_col)
    if n > step:
        ws: dict = {}  # one block's temporaries, made once and filled again by every block
        parts = [_exact_block(product, sa, _sliced(b[..., j:j + step], -2, r, ws))
                 for j in range(0, n, step)]
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts], axis=-1)  # noqa: E731
        slack = None if all(p.slack is None for p in parts) else np.concatenate(
            [p.slack_or_relative() for p in parts], axis=-1)
        over = any(p.absexp is not None for p in parts)
        scaled = (np.concatenate([p.absprod_pow2()[0] for p in parts], axis=-1),
                  np.concatenate([np.zeros(p.absprod.shape, np.int16) if p.absexp is None
                                  else p.absexp for p in parts], axis=-1)) if over else (None, None)
        return Reference(cat("hi"), cat("lo"), cat("finite"), cat("absprod"),
                         tuple(max(p.slices[i] for p in parts) for i in (0, 1)),
                         all(p.exact for p in parts), max(p.bound_rel for p in parts), slack=slack,
                         absprod_scaled=scaled[0], absexp=scaled[1])
    return _exact_block(product, sa, _sliced(b, -2, r))


def all_finite(t) -> bool:
    """Whether no entry of t is NaN or ±inf: min and max propagate both, in one fast pass
    (torch.isfinite over the seed's 209 M entries takes ten times as long)."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def _finite_parts(a, b):
    """a and b in float64 with NaN/±inf set to 0 (the finite terms, which the product is
    built from), and whether there was nothing to zero."""
    clean = all_finite(a) and all_finite(b)
    af, bf = a.double(), b.double()  # copies: a and b are narrower than float64 here
    if not clean:  # in place: memory.bytes_needed counts one float64 copy of each
        af.nan_to_num_(0.0, 0.0, 0.0)
        bf.nan_to_num_(0.0, 0.0, 0.0)
    return af, bf, clean


def _float64_gemm(product, a, b) -> Reference:
    """One float64 GEMM of inputs narrower than float64, with IEEE's NaN/inf rules applied."""
    af, bf, clean = _finite_parts(a, b)
    hi = product(af, bf)
    absprod = product(af.abs_(), bf.abs_())  # in place: af and bf are not needed after
    del af, bf
    finite = torch.ones_like(hi, dtype=torch.bool)
    if not clean:
        hi, finite = _nonfinite(product, a, b, hi)
    k = int(a.shape[-1])
    bound = k * 2.0**-53 / (1 - k * 2.0**-53)
    return Reference(hi.cpu().numpy(), np.zeros(tuple(hi.shape)), finite.cpu().numpy(),
                     absprod.cpu().numpy(), (0, 0), False, bound, "float64-gemm")


@dataclass
class _Sliced:
    """One float64 operand made ready for Ozaki's product: ``x64`` as given, ``absf`` the
    absolute value of its finite part, ``scaled`` that finite part times 2^-e per row or
    column (max near 2^HEADROOM), ``slices`` and ``rest`` of ``scaled`` (``whole``: rest is all
    zero, and None), ``clean`` whether it had no NaN/inf, ``lost`` whether scaling rounded an
    entry, and ``step`` the exponent of the smallest power of two every slice entry is a
    multiple of."""

    x64: object
    absf: object
    scaled: object
    e: object
    slices: list
    rest: object
    whole: bool
    clean: bool
    lost: bool = False
    step: float = math.inf  # an exponent


def _sliced(x, dim: int, r: int, ws: dict | None = None) -> _Sliced:
    """x made ready for Ozaki's product; its scaled copy, |x| and slices in ``ws``'s tensors
    where given (_scratch), so valid until the next call with the same ``ws``."""
    x64 = x.double()
    clean = all_finite(x64)
    xf = x64 if clean else torch.where(torch.isfinite(x64), x64, 0.0)
    # Rows of A and columns of B scaled to a maximum in [2^(HEADROOM-1), 2^HEADROOM) by powers
    # of two, so neither Ozaki's σ nor a slice product can overflow; undone on the result.
    scaled, e = _pow2_scaled(xf, dim, _scratch(ws, "scaled", xf))
    # scaling down rounds the entries it pushes among the subnormals: rows beyond 2^HEADROOM only
    lost = bool((e > 0).any()) and bool((_ldexp(scaled, e) != xf).any())
    absf = torch.abs(xf, out=_scratch(ws, "absf", xf))
    del xf  # before the slices: with NaN or inf in x, a copy of it (memory.bytes_needed)
    slices, rest, step = _split(scaled, dim, r, ws)
    whole = not bool((rest != 0).any())
    return _Sliced(x64, absf, scaled, e, slices, None if whole else rest, whole, clean, lost, step)


def _exact_block(product, a: _Sliced, b: _Sliced) -> Reference:
    a_s, b_s, sa, sb = a.scaled, b.scaled, a.slices, b.slices
    absprod = product(a.absf, b.absf)
    hi = product(a_s, b_s) * 0.0 if not (sa and sb) else None  # A or B all zero
    lo = None if hi is None else torch.zeros_like(hi)
    for x in sa:  # largest slices first
        for y in sb:
            p = product(x, y)  # exact: every partial sum fits in 53 bits
            if hi is None:
                hi, lo = p, torch.zeros_like(p)
            else:
                hi, err = _two_sum(hi, p)
                lo = lo + err
    hi, lo = _two_sum(hi, lo)
    exact = a.whole and b.whole
    bound = 2.0**-104 * (len(sa) * len(sb) + 2)  # Sum2 over the slice products
    under = a.step + b.step < -1074
    slack = None
    scale = _out_exponent(a.e, b.e, a.x64.dim() == 1)
    # |A||B| beyond float64: kept as |A||B|·2^-(e_i + e_j), so its entries are judged too
    pow2 = _overflow_pow2(product, absprod, a_s, b_s, scale)  # on the device, for the reach below
    absprod_scaled, absexp = ((None, None) if pow2 is None
                              else (pow2[0].cpu().numpy(), pow2[1].cpu().numpy()))
    if not exact or a.lost or b.lost or under:
        rel, err = _left_out(product, a, b, absprod, under, bound)
        bound += rel
        slack = (_ldexp(err, scale) + 2 * SMALLEST).cpu().numpy()  # + the rounding of that scaling
        exact = False

    scaled_hi = hi
    hi, lo = _ldexp(hi, scale), _ldexp(lo, scale)
    # Sum2 leaves hi + lo within (n·2^-50)²·|A||B| of the n slice products' exact sum (their
    # magnitudes add up to at most 9|A||B|): where that reaches float64's largest value, hi may
    # sit on the wrong side of the overflow threshold, inf or the largest value (0 when n = 0);
    # from |A||B|·2^-e where |A||B| overflows (inf there would call every such entry near)
    n = len(sa) * len(sb)
    reach = ((n * 2.0**-50) ** 2 * absprod if pow2 is None
             else _ldexp((n * 2.0**-50) ** 2 * pow2[0], pow2[1]))
    near = torch.isfinite(scaled_hi) & (hi.abs() + reach >= F64_MAX)
    if bool(near.any()):
        hi, lo = _resum_near_overflow(product, a, b, scale, near, hi, lo)
    # before the IEEE indicators below: each as large as the output
    del scaled_hi, near, reach, pow2
    lo = torch.where(torch.isfinite(hi), lo, 0.0)  # beyond float64's range: hi is ±inf alone
    finite = torch.ones_like(hi, dtype=torch.bool)
    if not (a.clean and b.clean):
        hi, finite = _nonfinite(product, a.x64, b.x64, hi)
        lo = torch.where(finite, lo, 0.0)
    absprod = absprod.cpu().numpy()
    tiny = absprod[absprod > 0]
    # lo lands among the subnormals: absolute steps 2^-1074
    if tiny.size and tiny.min() < 2.0**-960:
        bound += 4 * SMALLEST / float(tiny.min())
    return Reference(hi.cpu().numpy(), lo.cpu().numpy(), finite.cpu().numpy(), absprod,
                     (len(sa), len(sb)), exact, bound, slack=slack, absprod_scaled=absprod_scaled,
                     absexp=absexp)


def _resum_near_overflow(product, a: _Sliced, b: _Sliced, scale, over, hi, lo) -> tuple:
    """hi and lo again, exactly rounded, at the entries ``over`` that scaled back to ±inf
    or near float64's largest value. The sum of lo's rounding errors can move hi + lo onto
    the midpoint between float64's largest value and 2^1024, and hi to inf, where the
    slices' exact sum rounds to the largest value (an inf the kernel then made would read
    as a correct one); or just below the midpoint, and hi to the largest value, where the
    exact sum rounds to inf (a kernel's correct inf would read as a spurious one). math.fsum
    rounds the exact sum of each entry's slice products once; scaling by a power of two
    keeps where it rounds, so ±inf is left only where the slices' sum rounds to it."""
    terms = torch.stack([product(x, y)[over] for x in a.slices for y in b.slices],
                        -1).cpu().tolist()
    at = over.nonzero(as_tuple=True)
    shift = torch.broadcast_to(scale, over.shape)[over].cpu().tolist()
    fixed_hi, fixed_lo = [], []
    for row, e in zip(terms, shift):
        top = math.fsum(row)
        rest = math.fsum(row + [-top])
        try:
            fixed_hi.append(math.ldexp(top, int(e)))
            fixed_lo.append(math.ldexp(rest, int(e)))
        except OverflowError:
            fixed_hi.append(math.copysign(math.inf, top))
            fixed_lo.append(0.0)
    hi, lo = hi.clone(), lo.clone()
    hi[at] = torch.tensor(fixed_hi, dtype=hi.dtype, device=hi.device)
    lo[at] = torch.tensor(fixed_lo, dtype=lo.dtype, device=lo.device)
    return hi, lo


def _left_out(product, a: _Sliced, b: _Sliced, absprod, under: bool, base: float) -> tuple:
    """What hi + lo may miss of the exact product: relative to |A||B| (its largest over the
    entries, at most LOST), and per entry in the scaled domain (a tensor, with ``base``·|A||B|,
    the double-double sum's own error, added): the rests R the slices left (MAX_SLICES ran out), as
    |R_a||B| + |A||R_b| + |R_a||R_b|; and below 2^-1021, where float64 keeps only multiples
    of 2^-1074, entries the scaling rounded (``lost``) and slice products with their sums
    (``under``: two slices' steps multiply to less than 2^-1074), each off by at most 2^-1075.
    Computed in float64 and rounded up: K·2^-52 relative, K·2^-1074 absolute."""
    a_s, b_s, k = a.scaled.abs(), b.scaled.abs(), int(a.scaled.shape[-1])
    whole = product(a_s, b_s)
    # at most |A||B| (scaled), however whole rounded
    floor = whole * (1 - (k + 2) * 2.0**-52) - k * SMALLEST
    err = k * SMALLEST * (len(a.slices) * len(b.slices) * under
                          + 2.0 ** (HEADROOM + 1) * (a.lost + b.lost) + 3)
    if not (a.whole and b.whole):
        # whole: no rest kept
        ra, rb = (torch.zeros_like(x.scaled) if x.whole else x.rest.abs() for x in (a, b))
        err = err + ((product(ra, b_s) + product(a_s, rb) + product(ra, rb))
                     * (1 + (k + 2) * 2.0**-52))
    # |A||B| = 0: an exact zero
    some = (whole > 0) | (torch.as_tensor(absprod, device=whole.device) > 0)
    rel = torch.where(floor > 0, err / torch.where(floor > 0, floor, 1.0), LOST)
    worst = min(float(torch.where(some, rel, 0.0).max()), LOST) if rel.numel() else 0.0
    return worst, err + base * whole * (1 + (k + 2) * 2.0**-52)


def _nonfinite(product, a, b, hi):
    """hi with NaN/±inf where the exact result is non-finite, and the mask of finite results
    (a and b in any floating dtype)."""
    every = lambda t: torch.ones_like(t, dtype=torch.bool)  # noqa: E731
    pinf, ninf = lambda t: t == math.inf, lambda t: t == -math.inf  # noqa: E731
    pos, neg, zero = lambda t: t > 0, lambda t: t < 0, lambda t: t == 0  # noqa: E731

    def some(*pairs):
        """Where a product of the 0/1 indicators of a and b that a pair of tests makes is non-zero
        (sums of 0/1 terms are exact in float64). One pair's indicators at a time: a dozen of
        each operand at once would go beyond what memory.bytes_needed counts."""
        total = None
        for test_a, test_b in pairs:
            p = product(test_a(a).to(torch.float64), test_b(b).to(torch.float64))
            total = p if total is None else total.add_(p)
            del p  # not held while the next is made
        return total > 0

    is_nan = some((torch.isnan, every), (every, torch.isnan), (torch.isinf, zero),
                  (zero, torch.isinf))
    plus = some((pinf, pos), (ninf, neg), (pos, pinf), (neg, ninf))
    minus = some((pinf, neg), (ninf, pos), (pos, ninf), (neg, pinf))
    is_nan |= plus & minus
    hi = torch.where(plus, math.inf, hi)
    hi = torch.where(minus, -math.inf, hi)
    hi = torch.where(is_nan, math.nan, hi)
    return hi, ~(is_nan | plus | minus)
