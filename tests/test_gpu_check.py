"""The GPU check rehearsed on this CPU: wheels fetched here, installed with the network
refused and git refused too, every step run with the smallest shapes in a tree without .git
(as the GPU machine gets it, whose image may lack git), outputs within the limits of what
comes back, and the archive imported.

The GPU machine's Python is 3.12 with its own torch and without asv; here torch exists for
this Python only (3.11), so the wheels are fetched for it (GPU_PYTHON_VERSION) and the
rehearsal runs a fresh Python that sees this one's packages but neither asv nor this
project: the closest available.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import pytest
from checkout import ROOT, committed_copy

from matmul_drift.core import series, trees
from matmul_drift.jobs import asvrun, gpucheck
from matmul_drift.read import history
from matmul_drift.store import catalog

LIMITS = {"files": 8, "file_bytes": 16 << 20, "total_bytes": 64 << 20}  # what comes back from $OUT
OURS = 4  # the issue's own bound on the files the check leaves


def image_python(base) -> str:
    """A fresh Python like the GPU machine's image: this one's packages, torch among them, but
    neither asv nor this project (each only from .whl/ there). Returns its executable."""
    farm = base / "image-site"
    farm.mkdir()
    # every site folder this Python imports from, in its order: a venv made with
    # --system-site-packages, or one whose .pth names another's, has torch and numpy there
    sites = [sysconfig.get_paths()["purelib"]] + [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    for site in dict.fromkeys(sites):
        for p in Path(site).iterdir():
            if (not p.name.startswith(("asv", "matmul_drift", "__editable__")) and p.suffix != ".pth"
                    and not (farm / p.name).is_symlink()):
                (farm / p.name).symlink_to(p)
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(base / "image")], check=True)
    venv_site = subprocess.run([base / "image/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(venv_site, "image.pth").write_text(f"{farm}\n")
    return str(base / "image/bin/python")


def image_env(base, tmp_path=None) -> dict:
    """The environment a check runs in here, as on the GPU machine: the image's Python (made by
    the rehearsal in ``base``), a HOME of its own, the network refused, none of the caller's
    $MATMUL_DRIFT_* settings, pip constraints or Python paths (a PYTHONPATH to a checkout would
    lend the image this project), and a TMPDIR in ``tmp_path`` where given."""
    env = {**os.environ, "PYTHON": str(base / "image/bin/python"), "HOME": str(base / "home"), "PIP_NO_INDEX": "1",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    if tmp_path is not None:
        (tmp_path / "tmp").mkdir()
        env["TMPDIR"] = str(tmp_path / "tmp")
    return {k: v for k, v in env.items()
            if not k.startswith(("MATMUL_DRIFT_", "PIP_CONSTRAINT")) and k not in ("PYTHONPATH", "ASV_PYTHONPATH")}


def git_stand_in(base: Path, refuse: bool) -> Path:
    """A folder holding a ``git`` that logs each call's folder and arguments to
    base/git-calls.log, then fails (``refuse``) or runs the real git."""
    folder = base / ("nogit" if refuse else "loggit")
    folder.mkdir()
    then = "exit 127" if refuse else f'exec {shutil.which("git")} "$@"'
    (folder / "git").write_text(f'#!/bin/sh\necho "$(pwd -P): $1" >> {base}/git-calls.log\n{then}\n')
    (folder / "git").chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-check")
    proj = base / "proj"
    committed_copy(proj)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "PYTHON": sys.executable, "WHL_DIR": str(proj / ".whl"), "GPU_PYTHON_VERSION": py}
    p = subprocess.run(["bash", "scripts/fetch_gpu_wheels.sh"], cwd=proj, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # The tree as it travels: no .git, .whl/ carried beside it.
    tree = base / "tree"
    shutil.copytree(proj, tree, ignore=shutil.ignore_patterns(".git"))
    out = base / "out"
    image = image_python(base)
    refused = image_env(base)
    assert subprocess.run([image, "-c", "import asv"], env=refused, capture_output=True).returncode == 1
    assert subprocess.run([image, "-c", "import matmul_drift"], env=refused, capture_output=True).returncode == 1
    # git first on PATH logs where it ran: no step but the nights may need it
    refused["PATH"] = f"{git_stand_in(base, refuse=False)}:{os.environ['PATH']}"
    # The steps' work on a loaded CPU, not their GPU-sized limits, is what this rehearses
    # (the paced rehearsal tests the plan): every limit and the deadline doubled.
    refused["GPU_CHECK_STRETCH"] = "2"
    # A TMPDIR too deep for asv's forkserver socket (unix(7): 107 bytes), as a Slurm job's may
    # be: the suite and the nights run their asv all the same (pytest-xdist's made CI's fail).
    refused["TMPDIR"] = str(base / ("t" * 100))
    Path(refused["TMPDIR"]).mkdir()
    run = subprocess.run(["bash", "scripts/gpu_check.sh", str(out), "--rehearse"], cwd=tree, env=refused,
                         capture_output=True, text=True, timeout=1500)
    return base, proj, out, run, p.stdout


def test_wheels_are_fetched_and_small(rehearsal):
    base, proj, _, _, fetched = rehearsal
    whl = proj / ".whl"
    names = [p.name for p in whl.iterdir()]
    assert any(n.startswith("asv-0.6.6-") for n in names) and any(n.startswith("matmul_drift-") for n in names)
    recorded = json.loads((whl / "commit.json").read_text())
    git_says = subprocess.run(["git", "log", "-1", "--format=%H %at"], cwd=proj, capture_output=True, text=True).stdout
    assert f"{recorded['commit']} {recorded['date'] // 1000}" == git_says.strip() and recorded["date"] % 1000 == 0
    assert not any(n.startswith(("torch-", "numpy-")) for n in names)  # the image has them
    size = sum(p.stat().st_size for p in whl.iterdir())
    assert size < 24 << 20 and f"wheels and commit {recorded['commit'][:8]}" in fetched


def test_the_fetched_commit_is_dated_as_asvs_git_dates_it(tmp_path):
    # asv's git dates a commit by its author time (rev-list --format=%at); an amended, rebased
    # or cherry-picked commit has a later committer time, and GPU results dated by that stand
    # apart from the same commit's other results. A stub Python stands in for pip: no download.
    from asv.plugins.git import Git
    from checkout import git

    proj = tmp_path / "proj"
    committed_copy(proj)
    git(proj, "commit", "-q", "--amend", "--no-edit", "--date=@1700000000")  # authored long before
    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    p = subprocess.run(["bash", "scripts/fetch_gpu_wheels.sh"], cwd=proj, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHON": str(stub), "WHL_DIR": str(tmp_path / "whl")})
    assert p.returncode == 0, p.stderr
    recorded = json.loads((tmp_path / "whl" / "commit.json").read_text())
    repo = Git(str(proj), str(tmp_path / "mirror"))
    assert recorded["commit"] == repo.get_hash_from_name("HEAD")
    assert recorded["date"] == repo.get_date(recorded["commit"]) == 1700000000000


def test_every_step_passes_within_its_timeout_with_the_network_and_git_refused(rehearsal):
    base, _, out, run, _ = rehearsal
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    calls = (base / "git-calls.log").read_text().splitlines()
    # the nights alone (their clone, the nightly's results branch and asv's axis), in a folder of their own,
    # and the check's look, before its first step, at whether git is there
    assert calls and all("/nights" in line.split(": ", 1)[0] or line.endswith(": --version") for line in calls), calls[:5]
    summary = (out / "summary.txt").read_text()
    steps = re.findall(r"^(\S+)\s+rc\s+(\d+)\s+(\d+) s of\s+(\d+) s$", summary, re.M)
    assert [s[0] for s in steps] == ["install", "config", "explain", "explain-txt", "suite", "nights", "fixes-batch",
                                      "map", "orders", "scan", "dense"]
    assert all(rc == "0" and int(t) <= int(limit) for _, rc, t, limit in steps)
    # The real run explains the seed's every slice, so that 45999 and 46000 are compared (one
    # --slice-n would measure that one alone: no pair).
    script = (ROOT / "scripts/gpu_check.sh").read_text()
    assert re.search(r"EXPLAIN=\(--case seed --dtype float16 --device cuda\)", script)
    assert "0 step(s) failed" in summary and "torch" in summary
    # before the first step: what it found, and that it can run every step
    before = (out / "log.txt").read_text().split("gpu_check: step install", 1)[0]
    assert re.search(r"^gpu_check: this machine: Python 3\.\d+\.\d+ at \S+; torch at \S+; git version \S+; \d+ MiB "
                     r"free in \S+$", before, re.M), before
    assert "gpu_check: this machine can run every step: install config explain" in before
    # nothing in the log for the night's reader to puzzle over: pip's note on a --target taken, a traceback
    log = (out / "log.txt").read_text()
    assert "already exists" not in log and "Traceback" not in log, log[:3000]
    # torch's build; the CUDA context's memory, measured on CUDA alone, is skipped without a word
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        torch_txt = tar.extractfile("./torch.txt").read().decode()
    assert re.fullmatch(r"torch \S+ git [0-9a-f]{12} CUDA \S+ False\n", torch_txt) and torch_txt in summary, torch_txt
    # the two nights: the second, with MKL_CBWR=COMPATIBLE, flags what that changed, and names it
    assert "== the second night (MKL_CBWR=COMPATIBLE) against the first" in summary
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        nights = tar.extractfile("./nights.txt").read().decode()
        flagged = tar.extractfile("./nights-summary.md").read().decode()
    assert len(re.findall(r"^[0-9a-f]{7,} \d{4}-\d\d-\d\d ", nights, re.M)) == 2 and "rc " not in nights, nights[-3000:]
    row = re.search(r"^\| Drift\.track_kernel_id \| square float32 cpu \|.*$", flagged, re.M)
    if mkl_route("MKL_CBWR=COMPATIBLE") != mkl_route():  # MKL names its CNR mode where it takes it
        assert row and f"env_vars.MKL_CBWR: {os.environ.get('MKL_CBWR', 'none')} -> COMPATIBLE" in row.group(0), flagged
    else:
        assert row is None, flagged
    # the map's first line: its range, and how few of it were measured
    assert re.search(r"^map of M over 1\.\.64 \(k=64, n=48\), bfloat16 on cpu: measured \d+ of 64 ", summary, re.M), summary
    orders = re.findall(r"^order (\S+): .+; replay 100/100, fused adds .+; order-id [0-9a-f]{12}; ", summary, re.M)
    assert orders == ["batch-bfloat16", "batch-m1-bfloat16", "seed-47-float16", "seed-48-float16"], summary[-2000:]


H200_STEPS = ROOT / "results/gpu-check/intel-xeon-amx-16c-1x-h200-c96efa/8b6c2946/steps.txt"
NAMES = ["install", "config", "explain", "explain-txt", "suite", "nights", "fixes-batch", "map", "orders", "scan", "dense"]


def plan() -> tuple[dict[str, int], dict[str, int]]:
    """(each step's limit as its `step` line states it, each step's H200 seconds as the script's
    plan states them: "2 x 44" is 88, "(11)" an estimate of 11)."""
    script = (ROOT / "scripts/gpu_check.sh").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    limits = {name: int(n) for name, n in re.findall(r"\bstep (\S+) (\d+) ", code)}
    rows = re.findall(r"^#   (\S+)\s+(\d+|\d+ x \d+|\(\d+\))\s+(\d+)$", script, re.M)
    assert {name: int(limit) for name, _, limit in rows} == limits, rows
    seconds = {name: [int(n) for n in re.findall(r"\d+", h200)] for name, h200, _ in rows}
    return limits, {name: n[0] * (n[1] if len(n) > 1 else 1) for name, n in seconds.items()}


def test_the_limits_fit_the_deadline_with_margin_and_the_h200s_recorded_times():
    limits, h200 = plan()
    assert list(limits) == NAMES
    script = (ROOT / "scripts/gpu_check.sh").read_text()
    deadline = int(re.search(r"GPU_CHECK_SECONDS:-(\d+)", script).group(1))
    reserve = int(re.search(r"^RESERVE=(\d+)", script, re.M).group(1))
    assert sum(limits.values()) <= deadline - reserve - 30, (sum(limits.values()), deadline - reserve)
    recorded = {name: int(t) for name, t in re.findall(r"^(\S+)\s+rc\s+\d+\s+(\d+) s of", H200_STEPS.read_text(), re.M)}
    assert recorded["suite"] == 102  # docs/performance.md's figure
    for name in set(recorded) & set(limits):  # the plan's H200 column is the record, every limit 20% above it
        assert h200[name] == recorded[name] and limits[name] >= 1.2 * recorded[name], (name, limits[name])
    assert h200["nights"] == 2 * recorded["fixes-seed"]  # the H200's fixes-seed stands in for each night
    assert all(limits[name] >= 1.2 * h200[name] for name in NAMES)


FULL_PACE = "MATMUL_DRIFT_FULL_PACE"  # set to 1: the rehearsal at the H200's own pace, about 5 min


@pytest.mark.parametrize("scale", [100, 1], ids=["scaled-dry", "full"])
def test_a_rehearsal_at_the_h200s_pace_passes_under_a_600_s_wall_clock(rehearsal, tmp_path, scale):
    """Every step made to last what it took on the H200 (GPU_CHECK_PACE): each passes within its
    limit, the summary is written, and the whole check ends within the device's 600 s on its
    own clock. CI's run waits a hundredth of each paced time (GPU_CHECK_SCALE=100, the clock
    counting the whole: 3 s of the plan's 286, where a tenth waited 29) and runs no step's
    command (GPU_CHECK_DRY): the plan alone, whatever this CPU's load, which the steps' own
    work (the rehearsal fixture) would add to GPU-sized limits. The full run
    (MATMUL_DRIFT_FULL_PACE=1) does the rehearsal's work at the H200's pace, in real time."""
    if scale == 1 and os.environ.get(FULL_PACE) != "1":
        pytest.skip(f"the full-time rehearsal takes about 5 minutes: set {FULL_PACE}=1")
    base, _, _, _, _ = rehearsal
    limits, h200 = plan()
    out = tmp_path / "out"
    env = {**image_env(base, tmp_path), "GPU_CHECK_SCALE": str(scale),
           "GPU_CHECK_PACE": " ".join(f"{k}={v}" for k, v in h200.items())}
    if scale > 1:  # no step runs, the install neither: the commands between the steps take the
        # project from the tree and asv from this Python
        site = sysconfig.get_paths()["purelib"]
        env.update(GPU_CHECK_DRY="1", PYTHONPATH=f"{base / 'tree/src'}:{site}")
    t0 = time.monotonic()
    run = subprocess.run(["bash", "scripts/gpu_check.sh", str(out), "--rehearse"], cwd=base / "tree", env=env,
                         capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    summary = (out / "summary.txt").read_text()
    lines = re.findall(r"^(\S+)\s+rc\s+(\d+)\s+(\d+) s of\s+(\d+) s$", summary, re.M)
    assert run.returncode == 0 and "0 step(s) failed" in summary, summary
    assert [line[0] for line in lines] == NAMES
    assert all(rc == "0" and h200[name] <= int(t) <= int(limit) == limits[name] for name, rc, t, limit in lines), lines
    done = re.search(r"^gpu_check: done in (\d+) s, 0 step\(s\) failed", run.stdout, re.M)
    clock = int(done.group(1))
    assert sum(h200.values()) <= clock < 600 and took < 600, (clock, took)
    if scale > 1:  # it waited a hundredth: the clock counted what it did not wait
        assert took < sum(h200.values()) / 2 < clock, (took, clock)
    assert "Traceback" not in run.stdout, run.stdout[-3000:]
    print(f"paced rehearsal, scale {scale}: the check's clock {clock} s, {took:.0f} s of wall")


def mkl_route(*setting: str) -> list[str]:
    """The kernel list of a float32 product on this CPU, in a process with ``setting`` (VAR=value)."""
    env = {**os.environ, **dict(s.split("=", 1) for s in setting)}
    code = ("import json, torch; from matmul_drift.measure import kernels; a = torch.ones(64, 64); "
            "print(json.dumps(kernels.route(lambda: a @ a, 'cpu')))")
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True, timeout=120).stdout)


def test_what_comes_back_fits_the_limits(rehearsal):
    _, _, out, _, _ = rehearsal
    files = [p for p in out.rglob("*")]
    assert all(p.is_file() for p in files) and len(files) <= OURS <= LIMITS["files"]
    assert sorted(p.name for p in files) == ["gpu-check.tar.gz", "log.txt", "summary.txt"]
    assert all(p.stat().st_size <= LIMITS["file_bytes"] and re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    assert sum(p.stat().st_size for p in files) <= LIMITS["total_bytes"]
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = tar.getnames()
    assert {"./seed-float16.json", "./seed-float16.txt", "./nights-summary.md", "./nights.txt", "./fixes-batch-bfloat16.json", "./scan-seed-float16.json", "./scan-seed-dense.json", "./map-batch-bfloat16.json", "./map-batch-bfloat16.png",
            "./map-batch-bfloat16.txt", "./MACHINE", "./COMMIT",
            "./order-seed-47-float16.json", "./order-seed-48-float16.json", "./order-batch-bfloat16.json",
            "./order-batch-m1-bfloat16.json", "./torch.txt"} <= set(names)
    assert any(n.startswith("./results/asv/") and n.endswith(".json") and "machine" not in n for n in names)


def test_the_real_runs_steps_fail_here_for_want_of_the_gpu_alone(rehearsal, tmp_path):
    # The real run's own command lines (its cases, slices, flags), which the rehearsal does not
    # use, on this machine without a GPU: each step that needs the GPU stops at its check, no
    # argument or slice is refused, and the suite runs the 40 combinations it measures there.
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the real check would run")
    base, _, _, _, _ = rehearsal
    out = tmp_path / "out"
    env = image_env(base, tmp_path)
    env["PATH"] = f"{git_stand_in(tmp_path, refuse=True)}:{env['PATH']}"  # and an image without git
    run = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=base / "tree", env=env,
                         capture_output=True,
                         text=True, timeout=600)
    log = (out / "log.txt").read_text()
    summary = (out / "summary.txt").read_text()
    steps = dict(re.findall(r"^(\S+)\s+rc\s+(\d+)\s", summary, re.M))
    assert run.returncode == 1 and steps == {
        "install": "0", "config": "0", "explain": "2", "explain-txt": "2", "suite": "0",
        "fixes-batch": "2", "map": "2", "orders": "1", "scan": "2", "dense": "2"}, log[-3000:]
    # without git the nights are skipped, said before the first step and in the summary, not failed;
    # the suite's results still come back
    before = log.split("gpu_check: step install", 1)[0]
    assert "; no git; " in before and "can run every step but the nights" in before, before
    assert re.search(r"^nights\s+rc\s+-\s+0 s of\s+0 s\s+skipped: no git on this machine: ", summary, re.M), summary
    assert "7 step(s) failed, 1 skipped (no git on this machine" in summary.splitlines()[0]
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        assert [n for n in tar.getnames() if re.fullmatch(r"\./results/asv/[^/]+/[^/]+\.json", n)
                and not n.endswith(("/machine.json", "/benchmarks.json"))]
    errors = re.findall(r"^matmul-drift(?: scan| map)?: error: (.*)$", log, re.M)
    assert errors.count("cuda requested but no CUDA GPU is available") == 9, errors  # 2 explains, a map, 4 orders, 2 scans
    assert len(errors) == 10 and "not an explain report" in errors[1], errors  # explain-txt: the answer is missing
    assert "Traceback" not in log and "usage:" not in log
    assert "CUDA context" not in log  # measured where torch has a GPU alone
    # only the 40 combinations measured there start a process (the others would say "not measured")
    tracks = len(series.UNITS)  # every track_ (time_matmul is not run where no GPU is)
    assert log.count("asv: skipped:") == tracks * 40
    assert log.count("asv: skipped: NotImplementedError('cuda requested but no CUDA GPU is available')") == tracks * 40


def test_a_check_killed_midway_still_brings_back_the_steps_it_finished(rehearsal, tmp_path):
    # As the device's own limit stops it: the archive in OUT holds every finished step, whole.
    base, _, _, _, _ = rehearsal
    tree, out = base / "tree", tmp_path / "out"
    proc = subprocess.Popen(["bash", "scripts/gpu_check.sh", str(out), "--rehearse"], cwd=tree, env=image_env(base, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = out / "log.txt"
    try:  # killed as the suite starts, after the seed's explain steps
        end = time.monotonic() + 300
        while not (log.exists() and "gpu_check: step suite" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < end, "the check never reached its suite step"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        time.sleep(1)  # an asv setup_cache in a process group of its own outlives the kill
        asvrun.reap_orphans(tree)
    assert not (out / "summary.txt").exists()  # it was stopped before its end
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = set(tar.getnames())
        steps = tar.extractfile("./steps.txt").read().decode()
        answer = json.loads(tar.extractfile("./seed-float16.json").read())
    assert {"./seed-float16.json", "./seed-float16.txt", "./MACHINE", "./COMMIT"} <= names
    assert [line.split()[0] for line in steps.splitlines()] == ["install", "config", "explain", "explain-txt"]
    assert answer["dtype"] == "float16"
    results = tmp_path / "results"  # and it imports: the answer without the suite's results
    p = subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), str(out / "gpu-check.tar.gz"),
                        "--results", str(results)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "the suite step did not finish" in p.stderr, p.stderr


def test_the_check_ends_by_its_deadline_whatever_runs_between_its_steps(rehearsal, tmp_path):
    # torch slow to start (a CUDA context can take seconds) and a HOME it cannot write: the check
    # still ends by GPU_CHECK_SECONDS with its summary, the steps it had no time for say so, and
    # the archive keeps a machine name and the commit, so that what the check made imports.
    # 15 s leaves a step after the install time to start on a quiet machine (cut short by the
    # deadline), not under load; 40 s (cut at the deadline) never: no step after the install.
    # The 40 s check waits for its torch while the 15 s one runs, which starts once the first
    # has installed (two installs at once overran the install's limit under load).
    base, _, _, _, _ = rehearsal
    checks = {}
    for slow_start in (40, 15):
        case = tmp_path / str(slow_start)
        case.mkdir()
        out, home = case / "out", case / "file" / "home"  # no folder can be made there, root or not
        home.parent.write_text("a file\n")
        slow = case / "python"
        slow.write_text("#!/bin/sh\ncase \"$*\" in *'print(\"torch\", torch.__version__'*) "
                        f'sleep {slow_start};; esac\nexec {base / "image/bin/python"} "$@"\n')
        slow.chmod(0o755)
        env = {**image_env(base, case), "PYTHON": str(slow), "HOME": str(home),
               "GPU_CHECK_SECONDS": "45"}
        proc = subprocess.Popen(["bash", "scripts/gpu_check.sh", str(out), "--rehearse"],
                                cwd=base / "tree", env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        checks[slow_start] = (proc, time.monotonic(), case, out, home)
        end, log = time.monotonic() + 60, out / "log.txt"
        while proc.poll() is None and time.monotonic() < end and not (
                log.exists() and re.search(r"^install\s+rc ", log.read_text(), re.M)):
            time.sleep(0.2)
    for slow_start, (proc, t0, case, out, home) in checks.items():
        rc = proc.wait(timeout=300)
        ended_by_its_deadline(rc, time.monotonic() - t0, case, out, home)


def ended_by_its_deadline(rc: int, took: float, case: Path, out: Path, home: Path) -> None:
    """What test_the_check_ends_by_its_deadline_whatever_runs_between_its_steps asserts of one
    check that ended with ``rc`` after ``took`` seconds."""
    log = (out / "log.txt").read_text()
    # the whole rehearsal takes about a minute
    assert rc == 1 and took < 45 + 10, (took, log[-3000:])
    lines = re.findall(r"^(\S+)\s+rc\s+(\d+)\s+(\d+) s of\s+(\d+) s(.*)$", (out / "summary.txt").read_text(), re.M)
    assert [line[0] for line in lines] == ["install", "config", "explain", "explain-txt", "suite", "nights",
                                           "fixes-batch", "map", "orders", "scan", "dense"], log[-3000:]
    skipped = [name for name, rc, _, _, rest in lines if rest.strip() == "not started: deadline" and rc == "124"]
    assert skipped and skipped == [line[0] for line in lines[-len(skipped):]], lines  # the last ones, none before
    assert f"{len(skipped) + sum(rc != '0' for name, rc, *_ in lines if name not in skipped)} step(s) failed" in log
    assert all(int(t) <= int(limit) for _, _, t, limit, _ in lines), lines
    assert "Traceback" not in log and home.parent.read_text() == "a file\n"
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = tar.getnames()
        machine = tar.extractfile("./MACHINE").read().decode().strip() if "./MACHINE" in names else None
    assert re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{6}", machine or ""), (machine, names, lines)
    p = _import_script(str(out / "gpu-check.tar.gz"), "--results", str(case / "results"))
    # whether the suite finished before the deadline (asv saves its results at its end) is the
    # machine's pace: the import says which
    suite_done = any(re.fullmatch(r"\./results/asv/[^/]+/[^/]+\.json", n) and not n.endswith("/machine.json") for n in names)
    assert p.returncode == 0 and ("the suite step did not finish" in p.stderr) != suite_done, (p.stderr, lines)


def test_the_archive_imports_into_results_like_any_machine(rehearsal, tmp_path):
    _, proj, out, _, _ = rehearsal
    results = tmp_path / "results"
    p = subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), str(out / "gpu-check.tar.gz"),
                        "--results", str(results)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    hist = history.read_history(results)
    (machine, runs), = hist.runs.items()
    import torch

    assert len(runs) == 1 and runs[0].torch == torch.__version__
    assert runs[0].env_name == "existing-torch" + re.sub(r"[^A-Za-z0-9._-]", "-", torch.__version__)
    recorded = json.loads((proj / ".whl/commit.json").read_text())
    assert runs[0].commit == recorded["commit"]
    assert runs[0].date == recorded["date"]  # as asv's git would have read it
    assert not hist.warnings
    imported = results / "gpu-check" / machine / runs[0].commit[:8]
    doc = json.loads((imported / "seed-float16.json").read_text())
    assert doc["dtype"] == "float16" and "fixes" not in doc  # the answer, on its own
    assert (imported / "torch.txt").read_text().startswith(f"torch {torch.__version__} git ")
    # what the check wrote beside its archive: the step times, the driver, the whole log
    assert (imported / "summary.txt").read_bytes() == (out / "summary.txt").read_bytes()
    assert (imported / "log.txt").read_bytes() == (out / "log.txt").read_bytes()
    doc = json.loads((imported / "fixes-batch-bfloat16.json").read_text())
    assert doc["dtype"] == "bfloat16" and "drifts" in doc["fixes"]  # --try-fixes ran on batch-invariance's stand-in
    assert (imported / "nights-summary.md").read_bytes() == _member(out / "gpu-check.tar.gz", "./nights-summary.md")
    for name in ("seed-47-float16", "seed-48-float16", "batch-bfloat16", "batch-m1-bfloat16"):  # the order trees
        o = json.loads((results / "gpu-check" / machine / runs[0].commit[:8] / f"order-{name}.json").read_text())
        assert o["verified"]["matched"] == 100 and sorted(trees.leaves(o["tree"])) == list(range(o["k"]))
        assert catalog.load(results / "catalog", "orders", int(o["order_id"], 16))["k"] == o["k"]
    # Imported twice: the same files, nothing refused, nothing written again.
    again = gpucheck.import_archive(out / "gpu-check.tar.gz", results)
    assert again.written == [] and not again.warnings


def _member(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tar:
        return tar.extractfile(name).read()


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_what_an_import_finds_recorded_is_never_lost(rehearsal, tmp_path):
    """An asv result or an output already recorded with other content (a second check at the
    same commit) is refused before anything is written, and with --force kept beside."""
    _, _, out, _, _ = rehearsal
    results = tmp_path / "results"
    gpucheck.import_archive(out / "gpu-check.tar.gz", results)
    (machine, runs), = history.read_history(results).runs.items()
    seed = results / "gpu-check" / machine / runs[0].commit[:8] / "seed-float16.json"
    for changed in (runs[0].path, seed):
        old = changed.read_bytes()
        changed.write_bytes(old.replace(b'"', b'"_', 1))
        before = _tree(results)
        p = subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), str(out / "gpu-check.tar.gz"),
                            "--results", str(results)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "already recorded" in p.stderr, p.stderr
        assert str(changed) in p.stderr and _tree(results) == before
        forced = gpucheck.import_archive(out / "gpu-check.tar.gz", results, force=True)
        assert forced.written == [changed] and changed.read_bytes() == old
        (kept,) = changed.parent.glob(changed.name + ".replaced-*")
        assert kept.read_bytes() == before[changed.relative_to(results)]
        assert [r.path for r in history.read_history(results).runs[machine]] == [runs[0].path]  # kept is no result
        kept.unlink()


def test_an_archive_without_the_suites_results_still_gives_the_rest(rehearsal, tmp_path):
    _, _, out, _, _ = rehearsal
    partial = tmp_path / "partial.tar.gz"
    with tarfile.open(out / "gpu-check.tar.gz") as src, tarfile.open(partial, "w:gz") as dst:
        for m in src.getmembers():  # as a suite step killed at its limit leaves it
            if not m.name.startswith("./results/asv"):
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    results = tmp_path / "results"
    p = subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), str(partial), "--results",
                        str(results)], capture_output=True, text=True, timeout=120)
    warnings = [line for line in p.stderr.splitlines() if "warning" in line]
    assert p.returncode == 0 and len(warnings) == 1 and "the suite step did not finish" in warnings[0], p.stderr
    assert not (results / "asv").exists()
    (machine_dir,) = (results / "gpu-check").iterdir()
    (commit_dir,) = machine_dir.iterdir()
    assert json.loads((commit_dir / "seed-float16.json").read_text())["dtype"] == "float16"
    assert (commit_dir / "scan-seed-dense.json").is_file() and any((results / "catalog").rglob("*.json"))


def _variant(archive: Path, dst: Path, change: dict) -> Path:
    """A copy of ``archive`` with members replaced ({name: bytes}), added, or left out (None)."""
    import io

    with tarfile.open(archive) as src, tarfile.open(dst, "w:gz") as out:
        names = set()
        for m in src.getmembers():
            names.add(m.name)
            if m.name in change and change[m.name] is None:
                continue
            if m.name in change:
                m.size = len(change[m.name])
                out.addfile(m, io.BytesIO(change[m.name]))
            else:
                out.addfile(m, src.extractfile(m) if m.isfile() else None)
        for name, data in change.items():
            if name not in names and data is not None:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    return dst


def _entry(members: list[str], kind: str) -> str:
    return next(n for n in members if n.startswith(f"./results/catalog/{kind}/") and n.endswith(".json"))


def test_an_archive_that_is_not_what_gpu_check_writes_is_refused_before_anything_is_written(rehearsal, tmp_path,
                                                                                             monkeypatch):
    _, _, out, _, _ = rehearsal
    real = out / "gpu-check.tar.gz"
    with tarfile.open(real) as tar:
        members = tar.getnames()
        bench = json.loads(tar.extractfile("./results/asv/benchmarks.json").read())
    kernels = _entry(members, "kernels")
    name, value = next(iter(bench.items()))
    cases = {
        "a catalog entry whose content is not its id": ({kernels: b'{"device":"cpu","full":["evil"]}'},
                                                        "does not match its id"),
        "a catalog entry holding a lone surrogate": ({kernels: b'{"device":"\\ud800"}'}, "unreadable"),
        "a file where no catalog entry goes": ({"./results/catalog/notakind/zzz.json": b"{}"},
                                              "is not a catalog entry"),
        "a benchmark asv would not describe so": ({"./results/asv/benchmarks.json": json.dumps(
            {**bench, name: {"unit": 5}}).encode()}, "not as asv writes them"),
        "the name no machine may take": ({"./MACHINE": b"all\n"}, "is malformed"),
        "more bytes than any check brings back": ({"./big.txt": b"0" * 4096}, "unpacks to more than"),
    }
    monkeypatch.setattr(gpucheck, "MAX_UNPACKED", sum(tarfile.open(real).getmember(n).size for n in members) + 1024)
    for what, (change, needle) in cases.items():
        results = tmp_path / what.replace(" ", "-") / "results"
        bad = _variant(real, tmp_path / f"{what.replace(' ', '-')}.tar.gz", change)
        with pytest.raises(gpucheck.ImportRefused, match=needle) as exc:
            gpucheck.import_archive(bad, results)
        assert "\n" not in str(exc.value) and not results.exists(), what
    # A write a timeout cut short (atomic.py's .tmp-*.part) is no entry: left out, the rest imported.
    cut = _variant(real, tmp_path / "cut.tar.gz", {"./results/catalog/kernels/.tmp-x.part": b"{"})
    done = gpucheck.import_archive(cut, tmp_path / "cut" / "results")
    assert done.written and not list((tmp_path / "cut").rglob(".tmp-*"))


def test_a_results_folder_that_cannot_take_the_import_is_one_line(rehearsal, tmp_path):
    _, _, out, _, _ = rehearsal
    (tmp_path / "file").write_text("not a folder")
    p = subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), str(out / "gpu-check.tar.gz"),
                        "--results", str(tmp_path / "file")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "cannot import into" in p.stderr, p.stderr


def test_an_archive_with_a_link_or_a_path_outside_is_refused(tmp_path):
    # without tarfile's "data" filter too: Debian 12's Python 3.11.2 lacks it
    for name, kind in (("../evil.json", tarfile.REGTYPE), ("results/../../evil.json", tarfile.REGTYPE),
                       (f"{tmp_path}/evil.json", tarfile.REGTYPE), ("results/link", tarfile.SYMTYPE)):
        bad = tmp_path / f"bad-{kind!r}.tar.gz"
        with tarfile.open(bad, "w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            tar.addfile(info, None if kind == tarfile.SYMTYPE else __import__("io").BytesIO(b""))
        with pytest.raises(gpucheck.ImportRefused, match="outside the archive|not a regular file"):
            gpucheck.import_archive(bad, tmp_path / "results")
        assert not (tmp_path / "evil.json").exists() and not (tmp_path / "results").exists()


def test_an_archive_holding_a_file_twice_is_refused(tmp_path):
    # tar unpacks the last of two members of one name over the first without a word
    import io

    archive = tmp_path / "twice.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in (("./MACHINE", b"gpu-a\n"), ("./COMMIT", b"0123456789abcdef" * 2 + b"01234567\n"),
                           ("./seed-float16.json", b'{"dtype": "float16"}'), ("seed-float16.json", b'{"dtype": "other"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(gpucheck.ImportRefused, match="seed-float16.json is in it twice"):
        gpucheck.import_archive(archive, tmp_path / "results")
    assert not (tmp_path / "results").exists()


def _tar(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar of ``files`` ({name: bytes}), in that order."""
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_an_output_whose_name_gpu_check_never_gives_is_refused(tmp_path):
    # gpu_check.sh names its outputs in letters, digits, '.', '_' and '-' (as what comes back from
    # the device must be); a newline or a byte that is no UTF-8 went into results/gpu-check/ as
    # it was, and the list of written files printed it across lines
    for name in ("./bad\nname.json", "./seed-\udcff.json", "./seed float16.json"):
        tar = _tar({"./MACHINE": b"gpu-a\n", "./COMMIT": b"0123456789abcdef" * 2 + b"01234567\n",
                    "./seed-float16.json": b"{}", name: b"{}"})
        archive = tmp_path / "check.tar.gz"
        archive.write_bytes(__import__("gzip").compress(tar))
        results = tmp_path / "results"
        with pytest.raises(gpucheck.ImportRefused, match="no name gpu_check.sh gives") as exc:
            gpucheck.import_archive(archive, results)
        assert "\n" not in str(exc.value) and not results.exists(), name


def test_an_output_a_failed_step_left_empty_or_cut_short_is_not_imported(tmp_path):
    # a step that fails or is killed leaves its STEP_OUT file empty (or JSON cut short): imported
    # as it was, it made `nightly --merge` refuse the tree holding it ("not valid JSON")
    tar = _tar({"./MACHINE": b"gpu-a\n", "./COMMIT": b"0123456789abcdef" * 2 + b"01234567\n",
                "./seed-float16.json": b"", "./seed-float16.txt": b"", "./fixes-seed-float16.json": b'{"dtype": "flo',
                "./scan-seed.json": b'{"x": NaN}', "./fixes-batch-bfloat16.json": b'{"dtype": "bfloat16"}'})
    archive = tmp_path / "check.tar.gz"
    archive.write_bytes(__import__("gzip").compress(tar))
    done = gpucheck.import_archive(archive, tmp_path / "results")
    assert [p.name for p in done.written] == ["fixes-batch-bfloat16.json"], done.written
    for name in ("seed-float16.json", "seed-float16.txt", "fixes-seed-float16.json", "scan-seed.json"):
        assert any(name in w and "its step did not finish" in w for w in done.warnings), (name, done.warnings)
    for f in (tmp_path / "results").rglob("*.json"):
        json.loads(f.read_text(), parse_constant=lambda c: pytest.fail(f"{f}: {c}"))



def test_an_order_report_deeper_than_json_loads_reads_is_imported(tmp_path):
    # `order --json` writes a tree K deep (a sequential loop); json.loads stops near 1000 levels,
    # so such a report was taken for a step that did not finish and left out. nightly --merge
    # and gpu_check.sh's summary read it with trees.read_report; so does the import now.
    k = 1500
    deep = 0
    for i in range(1, k):
        deep = [deep, i]
    meta = {"case": "seed", "k": k, "order_id": "0" * 12, "summary": "sequential", "verified": None, "notes": []}
    whole = trees.report_text(meta, deep).encode()
    nan = trees.report_text({**meta, "verified": 0.5}, deep).replace('"verified": 0.5', '"verified": NaN').encode()
    tar = _tar({"./MACHINE": b"gpu-a\n", "./COMMIT": b"0123456789abcdef" * 2 + b"01234567\n",
                "./order-seed.json": whole, "./order-cut.json": whole[:-40], "./order-nan.json": nan})
    archive = tmp_path / "check.tar.gz"
    archive.write_bytes(__import__("gzip").compress(tar))
    done = gpucheck.import_archive(archive, tmp_path / "results")
    assert [Path(p).name for p in done.written] == ["order-seed.json"], (done.written, done.warnings)
    back = trees.read_report(Path(done.written[0]).read_text())
    assert back["k"] == k and trees.to_json(back["tree"]) == trees.to_json(deep)
    for name in ("order-cut.json", "order-nan.json"):  # still no JSON: left out with a word
        assert any(name in w and "its step did not finish" in w for w in done.warnings), (name, done.warnings)

def test_an_archive_damaged_on_its_way_is_refused_not_imported_in_part(tmp_path):
    # tarfile reads no further than tar's end, takes a damaged header for that end without a
    # word, and so never checks the gzip trailer: a damaged archive imported what it could read
    # (a changed file, or none after the damage) with exit 0, or gave zlib's traceback
    import gzip
    import struct
    import zlib

    seed = json.dumps({"dtype": "float16", "values": list(range(6000))}).encode()
    files = {"./MACHINE": b"gpu-a\n", "./COMMIT": b"0123456789abcdef" * 2 + b"01234567\n",
             "./seed-float16.json": seed, "./fixes-seed-float16.json": b'{"dtype": "float16"}'}
    tar = _tar(files)
    with tarfile.open(fileobj=__import__("io").BytesIO(tar)) as t:
        member = t.getmember("./seed-float16.json")
    intact = tmp_path / "intact.tar.gz"
    intact.write_bytes(gzip.compress(tar, mtime=0))
    assert gpucheck.import_archive(intact, tmp_path / "intact" / "results").written  # the same, whole, imports
    changed = tar.replace(b"5999", b"5998", 1)  # a bit flipped: the trailer still holds the true CRC
    header = bytearray(tar)
    header[member.offset] ^= 1  # the seed's header: its checksum no longer matches
    cut = member.offset_data + member.size // 2
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
    damaged = {
        "its data changed": gzip.compress(changed, mtime=0)[:-8] + struct.pack("<II", zlib.crc32(tar), len(tar)),
        "its gzip trailer cut off": intact.read_bytes()[:-8],
        "a tar header damaged": gzip.compress(bytes(header), mtime=0),
        "its deflate stream broken inside a file": deflate.compress(tar[:cut]) + deflate.flush(zlib.Z_FULL_FLUSH)
        + b"\xff" * 64,
    }
    for what, data in damaged.items():
        bad = tmp_path / f"{what.replace(' ', '-')}.tar.gz"
        bad.write_bytes(data)
        results = tmp_path / what.replace(" ", "-") / "results"
        with pytest.raises(gpucheck.ImportRefused, match="damaged") as exc:
            gpucheck.import_archive(bad, results)
        assert "\n" not in str(exc.value) and not results.exists(), what
    p = subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), str(bad), "--results",
                        str(tmp_path / "cli" / "results")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "damaged" in p.stderr, p.stderr


def _synthetic_archive(tmp_path: Path, commit_index: int, salt: str) -> Path:
    """An archive as gpu_check.sh packs it, of synthetic commit ``commit_index`` (asv_fixtures:
    one day per commit), whose error_u benchmark has the code version of ``salt``."""
    import asv_fixtures as F

    stage = tmp_path / f"stage-{commit_index}"
    tree = F.write_tree(stage / "results", machine="gpu-a", n_commits=commit_index + 1, torch_versions=("2.14.1",))
    version = F.bench_version(F.ERROR_U, salt)
    bench = json.loads((tree.asv_dir / "benchmarks.json").read_text())
    bench[F.ERROR_U]["version"] = version
    (tree.asv_dir / "benchmarks.json").write_text(json.dumps(bench))
    for f in tree.files:
        data = F.load_results(f)
        F.set_version(data, F.ERROR_U, version)
        F.write_results(f.parent, data)
    for f in tree.files:  # a check records one commit
        if f != tree.file(commit_index, 0):
            f.unlink()
    (stage / "MACHINE").write_text("gpu-a\n")
    (stage / "COMMIT").write_text(tree.commits[commit_index] + "\n")
    archive = tmp_path / f"check-{commit_index}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(stage, arcname=".")
    return archive


def test_a_check_of_an_older_commit_keeps_the_newer_benchmark_descriptions(tmp_path):
    import asv_fixtures as F
    from asv.results import Results

    results = tmp_path / "results"
    tree = F.write_tree(results, n_commits=3)  # commits of days 0, 1 and 2, the current code
    newest = Results.load(str(tree.file(2, 0)))
    shown = lambda: newest.get_result_keys(json.loads((tree.asv_dir / "benchmarks.json").read_text()))  # noqa: E731
    assert F.ERROR_U in shown()
    gpucheck.import_archive(_synthetic_archive(tmp_path, 1, "older code"), results)  # a check of day 1
    bench = json.loads((tree.asv_dir / "benchmarks.json").read_text())
    assert bench[F.ERROR_U]["version"] == F.bench_version(F.ERROR_U) and F.ERROR_U in shown()
    gpucheck.import_archive(_synthetic_archive(tmp_path, 3, "newer code"), results)  # of day 3: newer than all
    bench = json.loads((tree.asv_dir / "benchmarks.json").read_text())
    assert bench[F.ERROR_U]["version"] == F.bench_version(F.ERROR_U, "newer code")


def test_asv_results_an_import_would_not_take_are_refused_not_dropped(tmp_path):
    # gpu_check.sh packs the results of one machine at one commit, in the folder named for it
    # with its machine.json. Results of another machine or commit were left out without a word
    # (exit 0); without machine.json, or in a folder of another name, the run was called "not
    # finished", or imported without its machine.json, which left results/ unreadable.
    import asv_fixtures as F

    def stage(what, edit):
        folder = tmp_path / what.replace(" ", "-")
        tree = F.write_tree(folder / "stage" / "results", machine="gpu-a", n_commits=2, torch_versions=("2.14.1",))
        if what != "another commit's results":
            tree.file(0, 0).unlink()  # the day before's
        (folder / "stage" / "MACHINE").write_text("gpu-a\n")
        (folder / "stage" / "COMMIT").write_text(tree.commits[1] + "\n")
        (folder / "stage" / "seed-float16.json").write_text('{"dtype": "float16"}')
        edit(tree)
        with tarfile.open(folder / "check.tar.gz", "w:gz") as tar:
            tar.add(folder / "stage", arcname=".")
        return folder / "check.tar.gz", folder / "results"

    def other_machine(tree):
        F.write_tree(tree.root.parent / "other", machine="gpu-b", n_commits=1, torch_versions=("2.14.1",))
        shutil.copytree(tree.root.parent / "other" / "asv" / "gpu-b", tree.asv_dir / "gpu-b")

    archive, results = stage("as packed", lambda tree: None)
    assert gpucheck.import_archive(archive, results).warnings == []  # the check's own, whole, imports
    cases = {
        "another machine's results": other_machine,
        "another commit's results": lambda tree: None,
        "no machine.json": lambda tree: (tree.machine_dir / "machine.json").unlink(),
        "a folder not named for its machine": lambda tree: tree.machine_dir.rename(tree.asv_dir / "gpu-x"),
    }
    for what, edit in cases.items():
        archive, results = stage(what, edit)
        with pytest.raises(gpucheck.ImportRefused, match="no asv result of gpu-a at") as exc:
            gpucheck.import_archive(archive, results)
        assert "\n" not in str(exc.value) and not results.exists(), what
    # but a results file cut short (asv writes it in place, at its end: a step killed then) is
    # a suite that did not finish, as before: the other outputs are imported
    archive, results = stage("cut short", lambda tree: tree.file(1, 0).write_bytes(tree.file(1, 0).read_bytes()[:100]))
    (warning,) = gpucheck.import_archive(archive, results).warnings
    assert "the suite step did not finish" in warning and (results / "gpu-check").is_dir()


def test_the_recorded_commit_answers_for_its_commit_alone(tmp_path):
    from asv import util
    from asv.repo import NoSuchNameError

    from matmul_drift.jobs.asv_commit import RecordedCommit

    path = tmp_path / "commit.json"
    for bad in ("", "[]", '{"commit": "abc", "date": 1, "branch": "b"}', '{"commit": "%s", "date": 1.5, "branch": "b"}' % ("a" * 40)):
        path.write_text(bad)
        with pytest.raises(util.UserError, match="recorded commit"):
            RecordedCommit(str(path), None)
    h = "0123456789abcdef" * 2 + "01234567"
    path.write_text(json.dumps({"commit": h, "date": 1700000000000, "branch": "gpu-check"}))
    repo = RecordedCommit(str(path), None)
    assert {repo.get_hash_from_name(n) for n in (None, "HEAD", "gpu-check", h, h[:8])} == {h}
    assert repo.get_date(h) == 1700000000000 and repo.get_decorated_hash(h, 8) == f"{h[:8]} <gpu-check>"
    for name in ("main", h[:3], "f" * 40):
        with pytest.raises(NoSuchNameError):
            repo.get_hash_from_name(name)


def test_a_tree_that_is_not_the_fetched_commit_is_refused(rehearsal, tmp_path):
    base, proj, _, _, _ = rehearsal
    # here: fetching over uncommitted changes is refused, and the wheels fetched before stay
    before = sorted(p.name for p in (proj / ".whl").iterdir())
    (proj / "src/matmul_drift/cli/main.py").write_text((proj / "src/matmul_drift/cli/main.py").read_text() + "\n# edited\n")
    p = subprocess.run(["bash", "scripts/fetch_gpu_wheels.sh"], cwd=proj, capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable, "WHL_DIR": str(proj / ".whl")}, timeout=120)
    assert p.returncode == 1 and "uncommitted changes" in p.stderr
    assert sorted(p.name for p in (proj / ".whl").iterdir()) == before
    # there: a tree edited after the fetch installs nothing, and says why
    tree = tmp_path / "tree"
    shutil.copytree(proj, tree, ignore=shutil.ignore_patterns(".git"))
    run = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / "out"), "--rehearse"], cwd=tree,
                         env=image_env(base), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1 and "this tree is not the commit" in run.stdout
    assert re.search(r"^install\s+rc\s+1 ", (tmp_path / "out/summary.txt").read_text(), re.M)
    assert not (tmp_path / "site").exists()
    subprocess.run(["git", "checkout", "--", "src/matmul_drift/cli/main.py"], cwd=proj, check=True)


def test_an_order_probe_slower_than_an_equal_share_still_finishes_where_the_step_has_time(tmp_path):
    # The orders step as gpu_check.sh defines it, with two probes of 4 s each (a stand-in for
    # matmul-drift order) in a step of 9 s (7 s for the probes): an equal share (3 s) would stop
    # both; the first takes what the second's floor leaves (6 s) and finishes.
    script = (ROOT / "scripts/gpu_check.sh").read_text()
    function = re.search(r"^reveal_orders\(\) \{\n.*?^\}\n", script, re.M | re.S).group(0)
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/started\nsleep 4\n"
                    f"echo \"$*\" >> {tmp_path}/done\n")
    stub.chmod(0o755)
    env = {**os.environ, "PY": str(stub), "STEP_LIMIT": "9", "DEVICE": "cpu", "PACK": str(tmp_path),
           "ORDERS_TEXT": "first:--m 1\nsecond:--m 2"}
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", f"{function}reveal_orders"], env=env, capture_output=True,
                       text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 1 and len((tmp_path / "started").read_text().splitlines()) == 2, p.stderr
    done = (tmp_path / "done").read_text().splitlines()
    assert len(done) == 1 and " order --m 1 --device cpu " in done[0] and took < 9, (done, took)


def test_a_failed_install_starts_no_later_step_and_still_writes_its_summary(tmp_path):
    # An install that fails (here: a commit.json and tree.sha256 that pass, but no wheels; on
    # the GPU machine, pip killed at its 20 s under load) left every later step and every
    # snippet between them to run without asv and this project: each printed a
    # ModuleNotFoundError's traceback into log.txt and spent its time for nothing.
    proj, whl, out = tmp_path / "proj", tmp_path / "whl", tmp_path / "out"
    committed_copy(proj)
    stub = tmp_path / "python"  # stands in for pip: commit.json and tree.sha256 without a wheel
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    p = subprocess.run(["bash", "scripts/fetch_gpu_wheels.sh"], cwd=proj, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHON": str(stub), "WHL_DIR": str(whl)})
    assert p.returncode == 0 and not list(whl.glob("*.whl")), p.stderr
    image_python(tmp_path)
    t0 = time.monotonic()
    run = subprocess.run(["bash", "scripts/gpu_check.sh", str(out), "--rehearse"], cwd=proj, capture_output=True,
                         text=True, env={**image_env(tmp_path, tmp_path), "WHL_DIR": str(whl)}, timeout=300)
    took = time.monotonic() - t0
    log = (out / "log.txt").read_text()
    summary = (out / "summary.txt").read_text()
    lines = re.findall(r"^(\S+)\s+rc\s+(\d+)\s+(\d+) s of\s+(\d+) s(.*)$", summary, re.M)
    assert run.returncode == 1 and [line[0] for line in lines] == [
        "install", "config", "explain", "explain-txt", "suite", "nights", "fixes-batch", "map", "orders", "scan", "dense"], log
    assert lines[0][1] != "0" and all(rest.strip() == "not started: install failed" and (rc, t) == ("124", "0")
                                      for _, rc, t, _, rest in lines[1:]), lines
    assert "Traceback" not in log and "No module named" not in log, log
    assert re.findall(r"^gpu_check: (?:error|warning): .*$", log, re.M) == [
        "gpu_check: error: the install failed (rc 1): no step after it is started"], log  # said once, and nothing else
    assert "11 step(s) failed" in summary and "no machine name: the archive will not import (the install failed" in summary
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        steps = tar.extractfile("./steps.txt").read().decode()
        commit = tar.extractfile("./COMMIT").read().decode().strip()
    assert steps.splitlines() == [line for line in summary.splitlines() if re.match(r"\S+\s+rc ", line)]
    assert commit == json.loads((whl / "commit.json").read_text())["commit"]
    p = _import_script(str(out / "gpu-check.tar.gz"), "--results", str(tmp_path / "results"))
    assert p.returncode == 2 and "is malformed" in p.stderr and p.stderr.count("\n") == 1, p.stderr  # as the summary says
    # pip's refusal and torch's start: a few seconds, where every later step running took far more
    assert took < 30, (took, log)


def _import_script(*args, cwd=None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/import_gpu_check.py"), *args], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def test_an_import_whose_stdout_reader_left_is_whole_and_silent(tmp_path):
    # `import_gpu_check.py ... | head -1`: the files are written before a path is printed;
    # the reader leaving is no error to report, and never a traceback.
    archive = _synthetic_archive(tmp_path, 1, "x")
    r, w = os.pipe()
    os.close(r)
    try:
        p = _import_script(str(archive), "--results", str(tmp_path / "results"), stdout=w)
    finally:
        os.close(w)
    assert p.returncode == 141 and "Traceback" not in p.stderr and "error" not in p.stderr, p.stderr
    again = _import_script(str(archive), "--results", str(tmp_path / "results"))
    assert again.returncode == 0 and again.stdout == "", again.stderr  # everything was imported the first time


def test_import_usage_errors_are_one_line_and_an_empty_results_name_writes_nothing(tmp_path):
    archive = _synthetic_archive(tmp_path, 1, "x")
    work = tmp_path / "work"
    work.mkdir()
    for args, needle in [((), "the following arguments are required: archive"),
                         ((str(archive), "extra"), "unrecognized arguments: extra"),
                         ((str(archive), "--results", ""), "argument --results: needs a folder, got an empty name")]:
        p = _import_script(*args, cwd=work)
        assert p.returncode == 2 and p.stdout == "", p.stderr
        assert p.stderr.splitlines() == [f"import_gpu_check: error: {needle}"], p.stderr
    assert list(work.iterdir()) == []  # '' is not the current folder: nothing lands there
