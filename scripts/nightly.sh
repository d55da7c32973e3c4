#!/usr/bin/env bash
# The nightly job, a thin wrapper over `matmul-drift nightly` run from the project checkout:
#   bash scripts/nightly.sh --python /path/to/venv/bin/python --machine h100 [--remote origin]
#   bash scripts/nightly.sh --merge ARTIFACT_DIR... [--remote origin]
# PYTHON (default python3) runs matmul-drift and asv; --python is the torch build under test.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m matmul_drift.cli_nightly "$@"
