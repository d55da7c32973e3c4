"""How much memory a measurement needs, and whether this machine has it.

The estimate is in bytes and errs a little high: `python scripts/bench_memory.py` prints
the measured peak resident size of explain and of a scan against it. A shape that needs
more than there is gets one line (TooLarge) before anything is drawn, rather than a
MemoryError part way, or the kernel's OOM killer, which ends a process without a word.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import torch

from matmul_drift.core.numerics import WIDTH

try:  # numpy's switch of its huge-page advice: a private name, moved in numpy 2
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # numpy 1.x
    try:
        from numpy.core.multiarray import _set_madvise_hugepage
    except ImportError:
        _set_madvise_hugepage = None

ANY_MACHINE = 1 << 60  # bytes: refused even with --no-host-memory-check
# torch and its libraries, resident before any operand, by whether torch is a CUDA (or ROCm)
# build, whose GPU libraries are mapped on a machine without a GPU too. Measured, explain of a
# 2×8×8 float32 product: 236 MiB with 2.13.0+cpu, 656 MiB with 2.14.1+cu130 (no GPU); 307 and
# 750 MiB while the CPU's kernel routes still imported torch._inductor (docs/performance.md).
PROCESS_BYTES = {False: 384 << 20, True: 1 << 30}
# On CUDA, beyond the arrays: measure.time_call's L2 flush in each process that times, and a
# CUDA context (cuBLAS's workspace with it) in each process but the one that checks, whose own
# context asking the GPU's free memory has already made. Reasoned, not measured: a context
# takes about 0.3-0.5 GiB on Hopper with CUDA's lazy module loading (scripts/gpu_check.sh
# measures it, with and without cuBLAS, into its torch.txt).
FLUSH_BYTES = 256 << 20
CUDA_CONTEXT_BYTES = 512 << 20


def process_bytes() -> int:
    """Bytes resident in a measuring process before any operand (PROCESS_BYTES), for the
    torch installed."""
    return PROCESS_BYTES[bool(torch.version.cuda or getattr(torch.version, "hip", None))]


class TooLarge(ValueError):
    """A measurement that needs more memory than there is (one line)."""


def bytes_needed(m: int, k: int, n: int, dtype: str, device: str, batch: int = 1,
                 prefix_a: bool = False, fixes: bool = False) -> tuple[int, int]:
    """(host, device) bytes to measure the product of an (m, k) A and a (k, n) B, ``batch``
    times, in ``dtype``: explain's measurement, or a scan at the top of its range
    (``prefix_a``: one more copy of A, for a scan along k). ``fixes``: explain --try-fixes,
    which then waits, holding about process_bytes(), while a process of its own measures the
    product under each candidate, one at a time, and another (fixfind's default timer) holds
    the operands to time the default computation beside it (the three processes' measured
    peaks are in docs/performance.md).

    Inputs: the drawn float32 values and their bits. The reference: float64 copies of A and
    B and of their absolute values for dtypes narrower than float64; for float64, Ozaki's
    slices of A (six float64 arrays) and of B in blocks of columns. Outputs: the product,
    its slices and repeats, their float64 values, the reference's and the comparison's
    temporaries. On CUDA the operands (and a column slice's copy of B), the reference and the
    outputs under comparison live on the GPU, beside each timing process's L2 flush
    (FLUSH_BYTES) and, with ``fixes``, two more CUDA contexts (CUDA_CONTEXT_BYTES); the host
    keeps the rest. The bytes per entry
    were fitted to the peaks scripts/bench_memory.py measures on the CPU; the GPU's side is
    reasoned from the same arrays, not measured.
    """
    itemsize = WIDTH[dtype] // 8  # bytes per element
    a, b, outs = batch * m * k, batch * k * n, batch * m * n
    per_a, per_b = (48, 18) if dtype == "float64" else (16, 16)
    ref, prefix = a * per_a + b * per_b, itemsize * a if prefix_a else 0
    # float64: where |A||B| overflows, the reference also keeps |A||B|·2^-e and e, made through
    # a float64 product and torch.where's temporaries (32 bytes per output entry, measured 19 to 33)
    outs_extra = 32 if dtype == "float64" else 0
    host = (process_bytes() * (1 + 2 * fixes) + (a + b) * (4 + itemsize) * (1 + fixes)
            + outs * (64 + 4 * itemsize + outs_extra))
    if device == "cuda":
        gpu = ((a + 2 * b + fixes * (a + b)) * itemsize + prefix + ref
               + outs * (16 + 2 * itemsize + outs_extra))
        return host, gpu + FLUSH_BYTES * (1 + 2 * fixes) + CUDA_CONTEXT_BYTES * 2 * fixes
    return host + prefix + ref, 0


def probe_bytes(a: int, b: int, out: int, k: int, width: int, dtype: str,
                device: str) -> tuple[int, int]:
    """(host, device) bytes of the order probe (order.reveal with its replay) of a product
    whose operands hold ``a`` and ``b`` entries as stored (a copied slice of B counted in
    ``b``) and whose output holds ``out`` entries, in ``dtype``, on ``device``; the host also
    holds one call's probes, ``k`` x ``width`` in float32, and the replay's draws (``k`` x 100
    in float64, a few times over)."""
    ops = (a + b + out) * (WIDTH[dtype] // 8)
    host = process_bytes() + 4 * k * width + 8 * 8 * k * 100
    return (host, ops) if device == "cuda" else (host + ops, 0)


def available(device: str) -> tuple[int | None, int | None]:
    """Bytes available on the host (MemAvailable) and, on CUDA, free on the GPU; None if unknown."""
    host = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    gpu = None
    if device == "cuda":
        gpu = torch.cuda.mem_get_info()[0]
    return host, gpu


def check(need: tuple[int, int], what: str, device: str, host: bool = True) -> None:
    """TooLarge (one line naming ``what``) when ``need`` (host, device bytes) exceeds what is
    available: on the host (MemAvailable, unless not ``host``) or free on the GPU; and always
    beyond ANY_MACHINE."""
    beyond = max(need)
    if beyond > ANY_MACHINE:  # also where a size would overflow torch's int64 element counts
        raise TooLarge(f"{what} needs about {beyond / 2**30:.3g} GiB, beyond any machine's memory "
                       "(1 EiB)")
    have_host, gpu = available(device)
    have_host = have_host if host else None
    for n, have, where in ((need[0], have_host, "memory available (MemAvailable); "
                            "--no-host-memory-check starts anyway, where memory grows as it is "
                            "used"), (need[1], gpu, "GPU memory free")):
        if have is not None and n > have:
            raise TooLarge(f"{what} needs about {n / 2**30:.1f} GiB, more than the "
                           f"{have / 2**30:.1f} GiB of {where}")


SAMPLE_S = 0.025  # peak_bytes's sampling of the whole process tree

# A process's own high-water mark (VmHWM, KiB), written as it exits with its parent's resident
# size then (VmRSS: the parent waits on it). Not wait4's ru_maxrss: Linux carries the exec-ing
# process's peak into it, so after a test that grew pytest to 3.5 GiB every child read 3544 MiB.
_HWM = ("""import atexit, os
def _kib(pid, key):
    return next(int(ln.split()[1]) for ln in open(f"/proc/{pid}/status") if ln.startswith(key))
atexit.register(lambda: open(OUT, "a").write(f"{_kib('self', 'VmHWM:')}+"""
        """{_kib(os.getppid(), 'VmRSS:')} "))
""")
_PEAK_CHILD = f"""import runpy, subprocess, sys
hwm = "OUT = %r\\n" % sys.argv.pop(1) + {_HWM!r}
exec(hwm)
start = subprocess.Popen.__init__


def init(self, args, *a, **kw):  # the Python children it starts (python -c CODE) write theirs too
    if isinstance(args, list) and args[1:2] == ["-c"]:
        args = [args[0], "-c", hwm + args[2], *args[3:]]
    start(self, args, *a, **kw)


subprocess.Popen.__init__ = init
sys.argv[0] = "matmul-drift"
runpy.run_module("matmul_drift.cli", run_name="__main__", alter_sys=True)
"""


def _tree_kib(pid: int) -> int:
    """KiB resident (VmRSS) in process ``pid`` and all its descendants now, summed (a page
    they share counts once for each); 0 for one that has gone."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += map(int, f.read().split())
        except (OSError, ValueError):  # ended meanwhile
            continue
    return total


def peak_bytes(args: list[str], env: dict | None = None) -> tuple[int, int, str]:
    """(exit status, peak resident bytes, stderr) of `matmul-drift ARGS` in a process of its own
    (Linux): the most of its own peak, a Python process it starts (explain --try-fixes: each
    candidate's) peaking with what it held meanwhile, and the resident sizes of it and all its
    processes summed every SAMPLE_S seconds (explain --try-fixes holds three at once: itself,
    a candidate's, and fixfind's default timer, which is killed, so writes no peak of its
    own); what the estimate is checked against."""
    with tempfile.TemporaryDirectory() as tmp, \
            tempfile.TemporaryFile("w+", errors="replace") as err:
        out = os.path.join(tmp, "peak")
        p = subprocess.Popen([sys.executable, "-c", _PEAK_CHILD, out, *args],
                             stdout=subprocess.DEVNULL, stderr=err, env=env)
        tree = 0
        while p.poll() is None:
            tree = max(tree, _tree_kib(p.pid))
            time.sleep(SAMPLE_S)
        with open(out) as f:
            # atexit: its own last
            *children, own = ([int(kib) for kib in x.split("+")] for x in f.read().split())
        err.seek(0)
        return (p.returncode,
                max([own[0], tree] + [child + held for child, held in children]) * 1024, err.read())


def huge_page_switch():
    """numpy's switch of its huge-page advice (on/off in, the previous setting out), or None
    where this numpy has none."""
    return _set_madvise_hugepage


@contextmanager
def small_pages():
    """numpy's large arrays made without its huge-page advice for the duration, then as before.

    Measuring only, where nothing is timed on the CPU: huge pages read faster, so asv's timed
    operands keep them. Fresh huge pages are what a ballooned guest serves slowest: a large
    float64 draw takes several times longer with them (docs/performance.md). A numpy without
    the switch is left as it is.
    """
    advise = huge_page_switch()
    before = advise(False) if advise else None
    try:
        yield
    finally:
        if advise:
            advise(before)
