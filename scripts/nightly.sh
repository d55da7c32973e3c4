#!/usr/bin/env bash
# The nightly job, a thin wrapper over `matmul-drift nightly` for the project checkout it lies in:
#   bash scripts/nightly.sh --python /path/to/venv/bin/python --machine h100 [--remote origin]
#   bash scripts/nightly.sh --merge ARTIFACT_DIR... [--remote origin]
# PYTHON (default python3) runs matmul-drift and asv; --python is the torch build under test.
# Relative paths (--python, --merge, --tree) are the caller's: no cd, the checkout goes as --repo
# (a --repo given after it wins).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exec "${PYTHON:-python3}" -m matmul_drift.cli nightly --repo "$here" "$@"
