"""One job per module: no module of the library is over 700 lines (site_vendor/ is asv's)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "matmul_drift"
MOST = 700


def test_no_module_is_over_700_lines():
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py") if "site_vendor" not in p.parts}
    assert len(sizes) > 50  # the walk found the package
    assert {m: n for m, n in sizes.items() if n > MOST} == {}
