"""`matmul-drift explain` on generated files, checked against this test's own arithmetic.

Shapes (0 and 1 included), dtypes, magnitudes up to each dtype's largest value, NaN and inf
positions, C or Fortran order, .npy or .pt. Every run must end with exit 0, 1 or 2 and no
traceback; with --json it must print strict RFC 8259 JSON, whose numbers equal what this
test computes with exact rationals (``fractions``) and plain Python/numpy from the rounded
inputs and torch's own products of them, never with the project's code.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

from matmul_drift.cli import main as cli

U = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
F64_MAX = Fraction(float(np.finfo(np.float64).max))
FMT = {"float64": ("<d", "<Q", 64), "float32": ("<f", "<I", 32)}


def _strict(text: str):
    def bad(token):
        raise ValueError(f"not RFC 8259: {token}")

    return json.loads(text, parse_constant=bad)


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(args)  # an exception escaping here fails the test: that is a traceback
    return rc, out.getvalue(), err.getvalue()


def _bits(x: float, dtype: str) -> int:
    """The bit pattern of x in dtype, by struct (float16 via 'e', bfloat16 as float32's top half)."""
    if dtype == "float16":
        return struct.unpack("<H", struct.pack("<e", x))[0]
    if dtype == "bfloat16":
        return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
    f, i, _ = FMT[dtype]
    return struct.unpack(i, struct.pack(f, x))[0]


def _order(x: float, dtype: str) -> int:
    width = 64 if dtype == "float64" else 32 if dtype == "float32" else 16
    b = _bits(x, dtype)
    sign = 1 << (width - 1)
    return -(b & ~sign) if b & sign else b


def _exact(a_row, b_col):
    """IEEE semantics on exact terms: (value as Fraction | None, nonfinite as float | None)."""
    terms_nan = pos = neg = False
    total = Fraction(0)
    for x, y in zip(a_row, b_col):
        if math.isfinite(x) and math.isfinite(y):
            total += Fraction(x) * Fraction(y)
            continue
        t = x * y  # a non-finite factor: Python's float gives IEEE's inf·0 = nan and signs
        if math.isnan(t):
            terms_nan = True
        elif t > 0:
            pos = True
        else:
            neg = True
    if terms_nan or (pos and neg):
        return None, math.nan
    if pos or neg:
        return None, math.inf if pos else -math.inf
    return total, None


def _explain_files(tmp_path, a: np.ndarray, b: np.ndarray, dtype: str) -> tuple[dict, str]:
    """`explain --json` of A and B saved as .npy files: (its report, read strictly; its stderr);
    asserts exit status 0."""
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc, out, err = _run(["explain", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--dtype", dtype, "--json"])
    assert rc == 0, err
    return _strict(out), err


def _independent(a, b, c, dtype):
    """error_u, its coverage and the non-finite counts of C = a @ b, from first principles."""
    u, big = U[dtype], float(torch.finfo(getattr(torch, dtype)).max)
    tiny = Fraction(float(torch.finfo(getattr(torch, dtype)).tiny))  # smallest normal
    eta = tiny * Fraction(u)  # half the smallest subnormal step
    k = a.shape[-1]
    gamma = None if k * u >= 1 else Fraction(k) * Fraction(u) / (1 - Fraction(k) * Fraction(u))
    A = a.double().reshape(-1, a.shape[-1]).tolist()
    B = b.double().tolist()
    C = c.double().reshape(-1, b.shape[1]).tolist()
    worst, covered, zero_misses, exact_zeros, subnormal, beyond = None, 0, 0, 0, 0, 0
    nf = {"a": int((~torch.isfinite(a)).sum()), "b": int((~torch.isfinite(b)).sum()), "product": 0,
          "reference": 0, "overflow": 0, "spurious": 0, "mismatch": 0}
    for i, row in enumerate(A):
        for j in range(len(B[0])):
            col = [B[q][j] for q in range(len(B))]
            val, special = _exact(row, col)
            absprod = sum((abs(Fraction(x) * Fraction(y)) for x, y in zip(row, col)
                           if math.isfinite(x) and math.isfinite(y)), Fraction(0))
            cij = C[i][j]
            nf["product"] += not math.isfinite(cij)
            if val is None:
                nf["reference"] += 1
                nf["mismatch"] += not (math.isnan(cij) and math.isnan(special) or cij == special)
                continue
            rounded_inf = math.isinf(cij) and abs(val) > Fraction(big) and (cij > 0) == (val > 0)
            nf["overflow"] += rounded_inf
            nf["spurious"] += (not math.isfinite(cij)) and not rounded_inf
            if not math.isfinite(cij) or abs(val) > F64_MAX:
                continue
            if absprod == 0:
                zero_misses += cij != 0
                exact_zeros += cij == 0
                continue
            covered += 1  # |A||B| beyond float64 too: the exact value and C are finite
            subnormal += absprod < tiny  # every term and partial sum below the normal range
            if gamma is not None:
                beyond += abs(Fraction(cij) - val) > gamma * absprod + (k + 1) * eta
            e = float(abs(Fraction(cij) - val) / (Fraction(u) * absprod))
            worst = e if worst is None else max(worst, e)
    return worst, {"entries": covered, "of": len(A) * len(B[0]), "zero_misses": zero_misses, "exact_zeros": exact_zeros,
                   "subnormal": subnormal, "beyond_bound": beyond}, nf


def _drift(x, y, absprod_src, dtype):
    """max_ulp, frac_differ, max_u, sign_changes, nonfinite_differ of two products, by hand."""
    u = U[dtype]
    xs, ys = x.double().flatten().tolist(), y.double().flatten().tolist()
    a_rows, b_cols = absprod_src
    max_ulp, differ, nonfin, signs, max_u, covered = 0, 0, 0, 0, 0.0, 0
    for idx, (p, q) in enumerate(zip(xs, ys)):
        same = (math.isnan(p) and math.isnan(q)) or (_order(p, dtype) == _order(q, dtype))
        differ += not same
        if not (math.isfinite(p) and math.isfinite(q)):
            nonfin += not same
            continue
        max_ulp = max(max_ulp, abs(_order(p, dtype) - _order(q, dtype)))
        signs += p != 0 and q != 0 and (p < 0) != (q < 0)
        row, col = a_rows[idx], b_cols[idx]
        absprod = sum((abs(Fraction(s) * Fraction(t)) for s, t in zip(row, col) if math.isfinite(s) and math.isfinite(t)),
                      Fraction(0))
        if absprod > 0:  # |A||B| beyond float64 too, as error_u's entries
            covered += 1
            max_u = max(max_u, float(abs(Fraction(p) - Fraction(q)) / (Fraction(u) * absprod)))
    return {"max_ulp": max_ulp, "frac_differ": differ / len(xs) if xs else 0.0, "max_u": max_u,
            "sign_changes": signs, "nonfinite_differ": nonfin, "max_u_entries": covered}


def _close(got, want, what, slack=0.0):
    if want is None:
        assert got is None, what
    else:
        assert got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9 + slack), (what, got, want)


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from(list(U)))
    m, k, n = (draw(st.sampled_from([0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])) for _ in range(3))
    one_d = draw(st.booleans()) and m == 1
    big = float(torch.finfo(getattr(torch, dtype)).max)
    top = math.frexp(big)[1]
    # from tiny to products beyond the dtype's max (2^(top/2) squared is about the max)
    exponents = st.sampled_from([-40, -12, 0, 4, top // 4, top // 2 - 3, top // 2, top // 2 + 1])
    scale_a, scale_b = 2.0 ** draw(exponents), 2.0 ** draw(exponents)
    seed = draw(st.integers(0, 2**32 - 1))
    g = np.random.default_rng(seed)
    a = (g.standard_normal((m, k)) * scale_a).clip(-big, big)
    b = (g.standard_normal((k, n)) * scale_b).clip(-big, big)
    for arr in (a, b):
        if arr.size and draw(st.integers(0, 3)) == 0:
            flat = arr.reshape(-1)
            for _ in range(draw(st.integers(1, 3))):
                flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    return {
        "dtype": dtype, "a": a[0] if one_d else a, "b": b,
        "order": draw(st.sampled_from(["C", "F"])), "suffix": draw(st.sampled_from([".npy", ".pt"])),
        "store": draw(st.sampled_from(["float64", "float32"])),
    }


def _save(path, arr, p):
    with np.errstate(over="ignore"):  # float64 beyond float32's range is stored as inf, on purpose
        arr = np.asarray(arr, dtype=p["store"])
    arr = np.asfortranarray(arr) if p["order"] == "F" else np.ascontiguousarray(arr)
    if p["suffix"] == ".npy":
        np.save(path, arr)
    else:
        torch.save(torch.from_numpy(arr), path)  # a Fortran array is a transposed view in torch


def _nearest(x: float, dtype) -> float:
    """``x`` rounded to ``dtype`` once, to nearest with ties to even, by exact comparison:
    torch's own conversion goes through float32 on the CPU, which can round twice."""
    if not math.isfinite(x):
        return x
    t = torch.tensor(x, dtype=torch.float64).to(dtype)  # within an ulp of the answer
    up, down = (torch.nextafter(t, torch.tensor(s, dtype=dtype)) for s in (math.inf, -math.inf))
    cands = [float(c) for c in (t, up, down)]
    big = float(torch.finfo(dtype).max)
    half_ulp = (Fraction(big) - Fraction(float(torch.nextafter(torch.tensor(big, dtype=dtype),
                                                                torch.tensor(0.0, dtype=dtype))))) / 2
    if abs(Fraction(x)) >= Fraction(big) + half_ulp:
        return math.copysign(math.inf, x)  # beyond the largest value by half an ulp or more
    finite = [c for c in cands if math.isfinite(c)]
    best = min(abs(Fraction(c) - Fraction(x)) for c in finite)
    tied = [c for c in finite if abs(Fraction(c) - Fraction(x)) == best]
    even = [c for c in tied if not int(torch.tensor(c, dtype=dtype).view(torch.int16)) & 1]
    return (even or tied)[0]


def _like_file(path, dtype):
    """The file's values in ``dtype``, each rounded once to nearest (as explain rounds them),
    with its strides kept (as explain keeps them)."""
    t = torch.from_numpy(np.load(path)) if path.suffix == ".npy" else torch.load(path, weights_only=True)
    dt = getattr(torch, dtype)
    out = torch.empty_strided(t.shape, t.stride(), dtype=dt)
    if dt not in (torch.float16, torch.bfloat16) or t.dtype != torch.float64:
        return out.copy_(t)  # float32 and from float32: rounded once
    flat = [_nearest(float(x), dt) for x in t.double().reshape(-1).tolist()]
    return out.copy_(torch.tensor(flat, dtype=torch.float64).reshape(t.shape).to(dt))  # exact now


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=problems())
# found by this test: the exact value (about 6e38) is beyond bfloat16's range and the partial
# sums overflow both ways, so the kernel's answer may be NaN, not the rounded inf
@example(p={"dtype": "bfloat16", "order": "C", "suffix": ".npy", "store": "float64",
            "a": np.array([[float.fromhex(x) for x in ("0x1.61e0d28bbb3a1p+63", "0x1.a4ab22204681fp+64",
                                                     "0x1.525e18ce5fc0ap+63")]]),
            "b": np.array([[float.fromhex(x)] for x in ("-0x1.4d9bb65b49607p+65", "0x1.cf8acddd349f3p+64",
                                                      "0x1.c9166a7847147p+63")])})
# found by this test: b[6] = -0x1.b75fff3aaef85p-13 is -0x1.b74p-13 in float16, rounded once as
# explain rounds it; torch's conversion through float32 makes it -0x1.b78p-13
@example(p={"dtype": "float16", "order": "C", "suffix": ".npy", "store": "float64",
            "a": np.array([[float.fromhex("0x1.0p-12")] * 9]),
            "b": np.array([[float.fromhex(x)] for x in ("0x1.089ed9db860a8p-11", "0x1.4211ac7052629p-12",
                                                      "0x1.97658da682899p-15", "0x1.e6108e47f89e3p-13",
                                                      "-0x1.dbfbf4fa08816p-16", "0x1.1dc3eb3f29efbp-14",
                                                      "-0x1.b75fff3aaef85p-13", "-0x1.9e3d81c72dacdp-15",
                                                      "0x1.8c53e42bd0fe0p-12")])})
def test_explain_matches_an_independent_computation(p, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    pa, pb = d / f"a{p['suffix']}", d / f"b{p['suffix']}"
    _save(pa, p["a"], p)
    _save(pb, p["b"], p)
    a1d = np.ndim(p["a"]) == 1
    m = 1 if a1d else p["a"].shape[0]
    k, n = p["b"].shape
    args = ["explain", "--a", str(pa), "--b", str(pb), "--dtype", p["dtype"], "--json"]
    if n > 1:
        args += ["--slice-n", str(n - 1)]
    if m > 1 and not a1d:
        args += ["--slice-m", "1"]
    note(f"a={[float(x).hex() for x in np.ravel(p['a'])]} b={[float(x).hex() for x in np.ravel(p['b'])]}")
    rc, out, err = _run(args)
    event(f"exit {rc}")
    assert rc in (0, 1, 2), err
    assert "Traceback" not in err and "Warning" not in err, err
    if 0 in (m, k, n):
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "empty" in err, err
        return
    assert rc in (0, 1), err
    r = _strict(out)
    event(f"verdict {r['verdict']['kind']}")

    dtype = p["dtype"]
    a, b = _like_file(pa, dtype), _like_file(pb, dtype)
    c = a @ b
    want_err, want_cover, want_nf = _independent(a, b, c, dtype)
    # within what the reference itself may be off (0 for float64's exact one)
    _close(r["error_u"], want_err, "error_u", slack=2 * r["reference"]["error_bound_u"])
    assert r["error_entries"] == want_cover
    assert r["nonfinite"] == want_nf
    u = U[dtype]
    _close(r["gamma_k_u"], None if k * u >= 1 else k / (1 - k * u), "gamma_k_u")
    assert r["layout"]["a"]["strides"] == list(a.stride()) and r["layout"]["b"]["strides"] == list(b.stride())

    rows = a.double().reshape(-1, k).tolist()
    cols = b.double().t().tolist()
    if n > 1:
        y = a @ b[:, : n - 1]
        cut = c[..., : n - 1]
        src = ([rows[i] for i in range(m) for _ in range(n - 1)], [cols[j] for _ in range(m) for j in range(n - 1)])
        want = _drift(cut, y, src, dtype)
        got = r["slice_n"]
        for key, v in want.items():
            _close(float(got[key]), float(v), f"slice_n.{key}")
    if m > 1 and not a1d:
        y = a[:1] @ b
        src = ([rows[0]] * n, cols)
        want = _drift(c[:1], y, src, dtype)
        for key, v in want.items():
            _close(float(r["slice_m"][key]), float(v), f"slice_m.{key}")

    # exit 1 exactly when some finite entry breaks the bound; CPU kernels never should
    defect = want_cover["beyond_bound"] > 0 or want_cover["zero_misses"] > 0
    assert (rc == 1) == (r["verdict"]["kind"] == "defect")
    assert not defect and rc == 0, r["verdict"]["text"]
    if want_nf["a"] or want_nf["b"]:
        assert r["verdict"]["kind"] == "non-finite inputs"
    if want_nf["a"] or want_nf["b"] or want_nf["product"]:
        assert r["verdict"]["kind"] not in ("bit-identical",)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_overflow_is_named_and_json_stays_valid(tmp_path, dtype):
    big = float(torch.finfo(getattr(torch, dtype)).max)
    a = np.full((2, 4), math.sqrt(big), dtype=np.float32)  # each term ≈ max: the sum of 4 is beyond it
    r, err = _explain_files(tmp_path, a, a.T.copy(), dtype)
    assert "Traceback" not in err and "RuntimeWarning" not in err, err
    assert r["verdict"]["kind"] == "overflow"
    assert r["nonfinite"]["overflow"] == 4 and r["error_u"] is None and "error_u" in r["nulls"]


def test_subnormal_counts_entries_whose_terms_all_lie_below_the_normal_range(tmp_path):
    """`subnormal` explains an error_u beyond γ_K: only where |A||B| is below the smallest
    normal can the absolute rounding there, (K+1)·η, exceed u·|A||B|. An exact zero from
    cancelling 1 and −1 had no rounding at all, yet was once called 'below float16's normal
    range, where rounding is absolute'."""
    t = 2.0**-14  # float16's smallest normal
    a = np.array([[1.0, -1.0],  # an exact zero from cancellation, |A||B| = 2: not counted
                  [0.0, 0.0],  # an exact zero from zero terms: |A||B| = 0, not covered at all
                  [t / 16, 0.0],  # a true subnormal result of a subnormal term: counted
                  [t / 16, -t / 16],  # a zero from cancelling subnormal terms: counted
                  [2.0**-4, -(2.0**-4 - 2.0**-15)]])  # subnormal 2^-15 from cancelling 2^-4: not counted
    b = np.array([[1.0], [1.0]])
    r, _ = _explain_files(tmp_path, a, b, "float16")
    ta, tb = torch.from_numpy(a).half(), torch.from_numpy(b).half()
    _, cover, _ = _independent(ta, tb, ta @ tb, "float16")
    assert r["error_entries"] == cover
    assert (cover["entries"], cover["subnormal"]) == (4, 2)
    assert "2 of them with Σ|a·b| below float16's normal range" in r["verdict"]["text"]


@pytest.mark.parametrize("zero_rows", [5, 2])
def test_outputs_whose_every_term_is_zero_are_counted_exact(tmp_path, zero_rows):
    """An all-zero A gives exactly 0 everywhere, yet the verdict said 'no entry has a finite
    error (over 0 of 15 entries)', as if something were wrong. Now it counts those entries
    exact; with only some rows zero, it counts them beside error_u's coverage."""
    a = np.ones((5, 4), dtype=np.float32)
    a[:zero_rows] = 0.0
    a[:zero_rows:2] = -0.0  # -0.0 · 1 is a zero term too
    b = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    r, _ = _explain_files(tmp_path, a, b, "float32")
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    _, cover, _ = _independent(ta, tb, ta @ tb, "float32")
    assert r["error_entries"] == cover and cover["exact_zeros"] == 3 * zero_rows
    text = r["verdict"]["text"]
    if zero_rows == 5:
        assert r["error_u"] is None and "no entry has a finite error" not in text, text
        assert text.endswith("every entry is exact: 15 outputs are 0, as is each of their product terms"), text
    else:
        assert "u over 9 of 15 entries; 6 more outputs are exactly 0, as is each of their product terms" in text, text
