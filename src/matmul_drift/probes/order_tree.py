"""In which order a matmul adds the K products of one entry: the tree, built from measured pairs.

Pure: no torch, no kernel. ``measure_pairs(pairs, within) -> counts`` is the probe (order.py's
Prober on a real kernel, a simulated one in the tests).

From the counts ``v(i, j) = |child holding i| + |child holding j|`` (leaves), the tree is
built top-down in rounds: each unresolved set of leaves gets the pairs of a pivot (its first
leaf; its last too where the first leaves a large group) with every other leaf; the pivot's
path to the top of the set groups the others by their count; each group is resolved in the
next round. A reading that fits no tree is "order not revealed", never a guessed tree.

Tensor cores add a group of products and the running sum in one fused add that cuts every
term to a fixed width below the largest exponent among them (order_replay.py, ``FUSED``). M
then takes the whole fused node with it, not only the two children holding i and j (FPRev's
reading), and with the products outside a set left 0 such a node reads as a chain of
two-child nodes: ``fuse`` tells them apart with one more pair per two-child node, the products
beside it present. Trees are written in the format of core/trees.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from matmul_drift.core import trees
from matmul_drift.store import catalog


class NotRevealed(Exception):
    """The probe's readings fit no tree (the order depends on the values, the kernel is not a
    tree, or a product was flushed); the message says what was seen, ``calls`` the matmul calls
    spent finding it out."""

    calls = 0


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
        # a new node above `top`: g is one subtree, or several of size s
        if s > 0 and len(g) % s == 0:
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
    # the tree, its holes replaced in place as they resolve
    holder: list = [_Hole(list(range(k)), 1, k)]
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
            readings = {**(h.first or {}),
                        **{(p, j): got[(p, j)] for p in views[-1:] for j in h.leaves if j != p}}
            best = None
            for p in views:
                seen = _path(p, {j: readings[(p, j)] for j in h.leaves if j != p}, len(h.leaves))
                if seen is not None and (best is None or seen[1] < best[1]):
                    best = seen
            if h.first is None and len(h.leaves) > 2 and (best is None
                                                          or 2 * best[1] > len(h.leaves)):
                h.first = readings  # seen from the last leaf too, next round
                continue
            if best is None:
                raise NotRevealed(f"the counts over products {h.leaves[0]}..{h.leaves[-1]} "
                                  f"({len(h.leaves)} of them) fit no tree")
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
            others = itertools.chain.from_iterable(trees.iter_leaves(c) for c in parent[id(x)]
                                                   if c is not x)
            beside = list(itertools.islice(others, sample // 2))
            held.append((list(itertools.islice(trees.iter_leaves(x), sample - len(beside))),
                         beside))
        got = (measure_pairs([pair for _, pair in below], [own + beside for own, beside in held])
               if below else [])
        merged = set()
        for (x, (i, j)), (own, beside), r in zip(below, held, got):
            mine = 2 + len(own) - (i in own) - (j in own)
            if r == mine + len(beside):
                merged.add(id(x))
            elif r != mine:
                raise NotRevealed(f"the pair ({i}, {j}) counted {r}: neither the {mine} products "
                                  f"of its node it holds (a rounded addition) nor "
                                  f"{mine + len(beside)}, with the {len(beside)} beside it "
                                  "(a link of a fused add)")
        # apart: its k products take chunks of their own (spread where rows allow)
        if len(tree) == 2:
            (r,) = measure_pairs([pairs[0]], [everything])
            if r != k:
                raise NotRevealed(f"the pair {pairs[0]} of the top node, every product present, "
                                  f"counted {r} of {k}")
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
