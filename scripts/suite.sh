#!/usr/bin/env bash
# The main job: install into the current Python (torch 2.13.0, the CPU build, by default),
# run the default CPU suite with `asv run --python=same`, and build the `asv publish` site.
#   TORCH_VERSION=2.14.1 bash scripts/suite.sh      another torch build
#   bash scripts/suite.sh --force                   replace this commit's recorded results
#   bash scripts/suite.sh --launch-method spawn     any further flags go to `asv run`
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
force=0
args=()
for a in "$@"; do
  if [ "$a" = "--force" ]; then force=1; else args+=("$a"); fi
done
echo "matmul-drift: installing torch==${TORCH_VERSION:-2.13.0} and the project into $($PY -c 'import sys; print(sys.prefix)')"
$PY -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}" -e .
$PY -m asv machine --yes >/dev/null
commit=$(git rev-parse HEAD)
machine=$($PY -c 'import platform; print(platform.node())')  # the name `asv machine --yes` gives
existing=$(ls results/asv/"$machine"/"${commit:0:8}"-existing-*.json 2>/dev/null | head -n 1 || true)
if [ -n "$existing" ] && [ "$force" != 1 ]; then
  echo "matmul-drift: results for commit ${commit:0:8} on $machine are already recorded ($existing); pass --force to replace them" >&2
  exit 1
fi
# asv saves results of an existing environment only with --set-commit-hash. `-E existing:same`,
# not `--python=same`: asv 0.6.6 expands the torch matrix for the latter and runs the
# whole suite once per matrix entry, in the same Python.
$PY -m asv run -E existing:same --set-commit-hash="$commit" "${args[@]}"
$PY -m asv publish
echo "matmul-drift: results under results/asv/$machine, site under html/ (asv preview to serve it)"
