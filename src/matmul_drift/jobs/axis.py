"""asv's commit axis for the nightly job: one commit per calendar day, derived, never stored.

asv plots a result at the commit its results file names, and the commit must be on a
branch of the repository asv reads. A night's results cannot name the results-branch
commit that stores them (the commit's hash depends on the results), so the axis is a
separate chain: for each UTC day from EPOCH, an empty commit ``night YYYY-MM-DD`` dated
that day 00:00 UTC, with fixed author and committer, whose parent is the day before.
Every hash is a pure function of its date, so any machine computes the same point for
the same night without talking to the others, and any tree can rebuild the chain from
nothing (``build``). Several machines' nights of one day share that day's point.

Dates are ``YYYY-MM-DD`` strings (UTC); timestamps are seconds since the epoch.
"""

from __future__ import annotations

import hashlib
from datetime import date, datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path

from matmul_drift.jobs.resultsbranch import GitError, git, ok

EPOCH = date(2020, 1, 1)
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
IDENT = "matmul-drift nights <nights@matmul-drift.invalid>"


class AxisError(Exception):
    """A date off the axis, or git could not write it: one line."""


def _day(text: str) -> date:
    try:
        d = date.fromisoformat(text)
    except ValueError:
        raise AxisError(f"{text!r} is not a date like 2026-01-31") from None
    if d < EPOCH:
        raise AxisError(f"the night {text} lies before {EPOCH}, where asv's nightly axis begins")
    # A year ahead allows a skewed clock (a results date, a merged night); further would ask
    # git for a commit a day all the way there, and 9999-12-31 has no next day at all.
    latest = datetime.now(timezone.utc).date() + timedelta(days=366)
    if d > latest:
        raise AxisError(f"the night {text} lies after {latest}, more than a year from today")
    return d


def message(d: date) -> str:
    return f"night {d.isoformat()}\n"


def _signature(d: date) -> str:
    return f"{IDENT} {int(datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp())} +0000"


def _body(d: date, parent: str | None) -> bytes:
    stamp = _signature(d)
    head = [f"tree {EMPTY_TREE}", *([f"parent {parent}"] if parent else []),
            f"author {stamp}", f"committer {stamp}"]
    return ("\n".join(head) + "\n\n" + message(d)).encode()


@lru_cache(maxsize=None)
def _chain_to(d: date) -> str:
    parent = None if d == EPOCH else _chain_to(d - timedelta(days=1))
    body = _body(d, parent)
    return hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()


def commit(night: str) -> str:
    """The axis commit (40 hex) of the night ``night`` (YYYY-MM-DD)."""
    d = _day(night)
    for k in range((d - EPOCH).days + 1):  # warm the cache in order: no deep recursion
        _chain_to(EPOCH + timedelta(days=k))
    return _chain_to(d)


def night_of(commit_hash: str, last: str) -> str | None:
    """The night whose axis commit is ``commit_hash``, searching up to ``last``; None if none."""
    d = _day(last)
    commit(last)
    return next(((EPOCH + timedelta(days=k)).isoformat() for k in range((d - EPOCH).days + 1)
                 if _chain_to(EPOCH + timedelta(days=k)) == commit_hash), None)


def build(path: Path | str, last: str, branch: str) -> str:
    """A bare repository at ``path`` whose ``branch`` runs from EPOCH to the night ``last`` or
    beyond (it never shrinks); only the days it lacks are written (git fast-import).
    Returns the branch's tip."""
    tip = commit(last)
    try:
        return _build(Path(path), last, tip, branch)
    except GitError as exc:
        raise AxisError(f"{exc} (in {path})") from None


def _build(path: Path, last: str, tip: str, branch: str) -> str:
    if not (path / "objects").is_dir():
        path.mkdir(parents=True, exist_ok=True)
        git(path, "init", "--quiet", "--bare")
    have = git(path, "for-each-ref", "--format=%(objectname)", f"refs/heads/{branch}")
    start = EPOCH
    if have:
        if ok(path, "merge-base", "--is-ancestor", tip, have):
            return have
        known = night_of(have, last)
        if known is not None:
            start = date.fromisoformat(known) + timedelta(days=1)
    stream, d = [], start
    while d <= date.fromisoformat(last):
        msg, stamp = message(d), _signature(d)
        stream += [f"commit refs/heads/{branch}", f"author {stamp}", f"committer {stamp}",
                   f"data {len(msg.encode())}", msg.rstrip("\n")]
        if d == start:
            stream.append(f"from {_chain_to(d - timedelta(days=1))}" if d > EPOCH else "deleteall")
        stream.append("")
        d += timedelta(days=1)
    git(path, "fast-import", "--quiet", "--force", stdin="\n".join(stream) + "\n")
    made = git(path, "rev-parse", f"refs/heads/{branch}")
    if made != tip:  # git wrote other bytes than _body: the hashes above would be wrong
        raise AxisError(f"git made axis commit {made[:12]} for {last}, expected {tip[:12]}")
    return tip
