"""A summation-order tree (core/trees.py) read in words: "sequential", "pairwise", "8 lanes ×
512 sequential; lanes then pairwise", and so on. The order-id, not these words, is what the
summary judges; docs/design.md tells how the readings are named."""

from __future__ import annotations

import re

from matmul_drift.core.trees import fold, from_json, inner_nodes, leaves, to_json


def _shapes(node):
    """A small int naming a subtree's shape (the tree with its leaves erased: 0 for a product),
    as a function of the subtree."""
    names: dict[tuple, int] = {}
    return fold(node, lambda c: 0, lambda v: names.setdefault(tuple(v), len(names) + 1))


def _pairwise(node, depth: int) -> list | None:
    """The 2^depth parts of a complete binary tree of that depth, else None."""
    level = [node]
    for _ in range(depth):
        nxt = []
        for x in level:
            if not isinstance(x, list) or len(x) != 2:
                return None
            nxt += x
        level = nxt
    return level


def describe(node, depth: int = 0) -> str:
    """The tree in words: "sequential", "pairwise", "fused group of 4", or parts:
    "4 chunks of 1024; each: ...; chunks sequential" ("lanes" where parts interleave by one
    stride, "parts" where they interleave otherwise; "4 lanes × 2..3 sequential" where K is no
    multiple of the lanes, "3 chunks of 32 and 1 of 4; each: ..." where it is no multiple of the
    block; two or three parts of two sizes named one by one in index order, "2 chunks of 28 and 4;
    each: ..." where they read alike; two or three that read otherwise, whatever their sizes,
    "2 chunks of 32 [its reading] and 4 [pairwise]; ...", and more "varied"), and a scalar
    loop's remainder: "...; then 2 more products sequential" (added to the sum), "4 lanes × 2
    sequential, then 2 more products into lane 0; ...", "8 lanes × 4 pairwise, then 1 more
    product into each of lanes 0..4; ...", and a running sum over blocks of neighbours added in
    the same steps: "4 blocks of 8: the first pairwise, then each of the 3 others added to the
    running sum in 4 steps (offsets in the block): 6, 4, 5+7, (0+2)+(1+3)" ("2 blocks of 8: ...,
    then the second added ..." where
    one block follows the first), and a running sum carried from the first product into the first
    product (lane 0) of each later run of neighbours: "product 0, then 2 runs, the sum so far added
    first to each one's first product: 1..48 [16 lanes × 3 sequential; lanes then pairwise], 49..62
    [8 lanes × 1..2 sequential; lanes then pairwise]". A reading set in another is bracketed where
    it has parts of its own."""
    if node is None:
        return "not revealed"
    if not isinstance(node, list):
        return "one product"
    return _known(node, depth) or _parts(list(node), "added", depth)


def _known(node: list, depth: int) -> str | None:
    """describe's words for an inner node but its last resort (its parts one by one, or
    "varied"); None where only that fits."""
    if (words := _reading(node, depth)) is not None:
        return words
    # Two blocks read as blocks only where no remainder reading fits: with one block after the
    # first, a sum and its last products added one at a time read so too.
    found = _blocks(node, depth)
    if found is not None and found[1] > 2:
        return found[0]
    return _remainder(node, depth) or (found and found[0]) or _stages(node, depth)


def _stages(node: list, depth: int) -> str | None:
    """A running sum carried through runs of neighbouring products, in words: from the first
    product, each run summed by a tree of its own, the sum so far added first to the run's first
    product (into lane 0 of a run read as lanes). MKL's float32 matrix-vector kernel: product 0,
    then 16 lanes over 1..16q, then 8 lanes over the rest. None for any other tree: where the
    products are no run of neighbours, where the first product goes into a chain (with the second
    alone: a sequential start), into chunks added one at a time or into no run, or where a run of
    two products or more reads only by describe's last resort. A run of one product is added to
    the sum alone; such runs in a row read as one, "sequential". The path down to the first
    product is walked with a loop: it may be K deep."""
    if depth > 3:
        return None
    held = _held(node)
    # (smallest, largest)
    end = fold(node, lambda c: (c, c), lambda v: (min(e[0] for e in v), max(e[1] for e in v)))
    lo, hi = end(node)
    if hi - lo != held(node) - 1:
        return None  # runs are named by their first and last products: neighbours only
    # The path down to the first product, and the cuts on it: nodes [sum of products lo..c-1,
    # product c].
    path, steps, cuts = [node], [], []
    while isinstance(x := path[-1], list):
        i = min(range(len(x)), key=lambda i: end(x[i])[0])
        if (len(x) == 2 and not isinstance(c := x[1 - i], list)
                and end(x[i])[1] == c - 1 == lo + held(x[i]) - 1):
            cuts.append(len(path) - 1)
        path.append(x[i])
        steps.append(i)
    if not cuts or cuts[-1] != len(path) - 2 or cuts[-2:-1] == [len(path) - 3]:
        return None  # the first product goes into no run, or into the second alone
    items, alone = [], []  # alone: runs of one product in a row, not yet said
    said = lambda: (f"{alone[0]}..{alone[-1]} [sequential]"  # noqa: E731
                    if len(alone) > 1 else f"{alone[0]}")
    for at, above in zip(cuts[::-1], [*cuts[-2::-1], -1]):  # each cut, the first product's first
        run = path[at][1 - steps[at]]  # the run's first product
        # the run: its tree, the cut replaced by its first product
        for k in range(at - 1, above, -1):
            run = [*path[k][:steps[k]], run, *path[k][steps[k] + 1:]]
        if not isinstance(run, list):
            alone.append(run)
            continue
        if alone:
            items.append(said())
            alone = []
        if not items and not _spread(run):
            return None  # the first product goes into a chain, or into chunks added one at a time
        if (words := _known(run, depth + 1)) is None:
            return None
        items.append(f"{end(path[at])[1]}..{end(path[above + 1])[1]} [{words}]")
    if alone:
        items.append(said())
    each = "its" if len(items) == 1 else "each one's"
    return (f"product {lo}, then {len(items)} run{'s' * (len(items) != 1)}, "
            f"the sum so far added first to {each} "
            "first product: " + ", ".join(items))


def _reading(node: list, depth: int) -> str | None:
    """describe's words for an inner node; None where no reading fits."""
    if len(node) > 2:
        if all(not isinstance(c, list) for c in node):
            return f"fused group of {len(node)}"
        if running := _running(node):
            return running
        return _parts(list(node), "fused into one rounding", depth)
    found = _finest(node)
    return None if found is None else _words(*found, depth)


def _words(parts: list, how: str, depth: int) -> str:
    """A reading of a two-child node (_options': its parts, "sequential" or "pairwise") in words."""
    if not any(isinstance(p, list) for p in parts):  # single products
        return how + _index_order(parts)
    return _parts(parts, how, depth)


def _finest(node: list) -> tuple[list, str] | None:
    """(parts, "sequential" or "pairwise"): the finest reading of a two-child node whose parts
    are all alike, or are lanes, or chunks with a short last one; None where none fits."""
    options = _options(node)
    return max(options, key=lambda o: len(o[0])) if options else None  # the finest reading


def _held(node: list):
    """How many products a subtree of ``node`` adds (1 for a product), as a function."""
    return fold(node, lambda c: 1, sum)


def _down(node: list, held) -> list[tuple]:
    """A chain ((a + b) + c) + d read down its running sum, the larger child of each two-child
    node (``held``: _held's): (the running sum below, the part added to it) at each stop, from
    the top. A loop: the chain may be K deep."""
    stops, bottom = [], node
    while isinstance(bottom, list) and len(bottom) == 2:
        bottom, r = bottom if held(bottom[0]) >= held(bottom[1]) else bottom[::-1]
        stops.append((bottom, r))
    return stops


def _options(node: list) -> list[tuple[list, str]]:
    """Every reading of a two-child node _finest chooses from: the alike parts' first, then lanes
    and chunks of two sizes (a tie keeps the first)."""
    sid = _shapes(node)
    options = []
    # A chain ((a + b) + c) + d read down its running sum, the larger child of each node (the
    # canonical order puts it second where a loop meets a smaller index later, as one run
    # backwards): the deepest stop at which the bottom and every part added are alike.
    held = _held(node)
    # Lanes of a SIMD loop over K no multiple of their number n hold K // n or K // n + 1
    # products, so they are not alike: ``uneven`` keeps the stops where the parts' sizes differ
    # by at most one (a few: the bottom shrinks at every stop), taken where they are lanes.
    # Chunks of a blocked loop over K no multiple of its block: all of one size but a short last
    # one, ``blocked`` (a few stops: the bottom, as large as the most parts added, shrinks).
    rights, alike, best, uneven, blocked = [], True, None, [], []
    least = most = None  # the sizes of the parts added to the running sum so far
    count: dict[int, int] = {}  # how many of them hold each size
    for bottom, r in _down(node, held):
        alike = alike and (not rights or sid(r) == sid(rights[-1]))
        rights.append(r)
        least, most = min(least or held(r), held(r)), max(most or 0, held(r))
        count[held(r)] = count.get(held(r), 0) + 1
        if alike and sid(bottom) == sid(r):
            best = (bottom, len(rights))
        elif max(most, held(bottom)) - min(least, held(bottom)) <= 1:
            uneven.append(([bottom, *reversed(rights)], "sequential"))
        elif held(bottom) == most and len(count) == 2 and count[least] == 1:
            blocked.append(([bottom, *reversed(rights)], "sequential"))
    if best is not None:
        b, n = best
        options.append(([b, *reversed(rights[:n])], "sequential"))
    d = 1
    while (parts := _pairwise(node, d)) is not None:
        if len({sid(p) for p in parts}) == 1:
            options.append((parts, "pairwise"))
        elif max(map(held, parts)) - min(map(held, parts)) <= 1:
            uneven.append((parts, "pairwise"))
        else:
            blocked.append((parts, "pairwise"))
        d += 1
    # after the alike: a tie keeps their reading
    return options + [o for o in uneven if _lanes(o[0])] + [o for o in blocked if _short_last(o[0])]


def _remainder(node: list, depth: int) -> str | None:
    """A scalar loop's remainder in words: products added one at a time (a left-deep chain of
    single products) on top of the lanes' sum, or the last products of K so added to one lane
    before the lanes are; None for any other tree."""
    tail, x = [], node  # the products added on top, the last first
    while isinstance(x, list) and len(x) == 2 and sum(isinstance(c, list) for c in x) == 1:
        x, r = x if isinstance(x[0], list) else x[::-1]
        tail.append(r)
    more = "1 more product" if len(tail) == 1 else f"{len(tail)} more products sequential"
    more += _index_order(tail[::-1])
    found = _finest(x) if tail and isinstance(x, list) and len(x) == 2 else None
    if found is not None and (_lanes(found[0]) or not any(isinstance(p, list) for p in found[0])):
        # lanes of one or two products each may read as single products added pairwise
        return f"{_words(*found, depth)}; then {more}"
    # Or into a lane; else, where they are the last products of K in index order, on top of
    # whatever the rest is (blocks added to a running sum, _blocks): x has no such tail of its own,
    # so describe(x) comes back here no further.
    if ((into := _into_lane(node, depth)) is None and tail
            and tail[::-1] == list(range(tail[-1], tail[-1] + len(tail)))):
        if tail[0] == max(leaves(node)):
            return f"{describe(x, depth)}; then {more}"
    return into


def _into_lane(node: list, depth: int) -> str | None:
    """The last products of K added one at a time to one lane before the lanes are added, in
    words; None for any other tree."""
    # Into a lane: the last products h, h - 1, ... each the leaf beside a running sum, spliced
    # out of a copy of the tree, leave lanes of which that running sum is one.
    tree = from_json(to_json(node))  # a copy, made without recursion
    nodes = inner_nodes(tree)
    up = {id(c): x for x in nodes for c in x if isinstance(c, list)}  # parent of each inner node
    tail = [max(leaves(tree))]
    top = next(x for x in nodes if tail[0] in x)  # the last product's node, the tail's top
    lane = top[0] if top[1] == tail[0] else top[1]
    while isinstance(lane, list) and len(lane) == 2 and tail[-1] - 1 in lane:
        below = lane[0] if lane[1] == tail[-1] - 1 else lane[1]
        if not isinstance(below, list):
            break
        tail.append(tail[-1] - 1)
        lane = below
    if len(top) != 2 or not isinstance(lane, list) or id(top) not in up:
        return None
    parent = up[id(top)]
    parent[next(i for i, c in enumerate(parent) if c is top)] = lane  # by identity: == recurses
    found = _finest(tree) if len(tree) == 2 else None
    if found is None or not any(p is lane for p in found[0]) or not _lanes(found[0]):
        return None
    i = sorted(min(leaves(p)) for p in found[0]).index(min(leaves(lane)))
    more = "1 more product" if len(tail) == 1 else f"{len(tail)} more products"
    return _parts(*found, depth, into=f", then {more} into lane {i}")


def _lanes(parts: list) -> bool:
    """Whether part i holds every n-th product from start + i (n parts), whatever order the
    parts are added in (a horizontal reduction adds lane 4 to lane 0 first)."""
    held = sorted(sorted(leaves(p)) for p in parts)
    n, start = len(parts), held[0][0]
    return n > 1 and all(h == list(range(start + i, start + i + n * len(h), n))
                         for i, h in enumerate(held))


def _spread(node: list) -> bool:
    """Whether a subtree's finest reading adds parts pairwise, or lanes (of two products or more,
    in any order)."""
    found = _finest(node) if len(node) == 2 else None
    return found is not None and (found[1] == "pairwise" or _lanes(found[0])
                                  and any(isinstance(p, list) for p in found[0]))


def _running(node) -> str | None:
    """A tensor core's loop in words: a left-deep chain of fused adds, each of the running sum
    and a group of products, down to a first group; None for any other tree."""
    groups, x = [], node  # each group's products, the last added first
    while (isinstance(x, list) and len(x) > 2
           and len(sums := [c for c in x if isinstance(c, list)]) == 1):
        # the running sum: any child (canonical order)
        groups.append(sorted(c for c in x if not isinstance(c, list)))
        x = sums[0]
    if not groups or not isinstance(x, list) or any(isinstance(c, list) for c in x):
        return None
    groups.append(sorted(x))
    sizes = [len(g) for g in groups]
    size = f"{sizes[0]}" if len(set(sizes)) == 1 else f"{min(sizes)}..{max(sizes)}"
    return (f"sequential in {len(groups)} fused groups of {size}, "
            "each added with the running sum in one rounding"
            + _index_order([k for g in reversed(groups) for k in g]))


def _blocks(node: list, depth: int) -> tuple[str, int] | None:
    """A running sum over blocks of B neighbouring products in words, and the number of blocks:
    the first block summed by any tree (it seeds the sum), then each later one, in index order,
    added to the running sum in the same steps (a product or a sum of some of the block's, at the
    same offsets in every block); None for any other tree, for no block after the first, for one
    added in one step, in more steps than half its products, or where the sum's two parts are
    chunks (runs of neighbours), and where every step is one product (that is sequential). The
    chain is walked with a loop: it is K deep."""
    held = _held(node)
    stops = _down(node, held)
    # chain[s]: the running sum before rights[s - 1], ..., rights[0] are added
    chain = [node, *(x for x, _ in stops)]
    rights = [r for _, r in stops]
    total, lo = held(node), min(leaves(node))
    for s in range(len(chain) - 1, 0, -1):  # the smallest first block first: the finest reading
        b = held(chain[s])
        if b < 2 or total % b or total // b < 2 or s % (total // b - 1):
            continue
        others = total // b - 1
        m = s // others  # steps per block
        # Two blocks show no period: read so only where the sum's two parts interleave (chunks read
        # as chunks) and the steps add two products or more on average.
        if others == 1 and (not 2 <= m <= b // 2 or all(_run(c) for c in node)):
            continue
        added = rights[s - 1::-1]  # in the order added
        steps = [_sum_text(r, lo + b) for r in added[:m]]
        if (all(not isinstance(r, list) for r in added[:m])
                or sorted(leaves(chain[s])) != list(range(lo, lo + b))
                or (sorted(k for r in added[:m] for k in leaves(r))
                    != list(range(lo + b, lo + 2 * b)))):
            continue
        if all(_sum_text(added[t * m + i], lo + (t + 1) * b) == steps[i]
               for t in range(1, others) for i in range(m)):
            first = describe(chain[s], depth + 1)
            said = [_step(r, w, lo + b, depth) for w, r in zip(steps, added)]
            each = "the second" if others == 1 else f"each of the {others} others"
            return (f"{others + 1} blocks of {b}: the first {_bracket(first)}, then {each} "
                    f"added to the running sum in {m} step{'s' * (m != 1)} "
                    "(offsets in the block): " + ", ".join(said),
                    others + 1)
    return None


def _run(node) -> bool:
    """Whether a subtree adds a run of neighbouring products."""
    held = leaves(node) if isinstance(node, list) else [node]
    return max(held) - min(held) == len(held) - 1


def _sum_text(node, base: int) -> str:
    """A sum of products in words, each product its index less ``base``: "(0+2)+(1+3)", a fused
    add "0+1+2" (iterative: a step may be deep)."""
    out, stack = [], [(node, True)]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.append(x)
            continue
        x, top = x
        if isinstance(x, list):
            stack.append("" if top else ")")
            for i, c in enumerate(reversed(x)):
                stack.append((c, False))
                if i < len(x) - 1:
                    stack.append("+")
            stack.append("" if top else "(")
        else:
            out.append(str(x - base))
    return "".join(out)


def _step(node, text: str, base: int, depth: int) -> str:
    """A step of _blocks in words: its sum ``text`` ("(0+2)+(1+3)") where it adds at most 4
    products or no run of neighbours, else its offsets in the block and its reading ("0..15
    [pairwise]")."""
    held = sorted(leaves(node))
    if len(held) <= 4 or held[-1] - held[0] != len(held) - 1:
        return text
    return f"{held[0] - base}..{held[-1] - base} [{describe(node, depth + 1)}]"


def _index_order(seen: list[int]) -> str:
    """" (out of index order)" where a sequential or pairwise reading meets the products
    (``seen``, in the order added) out of index order."""
    return "" if seen == sorted(seen) else " (out of index order)"


def _short_last(parts: list) -> bool:
    """Whether the parts are chunks (runs of neighbouring products), two or more of one size and
    a last one (the highest products) shorter, of two products or more: a blocked loop over K no
    multiple of its block. A last product alone reads as a remainder ("then 1 more product")."""
    held = sorted(sorted(leaves(p)) for p in parts)
    full, last = len(held[0]), len(held[-1])
    return (len(held) > 2 and 2 <= last < full and all(len(h) == full for h in held[:-1])
            and all(h[-1] - h[0] == len(h) - 1 for h in held))


def _parts(parts: list, how: str, depth: int, into: str = "") -> str:
    sizes = [len(leaves(p)) for p in parts]
    held = sorted(sorted(leaves(p)) for p in parts)
    same = len(set(sizes)) == 1
    lanes = _lanes(parts)
    short = not same and not lanes and _short_last(parts)  # "3 chunks of 32 and 1 of 4"
    # chunks: runs of neighbouring products; parts that interleave otherwise are only parts
    word = ("lanes" if lanes else "chunks" if all(h[-1] - h[0] == len(h) - 1 for h in held)
            else "parts")
    then = f"{word} then {how}" if lanes else f"{word} {how}"
    ordered = sorted(parts, key=lambda p: min(leaves(p)))  # in index order
    inner = None
    if depth > 3:
        inner = "..."
    elif same or lanes or short or len(parts) <= 3:
        words = [describe(p, depth + 1) for p in ordered]
        if same:  # one reading for all, where each part has it
            inner = words[0] if len(set(words)) == 1 else None
        elif lanes:  # lanes of two sizes: their common reading, where they share one
            inner = _merge([w for p, w in zip(ordered, words) if isinstance(p, list)])
            if (inner is None and not into
                    and (found := _last_into_lanes(ordered, words, depth)) is not None):
                return f"{len(parts)} lanes × {found}; {then}"
        elif short:
            inner = _common(words, ordered[-1], depth)
        elif (inner := _merge(words)) is not None:
            # a few parts read alike: their sizes in index order
            listed = [str(len(leaves(p))) for p in ordered]
            return (f"{len(parts)} {word} of {', '.join(listed[:-1])} and {listed[-1]}; "
                    f"each: {inner}; {then}")
    if inner is None and len(parts) <= 3:
        # a few parts that read otherwise: each one's size and reading, in index order,
        # bracketed (a reading holds ';'): "2 chunks of 32 [...] and 4 [pairwise]; chunks added"
        each = [f"{len(leaves(p))} [{w}]" for p, w in zip(ordered, words)]
        return f"{len(parts)} {word} of {', '.join(each[:-1])} and {each[-1]}{into}; {then}"
    inner = inner or "varied"  # many parts that read otherwise
    size = f"{sizes[0]}" if same else f"{min(sizes)}..{max(sizes)}"
    if lanes:
        return f"{len(parts)} lanes × {size} {_bracket(inner)}{into}; {then}"
    if short:
        return (f"{len(parts) - 1} chunks of {len(held[0])} and 1 of {len(held[-1])}; "
                f"each: {inner}; {then}")
    return f"{len(parts)} {word} of {size}; each: {inner}; {then}"


def _last_into_lanes(ordered: list, words: list[str], depth: int) -> str | None:
    """Lanes of two sizes (``ordered`` in index order, ``words`` their readings at depth + 1) that
    read alike but for the first r lanes' last product, added to each of them on top (a remainder
    of K spread over the lanes after the lanes' loop): "4 pairwise (out of index order), then 1
    more product into each of lanes 0..4"; None for any other."""
    most = max(len(leaves(p)) for p in ordered)
    # the first r lanes: _lanes holds them by stride
    r = sum(len(leaves(p)) == most for p in ordered)
    rest = []
    for p in ordered[:r]:
        last = max(leaves(p))
        if not (isinstance(p, list) and len(p) == 2 and last in p):
            return None
        rest.append(p[0] if p[1] == last else p[1])
    inner = _merge([describe(x, depth + 1) for x in rest] + words[r:])
    if inner is None:
        return None
    lanes = "lane 0" if r == 1 else f"each of lanes 0..{r - 1}"
    return f"{most - 1} {_bracket(inner)}, then 1 more product into {lanes}"


def _bracket(words: str) -> str:
    """A reading set inside another, bracketed where it has parts of its own (';' or ':'), so
    that "8 lanes × 125 [2 parts of 62; ...]; lanes then pairwise" does not run on into the
    outer one."""
    return f"[{words}]" if ";" in words or ":" in words else words


_NUMBERS = re.compile(r"([0-9]+)(?:\.\.([0-9]+))?")


def _common(words: list[str], last, depth: int) -> str | None:
    """The common reading of chunks and a short last one (``words``: each one's at depth + 1,
    the last one's last), their sizes merged: "sequential", or "2 lanes × 2..16 sequential; ..."
    for lanes of 16 and of 2; None where they read otherwise. The short last chunk ``last`` may
    be read at another of its readings (the finest of 4 products may be "pairwise", where the
    others are lanes) to agree with the others."""
    if (common := _merge(words[:-1])) is None:
        return None
    tried = words[-1:]
    if isinstance(last, list) and len(last) == 2:
        tried += [_words(ps, how, depth + 1) for ps, how in _options(last)]
    return next((m for w in tried if (m := _merge([common, w])) is not None), None)


def _merge(words: list[str]) -> str | None:
    """The words where they are one text but for their numbers, each number the range of theirs
    ("2..16" from "2" and "16"); None where the texts differ."""
    split = [_NUMBERS.split(w) for w in words]  # text, number, range end or None, text, ...
    if not split or any(len(x) != len(split[0]) or x[::3] != split[0][::3] for x in split):
        return None
    out = list(split[0])
    for i in range(1, len(out), 3):
        low = min(int(x[i]) for x in split)
        high = max(int(x[i + 1] or x[i]) for x in split)
        out[i], out[i + 1] = (str(low), None) if low == high else (f"{low}..{high}", None)
    return "".join(x for x in out if x is not None)
