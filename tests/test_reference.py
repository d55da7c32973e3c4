"""The exact reference against exact rational sums (fractions) and IEEE's rules for NaN/inf."""

import math
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from matmul_drift.core import numerics
from matmul_drift.measure import reference

F64_MAX = Fraction(float(np.finfo(np.float64).max))
F64_OVER = F64_MAX + Fraction(2) ** 970  # the largest finite value plus half its ulp: rounds to inf


def _exact(a: np.ndarray, b: np.ndarray) -> list[list[Fraction]]:
    return [[sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(row, col)), Fraction(0))
             for col in b.T] for row in a]


def _explain_json(tmp_path, capsys, monkeypatch, a: np.ndarray, b: np.ndarray, *extra: str) -> tuple[int, dict]:
    """`matmul-drift explain --dtype float64 --a A --b B --json` (and ``extra``) on these arrays:
    (exit status, report)."""
    import json

    from matmul_drift.cli import main as cli

    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path / "cat"))
    rc = cli.main(["explain", "--dtype", "float64", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--json", *extra])

    def strict(token):  # RFC 8259 has no NaN or Infinity
        raise ValueError(f"not JSON: {token}")

    return rc, json.loads(capsys.readouterr().out, parse_constant=strict)


def _within_bound(a: np.ndarray, b: np.ndarray) -> reference.Reference:
    """The reference of a @ b, checked entry by entry against exact rational sums: within its
    own bound (bound_rel·|A||B|)."""
    r = reference.exact_product(torch.matmul, torch.from_numpy(a), torch.from_numpy(b))
    for i, row in enumerate(_exact(a, b)):
        for j, want in enumerate(row):
            absprod = sum(abs(Fraction(float(x)) * Fraction(float(y))) for x, y in zip(a[i], b[:, j]))
            if abs(want) >= F64_OVER or math.isinf(r.hi[i, j]):  # finite, but rounds beyond float64
                assert abs(want) >= F64_OVER or not r.exact, (i, j)
                assert (r.hi[i, j] == (math.inf if want > 0 else -math.inf) or not r.exact) and r.finite[i, j], (i, j)
                if math.isinf(r.hi[i, j]):
                    continue
            got = Fraction(float(r.hi[i, j])) + Fraction(float(r.lo[i, j]))
            # below float64's range (|A||B| itself rounds to 0) only the subnormal step holds
            slack = Fraction(2.0**-1074) if r.absprod[i, j] == 0 else 0
            assert abs(got - want) <= Fraction(r.bound_rel) * absprod + slack, (i, j, a.tolist(), b.tolist())
            if r.slack is not None and math.isfinite(r.slack[i, j]):  # and entry by entry (inf: none known)
                assert abs(got - want) <= Fraction(float(r.slack[i, j])), (i, j, a.tolist(), b.tolist())
    assert r.slack is None or not r.exact
    return r


@pytest.mark.parametrize("seed", range(6))
def test_float64_reference_is_exact_to_its_bound(seed):
    g = np.random.default_rng(seed)
    for _ in range(25):
        m, k, n = g.integers(1, 7, 3)
        # magnitudes from 2^-1000 to 2^1000, mixed within a row: cancellation and wide spreads
        a = g.standard_normal((m, k)) * 2.0 ** g.integers(-1000, 1000, (m, k)).astype(float) / 2**500
        b = g.standard_normal((k, n)) * 2.0 ** g.integers(-20, 20, (k, n)).astype(float)
        r = _within_bound(a, b)
        tiny = r.absprod[r.absprod > 0]
        if r.exact and (tiny.size == 0 or tiny.min() >= 2.0**-960):
            assert r.bound_rel < 2.0**-96  # 2^-104 per slice product, far below float64's u, unless lo is subnormal


@pytest.mark.parametrize("seed", range(4))
def test_float64_reference_holds_its_bound_where_a_row_and_a_column_span_float64(seed):
    """Tiny entries of A's rows meet huge ones of B's columns, and zeros keep the large terms
    apart. Scaling each row to a maximum below 1 once pushed the tiny entries among the
    subnormals (rounded, or flushed to zero), and slice products underflowed, while the
    reference still called itself exact: a correct kernel was called a DEFECT."""
    g = np.random.default_rng(100 + seed)
    for _ in range(25):
        m, k, n = g.integers(1, 6, 3)
        a, b = (g.standard_normal(s) * 2.0 ** g.integers(-1074, 1020, s).astype(float) for s in ((m, k), (k, n)))
        a[g.random((m, k)) < 0.3], b[g.random((k, n)) < 0.3] = 0.0, 0.0
        _within_bound(a, b)


def test_float64_reference_at_the_ends_of_a_row_hand_built():
    # one tiny entry of A meets B's only non-zero entry: the product is the tiny entry's
    for a, b in (([[1.0, 1e-310], [3.0, 7e-312]], [[0.0], [1e300]]), ([[1.0, 5e-324]], [[0.0], [2.0**1000]])):
        r = _within_bound(np.array(a), np.array(b))
        assert r.exact and r.bound_rel < 2.0**-96
        assert [Fraction(h) + Fraction(lo) for h, lo in zip(r.hi[:, 0], r.lo[:, 0])] == [
            Fraction(row[1]) * Fraction(b[1][0]) for row in a]
    # 1·1 = 1 between 2^1000s that meet zeros: each 1 is 2^-1000 of its row's maximum, too far
    # below it for their slices' product; the reference says so rather than call 0 exact
    r = _within_bound(np.array([[2.0**1000, 1.0, 0.0]]), np.array([[0.0], [1.0], [2.0**1000]]))
    assert not r.exact and r.bound_rel >= 1
    # a row of such a product leaves the other rows' own bound tight
    r = _within_bound(np.array([[3.0, 5.0, 7.0], [2.0**1000, 1.0, 0.0]]), np.array([[0.0, 1.0], [1.0, 1.0], [2.0**1000, 1.0]]))
    assert r.bound_rel >= 1 and r.slack[1, 0] >= 1 and r.slack[0, 1] < 2.0**-90 * r.absprod[0, 1]
    # a slice step below float64's range (2^-1074 beside 2^447) is no underflow by itself
    assert _within_bound(np.array([[2.0**447, 2.0**-1074]]), np.array([[1.0], [1.0]])).exact


def test_a_reference_too_coarse_for_its_inputs_makes_no_defect(tmp_path, capsys, monkeypatch):
    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, np.array([[2.0**1000, 1.0, 0.0]]), np.array([[0.0], [1.0], [2.0**1000]]))
    assert rc == 0 and doc["verdict"]["kind"] != "defect", doc["verdict"]
    assert not doc["reference"]["exact_products"] and "against a reference good only to" in doc["verdict"]["text"]


def test_an_overflow_in_one_row_is_judged_on_that_rows_own_reference(tmp_path, capsys, monkeypatch):
    """Row 0's exact value is 1e308, in range, and its inf an intermediate sum's (spurious);
    row 1 makes the reference inexact. One bound for the whole product, times row 0's |A||B|
    (which overflows), once called row 0's inf the rounding of an exact value beyond range."""

    a = np.array([[1e308, 1e308, -1e308], [2.0**1000, 1.0, 0.0]])
    b = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0**1000]])
    c = torch.from_numpy(a) @ torch.from_numpy(b)
    r = _within_bound(a, b)
    assert not r.exact and r.hi[0, 0] == 1e308 and math.isinf(r.absprod[0, 0]) and math.isfinite(r.slack[0, 0])
    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, a, b)
    nf = doc["nonfinite"]
    spurious = int(math.isinf(c[0, 0]))  # the sum's order is the kernel's: count what it gave
    assert rc == 0 and nf["spurious"] == spurious and nf["overflow"] == int(math.isinf(c[0, 1])), nf


# |A||B| is 2^1024 and more in column 0, beyond float64; in column 1 it is below 2^1024. Every
# exact value is finite: 1 and 2^1000 in column 0, -2^1023 + 2^993 + 2^-30 and 2^1000 in column 1.
OVER_A = np.array([[2.0**1023, -2.0**1023, 1.0], [2.0**1023, 2.0**1000, -2.0**1023]])
OVER_B = np.array([[1.0, 2.0**-30], [1.0, 1.0], [1.0, 2.0**-30]])


def test_float64_entries_whose_abs_product_overflows_are_judged_against_gamma_k():
    """Where |A||B| overflowed float64, an entry was left out of error_u and beyond_bound, so a
    kernel's answer off by 2^975 there (16 u of |A||B|, beyond γ_3 = 3 u) was no defect. It is
    judged now on |A||B|·2^-e, C·2^-e and the exact value·2^-e (e an integer per entry); the
    entries with |A||B| in range are judged as before."""
    r = _within_bound(OVER_A, OVER_B)
    exact = _exact(OVER_A, OVER_B)
    absprod = [[sum((abs(Fraction(x) * Fraction(y)) for x, y in zip(row, col)), Fraction(0)) for col in OVER_B.T]
               for row in OVER_A]
    scaled, absexp = r.absprod_pow2()
    assert np.isinf(r.absprod[:, 0]).all() and np.isfinite(r.absprod[:, 1]).all()
    assert (absexp[:, 1] == 0).all() and (scaled[:, 1] == r.absprod[:, 1]).all()
    for i in range(2):
        for j in range(2):  # |A||B| = scaled·2^absexp, to float64's rounding
            got = Fraction(float(scaled[i, j])) * Fraction(2) ** int(absexp[i, j])
            assert abs(got - absprod[i][j]) <= Fraction(2) ** -50 * absprod[i][j], (i, j)
    slack = r.slack_or_relative()
    assert (slack[:, 1] == r.bound_rel * r.absprod[:, 1]).all() and np.isfinite(slack).all()
    k, u = 3, Fraction(2) ** -53
    gamma = k * u / (1 - k * u)
    c = (torch.from_numpy(OVER_A) @ torch.from_numpy(OVER_B)).numpy()
    wrong = c.copy()
    wrong[:, 0] += 2.0**975
    for prod, want_beyond in ((c, 0), (wrong, 2)):
        errs = [[abs(Fraction(float(prod[i, j])) - exact[i][j]) for j in range(2)] for i in range(2)]
        assert sum(errs[i][j] > gamma * absprod[i][j] for i in range(2) for j in range(2)) == want_beyond  # the truth
        e = numerics.error(prod, r.hi, r.lo, r.finite, scaled, "float64", k, ref_slack=slack, absexp=absexp)
        assert (e["entries"], e["of"], e["beyond_bound"]) == (4, 4, want_beyond), e
        want_u = max(float(errs[i][j] / (u * absprod[i][j])) for i in range(2) for j in range(2))
        # (torch's worst error, 2^-30 at (0, 1), is 2^-1000 u: numerics divides among float64's subnormals there)
        assert math.isclose(e["error_u"], want_u, rel_tol=2.0**-40, abs_tol=2.0**-900), (e, want_u)
        # in range, the same answer as without the scaling
        cut = (slice(None), slice(1, 2))
        assert numerics.error(prod[cut], r.hi[cut], r.lo[cut], r.finite[cut], r.absprod[cut], "float64", k,
                              ref_slack=slack[cut]) == numerics.error(
            prod[cut], r.hi[cut], r.lo[cut], r.finite[cut], scaled[cut], "float64", k, ref_slack=slack[cut],
            absexp=absexp[cut])
    # a product whose |A||B| is in range everywhere carries no scaled copy
    r = reference.exact_product(torch.matmul, torch.from_numpy(OVER_A[:, 1:]), torch.from_numpy(OVER_B[1:]))
    assert r.absprod_pow2() == (r.absprod, None) and r.absprod_scaled is None


def test_explain_judges_float64_entries_whose_abs_product_overflows(tmp_path, capsys, monkeypatch):
    """explain once said "bit-identical ... error_u 0 u over 2 of 4 entries" of OVER_A @ OVER_B and
    nothing of a kernel off by 2^975 at (0, 0), where |A||B| = 2^1024 + 1 overflows float64."""
    from matmul_drift.measure import measure

    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, OVER_A, OVER_B)
    assert rc == 0 and doc["verdict"]["kind"] != "defect", doc["verdict"]
    assert (doc["error_entries"]["entries"], doc["error_entries"]["beyond_bound"]) == (4, 0), doc["error_entries"]
    product = measure.Operands.product

    def off(self, a=None, b=None):
        out = product(self, a, b)
        if a is None and b is None:  # the kernel's own full product; the reference passes its slices
            out = out.clone()
            out[0, 0] += 2.0**975
        return out

    monkeypatch.setattr(measure.Operands, "product", off)
    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, OVER_A, OVER_B)
    assert rc == 1 and doc["verdict"]["kind"] == "defect", doc["verdict"]
    assert doc["error_entries"]["beyond_bound"] == 1 and math.isclose(doc["error_u"], 16.0, rel_tol=1e-9), doc


def test_only_entries_near_float64s_largest_value_are_summed_again(monkeypatch):
    """Every entry whose |A||B| overflowed float64 counted as near the overflow threshold (its
    Sum2 reach, 2^-100·|A||B|, was inf), so all went through _resum_near_overflow's Python
    loop: 4096x256x4096 float64 with |A||B| ~ 2^1025 peaked at 14950 MiB, not 2026. In OVER_A @ OVER_B
    the exact values (1, 2^1000; -2^1023 + 2^993 + 2^-30, 2^1000) lie far from it: none is."""
    near = []
    resum = reference._resum_near_overflow
    monkeypatch.setattr(reference, "_resum_near_overflow",
                        lambda *args: near.append(int(args[4].sum())) or resum(*args))
    r = _within_bound(OVER_A, OVER_B)  # still within its bound, entry by entry
    assert near == [] and np.isinf(r.absprod[:, 0]).all(), near
    a = OVER_A.copy()
    a[1, 2] = 2.0**1023 - 2.0**1000  # (1, 0) = 2^1024 - 2^1000 + 2^1000: rounds to inf, as its exact value does
    r = _within_bound(a, OVER_B)
    assert near == [1] and math.isinf(r.hi[1, 0]), near


def test_drift_at_float64_entries_whose_abs_product_overflows_is_judged_against_gamma_k():
    """numerics.drift left entries whose |A||B| overflows float64 out of max_u and beyond_bound:
    two products 2^975 apart at (0, 0) of OVER_A @ OVER_B (16 u of |A||B|, beyond 2·γ_3) were
    not flagged. Given Reference.absprod_pow2()'s exponents they are judged on x·2^-e and
    y·2^-e (scaled before subtracting: -F64_MAX against 2^1000 is finite there); entries in
    range give the same answer as without the scaling."""
    r = _within_bound(OVER_A, OVER_B)
    scaled, absexp = r.absprod_pow2()
    absprod = [[sum((abs(Fraction(x) * Fraction(y)) for x, y in zip(row, col)), Fraction(0)) for col in OVER_B.T]
               for row in OVER_A]
    k, u = 3, Fraction(2) ** -53
    gamma = k * u / (1 - k * u)
    x = (torch.from_numpy(OVER_A) @ torch.from_numpy(OVER_B)).numpy()
    off, far, nudged = x.copy(), x.copy(), x.copy()
    off[0, 0] += 2.0**975
    far[1, 0] = -float(F64_MAX)
    nudged[:, 1] = np.nextafter(x[:, 1], np.inf)  # a rounding-level move where |A||B| is in range
    bits = lambda v: v.view(np.uint64)  # noqa: E731
    for y, want_beyond in ((x, 0), (off, 1), (far, 1), (nudged, 0)):
        diffs = [[abs(Fraction(float(x[i, j])) - Fraction(float(y[i, j]))) for j in range(2)] for i in range(2)]
        assert sum(diffs[i][j] > 2 * gamma * absprod[i][j] for i in range(2) for j in range(2)) == want_beyond  # the truth
        d = numerics.drift(bits(x), bits(y), x, y, scaled, "float64", k, absexp=absexp)
        assert (d["max_u_entries"], d["beyond_bound"]) == (4, want_beyond), d
        want_u = max(float(diffs[i][j] / (u * absprod[i][j])) for i in range(2) for j in range(2))
        assert math.isclose(d["max_u"], want_u, rel_tol=2.0**-40, abs_tol=2.0**-900), (d, want_u)
        cut = (slice(None), slice(1, 2))  # in range, the same answer as without the scaling
        assert numerics.drift(bits(x[cut]), bits(y[cut]), x[cut], y[cut], r.absprod[cut], "float64", k) == numerics.drift(
            bits(x[cut]), bits(y[cut]), x[cut], y[cut], scaled[cut], "float64", k, absexp=absexp[cut])


def test_explain_flags_slice_and_repeat_drift_where_the_abs_product_overflows(tmp_path, capsys, monkeypatch):
    """explain's slices and repeats once left the entries of OVER_A @ OVER_B whose |A||B| >= 2^1024
    out of max_u: a slice m = 1 and repeats 2^975 away at (0, 0) (16 u of |A||B|, beyond 2·γ_3 = 6 u)
    read "0 u over 1 entry", no defect. Correct ones cover every entry and stay within the bound."""
    from matmul_drift.measure import measure

    slices = ("--slice-m", "1", "--slice-n", "1")
    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, OVER_A, OVER_B, *slices)
    assert rc == 0 and doc["verdict"]["kind"] != "defect", doc["verdict"]
    for name, entries in (("slice_m", 2), ("slice_n", 2), ("run_to_run", 4)):  # m = 1, n = 1, all
        row = doc[name]  # a slice's own kernel may sum in another order: rounding-level at most
        assert (row["max_u_entries"], row["beyond_bound"]) == (entries, 0) and row["max_u"] <= 6, (name, row)
        assert row["max_u"] == 0 or row["frac_differ"] > 0, (name, row)
    product, calls = measure.Operands.product, []

    def off(self, a=None, b=None):
        out = product(self, a, b)
        full = a is None and b is None
        calls.append(full)
        # the slice A[:1] @ B (not the reference's, which passes B) and every full product after the first
        if (a is not None and b is None and a.shape[-2] == 1) or (full and calls.count(True) > 1):
            out = out.clone()
            out[0, 0] += 2.0**975
        return out

    monkeypatch.setattr(measure.Operands, "product", off)
    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, OVER_A, OVER_B, *slices)
    want_u = float(Fraction(2) ** 975 / (Fraction(2) ** -53 * (Fraction(2) ** 1024 + 1)))  # x(0, 0) is 1 or less
    assert rc == 1 and doc["verdict"]["kind"] == "defect", doc["verdict"]
    assert doc["error_entries"]["beyond_bound"] == 0, doc["error_entries"]  # the first full product is right
    for name, entries in (("slice_m", 2), ("run_to_run", 4)):
        row = doc[name]
        assert (row["max_u_entries"], row["beyond_bound"]) == (entries, 1), (name, row)
        assert math.isclose(row["max_u"], want_u, rel_tol=1e-12), (name, row, want_u)


def test_scan_point_measures_drift_where_the_abs_product_overflows():
    """scan's max_u left out the entries of OVER_A @ OVER_B whose |A||B| >= 2^1024: against a full
    product 2^975 off at (0, 0), the point m = 1 read rounding-level drift, not 16 u."""
    from matmul_drift.measure import measure

    ops = measure.Operands(torch.from_numpy(OVER_A), torch.from_numpy(OVER_B), "matmul", "as-stored")
    c = ops.product()
    c[0, 0] += 2.0**975  # the slice's own (0, 0) is at most 1 here: 2^975 away, as rounded
    top = measure.Top(*measure.on_host(c), measure.reference(ops))
    point = measure.scan_point(ops, "m", 1, top, dtype="float64", device="cpu")
    want_u = float(Fraction(2) ** 975 / (Fraction(2) ** -53 * (Fraction(2) ** 1024 + 1)))
    assert math.isclose(point["max_u"], want_u, rel_tol=1e-12), point


def _plain(a, b) -> np.ndarray:
    """|A||B| as fixrun's lean mode took it before: one float64 product."""
    return (a.abs().double() @ b.abs().double()).numpy()


def test_abs_product_pow2_scales_as_the_reference_and_keeps_entries_in_range_bit_for_bit():
    """fixrun's lean mode (no exact reference) takes |A||B| from one float64 product: inf where
    it overflows. abs_product_pow2 gives (|A||B|·2^-e, e) there as Reference.absprod_pow2()
    does, by the same scaling (a 2-D and a 1-D A), and in range the plain product, bit for bit."""
    a, b = torch.from_numpy(OVER_A), torch.from_numpy(OVER_B)
    plain = (a.abs() @ b.abs()).numpy()
    for a_ in (a, a[0]):
        scaled, absexp = reference.abs_product_pow2(torch.matmul, a_, b)
        want_scaled, want_exp = reference.exact_product(torch.matmul, a_, b).absprod_pow2()
        assert want_exp is not None and (scaled == want_scaled).all() and (absexp == want_exp).all(), (scaled, absexp)
    scaled, absexp = reference.abs_product_pow2(torch.matmul, a, b)
    assert np.isinf(plain[:, 0]).all() and (absexp[:, 0] != 0).all()
    assert (scaled[:, 1].view(np.uint64) == plain[:, 1].view(np.uint64)).all() and (absexp[:, 1] == 0).all()
    scaled, absexp = reference.abs_product_pow2(torch.matmul, a[:, 1:], b[1:])  # in range everywhere
    assert absexp is None and (scaled.view(np.uint64) == _plain(a[:, 1:], b[1:]).view(np.uint64)).all()


def _lean_run(monkeypatch, a: np.ndarray, b: np.ndarray, off, **spec) -> dict:
    """fixrun.run's lean mode (the suite's) on hand-built float64 operands, with ``off(y, a_arg,
    b_arg, nth_full)`` changing each product the kernel makes: its result for code None."""
    from matmul_drift.core import cases
    from matmul_drift.measure import measure
    from matmul_drift.probes import fixrun

    m, k = a.shape
    n = b.shape[1]
    monkeypatch.setattr(fixrun, "operands", lambda s: (cases.adhoc(m, k, n), measure.Operands(
        torch.from_numpy(a), torch.from_numpy(b), "mm", "contiguous")))
    product, fulls = measure.Operands.product, []

    def changed(self, a_=None, b_=None):
        out = product(self, a_, b_)
        fulls.append(a_ is None and b_ is None)
        return off(out, a_, b_, fulls.count(True) if fulls[-1] else 0)

    monkeypatch.setattr(measure.Operands, "product", changed)
    return fixrun.run({"m": m, "k": k, "n": n, "dtype": "float64", "device": "cpu", "codes": [None], "lean": True,
                       **spec})["None"]


def test_fixruns_lean_mode_judges_drift_where_the_abs_product_overflows(monkeypatch):
    """The suite's lean mode took |A||B| from one float64 product and left the entries where it
    overflows (inf) out of max_u: in OVER_A @ OVER_B, a slice A[:1] @ B and repeats 2^975 away
    at (0, 0), where |A||B| = 2^1024 + 1 (16 u, beyond 2·γ_3 = 6 u), read rounding-level drift
    for the slice (its column 1 alone) and 0 for the repeats. Now both read the 16 u the
    exact rational sum gives. In range (column 1) max_u is what the plain product gives, bit
    for bit."""
    from matmul_drift.core import numerics

    def far(y, a_, b_, nth_full):  # the slice of one row, and every full product after the first
        if (a_ is not None and b_ is None and a_.shape[-2] == 1) or nth_full > 1:
            y = y.clone()
            y[0, 0] += 2.0**975
        return y

    got = _lean_run(monkeypatch, OVER_A, OVER_B, far, slice_m=[1], repeat=3)
    x = (torch.from_numpy(OVER_A) @ torch.from_numpy(OVER_B)).numpy()
    absprod = sum(abs(Fraction(p) * Fraction(q)) for p, q in zip(OVER_A[0], OVER_B[:, 0]))  # 2^1024 + 1
    diff = abs(Fraction(float(x[0, 0] + 2.0**975)) - Fraction(float(x[0, 0])))
    want_u = float(diff / (Fraction(2) ** -53 * absprod))
    assert absprod > F64_MAX and 15.9 < want_u < 16.1, want_u
    for kind in ("slice_m", "run_to_run"):
        assert math.isclose(got["drift"][kind]["max_u"], want_u, rel_tol=1e-12), (kind, got["drift"][kind], want_u)
    assert got["error_u"] is None  # lean: no exact reference

    def nudge(y, a_, b_, nth_full):  # one ulp at (0, 1), where |A||B| is in range, in the repeats
        if nth_full > 1:
            y = y.clone()
            y[0, 1] = np.nextafter(float(y[0, 1]), math.inf)
        return y

    got = _lean_run(monkeypatch, OVER_A, OVER_B, nudge, repeat=2)["drift"]["run_to_run"]
    y = x.copy()
    y[0, 1] = np.nextafter(x[0, 1], math.inf)
    before = numerics.drift(x.view(np.uint64), y.view(np.uint64), x, y,
                            _plain(torch.from_numpy(OVER_A), torch.from_numpy(OVER_B)), "float64", 3)
    assert got["max_u"] == before["max_u"] > 0, (got, before)
    absprod = sum(abs(Fraction(p) * Fraction(q)) for p, q in zip(OVER_A[0], OVER_B[:, 1]))
    want_u = float(abs(Fraction(float(y[0, 1])) - Fraction(float(x[0, 1]))) / (Fraction(2) ** -53 * absprod))
    assert math.isclose(got["max_u"], want_u, rel_tol=2.0**-40), (got, want_u)


def test_cancellation_to_zero_and_exact_integers():
    a = np.array([[1e300, 1.0, -1e300], [3.0, -4.0, 5.0]])
    b = np.array([[1.0], [2.0**-60], [1.0]])
    r = reference.exact_product(torch.matmul, torch.from_numpy(a), torch.from_numpy(b))
    assert r.hi[0, 0] == 2.0**-60 and r.lo[0, 0] == 0.0  # float64's own product gives 0 here
    assert r.hi[1, 0] == 3.0 - 4.0 * 2.0**-60 + 5.0 or (Fraction(r.hi[1, 0]) + Fraction(r.lo[1, 0])
                                                          == Fraction(8) - Fraction(4, 2**60))


def test_ops_mv_bmm_linear_match_exact_sums():
    g = np.random.default_rng(3)
    a1, b = g.standard_normal(9), g.standard_normal((9, 4))
    r = reference.exact_product(torch.matmul, torch.from_numpy(a1), torch.from_numpy(b))
    want = _exact(a1[None, :], b)[0]
    assert [Fraction(float(h)) + Fraction(float(lo)) for h, lo in zip(r.hi, r.lo)] == pytest.approx(want, rel=1e-30)
    a3, b3 = g.standard_normal((2, 3, 5)), g.standard_normal((2, 5, 4))
    r = reference.exact_product(torch.matmul, torch.from_numpy(a3), torch.from_numpy(b3))
    for t in range(2):
        got = [[Fraction(float(r.hi[t, i, j])) + Fraction(float(r.lo[t, i, j])) for j in range(4)] for i in range(3)]
        assert np.allclose(np.array(got, dtype=float), np.array(_exact(a3[t], b3[t]), dtype=float), rtol=1e-15)
    w = torch.from_numpy(g.standard_normal((4, 5)))  # linear: B = W.t(), a transposed view
    x = torch.from_numpy(g.standard_normal((3, 5)))
    r = reference.exact_product(lambda p, q: torch.nn.functional.linear(p, q.t()), x, w.t())
    assert np.allclose(r.hi, np.array(_exact(x.numpy(), w.numpy().T), dtype=float), rtol=1e-15)


def test_nonfinite_follows_ieee_on_the_exact_terms():
    inf, nan = math.inf, math.nan
    a = np.array([[nan, 1.0], [inf, 1.0], [inf, -inf], [0.0, 1.0], [inf, 0.0]])
    b = np.array([[1.0, 0.0, -2.0], [1.0, 1.0, 1.0]])
    r = reference.exact_product(torch.matmul, torch.from_numpy(a), torch.from_numpy(b))
    # each entry by numpy's own float arithmetic on the two terms
    np.seterr(invalid="ignore")
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            want = a[i, 0] * b[0, j] + a[i, 1] * b[1, j]
            got = r.hi[i, j]
            assert (math.isnan(want) and math.isnan(got)) or want == got, (i, j, got, want)
            assert r.finite[i, j] == math.isfinite(want)


def test_blocks_of_columns_give_the_same_bits(monkeypatch):
    g = np.random.default_rng(5)
    for a, b in ((g.standard_normal((4, 5)), g.standard_normal((5, 11))),
                 (g.standard_normal(5), g.standard_normal((5, 11))),
                 (g.standard_normal((2, 3, 5)), g.standard_normal((2, 5, 11)))):
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        whole = reference.exact_product(torch.matmul, a, b)
        monkeypatch.setattr(reference, "CHUNK_BYTES", 8 * b.numel() // 11 * 3)  # 3 columns a block
        blocks = reference.exact_product(torch.matmul, a, b)
        monkeypatch.undo()
        assert np.array_equal(whole.hi, blocks.hi) and np.array_equal(whole.lo, blocks.lo)
        # |A||B| is an ordinary float64 GEMM (a normaliser, not exact): its bits may follow the route
        assert np.allclose(whole.absprod, blocks.absprod, rtol=8 * 2.0**-53, atol=0) and whole.hi.shape == blocks.hi.shape


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts page faults as Linux reports them")
def test_blocks_of_columns_reuse_their_temporaries():
    """A wide float64 B is done in blocks of columns; each block's scaled copy, |B| and slices
    go into the same tensors, not fresh pages (1.4 M page faults on the seed before, with
    blocks of 8 MB whose freed memory the C library handed back). Here a 128 MiB B in 16
    blocks: fewer minor faults in all than B has pages (one block's tensors are made fresh;
    7.2 times B's pages before, 0.63 times now, on the AMD EPYC)."""
    import resource

    a = torch.from_numpy(np.random.default_rng(6).standard_normal(4096))
    b = torch.from_numpy(np.random.default_rng(7).standard_normal((4096, 4096)))
    assert 4096 > reference.CHUNK_BYTES // (8 * 4096)  # several blocks
    reference.exact_product(torch.matmul, a[:64], b[:64, :64])  # the library's own first-call pages
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    r = reference.exact_product(torch.matmul, a, b)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert r.exact and faults < b.numel() * 8 // 4096, faults


def test_products_among_float64_subnormals_are_judged_with_the_references_own_error(tmp_path, capsys, monkeypatch):
    """Exact values near 2^-1070: the kernel's float64 result is within the γ_K bound with
    underflow, (K+1)·2^-1075 (checked here in exact rationals), but the reference's hi + lo
    is only good to 4·2^-1074 there. Comparing the two without the reference's own error
    called a correct kernel a DEFECT (and u·|A||B| underflowed to 0: a division by zero)."""
    import warnings

    g = np.random.default_rng(7)
    a = g.integers(1, 2**20, (3, 4)) * 2.0**-560
    b = g.integers(1, 2**20, (4, 2)) * 2.0**-550  # products about 2^-1070: subnormal
    c = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
    eta = Fraction(2) ** -1075
    for i, row in enumerate(_exact(a, b)):
        for j, want in enumerate(row):
            assert abs(Fraction(float(c[i, j])) - want) <= (a.shape[1] + 1) * eta  # the truth: no defect
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning (division by zero)
        rc, doc = _explain_json(tmp_path, capsys, monkeypatch, a, b)
    assert rc == 0 and doc["verdict"]["kind"] != "defect", doc["verdict"]
    assert math.isfinite(doc["error_u"]) and doc["error_u"] > 1 and "below float64's normal range" in doc["verdict"]["text"]


def test_float64_sums_at_the_overflow_threshold_round_as_their_exact_value_does():
    # Hand-built rows about the midpoint between float64's largest value and 2^1024 (ties go
    # to even: to inf). Just below it, lo's own rounding once put hi + lo on the midpoint and
    # hi at inf, so a kernel's inf from an overflowing partial sum read as the correct one.
    top, half = float(np.finfo(np.float64).max), 2.0**970
    rows = [[top, half, -(2.0**900)], [top, half, 0.0], [top, half, 2.0**900], [-top, -half, 2.0**900],
            [top, half - 2.0**918, 0.0], [top, 0.0, 0.0]]
    a, b = np.array(rows), np.ones((3, 1))
    r = _within_bound(a, b)
    for i, want in enumerate(_exact(a, b)):
        inf = math.inf if want[0] > 0 else -math.inf
        rounded = inf if abs(want[0]) >= F64_OVER else float(want[0])  # Fraction → float: rounded once
        assert r.hi[i, 0] == rounded and r.finite[i, 0], (i, r.hi[i, 0], rounded)
    assert [bool(math.isinf(h)) for h in r.hi[:, 0]] == [False, True, True, False, False, False]
    # a sequential sum overflows on row 0, whose exact value rounds to the largest finite value
    counts = numerics.nonfinite(np.array([math.inf]), r.hi[:1, 0], r.finite[:1, 0], "float64", r.slack)
    assert (counts["overflow"], counts["spurious"]) == (0, 1), counts
    counts = numerics.nonfinite(np.array([math.inf]), r.hi[1:2, 0], r.finite[1:2, 0], "float64", r.slack)
    assert (counts["overflow"], counts["spurious"]) == (1, 0), counts


def test_float64_sums_that_reach_the_overflow_threshold_round_to_inf():
    # The mirror of the above: the exact sum is the threshold itself (a tie, which goes to
    # inf), but the roundings of lo left hi + lo just below it and hi at the largest finite
    # value, so a kernel's correctly rounded inf read as a spurious one. Found by a search
    # over rows made to sum to the threshold exactly, then shrunk.
    row = [float.fromhex(x) for x in ("0x1.a4ba9c8p+958", "0x1.fff3c9aac18bdp+969", "0x1.fffffffffffffp+1023",
                                      "0x1.2cc2491680000p+913")]
    below = row[:3] + [np.nextafter(row[3], 0.0)]  # one ulp of the last term less: rounds to the largest value
    a = np.array([row, [-x for x in row], below])
    b = np.array([[float.fromhex("0x1.db9175c279dacp-3")], [1.0], [1.0], [1.0]])
    exact = [want[0] for want in _exact(a, b)]
    assert exact[:2] == [F64_OVER, -F64_OVER] and exact[2] < F64_OVER
    r = _within_bound(a, b)
    assert r.exact and r.hi[:, 0].tolist() == [math.inf, -math.inf, float(F64_MAX)]
    counts = numerics.nonfinite(np.array([math.inf, -math.inf, math.inf]), r.hi[:, 0], r.finite[:, 0], "float64")
    assert (counts["overflow"], counts["spurious"]) == (2, 1), counts


def test_an_inexact_reference_at_the_overflow_threshold_keeps_its_low_part(tmp_path, capsys, monkeypatch):
    """2^-600 is lost when A's row is scaled to 2^448, so the reference is not exact: its slices
    sum to the threshold less 2^-400, hi is float64's largest value and lo 2^970, while the
    exact value (B's 2^200 gives the 2^-400 back) is the threshold itself, which rounds to inf.
    Judged on hi and its slack alone, without lo, a kernel's correctly rounded inf was spurious."""

    a = np.array([[float(F64_MAX), 2.0**970, -(2.0**-400), 2.0**-600]])
    b = np.array([[1.0], [1.0], [1.0], [2.0**200]])
    assert _exact(a, b)[0][0] == F64_OVER
    r = _within_bound(a, b)
    assert not r.exact and r.hi[0, 0] == float(F64_MAX) and r.slack[0, 0] < 2.0**970
    c = float(torch.from_numpy(a) @ torch.from_numpy(b))  # the kernel's order: whatever it gave
    rc, doc = _explain_json(tmp_path, capsys, monkeypatch, a, b)
    nf = doc["nonfinite"]
    assert rc == 0 and (nf["overflow"], nf["spurious"]) == (int(math.isinf(c)), int(math.isnan(c))), nf
    for x, lo, want in ((r.hi[0, 0], r.lo[0, 0], 1), (-r.hi[0, 0], -r.lo[0, 0], 1), (r.hi[0, 0], 2.0**969, 0)):
        counts = numerics.nonfinite(np.array([math.copysign(math.inf, x)]), np.array([x]), np.ones(1, bool),
                                    "float64", r.slack[0], np.array([lo]))
        assert (counts["overflow"], counts["spurious"]) == (want, 1 - want), (x, lo, counts)
