"""The scan driver: check memory, draw the inputs, measure every size the search asks for,
keep the record (at most a second behind), resume it, and stop cleanly on Ctrl-C or SIGTERM.

The search itself is scan.py's, one point's measurement measure/measure.py's; parsing arguments
and rendering stay in cli/scan.py. ``run`` returns an Outcome (plain data).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

from matmul_drift.core import cases, ids
from matmul_drift.measure import environment, kernels, measure, memory
from matmul_drift.probes import interrupt, scan

SAVE_EVERY_S = 1.0  # the --json record is rewritten at most this often while scanning (seconds)


@dataclass
class Outcome:
    """How a scan ended: ``status`` 0 (complete), 130 or 143 (interrupted, the record kept);
    ``record`` the complete scan record (None when interrupted); ``message`` its closing line."""

    status: int
    record: dict | None
    message: str


def check_memory(vary: str, dims: dict, dtype: str, device: str, host: bool = True) -> None:
    """ScanError (one line) when the top of the range needs more memory than there is: on the
    host (MemAvailable, unless not ``host``) or free on the GPU."""
    need = memory.bytes_needed(dims["m"], dims["k"], dims["n"], dtype, device, prefix_a=vary == "k")
    try:
        memory.check(need, f"the top of the range, m={dims['m']} k={dims['k']} n={dims['n']} in {dtype},", device, host)
    except memory.TooLarge as exc:
        raise scan.ScanError(str(exc)) from None


def run(vary: str, lo: int, hi: int, fixed: dict, dtype: str, device: str, step: int, path: str | None,
        resume: bool, prog: str = "matmul-drift scan", host_memory_check: bool = True,
        within: int | None = None) -> Outcome:
    """Scan ``vary`` over lo..hi with the ``fixed`` dimensions ({"m": .., "k": .., "n": ..},
    the varied one None). ``step`` 0 is the default grid. With ``path`` the record is
    written there once a second and at the end (``resume``: continued from it). ScanError for
    bad input, and for a range whose top needs more memory than there is (the host's only
    when ``host_memory_check``). ``within``: the size of the varied dimension the points slice
    (the operands' layout, as a slice of a wider tensor has it), None for ``hi``."""
    from tqdm import tqdm  # here: asv's environments hold no tqdm, and the suite imports this module

    dims = {**fixed, vary: within or hi}
    try:
        measure.check_device(device, dtype)
    except measure.Unavailable as exc:
        raise scan.ScanError(str(exc)) from None
    check_memory(vary, dims, dtype, device, host_memory_check)
    env = environment.describe(device)  # no MKL banner: it is not known before a product
    params = scan.Params(vary, lo, hi, fixed["m"], fixed["k"], fixed["n"], dtype, device, step,
                         measure.SEED, ids.hex_id(ids.object_id(env)), within)
    rec = scan.load(path) if resume else None
    if resume:  # a file of JSON null too: it is no record, and must not be written over
        scan.check_record(rec, params)  # before drawing inputs, which can take minutes

    # Inputs as explain draws them for this shape: uniform [0, 1), as the seed.
    case = cases.adhoc(dims["m"], dims["k"], dims["n"])
    a_bits, b_bits, checksum = measure.operand_bits(case, dtype, device)
    points = scan.resume_points(rec, params, checksum) if rec else {}
    sessions = list(rec.get("sessions", [])) if rec else []
    ops = measure.make_operands(a_bits, b_bits, dtype, device, case)
    del a_bits, b_bits
    top = None if vary == "k" else measure.top_product(ops)

    grid = scan.grid_count(lo, hi, step)
    bar = tqdm(total=max(grid, len(points)), initial=len(points), desc=prog, unit="size", file=sys.stderr,
               disable=not sys.stderr.isatty(), leave=False)
    session = {"evaluated": 0, "seconds": 0.0, "complete": False}
    sessions.append(session)
    t0 = time.monotonic()

    claimed = [resume]  # the record's file is ours: resumed, or created by the first write

    def save(all_points: dict, complete: bool, search: dict | None = None) -> None:
        session["seconds"] = round(time.monotonic() - t0, 3)
        session["complete"] = complete
        if path:
            # --json was checked absent at the start; the first write must not replace a file made since.
            rec = scan.record(params, all_points, input_checksum=checksum, environment=env,
                              sessions=sessions, complete=complete, search=search)
            scan.write_atomic(path, rec, new=not claimed[0])
            claimed[0] = True

    live = dict(points)
    stopped: list[int] = []
    saved = [time.monotonic()]

    def evaluate(size: int) -> dict:
        p = measure.scan_point(ops, vary, size, top, dtype=dtype, device=device)
        live[size] = p
        session["evaluated"] += 1
        # Rewriting the whole record after every point is quadratic: a dense 12,000-size sweep
        # spent most of its time writing. Once a second bounds both the cost and what a kill loses.
        if stopped or time.monotonic() - saved[0] >= SAVE_EVERY_S:
            save(live, complete=False)
            saved[0] = time.monotonic()
        if len(live) > bar.total:  # the grid is done: bisecting
            bar.total = len(live)
        bar.set_postfix_str(f"at {size}", refresh=False)
        bar.update(1)
        if stopped:
            raise KeyboardInterrupt
        return p

    # Ctrl-C (or `timeout`'s SIGTERM) lets the point in hand finish and be recorded, so
    # nothing is cut in the middle (a product, a file write, the captured stdout); a
    # second signal stops at once (not `timeout`'s echo to the group: interrupt.ECHO_S).
    with interrupt.deferred(stopped):
        try:
            points, found = scan.checked_search(lo, hi, evaluate, known=points, step=step)
        except (KeyboardInterrupt, kernels.ProfilerLost) as exc:
            bar.close()
            if path and session["evaluated"]:
                with interrupt.deferred(stopped, escalate=False):  # more Ctrl-C must not cut this write
                    save(live, complete=False)  # the points since the last write (each is whole)
            where = (f"{path} holds them: continue with --resume {path}" if path
                     else "nothing was recorded (--json FILE keeps a resumable record)")
            if isinstance(exc, kernels.ProfilerLost):
                return Outcome(1, None, f"stopped after {session['evaluated']} evaluations: {exc}; {where}")
            return Outcome(128 + (stopped[0] if stopped else signal.SIGINT), None,
                           f"interrupted after {session['evaluated']} evaluations; {where}")
    bar.close()
    if session["evaluated"] or (rec and not rec.get("complete")):
        save(points, complete=True, search=found)
    result = scan.record(params, points, input_checksum=checksum, environment=env, sessions=sessions,
                         complete=True, search=found)
    return Outcome(0, result, f"{session['evaluated']} evaluated here, {result['evaluations']} in all, "
                              f"for {result['dense_equivalent']} sizes; {scan.boundary_count(result)}"
                              + (f"; record in {path}" if path else ""))
