"""Two GPU nights rehearsed on the CPU, end to end from the libraries' own output to the
summary's flags: cuBLAS's and cuBLASLt's logs in their real formats, set-up blocks included
(test_blaslog.py names the sources), through kernels.BlasLog's callbacks and
kernels.cuda_kernels under a fake CUDA profiler (test_kernels.FakeCuda, with kernel names of
tests/kernel_names.py); NVML's counters through a fake pynvml (test_clocks.FakeNvml), a power
cap in one night; each night's kernel-id, environment and CUDA timing recorded as asv results
(asv_fixtures) and judged by `matmul-drift summary --format json`. Two identical nights raise no
incident, another algorithm raises one kernel incident, another workspace none, and a
line no parser reads is kept in the environment record."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import asv_fixtures as F
import pynvml
import pytest
from test_blaslog import GEMMEX, LT, set_up, trace_message
from test_clocks import UUID, FakeNvml
from test_kernels import FakeCuda

from matmul_drift.core import blaslog
from matmul_drift.jobs import suite
from matmul_drift.measure import clocks, kernels, measure
from matmul_drift.store import catalog

WORKSPACE = 33554432  # torch's default cuBLAS workspace on sm90 (32 MiB)


class FakeCublas:
    """cuBLAS's and cuBLASLt's logger API as kernels.BlasLog calls it through ctypes, for one
    library playing both: each product logs torch's handle set-up and a GemmEx to the legacy
    callback (one block per message, as cuBLAS calls it) and a typed Trace line to cuBLASLt's,
    where logging is on."""

    def __init__(self, algo: int, workspace: int):
        self.algo, self.workspace = algo, workspace
        self.lt = self.legacy = None
        self.level = self.on = 0

    def cublasLtLoggerSetCallback(self, cb):
        self.lt = cb
        return 0

    def cublasLtLoggerSetLevel(self, level):
        self.level = level
        return 0

    def cublasSetLoggerCallback(self, cb):
        self.legacy = cb
        return 0

    def cublasLoggerConfigure(self, on, out, err, path):
        self.on = on
        return 0

    def product(self) -> None:
        if self.on and self.legacy:
            for block in (set_up(self.workspace) + GEMMEX).split("I! cuBLAS")[1:]:
                self.legacy(("I! cuBLAS" + block).encode())
        if self.level >= 2 and self.lt:
            line = LT.replace("algoId=66", f"algoId={self.algo}").replace(
                f"workSpaceSizeInBytes={WORKSPACE}", f"workSpaceSizeInBytes={self.workspace}")
            function, message = trace_message(line)
            self.lt(2, function.encode(), message.encode())
            # and a Trace line cut short, which no parser reads (CUT)
            self.lt(2, function.encode(), message[:message.index("algo=") + 10].encode())


def night(monkeypatch, algo: int, workspace: int, power_cap_ns: int) -> dict:
    """One night's one CUDA cell: its kernel entry, environment and timing series, measured
    through the fakes. ``power_cap_ns``: how long NVML's power counter grew while timed."""
    import torch

    cuda = FakeCuda(torch, lambda session: 0)
    cuda.install(monkeypatch)
    blas = FakeCublas(algo, workspace)
    monkeypatch.setattr(kernels, "_BLAS_LOG", [kernels.BlasLog({"lt": blas, "blas": blas})])

    def product():
        for name in ("nvjet_sm90_hsh_512x8_64x16_2x1_v_bz_splitK_TNT",
                     "void cublasLt::splitKreduce_kernel<32, 16, int, float, __half, float, __half, true, false, "
                     "false>(cublasLt::cublasSplitKParams<float>, float const*, __half const*, __half*, "
                     "float const*, float const*, __half const*, float const*, __half*, void*, long, float*, int*)"):
            cuda.launch("aten::mv", name)
        blas.product()
        return "y"

    kernels.handle_state()
    _, names = kernels.cuda_kernels(product)
    entry = measure.kernel_entry("cuda", {"full": names})
    env = {**F.env_entry("2.13.0", "cuda", cuda_build=True), "cublas_handle": kernels.handle_state()}
    power = pynvml.NVML_PERF_POLICY_POWER
    nvml = FakeNvml([(1980, 0, {power: 10**9}), (1980, pynvml.nvmlClocksEventReasonGpuIdle,
                                                   {power: 10**9 + power_cap_ns})])
    monkeypatch.setattr(clocks, "_SESSIONS", [])
    seconds = 2e-3 * (1.5 if power_cap_ns else 1.0)  # capped: slower, and never compared
    timing = {"median": seconds, "quantiles": [seconds * 0.99, seconds, seconds * 1.01],
              "clocks": clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml), 0.120)}
    return {"kernels": entry, "env": env, **suite.cuda_timing(timing)}


def summarise(tmp_path, nights: list[dict]) -> dict:
    """The two nights as asv results of one machine and torch, two commits, judged by the CLI."""
    root = tmp_path / "results"

    def record(ci, ei, data):
        got = nights[ci]
        cat = root / "catalog"
        F.set_value(data, F.KERNEL, 0, catalog.store(cat, "kernels", got["kernels"]))
        F.set_value(data, F.ENV, 0, catalog.store(cat, "env", got["env"]))
        for bench, key in ((F.CUDA_SECONDS, "cuda_seconds"), (F.CUDA_Q20, "cuda_q20_seconds"),
                           (F.CUDA_Q80, "cuda_q80_seconds"), (F.CLOCK_FELL, "cuda_clock_fell")):
            F.set_value(data, bench, 0, got[key])

    F.write_tree(root, n_commits=2, torch_versions=("2.13.0",), cases=("seed",), dtypes=("float16",),
                 devices=("cuda",), adjust=record)
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "summary", str(root), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def first(monkeypatch):
    """The first night, under a power cap that lifted before the reading after the timing."""
    return night(monkeypatch, algo=66, workspace=WORKSPACE, power_cap_ns=40_000_000)


def test_the_nights_read_what_the_fakes_logged(first):
    names = first["kernels"]["full"]
    assert names[-2:] == [blaslog.recipe_lines("", GEMMEX)[0], blaslog.recipe_lines(LT, "")[0]]  # no set-up line
    handle = first["env"]["cublas_handle"]
    assert handle["workspace_bytes"] == [WORKSPACE] and handle["lt_workspace_bytes"] == [WORKSPACE]
    assert handle["streams"] == ["default"]
    # the line cut short is in the environment record, verbatim as the logger rebuilt it, and
    # counted; the night goes on
    function, message = trace_message(LT)
    cut = message[:message.index("algo=") + 10]
    assert handle["unread"] == [f"[cublasLt][][Trace][{function}] {cut}"]
    assert handle["unread_lines"] >= 1
    assert first["cuda_clock_fell"] == 1.0  # the power cap that lifted is seen


def test_two_identical_nights_raise_no_flag(monkeypatch, tmp_path, first):
    second = night(monkeypatch, algo=66, workspace=WORKSPACE, power_cap_ns=0)
    assert second["cuda_clock_fell"] == 0.0 and second["kernels"] == first["kernels"]
    judged = summarise(tmp_path, [first, second])
    assert judged["flags"] == [] and judged["incidents"] == []


def test_another_algorithm_in_the_second_night_is_one_kernel_flag(monkeypatch, tmp_path, first):
    second = night(monkeypatch, algo=67, workspace=WORKSPACE, power_cap_ns=0)
    judged = summarise(tmp_path, [first, second])
    assert [f["kind"] for f in judged["flags"]] == ["kernel"], judged["flags"]
    assert [i["flags"] for i in judged["incidents"]] == [[0]], judged["incidents"]


def test_another_workspace_alone_is_no_flag(monkeypatch, tmp_path, first):
    second = night(monkeypatch, algo=66, workspace=0, power_cap_ns=0)  # CUBLAS_WORKSPACE_CONFIG=:0:0
    assert second["kernels"] == first["kernels"] and second["env"] != first["env"]
    judged = summarise(tmp_path, [first, second])
    assert judged["flags"] == [] and judged["incidents"] == []


def test_ctypes_callbacks_take_the_fakes_bytes():
    # the fake calls BlasLog's callbacks as ctypes functions, with bytes, as the libraries do
    blas = FakeCublas(66, WORKSPACE)
    log = kernels.BlasLog({"lt": blas, "blas": blas})
    assert isinstance(blas.lt, ctypes._CFuncPtr) and not log.notes
