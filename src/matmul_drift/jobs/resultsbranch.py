"""The results branch: a git branch (default ``results``) checked out as a worktree, in which
each night is one commit holding its environment, results and summary (asv's point for
the night is on the derived axis of axis.py, not on this branch).

A tree is synchronised with a shared remote before each night and pushes its commit at
the end; a push that loses a race is rebased onto the remote and retried (the night's
own files never conflict). Every function takes paths and strings and returns plain values.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from matmul_drift.store.atomic import backup
from matmul_drift.store.git import TEXT, GitError, git

# run state, the built site and one being built, interrupted writes
IGNORE = ".nightly/\nhtml/\n.html.new-*\n.tmp-*.part\n"
IDENTITY = {"GIT_AUTHOR_NAME": "matmul-drift nightly",
            "GIT_AUTHOR_EMAIL": "nightly@matmul-drift.invalid"}


def ok(cwd, *args) -> bool:
    """Whether git succeeds in ``cwd`` (its output discarded)."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True).returncode == 0


def toplevel(path: Path | str) -> Path:
    """The root of the git work tree holding ``path``."""
    return Path(git(path, "rev-parse", "--show-toplevel"))


def project_checkout(given: Path | None) -> Path:
    """The project checkout (its asv.conf.json and benchmarks/): ``given``, else the git work
    tree around the current directory. ValueError, one line, when it is not one."""
    try:
        repo = given.resolve() if given else toplevel(Path.cwd())
    except GitError:
        raise ValueError("not inside a git checkout of the project; pass --repo DIR") from None
    if not (repo / "asv.conf.json").is_file():
        raise ValueError(f"{repo} has no asv.conf.json; --repo names the project checkout")
    return repo


def check_names(branch: str, remote: str | None) -> None:
    """ValueError (one line) unless ``branch`` is a valid branch name and ``remote`` a remote
    name, path or URL; neither may start with "-", where git would read an option."""
    if branch.startswith("-") or not ok(".", "check-ref-format", "--branch", branch):
        raise ValueError(f"--branch {branch!r} is not a valid git branch name")
    if remote is not None and (not remote or remote.startswith("-")
                               or any(ord(c) < 32 for c in remote)):
        raise ValueError(f"--remote {remote!r} is not a git remote name, path or URL")


def _identity(cwd) -> dict:
    # CI runners have no git identity; a configured one wins.
    if (git(cwd, "config", "user.name", check=False)
            and git(cwd, "config", "user.email", check=False)):
        return {}
    return {**IDENTITY, "GIT_COMMITTER_NAME": IDENTITY["GIT_AUTHOR_NAME"],
            "GIT_COMMITTER_EMAIL": IDENTITY["GIT_AUTHOR_EMAIL"]}


def fetch(repo: Path | str, branch: str, remote: str) -> bool:
    """Fetch ``remote``'s ``branch`` into refs/remotes; False when the remote has no such branch."""
    if not git(repo, "ls-remote", "--heads", "--", remote, branch):
        return False
    git(repo, "fetch", "--quiet", "--", remote,
        f"+refs/heads/{branch}:refs/remotes/{remote}/{branch}")
    return True


def ensure_tree(repo: Path | str, tree: Path | str, branch: str, remote: str | None = None) -> Path:
    """A worktree of ``repo`` at ``tree`` on ``branch``, created if absent.

    The branch comes from ``remote`` if it has one; else the worktree starts on the branch
    unborn, so the first night's commit is the branch's root. An existing ``tree`` (not
    empty) must be a git work tree on ``branch``: a worktree, or a clone of its own.
    """
    tree = Path(tree).absolute()
    if tree.exists() and not tree.is_dir():  # git would run in it and fail with "Not a directory"
        raise GitError(f"--tree {tree} is a file, not a folder")
    if tree.exists() and any(tree.iterdir()):  # git fills an empty directory
        if not ok(tree, "rev-parse", "--is-inside-work-tree") or toplevel(tree) != tree.resolve():
            raise GitError(f"{tree} exists but is not a git work tree")
        # repair() aborts that rebase
        current = git(tree, "branch", "--show-current") or rebasing(tree)
        if not current \
                and not ok(tree, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}") \
                and [p.name for p in tree.iterdir()] == [".git"]:
            _unborn(tree, branch)  # a creation killed before the tree took its branch: finish it
            current = branch
        if current != branch:
            raise GitError(f"{tree} is on branch {current or '(detached)'!r}, not {branch!r}")
        return _ignore(tree)
    _unlock_killed_add(repo, tree)
    git(repo, "worktree", "prune")  # a worktree deleted by hand (a CI clean) is still registered
    has_branch = ok(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
    if not has_branch and remote is not None and fetch(repo, branch, remote):
        git(repo, "branch", "--no-track", "--", branch, f"refs/remotes/{remote}/{branch}")
        has_branch = True
    if has_branch:
        git(repo, "worktree", "add", "--quiet", "--", str(tree), branch)
    else:
        git(repo, "worktree", "add", "--quiet", "--detach", "--no-checkout", "--", str(tree))
        _unborn(tree, branch)
    return _ignore(tree)


def _unlock_killed_add(repo: Path | str, tree: Path) -> None:
    """A `git worktree add` killed before it finished leaves its worktree locked, with git's own
    reason "initializing" (in the locale's words): `worktree prune` keeps it once the tree is
    deleted (a CI clean), and every later add fails ("a missing but locked worktree"). ``tree``
    is this project's own and missing: whatever the reason, unlock it."""
    where = None
    for line in git(repo, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            where = line[len("worktree "):]
        elif (line.split(" ", 1)[0] == "locked" and where
              and os.path.realpath(where) == os.path.realpath(tree)):
            git(repo, "worktree", "unlock", "--", where)


def _unborn(tree: Path, branch: str) -> None:
    """Put a new, empty worktree on ``branch``, which has no commit yet."""
    git(tree, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    git(tree, "read-tree", "--empty")


def _ignore(tree: Path) -> Path:
    if not (tree / ".gitignore").exists():
        (tree / ".gitignore").write_text(IGNORE)
    return tree


def repair(tree: Path | str, branch: str) -> list[str]:
    """Undo what a killed git left in ``tree``: stale lock files (index, HEAD, the branch's
    ref, packed-refs), a checkout that wrote no index (finished) and an interrupted rebase
    (aborted: the branch is as it was before).
    The caller holds the tree's own lock, so no git of another run can be working here.
    Returns one line per repair made."""
    done = []
    for name in ("index.lock", "HEAD.lock", f"refs/heads/{branch}.lock", "packed-refs.lock"):
        path = Path(tree, git(tree, "rev-parse", "--git-path", name))
        if path.is_file():
            path.unlink()
            done.append(f"removed {name}, left by a git that was killed")
    if born(tree) and not Path(tree, git(tree, "rev-parse", "--git-path", "index")).exists():
        # `git worktree add` killed in its checkout: without an index every file looks deleted,
        # and the next commit would delete them all. HEAD is read in; the files not yet
        # written are, and none on disk is written over.
        git(tree, "read-tree", "HEAD")
        git(tree, "checkout-index", "-z", "--stdin", stdin=git(tree, "ls-files", "--deleted", "-z"))
        done.append("finished a checkout that was killed (the tree had no index)")
    if rebasing(tree) or any(Path(tree, git(tree, "rev-parse", "--git-path", d)).is_dir()
                             for d in ("rebase-merge", "rebase-apply")):
        p = subprocess.run(["git", "rebase", "--abort"], cwd=tree, capture_output=True, **TEXT)
        if p.returncode != 0:
            raise GitError(f"an interrupted rebase in {tree} could not be aborted: "
                           f"{(p.stderr.strip().splitlines() or ['?'])[0]}")
        done.append(f"aborted a rebase that was killed; {branch} is as it was before it")
    return done


def rebasing(tree: Path | str) -> str:
    """The branch an interrupted rebase in ``tree`` was rebasing ('' when none)."""
    for d in ("rebase-merge", "rebase-apply"):
        name = Path(tree, git(tree, "rev-parse", "--git-path", f"{d}/head-name"))
        if name.is_file():
            return name.read_text().strip().removeprefix("refs/heads/")
    return ""


def unpushed(tree: Path | str, branch: str, remote: str) -> int:
    """How many commits of HEAD ``remote``'s branch (as last fetched) lacks (all of them if
    it has no such branch; 0 on an unborn branch)."""
    if not born(tree):
        return 0
    upstream = f"refs/remotes/{remote}/{branch}"
    if not ok(tree, "rev-parse", "--verify", "--quiet", upstream):
        return int(git(tree, "rev-list", "--count", "HEAD"))
    return int(git(tree, "rev-list", "--count", f"{upstream}..HEAD"))


def uncommitted(tree: Path | str, paths: list[str]) -> list[str]:
    """Which of ``paths`` (relative to ``tree``) differ from HEAD or are untracked."""
    # not git(): it strips the status column
    p = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "-z", "--",
                        *paths], cwd=tree, capture_output=True, **TEXT)
    if p.returncode != 0:
        raise GitError(f"git status: {(p.stderr.strip().splitlines() or ['?'])[0]}")
    return [entry[3:] for entry in p.stdout.split("\0") if entry[3:]]


def restore(tree: Path | str, paths: list[str]) -> list[str]:
    """Put back, as committed, those of ``paths`` (relative to ``tree``) that HEAD holds (a
    --force night killed between moving a recorded file aside and copying its own leaves it
    missing); returns them."""
    if not paths or not born(tree):
        return []
    held = [f for f in git(tree, "ls-tree", "-r", "--name-only", "-z", "HEAD", "--",
                           *paths).split("\0") if f]
    if held:
        git(tree, "checkout", "HEAD", "--", *held)
    return held


def born(tree: Path | str) -> bool:
    """Whether the tree's branch has a commit yet."""
    return ok(tree, "rev-parse", "--verify", "--quiet", "HEAD")


def sync(tree: Path | str, branch: str, remote: str, adopt: bool = False) -> None:
    """Bring ``tree`` up to ``remote``'s branch: fast-forward, or rebase local commits on it.
    With ``adopt`` (a tree that never pushes: its nights reach the branch through a merge)
    local commits are not replayed: the branch takes the remote's, the old head is kept
    under refs/nightly-unpushed/, and every file of the tree stays on disk."""
    if not fetch(tree, branch, remote):
        return
    upstream = f"refs/remotes/{remote}/{branch}"
    has_head = born(tree)
    if has_head and ok(tree, "merge-base", "--is-ancestor", upstream, "HEAD"):
        return  # nothing new there
    if has_head and ok(tree, "merge-base", "--is-ancestor", "HEAD", upstream):
        _clear_killed_checkout(tree, upstream)
        git(tree, "merge", "--quiet", "--ff-only", upstream)
    elif has_head and not adopt:
        _rebase(tree, upstream)
    else:
        # Unborn (another machine made the branch first) or adopting: take the remote's
        # branch; a file it also has takes its content, any other file stays as it was.
        # The index and files first, the branch last: killed in between, the branch is still
        # the old one and the next run does this again. (Were the branch moved first, it would
        # hold the remote's commit over the old index, and the next night's commit would delete
        # the remote's files.)
        if has_head:
            git(tree, "update-ref", f"refs/nightly-unpushed/{head(tree)[:12]}", "HEAD")
        git(tree, "read-tree", upstream)
        git(tree, "checkout", "--quiet", "--", ".")
        git(tree, "update-ref", f"refs/heads/{branch}", upstream)


def _clear_killed_checkout(tree, upstream: str) -> None:
    """Make way for a fast-forward to ``upstream`` that a kill interrupted: git writes the new
    files first and the index and branch last, so a merge killed half-way leaves some of them
    in the tree as local changes, and every later merge refused them. A file that holds
    ``upstream``'s bytes goes (the merge writes it again); any other is kept beside
    (``*.replaced-*``, asvrun.backup), so nothing is lost."""
    changed = [f for f in git(tree, "diff", "--name-only", "-z", "HEAD", upstream).split("\0") if f]
    in_way = [f for f in uncommitted(tree, changed) if Path(tree, f).is_file()] if changed else []
    if not in_way:
        return
    entries = (ln.split("\t", 1)
               for ln in git(tree, "ls-tree", "-z", upstream, "--", *in_way).split("\0") if ln)
    theirs = {name: meta.split()[2] for meta, name in entries}  # "<mode> blob <id>\t<path>"
    mine = git(tree, "hash-object", "--", *in_way).split()
    for f, blob in zip(in_way, mine):
        if theirs.get(f) == blob:
            os.unlink(Path(tree, f))
        else:
            backup(Path(tree, f))


def _rebase(tree, upstream: str) -> None:
    # Commits whose changes the remote already has become empty and are dropped.
    p = subprocess.run(["git", "rebase", "--quiet", upstream], cwd=tree, capture_output=True,
                       **TEXT, env={**os.environ, **_identity(tree)})
    if p.returncode != 0:
        subprocess.run(["git", "rebase", "--abort"], cwd=tree, capture_output=True)
        raise GitError(f"the results branch conflicts with {upstream}; "
                       "local commits kept as they were")


def commit(tree: Path | str, paths: list[str], message: str, date: str | None = None) -> str | None:
    """Commit ``paths`` (relative to ``tree``, or ":(glob)" pathspecs) with ``message``; the new
    HEAD, or None when nothing changed. ``date`` (ISO 8601) is the author date: the night it
    records."""
    # A plain path that does not exist is left out (git add refuses it unless tracked); a
    # ":(glob)" pathspec is given as is: it also stages the deletion of a file moved aside.
    specs = [p for p in paths if p.startswith(":(glob)") or (Path(tree) / p).exists()]
    git(tree, "add", "--all", "--", *specs)
    if ok(tree, "diff", "--cached", "--quiet"):
        return None
    env = _identity(tree)
    if date is not None:
        env = {**env, "GIT_AUTHOR_DATE": date}
    git(tree, "commit", "--quiet", "--no-verify", "-m", message, env=env)
    return head(tree)


def head(tree: Path | str) -> str:
    return git(tree, "rev-parse", "HEAD")


def push(tree: Path | str, branch: str, remote: str, attempts: int = 5) -> str:
    """Push HEAD to ``remote``'s ``branch``; after a rejection, rebase onto it and retry.
    Returns HEAD as pushed (a rebase changes the hashes of the commits not yet pushed)."""
    for _ in range(attempts):
        if ok(tree, "push", "--quiet", "--", remote, f"HEAD:refs/heads/{branch}"):
            return head(tree)
        sync(tree, branch, remote)
    raise GitError(f"could not push {branch} to {remote} after {attempts} attempts")
