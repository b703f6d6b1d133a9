#!/usr/bin/env bash
# Lim et al.'s biased local SGD comparison on their machine, simulated: 2 CPU sockets + 8 V100s
# (devices=paper_biased_local, virtual clock), w8a, an MLP on which the V100s are the fast side.
# Sync SGD over all ten workers, the GPUs alone, balanced, unbalanced (tau auto) and biased local
# SGD, 3 seeds, 0.25 virtual seconds each; then one report of all of it and a short table beside
# what the paper reports. The settings and why: hetsgd/conf/experiment/biased_local_paper_sim.yaml.
#   scripts/reproduce_biased_local_sim.sh [OVERRIDES...]   e.g. seed=0, budget.seconds=0.5
# About 12 minutes on 2 cores; times are virtual, so the numbers do not depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s setup
BIN=.venv/bin

# w8a from the data cache, else $HETSGD_W8A (scripts/w8a_path.py), through a temporary cache
if ! "$BIN/python" -c "import sys; from hetsgd.data import source_info
sys.exit(not source_info('w8a').cached)"; then
  w8a=$("$BIN/python" scripts/w8a_path.py)
  if [[ ! -f $w8a ]]; then
    echo "reproduce_biased_local_sim: w8a is not cached and $w8a is missing" \
      "(hetsgd data fetch w8a, or set HETSGD_W8A)" >&2
    exit 1
  fi
  HETSGD_DATA=$(mktemp -d)
  export HETSGD_DATA
  trap 'rm -rf "$HETSGD_DATA"' EXIT
  ln -s "$w8a" "$HETSGD_DATA/$("$BIN/python" scripts/w8a_path.py --name)"
fi

# one folder for both sweeps, so that one report compares them
out=${HETSGD_RESULTS:-results}/biased_local_sim/$(date +%Y-%m-%d_%H-%M-%S)
status=0
"$BIN/hetsgd" run +experiment=biased_local_paper_sim "results_dir=$out" progress=false "$@" ||
  status=$?
# the GPUs alone: fast_alone names the `auto` mix's group, here it is `gpu`
"$BIN/hetsgd" run +experiment=biased_local_paper_sim +method=fast_alone 'devices.only=[gpu]' \
  "results_dir=$out" progress=false "$@" || status=$?

# the fast_alone runs are sync runs too: the baseline is the one on both groups
"$BIN/hetsgd" report "$out" --baseline "algo=sync mix.cpu.count=2" >/dev/null
"$BIN/hetsgd" plot "$out" >/dev/null

"$BIN/python" - "$out" <<'EOF'
"""The report's numbers per method, beside what the paper reports (ResNet20 / CIFAR-10)."""
import json
import re
import sys
from pathlib import Path

import pandas as pd
import yaml

from hetsgd.outputs.report import markdown_table

out = Path(sys.argv[1])
ORDER = ("sync", "fast_alone", "local_balanced", "local_unbalanced", "local_biased")
PAPER = {  # Lim et al., abstract and TL;DR: docs/papers.md
    "sync": "baseline",
    "local_biased": "up to 32x faster than sync, nearly identical accuracy",
}
runs = {}  # method -> one of its runs' summary (its tau, step times and mix)
for summary in out.glob("sweeps/*/*/summary.json"):
    overrides = yaml.safe_load((summary.parent / ".hydra/overrides.yaml").read_text())
    method = next(o.split("=", 1)[1] for o in overrides if o.startswith("+method="))
    runs[method] = json.loads(summary.read_text())
    model = yaml.safe_load((summary.parent / "config.yaml").read_text())["model"]
report = pd.read_csv(out / "report.csv")
report["method"] = report["variant"].map(lambda v: re.search(r"\+method=(\S+)", v).group(1))
report = report.sort_values("method", key=lambda m: m.map(ORDER.index))


def cell(row, col, fmt):
    mean, std = row[f"{col}_mean"], row[f"{col}_std"]
    if pd.isna(mean):
        return "—"
    count = f" ({row[f'{col}_n']:.0f}/{row['n']:.0f})" if row[f"{col}_n"] < row["n"] else ""
    return f"{mean:{fmt}}" + ("" if pd.isna(std) else f" ± {std:{fmt}}") + count


HEADERS = ("method", "runs", "tau", "t@0.9 [virtual s]", "t@0.95 [virtual s]",
           "speedup vs sync", "train loss", "test loss", "test acc", "update share gpu",
           "GPU util [%]", "CPU sockets busy [%]", "paper")
rows = []
for _, row in report.iterrows():
    run = runs[row["method"]]
    local = run.get("local_sgd")
    tau = " ".join(f"{g}:{t}" for g, t in local["tau"].items()) if local else "—"
    # workers' CPU [cores] is the host workers' busy share: of the host threads the run had
    threads = sum(g["count"] * g["threads"] for g in run.get("mix", {}).values()
                  if g["role"] == "host")
    sockets = row["workers_cpu_cores_mean"] / threads * 100 if threads else float("nan")
    rows.append([
        row["method"], f"{row['n']}/{row['runs']}", tau,
        cell(row, "time_to_0.9", ".3f"), cell(row, "time_to_0.95", ".3f"),
        "—" if pd.isna(row["speedup"]) else f"{row['speedup']:.2f}",
        cell(row, "train_loss", ".4f"), cell(row, "test_loss", ".4f"),
        cell(row, "test_acc", ".4f"), cell(row, "share_gpu", ".2f"),
        cell(row, "gpu_util", ".0f"), "—" if pd.isna(sockets) else f"{sockets:.0f}",
        PAPER.get(row["method"], "not reported")])
# tau auto records the profiles' step times (a fixed tau records none)
steps = runs.get("local_unbalanced", {}).get("local_sgd", {}).get("step_s", {})
print(f"{report['dataset'].iloc[0]} · {model['name']} {model.get('hidden', '')} on "
      f"paper_biased_local (simulated), L_best = {report['l_best'].iloc[0]:.4g}; mean ± std over "
      "seeds; t@x: virtual seconds to a normalized loss of x; a step as profiled: "
      + ", ".join(f"{g} {t * 1e3:.3f} ms" for g, t in steps.items()))
print(markdown_table(HEADERS, rows))
EOF
echo
echo "report:  $out/report.md"
echo "figures: $out/figures/"
exit $status
