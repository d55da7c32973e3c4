#!/usr/bin/env bash
# The main job: install the project and asv into the current Python, then measure every torch
# build of asv.conf.json's matrix (2.13.0 and 2.14.1) side by side with asv, each in its own
# asv virtualenv (made once, then reused), build the site in html/ and print what changed.
#   TORCH_VERSION=2.14.1 bash scripts/suite.sh      one build only
#   bash scripts/suite.sh --force                   measure builds already recorded at this commit again
#   bash scripts/suite.sh --bench 'Drift\.'         further flags go to `matmul-drift run`
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
echo "matmul-drift: installing the project and asv into $($PY -c 'import sys; print(sys.prefix)')" >&2
$PY -m pip install --quiet -e .
exec $PY -m matmul_drift.cli run "$@"
