"""Facts about this machine that configs and summaries need: cores, CPU model, usable GPUs.

GPUs are found through NVML, never through CUDA, so the coordinator stays free of a CUDA context.
"""

from __future__ import annotations

import os
import platform

import torch

from hetsgd.monitor import describe_gpus


def usable_cores() -> int:
    """Cores this process may run on (respects affinity masks and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_devices() -> list[dict]:
    """GPUs that this torch build can use (NVML sees them and torch was built with CUDA)."""
    if torch.version.cuda is None:
        return []
    return describe_gpus()
