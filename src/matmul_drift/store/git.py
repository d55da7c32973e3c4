"""git in a subprocess: its output as text, its failure as one line (GitError)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# git prints names and messages as the bytes it was given: read them leniently, not as strict UTF-8.
TEXT = {"encoding": "utf-8", "errors": "replace"}


class GitError(Exception):
    """A git command failed; the message is its first line of error output."""


def git(cwd: Path | str, *args: str, env: dict | None = None, check: bool = True,
        stdin: str | None = None) -> str:
    """Run git in ``cwd`` (``stdin`` its input, ``env`` over this process's environment, a value
    None unsetting its variable); stdout (stripped). Raises GitError with git's own message."""
    env = {**os.environ, **(env or {}), "GIT_TERMINAL_PROMPT": "0"}
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, **TEXT, input=stdin,
                       env={k: v for k, v in env.items() if v is not None})
    if check and p.returncode != 0:
        lines = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
        raise GitError(f"git {' '.join(args[:2])}: "
                       f"{lines[0] if lines else f'exit status {p.returncode}'}")
    return p.stdout.strip()
