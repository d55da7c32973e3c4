"""The library raises domain errors in plain values; cli/ words them with flag names. No
UsageError message outside cli/ names a flag (a BadValue carries the parameter instead)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from matmul_drift.cli.args import usage_words
from matmul_drift.core import cases
from matmul_drift.core.errors import BadValue

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "matmul_drift"


def flag_messages(package: Path = PACKAGE) -> dict[str, list[int]]:
    """Lines outside cli/ where a UsageError's message holds a flag (--name)."""
    out: dict[str, list[int]] = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(("cli/", "site_vendor/")):
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            func = getattr(node, "func", None)
            name = getattr(func, "id", getattr(func, "attr", None))
            if isinstance(node, ast.Call) and name == "UsageError" \
                    and re.search(r"--[a-z]", ast.get_source_segment(text, node)):
                out.setdefault(rel, []).append(node.lineno)
    return out


def test_no_usage_error_outside_cli_names_a_flag():
    found = flag_messages()
    assert not found, found


def test_the_scan_sees_a_flag_in_a_message(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.py").write_text('def f(o):\n    raise UsageError(\n        f"{o} bad; "\n'
                                           '        "pass --force")\n')
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "y.py").write_text('raise UsageError("--force is words here")\n')
    assert flag_messages(tmp_path) == {"jobs/x.py": [2]}


def test_a_misuse_reads_with_flags_in_the_cli_and_plain_in_the_library():
    from matmul_drift.core.errors import Misuse, Param
    from matmul_drift.read.summary import Options

    try:
        Options(base="a").check()
    except Misuse as exc:
        assert usage_words(exc) == "--base and --head go together"
        assert str(exc) == "base and head go together"
    else:
        raise AssertionError("a base without a head passed")
    exc = Misuse("night {x} recorded; pass ", Param("force"), " to run it again")
    assert usage_words(exc) == "night {x} recorded; pass --force to run it again"


def test_a_bad_value_reads_as_the_flag_in_the_cli_and_plain_in_the_library():
    case = cases.get("seed")
    shape = case.shape("cpu")
    try:
        cases.check_slices(case, shape, shape.n + 1, None)
    except BadValue as exc:
        assert usage_words(exc) == f"--slice-n {shape.n + 1} is larger than N = {shape.n}"
        assert str(exc) == f"slice_n {shape.n + 1} is larger than N = {shape.n}"
    else:
        raise AssertionError("a slice beyond N passed")
    exc = BadValue("orders", None, "K = 1", colon=True)
    assert usage_words(exc) == "--orders: K = 1"
