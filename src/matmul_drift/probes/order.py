"""In which order a matmul adds the K products of one output entry, revealed from outside.

The probe is FPRev's (Xie et al., USENIX ATC 2025): every product is ``base`` (or 0), except
+M at index i and -M at index j, with M so large that M plus any partial sum of the others
rounds back to M in the accumulator. The pair then cancels where the two first meet, and the
output counts the products outside the two children of that node that hold i and j. One
probe per column of B, so one call of the exact shape runs N probes; A is all ones, so every
row is the same probe and the entry's own row is read. Where the output cannot count every
product exactly (fp16 holds 11 significant bits, bf16 8), the products are spread over
chunks, one probe each, and the counts added.

From the counts ``v(i, j) = |child holding i| + |child holding j|`` (leaves), the tree is
built top-down in rounds: each unresolved set of leaves gets the pairs of a pivot (its first
leaf; its last too where the first leaves a large group) with every other leaf; the pivot's
path to the top of the set groups the others by their count; each group is resolved in the
next round. A reading that fits no tree is "order not revealed", never a guessed tree;
``replay`` checks a tree bit for bit against the kernel on random inputs whose products are
exact.

The probe runs one case's exact computation (shape, dtype, layout, device, slice) with A all
ones and the probes in B's columns (``Target``, ``Prober``); trees are written in the format of
core/trees.py.

Tensor cores add a group of products and the running sum in one fused add that cuts every
term to a fixed width below the largest exponent among them (Fasi et al., PeerJ CS 2021; bit
for bit, MMA-Sim's rule: Xie et al., arXiv 2511.10909, and ``FUSED``). M then takes the whole
fused node with it, not only the two children holding i and j (FPRev's reading), and with the
products outside a set left 0 such a node reads as a chain of two-child nodes: ``fuse`` tells
them apart with one more pair per two-child node, the products beside it present.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from matmul_drift.core import cases, ids, trees, words
from matmul_drift.core.errors import UsageError
from matmul_drift.measure import inputs, measure
from matmul_drift.store import catalog

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

# How a fused node rounds, tried in this order by the replay: "exact" (summed exactly, rounded
# to nearest once: a CPU's), or a tensor core's fused add into a float32 accumulator as MMA-Sim
# models it bit for bit (Xie et al., arXiv 2511.10909; `t_fdpa` in mmasim/arithmetic/fdpa.py):
# each product aligned by the sum of its operands' exponents, every term cut toward zero to F
# bits below the largest exponent (and e_zero), the sum cut toward zero to float32. F and e_zero
# are MMA-Sim's (mmasim/nv_ptx/sim.py); docs/design.md "The order tree format" has the whole rule,
# and how the names before issue 48 map onto these ("truncated-26" is F = 25).
TENSOR_CORES = {  # name -> (F, e_zero), float32 output
    "volta: aligned to the exponent sum, 23 bits, cut toward zero": (23, -131),  # Fasi et al.'s "24" on V100
    "turing/ampere/ada: aligned to the exponent sum, 24 bits, cut toward zero": (24, -132),
    "hopper/blackwell: aligned to the exponent sum, 25 bits, cut toward zero": (25, -133),  # the H200's
}
FUSED = ("exact", *TENSOR_CORES)

# a format's least normal exponent: its subnormals are read as 0.m x 2^this
LEAST_NORMAL_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126}


class NotRevealed(Exception):
    """The probe's readings fit no tree (the order depends on the values, the kernel is not a
    tree, or a product was flushed); the message says what was seen, ``calls`` the matmul calls
    spent finding it out."""

    calls = 0


class ProbeError(ValueError):
    """The probe cannot run for this K and dtype (bad input: one line, exit 2)."""


def check(k: int, dtype: str) -> None:
    if dtype not in PROBE:
        raise ProbeError(f"no probe for {dtype}; expected one of {', '.join(PROBE)}")
    if k < 2:
        raise ProbeError(f"K = {k}: a sum of one product has no order to reveal")
    if k > MAX_K[dtype]:
        raise ProbeError(f"K = {k} is beyond the probe's exact range for {dtype} (at most {MAX_K[dtype]}: "
                         "the accumulator could not count the products)")


def chunk_size(dtype: str) -> int:
    """The most base products one probe may hold, so that the output counts them exactly."""
    acc, out, base, m = PROBE[dtype]
    absorb = int(m / base) >> (acc + 1)  # partial sums below half an ulp of M vanish into it
    return max(1, min(2**out, absorb))


def chunks(k: int, size: int) -> list[tuple[int, int]]:
    """The ranges [lo, hi) of k, each holding at most ``size`` base products, one probe each."""
    return [(lo, min(lo + size, k)) for lo in range(0, k, size)]


# ---------------------------------------------------------------------------- the tree


@dataclass
class _Hole:
    """A set of leaves to resolve in a later round: ``count`` sibling subtrees of ``size``;
    ``first``, the readings of its first leaf's pairs where they left too large a group."""

    leaves: list[int]
    count: int
    size: int
    first: dict | None = None


@dataclass
class Reveal:
    """A revealed order: ``tree`` (the JSON form), ``calls`` (matmul calls), ``probes``
    (pairs measured), ``rounds``, ``seconds`` (wall time of the probing), ``width`` (the
    output columns, or rows, the probes used: they share the tree), ``verified`` (the replay
    of the tree against the kernel, where one was asked for)."""

    tree: object
    k: int
    calls: int = 0
    probes: int = 0
    rounds: int = 0
    seconds: float = 0.0
    width: int = 1
    notes: list[str] = field(default_factory=list)
    verified: dict | None = None


def _path(pivot: int, values: dict[int, int], total: int):
    """The node over a set of ``total`` leaves, seen from ``pivot``: (node, largest group),
    or None when the counts fit no tree. Children are leaves, nodes or _Holes."""
    groups: dict[int, list[int]] = {}
    for j, v in values.items():
        groups.setdefault(v, []).append(j)
    top: object = pivot
    size, base = 1, None
    for v in sorted(groups):
        g = sorted(groups[v])
        s = v - size  # the size of each of g's subtrees if they meet the pivot's side above `top`
        if s > 0 and len(g) % s == 0:  # a new node above `top`: g is one subtree, or several of size s
            top, base = [top, _Hole(g, len(g) // s, s)], size
        elif base is not None and (t := v - base) > 0 and len(g) % t == 0 and isinstance(top, list):
            top.append(_Hole(g, len(g) // t, t))  # more children of the node `top` (summed exactly)
        else:
            return None
        size += len(g)
    if size != total:
        return None
    return top, max((len(g) for g in groups.values()), default=0)


def _holes(holder: list):
    """(parent list, index, hole) for every _Hole in the tree held at holder[0]."""
    stack = [(holder, 0)]
    while stack:
        parent, i = stack.pop()
        x = parent[i]
        if isinstance(x, _Hole):
            yield parent, i, x
        elif isinstance(x, list):
            stack.extend((x, j) for j in range(len(x)))


def tree_from_pairs(measure_pairs, k: int, max_rounds: int | None = None, progress=None) -> Reveal:
    """The tree over leaves 0..k-1 from ``measure_pairs(pairs, within) -> counts`` (v(i, j) per
    pair; ``within[n]``, the leaves of the set pair n lies in, holds every product v counts, so a
    probe may leave the others 0: after the first round far fewer chunks of fp16/bf16 remain).

    Each set is seen from its first leaf (the pivot), and only where that leaves a group of more
    than half the set, from its last leaf too, in the next round: the better view is taken. A
    loop's first product is usually its deepest, so a set costs one pivot's pairs, not two.

    NotRevealed when the counts fit no tree or the rounds run out (each round measures at
    most 2(k - 1) pairs; a tree of height t needs at most 2t rounds, usually log2 k)."""
    max_rounds = max_rounds or 2 * k.bit_length() + 64
    holder: list = [_Hole(list(range(k)), 1, k)]  # the tree, its holes replaced in place as they resolve
    out = Reveal(tree=None, k=k)
    while True:
        found = list(_holes(holder))
        for parent, i, h in sorted(found, key=lambda t: (id(t[0]), -t[1])):
            if h.size == 1:  # single products: the leaves themselves (siblings when more than one)
                parent[i:i + 1] = h.leaves
        holes = [(parent, i, h) for parent, i, h in _holes(holder) if h.size > 1]
        if not holes:
            break
        out.rounds += 1
        if out.rounds > max_rounds:
            raise NotRevealed(f"not resolved after {max_rounds} rounds of probes")
        pairs, within = [], []
        for _, _, h in holes:
            p = h.leaves[0] if h.first is None else h.leaves[-1]
            pairs += [(p, j) for j in h.leaves if j != p]
            within += [h.leaves] * (len(pairs) - len(within))
        got = dict(zip(pairs, measure_pairs(pairs, within)))
        out.probes += len(pairs)
        # Replace from the back of each parent, so that splices do not move the holes before them.
        for parent, i, h in sorted(holes, key=lambda t: (id(t[0]), -t[1])):
            views = [h.leaves[0], h.leaves[-1]] if h.first is not None else [h.leaves[0]]
            readings = {**(h.first or {}), **{(p, j): got[(p, j)] for p in views[-1:] for j in h.leaves if j != p}}
            best = None
            for p in views:
                seen = _path(p, {j: readings[(p, j)] for j in h.leaves if j != p}, len(h.leaves))
                if seen is not None and (best is None or seen[1] < best[1]):
                    best = seen
            if h.first is None and len(h.leaves) > 2 and (best is None or 2 * best[1] > len(h.leaves)):
                h.first = readings  # seen from the last leaf too, next round
                continue
            if best is None:
                raise NotRevealed(f"the counts over products {h.leaves[0]}..{h.leaves[-1]} ({len(h.leaves)} of "
                                  "them) fit no tree")
            node = best[0]
            if h.count == 1:
                parent[i] = node
            elif (isinstance(node, list) and parent is not holder
                  and sum(c.count if isinstance(c, _Hole) else 1 for c in node) == h.count):
                parent[i:i + 1] = node  # the set was h.count sibling subtrees: the node's children
            else:
                raise NotRevealed(f"expected {h.count} subtrees of {h.size} over products "
                                  f"{h.leaves[0]}..{h.leaves[-1]}; found another shape")
        if progress:
            progress(out.rounds, out.probes)
    out.tree = trees.canonical(holder[0])
    return out


def fuse(tree, measure_pairs, k: int, sample: int | None = None):
    """The tree with every chain of two-child nodes that is one fused add of a tensor core
    merged into that node: (tree, pairs measured, links merged); the tree given is left as it
    is. One pair per two-child node, a leaf of each child. Where one reading counts all k
    products (``sample`` None or at least k), every product is present: the pair counts its
    node's products where the node is a rounded addition, and the whole fused node's where it is
    a link of such a chain (M cut every term of it away). Where a reading counts at most
    ``sample`` (fp16, bf16), each pair holds some of its node's products and as many beside the
    node in its parent: it absorbs the ones beside too only where the node is a link; and the top
    node's pair, every product present, must absorb them all. NotRevealed when a reading fits
    neither (as where columns that add in other orders were read as one)."""
    tree = trees.from_json(trees.to_json(tree))  # a copy, made without recursion
    if not isinstance(tree, list):
        return tree, 0, 0
    order_ = trees.inner_nodes(tree)  # parents before children
    parent: dict[int, list | None] = {id(tree): None}
    parent.update((id(c), x) for x in order_ for c in x if isinstance(c, list))
    first = trees.fold(tree, int, min)  # each node's smallest product
    links = [x for x in order_ if len(x) == 2]
    pairs = [(first(x[0]), first(x[1])) for x in links]
    everything = list(range(k))  # one list: the probe fills its products once for all pairs
    if sample is None or sample >= k:
        got = measure_pairs(pairs, [everything] * len(links)) if links else []
        merged = _chains(links, pairs, got, parent, trees.fold(tree, lambda c: 1, sum))
    else:
        below = [(x, pair) for x, pair in zip(links, pairs) if parent[id(x)] is not None]
        held = []  # per link below the top: (products of its own held, those beside it)
        for x, _ in below:
            others = itertools.chain.from_iterable(trees.iter_leaves(c) for c in parent[id(x)] if c is not x)
            beside = list(itertools.islice(others, sample // 2))
            held.append((list(itertools.islice(trees.iter_leaves(x), sample - len(beside))), beside))
        got = measure_pairs([pair for _, pair in below], [own + beside for own, beside in held]) if below else []
        merged = set()
        for (x, (i, j)), (own, beside), r in zip(below, held, got):
            mine = 2 + len(own) - (i in own) - (j in own)
            if r == mine + len(beside):
                merged.add(id(x))
            elif r != mine:
                raise NotRevealed(f"the pair ({i}, {j}) counted {r}: neither the {mine} products of its node it holds "
                                  f"(a rounded addition) nor {mine + len(beside)}, with the {len(beside)} beside it "
                                  "(a link of a fused add)")
        if len(tree) == 2:  # apart: its k products take chunks of their own (spread where rows allow)
            (r,) = measure_pairs([pairs[0]], [everything])
            if r != k:
                raise NotRevealed(f"the pair {pairs[0]} of the top node, every product present, counted {r} of {k}")
    for x in reversed(order_):  # children first: a link's children go up into its parent's place
        if id(x) in merged:
            up = parent[id(x)]
            at = next(i for i, c in enumerate(up) if c is x)
            up[at:at + 1] = x
            for c in x:
                if isinstance(c, list):
                    parent[id(c)] = up
    return trees.canonical(tree), len(links), len(merged)


def _chains(links, pairs, got, parent, size) -> set[int]:
    """fuse's links merged, from readings with every product present: those that counted more
    than their own node, all of the fused node at the top of their chain."""
    reading = {id(x): r for x, r in zip(links, got)}
    merged = set()
    for x, (i, j), r in zip(links, pairs, got):
        if r == size(x):
            continue
        top = parent[id(x)]
        while top is not None and id(top) in reading and reading[id(top)] > size(top):
            top = parent[id(top)]  # the chain goes on above
        if r < size(x) or top is None or size(top) != r:
            raise NotRevealed(f"the pair ({i}, {j}) with every product present counted {r}: "
                              f"neither its node's {size(x)} products nor a fused node's above it")
        merged.add(id(x))
    return merged


def store(root, tree, k: int) -> int:
    """Keep the tree in the catalog (kind "orders") and return its order-id."""
    return catalog.store_text(root, "orders", trees.entry_text(tree, k))


# ---------------------------------------------------------------------------- replay


def exponents(x: np.ndarray, dtype: str) -> np.ndarray:
    """The exponent a tensor core reads from each value of ``dtype`` in ``x`` (float64): e with
    2^e <= |x| < 2^(e+1), but never below the format's least normal exponent (a subnormal is
    0.m x 2^that); int16. Zeros, inf and NaN get that least one too (a fused add places zeros
    itself; inf and NaN decide the sum whatever their exponent)."""
    _, e = np.frexp(x)
    return np.maximum(e - 1, LEAST_NORMAL_EXPONENT[dtype]).astype(np.int16)


def product_exponents(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """The exponent a tensor core aligns each product a * b by (operands of ``dtype``, as float64,
    broadcast together): the sum of the operands' exponents, not the product's own; int16."""
    return exponents(a, dtype) + exponents(b, dtype)


def truncated_sum(terms: np.ndarray, exps: np.ndarray, bits: int, zero: int) -> np.ndarray:
    """A tensor core's fused add (``FUSED``, MMA-Sim's ``t_fdpa``) of ``terms`` (shape (n, draws),
    float64, exact: products of the operands and the running sum), each aligned by its exponent in
    ``exps`` (product_exponents; a zero's is ``zero``): per draw every term cut toward zero to a
    multiple of 2^(e_max - bits), e_max the largest exponent and ``zero``, the cut terms summed
    exactly, the sum cut toward zero to float32: inf at 2^128 and beyond, +0 for zero, NaN as
    0x7fffffff. Returns float32 (draws,)."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN go through as IEEE says
        e = np.where(terms == 0, zero, exps).max(axis=0, initial=zero).astype(np.int32)  # e_max, at least `zero`
        scale = (bits - e)[None, :]
        cut = np.ldexp(np.trunc(np.ldexp(terms, scale)), -scale)
        s = cut.sum(axis=0)  # exact: multiples of 2^(e_max - bits), n of them each below 2^(e_max + 2)
        out = s.astype(np.float32)
        over = np.abs(out.astype(np.float64)) > np.abs(s)  # rounded away from zero: one step back
        out[over] = np.nextafter(out[over], np.float32(0))
        big = np.abs(s) >= 2.0**128  # cut to 24 bits, still beyond float32: inf (MMA-Sim, the hardware)
        out[big] = np.copysign(np.float32(np.inf), s[big]).astype(np.float32)
    out += np.float32(0)  # -0 to +0
    out.view(np.uint32)[np.isnan(out)] = 0x7FFFFFFF
    return out


def exact_sum(terms: np.ndarray, acc: np.dtype) -> np.ndarray:
    """The exact sum of ``terms`` (shape (n, draws), float64) per draw, rounded once to ``acc``;
    a draw holding inf or NaN sums as IEEE says (inf, or NaN for inf - inf), where fsum raises."""
    finite = np.isfinite(terms).all(axis=0)
    with np.errstate(invalid="ignore"):
        out = terms.sum(axis=0)
    out[finite] = [math.fsum(col) for col in terms[:, finite].T]
    with np.errstate(over="ignore"):
        return out.astype(acc)


def evaluate(tree, values: np.ndarray, acc: np.dtype, fused: str = "exact",
             exps: np.ndarray | None = None) -> np.ndarray:
    """The tree's sum of ``values`` (products, shape (k, draws), exact in ``acc``), each two-child
    node one rounded addition in ``acc``, each larger node one fused add as ``fused`` (one of
    ``FUSED``; a tensor core's only with a float32 accumulator) says. A tensor core aligns a
    product by its operands' exponents: ``exps`` ((k, draws), product_exponents of the operands);
    without it each product is read as a float32 value times 1 (its own exponent), which is what
    the operands give where one of them is a power of two and both are normal. A tensor core's
    fused add takes the products exactly (float64), also beyond float32's range."""
    acc = np.dtype(acc)
    tc = TENSOR_CORES.get(fused)
    if tc is None and fused != "exact":
        raise ValueError(f"{fused!r} is not one of {', '.join(FUSED)}")
    if tc is not None and acc != np.float32:
        raise ValueError(f"{fused} is a float32 accumulator's fused add, not {acc}'s")
    memo: dict[int, np.ndarray] = {}
    stack = [(tree, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, list):
            continue
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in node if isinstance(c, list))
            continue
        if len(node) > 2 and tc is not None:  # the products exact, each with its alignment exponent
            terms = np.stack([memo.pop(id(c)).astype(np.float64) if isinstance(c, list)
                              else np.asarray(values[c], dtype=np.float64) for c in node])
            own = exponents(terms, "float32")  # the running sum's; a product's where no exps are given
            if exps is not None:
                leaf = [i for i, c in enumerate(node) if not isinstance(c, list)]
                own[leaf] = exps[[node[i] for i in leaf]]
            memo[id(node)] = truncated_sum(terms, own, *tc)
            continue
        kids = [values[c].astype(acc) if not isinstance(c, list) else memo.pop(id(c)) for c in node]
        if len(kids) == 2:
            memo[id(node)] = (kids[0] + kids[1]).astype(acc)
        else:
            memo[id(node)] = exact_sum(np.stack(kids).astype(np.float64), acc)
    return memo[id(tree)] if isinstance(tree, list) else values[tree].astype(acc)


# ---------------------------------------------------------------------------- on a real kernel


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
        from matmul_drift.measure import memory

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


class Prober:
    """Operands of the target's storage shapes on its device, filled per call: A all ones
    and the probes in B's columns, or (``by_rows``) B all ones and the probes in A's rows."""

    def __init__(self, t: Target, width: int | None = None, rows: int = 1):
        import torch

        self.t = t
        self.width = width or t.width  # probes a call: the first `width` columns (rows)
        self.rows = rows  # > 1: k's pieces spread over this many rows (columns) of the other operand
        self.used = 0  # the most columns (rows) a call's probes filled
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
        _, _, self.base, self.big = PROBE[t.dtype]
        self.chunk = chunk_size(t.dtype)
        self._buf: np.ndarray | None = None
        self._loaded = 0  # columns (rows) of the operand the last call filled
        self._masked = False  # whether _spread left masks in the other operand's rows (columns)

    def _buffer(self, cols: int) -> np.ndarray:
        """The probes of one call, (K, cols) in float32, zeroed. Kept between calls and only as wide
        as a call needs: first-touching a K x 51000 buffer alone took 1.8 s here."""
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
        import torch

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
                hit = sets[id(leaves)] = ([arr[lo:hi] for lo, hi in chunks(len(arr), self.chunk)], [])
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
                raise NotRevealed(f"probe ({i_[c]}, {j_[c]}) read {got[c]!r} products: not a count (the "
                                        "kernel flushed or reordered by value, or M was not absorbed)")
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
        import torch

        k = self.t.k
        within = within or [range(k)] * len(pairs)
        masks: dict[int, np.ndarray] = {}  # id(leaf list) -> its leaves as a mask over k
        for w in within:
            if id(w) not in masks:
                masks[id(w)] = np.zeros(k, bool)
                masks[id(w)][np.asarray(w, dtype=np.int64)] = True
        total, n0 = [2] * len(pairs), 0
        while n0 < len(pairs):
            size, pieces = spread_plan(pairs[n0:n0 + self.width], [masks[id(w)] for w in within[n0:n0 + self.width]],
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
            held_s = wm[s_].sum(0) - wm[i_, cols] - wm[j_, cols]  # base products of S in each column
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
                if not (np.isfinite(got) & (got == np.round(got)) & (got >= 0) & (got <= held)).all():
                    raise NotRevealed("a spread probe read a value that is not a count (the kernel flushed or "
                                      "reordered by value, or M was not absorbed)")
                got = got.astype(np.int64)
                lost = (held - got) - (held_s - got[0])  # each piece's products absorbed, S's taken out
                if ((got_s is not None and (got[0] != got_s).any()) or (lost[1:] < 0).any()
                        or (lost[1:] > held[1:] - held_s).any()):
                    raise NotRevealed("the rows of a spread probe disagree: they add in different orders")
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


def group_calls(free: int, room: int, rows: int) -> int:
    """Matmul calls of one spread group: its ``free`` leaves (outside S) in pieces of ``room``,
    ``rows`` - 1 pieces a call (row 0 holds S), at least one call."""
    return max(1, -(-(-(-free // room)) // (rows - 1)))


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
    n = max(1, -(-len(leaves) // (chunk - len(s_))))
    return size, [p for p in np.array_split(leaves, n) if len(p)]


def _member(sorted_leaves: np.ndarray, x: np.ndarray) -> np.ndarray:
    """1 where x is one of the sorted leaves, else 0."""
    pos = np.minimum(np.searchsorted(sorted_leaves, x), len(sorted_leaves) - 1)
    return (sorted_leaves[pos] == x).astype(np.int64)


def calls_per_round(t: Target, width: int | None = None) -> int:
    """Matmul calls of one round at most: 2(K - 1) pairs, times the chunks of k, over the
    probes one call holds (a tree of height h takes at most h rounds, usually log2 K)."""
    return -(-2 * (t.k - 1) * len(chunks(t.k, chunk_size(t.dtype))) // (width or widths(t)[0]))


ROUNDS = 3  # rounds a CPU tree took here: 1 to 3 for every route of the catalog (docs/design.md, "Summation orders")


def expected_calls(t: Target, width: int | None = None, rows: int = 1) -> int:
    """Matmul calls the probe is expected to take: ROUNDS rounds of calls_per_round, or with
    ``rows`` > 1 (spread) of 2(K - 1) pairs in the widest group spread_plan would take."""
    if rows == 1:
        return calls_per_round(t, width) * ROUNDS
    chunk, width = chunk_size(t.dtype), width or widths(t)[0]
    best = max((c / group_calls(t.k - c - 1, chunk - c - 1, rows), c) for c in range(1, min(width, chunk - 3) + 1))
    return -(-2 * (t.k - 1) * ROUNDS // int(best[0]))


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
        return -(-links // width)
    return -(-(links - 1) // width) + -(-len(chunks(k, chunk)) // width)


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
    spread = spread_rows(t)  # first all of k's pieces in one call; where the rows disagree, as before
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
                    out.notes.append(f"{trees.fused_nodes(out.tree)} fused adds, {merged} links of their chains merged")
        except NotRevealed as exc:
            calls += p.calls
            why = f"{exc} ({where})"
            del p
            continue
        # on the probe's own operands (each width has its own); its calls are not probe calls
        used = p.used if rows > 1 else w  # a spread group is narrower than the width
        out.verified = replay(t, out.tree, width=used, prober=p) if verify else None
        calls += p.calls
        del p  # one set of operands at a time (Target.bytes_needed)
        if verify and out.verified["matched"] != out.verified["draws"]:
            why = (f"the replay matched {out.verified['matched']} of {out.verified['draws']} draws "
                   f"(first mismatch {out.verified['first_mismatch']}; {where})")
            continue
        out.calls, out.seconds, out.width = calls, time.perf_counter() - t0, used
        out.notes.append(f"probes in the first {used} {axis}" + (f", k's pieces in {rows} {other}" if rows > 1 else ""))
        return out
    exc = NotRevealed(why or "no probe width fits the call budget")
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
    acc = PROBE[dtype][0]
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
    import torch

    p = prober or Prober(t)
    rng = np.random.default_rng(seed)
    dt = getattr(torch, t.dtype)
    products, kernel = np.empty((t.k, draws)), []
    # a tensor core's fused add aligns each product by its operands' exponents
    exps = np.empty((t.k, draws), np.int16) if trees.fused_nodes(tree) and t.dtype in LEAST_NORMAL_EXPONENT else None
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
        each = _products(rng, t.k, w, t.dtype)
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


def replay_calls(draws: int, width: int) -> int:
    """The matmul calls ``replay`` makes for ``draws`` over ``width`` columns (rows): one where
    they are more than the draws (spread over them), else a call for every ``width`` draws."""
    return 1 if width > draws else -(-draws // width)


def match(tree, products: np.ndarray, kernel: list[tuple[int, float]], dtype: str,
          exps: np.ndarray | None = None) -> dict:
    """The tree's sums of ``products`` ((k, draws), exact in the accumulator; ``exps``, where
    given, the sums of their operands' exponents: product_exponents) against the
    kernel's outputs (bits, value) in ``dtype``: draws, matched and the first mismatch (under
    the first way that matches most draws), and fused_add: for a tree with fused nodes, every
    way of FUSED (fp32 accumulators; fp64 rounds exactly) that matches every draw, often
    more than one where the output's rounding hides the accumulator's; None for a tree of
    two-child nodes."""
    acc = np.float64 if dtype == "float64" else np.float32
    fused = trees.fused_nodes(tree) > 0
    best, ways = None, []
    for way in FUSED if fused and acc is np.float32 else FUSED[:1]:
        want = evaluate(tree, products, acc, way, exps)  # every draw at once
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
    the label of the target first probed. A tree revealed there for the same K (``kin``) is
    replayed first (``adopted``); only where none replays bit for bit is ``t`` probed."""
    key = (t.computation(), max_calls, verify)
    if memo is not None and key in memo:
        return {**memo[key], "calls": 0}
    got, spent = adopted(t, memo) if memo is not None and verify and not over_budget(t, max_calls) else (None, 0)
    if got is None:  # the calls of the replays that failed count with the probe's
        got = _order_of(t, max_calls, verify)
        got = {**got, "calls": got["calls"] + spent}
    if memo is not None:
        memo[key] = {**got, "same_as": t.label, "k": t.k}
    return got


ADOPT_TRIES = 2  # distinct earlier trees replayed before the probe runs: a failed try costs a replay


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
        if near is None or got.get("k") != t.k or got.get("tree") is None or got["order_id"] in seen:
            continue
        seen.add(got["order_id"])
        found.append((near, got))
    calls, w = 0, widths(t)[0]
    for _, got in sorted(found, key=lambda f: f[0])[:ADOPT_TRIES]:  # stable: the earliest first among equals
        r = replay(t, got["tree"], width=w)
        calls += replay_calls(r["draws"], w)
        if r["matched"] == r["draws"]:
            return {"probed": True, "tree": got["tree"], "order_id": got["order_id"], "summary": got["summary"],
                    "calls": calls, "reason": None, "adopted": got.get("adopted") or got["same_as"]}, calls
    return None, calls


def _order_of(t: Target, max_calls: int, verify: bool) -> dict:

    out = {"probed": True, "tree": None, "order_id": None, "summary": "not revealed", "calls": 0, "reason": None}
    refused = over_budget(t, max_calls)
    if refused:
        return {**out, "probed": False, "summary": "not probed", "reason": refused}
    try:
        r = reveal(t, max_calls=max_calls, verify=verify)
    except NotRevealed as exc:
        return {**out, "calls": exc.calls, "reason": str(exc)}
    return {**out, "calls": r.calls, "tree": r.tree, "order_id": ids.hex_id(trees.order_id(r.tree, t.k)),
            "summary": words.describe(r.tree)}


def _explained(got: dict) -> dict:
    """explain's view: order_id (None unless revealed), then summary, calls and same_as (where
    the computation was probed before, as another target), or the reason."""
    if got["order_id"] is None:
        return {"order_id": None, "reason": got["reason"]}
    return {k: got[k] for k in ("order_id", "summary", "calls", "same_as", "adopted") if k in got}


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


def checked_target(case_id: str | None, mkn: tuple, slice_n: int | None, slice_m: int | None, form: str, dtype: str,
                   device: str, row: int, col: int, host_check: bool, max_calls: int) -> Target:
    """The Target of `matmul-drift order`: case ``case_id``, else the ad-hoc (m, k, n) of ``mkn``.
    UsageError (one line) when the probe cannot run: a slice or entry the case lacks, a device or
    dtype it cannot take, too little memory, more than ``max_calls`` calls expected, or a catalog
    that cannot take the tree."""
    from matmul_drift.measure import memory
    from matmul_drift.store import atomic

    try:
        case = cases.get(case_id) if case_id is not None else cases.adhoc(*mkn)
        cases.check_slices(case, case.shape(device), slice_n, slice_m, form)
        t = target(case, dtype, device, slice_n, slice_m, row, col, form)
    except (ValueError, measure.Unavailable) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    try:
        memory.check(t.bytes_needed(), f"the probe of {t.label} in {t.dtype},", t.device, host_check)
    except memory.TooLarge as exc:
        raise UsageError(str(exc)) from None
    refused = over_budget(t, max_calls)
    if refused:
        raise UsageError(f"{refused} (--max-calls)")
    orders = catalog.default_root() / "orders"  # checked before minutes of probing, not after
    try:
        orders.mkdir(parents=True, exist_ok=True)
        problem = atomic.folder_problem(orders / "tree.json")
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem:
        raise UsageError(f"the catalog cannot take the tree: {orders}: {problem} (MATMUL_DRIFT_CATALOG names another)")
    return t
