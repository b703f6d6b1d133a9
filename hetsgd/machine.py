"""Facts about this machine that configs, summaries and the monitor need: cores, CPU model, GPUs.

GPUs are found through NVML (the ``nvidia-ml-py`` package, module ``pynvml``), never through
CUDA, so the coordinator stays free of a CUDA context; torch is imported only to ask whether the
installed build has CUDA at all. This module sits below every other one: it imports nothing of
the project.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but without it there are simply no GPUs
    pynvml = None


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


@contextmanager
def nvml() -> Iterator[list[Any]]:
    """NVML device handles for the duration of the block; none when NVML is missing or fails."""
    if pynvml is None:
        yield []
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield []
        return
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        handles = []
    try:
        yield handles
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # Older NVML bindings return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def describe_gpus() -> list[dict[str, Any]]:
    """Name, total memory (MB) and driver version of every GPU NVML sees; empty without NVML."""
    with nvml() as handles:
        if not handles:
            return []
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        return [{"name": _text(pynvml.nvmlDeviceGetName(h)),
                 "memory_mb": pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**20,
                 "driver": driver} for h in handles]


def cuda_devices() -> list[dict[str, Any]]:
    """GPUs that this torch build can use (NVML sees them and torch was built with CUDA)."""
    import torch  # the config layer asks this through resolvers: keep torch off its import path

    if torch.version.cuda is None:
        return []
    return describe_gpus()


def machine_facts() -> dict[str, Any]:
    """What `hetsgd devices` lists: the CPU, its cores, and the GPUs torch can use here."""
    import torch

    return {"cpu_model": cpu_model(), "cores": usable_cores(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "gpus": cuda_devices()}
