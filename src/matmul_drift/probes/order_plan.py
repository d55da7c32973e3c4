"""The order probe's plan, without torch: the computation probed (``Target``), the probe's
constants per dtype, and the matmul calls a reveal, a spread group, fuse or a replay takes, so
that a probe beyond its call budget is refused before it starts.

One probe per column of B, so one call of the exact shape runs N probes. Where the output
cannot count every product exactly (fp16 holds 11 significant bits, bf16 8), the products are
spread over chunks, one probe each, and the counts added.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from matmul_drift.core import cases, trees
from matmul_drift.core.numerics import ceil_div
from matmul_drift.measure import record


# dtype -> (significant bits of the accumulator, of the output, base product, M)
# fp16/bf16/fp32 accumulate in fp32; fp16's base is its smallest subnormal, so that
# M / base = 2^39 leaves room for any chunk of at most 2^11 base products.
PROBE = {
    "float64": (53, 53, 1.0, 2.0**90),
    "float32": (24, 24, 1.0, 2.0**60),
    "float16": (24, 11, 2.0**-24, 2.0**15),
    "bfloat16": (24, 8, 1.0, 2.0**40),
}
MAX_K = {"float64": 2**30, "float32": 2**24, "float16": 2**24, "bfloat16": 2**24}


class ProbeError(ValueError):
    """The probe cannot run for this K and dtype (bad input: one line, exit 2)."""


def check(k: int, dtype: str) -> None:
    if dtype not in PROBE:
        raise ProbeError(f"no probe for {dtype}; expected one of {', '.join(PROBE)}")
    if k < 2:
        raise ProbeError(f"K = {k}: a sum of one product has no order to reveal")
    if k > MAX_K[dtype]:
        raise ProbeError(f"K = {k} is beyond the probe's exact range for {dtype} "
                         f"(at most {MAX_K[dtype]}: "
                         "the accumulator could not count the products)")


def chunk_size(dtype: str) -> int:
    """The most base products one probe may hold, so that the output counts them exactly."""
    acc, out, base, m = PROBE[dtype]
    absorb = int(m / base) >> (acc + 1)  # partial sums below half an ulp of M vanish into it
    return max(1, min(2**out, absorb))


def chunks(k: int, size: int) -> list[tuple[int, int]]:
    """The ranges [lo, hi) of k, each holding at most ``size`` base products, one probe each."""
    return [(lo, min(lo + size, k)) for lo in range(0, k, size)]


@dataclass
class Target:
    """The computation whose order is revealed: the entry (``row``, ``col``) of its output's
    first matrix (``rows`` x ``cols``); ``k`` products. The probes sit in B's columns, or in
    A's rows where the output has more rows than columns: ``width`` probes per call."""

    case: cases.Case
    dtype: str
    device: str
    slice_n: int | None
    slice_m: int | None
    row: int
    col: int
    k: int
    rows: int
    cols: int
    # the dtype plus its matmul flags (cases.PRECISIONS); "" for the dtype alone
    precision: str = ""
    # A as the case holds it, or "2d": a 1-D A as A.unsqueeze(0) (cases.Case.forms)
    form: str = "as-is"

    @property
    def by_rows(self) -> bool:
        return self.rows > self.cols

    @property
    def width(self) -> int:
        return max(self.rows, self.cols)

    @property
    def label(self) -> str:
        """The case and its slice as the product reads: ``seed A[:1] @ B``."""
        a = ("A.unsqueeze(0)" if self.form == "2d" else f"A[:{self.slice_m}]" if self.slice_m
             else "A")
        return f"{self.case.id} {a} @ " + (f"B[:, :{self.slice_n}]" if self.slice_n else "B")

    def probe_sizes(self) -> dict:
        """The probe's sizes as memory.probe_bytes takes them, which gives the (host, device)
        bytes it needs: one Prober at a time."""
        a_shape, b_shape = record.operand_shapes(self.case, self.device)
        s = self.case.shape(self.device)
        batch = s.batch or 1
        copy = batch * self.k * self.slice_n if self.slice_n and self.case.layout == "copy" else 0
        out = batch * self.rows * self.cols
        return {"a": int(np.prod(a_shape)), "b": int(np.prod(b_shape)) + copy, "out": out,
                "k": self.k, "width": widths(self)[0], "dtype": self.dtype, "device": self.device}

    def computation(self) -> tuple:
        """What the probe's readings depend on: the op, the operands' stored shapes, the slice,
        the precision, the device, A's form and the entry; not the case's name or its inputs (the
        probe writes its own). A view slice as large as the operand is the operand itself."""
        s = self.case.shape(self.device)
        view = self.case.layout != "copy"  # a copy of a whole transposed W is not W
        n = None if self.slice_n == s.n and view else self.slice_n
        m = None if self.slice_m == s.m else self.slice_m
        return (self.case.op, record.operand_shapes(self.case, self.device),
                self.case.layout if n else "",
                n, m, self.precision or self.dtype, self.device, self.form, self.row, self.col)


def target(case: cases.Case, precision: str, device: str, slice_n=None, slice_m=None, row=0, col=0,
           form: str = "as-is") -> Target:
    """The case's computation (its full product, or one slice of it) in ``precision`` (a dtype,
    or one with its matmul flags: ``float32-tf32``), A in ``form``; ValueError for bad input,
    record.Unavailable where the device or precision cannot run here."""
    # here: the check asks torch, and `order`'s parser imports this plan, which needs none
    from matmul_drift.measure.measure import check_device

    check_device(device, precision)
    if form not in case.forms:
        raise ProbeError(f"form {form!r} is not one of the case's ({', '.join(case.forms)})")
    dtype = cases.storage_dtype(precision)
    s = case.shape(device)
    rows = 1 if case.op == "mv" else slice_m or s.m
    cols = slice_n or s.n
    if not 0 <= row < rows or not 0 <= col < cols:
        raise ProbeError(f"entry ({row}, {col}) is outside the {rows} x {cols} output")
    if case.compare_cols and col >= case.compare_cols:
        raise ProbeError(f"entry ({row}, {col}): {case.id}'s slices are compared in their first "
                         f"{case.compare_cols} columns; choose a column below {case.compare_cols}")
    check(s.k, dtype)
    return Target(case, dtype, device, slice_n, slice_m, row, col, s.k, rows, cols, precision, form)


def group_calls(free: int, room: int, rows: int) -> int:
    """Matmul calls of one spread group: its ``free`` leaves (outside S) in pieces of ``room``,
    ``rows`` - 1 pieces a call (row 0 holds S), at least one call."""
    return max(1, ceil_div(ceil_div(free, room), rows - 1))


def spread_plan(pairs: list[tuple[int, int]], masks: list[np.ndarray], chunk: int, rows: int):
    """How many of ``pairs`` (their leaves: ``masks`` over k) one spread group takes, and the
    pieces (arrays of k) of its leaves outside S that the rows hold: the size that reads the most
    pairs a matmul call, each row holding at most ``chunk`` base products, S's among them."""
    k = len(masks[0])
    union, in_s = np.zeros(k, bool), np.zeros(k, bool)
    seen: set[int] = set()
    best, s_size = (0.0, 1), 0
    for c, (i, j) in enumerate(pairs):
        if id(masks[c]) not in seen:
            seen.add(id(masks[c]))
            union |= masks[c]
        s_size += int(not in_s[i]) + int(not in_s[j] and j != i)
        in_s[i] = in_s[j] = True
        room = chunk - s_size
        if room < 1:
            break
        rate = (c + 1) / group_calls(int(union.sum()) - int((union & in_s).sum()), room, rows)
        if rate >= best[0]:
            best = (rate, c + 1)
    size = best[1]
    union[:] = False
    for m in {id(m): m for m in masks[:size]}.values():
        union |= m
    s_ = np.unique(np.asarray(pairs[:size]))
    union[s_] = False
    leaves = np.flatnonzero(union)
    n = max(1, ceil_div(len(leaves), chunk - len(s_)))
    return size, [p for p in np.array_split(leaves, n) if len(p)]


def calls_per_round(t: Target, width: int | None = None) -> int:
    """Matmul calls of one round at most: 2(K - 1) pairs, times the chunks of k, over the
    probes one call holds (a tree of height h takes at most h rounds, usually log2 K)."""
    return ceil_div(2 * (t.k - 1) * len(chunks(t.k, chunk_size(t.dtype))), width or widths(t)[0])


# rounds a tree takes: the CPU routes of the catalog take 1 to 3 (docs/design.md, "Summation
# orders")
ROUNDS = 3


def expected_calls(t: Target, width: int | None = None, rows: int = 1) -> int:
    """Matmul calls the probe is expected to take: ROUNDS rounds of calls_per_round, or with
    ``rows`` > 1 (spread) of 2(K - 1) pairs in the widest group spread_plan would take."""
    if rows == 1:
        return calls_per_round(t, width) * ROUNDS
    chunk, width = chunk_size(t.dtype), width or widths(t)[0]
    best = max((c / group_calls(t.k - c - 1, chunk - c - 1, rows), c)
               for c in range(1, min(width, chunk - 3) + 1))
    return ceil_div(2 * (t.k - 1) * ROUNDS, int(best[0]))


def spread_rows(t: Target) -> int:
    """Rows (columns, by rows) of the other operand, from the entry's on, that a probe spreads
    k's pieces over (Prober._spread); 1 where it reads k in one piece (not fp16 or bf16, or K
    within a chunk), for an mv, or where too few rows are there to take fewer calls."""
    if t.case.op == "mv" or t.form == "2d" or len(chunks(t.k, chunk_size(t.dtype))) < 2:
        return 1
    rows, w = (t.cols - t.col) if t.by_rows else (t.rows - t.row), widths(t)[0]
    return rows if rows >= 3 and expected_calls(t, w, rows) < expected_calls(t, w) else 1


def fuse_calls(tree, k: int, chunk: int, width: int) -> int:
    """Matmul calls fuse makes at most, ``width`` probes a call: a pair per two-child node, one
    probe each; where a probe holds fewer than the ``k`` products (``chunk``, fp16 and bf16), the
    top node's pair again, every product present, one probe per chunk of them."""
    if not isinstance(tree, list):
        return 0
    links = trees.arities(tree).count(2)
    if chunk >= k or len(tree) != 2:
        return ceil_div(links, width)
    return ceil_div(links - 1, width) + ceil_div(len(chunks(k, chunk)), width)


def widths(t: Target) -> list[int]:
    """The probe widths to try, widest first. A kernel may add the columns (rows) of a tail
    tile, or of another thread's block, in another order than the first ones, so the tries keep
    to the prefix of whole tiles of 64, then of 16, then to the first tile of 64 and of 16, and
    last to the entry's own column (row) alone: exact for the entry, at the most calls. (On
    the AVX2 route, `MKL_CBWR=AVX2`, DGEMM's 512 columns of batch-invariance-2 fit no tree,
    its first 64 do.)"""
    pos = t.row if t.by_rows else t.col
    tried = {t.width // 64 * 64, t.width // 16 * 16, 64, 16}
    out = sorted((w for w in tried if pos < w <= t.width), reverse=True) or [t.width]
    return out + [1] if pos == 0 and out[-1] > 1 else out


MAX_CALLS = 4000  # a probe expected to need more is refused (matmul-drift order --max-calls)


def over_budget(t: Target, max_calls: int = MAX_CALLS) -> str | None:
    """Why the probe of ``t`` is not started (its first width would need more than
    ``max_calls`` matmul calls), or None when it fits; later widths are checked as they come."""
    w = widths(t)[0]
    if expected_calls(t, w) <= max_calls:
        return None
    return (f"revealing K = {t.k} over {w} probes a call needs about {expected_calls(t, w)} "
            "matmul calls "
            f"({calls_per_round(t, w)} a round), more than {max_calls}")


def replay_calls(draws: int, width: int) -> int:
    """The matmul calls ``replay`` makes for ``draws`` over ``width`` columns (rows): one where
    they are more than the draws (spread over them), else a call for every ``width`` draws."""
    return 1 if width > draws else ceil_div(draws, width)
