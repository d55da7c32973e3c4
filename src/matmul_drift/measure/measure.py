"""One case in, one Measurement out.

Error against the exact product (reference.py) computed on the case's device, slice drift
(``slice_n``, ``slice_m``), run-to-run drift, the kernels that ran, a digest of each
output's bits, the environment and the time. Inputs come from inputs.py, so the same case
gives the same bits everywhere; their checksum travels with the result. What is recorded
(Measurement, the bits' part names, the seed) is record.py's, which needs no torch.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from matmul_drift.core import cases, ids, numerics
from matmul_drift.core.cases import Case, storage_dtype
from matmul_drift.core.routes import merged
from matmul_drift.measure import clocks, environment, inputs, kernels, memory
from matmul_drift.measure.record import (SEED, Measurement, Unavailable, bits_digest, bits_part,
                                         kernel_entry, operand_shapes, spread)
from matmul_drift.measure.reference import Reference, all_finite, exact_product

# --- operands -------------------------------------------------------------------------

_INT_VIEW = {"float64": "int64", "float32": "int32", "float16": "int16", "bfloat16": "int16"}


# Row-slice products A[..., :m, :] @ B as measure_operands made them (the output tensor and
# its kernels; the full product at m = A's rows), by (case id, operands' checksum, precision,
# device, threads, m): the batch-invariance map of the same inputs asks for them again
# (batchpoint.py), which would otherwise measure every one of them again.
# Outputs of at most ROWS_BYTES each, ROWS_TOTAL in all: a process that measures on and on
# (explain's fuzz tests, a long scan) keeps no more; the suite's batched CPU cases hold 10 MB.
_ROWS: dict[tuple, tuple] = {}
ROWS_BYTES, ROWS_TOTAL = 4 << 20, 64 << 20


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _rows_key(case_id: str, checksum: str, precision: str, device: str) -> tuple:
    """_ROWS's key, less m: the threads in force are part of it (they may change the route)."""
    return case_id, checksum, precision, device, torch.get_num_threads()


def _keep_rows(key: tuple, m: int, y, names: list[str] | None) -> None:
    """Keeps ``y`` (with its kernel names) as the row slice m of ``key``'s operands, within
    ROWS_BYTES and ROWS_TOTAL; nothing without a checksum or a trace."""
    held = sum(_nbytes(t) for t, _ in _ROWS.values())
    if (key[1] and names is not None and _nbytes(y) <= ROWS_BYTES
            and held + _nbytes(y) <= ROWS_TOTAL):
        _ROWS[(*key, m)] = (y, names)


def rows_made(case_id: str, checksum: str, precision: str, device: str) -> dict[int, tuple]:
    """{m: (output, kernel names)} of the row slices measured on these operands in this process."""
    key = _rows_key(case_id, checksum, precision, device)
    return {k[-1]: v for k, v in _ROWS.items() if k[:-1] == key}


def operand_bits(case: Case, dtype: str, device: str, seed: int = SEED,
                 with_checksum: bool = True) -> tuple[np.ndarray, np.ndarray, str]:
    """Bits of A and B (as stored) rounded to ``dtype``, and their checksum ("" without)."""
    a_shape, b_shape = operand_shapes(case, device)
    a = inputs.draw_bits(seed, f"{case.id}:A", a_shape, dtype, case.dist)
    b = inputs.draw_bits(seed, f"{case.id}:B", b_shape, dtype, case.dist)
    return a, b, inputs.checksum(a, b) if with_checksum else ""


def to_tensor(bits: np.ndarray, dtype: str, device: str):
    """A torch tensor of ``dtype`` on ``device`` holding exactly ``bits``."""
    signed = bits.view(getattr(np, _INT_VIEW[dtype]))
    return torch.from_numpy(signed).to(device).view(getattr(torch, dtype))


def tensor_bits(t) -> np.ndarray:
    """The raw bits of a tensor as an unsigned numpy array (on the host)."""
    name = str(t.dtype).replace("torch.", "")
    signed = t.detach().contiguous().view(getattr(torch, _INT_VIEW[name])).cpu().numpy()
    return signed.view(getattr(np, "u" + _INT_VIEW[name]))


# --- flags and devices ----------------------------------------------------------------


def check_device(device: str, precision: str = "float32") -> None:
    """Raise Unavailable where ``device``/``precision`` cannot run in this process."""
    if device == "cpu":
        if precision in numerics.TF32:
            raise Unavailable(f"{precision} is a CUDA matmul mode; it does not apply on the CPU")
        return
    if device != "cuda":
        raise ValueError(f"unknown device {device!r}; expected cpu or cuda")
    if not torch.cuda.is_available():
        raise Unavailable("cuda requested but no CUDA GPU is available")
    if precision in numerics.TF32 and torch.cuda.get_device_capability()[0] < 8:
        raise Unavailable(f"{precision} needs sm_80 or newer")


@contextmanager
def precision_flags(precision: str):
    """Set the matmul flags of a precision for the duration, then restore them."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    try:
        if precision == "float32-tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
        elif precision == "float32-high":
            torch.set_float32_matmul_precision("high")
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


# --- the products ---------------------------------------------------------------------


@dataclass
class Operands:
    """A and B as tensors (B as the op sees it) plus the stored W for ``linear``."""

    a: object
    b: object
    op: str
    layout: str

    def product(self, a=None, b=None):
        """The case's product of ``a`` and ``b`` (defaults: the full operands)."""
        a = self.a if a is None else a
        b = self.b if b is None else b
        if self.op == "linear":
            return torch.nn.functional.linear(a, b.t())  # b is W.t(); linear takes W
        return torch.matmul(a, b)

    def b_cols(self, n: int):
        """B's first n columns: a strided view, or a contiguous copy for layout 'copy'."""
        view = self.b[..., :n]
        return view.contiguous() if self.layout == "copy" else view


def restride(t, dtype, device: str, keep: bool = True):
    """``t`` converted to ``dtype`` on ``device`` with its shape, strides and storage offset
    kept (the layout decides the kernel: a transposed view runs SGEMM(T,…)), or contiguous
    when ``keep`` is false or the strides overlap (stride 0 cannot be written). Always a copy."""
    extent, src = restride_elements(t, keep), t
    # rounded once, not through float32
    if t.dtype == torch.float64 and dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        # t's shape, contiguous
        src = to_tensor(inputs.round_bits(t.cpu().numpy(), name), name, "cpu")
    if extent is not None:
        out = torch.zeros(extent, dtype=dtype, device=device).as_strided(t.shape, t.stride(),
                                                                         t.storage_offset())
        try:
            out.copy_(src)
            return out
        except RuntimeError:  # strides that overlap some other way
            pass
    # never the file's mapping
    return src.to(device=device, dtype=dtype, memory_format=torch.contiguous_format, copy=True)


def restride_elements(t, keep: bool = True) -> int | None:
    """Elements ``restride`` allocates to keep ``t``'s layout: its storage offset plus the span
    of its strides (a view of a large storage spans most of it); None where it copies ``t``
    contiguous instead (numel elements)."""
    if keep and t.numel() and all(st > 0 or sz == 1 for sz, st in zip(t.shape, t.stride())):
        return t.storage_offset() + 1 + sum((sz - 1) * st for sz, st in zip(t.shape, t.stride()))
    return None


def describe_layout(t) -> dict:
    """Shape, strides (elements), storage offset and order (C, F or strided) of a tensor."""
    order = ("C" if t.is_contiguous() else "F" if t.dim() == 2 and t.t().is_contiguous()
             else "strided")
    return {"shape": list(t.shape), "strides": list(t.stride()), "offset": int(t.storage_offset()),
            "order": order}


def make_operands(a_bits, b_bits, dtype: str, device: str, case: Case) -> Operands:
    a = to_tensor(a_bits, dtype, device)
    b = to_tensor(b_bits, dtype, device)
    if case.op == "linear":
        b = b.t()  # stored as W (N, K); the product sees W.t() (K, N)
    return Operands(a, b, case.op, case.layout)


def reference(ops: Operands) -> Reference:
    """The exact product of the operands (reference.py), on their device; host arrays."""
    return exact_product(ops.product, ops.a, ops.b)


def on_host(t) -> tuple[np.ndarray, np.ndarray]:
    """A tensor's raw bits and its values in float64 (output units), on the host."""
    return tensor_bits(t), t.double().cpu().numpy()


def compare(x_bits, x, y_host: tuple, absprod: tuple, dtype, cut, k, precision=None) -> dict:
    """numerics.drift of ``y_host`` (on_host's pair) against ``x`` over ``cut``; ``absprod``:
    (|A||B|·2^-e, e) as Reference.absprod_pow2() gives it (e None where |A||B| overflows
    nowhere)."""
    y_bits, y = y_host
    scaled, e = absprod
    return numerics.drift(x_bits[cut], y_bits[cut], x[cut], y[cut], scaled[cut], dtype, k,
                          precision, None if e is None else e[cut])


@dataclass
class Top:
    """The product at the top of a scan's range, on the host.

    ``bits`` raw output bits, ``values`` the same in float64 (output units), ``ref`` the
    exact reference (its ``absprod`` is |A||B|, float64, output units).
    """

    bits: np.ndarray
    values: np.ndarray
    ref: Reference
    ref_seconds: float = 0.0  # wall seconds of the exact reference


def top_product(ops: Operands, y=None) -> Top:
    """The full product of ``ops`` (``y`` if already made) and its exact reference, on the host."""
    bits, values = on_host(ops.product() if y is None else y)
    t0 = time.perf_counter()
    ref = reference(ops)
    return Top(bits, values, ref, time.perf_counter() - t0)


def _count_nonfinite(t) -> int:
    return 0 if all_finite(t) else int((~torch.isfinite(t)).sum())


def traced_call(call, device: str, routes: list | None):
    """``call()``; its kernels are appended to ``routes`` when given (same call, not a second)."""
    if routes is None:
        return call()
    y, names = kernels.traced(call, device)
    routes += names
    return y


def measure_operands(
    ops: Operands,
    *,
    case: Case,
    precision: str,
    device: str,
    checksum: str,
    slice_n: tuple[int, ...] = (),
    slice_m: tuple[int, ...] = (),
    repeat: int = 3,
    with_kernels: bool = True,
    timing: bool = True,
) -> Measurement:
    """Measure one product and its slices; ``ops`` already on ``device`` in the storage dtype."""
    dtype = storage_dtype(precision)
    u = numerics.unit_roundoff(dtype)
    k = int(ops.a.shape[-1])
    with precision_flags(precision):
        kernels.handle_state()  # what earlier calls left: this measurement's state is its own
        full: list[str] | None = [] if with_kernels else None
        y_full = traced_call(ops.product, device, full)
        top = top_product(ops, y_full)
        kern = {"full": full} if with_kernels else {}
        c_bits, c_val, ref = top.bits, top.values, top.ref
        slack = ref.slack_or_relative()  # how far hi + lo may be from the exact value, per entry
        # |A||B| = scaled·2^absexp: finite where it overflows
        scaled, absexp = absprod = ref.absprod_pow2()
        err = numerics.error(c_val, ref.hi, ref.lo, ref.finite, scaled, dtype, k, precision, slack,
                             absexp)
        # an exact reference's hi is the exact value rounded: it alone says where inf is
        # the rounding
        near = () if ref.exact else (slack, ref.lo)
        nonfinite = {"a": _count_nonfinite(ops.a), "b": _count_nonfinite(ops.b),
                     **numerics.nonfinite(c_val, ref.hi, ref.finite, dtype, *near)}
        routes_n: list[tuple[str, list[str]]] = []  # (slice, its kernels) per traced call
        routes_m: list[tuple[str, list[str]]] = []

        def traced(call, label: str, routes: list):
            """call() through traced_call, its kernels recorded in ``routes`` under ``label``."""
            names: list[str] | None = [] if with_kernels else None
            y = traced_call(call, device, names)
            if names is not None:
                routes.append((label, names))
            return y

        slices_n, pairs = [], []
        bits = {"full": bits_digest(c_bits)}  # each output hashed where it is on the host anyway
        paired = {n for pair in case.pairs for n in pair}
        for form in case.forms:
            a_form = ops.a.unsqueeze(0) if form == "2d" else ops.a
            held = {}  # the outputs of paired sizes, on the host
            for n in slice_n:
                b_n = ops.b_cols(n)
                call = lambda a_form=a_form, b_n=b_n: ops.product(a_form, b_n)  # noqa: E731
                y = traced(call, f"n={n}" + (f" {form}" if len(case.forms) > 1 else ""), routes_n)
                if form == "2d":
                    y = y.squeeze(0)
                cols = min(n, case.compare_cols or n)
                y_host = on_host(y)
                bits[bits_part("slice_n", n, form)] = bits_digest(y_host[0])
                cut = (Ellipsis, slice(0, cols))
                d = compare(c_bits, c_val, y_host, absprod, dtype, cut, k, precision)
                slices_n.append({"n": n, "form": form, "cols": cols, **d})
                if n in paired:
                    held[n] = y_host
            for na, nb in case.pairs:
                if na in held and nb in held:
                    cols = min(na, nb, case.compare_cols or na)
                    cut = (Ellipsis, slice(0, cols))
                    (xa, va), (xb, vb) = held[na], held[nb]
                    pairs.append({"a": na, "b": nb, "form": form, "cols": cols,
                                  **numerics.by_magnitude(xa[cut], xb[cut], va[cut], vb[cut],
                                                          dtype)})
                    # each against the full product
                    for n, (x, v) in ((na, held[na]), (nb, held[nb])):
                        pairs.append({"a": n, "b": "full", "form": form, "cols": cols,
                                      **numerics.by_magnitude(x[cut], c_bits[cut], v[cut],
                                                              c_val[cut], dtype)})
        slices_m = []
        rows = _rows_key(case.id, checksum, precision, device)
        if ops.a.dim() > 1:
            _keep_rows(rows, int(ops.a.shape[-2]), y_full, full)
        for m in slice_m:
            a_m = ops.a[..., :m, :]
            y = traced(lambda a_m=a_m: ops.product(a_m), f"m={m}", routes_m)
            _keep_rows(rows, m, y, routes_m[-1][1] if with_kernels else None)
            y_host = on_host(y)
            bits[bits_part("slice_m", m)] = bits_digest(y_host[0])
            cut = (Ellipsis, slice(0, m), slice(None))
            d = compare(c_bits, c_val, y_host, absprod, dtype, cut, k, precision)
            slices_m.append({"m": m, **d})
        if routes_n:
            kern.update(merged("slice_n", routes_n))
        if routes_m:
            kern.update(merged("slice_m", routes_m))

        run_to_run = {"repeat": repeat,
                      **repeat_drift(ops, c_bits, c_val, absprod, dtype, k, repeat, precision)}
        seconds = time_call(ops.product, device) if timing else None
        env = environment.describe(device, kernels.mkl_code_path() if device == "cpu" else None)
        if device == "cuda":  # the handle's set-up is no part of the kernel-id (core/blaslog.py)
            env["cublas_handle"] = kernels.handle_state()

    s = case.shape(device)
    return Measurement(
        case=case.id, precision=precision, device=device, m=s.m, k=k, n=s.n, batch=s.batch,
        error_u=err.pop("error_u"), gamma_k_u=numerics.bound_u(k, dtype, precision), error=err,
        nonfinite=nonfinite, reference=ref.describe(u), slice_n=slices_n, slice_m=slices_m,
        run_to_run=run_to_run, kernels=kern, kernel_id=ids.object_id(kernel_entry(device, kern)),
        bits=bits, bits_id=ids.object_id(bits),
        environment=env, env_id=ids.object_id(env), input_checksum=checksum, seconds=seconds,
        layout={"a": describe_layout(ops.a), "b": describe_layout(ops.b)}, slice_pairs=pairs,
        reference_seconds=top.ref_seconds,
    )


def repeat_drift(ops: Operands, c_bits, c_val, absprod: tuple, dtype: str, k: int, repeat: int,
                 precision: str | None = None) -> dict:
    """The worst drift (by share of entries, then ulps) of ``repeat`` − 1 more full products
    against the first (``c_bits``/``c_val``; ``absprod`` as ``compare`` takes it);
    numerics.drift's keys, all 0 when none differ."""
    worst = {"max_ulp": 0, "max_u": 0.0, "max_u_entries": 0, "frac_differ": 0.0,
             "nonfinite_differ": 0, "sign_changes": 0, "beyond_bound": 0}
    for _ in range(max(repeat - 1, 0)):
        d = compare(c_bits, c_val, on_host(ops.product()), absprod, dtype, (Ellipsis,), k,
                    precision)
        if (d["frac_differ"], d["max_ulp"]) >= (worst["frac_differ"], worst["max_ulp"]):
            worst = {key: d[key] for key in worst}
    return worst


def measure(case: Case, precision: str, device: str, *, slice_n=None, slice_m=None, repeat=None,
            with_kernels: bool = True, timing: bool = True, seed: int = SEED) -> Measurement:
    """Measure a catalog case. ``slice_n``/``slice_m`` override the case's own slices."""
    check_device(device, precision)
    dtype = storage_dtype(precision)
    a_bits, b_bits, checksum = operand_bits(case, dtype, device, seed)
    ops = make_operands(a_bits, b_bits, dtype, device, case)
    del a_bits, b_bits
    return measure_operands(
        ops, case=case, precision=precision, device=device, checksum=checksum,
        slice_n=case.slice_n if slice_n is None else slice_n,
        slice_m=case.slice_m if slice_m is None else slice_m,
        repeat=case.repeat if repeat is None else repeat,
        with_kernels=with_kernels, timing=timing,
    )


# --- time -----------------------------------------------------------------------------


# CPU: blocks of calls long against the timer's overhead
BLOCK_SECONDS, MIN_RUNS, MIN_SECONDS = 0.02, 5, 0.2


def time_call(fn, device: str, reps: int = 20, flush_bytes: int = memory.FLUSH_BYTES,
              min_runs: int = MIN_RUNS, min_seconds: float = MIN_SECONDS,
              block_seconds: float = BLOCK_SECONDS) -> dict:
    """Seconds per call of ``fn``, with its spread.

    Returns ``median`` and ``iqr`` (seconds per call), ``runs`` (samples behind them),
    ``calls_per_run``, ``threads`` (torch's CPU thread count), ``noisy`` (IQR/median above
    0.1) and ``method``. On the CPU, at the process's own thread count, in blocks of calls
    of about ``block_seconds`` (20 ms; as blocked_autorange, but never fewer
    than ``min_runs`` blocks (5), so the IQR means something, and ``min_seconds`` (0.2 s) in
    all; blocked_autorange may take one). On CUDA as
    triton.testing.do_bench does: 5 calls, each after its L2 flush (a 256 MiB write), estimate
    one flushed call, then about 25 ms of warm-up and 100 ms of flushed calls (``reps`` at
    least where they fit in clocks.CELL_SECONDS), CUDA events around the call alone; also
    ``quantiles`` (the 0.2, 0.5 and 0.8 quantiles, seconds) and ``clocks`` (clocks.verdict:
    the GPU's slowdown counters, SM clock and throttle reasons around the timed calls, and
    whether they fell).
    """
    threads = torch.get_num_threads()
    if device != "cuda":
        # perf_counter around blocks of calls: CPU ops return when done. (torch.utils.benchmark's
        # Timer.timeit adds two warm-up calls to every block: three times the cost of a slow call.)
        def block(number: int) -> float:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            return (time.perf_counter() - t0) / number

        once = block(1)  # warm-up, and the cost of one call
        per_run = max(1, min(10_000, int(block_seconds / max(once, 1e-9))))
        samples: list[float] = []
        while len(samples) < min_runs or sum(samples) * per_run < min_seconds:
            samples.append(block(per_run))
        method = (f"time.perf_counter around blocks of calls of about {block_seconds * 1e3:g} ms, "
                  f"at least {min_runs} blocks and {min_seconds} s, at the process's thread count")
    else:
        cache = torch.empty(flush_bytes, dtype=torch.int8, device="cuda")

        def timed(n: int) -> list[float]:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            for s, e in zip(starts, ends):
                cache.zero_()
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]

        def flushed() -> float:
            """Seconds of one call with its flush: do_bench's estimate, events around
            ESTIMATE_CALLS of ``cache.zero_(); fn()``, which sizes the runs."""
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(clocks.ESTIMATE_CALLS):
                cache.zero_()
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / clocks.ESTIMATE_CALLS

        fn()
        torch.cuda.synchronize()
        warmup, n = clocks.counts(flushed(), least=reps)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        uuid = clocks.nvml_uuid(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        before, t0 = clocks.read(uuid), time.perf_counter()
        samples = timed(n)
        window = time.perf_counter() - t0
        per_run, method = 1, ("CUDA events, L2 flushed before each call; about 25 ms of warm-up "
                              "and 100 ms of flushed calls, sized on 5 flushed calls "
                              "(triton.testing.do_bench)")
        out = spread(samples, per_run, threads, method)
        q = np.quantile(np.asarray(samples, dtype=np.float64), clocks.QUANTILES)
        # the GPU's slowdown counters over the timed window: a cap that lifted at the end shows
        return {**out, "quantiles": [float(x) for x in q],
                "clocks": clocks.verdict(before, clocks.read(uuid), window)}
    return spread(samples, per_run, threads, method)


# --- one point of a scan --------------------------------------------------------------
# `scan` varies one dimension and measures each size the way measure_operands measures a
# slice (same operands, same comparison, same route capture), so its numbers equal
# explain's for the same shape, dtype and device.


def scan_point(ops: Operands, vary: str, size: int, top: Top | None, *, dtype: str,
               device: str) -> dict:
    """One scan point: the product at ``size`` of the varied dimension, plain data.

    n: ``A @ B[:, :size]`` (B's columns as ``Operands.b_cols`` takes them) against the
    first ``size`` columns of ``top``; m: ``A[:size] @ B`` against its first ``size``
    rows; k: ``A[:, :size] @ B[:size]`` (A's prefix copied contiguous, so the point is an
    ordinary GEMM of that shape) against its own exact reference, with no drift.
    Returns ``size``, ``kernels`` (the normalised route), ``kernel_id`` (12 hex digits of
    the id of ``{"device", "full": kernels}``), ``error_u`` (u of ``dtype``), and
    ``max_ulp`` (output ulps), ``frac_differ`` (a fraction) and ``max_u`` (u), which are
    None for k.
    """
    if vary == "n":
        b_n = ops.b_cols(size)
        call = lambda: ops.product(ops.a, b_n)  # noqa: E731
        cut = (Ellipsis, slice(0, size))
    elif vary == "m":
        a_m = ops.a[..., :size, :]
        call = lambda: ops.product(a_m)  # noqa: E731
        cut = (Ellipsis, slice(0, size), slice(None))
    elif vary == "k":
        sub = Operands(ops.a[..., :size].contiguous(), ops.b[..., :size, :], ops.op, ops.layout)
        call = sub.product
        cut = None
    else:
        raise ValueError(f"unknown dimension {vary!r}; expected n, m or k")
    out, names = kernels.traced(call, device)
    y_bits, y = on_host(out)
    ref = reference(sub) if cut is None else top.ref[cut]
    scaled, absexp = ref.absprod_pow2()
    drift = dict.fromkeys(("max_ulp", "frac_differ", "max_u"))
    if cut is not None:
        d = numerics.drift(top.bits[cut], y_bits, top.values[cut], y, scaled, dtype, absexp=absexp)
        drift = {key: d[key] for key in drift}
    return {
        "size": size,
        "kernel_id": ids.hex_id(ids.object_id(kernel_entry(device, {"full": names}))),
        "kernels": names,
        "error_u": numerics.error(y, ref.hi, ref.lo, ref.finite, scaled, dtype,
                                  absexp=absexp)["error_u"],
        **drift,
    }


@functools.lru_cache(maxsize=1)
def cpu_product(case: str, precision: str):
    """A zero-argument callable doing case ``case``'s full product in ``precision`` on the CPU,
    its operands made once (the last case asked for is kept). NotImplementedError where the
    precision cannot run here."""
    try:
        check_device("cpu", precision)
    except Unavailable as exc:
        raise NotImplementedError(str(exc)) from None
    c = cases.get(case)
    a, b, _ = operand_bits(c, storage_dtype(precision), "cpu", with_checksum=False)
    # CPU precisions set no flags
    return make_operands(a, b, storage_dtype(precision), "cpu", c).product
