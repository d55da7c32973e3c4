"""A CUDA timing as the field measures it: repetitions sized by time, as
`triton.testing.do_bench` sizes them, and the GPU's SM clock and throttle reasons read before
and after, so that a time measured while the clocks fell is named as such.

The clocks come from NVML through nvidia-ml-py (`pynvml`), else from nvidia-smi; no GPU, no
clocks (None). The sizing and the verdict are plain functions of plain values: the tests feed
them a fake clock source."""

from __future__ import annotations

import shutil
import subprocess

WARMUP_SECONDS, REPEAT_SECONDS = 0.025, 0.100  # do_bench's warmup=25 ms, rep=100 ms
ESTIMATE_CALLS = 5  # do_bench times 5 calls first to size the rest
MAX_REPEATS = 10_000  # CUDA events held at once
QUANTILES = (0.2, 0.5, 0.8)  # do_bench's usual quantiles
FELL = 0.1  # an SM clock this much lower after than before fell

# NVML's clock event (throttle) reasons: pynvml's constant names, and the words for each. Those
# that slow the clocks below what was asked name a fallen run; idle and settings do not.
REASONS = {
    "GpuIdle": "idle",
    "ApplicationsClocksSetting": "application clocks setting",
    "SwPowerCap": "software power cap",
    "HwSlowdown": "hardware slowdown",
    "SyncBoost": "sync boost",
    "SwThermalSlowdown": "software thermal slowdown",
    "HwThermalSlowdown": "hardware thermal slowdown",
    "HwPowerBrakeSlowdown": "hardware power brake",
    "DisplayClockSetting": "display clock setting",
}
SLOWDOWNS = frozenset({"SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})


def counts(estimate: float, warmup: float = WARMUP_SECONDS, repeat: float = REPEAT_SECONDS,
           most: int = MAX_REPEATS) -> tuple[int, int]:
    """(warm-up calls, timed calls) for a call of ``estimate`` seconds: about ``warmup`` and
    ``repeat`` seconds of calls, at least one each, at most ``most`` timed."""
    per = max(float(estimate), 1e-9)
    return max(1, int(warmup / per)), max(1, min(most, int(repeat / per)))


def reasons_of(mask: int, nvml) -> list[str]:
    """The names of the reasons set in NVML's bit ``mask``, from ``nvml``'s own constants."""
    out = []
    for name in REASONS:
        bit = getattr(nvml, f"nvmlClocksEventReason{name}", None)
        bit = getattr(nvml, f"nvmlClocksThrottleReason{name}", None) if bit is None else bit
        if isinstance(bit, int) and mask & bit:
            out.append(name)
    return out


def read(index: int = 0, nvml=None, smi: str | None = None) -> dict | None:
    """The SM clock (MHz) and active throttle reasons of GPU ``index`` now: {"sm_mhz",
    "reasons", "source"}; None where neither NVML (``nvml``, default pynvml) nor nvidia-smi answers."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            nvml = None
    if nvml is not None:
        try:
            nvml.nvmlInit()
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(index)
                mhz = int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
                get = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                    nvml.nvmlDeviceGetCurrentClocksThrottleReasons
                return {"sm_mhz": mhz, "reasons": reasons_of(int(get(h)), nvml), "source": "nvml"}
            finally:
                nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001  pynvml.NVMLError and its kin: no driver, no GPU; try nvidia-smi
            pass
    return _smi(index, smi)


SMI_REASONS = {  # nvidia-smi's clocks_throttle_reasons.* fields -> NVML's names
    "gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
}


def _smi(index: int, exe: str | None) -> dict | None:
    exe = exe or shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = ["clocks.sm", *(f"clocks_throttle_reasons.{f}" for f in SMI_REASONS)]
    try:
        p = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", str(index)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [v.strip() for v in p.stdout.strip().splitlines()[0].split(",")] if p.returncode == 0 and p.stdout.strip() else []
    if len(values) != len(fields) or not values[0].isdigit():
        return None
    active = [SMI_REASONS[f] for f, v in zip(SMI_REASONS, values[1:]) if v.lower() == "active"]
    return {"sm_mhz": int(values[0]), "reasons": active, "source": "nvidia-smi"}


def verdict(before: dict | None, after: dict | None, fell: float = FELL) -> dict:
    """The clocks around a timing: before, after, ``fell`` (True where the SM clock dropped by
    more than ``fell`` of its value, or a slowdown reason was active at either end; None where
    a reading is missing) and ``why`` in words."""
    if not before or not after:
        return {"before": before, "after": after, "fell": None, "why": "clocks not read (no NVML, no nvidia-smi)"}
    why = []
    if after["sm_mhz"] < before["sm_mhz"] * (1 - fell):
        why.append(f"SM clock {before['sm_mhz']} -> {after['sm_mhz']} MHz")
    slow = [REASONS[r] for r in dict.fromkeys(before["reasons"] + after["reasons"]) if r in SLOWDOWNS]
    if slow:
        why.append(", ".join(slow))
    return {"before": before, "after": after, "fell": bool(why), "why": "; ".join(why) or None}
