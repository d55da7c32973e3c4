#!/usr/bin/env bash
# The GPU check: the CUDA suite through asv, and the seed case explained, on a GPU machine,
# in under 8 minutes. Everything it makes lands in OUTDIR: asv results, catalog entries,
# the seed's explain output and a log.   bash scripts/gpu_check.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
PY=${PYTHON:-python3}
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv || true
$PY -c 'import torch' 2>/dev/null || $PY -m pip install --quiet torch
$PY -m pip install --quiet --no-deps -e . && $PY -m pip install --quiet numpy tabulate asv==0.6.6 matplotlib
$PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
# Named after the hardware (CPU, ISA, cores, GPU model and count), registered for asv.
machine=$($PY -m matmul_drift.cli machine --register 2>/dev/null)
export MATMUL_DRIFT_DEVICES=cuda MATMUL_DRIFT_CATALOG="$OUT/catalog" PYTORCH_NVML_BASED_CUDA_CHECK=1
# The CUDA suite: one setup_cache measures every case; the CPU combinations are skipped.
timeout 240 $PY -m asv run -E existing:same --set-commit-hash="$(git rev-parse HEAD)" --machine "$machine" \
  --bench 'drift\.Drift' --launch-method forkserver --show-stderr
mkdir -p "$OUT/results"
cp -r results/asv/"$machine" "$OUT/results/" 2>/dev/null
cp results/asv/benchmarks.json "$OUT/results/" 2>/dev/null
# The seed, answered on this GPU.
timeout 60 $PY -m matmul_drift.cli explain --case seed --dtype float16 --device cuda --json > "$OUT/seed-float16.json"
timeout 40 $PY -m matmul_drift.cli explain --case seed --dtype float16 --device cuda > "$OUT/seed-float16.txt"
# Where the seed's kernels change on this GPU: 40000..52000 columns in fp16, then every size
# around 45999/46000 (a kernel chosen by the alignment of n can fall between grid points).
timeout 90 $PY -m matmul_drift.cli scan --vary n --range 40000:52000 --m 1 --k 4096 --dtype float16 --device cuda \
  --json "$OUT/scan-seed-float16.json" --plot "$OUT/scan-seed-float16.png" > "$OUT/scan-seed-float16.txt"
timeout 30 $PY -m matmul_drift.cli scan --vary n --range 45990:46010 --m 1 --k 4096 --dtype float16 --device cuda \
  --step 1 --json "$OUT/scan-seed-dense.json" > "$OUT/scan-seed-dense.txt"
echo "gpu_check: done"
