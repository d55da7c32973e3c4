"""What a measurement records, without torch: the Measurement and its parts' names, the seed of
the inputs, the operands' stored shapes, a timing's spread and the entry behind a kernel-id.

measure.py measures with torch; the commands that read, plan or render a measurement (explain
--render, the order probe's plan, run's parent side) import these names from here.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import numpy as np

from matmul_drift.core.cases import Case

SEED = 20261130  # the generator's seed: changing it changes every checksum
NOISY = 0.1  # IQR / median above which a time is marked noisy


class Unavailable(Exception):
    """The case cannot run here (no GPU, no TF32 support): a skip, not a failure."""


@dataclass
class Measurement:
    """Everything measured for one case, precision and device.

    error_u and every ``max_u`` are in units of u of the output dtype (error_u None when
    no entry is finite on both sides); ``max_ulp`` in output-dtype ulps; ``error`` says
    which entries error_u covers, ``nonfinite`` counts NaN/inf by cause (numerics.nonfinite,
    plus ``a`` and ``b`` for the inputs), ``reference`` names the exact reference's method;
    ``seconds`` is time_call's dict (seconds per product, with its spread).
    """

    case: str
    precision: str
    device: str
    m: int
    k: int
    n: int
    batch: int | None
    error_u: float | None
    gamma_k_u: float | None
    error: dict = field(default_factory=dict)
    nonfinite: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    slice_n: list[dict] = field(default_factory=list)
    slice_m: list[dict] = field(default_factory=list)
    run_to_run: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    kernel_id: int = 0
    # sha256 (hex) of each output's raw bits by part ("full", "slice_n=45999", "slice_m=3":
    # bits_part) and the id of that dict: a change of bits shows under the same kernels and drifts
    bits: dict = field(default_factory=dict)
    bits_id: int = 0
    environment: dict = field(default_factory=dict)
    env_id: int = 0
    input_checksum: str = ""
    seconds: dict | None = None
    layout: dict = field(default_factory=dict)
    # the case's pairs of slices compared with each other, then each with the full product ("b":
    # "full"): numerics.by_magnitude, with "a", "b", "form" and "cols"
    slice_pairs: list[dict] = field(default_factory=list)
    reference_seconds: float = 0.0  # wall seconds the exact reference took (the main job's cost)

    def to_dict(self) -> dict:
        return asdict(self)


def operand_shapes(case: Case, device: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of A and of B *as stored*: for ``linear`` B is stored as W (N, K)."""
    s = case.shape(device)
    if case.op == "mv":
        return (s.k,), (s.k, s.n)
    if case.op == "bmm":
        return (s.batch, s.m, s.k), (s.batch, s.k, s.n)
    if case.op == "linear":
        return (s.m, s.k), (s.n, s.k)
    return (s.m, s.k), (s.k, s.n)


def bits_digest(bits: np.ndarray) -> str:
    """sha256 (64 hex digits) of an output's raw bits (tensor_bits) in C order: bit patterns, so
    -0.0 and 0.0, or two NaN payloads, differ; shape and dtype are the cell's and left out."""
    return hashlib.sha256(np.ascontiguousarray(bits)).hexdigest()


def bits_part(kind: str, size: int, form: str = "as-is") -> str:
    """The name of a slice's output in Measurement.bits: "slice_n=45999", "slice_n=45999 2d"."""
    return f"{kind}={size}" + ("" if form == "as-is" else f" {form}")


def kernel_entry(device: str, kern: dict) -> dict:
    """The catalog text behind a kernel-id: the device and its ordered kernel lists."""
    return {"device": device, **kern}


def spread(samples: list[float], per_run: int, threads: int, method: str) -> dict:
    """The dict of time_call from per-call samples (seconds)."""
    q = np.quantile(np.asarray(samples, dtype=np.float64), [0.25, 0.5, 0.75])
    median, iqr = float(q[1]), float(q[2] - q[0])
    return {"median": median, "iqr": iqr, "runs": len(samples), "calls_per_run": per_run,
            "threads": threads, "noisy": bool(median > 0 and iqr / median > NOISY),
            "method": method}
