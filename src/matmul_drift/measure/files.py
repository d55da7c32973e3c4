"""Operands from the user's files: .npy or .pt read into torch tensors, mapped rather than read
where the format allows, and refused in one line (UsageError) when they are not dense
floating-point arrays or do not fit in memory."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from matmul_drift.core.errors import UsageError
from matmul_drift.measure import memory
from matmul_drift.measure.reference import all_finite
from matmul_drift.store import bounded


def load_array(path: Path, host_check: bool = True):
    """A float array from .npy or .pt, as a torch tensor; UsageError if unreadable.
    ``host_check``: refuse a file that must be read whole (legacy .pt) when it exceeds
    MemAvailable."""
    try:
        try:  # before opening: a FIFO would make np.load or torch.load wait for a writer
            bounded.check_regular(path)
        except bounded.Refused as exc:
            raise UsageError(f"{path}: {exc}") from None
        # Mapped, not read: the memory check comes before a single value is, so a file larger
        # than memory is one line, not an OOM kill (restride copies them after the check).
        if path.suffix == ".npy":
            # torch warns that the mapping is read-only: it is never written
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr = np.load(path, allow_pickle=False, mmap_mode="r")
                # torch.from_numpy refuses it: swapped, which reads it whole
                if not arr.dtype.isnative:
                    _check_read_whole(path, host_check,
                                      "values in the other byte order, swapped to this machine's,",
                                      "or re-save it in this machine's byte order, which is mapped")
                    # order "K": a Fortran array stays one
                    arr = arr.astype(arr.dtype.newbyteorder("="))
                t = torch.from_numpy(arr)
        elif path.suffix == ".pt":
            # torch warns that sparse CSR is beta: the refusal below says enough
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError as exc:  # torch's legacy format cannot be mapped: read it
                    if "_use_new_zipfile_serialization" not in str(exc):
                        raise
                    # before the product's check
                    _check_read_whole(path, host_check, "torch's legacy format,",
                                      "or re-save it with torch.save's default format, which is "
                                      "mapped")
                    t = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(t, torch.Tensor):
                raise UsageError(f"{path}: expected one tensor, found {type(t).__name__}")
        else:
            raise UsageError(f"{path}: unknown file type (expected .npy or .pt)")
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"cannot read {path}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    if t.is_nested:  # before anything asks its shape: a nested tensor has none
        raise UsageError(f"{path}: a nested tensor; explain measures dense operands")
    # refused, not densified: torch.sparse's kernels are not the dense GEMM measured here
    if t.layout != torch.strided:
        raise UsageError(f"{path}: a sparse tensor ({t.layout}); explain measures dense operands "
                         "(save t.to_dense())")
    if t.is_meta:
        raise UsageError(f"{path}: a meta tensor, shape {tuple(t.shape)} and no values: nothing to "
                         "measure")
    if not t.is_floating_point():
        raise UsageError(f"{path}: expected a floating-point array, found {t.dtype}")
    return t.detach()  # requires_grad (an nn.Parameter): the values are what is measured


def _check_read_whole(path: Path, host_check: bool, what: str, remedy: str) -> None:
    """UsageError (one line: ``what``, then ``remedy``) when a file read whole is larger than
    memory.check allows."""
    try:
        memory.check((path.stat().st_size, 0), f"{path}: {what} read whole,", "cpu", host_check)
    except memory.TooLarge as exc:
        raise UsageError(f"{exc}; {remedy}") from None


def rounded_away(t, rounded) -> dict:
    """Entries of a file's tensor ``t`` that rounding to the measured dtype made ±inf
    (``to_inf``, finite before) or 0 (``to_zero``, non-zero before): counts. Rounding keeps
    NaN, ±inf and 0, and never makes a value non-zero or finite, so the differences of the
    two tensors' counts are those entries."""
    # the float8 kinds: torch counts nothing in them; float32 holds each value
    if t.dtype.itemsize == 1:
        t = t.float()
    to_inf = (0 if all_finite(rounded)
              else int(torch.isfinite(t).sum()) - int(torch.isfinite(rounded).sum()))
    return {"to_inf": to_inf,
            "to_zero": int(torch.count_nonzero(t)) - int(torch.count_nonzero(rounded))}


def text_name(path: Path) -> str:
    """A file's name as text: bytes that are not UTF-8 as \\xNN (Python keeps them as lone
    surrogates, which no JSON reader takes as text)."""
    return os.fsencode(path.name).decode("utf-8", "backslashreplace")
