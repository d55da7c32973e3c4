"""One batch size of `matmul-drift map`: ``A[:M] @ B``, traced once, against two anchors.

The anchors are made once per map: ``A[:1] @ B`` (row 0 must match it) and the full product
``A @ B`` (A's M_full rows; the first M rows must match it). Each M then costs one product,
whose kernels and bits come from the same call (kernels.traced). Operands, host copies,
comparison and kernel-ids are measure.py's, so a map's point at M says what `scan --vary m`
and `explain --slice-m` say of the rows there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from matmul_drift.core import ids, numerics
from matmul_drift.core.cases import storage_dtype
from matmul_drift.measure import inputs, kernels, measure, record
from matmul_drift.measure.reference import abs_product_pow2


@dataclass
class Anchors:
    """The products every M is compared with, on the host (raw bits and float64 values, in
    output units): ``one`` is ``A[..., :1, :] @ B``, ``full`` is ``A @ B`` (M_full rows).
    ``scaled``·2^``absexp`` is |A||B| of the full product (float64, output units; ``absexp``
    None where it overflows nowhere), the scale of ``max_u``. ``checksum`` (hex) names the
    bits of both products: a resumed map must be compared with the same ones."""

    one_bits: np.ndarray
    one_values: np.ndarray
    full_bits: np.ndarray
    full_values: np.ndarray
    scaled: np.ndarray
    absexp: np.ndarray | None
    checksum: str


def check(device: str, precision: str) -> None:
    """record.Unavailable where ``precision`` cannot run on ``device`` in this process: a CUDA
    mode on the CPU, no GPU, or bfloat16 on a GPU without it (before sm_80 torch emulates it
    in float32, which is not the kernel a user of that GPU would map)."""
    measure.check_device(device, precision)
    if device == "cuda" and storage_dtype(precision) == "bfloat16":
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            raise record.Unavailable(f"this GPU ({torch.cuda.get_device_name()}) has no bfloat16 "
                                     "matmul")


def anchors(ops: measure.Operands, made: dict | None = None) -> Anchors:
    """The two anchor products of ``ops`` and |A||B|, untraced (they are not map points), or
    those ``made`` holds (as batch_point takes it; the full product at M = A's rows)."""
    made = made or {}
    one = made.get(1) or (ops.product(ops.a[..., :1, :]),)
    full = made.get(int(ops.a.shape[-2])) or (ops.product(),)
    one_bits, one_values = measure.on_host(one[0])
    full_bits, full_values = measure.on_host(full[0])
    scaled, absexp = abs_product_pow2(ops.product, ops.a, ops.b)
    return Anchors(one_bits, one_values, full_bits, full_values, scaled, absexp,
                   inputs.checksum(one_bits, full_bits))


def batch_point(ops: measure.Operands, size: int, anc: Anchors, *, dtype: str, device: str,
                made: dict | None = None) -> dict:
    """The map's point at M = ``size``: one traced product ``A[..., :size, :] @ B``, or the one
    ``made`` holds ({m: (output, kernel names)}: measure.rows_made, the same product made already).

    Returns ``size``, ``kernels`` (the normalised route), ``kernel_id`` (12 hex digits, as
    scan's), and for ``row0`` (its row 0 against ``anc.one``) and ``rows`` (its rows against
    the first ``size`` rows of ``anc.full``) each: ``*_max_ulp`` (output ulps, over entries
    finite on both sides), ``*_frac_differ`` (the fraction of entries whose bits differ,
    non-finite ones included) and ``*_max_u`` (u of ``dtype``). Zero ulps and zero
    fraction: bit-identical.
    """
    a_m = ops.a[..., :size, :]
    out, names = (made or {}).get(size) or kernels.traced(lambda: ops.product(a_m), device)
    y_bits, y = measure.on_host(out)
    point = {"size": size,
             "kernel_id": ids.hex_id(ids.object_id(record.kernel_entry(device, {"full": names}))),
             "kernels": names}
    against = {"row0": (1, anc.one_bits, anc.one_values),
               "rows": (size, anc.full_bits[..., :size, :], anc.full_values[..., :size, :])}
    for name, (rows, x_bits, x) in against.items():
        cut = (Ellipsis, slice(0, rows), slice(None))
        d = numerics.drift(x_bits, y_bits[cut], x, y[cut], anc.scaled[cut], dtype,
                           absexp=None if anc.absexp is None else anc.absexp[cut])
        point.update({f"{name}_{key}": d[key] for key in ("max_ulp", "frac_differ", "max_u")})
    return point
