"""The published site's own parts, added to what ``asv publish`` wrote. Never imports torch.

- ``drift.html``: what changed in the latest run (a night of the nightly job, or a run of
  the main job) on each machine, the values that failed, and the kernel names behind every
  kernel-id in the results, so a reader sees names where asv's graphs show a number (asv
  prints an id as ``1.39e+14 kernel-id``; the page lists that spelling beside the 12-hex id),
  and the summation order, in words, behind every order-id;
- a link to it in the navigation bar of asv's ``index.html``;
- local copies of the scripts and styles that asv's ``index.html`` loads from CDNs
  (``site_vendor/README.txt`` says where each comes from), so the site also works
  without network access.
"""

from __future__ import annotations

import html
import itertools
import math
import os
import re
from pathlib import Path
from typing import Callable, TypeVar

from matmul_drift.read import history, render, summary
from matmul_drift.store import atomic, scratch
from matmul_drift.store.lock import TreeLock

T = TypeVar("T")

PAGE = "drift.html"
VENDOR = Path(__file__).parents[1] / "site_vendor"
# CDN address in asv 0.6.6's index.html -> (local file, byte-identical to the CDN's file).
# Identical files keep asv's integrity hash, so the browser itself checks that they are.
CDN = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery-3.3.1.min.js", True),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": ("jquery.flot.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": ("jquery.flot.time.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": ("jquery.flot.selection.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": ("jquery.flot.categories.js", False),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": ("jquery.flot.orderBars.js", True),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": ("stupidtable.min.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": ("md5.min.js", True),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": ("bootstrap.min.js", True),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": ("css/bootstrap.min.css", True),
}
_EXTERNAL = re.compile(r"<(?:script|link)\b[^>]*?(?:src|href)=\"(https?://[^\"]+)\"[^>]*>")
_NAV_LINK = f'<li id="nav-li-drift"><a href="{PAGE}">Drift summary &amp; kernel names</a></li>'


def localise(index_html: str) -> tuple[str, list[str]]:
    """asv's index.html with CDN scripts and styles pointed at vendor/; also the addresses
    still loaded from the network (none for asv 0.6.6)."""
    for url, (local, identical) in CDN.items():
        def swap(m: re.Match) -> str:
            tag = m.group(0).replace(f'"{url}"', f'"vendor/{local}"')
            return tag if identical else re.sub(r'\s+integrity="[^"]*"', "", tag)

        index_html = re.sub(r"<(?:script|link)\b[^>]*?\"" + re.escape(url) + r"\"[^>]*>", swap, index_html)
    return index_html, _EXTERNAL.findall(index_html)


def add_link(index_html: str) -> str:
    """index.html with a navigation-bar link to the drift page (once)."""
    if _NAV_LINK in index_html:
        return index_html
    anchor = re.search(r'<li id="nav-li-regressions">.*?</li>', index_html, re.S)
    if anchor:
        return index_html[: anchor.end()] + "\n\t" + _NAV_LINK + index_html[anchor.end():]
    return index_html.replace("</ul>", _NAV_LINK + "</ul>", 1)


# ---------------------------------------------------------------------------- the page


def ids_in_results(hist: history.History, latest: dict[str, str], unit: str = "kernel-id") -> dict[int, list[str]]:
    """Every id of ``unit`` (kernel-id, order-id) in the results -> where the latest run of each
    machine used it ("machine: case dtype device"); ``latest`` maps machine -> that run's commit."""
    out: dict[int, list[str]] = {}
    units = hist.units()
    for machine, runs in hist.runs.items():
        for run in runs:
            for name, s in run.series.items():
                if units.get(name) != unit:
                    continue
                for combo, v in zip(itertools.product(*s.params), s.values):
                    if not math.isfinite(v):
                        continue
                    uses = out.setdefault(int(v), [])
                    if run.commit == latest.get(machine):
                        params = " ".join(hist.params_dict(name, s.params, combo).values())
                        uses.append(f"{machine}: {params}")
    return out


def _e(text) -> str:
    return html.escape(render.visible(text, newlines=True)).replace("\n", "<br>")


def _flag_tables(result: summary.Summary) -> list[str]:
    if not result.flags:
        return ["<p>No changes flagged.</p>"]
    out = []
    for machine, kind, flags in render.groups(result):
        status = "failing" if kind in summary.DEFAULT_FAIL_ON else "informational"
        out.append(f"<h3>{_e(machine)}: {_e(kind)} ({len(flags)}, {status})</h3>")
        out.append('<table class="flags"><thead><tr>' + "".join(f"<th>{h}</th>" for h in render.HEADERS)
                   + "</tr></thead><tbody>")
        out += ["<tr>" + "".join(f"<td>{_e(c)}</td>" for c in render.row(f)) + "</tr>" for f in flags]
        out.append("</tbody></table>")
    return out


def _kernel_cell(entry) -> str:
    if not isinstance(entry, dict):
        return "<em>not in the catalog</em>"
    parts = []
    for key, names in entry.items():
        if key == "device":
            continue
        items = names if isinstance(names, list) else [names]
        parts.append(f"<b>{_e(key)}</b><ol>" + "".join(f"<li><code>{_e(n)}</code></li>" for n in items) + "</ol>")
    return "".join(parts)


def _all_nights(recorded: list[dict]) -> list[str]:
    # asv opens drift.html#night-<axis commit> for a point; the first row of each night holds it.
    out = ['<h2 id="all-nights">Every night recorded</h2>',
           '<table class="nights"><thead><tr><th>night</th><th>asv commit</th><th>machine, torch, CUDA</th>'
           "</tr></thead><tbody>"]
    seen = set()
    for n in sorted(recorded, key=lambda n: (n["date"], str(n["machine"]))):  # a hand-edited night's may be null
        anchor = "" if n["point"] in seen else f' id="night-{n["point"]}"'
        seen.add(n["point"])
        out.append(f"<tr{anchor}><td>{_e(n['date'])}</td><td><code>{n['point'][:8]}</code></td>"
                   f"<td>{_e(n['title'])}</td></tr>")
    return out + ["</tbody></table>"]


def page(hist: history.History, result: summary.Summary, runs: list[dict], recorded: list[dict] = (),
         title: str = "the latest night on each machine") -> str:
    """drift.html: ``result`` is what changed in every machine's latest run, ``runs`` one dict
    per machine (``machine``, ``commit``, ``line``: one line about the run, ``failed``: its
    failed values), ``recorded`` every night file (with its axis commit as "point" and
    nightly.night_title as "title"), for the nightly's table of nights."""
    latest = {n["machine"]: n["commit"] for n in runs}
    out = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>matmul-drift: {_e(title)}</title>", '<link rel="icon" href="swallow.ico">',
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:110em}table{border-collapse:collapse;"
        "margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:.25em .5em;vertical-align:top;text-align:left}"
        "th{background:#f3f3f3}code{font-size:90%}ol{margin:.2em 0 .4em 1.2em;padding:0}</style>",
        "</head><body>", '<p><a href="index.html">&larr; the asv benchmarks</a></p>',
        f"<h1>matmul-drift: {_e(title)}</h1>",
        f'<p id="headline">{_e(render.headline(result, summary.DEFAULT_FAIL_ON))}.</p>',
        '<h2 id="nights">Runs</h2><ul>',
    ]
    out += [f"<li>{_e(n['line'])}</li>" for n in runs]
    out += ["</ul>", '<h2 id="flags">Changes flagged</h2>', *_flag_tables(result)]
    if result.different_hardware:
        out.append('<h2 id="hardware">Different hardware, not compared</h2><ul>'
                   + "".join(f"<li>{_e(n)}</li>" for n in result.different_hardware) + "</ul>")
    failed = [n for n in runs if n["failed"]]
    if failed:
        out.append('<h2 id="failed">Failed benchmark values</h2>')
        for n in failed:
            out.append(f"<h3>{_e(n['machine'])} ({len(n['failed'])})</h3><ul>"
                       + "".join(f"<li><code>{_e(f)}</code></li>" for f in n["failed"]) + "</ul>")
    out += ['<h2 id="kernels">Kernel names behind every kernel-id</h2>',
            "<p>asv's graphs show a kernel-id as a number; its 12-hex spelling names the catalog entry "
            "<code>results/catalog/kernels/&lt;id&gt;.json</code> (<code>matmul-drift catalog ID</code> "
            "prints it for either spelling).</p>",
            '<table class="kernels"><thead><tr><th>kernel-id</th><th>as asv shows it</th><th>device</th>'
            "<th>kernels (normalised)</th><th>used in the latest run by</th></tr></thead><tbody>"]
    for ident, uses in sorted(ids_in_results(hist, latest).items()):
        entry = hist.catalog.get("kernels", ident)
        device = entry.get("device", "") if isinstance(entry, dict) else ""
        out.append(_id_row("k", ident, "kernel-id", [_e(device), _kernel_cell(entry)], uses))
    out.append("</tbody></table>")
    orders = ids_in_results(hist, latest, "order-id")
    if orders:
        out += ['<h2 id="orders">Summation orders behind every order-id</h2>',
                "<p>The order in which entry (0, 0) of each full product adds its K products, revealed and "
                "replayed bit for bit (<code>matmul-drift order</code>); <code>matmul-drift catalog ID</code> "
                "prints the tree itself.</p>",
                '<table class="orders"><thead><tr><th>order-id</th><th>as asv shows it</th><th>K</th>'
                "<th>order</th><th>used in the latest run by</th></tr></thead><tbody>"]
        for ident, uses in sorted(orders.items()):
            entry = hist.catalog.get("orders", ident)
            k, words = (entry["k"], summary.describe_order(entry)) if isinstance(entry, dict) else ("", "not in the catalog")
            out.append(_id_row("o", ident, "order-id", [_e(k), _e(words)], uses))
        out.append("</tbody></table>")
    out += [*(_all_nights(list(recorded)) if recorded else []), "</body></html>"]
    return "\n".join(out) + "\n"


def _id_row(anchor: str, ident: int, unit: str, cells: list[str], uses: list[str]) -> str:
    """One row of an id table: the 12-hex id, as asv shows it, ``cells`` (HTML), where it is used."""
    return (f'<tr id="{anchor}-{ident:012x}"><td><code>{ident:012x}</code></td><td>{float(ident):.3g} {unit}</td>'
            + "".join(f"<td>{c}</td>" for c in cells) + f"<td>{'<br>'.join(_e(u) for u in uses) or '&mdash;'}</td></tr>")


def replace(html_dir: Path | str, build: Callable[[Path, TreeLock], T], log: Callable[[str], None]) -> T:
    """Build the site with ``build(folder, lock)`` in a scratch folder beside ``html_dir`` and
    only then put it in html_dir's place (atomic.replace_folder): a build that fails (asv
    publish starts by deleting the folder it is given) or a run killed while building leaves
    the old site whole. ``lock`` is the scratch folder's, for the asv that build runs to hold
    (asvrun.run's ``hold``). What killed builds left beside is removed first, a line logged
    each. Returns what ``build`` returned."""
    html_dir = Path(html_dir)
    for left in scratch.sweep(html_dir.parent, f".{html_dir.name}.new-*"):
        log(f"recovered: removed {left}, the site a killed run was building")
    box = html_dir.with_name(f".{html_dir.name}.new-{os.getpid()}")
    lock = scratch.claim(box)
    try:
        out = build(box / "site", lock)
        atomic.replace_folder(box / "site", html_dir)  # box/site now holds the old site, if any
    finally:
        scratch.done(box, lock)
    return out


def write(html_dir: Path | str, hist: history.History, result: summary.Summary, runs: list[dict],
          recorded: list[dict] = (), title: str = "the latest night on each machine") -> list[str]:
    """Add the drift page (see ``page``), its link and the local assets to the site asv
    published in ``html_dir``. Returns the addresses index.html still loads from the network
    (none for asv 0.6.6). Raises FileNotFoundError without asv's index.html."""
    html_dir = Path(html_dir)
    index = html_dir / "index.html"
    text, external = localise(index.read_text(encoding="utf-8"))
    for f in VENDOR.rglob("*"):
        if f.is_file() and f.name != "README.txt":
            atomic.copy(f, html_dir / "vendor" / f.relative_to(VENDOR))
    atomic.write_text(html_dir / PAGE, page(hist, result, runs, recorded, title))
    atomic.write_text(index, add_link(text))
    return external
