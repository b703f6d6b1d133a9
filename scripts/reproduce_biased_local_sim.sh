#!/usr/bin/env bash
# Lim et al.'s biased local SGD comparison on their machine, simulated: 2 CPU sockets + 8 V100s
# (devices=paper_biased_local, virtual clock), w8a, an MLP on which the V100s are the fast side.
# Sync SGD over all ten workers, the GPUs alone, balanced, unbalanced (tau auto) and biased local
# SGD, 3 seeds, 0.25 virtual seconds each; then one report of all of it and a short table beside
# what the paper reports (scripts/biased_local_table.py). The settings and why:
# hetsgd/conf/experiment/biased_local_paper_sim.yaml.
#   scripts/reproduce_biased_local_sim.sh [OVERRIDES...]   e.g. seed=0, budget.seconds=0.5
# About 12 minutes on 2 cores; times are virtual, so the numbers do not depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s setup
BIN=.venv/bin

source scripts/w8a_cache.sh  # w8a from the data cache, else $HETSGD_W8A
if ! "$BIN/python" -c "import sys; from hetsgd.data import source_info
sys.exit(not source_info('w8a').cached)"; then
  echo "reproduce_biased_local_sim: w8a is not cached and $("$BIN/python" scripts/w8a_path.py)" \
    "is missing (hetsgd data fetch w8a, or set HETSGD_W8A)" >&2
  exit 1
fi

out=${HETSGD_RESULTS:-results}/biased_local_sim/$(date +%Y-%m-%d_%H-%M-%S)
status=0
"$BIN/hetsgd" run -m +experiment=biased_local_paper_sim "results_dir=$out" progress=false "$@" ||
  status=$?

# the fast_alone runs are sync runs too: the baseline is the one on both groups
"$BIN/hetsgd" report "$out" --baseline "algo=sync mix.cpu.count=2" >/dev/null
"$BIN/hetsgd" plot "$out" >/dev/null
"$BIN/python" scripts/biased_local_table.py "$out"
echo
echo "report:  $out/report.md"
echo "figures: $out/figures/"
exit $status
