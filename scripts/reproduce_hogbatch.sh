#!/usr/bin/env bash
# Reproduce Ma & Rusu's CPU+GPU Hogbatch comparison and show its report.
#   scripts/reproduce_hogbatch.sh           the small variant (w8a + digits, a few minutes)
#   scripts/reproduce_hogbatch.sh full      covtype, w8a, real-sim, delicious (a GPU server)
# Extra arguments are passed to `hetsgd run` as overrides (e.g. budget.seconds=60).
exec "$(dirname "$0")/reproduce.sh" hogbatch_paper "$@"
