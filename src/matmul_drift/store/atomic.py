"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Each write goes to a temporary file in the destination's directory, is flushed to disk,
and is renamed over the destination (``os.replace`` is atomic within one file system).
``write_new`` links it into place instead, which fails if the destination exists, so a
file created meanwhile by someone else is never replaced.
A process killed half-way leaves at most a ``.tmp-*.part`` file beside the destination,
which no reader (asv, history) looks at.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def write_bytes(path: Path | str, data: bytes) -> Path:
    """Replace ``path`` by ``data`` atomically (parents are created); returns the path."""
    path = Path(path)
    tmp = _temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
    return path


class Taken(FileExistsError):
    """``write_new`` found its path taken; the data it was to write are in the file ``kept``."""

    def __init__(self, path: Path, kept: str):
        super().__init__(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
        self.kept = kept


def write_new(path: Path | str, data: bytes) -> Path:
    """Create ``path`` holding ``data`` atomically, unless it exists: then Taken, and the data
    stay in a temporary file beside it. Unlike a check before write_bytes, this never replaces
    a file that appeared meanwhile (os.link refuses an existing name)."""
    path = Path(path)
    tmp = _temp(path, data)
    try:
        link_new(tmp, path)
    except FileExistsError:
        raise Taken(path, tmp) from None
    except BaseException:
        _discard(tmp)
        raise
    _discard(tmp)  # its data now have the name ``path``
    return path


def link_new(tmp: str | Path, path: Path) -> None:
    """Give ``tmp``'s file the name ``path`` too, unless that exists (FileExistsError). Where the
    file system has no hard links, ``tmp`` is renamed instead (it is gone afterwards)."""
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # a file system without hard links: checked just before the rename, a narrower race
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.replace(tmp, path)


def _temp(path: Path, data: bytes) -> str:
    """A temporary file beside ``path`` (parents are created) holding ``data``, on disk; its
    name."""
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
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def folder_problem(path: Path | str) -> str | None:
    """Why no file can be written at ``path`` by these functions, or None: its folder is missing,
    or refuses a new file. Tried with a temporary file, as a write makes one there: os.access
    says yes to root where the file system still says no (/proc)."""
    if str(path).endswith(os.sep):  # Path() drops the slash: x.json/ would be written as x.json
        return "it ends in a slash, as a folder's name does; name a file"
    folder = Path(path).absolute().parent
    if not folder.is_dir():
        return "its folder does not exist"
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    if len(os.fsencode(Path(path).name)) > longest:
        return f"its name is longer than its folder takes ({longest} bytes)"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tmp-", suffix=".part"):
            pass
    except OSError as exc:
        return f"its folder is not writable ({exc.strerror})"
    return None


def _discard(tmp: str) -> None:
    if os.path.exists(tmp):
        os.unlink(tmp)


def write_text(path: Path | str, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def copy(src: Path | str, dst: Path | str) -> Path:
    """Copy the bytes of ``src`` over ``dst`` atomically."""
    return write_bytes(dst, Path(src).read_bytes())


def replace_folder(new: Path | str, dest: Path | str) -> None:
    """Put folder ``new`` in ``dest``'s place, on one file system; afterwards ``new`` holds what
    ``dest`` held (or is gone where there was none). Where the kernel can (Linux's renameat2
    RENAME_EXCHANGE) the two names swap in one step, so a reader finds the old folder or the
    new, never neither; elsewhere ``dest`` is renamed aside first, and a kill between the two
    renames leaves no ``dest`` (the old one at ``new`` + ".old", the new one at ``new``)."""
    new, dest = Path(new), Path(dest)
    if not os.path.lexists(dest):
        os.rename(new, dest)
    elif not _exchange(new, dest):
        aside = new.with_name(new.name + ".old")
        os.rename(dest, aside)
        os.rename(new, dest)
        os.rename(aside, new)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False where this kernel or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc 2.28+ or not Linux
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


BACKUP_MARK = ".replaced-"  # in the name of every file backup() keeps beside


def is_backup(path: Path) -> bool:
    """Whether ``path`` is a file backup() kept beside the one it replaced."""
    return BACKUP_MARK in path.name


def backup(path: Path) -> Path:
    """Keep a file about to be replaced (with --force) beside it, under a name no reader takes
    for results ('.json' is not its suffix) and no other backup has: one made in the same
    second gets a count (-2, -3, ...). Returns the backup's path."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for n in itertools.count(1):
        dst = path.with_name(f"{path.name}{BACKUP_MARK}{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            link_new(path, dst)  # never over an earlier backup, even one made meanwhile
        except FileExistsError:
            continue
        path.unlink(missing_ok=True)  # gone already where the folder takes no hard link
        return dst
