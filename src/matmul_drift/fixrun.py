"""One candidate of the fix finder, measured in the fresh process it runs in.

The parent (fixfind.py) starts ``python -c "<the candidate's prelude>; from
matmul_drift.fixrun import main; main()" SPEC`` with the candidate's environment, so the
setting is in force from library load on. SPEC (JSON) names the case (a catalog id or
m/k/n), dtype, device, the slices, the repeat count and the code changes to measure
(``codes``: None for the computation as it is, "contiguous", "full", "pad:<dim>:<multiple>").
Printed, one JSON line, {code: result}; a result holds, for each drift kind, the drift of the computation under the candidate against the full product under
the same setting (max_ulp in output ulps, max_u in u, frac_differ a fraction); error_u of
the full product (u); the route of the sliced computation; and its seconds per call.
"""

from __future__ import annotations

import json
import math
import sys

from . import cases, kernels, measure, numerics


def _case(spec: dict):
    if spec.get("case"):
        return cases.get(spec["case"])
    return cases.adhoc(spec["m"], spec["k"], spec["n"])


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


def computations(ops, spec: dict) -> dict:
    """{drift kind: (callable giving the compared output, the cut of the full product)}."""
    code, n, m = spec.get("code"), spec.get("slice_n"), spec.get("slice_m")
    out = {}
    if n:
        cut = (Ellipsis, slice(0, n))
        if code == "full":
            out["slice_n"] = (lambda: ops.product()[..., :n], cut)
        elif code == "contiguous":
            out["slice_n"] = (lambda: ops.product(ops.a, ops.b_cols(n).contiguous()), cut)
        elif code and code.startswith("pad:n:"):
            k = int(code.split(":")[2])
            out["slice_n"] = (lambda: ops.product(ops.a, _pad(ops.b_cols(n), -1, k))[..., :n], cut)
        else:
            out["slice_n"] = (lambda: ops.product(ops.a, ops.b_cols(n)), cut)
    if m:
        cut = (Ellipsis, slice(0, m), slice(None))
        a_m = ops.a[..., :m, :]
        if code == "full":
            out["slice_m"] = (lambda: ops.product()[..., :m, :], cut)
        elif code and code.startswith("pad:m:"):
            k = int(code.split(":")[2])
            out["slice_m"] = (lambda: ops.product(_pad(a_m, -2, k))[..., :m, :], cut)
        else:
            out["slice_m"] = (lambda: ops.product(a_m), cut)
    return out


def run(spec: dict) -> dict:
    """{code: result} for each code change in ``spec["codes"]`` (None: the computation as it
    is), all in this process: they share its setting, its inputs and its full product."""
    case = _case(spec)
    precision, device = spec["dtype"], spec["device"]
    dtype = cases.storage_dtype(precision)
    a_bits, b_bits, _ = measure.operand_bits(case, dtype, device)
    ops = measure.make_operands(a_bits, b_bits, dtype, device, case)
    k = int(ops.a.shape[-1])
    runs = {}
    with measure.precision_flags(precision):
        top = measure.top_product(ops)
        err = numerics.error(top.values, top.ref.hi, top.ref.lo, top.ref.finite, top.ref.absprod, dtype, k)
        worst = measure.repeat_drift(ops, top.bits, top.values, top.ref.absprod, dtype, k, spec.get("repeat", 3))
        worst = {key: worst[key] for key in ("max_ulp", "max_u", "frac_differ")}
        for code in spec.get("codes", [None]):
            out: dict = {"drift": {}, "kernels": {}, "error_u": err["error_u"]}
            timed = None
            for kind, (call, cut) in computations(ops, {**spec, "code": code}).items():
                y, names = kernels.traced(call, device)
                d = measure._compare(top.bits, top.values, y, top.ref.absprod, dtype, cut, k)
                out["drift"][kind] = {key: d[key] for key in ("max_ulp", "max_u", "frac_differ")}
                out["kernels"][kind] = kernels.unique(names)
                timed = timed or call
            out["drift"]["run_to_run"] = worst
            out["seconds"] = measure.time_call(timed or ops.product, device)
            runs[str(code)] = out
    return runs


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> None:
    spec = json.loads((argv or sys.argv[1:])[0])
    print(json.dumps(_clean(run(spec)), allow_nan=False))
