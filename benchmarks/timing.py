"""Wall time of torch.matmul on the CPU, by asv's own timer.

torch is imported here, at module level, so that under asv's forkserver it is imported
once per environment, before any fork. Importing torch does not initialise CUDA.
"""

import torch  # noqa: F401

from matmul_drift.core import cases
from matmul_drift.jobs import suite


class Time:
    params = (list(cases.CASE_IDS), list(cases.PRECISIONS), list(cases.DEVICES))
    param_names = ["case", "dtype", "device"]
    number = 1
    repeat = (3, 10, 2.0)  # at least 3 samples, at most 10 or 2 s of them
    rounds = 1  # asv's default 2 doubles the suite's time for a second spread estimate
    # No warm-up call: the median of 3 or more samples already ignores a cold first call, and
    # where fp16 has no native kernel one call of a large case costs seconds.
    warmup_time = 0
    timeout = 300

    def setup(self, case, dtype, device):
        self.call = suite.timed_call(case, dtype, device)

    def time_matmul(self, case, dtype, device):
        self.call()
