"""The fix finder's candidates: settings (and two code changes) that may remove a drift.

One table, ``CANDIDATES``: adding a candidate is one entry. Each says on which device it
applies, which drift kinds it targets (``slice_n``, ``slice_m``, ``run_to_run``), and how it
is applied in the fresh process that measures it: environment variables (read when a
library loads, so they need a process of their own), Python statements run after torch is
imported, or a change to the computation itself (``code``: padding, slicing the output),
shown to the user as that one line of code. Padding candidates are made per dimension and
multiple by ``candidates``. This module only describes; measuring lives elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

from matmul_drift.store import machine

DRIFTS = ("slice_n", "slice_m", "run_to_run")
PAD_MULTIPLES = (4, 8, 16, 32)

# oneDNN's ISA caps, highest first (ONEDNN_MAX_CPU_ISA); "a step down" is the next one.
ONEDNN_ISAS = ("AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX512_CORE_AMX",
               "AVX512_CORE_FP16", "AVX512_CORE_BF16", "AVX512_CORE_VNNI", "AVX512_CORE",
               "AVX2_VNNI_2", "AVX2_VNNI", "AVX2", "AVX", "SSE41")


@dataclass(frozen=True)
class Candidate:
    """One way to try to remove a drift.

    ``env``: environment variables of its fresh process; ``setup``: Python statements run
    there after ``import torch``; ``code``: the one-line change to the computation, for the
    candidates that change it (None for settings); ``needs``: a module that must be
    importable; ``targets``: the drift kinds it can remove; ``precisions``: the only
    precisions (cases.PRECISIONS) it can change, or None for every one."""

    name: str
    device: str  # "cpu", "cuda" or "any"
    targets: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    setup: str = ""
    code: str | None = None
    needs: str | None = None
    # fixrun.py's name for the code change: contiguous, full, pad:<dim>:<k>
    compute: str | None = None
    precisions: tuple[str, ...] | None = None

    @property
    def changes_code(self) -> bool:
        return self.code is not None


CANDIDATES: tuple[Candidate, ...] = (
    # CPU: threads and MKL's conditional numerical reproducibility (read when MKL loads)
    Candidate("one thread", "cpu", DRIFTS, env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
              setup="torch.set_num_threads(1)"),
    Candidate("MKL_CBWR=COMPATIBLE", "cpu", DRIFTS, env={"MKL_CBWR": "COMPATIBLE"}),
    Candidate("MKL_CBWR=AVX2", "cpu", DRIFTS, env={"MKL_CBWR": "AVX2"}),
    Candidate("MKL_CBWR=AUTO", "cpu", DRIFTS, env={"MKL_CBWR": "AUTO"}),
    # oneDNN a step down: filled in by candidates() from the machine's ISA
    Candidate("ONEDNN_MAX_CPU_ISA a step down", "cpu", DRIFTS, env={"ONEDNN_MAX_CPU_ISA": ""}),
    # CUDA: cuBLAS and torch settings
    # An environment variable, not allow_tf32 = False: the measurement sets the precision's own
    # flags after the candidate's setup (fixrun), and NVIDIA's libraries obey this over any flag.
    # Only the TF32 precisions use TF32: torch leaves it off for plain float32 by default.
    Candidate("TF32 off", "cuda", DRIFTS, env={"NVIDIA_TF32_OVERRIDE": "0"},
              precisions=("float32-tf32", "float32-high")),
    # torch 2.10 and newer take (allow_reduced_precision, allow_splitk): with split-K off,
    # cuBLASLt adds each output's K products in one kernel, as a different N may not
    # (the seed's suspect). An older torch refuses the tuple, and the row says "failed".
    Candidate("split-K off, cuBLASLt", "cuda", DRIFTS,
              setup="m = torch.backends.cuda.matmul\n"
                    "assert hasattr(m, 'allow_fp16_reduced_precision_reduction_split_k'), "
                    "'this torch has no split-K setting (torch 2.10 and newer)'\n"
                    "m.allow_fp16_reduced_precision_reduction = (False, False)\n"
                    "m.allow_bf16_reduced_precision_reduction = (False, False)\n"
                    "torch.backends.cuda.preferred_blas_library('cublaslt')"),
    Candidate("reduced-precision reduction off, cuBLASLt", "cuda", DRIFTS,
              setup="torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False\n"
                    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False\n"
                    "torch.backends.cuda.preferred_blas_library('cublaslt')"),
    Candidate("cuBLAS workspace :16:8, cuBLASLt workspace 1", "cuda", DRIFTS,
              env={"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}),
    Candidate("deterministic algorithms", "cuda", DRIFTS, env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"},
              setup="torch.use_deterministic_algorithms(True)"),
    Candidate("batch_invariant_ops kernels", "cuda", ("slice_n", "slice_m"),
              # not set_batch_invariant_mode(): a context manager, which a bare
              # call leaves unentered
              setup="import batch_invariant_ops\nbatch_invariant_ops.enable_batch_invariant_mode()",
              needs="batch_invariant_ops"),
    # Code changes, on any device
    Candidate("contiguous copy of the slice", "any", ("slice_n",), code="A @ B[:, :n].contiguous()",
              compute="contiguous"),
    Candidate("full product, then slice", "any", ("slice_n", "slice_m"),
              code="(A @ B)[:, :n]  or  (A @ B)[:m]",
              compute="full"),
)


# oneDNN's other names for three of them (ONEDNN_MAX_CPU_ISA takes either)
ONEDNN_ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                  "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16"}


def onednn_isa(flags: set[str] | list[str], cap: str | None = None) -> str:
    """The highest oneDNN ISA name for a CPU with these /proc/cpuinfo flags (store/machine.py's),
    or ``cap`` (this process's oneDNN cap, onednn_isa_in_force) where that is lower: the step
    down is taken from what oneDNN runs now, not from above it."""
    f = set(flags)
    top = "SSE41"
    for need, isa in (({"amx_tile", "amx_fp16", "avx512_fp16"}, "AVX512_CORE_AMX_FP16"),
                      ({"amx_tile", "amx_bf16"}, "AVX512_CORE_AMX"),
                      ({"avx512_fp16"}, "AVX512_CORE_FP16"),
                      ({"avx512_bf16"}, "AVX512_CORE_BF16"), ({"avx512_vnni"}, "AVX512_CORE_VNNI"),
                      ({"avx512f", "avx512bw", "avx512vl"}, "AVX512_CORE"), ({"avx2"}, "AVX2"),
                      ({"avx"}, "AVX")):
        if need <= f:
            top = isa
            break
    cap = (cap or "").strip().upper()
    cap = ONEDNN_ALIASES.get(cap, cap)
    return cap if cap in ONEDNN_ISAS and ONEDNN_ISAS.index(cap) > ONEDNN_ISAS.index(top) else top


def onednn_isa_in_force() -> str:
    """onednn_isa of this machine under this process's cap: where a step down starts. oneDNN reads
    ONEDNN_MAX_CPU_ISA and, where that is unset or empty, its older name DNNL_MAX_CPU_ISA."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return onednn_isa(machine.fingerprint()["isa"], cap)


def isa_step_down(current: str | None) -> str | None:
    """The oneDNN ISA cap one below ``current`` (a name of ONEDNN_ISAS), None at the bottom."""
    if current not in ONEDNN_ISAS:
        return None
    i = ONEDNN_ISAS.index(current)
    return ONEDNN_ISAS[i + 1] if i + 1 < len(ONEDNN_ISAS) else None


def padding(dim: str, multiple: int) -> Candidate:
    """Pad ``dim`` (m, n or k) up to a multiple, compute, and slice the output back."""
    target = {"m": ("slice_m",), "n": ("slice_n",), "k": ()}[dim]  # no drift is measured along k
    line = {"m": f"pad(A, rows to a multiple of {multiple}) @ B, then [:m]",
            "n": f"A @ pad(B, columns to a multiple of {multiple}), then [:, :n]",
            "k": f"pad(A, columns) @ pad(B, rows) to K a multiple of {multiple} (zeros)"}[dim]
    return Candidate(f"pad {dim} to a multiple of {multiple}", "any", target, code=line,
                     compute=f"pad:{dim}:{multiple}")


def candidates(device: str, drifts: set[str], along: str, onednn_isa: str | None = None,
               precision: str | None = None) -> list[tuple[Candidate, str | None]]:
    """Every candidate for a case on ``device`` in ``precision`` (None: any) whose drifts are
    ``drifts`` (a set of DRIFTS) along dimension ``along`` (m, n or k), each with None when it
    applies, or the one-line reason it does not. ``onednn_isa``: the highest oneDNN ISA of this
    CPU (for the step down)."""
    table = list(CANDIDATES) + [padding(along, k) for k in PAD_MULTIPLES]
    out = []
    for c in table:
        if c.env.get("ONEDNN_MAX_CPU_ISA") == "":
            down = isa_step_down(onednn_isa)
            c = Candidate(f"ONEDNN_MAX_CPU_ISA={down}", c.device, c.targets,
                          env={"ONEDNN_MAX_CPU_ISA": down or ""})
            if down is None:
                out.append((c, f"no ISA below {onednn_isa or 'this CPU'}'s is known"))
                continue
        out.append((c, why_not(c, device, drifts, precision)))
    return out


def why_not(c: Candidate, device: str, drifts: set[str],
            precision: str | None = None) -> str | None:
    """None when ``c`` applies to a case on ``device`` in ``precision`` with ``drifts``; else the
    reason."""
    if c.device not in ("any", device):
        return f"a {c.device.upper()} setting; this case runs on {device}"
    if c.precisions and precision is not None and precision not in c.precisions:
        return f"changes {' and '.join(c.precisions)} only; this case is {precision}"
    if not set(c.targets) & drifts:
        return (f"targets {', '.join(c.targets)}; "
                f"this case drifts in {', '.join(sorted(drifts)) or 'nothing'}")
    if c.needs and importlib.util.find_spec(c.needs) is None:
        return f"{c.needs} is not installed"
    return None


def prelude(c: Candidate) -> str:
    """The Python the candidate's fresh process runs before measuring."""
    return "import torch\n" + (c.setup + "\n" if c.setup else "")
