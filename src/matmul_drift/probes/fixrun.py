"""The fix finder's measurements, made in the fresh process one candidate runs in.

The parent (fixfind.py) starts ``python -c "<the candidate's prelude>; from
matmul_drift.probes.fixrun import main; main()" SPECS [FDS]`` with the candidate's environment, so
the setting is in force from library load on; FDS ("r,w"), for a setting's process, are the
pipes to serve(), the default computation's timer in a process of its own. SPECS (a JSON
list) holds one SPEC per case: the case (a catalog id, or m/k/n), dtype (a precision),
device, the slices (``slice_n``, ``slice_m``: lists of sizes), the repeat count, the code
changes to measure (``codes``: None for the computation as it is, "contiguous", "full",
"pad:<dim>:<multiple>") and ``lean``, the suite's mode: no exact reference (error_u None;
max_u against |A||B| of reference.abs_product_pow2), no kernel trace, and only
computations bit-identical in every kind (where ``drifts``, or the baseline's own drifts,
has one) timed, with fewer samples, besides code None where ``baseline`` is set;
``untimed``: nothing timed (a stored verdict confirmed: its drifts checked, its cost kept).
Printed, one JSON line, a list with {code: result} per SPEC (or {"failed": why} when that
SPEC raised); a result holds, for each drift kind, the worst drift over the slices of
the computation under the candidate against the full product under the same setting
(max_ulp in output ulps, max_u in u, frac_differ a fraction); error_u of the full
product (u); ``nonfinite``, the count of its NaN or ±inf entries; the routes (``kernels``:
``full``, the full product's under the setting, and each kind's names once, and
``"<kind> per call"``, one "n=8: name; name" line a call, where its slices' routes differ, as
measure/measure.py's); and its seconds per call of its
slices of the drifting kinds one after another, the full product once for "full" and
where no slice drifts (None where not timed), with ``time_ratio`` and ``spread`` (paired:
timed in rounds beside the default computation, so both see the same load).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import traceback

import numpy as np
import torch

from matmul_drift.core import cases, numerics
from matmul_drift.core.routes import merged
from matmul_drift.measure import kernels, measure, record, reference
from matmul_drift.probes.fixfind import drifting, sizes

KEYS = ("max_ulp", "max_u", "frac_differ")
ROUNDS, LEAN_ROUNDS = 5, 3  # default/candidate pairs of timings a time ratio is the median of


def _case(spec: dict):
    if spec.get("case"):
        return cases.get(spec["case"])
    return cases.adhoc(spec["m"], spec["k"], spec["n"])


def _pad(t, dim: int, multiple: int):
    """``t`` with zeros appended along ``dim`` (negative) up to a multiple of ``multiple``."""
    size = t.shape[dim]
    extra = -size % multiple
    if not extra:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=dim)


def computations(ops, case, spec: dict) -> list[tuple[str, str, object, tuple]]:
    """(drift kind, the slice's label as measure/measure.py writes it: "n=8", "n=8 2d", "m=1",
    callable giving the compared output, the cut of the full product) for every slice of
    ``spec`` under its code change ``spec["code"]``."""
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
            out.append(("slice_n", label,
                        (lambda call=call: call().squeeze(0)) if form == "2d" else call, cut))
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


def run(spec: dict, peer=None) -> dict:
    """{code: result} for each code change in ``spec["codes"]`` (None: the computation as it
    is), all in this process: they share its setting, its inputs and its full product.
    ``peer(spec, kinds)``: one timing of the default computation in a process under the
    default setting (asker), for code None outside the baseline's process; None: no ratio."""
    case, ops = operands(spec)
    precision, device = spec["dtype"], spec["device"]
    dtype = cases.storage_dtype(precision)
    k = int(ops.a.shape[-1])
    runs = {}
    with measure.precision_flags(precision):
        lean = bool(spec.get("lean"))
        # its kernels: a setting may move the full product too
        full: list[str] | None = None if lean else []
        if not lean:
            top = measure.top_product(ops, measure.traced_call(ops.product, device, full))
            bits, values = top.bits, top.values
            scaled, absexp = absprod = top.ref.absprod_pow2()
            error_u = numerics.error(values, top.ref.hi, top.ref.lo, top.ref.finite, scaled,
                                     dtype, k, precision=precision, absexp=absexp)["error_u"]
        else:
            # drift only: |A||B| from a float64 product (times 2^-e where it overflows)
            # scales max_u; no error_u
            bits, values = measure.on_host(ops.product())
            absprod = reference.abs_product_pow2(ops.product, ops.a, ops.b)
            error_u = None
        worst = measure.repeat_drift(ops, bits, values, absprod, dtype, k, spec.get("repeat", 3),
                                     precision)
        worst = {key: worst[key] for key in KEYS}
        # a setting that makes them NaN/inf fixes nothing
        nonfinite = int(np.count_nonzero(~np.isfinite(values)))
        for code in spec.get("codes", [None]):
            out: dict = {"drift": {}, "kernels": {} if lean else {"full": full}, "error_u": error_u,
                         "nonfinite": nonfinite, "seconds": None}
            routes: dict[str, list] = {}  # kind: [(slice label, its kernels)], one per call
            for kind, label, call, cut in computations(ops, case, {**spec, "code": code}):
                y, names = (call(), []) if lean else kernels.traced(call, device)
                y_host = measure.on_host(y)
                d = measure.compare(bits, values, y_host, absprod, dtype, cut, k, precision)
                out["drift"][kind] = _worse(d, out["drift"].get(kind))
                routes.setdefault(kind, []).append((label, names))
            # each call's own route where they differ, as explain's
            for kind, per_call in routes.items():
                out["kernels"].update(merged(kind, per_call))
            out["drift"]["run_to_run"] = worst
            runs[str(code)] = out
        if spec.get("untimed"):
            return runs
        kinds = set(spec.get("drifts") or drifting(runs.get("None", {"drift": {}})))
        # the suite's time is a rough guide
        quick = {"min_runs": 3, "min_seconds": 0.05} if lean else {}
        default = timed_calls(ops, case, spec, None, kinds)
        for code, out in runs.items():
            if (not lean or (code == "None" and spec.get("baseline"))
                    or (kinds and not drifting(out))):
                if code == "None" and spec.get("baseline"):  # the baseline's own row
                    out["seconds"] = measure.time_call(lambda: [c() for c in default], device,
                                                       **quick)
                    continue
                # Beside the default, round by round: in this process for a code change; for a
                # setting (process-wide) from ``peer``, a process under the default setting.
                base = ((lambda: _round(default, device)["median"]) if code != "None"
                        else (lambda: peer(spec, kinds)) if peer else (lambda: None))
                todo = timed_calls(ops, case, spec, None if code == "None" else code, kinds)
                out.update(paired(todo, base, device, LEAN_ROUNDS if lean else ROUNDS))
    return runs


def timed_calls(ops, case, spec: dict, code: str | None, kinds: set[str]) -> list:
    """What is timed for ``code``: the computations of the slices of the drifting ``kinds``,
    one after another (a slice that does not drift is no part of what a fix replaces); the
    full product once for "full", and where no slice drifts (repeats alone, or nothing)."""
    todo = [call for kind, _, call, _ in computations(ops, case, {**spec, "code": code})
            if kind in kinds]
    return [ops.product] if code == "full" or not todo else todo


def _round(todo: list, device: str) -> dict:
    """One short timing of ``todo`` one after another (time_call's dict, seconds per call):
    a warm-up call, then blocks of calls of about 1 ms, 5 ms in all or one call (CUDA:
    time_call's events). Short, so that the two timings of a pair see the same load."""
    return measure.time_call(lambda: [c() for c in todo], device, min_runs=1, min_seconds=0.005,
                             block_seconds=0.001)


def paired(todo: list, base, device: str, rounds: int) -> dict:
    """``seconds`` of ``todo`` (time_call's dict, from ``rounds`` short timings) with
    ``time_ratio`` (its seconds per call over the default's: the median over the rounds of
    the ratio of two timings taken one right after the other, the default's first in every
    other round, so load that comes and goes falls on both) and ``spread`` (the IQR of those
    ratios over their median, a fraction); both None where ``base`` (one timing of the
    default computation, seconds per call) gives None."""
    mine, ratios = [], []
    for i in range(rounds):
        b = base() if i % 2 == 0 else None
        mine.append(_round(todo, device))
        b = base() if i % 2 else b
        ratios.append(mine[-1]["median"] / b if b else None)
    last = mine[-1]
    out = {"seconds": record.spread([t["median"] for t in mine], last["calls_per_run"],
                                     last["threads"],
                                     last["method"] + ", in rounds alternating with the default's"),
           "time_ratio": None, "spread": None}
    if None not in ratios:
        q = np.quantile(ratios, [0.25, 0.5, 0.75])
        # a median of 0 (calls below the timer's resolution) has no relative spread
        out.update(time_ratio=float(q[1]), spread=float((q[2] - q[0]) / q[1]) if q[1] > 0 else None)
    return out


def operands(spec: dict):
    """(case, measure.Operands) of ``spec`` on its device."""
    case = _case(spec)
    dtype = cases.storage_dtype(spec["dtype"])
    measure.check_device(spec["device"], spec["dtype"])
    a_bits, b_bits, _ = measure.operand_bits(case, dtype, spec["device"], with_checksum=False)
    return case, measure.make_operands(a_bits, b_bits, dtype, spec["device"], case)


def default_round(spec: dict, kinds: set[str], held: dict) -> float:
    """Seconds per call of one short timing of ``spec``'s computation as it is (its slices
    of ``kinds``, as timed_calls), in this process; ``held`` keeps the last spec's operands."""
    key = json.dumps(spec, sort_keys=True)
    if held.get("key") != key:
        held.clear()  # one spec's operands at a time
        held.update(key=key, ops=operands(spec))
    case, ops = held["ops"]
    with measure.precision_flags(spec["dtype"]):
        return _round(timed_calls(ops, case, spec, None, kinds), spec["device"])["median"]


def serve(fds: str) -> None:
    """The default computation's timer for the settings' processes: reads requests (JSON
    lines: ``tag``, ``spec``, ``kinds``) from fd ``r`` of ``fds`` ("r,w") until it ends and
    answers each on fd ``w`` with its ``tag`` and ``seconds`` (default_round; None when it
    raised). Runs in a process under the default setting, started by fixfind.py."""
    r, w = map(int, fds.split(","))
    held: dict = {}
    for line in os.fdopen(r):
        try:
            req = json.loads(line)
            tag = req["tag"]
        except (ValueError, KeyError, TypeError):  # cut short by a killed writer
            continue
        try:
            seconds = default_round(req["spec"], set(req["kinds"]), held)
        except Exception:  # this request's case cannot run: its ratio is None, the others stand
            seconds = None
        os.write(w, (json.dumps({"tag": tag, "seconds": seconds}) + "\n").encode())


def asker(fds: str):
    """peer(spec, kinds) for run(): one timing of the default computation from serve() at the
    pipe fds ``fds`` ("r,w"), seconds per call, or None when it cannot answer."""
    r, w = map(int, fds.split(","))
    replies, count = os.fdopen(r), itertools.count()

    def ask(spec: dict, kinds: set[str]) -> float | None:
        tag = f"{os.getpid()}.{next(count)}"
        try:
            os.write(w, (json.dumps({"tag": tag, "spec": spec, "kinds": sorted(kinds)})
                         + "\n").encode())
            # one to a request of a process killed before it read it may come first
            for line in replies:
                got = json.loads(line)
                if got.get("tag") == tag:
                    return got["seconds"]
        except (OSError, ValueError, KeyError, AttributeError):
            pass
        return None

    return ask


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _run_or_fail(spec: dict, peer) -> dict:
    try:
        return run(spec, peer)
    except Exception as exc:  # one case that cannot run must not lose the others
        return {"failed": "".join(traceback.format_exception_only(exc)).strip()[:300]}


def main(argv: list[str] | None = None) -> None:
    argv = argv or sys.argv[1:]
    peer = asker(argv[1]) if len(argv) > 1 else None  # fds of the default's timer (fixfind.py)
    print(json.dumps(_clean([_run_or_fail(s, peer) for s in json.loads(argv[0])]), allow_nan=False))
