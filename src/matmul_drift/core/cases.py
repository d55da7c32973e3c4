"""The cases: shape, operation, layout and slices, each under a stable id.

A case fixes what is multiplied; the dtype (with its matmul flags) and the device are
chosen beside it, as asv parameters. Shapes are per device: the CPU suite must finish
in minutes on two cores, while a GPU needs larger products to pick its big kernels.
Ids never change meaning: results recorded under an id stay comparable, so a case whose
shape changes takes a new id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from matmul_drift.core.errors import BadValue

DEVICES = ("cpu", "cuda")
# A precision is the storage dtype plus the matmul flags that go with it. The TF32 and
# 'high' variants only mean something on CUDA (sm_80 and newer).
PRECISIONS = ("float64", "float32", "float16", "bfloat16", "float32-tf32", "float32-high")
DTYPES = ("float64", "float32", "float16", "bfloat16")
OPS = ("mm", "mv", "bmm", "linear")
LAYOUTS = ("contiguous", "strided", "copy")


@dataclass(frozen=True)
class Shape:
    """Sizes in elements. ``batch`` is set for bmm only; ``m`` is 1 for a 1-D A."""

    m: int
    k: int
    n: int
    batch: int | None = None


@dataclass(frozen=True)
class Case:
    """One product and the slices compared against it.

    op: ``mm`` (A 2-D), ``mv`` (A 1-D, as the seed's ``s``), ``bmm`` (3-D), ``linear``
    (``F.linear(A, W)``: B is W.t(), the transposed view an nn.Linear weight gives).
    layout: how ``slice_n`` takes B's columns: ``strided`` a view ``B[:, :n]``,
    ``copy`` a contiguous copy of it; ``contiguous`` where no column slice is taken.
    slice_n / slice_m: the column counts n for ``A @ B[:, :n]`` vs ``(A @ B)[:, :n]`` and
    the row counts m for ``A[:m] @ B`` vs ``(A @ B)[:m]``. ``compare_cols`` limits the
    compared columns (the seed compares its first 45000 outputs). ``pairs``: two slice_n
    sizes whose products are also compared with each other (the seed's 45999 and 46000).
    ``forms`` lists the A forms tried for slice_n: ``as-is`` and, for a 1-D A, ``2d`` =
    ``A.unsqueeze(0)``.
    """

    id: str
    op: str
    cpu: Shape
    cuda: Shape
    layout: str = "contiguous"
    slice_n: tuple[int, ...] = ()
    slice_m: tuple[int, ...] = ()
    compare_cols: int | None = None
    pairs: tuple[tuple[int, int], ...] = ()
    forms: tuple[str, ...] = ("as-is",)
    dist: str = "uniform"
    repeat: int = 3
    about: str = field(default="", compare=False)

    def shape(self, device: str) -> Shape:
        return self.cpu if device == "cpu" else self.cuda


CASES: tuple[Case, ...] = (
    Case(
        "seed", "mv", Shape(1, 4096, 51000), Shape(1, 4096, 51000), layout="strided",
        slice_n=(51000, 50000, 46000, 45999), compare_cols=45000, pairs=((45999, 46000),),
        forms=("as-is", "2d"),
        about=("s (4096,) @ v (4096, 51000) uniform [0,1); slices of v compared on the first "
               "45000 outputs"),
    ),
    Case("square", "mm", Shape(512, 512, 512), Shape(8192, 8192, 8192), about="square GEMM"),
    Case(
        "skinny", "mm", Shape(8, 4096, 4096), Shape(8, 8192, 16384), slice_m=(1, 2, 3, 4, 5, 6, 7),
        about="GEMV-like: M = 8, and every M from 1 to 7 as a row slice of it",
    ),
    # "-2" keeps these results apart from "batch-invariance", the id of a larger CPU shape,
    # too slow in fp16 on CPUs without a native fp16 kernel.
    Case(
        "batch-invariance-2", "mm", Shape(256, 2048, 512), Shape(8192, 4096, 4096),
        slice_m=(1, 2, 3, 7, 8, 64), about="A[:m] @ B against (A @ B)[:m]",
    ),
    Case(
        "slice-n-view", "mm", Shape(64, 4096, 1024), Shape(1024, 4096, 16384), layout="strided",
        slice_n=(1, 2, 8, 1000, 1023), about="A @ B[:, :n], B a strided view",
    ),
    Case(
        "slice-n-copy", "mm", Shape(64, 4096, 1024), Shape(1024, 4096, 16384), layout="copy",
        slice_n=(1, 2, 8, 1000, 1023), about="A @ B[:, :n].contiguous()",
    ),
    Case(
        "long-k", "mm", Shape(16, 262144, 16), Shape(256, 1 << 21, 256), dist="signed",
        about="a long-K reduction; signed inputs, so sums cancel and fp16 does not overflow",
    ),
    Case(
        "linear", "linear", Shape(256, 1024, 1024), Shape(8192, 8192, 8192), slice_m=(1, 7),
        about="F.linear(x, W): B = W.t(), as an nn.Linear weight",
    ),
    Case("bmm", "bmm", Shape(64, 256, 64, batch=16), Shape(512, 1024, 512, batch=64), slice_m=(1,),
         about="batched GEMM"),
)

BY_ID = {c.id: c for c in CASES}
CASE_IDS = tuple(BY_ID)


def get(case_id: str) -> Case:
    try:
        return BY_ID[case_id]
    except KeyError:
        raise ValueError(f"unknown case {case_id!r}; known cases: {', '.join(CASE_IDS)}") from None


def storage_dtype(precision: str) -> str:
    """The tensor dtype of a precision: 'float32-tf32' -> 'float32'."""
    return precision.split("-", 1)[0]


def adhoc(m: int, k: int, n: int, slice_n: int | None = None, slice_m: int | None = None) -> Case:
    """A case for one shape given on the command line (A 2-D, B contiguous)."""
    return Case(
        f"adhoc-{m}x{k}x{n}", "mm", Shape(m, k, n), Shape(m, k, n),
        layout="strided" if slice_n else "contiguous",
        slice_n=(slice_n,) if slice_n else (), slice_m=(slice_m,) if slice_m else (),
    )


def check_slices(case: Case, shape: Shape, slice_n: int | None, slice_m: int | None,
                 form: str = "as-is") -> None:
    """BadValue (one line) when slice_n or slice_m asks for more than the case has.
    form "2d" (order's form) makes a 1-D A into one row, which slice_m can take."""
    if slice_n is not None and slice_n > shape.n:
        raise BadValue("slice_n", str(slice_n), f"is larger than N = {shape.n}")
    if slice_m is not None:
        if case.op == "mv" and form != "2d":
            raise BadValue("slice_m", None, "needs a 2-D A; this A is 1-D")
        if slice_m > shape.m:
            raise BadValue("slice_m", str(slice_m), f"is larger than M = {shape.m}")
