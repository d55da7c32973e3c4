"""The real asv on the real suite: `asv check`, and quick runs under spawn and forkserver."""

import ast
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checkout import committed_copy

ROOT = Path(__file__).resolve().parents[1]
ASV = [sys.executable, "-m", "asv"]


def asv(*args, cwd, env=None, timeout=900):
    p = subprocess.run([*ASV, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture
def project(tmp_path):
    """A committed copy of the working tree, so asv can resolve a commit hash."""
    dst = tmp_path / "project"
    head = committed_copy(dst)
    # the cases and precisions test_quick_run reads, no more: setup_cache measures each
    env = dict(os.environ, HOME=str(tmp_path), MATMUL_DRIFT_CASES="square,skinny",
               MATMUL_DRIFT_PRECISIONS="float32,bfloat16",
               MATMUL_DRIFT_CATALOG=str(dst / "results" / "catalog"))
    rc, out = asv("machine", "--yes", "--machine", "testbox", cwd=dst, env=env)
    assert rc == 0, out
    return dst, head, env


def test_asv_check():
    rc, out = asv("check", "--python=same", cwd=ROOT)
    assert rc == 0 and "No problems found" in out, out


def _results(dst):
    files = [p for p in (dst / "results" / "asv" / "testbox").glob("*.json") if p.name != "machine.json"]
    assert len(files) == 1, files
    data = json.loads(files[0].read_text())
    cols = data["result_columns"]
    bench = json.loads((dst / "results" / "asv" / "benchmarks.json").read_text())
    out = {}
    for name, row in data["results"].items():
        res = dict(zip(cols, row))["result"]
        params = bench[name]["params"]
        import itertools

        for combo, value in zip(itertools.product(*params), res):
            out[(name, *(ast.literal_eval(p) for p in combo))] = value
    return out


def _skinny_drifts() -> bool:
    """Whether any A[:m] @ B (m = 1..7) differs from (A @ B)[:m] for skinny in fp32 here."""
    import torch

    from matmul_drift.core import cases
    from matmul_drift.measure import measure

    a_bits, b_bits, _ = measure.operand_bits(cases.get("skinny"), "float32", "cpu")
    a, b = measure.to_tensor(a_bits, "float32", "cpu"), measure.to_tensor(b_bits, "float32", "cpu")
    full = a @ b
    return any(not torch.equal(a[:m] @ b, full[:m]) for m in range(1, 8))


# The combinations read below that the main job's selection leaves out, run all the same: each
# must skip in the benchmark's own code (NaN), not fail (null), as a run without a selection asks.
UNSELECTED = ("drift.Drift.track_error_u('square', 'float32', 'cuda')",
              "drift.Drift.track_error_u('seed', 'float32', 'cpu')",
              "drift.Drift.track_order_id('square', 'float32', 'cuda')",
              "timing.Time.time_matmul('square', 'float32', 'cuda')")


# spawn starts a fresh interpreter (and imports torch) per benchmark and parameter: fewer benchmarks.
@pytest.mark.parametrize("method,bench", [("forkserver", "track_error_u|track_kernel_id|track_slice_m_ulp|track_fix|track_order_id|"
                                                         "track_map_id|time_matmul"),
                                          ("spawn", "track_error_u")])
def test_quick_run(project, method, bench):
    from matmul_drift.jobs import selection

    dst, head, env = project
    if method == "spawn":
        # all covered by the forkserver run; so are the cells it does not read: it measures the
        # one it reads, square in float32
        env = {**env, "MATMUL_DRIFT_FIXES": "0", "MATMUL_DRIFT_ORDERS": "0",
               "MATMUL_DRIFT_MAPS": "0", "MATMUL_DRIFT_CASES": "square",
               "MATMUL_DRIFT_PRECISIONS": "float32"}
    # the main job's own selection (a process only for the combinations this machine measures),
    # and the unselected combinations read below, each by its full name
    selected, _ = selection.bench_args([bench], selection.read(env))
    extra = [a for name in UNSELECTED if re.search(bench, name)
             for a in ("--bench", f"^{re.escape(name)}$")]
    rc, out = asv(
        "run", "-E", "existing:same", "--quick", f"--set-commit-hash={head}", f"--launch-method={method}",
        "--machine", "testbox", *selected, *extra, cwd=dst, env=env,
    )
    assert rc == 0, out[-3000:]
    # asv rewrote benchmarks.json from its discovery: the committed one must be that file, or the
    # main job leaves a tracked file modified (CI's clean clone caught one lacking track_map_id)
    assert json.loads((dst / "results/asv/benchmarks.json").read_text()) == json.loads(
        (ROOT / "results/asv/benchmarks.json").read_text())
    got = _results(dst)
    err = got[("drift.Drift.track_error_u", "square", "float32", "cpu")]
    assert isinstance(err, float) and 0 < err < 512  # measured, within γ_K
    if "track_slice_m_ulp" in bench:
        drifts = _skinny_drifts()
        assert (got[("drift.Drift.track_slice_m_ulp", "skinny", "float32", "cpu")] > 0) == drifts
        # The cheapest full fix: 1.0 with nothing to fix; else a measured ratio ("full product,
        # then slice" always removes a slice drift), its verdicts in the catalog.
        cost = got[("drift.Drift.track_fix_cost", "skinny", "float32", "cpu")]
        assert (cost == 1.0) if not drifts else (cost > 0 and cost != 1.0)
        fid = int(got[("drift.Drift.track_fix_id", "skinny", "float32", "cpu")])
        entry = json.loads((dst / "results" / "catalog" / "fixes" / f"{fid:012x}.json").read_text())
        assert entry["drifts"] == (["slice_m"] if drifts else [])
    # CUDA combinations are skipped (NaN), not failed (null); so are unselected cases.
    if "time_matmul" in bench:
        assert got[("timing.Time.time_matmul", "square", "float32", "cpu")] > 0
        assert math.isnan(got[("timing.Time.time_matmul", "square", "float32", "cuda")])
    assert math.isnan(got[("drift.Drift.track_error_u", "square", "float32", "cuda")])
    assert math.isnan(got[("drift.Drift.track_error_u", "seed", "float32", "cpu")])
    assert not any(v is None for v in got.values())  # nothing failed
    if "track_kernel_id" in bench:
        kid = int(got[("drift.Drift.track_kernel_id", "square", "float32", "cpu")])
        assert (dst / "results" / "catalog" / "kernels" / f"{kid:012x}.json").exists()
    if "track_order_id" in bench:  # each tree, read back from the catalog, replays this CPU's kernel bit for bit
        from matmul_drift.core import cases
        from matmul_drift.probes import order, order_plan
        from matmul_drift.store import catalog

        for case, dtype in (("skinny", "float32"), ("square", "bfloat16")):
            oid = got[("drift.Drift.track_order_id", case, dtype, "cpu")]
            entry = catalog.load(dst / "results" / "catalog", "orders", oid)
            t = order_plan.target(cases.get(case), dtype, "cpu")
            assert entry["k"] == t.k and entry["tree"] is not None
            assert order.replay(t, entry["tree"], width=64)["matched"] == 100
        assert math.isnan(got[("drift.Drift.track_order_id", "square", "float32", "cuda")])
    if "track_map_id" in bench:  # skinny's map of M = 1..8 from the catalog: its rows drift where slice_m saw it
        from matmul_drift.core import mapruns
        from matmul_drift.store import catalog

        entry = catalog.load(dst / "results" / "catalog", "maps", got[("drift.Drift.track_map_id", "skinny", "float32", "cpu")])
        assert (entry["params"]["lo"], entry["params"]["hi"], entry["params"]["m_full"]) == (1, 8, 8)
        state = mapruns.per_m(entry["verdicts"])  # every M of 1..8 measured: no class has a gap
        assert sorted(state) == list(range(1, 9)) and entry["measured"] == list(range(1, 9)) and state[1][1]
        assert any(not state[m][2] for m in range(1, 8)) == _skinny_drifts()
        assert math.isnan(got[("drift.Drift.track_map_id", "square", "float32", "cpu")])  # not batched


def test_the_selection_regex_picks_exactly_the_selected_combinations_in_asvs_own_naming(monkeypatch):
    # asv's own selection over the benchmarks.json its discovery wrote: the GPU check runs only
    # the combinations it measures (the rest are NaN without a process each)
    import itertools
    import types

    from asv.benchmarks import Benchmarks

    from matmul_drift.core import cases
    from matmul_drift.jobs import selection

    monkeypatch.setenv(selection.CASES_VAR, "seed,batch-invariance-2")
    monkeypatch.setenv(selection.PRECISIONS_VAR, "float16,float32-tf32")
    monkeypatch.setenv(selection.DEVICES_VAR, "cuda")
    found = json.loads((ROOT / "results/asv/benchmarks.json").read_text())
    found.pop("version", None)
    conf = types.SimpleNamespace(benchmark_dir=str(ROOT / "benchmarks"))
    chosen = Benchmarks(conf, list(found.values()), regex=[selection.selection_regex(r"drift\.Drift\.track_\w+", selection.read())])
    drift = sorted(n for n in found if n.startswith("drift.Drift.track_"))
    assert sorted(chosen) == drift and len(drift) >= 12
    combos = list(itertools.product(cases.CASE_IDS, cases.PRECISIONS, cases.DEVICES))
    want = [i for i, (c, p, d) in enumerate(combos)
            if c in ("seed", "batch-invariance-2") and p in ("float16", "float32-tf32") and d == "cuda"]
    assert len(want) == 4
    for name in drift:
        assert chosen.benchmark_selection[name] == want, name


def test_the_main_jobs_selection_runs_every_benchmark_at_the_combinations_this_machine_measures(monkeypatch):
    # without a GPU driver, asv forks no process for a cuda combination nor for a CUDA-only
    # precision on the CPU: 36 of each benchmark's 108, where the rest would only skip
    import itertools
    import os
    import re
    import types

    from asv.benchmarks import Benchmarks

    from matmul_drift.core import cases, numerics
    from matmul_drift.jobs import selection

    found = json.loads((ROOT / "results/asv/benchmarks.json").read_text())
    found.pop("version", None)
    conf = types.SimpleNamespace(benchmark_dir=str(ROOT / "benchmarks"))
    combos = list(itertools.product(cases.CASE_IDS, cases.PRECISIONS, cases.DEVICES))
    real_exists = os.path.exists
    for driver, user, devices in ((False, [], ["cpu"]), (True, [], ["cpu", "cuda"]), (False, [r"Drift\.", "time_"], ["cpu"]),
                                  (False, [r"track_error_u\('seed', 'float16'"], ["cpu"])):
        monkeypatch.setattr(os.path, "exists", lambda p, d=driver: d if p in selection.GPU_DRIVERS else real_exists(p))
        assert selection.devices_here(selection.read()) == tuple(devices)
        args, shown = selection.bench_args(user)
        assert args[::2] == ["--bench"] * max(1, len(user)) and " and ".join(devices) + " combinations" in shown
        chosen = Benchmarks(conf, list(found.values()), regex=args[1::2])
        want = {name: [i for i, (c, p, d) in enumerate(combos) if d in devices and (d == "cuda" or p not in numerics.TF32)
                       and (not user or any(re.search(u, f"{name}({c!r}, {p!r}, {d!r})") for u in user))] for name in found}
        assert sorted(chosen) == sorted(n for n in found if want[n]) and len(chosen) >= 1 + 12 * (not user), user
        assert {n: chosen.benchmark_selection[n] for n in chosen} == {n: w for n, w in want.items() if w}
        assert sum(map(len, want.values())) == len(chosen) * (1 if "seed" in "".join(user) else 36 + 54 * driver)
    monkeypatch.setenv(selection.DEVICES_VAR, "cuda")  # asked for cuda where there is none: asv runs them, to skip
    monkeypatch.setattr(os.path, "exists", lambda p: False if p in selection.GPU_DRIVERS else real_exists(p))
    assert selection.devices_here(selection.read()) == () and "the cuda combinations" in selection.bench_args([])[1]


def _toy_project(dst: Path) -> str:
    """A git project whose one asv benchmark needs no torch; returns its commit."""
    from checkout import git

    (dst / "benchmarks").mkdir(parents=True)
    (dst / "benchmarks" / "__init__.py").write_text("")
    (dst / "benchmarks" / "toy.py").write_text("def track_one():\n    return 1.0\n")
    (dst / "asv.conf.json").write_text(json.dumps({
        "version": 1, "project": "toy", "repo": ".", "branches": ["main"], "dvcs": "git",
        "environment_type": "existing", "benchmark_dir": "benchmarks", "results_dir": "results/asv"}))
    git(dst.parent, "init", "-q", "-b", "main", str(dst))
    git(dst, "add", "-A")
    git(dst, "commit", "-qm", "toy")
    return git(dst, "rev-parse", "HEAD")


def test_a_run_of_an_environment_with_a_long_name_is_found_recorded(tmp_path):
    # asv names a results file <commit8>-env-<md5 of the name> once the environment's name has
    # 128 characters or more (a matrix with a few more packages or env vars); the main job asks
    # whether a build is recorded by that file's name, so it must name it as asv does.
    from matmul_drift.jobs import asvrun

    dst = tmp_path / "toy"
    head = _toy_project(dst)
    venv = tmp_path / ("p" * 130)  # asv's existing environment is named after its python's path
    venv.symlink_to(sys.prefix)
    env = dict(os.environ, HOME=str(tmp_path))
    rc, out = asv("machine", "--yes", "--machine", "box", cwd=dst, env=env)
    assert rc == 0, out
    rc, out = asv("run", f"--python={venv / 'bin' / 'python'}", f"--set-commit-hash={head}", "--machine", "box",
                  "--quick", cwd=dst, env=env, timeout=300)
    assert rc == 0, out[-3000:]
    [written] = asvrun.results_files(dst / "results" / "asv" / "box")
    env_name = json.loads(written.read_text())["env_name"]
    assert len(env_name) >= 128
    assert asvrun.recorded(dst / "results" / "asv", "box", head, env_name) == [written]
    assert asvrun.recorded(dst / "results" / "asv", "box", head, env_name[:-1] + "x") == []


def test_asvs_forkserver_runs_under_a_temporary_folder_too_deep_for_its_socket(tmp_path):
    # asv's forkserver binds $TMPDIR/asv-forkserver-XXXXXXXX/socket, whose path the kernel caps
    # (unix(7)): under a deeper TMPDIR (a Slurm job's; pytest-xdist's, where CI's GPU-check
    # rehearsal failed) asv says only "Failed to start server thread". The jobs' asv runs there.
    import socket

    from matmul_drift.jobs import asvrun

    def binds(folder: Path) -> bool:  # the kernel's answer, not the constant's
        sock = folder / asvrun.FORKSERVER_SOCKET
        sock.parent.mkdir(parents=True)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(str(sock))
            return True
        except OSError:
            return False

    # a folder whose socket path is the limit itself (where tmp_path leaves room), one a byte deeper
    n = asvrun.SOCKET_PATH_MAX - len(str(tmp_path / asvrun.FORKSERVER_SOCKET)) - 1
    deep = tmp_path / ("d" * max(1, n + 1))
    assert len(str(deep / asvrun.FORKSERVER_SOCKET)) > asvrun.SOCKET_PATH_MAX
    assert not binds(deep) and asvrun.tmpdir_for_asv(str(deep)) == asvrun.SHORT_TMPDIR
    if n >= 1:
        fits = tmp_path / ("f" * n)
        assert len(str(fits / asvrun.FORKSERVER_SOCKET)) == asvrun.SOCKET_PATH_MAX
        assert binds(fits) and asvrun.tmpdir_for_asv(str(fits)) == str(fits)
    dst = tmp_path / "toy"
    head = _toy_project(dst)
    env = dict(os.environ, HOME=str(tmp_path), TMPDIR=str(deep))
    assert asv("machine", "--yes", "--machine", "box", cwd=dst, env=env)[0] == 0
    run = ("run", "--python=same", f"--set-commit-hash={head}", "--machine", "box", "--quick",
           "--launch-method=forkserver")
    rc, out = asv(*run, cwd=dst, env=env, timeout=300)
    assert rc != 0 and "Failed to start server thread" in out, out[-3000:]  # asv itself
    rc, tail = asvrun.run(dst / "asv.conf.json", *run, cwd=dst, env=env)
    assert rc == 0, tail
    [written] = asvrun.results_files(dst / "results" / "asv" / "box")
    assert json.loads(written.read_text())["results"]["toy.track_one"][0] == [1.0]


def test_a_run_of_an_older_commit_does_not_hide_the_newer_results_from_the_site(tmp_path):
    # asv publish draws a benchmark's results only where their version (a hash of its code) is
    # benchmarks.json's. Measuring an older commit after a newer one (filling in history) must
    # leave the newer code's description there, or every newer point of that benchmark vanishes.
    from checkout import git

    from matmul_drift.jobs import asvrun

    dst = tmp_path / "toy"
    first = _toy_project(dst)
    (dst / "benchmarks" / "toy.py").write_text("def track_one():\n    return 2.0  # new code, new asv version\n")
    git(dst, "commit", "-qam", "new code", "--date", "2030-01-01T00:00:00")
    second = git(dst, "rev-parse", "HEAD")
    conf = json.loads((dst / "asv.conf.json").read_text())
    (dst / "staging.json").write_text(json.dumps({**conf, "results_dir": "staging"}))
    env = dict(os.environ, HOME=str(tmp_path))
    assert asv("machine", "--yes", "--machine", "box", cwd=dst, env=env)[0] == 0
    for commit in (second, first):  # the newer first, then the older one
        git(dst, "checkout", "-q", commit)  # an existing environment measures the working tree
        rc, out = asv("--config", "staging.json", "run", "--python=same", f"--set-commit-hash={commit}",
                      "--machine", "box", "--quick", cwd=dst, env=env, timeout=300)
        assert rc == 0, out[-3000:]
        asvrun.import_results(dst / "staging", dst / "results" / "asv", "box", [], False, print)
        shutil.rmtree(dst / "staging")
    rc, out = asv("publish", cwd=dst, env=env)
    assert rc == 0, out[-3000:]
    [graph] = (dst / "html" / "graphs" / "branch-main" / "machine-box").rglob("toy.track_one.json")
    assert [value for _, value in json.loads(graph.read_text())] == [2.0]


def test_the_benchmark_modules_touch_no_cuda_before_asvs_fork():
    """asv's forkserver imports the benchmark modules once and forks a process per benchmark
    (setup_cache too): CUDA initialised in the server (torch.cuda.is_available() without
    PYTORCH_NVML_BASED_CUDA_CHECK, a device count, a lazy init) leaves every child's CUDA
    broken. Here every entry torch has into the CUDA driver raises while the modules are
    imported as asv imports them and their params and selection are read."""
    code = r"""
import sys, torch
def poisoned(*a, **k):
    raise AssertionError("CUDA touched before the fork")
for mod, name in ((torch._C, "_cuda_getDeviceCount"), (torch._C, "_cuda_init"), (torch.cuda, "_lazy_init"),
                  (torch.cuda, "is_available"), (torch.cuda, "device_count"), (torch.cuda, "mem_get_info")):
    if hasattr(mod, name):
        setattr(mod, name, poisoned)
sys.path.insert(0, sys.argv[1])
import benchmarks.drift as d, benchmarks.timing as t
from matmul_drift.jobs import selection
print(len(d.Drift.params[0]) * len(d.Drift.params[1]) * len(d.Drift.params[2]), len(t.Time.params[2]),
      bool(selection.selection_regex("drift", selection.read())))
"""
    env = {**os.environ, "MATMUL_DRIFT_DEVICES": "cuda"}
    p = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.split() == ["108", "2", "True"], p.stderr
