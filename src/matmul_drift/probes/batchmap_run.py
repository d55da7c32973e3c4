"""The map driver: check memory, draw the inputs, make the two anchor products, measure every M
the search asks for, keep the record (at most a second behind), resume it, and stop cleanly on
Ctrl-C or SIGTERM, as scan_run does for a scan.

The search and the record are batchmap.py's, one M's measurement measure/batchpoint.py's;
parsing and printing stay in cli/map.py. ``run`` returns scan_run's Outcome (plain data).
"""

from __future__ import annotations

import signal
import sys
import time

from matmul_drift.core import ids
from matmul_drift.core.cases import storage_dtype
from matmul_drift.measure import kernels, memory
from matmul_drift.probes import batchmap, interrupt, scan
from matmul_drift.probes.scan_run import SAVE_EVERY_S, Outcome


def check_memory(s: dict, dtype: str, device: str, host: bool = True) -> None:
    """MapError (one line) when the full product's operands and comparisons need more memory
    than there is, on the host (MemAvailable, unless not ``host``) or free on the GPU. The
    estimate is explain's for that shape (it holds an exact reference the map does not make:
    it errs high)."""
    need = memory.bytes_needed(s["m_full"], s["k"], s["n"], dtype, device, s["batch"] or 1)
    try:
        memory.check(need, f"the full product, m={s['m_full']} k={s['k']} n={s['n']} in {dtype},", device, host)
    except memory.TooLarge as exc:
        raise batchmap.MapError(str(exc)) from None


def run(case_id: str | None, k: int | None, n: int | None, rng: tuple[int, int] | None, precision: str,
        device: str, path: str | None, resume: bool, prog: str = "matmul-drift map",
        host_memory_check: bool = True) -> Outcome:
    """Map M over ``rng`` (None: the device's default) for ``--case case_id`` or the shape
    ``k`` x ``n``, in ``precision`` on ``device``. With ``path`` the record is written there
    once a second and at the end (``resume``: continued from it). MapError for bad input, and
    for a shape that needs more memory than there is (the host's only when ``host_memory_check``),
    all before anything is allocated."""
    from tqdm import tqdm

    from matmul_drift.measure import batchpoint, environment, measure

    try:
        batchpoint.check(device, precision)
    except measure.Unavailable as exc:
        raise batchmap.MapError(str(exc)) from None
    s = batchmap.shape(case_id, k, n, rng, device)
    dtype = storage_dtype(precision)
    check_memory(s, dtype, device, host_memory_check)
    env = environment.describe(device)  # no MKL banner: it is not known before a product
    params = batchmap.Params(case_id, s["case"].op, s["lo"], s["hi"], s["m_full"], s["full"], s["k"], s["n"],
                             s["batch"], precision, device, measure.SEED, ids.hex_id(ids.object_id(env)))
    rec = batchmap.load(path) if resume else None
    if resume:
        batchmap.check_record(rec, params)  # before drawing inputs

    a_bits, b_bits, checksum = measure.operand_bits(s["case"], dtype, device)
    ops = measure.make_operands(a_bits, b_bits, dtype, device, s["case"])
    del a_bits, b_bits
    with measure.precision_flags(precision):
        anchors = batchpoint.anchors(ops)
        points = batchmap.resume_points(rec, params, checksum, anchors.checksum) if rec else {}
        sessions = list(rec["sessions"]) if rec else []

        bar = tqdm(total=max(scan.grid_count(s["lo"], s["hi"], None), len(points)), initial=len(points), desc=prog,
                   unit="M", file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)
        session = {"evaluated": 0, "seconds": 0.0, "complete": False}
        sessions.append(session)
        t0 = time.monotonic()
        claimed = [resume]  # the record's file is ours: resumed, or created by the first write

        def save(all_points: dict, complete: bool) -> None:
            session["seconds"] = round(time.monotonic() - t0, 3)
            session["complete"] = complete
            if path:  # the first write must not replace a file made since --json was checked absent
                batchmap.write_atomic(path, batchmap.record(params, all_points, input_checksum=checksum,
                                                            anchor_checksum=anchors.checksum, environment=env,
                                                            sessions=sessions, complete=complete),
                                      new=not claimed[0])
                claimed[0] = True

        live = dict(points)
        stopped: list[int] = []
        saved = [time.monotonic()]

        def evaluate(m: int) -> dict:
            p = batchpoint.batch_point(ops, m, anchors, dtype=dtype, device=device)
            live[m] = p
            session["evaluated"] += 1
            if stopped or time.monotonic() - saved[0] >= SAVE_EVERY_S:  # as scan: bounds both cost and loss
                save(live, complete=False)
                saved[0] = time.monotonic()
            bar.total = max(bar.total, len(live))  # past the grid: bisecting
            bar.set_postfix_str(f"at M = {m}", refresh=False)
            bar.update(1)
            if stopped:
                raise KeyboardInterrupt
            return p

        # Ctrl-C (or SIGTERM) lets the M in hand finish and be recorded; a second one stops at once.
        with interrupt.deferred(stopped):
            try:
                points = batchmap.search(s["lo"], s["hi"], evaluate, known=points)
            except (KeyboardInterrupt, kernels.ProfilerLost) as exc:
                bar.close()
                if path and session["evaluated"]:
                    with interrupt.deferred(stopped, escalate=False):  # more Ctrl-C must not cut this write
                        save(live, complete=False)
                where = (f"{path} holds them: continue with --resume {path}" if path
                         else "nothing was recorded (--json FILE keeps a resumable record)")
                if isinstance(exc, kernels.ProfilerLost):
                    return Outcome(1, None, f"stopped after {session['evaluated']} batch sizes: {exc}; {where}")
                return Outcome(128 + (stopped[0] if stopped else signal.SIGINT), None,
                               f"interrupted after {session['evaluated']} batch sizes; {where}")
        bar.close()
    if session["evaluated"] or (rec and not rec.get("complete")):
        save(points, complete=True)
    result = batchmap.record(params, points, input_checksum=checksum, anchor_checksum=anchors.checksum,
                             environment=env, sessions=sessions, complete=True)
    return Outcome(0, result, f"{session['evaluated']} batch sizes measured here, {result['measured']} in all, "
                              f"for {result['range_size']}" + (f"; record in {path}" if path else ""))
