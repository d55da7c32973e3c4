"""Argument types every subcommand shares: argparse ``type=`` callables that refuse, in one
line, what would otherwise pass unchecked, and the one-line text of an OSError."""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def positive(text: str) -> int:
    """A size or count: an integer of at least 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {v}")
    return v


def file_name(text: str) -> str:
    """A file to write or read; "" is refused: falsy, --json "" would silently record nothing."""
    if not text:
        raise argparse.ArgumentTypeError("needs a file name, got an empty one")
    return text


def folder(text: str) -> Path:
    """A folder; "" is refused: Path("") is ".", so an empty $VAR would act on whatever folder
    this runs in."""
    if not text:
        raise argparse.ArgumentTypeError("needs a folder, got an empty name")
    return Path(text)


def bench_regex(text: str) -> str:
    """asv's --bench: a Python regular expression, checked before asv starts (it would fail
    after building its environments); "" is refused: it matches every benchmark."""
    if not text:
        raise argparse.ArgumentTypeError("needs a regular expression, got an empty one (it would match every benchmark)")
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({exc})") from None
    return text


def os_error(exc: OSError) -> str:
    """"path: reason" of an OSError (a full disk, a read-only tree), or the reason alone."""
    return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
