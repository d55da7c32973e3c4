"""The README and docs/ stay true to the tree: every module is in the README's layout, and
every test the docs cite as proof exists."""

from __future__ import annotations

import re
from pathlib import Path

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
