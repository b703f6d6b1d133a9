#!/usr/bin/env bash
# reproduce.sh EXPERIMENT [full] [OVERRIDES...]: run conf/experiment/EXPERIMENT[_small] as one
# sweep, then print its report and where its figures are.
set -euo pipefail
cd "$(dirname "$0")/.."
experiment=$1; shift
variant=_small
if [[ "${1:-}" == "full" ]]; then variant=""; shift; fi
for arg in "$@"; do  # the sweep is looked for under $HETSGD_RESULTS: it must be written there
  case $arg in
    results_dir=*|+*results_dir=*|hydra.sweep.dir=*|+*hydra.sweep.dir=*)
      echo "reproduce: $arg would write the sweep where this script does not look for it:" \
           "set HETSGD_RESULTS=FOLDER instead" >&2
      exit 2;;
  esac
done
make -s setup
source scripts/w8a_cache.sh  # the small variants train on w8a too
results=${HETSGD_RESULTS:-results}
before=$(ls -1 "$results/sweeps" 2>/dev/null | sort | tail -n 1 || true)
status=0
.venv/bin/hetsgd run -m "+experiment=${experiment}${variant}" "$@" || status=$?
sweep=$(ls -1 "$results/sweeps" 2>/dev/null | sort | tail -n 1 || true)
if [[ -z "$sweep" || "$sweep" == "$before" ]]; then
  echo "reproduce: no sweep was written" >&2
  exit 1
fi
echo
echo "report:  $results/sweeps/$sweep/report.md"
echo "figures: $results/sweeps/$sweep/figures/"
if command -v xdg-open >/dev/null 2>&1 && [[ -n "${DISPLAY:-}" ]]; then
  xdg-open "$results/sweeps/$sweep/report.md" >/dev/null 2>&1 || true
fi
exit $status
