"""The order of the commits in a results tree: git's, where the project's repository is at hand.

A results file's ``date`` is its commit's author date in whole seconds (asv's ``get_date``,
``%at``), which a rebase keeps and a scripted series shares, so by dates alone a change can
land on the wrong commit or read reversed. asv's site plots each result at its commit's
place in ``git rev-list --all --date-order --reverse`` (``asv.plugins.git.Git.get_revisions``):
every parent before its children, otherwise by committer date. The summary takes that order.
The repository is the ``repo`` of an asv.conf.json beside the results (whose ``results_dir``
is them), else the git work tree around the current directory. A commit git does not know
keeps its place by date; the commits git knows fill the other places, in git's order.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from matmul_drift.core import series
from matmul_drift.store import git

# an asv.conf.json is a few kB; json5 would crawl through a planted 64 MiB one
MAX_CONF_BYTES = 1 << 20


def find_repo(asv_dir: Path) -> tuple[Path, bool]:
    """(directory to ask git in, whether an asv.conf.json named it): the local ``repo`` of the
    asv.conf.json in the folder above asv's results dir or the one above that, else the
    current directory."""
    for conf_dir in (asv_dir.parent, asv_dir.parent.parent):
        conf = conf_dir / "asv.conf.json"
        try:
            if not conf.is_file() or conf.stat().st_size > MAX_CONF_BYTES:
                continue
            from asv import util  # asv's own reader: its configs hold // comments

            data = util.load_json(str(conf), js_comments=True)
            results = conf_dir / str(data.get("results_dir", "results"))
            repo = conf_dir / str(data.get("repo"))
            if results.is_dir() and os.path.samefile(results, asv_dir) and repo.is_dir():
                return repo, True
        except Exception:  # noqa: BLE001
            # asv.util.UserError, json5, OSError: a config that cannot be read names no repository
            continue
    try:
        return Path.cwd(), False
    except OSError:  # the current directory was removed: no repository around it
        return Path("."), False


def revisions(repo: Path) -> dict[str, int]:
    """{commit hash: its place in asv's revision order} for every commit on a ref of ``repo``.
    Raises OSError (no git) or git.GitError (git's complaint: not a repository)."""
    # Without GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE... (set in a git hook, say): with them git
    # ignores ``repo`` and reads another repository. git's own list of them.
    local = git.git(repo, "rev-parse", "--local-env-vars", check=False).split()
    out = git.git(repo, "rev-list", "--all", "--date-order", "--reverse", env=dict.fromkeys(local))
    return {h: i for i, h in enumerate(out.split())}


def commit_ranks(dates: dict[str, int], asv_dir: Path, warnings: list[str]) -> dict[str, int]:
    """{commit: its place} for the commits of a results tree, ``dates`` their asv dates (ms).

    Git's order where git knows the commits; by (date, hash) otherwise. One line in
    ``warnings`` when git knows only some of them, and one when commits git cannot order
    share a date (they are then in hash order, which says nothing)."""
    repo, named = find_repo(asv_dir)
    try:
        rev = revisions(repo)
    except (OSError, git.GitError) as exc:
        if named:
            warnings.append(f"cannot read the git history of {repo} (asv.conf.json's repo): {exc}; "
                            "commits are ordered by their dates")
        rev = {}
    by_date = sorted(dates, key=lambda c: (dates[c], c))
    known = {c for c in by_date if c in rev}
    if len(known) < 2:  # not this repository's results (a copy, the nightly axis): the dates decide
        known = set()
    elif len(known) < len(by_date):
        missing = [c for c in by_date if c not in known]
        warnings.append(f"git at {repo} does not know {len(missing)} of the {len(by_date)} "
                        f"commits in the results "
                        f"(e.g. {missing[0][:8]}); those are placed by their commit dates")
    fill = iter(sorted(known, key=rev.__getitem__))
    order = [next(fill) if c in known else c for c in by_date]
    _warn_ties([c for c in by_date if c not in known], dates, warnings)
    return {c: i for i, c in enumerate(order)}


def _warn_ties(placed: list[str], dates: dict[str, int], warnings: list[str]) -> None:
    """One line naming commits ``placed`` by date (in date order) that share their date with
    another."""
    groups: dict[int, list[str]] = {}
    for c, d in dates.items():
        groups.setdefault(d, []).append(c)
    ties = [sorted(groups[d]) for d in dict.fromkeys(dates[c] for c in placed)
            if len(groups[d]) > 1]
    if not ties:
        return
    when = datetime.fromtimestamp(dates[ties[0][0]] / 1000,
                                  timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    more = f" ({len(ties) - 1} more dates shared likewise)" if len(ties) > 1 else ""
    warnings.append(f"commits {', '.join(c[:8] for c in ties[0])} share the commit date "
                    f"{when}{more} and no git repository at hand orders them (run the summary "
                    "in the project's checkout); they are taken in hash order, so a change "
                    "between them may be put on the wrong commit or read reversed")


def descendants(repo: Path, commit: str) -> set[str]:
    """The commits on a ref of ``repo`` that have ``commit`` as an ancestor, ``commit`` among
    them; empty where git does not know it. Raises OSError or git.GitError as ``revisions``."""
    local = git.git(repo, "rev-parse", "--local-env-vars", check=False).split()
    env = dict.fromkeys(local)
    if git.git(repo, "cat-file", "-t", commit, env=env, check=False) != "commit":
        return set()
    out = git.git(repo, "rev-list", "--all", "--ancestry-path", f"^{commit}", env=env)
    return {commit, *out.split()}


def method_versions(commits: list[str], asv_dir: Path,
                    warnings: list[str]) -> dict[str, dict[str, int]]:
    """{commit: {series: method version}} for the commits git knows (series.METHOD_CHANGES: 1
    plus the changes at or before the commit), for results that recorded no version."""
    repo, _ = find_repo(asv_dir)
    try:
        known = set(revisions(repo))
        after = {c: descendants(repo, c)
                 for c in dict.fromkeys(x[2] for x in series.METHOD_CHANGES)}
    except (OSError, git.GitError):
        return {}
    out = {}
    for c in commits:
        if c in known:
            v = dict.fromkeys(series.METHOD, 1)
            for name, version, first, _ in series.METHOD_CHANGES:
                if c in after[first]:
                    v[name] = max(v[name], version)
            out[c] = v
    return out
