"""Which hardware this is, and the asv machine name that says so. Never imports torch.

asv names a machine after its host by default, so two hosts both called ``vm`` with
different CPUs would share one history, and a CPU change would read as a kernel change.
The name here is built from what decides a product's route and speed: the CPU vendor and
model, its matmul ISA extensions, the core count, and the GPU model and count. Any change
of those gives another name (a hash of all of them ends it); a host name never enters it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess

from matmul_drift.core import ids
from matmul_drift.store import atomic, bounded

# /proc/cpuinfo flags that decide which GEMM kernels a BLAS or oneDNN can pick.
ISA_FLAGS = (
    "sse4_2", "avx", "fma", "f16c", "avx2", "avx_vnni", "avx_vnni_int8", "avx_ne_convert",
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "amx_complex",
    "asimd", "asimdhp", "bf16", "i8mm", "sve", "sve2", "sme",  # aarch64
)
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
_NOISE = re.compile(r"\((?:R|TM|r|tm)\)|@.*$|\b\d+-core\b|"
                    r"\b(?:cpu|processor|with .*|intel|amd)\b", re.I)


def _cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    if out:
                        break
                    continue
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


# the NVIDIA driver's: one folder per GPU, named by its PCI bus
PROC_GPUS = "/proc/driver/nvidia/gpus"


def _proc_gpus(root: str = PROC_GPUS) -> list[str]:
    """GPU model names from the driver's ``root``/BUS/information files ("Model: NVIDIA H200"),
    in bus order, as nvidia-smi lists them; [] without them."""
    try:
        buses = sorted(os.listdir(root))
    except OSError:
        return []
    names = []
    for bus in buses:
        try:
            with open(os.path.join(root, bus, "information"), encoding="utf-8",
                      errors="replace") as fh:
                fields = dict(line.partition(":")[::2] for line in fh)
        except OSError:
            continue
        if name := fields.get("Model", "").strip():
            names.append(name)
    return names


def gpus(timeout: float = 20.0, proc_root: str = PROC_GPUS) -> list[str]:
    """GPU model names, one per GPU ([] without one): nvidia-smi's, or where it is missing,
    fails or hangs past ``timeout`` (s), the driver's /proc files'. Neither is torch, so no
    CUDA context is made in this process (asv's forkserver forbids one before its fork)."""
    exe = shutil.which("nvidia-smi")
    try:
        p = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=timeout) if exe else None
    except (OSError, subprocess.SubprocessError):
        p = None
    names = ([line.strip() for line in p.stdout.splitlines() if line.strip()]
             if p and p.returncode == 0 else [])
    return names or _proc_gpus(proc_root)


def fingerprint(cpuinfo: dict[str, str] | None = None, gpu_names: list[str] | None = None,
                cores: int | None = None) -> dict:
    """The hardware as plain data: arch, vendor, cpu (model string), isa (sorted flags of
    ISA_FLAGS present), cores (logical CPUs) and gpus (model names, one per GPU)."""
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {
        "arch": platform.machine(),
        "vendor": info.get("vendor_id") or info.get("CPU implementer") or "",
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "isa": sorted(flags & set(ISA_FLAGS)),
        "cores": os.cpu_count() if cores is None else cores,
        "gpus": gpus() if gpu_names is None else list(gpu_names),
    }


def _slug(text: str, words: int = 3) -> str:
    parts = re.findall(r"[a-z0-9]+", _NOISE.sub(" ", text).lower())
    return "-".join(parts[:words]) or "cpu"


def isa_label(isa: list[str]) -> str:
    """The highest matmul ISA level: amx, avx512fp16, avx512, avx2, sve, neon or base."""
    s = set(isa)
    for flag, label in (("amx_tile", "amx"), ("avx512_fp16", "avx512fp16"), ("avx512f", "avx512"),
                        ("avx2", "avx2"), ("sve", "sve"), ("asimd", "neon")):
        if flag in s:
            return label
    return "base"


def name(fp: dict) -> str:
    """asv's machine name for a fingerprint, e.g. ``intel-xeon-amx-2c-3f9a1c`` or
    ``amd-epyc-9b14-avx512-2c-1x-h200-0c1d2e``: readable parts, then 6 hex digits of the
    sha256 of the whole fingerprint, so hardware that differs in anything gets another name."""
    vendor = _VENDORS.get(fp["vendor"], _slug(fp["vendor"], 1) if fp["vendor"] else fp["arch"])
    parts = [vendor, _slug(fp["cpu"]), isa_label(fp["isa"]), f"{fp['cores']}c"]
    if fp["gpus"]:
        parts.append(f"{len(fp['gpus'])}x-{_slug(fp['gpus'][0].replace('NVIDIA', ''), 2)}")
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True,
                                       separators=(",", ":")).encode()).hexdigest()
    return "-".join(dict.fromkeys(p for p in parts if p)) + "-" + digest[:6]


def asv_entry(fp: dict) -> dict:
    """The machine entry asv keeps (``~/.asv-machine.json``, ``<results>/<name>/machine.json``):
    asv's own fields (os, ram, ...), with ``isa`` and ``gpu`` added. asv copies the entry into
    every results file, so each run says which hardware made it."""
    # imported here: asv is slow to import, and summary imports this module at every start
    from asv.machine import Machine

    defaults = Machine.get_defaults()
    return {**defaults, "machine": name(fp), "arch": fp["arch"], "cpu": fp["cpu"],
            "num_cpu": str(fp["cores"]), "isa": " ".join(fp["isa"]) or "none",
            "gpu": ", ".join(fp["gpus"]) or "none",
            # asv makes each field a graph parameter: the kernel's build and the bytes a VM
            # reports move from boot to boot, and would split every graph by them
            "os": platform.system() or defaults.get("os", ""), "ram": ram_gib(defaults.get("ram"))}


def ram_gib(ram) -> str:
    """asv's ram (bytes, as text) in whole GiB: "24 GiB"; as given where it is not a number."""
    try:
        return f"{round(int(ram) / 2**30)} GiB"
    except (TypeError, ValueError):
        return str(ram or "")


class NotRegistered(Exception):
    """~/.asv-machine.json cannot take the entry; the message is one line, the file is as it was."""


def register(fp: dict | None = None, as_name: str | None = None) -> str:
    """Record this machine in ``~/.asv-machine.json`` (under ``as_name`` where given), as
    ``asv machine --yes`` does, and return its name; ``asv run --machine NAME`` then takes the
    entry from there. Not `asv machine --yes --machine NAME` itself: asv 0.6 then records the
    name alone (no cpu, arch, ...), and runs on other hardware read as one history. The other
    entries are kept, and the new file replaces the old one whole (asv's own save truncates it
    first, and follows a FIFO or a directory there into a hang or a traceback)."""
    # imported here: asv is slow to import, and summary imports this module at every start
    from asv.machine import MachineCollection

    entry = asv_entry(fingerprint() if fp is None else fp)
    entry["machine"] = as_name or entry["machine"]
    path = _machine_file()
    try:
        machines = _machines(path)
        # read-only on purpose: a rename would override that
        if machines and not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        machines.update({entry["machine"]: entry, "version": MachineCollection.api_version})
        atomic.write_text(path, json.dumps(machines, indent=4, sort_keys=True) + "\n")
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise NotRegistered(f"cannot record this machine in {path}: {why}; "
                            "the file is left as it was") from None
    return entry["machine"]


def is_registered(name: str) -> bool:
    """Whether ``~/.asv-machine.json`` holds an entry ``name`` (which `asv run --machine` needs);
    False where the file is missing or unreadable."""
    try:
        return isinstance(_machines(_machine_file()).get(name), dict)
    except (OSError, ValueError):
        return False


def _machine_file() -> str:
    """asv's machine file, ~/.asv-machine.json, its link followed (a symlinked dotfile stays
    one)."""
    # imported here: asv is slow to import, and summary imports this module at every start
    from asv.machine import MachineCollection

    return os.path.realpath(MachineCollection.get_machine_file_path())


def _machines(path: str) -> dict:
    """The entries of an asv machine file; {} where there is none. Refused (a ValueError) when it
    is not a regular file, ValueError when it is not a JSON object."""
    try:
        data = bounded.read_bytes(path)
    except FileNotFoundError:
        return {}
    try:
        # written back whole: no NaN kept
        machines = json.loads(data, parse_constant=ids.no_constant)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deeply to read)") from None
    if not isinstance(machines, dict):
        raise ValueError(f"not a JSON object (a {type(machines).__name__})")
    return machines


# Fields of a results file's params (asv copies the machine entry there) that are hardware:
# the summary never judges two runs whose values of these differ as one machine's history.
HARDWARE_PARAMS = ("arch", "cpu", "num_cpu", "isa", "gpu")
