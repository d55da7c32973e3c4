"""Lines stay within 100 characters (pyproject.toml's [tool.ruff]) in src/ and scripts/, kept
by ruff. benchmarks/ is left out: rewrapping a benchmark changes its asv version (#66)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = str(Path(sys.executable).with_name("ruff"))


def long_lines(*paths: str, cwd: Path = ROOT) -> Counter:
    """Lines over pyproject's line length, per file (relative to ``cwd``), as ruff sees them."""
    p = subprocess.run([RUFF, "check", *paths, "--output-format", "json", "-q"], cwd=cwd,
                       capture_output=True, text=True)
    assert p.returncode in (0, 1) and p.stdout, p.stderr
    return Counter(Path(d["filename"]).relative_to(cwd).as_posix() for d in json.loads(p.stdout))


def test_no_line_is_over_100_characters():
    assert long_lines("src", "scripts") == Counter()


def test_ruff_sees_a_long_line(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n" + "y = '" + "a" * 100 + "'\n")
    assert long_lines("src", cwd=tmp_path) == Counter({"src/m.py": 1})
