"""The package's layers (pyproject.toml's import-linter contracts) hold, and each contract
catches the break it names: lint-imports run on the package as it is, then on copies with one
import added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"
LINT = str(Path(sys.executable).with_name("lint-imports"))


def lint(src: Path) -> subprocess.CompletedProcess:
    """lint-imports over the package under ``src``, found first on the path."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([LINT, "--config", str(CONFIG), "--no-cache"], cwd=src, env=env,
                          capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    p = lint(ROOT / "src")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    assert "Contracts: 5 kept, 0 broken." in p.stdout, p.stdout[-3000:]


@pytest.mark.parametrize("module,line,broken", [
    ("read/history.py", "import torch", "read/ never imports torch"),
    ("read/summary.py", "from matmul_drift.measure import memory", "read/ never imports torch"),
    ("store/catalog.py", "from matmul_drift.jobs import asvrun", "Each layer imports only the layers below it"),
    ("probes/scan.py", "from matmul_drift.read import summary", "Each layer imports only the layers below it"),
    ("core/words.py", "import torch", "store/ and core/ never import torch"),
    ("probes/interrupt.py", "from matmul_drift.probes import fixfind", "No import cycles"),
    ("cli/catalog.py", "import numpy", "cli/ parses and prints"),
])
def test_a_broken_layer_is_caught(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "src" / "matmul_drift", tmp_path / "matmul_drift",
                    ignore=shutil.ignore_patterns("__pycache__", "site_vendor"))
    path = tmp_path / "matmul_drift" / module
    path.write_text(path.read_text() + f"\n{line}  # added by the test\n")
    p = lint(tmp_path)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr
    assert f"{broken}" in p.stdout and "BROKEN" in p.stdout.split(broken, 1)[1].splitlines()[0], p.stdout[-3000:]
