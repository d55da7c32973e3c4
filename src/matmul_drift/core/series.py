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
    "env_id": "env-id",
    "input_id": "input-id",
    "cuda_seconds": "seconds",
    "fix_cost": "ratio",
    "fix_id": "fix-id",
    "order_id": "order-id",
}
