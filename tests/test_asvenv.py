"""asv's environments as the project's config makes them (jobs/asvenv.py): pip resolves, uv
installs. Real asv, pip and uv on a small matrix (tabulate), so each environment takes seconds;
the torch builds go through the same route in test_mainjob.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkout import ROOT

from matmul_drift.jobs import asvenv, confirm, mainjob

REQ = {"tabulate": ["0.9.0"], "wheel": [""]}


def _env(tmp_path: Path, env_type: str, matrix: dict = REQ):
    """The one environment of a config like the project's, with ``matrix``, made in ``tmp_path``."""
    from asv import config, environment
    from asv.console import log

    conf = {**mainjob.project_config(ROOT), "environment_type": env_type, "matrix": {"req": matrix},
            "env_dir": str(tmp_path / "env"), "repo": str(ROOT)}
    (e,) = environment.get_environments(config.Config.from_json(conf), None, verbose=False)
    log.enable(verbose=False)
    e.create()
    return conf, e


def _installed(e) -> dict[str, str]:
    """{distribution: version} in the environment, by its own interpreter."""
    out = e.run(["-c", "import importlib.metadata as m, json; "
                       "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"])
    return json.loads(out)


def test_uv_installs_what_pip_resolves_and_the_environment_keeps_virtualenvs_name(tmp_path):
    _, plain = _env(tmp_path / "plain", "virtualenv")
    conf, by_uv = _env(tmp_path / "uv", "virtualenv-uv")
    assert type(by_uv) is asvenv.UvVirtualenv and by_uv.name == plain.name
    assert by_uv.dir_name != plain.dir_name  # each type its own folder: neither remakes the other's
    # the same distributions at the same versions as asv's own pip route, the matrix's pin held
    assert _installed(by_uv) == _installed(plain)
    assert _installed(by_uv)["tabulate"] == "0.9.0"
    # compiled as pip's route compiles: under PYTHONDONTWRITEBYTECODE an import writes none
    for e in (plain, by_uv):
        assert list(Path(e._path).glob("lib/python*/site-packages/tabulate/__pycache__/__init__.*.pyc")), e._path
    lines = (Path(by_uv._path) / "asv-uv-requirements.txt").read_text().splitlines()
    assert any(ln.startswith("tabulate @ ") and "--hash=sha256:" in ln for ln in lines), lines
    # the timing-confirmation step finds the interpreter of this environment by its name
    assert confirm.env_python(tmp_path / "uv", conf, by_uv.name) == Path(by_uv._path) / "bin" / "python"
    assert confirm.env_python(tmp_path, {}, "x") == tmp_path / ".asv/env" / "9dd4e461268c8034f5c8564e155c67a6/bin/python"


def test_where_uv_fails_pip_makes_the_environment_again_and_says_why(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "not-a-folder"
    bad.write_text("")  # uv cannot keep its cache in a file
    monkeypatch.setenv("UV_CACHE_DIR", str(bad / "cache"))
    _, e = _env(tmp_path, "virtualenv-uv")
    assert _installed(e)["tabulate"] == "0.9.0"
    assert not (Path(e._path) / "asv-uv-requirements.txt").exists()  # the folder was made afresh
    err = capsys.readouterr()
    said = err.out + err.err
    assert "uv pip install:" in said and "making " + e.name + " again with pip" in said, said


def test_a_requirement_pip_cannot_find_fails_the_environment_as_asvs_route_does(tmp_path):
    from asv import util

    with pytest.raises(util.ProcessError) as exc:
        _env(tmp_path, "virtualenv-uv", {"tabulate": ["0.0.0.404"]})
    assert "No matching distribution found for tabulate==0.0.0.404" in exc.value.stderr, exc.value.stderr[-2000:]
    assert not list((tmp_path / "env").iterdir())  # asv removes the half-made folder
