#!/usr/bin/env bash
# Fetch here, into the ignored .whl/, everything scripts/gpu_check.sh installs on the GPU
# machine, which reaches no network: asv 0.6.6 and its dependencies as wheels for CPython
# 3.12 on manylinux x86-64 (the image has torch, numpy, tabulate, matplotlib, tqdm), this
# project as a wheel, and commit.json: HEAD's hash and date, which asv records the results
# against (the tree that travels has no .git, and that machine may have no git; see
# src/matmul_drift/jobs/asv_commit.py), and project.bundle: HEAD's history, which the check's
# nights clone where git is there. Run it again after changing the project.
#   bash scripts/fetch_gpu_wheels.sh            then carry .whl with the tree
# WHL_DIR (default .whl) and GPU_PYTHON_VERSION (default 3.12, the image's) are for the
# rehearsal on this machine, whose torch is for Python 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHL=${WHL_DIR:-.whl}
LIMIT_KIB=$((24 * 1024))  # well under the 64 MiB that may travel with the tree
# What travels must be what the wheel and commit.json hold: HEAD, with nothing changed or
# added; gpu_check.sh checks the tree against tree.sha256 before it installs anything.
TRAVEL=(src benchmarks scripts asv.conf.json pyproject.toml)
if [ -n "$(git status --porcelain -- "${TRAVEL[@]}")" ]; then
  echo "fetch_gpu_wheels: error: uncommitted changes in ${TRAVEL[*]}; commit them first (the GPU results are recorded against HEAD)" >&2
  exit 1
fi
rm -rf "$WHL"
mkdir -p "$WHL"
git ls-files -z -- "${TRAVEL[@]}" | xargs -0 sha256sum > "$WHL/tree.sha256"
"$PY" -m pip download --quiet --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any --dest "$WHL" asv==0.6.6
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$WHL" .
# the date as asv's git reads it (rev-list --format=%at): author time, in ms
git log -1 --format='{"commit": "%H", "date": %at000, "branch": "gpu-check"}' HEAD > "$WHL/commit.json"
# the project's history, which the check's two nights clone (a nightly needs a git checkout)
git bundle create --quiet "$WHL/project.bundle" HEAD
size=$(du -sk "$WHL" | cut -f1)
if [ "$size" -gt "$LIMIT_KIB" ]; then
  echo "fetch_gpu_wheels: error: $WHL holds $size KiB, more than $LIMIT_KIB KiB" >&2
  exit 1
fi
echo "fetch_gpu_wheels: $(find "$WHL" -name '*.whl' | wc -l) wheels and commit $(git rev-parse --short=8 HEAD), $size KiB in $WHL"
