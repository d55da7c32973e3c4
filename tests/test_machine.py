"""The machine name: made of the hardware, never of the host; any hardware change renames it."""

from __future__ import annotations

import platform
import re

from matmul_drift import machine, nightly

INTEL = {"vendor_id": "GenuineIntel", "model name": "Intel(R) Xeon(R) Processor",
         "flags": "fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 amx_tile amx_bf16 "
                  "hypervisor rdrand"}
AMD = {"vendor_id": "AuthenticAMD", "model name": "AMD EPYC 9B14 96-Core Processor",
       "flags": "fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 hypervisor"}


def fp(info=INTEL, gpus=(), cores=2):
    return machine.fingerprint(info, list(gpus), cores)


def test_name_is_readable_and_stable():
    assert machine.name(fp()) == machine.name(fp())
    assert machine.name(fp()).startswith("intel-xeon-amx-2c-")
    assert machine.name(fp(AMD)).startswith("amd-epyc-9b14-avx512-2c-")
    assert machine.name(fp(gpus=["NVIDIA H200", "NVIDIA H200"])).startswith("intel-xeon-amx-2c-2x-h200-")
    # flags that say nothing about GEMM routes (hypervisor, rdrand) are not part of it
    assert fp()["isa"] == sorted({"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                  "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"})


def test_every_hardware_change_renames_and_the_host_never_counts(monkeypatch):
    base = machine.name(fp())
    changed = [
        fp(AMD),
        fp({**INTEL, "flags": INTEL["flags"].replace(" amx_tile amx_bf16", "")}),  # same model, no AMX
        fp({**INTEL, "model name": "Intel(R) Xeon(R) Platinum 8488C"}),
        fp(cores=4),
        fp(gpus=["NVIDIA H200"]),
        fp(gpus=["NVIDIA H200", "NVIDIA H200"]),
    ]
    names = [machine.name(f) for f in changed]
    assert base not in names and len(set(names)) == len(names)
    monkeypatch.setattr(platform, "node", lambda: "vm")
    monkeypatch.setattr(platform, "uname", lambda: platform.uname_result("Linux", "vm", "6", "#1", "x86_64"))
    assert machine.name(fp()) == base and "vm" not in base.split("-")


def test_asv_entry():
    entry = machine.asv_entry(fp())
    assert entry["machine"] == machine.name(fp()) and entry["num_cpu"] == "2"
    assert "amx_tile" in entry["isa"].split() and entry["gpu"] == "none"
    assert set(machine.HARDWARE_PARAMS) <= set(entry)


def test_this_machine_has_a_name():
    f = machine.fingerprint()
    assert f["cores"] >= 1 and f["arch"] == platform.machine()
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*-[0-9a-f]{6}", machine.name(f)) and len(machine.name(f)) <= 64
    assert nightly.MACHINE_NAME.match(machine.name(f))
