"""The order probe on a real kernel: one case's exact computation (shape, dtype, layout,
device, slice) with A all ones and FPRev's probes in B's columns (order.py has the tree
logic), and the replay that checks a revealed tree against the kernel bit for bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import cases, inputs, measure, order


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
    precision: str = ""  # the dtype plus its matmul flags (cases.PRECISIONS); "" for the dtype alone
    form: str = "as-is"  # A as the case holds it, or "2d": a 1-D A as A.unsqueeze(0) (cases.Case.forms)

    @property
    def by_rows(self) -> bool:
        return self.rows > self.cols

    @property
    def width(self) -> int:
        return max(self.rows, self.cols)

    @property
    def label(self) -> str:
        """The case and its slice as the product reads: ``seed A[:1] @ B``."""
        a = "A.unsqueeze(0)" if self.form == "2d" else f"A[:{self.slice_m}]" if self.slice_m else "A"
        return f"{self.case.id} {a} @ " + (f"B[:, :{self.slice_n}]" if self.slice_n else "B")

    def bytes_needed(self) -> tuple[int, int]:
        """(host, device) bytes the probe needs (memory.probe_bytes): one Prober at a time."""
        from . import memory

        a_shape, b_shape = measure.operand_shapes(self.case, self.device)
        s = self.case.shape(self.device)
        batch = s.batch or 1
        copy = batch * self.k * self.slice_n if self.slice_n and self.case.layout == "copy" else 0
        out = batch * self.rows * self.cols
        return memory.probe_bytes(int(np.prod(a_shape)), int(np.prod(b_shape)) + copy, out, self.k,
                                  widths(self)[0], self.dtype, self.device)

    def computation(self) -> tuple:
        """What the probe's readings depend on: the op, the operands' stored shapes, the slice,
        the precision, the device, A's form and the entry; not the case's name or its inputs (the
        probe writes its own). A view slice as large as the operand is the operand itself."""
        s = self.case.shape(self.device)
        view = self.case.layout != "copy"  # a copy of a whole transposed W is not W
        n = None if self.slice_n == s.n and view else self.slice_n
        m = None if self.slice_m == s.m else self.slice_m
        return (self.case.op, measure.operand_shapes(self.case, self.device), self.case.layout if n else "",
                n, m, self.precision or self.dtype, self.device, self.form, self.row, self.col)


def target(case: cases.Case, precision: str, device: str, slice_n=None, slice_m=None, row=0, col=0,
           form: str = "as-is") -> Target:
    """The case's computation (its full product, or one slice of it) in ``precision`` (a dtype,
    or one with its matmul flags: ``float32-tf32``), A in ``form``; ValueError for bad input,
    measure.Unavailable where the device or precision cannot run here."""
    measure.check_device(device, precision)
    if form not in case.forms:
        raise order.ProbeError(f"form {form!r} is not one of the case's ({', '.join(case.forms)})")
    dtype = cases.storage_dtype(precision)
    s = case.shape(device)
    rows = 1 if case.op == "mv" else slice_m or s.m
    cols = slice_n or s.n
    if not 0 <= row < rows or not 0 <= col < cols:
        raise order.ProbeError(f"entry ({row}, {col}) is outside the {rows} x {cols} output")
    if case.compare_cols and col >= case.compare_cols:
        raise order.ProbeError(f"entry ({row}, {col}): {case.id}'s slices are compared in their first "
                               f"{case.compare_cols} columns; choose a column below {case.compare_cols}")
    order.check(s.k, dtype)
    return Target(case, dtype, device, slice_n, slice_m, row, col, s.k, rows, cols, precision, form)


class Prober:
    """Operands of the target's storage shapes on its device, filled per call: A all ones
    and the probes in B's columns, or (``by_rows``) B all ones and the probes in A's rows."""

    def __init__(self, t: Target, width: int | None = None):
        import torch

        self.t = t
        self.width = width or t.width  # probes a call: the first `width` columns (rows)
        a_shape, b_shape = measure.operand_shapes(t.case, t.device)
        dt = getattr(torch, t.dtype)
        a = (torch.zeros if t.by_rows else torch.ones)(a_shape, dtype=dt, device=t.device)
        b = (torch.ones if t.by_rows else torch.zeros)(b_shape, dtype=dt, device=t.device)
        if t.case.op == "linear":
            b = b.t()  # stored as W (N, K); the product sees W.t() (K, N)
        self.ops = measure.Operands(a, b, t.case.op, t.case.layout)
        self.b0 = b[0] if t.case.op == "bmm" else b  # the (K, N) matrix the read entry uses
        self.a0 = a[0] if t.case.op == "bmm" else a  # its (M, K) matrix (K,) for mv
        self.calls = 0
        _, _, self.base, self.big = order.PROBE[t.dtype]
        self.chunk = order.chunk_size(t.dtype)
        self._buf: np.ndarray | None = None
        self._loaded = 0  # columns (rows) of the operand the last call filled

    def _buffer(self, cols: int) -> np.ndarray:
        """The probes of one call, (K, cols) in float32, zeroed. Kept between calls and only as wide
        as a call needs: first-touching a K x 51000 buffer alone took 1.8 s here."""
        if self._buf is None or self._buf.shape[1] < cols:
            self._buf = np.zeros((self.t.k, cols), dtype=np.float32)
        out = self._buf[:, :cols]
        out.fill(0)
        return out

    def product(self):
        t, ops = self.t, self.ops
        a = ops.a.unsqueeze(0) if t.form == "2d" else ops.a  # a view: the probes' A
        with measure.precision_flags(t.precision or t.dtype):
            if t.slice_n:
                y = ops.product(a, ops.b_cols(t.slice_n))
            elif t.slice_m:
                y = ops.product(a[..., : t.slice_m, :])
            else:
                y = ops.product(a)
        if t.form == "2d":
            y = y.squeeze(0)
        if t.case.op == "bmm":
            y = y[0]
        return y if y.dim() == 1 else y[:, t.col] if t.by_rows else y[t.row]

    def _load(self, values: np.ndarray) -> None:
        import torch

        v = torch.from_numpy(values)
        if self.t.by_rows:
            self.a0[: values.shape[1]].copy_(v.t())
        else:
            self.b0[:, : values.shape[1]].copy_(v)

    def counts(self, pairs: list[tuple[int, int]], within=None, progress=None) -> list[int]:
        """v(i, j) for each pair: the products absorbed with it (those in the two children of the
        node where i and j meet, i and j included). ``within[n]`` (default: all of k) lists the
        leaves pair n can count (order.reveal); base products go there only, in pieces the output
        counts exactly (one piece unless the output is fp16 or bf16), one probe each, and the
        counts are added."""
        sets: dict[int, tuple[list, list[int]]] = {}  # id(leaf list) -> (its pieces, pair numbers)
        within = within or [range(self.t.k)] * len(pairs)
        for n in range(len(pairs)):
            leaves = within[n]
            hit = sets.get(id(leaves))
            if hit is None:
                arr = np.sort(np.asarray(leaves, dtype=np.int64))
                hit = sets[id(leaves)] = ([arr[lo:hi] for lo, hi in order.chunks(len(arr), self.chunk)], [])
            hit[1].append(n)
        # piece-major: neighbouring probes share a piece, so each call fills a few blocks
        probes = [(n, piece) for pieces, ns in sets.values() for piece in pieces for n in ns]
        total = [2] * len(pairs)
        for start in range(0, len(probes), self.width):
            batch = probes[start:start + self.width]
            used = len(batch)
            n_ = np.array([n for n, _ in batch])
            i_ = np.array([pairs[n][0] for n in n_])
            j_ = np.array([pairs[n][1] for n in n_])
            held = np.empty(used, dtype=np.int64)
            buf = self._buffer(max(used, self._loaded))  # columns loaded before are cleared too
            c0 = 0
            while c0 < used:  # runs of columns that share a piece
                piece, c1 = batch[c0][1], c0 + 1
                while c1 < used and batch[c1][1] is piece:
                    c1 += 1
                lo, hi = int(piece[0]), int(piece[-1]) + 1
                if hi - lo == len(piece):
                    buf[lo:hi, c0:c1] = self.base
                else:
                    buf[np.ix_(piece, np.arange(c0, c1))] = self.base
                held[c0:c1] = len(piece) - _member(piece, i_[c0:c1]) - _member(piece, j_[c0:c1])
                c0 = c1
            cols = np.arange(used)
            buf[i_, cols] = self.big
            buf[j_, cols] = -self.big
            self._load(buf)
            self._loaded = used
            y = self.product()
            self.calls += 1
            got = y[:used].double().cpu().numpy() / self.base
            ok = np.isfinite(got) & (got == np.round(got)) & (got >= 0) & (got <= held)
            if not ok.all():
                c = int(np.argmin(ok))
                raise order.NotRevealed(f"probe ({i_[c]}, {j_[c]}) read {got[c]!r} products: not a count (the "
                                        "kernel flushed or reordered by value, or M was not absorbed)")
            for n, h, x in zip(n_, held, got):
                total[n] += int(h) - int(x)
            if progress:
                progress(self.calls)
        return total


def _member(sorted_leaves: np.ndarray, x: np.ndarray) -> np.ndarray:
    """1 where x is one of the sorted leaves, else 0."""
    pos = np.minimum(np.searchsorted(sorted_leaves, x), len(sorted_leaves) - 1)
    return (sorted_leaves[pos] == x).astype(np.int64)


def calls_per_round(t: Target, width: int | None = None) -> int:
    """Matmul calls of one round at most: 2(K - 1) pairs, times the chunks of k, over the
    probes one call holds (a tree of height h takes at most h rounds, usually log2 K)."""
    return -(-2 * (t.k - 1) * len(order.chunks(t.k, order.chunk_size(t.dtype))) // (width or widths(t)[0]))


ROUNDS = 3  # rounds a CPU tree took here: 1 to 3 for every route of the catalog (README)


def expected_calls(t: Target, width: int | None = None) -> int:
    return calls_per_round(t, width) * ROUNDS


def fuse_calls(t: Target, tree, width: int) -> int:
    """Matmul calls order.fuse makes: a pair per two-child node, every chunk of k, ``width`` a call."""
    binary = order.arities(tree).count(2)
    return -(-binary * len(order.chunks(t.k, order.chunk_size(t.dtype))) // width)


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
    return (f"revealing K = {t.k} over {w} probes a call needs about {expected_calls(t, w)} matmul calls "
            f"({calls_per_round(t, w)} a round), more than {max_calls}")


def reveal(t: Target, progress=None, max_calls: int = MAX_CALLS, verify: bool = False) -> order.Reveal:
    """The tree of ``t``'s entry, ``progress(calls, expected)`` after each matmul call (both
    counted over every width tried: the calls so far, and so far plus what this width is
    expected to take); NotRevealed when the readings fit none at every width
    (``widths``) or the next width would need more than ``max_calls``. With ``verify``, a
    tree must also replay bit for bit on 100 draws in the columns (rows) its probes used, or
    the next width is tried: probes spread over columns the kernel adds in different orders
    may yet fit some tree, and the replay is what tells. Before the replay, ``verify`` also
    reads one more pair per two-child node with every product present (order.fuse): a tensor
    core's fused add reads as a chain of them until then, and an fp16 or bf16 output's rounding
    can hide the difference from the replay."""
    t0 = time.perf_counter()
    calls, why, axis = 0, None, "rows" if t.by_rows else "columns"
    for w in widths(t):
        if calls + expected_calls(t, w) > max_calls:
            beyond = f"the next width ({w}) needs about {expected_calls(t, w)} calls, beyond {max_calls}"
            why = f"{why}; {beyond}" if why else beyond
            break
        p = Prober(t, w)
        where = f"probes in {w} {axis}"
        tick = progress and (lambda n, before=calls, w=w: progress(before + n, before + expected_calls(t, w)))
        measured = lambda pairs, within, p=p: p.counts(pairs, within, tick)  # noqa: E731
        try:
            out = order.reveal(measured, t.k)
            # a tensor core's fused add reads as a chain of two-child nodes: one more pair each
            if verify and calls + p.calls + fuse_calls(t, out.tree, w) > max_calls:
                out.notes.append("fused adds not looked for: beyond the call budget")
            elif verify:
                out.tree, pairs, merged = order.fuse(out.tree, measured, t.k)
                out.probes += pairs
                if merged:
                    out.notes.append(f"{order.fused_nodes(out.tree)} fused adds, {merged} links of their chains merged")
        except order.NotRevealed as exc:
            calls += p.calls
            why = f"{exc} ({where})"
            del p
            continue
        # on the probe's own operands (each width has its own); its calls are not probe calls
        out.verified = replay(t, out.tree, width=w, prober=p) if verify else None
        calls += p.calls
        del p  # one set of operands at a time (Target.bytes_needed)
        if verify and out.verified["matched"] != out.verified["draws"]:
            why = (f"the replay matched {out.verified['matched']} of {out.verified['draws']} draws "
                   f"(first mismatch {out.verified['first_mismatch']}; {where})")
            continue
        out.calls, out.seconds, out.width = calls, time.perf_counter() - t0, w
        out.notes.append(f"probes in the first {w} {axis}")
        return out
    exc = order.NotRevealed(why or "no probe width fits the call budget")
    exc.calls = calls
    raise exc


def _products(rng: np.random.Generator, k: int, draws: int, dtype: str) -> np.ndarray:
    """(k, draws) products, exact in the accumulator, that tell summation orders apart even
    through an fp16 or bf16 output: in each draw +L and -L at two random places (FPRev's pair,
    L = 2^13 for an fp32 accumulator, 2^26 for fp64), the others 4-bit values of 1/4 to 16 units
    in L's last place (2^-10, 2^-26), random signs. A product that meets a partial sum holding
    L is rounded to that place, one that does not is kept; once the pair cancels the sum is
    small, so the output's own rounding keeps what the order did. (Values spread over many
    exponents, the draws before, let the largest decide: every tree matched an fp16 kernel.)"""
    acc = order.PROBE[dtype][0]
    big = 2.0**13 if acc == 24 else 2.0**26
    unit = big * 2.0 ** (1 - acc)
    out = rng.choice([-unit, unit], (k, draws))  # in place below: a few k x draws arrays at most (memory.probe_bytes)
    out *= 1 + rng.integers(0, 8, (k, draws)) / 8
    out *= np.exp2(rng.integers(-2, 4, (k, draws)))
    for d in range(draws):
        i, j = rng.choice(k, 2, replace=False)
        out[i, d], out[j, d] = big, -big
    return out


def replay(t: Target, tree, draws: int = 100, seed: int = 0, width: int = 1, prober: Prober | None = None) -> dict:
    """The tree evaluated in numpy (order.evaluate, in the accumulator's precision, rounded once
    to the output dtype) against the kernel's own output, on ``draws`` random inputs whose
    products are exact: each call draws the entry's row of A and the first ``width`` columns of
    B (rows of A and the entry's column of B, by rows), the ones the probes shared, the entry's
    own among them. Writes its draws into ``prober``'s operands (a new Prober's without).
    A tree with fused nodes is tried with each way of order.FUSED to round them (``match``).
    Returns draws, matched, the first mismatch and fused_add (the ways that matched every
    draw; None for a tree of two-child nodes only)."""
    import torch

    p = prober or Prober(t)
    rng = np.random.default_rng(seed)
    dt = getattr(torch, t.dtype)
    products, kernel = np.empty((t.k, draws)), []
    d = 0
    while d < draws:
        w = min(width, draws - d)
        # the shared operand ±2^-2..2^2, the other the products over it: exact, and normal in fp16
        shared = rng.choice([-1.0, 1.0], t.k) * np.exp2(rng.integers(-2, 3, t.k))
        each = _products(rng, t.k, w, t.dtype)
        each /= shared[:, None]
        each = torch.from_numpy(each).to(dt)
        if t.by_rows:  # rows of A (each a draw) against the entry's column of B
            p.a0[:w].copy_(each.t())
            p.b0[:, t.col].copy_(torch.from_numpy(shared).to(dt))
            lhs, rhs = p.a0[:w].double(), p.b0[:, t.col].double()[None, :]
        else:  # the entry's row of A against columns of B
            a_row = p.a0[t.row] if p.a0.dim() == 2 else p.a0
            a_row.copy_(torch.from_numpy(shared).to(dt))
            p.b0[:, :w].copy_(each)
            lhs, rhs = a_row.double()[None, :], p.b0[:, :w].double().t()
        got = p.product()[:w]
        bits = measure.tensor_bits(got)
        kernel += [(int(b), float(v)) for b, v in zip(bits, got.double().cpu().numpy())]
        products[:, d:d + w] = (lhs * rhs).cpu().numpy().T  # exact: 4 bits times a power of two
        d += w
    return match(tree, products, kernel, t.dtype)


def match(tree, products: np.ndarray, kernel: list[tuple[int, float]], dtype: str) -> dict:
    """The tree's sums of ``products`` ((k, draws), exact in the accumulator) against the
    kernel's outputs (bits, value) in ``dtype``: draws, matched and the first mismatch (under
    the first way that matches most draws), and fused_add: for a tree with fused nodes, every
    way of order.FUSED (fp32 accumulators; fp64 rounds exactly) that matches every draw, often
    more than one where the output's rounding hides the accumulator's; None for a tree of
    two-child nodes."""
    acc = np.float64 if dtype == "float64" else np.float32
    fused = order.fused_nodes(tree) > 0
    best, ways = None, []
    for way in order.FUSED if fused and acc is np.float32 else order.FUSED[:1]:
        want = order.evaluate(tree, products, acc, way)  # every draw at once
        want_bits = want.view(np.uint64) if acc is np.float64 else inputs.round_bits(want, dtype)
        matched, first = 0, None
        for i, ((bits, value), w) in enumerate(zip(kernel, want_bits)):
            if int(w) == bits:
                matched += 1
            elif first is None:
                first = {"draw": i, "kernel": value, "tree": float(want[i])}
        if best is None or matched > best["matched"]:
            best = {"draws": len(kernel), "matched": matched, "first_mismatch": first}
        if matched == len(kernel):
            ways.append(way)
    return {**best, "fused_add": ways if fused else None}


def order_of(t: Target, max_calls: int = MAX_CALLS, verify: bool = True, memo: dict | None = None) -> dict:
    """What the probe says of ``t``'s entry: ``probed`` (False where it would need more than
    ``max_calls`` calls), ``tree`` (None unless revealed and, with ``verify``, replayed bit for
    bit on 100 draws), ``order_id`` (12 hex, None unless revealed), ``summary``, ``calls`` (matmul
    calls) and ``reason`` (why not revealed). With ``memo``, a computation already probed there
    (Target.computation) is not probed again: its answer comes back with ``calls`` 0 and ``same_as``,
    the label of the target first probed."""
    key = (t.computation(), max_calls, verify)
    if memo is not None and key in memo:
        return {**memo[key], "calls": 0}
    got = _order_of(t, max_calls, verify)
    if memo is not None:
        memo[key] = {**got, "same_as": t.label}
    return got


def _order_of(t: Target, max_calls: int, verify: bool) -> dict:
    from . import catalog

    out = {"probed": True, "tree": None, "order_id": None, "summary": "not revealed", "calls": 0, "reason": None}
    refused = over_budget(t, max_calls)
    if refused:
        return {**out, "probed": False, "summary": "not probed", "reason": refused}
    try:
        r = reveal(t, max_calls=max_calls, verify=verify)
    except order.NotRevealed as exc:
        return {**out, "calls": exc.calls, "reason": str(exc)}
    return {**out, "calls": r.calls, "tree": r.tree, "order_id": catalog.hex_id(order.order_id(r.tree, t.k)),
            "summary": order.describe(r.tree)}


def _explained(got: dict) -> dict:
    """explain's view: order_id (None unless revealed), then summary, calls and same_as (where
    the computation was probed before, as another target), or the reason."""
    if got["order_id"] is None:
        return {"order_id": None, "reason": got["reason"]}
    return {k: got[k] for k in ("order_id", "summary", "calls", "same_as") if k in got}


def slice_orders(case: cases.Case, dtype: str, device: str, slices: list[tuple[str, int, bool, str]],
                 max_calls: int = MAX_CALLS) -> dict:
    """explain's orders: entry (0, 0) of the full product and of each slice ((kind "n" or "m",
    size, whether its bits drift, A's form), each with its order-id, and a verdict per slice."""
    memo: dict = {}  # a view slice as wide as B is the full product
    full = _explained(order_of(target(case, dtype, device), max_calls, memo=memo))
    out = {"full": full, "slices": []}
    for kind, size, drifts, form in slices:
        t = target(case, dtype, device, size if kind == "n" else None, size if kind == "m" else None, form=form)
        got = _explained(order_of(t, max_calls, memo=memo))
        if got["order_id"] is None or full["order_id"] is None:
            verdict = "order not revealed: " + (got.get("reason") or full.get("reason"))
        elif got["order_id"] == full["order_id"]:
            verdict = ("same order: identical bits expected" if not drifts else
                       "same order, yet the bits differ: the drift is not in the order of entry (0, 0)")
        else:
            verdict = (f"order differs: {full['summary']} (full) vs {got['summary']} (slice)" if drifts else
                       "order differs, yet these inputs give identical bits")
        out["slices"].append({"slice": kind, "size": size, "form": form, "drifts": drifts, **got, "verdict": verdict})
    return out
