"""Accuracy, drift and kernel identity of torch.matmul, one asv series per metric: setup_cache
measures every cell once per environment (jobs/suite.py), each track_ reads one number back.
asv's forkserver imports this module, and so torch, once per environment, before any fork."""

import os
from pathlib import Path

from matmul_drift.core import cases, series
from matmul_drift.jobs import suite

# The catalog sits beside asv's results_dir (results/asv): the package may be installed
# anywhere (an asv virtualenv), so the path is taken from this file, not from the package.
CATALOG = os.environ.get("MATMUL_DRIFT_CATALOG") or str(Path(__file__).resolve().parents[1] / "results" / "catalog")


class Drift:
    params = (list(cases.CASE_IDS), list(cases.PRECISIONS), list(cases.DEVICES))
    param_names = ["case", "dtype", "device"]
    timeout = 1800  # setup_cache measures the whole catalog

    # asv keys the cache by this line (setup_cache_key "drift:23" in benchmarks.json): moving it
    # rewrites that file, and the history's results then name a key no benchmark has
    def setup_cache(self):
        return suite.measure_all(root=CATALOG)

    def setup(self, cache, case, dtype, device):
        self.values = suite.lookup(cache, case, dtype, device)

    def track_error_u(self, cache, case, dtype, device):
        return self.values["error_u"]

    # Measured against the exact (Ozaki double-double) reference since 2026-11-30; before,
    # against a float64 product, which left float64's own error at 0. A new version keeps
    # the summary from judging the two methods as one series.
    track_error_u.version = "exact-reference"

    def track_nonfinite(self, cache, case, dtype, device):
        return self.values["nonfinite"]

    def track_gamma_k_u(self, cache, case, dtype, device):
        return self.values["gamma_k_u"]

    def track_slice_n_ulp(self, cache, case, dtype, device):
        return self.values["slice_n_ulp"]

    def track_slice_m_ulp(self, cache, case, dtype, device):
        return self.values["slice_m_ulp"]

    def track_run_to_run_ulp(self, cache, case, dtype, device):
        return self.values["run_to_run_ulp"]

    def track_kernel_id(self, cache, case, dtype, device):
        return self.values["kernel_id"]

    def track_bits_id(self, cache, case, dtype, device):
        return self.values["bits_id"]

    def track_env_id(self, cache, case, dtype, device):
        return self.values["env_id"]

    def track_input_id(self, cache, case, dtype, device):
        return self.values["input_id"]

    def track_cuda_seconds(self, cache, case, dtype, device):
        return self.values["cuda_seconds"]

    def track_cuda_q20_seconds(self, cache, case, dtype, device):
        return self.values["cuda_q20_seconds"]

    def track_cuda_q80_seconds(self, cache, case, dtype, device):
        return self.values["cuda_q80_seconds"]

    def track_cuda_clock_fell(self, cache, case, dtype, device):
        return self.values["cuda_clock_fell"]

    def track_fix_cost(self, cache, case, dtype, device):
        return suite.added(self.values, "fix_cost")  # NaN also where $MATMUL_DRIFT_FIXES=0

    def track_fix_id(self, cache, case, dtype, device):
        return suite.added(self.values, "fix_id")

    def track_order_id(self, cache, case, dtype, device):
        return suite.added(self.values, "order_id")  # NaN also where $MATMUL_DRIFT_ORDERS=0

    def track_map_id(self, cache, case, dtype, device):
        return suite.added(self.values, "map_id")  # NaN also where $MATMUL_DRIFT_MAPS=0, and for unbatched cases


for _name, _unit in series.UNITS.items():
    getattr(Drift, f"track_{_name}").unit = _unit
