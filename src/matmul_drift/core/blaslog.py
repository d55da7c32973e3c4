"""What cuBLASLt and cuBLAS chose for a call, read from their own logs: the recipe behind a
CUDA kernel name (docs/measurements.md, "The recipe behind a CUDA kernel").

cuBLASLt at log level 2 ("Trace": calls that launch kernels) writes one line per matmul, named
by the typed entry point that ran (``cublasLtSSSMatmul`` in cuBLAS 11 and 12,
``cublasLtTSTMatmul`` in 13.x) or by ``cublasLtMatmul``::

    [<time>][cublasLt][<pid>][Trace][cublasLtSSSMatmul] A=0X.. Adesc=[type=R_16F rows=.. cols=..
      ld=..] .. computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T] algo=[algoId=6
      tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_32x5 numSplitsK=4 ..] workSpace=0X..
      workSpaceSizeInBytes=1048576 beta=0 outOfPlace=0 stream=0X..

cuBLAS with logging on writes a block per call: ``I! cuBLAS (v13.0) function cublasStatus_t
cublasGemmEx(..) called:``, one ``i!  name: type=T; val=V`` line per argument, and a line
``i!Process=..; ..; StreamId=..; MathMode=..``. Only the product's own calls make a recipe (the
GEMM and GEMV calls, the matmul Trace lines): torch sets up its handle before every product
(cublasSetStream, cublasSetWorkspace, cublasSetMathMode; cublasCreate and cublasDestroy where
it makes one) is no part of the recipe, and the workspace size, math mode and stream the
product ran under are the handle's state (``handle_state``), which the environment records.
Which set-up calls a product's log holds depends on what the process made before it (a handle
is made once), so their names are recorded nowhere. A recipe line
keeps what picks the arithmetic (the function, types and layouts, transposes, compute type,
algorithm and its configuration: tile, stages, split-K, reduction scheme, custom option,
cluster shape) and drops what only places it (pointers, streams, handles) and the problem's
sizes and leading dimensions, as kernel names do (routes.py): the shape is the case's. A line
the parser cannot read is kept verbatim in the handle's state and counted. No torch here.
"""

from __future__ import annotations

import re

# "[<time>]" is absent from some versions' lines; <pid> from a callback's, which this module
# rebuilds as lines (kernels.BlasLog)
_LT_LINE = re.compile(r"\[cublasLt\]\[\d*\]\[(\w+)\]\[(\w+)\]\s*(.*)")
# the matmul's entry points: untyped, or typed by A/compute/D type (SSS, HSH, TST, ...)
_LT_MATMUL = re.compile(r"^cublasLt(?:[A-Z]{3})?Matmul$")
_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|\S+)")
_POINTER = re.compile(r"^0[xX][0-9a-fA-F]*$|POINTER")
_LEGACY_CALL = re.compile(r"^I! cuBLAS \(v[^)]*\) function \S+ (\w+)\(")
_LEGACY_ARG = re.compile(r"^i!\s+(\w+): type=([^;]*); val=(.*)$")
# a call's closing line; cublasCreate's names no stream and no math mode (it has no handle yet)
_LEGACY_TAIL = re.compile(r"^i!\s*Process=")
_MATH_MODE = re.compile(r"MathMode=(.*)$")
_LEGACY_KNOWN = re.compile(r"^i!\s*(Time:|COMPILED WITH:)")  # read, and nothing of the route
# cuBLAS's calls that compute a product; the rest set up the handle
_LEGACY_PRODUCT = re.compile(r"gem[mv]", re.I)
# cuBLAS's arguments that give sizes or places, not the route
_SIZES = frozenset("m n k lda ldb ldc strideA strideB strideC batchCount".split())
_PLACES = frozenset("handle alpha beta A B C x y Aarray Barray Carray incx incy".split())
_DESC_SIZES = frozenset("rows cols ld batchCount stridedBatchOffset".split())
UNREAD_KEPT = 20  # unread lines kept verbatim in the handle's state; all of them are counted


def _fields(text: str) -> dict[str, str]:
    """``a=1 b=[x=2 y=3]`` -> {"a": "1", "b": "[x=2 y=3]"}."""
    return {k: v for k, v in _FIELD.findall(text)}


def _inner(value: str) -> dict[str, str]:
    """``[x=2 y=0X7F]`` -> {"x": "2"}: a bracketed field's own fields, less pointers."""
    return {k: v for k, v in _fields(value.strip("[]")).items() if not _POINTER.search(v)}


def _layout(desc: dict[str, str]) -> str:
    """An operand's type with what else its descriptor fixes beside sizes: ``R_16F``, or
    ``R_8F_E4M3[order=ORDER_ROW]``."""
    rest = " ".join(f"{k}={v}" for k, v in desc.items() if k != "type" and k not in _DESC_SIZES)
    return desc.get("type", "?") + (f"[{rest}]" if rest else "")


def lt_read(text: str) -> tuple[list[dict], list[str]]:
    """(every cuBLASLt matmul Trace line of ``text`` as a call, in order; the cuBLASLt lines
    that could not be read, verbatim). A call has ``function`` (the typed names read as
    cublasLtMatmul), ``types`` (A, B, C, D: type and layout), ``compute`` (computeDesc less
    pointers), ``algo`` (its fields as logged: algoId, tile, stages, numSplitsK,
    reductionScheme, ...), ``workspace`` (bytes; None where not logged) and ``sizes`` (each
    operand's rows, cols, ld, kept for the reader only). Lines of other levels (Api, Info,
    Hints, Error) and of other functions are read and are no call; lines without
    ``[cublasLt]`` are cuBLAS's, not read here."""
    out, unread = [], []
    for line in text.splitlines():
        if "[cublasLt]" not in line:
            continue
        m = _LT_LINE.search(line)
        if not m:
            unread.append(line)
            continue
        level, function, rest = m.groups()
        if level != "Trace" or not _LT_MATMUL.match(function):
            continue
        f = _fields(rest)
        if not f.get("algo", "").endswith("]"):  # a line cut short is no call
            unread.append(line)
            continue
        descs = {op: _fields(f.get(f"{op}desc", "[]").strip("[]")) for op in "ABCD"}
        ws = f.get("workSpaceSizeInBytes")
        out.append({
            "function": "cublasLtMatmul",
            "types": [_layout(descs[op]) for op in "ABCD"],
            "compute": _inner(f.get("computeDesc", "[]")),
            "algo": _inner(f["algo"]),
            "workspace": int(ws) if ws and ws.isdigit() else None,
            "sizes": {op: {k: int(v) for k, v in d.items() if k in ("rows", "cols", "ld")
                           and v.isdigit()} for op, d in descs.items()},
        })
    return out, unread


def lt_calls(text: str) -> list[dict]:
    """The cuBLASLt matmul calls of ``text`` (``lt_read``'s first part)."""
    return lt_read(text)[0]


def legacy_read(text: str) -> tuple[list[dict], list[str]]:
    """(every cuBLAS call block in ``text`` (its legacy log), in order; the lines that could
    not be read, verbatim). A call has ``function``, ``args`` (name -> value, pointers dropped;
    an enum's value without its "(n)"), ``math_mode`` and ``stream`` ("default" or "other",
    None where not logged). cuBLASLt's lines are not read here."""
    out: list[dict] = []
    unread: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line.strip() or "[cublasLt]" in line:
            continue
        m = _LEGACY_CALL.match(line)
        if m:
            out.append({"function": m.group(1), "args": {}, "math_mode": None, "stream": None})
            continue
        a, t = _LEGACY_ARG.match(line), _LEGACY_TAIL.match(line)
        if out and a:
            name, value = a.group(1), a.group(3).strip()
            if not _POINTER.search(value) and name not in _PLACES:
                out[-1]["args"][name] = re.sub(r"\(-?\d+\)$", "", value)
        elif out and t:
            mode = _MATH_MODE.search(line)
            if mode:
                out[-1]["math_mode"] = mode.group(1).strip()
            if "StreamId=" in line:
                out[-1]["stream"] = "default" if "defaultStream" in line else "other"
        elif not _LEGACY_KNOWN.match(line):
            unread.append(line)
    return out, unread


def legacy_calls(text: str) -> list[dict]:
    """The cuBLAS call blocks of ``text`` (``legacy_read``'s first part)."""
    return legacy_read(text)[0]


def _short(value: str) -> str:
    """``MATMUL_TILE_128x128`` -> ``128x128``; ``CLUSTER_SHAPE_1x1x1`` -> ``1x1x1``."""
    return re.sub(r"^(MATMUL_TILE_|MATMUL_STAGES_|CLUSTER_SHAPE_|MATMUL_INNER_SHAPE_)", "", value)


def lt_line(call: dict) -> str:
    """One cuBLASLt call as a recipe: ``cuBLASLt cublasLtMatmul R_16F,R_16F,R_16F,R_16F
    computeType=COMPUTE_32F .. algoId=6 tile=128x128 stages=32x5 numSplitsK=4``. Fields the
    log leaves out (a default: split-K 1, no reduction scheme) stay out; so does the workspace,
    the handle's (``handle_state``)."""
    compute = " ".join(f"{k}={v}" for k, v in call["compute"].items())
    algo = " ".join(f"{k}={_short(v)}" for k, v in call["algo"].items())
    words = ("cuBLASLt", call["function"], ",".join(call["types"]), compute, algo)
    return " ".join(w for w in words if w)


def legacy_line(call: dict) -> str:
    """One cuBLAS call as a recipe: ``cuBLAS cublasGemmEx(transa=CUBLAS_OP_T, .., algo=..)``,
    sizes and places left out, and the math mode (the handle's: ``handle_state``)."""
    args = ", ".join(f"{k}={v}" for k, v in call["args"].items() if k not in _SIZES)
    return f"cuBLAS {call['function']}({args})"


def is_product(call: dict) -> bool:
    """Whether a cuBLAS call computes a product (a GEMM or GEMV), not sets up the handle."""
    return bool(_LEGACY_PRODUCT.search(call["function"]))


def read_logs(lt_text: str, legacy_text: str) -> tuple[list[str], dict]:
    """(the recipe lines of one call's logs: cuBLAS's GEMM and GEMV calls first (they may
    hand the product to cuBLASLt), then cuBLASLt's matmuls, each in its log's order; the
    handle's state: ``handle_state``'s dict)."""
    lt, lt_unread = lt_read(lt_text)
    legacy, legacy_unread = legacy_read(legacy_text)
    products = [c for c in legacy if is_product(c)]
    workspace = [c["args"].get("workspaceSizeInBytes") for c in legacy
                 if c["function"].startswith("cublasSetWorkspace")]
    unread = list(dict.fromkeys(lt_unread + legacy_unread))
    state = {
        "workspace_bytes": sorted({int(w) for w in workspace if w and w.isdigit()}),
        "lt_workspace_bytes": sorted({c["workspace"] for c in lt if c["workspace"] is not None}),
        "math_modes": sorted({c["math_mode"] for c in products if c["math_mode"]}),
        "streams": sorted({c["stream"] for c in products if c["stream"]}),
        "unread_lines": len(lt_unread) + len(legacy_unread),
        "unread": unread[:UNREAD_KEPT],
    }
    return [legacy_line(c) for c in products] + [lt_line(c) for c in lt], state


def recipe_lines(lt_text: str, legacy_text: str) -> list[str]:
    """The recipes of one call's logs (``read_logs``'s first part)."""
    return read_logs(lt_text, legacy_text)[0]


def handle_state(lt_text: str, legacy_text: str) -> dict:
    """The handle's state that one call's logs give, outside its recipe: ``workspace_bytes``
    (cublasSetWorkspace's sizes),
    ``lt_workspace_bytes`` (cuBLASLt's, per matmul), ``math_modes`` and ``streams``
    ("default", "other") the products ran under, ``unread_lines`` (how many lines could not
    be read) and ``unread`` (the first UNREAD_KEPT of them, verbatim)."""
    return read_logs(lt_text, legacy_text)[1]


def merge_states(states: list[dict]) -> dict | None:
    """The handle's state over several calls: each list's union, the unread lines summed;
    None for no state."""
    if not states:
        return None
    out: dict = {}
    for s in states:
        for k, v in s.items():
            if isinstance(v, list):
                out[k] = out.get(k, []) + [x for x in v if x not in out.get(k, [])]
            else:
                out[k] = out.get(k, 0) + v
    return {k: (v[:UNREAD_KEPT] if k == "unread" else sorted(v)) if isinstance(v, list) else v
            for k, v in out.items()}
