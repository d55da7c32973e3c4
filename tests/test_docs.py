"""The README and docs/ stay true to the tree: every layer is in the README's layout and every
module in docs/design.md, every test the docs cite as proof exists, and every script says what
it does when asked (--help)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_layer_is_in_the_readmes_layout_and_every_module_in_the_design():
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    package = ROOT / "src" / "matmul_drift"
    layers = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    assert len(layers) >= 7, layers
    assert not [x for x in layers if f"`{x}/`" not in layout], f"layers the README's layout does not name: {layers}"
    modules = {f"{p.parent.name}/{p.name}" for x in layers for p in (package / x).glob("*.py")
               if not p.name.startswith("__")}
    design = (ROOT / "docs" / "design.md").read_text().split("### Modules", 1)[1].split("\n## ", 1)[0]
    missing = sorted(m for m in modules if f"`{m}`" not in design)
    assert not missing, f"modules docs/design.md's module table does not name: {missing}"
    stale = sorted(set(re.findall(r"`([a-z]+/[a-z_]+\.py)`", design)) - modules)
    assert not stale, f"modules docs/design.md names that do not exist: {stale}"


def test_the_readmes_command_list_is_cli_mains():
    """One line per command in the README's "Commands", in cli/main.py's order, and no other."""
    from matmul_drift.cli.main import COMMANDS

    section = (ROOT / "README.md").read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `matmul-drift ([a-z]+)`", section, re.M)
    assert listed == list(COMMANDS), (listed, list(COMMANDS))


def test_the_readmes_first_screen_installs_shows_real_output_and_answers_the_seed(committed_results):
    """Within 45 lines: the install line, the first commands, a sample of the summary's output
    that the committed history still gives, and the seed's question."""
    readme = (ROOT / "README.md").read_text()
    screen = readme.split("\n## ", 1)[0]
    assert len(screen.splitlines()) <= 45, len(screen.splitlines())
    assert "pip install -e ." in screen and "bash scripts/suite.sh" in screen
    assert "differ by 0.5" in screen and "docs/explain.md#the-seed-answered" in screen
    sample = re.findall(r"```\n(matmul-drift summary:.*?)```", screen, re.S)[0]
    # the committed history, not what a main job run in this checkout added to results/
    got = subprocess.run([sys.executable, "-m", "matmul_drift.cli", "summary", str(committed_results)],
                         cwd=committed_results.parent, capture_output=True, text=True).stdout
    for line in sample.splitlines():
        shown = line.removesuffix("...").rstrip("; ")
        assert any(g.startswith(shown) for g in got.splitlines()), (line, got[:2000])


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


LAST_LONG_SUBJECT = "b5054777e0c7dac4521c4f9cacf2aceed3c86077"  # the history before it keeps its long subjects


def test_commit_subjects_from_the_layers_on_are_short_and_name_their_area():
    """`git log --oneline` stays readable: each subject after LAST_LONG_SUBJECT is at most 72
    characters, "area: what changed"; evidence and figures go in the body."""
    if subprocess.run(["git", "cat-file", "-e", f"{LAST_LONG_SUBJECT}^{{commit}}"], cwd=ROOT).returncode:
        pytest.skip("a shallow clone: the history before this test is not here")
    subjects = subprocess.run(["git", "log", "--format=%s", f"{LAST_LONG_SUBJECT}..HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.splitlines()
    bad = [s for s in subjects if len(s) > 72 or not re.match(r"^[\w./, -]+: \S", s)]
    assert not bad, bad
