"""Map records drawn as one PNG with matplotlib: M along x, one row per record (a dtype), each
row's upper half row 0 against A[:1] @ B and its lower half the rows against the full product,
coloured invariant, drifting or not measured, with a vertical line wherever the kernel-id
changes. Reads the records only, or the catalog entries the suite keeps of them (``from_entry``:
the site draws those)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display: files only; before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from matmul_drift.core import mapruns
from matmul_drift.probes import batchmap
from matmul_drift.probes.records import write_file

COLOURS = {True: "#1b9e77", False: "#d95f02", None: "0.85"}  # invariant, drifting, not measured


def cells(rec: dict) -> dict[int, tuple[str, bool, bool]]:
    """{M: (kernel-id, row 0 invariant?, rows invariant?)} for every M the record states:
    all of its range once complete (the M its search did not measure take their class's
    state), only the measured M before."""
    if rec["complete"]:
        return mapruns.per_m(rec["verdicts"])
    return {p["size"]: batchmap.state(p) for p in rec["points"]}


def from_entry(entry: dict) -> dict:
    """A catalog "maps" entry (batchmap.entry) as the complete record ``png`` draws: its params,
    verdicts and measured M (the points' other values are not kept there, nor needed here)."""
    return {"params": entry["params"], "complete": True, "verdicts": entry["verdicts"],
            "points": [{"size": m} for m in entry["measured"]], "measured": len(entry["measured"]),
            "range_size": entry["range_size"]}


def plot(records: list[dict], path: str) -> None:
    """Write ``records`` (map records of one shape and device, one per dtype) as a PNG to
    ``path``."""
    # never over a file made meanwhile
    write_file(path, png(records), True, "the plot is in {kept}")


def png(records: list[dict]) -> bytes:
    """``records`` (map records of one shape and device, one per dtype) drawn as PNG bytes."""
    lo = min(r["params"]["lo"] for r in records)
    hi = max(r["params"]["hi"] for r in records)
    fig, ax = plt.subplots(figsize=(10, 2.2 + 0.8 * len(records)), dpi=100)
    for row, rec in enumerate(records):
        states = cells(rec)
        y = len(records) - 1 - row  # the first record on top
        for half, which in ((0.5, 1), (0.0, 2)):  # row 0 above, the rows below
            runs: list[list] = []  # [first M, count, invariant?] over lo..hi, None where not stated
            for m in range(lo, hi + 1):
                verdict = states[m][which] if m in states else None
                if runs and runs[-1][2] is verdict and runs[-1][0] + runs[-1][1] == m:
                    runs[-1][1] += 1
                else:
                    runs.append([m, 1, verdict])
            for first, count, verdict in runs:
                ax.broken_barh([(first - 0.5, count)], (y + half + 0.03, 0.44),
                               facecolors=COLOURS[verdict], lw=0)
        for m in range(lo + 1, hi + 1):  # the kernels change between m - 1 and m
            if m in states and m - 1 in states and states[m][0] != states[m - 1][0]:
                ax.plot([m - 0.5, m - 0.5], [y, y + 1], color="k", lw=0.9)
        measured = [p["size"] for p in rec["points"]]
        ax.plot(measured, [y + 0.5] * len(measured), "|", color="k", ms=4, mew=0.6)
    p = records[0]["params"]
    ax.set_yticks([len(records) - 1 - i + 0.5 for i in range(len(records))])
    ax.set_yticklabels([f"{r['params']['dtype']}\n{r['measured']} of {r['range_size']} M\nmeasured"
                        for r in records],
                       fontsize=8)
    ax.set_ylim(0, len(records))
    ax.set_xlim(lo - 0.5, hi + 0.5)
    shape = (f"--case {p['case']}, " if p["case"] else "") + f"k={p['k']}, n={p['n']}"
    ax.set_xlabel(f"M (batch size); full product M = {p['m_full']} "
                  f"({batchmap.FULL_WORDS[p['full']]})")
    ax.set_title(f"batch-invariance map, {shape} on {p['device']}\n"
                 "upper half of a row: row 0 against A[:1] @ B; "
                 "lower half: the rows against the full product", fontsize=9)
    handles = [Patch(color=COLOURS[True], label="invariant (bit-identical)"),
               Patch(color=COLOURS[False], label="drifting"),
               Patch(color=COLOURS[None], label="not measured"),
               plt.Line2D([], [], color="k", marker="|", ls="",
                          label="measured M; the others take their alignment "
                          "class's state, exact within the class (scan's search)"),
               plt.Line2D([], [], color="k", lw=0.9, label="kernel-id changes")]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    height = fig.get_figheight()  # inches: the legend and labels keep theirs whatever the rows
    fig.subplots_adjust(bottom=1.25 / height, top=1 - 0.5 / height, left=0.12, right=0.98)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()
