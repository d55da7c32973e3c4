"""Which kernels ran: the profiler on CUDA, the aten chain and BLAS/oneDNN route on CPU.

Traced with torch here; the names are normalised into a route, and the call's kernels cut from
between the profiler's sentinels, by core/routes.py, which needs no torch.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import sys
import tempfile
import warnings
from contextlib import contextmanager
from typing import NamedTuple

import torch

from matmul_drift.core import blaslog
from matmul_drift.core.routes import (VIEW_OPS, ProfilerLost, bracketed, mkl_banner,
                                      normalise_cuda, route_lines, unique)

try:  # torch's private helpers of prof.events(); where a torch lacks them, session_events asks it
    from torch.autograd.profiler_util import _filter_name, _rewrite_name
except ImportError:
    _filter_name = _rewrite_name = None

_BANNER: list[str] = []


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@contextmanager
def profiled(*activities):
    """torch.profiler.profile over ``activities`` (ProfilerActivity values), as a context that
    yields the profiler. torch 2.11 warns at every profiler's start that it keeps one cycle's
    events ("set acc_events=True"), once per process, onto stderr: one cycle is all it runs
    here, so that warning alone is silenced (torch 2.13 no longer gives it). The CPU's routes
    read the autograd profiler instead (cpu_route): the CUDA path keeps this one, the
    profiler its GPU check runs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events",
                                category=UserWarning)
        with torch.profiler.profile(activities=list(activities)) as prof:
            yield prof


@contextmanager
def captured_fds(fds=(1, 2)):
    """Capture what C libraries write to the given file descriptors (1: stdout, 2: stderr).

    MKL and oneDNN print their verbose lines on fd 1; Kineto prints a note on fd 2 at
    every profiler start and stop. ``box[fd]`` holds each text after the block.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in fds}
    tmps = {fd: tempfile.TemporaryFile() for fd in fds}
    box: dict[int, str] = {}
    try:
        for fd in fds:
            os.dup2(tmps[fd].fileno(), fd)
        yield box
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c_stdio()  # C libraries buffer stdout when it is a file: flush into the capture
        for fd in fds:
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
            tmps[fd].seek(0)
            box[fd] = tmps[fd].read().decode("utf-8", "replace")
            tmps[fd].close()


# Kineto's notes: "USDT:... profiler_start" at every session; and, at a process's first session
# under a CUDA build of torch on a machine without a GPU (2.14.1+cu130, no driver), "ERROR:<time>
# <pid>:<tid> DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35": an ERROR on every
# CPU explain, scan and order, about a device that measurement does not use.
_KINETO_NOTE = re.compile(r"USDT:|ERROR:.*\] gpuGetDeviceCount failed with code \d+$")


def _pass_on_stderr(text: str) -> None:
    """Re-emit captured stderr, less Kineto's notes (``_KINETO_NOTE``)."""
    rest = "".join(line for line in text.splitlines(True)
                   if not _KINETO_NOTE.match(line.rstrip("\n")))
    if rest:
        sys.stderr.write(rest)


def cpu_route(fn) -> tuple[object, list[str]]:
    """Run ``fn`` once on the CPU: (its result, its aten op chain plus the BLAS/oneDNN route).

    Where neither MKL nor oneDNN reports anything, the route is ``native``.
    """
    with captured_fds() as box:
        with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON), \
                torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            # the profiler under torch.profiler's: the same CPU events, without the import of
            # torch._inductor that torch.profiler makes at its first start (slow, once a process)
            with torch.autograd.profiler.profile(use_kineto=True) as prof:
                result = fn()
    _pass_on_stderr(box[2])
    text = box[1]
    banner = mkl_banner(text)
    if banner and not _BANNER:
        _BANNER.append(banner)
    ops = unique(e.name for e in prof.function_events
                 if e.name.startswith("aten::") and e.name not in VIEW_OPS)
    route = unique(route_lines(text)) or ["native"]
    return result, ops + route


# Sentinels: torch.profiler can lose a session's first kernel records. Kineto registers
# CUPTI's timestamp callback again at every session, and from then on the first k records of
# the k-th session get bad timestamps and are dropped, silently (pytorch/pytorch#192021; the
# very first session can lose all of them, pytorch/kineto#996). Each traced call opens a
# session of its own, so a scan would soon read "(no kernel)". Kernels no matmul launches
# bracket the call: spins before it (padding that the loss eats first) and adds to a uint8
# scratch byte after it (should a profiler lose the last records instead; a float matmul
# launches no uint8 kernel). A list between a surviving spin and a surviving add is whole;
# otherwise the call is traced again with more padding on the side that lost.
SPIN_CYCLES = 1000  # about a microsecond of torch.cuda._sleep
TRIES = 4
MAX_PAD = 1 << 14  # markers on either side of a call; a profiler losing more is ProfilerLost


class Event(NamedTuple):
    name: str
    device_type: object  # torch.autograd.DeviceType


def session_events(prof) -> list:
    """A profiler session's events as ``prof.events()`` lists them (name and device type, in
    time order), read from Kineto's records without building ``prof.events()``'s tree, which
    is slow per event: the sentinels' padding may put thousands of markers in each
    session of a long scan when the profiler loses records. ``prof.events()`` where torch has
    no such records."""
    raw = None
    if _filter_name is not None:
        try:
            raw = prof.profiler.kineto_results.events()
        except AttributeError:  # a profiler without Kineto's records: prof.events() below
            pass
    if raw is None:
        return [Event(e.name, e.device_type) for e in prof.events()]
    kept = [e for e in raw
            if not _filter_name(e.name()) and not getattr(e, "is_hidden_event", lambda: False)()]
    kept.sort(key=lambda e: (e.start_ns(), -e.end_ns()))  # prof.events()'s order
    # prof.events() demangles every name (Kineto demangles kernels, but not every record)
    return [Event(_rewrite_name(e.name(), with_wildcard=True), e.device_type()) for e in kept]


def device_names(events, cuda_type) -> list[str]:
    """The normalised names of the device-side events (kernels, memcpy, memset), in time order.
    Each kernel is one event; its launch is a CPU event. A kernel launched twice stays twice."""
    return [normalise_cuda(e.name) for e in events if getattr(e, "device_type", None) == cuda_type]


class Sentinels:
    """Per process: the names of the two markers (learned from sessions of markers alone; None
    where the profiler shows them not: tracing then goes unchecked) and the padding on each
    side, twice the largest loss seen there so far plus 4 (the loss grows by about one a
    session)."""

    def __init__(self, record_alone):
        self.lost = (0, 0)
        # traced calls; those traced again; those given up
        self.calls = self.retried = self.failed = 0
        self.marks = None
        for n in (8, 64, 512, 4096):
            names = record_alone((n, n))  # spins, then byte adds
            if names and names[0] != names[-1]:
                self.marks = (names[0], names[-1])
                return
        print("matmul-drift: warning: the profiler showed no sentinel kernels; "
              "CUDA kernel lists go unchecked",
              file=sys.stderr)

    @property
    def pad(self) -> tuple[int, int]:
        return (2 * self.lost[0] + 4, 2 * self.lost[1] + 4)

    def kernels(self, record) -> list[str]:
        """The call's kernels from ``record(pad)`` (one traced call with ``pad[0]`` spins before
        it and ``pad[1]`` byte adds after), traced again with more padding while a try is not
        bracketed."""
        if self.marks is None:
            return record((0, 0))
        pads, seen = [], []
        self.calls += 1
        for _ in range(TRIES):
            if max(self.pad) > MAX_PAD:
                break
            pads.append(self.pad)
            names = record(pads[-1])
            got, lost = bracketed(names, self.marks, pads[-1])
            self.lost = (max(self.lost[0], lost[0]), max(self.lost[1], lost[1]))
            if got is not None:
                self.retried += len(pads) > 1
                return got
            seen.append(len(names))
        self.failed += 1
        raise ProfilerLost(f"the profiler lost kernel records at each of {len(pads)} tries "
                           "(markers before and after the call: "
                           f"{', '.join(f'{a}+{b}' for a, b in pads)}; device events seen: "
                           f"{', '.join(map(str, seen))})")

    def report(self) -> str | None:
        """One line on what the profiler lost in this process, or None where it lost nothing.
        The padding tells how much: twice the largest loss seen on each side, plus 4 (a side
        whose every marker went counts its whole padding as lost)."""
        if self.lost == (0, 0):
            return None
        return (f"the profiler lost kernel records; of {self.calls} traced calls, {self.retried} "
                f"were traced again with more markers and {self.failed} given up; markers now "
                f"{self.pad[0]} before a call and {self.pad[1]} after it")


_SENTINELS: list[Sentinels] = []
NOTES_ENV = "MATMUL_DRIFT_PROFILER_NOTES"  # a file that each process appends its note to


def _report_at_exit() -> None:
    """So that a run says whether the profiler dropped records (pytorch#192021), and how many:
    on stderr, and in the file $MATMUL_DRIFT_PROFILER_NOTES where set, which also takes the
    notes of processes whose stderr nobody shows (asv's setup_cache, the fix finder's)."""
    line = _SENTINELS[0].report() if _SENTINELS else None
    if not line:
        return
    try:
        if sys.stderr is not None:
            print(f"matmul-drift: note: {line}", file=sys.stderr, flush=True)
        if os.environ.get(NOTES_ENV):
            with open(os.environ[NOTES_ENV], "a", encoding="utf-8") as fh:
                fh.write(f"{line} ({' '.join(sys.argv)[:160]})\n")
    except (OSError, ValueError):  # stderr closed, the file gone: the run itself is done
        pass


# cuBLASLt's and cuBLAS's loggers (their documented C API), each library as it is loaded in
# this process; unverified on a GPU until the GPU check runs it (docs/measurements.md)
_LT_LEVELS = {1: "Error", 2: "Trace", 3: "Hints", 4: "Info", 5: "Api"}
_LT_TRACE = 2  # calls that launch kernels, with their parameters


def loaded_library(prefix: str, maps: str = "/proc/self/maps") -> str | None:
    """The path of the shared library this process has loaded whose file name starts with
    ``prefix`` (``libcublasLt.so``), or None."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith(prefix):
                    return path
    except OSError:
        pass
    return None


class BlasLog:
    """What cuBLASLt (``lt``) and cuBLAS (``blas``) log about the calls made inside
    ``logging()``, through callbacks in this process; both loggers are off outside it, so
    timed calls pay nothing. ``libs`` maps "lt" and "blas" to a loaded library (ctypes.CDLL)
    or None; ``notes`` says what could not be set up."""

    def __init__(self, libs: dict):
        self.lt, self.blas = libs.get("lt"), libs.get("blas")
        self.on = False
        self.lt_text: list[str] = []
        self.legacy_text: list[str] = []
        self.notes: list[str] = []
        self.states: list[dict] = []  # the handle's state of each block read (read_logs)
        # kept on self: ctypes frees a callback nothing refers to, and the library would call
        # freed memory
        self._lt_cb = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)(
            self._on_lt)
        self._blas_cb = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(self._on_blas)
        if self.lt is not None and self._status(self.lt, "cublasLtLoggerSetCallback", self._lt_cb):
            self.lt = None
        if self.blas is not None and self._status(self.blas, "cublasSetLoggerCallback",
                                                  self._blas_cb):
            self.blas = None

    def _status(self, lib, name: str, *args) -> str | None:
        """None where ``lib.name(*args)`` returned 0 (CUBLAS_STATUS_SUCCESS); else a note, kept."""
        try:
            rc = getattr(lib, name)(*args)
        except (AttributeError, OSError) as exc:
            rc = exc
        if rc == 0:
            return None
        self.notes.append(f"{name}: {rc}")
        return self.notes[-1]

    def _on_lt(self, level: int, function: bytes, message: bytes) -> None:
        if self.on:  # as a line of its log file, less time and pid (core/blaslog.py reads both)
            self.lt_text.append(f"[cublasLt][][{_LT_LEVELS.get(level, level)}]"
                                f"[{(function or b'').decode()}] "
                                f"{(message or b'').decode('utf-8', 'replace')}")

    def _on_blas(self, message: bytes) -> None:
        if self.on:
            self.legacy_text.append((message or b"").decode("utf-8", "replace"))

    @contextmanager
    def logging(self):
        """Both loggers on for the block, their text collected afresh."""
        self.lt_text.clear()
        self.legacy_text.clear()
        self.on = True
        if self.lt is not None:
            self.lt.cublasLtLoggerSetLevel(_LT_TRACE)
        if self.blas is not None:
            self.blas.cublasLoggerConfigure(1, 0, 0, None)
        try:
            yield self
        finally:
            if self.lt is not None:
                self.lt.cublasLtLoggerSetLevel(0)
            if self.blas is not None:
                self.blas.cublasLoggerConfigure(0, 0, 0, None)
            self.on = False

    def recipes(self, stdout_text: str = "") -> list[str]:
        """The recipe lines of the last ``logging()`` block; its handle's state is kept for
        ``handle_state``. A library that printed its log to stdout rather than to the callback
        (captured as ``stdout_text``) is read there."""
        lt = "\n".join(self.lt_text) or stdout_text
        legacy = "\n".join(self.legacy_text) or stdout_text
        lines, state = blaslog.read_logs(lt, legacy)
        self.states.append(state)
        return lines

    def handle_state(self) -> dict | None:
        """The cuBLAS handle's state over the blocks read since the last call
        (blaslog.merge_states), then forgotten; None where none was read."""
        out, self.states = blaslog.merge_states(self.states), []
        return out


def _blas_log() -> BlasLog:
    """This process's BlasLog over the cuBLASLt and cuBLAS it has loaded (a first small
    product loads them where torch has not yet); a library not found is a note."""
    one = torch.ones(8, 8, device="cuda")
    (one @ one).sum().item()
    libs = {}
    for key, prefix in (("lt", "libcublasLt.so"), ("blas", "libcublas.so")):
        path = loaded_library(prefix)
        try:
            libs[key] = ctypes.CDLL(path) if path else None
        except OSError:
            libs[key] = None
    log = BlasLog(libs)
    log.notes += [f"{prefix} not loaded"
                  for key, prefix in (("lt", "libcublasLt"), ("blas", "libcublas"))
                  if libs[key] is None]
    return log


def _cublas_lines(text: str) -> tuple[str, str]:
    """(the cuBLAS and cuBLASLt log lines in captured stdout, the rest)."""
    keep, rest = [], []
    for line in text.splitlines(True):
        (keep if "[cublasLt]" in line or line.startswith(("I! cuBLAS", "i!"))
         else rest).append(line)
    return "".join(keep), "".join(rest)


def cuda_kernels(fn) -> tuple[object, list[str]]:
    """Run ``fn`` under torch.profiler: (its result, the device kernels it launched, in order,
    then the cuBLAS and cuBLASLt recipes its call logged: core/blaslog.py). A try whose records
    are not whole (``Sentinels``) runs ``fn`` again: the result, the kernels and the recipes
    returned come from the same call. ProfilerLost where no try was whole."""
    box: list = []
    recipes: list[str] = []
    scratch = torch.empty(1, dtype=torch.uint8, device="cuda")
    if not _BLAS_LOG:
        _BLAS_LOG.append(_blas_log())
        for note in _BLAS_LOG[0].notes:
            print(f"matmul-drift: note: no cuBLAS recipes in kernel lists: {note}", file=sys.stderr)
    log = _BLAS_LOG[0]

    def record(pad: tuple[int, int], call=True) -> list[str]:
        box.clear()  # a retry holds one result and its recipes at a time
        recipes.clear()
        torch.cuda.synchronize()
        # stdout too: a library that prints its log there must not reach a --json report
        with captured_fds((1, 2)) as out:
            with profiled(torch.profiler.ProfilerActivity.CPU,
                          torch.profiler.ProfilerActivity.CUDA) as prof:
                for _ in range(pad[0]):
                    torch.cuda._sleep(SPIN_CYCLES)
                if call:
                    with log.logging():
                        box.append(fn())
                for _ in range(pad[1]):
                    scratch.add_(1)
                torch.cuda.synchronize()
        logged, rest = _cublas_lines(out[1])
        sys.stdout.write(rest)
        _pass_on_stderr(out[2])
        if call:
            recipes.extend(log.recipes(logged))
        return device_names(session_events(prof), torch.autograd.DeviceType.CUDA)

    if not _SENTINELS:  # a torch without _sleep has no spin: tracing goes unchecked
        _SENTINELS.append(Sentinels(lambda pad: record(pad, call=False)
                                    if hasattr(torch.cuda, "_sleep") else []))
        atexit.register(_report_at_exit)
    names = _SENTINELS[0].kernels(record)
    return box[0], (names or ["(no kernel)"]) + recipes


_BLAS_LOG: list[BlasLog] = []


def handle_state() -> dict | None:
    """The cuBLAS handle's state (workspace, math mode, stream, set-up calls, unread log
    lines: core/blaslog.py) over the CUDA calls traced since the last call; None where none
    was logged. It is the environment's, not the kernel-id's."""
    return _BLAS_LOG[0].handle_state() if _BLAS_LOG else None


def traced(fn, device: str) -> tuple[object, list[str]]:
    """(the result of one call of ``fn`` on ``device``, the normalised kernel list of that call).
    The measured product and its route come from the same call: no second product is made."""
    return cuda_kernels(fn) if device == "cuda" else cpu_route(fn)


def route(fn, device: str) -> list[str]:
    """The normalised kernel list of one call of ``fn`` on ``device``."""
    return traced(fn, device)[1]


def mkl_code_path() -> str | None:
    """MKL's banner (its version and code path), None where this torch has no MKL. MKL prints
    it once a process, at the first call with verbose on; where no traced call has made one
    (a bfloat16 product takes oneDNN), a 1×1 float64 product does, so that the environment
    does not depend on which products the process made first."""
    if not _BANNER:
        one = torch.ones(1, 1, dtype=torch.float64)
        cpu_route(lambda: one @ one)
        if not _BANNER:  # no MKL: asked once a process
            _BANNER.append(None)
    return _BANNER[0]
