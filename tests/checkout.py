"""A committed copy of this checkout, for tests that run asv or git on a project of their own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
_STATE = (".git", ".asv", "html", "nightly", ".slurm-nightly", ".venv", ".whl", "__pycache__", "*.egg-info",
          ".pytest_cache", ".hypothesis", "*.replaced-*")


def git(cwd, *args) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def committed_copy(dst: Path, *, results: bool = False, leave_out: tuple[str, ...] = ()) -> str:
    """Copy the working tree (without run state, without results/ unless ``results``, and
    without files or folders named in ``leave_out``) to ``dst``, make it a git repository with
    one commit on main; returns that commit's hash."""
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(*_STATE, *leave_out, *(() if results else ("results",))))
    git(dst.parent, "init", "-q", "-b", "main", str(dst))
    git(dst, "add", "-A")
    git(dst, "commit", "-qm", "copy")
    return git(dst, "rev-parse", "HEAD")
