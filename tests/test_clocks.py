"""A CUDA timing sized as triton.testing.do_bench sizes it, and whether the GPU slowed down
while it ran (measure/clocks.py), checked with a fake NVML: NVML's API as nvidia-ml-py
(pynvml) exposes it, its own constants (NVML_PERF_POLICY_*, nvmlClocksEventReason*) and its
c_nvmlViolationTime_t (NVIDIA's NVML API Reference, nvmlDeviceGetViolationStatus: violationTime
in ns accumulated since the driver loaded), and an nvidia-smi that prints what the real one
prints. do_bench's sizing: triton/testing.py, do_bench (estimate over 5 calls of
``cache.zero_(); fn()``, n_warmup = max(1, int(warmup / estimate_ms)), n_repeat likewise)."""

from __future__ import annotations

import math
import os
import stat
import types

import pynvml  # nvidia-ml-py, in the test extra: these tests must run, not skip, without a GPU
import pytest

from matmul_drift.measure import clocks

UUID = "GPU-8e1b3c2a-4f5d-6e7f-8091-a2b3c4d5e6f7"


class FakeNvml(types.SimpleNamespace):
    """NVML with pynvml's constants and types, over a timeline of GPU states: each read takes
    the next (SM MHz, reason mask, {policy: violation ns}); one GPU, found by its UUID alone."""

    def __init__(self, readings, fail: Exception | None = None):
        names = {k: getattr(pynvml, k) for k in dir(pynvml)
                 if k.startswith(("nvmlClocks", "NVML_CLOCK", "NVML_PERF_POLICY"))}
        super().__init__(**names)
        self.readings, self.fail, self.now, self.inits, self.asked = iter(readings), fail, None, 0, []

    def nvmlInit(self):
        self.inits += 1
        if self.fail:
            raise self.fail

    def nvmlShutdown(self):
        raise AssertionError("NVML is started once a process, and never shut down between reads")

    def nvmlDeviceGetHandleByIndex(self, i):
        raise AssertionError("a CUDA ordinal is not NVML's index")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked.append(uuid)
        if uuid != UUID:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return "handle"

    def nvmlDeviceGetClockInfo(self, h, kind):
        self.now = next(self.readings)
        return self.now[0] if kind == pynvml.NVML_CLOCK_SM else 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.now[1]

    def nvmlDeviceGetViolationStatus(self, h, policy):
        counters = self.now[2] if len(self.now) > 2 else {}
        if policy not in counters:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        t = pynvml.c_nvmlViolationTime_t()
        t.referenceTime, t.violationTime = 1, counters[policy]
        return t


@pytest.fixture(autouse=True)
def _fresh_sessions(monkeypatch):
    monkeypatch.setattr(clocks, "_SESSIONS", [])


def fake_nvml(readings, fail: Exception | None = None) -> FakeNvml:
    return FakeNvml(readings, fail)


def test_repetitions_are_sized_by_time_as_do_bench_sizes_them():
    """do_bench: n_warmup = max(1, int(25 / estimate_ms)), n_repeat = max(1, int(100 / estimate_ms)),
    the estimate a flushed call's."""
    for ms in (0.001, 0.05, 1.0, 7.3, 30.0, 250.0):
        warm, reps = clocks.counts(ms / 1e3)
        assert warm == max(1, int(25 / ms)) and reps == min(clocks.MAX_REPEATS, max(1, int(100 / ms))), (ms, warm, reps)
    assert clocks.counts(0.0) == (clocks.counts(1e-9)[0], clocks.MAX_REPEATS)
    # a 5 us call behind a 90 us flush: about 1000 runs in 0.1 s, not 10,000 in 1 s
    warm, reps = clocks.counts(95e-6, least=20)
    assert 1000 <= reps <= 1100 and reps * 95e-6 == pytest.approx(0.1, rel=0.01)
    # at least 20 where they fit in a cell's bound, never past it
    assert clocks.counts(0.030, least=20)[1] == 20 and clocks.counts(0.25, least=20)[1] == 4


def test_nvml_finds_the_gpu_by_uuid_and_starts_once_a_process():
    mask = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonGpuIdle
    nvml = fake_nvml([(1980, mask), (1980, 0)])
    got = clocks.read(UUID, nvml=nvml)
    assert got == {"sm_mhz": 1980, "reasons": ["GpuIdle", "HwThermalSlowdown"], "slowdown_ns": {}, "source": "nvml"}
    assert clocks.read(UUID, nvml=nvml)["sm_mhz"] == 1980
    assert nvml.inits == 1 and nvml.asked == [UUID]  # one start, one look-up, however many reads
    assert set(clocks.REASONS) <= {k.removeprefix("nvmlClocksEventReason") for k in dir(pynvml)}
    assert set(clocks.POLICIES) <= {k.removeprefix("NVML_PERF_POLICY_") for k in dir(pynvml)}
    # torch's uuid (get_device_properties(i).uuid) without NVML's prefix, a MIG device's as is
    assert clocks.nvml_uuid(UUID.removeprefix("GPU-")) == UUID and clocks.nvml_uuid("MIG-1") == "MIG-1"


def test_a_power_cap_that_lifted_before_the_reading_after_the_timing_is_seen():
    """The GPU power-capped while the calls ran, idle and at full clock again when read after the
    synchronize: the instant readings hold nothing, NVML's counter grew by 40 ms of the 120 ms."""
    power, thermal = pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL
    idle = pynvml.nvmlClocksEventReasonGpuIdle
    nvml = fake_nvml([(1980, idle, {power: 7_000_000_000, thermal: 5}),
                      (1980, idle, {power: 7_040_000_000, thermal: 5}),
                      (345, idle, {power: 7_040_000_000, thermal: 5}),
                      (345, idle, {power: 7_040_000_000, thermal: 5})])
    capped = clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml), window=0.120)
    assert capped["fell"] is True and capped["why"] == "power cap for 40.0 ms of the 120 ms timed"
    idle_gpu = clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml), window=0.120)
    assert idle_gpu["fell"] is False and idle_gpu["why"] is None
    # a counter that moved by less than 1% of the window is the counter's grain, not a slowdown
    blip = clocks.verdict({"sm_mhz": 1980, "reasons": [], "slowdown_ns": {"THERMAL": 0}},
                          {"sm_mhz": 1980, "reasons": [], "slowdown_ns": {"THERMAL": 1_000_000}}, window=0.120)
    assert blip["fell"] is False


def test_a_timing_whose_clocks_fell_is_named_and_one_that_held_is_not():
    nvml = fake_nvml([(1980, 0), (1980, 0), (1980, 0), (1410, 0), (1980, 0), (1980, pynvml.nvmlClocksEventReasonSwPowerCap),
                      (345, pynvml.nvmlClocksEventReasonGpuIdle), (1980, 0)])
    held = clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml))
    assert held["fell"] is False and held["why"] is None
    fell = clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml))
    assert fell["fell"] is True and fell["why"] == "SM clock 1980 -> 1410 MHz"
    capped = clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml))
    assert capped["fell"] is True and capped["why"] == "software power cap"
    ramped = clocks.verdict(clocks.read(UUID, nvml=nvml), clocks.read(UUID, nvml=nvml))  # idle before, busy after
    assert ramped["fell"] is False
    unread = clocks.verdict(None, None)
    assert unread["fell"] is None and "no NVML, no nvidia-smi" in unread["why"]


def _smi(tmp_path, out: str, rc: int = 0) -> str:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\nprintf '%s' '{out}'\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_without_nvml_nvidia_smi_is_read_by_uuid_and_without_either_no_clocks(tmp_path, monkeypatch):
    broken = fake_nvml([], fail=pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    line = "1755, Not Active, Not Active, Not Active, Not Active, Not Active, Not Active, Active, Not Active\n"
    got = clocks.read(UUID, nvml=broken, smi=_smi(tmp_path, line))
    assert got == {"sm_mhz": 1755, "reasons": ["HwThermalSlowdown"], "slowdown_ns": None, "source": "nvidia-smi"}
    assert (tmp_path / "args").read_text().split()[-2:] == ["-i", UUID]
    assert clocks.read(UUID, nvml=broken, smi=_smi(tmp_path, "[N/A], Active\n")) is None
    # two instants alone: a fall seen at an end counts; none seen is not known, never "no fall"
    idle = {"sm_mhz": 1980, "reasons": [], "slowdown_ns": None, "source": "nvidia-smi"}
    assert clocks.verdict(idle, got, 0.1)["fell"] is True
    unknown = clocks.verdict(idle, idle, 0.1)
    assert unknown["fell"] is None and "two instants" in unknown["why"]
    assert clocks.read(UUID, nvml=broken, smi=_smi(tmp_path, "", rc=9)) is None
    assert broken.inits == 1  # a failed start is not tried again at every read
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert clocks.read(UUID, nvml=broken) is None
    if not os.path.exists("/dev/nvidiactl"):  # the real pynvml on a machine without a GPU
        assert clocks.read(UUID) is None


def test_the_suite_records_the_quantiles_and_whether_the_clock_fell():
    """What track_cuda_* record from a CUDA timing (measure.time_call's dict), from the same
    verdicts a fake clock source gives: the summary reads the quantiles as an interval and
    never compares a run whose clock fell."""
    from matmul_drift.jobs import suite

    timed = {"median": 2e-3, "quantiles": [1.9e-3, 2e-3, 2.2e-3]}
    held = clocks.verdict({"sm_mhz": 1980, "reasons": []}, {"sm_mhz": 1975, "reasons": []})
    fell = clocks.verdict({"sm_mhz": 1980, "reasons": []}, {"sm_mhz": 1410, "reasons": ["SwPowerCap"]})
    assert suite.cuda_timing({**timed, "clocks": held}) == {
        "cuda_seconds": 2e-3, "cuda_q20_seconds": 1.9e-3, "cuda_q80_seconds": 2.2e-3, "cuda_clock_fell": 0.0}
    assert fell["fell"] and suite.cuda_timing({**timed, "clocks": fell})["cuda_clock_fell"] == 1.0
    unread = suite.cuda_timing({**timed, "clocks": clocks.verdict(None, None)})
    assert math.isnan(unread["cuda_clock_fell"]) and unread["cuda_q80_seconds"] == 2.2e-3
    assert all(math.isnan(v) for v in suite.cuda_timing(None).values())


def test_cuda_timing_sizes_its_runs_on_the_flushed_call_and_reads_the_gpu_by_uuid(monkeypatch):
    """measure.time_call's CUDA path on a simulated GPU: a 5 us call behind a 90 us flush of the
    L2 (the flush buffer's zero_) gets about 1000 timed runs, about 0.1 s of GPU time, as
    do_bench gives it; the samples are the call's alone, and the clocks are read by UUID."""
    import torch

    from matmul_drift.measure import measure

    gpu = {"t": 0.0, "calls": 0}

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = gpu["t"]

        def elapsed_time(self, other):  # milliseconds, as CUDA events give them
            return (other.t - self.t) * 1e3

    class Cache:
        def zero_(self):
            gpu["t"] += 90e-6

    def call():
        gpu["t"] += 5e-6
        gpu["calls"] += 1

    read = []
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **kw: Cache())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid=UUID.removeprefix("GPU-") if i == 3 else "other"))
    monkeypatch.setattr(clocks, "read", lambda uuid: read.append(uuid) or {"sm_mhz": 1980, "reasons": [],
                                                                         "slowdown_ns": {"POWER": 0}})
    got = measure.time_call(call, "cuda")
    assert 1000 <= got["runs"] <= 1100, got["runs"]
    assert got["median"] == pytest.approx(5e-6) and got["quantiles"] == pytest.approx([5e-6] * 3)
    assert gpu["t"] < 0.2  # estimate, warm-up and the timed runs: well under do_bench's 10,000 x 95 us
    assert read == [UUID, UUID] and got["clocks"]["fell"] is False
