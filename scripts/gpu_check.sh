#!/usr/bin/env bash
# The one prepared check for a machine with a CUDA GPU, in about 8 minutes:
# the devices, the GPU tests, a real CPU+GPU comparison of the four algorithms, its report, local
# SGD on the GPU and CPU ranks, the GPU mix's calibration, Hogwild over 1 to 16 cores, and the
# benchmark. Every step is time-bounded and logged under DIR; a failed step is recorded and
# the next one runs; the exit status is non-zero when any step failed.
#
#   scripts/gpu_check.sh [DIR]        (default DIR: results/gpu_check/<time>)
#
# Uses .venv/bin (as the Makefile does), or makes it: offline from WHEELHOUSE when that is set,
# else with `make setup TORCH=torch` (PyPI's CUDA build). Where nvidia-smi lists no GPU, or the
# venv's torch cannot use one, it says so in one line and exits 2 before doing anything else.
# Environment:
#   WHEELHOUSE            a folder of wheels (.whl only) for an offline machine whose python3
#                         already has a CUDA torch: a --system-site-packages venv takes what
#                         python3 lacks from it (e.g. hydra-core, omegaconf<2.4, a built wheel of
#                         antlr4-python3-runtime 4.9.3, pooch, platformdirs; setuptools>=77 for
#                         the editable install, <82 beside torch 2.11)
#   HETSGD_DATA           a data cache; its w8a is used when it has one, else the embedded digits
#   GPU_CHECK_SECONDS     training budget of each comparison run (default 20)
#   HETSGD_BENCH_SECONDS  budget of each benchmark run (default: the smaller of 5 and the above)
#   GPU_CHECK_TOTAL_S     the whole check's time; the benchmark is shortened (--quick) or skipped
#                         when it would not fit (default 480)
set -euo pipefail

if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_check: no CUDA GPU here (nvidia-smi lists none); this check runs only where one is" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$(realpath -m "${1:-$ROOT/results/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}")
SECONDS_PER_RUN=${GPU_CHECK_SECONDS:-20}
TOTAL_S=${GPU_CHECK_TOTAL_S:-480}
BENCH_NEEDS_S=120  # not started with less left (it saves each measurement as it ends)
BENCH_FULL_S=360   # every section (5 s runs took 250 s before the last on a 16-core H200 server)
BIN=$ROOT/.venv/bin
mkdir -p "$DIR"
cd "$ROOT"
FAILED=()
SECONDS=0

# step NAME LIMIT_S COMMAND...: run COMMAND with a time limit, its output into DIR/NAME.log,
# and one line into DIR/steps.txt.
step() {
  local name=$1 limit=$2 rc=0 started=$SECONDS note
  shift 2
  echo "== $name (at most ${limit} s): $*"
  timeout --kill-after=15 "$limit" "$@" >"$DIR/$name.log" 2>&1 || rc=$?
  case $rc in
    0) note=ok ;;
    124 | 137) note="FAILED: timed out after ${limit} s" ;;
    *) note="FAILED: exit $rc" ;;
  esac
  [[ $rc == 0 ]] || FAILED+=("$name")
  printf '%-12s %5d s  %s  (%s)\n' "$name" $((SECONDS - started)) "$note" "$DIR/$name.log" |
    tee -a "$DIR/steps.txt"
  return 0
}

note() { echo "$*" | tee -a "$DIR/steps.txt"; }

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
step nvidia-smi 30 nvidia-smi
step machine 60 "$BIN/hetsgd" machine
"$BIN/hetsgd" machine --json >"$DIR/machine.json" 2>/dev/null || true

# -- the GPU tests --------------------------------------------------------------------------------
step pytest-gpu 180 "$PY" -m pytest -m gpu -q

# -- a real CPU+GPU comparison, and its report ----------------------------------------------------
DATASET=digits
if [[ -n ${HETSGD_DATA:-} ]] &&
  [[ $("$PY" -c "from hetsgd.data import source_info; print(source_info('w8a').cached)" \
    2>/dev/null) == True ]]; then
  DATASET=w8a
fi
note "comparison: dataset=$DATASET, ${SECONDS_PER_RUN} s per run"
step sweep $((4 * (SECONDS_PER_RUN + 45))) \
  "$BIN/hetsgd" run -m algo=sync,hogwild,hogbatch,adaptive devices=auto "dataset=$DATASET" \
  budget.epochs=null "budget.seconds=$SECONDS_PER_RUN" progress=false "results_dir=$DIR"
SWEEP=$(newest "$DIR/sweeps")
if [[ -n $SWEEP ]]; then
  step report 120 "$BIN/hetsgd" report "$SWEEP"
  for file in report.md report.csv summary.csv; do
    if [[ -e $SWEEP/$file ]]; then cp "$SWEEP/$file" "$DIR/"; fi
  done
else
  note "report: skipped, the sweep left no folder under $DIR/sweeps"
  FAILED+=(report)
fi

# -- local SGD on the GPU and CPU ranks, the calibration, Hogwild over the cores -------------------
# Local SGD's ranks exchange over gloo, the GPU rank staging through pinned host buffers
# (engines/distributed/group.py); the calibration times each group of the GPU mix
# (runs/calibrate.py); Hogwild's examples/s at 1 to 16 workers is summary.csv's examples_per_s.
SHORT_S=$((SECONDS_PER_RUN < 5 ? SECONDS_PER_RUN : 5))
step local $((3 * (SHORT_S + 45))) \
  "$BIN/hetsgd" run -m +method=local_balanced,local_unbalanced,local_biased "dataset=$DATASET" \
  budget.epochs=null "budget.seconds=$SHORT_S" progress=false "results_dir=$DIR/local"
step calibrate 120 "$BIN/hetsgd" machine --calibrate --seconds 0.3 model=mlp "dataset=$DATASET" \
  devices=auto "results_dir=$DIR"
CALIBRATION=$(find "$DIR/calibration" -name '*.csv' 2>/dev/null | sort | tail -n 1 || true)
if [[ -n $CALIBRATION ]]; then
  # the same mix replayed on the virtual clock from that calibration: its updates per virtual
  # second against the real run's per second (the sweep's hogbatch run) say what it models
  step replay 180 "$BIN/hetsgd" run algo=hogbatch devices=auto devices.simulated=true \
    "devices.calibration=$CALIBRATION" model=mlp "dataset=$DATASET" budget.epochs=null \
    budget.seconds=0.5 progress=false "results_dir=$DIR/replay"
  cp "$CALIBRATION" "$DIR/calibration.csv"
else
  note "replay: skipped, the calibration saved no profile"
  FAILED+=(replay)
fi
step hogwild $((5 * (SHORT_S + 30))) \
  "$BIN/hetsgd" run -m algo=hogwild devices=cpu devices.groups.cpu.count=1,2,4,8,16 model=mlp \
  "dataset=$DATASET" budget.epochs=null "budget.seconds=$SHORT_S" progress=false \
  "results_dir=$DIR/hogwild"
for part in local hogwild; do
  SWEPT=$(newest "$DIR/$part/sweeps")
  if [[ -n $SWEPT && -e $SWEPT/summary.csv ]]; then cp "$SWEPT/summary.csv" "$DIR/$part.csv"; fi
done

# -- the benchmark, when it fits ------------------------------------------------------------------
LEFT=$((TOTAL_S - SECONDS))
if ((LEFT >= BENCH_NEEDS_S)); then
  BENCH_S=$((SECONDS_PER_RUN < 5 ? SECONDS_PER_RUN : 5))
  export HETSGD_BENCH_SECONDS=${HETSGD_BENCH_SECONDS:-$BENCH_S}
  # `make bench`'s command on the venv settled above: every section where they fit, else
  # `make bench-quick`'s (those with goals, 2 s runs)
  QUICK=()
  ((LEFT >= BENCH_FULL_S)) || QUICK=(--quick)
  step bench "$LEFT" env "HETSGD_RESULTS=$DIR" "$PY" -m scripts.bench "${QUICK[@]}"
else
  note "bench: skipped, the check has run $SECONDS s of its ${TOTAL_S} s (bench-quick takes about 3 minutes on 2 cores)"
fi

# -- where everything is --------------------------------------------------------------------------
echo
echo "gpu_check: $SECONDS s in all; everything is under $DIR"
echo "  steps and their logs:  $DIR/steps.txt"
echo "  machine:               $DIR/machine.log, machine.json"
if [[ -n $SWEEP ]]; then echo "  comparison runs:       $SWEEP (report: $DIR/report.md)"; fi
BENCH_OUT=$(newest "$DIR/bench")
if [[ -n $BENCH_OUT ]]; then echo "  benchmark:             $BENCH_OUT/bench.md"; fi
if ((${#FAILED[@]})); then
  echo "failed: ${FAILED[*]}"
  exit 1
fi
echo "all steps passed"
