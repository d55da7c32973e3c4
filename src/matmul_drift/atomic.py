"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Each write goes to a temporary file in the destination's directory, is flushed to disk,
and is renamed over the destination (``os.replace`` is atomic within one file system).
A process killed half-way leaves at most a ``.tmp-*.part`` file beside the destination,
which no reader (asv, history) looks at.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes(path: Path | str, data: bytes) -> Path:
    """Replace ``path`` by ``data`` atomically (parents are created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; these are ordinary shared files
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text(path: Path | str, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def copy(src: Path | str, dst: Path | str) -> Path:
    """Copy the bytes of ``src`` over ``dst`` atomically."""
    return write_bytes(dst, Path(src).read_bytes())
