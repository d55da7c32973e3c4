"""The maps on the drift page in a real browser: headless Chromium (browsing.py) on a results
tree of its own, served on localhost. The site of test_nightly.py's world and of the main job
are opened in test_nightly.py and test_mainjob.py, where those are built."""

from __future__ import annotations

import shutil
from pathlib import Path

import asv
import pytest
from browsing import _errors, _serving, _wait

from matmul_drift.jobs import site
from matmul_drift.read import history


# ---------------------------------------------------------------------------- the maps


@pytest.fixture(scope="module")
def served_maps(tmp_path_factory):
    """(tree, base URL, entries): a results tree of one machine, one commit and both torch builds
    whose maps of bmm in float32 and bfloat16 are real (measured here as the suite maps them:
    batchmap_run.complete), the second build's float32 map changed (its first run of M recorded
    with row 0 drifting, a stand-in for a torch that drifts there); its drift page and map pictures
    built by site.write beside a stand-in for asv's index.html, served on 127.0.0.1."""
    import asv_fixtures as F

    from matmul_drift.probes import batchmap, batchmap_run
    from matmul_drift.read import latest
    from matmul_drift.store import catalog

    base = tmp_path_factory.mktemp("maps")
    entries = {d: batchmap.entry(batchmap_run.complete(batchmap_run.Mapper(
        batchmap_run.plan("bmm", None, None, None, d, "cpu")))) for d in ("float32", "bfloat16")}
    runs = entries["float32"]["verdicts"]
    moved = {**entries["float32"], "verdicts": [dict(runs[0], row0=False), *runs[1:]]}

    def adjust(ci, ei, data):
        for d, e in entries.items():
            e = moved if ei == 1 and d == "float32" else e
            F.set_value(data, F.MAP_ID, F.DTYPES.index(d), catalog.store(base / "results" / "catalog", "maps", e))

    tree = F.write_tree(base / "results", n_commits=1, cases=("bmm",), machine="box-m", adjust=adjust)
    hist = history.read_history(tree.root)
    result, run_lines = latest.runs(hist)
    html = base / "html"
    html.mkdir()
    (html / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"></head><body><ul>'
                                     '<li id="nav-li-regressions"><a href="#">regressions</a></li></ul></body></html>')
    shutil.copy(Path(asv.__file__).parent / "www" / "swallow.ico", html)  # asv publish's icon, which the page names
    site.write(html, hist, result, run_lines, title="the latest run on each machine")
    with _serving(html) as url:
        yield tree, url, entries


def test_drift_page_shows_each_builds_map_picture_and_words(browser, served_maps):
    """A picture per build of the batched case (M along, a row per dtype), loaded by the browser,
    the words of each dtype's map beside it, and the change between the builds flagged with the
    M that changed."""
    tree, url, entries = served_maps
    browser.get(f"{url}/{site.PAGE}")
    order = browser.execute_script("return [...document.querySelectorAll('h2')].map(h => h.id)")
    assert order[0] == "flags" and "maps" in order, order
    pictures = _wait(browser, "var i = [...document.querySelectorAll('img.map')]; "
                              "return i.length && i.every(x => x.complete) ? "
                              "i.map(x => [x.naturalWidth, x.naturalHeight, x.alt]) : null")
    assert len(pictures) == 2 and all(w >= 800 and h >= 200 for w, h, _ in pictures), pictures
    assert [alt.split("torch ")[1][:6] for _, _, alt in pictures] == ["2.13.0", "2.14.1"], pictures
    figures = browser.find_elements("css selector", "div.map")
    assert len(figures) == 2
    for fig in figures:
        assert "box-m: bmm on cpu" in fig.text
        for dtype, e in entries.items():
            assert e["words"].splitlines()[0] in fig.text, (dtype, fig.text)  # each dtype's words, in a row of its own
    # an incident per block, its cells and flags folded: a click on its summary opens them
    incident = browser.find_element("css selector", "section.incident")
    assert "incident 1 (failing): torch 2.13.0+cpu -> 2.14.1+cpu" in incident.text, incident.text
    assert browser.find_element("css selector", "table.flags").text == ""  # folded
    incident.find_element("css selector", "details.flags summary").click()
    assert "bmm float32 cpu 2.14.1+cpu changed" in incident.find_element("css selector", "table.cells").text
    flags = browser.find_element("css selector", "table.flags").text
    first = entries["float32"]["verdicts"][0]
    span = f"{first['lo']}" if first["lo"] == first["hi"] else f"{first['lo']}..{first['hi']}"
    assert f"M = {span} became drifting (row 0 as at M = 1) under torch 2.14.1" in flags, flags
    assert _errors(browser) == []
