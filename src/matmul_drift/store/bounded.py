"""Reading a file from a results tree that may be hostile or broken, within bounds.

A results tree can come from anywhere (a merge artifact, another machine's branch). A
FIFO in place of a JSON file would hang a plain ``open``; a symlink to ``/dev/zero`` would
be read until memory runs out; a symlink loop raises; a symlink may point out of the tree.
``read_bytes`` refuses each with ``Refused`` (a ValueError whose message is one line),
and reads at most ``MAX_FILE_BYTES`` from a regular file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 64 << 20  # one results, benchmarks, machine or catalog file (bytes)


class Refused(ValueError):
    """The file is not one a reader should open: the message says why, in one line."""


def inside(path: Path | str, root: Path | str) -> bool:
    """Whether ``path``, all symlinks resolved, lies under ``root`` (also resolved)."""
    try:
        real, top = Path(os.path.realpath(path, strict=True)), Path(os.path.realpath(root))
    except OSError as exc:
        raise Refused(_why(exc)) from None
    return real == top or top in real.parents


def read_bytes(path: Path | str, root: Path | str | None = None,
               limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``. Refused when it is a FIFO, a device, a socket
    or a directory, a symlink that leaves ``root`` (when given) or loops, or larger than
    ``limit`` bytes. FileNotFoundError passes through (the callers say what is missing)."""
    if root is not None and os.path.islink(path) and not inside(path, root):
        raise Refused(f"a symlink out of {root}; not followed")
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Refused(_why(exc)) from None
    try:
        st = os.fstat(fd)
        _require_regular(st.st_mode)
        if st.st_size > limit:
            raise Refused(f"{st.st_size} bytes, more than the {limit} a file may have")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Refused(f"more than the {limit} bytes a file may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_regular(path: Path | str) -> None:
    """Refused unless ``path`` (its symlinks followed) is a regular file, for a reader that must
    open it by name (np.load, torch.load); FileNotFoundError passes through."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Refused(_why(exc)) from None
    _require_regular(mode)


def _require_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise Refused(f"not a regular file ({_kind(mode)})")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a plain file"


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return exc.strerror or str(exc)
