"""The published site's own parts, added to what ``asv publish`` wrote. Never imports torch.

- ``drift.html``: what changed in the latest run (a night of the nightly job, or a run of
  the main job) on each machine, the values that failed, and the kernel names behind every
  kernel-id in the results, so a reader sees names where asv's graphs show a number (asv
  prints an id as ``1.39e+14 kernel-id``; the page lists that spelling beside the 12-hex id),
  and the summation order, in words, behind every order-id; the batch-invariance map of each
  batched case in each machine's latest run, per torch build, drawn from its catalog entries
  (probes/map_plot.py) into ``maps/``, with its words;
- a link to it in the navigation bar of asv's ``index.html``, the graphs' legend beside the plot
  rather than over it, and each id-valued benchmark named as an id in asv's ``index.json``;
- local copies of the scripts and styles that asv's ``index.html`` loads from CDNs
  (``site_vendor/README.txt`` says where each comes from), so the site also works
  without network access.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Callable, TypeVar

from matmul_drift.core import ids, mapruns
from matmul_drift.core.series import method_key as series_key
from matmul_drift.read import flags, history, render, rules, summary
from matmul_drift.read.incidents import ordered
from matmul_drift.store import atomic, scratch
from matmul_drift.store.lock import TreeLock

T = TypeVar("T")

PAGE = "drift.html"
VENDOR = Path(__file__).parents[1] / "site_vendor"
# CDN address in asv 0.6.6's index.html -> (local file, byte-identical to the CDN's file).
# Identical files keep asv's integrity hash, so the browser itself checks that they are.
CDN = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery-3.3.1.min.js", True),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js":
        ("jquery.flot.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js":
        ("jquery.flot.time.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js":
        ("jquery.flot.selection.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js":
        ("jquery.flot.categories.js", False),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js":
        ("jquery.flot.orderBars.js", True),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js":
        ("stupidtable.min.js", False),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": ("md5.min.js", True),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js":
        ("bootstrap.min.js", True),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css":
        ("css/bootstrap.min.css", True),
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

        index_html = re.sub(r"<(?:script|link)\b[^>]*?\"" + re.escape(url) + r"\"[^>]*>", swap,
                            index_html)
    return index_html, _EXTERNAL.findall(index_html)


# The graph's legend in a column of its own beside the plot, not over it: asv's index.html gives
# the plot the whole width, and its graphdisplay.js draws flot's legend in the plot's corner.
_GRAPH_BOX = '<div style="position: absolute; top: 48px; left: 0; right: 0; bottom: 100px;">'
_LEGEND_BOX = ('<div style="position: absolute; top: 48px; left: 0; right: 14em; bottom: 100px;">')
LEGEND_ID = "matmul-drift-legend"
_LEGEND_DIV = (f'<div id="{LEGEND_ID}" style="position: absolute; top: 48px; right: 0; '
               'width: 13.5em; bottom: 100px; overflow: auto; font-size: 85%"></div>')
_FLOT_LEGEND = 'legend: {\n                show: show_legend,\n                position: "nw",'


def place_legend(index_html: str, graph_js: str) -> tuple[str, str]:
    """(index.html, graphdisplay.js) with the graph's legend drawn beside the plot; both as
    given where asv's own text is not what this expects (another asv version)."""
    if _GRAPH_BOX not in index_html or _FLOT_LEGEND not in graph_js:
        return index_html, graph_js
    index_html = index_html.replace(_GRAPH_BOX, _LEGEND_DIV + _LEGEND_BOX, 1)
    graph_js = graph_js.replace(_FLOT_LEGEND, _FLOT_LEGEND + f' container: $("#{LEGEND_ID}"),', 1)
    return index_html, graph_js


def explain_ids(index: dict) -> dict:
    """asv's index.json with each id-valued benchmark named for what it is (asv shows the name
    above its graph): a number that names a catalog entry, whose steps are changes."""
    for name, b in index.get("benchmarks", {}).items():
        if isinstance(b, dict) and b.get("unit") in flags.ID_UNITS:
            b["pretty_name"] = (f"{name.split('.', 1)[-1]}: an id, not a quantity; "
                                f"a step is a change ({PAGE} names each)")
    return index


def add_link(index_html: str) -> str:
    """index.html with a navigation-bar link to the drift page (once)."""
    if _NAV_LINK in index_html:
        return index_html
    anchor = re.search(r'<li id="nav-li-regressions">.*?</li>', index_html, re.S)
    if anchor:
        return index_html[: anchor.end()] + "\n\t" + _NAV_LINK + index_html[anchor.end():]
    return index_html.replace("</ul>", _NAV_LINK + "</ul>", 1)


# ---------------------------------------------------------------------------- the page


def ids_in_results(hist: history.History, latest: dict[str, str],
                   unit: str = "kernel-id") -> dict[int, list[str]]:
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
    """An incident per block, failing ones first: its cause, where, the verdict and a repro per
    side; its cells' table and its flags folded beneath it."""
    if not result.flags:
        return ["<p>No changes flagged.</p>"]
    fail_on = summary.DEFAULT_FAIL_ON
    out = []
    for k, inc in enumerate(ordered(result.incidents, fail_on), 1):
        status = "failing" if inc.failing(fail_on) else "informational"
        heads, rows = render.cell_table(inc)
        out += [f'<section class="incident" id="incident-{inc.key}">',
                f'<h3 class="{status}">{_e(render.incident_title(k, inc, fail_on))}</h3>',
                f"<p>{_e(render.incident_where(inc))}</p>",
                f'<p class="verdict"><b>Verdict:</b> {_e("; ".join(inc.verdict()))}</p>',
                "<ul>",
                *(f"<li>{_e(render.repro_label(r))}: <code>{_e(r['command'])}</code></li>"
                  for r in inc.repros),
                *(f"<li>{_e(n)}</li>" for n in inc.notes),
                "</ul>",
                f'<details class="flags"><summary>{_e(render.cells_and_flags(inc))}</summary>',
                '<table class="cells"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in heads)
                + "</tr></thead><tbody>",
                *("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows),
                "</tbody></table>",
                '<table class="flags"><thead><tr>'
                + "".join(f"<th>{h}</th>" for h in render.HEADERS) + "</tr></thead><tbody>"]
        out += ["<tr>" + "".join(f"<td>{_e(c)}</td>" if j != 6 else f"<td><code>{_e(c)}</code></td>"
                                 for j, c in enumerate(render.row(f))) + "</tr>" for f in inc.flags]
        out.append("</tbody></table></details></section>")
    return out


def _notes(result: summary.Summary) -> list[str]:
    """The notes, each group folded: what was not compared or not flagged, below the flags."""
    return [f'<details class="notes"><summary>{_e(heading)}</summary><ul>'
            + "".join(f"<li>{_e(n)}</li>" for n in lines) + "</ul></details>"
            for heading, lines in render.notes(result)]


ID_SERIES = (("bits-id", "b", "bits"), ("kernel-id", "k", "kernels"), ("order-id", "o", "orders"),
             ("fix-id", "f", "fixes"), ("map-id", "m", "maps"))
LINKED = ("kernel-id", "order-id")  # the id series whose ids the page names in a table of their own


def changes(hist: history.History) -> list[dict]:
    """Every change of an id series (kernel-id, order-id, fix-id, map-id) along each machine's
    history, per combination and torch build: {"machine", "params", "env", "unit", "steps":
    [(commit, id, method changed before it)]}, in commit order; combinations whose id never moved
    are left out."""
    units = hist.units()
    out = []
    for machine, runs in sorted(hist.runs.items()):
        for env in dict.fromkeys(r.env_name for r in runs):
            chain = [r for r in runs if r.env_name == env]
            for unit, _, _ in ID_SERIES:
                rows: dict[tuple, tuple[tuple, list]] = {}
                for run in chain:
                    for name, s in run.series.items():
                        if units.get(name) != unit:
                            continue
                        key = series_key(name)
                        for combo, v in zip(itertools.product(*s.params), s.values):
                            if not math.isfinite(v):
                                continue
                            steps = rows.setdefault((name, combo), (s.params, []))[1]
                            method = (run.method or {}).get(key)
                            if not steps or steps[-1][1] != int(v):
                                steps.append((run.commit, int(v),
                                              bool(steps) and steps[-1][3] != method, method))
                for (name, combo), (params, steps) in rows.items():
                    if len(steps) > 1:
                        out.append({"machine": machine,
                                    "params": " ".join(
                                        hist.params_dict(name, params, combo).values()),
                                    "env": chain[-1].torch or env, "unit": unit,
                                    "steps": [(c, i, m) for c, i, m, _ in steps]})
    return out


def _changes_table(hist: history.History) -> list[str]:
    found = changes(hist)
    out = ['<h2 id="changes">Output bits, kernel, order, fix and map changes per case</h2>',
           "<p>asv's graphs draw these ids as numbers near 1e14: a step there is a change here. "
           "Each id links to what it names below; a change across a method change (this project "
           "measuring otherwise) is marked and never flagged.</p>"]
    if not found:
        return out + ["<p>No id changed in the recorded history.</p>"]
    out.append('<table class="changes"><thead><tr><th>machine</th><th>case</th><th>torch</th>'
               "<th>series</th><th>changes, oldest first</th></tr></thead><tbody>")
    anchors = {unit: a for unit, a, _ in ID_SERIES}
    for c in found:
        steps = " &rarr; ".join(
            ("<em>method changed</em> " if m else "") + f"<code>{c_[:8]}</code> "
            + (f'<a href="#{anchors[c["unit"]]}-{i:012x}">{i:012x}</a>' if c["unit"] in LINKED
               else f"{i:012x}")
            for c_, i, m in c["steps"])
        out.append(f"<tr><td>{_e(c['machine'])}</td><td>{_e(c['params'])}</td><td>{_e(c['env'])}</td>"
                   f"<td>{_e(c['unit'])}</td><td>{steps}</td></tr>")
    return out + ["</tbody></table>"]


MAPS = "maps"  # the site's folder of map pictures


def map_figures(hist: history.History, latest: dict[str, str]) -> list[dict]:
    """The batch-invariance maps of each machine's latest run (``latest``: machine -> commit), one
    figure per machine, torch build, case and device: ``machine``, ``torch``, ``case``,
    ``device``, ``maps`` ([{"dtype", "id", "entry"}] in the results' dtype order; ``entry`` None
    where the catalog lacks it), ``problem`` (why it cannot be drawn, or None) and ``file``
    (``maps/<12 hex>.png``, named by its dtypes and map-ids: one picture is one file)."""
    units = hist.units()
    out = []
    for machine, runs in sorted(hist.runs.items()):
        for run in runs:
            if run.commit != latest.get(machine):
                continue
            for name, s in sorted(run.series.items()):
                if units.get(name) != "map-id":
                    continue
                groups: dict[tuple, list[dict]] = {}
                for combo, v in zip(itertools.product(*s.params), s.values):
                    if math.isfinite(v):
                        p = hist.params_dict(name, s.params, combo)
                        groups.setdefault((p.get("case", ""), p.get("device", "")), []).append(
                            {"dtype": p.get("dtype", ""), "id": int(v),
                             "entry": hist.catalog.get("maps", v)})
                for (case, device), maps in groups.items():
                    key = ids.object_id([[m["dtype"], m["id"]] for m in maps])
                    out.append({"machine": machine, "torch": run.torch or run.env_name,
                                "case": case, "device": device, "maps": maps,
                                "problem": _map_problem(maps), "file": f"{MAPS}/{key:012x}.png"})
    return out


def _map_problem(maps: list[dict]) -> str | None:
    """Why these catalog entries cannot be drawn (missing, or not in the shape batchmap.entry
    writes: a results tree may hold anything), or None."""
    for m in maps:
        e = m["entry"]
        if not isinstance(e, dict):
            return f"the map {m['id']:012x} is not in the catalog"
        p = e.get("params")
        bad = (not isinstance(p, dict)
               or not all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool)
                          for k in ("lo", "hi", "m_full"))
               or not isinstance(e.get("measured"), list)
               or not all(isinstance(x, int) for x in e["measured"])
               or not isinstance(e.get("range_size"), int) or not isinstance(e.get("words"), str))
        why = "malformed" if bad else mapruns.misfit(e.get("verdicts"))
        if why or p["hi"] - p["lo"] >= mapruns.MAX_M:
            return f"the map {m['id']:012x} cannot be drawn: {why or 'too wide'}"
    return None


def _maps_section(figures: list[dict]) -> list[str]:
    out = ['<h2 id="maps">Batch-invariance maps</h2>',
           ("<p>Which batch sizes M give the same bits, for each batched case of each machine's "
            "latest run and torch build (<code>matmul-drift map</code>): along M, the upper half "
            "of each dtype's row is row 0 of <code>A[:M] @ B</code> against "
            "<code>A[:1] @ B</code>, the lower half its rows against the full product; a vertical "
            "line marks a change of kernel. The suite records each map's id "
            "(<code>track_map_id</code>); the summary flags the M whose state changed.</p>")]
    for f in figures:
        title = f"{f['machine']}: {f['case']} on {f['device']}, torch {f['torch']}"
        out.append(f'<div class="map"><h3>{_e(title)}</h3>')
        if f["problem"]:
            out.append(f"<p><em>not drawn: {_e(f['problem'])}</em></p>")
        else:
            out.append(f'<img class="map" src="{f["file"]}" '
                       f'alt="{_e("batch-invariance map, " + title)}">')
        out.append('<table class="map-words"><thead><tr><th>dtype</th><th>map-id</th>'
                   "<th>which M give the same bits</th></tr></thead><tbody>")
        for m in f["maps"]:
            words = m["entry"].get("words") if isinstance(m["entry"], dict) else None
            out.append(f"<tr><td>{_e(m['dtype'])}</td><td><code>{m['id']:012x}</code></td><td>"
                       + (f"<pre>{html.escape(render.visible(words, newlines=True))}</pre>"
                          if isinstance(words, str) else "<em>not in the catalog</em>")
                       + "</td></tr>")
        out.append("</tbody></table></div>")
    return out


def draw_maps(html_dir: Path, figures: list[dict]) -> None:
    """Each figure's PNG (map_plot.png of its entries) under ``html_dir``; those with a problem
    are left out (the page says why), and one that matplotlib cannot draw gets its problem here:
    a picture must not cost the site."""
    # here, not at the top: importing matplotlib is slow, and run and nightly start without it
    from matmul_drift.probes import map_plot

    for f in figures:
        if f["problem"]:
            continue
        try:
            data = map_plot.png([map_plot.from_entry(m["entry"]) for m in f["maps"]])
        except Exception as exc:  # noqa: BLE001  whatever a results tree holds, the rest of the site is built
            f["problem"] = f"matplotlib could not draw it: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        atomic.write_bytes(Path(html_dir) / f["file"], data)


def _kernel_cell(entry) -> str:
    if not isinstance(entry, dict):
        return "<em>not in the catalog</em>"
    parts = []
    for key, names in entry.items():
        if key == "device":
            continue
        items = names if isinstance(names, list) else [names]
        parts.append(f"<b>{_e(key)}</b><ol>"
                     + "".join(f"<li><code>{_e(n)}</code></li>" for n in items) + "</ol>")
    return "".join(parts)


def _all_nights(recorded: list[dict]) -> list[str]:
    # asv opens drift.html#night-<axis commit> for a point; the first row of each night holds it.
    out = ['<h2 id="all-nights">Every night recorded</h2>',
           '<table class="nights"><thead><tr><th>night</th><th>asv commit</th>'
           "<th>machine, torch, CUDA</th></tr></thead><tbody>"]
    seen = set()
    # str(): a hand-edited night's machine may be null
    for n in sorted(recorded, key=lambda n: (n["date"], str(n["machine"]))):
        anchor = "" if n["point"] in seen else f' id="night-{n["point"]}"'
        seen.add(n["point"])
        out.append(f"<tr{anchor}><td>{_e(n['date'])}</td><td><code>{n['point'][:8]}</code></td>"
                   f"<td>{_e(n['title'])}</td></tr>")
    return out + ["</tbody></table>"]


def page(hist: history.History, result: summary.Summary, runs: list[dict],
         recorded: list[dict] = (), title: str = "the latest night on each machine",
         figures: list[dict] | None = None) -> str:
    """drift.html: ``result`` is what changed in every machine's latest run, ``runs`` one dict
    per machine (``machine``, ``commit``, ``line``: one line about the run, ``failed``: its
    failed values), ``recorded`` every night file (with its axis commit as "point" and
    nightly.night_title as "title"), for the nightly's table of nights; ``figures`` the maps
    (map_figures of the latest runs, drawn by draw_maps; None: found here, as yet undrawn)."""
    latest = {n["machine"]: n["commit"] for n in runs}
    out = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>matmul-drift: {_e(title)}</title>", '<link rel="icon" href="swallow.ico">',
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:110em}"
        "table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;"
        "padding:.25em .5em;vertical-align:top;text-align:left}th{background:#f3f3f3}"
        "code{font-size:90%}ol{margin:.2em 0 .4em 1.2em;padding:0}h3.failing{color:#a00}"
        "details.notes,details.flags{margin:.3em 0}details summary{cursor:pointer}"
        "section.incident{border-left:3px solid #ccc;padding-left:.8em;margin-bottom:1.2em}"
        "img.map{max-width:100%}table.map-words pre{margin:0;white-space:pre-wrap}</style>",
        "</head><body>", '<p><a href="index.html">&larr; the asv benchmarks</a></p>',
        f"<h1>matmul-drift: {_e(title)}</h1>",
        f'<p id="headline">{_e(render.headline(result, summary.DEFAULT_FAIL_ON))}.</p>',
        '<h2 id="flags">Changes flagged</h2>', *_flag_tables(result),
        *(['<h2 id="notes">Not compared, not flagged</h2>', *_notes(result)]
          if render.notes(result) else []),
        '<h2 id="nights">Runs</h2><ul>',
    ]
    out += [f"<li>{_e(n['line'])}</li>" for n in runs]
    out += ["</ul>"]
    failed = [n for n in runs if n["failed"]]
    if failed:
        out.append('<h2 id="failed">Failed benchmark values</h2>')
        for n in failed:
            out.append(f"<h3>{_e(n['machine'])} ({len(n['failed'])})</h3><ul>"
                       + "".join(f"<li><code>{_e(f)}</code></li>" for f in n["failed"]) + "</ul>")
    figures = map_figures(hist, latest) if figures is None else figures
    out += _maps_section(figures) if figures else []
    out += _changes_table(hist)
    out += ['<h2 id="kernels">Kernel names behind every kernel-id</h2>',
            "<p>asv's graphs show a kernel-id as a number; its 12-hex spelling names the catalog "
            "entry <code>results/catalog/kernels/&lt;id&gt;.json</code> "
            "(<code>matmul-drift catalog ID</code> prints it for either spelling).</p>",
            '<table class="kernels"><thead><tr><th>kernel-id</th><th>as asv shows it</th>'
            "<th>device</th><th>kernels (normalised)</th><th>used in the latest run by</th>"
            "</tr></thead><tbody>"]
    for ident, uses in sorted(ids_in_results(hist, latest).items()):
        entry = hist.catalog.get("kernels", ident)
        device = entry.get("device", "") if isinstance(entry, dict) else ""
        out.append(_id_row("k", ident, "kernel-id", [_e(device), _kernel_cell(entry)], uses))
    out.append("</tbody></table>")
    orders = ids_in_results(hist, latest, "order-id")
    if orders:
        out += ['<h2 id="orders">Summation orders behind every order-id</h2>',
                "<p>The order in which entry (0, 0) of each full product adds its K products, "
                "revealed and replayed bit for bit (<code>matmul-drift order</code>); "
                "<code>matmul-drift catalog ID</code> prints the tree itself.</p>",
                '<table class="orders"><thead><tr><th>order-id</th><th>as asv shows it</th>'
                "<th>K</th><th>order</th><th>used in the latest run by</th></tr></thead><tbody>"]
        for ident, uses in sorted(orders.items()):
            entry = hist.catalog.get("orders", ident)
            k, words = ((entry["k"], rules.describe_order(entry)) if isinstance(entry, dict)
                        else ("", "not in the catalog"))
            out.append(_id_row("o", ident, "order-id", [_e(k), _e(words)], uses))
        out.append("</tbody></table>")
    out += [*(_all_nights(list(recorded)) if recorded else []), "</body></html>"]
    return "\n".join(out) + "\n"


def _id_row(anchor: str, ident: int, unit: str, cells: list[str], uses: list[str]) -> str:
    """One row of an id table: the 12-hex id, as asv shows it, ``cells`` (HTML), where it is
    used."""
    return (f'<tr id="{anchor}-{ident:012x}"><td><code>{ident:012x}</code></td>'
            f'<td>{float(ident):.3g} {unit}</td>'
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td>{'<br>'.join(_e(u) for u in uses) or '&mdash;'}</td></tr>")


def replace(html_dir: Path | str, build: Callable[[Path, TreeLock], T],
            log: Callable[[str], None]) -> T:
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
    graph_js = html_dir / "graphdisplay.js"
    if graph_js.is_file():
        text, js = place_legend(text, graph_js.read_text(encoding="utf-8"))
        atomic.write_text(graph_js, js)
    index_json = html_dir / "index.json"
    if index_json.is_file():
        atomic.write_text(index_json, json.dumps(explain_ids(
            json.loads(index_json.read_text(encoding="utf-8")))))
    for f in VENDOR.rglob("*"):
        if f.is_file() and f.name != "README.txt":
            atomic.copy(f, html_dir / "vendor" / f.relative_to(VENDOR))
    figures = map_figures(hist, {n["machine"]: n["commit"] for n in runs})
    draw_maps(html_dir, figures)
    atomic.write_text(html_dir / PAGE, page(hist, result, runs, recorded, title, figures))
    atomic.write_text(index, add_link(text))
    return external
