"""`matmul-drift explain`: one shape's report, judged and rendered, without torch.

``Request`` says what to explain (explain_run.py checks and measures it); ``report`` turns a
Measurement into the JSON object other tools script against; ``verdict`` judges it; ``render``
prints tables, and ``read_saved`` a report saved with --json. Measuring stays in measure/.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from matmul_drift.core import ids, numerics
from matmul_drift.core.errors import BadValue
from matmul_drift.core.routes import unique
from matmul_drift.measure.record import Measurement, bits_part
from matmul_drift.probes import fixfind
from matmul_drift.store import bounded

DRIFT_KEYS = ("max_u", "max_u_entries", "frac_differ", "max_ulp", "sign_changes",
              "nonfinite_differ", "beyond_bound")
LEGEND = (
    "u: the unit roundoff of the output dtype ({u}); "
    "errors and drifts in u are |difference| / (u · Σ|a·b|).",
    "ulp: the gap between neighbouring floats at a value; "
    "an ulp count is how many floats lie between two results.",
    "γ_K: K·u / (1 − K·u), the worst error (in u) any order of summing K products can make; "
    "none where K·u ≥ 1.",
)
TF32_LEGEND = ("γ_K(TF32): ((1 + 2^-10)² (1 + γ_K at 2u) − 1) / u, the same for TF32, "
               "which takes each input to 10 fraction bits and adds cutting toward zero.")


def _worst(row: dict) -> tuple:
    max_u = math.inf if row["max_u"] is None else row["max_u"]  # None: made null, was inf
    return (row["nonfinite_differ"], max_u, row["max_ulp"])


def _pick(rows: list[dict], want: int | None, key: str) -> dict | None:
    """The row for ``want`` (worst over forms), else the worst row overall; a slice_n row
    keeps its ``form``, which says whether that worst is the 1-D A's own product or its 2-D one."""
    if want is not None:
        rows = [r for r in rows if r[key] == want]
    if not rows:
        return None
    worst = max(rows, key=_worst)
    return {key: worst[key], **{k: worst[k] for k in ("form",) if k in worst},
            **{k: worst[k] for k in DRIFT_KEYS}}


def report(m: Measurement, slice_n: int | None = None, slice_m: int | None = None,
           layout: dict | None = None, rounding: dict | None = None) -> dict:
    """The JSON object of `explain --json`. Units: error_u, gamma_k_u and max_u in u of the
    output dtype; max_ulp in output ulps; frac_differ a fraction; seconds per product.
    ``rounding`` (files only): per operand, the counts of entries that rounding to the dtype
    made ±inf (``to_inf``) or 0 (``to_zero``).

    Every value is RFC 8259 JSON: a non-finite number becomes null, and ``nulls`` maps its
    path to the reason.
    """
    out = {
        "case": m.case,
        "dtype": m.precision,
        "device": m.device,
        "shape": {"m": m.m, "k": m.k, "n": m.n, "batch": m.batch},
        "layout": layout,
        "rounding": rounding,
        "error_u": m.error_u,
        "error_entries": m.error,
        "gamma_k_u": m.gamma_k_u,
        "reference": m.reference,
        "nonfinite": m.nonfinite,
        "slice_n": _pick(m.slice_n, slice_n, "n"),
        "slice_m": _pick(m.slice_m, slice_m, "m"),
        "run_to_run": dict(m.run_to_run),
        "kernels": _kernels(m.kernels),
        "kernel_id": f"{m.kernel_id:012x}",
        "bits": m.bits,
        "bits_id": f"{m.bits_id:012x}",
        "slices": {"n": m.slice_n, "m": m.slice_m},
        "slice_pairs": m.slice_pairs,
        "input_checksum": m.input_checksum,
        "seconds": m.seconds,
        "environment": m.environment,
        "env_id": f"{m.env_id:012x}",
    }
    nulls: dict[str, str] = {}
    if m.error_u is None:
        nulls["error_u"] = ("no entry is finite in both the product and the exact result, "
                            "with Σ|a·b| > 0")
    if m.gamma_k_u is None:
        nulls["gamma_k_u"] = ("2K·u ≥ 1: the γ_K(TF32) bound says nothing"
                              if m.precision in numerics.TF32
                              else "K·u ≥ 1: the γ_K bound says nothing")
    out = _finite(out, "", nulls)
    out["nulls"] = nulls
    out["verdict"] = verdict(out)
    return out


def _kernels(kern: dict) -> dict:
    """``full``, ``slice_n`` and ``slice_m`` (every name once), each kind followed by its
    ``"<kind> per call"`` list where its calls' kernels differ (routes.merged)."""
    out = {}
    for kind in ("full", "slice_n", "slice_m"):
        out[kind] = kern.get(kind, [])
        if f"{kind} per call" in kern:
            out[f"{kind} per call"] = kern[f"{kind} per call"]
    return out


def _call_kernels(r: dict, name: str, row: dict) -> list[str] | None:
    """The kernels of the one call behind ``row`` of ``name`` (slice_n or slice_m): its line of
    ``"<name> per call"`` ("n=8: a; b", or "n=8 2d: a; b" where the case has two forms) where
    the calls differ, else the list they all share."""
    dim = name[-1]
    for line in r["kernels"].get(f"{name} per call") or ():
        label, _, names = line.partition(": ")
        size, _, form = label.partition(" ")
        if size == f"{dim}={row[dim]}" and form in ("", row.get("form")):
            return names.split("; ") if names else []
    return r["kernels"].get(name)


def _finite(obj, path: str, nulls: dict):
    """``obj`` with every NaN or ±inf float replaced by None; ``nulls[path]`` says what it was."""
    if isinstance(obj, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), nulls) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v, f"{path}[{i}]", nulls) for i, v in enumerate(obj)]
    if isinstance(obj, float) and not math.isfinite(obj):
        nulls[path] = f"was {obj}"
        return None
    return obj


def _drifts(r: dict) -> list[tuple[str, dict]]:
    out = ([("slice_n", row) for row in r["slices"]["n"]]
           + [("slice_m", row) for row in r["slices"]["m"]])
    return out + [("run_to_run", r["run_to_run"])]


def _where(name: str, row: dict) -> str:
    if "n" in row:  # the 2d form is a 1-D A made one row: the user's own 1-D product is the other
        return f"n={row['n']}" + (" (A 2-D)" if row.get("form") == "2d" else "")
    return f"m={row['m']}" if "m" in row else f"over {row['repeat']} calls"


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def verdict(r: dict) -> dict:
    """``_judge``'s verdict, its text followed by what rounding the files to the dtype lost."""
    v = _judge(r)
    lost = []
    for name, c in (r.get("rounding") or {}).items():
        if c["to_inf"]:
            lost.append(f"{_count(c['to_inf'], 'finite entry', 'finite entries')} "
                        f"of {name.upper()} ±inf")
        if c["to_zero"]:
            lost.append(f"{_count(c['to_zero'], 'non-zero entry', 'non-zero entries')} "
                        f"of {name.upper()} 0")
    if lost:
        said = lost[0] if len(lost) == 1 else f"{', '.join(lost[:-1])} and {lost[-1]}"
        v["text"] += f"; rounding the files to {r['dtype'].split('-', 1)[0]} made {said}"
    return v


def _judge(r: dict) -> dict:
    """The judgement: ``defect`` (exit 1), ``non-finite inputs``, ``overflow``, ``rounding`` or
    ``bit-identical``, with a one-line reason that leads with max_u and the share of entries.

    A defect is found among entries finite on both sides only: an error beyond the γ_K
    bound (γ_K·u·|A||B|, plus (K+1)·η for rounding below the normal range), a non-zero
    output where every term is zero, or two products further apart than twice that (each
    may be that far from the truth). Non-finite values never make a defect, nor
    "bit-identical".
    """
    gamma, dt, g = r["gamma_k_u"], r["dtype"], numerics.bound_name(r["dtype"])
    err, cover, nf = r["error_u"], r["error_entries"], r["nonfinite"]
    over = f"over {cover['entries']} of {cover['of']} entries"
    if cover["beyond_bound"]:
        return {"kind": "defect",
                "text": f"DEFECT: {_count(cover['beyond_bound'], 'entry has', 'entries have')} an "
                        f"error beyond the {g} bound {gamma:.4g} u (error_u {_fmt(err)} u {over})"}
    if cover["zero_misses"]:
        return {"kind": "defect",
                "text": f"DEFECT: {_outputs(cover['zero_misses'])} non-zero "
                        "where every product term is zero"}
    for name, row in _drifts(r):
        if row.get("beyond_bound"):
            moves = _count(row["beyond_bound"], "entry", "entries")
            return {"kind": "defect",
                    "text": f"DEFECT: {name} {_where(name, row)} moves {moves} further than "
                            f"2·{g} = {2 * gamma:.4g} u (max_u {_fmt(row['max_u'])} u)"}
    err_text = _error_text(err, cover, over)
    ref = r.get("reference") or {}
    if not ref.get("exact_products", True) and (ref.get("error_bound_u") or 0) >= 1:
        # float64 rows or columns too wide in range for the slices: error_u may be the
        # reference's own
        err_text += (f", against a reference good only to {ref['error_bound_u']:.2g} u here "
                     "(rows of A or columns of B span too many binades for float64 to slice "
                     "exactly)")
    elif cover["subnormal"]:
        err_text += (f", {cover['subnormal']} of them with Σ|a·b| below {dt}'s normal range, "
                     "where rounding is absolute")
    moved = [(name, row) for name, row in _drifts(r) if row["frac_differ"] > 0]
    drift_text = _drift_text(r, moved)
    if nf["a"] or nf["b"]:
        return {"kind": "non-finite inputs", "text": (
            f"non-finite inputs: A has "
            f"{_count(nf['a'], 'NaN or inf entry', 'NaN or inf entries')}, B {nf['b']}; "
            f"{_outputs(nf['reference'])} NaN or inf in the exact result "
            f"and {nf['product']} in the product"
            + (f" ({nf['mismatch']} of them not the exact result's NaN or inf)"
               if nf["mismatch"] else "")
            + f"; {err_text}; {drift_text}")}
    nonfinite_drift = [(name, row) for name, row in moved if row["nonfinite_differ"]]
    if nf["overflow"] or nf["spurious"] or nonfinite_drift:
        parts = []
        if nf["overflow"]:
            parts.append(f"{_outputs(nf['overflow'])} inf because the exact value is beyond "
                         f"{dt}'s largest finite value {numerics.finite_max(dt):.6g}, "
                         "so inf is the rounded result")
        if nf["spurious"]:
            parts.append(f"{_outputs(nf['spurious'])} NaN or inf although the exact value is "
                         "finite and rounds to something else (an intermediate sum overflowed, "
                         "or a sum just below the threshold was rounded past it twice: "
                         f"in the wider accumulator, then to {dt})")
        for name, row in nonfinite_drift:
            turns = _count(row["nonfinite_differ"], "entry", "entries")
            parts.append(f"{name} {_where(name, row)} turns {turns} between finite and NaN/inf")
        return {"kind": "overflow",
                "text": "overflow: " + "; ".join(parts) + f"; {err_text}; {drift_text}"}
    if not moved:
        return {"kind": "bit-identical",
                "text": "bit-identical: every slice and every repeat gave the full product's "
                        f"bits; {err_text}"}
    name, row = max(moved, key=lambda x: _worst(x[1]))
    why = _why(_call_kernels(r, name, row) if name != "run_to_run" else None, r["kernels"]["full"])
    bound = (f"within the bound 2·{g} = {2 * gamma:.4g} u" if gamma
             else f"K·u ≥ 1, so {g} gives no bound")
    # only the η term lets it be beyond
    if gamma and max(_worst(row)[1] for _, row in moved) > 2 * gamma:
        bound += f" plus twice (K+1)·η, the absolute rounding below {dt}'s normal range"
    return {"kind": "rounding",
            "text": f"rounding-level drift: {drift_text}; {why}; {bound}; {err_text}"}


def _error_text(err: float | None, cover: dict, over: str) -> str:
    """error_u and what it covers, in words; entries whose every product term is 0 and whose
    output is 0 (``exact_zeros``; absent from reports saved before it was counted) are exact."""
    zeros = cover.get("exact_zeros", 0)
    if err is None and zeros == cover["of"]:  # an all-zero A or B: nothing to cover, nothing wrong
        return (f"every entry is exact: {_count(zeros, 'output is', 'outputs are')} 0, "
                "as is each of their product terms")
    text = (f"error_u {err:.3g} u {over}" if err is not None
            else f"no entry has a finite error ({over})")
    return text + (f"; {_count(zeros, 'more output is', 'more outputs are')} exactly 0, "
                   "as is each of their product terms" if zeros else "")


def _why(call: list[str] | None, full: list[str]) -> str:
    """Why a slice's sums differ, from its call's kernels and the full product's. Names count
    once: the list of slice calls that agree is merged (routes.merged), every name once."""
    extra = [k for k in call or () if k not in full]
    missing = [k for k in unique(full) if call and k not in call]
    if extra:
        return f"a different kernel ran ({'; '.join(extra)})"
    if missing:
        return f"a different set of kernels ran ({'; '.join(missing)} did not run)"
    if call and unique(call) != unique(full):
        return "a different kernel ran (another order of the same kernels)"
    return "the same kernels ran, so the library summed in another order for this shape"


def _drift_text(r: dict, moved: list) -> str:
    """The worst drift in words: max_u and the share of entries first, one ulp count after."""
    if not moved:
        return "no drift between slices or repeats"
    name, row = max(moved, key=lambda x: _worst(x[1]))
    text = (f"{name} {_where(name, row)} moves {_pct(row['frac_differ'])} of entries "
            f"by up to {_fmt(row['max_u'])} u")
    text += f" (at most {row['max_ulp']} ulp apart"
    if row["sign_changes"]:
        text += (f"; {row['sign_changes']} entries change sign, "
                 "so that count spans zero and says nothing of size")
    return text + ")"


def _count(n: int, one: str, many: str) -> str:
    """'1 entry has' or '3 entries have': a count with its words in the right number."""
    return f"{n} {one if n == 1 else many}"


def _outputs(n: int) -> str:
    return _count(n, "output is", "outputs are")


def _fmt(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _seconds(s: dict | None) -> str:
    if not s:
        return "not timed"
    text = (f"median {s['median']:.4g} s, IQR {s['iqr']:.3g} s over {s['runs']} runs of "
            f"{s['calls_per_run']} "
            f"calls, {s['threads']} threads")
    if s.get("quantiles"):
        text += ", quantiles 0.2/0.5/0.8 " + "/".join(f"{q:.4g}" for q in s["quantiles"]) + " s"
    clock = s.get("clocks") or {}
    if clock.get("fell"):
        text += f" — CLOCKS FELL ({clock['why']})"
    return text + (" — NOISY (IQR/median > 0.1)" if s["noisy"] else "")


def render(r: dict) -> str:
    """Tables, the legend and the verdict as plain text."""
    s = r["shape"]
    shape = f"{s['batch']}×" if s["batch"] else ""
    shape += f"{s['m']}×{s['k']} @ {s['k']}×{s['n']}"
    cover = r["error_entries"]
    head = [
        ["case", r["case"]], ["shape", shape], ["dtype", r["dtype"]], ["device", r["device"]],
        ["error_u (u)", f"{_fmt(r['error_u'])} over {cover['entries']} of {cover['of']} entries"
                        + (f"; {cover['exact_zeros']} more exactly 0"
                           if cover.get("exact_zeros") else "")],
        [f"{numerics.bound_name(r['dtype'])} bound (u)",
         _fmt(r["gamma_k_u"]) if r["gamma_k_u"] else "none (K·u ≥ 1)"],
        ["reference",
         f"{r['reference']['method']}, error ≤ {r['reference']['error_bound_u']:.2g} u"],
        ["run-to-run",
         f"{_fmt(r['run_to_run']['max_u'])} u over {r['run_to_run']['repeat']} calls"],
        ["seconds per product", _seconds(r["seconds"])],
        ["input checksum", r["input_checksum"][:16]],
        ["kernel-id", r["kernel_id"]], ["env-id", r["env_id"]],
    ]
    bits = r.get("bits") or {}  # none in a report saved before outputs were hashed
    if bits:
        head.append(["bits-id", f"{r['bits_id']} (full product's sha256 {bits['full'][:12]})"])
    if r.get("layout"):
        head.insert(4, ["layout", ", ".join(f"{k} strides {v['strides']}"
                                            for k, v in r["layout"].items()
                                            if isinstance(v, dict))])
    nf = r["nonfinite"]
    if any(nf.values()):
        head.insert(5, ["non-finite", ", ".join(f"{k} {v}" for k, v in nf.items())])
    rows = []
    for row in r["slices"]["n"]:
        digest = bits.get(bits_part("slice_n", row["n"], row.get("form", "as-is")), "")[:12]
        rows.append(["slice_n", row["n"], row.get("form", ""), row.get("cols", row["n"]),
                     *_drift_cells(row), digest])
    for row in r["slices"]["m"]:
        digest = bits.get(bits_part("slice_m", row["m"]), "")[:12]
        rows.append(["slice_m", row["m"], "", "", *_drift_cells(row), digest])
    parts = [tabulate(head, tablefmt="simple")]
    if rows:
        headers = ["drift", "n/m", "A form", "cols", "max_u", "entries differ", "max ulp",
                   "sign changes", "non-finite", "max |diff|", "ulp there", "sha256"]
        parts.append(tabulate(rows, headers=headers))
    parts += [_pair_text(p) for p in r.get("slice_pairs") or []]
    kern = [[name, "\n".join(names)] for name, names in r["kernels"].items() if names]
    parts.append(tabulate(kern, headers=["product", "kernels (normalised)"]))
    u = numerics.unit_roundoff(r["dtype"].split("-", 1)[0])
    legend = LEGEND + ((TF32_LEGEND,) if r["dtype"] in numerics.TF32 else ())
    parts.append("\n".join(line.format(u=f"2^{round(math.log2(u))} = {u:.3g}") for line in legend))
    parts.append(r["verdict"]["text"])
    return "\n\n".join(parts)


def _pair_text(p: dict) -> str:
    """Two slices' products compared with each other (the seed's question), or one with the full
    product ("b": "full"): how many entries differ, and by how much in each magnitude band, with
    the ulp there."""
    form = " (A 2-D)" if p["form"] == "2d" else ""
    other = "the full product" if p["b"] == "full" else f"[:, :{p['b']}]"
    head = (f"[:, :{p['a']}] against {other}{form} on the first {p['cols']} columns: "
            f"{p['differ']} of {p['entries']} entries differ")
    if p["nonfinite_differ"]:
        head += f" ({p['nonfinite_differ']} finite on one side only)"
    if not p["bands"]:
        return head + "."
    rows = [[f"[{_fmt(b['lo'])}, {_fmt(b['hi'])})", _fmt(b["ulp"]), b["differ"],
             _fmt(b["max_abs"]), b["max_ulp"]]
            for b in p["bands"]]
    low = p["bands"][0]["lo"]
    tail = (f"No entry below {_fmt(low)} differs ({p['below']} entries there)." if p.get("below")
            else f"Every entry compared is at least {_fmt(low)} in magnitude.")
    return "\n".join([head + "; by magnitude |y|:",
                      tabulate(rows, headers=["|y| in", "ulp there", "entries differ",
                                              "largest |difference|",
                                              "in ulps"]), tail])


def _drift_cells(row: dict) -> list:
    return [_fmt(row["max_u"]), f"{row['frac_differ']:.4%}", row["max_ulp"], row["sign_changes"],
            row["nonfinite_differ"], _fmt(row["max_abs"]), _fmt(row["ulp_at_max"])]


@dataclass
class Request:
    """One explain: exactly one of ``case``, ``m``/``k``/``n`` or the files ``a``/``b``; sizes
    are counts, ``fix_timeout`` and ``fix_budget`` seconds."""

    dtype: str
    device: str = "cpu"
    case: str | None = None
    m: int | None = None
    k: int | None = None
    n: int | None = None
    a: Path | None = None
    b: Path | None = None
    slice_n: int | None = None
    slice_m: int | None = None
    repeat: int | None = None
    keep_layout: bool = True  # --a/--b: the strides they were saved with, else contiguous copies
    try_fixes: bool = False
    fix_timeout: int | None = None
    fix_budget: int | None = None
    orders: bool = False
    host_check: bool = True


def render_all(r: dict) -> str:
    """The text of a report: the measurement, then the fixes and the orders where it holds them."""
    text = render(r) + ("\n" + fixfind.render(r["fixes"]) if r.get("fixes") else "")
    return text + "\n" + render_orders(r["orders"]) if r.get("orders") else text


def read_saved(path: Path) -> tuple[str, bool]:
    """(the text, whether its verdict is a defect) of an explain report saved with --json;
    UsageError (one line) for a file that cannot be read or is no such report."""
    try:
        r = json.loads(bounded.read_bytes(path), parse_constant=ids.no_constant)
        return render_all(r), r["verdict"]["kind"] == "defect"
    except (OSError, bounded.Refused) as exc:
        raise BadValue("render", str(path), f"cannot read it: {exc}", colon=True) from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
            ArithmeticError) as exc:
        raise BadValue("render", str(path), "not an explain report saved with --json "
                       f"({type(exc).__name__}: {exc})", colon=True) from None


def render_orders(o: dict) -> str:
    full = o["full"]
    lines = [f"order of entry (0, 0): full product {full['order_id'] or 'not revealed'}"
             + (f": {full['summary']}" if full.get("summary") else f" ({full.get('reason')})")]
    for s in o["slices"]:
        where = f"[:, :{s['size']}]" if s["slice"] == "n" else f"[:{s['size']}]"
        where += " (A 2-D)" if s.get("form") == "2d" else ""
        lines.append(f"  slice {where}: {s['order_id'] or 'not revealed'}; {s['verdict']}")
    return "\n".join(lines)


def stopped_line(fixes: dict) -> str:
    """What a stopped --try-fixes kept, in one line."""
    rows = [r for r in fixes["candidates"] if r["verdict"] != "not applicable"]
    kept = [r for r in rows if r["verdict"] != "not tried"]
    what = (f"no candidate ({fixes['failed']})" if "failed" in fixes
            else f"{len(kept)} of {len(rows)} candidates measured; the rest say \"not tried\"")
    return f"stopped by {fixes['stopped']} while trying fixes; printed the measurement and {what}"
