"""An asv repository that knows one commit, for the GPU check (scripts/gpu_check.sh).

The GPU machine gets the project's tree without its history, and may have no git at all;
asv still records results against a commit. The check's config names this module in
``plugins`` and ``"dvcs": "recorded-commit"``, with ``repo`` the JSON file that
scripts/fetch_gpu_wheels.sh wrote here: ``{"commit": hash, "date": ms, "branch": name}``
(``date``: the author time in ms since the epoch, what asv's git reads). asv then asks it,
not git, for the hash, name and date of that commit; anything else is an error.
"""

from __future__ import annotations

import json
import re

from asv import util
from asv.repo import NoSuchNameError, Repo


def facts(path: str) -> dict:
    """The recorded commit: {"commit": 40 hex digits, "date": ms, "branch": str}. Raises
    asv's UserError (one line) when the file is missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError) as exc:
        raise util.UserError(f"recorded commit {path}: {exc}") from None
    ok = (isinstance(found, dict) and isinstance(found.get("commit"), str)
          and re.fullmatch(r"[0-9a-f]{40}", found["commit"]) and type(found.get("date")) is int
          and isinstance(found.get("branch"), str) and found["branch"])
    if not ok:
        raise util.UserError(f"recorded commit {path}: expected "
                             f"{{\"commit\": hash, \"date\": ms, \"branch\": name}}")
    return found


class RecordedCommit(Repo):
    dvcs = "recorded-commit"

    def __init__(self, url, mirror_path):
        found = facts(url)
        self._path = url
        self._commit, self._date, self._default_branch = (found["commit"], found["date"],
                                                          found["branch"])
        self._pulled = True

    @classmethod
    def url_match(cls, url):
        return False  # only ever chosen by name ("dvcs")

    def pull(self):
        pass

    def checkout(self, path, commit_hash):
        raise util.UserError("a recorded commit has no files to check out: "
                             "use an existing environment")

    def get_hash_from_name(self, name):
        name = self.get_branch_name(name)
        if (name in ("HEAD", self._default_branch)
                or (len(name) >= 4 and self._commit.startswith(name))):
            return self._commit
        raise NoSuchNameError(name)

    def get_name_from_hash(self, commit):
        return self._default_branch if commit == self._commit else None

    def get_date(self, hash):
        if hash != self._commit:
            raise NoSuchNameError(hash)
        return self._date

    def get_date_from_name(self, name):
        return self.get_date(self.get_hash_from_name(name))

    def get_hashes_from_range(self, range):
        return [self._commit]

    def get_hash_from_parent(self, name):
        raise NoSuchNameError(f"{name}^")

    def get_tags(self):
        return {}

    def get_branch_commits(self, branch):
        return [self.get_hash_from_name(branch)]
