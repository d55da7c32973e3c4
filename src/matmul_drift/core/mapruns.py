"""A batch-invariance map's verdicts as plain data: runs of M with one state, each M's state,
runs of M in words, and what changed between two maps. No torch, no files.

A run is a dict ``lo``, ``hi`` (M, both included), ``kernel_id`` (12 hex digits), ``row0``
(row 0 of ``A[:M] @ B`` is the bits of ``A[:1] @ B``) and ``rows`` (its rows are the bits of the
full product's), as probes/batchmap.py's ``verdicts`` and a catalog "maps" entry hold them.
The search and the words of one map are batchmap's; the summary (read/) judges two maps here.
"""

from __future__ import annotations

State = tuple[str, bool, bool]  # (kernel-id, row 0 invariant?, rows invariant?)
PROPERTY_WORDS = {"row0": "row 0 as at M = 1", "rows": "rows as in the full product"}
MAX_LISTED = 8  # spans of M listed in a change's words; beyond them, a count
MAX_M = 1 << 16  # M a map's runs may cover in all: a results tree may hold anything


def misfit(runs) -> str | None:
    """Why ``runs`` (read from a catalog entry, which a results tree may hold in any shape) are
    not a map's runs, in words; None where they are: a list of runs, each with whole ``lo`` <=
    ``hi`` from 1, a ``kernel_id`` string, booleans ``row0`` and ``rows``, none overlapping, at
    most MAX_M M in all."""
    if not isinstance(runs, list):
        return "no runs of M"
    seen = 0
    for r in runs:
        ok = isinstance(r, dict) and all(isinstance(r.get(k), int)
                                         and not isinstance(r.get(k), bool)
                                         for k in ("lo", "hi"))
        if not (ok and 1 <= r["lo"] <= r["hi"] and isinstance(r.get("kernel_id"), str)
                and isinstance(r.get("row0"), bool) and isinstance(r.get("rows"), bool)):
            return f"a malformed run: {str(r)[:60]}"
        seen += r["hi"] - r["lo"] + 1
        if seen > MAX_M:
            return f"more than {MAX_M} M"
    if len(per_m(runs)) != seen:
        return "runs that overlap"
    return None


def per_m(runs: list[dict]) -> dict[int, State]:
    """{M: (kernel-id, row 0 invariant?, rows invariant?)} from a map's runs."""
    return {m: (r["kernel_id"], r["row0"], r["rows"])
            for r in runs for m in range(r["lo"], r["hi"] + 1)}


def spans(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Runs of M (lo, hi) merged where one ends just before the next begins."""
    out: list[tuple[int, int]] = []
    for a, b in runs:
        if out and out[-1][1] + 1 == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def spans_text(found: list[tuple[int, int]], most: int | None = None) -> str:
    """'1..3, 8, 12..15'; with ``most``, at most that many spans, then how many M in all."""
    shown = found if most is None else found[:most]
    text = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in shown)
    if len(shown) < len(found):
        text += f", ... ({sum(b - a + 1 for a, b in found)} M in {len(found)} runs)"
    return text


def ends(runs: list[dict], most: int) -> list[int]:
    """Each run's first and last M, in order; where there are more than ``most`` (``most`` >= 2),
    ``most`` of them spread evenly from the first to the last (a periodic map has a run every
    few M: re-measuring all of them would cost more than the search did)."""
    found = sorted({m for r in runs for m in (r["lo"], r["hi"])})
    if len(found) <= most:
        return found
    return sorted({found[round(i * (len(found) - 1) / (most - 1))] for i in range(most)})


def _sizes_as_spans(sizes: list[int]) -> list[tuple[int, int]]:
    return spans([(m, m) for m in sorted(sizes)])


def _transition(old: State, new: State) -> str:
    """How one M's state changed, in words: 'became drifting (row 0 as at M = 1)', 'ran kernel
    bbb (was aaa)'; the parts joined by ' and '."""
    parts = []
    for went, word in ((True, "invariant"), (False, "drifting")):
        props = [PROPERTY_WORDS[p] for i, p in ((1, "row0"), (2, "rows"))
                 if old[i] != new[i] and new[i] is went]
        if props:
            parts.append(f"became {word} ({'; '.join(props)})")
    if old[0] != new[0]:
        parts.append(f"ran kernel-id {new[0]} (was {old[0]})")
    return " and ".join(parts)


def changes(before: list[dict], after: list[dict]) -> list[str]:
    """What changed from the map ``before`` to the map ``after`` (their runs), one line per kind
    of change, each naming its M: 'M = 8..15 became drifting (row 0 as at M = 1)'; the M one
    map states and the other does not: 'M = 129..256 mapped before only'. [] where every M has
    the same state in both."""
    sb, sa = per_m(before), per_m(after)
    by_change: dict[str, list[int]] = {}
    for m in sorted(sb.keys() & sa.keys()):
        if sb[m] != sa[m]:
            by_change.setdefault(_transition(sb[m], sa[m]), []).append(m)
    lines = [f"M = {spans_text(_sizes_as_spans(ms), MAX_LISTED)} {what}"
             for what, ms in sorted(by_change.items(), key=lambda x: x[1][0])]
    for only, side in ((sb.keys() - sa.keys(), "before"), (sa.keys() - sb.keys(), "now")):
        if only:
            lines.append(f"M = {spans_text(_sizes_as_spans(list(only)), MAX_LISTED)} "
                         f"mapped {side} only")
    return lines
