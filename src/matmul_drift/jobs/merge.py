"""The merge of several machines' nights into one results tree (jobs/nightly.py's layout): every
source checked before a file is copied, catalog entries first, then the night's one commit, the
summary of every machine's latest night against its previous one, and the site."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from matmul_drift.core import trees
from matmul_drift.core.errors import BadValue, Misuse, Param, UsageError
from matmul_drift.jobs import asvrun, axis, resultsbranch
from matmul_drift.jobs.nightly import (
    ALL,
    NIGHTS,
    RESULTS,
    SUMMARIES,
    Options,
    Report,
    check_date,
    check_machine,
    git_step,
    lock_tree,
    log,
    night_title,
    open_tree,
    publish,
    read_tree,
    write_summary,
)
from matmul_drift.read import history, latest, summary
from matmul_drift.store import atomic, bounded

IMPORTED = ("results", "summaries", "nights")  # what a merge copies from a source tree


def holds_a_tree(src: Path) -> bool:
    """Whether ``src`` has any of the folders a merge takes (IMPORTED)."""
    return any((src / top).is_dir() for top in IMPORTED)


def _source_files(src: Path) -> list[Path]:
    """The files a merge takes from ``src``: regular files only. A symlink (whose target
    could be anything on the machine) or a FIFO or device is a UsageError, before anything
    is copied."""
    out = []
    for top in IMPORTED:
        if (src / top).is_symlink():  # os.walk follows a link it is given, though none below
            raise BadValue("merge", str(src), f"{top} is a symlink; a merge copies regular files "
                           "only, nothing merged", colon=True)
        for dirpath, dirnames, filenames in os.walk(src / top):
            # os.walk does not descend into symlinked folders
            for name in sorted(dirnames + filenames):
                p = Path(dirpath) / name
                if p.is_symlink():
                    raise BadValue("merge", str(src), f"{p.relative_to(src)} is a symlink; a merge "
                                   "copies regular files only, nothing merged", colon=True)
                if name in filenames and not name.startswith(".tmp-"):
                    if not p.is_file():
                        raise BadValue("merge", str(src), f"{p.relative_to(src)} is not a regular "
                                       "file, nothing merged", colon=True)
                    out.append(p)
    return sorted(out)


def check_night_file(rel: Path, data: bytes) -> None:
    """UsageError (one line) unless ``data`` is a night file: a JSON object whose date and
    machine match its name and whose environment is an object."""
    try:
        night = json.loads(data.decode("utf-8"))
        if not isinstance(night, dict):
            raise ValueError("not a JSON object")
        date, machine = night.get("date"), night.get("machine")
        if (not isinstance(date, str) or not isinstance(machine, str)
                or rel.name != f"{date}-{machine}.json"):
            raise ValueError("its date and machine do not match its name")
        check_date(date)
        check_machine(machine)
        if not isinstance(night.get("environment"), dict):
            raise ValueError("its environment is not a JSON object")
    except (ValueError, UsageError) as exc:
        # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = ("not valid JSON (truncated?)" if isinstance(exc, json.JSONDecodeError)
                  else str(exc))
        raise UsageError(f"malformed night file {rel}: {reason}; nothing merged") from None


def _rank(rel: Path) -> int:
    # Catalog entries, then machine.json, then results, then summaries and nights: a reader
    # never meets a result whose catalog entries or machine are missing.
    if rel.parts[:2] == (RESULTS, "catalog"):
        return 0
    return 1 if rel.name == "machine.json" else 2 if rel.parts[0] == RESULTS else 3


def _loads(rel: Path, text: str):
    """A file's JSON. Order trees are K deep, past json.loads' recursion: a catalog entry of
    orders/ and an `order --json` report (a GPU check's order-*.json) are read without it."""
    if rel.parent.name == "orders" and rel.parts[:2] == (RESULTS, "catalog"):
        return trees.parse_entry(text)
    if rel.name.startswith("order-") and rel.parts[:2] == (RESULTS, "gpu-check"):
        return trees.read_report(text)
    return json.loads(text)


def plan_merge(tree: Path, sources: list[Path]) -> tuple[
        list[tuple[Path, Path]], list[tuple[int | None, Path]], list[str]]:
    """(copies in writing order, benchmarks.json files, conflicts) for merging ``sources``
    into ``tree``. A file the tree lacks is copied; an identical one skipped; a different one
    is a conflict (and copied, after a backup, only with --force); machine.json is asv's
    description of a machine, which asv itself rewrites on each run, so a newer one is copied.
    Each benchmarks.json comes with the latest commit date (ms) of its source's asv results
    (None without one), oldest first: the order in which the newest descriptions win."""
    copies, benches, conflicts, seen = [], [], [], {}
    for src in sources:
        newest, found = None, []
        if not holds_a_tree(src):  # a machine's empty artifact must not stop the others' merge
            log(f"warning: --merge {src} holds none of {', '.join(t + '/' for t in IMPORTED)}: "
                "nothing to take from it")
        for f in _source_files(src):
            rel = f.relative_to(src)
            try:
                data = bounded.read_bytes(f, src)
            except (OSError, ValueError) as exc:
                raise BadValue("merge", str(src), f"cannot read {rel}: {exc}; nothing merged",
                               colon=True) from None
            if rel.parts[0] == NIGHTS and rel.suffix == ".json":
                # not an old one a --force night kept beside
                check_night_file(rel, data)
            elif rel.suffix == ".json":
                try:
                    doc = _loads(rel, data.decode("utf-8"))
                except (ValueError, RecursionError):
                    raise BadValue("merge", str(src), f"{rel} is not valid JSON (truncated?); "
                                   "nothing merged", colon=True) from None
                if rel.name == "benchmarks.json" and not isinstance(doc, dict):
                    raise BadValue("merge", str(src), f"{rel} is not a JSON object; nothing "
                                   "merged", colon=True)
                if rel.parts[:2] == (RESULTS, "asv") and len(rel.parts) == 4 \
                        and isinstance(doc, dict) and rel.name != "machine.json" \
                        and type(doc.get("date")) is int:
                    newest = max(newest or doc["date"], doc["date"])
            if rel.name == "benchmarks.json":
                found.append(f)
                continue
            if rel in seen:
                if seen[rel] != data and rel.name != "machine.json":
                    conflicts.append(f"{rel} differs between sources")
                continue
            seen[rel] = data
            dst = tree / rel
            if dst.exists():
                if dst.read_bytes() == data:
                    continue
                if rel.name != "machine.json":
                    conflicts.append(f"{rel} differs from the recorded file")
            copies.append((f, dst))
        benches += [(newest, f) for f in found]
    copies.sort(key=lambda c: _rank(c[1].relative_to(tree)))
    benches.sort(key=lambda b: -1 if b[0] is None else b[0])
    return copies, benches, conflicts


def run_merge(o: Options, sources: list[Path]) -> Report:
    """Merge other trees (or artifacts laid out like one) into ``o.tree``; summarise every
    machine's latest night against its previous one; publish."""
    t0 = time.monotonic()
    tree = open_tree(o)
    lock = lock_tree(tree)
    try:
        for line in git_step("repairing the results tree", resultsbranch.repair, tree, o.branch):
            log(f"recovered: {line}")
        if o.remote:
            git_step("syncing with the remote", resultsbranch.sync, tree, o.branch, o.remote,
                     not o.push)
        copies, benches, conflicts = plan_merge(tree, sources)
        if conflicts and not o.force:
            raise Misuse(f"{len(conflicts)} files conflict, nothing merged: {conflicts[0]}; pass ",
                         Param("force"), " to replace (the old files are kept beside)")
        # asv publish draws a result only where its benchmark version is benchmarks.json's: a
        # source's descriptions replace the tree's only if its results are as new (its own added).
        recorded = asvrun.newest_run(tree / RESULTS / "asv") if benches else None
        for newest, f in benches:
            keep = recorded is not None and (newest is None or newest < recorded)
            asvrun.merge_benchmarks(tree / RESULTS / "asv" / "benchmarks.json",
                                    json.loads(f.read_text()), log, keep)
        imported = []
        for src, dst in copies:
            if dst.exists() and dst.name != "machine.json":
                log(f"replacing {dst.relative_to(tree)}; "
                    f"the old file is kept as {atomic.backup(dst).name}")
            imported.append(atomic.copy(src, dst))
        imported += _left_by_a_killed_merge(tree, imported)
        log(f"merged {len(imported)} files from {len(sources)} sources")
        hist = read_tree(tree)
        _check_commits(tree, hist)
        pairs, nights = latest.nights(hist)
        result = latest.compare(hist, pairs)
        md, js, plain = write_summary(tree, f"{o.date}-{ALL}", result, nights)
        commit = git_step("committing the merge", resultsbranch.commit, tree,
                          [".gitignore", RESULTS, SUMMARIES, NIGHTS],
                          merge_message(o.date, result, len(pairs), imported),
                          f"{o.date}T00:00:00+00:00")
        if o.remote and o.push:
            commit = git_step("pushing the merge", resultsbranch.push, tree, o.branch, o.remote)
        if o.publish:
            publish(tree, o.repo, o.branch)
        log(f"merge done in {time.monotonic() - t0:.0f} s; summary {md}")
        return Report(commit, md, js, len(result.flags),
                      len(result.failing(summary.DEFAULT_FAIL_ON)),
                      [f for n in nights for f in n["failed"]], imported, o.publish, plain)
    finally:
        lock.release()


def _left_by_a_killed_merge(tree: Path, copied: list[Path]) -> list[Path]:
    """The files of results/ and nights/ that a merge killed after copying left uncommitted:
    this merge found them already there and copied nothing, but its commit brings them in,
    so its message counts and names them (benchmarks.json and files kept beside excluded)."""
    waiting = {tree / f for f in resultsbranch.uncommitted(tree, [RESULTS, NIGHTS])} - set(copied)
    return sorted(p for p in waiting
                  if p.name != "benchmarks.json" and not atomic.is_backup(p) and p.is_file())


def merge_message(date: str, result: summary.Summary, machines: int, imported: list[Path]) -> str:
    """The merge's commit message: the summary's counts, then each night it brought in, named
    by torch version, git hash, CUDA and machine."""
    nights = [json.loads(p.read_text(encoding="utf-8"))
              for p in imported if p.parent.name == NIGHTS]
    failing = len(result.failing(summary.DEFAULT_FAIL_ON))
    who = ", ".join(n["machine"] for n in nights)
    counts = f"{len(result.flags)} flags, {failing} failing, on {machines} machines"
    lines = [f"night {date}: {who} merged; {counts}" if nights
             else f"summary {date}: {counts}; no new night", ""]
    lines += [night_title(n) for n in nights]
    lines += [f"merged {len(imported)} files"]
    return "\n".join(lines) + "\n"


def _check_commits(tree: Path, hist: history.History) -> None:
    # asv publish plots a result only if its commit is the axis commit of its night; say so
    # for any that is not (results made before the axis, or by hand).
    for machine, runs in hist.runs.items():
        for r in runs:
            night = latest.night_date(r.date)
            try:
                on_axis = axis.commit(night) == r.commit
            except axis.AxisError:
                on_axis = False
            if not on_axis:
                log(f"warning: {r.path.relative_to(tree)} names commit {r.commit[:12]}, "
                    f"which is not asv's axis commit for {night}; asv publish will leave it out")
