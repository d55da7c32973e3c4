"""Importing what scripts/gpu_check.sh brings back from a GPU machine into results/.

The archive holds asv's results of one machine at one commit (environment named after the
Python's path there), the catalog entries they name, and the explain and scan outputs.
``import_archive`` unpacks it safely (regular files and folders only, nothing outside, at
most MAX_UNPACKED bytes), refuses what gpu_check.sh does not write (a catalog entry whose
content is not its id, results asv would not write, results of another machine or commit
or without their machine.json, the machine name "all"),
names the environment after the torch build that ran (``existing-torch<version>``, the
version read from the run's env-id catalog entry), and copies everything in atomically:
asv results under results/asv/<machine>/, catalog entries under results/catalog/, the
other outputs under results/gpu-check/<machine>/<commit8>/. A file already there with
other content, asv result or other output, is refused (ImportRefused, one line, before
anything is written) unless ``force``, which keeps the old file beside it. An archive
without asv results (the suite step did not finish) still gives its other outputs, with a
warning.
"""

from __future__ import annotations

import json
import re
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from matmul_drift.core import ids, trees
from matmul_drift.jobs import asvrun
from matmul_drift.jobs.nightly import UsageError, check_machine
from matmul_drift.read import history
from matmul_drift.store import atomic, bounded, catalog

MAX_UNPACKED = 256 << 20  # bytes an archive may unpack to; a real check's is well under 1 MiB
# bytes after tar's end-of-archive block: its zero padding (10 KiB records in GNU tar)
MAX_TAIL = 1 << 20
MAX_ENV_NAME = 120  # characters of an environment's name, a file name's part


class ImportRefused(Exception):
    """The archive cannot be imported: the message says why, in one line."""


@dataclass
class Imported:
    """What an import wrote (``written``: new or changed files) and, one line each, what it
    could not (``warnings``)."""

    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _unpack(archive: Path, into: Path) -> Path:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            total, seen = 0, set()
            for m in tar.getmembers():
                if not (m.isfile() or m.isdir()):
                    raise ImportRefused(f"{archive}: {m.name} is not a regular file or folder")
                name = PurePosixPath(m.name)
                if name.is_absolute() or ".." in name.parts:
                    raise ImportRefused(f"{archive}: {m.name} points outside the archive")
                # tar unpacks the last silently: which one is the check's?
                if m.isfile() and name in seen:
                    raise ImportRefused(f"{archive}: {m.name} is in it twice")
                seen.add(name)
                total += m.size
                # before a byte is unpacked: a few MB of gzip can hold gigabytes
                if total > MAX_UNPACKED:
                    raise ImportRefused(f"{archive}: unpacks to more than "
                                        f"{MAX_UNPACKED >> 20} MiB, "
                                        "which no gpu_check archive does")
            # tarfile's own "data" filter as well where it exists (Python 3.11.4 and later;
            # not 3.11.2)
            tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            # tarfile stops at tar's end, and silently at a damaged header too, and so never reads
            # the gzip trailer: read on to the stream's end, which checks the trailer's CRC and
            # length, and find nothing there but tar's zero padding.
            tar.fileobj.seek(tar.offset)
            rest = tar.fileobj.read(MAX_TAIL + 1)
            if len(rest) > MAX_TAIL or rest.strip(b"\0"):
                raise ImportRefused(f"{archive}: damaged: its tar cannot be read on from byte "
                                    f"{tar.offset}")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ImportRefused(f"{archive}: damaged, or not a gpu_check archive ({exc})") from None
    return into


def _one_line(path: Path, root: Path) -> str:
    return bounded.read_bytes(path, root).decode("utf-8").strip()


BESIDE = ("summary.txt", "log.txt")  # what gpu_check.sh writes beside its archive in OUT


def import_archive(archive: Path | str, results: Path | str, force: bool = False) -> Imported:
    """Import a gpu_check archive into the results folder ``results`` (results/asv and
    results/catalog inside it), and the check's summary.txt and log.txt where they lie beside
    it (gpu_check.sh writes them to OUT, outside the archive, which it packs before they end)."""
    archive, results = Path(archive), Path(results)
    done = Imported()
    try:
        return _import(archive, results, force, done)
    except OSError as exc:  # results/ unwritable, or a file in a folder's place
        raise ImportRefused(f"cannot import into {results}: {exc.strerror or exc} "
                            f"({len(done.written)} files written before)") from None


def _import(archive: Path, results: Path, force: bool, done: Imported) -> Imported:
    with tempfile.TemporaryDirectory() as tmp:
        src = _unpack(archive, Path(tmp))
        try:
            machine, commit = _one_line(src / "MACHINE", src), _one_line(src / "COMMIT", src)
        except (OSError, ValueError) as exc:
            raise ImportRefused(f"{archive}: no MACHINE or COMMIT ({exc})") from None
        try:
            check_machine(machine)
        except UsageError as exc:
            raise ImportRefused(f"{archive}: machine {machine!r} is malformed: {exc}") from None
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise ImportRefused(f"{archive}: commit {commit!r} is malformed")
        try:
            hist = history.read_history(src / "results", machine=machine)
            runs = [r for r in hist.runs[machine] if r.commit == commit]
        except (history.HistoryError, KeyError) as exc:
            runs, why = [], f"its asv results cannot be read ({exc})"
        else:
            why = f"it holds no asv results of {machine} at {commit[:8]}"
        # gpu_check.sh packs asv's results of one machine at one commit, in the folder named for
        # it beside its machine.json: any other is not left out in silence, nor taken half.
        asv_src, ours = (src / "results" / "asv",
                         {r.path for r in runs if r.path.parent.name == machine})
        stray = [p for p in sorted(asv_src.glob("*/*.json"))
                 if p.name != "machine.json" and p not in ours
                 # cut short: a suite step that did not finish
                 and asvrun.json_object(p) is not None]
        if stray:
            raise ImportRefused(f"{archive}: {stray[0].relative_to(src)} is no asv result of "
                                f"{machine} at {commit[:8]} in {machine}/ beside its machine.json"
                                + ("" if runs else f"; {why}"))
        if not runs:
            done.warnings.append(f"{archive}: {why}: the suite step did not finish; "
                                 "its other outputs are imported")
        elif hist.warnings:
            # asv wrote them: anything history doubts (a malformed benchmark) is not asv's
            raise ImportRefused(f"{archive}: its asv results are not as asv writes them: "
                                f"{hist.warnings[0]}")
        # Every results file and output this archive gives, decided before anything is written,
        # so that a refusal leaves results/ as it was.
        asv_dst = results / "asv"
        extras = results / "gpu-check" / machine / commit[:8]
        envs = [_env_name(run) for run in runs]
        for run, env in zip(runs, envs):
            if len(env) > MAX_ENV_NAME:
                raise ImportRefused(f"{archive}: torch version {run.torch[:40]!r}... "
                                    "is too long to name an environment")
        entries = _catalog_entries(archive, src / "results" / "catalog", results / "catalog")
        planned = [(asv_dst / machine / f"{run.commit[:8]}-{env}.json", _run_bytes(run, env))
                   for run, env in zip(runs, envs)]
        outputs = [p for p in sorted(src.iterdir())
                   if p.is_file() and p.name not in ("MACHINE", "COMMIT")]
        beside = [archive.with_name(n) for n in BESIDE if archive.with_name(n).is_file()]
        outputs += [p for p in beside if not (src / p.name).exists()]
        for p in outputs:  # gpu_check.sh's own names, as what comes back from the device must have
            if not re.fullmatch(r"[A-Za-z0-9._-]+", p.name):
                raise ImportRefused(f"{archive}: {p.name!r} is no name gpu_check.sh gives "
                                    "an output")
        # a step that failed or was cut short leaves its output empty, or JSON cut short
        for p in outputs:
            data = p.read_bytes()
            unfinished = ("empty" if not data else
                          "no JSON" if p.suffix == ".json" and _not_json(p.name, data) else None)
            if unfinished:
                done.warnings.append(f"{archive}: {p.name} is {unfinished}: "
                                     "its step did not finish; not imported")
            else:
                planned.append((extras / p.name, data))
        changed = [dst for dst, data in planned if dst.exists() and dst.read_bytes() != data]
        if changed and not force:
            others = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
            raise ImportRefused(f"{changed[0]}{others} already recorded with other content; "
                                "pass --force to keep the old beside and import the new")
        # The catalog entries, benchmarks and machine.json first: a reader never meets a result
        # without them.
        for p, dst in entries:
            done.written.append(atomic.copy(p, dst))
        if runs:
            # asv publish shows a result only where its benchmark version is benchmarks.json's: a
            # check of an older commit must not hide the newer results of a benchmark changed since.
            asvrun.merge_benchmarks(asv_dst / "benchmarks.json",
                                    json.loads(_one_line(asv_src / "benchmarks.json", src)),
                                    done.warnings.append,
                                    keep=asvrun.recorded_later(results, max(r.date for r in runs)))
            machine_json = asv_src / machine / "machine.json"
            if machine_json.is_file() and not (asv_dst / machine / "machine.json").exists():
                done.written.append(atomic.copy(machine_json, asv_dst / machine / "machine.json"))
        for dst, data in planned:  # the asv results, then the outputs
            if dst in changed:
                atomic.backup(dst)  # kept beside (--force)
            elif dst.exists():
                continue  # the same bytes already recorded
            done.written.append(atomic.write_bytes(dst, data))
        return done


def _not_json(name: str, data: bytes) -> bool:
    """Whether ``data`` is no RFC 8259 JSON (what nightly --merge refuses in a tree). An order
    report (order-*.json) is read as nightly --merge reads it: its tree may be K deep, past
    json.loads."""

    try:
        if name.startswith("order-"):
            trees.read_report(data.decode("utf-8"))
        else:
            json.loads(data, parse_constant=ids.no_constant)
    except (ValueError, RecursionError):
        return True
    return False


def _catalog_entries(archive: Path, src: Path, dst: Path) -> list[tuple[Path, Path]]:
    """(source, destination) of each catalog entry the archive holds and results/ lacks.
    Each must be an entry of a known kind whose content is its id (catalog.load): a name
    taken by other content would keep the true entry out for good."""
    out = []
    for p in sorted(src.rglob("*")) if src.is_dir() else []:
        # .tmp-: a write a step's timeout cut short (store/atomic.py)
        if p.is_dir() or p.name.startswith(".tmp-"):
            continue
        rel = p.relative_to(src)
        kind, name = rel.parts if len(rel.parts) == 2 else ("", "")
        if kind not in catalog.KINDS or not re.fullmatch(r"[0-9a-f]{12}\.json", name):
            raise ImportRefused(f"{archive}: {rel} is not a catalog entry "
                                "(KIND/12 hex digits.json)")
        try:
            catalog.load(src, kind, int(name[:12], 16))
        except catalog.MissingEntry as exc:
            raise ImportRefused(f"{archive}: {exc}") from None
        if not (dst / rel).exists():  # content-addressed: the same name holds the same entry
            out.append((p, dst / rel))
    return out


def _env_name(run: history.Run) -> str:
    """The environment's name for a run on the GPU machine: its torch build's ("2.11.0+cu130"
    gives existing-torch2.11.0-cu130: a file name, a URL)."""
    return "existing-torch" + re.sub(r"[^A-Za-z0-9._-]", "-", run.torch or "unknown")


def _run_bytes(run: history.Run, env: str) -> bytes:
    """The run's results file under the environment ``env`` (_env_name), UTF-8."""
    data = json.loads(run.path.read_text(encoding="utf-8"))
    data["env_name"] = env
    data["params"] = {**data.get("params", {}), "torch": run.torch or "unknown"}
    # asv's own format (it writes NaN for skipped)
    text = json.dumps(data, separators=(",", ":")) + "\n"
    return text.encode("utf-8")
