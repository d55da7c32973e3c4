"""The search behind `matmul-drift scan`: where along one dimension do the kernels or the drift change?

A point is a plain dict (``measure.scan_point``): ``size``, ``kernel_id``, ``kernels``,
``error_u`` and, for n and m, ``max_ulp``, ``frac_differ`` and ``max_u``. Two points
belong to the same region when their kernel-ids are equal and their drift is zero on
both or non-zero on both (for k, where nothing is compared, the kernel-id alone).

Sizes are split into alignment classes by the largest power of two dividing them (odd,
2 mod 4, 4 mod 8, 8 mod 16, 16 mod 32, 0 mod 32). Within each class the search samples a
coarse grid, then bisects every grid interval whose ends differ down to adjacent members
of the class, so every boundary is exact within its class, and a route that depends on the
size modulo 2, 4, 8, 16 or 32 is seen as a pattern across classes. Its limit: kernels or
drift that change and change back between two grid points of a class (A → B → A, a run
narrower than ``grid_gap``: up to 607 sizes of 12,000 on the default grid) are not seen
there; a smaller ``step`` (1 is a dense sweep) tightens it.
The search is deterministic given the points, so a scan resumes by replaying it over the
points already recorded. No torch here: measuring is measure/measure.py's, drawing scan_plot's.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass

from matmul_drift.core import ids
from matmul_drift.store import atomic

SCHEMA = "matmul-drift-scan/2"  # /1: one grid over all sizes, before alignment classes
DIMS = ("m", "k", "n")


class ScanError(ValueError):
    """A scan that cannot start or continue as asked (bad range, mismatched record)."""


@dataclass(frozen=True)
class Params:
    """What a scan is: the varied dimension over ``lo..hi`` (both included, in elements),
    the fixed dimensions (``None`` for the varied one), dtype, device, the coarse grid
    spacing ``step`` (elements), the input seed, the environment's id (12 hex digits) and
    ``within``: the size (elements) of the varied dimension of the operand each point slices,
    None for ``hi`` (records from before it have none: they are resumed as they were)."""

    vary: str
    lo: int
    hi: int
    m: int | None
    k: int | None
    n: int | None
    dtype: str
    device: str
    step: int
    seed: int
    env_id: str
    within: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_range(text: str) -> tuple[int, int]:
    """``LO:HI`` -> (lo, hi), both included; ScanError (one line) for anything else."""
    parts = text.split(":")
    if len(parts) != 2:
        raise ScanError(f"expected LO:HI (two integers, both included), got {text!r}")
    try:
        lo, hi = (int(p.strip()) for p in parts)
    except ValueError:
        raise ScanError(f"expected two integers LO:HI, got {text!r}") from None
    if lo < 1:
        raise ScanError(f"sizes start at 1, got {text!r}")
    if hi < lo:
        raise ScanError(f"{lo}:{hi} is reversed; write {hi}:{lo}")
    if hi == lo:
        raise ScanError(f"{lo}:{hi} holds one size, {lo} (both ends are included): a scan needs at least two")
    return lo, hi


def region_key(point: dict) -> tuple:
    """What must match for two points to share a region: kernel-id and whether drift is zero.
    Drift is any entry that differs: max_ulp leaves out entries non-finite on either side
    (65504 against inf), frac_differ counts them, as explain and the fix finder do."""
    ulp = point.get("max_ulp")
    return point["kernel_id"], None if ulp is None else bool(ulp or point.get("frac_differ"))


def search(lo: int, hi: int, step: int, evaluate, known: dict[int, dict] | None = None) -> dict[int, dict]:
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
    todo = [(a, b) for a, b in zip(sizes, sizes[1:]) if region_key(points[a]) != region_key(points[b])]
    todo.reverse()  # low sizes first
    while todo:
        a, b = todo.pop()
        if b - a <= 1:
            continue
        mid = (a + b) // 2
        at(mid)
        halves = [(x, y) for x, y in ((a, mid), (mid, b)) if region_key(points[x]) != region_key(points[y])]
        todo.extend(reversed(halves))
    return points


# --- alignment classes -------------------------------------------------------------------
# Libraries pick kernels by alignment (fp16 tensor-core paths want multiples of 8; MKL's
# small-m paths differ with m mod 4), so a route can depend on a size modulo a power of two
# and never hold over a contiguous range. The search therefore runs once per class of sizes,
# by the largest power of two dividing the size (up to 2^CLASS_TOP): odd, 2 mod 4, 4 mod 8,
# 8 mod 16, 16 mod 32 and 0 mod 32. Each class is an arithmetic progression, searched and
# bisected on its own, so each boundary is exact within its class.

CLASS_TOP = 5
CLASS_INTERVALS = 20  # coarse grid intervals per class when no --step is given


def size_class(size: int) -> int:
    """0 for odd sizes, c for sizes ≡ 2^c mod 2^(c+1), CLASS_TOP for multiples of 2^CLASS_TOP."""
    return min((size & -size).bit_length() - 1, CLASS_TOP)


def class_label(c: int) -> str:
    """'odd', '≡ 2 mod 4', ..., '≡ 0 mod 32'."""
    if c == 0:
        return "odd"
    if c == CLASS_TOP:
        return f"≡ 0 mod {2 ** CLASS_TOP}"
    return f"≡ {2 ** c} mod {2 ** (c + 1)}"


def class_members(lo: int, hi: int, c: int) -> range:
    """The sizes of class ``c`` in lo..hi (both included), ascending."""
    spacing = 2 ** (c + 1) if c < CLASS_TOP else 2 ** CLASS_TOP
    offset = 2 ** c if c < CLASS_TOP else 0
    first = lo + (offset - lo) % spacing
    return range(first, hi + 1, spacing)


def class_search(lo: int, hi: int, evaluate, known: dict[int, dict] | None = None, step: int | None = None,
                 intervals: int = CLASS_INTERVALS) -> dict[int, dict]:
    """``search`` once per alignment class. Within a class the coarse grid takes every
    ``step // spacing``-th member (``step`` in sizes; 1 is a dense sweep), or by default cuts
    the class into ``intervals`` pieces; differing neighbours are bisected down to adjacent
    members. ``evaluate(size)`` is called once per size not already in ``known``."""
    points = dict(known or {})

    def at(size: int) -> dict:
        if size not in points:
            points[size] = evaluate(size)
        return points[size]

    for c in range(CLASS_TOP + 1):
        members = class_members(lo, hi, c)
        if members:
            search(0, len(members) - 1, _index_step(members, step, intervals),
                   lambda i, members=members: at(members[i]))  # `at` caches by size
    return points


def _index_step(members: range, step: int | None, intervals: int) -> int:
    """Members of a class from one grid point to the next (1: every member is evaluated)."""
    return max(1, step // members.step) if step else max(1, math.ceil((len(members) - 1) / intervals))


def grid_gap(lo: int, hi: int, step: int | None, intervals: int = CLASS_INTERVALS) -> int:
    """The widest distance between neighbouring grid points of a class that skips members,
    in sizes; 0 when every size is evaluated (a dense sweep). Kernels or drift that change
    and change back over a run of sizes narrower than this can lie between two grid points
    and go unseen in that class."""
    classes = [m for m in (class_members(lo, hi, c) for c in range(CLASS_TOP + 1)) if m]
    widest = [(min(_index_step(m, step, intervals), len(m) - 1), m.step) for m in classes]  # in members
    return max([i * spacing for i, spacing in widest if i > 1], default=0)


def state_at(points: dict[int, dict], size: int, by_class: dict[int, list[int]] | None = None) -> tuple:
    """The region_key the search implies at ``size``: that of its class's evaluated neighbours
    (after class_search, neighbours that differ are adjacent members, so they agree here)."""
    by_class = by_class or _by_class(points)
    sizes = by_class[size_class(size)]
    i = bisect.bisect_left(sizes, size)
    return region_key(points[sizes[min(i, len(sizes) - 1)]])


def _by_class(points: dict[int, dict]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {c: [] for c in range(CLASS_TOP + 1)}
    for s in sorted(points):
        out[size_class(s)].append(s)
    return out


def _class_set(classes: set[int], absent: set[int] = frozenset()) -> str:
    """Words for a set of classes: 'multiples of 4', 'sizes not divisible by 8', or a list.
    Classes with no size in the segment (``absent``) may be counted in or out."""
    for c in range(1, CLASS_TOP + 1):
        for target, words in ((set(range(c, CLASS_TOP + 1)), f"multiples of {2 ** c}"),
                              (set(range(c)), f"sizes not divisible by {2 ** c}")):
            if classes <= target <= classes | absent:
                return words
    return ", ".join(class_label(c) for c in sorted(classes))


def pattern(points: dict[int, dict], lo: int, hi: int) -> list[dict]:
    """The range as segments in which each class keeps one state; a segment whose classes
    differ is periodic and says so: ``lo``, ``hi``, ``states`` ([{classes, kernel_id,
    drift}], the most common first) and ``text`` ('1..11: drift, except multiples of 4: no drift')."""
    by_class = _by_class(points)
    segments: list[dict] = []
    for size in range(lo, hi + 1):
        c, key = size_class(size), state_at(points, size, by_class)
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
        states = [{"classes": [class_label(c) for c in sorted(groups[k])], "kernel_id": k[0],
                   "drift": None if k[1] is None else ("non-zero" if k[1] else "zero")} for k in order]
        text = f"{seg['lo']}..{seg['hi']}: {_state_words(order[0], several)}"
        if len(order) > 1:
            absent = set(range(CLASS_TOP + 1)) - set(seg["by_class"])
            text += ", except " + "; ".join(f"{_class_set(groups[k], absent)}: {_state_words(k, several)}"
                                            for k in order[1:])
        out.append({"lo": seg["lo"], "hi": seg["hi"], "periodic": len(order) > 1, "states": states, "text": text})
    return out


def _state_words(key: tuple, several_kernels: bool) -> str:
    kernel, drift = key
    words = [] if drift is None else ["drift" if drift else "no drift"]
    if several_kernels or drift is None:
        words.append(f"kernels {kernel}")
    return " with ".join(words) if len(words) == 2 else words[0]


def grid_count(lo: int, hi: int, step: int | None, intervals: int = CLASS_INTERVALS) -> int:
    """How many sizes the coarse grids of class_search hold (bisection comes on top)."""
    total = 0
    for c in range(CLASS_TOP + 1):
        members = class_members(lo, hi, c)
        if members:
            last = len(members) - 1
            total += len(range(0, last, _index_step(members, step, intervals))) + 1 if last else 1
    return total


def class_boundaries(points: dict[int, dict]) -> list[dict]:
    """``boundaries`` within each class: neighbouring evaluated members that differ, with
    ``class`` (its label); ``exact`` when they are adjacent members of the class."""
    out = []
    for c, sizes in _by_class(points).items():
        spacing = 2 ** min(c + 1, CLASS_TOP)
        for b in boundaries({s: points[s] for s in sizes}):
            out.append({"class": class_label(c), **b, "exact": b["hi"] - b["lo"] == spacing})
    return sorted(out, key=lambda b: (b["hi"], b["lo"]))


def class_regions(points: dict[int, dict]) -> list[dict]:
    """``regions`` within each class, with ``class``; ``lo``..``hi`` are members of the class."""
    out = []
    for c, sizes in _by_class(points).items():
        spacing = 2 ** min(c + 1, CLASS_TOP)
        regs = regions({s: points[s] for s in sizes})
        for r, nxt in zip(regs, regs[1:]):
            r["hi"] = nxt["lo"] - spacing
        out += [{"class": class_label(c), **r} for r in regs]
    return out


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
        for key, value in (("max_ulp", p.get("max_ulp")), ("max_u", p.get("max_u")), ("max_error_u", p["error_u"])):
            if value is not None:
                r[key] = value if r[key] is None else max(r[key], value)
    for r, nxt in zip(out, out[1:]):
        r["hi"] = nxt["lo"] - 1  # after search the neighbours are adjacent: this is a no-op then
    return out


def record(params: Params, points: dict[int, dict], *, input_checksum: str, environment: dict,
           sessions: list[dict], complete: bool) -> dict:
    """The scan's JSON object: parameters, every evaluated point, the boundaries and regions.

    ``evaluations`` counts the evaluated points over every session, ``dense_equivalent``
    the sizes a dense sweep would evaluate (hi − lo + 1). ``sessions`` lists each run's
    ``evaluated`` count, ``seconds`` (wall clock) and whether the scan was ``complete`` after it.
    Once the scan is complete it lists the ``pattern`` (segments of the range, periodic ones
    by class), and the ``boundaries`` and ``regions`` of each alignment class.
    """
    return {
        "schema": SCHEMA,
        "params": params.to_dict(),
        "complete": complete,
        "evaluations": len(points),
        "dense_equivalent": params.hi - params.lo + 1,
        "input_checksum": input_checksum,
        "classes": [class_label(c) for c in range(CLASS_TOP + 1)],
        "pattern": pattern(points, params.lo, params.hi) if complete else [],
        "boundaries": class_boundaries(points) if complete else [],
        "regions": class_regions(points) if complete else [],
        "points": [points[s] for s in sorted(points)],
        "sessions": sessions,
        "environment": environment,
    }


def check_record(rec, params: Params) -> None:
    """ScanError unless ``rec`` is a scan record of exactly the scan ``params`` describe."""
    if isinstance(rec, dict) and rec.get("schema") == "matmul-drift-scan/1":
        raise ScanError("the record is from before alignment classes (matmul-drift-scan/1): its sizes were chosen "
                        "on one grid and cannot be resumed by this search; start a new scan")
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
        raise ScanError(f"not a scan record (schema {SCHEMA} expected)")
    for key, kind, words in (("params", dict, "an object"), ("points", list, "a list"), ("sessions", list, "a list")):
        if not isinstance(rec.get(key), kind):
            raise ScanError(f"the record's {key} is not {words}: {str(rec.get(key))[:40]}")
    recorded = rec["params"]
    differ = [f"{key}: recorded {_param_words(key, recorded.get(key))}, here {_param_words(key, value)}"
              for key, value in params.to_dict().items() if recorded.get(key) != value]
    if differ:
        raise ScanError("the record is another scan; " + "; ".join(differ))
    # Checked before use: a resumed point is rendered, plotted and written back as it is.
    for p in rec["points"]:
        if not _well_formed(p, params):
            raise ScanError(f"the record holds a malformed point: {str(p)[:80]}")
    for s in rec["sessions"]:
        if not (isinstance(s, dict) and s.keys() == {"evaluated", "seconds", "complete"} and _integer(s["evaluated"])
                and _number(s["seconds"]) and isinstance(s["complete"], bool)):
            raise ScanError(f"the record holds a malformed session: {str(s)[:80]}")


def _param_words(key: str, value) -> str:
    # step 0 is the default grid, which --step cannot name (it takes 1 or more); within None is HI
    if key == "step" and value == 0:
        return "the default grid (no --step)"
    return "the range's top (no --within)" if key == "within" and value is None else repr(value)


def boundary_count(rec: dict) -> str:
    """'1 boundary', '3 boundaries'."""
    n = len(rec["boundaries"])
    return f"{n} boundary" if n == 1 else f"{n} boundaries"


def resume_points(rec: dict, params: Params, input_checksum: str) -> dict[int, dict]:
    """The points of a recorded scan, if it is the scan ``params`` describe; ScanError if not."""
    check_record(rec, params)
    if rec.get("input_checksum") != input_checksum:
        raise ScanError("the record's inputs differ from this scan's (input checksum)")
    return {p["size"]: p for p in rec["points"]}


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x) -> bool:
    """A finite number that fits a double: the plot converts it, json.dumps(allow_nan=False) writes it."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:  # an integer beyond a double
        return False


def _well_formed(p, params: Params) -> bool:
    return (isinstance(p, dict) and _integer(p.get("size")) and params.lo <= p["size"] <= params.hi
            and isinstance(p.get("kernel_id"), str)
            and isinstance(p.get("kernels"), list) and all(isinstance(k, str) for k in p["kernels"])
            and "error_u" in p and (p["error_u"] is None or _number(p["error_u"]))
            and all(p.get(key) is None if params.vary == "k" else _number(p.get(key))
                    for key in ("max_ulp", "frac_differ", "max_u")))


def load(path: str) -> dict:
    """A scan record from ``path``; ScanError (one line) if unreadable."""
    def number(text):  # 1e400 is valid JSON, but inf once parsed, and no rewrite could write it
        x = float(text)
        if not math.isfinite(x):
            raise ScanError(f"{path} holds the number {text[:40]}, beyond the range of a double")
        return x

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh, parse_constant=ids.no_constant, parse_float=number)
    except OSError as exc:
        raise ScanError(f"cannot read {path}: {exc.strerror}") from None
    except ScanError:
        raise
    except ValueError as exc:
        raise ScanError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise ScanError(f"{path} is nested too deeply to be a scan record") from None


def dumps(rec: dict) -> str:
    """A record as JSON text with one point per line: readable, diffable and quick to rewrite."""
    head = json.dumps({k: v for k, v in rec.items() if k != "points"}, indent=1, allow_nan=False)
    points = ",\n".join(json.dumps(p, allow_nan=False) for p in rec["points"])
    return f'{head[:-2]},\n "points": [\n{points}\n ]\n}}\n'


def write_atomic(path: str, obj: dict, new: bool = False) -> None:
    """Write ``obj`` as JSON atomically: an interruption leaves the old file or the new one.
    ``new``: the record's first write, which leaves alone a file that appeared at ``path``."""
    write_file(path, dumps(obj).encode(), new, "the record is in {kept}: --resume {kept} continues it")


def write_file(path: str, data: bytes, new: bool, kept_words: str) -> None:
    """Write ``data`` to ``path`` atomically (``new``: only where nothing is); ScanError (one
    line) when the system refuses, or when ``path`` appeared meanwhile: then the data are kept
    beside it, and ``kept_words`` (with {kept}, the file's name) says where."""
    try:
        (atomic.write_new if new else atomic.write_bytes)(path, data)
    except atomic.Taken as exc:
        raise ScanError(f"{path} appeared while the scan ran and is left as it is; "
                        + kept_words.format(kept=exc.kept)) from None
    except OSError as exc:  # a folder made read-only meanwhile, a full disk, /proc (root passes os.access)
        raise ScanError(f"cannot write {path}: {exc.strerror or exc}") from None


def render_saved(rec: dict, path: str) -> str:
    """render() of a record read from ``path``; ScanError (one line) for one that is not a
    scan's record, and a first line saying so for one a stopped scan left unfinished."""
    try:
        text = render(rec)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        raise ScanError(f"{path} is not a record `scan --json` writes ({type(exc).__name__}: {exc})") from None
    if not rec.get("complete"):
        text = f"{path}: an unfinished scan (--resume {path} continues it); what it found so far:\n\n" + text
    return text


def render(result: dict) -> str:
    """The pattern, the regions and boundaries of each class of a complete scan record, as text."""
    from tabulate import tabulate

    p = result["params"]
    drift = p["vary"] != "k"  # k has no sliced product to compare: kernel-id and error_u only
    fixed = ", ".join(f"{d}={p[d]}" for d in DIMS if d != p["vary"])
    if p.get("within"):
        fixed += f", slices of {p['vary']}={p['within']}"
    n_eval, dense = result["evaluations"], result["dense_equivalent"]
    head = (f"scan of {p['vary']} over {p['lo']}..{p['hi']} ({fixed}), {p['dtype']} on {p['device']}: "
            f"{n_eval} evaluations for {dense} sizes ({n_eval / dense:.1%} of a dense sweep), "
            f"{boundary_count(result)} within the alignment classes")
    pattern = "\n".join(f"  {p['vary']} {seg['text']}" for seg in result["pattern"])
    headers = ["class", "sizes", "kernel-id", "kernels"] + (["drift", "max ulp", "max_u"] if drift else []) + ["max error_u", "points"]
    rows = []
    for r in sorted(result["regions"], key=lambda r: (r["lo"], r["class"])):
        cells = [r["drift"], _shown(r["max_ulp"]), _shown(r["max_u"])] if drift else []
        rows.append([r["class"], f"{r['lo']}..{r['hi']}", r["kernel_id"], "\n".join(r["kernels"]),
                     *cells, _shown(r["max_error_u"]), r["points"]])
    parts = [head, "What holds where:\n" + pattern, tabulate(rows, headers=headers)]
    if result["boundaries"]:
        brows = []
        for b in result["boundaries"]:
            before, after = b["before"], b["after"]
            change = " and ".join(w for w, c in (("kernels", b["kernel_changed"]), ("drift", b["drift_changed"])) if c)
            brows.append([b["class"], f"{b['lo']} → {b['hi']}", change, "\n".join(before["kernels"]),
                          "(same)" if before["kernels"] == after["kernels"] else "\n".join(after["kernels"]),
                          _shown_side(before, drift), _shown_side(after, drift)])
        what = "drift" if drift else "error_u"
        parts.append(tabulate(brows, headers=["class", "boundary", "change", "kernels before", "kernels after",
                                              f"{what} before", f"{what} after"]))
    gap = grid_gap(p["lo"], p["hi"], p["step"])
    if not gap:
        parts.append("Every size was evaluated (a dense sweep): this is what holds at every size of the range.")
    else:
        grid = f"every {p['step']} sizes" if p["step"] else f"{CLASS_INTERVALS} intervals"
        parts.append(f"Each alignment class ({', '.join(result['classes'])}) was searched on its own coarse grid "
                     f"({grid} per class, grid points up to {gap} sizes apart), then bisected to adjacent members: "
                     "every boundary above is exact within its class, and routes that depend on the size modulo 2 "
                     "to 32 show as patterns. Not seen: kernels or drift that change and change back between two "
                     f"grid points of a class (a run of fewer than {gap} sizes), or a size whose drift vanishes only "
                     "because these inputs round alike there; --step S tightens the grid (--step 1 is a dense sweep).")
    return "\n\n".join(parts)


def _shown(x) -> str:
    return "—" if x is None else format(x, ".4g") if isinstance(x, float) else str(x)


def _shown_side(point: dict, drift: bool) -> str:
    """One side of a boundary: its drift (ulps, u) for n and m, its error_u (u) for k. Drift
    that max_ulp and max_u leave out (entries finite on one side only: 65504 against inf)
    is given as the share of entries that differ, which alone makes that side drift."""
    if not drift:
        return _shown(point["error_u"])
    text = f"{point['max_ulp']} ulp, {_shown(point['max_u'])} u"
    if point["frac_differ"] and not point["max_ulp"]:
        text += f", {100 * point['frac_differ']:.3g}% of entries between finite and NaN/inf"
    return text
