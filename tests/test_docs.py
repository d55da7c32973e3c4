"""The README and docs/ stay true to the tree: every module is in the README's layout, every
test the docs cite as proof exists, and every script says what it does when asked (--help)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_module_is_in_the_readmes_layout():
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    modules = {p.stem for p in (ROOT / "src" / "matmul_drift").glob("*.py")} - {"__init__"}
    assert modules, "no modules found"
    missing = sorted(m for m in modules if f"`{m}`" not in layout)
    assert not missing, f"modules the README's layout does not name: {missing}"


def test_every_test_the_docs_cite_exists():
    defined = {m for p in (ROOT / "tests").glob("test_*.py")
               for m in re.findall(r"^def (test_\w+)", p.read_text(), re.M)}
    cited = {(doc.name, t) for doc in DOCS for t in re.findall(r"`(test_\w+)`", doc.read_text())}
    assert cited, "the docs cite no test"
    assert not [c for c in cited if c[1] not in defined], f"cited tests that do not exist: {sorted(c for c in cited if c[1] not in defined)}"


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.py")))
def test_every_script_answers_help_without_running(script):
    """`--help` prints the script's docstring and exits 0: the benchmarks run for minutes, and
    four of them once took --help as nothing and ran in full."""
    path = ROOT / "scripts" / script
    first = " ".join(ast.get_docstring(ast.parse(path.read_text())).split()[:5])
    p = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and first in " ".join(p.stdout.split()), (p.returncode, p.stdout[-500:], p.stderr[-500:])
