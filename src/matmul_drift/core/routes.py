"""Routes, without torch: the environment variables that steer one (``ROUTE_VARS``), MKL's and
oneDNN's verbose lines and CUDA kernel names normalised into one, a traced call's kernels cut
from between the profiler's sentinels (``bracketed``), and ``ProfilerLost`` where they never
were whole. measure/kernels.py traces and measure/environment.py records with torch; the
commands that read or render a kernel list, or set a recorded route's variables, import these
names from here.

Names are normalised so that a kernel list names a *route*: pointers, timings, leading
dimensions and problem sizes go; the routine, the transposes, MKL's CNR mode, the
implementation (oneDNN's ISA, a CUDA kernel's tile and split-K) and the thread count
stay. A kernel-id therefore changes when the route changes, not when the shape does.
"""

from __future__ import annotations

import re

# Environment variables that steer BLAS/oneDNN/cuBLAS routes or thread counts: the
# environment record keeps those set (measure/environment.py), confirm sets them (probes/).
ROUTE_VARS = (
    "MKL_CBWR", "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS",
    "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
    "NVIDIA_TF32_OVERRIDE", "TORCH_BLAS_PREFER_CUBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT",
    # cuBLAS 12.9 and newer: fp32 (and fp64) emulated on tensor cores, and how eagerly
    "CUBLAS_EMULATE_SINGLE_PRECISION", "CUBLAS_EMULATE_DOUBLE_PRECISION",
    "CUBLAS_EMULATION_STRATEGY",
)

_MKL_CALL = re.compile(r"MKL_VERBOSE\s+([A-Z0-9_]+)\(([^)]*)\)(.*)")
_MKL_KEEP = ("CNR", "NThr")
# aten ops that only make views or allocate: they say nothing about how the sum is done,
# and some appear or not with the shape alone (a squeeze here, an as_strided there).
VIEW_OPS = frozenset(
    "aten::" + op
    for op in (
        "as_strided as_strided_ unsqueeze unsqueeze_ squeeze squeeze_ resolve_conj resolve_neg "
        "view _unsafe_view reshape _reshape_alias expand t transpose permute slice select alias "
        "detach lift_fresh empty empty_strided empty_like"
    ).split()
)
_SPACES = re.compile(r"\s+")
_PTR = re.compile(r"(?<![0-9A-Za-z_])0x[0-9a-fA-F]+")


def normalise_mkl(line: str) -> str | None:
    """``MKL_VERBOSE SGEMM(N,N,8,1,64,0x..,..) 53.51us CNR:OFF Dyn:1 .. NThr:2`` ->
    ``MKL SGEMM(N,N) CNR:OFF NThr:2``; None for lines that are not calls."""
    m = _MKL_CALL.search(line)
    if not m:
        return None
    routine, args, tail = m.groups()
    # The leading arguments that are letters (transposes, uplo, side) describe the route.
    flags = []
    for arg in args.split(","):
        arg = arg.strip()
        if re.fullmatch(r"[A-Za-z]", arg):
            flags.append(arg.upper())
        else:
            break
    kept = [tok for tok in tail.split() if tok.split(":", 1)[0] in _MKL_KEEP]
    return " ".join([f"MKL {routine}({','.join(flags)})", *kept])


def normalise_onednn(line: str) -> str | None:
    """An ``onednn_verbose,...,primitive,exec,cpu,matmul,<impl>,..,<descs>,..,<sizes>,<ms>`` line
    -> ``oneDNN matmul <impl> <data types> <attributes>``; None for headers, info and creation
    lines."""
    parts = line.strip().split(",")
    if not parts or not parts[0].endswith("_verbose") or "exec" not in parts:
        return None
    i = parts.index("exec")
    try:
        _engine, prim, impl, _prop, descs, attrs = parts[i + 1 : i + 7]
    except ValueError:
        return None
    types = " ".join(_onednn_desc(d) for d in descs.split() if d.count(":") >= 1)
    # attributes change the sum (attr-fpmath:bf16: products in bfloat16); the scratchpad's
    # owner does not
    kept = " ".join(a for a in attrs.split()
                    if a.startswith("attr-") and not a.startswith("attr-scratchpad"))
    return f"oneDNN {prim} {impl} {types} {kept}".strip()


def _onednn_desc(desc: str) -> str:
    """``wei:bf16::blocked:ba:1x1024:f0`` -> ``wei:bf16:ba``: the argument, its data type and,
    where it is not plain row-major (``ab``, ``abc``), its layout tag, which names a transposed
    operand as MKL's ``T`` does. The strides (a leading dimension) are the shape's and go."""
    f = desc.split(":")
    tag = f[4] if len(f) == 7 else ""  # oneDNN 3's arg:dt:extra:kind:tag:strides:flags
    plain = tag == "abcdefghijkl"[: len(tag)]
    return ":".join(f[:2]) + ("" if plain else f":{tag}")


def normalise_cuda(name: str) -> str:
    """A device kernel name without ``void``, its argument list or extra spaces.

    Template arguments, tile sizes and split-K markers stay: they are the route.
    """
    n = _SPACES.sub(" ", name.strip())
    if n.startswith("void "):
        n = n[5:]
    # Drop the trailing parameter list "(...)" if the name ends with one.
    if n.endswith(")"):
        depth = 0
        for i in range(len(n) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(n[i], 0)
            if depth == 0:
                # keep operator() etc.: only cut when something precedes the '('
                if i > 0:
                    n = n[:i].rstrip()
                break
    n = _PTR.sub("", n)
    n = re.sub(r"\s*([<>,*&])\s*", r"\1", n)
    return n


def route_lines(text: str) -> list[str]:
    """Normalised MKL and oneDNN calls in captured verbose output, in order."""
    out = []
    for line in text.splitlines():
        norm = normalise_mkl(line) if "MKL_VERBOSE" in line else normalise_onednn(line)
        if norm:
            out.append(norm)
    return out


def unique(seq) -> list:
    """Items in first-seen order, each once."""
    seen, out = set(), []
    for item in seq:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def merged(kind: str, calls: list[tuple[str, list[str]]]) -> dict[str, list[str]]:
    """The kernel lists of one kind's calls, each (label, its names): ``kind`` holds every name
    once, in first-seen order. Where the calls' lists differ, ``kind + " per call"`` also holds
    each as "label: name; name", since the merged list alone is the same whichever call ran
    which kernel (n = 2 moving from Y to X beside n = 1 on X and n = 8 on Y)."""
    out = {kind: unique(name for _, names in calls for name in names)}
    if len({tuple(names) for _, names in calls}) > 1:
        out[f"{kind} per call"] = [f"{label}: {'; '.join(names)}" for label, names in calls]
    return out


def mkl_banner(text: str) -> str | None:
    """MKL's first verbose line (version and the code path it chose), if present."""
    for line in text.splitlines():
        if line.startswith("MKL_VERBOSE") and ("Intel(R) MKL" in line or "oneMKL" in line):
            # The banner has no newline of its own; the profiler's USDT notes can follow it.
            return line.replace("MKL_VERBOSE", "", 1).split("USDT:", 1)[0].strip()
    return None


class ProfilerLost(RuntimeError):
    """The profiler lost kernel records of the traced call at every try."""


def bracketed(names: list[str], marks: tuple[str, str],
              pad: tuple[int, int]) -> tuple[list[str] | None, tuple]:
    """(the call's kernels, or None where some may be lost; the records lost at the head and at
    the end, at least) from one session's ``names``: ``pad[0]`` spins, the call's kernels,
    ``pad[1]`` byte adds (``marks``: the spin's and the add's names). Whole only between a
    surviving spin and a surviving add: a loss at the head takes the spins first, one at the
    end the adds."""
    spin, add = marks
    head = 0
    while head < len(names) and names[head] == spin:
        head += 1
    end = len(names)
    while end > head and names[end - 1] == add:
        end -= 1
    # where no marker of a side is left, the loss there reached at least the call
    lost = (max(0, pad[0] - head) if head else pad[0],
            max(0, pad[1] - (len(names) - end)) if end < len(names) else pad[1])
    if not head or end == len(names):
        return None, lost
    return names[head:end], lost
