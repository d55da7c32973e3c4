"""The real kernel and library-route names of fixtures/kernel-names.txt (a copy of
shared/fixtures, committed so that a clone without shared/ has them), for tests without a GPU."""

from __future__ import annotations

from pathlib import Path

PATH = Path(__file__).resolve().parent / "fixtures" / "kernel-names.txt"


def tagged() -> list[tuple[str, str]]:
    """(tag, name) for every line that is not a comment: full, prefix or cpu (the file's header)."""
    return [tuple(line.split("\t", 1)) for line in PATH.read_text().splitlines()
            if line and not line.startswith("#") and "\t" in line]
