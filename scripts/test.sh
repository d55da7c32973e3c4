#!/usr/bin/env bash
# The tests: install the project, torch 2.13.0 (CPU build) and the test tools into the
# current Python, then run pytest, one test file per worker, $PYTEST_WORKERS (default 2)
# at a time. Extra flags go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}" -e ".[test]"
$PY -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
