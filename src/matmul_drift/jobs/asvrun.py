"""asv as a child process, and its output moved into a results directory atomically.

asv writes its results files and benchmarks.json in place, non-atomically, and rewrites
benchmarks.json on every run. The nightly job and the main job therefore point asv at a
staging directory and copy what it wrote into the real results directory here: each file
by a temporary file and a rename, benchmarks.json merged and rewritten only when it
changes, and a file about to be replaced (with --force) kept beside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from matmul_drift.read import history
from matmul_drift.store import atomic
from matmul_drift.store.atomic import backup
from matmul_drift.store.lock import TreeLock
from matmul_drift.store.machine import HARDWARE_PARAMS

PROGRESS = re.compile(r"(·|\[ *[\d.]+%\] ·{1,3} )(?!=)")  # asv's step lines, not its tables
# asv's forkserver binds its socket at $TMPDIR/asv-forkserver-XXXXXXXX/socket; a socket's path
# has at most 107 bytes (unix(7)), and past them asv says only "Failed to start server thread"
SOCKET_PATH_MAX = 107
FORKSERVER_SOCKET = os.path.join("asv-forkserver-" + "x" * 8, "socket")
SHORT_TMPDIR = "/tmp"


class AlreadyRecorded(Exception):
    """Results for this commit (and environment) exist and --force was not given."""


class CutShort(Exception):
    """asv left a results file that is not a JSON object: killed, or out of disk space, as it
    wrote it (asv writes in place)."""


def check_written(files: list[Path]) -> None:
    """CutShort naming the first of ``files`` (asv's output in staging) that is not a JSON
    object."""
    for f in files:
        if json_object(f) is None:
            raise CutShort(f"asv's results file {f.name} is cut short (not a JSON object)")


def write_config(path: Path, conf: dict) -> Path:
    """An asv config file, written atomically."""
    return atomic.write_text(path, json.dumps(conf, indent=2) + "\n")


def tmpdir_for_asv(tmpdir: str) -> str:
    """``tmpdir``, or SHORT_TMPDIR where asv's forkserver socket under ``tmpdir`` would pass
    SOCKET_PATH_MAX bytes (a Slurm job's or a test's deep TMPDIR) and SHORT_TMPDIR is writable."""
    path = os.fsencode(os.path.join(os.path.abspath(tmpdir), FORKSERVER_SOCKET))
    if len(path) <= SOCKET_PATH_MAX or not os.access(SHORT_TMPDIR, os.W_OK | os.X_OK):
        return tmpdir
    return SHORT_TMPDIR


def run(conf: Path, *args: str, cwd: Path, env: dict | None = None, log: Path | None = None,
        progress: Callable[[str], None] | None = None, hold: TreeLock | None = None,
        follow: Path | None = None) -> tuple[int, list[str]]:
    """Run ``asv --config conf args``. With ``log``, asv's progress lines go to stderr as they
    come (or to ``progress``), its result tables and benchmark output only to the ``log`` file.
    ``hold``: a lock asv holds too while it runs (its scratch folder's, store/scratch.py), even past
    a kill of this process. ``follow``: a file whose new lines go the way of the progress lines
    while asv runs (setup_cache's, selection.PROGRESS_VAR). Returns (exit status, the last 30 lines
    of output)."""
    cmd = [sys.executable, "-m", "asv", "--config", str(conf), *args]
    env = dict(os.environ if env is None else env)
    if tmp := env.get("TMPDIR"):
        env["TMPDIR"] = tmpdir_for_asv(tmp)
    tail: list[str] = []

    def show(line: str) -> None:
        if progress is not None:
            progress(line.rstrip("\n"))
        else:
            sys.stderr.write(line)
            sys.stderr.flush()

    stop = threading.Event()
    follower = (threading.Thread(target=_follow, args=(follow, show, stop), daemon=True)
                if follow else None)
    with open(log or os.devnull, "a", encoding="utf-8") as fh, subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            encoding="utf-8", errors="replace", bufsize=1,
            pass_fds=(hold.fileno(),) if hold else ()) as proc:
        if follower:
            follower.start()
        try:
            for line in proc.stdout:
                fh.write(line)
                if log is not None and PROGRESS.match(line):
                    show(line)
                tail = (tail + [line.rstrip()])[-30:]
        finally:
            stop.set()
            if follower:
                follower.join()
    return proc.returncode, tail


def _follow(path: Path, show: Callable[[str], None], stop: threading.Event,
            every: float = 0.5) -> None:
    """Passes each whole line added to ``path`` to ``show`` until ``stop`` is set, then the rest."""
    pos, part = 0, ""
    while True:
        done = stop.wait(every)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(pos)
                text = fh.read()
                pos = fh.tell()
        except FileNotFoundError:
            text = ""
        *lines, part = (part + text).split("\n")
        for line in lines:
            show(line + "\n")
        if done:
            return


def reap_orphans(root: Path) -> list[str]:
    """Stops what a killed asv run leaves running for ``root``'s benchmarks: its forkserver
    (`benchmark.py run_server`, with any benchmark it forked) and its `benchmark.py
    setup_cache` (the whole suite, minutes on a slow route). asv starts each in a process
    group of its own, so killing the run's process group misses them: the forkserver waits on
    its socket for ever, holding its memory, and the setup_cache goes on measuring beside the
    next run. One whose parent is still an asv process is left alone. Each is stopped with its
    process group, and its folder in the temporary directory removed. Returns one line per
    process stopped; nothing where /proc is missing."""
    root_s, out = str(root.resolve()), []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            args = [a.decode("utf-8", "replace")
                    for a in (d / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        i = next((j for j, a in enumerate(args) if a in ("run_server", "setup_cache")), 0)
        if not (i and args[i - 1].endswith(os.path.join("asv", "benchmark.py"))
                and len(args) > i + 2):
            continue
        if not (args[i + 1] == root_s or args[i + 1].startswith(root_s + os.sep)):
            continue
        try:  # only a process of this tree gets its parent looked at
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            ppid, pgrp = int(fields[1]), int(fields[2])
            parent = (Path("/proc") / str(ppid) / "cmdline").read_bytes() if ppid > 1 else b""
            # run_server: its socket's folder; setup_cache: the folder asv made for its cache
            tmp = (Path(args[i + 2]).parent if args[i] == "run_server"
                   else Path(os.readlink(d / "cwd")))
        except (OSError, ValueError, IndexError):
            continue
        if b"asv" in parent:  # a live run's, or a benchmark its forkserver forked
            continue
        pid = int(d.name)
        try:
            os.killpg(pid, signal.SIGKILL) if pgrp == pid else os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        if (tmp.parent in (Path(tempfile.gettempdir()),
                           Path(tmpdir_for_asv(tempfile.gettempdir())))
                and tmp.name.startswith(("asv-forkserver-", "tmp"))):
            shutil.rmtree(tmp, ignore_errors=True)
        what = "forkserver" if args[i] == "run_server" else "setup_cache"
        out.append(f"stopped asv's {what} {pid} for {args[i + 1]}, left running by a killed run")
    return out


def checkpoint(step: str) -> None:
    """Fault injection for the kill tests: MATMUL_DRIFT_KILL_AT=<step> makes this process
    SIGKILL itself here, as a lost node or the OOM killer would (steps: the nightly's
    replaced, copied, committed, publishing; the main job's publishing)."""
    if os.environ.get("MATMUL_DRIFT_KILL_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


def results_files(d: Path) -> list[Path]:
    """asv's results files in a machine folder (not machine.json)."""
    return sorted(p for p in d.glob("*.json") if p.name != "machine.json") if d.is_dir() else []


def recorded(results_dir: Path, machine: str, commit: str, env: str | None = None) -> list[Path]:
    """The results files ``machine`` has at ``commit`` (asv names them <commit8>-<env>.json,
    or <commit8>-env-<md5>.json for a name of 128 characters or more), in environment ``env``
    only when given."""
    # here, not at the top: importing asv is slow, and every command's parser imports this
    from asv.results import get_filename

    name = None if env is None else Path(get_filename(machine, commit, env)).name
    return [p for p in results_files(results_dir / machine)
            if p.name.startswith(commit[:8]) and (name is None or p.name == name)]


def merge_benchmarks(path: Path, new: dict, warn: Callable[[str], None],
                     keep: bool = False) -> None:
    """Merge a run's benchmarks.json into ``path``: every benchmark either knows, the newer
    description winning (``new``'s, or the file's where ``keep``: a run of an older commit),
    so results of a benchmark since removed can still be read. The file
    is rewritten only when that changes it. An old file that is not a JSON object (emptied,
    cut short) is kept beside (backup), and ``warn`` told so: the next run needs no hand fix."""
    old = None
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict):
            warn(f"{path} could not be read; rewritten, the old file kept as {backup(path).name}")
            old = None
    merged = {**new, **(old or {})} if keep else {**(old or {}), **new}
    if merged != old:
        atomic.write_text(path, json.dumps(merged, indent=4, sort_keys=True) + "\n")


def import_results(staging: Path, results_dir: Path, machine: str, old: list[Path], force: bool,
                   log: Callable[[str], None]) -> list[Path]:
    """Copy one asv run's output from ``staging`` into ``results_dir``, each file atomically:
    benchmarks.json (merged) first, then machine.json, then the results files, so a reader
    never meets a result whose benchmark it cannot interpret. ``old`` are the recorded files
    this run replaces: AlreadyRecorded unless ``force``, else each is moved aside (kept, not
    read). Any other file already there (recorded meanwhile by another run) is AlreadyRecorded,
    and never written over; a results file asv left cut short is CutShort, and nothing is
    written. Returns the results files written ([] when asv wrote none)."""
    files = results_files(staging / machine)
    if not files:
        return []
    check_written(files)
    if old and not force:
        raise AlreadyRecorded(f"{old[0]} is already recorded; pass --force to replace it")
    dest, replaced = results_dir / machine, {p.name for p in old}
    meanwhile = [dest / f.name for f in files
                 if f.name not in replaced and (dest / f.name).exists()]
    if meanwhile:  # by another run since ``old`` was taken: never replaced, --force or not
        raise _meanwhile(meanwhile[0])
    if (staging / "benchmarks.json").exists():
        # asv publish draws only the results whose benchmark version is benchmarks.json's: a run
        # of an older commit (filling in history) must not hide the newer results of a benchmark
        # changed since.
        dates = [d.get("date") for d in map(json_object, files)]  # all JSON objects: check_written
        keep = all(isinstance(x, int) for x in dates) and recorded_later(results_dir, max(dates))
        merge_benchmarks(results_dir / "benchmarks.json",
                         json.loads((staging / "benchmarks.json").read_text()), log, keep=keep)
    if ((staging / machine / "machine.json").exists()
            and _new_hardware(staging / machine / "machine.json", dest / "machine.json")):
        atomic.copy(staging / machine / "machine.json", dest / "machine.json")
    for p in old:
        log(f"replacing {p} (--force); the old file is kept as {backup(p).name}")
    written = []
    for f in files:
        try:  # a file not replaced is created, never written over: one that appears meanwhile stays
            written.append(atomic.write_new(dest / f.name, f.read_bytes()))
        except atomic.Taken as exc:
            os.unlink(exc.kept)  # its bytes are still in staging
            raise _meanwhile(dest / f.name) from None
    return written


def _new_hardware(new: Path, old: Path) -> bool:
    """Whether machine.json ``new`` tells other hardware than ``old`` (or ``old`` is missing or
    unreadable): a run on the same hardware leaves the recorded file as it is, whatever its
    os and ram say (they move from boot to boot)."""
    a, b = json_object(new), json_object(old) if old.exists() else None
    if a is None or b is None:
        return True
    return any(a.get(k) != b.get(k) for k in ("machine", *HARDWARE_PARAMS))


def json_object(path: Path) -> dict | None:
    """The JSON object ``path`` holds; None where it holds none (asv's results file cut short,
    as asv writes it in place)."""
    try:
        found = json.loads(path.read_bytes())
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError
        return None
    return found if isinstance(found, dict) else None


def newest_run(results: Path) -> int | None:
    """The latest commit date (ms since the epoch) of an asv run that ``results`` (RESULTS_DIR
    or asv's results dir) holds; None where it holds none that can be read."""
    try:
        hist = history.read_history(results)
    except history.HistoryError:
        return None
    return max((r.date for runs in hist.runs.values() for r in runs), default=None)


def recorded_later(results: Path, date: int) -> bool:
    """Whether ``results`` (RESULTS_DIR or asv's results dir) holds an asv run of a commit
    dated after ``date`` (ms since the epoch)."""
    newest = newest_run(results)
    return newest is not None and newest > date


def _meanwhile(path: Path) -> AlreadyRecorded:
    return AlreadyRecorded(f"{path} was recorded meanwhile by another run; it is left as it is")
