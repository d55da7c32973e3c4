"""One run at a time on a results tree: an exclusive ``flock`` on a lock file.

The kernel drops a ``flock`` when the last descriptor on it closes, so a holder that is
killed (SIGKILL, OOM, a lost node) releases the lock with it: there is no stale lock to
clean up. The descriptor is not inherited by child processes (Python opens files
close-on-exec), so a benchmark that outlives a killed run does not keep the tree locked.
The file itself stays; it holds the current holder's pid, host and start time for the
message a second run prints.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path


class Locked(Exception):
    """Another process holds the lock; the message says who, as far as it is known."""


class TreeLock:
    """``with TreeLock(path): ...`` holds an exclusive lock on ``path`` (created if absent)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> "TreeLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise Locked(f"{self.path} is locked by {holder}") from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}\n".encode(), 0)
        self._fd = fd
        return self

    def fileno(self) -> int | None:
        """The descriptor that holds the lock (None when not held): a child process given it
        (subprocess's pass_fds) holds the lock too, until it and this process both let go."""
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> "TreeLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def left_behind(path: Path | str) -> TreeLock | None:
    """The lock at ``path``, now held here, where its file exists and nobody holds it: whoever
    took it is gone. None where it is held, absent, or removed or replaced meanwhile (a holder
    that removes its lock file before letting go never has it taken this way)."""
    try:
        fd = os.open(path, os.O_RDWR)  # not created: an absent lock file is no one's
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now, held = os.stat(path), os.fstat(fd)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise FileNotFoundError(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    lock = TreeLock(path)
    lock._fd = fd
    return lock
