"""The fix finder: every applicable candidate (fixes.py) measured in a fresh process of its
own (fixrun.py), against a baseline measured the same way, and a verdict for each.

Verdicts: "removes" when every drift the case has is gone, bit for bit, on every compared
entry (measured, not inferred); "reduces" when some drift is gone or smaller (max_u or the
share of entries); "no effect" otherwise; "not applicable" with the reason; "failed" when
the candidate's process crashed or timed out (the others still run). Times are seconds per
call of the compared computation; ``time_ratio`` is the candidate's over the baseline's,
``spread`` the two relative IQRs added.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from . import fixes

TIMEOUT_S = 600  # one candidate's process


def _child(spec: dict, c: fixes.Candidate | None, timeout: float, codes: list) -> dict:
    """{code: result} from one fresh process under candidate ``c``'s setting (None: none),
    or {"failed": why}."""
    prelude = fixes.prelude(c) if c else "import torch\n"
    code = prelude + "from matmul_drift.fixrun import main\nmain()\n"
    env = {**os.environ, **(c.env if c else {})}
    try:
        p = subprocess.run([sys.executable, "-c", code, json.dumps({**spec, "codes": codes})], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return {"failed": f"crashed (exit {p.returncode}): {lines[-1] if lines else ''}"[:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def drifting(result: dict) -> set[str]:
    """The drift kinds with any entry that differs."""
    return {k for k, d in result["drift"].items() if d["max_ulp"] or d["frac_differ"]}


def verdict(base: dict, got: dict) -> str:
    """removes / reduces / no effect, for the case's drifts ``drifting(base)``."""
    want = drifting(base)
    left = drifting(got) & want
    if not left:
        return "removes"
    smaller = any(got["drift"][k]["max_u"] < base["drift"][k]["max_u"]
                  or got["drift"][k]["frac_differ"] < base["drift"][k]["frac_differ"] for k in want)
    return "reduces" if len(left) < len(want) or smaller else "no effect"


def _timing(base: dict, got: dict) -> tuple[float | None, float | None]:
    b, g = base.get("seconds") or {}, got.get("seconds") or {}
    if not b.get("median") or not g.get("median"):
        return None, None
    return g["median"] / b["median"], b["iqr"] / b["median"] + g["iqr"] / g["median"]


def try_fixes(spec: dict, onednn_isa: str | None = None, timeout: float = TIMEOUT_S, progress=None) -> dict:
    """The fix finder's report for ``spec`` (fixrun.py's SPEC without ``code``)."""
    say = progress or (lambda msg: None)
    say("baseline, in a fresh process ...")
    first = _child(spec, None, timeout, [None])
    if "failed" in first:
        raise RuntimeError(f"the baseline {first['failed']}")
    base = first["None"]
    drifts = drifting(base)
    out = {"baseline": base, "drifts": sorted(drifts), "candidates": [], "cheapest": None}
    if not drifts:
        return out
    dims = [d for d, kind in (("n", "slice_n"), ("m", "slice_m")) if kind in drifts] or ["n"]
    seen, todo = set(), []
    for dim in dims:
        for c, why in fixes.candidates(spec["device"], drifts, dim, onednn_isa):
            if c.name not in seen:
                seen.add(c.name)
                todo.append((c, why))
    # Code changes share the default setting: one fresh process measures them all, beside
    # the computation as it is (their timing baseline). Each setting gets a process of its own.
    code_changes = [c for c, why in todo if not why and c.compute]
    if code_changes:
        say(f"{len(code_changes)} code changes, in one fresh process ...")
        shared = _child(spec, None, timeout, [None, *(c.compute for c in code_changes)])
        if "failed" not in shared:
            base = out["baseline"] = shared["None"]
    for i, (c, why) in enumerate(todo, 1):
        row = {"name": c.name, "code_change": c.code, "env": c.env, "setup": c.setup or None}
        if why:
            row.update(verdict="not applicable", reason=why)
            out["candidates"].append(row)
            continue
        if c.compute:
            got = shared.get(c.compute, shared) if "failed" not in shared else shared
        else:
            say(f"[{i}/{len(todo)}] {c.name} ...")
            got = _child(spec, c, timeout, [None])
            got = got.get("None", got)
        if "failed" in got:
            row.update(verdict="failed", reason=got["failed"])
        else:
            ratio, spread = _timing(base, got)
            row.update(verdict=verdict(base, got), drift=got["drift"], error_u=got.get("error_u"),
                       kernels=got.get("kernels"), seconds=got.get("seconds"), time_ratio=ratio, spread=spread)
        out["candidates"].append(row)
    removes = [r for r in out["candidates"] if r["verdict"] == "removes" and r.get("time_ratio") is not None]
    if removes:
        out["cheapest"] = min(removes, key=lambda r: r["time_ratio"])["name"]
    return out


def render(report: dict) -> str:
    """The table and the closing line."""
    from tabulate import tabulate

    if not report["drifts"]:
        return "matmul-drift explain --try-fixes: this case has no drift (slices and run-to-run are bit-identical): nothing to fix\n"
    rows = []
    for r in report["candidates"]:
        d = r.get("drift") or {}
        cells = [f"{k}: {d[k]['max_ulp']} ulp, {d[k]['frac_differ']:.1%}" for k in report["drifts"] if k in d]
        t = r.get("time_ratio")
        rows.append([r["name"] + (" (code change)" if r["code_change"] else ""), r["verdict"],
                     "; ".join(cells) or r.get("reason", ""),
                     "" if t is None else f"{t:.2f}x ± {r['spread']:.0%}",
                     "" if r.get("error_u") is None else f"{r['error_u']:.3g}"])
    base = report["baseline"]["drift"]
    head = "drifts before: " + "; ".join(f"{k}: {base[k]['max_ulp']} ulp, {base[k]['frac_differ']:.1%}"
                                         for k in report["drifts"])
    table = tabulate(rows, headers=["candidate", "verdict", "drift after (max ulp, share of entries)",
                                    "time vs default", "error_u"], tablefmt="simple", disable_numparse=True)
    if report["cheapest"]:
        c = next(r for r in report["candidates"] if r["name"] == report["cheapest"])
        last = (f"cheapest that removes every drift: {c['name']} ({c['time_ratio']:.2f}x the default's time)"
                + (f"; a code change: {c['code_change']}" if c["code_change"] else ""))
    else:
        last = "no candidate removes every drift of this case"
    return f"{head}\n\n{table}\n\n{last}\n"
