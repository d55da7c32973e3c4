"""What cuBLASLt and cuBLAS chose for a call, read from their own logs: the recipe behind a
CUDA kernel name (docs/measurements.md, "The recipe behind a CUDA kernel").

cuBLASLt at log level 2 ("Trace": calls that launch kernels) writes one line per matmul::

    [<time>][cublasLt][<pid>][Trace][cublasLtMatmul] A=0X.. Adesc=[type=R_16F rows=.. cols=.. ld=..]
      .. computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T] algo=[algoId=6
      tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_32x5 numSplitsK=4 ..] workSpace=0X..
      workSpaceSizeInBytes=1048576 beta=0 outOfPlace=0 stream=0X..

cuBLAS with logging on writes a block per call: ``I! cuBLAS (v13.0) function cublasStatus_t
cublasGemmEx(..) called:``, one ``i!  name: type=T; val=V`` line per argument, and a line
``i!Process=..; ..; MathMode=..``. A recipe line keeps what picks the arithmetic (the function,
types, transposes, compute type, algorithm and its configuration, split-K, reduction scheme,
workspace size, math mode) and drops what only places it (pointers, streams, handles) and
the problem's sizes and leading dimensions, as kernel names do (kernels.py): the shape is the
case's. No torch here.
"""

from __future__ import annotations

import re

# "[<time>]" is absent from some versions' lines; <pid> from a callback's, which this module
# rebuilds as lines (kernels.BlasLog)
_LT_LINE = re.compile(r"\[cublasLt\]\[\d*\]\[Trace\]\[(\w+)\]\s*(.*)")
_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|\S+)")
_POINTER = re.compile(r"^0[xX][0-9a-fA-F]*$|POINTER")
_LEGACY_CALL = re.compile(r"^I! cuBLAS \(v[^)]*\) function \S+ (\w+)\(")
_LEGACY_ARG = re.compile(r"^i!\s+(\w+): type=([^;]*); val=(.*)$")
_LEGACY_TAIL = re.compile(r"MathMode=(.*)$")
# cuBLAS's arguments that give sizes or places, not the route
_SIZES = frozenset("m n k lda ldb ldc strideA strideB strideC batchCount".split())
_PLACES = frozenset("handle alpha beta A B C Aarray Barray Carray".split())


def _fields(text: str) -> dict[str, str]:
    """``a=1 b=[x=2 y=3]`` -> {"a": "1", "b": "[x=2 y=3]"}."""
    return {k: v for k, v in _FIELD.findall(text)}


def _inner(value: str) -> dict[str, str]:
    """``[x=2 y=0X7F]`` -> {"x": "2"}: a bracketed field's own fields, less pointers."""
    return {k: v for k, v in _fields(value.strip("[]")).items() if not _POINTER.search(v)}


def lt_calls(text: str) -> list[dict]:
    """Every cuBLASLt Trace line of a matmul in ``text``, in order: ``function``, ``types``
    (A, B, C, D), ``compute`` (computeDesc less pointers), ``algo`` (its fields as logged:
    algoId, tile, stages, numSplitsK, reductionScheme, ...), ``workspace`` (bytes; None where
    not logged) and ``sizes`` (each operand's rows, cols, ld, kept for the reader only)."""
    out = []
    for line in text.splitlines():
        m = _LT_LINE.search(line)
        if not m or "Matmul" not in m.group(1):
            continue
        f = _fields(m.group(2))
        if not f.get("algo", "").endswith("]"):  # a line cut short is no call
            continue
        descs = {op: _inner(f.get(f"{op}desc", "[]")) for op in "ABCD"}
        ws = f.get("workSpaceSizeInBytes")
        out.append({
            "function": m.group(1),
            "types": [descs[op].get("type", "?") for op in "ABCD"],
            "compute": _inner(f.get("computeDesc", "[]")),
            "algo": _inner(f["algo"]),
            "workspace": int(ws) if ws and ws.isdigit() else None,
            "sizes": {op: {k: int(v) for k, v in d.items() if k in ("rows", "cols", "ld") and v.isdigit()}
                      for op, d in descs.items()},
        })
    return out


def legacy_calls(text: str) -> list[dict]:
    """Every cuBLAS call block in ``text`` (its legacy log), in order: ``function``, ``args``
    (name -> value, pointers dropped; an enum's value without its "(n)"), ``math_mode``."""
    out: list[dict] = []
    for line in text.splitlines():
        line = line.rstrip()
        m = _LEGACY_CALL.match(line)
        if m:
            out.append({"function": m.group(1), "args": {}, "math_mode": None})
            continue
        if not out:
            continue
        a = _LEGACY_ARG.match(line)
        if a:
            name, value = a.group(1), a.group(3).strip()
            if not _POINTER.search(value) and name not in _PLACES:
                out[-1]["args"][name] = re.sub(r"\(-?\d+\)$", "", value)
            continue
        t = _LEGACY_TAIL.search(line)
        if t and line.startswith("i!"):
            out[-1]["math_mode"] = t.group(1).strip()
    return out


def _short(value: str) -> str:
    """``MATMUL_TILE_128x128`` -> ``128x128``; ``CLUSTER_SHAPE_1x1x1`` -> ``1x1x1``."""
    return re.sub(r"^(MATMUL_TILE_|MATMUL_STAGES_|CLUSTER_SHAPE_|MATMUL_INNER_SHAPE_)", "", value)


def lt_line(call: dict) -> str:
    """One cuBLASLt call as a recipe: ``cuBLASLt cublasLtMatmul R_16F,R_16F,R_16F,R_16F
    computeType=COMPUTE_32F .. algoId=6 tile=128x128 stages=32x5 numSplitsK=4 workspace=1048576``.
    Fields the log leaves out (a default: split-K 1, no reduction scheme) stay out."""
    compute = " ".join(f"{k}={v}" for k, v in call["compute"].items())
    algo = " ".join(f"{k}={_short(v)}" for k, v in call["algo"].items())
    ws = "" if call["workspace"] is None else f" workspace={call['workspace']}"
    return f"cuBLASLt {call['function']} {','.join(call['types'])} {compute} {algo}{ws}".replace("  ", " ")


def legacy_line(call: dict) -> str:
    """One cuBLAS call as a recipe: ``cuBLAS cublasGemmEx(transa=CUBLAS_OP_T, .., algo=..)
    MathMode=..``, sizes and places left out."""
    args = ", ".join(f"{k}={v}" for k, v in call["args"].items() if k not in _SIZES)
    mode = f" MathMode={call['math_mode']}" if call["math_mode"] else ""
    return f"cuBLAS {call['function']}({args}){mode}"


def recipe_lines(lt_text: str, legacy_text: str) -> list[str]:
    """The recipes of one call's logs: cuBLAS's API calls first (they may hand the product to
    cuBLASLt), then cuBLASLt's matmuls, each in its log's order."""
    return [legacy_line(c) for c in legacy_calls(legacy_text)] + [lt_line(c) for c in lt_calls(lt_text)]
