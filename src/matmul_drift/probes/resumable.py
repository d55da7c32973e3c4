"""The resumable search that scan and the map share: measure every point the search asks for,
keep the record (at most a second behind), resume it, and stop cleanly on Ctrl-C or SIGTERM.

What is searched, measured and recorded comes in as functions; ``drive`` returns an Outcome
(plain data). No torch here.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

from matmul_drift.core.routes import ProfilerLost
from matmul_drift.probes import interrupt, records

SAVE_EVERY_S = 1.0  # the record is rewritten at most this often while searching (seconds)


@dataclass
class Outcome:
    """How a search ended: ``status`` 0 (complete), 1 (the profiler lost) or 130 or 143
    (interrupted, the record kept); ``record`` the complete record (None when stopped);
    ``message`` its closing line."""

    status: int
    record: dict | None
    message: str


@dataclass(frozen=True)
class Words:
    """How a search names itself: ``prog`` (the progress bar's label), ``unit`` (a point's,
    for the bar: "size", "M"), ``at`` (the point in hand, with {}: "at {}", "at M = {}") and
    ``counted`` (what a stop counts: "evaluations", "batch sizes")."""

    prog: str
    unit: str
    at: str
    counted: str


def drive(search, measure, make_record, done, *, words: Words, grid: int, path: str | None,
          resumed: dict | None, points: dict[int, dict]) -> Outcome:
    """Run ``search(evaluate, known) -> (points, report)`` with ``evaluate`` measuring one
    point by ``measure(size) -> point``, starting from the ``points`` of the record
    ``resumed`` (None for a new search). With ``path`` the record,
    ``make_record(points, sessions, complete, report)``, is written there once a second at
    most, on a stop and at the end; the first write of a new search leaves alone a file that
    appeared at ``path``. ``grid`` is the progress bar's first total (points). ``done(record,
    evaluated)`` words the closing line of a complete search (``evaluated``: measured here)."""
    from tqdm import tqdm  # here: asv's environments hold no tqdm, and the suite imports this

    sessions = list(resumed["sessions"]) if resumed else []
    bar = tqdm(total=max(grid, len(points)), initial=len(points), desc=words.prog, unit=words.unit,
               file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)
    session = {"evaluated": 0, "seconds": 0.0, "complete": False}
    sessions.append(session)
    t0 = time.monotonic()
    # the record's file is ours: resumed, or created by the first write
    claimed = [resumed is not None]

    def save(all_points: dict, complete: bool, report: dict | None = None) -> None:
        session["seconds"] = round(time.monotonic() - t0, 3)
        session["complete"] = complete
        if path:  # the first write must not replace a file made since the path was checked absent
            records.write_atomic(path, make_record(all_points, sessions, complete, report),
                                 new=not claimed[0])
            claimed[0] = True

    live = dict(points)
    stopped: list[int] = []
    saved = [time.monotonic()]

    def evaluate(size: int) -> dict:
        p = measure(size)
        live[size] = p
        session["evaluated"] += 1
        # Rewriting the whole record after every point is quadratic in the points; once a
        # second bounds both the cost and what a kill loses.
        if stopped or time.monotonic() - saved[0] >= SAVE_EVERY_S:
            save(live, complete=False)
            saved[0] = time.monotonic()
        bar.total = max(bar.total, len(live))  # past the grid: bisecting
        bar.set_postfix_str(words.at.format(size), refresh=False)
        bar.update(1)
        if stopped:
            raise KeyboardInterrupt
        return p

    # Ctrl-C (or `timeout`'s SIGTERM) lets the point in hand finish and be recorded, so
    # nothing is cut in the middle (a product, a file write, the captured stdout); a
    # second signal stops at once (not `timeout`'s echo to the group: interrupt.ECHO_S).
    with interrupt.deferred(stopped):
        try:
            points, found = search(evaluate, points)
        except (KeyboardInterrupt, ProfilerLost) as exc:
            bar.close()
            if path and session["evaluated"]:
                # more Ctrl-C must not cut this write
                with interrupt.deferred(stopped, escalate=False):
                    save(live, complete=False)  # the points since the last write (each is whole)
            where = (f"{path} holds them: continue with --resume {path}" if path
                     else "nothing was recorded (--json FILE keeps a resumable record)")
            count = f"{session['evaluated']} {words.counted}"
            if isinstance(exc, ProfilerLost):
                return Outcome(1, None, f"stopped after {count}: {exc}; {where}")
            return Outcome(128 + (stopped[0] if stopped else signal.SIGINT), None,
                           f"interrupted after {count}; {where}")
    bar.close()
    if session["evaluated"] or (resumed and not resumed.get("complete")):
        save(points, complete=True, report=found)
    result = make_record(points, sessions, True, found)
    return Outcome(0, result, done(result, session["evaluated"]))
