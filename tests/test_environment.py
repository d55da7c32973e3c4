"""environment.py's CUDA facts, without a GPU: which cuBLAS the recorded version comes from."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from matmul_drift.measure import environment

SYSTEM = "/usr/local/cuda-13.3/targets/x86_64-linux/lib/libcublas.so.13.3.0.5"  # first on LD_LIBRARY_PATH
WHEEL = "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13"  # the wheel torch depends on
MAPS = f"""\
7f0000000000-7f0000001000 r--p 00000000 08:01 1001 {SYSTEM.replace('libcublas.so', 'libcublasLt.so')}
7f0000002000-7f0000003000 r--p 00000000 08:01 1002 {SYSTEM}
7f0000003000-7f0000004000 r-xp 00001000 08:01 1002 {SYSTEM}
7f0000005000-7f0000006000 rw-p 00000000 00:00 0
7f0000007000-7f0000008000 r--p 00000000 08:01 1003 /venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so
7ffc00000000-7ffc00001000 rw-p 00000000 00:00 0                          [stack]
"""


def test_mapped_libraries_name_the_cublas_this_process_loaded_and_not_cublaslt():
    assert environment.mapped_libraries(MAPS, "libcublas.so") == [SYSTEM]
    assert environment.mapped_libraries(MAPS, "libcublasLt.so") == [SYSTEM.replace("libcublas.so", "libcublasLt.so")]
    assert environment.mapped_libraries(f"7f00-7f01 r--p 0 08:01 7 {WHEEL} (deleted)\n", "libcublas.so") == [WHEEL]
    assert environment.mapped_libraries(MAPS, "libcudnn.so") == []


@pytest.mark.parametrize("mapped, want", [(MAPS, "13.3.0"), ("", "13.0.2")])
def test_the_recorded_cublas_version_is_the_one_torch_loaded(monkeypatch, mapped, want):
    """torch loads the cuBLAS it finds first (a system CUDA on LD_LIBRARY_PATH takes precedence
    over the nvidia wheel), and that is the one mapped in the process: its version is recorded,
    not the wheel's. Where nothing is mapped yet, the wheel's is the best guess."""
    import torch  # noqa: F401  (imported before ctypes.CDLL is replaced: its import loads libraries too)

    versions = {SYSTEM: (13, 3, 0), WHEEL: (13, 0, 2)}

    class Lib:
        def __init__(self, path, *args, **kwargs):
            if path not in versions:
                raise OSError(f"{path}: cannot open shared object file")
            self.version = versions[path]

        def cublasGetProperty(self, prop, ref):
            ref._obj.value = self.version[prop]
            return 0

    monkeypatch.setattr(ctypes, "CDLL", Lib)
    monkeypatch.setattr(environment, "_maps_text", lambda: mapped, raising=False)
    monkeypatch.setattr(environment.glob, "glob", lambda pattern, recursive=False: [WHEEL] if "libcublas" in pattern else [])
    environment._cublas_version.cache_clear()
    try:
        assert environment._cublas_version() == want
    finally:
        environment._cublas_version.cache_clear()


_ENV_AFTER = """
import sys
from matmul_drift.core import cases
from matmul_drift.measure import measure
for p in sys.argv[1:]:
    m = measure.measure(cases.adhoc(4, 8, 4), p, "cpu", timing=False, repeat=1)
print(m.env_id, m.environment["cpu"]["mkl_code_path"] is not None)
"""


def test_a_cpu_env_id_does_not_depend_on_what_the_process_measured_before():
    """MKL prints its banner (the code path it took) once a process, at the first call made
    with its verbose mode on. A bfloat16 product takes oneDNN or torch's own path, so a process
    that measured bfloat16 first recorded no code path, and another env-id than one that measured
    float64 first: `MATMUL_DRIFT_PRECISIONS=bfloat16` and a full run disagreed on one environment."""
    def env_after(*precisions):
        p = subprocess.run([sys.executable, "-c", _ENV_AFTER, *precisions], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout.split()

    alone, after_float64 = env_after("bfloat16"), env_after("float64", "bfloat16")
    # this machine's MKL prints a banner, or there is none to record (a torch without MKL)
    code = "import torch; a = torch.ones(2, 2, dtype=torch.float64); a @ a"
    banner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "MKL_VERBOSE": "1"}).stdout.startswith("MKL_VERBOSE")
    assert after_float64 == [after_float64[0], str(banner)]
    assert alone == after_float64


def test_a_backend_precision_set_by_the_newer_api_is_recorded_not_raised():
    # torch refuses get_float32_matmul_precision() once code set a backend's fp32_precision;
    # a fresh process, as the setting lasts for the process.
    code = ("import torch; torch.backends.mkldnn.matmul.fp32_precision = 'bf16'\n"
            "from matmul_drift.measure import environment\n"
            "print(environment.flags()['float32_matmul_precision'])\n"
            "print(environment.describe('cpu')['flags']['float32_matmul_precision'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["mkldnn=bf16, cuda=none"] * 2
