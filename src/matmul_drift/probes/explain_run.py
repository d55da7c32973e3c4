"""`matmul-drift explain`'s measuring side: ``prepare`` checks a Request (probes/explain.py)
before anything is measured, ``explain`` measures it, with the fixes and orders asked for, and
returns its report (explain.report).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from matmul_drift.core import cases
from matmul_drift.core.errors import BadValue, UsageError
from matmul_drift.measure import files, inputs, memory
from matmul_drift.measure.measure import (Operands, check_device, measure, measure_operands,
                                          restride, restride_elements, tensor_bits)
from matmul_drift.measure.record import Unavailable
from matmul_drift.probes import fixes, fixfind, interrupt, order, order_plan
from matmul_drift.probes.explain import Request, report


@dataclass
class _Ready:
    case: cases.Case
    slice_n: tuple | None
    slice_m: tuple | None
    operands: tuple | None = None  # (Operands, checksum, rounding) from files


def prepare(req: Request) -> _Ready:
    """Everything checked before a value is measured or a file's values read: the case, its
    slices, the device, the memory, the order probe's range. UsageError (one line) otherwise."""
    files = req.a is not None
    try:
        case = cases.get(req.case) if req.case is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if req.m is not None:
        case = cases.adhoc(req.m, req.k, req.n)
    # before the device: a slice the case lacks says so on a machine without the GPU too
    if not files:
        cases.check_slices(case, case.shape(req.device), req.slice_n, req.slice_m)
    try:
        check_device(req.device, req.dtype)
    except Unavailable as exc:
        raise UsageError(str(exc)) from None
    operands = None
    if files:
        case, *operands = _file_case(req)  # memory checked there, before the files are read
        cases.check_slices(case, case.shape(req.device), req.slice_n, req.slice_m)
    shape = case.shape(req.device)
    if not files:
        _check_memory(req, shape)
    if req.orders:  # before measuring, not after: K = 1, or beyond the probe's exact range
        try:
            order_plan.target(case, req.dtype, req.device)
        except order_plan.ProbeError as exc:
            raise BadValue("orders", None, str(exc), colon=True) from None
    slice_n = (req.slice_n,) if req.slice_n else None
    slice_m = (req.slice_m,) if req.slice_m else None
    if req.m is not None and slice_n is None:
        slice_n = (max(1, shape.n - 1),)  # one column fewer: the seed's question
    if req.m is not None and slice_m is None and shape.m > 1:
        slice_m = (1,)
    return _Ready(case, slice_n, slice_m, operands)


def explain(req: Request, ready: _Ready, fix_bar=None) -> dict:
    """The report (``report``) of one measurement, with the fixes tried (``fixes``) and the
    orders revealed (``orders``) where asked for. ``fix_bar(desc, unit)``: a context manager
    whose ``update(what, done, total)`` shows the fixes' progress."""
    case, slice_n, slice_m = ready.case, ready.slice_n, ready.slice_m
    if ready.operands:
        ops, checksum, rounding = ready.operands
        m = measure_operands(
            ops, case=case, precision=req.dtype, device=req.device, checksum=checksum,
            slice_n=slice_n or (), slice_m=slice_m or (), repeat=req.repeat or 3,
        )
    else:
        m = measure(case, req.dtype, req.device, slice_n=slice_n, slice_m=slice_m,
                    repeat=req.repeat)
    r = report(m, req.slice_n, req.slice_m, layout=m.layout,
               rounding=rounding if ready.operands else None)
    if req.try_fixes:
        r["fixes"] = _try_fixes(req, case, slice_n, slice_m, fix_bar)
    # a signal while trying fixes: the report so far, at once
    stopped = r.get("fixes", {}).get("stopped")
    if req.orders and not stopped:
        slices = [("n", s["n"], bool(s["max_ulp"] or s["frac_differ"]), s["form"])
                  for s in m.slice_n]
        slices += [("m", s["m"], bool(s["max_ulp"] or s["frac_differ"]), "as-is")
                   for s in m.slice_m]
        r["orders"] = order.slice_orders(case, req.dtype, req.device, slices)
    return r


def _file_case(req: Request):
    """Operands from --a/--b, rounded to --dtype with their layout kept (or made contiguous),
    and an ad-hoc case describing them."""
    a, b = (files.load_array(p, req.host_check) for p in (req.a, req.b))
    if a.dim() not in (1, 2) or b.dim() != 2:
        raise UsageError(f"A must be (M, K) or (K,) and B (K, N); "
                         f"got A {tuple(a.shape)} and B {tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise UsageError(f"shapes do not match: A {tuple(a.shape)} @ B {tuple(b.shape)} "
                         f"(K {a.shape[-1]} != {b.shape[0]})")
    m = 1 if a.dim() == 1 else a.shape[0]
    empty = [f"{d} = 0" for d, v in (("M", m), ("K", b.shape[0]), ("N", b.shape[1])) if v == 0]
    if empty:
        raise UsageError(f"A {tuple(a.shape)} @ B {tuple(b.shape)} is empty "
                         f"({', '.join(empty)}): nothing to measure"
                         + (" (with K = 0 every output is exactly 0)"
                            if "K = 0" in empty and len(empty) == 1 else ""))
    dt = getattr(torch, cases.storage_dtype(req.dtype))
    for path, t in ((req.a, a), (req.b, b)):
        try:  # one entry: float4_e2m1fn_x2 is a floating-point dtype that torch converts to nothing
            t[(0,) * t.dim()].to(dt)
        except (RuntimeError, NotImplementedError):
            raise UsageError(f"{path}: torch cannot convert {t.dtype} to {req.dtype}") from None
    shape = cases.Shape(m, b.shape[0], b.shape[1])
    case = cases.Case(
        f"files:{files.text_name(req.a)}@{files.text_name(req.b)}",
        "mv" if a.dim() == 1 else "mm", shape, shape, layout="strided",
        forms=("as-is", "2d") if a.dim() == 1 else ("as-is",),
    )
    keep = req.keep_layout
    # offsets and strides kept
    gaps = sum((restride_elements(t, keep) or t.numel()) - t.numel() for t in (a, b))
    _check_memory(req, shape, gaps * dt.itemsize)  # before the files' values are read
    a_t, b_t = (restride(t, dt, req.device, keep) for t in (a, b))
    rounding = {"a": files.rounded_away(a, a_t), "b": files.rounded_away(b, b_t)}
    return (case, Operands(a_t, b_t, case.op, case.layout),
            inputs.checksum(tensor_bits(a_t), tensor_bits(b_t)), rounding)


def _check_memory(req: Request, shape: cases.Shape, extra: int = 0) -> None:
    """UsageError (one line) when measuring the product, and ``extra`` bytes more on its
    device, needs more memory than there is."""
    batch = shape.batch or 1
    host, device = memory.bytes_needed(shape.m, shape.k, shape.n, cases.storage_dtype(req.dtype),
                                       req.device, batch,
                                       fixes=req.try_fixes)
    need = (host, device + extra) if req.device == "cuda" else (host + extra, device)
    what = (f"the product, {'' if batch == 1 else f'batch={batch} '}"
            f"m={shape.m} k={shape.k} n={shape.n} in {req.dtype}"
            f"{' with --try-fixes' * req.try_fixes},")
    try:
        memory.check(need, what, req.device, req.host_check)
    except memory.TooLarge as exc:
        raise UsageError(str(exc)) from None


def _try_fixes(req: Request, case: cases.Case, slice_n, slice_m, fix_bar) -> dict:
    spec = {"case": req.case} if req.case is not None else {"m": req.m, "k": req.k, "n": req.n}
    spec.update(dtype=req.dtype, device=req.device, repeat=req.repeat or 3,
                slice_n=list(slice_n or case.slice_n), slice_m=list(slice_m or case.slice_m))
    isa = fixes.onednn_isa_in_force() if req.device == "cpu" else None
    # the measurement's blocks, cached by torch, back to the GPU for the candidates' processes
    if req.device == "cuda":
        torch.cuda.empty_cache()
    # SIGINT or SIGTERM (`timeout` sends its command two: to it, then to its group) ends the
    # process in hand and starts none: the report so far is printed, not lost with the process.
    with ((fix_bar or _NoBar)("try-fixes", "process") as bar,
          interrupt.deferred([], escalate=False) as stopped):
        report = fixfind.try_fixes_many([spec], isa, timeout=req.fix_timeout or fixfind.TIMEOUT_S,
                                        progress=bar.update, budget=req.fix_budget,
                                        stopped=stopped)[0]
    return json.loads(json.dumps(report, allow_nan=False))


class _NoBar:
    """No progress shown."""

    def __init__(self, *_):
        pass

    def update(self, *_) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass
