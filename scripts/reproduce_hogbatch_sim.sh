#!/usr/bin/env bash
# Ma & Rusu's Hogbatch comparison on their own machines, simulated (docs/simulation.md): CPU
# Hogwild alone, the GPU alone, Hogbatch and Adaptive on w8a, on paper_hogbatch_v100 and
# paper_hogbatch_k80, then the tables beside the paper's numbers (hetsgd/outputs/paper_table.py).
#   scripts/reproduce_hogbatch_sim.sh [OVERRIDES...]   (about 10 minutes on 2 cores)
# OVERRIDES go to the main comparison's runs (e.g. budget.seconds=1 optim.lr=0.01); its tables
# open with what the runs were (dataset, model, lr, budget, seeds), read from them.
#
# Times are virtual: each device's steps take what its roofline in
# hetsgd/engines/virtual/profiles.yaml says, while the updates themselves run on this CPU. That
# costs real time, so the main comparison trains `mlp` ([128, 128] ReLU), NOT the paper's
# 8 x 512 sigmoid net, for 0.5 virtual seconds, 3 seeds (hetsgd/conf/experiment/
# hogbatch_paper_sim.yaml says why). A second part runs the paper's net (mlp_paper) briefly, one
# seed, for its update shares and utilizations only (hogbatch_paper_sim_net.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s setup
out=${HETSGD_RESULTS:-results}/hogbatch_sim/$(date +%Y-%m-%d_%H-%M-%S)
mkdir -p "$out"

source scripts/w8a_cache.sh  # w8a from the data cache, else $HETSGD_W8A

status=0
# sweep NAME EXPERIMENT OVERRIDES...: one sweep of EXPERIMENT into $out/NAME, its output in NAME.log
sweep() {
  local name=$1 experiment=$2 started=$SECONDS
  shift 2
  echo "$name: +experiment=$experiment $*"
  if ! .venv/bin/hetsgd run -m "+experiment=$experiment" progress=false \
      "hydra.sweep.dir=$out/$name" "$@" >"$out/${name//\//_}.log" 2>&1; then
    status=1
    tail -n 5 "$out/${name//\//_}.log" >&2
  fi
  echo "  $((SECONDS - started)) s real"
}
# the main comparison: hogbatch_paper_sim (both machines, 3 seeds), one sweep per method. CPU
# Hogwild alone runs once: the two mixes' CPU groups are the same (48 one-example Broadwell
# workers). Adaptive's controller: 10 control periods in 0.5 virtual s
sweep main/hogwild hogbatch_paper_sim algo=hogwild devices=paper_hogbatch_v100 devices.only=[cpu] "$@"
sweep main/gpu hogbatch_paper_sim algo=sync devices.only=[accel] "$@"
sweep main/hogbatch hogbatch_paper_sim algo=hogbatch "$@"
sweep main/adaptive hogbatch_paper_sim algo=adaptive algo.period_s=0.05 algo.window_s=0.1 "$@"
# the paper's net, for its update shares and utilizations (hogbatch_paper_sim_net says why these
# budgets)
sweep paper_net/hogbatch hogbatch_paper_sim_net algo=hogbatch budget.seconds=0.1
sweep paper_net/adaptive hogbatch_paper_sim_net algo=adaptive budget.seconds=0.2 \
  algo.period_s=0.01 algo.window_s=0.02

echo
echo "Virtual time; rooflines of hetsgd/engines/virtual/profiles.yaml; total $SECONDS s real."
echo "Main comparison (its runs' dataset, model, lr, budget and seeds head its tables); mean ± std"
echo "over seeds. The paper's columns: its figures (docs/papers.md)."
.venv/bin/python -m hetsgd.outputs.paper_table "$out/main" || status=1
echo "The paper's net: update shares and utilization only."
.venv/bin/python -m hetsgd.outputs.paper_table --shares-only "$out/paper_net" || status=1
echo "runs and logs: $out"
exit $status
