"""Confirm before alarm: a suspected timing change measured again, now, on this machine, both
sides interleaved in fresh processes, each with the settings its result recorded (the torch
build's interpreter, its thread count, the environment variables that choose routes).

Load on the machine weighs on both sides alike; a change is confirmed only when every round is
beyond the factor in one direction. Times are seconds; a ratio is after / before.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field

from matmul_drift.core.routes import ROUTE_VARS

ROUNDS = 3  # interleaved rounds: before, after, then after, before, ...
SAMPLES = 10  # timed calls of a cell in one process, at most
BUDGET_S = 1.0  # a cell's timed calls stop after this many seconds (3 calls at least)
TIMEOUT_S = 600  # one process, all its cells

# The child: each cell's median time, in one process with one side's settings. A cell that
# cannot run here is null.
_CHILD = (r"""
import json, statistics, sys, time
import torch
from matmul_drift.measure.measure import cpu_product
cells, threads, samples, budget = json.loads(sys.argv[1]), int(sys.argv[2]), """
          r"""int(sys.argv[3]), float(sys.argv[4])
if threads > 0:
    torch.set_num_threads(threads)
out = []
for case, dtype in cells:
    try:
        call = cpu_product(case, dtype)
    except NotImplementedError:
        out.append(None)
        continue
    call()  # first call: page faults, a kernel's JIT; asv's warm-up likewise leaves it out
    times, t0 = [], time.perf_counter()
    while len(times) < samples and (len(times) < 3 or time.perf_counter() - t0 < budget):
        s = time.perf_counter()
        call()
        times.append(time.perf_counter() - s)
    out.append(statistics.median(times))
print(json.dumps({"threads": torch.get_num_threads(), "seconds": out}))
""")


@dataclass(frozen=True)
class Setting:
    """How one side ran: its interpreter, torch's thread count (0: torch's default) and the
    route variables it recorded (routes.ROUTE_VARS; any other is unset here)."""

    python: str
    threads: int = 0
    env_vars: tuple[tuple[str, str], ...] = ()

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in ROUTE_VARS}
        env.update(self.env_vars)
        return env


@dataclass
class Check:
    """One suspected change of a CPU cell (case, dtype) from ``before`` to ``after``: ``slower``
    is its direction, ``factor`` the ratio it must exceed (or fall below 1/factor)."""

    case: str
    dtype: str
    before: Setting
    after: Setting
    slower: bool
    factor: float
    seconds: dict[str, list] = field(default_factory=lambda: {"before": [], "after": []})


def verdict(check: Check) -> dict:
    """The check's outcome from its timings: the ratio of each round (after / before), and
    "confirmed" only when every round is beyond the factor in one direction ("slower" or
    "faster": the one measured now, which a side recorded under load may have hidden)."""
    pairs = [(b, a) for b, a in zip(check.seconds["before"], check.seconds["after"]) if b and a]
    ratios = [a / b for b, a in pairs]
    direction = None
    if len(ratios) < len(check.seconds["before"]) or not ratios:
        outcome = "not measured"
    elif all(r > check.factor for r in ratios) or all(r < 1 / check.factor for r in ratios):
        outcome, direction = "confirmed", "slower" if ratios[0] > 1 else "faster"
    else:
        outcome = "refuted"
    return {"verdict": outcome, "direction": direction, "ratios": [round(r, 4) for r in ratios],
            "rounds": len(check.seconds["before"])}


def run(checks: list[Check], rounds: int = ROUNDS, progress=None,
        env: dict | None = None) -> list[dict]:
    """Measure every check's two sides in ``rounds`` interleaved rounds: one process per setting
    and round, timing all of that setting's cells; the order of the settings turns each round.
    Returns one record per check (verdict's, with the seconds and each side's threads)."""
    base = dict(os.environ if env is None else env)
    groups: dict[Setting, list[tuple[str, str]]] = {}
    for c in checks:
        for s in (c.before, c.after):
            cells = groups.setdefault(s, [])
            if (c.case, c.dtype) not in cells:
                cells.append((c.case, c.dtype))
    order = list(groups)
    seen_threads: dict[Setting, int] = {}
    errors: list[str] = []
    total, done = rounds * len(order), 0
    for r in range(rounds):
        got: dict[Setting, dict] = {}
        for s in order if r % 2 == 0 else order[::-1]:
            if progress:
                progress(f"round {r + 1} of {rounds}, {len(groups[s])} cells", done, total)
            got[s] = _measure(s, groups[s], base)
            seen_threads[s] = got[s]["threads"]
            errors += [got[s]["error"]] if "error" in got[s] else []
            done += 1
        for c in checks:
            for side, s in (("before", c.before), ("after", c.after)):
                c.seconds[side].append(got[s]["seconds"][groups[s].index((c.case, c.dtype))])
    return [{**verdict(c), "seconds": c.seconds,
             "threads": {"before": seen_threads.get(c.before), "after": seen_threads.get(c.after)},
             **({"errors": list(dict.fromkeys(errors))} if errors else {})} for c in checks]


def _measure(s: Setting, cells: list[tuple[str, str]], base: dict) -> dict:
    """One fresh process with setting ``s``: {"threads", "seconds": [median or None per cell]},
    and "error" (one line) where the process gave nothing."""
    args = [s.python, "-c", _CHILD, json.dumps(cells), str(s.threads), str(SAMPLES), str(BUDGET_S)]
    failed = {"threads": None, "seconds": [None] * len(cells)}
    try:
        p = subprocess.run(args, capture_output=True, text=True, env=s.environ(base),
                           timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {**failed, "error": f"{s.python}: {exc}"}
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
        return {"threads": out["threads"], "seconds": list(out["seconds"])}
    except (ValueError, KeyError, IndexError, TypeError):
        why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return {**failed, "error": f"{s.python}: {why}"}
