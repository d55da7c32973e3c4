"""The fix finder: every applicable candidate (fixes.py) measured in a fresh process of its
own (fixrun.py), against a baseline measured the same way, and a verdict for each.

Verdicts: "removes" when every drift the case has is gone, bit for bit, on every compared
entry, and no other appeared (measured, not inferred); "adds drift" when a slice or repeat
that was bit-identical drifts under the candidate; "adds NaN/inf" when its full product has
more NaN or inf entries than the default's (slices that agree with it may be NaN too);
"reduces" when some drift is gone or smaller (max_u or the share of entries); "no effect"
otherwise; "not applicable" with the
reason; "failed" when the candidate's process crashed or timed out (the others still
run); "not tried" when the
budget was spent before its process could start, or a signal stopped the finder first or
during it (``stopped``). Times are seconds per
call of the compared computation: the slices that drift, one after another (fixrun.py);
``time_ratio`` is the candidate's over the default computation's, timed beside it round by
round (fixrun.paired: in the same process for a code change, against a process under the
default setting for a setting), ``spread`` the IQR of the rounds' ratios over their median.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from tabulate import tabulate

from matmul_drift.core.numerics import ceil_div
from matmul_drift.probes import fixes, interrupt

TIMEOUT_S = 600  # one candidate's process
POLL_S = 0.05  # how often a running process is checked for its end, its timeout and a signal


def sizes(value) -> list[int]:
    """A slice given as None, one size or a list of sizes, as a list."""
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v]


def drifting(result: dict) -> set[str]:
    """The drift kinds of ``result`` with any entry that differs."""
    return {k for k, d in result["drift"].items() if d["max_ulp"] or d["frac_differ"]}


def _child(specs: list[dict], c: fixes.Candidate | None, timeout: float, stopped: list[int] = (),
           peer: str | None = None, entry: str = "matmul_drift.probes.fixrun",
           valid=None) -> list[dict]:
    """One {code: result} (or {"failed": why}) per spec, from one fresh process under
    candidate ``c``'s setting (None: none); every spec failed alike if the process did, and
    {"not_tried": why} alike once ``stopped`` (signal numbers) is not empty. ``peer``: the
    pipe fds ("r,w") of _timer's process, which the child asks for the default's timings.
    ``entry``: the module whose main() the process runs (fixrun's; the map's modes take
    theirs), ``valid``: what its answer for one spec must pass (fixrun's, _one_result)."""
    prelude = fixes.prelude(c) if c else "import torch\n"
    code = prelude + f"from {entry} import main\nmain()\n"
    env = {**os.environ, **(c.env if c else {})}
    # Files, not pipes: the process is polled, not waited on, and nothing reads a pipe meanwhile.
    with (tempfile.TemporaryFile("w+", errors="replace") as out,
          tempfile.TemporaryFile("w+", errors="replace") as err):
        # Our process group, not one of its own: `timeout` signals the whole group,
        # this process too.
        fds = tuple(map(int, peer.split(","))) if peer else ()
        p = subprocess.Popen([sys.executable, "-c", code, json.dumps(specs),
                              *([peer] if peer else [])], env=env,
                             stdout=out, stderr=err, pass_fds=fds)
        end = time.monotonic() + timeout
        try:
            while p.poll() is None and not stopped and time.monotonic() < end:
                time.sleep(POLL_S)
        finally:  # a KeyboardInterrupt too: no process is left running
            if p.returncode is None:
                p.kill()  # not waited for when stopped: a CUDA process can take seconds to exit
        # ended by us, or by the signal itself (`timeout` signals the group)
        if stopped and p.returncode != 0:
            return [{"not_tried": f"stopped by {interrupt.name(stopped[0])}"}] * len(specs)
        if p.returncode is None:
            p.wait()
            return [{"failed": f"timed out after {timeout:.0f} s"}] * len(specs)
        out.seek(0)
        if p.returncode != 0:
            return [{"failed": _crashed(p.returncode, err)}] * len(specs)
        got = _result(out.read(), len(specs), valid or _one_result)
        return got or [{"failed": "ended (exit 0) without printing its result"}] * len(specs)


def _crashed(returncode: int, err) -> str:
    """One line on a process that ended on its own with ``returncode``: how, and the last
    line of its stderr (the file ``err``)."""
    err.seek(0)
    lines = [ln for ln in err.read().splitlines() if ln.strip()]
    how = f"killed by {interrupt.name(-returncode)}" if returncode < 0 else f"exit {returncode}"
    return (f"crashed ({how})" + (f": {lines[-1]}" if lines else ""))[:300]


TIMER = "import sys, torch\nfrom matmul_drift.probes.fixrun import serve\nserve(sys.argv[1])"


@contextlib.contextmanager
def _timer(stopped: list[int] = (), failed: list[str] | None = None):
    """A process under the default setting that times the default computation for the
    settings' processes (fixrun.serve), one round at a time, as they ask: yields the pipe
    fds ("r,w") _child passes on; killed at the end. Where it ended before (a crash, an
    import error, the OOM killer: no setting's time after that), why goes on ``failed``."""

    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    with tempfile.TemporaryFile("w+", errors="replace") as err:
        try:
            p = subprocess.Popen([sys.executable, "-c", TIMER, f"{req_r},{rep_w}"],
                                 pass_fds=(req_r, rep_w),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        finally:
            os.close(req_r)
            os.close(rep_w)
        try:
            yield f"{rep_r},{req_w}"
        finally:
            ended = p.poll()  # before its requests' pipe closes, which ends it
            os.close(req_w)
            os.close(rep_r)
            p.kill()
            if not stopped:  # not waited for when stopped, as _child's
                p.wait()
            # a signal to the group ends it too
            if ended is not None and not stopped and failed is not None:
                failed.append(_crashed(ended, err))


def _result(text: str, count: int, valid=None) -> list[dict] | None:
    """fixrun's JSON line (a list of ``count`` dicts, each passing ``valid``: _one_result) from
    the child's stdout, or None: a library may print after it (at exit) or the process may end
    before it."""
    for line in reversed(text.splitlines()):
        try:
            got = json.loads(line)
        except ValueError:
            continue
        if isinstance(got, list) and len(got) == count and all(map(valid or _one_result, got)):
            return got
    return None


def _one_result(g) -> bool:
    """fixrun's answer for one spec: {"failed": why}, or {code: a result with its drift}; not any
    JSON list of dicts a library may print at exit."""
    if not isinstance(g, dict) or not g:
        return False
    if set(g) == {"failed"}:
        return isinstance(g["failed"], str)
    return all(isinstance(r, dict) and isinstance(r.get("drift"), dict) for r in g.values())


def verdict(base: dict, got: dict) -> str:
    """removes / adds drift / reduces / no effect / adds NaN/inf, for the case's drifts
    ``drifting(base)``. "removes" only where nothing compared drifts under the candidate: one
    that clears a slice_m drift but makes slice_n drift has removed nothing ("adds drift"), and
    one whose full product has more NaN or inf entries than the default's ("adds NaN/inf")
    may agree with its slices only because both are NaN or inf."""
    want, left = drifting(base), drifting(got)
    # all NaN is bit-identical too: not a fix
    if got.get("nonfinite", 0) > base.get("nonfinite", 0):
        return "adds NaN/inf"
    if not left:
        return "removes"
    if left - want:
        return "adds drift"
    smaller = any(got["drift"][k]["max_u"] < base["drift"][k]["max_u"]
                  or got["drift"][k]["frac_differ"] < base["drift"][k]["frac_differ"] for k in want)
    return "reduces" if len(left) < len(want) or smaller else "no effect"


def _table(spec: dict, drifts: set[str],
           onednn_isa: str | None) -> list[tuple[fixes.Candidate, str | None]]:
    """The candidates for ``spec`` with its ``drifts``, once each, with why_not's reason; only
    those named in spec["only"] where it is given (a stored verdict confirmed: jobs/reuse.py)."""
    dims = [d for d, kind in (("n", "slice_n"), ("m", "slice_m")) if kind in drifts] or ["n"]
    seen, todo, only = set(), [], spec.get("only")
    for dim in dims:
        for c, why in fixes.candidates(spec["device"], drifts, dim, onednn_isa, spec["dtype"]):
            if c.name not in seen and (only is None or c.name in only):
                seen.add(c.name)
                todo.append((c, why))
    return todo


def _slices(spec: dict) -> set[str]:
    return {kind for kind in ("slice_n", "slice_m") if sizes(spec.get(kind))}


def try_fixes_many(specs: list[dict], onednn_isa: str | None = None, timeout: float = TIMEOUT_S,
                   progress=None, lean: bool = False, budget: float | None = None,
                   stopped: list[int] = ()) -> list[dict]:
    """One report per spec: ``baseline`` (the computation as it is), ``drifts``,
    ``candidates`` (rows with verdict, drift, error_u, kernels, seconds, time_ratio, spread),
    ``cheapest`` (the name of the cheapest that removes every drift, or None) and ``tied`` (the
    others that remove it at a cost that cannot be told apart from the cheapest's).

    Processes: one for the default setting, measuring every spec as it is and under every
    code change its slices allow (each timed beside the default there), then one per setting,
    measuring every spec that setting applies to, timed beside the default computation of
    _timer's process, which runs meanwhile (not where every spec is ``untimed``: fixrun's, its
    rows without time). ``lean``: fixrun.py's lean mode, for the suite.
    ``budget`` (seconds from the start): no setting's process starts after it; its rows say
    "not tried". ``timeout``: seconds each process may take. ``stopped``: signal numbers a
    handler appends to (interrupt.deferred); once one is there the process in hand is killed,
    none starts, and every report says ``stopped`` (the signal's name), its rows not measured
    "not tried"."""
    start = time.monotonic()
    # progress(what runs now, processes done, processes in all)
    say = progress or (lambda msg, done, total: None)
    codes = [[c for c, why in _table(s, _slices(s) | {"run_to_run"}, onednn_isa)
              if c.compute and not why]
             for s in specs]
    say("the default computation and its code changes", 0, 1)
    first = _child([{**s, "codes": [None, *(c.compute for c in cs)], "baseline": True, "lean": lean}
                    for s, cs in zip(specs, codes)], None, timeout, stopped)
    reports, todos = [], []
    for s, got in zip(specs, first):
        if "failed" in got or "not_tried" in got:
            why = got["failed"] if "failed" in got else f"was {got['not_tried']}"
            reports.append({"failed": f"the default computation {why}", "drifts": [],
                            "candidates": [],
                            "cheapest": None})
            todos.append([])
            continue
        base = got["None"]
        drifts = drifting(base)
        reports.append({"baseline": base, "drifts": sorted(drifts), "candidates": [],
                        "cheapest": None})
        todos.append(_table(s, drifts, onednn_isa) if drifts else [])
    settings: dict[str, fixes.Candidate] = {}
    for todo in todos:
        settings.update({c.name: c for c, why in todo if not why and not c.compute})
    measured: dict[tuple[int, str], dict] = {}
    timer_failed: list[str] = []

    def why_not() -> str | None:  # why no setting's process starts now
        return (f"stopped by {interrupt.name(stopped[0])}" if stopped
                else f"the budget of {budget:g} s was spent"
                if budget is not None and time.monotonic() - start > budget
                else None)

    # The timer only where a setting's process may still start (none starts once stopped or
    # spent) and has something to time.
    timed = settings and not all(s.get("untimed") for s in specs)
    with (_timer(stopped, timer_failed) if timed and not why_not()
          else contextlib.nullcontext()) as peer:
        for i, c in enumerate(settings.values(), 1):
            idx = [j for j, todo in enumerate(todos)
                   if any(t.name == c.name and not why for t, why in todo)]
            why = why_not()
            if why:
                measured.update({(j, c.name): {"not_tried": why} for j in idx})
                continue
            say(c.name, i, len(settings) + 1)
            got = _child([{**specs[j], "codes": [None], "lean": lean,
                           "drifts": reports[j]["drifts"]} for j in idx],
                         c, timeout, stopped, peer)
            measured.update({(j, c.name): g.get("None", g) for j, g in zip(idx, got)})
    say("done", len(settings) + 1, len(settings) + 1)
    for j, (report, todo) in enumerate(zip(reports, todos)):
        if stopped:
            report["stopped"] = interrupt.name(stopped[0])
        if timer_failed:
            report["timer_failed"] = timer_failed[0]
        for c, why in todo:
            row = {"name": c.name, "code_change": c.code, "env": c.env, "setup": c.setup or None}
            got = (first[j].get(c.compute, {"failed": "not measured"}) if c.compute
                   else measured.get((j, c.name)))
            if why:
                row.update(verdict="not applicable", reason=why)
            elif "not_tried" in got:
                row.update(verdict="not tried", reason=got["not_tried"])
            elif "failed" in got:
                row.update(verdict="failed", reason=got["failed"])
            else:
                row.update(verdict=verdict(report["baseline"], got), drift=got["drift"],
                           error_u=got.get("error_u"), nonfinite=got.get("nonfinite"),
                           kernels=got.get("kernels"), seconds=got.get("seconds"),
                           time_ratio=got.get("time_ratio"), spread=got.get("spread"))
                note = not_in_force(c.env, got.get("kernels"))
                if note:
                    row["note"] = note
            if c.compute and c.compute.startswith("pad:"):
                row["lands_on"] = lands_on(specs[j], c.compute)
                dim = c.compute.split(":")[1]
                family = set(sizes(specs[j].get(f"slice_{dim}")))
                row["lands_on_slices"] = sorted({to for to in row["lands_on"].values()
                                                 if to in family})
            report["candidates"].append(row)
        removes = [r for r in report["candidates"]
                   if r["verdict"] == "removes" and r.get("time_ratio") is not None]
        if removes:
            best = min(removes, key=lambda r: r["time_ratio"])
            report["cheapest"] = best["name"]
            report["tied"] = [r["name"] for r in removes if r is not best and _overlap(best, r)]
    return reports


def lands_on(spec: dict, compute: str) -> dict[str, int]:
    """{slice size: the size padding makes it} for a "pad:<dim>:<multiple>" code change: a pad
    computes the product of that other size (zeros appended, then cut), not a fix of the
    size's own kernel."""
    _, dim, multiple = compute.split(":")
    k = int(multiple)
    return {str(s): ceil_div(s, k) * k for s in sizes(spec.get(f"slice_{dim}")) if s % k}


def _overlap(a: dict, b: dict) -> bool:
    """Whether two candidates' costs cannot be told apart: each ratio's interquartile range
    (``spread`` times the ratio, around it) reaches the other's. Without a spread, equal ratios."""
    def span(r):
        half = r["time_ratio"] * (r.get("spread") or 0.0) / 2
        return r["time_ratio"] - half, r["time_ratio"] + half
    (lo_a, hi_a), (lo_b, hi_b) = span(a), span(b)
    return lo_a <= hi_b and lo_b <= hi_a


def not_in_force(env: dict, kernels: dict | None) -> str | None:
    """Why a measured MKL_CBWR setting was not what MKL ran, from its verbose lines (which
    name the CNR mode used), or None: on an AMD EPYC MKL runs an ISA's mode (AVX2) as AUTO,
    so "no effect" there says nothing of the mode itself."""
    want = env.get("MKL_CBWR")
    ran = {w[4:] for ks in (kernels or {}).values() for k in ks if k.startswith("MKL ")
           for w in k.split() if w.startswith("CNR:")}
    if not want or not ran or ran == {want}:
        return None
    return f"MKL ran CNR:{', '.join(sorted(ran))}, not {want}: this CPU does not take that mode"


def render(report: dict) -> str:
    """The table and the closing line."""
    if "failed" in report:
        return f"matmul-drift explain --try-fixes: {report['failed']}; no candidate was tried\n"
    if not report["drifts"]:
        return ("matmul-drift explain --try-fixes: this case has no drift "
                "(slices and run-to-run are bit-identical): nothing to fix\n")
    rows = []
    for r in report["candidates"]:
        d = r.get("drift") or {}
        # a drift the candidate adds too
        shown = set(report["drifts"]) | (drifting(r) if d else set())
        cells = [f"{k}: {d[k]['max_ulp']} ulp, {d[k]['frac_differ']:.1%}"
                 for k in sorted(shown) if k in d]
        t = r.get("time_ratio")
        rows.append([r["name"] + (" (code change)" if r["code_change"] else ""), r["verdict"],
                     "; ".join(cells) or r.get("reason", ""),
                     "" if t is None
                     else f"{t:.2f}x" + ("" if r.get("spread") is None
                                         else f" ± {r['spread']:.0%}"),
                     "" if r.get("error_u") is None else f"{r['error_u']:.3g}"])
    base = report["baseline"]["drift"]
    head = "drifts before: " + "; ".join(f"{k}: {base[k]['max_ulp']} ulp, "
                                         f"{base[k]['frac_differ']:.1%}"
                                         for k in report["drifts"])
    table = tabulate(rows, headers=["candidate", "verdict",
                                    "drift after (max ulp, share of entries)",
                                    "time vs default", "error_u"],
                     tablefmt="simple", disable_numparse=True)
    unmeasured = [r["name"] for r in report["candidates"]
                  if r["verdict"] in ("not tried", "failed")]
    # a row that removes every drift with no time (the default's timer did not answer) may
    # be the cheapest
    untimed = [r["name"] for r in report["candidates"]
               if r["verdict"] == "removes" and r.get("time_ratio") is None]
    # the others may remove it, and cost less
    among = " of those measured" if unmeasured or untimed else ""
    if report["cheapest"] and report.get("tied"):  # timings this noisy name no cheapest
        names = [report["cheapest"], *report["tied"]]
        last = (f"removes every drift{among}: {', '.join(names)}; "
                "their costs could not be told apart (the "
                "timings' spreads overlap), so none is called the cheapest")
    elif report["cheapest"]:
        # a saved report naming none: KeyError
        c = {r["name"]: r for r in report["candidates"]}[report["cheapest"]]
        last = (f"cheapest that removes every drift{among}: {c['name']} "
                f"({c['time_ratio']:.2f}x the default's time)"
                + (f"; a code change: {c['code_change']}" if c["code_change"] else ""))
    else:
        last = f"no candidate{among} removes every drift of this case"
    if unmeasured:
        last += f"; not tried or failed: {', '.join(unmeasured)}"
    if untimed:
        last += f"; removes every drift, its time not measured: {', '.join(untimed)}"
    landed: dict[tuple, list[str]] = {}
    for r in report["candidates"]:
        if r.get("lands_on") and r["verdict"] != "not applicable":
            landed.setdefault(tuple(r["lands_on"].items()), []).append(r["name"])
    family = {to for r in report["candidates"] for to in r.get("lands_on_slices") or []}
    for sizes_, names in landed.items():
        where = ", ".join(f"{s} as {to}"
                          + (" (itself one of this case's slices)" if to in family else "")
                          for s, to in sizes_)
        last += (f"; {' and '.join(names)} comput{'e' if len(names) > 1 else 'es'} {where}: "
                 "the product of "
                 "that size, whose kernel decides the drift, not a fix of the size's own")
    ignored = [f"{r['name']} ({r['note']})" for r in report["candidates"] if r.get("note")]
    if ignored:
        last += f"; not in force here: {'; '.join(ignored)}"
    if "timer_failed" in report:
        last += (f"; the default's timer process {report['timer_failed']}, "
                 "so the settings' times are missing")
    return f"{head}\n\n{table}\n\n{last}\n"
