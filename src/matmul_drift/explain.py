"""`matmul-drift explain`: one shape measured, judged and rendered.

``report`` turns a Measurement into the JSON object other tools script against;
``verdict`` judges it; ``render`` prints tables. Measuring stays in measure.py.
"""

from __future__ import annotations

from tabulate import tabulate

from .measure import Measurement

DRIFT_KEYS = ("max_ulp", "frac_differ", "max_u")


def _pick(rows: list[dict], want: int | None, key: str) -> dict | None:
    """The row for ``want`` (worst over forms), else the worst row overall."""
    if want is not None:
        rows = [r for r in rows if r[key] == want]
    if not rows:
        return None
    worst = max(rows, key=lambda r: (r["max_ulp"], r["max_u"]))
    return {key: worst[key], **{k: worst[k] for k in DRIFT_KEYS}}


def report(m: Measurement, slice_n: int | None = None, slice_m: int | None = None) -> dict:
    """The JSON object of `explain --json`. Units: error_u, gamma_k_u and max_u in u of the
    output dtype; max_ulp in output ulps; frac_differ a fraction; seconds per product."""
    out = {
        "case": m.case,
        "dtype": m.precision,
        "device": m.device,
        "shape": {"m": m.m, "k": m.k, "n": m.n, "batch": m.batch},
        "error_u": m.error_u,
        "gamma_k_u": m.gamma_k_u,
        "slice_n": _pick(m.slice_n, slice_n, "n"),
        "slice_m": _pick(m.slice_m, slice_m, "m"),
        "run_to_run": dict(m.run_to_run),
        "kernels": {
            "full": m.kernels.get("full", []),
            "slice_n": m.kernels.get("slice_n", []),
            "slice_m": m.kernels.get("slice_m", []),
        },
        "kernel_id": f"{m.kernel_id:012x}",
        "slices": {"n": m.slice_n, "m": m.slice_m},
        "input_checksum": m.input_checksum,
        "seconds": m.seconds,
        "environment": m.environment,
        "env_id": f"{m.env_id:012x}",
    }
    out["verdict"] = verdict(out)
    return out


def verdict(r: dict) -> dict:
    """One of ``bit-identical``, ``rounding`` or ``defect``, with a one-line reason.

    A defect: error_u above γ_K, or two products further apart than 2·γ_K (each may be
    γ_K from the truth). Where K·u ≥ 1 the bound says nothing and only drift is reported.
    """
    gamma = r["gamma_k_u"]
    drifts = [("slice_n", row) for row in r["slices"]["n"]] + [("slice_m", row) for row in r["slices"]["m"]]
    drifts.append(("run_to_run", r["run_to_run"]))
    if gamma is not None and r["error_u"] > gamma:
        return {"kind": "defect", "text": f"DEFECT: error_u {r['error_u']:.4g} u exceeds the γ_K bound {gamma:.4g} u"}
    too_far = [(name, row) for name, row in drifts if gamma is not None and row["max_u"] > 2 * gamma]
    if too_far:
        name, row = too_far[0]
        return {"kind": "defect", "text": f"DEFECT: {name} drift {row['max_u']:.4g} u exceeds 2·γ_K = {2 * gamma:.4g} u"}
    moved = [(name, row) for name, row in drifts if row["max_ulp"] > 0]
    if not moved:
        return {"kind": "bit-identical", "text": "bit-identical: every slice and every repeat gave the full product's bits"}
    name, row = max(moved, key=lambda x: x[1]["max_ulp"])
    where = f"n={row['n']}" if "n" in row else f"m={row['m']}" if "m" in row else f"{row['repeat']} calls"
    kind = r["kernels"].get(name) if name != "run_to_run" else None
    if kind and kind != r["kernels"]["full"]:
        extra = [k for k in kind if k not in r["kernels"]["full"]]
        why = f"a different kernel ran ({'; '.join(extra) or 'another order of the same kernels'})"
    else:
        why = "the same kernels ran, so the library summed in another order for this shape"
    bound = f"within the bound (max drift {row['max_u']:.3g} u, 2·γ_K = {2 * gamma:.4g} u)" if gamma else (
        f"K·u ≥ 1, so γ_K gives no bound; max drift {row['max_u']:.3g} u")
    ulp = row.get("ulp_at_max")
    size = f"; {row['max_abs']:.4g} = {row['max_abs'] / ulp:.3g} ulp of {r['dtype']} at that magnitude" if ulp else ""
    return {
        "kind": "rounding",
        "text": f"rounding-level drift: {name} {where} differs by up to {row['max_ulp']} ulp{size}; {why}; {bound}",
    }


def _fmt(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def render(r: dict) -> str:
    """Tables and the verdict as plain text."""
    s = r["shape"]
    shape = f"{s['batch']}×" if s["batch"] else ""
    shape += f"{s['m']}×{s['k']} @ {s['k']}×{s['n']}"
    head = [
        ["case", r["case"]], ["shape", shape], ["dtype", r["dtype"]], ["device", r["device"]],
        ["error_u (u)", _fmt(r["error_u"])], ["γ_K bound (u)", _fmt(r["gamma_k_u"]) if r["gamma_k_u"] else "none (K·u ≥ 1)"],
        ["run-to-run max ulp", f"{r['run_to_run']['max_ulp']} over {r['run_to_run']['repeat']} calls"],
        ["seconds per product", _fmt(r["seconds"])], ["input checksum", r["input_checksum"][:16]],
        ["kernel-id", r["kernel_id"]], ["env-id", r["env_id"]],
    ]
    rows = []
    for row in r["slices"]["n"]:
        rows.append(["slice_n", row["n"], row.get("form", ""), row.get("cols", row["n"]), *_drift_cells(row)])
    for row in r["slices"]["m"]:
        rows.append(["slice_m", row["m"], "", "", *_drift_cells(row)])
    parts = [tabulate(head, tablefmt="simple")]
    if rows:
        parts.append(tabulate(rows, headers=["drift", "n/m", "A form", "cols", "max ulp", "frac differ", "max_u", "max |diff|", "ulp there"]))
    kern = [[name, "\n".join(names)] for name, names in r["kernels"].items() if names]
    parts.append(tabulate(kern, headers=["product", "kernels (normalised)"]))
    parts.append(r["verdict"]["text"])
    return "\n\n".join(parts)


def _drift_cells(row: dict) -> list:
    return [row["max_ulp"], f"{row['frac_differ']:.4%}", _fmt(row["max_u"]), _fmt(row["max_abs"]), _fmt(row["ulp_at_max"])]

