"""Free disk space against what an install needs: one line (``NoSpace``) before it starts.

A torch build is refused before pip or uv writes a byte, rather than failing half-way with
"No space left on device" buried in a log. Sizes are bytes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CUDA_BUILD_BYTES = 5 * 10**9  # a CUDA build of torch with its nvidia-* wheels, installed
CPU_BUILD_BYTES = 2 * 10**9  # a CPU build of torch with numpy, installed
UNPACK = 3  # installed bytes per byte of wheel: torch's compressed libraries
FREE_VAR = "MATMUL_DRIFT_FREE_BYTES"  # the free space to assume instead of the file system's


class NoSpace(Exception):
    """Too little free space for an install: one line."""


def free_bytes(path: Path | str) -> int:
    """Free bytes on the file system of ``path`` (its nearest existing folder), or the figure
    in $MATMUL_DRIFT_FREE_BYTES where it is set."""
    given = os.environ.get(FREE_VAR, "").strip()
    if given:
        return int(given)
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def needed(files: list[tuple[str, int | None]]) -> int:
    """Bytes the installed ``files`` (distribution name, wheel size in bytes or None where
    unknown) take: UNPACK times the wheels where every size is known, else at least a CUDA
    build where an nvidia-* wheel is among them, a CPU build otherwise."""
    known = sum(UNPACK * size for _, size in files if size is not None)
    if all(size is not None for _, size in files):
        return known
    cuda = any(name.lower().startswith("nvidia") for name, _ in files)
    return max(known, CUDA_BUILD_BYTES if cuda else CPU_BUILD_BYTES)


def size(n: int) -> str:
    """Bytes in words: "5.0 GB", "12 MB", "9 kB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale or unit == "kB":
            return f"{n / scale:.1f} GB" if unit == "GB" else f"{n / scale:.0f} {unit}"


def check(path: Path | str, need: int, what: str, free: int | None = None) -> None:
    """NoSpace (one line) where fewer than ``need`` bytes are free at ``path`` (``free``: the
    figure to take instead of the file system's)."""
    have = free_bytes(path) if free is None else free
    if have < need:
        raise NoSpace(
            f"no room to install {what}: it needs about {size(need)} "
            f"and {path} has {size(have)} free"
        )
