"""Ctrl-C and SIGTERM (`timeout`'s) as a request to stop at the next safe point, so that
what was measured so far is kept: scan lets the point in hand finish, the fix finder ends
the process in hand. Exit status 128 + the signal's number (130, 143), as a shell reports it.
"""

from __future__ import annotations

import contextlib
import signal
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# GNU timeout signals the command and then its whole process group, which holds the command:
# two SIGTERMs microseconds apart are one request. A person's second Ctrl-C comes later.
ECHO_S = 0.5


@contextlib.contextmanager
def deferred(stopped: list[int], escalate: bool = True):
    """While inside, SIGINT and SIGTERM append their number to ``stopped`` for the code in
    hand to see; with ``escalate`` a second one, ECHO_S seconds or more after the first,
    raises KeyboardInterrupt (stop at once). The previous handlers come back after."""
    first: list[float] = []

    def stop(signum, frame):
        if stopped and escalate and time.monotonic() - first[0] >= ECHO_S:
            raise KeyboardInterrupt
        if not stopped:
            first.append(time.monotonic())
        stopped.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def name(signum: int) -> str:
    """The signal's name, as SIGTERM for 15; "signal N" for a number Python has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
