"""In which order a matmul adds the K products of one output entry, revealed from outside.

The probe is FPRev's (Xie et al., USENIX ATC 2025): every product is ``base`` (or 0), except
+M at index i and -M at index j, with M so large that M plus any partial sum of the others
rounds back to M in the accumulator. The pair then cancels where the two first meet, and the
output counts the products outside the two children of that node that hold i and j. One
probe per column of B, so one call of the exact shape runs N probes; A is all ones, so every
row is the same probe and the entry's own row is read.

The probe runs one case's exact computation (shape, dtype, layout, device, slice) with A all
ones and the probes in B's columns (``Prober``, on order_plan.py's ``Target``); the tree is
built from its readings in order_tree.py; ``replay`` checks a tree bit for bit against the
kernel on random inputs whose products are exact (the arithmetic in order_replay.py).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from matmul_drift.core import cases, ids, trees, words
from matmul_drift.measure import measure, record
from matmul_drift.probes.order_plan import (
    MAX_CALLS, PROBE, Target, chunk_size, chunks, expected_calls, fuse_calls, over_budget,
    replay_calls, spread_plan, spread_rows, target, widths,
)
from matmul_drift.probes.order_replay import (
    LEAST_NORMAL_EXPONENT, draw_products, match, product_exponents,
)
from matmul_drift.probes.order_tree import NotRevealed, Reveal, fuse, tree_from_pairs


class Prober:
    """Operands of the target's storage shapes on its device, filled per call: A all ones
    and the probes in B's columns, or (``by_rows``) B all ones and the probes in A's rows."""

    def __init__(self, t: Target, width: int | None = None, rows: int = 1):
        self.t = t
        self.width = width or t.width  # probes a call: the first `width` columns (rows)
        # > 1: k's pieces spread over this many rows (columns) of the other operand
        self.rows = rows
        self.used = 0  # the most columns (rows) a call's probes filled
        a_shape, b_shape = record.operand_shapes(t.case, t.device)
        dt = getattr(torch, t.dtype)
        a = (torch.zeros if t.by_rows else torch.ones)(a_shape, dtype=dt, device=t.device)
        b = (torch.ones if t.by_rows else torch.zeros)(b_shape, dtype=dt, device=t.device)
        if t.case.op == "linear":
            b = b.t()  # stored as W (N, K); the product sees W.t() (K, N)
        self.ops = measure.Operands(a, b, t.case.op, t.case.layout)
        self.b0 = b[0] if t.case.op == "bmm" else b  # the (K, N) matrix the read entry uses
        self.a0 = a[0] if t.case.op == "bmm" else a  # its (M, K) matrix (K,) for mv
        self.calls = 0
        _, _, self.base, self.big = PROBE[t.dtype]
        self.chunk = chunk_size(t.dtype)
        self._buf: np.ndarray | None = None
        self._loaded = 0  # columns (rows) of the operand the last call filled
        self._masked = False  # whether _spread left masks in the other operand's rows (columns)

    def _buffer(self, cols: int) -> np.ndarray:
        """The probes of one call, (K, cols) in float32, zeroed. Kept between calls and only as
        wide as a call needs: first-touching a buffer as wide as K x 51000 is slow."""
        if self._buf is None or self._buf.shape[1] < cols:
            self._buf = np.zeros((self.t.k, cols), dtype=np.float32)
        out = self._buf[:, :cols]
        out.fill(0)
        return out

    def product(self):
        """The probed entries: the entry's row of the output (its column, by rows)."""
        y = self._output()
        return y if y.dim() == 1 else y[:, self.t.col] if self.t.by_rows else y[self.t.row]

    def _output(self):
        """The output's first matrix (its vector for mv)."""
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
        return y[0] if t.case.op == "bmm" else y

    def _load(self, values: np.ndarray) -> None:
        v = torch.from_numpy(values)
        if self.t.by_rows:
            self.a0[: values.shape[1]].copy_(v.t())
        else:
            self.b0[:, : values.shape[1]].copy_(v)

    def counts(self, pairs: list[tuple[int, int]], within=None, progress=None) -> list[int]:
        """v(i, j) for each pair: the products absorbed with it (those in the two children of the
        node where i and j meet, i and j included). ``within[n]`` (default: all of k) lists the
        leaves pair n can count (reveal); base products go there only, in pieces the output
        counts exactly (one piece unless the output is fp16 or bf16), one probe each, and the
        counts are added. With ``rows`` > 1, a call reads all the pieces of a probe at once, in
        rows of the other operand (_spread), unless each probe is one piece (as fuse's are)."""
        if self.rows > 1 and (within is None or any(len(w) > self.chunk for w in within)):
            return self._spread(pairs, within, progress)
        if self._masked:  # the entry's row (column) of the other operand back to all ones
            at = self.t.col if self.t.by_rows else self.t.row
            (self.b0[:, at] if self.t.by_rows else self.a0[at]).fill_(1)
            self._masked = False
        sets: dict[int, tuple[list, list[int]]] = {}  # id(leaf list) -> (its pieces, pair numbers)
        within = within or [range(self.t.k)] * len(pairs)
        for n in range(len(pairs)):
            leaves = within[n]
            hit = sets.get(id(leaves))
            if hit is None:
                arr = np.sort(np.asarray(leaves, dtype=np.int64))
                hit = sets[id(leaves)] = ([arr[lo:hi] for lo, hi in chunks(len(arr), self.chunk)],
                                          [])
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
                raise NotRevealed(f"probe ({i_[c]}, {j_[c]}) read {got[c]!r} products: "
                                  "not a count (the kernel flushed or reordered by value, "
                                  "or M was not absorbed)")
            for n, h, x in zip(n_, held, got):
                total[n] += int(h) - int(x)
            self.used = max(self.used, used)
            if progress:
                progress(self.calls)
        return total

    def _spread(self, pairs: list[tuple[int, int]], within, progress) -> list[int]:
        """counts, a group of pairs at a time: the pairs in columns of the probe operand, the
        other's rows masking k. Every row must hold every pair's two places (S, the group's), so
        row 0 holds S alone and row q a piece of the rest with S: a piece's count is row q's less
        row 0's. Each row holds at most a chunk of base products (chunk_size); the group is as wide
        as gives the most pairs a call (spread_plan). The rows share one order (one tile); where
        they do not, the readings contradict or the replay fails, and reveal reads row by row."""
        k = self.t.k
        within = within or [range(k)] * len(pairs)
        masks: dict[int, np.ndarray] = {}  # id(leaf list) -> its leaves as a mask over k
        for w in within:
            if id(w) not in masks:
                masks[id(w)] = np.zeros(k, bool)
                masks[id(w)][np.asarray(w, dtype=np.int64)] = True
        total, n0 = [2] * len(pairs), 0
        while n0 < len(pairs):
            size, pieces = spread_plan(pairs[n0:n0 + self.width],
                                       [masks[id(w)] for w in within[n0:n0 + self.width]],
                                       self.chunk, self.rows)
            ns = range(n0, n0 + size)
            s_ = np.unique([x for n in ns for x in pairs[n]])
            i_ = np.array([pairs[n][0] for n in ns])
            j_ = np.array([pairs[n][1] for n in ns])
            wm = np.stack([masks[id(within[n])] for n in ns], axis=1)  # (k, size)
            buf = self._buffer(max(size, self._loaded))
            buf[:, :size] = np.where(wm, self.base, 0.0)
            cols = np.arange(size)
            buf[i_, cols], buf[j_, cols] = self.big, -self.big
            self._load(buf)
            self._loaded, self.used = size, max(self.used, size)
            # base products of S in each column
            held_s = wm[s_].sum(0) - wm[i_, cols] - wm[j_, cols]
            absorbed = np.zeros(size, np.int64)
            got_s = None
            for q0 in range(0, max(1, len(pieces)), self.rows - 1):  # row 0 alone if no pieces
                part = pieces[q0:q0 + self.rows - 1]
                mask = np.zeros((len(part) + 1, k), np.float32)
                mask[:, s_] = 1
                for q, piece in enumerate(part, 1):
                    mask[q, piece] = 1
                held = np.stack([held_s] + [wm[piece].sum(0) + held_s for piece in part])
                got = self._spread_call(torch.from_numpy(mask), size) / self.base
                if not (np.isfinite(got) & (got == np.round(got)) & (got >= 0)
                        & (got <= held)).all():
                    raise NotRevealed("a spread probe read a value that is not a count (the "
                                      "kernel flushed or reordered by value, or M was not "
                                      "absorbed)")
                got = got.astype(np.int64)
                # each piece's products absorbed, S's taken out
                lost = (held - got) - (held_s - got[0])
                if ((got_s is not None and (got[0] != got_s).any()) or (lost[1:] < 0).any()
                        or (lost[1:] > held[1:] - held_s).any()):
                    raise NotRevealed("the rows of a spread probe disagree: "
                                      "they add in different orders")
                got_s = got[0]
                absorbed += lost[1:].sum(0)
                if progress:
                    progress(self.calls)
            absorbed += held_s - got_s
            for c, n in enumerate(ns):
                total[n] += int(absorbed[c])
            n0 += size
        return total

    def _spread_call(self, mask, cols: int) -> np.ndarray:
        """One call with ``mask`` (rows, k) in the other operand's rows (columns), from the
        entry's on: the readings (rows, cols) in float64."""
        t = self.t
        at, rows = (t.col if t.by_rows else t.row), mask.shape[0]
        if t.by_rows:
            self.b0[:, at:at + rows].copy_(mask.t())
        else:
            self.a0[at:at + rows].copy_(mask)
        self._masked = True
        y = self._output()
        self.calls += 1
        y = y[:cols, at:at + rows].t() if t.by_rows else y[at:at + rows, :cols]
        return y.double().cpu().numpy()


def _member(sorted_leaves: np.ndarray, x: np.ndarray) -> np.ndarray:
    """1 where x is one of the sorted leaves, else 0."""
    pos = np.minimum(np.searchsorted(sorted_leaves, x), len(sorted_leaves) - 1)
    return (sorted_leaves[pos] == x).astype(np.int64)


def reveal(t: Target, progress=None, max_calls: int = MAX_CALLS, verify: bool = False) -> Reveal:
    """The tree of ``t``'s entry, ``progress(calls, expected)`` after each matmul call (both
    counted over every width tried: the calls so far, and so far plus what this width is
    expected to take); NotRevealed when the readings fit none at every width
    (``widths``) or the next width would need more than ``max_calls``. With ``verify``, a
    tree must also replay bit for bit on 100 draws in the columns (rows) its probes used, or
    the next width is tried: probes spread over columns the kernel adds in different orders
    may yet fit some tree, and the replay is what tells. Before the replay, ``verify`` also
    reads one more pair per two-child node, the products beside it present (fuse): a tensor
    core's fused add reads as a chain of them until then, and an fp16 or bf16 output's rounding
    can hide the difference from the replay."""
    t0 = time.perf_counter()
    calls, why, axis = 0, None, "rows" if t.by_rows else "columns"
    other = "columns" if t.by_rows else "rows"
    # first all of k's pieces in one call; where the rows disagree, the one-row tries below
    spread = spread_rows(t)
    tries = [(w, 1) for w in widths(t)]
    for w, rows in ([(tries[0][0], spread)] if spread > 1 else []) + tries:
        expected = expected_calls(t, w, rows)
        if calls + expected > max_calls:
            beyond = f"the next width ({w}) needs about {expected} calls, beyond {max_calls}"
            why = f"{why}; {beyond}" if why else beyond
            break
        p = Prober(t, w, rows)
        where = f"probes in {w} {axis}" + (f", k's pieces in {rows} {other}" if rows > 1 else "")
        tick = progress and (lambda n, before=calls, e=expected: progress(before + n, before + e))
        measured = lambda pairs, within, p=p: p.counts(pairs, within, tick)  # noqa: E731
        try:
            out = tree_from_pairs(measured, t.k)
            # a tensor core's fused add reads as a chain of two-child nodes: one more pair each
            if verify and calls + p.calls + fuse_calls(out.tree, t.k, p.chunk, w) > max_calls:
                out.notes.append("fused adds not looked for: beyond the call budget")
            elif verify:
                out.tree, pairs, merged = fuse(out.tree, measured, t.k, p.chunk)
                out.probes += pairs
                if merged:
                    out.notes.append(f"{trees.fused_nodes(out.tree)} fused adds, "
                                     f"{merged} links of their chains merged")
        except NotRevealed as exc:
            calls += p.calls
            why = f"{exc} ({where})"
            del p
            continue
        # on the probe's own operands (each width has its own); its calls are not probe calls
        used = p.used if rows > 1 else w  # a spread group is narrower than the width
        out.verified = replay(t, out.tree, width=used, prober=p) if verify else None
        calls += p.calls
        del p  # one set of operands at a time (Target.probe_sizes)
        if verify and out.verified["matched"] != out.verified["draws"]:
            why = (f"the replay matched {out.verified['matched']} of {out.verified['draws']} draws "
                   f"(first mismatch {out.verified['first_mismatch']}; {where})")
            continue
        out.calls, out.seconds, out.width = calls, time.perf_counter() - t0, used
        out.notes.append(f"probes in the first {used} {axis}"
                         + (f", k's pieces in {rows} {other}" if rows > 1 else ""))
        return out
    exc = NotRevealed(why or "no probe width fits the call budget")
    exc.calls = calls
    raise exc


def replay(t: Target, tree, draws: int = 100, seed: int = 0, width: int = 1,
           prober: Prober | None = None) -> dict:
    """The tree evaluated in numpy (evaluate, in the accumulator's precision, rounded once
    to the output dtype) against the kernel's own output, on ``draws`` random inputs whose
    products are exact: each call draws the entry's row of A and columns of B (rows of A and the
    entry's column of B, by rows) among the first ``width``, the ones the probes shared: where
    they are more than the draws, spread evenly over them, the entry's own among them (a tail
    tile that adds in another order is replayed too). Writes its draws into ``prober``'s
    operands (a new Prober's without).
    A tree with fused nodes is tried with each way of FUSED to round them (``match``), the
    tensor cores' with the exponents of the operands (product_exponents), not only their products.
    Returns draws, matched, the first mismatch and fused_add (the ways that matched every
    draw; None for a tree of two-child nodes only)."""
    p = prober or Prober(t)
    rng = np.random.default_rng(seed)
    dt = getattr(torch, t.dtype)
    products, kernel = np.empty((t.k, draws)), []
    # a tensor core's fused add aligns each product by its operands' exponents
    exps = (np.empty((t.k, draws), np.int16)
            if trees.fused_nodes(tree) and t.dtype in LEAST_NORMAL_EXPONENT else None)
    if width > draws:
        spread = np.linspace(0, width - 1, draws).round().astype(np.int64)
        own = t.row if t.by_rows else t.col
        spread[np.argmin(np.abs(spread - own))] = own  # over 1 apart: still distinct
        calls = [spread]
    else:
        calls = [np.arange(min(width, draws - d)) for d in range(0, draws, width)]
    d = 0
    for cols in calls:
        w, idx = len(cols), torch.from_numpy(cols)
        # the shared operand ±2^-2..2^2, the other the products over it: exact, and normal in fp16
        shared = rng.choice([-1.0, 1.0], t.k) * np.exp2(rng.integers(-2, 3, t.k))
        each = draw_products(rng, t.k, w, t.dtype)
        each /= shared[:, None]
        each = torch.from_numpy(each).to(dt)
        if t.by_rows:  # rows of A (each a draw) against the entry's column of B
            p.a0[idx] = each.t()
            p.b0[:, t.col].copy_(torch.from_numpy(shared).to(dt))
            lhs, rhs = p.a0[idx].double(), p.b0[:, t.col].double()[None, :]
        else:  # the entry's row of A against columns of B
            a_row = p.a0[t.row] if p.a0.dim() == 2 else p.a0
            a_row.copy_(torch.from_numpy(shared).to(dt))
            p.b0[:, idx] = each
            lhs, rhs = a_row.double()[None, :], p.b0[:, idx].double().t()
        got = p.product()[idx]
        bits = measure.tensor_bits(got)
        kernel += [(int(b), float(v)) for b, v in zip(bits, got.double().cpu().numpy())]
        products[:, d:d + w] = (lhs * rhs).cpu().numpy().T  # exact: 4 bits times a power of two
        if exps is not None:
            exps[:, d:d + w] = product_exponents(lhs.cpu().numpy(), rhs.cpu().numpy(), t.dtype).T
        d += w
    return match(tree, products, kernel, t.dtype, exps)


def order_of(t: Target, max_calls: int = MAX_CALLS, verify: bool = True,
             memo: dict | None = None) -> dict:
    """What the probe says of ``t``'s entry: ``probed`` (False where it would need more than
    ``max_calls`` calls), ``tree`` (None unless revealed and, with ``verify``, replayed bit for
    bit on 100 draws), ``order_id`` (12 hex, None unless revealed), ``summary``, ``calls``
    (matmul calls) and ``reason`` (why not revealed). With ``memo``, a computation already
    probed there (Target.computation) is not probed again: its answer comes back with ``calls``
    0 and ``same_as``, the label of the target first probed. A tree revealed there for the same
    K (``kin``) is replayed first (``adopted``); only where none replays bit for bit is ``t``
    probed."""
    key = (t.computation(), max_calls, verify)
    if memo is not None and key in memo:
        return {**memo[key], "calls": 0}
    got, spent = (adopted(t, memo) if memo is not None and verify and not over_budget(t, max_calls)
                  else (None, 0))
    if got is None:  # the calls of the replays that failed count with the probe's
        got = _order_of(t, max_calls, verify)
        got = {**got, "calls": got["calls"] + spent}
    if memo is not None:
        memo[key] = {**got, "same_as": t.label, "k": t.k}
    return got


# distinct earlier trees replayed before the probe runs: a failed try costs a replay
ADOPT_TRIES = 2


def kin(t: Target, other: tuple) -> int | None:
    """How near an earlier computation (Target.computation) is to ``t`` as a source of its tree:
    0 the same precision and device, 1 fp16 for bf16 and back (one probe reads both), None other."""
    mine, theirs = (t.precision or t.dtype, t.device), (other[5], other[6])
    if theirs == mine:
        return 0
    half = {"float16", "bfloat16"}
    return 1 if theirs[1] == mine[1] and {theirs[0], mine[0]} == half else None


def adopted(t: Target, memo: dict) -> tuple[dict | None, int]:
    """(order_of's dict for a tree revealed earlier in ``memo`` for the same K (nearest ``kin``
    first, ADOPT_TRIES of them) that replays bit for bit on 100 draws of ``t`` (the reveal's own
    test) across the widest prefix it would probe, with ``adopted``: that target's label, or None
    where none does: the probe then reveals ``t``; the matmul calls the replays made). Skinny,
    slice-n-view and the seed share K = 4096; on a CPU without native bf16 one replay costs 1
    call where a reveal costs 20 to 40."""
    found, seen = [], set()
    for (comp, *_), got in memo.items():
        near = kin(t, comp)
        if (near is None or got.get("k") != t.k or got.get("tree") is None
                or got["order_id"] in seen):
            continue
        seen.add(got["order_id"])
        found.append((near, got))
    calls, w = 0, widths(t)[0]
    # stable: the earliest first among equals
    for _, got in sorted(found, key=lambda f: f[0])[:ADOPT_TRIES]:
        r = replay(t, got["tree"], width=w)
        calls += replay_calls(r["draws"], w)
        if r["matched"] == r["draws"]:
            return {"probed": True, "tree": got["tree"], "order_id": got["order_id"],
                    "summary": got["summary"], "calls": calls, "reason": None,
                    "adopted": got.get("adopted") or got["same_as"]}, calls
    return None, calls


def _order_of(t: Target, max_calls: int, verify: bool) -> dict:

    out = {"probed": True, "tree": None, "order_id": None, "summary": "not revealed", "calls": 0,
           "reason": None}
    refused = over_budget(t, max_calls)
    if refused:
        return {**out, "probed": False, "summary": "not probed", "reason": refused}
    try:
        r = reveal(t, max_calls=max_calls, verify=verify)
    except NotRevealed as exc:
        return {**out, "calls": exc.calls, "reason": str(exc)}
    return {**out, "calls": r.calls, "tree": r.tree,
            "order_id": ids.hex_id(trees.order_id(r.tree, t.k)),
            "summary": words.describe(r.tree)}


def _explained(got: dict) -> dict:
    """explain's view: order_id (None unless revealed), then summary, calls and same_as (where
    the computation was probed before, as another target), or the reason."""
    if got["order_id"] is None:
        return {"order_id": None, "reason": got["reason"]}
    return {k: got[k] for k in ("order_id", "summary", "calls", "same_as", "adopted") if k in got}


def slice_orders(case: cases.Case, dtype: str, device: str,
                 slices: list[tuple[str, int, bool, str]],
                 max_calls: int = MAX_CALLS) -> dict:
    """explain's orders: entry (0, 0) of the full product and of each slice ((kind "n" or "m",
    size, whether its bits drift, A's form), each with its order-id, and a verdict per slice."""
    memo: dict = {}  # a view slice as wide as B is the full product
    full = _explained(order_of(target(case, dtype, device), max_calls, memo=memo))
    out = {"full": full, "slices": []}
    for kind, size, drifts, form in slices:
        t = target(case, dtype, device, size if kind == "n" else None,
                   size if kind == "m" else None, form=form)
        got = _explained(order_of(t, max_calls, memo=memo))
        if got["order_id"] is None or full["order_id"] is None:
            verdict = "order not revealed: " + (got.get("reason") or full.get("reason"))
        elif got["order_id"] == full["order_id"]:
            verdict = ("same order: identical bits expected" if not drifts else
                       "same order, yet the bits differ: "
                       "the drift is not in the order of entry (0, 0)")
        else:
            verdict = (f"order differs: {full['summary']} (full) vs {got['summary']} (slice)"
                       if drifts else
                       "order differs, yet these inputs give identical bits")
        out["slices"].append({"slice": kind, "size": size, "form": form, "drifts": drifts, **got,
                              "verdict": verdict})
    return out
