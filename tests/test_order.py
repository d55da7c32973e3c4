"""The order fingerprint: the tree builder against hand-built trees (a simulated probe that
answers from the tree itself), the probe and the replay against this machine's kernels."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from matmul_drift.core import ids, trees
from matmul_drift.core.words import describe
from matmul_drift.probes import order, order_plan, order_replay, order_tree


def simulated(tree):
    """measure_pairs answering from ``tree`` as an exact probe reads: v(i, j) = |child holding i| +
    |child holding j|, of those products only the ones the probe holds (``within``, i and j always)."""
    parent, span = {}, {}
    pos = {leaf: n for n, leaf in enumerate(trees.leaves(tree))}  # every node's products: an interval of these
    at = trees.fold(tree, lambda leaf: (pos[leaf], pos[leaf] + 1), lambda kids: (kids[0][0], kids[-1][1]))
    stack = [(tree, None)]
    while stack:
        node, par = stack.pop()
        key = ("n", id(node)) if isinstance(node, list) else ("l", node)
        parent[key], span[key] = par, at(node)
        if isinstance(node, list):
            stack.extend((c, key) for c in node)

    def up(key):
        out = [key]
        while parent[out[-1]] is not None:
            out.append(parent[out[-1]])
        return out

    def children(i, j):
        ci, cj = up(("l", i)), up(("l", j))
        at_ = {key: b for b, key in enumerate(cj)}
        for a, key in enumerate(ci):
            if key in at_:
                return ci[a - 1], cj[at_[key] - 1], key

    def held(pairs, within):
        """per pair: a function counting the products the probe holds in an interval, less i and j
        where it holds them (2 then for a pair's two children)"""
        seen = {}
        for (i, j), w in zip(pairs, within or [None] * len(pairs)):
            if w is None:
                yield lambda *spans: sum(hi - lo for lo, hi in spans) - 2
                continue
            ws = seen.setdefault(id(w), np.sort([pos[x] for x in w]))
            inside = int(np.isin([pos[i], pos[j]], ws).sum())
            yield lambda *spans, ws=ws, inside=inside: sum(
                int(np.searchsorted(ws, hi) - np.searchsorted(ws, lo)) for lo, hi in spans) - inside

    def measure(pairs, within):
        out = []
        for (i, j), count in zip(pairs, held(pairs, within)):
            a, b, _ = children(i, j)
            out.append(2 + count(span[a], span[b]))
        return out

    measure.children, measure.held, measure.span = children, held, span
    return measure


def seq(parts):
    t = parts[0]
    for x in parts[1:]:
        t = [t, x]
    return t


def pw(parts):
    while len(parts) > 1:
        parts = [[parts[i], parts[i + 1]] for i in range(0, len(parts), 2)]
    return parts[0]


K = 64
TREES = {
    "sequential": (seq(list(range(K))), "sequential"),
    "pairwise": (pw(list(range(K))), "pairwise"),
    "lanes": (pw([seq(list(range(lane, K, 8))) for lane in range(8)]), "8 lanes × 8 sequential; lanes then pairwise"),
    # a horizontal reduction adds lane 4 to lane 0 first: lanes still, not "8 chunks of 8" (contiguous products)
    "lanes, upper half first": (pw([seq(list(range(lane, K, 8))) for lane in (0, 4, 2, 6, 1, 5, 3, 7)]),
                                "8 lanes × 8 sequential; lanes then pairwise"),
    "chunks": (seq([pw([seq(list(range(c * 16 + lane, c * 16 + 16, 4))) for lane in range(4)]) for c in range(4)]),
               "4 chunks of 16; each: 4 lanes × 4 sequential; lanes then pairwise; chunks sequential"),
    "fused": (seq([list(range(g, g + 4)) for g in range(0, K, 4)]),
              "16 chunks of 4; each: fused group of 4; chunks sequential"),
    # a loop run backwards, or from midway: canonical order puts its running sum second, which
    # read as "2 chunks of 1..63; each: varied; chunks added"
    "right-deep": ((lambda f: f(f, 0))(lambda f, i: i if i == K - 1 else [i, f(f, i + 1)]),
                   "sequential (out of index order)"),
    "sequential from midway": (seq([*range(K // 2, K), *range(K // 2)]), "sequential (out of index order)"),
    # 0 + 32, 1 + 33, ...: another tree than pairwise in index order, which it read the same as
    "pairwise across halves": (pw([k for i in range(K // 2) for k in (i, i + K // 2)]), "pairwise (out of index order)"),
    # a tail block added apart from the rest (as 00934f1eb43f of the catalog): no run of neighbours;
    # their sizes in index order (it read "2 parts of 4..60; each: varied; parts added")
    "a block apart": ([seq([*range(56), *range(60, 64)]), seq(list(range(56, 60)))], "2 parts of 60 and 4; each: sequential; parts added"),
    "chunks from the last": (seq([seq(list(range(c, c + 16))) for c in (48, 32, 16, 0)]),
                             "4 chunks of 16; each: sequential; chunks sequential"),
}


def test_the_trees_replays_and_plans_import_without_torch():
    """Only order.py, the Prober on a kernel, needs torch: the tree's inference, the replay's
    arithmetic and the call budget are read by torch-free code and tests."""
    import subprocess
    import sys

    code = ("import sys; from matmul_drift.probes import order_plan, order_replay, order_tree; "
            "print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout.strip()) == (0, "False"), p.stderr[-2000:]


@pytest.mark.parametrize("name", list(TREES))
def test_hand_built_trees_are_revealed_exactly(name):
    tree, words = TREES[name]
    got = order_tree.tree_from_pairs(simulated(tree), K)
    assert got.tree == trees.canonical(tree)
    assert got.rounds <= 2 * K.bit_length()
    if words:
        assert describe(got.tree) == words


def lanes(n, k, into_first=(), start=0):
    """A SIMD loop's n partial sums over products start..start+k-1, product start + i in lane
    i mod n, each lane a sequential chain (a lane of one product is that product);
    ``into_first``: products then added to lane 0 one at a time (a scalar loop's remainder)."""
    return [seq([*range(start + lane, start + k, n), *(into_first if lane == 0 else ())]) for lane in range(n)]


def hreduce(parts):
    """A horizontal reduction: lane i + lane i + n/2, then again over the first half."""
    while len(parts) > 1:
        parts = [[parts[i], parts[i + len(parts) // 2]] for i in range(len(parts) // 2)]
    return parts[0]


def folded_lanes(k):
    """fp64 64xKx1 on a Xeon (torch 2.13.0+cpu): 16 lanes (k // 16 * 16 products), lane i + 8 added to
    lane i, the K mod 16 (at most 8) products left over added to lanes 0, 1, ... one each, then the 8 lanes
    pairwise."""
    full = k - k % 16
    eight = [[seq(list(range(i, full, 16))), seq(list(range(i + 8, full, 16)))] for i in range(8)]
    for lane, p in enumerate(range(full, k)):
        eight[lane] = [eight[lane], p]
    return pw([eight[i] for i in (0, 2, 1, 3, 4, 6, 5, 7)])


# K no multiple of the lanes: lanes of two sizes, so two shapes. They read "2 lanes × 18..19
# varied; lanes then added", "2 parts of 2..8; each: varied; parts added", "2 chunks of 1..36; ..."
UNEVEN_LANES = {
    "4 lanes, K = 10, pairwise": (hreduce(lanes(4, 10)), "4 lanes × 2..3 sequential; lanes then pairwise"),
    "8 lanes, K = 37, pairwise": (hreduce(lanes(8, 37)), "8 lanes × 4..5 sequential; lanes then pairwise"),
    "16 lanes, K = 33, pairwise": (hreduce(lanes(16, 33)), "16 lanes × 2..3 sequential; lanes then pairwise"),
    "16 lanes, K = 17, pairwise": (hreduce(lanes(16, 17)), "16 lanes × 1..2 sequential; lanes then pairwise"),
    "4 lanes, K = 10, sequential": (seq(lanes(4, 10)), "4 lanes × 2..3 sequential; lanes then sequential"),
    "8 lanes, K = 17, sequential": (seq(lanes(8, 17)), "8 lanes × 2..3 sequential; lanes then sequential"),
    # lanes that read otherwise: lane 0 pairwise, the others sequential
    "varied lanes": (hreduce([[[0, 4], [8, 12]], *lanes(4, 12)[1:]]), "4 lanes × 3..4 varied; lanes then pairwise"),
    "chunks of uneven lanes": (seq([hreduce(lanes(4, 10, start=c)) for c in (0, 10, 20)]),
                               "3 chunks of 10; each: 4 lanes × 2..3 sequential; lanes then pairwise; chunks sequential"),
    # a scalar loop adds the K mod n products left over to the lanes' sum
    "remainder after 8 lanes pairwise": (seq([hreduce(lanes(8, 32)), *range(32, 37)]),
                                         "8 lanes × 4 sequential; lanes then pairwise; then 5 more products sequential"),
    "remainder after 4 lanes sequential": (seq([seq(lanes(4, 8)), 8, 9]),
                                           "4 lanes × 2 sequential; lanes then sequential; then 2 more products sequential"),
    "one left over": (seq([hreduce(lanes(8, 24)), 24]), "8 lanes × 3 sequential; lanes then pairwise; then 1 more product"),
    # lanes of two products added pairwise are a pairwise tree: read so
    "remainder after lanes of 2": (seq([hreduce(lanes(4, 8)), 8]), "pairwise (out of index order); then 1 more product"),
    # ... or to lane 0, before the lanes are added (fp16 and bf16 on a Xeon with torch 2.13.0+cpu)
    "remainder into lane 0": (seq(lanes(4, 8, into_first=(8, 9))),
                              "4 lanes × 2 sequential, then 2 more products into lane 0; lanes then sequential"),
    "remainder into lane 0, pairwise": (hreduce(lanes(8, 32, into_first=range(32, 37))),
                                        "8 lanes × 4 sequential, then 5 more products into lane 0; lanes then pairwise"),
    # ... or one each to the first lanes, on top (fp64 64xKx1 on that Xeon): they read "8 lanes × 4..5
    # varied; lanes then pairwise", as the lanes with one more product read otherwise
    "remainder one each into lanes 0..4": (folded_lanes(37), "8 lanes × 4 pairwise (out of index order), then 1 more "
                                                              "product into each of lanes 0..4; lanes then pairwise"),
    "remainder into lane 0 on top": (folded_lanes(65), "8 lanes × 8 [2 parts of 4; each: sequential; parts sequential], "
                                                       "then 1 more product into lane 0; lanes then pairwise"),
    # ... or one into every lane (fp64 64x1000x1 there): a lanes' reading with parts of its own is bracketed
    # (it ran on: "8 lanes × 125 2 parts of 62; each: ...; then 1 more product; lanes then pairwise")
    "remainder one into every lane": (folded_lanes(1000), "8 lanes × 125 [2 parts of 62; each: sequential; parts "
                                                          "sequential; then 1 more product]; lanes then pairwise"),
}


def revealed_reads(tree, words):
    """The probe, simulated over ``tree``, finds it, and describe reads it as ``words``."""
    got = order_tree.tree_from_pairs(simulated(tree), len(trees.leaves(tree)))
    assert got.tree == trees.canonical(tree)
    assert describe(got.tree) == words


@pytest.mark.parametrize("name", list(UNEVEN_LANES))
def test_lanes_of_two_sizes_read_as_lanes(name):
    revealed_reads(*UNEVEN_LANES[name])


def test_lanes_of_two_sizes_are_read_without_recursion():
    k = 4 * 3000 + 5  # lanes 3000 deep, past Python's recursion limit; 5 left over
    assert describe(trees.canonical(hreduce(lanes(8, k)))) == "8 lanes × 1500..1501 sequential; lanes then pairwise"
    assert (describe(trees.canonical(seq(lanes(4, k - 5, into_first=range(k - 5, k)))))
            == "4 lanes × 3000 sequential, then 5 more products into lane 0; lanes then sequential")
    assert (describe(trees.canonical(seq([seq(lanes(4, k - 5)), *range(k - 5, k)])))
            == "4 lanes × 3000 sequential; lanes then sequential; then 5 more products sequential")


def seeded_lanes(k, n, rest=None):
    """Product 0 first into lane 0 of n lanes over 1..nq (q = (k - 1) // n), added by a horizontal
    reduction; that sum then first into lane 0 of ``rest`` lanes over the products left (a lane left
    empty drops out), added so too, or, where ``rest`` is None, those products added one at a time.
    fp32 64xKx1 on a Xeon with torch 2.13.0+cpu or 2.14.1+cu130 (MKL's matrix-vector kernel): n = 16,
    rest = 8 (at every K revealed there, 2..20 and 31..4096); under MKL_CBWR=COMPATIBLE n = 4, and n = 2
    for fp64."""
    def stage(first, lo, hi, n):
        parts = [seq([first, *range(lo, hi, n)]) if i == 0 else seq(list(range(lo + i, hi, n))) if lo + i < hi else None
                 for i in range(n)]
        while len(parts) > 1:
            parts = [a if b is None else [a, b] for a, b in zip(parts[:len(parts) // 2], parts[len(parts) // 2:])]
        return parts[0]

    left = 1 + (k - 1) // n * n  # the first product left over
    s = stage(0, 1, left, n) if left > 1 else 0
    if rest is None:
        return seq([s, *range(left, k)])
    return stage(s, left, k, rest) if left < k else s


# A running sum carried from one run of products into the first product (lane 0) of the next: they read
# as towers of parts, "2 parts of 4089 [2 parts of 4085 [2 parts of 4083 [2 chunks of 4082 [..." (375
# characters at K = 4096), as no lanes reading fits lane 0 holding the sum before it.
RUNS = "product 0, then 2 runs, the sum so far added first to each one's first product: "
RUN = "product 0, then 1 run, the sum so far added first to its first product: "
SEEDED_LANES = {
    "K = 4096": (seeded_lanes(4096, 16, 8), RUNS + "1..4080 [16 lanes × 255 sequential; lanes then pairwise], "
                                                   "4081..4095 [8 lanes × 1..2 sequential; lanes then pairwise]"),
    "K = 63": (seeded_lanes(63, 16, 8), RUNS + "1..48 [16 lanes × 3 sequential; lanes then pairwise], "
                                               "49..62 [8 lanes × 1..2 sequential; lanes then pairwise]"),
    # 8 lanes of one product or none added pairwise: 4 lanes of two, a pairwise tree, a sequential one
    "K = 1000": (seeded_lanes(1000, 16, 8), RUNS + "1..992 [16 lanes × 62 sequential; lanes then pairwise], "
                                                   "993..999 [4 lanes × 1..2 sequential; lanes then pairwise]"),
    "K = 37": (seeded_lanes(37, 16, 8), RUNS + "1..32 [pairwise (out of index order)], 33..36 [pairwise (out of index order)]"),
    "K = 100": (seeded_lanes(100, 16, 8), RUNS + "1..96 [16 lanes × 6 sequential; lanes then pairwise], "
                                                 "97..99 [sequential (out of index order)]"),
    "K = 65, one run": (seeded_lanes(65, 16, 8), RUN + "1..64 [16 lanes × 4 sequential; lanes then pairwise]"),
    "K = 10, 8 lanes only": (seeded_lanes(10, 16, 8), RUN + "1..9 [8 lanes × 1..2 sequential; lanes then pairwise]"),
    "K = 19, a remainder on top": (seeded_lanes(19, 16, 8), RUN + "1..16 [pairwise (out of index order)]; "
                                                                  "then 2 more products sequential"),
    "MKL_CBWR=COMPATIBLE, K = 100": (seeded_lanes(100, 4), RUN + "1..96 [4 lanes × 24 sequential; lanes then pairwise]; "
                                                                 "then 3 more products sequential"),
}


@pytest.mark.parametrize("name", list(SEEDED_LANES))
def test_a_running_sum_into_lane_0_of_each_run_reads_as_runs(name):
    revealed_reads(*SEEDED_LANES[name])
    assert sizes_add_up(SEEDED_LANES[name][1], len(trees.leaves(SEEDED_LANES[name][0])))


def test_a_first_product_into_a_chain_or_among_no_neighbours_keeps_its_reading():
    # a run that product 0 goes into read as a chain ("1..4 [sequential (out of index order)]") says less
    assert describe(trees.canonical([[0, 1], [[2, 3], 4]])) == "2 chunks of 2 and 3; each: sequential; chunks added"
    # a run is named by its first and last products: a lane's products are no run ("2..8 [pairwise]")
    assert (describe(trees.canonical(seq([[[[0, 2], 6], [4, 8]], seq([1, 3, 5, 7, 9])])))
            == "2 lanes of 5 [2 parts of 3 and 2; each: sequential; parts added] and 5 [sequential]; lanes then sequential")


def blocks(k, size, each):
    """A blocked loop's chunks over products 0..k-1: runs of ``size`` neighbours, the last one
    short where k is no multiple of size, each summed by ``each`` (seq, pw, ...) of its products."""
    return [each(list(range(c, min(c + size, k)))) for c in range(0, k, size)]


def running_blocks(k, size, first, steps, odd=None):
    """A running sum over blocks of ``size`` neighbouring products: ``first`` (a tree over
    0..size-1) seeds it, then each later full block is added in ``steps`` (trees over offsets in
    the block, each offset once), in that order (``odd``: {block start: other steps}); the k mod
    size last products added one at a time."""
    def shift(t, b):
        return [shift(c, b) for c in t] if isinstance(t, list) else t + b

    s = first
    for b in range(size, k - k % size, size):
        for step in (odd or {}).get(b, steps):
            s = [s, shift(step, b)]
    return seq([s, *range(k - k % size, k)]) if k % size else s


XEON_FIRST, XEON_STEPS = [[[0, 2], [1, 3]], [[4, 6], [5, 7]]], [6, 4, [5, 7], [[0, 2], [1, 3]]]
XEON_37_WORDS = ("4 blocks of 8: the first pairwise (out of index order), then each of the 3 others added to the running "
                 "sum in 4 steps (offsets in the block): 6, 4, 5+7, (0+2)+(1+3); then 5 more products sequential")


# K no multiple of the block: chunks of two sizes, so two shapes. They read "2 chunks of 4..96;
# each: varied; chunks added" (the full chunks, then the short one), "2 chunks of 12..16; ..."
SHORT_CHUNKS = {
    "short last chunk, sequential": (seq(blocks(100, 32, seq)), "3 chunks of 32 and 1 of 4; each: sequential; chunks sequential"),
    "short last chunk, chunks added last first": (seq(blocks(100, 32, seq)[::-1]),
                                                  "3 chunks of 32 and 1 of 4; each: sequential; chunks sequential"),
    "short last chunk, pairwise": (pw(blocks(28, 8, pw)), "3 chunks of 8 and 1 of 4; each: pairwise; chunks pairwise"),
    # chunks of lanes: the short chunk's 2 lanes of 2 products alone read "pairwise (out of index
    # order)"; read as the others are, their sizes merged
    "chunks of 2 lanes": (seq([seq(lanes(2, min(32, 100 - c), start=c)) for c in range(0, 100, 32)]),
                          "3 chunks of 32 and 1 of 4; each: 2 lanes × 2..16 sequential; lanes then sequential; chunks sequential"),
    "chunks of 8 lanes": (seq([hreduce(lanes(8, min(32, 76 - c), start=c)) for c in range(0, 76, 32)]),
                          "2 chunks of 32 and 1 of 12; each: 8 lanes × 1..4 sequential; lanes then pairwise; chunks sequential"),
    "chunks of 8 lanes, pairwise": (pw([hreduce(lanes(8, min(32, 108 - c), start=c)) for c in range(0, 108, 32)]),
                                    "3 chunks of 32 and 1 of 12; each: 8 lanes × 1..4 sequential; lanes then pairwise; chunks pairwise"),
    # chunks that read otherwise: each named (it read "2 chunks of 16 and 1 of 4; each: varied; ...")
    "varied chunks": (seq([pw(list(range(16))), seq(list(range(16, 32))), seq(list(range(32, 36)))]),
                      "3 chunks of 16 [pairwise], 16 [sequential] and 4 [sequential]; chunks sequential"),
    # a last chunk of one product is a remainder (it read "2 chunks of 1..16; each: varied; chunks added")
    "one more product": (seq([*blocks(16, 8, seq), 16]), "2 chunks of 8; each: sequential; chunks sequential; then 1 more product"),
}


@pytest.mark.parametrize("name", list(SHORT_CHUNKS))
def test_chunks_of_two_sizes_read_as_chunks(name):
    revealed_reads(*SHORT_CHUNKS[name])


def test_chunks_of_two_sizes_in_one_fused_add():
    # one fused add of chunks (it read "3 chunks of 4..8; each: varied; chunks fused into one
    # rounding"), and a fused group with one product after it ("2 chunks of 1..4; ...")
    assert (describe(trees.canonical(blocks(20, 8, seq)))
            == "2 chunks of 8 and 1 of 4; each: sequential; chunks fused into one rounding")
    assert describe([[0, 1, 2, 3], 4]) == "fused group of 4; then 1 more product"


def test_chunks_of_two_sizes_are_read_without_recursion():
    k = 3 * 3000 + 5  # chunks 3000 deep, past Python's recursion limit; a last one of 5
    assert describe(trees.canonical(seq(blocks(k, 3000, seq)))) == "3 chunks of 3000 and 1 of 5; each: sequential; chunks sequential"
    rest = [seq(list(range(3000))), pw(list(range(3000, 3004)))]
    assert (describe(trees.canonical(seq([rest, *range(3004, 3009)])))
            == "2 chunks of 3000 [sequential] and 4 [pairwise]; chunks added; then 5 more products sequential")


# A running sum over blocks of neighbouring products, the first block seeding it and each later one
# added in the same steps (a product, or a sum of some of the block's, at the same offsets): they
# read as towers, "2 parts of 28 [2 parts of 26 [2 parts of 25 [2 parts of 20 [..." down to depth 4.
RUNNING_BLOCKS = {
    # fp32 1x37x64 on a Xeon with torch 2.13.0+cpu, as revealed
    "Xeon, K = 37": (trees.from_json("[[[[[[[[[[[[[[[[[[[[0,2],[1,3]],[[4,6],[5,7]]],14],12],[13,15]],[[8,10],[9,11]]],22],20],"
                                     "[21,23]],[[16,18],[17,19]]],30],28],[29,31]],[[24,26],[25,27]]],32],33],34],35],36]"),
                     XEON_37_WORDS),
    "blocks of 6, a fused step": (running_blocks(32, 6, seq(list(range(6))), [5, [0, 1, 2], [3, 4]]),
                                  "5 blocks of 6: the first sequential, then each of the 4 others added to the running sum in "
                                  "3 steps (offsets in the block): 5, 0+1+2, 3+4; then 2 more products sequential"),
    # one block after the first (fp32 1x16..23x64 on the Xeon above): it read as a tower, "2 parts
    # of 12 [2 parts of 10 [pairwise (out of index order); then 2 more products ...] and 2
    # [sequential]; parts added] and 4 [pairwise (out of index order)]; parts added; then ..."
    "Xeon, K = 21": (running_blocks(21, 8, XEON_FIRST, XEON_STEPS),
                     "2 blocks of 8: the first pairwise (out of index order), then the second added to the running "
                     "sum in 4 steps (offsets in the block): 6, 4, 5+7, (0+2)+(1+3); then 5 more products sequential"),
    "two blocks of 6, a fused step": (running_blocks(12, 6, seq(list(range(6))), [5, [0, 1, 2], [3, 4]]),
                                      "2 blocks of 6: the first sequential, then the second added to the running sum in "
                                      "3 steps (offsets in the block): 5, 0+1+2, 3+4"),
    # a step of more than 4 products: its offsets and its reading
    "blocks of 20, a long step": (running_blocks(80, 20, seq(list(range(20))), [pw(list(range(16))), [16, 18], [17, 19]]),
                                  "4 blocks of 20: the first sequential, then each of the 3 others added to the running sum in "
                                  "3 steps (offsets in the block): 0..15 [pairwise], 16+18, 17+19"),
}


@pytest.mark.parametrize("name", list(RUNNING_BLOCKS))
def test_a_running_sum_over_blocks_reads_as_blocks(name):
    tree, words = RUNNING_BLOCKS[name]
    revealed_reads(tree, words)
    assert blocks_add_up(words, len(trees.leaves(tree)))


def test_a_running_sum_over_blocks_is_read_without_recursion():
    # the Xeon's blocks at K = 4096: a chain 2044 deep, past Python's recursion limit
    tree = trees.canonical(running_blocks(4096, 8, XEON_FIRST, XEON_STEPS))
    assert trees.canonical(running_blocks(37, 8, XEON_FIRST, XEON_STEPS)) == RUNNING_BLOCKS["Xeon, K = 37"][0]
    words = describe(tree)
    assert words == ("512 blocks of 8: the first pairwise (out of index order), then each of the 511 others added to the "
                     "running sum in 4 steps (offsets in the block): 6, 4, 5+7, (0+2)+(1+3)")
    assert blocks_add_up(words, 4096)
    assert (describe(trees.canonical(running_blocks(4099, 8, XEON_FIRST, XEON_STEPS)))
            == words + "; then 3 more products sequential")


def test_blocks_that_break_the_pattern_keep_their_reading():
    # one block added in another order (4 before 6): no period of 8, but two blocks of 16, the
    # first two of 8 (bracketed: its reading holds a ':'). It read as a tower, "2 parts of 28 [2
    # parts of 26 [2 parts of 25 [2 parts of 20 [2 parts of 2..18; each: ...; parts added] and 4 ..."
    broken = running_blocks(37, 8, XEON_FIRST, XEON_STEPS, odd={16: [4, 6, [5, 7], [[0, 2], [1, 3]]]})
    words = describe(trees.canonical(broken))
    assert words == (
        "2 blocks of 16: the first [2 blocks of 8: the first pairwise (out of index order), then the second added to the "
        "running sum in 4 steps (offsets in the block): 6, 4, 5+7, (0+2)+(1+3)], then the second added to the running sum "
        "in 8 steps (offsets in the block): 4, 6, 5+7, (0+2)+(1+3), 14, 12, 13+15, (8+10)+(9+11); then 5 more products sequential")
    assert blocks_add_up(words, 37)
    # one block after the first added in one step is two chunks added; a sum and its last products
    # added one at a time keep the remainder's reading
    assert describe([seq(list(range(8))), pw(list(range(8, 16)))]) == "2 chunks of 8 [sequential] and 8 [pairwise]; chunks added"
    assert (describe(trees.canonical(seq([pw(list(range(4))), [4, 5], 6, 7])))
            == "3 chunks of 2; each: sequential; chunks sequential; then 2 more products sequential")


def blocks_add_up(words: str, total: int) -> bool:
    """Assert that a blocks reading's N blocks of B and the products added after them ("; then 5
    more products") make ``total``, and that its steps' offsets ("6", "5+7", "0..15 [its reading]")
    are 0..B-1, each once; False where the words name no blocks."""
    while words != (words := re.sub(r" ?\[[^][]*\]", "", words)):  # the readings bracketed, inner first
        pass
    got = re.fullmatch(r"([0-9]+) blocks of ([0-9]+): .* in ([0-9]+) steps? \(offsets in the block\): (.*?)"
                       r"(?:; then (?:([0-9]+) more products sequential|(1) more product))?", words)
    if got is None:
        return False
    n, b, m = int(got.group(1)), int(got.group(2)), int(got.group(3))
    assert n * b + int(got.group(5) or got.group(6) or 0) == total, words
    steps = got.group(4).split(", ")
    offsets = [o for st in steps for o in (range(int(st.split("..")[0]), int(st.split("..")[1]) + 1) if ".." in st
                                          else map(int, re.findall("[0-9]+", st)))]
    assert len(steps) == m and sorted(offsets) == list(range(b)), words
    return True


# Two or three parts of two sizes that share no reading: each one's size and reading, in index
# order, the reading bracketed (it holds ';'); they read "... varied ...", which hid them.
FEW_PARTS = {
    # a full chunk of 2 lanes and a short one (bf16, K = 36 on a CPU that blocks K by 32)
    "a chunk and a short one": (seq([seq(lanes(2, 32)), seq(lanes(2, 4, start=32))]),
                                "2 chunks of 32 [2 lanes × 16 sequential; lanes then sequential] and 4 "
                                "[pairwise (out of index order)]; chunks added"),
    "nested": (seq([hreduce(lanes(2, 32)), seq(lanes(2, 4, start=32)), pw(list(range(36, 44)))]),
               "2 chunks of 36 [2 chunks of 32 [2 lanes × 16 sequential; lanes then sequential] and 4 [pairwise "
               "(out of index order)]; chunks added] and 8 [pairwise]; chunks added"),
    "2 lanes": (hreduce([pw([0, 2, 4, 6]), seq([1, 3, 5])]), "2 lanes of 4 [pairwise] and 3 [sequential]; lanes then sequential"),
    "3 lanes": (seq([pw([0, 3, 6, 9]), seq([1, 4, 7]), seq([2, 5, 8])]),
                "3 lanes of 4 [pairwise], 3 [sequential] and 3 [sequential]; lanes then sequential"),
    "a lane with a product more": (seq([seq([pw([0, 2, 4, 6]), 8]), seq([1, 3, 5, 7])]),
                                   "2 lanes of 5 [pairwise; then 1 more product] and 4 [sequential]; lanes then sequential"),
    # parts of one size that read otherwise: they read as the first one ("2 chunks of 8; each: sequential")
    "one size": ([seq(list(range(8))), pw(list(range(8, 16)))], "2 chunks of 8 [sequential] and 8 [pairwise]; chunks added"),
    "one size, lanes": (seq([seq([0, 2, 4, 6]), pw([1, 3, 5, 7])]),
                        "2 lanes of 4 [sequential] and 4 [pairwise]; lanes then sequential"),
    # two chunks that read alike: their sizes in index order (it read "2 chunks of 4..28; each: varied")
    "alike": ([seq(list(range(28))), seq(list(range(28, 32)))], "2 chunks of 28 and 4; each: sequential; chunks added"),
    "alike, lanes": (seq([seq(lanes(2, 32)), seq(lanes(2, 5, start=32))]),
                     "2 chunks of 32 and 5; each: 2 lanes × 2..16 sequential; lanes then sequential; chunks added"),
}


@pytest.mark.parametrize("name", list(FEW_PARTS))
def test_a_few_parts_that_read_otherwise_are_each_named(name):
    revealed_reads(*FEW_PARTS[name])


def test_a_few_fused_parts_are_each_named_and_many_stay_varied():
    three = [seq([0, 1, 2, 3, 4]), seq([5, 6, 7]), pw([8, 9, 10, 11])]
    assert (describe(three)
            == "3 chunks of 5 [sequential], 3 [sequential] and 4 [pairwise]; chunks fused into one rounding")
    assert describe([*three, [12, 13]]) == "4 chunks of 2..5; each: varied; chunks fused into one rounding"
    three[2] = seq([8, 9, 10, 11])
    assert describe(three) == "3 chunks of 5, 3 and 4; each: sequential; chunks fused into one rounding"


def closing(words: str, i: int) -> int:
    """The index just past the ']' that closes a bracket opened before ``words[i]``."""
    depth = 1
    while depth:
        depth += {"[": 1, "]": -1}.get(words[i], 0)
        i += 1
    return i


def named_parts(words: str):
    """The parts a reading names at its start: (N, [(size, its reading or None)]) from "N chunks of
    A [...], B [...] and C [...]" or "N chunks of A, B and C; each: ..."; None for any other."""
    head = re.match(r"([0-9]+) (?:chunks|parts|lanes) of ", words)
    if head is None:
        return None
    found, i = [], head.end()
    while part := re.compile(r"([0-9]+) \[").match(words, i):
        j = closing(words, part.end())
        found.append((int(part.group(1)), words[part.end():j - 1]))
        sep = re.compile(r"(?:, | and )(?=[0-9]+ \[)").match(words, j)
        i = sep.end() if sep else len(words)
    if not found and (listed := re.compile(r"([0-9]+(?:, [0-9]+)*) and ([0-9]+); each: ").match(words, head.end())):
        found = [(int(x), None) for x in re.findall("[0-9]+", listed.group(0))]
    return (int(head.group(1)), found) if found else None


def named_runs(words: str, total: int):
    """Assert that a runs reading ("product 0, then 2 runs, ...: 1..48 [...], 49..62 [...]") names as
    many runs as it says, each from the product after the one before, the last up to ``total`` less
    the products added after them ("; then 2 more products sequential"); returns [(size, its reading
    or None)], or None where the words name no runs."""
    head = re.match(r"product ([0-9]+), then ([0-9]+) runs?, the sum so far added first to (?:its|each one's) "
                    r"first product: ", words)
    if head is None:
        return None
    runs, i, nxt = [], head.end(), int(head.group(1)) + 1
    while run := re.compile(r"([0-9]+)(?:\.\.([0-9]+))?").match(words, i):
        lo, hi, i, inner = int(run.group(1)), int(run.group(2) or run.group(1)), run.end(), None
        if words.startswith(" [", i):
            j = closing(words, i + 2)
            inner, i = words[i + 2:j - 1], j
        assert lo == nxt and hi >= lo, words
        runs.append((hi - lo + 1, inner))
        nxt = hi + 1
        i += 2 if words.startswith(", ", i) else 0
    more = re.fullmatch(r"(?:; then (?:([0-9]+) more products sequential|(1) more product))?", words[i:])
    assert more is not None and len(runs) == int(head.group(2)), words
    assert nxt + int(more.group(1) or more.group(2) or 0) == total, words
    return runs


def sizes_add_up(words: str, total: int) -> int:
    """Assert that each part list the words name holds as many parts as they say, of sizes that add
    up to ``total`` less the products added after them ("; then 5 more products"), and so on down
    the brackets; returns how many lists it checked."""
    if blocks_add_up(words, total):
        return 1
    if (runs := named_runs(words, total)) is not None:
        return 1 + sum(sizes_add_up(inner, size) for size, inner in runs if inner)
    got = named_parts(words)
    if got is None:
        return 0
    outside = re.sub(r"\[[^][]*\]", "", words)
    while outside != (outside := re.sub(r"\[[^][]*\]", "", outside)):
        pass
    more = sum(int(m.group(1) or 1) for m in re.finditer(r"then (?:([0-9]+) more products|1 more product)", outside))
    n, parts = got
    assert len(parts) == n and sum(size for size, _ in parts) == total - more, words
    return 1 + sum(sizes_add_up(inner, size) for size, inner in parts if inner)


def random_tree(rng, ids):
    """A tree over ``ids`` of sequential and pairwise runs (an odd one out carried up), lanes,
    blocks and splits, mixed."""
    def pairs(p):
        while len(p) > 1:
            p = [[p[i], p[i + 1]] if i + 1 < len(p) else p[i] for i in range(0, len(p), 2)]
        return p[0]

    if len(ids) == 1:
        return ids[0]
    how = rng.choice(["seq", "pairs", "lanes", "blocks", "split"])
    if how in ("seq", "pairs"):
        return (seq if how == "seq" else pairs)(ids)
    if how == "split":
        at = rng.randrange(1, len(ids))
        return [random_tree(rng, ids[:at]), random_tree(rng, ids[at:])]
    n = rng.choice([2, 3, 4, 8])
    parts = [ids[i::n] for i in range(n)] if how == "lanes" else [ids[i:i + n] for i in range(0, len(ids), n)]
    parts = [random_tree(rng, p) if rng.random() < 0.4 else seq(p) for p in parts if p]
    return rng.choice([seq, pairs])(parts) if len(parts) > 1 else parts[0]


def test_the_parts_named_hold_every_product():
    import random
    rng = random.Random(7)
    sample = [t for t, _ in [*FEW_PARTS.values(), *SHORT_CHUNKS.values(), *UNEVEN_LANES.values(), *TREES.values(),
                            *RUNNING_BLOCKS.values(), *SEEDED_LANES.values()]]
    for _ in range(400):
        k = rng.choice([5, 7, 9, 12, 17, 20, 36, 37, 100])
        sample.append(random_tree(rng, list(range(k))))
        if rng.random() < 0.3:  # a scalar loop's remainder on top
            sample[-1] = seq([sample[-1], *range(k, k + rng.randrange(1, 6))])
    checked = sum(sizes_add_up(describe(trees.canonical(t)), len(trees.leaves(t))) for t in sample)
    assert checked >= 100  # the old words named no part: "2 chunks of 4..32; each: varied"


def test_a_long_sequential_loop_needs_one_round_and_no_recursion(tmp_path, capsys):
    from matmul_drift.cli import main as cli
    from matmul_drift.store import catalog

    k = 1500  # deeper than Python's recursion limit (and json.loads')
    got = order_tree.tree_from_pairs(simulated(seq(list(range(k)))), k)
    assert got.rounds == 1 and describe(got.tree) == "sequential"
    assert got.probes == k - 1  # seen from its first product alone, the deepest
    # run backwards, the first product is added last: one group of k - 1 from it, so the last's view
    back = order_tree.tree_from_pairs(simulated([seq(list(range(k - 1, 0, -1))), 0]), k)
    assert back.rounds == 2 and back.probes == 2 * (k - 1) and describe(back.tree) == "sequential (out of index order)"
    text = trees.to_json(got.tree)
    assert text == "[" * (k - 1) + "0," + "],".join(str(i) for i in range(1, k)) + "]"
    oid = order_tree.store(tmp_path, got.tree, k)
    back = catalog.load(tmp_path, "orders", oid)  # read back as the summary does
    assert back["k"] == k and trees.to_json(back["tree"]) == text
    assert cli.main(["catalog", ids.hex_id(oid), "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [f"  K = {k}: sequential", f"  {text}"]


@pytest.mark.parametrize("text", ["[]", "[0,", "[0,1]]", "[,1]", "[0 1]", "[0,]", "{}", "", "[-1,2]",
                                  "[[\u0660,1],2]", "[[00,01],2]", "\u0661", "07"])
def test_text_that_is_not_a_tree_is_refused(text):
    # JSON's numbers alone: str.isdigit takes Arabic-Indic digits, int() leading zeros
    with pytest.raises(ValueError):
        trees.from_json(text)


@pytest.mark.parametrize("tree, k", [("[[0],1]", 2), ("[[0,0],1]", 3), ("[[0,1],3]", 3), ("[[0,1],2]", 4)])
def test_a_file_whose_tree_is_no_order_over_k_is_refused(tree, k):
    # a node adding one term, a product added twice or never: no sum torch could have made
    good = trees.report_text({"k": 3, "summary": "x"}, [[0, 1], 2])
    assert trees.read_report(good)["tree"] == [[0, 1], 2]
    assert trees.parse_entry('{"k":3,"tree":[[0,1],2]}')["k"] == 3
    with pytest.raises(ValueError, match="not an order tree"):
        trees.read_report(trees.report_text({"k": k, "summary": "x"}, [[0, 1], 2]).replace("[[0,1],2]", tree))
    with pytest.raises(ValueError, match="not an order tree"):
        trees.parse_entry(f'{{"k":{k},"tree":{tree}}}')


def test_counts_that_fit_no_tree_are_not_revealed():
    def noisy(pairs, within):
        return [(i * 7 + j * 3) % 5 + 2 for i, j in pairs]

    with pytest.raises(order_tree.NotRevealed, match="fit no tree"):
        order_tree.tree_from_pairs(noisy, 16)


def test_order_id_is_the_canonical_trees_content_id(tmp_path):
    a, b = [[0, 1], 2], [2, [1, 0]]  # one tree, the children of both nodes swapped in b
    assert trees.order_id(b, 3) == trees.order_id(a, 3) == order_tree.store(tmp_path, b, 3)
    assert b == [2, [1, 0]]  # the caller's tree is left as it is
    assert trees.order_id(a, 3) != trees.order_id([0, [1, 2]], 3)
    assert trees.entry_text(b, 3) == json.dumps({"k": 3, "tree": a}, separators=(",", ":"), sort_keys=True)
    deep, backwards = 0, 0  # a sequential loop 3000 deep, written children first and children last
    for i in range(1, 3000):
        deep, backwards = [deep, i], [i, backwards]
    assert trees.order_id(backwards, 3000) == trees.order_id(deep, 3000)


def test_every_committed_catalog_tree_keeps_its_id():
    found = sorted((Path(__file__).resolve().parents[1] / "results/catalog/orders").glob("*.json"))
    for path in found:
        entry = trees.parse_entry(path.read_text())
        assert f"{trees.order_id(entry['tree'], entry['k']):012x}" == path.stem


# ---------------------------------------------------------------------------- on this CPU's kernels


# ---------------------------------------------------------------- tensor cores' fused adds


def truncating(tree):
    """measure_pairs of a tensor core: at a node of three or more children (a fused add that
    cuts every term to the largest one's bits) the pair takes the whole node with it, the
    products of it that the probe holds (``within``); elsewhere as ``simulated``."""
    exact = simulated(tree)

    def measure(pairs, within):
        out = []
        for (i, j), count in zip(pairs, exact.held(pairs, within)):
            a, b, node = exact.children(i, j)
            fused = _arity[node[1]] > 2
            out.append(2 + (count(exact.span[node]) if fused else count(exact.span[a], exact.span[b])))
        return out

    _arity = {id(x): len(x) for x in trees.inner_nodes(tree)}
    return measure


def running(group, k, start=0):
    """A tensor core's loop: each fused add takes the running sum and the next ``group`` products."""
    t = list(range(start, start + group))
    for lo in range(start + group, start + k, group):
        t = [t, *range(lo, lo + group)]
    return t


WITH_THE_SUM = "each added with the running sum in one rounding"
TENSOR_CORE_TREES = {
    "groups of 16": (running(16, 64), f"sequential in 4 fused groups of 16, {WITH_THE_SUM}"),
    "groups of 4": (running(4, 64), f"sequential in 16 fused groups of 4, {WITH_THE_SUM}"),
    "split in 2": ([running(16, 32), running(16, 32, 32)],
                   f"2 chunks of 32; each: sequential in 2 fused groups of 16, {WITH_THE_SUM}; chunks sequential"),
    "4 splits, pairwise": (pw([running(8, 16, lo) for lo in range(0, 64, 16)]), None),
    "interleaved groups": (seq([[*range(g, g + 4), *range(g + 32, g + 36)] for g in range(0, 32, 4)]),
                           "8 parts of 8; each: fused group of 8; parts sequential"),  # 0..3 with 32..35: no chunk
    "one group": (list(range(16)), "fused group of 16"),
    "groups from the last": ([[[[*range(48, 64)], *range(32, 48)], *range(16, 32)], *range(16)],
                             f"sequential in 4 fused groups of 16, {WITH_THE_SUM} (out of index order)"),
}


@pytest.mark.parametrize("name", list(TENSOR_CORE_TREES))
def test_a_tensor_cores_fused_adds_are_found_by_one_more_pair_each(name):
    tree, words = TENSOR_CORE_TREES[name]
    k = len(trees.leaves(tree))
    probe = truncating(tree)
    chains = order_tree.tree_from_pairs(probe, k).tree
    assert trees.fused_nodes(chains) == 0  # with the rest left 0, a fused add reads as a chain
    got, pairs, merged = order_tree.fuse(chains, probe, k)
    assert got == trees.canonical(tree) and merged > 0
    assert pairs == k - 1 and trees.fused_nodes(chains) == 0  # one pair per two-child node; the input kept
    # where a reading counts few products (fp16, bf16): one of the node's and one beside it tell a
    # link from a rounded addition as well as all of them do; the top's pair holds every product
    read = []
    two, _, _ = order_tree.fuse(
        chains, lambda pairs, within: read.extend(map(len, within)) or probe(pairs, within), k, 2)
    assert two == got and sorted(read) == [2] * (k - 2) + [k]
    if words:
        assert describe(got) == words


@pytest.mark.parametrize("width", [1, 16])
def test_fuse_calls_counts_the_calls_fuse_makes_on_a_real_probe(width):
    # bf16 holds 256 products a probe: at K = 600 the top node's pair takes 3 probes of its own,
    # which the reveal's budget check must count (it counted one pair per two-child node)
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan, order_tree

    t = order_plan.target(cases.adhoc(2, 600, 512), "bfloat16", "cpu")
    p = order.Prober(t, width)
    measured = lambda pairs, within: p.counts(pairs, within)  # noqa: E731
    tree = order_tree.tree_from_pairs(measured, t.k).tree
    assert p.chunk < t.k and isinstance(tree, list) and len(tree) == 2
    before = p.calls
    order_tree.fuse(tree, measured, t.k, p.chunk)
    assert p.calls - before == order_plan.fuse_calls(tree, t.k, p.chunk, width)
    # one probe a pair
    assert order_plan.fuse_calls(tree, t.k, t.k, width) == -(-trees.arities(tree).count(2) // width)


def _random_tree(leaves: list[int], rng):
    """Two to five children a node (three or more: a fused add), over leaves in any order."""
    if len(leaves) == 1:
        return leaves[0]
    k = min(rng.choice([2, 2, 2, 3, 4, 5]), len(leaves))
    cuts = sorted(rng.sample(range(1, len(leaves)), k - 1))
    return [_random_tree(leaves[a:b], rng) for a, b in zip([0, *cuts], [*cuts, len(leaves)])]


def test_random_trees_of_rounded_and_fused_adds_are_revealed_exactly():
    import random

    for seed in range(1000):
        rng = random.Random(seed)
        leaves = list(range(rng.randint(2, 40)))
        if seed % 2:
            rng.shuffle(leaves)
        tree = _random_tree(leaves, rng)
        probe = truncating(tree)
        chains = order_tree.tree_from_pairs(probe, len(leaves)).tree
        want = trees.canonical(trees.from_json(trees.to_json(tree)))
        # every product in each reading (fp32), or a few of the node's and beside it (fp16, bf16)
        for sample in (None, 2 + seed % 7):
            got, _, _ = order_tree.fuse(chains, probe, len(leaves), sample)
            assert got == want, (seed, sample, trees.to_json(tree))


@pytest.mark.parametrize("name", list(TREES))
def test_rounded_additions_and_exact_fused_adds_are_not_merged(name):
    tree, _ = TREES[name]
    got, _, merged = order_tree.fuse(trees.canonical(tree), simulated(tree), K)
    assert merged == 0 and got == trees.canonical(tree)


def test_a_reading_that_fits_no_fused_node_is_not_revealed():
    chain = seq(list(range(8)))  # node sizes 2..8: no node of 9 above any of them
    with pytest.raises(order_tree.NotRevealed, match="neither its node's"):
        order_tree.fuse(chain, lambda pairs, within: [9] * len(pairs), 8)
    with pytest.raises(order_tree.NotRevealed, match="counted 1"):
        order_tree.fuse(chain, lambda pairs, within: [1] * len(pairs), 8)
    # readings of 4 products (fp16, bf16): [[0..5], 6]'s pair (0, 6) holds 0, 1, 2 and 7 beside it: it
    # counts 4 (0, 1, 2, 6: a rounded addition) or 5 (a link of a fused add)
    with pytest.raises(order_tree.NotRevealed,
                       match=r"\(0, 6\) counted 3: neither the 4 .* nor 5, with the 1 beside"):
        order_tree.fuse(chain, lambda pairs, within: [3] * len(pairs), 8, 4)
    # every reading of a link fits, but the top pair, every product present, counts 7 of 8: columns
    # that add in other orders, read as one (linear fp64 over 1024 columns on an AMD EPYC)
    with pytest.raises(order_tree.NotRevealed,
                       match="of the top node, every product present, counted 7 of 8"):
        order_tree.fuse(chain, lambda pairs, within: [7] if len(within[0]) == 8
                        else simulated(chain)(pairs, within), 8, 4)


def _exponent(x: Fraction) -> int:
    """e with 2^e <= |x| < 2^(e+1), exactly."""
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > x else e + 1 if Fraction(2) ** (e + 1) <= x else e


def _to_fp32(x: Fraction, toward_zero: bool) -> Fraction:
    """x at 24 significant bits, cut toward zero or rounded to nearest even."""
    if x == 0:
        return x
    q = Fraction(2) ** (_exponent(x) - 23)
    return (int(x / q) if toward_zero else round(x / q)) * q


# two of order_replay.FUSED's tensor-core ways
# (they were "truncated-24" and "truncated-25": P = F + 1)
VOLTA = "volta: aligned to the exponent sum, 23 bits, cut toward zero"
AMPERE = "turing/ampere/ada: aligned to the exponent sum, 24 bits, cut toward zero"


def _fused(terms, way: str) -> Fraction:
    """One fused add on exact rationals: "exact" rounds the exact sum to nearest once; a tensor
    core's way ("..., F bits, ...") cuts each term to F bits below the largest's exponent (each
    read as a float32 value: no operands given), then the sum toward zero."""
    terms = [Fraction(x) for x in terms]
    if way == "exact":
        return _to_fp32(sum(terms), toward_zero=False)
    big = max(abs(x) for x in terms)
    if big == 0:
        return Fraction(0)
    q = Fraction(2) ** (_exponent(big) - int(re.search(r"([0-9]+) bits", way)[1]))
    return _to_fp32(sum(int(x / q) * q for x in terms), toward_zero=True)


def _tree_sum(node, column, way: str) -> Fraction:
    if not isinstance(node, list):
        return Fraction(column[node])
    kids = [_tree_sum(c, column, way) for c in node]
    return _fused(kids, way) if len(kids) > 2 else _to_fp32(kids[0] + kids[1], toward_zero=False)


def test_each_fused_add_rounds_as_exact_rationals_say():
    # by hand: 2^24 + 1 + 1 + 1 is 2^24 cut to 24 bits, 2^24 + 2 cut to 25, 2^24 + 4 rounded exactly
    big = np.array([[2.0**24], [1.0], [1.0], [1.0]])
    for way, want in ((VOLTA, 2**24), (AMPERE, 2**24 + 2), ("exact", 2**24 + 4)):
        assert order_replay.evaluate([0, 1, 2, 3], big, np.float32, way)[0] == want
        # toward zero, not down
        assert order_replay.evaluate([0, 1, 2, 3], -big, np.float32, way)[0] == -want
    rng = np.random.default_rng(7)
    terms = (rng.choice([-1.0, 1.0], (17, 400)) * (1 + rng.integers(0, 2**23, (17, 400)) / 2**23)
             * np.exp2(rng.integers(-30, 30, (17, 400)))).astype(np.float32).astype(np.float64)
    terms[:, :20] = 0  # all zero
    terms[3, 20:40] = 0
    for way in order_replay.FUSED:
        got = order_replay.evaluate(list(range(17)), terms, np.float32, way)
        assert [Fraction(float(g)) for g in got] == [_fused(col, way) for col in terms.T], way
    with pytest.raises(ValueError, match="float32 accumulator"):
        order_replay.evaluate([0, 1, 2], terms[:3], np.float64, AMPERE)


@pytest.mark.parametrize("way", order_replay.FUSED)
def test_fused_adds_of_inf_nan_zero_and_overflow_are_ieee(way):
    import warnings

    big = float(np.finfo(np.float32).max)
    cols = np.array([[np.inf, np.inf, np.nan, big, 0.0, 2.0**-149],
                     [1.0, -np.inf, 1.0, big, 0.0, 1.0],
                     [1.0, 1.0, 1.0, big, 0.0, 2.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning either
        got = order_replay.evaluate([0, 1, 2], cols, np.float32, way)
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2]) and got[4] == 0
    # to nearest overflows; so does a tensor core's: cut to 24 bits the sum is still 2^128 or more
    # (MMA-Sim, tests/test_mmasim.py; before, toward zero stayed at the top)
    assert got[3] == np.inf
    assert got[5] == 3.0  # the smallest subnormal: cut below the largest's bits, or rounded away
    assert order_replay.evaluate([0, 1, 2], cols[:, :0], np.float32, way).shape == (0,)  # no draws


@pytest.mark.parametrize("way", order_replay.FUSED)
def test_the_replay_names_the_fused_add_the_kernel_used(way):
    from matmul_drift.measure import inputs
    from matmul_drift.probes import order_replay

    tree = trees.canonical(running(16, 64))
    binary = trees.canonical(seq(list(range(64))))
    for dtype in ("float16", "float32"):  # the replay's draws for each
        products = order_replay.draw_products(np.random.default_rng(3), 64, 100, dtype)
        sums = np.array([float(_tree_sum(tree, col, way)) for col in products.T], dtype=np.float32)
        kernel = [(int(b), float(v)) for b, v in zip(inputs.round_bits(sums, dtype), sums)]
        got = order_replay.match(tree, products, kernel, dtype)
        # the draws tell the ways apart, through an fp16 output too (before: every way matched)
        assert got["fused_add"] == [way] and got["matched"] == 100 and got["first_mismatch"] is None, dtype
        # nor is it a chain of rounded additions
        chain = order_replay.match(binary, products, kernel, dtype)
        assert chain["fused_add"] is None and chain["matched"] < 100 and chain["first_mismatch"] is not None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_tensor_core_kernel_is_revealed_through_the_probe_and_replayed(dtype, monkeypatch):
    """The whole probe (its chunks of k, the products outside a set left 0, M and -M, the builder,
    the extra pairs and the replay) against a kernel that sums square's entry (0, 0) as a
    tensor core: two halves of k, each a loop of fused adds of 16 products and the running sum
    cut to 24 bits below their largest exponent (AMPERE; "truncated-25" before), the halves added."""
    import torch

    from matmul_drift.core import cases
    from matmul_drift.measure import inputs
    from matmul_drift.probes import order, order_plan, order_replay

    t = order_plan.target(cases.get("square"), dtype, "cpu")
    truth = [running(16, t.k // 2), running(16, t.k // 2, t.k // 2)]

    def tensor_core(self):
        row = self.a0[t.row].double().numpy()
        sums = order_replay.evaluate(truth, row[:, None] * self.b0.double().numpy(), np.float32,
                                     AMPERE)
        with np.errstate(over="ignore"):  # the replay's draws may overflow fp16, as the kernel's would
            bits = inputs.round_bits(sums, dtype)
        return torch.from_numpy(bits.astype(np.int16)).view(getattr(torch, dtype))

    monkeypatch.setattr(order.Prober, "product", tensor_core)
    got = order.reveal(t, verify=True)
    assert got.tree == trees.canonical(truth)
    assert AMPERE in got.verified["fused_add"] and got.verified["matched"] == 100
    assert any("fused adds" in n for n in got.notes), got.notes
    assert describe(got.tree).startswith("2 chunks of 256; each: sequential in 16 fused groups of 16")


def _routes() -> dict[tuple, tuple]:
    """{route: (case, dtype, slice_n, slice_m)}: one computation per distinct CPU route of the
    catalog (full products and their slices), the cheapest to probe, from the routes traced here."""
    from matmul_drift.core import cases
    from matmul_drift.measure import kernels
    from matmul_drift.probes import order, order_plan

    found: dict[tuple, tuple] = {}
    for case in cases.CASES:
        if case.id == "long-k":  # K = 262144 over 16 columns: beyond the probe's call budget (docs/design.md)
            continue
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            prober = None
            for sn, sm in [(None, None), *((n, None) for n in case.slice_n), *((None, m) for m in case.slice_m)]:
                t = order_plan.target(case, dtype, "cpu", sn, sm)
                if prober is None:
                    prober = order.Prober(t)
                prober.t = t
                _, names = kernels.traced(prober.product, "cpu")
                size = (order_plan.calls_per_round(t), t.k * t.rows * t.cols)
                key = (dtype, *kernels.unique(names))
                if key not in found or size < found[key][0]:
                    found[key] = (size, case.id, dtype, sn, sm)
    return {k: v[1:] for k, v in found.items()}


ROUTES = None


def routes():
    global ROUTES
    if ROUTES is None:
        ROUTES = _routes()
    return ROUTES


def test_every_cpu_route_of_the_catalog_is_revealed_and_replays_bit_for_bit():
    """Each route is revealed and replays 100 of 100 draws, or says "not revealed" (within 1500
    calls; a route whose columns differ may need the entry's own column alone): never a wrong tree."""
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan, order_tree

    seen, revealed, refused = routes(), set(), []
    assert len({k[0] for k in seen}) == 4  # every dtype has a route
    for key, (case, dtype, sn, sm) in seen.items():
        t = order_plan.target(cases.get(case), dtype, "cpu", sn, sm)
        try:
            r = order.reveal(t, max_calls=1500)
        except order_tree.NotRevealed as exc:
            refused.append((key, str(exc)))
            continue
        assert sorted(trees.leaves(r.tree)) == list(range(t.k)), key
        v = order.replay(t, r.tree, draws=100, width=r.width)
        assert v["matched"] == v["draws"] == 100, (key, case, sn, sm, v)
        revealed.add(dtype)
    assert revealed == {"float64", "float32", "float16", "bfloat16"}, refused
    assert len(refused) <= len(seen) // 4, refused


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_a_wrong_tree_fails_the_replay(dtype):
    """This machine's kernel against its own tree (100 of 100), another shape of tree, and the
    tree with its first and last products traded. Before, any tree replayed an fp16 or bf16
    kernel 100 of 100 (its draws' sums were exact in fp32 and the output hid the rest), and
    the traded tree an fp32 or fp64 one."""
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan

    k = 512
    t = order_plan.target(cases.adhoc(4, k, 64), dtype, "cpu")
    r = order.reveal(t)
    assert order.replay(t, r.tree, draws=100, width=r.width)["matched"] == 100
    other = pw(list(range(k))) if describe(r.tree) != "pairwise" else seq(list(range(k)))
    traded = trees.from_json(trees.to_json(r.tree))
    for x in trees.inner_nodes(traded):
        x[:] = [k - 1 if c == 0 else 0 if c == k - 1 else c for c in x]
    for wrong in (other, traded):
        assert trees.to_json(trees.canonical(wrong)) != trees.to_json(r.tree)
        v = order.replay(t, trees.canonical(wrong), draws=100, width=r.width)
        assert v["matched"] < 100 and v["first_mismatch"] is not None, (describe(r.tree), v)


@pytest.mark.parametrize("col", [0, 37])
def test_the_replay_draws_lie_over_every_column_the_probes_used(col):
    # a kernel may add a tail tile in another order: the first 100 of 512 columns would miss it
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan

    t = order_plan.target(cases.adhoc(2, 64, 512), "float32", "cpu", col=col)
    p = order.Prober(t, 512)
    seq_tree = seq(list(range(64)))
    v = order.replay(t, seq_tree, draws=100, width=512, prober=p)
    written = np.flatnonzero(p.b0.abs().sum(0).numpy())
    assert v["draws"] == len(written) == 100 and {0, col, 511} <= set(written.tolist())
    assert np.diff(written).max() <= 6  # evenly: 511 / 99 apart, one moved onto the entry's column
    few = order.Prober(t, 512)
    assert order.replay(t, seq_tree, draws=100, width=40, prober=few)["draws"] == 100  # 40 a call, 3 calls
    assert np.flatnonzero(few.b0.abs().sum(0).numpy()).tolist() == list(range(40))


def test_a_drifting_slice_has_another_order_and_an_identical_one_the_same():
    """explain's question in orders: where A[:m] @ B differs from (A @ B)[:m] in bits, the
    entry's order differs; where it is bit-identical, the order is the same (on this CPU,
    the slices found by a dense measurement here)."""
    import torch

    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan

    case = cases.adhoc(128, 512, 256)
    a = torch.randn(128, 512)
    b = torch.randn(512, 256)
    full = a @ b
    same = {m: torch.equal(a[:m] @ b, full[:m]) for m in range(1, 128)}
    drifting = next((m for m, eq in same.items() if not eq), None)
    identical = next((m for m, eq in same.items() if eq), None)
    # Some routes (MKL_CBWR=AVX2 here) make every m < 128 drift: then only the first half holds.
    assert drifting is not None or identical is not None, same
    ids = {}
    for m in (None, *(x for x in (drifting, identical) if x)):
        # A case whose slice_m is m: the probe reads row 0 of A[:m] @ B
        c = cases.Case(case.id, "mm", case.cpu, case.cuda, slice_m=(m,) if m else ())
        t = order_plan.target(c, "float32", "cpu", None, m)
        ids[m] = trees.order_id(order.reveal(t).tree, t.k)
    assert (drifting is None or ids[drifting] != ids[None]) and (identical is None or ids[identical] == ids[None]), ids


@pytest.mark.parametrize("args,message", [
    (["--m", "2", "--k", "1", "--n", "4"], "no order to reveal"),
    (["--m", "1", "--k", "20000000", "--n", "1", "--dtype", "float16"], "beyond the probe's exact range"),
    (["--case", "long-k"], "more than 4000 (--max-calls)"),
    (["--m", "4", "--k", "8", "--n", "4", "--row", "9"], "outside the 4 x 4 output"),
    (["--case", "seed", "--col", "51000"], "outside the 1 x 51000 output"),
    (["--case", "seed", "--col", "45000"], "seed's slices are compared in their first 45000 columns"),  # inside, yet refused
    (["--m", "4", "--k", "8", "--n", "4", "--device", "cuda"], "cuda"),
    (["--m", "4", "--k", "8", "--n", "4", "--json", "{tmp}"], "exists"),
    (["--m", "4", "--k", "8", "--n", "4", "--json", "{tmp}/no/such/o.json"], "folder does not exist"),
    (["--m", "4", "--k", "8", "--n", "4", "--json", "{tmp}/o.json/"], "o.json/: it ends in a slash, as a folder's name does"),
    (["--m", "4", "--k", "8", "--n", "4", "--json", "/proc/o.json"], "/proc/o.json: its folder is not writable ("),
    (["--m", "4", "--k", "8", "--n", "4", "--json", ""], "--json: needs a file name, got an empty one"),  # was ". exists"

    (["--case", ""], "unknown case ''"),  # was a TypeError's traceback: an empty id read as no --case
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys, tmp_path):
    from matmul_drift.cli import main as cli

    args = [a.replace("{tmp}", str(tmp_path)) for a in args]

    if "--dtype" not in args:
        args = [*args, "--dtype", "float32"]
    if "--device" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here")
    rc = cli.main(["order", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_a_probe_larger_than_memory_is_refused_before_allocating(capsys, monkeypatch, tmp_path):
    import time

    from matmul_drift.cli import main as cli
    from matmul_drift.core import cases
    from matmul_drift.measure import memory
    from matmul_drift.probes import order_plan

    have = memory.available("cpu")[0]
    if have is None:
        pytest.skip("no MemAvailable in /proc/meminfo")
    n = 1 << 16
    while memory.probe_bytes(**order_plan.target(cases.adhoc(n, 16, n), "float32", "cpu").probe_sizes())[0] < 4 * have:
        n *= 2  # this machine's memory, not a constant
    t0 = time.monotonic()
    rc = cli.main(["order", "--m", str(n), "--k", "16", "--n", str(n), "--dtype", "float32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs about" in err[0] and "MemAvailable" in err[0], err
    assert time.monotonic() - t0 < 30  # refused up front: 4x this machine's memory would not end
    # A virtual machine whose memory grows as it is used reports too little: the flag starts anyway.
    monkeypatch.setattr(memory, "available", lambda device: (1 << 20, None))
    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path))  # the tree goes there, not to the checkout's
    small = ["order", "--m", "4", "--k", "8", "--n", "4", "--dtype", "float32"]
    assert cli.main(small) == 2 and "--no-host-memory-check" in capsys.readouterr().err
    out = capsys.readouterr().out if cli.main([*small, "--no-host-memory-check"]) == 0 else ""
    assert "order-id" in out and "replay: not run (--verify" in out, out  # a tree not replayed says so


def test_a_catalog_that_cannot_take_the_tree_is_one_line_before_probing(tmp_path, capsys, monkeypatch):
    from matmul_drift.cli import main as cli

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path / "file"))
    rc = cli.main(["order", "--m", "4", "--k", "8", "--n", "4", "--dtype", "float32"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.strip().splitlines() == [
        f"matmul-drift: error: the catalog cannot take the tree: {tmp_path / 'file' / 'orders'}: Not a directory "
        "(MATMUL_DRIFT_CATALOG names another)"], err
    assert (tmp_path / "file").read_text() == "not a folder"


def test_a_dangling_link_as_json_is_refused_before_probing(tmp_path, capsys):
    from matmul_drift.cli import main as cli

    (tmp_path / "o.json").symlink_to(tmp_path / "nowhere" / "o.json")
    rc = cli.main(["order", "--m", "4", "--k", "8", "--n", "4", "--dtype", "float32", "--json", str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"matmul-drift: error: --json {tmp_path / 'o.json'} exists; remove it or choose another "
                               "name"], err


def test_a_json_file_made_while_probing_is_not_replaced(tmp_path, capsys, monkeypatch):
    from matmul_drift.cli import main as cli
    from matmul_drift.probes import order

    target, revealed = tmp_path / "o.json", order.reveal

    def intrude(*args, **kwargs):  # someone else writes the file once the probe has started
        target.write_text("someone else's")
        return revealed(*args, **kwargs)

    monkeypatch.setattr(order, "reveal", intrude)
    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path / "cat"))
    rc = cli.main(["order", "--m", "4", "--k", "8", "--n", "4", "--dtype", "float32", "--json", str(target)])
    err = capsys.readouterr().err.strip().splitlines()
    head = f"matmul-drift: error: --json {target} appeared while probing and is left as it is; the tree is in "
    assert rc == 2 and len(err) == 1 and err[0].startswith(head), err
    assert target.read_text() == "someone else's"
    assert json.loads(open(err[0][len(head):]).read())["k"] == 8  # what was revealed is kept beside it


def test_the_command_writes_the_tree_and_its_id(tmp_path, capsys, monkeypatch):
    from matmul_drift.cli import main as cli

    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path / "cat"))
    rc = cli.main(["order", "--m", "4", "--k", "300", "--n", "32", "--dtype", "float32", "--verify",
                   "--json", str(tmp_path / "o.json")])
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "o.json").read_text())
    assert rc == 0 and "replay: 100 of 100" in out and f"order-id {doc['order_id']}" in out
    assert sorted(trees.leaves(doc["tree"])) == list(range(300)) and doc["verified"]["matched"] == 100
    assert ids.hex_id(trees.order_id(doc["tree"], 300)) == doc["order_id"]
    assert (tmp_path / "cat" / "orders" / f"{doc['order_id']}.json").read_text().startswith('{"k":300,"tree":')



def test_the_tree_is_written_before_a_line_is_printed(tmp_path, monkeypatch):
    # `order ... --json F | head -1`: a reader gone before the lines are printed cost the file
    from matmul_drift.cli import main as cli

    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path / "cat"))
    printed = []

    def gone(*args, **kwargs):
        printed.append(tmp_path.joinpath("o.json").exists())
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("builtins.print", gone)
    with pytest.raises(BrokenPipeError):
        cli.main(["order", "--m", "1", "--k", "16", "--n", "8", "--dtype", "float32", "--json", str(tmp_path / "o.json")])
    assert printed == [True] and json.loads((tmp_path / "o.json").read_text())["k"] == 16

def test_explain_orders_give_each_slice_its_order_and_a_verdict(capsys):
    from matmul_drift.cli import main as cli

    rc = cli.main(["explain", "--m", "64", "--k", "512", "--n", "256", "--dtype", "float32", "--orders", "--json"])
    doc = json.loads(capsys.readouterr().out)
    o = doc["orders"]
    assert rc == 0 and o["full"]["order_id"] and len(o["slices"]) == 2  # the default slices: n - 1 columns, row 1
    for s in o["slices"]:
        same = s["order_id"] == o["full"]["order_id"]
        assert s["verdict"].startswith("same order" if same else "order differs"), s
        if same and not s["drifts"]:
            assert s["verdict"] == "same order: identical bits expected"
    rc = cli.main(["explain", "--m", "64", "--k", "512", "--n", "256", "--dtype", "float32", "--orders"])
    out = capsys.readouterr().out
    assert rc == 0 and f"order of entry (0, 0): full product {o['full']['order_id']}" in out


def test_the_suite_records_each_full_products_order_and_says_what_it_could_not(tmp_path, monkeypatch):
    """suite.add_orders: a revealed tree in the catalog (the one the probe reveals here), NaN
    where the probe does not run (long-k), untouched skips, and the tree null ("not revealed")
    where the readings fit no tree."""
    import io

    from matmul_drift.core import cases
    from matmul_drift.jobs import suite
    from matmul_drift.jobs.selection import Cell
    from matmul_drift.probes import order, order_plan, order_tree
    from matmul_drift.store import catalog

    out = {Cell("square", "float32", "cpu"): {}, Cell("long-k", "float32", "cpu"): {}, Cell("square", "float32-tf32", "cpu"): {"skip": "CUDA only"}}
    log = io.StringIO()
    suite.add_orders(out, tmp_path, log)
    t = order_plan.target(cases.get("square"), "float32", "cpu")
    entry = catalog.load(tmp_path, "orders", out[Cell("square", "float32", "cpu")]["order_id"])
    assert entry == {"k": t.k, "tree": order.reveal(t).tree}
    assert math.isnan(out[Cell("long-k", "float32", "cpu")]["order_id"]) and "not probed" in log.getvalue()
    assert out[Cell("square", "float32-tf32", "cpu")] == {"skip": "CUDA only"}

    def fits_no_tree(*a, **kw):
        raise order_tree.NotRevealed("the counts over products 0..511 fit no tree")

    monkeypatch.setattr(order, "reveal", fits_no_tree)
    suite.add_orders(out, tmp_path, log)
    assert catalog.load(tmp_path, "orders", out[Cell("square", "float32", "cpu")]["order_id"]) == {"k": t.k, "tree": None}
    assert "square float32 cpu: not revealed: the counts over products 0..511 fit no tree" in log.getvalue()
    for var in ("MATMUL_DRIFT_ORDERS", "MATMUL_DRIFT_FIXES", "MATMUL_DRIFT_MAPS"):
        monkeypatch.setenv(var, "0")
    got = suite.measure_all(["square"], ["float32"], ["cpu"], root=tmp_path, log=log)
    assert "order_id" not in got[Cell("square", "float32", "cpu")]  # benchmarks/drift.py reads NaN


def _drift_benchmark():
    """benchmarks/drift.py's Drift, loaded as asv loads it (by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("drift_bench", Path(__file__).parents[1] / "benchmarks" / "drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Drift()


def test_a_probe_or_a_fix_finder_that_breaks_is_recorded_failed_not_skipped(tmp_path, monkeypatch):
    """asv reads NaN as skipped, which the summary never compares: a probe that raises, or a
    fix finder whose default computation crashed or timed out, must give asv's null (the
    track raises) with its reason, while a probe that does not run stays NaN."""
    import io

    from matmul_drift.jobs import suite
    from matmul_drift.jobs.selection import Cell
    from matmul_drift.probes import fixfind, order, order_plan

    def broken(*a, **kw):
        raise ValueError("a bug in the probe")

    monkeypatch.setattr(order, "order_of", broken)
    out = {Cell("square", "float32", "cpu"): {"slice_n_ulp": 1.0, "slice_m_ulp": 0.0, "run_to_run_ulp": 0.0},
           Cell("long-k", "float32", "cpu"): {"slice_n_ulp": 0.0, "slice_m_ulp": 0.0, "run_to_run_ulp": 0.0}}
    monkeypatch.setattr(order_plan, "target", lambda case, *a: (_ for _ in ()).throw(
        order_plan.ProbeError("K too long")) if case.id == "long-k" else None)
    monkeypatch.setattr(fixfind, "try_fixes_many", lambda specs, *a, **kw: [{"failed": "timed out after 60 s"}] * len(specs))
    log = io.StringIO()
    suite.add_orders(out, tmp_path, log)
    suite.add_fixes(out, tmp_path, log)
    bench = _drift_benchmark()
    bench.values = out[Cell("square", "float32", "cpu")]
    for track, why in [("track_order_id", "ValueError: a bug in the probe"), ("track_fix_cost", "timed out after 60 s"),
                       ("track_fix_id", "timed out after 60 s")]:
        with pytest.raises(RuntimeError, match=why):
            getattr(bench, track)(None, "square", "float32", "cpu")
    bench.values = out[Cell("long-k", "float32", "cpu")]
    assert math.isnan(bench.track_order_id(None, "long-k", "float32", "cpu"))
    assert bench.track_fix_cost(None, "long-k", "float32", "cpu") == 1.0  # no drift: nothing to fix
    bench.values = {}
    assert math.isnan(bench.track_order_id(None, "square", "float32", "cpu"))  # $MATMUL_DRIFT_ORDERS=0


def test_one_computation_is_probed_once_and_its_tree_is_the_one_each_target_reveals(tmp_path):
    """slice-n-view and slice-n-copy have the same full product: the suite probes it once, and
    the tree it records for both is the one an independent probe of slice-n-copy reveals. What
    changes the computation (a copied slice of a transposed W, a row slice, A's form, the
    dtype) changes the key; a view slice as wide as B does not."""
    import io

    from matmul_drift.core import cases
    from matmul_drift.jobs import suite
    from matmul_drift.jobs.selection import Cell
    from matmul_drift.probes import order, order_plan
    from matmul_drift.store import catalog

    out = {Cell("slice-n-view", "float32", "cpu"): {}, Cell("slice-n-copy", "float32", "cpu"): {}}
    log = io.StringIO()
    suite.add_orders(out, tmp_path, log)
    lines = log.getvalue().splitlines()
    assert "(the same computation as slice-n-view A @ B)" in lines[1] and "calls)" in lines[0], lines
    copy = order_plan.target(cases.get("slice-n-copy"), "float32", "cpu")
    entry = catalog.load(tmp_path, "orders", out[Cell("slice-n-copy", "float32", "cpu")]["order_id"])
    assert entry == {"k": copy.k, "tree": order.reveal(copy).tree}
    assert out[Cell("slice-n-copy", "float32", "cpu")] == out[Cell("slice-n-view", "float32", "cpu")]

    def key(case, precision="float32", **kw):
        return order_plan.target(case, precision, "cpu", **kw).computation()

    view = cases.Case("v", "mm", cases.Shape(4, 64, 32), cases.Shape(4, 64, 32), layout="strided", slice_n=(32, 31))
    lin = cases.Case("w", "linear", cases.Shape(4, 64, 32), cases.Shape(4, 64, 32), layout="copy", slice_n=(32,))
    assert key(view) == key(view, slice_n=32) == key(cases.Case("x", "mm", view.cpu, view.cpu))
    assert len({key(view), key(view, slice_n=31), key(view, slice_m=3), key(view, "float16"),
                key(view, "float64")}) == 5
    assert key(lin) != key(lin, slice_n=32)  # W.t()[:, :32].contiguous() is a copy: another layout
    mv = cases.Case("s", "mv", cases.Shape(1, 64, 32), cases.Shape(1, 64, 32), slice_n=(31,), forms=("as-is", "2d"))
    assert key(mv, slice_n=31) != key(mv, slice_n=31, form="2d")
    got = order.slice_orders(view, "float32", "cpu", [("n", 32, False, "as-is"), ("n", 31, False, "as-is")])
    assert got["slices"][0]["calls"] == 0 and got["slices"][0]["same_as"] == "v A @ B", got
    assert got["slices"][0]["order_id"] == got["full"]["order_id"] and "same_as" not in got["slices"][1]


@pytest.mark.parametrize("first, then", [
    (("float32", 4, 512, 64), ("float32", 8, 512, 96)),
    (("float16", 4, 512, 64), ("bfloat16", 4, 512, 64)),
    (("bfloat16", 2, 1024, 32), ("bfloat16", 16, 1024, 48)),
])
def test_a_tree_of_the_same_k_is_adopted_where_it_replays_and_never_otherwise(first, then):
    """A tree revealed earlier in the memo for the same K is replayed before the probe runs: it
    is taken exactly where an independent probe of the target reveals the same tree (derived
    here, on this CPU), in fewer calls; a wrong tree of that K is never taken."""
    from matmul_drift.core import cases

    def tgt(dtype, m, k, n):
        return order_plan.target(cases.adhoc(m, k, n), dtype, "cpu")

    a, b = tgt(*first), tgt(*then)
    alone = order.order_of(b)
    assert alone["tree"] is not None and "adopted" not in alone
    memo = {}
    source = order.order_of(a, memo=memo)
    got = order.order_of(b, memo=memo)
    assert got["order_id"] == alone["order_id"], (source["summary"], got, alone)
    if source["order_id"] == alone["order_id"]:
        assert got["adopted"] == a.label and got["calls"] < alone["calls"], got
    else:
        assert "adopted" not in got and got["calls"] > alone["calls"], got  # + the replay that failed
    wrong = pw(list(range(b.k))) if describe(alone["tree"]) != "pairwise" else seq(list(range(b.k)))
    wrong = trees.canonical(wrong)
    planted = {(a.computation(), order_plan.MAX_CALLS, True): {
        "probed": True, "tree": wrong, "order_id": ids.hex_id(trees.order_id(wrong, b.k)), "summary": describe(wrong),
        "calls": 1, "reason": None, "same_as": "planted", "k": b.k}}
    got = order.order_of(b, memo=planted)
    assert "adopted" not in got and got["order_id"] == alone["order_id"] and got["calls"] > alone["calls"], got


def test_a_probe_that_fits_no_tree_counts_the_calls_it_made(monkeypatch, capsys):
    """Each probe width makes one real call, then its readings fit no tree: the answer is "not
    revealed", with the calls spent (not 0), in order_of and in the command's line."""
    from matmul_drift.cli import main as cli
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan, order_tree

    def one_call_then_no_tree(counts, k):
        counts([(0, 1)], None)
        raise order_tree.NotRevealed("the counts fit no tree")

    monkeypatch.setattr(order, "tree_from_pairs", one_call_then_no_tree)
    t = order_plan.target(cases.adhoc(4, 64, 32), "float32", "cpu")
    got = order.order_of(t)
    assert order_plan.widths(t) == [32, 16, 1]  # all 32 columns, the first 16, column 0 alone
    assert got["tree"] is None and got["calls"] == 3, got
    rc = cli.main(["order", "--m", "4", "--k", "64", "--n", "32", "--dtype", "float32"])
    assert rc == 1 and "order not revealed after 3 matmul calls: the counts fit no tree" in capsys.readouterr().out


def test_a_kernel_whose_column_blocks_differ_is_read_in_its_first_tile(monkeypatch):
    """Hand-built kernel: the first 64 columns add their products sequentially, the others
    pairwise (as another thread's block may). Probes spread over all 512 columns fit a tree
    that is neither, and its replay fails; so the probe goes on to the first 64 columns, whose
    tree is the sequential loop and replays bit for bit."""
    import numpy as np
    import torch

    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan, order_replay

    k = 256
    first, rest = seq(list(range(k))), pw(list(range(k)))

    def product(self):
        p = self.a0[self.t.row].double().numpy()[:, None] * self.b0.double().numpy()
        y = np.concatenate([order_replay.evaluate(first, p[:, :64], np.float32),
                            order_replay.evaluate(rest, p[:, 64:], np.float32)])
        return torch.from_numpy(y)

    monkeypatch.setattr(order.Prober, "product", product)
    t = order_plan.target(cases.adhoc(4, k, 512), "float32", "cpu")
    assert order_plan.widths(t) == [512, 64, 16, 1]
    unverified = order.reveal(t)
    assert unverified.width == 512 and order.replay(t, unverified.tree, width=512)["matched"] < 100
    seen = []
    r = order.reveal(t, verify=True, progress=lambda calls, expected: seen.append((calls, expected)))
    assert r.width == 64 and r.verified["matched"] == r.verified["draws"] == 100, (r.width, r.verified)
    # progress counts on over the widths (before, the count restarted at 1 for the second one)
    assert [c for c, _ in seen] == list(range(1, r.calls + 1)), seen
    wide = [c for c, e in seen if e == order_plan.expected_calls(t, 512)]  # the calls at width 512
    later = {wide[-1] + order_plan.expected_calls(t, 64)}
    assert wide and {e for _, e in seen[len(wide):]} == later, seen
    assert trees.to_json(r.tree) == trees.to_json(trees.canonical(first)), describe(r.tree)
    got = order.order_of(t)
    assert got["order_id"] == ids.hex_id(trees.order_id(first, k)) and got["calls"] == r.calls


def test_the_2d_form_of_a_1d_a_is_probed_as_its_own_computation():
    """The seed's `2d` form (A.unsqueeze(0) @ B[:, :n]) runs another op than A @ B[:, :n]: each
    form's tree replays its own computation bit for bit, and explain's orders name the form."""
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan

    case = cases.Case("mv-test", "mv", cases.Shape(1, 512, 300), cases.Shape(1, 512, 300), layout="strided",
                      slice_n=(299,), forms=("as-is", "2d"))
    for form in case.forms:
        t = order_plan.target(case, "float32", "cpu", 299, form=form)
        r = order.reveal(t)
        assert order.replay(t, r.tree, width=r.width)["matched"] == 100, form
    got = order.slice_orders(case, "float32", "cpu", [("n", 299, False, "as-is"), ("n", 299, False, "2d")])
    assert [s["form"] for s in got["slices"]] == ["as-is", "2d"] and all(s["order_id"] for s in got["slices"])
    with pytest.raises(order_plan.ProbeError, match="form '2d'"):
        order_plan.target(cases.get("square"), "float32", "cpu", form="2d")


def test_bad_input_through_python_m_is_one_line_too():
    """gpu_check.sh runs `python -m matmul_drift.cli`: a subcommand's UsageError is caught there too."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "order", "--case", "square", "--form", "2d",
                        "--dtype", "float16"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "matmul-drift: error: form '2d' is not one of the case's (as-is)"], p.stderr


def test_a_corrupt_catalog_entry_is_kept_aside_and_the_tree_stored_again(tmp_path, capsys, monkeypatch):
    """An orders entry cut short (a copy killed halfway, a bad merge) stayed as it was: `order`
    printed its order-id as stored, and `catalog ID` (and the summary) said "unreadable" for good.
    The file is now kept beside it and the tree written again; an entry that reads is not touched."""
    from matmul_drift.cli import main as cli
    from matmul_drift.store import catalog

    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path))
    args = ["order", "--m", "1", "--k", "8", "--n", "1", "--dtype", "float32"]
    assert cli.main(args) == 0
    (entry,) = (tmp_path / "orders").glob("*.json")
    good, ident = entry.read_text(), int(entry.stem, 16)
    stamp = entry.stat().st_mtime_ns
    assert cli.main(args) == 0 and entry.stat().st_mtime_ns == stamp  # stored once
    entry.write_text(good[:20])
    assert cli.main(args) == 0 and f"order-id {entry.stem}" in capsys.readouterr().out
    assert entry.read_text() == good and catalog.load(tmp_path, "orders", ident)["k"] == 8
    (kept,) = (tmp_path / "orders").glob(f"{entry.name}.replaced-*")
    assert kept.read_text() == good[:20] and catalog.find(tmp_path, entry.stem) == [("orders", ident)]
    assert cli.main(["catalog", entry.stem, "--root", str(tmp_path)]) == 0


def test_the_counts_line_reads_as_english(tmp_path, capsys, monkeypatch):
    from matmul_drift.cli import main as cli

    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path))
    assert cli.main(["order", "--m", "1", "--k", "2", "--n", "1", "--dtype", "float32"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert re.match(r"order-id [0-9a-f]{12}; \d+ matmul calls, \d+ pairs, 1 round, ", line), line


@pytest.mark.parametrize("dtype, mkn", [("bfloat16", (64, 2048, 256)), ("float16", (64, 4096, 128)),
                                        ("bfloat16", (64, 1024, 8))])
def test_a_spread_probe_reads_the_row_by_row_tree_in_fewer_calls(monkeypatch, dtype, mkn):
    """fp16 and bf16 outputs count a chunk of products at a time; spread over the other
    operand's rows (columns, for the last shape, probed by rows), one call reads every chunk of
    a probe. The tree is the one read a chunk a call, and replays this CPU's kernel bit for bit."""
    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan

    t = order_plan.target(cases.adhoc(*mkn), dtype, "cpu")
    rows = order_plan.spread_rows(t)
    assert rows == (mkn[2] if t.by_rows else mkn[0]), rows
    spread = order.reveal(t, verify=True)
    monkeypatch.setattr(order, "spread_rows", lambda t: 1)
    one = order.reveal(t, verify=True)
    assert trees.to_json(spread.tree) == trees.to_json(one.tree), (describe(spread.tree), describe(one.tree))
    assert spread.verified["matched"] == one.verified["matched"] == 100
    assert spread.calls < one.calls, (spread.calls, one.calls)
    assert spread.notes[-1].endswith(f"k's pieces in {rows} {'columns' if t.by_rows else 'rows'}"), spread.notes
    assert "pieces" not in one.notes[-1]


def test_rows_that_add_in_different_orders_are_read_one_row_at_a_time(monkeypatch):
    """Hand-built bf16 kernel: row 0 adds its products sequentially, the other rows pairwise.
    The spread probe's rows disagree (or its tree fails the replay), so the probe reads row 0
    alone, a chunk a call, and finds its sequential loop."""
    import torch

    from matmul_drift.core import cases
    from matmul_drift.probes import order, order_plan, order_replay

    k = 512
    first, rest = seq(list(range(k))), pw(list(range(k)))

    def output(self):
        a, b = self.a0.double().numpy(), self.b0.double().numpy()
        y = np.stack([order_replay.evaluate(first if r == 0 else rest, a[r][:, None] * b, np.float32)
                      for r in range(len(a))])
        return torch.from_numpy(y).to(torch.bfloat16)

    monkeypatch.setattr(order.Prober, "_output", output)
    t = order_plan.target(cases.adhoc(16, k, 64), "bfloat16", "cpu")
    assert order_plan.spread_rows(t) == 16
    r = order.reveal(t, verify=True)
    assert trees.to_json(r.tree) == trees.to_json(trees.canonical(first)), describe(r.tree)
    assert r.verified["matched"] == 100 and "pieces" not in r.notes[-1], r.notes
