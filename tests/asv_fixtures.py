"""Synthetic but format-correct asv results trees, for the summary's tests and its benchmark.

The layout and file contents follow asv 0.6.6 (``asv.results.Results.save``: results format
version 2, compact JSON with NaN for skipped and null for failed, rows trimmed of trailing
nulls; ``benchmarks.json`` version 2; ``machine.json`` version 1), and the catalog entries
are written with ``matmul_drift.store.catalog.store``.

Values are constant across commits and environments (identical kernels give identical bits),
except for timing, which jitters well inside its noise, so an unadjusted tree flags nothing.
``adjust(commit_index, env_index, data)`` may change a results file before it is written.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from matmul_drift.core import ids, series
from matmul_drift.probes import batchmap
from matmul_drift.probes.order_tree import store as store_order
from matmul_drift.store import catalog

RESULT_COLUMNS = [
    "result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
    "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile",
]
COL = {c: i for i, c in enumerate(RESULT_COLUMNS)}

# name -> (unit, asv type); the benchmarks the summary reads.
BENCHMARKS = {
    "drift.Drift.track_error_u": ("u", "track"),
    "drift.Drift.track_nonfinite": ("count", "track"),
    "drift.Drift.track_gamma_k_u": ("u-bound", "track"),
    "drift.Drift.track_slice_n_ulp": ("ulp", "track"),
    "drift.Drift.track_slice_m_ulp": ("ulp", "track"),
    "drift.Drift.track_run_to_run_ulp": ("ulp", "track"),
    "drift.Drift.track_kernel_id": ("kernel-id", "track"),
    "drift.Drift.track_env_id": ("env-id", "track"),
    "drift.Drift.track_input_id": ("input-id", "track"),
    "drift.Drift.track_cuda_seconds": ("seconds", "track"),
    "drift.Drift.track_cuda_q20_seconds": ("q20-seconds", "track"),
    "drift.Drift.track_cuda_q80_seconds": ("q80-seconds", "track"),
    "drift.Drift.track_cuda_clock_fell": ("clock-fell", "track"),
    "drift.Drift.track_fix_cost": ("ratio", "track"),
    "drift.Drift.track_fix_id": ("fix-id", "track"),
    "drift.Drift.track_order_id": ("order-id", "track"),
    "drift.Drift.track_map_id": ("map-id", "track"),
    "timing.Time.time_matmul": ("seconds", "time"),
}
ERROR_U = "drift.Drift.track_error_u"
NONFINITE = "drift.Drift.track_nonfinite"
GAMMA = "drift.Drift.track_gamma_k_u"
SLICE_N = "drift.Drift.track_slice_n_ulp"
SLICE_M = "drift.Drift.track_slice_m_ulp"
RUN_TO_RUN = "drift.Drift.track_run_to_run_ulp"
KERNEL = "drift.Drift.track_kernel_id"
ENV = "drift.Drift.track_env_id"
INPUT = "drift.Drift.track_input_id"
CUDA_SECONDS = "drift.Drift.track_cuda_seconds"
CUDA_Q20 = "drift.Drift.track_cuda_q20_seconds"
CUDA_Q80 = "drift.Drift.track_cuda_q80_seconds"
CLOCK_FELL = "drift.Drift.track_cuda_clock_fell"
FIX_COST = "drift.Drift.track_fix_cost"
FIX_ID = "drift.Drift.track_fix_id"
ORDER_ID = "drift.Drift.track_order_id"
MAP_ID = "drift.Drift.track_map_id"
BITS = "drift.Drift.track_bits_id"  # only in trees written with bits=True (results with a digest)
TIME = "timing.Time.time_matmul"

DTYPES = ("float64", "float32", "float16", "bfloat16", "float32-tf32", "float32-high")
PARAM_NAMES = ["case", "dtype", "device"]
K = 4096  # reduction length of the synthetic cases
_U = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
DAY_MS = 86_400_000
START_MS = 1_735_689_600_000  # 2025-01-01


@dataclass
class Tree:
    """What write_tree wrote. ``root`` is RESULTS_DIR (asv in root/asv, catalog in root/catalog)."""

    root: Path
    machine: str
    commits: list[str]
    dates: list[int]
    torch: list[str]
    env_names: list[str]
    params: list[list[str]]  # asv repr strings
    combos: list[dict[str, str]]  # display values, in asv's product order
    files: list[Path] = field(default_factory=list)
    benchmarks: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(BENCHMARKS))

    @property
    def asv_dir(self) -> Path:
        return self.root / "asv"

    @property
    def catalog_dir(self) -> Path:
        return self.root / "catalog"

    @property
    def machine_dir(self) -> Path:
        return self.asv_dir / self.machine

    def index(self, case: str, dtype: str, device: str) -> int:
        return self.combos.index({"case": case, "dtype": dtype, "device": device})

    def file(self, commit_index: int, env_index: int) -> Path:
        return self.machine_dir / f"{self.commits[commit_index][:8]}-{self.env_names[env_index]}.json"


def commit_hash(k: int) -> str:
    return hashlib.sha1(f"synthetic commit {k}".encode()).hexdigest()


def env_name(torch_version: str) -> str:
    return f"virtualenv-py3.11-torch{torch_version}"


def bench_version(name: str, salt: str = "") -> str:
    """A stand-in for asv's version: the sha256 of the benchmark's code."""
    return hashlib.sha256(f"{name}{salt}".encode()).hexdigest()


def default_kernel_names() -> list[str]:
    return ["MKL SGEMM(N,N) CNR:OFF NThr:2", "ampere_sgemm_64x32_sliced1x4_tn",
            "void splitKreduce_kernel<float, float, float, float>(cublasSplitKParams<float>, float const*)",
            "nvjet_tst_64x8_64x16_1x4_h_bz_splitK_bias_TNT"]


def env_entry(torch_version: str, device: str = "cpu", cuda_build: bool = False) -> dict:
    """An env catalog entry shaped like environment.py's (CUDA details only for cuda params)."""
    cuda = None if device == "cpu" else {"runtime": "13.0", "cublas": "13.0.0", "cudnn": "91000",
                                          "driver": "580.65", "gpu": "NVIDIA H200", "sm_count": 132}
    return {
        "torch": {"version": f"{torch_version}+{'cu130' if cuda_build else 'cpu'}",
                  "git": hashlib.sha1(torch_version.encode()).hexdigest()},
        "cuda": cuda,
        "cpu": {"model": "Synthetic CPU @ 2.0GHz", "capability": "AVX2"},
        "libs": {"mkl": "2024.2", "onednn": "3.12"},
        "threads": 2,
        "flags": {"allow_tf32": False, "float32_matmul_precision": "highest"},
        "env_vars": {},
        "method": dict(series.METHOD),  # as environment.describe records it
    }


def fix_entry(device: str, drifts: list[str], verdicts: dict | None = None) -> dict:
    """A fixes catalog entry shaped like suite.fix_entry's; a drifting one has two candidates
    that remove it and one that does not, unless ``verdicts`` ({name: verdict}) says otherwise."""
    if not drifts:
        return {"device": device, "drifts": [], "verdicts": {}}
    base = {"MKL_CBWR=AVX2": "removes", "full product, then slice": "removes", "one thread": "no effect"}
    return {"device": device, "drifts": drifts, "verdicts": {**base, **(verdicts or {})}}


MAP_TOP = 16  # the synthetic maps' range: M = 1..16


def map_run(lo: int, hi: int, row0: bool, rows: bool, kernel: str = "aaaaaaaaaaaa") -> dict:
    return {"lo": lo, "hi": hi, "kernel_id": kernel, "row0": row0, "rows": rows, "measured": 2}


def map_entry(case: str, dtype: str, device: str = "cpu", runs: list[dict] | None = None,
              words: str | None = None) -> dict:
    """A maps catalog entry shaped like batchmap.entry's, over M = 1..MAP_TOP. By default row 0 is
    invariant at M = 1..3 only and the rows at every M, under one kernel."""
    runs = runs or [map_run(1, 3, True, True), map_run(4, MAP_TOP, False, True)]
    return {"schema": batchmap.ENTRY_SCHEMA,
            "params": {"case": case, "op": "mm", "lo": 1, "hi": MAP_TOP, "m_full": MAP_TOP, "full": "case",
                       "k": K, "n": 64, "batch": None, "dtype": dtype, "device": device, "seed": 0},
            "verdicts": runs,
            "words": words or ("row 0 as at M = 1: invariant at M = 1..3; drifts elsewhere (max 2 ulp)\n"
                               f"rows as in the full product (M = {MAP_TOP}): invariant at every M, 1..{MAP_TOP}\n"
                               "kernels: one route at every M: aaaaaaaaaaaa (MKL SGEMM(N,N) CNR:OFF NThr:2)"),
            "measured": sorted({m for r in runs for m in (r["lo"], r["hi"])}), "range_size": MAP_TOP}


def bits_id(catalog_dir: Path, cell: str, moved: tuple[str, ...] = ()) -> int:
    """The bits-id of a catalog "bits" entry (part -> sha256, as measure.bits_digest writes) for
    ``cell``: the full product and one slice, each part in ``moved`` with other bits."""
    parts = {p: hashlib.sha256(f"{cell} {p} {'moved' if p in moved else ''}".encode()).hexdigest()
             for p in ("full", "slice_n=63")}
    return catalog.store(catalog_dir, "bits", parts)


def order_tree(how: str, k: int = 8):
    """A hand-built order over k products: "sequential" (left-deep) or "pairwise"."""
    parts = list(range(k))
    if how == "sequential":
        t = parts[0]
        for x in parts[1:]:
            t = [t, x]
        return t
    while len(parts) > 1:
        parts = [[parts[i], parts[i + 1]] for i in range(0, len(parts), 2)]
    return parts[0]


def _repr(values) -> list[str]:
    return [repr(v) for v in values]


def write_tree(
    root: Path | str,
    *,
    machine: str = "synthetic",
    n_commits: int = 3,
    torch_versions: tuple[str, ...] = ("2.13.0", "2.14.1"),
    cases: tuple[str, ...] = ("square", "tall"),
    dtypes: tuple[str, ...] = DTYPES,
    devices: tuple[str, ...] = ("cpu",),
    kernel_names: list[str] | None = None,
    adjust: Callable[[int, int, dict], None] | None = None,
    bits: bool = False,
) -> Tree:
    """Write benchmarks.json, machine.json, n_commits x len(torch_versions) results files and
    the catalog entries they name, under ``root`` (RESULTS_DIR layout). Returns the Tree.
    ``bits``: the results record each cell's output digest (track_bits_id), as results made
    since the digest do; without it, as results made before."""
    root = Path(root)
    names = kernel_names or default_kernel_names()
    params = [_repr(cases), _repr(dtypes), _repr(devices)]
    combos = [dict(zip(PARAM_NAMES, c)) for c in itertools.product(cases, dtypes, devices)]
    commits = [commit_hash(k) for k in range(n_commits)]
    tree = Tree(root, machine, commits, [START_MS + k * DAY_MS for k in range(n_commits)],
                list(torch_versions), [env_name(t) for t in torch_versions], params, combos)
    asv_dir, cat = tree.asv_dir, tree.catalog_dir
    tree.machine_dir.mkdir(parents=True, exist_ok=True)

    benchmarks = {"version": 2}
    tree.benchmarks = {**BENCHMARKS, BITS: ("bits-id", "track")} if bits else BENCHMARKS
    for name, (unit, kind) in tree.benchmarks.items():
        b = {"code": f"def {name.rsplit('.', 1)[1]}(self, case, dtype, device): ...", "name": name,
             "param_names": PARAM_NAMES, "params": params, "timeout": 600.0, "type": kind, "unit": unit,
             "version": bench_version(name)}
        if kind == "time":
            b.update({"number": 1, "repeat": 10, "min_run_count": 2, "rounds": 1, "sample_time": 0.01,
                      "warmup_time": -1})
        benchmarks[name] = b
    (asv_dir / "benchmarks.json").write_text(json.dumps(benchmarks, indent=4, sort_keys=True))
    (tree.machine_dir / "machine.json").write_text(json.dumps(
        {"arch": "x86_64", "cpu": "Synthetic CPU @ 2.0GHz", "machine": machine, "num_cpu": "2",
         "os": "Linux 6.1", "ram": "8000000", "version": 1}, indent=4, sort_keys=True))

    # Per-combination values that do not depend on commit or environment.
    kernel_ids: dict[tuple[str, str], int] = {}
    base: dict[str, list] = {n: [] for n in tree.benchmarks}
    for i, c in enumerate(combos):
        dtype, device = c["dtype"], c["device"]
        skipped = dtype == "float32-tf32" and device == "cpu"  # TF32 exists on CUDA only
        kkey = (dtype, device)
        if kkey not in kernel_ids:
            kernel_ids[kkey] = catalog.store(cat, "kernels", {
                "device": device, "full": ["aten::matmul", "aten::mm", names[len(kernel_ids) % len(names)]]})
        u = _U[dtype.split("-")[0]]
        nan = math.nan
        base[ERROR_U].append(nan if skipped else 0.05 + 0.01 * (i % 13))
        base[NONFINITE].append(nan if skipped else 0.0)
        base[GAMMA].append(nan if skipped or K * u >= 1 else K / (1 - K * u))
        base[SLICE_N].append(nan if skipped else (2.0 if i % 3 == 0 else 0.0))
        base[SLICE_M].append(nan if skipped else 0.0)
        base[RUN_TO_RUN].append(nan if skipped else 0.0)
        base[KERNEL].append(nan if skipped else kernel_ids[kkey])
        base[INPUT].append(nan if skipped else ids.text_id(f"inputs {c['case']} {dtype}"))
        drifts = ["slice_n"] if i % 3 == 0 else []
        base[FIX_ID].append(nan if skipped else catalog.store(cat, "fixes", fix_entry(device, drifts)))
        base[ORDER_ID].append(nan if skipped else store_order(cat, order_tree("sequential"), 8))
        base[MAP_ID].append(nan if skipped else catalog.store(cat, "maps", map_entry(c["case"], dtype, device)))
        if bits:
            base[BITS].append(nan if skipped else bits_id(cat, f"{c['case']} {dtype} {device}"))
        base[FIX_COST].append(nan if skipped else (1.25 if drifts else 1.0))
        base[CUDA_SECONDS].append(nan if device == "cpu" or skipped else 1e-4 * (1 + i % 5))
        base[CUDA_Q20].append(base[CUDA_SECONDS][-1] * 0.99)  # NaN stays NaN
        base[CUDA_Q80].append(base[CUDA_SECONDS][-1] * 1.01)
        base[CLOCK_FELL].append(nan if device == "cpu" or skipped else 0.0)
        base[TIME].append(nan if skipped else 1e-3 * (1 + 0.1 * (i % 7)))

    for ei, t in enumerate(torch_versions):
        env_ids = {d: catalog.store(cat, "env", env_entry(t, d, "cuda" in devices)) for d in devices}
        env_values = [math.nan if math.isnan(base[KERNEL][i]) else env_ids[c["device"]]
                      for i, c in enumerate(combos)]
        for ci, commit in enumerate(commits):
            data = _results_data(tree, ci, ei, base, env_values)
            if adjust is not None:
                adjust(ci, ei, data)
            tree.files.append(write_results(tree.machine_dir, data))
    return tree


def _results_data(tree: Tree, ci: int, ei: int, base: dict, env_values: list) -> dict:
    t = tree.torch[ei]
    started = tree.dates[ci] + DAY_MS // 2
    results = {}
    # Timing jitters by < 1 % from run to run: noise, never a flag at a 1.1 factor.
    jitter = 1 + ((ci * 7 + ei * 3) % 5 - 2) * 0.002
    for name, (unit, kind) in tree.benchmarks.items():
        values = env_values if name == ENV else base[name]
        row = [None] * len(RESULT_COLUMNS)
        row[COL["params"]] = tree.params
        row[COL["version"]] = bench_version(name)
        row[COL["started_at"]] = started
        row[COL["duration"]] = 1.5
        if kind == "time":
            vals = [v * jitter for v in values]
            row[COL["result"]] = vals
            row[COL["stats_ci_99_a"]] = [v * 0.97 if v == v else None for v in vals]
            row[COL["stats_ci_99_b"]] = [v * 1.03 if v == v else None for v in vals]
            row[COL["stats_q_25"]] = [v * 0.99 if v == v else None for v in vals]
            row[COL["stats_q_75"]] = [v * 1.01 if v == v else None for v in vals]
            row[COL["stats_number"]] = [1 if v == v else None for v in vals]
            row[COL["stats_repeat"]] = [10 if v == v else None for v in vals]
        else:
            row[COL["result"]] = values
        while row and row[-1] is None:  # as asv trims rows
            row.pop()
        results[name] = row
    return {
        "commit_hash": tree.commits[ci],
        "env_name": tree.env_names[ei],
        "date": tree.dates[ci],
        "params": {"arch": "x86_64", "cpu": "Synthetic CPU @ 2.0GHz", "machine": tree.machine,
                   "num_cpu": "2", "os": "Linux 6.1", "ram": "8000000", "python": "3.11", "torch": t},
        "python": "3.11",
        "requirements": {"torch": t},
        "env_vars": {},
        "result_columns": RESULT_COLUMNS,
        "results": results,
        "durations": {"<build>": 12.5},
        "version": 2,
    }


# ---------------------------------------------------------------------------- editing results


def results_filename(data: dict) -> str:
    return f"{data['commit_hash'][:8]}-{data['env_name']}.json"


def write_results(machine_dir: Path, data: dict) -> Path:
    """Write ``data`` as asv does (compact JSON; NaN literal for skipped, null for failed)."""
    path = Path(machine_dir) / results_filename(data)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    return path


def load_results(path: Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def get_value(data: dict, bench: str, i: int):
    row = data["results"][bench]
    result = row[COL["result"]] if row else None
    return None if result is None else result[i]


def set_value(data: dict, bench: str, i: int, value) -> None:
    """Set combination ``i`` of ``bench`` (copy-on-write: shared base lists stay intact)."""
    row = data["results"][bench] = list(data["results"][bench])
    result = row[COL["result"]]
    if result is None:
        n = math.prod(len(p) for p in row[COL["params"]])
        result = [None] * n
    row[COL["result"]] = result = list(result)
    result[i] = value


def scale_time(data: dict, i: int, factor: float) -> None:
    """Combination ``i``'s time ``factor`` times its own, its 99% CI within 3 % of it."""
    row = data["results"][TIME] = list(data["results"][TIME])
    for k in ("result", "stats_ci_99_a", "stats_ci_99_b"):
        row[COL[k]] = list(row[COL[k]])
    v = row[COL["result"]][i] * factor
    row[COL["result"]][i], row[COL["stats_ci_99_a"]][i], row[COL["stats_ci_99_b"]][i] = v, v * 0.97, v * 1.03


def set_version(data: dict, bench: str, version: str) -> None:
    row = data["results"][bench] = list(data["results"][bench])
    row[COL["version"]] = version


def derive(data: dict, commit: str, date: int) -> dict:
    """A copy of results ``data`` as if measured at another commit (same env)."""
    new = json.loads(json.dumps(data))
    new["commit_hash"] = commit
    new["date"] = date
    return new


def set_env(data: dict, catalog_dir: Path, torch_version: str, **changes) -> int:
    """Record results ``data`` under an env entry changed by ``changes`` (threads=1,
    env_vars={...}): every combination that has an env-id gets the new one. Returns it."""
    env_id = catalog.store(catalog_dir, "env", {**env_entry(torch_version), **changes})
    row = data["results"][ENV]
    row[COL["result"]] = [v if v is None or (isinstance(v, float) and math.isnan(v)) else env_id
                          for v in row[COL["result"]]]
    return env_id
