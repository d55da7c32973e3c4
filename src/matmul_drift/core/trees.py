"""The summation-order tree format: parse, canonical JSON and the order-id.

A leaf is the index k (0-based) of one of the K products; an inner node is a list of two or
more children, ordered by their smallest leaf; two children are one rounded addition, three
or more one fused add (rounded once); a sequential loop is a left-deep chain. ``null`` stands
for an order not revealed. Trees can be K deep, so nothing here recurses: json.loads and
json.dumps would stop at about 1000 levels.
"""

from __future__ import annotations

import json
import re

from matmul_drift.core import ids


def inner_nodes(tree) -> list[list]:
    """The inner nodes of a tree, each before its children (iterative: trees can be thousands
    deep); [] for a single product or None."""
    order, stack = [], [tree] if isinstance(tree, list) else []
    while stack:
        x = stack.pop()
        order.append(x)
        stack.extend(c for c in x if isinstance(c, list))
    return order


def fold(tree, leaf, combine):
    """A value of every subtree of ``tree``, as a function of the subtree: ``leaf(product)`` for
    a product, ``combine([its children's values])`` for an inner node. Computed once, children
    first, without recursion (trees can be thousands deep); the subtrees must stay as they are."""
    value: dict[int, object] = {}
    for x in reversed(inner_nodes(tree)):
        value[id(x)] = combine([value[id(c)] if isinstance(c, list) else leaf(c) for c in x])
    return lambda x: value[id(x)] if isinstance(x, list) else leaf(x)


def canonical(node):
    """Children ordered by their smallest leaf (iterative: trees can be thousands deep)."""
    if not isinstance(node, list):
        return node
    least = fold(node, int, min)  # sorting keeps each subtree's products
    for x in inner_nodes(node):
        x.sort(key=least)
    return node


def to_json(tree) -> str:
    """The compact JSON text of a tree, written without recursion (json.dumps recurses, and a
    sequential loop of K products is K deep); ``null`` for an order not revealed."""
    if tree is None:
        return "null"
    out, stack = [], [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list):
            stack.append("]")
            for i, c in enumerate(reversed(x)):
                stack.append(c)
                if i < len(x) - 1:
                    stack.append(",")
            stack.append("[")
        else:
            out.append(str(int(x)))
    return "".join(out)


def entry_text(tree, k: int) -> str:
    """The catalog text behind an order-id: canonical JSON of {"k": K, "tree": canonical(tree)},
    so that one tree written two ways has one id (the tree given is left as it is); the tree
    None (``null``) stands for "not revealed", so that a kernel whose order stops being a tree
    changes the id the suite tracks."""
    return f'{{"k":{k},"tree":{to_json(canonical(from_json(to_json(tree))))}}}'


def from_json(text: str):
    """A tree from its JSON text (``to_json``'s inverse), read without recursion: json.loads
    stops at about 1000 levels. ValueError for anything else."""
    text = text.strip()
    if text == "null":
        return None
    if _NUMBER.fullmatch(text):  # one product
        return int(text)
    stack: list[list] = []
    root, i, n = None, 0, len(text)
    expect_value = True
    while i < n:
        c = text[i]
        if c == "[" and expect_value:
            node: list = []
            if stack:
                stack[-1].append(node)
            else:
                root = node  # the first "[": the loop stops when it closes
            stack.append(node)
            i += 1
            continue
        if expect_value and stack and (m := _NUMBER.match(text, i)):
            stack[-1].append(int(m.group()))
            i, expect_value = m.end(), False
            continue
        if c == "," and not expect_value and stack:
            i, expect_value = i + 1, True
            continue
        if c == "]" and stack and not expect_value:
            stack.pop()
            i, expect_value = i + 1, False
            if not stack:
                break
            continue
        raise ValueError(f"not an order tree at character {i}: {text[i:i + 20]!r}")
    if stack or root is None or text[i:].strip():
        raise ValueError("not an order tree: unbalanced or trailing text")
    return root


# JSON's: ASCII digits, no leading zero (str.isdigit takes '٠')
_NUMBER = re.compile(r"0(?![0-9])|[1-9][0-9]*")


def check_tree(tree, k: int) -> None:
    """ValueError unless ``tree`` adds each of the K products once (leaves 0..K-1) and every
    inner node adds two or more: what a revealed tree is, and a file read back must be."""
    bad = (next((x for x in inner_nodes(tree) if len(x) < 2), None) if isinstance(tree, list)
           else None)
    if bad is not None:
        raise ValueError(f"not an order tree: a node adds {len(bad)} term{'s' * (len(bad) != 1)}")
    if tree is not None and sorted(leaves(tree)) != list(range(k)):
        raise ValueError(f"not an order tree over K = {k}: its leaves are not 0..{k - 1}, "
                         "each once")


def parse_entry(text: str) -> dict:
    """{"k": K, "tree": tree} from a catalog entry's text (entry_text's inverse)."""
    m = re.fullmatch(r'\{"k":(0|[1-9][0-9]*),"tree":(.*)\}', text.strip(), re.S)
    if m is None:
        raise ValueError("not an order entry: expected {\"k\":K,\"tree\":...}")
    k, tree = int(m.group(1)), from_json(m.group(2))
    check_tree(tree, k)
    return {"k": k, "tree": tree}


TREE_MEMBER = ',\n "tree": '  # `order --json` writes the tree last, after this


def report_text(meta: dict, tree) -> str:
    """The text of `order --json`: ``meta`` as indented RFC 8259 JSON, then the tree (to_json)."""
    text = json.dumps(meta, indent=1, allow_nan=False)
    return text[:-2] + TREE_MEMBER + to_json(tree) + "\n}\n"


def read_report(text: str) -> dict:
    """report_text's inverse, the tree read without recursion (json.loads stops at about 1000
    levels, and a sequential loop is K deep). ValueError for anything else, NaN and Infinity
    tokens too (report_text writes none)."""
    # a copy with CRLF too
    head, sep, tail = text.replace("\r\n", "\n").rstrip().rpartition(TREE_MEMBER)
    if not sep or not tail.endswith("}"):
        raise ValueError("not an order report: no tree at its end")
    obj = json.loads(head + "\n}", parse_constant=ids.no_constant)
    if not isinstance(obj, dict):
        raise ValueError("not an order report: not a JSON object")
    tree = from_json(tail[:-1])
    if tree is not None:
        if not isinstance(obj.get("k"), int) or isinstance(obj["k"], bool):
            raise ValueError("not an order report: no K for its tree")
        check_tree(tree, obj["k"])
    return {**obj, "tree": tree}


def order_id(tree, k: int) -> int:
    """The content id of a tree over K products (12 hex digits as an int), its children in any
    order."""
    return ids.text_id(entry_text(tree, k))


def iter_leaves(node):
    """The products under ``node`` in order, one at a time (a caller may stop early), without
    recursion (trees can be thousands deep)."""
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(reversed(x))
        else:
            yield x


def leaves(node) -> list[int]:
    return list(iter_leaves(node))


def arities(tree) -> list[int]:
    """The number of children of each inner node of the tree."""
    return [len(x) for x in inner_nodes(tree)]


def fused_nodes(tree) -> int:
    """How many nodes of the tree have three or more children."""
    return sum(n > 2 for n in arities(tree))
