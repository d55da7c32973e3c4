"""A CUDA timing sized as triton.testing.do_bench sizes it, and the GPU's clocks around it
(measure/clocks.py), checked with a fake clock source: NVML's own constants from
nvidia-ml-py, and an nvidia-smi that prints what the real one prints."""

from __future__ import annotations

import os
import stat
import types

import pynvml  # nvidia-ml-py, in the test extra: these tests must run, not skip, without a GPU

from matmul_drift.measure import clocks


def fake_nvml(readings: list[tuple[int, int]], fail: Exception | None = None):
    """NVML with pynvml's constants, whose SM clock and reason mask come from ``readings``, one per read."""
    it = iter(readings)
    now: dict = {}

    def handle(i):
        if fail:
            raise fail
        now["mhz"], now["mask"] = next(it)
        return i

    names = {k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("nvmlClocks", "NVML_CLOCK"))}
    return types.SimpleNamespace(**names, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                                 nvmlDeviceGetHandleByIndex=handle,
                                 nvmlDeviceGetClockInfo=lambda h, kind: now["mhz"] if kind == pynvml.NVML_CLOCK_SM else 0,
                                 nvmlDeviceGetCurrentClocksEventReasons=lambda h: now["mask"])


def test_repetitions_are_sized_by_time_as_do_bench_sizes_them():
    """do_bench: n_warmup = max(1, int(25 / estimate_ms)), n_repeat = max(1, int(100 / estimate_ms))."""
    for ms in (0.001, 0.05, 1.0, 7.3, 30.0, 250.0):
        warm, reps = clocks.counts(ms / 1e3)
        assert warm == max(1, int(25 / ms)) and reps == min(clocks.MAX_REPEATS, max(1, int(100 / ms))), (ms, warm, reps)
    assert clocks.counts(0.0) == (clocks.counts(1e-9)[0], clocks.MAX_REPEATS)


def test_clocks_read_through_nvml_name_the_reasons_by_nvmls_own_bits():
    mask = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonGpuIdle
    got = clocks.read(0, nvml=fake_nvml([(1980, mask)]))
    assert got == {"sm_mhz": 1980, "reasons": ["GpuIdle", "HwThermalSlowdown"], "source": "nvml"}
    assert set(clocks.REASONS) <= {k.removeprefix("nvmlClocksEventReason") for k in dir(pynvml)}


def test_a_timing_whose_clocks_fell_is_named_and_one_that_held_is_not():
    nvml = fake_nvml([(1980, 0), (1980, 0), (1980, 0), (1410, 0), (1980, 0), (1980, pynvml.nvmlClocksEventReasonSwPowerCap),
                      (345, pynvml.nvmlClocksEventReasonGpuIdle), (1980, 0)])
    held = clocks.verdict(clocks.read(0, nvml=nvml), clocks.read(0, nvml=nvml))
    assert held["fell"] is False and held["why"] is None
    fell = clocks.verdict(clocks.read(0, nvml=nvml), clocks.read(0, nvml=nvml))
    assert fell["fell"] is True and fell["why"] == "SM clock 1980 -> 1410 MHz"
    capped = clocks.verdict(clocks.read(0, nvml=nvml), clocks.read(0, nvml=nvml))
    assert capped["fell"] is True and capped["why"] == "software power cap"
    ramped = clocks.verdict(clocks.read(0, nvml=nvml), clocks.read(0, nvml=nvml))  # idle before, busy after
    assert ramped["fell"] is False
    assert clocks.verdict(None, None)["fell"] is None


def _smi(tmp_path, out: str, rc: int = 0) -> str:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '%s' '{out}'\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_without_nvml_nvidia_smi_is_read_and_without_either_no_clocks(tmp_path, monkeypatch):
    broken = fake_nvml([], fail=pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    line = "1755, Not Active, Not Active, Not Active, Not Active, Not Active, Not Active, Active, Not Active\n"
    got = clocks.read(0, nvml=broken, smi=_smi(tmp_path, line))
    assert got == {"sm_mhz": 1755, "reasons": ["HwThermalSlowdown"], "source": "nvidia-smi"}
    assert clocks.read(0, nvml=broken, smi=_smi(tmp_path, "[N/A], Active\n")) is None
    assert clocks.read(0, nvml=broken, smi=_smi(tmp_path, "", rc=9)) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert clocks.read(0, nvml=broken) is None
    if not os.path.exists("/dev/nvidiactl"):  # the real pynvml on a machine without a GPU
        assert clocks.read(0) is None


def test_the_suite_records_the_quantiles_and_whether_the_clock_fell():
    """What track_cuda_* record from a CUDA timing (measure.time_call's dict), from the same
    verdicts a fake clock source gives: the summary reads the quantiles as an interval and
    never compares a run whose clock fell."""
    import math

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
