"""`matmul-drift scan`'s record: where along one dimension do the kernels or the drift change?

A point is a plain dict (``measure.scan_point``): ``size``, ``kernel_id``, ``kernels``,
``error_u`` and, for n and m, ``max_ulp``, ``frac_differ`` and ``max_u``. The search over
them is classsearch.py's (alignment classes, a period, spot checks); this module holds what a
scan is (``Params``), its record, the check before a resume, and the record in words. The
record says how many sizes were measured, which were spot checks, and where the search fell
back to dense. No torch here: measuring is measure/measure.py's, driving scan_run's, drawing
scan_plot's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tabulate import tabulate

from matmul_drift.probes import records
from matmul_drift.probes.classsearch import (CLASS_INTERVALS, class_boundaries, class_label,
                                             class_regions, classes_in, grid_gap, pattern,
                                             search_words)

# /1: one grid over all sizes; /2: classes by powers of two only, unchecked
SCHEMA = "matmul-drift-scan/3"
DIMS = ("m", "k", "n")


class ScanError(ValueError):
    """A scan that cannot start or continue as asked (no device, too little memory, other
    inputs than the record's, a file that is no scan's record)."""


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


def record(params: Params, points: dict[int, dict], *, input_checksum: str, environment: dict,
           sessions: list[dict], complete: bool, search: dict | None = None) -> dict:
    """The scan's JSON object: parameters, every evaluated point, the boundaries and regions.

    ``evaluations`` counts the evaluated points over every session, ``dense_equivalent``
    the sizes a dense sweep would evaluate (hi − lo + 1). ``sessions`` lists each run's
    ``evaluated`` count, ``seconds`` (wall clock) and whether the scan was ``complete`` after it.
    ``search`` is checked_search's report (None: class_search alone, period 1). Once the scan
    is complete it lists the ``pattern`` (segments of the range, periodic ones by class), and
    the ``boundaries`` and ``regions`` of each alignment class.
    """
    period = search["period"] if search else 1
    return {
        **records.head(SCHEMA, params.to_dict(), complete),
        "evaluations": len(points),
        "dense_equivalent": params.hi - params.lo + 1,
        "input_checksum": input_checksum,
        "classes": [class_label(c, period) for c in classes_in(params.lo, params.hi, period)],
        "search": search if complete else None,
        "pattern": pattern(points, params.lo, params.hi, period) if complete else [],
        "boundaries": class_boundaries(points, period) if complete else [],
        "regions": class_regions(points, period) if complete else [],
        "points": [points[s] for s in sorted(points)],
        "sessions": sessions,
        "environment": environment,
    }


def check_record(rec, params: Params) -> None:
    """records.RecordError unless ``rec`` is a scan record of exactly the scan ``params``
    describe, with well-formed points and sessions."""
    if isinstance(rec, dict) and rec.get("schema") in ("matmul-drift-scan/1",
                                                        "matmul-drift-scan/2"):
        raise records.RecordError(
            f"the record is from an older search ({rec['schema']}): its sizes were chosen without "
            "periods or spot checks and cannot be resumed by this search; start a new scan")
    records.check(rec, params.to_dict(), schema=SCHEMA, what="scan",
                  point_ok=lambda p: _well_formed(p, params), param_words=_param_words)


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
    """The points of a recorded scan, if it is the scan ``params`` describe; RecordError if
    not, ScanError for other inputs."""
    check_record(rec, params)
    if rec.get("input_checksum") != input_checksum:
        raise ScanError("the record's inputs differ from this scan's (input checksum)")
    return {p["size"]: p for p in rec["points"]}


def _well_formed(p, params: Params) -> bool:
    return (records.point_ok(p, params.lo, params.hi)
            and "error_u" in p and (p["error_u"] is None or records.number(p["error_u"]))
            and all(p.get(key) is None if params.vary == "k" else records.number(p.get(key))
                    for key in ("max_ulp", "frac_differ", "max_u")))


def render_saved(rec: dict, path: str) -> str:
    """render() of a record read from ``path``; ScanError (one line) for one that is not a
    scan's record, and a first line saying so for one a stopped scan left unfinished."""
    try:
        text = render(rec)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        raise ScanError(f"{path} is not a record `scan --json` writes "
                        f"({type(exc).__name__}: {exc})") from None
    if not rec.get("complete"):
        text = (f"{path}: an unfinished scan (--resume {path} continues it); "
                "what it found so far:\n\n" + text)
    return text


def render(result: dict) -> str:
    """The pattern, the regions and boundaries of each class of a complete scan record, as text."""
    p = result["params"]
    drift = p["vary"] != "k"  # k has no sliced product to compare: kernel-id and error_u only
    fixed = ", ".join(f"{d}={p[d]}" for d in DIMS if d != p["vary"])
    if p.get("within"):
        fixed += f", slices of {p['vary']}={p['within']}"
    n_eval, dense = result["evaluations"], result["dense_equivalent"]
    head = (f"scan of {p['vary']} over {p['lo']}..{p['hi']} ({fixed}), "
            f"{p['dtype']} on {p['device']}: "
            f"{n_eval} evaluations for {dense} sizes ({n_eval / dense:.1%} of a dense sweep), "
            f"{boundary_count(result)} within the alignment classes")
    pattern = "\n".join(f"  {p['vary']} {seg['text']}" for seg in result["pattern"])
    headers = (["class", "sizes", "kernel-id", "kernels"]
               + (["drift", "max ulp", "max_u"] if drift else []) + ["max error_u", "points"])
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
            change = " and ".join(w for w, c in (("kernels", b["kernel_changed"]),
                                                 ("drift", b["drift_changed"])) if c)
            brows.append([b["class"], f"{b['lo']} → {b['hi']}", change,
                          "\n".join(before["kernels"]),
                          "(same)" if before["kernels"] == after["kernels"]
                          else "\n".join(after["kernels"]),
                          _shown_side(before, drift), _shown_side(after, drift)])
        what = "drift" if drift else "error_u"
        parts.append(tabulate(brows, headers=["class", "boundary", "change", "kernels before",
                                              "kernels after",
                                              f"{what} before", f"{what} after"]))
    search = result.get("search")
    period = search["period"] if search else 1
    gap = grid_gap(p["lo"], p["hi"], p["step"], period=period)
    if search:
        parts.append("How: " + search_words(search, n_eval, dense, "size") + ".")
    if not gap or n_eval == dense:
        parts.append("Every size was evaluated (a dense sweep): "
                     "this is what holds at every size of the range.")
    else:
        grid = f"every {p['step']} sizes" if p["step"] else f"{CLASS_INTERVALS} intervals"
        parts.append(f"Each alignment class ({', '.join(result['classes'])}) was searched on its "
                     f"own coarse grid ({grid} per class, grid points up to {gap} sizes apart), "
                     "then bisected to adjacent members: every boundary above is exact within its "
                     "class, and routes that depend on the size modulo a power of two up to 32 "
                     "(or the period found) show as patterns. Not seen but for the spot checks: "
                     "kernels or drift that change and change back between two grid points of a "
                     f"class (a run of fewer than {gap} sizes), or a size whose drift vanishes "
                     "only because these inputs "
                     "round alike there; --step S tightens the grid (--step 1 is a dense sweep).")
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
