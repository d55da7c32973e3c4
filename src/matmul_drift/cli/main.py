"""`matmul-drift`: run (the main job), explain, bisect, scan, order, summary, nightly, catalog,
machine.

Each command is a module of this package with ``configure(parser)``, ``run(args)`` and ``PROG``,
the name its errors are printed under. A UsageError (core/errors.py) from any of them is one
line on stderr and exit status 2; nothing here prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

# Only the standard library up here: every other import happens inside main's try, where Ctrl-C is
# one line.

EXIT_USAGE = 2
COMMANDS = {
    "run": "the main job: every torch build of the matrix, side by side, with asv on this machine; "
           "then the site and what changed",
    "explain": "measure one shape: error, slice drift, kernels, verdict",
    "bisect": "which torch release changed one product's bits, and what in it changed",
    "scan": "vary one dimension: where do the kernels or the drift change?",
    "map": "the batch-invariance map: which batch sizes M give the same bits?",
    "order": "reveal in which order the kernel adds the K products of an entry",
    "summary": "flag kernel, accuracy and timing changes in asv history",
    "nightly": "one night on one machine (or --merge): asv run, summary, site",
    "catalog": "the kernel names or environment behind an id, as asv shows it",
    "machine": "this hardware's asv machine name, and what it is made of",
}


def command(name: str):
    """The module of a command (matmul_drift.cli.<name>)."""
    return importlib.import_module(f"matmul_drift.cli.{name}")


def build_parser() -> argparse.ArgumentParser:
    from matmul_drift.cli.args import Parser  # here: see _main

    p = Parser(prog="matmul-drift",
               description="Why does torch.matmul drift? Measure, explain and track it.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for name, text in COMMANDS.items():
        command(name).configure(sub.add_parser(name, help=text))
    return p


class OutputError(Exception):
    """Writing stdout failed (a full disk, a reader that left). Not an OSError, so that no
    handler of a subcommand's own files (`except OSError`) takes it for theirs."""


class _Stdout:
    """sys.stdout while main runs: its OSErrors become OutputError; the rest passes through."""

    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):  # isatty, fileno, encoding, ...
        return getattr(self.stream, name)

    def write(self, text):
        try:
            try:
                return self.stream.write(text)
            except UnicodeEncodeError:  # PYTHONIOENCODING=ascii: 'μ' as \u03bc, not a traceback
                enc = self.stream.encoding
                return self.stream.write(text.encode(enc, "backslashreplace").decode(enc))
        except OSError as exc:
            raise OutputError(exc) from None

    def flush(self):
        try:
            self.stream.flush()
        except OSError as exc:
            raise OutputError(exc) from None


def main(argv=None) -> int:
    return guarded(lambda: _main(argv), "matmul-drift")


def guarded(run, prog: str) -> int:
    """``run()``'s exit status, where a stdout that fails is one line on stderr and exit 1, and
    a reader that left (EPIPE) is silence and 141: for every entry point that prints."""
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        try:
            status = run()
        except SystemExit:  # argparse's --help: its text may still be buffered
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at the interpreter's exit, where a failure is a traceback
        return status
    except OutputError as exc:
        from matmul_drift.cli.args import say_error  # here: see _main

        # Whatever is still buffered goes to /dev/null, not into a second error at exit
        # (https://docs.python.org/3/library/signal.html#note-on-sigpipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.stream.fileno())
        cause = exc.args[0]
        if cause.errno == errno.EPIPE:  # `matmul-drift ... | head`: the reader left; nothing to say
            return 141
        say_error(prog, f"cannot write to stdout: {cause.strerror or cause}")
        return 1
    finally:
        sys.stdout = out.stream


def _main(argv) -> int:
    # here, inside main's try: Ctrl-C while importing is one line, not a traceback
    from matmul_drift.cli.args import UsageError, say_error, usage_words

    try:
        parser = build_parser()  # inside: its imports take a while, and Ctrl-C may come then
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        prog = command(args.command).PROG
        try:
            return command(args.command).run(args)
        except UsageError as exc:
            say_error(prog, usage_words(exc))
            return EXIT_USAGE
    except UsageError as exc:
        say_error("matmul-drift", usage_words(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("matmul-drift: interrupted", file=sys.stderr)
        return 130
    # the estimate ahead of time can err: one line, not a traceback
    except (MemoryError, RuntimeError) as exc:
        from matmul_drift.core.routes import ProfilerLost  # here: see _main

        if isinstance(exc, ProfilerLost):
            say_error("matmul-drift", exc)
            return 1
        text = str(exc).strip()
        if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
                or "can't allocate memory" in text):
            raise
        say_error("matmul-drift",
                  f"out of memory: {text.splitlines()[0] if text else type(exc).__name__}")
        return 1
