"""Versions and matmul flags of the running process, as one nested dict.

Its canonical JSON is stored in the catalog; the env-id names it. Anything that can
change a product's bits belongs here, and the version of the measuring method of each
series (core/series.py); nothing that changes from run to run does (no timestamps, no host
names, no clocks).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import platform
import re

import torch

from matmul_drift.core import series
from matmul_drift.core.routes import ROUTE_VARS


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _config_version(pattern: str) -> str | None:
    m = re.search(pattern, torch.__config__.show())
    return m.group(1) if m else None


def _safe(fn, default=None):
    try:
        return fn()
    except Exception:  # a flag a torch version lacks is recorded as missing, not fatal
        return default


def _float32_precision() -> str:
    """torch.get_float32_matmul_precision(); where code set a backend's fp32_precision (the
    newer API), torch refuses that call, so each backend's setting: "mkldnn=bf16, cuda=none"."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return ", ".join(f"{name}={_safe(lambda b=b: b.matmul.fp32_precision)}"
                         for name, b in (("mkldnn", torch.backends.mkldnn),
                                         ("cuda", torch.backends.cuda)))


def flags() -> dict:
    """Every matmul flag torch exposes, as plain values."""
    m = torch.backends.cuda.matmul
    return {
        "float32_matmul_precision": _float32_precision(),
        "cuda_matmul_allow_tf32": bool(m.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "allow_fp16_reduced_precision_reduction":
            _safe(lambda: bool(m.allow_fp16_reduced_precision_reduction)),
        "allow_bf16_reduced_precision_reduction":
            _safe(lambda: bool(m.allow_bf16_reduced_precision_reduction)),
        # torch 2.7 and newer: fp16 accumulation and split-K's reduction. (Not fp32_precision: it
        # reads "none" until a precision is first set, then "ieee", within one process.)
        "allow_fp16_accumulation": _safe(lambda: bool(m.allow_fp16_accumulation)),
        "allow_fp16_reduced_precision_reduction_split_k":
            _safe(lambda: bool(m.allow_fp16_reduced_precision_reduction_split_k)),
        "allow_bf16_reduced_precision_reduction_split_k":
            _safe(lambda: bool(m.allow_bf16_reduced_precision_reduction_split_k)),
        "preferred_blas_library":
            _safe(lambda: str(torch.backends.cuda.preferred_blas_library()).split(".")[-1]),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
    }


def mapped_libraries(maps: str, name: str) -> list[str]:
    """The paths of the shared objects called ``name`` or ``name.*`` (``libcublas.so``: not
    libcublasLt) in a /proc/<pid>/maps text, first mapped first, each once."""
    out: list[str] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].removesuffix(" (deleted)")
        base = os.path.basename(path)
        if (base == name or base.startswith(name + ".")) and path not in out:
            out.append(path)
    return out


def _maps_text() -> str:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


@functools.cache  # a process loads one cuBLAS; the search walks nvidia/*'s trees (headers and all)
def _cublas_version() -> str | None:
    """cuBLAS's own version, read through ctypes from the library torch loaded (libtorch_cuda
    links it, so it is mapped once torch is imported), else from one torch ships. The mapped
    one comes first: a cuBLAS earlier on LD_LIBRARY_PATH (a system CUDA) is the one torch
    runs, whatever the wheel under nvidia/ holds."""
    candidates = mapped_libraries(_maps_text(), "libcublas.so")
    for mod in ("nvidia.cublas", "nvidia.cu13", "nvidia.cu12"):
        spec = _safe(lambda: __import__(mod, fromlist=["_"]))
        for path in getattr(spec, "__path__", []) or []:
            candidates += glob.glob(os.path.join(path, "**", "libcublas.so*"), recursive=True)
    candidates += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcublas.so*"))
    candidates += ["libcublas.so"]
    for lib in candidates:
        try:
            h = ctypes.CDLL(lib)
        except OSError:
            continue
        parts = []
        for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int()
            if h.cublasGetProperty(prop, ctypes.byref(v)) != 0:
                break
            parts.append(str(v.value))
        if len(parts) == 3:
            return ".".join(parts)
    return None


@functools.cache
def _driver_version() -> str | None:
    try:
        h = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int()
    if h.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def cuda_info(index: int = 0) -> dict:
    """CUDA, cuBLAS, cuDNN, driver and GPU facts. Initialises CUDA: call in a benchmark
    child only."""
    props = torch.cuda.get_device_properties(index)
    return {
        "runtime": torch.version.cuda,
        "cublas": _cublas_version(),
        "cudnn": _safe(torch.backends.cudnn.version),
        "driver": _driver_version(),
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
    }


def describe(device: str, mkl_banner: str | None = None) -> dict:
    """The environment of this process for products on ``device`` ('cpu' or 'cuda')."""
    return {
        "torch": {"version": torch.__version__, "git": torch.version.git_version,
                  "cuda_build": torch.version.cuda},
        "cuda": cuda_info() if device == "cuda" else None,
        "cpu": {
            "model": cpu_model(),
            "capability": _safe(torch.backends.cpu.get_cpu_capability),
            "mkl_code_path": mkl_banner,
        },
        "libs": {
            "mkl": _config_version(r"Math Kernel Library Version ([^\s]+)"),
            "onednn": _config_version(r"MKL-DNN v([^\s]+)"),
        },
        "threads": torch.get_num_threads(),
        "device": device,
        "flags": flags(),
        "env_vars": {k: os.environ[k] for k in ROUTE_VARS if k in os.environ},
        "method": dict(series.METHOD),  # what each series measures, as this code measures it
    }
