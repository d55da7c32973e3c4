"""The search behind `matmul-drift map`: which batch sizes give the same bits?

For every M of a range it states three things of ``A[:M] @ B``: whether its row 0 is the
bits of ``A[:1] @ B`` (``row0``), whether its rows are the bits of the same rows of the full
product ``A[:M_full] @ B`` (``rows``; M_full is the range's top, or the case's M), and the
kernel-id that ran. A point is measure/batchpoint.py's plain dict: ``size``, ``kernel_id``,
``kernels`` and ``row0_``/``rows_`` ``max_ulp``, ``frac_differ`` and ``max_u``.

It measures only some M: the checked search (probes/classsearch.py: a dense prefix that shows the
period, the alignment classes of that period, spot checks of M not measured, dense stretches
where a check fails) runs on the state (kernel-id, row 0 invariant?, rows invariant?), so every
M is measured, or inferred within its class and the inference checked at random M. No torch
here: measuring is batchpoint's, driving batchmap_run's, drawing map_plot's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from matmul_drift.core import cases, mapruns
from matmul_drift.probes import classsearch, records

SCHEMA = "matmul-drift-map/2"  # /1: classes by powers of two only, unchecked
DEFAULT_TOP = {"cpu": 256, "cuda": 512}  # the default range's top M, by device
MAX_SPANS = 8  # beyond this many runs of M, a property is stated by alignment class instead
FULL_WORDS = {"range": "the range's top", "case": "the case's M"}
PROPERTIES = ("row0", "rows")
_NUMBERS = tuple(f"{w}_{key}" for w in PROPERTIES for key in ("max_ulp", "frac_differ", "max_u"))


class MapError(ValueError):
    """A map that cannot start or continue as asked (bad shape, no device, too little memory,
    other inputs or anchors than the record's)."""


@dataclass(frozen=True)
class Params:
    """What a map is: M over ``lo..hi`` (both included), against the full product of
    ``m_full`` rows (``full``: "range" when that is the range's top, "case" when the case's
    M); ``case`` (a catalog id, None for --k --n), ``op`` (mm, linear, bmm), ``k``, ``n`` and
    ``batch`` (bmm only), in elements; ``dtype`` (a precision: float32-tf32 sets its flags),
    ``device``, the input ``seed`` and the environment's id (12 hex digits)."""

    case: str | None
    op: str
    lo: int
    hi: int
    m_full: int
    full: str
    k: int
    n: int
    batch: int | None
    dtype: str
    device: str
    seed: int
    env_id: str

    def to_dict(self) -> dict:
        return asdict(self)


def shape(case_id: str | None, k: int | None, n: int | None, rng: tuple[int, int] | None,
          device: str) -> dict:
    """The map's shape and range: ``case`` (a Case: the catalog's, or an ad-hoc one of M_full
    rows), ``lo``, ``hi``, ``m_full``, ``full`` (Params.full), ``k``, ``n``, ``batch`` (sizes in
    elements). The default range is 1..DEFAULT_TOP[device], or 1..the case's M where that is
    smaller. MapError for a shape that cannot be mapped or a range beyond the case's M."""
    if case_id is None:
        if k is None or n is None:
            raise MapError("give --case NAME, or --k K and --n N")
        lo, hi = rng or (1, DEFAULT_TOP[device])
        return {"case": cases.adhoc(hi, k, n), "lo": lo, "hi": hi, "m_full": hi, "full": "range",
                "k": k, "n": n, "batch": None}
    if k is not None or n is not None:
        raise MapError(f"--case {case_id} fixes K and N; drop --k and --n")
    try:
        case = cases.get(case_id)
    except ValueError as exc:
        raise MapError(str(exc)) from None
    if case.op == "mv":
        raise MapError(f"--case {case_id} multiplies a vector (A is 1-D): "
                       "it has no batch dimension to map")
    s = case.shape(device)
    lo, hi = rng or (1, min(DEFAULT_TOP[device], s.m))
    if hi > s.m:
        raise MapError(f"--range {lo}:{hi} reaches beyond the case's M: "
                       f"{case_id} has M = {s.m} on {device}")
    return {"case": case, "lo": lo, "hi": hi, "m_full": s.m, "full": "case", "k": s.k, "n": s.n,
            "batch": s.batch}


# --- the search --------------------------------------------------------------------------


def invariant(point: dict, which: str) -> bool:
    """Whether ``which`` ("row0" or "rows") of a point is bit-identical to its anchor:
    no entry differs (frac_differ counts those max_ulp leaves out: finite against inf)."""
    return not (point[f"{which}_max_ulp"] or point[f"{which}_frac_differ"])


def state(point: dict) -> tuple[str, bool, bool]:
    """(kernel-id, row 0 invariant?, rows invariant?): what must match for two M to agree."""
    return point["kernel_id"], invariant(point, "row0"), invariant(point, "rows")


def _view(point: dict) -> dict:
    # the search compares points by classsearch.region_key (kernel-id, drift zero?); the map's
    # state has two drifts, so the search sees the whole state in the kernel-id's place.
    return {"kernel_id": state(point)}


def search(lo: int, hi: int, evaluate,
           known: dict[int, dict] | None = None) -> tuple[dict[int, dict], dict]:
    """classsearch.checked_search over M = lo..hi on the map's state. ``evaluate(M) -> point`` is
    called once per M asked for that is not in ``known``; returns every point asked for by M,
    and the search's report (classsearch.checked_search's). Deterministic given the points, so a map
    resumes by replaying it over the points recorded."""
    cache = dict(known or {})
    points: dict[int, dict] = {}

    def at(m: int) -> dict:
        points[m] = cache[m] if m in cache else evaluate(m)
        return _view(points[m])

    _, report = classsearch.checked_search(lo, hi, at)
    return points, report


def verdicts(points: dict[int, dict], lo: int, hi: int, period: int = 1) -> list[dict]:
    """Every M of lo..hi as runs of one state: ``lo``, ``hi``, ``kernel_id``, ``row0``, ``rows``
    (True: bit-identical) and ``measured`` (how many M of the run were measured; the others
    take the state of their class, of ``period``, as the search inferred and checked it)."""
    views = {m: _view(p) for m, p in points.items()}
    stated = classsearch.states(views, lo, hi, period)
    out: list[dict] = []
    for m in range(lo, hi + 1):
        kernel_id, row0, rows = stated[m][0]
        if out and ((out[-1]["kernel_id"], out[-1]["row0"], out[-1]["rows"])
                    == (kernel_id, row0, rows)):
            out[-1]["hi"] = m
        else:
            out.append({"lo": m, "hi": m, "kernel_id": kernel_id, "row0": row0, "rows": rows,
                        "measured": 0})
        out[-1]["measured"] += m in points
    return out


# --- words ---------------------------------------------------------------------------------


def _pattern_text(points: dict[int, dict], lo: int, hi: int, key, period: int = 1) -> str:
    """classsearch.pattern's segments ("1..11: drift, except multiples of 4: no drift") for one
    part of the state: ``key(point)`` is the (kernel-id, drift) pair scan's words read."""
    views = {m: dict(zip(("kernel_id", "max_ulp"), key(p)), frac_differ=0.0)
             for m, p in points.items()}
    return "; ".join(seg["text"] for seg in classsearch.pattern(views, lo, hi, period))


def _worst(points: dict[int, dict], which: str) -> str:
    """The largest drift among the measured M that drift (ulps), in words."""
    drifting = [p for p in points.values() if not invariant(p, which)]
    ulp = max(p[f"{which}_max_ulp"] for p in drifting)
    return f"max {ulp} ulp" if ulp else "entries differ between finite and NaN/inf only"


def property_words(points: dict[int, dict], runs: list[dict], which: str, lo: int, hi: int,
                   period: int = 1) -> str:
    """Where ``which`` ("row0" or "rows") holds, in words: 'invariant at M = 1..3, 8..15;
    drifts elsewhere (max 2 ulp)'; where more than MAX_SPANS runs, by alignment class (period
    1), or the first MAX_SPANS runs and a count (a period found: its classes are many)."""
    spans = mapruns.spans([(r["lo"], r["hi"]) for r in runs if r[which]])
    if not spans:
        return f"drifts at every M ({_worst(points, which)})"
    if spans == [(lo, hi)]:
        return f"invariant at every M, {lo}..{hi}"
    if len(spans) > MAX_SPANS:
        count = sum(b - a + 1 for a, b in spans)
        if period > 1:
            return (f"invariant at {count} of {hi - lo + 1} M (period {period}): "
                    f"{mapruns.spans_text(spans, MAX_SPANS)}; "
                    f"drifts elsewhere ({_worst(points, which)})")
        return (f"invariant at {count} of {hi - lo + 1} M, by alignment: "
                f"{_pattern_text(points, lo, hi, lambda p: ('', int(not invariant(p, which))))} "
                f"({_worst(points, which)})")
    return (f"invariant at M = {mapruns.spans_text(spans)}; "
            f"drifts elsewhere ({_worst(points, which)})")


def route(kernels: list[str]) -> str:
    """A kernel list without the aten chain, which most routes share."""
    return "; ".join([k for k in kernels if not k.startswith("aten::")] or kernels)


def kernel_words(points: dict[int, dict], runs: list[dict], lo: int, hi: int,
                 period: int = 1) -> str:
    """Which kernels ran where: 'one route at every M (…)', the M of each kernel-id, or by
    alignment class where more than MAX_SPANS runs."""
    names = {p["kernel_id"]: route(p["kernels"]) for p in points.values()}
    where: dict[str, list[tuple[int, int]]] = {}
    for r in runs:
        where.setdefault(r["kernel_id"], []).append((r["lo"], r["hi"]))
    if len(where) == 1:
        (kid,) = where
        return f"one route at every M: {kid} ({names[kid]})"
    spans = {kid: mapruns.spans(w) for kid, w in where.items()}
    if sum(map(len, spans.values())) > MAX_SPANS and period == 1:
        text = _pattern_text(points, lo, hi, lambda p: (p["kernel_id"], None))
    elif sum(map(len, spans.values())) > MAX_SPANS:
        text = "; ".join(f"{kid} at M = {mapruns.spans_text(s, MAX_SPANS)}"
                         for kid, s in sorted(spans.items(), key=lambda x: x[1][0]))
    else:
        text = "; ".join(f"{kid} at M = {mapruns.spans_text(s)}"
                         for kid, s in sorted(spans.items(), key=lambda x: x[1][0]))
    return text + "".join(f"\n    {kid}: {names[kid]}"
                          for kid in sorted(where, key=lambda k: spans[k][0]))


def words(points: dict[int, dict], lo: int, hi: int, m_full: int, period: int = 1) -> str:
    """The map in words: one line for row 0, one for the rows, then the kernels."""
    runs = verdicts(points, lo, hi, period)
    return "\n".join([
        f"row 0 as at M = 1: {property_words(points, runs, 'row0', lo, hi, period)}",
        f"rows as in the full product (M = {m_full}): "
        f"{property_words(points, runs, 'rows', lo, hi, period)}",
        f"kernels: {kernel_words(points, runs, lo, hi, period)}",
    ])


def measured_words(rec: dict) -> str:
    """'measured 61 of 256 batch sizes (23.8%), 12 of them spot checks'."""
    n, size = rec["measured"], rec["range_size"]
    checks = len((rec.get("search") or {}).get("checked", []))
    return f"measured {n} of {size} batch sizes ({n / size:.1%}), {checks} of them spot checks"


def render(rec: dict) -> str:
    """A complete map record as text: what was mapped, how much was measured, the words, and
    what the search cannot see."""
    p = rec["params"]
    what = (f"--case {p['case']}, " if p["case"] else "") + f"k={p['k']}, n={p['n']}"
    what += f", batch={p['batch']}" if p["batch"] else ""
    head = (f"map of M over {p['lo']}..{p['hi']} ({what}), {p['dtype']} on {p['device']}: "
            f"{measured_words(rec)}, "
            f"one product each, compared with A[:1] @ B and with the full product "
            f"A[:{p['m_full']}] @ B "
            f"(M = {p['m_full']}, {FULL_WORDS[p['full']]}), each made once")
    body = "\n".join("  " + line for line in rec["words"].splitlines())
    gap = rec["grid_gap"]
    how = rec.get("search") and classsearch.search_words(rec["search"], rec["measured"],
                                                         rec["range_size"], "batch size")
    how = f"How: {how}.\n" if how else ""
    if not gap or rec["measured"] == rec["range_size"]:
        note = "Every M was measured: this is what holds at every M of the range."
    else:
        note = (f"The M not measured take their alignment class's state: each class "
                f"({', '.join(rec['classes'])}) was searched on its own grid (points up to "
                f"{gap} batch sizes apart) and bisected to adjacent members, so every change is "
                "exact within its class (as scan's), and the spot checks test that inference at "
                "M drawn at random. Not seen but for them: a state that changes and changes back "
                "between two grid points of a class (a run of fewer than "
                f"{gap} batch sizes), or an M whose drift vanishes only because these inputs round "
                "alike there. Ulps are the largest among the measured M.")
    return f"{head}\n\n{body}\n\n{how}{note}"


# --- the record ----------------------------------------------------------------------------


def record(params: Params, points: dict[int, dict], *, input_checksum: str, anchor_checksum: str,
           environment: dict, sessions: list[dict], complete: bool,
           search: dict | None = None) -> dict:
    """The map's JSON object. ``measured`` counts the M measured over every session (each one
    product), ``products`` adds the two anchors, ``range_size`` is hi − lo + 1; ``grid_gap``
    (batch sizes) is classsearch.grid_gap's in the classes of the period found. Once complete:
    ``search`` (classsearch.checked_search's report: the period, the prefix, the spot checks, where
    it fell back to dense), ``verdicts`` (every M, as runs of one state) and ``words``.
    ``sessions`` as scan's: ``evaluated``, ``seconds``, ``complete``."""
    period = search["period"] if search else 1
    return {
        **records.head(SCHEMA, params.to_dict(), complete),
        "measured": len(points),
        "products": len(points) + 2,
        "range_size": params.hi - params.lo + 1,
        "input_checksum": input_checksum,
        "anchor_checksum": anchor_checksum,
        "classes": [classsearch.class_label(c, period)
                    for c in classsearch.classes_in(params.lo, params.hi, period)],
        "grid_gap": classsearch.grid_gap(params.lo, params.hi, None, period=period),
        "search": search if complete else None,
        "verdicts": verdicts(points, params.lo, params.hi, period) if complete else [],
        "words": words(points, params.lo, params.hi, params.m_full, period) if complete else "",
        "points": [points[m] for m in sorted(points)],
        "sessions": sessions,
        "environment": environment,
    }


ENTRY_SCHEMA = "matmul-drift-map-entry/1"


def entry_params(params: dict) -> dict:
    """A map's params as its catalog entry keeps them: without the environment's id (the
    env-id series records the environment, and two builds with one map share one map-id)."""
    return {k: v for k, v in params.items() if k != "env_id"}


def entry(rec: dict) -> dict:
    """The catalog text behind a map-id (catalog kind "maps") of a complete record: ``params``
    (entry_params), ``verdicts`` (every M as runs of one state: core/mapruns.py), ``words``,
    ``measured`` (the M measured, in order) and ``range_size`` (hi − lo + 1). Plain data;
    what map_plot draws and what the summary compares."""
    return {"schema": ENTRY_SCHEMA, "params": entry_params(rec["params"]),
            "verdicts": rec["verdicts"],
            "words": rec["words"], "measured": sorted(p["size"] for p in rec["points"]),
            "range_size": rec["range_size"]}


def entry_misfit(e, params: Params) -> str | None:
    """Why the catalog entry ``e`` cannot stand for the map ``params`` describe (another map, or
    verdicts that do not cover its range run by run), in words; None where it can."""
    if not isinstance(e, dict) or e.get("schema") != ENTRY_SCHEMA:
        return f"not a map entry (schema {ENTRY_SCHEMA} expected)"
    want = entry_params(params.to_dict())
    if e.get("params") != want:
        got = e.get("params") if isinstance(e.get("params"), dict) else {}
        return "another map: " + "; ".join(f"{k} {got.get(k)!r}, here {v!r}"
                                           for k, v in want.items() if got.get(k) != v)
    runs, at = e.get("verdicts"), params.lo
    for r in runs if isinstance(runs, list) and runs else [None]:
        if not (isinstance(r, dict) and r.get("lo") == at and records.integer(r.get("hi"))
                and r["hi"] >= at
                and isinstance(r.get("kernel_id"), str) and isinstance(r.get("row0"), bool)
                and isinstance(r.get("rows"), bool)):
            return (f"its verdicts do not cover M = {params.lo}..{params.hi} run by run "
                    f"(at M = {at})")
        at = r["hi"] + 1
    return None if at == params.hi + 1 else f"its verdicts end at M = {at - 1}, not {params.hi}"


def check_record(rec, params: Params) -> None:
    """records.RecordError unless ``rec`` is a map record of exactly the map ``params``
    describe, with well-formed points and sessions."""
    records.check(rec, params.to_dict(), schema=SCHEMA, what="map",
                  point_ok=lambda p: (records.point_ok(p, params.lo, params.hi)
                                      and all(records.number(p.get(k)) for k in _NUMBERS)))


def resume_points(rec: dict, params: Params, input_checksum: str,
                  anchor_checksum: str) -> dict[int, dict]:
    """The points of a recorded map, if it is the map ``params`` describe, on the same inputs
    and against anchor products of the same bits; RecordError if it is another map, MapError
    for other inputs or anchors."""
    check_record(rec, params)
    if rec.get("input_checksum") != input_checksum:
        raise MapError("the record's inputs differ from this map's (input checksum)")
    if rec.get("anchor_checksum") != anchor_checksum:
        raise MapError("the record's A[:1] @ B or full product had other bits than this run's "
                       "(anchor checksum): "
                       "the products drift from run to run here; start a new map")
    return {p["size"]: p for p in rec["points"]}
