"""What the asv suite records: every cell measured once, flattened to track values.

asv runs ``measure_all`` once per environment (in ``setup_cache``); each ``track_`` method then
reads one number back (``lookup``, ``added``). A cell that cannot run here is a skip (asv records
NaN); one that raised is a failure (asv records null) and the others still run. Which cells, and
which added values, the ``MATMUL_DRIFT_*`` settings say (jobs/selection.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback

import torch

from matmul_drift.core import cases, ids, trees, words
from matmul_drift.jobs import reuse, selection
from matmul_drift.jobs.selection import BUDGET_VAR, COST, Cell
from matmul_drift.measure import memory
from matmul_drift.measure.measure import cpu_product, measure
from matmul_drift.measure.record import Unavailable, kernel_entry
from matmul_drift.probes import (batchmap, batchmap_run, fixes, fixfind, order, order_plan,
                                 order_tree)
from matmul_drift.store import catalog

NAN = float("nan")
# the cases with a batch dimension to map (a row count M that A[:M] @ B slices); the others NaN
MAP_CASES = ("skinny", "batch-invariance-2", "linear", "bmm")
# The suite maps M = 1..min(the case's M, batchmap.DEFAULT_TOP), but only to NATIVE_TOP where the
# full product ran torch's own loop (the route "native": no oneDNN or MKL kernel, as fp16 without
# avx512_fp16, bf16 without avx512_bf16): that loop is slow enough that one such map would cost
# more than all the others (docs/map.md). 1..64 measures about a seventh of its rows.
NATIVE_TOP = 64
DRAWS = 16  # fresh draws a stored tree must replay bit for bit


def _worst(rows: list[dict]) -> float:
    return float(max(r["max_ulp"] for r in rows)) if rows else NAN


def track_values(m, root) -> dict:
    """The numbers asv records for one Measurement; stores its catalog entries under ``root``."""
    kid = catalog.store(root, "kernels", kernel_entry(m.device, m.kernels))
    eid = catalog.store(root, "env", m.environment)
    bid = catalog.store(root, "bits", m.bits)
    assert kid == m.kernel_id and eid == m.env_id and bid == m.bits_id
    return {
        "error_u": NAN if m.error_u is None else m.error_u,
        "nonfinite": float(m.nonfinite["product"]),
        "gamma_k_u": NAN if m.gamma_k_u is None else m.gamma_k_u,
        "slice_n_ulp": _worst(m.slice_n),
        "slice_m_ulp": _worst(m.slice_m),
        "run_to_run_ulp": float(m.run_to_run["max_ulp"]),
        "kernel_id": float(m.kernel_id),
        "bits_id": float(m.bits_id),
        "env_id": float(m.env_id),
        "input_id": float(int(m.input_checksum[: ids.ID_HEX_DIGITS], 16)),
        **cuda_timing(m.seconds if m.device == "cuda" else None),
    }


def cuda_timing(seconds: dict | None) -> dict:
    """The CUDA timing's series from measure.time_call's dict (None: not timed): the median,
    do_bench's 20% and 80% quantiles (seconds) and whether the SM clock fell (1.0, 0.0; NaN
    where no clock was read)."""
    if seconds is None:
        return {"cuda_seconds": NAN, "cuda_q20_seconds": NAN, "cuda_q80_seconds": NAN,
                "cuda_clock_fell": NAN}
    q20, _, q80 = seconds.get("quantiles") or (NAN, NAN, NAN)
    clock = seconds.get("clocks")
    fell = NAN if not isinstance(clock, dict) or clock.get("fell") is None else float(clock["fell"])
    return {"cuda_seconds": seconds["median"], "cuda_q20_seconds": q20, "cuda_q80_seconds": q80,
            "cuda_clock_fell": fell}


def measure_all(case_ids=None, precisions=None, devices=None, root=None,
                log=sys.stderr) -> dict[Cell, dict]:
    """Measure every selected cell (selection.read(), less what the arguments narrow); returns
    {cell: values | {"skip": why} | {"error": text}}. values["failed"], where present, is
    {name: why} of the added values (``added``) that broke. With $MATMUL_DRIFT_BUDGET, no cell
    starts after that many seconds: the rest are skipped, and say why (the order probe, the fix
    finder and the maps come after, outside it). With $MATMUL_DRIFT_REUSE (jobs/reuse.py),
    trees, fix verdicts and maps of cells whose ids equal that record's are confirmed, not
    measured again. Ends with a line of where the time went (``COST``). With
    $MATMUL_DRIFT_PROGRESS, every line also goes to that file."""
    sel = selection.read()
    narrowed = {"cases": case_ids, "precisions": precisions, "devices": devices}
    sel = dataclasses.replace(sel, **{k: v for k, v in narrowed.items() if v is not None})
    root = catalog.default_root() if root is None else root
    path = os.environ.get(selection.PROGRESS_VAR)
    if not path:
        return _measure_all(sel, root, log)
    with open(path, "a", encoding="utf-8") as fh:
        return _measure_all(sel, root, _Tee(log, fh))


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> None:
        for s in self.streams:
            s.write(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def _measure_all(sel: selection.Selection, root, log) -> dict[Cell, dict]:
    selection.check_torch(torch.__version__)
    out = {}
    cells = sel.cells()
    record = _record(log)
    cost = {"reference": 0.0}
    t0 = time.monotonic()
    with memory.small_pages():
        for i, cell in enumerate(cells, 1):
            if sel.budget is not None and time.monotonic() - t0 > sel.budget:
                out[cell] = {"skip": f"not measured: the budget of {sel.budget:g} s "
                                     f"(${BUDGET_VAR}) was spent"}
                status = "skip (budget)"
            else:
                out[cell], status = _measure_one(cell, root, cost)
            print(f"[{i}/{len(cells)} {time.monotonic() - t0:6.1f}s] {' '.join(cell)}: {status}",
                  file=log, flush=True)
    cost["measuring"] = time.monotonic() - t0
    t1 = time.monotonic()
    cost["orders_reused"] = add_orders(out, root, log, record) if sel.orders else 0
    cost["orders"], t2 = time.monotonic() - t1, time.monotonic()
    cost["fixes_reused"] = add_fixes(out, root, log, record) if sel.fixes else 0
    cost["fixes"], t3 = time.monotonic() - t2, time.monotonic()
    cost["maps_reused"] = add_maps(out, root, log, record) if sel.maps else 0
    cost["maps"] = time.monotonic() - t3
    print(cost_line(cost, record[0] if record else None), file=log, flush=True)
    return out


def cost_line(cost: dict, commit: str | None) -> str:
    """Where setup_cache's time went, in seconds, and what was reused (and from which commit)."""
    return (f"{COST} measuring {cost['measuring']:.1f} s "
            f"(exact reference {cost['reference']:.1f} s), "
            f"orders {cost['orders']:.1f} s ({cost['orders_reused']} reused), "
            f"fixes {cost['fixes']:.1f} s ({cost['fixes_reused']} reused), "
            f"maps {cost['maps']:.1f} s ({cost['maps_reused']} reused)"
            + (f"; reused from {commit[:8]}" if commit else "; nothing to reuse"))


def _record(log) -> tuple[str, dict] | None:
    """The last recorded result that $MATMUL_DRIFT_REUSE names, as reuse.previous reads it; None
    where there is none or it cannot be read (a line says why: everything is measured afresh)."""
    path = reuse.record_path()
    if path is None:
        return None
    try:
        return reuse.previous(path)
    except (OSError, ValueError) as exc:
        print(f"not reusing {path}: {exc}; measuring everything afresh", file=log, flush=True)
        return None


def _measure_one(cell: Cell, root, cost: dict) -> tuple[dict, str]:
    """One cell's values (or {"skip": why}, {"error": text}) and its status word; adds the exact
    reference's seconds to cost["reference"]."""
    try:
        case, precision, device = cell
        m = measure(cases.get(case), precision, device, timing=(device == "cuda"))
        cost["reference"] += m.reference_seconds
        clock = (m.seconds or {}).get("clocks") or {}
        said = {True: f"; the GPU's clocks fell while timed: {clock.get('why')}",
                None: f"; note: {clock.get('why')}"}.get(clock.get("fell"), "") if clock else ""
        return track_values(m, root), "ok" + said
    except Unavailable as exc:
        return {"skip": str(exc)}, "skip"
    except Exception as exc:  # one broken case must not lose the others
        return {"error": "".join(traceback.format_exception_only(exc)).strip()}, "error"


def _measured(out: dict[Cell, dict]) -> list[Cell]:
    return [k for k, v in out.items() if "skip" not in v and "error" not in v]


def add_orders(out: dict[Cell, dict], root, log=sys.stderr,
               record: tuple[str, dict] | None = None) -> int:
    """Adds ``order_id`` to every measured cell: the order-id (core/trees.py) of entry (0, 0) of
    the case's full product, revealed and replayed bit for bit (order.order_of); the id of the
    tree ``null`` where the readings fit no tree or the replay differs ("not revealed": a kernel
    whose order stops being a tree changes the id); NaN where the probe does not run (K beyond
    its range, or more matmul calls than order_plan.MAX_CALLS); a failure (``added``: asv null)
    where the probe itself broke. Where ``record`` (reuse.previous) has the cell's kernel,
    environment and input ids, its stored tree replays fresh draws instead ("reused from
    <commit>, confirmed"); one that does not, or cannot be read, is revealed afresh and the line
    says why. Returns how many trees were reused."""
    todo = _measured(out)
    # slice-n-view and slice-n-copy share their full product
    t0, memo, reused = time.monotonic(), {}, 0
    for i, k in enumerate(todo, 1):
        why = None
        try:
            t = order_plan.target(cases.get(k.case), k.precision, k.device)
            # order_of's memo key
            key = (t.computation(), order_plan.MAX_CALLS, True) if record else None
            got, why = ((None, None) if key is None or key in memo
                        else _reused_tree(t, k, out[k], record, root))
            if got is not None:  # the same computation later is "the same as" this one
                memo[key] = {**got, "confirmed": None, "same_as": t.label, "k": t.k}
            else:
                got = order.order_of(t, memo=memo)
        except (order_plan.ProbeError, Unavailable) as exc:
            got = {"probed": False, "reason": str(exc)}
        except Exception as exc:  # the probe must not lose the measurements, nor pass for a skip
            got = {"probed": False, "reason": "".join(traceback.format_exception_only(exc)).strip()}
            out[k].setdefault("failed", {})["order_id"] = got["reason"]
        if not got["probed"]:
            out[k]["order_id"], what = NAN, f"not probed: {got['reason']}"
        else:
            out[k]["order_id"] = float(order_tree.store(root, got["tree"], t.k))
            what = got["summary"] if got["tree"] is not None else f"not revealed: {got['reason']}"
            if got.get("confirmed"):
                reused += 1
                what += f": {got['confirmed']}"
            else:
                what += _probed_how(got)
        what += f"; {why}" if why else ""
        print(f"[orders {i}/{len(todo)} {time.monotonic() - t0:6.1f}s] {' '.join(k)}: {what}",
              file=log, flush=True)
    return reused


def _probed_how(got: dict) -> str:
    """How order_of came by a tree, for the log line."""
    if "same_as" in got:
        return f" (the same computation as {got['same_as']})"
    if "adopted" in got:
        return f" ({got['adopted']}'s tree, replayed bit for bit: {got['calls']} calls)"
    return f" ({got['calls']} calls)"


def _reused_tree(t, k: Cell, values: dict, record: tuple[str, dict] | None,
                 root) -> tuple[dict | None, str | None]:
    """(order_of's dict for the recorded tree, with ``confirmed`` saying so, or None; why it
    was not reused, or None where there was no record to reuse)."""
    commit, order_id, entry, why = reuse.stored(values, record, k, "order_id", "orders", root,
                                                "the tree {ident}")
    if entry is None:
        return None, why
    ident = ids.hex_id(order_id)
    if entry.get("tree") is None or entry.get("k") != t.k:
        return None, f"measured afresh: {commit} recorded no tree of K = {t.k} ({ident})"
    seed = reuse.fresh_seed()
    r = confirm_tree(t, entry["tree"], seed)
    if r["matched"] != r["draws"]:
        return None, (f"the tree {ident} of {commit} matched {r['matched']} of {r['draws']} "
                      f"fresh draws (seed {seed}; first mismatch {r['first_mismatch']}): "
                      "revealed afresh")
    tree = entry["tree"]
    calls = f"{r['calls']} call{'s' if r['calls'] != 1 else ''}"
    return {"probed": True, "tree": tree, "order_id": ids.hex_id(trees.order_id(tree, t.k)),
            "summary": words.describe(tree), "calls": r["calls"],
            "confirmed": f"reused from {commit}, confirmed ({r['draws']} fresh draws replayed "
                         f"bit for bit, {calls})"}, None


def confirm_tree(t, tree, seed: int) -> dict:
    """Replays ``tree`` on DRAWS fresh draws of ``t``'s kernel (order.replay): first in the first
    16 columns (rows) at once, as the reveal verifies a tree over the columns its probes shared;
    where those differ, DRAWS / 2 in the entry's own column alone, a call each. Returns replay's
    dict plus ``calls`` (matmul calls)."""
    width = min(16, t.width)
    got = order.replay(t, tree, draws=DRAWS, seed=seed, width=width)
    calls = order_plan.replay_calls(DRAWS, width)
    if got["matched"] != got["draws"] and width > 1:
        got = order.replay(t, tree, draws=DRAWS // 2, seed=seed, width=1)
        calls += order_plan.replay_calls(DRAWS // 2, 1)
    return {**got, "calls": calls}


def add_maps(out: dict[Cell, dict], root, log=sys.stderr,
             record: tuple[str, dict] | None = None) -> int:
    """Adds ``map_id`` to every measured cell of a batched case (MAP_CASES): the id of the
    catalog "maps" entry (batchmap.entry: every M's state as runs, and the words) of the case's
    batch-invariance map over M = 1..min(the case's M, batchmap.DEFAULT_TOP: 256 on the CPU, 512
    on CUDA; NATIVE_TOP where the CPU's full product ran torch's own loop), on the suite's own
    inputs, against the case's full product. NaN where the map cannot run (out of memory), a
    failure (``added``: asv null) where it broke. Where ``record`` (reuse.previous) has the
    cell's kernel, environment and input ids, the stored map is confirmed instead: each run's
    first and last M measured again (batchmap_run.confirm; "reused from <commit>, confirmed");
    one that does not hold, or cannot be read, is mapped afresh and the line says why. Returns
    how many maps were reused."""
    todo = [k for k in _measured(out) if k.case in MAP_CASES]
    t0, reused = time.monotonic(), 0
    for i, k in enumerate(todo, 1):
        why = None
        try:
            top = NATIVE_TOP if k.device == "cpu" and _native(out[k], root) else None
            rng = None if top is None else (1, min(top, cases.get(k.case).shape(k.device).m))
            mapper = batchmap_run.Mapper(batchmap_run.plan(k.case, None, None, rng, k.precision,
                                                           k.device))
            if int(mapper.checksum[: ids.ID_HEX_DIGITS], 16) != out[k]["input_id"]:
                raise RuntimeError("the map drew other inputs than the suite "
                                   f"({mapper.checksum[:12]})")
            got, why = _reused_map(mapper, k, out[k], record, root)
            if got is None:
                rec = batchmap_run.complete(mapper)
                got = {"entry": batchmap.entry(rec),
                       "how": f"measured {rec['measured']} of {rec['range_size']} M"}
            else:
                reused += 1
            out[k]["map_id"] = float(catalog.store(root, "maps", got["entry"]))
            what = "; ".join(got["entry"]["words"].splitlines()[:2]) + f" ({got['how']})"
        except (batchmap.MapError, Unavailable) as exc:
            out[k]["map_id"], what = NAN, f"not mapped: {exc}"
        except Exception as exc:  # the map must not lose the measurements, nor pass for a skip
            reason = "".join(traceback.format_exception_only(exc)).strip()
            out[k]["map_id"], what = NAN, f"failed: {reason}"
            out[k].setdefault("failed", {})["map_id"] = reason
        what += f"; {why}" if why else ""
        print(f"[maps {i}/{len(todo)} {time.monotonic() - t0:6.1f}s] {' '.join(k)}: {what}",
              file=log, flush=True)
    return reused



def _native(values: dict, root) -> bool:
    """Whether the cell's full product ran torch's own loop (its catalog kernel entry's route is
    "native"); False where the entry cannot be read."""
    try:
        entry = catalog.load(root, "kernels", values["kernel_id"])
    except (catalog.MissingEntry, ValueError, KeyError):
        return False
    full = entry.get("full") if isinstance(entry, dict) else None
    return (isinstance(full, list) and all(isinstance(k, str) for k in full)
            and batchmap.route(full) == "native")


def _reused_map(mapper, k: Cell, values: dict, record: tuple[str, dict] | None,
                root) -> tuple[dict | None, str | None]:
    """({"entry": the recorded map's catalog entry, "how": "reused from <commit>, confirmed
    (...)"}, or None; why it was not reused, or None where there was no record to reuse)."""
    commit, map_id, entry, why = reuse.stored(values, record, k, "map_id", "maps", root,
                                              "the map {ident}", "mapped afresh")
    if entry is None:
        return None, why
    ident = ids.hex_id(map_id)
    misfit = batchmap.entry_misfit(entry, mapper.plan.params)
    if misfit:
        return None, f"mapped afresh: the map {ident} of {commit} is {misfit}"
    r = batchmap_run.confirm(mapper, entry["verdicts"])
    if r["differ"]:
        m, was, now = r["differ"][0]
        return None, (f"the map {ident} of {commit} did not hold at {len(r['differ'])} of "
                      f"{len(r['sizes'])} M measured again (first M = {m}: recorded "
                      f"{_state_words(was)}, now {_state_words(now)}): mapped afresh")
    return {"entry": entry, "how": f"reused from {commit}, confirmed ({len(r['sizes'])} M "
                                   "measured again, each run's first and last, in the same "
                                   "state)"}, None


def _state_words(s: tuple[str, bool, bool]) -> str:
    """(kernel-id, row 0 invariant?, rows invariant?) in words, for a line of the log."""
    return (f"kernel-id {s[0]}, row 0 {'invariant' if s[1] else 'drifting'}, "
            f"rows {'invariant' if s[2] else 'drifting'}")


def _drifts(values: dict) -> bool:
    return any(values[k] > 0 for k in ("slice_n_ulp", "slice_m_ulp", "run_to_run_ulp"))


def fix_entry(device: str, report: dict) -> dict:
    """The catalog text behind a fix-id: which drifts the cell has and each measured candidate's
    verdict (times left out: they are noise, the verdicts are bits)."""
    return {"device": device, "drifts": report["drifts"],
            "verdicts": {r["name"]: r["verdict"] for r in report["candidates"]
                         if r["verdict"] != "not applicable"}}


def add_fixes(out: dict[Cell, dict], root, log=sys.stderr,
              record: tuple[str, dict] | None = None) -> int:
    """Adds ``fix_cost`` and ``fix_id`` to every measured cell of ``out``.

    fix_cost: the time of the cheapest candidate (probes/fixes.py) that removes every drift, over
    the default's (a ratio), NaN where none does; 1.0 where there is no drift to remove.
    fix_id: the id of ``fix_entry``. The drifting cells go through the fix finder together: one
    fresh process for the default and the code changes, one per setting. Where ``record``
    (reuse.previous) has a drifting cell's kernel, environment and input ids and a fix that
    removed its drifts, only the recorded removers are tried, in one such run, untimed ("reused
    from <commit>, confirmed": the same drifts, each still removed; fix_cost the record's, a
    timing ratio nothing flags, timed again whenever the verdicts are measured afresh);
    otherwise, or where that fails, every candidate is tried. Returns how many verdicts were
    reused."""
    measured = _measured(out)
    todo = [k for k in measured if _drifts(out[k])]
    none = {"drifts": [], "candidates": []}
    for k in measured:
        if k not in todo:
            out[k].update(fix_cost=1.0,
                          fix_id=float(catalog.store(root, "fixes", fix_entry(k.device, none))))
    if not todo:
        return 0
    isa = fixes.onednn_isa_in_force()
    held = _stored_fixes(todo, out, record, root, log)
    afresh = [k for k in todo if k not in held]
    if held:
        afresh += _confirm_fixes(held, out, record[0][:8], isa, log)
    if afresh:
        reports = _try_fixes([_fix_spec(k) for k in afresh], isa,
                             f"{len(afresh)} drifting combination(s)", log)
        for k, report in zip(afresh, reports):
            _record_fixes(out, k, report, root, log)
    return len(todo) - len(afresh)


def _confirm_fixes(held: dict, out: dict[Cell, dict], commit: str, isa, log) -> list[Cell]:
    """The recorded removers of ``held`` (_stored_fixes's) tried again in one run, untimed; each
    cell whose verdicts hold takes the record's values, the others are returned."""
    specs = [{**_fix_spec(k), "only": held[k][1], "untimed": True} for k in held]
    reports = _try_fixes(specs, isa, "confirming recorded fixes", log)
    afresh = []
    for (k, (fid, names, drifts, cost)), report in zip(held.items(), reports):
        kept = {r["name"] for r in report["candidates"] if r["verdict"] == "removes"}
        if "failed" not in report and report["drifts"] == drifts and kept == set(names):
            out[k].update(fix_cost=cost, fix_id=fid)
            print(f"fixes of {k}: reused from {commit}, confirmed ({', '.join(names)} still "
                  f"{'removes' if len(names) == 1 else 'remove'} {', '.join(drifts)} in one run; "
                  "fix cost as recorded)", file=log, flush=True)
            continue
        if "failed" in report:
            why = report["failed"]
        elif report["drifts"] != drifts:
            why = f"drifts now {', '.join(report['drifts']) or 'none'}, were {', '.join(drifts)}"
        else:
            why = f"still removing: {', '.join(sorted(kept)) or 'none'} of {', '.join(names)}"
        print(f"fixes of {k}: the verdicts of {commit} did not hold ({why}): measured afresh",
              file=log, flush=True)
        afresh.append(k)
    return afresh


def _fix_spec(k: Cell) -> dict:
    case = cases.get(k.case)
    return {"case": k.case, "dtype": k.precision, "device": k.device,
            "slice_n": list(case.slice_n), "slice_m": list(case.slice_m), "repeat": case.repeat}


def _try_fixes(specs: list[dict], isa, what: str, log) -> list[dict]:
    """fixfind.try_fixes_many over ``specs`` (the suite's lean mode), its progress in ``log``."""
    t0 = time.monotonic()

    def progress(step: str, done: int, total: int) -> None:
        print(f"[fixes {done}/{total} {time.monotonic() - t0:6.1f}s] {what}: {step}", file=log,
              flush=True)

    return fixfind.try_fixes_many(specs, isa, progress=progress, lean=True)


def _stored_fixes(todo: list[Cell], out: dict[Cell, dict], record, root,
                  log) -> dict[Cell, tuple[float, list[str], list[str], float]]:
    """{cell: (fix_id, the recorded removers, the recorded drifts, the recorded fix_cost)} of the
    drifting cells ``record`` may stand for; a line for each that has a record but cannot use
    it."""
    held = {}
    for k in todo if record else ():
        commit, fix_id, entry, why = reuse.stored(out[k], record, k, "fix_id", "fixes", root,
                                                  "the verdicts")
        if entry is None:
            if why:
                print(f"fixes of {k}: {why}", file=log, flush=True)
            continue
        names = reuse.removers(entry)
        if not names or entry.get("device") != k.device:
            print(f"fixes of {k}: measured afresh: {commit} recorded no fix that removes its "
                  f"drifts on {k.device}", file=log, flush=True)
            continue
        cost = record[1][k].get("fix_cost", NAN)
        if not cost > 0:  # NaN too: no cost to carry over (the removers went untimed that run)
            print(f"fixes of {k}: measured afresh: no fix cost recorded at {commit}", file=log,
                  flush=True)
            continue
        held[k] = (fix_id, names, sorted(entry.get("drifts", [])), cost)
    return held


def _record_fixes(out: dict[Cell, dict], k: Cell, report: dict, root, log) -> None:
    if "failed" in report:  # asv null, not NaN: a crash or a timeout is no skip
        out[k].update(fix_cost=NAN, fix_id=NAN)
        out[k].setdefault("failed", {}).update(fix_cost=report["failed"], fix_id=report["failed"])
        print(f"fixes of {k}: {report['failed']}", file=log, flush=True)
        return
    cheapest = next((r for r in report["candidates"] if r["name"] == report["cheapest"]), None)
    out[k].update(fix_cost=NAN if cheapest is None else float(cheapest["time_ratio"]),
                  fix_id=float(catalog.store(root, "fixes", fix_entry(k.device, report))))


def added(values: dict, name: str) -> float:
    """A value add_orders, add_fixes or add_maps adds: NaN (asv: skipped) where it was not added,
    as where $MATMUL_DRIFT_ORDERS=0; RuntimeError (asv: failed) where adding it broke."""
    if name in values.get("failed", {}):
        raise RuntimeError(values["failed"][name])
    return values.get(name, NAN)


def lookup(cache: dict[Cell, dict], case: str, precision: str, device: str) -> dict:
    """The values of one cell; NotImplementedError (asv: skipped) or RuntimeError (failed)."""
    entry = cache.get(Cell(case, precision, device))
    if entry is None:
        raise NotImplementedError("not measured")
    if "skip" in entry:
        raise NotImplementedError(entry["skip"])
    if "error" in entry:
        raise RuntimeError(entry["error"])
    return entry


def timed_call(case: str, precision: str, device: str):
    """A zero-argument callable doing the case's full product on the CPU, for asv's timer.

    asv re-runs ``setup`` before every timed call; the operands are made once per process
    and reused (drawing the seed's 4096 x 51000 B takes seconds). CUDA is timed with CUDA
    events inside ``measure_all`` instead (``cuda_seconds``).
    """
    selection.check_torch(torch.__version__)
    if Cell(case, precision, device) not in selection.read().cells():
        raise NotImplementedError(f"not selected by ${selection.CASES_VAR}, "
                                  f"${selection.PRECISIONS_VAR} or ${selection.DEVICES_VAR}")
    if device != "cpu":
        raise NotImplementedError("CUDA time is recorded by track_cuda_seconds with CUDA events")
    return cpu_product(case, precision)
