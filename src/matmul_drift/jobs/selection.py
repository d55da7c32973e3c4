"""What the suite measures, read without torch: the ``MATMUL_DRIFT_*`` settings read once into a
frozen ``Selection``, its cells, and the `asv run --bench` arguments that pick them.

`matmul-drift run` and a night read it to refuse a bad setting in one line before asv starts;
the suite (jobs/suite.py) reads it once per setup_cache.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Mapping, NamedTuple

from matmul_drift.core import numerics
from matmul_drift.core.cases import CASE_IDS, DEVICES, PRECISIONS

CASES_VAR = "MATMUL_DRIFT_CASES"  # comma list of case ids: run only these (tests, quick nights)
DEVICES_VAR = "MATMUL_DRIFT_DEVICES"  # comma list of devices to measure (a GPU check: cuda)
PRECISIONS_VAR = "MATMUL_DRIFT_PRECISIONS"  # comma list of precisions, in the order to measure
FIXES_VAR = "MATMUL_DRIFT_FIXES"  # "0": no fix finder (fix_cost, fix_id NaN): quicker runs
ORDERS_VAR = "MATMUL_DRIFT_ORDERS"  # "0": no order probe (order_id NaN)
MAPS_VAR = "MATMUL_DRIFT_MAPS"  # "0": no batch-invariance maps (map_id NaN)
# seconds: start no measurement after them (a GPU check's fixed slot)
BUDGET_VAR = "MATMUL_DRIFT_BUDGET"
TORCH_VAR = "MATMUL_DRIFT_EXPECT_TORCH"  # the torch version an `existing` environment must hold
# a file measure_all also writes its progress to: asv keeps a setup_cache's output only where it
# fails
PROGRESS_VAR = "MATMUL_DRIFT_PROGRESS"
COST = "matmul-drift cost:"  # the suite's last line, which the main job reads from asv's log
GPU_DRIVERS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")  # NVIDIA's and ROCm's


class Cell(NamedTuple):
    """One combination the suite measures, as asv's three parameters name it."""

    case: str
    precision: str
    device: str

    def __str__(self) -> str:  # the log's name of a cell
        return f"{self.case}|{self.precision}|{self.device}"


@dataclass(frozen=True)
class Selection:
    """The suite's settings: which cells, a budget in seconds (None: none) and which added
    values (the fix finder, the order probe, the maps) run."""

    cases: tuple[str, ...] = CASE_IDS
    precisions: tuple[str, ...] = PRECISIONS
    devices: tuple[str, ...] = DEVICES
    budget: float | None = None
    fixes: bool = True
    orders: bool = True
    maps: bool = True

    def cells(self) -> list[Cell]:
        """Every selected cell, in the order measured: device, then case, then precision."""
        return [Cell(c, p, d) for d in self.devices for c in self.cases for p in self.precisions]


def read(env: Mapping[str, str] | None = None) -> Selection:
    """The Selection that ``env`` (default: os.environ) sets; ValueError naming the first
    setting the suite would refuse, so that `matmul-drift run` and a night refuse it in one line
    before asv starts, rather than record every benchmark as failed."""
    env = os.environ if env is None else env
    return Selection(
        cases=_listed(env, CASES_VAR, CASE_IDS, "cases"),
        precisions=_listed(env, PRECISIONS_VAR, PRECISIONS, "precisions"),
        devices=_listed(env, DEVICES_VAR, DEVICES, "devices"),
        budget=_budget(env),
        fixes=_switch(env, FIXES_VAR), orders=_switch(env, ORDERS_VAR), maps=_switch(env, MAPS_VAR),
    )


def _listed(env: Mapping[str, str], var: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """The comma list in ``$var``, in its order, or all of ``known`` where it is empty; a
    name not in ``known`` fails loudly here, not as a silent empty run."""
    wanted = tuple(w.strip() for w in env.get(var, "").split(",") if w.strip())
    bad = [w for w in wanted if w not in known]
    if bad:
        raise ValueError(f"${var} names unknown {what}: {', '.join(bad)}; "
                         f"known {what}: {', '.join(known)}")
    return wanted or known


def _budget(env: Mapping[str, str]) -> float | None:
    """$MATMUL_DRIFT_BUDGET in seconds (a positive number), or None: no budget."""
    raw = env.get(BUDGET_VAR, "").strip()
    if not raw:
        return None
    try:
        budget = float(raw)
    except ValueError:
        budget = math.nan
    if not 0 < budget < math.inf:
        raise ValueError(f"${BUDGET_VAR} must be a positive number of seconds, not {raw!r}")
    return budget


def _switch(env: Mapping[str, str], var: str) -> bool:
    """$var: on unless "0"; a value other than 0, 1 or none fails loudly here, not as a silent
    choice."""
    value = env.get(var, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"${var} is 0 (off) or 1 (on), not {value!r}")
    return value != "0"


def devices_here(sel: Selection) -> tuple[str, ...]:
    """The selected devices this machine can measure, known without torch: cuda only where a
    GPU driver is loaded (one of GPU_DRIVERS); without one no torch build sees a GPU, and every
    cuda combination skips."""
    driver = any(os.path.exists(p) for p in GPU_DRIVERS)
    return tuple(d for d in sel.devices if d != "cuda" or driver)


def selection_regex(benchmarks: str, sel: Selection, devices: tuple[str, ...] | None = None) -> str:
    """An `asv run --bench` regex for the benchmarks whose dotted names ``benchmarks`` matches
    from the start, at the (case, dtype, device) combinations ``sel`` measures on ``devices``
    (default: the selected ones); a CUDA-only precision is left out on the CPU.
    asv names each combination ``name('case', 'dtype', 'device')`` and records the others as
    NaN, as a skip, but without a process for each: a skip costs a fork of asv's forkserver,
    which holds torch; without a GPU, 1296 of a build's 1944 combinations skip."""

    def any_of(names) -> str:
        return "|".join(re.escape(repr(n)) for n in names)

    def on(d: str) -> str:
        kept = (p for p in sel.precisions if d == "cuda" or p not in numerics.TF32)
        return f"(?:{any_of(kept)}), {any_of([d])}"

    per_device = "|".join(on(d) for d in (sel.devices if devices is None else devices))
    return rf"^(?:{benchmarks})\(({any_of(sel.cases)}), (?:{per_device})\)$"


def bench_args(wanted: list[str], sel: Selection | None = None) -> tuple[list[str], str]:
    """`asv run`'s --bench arguments for the benchmarks the regexes ``wanted`` name (as asv
    searches a name with its parameters; none: all), at the combinations this machine measures
    (``selection_regex`` on ``devices_here``; ``sel`` default: ``read()``), and the same in
    words for a log line."""
    sel = read() if sel is None else sel
    devices = devices_here(sel) or sel.devices  # none here: asv records them all as skips
    dotted = r"\w+(?:\.\w+)+"
    args = [a for w in wanted or [""]
            for a in ("--bench", selection_regex(rf"(?=.*?(?:{w})){dotted}", sel, devices))]
    words = f"--bench <{' or '.join(wanted) or 'all'}, the {' and '.join(devices)} combinations>"
    return args, words


def expected_torch(env: Mapping[str, str] | None = None) -> str | None:
    """The torch version this asv environment names: $MATMUL_DRIFT_EXPECT_TORCH, else the
    ``torch<version>`` part of $ASV_ENV_NAME (asv mangles ``2.13.0+cpu`` to ``2.13.0``)."""
    env = os.environ if env is None else env
    if env.get(TORCH_VAR):
        return env[TORCH_VAR]
    # "==2.13.0" in the matrix
    m = re.search(r"(?:^|-)torch(?:==)?([0-9][^-]*)", env.get("ASV_ENV_NAME", ""))
    return m.group(1) if m else None


def check_torch(version: str, env: Mapping[str, str] | None = None) -> None:
    """Fail loudly when the running torch is not the one the environment names."""
    want = expected_torch(env)
    if want and version.split("+", 1)[0] != want.split("+", 1)[0]:
        raise RuntimeError(
            f"this environment names torch {want} but torch {version} is installed: "
            "the project's own install must not replace the matrix's torch"
        )
