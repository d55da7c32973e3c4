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

from matmul_drift.core import cases, ids
from matmul_drift.measure.measure import Unavailable, cpu_product, kernel_entry, measure
from matmul_drift.store import catalog

NAN = float("nan")
SUBSET_VAR = "MATMUL_DRIFT_CASES"  # comma list of case ids: run only these (tests, quick nights)


DEVICES_VAR = "MATMUL_DRIFT_DEVICES"  # comma list of devices to measure (a GPU check: cuda)
PRECISIONS_VAR = "MATMUL_DRIFT_PRECISIONS"  # comma list of precisions, in the order to measure them
FIXES_VAR = "MATMUL_DRIFT_FIXES"  # "0": no fix finder (fix_cost, fix_id NaN): quicker runs
ORDERS_VAR = "MATMUL_DRIFT_ORDERS"  # "0": no order probe (order_id NaN)
BUDGET_VAR = "MATMUL_DRIFT_BUDGET"  # seconds: start no measurement after them (a GPU check's fixed slot)
TORCH_VAR = "MATMUL_DRIFT_EXPECT_TORCH"  # the torch version an `existing` environment must hold


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


def selection_regex(benchmarks: str) -> str:
    """An `asv run --bench` regex for the Drift benchmarks whose names match ``benchmarks``
    (a regex), at the (case, dtype, device) combinations this selection measures. asv
    names each combination ``name('case', 'dtype', 'device')`` and records the others as NaN
    without a process for each: a skip still costs a fork, some 20 to 30 ms here, and a
    run of the 13 Drift benchmarks has 108 combinations each."""
    import re

    def any_of(names) -> str:
        return "|".join(re.escape(repr(n)) for n in names)

    return (rf"^(?:{benchmarks})\(({any_of(selected_cases())}), ({any_of(selected_precisions())}), "
            rf"({any_of(selected_devices())})\)$")


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
    """$var (FIXES_VAR, ORDERS_VAR): on unless "0"; a value other than 0, 1 or none fails
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
    switched_on(FIXES_VAR), switched_on(ORDERS_VAR)


def key(case: str, precision: str, device: str) -> str:
    return f"{case}|{precision}|{device}"


def _worst(rows: list[dict]) -> float:
    return float(max(r["max_ulp"] for r in rows)) if rows else NAN


def track_values(m, root) -> dict:
    """The numbers asv records for one Measurement; stores its catalog entries under ``root``."""
    kid = catalog.store(root, "kernels", kernel_entry(m.device, m.kernels))
    eid = catalog.store(root, "env", m.environment)
    assert kid == m.kernel_id and eid == m.env_id
    return {
        "error_u": NAN if m.error_u is None else m.error_u,
        "nonfinite": float(m.nonfinite["product"]),
        "gamma_k_u": NAN if m.gamma_k_u is None else m.gamma_k_u,
        "slice_n_ulp": _worst(m.slice_n),
        "slice_m_ulp": _worst(m.slice_m),
        "run_to_run_ulp": float(m.run_to_run["max_ulp"]),
        "kernel_id": float(m.kernel_id),
        "env_id": float(m.env_id),
        "input_id": float(int(m.input_checksum[: ids.ID_HEX_DIGITS], 16)),
        "cuda_seconds": NAN if m.seconds is None or m.device != "cuda" else m.seconds["median"],
    }


def measure_all(case_ids=None, precisions=None, devices=None, root=None, log=sys.stderr) -> dict:
    """Measure every combination; returns {key: values | {"skip": why} | {"error": text}}.
    values["failed"], where present, is {name: why} of the added values (``added``) that broke.
    With $MATMUL_DRIFT_BUDGET, no combination starts after that many seconds: the rest are
    skipped, and say why (the order probe and the fix finder come after, outside it)."""
    root = catalog.default_root() if root is None else root
    case_ids = selected_cases() if case_ids is None else case_ids
    out = {}
    import torch

    check_torch(torch.__version__)
    devices = selected_devices() if devices is None else devices
    precisions = selected_precisions() if precisions is None else precisions
    combos = [(c, p, d) for d in devices for c in case_ids for p in precisions]
    budget = selected_budget()
    t0 = time.monotonic()
    for i, (c, p, d) in enumerate(combos, 1):
        if budget is not None and time.monotonic() - t0 > budget:
            out[key(c, p, d)] = {"skip": f"not measured: the budget of {budget:g} s (${BUDGET_VAR}) was spent"}
            status = "skip (budget)"
        else:
            out[key(c, p, d)], status = _measure_one(c, p, d, root)
        print(f"[{i}/{len(combos)} {time.monotonic() - t0:6.1f}s] {c} {p} {d}: {status}", file=log, flush=True)
    add_orders(out, root, log)
    add_fixes(out, root, log)
    return out


def _measure_one(c: str, p: str, d: str, root) -> tuple[dict, str]:
    """One combination's values (or {"skip": why}, {"error": text}) and its status word."""
    try:
        return track_values(measure(cases.get(c), p, d, timing=(d == "cuda")), root), "ok"
    except Unavailable as exc:
        return {"skip": str(exc)}, "skip"
    except Exception as exc:  # one broken case must not lose the others
        return {"error": "".join(traceback.format_exception_only(exc)).strip()}, "error"


def add_orders(out: dict, root, log=sys.stderr) -> None:
    """Adds ``order_id`` to every measured combination: the order-id (core/trees.py) of entry (0, 0)
    of the case's full product, revealed and replayed bit for bit (order.order_of); the
    id of the tree ``null`` where the readings fit no tree or the replay differs ("not
    revealed": a kernel whose order stops being a tree changes the id); NaN where the probe
    does not run (K beyond its range, or more matmul calls than order.MAX_CALLS); a
    failure (``added``: asv null) where the probe itself broke."""
    from matmul_drift.probes import order

    if not switched_on(ORDERS_VAR):
        return
    todo = [k for k, v in out.items() if "skip" not in v and "error" not in v]
    t0, memo = time.monotonic(), {}  # slice-n-view and slice-n-copy share their full product
    for i, k in enumerate(todo, 1):
        c, p, d = k.split("|")
        try:
            t = order.target(cases.get(c), p, d)
            got = order.order_of(t, memo=memo)
        except (order.ProbeError, Unavailable) as exc:
            got = {"probed": False, "reason": str(exc)}
        except Exception as exc:  # the probe must not lose the measurements made, nor pass for a skip
            got = {"probed": False, "reason": "".join(traceback.format_exception_only(exc)).strip()}
            out[k].setdefault("failed", {})["order_id"] = got["reason"]
        if not got["probed"]:
            out[k]["order_id"], what = NAN, f"not probed: {got['reason']}"
        else:
            out[k]["order_id"] = float(order.store(root, got["tree"], t.k))
            what = got["summary"] if got["tree"] is not None else f"not revealed: {got['reason']}"
            what += f" (the same computation as {got['same_as']})" if "same_as" in got else f" ({got['calls']} calls)"
        print(f"[orders {i}/{len(todo)} {time.monotonic() - t0:6.1f}s] {c} {p} {d}: {what}", file=log, flush=True)


def _drifts(values: dict) -> bool:
    return any(values[k] > 0 for k in ("slice_n_ulp", "slice_m_ulp", "run_to_run_ulp"))


def fix_entry(device: str, report: dict) -> dict:
    """The catalog text behind a fix-id: which drifts the combination has and each
    measured candidate's verdict (times left out: they are noise, the verdicts are bits)."""
    return {"device": device, "drifts": report["drifts"],
            "verdicts": {r["name"]: r["verdict"] for r in report["candidates"] if r["verdict"] != "not applicable"}}


def add_fixes(out: dict, root, log=sys.stderr) -> None:
    """Adds ``fix_cost`` and ``fix_id`` to every measured combination of ``out``.

    fix_cost: the time of the cheapest candidate (probes/fixes.py) that removes every drift, over
    the default's (a ratio), NaN where none does; 1.0 where there is no drift to remove.
    fix_id: the id of ``fix_entry``. The drifting combinations go through the fix finder
    together: one fresh process for the default and the code changes, one per setting."""
    from matmul_drift.probes import fixes, fixfind

    if not switched_on(FIXES_VAR):
        return
    todo = [k for k, v in out.items() if "skip" not in v and "error" not in v and _drifts(v)]
    for k, v in out.items():
        if "skip" not in v and "error" not in v and k not in todo:
            v.update(fix_cost=1.0, fix_id=float(catalog.store(root, "fixes", fix_entry(k.split("|")[2],
                                                                                        {"drifts": [], "candidates": []}))))
    if not todo:
        return
    specs = []
    for k in todo:
        c, p, d = k.split("|")
        case = cases.get(c)
        specs.append({"case": c, "dtype": p, "device": d, "slice_n": list(case.slice_n),
                      "slice_m": list(case.slice_m), "repeat": case.repeat})
    isa = fixes.onednn_isa_in_force()
    t0 = time.monotonic()

    def progress(what: str, done: int, total: int) -> None:
        print(f"[fixes {done}/{total} {time.monotonic() - t0:6.1f}s] {len(todo)} drifting combination(s): {what}",
              file=log, flush=True)

    for k, report in zip(todo, fixfind.try_fixes_many(specs, isa, progress=progress, lean=True)):
        if "failed" in report:  # asv null, not NaN: a crash or a timeout is no skip
            out[k].update(fix_cost=NAN, fix_id=NAN)
            out[k].setdefault("failed", {}).update(fix_cost=report["failed"], fix_id=report["failed"])
            print(f"fixes of {k}: {report['failed']}", file=log, flush=True)
            continue
        cheapest = next((r for r in report["candidates"] if r["name"] == report["cheapest"]), None)
        out[k].update(fix_cost=NAN if cheapest is None else float(cheapest["time_ratio"]),
                      fix_id=float(catalog.store(root, "fixes", fix_entry(k.split("|")[2], report))))


def added(values: dict, name: str) -> float:
    """A value add_orders or add_fixes adds: NaN (asv: skipped) where it was not added, as
    where $MATMUL_DRIFT_ORDERS=0; RuntimeError (asv: failed) where adding it broke."""
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
