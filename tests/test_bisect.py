"""`matmul-drift bisect` (jobs/bisect.py, jobs/builds.py, probes/buildpoint.py) over fake torch
builds (tests/fake_builds.py): real wheels in a find-links folder that pip lists and uv installs,
each the installed torch under route variables; the setting that changes the product's bits on
this machine is measured first, never assumed. Real pip, uv and fresh processes; no torch
download. The free space is injected as a figure ($MATMUL_DRIFT_FREE_BYTES or ``free``)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fake_builds
import pytest

from matmul_drift.jobs import asvenv, bisect, builds, mainjob
from matmul_drift.store import space

PRODUCT = {
    "m": 16,
    "k": 256,
    "n": 16,
    "dtype": "float32",
    "device": "cpu",
    "slice_n": [15],
    "slice_m": [1],
    "orders": True,
}
SHAPE = ["--m", "16", "--k", "256", "--n", "16", "--dtype", "float32"]
CANDIDATES = (
    {"MKL_CBWR": "COMPATIBLE"},
    {"MKL_CBWR": "AVX2"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"MKL_CBWR": "SSE4_2"},
)


# --- the search, without torch ------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 64])
def test_a_bisection_finds_every_change_point_within_log2_plus_two_builds(n):
    for change in range(1, n):
        asked = []

        def digest(i):
            asked.append(i)
            return "b" if i >= change else "a"

        got = bisect.search(n, digest)
        assert (got["before"], got["after"], got["agree"]) == (change - 1, change, False), (
            n,
            change,
        )
        assert len(set(asked)) <= bisect.expected(n) <= math.ceil(math.log2(n)) + 2


def test_a_skipped_build_is_stepped_around_and_ends_move_inward():
    seen = {0: None, 1: "a", 2: "a", 3: None, 4: "b", 5: "b", 6: None}
    got = bisect.search(7, seen.get)
    assert (got["start"], got["end"], got["before"], got["after"]) == (
        1,
        5,
        2,
        4,
    )  # 3 skipped between
    assert bisect.search(3, {0: "a", 1: None, 2: "a"}.get)["agree"] is True
    assert bisect.search(3, {0: None, 1: None, 2: "a"}.get)["end"] is None


def test_ranges_take_what_is_offered_and_a_missing_end_names_the_nearest():
    offered = ["2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.12.1"]
    assert builds.select("2.9.0..2.12.1", offered, "x") == ["2.9.0", "2.9.1", "2.10.0", "2.12.1"]
    assert builds.select("2.12.1..2.9.0", offered, "x") == ["2.9.0", "2.9.1", "2.10.0", "2.12.1"]
    assert builds.select("2.12.1,2.8.0", offered, "x") == ["2.12.1", "2.8.0"]
    with pytest.raises(builds.NotOffered, match="nearest releases it has are 2.10.0 and 2.12.1"):
        builds.select("2.8.0..2.11.0", offered, "the index")
    with pytest.raises(builds.NotOffered, match="nearest release it has is 2.12.1$"):
        builds.select("2.8.0..2.14.1", offered, "the index")
    for bad in ("2.8.0..", "2.8.0,x;y", "..2.9.0", "2.8.0,2.8.0"):
        with pytest.raises(ValueError):
            builds.select(bad, offered, "x")


# --- fake builds -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def change() -> dict:
    """A setting that changes this product's bits here, measured in fresh processes."""
    base = fake_builds.point({**PRODUCT, "orders": False}, {})["bits_id"]
    for env in CANDIDATES:
        if fake_builds.point({**PRODUCT, "orders": False}, env)["bits_id"] != base:
            return env
    pytest.skip(f"none of {CANDIDATES} changes the bits of {PRODUCT} on this CPU")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory, change) -> Path:
    """2.8.0, 2.9.0, 2.10.0 as installed; 2.11.0, 2.12.0 under the setting that changes the bits;
    2.7.0 a wheel that is no zip (cannot be installed), 2.7.5 one whose import fails."""
    folder = fake_builds.make(
        tmp_path_factory.mktemp("wheels"),
        {"2.7.5": None, "2.8.0": {}, "2.9.0": {}, "2.10.0": {}, "2.11.0": change, "2.12.0": change},
    )
    (folder / "torch-2.7.0-py3-none-any.whl").write_bytes(b"not a zip")
    return folder


def _env(tmp_path: Path, **extra) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # pip's and uv's download caches go under this HOME; the index is left out: the folder only
    return {
        **env,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PIP_NO_INDEX": "1",
        **extra,
    }


def _command(tmp_path: Path, wheels: Path, *args: str) -> list[str]:
    """matmul-drift bisect of SHAPE over the fake builds in ``wheels``, its cache in tmp_path."""
    return [sys.executable, "-m", "matmul_drift.cli", "bisect", *SHAPE, "--find-links",
            str(wheels), "--cache", str(tmp_path / "cache"), *args]


def _bisect(tmp_path: Path, wheels: Path, *args: str, **extra) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        _command(tmp_path, wheels, *args),
        capture_output=True,
        text=True,
        cwd=work,
        env=_env(tmp_path, **extra),
        timeout=900,
    )


def _tree(root: Path, skip: tuple[Path, ...]) -> dict:
    return {
        str(p): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if not any(p == s or s in p.parents for s in skip)
    }


def _measured(stderr: str) -> list[str]:
    """The builds a run measured, from its progress lines ("torch 2.9.0: bits ... in 4 s")."""
    return [ln.split()[3].rstrip(":") for ln in stderr.splitlines() if ": bits " in ln]


def test_a_bisection_finds_the_first_changed_build_and_an_interrupted_one_resumes(
    tmp_path, wheels, change
):
    site = Path(sys.executable).parent.parent
    for d in ("work", "home"):
        (tmp_path / d).mkdir()
    outside = (
        tmp_path / "cache",
        tmp_path / "home",
    )  # HOME: pip's and uv's own caches and settings
    before, venv_before = _tree(tmp_path, outside), _tree(site, ())
    cmd = _command(tmp_path, wheels, "--torch", "2.8.0..2.12.0", "--json")
    p = subprocess.Popen(
        cmd,
        cwd=tmp_path / "work",
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    states = tmp_path / "cache" / "bisections"
    end = time.monotonic() + 600
    while time.monotonic() < end and p.poll() is None:  # killed once its first build is recorded
        got = [json.loads(f.read_text()) for f in states.glob("*.json")] if states.exists() else []
        if got and got[0]["points"]:
            p.kill()
            break
        time.sleep(0.05)
    _, err1 = p.communicate()
    assert p.returncode == -signal.SIGKILL, err1
    assert _measured(err1) in ([], ["2.8.0"])  # killed after its state and maybe before its line

    again = _bisect(tmp_path, wheels, "--torch", "2.8.0..2.12.0")
    assert again.returncode == 2 and "pass --resume to go on with it" in again.stderr, again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    r = _bisect(tmp_path, wheels, "--torch", "2.8.0..2.12.0", "--resume", "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["schema"] == bisect.SCHEMA and report["mode"] == "bisect"
    v = report["verdict"]
    assert (v["kind"], v["first_changed"], v["before"], v["start"]) == (
        "changed",
        "2.11.0",
        "2.10.0",
        "2.8.0",
    )
    assert "2.8.0" not in _measured(r.stderr)  # measured once, before the kill
    assert sorted(report["measured"]) == [
        "2.10.0",
        "2.11.0",
        "2.12.0",
        "2.8.0",
    ]  # both ends, then 2 steps
    assert len(report["measured"]) <= math.log2(5) + 2
    pts = report[
        "points"
    ]  # the steps measured the digests alone; the pair again in full, to the same bits
    assert [pts[b]["detail"] for b in ("2.8.0", "2.10.0", "2.11.0", "2.12.0")] == [
        False,
        True,
        True,
        False,
    ]
    assert not [b for b, p in pts.items() if "unsteady" in p]
    assert pts["2.11.0"]["order"]["order_id"] and pts["2.11.0"]["kernels"]["full"]
    pair = report["pair"]
    assert pair["differs"][0] == "bits" and "torch settings" in pair["differs"]
    key, val = next(iter(change.items()))
    assert pair["repro"]["2.11.0"].startswith(
        f"pip install --find-links {wheels} torch==2.11.0 && {key}={val} "
    )
    assert report["points"]["2.11.0"]["env_vars"][key] == val

    assert _tree(tmp_path, outside) == before  # nothing outside the cache folder changed

    assert _tree(site, ()) == venv_before
    made = sorted(
        d.name.split("-")[1] for d in (tmp_path / "cache" / "envs").iterdir() if d.is_dir()
    )
    assert made == ["2.10.0", "2.11.0", "2.12.0", "2.8.0"]

    words = _bisect(
        tmp_path, wheels, "--torch", "2.8.0..2.12.0", "--resume"
    )  # every build from the state
    assert words.returncode == 1 and _measured(words.stderr) == []
    assert (
        "first build whose bits differ from torch 2.8.0: 2.11.0 (the one before: 2.10.0)"
        in words.stdout
    )
    assert "repro (before, torch 2.10.0): pip install" in words.stdout


def test_builds_that_fail_to_install_or_import_are_skipped_and_reported(tmp_path, wheels):
    r = _bisect(tmp_path, wheels, "--torch", "2.7.0,2.8.0,2.7.5,2.11.0", "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    skipped = {s["build"]: s["stage"] for s in report["skipped"]}
    assert skipped == {"2.7.0": "install", "2.7.5": "import"}
    v = report["verdict"]
    assert (v["start"], v["first_changed"], v["before"], v["skipped_between"]) == (
        "2.8.0",
        "2.11.0",
        "2.8.0",
        ["2.7.5"],
    )
    words = _bisect(tmp_path, wheels, "--torch", "2.7.0,2.8.0,2.7.5,2.11.0", "--resume")
    assert (
        "skipped torch 2.7.5: could not be imported: ImportError: "
        "this fake build is broken on purpose" in words.stdout
    )
    assert "skipped torch 2.7.0: could not be installed: pip: " in words.stdout
    assert "2.7.5 between them could not be measured" in words.stdout


def test_ends_that_agree_cannot_be_bisected_and_all_prints_every_digest(tmp_path, wheels):
    r = _bisect(tmp_path, wheels, "--torch", "2.8.0,2.11.0,2.9.0")
    assert r.returncode == 0, r.stderr
    assert (
        "a history that changes and changes back cannot be bisected; --all measures every build"
        in r.stdout
    )
    assert sorted(_measured(r.stderr)) == ["2.8.0", "2.9.0"]
    r = _bisect(tmp_path, wheels, "--torch", "2.8.0,2.11.0,2.9.0", "--all", "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    ids = {b: p["bits_id"] for b, p in report["points"].items()}
    assert (
        list(ids) == ["2.8.0", "2.11.0", "2.9.0"] and ids["2.8.0"] == ids["2.9.0"] != ids["2.11.0"]
    )
    assert report["verdict"]["changes"] == [
        {"before": "2.8.0", "after": "2.11.0"},
        {"before": "2.11.0", "after": "2.9.0"},
    ]
    words = _bisect(tmp_path, wheels, "--torch", "2.8.0,2.11.0,2.9.0", "--all", "--resume")
    for b, digest in ids.items():
        assert any(ln.split()[:2] == [b, digest] for ln in words.stdout.splitlines()), words.stdout
    assert "further changes: 2.11.0 -> 2.9.0" in words.stdout


def test_bad_ends_a_product_too_large_and_a_full_disk_are_one_line_before_any_install(
    tmp_path, wheels
):
    r = _bisect(tmp_path, wheels, "--torch", "2.8.5..2.12.0")
    assert r.returncode == 2 and r.stderr.strip() == (
        "matmul-drift bisect: error: --torch 2.8.5..2.12.0: "
        f"torch 2.8.5 is not offered by the folder {wheels}; "
        "the nearest releases it has are 2.8.0 and 2.9.0"
    ), r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "matmul_drift.cli",
            "bisect",
            "--m",
            "200000",
            "--k",
            "200000",
            "--n",
            "200000",
            "--dtype",
            "float64",
            "--torch",
            "2.8.0..2.12.0",
            "--find-links",
            str(wheels),
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "needs" in r.stderr and len(r.stderr.strip().splitlines()) == 1, (
        r.stderr
    )
    assert not (tmp_path / "cache").exists()
    r = _bisect(tmp_path, wheels, "--torch", "2.8.0..2.9.0", MATMUL_DRIFT_FREE_BYTES="1000")
    assert r.returncode == 2, r.stderr
    assert re.fullmatch(
        r"matmul-drift bisect: error: no room to install torch 2.8.0: it needs about \d+ kB and "
        r"\S+ has 1 kB free; free some space, then run again with --resume .*",
        r.stderr.strip().splitlines()[-1],
    ), r.stderr
    assert not list((tmp_path / "cache" / "envs").glob("torch-*/bin")), "nothing installed"


def test_the_free_space_check_takes_the_wheels_sizes_or_what_a_build_needs():
    assert space.needed([("torch", 10**9), ("numpy", 10**7)]) == 3 * (10**9 + 10**7)
    assert space.needed([("torch", None), ("nvidia-cublas", None)]) == space.CUDA_BUILD_BYTES
    assert space.needed([("torch", 10**8), ("numpy", None)]) == space.CPU_BUILD_BYTES
    space.check("/", 10**9, "x", free=2 * 10**9)
    with pytest.raises(
        space.NoSpace,
        match=r"^no room to install torch 2.14.1: it needs about 5.0 GB and /x has "
        r"1.2 GB free$",
    ):
        space.check("/x", space.CUDA_BUILD_BYTES, "torch 2.14.1", free=12 * 10**8)


def test_the_main_jobs_install_is_refused_in_one_line_before_uv_writes(tmp_path, monkeypatch):
    """asv's environment, made as the main job makes it (tabulate only), with 1.2 GB free."""
    from asv import config, environment
    from asv.console import log
    from checkout import ROOT

    monkeypatch.setenv(space.FREE_VAR, "1000")
    conf = {
        **mainjob.project_config(ROOT),
        "environment_type": asvenv.UvVirtualenv.tool_name,
        "matrix": {"req": {"tabulate": ["0.9.0"], "wheel": [""]}},
        "env_dir": str(tmp_path / "env"),
        "repo": str(ROOT),
    }
    (e,) = environment.get_environments(config.Config.from_json(conf), None, verbose=False)
    log.enable(verbose=False)
    with pytest.raises(space.NoSpace):
        e.create()
    assert not Path(e._path).exists()
    logfile = tmp_path / "asv.log"
    logfile.write_text(
        f"·· Failure creating environment for {e.name}\n"
        "·· matmul-drift: no room to install it: "
        "it needs about 2.0 GB and /x has 1.2 GB free\nERROR: No space left on device\n"
    )
    assert (
        mainjob._install_error(logfile)
        == "no room to install it: it needs about 2.0 GB and /x has 1.2 GB free"
    )


def test_pips_rich_error_gives_the_failed_installs_one_line(tmp_path):
    # pip's rich errors carry no "ERROR: ": a download cut short printed "error:
    # incomplete-download" and "× Download failed ...", and the line said only "Failure creating
    # environment". Real pip here: a package whose metadata cannot be made, no index.
    pkg = tmp_path / "broken"
    pkg.mkdir()
    (pkg / "setup.py").write_text("raise SystemExit('no build here')\n")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                        str(pkg)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "ERROR: " not in p.stdout + p.stderr
    logfile = tmp_path / "asv.log"
    logfile.write_text("·· Failure creating environment for existing-py\n"  # asv's lines
                       + "".join(f"·· {line}\n" for line in (p.stdout + p.stderr).splitlines()))
    why = mainjob._install_error(logfile)
    assert why.startswith("cannot make its environment: pip: ") and why.endswith(
        "did not run successfully."), why


WHEELS_VAR = "MATMUL_DRIFT_TORCH_WHEELS"  # a folder of real torch wheels (two builds or more)


@pytest.mark.skipif(
    not os.environ.get(WHEELS_VAR), reason=f"${WHEELS_VAR} names no folder of real torch wheels"
)
def test_real_builds_from_a_wheel_folder_are_installed_and_each_measures_its_own_torch(tmp_path):
    """Real torch builds installed by pip and uv from the folder (numpy and tabulate from the
    index), each measured under its own torch: `--all` over every build the folder offers."""
    folder = Path(os.environ[WHEELS_VAR])
    offered = builds.releases(folder)
    assert len(offered) >= 2, f"{folder} offers {offered}"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "matmul_drift.cli",
            "bisect",
            *SHAPE,
            "--torch",
            f"{offered[0]}..{offered[-1]}",
            "--find-links",
            str(folder),
            "--cache",
            str(tmp_path / "cache"),
            "--all",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=3600,
    )
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    assert report["skipped"] == [] and list(report["points"]) == offered
    for version, p in report["points"].items():
        assert p["torch"].split("+")[0] == version and p["environment"] == "installed"


def test_the_main_jobs_asv_environment_is_used_where_it_exists_and_left_as_it_is(tmp_path):
    """The interpreter asv's environment for a build would have (the main job's name for it),
    here a link to this one: taken as it is, nothing installed, nothing written there."""
    from checkout import ROOT

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "asv.conf.json").write_text((ROOT / "asv.conf.json").read_text())
    (repo / "benchmarks").mkdir()
    assert builds.asv_python(repo, "2.13.0") is None  # not made yet
    conf = mainjob.build_config(repo, mainjob.project_config(repo), "2.13.0", repo / "x")
    from matmul_drift.jobs import confirm

    path = confirm.env_python(repo, conf, mainjob.env_name(conf))
    path.parent.mkdir(parents=True)
    path.symlink_to(sys.executable)
    before = _tree(repo, ())
    env = builds.environment(
        "2.13.0", tmp_path / "cache", None, repo, print, free=0
    )  # no room: none needed
    assert (env.how, env.python) == ("asv", path)
    assert _tree(repo, ()) == before and not (tmp_path / "cache").exists()
