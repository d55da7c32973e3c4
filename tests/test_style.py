"""Lines stay within 100 characters (pyproject.toml's [tool.ruff]), kept by ruff. The files
that still hold longer lines may not gain any: tests/fixtures/long_lines.json counts them per
file, and a file that sheds its long lines must shed its entry (#66)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = str(Path(sys.executable).with_name("ruff"))
ALLOWED = ROOT / "tests" / "fixtures" / "long_lines.json"


def long_lines(*paths: str, cwd: Path = ROOT) -> Counter:
    """Lines over pyproject's line length, per file (paths relative to ``cwd``), as ruff sees them."""
    p = subprocess.run([RUFF, "check", *paths, "--output-format", "json", "-q"], cwd=cwd,
                       capture_output=True, text=True)
    assert p.returncode in (0, 1) and p.stdout, p.stderr
    return Counter(Path(d["filename"]).relative_to(cwd).as_posix() for d in json.loads(p.stdout))


def test_no_file_gains_a_line_over_100_characters():
    allowed = json.loads(ALLOWED.read_text())
    found = long_lines("src", "scripts")
    grown = {f: n for f, n in found.items() if n > allowed.get(f, 0)}
    assert not grown, f"lines over 100 characters, more than allowed: {grown}"
    shed = {f: (allowed[f], found.get(f, 0)) for f in allowed if found.get(f, 0) < allowed[f]}
    assert not shed, f"fewer long lines now: lower tests/fixtures/long_lines.json to match {shed}"


def test_ruff_sees_a_long_line(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n" + "y = '" + "a" * 100 + "'\n")
    assert long_lines("src", cwd=tmp_path) == Counter({"src/m.py": 1})
