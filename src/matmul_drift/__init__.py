"""matmul-drift: speed, accuracy and kernel drift of torch.matmul, tracked with asv.

The package is in layers (README, "Layout"). A module imported by the flat path it had
before the layers (``matmul_drift.order``) fails with an ImportError that names its new path.
"""

import sys

__version__ = "0.1.0"

# old flat module -> where it lives now (no aliases: each is one ImportError that says where)
MOVED = {
    "asv_commit": "jobs.asv_commit", "asvrun": "jobs.asvrun", "atomic": "store.atomic",
    "axis": "jobs.axis", "blocks": "core.blocks", "bounded": "store.bounded", "cases": "core.cases",
    "catalog": "store.catalog", "cli_args": "cli.args", "cli_nightly": "cli.nightly",
    "cli_order": "cli.order", "cli_run": "cli.run",
    "cli_scan": "cli.scan", "cli_summary": "cli.summary", "environment": "measure.environment",
    "explain": "probes.explain", "fixes": "probes.fixes", "fixfind": "probes.fixfind",
    "fixrun": "probes.fixrun", "gitorder": "read.commits", "gpucheck": "jobs.gpucheck",
    "history": "read.history", "inputs": "measure.inputs", "interrupt": "probes.interrupt",
    "kernels": "measure.kernels", "lock": "store.lock", "machine": "store.machine",
    "mainjob": "jobs.mainjob", "memory": "measure.memory", "nightly": "jobs.nightly",
    "numerics": "core.numerics",
    "order": "core.trees (the tree format), core.words (in words), probes.order (the probe)",
    "order_probe": "probes.order", "reference": "measure.reference", "render": "read.render",
    "resultsbranch": "jobs.resultsbranch", "scan": "probes.scan", "scan_plot": "probes.scan_plot",
    "scan_run": "probes.scan_run", "scratch": "store.scratch", "site": "jobs.site",
    "suite": "jobs.suite", "summary": "read.summary",
}


class _Moved:
    """A meta path finder that answers an old flat path with an ImportError naming the new one.
    (matmul_drift.measure, once a module, is now the package that holds measure/measure.py.)"""

    @staticmethod
    def find_spec(name, path=None, target=None):
        head, _, rest = name.partition(".")
        if head == __name__ and rest in MOVED:
            new = ", ".join(f"{__name__}.{p}" for p in MOVED[rest].split(", "))
            # no name=: `from matmul_drift import x` keeps the message
            raise ModuleNotFoundError(f"{name} moved to {new}")
        return None


sys.meta_path.insert(0, _Moved())
