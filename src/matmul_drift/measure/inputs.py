"""Inputs that are bit-identical on every torch, numpy and device.

A counter-based generator (splitmix64 of a keyed counter) in numpy uint64 arithmetic
gives 24 random bits per entry. Each value is an exact float32 (and float64), then
rounded to the case's dtype here in numpy, round-to-nearest-even, so no library's
conversion routine is involved. The result is raw bits; measure.py views them as a
tensor. Only integer arithmetic is used, so the bits depend on nothing but the key.
"""

from __future__ import annotations

import hashlib

import numpy as np

from matmul_drift.core import blocks

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# entries per step within a block (blocks.SIZE): its two uint64 buffers (1 MiB) stay in L2
_CHUNK = 1 << 16

BITS_DTYPE = {"float64": np.uint64, "float32": np.uint32, "float16": np.uint16,
              "bfloat16": np.uint16}
DISTRIBUTIONS = ("uniform", "signed", "int")


def stream_key(seed: int, name: str) -> np.uint64:
    """A 64-bit stream key from the seed and the operand's name ('A', 'B', ...)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


def _splitmix(counter: np.ndarray, key: np.uint64, tmp: np.ndarray | None = None) -> np.ndarray:
    """splitmix64 of ``counter`` + key, in place (``counter`` is overwritten and returned)."""
    z = counter
    t = np.empty_like(z) if tmp is None else tmp[: z.size]
    np.multiply(z, _GOLDEN, out=z)  # wraps mod 2^64, as intended
    np.add(z, key, out=z)
    for shift, mult in ((30, _M1), (27, _M2)):
        np.right_shift(z, np.uint64(shift), out=t)
        np.bitwise_xor(z, t, out=z)
        np.multiply(z, mult, out=z)
    np.right_shift(z, np.uint64(31), out=t)
    np.bitwise_xor(z, t, out=z)
    return z


def _fill(out: np.ndarray, start: int, key: np.uint64, dist: str, int_range: int) -> None:
    """Entries start .. start + out.size of the stream ``key``, as exact float32, into ``out``."""
    z, tmp = np.empty(_CHUNK, dtype=np.uint64), np.empty(_CHUNK, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for at in range(0, out.size, _CHUNK):
            stop = min(out.size, at + _CHUNK)
            k = z[: stop - at]
            k[:] = np.arange(start + at, start + stop, dtype=np.uint64)
            _splitmix(k, key, tmp)
            np.right_shift(k, np.uint64(40), out=k)  # 24 bits
            if dist == "uniform":
                np.multiply(k, np.float32(2.0**-24), out=out[at:stop], casting="unsafe")
            elif dist == "signed":
                out[at:stop] = ((k.astype(np.int64) - (1 << 23)).astype(np.float32)
                                * np.float32(2.0**-23))
            else:
                out[at:stop] = (k % np.uint64(2 * int_range + 1)).astype(np.int64) - int_range


def _check(dist: str | None = None, dtype: str | None = None) -> None:
    if dist is not None and dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {dist!r}")
    if dtype is not None and dtype not in BITS_DTYPE:
        raise ValueError(f"unknown dtype {dtype!r}")


def draw(seed: int, name: str, shape: tuple[int, ...], dist: str = "uniform",
         int_range: int = 2) -> np.ndarray:
    """Exact float32 values of ``shape``.

    dist: ``uniform`` k/2^24 in [0, 1); ``signed`` in [−1, 1) on a 2^-23 grid;
    ``int`` integers in [−int_range, int_range] (products and sums exact while small).
    """
    _check(dist)
    key = stream_key(seed, name)
    out = np.empty(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
    blocks.map_blocks(out.size, lambda part: _fill(out[part], part.start, key, dist, int_range))
    return out.reshape(shape)


def draw_bits(seed: int, name: str, shape: tuple[int, ...], dtype: str, dist: str = "uniform",
              int_range: int = 2) -> np.ndarray:
    """``round_bits(draw(seed, name, shape, dist, int_range), dtype)``, a block at a time: no
    float32 copy of the whole operand is made (the seed's B: 0.84 GB of fresh pages fewer, and
    fresh pages are dear; docs/performance.md)."""
    _check(dist, dtype)
    key = stream_key(seed, name)
    out = np.empty(int(np.prod(shape, dtype=np.int64)), dtype=BITS_DTYPE[dtype])

    def fill(part: slice) -> None:
        values = np.empty(part.stop - part.start, dtype=np.float32)
        _fill(values, part.start, key, dist, int_range)
        _round_into(values, out[part], dtype)

    blocks.map_blocks(out.size, fill)
    return out.reshape(shape)


def round_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 or float64 ``values`` to ``dtype`` (nearest, ties to even, once) and return
    its bits. Once: torch takes float64 to float16 or bfloat16 through float32 on the CPU, so
    1 + 2^-11 + 2^-40 became 1 there, not 1 + 2^-10."""
    _check(dtype=dtype)
    v = np.ascontiguousarray(values, dtype=np.float64 if np.asarray(values).dtype == np.float64
                             else np.float32)
    out = np.empty(v.shape, dtype=BITS_DTYPE[dtype])
    src, dst = v.reshape(-1), out.reshape(-1)
    blocks.map_blocks(src.size, lambda part: _round_into(src[part], dst[part], dtype))
    return out


def _round_into(x: np.ndarray, bits: np.ndarray, dtype: str) -> None:
    """The bits of float32 or float64 ``x`` rounded to ``dtype`` into ``bits`` (its width)."""
    if dtype == "float64":
        bits.view(np.float64)[:] = x
    elif dtype in ("float32", "float16"):
        with np.errstate(over="ignore"):  # a float64 beyond the range rounds to inf, as it should
            bits.view(np.float32 if dtype == "float32" else np.float16)[:] = x  # numpy rounds once
    else:  # bfloat16: finite float32 bits + 0x8000 stay below 2^32, so uint32 cannot wrap
        b = _round_to_odd_float32(x).view(np.uint32) if x.dtype == np.float64 else x.view(np.uint32)
        bits[:] = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


def _round_to_odd_float32(x: np.ndarray) -> np.ndarray:
    """float64 ``x`` in float32, cut toward zero, its last bit set where that was inexact: 24
    bits rounded to odd, then to bfloat16's 8 to nearest, is rounding to nearest once."""
    with np.errstate(over="ignore"):
        f = x.astype(np.float32)
    away = np.abs(f.astype(np.float64)) > np.abs(x)  # rounded up in magnitude (to inf, too)
    f[away] = np.nextafter(f[away], np.float32(0))
    inexact = (f.astype(np.float64) != x) & ~np.isnan(x)
    return f.view(np.uint32) | inexact.astype(np.uint32)


def checksum(*arrays: np.ndarray) -> str:
    """sha256 hex of the shapes, widths and little-endian bytes of the given bit arrays."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        little = a.astype(a.dtype.newbyteorder("<"), copy=False)  # a view on little-endian hosts
        h.update(memoryview(little).cast("B"))
    return h.hexdigest()
