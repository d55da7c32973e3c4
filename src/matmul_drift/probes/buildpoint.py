"""One product measured for one torch build, in a fresh process of that build's environment.

``python -m matmul_drift.probes.buildpoint SPEC`` (SPEC: the JSON of ``jobs/bisect``'s
product: ``case`` or ``m``/``k``/``n``, ``dtype``, ``device``, ``slice_n``, ``slice_m``,
``orders``, ``detail``) prints one JSON line: the output bits' digests and their id on the product's
recorded inputs, the kernel names, the order-id of entry (0, 0) with its words, the error in
u and the library versions from the environment record. A torch that cannot be imported is
``{"failed": "import", "why": ...}`` and exit status 3.
"""

from __future__ import annotations

import json
import math
import sys
import traceback

IMPORT_FAILED = 3


def _case(spec: dict):
    # here: after main has tried torch (a build that cannot import is told apart)
    from matmul_drift.core import cases

    return (
        cases.get(spec["case"])
        if spec.get("case")
        else cases.adhoc(spec["m"], spec["k"], spec["n"])
    )


def _order(case, spec: dict) -> dict:
    """order_of's answer for entry (0, 0) of the full product, as ``order_id`` (12 hex, None
    unless revealed) with ``summary`` in words, or ``reason``."""
    # here: after main has tried torch (a build that cannot import is told apart)
    from matmul_drift.probes import order, order_plan

    if not spec.get("orders", True) or not spec.get("detail", True):
        return {"order_id": None, "reason": "not asked for"}
    try:
        got = order.order_of(order_plan.target(case, spec["dtype"], spec["device"]))
    except order_plan.ProbeError as exc:
        return {"order_id": None, "reason": str(exc)}
    if got["order_id"] is None:
        return {"order_id": None, "reason": got["reason"]}
    return {"order_id": got["order_id"], "summary": got["summary"]}


def point(spec: dict) -> dict:
    """The product of ``spec`` measured here. Units: error_u and gamma_k_u in u of the output
    dtype; ids 12 hex digits; digests sha256 hex. Without ``detail`` (a bisection's step,
    which decides on the digests alone) one call each and no kernels or order: the digests
    are the same, the product costs a third."""
    # here: after main has tried torch (a build that cannot import is told apart)
    from matmul_drift.measure.measure import measure

    case, detail = _case(spec), spec.get("detail", True)
    m = measure(
        case,
        spec["dtype"],
        spec["device"],
        slice_n=spec.get("slice_n"),
        slice_m=spec.get("slice_m"),
        timing=False,
        with_kernels=detail,
        repeat=None if detail else 1,
    )
    env = m.environment
    cuda = env.get("cuda") or {}
    return {
        "torch": env["torch"]["version"],
        "bits_id": f"{m.bits_id:012x}",
        "bits": m.bits,
        "kernels": m.kernels,
        "kernel_id": f"{m.kernel_id:012x}" if detail else None,
        "order": _order(case, spec),
        "error_u": _finite(m.error_u),
        "gamma_k_u": _finite(m.gamma_k_u),
        "libs": {
            "onednn": env["libs"].get("onednn"),
            "mkl": env["libs"].get("mkl"),
            "cuda": cuda.get("runtime") or env["torch"].get("cuda_build"),
            "cublas": cuda.get("cublas"),
        },
        "cpu_capability": env["cpu"].get("capability"),
        "env_vars": env.get("env_vars", {}),
        "env_id": f"{m.env_id:012x}",
        "input_checksum": m.input_checksum,
        "detail": detail,
    }


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    try:
        # a build that cannot be imported is told apart from one that fails to measure
        import torch  # noqa: F401
    except Exception as exc:  # an ImportError, or a broken library's OSError
        print(
            json.dumps(
                {"failed": "import", "why": "".join(traceback.format_exception_only(exc)).strip()}
            )
        )
        return IMPORT_FAILED
    print(json.dumps(point(spec), allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
