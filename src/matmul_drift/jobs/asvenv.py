"""asv's virtualenv, its requirements put in place by uv: pip decides what, uv installs it.

asv.conf.json loads this plugin ("plugins") and names its environment type. pip, as asv would
run it with this machine's pip config (wheel store, indexes, constraints), resolves the
matrix's requirements into exact files (``pip install --dry-run --upgrade --report``); uv
installs those files and nothing else (``--no-deps``), linked from its cache, compiled to
bytecode as pip would. Where uv is missing or fails, the environment is made again by asv's
own pip route, and the log says why.
docs/performance.md has the figures.

The environment keeps the name asv's virtualenv gives it: results files and the history are
keyed by that name.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from urllib.parse import unquote, urlparse

from asv import config, environment, util
from asv.console import log
from asv.plugins import virtualenv

from matmul_drift.store import space


def environments(conf: dict) -> list:
    """asv's environments for the config ``conf`` (a dict, paths absolute), this plugin's type
    known to asv; asv's RuntimeError, UserError or EnvironmentUnavailable where it cannot."""
    return list(environment.get_environments(config.Config.from_json(conf), None, verbose=False))


class UvFailed(Exception):
    """uv could not install what pip resolved: one line."""


class UvVirtualenv(virtualenv.Virtualenv):
    tool_name = "virtualenv-uv"
    _pip_only = False

    @property
    def name(self):
        python = self._python[2:] if self._python.startswith("pypy") else self._python
        return environment.get_env_name(virtualenv.Virtualenv.tool_name, python, self._requirements,
                                        self._tagged_env_vars)

    def _setup(self):
        try:
            super()._setup()
        except UvFailed as exc:
            log.warning(f"{exc}; making {self.name} again with pip")
            util.long_path_rmtree(self._path)
            self._pip_only = True
            super()._setup()

    def _install_requirements(self):
        specs = self._specs()
        if self._pip_only or specs is None:
            return super()._install_requirements()
        t0 = time.monotonic()
        report = os.path.join(self._path, "asv-pip-report.json")
        env = {**os.environ, **self.build_env_vars}
        # pip's verdict (no such torch, no network) fails the environment as asv's route would
        self._run_pip(["install", "--dry-run", "--upgrade", "--quiet", "--report", report, *specs],
                      env=env)
        lines = pinned(report)
        _check_space(self._path, lines)
        t1 = time.monotonic()
        uv = uv_path()
        python = os.path.join(self._path, "bin", "python")
        reqs = os.path.join(self._path, "asv-uv-requirements.txt")
        with open(reqs, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        try:
            # bytecode as pip's route writes it: without it, under PYTHONDONTWRITEBYTECODE (set on
            # this project's machines) every benchmark process would compile torch again
            p = subprocess.run([uv, "pip", "install", "--quiet", "--no-deps", "--compile-bytecode",
                                "--python", python, "-r", reqs],
                               env=env, capture_output=True, text=True,
                               timeout=self._install_timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UvFailed(f"uv pip install: {exc}") from None
        if p.returncode != 0:
            raise UvFailed(
                "uv pip install: "
                f"{(p.stderr.strip().splitlines() or ['exit status %d' % p.returncode])[-1]}")
        log.info(f"pip resolved {len(lines)} packages in {t1 - t0:.1f} s; uv installed them in "
                 f"{time.monotonic() - t1:.1f} s")

    def _specs(self) -> list[str] | None:
        """The matrix's requirements as pip takes them, or None where one is more than a name and
        a version (a path, a URL, pip flags): those take asv's own route."""
        specs = ["wheel"]
        for key, val in {**self._requirements, **self._base_requirements}.items():
            d = util.ParsedPipDeclaration(f"{key[4:] if key.startswith('pip+') else key} {val}")
            if d.flags or d.path or d.is_editable or not d.pkgname:
                return None
            specs.append(d.pkgname + (d.specification or ""))
        return specs


def _check_space(path: str, lines: list[str]) -> None:
    """One line in asv's log, and the environment failed, where the free space cannot hold
    what pip resolved (store/space.py): before uv writes a byte, not "No space left" later."""
    try:
        space.check(os.path.dirname(path), space.needed(sizes(lines)), "it")
    except space.NoSpace as exc:
        log.error(f"matmul-drift: {exc}")
        raise


def sizes(lines: list[str]) -> list[tuple[str, int | None]]:
    """(name, bytes) of each ``pinned`` line's file: its size where it is a local file, else
    None."""
    out = []
    for line in lines:
        name, _, rest = line.partition(" @ ")
        url = urlparse(rest.split(" --hash")[0])
        local = unquote(url.path) if url.scheme == "file" else ""
        out.append((name, os.path.getsize(local) if local and os.path.isfile(local) else None))
    return out


def uv_path() -> str:
    try:
        from uv import find_uv_bin  # optional: pip makes the environment where uv is missing

        return find_uv_bin()
    except (ImportError, FileNotFoundError) as exc:
        raise UvFailed(f"no uv ({exc})") from None


def pinned(report: str) -> list[str]:
    """``name @ url --hash=...`` for each file pip's report would install; UvFailed where pip
    would build something (a folder or a repository) rather than install a file."""
    with open(report, encoding="utf-8") as f:
        items = json.load(f).get("install", [])
    out = []
    for item in items:
        info = item.get("download_info", {})
        if "archive_info" not in info:
            raise UvFailed(f"pip would install {info.get('url')} from a folder or a repository")
        hashes = info["archive_info"].get("hashes", {})
        line = f"{item['metadata']['name']} @ {info['url']}"
        out.append(line + (f" --hash=sha256:{hashes['sha256']}" if "sha256" in hashes else ""))
    return out
