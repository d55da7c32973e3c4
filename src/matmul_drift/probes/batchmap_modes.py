"""`matmul-drift map --modes`: the map again under each path that claims to be deterministic
or batch-invariant, with its time against the default's.

The paths are the fix finder's settings (probes/fixes.py CANDIDATES, code changes left out):
torch's deterministic algorithms, the cuBLAS workspace setting, the split-K switch,
batch_invariant_ops, and on the CPU one thread and MKL's reproducibility modes. Each runs in a
fresh process with its setting in force from library load on (fixfind's ``_child``), the
default too, so that all are measured alike: that process maps M as `matmul-drift map` does
and times the full product (measure.time_call, seconds per call). A path this machine cannot
take is listed with the reason, never left out. The times come from separate processes, not
paired: the default is timed before the paths and again after them, and where its two times
part by more than STABLE (the machine's load changed) no ratio is given.
"""

from __future__ import annotations

import json
import sys

from matmul_drift.core.cases import storage_dtype
from matmul_drift.measure import measure
from matmul_drift.probes import batchmap, batchmap_run, fixes, fixfind

TIMEOUT_S = 600  # one path's process
STABLE = 1.25  # the most the default's two times may part for a ratio to be given


def _valid(got) -> bool:
    """One process's answer: {"failed": why}, or a complete map record with its product's time."""
    if not isinstance(got, dict):
        return False
    if set(got) == {"failed"}:
        return isinstance(got["failed"], str)
    return isinstance(got.get("record"), dict) and isinstance(got.get("seconds"), dict)


def paths(device: str, precision: str) -> list[tuple[fixes.Candidate, str | None]]:
    """Every setting of the fix finder with None where it applies to a map on ``device`` in
    ``precision``, or the one-line reason it does not."""
    isa = fixes.onednn_isa_in_force() if device == "cpu" else None
    return [(c, why) for c, why in fixes.candidates(device, {"slice_m"}, "m", isa, precision)
            if not c.changes_code]


def run_modes(spec: dict, stopped: list[int] = ()) -> dict:
    """The default and every path of ``paths`` for the map ``spec`` (case, k, n, range as
    [lo, hi] or None, precision, device, host_memory_check): ``default`` ({"record", "seconds"}
    or {"failed"}) and ``modes``, one row per path: ``name``, ``env``, and ``why`` (unavailable),
    ``failed``, or ``record`` and ``seconds`` with ``time_ratio`` (its median over the mean of
    the default's two, where those agree within STABLE)."""
    def child(c):
        return fixfind._child([spec], c, TIMEOUT_S, stopped, entry=__name__, valid=_valid)[0]

    default = child(None)
    rows = []
    for c, why in paths(spec["device"], spec["precision"]):
        rows.append({"name": c.name, "env": c.env, **({"why": why} if why else child(c))})
    after = child(None) if "record" in default else {}
    if "record" in after:  # the default timed again: has the machine's load changed meanwhile?
        times = sorted((default["seconds"]["median"], after["seconds"]["median"]))
        default["seconds_after"] = after["seconds"]
        default["stable"] = times[1] <= STABLE * times[0]
        for r in rows:
            if "record" in r and default["stable"]:
                r["time_ratio"] = r["seconds"]["median"] / (sum(times) / 2)
    return {"default": default, "modes": rows}


def words(result: dict) -> str:
    """The paths in words: each one's map where it ran, its time against the default's, or why
    not."""
    lines = ["paths that claim to be deterministic or batch-invariant "
             "(each in a fresh process; times unpaired):"]
    d = result["default"]
    if "record" in d:
        again = (f"; again after the paths {_seconds(d['seconds_after'])}"
                 if "seconds_after" in d else "")
        unstable = "" if d.get("stable", True) else " (the load changed: no ratios)"
        lines.append(f"  default: full product {_seconds(d['seconds'])}{again}{unstable}")
    else:
        lines.append(f"  default: failed: {d.get('failed') or d.get('not_tried')}")
    for r in result["modes"]:
        if "why" in r:
            lines.append(f"  {r['name']}: not available here: {r['why']}")
        elif "record" not in r:
            lines.append(f"  {r['name']}: failed: {r.get('failed') or r.get('not_tried')}")
        else:
            same = ("the same map as the default"
                    if "record" in d and _same(r["record"], d["record"]) else "another map")
            ratio = f", {r['time_ratio']:.2f}x the default's time" if "time_ratio" in r else ""
            lines.append(f"  {r['name']}: {same}; full product {_seconds(r['seconds'])}{ratio}")
            lines += [f"    {w}" for w in r["record"]["words"].splitlines()[:2]]
    return "\n".join(lines)


def _same(a: dict, b: dict) -> bool:
    """Whether two records state the same invariance at every M (kernel-ids aside)."""
    strip = lambda rec: [(v["lo"], v["hi"], v["row0"], v["rows"]) for v in rec["verdicts"]]  # noqa: E731
    return strip(a) == strip(b)


def _seconds(s: dict) -> str:
    return f"{s['median'] * 1e3:.3g} ms a call (IQR {s['iqr'] * 1e3:.2g} ms)"


def main() -> None:
    """The fresh process's part: map ``sys.argv[1]``'s one spec, time its full product, print
    one JSON line [{"record", "seconds"}] or [{"failed": why}]."""
    (spec,) = json.loads(sys.argv[1])
    try:
        out = batchmap_run.run(spec["case"], spec["k"], spec["n"],
                               tuple(spec["range"]) if spec["range"] else None,
                               spec["precision"], spec["device"], None, resume=False,
                               host_memory_check=spec.get("host_memory_check", True))
        if out.record is None:
            raise RuntimeError(out.message)
        p = out.record["params"]
        s = batchmap.shape(spec["case"], spec["k"], spec["n"], (p["lo"], p["hi"]), spec["device"])
        dtype = storage_dtype(spec["precision"])
        a_bits, b_bits, _ = measure.operand_bits(s["case"], dtype, spec["device"])
        ops = measure.make_operands(a_bits, b_bits, dtype, spec["device"], s["case"])
        with measure.precision_flags(spec["precision"]):
            t = measure.time_call(ops.product, spec["device"])
        got = {"record": out.record,
               "seconds": {"median": t["median"], "iqr": t["iqr"], "runs": t["runs"]}}
    except Exception as exc:  # the parent reports it as this path's one line
        got = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps([got]))
