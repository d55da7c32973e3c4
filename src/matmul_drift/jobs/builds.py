"""The torch builds a bisection measures and the environment of each.

``releases`` lists the versions the package index (pip's, with this machine's pip config)
or a folder of wheels offers; ``select`` takes a range or a list of them. ``environment``
gives a build's interpreter: the main job's asv environment for that build where it exists
(never changed), else one of the cache folder's own, made once: pip resolves (as asvenv.py
does, with this machine's pip config), the free space is checked against what the files
need (store/space.py), uv installs. ``measure`` runs probes/buildpoint.py in a fresh process
of that interpreter, with this code first on its path.

Numbers: sizes in bytes, durations in seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

import matmul_drift
from matmul_drift.jobs import confirm, mainjob
from matmul_drift.store import space

NEEDS = ("numpy", "tabulate")  # what the measuring process imports beside torch
VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")  # a torch version as pip takes it after ==
READY = ".matmul-drift-ready"  # written last: a folder without it is a killed install, made again
MEASURE_TIMEOUT_S = 1800
INSTALL_TIMEOUT_S = 1800


class NotOffered(Exception):
    """A range end the index or folder does not offer; ``below``/``above`` the nearest it does."""

    def __init__(self, version: str, below: str | None, above: str | None, where: str):
        self.version, self.below, self.above, self.where = version, below, above, where
        near = [v for v in (below, above) if v]
        said = (
            "the nearest releases it has are" if len(near) == 2 else "the nearest release it has is"
        )
        super().__init__(
            f"torch {version} is not offered by {where}; {said} {' and '.join(near)}"
            if near
            else f"torch {version} is not offered by {where}, which offers no torch at all"
        )


class Failed(Exception):
    """A build that could not be installed (``stage`` "install"), imported ("import") or
    measured ("measure"): one line."""

    def __init__(self, stage: str, why: str):
        self.stage = stage
        super().__init__(why)


@dataclass
class Env:
    """A build's interpreter; ``how``: "asv" (the main job's environment), "cached" or
    "installed"; ``seconds`` the install's wall time."""

    version: str
    python: Path
    how: str
    seconds: float = 0.0


def _key(text: str):
    try:
        return (0, Version(text))
    except InvalidVersion:
        return (1, text)


def _public(text: str) -> str:
    return text.split("+", 1)[0]


def releases(find_links: Path | None) -> list[str]:
    """The torch versions offered (public versions, a local label such as +cpu dropped, each
    once), oldest first: the wheels in ``find_links`` that this interpreter can install, else
    those ``pip index versions torch`` lists. Failed (stage "list") where pip cannot say."""
    if find_links is not None:

        tags, found = set(sys_tags()), set()
        for f in find_links.iterdir():
            try:
                name, version, _, wtags = parse_wheel_filename(f.name)
            except InvalidWheelFilename:
                continue
            if name == "torch" and wtags & tags:
                found.add(_public(str(version)))
        return sorted(found, key=_key)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "torch"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    m = re.search(r"^Available versions: (.*)$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise Failed("list", f"pip index versions torch: {_last(p.stderr, p.returncode)}")
    return sorted({_public(v.strip()) for v in m.group(1).split(",") if v.strip()}, key=_key)


def select(spec: str, offered: list[str], where: str) -> list[str]:
    """The builds of ``spec``: "A..B" every offered release from A to B (both offered), or
    "A,B,C" those builds as named, in that order. NotOffered for a range end the list lacks;
    ValueError for a spec that is neither."""
    if ".." in spec:
        ends = [e.strip() for e in spec.split("..")]
        if len(ends) != 2 or not all(VERSION.match(e) for e in ends):
            raise ValueError(f"{spec!r} is not a range A..B")
        for end in ends:
            if _public(end) not in offered:
                below = [v for v in offered if _key(v) < _key(end)]
                above = [v for v in offered if _key(v) > _key(end)]
                raise NotOffered(
                    end, below[-1] if below else None, above[0] if above else None, where
                )
        lo, hi = sorted((_key(_public(e)) for e in ends))
        return [v for v in offered if lo <= _key(v) <= hi]
    builds = [b.strip() for b in spec.split(",") if b.strip()]
    bad = [b for b in builds if not VERSION.match(b)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a version")
    if not builds:
        raise ValueError(f"{spec!r} names no torch version")
    if len(set(builds)) != len(builds):
        raise ValueError(f"{spec!r} names a build twice")
    return builds


def source_name(find_links: Path | None) -> str:
    """Where the builds come from, in words."""
    return f"the folder {find_links}" if find_links is not None else "the package index"


def _folder(cache: Path, version: str, find_links: Path | None) -> Path:
    """A build's own environment: one per version and source (a folder's wheels are not the
    index's)."""
    tag = (
        "index"
        if find_links is None
        else hashlib.sha256(str(find_links.resolve()).encode()).hexdigest()[:12]
    )
    return cache / "envs" / f"torch-{version}-{tag}"


def asv_python(repo: Path | None, version: str) -> Path | None:
    """The interpreter of the main job's asv environment for ``version``, where it exists."""
    if repo is None:
        return None
    try:
        conf = mainjob.build_config(
            repo, mainjob.project_config(repo), version, repo / ".asv" / "unused"
        )
        python = confirm.env_python(repo, conf, mainjob.env_name(conf))
    except Exception:  # no project here, or a config asv cannot read: make one of the cache's own
        return None
    return python if python.exists() else None


def environment(
    version: str,
    cache: Path,
    find_links: Path | None,
    repo: Path | None,
    log,
    free: int | None = None,
) -> Env:
    """``version``'s interpreter (see the module docstring); Failed ("install") where pip or
    uv cannot install it, space.NoSpace before any install the free space cannot hold.
    ``free``: the free bytes to take instead of the file system's."""
    python = asv_python(repo, version) if find_links is None else None
    if python is not None:
        return Env(version, python, "asv")
    folder = _folder(cache, version, find_links)
    if (folder / READY).exists():
        return Env(version, folder / "bin" / "python", "cached")
    t0 = time.monotonic()
    if folder.exists():  # an install killed half-way
        log(f"torch {version}: removing the half-made {folder}")
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    from matmul_drift.jobs.asvenv import UvFailed, sizes, uv_path  # here: asv, 0.8 s

    lines = _resolve(version, folder.parent / f"{folder.name}.pip-report.json", find_links)
    space.check(folder.parent, space.needed(sizes(lines)), f"torch {version}", free)
    log(f"torch {version}: installing {len(lines)} packages into {folder}")
    try:
        uv = uv_path()
    except UvFailed as exc:
        raise Failed("install", str(exc)) from None
    reqs = folder.parent / f"{folder.name}.requirements.txt"
    reqs.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for args in (
        ["venv", "--quiet", "--python", sys.executable, str(folder)],
        [
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--python",
            str(folder / "bin" / "python"),
            "-r",
            str(reqs),
        ],
    ):
        p = subprocess.run([uv, *args], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if p.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            raise Failed("install", f"uv {args[0]}: {_last(p.stderr, p.returncode)}")
    (folder / READY).write_text(version + "\n", encoding="utf-8")
    return Env(version, folder / "bin" / "python", "installed", time.monotonic() - t0)


def _resolve(version: str, report: Path, find_links: Path | None) -> list[str]:
    """uv's requirement line for each file pip would install for torch==version and NEEDS;
    Failed ("install") where pip cannot say."""
    from matmul_drift.jobs.asvenv import UvFailed, pinned  # here: asv, 0.8 s

    args = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        f"torch=={version}",
        *NEEDS,
    ]
    args += ["--find-links", str(find_links)] if find_links is not None else []
    p = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if p.returncode != 0:
        raise Failed("install", f"pip: {_last(p.stderr, p.returncode)}")
    try:
        return pinned(str(report))
    except UvFailed as exc:
        raise Failed("install", str(exc)) from None
    finally:
        report.unlink(missing_ok=True)


def _last(stderr: str, rc: int) -> str:
    """The line that says why: pip's (mainjob.pip_why), else the last error line, else the last
    line, else the exit status."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and "is ignored" not in ln]
    errors = [ln for ln in lines if ln.startswith("error:")]
    return mainjob.pip_why(lines) or (errors or lines or [f"exit status {rc}"])[-1]


def code_path(cache: Path) -> Path:
    """A folder holding this code's package alone (a link), for the measuring process's path:
    the installed package's site-packages would bring this interpreter's torch with it."""
    folder = cache / "code"
    folder.mkdir(parents=True, exist_ok=True)
    link, target = folder / "matmul_drift", Path(matmul_drift.__file__).resolve().parent
    if not link.is_symlink() or link.resolve() != target:
        tmp = folder / f".matmul_drift.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    return folder


def measure(env: Env, product: dict, code: Path, timeout: float = MEASURE_TIMEOUT_S) -> dict:
    """probes/buildpoint.py's answer for ``product`` from a fresh process of ``env``; Failed
    ("import" or "measure") where it has none."""
    envvars = {
        **os.environ,
        "PYTHONPATH": str(code),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
    }
    try:
        p = subprocess.run(
            [str(env.python), "-m", "matmul_drift.probes.buildpoint", json.dumps(product)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=envvars,
        )
    except subprocess.TimeoutExpired:
        raise Failed("measure", f"no answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise Failed("import", f"cannot start {env.python}: {exc.strerror or exc}") from None
    try:
        got = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = None
    if isinstance(got, dict) and got.get("failed") == "import":
        raise Failed("import", got["why"])
    if p.returncode != 0 or not isinstance(got, dict) or "bits_id" not in got:
        raise Failed("measure", _last(p.stderr, p.returncode))
    return got
