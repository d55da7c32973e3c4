"""The main job for real: both torch builds of asv.conf.json's matrix (2.13.0 and 2.14.1), each
in asv's own virtualenv, side by side, on a committed copy of this checkout (its committed
results included, but for this machine's own, so the first run is this machine's first), with
`MATMUL_DRIFT_CASES=square` and `--bench 'Drift\\.'` to keep it short.

asv's environments live in this checkout's .asv/env (made on first use: two torch installs,
by uv, from the local wheel store; reused afterwards), shared by the copy: a lock lets one run
at a time use them (asv re-checks out an environment's project folder under a running build).
The end of this file opens the copy's site in a browser (browsing.py), so the main job runs
once a session for both.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from checkout import ROOT, committed_copy, git

from matmul_drift.cli import main as cli
from matmul_drift.core import ids
from matmul_drift.jobs import mainjob, site
from matmul_drift.read import history
from matmul_drift.store import catalog, machine

PY = sys.executable
BENCH = r"Drift\."
BUILDS = ("2.13.0", "2.14.1")


@dataclass
class Project:
    path: Path
    env: dict
    name: str
    runs: dict = field(default_factory=dict)

    def run(self, *args, **extra) -> subprocess.CompletedProcess:
        """`matmul-drift run` as scripts/suite.sh runs it (which first pip-installs the project),
        holding the shared environments' lock."""
        with open(ROOT / ".asv" / "env.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return subprocess.run([PY, "-m", "matmul_drift.cli", "run", "--bench", BENCH, *args], cwd=self.path,
                                  env={**self.env, **extra}, capture_output=True, text=True, timeout=1800)

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD")

    def files(self, commit: str | None = None) -> dict[str, Path]:
        """{torch build: results file} of this machine at ``commit`` (default HEAD)."""
        commit = commit or self.head()
        out = {}
        for p in (self.path / "results/asv" / self.name).glob(f"{commit[:8]}-*.json"):
            out[json.loads(p.read_text())["params"]["torch"]] = p
        return out


_PROJECT: list[Project] = []


def build_project(factory) -> Project:
    """The copy, and the first run of the main job in it (see the module docstring)."""
    if _PROJECT:
        return _PROJECT[0]
    base = factory.mktemp("mainjob")
    proj = base / "proj"
    name = machine.name(machine.fingerprint())
    committed_copy(proj, results=True, leave_out=(name,))  # other machines' history, none of this one's
    (ROOT / ".asv" / "env").mkdir(parents=True, exist_ok=True)
    (proj / ".asv").mkdir()
    (proj / ".asv" / "env").symlink_to(ROOT / ".asv" / "env")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MATMUL_DRIFT_", "MKL_", "TORCH_VERSION"))}
    # HOME: asv keeps its machine file there; PYTHONPATH: the copy's own package drives the run.
    env.update(HOME=str(base / "home"), MATMUL_DRIFT_CASES="square", PYTHONPATH=str(proj / "src"))
    p = Project(proj, env, name)
    p.runs["first"] = p.run()
    assert p.runs["first"].returncode == 0, p.runs["first"].stderr[-4000:]
    _PROJECT.append(p)
    return p


@pytest.fixture(scope="session")
def project(tmp_path_factory) -> Project:
    return build_project(tmp_path_factory)


def test_both_builds_side_by_side_in_asvs_own_environments(project):
    files = project.files()
    assert sorted(files) == list(BUILDS)
    # the environment names plain `asv run` gives the project's matrix, one per build
    from asv import config, environment
    from asv.plugin_manager import plugin_manager

    conf = config.Config.load(str(project.path / "asv.conf.json"))
    for plugin in conf.plugins:  # as asv's commands load them: the environment type is one
        plugin_manager.import_plugin(plugin)
    names = sorted(e.name for e in environment.get_environments(conf, None, verbose=False))
    assert sorted(json.loads(p.read_text())["env_name"] for p in files.values()) == names
    assert all(f"torch{b}" in json.loads(files[b].read_text())["env_name"] for b in BUILDS)
    # each build ran the torch it names (the env catalog entry says what was imported)
    hist = history.read_history(project.path / "results", machine=project.name)
    torch_ran = sorted(r.torch for r in hist.runs[project.name] if r.commit == project.head())
    assert [t.split("+")[0] for t in torch_ran] == list(BUILDS)
    # the machine is this hardware; its description says so
    info = json.loads((project.path / "results/asv" / project.name / "machine.json").read_text())
    assert info["machine"] == project.name and info["isa"] == machine.asv_entry(machine.fingerprint())["isa"]
    # the site's torch column shows each build (beside other machines' builds: the H200's 2.11.0+cu130)
    index = json.loads((project.path / "html/index.json").read_text())
    assert set(BUILDS) <= set(index["params"]["torch"]), index["params"]["torch"]
    assert project.name in index["params"]["machine"]


def test_the_run_ends_with_what_it_found(project):
    p = project.runs["first"]
    # the builds side by side at this commit: one comparison, no flag on this CPU or else named
    assert re.search(r"^matmul-drift summary: .* in 1 comparisons on 1 machine$", p.stdout, re.M), p.stdout
    first = git(project.path, "rev-list", "--max-parents=0", "HEAD")[:8]
    assert re.search(rf"compared at {first}: torch 2\.13\.0\S* vs 2\.14\.1\S*; no earlier commit recorded", p.stdout)
    assert "done in" in p.stderr and "torch 2.13.0 recorded" in p.stderr and "torch 2.14.1 recorded" in p.stderr
    assert "Traceback" not in p.stderr


def test_nothing_tracked_in_git_is_modified(project):
    status = git(project.path, "status", "--porcelain", "--untracked-files=all")
    changed = [ln for ln in status.splitlines() if not ln.startswith("??")]
    assert changed == []
    new = [ln[3:] for ln in status.splitlines()]
    assert new and all(n.startswith((f"results/asv/{project.name}/", "results/catalog/")) for n in new), new


def test_a_second_run_refuses_and_changes_nothing(project):
    before = {p: p.read_bytes() for p in (project.path / "results").rglob("*") if p.is_file()}
    p = project.run()
    assert p.returncode == 2, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "already recorded" in errors[0] and "--force" in errors[0]
    assert {q: q.read_bytes() for q in (project.path / "results").rglob("*") if q.is_file()} == before


def test_one_build_again_never_touches_the_other(project):
    files = project.files()
    other = files["2.13.0"].read_bytes()
    replaced = files["2.14.1"].read_bytes()
    p = project.run("--force", TORCH_VERSION="2.14.1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "torch 2.14.1 recorded" in p.stderr and "2.13.0" not in p.stderr.split("torch builds", 1)[1].splitlines()[0]
    assert files["2.13.0"].read_bytes() == other  # never rewritten
    kept = list(files["2.14.1"].parent.glob(files["2.14.1"].name + ".replaced-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == replaced  # the replaced file is kept beside
    # nothing changed since the build's last record (the one replaced): its trees are replayed
    # on fresh draws, not revealed again, and setup_cache's lines show as they come (asv keeps
    # them only where it fails)
    head = project.head()[:8]
    reused = re.findall(r"^\[torch 2\.14\.1\] \[orders \d+/\d+ .*\] square (\S+) cpu: .*: "
                        rf"reused from {head}, confirmed \(\d+ fresh draws replayed bit for bit, \d+ calls?\)$", p.stderr, re.M)
    assert sorted(reused) == sorted(("float64", "float32", "float16", "bfloat16")), p.stderr[-4000:]
    assert re.search(rf"torch 2\.14\.1: matmul-drift cost: measuring .*, orders [\d.]+ s \(4 reused\), "
                     rf"fixes .*; reused from {head}$", p.stderr, re.M), p.stderr[-4000:]


def test_a_build_that_cannot_install_is_one_line_and_the_other_is_recorded(project):
    conf = project.path / "asv.conf.json"
    text = conf.read_text()
    conf.write_text(text.replace('"torch": ["2.13.0", "2.14.1"]', '"torch": ["2.13.0", "9.9.9"]'))
    git(project.path, "commit", "-qam", "a torch build that does not exist")
    try:
        p = project.run()
    finally:
        conf.write_text(text)
        git(project.path, "commit", "-qam", "back")
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "torch 9.9.9" in errors[0] and "9.9.9" in errors[0].split("torch 9.9.9", 1)[1], errors
    head = git(project.path, "rev-parse", "HEAD~1")
    assert sorted(project.files(head)) == ["2.13.0"]
    # the summary printed: 2.13.0 against this machine's previous commit (no second build here)
    assert re.search(r"^matmul-drift summary: .* in 1 comparisons on 1 machine$", p.stdout, re.M), p.stdout
    before = git(project.path, "rev-parse", "HEAD~2")[:8]
    assert re.search(rf"one torch build only; torch 2\.13\.0\S* at {before} vs {head[:8]}", p.stdout), p.stdout


def test_catalog_names_a_kernel_id_as_asv_shows_it(project, capsys):
    hist = history.read_history(project.path / "results", machine=project.name)
    value = next(o.value for o in hist.observations(project.name) if o.benchmark == "drift.Drift.track_kernel_id"
                 and o.params == {"case": "square", "dtype": "float32", "device": "cpu"} and o.status == "ok")
    root = project.path / "results/catalog"
    names = catalog.load(root, "kernels", value)["full"]
    for spelling in (f"{value:.1f}", f"{value:.3g}", f"{int(value):012x}", repr(value)):
        assert cli.main(["catalog", spelling, "--root", str(root)]) == 0
        out = capsys.readouterr().out
        assert ids.hex_id(value) in out and all(n in out for n in names)
    assert cli.main(["catalog", "not-an-id", "--root", str(root)]) == 2
    assert "is not an id" in capsys.readouterr().err


def test_bad_input_is_one_line(project):
    for args, needle in (((("--torch", "latest"),), "not a version"), ((("--machine", "a b"),), "machine"),
                         ((("--machine", "unregistered"),), "--machine unregistered is not in ~/.asv-machine.json"),
                         ((("--torch", ","),), "--torch ',' names no torch version")):
        p = project.run(*args[0])
        assert p.returncode == 2 and "Traceback" not in p.stderr
        errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
        assert len(errors) == 1 and needle in errors[0], p.stderr
    # a selection the suite would refuse: refused before asv starts, nothing recorded (it once
    # ran a minute and recorded every benchmark failed, exit 0)
    def recorded():
        return {p: p.stat().st_mtime_ns for p in (project.path / "results").rglob("*") if p.is_file()}

    before = recorded()
    for var, value, needle in (("MATMUL_DRIFT_CASES", "bogus", "$MATMUL_DRIFT_CASES names unknown cases: bogus"),
                               ("MATMUL_DRIFT_BUDGET", "abc", "$MATMUL_DRIFT_BUDGET must be a positive number"),
                               ("MATMUL_DRIFT_FIXES", "maybe", "$MATMUL_DRIFT_FIXES is 0 (off) or 1 (on), not 'maybe'")):
        p = project.run(**{var: value})
        errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
        assert p.returncode == 2 and len(errors) == 1 and needle in errors[0], p.stderr
        assert recorded() == before, p.stderr
    assert mainjob.check_build(" 2.14.1 ") == "2.14.1"


def _bare_project(tmp_path, conf: str) -> Path:
    proj = tmp_path / "p"
    proj.mkdir()
    git(tmp_path, "init", "-q", str(proj))
    (proj / "asv.conf.json").write_text(conf)
    git(proj, "add", "-A")
    git(proj, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p")
    return proj


@pytest.mark.parametrize("conf,needle", [
    ("[1, 2]", "is not a JSON object"), ("null", "is not a JSON object"),
    ('{"matrix": null}', "its matrix is not an object"), ('{"matrix": "x"}', "its matrix is not an object"),
    ('{"matrix": {"req": {"torch": ["2.13.0"]}}, "env_dir": 5}', "its env_dir is not a path"),
])
def test_a_config_of_another_shape_is_one_line(tmp_path, monkeypatch, capsys, conf, needle):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    rc = cli.main(["run", "--repo", str(_bare_project(tmp_path, conf))])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err, err


def test_a_config_asv_cannot_make_an_environment_of_is_one_line(tmp_path, monkeypatch, capsys):
    # No environment_type: asv (0.6) raises RuntimeError for it, which was a traceback.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(mainjob.machine, "register", lambda: "m")
    rc = cli.main(["run", "--repo", str(_bare_project(tmp_path, '{"matrix": {"req": {"torch": ["2.13.0"]}}}'))])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln or "Traceback" in ln]
    assert rc == 2 and err == ["matmul-drift run: error: asv.conf.json: Environment type must be specified"], err


@pytest.mark.parametrize("html_dir", [".", "..", "results", "results/asv", "results/html", "benchmarks"])
def test_an_html_dir_that_asv_publish_would_delete_with_the_results_is_refused(tmp_path, capsys, html_dir):
    # asv publish starts by deleting html_dir: "." or "results" would take every result with it.
    proj = _bare_project(tmp_path, '{"matrix": {"req": {"torch": ["2.13.0"]}}, "html_dir": "%s"}' % html_dir)
    (proj / "results/asv").mkdir(parents=True)
    with pytest.raises(mainjob.UsageError, match="asv publish would delete"):
        mainjob.project_config(proj)
    rc = cli.main(["run", "--repo", str(proj)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "html_dir" in err, err
    assert (proj / "results/asv").is_dir()
    (tmp_path / "ok").mkdir()
    ok = _bare_project(tmp_path / "ok", '{"matrix": {"req": {"torch": ["2.13.0"]}}, "html_dir": "html"}')
    assert mainjob.project_config(ok)["html_dir"] == "html"


def test_an_unusable_asv_machine_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "home").mkdir()
    (tmp_path / "home/.asv-machine.json").write_text("[1]")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    rc = cli.main(["run", "--repo", str(_bare_project(tmp_path, '{"matrix": {"req": {"torch": ["2.13.0"]}}}'))])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot record this machine" in err, err
    assert (tmp_path / "home/.asv-machine.json").read_text() == "[1]"


@pytest.mark.parametrize("force", [False, True])
def test_a_result_recorded_meanwhile_by_another_run_is_never_written_over(tmp_path, force):
    from matmul_drift.jobs import asvrun

    staging, results = tmp_path / "staging", tmp_path / "results"
    (staging / "m").mkdir(parents=True)
    (staging / "m/abcd1234-env.json").write_text('{"this run": 1}')
    # ``old`` was taken before asv ran (nothing then); another run recorded the file since.
    (results / "m").mkdir(parents=True)
    (results / "m/abcd1234-env.json").write_text('{"the other run": 1}')
    with pytest.raises(asvrun.AlreadyRecorded, match="recorded meanwhile by another run"):
        asvrun.import_results(staging, results, "m", [], force, print)
    assert [p.name for p in (results / "m").iterdir()] == ["abcd1234-env.json"]
    assert (results / "m/abcd1234-env.json").read_text() == '{"the other run": 1}'


def test_a_folder_it_cannot_write_is_one_line(tmp_path, monkeypatch, capsys):
    # The job's state folder taken by a file: an OSError where a full disk or a read-only
    # checkout gives one (root writes anywhere, so a permission cannot stand for it). It was a traceback.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    proj = _bare_project(tmp_path, '{"matrix": {"req": {"torch": ["2.13.0"]}}, "environment_type": "virtualenv"}')
    (proj / ".asv").mkdir()
    (proj / mainjob.STATE).write_text("")
    rc = cli.main(["run", "--repo", str(proj), "--no-publish"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln or "Traceback" in ln]
    assert rc == 1 and err == [f"matmul-drift run: error: {proj / mainjob.STATE}: File exists"], err


def test_a_results_file_asv_left_cut_short_is_a_failed_build_and_not_recorded(tmp_path, monkeypatch):
    """asv killed (or out of disk space) as it wrote its results file: the file was recorded
    cut short, as the build's result at this commit, and every later run refused the build as
    already recorded (the summary skipped the file). Now the build failed, nothing is recorded."""
    from matmul_drift.jobs import asvrun

    proj = _bare_project(tmp_path, '{"matrix": {"req": {"torch": ["2.13.0"]}}, "environment_type": "virtualenv"}')
    o = mainjob.Options(repo=proj, publish=False)
    conf = mainjob.project_config(proj)
    commit = git(proj, "rev-parse", "HEAD")

    def asv(conf, *args, cwd, env=None, log=None, progress=None, hold=None, follow=None):
        staging = Path(json.loads(Path(conf).read_text())["results_dir"])
        (staging / "m").mkdir(parents=True)
        (staging / "m/machine.json").write_text('{"machine": "m", "version": 1}')
        (staging / "m" / f"{commit[:8]}-env.json").write_text('{"commit_hash": "' + commit[:20])
        return -9, ["Killed"]

    monkeypatch.setattr(asvrun, "run", asv)
    out = mainjob.run_build(o, conf, "m", "2.13.0", commit)
    assert out.status == "failed" and "is cut short (not a JSON object); nothing recorded" in out.message, out
    assert not (proj / "results").exists()


def test_a_run_killed_before_its_site_is_published_by_the_next(project):
    """Killed after its results were recorded, before the site: the next plain run finds every
    build recorded and publishes them, where it once refused and left no site without --force."""
    import shutil

    shutil.rmtree(project.path / "html", ignore_errors=True)
    p = project.run("--force", "--torch", "2.13.0", MATMUL_DRIFT_KILL_AT="publishing")
    assert p.returncode in (-9, 137) and not (project.path / "html").exists(), p.stderr[-2000:]
    p = project.run("--torch", "2.13.0")
    assert p.returncode == 0 and "publishing them" in p.stderr, p.stderr[-2000:]
    assert (project.path / "html/index.html").is_file() and not (project.path / mainjob.STATE / "unpublished").exists()
    p = project.run("--torch", "2.13.0")  # and then, nothing left to do: refused as before
    assert p.returncode == 2 and "already recorded" in p.stderr


# ---------------------------------------------------------------------------- the main job's site in a browser


from browsing import _errors, _serving, _wait  # noqa: E402


@pytest.fixture(scope="module")
def served_main(tmp_path_factory):
    """(project, base URL): the main job's own html/ (test_mainjob.py's copy) on 127.0.0.1."""
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
    reveal = ("import json; from matmul_drift.core import cases; "
              "from matmul_drift.probes import order, order_plan; "
              "got = order.order_of(order_plan.target(cases.get('square'), 'float32', 'cpu')); "
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
    assert len(ids) == 7 and any(n.startswith("Drift.track_map_id: an id") for n in ids), names
    assert any(n.startswith("Drift.track_bits_id: an id") for n in ids), names
    assert "Drift.track_error_u" in names  # a quantity keeps its own name
    assert _errors(b) == []
