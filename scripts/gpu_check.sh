#!/usr/bin/env bash
# The GPU check, for a GPU machine that reaches no network (README, "Every night on GPUs"):
#   bash scripts/fetch_gpu_wheels.sh                  here, once: fills .whl/
#   bash scripts/gpu_check.sh "$OUT"                  there, with .whl/ carried beside the tree
#   python scripts/import_gpu_check.py OUT/gpu-check.tar.gz   here: into results/
# It installs asv and the project from .whl/ only (pip --no-index) into a venv that sees the
# image's torch, which is the build under test whatever its version; explains the seed in
# fp16 (its 45999 and 46000 columns against each other, with cuBLAS's recipes), runs the
# CUDA suite through asv, runs the nightly path itself for two nights on the seed with its
# order probe and fix finder (the second with one cuBLAS setting changed), tries the fixes
# of a batch-invariance case in bf16, maps which of its batch sizes M = 1..512 give the same
# bits (matmul-drift map), reveals the summation orders of the seed's 45999 and
# 46000 columns in fp16 and of batch-invariance in bf16 (full and A[:1]), and scans the
# seed's columns. Every step has a timeout (together 431 s, planned from the H200's recorded
# step times: the plan below) and prints its time, and the archive is packed again after
# each, so a check stopped from outside keeps what it finished. Before the first step it says
# what this machine has and which steps it can run; without git the nights are skipped, and
# said to be. The whole check ends by its deadline (GPU_CHECK_SECONDS, 480 s: run it under a limit of 600 s), whatever
# the commands between the steps take: a step cut short by it says so, one with no time left is
# not started, and the summary is still written. After a failed install no later step starts
# (each would fail at its import), and the summary says the archive will not import. OUT receives three
# files: gpu-check.tar.gz (asv results, catalog entries, explain, fixes, the map, order
# trees, scan output, the second night's summary and both nights' log, torch's build and on CUDA the GPU
# memory a CUDA context takes), summary.txt and log.txt.
# --rehearse makes the same steps on the CPU with the smallest shapes (tests/test_gpu_check.py).
# GPU_CHECK_PACE="NAME=SECONDS ..." makes each named step last at least that long (never past its
# limit): a rehearsal at a GPU's pace, as the test injects the H200's step times. With
# GPU_CHECK_SCALE=N a paced step waits 1/N of its wait, and the check's clock counts the whole:
# the same plan, deadline and limits in 1/N of the time. GPU_CHECK_DRY=1 runs no step's command
# (each is `true`): the plan alone, whatever this machine's speed or load.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR [--rehearse]}
MODE=${2:-}
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/log.txt") 2>&1
WORK=$(mktemp -d)
PACK=$WORK/pack  # what goes into the archive
mkdir -p "$PACK" "$WORK/home"
# asv's machine file (~/.asv-machine.json) and every cache in a home of the check's own: the
# image's HOME may be missing or read-only, and a machine that cannot be registered would
# leave the archive without the name its import needs.
export HOME=$WORK/home
PY=${PYTHON:-python3}
STEPS=$PACK/steps.txt
: > "$STEPS"
failed=0
# GPU_CHECK_STRETCH=N (with --rehearse only) multiplies every limit and the deadline by N: the
# CPU's rehearsal tests that the steps work, and a loaded CPU is slower than a GPU at them.
STRETCH=1
if [ "$MODE" = --rehearse ] && [[ ${GPU_CHECK_STRETCH:-1} =~ ^[1-9]$ ]]; then STRETCH=${GPU_CHECK_STRETCH:-1}; fi
DEADLINE=$((${GPU_CHECK_SECONDS:-480} * STRETCH))
RESERVE=15  # kept for the summary at the end
# The plan: each step's limit (its `step` line's) against what it took on the H200, the one GPU
# that ran the check (results/gpu-check/intel-xeon-amx-16c-1x-h200-c96efa/8b6c2946/steps.txt;
# docs/performance.md). Its suite took 102 s under a budget of 80 s, now 40; its fixes-seed
# step (44 s) stands in for each night; map, which it did not run, is taken as its scan (11 s).
# The limits add up to 431 s, 34 s under the 465 s the deadline leaves the steps, which holds
# the commands between them (nvidia-smi, the machine name, torch's import: seconds each). A
# step under 8 s is never started (`step`), and the CPU rehearsal's order probes need 40 s.
#   step         H200 s  limit s
#   install           1       10
#   config            0        8
#   explain          12       20
#   explain-txt       0        8
#   suite           102      125
#   nights       2 x 44      120
#   fixes-batch      25       50
#   map            (11)       20
#   orders           26       40
#   scan             11       15
#   dense            10       15
# now: the check's clock, in seconds: bash's, plus what paced steps counted without waiting
# (GPU_CHECK_SCALE)
UNWAITED=0
now() { echo $((SECONDS + UNWAITED)); }
SCALE=${GPU_CHECK_SCALE:-1}
[[ $SCALE =~ ^[1-9][0-9]{0,5}$ ]] ||
  { echo "gpu_check: warning: GPU_CHECK_SCALE=$SCALE is no whole number from 1: 1 taken"; SCALE=1; }

# capped SECONDS: SECONDS, or less where the deadline (less the summary's reserve) comes first; at least 1
capped() {
  local left=$((DEADLINE - RESERVE - $(now)))
  [ "$left" -lt "$1" ] || left=$1
  [ "$left" -ge 1 ] || left=1
  echo "$left"
}

# step NAME SECONDS CMD...: run CMD under a timeout (its stdout to $STEP_OUT when set),
# print and record its time and status (in $rc too), and pack what the steps made so far.
# SECONDS covers it all: CMD gets SECONDS - 4 (exported as STEP_LIMIT), then SIGKILL 2 s later
# if it ignored the SIGTERM, and the packing 2 s. Where the deadline comes first, SECONDS is
# cut to what is left; under 8 s left, or after a failed install (NOT_STARTED), the step is
# not started (rc 124, as a timeout).
NOT_STARTED=
step() {
  local name=$1 asked=$(($2 * STRETCH)) limit t0 why=$NOT_STARTED
  t0=$(now)
  shift 2
  limit=$(capped "$asked")
  if [ -z "$why" ] && [ "$limit" -lt 8 ]; then
    why=deadline
    echo "gpu_check: step $name not started: the check's deadline ($DEADLINE s) is near"
  fi
  if [ -n "$why" ]; then
    rc=124
    printf '%-12s rc %3d  %4d s of %4d s  not started: %s\n' "$name" "$rc" 0 0 "$why" | tee -a "$STEPS"
    failed=$((failed + 1))
    return 0
  fi
  [ "$limit" -eq "$asked" ] || echo "gpu_check: step $name cut from $asked s to $limit s by the check's deadline ($DEADLINE s)"
  echo "gpu_check: step $name (limit $limit s): $*"
  if declare -F "$1" > /dev/null; then set -- bash -c "$1"; fi  # timeout runs programs: a function via bash (exported)
  [ -z "${GPU_CHECK_DRY:-}" ] || set -- true
  export STEP_LIMIT=$((limit - 4))
  if [ -n "${STEP_OUT:-}" ]; then timeout -k 2 "$STEP_LIMIT" "$@" > "$STEP_OUT"; else timeout -k 2 "$STEP_LIMIT" "$@"; fi
  rc=$?
  pace "$name" "$t0" "$limit"
  printf '%-12s rc %3d  %4d s of %4d s\n' "$name" "$rc" "$(($(now) - t0))" "$limit" |
    tee -a "$STEPS"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  pack
  return 0
}

# skip NAME WHY: a step this machine cannot run, said and recorded; not a failure.
skipped=0
skip() {
  printf '%-12s rc   -  %4d s of %4d s  skipped: %s\n' "$1" 0 0 "$2" | tee -a "$STEPS"
  skipped=$((skipped + 1))
}

# pace NAME T0 LIMIT: with GPU_CHECK_PACE naming NAME, wait until the step has lasted its paced
# seconds on the check's clock; one paced past its limit ends there, timed out (rc 124), as the
# real one would. The wait is 1/GPU_CHECK_SCALE of that, the rest counted (UNWAITED).
pace() {
  local want owed before
  want=$(tr ' ' '\n' <<< "${GPU_CHECK_PACE:-}" | sed -n "s/^$1=\([0-9]*\)$/\1/p")
  [ -n "$want" ] || return 0
  if [ "$want" -ge "$3" ]; then want=$3; rc=124; fi
  owed=$((want - ($(now) - $2)))
  [ "$owed" -gt 0 ] || return 0
  before=$SECONDS
  sleep "$(awk -v w="$owed" -v n="$SCALE" 'BEGIN { printf "%.2f", w / n }')"
  UNWAITED=$((UNWAITED + owed - (SECONDS - before)))
}

# pack: everything the steps made so far into $OUT/gpu-check.tar.gz, whole (by a rename), so
# that a check stopped from outside still brings back every step it finished.
pack() {
  timeout -k 1 1 tar -czf "$OUT/.gpu-check.tar.gz.part" -C "$PACK" . &&
    mv -f "$OUT/.gpu-check.tar.gz.part" "$OUT/gpu-check.tar.gz" || echo "gpu_check: packing after the step failed"
}

if [ "$MODE" = --rehearse ]; then
  DEVICE=cpu CASES=square EXPLAIN=(--m 1 --k 64 --n 48 --slice-n 47 --dtype float16 --device cpu)
  BATCH=(--m 16 --k 64 --n 48 --slice-m 3 --dtype bfloat16 --device cpu)
  MAP=(--k 64 --n 48 --range 1:64 --dtype bfloat16 --device cpu)
  SCAN=(--vary n --range 30:48 --m 1 --k 64 --dtype float16 --device cpu)
  DENSE=(--vary n --range 44:47 --within 48 --m 1 --k 64 --dtype float16 --device cpu --step 1)
  ORDERS=("seed-47-float16:--m 1 --k 64 --n 47 --dtype float16" "seed-48-float16:--m 1 --k 64 --n 48 --dtype float16"
          "batch-bfloat16:--m 16 --k 64 --n 48 --dtype bfloat16" "batch-m1-bfloat16:--m 1 --k 64 --n 48 --dtype bfloat16")
  # the nights' stand-in for a cuBLAS setting: MKL's, which names itself in MKL's kernel names
  NIGHT_CASES=square NIGHT_PRECISIONS=float32 NIGHT_SETTING=MKL_CBWR=COMPATIBLE
else
  # long-k is left to the nightly: drawing its 2^30 input entries alone takes most of a minute
  DEVICE=cuda CASES=seed,skinny,batch-invariance-2,bmm,slice-n-view,slice-n-copy,linear,square EXPLAIN=(--case seed --dtype float16 --device cuda)
  BATCH=(--case batch-invariance-2 --dtype bfloat16 --device cuda)
  # issue #50's map: which M of 1..512 give row 0 and the rows of the full 8192-row product
  MAP=(--case batch-invariance-2 --range 1:512 --dtype bfloat16 --device cuda)
  SCAN=(--vary n --range 40000:52000 --m 1 --k 4096 --dtype float16 --device cuda)
  # the dense sweep in the seed's own layout: slices of a v 51000 columns wide (the row stride
  # picks the kernel: on the H200 a 46010-wide v ran gemv at 46000, a 52000-wide one nvjet)
  DENSE=(--vary n --range 45990:46010 --within 51000 --m 1 --k 4096 --dtype float16 --device cuda --step 1)
  # the nights: the seed with its order probe and fix finder; the second night without
  # cuBLAS's workspace (NVIDIA's documented setting for reproducible results), which its
  # summary must flag wherever it changed a kernel, its recipe or the bits
  NIGHT_CASES=seed NIGHT_PRECISIONS=float16 NIGHT_SETTING=CUBLAS_WORKSPACE_CONFIG=:0:0
  ORDERS=("seed-45999-float16:--case seed --slice-n 45999 --dtype float16"
          "seed-46000-float16:--case seed --slice-n 46000 --dtype float16"
          "batch-invariance-2-bfloat16:--case batch-invariance-2 --dtype bfloat16"
          "batch-invariance-2-m1-bfloat16:--case batch-invariance-2 --slice-m 1 --dtype bfloat16")
  timeout "$(capped 20)" nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv |
    tee "$WORK/gpu.txt" || true
fi

# Install asv (with its dependencies) and the project from the wheels alone, into a folder
# of their own on PYTHONPATH: the image's Python and its packages, torch among them, stay
# as they are. --no-compile: pip's byte-compiling every file of asv and its dependencies
# took half the install here (3.65 s against 1.79 s); Python compiles what it imports.
WHL=${WHL_DIR:-.whl}
install_wheels() {
  [ -f "$WHL/commit.json" ] || { echo "gpu_check: error: no $WHL/commit.json: run scripts/fetch_gpu_wheels.sh here first"; return 1; }
  sha256sum --quiet -c "$WHL/tree.sha256" ||
    { echo "gpu_check: error: this tree is not the commit $WHL/ was fetched for: run scripts/fetch_gpu_wheels.sh again"; return 1; }
  # One pip call for every wheel: a second call into the same --target found its bin/ taken
  # by the first ("Target directory .../bin already exists") and left the project's script
  # out. --no-deps: the wheels are asv's resolution, made by pip download, and the project's
  # other dependencies are the image's.
  "$PY" -m pip --isolated install --quiet --no-index --no-deps --no-cache-dir --no-compile --target "$WORK/site" "$WHL"/*.whl
}
export PY WHL WORK ROOT
export -f install_wheels
# What this machine can run, said before the first step: the Python and the torch it finds
# (every step needs both), the disk space the install and the results take, and git, which
# the nights alone need (the tree travels without its history). torch is found, not imported:
# its import comes later, timed.
MIN_FREE_MIB=512
git_found=$(git --version 2>/dev/null) || git_found=
free_mib=$(df -Pm "$WORK" 2>/dev/null | awk 'NR == 2 {print $4}')
py_found=$(timeout "$(capped 10)" "$PY" -c 'import sys; print(sys.version.split()[0], "at", sys.executable)' 2>/dev/null)
torch_found=
[ -z "$py_found" ] || torch_found=$(timeout "$(capped 10)" "$PY" -c \
  'import importlib.util as u; s = u.find_spec("torch"); print(s.origin if s else "")' 2>/dev/null)
echo "gpu_check: this machine: Python ${py_found:-not found ($PY)}; torch ${torch_found:+at }${torch_found:-not found};" \
  "${git_found:-no git}; ${free_mib:-?} MiB free in $WORK"
if [ -z "$py_found" ]; then NOT_STARTED="no Python ($PY)"
elif [ -z "$torch_found" ]; then NOT_STARTED="no torch for $PY"
elif [ "${free_mib:-0}" -lt "$MIN_FREE_MIB" ]; then NOT_STARTED="${free_mib:-no} MiB free in $WORK, under $MIN_FREE_MIB"
fi
NO_NIGHTS=
[ -n "$git_found" ] || NO_NIGHTS="no git on this machine: the nightly path clones the project's history and commits each night"
STEP_NAMES="install config explain explain-txt suite nights fixes-batch map orders scan dense"
if [ -n "$NOT_STARTED" ]; then echo "gpu_check: this machine can run no step: $NOT_STARTED"
elif [ -n "$NO_NIGHTS" ]; then echo "gpu_check: this machine can run every step but the nights (${STEP_NAMES/ nights/}): $NO_NIGHTS"
else echo "gpu_check: this machine can run every step: $STEP_NAMES"; fi
# The commit the import files everything under (asv's, below), read first: the deadline may
# leave the commands after the install a second each.
COMMIT=$(timeout "$(capped 10)" "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["commit"])' "$WHL/commit.json" 2>/dev/null)
printf '%s\n' "$COMMIT" > "$PACK/COMMIT"
step install 10 install_wheels
# Without asv and this project every later step and snippet would only print an import's
# traceback: none is started, and the archive has no machine name (its import needs one).
if [ -z "$NOT_STARTED" ] && [ "$rc" -ne 0 ]; then
  NOT_STARTED="install failed"
  echo "gpu_check: error: the install failed (rc $rc): no step after it is started"
fi
export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
export ASV_PYTHONPATH=$PYTHONPATH  # asv's benchmark processes drop PYTHONPATH and take this instead
# The name the import files everything under, first of what runs between the steps. Where it
# cannot be registered, the name alone (the log says why): the suite then fails, and the
# import still takes the rest.
machine=
if [ -z "$NOT_STARTED" ]; then
  machine=$(timeout "$(capped 30)" "$PY" -m matmul_drift.cli machine --register 2> "$WORK/machine.err") ||
    { cat "$WORK/machine.err"; machine=$(timeout "$(capped 30)" "$PY" -m matmul_drift.cli machine 2>/dev/null); }
  [ -n "$machine" ] || echo "gpu_check: error: no machine name: the archive will not import"
fi
printf '%s\n' "$machine" > "$PACK/MACHINE"
# torch's build (into the archive: the import keeps it), and on CUDA the GPU memory a CUDA
# context takes, which memory.CUDA_CONTEXT_BYTES reasons and nothing else measures: NVML's
# memory in use on every GPU before this process touches one, once its context is made, and
# after a first product (cuBLAS and its workspace). The measuring has 3 s; whatever fails in
# it is a line in torch.txt, never a traceback or the check's failure.
timeout "$(capped 30)" "$PY" -c 'import subprocess, sys, time
import torch
def used():  # MiB in use on every GPU NVML sees
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=max(0.1, round(end - time.monotonic(), 1)), check=True).stdout
    return sum(int(x) for x in out.split())
end, measure = time.monotonic() + 3, sys.argv[1] == "cuda"
try:
    before = used() if measure else None
except Exception as exc:
    before = exc
print("torch", torch.__version__, "git", torch.version.git_version[:12], "CUDA", torch.version.cuda,
      torch.cuda.is_available(), flush=True)
if measure and torch.cuda.is_available():
    what = "CUDA context"
    try:
        if isinstance(before, Exception):
            raise before
        torch.cuda.mem_get_info()  # the first call that needs a context makes it
        print(f"{what}: {used() - before} MiB", flush=True)
        what = "CUDA context with a first fp16 product (cuBLAS, 2 MiB of tensors)"
        a = torch.ones(64, 64, device="cuda", dtype=torch.float16)
        (a @ a).sum().item()
        print(f"{what}: {used() - before} MiB")
    except Exception as exc:
        print(f"{what}: not measured ({type(exc).__name__}: {exc})")' "$DEVICE" | tee "$PACK/torch.txt"

# asv records results against a commit: the one fetch_gpu_wheels.sh recorded in commit.json,
# which asv reads through the plugin matmul_drift.jobs.asv_commit (no history travels, and git
# may be missing there), with a config that points at this tree's benchmarks.
write_config() {
  "$PY" - "$ROOT" "$WORK" "$(cd "$WHL" && pwd)/commit.json" <<'PYEOF'
import json, sys
from asv import util
root, work, recorded = sys.argv[1:]
conf = util.load_json(f"{root}/asv.conf.json", js_comments=True)
conf.update(repo=recorded, dvcs="recorded-commit", plugins=[".matmul_drift.jobs.asv_commit"], benchmark_dir=f"{root}/benchmarks",
            results_dir=f"{work}/pack/results/asv", html_dir=f"{work}/html", env_dir=f"{work}/env",
            environment_type="existing", branches=["gpu-check"])
conf.pop("matrix", None)
json.dump(conf, open(f"{work}/asv.conf.json", "w"), indent=2)
PYEOF
}
export COMMIT
export -f write_config
step config 8 write_config
export MATMUL_DRIFT_DEVICES=$DEVICE MATMUL_DRIFT_CATALOG=$PACK/results/catalog MATMUL_DRIFT_CASES=$CASES
# float32-high is left to the nightly: on CUDA it sets the cuBLAS mode float32-tf32 sets
export MATMUL_DRIFT_PRECISIONS=float16,bfloat16,float32,float32-tf32,float64
export PYTORCH_NVML_BASED_CUDA_CHECK=1
# each process whose profiler dropped kernel records (pytorch#192021) appends its note here,
# asv's setup_cache and the fix finder's processes too, whose stderr is not shown
export MATMUL_DRIFT_PROFILER_NOTES=$PACK/profiler-notes.txt
# The seed, answered on this device first: every slice the case names (51000, 50000, 46000,
# 45999, all of the one 51000-wide v), their kernels with cuBLAS's recipes, 45999 against 46000
# and each against the full product by magnitude band (no --slice-n: it would measure one). Its fixes come later, in a step of their own, so that the answer
# survives them. Every explain and scan skips the host's memory check: the GPU machine's
# memory grows as it is used, so MemAvailable reads too little there.
STEP_OUT=$PACK/seed-float16.json step explain 20 "$PY" -m matmul_drift.cli explain "${EXPLAIN[@]}" --no-host-memory-check --json
STEP_OUT=$PACK/seed-float16.txt step explain-txt 8 "$PY" -m matmul_drift.cli explain --render "$PACK/seed-float16.json"
# The suite: one setup_cache measures the cases on this device, most telling first, and
# starts none after 40 s (MATMUL_DRIFT_BUDGET; the rest are skipped and say so), so asv
# finishes and writes its results within the step: asv saves them only at its end, and a
# suite killed at its limit keeps nothing. Its fix finder (a fresh process per setting,
# each redrawing every drifting case's inputs) and its order probe (every combination) do
# not fit here: fix_cost, fix_id and order_id are NaN; the nights (the seed's), the
# --try-fixes and the order steps stand in. asv starts its benchmark processes in process groups of their own, which a
# timeout does not reach: they are ended after the step. asv also starts a process for each
# of a benchmark's 108 combinations, a skipped one too (about 30 ms each on a 2-core EPYC,
# 45 s for the 13 benchmarks): --bench names only the 40 measured here (16 s). The step's
# 121 s (its limit less the 4 s the step keeps) then hold asv's discovery and import of torch
# (about 10 s here), the budget, the combination running when it is spent and those 520
# processes: the H200 ran it all in 102 s with a budget of 80 s, 40 s more than now
# (8b6c2946's steps.txt).
BENCH=
[ -n "$NOT_STARTED" ] || BENCH=$(timeout "$(capped 10)" "$PY" -c 'import sys; from matmul_drift.jobs import selection as s; print(s.selection_regex(sys.argv[1], s.read()))' \
  'drift\.Drift\.track_\w+') ||
  { BENCH='drift\.Drift'; echo "gpu_check: warning: no selection of the suite's combinations; asv starts all 108 of each"; }
# asv's forkserver socket must fit unix(7)'s 107 bytes under TMPDIR (asvrun.tmpdir_for_asv, as
# the nightly's): a deep TMPDIR gives way to /tmp
SUITE_TMP=${TMPDIR:-/tmp}
[ -n "$NOT_STARTED" ] || SUITE_TMP=$(timeout "$(capped 10)" "$PY" -c 'import sys; from matmul_drift.jobs import asvrun
print(asvrun.tmpdir_for_asv(sys.argv[1]))' "$SUITE_TMP") || SUITE_TMP=${TMPDIR:-/tmp}
TMPDIR=$SUITE_TMP MATMUL_DRIFT_FIXES=0 MATMUL_DRIFT_ORDERS=0 MATMUL_DRIFT_MAPS=0 MATMUL_DRIFT_BUDGET=40 step suite 125 "$PY" -m asv --config "$WORK/asv.conf.json" run -E "existing:$PY" --set-commit-hash="$COMMIT" \
  --machine "$machine" --bench "$BENCH" --launch-method forkserver --show-stderr
# asvrun.reap_orphans, as the nightly's: the image need not have pkill
[ -n "$NOT_STARTED" ] || timeout "$(capped 10)" "$PY" -c 'import sys; from pathlib import Path; from matmul_drift.jobs import asvrun
for line in asvrun.reap_orphans(Path(sys.argv[1])): print("gpu_check:", line)' "$ROOT"
# The nightly path itself, as a nightly cron job runs it: two nights (yesterday's and
# today's, UTC) on a results branch of their own, in a clone of the project's history that
# fetch_gpu_wheels.sh bundled (.whl/project.bundle; it needs git, which the image may lack:
# then this step is skipped, and the check says so before its first step and in its summary). Each night runs the suite on NIGHT_CASES with
# the order probe and the fix finder (the seed's fixes, a fresh process per setting), commits
# to the branch, summarises against the night before and publishes; the second night has
# NIGHT_SETTING set. Its summary, and both nights' output with the branch's log, travel in
# the archive (nights-summary.md, nights.txt), and the catalog entries they made with the rest.
two_nights() {
  local dir=$WORK/nights bundle=$WHL/project.bundle rc=0 t0=$SECONDS i night bench setting share
  [ "${bundle#/}" != "$bundle" ] || bundle=$ROOT/$bundle
  mkdir -p "$dir" && cd "$dir" || return 1
  git -c advice.detachedHead=false clone --quiet "$bundle" repo || return 1
  [ "$(git -C repo rev-parse HEAD)" = "$COMMIT" ] ||
    { echo "gpu_check: error: the bundle's HEAD is not $COMMIT: run scripts/fetch_gpu_wheels.sh again"; return 1; }
  bench=$(MATMUL_DRIFT_CASES=$NIGHT_CASES MATMUL_DRIFT_PRECISIONS=$NIGHT_PRECISIONS "$PY" -c \
    'import sys; from matmul_drift.jobs import selection as s; print(s.selection_regex(sys.argv[1], s.read()))' '\w+\.\w+\.\w+') || return 1
  for i in 1 2; do
    night=$(date -u -d "$((i - 2)) days" +%F)
    setting=  # the second night's
    [ "$i" -eq 1 ] || setting=$NIGHT_SETTING
    # the first night two thirds of what is left (it pays for the clone and cold caches: twice
    # the second's time in the rehearsal), the second the rest; the summary's 4 s kept
    share=$(((STEP_LIMIT - 4 - (SECONDS - t0)) * (i == 1 ? 2 : 3) / 3))
    [ "$share" -ge 1 ] || share=1
    echo "== night $i of 2, $night${setting:+, with $setting} (limit $share s)" | tee -a "$PACK/nights.txt"
    # shellcheck disable=SC2086  # an empty setting is no word
    env $setting MATMUL_DRIFT_CASES="$NIGHT_CASES" MATMUL_DRIFT_PRECISIONS="$NIGHT_PRECISIONS" MATMUL_DRIFT_BUDGET=20 \
      timeout -k 2 "$share" "$PY" -m matmul_drift.cli nightly --python "$PY" --machine "$machine" --date "$night" \
      --repo repo --tree tree --bench "$bench" --launch-method forkserver < /dev/null >> "$PACK/nights.txt" 2>&1
    night=$?
    [ "$night" -eq 0 ] || { rc=1; echo "gpu_check: night $i of 2: rc $night" | tee -a "$PACK/nights.txt"; }
  done
  git -C tree log --format='%h %ad %s' --date=short --stat >> "$PACK/nights.txt" 2>&1
  cp tree/summaries/"$(date -u +%F)-$machine.md" "$PACK/nights-summary.md" || rc=1
  mkdir -p "$PACK/results/catalog" && cp -rn tree/results/catalog/. "$PACK/results/catalog/"
  return $rc
}
export machine PACK NIGHT_CASES NIGHT_PRECISIONS NIGHT_SETTING
export -f two_nights
if [ -n "$NO_NIGHTS" ] && [ -z "$NOT_STARTED" ]; then skip nights "$NO_NIGHTS"; else step nights 120 two_nights; fi
# The fixes of batch-invariance in bf16 (a fresh process per setting). Each process has its
# timeout and none starts after the budget (those rows say "not tried"), so explain prints its
# report inside the step's limit: measuring + budget + timeout < limit. If the limit's SIGTERM
# comes while it tries fixes, it still prints what it has at once (exit 143). Its default
# computation (8192x4096x4096 and its exact reference) took over 12 s on the H200 (8b6c2946).
STEP_OUT=$PACK/fixes-batch-bfloat16.json step fixes-batch 50 "$PY" -m matmul_drift.cli explain "${BATCH[@]}" \
  --no-host-memory-check --try-fixes --fix-timeout 16 --fix-budget 16 --json
# The batch-invariance map (matmul-drift map): a map cut short by its limit writes what it
# measured (SIGTERM), and its words and picture travel in the archive.
STEP_OUT=$PACK/map-batch-bfloat16.txt step map 20 "$PY" -m matmul_drift.cli map "${MAP[@]}" --no-host-memory-check \
  --json "$PACK/map-batch-bfloat16.json" --plot "$PACK/map-batch-bfloat16.png"
# The summation orders (matmul-drift order, replayed on 100 draws): one tree per file,
# order-NAME.json. Each probe may take the time left less a floor kept for each probe after it
# (half an equal share of the step's time), so that probes all a little slower than an equal
# share still finish where the step's time holds them (an equal share failed every one), and
# a probe that hangs leaves the others their floor.
reveal_orders() {
  local spec share rc=0 left floor t0=$SECONDS
  left=$(wc -l <<< "$ORDERS_TEXT")
  floor=$(((STEP_LIMIT - 2) / (2 * left)))
  while IFS= read -r spec; do
    share=$((STEP_LIMIT - 2 - (SECONDS - t0) - (left - 1) * floor))
    [ "$share" -ge 1 ] || share=1  # timeout 0 would mean none
    # shellcheck disable=SC2086  # the spec's words are the arguments
    timeout "$share" "$PY" -m matmul_drift.cli order ${spec#*:} --device "$DEVICE" --verify \
      --no-host-memory-check --json "$PACK/order-${spec%%:*}.json" < /dev/null || rc=1
    left=$((left - 1))
  done <<< "$ORDERS_TEXT"
  return $rc
}
ORDERS_TEXT=$(printf '%s\n' "${ORDERS[@]}")  # an array does not pass to the exported function
export DEVICE PACK ORDERS_TEXT
export -f reveal_orders
step orders 40 reveal_orders
step scan 15 "$PY" -m matmul_drift.cli scan "${SCAN[@]}" --no-host-memory-check --json "$PACK/scan-seed-float16.json" \
  --plot "$PACK/scan-seed-float16.png"
step dense 15 "$PY" -m matmul_drift.cli scan "${DENSE[@]}" --no-host-memory-check --json "$PACK/scan-seed-dense.json"

# Three files come back: the archive (packed after every step), a one-page summary, the log.
RESERVE=0  # the summary's own time, kept for it until now
said=
[ "$skipped" -eq 0 ] || said=", $skipped skipped ($NO_NIGHTS)"
# MACHINE and COMMIT are written between the steps, and a step not started packs nothing: a
# slow start that left no step after the install its 8 s brought back an archive without them.
pack
{
  echo "gpu_check on $machine at ${COMMIT:0:12}${MODE:+ ($MODE)}: $failed step(s) failed$said"
  [ -n "$machine" ] || echo "no machine name: the archive will not import (${NOT_STARTED:+the install failed, and the project it installs names the machine; }log.txt says why)"
  cat "$PACK/torch.txt"  # as printed at the start: no second import of torch, no second nvidia-smi
  tail -n +2 "$WORK/gpu.txt" 2>/dev/null | grep . || echo "no GPU"
  cat "$STEPS"
  # kernels.Sentinels' notes, one per process whose profiler dropped records (pytorch#192021)
  if [ -s "$PACK/profiler-notes.txt" ]; then head -n 12 "$PACK/profiler-notes.txt"
  elif [ "$DEVICE" = cuda ]; then echo "the profiler lost no kernel record"; fi
  head -c 7000 "$PACK/seed-float16.txt" 2>/dev/null
  head -n 8 "$PACK/map-batch-bfloat16.txt" 2>/dev/null | cut -c 1-400
  # the second night against the first: what the changed setting did, as the summary flags it
  if [ -s "$PACK/nights-summary.md" ]; then echo "== the second night (${NIGHT_SETTING}) against the first"; head -c 3000 "$PACK/nights-summary.md"; echo; fi
  # the orders, one line each: the tree in words, its replay and how its fused adds round
  [ -n "$NOT_STARTED" ] || timeout "$(capped 10)" "$PY" - "$PACK" <<'PYEOF'
import pathlib, sys
from matmul_drift.core import trees
for p in sorted(pathlib.Path(sys.argv[1]).glob("order-*.json")):
    try:
        o = trees.read_report(p.read_text())  # json.loads stops at about 1000 levels; a tree may be K deep
        v = o.get("verified") or {}
        ways = " or ".join(v.get("fused_add") or []) or "-"
        print(f"order {p.stem[6:]}: {o['summary']}; replay {v.get('matched')}/{v.get('draws')}, fused adds {ways}; "
              f"order-id {o['order_id']}; {'; '.join(o.get('notes', []))}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"order {p.stem[6:]}: unreadable ({exc})")
PYEOF
} > "$OUT/summary.txt"
rm -rf "$WORK"
echo "gpu_check: done in $(now) s, $failed step(s) failed$said; in $OUT: $(cd "$OUT" && echo *)"
[ "$failed" -eq 0 ]
