"""The search that scan and the map share: alignment classes, the checked search, and what
they find (the pattern, each class's regions and boundaries).

A point is a plain dict with at least ``kernel_id`` and, where drift is compared,
``max_ulp`` and ``frac_differ``. Two points belong to the same region when their kernel-ids
are equal and their drift is zero on both or non-zero on both (where nothing is compared, the
kernel-id alone).

Sizes are split into alignment classes by the largest power of two dividing them (odd,
2 mod 4, 4 mod 8, 8 mod 16, 16 mod 32, 0 mod 32), and each of those by the size modulo a
period that a dense prefix of the range shows (kernels block by 6, 12, 14, 24 or 28 as well
as by powers of two; period 1 where none shows). Within each class the search samples a
coarse grid, then bisects every interval whose ends differ down to adjacent members of the
class, so every boundary is exact within its class. What it inferred is then checked: sizes
not measured, drawn at random from a fixed seed, are measured and compared with the state
their class gives them; where one differs, that stretch is measured densely (and where the
last round of checks still finds one, every size left is). The search is deterministic given
the points, so a search resumes by replaying it over the points already recorded. Pure: no
torch, no files.
"""

from __future__ import annotations

import bisect
import math
import random


class RangeError(ValueError):
    """A range of sizes that is no ``LO:HI`` of at least two sizes from 1 up."""


def parse_range(text: str, what: str = "a scan") -> tuple[int, int]:
    """``LO:HI`` -> (lo, hi), both included; RangeError (one line) for anything else.
    ``what`` ("a scan", "a map") is what needs two sizes."""
    parts = text.split(":")
    if len(parts) != 2:
        raise RangeError(f"expected LO:HI (two integers, both included), got {text!r}")
    try:
        lo, hi = (int(p.strip()) for p in parts)
    except ValueError:
        raise RangeError(f"expected two integers LO:HI, got {text!r}") from None
    if lo < 1:
        raise RangeError(f"sizes start at 1, got {text!r}")
    if hi < lo:
        raise RangeError(f"{lo}:{hi} is reversed; write {hi}:{lo}")
    if hi == lo:
        raise RangeError(f"{lo}:{hi} holds one size, {lo} (both ends are included): "
                         f"{what} needs at least two")
    return lo, hi


def region_key(point: dict) -> tuple:
    """What must match for two points to share a region: kernel-id and whether drift is zero.
    Drift is any entry that differs: max_ulp leaves out entries non-finite on either side
    (65504 against inf), frac_differ counts them, as explain and the fix finder do."""
    ulp = point.get("max_ulp")
    return point["kernel_id"], None if ulp is None else bool(ulp or point.get("frac_differ"))


def search(lo: int, hi: int, step: int, evaluate,
           known: dict[int, dict] | None = None) -> dict[int, dict]:
    """Evaluate the coarse grid, then bisect every interval whose ends differ in region_key.

    ``evaluate(size) -> point`` is called once per size not already in ``known``; the
    result maps every evaluated size to its point. Intervals are bisected down to
    adjacent integers, so every change between evaluated neighbours is an exact boundary.
    """
    points = dict(known or {})

    def at(size: int) -> dict:
        if size not in points:
            points[size] = evaluate(size)
        return points[size]

    sizes = list(range(lo, hi, step)) + [hi]
    for size in sizes:
        at(size)
    todo = [(a, b) for a, b in zip(sizes, sizes[1:])
            if region_key(points[a]) != region_key(points[b])]
    todo.reverse()  # low sizes first
    while todo:
        a, b = todo.pop()
        if b - a <= 1:
            continue
        mid = (a + b) // 2
        at(mid)
        halves = [(x, y) for x, y in ((a, mid), (mid, b))
                  if region_key(points[x]) != region_key(points[y])]
        todo.extend(reversed(halves))
    return points


# --- alignment classes -------------------------------------------------------------------
# Libraries pick kernels by alignment (fp16 tensor-core paths want multiples of 8; MKL's
# small-m paths differ with m mod 4), so a route can depend on a size modulo a power of two
# and never hold over a contiguous range. The search therefore runs once per class of sizes,
# by the largest power of two dividing the size (up to 2^CLASS_TOP): odd, 2 mod 4, 4 mod 8,
# 8 mod 16, 16 mod 32 and 0 mod 32; with a period p > 1, each of those is split by the size
# modulo p, and class c is power class c // p with residue c % p. Each class is an arithmetic
# progression, searched and bisected on its own, so each boundary is exact within its class.

CLASS_TOP = 5
CLASS_INTERVALS = 20  # coarse grid intervals per class when no --step is given


def size_class(size: int, period: int = 1) -> int:
    """The class of ``size``: its power class (0 for odd sizes, c for sizes ≡ 2^c mod 2^(c+1),
    CLASS_TOP for multiples of 2^CLASS_TOP) times ``period``, plus the size modulo ``period``."""
    return min((size & -size).bit_length() - 1, CLASS_TOP) * period + size % period


def class_count(period: int = 1) -> int:
    """How many classes there are with ``period`` (some hold no size: odd sizes ≡ 2 mod 4)."""
    return (CLASS_TOP + 1) * period


def class_label(c: int, period: int = 1) -> str:
    """'odd', '≡ 2 mod 4', ..., '≡ 0 mod 32'; with a period, ', ≡ r mod p' after it."""
    base = c // period
    words = ("odd" if base == 0 else f"≡ 0 mod {2 ** CLASS_TOP}" if base == CLASS_TOP
             else f"≡ {2 ** base} mod {2 ** (base + 1)}")
    return words if period == 1 else f"{words}, ≡ {c % period} mod {period}"


def class_members(lo: int, hi: int, c: int, period: int = 1) -> range:
    """The sizes of class ``c`` in lo..hi (both included), ascending (empty where none)."""
    base = c // period
    spacing = 2 ** (base + 1) if base < CLASS_TOP else 2 ** CLASS_TOP
    offset = 2 ** base if base < CLASS_TOP else 0
    step = math.lcm(spacing, period)
    first = next((s for s in range(lo, lo + step)
                  if s % spacing == offset and s % period == c % period),
                 hi + 1)
    return range(first, hi + 1, step)


def classes_in(lo: int, hi: int, period: int = 1) -> list[int]:
    """The classes that hold a size of lo..hi, in order."""
    return [c for c in range(class_count(period)) if class_members(lo, hi, c, period)]


def class_search(lo: int, hi: int, evaluate, known: dict[int, dict] | None = None,
                 step: int | None = None, intervals: int = CLASS_INTERVALS,
                 period: int = 1) -> dict[int, dict]:
    """``search`` once per alignment class. Within a class the coarse grid takes every
    ``step // spacing``-th member (``step`` in sizes; 1 is a dense sweep), or by default cuts
    the class into ``intervals`` pieces; differing neighbours are bisected down to adjacent
    members. ``evaluate(size)`` is called once per size not already in ``known``."""
    points = dict(known or {})

    def at(size: int) -> dict:
        if size not in points:
            points[size] = evaluate(size)
        return points[size]

    for c in classes_in(lo, hi, period):
        members = class_members(lo, hi, c, period)
        search(0, len(members) - 1, _index_step(members, step, intervals),
               lambda i, members=members: at(members[i]))  # `at` caches by size
    return points


def _index_step(members: range, step: int | None, intervals: int) -> int:
    """Members of a class from one grid point to the next (1: every member is evaluated)."""
    return (max(1, step // members.step) if step
            else max(1, math.ceil((len(members) - 1) / intervals)))


def grid_gap(lo: int, hi: int, step: int | None, intervals: int = CLASS_INTERVALS,
             period: int = 1) -> int:
    """The widest distance between neighbouring grid points of a class that skips members,
    in sizes; 0 when every size is evaluated (a dense sweep). Kernels or drift that change
    and change back over a run of sizes narrower than this can lie between two grid points
    and go unseen in that class (but for the spot checks)."""
    classes = [class_members(lo, hi, c, period) for c in classes_in(lo, hi, period)]
    widest = [(min(_index_step(m, step, intervals), len(m) - 1), m.step)  # in members
              for m in classes]
    return max([i * spacing for i, spacing in widest if i > 1], default=0)


def state_at(points: dict[int, dict], size: int, by_class: dict[int, list[int]] | None = None,
             period: int = 1) -> tuple:
    """The region_key the search implies at ``size``: that of its class's evaluated neighbours
    (after class_search, neighbours that differ are adjacent members, so they agree here)."""
    by_class = by_class or _by_class(points, period)
    sizes = by_class[size_class(size, period)]
    i = bisect.bisect_left(sizes, size)
    return region_key(points[sizes[min(i, len(sizes) - 1)]])


def states(points: dict[int, dict], lo: int, hi: int, period: int = 1) -> dict[int, tuple]:
    """state_at every size of lo..hi, by size."""
    by_class = _by_class(points, period)
    return {s: state_at(points, s, by_class, period) for s in range(lo, hi + 1)}


def _by_class(points: dict[int, dict], period: int = 1) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {c: [] for c in range(class_count(period))}
    for s in sorted(points):
        out[size_class(s, period)].append(s)
    return out


def _class_set(classes: set[int], absent: set[int] = frozenset(), period: int = 1) -> str:
    """Words for a set of classes: 'multiples of 4', 'sizes not divisible by 8', or a list.
    Classes with no size in the segment (``absent``) may be counted in or out."""
    for c in range(1, CLASS_TOP + 1) if period == 1 else ():
        for target, words in ((set(range(c, CLASS_TOP + 1)), f"multiples of {2 ** c}"),
                              (set(range(c)), f"sizes not divisible by {2 ** c}")):
            if classes <= target <= classes | absent:
                return words
    return "; ".join(class_label(c, period) for c in sorted(classes))


def pattern(points: dict[int, dict], lo: int, hi: int, period: int = 1) -> list[dict]:
    """The range as segments in which each class keeps one state; a segment whose classes
    differ is periodic and says so: ``lo``, ``hi``, ``states`` ([{classes, kernel_id, drift}],
    the most common first) and ``text`` ('1..11: drift, except multiples of 4: no drift')."""
    by_class = _by_class(points, period)
    segments: list[dict] = []
    for size in range(lo, hi + 1):
        c, key = size_class(size, period), state_at(points, size, by_class, period)
        seg = segments[-1] if segments else None
        if seg is None or seg["by_class"].get(c, key) != key:
            seg = {"lo": size, "hi": size, "by_class": {}, "count": {}}
            segments.append(seg)
        seg["by_class"][c] = key
        seg["hi"] = size
        seg["count"][key] = seg["count"].get(key, 0) + 1
    several = len({k[0] for k in (region_key(p) for p in points.values())}) > 1
    out = []
    for seg in segments:
        groups: dict[tuple, set[int]] = {}
        for c, key in seg["by_class"].items():
            groups.setdefault(key, set()).add(c)
        order = sorted(groups, key=lambda k: -seg["count"][k])
        states = [{"classes": [class_label(c, period) for c in sorted(groups[k])],
                   "kernel_id": k[0],
                   "drift": None if k[1] is None else ("non-zero" if k[1] else "zero")}
                  for k in order]
        text = f"{seg['lo']}..{seg['hi']}: {_state_words(order[0], several)}"
        if len(order) > 1:
            absent = set(range(class_count(period))) - set(seg["by_class"])
            text += ", except " + "; ".join(f"{_class_set(groups[k], absent, period)}: "
                                            f"{_state_words(k, several)}"
                                            for k in order[1:])
        out.append({"lo": seg["lo"], "hi": seg["hi"], "periodic": len(order) > 1,
                    "states": states, "text": text})
    return out


def _state_words(key: tuple, several_kernels: bool) -> str:
    kernel, drift = key
    words = [] if drift is None else ["drift" if drift else "no drift"]
    if several_kernels or drift is None:
        words.append(f"kernels {kernel}")
    return " with ".join(words) if len(words) == 2 else words[0]


def grid_count(lo: int, hi: int, step: int | None, intervals: int = CLASS_INTERVALS) -> int:
    """How many sizes the coarse grids of class_search hold with period 1 (bisection, the
    prefix, other periods and spot checks come on top): what a progress bar starts from."""
    total = 0
    for c in classes_in(lo, hi):
        last = len(class_members(lo, hi, c)) - 1
        total += (len(range(0, last, _index_step(class_members(lo, hi, c), step, intervals))) + 1
                  if last else 1)
    return total


def class_boundaries(points: dict[int, dict], period: int = 1) -> list[dict]:
    """``boundaries`` within each class: neighbouring evaluated members that differ, with
    ``class`` (its label); ``exact`` when they are adjacent members of the class."""
    out = []
    for c, sizes in _by_class(points, period).items():
        spacing = class_members(1, 1, c, period).step
        for b in boundaries({s: points[s] for s in sizes}):
            out.append({"class": class_label(c, period), **b,
                        "exact": b["hi"] - b["lo"] == spacing})
    return sorted(out, key=lambda b: (b["hi"], b["lo"]))


def class_regions(points: dict[int, dict], period: int = 1) -> list[dict]:
    """``regions`` within each class, with ``class``; ``lo``..``hi`` are members of the class."""
    out = []
    for c, sizes in _by_class(points, period).items():
        spacing = class_members(1, 1, c, period).step
        regs = regions({s: points[s] for s in sizes})
        for r, nxt in zip(regs, regs[1:]):
            r["hi"] = nxt["lo"] - spacing
        out += [{"class": class_label(c, period), **r} for r in regs]
    return out


# --- the checked search ------------------------------------------------------------------
# Kernels block rows by 6, 12, 14, 24 or 28 as well as by powers of two, and such a route
# is no pattern of the power classes. So the search measures a dense prefix of the range and
# takes the period (of PERIODS) whose classes change least along it; searches the classes of
# that period; and checks what it inferred with spot checks: in each round one size not
# measured of every state inferred in every class, and more up to SPOT_CHECKS, drawn at random
# (CHECK_SEED), are measured and compared with the state their class gives them. Where one
# differs, the stretch between its class's measured neighbours is measured densely, every
# class bisected again, and another round drawn; where the last round still finds one, every
# size left is measured. Every choice rests only on the sizes the search asked for, in order,
# so it replays over a record's points to resume.

PREFIX = 56  # sizes measured densely at the range's start: each period of PERIODS shows twice
PERIODS = (1, 2, 4, 6, 8, 12, 14, 16, 24, 28)  # in sizes: powers of two and the blocks kernels use
SPOT_CHECKS = 12  # sizes not measured that one round of checks measures at least
CHECK_ROUNDS = 3  # rounds of checks; a failure in the last measures every size left
CHECK_SEED = 68  # the seed of the spot checks' draw


def find_period(states: dict[int, tuple], lo: int, hi: int) -> int:
    """The period (sizes, of PERIODS, at most half of lo..hi) whose classes change state least
    often along ``states`` (every size of lo..hi: its region_key), per pair of neighbours in a
    class (a long period has fewer pairs in the prefix); the shorter on a tie."""
    best = (math.inf, 1)
    for p in (p for p in PERIODS if 2 * p <= hi - lo + 1):
        last: dict[int, tuple] = {}
        changes = pairs = 0
        for s in range(lo, hi + 1):
            c = size_class(s, p)
            if c in last:
                pairs += 1
                changes += last[c] != states[s]
            last[c] = states[s]
        best = min(best, (changes / max(pairs, 1), p))
    return best[1]


def checked_search(lo: int, hi: int, evaluate, known: dict[int, dict] | None = None,
                   step: int | None = None, seed: int = CHECK_SEED) -> tuple[dict[int, dict], dict]:
    """The dense prefix, the period, class_search in that period's classes, and the spot
    checks. ``evaluate(size) -> point`` is called once per size the search asks for that is
    not in ``known``. Returns the points asked for by size, and the search's report:
    ``period`` (sizes), ``prefix`` ([lo, hi] measured densely), ``seed``, ``checked`` (the
    spot checks, sizes), ``failed`` (those whose state was not the inferred one), ``dense``
    ([lo, hi] stretches measured densely after a failure) and ``rest`` (whether every size
    left was measured after the last round failed)."""
    cache = dict(known or {})
    points: dict[int, dict] = {}

    def at(size: int) -> dict:
        if size not in points:
            points[size] = cache[size] if size in cache else evaluate(size)
        return points[size]

    top = min(hi, lo + PREFIX - 1)
    for s in range(lo, top + 1):
        at(s)
    period = find_period({s: region_key(points[s]) for s in range(lo, top + 1)}, lo, top)
    class_search(lo, hi, at, step=step, period=period)
    _settle(lo, hi, period, points, at)
    rng = random.Random(seed)
    report = {"period": period, "prefix": [lo, top], "seed": seed, "checked": [], "failed": [],
              "dense": [], "rest": False}
    for round_ in range(CHECK_ROUNDS):
        unmeasured = [s for s in range(lo, hi + 1) if s not in points]
        if not unmeasured:
            break
        by_class = _by_class(points, period)
        stated = {s: state_at(points, s, by_class, period) for s in unmeasured}
        inferred: dict[tuple, list[int]] = {}  # each class's states as inferred, with their sizes
        for s in unmeasured:
            inferred.setdefault((size_class(s, period), stated[s]), []).append(s)
        picks = {rng.choice(sizes) for sizes in inferred.values()}
        rest = [s for s in unmeasured if s not in picks]
        picks = sorted(picks | set(rng.sample(rest, max(0, min(SPOT_CHECKS - len(picks),
                                                               len(rest))))))
        wrong = [s for s in picks if region_key(at(s)) != stated[s]]
        report["checked"] += picks
        report["failed"] += wrong
        if not wrong:
            break
        if round_ == CHECK_ROUNDS - 1:
            report["rest"] = True
            for s in range(lo, hi + 1):
                at(s)
            break
        for s in wrong:
            sizes = by_class[size_class(s, period)]
            i = bisect.bisect_left(sizes, s)
            a, b = sizes[i - 1] if i else lo, sizes[i] if i < len(sizes) else hi
            report["dense"].append([a, b])
            for x in range(a, b + 1):
                at(x)
        _settle(lo, hi, period, points, at)
    report["dense"] = [list(s) for s in _merged(report["dense"])]
    return points, report


def _settle(lo: int, hi: int, period: int, points: dict[int, dict], at) -> None:
    """Within every class, bisect each pair of measured neighbours whose states differ down to
    adjacent members, so that every size not measured lies between two that agree."""
    for c, sizes in _by_class({s: p for s, p in points.items() if lo <= s <= hi}, period).items():
        members = class_members(lo, hi, c, period)
        idx = [members.index(s) for s in sizes]
        todo = [(a, b) for a, b in zip(idx, idx[1:]) if b - a > 1
                and region_key(points[members[a]]) != region_key(points[members[b]])]
        while todo:
            a, b = todo.pop()
            mid = (a + b) // 2
            at(members[mid])
            todo += [(x, y) for x, y in ((a, mid), (mid, b)) if y - x > 1
                     and region_key(points[members[x]]) != region_key(points[members[y]])]


def _merged(stretches: list[list[int]]) -> list[tuple[int, int]]:
    """Stretches (lo, hi) merged where they overlap or touch, in order."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(map(tuple, stretches)):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def search_words(report: dict, measured: int, size: int, unit: str) -> str:
    """How the search found the states, in words: the period, the M or sizes measured, the
    spot checks and where it fell back to dense."""
    prefix = f"a dense prefix {report['prefix'][0]}..{report['prefix'][1]}"
    period = (f"classes by powers of two and by the {unit} modulo {report['period']} ({prefix} "
              "showed that period)" if report["period"] > 1
              else f"classes by powers of two ({prefix} showed no other period)")
    checked, failed = report["checked"], report["failed"]
    words = f"measured {measured} of {size} {unit}s; {period}; "
    if not checked:
        return words + "no spot check: nothing was left to infer"
    words += (f"{len(checked)} {unit}s not measured were spot-checked (seed {report['seed']}: "
              f"{_listed(checked)})")
    if not failed:
        return words + ", and each held its inferred state"
    words += f"; {len(failed)} did not ({_listed(failed)})"
    if report["dense"]:
        words += f", so {', '.join(f'{a}..{b}' for a, b in report['dense'])} were measured densely"
    if report["rest"]:
        words += "; the last round still failed, so every size left was measured (a dense sweep)"
    return words


def _listed(sizes: list[int], most: int = 12) -> str:
    shown = ", ".join(map(str, sizes[:most]))
    return shown + (f", ... ({len(sizes)} in all)" if len(sizes) > most else "")


def _side(point: dict) -> dict:
    keep = ("size", "kernel_id", "kernels", "max_ulp", "frac_differ", "max_u", "error_u")
    return {key: point.get(key) for key in keep}


def boundaries(points: dict[int, dict]) -> list[dict]:
    """Every pair of evaluated neighbours that differ: ``lo``, ``hi`` and the point on each side.

    After ``search`` these neighbours are adjacent integers; ``exact`` says so.
    """
    sizes = sorted(points)
    out = []
    for a, b in zip(sizes, sizes[1:]):
        pa, pb = points[a], points[b]
        if region_key(pa) != region_key(pb):
            out.append({
                "lo": a, "hi": b, "exact": b - a == 1,
                "kernel_changed": pa["kernel_id"] != pb["kernel_id"],
                "drift_changed": region_key(pa)[1] != region_key(pb)[1],
                "before": _side(pa), "after": _side(pb),
            })
    return out


def regions(points: dict[int, dict]) -> list[dict]:
    """Runs of evaluated neighbours with one region_key, as ``lo..hi`` (sizes, both included).

    A region ends where the next begins minus one. ``max_ulp``, ``max_u`` and
    ``max_error_u`` are maxima over the region's evaluated points (None where not measured).
    """
    sizes = sorted(points)
    out: list[dict] = []
    for size in sizes:
        p = points[size]
        if out and region_key(points[out[-1]["lo"]]) == region_key(p):
            r = out[-1]
        else:
            drift = region_key(p)[1]
            r = {"lo": size, "hi": size, "kernel_id": p["kernel_id"], "kernels": p["kernels"],
                 "drift": None if drift is None else ("non-zero" if drift else "zero"),
                 "max_ulp": None, "max_u": None, "max_error_u": None, "points": 0}
            out.append(r)
        r["hi"] = size
        r["points"] += 1
        for key, value in (("max_ulp", p.get("max_ulp")), ("max_u", p.get("max_u")),
                           ("max_error_u", p["error_u"])):
            if value is not None:
                r[key] = value if r[key] is None else max(r[key], value)
    for r, nxt in zip(out, out[1:]):
        r["hi"] = nxt["lo"] - 1  # after search the neighbours are adjacent: this is a no-op then
    return out
