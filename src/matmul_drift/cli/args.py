"""What every command shares: the parser whose errors are one line, argparse ``type=``
callables that refuse what would otherwise pass unchecked, arguments two commands take, the
one-line error and the progress bar on stderr."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from matmul_drift.core import cases
from matmul_drift.core.errors import Misuse, UsageError
from matmul_drift.read.render import visible


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
        raise argparse.ArgumentTypeError("needs a regular expression, got an empty one (it would "
                                         "match every benchmark)")
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({exc})") from None
    return text


def os_error(exc: OSError) -> str:
    """"path: reason" of an OSError (a full disk, a read-only tree), or the reason alone."""
    return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are a UsageError (one line), not its usage block and exit."""

    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)


def say_error(prog: str, message) -> None:
    """``prog: error: message`` on stderr, one line whatever the message holds: its control and
    bidi characters (a newline in a file's name) are written as \\uXXXX (render.visible).
    Every subcommand prints its errors here."""
    print(f"{prog}: error: {visible(message)}", file=sys.stderr)


def flag(param: str) -> str:
    """The flag of a library parameter: slice_n -> --slice-n."""
    return "--" + param.replace("_", "-")


def usage_words(exc: UsageError) -> str:
    """A UsageError's one line; a Misuse's (a BadValue too) with each parameter's flag."""
    if isinstance(exc, Misuse):
        return exc.said(flag)
    return str(exc)


def guarded(prog: str, body, errors: tuple, args: argparse.Namespace) -> int:
    """``body(args)``'s exit status; one of ``errors`` is its one line and exit 2, a Ctrl-C
    outside the search (drawing inputs, plotting: nothing in hand) exit 130."""
    try:
        return body(args)
    except errors as exc:
        say_error(prog, exc)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def progress(msg: str) -> None:
    """A line of progress on stderr, where it is a terminal."""
    if sys.stderr.isatty():
        print(f"matmul-drift: {msg}", file=sys.stderr, flush=True)


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """--m/--k/--n or --case: what explain and order measure."""
    p.add_argument("--m", type=positive)
    p.add_argument("--k", type=positive)
    p.add_argument("--n", type=positive)
    p.add_argument("--case", help=f"a catalog case: {', '.join(cases.CASE_IDS)}")


def add_memory_argument(p: argparse.ArgumentParser, what: str) -> None:
    """--no-host-memory-check, as explain and scan take it."""
    p.add_argument("--no-host-memory-check", action="store_true",
                   help=f"start even when {what} needs more than MemAvailable (a virtual machine "
                        "whose memory grows as it is used reports too little); the GPU's free "
                        "memory is still checked")


class Bar:
    """A tqdm bar on stderr when it is a terminal: update(what runs now, done, total)."""

    def __init__(self, desc: str, unit: str):
        from tqdm import tqdm  # here: at the top it would slow every command's start

        self.bar = tqdm(total=1, desc=desc, unit=unit, file=sys.stderr,
                        disable=not sys.stderr.isatty(), leave=False)

    def update(self, what: str, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done
        self.bar.set_postfix_str(what)  # refreshes

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
