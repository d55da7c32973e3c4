"""Scratch folders: where a run has asv write what it moves into place afterwards (a run's
results before they are copied into the results directory, a site before it replaces the
published one), and their removal once the run that made one is gone.

A run claims a folder by holding the lock (lock.TreeLock) on ``<folder>.lock`` beside it from
before the folder is made until after it is removed, and hands the descriptor to the asv it
starts (asvrun.run's ``keep``): a run killed with SIGKILL leaves its asv running, still
writing there, and the lock stays held until that asv exits too. So a folder whose lock file
is there and free was left by a run that is gone, and ``sweep`` removes it. One that a live
run (or its asv) owns is left alone, and so is one kept on purpose (``keep`` removes its lock
file) and one made before folders had locks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from matmul_drift.store.lock import TreeLock, left_behind

SUFFIX = ".lock"


def lock_path(folder: Path) -> Path:
    return folder.with_name(folder.name + SUFFIX)


def claim(folder: Path) -> TreeLock:
    """Hold ``folder``'s lock and make the folder anew, empty (parents are created)."""
    lock = TreeLock(lock_path(folder)).acquire()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return lock


def done(folder: Path, lock: TreeLock) -> None:
    """Remove ``folder``, then its lock file, and let go of it."""
    shutil.rmtree(folder, ignore_errors=True)
    lock_path(folder).unlink(missing_ok=True)
    lock.release()


def keep(folder: Path, lock: TreeLock) -> None:
    """Let go of ``folder`` and keep it: without its lock file no sweep takes it."""
    lock_path(folder).unlink(missing_ok=True)
    lock.release()


def sweep(parent: Path, pattern: str = "*") -> list[Path]:
    """Remove every folder ``parent/<pattern>`` whose lock file is free (its run is gone), and
    that lock file; returns the folders removed."""
    removed = []
    for path in sorted(parent.glob(pattern + SUFFIX)) if parent.is_dir() else ():
        lock = left_behind(path)
        if lock is None:
            continue
        folder = path.with_name(path.name[: -len(SUFFIX)])
        done(folder, lock)
        removed.append(folder)
    return removed


def sweep_staging(parent: Path, base: Path) -> list[str]:
    """``sweep(parent)`` for a run's staging folders (mainjob's and the nightly's), each
    folder removed as a line for the run's log, its path relative to ``base``."""
    return [f"removed {f.relative_to(base)}, the staging folder of a run that was killed"
            for f in sweep(parent)]
