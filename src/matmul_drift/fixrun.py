"""The fix finder's measurements, made in the fresh process one candidate runs in.

The parent (fixfind.py) starts ``python -c "<the candidate's prelude>; from
matmul_drift.fixrun import main; main()" SPECS`` with the candidate's environment, so the
setting is in force from library load on. SPECS (a JSON list) holds one SPEC per case:
the case (a catalog id, or m/k/n), dtype (a precision), device, the slices (``slice_n``,
``slice_m``: lists of sizes), the repeat count, the code changes to measure (``codes``:
None for the computation as it is, "contiguous", "full", "pad:<dim>:<multiple>") and
``lean``, the suite's mode: no exact reference (error_u None), no kernel trace, and only
computations bit-identical in every kind (where ``drifts``, or the baseline's own drifts,
has one) timed, with fewer samples, besides code None where ``baseline`` is set.
Printed, one JSON line, a list with {code: result} per SPEC (or {"failed": why} when that
SPEC raised); a result holds, for each drift kind, the worst drift over the slices of
the computation under the candidate against the full product under the same setting
(max_ulp in output ulps, max_u in u, frac_differ a fraction); error_u of the full
product (u); ``nonfinite``, the count of its NaN or ±inf entries; the routes (``kernels``: ``full``, the
full product's under the setting, and each kind's names once, and
``"<kind> per call"``, one "n=8: name; name" line a call, where its slices' routes differ, as
measure.py's); and its seconds per call of its
slices of the drifting kinds one after another, the full product once for "full" and
where no slice drifts (None where not timed).
"""

from __future__ import annotations

import json
import math
import sys
import traceback

import numpy as np

from . import cases, kernels, measure, numerics

KEYS = ("max_ulp", "max_u", "frac_differ")


def _case(spec: dict):
    if spec.get("case"):
        return cases.get(spec["case"])
    return cases.adhoc(spec["m"], spec["k"], spec["n"])


def sizes(value) -> list[int]:
    """A slice given as None, one size or a list of sizes, as a list."""
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v]


def _pad(t, dim: int, multiple: int):
    """``t`` with zeros appended along ``dim`` (negative) up to a multiple of ``multiple``."""
    import torch

    size = t.shape[dim]
    extra = -size % multiple
    if not extra:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=dim)


def computations(ops, case, spec: dict) -> list[tuple[str, str, object, tuple]]:
    """(drift kind, the slice's label as measure.py writes it: "n=8", "n=8 2d", "m=1", callable
    giving the compared output, the cut of the full product) for every slice of ``spec``
    under its code change ``spec["code"]``."""
    code = spec.get("code")
    out = []
    for n in sizes(spec.get("slice_n")):
        cut = (Ellipsis, slice(0, min(n, case.compare_cols or n)))
        if code == "full":
            out.append(("slice_n", f"n={n}", lambda n=n: ops.product()[..., :n], cut))
            continue
        for form in case.forms:
            a = ops.a.unsqueeze(0) if form == "2d" else ops.a
            if code == "contiguous":
                call = lambda a=a, n=n: ops.product(a, ops.b_cols(n).contiguous())  # noqa: E731
            elif code and code.startswith("pad:n:"):
                k = int(code.split(":")[2])
                call = lambda a=a, n=n, k=k: ops.product(a, _pad(ops.b_cols(n), -1, k))[..., :n]  # noqa: E731
            else:
                call = lambda a=a, n=n: ops.product(a, ops.b_cols(n))  # noqa: E731
            label = f"n={n}" + (f" {form}" if len(case.forms) > 1 else "")
            out.append(("slice_n", label, (lambda call=call: call().squeeze(0)) if form == "2d" else call, cut))
    for m in sizes(spec.get("slice_m")):
        cut = (Ellipsis, slice(0, m), slice(None))
        a_m = ops.a[..., :m, :]
        if code == "full":
            call = lambda m=m: ops.product()[..., :m, :]  # noqa: E731
        elif code and code.startswith("pad:m:"):
            k = int(code.split(":")[2])
            call = lambda a_m=a_m, m=m, k=k: ops.product(_pad(a_m, -2, k))[..., :m, :]  # noqa: E731
        else:
            call = lambda a_m=a_m: ops.product(a_m)  # noqa: E731
        out.append(("slice_m", f"m={m}", call, cut))
    return out


def _worse(d: dict, old: dict | None) -> dict:
    new = {key: d[key] for key in KEYS}
    return new if old is None else {key: max(new[key], old[key]) for key in KEYS}


def drifting(result: dict) -> set[str]:
    """The drift kinds of ``result`` with any entry that differs."""
    return {k for k, d in result["drift"].items() if d["max_ulp"] or d["frac_differ"]}


def run(spec: dict) -> dict:
    """{code: result} for each code change in ``spec["codes"]`` (None: the computation as it
    is), all in this process: they share its setting, its inputs and its full product."""
    case = _case(spec)
    precision, device = spec["dtype"], spec["device"]
    dtype = cases.storage_dtype(precision)
    measure.check_device(device, precision)
    a_bits, b_bits, _ = measure.operand_bits(case, dtype, device, with_checksum=False)
    ops = measure.make_operands(a_bits, b_bits, dtype, device, case)
    del a_bits, b_bits
    k = int(ops.a.shape[-1])
    runs, calls = {}, {}
    with measure.precision_flags(precision):
        lean = bool(spec.get("lean"))
        full: list[str] | None = None if lean else []  # its kernels: a setting may move the full product too
        if not lean:
            top = measure.top_product(ops, measure._call(ops.product, device, full))
            bits, values, absprod = top.bits, top.values, top.ref.absprod
            error_u = numerics.error(values, top.ref.hi, top.ref.lo, top.ref.finite, absprod, dtype, k,
                                     precision=precision)["error_u"]
        else:  # drift only: |A||B| from a float64 product scales max_u; no exact reference, no error_u
            bits, values = measure._host(ops.product())
            absprod = ops.product(ops.a.abs().double(), ops.b.abs().double()).cpu().numpy()
            error_u = None
        worst = measure.repeat_drift(ops, bits, values, absprod, dtype, k, spec.get("repeat", 3), precision)
        worst = {key: worst[key] for key in KEYS}
        nonfinite = int(np.count_nonzero(~np.isfinite(values)))  # a setting that makes them NaN/inf fixes nothing
        for code in spec.get("codes", [None]):
            out: dict = {"drift": {}, "kernels": {} if lean else {"full": full}, "error_u": error_u,
                         "nonfinite": nonfinite, "seconds": None}
            routes: dict[str, list] = {}  # kind: [(slice label, its kernels)], one per call
            for kind, label, call, cut in computations(ops, case, {**spec, "code": code}):
                y, names = (call(), []) if lean else kernels.traced(call, device)
                d = measure._compare(bits, values, y, absprod, dtype, cut, k, precision)
                out["drift"][kind] = _worse(d, out["drift"].get(kind))
                routes.setdefault(kind, []).append((label, names))
                calls.setdefault(str(code), []).append((kind, call))
            for kind, per_call in routes.items():  # each call's own route where they differ, as explain's
                out["kernels"].update(kernels.merged(kind, per_call))
            out["drift"]["run_to_run"] = worst
            runs[str(code)] = out
        kinds = set(spec.get("drifts") or drifting(runs.get("None", {"drift": {}})))
        quick = {"min_runs": 3, "min_seconds": 0.05} if lean else {}  # the suite's time is a rough guide
        for code, out in runs.items():
            if not lean or (code == "None" and spec.get("baseline")) or (kinds and not drifting(out)):
                # Timed: the computations of the drifting slices, one after another (a slice that
                # does not drift is no part of what a fix replaces); the full product once for
                # "full", and where no slice drifts (repeats alone, or nothing).
                todo = [call for kind, call in calls.get(code, []) if kind in kinds]
                todo = [ops.product] if code == "full" or not todo else todo
                out["seconds"] = measure.time_call(lambda todo=todo: [c() for c in todo], device, **quick)
    return runs


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _run_or_fail(spec: dict) -> dict:
    try:
        return run(spec)
    except Exception as exc:  # one case that cannot run must not lose the others
        return {"failed": "".join(traceback.format_exception_only(exc)).strip()[:300]}


def main(argv: list[str] | None = None) -> None:
    specs = json.loads((argv or sys.argv[1:])[0])
    print(json.dumps(_clean([_run_or_fail(s) for s in specs]), allow_nan=False))
