"""Confirm before alarm, for the main job: the timing changes its run suspects (summary's
"suspects") are measured again now, both sides interleaved (probes/confirm.py), and the
verdicts kept under ``results/confirm/<machine>/<commit8>-<time>.json``, which the summary reads.

A record is never rewritten: each run adds a file. Seconds throughout.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from matmul_drift.probes import confirm
from matmul_drift.read import flags, history, rules, summary
from matmul_drift.read.history import CONFIRM
from matmul_drift.store import atomic

# the series asv times; CUDA's own timing has no second process to ask
TIME = "timing.Time.time_matmul"


def env_python(repo: Path, conf: dict, env_name: str) -> Path:
    """The interpreter of asv's environment ``env_name``: in the folder asv gives it under the
    config's environment type, or where asv's plain virtualenv kept it (the md5 of the name)."""
    env_dir = Path(conf.get("env_dir") or ".asv/env")
    env_dir = env_dir if env_dir.is_absolute() else repo / env_dir
    folder = hashlib.md5(env_name.encode("utf-8")).hexdigest()
    if conf.get("environment_type"):
        # here, not at the top: importing asv is slow, and every command's parser imports this
        from asv import environment, util

        # here, not at the top: importing asv is slow, and every command's parser imports this
        from matmul_drift.jobs import asvenv
        try:
            envs = asvenv.environments({**conf, "env_dir": str(env_dir)})
            folder = next((e.dir_name for e in envs if e.name == env_name), folder)
        except (RuntimeError, util.UserError, environment.EnvironmentUnavailable):
            pass  # a config asv cannot read: the run that recorded the side could not have either
    return env_dir / folder / "bin" / "python"


def suspects(hist: history.History, machine: str, commit: str) -> list[flags.Flag]:
    """The CPU timing changes of ``machine``'s run at ``commit`` that no re-measurement has
    judged."""
    s = summary.summarise(hist.of(machine), summary.Options(at=commit, timing="suspects"))
    return [f for f in s.flags
            if f.kind == "timing" and f.benchmark == TIME and f.params.get("device") == "cpu"]


def _setting(repo: Path, conf: dict, hist: history.History, machine: str, side: flags.Side,
             params: dict) -> tuple[confirm.Setting | None, dict]:
    """The setting one side ran with (its interpreter, threads, route variables), as recorded."""
    run = next(r for r in hist.runs[machine] if r.commit == side.commit and r.env_name == side.env)
    entry = hist.env_entry(run, params) or {}
    env_vars = {str(k): str(v) for k, v in (entry.get("env_vars") or {}).items()}
    threads = entry.get("threads") if isinstance(entry.get("threads"), int) else 0
    python = env_python(repo, conf, side.env)
    recorded = {"commit": side.commit, "env": side.env, "value": side.value, "threads": threads,
                "env_vars": env_vars, "python": str(python)}
    if not python.is_file():
        return None, recorded
    return confirm.Setting(str(python), threads, tuple(sorted(env_vars.items()))), recorded


def run(repo: Path, conf: dict, machine: str, commit: str, hist: history.History, log,
        factor: float = summary.DEFAULT_TIME_FACTOR) -> Path | None:
    """Re-measure what the run at ``commit`` suspects; the record's path, or None when nothing
    was suspected. ``log(line)`` says what is measured."""
    found = suspects(hist, machine, commit)
    if not found:
        return None
    checks, records = [], []
    for f in found:
        (sb, rb), (sa, ra) = (_setting(repo, conf, hist, machine, s, f.params)
                              for s in (f.before, f.after))
        rec = {"benchmark": f.benchmark, "params": dict(f.params), "before": rb, "after": ra,
               "factor": factor, "slower": f.direction == "slower"}
        if sb is None or sa is None:
            records.append({**rec, "verdict": "not measured", "ratios": [], "rounds": 0,
                            "errors": ["the environment of a side is gone"]})
            continue
        checks.append(confirm.Check(f.params["case"], f.params["dtype"], sb, sa, rec["slower"],
                                    factor))
        records.append(rec)
    cells = (", ".join(f"{c.case} {c.dtype}" for c in checks[:4])
             + (", ..." if len(checks) > 4 else ""))
    log(f"confirming {len(found)} suspected timing change{'s' * (len(found) != 1)} ({cells}): "
        f"{confirm.ROUNDS} rounds, both sides interleaved in fresh processes")
    done = iter(confirm.run(checks, progress=lambda what, k, n:
                            log(f"  re-measuring: {what} ({k + 1} of {n})")))
    records = [r if r.get("verdict") == "not measured" else {**r, **next(done)} for r in records]
    for r in records:
        p = r["params"]
        log(f"  {p['case']} {p['dtype']}: {rules.confirmed_text(r)}; {r['verdict']}")
    now = datetime.now(timezone.utc)
    doc = {"version": 1, "machine": machine, "commit": commit,
           "measured": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "load": list(os.getloadavg()),
           "checks": records}
    path = (repo / "results" / CONFIRM / machine
            / f"{commit[:8]}-{now.strftime('%Y%m%dT%H%M%S%fZ')}.json")
    atomic.write_new(path, (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode())
    return path
