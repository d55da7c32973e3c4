"""A CUDA timing as the field measures it: repetitions sized by time, as
`triton.testing.do_bench` sizes them, and whether the GPU slowed down while the calls ran, so
that a time measured while the clocks fell is named as such.

A power cap or a thermal slowdown lifts as soon as the work stops, so readings taken after a
synchronize, with the GPU idle, miss it. What the GPU accumulated over the timed window does
not: NVML's violation counters (``nvmlDeviceGetViolationStatus``: nanoseconds spent below the
asked clocks for power, thermal, board-limit and reliability reasons, since the driver loaded),
read before and after. NVML (nvidia-ml-py's `pynvml`) is started once a process and finds the
GPU by its UUID, never by CUDA's ordinal, which another device order or CUDA_VISIBLE_DEVICES
makes another GPU's. Without NVML, nvidia-smi (``-i <uuid>``) gives the SM clock and the reasons
active at each end alone: a fall seen there counts, and no fall seen is not known (None);
without either, no clocks (None). The sizing and the verdict are
plain functions of plain values: the tests feed them a fake NVML."""

from __future__ import annotations

import shutil
import subprocess

WARMUP_SECONDS, REPEAT_SECONDS = 0.025, 0.100  # do_bench's warmup=25 ms, rep=100 ms
ESTIMATE_CALLS = 5  # do_bench times 5 flushed calls first to size the rest
MAX_REPEATS = 10_000  # CUDA events held at once
CELL_SECONDS = 1.0  # the most a cell's timed calls, flushes included, may take
QUANTILES = (0.2, 0.5, 0.8)  # do_bench's usual quantiles
FELL = 0.1  # an SM clock this much lower after than before fell
SLOWED = 0.01  # a slowdown counter that grew by this share of the timed window fell

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
SLOWDOWNS = frozenset({"SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown",
                       "HwPowerBrakeSlowdown"})
# nvmlDeviceGetViolationStatus's policies (pynvml's NVML_PERF_POLICY_* names) that count time
# spent slowed down, and the words for each
POLICIES = {"POWER": "power cap", "THERMAL": "thermal slowdown", "BOARD_LIMIT": "board limit",
            "RELIABILITY": "reliability limit"}


def counts(estimate: float, warmup: float = WARMUP_SECONDS, repeat: float = REPEAT_SECONDS,
           most: int = MAX_REPEATS, least: int = 1, bound: float = CELL_SECONDS) -> tuple[int, int]:
    """(warm-up calls, timed calls) for a call of ``estimate`` seconds, its L2 flush included,
    as do_bench sizes them: about ``warmup`` and ``repeat`` seconds of calls, at least one
    each; at least ``least`` timed where they fit in ``bound`` seconds, at most ``most``."""
    per = max(float(estimate), 1e-9)
    timed = min(max(int(repeat / per), min(least, int(bound / per))), most)
    return max(1, int(warmup / per)), max(1, timed)


def reasons_of(mask: int, nvml) -> list[str]:
    """The names of the reasons set in NVML's bit ``mask``, from ``nvml``'s own constants."""
    out = []
    for name in REASONS:
        bit = getattr(nvml, f"nvmlClocksEventReason{name}", None)
        bit = getattr(nvml, f"nvmlClocksThrottleReason{name}", None) if bit is None else bit
        if isinstance(bit, int) and mask & bit:
            out.append(name)
    return out


def nvml_uuid(uuid) -> str:
    """NVML's and nvidia-smi's spelling of a CUDA device UUID (torch's
    ``get_device_properties(i).uuid``): ``GPU-<uuid>``, or a MIG device's ``MIG-<uuid>`` as is."""
    text = str(uuid).strip()
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


# NVML as this process started it: [(the nvml module, {"error": .., uuid: handle})]. nvmlInit
# runs once a module; NVML's state lives until the process ends.
_SESSIONS: list[tuple[object, dict]] = []


def _handle(nvml, uuid: str):
    """NVML's handle of the GPU ``uuid``, NVML started on first use; raises what NVML raises
    (its start's error again on every later call)."""
    session = next((s for m, s in _SESSIONS if m is nvml), None)
    if session is None:
        session = {}
        _SESSIONS.append((nvml, session))
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001  pynvml.NVMLError and its kin: no driver, no GPU
            session["error"] = exc
    if "error" in session:
        raise session["error"]
    if uuid not in session:
        session[uuid] = nvml.nvmlDeviceGetHandleByUUID(uuid)
    return session[uuid]


def _violations(nvml, h) -> dict[str, int]:
    """{policy: nanoseconds spent slowed down by it since the driver loaded}, for the POLICIES
    this GPU counts."""
    out = {}
    for name in POLICIES:
        policy = getattr(nvml, f"NVML_PERF_POLICY_{name}", None)
        if policy is None:
            continue
        try:
            out[name] = int(nvml.nvmlDeviceGetViolationStatus(h, policy).violationTime)
        except Exception:  # noqa: BLE001  NVML_ERROR_NOT_SUPPORTED on a GPU without that counter
            pass
    return out


def read(uuid: str, nvml=None, smi: str | None = None) -> dict | None:
    """The SM clock (MHz), the active throttle reasons and, through NVML, the slowdown counters
    (``slowdown_ns``: policy -> nanoseconds, None without NVML) of the GPU ``uuid`` (as
    ``nvml_uuid`` spells it) now: {"sm_mhz", "reasons", "slowdown_ns", "source"}; None where
    neither NVML (``nvml``, default pynvml) nor nvidia-smi answers."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            nvml = None
    if nvml is not None:
        try:
            h = _handle(nvml, uuid)
            mhz = int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
            get = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            return {"sm_mhz": mhz, "reasons": reasons_of(int(get(h)), nvml),
                    "slowdown_ns": _violations(nvml, h), "source": "nvml"}
        except Exception:  # noqa: BLE001  pynvml.NVMLError and its kin: no driver, no GPU
            pass
    return _smi(uuid, smi)


SMI_REASONS = {  # nvidia-smi's clocks_throttle_reasons.* fields -> NVML's names
    "gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
}


def _smi(uuid: str, exe: str | None) -> dict | None:
    exe = exe or shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = ["clocks.sm", *(f"clocks_throttle_reasons.{f}" for f in SMI_REASONS)]
    try:
        p = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                            "-i", uuid], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = p.stdout.strip().splitlines() if p.returncode == 0 else []
    values = [v.strip() for v in lines[0].split(",")] if lines else []
    if len(values) != len(fields) or not values[0].isdigit():
        return None
    active = [SMI_REASONS[f] for f, v in zip(SMI_REASONS, values[1:]) if v.lower() == "active"]
    return {"sm_mhz": int(values[0]), "reasons": active, "slowdown_ns": None,
            "source": "nvidia-smi"}


def verdict(before: dict | None, after: dict | None, window: float | None = None,
            fell: float = FELL, slowed: float = SLOWED) -> dict:
    """The clocks around a timing of ``window`` seconds: before, after, ``fell`` and ``why`` in
    words. ``fell`` is True where a slowdown counter grew by more than ``slowed`` of the window
    (by anything, the window unknown), the SM clock dropped by more than ``fell`` of its value,
    or a slowdown reason was active at either end; None where a reading is missing."""
    if not before or not after:
        return {"before": before, "after": after, "fell": None,
                "why": "clocks not read (no NVML, no nvidia-smi): cuda_clock_fell is absent"}
    why = []
    counted = before.get("slowdown_ns") or {}
    for name, ns in (after.get("slowdown_ns") or {}).items():
        grew = ns - counted.get(name, ns)
        if grew > (slowed * window * 1e9 if window else 0):
            share = f" of the {window * 1e3:.0f} ms timed" if window else ""
            why.append(f"{POLICIES.get(name, name)} for {grew / 1e6:.1f} ms{share}")
    if after["sm_mhz"] < before["sm_mhz"] * (1 - fell):
        why.append(f"SM clock {before['sm_mhz']} -> {after['sm_mhz']} MHz")
    active = dict.fromkeys(before["reasons"] + after["reasons"])
    slow = [REASONS[r] for r in active if r in SLOWDOWNS]
    if slow:
        why.append(", ".join(slow))
    if not why and "nvidia-smi" in (before.get("source"), after.get("source")):
        # two instants alone (nvidia-smi): a cap that lifted between them leaves no trace, so
        # "did not fall" is not known; a fall seen at either end still is
        return {"before": before, "after": after, "fell": None,
                "why": "no slowdown counters over the timed window (nvidia-smi reads two "
                       "instants): cuda_clock_fell is absent"}
    return {"before": before, "after": after, "fell": bool(why), "why": "; ".join(why) or None}
