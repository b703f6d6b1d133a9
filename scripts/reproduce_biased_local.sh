#!/usr/bin/env bash
# Reproduce Lim et al.'s biased local SGD comparison (sync vs balanced vs unbalanced vs biased
# local SGD) and show its report.
#   scripts/reproduce_biased_local.sh       the small variant (a few minutes on 2 cores)
#   scripts/reproduce_biased_local.sh full  ResNet20 on CIFAR-10 (a GPU server)
exec "$(dirname "$0")/reproduce.sh" biased_local_paper "$@"
