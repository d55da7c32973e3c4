"""The results branch: a git branch (default ``results``) checked out as a worktree, in which
each night is one commit, the point asv's commit axis plots.

asv's ``publish`` keeps a result only if its commit is on the first-parent chain of a
configured branch, so the nights must form one line. One tree per machine is therefore
synchronised with a shared remote before each night and pushes each commit at once; a
push that loses a race is rebased onto the remote and retried (the night's own files
never conflict). Every function takes paths and strings and returns plain values.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IGNORE = ".nightly/\nhtml/\n.tmp-*.part\n"  # run state, the built site, interrupted writes
IDENTITY = {"GIT_AUTHOR_NAME": "matmul-drift nightly", "GIT_AUTHOR_EMAIL": "nightly@matmul-drift.invalid"}


class GitError(Exception):
    """A git command failed; the message is its first line of error output."""


def git(cwd: Path | str, *args: str, env: dict | None = None, check: bool = True) -> str:
    """Run git in ``cwd``; stdout (stripped). Raises GitError with git's own message."""
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, **(env or {}), "GIT_TERMINAL_PROMPT": "0"})
    if check and p.returncode != 0:
        lines = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
        raise GitError(f"git {' '.join(args[:2])}: {lines[0] if lines else f'exit status {p.returncode}'}")
    return p.stdout.strip()


def _ok(cwd, *args) -> bool:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True).returncode == 0


def toplevel(path: Path | str) -> Path:
    """The root of the git work tree holding ``path``."""
    return Path(git(path, "rev-parse", "--show-toplevel"))


def _identity(cwd) -> dict:
    # CI runners have no git identity; a configured one wins.
    if git(cwd, "config", "user.name", check=False) and git(cwd, "config", "user.email", check=False):
        return {}
    return {**IDENTITY, "GIT_COMMITTER_NAME": IDENTITY["GIT_AUTHOR_NAME"],
            "GIT_COMMITTER_EMAIL": IDENTITY["GIT_AUTHOR_EMAIL"]}


def fetch(repo: Path | str, branch: str, remote: str) -> bool:
    """Fetch ``remote``'s ``branch`` into refs/remotes; False when the remote has no such branch."""
    if not git(repo, "ls-remote", "--heads", remote, branch):
        return False
    git(repo, "fetch", "--quiet", remote, f"+refs/heads/{branch}:refs/remotes/{remote}/{branch}")
    return True


def ensure_tree(repo: Path | str, tree: Path | str, branch: str, remote: str | None = None) -> Path:
    """A worktree of ``repo`` at ``tree`` on ``branch``, created if absent.

    The branch comes from ``remote`` if it has one, else it starts as a new root commit
    holding only a .gitignore. An existing ``tree`` (not empty) must be a git work tree on
    ``branch``: a worktree, or a clone of its own.
    """
    tree = Path(tree).absolute()
    if tree.exists() and (not tree.is_dir() or any(tree.iterdir())):  # git fills an empty directory
        if not _ok(tree, "rev-parse", "--is-inside-work-tree") or toplevel(tree) != tree.resolve():
            raise GitError(f"{tree} exists but is not a git work tree")
        current = git(tree, "branch", "--show-current")
        if current != branch:
            raise GitError(f"{tree} is on branch {current or '(detached)'!r}, not {branch!r}")
        return tree
    has_local = _ok(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
    if not has_local:
        if remote is not None and fetch(repo, branch, remote):
            git(repo, "branch", "--no-track", branch, f"refs/remotes/{remote}/{branch}")
        else:
            blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=IGNORE,
                                  capture_output=True, text=True, check=True).stdout.strip()
            root = subprocess.run(["git", "mktree"], cwd=repo, input=f"100644 blob {blob}\t.gitignore\n",
                                  capture_output=True, text=True, check=True).stdout.strip()
            commit = git(repo, "commit-tree", root, "-m", f"{branch}: matmul-drift nightly results",
                         env=_identity(repo))
            git(repo, "branch", branch, commit)
    git(repo, "worktree", "prune")  # a worktree deleted by hand (a CI clean) is still registered
    git(repo, "worktree", "add", "--quiet", str(tree), branch)
    return tree


def sync(tree: Path | str, branch: str, remote: str) -> None:
    """Bring ``tree`` up to ``remote``'s branch: fast-forward, or rebase local commits on it."""
    if not fetch(tree, branch, remote):
        return
    upstream = f"refs/remotes/{remote}/{branch}"
    if _ok(tree, "merge-base", "--is-ancestor", upstream, "HEAD"):
        return  # nothing new there
    if _ok(tree, "merge-base", "--is-ancestor", "HEAD", upstream):
        git(tree, "merge", "--quiet", "--ff-only", upstream)
        return
    _rebase(tree, upstream)


def _rebase(tree, upstream: str) -> None:
    # Commits whose changes the remote already has become empty and are dropped.
    p = subprocess.run(["git", "rebase", "--quiet", upstream], cwd=tree, capture_output=True, text=True,
                       env={**os.environ, **_identity(tree)})
    if p.returncode != 0:
        subprocess.run(["git", "rebase", "--abort"], cwd=tree, capture_output=True)
        raise GitError(f"the results branch conflicts with {upstream}; local commits kept as they were")


def commit(tree: Path | str, paths: list[str], message: str, date: str | None = None) -> str | None:
    """Commit ``paths`` (relative to ``tree``) with ``message``; the new HEAD, or None when
    nothing changed. ``date`` (ISO 8601) is the author date: asv plots a commit at it."""
    git(tree, "add", "--all", "--", *(p for p in paths if (Path(tree) / p).exists()))
    if _ok(tree, "diff", "--cached", "--quiet"):
        return None
    env = _identity(tree)
    if date is not None:
        env = {**env, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    git(tree, "commit", "--quiet", "--no-verify", "-m", message, env=env)
    return head(tree)


def head(tree: Path | str) -> str:
    return git(tree, "rev-parse", "HEAD")


def added_by(tree: Path | str, relpath: str) -> str | None:
    """The commit on HEAD's first-parent line that added ``relpath``, if any."""
    out = git(tree, "log", "--first-parent", "--diff-filter=A", "--format=%H", "--", relpath)
    return out.splitlines()[-1] if out else None


def push(tree: Path | str, branch: str, remote: str, attempts: int = 5) -> str:
    """Push HEAD to ``remote``'s ``branch``; after a rejection, rebase onto it and retry.
    Returns HEAD as pushed (a rebase changes the hashes of the commits not yet pushed)."""
    for _ in range(attempts):
        if _ok(tree, "push", "--quiet", remote, f"HEAD:refs/heads/{branch}"):
            return head(tree)
        sync(tree, branch, remote)
    raise GitError(f"could not push {branch} to {remote} after {attempts} attempts")
