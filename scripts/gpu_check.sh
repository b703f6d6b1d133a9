#!/usr/bin/env bash
# The one prepared check for a machine with a CUDA GPU, in about 9 minutes: does the CPU help the
# GPU on the paper's own net? Machine facts that explain contention, the GPU tests, the bench's
# accelerator section (hetsgd's step against a textbook and a CUDA-graph loop), the paper's
# comparison (+method=gpu,hogwild,hogbatch,adaptive, model=mlp_paper, 2 seeds, snapshots every
# 0.25 s; the GPU alone is the baseline) and its report with each worker's time split, with a
# background probe of the machine throughout; then, where time is left, calibration and replay
# with mlp_paper, Hogwild at 1, 8 and 16 workers rated after a 1 s warm-up, the accelerator's
# step eager and replayed from CUDA graphs (devices.cuda_graphs), local SGD and the full bench.
# Every step is time-bounded and logged under DIR; a failed step is recorded and the next one
# runs; the exit status is non-zero when any step failed.
#
#   scripts/gpu_check.sh [DIR]        (default DIR: results/gpu_check/<time>)
#
# On a lent machine whose command may run 600 s and return a few files from $OUT:
#   GPU_CHECK_TOTAL_S=480 scripts/gpu_check.sh results/gpu_check/run
#   tar -czf "$OUT/gpu_check.tgz" -C results/gpu_check run
#
# Steps run in that order, which is their priority: the first step after the report that does
# not fit in what is left of GPU_CHECK_TOTAL_S is skipped, with every one after it, each with a
# line in DIR/steps.txt, so a short check loses the full bench first, then local SGD, the graphed
# runs, Hogwild's scaling, and the calibration and replay last. No step's limit runs past
# GPU_CHECK_TOTAL_S by more than 30 s (a step is cut to what is left, and says so).
#
# Uses .venv/bin (as the Makefile does), or makes it: offline from WHEELHOUSE when that is set,
# else with `make setup TORCH=torch` (PyPI's CUDA build). Where nvidia-smi lists no GPU, the
# venv's torch cannot use one, or hetsgd finds none through NVML (it would run every step on the
# emulated mix), it says so in one line and exits 2 before doing anything else.
# Environment:
#   WHEELHOUSE            a folder of wheels (.whl only) for an offline machine whose python3
#                         already has a CUDA torch: a --system-site-packages venv takes what
#                         python3 lacks from it (e.g. hydra-core, omegaconf<2.4, a built wheel of
#                         antlr4-python3-runtime 4.9.3, pooch, platformdirs, pytest, nvidia-ml-py:
#                         hetsgd finds GPUs through NVML; setuptools>=77 for the editable install,
#                         <82 beside torch 2.11)
#   HETSGD_DATA           a data cache; its w8a is used when it has one
#   HETSGD_W8A            else a local copy of w8a (default ../shared/data/w8a.xz, as the
#                         reproduction scripts find it); without either, the comparison runs on
#                         the embedded digits and steps.txt says so
#   GPU_CHECK_SECONDS     training budget of each comparison run (default 12)
#   HETSGD_BENCH_SECONDS  budget of each benchmark run (default 2)
#   GPU_CHECK_TOTAL_S     the whole check's time (default 540)
set -euo pipefail

if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_check: no CUDA GPU here (nvidia-smi lists none); this check runs only where one is" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$(realpath -m "${1:-$ROOT/results/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}")
SECONDS_PER_RUN=${GPU_CHECK_SECONDS:-12}
TOTAL_S=${GPU_CHECK_TOTAL_S:-540}
SHORT_S=$((SECONDS_PER_RUN < 5 ? SECONDS_PER_RUN : 5))  # each run of the later steps
BENCH_FULL_S=360   # every section (5 s runs took 250 s before the last on a 16-core H200 server)
BIN=$ROOT/.venv/bin
mkdir -p "$DIR"
cd "$ROOT"
FAILED=()
SECONDS=0

# step NAME LIMIT_S COMMAND...: run COMMAND with a time limit, its output into DIR/NAME.log,
# and one line into DIR/steps.txt.
step() {
  local name=$1 limit=$2 rc=0 started=$SECONDS note cut=""
  shift 2
  if ((limit > TOTAL_S - SECONDS + 30)); then
    limit=$((TOTAL_S - SECONDS + 30))
    cut=", cut to what is left"
  fi
  if ((limit < 1)); then  # timeout 0 means no limit, and a negative one is refused
    limit=1
  fi
  echo "== $name (at most ${limit} s): $*"
  timeout --kill-after=15 "$limit" "$@" >"$DIR/$name.log" 2>&1 || rc=$?
  case $rc in
    0) note=ok ;;
    124 | 137) note="FAILED: timed out after ${limit} s$cut" ;;
    *) note="FAILED: exit $rc" ;;
  esac
  [[ $rc == 0 ]] || FAILED+=("$name")
  printf '%-12s %5d s  %s  (%s)\n' "$name" $((SECONDS - started)) "$note" "$DIR/$name.log" |
    tee -a "$DIR/steps.txt"
  return 0
}

note() { echo "$*" | tee -a "$DIR/steps.txt"; }

# fits NAME NEED_S: whether NEED_S seconds are left of TOTAL_S and no step before was skipped
# (the steps' order is their priority); if not, NAME is noted skipped
SKIPPING=
fits() {
  if [[ -z $SKIPPING ]] && ((TOTAL_S - SECONDS >= $2)); then return 0; fi
  if [[ -n $SKIPPING ]]; then
    note "$1: skipped, after $SKIPPING"
  else
    note "$1: skipped, $((TOTAL_S - SECONDS)) s left of ${TOTAL_S} s and it needs $2 s"
    SKIPPING=$1
  fi
  return 1
}

newest() { find "$1" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort | tail -n 1 || true; }

# -- the environment ------------------------------------------------------------------------------
# python3 may itself be a venv (the CUDA image's is): --system-site-packages then reaches the
# interpreter it was made from, not python3's own packages (torch), so a .pth adds those, after
# the venv's own (the wheels installed below come first), with their own .pth files; pip too,
# so no ensurepip is needed.
offline_setup() {
  python3 -m venv --without-pip --system-site-packages "$ROOT/.venv" &&
    python3 -c 'import site; print("import site;", *map("site.addsitedir({!r});".format,
      site.getsitepackages()))' >"$("$BIN/python" -c \
      'import sysconfig; print(sysconfig.get_path("purelib"))')/python3-site-packages.pth" &&
    "$BIN/python" -m pip install -q --no-index --find-links "$WHEELHOUSE" "$WHEELHOUSE"/*.whl &&
    "$BIN/python" -m pip install -q --no-index --no-deps --no-build-isolation -e "$ROOT" &&
    touch "$ROOT/.venv/.installed"
}
if [[ ! -x $BIN/python || ! -e $ROOT/.venv/.installed ]]; then
  if [[ -n ${WHEELHOUSE:-} ]]; then
    export -f offline_setup
    export ROOT BIN WHEELHOUSE
    step setup 300 bash -c offline_setup
  else
    step setup 300 make setup TORCH=torch
  fi
fi
if [[ ! -x $BIN/hetsgd ]]; then
  note "no usable .venv (see $DIR/setup.log): nothing else can run"
  exit 1
fi
PY=$BIN/python
if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "gpu_check: a GPU is here but the .venv's torch cannot use it (a CPU build?): rm -rf .venv and rerun" >&2
  exit 2
fi
if ! "$PY" -c "import sys; from hetsgd.machine import cuda_devices; sys.exit(not cuda_devices())" 2>/dev/null; then
  echo "gpu_check: torch can use a GPU but hetsgd finds none through NVML (nvidia-ml-py missing from the .venv, or CUDA_VISIBLE_DEVICES naming a MIG device): every run would be emulated" >&2
  exit 2
fi
W8A_LINKED=  # set by w8a_cache.sh where it links a copy, removed at exit
source scripts/w8a_cache.sh
step nvidia-smi 30 nvidia-smi
step machine 60 "$BIN/hetsgd" machine
"$BIN/hetsgd" machine --json >"$DIR/machine.json" 2>/dev/null || true

# -- machine facts that explain contention: SMT, affinity, steal, pressure, cgroup, PCIe ----------
facts() {
  echo "## lscpu (threads per core: SMT)"; lscpu || true
  echo "## this shell's CPU affinity"; taskset -pc $$ || true
  echo "## steal (st) and run queue (r) over 3 s"; vmstat 1 4 || true
  echo "## /proc/pressure/cpu"; cat /proc/pressure/cpu || true
  echo "## cgroup limits"; cat /proc/self/cgroup || true
  for file in cpu.max cpuset.cpus.effective memory.max; do
    if [[ -e /sys/fs/cgroup/$file ]]; then echo "$file: $(cat "/sys/fs/cgroup/$file")"; fi
  done
  echo "## PCIe link (current / max)"
  nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv || true
}
facts >"$DIR/facts.txt" 2>&1
note "machine facts: $DIR/facts.txt"

# -- a background probe of the machine during everything that follows -----------------------------
"$PY" -m scripts.gpu_probe probe "$DIR/probe.csv" --interval 0.5 >"$DIR/probe.log" 2>&1 &
PROBE=$!
trap 'kill "$PROBE" 2>/dev/null || true; rm -rf "${W8A_LINKED:-}"' EXIT
note "probe: steal, CPU pressure, each hetsgd process's CPU and context switches, the top others: $DIR/probe.csv"

# -- the GPU tests, and the bench's accelerator section -------------------------------------------
# only the modules that hold gpu tests: the others may import what an offline .venv lacks
mapfile -t GPU_TESTS < <(grep -l 'pytest.mark.gpu' tests/test_*.py)
step pytest-gpu 150 "$PY" -m pytest -m gpu -q "${GPU_TESTS[@]}"
export HETSGD_BENCH_SECONDS=${HETSGD_BENCH_SECONDS:-2}
step bench-accel 150 env "HETSGD_RESULTS=$DIR/bench-accel" "$PY" -m scripts.bench --only i

# -- the paper's comparison with the paper's net, and its report ---------------------------------
DATASET=digits
if [[ $("$PY" -c "from hetsgd.data import source_info; print(source_info('w8a').cached)" \
  2>/dev/null) == True ]]; then
  DATASET=w8a
fi
note "comparison: dataset=$DATASET, model=mlp_paper, seeds 0 and 1, ${SECONDS_PER_RUN} s per run"
if [[ $DATASET != w8a ]]; then
  note "comparison: no local w8a (set HETSGD_W8A or HETSGD_DATA): digits is not the paper's data set"
fi
# each run: its budget, its start, and evaluating ~4 snapshots a second of mlp_paper afterwards
step sweep $((8 * (SECONDS_PER_RUN + 30))) \
  "$BIN/hetsgd" run -m +method=gpu,hogwild,hogbatch,adaptive model=mlp_paper "dataset=$DATASET" \
  seed=0,1 eval.every_s=0.25 budget.epochs=null "budget.seconds=$SECONDS_PER_RUN" progress=false \
  "results_dir=$DIR"
SWEEP=$(newest "$DIR/sweeps")
if [[ -n $SWEEP ]]; then
  step report 120 "$BIN/hetsgd" report "$SWEEP" --baseline "algo=sync devices=auto_gpu"
  for file in report.md report.csv summary.csv; do
    if [[ -e $SWEEP/$file ]]; then cp "$SWEEP/$file" "$DIR/"; fi
  done
  find "$SWEEP" -name workers.csv -exec sh -c 'for f; do echo "$f"; cat "$f"; done' _ {} + \
    >"$DIR/workers_split.txt" 2>/dev/null || true
else
  note "report: skipped, the sweep left no folder under $DIR/sweeps"
  FAILED+=(report)
fi

# -- calibration and replay with mlp_paper: sim/real per group ------------------------------------
if fits calibrate $((90 + 120 + 30)); then
  step calibrate 90 "$BIN/hetsgd" machine --calibrate --seconds 0.3 model=mlp_paper \
    "dataset=$DATASET" devices=auto "results_dir=$DIR"
  CALIBRATION=$(find "$DIR/calibration" -name '*.csv' 2>/dev/null | sort | tail -n 1 || true)
  if [[ -n $CALIBRATION ]]; then
    # the same mix replayed on the virtual clock: its update shares and updates per virtual
    # second against the sweep's real hogbatch runs (summary.csv) say what it models; 0.1
    # virtual s (hundreds of GPU steps: a rate needs no more), as the virtual engine computes
    # every simulated step for real (mlp cost 17 real s per virtual s on the H200's 16 cores;
    # mlp_paper's steps are some 30x mlp's)
    step replay 120 "$BIN/hetsgd" run algo=hogbatch devices=auto \
      devices.simulated=true "devices.calibration=$CALIBRATION" model=mlp_paper "dataset=$DATASET" budget.epochs=null \
      budget.seconds=0.1 progress=false "results_dir=$DIR/replay"
    cp "$CALIBRATION" "$DIR/calibration.csv"
    if [[ -n $SWEEP ]]; then  # its log is the CSV: sim/real per group beside each CPU share
      step replayed 30 "$PY" -m scripts.gpu_probe replayed "$DIR/replay" "$SWEEP"
    fi
  else
    note "replay: skipped, the calibration saved no profile"
    FAILED+=(replay)
  fi
fi

# -- Hogwild at 1, 8 and 16 workers, rated after a 1 s warm-up ------------------------------------
if fits hogwild $((3 * (SHORT_S + 20))); then
  step hogwild $((3 * (SHORT_S + 30))) \
    "$BIN/hetsgd" run -m algo=hogwild devices=cpu devices.groups.cpu.count=1,8,16 model=mlp_paper \
    "dataset=$DATASET" eval.every_s=0.25 budget.epochs=null "budget.seconds=$SHORT_S" \
    progress=false "results_dir=$DIR/hogwild"
  SWEPT=$(newest "$DIR/hogwild/sweeps")
  if [[ -n $SWEPT ]]; then
    step hogwild-rates 60 "$PY" -m scripts.gpu_probe rates "$SWEPT"  # its log is the CSV
    if [[ -e $SWEPT/summary.csv ]]; then cp "$SWEPT/summary.csv" "$DIR/hogwild.csv"; fi
  fi
fi

# -- the accelerator's step replayed from CUDA graphs, against its eager step ---------------------
# the GPU alone (auto_gpu: its replica path) and Hogbatch's mix with devices.cuda_graphs off and
# on: the updates per second and final losses say whether graphs may become the default
if fits graphs $((4 * (SHORT_S + 20))); then
  step graphs $((4 * (SHORT_S + 30))) \
    "$BIN/hetsgd" run -m algo=hogbatch devices=auto_gpu,auto devices.cuda_graphs=false,true \
    model=mlp_paper "dataset=$DATASET" budget.epochs=null "budget.seconds=$SHORT_S" \
    progress=false "results_dir=$DIR/graphs"
  SWEPT=$(newest "$DIR/graphs/sweeps")
  if [[ -n $SWEPT && -e $SWEPT/summary.csv ]]; then cp "$SWEPT/summary.csv" "$DIR/graphs.csv"; fi
fi

# -- local SGD on the GPU and CPU ranks (gloo, the GPU rank staging through pinned buffers) -------
if fits local $((3 * (SHORT_S + 30))); then
  step local $((3 * (SHORT_S + 45))) \
    "$BIN/hetsgd" run -m +method=local_balanced,local_unbalanced,local_biased "dataset=$DATASET" \
    budget.epochs=null "budget.seconds=$SHORT_S" progress=false "results_dir=$DIR/local"
  SWEPT=$(newest "$DIR/local/sweeps")
  if [[ -n $SWEPT && -e $SWEPT/summary.csv ]]; then cp "$SWEPT/summary.csv" "$DIR/local.csv"; fi
fi

# -- the full benchmark, when it fits -------------------------------------------------------------
if fits bench "$BENCH_FULL_S"; then
  step bench $((TOTAL_S - SECONDS)) env "HETSGD_RESULTS=$DIR" "$PY" -m scripts.bench
fi
kill "$PROBE" 2>/dev/null || true

# -- where everything is --------------------------------------------------------------------------
echo
echo "gpu_check: $SECONDS s in all; everything is under $DIR"
echo "  steps and their logs:  $DIR/steps.txt"
echo "  machine:               $DIR/machine.log, machine.json, facts.txt, probe.csv"
if [[ -n $SWEEP ]]; then echo "  comparison runs:       $SWEEP (report: $DIR/report.md)"; fi
BENCH_OUT=$(newest "$DIR/bench")
if [[ -n $BENCH_OUT ]]; then echo "  benchmark:             $BENCH_OUT/bench.md"; fi
if ((${#FAILED[@]})); then
  echo "failed: ${FAILED[*]}"
  exit 1
fi
echo "all steps passed"
