"""The published site in a real browser: headless Chromium on the merged site of
test_nightly.py's world, served on localhost. Skips only where Chromium is absent and CI is
not set; in CI (which installs chromium and chromium-driver) it always runs."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import asv
import pytest
from test_nightly import build_world

from matmul_drift.jobs import axis, site
from matmul_drift.read import history

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run")


def _missing() -> str | None:
    if not CHROMIUM or not DRIVER:
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    import importlib.util

    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install selenium)"
    return None


def _chromium(profile, flags=FLAGS):
    """A headless Chromium driven by selenium; fails in CI, skips elsewhere, where it is absent."""
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in flags:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


@contextlib.contextmanager
def _serving(directory):
    """The base URL of ``directory`` served on 127.0.0.1 for the duration."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = _chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(world, base URL) with the merged tree's html/ served on 127.0.0.1."""
    world = build_world(tmp_path_factory)
    with _serving(world.tree("m") / "html") as url:
        yield world, url


def _wait(driver, script: str, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: d.execute_script(script))


def _errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_benchmark_list_and_a_drift_graph_render(browser, served):
    world, url = served
    browser.get(f"{url}/index.html#/summarylist")
    rows = _wait(browser, "return document.querySelectorAll('#summarylist-body tbody tr').length")
    assert rows > 100
    assert "drift.Drift.track_error_u" in browser.find_element("id", "summarylist-body").text
    assert _errors(browser) == []

    h1, h2 = axis.commit("2026-01-01"), axis.commit("2026-01-02")  # asv's points for the two nights
    # asv's parameter values are Python reprs: 'square', quotes included.
    browser.get(f"{url}/index.html#drift.Drift.track_error_u?machine=box-a"
                "&p-case=%27square%27&p-dtype=%27float32%27&p-device=%27cpu%27")
    # The graph is drawn (flot's canvas) with one point per night, at the recorded values,
    # and its commit range runs from the first night to the second.
    _wait(browser, "return document.querySelectorAll('#main-graph canvas.flot-base').length")
    series = _wait(browser, "var p = $('#main-graph').data('plot'); return p && p.getData().map(s => s.data)")
    recorded = [o.value for o in history.read_history(world.tree("m") / "results", machine="box-a").observations()
                if o.benchmark == "drift.Drift.track_error_u" and o.params == {"case": "square", "dtype": "float32",
                                                                              "device": "cpu"}]
    assert len(series) == 1 and [v for _, v in series[0]] == pytest.approx(recorded) and len(recorded) == 2
    assert browser.execute_script("return document.getElementById('range').value") == f"{h1[:8]}..{h2[:8]}"
    assert "error.html" not in browser.current_url  # asv sends a page whose scripts failed there
    assert _errors(browser) == []


def test_drift_page_shows_kernel_names_and_is_linked(browser, served):
    world, url = served
    browser.get(f"{url}/index.html")
    link = _wait(browser, "return document.querySelector('#nav-li-drift a')")
    link.click()
    _wait(browser, f"return location.pathname.endsWith('/{site.PAGE}')")
    kernels = browser.find_element("css selector", "table.kernels").text
    assert "MKL SGEMM(N,N) CNR:OFF NThr:" in kernels and "MKL SGEMM(N,N) CNR:COMPATIBLE NThr:" in kernels
    assert "kernel-id" in kernels and "box-b: square float32 cpu" in kernels
    flags = browser.find_element("css selector", "table.flags").text
    assert "Drift.track_kernel_id" in flags and "CNR:COMPATIBLE" in flags
    assert "box-a" in browser.find_element("id", "nights").find_element("xpath", "following-sibling::ul").text
    # A point's link (asv's show_commit_url + its commit) lands on that night's row.
    main = json.loads((world.tree("m") / "html/index.json").read_text())
    browser.get(f"{url}/{main['show_commit_url']}{axis.commit('2026-01-02')}")
    row = _wait(browser, "return document.getElementById(location.hash.slice(1))")
    assert "2026-01-02" in row.text and "machine box-a" in row.text
    assert _errors(browser) == []


# ---------------------------------------------------------------------------- the main job's site


@pytest.fixture(scope="module")
def offline_browser(tmp_path_factory):
    """Chromium that can reach 127.0.0.1 and nothing else: every other host name fails to resolve."""
    driver = _chromium(tmp_path_factory.mktemp("chromium-offline"),
                       (*FLAGS, "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served_main(tmp_path_factory):
    """(project, base URL): the main job's own html/ (test_mainjob.py's copy) on 127.0.0.1."""
    from test_mainjob import build_project

    project = build_project(tmp_path_factory)
    with _serving(project.path / "html") as url:
        yield project, url


def test_main_job_site_draws_both_builds_offline_and_names_kernels(offline_browser, served_main):
    project, url = served_main
    b = offline_browser
    b.get(f"{url}/index.html#drift.Drift.track_error_u?machine={project.name}"
          "&p-case=%27square%27&p-dtype=%27float32%27&p-device=%27cpu%27")
    _wait(b, "return document.querySelectorAll('#main-graph canvas.flot-base').length")
    series = _wait(b, "var p = $('#main-graph').data('plot'); return p && p.getData().map(s => s.data)")
    runs = history.read_history(project.path / "results", machine=project.name).observations()
    recorded = sorted(o.value for o in runs if o.benchmark == "drift.Drift.track_error_u"
                      and o.params == {"case": "square", "dtype": "float32", "device": "cpu"})
    # one line per torch build, holding every value recorded (test_mainjob.py may add commits)
    assert len(series) == 2 and sorted(v for s in series for _, v in s) == pytest.approx(recorded)
    assert "error.html" not in b.current_url
    # nothing was loaded from anywhere but this server
    hosts = b.execute_script("return performance.getEntriesByType('resource').map(e => new URL(e.name).host)")
    assert hosts and set(hosts) == {url.split("//", 1)[1]}
    assert _errors(b) == []

    b.get(f"{url}/index.html")
    _wait(b, "return document.querySelector('#nav-li-drift a')").click()
    _wait(b, f"return location.pathname.endsWith('/{site.PAGE}')")
    kernels = b.find_element("css selector", "table.kernels").text
    assert "MKL SGEMM(N,N)" in kernels and "MKL DGEMM(N,N)" in kernels
    assert f"{project.name}: square float32 cpu" in kernels
    # each order-id in words: square in float32 as the suite's probe reveals it in the main job's
    # environment (which leaves out this process's MKL_* settings: MKL_CBWR moves the route)
    reveal = ("import json; from matmul_drift.core import cases; from matmul_drift.probes import order; "
              "got = order.order_of(order.target(cases.get('square'), 'float32', 'cpu')); "
              "print(json.dumps([got['order_id'], got['summary']]))")
    p = subprocess.run([sys.executable, "-c", reveal], env=project.env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    order_id, words = json.loads(p.stdout)
    row = b.find_element("id", f"o-{order_id}").text
    assert words in row and f"{project.name}: square float32 cpu" in row and "order-id" in row
    assert project.name in b.find_element("id", "nights").find_element("xpath", "following-sibling::ul").text
    assert _errors(b) == []


def test_the_graph_legend_sits_beside_the_plot_and_ids_say_what_they_are(offline_browser, served_main):
    """asv drew the legend over the plot's corner, and kernel-ids as lines of numbers near 1e14
    with nothing to say they are names: now the legend has a column of its own, and an id
    series is named as an id above its graph."""
    project, url = served_main
    b = offline_browser
    b.get(f"{url}/index.html#drift.Drift.track_error_u?machine={project.name}"
          "&p-case=%27square%27&p-dtype=%27float32%27&p-device=%27cpu%27")
    _wait(b, "return document.querySelectorAll('#main-graph canvas.flot-base').length")
    box = _wait(b, f"""var l = document.querySelector('#{site.LEGEND_ID} table');
        var c = document.querySelector('#main-graph canvas.flot-base');
        if (!l || !c) return null;
        var a = l.getBoundingClientRect(), p = c.getBoundingClientRect();
        return [a.left, a.right, a.top, a.bottom, p.left, p.right, p.top, p.bottom, l.innerText];""")
    ll, lr, lt, lb, pl, pr, pt, pb, text = box
    assert lr - ll > 0 and lb - lt > 0 and text.count("torch") == 2  # both builds named
    assert ll >= pr or lr <= pl or lt >= pb or lb <= pt, box  # no overlap with the plot
    b.get(f"{url}/index.html")  # the benchmark grid: a small graph per benchmark, its name below
    names = _wait(b, "var t = [...document.querySelectorAll('.benchmark-text')].map(e => e.innerText); "
                     "return t.length ? t : null")
    ids = [n for n in names if "an id, not a quantity" in n]
    assert len(ids) == 6 and any(n.startswith("Drift.track_map_id: an id") for n in ids), names
    assert "Drift.track_error_u" in names  # a quantity keeps its own name
    assert _errors(b) == []


def test_drift_page_leads_with_the_flags_and_folds_the_notes(browser, served):
    """The nightly world's page: the flags before anything else, the notes below them folded,
    and each kernel change listed per case with the ids linked to their names."""
    world, url = served
    browser.get(f"{url}/{site.PAGE}")
    order = browser.execute_script("return [...document.querySelectorAll('h2')].map(h => h.id)")
    assert order[0] == "flags" and order.index("flags") < order.index("nights") < order.index("kernels"), order
    if "notes" in order:  # folded: closed until asked
        assert order.index("notes") == 1
        assert browser.execute_script("return [...document.querySelectorAll('details.notes')].every(d => !d.open)")
    repro = browser.find_element("css selector", "table.flags").text
    assert "matmul-drift explain --case square --dtype float32 --device cpu" in repro
    changes = browser.find_element("css selector", "table.changes")
    link = changes.find_element("css selector", "a")
    target = link.get_attribute("href").split("#", 1)[1]
    link.click()
    row = _wait(browser, f"return document.getElementById('{target}')")
    assert row.tag_name == "tr" and "MKL" in row.text
    assert _errors(browser) == []


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
    flags = browser.find_element("css selector", "table.flags").text
    first = entries["float32"]["verdicts"][0]
    span = f"{first['lo']}" if first["lo"] == first["hi"] else f"{first['lo']}..{first['hi']}"
    assert f"M = {span} became drifting (row 0 as at M = 1) under torch 2.14.1" in flags, flags
    assert _errors(browser) == []
