"""Importing what scripts/gpu_check.sh brings back from a GPU machine into results/.

The archive holds asv's results of one machine at one commit (environment named after the
Python's path there), the catalog entries they name, and the explain and scan outputs.
``import_archive`` unpacks it safely (regular files and folders only, nothing outside),
names the environment after the torch build that ran (``existing-torch<version>``, the
version read from the run's env-id catalog entry), and copies everything in atomically:
asv results under results/asv/<machine>/, catalog entries under results/catalog/, the
other outputs under results/gpu-check/<machine>/<commit8>/. A results file already there
with other content is refused (ImportRefused, one line) unless ``force``, which keeps the
old file beside it. An archive without asv results (the suite step did not finish) still
gives its other outputs, with a warning.
"""

from __future__ import annotations

import json
import re
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from . import asvrun, atomic, bounded, history
from .nightly import MACHINE_NAME


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
            for m in tar.getmembers():
                if not (m.isfile() or m.isdir()):
                    raise ImportRefused(f"{archive}: {m.name} is not a regular file or folder")
                name = PurePosixPath(m.name)
                if name.is_absolute() or ".." in name.parts:
                    raise ImportRefused(f"{archive}: {m.name} points outside the archive")
            # tarfile's own "data" filter as well where it exists (Python 3.11.4 and later; not 3.11.2)
            tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ImportRefused(f"{archive}: not a gpu_check archive ({exc})") from None
    return into


def _one_line(path: Path, root: Path) -> str:
    return bounded.read_bytes(path, root).decode("utf-8").strip()


def import_archive(archive: Path | str, results: Path | str, force: bool = False) -> Imported:
    """Import a gpu_check archive into the results folder ``results`` (results/asv and
    results/catalog inside it)."""
    archive, results = Path(archive), Path(results)
    done = Imported()
    with tempfile.TemporaryDirectory() as tmp:
        src = _unpack(archive, Path(tmp))
        try:
            machine, commit = _one_line(src / "MACHINE", src), _one_line(src / "COMMIT", src)
        except (OSError, ValueError) as exc:
            raise ImportRefused(f"{archive}: no MACHINE or COMMIT ({exc})") from None
        if not MACHINE_NAME.match(machine) or not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise ImportRefused(f"{archive}: machine {machine!r} or commit {commit!r} is malformed")
        try:
            hist = history.read_history(src / "results", machine=machine)
            runs = [r for r in hist.runs[machine] if r.commit == commit]
        except (history.HistoryError, KeyError) as exc:
            runs, why = [], f"its asv results cannot be read ({exc})"
        else:
            why = f"it holds no asv results of {machine} at {commit[:8]}"
        if not runs:
            done.warnings.append(f"{archive}: {why}: the suite step did not finish; its other outputs are imported")
        for p in sorted((src / "results" / "catalog").rglob("*.json")):  # content-addressed: same name, same bytes
            dst = results / "catalog" / p.relative_to(src / "results" / "catalog")
            if not dst.exists():
                done.written.append(atomic.copy(p, dst))
        if runs:
            asv_src, asv_dst = src / "results" / "asv", results / "asv"
            asvrun.merge_benchmarks(asv_dst / "benchmarks.json", json.loads(_one_line(asv_src / "benchmarks.json", src)))
            machine_json = asv_src / machine / "machine.json"
            if machine_json.is_file() and not (asv_dst / machine / "machine.json").exists():
                done.written.append(atomic.copy(machine_json, asv_dst / machine / "machine.json"))
            for run in runs:
                done.written.append(_import_run(run, asv_dst / machine, force))
        extras = results / "gpu-check" / machine / commit[:8]
        for p in sorted(src.iterdir()):
            if p.is_file() and p.name not in ("MACHINE", "COMMIT"):
                done.written.append(atomic.copy(p, extras / p.name))
        return done


def _import_run(run: history.Run, dest: Path, force: bool) -> Path:
    """The run's results file under an environment named after its torch build."""
    data = json.loads(run.path.read_text(encoding="utf-8"))
    torch = run.torch or "unknown"
    env = "existing-torch" + re.sub(r"[^A-Za-z0-9._-]", "-", torch)  # "2.11.0+cu130": a file name, a URL
    data["env_name"] = env
    data["params"] = {**data.get("params", {}), "torch": torch}
    text = json.dumps(data, separators=(",", ":")) + "\n"  # asv's own format (it writes NaN for skipped)
    dst = dest / f"{run.commit[:8]}-{env}.json"
    if dst.exists() and dst.read_text(encoding="utf-8") != text:
        if not force:
            raise ImportRefused(f"{dst} is already recorded with other values; pass --force to keep it "
                                "beside and import the new one")
        asvrun.backup(dst)
    return atomic.write_text(dst, text)
