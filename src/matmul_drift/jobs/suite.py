"""What the asv suite records: every case measured once, flattened to track values.

asv runs ``measure_all`` once per environment (in ``setup_cache``); each ``track_``
method then reads one number back. A case that cannot run here is a skip (asv records
NaN); one that raised is a failure (asv records null) and the others still run.
"""

from __future__ import annotations

import math
import sys
import time
import traceback

from matmul_drift.core import cases, ids, numerics
from matmul_drift.measure import memory
from matmul_drift.measure.measure import Unavailable, cpu_product, kernel_entry, measure
from matmul_drift.store import catalog

NAN = float("nan")
SUBSET_VAR = "MATMUL_DRIFT_CASES"  # comma list of case ids: run only these (tests, quick nights)


DEVICES_VAR = "MATMUL_DRIFT_DEVICES"  # comma list of devices to measure (a GPU check: cuda)
PRECISIONS_VAR = "MATMUL_DRIFT_PRECISIONS"  # comma list of precisions, in the order to measure them
FIXES_VAR = "MATMUL_DRIFT_FIXES"  # "0": no fix finder (fix_cost, fix_id NaN): quicker runs
ORDERS_VAR = "MATMUL_DRIFT_ORDERS"  # "0": no order probe (order_id NaN)
MAPS_VAR = "MATMUL_DRIFT_MAPS"  # "0": no batch-invariance maps (map_id NaN)
# the cases with a batch dimension to map (a row count M that A[:M] @ B slices); the others NaN
MAP_CASES = ("skinny", "batch-invariance-2", "linear", "bmm")
# The suite maps M = 1..min(the case's M, batchmap.DEFAULT_TOP), but only to NATIVE_TOP where the
# full product ran torch's own loop (the route "native": no oneDNN or MKL kernel, as fp16 without
# avx512_fp16, bf16 without avx512_bf16), for cost: on the AMD EPYC fp16's loop runs at 0.26
# GFLOP/s, and batch-invariance-2's fp16 map of 1..256 took 15.3 of the 26 s all 16 CPU maps
# took; under the AVX2 caps bf16's took 14.5 of 30.4 s. 1..64 measures about a seventh of its rows.
NATIVE_TOP = 64
BUDGET_VAR = "MATMUL_DRIFT_BUDGET"  # seconds: start no measurement after them (a GPU check's fixed slot)
TORCH_VAR = "MATMUL_DRIFT_EXPECT_TORCH"  # the torch version an `existing` environment must hold
# a file measure_all also writes its progress to: asv keeps a setup_cache's output only where it fails
PROGRESS_VAR = "MATMUL_DRIFT_PROGRESS"


def _selected(var: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """The comma list in ``$var``, in its order, or all of ``known`` where it is empty; a
    name not in ``known`` fails loudly here, not as a silent empty run."""
    import os

    wanted = tuple(w.strip() for w in os.environ.get(var, "").split(",") if w.strip())
    bad = [w for w in wanted if w not in known]
    if bad:
        raise ValueError(f"${var} names unknown {what}: {', '.join(bad)}; known {what}: {', '.join(known)}")
    return wanted or known


def selected_devices() -> tuple[str, ...]:
    return _selected(DEVICES_VAR, cases.DEVICES, "devices")


def selected_precisions() -> tuple[str, ...]:
    return _selected(PRECISIONS_VAR, cases.PRECISIONS, "precisions")


def selected_cases() -> tuple[str, ...]:
    return _selected(SUBSET_VAR, cases.CASE_IDS, "cases")


GPU_DRIVERS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")  # NVIDIA's and ROCm's


def devices_here() -> tuple[str, ...]:
    """The selected devices ($MATMUL_DRIFT_DEVICES) this machine can measure, known without
    torch: cuda only where a GPU driver is loaded (one of GPU_DRIVERS); without one no torch
    build sees a GPU, and every cuda combination skips."""
    import os

    driver = any(os.path.exists(p) for p in GPU_DRIVERS)
    return tuple(d for d in selected_devices() if d != "cuda" or driver)


def selection_regex(benchmarks: str, devices: tuple[str, ...] | None = None) -> str:
    """An `asv run --bench` regex for the benchmarks whose dotted names ``benchmarks`` matches
    from the start, at the (case, dtype, device) combinations this selection measures on
    ``devices`` (default: the selected ones); a CUDA-only precision is left out on the CPU.
    asv names each combination ``name('case', 'dtype', 'device')`` and records the others as
    NaN, as a skip, but without a process for each: a skip costs a fork of asv's forkserver,
    which holds torch, 12 to 18 ms on a 2-core AMD EPYC; without a GPU, 1296 of a build's 1944."""
    import re

    def any_of(names) -> str:
        return "|".join(re.escape(repr(n)) for n in names)

    precisions = selected_precisions()
    per_device = "|".join(f"(?:{any_of(p for p in precisions if d == 'cuda' or p not in numerics.TF32)}), "
                          f"{any_of([d])}" for d in (selected_devices() if devices is None else devices))
    return rf"^(?:{benchmarks})\(({any_of(selected_cases())}), (?:{per_device})\)$"


def bench_args(wanted: list[str]) -> tuple[list[str], str]:
    """`asv run`'s --bench arguments for the benchmarks the regexes ``wanted`` name (as asv
    searches a name with its parameters; none: all), at the combinations this machine measures
    (``selection_regex`` on ``devices_here``), and the same in words for a log line."""
    devices = devices_here() or selected_devices()  # none here: asv records them all as skips
    dotted = r"\w+(?:\.\w+)+"
    args = [a for w in wanted or [""] for a in ("--bench", selection_regex(rf"(?=.*?(?:{w})){dotted}", devices))]
    return args, f"--bench <{' or '.join(wanted) or 'all'}, the {' and '.join(devices)} combinations>"


def expected_torch(env: dict | None = None) -> str | None:
    """The torch version this asv environment names: $MATMUL_DRIFT_EXPECT_TORCH, else the
    ``torch<version>`` part of $ASV_ENV_NAME (asv mangles ``2.13.0+cpu`` to ``2.13.0``)."""
    import os
    import re

    env = os.environ if env is None else env
    if env.get(TORCH_VAR):
        return env[TORCH_VAR]
    m = re.search(r"(?:^|-)torch(?:==)?([0-9][^-]*)", env.get("ASV_ENV_NAME", ""))  # "==2.13.0" in the matrix
    return m.group(1) if m else None


def check_torch(version: str, env: dict | None = None) -> None:
    """Fail loudly when the running torch is not the one the environment names."""
    want = expected_torch(env)
    if want and version.split("+", 1)[0] != want.split("+", 1)[0]:
        raise RuntimeError(
            f"this environment names torch {want} but torch {version} is installed: "
            "the project's own install must not replace the matrix's torch"
        )


def selected_budget() -> float | None:
    """$MATMUL_DRIFT_BUDGET in seconds (a positive number), or None: no budget."""
    import os

    raw = os.environ.get(BUDGET_VAR, "").strip()
    if not raw:
        return None
    try:
        budget = float(raw)
    except ValueError:
        budget = math.nan
    if not 0 < budget < math.inf:
        raise ValueError(f"${BUDGET_VAR} must be a positive number of seconds, not {raw!r}")
    return budget


def switched_on(var: str) -> bool:
    """$var (FIXES_VAR, ORDERS_VAR, MAPS_VAR): on unless "0"; a value other than 0, 1 or none fails
    loudly here, not as a silent choice."""
    import os

    value = os.environ.get(var, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"${var} is 0 (off) or 1 (on), not {value!r}")
    return value != "0"


def check_selection() -> None:
    """ValueError naming the first $MATMUL_DRIFT_* setting the suite would refuse, so that
    `matmul-drift run` and a night refuse it in one line before asv starts, rather than record
    every benchmark as failed (a record that then stands in the way of a corrected run)."""
    selected_cases(), selected_precisions(), selected_devices(), selected_budget()
    switched_on(FIXES_VAR), switched_on(ORDERS_VAR), switched_on(MAPS_VAR)


def key(case: str, precision: str, device: str) -> str:
    return f"{case}|{precision}|{device}"


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
        return {"cuda_seconds": NAN, "cuda_q20_seconds": NAN, "cuda_q80_seconds": NAN, "cuda_clock_fell": NAN}
    q20, _, q80 = seconds.get("quantiles") or (NAN, NAN, NAN)
    clock = seconds.get("clocks")
    return {"cuda_seconds": seconds["median"], "cuda_q20_seconds": q20, "cuda_q80_seconds": q80,
            "cuda_clock_fell": NAN if not isinstance(clock, dict) or clock.get("fell") is None else float(clock["fell"])}


def measure_all(case_ids=None, precisions=None, devices=None, root=None, log=sys.stderr) -> dict:
    """Measure every combination; returns {key: values | {"skip": why} | {"error": text}}.
    values["failed"], where present, is {name: why} of the added values (``added``) that broke.
    With $MATMUL_DRIFT_BUDGET, no combination starts after that many seconds: the rest are
    skipped, and say why (the order probe, the fix finder and the maps come after, outside it).
    With $MATMUL_DRIFT_REUSE (jobs/reuse.py), trees, fix verdicts and maps of combinations whose
    ids equal that record's are confirmed, not measured again. Ends with a line of where the time went
    (``COST``). With $MATMUL_DRIFT_PROGRESS, every line also goes to that file."""
    import os

    path = os.environ.get(PROGRESS_VAR)
    if not path:
        return _measure_all(case_ids, precisions, devices, root, log)
    with open(path, "a", encoding="utf-8") as fh:
        return _measure_all(case_ids, precisions, devices, root, _Tee(log, fh))


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> None:
        for s in self.streams:
            s.write(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def _measure_all(case_ids, precisions, devices, root, log) -> dict:
    root = catalog.default_root() if root is None else root
    case_ids = selected_cases() if case_ids is None else case_ids
    out = {}
    import torch

    check_torch(torch.__version__)
    devices = selected_devices() if devices is None else devices
    precisions = selected_precisions() if precisions is None else precisions
    combos = [(c, p, d) for d in devices for c in case_ids for p in precisions]
    budget = selected_budget()
    record = _record(log)
    cost = {"reference": 0.0}
    t0 = time.monotonic()
    with memory.small_pages():
        for i, (c, p, d) in enumerate(combos, 1):
            if budget is not None and time.monotonic() - t0 > budget:
                out[key(c, p, d)] = {"skip": f"not measured: the budget of {budget:g} s (${BUDGET_VAR}) was spent"}
                status = "skip (budget)"
            else:
                out[key(c, p, d)], status = _measure_one(c, p, d, root, cost)
            print(f"[{i}/{len(combos)} {time.monotonic() - t0:6.1f}s] {c} {p} {d}: {status}", file=log, flush=True)
    cost["measuring"] = time.monotonic() - t0
    t1 = time.monotonic()
    cost["orders_reused"] = add_orders(out, root, log, record)
    cost["orders"], t2 = time.monotonic() - t1, time.monotonic()
    cost["fixes_reused"] = add_fixes(out, root, log, record)
    cost["fixes"], t3 = time.monotonic() - t2, time.monotonic()
    cost["maps_reused"] = add_maps(out, root, log, record)
    cost["maps"] = time.monotonic() - t3
    print(cost_line(cost, record[0] if record else None), file=log, flush=True)
    return out


COST = "matmul-drift cost:"  # the line scripts/bench_mainjob.py reads from asv's log


def cost_line(cost: dict, commit: str | None) -> str:
    """Where setup_cache's time went, in seconds, and what was reused (and from which commit)."""
    return (f"{COST} measuring {cost['measuring']:.1f} s (exact reference {cost['reference']:.1f} s), "
            f"orders {cost['orders']:.1f} s ({cost['orders_reused']} reused), fixes {cost['fixes']:.1f} s "
            f"({cost['fixes_reused']} reused), maps {cost['maps']:.1f} s ({cost['maps_reused']} reused)"
            + (f"; reused from {commit[:8]}" if commit else "; nothing to reuse"))


def _record(log) -> tuple[str, dict] | None:
    """The last recorded result that $MATMUL_DRIFT_REUSE names, as reuse.previous reads it; None
    where there is none or it cannot be read (a line says why: everything is measured afresh)."""
    from matmul_drift.jobs import reuse

    path = reuse.record_path()
    if path is None:
        return None
    try:
        return reuse.previous(path)
    except (OSError, ValueError) as exc:
        print(f"not reusing {path}: {exc}; measuring everything afresh", file=log, flush=True)
        return None


def _measure_one(c: str, p: str, d: str, root, cost: dict) -> tuple[dict, str]:
    """One combination's values (or {"skip": why}, {"error": text}) and its status word; adds
    the exact reference's seconds to cost["reference"]."""
    try:
        m = measure(cases.get(c), p, d, timing=(d == "cuda"))
        cost["reference"] += m.reference_seconds
        clock = (m.seconds or {}).get("clocks") or {}
        said = {True: f"; the GPU's clocks fell while timed: {clock.get('why')}",
                None: f"; note: {clock.get('why')}"}.get(clock.get("fell"), "") if clock else ""
        return track_values(m, root), "ok" + said
    except Unavailable as exc:
        return {"skip": str(exc)}, "skip"
    except Exception as exc:  # one broken case must not lose the others
        return {"error": "".join(traceback.format_exception_only(exc)).strip()}, "error"


def add_orders(out: dict, root, log=sys.stderr, record: tuple[str, dict] | None = None) -> int:
    """Adds ``order_id`` to every measured combination: the order-id (core/trees.py) of entry (0, 0)
    of the case's full product, revealed and replayed bit for bit (order.order_of); the
    id of the tree ``null`` where the readings fit no tree or the replay differs ("not
    revealed": a kernel whose order stops being a tree changes the id); NaN where the probe
    does not run (K beyond its range, or more matmul calls than order_plan.MAX_CALLS); a
    failure (``added``: asv null) where the probe itself broke. Where ``record`` (reuse.previous)
    has the combination's kernel, environment and input ids, its stored tree replays fresh draws
    instead ("reused from <commit>, confirmed"); one that does not, or cannot be read, is revealed
    afresh and the line says why. Returns how many trees were reused."""
    from matmul_drift.probes import order, order_plan, order_tree

    if not switched_on(ORDERS_VAR):
        return 0
    todo = [k for k, v in out.items() if "skip" not in v and "error" not in v]
    t0, memo, reused = time.monotonic(), {}, 0  # slice-n-view and slice-n-copy share their full product
    for i, k in enumerate(todo, 1):
        c, p, d = k.split("|")
        why = None
        try:
            t = order_plan.target(cases.get(c), p, d)
            # order_of's memo key
            key = (t.computation(), order_plan.MAX_CALLS, True) if record else None
            got, why = (None, None) if key is None or key in memo else _reused_tree(t, k, out[k], record, root)
            if got is not None:  # the same computation later is "the same as" this one, not reused again
                memo[key] = {**got, "confirmed": None, "same_as": t.label, "k": t.k}
            else:
                got = order.order_of(t, memo=memo)
        except (order_plan.ProbeError, Unavailable) as exc:
            got = {"probed": False, "reason": str(exc)}
        except Exception as exc:  # the probe must not lose the measurements made, nor pass for a skip
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
                what += (f" (the same computation as {got['same_as']})" if "same_as" in got else
                         f" ({got['adopted']}'s tree, replayed bit for bit: {got['calls']} calls)" if "adopted" in got
                         else f" ({got['calls']} calls)")
        what += f"; {why}" if why else ""
        print(f"[orders {i}/{len(todo)} {time.monotonic() - t0:6.1f}s] {c} {p} {d}: {what}", file=log, flush=True)
    return reused


def _reused_tree(t, k: str, values: dict, record: tuple[str, dict] | None, root) -> tuple[dict | None, str | None]:
    """(order_of's dict for the recorded tree, with ``confirmed`` saying so, or None; why it
    was not reused, or None where there was no record to reuse)."""
    from matmul_drift.core import trees, words
    from matmul_drift.jobs import reuse

    commit, order_id, entry, why = reuse.stored(values, record, k, "order_id", "orders", root, "the tree {ident}")
    if entry is None:
        return None, why
    ident = ids.hex_id(order_id)
    if entry.get("tree") is None or entry.get("k") != t.k:
        return None, f"measured afresh: {commit} recorded no tree of K = {t.k} ({ident})"
    seed = reuse.fresh_seed()
    r = reuse.confirm_tree(t, entry["tree"], seed)
    if r["matched"] != r["draws"]:
        return None, (f"the tree {ident} of {commit} matched {r['matched']} of {r['draws']} fresh draws "
                      f"(seed {seed}; first mismatch {r['first_mismatch']}): revealed afresh")
    tree = entry["tree"]
    return {"probed": True, "tree": tree, "order_id": ids.hex_id(trees.order_id(tree, t.k)),
            "summary": words.describe(tree), "calls": r["calls"],
            "confirmed": f"reused from {commit}, confirmed ({r['draws']} fresh draws replayed bit for bit, "
                         f"{r['calls']} call{'s' if r['calls'] != 1 else ''})"}, None


def add_maps(out: dict, root, log=sys.stderr, record: tuple[str, dict] | None = None) -> int:
    """Adds ``map_id`` to every measured combination of a batched case (MAP_CASES): the id of the
    catalog "maps" entry (batchmap.entry: every M's state as runs, and the words) of the case's
    batch-invariance map over M = 1..min(the case's M, batchmap.DEFAULT_TOP: 256 on the CPU, 512
    on CUDA; NATIVE_TOP where the CPU's full product ran torch's own loop), on the suite's own inputs,
    against the case's full product. NaN where the map
    cannot run (out of memory; ``$MATMUL_DRIFT_MAPS=0``: none at all), a failure (``added``: asv
    null) where it broke. Where ``record`` (reuse.previous) has the combination's kernel,
    environment and input ids, the stored map is confirmed instead: each run's first and last M
    measured again (batchmap_run.confirm; "reused from <commit>, confirmed"); one that does not
    hold, or cannot be read, is mapped afresh and the line says why. Returns how many maps were
    reused."""
    from matmul_drift.probes import batchmap, batchmap_run

    if not switched_on(MAPS_VAR):
        return 0
    todo = [k for k, v in out.items() if k.split("|")[0] in MAP_CASES and "skip" not in v and "error" not in v]
    t0, reused = time.monotonic(), 0
    for i, k in enumerate(todo, 1):
        c, p, d = k.split("|")
        why = None
        try:
            top = NATIVE_TOP if d == "cpu" and _native(out[k], root) else None
            rng = None if top is None else (1, min(top, cases.get(c).shape(d).m))
            mapper = batchmap_run.Mapper(batchmap_run.plan(c, None, None, rng, p, d))
            if int(mapper.checksum[: ids.ID_HEX_DIGITS], 16) != out[k]["input_id"]:
                raise RuntimeError(f"the map drew other inputs than the suite ({mapper.checksum[:12]})")
            got, why = _reused_map(mapper, k, out[k], record, root)
            if got is None:
                rec = batchmap_run.complete(mapper)
                got = {"entry": batchmap.entry(rec), "how": f"measured {rec['measured']} of {rec['range_size']} M"}
            else:
                reused += 1
            out[k]["map_id"] = float(catalog.store(root, "maps", got["entry"]))
            what = "; ".join(got["entry"]["words"].splitlines()[:2]) + f" ({got['how']})"
        except (batchmap.MapError, Unavailable) as exc:
            out[k]["map_id"], what = NAN, f"not mapped: {exc}"
        except Exception as exc:  # the map must not lose the measurements made, nor pass for a skip
            reason = "".join(traceback.format_exception_only(exc)).strip()
            out[k]["map_id"], what = NAN, f"failed: {reason}"
            out[k].setdefault("failed", {})["map_id"] = reason
        what += f"; {why}" if why else ""
        print(f"[maps {i}/{len(todo)} {time.monotonic() - t0:6.1f}s] {c} {p} {d}: {what}", file=log, flush=True)
    return reused


def _native(values: dict, root) -> bool:
    """Whether the combination's full product ran torch's own loop (its catalog kernel entry's
    route is "native"); False where the entry cannot be read."""
    from matmul_drift.probes import batchmap

    try:
        entry = catalog.load(root, "kernels", values["kernel_id"])
    except (catalog.MissingEntry, ValueError, KeyError):
        return False
    full = entry.get("full") if isinstance(entry, dict) else None
    return isinstance(full, list) and all(isinstance(k, str) for k in full) and batchmap.route(full) == "native"


def _reused_map(mapper, k: str, values: dict, record: tuple[str, dict] | None, root) -> tuple[dict | None, str | None]:
    """({"entry": the recorded map's catalog entry, "how": "reused from <commit>, confirmed (...)"},
    or None; why it was not reused, or None where there was no record to reuse)."""
    from matmul_drift.jobs import reuse
    from matmul_drift.probes import batchmap, batchmap_run

    commit, map_id, entry, why = reuse.stored(values, record, k, "map_id", "maps", root, "the map {ident}",
                                              "mapped afresh")
    if entry is None:
        return None, why
    ident = ids.hex_id(map_id)
    misfit = batchmap.entry_misfit(entry, mapper.plan.params)
    if misfit:
        return None, f"mapped afresh: the map {ident} of {commit} is {misfit}"
    r = batchmap_run.confirm(mapper, entry["verdicts"])
    if r["differ"]:
        m, was, now = r["differ"][0]
        return None, (f"the map {ident} of {commit} did not hold at {len(r['differ'])} of {len(r['sizes'])} M "
                      f"measured again (first M = {m}: recorded {_state_words(was)}, now {_state_words(now)}): "
                      "mapped afresh")
    return {"entry": entry, "how": f"reused from {commit}, confirmed ({len(r['sizes'])} M measured again, each "
                                   "run's first and last, in the same state)"}, None


def _state_words(s: tuple[str, bool, bool]) -> str:
    """(kernel-id, row 0 invariant?, rows invariant?) in words, for a line of the log."""
    return (f"kernel-id {s[0]}, row 0 {'invariant' if s[1] else 'drifting'}, "
            f"rows {'invariant' if s[2] else 'drifting'}")


def _drifts(values: dict) -> bool:
    return any(values[k] > 0 for k in ("slice_n_ulp", "slice_m_ulp", "run_to_run_ulp"))


def fix_entry(device: str, report: dict) -> dict:
    """The catalog text behind a fix-id: which drifts the combination has and each
    measured candidate's verdict (times left out: they are noise, the verdicts are bits)."""
    return {"device": device, "drifts": report["drifts"],
            "verdicts": {r["name"]: r["verdict"] for r in report["candidates"] if r["verdict"] != "not applicable"}}


def add_fixes(out: dict, root, log=sys.stderr, record: tuple[str, dict] | None = None) -> int:
    """Adds ``fix_cost`` and ``fix_id`` to every measured combination of ``out``.

    fix_cost: the time of the cheapest candidate (probes/fixes.py) that removes every drift, over
    the default's (a ratio), NaN where none does; 1.0 where there is no drift to remove.
    fix_id: the id of ``fix_entry``. The drifting combinations go through the fix finder
    together: one fresh process for the default and the code changes, one per setting. Where
    ``record`` (reuse.previous) has a drifting combination's kernel, environment and input ids
    and a fix that removed its drifts, only the recorded removers are tried, in one such run,
    untimed ("reused from <commit>, confirmed": the same drifts, each still removed; fix_cost
    the record's, a timing ratio nothing flags, timed again whenever the verdicts are measured
    afresh); otherwise, or where that fails, every candidate is tried. Returns how many verdicts
    were reused."""
    from matmul_drift.probes import fixes

    if not switched_on(FIXES_VAR):
        return 0
    todo = [k for k, v in out.items() if "skip" not in v and "error" not in v and _drifts(v)]
    for k, v in out.items():
        if "skip" not in v and "error" not in v and k not in todo:
            v.update(fix_cost=1.0, fix_id=float(catalog.store(root, "fixes", fix_entry(k.split("|")[2],
                                                                                        {"drifts": [], "candidates": []}))))
    if not todo:
        return 0
    isa = fixes.onednn_isa_in_force()
    held = _stored_fixes(todo, out, record, root, log)
    afresh = [k for k in todo if k not in held]
    if held:
        commit = record[0][:8]
        reports = _try_fixes([{**_fix_spec(k), "only": held[k][1], "untimed": True} for k in held], isa,
                             "confirming recorded fixes", log)
        for (k, (fid, names, drifts, cost)), report in zip(held.items(), reports):
            kept = {r["name"] for r in report["candidates"] if r["verdict"] == "removes"}
            if "failed" not in report and report["drifts"] == drifts and kept == set(names):
                out[k].update(fix_cost=cost, fix_id=fid)
                print(f"fixes of {k}: reused from {commit}, confirmed ({', '.join(names)} still "
                      f"{'removes' if len(names) == 1 else 'remove'} {', '.join(drifts)} in one run; fix cost as recorded)",
                      file=log, flush=True)
            else:
                why = report.get("failed") or (f"drifts now {', '.join(report['drifts']) or 'none'}, were {', '.join(drifts)}"
                                               if report["drifts"] != drifts else
                                               f"still removing: {', '.join(sorted(kept)) or 'none'} of {', '.join(names)}")
                print(f"fixes of {k}: the verdicts of {commit} did not hold ({why}): measured afresh", file=log, flush=True)
                afresh.append(k)
    if afresh:
        reports = _try_fixes([_fix_spec(k) for k in afresh], isa, f"{len(afresh)} drifting combination(s)", log)
        for k, report in zip(afresh, reports):
            _record_fixes(out, k, report, root, log)
    return len(todo) - len(afresh)


def _fix_spec(k: str) -> dict:
    c, p, d = k.split("|")
    case = cases.get(c)
    return {"case": c, "dtype": p, "device": d, "slice_n": list(case.slice_n),
            "slice_m": list(case.slice_m), "repeat": case.repeat}


def _try_fixes(specs: list[dict], isa, what: str, log) -> list[dict]:
    """fixfind.try_fixes_many over ``specs`` (the suite's lean mode), its progress in ``log``."""
    from matmul_drift.probes import fixfind

    t0 = time.monotonic()

    def progress(step: str, done: int, total: int) -> None:
        print(f"[fixes {done}/{total} {time.monotonic() - t0:6.1f}s] {what}: {step}", file=log, flush=True)

    return fixfind.try_fixes_many(specs, isa, progress=progress, lean=True)


def _stored_fixes(todo: list[str], out: dict, record, root, log) -> dict[str, tuple[float, list[str], list[str], float]]:
    """{key: (fix_id, the recorded removers, the recorded drifts, the recorded fix_cost)} of the
    drifting combinations ``record`` may stand for; a line for each that has a record but cannot
    use it."""
    from matmul_drift.jobs import reuse

    held = {}
    for k in todo if record else ():
        commit, fix_id, entry, why = reuse.stored(out[k], record, k, "fix_id", "fixes", root, "the verdicts")
        if entry is None:
            if why:
                print(f"fixes of {k}: {why}", file=log, flush=True)
            continue
        names = reuse.removers(entry)
        if not names or entry.get("device") != k.split("|")[2]:
            print(f"fixes of {k}: measured afresh: {commit} recorded no fix that removes its drifts on "
                  f"{k.split('|')[2]}", file=log, flush=True)
            continue
        cost = record[1][k].get("fix_cost", NAN)
        if not cost > 0:  # NaN too: no cost to carry over (the removers went untimed that run)
            print(f"fixes of {k}: measured afresh: no fix cost recorded at {commit}", file=log, flush=True)
            continue
        held[k] = (fix_id, names, sorted(entry.get("drifts", [])), cost)
    return held


def _record_fixes(out: dict, k: str, report: dict, root, log) -> None:
    if "failed" in report:  # asv null, not NaN: a crash or a timeout is no skip
        out[k].update(fix_cost=NAN, fix_id=NAN)
        out[k].setdefault("failed", {}).update(fix_cost=report["failed"], fix_id=report["failed"])
        print(f"fixes of {k}: {report['failed']}", file=log, flush=True)
        return
    cheapest = next((r for r in report["candidates"] if r["name"] == report["cheapest"]), None)
    out[k].update(fix_cost=NAN if cheapest is None else float(cheapest["time_ratio"]),
                  fix_id=float(catalog.store(root, "fixes", fix_entry(k.split("|")[2], report))))


def added(values: dict, name: str) -> float:
    """A value add_orders, add_fixes or add_maps adds: NaN (asv: skipped) where it was not added,
    as where $MATMUL_DRIFT_ORDERS=0; RuntimeError (asv: failed) where adding it broke."""
    if name in values.get("failed", {}):
        raise RuntimeError(values["failed"][name])
    return values.get(name, NAN)


def lookup(cache: dict, case: str, precision: str, device: str) -> dict:
    """The values of one combination; NotImplementedError (asv: skipped) or RuntimeError (failed)."""
    entry = cache.get(key(case, precision, device))
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
    import torch

    check_torch(torch.__version__)
    if case not in selected_cases() or precision not in selected_precisions() or device not in selected_devices():
        raise NotImplementedError(f"not selected by ${SUBSET_VAR}, ${PRECISIONS_VAR} or ${DEVICES_VAR}")
    if device != "cpu":
        raise NotImplementedError("CUDA time is recorded by track_cuda_seconds with CUDA events")
    return cpu_product(case, precision)
