"""A scan record drawn as a PNG with matplotlib: the varied size on x, regions coloured by
kernel-id (hatched where the drift is non-zero), error_u on the left axis and the drift
in ulps on a second axis on the right, each boundary marked. Reads the record only."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # no display: files only; before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from matmul_drift.probes import batchmap, records, scan
from matmul_drift.probes.classsearch import CLASS_TOP

_HATCH = "///"


def _label(kernel_id: str, kernels: list[str], width: int = 90) -> str:
    # The route is what tells regions apart; the aten chain is the same in most of them.
    text = f"{kernel_id}: {batchmap.route(kernels)}"
    return text if len(text) <= width else text[: width - 1] + "…"


def plot(result: dict, path: str) -> None:
    """Write ``result`` (a complete scan record) as a PNG to ``path``."""
    p = result["params"]
    points = result["points"]
    sizes = [q["size"] for q in points]
    colours = {}
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=100)
    # One horizontal stripe per alignment class (odd at the bottom, 0 mod 32 at the top):
    # a route that depends on the size modulo 2..32 shows as stripes that differ.
    rows = {label: i for i, label in enumerate(result["classes"])}
    height = 1 / len(rows)
    for r in result["regions"]:
        first = r["kernel_id"] not in colours
        colour = colours.setdefault(r["kernel_id"], f"C{len(colours) % 10}")
        row = rows[r["class"]]
        half = 2 ** min(row + 1, CLASS_TOP) / 2  # half the class's spacing: its stripe has no gaps
        ax.axvspan(max(r["lo"] - half, p["lo"] - 0.5), min(r["hi"] + half, p["hi"] + 0.5),
                   ymin=row * height, ymax=(row + 1) * height, color=colour,
                   alpha=0.22, lw=0, hatch=_HATCH if r["drift"] == "non-zero" else None,
                   label=_label(r["kernel_id"], r["kernels"]) if first else None)
    for label, row in rows.items():
        ax.annotate(label, (0, (row + 0.5) * height), xycoords="axes fraction", xytext=(3, 0),
                    textcoords="offset points", fontsize=6, va="center", color="0.35")
    errors = [q["error_u"] for q in points
              if q["error_u"] is not None and math.isfinite(q["error_u"])]
    if errors:
        ax.plot(sizes, [math.nan if q["error_u"] is None else q["error_u"] for q in points], ".",
                color="0.25", ms=3, label="error_u (u), left axis")
        ax.set_ylabel("error_u (u of the output dtype)")
        top = max(errors + [1e-9]) * 1.15
        ax.set_ylim(-0.04 * top, top)  # a little below 0, so points at 0 stay visible
    else:
        # no entry finite on both sides at any size (every output inf, say): a
        # scale would read as 0
        ax.set_ylabel("error_u: not computed at any size")
        ax.set_yticks([])
    handles, labels = ax.get_legend_handles_labels()
    if p["vary"] != "k":
        ax2 = ax.twinx()
        ulps = [q["max_ulp"] for q in points]
        (line,) = ax2.plot(sizes, ulps, "o", color="C3", ms=3.5,
                           label="drift: max ulp vs the top of the range, right axis")
        ax2.set_ylabel("drift (output ulps)")
        top = max(1, max(ulps)) * 1.15
        ax2.set_ylim(-0.04 * top, top)  # zero level with the left axis's
        handles.append(line)
        labels.append(line.get_label())
    for seg in result["pattern"][1:]:  # where the pattern changes
        ax.axvline(seg["lo"] - 0.5, color="k", ls="--", lw=0.8)
        ax.annotate(f"{seg['lo']}", (seg["lo"] - 0.5, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=8)
    if any(r["drift"] == "non-zero" for r in result["regions"]):
        handles.append(Patch(facecolor="white", edgecolor="0.4", hatch=_HATCH))
        labels.append("hatched: drift non-zero")
    fixed = ", ".join(f"{d}={p[d]}" for d in ("m", "k", "n") if d != p["vary"])
    ax.set_xlabel(f"{p['vary']} ({fixed})")
    ax.set_xlim(p["lo"] - 0.5, p["hi"] + 0.5)
    ax.set_title(f"scan of {p['vary']}, {p['dtype']} on {p['device']}: "
                 f"{scan.boundary_count(result)}, "
                 f"{result['evaluations']} evaluations for {result['dense_equivalent']} sizes",
                 fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=8, frameon=False)
    fig.subplots_adjust(bottom=0.16 + 0.045 * len(handles), top=0.92)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    # never over a file made meanwhile
    records.write_file(path, png.getvalue(), True, "the plot is in {kept}")
