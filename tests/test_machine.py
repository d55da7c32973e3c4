"""The machine name: made of the hardware, never of the host; any hardware change renames it."""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import subprocess
import sys
import time

import pytest
from asv.machine import MachineCollection

from matmul_drift.jobs import nightly
from matmul_drift.store import machine

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


def _register(home):
    """`matmul-drift machine --register` with HOME=home, in a fresh process (a FIFO must not hang it)."""
    p = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "machine", "--register"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "HOME": str(home)})
    return p.returncode, p.stdout, p.stderr


def test_register_keeps_the_other_machines(tmp_path):
    other = {"machine": "other", "arch": "aarch64"}
    (tmp_path / ".asv-machine.json").write_text(json.dumps({"other": other, "version": 1}))
    rc, out, err = _register(tmp_path)
    assert rc == 0, err
    name = out.strip()
    assert name == machine.name(machine.fingerprint())
    saved = tmp_path / ".asv-machine.json"
    assert MachineCollection.load("other", _path=str(saved)) == other  # asv reads it back
    assert MachineCollection.load(name, _path=str(saved))["isa"] == machine.asv_entry(machine.fingerprint())["isa"]


@pytest.mark.parametrize("make,why", [
    (lambda p: p.write_text("{bad"), "not JSON (Expecting property name enclosed in double quotes"),
    (lambda p: p.write_text("[" * 100000), "not JSON (nested too deeply to read)"),
    (lambda p: p.write_text("[1]"), "not a JSON object (a list)"),
    (lambda p: p.write_text('{"other": {"cores": NaN}}'), "not JSON (NaN is not a JSON number (RFC 8259))"),
    (lambda p: p.mkdir(), "not a regular file (a directory)"),
    (lambda p: os.mkfifo(p), "not a regular file (a FIFO)"),
])
def test_register_with_a_bad_machine_file_is_one_line_and_leaves_it(tmp_path, make, why):
    path = tmp_path / ".asv-machine.json"
    make(path)
    before = path.read_bytes() if path.is_file() else path.lstat().st_mode
    rc, out, err = _register(tmp_path)
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"matmul-drift: error: cannot record this machine in {path}: {why}") and \
        err.endswith("; the file is left as it was\n"), err
    assert (path.read_bytes() if path.is_file() else path.lstat().st_mode) == before
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left beside it


def test_register_that_cannot_write_is_one_line_and_leaves_the_file(tmp_path, monkeypatch, capsys):
    from matmul_drift.cli import main as cli
    from matmul_drift.store import atomic

    path = tmp_path / ".asv-machine.json"
    path.write_text('{"version": 1}')
    monkeypatch.setenv("HOME", str(tmp_path))

    def unwritable(*args, **kwargs):  # as a read-only HOME does (root writes anywhere, so it is faked)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path))

    monkeypatch.setattr(atomic, "write_bytes", unwritable)
    assert cli.main(["machine", "--register"]) == 2
    assert capsys.readouterr().err == (f"matmul-drift: error: cannot record this machine in {path}: "
                                       "Permission denied; the file is left as it was\n")
    assert path.read_text() == '{"version": 1}'


def _driver_files(root, models):
    """The NVIDIA driver's /proc/driver/nvidia/gpus as it lays them out: a folder per PCI bus."""
    for i, model in enumerate(models):
        bus = root / f"0000:{0x18 + i:02x}:00.0"
        bus.mkdir(parents=True)
        (bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 95\nGPU UUID: \t GPU-{i}\n"
                                          f"Bus Location: \t {bus.name}\nDevice Minor: \t {i}\n")


def _nvidia_smi(bin_dir, body, monkeypatch):
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_gpus_come_from_the_drivers_files_where_nvidia_smi_hangs(tmp_path, monkeypatch):
    _driver_files(tmp_path / "gpus", ["NVIDIA H200", "NVIDIA H200"])
    _nvidia_smi(tmp_path / "bin", "exec sleep 30", monkeypatch)
    t0 = time.monotonic()
    names = machine.gpus(timeout=1, proc_root=str(tmp_path / "gpus"))
    assert names == ["NVIDIA H200", "NVIDIA H200"] and time.monotonic() - t0 < 15
    assert machine.name(fp(gpus=names)).startswith("intel-xeon-amx-2c-2x-h200-")


def test_gpus_prefer_nvidia_smi_and_fall_back_when_it_fails_or_is_missing(tmp_path, monkeypatch):
    _driver_files(tmp_path / "gpus", ["NVIDIA H100 80GB HBM3"])
    root = str(tmp_path / "gpus")
    monkeypatch.setenv("PATH", str(tmp_path / "none"))  # no nvidia-smi
    assert machine.gpus(proc_root=root) == ["NVIDIA H100 80GB HBM3"]
    assert machine.gpus(proc_root=str(tmp_path / "absent")) == []
    _nvidia_smi(tmp_path / "bin", "echo 'NVIDIA H100 80GB HBM3'", monkeypatch)
    assert machine.gpus(proc_root=str(tmp_path / "absent")) == ["NVIDIA H100 80GB HBM3"]
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'Failed to initialize NVML'; exit 9\n")
    assert machine.gpus(proc_root=root) == ["NVIDIA H100 80GB HBM3"]


def test_the_entry_keeps_facts_that_do_not_move_from_boot_to_boot(monkeypatch):
    """asv makes every machine field a graph parameter: the kernel build ("Linux 6.18.44-fc-v1045",
    "...-v1272") and the bytes a VM reports (25275990016, 25276194816) split the graphs by boot."""
    from asv.machine import Machine

    for os_name, ram in (("Linux 6.18.44-fc-v1045", "25275990016"), ("Linux 6.18.44-fc-v1272", "25276194816")):
        monkeypatch.setattr(Machine, "get_defaults", staticmethod(lambda o=os_name, r=ram: {"os": o, "ram": r}))
        e = machine.asv_entry(fp())
        assert (e["os"], e["ram"]) == (platform.system(), "24 GiB"), e
    assert machine.ram_gib("junk") == "junk"


def test_a_run_on_the_same_hardware_leaves_machine_json_as_recorded(tmp_path):
    from matmul_drift.jobs import asvrun

    recorded = {"arch": "x86_64", "cpu": "AMD EPYC", "gpu": "none", "isa": "avx2", "machine": "m", "num_cpu": "2",
                "os": "Linux 6.18.44-fc-v1045", "ram": "25275990016", "version": 1}
    (tmp_path / "old.json").write_text(json.dumps(recorded))
    (tmp_path / "same.json").write_text(json.dumps({**recorded, "os": "Linux", "ram": "24 GiB"}))
    (tmp_path / "other.json").write_text(json.dumps({**recorded, "num_cpu": "4"}))
    assert not asvrun._new_hardware(tmp_path / "same.json", tmp_path / "old.json")
    assert asvrun._new_hardware(tmp_path / "other.json", tmp_path / "old.json")
    assert asvrun._new_hardware(tmp_path / "same.json", tmp_path / "missing.json")
