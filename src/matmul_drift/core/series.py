"""The series the suite records: each track's name and unit, shared by the asv benchmarks,
the suite that fills them and the reader that judges them."""

from __future__ import annotations

# track name -> unit; the asv benchmarks declare these, the summary reads them back.
UNITS = {
    "error_u": "u",
    "nonfinite": "count",
    "gamma_k_u": "u-bound",
    "slice_n_ulp": "ulp",
    "slice_m_ulp": "ulp",
    "run_to_run_ulp": "ulp",
    "kernel_id": "kernel-id",
    # the id of the sha256 of each output's bits (full product, each slice): any change of bits
    "bits_id": "bits-id",
    "env_id": "env-id",
    "input_id": "input-id",
    "cuda_seconds": "seconds",
    # do_bench's 20% and 80% quantiles of the same calls (seconds), which the summary's timing
    # judgement reads as an interval, and whether the SM clock fell while they ran (1, 0; NaN:
    # no clocks read): a timing from a run whose clocks fell is never compared
    "cuda_q20_seconds": "q20-seconds",
    "cuda_q80_seconds": "q80-seconds",
    "cuda_clock_fell": "clock-fell",
    "fix_cost": "ratio",
    "fix_id": "fix-id",
    "order_id": "order-id",
    "map_id": "map-id",
}

# The measuring method of each series: a version that moves whenever this project changes what
# the series measures (which products are computed, how kernels are named, how an order is
# probed). Results are judged only within one version; across a change the summary says so
# once, in a note. tests/test_method.py holds the code behind each version and fails when that
# code changes until the version moves (or the change is recorded as keeping the method).
METHOD = {
    "error_u": 1, "nonfinite": 2, "gamma_k_u": 1, "slice_n_ulp": 1, "slice_m_ulp": 1,
    "run_to_run_ulp": 1, "kernel_id": 6, "input_id": 1, "cuda_seconds": 3, "fix_cost": 1,
    "fix_id": 1, "order_id": 4, "time_matmul": 1,
    "map_id": 3, "cuda_q20_seconds": 2, "cuda_q80_seconds": 2, "cuda_clock_fell": 2, "bits_id": 1,
}

# (series, the version it starts, the first commit that measured with it, what changed). A result
# that recorded no version (one made before versions were recorded) takes its version from its
# commit: 1 plus the changes of the series at or before that commit in git's history.
METHOD_CHANGES = (
    ("nonfinite", 2, "fb9413632f513ca9b98983dbea219fa972fdce9f",
     "an inexact float64 reference at the overflow threshold no longer counts a correct inf"),
    ("kernel_id", 2, "d9dd2c6a07c6480eb74c63f6ce6f78a6080ca81b",
     "oneDNN kernel names keep the operands' layout"),
    ("kernel_id", 3, "ffc0077995e3881195caa836548e1be44b69aff4",
     "oneDNN kernel names drop attr-fpmath"),
    ("kernel_id", 4, "8f18f719a7dfe745d133d3fc340a6bfbf629895f",
     "a kernel-id names the route of each slice, call by call"),
    ("kernel_id", 5, "e4b7c26390bf85176ef8b47cd829a3e217610edc",
     "a CUDA kernel list takes in cuBLASLt's and cuBLAS's recipe for each call"),
    ("order_id", 2, "58b7dc6ffbc1f9de4e7944395dad7babaeb87381",
     "the probe tries the first tiles before the entry's column; a verified tree must replay"),
    ("order_id", 3, "c2d87faae535035d9fc782b23ae54af555b97ca4",
     "the replay no longer passes any tree on an fp16 or bf16 kernel"),
    ("order_id", 4, "a33612ce21c09ade9ac9b0883f6b672ab924fe69",
     "one tree has one order-id, however its children are written"),
    ("kernel_id", 6, "cebdce9f3d3fa096ccca2a952cf15c4edae468df",
     "a CUDA recipe is the product's own calls; the handle's set-up, workspace and math mode "
     "are the environment's"),
    ("map_id", 2, "cebdce9f3d3fa096ccca2a952cf15c4edae468df",
     "a CUDA map's kernel-ids are method 6's"),
    ("cuda_seconds", 3, "cebdce9f3d3fa096ccca2a952cf15c4edae468df",
     "runs sized on the flushed call, as do_bench sizes them"),
    ("cuda_q20_seconds", 2, "cebdce9f3d3fa096ccca2a952cf15c4edae468df",
     "runs sized on the flushed call, as do_bench sizes them"),
    ("cuda_q80_seconds", 2, "cebdce9f3d3fa096ccca2a952cf15c4edae468df",
     "runs sized on the flushed call, as do_bench sizes them"),
    ("cuda_clock_fell", 2, "cebdce9f3d3fa096ccca2a952cf15c4edae468df",
     "NVML's slowdown counters over the timed window, the GPU found by UUID"),
    ("map_id", 3, "ec050adea99287cfd4b7e347262e3c39ddf30618",
     "the map finds periods that are no power of two and spot-checks the M it infers"),
)


def method_key(benchmark: str) -> str | None:
    """The METHOD key of an asv benchmark name ("drift.Drift.track_kernel_id" -> "kernel_id",
    "timing.Time.time_matmul" -> "time_matmul"), None for a series with no method of its own."""
    name = benchmark.rsplit(".", 1)[-1]
    key = name.removeprefix("track_")
    return key if key in METHOD else None
